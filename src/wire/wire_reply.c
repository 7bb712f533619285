/*
 * Control-message codec, part 2: each op's result, the error map and the reply
 * framing [request_id, ok, result | error] (see wire.h for the contract).
 *
 * Result maps use the field-table engine of wire_fields.c in tolerant mode
 * (unknown keys skipped), so a newer unit can add fields. Non-map results (a
 * number, a commit state, a bin, the generic scan/stats records) are read here
 * directly.
 */
#include "wire/wire_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* One field-table row: name, value kind, required, default, offset. */
// clang-format off
#define F(t, n, k, r, df) {#n, DP__V_##k, r, df, (uint16_t)offsetof(t, n)}
// clang-format on

static const dp__wire_fdesc info_f[] = {
    F(dp__wire_info, unit_id, U64, 1, 0),     F(dp__wire_info, n_units, U64, 1, 0),
    F(dp__wire_info, zmq, TEXT, 1, 0),        F(dp__wire_info, agent, TEXT, 1, 0),
    F(dp__wire_info, metadata, BIN, 1, 0),    F(dp__wire_info, slab_bytes, SIZE0, 1, 0),
    F(dp__wire_info, io_bytes, SIZE0, 0, 0),  F(dp__wire_info, numa, TEXT, 0, 0),
    F(dp__wire_info, slab_addr, U64, 0, 0),   F(dp__wire_info, read_pin_ms, U64, 0, 0),
    F(dp__wire_info, incarnation, U64, 0, 0), F(dp__wire_info, proto, U64, 0, 0),
    F(dp__wire_info, pid, U64, 0, 0),         F(dp__wire_info, host, TEXT, 0, 0),
    F(dp__wire_info, cluster, TEXT, 0, 0),    F(dp__wire_info, transports, TEXT, 0, 0),
    F(dp__wire_info, replicas, U64, 0, 0),    F(dp__wire_info, lease_ms, U64, 0, 0),
};
static const dp__wire_fdesc list_keys_res_f[] = {
    F(dp__wire_list_keys_res, keys, KEYS, 1, 0),
    F(dp__wire_list_keys_res, next, U64, 1, 0),
    F(dp__wire_list_keys_res, more, BOOL, 1, 0),
    F(dp__wire_list_keys_res, vers, U64S, 0, 0),
};
static const dp__wire_fdesc alloc_res_f[] = {
    F(dp__wire_alloc_res, off, OFF, 1, 0),
    F(dp__wire_alloc_res, token, U64, 1, 0),
};
static const dp__wire_fdesc resolve_f[] = {
    F(dp__wire_resolve_res, pin_id, ID_OR_NIL, 1, 0),
    F(dp__wire_resolve_res, blobs, BLOB_LOCS, 1, 0),
    F(dp__wire_resolve_res, missing, IDS, 1, 0),
    F(dp__wire_resolve_res, pending, IDS, 1, 0),
    F(dp__wire_resolve_res, failed, IDS, 1, 0),
    F(dp__wire_resolve_res, whole, IDS, 0, 0),
};
static const dp__wire_fdesc resolve_keys_f[] = {
    F(dp__wire_resolve_keys_res, pin_id, ID_OR_NIL, 1, 0),
    F(dp__wire_resolve_keys_res, entries, KEY_LOCS, 1, 0),
    F(dp__wire_resolve_keys_res, missing, KEYS, 1, 0),
    F(dp__wire_resolve_keys_res, pending, KEYS, 1, 0),
    F(dp__wire_resolve_keys_res, failed, KEYS, 1, 0),
    F(dp__wire_resolve_keys_res, fenced, KEYS, 0, 0),
};
static const dp__wire_fdesc resolve_rows_f[] = {
    F(dp__wire_resolve_rows_res, pin_id, ID_OR_NIL, 1, 0),
    F(dp__wire_resolve_rows_res, locs, BIN, 1, 0),
    F(dp__wire_resolve_rows_res, descs, DESCS, 1, 0),
    F(dp__wire_resolve_rows_res, data, BIN, 0, 0),
};
static const dp__wire_fdesc lease_res_f[] = {
    F(dp__wire_lease_res, granted, BOOL, 1, 0),
    F(dp__wire_lease_res, lease_ms, U64, 0, 0),
    F(dp__wire_lease_res, behind, U64, 0, 0),
};
static const dp__wire_fdesc fence_res_f[] = {
    F(dp__wire_fence_res, wait_ms, U64, 1, 0),
};
static const dp__wire_fdesc save_shard_f[] = {
    F(dp__wire_save_shard_res, blobs, SHARD_BLOBS, 1, 0),
    F(dp__wire_save_shard_res, nbytes, SIZE0, 1, 0),
    F(dp__wire_save_shard_res, clears_during_save, U64, 1, 0),
};
static const dp__wire_fdesc load_shard_f[] = {
    F(dp__wire_load_shard_res, loaded, IDS, 1, 0),
    F(dp__wire_load_shard_res, failed, IDS, 1, 0),
};
static const dp__wire_fdesc error_f[] = {
    F(dp__wire_error, kind, TEXT, 1, 0),
    F(dp__wire_error, msg, TEXT, 1, 0),
    F(dp__wire_error, reason, TEXT_OR_NIL, 0, 0),
    F(dp__wire_error, blobs, KEYS_OR_NIL, 0, 0),
    F(dp__wire_error, ver, U64, 0, 0),
};

#define TAB(t) t, DP_ARRAY_LEN(t)

/* ---- commit states, error kinds ---- */

static const char *const commit_names[] = {"done", "pending", "lost"};

const char *
dp__wire_commit_state_name(dp__wire_commit_state s)
{
    return (unsigned)s < DP_ARRAY_LEN(commit_names) ? commit_names[s] : "?";
}

const char *
dp__wire_err_kind(int code)
{
    switch (code) {
    case DP_EUNITFULL:
        return "UnitFull";
    case DP_EBUSY:
        return "Busy";
    case DP_ELOST:
        return "Missing";
    case DP__ESTALE:
        return "Stale";
    default:
        return "Protocol";
    }
}

int
dp__wire_err_code(dp__wire_str kind)
{
    if (dp__wire_str_eq(kind, "UnitFull"))
        return DP_EUNITFULL;
    if (dp__wire_str_eq(kind, "Busy"))
        return DP_EBUSY;
    if (dp__wire_str_eq(kind, "Missing"))
        return DP_ELOST;
    if (dp__wire_str_eq(kind, "Stale"))
        return DP__ESTALE;
    return DP_EPROTO;
}

int
dp__wire_error_to_detail(const dp__wire_error *e, dp_detail *d)
{
    if (d == NULL)
        return e->code;
    char buf[DP_DETAIL_MAX];
    dp__wire_str kind = e->kind.n > 0 ? e->kind : dp__wire_s(dp__wire_err_kind(e->code));
    int n = snprintf(buf, sizeof buf, "%.*s: %.*s", DP_WIRE_STR_ARG(kind),
                     e->msg.n > 0 ? (int)e->msg.n : 0, e->msg.n > 0 ? e->msg.p : "");
    if (e->reason.n > 0 && n >= 0 && (size_t)n < sizeof buf)
        n += snprintf(buf + n, sizeof buf - (size_t)n, " (reason: %.*s)",
                      DP_WIRE_STR_ARG(e->reason));
    for (uint32_t i = 0; i < e->blobs.n && n >= 0 && (size_t)n < sizeof buf; i++) {
        if ((size_t)n + e->blobs.v[i].n + 24 > sizeof buf) {
            snprintf(buf + n, sizeof buf - (size_t)n, " ... and %u more", e->blobs.n - i);
            break;
        }
        n += snprintf(buf + n, sizeof buf - (size_t)n, "%s%.*s",
                      i == 0 ? " [blobs: " : ", ", DP_WIRE_STR_ARG(e->blobs.v[i]));
        if (i + 1 == e->blobs.n && (size_t)n < sizeof buf)
            n += snprintf(buf + n, sizeof buf - (size_t)n, "]");
    }
    return dp__fail(d, e->code, "%s", buf);
}

/* ---- generic scalar records (scan, stats) ---- */

const dp__wire_field *
dp__wire_fields_get(const dp__wire_fields *f, const char *name)
{
    for (uint32_t i = 0; i < f->n; i++)
        if (dp__wire_str_eq(f->v[i].name, name))
            return &f->v[i];
    return NULL;
}

bool
dp__wire_fields_u64(const dp__wire_fields *f, const char *name, uint64_t *out)
{
    const dp__wire_field *x = dp__wire_fields_get(f, name);
    if (x == NULL)
        return false;
    switch (x->type) {
    case DP_WIRE_BOOL:
        *out = x->v.b;
        return true;
    case DP_WIRE_U64:
        *out = x->v.u;
        return true;
    case DP_WIRE_I64:
        if (x->v.i < 0)
            return false;
        *out = (uint64_t)x->v.i;
        return true;
    case DP_WIRE_F64:
        if (!(x->v.f >= 0 && x->v.f < 18446744073709551616.0) ||
            x->v.f != (double)(uint64_t)x->v.f)
            return false;
        *out = (uint64_t)x->v.f;
        return true;
    default:
        return false;
    }
}

/*
 * One field "name: scalar" into the pool. *kept is false when the value is
 * not a scalar (a newer unit's nested field): it is skipped.
 */
static int
rd_field(dp__wire_dec *c, dp__wire_pool *pool, bool *kept)
{
    dp__wire_str name;
    int rc = dp__mp_read_str(&c->r, &name.p, &name.n, "field name", c->d);
    if (rc == DP_OK)
        rc = dp__wire_check_text(name, c->lim, "field name", c->d);
    if (rc != DP_OK)
        return rc;
    char q[80];
    dp__wire_field x = {.name = name};
    switch (dp__mp_peek(&c->r)) {
    case DP_MP_NIL:
        c->r.p++;
        x.type = DP_WIRE_NIL;
        break;
    case DP_MP_BOOL:
        x.type = DP_WIRE_BOOL;
        rc = dp__mp_read_bool(&c->r, &x.v.b, NULL, c->d);
        break;
    case DP_MP_UINT:
        x.type = DP_WIRE_U64;
        rc = dp__mp_read_u64(&c->r, &x.v.u, NULL, c->d);
        break;
    case DP_MP_INT:
        x.type = DP_WIRE_I64;
        rc = dp__mp_read_i64(&c->r, &x.v.i, NULL, c->d);
        if (rc == DP_OK && x.v.i >= 0) { /* a positive value in a signed format */
            x.type = DP_WIRE_U64;
            x.v.u = (uint64_t)x.v.i;
        }
        break;
    case DP_MP_FLOAT:
        x.type = DP_WIRE_F64;
        rc = dp__mp_read_double(&c->r, &x.v.f, NULL, c->d);
        break;
    case DP_MP_STR:
        x.type = DP_WIRE_STR;
        rc = dp__mp_read_str(&c->r, &x.v.s.p, &x.v.s.n, NULL, c->d);
        if (rc == DP_OK)
            rc = dp__wire_check_text(x.v.s, c->lim, NULL, c->d);
        break;
    default:
        *kept = false;
        rc = dp__mp_skip(&c->r, c->d);
        if (rc != DP_OK)
            return dp__fail_ctx(c->d, rc, "'%s'", dp__wire_quote(name, q, sizeof q));
        return DP_OK;
    }
    if (rc != DP_OK)
        return dp__fail_ctx(c->d, rc, "'%s'", dp__wire_quote(name, q, sizeof q));
    dp__wire_field *slot = dp__wire_pool_push(pool);
    if (slot == NULL)
        return dp__fail(c->d, DP_ENOMEM, "out of memory");
    *slot = x;
    *kept = true;
    return DP_OK;
}

/* A flat map of scalars appended to pool; *n gets the number of kept fields. */
static int
rd_fields(dp__wire_dec *c, dp__wire_pool *pool, uint32_t *kept_n)
{
    uint32_t n;
    int rc = dp__mp_read_map(&c->r, &n, NULL, c->d);
    if (rc != DP_OK)
        return rc;
    if (n > c->lim->max_fields)
        return dp__fail(c->d, DP_ETOOBIG, "map of %u fields, the limit is %u", n,
                        c->lim->max_fields);
    if ((rc = dp__wire_charge(c, n, NULL)) != DP_OK)
        return rc;
    *kept_n = 0;
    for (uint32_t i = 0; i < n; i++) {
        bool kept;
        if ((rc = rd_field(c, pool, &kept)) != DP_OK)
            return rc;
        *kept_n += kept;
    }
    return DP_OK;
}

static int
rd_stats(dp__wire_dec *c, dp__wire_fields *out)
{
    dp__wire_pool pool = {.esz = sizeof(dp__wire_field)};
    uint32_t n = 0;
    int rc = rd_fields(c, &pool, &n);
    if (rc != DP_OK) {
        dp__wire_pool_drop(&pool);
        return rc;
    }
    out->v = dp__wire_pool_finish(&pool, c->mem);
    out->n = n;
    return DP_OK;
}

static int
rd_scan(dp__wire_dec *c, dp__wire_scan_res *out)
{
    uint32_t n;
    int rc = dp__mp_read_array(&c->r, &n, NULL, c->d);
    if (rc == DP_OK)
        rc = dp__wire_charge(c, n, "records");
    if (rc != DP_OK)
        return rc;
    out->recs = NULL;
    out->n = 0;
    if (n == 0)
        return DP_OK;
    dp__wire_fields *recs = dp__wire_alloc(c->mem, (size_t)n * sizeof *recs);
    if (recs == NULL)
        return dp__fail(c->d, DP_ENOMEM, "out of memory");
    dp__wire_pool pool = {.esz = sizeof(dp__wire_field)};
    for (uint32_t i = 0; i < n; i++) {
        rc = rd_fields(c, &pool, &recs[i].n);
        if (rc != DP_OK) {
            dp__wire_pool_drop(&pool);
            return dp__fail_ctx(c->d, rc, "record %u", i);
        }
    }
    /* Fields were pushed record by record: hand out consecutive slices. */
    dp__wire_field *all = dp__wire_pool_finish(&pool, c->mem);
    size_t pos = 0;
    for (uint32_t i = 0; i < n; i++) {
        recs[i].v = recs[i].n > 0 ? all + pos : NULL;
        pos += recs[i].n;
    }
    out->recs = recs;
    out->n = n;
    return DP_OK;
}

static void
put_fields(dp__mp_writer *w, const dp__wire_fields *f, const dp__wire_limits *lim)
{
    dp__mp_put_map(w, f->n);
    for (uint32_t i = 0; i < f->n; i++) {
        const dp__wire_field *x = &f->v[i];
        dp__wire_put_text(w, x->name, lim->max_text);
        switch (x->type) {
        case DP_WIRE_BOOL:
            dp__mp_put_bool(w, x->v.b);
            break;
        case DP_WIRE_U64:
            dp__mp_put_u64(w, x->v.u);
            break;
        case DP_WIRE_I64:
            dp__mp_put_i64(w, x->v.i);
            break;
        case DP_WIRE_F64:
            dp__mp_put_double(w, x->v.f);
            break;
        case DP_WIRE_STR:
            dp__wire_put_text(w, x->v.s, lim->max_text);
            break;
        default:
            dp__mp_put_nil(w);
            break;
        }
    }
}

/* ---- results ---- */

static int
rd_result(dp__wire_dec *c, dp__wire_reply *rep)
{
    switch (rep->op) {
    case DP_WIRE_OP_PING:
        return dp__wire_value_decode(c, DP__V_U64, "unit_id", &rep->r.unit_id);
    case DP_WIRE_OP_INFO:
        return dp__wire_map_decode(c, TAB(info_f), false, &rep->r.info, NULL);
    case DP_WIRE_OP_ALLOC:
        return dp__wire_map_decode(c, TAB(alloc_res_f), false, &rep->r.alloc, NULL);
    case DP_WIRE_OP_COMMIT:
    case DP_WIRE_OP_PUT: {
        dp__wire_str s;
        int rc = dp__mp_read_str(&c->r, &s.p, &s.n, "state", c->d);
        if (rc != DP_OK)
            return rc;
        for (size_t i = 0; i < DP_ARRAY_LEN(commit_names); i++) {
            if (dp__wire_str_eq(s, commit_names[i])) {
                rep->r.commit = (dp__wire_commit_state)i;
                return DP_OK;
            }
        }
        char q[80];
        return dp__fail(c->d, DP_EPROTO,
                        "state: '%s' is not one of \"done\", \"pending\", \"lost\"",
                        dp__wire_quote(s, q, sizeof q));
    }
    case DP_WIRE_OP_RESOLVE:
        return dp__wire_map_decode(c, TAB(resolve_f), false, &rep->r.resolve, NULL);
    case DP_WIRE_OP_RESOLVE_KEYS:
        return dp__wire_map_decode(c, TAB(resolve_keys_f), false, &rep->r.resolve_keys,
                                   NULL);
    case DP_WIRE_OP_RESOLVE_ROWS:
        return dp__wire_map_decode(c, TAB(resolve_rows_f), false, &rep->r.resolve_rows,
                                   NULL);
    case DP_WIRE_OP_RELEASE_ROWS:
        return dp__wire_value_decode(c, DP__V_U64, "dropped", &rep->r.dropped);
    case DP_WIRE_OP_SCAN:
        return rd_scan(c, &rep->r.scan);
    case DP_WIRE_OP_STATS:
        return rd_stats(c, &rep->r.stats);
    case DP_WIRE_OP_READ_BYTES:
        return dp__wire_value_decode(c, DP__V_BIN, "bytes", &rep->r.bytes);
    case DP_WIRE_OP_SAVE_SHARD:
        return dp__wire_map_decode(c, TAB(save_shard_f), false, &rep->r.save_shard, NULL);
    case DP_WIRE_OP_LOAD_SHARD:
        return dp__wire_map_decode(c, TAB(load_shard_f), false, &rep->r.load_shard, NULL);
    case DP_WIRE_OP_LIST_KEYS:
        return dp__wire_map_decode(c, TAB(list_keys_res_f), false, &rep->r.list_keys,
                                   NULL);
    case DP_WIRE_OP_LEASE:
        return dp__wire_map_decode(c, TAB(lease_res_f), false, &rep->r.lease, NULL);
    case DP_WIRE_OP_FENCE:
        return dp__wire_map_decode(c, TAB(fence_res_f), false, &rep->r.fence, NULL);
    default:
        break;
    }
    DP_ASSERT(!"op without a result");
    return DP_EINVAL;
}

static void
put_result(dp__mp_writer *w, const dp__wire_reply *rep, const dp__wire_limits *lim)
{
    switch (rep->op) {
    case DP_WIRE_OP_PING:
        dp__mp_put_u64(w, rep->r.unit_id);
        return;
    case DP_WIRE_OP_INFO:
        dp__wire_map_encode(w, TAB(info_f), &rep->r.info, lim);
        return;
    case DP_WIRE_OP_ALLOC:
        dp__wire_map_encode(w, TAB(alloc_res_f), &rep->r.alloc, lim);
        return;
    case DP_WIRE_OP_COMMIT:
    case DP_WIRE_OP_PUT: /* answered as the commit it ends with */
        dp__mp_put_str(w, dp__wire_commit_state_name(rep->r.commit));
        return;
    case DP_WIRE_OP_RESOLVE:
        dp__wire_map_encode(w, TAB(resolve_f), &rep->r.resolve, lim);
        return;
    case DP_WIRE_OP_RESOLVE_KEYS:
        dp__wire_map_encode(w, TAB(resolve_keys_f), &rep->r.resolve_keys, lim);
        return;
    case DP_WIRE_OP_RESOLVE_ROWS:
        dp__wire_map_encode(w, TAB(resolve_rows_f), &rep->r.resolve_rows, lim);
        return;
    case DP_WIRE_OP_RELEASE_ROWS:
        dp__mp_put_u64(w, rep->r.dropped);
        return;
    case DP_WIRE_OP_SCAN:
        dp__mp_put_array(w, rep->r.scan.n);
        for (uint32_t i = 0; i < rep->r.scan.n; i++)
            put_fields(w, &rep->r.scan.recs[i], lim);
        return;
    case DP_WIRE_OP_STATS:
        put_fields(w, &rep->r.stats, lim);
        return;
    case DP_WIRE_OP_READ_BYTES:
        dp__wire_value_encode(w, DP__V_BIN, &rep->r.bytes, lim);
        return;
    case DP_WIRE_OP_SAVE_SHARD:
        dp__wire_map_encode(w, TAB(save_shard_f), &rep->r.save_shard, lim);
        return;
    case DP_WIRE_OP_LOAD_SHARD:
        dp__wire_map_encode(w, TAB(load_shard_f), &rep->r.load_shard, lim);
        return;
    case DP_WIRE_OP_LIST_KEYS:
        dp__wire_map_encode(w, TAB(list_keys_res_f), &rep->r.list_keys, lim);
        return;
    case DP_WIRE_OP_LEASE:
        dp__wire_map_encode(w, TAB(lease_res_f), &rep->r.lease, lim);
        return;
    case DP_WIRE_OP_FENCE:
        dp__wire_map_encode(w, TAB(fence_res_f), &rep->r.fence, lim);
        return;
    default:
        DP_ASSERT(!"op without a result");
    }
}

static void
put_error(dp__mp_writer *w, const dp__wire_error *e, const dp__wire_limits *lim)
{
    dp__mp_put_map(w, e->ver != 0 ? 5 : 4);
    dp__mp_put_str(w, "kind");
    dp__mp_put_str(w, dp__wire_err_kind(e->code));
    dp__mp_put_str(w, "msg");
    dp__wire_put_text(w, e->msg, lim->max_text);
    dp__mp_put_str(w, "reason");
    dp__wire_value_encode(w, DP__V_TEXT_OR_NIL, &e->reason, lim);
    dp__mp_put_str(w, "blobs");
    dp__wire_value_encode(w, DP__V_KEYS_OR_NIL, &e->blobs, lim);
    if (e->ver != 0) {
        dp__mp_put_str(w, "ver");
        dp__mp_put_u64(w, e->ver);
    }
}

/* ---- replies ---- */

static bool
has_reply(dp__wire_op op)
{
    return (int)op >= 0 && op < DP_WIRE_OP_COUNT_ && !dp__wire_op_is_notify(op);
}

int
dp__wire_reply_encode(const dp__wire_reply *rep, const dp__wire_limits *lim, dp__buf *out,
                      dp_detail *d)
{
    lim = DP__WIRE_LIM(lim);
    if (!has_reply(rep->op))
        return dp__fail(d, DP_EINVAL, "reply: op %s has no reply",
                        dp__wire_op_name(rep->op));
    size_t start = out->len;
    bool oom = out->oom;
    dp__mp_writer w;
    dp__mp_writer_init(&w, out);
    dp__mp_put_array(&w, rep->incarnation != 0 ? 4 : 3);
    dp__mp_put_strn(&w, rep->rid.n ? rep->rid.p : "", rep->rid.n);
    dp__mp_put_bool(&w, rep->ok);
    if (rep->ok)
        put_result(&w, rep, lim);
    else
        put_error(&w, &rep->err, lim);
    if (rep->incarnation != 0)
        dp__mp_put_u64(&w, rep->incarnation);
    return dp__wire_encode_end(out, start, oom, lim, dp__wire_op_name(rep->op), d);
}

int
dp__wire_reply_encode_error(dp__wire_str rid, uint64_t incarnation,
                            const dp__wire_error *err, const dp__wire_limits *lim,
                            dp__buf *out, dp_detail *d)
{
    lim = DP__WIRE_LIM(lim);
    size_t start = out->len;
    bool oom = out->oom;
    dp__wire_error e = *err;
    if (e.msg.n == 0)
        e.msg = dp__wire_s(dp_strerror(e.code));
    dp__mp_writer w;
    dp__mp_writer_init(&w, out);
    dp__mp_put_array(&w, incarnation != 0 ? 4 : 3);
    dp__mp_put_strn(&w, rid.n ? rid.p : "", rid.n);
    dp__mp_put_bool(&w, false);
    put_error(&w, &e, lim);
    if (incarnation != 0)
        dp__mp_put_u64(&w, incarnation);
    return dp__wire_encode_end(out, start, oom, lim, "error reply", d);
}

static int
reply_head(dp__mp_reader *r, const dp__wire_limits *lim, dp__wire_str *rid, uint32_t *n,
           dp_detail *d)
{
    *rid = (dp__wire_str){"", 0};
    int rc = dp__mp_read_array(r, n, "reply", d);
    if (rc != DP_OK)
        return rc;
    if (*n < 1)
        return dp__fail(d, DP_EPROTO, "reply: empty array");
    dp__wire_str id;
    if ((rc = dp__mp_read_str(r, &id.p, &id.n, "request_id", d)) != DP_OK)
        return rc;
    if ((rc = dp__wire_check_id(id, lim, "request_id", d)) != DP_OK)
        return rc;
    *rid = id;
    return DP_OK;
}

int
dp__wire_reply_peek(const void *msg, size_t len, const dp__wire_limits *lim,
                    dp__wire_str *rid, dp_detail *d)
{
    dp__mp_reader r;
    uint32_t n;
    dp__mp_reader_init(&r, msg, len);
    return reply_head(&r, DP__WIRE_LIM(lim), rid, &n, d);
}

int
dp__wire_reply_decode(const void *msg, size_t len, dp__wire_op op,
                      const dp__wire_limits *lim, dp__wire_reply *rep, dp_detail *d)
{
    lim = DP__WIRE_LIM(lim);
    memset(rep, 0, sizeof *rep);
    rep->op = op;
    if (!has_reply(op))
        return dp__fail(d, DP_EINVAL, "reply: op %s has no reply", dp__wire_op_name(op));
    const char *name = dp__wire_op_name(op);
    dp__wire_dec c = {.lim = lim, .d = d, .mem = &rep->mem_};
    dp__mp_reader_init(&c.r, msg, len);
    uint32_t n;
    int rc = reply_head(&c.r, lim, &rep->rid, &n, d);
    if (rc != DP_OK)
        return dp__fail_ctx(d, rc, "%s reply", name);
    if (len > lim->max_msg)
        return dp__fail(d, DP_ETOOBIG,
                        "%s reply: message of %zu bytes is over the limit %llu", name,
                        len, (unsigned long long)lim->max_msg);
    if (n != 3 && n != 4)
        return dp__fail(
            d, DP_EPROTO,
            "%s reply: array of %u elements, expected [request_id, ok, result, "
            "incarnation]",
            name, n);
    if ((rc = dp__mp_read_bool(&c.r, &rep->ok, "ok", d)) != DP_OK)
        goto fail;
    if (rep->ok) {
        rc = rd_result(&c, rep);
        if (rc != DP_OK)
            rc = dp__fail_ctx(d, rc, "result");
    } else {
        rc = dp__wire_map_decode(&c, TAB(error_f), false, &rep->err, "error");
        if (rc != DP_OK)
            rc = dp__fail_ctx(d, rc, "error");
        else
            rep->err.code = dp__wire_err_code(rep->err.kind);
    }
    if (rc != DP_OK)
        goto fail;
    if (n == 4 &&
        (rc = dp__mp_read_u64(&c.r, &rep->incarnation, "incarnation", d)) != DP_OK)
        goto fail;
    if (dp__mp_remaining(&c.r) != 0) {
        rc = dp__fail(d, DP_EPROTO, "%zu trailing bytes after the reply",
                      dp__mp_remaining(&c.r));
        goto fail;
    }
    return DP_OK;
fail:
    rc = dp__fail_ctx(d, rc, "%s reply", name);
    dp__wire_free_all(&rep->mem_);
    memset(&rep->r, 0, sizeof rep->r);
    memset(&rep->err, 0, sizeof rep->err);
    return rc;
}

void
dp__wire_reply_fini(dp__wire_reply *rep)
{
    if (rep == NULL)
        return;
    dp__wire_free_all(&rep->mem_);
    memset(rep, 0, sizeof *rep);
    rep->op = DP_WIRE_OP_NONE;
}
