/*
 * Who may still WRITE into a unit's regions, and when that provably stops
 * (docs/design.md, "Reclaiming retired memory").
 *
 * Every allocation names its writer (the client's id, pid, host key and how
 * its RMA reaches the unit). A region is retired when its writer may still
 * write into it (abort with in_flight, an expired lease); it is handed back
 * only once that writer provably cannot write any more: the writer ran on
 * this host (same kernel and pid namespace), its RMA to the unit is shared
 * memory only, its process has exited (a pidfd opened while it was alive
 * turned readable), and a grace period has passed since. Shared-memory RMA
 * is CPU stores of the writer's own threads: once its process is gone,
 * nothing writes any more. Where this does not hold (another host, TCP or
 * RDMA lanes, no pidfd), retired regions are kept for good and counted as
 * such.
 *
 * Threads: not thread-safe; the unit calls everything under its lock. No
 * call blocks (the pidfds are polled with a zero timeout).
 */
#ifndef DP_UNIT_WRITERS_H
#define DP_UNIT_WRITERS_H

#include <stdbool.h>
#include <stdint.h>

#include "common/common.h"
#include "wire/wire.h"

typedef struct dp__writer dp__writer;
typedef struct dp__writers dp__writers;

/* Where a retired region lives: the unit's put area or its IO area. */
enum { DP__AREA_PUT = 0, DP__AREA_IO = 1 };

typedef struct dp__writers_stats {
    uint64_t writers;            /* writers with an open allocation or a retired region */
    uint64_t writers_gone;       /* of those, proved unable to write (process gone) */
    uint64_t retired_bytes;      /* regions retired now */
    uint64_t retired;            /* their number */
    uint64_t retired_kept_bytes; /* of those, kept for good: no proof can come */
    uint64_t reclaimed_bytes;    /* retired regions handed back since start */
    uint64_t reclaimed;
} dp__writers_stats;

/* Called for a retired region whose writer is gone: give it back. */
typedef void (*dp__writers_give_fn)(void *ctx, int area, uint64_t off, uint64_t size);

/*
 * grace_s: how long after its process is seen gone a writer's regions are
 * handed back (< 0: never, the seed rule: retired regions are never freed).
 * host_key: this unit's (dp__host_key()).
 */
int dp__writers_create(double grace_s, const char *host_key, dp__writers **out,
                       dp_detail *d);
/* Every retired region is forgotten (the slab goes with the unit). NULL allowed. */
void dp__writers_destroy(dp__writers *w);

/*
 * The writer an alloc names, with one more reference (the allocation's); a
 * new one is recorded on first use (its pidfd opened now, while it writes).
 * NULL when the request names no writer, or out of memory: the allocation
 * then has no writer and, if retired, is kept for good.
 */
dp__writer *dp__writers_ref(dp__writers *w, const dp__wire_alloc_args *a);
/* Drop a reference (the allocation was committed, freed or retired). NULL allowed. */
void dp__writers_unref(dp__writers *w, dp__writer *wr);

/* True once wr provably writes no more (see above), at time now. */
bool dp__writer_gone(const dp__writer *wr, double now);
/* Printable id of the writer ("?" for NULL). */
const char *dp__writer_name(const dp__writer *wr);

/*
 * Retire region (area, off, size) on behalf of wr (NULL: no known writer):
 * it stays allocated until dp__writers_reclaim hands it back, or for good.
 */
void dp__writers_retire(dp__writers *w, dp__writer *wr, int area, uint64_t off,
                        uint64_t size);

/*
 * Look at the writers' processes (a zero-timeout poll of their pidfds) and
 * hand back, through give, every retired region whose writer is gone.
 * Returns the bytes handed back.
 */
uint64_t dp__writers_reclaim(dp__writers *w, double now, dp__writers_give_fn give,
                             void *ctx);

void dp__writers_get_stats(const dp__writers *w, dp__writers_stats *st);

#endif
