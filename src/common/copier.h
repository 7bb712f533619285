/*
 * Large copies on more than one core (docs/design.md, "Parallel copies"). One
 * thread's memcpy reaches about 55-60% of what two reach on the development
 * machine (7 against 12 GB/s, DRAM to DRAM), so a batch of copies big enough
 * to pay for a wake-up is cut into chunks that the caller and helper threads
 * take in turn. The caller always copies too, and returns once every byte is
 * copied: a helper that never gets a core only means the caller copies more.
 *
 * A copier is owned by one object (an endpoint). It runs one batch at a
 * time: a batch that comes while another runs is copied by its caller alone.
 * Helpers start at the first batch that wants them; dp__copier_destroy
 * stops and joins them (no batch may run then).
 */
#ifndef DP_COMMON_COPIER_H
#define DP_COMMON_COPIER_H

#include <stddef.h>
#include <stdint.h>

typedef struct dp__copier dp__copier;

/* One copy of a batch: n bytes from src to dst (they do not overlap). */
typedef struct dp__copy {
    void *dst;
    const void *src;
    size_t n;
} dp__copy;

#define DP_COPIER_THREADS_MAX 16

/*
 * threads: how many threads copy a batch of 512 KiB or more, the caller
 * included (1: the caller alone; at most DP_COPIER_THREADS_MAX); smaller
 * batches are copied by the caller alone. NULL when out of memory.
 */
dp__copier *dp__copier_new(unsigned threads);
void dp__copier_destroy(dp__copier *c);

/* Copy every job; returns when all are done. Jobs run in no defined order
 * and at once: destinations that overlap get one of their sources' bytes. */
void dp__copier_run(dp__copier *c, const dp__copy *jobs, size_t n_jobs);

/* Batches run in parallel, their bytes, and the bytes of those the helpers
 * copied (for counters and tests); any pointer may be NULL. */
void dp__copier_counts(const dp__copier *c, uint64_t *batches, uint64_t *bytes,
                       uint64_t *helper_bytes);

/* The default thread count: 2 on a machine of 2 or more online CPUs, else 1. */
unsigned dp__copier_default_threads(void);

#endif
