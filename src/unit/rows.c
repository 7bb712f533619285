/*
 * The unit's row index (gidx -> row, a row's fields -> slots; see row and
 * slot in unit_int.h), the atomic publish of a committed blob's keys into it
 * (docs/design.md, "Storage unit"), and rows dropped from it (release_rows).
 *
 * Design notes
 * ------------
 * Atomic publish. A commit first makes sure every row and slot it needs
 * exists (creating empty placeholders), which is the only step that
 * allocates; on failure it removes the placeholders and nothing changed.
 * Then it points the slots at the new blob, which cannot fail, and drops the
 * old blobs' refs (a blob whose last ref goes leaves the table: unit.c).
 * Each entry's slot is found once: pass 1 keeps the row and slot index for
 * pass 2, and a row's adjacent fields reuse its row lookup.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "common/le.h"
#include "unit/unit_int.h"

uint32_t
dp__row_hash(const char *f, uint32_t n)
{
    uint32_t h = 2166136261u; /* FNV-1a */
    for (uint32_t k = 0; k < n; k++)
        h = (h ^ (uint8_t)f[k]) * 16777619u;
    return h;
}

/* At most this many freed rows kept (~184 bytes each): a big batch's worth. */
#define ROW_SPARE_MAX 16384

static row *
row_new_locked(dp__unit *u, uint64_t gidx)
{
    row *r = u->n_spare_rows > 0 ? u->spare_rows[--u->n_spare_rows] : malloc(sizeof *r);
    if (r == NULL)
        return NULL;
    r->gidx = gidx;
    r->n = 0;
    r->cap = ROW_INLINE;
    r->s = r->inl;
    return r;
}

void
dp__row_free_locked(dp__unit *u, row *r)
{
    if (r->s != r->inl)
        free(r->s);
    if (u->n_spare_rows == u->cap_spare_rows && u->cap_spare_rows < ROW_SPARE_MAX) {
        uint32_t cap = u->cap_spare_rows == 0 ? 256 : 2 * u->cap_spare_rows;
        row **g = realloc(u->spare_rows, (size_t)cap * sizeof *g);
        if (g != NULL) {
            u->spare_rows = g;
            u->cap_spare_rows = cap;
        }
    }
    if (u->n_spare_rows < u->cap_spare_rows)
        u->spare_rows[u->n_spare_rows++] = r;
    else
        free(r);
}

void
dp__rows_spare_fini(dp__unit *u)
{
    for (uint32_t i = 0; i < u->n_spare_rows; i++)
        free(u->spare_rows[i]);
    free(u->spare_rows);
    u->spare_rows = NULL;
    u->n_spare_rows = u->cap_spare_rows = 0;
}

/* Index of field f's slot in r, or -1. */
int32_t
dp__row_find(const row *r, const char *f, uint32_t flen, uint32_t h)
{
    for (uint32_t k = 0; k < r->n; k++) {
        const slot *s = &r->s[k];
        if (s->hash == h && s->flen == flen && dp__bytes_eq(s->field, f, flen))
            return (int32_t)k;
    }
    return -1;
}

/* r's slot for f, or NULL: a lookup by name. */
slot *
dp__row_slot(row *r, const char *f, uint32_t flen)
{
    if (r == NULL)
        return NULL;
    int32_t k = dp__row_find(r, f, flen, dp__row_hash(f, flen));
    return k < 0 ? NULL : &r->s[k];
}

/* Append a placeholder slot for f (b NULL); its index, or -1 out of memory. */
static int32_t
row_add(row *r, const char *f, uint32_t flen, uint32_t h)
{
    if (r->n == r->cap) {
        uint32_t cap = r->cap * 2;
        slot *ns = malloc((size_t)cap * sizeof *ns);
        if (ns == NULL)
            return -1;
        memcpy(ns, r->s, (size_t)r->n * sizeof *ns);
        if (r->s != r->inl)
            free(r->s);
        r->s = ns;
        r->cap = cap;
    }
    r->s[r->n] = (slot){.b = NULL, .field = f, .flen = flen, .hash = h, .i = 0};
    return (int32_t)r->n++;
}

/* Remove slot k (the last one takes its place). */
static void
row_del(row *r, uint32_t k)
{
    r->s[k] = r->s[--r->n];
}

/* Remove the placeholders of a failed publish (slots still pointing nowhere). */
static void
publish_rollback_locked(dp__unit *u, const dp__blob *pb, uint32_t upto)
{
    for (uint32_t i = 0; i < upto; i++) {
        const dp__blob_entry *e = dp__blob_entry_at(pb, i);
        row *r = dp__map_get_u64(&u->rows, e->gidx);
        if (r == NULL)
            continue;
        uint32_t flen = (uint32_t)e->field_len;
        int32_t k = dp__row_find(r, e->field, flen, dp__row_hash(e->field, flen));
        if (k >= 0 && r->s[k].b == NULL)
            row_del(r, (uint32_t)k);
        if (r->n == 0) {
            dp__map_del_u64(&u->rows, e->gidx);
            dp__row_free_locked(u, r);
        }
    }
}

/*
 * Install b's parsed index in the row index (b->parsed set, b unpublished).
 * keep (NULL: all) names the entries to install, one byte per entry: a
 * restored blob brings back only the keys its checkpoint listed as live; the
 * caller makes sure at least one is kept. DP_ENOMEM: nothing changed.
 */
int
dp__rows_publish_locked(dp__unit *u, blob_rec *b, const uint8_t *keep, double now,
                        dp_detail *d)
{
    const dp__blob *pb = b->parsed;
    const dp__blob_entry *ents = dp__blob_entries(pb);
    uint32_t n = dp__blob_count(pb), i = 0, kept = 0;
    /*
     * Each entry's (row, slot index), found once (a row's fields are usually
     * adjacent); an index, not a pointer: a row's array may move as it grows.
     */
    struct at {
        row *r;
        uint32_t k;
    } *at = malloc((size_t)n * sizeof *at);
    if (at == NULL)
        return dp__fail(d, DP_ENOMEM, "commit %s: out of memory; nothing published",
                        b->id);
    row *r = NULL;
    /* A versioned put's keys held at a higher version refuse it ("Versions"). */
    bool check = b->ver != 0 && !(b->flags & REC_REPAIR);
    /* Pass 1: every row and slot exists (the only step that allocates). */
    for (i = 0; i < n; i++) {
        at[i].r = NULL;
        if (keep != NULL && !keep[i])
            continue;
        kept++;
        const dp__blob_entry *e = &ents[i];
        if (r == NULL || r->gidx != e->gidx) {
            r = dp__map_get_u64(&u->rows, e->gidx);
            /* A row cleared at its version or a higher one refuses it too
             * ("Versions"; as a repair copy at the clear's version is skipped). */
            if (check && dp__tomb_ver_locked(u, e->gidx) >= b->ver) {
                free(at);
                publish_rollback_locked(u, pb, i);
                return dp__fail(d, DP__ESTALE,
                                "commit %s: a row was cleared at a higher version",
                                b->id);
            }
        }
        if (r == NULL) {
            r = row_new_locked(u, e->gidx);
            if (r == NULL)
                goto nomem;
            if (dp__map_put_u64(&u->rows, e->gidx, r, NULL) != 0) {
                dp__row_free_locked(u, r);
                r = NULL;
                goto nomem;
            }
        }
        uint32_t flen = (uint32_t)e->field_len, h = dp__row_hash(e->field, flen);
        int32_t k = dp__row_find(r, e->field, flen, h);
        if (k < 0 && (k = row_add(r, e->field, flen, h)) < 0) {
            if (r->n == 0) {
                dp__map_del_u64(&u->rows, e->gidx);
                dp__row_free_locked(u, r);
            }
            r = NULL;
            goto nomem;
        }
        if (check && r->s[k].b != NULL && r->s[k].ver > b->ver) {
            free(at);
            publish_rollback_locked(u, pb, i + 1 < n ? i + 1 : n);
            return dp__fail(d, DP__ESTALE, "commit %s: a key is held at a higher version",
                            b->id);
        }
        at[i] = (struct at){r, (uint32_t)k};
    }
    /* Pass 2: publish, cannot fail. */
    dp__rec_set_state(b, REC_PUBLISHED);
    b->refs = kept;
    dp__list_remove(&u->pend, &b->pend_link);
    u->stats.published++;
    u->stats.n_commit++;
    u->stats.committed_bytes += b->nbytes;
    for (i = 0; i < n; i++) {
        if (at[i].r == NULL)
            continue;
        slot *s = &at[i].r->s[at[i].k];
        blob_rec *old = s->b;
        /* An unversioned commit (an older client) keeps the key's version. */
        uint64_t v = b->vers != NULL ? b->vers[i] : b->ver;
        if (v != 0 || old == NULL)
            s->ver = v;
        s->b = b;
        s->i = i;
        s->field = ents[i].field; /* the name now lives in b */
        if (old != NULL)
            dp__rec_unref_locked(u, old, now);
        else
            u->stats.entries++;
    }
    free(at);
    return 0;
nomem:
    free(at);
    publish_rollback_locked(u, pb, i + 1 < n ? i + 1 : n);
    return dp__fail(d, DP_ENOMEM, "commit %s: out of memory; nothing published", b->id);
}

uint64_t
dp__rows_stale_locked(dp__unit *u, const blob_rec *b)
{
    if (b->ver == 0)
        return 0;
    const dp__blob *pb = b->parsed;
    uint32_t n = dp__blob_count(pb);
    uint64_t high = 0;
    row *r = NULL;
    for (uint32_t i = 0; i < n; i++) {
        const dp__blob_entry *e = dp__blob_entry_at(pb, i);
        if (r == NULL || r->gidx != e->gidx) {
            r = dp__map_get_u64(&u->rows, e->gidx);
            uint64_t t = dp__tomb_ver_locked(u, e->gidx);
            if (t >= b->ver && t > high)
                high = t;
        }
        const slot *s = dp__row_slot(r, e->field, (uint32_t)e->field_len);
        if (s != NULL && s->b != NULL && s->ver > b->ver && s->ver > high)
            high = s->ver;
    }
    return high;
}

bool
dp__slot_wins_locked(const slot *s, const blob_rec *b)
{
    if (s->ver != b->ver && b->ver != 0)
        return s->ver > b->ver;
    /* Equal versions (or b unversioned): the later commit wins, except that a
     * repair's copy is older than anything written to this unit since it
     * started, whenever it was committed. */
    return s->b->commit_seq > b->commit_seq && !(s->b->flags & REC_REPAIR);
}

/* ---- release (the row index's rows dropped) ---- */

uint64_t
dp__unit_release_rows(dp__unit *u, const uint64_t *gidxs, uint32_t n)
{
    return dp__unit_release_rows_ver(u, gidxs, n, 0, NULL);
}

/* The highest version above ver of a key these rows hold; 0: none. */
static uint64_t
release_stale_locked(dp__unit *u, const uint64_t *gidxs, uint32_t n, uint64_t ver)
{
    uint64_t high = 0;
    for (uint32_t i = 0; i < n; i++) {
        const row *r = dp__map_get_u64(&u->rows, gidxs[i]);
        for (uint32_t k = 0; r != NULL && k < r->n; k++)
            if (r->s[k].ver > ver && r->s[k].ver > high)
                high = r->s[k].ver;
    }
    return high;
}

uint64_t
dp__unit_release_rows_ver(dp__unit *u, const uint64_t *gidxs, uint32_t n, uint64_t ver,
                          uint64_t *stale)
{
    uint64_t dropped = 0;
    if (stale != NULL)
        *stale = 0;
    pthread_mutex_lock(&u->mu);
    double now = dp__unit_now(u);
    uint64_t high = ver != 0 ? release_stale_locked(u, gidxs, n, ver) : 0;
    if (high != 0) {
        /* A key put after this clear (in version order): nothing dropped. */
        u->stats.versions_refused++;
        if (stale != NULL)
            *stale = high;
        pthread_mutex_unlock(&u->mu);
        return 0;
    }
    for (uint32_t i = 0; i < n; i++) {
        row *r = dp__map_del_u64(&u->rows, gidxs[i]);
        if (r == NULL)
            continue;
        for (uint32_t k = 0; k < r->n; k++) {
            dp__rec_unref_locked(u, r->s[k].b, now);
            dropped++;
        }
        dp__row_free_locked(u, r);
    }
    if (u->io_alloc != NULL)
        dp__ssd_release_spills_locked(u, gidxs, n, ver);
    dp__repair_cleared_locked(u, gidxs, n, ver);
    u->stats.entries -= dropped;
    u->stats.n_release++;
    if (dropped > 0)
        u->n_clears++;
    pthread_mutex_unlock(&u->mu);
    return dropped;
}
