/*
 * A unit's side of its repair (docs/design.md, "Repair"): the rows it was
 * asked to clear while it repairs, the commit of a repair's copy (only keys
 * the unit lacks, of rows not cleared since it started), the repair's
 * counters, and the listing of the keys a peer's repair asks for.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blob/keys.h"
#include "unit/unit_int.h"

void
dp__repair_cleared_locked(dp__unit *u, const uint64_t *gidxs, uint32_t n, uint64_t ver)
{
    if (ver == 0 && u->repair_state != DP_UNIT_REPAIR_RUNNING &&
        !(u->o.repair_every_s > 0))
        return;
    uint64_t v = ver != 0 ? ver : dp__ver_now();
    for (uint32_t i = 0; i < n; i++)
        if (dp__tomb_ver_locked(u, gidxs[i]) < v &&
            dp__map_put_u64(&u->tombs, gidxs[i], (void *)(uintptr_t)v, NULL) != 0) {
            /* Out of memory: a stale commit or a repair may bring a row back. */
            DP_LOG_W("unit %u: out of memory recording a cleared row", u->o.unit_id);
            return;
        }
}

uint8_t *
dp__repair_keep_locked(dp__unit *u, const blob_rec *b, uint32_t *kept)
{
    const dp__blob *pb = b->parsed;
    uint32_t n = dp__blob_count(pb);
    uint8_t *keep = malloc(n > 0 ? n : 1);
    *kept = 0;
    if (keep == NULL)
        return NULL;
    for (uint32_t i = 0; i < n; i++) {
        const dp__blob_entry *e = dp__blob_entry_at(pb, i);
        row *r = dp__map_get_u64(&u->rows, e->gidx);
        slot *s = dp__row_slot(r, e->field, (uint32_t)e->field_len);
        /* Cleared at the copy's version or after ("Versions"). */
        uint64_t tomb = dp__tomb_ver_locked(u, e->gidx);
        bool cleared = tomb != 0 && tomb >= (b->vers != NULL ? b->vers[i] : 0);
        /* A key it lacks, or holds at a lower version than the copy's. */
        bool newer = b->vers != NULL && s != NULL && s->b != NULL && s->ver < b->vers[i];
        keep[i] = !cleared && (s == NULL || s->b == NULL || newer);
        *kept += keep[i];
    }
    return keep;
}

void
dp__repair_counted_locked(dp__unit *u, const blob_rec *b, const uint8_t *keep,
                          uint32_t kept)
{
    uint32_t n = dp__blob_count(b->parsed);
    uint64_t bytes = 0;
    for (uint32_t i = 0; i < n; i++)
        if (keep[i])
            bytes += dp__blob_entry_at(b->parsed, i)->len;
    u->stats.repair_keys += kept;
    u->stats.repair_bytes += bytes;
    u->stats.repair_skipped += n - kept;
}

void
dp__unit_repair_failed(dp__unit *u, uint64_t failed)
{
    pthread_mutex_lock(&u->mu);
    u->stats.repair_failed += failed;
    pthread_mutex_unlock(&u->mu);
}

void
dp__unit_repair_begin(dp__unit *u)
{
    pthread_mutex_lock(&u->mu);
    if (u->repair_state != DP_UNIT_REPAIR_RUNNING) {
        u->repair_state = DP_UNIT_REPAIR_RUNNING;
        u->repair_failed0 = u->stats.repair_failed;
        u->stats.repair_passes++;
    }
    pthread_mutex_unlock(&u->mu);
}

void
dp__unit_repair_under(dp__unit *u, uint64_t keys)
{
    pthread_mutex_lock(&u->mu);
    u->stats.under_replicated = keys;
    pthread_mutex_unlock(&u->mu);
}

void
dp__repair_prune_tombs_locked(dp__unit *u)
{
    if (u->repair_state == DP_UNIT_REPAIR_RUNNING || dp__map_len(&u->tombs) == 0)
        return;
    double keep = u->o.tomb_keep_s > 0 ? u->o.tomb_keep_s
                                       : DP_MAX(u->o.alloc_lease_s, 120.0) + 60.0;
    /* Those older than keep go (collected first: no deletes while the map is
     * walked). */
    uint64_t now = dp__ver_now(), span = (uint64_t)(keep * 1e6) << DP__VER_SALT_BITS;
    uintptr_t cut = now > span ? (uintptr_t)(now - span) : 0;
    size_t n = dp__map_len(&u->tombs), k = 0, it = 0;
    uint64_t *old = n > 0 ? malloc(n * sizeof *old) : NULL, g;
    void *v;
    if (old == NULL)
        return;
    while (dp__map_next(&u->tombs, &it, NULL, NULL, &g, &v))
        if ((uintptr_t)v < cut)
            old[k++] = g;
    for (size_t i = 0; i < k; i++)
        dp__map_del_u64(&u->tombs, old[i]);
    free(old);
}

void
dp__unit_repair_end(dp__unit *u)
{
    pthread_mutex_lock(&u->mu);
    u->repair_state = u->stats.repair_failed > u->repair_failed0 ? DP_UNIT_REPAIR_PARTIAL
                                                                 : DP_UNIT_REPAIR_DONE;
    dp__repair_prune_tombs_locked(u);
    pthread_mutex_unlock(&u->mu);
}

/* The most keys one list_keys reply carries (the wire's lists hold 2^20). */
#define LIST_KEYS_MAX 65536

/* ---- the k smallest rows: a max-heap of k while scanning ---- */

/* Restore the max-heap h[0..n) below i (h[i] may be too small). */
static void
heap_down(uint64_t *h, size_t n, size_t i)
{
    for (;;) {
        size_t l = 2 * i + 1, m = i;
        if (l < n && h[l] > h[m])
            m = l;
        if (l + 1 < n && h[l + 1] > h[m])
            m = l + 1;
        if (m == i)
            return;
        uint64_t t = h[m];
        h[m] = h[i];
        h[i] = t;
        i = m;
    }
}

static void
heapify(uint64_t *h, size_t n)
{
    for (size_t i = n / 2; i-- > 0;)
        heap_down(h, n, i);
}

/*
 * The (at most) k smallest rows from `from` on that unit for_unit holds, into
 * h (room for k), sorted; their count, *more when there were others. One pass
 * over the rows keeping the k smallest in a max-heap, then a heapsort of k: a
 * repair lists its peer's rows a page of 64..4096 at a time, under the unit's
 * lock, and sorting every remaining row for each page cost the foreground
 * O(rows log rows) a page.
 */
static size_t
smallest_rows(dp__unit *u, uint32_t for_unit, uint64_t from, size_t k, uint64_t *h,
              bool *more)
{
    size_t n = 0, it = 0;
    uint64_t gidx;
    void *v;
    while (dp__map_next(&u->rows, &it, NULL, NULL, &gidx, &v)) {
        if (gidx < from || !dp__row_on_unit(gidx, for_unit, u->o.n_units, u->o.replicas))
            continue;
        if (n < k) {
            h[n++] = gidx;
            if (n == k)
                heapify(h, n);
        } else {
            *more = true;
            if (gidx < h[0]) {
                h[0] = gidx;
                heap_down(h, n, 0);
            }
        }
    }
    if (n < k)
        heapify(h, n);
    for (size_t end = n; end > 1; end--) { /* the largest to the back, in turn */
        uint64_t t = h[0];
        h[0] = h[end - 1];
        h[end - 1] = t;
        heap_down(h, end - 1, 0);
    }
    return n;
}

int
dp__unit_list_keys_locked(dp__unit *u, uint32_t for_unit, uint64_t from,
                          uint32_t max_rows, dp__unit_keys_page *pg, dp_detail *d)
{
    *pg = (dp__unit_keys_page){.next = from};
    bool *more = &pg->more;
    if (for_unit >= u->o.n_units || max_rows == 0 || max_rows > 65536)
        return dp__fail(d, DP_EPROTO,
                        "list_keys: unit %u of %u and 1..65536 rows are needed (got %u)",
                        for_unit, u->o.n_units, max_rows);
    /* The rows both hold, from `from` on, sorted; the first max_rows of them. */
    size_t cap = DP_MIN((size_t)max_rows, dp__map_len(&u->rows));
    uint64_t *g = malloc((cap > 0 ? cap : 1) * sizeof *g);
    if (g == NULL)
        return dp__fail(d, DP_ENOMEM, "list_keys: out of memory");
    size_t n = smallest_rows(u, for_unit, from, cap, g, more);
    /* At most LIST_KEYS_MAX keys a reply (wide rows): whole rows, one at least. */
    size_t keys_in = 0;
    for (size_t i = 0; i < n; i++) {
        const row *r = dp__map_get_u64(&u->rows, g[i]);
        if (i > 0 && keys_in + r->n > LIST_KEYS_MAX) {
            n = i;
            *more = true;
            break;
        }
        keys_in += r->n;
    }
    /* Their published keys: lengths first, then one text block they view. */
    size_t nk = 0, bytes = 0;
    char kb[DP_KEY_MAX + 1];
    for (size_t i = 0; i < n; i++) {
        const row *r = dp__map_get_u64(&u->rows, g[i]);
        for (uint32_t k = 0; k < r->n; k++)
            if (r->s[k].b != NULL) {
                nk++;
                bytes += dp__key_format(g[i], r->s[k].field, r->s[k].flen, kb);
            }
    }
    dp__wire_str *ks = malloc((nk > 0 ? nk : 1) * sizeof *ks);
    uint64_t *vs = malloc((nk > 0 ? nk : 1) * sizeof *vs);
    char *t = malloc(bytes > 0 ? bytes : 1);
    if (ks == NULL || vs == NULL || t == NULL) {
        free(g);
        free(ks);
        free(vs);
        free(t);
        return dp__fail(d, DP_ENOMEM, "list_keys: out of memory");
    }
    size_t at = 0, j = 0;
    for (size_t i = 0; i < n; i++) {
        const row *r = dp__map_get_u64(&u->rows, g[i]);
        for (uint32_t k = 0; k < r->n; k++)
            if (r->s[k].b != NULL) {
                size_t kl = dp__key_format(g[i], r->s[k].field, r->s[k].flen, kb);
                memcpy(t + at, kb, kl);
                vs[j] = r->s[k].ver;
                ks[j++] = (dp__wire_str){t + at, (uint32_t)kl};
                at += kl;
            }
    }
    if (n > 0) {
        pg->next = g[n - 1] + 1;
        *more = *more && g[n - 1] != UINT64_MAX;
    }
    free(g);
    pg->keys = (dp__wire_strs){ks, (uint32_t)nk};
    pg->vers = vs;
    pg->text = t;
    return DP_OK;
}
