/*
 * Tests of the multi-host harness (dp_netns.h) and the long-lived client
 * (dp_longclient), end to end: a real unit (the dataplane binary) inside host
 * 0, dp_longclient inside host 1 as another machine (own IPC and PID
 * namespaces), 16 rows of 64 KiB put and got byte for byte; a blackhole of
 * host 0 makes a get fail within the client's budget and the client works
 * again once it is lifted; the same with host 0's link down and up; random
 * loss never yields a false success; teardown leaves no namespace and no
 * firewall rule. Recovery must happen within RECOVER_S; a first call after
 * the lift that still fails is printed as a NOTE (fatal with
 * DP_TEST_STRICT_RECOVERY=1). The dataplane command run from host 1 against
 * two units in host 0: bench of 1 MiB and jagged 4 KiB rows (every CRC
 * checked), put, save, clear, load and get byte for byte. Also: stale
 * namespaces of dead creators are swept, and a creator killed by SIGTERM
 * (signal handler) or SIGKILL (guardian) leaves nothing behind.
 *
 * Needs root and network namespaces: otherwise every test skips (DP_SKIP)
 * and the program exits 77 (ctest reports the test as skipped).
 */
#include "dp_test.h"
#include "dp_proc.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/common.h"
#include "dp_netns.h"
#include "dp_lc.h"

#ifndef DP_CLI_PATH
#error "DP_CLI_PATH must name the dataplane binary"
#endif
#ifndef DP_LONGCLIENT_PATH
#error "DP_LONGCLIENT_PATH must name the dp_longclient binary"
#endif

#define CLIENT_TIMEOUT_S 3.0 /* dp_longclient --timeout */
#define MARGIN_S 1.0         /* allowed past the budget */
#define OUTAGE_S 4.0         /* how long each fault lasts */
#define RECOVER_S 30.0       /* how long the client may take to work again */
#define ROWS "0 16 65536"    /* ROW0 NROWS BYTES of the checked batch */
#define SPARE "100 16 65536" /* rows written during faults (outcome unknown) */

/* A topology, or the test skips with the reason. */
static dp_netns *
topology(uint32_t n_hosts, unsigned flags)
{
    return dp_lc_topology(n_hosts, flags);
}

/* After a fault is lifted: the checked rows back, then a new seed put and got. */
static void
recover(dp_lc *c, const char *fault, int seed_old, int seed_new)
{
    dp_lc_recover(c, fault, ROWS, seed_old, seed_new, RECOVER_S);
}

static bool
rules_have_drop(dp_netns *n, uint32_t host)
{
    char rules[4096];
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_OK_D(dp_netns_rules(n, host, rules, sizeof rules, &d), &d);
    return strstr(rules, "-j DROP") != NULL;
}

/* `ip netns list` holds none of the names that start with prefix. */
static void
check_netns_list_clean(const char *prefix)
{
    const char *argv[] = {"ip", "netns", "list", NULL};
    char out[8192];
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_OK_D(dp_netns_exec(NULL, DP_NETNS_HERE, argv, out, sizeof out, &d), &d);
    CHECKF(strstr(out, prefix) == NULL, "ip netns list still shows %s...: %s", prefix,
           out);
}

DP_TEST(end_to_end)
{
    dp_lc_t_start = dp_test_now();
    dp_detail d;
    dp_detail_clear(&d);
    char root_rules_before[8192] = "", root_rules_after[8192] = "";
    const char *ipt[] = {"iptables", "-w", "-S", NULL};
    bool have_root_rules = dp_netns_exec(NULL, DP_NETNS_HERE, ipt, root_rules_before,
                                         sizeof root_rules_before, NULL) == 0;

    double t0 = dp_test_now();
    dp_netns *n = topology(2, DP_NETNS_IPTABLES);
    char mine[64];
    snprintf(mine, sizeof mine, DP_NETNS_PREFIX "%ld-", (long)getpid());
    dp_lc_step(t0, "topology of 2 hosts");
    printf("    host0 %s %s, host1 %s %s\n", dp_netns_name(n, 0), dp_netns_ip(n, 0),
           dp_netns_name(n, 1), dp_netns_ip(n, 1));

    /* A unit in host 0. */
    t0 = dp_test_now();
    dp_netns_proc unit;
    char addr[256];
    dp_lc_unit_start(n, 0, DP_CLI_PATH, "0", "64M", &unit, addr, sizeof addr);
    dp_lc_step(t0, "unit started in host 0");
    printf("    unit at %s\n", addr);

    /* The client in host 1, as another machine. */
    t0 = dp_test_now();
    dp_lc client, other;
    dp_lc_start(&client, n, 1, DP_LONGCLIENT_PATH, "", addr, 1, CLIENT_TIMEOUT_S);
    dp_lc_step(t0, "client connected from host 1");

    /* It is another machine to UCX: shared memory alone cannot reach the unit. */
    t0 = dp_test_now();
    char line[4096];
    dp_lc_spawn(&other, n, 1, DP_LONGCLIENT_PATH, "shm-only", addr, CLIENT_TIMEOUT_S,
                "UCX_TLS=posix,sysv,cma,self", line, sizeof line);
    printf("    shm-only client: %.200s\n", line);
    CHECKF(strncmp(line, "err ", 4) == 0 && strstr(line, "DP_ETRANSFER") != NULL,
           "a client with only shared-memory transports answered \"%s\"", line);
    CHECK_EQ(dp_netns_proc_stop(&other.p, 0, 10), 1);
    dp_lc_step(t0, "shared memory cannot reach it");

    /* Byte for byte; the checker itself must catch a wrong seed and a gap. */
    dp_lc_answer a;
    t0 = dp_test_now();
    dp_lc_ask_ok(&client, "put " ROWS " 7", &a);
    dp_lc_ask_ok(&client, "get " ROWS " 7", &a);
    dp_lc_ask(&client, "get " ROWS " 8", &a);
    CHECKF(strcmp(a.verdict, "corrupt") == 0, "a get of the wrong seed answered \"%s\"",
           a.line);
    dp_lc_ask(&client, "get 50 2 65536 7", &a);
    CHECK_STR(a.verdict, "missing");
    CHECK_CONTAINS(a.rest, "50-51");
    dp_lc_ask_ok(&client, "stats", &a);
    CHECK_CONTAINS(a.rest, "u0:blobs=1,rows=16,entries=16");
    dp_lc_step(t0, "put/get 16 x 64 KiB, checker self-test");

    /* Blackhole of host 0: everything in and out of its eth0 dropped. */
    t0 = dp_test_now();
    CHECK_OK_D(dp_netns_blackhole(n, 0, true, &d), &d);
    CHECK(rules_have_drop(n, 0));
    dp_lc_ask_fails_in_budget(&client, "get " ROWS " 7", MARGIN_S, &a);
    dp_lc_ask_fails_in_budget(&client, "put " SPARE " 1", MARGIN_S, &a);
    double left = OUTAGE_S - (dp_test_now() - t0);
    if (left > 0)
        usleep((useconds_t)(left * 1e6));
    dp_lc_step(t0, "blackhole: get and put fail within budget");
    t0 = dp_test_now();
    CHECK_OK_D(dp_netns_blackhole(n, 0, false, &d), &d);
    CHECK(!rules_have_drop(n, 0));
    recover(&client, "blackhole", 7, 9);
    dp_lc_step(t0, "blackhole lifted: recovered");

    /* Link of host 0 down, then up. */
    t0 = dp_test_now();
    CHECK_OK_D(dp_netns_link(n, 0, false, &d), &d);
    dp_lc_ask_fails_in_budget(&client, "get " ROWS " 9", MARGIN_S, &a);
    dp_lc_ask_fails_in_budget(&client, "put " SPARE " 2", MARGIN_S, &a);
    left = OUTAGE_S - (dp_test_now() - t0);
    if (left > 0)
        usleep((useconds_t)(left * 1e6));
    dp_lc_step(t0, "link down: get and put fail within budget");
    t0 = dp_test_now();
    CHECK_OK_D(dp_netns_link(n, 0, true, &d), &d);
    recover(&client, "link down", 9, 11);
    dp_lc_step(t0, "link up: recovered");

    /* Random loss: answers may fail, within budget, but never lie. */
    t0 = dp_test_now();
    CHECK_OK_D(dp_netns_loss(n, 0, 0.2, &d), &d);
    char rules[4096];
    CHECK_OK_D(dp_netns_rules(n, 0, rules, sizeof rules, &d), &d);
    CHECK_CONTAINS(rules, "statistic");
    int oks = 0;
    for (int i = 0; i < 4; i++) {
        dp_lc_ask(&client, "get " ROWS " 11", &a);
        CHECKF(strcmp(a.verdict, "ok") == 0 || strcmp(a.verdict, "err") == 0,
               "a get under 20%% loss answered \"%s\"", a.line);
        CHECK(a.elapsed <= CLIENT_TIMEOUT_S + MARGIN_S);
        oks += strcmp(a.verdict, "ok") == 0;
    }
    printf("    %d of 4 gets ok under 20%% loss\n", oks);
    CHECK_OK_D(dp_netns_loss(n, 0, 0.0, &d), &d);
    CHECK(!rules_have_drop(n, 0));
    recover(&client, "packet loss", 11, 13);
    dp_lc_step(t0, "20% loss: no false success, recovered");

    /* Clean stop of both processes. */
    t0 = dp_test_now();
    dp_lc_ask_ok(&client, "clear 0 16", &a);
    CHECK_CONTAINS(a.rest, "dropped=16");
    dp_lc_quit(&client);
    CHECK_EQ(dp_netns_proc_stop(&unit, SIGTERM, 10), 0);
    dp_lc_step(t0, "client quit, unit stopped (SIGTERM)");

    /* Teardown leaves nothing behind. */
    t0 = dp_test_now();
    CHECK_OK_D(dp_netns_destroy(n, &d), &d);
    char left_names[1024];
    CHECKF(dp_netns_leftovers(getpid(), left_names, sizeof left_names) == 0,
           "namespaces left: %s", left_names);
    check_netns_list_clean(mine);
    if (have_root_rules) {
        CHECK_OK_D(dp_netns_exec(NULL, DP_NETNS_HERE, ipt, root_rules_after,
                                 sizeof root_rules_after, &d),
                   &d);
        CHECK_STR(root_rules_after, root_rules_before);
    }
    dp_lc_step(t0, "teardown: no namespace, no rule left");
}

/* Run the dataplane command inside host as another machine; its output in out. */
static int
cli_in_host(dp_netns *n, uint32_t host, const char *const *args, char *out, size_t cap,
            dp_detail *d)
{
    const char *argv[32] = {"unshare", "--ipc", "--pid", "--uts", "--fork", DP_CLI_PATH};
    size_t k = 6;
    for (size_t i = 0; args[i] != NULL && k + 1 < DP_ARRAY_LEN(argv); i++)
        argv[k++] = args[i];
    argv[k] = NULL;
    dp_detail_clear(d);
    return dp_netns_exec(n, host, argv, out, cap, d);
}

static void
fill_file(const char *path, size_t n, uint64_t seed)
{
    FILE *f = fopen(path, "wb");
    CHECKF(f != NULL, "cannot create %s", path);
    for (size_t i = 0; i < n; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        fputc((int)(seed >> 56), f);
    }
    CHECK(fclose(f) == 0);
}

static bool
same_files(const char *a, const char *b)
{
    FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
    bool same = fa != NULL && fb != NULL;
    while (same) {
        int x = fgetc(fa), y = fgetc(fb);
        same = x == y;
        if (x == EOF || y == EOF)
            break;
    }
    if (fa != NULL)
        fclose(fa);
    if (fb != NULL)
        fclose(fb);
    return same;
}

/*
 * The data path across hosts through the dataplane command, as a user on
 * another machine runs it: 64 x 1 MiB rows and 1024 x 4 jagged 4 KiB rows put
 * and got with every value's CRC32C checked (`dataplane bench`), over the
 * two-sided TCP path it names; values of 1 B, 100 kB and 3 MiB put from
 * files, saved, cleared (then missing), loaded and got back byte for byte.
 */
DP_TEST(cli_data_path_across_hosts)
{
    dp_lc_t_start = dp_test_now();
    dp_netns *n = topology(2, 0);
    char dir[] = "/tmp/dp-hosts-cli-XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    char cdir[256], cfile[300], path[320], got[320], ckpt[300];
    snprintf(cdir, sizeof cdir, "%s/c", dir);
    snprintf(cfile, sizeof cfile, "%s/cluster.json", cdir);
    /* Two units in host 0 (`dataplane up` writes the cluster file the client reads). */
    const char *up[] = {DP_CLI_PATH, "up",   "--units", "2",
                        "--slab",    "128M", "--bind",  dp_netns_ip(n, 0),
                        "--dir",     cdir,   NULL};
    dp_netns_proc cluster;
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_OK_D(dp_netns_spawn(n, 0, up, DP_NETNS_OWN_MACHINE, &cluster, &d), &d);
    for (int i = 0; i < 300 && access(cfile, R_OK) != 0; i++)
        usleep(100000);
    CHECKF(access(cfile, R_OK) == 0, "dataplane up in host 0 wrote no %s", cfile);
    static char out[8192];

    double t0 = dp_test_now();
    const char *large[] = {"bench",    "--cluster", cfile,     "--rows", "64",
                           "--fields", "1",         "--bytes", "1M",     "--iters",
                           "2",        "--warmup",  "1",       NULL};
    CHECK_OK_D(cli_in_host(n, 1, large, out, sizeof out, &d), &d);
    CHECK_CONTAINS(out, "unit 0: tcp two-sided (tcp); unit 1: tcp two-sided (tcp)");
    CHECK_CONTAINS(out, "every value checked");
    const char *small[] = {"bench", "--cluster", cfile, "--rows",   "1024", "--fields",
                           "4",     "--bytes",   "4K",  "--jagged", "0.9",  "--iters",
                           "2",     "--warmup",  "1",   NULL};
    CHECK_OK_D(cli_in_host(n, 1, small, out, sizeof out, &d), &d);
    CHECK_CONTAINS(out, "every value checked");
    dp_lc_step(t0, "bench across hosts: 1 MiB rows, jagged 4 KiB rows, CRCs checked");

    t0 = dp_test_now();
    static const size_t sizes[3] = {1, 100000, 3u << 20};
    for (int i = 0; i < 3; i++) {
        snprintf(path, sizeof path, "%s/v%d", dir, i);
        fill_file(path, sizes[i], 77 + (uint64_t)i);
        char row[16];
        snprintf(row, sizeof row, "%d", 500 + i);
        const char *put[] = {"put",     "--cluster", cfile,    "--row", row,
                             "--field", "blob",      "--file", path,    NULL};
        CHECK_OK_D(cli_in_host(n, 1, put, out, sizeof out, &d), &d);
    }
    snprintf(ckpt, sizeof ckpt, "%s/ckpt", dir);
    const char *save[] = {"save", "--cluster", cfile, "-q", ckpt, NULL};
    CHECK_OK_D(cli_in_host(n, 1, save, out, sizeof out, &d), &d);
    const char *clear[] = {"clear", "500-502", "--cluster", cfile, NULL};
    CHECK_OK_D(cli_in_host(n, 1, clear, out, sizeof out, &d), &d);
    snprintf(got, sizeof got, "%s/got", dir);
    const char *miss[] = {"get", "501@blob", "-o", got, "--cluster", cfile, NULL};
    CHECK(cli_in_host(n, 1, miss, out, sizeof out, &d) != 0); /* cleared: not found */
    const char *load[] = {"load", "--cluster", cfile, "-q", ckpt, NULL};
    CHECK_OK_D(cli_in_host(n, 1, load, out, sizeof out, &d), &d);
    for (int i = 0; i < 3; i++) {
        char key[32];
        snprintf(key, sizeof key, "%d@blob", 500 + i);
        const char *get[] = {"get", key, "-o", got, "--cluster", cfile, NULL};
        CHECK_OK_D(cli_in_host(n, 1, get, out, sizeof out, &d), &d);
        snprintf(path, sizeof path, "%s/v%d", dir, i);
        CHECKF(same_files(path, got), "%s came back different after save, clear, load",
               key);
    }
    dp_lc_step(t0, "put from files, save, clear, load, get: byte for byte");

    CHECK_EQ(dp_netns_proc_stop(&cluster, SIGTERM, 20), 0);
    CHECK_OK_D(dp_netns_destroy(n, &d), &d);
    char cmd[320];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    CHECK(system(cmd) == 0);
}

/* A pid that no process has (one that just exited and was reaped). */
static pid_t
dead_pid(void)
{
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0)
        _exit(0);
    CHECK_EQ(dp_test_wait_status(pid), 0);
    return pid;
}

DP_TEST(sweep_stale)
{
    dp_netns_destroy(topology(1, 0), NULL); /* skips here when not allowed */
    dp_detail d;
    dp_detail_clear(&d);
    pid_t dead = dead_pid();
    pid_t alive = fork();
    CHECK(alive >= 0);
    if (alive == 0) {
        pause();
        _exit(0);
    }
    char dead_name[64], live_name[64];
    snprintf(dead_name, sizeof dead_name, DP_NETNS_PREFIX "%ld-0-h0", (long)dead);
    snprintf(live_name, sizeof live_name, DP_NETNS_PREFIX "%ld-0-h0", (long)alive);
    const char *add_dead[] = {"ip", "netns", "add", dead_name, NULL};
    const char *add_live[] = {"ip", "netns", "add", live_name, NULL};
    const char *del_live[] = {"ip", "netns", "del", live_name, NULL};
    CHECK_OK_D(dp_netns_exec(NULL, DP_NETNS_HERE, add_dead, NULL, 0, &d), &d);
    CHECK_OK_D(dp_netns_exec(NULL, DP_NETNS_HERE, add_live, NULL, 0, &d), &d);
    CHECK_EQ(dp_netns_leftovers(dead, NULL, 0), 1);
    int removed = -1;
    CHECK_OK_D(dp_netns_sweep(&removed, &d), &d);
    CHECK(removed >= 1);
    CHECK_EQ(dp_netns_leftovers(dead, NULL, 0), 0);
    CHECK_EQ(dp_netns_leftovers(alive, NULL, 0), 1); /* its creator lives: kept */
    CHECK_OK_D(dp_netns_exec(NULL, DP_NETNS_HERE, del_live, NULL, 0, &d), &d);
    kill(alive, SIGKILL);
    CHECK_EQ(dp_test_wait_status(alive), -SIGKILL);
}

/* A process whose stat says it is gone or a zombie. */
static bool
proc_gone(pid_t pid)
{
    char path[64], st[512];
    snprintf(path, sizeof path, "/proc/%ld/stat", (long)pid);
    int fd = open(path, O_RDONLY);
    if (fd < 0)
        return true;
    ssize_t k = read(fd, st, sizeof st - 1);
    close(fd);
    if (k <= 0)
        return true;
    st[k] = '\0';
    const char *paren = strrchr(st, ')');
    return paren != NULL && paren[1] == ' ' && (paren[2] == 'Z' || paren[2] == 'X');
}

/*
 * A child builds a topology with a process inside, then gets sig. With
 * SIGTERM the handler cleans up before the child dies; with SIGKILL the
 * guardian does, within seconds.
 */
static void
killed_creator(int sig)
{
    dp_netns_destroy(topology(1, 0), NULL);
    int fds[2];
    CHECK(pipe(fds) == 0);
    fflush(NULL);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        close(fds[0]);
        dp_netns *n = NULL;
        dp_detail d;
        dp_detail_clear(&d);
        char msg[128];
        dp_netns_proc p;
        const char *argv[] = {"/bin/sleep", "600", NULL};
        if (dp_netns_create(1, 0, &n, &d) != 0 ||
            dp_netns_spawn(n, 0, argv, DP_NETNS_OWN_MACHINE, &p, &d) != 0) {
            snprintf(msg, sizeof msg, "fail %.100s\n", d.msg);
            dp_test_write_str(fds[1], msg);
            _exit(1);
        }
        snprintf(msg, sizeof msg, "ready %ld\n", (long)p.pid);
        dp_test_write_str(fds[1], msg);
        for (;;)
            pause();
    }
    close(fds[1]);
    char msg[128] = "";
    ssize_t k = read(fds[0], msg, sizeof msg - 1);
    close(fds[0]);
    msg[k > 0 ? k : 0] = '\0';
    long inner = 0;
    CHECKF(sscanf(msg, "ready %ld", &inner) == 1, "child: %s", msg);
    CHECK_EQ(dp_netns_leftovers(pid, NULL, 0), 2);
    double t0 = dp_test_now();
    kill(pid, sig);
    CHECK_EQ(dp_test_wait_status(pid), -sig);
    char names[512];
    if (sig != SIGKILL) {
        /* The handler ran before the child died: nothing to wait for. */
        CHECKF(dp_netns_leftovers(pid, names, sizeof names) == 0, "left: %s", names);
    } else {
        while (dp_netns_leftovers(pid, names, sizeof names) != 0 &&
               dp_test_now() - t0 < 10)
            usleep(20000);
        CHECKF(dp_netns_leftovers(pid, names, sizeof names) == 0,
               "guardian left after 10 s: %s", names);
    }
    while (!proc_gone((pid_t)inner) && dp_test_now() - t0 < 10)
        usleep(20000);
    CHECKF(proc_gone((pid_t)inner), "process %ld inside the namespace still runs", inner);
    printf("    creator killed by signal %d: clean after %.3f s\n", sig,
           dp_test_now() - t0);
}

DP_TEST(creator_sigterm)
{
    killed_creator(SIGTERM);
}

DP_TEST(creator_sigkill)
{
    killed_creator(SIGKILL);
}
