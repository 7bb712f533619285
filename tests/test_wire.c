/*
 * Tests for src/wire/wire: the control-message codec. Round trips of every
 * op's args and results and of every error kind; a rejection case for every
 * rule with the detail checked to name the field; truncation at every byte;
 * random structs (encode -> decode -> equal) and random mutations (decode
 * fails cleanly or succeeds, never crashes: run under ASan/UBSan).
 */
#include "dp_test.h"

#include <limits.h>

#include "wire/wire.h"
#include "wire/mp.h"

/* ---- random valid values ---- */

typedef struct gen {
    uint64_t st;
    void *allocs[16384];
    int n;
} gen;

static void *
galloc(gen *g, size_t n)
{
    CHECK(g->n < (int)DP_ARRAY_LEN(g->allocs));
    void *p = calloc(1, n ? n : 1);
    CHECK(p != NULL);
    g->allocs[g->n++] = p;
    return p;
}

static void
gfree(gen *g)
{
    for (int i = 0; i < g->n; i++)
        free(g->allocs[i]);
    g->n = 0;
}

static uint64_t
rnd(gen *g, uint64_t n)
{
    return n == 0 ? 0 : dp_test_rand(&g->st) % n;
}

/* A number spread over every msgpack width, below limit. */
static uint64_t
gnum(gen *g, uint64_t limit)
{
    uint64_t v = dp_test_rand(&g->st) >> rnd(g, 64);
    return limit ? v % limit : v;
}

static dp_wire_str
gid(gen *g)
{
    static const char cs[] =
        "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.:-";
    uint32_t n = 1 + (uint32_t)rnd(g, rnd(g, 4) == 0 ? 64 : 12);
    char *p = galloc(g, n);
    for (uint32_t i = 0; i < n; i++)
        p[i] = cs[rnd(g, sizeof cs - 1)];
    return (dp_wire_str){p, n};
}

/* UTF-8 text of up to max bytes (min bytes at least). */
static dp_wire_str
gtext_n(gen *g, uint32_t min, uint32_t max)
{
    static const char *const pieces[] = {"a",  "Z", "0", " ", "_", "@",
                                         "\n", "é", "€", "😀", "/"};
    char *p = galloc(g, max + 1);
    uint32_t target = min + (uint32_t)rnd(g, max - min + 1), n = 0;
    while (n < target) {
        const char *pc = pieces[rnd(g, DP_ARRAY_LEN(pieces))];
        size_t k = strlen(pc);
        if (n + k > max)
            pc = "x", k = 1;
        memcpy(p + n, pc, k);
        n += (uint32_t)k;
    }
    return (dp_wire_str){p, n};
}

static dp_wire_str
gtext(gen *g)
{
    return gtext_n(g, 0, rnd(g, 8) == 0 ? 300 : 24);
}

static dp_wire_str
gkey(gen *g)
{
    char *p = galloc(g, 300);
    int n = snprintf(p, 300, "%llu@", (unsigned long long)gnum(g, 0));
    dp_wire_str f = gtext_n(g, 1, 255 - 0);
    if ((uint32_t)n + f.n > 276)
        f.n = 276 - (uint32_t)n;
    memcpy(p + n, f.p, f.n);
    /* a cut multi-byte char would be invalid: keep only whole characters */
    uint32_t len = (uint32_t)n + f.n;
    while (len > (uint32_t)n + 1 && !dp__wire_utf8_valid(p, len))
        len--;
    if (!dp__wire_utf8_valid(p, len)) {
        p[n] = 'f';
        len = (uint32_t)n + 1;
    }
    return (dp_wire_str){p, len};
}

static dp_wire_strs
glist(gen *g, bool keys)
{
    dp_wire_strs l = {NULL, (uint32_t)rnd(g, 12)};
    if (l.n > 0) {
        l.v = galloc(g, l.n * sizeof *l.v);
        for (uint32_t i = 0; i < l.n; i++)
            l.v[i] = keys ? gkey(g) : gid(g);
    }
    return l;
}

static dp_wire_shard_blobs
gshard(gen *g)
{
    dp_wire_shard_blobs l = {NULL, (uint32_t)rnd(g, 8)};
    if (l.n > 0) {
        l.v = galloc(g, l.n * sizeof *l.v);
        for (uint32_t i = 0; i < l.n; i++)
            l.v[i] = (dp_wire_shard_blob){gid(g), gnum(g, 1ull << 62),
                                          gnum(g, 1ull << 62), gnum(g, 1ull << 62)};
    }
    return l;
}

static void
gargs(gen *g, dp_wire_request *q)
{
    switch (q->op) {
    case DP_WIRE_OP_ALLOC:
        q->a.alloc = (dp_wire_alloc_args){gid(g), 1 + gnum(g, (1ull << 62) - 1),
                                          gnum(g, (1u << 20) + 1), rnd(g, 2)};
        break;
    case DP_WIRE_OP_COMMIT:
        q->a.commit.blob_id = gid(g);
        break;
    case DP_WIRE_OP_ABORT:
        q->a.abort = (dp_wire_abort_args){gid(g), rnd(g, 2)};
        break;
    case DP_WIRE_OP_RESOLVE:
        q->a.resolve.blob_ids = glist(g, false);
        break;
    case DP_WIRE_OP_RESOLVE_KEYS:
        q->a.resolve_keys.keys = glist(g, true);
        break;
    case DP_WIRE_OP_UNPIN:
        q->a.unpin.pin_id = gid(g);
        break;
    case DP_WIRE_OP_RELEASE_ROWS: {
        dp_wire_u64s *l = &q->a.release_rows.gidxs;
        l->n = (uint32_t)rnd(g, 20);
        l->v = galloc(g, l->n * sizeof *l->v);
        for (uint32_t i = 0; i < l->n; i++)
            l->v[i] = gnum(g, 0);
        break;
    }
    case DP_WIRE_OP_READ_BYTES:
        q->a.read_bytes =
            (dp_wire_read_bytes_args){gnum(g, 1ull << 62), gnum(g, (16u << 20) + 1)};
        break;
    case DP_WIRE_OP_SAVE_SHARD:
        q->a.save_shard.path = gtext_n(g, 1, rnd(g, 4) ? 40 : PATH_MAX - 1);
        break;
    case DP_WIRE_OP_LOAD_SHARD:
        q->a.load_shard.path = gtext_n(g, 1, 60);
        q->a.load_shard.blobs = gshard(g);
        q->a.load_shard.spill = rnd(g, 2);
        break;
    default: /* ping, info, scan, stats: no args */
        break;
    }
}

static dp_wire_fields
gfields(gen *g)
{
    dp_wire_fields f = {NULL, (uint32_t)rnd(g, 10)};
    f.v = galloc(g, f.n * sizeof *f.v);
    for (uint32_t i = 0; i < f.n; i++) {
        dp_wire_field *x = &f.v[i];
        x->name = gtext(g);
        x->type = (dp_wire_scalar_type)rnd(g, 6);
        switch (x->type) {
        case DP_WIRE_BOOL:
            x->v.b = rnd(g, 2);
            break;
        case DP_WIRE_U64:
            x->v.u = gnum(g, 0);
            break;
        case DP_WIRE_I64:
            x->v.i = -1 - (int64_t)gnum(g, (uint64_t)INT64_MAX);
            break;
        case DP_WIRE_F64:
            x->v.f = (double)(int64_t)gnum(g, 0) / 3.0;
            break;
        case DP_WIRE_STR:
            x->v.s = gtext(g);
            break;
        default:
            break;
        }
    }
    return f;
}

static dp_wire_str
gpin(gen *g)
{
    return rnd(g, 4) == 0 ? (dp_wire_str){"", 0} : gid(g);
}

static void
gresult(gen *g, dp_wire_reply *r)
{
    switch (r->op) {
    case DP_WIRE_OP_PING:
        r->r.unit_id = gnum(g, 0);
        break;
    case DP_WIRE_OP_INFO: {
        dp_wire_info *i = &r->r.info;
        i->unit_id = gnum(g, 0);
        i->n_units = gnum(g, 0);
        i->zmq = gtext(g);
        i->agent = gtext(g);
        dp_wire_str md = gtext_n(g, 0, 200);
        i->metadata = (dp_wire_bytes){(const uint8_t *)md.p, md.n};
        i->slab_bytes = gnum(g, 1ull << 62);
        i->io_bytes = gnum(g, 1ull << 62);
        i->numa = gtext(g);
        i->slab_addr = gnum(g, 0);
        i->read_pin_ms = gnum(g, 0);
        break;
    }
    case DP_WIRE_OP_ALLOC:
        r->r.alloc.off = gnum(g, 1ull << 62);
        r->r.alloc.token = gnum(g, UINT64_MAX);
        break;
    case DP_WIRE_OP_COMMIT:
        r->r.commit = (dp_wire_commit_state)rnd(g, 3);
        break;
    case DP_WIRE_OP_RESOLVE: {
        dp_wire_resolve_res *x = &r->r.resolve;
        x->pin_id = gpin(g);
        x->blobs.n = (uint32_t)rnd(g, 10);
        x->blobs.v = galloc(g, x->blobs.n * sizeof *x->blobs.v);
        for (uint32_t i = 0; i < x->blobs.n; i++)
            x->blobs.v[i] =
                (dp_wire_blob_loc){gid(g), gnum(g, 1ull << 62), gnum(g, 1ull << 62)};
        x->missing = glist(g, false);
        x->pending = glist(g, false);
        x->failed = glist(g, false);
        break;
    }
    case DP_WIRE_OP_RESOLVE_KEYS: {
        dp_wire_resolve_keys_res *x = &r->r.resolve_keys;
        x->pin_id = gpin(g);
        x->entries.n = (uint32_t)rnd(g, 10);
        x->entries.v = galloc(g, x->entries.n * sizeof *x->entries.v);
        for (uint32_t i = 0; i < x->entries.n; i++) {
            dp_wire_key_loc *e = &x->entries.v[i];
            e->key = gkey(g);
            e->off = gnum(g, 1ull << 62);
            e->len = gnum(g, 1ull << 62);
            e->kind = gtext(g);
            e->dtype = gtext(g);
            e->ndim = (uint32_t)rnd(g, 33);
            uint64_t *s = galloc(g, e->ndim * sizeof *s);
            for (uint32_t j = 0; j < e->ndim; j++)
                s[j] = gnum(g, 1ull << 62);
            e->shape = e->ndim ? s : NULL;
        }
        x->missing = glist(g, true);
        x->pending = glist(g, true);
        x->failed = glist(g, true);
        break;
    }
    case DP_WIRE_OP_RELEASE_ROWS:
        r->r.dropped = gnum(g, 0);
        break;
    case DP_WIRE_OP_SCAN:
        r->r.scan.n = (uint32_t)rnd(g, 6);
        r->r.scan.recs = galloc(g, r->r.scan.n * sizeof *r->r.scan.recs);
        for (uint32_t i = 0; i < r->r.scan.n; i++)
            r->r.scan.recs[i] = gfields(g);
        break;
    case DP_WIRE_OP_STATS:
        r->r.stats = gfields(g);
        break;
    case DP_WIRE_OP_READ_BYTES: {
        uint32_t n = (uint32_t)rnd(g, 300);
        uint8_t *p = galloc(g, n);
        for (uint32_t i = 0; i < n; i++)
            p[i] = (uint8_t)rnd(g, 256);
        r->r.bytes = (dp_wire_bytes){p, n};
        break;
    }
    case DP_WIRE_OP_SAVE_SHARD:
        r->r.save_shard.blobs = gshard(g);
        r->r.save_shard.nbytes = gnum(g, 1ull << 62);
        r->r.save_shard.clears_during_save = gnum(g, 0);
        break;
    case DP_WIRE_OP_LOAD_SHARD:
        r->r.load_shard.loaded = glist(g, false);
        r->r.load_shard.failed = glist(g, false);
        break;
    default:
        CHECK(!"no result");
    }
}

static void
gerror(gen *g, dp_wire_reply *r)
{
    static const int codes[] = {DP_EUNITFULL, DP_EBUSY, DP_ELOST, DP_EPROTO};
    r->ok = false;
    r->err.code = codes[rnd(g, 4)];
    r->err.msg = gtext(g);
    r->err.reason = rnd(g, 2) ? gtext_n(g, 1, 30) : (dp_wire_str){"", 0};
    r->err.blobs = glist(g, true);
}

/* ---- equality ---- */

#define CHECK_SV(a, b)                                                                   \
    CHECKF(dp__wire_str_same((a), (b)), "'%.*s' != '%.*s'", DP_WIRE_STR_ARG(a),          \
           DP_WIRE_STR_ARG(b))

static void
check_strs(dp_wire_strs a, dp_wire_strs b)
{
    CHECK_EQ(a.n, b.n);
    for (uint32_t i = 0; i < a.n; i++)
        CHECK_SV(a.v[i], b.v[i]);
}

static void
check_shard(dp_wire_shard_blobs a, dp_wire_shard_blobs b)
{
    CHECK_EQ(a.n, b.n);
    for (uint32_t i = 0; i < a.n; i++) {
        CHECK_SV(a.v[i].id, b.v[i].id);
        CHECK_EQ_U64(a.v[i].off, b.v[i].off);
        CHECK_EQ_U64(a.v[i].nbytes, b.v[i].nbytes);
        CHECK_EQ_U64(a.v[i].refs, b.v[i].refs);
    }
}

static void
check_fields(const dp_wire_fields *a, const dp_wire_fields *b)
{
    CHECK_EQ(a->n, b->n);
    for (uint32_t i = 0; i < a->n; i++) {
        const dp_wire_field *x = &a->v[i], *y = &b->v[i];
        CHECK_SV(x->name, y->name);
        CHECK_EQ(x->type, y->type);
        switch (x->type) {
        case DP_WIRE_BOOL:
            CHECK_EQ(x->v.b, y->v.b);
            break;
        case DP_WIRE_U64:
            CHECK_EQ_U64(x->v.u, y->v.u);
            break;
        case DP_WIRE_I64:
            CHECK_EQ(x->v.i, y->v.i);
            break;
        case DP_WIRE_F64:
            CHECK(x->v.f == y->v.f);
            break;
        case DP_WIRE_STR:
            CHECK_SV(x->v.s, y->v.s);
            break;
        default:
            break;
        }
    }
}

static void
check_req_eq(const dp_wire_request *a, const dp_wire_request *b)
{
    CHECK_EQ(a->op, b->op);
    CHECK_SV(a->rid, b->rid);
    switch (a->op) {
    case DP_WIRE_OP_ALLOC:
        CHECK_SV(a->a.alloc.blob_id, b->a.alloc.blob_id);
        CHECK_EQ_U64(a->a.alloc.nbytes, b->a.alloc.nbytes);
        CHECK_EQ_U64(a->a.alloc.n_entries, b->a.alloc.n_entries);
        CHECK_EQ(a->a.alloc.spill, b->a.alloc.spill);
        break;
    case DP_WIRE_OP_COMMIT:
        CHECK_SV(a->a.commit.blob_id, b->a.commit.blob_id);
        break;
    case DP_WIRE_OP_ABORT:
        CHECK_SV(a->a.abort.blob_id, b->a.abort.blob_id);
        CHECK_EQ(a->a.abort.in_flight, b->a.abort.in_flight);
        break;
    case DP_WIRE_OP_RESOLVE:
        check_strs(a->a.resolve.blob_ids, b->a.resolve.blob_ids);
        break;
    case DP_WIRE_OP_RESOLVE_KEYS:
        check_strs(a->a.resolve_keys.keys, b->a.resolve_keys.keys);
        break;
    case DP_WIRE_OP_UNPIN:
        CHECK_SV(a->a.unpin.pin_id, b->a.unpin.pin_id);
        break;
    case DP_WIRE_OP_RELEASE_ROWS:
        CHECK_EQ(a->a.release_rows.gidxs.n, b->a.release_rows.gidxs.n);
        for (uint32_t i = 0; i < a->a.release_rows.gidxs.n; i++)
            CHECK_EQ_U64(a->a.release_rows.gidxs.v[i], b->a.release_rows.gidxs.v[i]);
        break;
    case DP_WIRE_OP_READ_BYTES:
        CHECK_EQ_U64(a->a.read_bytes.off, b->a.read_bytes.off);
        CHECK_EQ_U64(a->a.read_bytes.nbytes, b->a.read_bytes.nbytes);
        break;
    case DP_WIRE_OP_SAVE_SHARD:
        CHECK_SV(a->a.save_shard.path, b->a.save_shard.path);
        break;
    case DP_WIRE_OP_LOAD_SHARD:
        CHECK_SV(a->a.load_shard.path, b->a.load_shard.path);
        check_shard(a->a.load_shard.blobs, b->a.load_shard.blobs);
        CHECK_EQ(a->a.load_shard.spill, b->a.load_shard.spill);
        break;
    default:
        break;
    }
}

static void
check_rep_eq(const dp_wire_reply *a, const dp_wire_reply *b)
{
    CHECK_EQ(a->op, b->op);
    CHECK_SV(a->rid, b->rid);
    CHECK_EQ(a->ok, b->ok);
    if (!a->ok) {
        CHECK_EQ(a->err.code, b->err.code);
        CHECK_STR(dp__wire_err_kind(a->err.code), dp__wire_err_kind(b->err.code));
        CHECK(dp__wire_str_eq(b->err.kind, dp__wire_err_kind(a->err.code)));
        CHECK_SV(a->err.msg, b->err.msg);
        CHECK_SV(a->err.reason, b->err.reason);
        check_strs(a->err.blobs, b->err.blobs);
        return;
    }
    switch (a->op) {
    case DP_WIRE_OP_PING:
        CHECK_EQ_U64(a->r.unit_id, b->r.unit_id);
        break;
    case DP_WIRE_OP_INFO: {
        const dp_wire_info *x = &a->r.info, *y = &b->r.info;
        CHECK_EQ_U64(x->unit_id, y->unit_id);
        CHECK_EQ_U64(x->n_units, y->n_units);
        CHECK_SV(x->zmq, y->zmq);
        CHECK_SV(x->agent, y->agent);
        CHECK_EQ(x->metadata.n, y->metadata.n);
        CHECK(x->metadata.n == 0 ||
              memcmp(x->metadata.p, y->metadata.p, x->metadata.n) == 0);
        CHECK_EQ_U64(x->slab_bytes, y->slab_bytes);
        CHECK_EQ_U64(x->io_bytes, y->io_bytes);
        CHECK_SV(x->numa, y->numa);
        CHECK_EQ_U64(x->slab_addr, y->slab_addr);
        CHECK_EQ_U64(x->read_pin_ms, y->read_pin_ms);
        break;
    }
    case DP_WIRE_OP_ALLOC:
        CHECK_EQ_U64(a->r.alloc.off, b->r.alloc.off);
        CHECK_EQ_U64(a->r.alloc.token, b->r.alloc.token);
        break;
    case DP_WIRE_OP_COMMIT:
        CHECK_EQ(a->r.commit, b->r.commit);
        break;
    case DP_WIRE_OP_RESOLVE: {
        const dp_wire_resolve_res *x = &a->r.resolve, *y = &b->r.resolve;
        CHECK_SV(x->pin_id, y->pin_id);
        CHECK_EQ(x->blobs.n, y->blobs.n);
        for (uint32_t i = 0; i < x->blobs.n; i++) {
            CHECK_SV(x->blobs.v[i].id, y->blobs.v[i].id);
            CHECK_EQ_U64(x->blobs.v[i].off, y->blobs.v[i].off);
            CHECK_EQ_U64(x->blobs.v[i].len, y->blobs.v[i].len);
        }
        check_strs(x->missing, y->missing);
        check_strs(x->pending, y->pending);
        check_strs(x->failed, y->failed);
        break;
    }
    case DP_WIRE_OP_RESOLVE_KEYS: {
        const dp_wire_resolve_keys_res *x = &a->r.resolve_keys, *y = &b->r.resolve_keys;
        CHECK_SV(x->pin_id, y->pin_id);
        CHECK_EQ(x->entries.n, y->entries.n);
        for (uint32_t i = 0; i < x->entries.n; i++) {
            const dp_wire_key_loc *e = &x->entries.v[i], *f = &y->entries.v[i];
            CHECK_SV(e->key, f->key);
            CHECK_EQ_U64(e->off, f->off);
            CHECK_EQ_U64(e->len, f->len);
            CHECK_SV(e->kind, f->kind);
            CHECK_SV(e->dtype, f->dtype);
            CHECK_EQ(e->ndim, f->ndim);
            for (uint32_t j = 0; j < e->ndim; j++)
                CHECK_EQ_U64(e->shape[j], f->shape[j]);
        }
        check_strs(x->missing, y->missing);
        check_strs(x->pending, y->pending);
        check_strs(x->failed, y->failed);
        break;
    }
    case DP_WIRE_OP_RELEASE_ROWS:
        CHECK_EQ_U64(a->r.dropped, b->r.dropped);
        break;
    case DP_WIRE_OP_SCAN:
        CHECK_EQ(a->r.scan.n, b->r.scan.n);
        for (uint32_t i = 0; i < a->r.scan.n; i++)
            check_fields(&a->r.scan.recs[i], &b->r.scan.recs[i]);
        break;
    case DP_WIRE_OP_STATS:
        check_fields(&a->r.stats, &b->r.stats);
        break;
    case DP_WIRE_OP_READ_BYTES:
        CHECK_EQ(a->r.bytes.n, b->r.bytes.n);
        CHECK(a->r.bytes.n == 0 || memcmp(a->r.bytes.p, b->r.bytes.p, a->r.bytes.n) == 0);
        break;
    case DP_WIRE_OP_SAVE_SHARD:
        check_shard(a->r.save_shard.blobs, b->r.save_shard.blobs);
        CHECK_EQ_U64(a->r.save_shard.nbytes, b->r.save_shard.nbytes);
        CHECK_EQ_U64(a->r.save_shard.clears_during_save,
                     b->r.save_shard.clears_during_save);
        break;
    case DP_WIRE_OP_LOAD_SHARD:
        check_strs(a->r.load_shard.loaded, b->r.load_shard.loaded);
        check_strs(a->r.load_shard.failed, b->r.load_shard.failed);
        break;
    default:
        CHECK(!"no result");
    }
}

/* ---- round trips ---- */

static void
round_trip_request(gen *g, dp_wire_op op, dp_buf *out)
{
    dp_wire_request q = {.op = op, .rid = gid(g)};
    gargs(g, &q);
    dp_detail d;
    dp__buf_reset(out);
    CHECK_OK_D(dp__wire_request_encode(&q, NULL, out, &d), &d);
    dp_wire_request r;
    CHECK_OK_D(dp__wire_request_decode(out->data, out->len, NULL, &r, &d), &d);
    check_req_eq(&q, &r);
    dp_wire_op pop;
    dp_wire_str prid;
    CHECK_OK(dp__wire_request_peek(out->data, out->len, NULL, &pop, &prid, &d));
    CHECK_EQ(pop, op);
    CHECK_SV(prid, q.rid);
    dp__wire_request_fini(&r);
    CHECK_EQ(r.op, DP_WIRE_OP_NONE);
}

static void
round_trip_reply(gen *g, dp_wire_op op, bool error, dp_buf *out)
{
    dp_wire_reply a = {.op = op, .rid = gid(g), .ok = true};
    if (error)
        gerror(g, &a);
    else
        gresult(g, &a);
    dp_detail d;
    dp__buf_reset(out);
    CHECK_OK_D(dp__wire_reply_encode(&a, NULL, out, &d), &d);
    dp_wire_reply b;
    CHECK_OK_D(dp__wire_reply_decode(out->data, out->len, op, NULL, &b, &d), &d);
    check_rep_eq(&a, &b);
    dp_wire_str prid;
    CHECK_OK(dp__wire_reply_peek(out->data, out->len, NULL, &prid, &d));
    CHECK_SV(prid, a.rid);
    dp__wire_reply_fini(&b);
}

DP_TEST(every_op_round_trips)
{
    gen *g = calloc(1, sizeof *g);
    g->st = 12345;
    dp_buf b;
    dp__buf_init(&b);
    for (int op = 0; op < DP_WIRE_OP_COUNT_; op++) {
        for (int i = 0; i < 50; i++) {
            round_trip_request(g, (dp_wire_op)op, &b);
            if (!dp__wire_op_is_notify((dp_wire_op)op)) {
                round_trip_reply(g, (dp_wire_op)op, false, &b);
                round_trip_reply(g, (dp_wire_op)op, true, &b);
            }
            gfree(g);
        }
    }
    dp__buf_fini(&b);
    free(g);
}

DP_TEST(random_structs_round_trip)
{
    gen *g = calloc(1, sizeof *g);
    g->st = dp_test_seed();
    dp_buf b;
    dp__buf_init(&b);
    for (int i = 0; i < 3000; i++) {
        dp_wire_op op = (dp_wire_op)rnd(g, DP_WIRE_OP_COUNT_);
        round_trip_request(g, op, &b);
        if (!dp__wire_op_is_notify(op))
            round_trip_reply(g, op, rnd(g, 4) == 0, &b);
        gfree(g);
    }
    dp__buf_fini(&b);
    free(g);
}

/* ---- names, strings, validators, ids ---- */

DP_TEST(op_names_and_notify)
{
    static const char *const names[] = {
        "ping",    "info",         "alloc",      "commit",       "abort",
        "resolve", "resolve_keys", "unpin",      "release_rows", "scan",
        "stats",   "read_bytes",   "save_shard", "load_shard"};
    CHECK_EQ(DP_ARRAY_LEN(names), DP_WIRE_OP_COUNT_);
    for (int i = 0; i < DP_WIRE_OP_COUNT_; i++) {
        EXPECT_STR(dp__wire_op_name((dp_wire_op)i), names[i]);
        EXPECT_EQ(dp__wire_op_parse(dp__wire_s(names[i])), i);
        bool notify = strcmp(names[i], "unpin") == 0 || strcmp(names[i], "abort") == 0;
        EXPECT_EQ(dp__wire_op_is_notify((dp_wire_op)i), notify);
    }
    EXPECT_EQ(dp__wire_op_parse(dp__wire_s("Ping")), DP_WIRE_OP_NONE);
    EXPECT_EQ(dp__wire_op_parse(dp__wire_s("")), DP_WIRE_OP_NONE);
    EXPECT_EQ(dp__wire_op_parse((dp_wire_str){"pingx", 4}), DP_WIRE_OP_PING);
    EXPECT_STR(dp__wire_op_name(DP_WIRE_OP_NONE), "?");
    EXPECT_STR(dp__wire_op_name(DP_WIRE_OP_COUNT_), "?");
    EXPECT(!dp__wire_op_is_notify(DP_WIRE_OP_NONE));
    CHECK_STR(dp__wire_commit_state_name(DP_WIRE_COMMIT_PENDING), "pending");
}

DP_TEST(string_views_and_utf8)
{
    dp_wire_str s = dp__wire_s("abc");
    CHECK_EQ(s.n, 3);
    CHECK(dp__wire_str_eq(s, "abc"));
    CHECK(!dp__wire_str_eq(s, "ab"));
    CHECK(!dp__wire_str_eq(s, "abcd"));
    CHECK(dp__wire_s(NULL).n == 0 && dp__wire_s(NULL).p != NULL);
    CHECK(dp__wire_str_same((dp_wire_str){"abX", 2}, (dp_wire_str){"abY", 2}));
    char out[4];
    CHECK_EQ(dp__wire_str_copy((dp_wire_str){"hello", 5}, out, sizeof out), 5);
    CHECK_STR(out, "hel");
    CHECK_EQ(dp__wire_str_copy((dp_wire_str){"hi!", 2}, out, sizeof out), 2);
    CHECK_STR(out, "hi");
    char *z = dp__wire_str_dup((dp_wire_str){"key@x!", 5});
    CHECK_STR(z, "key@x");
    free(z);

    CHECK(dp__wire_utf8_valid("", 0));
    CHECK(dp__wire_utf8_valid("h\xc3\xa9llo \xe2\x82\xac \xf0\x9f\x98\x80", 15));
    CHECK(!dp__wire_utf8_valid("\xc0\x80", 2));         /* overlong NUL */
    CHECK(!dp__wire_utf8_valid("\xe0\x80\xaf", 3));     /* overlong '/' */
    CHECK(!dp__wire_utf8_valid("\xed\xa0\x80", 3));     /* surrogate */
    CHECK(!dp__wire_utf8_valid("\xf4\x90\x80\x80", 4)); /* > U+10FFFF */
    CHECK(!dp__wire_utf8_valid("\xe2\x82", 2));         /* cut short */
    CHECK(!dp__wire_utf8_valid("\x80", 1));             /* lone continuation */
    CHECK(!dp__wire_utf8_valid("\xff", 1));
    CHECK(dp__wire_utf8_valid("\xf4\x8f\xbf\xbf", 4)); /* U+10FFFF */
}

DP_TEST(validators_name_the_value)
{
    dp_detail d;
    CHECK_OK(dp__wire_check_id(dp__wire_s("blob-1_a.b:c"), NULL, "blob_id", &d));
    CHECK_ERR(dp__wire_check_id(dp__wire_s(""), NULL, "blob_id", &d), DP_EPROTO);
    CHECK_CONTAINS(d.msg, "blob_id: empty id");
    CHECK_ERR(dp__wire_check_id(dp__wire_s("../etc"), NULL, "blob_id", &d), DP_EPROTO);
    CHECK_CONTAINS(d.msg, "blob_id: byte 0x2f at 2");
    CHECK_ERR(dp__wire_check_id((dp_wire_str){"a\0b", 3}, NULL, "pin_id", &d), DP_EPROTO);
    CHECK_CONTAINS(d.msg, "pin_id: byte 0x00 at 1");
    CHECK_ERR(dp__wire_check_id(dp__wire_s("a b"), NULL, "x", &d), DP_EPROTO);
    CHECK_ERR(dp__wire_check_id(dp__wire_s("a\n"), NULL, "x", &d), DP_EPROTO);
    CHECK_ERR(dp__wire_check_id(dp__wire_s("\xc3\xa9"), NULL, "x", &d), DP_EPROTO);
    char id[66];
    memset(id, 'a', 65);
    id[65] = 0;
    CHECK_ERR(dp__wire_check_id(dp__wire_s(id), NULL, "blob_id", &d), DP_EPROTO);
    CHECK_CONTAINS(d.msg, "blob_id: id of 65 bytes is longer than the limit 64");
    id[64] = 0;
    CHECK_OK(dp__wire_check_id(dp__wire_s(id), NULL, "blob_id", &d));

    /* every byte against the charset [A-Za-z0-9_.:-] */
    for (int c = 0; c < 256; c++) {
        char one = (char)c;
        bool want = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                    (c >= '0' && c <= '9') || c == '_' || c == '.' || c == ':' ||
                    c == '-';
        int rc = dp__wire_check_id((dp_wire_str){&one, 1}, NULL, "x", &d);
        CHECKF((rc == DP_OK) == want, "byte 0x%02x", c);
    }

    char key[300];
    memset(key, 'f', sizeof key);
    memcpy(key, "12@", 3);
    CHECK_OK(dp__wire_check_key((dp_wire_str){key, 276}, NULL, "keys[0]", &d));
    CHECK_ERR(dp__wire_check_key((dp_wire_str){key, 277}, NULL, "keys[0]", &d),
              DP_EPROTO);
    CHECK_CONTAINS(d.msg, "keys[0]: key of 277 bytes is longer than the limit 276");
    CHECK_ERR(dp__wire_check_key((dp_wire_str){"1@a\0", 4}, NULL, "k", &d), DP_EPROTO);
    CHECK_CONTAINS(d.msg, "k: key has a NUL at byte 3");
    CHECK_ERR(dp__wire_check_key(dp__wire_s("1@\xff"), NULL, "k", &d), DP_EPROTO);
    CHECK_CONTAINS(d.msg, "k: key has invalid UTF-8 at byte 2");
    CHECK_ERR(dp__wire_check_key(dp__wire_s(""), NULL, "k", &d), DP_EPROTO);
    CHECK_OK(dp__wire_check_key(dp__wire_s("7@caf\xc3\xa9"), NULL, "k", &d));

    CHECK_OK(dp__wire_check_path(dp__wire_s("/tmp/shard 1"), NULL, "path", &d));
    CHECK_ERR(dp__wire_check_path(dp__wire_s(""), NULL, "path", &d), DP_EPROTO);
    CHECK_CONTAINS(d.msg, "path: empty path");
    CHECK_ERR(dp__wire_check_path((dp_wire_str){"/a\0b", 4}, NULL, "path", &d),
              DP_EPROTO);
    char *longp = malloc(PATH_MAX + 1);
    memset(longp, 'p', PATH_MAX);
    CHECK_OK(dp__wire_check_path((dp_wire_str){longp, PATH_MAX - 1}, NULL, "path", &d));
    CHECK_ERR(dp__wire_check_path((dp_wire_str){longp, PATH_MAX}, NULL, "path", &d),
              DP_EPROTO);
    CHECK_CONTAINS(d.msg, "path: path of");
    free(longp);

    CHECK_OK(dp__wire_check_text(dp__wire_s(""), NULL, "msg", &d));
    CHECK_OK(dp__wire_check_text(dp__wire_s("line\nline\t"), NULL, "msg", &d));
    dp_wire_limits lim;
    dp__wire_limits_init(&lim);
    lim.max_text = 3;
    CHECK_ERR(dp__wire_check_text(dp__wire_s("abcd"), &lim, "dtype", &d), DP_EPROTO);
    CHECK_CONTAINS(d.msg, "dtype: string of 4 bytes is longer than the limit 3");
}

DP_TEST(request_ids_are_unique_and_valid)
{
    dp_wire_rid_gen g1, g2;
    dp_detail d;
    CHECK_OK(dp__wire_rid_gen_init(&g1, &d));
    CHECK_OK(dp__wire_rid_gen_init(&g2, &d));
    CHECK(strcmp(g1.prefix, g2.prefix) != 0);
    char a[DP_WIRE_RID_MAX], b[DP_WIRE_RID_MAX];
    dp_wire_str s = dp__wire_rid_next(&g1, a);
    CHECK_EQ(s.n, strlen(a));
    CHECK_EQ(a[16], '-');
    CHECK_STR(a + 17, "0");
    for (int i = 1; i < 2000; i++) {
        dp_wire_str t = dp__wire_rid_next(&g1, b);
        CHECK_OK(dp__wire_check_id(t, NULL, "rid", &d));
        CHECK(!dp__wire_str_same(s, t));
        if (i == 255)
            CHECK_STR(b + 17, "ff");
    }
    g1.next = UINT64_MAX;
    s = dp__wire_rid_next(&g1, a);
    CHECK_EQ(s.n, 33);
    CHECK_STR(a + 17, "ffffffffffffffff");
    CHECK(s.n < DP_WIRE_RID_MAX);
    CHECK_OK(dp__wire_check_id(s, NULL, "rid", &d));
}

/* ---- hand-built messages for the rejection cases ---- */

typedef struct mb {
    dp_buf b;
    dp_mp_writer w;
} mb;

static void
mb_init(mb *m)
{
    dp__buf_init(&m->b);
    dp__mp_writer_init(&m->w, &m->b);
}

/* [op, rid, {...}] header: the caller writes nargs key/value pairs. */
static void
mb_req(mb *m, const char *op, const char *rid, uint32_t nargs)
{
    mb_init(m);
    dp__mp_put_array(&m->w, 3);
    dp__mp_put_str(&m->w, op);
    dp__mp_put_str(&m->w, rid);
    dp__mp_put_map(&m->w, nargs);
}

static int
mb_decode(mb *m, dp_wire_request *q, const dp_wire_limits *lim, dp_detail *d)
{
    dp_detail_clear(d);
    int rc = dp__wire_request_decode(m->b.data, m->b.len, lim, q, d);
    return rc;
}

/* Decode must fail with code and a detail containing each of the needles. */
static void
expect_req_fail(mb *m, const dp_wire_limits *lim, int code, const char *n1,
                const char *n2)
{
    dp_wire_request q;
    dp_detail d;
    int rc = mb_decode(m, &q, lim, &d);
    CHECKF(rc == code, "got %s want %s (%s): %s", dp_errname(rc), dp_errname(code),
           n1 ? n1 : "", d.msg);
    if (n1)
        CHECK_CONTAINS(d.msg, n1);
    if (n2)
        CHECK_CONTAINS(d.msg, n2);
    dp__wire_request_fini(&q);
    dp__buf_fini(&m->b);
}

/* A valid value for each arg, by name. */
static void
put_good(dp_mp_writer *w, const char *name, const char *op)
{
    if (!strcmp(name, "blob_id") || !strcmp(name, "pin_id")) {
        dp__mp_put_str(w, "b1");
    } else if (!strcmp(name, "nbytes")) {
        dp__mp_put_u64(w, 4096);
    } else if (!strcmp(name, "n_entries") || !strcmp(name, "off")) {
        dp__mp_put_u64(w, 3);
    } else if (!strcmp(name, "spill") || !strcmp(name, "in_flight")) {
        dp__mp_put_bool(w, false);
    } else if (!strcmp(name, "blob_ids")) {
        dp__mp_put_array(w, 2);
        dp__mp_put_str(w, "a");
        dp__mp_put_str(w, "b");
    } else if (!strcmp(name, "keys")) {
        dp__mp_put_array(w, 1);
        dp__mp_put_str(w, "1@x");
    } else if (!strcmp(name, "gidxs")) {
        dp__mp_put_array(w, 2);
        dp__mp_put_u64(w, 1);
        dp__mp_put_u64(w, UINT64_MAX);
    } else if (!strcmp(name, "path")) {
        dp__mp_put_str(w, "/tmp/shard");
    } else if (!strcmp(name, "blobs")) {
        dp__mp_put_map(w, 1);
        dp__mp_put_str(w, "b1");
        dp__mp_put_array(w, 3);
        dp__mp_put_u64(w, 0);
        dp__mp_put_u64(w, 10);
        dp__mp_put_u64(w, 1);
    } else {
        fprintf(stderr, "no value for %s of %s\n", name, op);
        CHECK(!"unknown arg");
    }
}

static const struct {
    const char *op;
    const char *args[4];
    bool required[4];
} arg_specs[] = {
    {"ping", {NULL}, {0}},
    {"info", {NULL}, {0}},
    {"scan", {NULL}, {0}},
    {"stats", {NULL}, {0}},
    {"alloc", {"blob_id", "nbytes", "n_entries", "spill"}, {1, 1, 1, 0}},
    {"commit", {"blob_id"}, {1}},
    {"abort", {"blob_id", "in_flight"}, {1, 0}},
    {"resolve", {"blob_ids"}, {1}},
    {"resolve_keys", {"keys"}, {1}},
    {"unpin", {"pin_id"}, {1}},
    {"release_rows", {"gidxs"}, {1}},
    {"read_bytes", {"off", "nbytes"}, {1, 1}},
    {"save_shard", {"path"}, {1}},
    {"load_shard", {"path", "blobs", "spill"}, {1, 1, 0}},
};

static uint32_t
spec_nargs(size_t s)
{
    uint32_t n = 0;
    while (n < 4 && arg_specs[s].args[n] != NULL)
        n++;
    return n;
}

/*
 * Build the args of spec s: skip index `skip`, write a wrong-typed value at
 * `bad` (wrong: a float, which no arg accepts; or nil), add an unknown key or
 * a duplicate of index `dup`.
 */
static void
build_args(mb *m, size_t s, int skip, int bad, bool bad_nil, bool unknown, int dup)
{
    uint32_t n = spec_nargs(s);
    uint32_t count = n - (skip >= 0) + unknown + (dup >= 0);
    mb_req(m, arg_specs[s].op, "rid-1", count);
    for (uint32_t i = 0; i < n; i++) {
        if ((int)i == skip)
            continue;
        dp__mp_put_str(&m->w, arg_specs[s].args[i]);
        if ((int)i == bad) {
            if (bad_nil)
                dp__mp_put_nil(&m->w);
            else
                dp__mp_put_double(&m->w, 1.5);
        } else {
            put_good(&m->w, arg_specs[s].args[i], arg_specs[s].op);
        }
    }
    if (unknown) {
        dp__mp_put_str(&m->w, "bogus\x01key");
        dp__mp_put_u64(&m->w, 1);
    }
    if (dup >= 0) {
        dp__mp_put_str(&m->w, arg_specs[s].args[dup]);
        put_good(&m->w, arg_specs[s].args[dup], arg_specs[s].op);
    }
}

DP_TEST(args_rules_for_every_field)
{
    char want[128];
    for (size_t s = 0; s < DP_ARRAY_LEN(arg_specs); s++) {
        const char *op = arg_specs[s].op;
        uint32_t n = spec_nargs(s);
        mb m;
        /* all good */
        build_args(&m, s, -1, -1, false, false, -1);
        dp_wire_request q;
        dp_detail d;
        CHECK_OK_D(mb_decode(&m, &q, NULL, &d), &d);
        CHECK_STR(dp__wire_op_name(q.op), op);
        CHECK(dp__wire_str_eq(q.rid, "rid-1"));
        dp__wire_request_fini(&q);
        dp__buf_fini(&m.b);
        /* unknown key */
        build_args(&m, s, -1, -1, false, true, -1);
        snprintf(want, sizeof want, "%s args: unknown key 'bogus?key'", op);
        expect_req_fail(&m, NULL, DP_EPROTO, want, NULL);
        for (uint32_t i = 0; i < n; i++) {
            const char *arg = arg_specs[s].args[i];
            /* wrong types */
            build_args(&m, s, -1, (int)i, false, false, -1);
            snprintf(want, sizeof want, "%s args: %s: expected", op, arg);
            expect_req_fail(&m, NULL, DP_EPROTO, want, "got float");
            build_args(&m, s, -1, (int)i, true, false, -1);
            expect_req_fail(&m, NULL, DP_EPROTO, want, "got nil");
            /* duplicate */
            build_args(&m, s, -1, -1, false, false, (int)i);
            snprintf(want, sizeof want, "%s args: duplicate key '%s'", op, arg);
            expect_req_fail(&m, NULL, DP_EPROTO, want, NULL);
            /* missing */
            build_args(&m, s, (int)i, -1, false, false, -1);
            if (arg_specs[s].required[i]) {
                snprintf(want, sizeof want, "%s args: missing key '%s'", op, arg);
                expect_req_fail(&m, NULL, DP_EPROTO, want, NULL);
            } else {
                CHECK_OK_D(mb_decode(&m, &q, NULL, &d), &d);
                dp__wire_request_fini(&q);
                dp__buf_fini(&m.b);
            }
        }
    }
}

DP_TEST(optional_args_get_their_defaults)
{
    mb m;
    dp_wire_request q;
    dp_detail d;
    mb_req(&m, "alloc", "r", 3);
    dp__mp_put_str(&m.w, "blob_id");
    dp__mp_put_str(&m.w, "b");
    dp__mp_put_str(&m.w, "n_entries");
    dp__mp_put_u64(&m.w, 0);
    dp__mp_put_str(&m.w, "nbytes");
    dp__mp_put_u64(&m.w, 1);
    CHECK_OK_D(mb_decode(&m, &q, NULL, &d), &d);
    CHECK(q.a.alloc.spill);
    CHECK_EQ(q.a.alloc.nbytes, 1);
    dp__wire_request_fini(&q);
    dp__buf_fini(&m.b);

    mb_req(&m, "abort", "r", 1);
    dp__mp_put_str(&m.w, "blob_id");
    dp__mp_put_str(&m.w, "b");
    CHECK_OK_D(mb_decode(&m, &q, NULL, &d), &d);
    CHECK(q.a.abort.in_flight);
    dp__wire_request_fini(&q);
    dp__buf_fini(&m.b);

    mb_req(&m, "load_shard", "r", 2);
    dp__mp_put_str(&m.w, "blobs");
    dp__mp_put_map(&m.w, 0);
    dp__mp_put_str(&m.w, "path");
    dp__mp_put_str(&m.w, "p");
    CHECK_OK_D(mb_decode(&m, &q, NULL, &d), &d);
    CHECK(!q.a.load_shard.spill);
    CHECK_EQ(q.a.load_shard.blobs.n, 0);
    dp__wire_request_fini(&q);
    dp__buf_fini(&m.b);
}

/* One-arg request with a value written by fn. */
#define ONE_ARG(m, op, key, body)                                                        \
    do {                                                                                 \
        mb_req((m), (op), "r1", 1);                                                      \
        dp__mp_put_str(&(m)->w, (key));                                                  \
        dp_mp_writer *w = &(m)->w;                                                       \
        body;                                                                            \
    } while (0)

static void
alloc_msg(mb *m, const char *id, uint64_t nbytes, uint64_t n_entries)
{
    mb_req(m, "alloc", "r1", 3);
    dp__mp_put_str(&m->w, "blob_id");
    dp__mp_put_strn(&m->w, id, strlen(id));
    dp__mp_put_str(&m->w, "nbytes");
    dp__mp_put_u64(&m->w, nbytes);
    dp__mp_put_str(&m->w, "n_entries");
    dp__mp_put_u64(&m->w, n_entries);
}

DP_TEST(args_ranges_and_limits)
{
    mb m;
    alloc_msg(&m, "b", 0, 1);
    expect_req_fail(&m, NULL, DP_EPROTO, "alloc args: nbytes: 0 is below the minimum 1",
                    NULL);
    alloc_msg(&m, "b", 1ull << 62, 1);
    expect_req_fail(&m, NULL, DP_ETOOBIG, "alloc args: nbytes: 4611686018427387904",
                    "limit 4611686018427387903");
    alloc_msg(&m, "b", (1ull << 62) - 1, 1u << 20);
    dp_wire_request q;
    dp_detail d;
    CHECK_OK_D(mb_decode(&m, &q, NULL, &d), &d);
    dp__wire_request_fini(&q);
    dp__buf_fini(&m.b);
    alloc_msg(&m, "b", 1, (1u << 20) + 1);
    expect_req_fail(&m, NULL, DP_ETOOBIG, "alloc args: n_entries: 1048577 is above",
                    NULL);
    alloc_msg(&m, "a/b", 1, 1);
    expect_req_fail(&m, NULL, DP_EPROTO, "alloc args: blob_id: byte 0x2f", NULL);
    alloc_msg(&m, "", 1, 1);
    expect_req_fail(&m, NULL, DP_EPROTO, "alloc args: blob_id: empty id", NULL);

    /* negative integer for a u64 */
    mb_req(&m, "read_bytes", "r1", 2);
    dp__mp_put_str(&m.w, "off");
    dp__mp_put_i64(&m.w, -5);
    dp__mp_put_str(&m.w, "nbytes");
    dp__mp_put_u64(&m.w, 1);
    expect_req_fail(&m, NULL, DP_EPROTO, "read_bytes args: off: negative integer", NULL);
    mb_req(&m, "read_bytes", "r1", 2);
    dp__mp_put_str(&m.w, "off");
    dp__mp_put_u64(&m.w, 1ull << 62);
    dp__mp_put_str(&m.w, "nbytes");
    dp__mp_put_u64(&m.w, 1);
    expect_req_fail(&m, NULL, DP_EPROTO,
                    "read_bytes args: off: 4611686018427387904 is above", NULL);
    mb_req(&m, "read_bytes", "r1", 2);
    dp__mp_put_str(&m.w, "off");
    dp__mp_put_u64(&m.w, 0);
    dp__mp_put_str(&m.w, "nbytes");
    dp__mp_put_u64(&m.w, (16u << 20) + 1);
    expect_req_fail(&m, NULL, DP_ETOOBIG, "read_bytes args: nbytes: 16777217 is above",
                    "16777216");

    /* lists: element types and rules name the index */
    ONE_ARG(&m, "resolve_keys", "keys", {
        dp__mp_put_array(w, 3);
        dp__mp_put_str(w, "1@a");
        dp__mp_put_strn(w, "1@\0", 3);
        dp__mp_put_str(w, "1@b");
    });
    expect_req_fail(&m, NULL, DP_EPROTO, "resolve_keys args: keys[1]: key has a NUL",
                    NULL);
    ONE_ARG(&m, "resolve_keys", "keys", {
        dp__mp_put_array(w, 2);
        dp__mp_put_str(w, "1@a");
        dp__mp_put_u64(w, 7);
    });
    expect_req_fail(&m, NULL, DP_EPROTO, "resolve_keys args: keys[1]: expected str",
                    NULL);
    ONE_ARG(&m, "resolve_keys", "keys", {
        char k[300];
        memset(k, 'x', sizeof k);
        dp__mp_put_array(w, 1);
        dp__mp_put_strn(w, k, 277);
    });
    expect_req_fail(&m, NULL, DP_EPROTO, "keys[0]: key of 277 bytes", "limit 276");
    ONE_ARG(&m, "resolve_keys", "keys", {
        dp__mp_put_array(w, 1);
        dp__mp_put_str(w, "1@\xc3");
    });
    expect_req_fail(&m, NULL, DP_EPROTO, "keys[0]: key has invalid UTF-8", NULL);
    ONE_ARG(&m, "resolve", "blob_ids", {
        dp__mp_put_array(w, 2);
        dp__mp_put_str(w, "ok");
        dp__mp_put_str(w, "no\x7f");
    });
    expect_req_fail(&m, NULL, DP_EPROTO, "resolve args: blob_ids[1]: byte 0x7f", NULL);
    ONE_ARG(&m, "release_rows", "gidxs", {
        dp__mp_put_array(w, 2);
        dp__mp_put_u64(w, 1);
        dp__mp_put_i64(w, -1);
    });
    expect_req_fail(&m, NULL, DP_EPROTO, "release_rows args: gidxs[1]: negative", NULL);
    ONE_ARG(&m, "release_rows", "gidxs", { dp__mp_put_str(w, "1,2"); });
    expect_req_fail(&m, NULL, DP_EPROTO, "gidxs: expected array", NULL);

    /* list lengths and the per-message item budget */
    dp_wire_limits lim;
    dp__wire_limits_init(&lim);
    lim.max_list = 4;
    ONE_ARG(&m, "release_rows", "gidxs", {
        dp__mp_put_array(w, 5);
        for (int i = 0; i < 5; i++)
            dp__mp_put_u64(w, (uint64_t)i);
    });
    expect_req_fail(
        &m, &lim, DP_ETOOBIG,
        "release_rows args: gidxs: list of 5 items is longer than the limit 4", NULL);
    lim.max_list = 100;
    lim.max_items = 3;
    ONE_ARG(&m, "resolve", "blob_ids", {
        dp__mp_put_array(w, 4);
        for (int i = 0; i < 4; i++)
            dp__mp_put_str(w, "b");
    });
    expect_req_fail(&m, &lim, DP_ETOOBIG, "blob_ids: more than 3 list items", NULL);

    /* paths */
    ONE_ARG(&m, "save_shard", "path", { dp__mp_put_strn(w, "/a\0b", 4); });
    expect_req_fail(&m, NULL, DP_EPROTO, "save_shard args: path: path has a NUL", NULL);
    ONE_ARG(&m, "save_shard", "path", { dp__mp_put_str(w, ""); });
    expect_req_fail(&m, NULL, DP_EPROTO, "save_shard args: path: empty path", NULL);
    ONE_ARG(&m, "save_shard", "path", {
        char *p = malloc(PATH_MAX);
        memset(p, 'p', PATH_MAX);
        dp__mp_put_strn(w, p, PATH_MAX);
        free(p);
    });
    expect_req_fail(&m, NULL, DP_EPROTO, "path: path of 4096 bytes is longer", NULL);

    /* load_shard blobs: tuple shape, ranges, ids */
    static const struct {
        const char *id;
        int n;
        uint64_t v[4];
        int code;
        const char *want;
    } sb[] = {
        {"b1", 2, {0, 1}, DP_EPROTO, "blobs: 'b1': array of 2 elements, expected 3"},
        {"b1", 4, {0, 1, 1, 1}, DP_EPROTO, "array of 4 elements, expected 3"},
        {"b1", 3, {1ull << 62, 1, 1}, DP_EPROTO, "blobs: 'b1': off: 4611686018427387904"},
        {"b1", 3, {0, 1ull << 62, 1}, DP_ETOOBIG, "blobs: 'b1': nbytes:"},
        {"b1", 3, {0, 1, 1ull << 62}, DP_EPROTO, "blobs: 'b1': refs:"},
        {"b/1", 3, {0, 1, 1}, DP_EPROTO, "load_shard args: blobs: key 0: byte 0x2f"},
    };
    for (size_t i = 0; i < DP_ARRAY_LEN(sb); i++) {
        mb_req(&m, "load_shard", "r1", 2);
        dp__mp_put_str(&m.w, "path");
        dp__mp_put_str(&m.w, "/p");
        dp__mp_put_str(&m.w, "blobs");
        dp__mp_put_map(&m.w, 1);
        dp__mp_put_str(&m.w, sb[i].id);
        dp__mp_put_array(&m.w, (uint32_t)sb[i].n);
        for (int j = 0; j < sb[i].n; j++)
            dp__mp_put_u64(&m.w, sb[i].v[j]);
        expect_req_fail(&m, NULL, sb[i].code, sb[i].want, NULL);
    }
    ONE_ARG(&m, "load_shard", "blobs", { dp__mp_put_array(w, 0); });
    expect_req_fail(&m, NULL, DP_EPROTO, "load_shard args: blobs: expected map", NULL);
}

DP_TEST(request_framing_rules)
{
    mb m;
    dp_wire_request q;
    dp_detail d;

    /* not an array: nothing readable, no rid */
    mb_init(&m);
    dp__mp_put_map(&m.w, 0);
    CHECK_ERR(mb_decode(&m, &q, NULL, &d), DP_EPROTO);
    CHECK_CONTAINS(d.msg, "request: expected array");
    CHECK_EQ(q.rid.n, 0);
    CHECK_EQ(q.op, DP_WIRE_OP_NONE);
    dp__wire_request_fini(&q);
    dp__buf_fini(&m.b);

    /* [op] only */
    mb_init(&m);
    dp__mp_put_array(&m.w, 1);
    dp__mp_put_str(&m.w, "ping");
    CHECK_ERR(mb_decode(&m, &q, NULL, &d), DP_EPROTO);
    CHECK_CONTAINS(d.msg, "array of 1 elements");
    CHECK_EQ(q.rid.n, 0);
    dp__wire_request_fini(&q);
    dp__buf_fini(&m.b);

    /* [op, rid]: rid readable, still an error */
    mb_init(&m);
    dp__mp_put_array(&m.w, 2);
    dp__mp_put_str(&m.w, "ping");
    dp__mp_put_str(&m.w, "r9");
    CHECK_ERR(mb_decode(&m, &q, NULL, &d), DP_EPROTO);
    CHECK(dp__wire_str_eq(q.rid, "r9"));
    CHECK_EQ(q.op, DP_WIRE_OP_PING);
    CHECK_CONTAINS(d.msg, "ping: request of 2 elements");
    dp__wire_request_fini(&q);
    dp__buf_fini(&m.b);

    /* four elements */
    mb_init(&m);
    dp__mp_put_array(&m.w, 4);
    dp__mp_put_str(&m.w, "ping");
    dp__mp_put_str(&m.w, "r9");
    dp__mp_put_map(&m.w, 0);
    dp__mp_put_nil(&m.w);
    expect_req_fail(&m, NULL, DP_EPROTO, "request of 4 elements", NULL);

    /* op not a string */
    mb_init(&m);
    dp__mp_put_array(&m.w, 3);
    dp__mp_put_u64(&m.w, 1);
    dp__mp_put_str(&m.w, "r9");
    dp__mp_put_map(&m.w, 0);
    expect_req_fail(&m, NULL, DP_EPROTO, "op: expected str, got uint", NULL);

    /* unknown op: rid still available for the error reply */
    mb_req(&m, "explode\xff", "r9", 0);
    CHECK_ERR(mb_decode(&m, &q, NULL, &d), DP_EPROTO);
    CHECK_CONTAINS(d.msg, "unknown op 'explode?'");
    CHECK(dp__wire_str_eq(q.rid, "r9"));
    CHECK_EQ(q.op, DP_WIRE_OP_NONE);
    dp_wire_op pop;
    dp_wire_str prid;
    CHECK_ERR(dp__wire_request_peek(m.b.data, m.b.len, NULL, &pop, &prid, &d), DP_EPROTO);
    CHECK(dp__wire_str_eq(prid, "r9"));
    CHECK_EQ(pop, DP_WIRE_OP_NONE);
    dp__wire_request_fini(&q);
    dp__buf_fini(&m.b);

    /* bad rid: unreadable, the request is dropped */
    mb_req(&m, "ping", "r/9", 0);
    CHECK_ERR(mb_decode(&m, &q, NULL, &d), DP_EPROTO);
    CHECK_CONTAINS(d.msg, "request_id: byte 0x2f");
    CHECK_EQ(q.rid.n, 0);
    dp__wire_request_fini(&q);
    dp__buf_fini(&m.b);
    mb_init(&m);
    dp__mp_put_array(&m.w, 3);
    dp__mp_put_str(&m.w, "ping");
    dp__mp_put_u64(&m.w, 9);
    dp__mp_put_map(&m.w, 0);
    expect_req_fail(&m, NULL, DP_EPROTO, "request_id: expected str", NULL);

    /* args not a map; the rid and op are known */
    mb_init(&m);
    dp__mp_put_array(&m.w, 3);
    dp__mp_put_str(&m.w, "commit");
    dp__mp_put_str(&m.w, "r9");
    dp__mp_put_nil(&m.w);
    CHECK_ERR(mb_decode(&m, &q, NULL, &d), DP_EPROTO);
    CHECK_CONTAINS(d.msg, "commit args: args: expected map, got nil");
    CHECK(dp__wire_str_eq(q.rid, "r9"));
    CHECK_EQ(q.op, DP_WIRE_OP_COMMIT);
    CHECK_OK(dp__wire_request_peek(m.b.data, m.b.len, NULL, &pop, &prid, &d));
    CHECK_EQ(pop, DP_WIRE_OP_COMMIT);
    dp__wire_request_fini(&q);
    dp__buf_fini(&m.b);

    /* non-string key in args */
    mb_req(&m, "commit", "r9", 1);
    dp__mp_put_u64(&m.w, 1);
    dp__mp_put_str(&m.w, "b");
    expect_req_fail(&m, NULL, DP_EPROTO, "commit args: map key: expected str", NULL);

    /* trailing bytes */
    mb_req(&m, "ping", "r9", 0);
    dp__mp_put_nil(&m.w);
    expect_req_fail(&m, NULL, DP_EPROTO, "ping: 1 trailing bytes", NULL);

    /* over the size limit: the rid is still known */
    dp_wire_limits lim;
    dp__wire_limits_init(&lim);
    lim.max_msg = 16;
    ONE_ARG(&m, "save_shard", "path", { dp__mp_put_str(w, "/a/long/enough/path"); });
    CHECK_ERR(mb_decode(&m, &q, &lim, &d), DP_ETOOBIG);
    CHECK_CONTAINS(d.msg, "over the limit 16");
    CHECK(dp__wire_str_eq(q.rid, "r1"));
    dp__wire_request_fini(&q);
    dp__buf_fini(&m.b);

    /* empty and NULL input */
    CHECK_ERR(dp__wire_request_decode(NULL, 0, NULL, &q, &d), DP_EPROTO);
    dp__wire_request_fini(&q);
    dp__wire_request_fini(NULL);
}

DP_TEST(encoders_check_op_and_size)
{
    dp_buf b;
    dp__buf_init(&b);
    dp__buf_append(&b, "xyz", 3);
    dp_detail d;
    dp_wire_request q = {.op = DP_WIRE_OP_COUNT_, .rid = dp__wire_s("r")};
    CHECK_ERR(dp__wire_request_encode(&q, NULL, &b, &d), DP_EINVAL);
    q.op = DP_WIRE_OP_NONE;
    CHECK_ERR(dp__wire_request_encode(&q, NULL, &b, &d), DP_EINVAL);
    dp_wire_reply r = {.op = DP_WIRE_OP_UNPIN, .rid = dp__wire_s("r"), .ok = true};
    CHECK_ERR(dp__wire_reply_encode(&r, NULL, &b, &d), DP_EINVAL);
    CHECK_CONTAINS(d.msg, "unpin has no reply");
    dp_wire_reply rr;
    CHECK_ERR(dp__wire_reply_decode("x", 1, DP_WIRE_OP_ABORT, NULL, &rr, &d), DP_EINVAL);
    dp__wire_reply_fini(&rr);

    /* too big: nothing appended; the earlier bytes stay */
    dp_wire_limits lim;
    dp__wire_limits_init(&lim);
    lim.max_msg = 20;
    q.op = DP_WIRE_OP_SAVE_SHARD;
    q.a.save_shard.path = dp__wire_s("/some/path/that/is/long");
    CHECK_ERR(dp__wire_request_encode(&q, &lim, &b, &d), DP_ETOOBIG);
    CHECK_CONTAINS(d.msg, "save_shard: message of");
    CHECK_EQ(b.len, 3);
    r.op = DP_WIRE_OP_READ_BYTES;
    r.r.bytes = (dp_wire_bytes){(const uint8_t *)"0123456789012345678901234", 25};
    CHECK_ERR(dp__wire_reply_encode(&r, &lim, &b, &d), DP_ETOOBIG);
    CHECK_EQ(b.len, 3);
    /* appends after existing bytes */
    q.a.save_shard.path = dp__wire_s("/p");
    CHECK_OK(dp__wire_request_encode(&q, NULL, &b, &d));
    dp_wire_request x;
    CHECK_OK(dp__wire_request_decode(b.data + 3, b.len - 3, NULL, &x, &d));
    CHECK(dp__wire_str_eq(x.a.save_shard.path, "/p"));
    dp__wire_request_fini(&x);
    /* a buffer already out of memory */
    b.oom = true;
    CHECK_ERR(dp__wire_request_encode(&q, NULL, &b, &d), DP_ENOMEM);
    dp__buf_fini(&b);
}

/* ---- replies and errors ---- */

static void
reply_head(mb *m, const char *rid, bool ok)
{
    mb_init(m);
    dp__mp_put_array(&m->w, 3);
    dp__mp_put_str(&m->w, rid);
    dp__mp_put_bool(&m->w, ok);
}

static void
expect_rep(mb *m, dp_wire_op op, int code, const char *n1, const char *n2)
{
    dp_wire_reply r;
    dp_detail d;
    dp_detail_clear(&d);
    int rc = dp__wire_reply_decode(m->b.data, m->b.len, op, NULL, &r, &d);
    CHECKF(rc == code, "got %s want %s: %s", dp_errname(rc), dp_errname(code), d.msg);
    if (n1)
        CHECK_CONTAINS(d.msg, n1);
    if (n2)
        CHECK_CONTAINS(d.msg, n2);
    dp__wire_reply_fini(&r);
    dp__buf_fini(&m->b);
}

DP_TEST(error_kinds_round_trip)
{
    static const struct {
        int code;
        const char *kind;
        int back;
    } ks[] = {
        {DP_EUNITFULL, "UnitFull", DP_EUNITFULL}, {DP_EBUSY, "Busy", DP_EBUSY},
        {DP_ELOST, "Missing", DP_ELOST},          {DP_EPROTO, "Protocol", DP_EPROTO},
        {DP_ETOOBIG, "Protocol", DP_EPROTO},      {DP_EINVAL, "Protocol", DP_EPROTO},
        {DP_ESYS, "Protocol", DP_EPROTO},
    };
    dp_buf b;
    dp__buf_init(&b);
    for (size_t i = 0; i < DP_ARRAY_LEN(ks); i++) {
        CHECK_STR(dp__wire_err_kind(ks[i].code), ks[i].kind);
        CHECK_EQ(dp__wire_err_code(dp__wire_s(ks[i].kind)), ks[i].back);
        dp_wire_str blobs[] = {dp__wire_s("b1"), dp__wire_s("7@x")};
        dp_detail d;
        dp__buf_reset(&b);
        CHECK_OK(dp__wire_reply_encode_error(dp__wire_s("r1"), 0, ks[i].code, "it failed",
                                             i % 2 ? "pins" : NULL, blobs,
                                             (uint32_t)(i % 3), NULL, &b, &d));
        dp_wire_reply r;
        CHECK_OK_D(dp__wire_reply_decode(b.data, b.len, DP_WIRE_OP_ALLOC, NULL, &r, &d),
                   &d);
        CHECK(!r.ok);
        CHECK_EQ(r.err.code, ks[i].back);
        CHECK(dp__wire_str_eq(r.err.kind, ks[i].kind));
        CHECK(dp__wire_str_eq(r.err.msg, "it failed"));
        CHECK(dp__wire_str_eq(r.err.reason, i % 2 ? "pins" : ""));
        CHECK_EQ(r.err.blobs.n, i % 3);
        dp_detail e;
        CHECK_EQ(dp__wire_error_to_detail(&r.err, &e), ks[i].back);
        CHECK_EQ(e.code, ks[i].back);
        CHECK_CONTAINS(e.msg, ks[i].kind);
        CHECK_CONTAINS(e.msg, ": it failed");
        if (i % 2)
            CHECK_CONTAINS(e.msg, "(reason: pins)");
        if (i % 3 == 2)
            CHECK_CONTAINS(e.msg, "[blobs: b1, 7@x]");
        CHECK_EQ(dp__wire_error_to_detail(&r.err, NULL), ks[i].back);
        dp__wire_reply_fini(&r);
    }
    /* default message from the code */
    dp__buf_reset(&b);
    CHECK_OK(dp__wire_reply_encode_error(dp__wire_s("r1"), 0, DP_EBUSY, NULL, NULL, NULL,
                                         5, NULL, &b, NULL));
    dp_wire_reply r;
    CHECK_OK(dp__wire_reply_decode(b.data, b.len, DP_WIRE_OP_COMMIT, NULL, &r, NULL));
    CHECK(dp__wire_str_eq(r.err.msg, dp_strerror(DP_EBUSY)));
    CHECK_EQ(r.err.blobs.n, 0);
    dp__wire_reply_fini(&r);
    dp__buf_fini(&b);
}

DP_TEST(error_text_is_sanitised_and_bounded)
{
    dp_buf b;
    dp__buf_init(&b);
    dp_wire_limits lim;
    dp__wire_limits_init(&lim);
    lim.max_text = 10;
    /* NUL and invalid bytes become '?'; a multi-byte char is never cut */
    static const char msg[] = "a\0b\xff\xc3\xa9\xe2\x82\xac\xe2\x82\xac!";
    dp_wire_reply e = {.op = DP_WIRE_OP_INFO, .rid = dp__wire_s("r"), .ok = false};
    e.err.code = DP_EPROTO;
    e.err.msg = (dp_wire_str){msg, sizeof msg - 1};
    e.err.reason = dp__wire_s("\x01ok");
    CHECK_OK(dp__wire_reply_encode(&e, &lim, &b, NULL));
    dp_wire_reply r;
    dp_detail d;
    CHECK_OK_D(dp__wire_reply_decode(b.data, b.len, DP_WIRE_OP_INFO, &lim, &r, &d), &d);
    CHECKF(dp__wire_str_eq(r.err.msg, "a?b?\xc3\xa9\xe2\x82\xac"), "%.*s",
           DP_WIRE_STR_ARG(r.err.msg));
    CHECK(dp__wire_str_eq(r.err.reason, "\x01ok"));
    dp__wire_reply_fini(&r);
    /* a long detail is cut to max_text */
    char big[6000];
    memset(big, 'm', sizeof big - 1);
    big[sizeof big - 1] = 0;
    dp__buf_reset(&b);
    CHECK_OK(dp__wire_reply_encode_error(dp__wire_s("r"), 0, DP_EBUSY, big, big, NULL, 0,
                                         NULL, &b, NULL));
    CHECK_OK(dp__wire_reply_decode(b.data, b.len, DP_WIRE_OP_INFO, NULL, &r, &d));
    CHECK_EQ(r.err.msg.n, 4096);
    CHECK_EQ(r.err.reason.n, 4096);
    CHECK_EQ(dp__wire_error_to_detail(&r.err, &d), DP_EBUSY);
    CHECK(strlen(d.msg) < DP_DETAIL_MAX);
    dp__wire_reply_fini(&r);
    /* info's text fields are sanitised the same way */
    dp_wire_reply inf = {.op = DP_WIRE_OP_INFO, .rid = dp__wire_s("r"), .ok = true};
    inf.r.info.zmq = (dp_wire_str){"tcp\0x", 5};
    inf.r.info.agent = dp__wire_s("a");
    inf.r.info.numa = dp__wire_s("");
    dp__buf_reset(&b);
    CHECK_OK(dp__wire_reply_encode(&inf, NULL, &b, NULL));
    CHECK_OK(dp__wire_reply_decode(b.data, b.len, DP_WIRE_OP_INFO, NULL, &r, &d));
    CHECK(dp__wire_str_eq(r.r.info.zmq, "tcp?x"));
    CHECK_EQ(r.r.info.metadata.n, 0);
    dp__wire_reply_fini(&r);
    dp__buf_fini(&b);
}

DP_TEST(error_detail_lists_many_blobs_within_bounds)
{
    dp_wire_str v[200];
    char names[200][8];
    for (int i = 0; i < 200; i++) {
        snprintf(names[i], sizeof names[i], "b%d", i);
        v[i] = dp__wire_s(names[i]);
    }
    dp_wire_error e = {.code = DP_ELOST,
                       .kind = dp__wire_s("Missing"),
                       .msg = dp__wire_s("gone"),
                       .blobs = {v, 200}};
    dp_detail d;
    CHECK_EQ(dp__wire_error_to_detail(&e, &d), DP_ELOST);
    CHECK_CONTAINS(d.msg, "Missing: gone [blobs: b0, b1, b2");
    CHECK_CONTAINS(d.msg, "more");
    CHECK(strlen(d.msg) < DP_DETAIL_MAX);
    /* a zeroed error built by hand still reads well */
    dp_wire_error z = {.code = DP_EBUSY};
    CHECK_EQ(dp__wire_error_to_detail(&z, &d), DP_EBUSY);
    CHECK_STR(d.msg, "Busy: ");
}

DP_TEST(unknown_error_kind_is_protocol)
{
    mb m;
    reply_head(&m, "r1", false);
    dp__mp_put_map(&m.w, 3);
    dp__mp_put_str(&m.w, "kind");
    dp__mp_put_str(&m.w, "Overheated");
    dp__mp_put_str(&m.w, "msg");
    dp__mp_put_str(&m.w, "hot");
    dp__mp_put_str(&m.w, "extra"); /* unknown keys in an error are skipped */
    dp__mp_put_array(&m.w, 1);
    dp__mp_put_map(&m.w, 0);
    dp_wire_reply r;
    dp_detail d;
    CHECK_OK_D(dp__wire_reply_decode(m.b.data, m.b.len, DP_WIRE_OP_COMMIT, NULL, &r, &d),
               &d);
    CHECK_EQ(r.err.code, DP_EPROTO);
    CHECK(dp__wire_str_eq(r.err.kind, "Overheated"));
    CHECK_EQ(r.err.reason.n, 0);
    CHECK_EQ(dp__wire_error_to_detail(&r.err, &d), DP_EPROTO);
    CHECK_CONTAINS(d.msg, "Overheated: hot");
    dp__wire_reply_fini(&r);
    dp__buf_fini(&m.b);

    reply_head(&m, "r1", false);
    dp__mp_put_map(&m.w, 1);
    dp__mp_put_str(&m.w, "msg");
    dp__mp_put_str(&m.w, "x");
    expect_rep(&m, DP_WIRE_OP_COMMIT, DP_EPROTO,
               "commit reply: error: missing key 'kind'", NULL);
    reply_head(&m, "r1", false);
    dp__mp_put_map(&m.w, 3);
    dp__mp_put_str(&m.w, "kind");
    dp__mp_put_str(&m.w, "Busy");
    dp__mp_put_str(&m.w, "msg");
    dp__mp_put_str(&m.w, "x");
    dp__mp_put_str(&m.w, "blobs");
    dp__mp_put_str(&m.w, "b1");
    expect_rep(&m, DP_WIRE_OP_COMMIT, DP_EPROTO, "error: blobs: expected array", NULL);
    reply_head(&m, "r1", false);
    dp__mp_put_str(&m.w, "Busy");
    expect_rep(&m, DP_WIRE_OP_COMMIT, DP_EPROTO, "error: error: expected map", NULL);
}

DP_TEST(reply_rules)
{
    mb m;
    /* results of the wrong type name the op and the value */
    reply_head(&m, "r1", true);
    dp__mp_put_str(&m.w, "5");
    expect_rep(&m, DP_WIRE_OP_PING, DP_EPROTO, "ping reply: result: unit_id: expected",
               NULL);
    reply_head(&m, "r1", true);
    dp__mp_put_map(&m.w, 2);
    dp__mp_put_str(&m.w, "off");
    dp__mp_put_u64(&m.w, 1ull << 62);
    dp__mp_put_str(&m.w, "token");
    dp__mp_put_u64(&m.w, 1);
    expect_rep(&m, DP_WIRE_OP_ALLOC, DP_EPROTO, "alloc reply: result: off", "above");
    reply_head(&m, "r1", true);
    dp__mp_put_u64(&m.w, 4096); /* the offset alone: an older unit */
    expect_rep(&m, DP_WIRE_OP_ALLOC, DP_EPROTO, "alloc reply: result", NULL);
    /* The fourth element is the unit's incarnation; it must be a uint. */
    mb_init(&m);
    dp__mp_put_array(&m.w, 4);
    dp__mp_put_str(&m.w, "r1");
    dp__mp_put_bool(&m.w, true);
    dp__mp_put_u64(&m.w, 1);
    dp__mp_put_str(&m.w, "x");
    expect_rep(&m, DP_WIRE_OP_PING, DP_EPROTO, "incarnation", NULL);
    {
        mb_init(&m);
        dp__mp_put_array(&m.w, 4);
        dp__mp_put_str(&m.w, "r1");
        dp__mp_put_bool(&m.w, true);
        dp__mp_put_u64(&m.w, 1);
        dp__mp_put_u64(&m.w, 0xfeedfacecafebeefull);
        dp_wire_reply r4;
        CHECK_OK(
            dp__wire_reply_decode(m.b.data, m.b.len, DP_WIRE_OP_PING, NULL, &r4, NULL));
        CHECK_EQ_U64(r4.incarnation, 0xfeedfacecafebeefull);
        CHECK_EQ_U64(r4.r.unit_id, 1);
        dp__wire_reply_fini(&r4);
        dp__buf_fini(&m.b);
    }
    reply_head(&m, "r1", true);
    dp__mp_put_str(&m.w, "maybe");
    expect_rep(&m, DP_WIRE_OP_COMMIT, DP_EPROTO, "commit reply: result: state: 'maybe'",
               NULL);
    reply_head(&m, "r1", true);
    dp__mp_put_str(&m.w, "x");
    expect_rep(&m, DP_WIRE_OP_READ_BYTES, DP_EPROTO, "bytes: expected bin", NULL);
    reply_head(&m, "r1", true);
    dp__mp_put_i64(&m.w, -1);
    expect_rep(&m, DP_WIRE_OP_RELEASE_ROWS, DP_EPROTO, "dropped: negative", NULL);
    /* ok not a bool */
    mb_init(&m);
    dp__mp_put_array(&m.w, 3);
    dp__mp_put_str(&m.w, "r1");
    dp__mp_put_u64(&m.w, 1);
    dp__mp_put_u64(&m.w, 1);
    expect_rep(&m, DP_WIRE_OP_PING, DP_EPROTO, "ping reply: ok: expected bool", NULL);
    /* wrong element count; the rid is still read */
    mb_init(&m);
    dp__mp_put_array(&m.w, 2);
    dp__mp_put_str(&m.w, "r1");
    dp__mp_put_bool(&m.w, true);
    dp_wire_reply r;
    dp_detail d;
    CHECK_ERR(dp__wire_reply_decode(m.b.data, m.b.len, DP_WIRE_OP_PING, NULL, &r, &d),
              DP_EPROTO);
    CHECK_CONTAINS(d.msg, "array of 2 elements");
    CHECK(dp__wire_str_eq(r.rid, "r1"));
    dp__wire_reply_fini(&r);
    dp__buf_fini(&m.b);
    mb_init(&m);
    dp__mp_put_array(&m.w, 0);
    expect_rep(&m, DP_WIRE_OP_PING, DP_EPROTO, "reply: empty array", NULL);
    mb_init(&m);
    dp__mp_put_array(&m.w, 3);
    dp__mp_put_str(&m.w, "");
    dp__mp_put_bool(&m.w, true);
    dp__mp_put_u64(&m.w, 1);
    expect_rep(&m, DP_WIRE_OP_PING, DP_EPROTO, "request_id: empty id", NULL);
    /* trailing bytes */
    reply_head(&m, "r1", true);
    dp__mp_put_u64(&m.w, 1);
    dp__mp_put_u64(&m.w, 1);
    expect_rep(&m, DP_WIRE_OP_PING, DP_EPROTO, "ping reply: 1 trailing bytes", NULL);

    /* info: unknown keys skipped (forward compatible), required keys enforced */
    reply_head(&m, "r1", true);
    dp__mp_put_map(&m.w, 8);
    dp__mp_put_str(&m.w, "future");
    dp__mp_put_map(&m.w, 1);
    dp__mp_put_str(&m.w, "x");
    dp__mp_put_array(&m.w, 0);
    dp__mp_put_str(&m.w, "unit_id");
    dp__mp_put_u64(&m.w, 3);
    dp__mp_put_str(&m.w, "n_units");
    dp__mp_put_u64(&m.w, 4);
    dp__mp_put_str(&m.w, "zmq");
    dp__mp_put_str(&m.w, "tcp://127.0.0.1:5555");
    dp__mp_put_str(&m.w, "agent");
    dp__mp_put_str(&m.w, "unit-3");
    dp__mp_put_str(&m.w, "metadata");
    dp__mp_put_bin(&m.w, "\x00\x01\x02", 3);
    dp__mp_put_str(&m.w, "slab_bytes");
    dp__mp_put_u64(&m.w, 1 << 30);
    dp__mp_put_str(&m.w, "numa");
    dp__mp_put_nil(&m.w);
    expect_rep(&m, DP_WIRE_OP_INFO, DP_EPROTO, "info reply: result: numa: expected str",
               NULL);
    reply_head(&m, "r1", true);
    dp__mp_put_map(&m.w, 7);
    dp__mp_put_str(&m.w, "future");
    dp__mp_put_u64(&m.w, 1);
    dp__mp_put_str(&m.w, "unit_id");
    dp__mp_put_u64(&m.w, 3);
    dp__mp_put_str(&m.w, "n_units");
    dp__mp_put_u64(&m.w, 4);
    dp__mp_put_str(&m.w, "zmq");
    dp__mp_put_str(&m.w, "tcp://127.0.0.1:5555");
    dp__mp_put_str(&m.w, "agent");
    dp__mp_put_str(&m.w, "unit-3");
    dp__mp_put_str(&m.w, "metadata");
    dp__mp_put_bin(&m.w, "\x00\x01\x02", 3);
    dp__mp_put_str(&m.w, "slab_bytes");
    dp__mp_put_u64(&m.w, 1 << 30);
    CHECK_OK_D(dp__wire_reply_decode(m.b.data, m.b.len, DP_WIRE_OP_INFO, NULL, &r, &d),
               &d);
    CHECK_EQ(r.r.info.unit_id, 3);
    CHECK_EQ(r.r.info.n_units, 4);
    CHECK(dp__wire_str_eq(r.r.info.zmq, "tcp://127.0.0.1:5555"));
    CHECK_EQ(r.r.info.metadata.n, 3);
    CHECK_EQ(r.r.info.io_bytes, 0);
    CHECK_EQ(r.r.info.numa.n, 0);
    dp__wire_reply_fini(&r);
    dp__buf_fini(&m.b);
    reply_head(&m, "r1", true);
    dp__mp_put_map(&m.w, 1);
    dp__mp_put_str(&m.w, "unit_id");
    dp__mp_put_u64(&m.w, 3);
    expect_rep(&m, DP_WIRE_OP_INFO, DP_EPROTO,
               "info reply: result: missing key 'n_units'", NULL);
    reply_head(&m, "r1", true);
    dp__mp_put_map(&m.w, 2);
    dp__mp_put_str(&m.w, "unit_id");
    dp__mp_put_u64(&m.w, 3);
    dp__mp_put_str(&m.w, "unit_id");
    dp__mp_put_u64(&m.w, 3);
    expect_rep(&m, DP_WIRE_OP_INFO, DP_EPROTO, "duplicate key 'unit_id'", NULL);
}

/* resolve_keys reply with one entry whose tuple is written by the caller. */
#define RK_ENTRY(m, body)                                                                \
    do {                                                                                 \
        reply_head((m), "r1", true);                                                     \
        dp_mp_writer *w = &(m)->w;                                                       \
        dp__mp_put_map(w, 5);                                                            \
        dp__mp_put_str(w, "pin_id");                                                     \
        dp__mp_put_nil(w);                                                               \
        dp__mp_put_str(w, "missing");                                                    \
        dp__mp_put_array(w, 0);                                                          \
        dp__mp_put_str(w, "pending");                                                    \
        dp__mp_put_array(w, 0);                                                          \
        dp__mp_put_str(w, "failed");                                                     \
        dp__mp_put_array(w, 0);                                                          \
        dp__mp_put_str(w, "entries");                                                    \
        dp__mp_put_map(w, 1);                                                            \
        dp__mp_put_str(w, "5@obs");                                                      \
        body;                                                                            \
    } while (0)

static void
put_entry(dp_mp_writer *w, uint32_t n, uint64_t off, const char *kind, uint32_t ndim)
{
    dp__mp_put_array(w, n);
    dp__mp_put_u64(w, off);
    dp__mp_put_u64(w, 64);
    if (n < 3)
        return;
    dp__mp_put_str(w, kind);
    dp__mp_put_str(w, "float32");
    dp__mp_put_array(w, ndim);
    for (uint32_t i = 0; i < ndim; i++)
        dp__mp_put_u64(w, i + 1);
}

DP_TEST(resolve_results_rules)
{
    mb m;
    dp_wire_reply r;
    dp_detail d;
    RK_ENTRY(&m, put_entry(w, 5, 128, "tensor", 32));
    CHECK_OK_D(
        dp__wire_reply_decode(m.b.data, m.b.len, DP_WIRE_OP_RESOLVE_KEYS, NULL, &r, &d),
        &d);
    CHECK_EQ(r.r.resolve_keys.pin_id.n, 0);
    CHECK_EQ(r.r.resolve_keys.entries.n, 1);
    const dp_wire_key_loc *e = &r.r.resolve_keys.entries.v[0];
    CHECK(dp__wire_str_eq(e->key, "5@obs"));
    CHECK_EQ(e->off, 128);
    CHECK_EQ(e->ndim, 32);
    CHECK_EQ(e->shape[31], 32);
    dp__wire_reply_fini(&r);
    dp__buf_fini(&m.b);
    RK_ENTRY(&m, put_entry(w, 5, 128, "tensor", 33));
    expect_rep(
        &m, DP_WIRE_OP_RESOLVE_KEYS, DP_EPROTO,
        "resolve_keys reply: result: entries: '5@obs': shape: 33 dims, the limit is 32",
        NULL);
    dp_wire_limits lim;
    dp__wire_limits_init(&lim);
    lim.max_items = 1 + 10; /* the entry + 10 dims */
    RK_ENTRY(&m, put_entry(w, 5, 128, "tensor", 11));
    CHECK_ERR_D(
        dp__wire_reply_decode(m.b.data, m.b.len, DP_WIRE_OP_RESOLVE_KEYS, &lim, &r, &d),
        DP_ETOOBIG, &d);
    CHECK_CONTAINS(d.msg, "'5@obs': shape: more than 11 list items");
    dp__wire_reply_fini(&r);
    dp__buf_fini(&m.b);
    RK_ENTRY(&m, put_entry(w, 5, 128, "tensor", 10));
    CHECK_OK_D(
        dp__wire_reply_decode(m.b.data, m.b.len, DP_WIRE_OP_RESOLVE_KEYS, &lim, &r, &d),
        &d);
    dp__wire_reply_fini(&r);
    dp__buf_fini(&m.b);
    RK_ENTRY(&m, put_entry(w, 2, 128, "tensor", 0));
    expect_rep(&m, DP_WIRE_OP_RESOLVE_KEYS, DP_EPROTO,
               "entries: '5@obs': array of 2 elements, expected 5", NULL);
    RK_ENTRY(&m, put_entry(w, 5, 1ull << 62, "tensor", 0));
    expect_rep(&m, DP_WIRE_OP_RESOLVE_KEYS, DP_EPROTO, "entries: '5@obs': off:", NULL);
    RK_ENTRY(&m, put_entry(w, 5, 0, "ten\xffsor", 0));
    expect_rep(&m, DP_WIRE_OP_RESOLVE_KEYS, DP_EPROTO,
               "'5@obs': kind: string has invalid", NULL);
    RK_ENTRY(&m, {
        dp__mp_put_array(w, 5);
        dp__mp_put_u64(w, 0);
        dp__mp_put_u64(w, 0);
        dp__mp_put_str(w, "tensor");
        dp__mp_put_str(w, "int8");
        dp__mp_put_array(w, 1);
        dp__mp_put_i64(w, -3);
    });
    expect_rep(&m, DP_WIRE_OP_RESOLVE_KEYS, DP_EPROTO, "'5@obs': shape[0]: negative",
               NULL);

    /* resolve: pin_id wrong, blob locations wrong */
    reply_head(&m, "r1", true);
    dp__mp_put_map(&m.w, 1);
    dp__mp_put_str(&m.w, "pin_id");
    dp__mp_put_str(&m.w, "p/1");
    expect_rep(&m, DP_WIRE_OP_RESOLVE, DP_EPROTO,
               "resolve reply: result: pin_id: byte 0x2f", NULL);
    reply_head(&m, "r1", true);
    dp__mp_put_map(&m.w, 2);
    dp__mp_put_str(&m.w, "pin_id");
    dp__mp_put_str(&m.w, "p1");
    dp__mp_put_str(&m.w, "blobs");
    dp__mp_put_map(&m.w, 1);
    dp__mp_put_str(&m.w, "b1");
    dp__mp_put_array(&m.w, 3);
    dp__mp_put_u64(&m.w, 0);
    dp__mp_put_u64(&m.w, 0);
    dp__mp_put_u64(&m.w, 0);
    expect_rep(&m, DP_WIRE_OP_RESOLVE, DP_EPROTO, "blobs: 'b1': array of 3 elements",
               NULL);
    reply_head(&m, "r1", true);
    dp__mp_put_map(&m.w, 4);
    dp__mp_put_str(&m.w, "pin_id");
    dp__mp_put_str(&m.w, "p1");
    dp__mp_put_str(&m.w, "blobs");
    dp__mp_put_map(&m.w, 0);
    dp__mp_put_str(&m.w, "missing");
    dp__mp_put_array(&m.w, 0);
    dp__mp_put_str(&m.w, "pending");
    dp__mp_put_array(&m.w, 0);
    expect_rep(&m, DP_WIRE_OP_RESOLVE, DP_EPROTO, "missing key 'failed'", NULL);
}

DP_TEST(scan_and_stats_generic_records)
{
    mb m;
    reply_head(&m, "r1", true);
    dp__mp_put_array(&m.w, 2);
    dp__mp_put_map(&m.w, 8);
    dp__mp_put_str(&m.w, "id");
    dp__mp_put_str(&m.w, "b1");
    dp__mp_put_str(&m.w, "off");
    dp__mp_put_u64(&m.w, 4096);
    dp__mp_put_str(&m.w, "published");
    dp__mp_put_bool(&m.w, true);
    dp__mp_put_str(&m.w, "disk");
    dp__mp_put_nil(&m.w);
    dp__mp_put_str(&m.w, "age");
    dp__mp_put_double(&m.w, 1.25);
    dp__mp_put_str(&m.w, "delta");
    dp__mp_put_i64(&m.w, -7);
    dp__mp_put_str(&m.w, "pins"); /* nested: skipped */
    dp__mp_put_map(&m.w, 1);
    dp__mp_put_str(&m.w, "p");
    dp__mp_put_double(&m.w, 1.0);
    dp__mp_put_str(&m.w, "refs");
    dp__buf_append(&m.b, "\xd1\x00\x03", 3); /* 3 as an int16: a signed format */
    dp__mp_put_map(&m.w, 0);
    dp_wire_reply r;
    dp_detail d;
    CHECK_OK_D(dp__wire_reply_decode(m.b.data, m.b.len, DP_WIRE_OP_SCAN, NULL, &r, &d),
               &d);
    CHECK_EQ(r.r.scan.n, 2);
    const dp_wire_fields *f = &r.r.scan.recs[0];
    CHECK_EQ(f->n, 7);
    CHECK(dp__wire_fields_get(f, "pins") == NULL);
    uint64_t u;
    CHECK(dp__wire_fields_u64(f, "off", &u) && u == 4096);
    CHECK(dp__wire_fields_u64(f, "published", &u) && u == 1);
    CHECK(dp__wire_fields_u64(f, "refs", &u) && u == 3);
    CHECK(!dp__wire_fields_u64(f, "delta", &u));
    CHECK(!dp__wire_fields_u64(f, "age", &u));
    CHECK(!dp__wire_fields_u64(f, "id", &u));
    CHECK(!dp__wire_fields_u64(f, "nope", &u));
    CHECK_EQ(dp__wire_fields_get(f, "disk")->type, DP_WIRE_NIL);
    CHECK_EQ(dp__wire_fields_get(f, "delta")->v.i, -7);
    CHECK(dp__wire_str_eq(dp__wire_fields_get(f, "id")->v.s, "b1"));
    CHECK_EQ(r.r.scan.recs[1].n, 0);
    dp__wire_reply_fini(&r);
    dp__buf_fini(&m.b);

    /* stats: integral doubles count as numbers */
    reply_head(&m, "r1", true);
    dp__mp_put_map(&m.w, 2);
    dp__mp_put_str(&m.w, "puts");
    dp__mp_put_double(&m.w, 12.0);
    dp__mp_put_str(&m.w, "bytes");
    dp__mp_put_u64(&m.w, UINT64_MAX);
    CHECK_OK_D(dp__wire_reply_decode(m.b.data, m.b.len, DP_WIRE_OP_STATS, NULL, &r, &d),
               &d);
    CHECK(dp__wire_fields_u64(&r.r.stats, "puts", &u) && u == 12);
    CHECK(dp__wire_fields_u64(&r.r.stats, "bytes", &u) && u == UINT64_MAX);
    dp__wire_reply_fini(&r);
    dp__buf_fini(&m.b);

    /* limits on fields */
    dp_wire_limits lim;
    dp__wire_limits_init(&lim);
    lim.max_fields = 1;
    reply_head(&m, "r1", true);
    dp__mp_put_map(&m.w, 2);
    dp__mp_put_str(&m.w, "a");
    dp__mp_put_u64(&m.w, 1);
    dp__mp_put_str(&m.w, "b");
    dp__mp_put_u64(&m.w, 1);
    CHECK_ERR_D(dp__wire_reply_decode(m.b.data, m.b.len, DP_WIRE_OP_STATS, &lim, &r, &d),
                DP_ETOOBIG, &d);
    CHECK_CONTAINS(d.msg, "stats reply: result: map of 2 fields, the limit is 1");
    dp__wire_reply_fini(&r);
    dp__buf_fini(&m.b);
    reply_head(&m, "r1", true);
    dp__mp_put_array(&m.w, 1);
    dp__mp_put_map(&m.w, 1);
    dp__mp_put_str(&m.w, "name");
    dp__mp_put_strn(&m.w, "a\0", 2);
    expect_rep(&m, DP_WIRE_OP_SCAN, DP_EPROTO,
               "scan reply: result: record 0: 'name': string has a NUL", NULL);
    reply_head(&m, "r1", true);
    dp__mp_put_array(&m.w, 1);
    dp__mp_put_map(&m.w, 1);
    dp__mp_put_u64(&m.w, 1);
    dp__mp_put_u64(&m.w, 1);
    expect_rep(&m, DP_WIRE_OP_SCAN, DP_EPROTO, "record 0: field name: expected str",
               NULL);
}

/* ---- truncation and mutation ---- */

static void
decode_any(const uint8_t *p, size_t n)
{
    dp_detail d;
    dp_wire_request q;
    int rc = dp__wire_request_decode(p, n, NULL, &q, &d);
    CHECKF(rc == DP_OK || rc == DP_EPROTO || rc == DP_ETOOBIG, "%s", dp_errname(rc));
    dp__wire_request_fini(&q);
    dp_wire_op op;
    dp_wire_str rid;
    rc = dp__wire_request_peek(p, n, NULL, &op, &rid, &d);
    CHECK(rc == DP_OK || rc == DP_EPROTO);
    for (int o = 0; o < DP_WIRE_OP_COUNT_; o++) {
        if (dp__wire_op_is_notify((dp_wire_op)o))
            continue;
        dp_wire_reply r;
        rc = dp__wire_reply_decode(p, n, (dp_wire_op)o, NULL, &r, &d);
        CHECKF(rc == DP_OK || rc == DP_EPROTO || rc == DP_ETOOBIG, "%s", dp_errname(rc));
        dp__wire_reply_fini(&r);
    }
    rc = dp__wire_reply_peek(p, n, NULL, &rid, &d);
    CHECK(rc == DP_OK || rc == DP_EPROTO);
}

/* Every strict prefix of a valid message fails; the copy is exact-size for ASan. */
static void
check_prefixes(const dp_buf *b, bool request, dp_wire_op op)
{
    for (size_t cut = 0; cut < b->len; cut++) {
        uint8_t *h = malloc(cut ? cut : 1);
        memcpy(h, b->data, cut);
        dp_detail d;
        int rc;
        if (request) {
            dp_wire_request q;
            rc = dp__wire_request_decode(h, cut, NULL, &q, &d);
            dp__wire_request_fini(&q);
        } else {
            dp_wire_reply r;
            rc = dp__wire_reply_decode(h, cut, op, NULL, &r, &d);
            dp__wire_reply_fini(&r);
        }
        CHECKF(rc == DP_EPROTO, "prefix %zu of %zu: %s", cut, b->len, dp_errname(rc));
        free(h);
    }
}

DP_TEST(truncation_at_every_byte_fails)
{
    gen *g = calloc(1, sizeof *g);
    g->st = 777;
    dp_buf b;
    dp__buf_init(&b);
    for (int op = 0; op < DP_WIRE_OP_COUNT_; op++) {
        for (int i = 0; i < 3; i++) {
            dp_wire_request q = {.op = (dp_wire_op)op, .rid = gid(g)};
            gargs(g, &q);
            if (op == DP_WIRE_OP_SAVE_SHARD)
                q.a.save_shard.path = dp__wire_s("/tmp/x");
            dp__buf_reset(&b);
            CHECK_OK(dp__wire_request_encode(&q, NULL, &b, NULL));
            check_prefixes(&b, true, (dp_wire_op)op);
            if (!dp__wire_op_is_notify((dp_wire_op)op)) {
                dp_wire_reply r = {.op = (dp_wire_op)op, .rid = gid(g), .ok = true};
                if (i == 2)
                    gerror(g, &r);
                else
                    gresult(g, &r);
                dp__buf_reset(&b);
                CHECK_OK(dp__wire_reply_encode(&r, NULL, &b, NULL));
                check_prefixes(&b, false, (dp_wire_op)op);
            }
            gfree(g);
        }
    }
    dp__buf_fini(&b);
    free(g);
}

DP_TEST(random_mutations_never_crash)
{
    gen *g = calloc(1, sizeof *g);
    g->st = dp_test_seed() ^ 0x6d7574;
    dp_buf b;
    dp__buf_init(&b);
    for (int iter = 0; iter < 4000; iter++) {
        dp_wire_op op = (dp_wire_op)rnd(g, DP_WIRE_OP_COUNT_);
        dp__buf_reset(&b);
        if (rnd(g, 2) || dp__wire_op_is_notify(op)) {
            dp_wire_request q = {.op = op, .rid = gid(g)};
            gargs(g, &q);
            if (op == DP_WIRE_OP_SAVE_SHARD)
                q.a.save_shard.path = gtext_n(g, 1, 40);
            CHECK_OK(dp__wire_request_encode(&q, NULL, &b, NULL));
        } else {
            dp_wire_reply r = {.op = op, .rid = gid(g), .ok = true};
            if (rnd(g, 4) == 0)
                gerror(g, &r);
            else
                gresult(g, &r);
            CHECK_OK(dp__wire_reply_encode(&r, NULL, &b, NULL));
        }
        size_t n = b.len;
        uint8_t *p = malloc(n + 16);
        memcpy(p, b.data, n);
        int k = 1 + (int)rnd(g, 4);
        for (int j = 0; j < k && n > 0; j++) {
            size_t at = rnd(g, n);
            switch (rnd(g, 5)) {
            case 0:
                p[at] ^= (uint8_t)(1u << rnd(g, 8));
                break;
            case 1:
                p[at] = (uint8_t)rnd(g, 256);
                break;
            case 2: /* interesting header bytes */
                p[at] = (const uint8_t[]){0xc1, 0xdd, 0xdf, 0xdb, 0xcf,
                                          0xff, 0x00, 0xc0, 0x9f, 0x8f}[rnd(g, 10)];
                break;
            case 3:
                n = rnd(g, n + 1);
                break;
            default: /* insert a byte */
                if (n < b.len + 16) {
                    memmove(p + at + 1, p + at, n - at);
                    p[at] = (uint8_t)rnd(g, 256);
                    n++;
                }
            }
        }
        uint8_t *h = malloc(n ? n : 1);
        memcpy(h, p, n);
        decode_any(h, n);
        free(h);
        free(p);
        gfree(g);
    }
    dp__buf_fini(&b);
    free(g);
}

DP_TEST(big_lists_near_the_limits)
{
    /* resolve_keys of 100k keys and its reply: decoded in full */
    enum { N = 100000 };
    dp_wire_str *keys = malloc(N * sizeof *keys);
    char *store = malloc((size_t)N * 24);
    for (int i = 0; i < N; i++) {
        int n = snprintf(store + (size_t)i * 24, 24, "%d@input_ids", i);
        keys[i] = (dp_wire_str){store + (size_t)i * 24, (uint32_t)n};
    }
    dp_wire_request q = {.op = DP_WIRE_OP_RESOLVE_KEYS, .rid = dp__wire_s("r")};
    q.a.resolve_keys.keys = (dp_wire_strs){keys, N};
    dp_buf b;
    dp__buf_init(&b);
    dp_detail d;
    CHECK_OK(dp__wire_request_encode(&q, NULL, &b, &d));
    dp_wire_request x;
    CHECK_OK_D(dp__wire_request_decode(b.data, b.len, NULL, &x, &d), &d);
    CHECK_EQ(x.a.resolve_keys.keys.n, N);
    CHECK(dp__wire_str_eq(x.a.resolve_keys.keys.v[N - 1], "99999@input_ids"));
    dp__wire_request_fini(&x);
    dp_wire_limits lim;
    dp__wire_limits_init(&lim);
    lim.max_list = N - 1;
    CHECK_ERR(dp__wire_request_decode(b.data, b.len, &lim, &x, &d), DP_ETOOBIG);
    CHECK_CONTAINS(d.msg, "keys: list of 100000 items");
    dp__wire_request_fini(&x);
    dp__buf_fini(&b);
    free(keys);
    free(store);
}
