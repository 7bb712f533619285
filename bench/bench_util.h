/*
 * Helpers the benchmark programs share: ordering doubles for qsort and the
 * median of a sample.
 */
#ifndef DP_BENCH_UTIL_H
#define DP_BENCH_UTIL_H

#include <stddef.h>
#include <stdlib.h>

static inline int
bench_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The median of v[0..n) (sorts v); 0 for none. */
static inline double
bench_median(double *v, size_t n)
{
    if (n == 0)
        return 0;
    qsort(v, n, sizeof *v, bench_cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

#endif
