/*
 * bench_memcpy: the one-copy limit of this machine, for bench/compare.sh.
 * memcpy in pieces of a given size, stepping through two buffers larger than
 * the caches (so every piece comes from and goes to DRAM, as a put or get of
 * a batch does), both pre-faulted; on one thread, or with --threads N on N,
 * each through its own share of the buffers (the limit of a copy split over
 * N cores, as the client's parallel copies are). Prints the median GB/s
 * (1e9 B/s) of --reps passes.
 *
 * Usage: bench_memcpy [--size BYTES] [--buf MiB] [--reps N] [--threads N]
 * Output: a line "RESULT size=<bytes> GBps=<median>" (and threads=N with
 * --threads).
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "common/common.h"
#include "bench_util.h"

typedef struct share {
    uint8_t *dst, *src;
    uint64_t size, stride, pieces, count, first;
    pthread_barrier_t *go;
} share;

/* count pieces of the share [first, first + pieces), wrapping within it. */
static void
copy_share(const share *s)
{
    for (uint64_t k = 0; k < s->count; k++) {
        uint64_t off = (s->first + k % s->pieces) * s->stride;
        memcpy(s->dst + off, s->src + off, s->size);
    }
}

static void *
share_main(void *arg)
{
    share *s = arg;
    pthread_barrier_wait(s->go);
    copy_share(s);
    return NULL;
}

int
main(int argc, char **argv)
{
    uint64_t size = 1 << 20, buf_mib = 512, reps = 5, threads = 1;
    for (int i = 1; i < argc; i++) {
        dp_detail d;
        int rc = DP_EINVAL;
        if (strcmp(argv[i], "--size") == 0 && i + 1 < argc)
            rc = dp__parse_size(argv[++i], &size, "--size", &d);
        else if (strcmp(argv[i], "--buf") == 0 && i + 1 < argc)
            rc = dp__parse_u64(argv[++i], 1, 1 << 20, &buf_mib, "--buf", &d);
        else if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc)
            rc = dp__parse_u64(argv[++i], 1, 1000, &reps, "--reps", &d);
        else if (strcmp(argv[i], "--threads") == 0 && i + 1 < argc)
            rc = dp__parse_u64(argv[++i], 1, 64, &threads, "--threads", &d);
        if (rc != DP_OK) {
            fprintf(stderr, "usage: bench_memcpy [--size BYTES] [--buf MiB] [--reps N] "
                            "[--threads N]\n");
            return 2;
        }
    }
    uint64_t buf = buf_mib << 20;
    if (size == 0 || size > buf) {
        fprintf(stderr, "bench_memcpy: --size must be in 1 .. --buf\n");
        return 2;
    }
    uint8_t *src =
        mmap(NULL, buf, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    uint8_t *dst =
        mmap(NULL, buf, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (src == MAP_FAILED || dst == MAP_FAILED) {
        fprintf(stderr, "bench_memcpy: cannot map 2 x %" PRIu64 " MiB\n", buf_mib);
        return 1;
    }
    memset(src, 0x5a, buf);
    memset(dst, 0xa5, buf);
    /* Pieces 64-byte aligned like blob entries; at least 1 GiB copied per pass. */
    uint64_t stride = DP_ALIGN_UP(size, 64);
    uint64_t pieces = buf / stride;
    uint64_t per_pass = DP_MAX(pieces, (1ull << 30) / size);
    double *gbps = calloc(reps, sizeof *gbps);
    if (gbps == NULL)
        return 1;
    volatile uint8_t sink = 0;
    if (threads > pieces)
        threads = pieces;
    share sh[64];
    pthread_t th[64];
    pthread_barrier_t go;
    for (uint64_t r = 0; r < reps; r++) {
        /* thread t copies its own consecutive share of the pieces */
        for (uint64_t t = 0; t < threads; t++)
            sh[t] = (share){dst,
                            src,
                            size,
                            stride,
                            pieces / threads,
                            per_pass / threads + (t < per_pass % threads),
                            t * (pieces / threads),
                            &go};
        pthread_barrier_init(&go, NULL, (unsigned)threads);
        for (uint64_t t = 1; t < threads; t++)
            if (pthread_create(&th[t], NULL, share_main, &sh[t]) != 0) {
                fprintf(stderr, "bench_memcpy: cannot start thread %" PRIu64 "\n", t);
                return 1;
            }
        if (threads > 1)
            pthread_barrier_wait(&go);
        uint64_t t0 = dp__now_ns();
        copy_share(&sh[0]);
        for (uint64_t t = 1; t < threads; t++)
            pthread_join(th[t], NULL);
        uint64_t ns = dp__now_ns() - t0;
        pthread_barrier_destroy(&go);
        sink ^= dst[(r * 4099) % buf];
        gbps[r] = (double)(per_pass * size) / (double)ns;
    }
    qsort(gbps, reps, sizeof *gbps, bench_cmp_double);
    printf("memcpy %" PRIu64 " B pieces through 2 x %" PRIu64 " MiB on %" PRIu64
           " thread%s: %.3f GB/s (median of %" PRIu64 ")\n",
           size, buf_mib, threads, threads == 1 ? "" : "s", gbps[reps / 2], reps);
    if (threads == 1)
        printf("RESULT size=%" PRIu64 " GBps=%.3f\n", size, gbps[reps / 2]);
    else
        printf("RESULT size=%" PRIu64 " threads=%" PRIu64 " GBps=%.3f\n", size, threads,
               gbps[reps / 2]);
    (void)sink;
    free(gbps);
    munmap(src, buf);
    munmap(dst, buf);
    return 0;
}
