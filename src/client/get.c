/*
 * dp_client_get and dp_client_get_alloc (DESIGN section 5): resolve_keys on
 * every unit at once, one READ of every located value at once, unpin.
 *
 * Restarts. Before the first round every unit of the batch is made ready
 * (re-bound after a restart or a failed endpoint, see put.c). A resolve
 * answered by another incarnation than the one the data path is bound to
 * fails that unit's keys with DP_ERESTARTED and READs nothing: its offsets
 * name another process's slab.
 *
 * Rounds. A round asks every unit for its keys that are still unresolved,
 * READs what was located (each unit's part under the deadline its pin
 * allows: the pin's life, counted from when the request was sent, minus a
 * margin), then unpins. Keys a unit answered "pending" (being staged from
 * SSD) or that met a busy unit are asked again in the next round, after a
 * backoff, until the operation's budget runs out. A READ never outlives its
 * pin: when too little pin time is left the READ is not started.
 *
 * Destinations inside memory registered with the client are READ into
 * directly. Others get a place in one staging buffer per round and are copied
 * out after a successful READ. A staging buffer that a failed READ may still
 * write into is retired (dp__client_buf_put_locked checks).
 *
 * Replies are matched to requests in order (the unit answers entries and
 * missing keys in request order); a reply out of order falls back to a
 * search, so a unit that reorders is still understood.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blob/keys.h"
#include "client/client_int.h"

enum { K_ASK = 0, K_READ, K_DONE };

typedef struct key_state {
    uint32_t unit;
    uint32_t klen;
    int st;
    uint64_t off; /* slab offset (K_READ) */
    uint64_t len;
    bool staged;   /* READ into staging, then copied */
    uint64_t soff; /* its place in the round's staging buffer */
} key_state;

struct dp_values {
    dp_client *c; /* counted in c->n_values once set; NULL before */
    size_t n;
    dp_get_item *items;
    dp_value_desc *descs;
    uint8_t **bufs; /* registered buffers holding the values */
    size_t n_bufs;
};

typedef struct unit_round {
    int rc;
    dp_detail det;
    char pin[DP_WIRE_RID_MAX + 32];
    double sent_at;
    bool asked;
} unit_round;

static void
unpin_locked(dp_client *c, uint32_t u, char *pin)
{
    if (pin[0] == '\0')
        return;
    dp_wire_request q;
    memset(&q, 0, sizeof q);
    q.op = DP_WIRE_OP_UNPIN;
    q.a.unpin.pin_id = dp_wire_s(pin);
    dp__client_notify_locked(c, u, &q);
    pin[0] = '\0';
}

static void
fill_desc(dp_value_desc *o, const dp_wire_key_loc *l)
{
    dp_blob_kind k = DP_BLOB_BYTES;
    if (dp_blob_kind_parse(l->kind.p, l->kind.n, &k) != 0)
        k = DP_BLOB_BYTES;
    o->kind = (dp_kind)k;
    dp_wire_str_copy(l->dtype, o->dtype, sizeof o->dtype);
    o->ndim = DP_MIN(l->ndim, (uint32_t)DP_SHAPE_MAX);
    for (uint32_t i = 0; i < o->ndim; i++)
        o->shape[i] = l->shape[i];
    o->nbytes = l->len;
}

static bool
key_is(dp_wire_str s, const char *key, uint32_t klen)
{
    return s.n == klen && memcmp(s.p, key, klen) == 0;
}

/* Index of key in list starting from *cur (in order, else searched), or -1. */
static ptrdiff_t
match_str(const dp_wire_strs *l, uint32_t *cur, const char *key, uint32_t klen)
{
    if (*cur < l->n && key_is(l->v[*cur], key, klen))
        return (ptrdiff_t)(*cur)++;
    for (uint32_t i = 0; i < l->n; i++)
        if (key_is(l->v[i], key, klen))
            return (ptrdiff_t)i;
    return -1;
}

static ptrdiff_t
match_loc(const dp_wire_key_locs *l, uint32_t *cur, const char *key, uint32_t klen)
{
    if (*cur < l->n && key_is(l->v[*cur].key, key, klen))
        return (ptrdiff_t)(*cur)++;
    for (uint32_t i = 0; i < l->n; i++)
        if (key_is(l->v[i].key, key, klen))
            return (ptrdiff_t)i;
    return -1;
}

static void
item_fail(dp_get_item *it, key_state *ks, int code)
{
    it->status = code;
    ks->st = K_DONE;
}

/*
 * The engine: vals != NULL is the alloc form (destinations come from
 * registered buffers owned by vals).
 */
static int
get_locked(dp_client *c, dp_get_item *items, size_t n, dp_values *vals, dp_detail *d)
{
    uint32_t N = c->n_units;
    double deadline = dp_now_s() + c->o.timeout_s;
    int rc = DP_OK;
    key_state *ks = calloc(n > 0 ? n : 1, sizeof *ks);
    uint32_t *cnt = calloc((size_t)N + 1, sizeof *cnt);
    uint32_t *order = malloc((n > 0 ? n : 1) * sizeof *order);
    uint32_t *pos = calloc(N, sizeof *pos);
    dp_wire_str *keys = malloc((n > 0 ? n : 1) * sizeof *keys);
    uint32_t *slot_unit = malloc(N * sizeof *slot_unit);
    unit_round *ur = calloc(N, sizeof *ur);
    dp_range *local = malloc((n > 0 ? n : 1) * sizeof *local);
    dp_range *remote = malloc((n > 0 ? n : 1) * sizeof *remote);
    dp_xfer_desc *ops = malloc(N * sizeof *ops);
    int *results = malloc(N * sizeof *results);
    dp_detail *xdet = calloc(N, sizeof *xdet);
    if (ks == NULL || cnt == NULL || order == NULL || pos == NULL || keys == NULL ||
        slot_unit == NULL || ur == NULL || local == NULL || remote == NULL ||
        ops == NULL || results == NULL || xdet == NULL) {
        rc = dp_fail(d, DP_ENOMEM, "get: out of memory");
        goto out;
    }
    /* Check and place every key; group by unit. */
    for (size_t i = 0; i < n; i++) {
        dp_get_item *it = &items[i];
        it->nbytes = 0;
        it->status = DP_ETIMEDOUT;
        if (it->key == NULL) {
            rc = dp_fail(d, DP_EINVAL, "get: key %zu is NULL", i);
            goto out;
        }
        size_t kl = strlen(it->key);
        dp_key_parts kp;
        rc = dp_key_split(it->key, kl, &kp, d);
        if (rc != 0) {
            dp_fail_ctx(d, rc, "get: key %zu", i);
            goto out;
        }
        if (vals == NULL && it->cap > 0 && it->dst == NULL) {
            rc = dp_fail(d, DP_EINVAL,
                         "get: key '%s': NULL destination of %" PRIu64 " bytes", it->key,
                         it->cap);
            goto out;
        }
        ks[i].unit = (uint32_t)(kp.gidx % N);
        ks[i].klen = (uint32_t)kl;
        ks[i].st = K_ASK;
        cnt[ks[i].unit + 1]++;
    }
    for (uint32_t u = 0; u < N; u++)
        cnt[u + 1] += cnt[u];
    for (size_t i = 0; i < n; i++)
        order[cnt[ks[i].unit] + pos[ks[i].unit]++] = (uint32_t)i;

    /*
     * Re-bind units that restarted or whose endpoint failed; keys of a unit
     * that is down, or that restarted (reported once), fail now.
     */
    {
        uint32_t nu = 0;
        for (uint32_t u = 0; u < N; u++)
            if (cnt[u + 1] > cnt[u])
                slot_unit[nu++] = u;
        int *rcs = malloc((nu > 0 ? nu : 1) * sizeof *rcs);
        dp_detail *dets = malloc((nu > 0 ? nu : 1) * sizeof *dets);
        if (rcs == NULL || dets == NULL) {
            free(rcs);
            free(dets);
            rc = dp_fail(d, DP_ENOMEM, "get: out of memory");
            goto out;
        }
        dp__client_ready_locked(c, slot_unit, nu, deadline, rcs, dets);
        for (uint32_t k = 0; k < nu; k++) {
            uint32_t u = slot_unit[k];
            if (rcs[k] == 0)
                continue;
            ur[u].rc = rcs[k];
            ur[u].det = dets[k];
            for (uint32_t j = cnt[u]; j < cnt[u + 1]; j++)
                item_fail(&items[order[j]], &ks[order[j]], rcs[k]);
        }
        free(rcs);
        free(dets);
    }

    double step = 0.002;
    for (;;) {
        /* 1. resolve_keys on every unit with keys still to ask. */
        size_t ns = 0;
        for (uint32_t u = 0; u < N; u++) {
            ur[u].asked = false;
            ur[u].pin[0] = '\0';
            uint32_t nk = 0;
            for (uint32_t k = cnt[u]; k < cnt[u + 1]; k++) {
                uint32_t i = order[k];
                if (ks[i].st == K_ASK)
                    keys[cnt[u] + nk++] = (dp_wire_str){items[i].key, ks[i].klen};
            }
            if (nk == 0)
                continue;
            dp_wire_request q;
            memset(&q, 0, sizeof q);
            q.op = DP_WIRE_OP_RESOLVE_KEYS;
            q.a.resolve_keys.keys = (dp_wire_strs){keys + cnt[u], nk};
            dp_detail_clear(&ur[u].det);
            ur[u].rc = dp__client_prepare_locked(c, u, ns, &q, &ur[u].det);
            if (ur[u].rc != 0) {
                for (uint32_t k = cnt[u]; k < cnt[u + 1]; k++)
                    if (ks[order[k]].st == K_ASK)
                        item_fail(&items[order[k]], &ks[order[k]], ur[u].rc);
                continue;
            }
            ur[u].asked = true;
            ur[u].sent_at = dp_now_s();
            slot_unit[ns++] = u;
        }
        if (ns == 0)
            break;
        dp_ctl_call_many(c->ctl, c->items, ns,
                         DP_MAX(dp__client_round_timeout(deadline), 0.001));

        /* 2. Match answers to keys. */
        bool again = false;
        uint64_t alloc_need = 0, stage_need = 0;
        for (size_t s = 0; s < ns; s++) {
            uint32_t u = slot_unit[s];
            dp_ctl_item *ci = &c->items[s];
            int urc = ci->rc;
            dp_detail *ud = &ur[u].det;
            if (urc != 0)
                *ud = ci->det;
            dp_wire_reply rep;
            memset(&rep, 0, sizeof rep);
            if (urc == DP_ETRANSFER)
                c->cnt.units_down++;
            if (urc == 0) {
                urc = dp_wire_reply_decode(ci->reply.data, ci->reply.len,
                                           DP_WIRE_OP_RESOLVE_KEYS, NULL, &rep, ud);
                if (urc == 0 && dp__client_reply_check_locked(c, u, &rep, true, ud)) {
                    /* Another process answered: its offsets are not in the slab
                     * this data path maps. Let go of its pin, READ nothing. */
                    urc = DP_ERESTARTED;
                    if (rep.ok && rep.r.resolve_keys.pin_id.n > 0) {
                        char pin[DP_WIRE_RID_MAX + 32];
                        dp_wire_str_copy(rep.r.resolve_keys.pin_id, pin, sizeof pin);
                        unpin_locked(c, u, pin);
                    }
                } else if (urc == 0 && !rep.ok) {
                    urc = dp_wire_error_to_detail(&rep.err, ud);
                    if (urc == DP_EBUSY && dp__client_left(deadline) > 0) {
                        again = true;
                        dp_wire_reply_fini(&rep);
                        continue;
                    }
                }
            }
            ur[u].rc = urc;
            if (urc != 0) {
                for (uint32_t k = cnt[u]; k < cnt[u + 1]; k++)
                    if (ks[order[k]].st == K_ASK)
                        item_fail(&items[order[k]], &ks[order[k]], urc);
                dp_wire_reply_fini(&rep);
                continue;
            }
            const dp_wire_resolve_keys_res *res = &rep.r.resolve_keys;
            dp_wire_str_copy(res->pin_id, ur[u].pin, sizeof ur[u].pin);
            uint32_t ce = 0, cm = 0, cp = 0, cf = 0;
            for (uint32_t k = cnt[u]; k < cnt[u + 1]; k++) {
                uint32_t i = order[k];
                if (ks[i].st != K_ASK)
                    continue;
                dp_get_item *it = &items[i];
                ptrdiff_t x;
                if ((x = match_loc(&res->entries, &ce, it->key, ks[i].klen)) >= 0) {
                    const dp_wire_key_loc *l = &res->entries.v[x];
                    const dp__unit_conn *uc = &c->units[u];
                    it->nbytes = l->len;
                    if (it->desc != NULL)
                        fill_desc(it->desc, l);
                    if (l->off > uc->region_bytes || l->len > uc->region_bytes - l->off) {
                        item_fail(it, &ks[i], DP_EPROTO);
                        dp_fail(ud, DP_EPROTO,
                                "key '%s' located outside the unit's region", it->key);
                        continue;
                    }
                    if (vals == NULL && it->cap < l->len) {
                        item_fail(it, &ks[i], DP_ETOOBIG);
                        continue;
                    }
                    ks[i].st = K_READ;
                    ks[i].off = l->off;
                    ks[i].len = l->len;
                    ks[i].staged = false;
                    if (vals != NULL) {
                        ks[i].soff = alloc_need;
                        alloc_need += DP_ALIGN_UP(l->len, 64);
                    } else if (l->len > 0 &&
                               !dp__client_direct_locked(c, it->dst, l->len)) {
                        ks[i].staged = true;
                        ks[i].soff = stage_need;
                        stage_need += DP_ALIGN_UP(l->len, 64);
                    }
                } else if (match_str(&res->missing, &cm, it->key, ks[i].klen) >= 0) {
                    item_fail(it, &ks[i], DP_ENOTFOUND);
                } else if (match_str(&res->pending, &cp, it->key, ks[i].klen) >= 0) {
                    again = true; /* being staged from SSD: ask again */
                } else if (match_str(&res->failed, &cf, it->key, ks[i].klen) >= 0) {
                    item_fail(it, &ks[i], DP_ELOST);
                    dp_fail(ud, DP_ELOST, "staging key '%s' from SSD failed", it->key);
                } else {
                    item_fail(it, &ks[i], DP_EPROTO);
                    dp_fail(ud, DP_EPROTO, "resolve_keys did not answer for key '%s'",
                            it->key);
                }
            }
            dp_wire_reply_fini(&rep);
        }

        /* 3. Destinations: the values' own buffer, and staging. */
        uint8_t *abuf = NULL, *sbuf = NULL;
        int brc = DP_OK;
        dp_detail bdet;
        dp_detail_clear(&bdet);
        if (alloc_need > 0) {
            uint8_t **nb = realloc(vals->bufs, (vals->n_bufs + 1) * sizeof *nb);
            dp__buf *b = NULL;
            if (nb == NULL)
                brc = dp_fail(&bdet, DP_ENOMEM, "get: out of memory");
            else
                vals->bufs = nb;
            if (brc == 0)
                brc = dp__client_buf_get_locked(c, alloc_need, DP__BUF_VALUES, &b, &bdet);
            if (brc == 0) {
                abuf = b->p;
                vals->bufs[vals->n_bufs++] = abuf;
            }
        }
        if (brc == 0 && stage_need > 0) {
            dp__buf *b = NULL;
            brc = dp__client_buf_get_locked(c, stage_need, DP__BUF_STAGING, &b, &bdet);
            if (brc == 0)
                sbuf = b->p;
        }

        /* 4. One READ per unit, all at once, inside the pins' life. */
        size_t nops = 0, nr = 0;
        double now = dp_now_s();
        double xfer_left = dp__client_left(deadline);
        for (size_t s = 0; s < ns; s++) {
            uint32_t u = slot_unit[s];
            size_t r0 = nr;
            for (uint32_t k = cnt[u]; k < cnt[u + 1]; k++) {
                uint32_t i = order[k];
                if (ks[i].st != K_READ)
                    continue;
                dp_get_item *it = &items[i];
                if (brc != 0) {
                    item_fail(it, &ks[i], brc);
                    ur[u].rc = brc;
                    ur[u].det = bdet;
                    continue;
                }
                if (vals != NULL) {
                    it->dst = abuf != NULL ? abuf + ks[i].soff : NULL;
                    it->cap = ks[i].len;
                }
                if (ks[i].len == 0)
                    continue;
                uint8_t *dst = ks[i].staged ? sbuf + ks[i].soff : it->dst;
                local[nr] = (dp_range){(uint64_t)(uintptr_t)dst, ks[i].len};
                remote[nr] = (dp_range){c->units[u].slab_addr + ks[i].off, ks[i].len};
                nr++;
            }
            if (nr == r0)
                continue;
            double pin = c->units[u].read_pin_s;
            double margin = DP_MAX(0.2, 0.1 * pin);
            double pin_left = pin - margin - (now - ur[u].sent_at);
            if (pin_left < xfer_left)
                xfer_left = pin_left;
            ops[nops] = (dp_xfer_desc){DP_XFER_READ, local + r0, nr - r0,
                                       remote + r0,  nr - r0,    c->units[u].remote};
            results[nops] = 0;
            slot_unit[nops] = u; /* reuse: op index -> unit (slots are done) */
            nops++;
        }
        if (nops > 0) {
            if (!(xfer_left > 0)) {
                for (size_t o = 0; o < nops; o++) {
                    results[o] = dp_fail(&xdet[o], DP_ETIMEDOUT,
                                         "no time left to READ within the budget and the "
                                         "pin's life (%.3g s)",
                                         c->units[slot_unit[o]].read_pin_s);
                }
            } else {
                for (size_t o = 0; o < nops; o++)
                    dp_detail_clear(&xdet[o]);
                dp_endpoint_transfer_many(c->ep, ops, nops, xfer_left, results, xdet,
                                          NULL);
            }
        }
        for (size_t o = 0; o < nops; o++) {
            uint32_t u = slot_unit[o];
            for (uint32_t k = cnt[u]; k < cnt[u + 1]; k++) {
                uint32_t i = order[k];
                if (ks[i].st != K_READ)
                    continue;
                if (results[o] != 0) {
                    item_fail(&items[i], &ks[i], results[o]);
                } else {
                    if (ks[i].staged)
                        memcpy(items[i].dst, sbuf + ks[i].soff, ks[i].len);
                    items[i].status = 0;
                    ks[i].st = K_DONE;
                }
            }
            if (results[o] != 0) {
                /*
                 * The unit answered this round's resolve: a READ that timed out
                 * or failed over a network lane means a stalled connection, which
                 * is made anew before the next transfer.
                 */
                if (c->units[u].lane != DP_XFER_LANE_SHM)
                    c->units[u].ep_suspect = true;
                ur[u].rc = results[o];
                ur[u].det = xdet[o];
                dp_fail_ctx(&ur[u].det, results[o], "READ of %s",
                            results[o] == DP_ETIMEDOUT ? "values (data discarded)"
                                                       : "values");
            }
        }
        /* Zero-byte values and any other located key with nothing to read. */
        for (size_t i = 0; i < n; i++)
            if (ks[i].st == K_READ && brc == 0 && ks[i].len == 0) {
                items[i].status = 0;
                ks[i].st = K_DONE;
            }
        /* 5. Unpin: this round's READs are done. */
        for (uint32_t u = 0; u < N; u++)
            if (ur[u].asked)
                unpin_locked(c, u, ur[u].pin);
        if (sbuf != NULL)
            dp__client_buf_put_locked(c, sbuf);
        if (!again)
            break;
        if (dp__client_left(deadline) <= 0)
            break;
        dp__client_backoff(&step, deadline);
    }
    /* Keys still unresolved: pending or busy for the whole budget. */
    for (size_t i = 0; i < n; i++)
        if (ks[i].st == K_ASK) {
            ks[i].st = K_DONE;
            items[i].status = DP_ETIMEDOUT;
            uint32_t u = ks[i].unit;
            if (ur[u].rc == 0)
                dp_fail(
                    &ur[u].det, DP_ETIMEDOUT,
                    "keys still pending (staged from SSD) or the unit still busy when "
                    "the budget of %.3g s ran out",
                    c->o.timeout_s);
            ur[u].rc = DP_ETIMEDOUT;
        }

    /* Report: first failure's code; missing keys by name; failed units. */
    size_t n_bad = 0, n_missing = 0, n_small = 0;
    int first = DP_OK;
    for (size_t i = 0; i < n; i++) {
        if (items[i].status == 0)
            continue;
        n_bad++;
        if (first == DP_OK)
            first = items[i].status;
        if (items[i].status == DP_ENOTFOUND)
            n_missing++;
        else if (items[i].status == DP_ETOOBIG)
            n_small++;
    }
    if (first != DP_OK) {
        rc = first;
        dp_fail(d, first, "get: %zu of %zu keys failed", n_bad, n);
        for (uint32_t u = 0; u < N; u++)
            if (ur[u].rc != 0)
                dp__detail_append(d, "; unit %u (%s): %s", u, c->units[u].addr,
                                  dp_detail_msg(&ur[u].det));
        if (n_missing > 0) {
            dp__detail_append(d, "; %zu missing:", n_missing);
            for (size_t i = 0; i < n; i++)
                if (items[i].status == DP_ENOTFOUND)
                    dp__detail_append(d, " '%s'", items[i].key);
        }
        if (n_bad > n_missing + n_small) {
            /* Lost (failed stage) and unreachable keys, by name, with their code. */
            dp__detail_append(d, "; failed:");
            for (size_t i = 0; i < n; i++)
                if (items[i].status != 0 && items[i].status != DP_ENOTFOUND &&
                    items[i].status != DP_ETOOBIG)
                    dp__detail_append(d, " '%s' (%s)", items[i].key,
                                      dp_errname(items[i].status));
        }
        for (size_t i = 0; i < n; i++)
            if (items[i].status == DP_ETOOBIG) {
                dp__detail_append(
                    d, "; '%s' needs %" PRIu64 " bytes, destination has %" PRIu64,
                    items[i].key, items[i].nbytes, items[i].cap);
                break;
            }
    }
out:
    free(ks);
    free(cnt);
    free(order);
    free(pos);
    free(keys);
    free(slot_unit);
    free(ur);
    free(local);
    free(remote);
    free(ops);
    free(results);
    free(xdet);
    return rc;
}

int
dp_client_get(dp_client *c, dp_get_item *items, size_t n, dp_detail *d)
{
    if (c == NULL || (items == NULL && n > 0))
        return dp_fail(d, DP_EINVAL, "dp_client_get: NULL argument");
    if (n == 0)
        return DP_OK;
    if (n > (1u << 24))
        return dp_fail(d, DP_ETOOBIG, "get: %zu keys in one call", n);
    pthread_mutex_lock(&c->mu);
    int rc = get_locked(c, items, n, NULL, d);
    pthread_mutex_unlock(&c->mu);
    return rc;
}

int
dp_client_get_alloc(dp_client *c, const char *const *keys, size_t n, dp_values **out,
                    dp_detail *d)
{
    if (c == NULL || out == NULL || (keys == NULL && n > 0))
        return dp_fail(d, DP_EINVAL, "dp_client_get_alloc: NULL argument");
    *out = NULL;
    if (n > (1u << 24))
        return dp_fail(d, DP_ETOOBIG, "get: %zu keys in one call", n);
    dp_values *v = calloc(1, sizeof *v);
    if (v == NULL)
        return dp_fail(d, DP_ENOMEM, "get: out of memory");
    v->n = n;
    v->items = calloc(n > 0 ? n : 1, sizeof *v->items);
    v->descs = calloc(n > 0 ? n : 1, sizeof *v->descs);
    if (v->items == NULL || v->descs == NULL) {
        dp_values_destroy(v);
        return dp_fail(d, DP_ENOMEM, "get: out of memory");
    }
    for (size_t i = 0; i < n; i++) {
        v->items[i].key = keys[i];
        v->items[i].desc = &v->descs[i];
    }
    int rc = DP_OK;
    pthread_mutex_lock(&c->mu);
    v->c = c;
    c->n_values++; /* v keeps c alive until dp_values_destroy */
    if (n > 0)
        rc = get_locked(c, v->items, n, v, d);
    pthread_mutex_unlock(&c->mu);
    if (rc == DP_EINVAL || rc == DP_ENOMEM) {
        bool any = false;
        for (size_t i = 0; i < n && !any; i++)
            any = v->items[i].status == 0;
        if (!any) {
            dp_values_destroy(v);
            return rc;
        }
    }
    for (size_t i = 0; i < n; i++)
        v->items[i].key = NULL; /* the caller's strings are not kept */
    *out = v;
    return rc;
}

size_t
dp_values_count(const dp_values *v)
{
    return v != NULL ? v->n : 0;
}

int
dp_values_get(const dp_values *v, size_t i, const void **data, uint64_t *nbytes,
              const dp_value_desc **desc)
{
    if (v == NULL || i >= v->n)
        return DP_EINVAL;
    const dp_get_item *it = &v->items[i];
    if (it->status != 0)
        return it->status;
    if (data != NULL)
        *data = it->dst;
    if (nbytes != NULL)
        *nbytes = it->nbytes;
    if (desc != NULL)
        *desc = &v->descs[i];
    return DP_OK;
}

void
dp_values_destroy(dp_values *v)
{
    if (v == NULL)
        return;
    dp_client *c = v->c;
    bool last = false;
    if (c != NULL) {
        pthread_mutex_lock(&c->mu);
        for (size_t i = 0; i < v->n_bufs; i++)
            dp__client_buf_put_locked(c, v->bufs[i]);
        c->n_values--;
        last = c->closed && c->n_values == 0;
        pthread_mutex_unlock(&c->mu);
    }
    free(v->bufs);
    free(v->items);
    free(v->descs);
    free(v);
    if (last)
        dp__client_free(c); /* closed, and these were its last values */
}
