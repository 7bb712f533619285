/*
 * bench_client: put and get throughput (GB/s) and batch latency (p50/p99) of
 * the client library against N storage units started as child processes
 * (this program re-executed in unit mode), next to single-thread memcpy of the
 * same bytes in the same value-sized pieces over buffers larger than the
 * caches, measured in the same loop (so both see the same machine load).
 * Ratios are printed; figures are medians.
 *
 * Shapes: 64 rows x 1 field x 1 MiB ("large") and 1024 rows x 4 fields x
 * 4 KiB ("small"). Each shape runs twice: values in memory registered with
 * the client (dp_client_alloc: put WRITEs straight from it, get READs straight
 * into it) and values in plain malloc memory (one extra copy through the
 * client's staging buffer).
 *
 *   bench_client [--units N] [--reps R] [--slab-mib M] [--shape large|small]
 *                [--memory registered|malloc]
 */
#include <getopt.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/common.h"
#include "ctl/ctl.h"
#include "dataplane/client.h"
#include "unit/server.h"
#include "unit/unit.h"
#include "xfer/endpoint.h"
#include "bench_util.h"

/* ---- unit mode ---- */

static int
unit_main(void)
{
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    dp_detail d;
    dp_detail_clear(&d);
    int fd = atoi(getenv("DP_BC_FD"));
    uint32_t id = (uint32_t)atoi(getenv("DP_BC_UNIT_ID"));
    char name[64];
    snprintf(name, sizeof name, "bench-unit-%u-%ld", id, (long)getpid());
    dp__unit_opts o;
    dp__unit_opts_init(&o);
    o.unit_id = id;
    o.n_units = (uint32_t)atoi(getenv("DP_BC_UNITS"));
    o.slab_bytes = strtoull(getenv("DP_BC_SLAB"), NULL, 10);
    o.numa = DP_UNIT_NUMA_AUTO;
    dp__unit_server *srv = NULL;
    if (dp__unit_server_open(&o, name, "127.0.0.1", 0, 1.0, &srv, &d) != 0)
        goto fail;
    dprintf(fd, "%s\n", dp__unit_server_address(srv));
    close(fd);
    int sig;
    sigwait(&sigs, &sig);
    dp__unit_server_close(srv);
    return 0;
fail:
    fprintf(stderr, "bench unit: %s\n", dp_detail_msg(&d));
    return 1;
}

__attribute__((constructor)) static void
unit_mode(void)
{
    if (getenv("DP_BC_UNIT_ID") != NULL)
        _exit(unit_main());
}

static pid_t
start_unit(uint32_t id, uint32_t n, uint64_t slab, char *addr, size_t cap)
{
    int fds[2];
    if (pipe(fds) != 0)
        exit(1);
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        close(fds[0]);
        char b[32];
        snprintf(b, sizeof b, "%d", fds[1]);
        setenv("DP_BC_FD", b, 1);
        snprintf(b, sizeof b, "%u", id);
        setenv("DP_BC_UNIT_ID", b, 1);
        snprintf(b, sizeof b, "%u", n);
        setenv("DP_BC_UNITS", b, 1);
        snprintf(b, sizeof b, "%" PRIu64, slab);
        setenv("DP_BC_SLAB", b, 1);
        char *argv[] = {"bench_client", NULL};
        execv("/proc/self/exe", argv);
        _exit(127);
    }
    close(fds[1]);
    size_t k = 0;
    while (k + 1 < cap && read(fds[0], addr + k, 1) == 1 && addr[k] != '\n')
        k++;
    addr[k] = '\0';
    close(fds[0]);
    if (k == 0) {
        fprintf(stderr, "unit %u did not start\n", id);
        exit(1);
    }
    return pid;
}

/* ---- measurement ---- */

static double
pct(double *v, int n, double p)
{
    qsort(v, (size_t)n, sizeof *v, bench_cmp_double);
    int i = (int)(p * (n - 1) + 0.5);
    return v[i];
}

/* Single-thread memcpy of n_pieces x piece bytes from/to buffers of span bytes,
 * moving through the span so every batch touches cold memory. Returns seconds. */
static double
memcpy_batch(uint8_t *dst, const uint8_t *src, size_t span, size_t piece, size_t n_pieces,
             size_t *cursor)
{
    double t0 = dp__now_s();
    for (size_t i = 0; i < n_pieces; i++) {
        if (*cursor + piece > span)
            *cursor = 0;
        memcpy(dst + *cursor, src + *cursor, piece);
        *cursor += piece;
    }
    return dp__now_s() - t0;
}

typedef struct shape {
    const char *name;
    size_t rows, fields, bytes;
} shape;

static const char *fnames[] = {"f0", "f1", "f2", "f3"};

/* The memcpy comparison's buffers (larger than the caches). */
static uint8_t *mc_src, *mc_dst;
static size_t mc_span, mc_cursor;

static void
run_shape(dp_client *c, const shape *s, bool registered, int reps)
{
    size_t nc = s->rows * s->fields;
    size_t total = nc * s->bytes;
    uint8_t *src = NULL, *dst = NULL;
    dp_detail d;
    dp_detail_clear(&d);
    if (registered) {
        if (dp_client_alloc(c, total, (void **)&src, &d) != 0 ||
            dp_client_alloc(c, total, (void **)&dst, &d) != 0) {
            fprintf(stderr, "alloc: %s\n", dp_detail_msg(&d));
            exit(1);
        }
    } else {
        src = malloc(total);
        dst = malloc(total);
    }
    for (size_t i = 0; i < total; i++)
        src[i] = (uint8_t)(i * 131 + 7);
    memset(dst, 0, total);
    uint64_t *g = malloc(s->rows * sizeof *g);
    dp_value *v = calloc(nc, sizeof *v);
    dp_get_item *it = calloc(nc, sizeof *it);
    char(*keys)[32] = calloc(nc, sizeof *keys);
    for (size_t r = 0; r < s->rows; r++) {
        g[r] = r;
        for (size_t f = 0; f < s->fields; f++) {
            size_t i = r * s->fields + f;
            v[i] = (dp_value){src + i * s->bytes, s->bytes, DP_KIND_BYTES, NULL, NULL, 0};
            snprintf(keys[i], sizeof keys[i], "%zu@%s", r, fnames[f]);
            it[i] =
                (dp_get_item){.key = keys[i], .dst = dst + i * s->bytes, .cap = s->bytes};
        }
    }
    double *tp = malloc((size_t)reps * sizeof *tp),
           *tg = malloc((size_t)reps * sizeof *tg);
    double *tm = malloc((size_t)reps * sizeof *tm);
    for (int k = -2; k < reps; k++) {
        /* memcpy of the same bytes in the same pieces, interleaved with the
         * operations so both see the same machine load. */
        double tmc = memcpy_batch(mc_dst, mc_src, mc_span, s->bytes, nc, &mc_cursor);
        double t0 = dp__now_s();
        if (dp_client_put(c, g, s->rows, fnames, s->fields, v, NULL, &d) != 0) {
            fprintf(stderr, "put: %s\n", dp_detail_msg(&d));
            exit(1);
        }
        double t1 = dp__now_s();
        if (dp_client_get(c, it, nc, &d) != 0) {
            fprintf(stderr, "get: %s\n", dp_detail_msg(&d));
            exit(1);
        }
        double t2 = dp__now_s();
        if (k >= 0) {
            tp[k] = t1 - t0;
            tg[k] = t2 - t1;
            tm[k] = tmc;
        }
    }
    if (memcmp(src, dst, total) != 0) {
        fprintf(stderr, "get returned different bytes\n");
        exit(1);
    }
    double p50p = pct(tp, reps, 0.5), p99p = pct(tp, reps, 0.99);
    double p50g = pct(tg, reps, 0.5), p99g = pct(tg, reps, 0.99);
    double gp = (double)total / p50p / 1e9, gg = (double)total / p50g / 1e9;
    double memcpy_gbs = (double)total / pct(tm, reps, 0.5) / 1e9;
    printf("%-6s %-10s memcpy %5.2f GB/s | put %5.2f GB/s (%.2fx) p50 %6.2f ms p99 %6.2f "
           "ms | get %5.2f GB/s (%.2fx) p50 %6.2f ms p99 %6.2f ms\n",
           s->name, registered ? "registered" : "malloc", memcpy_gbs, gp, gp / memcpy_gbs,
           p50p * 1e3, p99p * 1e3, gg, gg / memcpy_gbs, p50g * 1e3, p99g * 1e3);
    free(tm);
    if (registered) {
        dp_client_free(c, src);
        dp_client_free(c, dst);
    } else {
        free(src);
        free(dst);
    }
    free(g);
    free(v);
    free(it);
    free(keys);
    free(tp);
    free(tg);
}

int
main(int argc, char **argv)
{
    uint32_t n_units = 2;
    int reps = 21;
    uint64_t slab_mib = 256;
    const char *only_shape = NULL, *only_mem = NULL;
    static const struct option lo[] = {{"units", required_argument, NULL, 'u'},
                                       {"reps", required_argument, NULL, 'r'},
                                       {"slab-mib", required_argument, NULL, 's'},
                                       {"shape", required_argument, NULL, 'S'},
                                       {"memory", required_argument, NULL, 'm'},
                                       {"help", no_argument, NULL, 'h'},
                                       {NULL, 0, NULL, 0}};
    static const char usage[] =
        "usage: bench_client [--units N (1-8, 2)] [--reps R (>= 3, 21)]\n"
        "                    [--slab-mib M (256)] [--shape large|small (both)]\n"
        "                    [--memory registered|malloc (both)]\n";
    int ch;
    while ((ch = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        if (ch == 'u')
            n_units = (uint32_t)atoi(optarg);
        else if (ch == 'r')
            reps = atoi(optarg);
        else if (ch == 's')
            slab_mib = strtoull(optarg, NULL, 10);
        else if (ch == 'S')
            only_shape = optarg;
        else if (ch == 'm')
            only_mem = optarg;
        else if (ch == 'h') {
            fputs(usage, stdout);
            return 0;
        } else {
            fputs(usage, stderr);
            return 2;
        }
    }
    if (n_units < 1 || n_units > 8 || reps < 3 ||
        (only_shape != NULL && strcmp(only_shape, "large") != 0 &&
         strcmp(only_shape, "small") != 0) ||
        (only_mem != NULL && strcmp(only_mem, "registered") != 0 &&
         strcmp(only_mem, "malloc") != 0)) {
        fputs(usage, stderr);
        return 2;
    }
    char addr[8][128];
    const char *addrs[8];
    pid_t pids[8];
    for (uint32_t u = 0; u < n_units; u++) {
        pids[u] = start_unit(u, n_units, slab_mib << 20, addr[u], sizeof addr[u]);
        addrs[u] = addr[u];
    }
    dp_client *c = NULL;
    dp_detail d;
    dp_detail_clear(&d);
    if (dp_client_open_units(addrs, n_units, NULL, &c, &d) != 0) {
        fprintf(stderr, "open: %s\n", dp_detail_msg(&d));
        return 1;
    }
    printf("bench_client: %u units (slab %" PRIu64 " MiB each), %d reps, medians\n",
           n_units, slab_mib, reps);
    static const shape shapes[] = {{"large", 64, 1, 1 << 20}, {"small", 1024, 4, 4096}};
    /* memcpy limit: 512 MiB buffers, larger than any cache. */
    mc_span = 512ull << 20;
    mc_src = malloc(mc_span);
    mc_dst = malloc(mc_span);
    memset(mc_src, 1, mc_span);
    memset(mc_dst, 2, mc_span);
    for (size_t k = 0; k < DP_ARRAY_LEN(shapes); k++) {
        if (only_shape != NULL && strcmp(only_shape, shapes[k].name) != 0)
            continue;
        printf("%s: %zu rows x %zu fields x %zu B = %.1f MiB per batch\n", shapes[k].name,
               shapes[k].rows, shapes[k].fields, shapes[k].bytes,
               (double)(shapes[k].rows * shapes[k].fields * shapes[k].bytes) / (1 << 20));
        if (only_mem == NULL || strcmp(only_mem, "registered") == 0)
            run_shape(c, &shapes[k], true, reps);
        if (only_mem == NULL || strcmp(only_mem, "malloc") == 0)
            run_shape(c, &shapes[k], false, reps);
    }
    free(mc_src);
    free(mc_dst);
    dp_client_close(c);
    for (uint32_t u = 0; u < n_units; u++) {
        kill(pids[u], SIGTERM);
        waitpid(pids[u], NULL, 0);
    }
    return 0;
}
