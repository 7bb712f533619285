/*
 * A get's answers (get.c's opening comment has the design): each unit's reply
 * to resolve_keys, resolve_rows or resolve matched to the keys it was asked
 * for, each key located for its READ or failed.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/get_op.h"
#include "common/le.h"

/* Index of key in list starting from *cur (in order, else searched), or -1. */
static ptrdiff_t
match_str(const dp__wire_strs *l, uint32_t *cur, const char *key, uint32_t klen)
{
    if (*cur < l->n && key_is(l->v[*cur], key, klen))
        return (ptrdiff_t)(*cur)++;
    for (uint32_t i = 0; i < l->n; i++)
        if (key_is(l->v[i], key, klen))
            return (ptrdiff_t)i;
    return -1;
}

static ptrdiff_t
match_loc(const dp__wire_key_locs *l, uint32_t *cur, const char *key, uint32_t klen)
{
    if (*cur < l->n && key_is(l->v[*cur].key, key, klen))
        return (ptrdiff_t)(*cur)++;
    for (uint32_t i = 0; i < l->n; i++)
        if (key_is(l->v[i].key, key, klen))
            return (ptrdiff_t)i;
    return -1;
}

/*
 * Unit u's located key: where it is, whether it fits, and where it goes
 * (the values' own buffer, staging, or the caller's memory: registered, or
 * any when the unit's slab is mapped here and the READ copies it).
 */
static void
get_locate(get_op *x, uint32_t u, uint32_t i, uint64_t off, uint64_t len,
           uint64_t *stage_need)
{
    dp_get_item *it = &x->items[i];
    key_state *ks = &x->ks[i];
    const dp__unit_conn *uc = &x->c->units[u];
    if (off > uc->region_bytes || len > uc->region_bytes - off) {
        item_fail(it, ks, DP_EPROTO);
        dp__fail(&x->ur[u].st.det, DP_EPROTO,
                 "key '%s' located outside the unit's region", it->key);
        return;
    }
    if (x->vals == NULL && it->cap < len) {
        item_fail(it, ks, DP_ETOOBIG);
        return;
    }
    ks->st = K_READ;
    ks->off = off;
    ks->len = len;
    ks->staged = false;
    /* The alloc form's places: get_place_values, once every unit answered. */
    if (x->vals == NULL && len > 0 && ks->inl == NULL && len > x->ur[u].copy_max &&
        !dp__client_direct_locked(x->c, it->dst, len)) {
        ks->staged = true;
        ks->soff = *stage_need;
        *stage_need += DP_ALIGN_UP(len, 64);
    }
}

/* Unit u's answer (res) matched to its keys still asked. */
bool
dp__get_match_keys(get_op *x, uint32_t u, const dp__wire_resolve_keys_res *res,
                   uint64_t *stage_need)
{
    const uint32_t *cnt = x->g.start, *order = x->g.order;
    dp_detail *ud = &x->ur[u].st.det;
    bool again = false;
    dp__wire_str_copy(res->pin_id, x->ur[u].pin, sizeof x->ur[u].pin);
    uint32_t ce = 0, cm = 0, cp = 0, cf = 0, cz = 0;
    for (uint32_t k = cnt[u]; k < cnt[u + 1]; k++) {
        uint32_t i = order[k];
        if (x->ks[i].st != K_ASK)
            continue;
        dp_get_item *it = &x->items[i];
        uint32_t kl = x->ks[i].klen;
        ptrdiff_t m;
        x->ks[i].inl = NULL;
        if ((m = match_loc(&res->entries, &ce, it->key, kl)) >= 0) {
            const dp__wire_key_loc *l = &res->entries.v[m];
            it->nbytes = l->len;
            if (it->desc != NULL)
                dp__fill_desc(it->desc, l);
            x->ks[i].inl = l->data.n > 0 ? l->data.p : NULL; /* the decoder checked n */
            get_locate(x, u, i, l->off, l->len, stage_need);
        } else if (match_str(&res->missing, &cm, it->key, kl) >= 0) {
            item_fail(it, &x->ks[i], DP_ENOTFOUND);
        } else if (match_str(&res->pending, &cp, it->key, kl) >= 0) {
            again = true; /* being staged from SSD: ask again */
            x->slow_again = true;
        } else if (match_str(&res->failed, &cf, it->key, kl) >= 0) {
            item_fail(it, &x->ks[i], DP_ELOST);
            dp__fail(ud, DP_ELOST, "staging key '%s' from SSD failed", it->key);
        } else if (match_str(&res->fenced, &cz, it->key, kl) >= 0) {
            /* No read lease: it may hold an older copy ("Leases"); the next
             * unit of the row is asked. */
            item_fail(it, &x->ks[i], DP_EBUSY);
            dp__fail(ud, DP_EBUSY,
                     "unit %u holds no read lease (a peer fenced it, or it cannot reach "
                     "most units): it may hold older copies until a pass catches it up",
                     u);
        } else {
            item_fail(it, &x->ks[i], DP_EPROTO);
            dp__fail(ud, DP_EPROTO, "resolve_keys did not answer for key '%s'", it->key);
        }
    }
    return again;
}

static ptrdiff_t
match_bloc(const dp__wire_blob_locs *l, uint32_t *cur, dp__wire_str id)
{
    if (*cur < l->n && key_is(l->v[*cur].id, id.p, id.n))
        return (ptrdiff_t)(*cur)++;
    for (uint32_t i = 0; i < l->n; i++)
        if (key_is(l->v[i].id, id.p, id.n))
            return (ptrdiff_t)i;
    return -1;
}

/*
 * Unit u's answer to resolve (its keys' hinted blobs): a key whose blob is
 * pinned and whole is located from its hint; any other drops its hint and
 * is asked by key next round. Returns whether a key must be asked again.
 */
bool
dp__get_match_blobs(get_op *x, uint32_t u, const dp__wire_resolve_res *res,
                    uint64_t *stage_need)
{
    const uint32_t *cnt = x->g.start, *order = x->g.order;
    uint32_t base = cnt[u];
    dp__wire_str_copy(res->pin_id, x->ur[u].pin, sizeof x->ur[u].pin);
    uint32_t cb = 0, cw = 0;
    for (uint32_t j = 0; j < x->ur[u].nb; j++) {
        blob_ans *b = &x->bans[base + j];
        dp__wire_str id = x->bids[base + j];
        ptrdiff_t m = match_bloc(&res->blobs, &cb, id);
        b->ok = m >= 0 && match_str(&res->whole, &cw, id.p, id.n) >= 0;
        if (b->ok) {
            b->off = res->blobs.v[m].off;
            b->len = res->blobs.v[m].len;
        }
    }
    bool again = false;
    for (uint32_t k = cnt[u]; k < cnt[u + 1]; k++) {
        uint32_t i = order[k];
        if (x->ks[i].st != K_ASK)
            continue;
        dp_get_item *it = &x->items[i];
        const dp_loc *l = it->loc;
        const blob_ans *b = &x->bans[base + x->ks[i].bidx];
        x->ks[i].inl = NULL;
        if (b->ok && l->off <= b->len && l->nbytes <= b->len - l->off) {
            it->nbytes = l->nbytes;
            if (it->desc != NULL)
                dp__fill_desc_loc(it->desc, l);
            get_locate(x, u, i, b->off + l->off, l->nbytes, stage_need);
        } else {
            /* Gone, overwritten or cleared in part, or being staged: by key. */
            x->ks[i].hinted = false;
            x->c->cnt.loc_misses++;
            again = true;
        }
    }
    return again;
}

/* Unit u's resolve_rows answer: its records checked before any is used. */
static int
rows_check(const get_op *x, uint32_t u, const dp__wire_resolve_rows_res *res,
           dp_detail *ud)
{
    uint32_t nk = x->ur[u].nk;
    if (res->locs.n != (uint64_t)nk * DP_WIRE_LOC_LEN)
        return dp__fail(
            ud, DP_EPROTO,
            "resolve_rows answered %u bytes of records for %u values (want %u)",
            res->locs.n, nk, nk * DP_WIRE_LOC_LEN);
    uint64_t found = 0;
    for (uint32_t j = 0; j < nk; j++) {
        const uint8_t *o = res->locs.p + (size_t)j * DP_WIRE_LOC_LEN;
        uint32_t st = dp__le32_load(o + 16);
        if (st >= DP_WIRE_ROW_STATES_)
            return dp__fail(ud, DP_EPROTO, "resolve_rows: value %u has state %u", j, st);
        if (st != DP_WIRE_ROW_FOUND)
            continue;
        if (dp__le32_load(o + 20) >= res->descs.n)
            return dp__fail(ud, DP_EPROTO,
                            "resolve_rows: value %u names description %u of %u", j,
                            dp__le32_load(o + 20), res->descs.n);
        found += dp__le64_load(o + 8);
    }
    if (res->data.n > 0 && found != res->data.n)
        return dp__fail(ud, DP_EPROTO,
                        "resolve_rows: %u bytes inline for found values of %" PRIu64,
                        res->data.n, found);
    return DP_OK;
}

bool
dp__get_match_rows(get_op *x, uint32_t u, const dp__wire_resolve_rows_res *res,
                   uint64_t *stage_need)
{
    const uint32_t *cnt = x->g.start, *order = x->g.order;
    dp_detail *ud = &x->ur[u].st.det;
    dp__wire_str_copy(res->pin_id, x->ur[u].pin, sizeof x->ur[u].pin);
    int rc = rows_check(x, u, res, ud);
    /* Each description's kind once (a value's is looked up by index). */
    dp_kind *kinds = rc == DP_OK ? malloc((res->descs.n + 1) * sizeof *kinds) : NULL;
    if (rc == DP_OK && kinds == NULL)
        rc = dp__fail(ud, DP_ENOMEM, "get: out of memory");
    for (uint32_t j = 0; kinds != NULL && j < res->descs.n; j++)
        kinds[j] = dp__kind_of(res->descs.v[j].kind);
    bool again = false;
    uint64_t dpos = 0;
    uint32_t j = 0;
    for (uint32_t k = cnt[u]; k < cnt[u + 1]; k++) {
        uint32_t i = order[k];
        key_state *ks = &x->ks[i];
        if (ks->st != K_ASK)
            continue;
        dp_get_item *it = &x->items[i];
        ks->inl = NULL;
        if (rc != DP_OK) {
            item_fail(it, ks, rc);
            continue;
        }
        const uint8_t *o = res->locs.p + (size_t)j++ * DP_WIRE_LOC_LEN;
        uint64_t len = dp__le64_load(o + 8);
        switch (dp__le32_load(o + 16)) {
        case DP_WIRE_ROW_FOUND: {
            it->nbytes = len;
            if (it->desc != NULL) {
                uint32_t di = dp__le32_load(o + 20);
                dp__fill_desc_wire(it->desc, &res->descs.v[di], kinds[di], len);
            }
            if (res->data.n > 0 && len > 0)
                ks->inl = res->data.p + dpos; /* rows_check: inside data */
            dpos += len;
            get_locate(x, u, i, dp__le64_load(o), len, stage_need);
            break;
        }
        case DP_WIRE_ROW_MISSING:
            item_fail(it, ks, DP_ENOTFOUND);
            break;
        case DP_WIRE_ROW_PENDING:
            again = true; /* being staged from SSD: ask again */
            x->slow_again = true;
            break;
        case DP_WIRE_ROW_FAILED:
            item_fail(it, ks, DP_ELOST);
            dp__fail(ud, DP_ELOST, "staging key '%s' from SSD failed", it->key);
            break;
        default: /* fenced: no read lease ("Leases"); the row's next unit is asked */
            item_fail(it, ks, DP_EBUSY);
            dp__fail(ud, DP_EBUSY,
                     "unit %u holds no read lease (a peer fenced it, or it cannot reach "
                     "most units): it may hold older copies until a pass catches it up",
                     u);
            break;
        }
    }
    if (rc != DP_OK)
        x->ur[u].st.rc = rc;
    free(kinds);
    return again;
}
