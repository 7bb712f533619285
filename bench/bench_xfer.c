/*
 * bench_xfer: WRITE and READ bandwidth and latency of dp__endpoint between two
 * processes on this host, message sizes 8 B to 64 MiB, buffers larger than the
 * caches. The server is this program re-executed with --server: it allocates a
 * slab with dp__endpoint_alloc (progress thread on), sends its metadata over a
 * socketpair and waits. The client allocates its own buffer the same way,
 * prints the UCX lanes its endpoint uses towards the server, then measures.
 *
 * Bandwidth: each transfer() call carries a batch of ranges of one size
 * (up to 64 ranges or 64 MiB per call), stepping through both buffers so data
 * is not cache-resident; at least --min-mib MiB or --min-ops ranges per
 * repetition. Latency: one blocking single-range transfer() per sample (for
 * WRITE that includes the flush that makes it remote-visible). Every figure is
 * the median over --reps repetitions.
 *
 * Output: the lanes, one table, and "RESULT size wr_GBps rd_GBps wr_us rd_us"
 * lines for bench/xfer_compare.sh and bench/peers/nixl_xfer.py. After each
 * size's figures its bytes are WRITTEN and READ back and compared (a
 * difference exits 1). UCX_TLS etc. come from the environment.
 *
 * Usage: bench_xfer [--buf MiB] [--reps N] [--min-mib N] [--sizes a,b,...]
 *                   [--memcpy-max BYTES] [--hot] [--two-sided]
 *
 * --hot puts every message at offset 0 (as ucx_perftest does, so small and
 * medium sizes are cache-resident): the like-for-like comparison.
 * --two-sided: the server serves two-sided transfers and every op carries a
 * grant, as a unit and its clients do, so that over TCP the ops go as messages
 * (DP_TWO_SIDED=auto: docs/design.md, "Two-sided transfers") instead of UCX's
 * emulated RMA; on one host nothing changes.
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
#include <unistd.h>

#include "common/common.h"
#include "xfer/endpoint.h"

#define MiB (1024ull * 1024)

static int
io_all(int fd, void *p, size_t n, bool wr)
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
die(const char *what, const dp_detail *d)
{
    fprintf(stderr, "bench_xfer: %s: %s\n", what, d ? d->msg : "");
    exit(1);
}

/* --two-sided: the server's hooks take any grant for ranges inside its slab. */
typedef struct slab_span {
    uint64_t base, len;
} slab_span;

static bool
in_slab(const slab_span *s, uint64_t addr, uint64_t len)
{
    return addr >= s->base && len <= s->len && addr - s->base <= s->len - len;
}

static int
bench_write_begin(void *ctx, const uint8_t *grant, size_t grant_len, uint64_t addr,
                  uint64_t len, void **hold, dp_detail *d)
{
    DP_UNUSED(grant);
    DP_UNUSED(grant_len);
    *hold = NULL;
    return in_slab(ctx, addr, len) ? 0 : dp__fail(d, DP_EINVAL, "outside the slab");
}

static void
bench_write_end(void *ctx, void *hold, bool ok)
{
    DP_UNUSED(ctx);
    DP_UNUSED(hold);
    DP_UNUSED(ok);
}

static int
bench_read_begin(void *ctx, const uint8_t *grant, size_t grant_len,
                 const dp__range *ranges, size_t n, void **hold, dp_detail *d)
{
    DP_UNUSED(grant);
    DP_UNUSED(grant_len);
    *hold = NULL;
    for (size_t i = 0; i < n; i++)
        if (!in_slab(ctx, ranges[i].addr, ranges[i].nbytes))
            return dp__fail(d, DP_EINVAL, "outside the slab");
    return 0;
}

static void
bench_read_end(void *ctx, void *hold)
{
    DP_UNUSED(ctx);
    DP_UNUSED(hold);
}

static int
server_main(int fd, uint64_t buf, bool serve)
{
    dp__endpoint_opts o;
    dp__endpoint_opts_init(&o);
    o.progress_thread = true;
    dp_detail d;
    dp__endpoint *ep;
    void *base;
    uint8_t *md;
    size_t md_len;
    if (dp__endpoint_create("bench-server", &o, &ep, &d) != DP_OK)
        die("server create", &d);
    if (dp__endpoint_alloc(ep, buf, &base, &d) != DP_OK)
        die("server alloc", &d);
    memset(base, 1, buf); /* fault the slab in, as a unit does */
    slab_span span = {(uint64_t)(uintptr_t)base, buf};
    dp__xfer_serve hooks = {bench_write_begin, bench_write_end, bench_read_begin,
                            bench_read_end, &span};
    if (serve && dp__endpoint_serve(ep, &hooks, &d) != DP_OK)
        die("server serve", &d);
    if (dp__endpoint_metadata(ep, &md, &md_len, &d) != DP_OK)
        die("server metadata", &d);
    uint64_t hdr[2] = {md_len, (uint64_t)(uintptr_t)base};
    if (io_all(fd, hdr, sizeof hdr, true) != 0 || io_all(fd, md, md_len, true) != 0)
        return 1;
    free(md);
    char c;
    io_all(fd, &c, 1, false);
    dp__endpoint_destroy(ep);
    return 0;
}

static int
cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double
median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

typedef struct ctx {
    dp__endpoint *ep;
    uint64_t lbase, rbase, buf;
    uint64_t loff, roff; /* rolling offsets: walk the buffers */
    bool hot;            /* --hot: always offset 0, like ucx_perftest */
    bool grant;          /* --two-sided: every op carries a grant */
} ctx;

/* One transfer of n ranges; with --two-sided it carries a grant, so that it
 * goes two-sided where the path is (TCP), as a client's ops to a unit do. */
static void
xfer(ctx *c, dp__xfer_op op, const dp__range *l, const dp__range *r, size_t n)
{
    dp__xfer_desc o = {.op = op,
                       .local = l,
                       .n_local = n,
                       .remote = r,
                       .n_remote = n,
                       .remote_name = "bench-server"};
    if (c->grant) {
        o.grant = "bench";
        o.grant_len = 5;
    }
    dp__xfer_result res;
    dp_detail d;
    if (dp__endpoint_transfer_many(c->ep, &o, 1, 60, &res, NULL, &d) != DP_OK)
        die("transfer", &d);
}

/* Bandwidth of one repetition in bytes/s. */
static double
bw_once(ctx *c, dp__xfer_op op, uint64_t size, uint64_t min_bytes, uint64_t min_ops)
{
    enum { BATCH = 64 };
    dp__range l[BATCH], r[BATCH];
    uint64_t ops = DP_MAX(min_ops, (min_bytes + size - 1) / size);
    if (ops > 200000)
        ops = 200000;
    uint64_t per_call = DP_MIN((uint64_t)BATCH, DP_MAX(1, (64 * MiB) / size));
    uint64_t step = c->hot ? 0 : DP_ALIGN_UP(size, 64);
    double t0 = dp__now_s();
    for (uint64_t done = 0; done < ops;) {
        uint64_t k = DP_MIN(per_call, ops - done);
        for (uint64_t i = 0; i < k; i++) {
            if (c->loff + step > c->buf)
                c->loff = 0;
            if (c->roff + step > c->buf)
                c->roff = 0;
            l[i] = (dp__range){c->lbase + c->loff, size};
            r[i] = (dp__range){c->rbase + c->roff, size};
            c->loff += step;
            c->roff += step;
        }
        xfer(c, op, l, r, k);
        done += k;
    }
    return (double)(ops * size) / (dp__now_s() - t0);
}

/* Mean latency of single-range blocking transfers, in seconds. */
static double
lat_once(ctx *c, dp__xfer_op op, uint64_t size, int iters)
{
    uint64_t step = c->hot ? 0 : DP_ALIGN_UP(size, 64);
    double t0 = dp__now_s();
    for (int i = 0; i < iters; i++) {
        if (c->loff + step > c->buf)
            c->loff = 0;
        if (c->roff + step > c->buf)
            c->roff = 0;
        dp__range l = {c->lbase + c->loff, size}, r = {c->rbase + c->roff, size};
        c->loff += step;
        c->roff += step;
        xfer(c, op, &l, &r, 1);
    }
    return (dp__now_s() - t0) / iters;
}

/*
 * Content: a pattern WRITTEN to the server and READ back into another part of
 * the client's buffer comes back byte for byte (no figure of a transfer that
 * moves the wrong bytes). Exits on a difference.
 */
static void
check_roundtrip(ctx *c, uint64_t size)
{
    if (2 * size > c->buf)
        return;
    uint8_t *l = (uint8_t *)(uintptr_t)c->lbase;
    for (uint64_t i = 0; i < size; i++)
        l[i] = (uint8_t)(i * 131 + size + (i >> 12));
    memset(l + size, 0, size);
    dp__range a = {c->lbase, size}, b = {c->lbase + size, size}, r = {c->rbase, size};
    xfer(c, DP_XFER_WRITE, &a, &r, 1);
    xfer(c, DP_XFER_READ, &b, &r, 1);
    if (memcmp(l, l + size, size) != 0) {
        fprintf(stderr, "bench_xfer: %" PRIu64 " bytes WRITTEN and READ back differ\n",
                size);
        exit(1);
    }
}

int
main(int argc, char **argv)
{
    uint64_t buf_mib = 512, min_mib = 512;
    int reps = 5;
    int64_t memcpy_max = 0;
    bool hot = false, two_sided = false;
    const char *sizes_arg =
        "8,64,512,4096,32768,262144,1048576,4194304,16777216,67108864";
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--server") == 0 && i + 3 < argc)
            return server_main(atoi(argv[i + 1]), strtoull(argv[i + 2], NULL, 0),
                               strcmp(argv[i + 3], "1") == 0);
        else if (strcmp(argv[i], "--buf") == 0 && i + 1 < argc)
            buf_mib = strtoull(argv[++i], NULL, 0);
        else if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc)
            reps = atoi(argv[++i]);
        else if (strcmp(argv[i], "--min-mib") == 0 && i + 1 < argc)
            min_mib = strtoull(argv[++i], NULL, 0);
        else if (strcmp(argv[i], "--sizes") == 0 && i + 1 < argc)
            sizes_arg = argv[++i];
        else if (strcmp(argv[i], "--hot") == 0)
            hot = true;
        else if (strcmp(argv[i], "--two-sided") == 0)
            two_sided = true;
        else if (strcmp(argv[i], "--memcpy-max") == 0 && i + 1 < argc)
            memcpy_max = strtoll(argv[++i], NULL, 0);
        else {
            fprintf(stderr,
                    "usage: %s [--buf MiB] [--reps N] [--min-mib N] [--sizes a,b,..] "
                    "[--memcpy-max BYTES (-1: off)] [--hot] [--two-sided]\n",
                    argv[0]);
            return 2;
        }
    }
    if (reps < 1 || reps > 100)
        reps = 5;
    uint64_t buf = buf_mib * MiB;

    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
        return 1;
    pid_t pid = fork();
    if (pid == 0) {
        fcntl(sv[1], F_SETFD, 0);
        char fdb[16], bb[32];
        snprintf(fdb, sizeof fdb, "%d", sv[1]);
        snprintf(bb, sizeof bb, "%" PRIu64, buf);
        execl("/proc/self/exe", "bench_xfer", "--server", fdb, bb, two_sided ? "1" : "0",
              (char *)NULL);
        _exit(127);
    }
    close(sv[1]);
    uint64_t hdr[2];
    if (io_all(sv[0], hdr, sizeof hdr, false) != 0 || hdr[0] > (64u << 20)) {
        fprintf(stderr, "bench_xfer: server did not start\n");
        return 1;
    }
    uint8_t *md = malloc(hdr[0]);
    if (md == NULL || io_all(sv[0], md, hdr[0], false) != 0)
        return 1;

    dp__endpoint_opts o;
    dp__endpoint_opts_init(&o);
    o.memcpy_max = memcpy_max;
    dp_detail d;
    ctx c = {.buf = buf, .rbase = hdr[1], .hot = hot, .grant = two_sided};
    void *lb;
    if (dp__endpoint_create("bench-client", &o, &c.ep, &d) != DP_OK)
        die("create", &d);
    if (dp__endpoint_alloc(c.ep, buf, &lb, &d) != DP_OK)
        die("alloc", &d);
    memset(lb, 2, buf);
    c.lbase = (uint64_t)(uintptr_t)lb;
    double t_add = dp__now_s();
    if (dp__endpoint_add_remote(c.ep, md, hdr[0], NULL, &d) != DP_OK)
        die("add_remote", &d);
    t_add = dp__now_s() - t_add;
    char *info = NULL;
    if (dp__endpoint_describe_remote(c.ep, "bench-server", &info, &d) != DP_OK)
        die("describe", &d);
    const char *tls = getenv("UCX_TLS");
    printf("# bench_xfer: buffers %" PRIu64 " MiB each side%s, %d reps (medians), "
           "UCX_TLS=%s, memcpy fast path up to %s bytes\n",
           buf_mib, hot ? " (--hot: every message at offset 0, cache-resident)" : "",
           reps, tls ? tls : "(default)",
           memcpy_max < 0    ? "0 (off)"
           : memcpy_max == 0 ? "65536"
                             : "custom");
    printf("# add_remote (connect, unpack, pre-fault %" PRIu64 " MiB): %.3f s\n", buf_mib,
           t_add);
    printf("# UCX lanes of the client endpoint towards the server:\n%s", info);
    free(info);

    printf("\n%10s %12s %12s %12s %12s\n", "size", "WRITE GB/s", "READ GB/s", "WRITE us",
           "READ us");
    char *sizes = strdup(sizes_arg), *save = NULL;
    for (char *tok = strtok_r(sizes, ",", &save); tok != NULL;
         tok = strtok_r(NULL, ",", &save)) {
        uint64_t size = strtoull(tok, NULL, 0);
        if (size == 0 || size > buf)
            continue;
        double wbw[100], rbw[100], wl[100], rl[100];
        int lat_iters = size <= 64 * 1024 ? 2000 : size <= 4 * MiB ? 200 : 20;
        bw_once(&c, DP_XFER_WRITE, size, min_mib * MiB / 4, 16); /* warm-up */
        bw_once(&c, DP_XFER_READ, size, min_mib * MiB / 4, 16);
        for (int k = 0; k < reps; k++) {
            wbw[k] = bw_once(&c, DP_XFER_WRITE, size, min_mib * MiB, 16);
            rbw[k] = bw_once(&c, DP_XFER_READ, size, min_mib * MiB, 16);
            wl[k] = lat_once(&c, DP_XFER_WRITE, size, lat_iters);
            rl[k] = lat_once(&c, DP_XFER_READ, size, lat_iters);
        }
        double mw = median(wbw, reps), mr = median(rbw, reps), lw = median(wl, reps),
               lr = median(rl, reps);
        printf("%10" PRIu64 " %12.3f %12.3f %12.2f %12.2f\n", size, mw / 1e9, mr / 1e9,
               lw * 1e6, lr * 1e6);
        check_roundtrip(&c, size);
        printf("RESULT %" PRIu64 " %.4f %.4f %.3f %.3f\n", size, mw / 1e9, mr / 1e9,
               lw * 1e6, lr * 1e6);
        fflush(stdout);
    }
    free(sizes);
    dp__endpoint_stats st;
    dp__endpoint_get_stats(c.ep, &st);
    printf("# ranges by memcpy fast path: %" PRIu64 ", by UCX put/get: %" PRIu64 "\n",
           st.memcpy_ranges, st.ucx_ranges);
    dp__endpoint_destroy(c.ep);
    io_all(sv[0], "q", 1, true);
    waitpid(pid, NULL, 0);
    free(md);
    return 0;
}
