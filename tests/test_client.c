/*
 * End-to-end tests of the client library (dataplane/client.h) against storage
 * units running as separate processes: this program re-executed in "unit"
 * mode (a dp__unit with its endpoint, ticker and ZMQ control server), with no
 * mocks. Clients are this process, its threads, or more re-executed copies of
 * it. Covered: put/get/overwrite/clear with content checks, jagged fields and
 * skipped cells, values from 0 bytes to 64 MiB, registered (zero-copy) and
 * staged memory, missing keys, small destinations, get with descriptions and
 * with library-allocated memory, stats, cluster files, busy units, several
 * client processes at once, threads sharing a client, a unit killed mid-run,
 * and clients killed mid-put (deterministically between WRITE and commit
 * through the test hook, and at random times).
 */
#include "dp_test.h"
#include "dp_tsan_ucx.h"
#include "dp_proc.h"

#include <pthread.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "blob/crc32c.h"
#include "client/checkpoint.h"
#include "client/client_int.h"
#include "cluster/cluster.h"
#include "common/common.h"
#include "ctl/ctl.h"
#include "dataplane/client.h"
#include "unit/server.h"
#include "unit/unit.h"
#include "xfer/endpoint.h"

/* ---- deterministic contents ---- */

static uint64_t
mix(uint64_t a, uint64_t b, uint64_t c)
{
    uint64_t s = a * 0x9e3779b97f4a7c15ull ^ (b + 0x632be59bd9b4e019ull) * 31 ^ c << 17;
    return dp_test_rand(&s);
}

/* Value of (gidx, field f, version ver), len bytes; the first 8 carry ver. */
static void
fill(uint8_t *p, size_t len, uint64_t gidx, uint32_t f, uint64_t ver)
{
    /* Values shorter than 8 bytes cannot carry their version: same for all. */
    uint64_t s = mix(gidx, f, len >= 8 ? ver : 0);
    size_t i = 0;
    if (len >= 8) {
        memcpy(p, &ver, 8);
        i = 8;
    }
    for (; i + 8 <= len; i += 8) {
        uint64_t x = dp_test_rand(&s);
        memcpy(p + i, &x, 8);
    }
    uint64_t x = dp_test_rand(&s);
    for (; i < len; i++)
        p[i] = (uint8_t)(x >> (8 * (i & 7)));
}

/* True if p holds exactly the value of (gidx, f, *ver) (ver read from p if len >= 8). */
static bool
check_value(const uint8_t *p, size_t len, uint64_t gidx, uint32_t f, uint64_t *ver)
{
    uint64_t v = *ver;
    if (len >= 8)
        memcpy(&v, p, 8);
    uint8_t *want = malloc(len > 0 ? len : 1);
    fill(want, len, gidx, f, v);
    bool ok = dp__crc32c(want, len) == dp__crc32c(p, len) && memcmp(want, p, len) == 0;
    free(want);
    *ver = v;
    return ok;
}

/* ---- unit peers ---- */

static int
unit_main(int fd)
{
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    dp_detail d;
    dp_detail_clear(&d);
    uint32_t id = (uint32_t)atoi(getenv("DP_TC_UNIT_ID"));
    char name[64];
    snprintf(name, sizeof name, "tc-unit-%u-%ld", id, (long)getpid());
    dp__unit_opts o;
    dp__unit_opts_init(&o);
    o.unit_id = id;
    o.n_units = (uint32_t)atoi(getenv("DP_TC_UNITS"));
    o.slab_bytes = strtoull(getenv("DP_TC_SLAB"), NULL, 10);
    o.read_pin_s = atof(getenv("DP_TC_PIN"));
    o.alloc_lease_s = atof(getenv("DP_TC_LEASE"));
    o.quarantine_s = 0.5;
    o.numa = DP_UNIT_NUMA_OFF;
    const char *rep = getenv("DP_TC_REPLICAS");
    o.replicas = rep != NULL && *rep != '\0' ? (uint32_t)atoi(rep) : 1;
    const char *ssd = getenv("DP_TC_SSD");
    if (ssd != NULL && *ssd != '\0') {
        o.ssd_dir = ssd;
        o.staging_bytes = strtoull(getenv("DP_TC_STAGING"), NULL, 10);
        o.pickup_s = 5;
    }
    dp__unit_server *srv = NULL;
    if (dp__unit_server_open(&o, name, "127.0.0.1", 0, 0.1, &srv, &d) != 0)
        goto fail;
    char line[300];
    snprintf(line, sizeof line, "%s\n", dp__unit_server_address(srv));
    dp_test_write_str(fd, line);
    int sig;
    sigwait(&sigs, &sig);
    dp__unit_server_close(srv);
    return 0;
fail:
    fprintf(stderr, "unit peer: %s\n", dp_detail_msg(&d));
    return 1;
}

typedef struct cluster {
    uint32_t n;
    pid_t pid[8];
    char addr[8][128];
    const char *addrs[8];
} cluster;

/* This program re-executed in mode with env; *rfd reads what it reports. */
static pid_t
spawn(const char *mode, const char *const *env, int *rfd)
{
    int fds[2];
    CHECK(pipe2(fds, O_CLOEXEC) == 0);
    char fdbuf[16];
    snprintf(fdbuf, sizeof fdbuf, "%d", fds[1]);
    const char *all[32] = {"DP_TC_MODE", mode, "DP_TC_FD", fdbuf};
    size_t k = 4;
    for (size_t i = 0; env != NULL && env[i] != NULL && k + 2 < DP_ARRAY_LEN(all); i++)
        all[k++] = env[i];
    pid_t pid = dp_test_spawn_self(all, fds[1]);
    close(fds[1]);
    *rfd = fds[0];
    return pid;
}

static void
read_line(int fd, char *line, size_t cap, const char *what)
{
    CHECKF(dp_test_read_line(fd, line, cap, 60) > 0, "%s reported nothing", what);
}

/* SSD tier of the units cluster_start starts ("" / 0: none), and their
 * copies of each row ("": 1). */
static char tc_ssd_dir[64];
static uint64_t tc_staging;
static char tc_replicas[8];

static void
cluster_start(cluster *cl, uint32_t n, uint64_t slab, double lease, double pin)
{
    memset(cl, 0, sizeof *cl);
    cl->n = n;
    char sn[32], slabs[32], ls[32], ps[32], st[32];
    snprintf(st, sizeof st, "%" PRIu64, tc_staging);
    snprintf(sn, sizeof sn, "%u", n);
    snprintf(slabs, sizeof slabs, "%" PRIu64, slab);
    snprintf(ls, sizeof ls, "%g", lease);
    snprintf(ps, sizeof ps, "%g", pin);
    for (uint32_t u = 0; u < n; u++) {
        char id[16];
        snprintf(id, sizeof id, "%u", u);
        const char *env[] = {
            "DP_TC_UNIT_ID", id, "DP_TC_UNITS",    sn,          "DP_TC_SLAB", slabs,
            "DP_TC_LEASE",   ls, "DP_TC_PIN",      ps,          "DP_TC_SSD",  tc_ssd_dir,
            "DP_TC_STAGING", st, "DP_TC_REPLICAS", tc_replicas, NULL};
        int fd;
        cl->pid[u] = spawn("unit", env, &fd);
        read_line(fd, cl->addr[u], sizeof cl->addr[u], "unit");
        close(fd);
        cl->addrs[u] = cl->addr[u];
    }
}

/* One unit with the SSD tier (files in a fresh directory, its name in dir[64]:
 * rmdir it after cluster_stop), RAM slab and IO area of the sizes given. */
static void
ssd_cluster_start(cluster *cl, uint64_t slab, uint64_t staging, char dir[64])
{
    snprintf(tc_ssd_dir, sizeof tc_ssd_dir, "/tmp/dp_tc_ssd_XXXXXX");
    CHECK(mkdtemp(tc_ssd_dir) != NULL);
    snprintf(dir, 64, "%s", tc_ssd_dir);
    tc_staging = staging;
    cluster_start(cl, 1, slab, 60, 10);
    tc_ssd_dir[0] = '\0';
    tc_staging = 0;
}

static void
cluster_stop(cluster *cl)
{
    for (uint32_t u = 0; u < cl->n; u++) {
        if (cl->pid[u] <= 0)
            continue;
        kill(cl->pid[u], SIGTERM);
        int st = 0;
        waitpid(cl->pid[u], &st, 0);
        cl->pid[u] = 0;
    }
}

static dp_client *
connect_opts(const cluster *cl, double timeout)
{
    dp_client_opts o;
    dp_client_opts_init(&o);
    o.timeout_s = timeout;
    o.connect_timeout_s = 20;
    dp_client *c = NULL;
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_OK_D(dp_client_open_units(cl->addrs, cl->n, &o, &c, &d), &d);
    return c;
}

static dp_client *
connect_cl(const cluster *cl)
{
    return connect_opts(cl, 20);
}

static double
stat_of(dp_client *c, uint32_t unit, const char *name)
{
    dp_client_stats *s = NULL;
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_OK_D(dp_client_stats_get(c, &s, &d), &d);
    double v = -1;
    CHECKF(dp_client_stats_find(s, unit, name, &v), "stat %s", name);
    dp_client_stats_destroy(s);
    return v;
}

/* ---- a batch of rows: values in malloc'd (or registered) memory ---- */

typedef struct batch {
    size_t n_rows, n_fields;
    uint64_t *gidxs;
    const char **fields;
    dp_value *vals;
    uint8_t **bufs;  /* one per cell */
    uint64_t *shape; /* one dim per cell */
    dp_client *reg;  /* non-NULL: bufs from dp_client_alloc */
} batch;

static const char *field_names[] = {"input_ids", "logprobs", "reward", "obs/image"};

/* sizes(r, f) decides each cell's length; ver the contents' version. */
static void
batch_make(batch *b, dp_client *reg, const uint64_t *gidxs, size_t n_rows,
           size_t n_fields, uint64_t (*size)(uint64_t, uint32_t), uint64_t ver)
{
    memset(b, 0, sizeof *b);
    b->n_rows = n_rows;
    b->n_fields = n_fields;
    b->reg = reg;
    b->gidxs = malloc(n_rows * sizeof *b->gidxs);
    memcpy(b->gidxs, gidxs, n_rows * sizeof *gidxs);
    b->fields = field_names;
    size_t nc = n_rows * n_fields;
    b->vals = calloc(nc, sizeof *b->vals);
    b->bufs = calloc(nc, sizeof *b->bufs);
    b->shape = calloc(nc, sizeof *b->shape);
    for (size_t r = 0; r < n_rows; r++)
        for (size_t f = 0; f < n_fields; f++) {
            size_t i = r * n_fields + f;
            uint64_t len = size(gidxs[r], (uint32_t)f);
            if (reg != NULL) {
                void *p = NULL;
                CHECK_OK(dp_client_alloc(reg, len > 0 ? len : 1, &p, NULL));
                b->bufs[i] = p;
            } else {
                b->bufs[i] = malloc(len > 0 ? len : 1);
            }
            fill(b->bufs[i], len, gidxs[r], (uint32_t)f, ver);
            dp_value *v = &b->vals[i];
            v->data = b->bufs[i];
            v->nbytes = len;
            if (f == 1 && len % 4 == 0) {
                v->kind = DP_KIND_TENSOR;
                v->dtype = "float32";
                b->shape[i] = len / 4;
                v->shape = &b->shape[i];
                v->ndim = 1;
            } else {
                v->kind = f == 2 ? DP_KIND_OBJECT : DP_KIND_BYTES;
            }
        }
}

static void
batch_free(batch *b)
{
    for (size_t i = 0; i < b->n_rows * b->n_fields; i++) {
        if (b->reg != NULL)
            dp_client_free(b->reg, b->bufs[i]);
        else
            free(b->bufs[i]);
    }
    free(b->gidxs);
    free(b->vals);
    free(b->bufs);
    free(b->shape);
}

static int
batch_put(dp_client *c, batch *b, int *row_status, dp_detail *d)
{
    return dp_client_put(c, b->gidxs, b->n_rows, b->fields, b->n_fields, b->vals,
                         row_status, d);
}

/*
 * Get every cell of b into fresh malloc'd buffers and compare: row r must
 * hold version ver[r], or fail with want[r] (want NULL: all succeed, and the
 * get returns DP_OK). locs (NULL: none) are handed to the get as location
 * hints; misses and by_blob (each NULL allowed) get the client's loc_misses
 * of this get and the units' resolves by blob.
 */
static void
batch_check(dp_client *c, const batch *b, const dp_loc *locs, const uint64_t *ver,
            const int *want, uint64_t *misses, double *by_blob)
{
    size_t nc = b->n_rows * b->n_fields;
    dp_get_item *it = calloc(nc, sizeof *it);
    char(*keys)[300] = calloc(nc, sizeof *keys);
    dp_value_desc *desc = calloc(nc, sizeof *desc);
    for (size_t i = 0; i < nc; i++) {
        snprintf(keys[i], sizeof keys[i], "%" PRIu64 "@%s", b->gidxs[i / b->n_fields],
                 b->fields[i % b->n_fields]);
        it[i].key = keys[i];
        it[i].cap = b->vals[i].nbytes;
        it[i].dst = malloc(it[i].cap > 0 ? it[i].cap : 1);
        it[i].desc = &desc[i];
        it[i].loc = locs != NULL ? &locs[i] : NULL;
    }
    dp_client_counters k0, k1;
    double r0 = 0, r1 = 0;
    CHECK_OK(dp_client_counters_get(c, &k0));
    for (uint32_t u = 0; by_blob != NULL && u < dp_client_n_units(c); u++)
        r0 += stat_of(c, u, "resolves_by_blob");
    dp_detail d;
    dp_detail_clear(&d);
    int rc = dp_client_get(c, it, nc, &d);
    if (want == NULL)
        CHECK_OK_D(rc, &d);
    CHECK_OK(dp_client_counters_get(c, &k1));
    if (misses != NULL)
        *misses = k1.loc_misses - k0.loc_misses;
    for (uint32_t u = 0; by_blob != NULL && u < dp_client_n_units(c); u++)
        r1 += stat_of(c, u, "resolves_by_blob");
    if (by_blob != NULL)
        *by_blob = r1 - r0;
    for (size_t i = 0; i < nc; i++) {
        size_t r = i / b->n_fields;
        int w = want != NULL ? want[r] : 0;
        CHECKF(it[i].status == w, "key %s: %s, want %s", keys[i],
               dp_errname(it[i].status), dp_errname(w));
        if (w != 0) {
            free(it[i].dst);
            continue;
        }
        CHECK_EQ_U64(it[i].nbytes, b->vals[i].nbytes);
        uint64_t v = ver[r];
        CHECKF(check_value(it[i].dst, it[i].nbytes, b->gidxs[r],
                           (uint32_t)(i % b->n_fields), &v) &&
                   v == ver[r],
               "key %s: content differs (version %" PRIu64 ", want %" PRIu64 ")", keys[i],
               v, ver[r]);
        CHECK_EQ(desc[i].kind, b->vals[i].kind);
        CHECK_EQ(desc[i].ndim, b->vals[i].ndim);
        if (b->vals[i].kind == DP_KIND_TENSOR) {
            CHECK_STR(desc[i].dtype, "float32");
            CHECK_EQ_U64(desc[i].shape[0], b->shape[i]);
        }
        free(it[i].dst);
    }
    free(it);
    free(keys);
    free(desc);
}

/* batch_check of every row at version ver, without hints. */
static void
batch_verify(dp_client *c, const batch *b, uint64_t ver)
{
    uint64_t *vers = malloc(b->n_rows * sizeof *vers);
    for (size_t r = 0; r < b->n_rows; r++)
        vers[r] = ver;
    batch_check(c, b, NULL, vers, NULL, NULL, NULL);
    free(vers);
}

static uint64_t
size_jagged(uint64_t gidx, uint32_t f)
{
    static const uint64_t s[] = {0, 1, 7, 63, 64, 65, 1000, 4096, 4100, 70000, 300000};
    return s[mix(gidx, f, 99) % DP_ARRAY_LEN(s)] + (f == 1 ? 0 : gidx % 3);
}

static uint64_t
size_1m(uint64_t gidx, uint32_t f)
{
    (void)gidx;
    (void)f;
    return 1 << 20;
}

static uint64_t
size_4k(uint64_t gidx, uint32_t f)
{
    (void)gidx;
    (void)f;
    return 4096;
}

/* ---- client peers ---- */

static const char *const *
env_addrs(uint32_t *n)
{
    static char buf[1024];
    static const char *v[8];
    snprintf(buf, sizeof buf, "%s", getenv("DP_TC_ADDRS"));
    *n = 0;
    for (char *s = strtok(buf, ","); s != NULL && *n < 8; s = strtok(NULL, ","))
        v[(*n)++] = s;
    return v;
}

static void
doom_hook(const char *stage)
{
    const char *when = getenv("DP_TC_DOOM");
    if (when != NULL && strcmp(stage, when) == 0)
        raise(SIGKILL);
}

/* "client": put and verify its own rows over several versions. */
static int
client_main(int fd, const char *mode)
{
    (void)fd;
    uint32_t n = 0;
    const char *const *addrs = env_addrs(&n);
    dp_detail d;
    dp_detail_clear(&d);
    dp_client *c = NULL;
    if (dp_client_open_units(addrs, n, NULL, &c, &d) != 0) {
        fprintf(stderr, "client peer: %s\n", dp_detail_msg(&d));
        return 1;
    }
    uint64_t base = strtoull(getenv("DP_TC_BASE"), NULL, 10);
    uint64_t g[16];
    for (int i = 0; i < 16; i++)
        g[i] = base + (uint64_t)i;
    if (strcmp(mode, "doomed") == 0) {
        dp__client_test_hook = doom_hook;
        batch b;
        batch_make(&b, NULL, g, 16, 2, size_jagged, 7);
        batch_put(c, &b, NULL, &d);
        return 2; /* the hook should have killed us */
    }
    int rounds = strcmp(mode, "loop") == 0 ? 1000000 : 8;
    for (int v = 1; v <= rounds; v++) {
        batch b;
        batch_make(&b, NULL, g, 16, 3, size_jagged, (uint64_t)v);
        if (batch_put(c, &b, NULL, &d) != 0) {
            fprintf(stderr, "client peer put: %s\n", dp_detail_msg(&d));
            return 1;
        }
        if (strcmp(mode, "loop") != 0)
            batch_verify(c, &b, (uint64_t)v);
        batch_free(&b);
    }
    dp_client_close(c);
    return 0;
}

__attribute__((constructor)) static void
peer_main(void)
{
    const char *mode = getenv("DP_TC_MODE");
    if (mode == NULL)
        return;
    int fd = atoi(getenv("DP_TC_FD"));
    int rc = strcmp(mode, "unit") == 0 ? unit_main(fd) : client_main(fd, mode);
    _exit(rc);
}

static pid_t
spawn_client(const cluster *cl, const char *mode, uint64_t base, const char *doom)
{
    char addrs[1024] = "";
    for (uint32_t u = 0; u < cl->n; u++) {
        strcat(addrs, cl->addr[u]);
        if (u + 1 < cl->n)
            strcat(addrs, ",");
    }
    char bs[32];
    snprintf(bs, sizeof bs, "%" PRIu64, base);
    const char *env[] = {
        "DP_TC_ADDRS", addrs, "DP_TC_BASE", bs, "DP_TC_DOOM", doom != NULL ? doom : "",
        NULL};
    int fd;
    pid_t pid = spawn(mode, env, &fd);
    close(fd);
    return pid;
}

/* ---- tests ---- */

DP_TEST(put_get_overwrite_clear)
{
    cluster cl;
    cluster_start(&cl, 2, 64 << 20, 60, 10);
    dp_client *c = connect_cl(&cl);
    CHECK_EQ(dp_client_n_units(c), 2);
    CHECK_STR(dp_client_unit_address(c, 1), cl.addr[1]);
    CHECK_EQ(dp_client_unit_of(c, 7), 1);
    uint64_t g[24];
    for (int i = 0; i < 24; i++)
        g[i] = (uint64_t)i * 5 + 1;
    batch b;
    batch_make(&b, NULL, g, 24, 4, size_jagged, 1);
    int st[24];
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_OK_D(batch_put(c, &b, st, &d), &d);
    for (int i = 0; i < 24; i++)
        CHECK_EQ(st[i], 0);
    batch_verify(c, &b, 1);
    double entries0 = stat_of(c, 0, "entries") + stat_of(c, 1, "entries");
    CHECK_EQ((long long)entries0, 24 * 4);

    /* Overwrite with new contents and sizes; readers see only the new version. */
    batch b2;
    batch_make(&b2, NULL, g, 24, 4, size_4k, 2);
    CHECK_OK_D(batch_put(c, &b2, st, &d), &d);
    batch_verify(c, &b2, 2);
    CHECK_EQ((long long)(stat_of(c, 0, "entries") + stat_of(c, 1, "entries")), 24 * 4);

    /* Clear half the rows; clearing again drops nothing. */
    uint64_t dropped = 0;
    CHECK_OK_D(dp_client_clear(c, g, 12, &dropped, &d), &d);
    CHECK_EQ_U64(dropped, 12 * 4);
    CHECK_OK_D(dp_client_clear(c, g, 12, &dropped, &d), &d);
    CHECK_EQ_U64(dropped, 0);
    dp_get_item it[2];
    memset(it, 0, sizeof it);
    uint8_t buf[4096];
    char k0[64], k1[64];
    snprintf(k0, sizeof k0, "%" PRIu64 "@input_ids", g[0]);
    snprintf(k1, sizeof k1, "%" PRIu64 "@input_ids", g[20]);
    it[0] = (dp_get_item){.key = k0, .dst = buf, .cap = sizeof buf};
    it[1] = (dp_get_item){.key = k1, .dst = buf, .cap = sizeof buf};
    CHECK_ERR_D(dp_client_get(c, it, 2, &d), DP_ENOTFOUND, &d);
    CHECK_EQ(it[0].status, DP_ENOTFOUND);
    CHECK_EQ(it[1].status, 0);
    CHECK_CONTAINS(dp_detail_msg(&d), k0);
    /* Published blobs whose rows were all overwritten or cleared were freed. */
    CHECK_EQ((long long)(stat_of(c, 0, "entries") + stat_of(c, 1, "entries")), 12 * 4);
    batch_free(&b);
    batch_free(&b2);
    dp_client_close(c);
    cluster_stop(&cl);
}

/*
 * Location hints: a fresh hint skips the lookup (one resolve by blob per
 * unit, no miss); after an overwrite of some rows, a clear of others, a hint
 * of another key, or one without the description asked for, every value is
 * still the current one (found by key); malformed hints are refused.
 */
DP_TEST(location_hints)
{
    cluster cl;
    cluster_start(&cl, 2, 64 << 20, 60, 10);
    dp_client *c = connect_cl(&cl);
    enum { R = 24, F = 4, NC = R * F };
    uint64_t g[R], ver[R];
    for (int i = 0; i < R; i++) {
        g[i] = (uint64_t)i * 3 + 2;
        ver[i] = 1;
    }
    batch b;
    batch_make(&b, NULL, g, R, F, size_jagged, 1);
    dp_loc *locs = calloc(NC, sizeof *locs);
    dp_detail d;
    dp_detail_clear(&d);
    int st[R];
    CHECK_OK_D(dp_client_put_locs(c, b.gidxs, R, b.fields, F, b.vals, st, locs, &d), &d);
    for (int i = 0; i < NC; i++) {
        CHECK(locs[i].blob[0] != '\0');
        CHECK_EQ(locs[i].unit, (uint32_t)(g[i / F] % 2));
        CHECK_EQ_U64(locs[i].nbytes, b.vals[i].nbytes);
        CHECK_EQ(locs[i].kind, (uint8_t)b.vals[i].kind);
    }
    uint64_t misses;
    double by_blob;
    batch_check(c, &b, locs, ver, NULL, &misses, &by_blob);
    CHECK_EQ_U64(misses, 0);
    CHECK_EQ(by_blob, 2); /* one resolve per unit, by blob id */

    /* The alloc form takes hints too. */
    const char *keys[2] = {"2@input_ids", "5@logprobs"};
    dp_values *vals = NULL;
    dp_loc two[2] = {locs[0], locs[F + 1]};
    CHECK_OK_D(dp_client_get_alloc_locs(c, keys, two, 2, &vals, &d), &d);
    const void *p;
    uint64_t n;
    const dp_value_desc *vd;
    CHECK_OK(dp_values_get(vals, 1, &p, &n, &vd));
    uint64_t v1 = 1;
    CHECK(n == b.vals[F + 1].nbytes && check_value(p, n, 5, 1, &v1) && v1 == 1);
    dp_values_destroy(vals);

    /* A hint of another key, and one without a description, are not used. */
    dp_loc *mixed = calloc(NC, sizeof *mixed);
    memcpy(mixed, locs, NC * sizeof *mixed);
    mixed[0] = locs[F]; /* row 1's value offered for row 0: must not come back */
    mixed[1].ndim = DP_LOC_NO_DESC;
    /* Changed hints: the offset of another value of the same blob, another
     * dtype, another shape; and another key's hint whose key_crc was made to
     * match (as two keys with one CRC32C would): the seal refuses them all. */
    mixed[2].off = locs[3].off;
    memcpy(mixed[3].dtype, "int32", 6);
    mixed[F].shape[0] ^= 1;
    mixed[F + 1] = locs[F + 2];
    mixed[F + 1].key_crc = locs[F + 1].key_crc;
    mixed[F + 2].seal = 0;
    batch_check(c, &b, mixed, ver, NULL, &misses, &by_blob);
    CHECK_EQ_U64(misses, 7);

    /* Malformed hints: refused before anything is sent. */
    dp_get_item it = {.key = "2@input_ids", .dst = mixed, .cap = 64};
    dp_loc bad = locs[0];
    bad.blob[3] = '/';
    it.loc = &bad;
    CHECK_ERR_D(dp_client_get(c, &it, 1, &d), DP_EINVAL, &d);
    CHECK_CONTAINS(dp_detail_msg(&d), "location hint is malformed");
    bad = locs[0];
    memset(bad.blob, 'a', sizeof bad.blob);
    CHECK_ERR_D(dp_client_get(c, &it, 1, &d), DP_EINVAL, &d);
    bad = locs[0];
    bad.ndim = 9;
    CHECK_ERR_D(dp_client_get(c, &it, 1, &d), DP_EINVAL, &d);

    /* Overwrite rows 0..5 (new blobs), clear rows 6..9: the old hints are stale. */
    batch b2;
    batch_make(&b2, NULL, g, 6, F, size_jagged, 2);
    CHECK_OK_D(batch_put(c, &b2, st, &d), &d);
    uint64_t dropped = 0;
    CHECK_OK_D(dp_client_clear(c, g + 6, 4, &dropped, &d), &d);
    int want[R] = {0};
    for (int i = 0; i < 6; i++)
        ver[i] = 2;
    for (int i = 6; i < 10; i++)
        want[i] = DP_ENOTFOUND;
    batch_check(c, &b, locs, ver, want, &misses, &by_blob);
    CHECK_EQ_U64(misses, NC); /* both old blobs lost entries: every key by key */
    CHECK_EQ(by_blob, 2);

    /* Fresh hints of the new values work again. */
    dp_loc *l2 = calloc(6 * F, sizeof *l2);
    CHECK_OK_D(dp_client_put_locs(c, b2.gidxs, 6, b2.fields, F, b2.vals, st, l2, &d), &d);
    batch_check(c, &b2, l2, ver, NULL, &misses, &by_blob);
    CHECK_EQ_U64(misses, 0);

    /* A value of 5 dims: its hint keeps no description but is sealed and
     * used by a get that asks for none (and not by one that asks). */
    float five[32];
    for (int i = 0; i < 32; i++)
        five[i] = (float)i * 0.5f;
    const uint64_t shp[5] = {2, 2, 2, 2, 2};
    dp_value fv = {.data = five,
                   .nbytes = sizeof five,
                   .kind = DP_KIND_TENSOR,
                   .dtype = "float32",
                   .shape = shp,
                   .ndim = 5};
    const char *ff[1] = {"five"};
    uint64_t g5 = 1001;
    dp_loc l5;
    CHECK_OK_D(dp_client_put_locs(c, &g5, 1, ff, 1, &fv, st, &l5, &d), &d);
    CHECK_EQ(l5.ndim, DP_LOC_NO_DESC);
    float back[32] = {0};
    dp_value_desc vd5;
    dp_get_item gi = {.key = "1001@five", .dst = back, .cap = sizeof back, .loc = &l5};
    dp_client_counters q0, q1;
    CHECK_OK(dp_client_counters_get(c, &q0));
    CHECK_OK_D(dp_client_get(c, &gi, 1, &d), &d);
    CHECK_OK(dp_client_counters_get(c, &q1));
    CHECK(memcmp(back, five, sizeof five) == 0);
    CHECK_EQ_U64(q1.loc_misses - q0.loc_misses, 0);
    gi.desc = &vd5;
    memset(back, 0, sizeof back);
    CHECK_OK_D(dp_client_get(c, &gi, 1, &d), &d);
    CHECK_OK(dp_client_counters_get(c, &q0));
    CHECK(memcmp(back, five, sizeof five) == 0 && vd5.ndim == 5);
    CHECK_EQ_U64(q0.loc_misses - q1.loc_misses, 1);
    free(l2);
    free(mixed);
    free(locs);
    batch_free(&b);
    batch_free(&b2);
    dp_client_close(c);
    cluster_stop(&cl);
}

static uint64_t
size_small(uint64_t gidx, uint32_t f)
{
    static const uint64_t s[] = {0, 1, 7, 64, 100, 1000, 2000};
    return s[mix(gidx, f, 5) % DP_ARRAY_LEN(s)]; /* 12 a unit: under 32 KiB */
}

/* Unit 0's rows (even) small, unit 1's (odd) 20000 bytes a cell. */
static uint64_t
size_split(uint64_t gidx, uint32_t f)
{
    return gidx % 2 == 0 ? 100 + f : 20000 + f;
}

static double
sum_stat(dp_client *c, const char *name)
{
    double v = 0;
    for (uint32_t u = 0; u < dp_client_n_units(c); u++)
        v += stat_of(c, u, name);
    return v;
}

/*
 * Inline values (docs/design.md, "Inline values"): a unit's blob of at most
 * inline_bytes goes inside its put request, and a get's values come inside
 * the resolve_keys replies while they fit: contents byte for byte, from
 * malloc'd and registered memory, mixed with units that go by WRITE and READ,
 * with hints, in the alloc form; no staging counted, no pin left; off with
 * DP_INLINE=off; bad settings refused at open.
 */
DP_TEST(inline_small_values)
{
    cluster cl;
    cluster_start(&cl, 2, 64 << 20, 60, 10);
    dp_client *c = connect_cl(&cl);
    dp_detail d;
    dp_detail_clear(&d);
    uint64_t g[6];
    for (int i = 0; i < 6; i++)
        g[i] = 10 + (uint64_t)i;

    /* Both units' blobs are small: one put request each, no alloc, no WRITE. */
    batch b;
    batch_make(&b, NULL, g, 6, 4, size_small, 1);
    uint64_t vbytes = 0;
    for (size_t i = 0; i < 24; i++)
        vbytes += b.vals[i].nbytes;
    dp_client_counters k0, k1;
    CHECK_OK(dp_client_counters_get(c, &k0));
    double pi0 = sum_stat(c, "puts_inline"), ib0 = sum_stat(c, "inline_bytes");
    dp_loc locs[24];
    CHECK_OK_D(dp_client_put_locs(c, b.gidxs, 6, b.fields, 4, b.vals, NULL, locs, &d),
               &d);
    CHECK_EQ((long long)(sum_stat(c, "puts_inline") - pi0), 2);
    batch_verify(c, &b, 1);
    CHECK_OK(dp_client_counters_get(c, &k1));
    CHECK_EQ_U64(k1.staged_put_bytes, k0.staged_put_bytes); /* copied into requests */
    CHECK_EQ_U64(k1.staged_get_bytes, k0.staged_get_bytes); /* copied from replies */
    CHECK_EQ((long long)(sum_stat(c, "inline_bytes") - ib0), (long long)vbytes);
    CHECK_EQ((long long)sum_stat(c, "pins"), 0);
    /* With their hints: a batch this small is asked by key, inline, all the same. */
    uint64_t vers[6] = {1, 1, 1, 1, 1, 1}, misses = 9;
    double by_blob = -1;
    batch_check(c, &b, locs, vers, NULL, &misses, &by_blob);
    CHECK_EQ_U64(misses, 0);
    CHECK(by_blob == 0);
    /* The alloc form. */
    const char *keys[] = {"10@input_ids", "13@reward", "15@obs/image"};
    const size_t cells[] = {0, 3 * 4 + 2, 5 * 4 + 3};
    dp_values *vals = NULL;
    CHECK_OK_D(dp_client_get_alloc(c, keys, 3, &vals, &d), &d);
    for (size_t i = 0; i < 3; i++) {
        const void *p = NULL;
        uint64_t n = 0;
        const dp_value_desc *desc = NULL;
        CHECK_EQ(dp_values_get(vals, i, &p, &n, &desc), 0);
        CHECK_EQ_U64(n, b.vals[cells[i]].nbytes);
        uint64_t v = 1;
        CHECK(check_value(p, n, b.gidxs[cells[i] / 4], (uint32_t)(cells[i] % 4), &v) &&
              v == 1);
    }
    dp_values_destroy(vals);
    batch_free(&b);

    /* From registered memory, overwriting: the new values, inline again. */
    batch_make(&b, c, g, 6, 4, size_small, 2);
    CHECK_OK_D(batch_put(c, &b, NULL, &d), &d);
    batch_verify(c, &b, 2);
    batch_free(&b);

    /* Unit 0 small (inline), unit 1 large (alloc, WRITE, commit) in one put; the
     * get mixes values carried in unit 1's reply with values it READs. */
    double al0 = sum_stat(c, "allocs");
    pi0 = sum_stat(c, "puts_inline");
    batch_make(&b, NULL, g, 6, 4, size_split, 3);
    CHECK_OK_D(batch_put(c, &b, NULL, &d), &d);
    CHECK_EQ((long long)(sum_stat(c, "puts_inline") - pi0), 1);
    CHECK_EQ((long long)(sum_stat(c, "allocs") - al0), 2);
    ib0 = stat_of(c, 1, "inline_bytes");
    double ib00 = stat_of(c, 0, "inline_bytes");
    batch_verify(c, &b, 3);
    /* Unit 0's small answer came inline; unit 1's (240 KB) all by READ. */
    CHECK(stat_of(c, 0, "inline_bytes") > ib00);
    CHECK(stat_of(c, 1, "inline_bytes") == ib0);
    CHECK_EQ((long long)sum_stat(c, "pins"), 0);
    batch_free(&b);
    dp_client_close(c);

    /* Off: every put allocates and WRITEs. */
    setenv("DP_INLINE", "off", 1);
    c = connect_cl(&cl);
    unsetenv("DP_INLINE");
    pi0 = sum_stat(c, "puts_inline");
    batch_make(&b, NULL, g, 6, 4, size_small, 4);
    CHECK_OK_D(batch_put(c, &b, NULL, &d), &d);
    batch_verify(c, &b, 4);
    CHECK(sum_stat(c, "puts_inline") == pi0);
    batch_free(&b);
    dp_client_close(c);

    /* Bad settings: refused at open, naming what is wrong. */
    dp_client_opts o;
    dp_client_opts_init(&o);
    o.inline_bytes = 2u << 20;
    c = NULL;
    CHECK_ERR_D(dp_client_open_units(cl.addrs, cl.n, &o, &c, &d), DP_EINVAL, &d);
    CHECK_CONTAINS(d.msg, "inline_bytes");
    setenv("DP_INLINE", "lots", 1);
    o.inline_bytes = 0;
    CHECK_ERR_D(dp_client_open_units(cl.addrs, cl.n, &o, &c, &d), DP_EINVAL, &d);
    CHECK_CONTAINS(d.msg, "DP_INLINE");
    unsetenv("DP_INLINE");
    CHECK(c == NULL);
    cluster_stop(&cl);
}

/*
 * Pin key (on unit 0 of cl) with a raw resolve_keys that is never unpinned,
 * then clear its row gidx: the blob stays a zombie held by the pin for the
 * unit's read_pin_s, and its room is busy until then.
 */
static void
pin_then_clear(dp_client *c, const cluster *cl, uint64_t gidx, const char *key)
{
    dp__ctl_client *ctl = NULL;
    CHECK_OK(dp__ctl_client_create(&ctl, NULL));
    dp__wire_rid_gen rg;
    CHECK_OK(dp__wire_rid_gen_init(&rg, NULL));
    char rid[DP_WIRE_RID_MAX];
    dp__wire_request q;
    memset(&q, 0, sizeof q);
    q.op = DP_WIRE_OP_RESOLVE_KEYS;
    dp__wire_str k = dp__wire_s(key);
    q.a.resolve_keys.keys = (dp__wire_strs){&k, 1};
    q.rid = dp__wire_rid_next(&rg, rid);
    dp__buf req = {0}, rep = {0};
    CHECK_OK(dp__wire_request_encode(&q, NULL, &req, NULL));
    CHECK_OK(dp__ctl_call(ctl, cl->addr[0], &req, rid, 10, &rep, NULL));
    dp__buf_fini(&req);
    dp__buf_fini(&rep);
    dp__ctl_client_destroy(ctl);
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_OK_D(dp_client_clear(c, &gidx, 1, NULL, &d), &d);
}

/*
 * An inline put that meets a busy unit (a cleared blob still pinned holds
 * the room) is sent again until the pin ends, then lands.
 */
DP_TEST(inline_put_busy_is_retried)
{
    cluster cl;
    cluster_start(&cl, 1, 3 << 19, 60, 1); /* 1.5 MiB slab, pins of 1 s */
    dp_client_opts o;
    dp_client_opts_init(&o);
    o.timeout_s = 15;
    o.inline_bytes = 1 << 20;
    dp_client *c = NULL;
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_OK_D(dp_client_open_units(cl.addrs, cl.n, &o, &c, &d), &d);
    const size_t len = (1 << 20) - 4096; /* its blob just fits 1 MiB */
    uint8_t *p = malloc(len);
    fill(p, len, 1, 0, 1);
    uint64_t g = 1;
    const char *f[] = {"big"};
    dp_value v = {p, len, DP_KIND_BYTES, NULL, NULL, 0};
    double pi0 = stat_of(c, 0, "puts_inline");
    CHECK_OK_D(dp_client_put(c, &g, 1, f, 1, &v, NULL, &d), &d);
    CHECK_EQ((long long)(stat_of(c, 0, "puts_inline") - pi0), 1);
    pin_then_clear(c, &cl, g, "1@big");
    /* Row 2's inline put meets Busy until the pin expires, then lands. */
    g = 2;
    fill(p, len, 2, 0, 1);
    double busy0 = stat_of(c, 0, "busy");
    CHECK_OK_D(dp_client_put(c, &g, 1, f, 1, &v, NULL, &d), &d);
    CHECK(stat_of(c, 0, "busy") > busy0);
    CHECK_EQ((long long)(stat_of(c, 0, "puts_inline") - pi0), 2);
    uint8_t *back = malloc(len);
    dp_get_item it = {.key = "2@big", .dst = back, .cap = len};
    CHECK_OK_D(dp_client_get(c, &it, 1, &d), &d);
    CHECK_EQ_U64(it.nbytes, len);
    CHECK(memcmp(back, p, len) == 0);
    free(back);
    free(p);
    dp_client_close(c);
    cluster_stop(&cl);
}

static pid_t stop_pid;

static void
stop_hook(const char *stage)
{
    if (strcmp(stage, "put:allocated") == 0)
        kill(stop_pid, SIGSTOP);
}

/*
 * One put: unit 0's large row by alloc and WRITE, unit 1's small one inline.
 * Unit 0 stops once allocated (two-sided: its WRITE waits out the budget);
 * unit 1's answer came long before and must count: its row is reported
 * landed, and it is there.
 */
DP_TEST(inline_put_lands_while_another_units_write_stalls)
{
    cluster cl;
    cluster_start(&cl, 2, 16 << 20, 60, 10);
    setenv("DP_TWO_SIDED", "always", 1);
    dp_client *c = connect_opts(&cl, 2);
    unsetenv("DP_TWO_SIDED");
    uint64_t g[2] = {0, 1};
    const char *f[] = {"v"};
    uint8_t *big = malloc(1 << 20), small[100];
    memset(big, 1, 1 << 20);
    memset(small, 7, sizeof small);
    dp_value v[2] = {{big, 1 << 20, DP_KIND_BYTES, NULL, NULL, 0},
                     {small, sizeof small, DP_KIND_BYTES, NULL, NULL, 0}};
    int rs[2] = {-1, -1};
    dp_detail d;
    dp_detail_clear(&d);
    stop_pid = cl.pid[0];
    dp__client_test_hook = stop_hook;
    int rc = dp_client_put(c, g, 2, f, 1, v, rs, &d);
    dp__client_test_hook = NULL;
    kill(cl.pid[0], SIGCONT);
    CHECK(rc != 0);
    CHECK(rs[0] != 0);
    CHECKF(rs[1] == 0, "the inline row: %s (%s)", dp_errname(rs[1]), dp_detail_msg(&d));
    uint8_t out[100];
    dp_get_item it = {.key = "1@v", .dst = out, .cap = sizeof out};
    CHECK_OK_D(dp_client_get(c, &it, 1, &d), &d);
    CHECK(it.nbytes == sizeof small && memcmp(out, small, sizeof small) == 0);
    free(big);
    dp_client_close(c);
    cluster_stop(&cl);
}

/*
 * A get asks by row and field (resolve_rows) while its keys name at most 64
 * distinct fields, and by key (resolve_keys) past that; both give every
 * value and its description back, content checked.
 */
DP_TEST(gets_ask_by_row_or_by_key)
{
    cluster cl;
    cluster_start(&cl, 2, 64 << 20, 60, 10);
    dp_client *c = connect_cl(&cl);
    enum { NF = 70 };
    static char names[NF][16];
    static const char *fields[NF];
    for (int f = 0; f < NF; f++) {
        snprintf(names[f], sizeof names[f], "f%02d", f);
        fields[f] = names[f];
    }
    uint64_t g[] = {3, 4, 11};
    for (size_t nf = 64; nf <= NF; nf += NF - 64) {
        batch b;
        batch_make(&b, NULL, g, 3, nf, size_jagged, nf);
        b.fields = fields;
        dp_detail d;
        dp_detail_clear(&d);
        CHECK_OK_D(batch_put(c, &b, NULL, &d), &d);
        double rows0 = sum_stat(c, "resolves_by_row"), all0 = sum_stat(c, "resolves");
        batch_verify(c, &b, nf);
        double by_row = sum_stat(c, "resolves_by_row") - rows0;
        double all = sum_stat(c, "resolves") - all0;
        CHECK(all >= 2); /* rows 3 and 11 on unit 1, 4 on unit 0 */
        CHECKF(by_row == (nf == 64 ? all : 0), "%zu fields: %.0f of %.0f resolves by row",
               nf, by_row, all);
        batch_free(&b);
    }
    dp_client_close(c);
    cluster_stop(&cl);
}

DP_TEST(registered_memory_and_get_forms)
{
    cluster cl;
    cluster_start(&cl, 3, 64 << 20, 60, 10);
    dp_client *c = connect_cl(&cl);
    uint64_t g[10];
    for (int i = 0; i < 10; i++)
        g[i] = 100 + (uint64_t)i;
    /* Values in registered memory: written straight from there. */
    batch b;
    batch_make(&b, c, g, 10, 3, size_jagged, 3);
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_OK_D(batch_put(c, &b, NULL, &d), &d);
    batch_verify(c, &b, 3);

    /* Get into registered memory (READ in place). */
    void *dst = NULL;
    CHECK_OK(dp_client_alloc(c, 1 << 20, &dst, NULL));
    dp_get_item it = {.key = "101@logprobs", .dst = dst, .cap = 1 << 20};
    CHECK_OK_D(dp_client_get(c, &it, 1, &d), &d);
    uint64_t v = 3;
    CHECK(check_value(dst, it.nbytes, 101, 1, &v));
    CHECK_EQ_U64(it.nbytes, b.vals[1 * 3 + 1].nbytes);

    /* A destination too small: the size comes back, nothing is copied. */
    dp_get_item small = {.key = "109@reward", .dst = NULL, .cap = 0};
    int rc = dp_client_get(c, &small, 1, &d);
    if (b.vals[9 * 3 + 2].nbytes > 0) {
        CHECK_EQ(rc, DP_ETOOBIG);
        CHECK_EQ(small.status, DP_ETOOBIG);
    }
    CHECK_EQ_U64(small.nbytes, b.vals[9 * 3 + 2].nbytes);

    /* Library-allocated values with descriptions; repeated and missing keys. */
    const char *keys[] = {"100@input_ids", "105@logprobs", "100@input_ids", "999@x",
                          "107@reward"};
    dp_values *vals = NULL;
    CHECK_ERR_D(dp_client_get_alloc(c, keys, 5, &vals, &d), DP_ENOTFOUND, &d);
    CHECK_CONTAINS(dp_detail_msg(&d), "'999@x'");
    CHECK(vals != NULL);
    CHECK_EQ(dp_values_count(vals), 5);
    const uint64_t gi[] = {100, 105, 100, 0, 107};
    const uint32_t fi[] = {0, 1, 0, 0, 2};
    for (size_t i = 0; i < 5; i++) {
        const void *p = NULL;
        uint64_t n = 0;
        const dp_value_desc *desc = NULL;
        int s = dp_values_get(vals, i, &p, &n, &desc);
        if (i == 3) {
            CHECK_EQ(s, DP_ENOTFOUND);
            continue;
        }
        CHECK_EQ(s, 0);
        size_t cell = (size_t)(gi[i] - 100) * 3 + fi[i];
        CHECK_EQ_U64(n, b.vals[cell].nbytes);
        CHECK_EQ(desc->kind, b.vals[cell].kind);
        uint64_t vv = 3;
        CHECK(check_value(p, n, gi[i], fi[i], &vv));
    }
    dp_values_destroy(vals);

    /* Bad keys are refused before anything is sent. */
    dp_get_item bad = {.key = "12x@a"};
    CHECK_ERR(dp_client_get(c, &bad, 1, NULL), DP_EINVAL);
    bad.key = "1@a@b";
    CHECK_ERR(dp_client_get(c, &bad, 1, NULL), DP_EINVAL);
    dp_client_free(c, dst);
    batch_free(&b);
    dp_client_close(c);
    cluster_stop(&cl);
}

DP_TEST(bad_puts_and_skipped_cells)
{
    cluster cl;
    cluster_start(&cl, 2, 16 << 20, 60, 10);
    dp_client *c = connect_cl(&cl);
    dp_detail d;
    dp_detail_clear(&d);
    uint8_t x[16] = {1, 2, 3};
    uint64_t g2[] = {4, 4};
    const char *f1[] = {"a"};
    dp_value v2[2] = {{x, 16, DP_KIND_BYTES, NULL, NULL, 0},
                      {x, 16, DP_KIND_BYTES, NULL, NULL, 0}};
    CHECK_ERR_D(dp_client_put(c, g2, 2, f1, 1, v2, NULL, &d), DP_EINVAL, &d);
    CHECK_CONTAINS(dp_detail_msg(&d), "twice");
    /* Rows out of order are checked too (a hash set, not the ordered scan). */
    uint64_t gd[] = {9, 2, 7, 2}, gl[] = {1, 2, 3, 3}, gu[] = {9, 2, 7, 5};
    dp_value vd[4] = {v2[0], v2[0], v2[0], v2[0]};
    CHECK_ERR_D(dp_client_put(c, gd, 4, f1, 1, vd, NULL, &d), DP_EINVAL, &d);
    CHECK_CONTAINS(dp_detail_msg(&d), "row 2 given twice");
    CHECK_ERR_D(dp_client_put(c, gl, 4, f1, 1, vd, NULL, &d), DP_EINVAL, &d);
    CHECK_CONTAINS(dp_detail_msg(&d), "row 3 given twice");
    CHECK_OK_D(dp_client_put(c, gu, 4, f1, 1, vd, NULL, &d), &d);
    const char *fbad[] = {"a@b"};
    uint64_t g1[] = {3};
    CHECK_ERR(dp_client_put(c, g1, 1, fbad, 1, v2, NULL, NULL), DP_EINVAL);
    const char *fdup[] = {"a", "a"};
    CHECK_ERR(dp_client_put(c, g1, 1, fdup, 2, v2, NULL, NULL), DP_EINVAL);
    dp_value tensor_no_dtype = {x, 16, DP_KIND_TENSOR, NULL, NULL, 0};
    CHECK_ERR(dp_client_put(c, g1, 1, f1, 1, &tensor_no_dtype, NULL, NULL), DP_EINVAL);
    /*
     * A bad cell of unit 1's row refuses the whole put before anything is sent
     * (the allocs leave before the indexes are built): no unit allocated.
     */
    double al0 = stat_of(c, 0, "allocs") + stat_of(c, 1, "allocs");
    uint64_t shape33[33] = {0};
    uint64_t g4[] = {20, 21, 22, 23};
    uint8_t *wide = calloc(1, 1 << 20); /* not inline: allocs would be sent */
    dp_value v4[4];
    for (int i = 0; i < 4; i++)
        v4[i] = (dp_value){wide, 1 << 20, DP_KIND_BYTES, NULL, NULL, 0};
    v4[3] = (dp_value){wide, 1 << 20, DP_KIND_TENSOR, "Float32", shape33, 1};
    CHECK_ERR_D(dp_client_put(c, g4, 4, f1, 1, v4, NULL, &d), DP_EINVAL, &d);
    CHECK_CONTAINS(dp_detail_msg(&d), "row 23 field 'a': dtype has a character");
    v4[3] = (dp_value){wide, 1 << 20, DP_KIND_TENSOR, "float32", shape33, 33};
    CHECK_ERR_D(dp_client_put(c, g4, 4, f1, 1, v4, NULL, &d), DP_EINVAL, &d);
    CHECK_CONTAINS(dp_detail_msg(&d), "more than 32 dims");
    v4[3] = (dp_value){wide, 1 << 20, DP_KIND_TENSOR, "float32", NULL, 2};
    CHECK_ERR_D(dp_client_put(c, g4, 4, f1, 1, v4, NULL, &d), DP_EINVAL, &d);
    CHECK_CONTAINS(dp_detail_msg(&d), "shape is NULL");
    CHECK(stat_of(c, 0, "allocs") + stat_of(c, 1, "allocs") == al0);
    v4[3] = (dp_value){wide, 1 << 20, DP_KIND_TENSOR, "float32", shape33, 33 - 32};
    shape33[0] = (1 << 20) / 4;
    CHECK_OK_D(dp_client_put(c, g4, 4, f1, 1, v4, NULL, &d), &d);
    CHECK(stat_of(c, 0, "allocs") + stat_of(c, 1, "allocs") == al0 + 2);
    free(wide);
    /* Bigger than a unit's slab: refused up front. */
    uint8_t *big = calloc(1, 17 << 20);
    dp_value vb = {big, 17 << 20, DP_KIND_BYTES, NULL, NULL, 0};
    CHECK_ERR_D(dp_client_put(c, g1, 1, f1, 1, &vb, NULL, &d), DP_ETOOBIG, &d);
    free(big);

    /* Rows with different sets of fields in one put (skipped cells). */
    uint64_t g[] = {10, 11, 12};
    const char *f[] = {"p", "q"};
    dp_value v[6];
    memset(v, 0, sizeof v);
    for (int i = 0; i < 6; i++)
        v[i] = (dp_value){x, (uint64_t)i, DP_KIND_BYTES, NULL, NULL, 0};
    v[1].kind = DP_KIND_SKIP; /* 10@q */
    v[4].kind = DP_KIND_SKIP; /* 12@p */
    v[5].kind = DP_KIND_SKIP; /* 12@q: row 12 sends nothing */
    CHECK_OK_D(dp_client_put(c, g, 3, f, 2, v, NULL, &d), &d);
    const char *keys[] = {"10@p", "10@q", "11@p", "11@q", "12@p"};
    dp_values *vals = NULL;
    CHECK_ERR_D(dp_client_get_alloc(c, keys, 5, &vals, &d), DP_ENOTFOUND, &d);
    int want[] = {0, DP_ENOTFOUND, 0, 0, DP_ENOTFOUND};
    uint64_t wlen[] = {0, 0, 2, 3, 0};
    for (size_t i = 0; i < 5; i++) {
        uint64_t n = 99;
        const void *p = NULL;
        CHECK_EQ(dp_values_get(vals, i, &p, &n, NULL), want[i]);
        if (want[i] == 0) {
            CHECK_EQ_U64(n, wlen[i]);
            CHECK(n == 0 || memcmp(p, x, n) == 0);
        }
    }
    dp_values_destroy(vals);
    dp_client_close(c);
    cluster_stop(&cl);
}

DP_TEST(sizes_up_to_64mib)
{
    cluster cl;
    cluster_start(&cl, 2, 160 << 20, 60, 10);
    dp_client *c = connect_cl(&cl);
    static const uint64_t sizes[] = {0, 1, 63, 64, 65, 4096, (1 << 20) + 3, 64 << 20};
    dp_detail d;
    dp_detail_clear(&d);
    for (size_t s = 0; s < DP_ARRAY_LEN(sizes); s++) {
        uint64_t len = sizes[s];
        uint64_t g = 40 + s;
        /* Half from malloc (staged), half from registered memory (direct). */
        bool reg = s % 2 == 1;
        uint8_t *p = NULL;
        if (reg)
            CHECK_OK(dp_client_alloc(c, len > 0 ? len : 1, (void **)&p, NULL));
        else
            p = malloc(len > 0 ? len : 1);
        fill(p, len, g, 0, 5);
        const char *f[] = {"blob"};
        dp_value v = {p, len, DP_KIND_BYTES, NULL, NULL, 0};
        CHECK_OK_D(dp_client_put(c, &g, 1, f, 1, &v, NULL, &d), &d);
        uint8_t *q = malloc(len > 0 ? len : 1);
        char key[64];
        snprintf(key, sizeof key, "%" PRIu64 "@blob", g);
        dp_get_item it = {.key = key, .dst = q, .cap = len};
        CHECK_OK_D(dp_client_get(c, &it, 1, &d), &d);
        CHECK_EQ_U64(it.nbytes, len);
        uint64_t ver = 5;
        CHECKF(check_value(q, len, g, 0, &ver), "size %" PRIu64, len);
        free(q);
        if (reg)
            dp_client_free(c, p);
        else
            free(p);
        /* Drop the big one again so the slab has room. */
        CHECK_OK(dp_client_clear(c, &g, 1, NULL, &d));
    }
    dp_client_close(c);
    cluster_stop(&cl);
}

DP_TEST(cluster_file_and_stats)
{
    cluster cl;
    cluster_start(&cl, 2, 16 << 20, 60, 10);
    char dir[] = "/tmp/dp_tc_XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    dp__cluster cf;
    memset(&cf, 0, sizeof cf);
    cf.n_units = 2;
    dp__cluster_unit us[2];
    memset(us, 0, sizeof us);
    for (uint32_t u = 0; u < 2; u++) {
        us[u].id = u;
        snprintf(us[u].zmq, sizeof us[u].zmq, "%s", cl.addr[u]);
        snprintf(us[u].agent, sizeof us[u].agent, "unit-%u", u);
    }
    cf.units = us;
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/cluster.json", dir);
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_OK_D(dp__cluster_save(path, &cf, &d), &d);
    dp_client *c = NULL;
    CHECK_OK_D(dp_client_open(dir, NULL, &c, &d), &d);
    CHECK_EQ(dp_client_n_units(c), 2);
    dp_client_close(c);
    c = NULL;
    setenv("DP_CLUSTER", path, 1);
    CHECK_OK_D(dp_client_open(NULL, NULL, &c, &d), &d);
    unsetenv("DP_CLUSTER");
    dp_client_stats *s = NULL;
    CHECK_OK_D(dp_client_stats_get(c, &s, &d), &d);
    CHECK_EQ(dp_client_stats_units(s), 2);
    for (uint32_t u = 0; u < 2; u++) {
        CHECK_EQ(dp_client_stats_status(s, u), 0);
        CHECK(dp_client_stats_count(s, u) > 5);
        double v = -1;
        CHECK(dp_client_stats_find(s, u, "unit_id", &v));
        CHECK_EQ((long long)v, u);
        const char *name = NULL;
        CHECK(dp_client_stats_at(s, u, 0, &name, &v));
        CHECK(name != NULL);
    }
    CHECK(!dp_client_stats_find(s, 0, "no_such_counter", NULL));
    dp_client_stats_destroy(s);
    dp_client_close(c);

    /* The units in the wrong order: refused, naming the unit. */
    snprintf(us[0].zmq, sizeof us[0].zmq, "%s", cl.addr[1]);
    snprintf(us[1].zmq, sizeof us[1].zmq, "%s", cl.addr[0]);
    CHECK_OK(dp__cluster_save(path, &cf, &d));
    c = NULL;
    CHECK_ERR_D(dp_client_open(path, NULL, &c, &d), DP_EPROTO, &d);
    CHECK_CONTAINS(dp_detail_msg(&d), "unit 0");
    CHECK(c == NULL);
    unlink(path);
    CHECK_ERR_D(dp_client_open(dir, NULL, &c, &d), DP_ENOTFOUND, &d);
    rmdir(dir);
    cluster_stop(&cl);
}

DP_TEST(busy_unit_is_retried)
{
    /* A 4 MiB slab, pins of 1 s: a pinned released blob keeps the room busy. */
    cluster cl;
    cluster_start(&cl, 1, 4 << 20, 60, 1);
    dp_client *c = connect_opts(&cl, 15);
    uint8_t *p = malloc(3 << 20);
    fill(p, 3 << 20, 1, 0, 1);
    uint64_t g = 1;
    const char *f[] = {"big"};
    dp_value v = {p, 3 << 20, DP_KIND_BYTES, NULL, NULL, 0};
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_OK_D(dp_client_put(c, &g, 1, f, 1, &v, NULL, &d), &d);
    pin_then_clear(c, &cl, g, "1@big");
    /* The next 3 MiB put meets Busy until the pin expires, then lands. */
    g = 2;
    double t0 = dp_test_now();
    CHECK_OK_D(dp_client_put(c, &g, 1, f, 1, &v, NULL, &d), &d);
    CHECK(dp_test_now() - t0 > 0.3);
    CHECK(stat_of(c, 0, "busy") >= 1);
    free(p);
    dp_client_close(c);
    cluster_stop(&cl);
}

DP_TEST(several_client_processes)
{
    cluster cl;
    cluster_start(&cl, 3, 64 << 20, 60, 10);
    pid_t kids[4];
    for (int i = 0; i < 4; i++)
        kids[i] = spawn_client(&cl, "client", 1000 * (uint64_t)(i + 1), NULL);
    for (int i = 0; i < 4; i++)
        CHECK_EQ(dp_test_wait_status(kids[i]), 0);
    /* Everything the children left is their last version. */
    dp_client *c = connect_cl(&cl);
    for (int i = 0; i < 4; i++) {
        uint64_t g[16];
        for (int r = 0; r < 16; r++)
            g[r] = 1000 * (uint64_t)(i + 1) + (uint64_t)r;
        batch b;
        batch_make(&b, NULL, g, 16, 3, size_jagged, 8);
        batch_verify(c, &b, 8);
        batch_free(&b);
    }
    dp_client_close(c);
    cluster_stop(&cl);
}

typedef struct thr_arg {
    dp_client *c;
    int id;
    int fails;
} thr_arg;

static void *
thr_main(void *p)
{
    thr_arg *a = p;
    uint64_t g[8];
    for (int i = 0; i < 8; i++)
        g[i] = 5000 + (uint64_t)a->id * 100 + (uint64_t)i;
    for (int v = 1; v <= 6; v++) {
        uint8_t *bufs[8];
        dp_value vals[8];
        for (int i = 0; i < 8; i++) {
            uint64_t len = size_jagged(g[i], 0) + 8;
            bufs[i] = malloc(len);
            fill(bufs[i], len, g[i], 0, (uint64_t)v);
            vals[i] = (dp_value){bufs[i], len, DP_KIND_BYTES, NULL, NULL, 0};
        }
        const char *f[] = {"t"};
        if (dp_client_put(a->c, g, 8, f, 1, vals, NULL, NULL) != 0)
            a->fails++;
        char keys[8][32];
        dp_get_item it[8];
        uint8_t *out[8];
        for (int i = 0; i < 8; i++) {
            snprintf(keys[i], sizeof keys[i], "%" PRIu64 "@t", g[i]);
            out[i] = malloc(vals[i].nbytes);
            it[i] = (dp_get_item){.key = keys[i], .dst = out[i], .cap = vals[i].nbytes};
        }
        if (dp_client_get(a->c, it, 8, NULL) != 0)
            a->fails++;
        for (int i = 0; i < 8; i++) {
            uint64_t ver = 0;
            if (!check_value(out[i], vals[i].nbytes, g[i], 0, &ver) || ver != (uint64_t)v)
                a->fails++;
            free(out[i]);
            free(bufs[i]);
        }
    }
    return NULL;
}

DP_TEST(threads_share_a_client)
{
    cluster cl;
    cluster_start(&cl, 2, 32 << 20, 60, 10);
    dp_client *c = connect_cl(&cl);
    pthread_t t[4];
    thr_arg a[4];
    for (int i = 0; i < 4; i++) {
        a[i] = (thr_arg){c, i, 0};
        CHECK(pthread_create(&t[i], NULL, thr_main, &a[i]) == 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(t[i], NULL);
        CHECK_EQ(a[i].fails, 0);
    }
    dp_client_close(c);
    cluster_stop(&cl);
}

static void *
destroy_values(void *v)
{
    dp_values_destroy(v);
    return NULL;
}

/*
 * A zeroed dp_client_opts is valid (the defaults); a non-zero reserved word
 * is refused. Values outlive their client: closing it with values alive
 * disconnects at once and deregisters the caller's region, the values stay
 * readable, and the last dp_values_destroy (here racing another thread's)
 * frees the client. Before, close freed the client under its values: reading
 * them touched unmapped memory and dp_values_destroy locked a freed mutex (a
 * use-after-free under AddressSanitizer).
 */
DP_TEST(values_keep_their_client_alive)
{
    cluster cl;
    cluster_start(&cl, 2, 64 << 20, 60, 10);
    dp_client_opts o = {0};
    dp_client *c = NULL;
    dp_detail d;
    dp_detail_clear(&d);
    o.reserved[5] = 1;
    CHECK_ERR_D(dp_client_open_units(cl.addrs, cl.n, &o, &c, &d), DP_EINVAL, &d);
    CHECK_CONTAINS(d.msg, "reserved[5]");
    CHECK(c == NULL);
    o.reserved[5] = 0;
    o.timeout_s = -1;
    CHECK_ERR_D(dp_client_open_units(cl.addrs, cl.n, &o, &c, &d), DP_EINVAL, &d);
    o.timeout_s = 0;
    CHECK_OK_D(dp_client_open_units(cl.addrs, cl.n, &o, &c, &d), &d);

    uint64_t g[8];
    for (int i = 0; i < 8; i++)
        g[i] = 200 + (uint64_t)i;
    batch b;
    batch_make(&b, NULL, g, 8, 2, size_jagged, 7);
    CHECK_OK_D(batch_put(c, &b, NULL, &d), &d);
    char keys[16][64];
    const char *kp[16];
    for (size_t i = 0; i < 16; i++) {
        snprintf(keys[i], sizeof keys[i], "%" PRIu64 "@%s", g[i / 2], field_names[i % 2]);
        kp[i] = keys[i];
    }
    dp_values *v1 = NULL, *v2 = NULL, *none = NULL;
    CHECK_OK_D(dp_client_get_alloc(c, kp, 16, &v1, &d), &d);
    CHECK_OK_D(dp_client_get_alloc(c, kp, 16, &v2, &d), &d);
    CHECK_OK_D(dp_client_get_alloc(c, kp, 0, &none, &d), &d);
    /* The caller's region: deregistered by close itself, free()d right after. */
    size_t rlen = 1 << 20;
    void *mine = aligned_alloc(4096, rlen);
    CHECK_OK_D(dp_client_register(c, mine, rlen, &d), &d);
    dp_client_close(c);
    free(mine);

    dp_values_destroy(none);
    size_t checked = 0;
    for (size_t i = 0; i < 16; i++) {
        const void *p = NULL;
        uint64_t n = 0;
        const dp_value_desc *desc = NULL;
        CHECK_OK(dp_values_get(v1, i, &p, &n, &desc));
        CHECK_EQ_U64(n, b.vals[i].nbytes);
        CHECK_EQ(desc->kind, b.vals[i].kind);
        for (size_t k = 0; k < DP_ARRAY_LEN(desc->reserved); k++)
            CHECK_EQ_U64(desc->reserved[k], 0);
        uint64_t ver = 7;
        CHECK(check_value(p, n, g[i / 2], (uint32_t)(i % 2), &ver));
        checked++;
    }
    CHECK_EQ(checked, 16);
    /* The last two go at once: exactly one of them frees the client. */
    pthread_t th;
    CHECK(pthread_create(&th, NULL, destroy_values, v2) == 0);
    dp_values_destroy(v1);
    pthread_join(th, NULL);
    batch_free(&b);
    cluster_stop(&cl);
}

DP_TEST(unit_killed_mid_run)
{
    cluster cl;
    cluster_start(&cl, 3, 32 << 20, 60, 10);
    dp_client *c = connect_opts(&cl, 3);
    uint64_t g[12];
    for (int i = 0; i < 12; i++)
        g[i] = (uint64_t)i;
    batch b;
    batch_make(&b, NULL, g, 12, 2, size_jagged, 1);
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_OK_D(batch_put(c, &b, NULL, &d), &d);
    kill(cl.pid[1], SIGKILL);
    CHECK_EQ(dp_test_wait_status(cl.pid[1]), -SIGKILL);
    cl.pid[1] = 0;

    /* A put spanning every unit: exactly unit 1's rows fail, and say so. */
    batch b2;
    batch_make(&b2, NULL, g, 12, 2, size_jagged, 2);
    int st[12];
    int rc = batch_put(c, &b2, st, &d);
    CHECKF(rc == DP_ETIMEDOUT || rc == DP_ETRANSFER, "put after a unit died: %s",
           dp_errname(rc));
    CHECK_CONTAINS(dp_detail_msg(&d), "unit 1");
    CHECK_CONTAINS(dp_detail_msg(&d), "4 of 12 rows did not land");
    for (int i = 0; i < 12; i++)
        CHECKF((st[i] != 0) == (i % 3 == 1), "row %d status %s", i, dp_errname(st[i]));

    /* Gets: the other units' rows have the new version, unit 1's fail. */
    dp_get_item it[12];
    char keys[12][32];
    uint8_t *out[12];
    for (int i = 0; i < 12; i++) {
        snprintf(keys[i], sizeof keys[i], "%d@input_ids", i);
        out[i] = malloc(1 << 20);
        it[i] = (dp_get_item){.key = keys[i], .dst = out[i], .cap = 1 << 20};
    }
    rc = dp_client_get(c, it, 12, &d);
    CHECK(rc == DP_ETIMEDOUT || rc == DP_ETRANSFER);
    CHECK_CONTAINS(dp_detail_msg(&d), cl.addr[1]);
    for (int i = 0; i < 12; i++) {
        if (i % 3 == 1) {
            CHECK(it[i].status == DP_ETIMEDOUT || it[i].status == DP_ETRANSFER);
            continue;
        }
        CHECK_EQ(it[i].status, 0);
        uint64_t ver = 0;
        CHECK(check_value(out[i], it[i].nbytes, (uint64_t)i, 0, &ver));
        CHECK(it[i].nbytes < 8 || ver == 2);
    }
    for (int i = 0; i < 12; i++)
        free(out[i]);
    /* The live units keep serving puts of their own rows. */
    uint64_t g0[] = {0, 2, 3, 5};
    batch b3;
    batch_make(&b3, NULL, g0, 4, 2, size_4k, 3);
    CHECK_OK_D(batch_put(c, &b3, NULL, &d), &d);
    batch_verify(c, &b3, 3);
    batch_free(&b);
    batch_free(&b2);
    batch_free(&b3);
    dp_client_close(c);
    cluster_stop(&cl);
}

typedef struct stopper {
    pid_t pid;
    double after_s;
} stopper;

static void *
stopper_main(void *arg)
{
    stopper *s = arg;
    dp__sleep_s(s->after_s);
    kill(s->pid, SIGSTOP);
    return NULL;
}

/*
 * A get whose READ cannot finish (the unit stopped mid-READ; over tcp the
 * unit's progress moves the bytes) fails within its budget, and the client
 * then says the destination is off limits: a READ may still write it.
 */
DP_TEST(stopped_unit_leaves_the_destination_off_limits)
{
    setenv("UCX_TLS", "tcp", 1);
    cluster cl;
    cluster_start(&cl, 1, 160 << 20, 60, 30);
    /* The gets have a short budget; the put before them a long one (64 MiB
     * over tcp took 3.7 s under ThreadSanitizer on a slow day). */
    dp_client *c = connect_opts(&cl, 2), *pc = connect_cl(&cl);
    enum { BYTES = 64 << 20 };
    uint8_t *src = NULL, *dst = NULL;
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_OK_D(dp_client_alloc(pc, BYTES, (void **)&src, &d), &d);
    CHECK_OK_D(dp_client_alloc(c, BYTES, (void **)&dst, &d), &d);
    memset(src, 0x42, BYTES);
    uint64_t g = 7;
    const char *f[] = {"obs"};
    dp_value v = {src, BYTES, DP_KIND_BYTES, NULL, NULL, 0};
    CHECK_OK_D(dp_client_put(pc, &g, 1, f, 1, &v, NULL, &d), &d);
    dp_client_free(pc, src);
    dp_client_close(pc);
    CHECK(!dp_client_touches_unfinished(c, dst, BYTES));
    bool seen = false;
    double after = 0.03;
    for (int attempt = 0; attempt < 8 && !seen; attempt++) {
        if (attempt > 0) {
            kill(cl.pid[0], SIGCONT);
            dp__sleep_s(0.5);
        }
        stopper sp = {cl.pid[0], after};
        pthread_t th;
        CHECK_EQ(pthread_create(&th, NULL, stopper_main, &sp), 0);
        dp_get_item it = {.key = "7@obs", .dst = dst, .cap = BYTES};
        int rc = dp_client_get(c, &it, 1, &d);
        pthread_join(th, NULL);
        printf("  attempt %d (stop after %.3f s): %s %s\n", attempt, after,
               dp_errname(rc), rc == DP_OK ? "" : dp_detail_msg(&d));
        if (rc == DP_OK) { /* the READ ended before the stop: stop sooner */
            after /= 2;
            continue;
        }
        CHECKF(rc == DP_ETIMEDOUT || rc == DP_ETRANSFER, "get from a stopped unit: %s",
               dp_errname(rc));
        /* Stopped before the READ began (resolve timed out): stop later
         * (a slow resolve, under sanitizers, must end first). */
        seen = strstr(dp_detail_msg(&d), "retained") != NULL;
        if (!seen)
            after += 0.05;
    }
    CHECK(seen);
    CHECK(dp_client_touches_unfinished(c, dst, BYTES));
    CHECK(dp_client_touches_unfinished(c, dst + BYTES / 2, 1));
    uint8_t other[256]; /* memory no transfer touches */
    CHECK(!dp_client_touches_unfinished(c, other, sizeof other));
    kill(cl.pid[0], SIGCONT);
    dp_client_free(c, dst); /* kept (retired), never reused */
    dp_client_close(c);
    cluster_stop(&cl);
    unsetenv("UCX_TLS");
}

/* dp_ckpt_save (the public call) of the cluster c is connected to into dir. */
static void
save_cluster(dp_client *c, const char *dir)
{
    dp_detail d;
    dp_detail_clear(&d);
    dp_ckpt_opts o = {0}; /* zeroed: the defaults */
    dp_ckpt_summary sum;
    CHECK_OK_D(dp_ckpt_save(c, dir, &o, &sum, &d), &d);
    CHECK_EQ(sum.n_units, dp_client_n_units(c));
    CHECK(sum.blobs > 0);
    o.reserved[0] = 1; /* a field this library does not know: refused */
    CHECK_ERR_D(dp_ckpt_save(c, dir, &o, &sum, &d), DP_EINVAL, &d);
    CHECK_CONTAINS(dp_detail_msg(&d), "reserved");
}

/* Rows 100..299 hold one field each ((gidx / 2) % 4, so each unit's blob has
 * all four): a sparse blob. */
static void
sparse_check(dp_client *c, uint64_t ver)
{
    for (uint64_t g = 100; g < 300; g++) {
        char key[64];
        uint32_t f = (uint32_t)(g / 2 % 4);
        snprintf(key, sizeof key, "%" PRIu64 "@%s", g, field_names[f]);
        enum { CAP = 400000 }; /* size_jagged's largest and then some */
        uint8_t *buf = malloc(CAP);
        dp_get_item it = {.key = key, .dst = buf, .cap = CAP};
        dp_detail d;
        dp_detail_clear(&d);
        CHECK_OK_D(dp_client_get(c, &it, 1, &d), &d);
        uint64_t v = ver;
        CHECKF(check_value(buf, it.nbytes, g, f, &v) && v == ver, "%s differs", key);
        /* The other fields of the row were never put. */
        snprintf(key, sizeof key, "%" PRIu64 "@%s", g, field_names[(f + 1) % 4]);
        it = (dp_get_item){.key = key, .dst = buf, .cap = CAP};
        CHECK_ERR(dp_client_get(c, &it, 1, &d), DP_ENOTFOUND);
        free(buf);
    }
}

/*
 * A checkpoint of 2 units (dp_ckpt_save over a client) loaded into 2
 * (dp_ckpt_load), 3 and 1 (re-homed through the client): every live value
 * comes back with its bytes, kind, dtype and
 * shape; overwritten values come back new, cleared rows stay gone; a sparse
 * blob (rows with different fields) too.
 */
DP_TEST(checkpoint_rehomed_into_other_sizes)
{
    char dir[256];
    snprintf(dir, sizeof dir, "/tmp/dp-rehome-%d", (int)getpid());
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    CHECK_EQ(system(cmd), 0);
    cluster a;
    cluster_start(&a, 2, 64 << 20, 60, 10);
    dp_client *c = connect_cl(&a);
    uint64_t g1[40], g2[14], g3[40];
    size_t n3 = 0;
    for (uint64_t i = 0; i < 40; i++)
        g1[i] = i;
    for (uint64_t i = 0; i < 14; i++)
        g2[i] = 3 * i; /* 0, 3, ..., 39: overwritten */
    uint64_t cleared[] = {1, 10, 20};
    for (uint64_t i = 0; i < 40; i++)
        if (i % 3 != 0 && i != 1 && i != 10 && i != 20)
            g3[n3++] = i; /* untouched since the first put */
    batch b1, b2, b3;
    batch_make(&b1, NULL, g1, 40, 3, size_jagged, 1);
    batch_make(&b2, NULL, g2, 14, 3, size_jagged, 2);
    batch_make(&b3, NULL, g3, n3, 3, size_jagged, 1);
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_OK_D(batch_put(c, &b1, NULL, &d), &d);
    CHECK_OK_D(batch_put(c, &b2, NULL, &d), &d);
    uint64_t dropped = 0;
    CHECK_OK_D(dp_client_clear(c, cleared, 3, &dropped, &d), &d);
    /* The sparse blob: 200 rows x 4 fields, one field per row (re-homing puts
     * it per field: a rows x fields grid would be mostly holes). */
    uint64_t gs[200];
    batch bs;
    for (uint64_t i = 0; i < 200; i++)
        gs[i] = 100 + i;
    batch_make(&bs, NULL, gs, 200, 4, size_jagged, 5);
    for (size_t r = 0; r < 200; r++)
        for (size_t f = 0; f < 4; f++)
            if (f != gs[r] / 2 % 4)
                bs.vals[r * 4 + f].kind = DP_KIND_SKIP;
    CHECK_OK_D(batch_put(c, &bs, NULL, &d), &d);
    save_cluster(c, dir);
    dp_client_close(c);
    cluster_stop(&a);

    /* 2: the same shape, dp_ckpt_load (units load their shards); 3, 1: re-homed. */
    uint32_t sizes[] = {2, 3, 1};
    for (size_t k = 0; k < DP_ARRAY_LEN(sizes); k++) {
        cluster b;
        cluster_start(&b, sizes[k], 64 << 20, 60, 10);
        dp_client *cb = connect_cl(&b);
        dp_ckpt_summary sum;
        CHECK_OK_D(dp_ckpt_peek(dir, &sum, &d), &d);
        CHECK_EQ(sum.n_units, 2);
        if (sizes[k] == 2) {
            CHECK_OK_D(dp_ckpt_load(cb, dir, NULL, &sum, &d), &d);
        } else {
            CHECK_ERR_D(dp_ckpt_load(cb, dir, NULL, &sum, &d), DP_EINVAL, &d);
            CHECK_CONTAINS(dp_detail_msg(&d), "dp_ckpt_rehome");
            CHECK_OK_D(dp_ckpt_rehome(cb, dir, NULL, &sum, &d), &d);
        }
        CHECK_EQ(sum.n_units, 2);
        CHECK(sum.loaded > 0);
        batch_verify(cb, &b2, 2);
        batch_verify(cb, &b3, 1);
        sparse_check(cb, 5);
        for (size_t i = 0; i < DP_ARRAY_LEN(cleared); i++) {
            char key[64];
            snprintf(key, sizeof key, "%" PRIu64 "@input_ids", cleared[i]);
            uint8_t buf[16];
            dp_get_item it = {.key = key, .dst = buf, .cap = sizeof buf};
            CHECK_ERR(dp_client_get(cb, &it, 1, &d), DP_ENOTFOUND);
        }
        /* Rows live where gidx % M says (the client finds every one above). */
        uint64_t entries = 0;
        for (uint32_t u = 0; u < sizes[k]; u++)
            entries += (uint64_t)stat_of(cb, u, "entries");
        CHECK_EQ(entries, 14 * 3 + n3 * 3 + 200);
        dp_client_close(cb);
        cluster_stop(&b);
    }
    /* A damaged shard is refused before anything is put. */
    char fix[600];
    snprintf(fix, sizeof fix,
             "f=$(find '%s' -name unit-1.shard | head -1) && "
             "printf 'X' | dd of=\"$f\" bs=1 seek=100 conv=notrunc 2>/dev/null",
             dir);
    CHECK_EQ(system(fix), 0);
    cluster b;
    cluster_start(&b, 3, 64 << 20, 60, 10);
    dp_client *cb = connect_cl(&b);
    dp_ckpt_summary sum;
    CHECK_ERR_D(dp_ckpt_rehome(cb, dir, NULL, &sum, &d), DP_ECORRUPT, &d);
    CHECK_CONTAINS(dp_detail_msg(&d), "unit-1.shard");
    for (uint32_t u = 0; u < 3; u++)
        CHECK_EQ((long long)stat_of(cb, u, "entries"), 0);
    dp_client_close(cb);
    cluster_stop(&b);
    batch_free(&b1);
    batch_free(&b2);
    batch_free(&b3);
    batch_free(&bs);
    CHECK_EQ(system(cmd), 0);
}

DP_TEST(client_killed_between_write_and_commit)
{
    /* Lease of 1 s: the dead client's allocation is retired by the ticker. */
    cluster cl;
    cluster_start(&cl, 2, 32 << 20, 1, 10);
    dp_client *c = connect_cl(&cl);
    pid_t kid = spawn_client(&cl, "doomed", 300, "put:written");
    CHECK_EQ(dp_test_wait_status(kid), -SIGKILL);
    /* Nothing was published. */
    for (uint32_t u = 0; u < 2; u++) {
        CHECK_EQ((long long)stat_of(c, u, "published"), 0);
        CHECK_EQ((long long)stat_of(c, u, "entries"), 0);
    }
    dp_get_item it = {.key = "300@input_ids"};
    CHECK_ERR(dp_client_get(c, &it, 1, NULL), DP_ENOTFOUND);
    /* After the lease: no blob left, only the retired regions are gone. */
    double t0 = dp_test_now();
    while (dp_test_now() - t0 < 10 &&
           (stat_of(c, 0, "blobs") > 0 || stat_of(c, 1, "blobs") > 0))
        dp__sleep_s(0.1);
    for (uint32_t u = 0; u < 2; u++) {
        CHECK_EQ((long long)stat_of(c, u, "blobs"), 0);
        CHECK_EQ((long long)stat_of(c, u, "leases_expired"), 1);
        double retired = stat_of(c, u, "retired_bytes");
        CHECK(retired > 0);
        CHECK_EQ((long long)stat_of(c, u, "allocated_bytes"), (long long)retired);
    }
    /* The units go on serving. */
    uint64_t g[] = {300, 301};
    batch b;
    batch_make(&b, NULL, g, 2, 2, size_jagged, 4);
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_OK_D(batch_put(c, &b, NULL, &d), &d);
    batch_verify(c, &b, 4);
    batch_free(&b);

    /* Killed between alloc and WRITE: same story. */
    kid = spawn_client(&cl, "doomed", 400, "put:allocated");
    CHECK_EQ(dp_test_wait_status(kid), -SIGKILL);
    t0 = dp_test_now();
    while (dp_test_now() - t0 < 10 && stat_of(c, 0, "blobs") + stat_of(c, 1, "blobs") > 2)
        dp__sleep_s(0.1);
    CHECK_EQ((long long)(stat_of(c, 0, "blobs") + stat_of(c, 1, "blobs")), 2);
    dp_client_close(c);
    cluster_stop(&cl);
}

DP_TEST(client_killed_at_random_times)
{
    cluster cl;
    cluster_start(&cl, 2, 32 << 20, 1, 10);
    dp_client *c = connect_cl(&cl);
    uint64_t seed = dp_test_seed();
    int checked = 0;
    for (int round = 0; round < 3; round++) {
        /* Killed while it puts: after its first put of this round landed on
         * both units (the rows alternate between them; one unit's commit
         * alone may leave the other's part of that put to die with it). */
        double c0 = stat_of(c, 0, "commits"), c1 = stat_of(c, 1, "commits");
        pid_t kid = spawn_client(&cl, "loop", 700, NULL);
        double t_up = dp_test_now();
        while (stat_of(c, 0, "commits") <= c0 || stat_of(c, 1, "commits") <= c1) {
            CHECKF(dp_test_now() - t_up < 60, "the client put nothing in 60 s");
            dp__sleep_s(0.01);
        }
        double wait_s = (double)(dp_test_rand(&seed) % 700) / 1000.0;
        dp__sleep_s(wait_s);
        kill(kid, SIGKILL);
        CHECK_EQ(dp_test_wait_status(kid), -SIGKILL);
        /* After the lease, every blob left is published: nothing half-made. */
        double t0 = dp_test_now();
        for (;;) {
            double blobs = stat_of(c, 0, "blobs") + stat_of(c, 1, "blobs");
            double pub = stat_of(c, 0, "published") + stat_of(c, 1, "published");
            if (blobs == pub)
                break;
            CHECKF(dp_test_now() - t0 < 10, "%g blobs, %g published", blobs, pub);
            dp__sleep_s(0.1);
        }
        /* Every key present holds a complete value of one version. */
        const char *f[] = {"input_ids", "logprobs", "reward"};
        for (uint64_t r = 700; r < 716; r++)
            for (uint32_t k = 0; k < 3; k++) {
                char key[64];
                snprintf(key, sizeof key, "%" PRIu64 "@%s", r, f[k]);
                uint8_t *out = malloc(1 << 20);
                dp_get_item it = {.key = key, .dst = out, .cap = 1 << 20};
                int rc = dp_client_get(c, &it, 1, NULL);
                CHECK(rc == 0 || rc == DP_ENOTFOUND);
                uint64_t ver = 0;
                if (rc == 0)
                    CHECKF(check_value(out, it.nbytes, r, k, &ver), "key %s", key);
                checked += rc == 0;
                free(out);
            }
    }
    /* Puts landed before each kill, and a killed overwrite loses no committed value. */
    CHECK_EQ(checked, 3 * 16 * 3);
    dp_client_close(c);
    cluster_stop(&cl);
}

static uint64_t
size_960k(uint64_t gidx, uint32_t f)
{
    (void)gidx;
    (void)f;
    return 960 << 10;
}

static uint64_t
size_30k(uint64_t gidx, uint32_t f)
{
    (void)f;
    return 30000 + gidx % 7;
}

/*
 * Inline puts into a unit whose RAM is full: they spill, their put request
 * answers "pending" and the client polls the commit until the file is
 * written; every value then comes back byte for byte (staged from SSD).
 */
DP_TEST(inline_put_that_spills_is_polled)
{
    char dir[64];
    cluster cl;
    ssd_cluster_start(&cl, 1 << 20, 4 << 20, dir);
    dp_client *c = connect_cl(&cl);
    dp_detail d;
    dp_detail_clear(&d);
    uint64_t g0 = 700;
    batch fill;
    batch_make(&fill, NULL, &g0, 1, 1, size_960k, 1);
    CHECK_OK_D(batch_put(c, &fill, NULL, &d), &d);
    double pi0 = stat_of(c, 0, "puts_inline"), sp0 = stat_of(c, 0, "spills");
    uint64_t g[6];
    for (int i = 0; i < 6; i++)
        g[i] = 701 + (uint64_t)i;
    for (int i = 0; i < 6; i++) {
        batch one;
        batch_make(&one, NULL, &g[i], 1, 1, size_30k, 2);
        CHECK_OK_D(batch_put(c, &one, NULL, &d), &d);
        batch_free(&one);
    }
    CHECK_EQ((long long)(stat_of(c, 0, "puts_inline") - pi0), 6);
    CHECK(stat_of(c, 0, "spills") - sp0 >= 1);
    batch all;
    batch_make(&all, NULL, g, 6, 1, size_30k, 2);
    batch_verify(c, &all, 2);
    batch_verify(c, &fill, 1);
    batch_free(&all);
    batch_free(&fill);
    dp_client_close(c);
    cluster_stop(&cl);
    rmdir(dir);
}

DP_TEST(ssd_tier_spill_and_stage)
{
    /* Put area 4 MiB, IO area 8 MiB: most 1 MiB rows spill to SSD (commit
     * answers "pending" until the file is written) and come back through a
     * stage (resolve answers "pending" until the copy is in the IO area). */
    char dir[64];
    cluster cl;
    ssd_cluster_start(&cl, 4 << 20, 8 << 20, dir);
    dp_client *c = connect_cl(&cl);
    dp_detail d;
    dp_detail_clear(&d);
    uint64_t g[12];
    for (int i = 0; i < 12; i++)
        g[i] = 900 + (uint64_t)i;
    dp_loc locs[12];
    for (int i = 0; i < 12; i++) {
        batch b;
        batch_make(&b, NULL, &g[i], 1, 1, size_1m, 6);
        CHECK_OK_D(
            dp_client_put_locs(c, b.gidxs, 1, b.fields, 1, b.vals, NULL, &locs[i], &d),
            &d);
        batch_free(&b);
    }
    CHECK_EQ((long long)stat_of(c, 0, "published"), 12);
    CHECK(stat_of(c, 0, "spills") >= 8);
    /* With location hints: the spilled blobs are not resident ("pending" to
     * a resolve by blob), so their keys go by key and are staged; every value
     * still comes back whole. */
    {
        batch all;
        batch_make(&all, NULL, g, 12, 1, size_1m, 6);
        uint64_t ver[12], misses;
        for (int i = 0; i < 12; i++)
            ver[i] = 6;
        double by_blob;
        batch_check(c, &all, locs, ver, NULL, &misses, &by_blob);
        CHECK(misses >= 1 && misses <= 12);
        CHECK_EQ(by_blob, 1);
        batch_free(&all);
    }
    /*
     * Every row back, the spilled ones through stages, in one get; again, so
     * that staged copies get evicted by later stages (more than the IO area
     * holds at once).
     */
    batch all;
    batch_make(&all, NULL, g, 12, 1, size_1m, 6);
    for (int rep = 0; rep < 3; rep++)
        batch_verify(c, &all, 6);
    CHECK(stat_of(c, 0, "stages") >= 1);
    batch_free(&all);
    dp_client_close(c);
    cluster_stop(&cl);
    rmdir(dir);
}

/* ---- versions (docs/design.md, "Versions") ---- */

/* c's version clock s seconds ahead, as on a host whose clock is. */
static void
clock_ahead(dp_client *c, double s)
{
    pthread_mutex_lock(&c->mu);
    uint64_t t = (uint64_t)((dp__wall_s() - DP__VER_EPOCH_S + s) * 1e6);
    c->ver_last = t << DP__VER_SALT_BITS | c->ver_salt;
    pthread_mutex_unlock(&c->mu);
}

static double
stat_sum(dp_client *c, const char *name)
{
    double s = 0;
    for (uint32_t u = 0; u < dp_client_n_units(c); u++)
        s += stat_of(c, u, name);
    return s;
}

DP_TEST(versions_a_writer_whose_clock_is_behind_loses_no_update)
{
    cluster cl;
    cluster_start(&cl, 2, 32 << 20, 60, 10);
    dp_client *a = connect_cl(&cl), *b = connect_cl(&cl);
    clock_ahead(a, 3600);
    uint64_t g[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    batch va, vb;
    batch_make(&va, NULL, g, 8, 3, size_jagged, 1);
    batch_make(&vb, NULL, g, 8, 3, size_jagged, 2);
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_OK_D(batch_put(a, &va, NULL, &d), &d);
    /* b's put comes after a's returned, with a version below a's: refused,
     * put again above it, and it is what every reader sees. */
    dp_client_counters k0, k1;
    CHECK_OK(dp_client_counters_get(b, &k0));
    CHECK_OK_D(batch_put(b, &vb, NULL, &d), &d);
    CHECK_OK(dp_client_counters_get(b, &k1));
    CHECK(k1.retries > k0.retries);
    double refused = stat_sum(b, "versions_refused");
    CHECK(refused >= 1);
    batch_verify(b, &vb, 2);
    batch_verify(a, &vb, 2);
    /* b's clock took a's versions up: its next put is refused nowhere. */
    batch vc;
    batch_make(&vc, NULL, g, 8, 3, size_jagged, 3);
    CHECK_OK_D(batch_put(b, &vc, NULL, &d), &d);
    CHECK_EQ(stat_sum(b, "versions_refused"), refused);
    batch_verify(a, &vc, 3);
    batch_free(&va);
    batch_free(&vb);
    batch_free(&vc);
    dp_client_close(a);
    dp_client_close(b);
    cluster_stop(&cl);
}

DP_TEST(versions_a_clear_after_a_put_wins_whatever_the_clocks)
{
    cluster cl;
    cluster_start(&cl, 2, 32 << 20, 60, 10);
    dp_client *a = connect_cl(&cl), *b = connect_cl(&cl);
    clock_ahead(a, 3600);
    uint64_t g[6] = {0, 1, 2, 3, 4, 5};
    batch va;
    batch_make(&va, NULL, g, 6, 2, size_4k, 1);
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_OK_D(batch_put(a, &va, NULL, &d), &d);
    /* b's clear comes after a's put returned, with a version below it: the
     * units refuse it (dropping nothing), it goes again above, and the rows
     * are gone. */
    dp_client_counters k0, k1;
    CHECK_OK(dp_client_counters_get(b, &k0));
    uint64_t dropped = 0;
    CHECK_OK_D(dp_client_clear(b, g, 6, &dropped, &d), &d);
    CHECK_OK(dp_client_counters_get(b, &k1));
    CHECK_EQ_U64(dropped, 12);
    CHECK(k1.retries > k0.retries);
    CHECK(stat_sum(b, "versions_refused") >= 1);
    int want[6] = {DP_ENOTFOUND, DP_ENOTFOUND, DP_ENOTFOUND,
                   DP_ENOTFOUND, DP_ENOTFOUND, DP_ENOTFOUND};
    batch_check(a, &va, NULL, NULL, want, NULL, NULL);
    /* a puts them again: above the clear (refused once if its version is not). */
    batch vb;
    batch_make(&vb, NULL, g, 6, 2, size_4k, 2);
    CHECK_OK_D(batch_put(a, &vb, NULL, &d), &d);
    batch_verify(b, &vb, 2);
    batch_free(&va);
    batch_free(&vb);
    dp_client_close(a);
    dp_client_close(b);
    cluster_stop(&cl);
}

typedef struct race_arg {
    dp_client *c;
    uint64_t base; /* contents' versions: base + round */
    int rounds, fails;
    dp_detail why;
    pthread_barrier_t *start, *end; /* each round starts together; checked after */
    bool clearer;                   /* clears the rows instead of putting them */
} race_arg;

static const uint64_t race_rows[12] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11};

static uint64_t
size_race(uint64_t gidx, uint32_t f)
{
    /* Inline (small) and WRITE-then-commit (large) parts. */
    return gidx % 3 == 0 ? 100000 + f : 512 + f;
}

/* Between a unit's WRITE and its commit: a random pause, so that two writers'
 * commits reach a row's two units in different orders. */
static void
race_hook(const char *stage)
{
    static __thread uint64_t seed;
    if (seed == 0)
        seed = (uint64_t)pthread_self() | 1;
    if (strcmp(stage, "put:written") == 0)
        usleep((useconds_t)(dp_test_rand(&seed) % 1500));
}

static void *
race_main(void *p)
{
    race_arg *a = p;
    uint64_t seed = a->base | 1;
    for (int k = 1; k <= a->rounds; k++) {
        batch b;
        batch_make(&b, NULL, race_rows, 12, 2, size_race, a->base + (uint64_t)k);
        pthread_barrier_wait(a->start);
        if (a->clearer) {
            usleep((useconds_t)(dp_test_rand(&seed) % 2000)); /* amid the puts */
            if (dp_client_clear(a->c, race_rows, 12, NULL, &a->why) != 0)
                a->fails++;
        } else if (batch_put(a->c, &b, NULL, &a->why) != 0) {
            a->fails++;
        }
        pthread_barrier_wait(a->end);
        batch_free(&b);
    }
    return NULL;
}

/* The version tag of key gidx@field f held by unit u (reader routes to u only);
 * 0: not there. */
static uint64_t
copy_tag(dp_client *reader, uint64_t gidx, uint32_t f)
{
    char key[64];
    snprintf(key, sizeof key, "%" PRIu64 "@%s", gidx, field_names[f]);
    uint64_t len = size_race(gidx, f);
    uint8_t *out = malloc(len);
    dp_get_item it = {.key = key, .dst = out, .cap = len};
    dp_detail d;
    dp_detail_clear(&d);
    int rc = dp_client_get(reader, &it, 1, &d);
    if (rc == DP_ENOTFOUND) {
        free(out);
        return 0; /* cleared */
    }
    CHECK_OK_D(rc, &d);
    uint64_t v = 0;
    CHECKF(check_value(out, it.nbytes, gidx, f, &v), "key %s: content is no put's", key);
    free(out);
    return v;
}

DP_TEST(versions_replicas_agree_after_writers_race)
{
    snprintf(tc_replicas, sizeof tc_replicas, "2");
    cluster cl;
    cluster_start(&cl, 3, 32 << 20, 60, 10);
    tc_replicas[0] = '\0';
    dp_client *a = connect_cl(&cl), *b = connect_cl(&cl), *x = connect_cl(&cl);
    CHECK_EQ(dp_client_replicas(a), 2);
    /* a's clock a little ahead: b's puts meet "Stale" too, not only races. */
    clock_ahead(a, 0.002);
    enum { ROUNDS = 30 };
    pthread_barrier_t start, end;
    pthread_barrier_init(&start, NULL, 4);
    pthread_barrier_init(&end, NULL, 4);
    race_arg ra = {.c = a, .base = 1000, .rounds = ROUNDS, .start = &start, .end = &end};
    race_arg rb = {.c = b, .base = 2000, .rounds = ROUNDS, .start = &start, .end = &end};
    /* and x clears the rows, at a random moment amid the puts */
    race_arg rx = {.c = x,
                   .base = 3000,
                   .rounds = ROUNDS,
                   .start = &start,
                   .end = &end,
                   .clearer = true};
    dp_client *rd[3];
    for (uint32_t u = 0; u < 3; u++) {
        rd[u] = connect_cl(&cl);
        rd[u]->only_unit = u; /* a repair's routing: reads the copy unit u holds */
    }
    pthread_t ta, tb;
    dp__client_test_hook = race_hook;
    CHECK(pthread_create(&ta, NULL, race_main, &ra) == 0);
    CHECK(pthread_create(&tb, NULL, race_main, &rb) == 0);
    pthread_t tx;
    CHECK(pthread_create(&tx, NULL, race_main, &rx) == 0);
    /* After each round: every copy of every key holds the same put's value, or
     * none holds it (cleared last). */
    int differ = 0;
    for (int k = 1; k <= ROUNDS; k++) {
        pthread_barrier_wait(&start);
        pthread_barrier_wait(&end);
        for (size_t r = 0; r < 12; r++)
            for (uint32_t f = 0; f < 2; f++) {
                uint64_t g = race_rows[r];
                uint64_t v0 = copy_tag(rd[g % 3], g, f);
                uint64_t v1 = copy_tag(rd[(g + 1) % 3], g, f);
                CHECK(v0 == 0 || v0 == 1000 + (uint64_t)k || v0 == 2000 + (uint64_t)k);
                if (v0 != v1 && differ++ < 5)
                    fprintf(stderr,
                            "round %d, row %" PRIu64 " field %u: copies hold %" PRIu64
                            " and %" PRIu64 "\n",
                            k, g, f, v0, v1);
            }
    }
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
    pthread_join(tx, NULL);
    dp__client_test_hook = NULL;
    pthread_barrier_destroy(&start);
    pthread_barrier_destroy(&end);
    CHECKF(ra.fails == 0, "a: %s", dp_detail_msg(&ra.why));
    CHECKF(rb.fails == 0, "b: %s", dp_detail_msg(&rb.why));
    CHECKF(rx.fails == 0, "x: %s", dp_detail_msg(&rx.why));
    CHECKF(differ == 0, "%d keys whose copies differ", differ);
    for (uint32_t u = 0; u < 3; u++)
        dp_client_close(rd[u]);
    dp_client_close(a);
    dp_client_close(b);
    dp_client_close(x);
    cluster_stop(&cl);
}
