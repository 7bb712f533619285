/*
 * CRC32C throughput: the SSE4.2 path against the slicing-by-8 table, over
 * buffers of 4 KiB, 1 MiB and 64 MiB (median of several runs, each run long
 * enough to time), in GB/s (1e9 bytes per second), with the ratio.
 *
 * Usage: bench_crc32c [runs]   (default 7)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blob/crc32c.h"
#include "common/common.h"
#include "bench_util.h"

typedef uint32_t (*crc_fn)(uint32_t, const void *, size_t);

static volatile uint32_t sink;

/* One run: repeat over buf until at least min_bytes are done; returns GB/s. */
static double
run_once(crc_fn f, const uint8_t *buf, size_t n, uint64_t min_bytes)
{
    uint64_t reps = min_bytes / n + 1, t0 = dp__now_ns();
    uint32_t crc = 0;
    for (uint64_t i = 0; i < reps; i++)
        crc = f(crc, buf, n);
    uint64_t dt = dp__now_ns() - t0;
    sink = crc;
    return (double)(reps * n) / (double)(dt ? dt : 1);
}

static double
median_gbs(crc_fn f, const uint8_t *buf, size_t n, int runs)
{
    double v[64];
    if (runs > 64)
        runs = 64;
    run_once(f, buf, n, 1 << 20); /* warm-up: tables, caches, page faults */
    for (int i = 0; i < runs; i++)
        v[i] = run_once(f, buf, n, 256ull << 20);
    qsort(v, (size_t)runs, sizeof v[0], bench_cmp_double);
    return v[runs / 2];
}

int
main(int argc, char **argv)
{
    int runs = argc > 1 ? atoi(argv[1]) : 7;
    if (runs < 1)
        runs = 1;
    static const size_t sizes[] = {4u << 10, 1u << 20, 64u << 20};
    size_t max = sizes[DP_ARRAY_LEN(sizes) - 1];
    uint8_t *buf = malloc(max);
    if (buf == NULL) {
        fprintf(stderr, "bench_crc32c: no memory for %zu bytes\n", max);
        return 1;
    }
    uint64_t x = 88172645463325252ull;
    for (size_t i = 0; i < max; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        buf[i] = (uint8_t)x;
    }
    printf("crc32c: dispatch uses %s; median of %d runs, each >= 256 MiB\n",
           dp__crc32c_impl(), runs);
    printf("%-8s %12s %12s %8s\n", "size", "hw GB/s", "table GB/s", "hw/table");
    for (size_t k = 0; k < DP_ARRAY_LEN(sizes); k++) {
        size_t n = sizes[k];
        double hw = median_gbs(dp__crc32c_update_hw, buf, n, runs);
        double tab = median_gbs(dp__crc32c_update_table, buf, n, runs);
        char label[32];
        if (n >= (1u << 20))
            snprintf(label, sizeof label, "%zu MiB", n >> 20);
        else
            snprintf(label, sizeof label, "%zu KiB", n >> 10);
        printf("%-8s %12.2f %12.2f %8.1fx\n", label, hw, tab, hw / tab);
    }
    if (!dp__crc32c_hw_available())
        printf("note: no SSE4.2 on this CPU; the hw column is the table code\n");
    free(buf);
    return 0;
}
