/*
 * Restarts and outages, end to end with real unit processes (the dataplane
 * binary) and a long-lived client: a unit restarted on the same port never
 * makes a client report wrong data as success, and the client recovers by
 * itself; a dead unit shows at once as "down"; clients killed mid-put cost
 * the unit nothing once their processes are gone; a retired region of a
 * shared-memory writer comes back when the writer dies, others never; a peer
 * of another UCX version is refused before UCX sees its address. Content is
 * checked byte for byte.
 */
#include "dp_test.h"
#include "dp_proc.h"

#include <inttypes.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "client/client_int.h"
#include "common/common.h"
#include "ctl/ctl.h"
#include "dataplane/checkpoint.h"
#include "dataplane/client.h"
#include "wire/wire.h"
#include "xfer/endpoint.h"

/* ---- unit processes ---- */

typedef struct unit_proc {
    pid_t pid;
    char addr[128];
    unsigned port;
    char slab[16];
    uint32_t id, n;
} unit_proc;

/* Start `dataplane unit` on 127.0.0.1:port (0: a free one). */
static void
unit_start(unit_proc *u, unsigned port, const char *slab, uint32_t id, uint32_t n)
{
    const char *cli = dp_test_cli_path();
    CHECKF(cli != NULL, "the dataplane binary is not built next to the tests");
    char p[16], ids[16], ns[16];
    snprintf(p, sizeof p, "%u", port);
    snprintf(ids, sizeof ids, "%u", id);
    snprintf(ns, sizeof ns, "%u", n);
    char sl[16];
    snprintf(sl, sizeof sl, "%s", slab); /* slab may be u->slab (a restart) */
    snprintf(u->slab, sizeof u->slab, "%s", sl);
    u->id = id;
    u->n = n;
    const char *args[] = {cli,       "unit",   "--bind", "127.0.0.1", "--port",
                          p,         "--slab", sl,       "--unit-id", ids,
                          "--units", ns,       NULL};
    for (int attempt = 0; attempt < 50; attempt++) {
        u->pid = dp_test_cli_start(args, u->addr, sizeof u->addr);
        if (strncmp(u->addr, "tcp://", 6) == 0)
            break;
        /* The port may still be held for a moment after a kill: try again. */
        kill(u->pid, SIGKILL);
        waitpid(u->pid, NULL, 0);
        dp__sleep_s(0.1);
    }
    CHECKF(strncmp(u->addr, "tcp://", 6) == 0, "unit did not start: '%s'", u->addr);
    const char *colon = strrchr(u->addr, ':');
    u->port = (unsigned)atoi(colon + 1);
}

static void
unit_kill(unit_proc *u)
{
    kill(u->pid, SIGKILL);
    waitpid(u->pid, NULL, 0);
}

/* Kill -9 and start again on the same port: a launcher restarting it. */
static void
unit_restart(unit_proc *u)
{
    unit_kill(u);
    unit_start(u, u->port, u->slab, u->id, u->n);
}

/* A client of n units; connect_s bounds the open, timeout_s each operation. */
static dp_client *
open_units_t(unit_proc *u, uint32_t n, double timeout_s, double connect_s)
{
    const char *addrs[8];
    for (uint32_t i = 0; i < n; i++)
        addrs[i] = u[i].addr;
    dp_client_opts o;
    dp_client_opts_init(&o);
    o.timeout_s = timeout_s;
    o.connect_timeout_s = connect_s;
    dp_client *c = NULL;
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_OK_D(dp_client_open_units(addrs, n, &o, &c, &d), &d);
    return c;
}

static dp_client *
open_units(unit_proc *u, uint32_t n, double timeout_s)
{
    return open_units_t(u, n, timeout_s, timeout_s);
}

/* One unit's counter through a client. */
static double
unit_stat(dp_client *c, uint32_t unit, const char *name)
{
    dp_client_stats *s = NULL;
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_OK_D(dp_client_stats_get(c, &s, &d), &d);
    double v = -1;
    CHECKF(dp_client_stats_find(s, unit, name, &v), "no counter %s", name);
    dp_client_stats_destroy(s);
    return v;
}

/* ---- values: a pattern per (row, seed), checked byte for byte ---- */

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

/* Put rows r0..r0+n-1 (field "v", len bytes each, pattern seed). row_status too;
 * locs (NULL, or n) gets their location hints. */
static int
put_rows_l(dp_client *c, uint64_t r0, uint32_t n, size_t len, uint64_t seed, int *rs,
           dp_loc *locs, dp_detail *d)
{
    uint8_t *buf = NULL;
    CHECK_OK(dp_client_alloc(c, (size_t)n * len, (void **)&buf, NULL));
    uint64_t g[64];
    dp_value v[64];
    CHECK(n <= 64);
    for (uint32_t i = 0; i < n; i++) {
        g[i] = r0 + i;
        fill(buf + i * len, len, g[i], seed);
        v[i] = (dp_value){buf + i * len, len, DP_KIND_BYTES, NULL, NULL, 0};
    }
    const char *f[] = {"v"};
    dp_detail_clear(d);
    int rc = dp_client_put_locs(c, g, n, f, 1, v, rs, locs, d);
    dp_client_free(c, buf);
    return rc;
}

static int
put_rows(dp_client *c, uint64_t r0, uint32_t n, size_t len, uint64_t seed, int *rs,
         dp_detail *d)
{
    return put_rows_l(c, r0, n, len, seed, rs, NULL, d);
}

/*
 * Get rows r0..r0+n-1 and check every value that came back DP_OK against
 * pattern seed: a wrong byte with DP_OK fails the test at once (a false
 * success). st[i] gets each key's status.
 */
static int
get_rows_l(dp_client *c, uint64_t r0, uint32_t n, size_t len, uint64_t seed, int *st,
           const dp_loc *locs, dp_detail *d)
{
    CHECK(n <= 64);
    uint8_t *buf = NULL, *want = malloc(len);
    CHECK_OK(dp_client_alloc(c, (size_t)n * len, (void **)&buf, NULL));
    memset(buf, 0xa5, (size_t)n * len);
    char keys[64][32];
    dp_get_item it[64];
    for (uint32_t i = 0; i < n; i++) {
        snprintf(keys[i], sizeof keys[i], "%" PRIu64 "@v", r0 + i);
        it[i] = (dp_get_item){.key = keys[i], .dst = buf + i * len, .cap = len};
        it[i].loc = locs != NULL ? &locs[i] : NULL;
    }
    dp_detail_clear(d);
    int rc = dp_client_get(c, it, n, d);
    for (uint32_t i = 0; i < n; i++) {
        st[i] = it[i].status;
        if (it[i].status != 0)
            continue;
        fill(want, len, r0 + i, seed);
        CHECKF(it[i].nbytes == len && memcmp(buf + i * len, want, len) == 0,
               "row %" PRIu64 " came back DP_OK with bytes that are not its value (seed "
               "%" PRIu64 "): a false success",
               r0 + i, seed);
    }
    dp_client_free(c, buf);
    free(want);
    return rc;
}

static int
get_rows(dp_client *c, uint64_t r0, uint32_t n, size_t len, uint64_t seed, int *st,
         dp_detail *d)
{
    return get_rows_l(c, r0, n, len, seed, st, NULL, d);
}

static void
expect_all(const int *st, uint32_t n, int code, const char *what)
{
    for (uint32_t i = 0; i < n; i++)
        CHECKF(st[i] == code, "%s: key %u is %s, want %s", what, i, dp_errname(st[i]),
               dp_errname(code));
}

/* ---- a unit restarted on the same port, with a long-lived client ---- */

/*
 * S keeps one client across a kill -9 and restart of its unit on the same
 * port; F is a fresh client of the new process. S never gets a wrong byte
 * or a false success, its first operation fails once with DP_ERESTARTED,
 * then it works without reopening; F's clears stay cleared and F's
 * overwrites stay. first_put: S's first operation after the restart is a
 * put (else a get).
 */
static void
restart_scenario(size_t len, bool first_put)
{
    unit_proc u;
    unit_start(&u, 0, "64M", 0, 1);
    dp_client *s = open_units(&u, 1, 10);
    dp_detail d;
    int st[8], rs[8];
    CHECK_OK_D(put_rows(s, 100, 4, len, 1, rs, &d), &d);
    CHECK_OK_D(put_rows(s, 110, 4, len, 1, rs, &d), &d);
    CHECK_OK_D(get_rows(s, 100, 4, len, 1, st, &d), &d);

    unit_restart(&u);
    dp_client *f = open_units(&u, 1, 10);
    CHECK_OK_D(put_rows(f, 100, 4, len, 2, rs, &d), &d);
    uint64_t g[4] = {100, 101, 102, 103}, dropped = 0;
    CHECK_OK_D(dp_client_clear(f, g, 4, &dropped, &d), &d);
    CHECK_EQ(dropped, 4);
    CHECK_OK_D(put_rows(f, 110, 4, len, 2, rs, &d), &d);
    CHECK_OK_D(put_rows(f, 110, 4, len, 3, rs, &d), &d); /* a confirmed overwrite */

    if (first_put) {
        /* S's put meets the new process: refused once, nothing lands. */
        CHECK_ERR_D(put_rows(s, 200, 4, len, 4, rs, &d), DP_ERESTARTED, &d);
        CHECK_CONTAINS(d.msg, "restarted");
        expect_all(rs, 4, DP_ERESTARTED, "put after the restart");
        CHECK_ERR_D(get_rows(f, 200, 4, len, 4, st, &d), DP_ENOTFOUND, &d);
        CHECK_ERR_D(get_rows(s, 100, 4, len, 1, st, &d), DP_ENOTFOUND, &d);
    } else {
        /* S's get meets the new process: refused once, never old or wrong bytes. */
        CHECK_ERR_D(get_rows(s, 100, 4, len, 1, st, &d), DP_ERESTARTED, &d);
        CHECK_CONTAINS(d.msg, "restarted");
        expect_all(st, 4, DP_ERESTARTED, "get after the restart");
        CHECK_ERR_D(get_rows(s, 100, 4, len, 1, st, &d), DP_ENOTFOUND, &d);
    }
    expect_all(st, 4, DP_ENOTFOUND, "F's cleared rows, seen by S");
    /* S works again without reopening: it reads F's overwrite, and puts. */
    CHECK_OK_D(get_rows(s, 110, 4, len, 3, st, &d), &d);
    CHECK_OK_D(put_rows(s, 200, 4, len, 5, rs, &d), &d);
    CHECK_OK_D(get_rows(f, 200, 4, len, 5, st, &d), &d);
    CHECK_ERR_D(get_rows(f, 100, 4, len, 2, st, &d), DP_ENOTFOUND, &d);
    CHECK_OK_D(get_rows(f, 110, 4, len, 3, st, &d), &d);
    /* Nothing was published from stale bytes and nothing was retired. */
    CHECK_EQ(unit_stat(f, 0, "identity_refused"), 0);
    CHECK_EQ(unit_stat(f, 0, "retired_bytes"), 0);
    dp_client_counters cn;
    CHECK_OK(dp_client_counters_get(s, &cn));
    CHECK_EQ_U64(cn.restarts_seen, 1);
    CHECK(cn.rebinds >= 1);
    dp_client_close(f);
    dp_client_close(s);
    unit_kill(&u);
}

/*
 * Location hints across a restart: S's hints name blobs of the old process.
 * S's first get fails once with DP_ERESTARTED; the next finds F's values by
 * key (the hinted blobs are gone), never the old bytes; F's own hints work.
 * A checkpoint loaded into a unit of the same size keeps its blob ids and
 * bytes: hints from before the save still find the values, READ where the
 * load put them.
 */
DP_TEST(location_hints_across_a_restart)
{
    unit_proc u;
    unit_start(&u, 0, "64M", 0, 1);
    dp_client *s = open_units(&u, 1, 10);
    dp_detail d;
    int st[8], rs[8];
    dp_loc ls[8], lf[8];
    /* 8 x 16 KiB: more than one reply carries inline, so hints are used. */
    const size_t len = 16384;
    CHECK_OK_D(put_rows_l(s, 100, 8, len, 1, rs, ls, &d), &d);
    CHECK_OK_D(get_rows_l(s, 100, 8, len, 1, st, ls, &d), &d);
    double by_blob = unit_stat(s, 0, "resolves_by_blob");
    CHECK(by_blob >= 1);

    unit_restart(&u);
    dp_client *f = open_units(&u, 1, 10);
    CHECK_OK_D(put_rows_l(f, 100, 8, len, 2, rs, lf, &d), &d);
    CHECK_ERR_D(get_rows_l(s, 100, 8, len, 2, st, ls, &d), DP_ERESTARTED, &d);
    expect_all(st, 8, DP_ERESTARTED, "hinted get after the restart");
    dp_client_counters k0, k1;
    CHECK_OK(dp_client_counters_get(s, &k0));
    CHECK_OK_D(get_rows_l(s, 100, 8, len, 2, st, ls, &d), &d); /* F's values, by key */
    CHECK_OK(dp_client_counters_get(s, &k1));
    CHECK_EQ_U64(k1.loc_misses - k0.loc_misses, 8);
    CHECK_OK(dp_client_counters_get(f, &k0));
    by_blob = unit_stat(f, 0, "resolves_by_blob");
    double resolves = unit_stat(f, 0, "resolves");
    CHECK_OK_D(get_rows_l(f, 100, 8, len, 2, st, lf, &d), &d);
    CHECK_OK(dp_client_counters_get(f, &k1));
    CHECK_EQ_U64(k1.loc_misses - k0.loc_misses, 0);
    /* One resolve, by blob: no key was looked up. */
    CHECK_EQ(unit_stat(f, 0, "resolves_by_blob"), by_blob + 1);
    CHECK_EQ(unit_stat(f, 0, "resolves"), resolves + 1);

    /* Save, restart empty, load: the hints from before the save still hold. */
    char dir[] = "/tmp/dp-hints-ckpt-XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    dp_ckpt_summary sum;
    CHECK_OK_D(dp_ckpt_save(f, dir, NULL, &sum, &d), &d);
    unit_restart(&u);
    dp_client *g = open_units(&u, 1, 10);
    CHECK_ERR_D(get_rows_l(g, 100, 8, len, 2, st, lf, &d), DP_ENOTFOUND, &d);
    CHECK_OK_D(dp_ckpt_load(g, dir, NULL, &sum, &d), &d);
    CHECK_OK(dp_client_counters_get(g, &k0));
    CHECK_OK_D(get_rows_l(g, 100, 8, len, 2, st, lf, &d), &d);
    CHECK_OK(dp_client_counters_get(g, &k1));
    CHECK_EQ_U64(k1.loc_misses - k0.loc_misses, 0);
    dp_client_close(g);
    dp_client_close(f);
    dp_client_close(s);
    unit_kill(&u);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0);
}

DP_TEST(restart_same_port_get_first_4k)
{
    restart_scenario(4096, false); /* inline values: 4 x 4 KiB fit one message */
}

DP_TEST(restart_same_port_put_first_4k)
{
    restart_scenario(4096, true);
}

/* The same small rows through alloc, WRITE and commit (the memcpy path). */
DP_TEST(restart_same_port_get_first_4k_no_inline)
{
    setenv("DP_INLINE", "off", 1);
    restart_scenario(4096, false);
    unsetenv("DP_INLINE");
}

DP_TEST(restart_same_port_put_first_4k_no_inline)
{
    setenv("DP_INLINE", "off", 1);
    restart_scenario(4096, true);
    unsetenv("DP_INLINE");
}

DP_TEST(restart_same_port_get_first_256k)
{
    restart_scenario(256 << 10, false); /* UCX's put/get */
}

DP_TEST(restart_same_port_put_first_256k)
{
    restart_scenario(256 << 10, true);
}

/* ---- a dead unit shows at once ---- */

/*
 * Two units, one killed: with a 30 s budget, puts, gets, clears and stats
 * fail that unit's part within seconds as DP_ETRANSFER "down", the other
 * unit's part works; many retries while it is down wedge nothing; restarted
 * on its port it serves the same client again.
 */
DP_TEST(dead_unit_is_down_at_once_and_comes_back)
{
    unit_proc u[2];
    unit_start(&u[0], 0, "64M", 0, 2);
    unit_start(&u[1], 0, "64M", 1, 2);
    dp_client *c = open_units(u, 2, 30);
    dp_detail d;
    int st[8], rs[8];
    enum { LEN = 64 << 10 };
    CHECK_OK_D(put_rows(c, 0, 8, LEN, 1, rs, &d), &d);
    unit_kill(&u[1]);
    double t0 = dp_test_now();
    CHECK_ERR_D(put_rows(c, 0, 8, LEN, 2, rs, &d), DP_ETRANSFER, &d);
    double took = dp_test_now() - t0;
    CHECKF(took < 5.0, "a put to a dead unit took %.1f s of its 30 s budget", took);
    CHECK_CONTAINS(d.msg, "down");
    for (uint32_t i = 0; i < 8; i++) /* even rows: unit 0, landed */
        CHECK_EQ(rs[i], i % 2 == 0 ? 0 : DP_ETRANSFER);
    t0 = dp_test_now();
    CHECK_ERR_D(get_rows(c, 0, 8, LEN, 2, st, &d), DP_ETRANSFER, &d);
    CHECKF(dp_test_now() - t0 < 5.0, "a get took %.1f s", dp_test_now() - t0);
    for (uint32_t i = 0; i < 8; i += 2)
        CHECK_EQ(st[i], 0); /* and checked: seed 2 on unit 0 */
    uint64_t g[2] = {0, 1};
    t0 = dp_test_now();
    CHECK_ERR_D(dp_client_clear(c, g, 2, NULL, &d), DP_ETRANSFER, &d);
    CHECKF(dp_test_now() - t0 < 5.0, "a clear took %.1f s", dp_test_now() - t0);
    /* Retrying while it is down: fast every time. */
    t0 = dp_test_now();
    for (int i = 0; i < 20; i++)
        CHECK_ERR(put_rows(c, 1, 1, LEN, 9, rs, &d), DP_ETRANSFER);
    CHECKF(dp_test_now() - t0 < 20.0, "20 puts to a dead unit took %.1f s",
           dp_test_now() - t0);
    unit_start(&u[1], u[1].port, "64M", 1, 2);
    /* The restart is reported once; then everything works. */
    int rc = put_rows(c, 0, 8, LEN, 3, rs, &d);
    CHECKF(rc == DP_ERESTARTED, "first put after the restart: %s: %s", dp_errname(rc),
           d.msg);
    CHECK_OK_D(put_rows(c, 0, 8, LEN, 3, rs, &d), &d);
    CHECK_OK_D(get_rows(c, 0, 8, LEN, 3, st, &d), &d);
    for (uint32_t k = 0; k < 2; k++) {
        CHECK_EQ(unit_stat(c, k, "retired_bytes"), 0);
        CHECK_EQ(unit_stat(c, k, "identity_refused"), 0);
    }
    dp_client_counters cn;
    CHECK_OK(dp_client_counters_get(c, &cn));
    CHECK(cn.units_down >= 20);
    CHECK_EQ_U64(cn.restarts_seen, 1);
    dp_client_close(c);
    unit_kill(&u[0]);
    unit_kill(&u[1]);
}

/*
 * A client opens while a unit is down (killed: refused at once; stopped: no
 * answer within the connect budget): the open succeeds, names the unit in a
 * warning and counts it; the other unit's rows work; the down unit's rows
 * fail as "down" and never come back wrong; once the unit answers, the next
 * put binds it with no restart reported (this client held nothing there).
 * With no unit answering at all, the open still fails.
 */
DP_TEST(client_opens_with_a_unit_down)
{
    unit_proc u[2];
    unit_start(&u[0], 0, "64M", 0, 2);
    unit_start(&u[1], 0, "64M", 1, 2);
    dp_detail d;
    int st[8], rs[8];
    enum { LEN = 64 << 10 };
    dp_client *c0 = open_units(u, 2, 10);
    CHECK_OK_D(put_rows(c0, 0, 8, LEN, 1, rs, &d), &d);
    dp_client_close(c0);

    unit_kill(&u[1]);
    dp_client *c = open_units(u, 2, 10);
    dp_client_counters cn;
    CHECK_OK(dp_client_counters_get(c, &cn));
    CHECK_EQ_U64(cn.units_down, 1);
    char path[128];
    CHECK_OK(dp_client_unit_path(c, 1, path, sizeof path));
    CHECK_CONTAINS(path, "not connected");
    CHECK_OK(dp_client_unit_path(c, 0, path, sizeof path));
    CHECK(strstr(path, "not connected") == NULL);
    CHECK_ERR_D(get_rows(c, 0, 8, LEN, 1, st, &d), DP_ETRANSFER, &d);
    CHECK_CONTAINS(d.msg, "unit 1");
    for (uint32_t i = 0; i < 8; i++) /* even rows: unit 0, checked (seed 1) */
        CHECK_EQ(st[i], i % 2 == 0 ? 0 : DP_ETRANSFER);
    CHECK_ERR_D(put_rows(c, 0, 8, LEN, 2, rs, &d), DP_ETRANSFER, &d);
    for (uint32_t i = 0; i < 8; i++)
        CHECK_EQ(rs[i], i % 2 == 0 ? 0 : DP_ETRANSFER);

    /* Back on its port (empty): bound by the next put, no restart reported. */
    unit_start(&u[1], u[1].port, "64M", 1, 2);
    CHECK_OK_D(put_rows(c, 0, 8, LEN, 3, rs, &d), &d);
    CHECK_OK_D(get_rows(c, 0, 8, LEN, 3, st, &d), &d);
    CHECK_OK(dp_client_unit_path(c, 1, path, sizeof path));
    CHECK(strstr(path, "not connected") == NULL);
    CHECK_OK(dp_client_counters_get(c, &cn));
    CHECK_EQ_U64(cn.restarts_seen, 0);
    CHECK_EQ_U64(cn.rebinds, 0);
    dp_client_close(c);

    /*
     * Stopped: no answer within the 1 s connect budget; an operation asks it
     * for a third of its 6 s, so unit 0's part still has time; bound once it
     * answers.
     */
    kill(u[1].pid, SIGSTOP);
    c = open_units_t(u, 2, 6, 1);
    CHECK_ERR_D(get_rows(c, 0, 8, LEN, 3, st, &d), DP_ETIMEDOUT, &d);
    for (uint32_t i = 0; i < 8; i++)
        CHECK_EQ(st[i], i % 2 == 0 ? 0 : DP_ETIMEDOUT);
    kill(u[1].pid, SIGCONT);
    CHECK_OK_D(get_rows(c, 0, 8, LEN, 3, st, &d), &d);
    CHECK_OK_D(put_rows(c, 8, 8, LEN, 4, rs, &d), &d);
    CHECK_OK_D(get_rows(c, 8, 8, LEN, 4, st, &d), &d);
    CHECK_OK(dp_client_counters_get(c, &cn));
    CHECK_EQ_U64(cn.restarts_seen, 0);
    dp_client_close(c);

    /* No unit answers: not an outage to ride out but a wrong file or no cluster. */
    unit_kill(&u[0]);
    unit_kill(&u[1]);
    const char *addrs[2] = {u[0].addr, u[1].addr};
    dp_client_opts o;
    dp_client_opts_init(&o);
    o.connect_timeout_s = 2;
    c = NULL;
    dp_detail_clear(&d);
    CHECK_ERR_D(dp_client_open_units(addrs, 2, &o, &c, &d), DP_ETRANSFER, &d);
    CHECK(c == NULL);
    CHECK_CONTAINS(d.msg, "no unit answers");
}

/*
 * A unit that was down when the client opened has not said who it is: clear
 * and a checkpoint save ask it first. Here another cluster's unit 1 of 3
 * took its port: c's clear of row 1 fails as not this cluster's unit and
 * drops nothing there, the save refuses, a put is refused as well; that
 * cluster's rows are intact.
 */
DP_TEST(unit_down_at_open_is_checked_before_clear_and_save)
{
    unit_proc a[2];
    unit_start(&a[0], 0, "64M", 0, 2);
    unit_start(&a[1], 0, "64M", 1, 2);
    unit_kill(&a[1]);
    dp_client *c = open_units(a, 2, 10);
    unit_proc b[3];
    unit_start(&b[0], 0, "64M", 0, 3);
    unit_start(&b[1], a[1].port, "64M", 1, 3);
    unit_start(&b[2], 0, "64M", 2, 3);
    dp_client *c2 = open_units(b, 3, 10);
    dp_detail d;
    int rs[8], st[8];
    CHECK_OK_D(put_rows(c2, 0, 6, 4096, 1, rs, &d), &d);

    uint64_t g[1] = {1}, dropped = 7;
    dp_detail_clear(&d);
    CHECK_ERR_D(dp_client_clear(c, g, 1, &dropped, &d), DP_EPROTO, &d);
    CHECK_CONTAINS(d.msg, "unit 1");
    CHECK_EQ_U64(dropped, 0);
    char dir[] = "/tmp/dp-unbound-ckpt-XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    dp_ckpt_summary sum;
    CHECK_ERR_D(dp_ckpt_save(c, dir, NULL, &sum, &d), DP_EPROTO, &d);
    CHECK_CONTAINS(d.msg, "down when the client opened");
    CHECK_ERR_D(put_rows(c, 0, 2, 4096, 2, rs, &d), DP_EPROTO, &d);
    CHECK_EQ(rs[0], 0); /* row 0: unit 0, c's own cluster */
    CHECK_EQ(rs[1], DP_EPROTO);
    CHECK_OK_D(get_rows(c2, 0, 6, 4096, 1, st, &d), &d); /* all there, content checked */
    /* Re-homing c2's checkpoint (3 units) through c refuses before putting anything. */
    CHECK_OK_D(dp_ckpt_save(c2, dir, NULL, &sum, &d), &d);
    CHECK_ERR_D(dp_ckpt_rehome(c, dir, NULL, &sum, &d), DP_EPROTO, &d);
    CHECK_CONTAINS(d.msg, "re-home");
    char k0[2][16] = {"2@v",
                      "4@v"}; /* unit 0's rows of the checkpoint (row 0: c's put) */
    dp_get_item it[2];
    for (int i = 0; i < 2; i++)
        it[i] = (dp_get_item){.key = k0[i], .cap = 0};
    CHECK_ERR_D(dp_client_get(c, it, 2, &d), DP_ENOTFOUND, &d); /* nothing put */
    CHECK_CONTAINS(d.msg, "2 missing");
    dp_client_close(c);
    dp_client_close(c2);
    unit_kill(&a[0]);
    for (int i = 0; i < 3; i++)
        unit_kill(&b[i]);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK_EQ(system(cmd), 0);
}

/*
 * A restart that stats saw is reported by the next put or get, even when the
 * next put is refused as too big for another unit (the refusal comes before
 * any unit is asked anything).
 */
DP_TEST(too_big_put_leaves_a_restart_to_report)
{
    unit_proc u[2];
    unit_start(&u[0], 0, "8M", 0, 2);
    unit_start(&u[1], 0, "64M", 1, 2);
    dp_client *c = open_units(u, 2, 10);
    dp_detail d;
    int rs[8], st[8];
    CHECK_OK_D(put_rows(c, 0, 2, 4096, 1, rs, &d), &d);
    unit_restart(&u[1]);
    CHECK(unit_stat(c, 1, "blobs") >= 0); /* stats meets the new process */
    CHECK_ERR_D(put_rows(c, 0, 2, 16 << 20, 2, rs, &d), DP_ETOOBIG, &d);
    CHECK_ERR_D(get_rows(c, 1, 1, 4096, 1, st, &d), DP_ERESTARTED, &d);
    CHECK_ERR_D(get_rows(c, 1, 1, 4096, 1, st, &d), DP_ENOTFOUND, &d);
    CHECK_OK_D(get_rows(c, 0, 1, 4096, 1, st, &d), &d);
    dp_client_close(c);
    unit_kill(&u[0]);
    unit_kill(&u[1]);
}

/* ---- clients killed mid-put ---- */

static int hook_fd = -1;
static const char *hook_stage;

/* In the child: tell the parent the put reached the stage, then wait to die. */
static void
stop_at_stage(const char *stage)
{
    if (hook_stage == NULL || strcmp(stage, hook_stage) != 0)
        return;
    dp_test_write_str(hook_fd, "A");
    for (;;)
        pause();
}

/* A child client that puts 8 MiB over rows 0..7 and is killed at stage. */
static pid_t
doomed_client(const char *addr, const char *stage)
{
    int fds[2];
    CHECK(pipe2(fds, O_CLOEXEC) == 0);
    /* A fresh process: exec ourselves into the child role. */
    char fd[16];
    snprintf(fd, sizeof fd, "%d", fds[1]);
    const char *env[] = {
        "DP_TEST_ROLE", "doomed", "DP_TEST_ADDR", addr, "DP_TEST_FD", fd, "DP_TEST_STAGE",
        stage,          NULL};
    pid_t pid = dp_test_spawn_self(env, fds[1]);
    close(fds[1]);
    char b = 0;
    CHECKF(dp_test_read_all(fds[0], &b, 1) == 0 && b == 'A',
           "the doomed client did not reach %s", stage);
    close(fds[0]);
    return pid;
}

static int
doomed_main(void)
{
    hook_fd = atoi(getenv("DP_TEST_FD"));
    hook_stage = getenv("DP_TEST_STAGE");
    const char *addr = getenv("DP_TEST_ADDR");
    dp_client *c = NULL;
    if (dp_client_open_units(&addr, 1, NULL, &c, NULL) != 0)
        return 2;
    dp__client_test_hook = stop_at_stage;
    enum { LEN = 1 << 20 };
    uint8_t *buf = NULL;
    if (dp_client_alloc(c, 8 * LEN, (void **)&buf, NULL) != 0)
        return 2;
    uint64_t g[8];
    dp_value v[8];
    for (int i = 0; i < 8; i++) {
        g[i] = (uint64_t)i;
        memset(buf + (size_t)i * LEN, 0xdd, LEN);
        v[i] = (dp_value){buf + (size_t)i * LEN, LEN, DP_KIND_BYTES, NULL, NULL, 0};
    }
    const char *f[] = {"v"};
    dp_client_put(c, g, 8, f, 1, v, NULL, NULL);
    return 3; /* never reached: killed at the stage */
}

/*
 * Ten clients SIGKILLed mid-put, one after the other (before their WRITE, or
 * after it and before their commit): once the grace period has passed the
 * unit has its free space back, and no row's bytes changed.
 */
DP_TEST(clients_killed_mid_put_cost_nothing)
{
    unit_proc u;
    unit_start(&u, 0, "128M", 0, 1);
    dp_client *c = open_units(&u, 1, 30);
    dp_detail d;
    int st[8], rs[8];
    enum { LEN = 1 << 20 };
    CHECK_OK_D(put_rows(c, 0, 8, LEN, 7, rs, &d), &d);
    double base = unit_stat(c, 0, "allocated_bytes");
    for (int k = 0; k < 10; k++) {
        pid_t pid = doomed_client(u.addr, k % 2 == 0 ? "put:allocated" : "put:written");
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
    }
    /*
     * Each open allocation holds its region until the unit reclaims it (its
     * writer is dead). Reclaims may already have begun (a slow machine or a
     * sanitizer makes each doomed client slow to start), so the regions not
     * yet reclaimed are counted: allocated_bytes read first, so a reclaim in
     * between can only lower the bound.
     */
    double held = unit_stat(c, 0, "allocated_bytes");
    double gone = unit_stat(c, 0, "allocs_reclaimed");
    CHECKF(held >= base + (10 - gone) * 8.0 * LEN,
           "the ten open allocations should hold their regions until reclaimed: "
           "%.0f bytes allocated, %.0f before, %.0f reclaimed",
           held, base, gone);
    double t0 = dp_test_now(), alloc = 0;
    while (dp_test_now() - t0 < 30) {
        alloc = unit_stat(c, 0, "allocated_bytes");
        if (alloc == base)
            break;
        dp__sleep_s(0.25);
    }
    CHECKF(alloc == base, "allocated %.0f bytes, %.0f before the kills", alloc, base);
    printf("  free space back after %.1f s\n", dp_test_now() - t0);
    CHECK_EQ(unit_stat(c, 0, "allocs_reclaimed"), 10);
    CHECK_EQ(unit_stat(c, 0, "retired_bytes"), 0);
    CHECK_OK_D(get_rows(c, 0, 8, LEN, 7, st, &d), &d); /* unchanged, byte for byte */
    /* And the space is usable: a put of most of the slab lands. */
    uint8_t *big = NULL;
    CHECK_OK(dp_client_alloc(c, 100 << 20, (void **)&big, NULL));
    memset(big, 1, 100 << 20);
    uint64_t g = 50;
    const char *f[] = {"big"};
    dp_value v = {big, 100 << 20, DP_KIND_BYTES, NULL, NULL, 0};
    CHECK_OK_D(dp_client_put(c, &g, 1, f, 1, &v, NULL, &d), &d);
    dp_client_free(c, big);
    dp_client_close(c);
    unit_kill(&u);
}

/* ---- retired regions: reclaimed when provably safe, else kept ---- */

/*
 * A child that allocates on addr as writer (its own pid and host key, the
 * lane given), then aborts with in_flight (the unit retires the region) and
 * exits.
 */
static int
retire_main(void)
{
    const char *addr = getenv("DP_TEST_ADDR");
    const char *lane = getenv("DP_TEST_LANE");
    const char *host = getenv("DP_TEST_HOST");
    dp__ctl_client *cc = NULL;
    if (dp__ctl_client_create(&cc, NULL) != 0)
        return 2;
    char wid[40];
    snprintf(wid, sizeof wid, "w-%ld", (long)getpid());
    dp__wire_request q;
    memset(&q, 0, sizeof q);
    q.op = DP_WIRE_OP_ALLOC;
    q.rid = dp__wire_s("a1");
    q.a.alloc = (dp__wire_alloc_args){dp__wire_s(wid),
                                      4 << 20,
                                      0,
                                      false,
                                      dp__wire_s(wid),
                                      (uint64_t)getpid(),
                                      dp__wire_s(host[0] ? host : dp__host_key()),
                                      dp__wire_s(lane)};
    dp__buf b = {0}, rep = {0};
    if (dp__wire_request_encode(&q, NULL, &b, NULL) != 0 ||
        dp__ctl_call(cc, addr, &b, "a1", 10, &rep, NULL) != 0)
        return 2;
    memset(&q, 0, sizeof q);
    q.op = DP_WIRE_OP_ABORT;
    q.rid = dp__wire_s("a2");
    q.a.abort.blob_id = dp__wire_s(wid);
    q.a.abort.in_flight = true;
    dp__buf_reset(&b);
    if (dp__wire_request_encode(&q, NULL, &b, NULL) != 0 ||
        dp__ctl_notify(cc, addr, b.data, b.len, NULL) != 0)
        return 2;
    /* A ping on the same socket: the abort was handled before its answer. */
    memset(&q, 0, sizeof q);
    q.op = DP_WIRE_OP_PING;
    q.rid = dp__wire_s("a3");
    dp__buf_reset(&b);
    dp__buf_reset(&rep);
    if (dp__wire_request_encode(&q, NULL, &b, NULL) != 0 ||
        dp__ctl_call(cc, addr, &b, "a3", 10, &rep, NULL) != 0)
        return 2;
    dp__buf_fini(&b);
    dp__buf_fini(&rep);
    dp__ctl_client_destroy(cc);
    return 0;
}

static void
run_retirer(const char *addr, const char *lane, const char *host)
{
    const char *env[] = {"DP_TEST_ROLE", "retire",       "DP_TEST_ADDR",
                         addr,           "DP_TEST_LANE", lane,
                         "DP_TEST_HOST", host,           NULL};
    CHECK_EQ(dp_test_wait_status(dp_test_spawn_self(env, -1)), 0);
}

DP_TEST(retired_regions_come_back_only_when_provably_safe)
{
    unit_proc u;
    unit_start(&u, 0, "64M", 0, 1);
    dp_client *c = open_units(&u, 1, 30);
    /* A same-host shared-memory writer that exits: its region comes back. */
    run_retirer(u.addr, "shm", "");
    CHECK_EQ(unit_stat(c, 0, "retired_bytes"), 4 << 20);
    double t0 = dp_test_now();
    while (unit_stat(c, 0, "retired_bytes") > 0 && dp_test_now() - t0 < 30)
        dp__sleep_s(0.25);
    CHECK_EQ(unit_stat(c, 0, "retired_bytes"), 0);
    CHECK_EQ(unit_stat(c, 0, "reclaimed_bytes"), 4 << 20);
    CHECK_EQ(unit_stat(c, 0, "allocated_bytes"), 0);
    /* Over TCP, or from another host, nothing can prove the bytes will not land. */
    run_retirer(u.addr, "tcp", "");
    run_retirer(u.addr, "shm", "another-host/1");
    dp__sleep_s(7); /* past the grace period */
    CHECK_EQ(unit_stat(c, 0, "retired_bytes"), 8 << 20);
    CHECK_EQ(unit_stat(c, 0, "retired_kept_bytes"), 8 << 20);
    CHECK_EQ(unit_stat(c, 0, "reclaimed_bytes"), 4 << 20);
    dp_client_close(c);
    unit_kill(&u);
}

/* ---- bad peers ---- */

typedef struct fake_unit {
    uint8_t *md;
    size_t md_len;
} fake_unit;

static void
fake_handler(void *ctx, const uint8_t *msg, size_t len, dp__buf *reply)
{
    fake_unit *f = ctx;
    dp__wire_request q;
    if (dp__wire_request_decode(msg, len, NULL, &q, NULL) != 0 ||
        q.op != DP_WIRE_OP_INFO) {
        dp__wire_request_fini(&q);
        return;
    }
    dp__wire_reply r;
    memset(&r, 0, sizeof r);
    r.op = DP_WIRE_OP_INFO;
    r.rid = q.rid;
    r.ok = true;
    r.incarnation = 77;
    r.r.info = (dp__wire_info){.unit_id = 0,
                               .n_units = 1,
                               .zmq = dp__wire_s("tcp://fake:1"),
                               .agent = dp__wire_s("fake"),
                               .metadata = {f->md, (uint32_t)f->md_len},
                               .slab_bytes = 1 << 20,
                               .slab_addr = 4096,
                               .incarnation = 77,
                               .proto = DP_WIRE_PROTO};
    dp__wire_reply_encode(&r, NULL, reply, NULL);
    dp__wire_request_fini(&q);
}

/*
 * A unit whose endpoint metadata comes from another UCX version (worker
 * address and keys UCX could not read: it used to abort inside UCX) is
 * refused with a clear DP_EPROTO; so is one speaking an older protocol.
 */
DP_TEST(peer_of_another_ucx_version_is_refused)
{
    dp__endpoint *ep = NULL;
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_OK_D(dp__endpoint_create("fake", NULL, &ep, &d), &d);
    fake_unit f = {0};
    CHECK_OK_D(dp__endpoint_metadata(ep, &f.md, &f.md_len, &d), &d);
    /* The server thread reads f: change it only while no server runs. */
    for (int variant = 0; variant < 2; variant++) {
        if (variant == 0)
            f.md[26] ^= 0x7f; /* UCX minor version */
        else
            f.md[4] = 1; /* metadata of an older dataplane */
        dp__ctl_server *s = NULL;
        CHECK_OK_D(dp__ctl_server_open(NULL, fake_handler, NULL, &f, &s, &d), &d);
        char addr[128];
        snprintf(addr, sizeof addr, "%s", dp__ctl_server_address(s));
        const char *ap = addr;
        dp_client *c = NULL;
        CHECK_ERR_D(dp_client_open_units(&ap, 1, NULL, &c, &d), DP_EPROTO, &d);
        dp__ctl_server_close(s);
        if (variant == 0) {
            CHECK_CONTAINS(d.msg, "UCX");
            CHECK_CONTAINS(d.msg, "same UCX version");
            f.md[26] ^= 0x7f;
        } else {
            CHECK_CONTAINS(d.msg, "older");
        }
    }
    free(f.md);
    dp__endpoint_destroy(ep);
}

/* The child roles run instead of the tests (the test binary re-executed). */
__attribute__((constructor)) static void
role_main(void)
{
    const char *role = getenv("DP_TEST_ROLE");
    if (role == NULL)
        return;
    _exit(strcmp(role, "doomed") == 0 ? doomed_main() : retire_main());
}
