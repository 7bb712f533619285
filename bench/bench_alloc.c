/*
 * Benchmark of the slab allocator: alloc/free pairs per second with 10^5 live
 * blocks of random sizes, freeing a random victim before each alloc. Reports
 * the median over several runs, ns per pair and per operation, and the same
 * with the victim going through the quarantine (free_at + sweep each pair).
 *
 * Usage: bench_alloc [runs] [pairs_per_run] [live_blocks]
 * Random sizes and victims are drawn before the clock starts, so the figures
 * are the allocator's alone.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "alloc/slab_alloc.h"
#include "common/common.h"
#include "bench_util.h"

#define MAX_SIZE 16384 /* request sizes are uniform in [1, MAX_SIZE] bytes */

static double
now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

typedef struct run_result {
    double pairs_per_s;
    double fragmentation;
    uint64_t n_free;
    uint64_t full; /* allocs refused for lack of room (should be 0) */
} run_result;

/*
 * One run: fill live blocks, then time `pairs` iterations of free(victim) +
 * alloc(size). With quarantine, the victim is parked for `lag` pairs and a
 * sweep runs every pair.
 */
static int
run(uint64_t seed, size_t live, size_t pairs, int quarantine, run_result *out)
{
    uint64_t s = seed;
    const uint64_t area = (uint64_t)live * MAX_SIZE * 5 / 4; /* about 40% full */
    const double lag = 1000.0;
    dp__slab_alloc *a = NULL;
    dp_detail d;
    uint64_t *off = malloc(live * sizeof(*off));
    uint32_t *victim = malloc(pairs * sizeof(*victim));
    uint32_t *size = malloc(pairs * sizeof(*size));
    int rc = -1;
    if (off == NULL || victim == NULL || size == NULL)
        goto out;
    if (dp__slab_alloc_create(area, 64, &a, &d) != 0) {
        fprintf(stderr, "create: %s\n", d.msg);
        goto out;
    }
    for (size_t i = 0; i < live; i++) {
        if (dp__slab_alloc_alloc(a, 1 + dp__splitmix64(&s) % MAX_SIZE, &off[i], &d) !=
            0) {
            fprintf(stderr, "fill: %s\n", d.msg);
            goto out;
        }
    }
    for (size_t i = 0; i < pairs; i++) {
        victim[i] = (uint32_t)(dp__splitmix64(&s) % live);
        size[i] = (uint32_t)(1 + dp__splitmix64(&s) % MAX_SIZE);
    }

    uint64_t full = 0;
    double t0 = now_s();
    for (size_t i = 0; i < pairs; i++) {
        uint32_t v = victim[i];
        if (off[v] != UINT64_MAX) {
            int frc = quarantine ? dp__slab_alloc_free_at(a, off[v], (double)i + lag, &d)
                                 : dp__slab_alloc_free(a, off[v], &d);
            if (frc != 0) {
                fprintf(stderr, "free: %s\n", d.msg);
                goto out;
            }
        }
        if (quarantine)
            dp__slab_alloc_sweep(a, (double)i);
        if (dp__slab_alloc_alloc(a, size[i], &off[v], &d) != 0) {
            off[v] = UINT64_MAX;
            full++;
        }
    }
    double dt = now_s() - t0;

    dp__slab_alloc_stats st;
    dp__slab_alloc_get_stats(a, &st);
    out->pairs_per_s = (double)pairs / dt;
    out->fragmentation = st.fragmentation;
    out->n_free = st.n_free;
    out->full = full;
    rc = 0;
out:
    dp__slab_alloc_destroy(a);
    free(off);
    free(victim);
    free(size);
    return rc;
}

static int
scenario(const char *name, int runs, size_t live, size_t pairs, int quarantine)
{
    double *rate = malloc((size_t)runs * sizeof(*rate));
    if (rate == NULL)
        return 1;
    run_result r = {0};
    for (int i = 0; i < runs; i++) {
        if (run(0x5eed0000u + (uint64_t)i, live, pairs, quarantine, &r) != 0) {
            free(rate);
            return 1;
        }
        rate[i] = r.pairs_per_s;
    }
    qsort(rate, (size_t)runs, sizeof(*rate), bench_cmp_double);
    double med = runs % 2 ? rate[runs / 2] : (rate[runs / 2 - 1] + rate[runs / 2]) / 2;
    printf("%-22s live %zu  pairs/run %zu  runs %d: median %.3f M pairs/s "
           "(min %.3f, max %.3f), %.0f ns/pair, %.0f ns/op; last run: %" PRIu64
           " free blocks, fragmentation %.3f, refused %" PRIu64 "\n",
           name, live, pairs, runs, med / 1e6, rate[0] / 1e6, rate[runs - 1] / 1e6,
           1e9 / med, 1e9 / med / 2, r.n_free, r.fragmentation, r.full);
    free(rate);
    return 0;
}

int
main(int argc, char **argv)
{
    int runs = argc > 1 ? atoi(argv[1]) : 5;
    size_t pairs = argc > 2 ? (size_t)strtoull(argv[2], NULL, 0) : 200000;
    size_t live = argc > 3 ? (size_t)strtoull(argv[3], NULL, 0) : 100000;
    if (runs < 1 || pairs < 1 || live < 1) {
        fprintf(stderr, "usage: %s [runs] [pairs_per_run] [live_blocks]\n", argv[0]);
        return 2;
    }
    if (scenario("alloc+free", runs, live, pairs, 0) != 0)
        return 1;
    if (scenario("alloc+free_at+sweep", runs, live, pairs, 1) != 0)
        return 1;
    return 0;
}
