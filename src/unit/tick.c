/*
 * The unit's ticker step (docs/design.md, "Storage unit"): pins and leases
 * that expired, spills waiting for the io queue, regions and allocations of
 * writers that are gone (writers.h), the allocators' quarantine, and the
 * heap that clients freed given back to the system. unit.c starts the
 * ticker thread that calls it.
 */
#include <inttypes.h>
#include <malloc.h>
#include <pthread.h>

#include "alloc/slab_alloc.h"
#include "unit/unit_int.h"

#define TRIM_EVERY_S 10.0 /* dp__unit_tick gives freed heap back this often */

/* dp__writers_give_fn: a retired region whose writer is gone comes back. */
static void
give_back_region(void *ctx, int area, uint64_t off, uint64_t size)
{
    dp__unit *u = ctx;
    dp__slab_alloc *a = area == DP__AREA_IO ? u->io_alloc : u->alloc;
    uint64_t ao = area == DP__AREA_IO ? off - u->io_base : off;
    dp_detail d;
    dp_detail_clear(&d);
    if (a == NULL || dp__slab_alloc_free(a, ao, &d) != 0)
        DP_LOG_E("unit %u: retired region at %" PRIu64 " (%" PRIu64
                 " bytes) could not be handed back: %s",
                 u->o.unit_id, off, size, dp_detail_msg(&d));
}

/*
 * Give the heap that was freed back to the system, one thread of the process
 * at a time (the heap is the process's; another unit's ticker trimming now
 * does it for both). Two units' tickers trimming at once made glibc's
 * malloc_trim fault under AddressSanitizer (CI; a SEGV in mtrim, none in
 * 150 runs once serialized).
 */
static void
trim_heap(void)
{
    static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    if (pthread_mutex_trylock(&mu) == 0) {
        malloc_trim(0);
        pthread_mutex_unlock(&mu);
    }
}

/*
 * Writers that are gone (see writers.h): their retired regions come back,
 * and so do their open allocations (nothing will WRITE or commit them).
 */
static void
reclaim_locked(dp__unit *u, double now)
{
    dp__writers_reclaim(u->writers, now, give_back_region, u);
    if (u->o.reclaim_grace_s < 0)
        return;
    for (blob_rec *b = DP_LIST_FIRST(&u->pend, blob_rec, pend_link), *next; b != NULL;
         b = next) {
        next = DP_LIST_NEXT(b, blob_rec, pend_link);
        if (b->state != REC_ALLOCATED || (b->flags & REC_JOB) ||
            !dp__writer_gone(b->writer, now - u->o.reclaim_grace_s))
            continue;
        DP_LOG_I("unit %u: blob %s (%" PRIu64 " bytes) was never committed and its "
                 "writer %s is gone: region freed",
                 u->o.unit_id, b->id, b->size, dp__writer_name(b->writer));
        u->stats.allocs_reclaimed++;
        u->stats.allocs_reclaimed_bytes += b->size;
        dp__rec_discard_open_locked(u, b, now);
    }
}

void
dp__unit_tick(dp__unit *u)
{
    pthread_mutex_lock(&u->mu);
    double now = dp__unit_now(u);
    u->stats.n_ticks++;
    dp__order_sweep_locked(u, now);
    for (pin *p;
         (p = DP_LIST_FIRST(&u->pins_by_expiry, pin, link)) != NULL && p->expiry <= now;)
        dp__pin_end_locked(u, p, true, now);
    /*
     * Spills whose commit validated while the io queue was full wait on the
     * pend list: queue them as slots free. Their WRITE is done, so the lease
     * below never retires them.
     */
    for (blob_rec *b = DP_LIST_FIRST(&u->pend, blob_rec, pend_link), *next;
         b != NULL && !dp__ssd_jobs_full_locked(u); b = next) {
        next = DP_LIST_NEXT(b, blob_rec, pend_link);
        if (b->state == REC_VALIDATED && !(b->flags & REC_JOB)) {
            dp__list_remove(&u->pend, &b->pend_link);
            dp__ssd_submit_locked(u, JOB_SPILL, b);
        }
    }
    if (u->o.alloc_lease_s > 0) {
        for (blob_rec *b = DP_LIST_FIRST(&u->pend, blob_rec, pend_link), *next;
             b != NULL && now - b->created_at >= u->o.alloc_lease_s; b = next) {
            next = DP_LIST_NEXT(b, blob_rec, pend_link);
            if (b->state == REC_VALIDATED)
                continue; /* a validated spill waiting for the io queue */
            /* A two-sided writer's bytes land only through this unit: once the
             * record is gone none can, so the region is freed (after the
             * receives that run, if any), not retired for good. */
            bool two_sided = (b->flags & REC_TWO_SIDED) != 0;
            DP_LOG_W("unit %u: blob %s not committed within %.1f s: region of %" PRIu64
                     " bytes %s",
                     u->o.unit_id, b->id, u->o.alloc_lease_s, b->size,
                     two_sided ? "freed (a two-sided writer's)" : "retired");
            u->stats.leases_expired++;
            if (two_sided)
                dp__rec_discard_open_locked(u, b, now);
            else
                dp__rec_retire_locked(u, b);
        }
    }
    reclaim_locked(u, now);
    dp__slab_alloc_sweep(u->alloc, now);
    if (u->io_alloc != NULL)
        dp__slab_alloc_sweep(u->io_alloc, now);
    dp__ssd_superseded_expire_locked(u, now);
    if (dp__map_len(&u->tombs) > 0 && now - u->tombs_pruned >= 10.0) {
        u->tombs_pruned = now;
        dp__repair_prune_tombs_locked(u);
    }
    /* Every 30 s, one log line with the counters if anything changed. */
    char line[320], ssd_line[400];
    dp__unit_report_locked(u, now, line, sizeof line, ssd_line, sizeof ssd_line);
    /*
     * Every 10 s, the heap that clients' connections and requests freed goes
     * back to the system: without it a unit kept what 128 clients made it
     * take after they left (bench/scale.sh; docs/design.md, "Capacity").
     */
    bool trim = now - u->trimmed >= TRIM_EVERY_S;
    if (trim)
        u->trimmed = now;
    pthread_mutex_unlock(&u->mu);
    if (trim)
        trim_heap();
    if (line[0] != '\0')
        DP_LOG_I("%s", line);
    if (ssd_line[0] != '\0')
        DP_LOG_I("%s", ssd_line);
}
