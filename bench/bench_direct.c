/*
 * bench_direct: fetch bandwidth and latency of the direct transport between two
 * processes on this host, for objects of one buffer from 4 KiB to 256 MiB,
 * with the publisher's buffer registered (per-buffer registration) or copied
 * into its pre-registered pool; plus the publisher-side cost of publish+free
 * (registration and deregistration, or the pool copy) per MiB.
 *
 *   bench_direct [--sizes a,b,c] [--reps N] [--min-mib M] [--targets new|own]
 *                [--chunk BYTES] [--lanes]
 *
 * The publisher is this program re-executed (DP_BENCH_PEER=publisher): it
 * allocates the buffer with malloc, fills it, publishes it and hands the
 * metadata back over a socketpair. The fetcher fetches it repeatedly into one
 * permanently registered target (--targets own, the default) or into new
 * buffers the transport allocates (--targets new), checks the bytes of the
 * first fetch, and prints the median of each size:
 *
 *   RESULT <mode> <bytes> <GB/s> <median us per fetch> <publish us>
 *   REGCOST <bytes> <register+free us/MiB> <pool publish+free us/MiB>
 *
 * GB/s is 1e9 bytes per second. Timings are medians over the repetitions.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "dataplane/direct.h"
#include "direct/direct.h"
#include "bench_util.h"

#define MiB (1024ull * 1024)

static double
now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void
fill(uint8_t *p, uint64_t n, uint64_t seed)
{
    uint64_t k = 0;
    for (; k + 8 <= n; k += 8) {
        uint64_t z = (k / 8 + 1) * 0x9e3779b97f4a7c15ull ^ seed;
        memcpy(p + k, &z, 8);
    }
    for (; k < n; k++)
        p[k] = (uint8_t)(k * 7 + seed);
}

static int
io_all(int fd, void *p, size_t n, int wr)
{
    uint8_t *c = p;
    while (n > 0) {
        ssize_t k = wr ? write(fd, c, n) : read(fd, c, n);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return -1;
        c += k;
        n -= (size_t)k;
    }
    return 0;
}

static void
die(const char *what, int rc, const dp_detail *d)
{
    fprintf(stderr, "bench_direct: %s: %s: %s\n", what, dp_errname(rc), dp_detail_msg(d));
    exit(1);
}

/* ---- publisher ---- */

typedef struct cmd {
    uint32_t op; /* 1 publish, 2 free, 3 quit */
    uint32_t pool;
    uint64_t size;
} cmd;

static void
publisher_main(void)
{
    int fd = atoi(getenv("DP_BENCH_FD"));
    uint64_t pool_bytes = strtoull(getenv("DP_BENCH_POOL"), NULL, 0);
    dp_detail d;
    dp_detail_clear(&d);
    dp_direct_opts o;
    dp_direct_opts_init(&o);
    o.name = "bench-pub";
    dp_direct *reg = NULL, *pool = NULL;
    int rc = dp_direct_create(&o, &reg, &d);
    if (rc != DP_OK)
        die("publisher create", rc, &d);
    o.name = "bench-pub-pool";
    o.pool_bytes = pool_bytes;
    if ((rc = dp_direct_create(&o, &pool, &d)) != DP_OK)
        die("publisher create (pool)", rc, &d);
    uint8_t *buf = NULL;
    cmd c;
    while (io_all(fd, &c, sizeof c, 0) == 0 && c.op != 3) {
        dp_direct *t = c.pool ? pool : reg;
        if (c.op == 1) {
            free(buf);
            buf = aligned_alloc(4096, (c.size + 4095) & ~4095ull);
            fill(buf, c.size, c.size);
            dp_direct_buf b = {buf, c.size};
            uint8_t *md = NULL;
            size_t len = 0;
            double t0 = now_s();
            if ((rc = dp_direct_publish(t, "bench", &b, 1, &md, &len, &d)) != DP_OK)
                die("publish", rc, &d);
            double us = (now_s() - t0) * 1e6;
            uint64_t hdr[2] = {len, 0};
            memcpy(&hdr[1], &us, 8);
            io_all(fd, hdr, sizeof hdr, 1);
            io_all(fd, md, len, 1);
            free(md);
        } else if (c.op == 2) {
            dp_direct_free(t, "bench", NULL);
            uint64_t ok = 1;
            io_all(fd, &ok, sizeof ok, 1);
        }
    }
    free(buf);
    dp_direct_destroy(pool, NULL);
    dp_direct_destroy(reg, NULL);
    _exit(0);
}

__attribute__((constructor)) static void
peer_ctor(void)
{
    const char *m = getenv("DP_BENCH_PEER");
    if (m != NULL && strcmp(m, "publisher") == 0)
        publisher_main();
}

/* ---- fetcher ---- */

static int peer_fd;

static uint8_t *
remote_publish(uint64_t size, int pool, size_t *len, double *pub_us)
{
    cmd c = {1, (uint32_t)pool, size};
    uint64_t hdr[2];
    if (io_all(peer_fd, &c, sizeof c, 1) != 0 || io_all(peer_fd, hdr, sizeof hdr, 0) != 0)
        die("publisher gone", DP_ECLOSED, NULL);
    uint8_t *md = malloc(hdr[0]);
    io_all(peer_fd, md, hdr[0], 0);
    *len = hdr[0];
    memcpy(pub_us, &hdr[1], 8);
    return md;
}

static void
remote_free(int pool)
{
    cmd c = {2, (uint32_t)pool, 0};
    uint64_t ok;
    io_all(peer_fd, &c, sizeof c, 1);
    io_all(peer_fd, &ok, sizeof ok, 0);
}

/* ---- options ---- */

typedef struct direct_cfg {
    uint64_t sizes[32];
    int n_sizes, reps;
    uint64_t min_mib;
    int own_targets, lanes;
    size_t chunk;
    uint64_t max_size; /* the largest of sizes */
} direct_cfg;

/* 0, or 2 after printing the usage line. */
static int
parse_args(int argc, char **argv, direct_cfg *c)
{
    memset(c, 0, sizeof *c);
    c->reps = 7;
    c->min_mib = 512;
    c->own_targets = 1;
    const char *list = "4096,65536,1048576,16777216,67108864,268435456";
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--sizes") == 0 && i + 1 < argc)
            list = argv[++i];
        else if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc)
            c->reps = atoi(argv[++i]);
        else if (strcmp(argv[i], "--min-mib") == 0 && i + 1 < argc)
            c->min_mib = strtoull(argv[++i], NULL, 0);
        else if (strcmp(argv[i], "--chunk") == 0 && i + 1 < argc)
            c->chunk = strtoull(argv[++i], NULL, 0);
        else if (strcmp(argv[i], "--lanes") == 0)
            c->lanes = 1;
        else if (strcmp(argv[i], "--targets") == 0 && i + 1 < argc)
            c->own_targets = strcmp(argv[++i], "new") != 0;
        else {
            fprintf(stderr, "usage: bench_direct [--sizes a,b] [--reps N] [--min-mib M] "
                            "[--targets own|new] [--chunk BYTES] [--lanes]\n");
            return 2;
        }
    }
    for (char *s = strdup(list), *save = NULL, *tok = strtok_r(s, ",", &save);
         tok != NULL && c->n_sizes < 32; tok = strtok_r(NULL, ",", &save))
        c->sizes[c->n_sizes++] = strtoull(tok, NULL, 0);
    if (c->reps < 1)
        c->reps = 1;
    for (int i = 0; i < c->n_sizes; i++)
        c->max_size = c->sizes[i] > c->max_size ? c->sizes[i] : c->max_size;
    return 0;
}

/* This program re-executed as the publisher, on the other end of peer_fd. */
static int
spawn_publisher(uint64_t max_size, pid_t *pid)
{
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
        return -1;
    char fdb[16], poolb[32];
    snprintf(fdb, sizeof fdb, "%d", sv[1]);
    snprintf(poolb, sizeof poolb, "%llu", (unsigned long long)(max_size + MiB));
    *pid = fork();
    if (*pid == 0) {
        fcntl(sv[1], F_SETFD, 0);
        setenv("DP_BENCH_PEER", "publisher", 1);
        setenv("DP_BENCH_FD", fdb, 1);
        setenv("DP_BENCH_POOL", poolb, 1);
        execl("/proc/self/exe", "bench_direct", (char *)NULL);
        _exit(127);
    }
    close(sv[1]);
    peer_fd = sv[0];
    return 0;
}

/* ---- fetch bandwidth and latency ---- */

/* One fetch and wait, into target (own targets) or a new buffer. Seconds. */
static double
fetch_once(dp_direct *t, const direct_cfg *c, const uint8_t *md, size_t md_len,
           uint8_t *target, uint64_t size, dp_direct_req **r)
{
    dp_detail d;
    dp_detail_clear(&d);
    dp_direct_buf b = {target, size};
    double t0 = now_s();
    int rc;
    if ((rc = dp_direct_fetch(t, "bench", md, md_len, c->own_targets ? &b : NULL, 1, r,
                              &d)) != DP_OK ||
        (rc = dp_direct_wait(*r, -1, &d)) != DP_OK)
        die("fetch", rc, &d);
    return now_s() - t0;
}

static void
print_lanes(dp_direct *t, int pool)
{
    char *info = NULL;
    const char *pn = pool ? "bench-pub-pool" : "bench-pub";
    if (dp__direct_describe_remote(t, pn, &info, NULL) == DP_OK)
        printf("# lanes towards %s:\n%s\n", pn, info);
    free(info);
}

/*
 * One RESULT line: the median of the fetches of one object of one size. 0, or
 * -1 when the first fetch brought the wrong bytes.
 */
static int
fetch_size(dp_direct *t, const direct_cfg *c, int pool, int si, uint8_t *target,
           uint8_t *expect)
{
    static double v[100000];
    uint64_t size = c->sizes[si];
    size_t md_len;
    double pub_us;
    uint8_t *md = remote_publish(size, pool, &md_len, &pub_us);
    int n = c->reps;
    uint64_t want = c->min_mib * MiB / size;
    if ((uint64_t)n < want)
        n = want > 100000 ? 100000 : (int)want;
    fill(expect, size, size);
    for (int k = -1; k < n; k++) { /* k = -1: warm-up (connects the remote) */
        dp_direct_req *r = NULL;
        double dt = fetch_once(t, c, md, md_len, target, size, &r);
        if (k < 0 && c->lanes && si == 0)
            print_lanes(t, pool);
        if (k < 0) {
            void *a;
            size_t len;
            dp_direct_req_buffer(r, 0, &a, &len);
            if (len != size || memcmp(a, expect, size) != 0) {
                fprintf(stderr, "bench_direct: wrong bytes at size %llu\n",
                        (unsigned long long)size);
                return -1;
            }
        } else {
            v[k] = dt;
        }
        dp_direct_req_destroy(r);
    }
    double med = bench_median(v, n);
    printf("RESULT %-5s %11llu %9.3f %12.2f %12.1f\n", pool ? "pool" : "reg",
           (unsigned long long)size, (double)size / med / 1e9, med * 1e6, pub_us);
    fflush(stdout);
    remote_free(pool);
    free(md);
    return 0;
}

/* Every size from the registering publisher, then from the pool one. 0 or -1. */
static int
fetch_phase(dp_direct *t, const direct_cfg *c, uint8_t *target)
{
    uint8_t *expect = malloc(c->max_size);
    printf("# bench_direct: one-buffer objects, %d+ reps (at least %llu MiB per size), "
           "targets %s, medians\n",
           c->reps, (unsigned long long)c->min_mib,
           c->own_targets ? "own (registered once)" : "new");
    printf("# %-5s %11s %9s %12s %12s\n", "mode", "bytes", "GB/s", "us/fetch",
           "publish us");
    for (int pool = 0; pool <= 1; pool++) {
        for (int si = 0; si < c->n_sizes; si++) {
            if (fetch_size(t, c, pool, si, target, expect) != 0)
                return -1;
        }
    }
    free(expect);
    return 0;
}

/* ---- publisher-side cost ---- */

/* One REGCOST line: publish + free of src's first size bytes, us per MiB. */
static void
regcost_size(dp_direct *lr, dp_direct *lp, const direct_cfg *c, uint8_t *src,
             uint64_t size)
{
    dp_detail d;
    dp_detail_clear(&d);
    double vr[64], vp[64];
    int n = c->reps < 64 ? c->reps : 64;
    for (int k = 0; k < n; k++) {
        for (int pool = 0; pool <= 1; pool++) {
            dp_direct_buf b = {src, size};
            uint8_t *md = NULL;
            size_t len = 0;
            int rc;
            double t0 = now_s();
            if ((rc = dp_direct_publish(pool ? lp : lr, "c", &b, 1, &md, &len, &d)) !=
                    DP_OK ||
                (rc = dp_direct_free(pool ? lp : lr, "c", &d)) != DP_OK)
                die("publish/free", rc, &d);
            double dt = (now_s() - t0) * 1e6 / ((double)size / MiB);
            (pool ? vp : vr)[k] = dt;
            free(md);
        }
    }
    printf("REGCOST %11llu %14.1f %14.1f\n", (unsigned long long)size,
           bench_median(vr, n), bench_median(vp, n));
}

/* Publisher-side cost of publish + free, measured here on local buffers. */
static void
regcost_phase(const direct_cfg *c, dp_direct_opts *o)
{
    dp_detail d;
    dp_detail_clear(&d);
    int rc;
    o->name = "bench-regcost";
    o->pool_bytes = c->max_size + MiB;
    dp_direct *lp = NULL;
    if ((rc = dp_direct_create(o, &lp, &d)) != DP_OK)
        die("create (pool)", rc, &d);
    o->pool_bytes = 0;
    o->name = "bench-regcost2";
    dp_direct *lr = NULL;
    if ((rc = dp_direct_create(o, &lr, &d)) != DP_OK)
        die("create", rc, &d);
    printf("# publish+free cost per MiB (median of %d): registration vs pool copy\n",
           c->reps);
    printf("# %-7s %11s %14s %14s\n", "", "bytes", "reg us/MiB", "pool us/MiB");
    uint8_t *src = aligned_alloc(4096, (c->max_size + 4095) & ~4095ull);
    fill(src, c->max_size, 1);
    for (int si = 0; si < c->n_sizes; si++)
        regcost_size(lr, lp, c, src, c->sizes[si]);
    dp_direct_destroy(lp, NULL);
    dp_direct_destroy(lr, NULL);
    free(src);
}

int
main(int argc, char **argv)
{
    direct_cfg c;
    if (parse_args(argc, argv, &c) != 0)
        return 2;
    pid_t pid;
    if (spawn_publisher(c.max_size, &pid) != 0)
        return 1;

    dp_detail d;
    dp_detail_clear(&d);
    dp_direct_opts o;
    dp_direct_opts_init(&o);
    o.name = "bench-fetch";
    o.chunk_bytes = c.chunk;
    dp_direct *t = NULL;
    int rc = dp_direct_create(&o, &t, &d);
    if (rc != DP_OK)
        die("create", rc, &d);
    uint8_t *target = aligned_alloc(4096, (c.max_size + 4095) & ~4095ull);
    memset(target, 0, c.max_size);
    if (c.own_targets &&
        (rc = dp_direct_register_permanent(t, target, c.max_size, &d)) != DP_OK)
        die("register target", rc, &d);

    if (fetch_phase(t, &c, target) != 0)
        return 1;
    regcost_phase(&c, &o);

    cmd q = {3, 0, 0};
    io_all(peer_fd, &q, sizeof q, 1);
    waitpid(pid, NULL, 0);
    dp_direct_destroy(t, NULL);
    free(target);
    return 0;
}
