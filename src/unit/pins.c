/*
 * Reads: resolve (blob ids), resolve_keys ("<gidx>@<field>" keys) and
 * resolve_rows (rows and fields, binary records) answer where the bytes are and pin the
 * blobs they answer for read_pin_s; unpin and expiry (the ticker) end the pins.
 *
 * Design notes
 * ------------
 * A pin holds n_pins on each record it names, not refs: a record released
 * while pinned leaves the table as a zombie and is freed when its last pin
 * (and save hold) ends. A pin ended by unpin means the reader is done; a pin
 * that expired marks its records (REC_PIN_EXPIRED), so their region goes
 * through quarantine (quarantine_s) before reuse: the reader that let it
 * expire may still be READing.
 *
 * Every pin lives read_pin_s, so the pin list in creation order is also in
 * expiry order: the ticker pops expired pins from its head. One call takes
 * one pin over every record it answered (pin_mark dedups them), created at
 * the end of the call, so a stage that the same call starts never evicts a
 * copy it already answered (ssd.c, "Stage"). A disk blob is answered only
 * once its staged copy is in the IO area (dp__ssd_resolve_state_locked).
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "blob/keys.h"
#include "common/le.h"
#include "unit/unit_int.h"

/* End pin p (unpinned or expired) and free it. */
/* Out of the pin table, its records unpinned (zombies it kept may go), freed. */
static void
pin_finish_locked(dp__unit *u, pin *p, bool expired, double now)
{
    dp__map_del(&u->pins, p->id, strlen(p->id));
    for (uint32_t i = 0; i < p->n; i++) {
        blob_rec *b = p->blobs[i];
        DP_ASSERT(b->n_pins > 0);
        b->n_pins--;
        if (expired)
            dp__rec_flag_locked(b, REC_PIN_EXPIRED, true);
        if (b->state == REC_ZOMBIE && b->n_pins == 0 && b->n_holds == 0) {
            dp__rec_zombie_count_locked(u, b, -1);
            dp__rec_drop_locked(u, b, now);
        }
    }
    if (expired)
        u->stats.pins_expired++;
    free(p->blobs);
    free(p);
}

void
dp__pin_end_locked(dp__unit *u, pin *p, bool expired, double now)
{
    if (p->ending) {
        p->end_expired = p->end_expired || expired;
        return;
    }
    dp__list_remove(&u->pins_by_expiry, &p->link);
    if (p->n_sends > 0) {
        /* Two-sided READs still send from its blobs: it ends with the last. */
        p->ending = true;
        p->end_expired = expired;
        return;
    }
    pin_finish_locked(u, p, expired, now);
}

void
dp__pin_sent_locked(dp__unit *u, pin *p, double now)
{
    DP_ASSERT(p->n_sends > 0);
    if (--p->n_sends == 0 && p->ending)
        pin_finish_locked(u, p, p->end_expired, now);
}

void
dp__pins_fini_locked(dp__unit *u)
{
    while (!dp__list_empty(&u->pins_by_expiry))
        dp__pin_end_locked(u, DP_LIST_FIRST(&u->pins_by_expiry, pin, link), false, 0);
    /* Pins left ending: their sends will never be reported (serving stopped). */
    size_t it = 0;
    void *v;
    while (dp__map_next(&u->pins, &it, NULL, NULL, NULL, &v)) {
        pin *p = v;
        p->n_sends = 0;
        pin_finish_locked(u, p, false, 0);
        it = 0;
    }
}

/* Pin blobs[0..n) for read_pin_s; the id goes to out. */
static int
pin_create_locked(dp__unit *u, blob_rec **blobs, uint32_t n, double now, char out[33],
                  dp_detail *d)
{
    out[0] = '\0';
    if (n == 0) {
        free(blobs);
        return 0;
    }
    pin *p = calloc(1, sizeof *p);
    if (p == NULL) {
        free(blobs);
        return dp__fail(d, DP_ENOMEM, "resolve: out of memory");
    }
    int rc = dp__random_hex_id(p->id, d);
    if (rc == 0 && dp__map_put(&u->pins, p->id, strlen(p->id), p, NULL) != 0)
        rc = dp__fail(d, DP_ENOMEM, "resolve: out of memory");
    if (rc != 0) {
        free(blobs);
        free(p);
        return rc;
    }
    p->blobs = blobs;
    p->n = n;
    p->expiry = now + u->o.read_pin_s;
    for (uint32_t i = 0; i < n; i++) {
        blobs[i]->n_pins++;
        blobs[i]->last_resolve_at = now;
    }
    dp__list_insert_tail(&u->pins_by_expiry, &p->link);
    memcpy(out, p->id, 33);
    return 0;
}

int
dp__unit_resolve_locked(dp__unit *u, const dp__wire_str *ids, uint32_t n,
                        dp__unit_resolve_res *res, dp_detail *d)
{
    memset(res, 0, sizeof *res);
    double now = dp__unit_now(u);
    size_t cap = n > 0 ? n : 1;
    /* Not zeroed: each array is written up to its count before it is read. */
    res->blobs = malloc(cap * sizeof *res->blobs);
    res->missing = malloc(cap * sizeof *res->missing);
    res->pending = malloc(cap * sizeof *res->pending);
    res->failed = malloc(cap * sizeof *res->failed);
    res->whole = malloc(cap * sizeof *res->whole);
    blob_rec **pinned = malloc(cap * sizeof *pinned);
    uint32_t np = 0;
    if (res->blobs == NULL || res->missing == NULL || res->pending == NULL ||
        res->failed == NULL || res->whole == NULL || pinned == NULL) {
        free(pinned);
        dp__unit_resolve_res_fini(res);
        return dp__fail(d, DP_ENOMEM, "resolve: out of memory");
    }
    uint64_t epoch = ++u->pin_epoch;
    u->stats.n_resolve++;
    u->stats.n_resolve_blobs++;
    /* Without a read lease no blob is whole: its keys are asked by key, and
     * answered as fenced (docs/design.md, "Leases"). */
    bool reads_ok = dp__lease_reads_ok_locked(u, now);
    for (uint32_t i = 0; i < n; i++) {
        blob_rec *b = dp__map_get(&u->blobs, ids[i].p, ids[i].n);
        if (b == NULL || b->state != REC_PUBLISHED) {
            res->missing[res->n_missing++] = ids[i];
            continue;
        }
        int st = dp__ssd_resolve_state_locked(u, b, epoch, now);
        if (st == RES_PENDING) {
            res->pending[res->n_pending++] = ids[i];
            continue;
        }
        if (st == RES_FAILED) {
            res->failed[res->n_failed++] = ids[i];
            continue;
        }
        res->blobs[res->n_blobs++] = (dp__wire_blob_loc){ids[i], b->off, b->nbytes};
        /* Refs count the row-index slots pointing at it: all its entries, or
         * some key was overwritten or cleared since (docs/design.md,
         * "Location hints"). */
        if (b->parsed != NULL && b->refs == dp__blob_count(b->parsed) && reads_ok)
            res->whole[res->n_whole++] = ids[i];
        u->stats.resolved_bytes += b->nbytes;
        if (b->pin_mark != epoch) {
            b->pin_mark = epoch;
            pinned[np++] = b;
        }
    }
    int rc = pin_create_locked(u, pinned, np, now, res->pin_id, d);
    if (rc != 0)
        dp__unit_resolve_res_fini(res);
    return rc;
}

void
dp__unit_resolve_res_fini(dp__unit_resolve_res *res)
{
    free(res->blobs);
    free(res->missing);
    free(res->pending);
    free(res->failed);
    free(res->whole);
    memset(res, 0, sizeof *res);
}

int
dp__unit_resolve_keys_locked(dp__unit *u, const dp__wire_str *keys, uint32_t n,
                             dp__unit_resolve_keys_res *res, dp_detail *d)
{
    return dp__unit_resolve_keys_inline_locked(u, keys, n, 0, res, d);
}

int
dp__unit_resolve_keys_inline_locked(dp__unit *u, const dp__wire_str *keys, uint32_t n,
                                    uint64_t inline_bytes, dp__unit_resolve_keys_res *res,
                                    dp_detail *d)
{
    memset(res, 0, sizeof *res);
    uint64_t budget = DP_MIN(inline_bytes, (uint64_t)DP_UNIT_INLINE_MAX);
    uint64_t resolved = 0, inlined = 0; /* counted once the call succeeds */
    double now = dp__unit_now(u);
    size_t cap = n > 0 ? n : 1;
    /*
     * Not zeroed (zeroing them cost a unit about 160 of its 2,760 instructions
     * per value of 4 KiB, bench/pervalue.sh): each array is written up to its
     * count before it is read, and every field of an entry is set.
     */
    res->entries = malloc(cap * sizeof *res->entries);
    res->missing = malloc(cap * sizeof *res->missing);
    res->pending = malloc(cap * sizeof *res->pending);
    res->failed = malloc(cap * sizeof *res->failed);
    /* Without a read lease every key is answered as fenced ("Leases"). */
    bool fenced = !dp__lease_reads_ok_locked(u, now);
    res->fenced = fenced ? malloc(cap * sizeof *res->fenced) : NULL;
    blob_rec **pinned = malloc(cap * sizeof *pinned);
    /* With a budget, each entry's blob until the end decides inline or pinned. */
    blob_rec **eb = budget > 0 ? malloc(cap * sizeof *eb) : NULL;
    uint32_t np = 0;
    int rc;
    if (res->entries == NULL || res->missing == NULL || res->pending == NULL ||
        res->failed == NULL || pinned == NULL || (budget > 0 && eb == NULL) ||
        (fenced && res->fenced == NULL)) {
        rc = dp__fail(d, DP_ENOMEM, "resolve_keys: out of memory");
        goto fail;
    }
    uint64_t epoch = ++u->pin_epoch;
    for (uint32_t i = 0; i < n; i++) {
        dp__key_parts kp;
        rc = dp__key_split(keys[i].p, keys[i].n, &kp, d);
        if (rc != 0) {
            u->stats.n_proto++;
            dp__fail_ctx(d, DP_EPROTO, "resolve_keys");
            rc = DP_EPROTO;
            goto fail;
        }
        if (!dp__row_on_unit(kp.gidx, u->o.unit_id, u->o.n_units, u->o.replicas)) {
            u->stats.n_proto++;
            rc = dp__fail(d, DP_EPROTO,
                          "resolve_keys: key '%.*s' belongs to unit %" PRIu64
                          ", not to unit %u of %u",
                          (int)DP_MIN(keys[i].n, 80u), keys[i].p, kp.gidx % u->o.n_units,
                          u->o.unit_id, u->o.n_units);
            goto fail;
        }
        if (fenced) {
            res->fenced[res->n_fenced++] = keys[i];
            continue;
        }
        row *r = dp__map_get_u64(&u->rows, kp.gidx);
        slot *s = dp__row_slot(r, kp.field, (uint32_t)kp.field_len);
        if (s == NULL) {
            res->missing[res->n_missing++] = keys[i];
            continue;
        }
        blob_rec *b = s->b;
        int st = dp__ssd_resolve_state_locked(u, b, epoch, now);
        if (st == RES_PENDING) {
            res->pending[res->n_pending++] = keys[i];
            continue;
        }
        if (st == RES_FAILED) {
            res->failed[res->n_failed++] = keys[i];
            continue;
        }
        const dp__blob_entry *e = dp__blob_entry_at(b->parsed, s->i);
        dp__wire_key_loc *l = &res->entries[res->n_entries++];
        l->key = keys[i];
        l->off = b->off + e->off;
        l->len = e->len;
        resolved += e->len;
        l->kind = dp__zview(dp__blob_kind_name(e->kind));
        l->dtype = (dp__wire_str){e->dtype, e->dtype_len};
        l->shape = e->ndim > 0 ? e->shape : NULL;
        l->ndim = e->ndim;
        l->data = (dp__wire_bytes){NULL, 0};
        if (eb != NULL) {
            eb[res->n_entries - 1] = b; /* inline or pinned: decided below */
            continue;
        }
        if (b->pin_mark != epoch) {
            b->pin_mark = epoch;
            pinned[np++] = b;
        }
    }
    if (eb != NULL) {
        /*
         * All or nothing: when every value answered fits the budget they ride
         * in the reply, encoded under this lock (no pin, no READ; a staged copy
         * is still kept by this call's res_epoch); otherwise none does and all
         * are pinned: a large answer gains nothing from a few values inline.
         */
        bool all = resolved <= budget;
        for (uint32_t j = 0; j < res->n_entries; j++) {
            dp__wire_key_loc *l = &res->entries[j];
            blob_rec *b = eb[j];
            if (all) {
                if (l->len > 0)
                    l->data = (dp__wire_bytes){u->slab + l->off, (uint32_t)l->len};
                inlined += l->len;
                b->last_resolve_at = now; /* as a pin would mark it */
            } else if (b->pin_mark != epoch) {
                b->pin_mark = epoch;
                pinned[np++] = b;
            }
        }
        free(eb);
        eb = NULL;
    }
    u->stats.n_resolve++;
    rc = pin_create_locked(u, pinned, np, now, res->pin_id, d);
    if (rc != 0) {
        dp__unit_resolve_keys_res_fini(res);
        return rc;
    }
    u->stats.resolved_bytes += resolved;
    u->stats.inline_bytes += inlined;
    u->stats.fenced_keys += res->n_fenced;
    return rc;
fail:
    free(pinned);
    free(eb);
    dp__unit_resolve_keys_res_fini(res);
    return rc;
}

void
dp__unit_resolve_keys_res_fini(dp__unit_resolve_keys_res *res)
{
    free(res->entries);
    free(res->missing);
    free(res->pending);
    free(res->failed);
    free(res->fenced);
    memset(res, 0, sizeof *res);
}

/* Whether description t is entry e's (kind, dtype, shape). */
static bool
desc_is(const dp__wire_desc *t, const dp__blob_entry *e, const char *kind)
{
    if (t->kind.p != kind || t->dtype.n != e->dtype_len || t->ndim != e->ndim)
        return false;
    /* The same bytes in a blob's arenas (its entries of a field share them). */
    if (t->dtype.p == e->dtype && (e->ndim == 0 || t->shape == e->shape))
        return true;
    return memcmp(t->dtype.p, e->dtype, e->dtype_len) == 0 &&
           (e->ndim == 0 || memcmp(t->shape, e->shape, e->ndim * sizeof *e->shape) == 0);
}

static void
loc_put(uint8_t *o, uint64_t off, uint64_t len, uint32_t state, uint32_t desc)
{
    dp__le64_store(o, off);
    dp__le64_store(o + 8, len);
    dp__le32_store(o + 16, state);
    dp__le32_store(o + 20, desc);
}

/* The fields of a resolve_rows: their count and each one's spelling. */
static int
rows_args_check(dp__unit *u, const dp__wire_strs *fields, dp__wire_bytes rows,
                dp_detail *d)
{
    int rc = DP_OK;
    if (fields->n == 0 || fields->n > DP_WIRE_FIELDS_MAX)
        rc = dp__fail(d, DP_EPROTO, "resolve_rows: %u fields, want 1 .. %u", fields->n,
                      DP_WIRE_FIELDS_MAX);
    else if (rows.n == 0 || rows.n % DP_WIRE_ROW_LEN != 0 ||
             rows.n / DP_WIRE_ROW_LEN > dp__wire_limits_default.max_list)
        rc = dp__fail(d, DP_EPROTO,
                      "resolve_rows: rows of %u bytes, want 1 .. %u records of %d bytes",
                      rows.n, dp__wire_limits_default.max_list, DP_WIRE_ROW_LEN);
    for (uint32_t f = 0; f < fields->n && rc == DP_OK; f++)
        if ((rc = dp__field_check(fields->v[f].p, fields->v[f].n, d)) != DP_OK)
            rc = dp__fail_ctx(d, DP_EPROTO, "resolve_rows: fields[%u]", f);
    if (rc != DP_OK) {
        u->stats.n_proto++;
        rc = DP_EPROTO;
    }
    return rc;
}

/* Inline (every found value fits the budget: copied into res->data, none
 * pinned) or pinned; eb[i] is value i's blob when found, else NULL. */
static int
rows_inline_or_pin(dp__unit *u, dp__unit_resolve_rows_res *res, blob_rec **eb,
                   uint64_t resolved, uint64_t budget, blob_rec **pinned, uint32_t *np,
                   uint64_t epoch, double now, dp_detail *d)
{
    bool all = budget > 0 && resolved <= budget;
    if (all && resolved > 0 && (res->data = malloc(resolved)) == NULL)
        return dp__fail(d, DP_ENOMEM, "resolve_rows: out of memory");
    for (uint32_t i = 0; i < res->n; i++) {
        blob_rec *b = eb[i];
        if (b == NULL)
            continue;
        if (all) {
            const uint8_t *o = res->locs + (size_t)i * DP_WIRE_LOC_LEN;
            uint64_t len = dp__le64_load(o + 8);
            if (len > 0)
                memcpy(res->data + res->data_len, u->slab + dp__le64_load(o), len);
            res->data_len += len;
            b->last_resolve_at = now; /* as a pin would mark it */
        } else if (b->pin_mark != epoch) {
            b->pin_mark = epoch;
            pinned[(*np)++] = b;
        }
    }
    if (all)
        u->stats.inline_bytes += resolved;
    return DP_OK;
}

int
dp__unit_resolve_rows_locked(dp__unit *u, const dp__wire_strs *fields,
                             dp__wire_bytes rows, uint64_t inline_bytes,
                             dp__unit_resolve_rows_res *res, dp_detail *d)
{
    memset(res, 0, sizeof *res);
    int rc = rows_args_check(u, fields, rows, d);
    if (rc != DP_OK)
        return rc;
    uint32_t n = rows.n / DP_WIRE_ROW_LEN, nf = fields->n;
    uint64_t budget = DP_MIN(inline_bytes, (uint64_t)DP_UNIT_INLINE_MAX);
    uint64_t resolved = 0;
    double now = dp__unit_now(u);
    bool fenced = !dp__lease_reads_ok_locked(u, now); /* "Leases" */
    res->n = n;
    res->locs = malloc((size_t)n * DP_WIRE_LOC_LEN);
    res->descs = malloc((size_t)n * sizeof *res->descs);
    /* Per field: its last description and its hash in a row's slots. */
    uint32_t *fdesc = malloc(2 * (size_t)nf * sizeof *fdesc), *fhash = fdesc + nf;
    blob_rec **eb = malloc((size_t)n * sizeof *eb);
    blob_rec **pinned = malloc((size_t)n * sizeof *pinned);
    uint32_t np = 0;
    if (res->locs == NULL || res->descs == NULL || fdesc == NULL || eb == NULL ||
        pinned == NULL) {
        rc = dp__fail(d, DP_ENOMEM, "resolve_rows: out of memory");
        goto fail;
    }
    memset(fdesc, 0xff, nf * sizeof *fdesc);
    for (uint32_t f = 0; f < nf; f++)
        fhash[f] = dp__row_hash(fields->v[f].p, fields->v[f].n);
    uint64_t epoch = ++u->pin_epoch;
    row *r = NULL; /* the last value's row (the loop changes no row) */
    uint64_t prev = 0;
    for (uint32_t i = 0; i < n; i++) {
        const uint8_t *q = rows.p + (size_t)i * DP_WIRE_ROW_LEN;
        uint8_t *o = res->locs + (size_t)i * DP_WIRE_LOC_LEN;
        uint64_t gidx = dp__le64_load(q);
        uint32_t fi = dp__le32_load(q + 8);
        eb[i] = NULL;
        /* A row's values come one after another: its unit checked once. */
        bool row_ok = (i > 0 && gidx == prev) ||
                      dp__row_on_unit(gidx, u->o.unit_id, u->o.n_units, u->o.replicas);
        prev = gidx;
        if (fi >= nf || !row_ok) {
            u->stats.n_proto++;
            rc = fi >= nf
                     ? dp__fail(d, DP_EPROTO,
                                "resolve_rows: value %u names field %u of %u", i, fi, nf)
                     : dp__fail(d, DP_EPROTO,
                                "resolve_rows: row %" PRIu64 " belongs to unit %" PRIu64
                                ", not to unit %u of %u",
                                gidx, gidx % u->o.n_units, u->o.unit_id, u->o.n_units);
            goto fail;
        }
        if (fenced) {
            loc_put(o, 0, 0, DP_WIRE_ROW_FENCED, 0);
            continue;
        }
        const dp__wire_str *f = &fields->v[fi];
        if (r == NULL || r->gidx != gidx) /* a row's fields are usually asked together */
            r = dp__map_get_u64(&u->rows, gidx);
        int32_t k = r != NULL ? dp__row_find(r, f->p, f->n, fhash[fi]) : -1;
        slot *s = k >= 0 ? &r->s[k] : NULL;
        int st = s == NULL ? 0
                 : !(s->b->flags & REC_DISK)
                     ? RES_READY
                     : dp__ssd_resolve_state_locked(u, s->b, epoch, now);
        if (s == NULL || st == RES_PENDING || st == RES_FAILED) {
            loc_put(o, 0, 0,
                    s == NULL           ? DP_WIRE_ROW_MISSING
                    : st == RES_PENDING ? DP_WIRE_ROW_PENDING
                                        : DP_WIRE_ROW_FAILED,
                    0);
            continue;
        }
        blob_rec *b = s->b;
        const dp__blob_entry *e = dp__blob_entry_at(b->parsed, s->i);
        const char *kind = dp__blob_kind_name(e->kind);
        uint32_t di = fdesc[fi];
        if (di == UINT32_MAX || !desc_is(&res->descs[di], e, kind)) {
            di = fdesc[fi] = res->n_descs++;
            res->descs[di] = (dp__wire_desc){dp__zview(kind),
                                             {e->dtype, e->dtype_len},
                                             e->ndim > 0 ? e->shape : NULL,
                                             e->ndim};
        }
        loc_put(o, b->off + e->off, e->len, DP_WIRE_ROW_FOUND, di);
        resolved += e->len;
        eb[i] = b;
    }
    rc = rows_inline_or_pin(u, res, eb, resolved, budget, pinned, &np, epoch, now, d);
    if (rc != DP_OK)
        goto fail;
    free(eb);
    free(fdesc);
    u->stats.n_resolve++;
    u->stats.n_resolve_rows++;
    u->stats.fenced_keys += fenced ? n : 0;
    rc = pin_create_locked(u, pinned, np, now, res->pin_id, d); /* frees pinned */
    if (rc != 0) {
        dp__unit_resolve_rows_res_fini(res);
        return rc;
    }
    u->stats.resolved_bytes += resolved;
    return DP_OK;
fail:
    free(pinned);
    free(eb);
    free(fdesc);
    dp__unit_resolve_rows_res_fini(res);
    return rc;
}

void
dp__unit_resolve_rows_res_fini(dp__unit_resolve_rows_res *res)
{
    free(res->locs);
    free(res->descs);
    free(res->data);
    memset(res, 0, sizeof *res);
}

void
dp__unit_unpin(dp__unit *u, const char *pin_id, size_t len)
{
    pthread_mutex_lock(&u->mu);
    pin *p = len <= 32 ? dp__map_get(&u->pins, pin_id, len) : NULL;
    if (p != NULL) {
        u->stats.n_unpin++;
        dp__pin_end_locked(u, p, false, dp__unit_now(u));
    }
    pthread_mutex_unlock(&u->mu);
}
