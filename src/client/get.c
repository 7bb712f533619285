/*
 * A get's pass (docs/design.md, "Client put" and "Fanout"): resolve_keys on
 * every unit at once, one READ of every located value at once, unpin. Keys
 * are grouped by unit with dp__groups and each round's replies decoded with
 * dp__fanout_reply (client/fanout.h).
 *
 * The call (dp_client_get), its turns over replicas and its report are in
 * get_turns.c; what a get hands back is in values.c: the values'
 * descriptions, the alloc form's calls (dp_client_get_alloc, _locs) and
 * dp_values_*; get_int.h holds what the files share.
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
 *
 * Location hints (docs/design.md, "Location hints"). A key whose item
 * carries a usable hint (its seal, its unit, a description when one is
 * asked for) skips the lookup: when every key a unit is asked for this round
 * has one, the round sends that unit `resolve` with the hints' distinct blob
 * ids instead of `resolve_keys`, and a key whose blob comes back pinned and
 * whole (every entry still current) is READ at the blob's offset plus the
 * hint's. Any other hinted key (blob gone, overwritten or cleared in part,
 * being staged) drops its hint and is asked by key in the next round, at
 * once (no backoff): a stale hint costs a round trip, never a wrong value.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blob/crc32c.h"
#include "blob/keys.h"
#include "client/get_op.h"
#include "common/le.h"
#include "common/map.h"

/* Hinted keys of a unit asked by key (inline) rather than by blob: at most this many. */
#define INLINE_BY_KEY_MAX 64

/* A get of keys of more distinct fields than this asks by key (resolve_keys). */
#define BY_ROW_FIELDS_MAX 64

static void
unpin_locked(dp_client *c, uint32_t u, char *pin)
{
    if (pin[0] == '\0')
        return;
    dp__wire_request q;
    memset(&q, 0, sizeof q);
    q.op = DP_WIRE_OP_UNPIN;
    q.a.unpin.pin_id = dp__wire_s(pin);
    dp__client_notify_locked(c, u, &q);
    pin[0] = '\0';
}

static void
get_op_fini(get_op *x)
{
    free(x->ks);
    dp__groups_fini(&x->g);
    free(x->keys);
    free(x->fields);
    free(x->rows);
    free(x->slot_unit);
    free(x->ur);
    free(x->local);
    free(x->remote);
    free(x->ops);
    free(x->res);
    free(x->bids);
    free(x->bans);
}

static int
get_op_init(get_op *x, const dp__get_ctx *g, dp_get_item *items, size_t n,
            double deadline, dp_detail *d)
{
    dp_client *c = g->c;
    dp_values *vals = g->vals;
    memset(x, 0, sizeof *x);
    uint32_t N = c->n_units;
    size_t m = n > 0 ? n : 1;
    x->c = c;
    x->items = items;
    x->n = n;
    x->vals = vals;
    x->resv = vals != NULL ? g->resv : NULL;
    x->deadline = deadline;
    x->ks = malloc(m * sizeof *x->ks); /* set key by key (get_place) */
    x->keys = malloc(m * sizeof *x->keys);
    x->fields = malloc(BY_ROW_FIELDS_MAX * sizeof *x->fields);
    x->rows = malloc(m * DP_WIRE_ROW_LEN);
    x->slot_unit = malloc(N * sizeof *x->slot_unit);
    x->ur = calloc(N, sizeof *x->ur);
    x->local = malloc(m * sizeof *x->local);
    x->remote = malloc(m * sizeof *x->remote);
    x->ops = malloc(N * sizeof *x->ops);
    x->res = malloc(N * sizeof *x->res);
    /* bids and bans: made by get_place when a key has a hint */
    if (x->ks == NULL || x->keys == NULL || x->fields == NULL || x->rows == NULL ||
        x->slot_unit == NULL || x->ur == NULL || x->local == NULL || x->remote == NULL ||
        x->ops == NULL || x->res == NULL)
        return dp__fail(d, DP_ENOMEM, "get: out of memory");
    for (uint32_t u = 0; u < N; u++)
        x->ur[u].st.u = u;
    return DP_OK;
}

/* Item i's place kept for the call (alloc form with replicas), or NULL. */
static dp__get_resv *
resv_of(const get_op *x, size_t i)
{
    return x->resv != NULL ? &x->resv[x->at != NULL ? x->at[i] : i] : NULL;
}

/* The field part of a key ("<gidx>@<field>"): what follows its '@'. */
static const char *
field_of(const char *key)
{
    const char *f = strchr(key, '@');
    return f != NULL ? f : key;
}

/*
 * The size to keep for item i asked again of the next replica: that of the
 * nearest value of the same field located in this round (the rows of a
 * field usually share a size), or 0 (none kept).
 */
static uint64_t
gap_guess(const get_op *x, size_t i)
{
    const char *f = field_of(x->items[i].key);
    for (size_t k = 1; k <= 8; k++) {
        if (i >= k && x->ks[i - k].st == K_READ &&
            strcmp(field_of(x->items[i - k].key), f) == 0)
            return x->ks[i - k].len;
        if (i + k < x->n && x->ks[i + k].st == K_READ &&
            strcmp(field_of(x->items[i + k].key), f) == 0)
            return x->ks[i + k].len;
    }
    return 0;
}

/* A hint's own consistency (it comes from the caller: maybe from elsewhere). */
static int
loc_check(const dp_loc *l, const char *key, dp_detail *d)
{
    const char *why = NULL;
    size_t bl = strnlen(l->blob, sizeof l->blob);
    size_t tl = strnlen(l->dtype, sizeof l->dtype);
    if (bl == sizeof l->blob)
        why = "its blob id is not NUL-terminated";
    for (size_t k = 0; why == NULL && k < bl; k++) {
        char ch = l->blob[k];
        if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
              (ch >= '0' && ch <= '9') || ch == '_' || ch == '.' || ch == ':' ||
              ch == '-'))
            why = "its blob id has a character outside [A-Za-z0-9_.:-]";
    }
    if (why == NULL && l->kind > DP_KIND_OBJECT)
        why = "its kind is not tensor, bytes or object";
    else if (why == NULL && l->ndim > DP_LOC_DIMS && l->ndim != DP_LOC_NO_DESC)
        why = "its ndim is over DP_LOC_DIMS";
    else if (why == NULL && tl == sizeof l->dtype)
        why = "its dtype is not NUL-terminated";
    else if (why == NULL && (l->off >= (1ull << 62) || l->nbytes >= (1ull << 62)))
        why = "its offset or size is over 2^62";
    if (why == NULL)
        return DP_OK;
    return dp__fail(d, DP_EINVAL,
                    "get: key '%s': its location hint is malformed (%s); pass the dp_loc "
                    "a put filled, unchanged, or none",
                    key, why);
}

/* Whether a well-formed hint is for this key, on its unit, with what is
 * asked: its seal matches the key and the hint's bytes (a hint of another
 * key, or changed after the put, is not used). */
static bool
loc_usable(const dp_loc *l, const dp_get_item *it, uint32_t unit, size_t klen)
{
    if (l->unit != unit || l->seal != dp__loc_seal(l, dp__hash64(it->key, klen, 0)))
        return false; /* another key's, another cluster shape's, or a changed hint */
    return it->desc == NULL || l->ndim != DP_LOC_NO_DESC;
}

/*
 * Field f (n bytes) of key i: its place in x->fields, added when new. Keys
 * come row by row with their fields in turn, so the field after the previous
 * key's, or the same, is looked at first. A get of more distinct fields than
 * BY_ROW_FIELDS_MAX asks by key: x->fields is dropped.
 */
static void
field_place(get_op *x, size_t i, const char *f, uint32_t n)
{
    if (x->fields == NULL)
        return;
    uint32_t nf = x->n_fields, prev = i > 0 ? x->ks[i - 1].fidx : 0;
    uint32_t next = prev + 1 < nf ? prev + 1 : 0;
    uint32_t k = UINT32_MAX;
    if (nf > 0 && key_is(x->fields[next], f, n))
        k = next;
    else if (nf > 0 && key_is(x->fields[prev], f, n))
        k = prev;
    for (uint32_t j = 0; j < nf && k == UINT32_MAX; j++)
        if (key_is(x->fields[j], f, n))
            k = j;
    if (k == UINT32_MAX) {
        if (nf == BY_ROW_FIELDS_MAX) {
            free(x->fields);
            x->fields = NULL;
            return;
        }
        k = x->n_fields++;
        x->fields[k] = (dp__wire_str){f, n};
    }
    x->ks[i].fidx = k;
}

/* Check and place every key; group them by unit. */
static int
get_place(get_op *x, dp_detail *d)
{
    uint32_t N = x->c->n_units;
    uint32_t *ux = malloc((x->n > 0 ? x->n : 1) * sizeof *ux); /* each key's unit */
    if (ux == NULL)
        return dp__fail(d, DP_ENOMEM, "get: out of memory");
    int rc = DP_OK;
    for (size_t i = 0; i < x->n && rc == DP_OK; i++) {
        dp_get_item *it = &x->items[i];
        it->nbytes = 0;
        it->status = DP_ETIMEDOUT;
        if (it->key == NULL) {
            rc = dp__fail(d, DP_EINVAL, "get: key %zu is NULL", i);
            break;
        }
        size_t kl;
        dp__key_parts kp;
        rc = dp__key_split_z(it->key, &kl, &kp, d);
        if (rc != 0) {
            dp__fail_ctx(d, rc, "get: key %zu", i);
            break;
        }
        if (x->vals == NULL && it->cap > 0 && it->dst == NULL) {
            rc = dp__fail(d, DP_EINVAL,
                          "get: key '%s': NULL destination of %" PRIu64 " bytes", it->key,
                          it->cap);
            break;
        }
        /* A repair's client asks one unit for everything (it routes as that unit). */
        uint64_t g = x->c->only_unit >= 0 ? (uint64_t)x->c->only_unit : kp.gidx;
        ux[i] = (uint32_t)((g % N + x->shift) % N);
        /* Every member set here (ks is not zeroed: a pass of 4096 keys spent
         * about 90 instructions a key in calloc's memset). */
        x->ks[i] = (key_state){
            .unit = ux[i], .klen = (uint32_t)kl, .gidx = kp.gidx, .st = K_ASK};
        field_place(x, i, kp.field, (uint32_t)kp.field_len);
        if (it->loc != NULL && it->loc->blob[0] != '\0') {
            rc = loc_check(it->loc, it->key, d);
            if (rc != DP_OK)
                break;
            if (x->bids == NULL) { /* the first hint: the hinted keys' scratch */
                size_t m = x->n > 0 ? x->n : 1;
                x->bids = malloc(m * sizeof *x->bids);
                x->bans = malloc(m * sizeof *x->bans);
                if (x->bids == NULL || x->bans == NULL) {
                    rc = dp__fail(d, DP_ENOMEM, "get: out of memory");
                    break;
                }
            }
            x->ks[i].hinted = loc_usable(it->loc, it, x->ks[i].unit, kl);
            if (!x->ks[i].hinted)
                x->c->cnt.loc_misses++;
        }
    }
    if (rc == DP_OK)
        rc = dp__groups_of_units(&x->g, N, ux, x->n, d);
    free(ux);
    return rc;
}

/*
 * Re-bind units that restarted or whose endpoint failed; keys of a unit
 * that is down, or that restarted (reported once), fail now.
 */
static int
get_ready(get_op *x, dp_detail *d)
{
    const uint32_t *cnt = x->g.start, *order = x->g.order;
    uint32_t nu = 0;
    for (uint32_t u = 0; u < x->c->n_units; u++)
        if (cnt[u + 1] > cnt[u])
            x->slot_unit[nu++] = u;
    int *rcs = malloc((nu > 0 ? nu : 1) * sizeof *rcs);
    dp_detail *dets = malloc((nu > 0 ? nu : 1) * sizeof *dets);
    if (rcs == NULL || dets == NULL) {
        free(rcs);
        free(dets);
        return dp__fail(d, DP_ENOMEM, "get: out of memory");
    }
    dp__client_ready_locked(x->c, x->slot_unit, nu, x->deadline, rcs, dets);
    for (uint32_t k = 0; k < nu; k++) {
        uint32_t u = x->slot_unit[k];
        if (rcs[k] == 0 || (rcs[k] == DP_ERESTARTED && dp__client_replicas(x->c) > 1))
            continue; /* with replicas a restart (re-bound now) is asked: a miss falls
                         back */
        x->ur[u].st.rc = rcs[k];
        x->ur[u].st.det = dets[k];
        for (uint32_t j = cnt[u]; j < cnt[u + 1]; j++)
            item_fail(&x->items[order[j]], &x->ks[order[j]], rcs[k]);
    }
    free(rcs);
    free(dets);
    return DP_OK;
}

/*
 * The distinct blob ids of unit u's keys still to ask (every one hinted)
 * into bids (at g.start[u]), each key's place in ks[].bidx. False (ask by
 * key) when out of memory.
 */
static bool
collect_blobs(get_op *x, uint32_t u)
{
    enum { LINEAR = 16 };
    const uint32_t *cnt = x->g.start, *order = x->g.order;
    dp__wire_str *ids = x->bids + cnt[u];
    uint32_t nb = 0;
    dp__map m;
    bool use_map = false, ok = true;
    for (uint32_t k = cnt[u]; k < cnt[u + 1] && ok; k++) {
        uint32_t i = order[k];
        if (x->ks[i].st != K_ASK)
            continue;
        const char *id = x->items[i].loc->blob;
        uint32_t idn = (uint32_t)strlen(id);
        uint32_t j = UINT32_MAX;
        if (nb > 0 && key_is(ids[nb - 1], id, idn)) {
            j = nb - 1; /* the common case: the row before, from the same put */
        } else if (use_map) {
            void *v = dp__map_get(&m, id, idn);
            if (v != NULL)
                j = (uint32_t)((uintptr_t)v - 1);
        } else {
            for (uint32_t t = 0; t < nb && j == UINT32_MAX; t++)
                if (key_is(ids[t], id, idn))
                    j = t;
        }
        if (j == UINT32_MAX) {
            j = nb;
            ids[nb++] = (dp__wire_str){id, idn};
            if (!use_map && nb > LINEAR) {
                dp__map_init_str(&m);
                use_map = true;
                for (uint32_t t = 0; t < nb && ok; t++)
                    ok = dp__map_put(&m, ids[t].p, ids[t].n, (void *)(uintptr_t)(t + 1),
                                     NULL) == 0;
            } else if (use_map) {
                ok = dp__map_put(&m, id, idn, (void *)(uintptr_t)(j + 1), NULL) == 0;
            }
        }
        x->ks[i].bidx = j;
    }
    if (use_map)
        dp__map_fini(&m);
    x->ur[u].nb = nb;
    return ok;
}

/* 1. resolve_keys (or resolve, for hinted keys) on every unit with keys still
 * to ask; returns the slots sent. */
static size_t
get_ask(get_op *x)
{
    dp_client *c = x->c;
    const uint32_t *cnt = x->g.start, *order = x->g.order;
    key_state *ks = x->ks;
    unit_round *ur = x->ur;
    size_t ns = 0;
    for (uint32_t u = 0; u < c->n_units; u++) {
        ur[u].asked = false;
        ur[u].pin[0] = '\0';
        uint32_t nk = 0;
        bool all_hinted = x->bids != NULL;
        uint64_t hinted_bytes = 0;
        uint8_t *rec = x->rows + (size_t)cnt[u] * DP_WIRE_ROW_LEN;
        for (uint32_t k = cnt[u]; k < cnt[u + 1]; k++) {
            uint32_t i = order[k];
            if (ks[i].st == K_ASK) {
                /* By row while the get's fields are few (x->fields), else by key */
                if (x->fields != NULL) {
                    dp__le64_store(rec, ks[i].gidx);
                    dp__le32_store(rec + 8, ks[i].fidx);
                    rec += DP_WIRE_ROW_LEN;
                } else {
                    x->keys[cnt[u] + nk] = (dp__wire_str){x->items[i].key, ks[i].klen};
                }
                nk++;
                all_hinted = all_hinted && ks[i].hinted;
                if (all_hinted)
                    hinted_bytes += x->items[i].loc->nbytes;
            }
        }
        if (nk == 0)
            continue;
        /* A few values that fit in one reply come inline, by key: no pin, no
         * READ, cheaper than the hint's resolve + READ + unpin (but a lookup
         * per key: many tiny values still go by blob). */
        if (all_hinted && c->o.inline_bytes > 0 && hinted_bytes <= c->o.inline_bytes &&
            nk <= INLINE_BY_KEY_MAX)
            all_hinted = false;
        ur[u].how = all_hinted && collect_blobs(x, u) ? ASK_BY_BLOB
                    : x->fields != NULL               ? ASK_BY_ROW
                                                      : ASK_BY_KEY;
        ur[u].nk = nk;
        dp__wire_request q;
        memset(&q, 0, sizeof q);
        if (ur[u].how == ASK_BY_BLOB) {
            q.op = DP_WIRE_OP_RESOLVE;
            q.a.resolve.blob_ids = (dp__wire_strs){x->bids + cnt[u], ur[u].nb};
        } else if (ur[u].how == ASK_BY_ROW) {
            q.op = DP_WIRE_OP_RESOLVE_ROWS;
            q.a.resolve_rows.fields = (dp__wire_strs){x->fields, x->n_fields};
            q.a.resolve_rows.rows = (dp__wire_bytes){
                x->rows + (size_t)cnt[u] * DP_WIRE_ROW_LEN, nk * DP_WIRE_ROW_LEN};
            q.a.resolve_rows.inline_bytes = c->o.inline_bytes;
        } else {
            q.op = DP_WIRE_OP_RESOLVE_KEYS;
            q.a.resolve_keys.keys = (dp__wire_strs){x->keys + cnt[u], nk};
            q.a.resolve_keys.inline_bytes = c->o.inline_bytes;
        }
        dp_detail_clear(&ur[u].st.det);
        ur[u].st.rc = dp__client_prepare_locked(c, u, ns, &q, &ur[u].st.det);
        if (ur[u].st.rc != 0) {
            for (uint32_t k = cnt[u]; k < cnt[u + 1]; k++)
                if (ks[order[k]].st == K_ASK)
                    item_fail(&x->items[order[k]], &ks[order[k]], ur[u].st.rc);
            continue;
        }
        ur[u].asked = true;
        ur[u].sent_at = dp__now_s();
        ur[u].copy_max = dp__endpoint_remote_copy_max(c->ep, c->units[u].remote);
        x->slot_unit[ns++] = u;
    }
    if (ns > 0)
        dp__ctl_call_many(c->ctl, c->fo.items, ns,
                          DP_MAX(dp__client_round_timeout(x->deadline), 0.001));
    return ns;
}

/*
 * 2. Match the answers of slots [0, ns) to keys; *stage_need gets the
 * staging the round's READs need. Returns whether a key must be asked
 * again (pending, or a busy unit).
 */
static bool
get_match(get_op *x, size_t ns, uint64_t *stage_need)
{
    dp_client *c = x->c;
    const uint32_t *cnt = x->g.start, *order = x->g.order;
    bool again = false;
    for (size_t s = 0; s < ns; s++) {
        uint32_t u = x->slot_unit[s];
        dp__ctl_item *ci = &c->fo.items[s];
        dp_detail *ud = &x->ur[u].st.det;
        dp__wire_reply rep;
        int how = x->ur[u].how;
        int urc = dp__fanout_reply(ci,
                                   how == ASK_BY_BLOB  ? DP_WIRE_OP_RESOLVE
                                   : how == ASK_BY_ROW ? DP_WIRE_OP_RESOLVE_ROWS
                                                       : DP_WIRE_OP_RESOLVE_KEYS,
                                   &rep, ud);
        if (ci->rc == DP_ETRANSFER)
            c->cnt.units_down++;
        if (urc == 0 && dp__client_reply_check_locked(c, u, &rep, true, ud)) {
            /* Another process answered: its offsets are not in the slab
             * this data path maps. Let go of its pin, READ nothing. */
            urc = DP_ERESTARTED;
            dp__wire_str pid = how == ASK_BY_BLOB  ? rep.r.resolve.pin_id
                               : how == ASK_BY_ROW ? rep.r.resolve_rows.pin_id
                                                   : rep.r.resolve_keys.pin_id;
            if (rep.ok && pid.n > 0) {
                char pin[DP_WIRE_RID_MAX + 32];
                dp__wire_str_copy(pid, pin, sizeof pin);
                unpin_locked(c, u, pin);
            }
        } else if (urc == 0 && !rep.ok) {
            urc = dp__wire_error_to_detail(&rep.err, ud);
            if (urc == DP_EBUSY && dp__left_s(x->deadline) > 0) {
                again = true;
                x->slow_again = true;
                c->cnt.busy_waits++;
                dp__wire_reply_fini(&rep);
                continue;
            }
        }
        x->ur[u].st.rc = urc;
        if (urc != 0) {
            for (uint32_t k = cnt[u]; k < cnt[u + 1]; k++)
                if (x->ks[order[k]].st == K_ASK)
                    item_fail(&x->items[order[k]], &x->ks[order[k]], urc);
        } else if (how == ASK_BY_BLOB
                       ? dp__get_match_blobs(x, u, &rep.r.resolve, stage_need)
                   : how == ASK_BY_ROW
                       ? dp__get_match_rows(x, u, &rep.r.resolve_rows, stage_need)
                       : dp__get_match_keys(x, u, &rep.r.resolve_keys, stage_need)) {
            again = true;
        }
        dp__wire_reply_fini(&rep);
    }
    return again;
}

/*
 * 3. Destinations: the values' own buffer (*abuf) and staging (*sbuf).
 * Returns DP_OK or why neither could be had (into bdet).
 */
static int
get_dest(get_op *x, uint64_t alloc_need, uint64_t stage_need, uint8_t **abuf,
         uint8_t **sbuf, dp_detail *bdet)
{
    int brc = DP_OK;
    *abuf = *sbuf = NULL;
    if (alloc_need > 0) {
        dp_values *vals = x->vals;
        uint8_t **nb = realloc(vals->bufs, (vals->n_bufs + 1) * sizeof *nb);
        dp__client_buf *b = NULL;
        if (nb == NULL)
            brc = dp__fail(bdet, DP_ENOMEM, "get: out of memory");
        else
            vals->bufs = nb;
        if (brc == 0)
            brc = dp__client_buf_get_locked(x->c, alloc_need, DP__BUF_VALUES, &b, bdet);
        if (brc == 0) {
            *abuf = b->p;
            vals->bufs[vals->n_bufs++] = *abuf;
        }
    }
    if (brc == 0 && stage_need > 0) {
        dp__client_buf *b = NULL;
        brc = dp__client_buf_get_locked(x->c, stage_need, DP__BUF_STAGING, &b, bdet);
        if (brc == 0)
            *sbuf = b->p;
    }
    return brc;
}

/*
 * 4a. One READ per unit of slots [0, ns) with located keys, inside the pins'
 * life: the ops (x->ops, their units in x->slot_unit) and how long they may
 * take (*xfer_left). Keys fail with brc when there is no destination.
 */
static size_t
get_read_ops(get_op *x, size_t ns, int brc, const dp_detail *bdet, uint8_t *abuf,
             uint8_t *sbuf, double *xfer_left)
{
    dp_client *c = x->c;
    const uint32_t *cnt = x->g.start, *order = x->g.order;
    size_t nops = 0, nr = 0;
    double now = dp__now_s();
    *xfer_left = dp__left_s(x->deadline);
    for (size_t s = 0; s < ns; s++) {
        uint32_t u = x->slot_unit[s];
        size_t r0 = nr;
        for (uint32_t k = cnt[u]; k < cnt[u + 1]; k++) {
            uint32_t i = order[k];
            key_state *ks = &x->ks[i];
            if (ks->st != K_READ)
                continue;
            dp_get_item *it = &x->items[i];
            /* Without a destination buffer only values in the caller's memory that
             * came inline can still be had. */
            if (brc != 0 && !(x->vals == NULL && ks->inl != NULL)) {
                item_fail(it, ks, brc);
                x->ur[u].st.rc = brc;
                x->ur[u].st.det = *bdet;
                continue;
            }
            if (x->vals != NULL) {
                it->dst = ks->in_resv    ? resv_of(x, i)->dst
                          : abuf != NULL ? abuf + ks->soff
                                         : NULL;
                it->cap = ks->len;
            }
            if (ks->len == 0 || ks->inl != NULL)
                continue; /* nothing to READ: empty, or came in the reply */
            uint8_t *dst = ks->staged ? sbuf + ks->soff : it->dst;
            uint64_t ra = c->units[u].slab_addr + ks->off;
            /* Continuing the last range on both sides (a row's values back to
             * back in the slab and in the destination), within what is copied
             * into any memory: one range (docs/design.md, "Ranges of a
             * transfer"). */
            if (nr > r0) {
                dp__range *l = &x->local[nr - 1], *r = &x->remote[nr - 1];
                if (l->addr + l->nbytes == (uint64_t)(uintptr_t)dst &&
                    r->addr + r->nbytes == ra &&
                    l->nbytes + ks->len <= x->ur[u].copy_max) {
                    l->nbytes += ks->len;
                    r->nbytes += ks->len;
                    continue;
                }
            }
            x->local[nr] = (dp__range){(uint64_t)(uintptr_t)dst, ks->len};
            x->remote[nr] = (dp__range){ra, ks->len};
            nr++;
        }
        if (nr == r0)
            continue;
        double pin = c->units[u].read_pin_s;
        double margin = DP_MAX(0.2, 0.1 * pin);
        double pin_left = pin - margin - (now - x->ur[u].sent_at);
        if (pin_left < *xfer_left)
            *xfer_left = pin_left;
        x->ops[nops] = (dp__xfer_desc){.op = DP_XFER_READ,
                                       .local = x->local + r0,
                                       .n_local = nr - r0,
                                       .remote = x->remote + r0,
                                       .n_remote = nr - r0,
                                       .remote_name = c->units[u].remote,
                                       .grant = x->ur[u].pin,
                                       .grant_len = (uint32_t)strlen(x->ur[u].pin),
                                       .local_plain_ok = x->ur[u].copy_max > 0};
        x->slot_unit[nops] = u; /* reuse: op index -> unit (slots are done) */
        nops++;
    }
    return nops;
}

/* 4b. Run the READs and settle their keys. */
static void
get_read(get_op *x, size_t nops, double xfer_left, const uint8_t *sbuf)
{
    dp_client *c = x->c;
    const uint32_t *cnt = x->g.start, *order = x->g.order;
    if (nops > 0 && !(xfer_left > 0)) {
        for (size_t o = 0; o < nops; o++) {
            x->res[o] = (dp__xfer_result){.rc = DP_ETIMEDOUT, .fate = "nothing posted"};
            dp__fail(&x->res[o].det, DP_ETIMEDOUT,
                     "no time left to READ within the budget and the pin's life (%.3g s)",
                     c->units[x->slot_unit[o]].read_pin_s);
        }
    } else if (nops > 0) {
        dp__endpoint_transfer_many(c->ep, x->ops, nops, xfer_left, x->res, NULL, NULL);
    }
    /* The copies out of the staging area run as one batch, on the endpoint's
     * copy threads when large enough; out of memory, one by one. */
    size_t nc = 0;
    dp__copy *cp = nops > 0 && sbuf != NULL ? malloc(x->n * sizeof *cp) : NULL;
    for (size_t o = 0; o < nops; o++) {
        uint32_t u = x->slot_unit[o];
        for (uint32_t k = cnt[u]; k < cnt[u + 1]; k++) {
            uint32_t i = order[k];
            if (x->ks[i].st != K_READ || x->ks[i].inl != NULL)
                continue; /* inline values are copied by get_round */
            if (x->res[o].rc != 0) {
                item_fail(&x->items[i], &x->ks[i], x->res[o].rc);
            } else {
                if (x->ks[i].staged) {
                    const uint8_t *from = sbuf + x->ks[i].soff;
                    if (cp != NULL)
                        cp[nc++] = (dp__copy){x->items[i].dst, from, x->ks[i].len};
                    else
                        memcpy(x->items[i].dst, from, x->ks[i].len);
                    c->cnt.staged_get_bytes += x->ks[i].len;
                }
                x->items[i].status = 0;
                x->ks[i].st = K_DONE;
            }
        }
        if (x->res[o].rc != 0) {
            /*
             * The unit answered this round's resolve: a READ that failed over
             * a network lane means a stalled connection, which is made anew
             * before the next transfer.
             */
            if (x->res[o].suspect)
                c->units[u].ep_suspect = true;
            x->ur[u].st.rc = x->res[o].rc;
            x->ur[u].st.det = x->res[o].det;
            dp__fail_ctx(&x->ur[u].st.det, x->res[o].rc, "READ of %s",
                         x->res[o].rc == DP_ETIMEDOUT ? "values (data discarded)"
                                                      : "values");
        }
    }
    if (nc > 0)
        dp__endpoint_copy(c->ep, cp, nc);
    free(cp);
}

/*
 * The alloc form's places in the round's buffer, in the keys' order (not unit
 * by unit): a field's values of rows asked in order lie one after another
 * whichever units hold them, so a caller can take them as one tensor without
 * a copy (the Python package's get(stack=True)). Returns the buffer's size.
 */
static uint64_t
get_place_values(get_op *x)
{
    /* With replicas left, a key that failed here keeps a place of its
     * neighbours' size for the next replica's answer (it lands there when it
     * fits), so its field's values still lie back to back. */
    bool keep = x->resv != NULL && x->shift + 1 < dp__client_replicas(x->c);
    uint64_t at = 0;
    for (size_t i = 0; i < x->n; i++) {
        key_state *ks = &x->ks[i];
        ks->gap = 0;
        ks->in_resv = false;
        if (ks->st == K_READ) {
            const dp__get_resv *r = resv_of(x, i);
            if (r != NULL && r->dst != NULL && ks->len <= r->cap) {
                ks->in_resv = true;
                continue;
            }
            ks->soff = at;
            at += DP_ALIGN_UP(ks->len, 64);
        } else if (keep && ks->st == K_DONE && dp__get_falls_back(x->items[i].status) &&
                   resv_of(x, i)->dst == NULL && (ks->gap = gap_guess(x, i)) > 0) {
            ks->soff = at;
            at += DP_ALIGN_UP(ks->gap, 64);
        }
    }
    return at;
}

/* The places get_place_values kept in abuf, for the next replica's turn. */
static void
keep_places(get_op *x, uint8_t *abuf)
{
    for (size_t i = 0; i < x->n && abuf != NULL; i++)
        if (x->ks[i].gap > 0)
            *resv_of(x, i) = (dp__get_resv){abuf + x->ks[i].soff, x->ks[i].gap};
}

/* One round: ask, match, READ, unpin. Returns whether to ask again. */
static bool
get_round(get_op *x)
{
    dp_client *c = x->c;
    size_t ns = get_ask(x);
    if (ns == 0)
        return false;
    uint64_t stage_need = 0;
    bool again = get_match(x, ns, &stage_need);
    uint64_t alloc_need = x->vals != NULL ? get_place_values(x) : 0;
    uint8_t *abuf, *sbuf;
    dp_detail bdet;
    dp_detail_clear(&bdet);
    int brc = get_dest(x, alloc_need, stage_need, &abuf, &sbuf, &bdet);
    if (brc == DP_OK && x->resv != NULL)
        keep_places(x, abuf);
    double xfer_left;
    size_t nops = get_read_ops(x, ns, brc, &bdet, abuf, sbuf, &xfer_left);
    get_read(x, nops, xfer_left, sbuf);
    /* Values that came in the replies, zero-byte values: nothing was READ. */
    for (size_t i = 0; i < x->n; i++) {
        key_state *ks = &x->ks[i];
        if (ks->st != K_READ || (ks->len > 0 && ks->inl == NULL))
            continue;
        if (ks->len > 0)
            memcpy(x->items[i].dst, ks->inl, ks->len);
        ks->inl = NULL;
        x->items[i].status = 0;
        ks->st = K_DONE;
    }
    /* A kept place whose READ failed may still be written by it: never used again. */
    for (size_t i = 0; i < x->n && x->resv != NULL; i++)
        if (x->ks[i].in_resv && x->items[i].status != 0)
            *resv_of(x, i) = (dp__get_resv){NULL, 0};
    /* 5. Unpin: this round's READs are done. */
    for (uint32_t u = 0; u < c->n_units; u++)
        if (x->ur[u].asked)
            unpin_locked(c, u, x->ur[u].pin);
    if (sbuf != NULL)
        dp__client_buf_put_locked(c, sbuf);
    return again;
}

int
dp__get_pass(const dp__get_ctx *g, dp_get_item *items, const uint32_t *at, size_t n,
             double deadline, uint32_t shift, dp_detail *d)
{
    dp_client *c = g->c;
    get_op x;
    int rc = get_op_init(&x, g, items, n, deadline, d);
    x.shift = shift;
    x.at = at;
    if (rc == DP_OK)
        rc = get_place(&x, d);
    if (rc == DP_OK)
        rc = get_ready(&x, d);
    if (rc != DP_OK) {
        get_op_fini(&x);
        return rc;
    }
    double step = DP__CLIENT_BACKOFF_FIRST_S;
    for (;;) {
        x.slow_again = false;
        if (!get_round(&x) || dp__left_s(x.deadline) <= 0)
            break;
        if (x.slow_again) { /* pending keys or a busy unit; stale hints go at once */
            c->cnt.retries++;
            dp__backoff_sleep(&step, DP__CLIENT_BACKOFF_MAX_S, x.deadline);
        }
    }
    /* Keys still unresolved: pending or busy for the whole budget. */
    for (size_t i = 0; i < n; i++)
        if (x.ks[i].st == K_ASK) {
            x.ks[i].st = K_DONE;
            items[i].status = DP_ETIMEDOUT;
            uint32_t u = x.ks[i].unit;
            if (x.ur[u].st.rc == 0)
                dp__fail(&x.ur[u].st.det, DP_ETIMEDOUT,
                         "keys still pending (staged from SSD) or the unit still busy "
                         "when the budget ran out");
            x.ur[u].st.rc = DP_ETIMEDOUT;
        }
    for (uint32_t u = 0; u < c->n_units; u++)
        if (x.ur[u].st.rc != 0 && g->ust[u].rc == 0)
            g->ust[u] = x.ur[u].st;
    get_op_fini(&x);
    return DP_OK;
}
