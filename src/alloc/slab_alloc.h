/*
 * Slab allocator with quarantine: hands out aligned [off, off + n) ranges of an
 * abstract area of a given size. It never touches the memory it describes; the
 * storage unit maps offsets onto its registered slab (put area, IO area).
 *
 * Policy: best fit (the smallest free block that fits, the lowest offset among
 * equal sizes), carved from the start of that block; freed blocks merge with
 * free neighbours at once. alloc, free, free_at and a sweep that releases k
 * blocks cost O(log n) (O(k log n)) expected in the number of blocks (the
 * trees are treaps); nothing on these paths scans the area.
 *
 * Quarantine (design invariant 1, no reuse under a transfer): free_at() parks a
 * block until a given time; it is neither allocatable nor freeable again until
 * sweep() runs with now >= that time. Times are seconds on any clock the caller
 * picks, as long as it is one clock (the unit uses dp__now_s()).
 *
 * Threads: a dp__slab_alloc is not thread-safe, by design. Every call on one
 * allocator must be serialised by the caller (the unit holds its unit lock);
 * distinct allocators are independent.
 *
 * Internal to the library (not installed, not exported).
 */
#ifndef DP_ALLOC_SLAB_ALLOC_H
#define DP_ALLOC_SLAB_ALLOC_H

#include <stdint.h>

#include "dataplane/err.h"

typedef struct dp__slab_alloc dp__slab_alloc;

/* The state of one block, as reported by dp__slab_alloc_walk(). */
enum dp_slab_block_state {
    DP_SLAB_FREE = 0,        /* allocatable */
    DP_SLAB_ALLOCATED = 1,   /* handed out, not freed */
    DP_SLAB_QUARANTINED = 2, /* freed with free_at(), waiting for its time */
};

/*
 * A snapshot of the allocator. Bytes are always multiples of align, except
 * area_bytes (as given to create). allocated + free + quarantined == usable.
 */
typedef struct dp__slab_alloc_stats {
    uint64_t area_bytes;   /* the area size given to create */
    uint64_t usable_bytes; /* area_bytes rounded down to align: what can be handed out */
    uint64_t align;        /* the effective alignment (64 when 0 was given) */
    uint64_t allocated_bytes;   /* in blocks handed out and not freed */
    uint64_t free_bytes;        /* in free blocks */
    uint64_t quarantined_bytes; /* in blocks waiting for their free_at time */
    uint64_t largest_free;      /* the largest free block, 0 when none */
    uint64_t n_free;            /* free blocks (never two adjacent) */
    uint64_t n_allocated;       /* allocated blocks */
    uint64_t n_quarantined;     /* quarantined blocks */
    double fragmentation; /* 1 - largest_free / free_bytes; 0 when nothing is free */
    double next_release;  /* earliest free_at time pending, INFINITY when none */
} dp__slab_alloc_stats;

/*
 * Create an allocator for an area of area_bytes.
 *
 * align: the alignment of every offset and the granule of every size; 0 means
 * 64; otherwise a power of two. Sizes are rounded up to it. The area is rounded
 * down to it: a tail of area_bytes % align is never handed out.
 *
 * Returns 0 and *out (free it with dp__slab_alloc_destroy), DP_EINVAL (align not
 * a power of two, area smaller than one granule, out NULL) or DP_ENOMEM.
 * Threads: any.
 */
int dp__slab_alloc_create(uint64_t area_bytes, uint64_t align, dp__slab_alloc **out,
                          dp_detail *d);

/*
 * Free the allocator and all its bookkeeping (NULL is fine). Outstanding and
 * quarantined blocks are simply forgotten: the caller owns the memory behind
 * them and decides whether anything can still touch it.
 */
void dp__slab_alloc_destroy(dp__slab_alloc *a);

/*
 * Allocate nbytes (rounded up to align); the block's offset goes to *off.
 *
 * Returns 0, or:
 *   DP_EINVAL     nbytes == 0 (there is no zero-size block), a or off NULL;
 *   DP_ETOOBIG    nbytes > usable area: can never fit, whatever is freed;
 *   DP_EUNITFULL  no free block is large enough right now; the detail names
 *                 the size asked, the largest free block, the free and the
 *                 quarantined bytes. Quarantined bytes may make room after a
 *                 sweep, so the caller decides between Busy and UnitFull;
 *   DP_ENOMEM     host memory for bookkeeping ran out.
 * On any error nothing changed. Threads: caller-serialised (see the top).
 */
int dp__slab_alloc_alloc(dp__slab_alloc *a, uint64_t nbytes, uint64_t *off, dp_detail *d);

/*
 * Free the allocated block that starts at off, now; it merges with free
 * neighbours.
 *
 * Returns 0, or DP_EINVAL when no allocated block starts at off: a double free,
 * an offset never handed out, an offset inside a block, outside the area, or a
 * quarantined block (those are released only by sweep). The detail says which.
 * On error nothing changed. Threads: caller-serialised.
 */
int dp__slab_alloc_free(dp__slab_alloc *a, uint64_t off, dp_detail *d);

/*
 * Quarantine the allocated block at off until time t: it stops counting as
 * allocated, cannot be freed or quarantined again, and becomes free at the
 * first dp__slab_alloc_sweep(a, now) with now >= t. It is never released
 * immediately, even when t is already past: call dp__slab_alloc_free for that.
 * t = INFINITY parks the block until a sweep with now = INFINITY (but see
 * "Retired regions" in the Design notes of slab_alloc.c: leaving a block
 * allocated is the better way to retire it).
 *
 * Returns 0, DP_EINVAL (as for free, or t is NaN) or DP_ENOMEM; on error
 * nothing changed. Threads: caller-serialised.
 */
int dp__slab_alloc_free_at(dp__slab_alloc *a, uint64_t off, double t, dp_detail *d);

/*
 * Release every quarantined block whose time is <= now, earliest time first
 * (free_at order among equal times), merging each with its free neighbours.
 * Returns the bytes released (0 when nothing was due; that case costs O(1)).
 * Threads: caller-serialised.
 */
uint64_t dp__slab_alloc_sweep(dp__slab_alloc *a, double now);

/*
 * The size (after rounding) of the allocated block that starts at off.
 * Returns 0 and *n, or DP_ENOTFOUND when no allocated block starts at off
 * (free, quarantined and inner offsets included). O(log n).
 * Threads: caller-serialised.
 */
int dp__slab_alloc_size_of(const dp__slab_alloc *a, uint64_t off, uint64_t *n);

/* Fill *st with the current counters. O(log n). Threads: caller-serialised. */
void dp__slab_alloc_get_stats(const dp__slab_alloc *a, dp__slab_alloc_stats *st);

/*
 * Call fn(arg, off, size, state) for every block in address order: together
 * they tile [0, usable_bytes). Stops at the first nonzero return and returns
 * it; 0 when all were visited. fn must not call into the allocator. O(n): for
 * admin, debugging and tests. Threads: caller-serialised.
 */
typedef int (*dp_slab_alloc_walk_fn)(void *arg, uint64_t off, uint64_t size, int state);
int dp__slab_alloc_walk(const dp__slab_alloc *a, dp_slab_alloc_walk_fn fn, void *arg);

/*
 * Verify every internal invariant (tiling, coalescing, both trees' order and
 * heap property, the quarantine heap, all counters). Returns 0, or
 * DP_ECORRUPT with the first violation in d. O(n): for tests and debugging.
 * Threads: caller-serialised.
 */
int dp__slab_alloc_check(const dp__slab_alloc *a, dp_detail *d);

#endif
