/*
 * dp__unit_check: the unit's invariants recounted from its tables (for tests:
 * O(n), under the unit lock). Each phase recounts one kind of reference and
 * compares it with what the records and counters say: the row index's slots
 * with refs, the pins and save holds with n_pins, n_holds and the zombies, the
 * staged list and disk blobs with the SSD counters; then the allocators check
 * themselves. The first violation is DP_ECORRUPT.
 */
#include <inttypes.h>
#include <pthread.h>

#include "alloc/slab_alloc.h"
#include "unit/unit_int.h"

/* SSD-tier consistency: disk blobs, staged copies and their counters. */
static int
check_ssd_locked(dp__unit *u, dp_detail *d)
{
    uint64_t ns = 0, sb = 0, ndisk = 0, dbytes = 0;
    for (blob_rec *b = DP_LIST_FIRST(&u->staged, blob_rec, staged_link); b != NULL;
         b = DP_LIST_NEXT(b, blob_rec, staged_link)) {
        ns++;
        sb += b->size;
        if (!(b->flags & REC_STAGED) || !(b->flags & REC_DISK) ||
            b->area != REC_AREA_IO || (b->flags & REC_JOB))
            return dp__fail(d, DP_ECORRUPT, "staged list: blob %s in a wrong state",
                            b->id);
        if (DP_LIST_NEXT(b, blob_rec, staged_link) == NULL &&
            DP_LIST_LAST(&u->staged, blob_rec, staged_link) != b)
            return dp__fail(d, DP_ECORRUPT, "staged list tail");
    }
    if (ns != u->stats.staged_blobs || sb != u->stats.staged_bytes)
        return dp__fail(d, DP_ECORRUPT,
                        "staged %" PRIu64 "/%" PRIu64 " blobs, %" PRIu64 "/%" PRIu64
                        " bytes",
                        ns, u->stats.staged_blobs, sb, u->stats.staged_bytes);
    size_t it = 0;
    void *v;
    while (dp__map_next(&u->blobs, &it, NULL, NULL, NULL, &v)) {
        blob_rec *b = v;
        if (b->flags & REC_DISK) {
            ndisk++;
            dbytes += b->nbytes;
            if (b->state != REC_PUBLISHED || b->fd < 0)
                return dp__fail(d, DP_ECORRUPT, "disk blob %s: published %d, fd %d",
                                b->id, b->state == REC_PUBLISHED, b->fd);
            if (b->area == REC_AREA_PUT)
                return dp__fail(d, DP_ECORRUPT, "disk blob %s holds a put-area region",
                                b->id);
            if (b->area != REC_AREA_NONE && !(b->flags & (REC_STAGED | REC_JOB)))
                return dp__fail(d, DP_ECORRUPT, "disk blob %s holds an idle region",
                                b->id);
        } else if (b->area == REC_AREA_NONE) {
            return dp__fail(d, DP_ECORRUPT, "blob %s has no region and no file", b->id);
        }
        if (b->area == REC_AREA_IO && !u->ssd)
            return dp__fail(d, DP_ECORRUPT, "blob %s in an IO area that does not exist",
                            b->id);
    }
    /* Zombies and REC_DOOMED records are counted until their file closes. */
    if (ndisk > u->stats.disk_blobs || dbytes > u->stats.disk_bytes)
        return dp__fail(d, DP_ECORRUPT, "disk blobs %" PRIu64 " > counter %" PRIu64,
                        ndisk, u->stats.disk_blobs);
    if (u->q_n + u->n_running > DP_UNIT_MAX_IO_JOBS)
        return dp__fail(d, DP_ECORRUPT, "io jobs over the limit");
    return 0;
}

/* Bump the count of p in a pointer -> count map; the count before. */
static uintptr_t
count_bump(dp__map *m, const void *p)
{
    uintptr_t key = (uintptr_t)p;
    uintptr_t c = (uintptr_t)dp__map_get_u64(m, key);
    dp__map_put_u64(m, key, (void *)(c + 1), NULL);
    return c;
}

/* Every row and slot; slots counts the slots pointing at each record. */
static int
check_rows_locked(dp__unit *u, dp__map *slots, dp_detail *d)
{
    uint64_t entries = 0;
    size_t it = 0;
    void *v;
    uint64_t g;
    while (dp__map_next(&u->rows, &it, NULL, NULL, &g, &v)) {
        row *r = v;
        if (r->n == 0)
            return dp__fail(d, DP_ECORRUPT, "row %" PRIu64 " is empty", g);
        if (r->gidx != g || r->n > r->cap || (r->cap == ROW_INLINE) != (r->s == r->inl))
            return dp__fail(d, DP_ECORRUPT, "row %" PRIu64 ": bad header", g);
        for (uint32_t k = 0; k < r->n; k++) {
            const slot *s = &r->s[k];
            if (s->b == NULL || s->b->state != REC_PUBLISHED)
                return dp__fail(d, DP_ECORRUPT, "row %" PRIu64 " points at a dead blob",
                                g);
            const dp__blob_entry *e = dp__blob_entry_at(s->b->parsed, s->i);
            if (e->gidx != g || s->field != e->field || s->flen != e->field_len ||
                s->hash != dp__row_hash(s->field, s->flen) ||
                dp__row_find(r, s->field, s->flen, s->hash) != (int32_t)k)
                return dp__fail(d, DP_ECORRUPT,
                                "row %" PRIu64 " slot %u does not match its blob entry",
                                g, k);
            count_bump(slots, s->b);
            entries++;
        }
    }
    if (entries != u->stats.entries)
        return dp__fail(d, DP_ECORRUPT, "entries %" PRIu64 " != counter %" PRIu64,
                        entries, u->stats.entries);
    return 0;
}

/* The blob table against the slot counts, the counters and the pend list. */
static int
check_blobs_locked(dp__unit *u, dp__map *slots, dp_detail *d)
{
    uint64_t pub = 0, pend = 0;
    size_t it = 0;
    void *v;
    while (dp__map_next(&u->blobs, &it, NULL, NULL, NULL, &v)) {
        blob_rec *b = v;
        uint64_t c = (uint64_t)(uintptr_t)dp__map_get_u64(slots, (uintptr_t)b);
        if (b->state == REC_PUBLISHED) {
            pub++;
            if (b->refs == 0 || c != b->refs)
                return dp__fail(d, DP_ECORRUPT,
                                "blob %s: refs %" PRIu64 ", slots %" PRIu64, b->id,
                                b->refs, c);
        } else {
            pend++;
            if (b->refs != 0 || c != 0)
                return dp__fail(d, DP_ECORRUPT, "uncommitted blob %s has refs", b->id);
        }
    }
    if (pub != u->stats.published)
        return dp__fail(d, DP_ECORRUPT, "published %" PRIu64 " != counter %" PRIu64, pub,
                        u->stats.published);
    uint64_t np = 0;
    for (blob_rec *b = DP_LIST_FIRST(&u->pend, blob_rec, pend_link); b != NULL;
         b = DP_LIST_NEXT(b, blob_rec, pend_link))
        np++;
    if (np != pend)
        return dp__fail(d, DP_ECORRUPT, "uncommitted list %" PRIu64 " != %" PRIu64, np,
                        pend);
    return 0;
}

/* Every record's count in m (a pointer -> count map) matches its n_pins or n_holds. */
static int
check_counts(dp__map *m, bool holds, dp_detail *d)
{
    size_t it = 0;
    uint64_t key;
    void *v;
    while (dp__map_next(m, &it, NULL, NULL, &key, &v)) {
        blob_rec *b = (blob_rec *)(uintptr_t)key;
        uint64_t c = (uint64_t)(uintptr_t)v;
        if (holds && b->n_holds != c)
            return dp__fail(d, DP_ECORRUPT, "blob %s: n_holds %u, holds %" PRIu64, b->id,
                            b->n_holds, c);
        if (!holds && b->n_pins != c)
            return dp__fail(d, DP_ECORRUPT, "blob %s: n_pins %u, pins %" PRIu64, b->id,
                            b->n_pins, c);
    }
    return 0;
}

/*
 * Pins (in expiry order) and the holds of running saves against n_pins and
 * n_holds; the zombies they keep against the zombie counters.
 */
static int
check_pins_locked(dp__unit *u, dp_detail *d)
{
    dp__map pins, holds;
    dp__map_init_u64(&pins);
    dp__map_init_u64(&holds);
    int rc = 0;
    uint64_t npins = 0, zb = 0, nz = 0;
    for (pin *p = DP_LIST_FIRST(&u->pins_by_expiry, pin, link); p != NULL;
         p = DP_LIST_NEXT(p, pin, link)) {
        npins++;
        pin *next = DP_LIST_NEXT(p, pin, link);
        if (next != NULL && next->expiry < p->expiry) {
            rc = dp__fail(d, DP_ECORRUPT, "pin list out of expiry order");
            goto out;
        }
        for (uint32_t i = 0; i < p->n; i++) {
            blob_rec *b = p->blobs[i];
            if (count_bump(&pins, b) == 0 && b->state == REC_ZOMBIE) {
                nz++;
                if (b->area != REC_AREA_IO)
                    zb += b->size;
            }
        }
    }
    /* Holds of running saves keep released records alive like pins. */
    for (hold_set *h = DP_LIST_FIRST(&u->holds, hold_set, link); h != NULL;
         h = DP_LIST_NEXT(h, hold_set, link)) {
        for (uint32_t i = 0; i < h->n; i++) {
            blob_rec *b = h->b[i];
            if (count_bump(&holds, b) == 0 && b->state == REC_ZOMBIE &&
                dp__map_get_u64(&pins, (uintptr_t)b) == NULL) {
                nz++;
                if (b->area != REC_AREA_IO)
                    zb += b->size;
            }
        }
    }
    if ((rc = check_counts(&holds, true, d)) != 0)
        goto out;
    if (npins != dp__map_len(&u->pins) || nz != u->stats.zombies ||
        zb != u->stats.zombie_bytes) {
        rc =
            dp__fail(d, DP_ECORRUPT, "pins %" PRIu64 "/%zu, zombies %" PRIu64 "/%" PRIu64,
                     npins, dp__map_len(&u->pins), nz, u->stats.zombies);
        goto out;
    }
    rc = check_counts(&pins, false, d);
out:
    dp__map_fini(&pins);
    dp__map_fini(&holds);
    return rc;
}

int
dp__unit_check(dp__unit *u, dp_detail *d)
{
    dp__map slots;
    dp__map_init_u64(&slots);
    pthread_mutex_lock(&u->mu);
    int rc = check_rows_locked(u, &slots, d);
    if (rc == 0)
        rc = check_blobs_locked(u, &slots, d);
    if (rc == 0)
        rc = check_pins_locked(u, d);
    if (rc == 0)
        rc = dp__slab_alloc_check(u->alloc, d);
    if (rc == 0 && u->io_alloc != NULL)
        rc = dp__slab_alloc_check(u->io_alloc, d);
    if (rc == 0)
        rc = check_ssd_locked(u, d);
    pthread_mutex_unlock(&u->mu);
    dp__map_fini(&slots);
    return rc;
}
