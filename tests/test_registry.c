/*
 * The etcd registry, end to end: a real etcd (started here on free loopback
 * ports with a data directory of its own), real unit processes (the
 * dataplane binary) registering in it, and clients opening the cluster by
 * its URL. Rows are checked byte for byte. Units are SIGKILLed and started
 * again elsewhere, etcd is killed and started again under a running
 * cluster, records are corrupted by hand, and the whole arrangement runs
 * across network namespaces (etcd, units and the client on three "hosts").
 * Skipped where etcd is not installed (scripts/deps.sh installs it).
 */
#include "dp_test.h"

#include <inttypes.h>
#include <sys/stat.h>

#include "dp_lc.h"
#include "dp_netns.h"
#include "dp_proc.h"
#include "dp_tsan_ucx.h"
#include "dataplane/client.h"
#include "registry/registry.h"

#ifndef DP_LONGCLIENT_PATH
#error "DP_LONGCLIENT_PATH must name the dp_longclient binary"
#endif

#define ETCD_BIN "/usr/bin/etcd"
#define TTL "2" /* the units' lease in these tests, seconds */

/* ---- etcd ---- */

typedef struct etcd_proc {
    pid_t pid;
    char ip[64];
    unsigned port, peer_port;
    char dir[128];
    char url_hosts[96]; /* "ip:port" */
} etcd_proc;

static unsigned
free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    CHECK(fd >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    CHECK(bind(fd, (struct sockaddr *)&a, sizeof a) == 0);
    socklen_t len = sizeof a;
    CHECK(getsockname(fd, (struct sockaddr *)&a, &len) == 0);
    close(fd);
    return ntohs(a.sin_port);
}

static void
need_etcd(void)
{
    if (access(ETCD_BIN, X_OK) != 0)
        DP_SKIP("etcd is not installed (%s): scripts/deps.sh installs etcd-server",
                ETCD_BIN);
}

/* The argv of etcd serving e (on its ip and ports, data in its dir). */
static void
etcd_argv(etcd_proc *e, char bufs[7][160], const char **argv)
{
    snprintf(bufs[6], 160, "--log-outputs=%s/etcd.log", e->dir);
    snprintf(bufs[0], 160, "--data-dir=%s", e->dir);
    snprintf(bufs[1], 160, "--listen-client-urls=http://%s:%u", e->ip, e->port);
    snprintf(bufs[2], 160, "--advertise-client-urls=http://%s:%u", e->ip, e->port);
    snprintf(bufs[3], 160, "--listen-peer-urls=http://%s:%u", e->ip, e->peer_port);
    snprintf(bufs[4], 160, "--initial-advertise-peer-urls=http://%s:%u", e->ip,
             e->peer_port);
    snprintf(bufs[5], 160, "--initial-cluster=t=http://%s:%u", e->ip, e->peer_port);
    int k = 0;
    argv[k++] = ETCD_BIN;
    argv[k++] = "--name=t";
    for (int i = 0; i < 6; i++)
        argv[k++] = bufs[i];
    argv[k++] = "--logger=zap";
    argv[k++] = bufs[6];
    argv[k] = NULL;
}

/* Wait until etcd answers a range (or fail after limit_s). */
static void
etcd_wait(etcd_proc *e, double limit_s)
{
    dp__etcd *h = NULL;
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_OK_D(dp__etcd_create(e->url_hosts, 1.0, &h, &d), &d);
    double t0 = dp_test_now();
    for (;;) {
        dp__etcd_kvs kvs;
        dp_detail_clear(&d);
        if (dp__etcd_range(h, "x", false, &kvs, &d) == DP_OK) {
            dp__etcd_kvs_fini(&kvs);
            break;
        }
        CHECKF(dp_test_now() - t0 < limit_s, "etcd did not answer within %.0f s: %s",
               limit_s, dp_detail_msg(&d));
        dp__sleep_s(0.1);
    }
    dp__etcd_destroy(h);
}

/* Start etcd on 127.0.0.1 (a fresh data directory unless e->dir is set). */
static void
etcd_start(etcd_proc *e)
{
    need_etcd();
    if (e->dir[0] == '\0') {
        snprintf(e->dir, sizeof e->dir, "/tmp/dp-etcd-XXXXXX");
        CHECK(mkdtemp(e->dir) != NULL);
        snprintf(e->ip, sizeof e->ip, "127.0.0.1");
        e->port = free_port();
        e->peer_port = free_port();
        snprintf(e->url_hosts, sizeof e->url_hosts, "%s:%u", e->ip, e->port);
    }
    char bufs[7][160];
    const char *argv[14];
    etcd_argv(e, bufs, argv);
    fflush(NULL);
    e->pid = fork();
    CHECK(e->pid >= 0);
    if (e->pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        int null = open("/dev/null", O_WRONLY);
        dup2(null, 1);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    etcd_wait(e, 20);
}

static void
etcd_kill(etcd_proc *e)
{
    if (e->pid > 0)
        dp_test_kill_wait(e->pid, SIGKILL);
    e->pid = 0;
}

static void
etcd_stop(etcd_proc *e)
{
    etcd_kill(e);
    char cmd[200];
    char out[256];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", e->dir);
    dp_test_run_sh(cmd, out, sizeof out);
}

/* ---- units ---- */

typedef struct unit_proc {
    pid_t pid;
    char addr[256];
} unit_proc;

/* `dataplane unit --registry url` with extra args; its first line into u->addr. */
static void
unit_start_args(unit_proc *u, const char *url, uint32_t id, uint32_t n,
                const char *const *extra)
{
    const char *cli = dp_test_cli_path();
    CHECKF(cli != NULL, "the dataplane binary is not built next to the tests");
    char ids[16], ns[16];
    snprintf(ids, sizeof ids, "%u", id);
    snprintf(ns, sizeof ns, "%u", n);
    const char *args[32] = {cli,          "unit", "--slab",         "16M",
                            "--registry", url,    "--registry-ttl", TTL,
                            "--unit-id",  ids,    "--units",        ns};
    int k = 12;
    for (int i = 0; extra != NULL && extra[i] != NULL; i++)
        args[k++] = extra[i];
    args[k] = NULL;
    u->pid = dp_test_cli_start(args, u->addr, sizeof u->addr);
}

static void
unit_start(unit_proc *u, const char *url, uint32_t id, uint32_t n)
{
    unit_start_args(u, url, id, n, NULL);
    CHECKF(strncmp(u->addr, "tcp://", 6) == 0, "unit %u did not start: '%s'", id,
           u->addr);
}

static void
unit_kill(unit_proc *u)
{
    dp_test_kill_wait(u->pid, SIGKILL);
}

/* ---- the registry as a test sees it ---- */

/* Whether the registry holds a valid record of unit id (its address into addr). */
static bool
has_record(const char *url, uint32_t id, char *addr, size_t cap)
{
    dp__reg_url u;
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_OK_D(dp__reg_url_parse(url, &u, &d), &d);
    dp__reg_entry *es = NULL;
    size_t n = 0;
    CHECK_OK_D(dp__reg_list(&u, 2.0, &es, &n, &d), &d);
    bool found = false;
    for (size_t i = 0; i < n; i++)
        if (es[i].valid && es[i].r.id == id) {
            found = true;
            if (addr != NULL)
                snprintf(addr, cap, "%s", es[i].r.zmq);
        }
    free(es);
    return found;
}

static void
wait_record(const char *url, uint32_t id, bool present, double limit_s)
{
    double t0 = dp_test_now();
    while (has_record(url, id, NULL, 0) != present) {
        CHECKF(dp_test_now() - t0 < limit_s, "unit %u's record %s within %.0f s", id,
               present ? "did not appear" : "did not go", limit_s);
        dp__sleep_s(0.1);
    }
    printf("    unit %u's record %s after %.2f s\n", id, present ? "appeared" : "went",
           dp_test_now() - t0);
}

/* Raw etcd writes, for records a unit would never write. */
static void
etcd_put_raw(const etcd_proc *e, const char *key, const char *value)
{
    dp__etcd *h = NULL;
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_OK_D(dp__etcd_create(e->url_hosts, 2.0, &h, &d), &d);
    CHECK_OK_D(dp__etcd_put(h, key, value, 0, &d), &d);
    dp__etcd_destroy(h);
}

/* `dataplane <args>` through the shell: its exit status, output into out. */
static int
cli_run(const char *args, char *out, size_t cap)
{
    char cmd[8800];
    snprintf(cmd, sizeof cmd, "%s %s 2>&1", dp_test_cli_path(), args);
    return dp_test_run_sh(cmd, out, cap);
}

/* ---- rows, checked byte for byte ---- */

static void
fill(uint8_t *p, size_t n, uint64_t row, uint64_t seed)
{
    uint64_t x = row * 0x9e3779b97f4a7c15ull ^ (seed + 1) * 0xbf58476d1ce4e5b9ull;
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        p[i] = (uint8_t)x;
    }
}

#define NROWS 16
#define LEN 8192

static int
put_rows(dp_client *c, uint64_t seed, dp_detail *d)
{
    uint8_t *buf = malloc(NROWS * LEN);
    uint64_t g[NROWS];
    dp_value v[NROWS];
    int rs[NROWS];
    for (uint32_t i = 0; i < NROWS; i++) {
        g[i] = i;
        fill(buf + i * LEN, LEN, i, seed);
        v[i] = (dp_value){buf + i * LEN, LEN, DP_KIND_BYTES, NULL, NULL, 0};
    }
    const char *f[] = {"v"};
    dp_detail_clear(d);
    int rc = dp_client_put(c, g, NROWS, f, 1, v, rs, d);
    free(buf);
    return rc;
}

/* Get the rows; every value that came back must be seed's, byte for byte. */
static int
get_rows(dp_client *c, uint64_t seed, dp_detail *d)
{
    uint8_t *buf = malloc(NROWS * LEN), *want = malloc(LEN);
    memset(buf, 0xa5, NROWS * LEN);
    char keys[NROWS][32];
    dp_get_item it[NROWS];
    for (uint32_t i = 0; i < NROWS; i++) {
        snprintf(keys[i], sizeof keys[i], "%u@v", i);
        it[i] = (dp_get_item){.key = keys[i], .dst = buf + i * LEN, .cap = LEN};
    }
    dp_detail_clear(d);
    int rc = dp_client_get(c, it, NROWS, d);
    for (uint32_t i = 0; i < NROWS; i++) {
        if (it[i].status != 0)
            continue;
        fill(want, LEN, i, seed);
        CHECKF(
            it[i].nbytes == LEN && memcmp(buf + i * LEN, want, LEN) == 0,
            "row %u came back DP_OK with bytes that are not its value: a false success",
            i);
    }
    free(buf);
    free(want);
    return rc;
}

static dp_client *
open_url(const char *url, double budget_s, int want_rc, dp_detail *d)
{
    dp_client_opts o;
    dp_client_opts_init(&o);
    o.timeout_s = 5;
    o.connect_timeout_s = budget_s;
    dp_client *c = NULL;
    dp_detail_clear(d);
    int rc = dp_client_open(url, &o, &c, d);
    CHECKF(rc == want_rc, "dp_client_open(%s) = %s, want %s: %s", url, dp_errname(rc),
           dp_errname(want_rc), dp_detail_msg(d));
    return c;
}

/* Put and get seed until both succeed (a re-bind may cost an operation or two). */
static void
until_rows_ok(dp_client *c, uint64_t seed, double limit_s, const char *after)
{
    double t0 = dp_test_now();
    dp_detail d;
    int tries = 0, rc;
    while ((rc = put_rows(c, seed, &d)) != DP_OK ||
           (rc = get_rows(c, seed, &d)) != DP_OK) {
        tries++;
        CHECKF(dp_test_now() - t0 < limit_s,
               "after %s: no put+get within %.0f s: %s (%s)", after, limit_s,
               dp_detail_msg(&d), dp_errname(rc));
        if (tries <= 3)
            printf("    after %s: %s (%s)\n", after, dp_errname(rc), dp_detail_msg(&d));
        dp__sleep_s(0.2);
    }
    printf("    after %s: put+get of %d x %d B byte for byte after %d failed tries, %.2f "
           "s\n",
           after, NROWS, LEN, tries, dp_test_now() - t0);
}

static void
make_url(char *url, size_t cap, const etcd_proc *e, const char *name)
{
    snprintf(url, cap, "etcd://%s/%s", e->url_hosts, name);
}

/* ---- tests ---- */

DP_TEST_TIMEOUT(units_register_and_come_back, 90)
{
    etcd_proc e = {0};
    etcd_start(&e);
    char url[256], out[8192], args[512];
    make_url(url, sizeof url, &e, "c1");
    unit_proc u[2];
    unit_start(&u[0], url, 0, 2);
    unit_start(&u[1], url, 1, 2);

    snprintf(args, sizeof args, "cluster --cluster %s", url);
    int st = cli_run(args, out, sizeof out);
    printf("%s", out);
    CHECKF(st == 0, "dataplane cluster exited %d with both units up", st);
    CHECK_CONTAINS(out, u[0].addr);
    CHECK_CONTAINS(out, u[1].addr);

    dp_detail d;
    dp_client *c = open_url(url, 10, DP_OK, &d);
    CHECK_OK_D(put_rows(c, 1, &d), &d);
    CHECK_OK_D(get_rows(c, 1, &d), &d);
    snprintf(args, sizeof args, "stats --cluster %s", url);
    CHECK_EQ(cli_run(args, out, sizeof out), 0);

    /* SIGKILL: the record goes within the lease, and the view says down. */
    unit_kill(&u[1]);
    wait_record(url, 1, false, atof(TTL) + 5);
    snprintf(args, sizeof args, "cluster --cluster %s", url);
    st = cli_run(args, out, sizeof out);
    printf("%s", out);
    CHECKF(st == 1, "dataplane cluster exited %d with unit 1 down", st);
    CHECK_CONTAINS(out, "down");

    /* Started again on another port: the open client follows the registry. */
    unit_start(&u[1], url, 1, 2);
    printf("    unit 1 now at %s\n", u[1].addr);
    until_rows_ok(c, 2, 20, "unit 1 restarted elsewhere");
    CHECK_STR(dp_client_unit_address(c, 1), u[1].addr);
    dp_client_counters k;
    CHECK_OK(dp_client_counters_get(c, &k));
    CHECKF(k.rebinds >= 1 && k.restarts_seen >= 1,
           "rebinds %" PRIu64 " restarts_seen %" PRIu64, k.rebinds, k.restarts_seen);
    dp_client_close(c);

    /* A fresh client finds the new address and reads what the old one wrote. */
    c = open_url(url, 10, DP_OK, &d);
    CHECK_OK_D(get_rows(c, 2, &d), &d);
    dp_client_close(c);

    /* SIGTERM: the unit withdraws its record at once (no lease wait). */
    kill(u[0].pid, SIGTERM);
    CHECK_EQ(dp_test_wait_status(u[0].pid), 0);
    CHECKF(!has_record(url, 0, NULL, 0),
           "unit 0's record is still there after it stopped");
    unit_kill(&u[1]);
    etcd_stop(&e);
}

DP_TEST_TIMEOUT(duplicate_id_and_wrong_size_refused, 60)
{
    etcd_proc e = {0};
    etcd_start(&e);
    char url[256], out[8192], args[768];
    make_url(url, sizeof url, &e, "c2");
    unit_proc u0;
    unit_start(&u0, url, 0, 2);

    snprintf(args, sizeof args,
             "unit --slab 16M --registry %s --unit-id 0 --units 2 --registry-wait-s 5",
             url);
    int st = cli_run(args, out, sizeof out);
    printf("    second unit 0: exit %d: %s", st, out);
    CHECK_EQ(st, 1);
    CHECK_CONTAINS(out, "already served by");
    CHECK_CONTAINS(out, u0.addr);

    snprintf(args, sizeof args,
             "unit --slab 16M --registry %s --unit-id 1 --units 3 --registry-wait-s 5",
             url);
    st = cli_run(args, out, sizeof out);
    printf("    unit 1 of 3: exit %d: %s", st, out);
    CHECK_EQ(st, 1);
    CHECK_CONTAINS(out, "has 2 units");
    CHECK_CONTAINS(out, "--units 3");
    CHECKF(!has_record(url, 1, NULL, 0), "the refused unit left a record");

    /* Bad URLs and options are usage errors. */
    const char *bad[] = {"unit --registry etcd://127.0.0.1:2379",
                         "unit --registry etcd:///x",
                         "unit --registry etcd://127.0.0.1:0/x",
                         "unit --registry etcd://h:1/bad/name",
                         "unit --registry-ttl 5",
                         "unit --unit-id auto",
                         NULL};
    for (int i = 0; bad[i] != NULL; i++) {
        st = cli_run(bad[i], out, sizeof out);
        printf("    %s: exit %d: %s", bad[i], st, out);
        CHECK_EQ(st, 2);
    }
    unit_kill(&u0);
    etcd_stop(&e);
}

DP_TEST_TIMEOUT(malformed_records_are_refused_naming_the_key, 60)
{
    etcd_proc e = {0};
    etcd_start(&e);
    char url[256];
    make_url(url, sizeof url, &e, "c3");
    /* A record of another cluster at unit 0's key, garbage at unit 1's. */
    etcd_put_raw(&e, "dataplane/c3/units/1", "{not json");
    etcd_put_raw(&e, "dataplane/c3/units/0",
                 "{\"version\":1,\"cluster\":\"other\",\"id\":0,\"units\":2,"
                 "\"zmq\":\"tcp://127.0.0.1:1\",\"agent\":\"a\",\"incarnation\":"
                 "\"0123456789abcdef\",\"pid\":1,\"host\":\"h\",\"slab_bytes\":1,"
                 "\"ssd_bytes\":0,\"transports\":\"\",\"pubkey\":\"\",\"started\":1}");
    dp_detail d;
    open_url(url, 1.0, DP_EPROTO, &d);
    printf("    open: %s\n", dp_detail_msg(&d));
    CHECK_CONTAINS(dp_detail_msg(&d), "dataplane/c3/units/");

    char out[8192], args[512];
    snprintf(args, sizeof args, "cluster --cluster %s", url);
    CHECK_EQ(cli_run(args, out, sizeof out), 1);
    printf("%s", out);
    CHECK_CONTAINS(out, "dataplane/c3/units/1 is not a JSON object");
    CHECK_CONTAINS(out, "names cluster 'other'");

    /* Units replace malformed records at their own keys; garbage elsewhere is ignored. */
    etcd_put_raw(&e, "dataplane/c3/units/7", "[]");
    unit_proc u[2];
    unit_start(&u[0], url, 0, 2);
    unit_start(&u[1], url, 1, 2);
    dp_client *c = open_url(url, 10, DP_OK, &d);
    CHECK_OK_D(put_rows(c, 3, &d), &d);
    CHECK_OK_D(get_rows(c, 3, &d), &d);
    dp_client_close(c);
    unit_kill(&u[0]);
    unit_kill(&u[1]);
    etcd_stop(&e);
}

DP_TEST_TIMEOUT(clients_wait_for_every_unit, 60)
{
    etcd_proc e = {0};
    etcd_start(&e);
    char url[256];
    make_url(url, sizeof url, &e, "c4");
    dp_detail d;
    open_url(url, 0.5, DP_ENOTFOUND, &d);
    printf("    nothing registered: %s\n", dp_detail_msg(&d));
    CHECK_CONTAINS(dp_detail_msg(&d), "no unit is registered");

    unit_proc u[3];
    unit_start(&u[0], url, 0, 3);
    unit_start(&u[2], url, 2, 3);
    open_url(url, 1.0, DP_ENOTFOUND, &d);
    printf("    one missing: %s\n", dp_detail_msg(&d));
    CHECK_CONTAINS(dp_detail_msg(&d), "2 of 3 units registered; unit 1 missing");

    /* A client waiting when the last unit comes gets the whole cluster. */
    pid_t late = fork();
    CHECK(late >= 0);
    if (late == 0) {
        dp__sleep_s(1.0);
        unit_proc x;
        unit_start(&x, url, 1, 3);
        dp__sleep_s(30);
        _exit(0);
    }
    dp_client *c = open_url(url, 20, DP_OK, &d);
    CHECK_EQ(dp_client_n_units(c), 3u);
    CHECK_OK_D(put_rows(c, 4, &d), &d);
    CHECK_OK_D(get_rows(c, 4, &d), &d);
    dp_client_close(c);
    dp_test_kill_wait(late, SIGKILL);
    unit_kill(&u[0]);
    unit_kill(&u[2]);
    etcd_stop(&e);
}

DP_TEST_TIMEOUT(etcd_lost_and_back_under_a_running_cluster, 120)
{
    etcd_proc e = {0};
    etcd_start(&e);
    char url[256], url_late[256];
    make_url(url, sizeof url, &e, "c5");
    make_url(url_late, sizeof url_late, &e, "c5late");
    unit_proc u[2];
    unit_start(&u[0], url, 0, 2);
    unit_start(&u[1], url, 1, 2);
    dp_detail d;
    dp_client *c = open_url(url, 10, DP_OK, &d);
    CHECK_OK_D(put_rows(c, 5, &d), &d);

    /* etcd gone: the data plane does not notice. */
    etcd_kill(&e);
    CHECK_OK_D(get_rows(c, 5, &d), &d);
    dp__sleep_s(atof(TTL) + 1); /* past the lease: the units' renewals fail */
    CHECK_OK_D(put_rows(c, 6, &d), &d);
    CHECK_OK_D(get_rows(c, 6, &d), &d);
    printf("    etcd down: put+get still byte for byte\n");

    /* A unit started now waits for etcd within its start budget. */
    const char *wait[] = {"--registry-wait-s", "30", NULL};
    unit_proc late;
    pid_t starter = fork();
    CHECK(starter >= 0);
    if (starter == 0) {
        unit_start_args(&late, url_late, 0, 1, wait);
        dp__sleep_s(60); /* keeps the unit (its parent-death signal) */
        _exit(0);
    }
    dp__sleep_s(1.0);

    /* etcd back (same data): records renewed or registered again, and followed. */
    etcd_start(&e);
    wait_record(url, 0, true, 15);
    wait_record(url, 1, true, 15);
    wait_record(url_late, 0, true, 15);
    /* A record overwritten by hand (or deleted) is put back by its unit. */
    etcd_put_raw(&e, "dataplane/c5/units/0", "overwritten");
    wait_record(url, 0, true, 15);
    unit_kill(&u[1]);
    unit_start(&u[1], url, 1, 2);
    until_rows_ok(c, 7, 30, "etcd came back and unit 1 restarted elsewhere");
    CHECK_STR(dp_client_unit_address(c, 1), u[1].addr);

    /* etcd back empty (its data lost): the units register again under new
     * leases, and the client, whose revisions are now ahead of etcd's, reads
     * afresh and follows. */
    etcd_kill(&e);
    char wipe[300], out[256];
    snprintf(wipe, sizeof wipe, "rm -rf '%s'/*", e.dir);
    dp_test_run_sh(wipe, out, sizeof out);
    etcd_start(&e);
    wait_record(url, 0, true, 20);
    wait_record(url, 1, true, 20);
    unit_kill(&u[1]);
    unit_start(&u[1], url, 1, 2);
    until_rows_ok(c, 13, 30, "etcd lost its data and unit 1 restarted elsewhere");
    CHECK_STR(dp_client_unit_address(c, 1), u[1].addr);
    dp_client_close(c);
    dp_test_kill_wait(starter, SIGKILL);
    unit_kill(&u[0]);
    unit_kill(&u[1]);
    etcd_stop(&e);
}

DP_TEST_TIMEOUT(unit_ids_from_the_launcher, 60)
{
    etcd_proc e = {0};
    etcd_start(&e);
    char url[256], cmd[8800], out[8192];
    make_url(url, sizeof url, &e, "c6");
    const char *cli = dp_test_cli_path();
    /* Slurm's variables; then a variable of the caller's choosing. */
    snprintf(cmd, sizeof cmd,
             "SLURM_PROCID=1 SLURM_NTASKS=3 %s unit --slab 16M --registry %s "
             "--registry-ttl " TTL " --unit-id auto > /dev/null 2>&1 & echo $!",
             cli, url);
    CHECK_EQ(dp_test_run_sh(cmd, out, sizeof out), 0);
    pid_t p1 = (pid_t)atoi(out);
    snprintf(cmd, sizeof cmd,
             "MY_RANK=2 %s unit --slab 16M --registry %s --registry-ttl " TTL
             " --unit-id-env MY_RANK --units 3 > /dev/null 2>&1 & echo $!",
             cli, url);
    CHECK_EQ(dp_test_run_sh(cmd, out, sizeof out), 0);
    pid_t p2 = (pid_t)atoi(out);
    wait_record(url, 1, true, 15);
    wait_record(url, 2, true, 15);
    /* Launcher and command line disagree: refused. */
    snprintf(cmd, sizeof cmd,
             "SLURM_PROCID=0 SLURM_NTASKS=3 %s unit --registry %s --unit-id auto --units "
             "4 2>&1",
             cli, url);
    CHECK_EQ(dp_test_run_sh(cmd, out, sizeof out), 2);
    CHECK_CONTAINS(out, "says 3 tasks");
    /* A StatefulSet pod: the host name's ordinal (a UTS namespace of its own). */
    if (geteuid() == 0 && access("/usr/bin/unshare", X_OK) == 0) {
        snprintf(cmd, sizeof cmd,
                 "unshare --uts sh -c 'hostname dataplane-0 && exec %s unit --slab 16M "
                 "--registry %s --registry-ttl " TTL
                 " --unit-id auto --units 3' > /dev/null 2>&1 & echo $!",
                 cli, url);
        CHECK_EQ(dp_test_run_sh(cmd, out, sizeof out), 0);
        pid_t p0 = (pid_t)atoi(out);
        wait_record(url, 0, true, 15);
        dp_detail d;
        dp_client *c = open_url(url, 10, DP_OK, &d);
        CHECK_OK_D(put_rows(c, 8, &d), &d);
        CHECK_OK_D(get_rows(c, 8, &d), &d);
        dp_client_close(c);
        kill(p0, SIGKILL);
    } else {
        printf("    NOTE: not root: the host-name ordinal is not checked\n");
    }
    kill(p1, SIGKILL);
    kill(p2, SIGKILL);
    etcd_stop(&e);
}

DP_TEST_TIMEOUT(up_registers_its_units, 60)
{
    etcd_proc e = {0};
    etcd_start(&e);
    char url[256], dir[64] = "/tmp/dp-upreg-XXXXXX", cmd[8800], out[8192];
    CHECK(mkdtemp(dir) != NULL);
    make_url(url, sizeof url, &e, "c7");
    snprintf(cmd, sizeof cmd,
             "%s up --units 2 --slab 16M --dir %s --registry %s --registry-ttl " TTL
             " > %s/up.out 2>&1 & echo $!",
             dp_test_cli_path(), dir, url, dir);
    CHECK_EQ(dp_test_run_sh(cmd, out, sizeof out), 0);
    pid_t up = (pid_t)atoi(out);
    wait_record(url, 0, true, 20);
    wait_record(url, 1, true, 20);
    dp_detail d;
    dp_client *c = open_url(url, 10, DP_OK, &d);
    CHECK_OK_D(put_rows(c, 9, &d), &d);
    CHECK_OK_D(get_rows(c, 9, &d), &d);
    dp_client_close(c);
    kill(up, SIGTERM);
    wait_record(url, 0, false, 15);
    wait_record(url, 1, false, 15);
    snprintf(cmd, sizeof cmd, "cat %s/up.out; rm -rf %s", dir, dir);
    dp_test_run_sh(cmd, out, sizeof out);
    CHECK_CONTAINS(out, "registered in");
    etcd_stop(&e);
}

/*
 * Three hosts: etcd in host 0, the units in host 1, the client in host 2 as
 * another machine (own IPC, PID and UTS namespaces), finding the units only
 * through etcd; a unit killed and started again on another port is followed.
 */
DP_TEST_TIMEOUT(across_namespaces, 120)
{
    need_etcd();
    dp_lc_t_start = dp_test_now();
    dp_netns *n = dp_lc_topology(3, 0);
    etcd_proc e = {0};
    snprintf(e.dir, sizeof e.dir, "/tmp/dp-etcd-XXXXXX");
    CHECK(mkdtemp(e.dir) != NULL);
    snprintf(e.ip, sizeof e.ip, "%s", dp_netns_ip(n, 0));
    e.port = 2379;
    e.peer_port = 2380;
    snprintf(e.url_hosts, sizeof e.url_hosts, "%s:%u", e.ip, e.port);
    char bufs[7][160];
    const char *argv[14];
    etcd_argv(&e, bufs, argv);
    dp_netns_proc ep, u0, u1;
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_OK_D(dp_netns_spawn(n, 0, argv, 0, &ep, &d), &d);
    char url[256];
    make_url(url, sizeof url, &e, "ns");

    char line[512];
    const char *cli = dp_test_cli_path();
    const char *ua0[] = {cli,
                         "unit",
                         "--bind",
                         dp_netns_ip(n, 1),
                         "--slab",
                         "16M",
                         "--registry",
                         url,
                         "--registry-ttl",
                         TTL,
                         "--unit-id",
                         "0",
                         "--units",
                         "2",
                         "--registry-wait-s",
                         "30",
                         NULL};
    const char *ua1[] = {cli,
                         "unit",
                         "--bind",
                         dp_netns_ip(n, 1),
                         "--slab",
                         "16M",
                         "--registry",
                         url,
                         "--registry-ttl",
                         TTL,
                         "--unit-id",
                         "1",
                         "--units",
                         "2",
                         "--registry-wait-s",
                         "30",
                         NULL};
    CHECK_OK_D(dp_netns_spawn(n, 1, ua0, DP_NETNS_OWN_MACHINE, &u0, &d), &d);
    CHECK_OK_D(dp_netns_readline(&u0, line, sizeof line, 40, &d), &d);
    CHECK_OK_D(dp_netns_spawn(n, 1, ua1, DP_NETNS_OWN_MACHINE, &u1, &d), &d);
    CHECK_OK_D(dp_netns_readline(&u1, line, sizeof line, 40, &d), &d);
    printf("    units registered in etcd at %s (host 0) from host 1\n", e.url_hosts);

    dp_lc c;
    const char *la[] = {DP_LONGCLIENT_PATH, "--cluster", url, "--timeout", "5", NULL};
    snprintf(c.name, sizeof c.name, "client");
    c.timeout_s = 5;
    CHECK_OK_D(dp_netns_spawn(n, 2, la, DP_NETNS_OWN_MACHINE | DP_NETNS_STDIN, &c.p, &d),
               &d);
    CHECK_OK_D(dp_netns_readline(&c.p, line, sizeof line, 40, &d), &d);
    printf("    client in host 2: %s\n", line);
    CHECKF(strncmp(line, "ready ", 6) == 0 && strstr(line, "units=2") != NULL,
           "client's first line \"%s\"", line);
    dp_lc_answer a;
    dp_lc_ask_ok(&c, "put 0 16 65536 11", &a);
    dp_lc_ask_ok(&c, "get 0 16 65536 11", &a);

    /* Unit 1 killed, started again on another port: found through etcd. */
    dp_netns_proc_stop(&u1, SIGKILL, 5);
    CHECK_OK_D(dp_netns_spawn(n, 1, ua1, DP_NETNS_OWN_MACHINE, &u1, &d), &d);
    CHECK_OK_D(dp_netns_readline(&u1, line, sizeof line, 40, &d), &d);
    printf("    unit 1 restarted at %s\n", line);
    double t0 = dp_test_now();
    for (int tries = 0;; tries++) {
        dp_lc_ask(&c, "put 0 16 65536 12", &a);
        if (strcmp(a.verdict, "ok") == 0)
            break;
        CHECKF(dp_test_now() - t0 < 30, "no put within 30 s of unit 1's restart: %s",
               a.line);
        dp__sleep_s(0.2);
    }
    dp_lc_ask_ok(&c, "get 0 16 65536 12", &a);
    dp_lc_ask_ok(&c, "counters", &a);
    CHECKF(dp_lc_value_of(&a, NULL, "rebinds") >= 1, "no re-bind: %s", a.line);
    dp_lc_quit(&c);
    CHECK_OK_D(dp_netns_destroy(n, &d), &d);
    char cmd[200];
    char out[256];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", e.dir);
    dp_test_run_sh(cmd, out, sizeof out);
}
