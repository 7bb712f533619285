/*
 * Blob records (unit_int.h, blob_rec): the one place their state changes
 * (dp__rec_set_state checks every transition against the life drawn in
 * unit.c's opening comment) and where a record ends: its region freed,
 * quarantined or retired, its place on the staged list and its file given
 * up, the record freed. The lowest file of the unit's record logic: it calls
 * no other file of src/unit but writers.c, so the request handlers (unit.c),
 * the index (rows.c), pins (pins.c) and the SSD tier (ssd.c) all build on
 * it without calling each other in a circle.
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

#include "alloc/slab_alloc.h"
#include "unit/unit_int.h"

/*
 * The states each state may be entered from (bit s: from state s). A record
 * starts ALLOCATED (zeroed, or set at its alloc); DOOMED may follow any
 * state whose record an io job still owns when it is dropped.
 */
#define FROM(s) (1u << (s))
static const unsigned allowed_from[] = {
    [REC_ALLOCATED] = FROM(REC_ALLOCATED),
    /* VALIDATED again: a spill's commit asked again while its job waits. */
    [REC_VALIDATED] = FROM(REC_ALLOCATED) | FROM(REC_VALIDATED),
    [REC_ABORTING] = FROM(REC_ALLOCATED) | FROM(REC_VALIDATED),
    [REC_ABORTING_RETIRE] = FROM(REC_ALLOCATED) | FROM(REC_VALIDATED),
    [REC_PUBLISHED] = FROM(REC_ALLOCATED) | FROM(REC_VALIDATED),
    [REC_ZOMBIE] = FROM(REC_PUBLISHED),
    [REC_DOOMED] = FROM(REC_ALLOCATED) | FROM(REC_VALIDATED) | FROM(REC_ABORTING) |
                   FROM(REC_ABORTING_RETIRE) | FROM(REC_PUBLISHED) | FROM(REC_ZOMBIE),
    [REC_DRAINING] = FROM(REC_ALLOCATED) | FROM(REC_VALIDATED) | FROM(REC_ABORTING) |
                     FROM(REC_ABORTING_RETIRE),
};

void
dp__rec_set_state(blob_rec *b, rec_state to)
{
    DP_ASSERT((size_t)to < sizeof allowed_from / sizeof allowed_from[0] &&
              (allowed_from[to] & FROM(b->state)) != 0);
    b->state = (uint8_t)to;
}

void
dp__rec_flag_locked(blob_rec *b, unsigned flag, bool on)
{
    /* An io job owns a record, and a copy is on the staged list, at most once. */
    if (flag == REC_JOB || flag == REC_STAGED)
        DP_ASSERT(((b->flags & flag) != 0) != on);
    if (on)
        b->flags = (uint16_t)(b->flags | flag);
    else
        b->flags = (uint16_t)(b->flags & ~flag);
}

void
dp__rec_free_locked(dp__unit *u, blob_rec *b)
{
    if (b == NULL)
        return;
    dp__writers_unref(u->writers, b->writer);
    dp__blob_destroy(b->parsed);
    free(b->spill_keep);
    free(b->vers);
    free(b);
}

/* Give the region back: now, or through quarantine if a pin on it expired. */
void
dp__rec_release_region_locked(dp__unit *u, blob_rec *b, double now)
{
    DP_ASSERT(b->area != REC_AREA_NONE && !(b->flags & REC_JOB));
    bool io = b->area == REC_AREA_IO;
    dp__slab_alloc *a = io ? u->io_alloc : u->alloc;
    uint64_t o = io ? b->off - u->io_base : b->off;
    int rc;
    if (b->flags & REC_PIN_EXPIRED)
        rc = dp__slab_alloc_free_at(a, o, now + u->o.quarantine_s, NULL);
    else
        rc = dp__slab_alloc_free(a, o, NULL);
    if (rc != 0) {
        /* Only quarantine can fail (no memory for its heap): then keep the
         * region for good rather than free it early. */
        dp__writers_retire(u->writers, NULL, rec_writers_area(b), b->off, b->size);
    }
    b->area = REC_AREA_NONE;
}

/*
 * Free a record that is out of the table and unpinned, with its region and
 * file; if an io job owns them, it is REC_DOOMED and the job's end does it.
 */
void
dp__rec_drop_locked(dp__unit *u, blob_rec *b, double now)
{
    DP_ASSERT(b->n_pins == 0 && b->n_holds == 0);
    if (b->flags & REC_JOB) {
        if (b->state != REC_DOOMED) {
            dp__rec_set_state(b, REC_DOOMED);
            u->n_doomed++;
        }
        return;
    }
    if (b->state == REC_DOOMED)
        u->n_doomed--;
    if (b->flags & REC_STAGED)
        dp__rec_staged_unlink_locked(u, b);
    if (b->area != REC_AREA_NONE)
        dp__rec_release_region_locked(u, b, now);
    if (b->flags & REC_DISK) {
        u->stats.disk_blobs--;
        u->stats.disk_bytes -= b->nbytes;
    }
    dp__rec_close_later_locked(u, b);
    dp__rec_free_locked(u, b);
}

/*
 * The end of an open allocation out of the table: its region retired (a
 * one-sided WRITE may still land in it) or freed, and the record freed.
 */
static void
end_open_locked(dp__unit *u, blob_rec *b, bool retire, double now)
{
    if (retire) {
        dp__writers_retire(u->writers, b->writer, rec_writers_area(b), b->off, b->size);
        DP_LOG_D("retired blob %s: %" PRIu64 " bytes at %" PRIu64 " (writer %s)", b->id,
                 b->size, b->off, dp__writer_name(b->writer));
    } else {
        dp__rec_release_region_locked(u, b, now);
    }
    dp__rec_free_locked(u, b);
}

/*
 * Take an open allocation out of the table (no new two-sided WRITE gets in)
 * and end it; while two-sided WRITEs still land in it, the last one's end
 * does (REC_DRAINING, transfers.c).
 */
static void
leave_open_locked(dp__unit *u, blob_rec *b, bool retire, double now)
{
    dp__map_del(&u->blobs, b->id, b->id_len);
    dp__list_remove(&u->pend, &b->pend_link);
    if (b->n_rx > 0) {
        dp__rec_set_state(b, REC_DRAINING);
        b->drain_retire = retire;
        dp__list_insert_tail(&u->draining, &b->pend_link);
        return;
    }
    end_open_locked(u, b, retire, now);
}

/* The region stays allocated for good: a WRITE may still land in it. */
void
dp__rec_retire_locked(dp__unit *u, blob_rec *b)
{
    DP_ASSERT((b->state == REC_ALLOCATED || b->state == REC_VALIDATED) &&
              !(b->flags & REC_JOB));
    leave_open_locked(u, b, true, 0);
}

void
dp__rec_discard_open_locked(dp__unit *u, blob_rec *b, double now)
{
    leave_open_locked(u, b, false, now);
}

void
dp__rec_drained_locked(dp__unit *u, blob_rec *b, double now)
{
    DP_ASSERT(b->state == REC_DRAINING && b->n_rx == 0);
    dp__list_remove(&u->draining, &b->pend_link);
    end_open_locked(u, b, b->drain_retire, now);
}

void
dp__rec_zombie_count_locked(dp__unit *u, blob_rec *b, int dir)
{
    uint64_t sz = b->area != REC_AREA_NONE ? b->size : 0;
    if (dir > 0) {
        u->stats.zombies++;
        if (b->area == REC_AREA_IO)
            u->stats.io_zombie_bytes += sz;
        else
            u->stats.zombie_bytes += sz;
    } else {
        u->stats.zombies--;
        if (b->area == REC_AREA_IO)
            u->stats.io_zombie_bytes -= sz;
        else
            u->stats.zombie_bytes -= sz;
    }
}

/* A published blob lost its last ref: free it, or keep it for its pins. */
static void
dispose_locked(dp__unit *u, blob_rec *b, double now)
{
    DP_ASSERT(b->state == REC_PUBLISHED && b->refs == 0);
    dp__map_del(&u->blobs, b->id, b->id_len);
    u->stats.published--;
    if (b->n_pins > 0 || b->n_holds > 0) {
        dp__rec_set_state(b, REC_ZOMBIE);
        dp__rec_zombie_count_locked(u, b, +1);
        return;
    }
    dp__rec_drop_locked(u, b, now);
}

void
dp__rec_unref_locked(dp__unit *u, blob_rec *b, double now)
{
    DP_ASSERT(b->refs > 0);
    if (--b->refs == 0)
        dispose_locked(u, b, now);
}

/* ---- the staged list and files ---- */

/* The fd is closed by an io worker, outside the lock. */
void
dp__rec_close_later_locked(dp__unit *u, blob_rec *b)
{
    if (b->fd < 0)
        return;
    if (u->n_closes == u->cap_closes) {
        size_t cap = u->cap_closes ? u->cap_closes * 2 : 64;
        int *p = realloc(u->closes, cap * sizeof *p);
        if (p == NULL) {
            /* Out of memory: close here rather than leak the file. */
            close(b->fd);
            b->fd = -1;
            u->stats.files_open--;
            return;
        }
        u->closes = p;
        u->cap_closes = cap;
    }
    u->closes[u->n_closes++] = b->fd;
    b->fd = -1;
    u->stats.files_open--;
    pthread_cond_signal(&u->io_cv);
}

void
dp__rec_staged_unlink_locked(dp__unit *u, blob_rec *b)
{
    DP_ASSERT(b->flags & REC_STAGED);
    dp__list_remove(&u->staged, &b->staged_link);
    dp__rec_flag_locked(b, REC_STAGED, false);
    u->stats.staged_blobs--;
    u->stats.staged_bytes -= b->size;
}

void
dp__rec_staged_append_locked(dp__unit *u, blob_rec *b)
{
    dp__rec_flag_locked(b, REC_STAGED, true);
    dp__list_insert_tail(&u->staged, &b->staged_link);
    u->stats.staged_blobs++;
    u->stats.staged_bytes += b->size;
}
