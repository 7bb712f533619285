/*
 * Tests for src/wire/wire: the control-message codec. Round trips of every
 * op's args and results; op names, string views, validators and request ids;
 * truncation at every byte; random structs (encode -> decode -> equal) and
 * random mutations (decode fails cleanly or succeeds, never crashes: run under
 * ASan/UBSan); lists near the limits. The rejection case of every rule, on
 * hand-built messages, is in test_wire_rules.c.
 */
#include "dp_test.h"

#include "wire/wire.h"

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

static dp__wire_str
gid(gen *g)
{
    static const char cs[] =
        "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.:-";
    uint32_t n = 1 + (uint32_t)rnd(g, rnd(g, 4) == 0 ? 64 : 12);
    char *p = galloc(g, n);
    for (uint32_t i = 0; i < n; i++)
        p[i] = cs[rnd(g, sizeof cs - 1)];
    return (dp__wire_str){p, n};
}

/* UTF-8 text of up to max bytes (min bytes at least). */
static dp__wire_str
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
    return (dp__wire_str){p, n};
}

static dp__wire_str
gtext(gen *g)
{
    return gtext_n(g, 0, rnd(g, 8) == 0 ? 300 : 24);
}

static dp__wire_str
gkey(gen *g)
{
    char *p = galloc(g, 300);
    int n = snprintf(p, 300, "%llu@", (unsigned long long)gnum(g, 0));
    dp__wire_str f = gtext_n(g, 1, 255 - 0);
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
    return (dp__wire_str){p, len};
}

static dp__wire_strs
glist(gen *g, bool keys)
{
    dp__wire_strs l = {NULL, (uint32_t)rnd(g, 12)};
    if (l.n > 0) {
        l.v = galloc(g, l.n * sizeof *l.v);
        for (uint32_t i = 0; i < l.n; i++)
            l.v[i] = keys ? gkey(g) : gid(g);
    }
    return l;
}

static dp__wire_shard_blobs
gshard(gen *g)
{
    dp__wire_shard_blobs l = {NULL, (uint32_t)rnd(g, 8)};
    if (l.n > 0) {
        l.v = galloc(g, l.n * sizeof *l.v);
        for (uint32_t i = 0; i < l.n; i++)
            l.v[i] = (dp__wire_shard_blob){gid(g), gnum(g, 1ull << 62),
                                           gnum(g, 1ull << 62), gnum(g, 1ull << 62)};
    }
    return l;
}

/* A list of up to 20 random u64s. */
static dp__wire_u64s
gu64s(gen *g)
{
    dp__wire_u64s l;
    l.n = (uint32_t)rnd(g, 20);
    l.v = galloc(g, l.n * sizeof *l.v);
    for (uint32_t i = 0; i < l.n; i++)
        l.v[i] = gnum(g, 0);
    return l;
}

static void
check_u64s(dp__wire_u64s a, dp__wire_u64s b)
{
    CHECK_EQ(a.n, b.n);
    for (uint32_t i = 0; i < a.n; i++)
        CHECK_EQ_U64(a.v[i], b.v[i]);
}

/* 0 .. max - 1 random bytes. */
static dp__wire_bytes
gbytes(gen *g, uint32_t max)
{
    uint32_t n = (uint32_t)rnd(g, max);
    uint8_t *p = galloc(g, n);
    for (uint32_t i = 0; i < n; i++)
        p[i] = (uint8_t)rnd(g, 256);
    return (dp__wire_bytes){p, n};
}

static void
check_bytes(dp__wire_bytes a, dp__wire_bytes b)
{
    CHECK_EQ(a.n, b.n);
    CHECK(a.n == 0 || memcmp(a.p, b.p, a.n) == 0);
}

static void
gargs(gen *g, dp__wire_request *q)
{
    switch (q->op) {
    case DP_WIRE_OP_ALLOC:
        q->a.alloc = (dp__wire_alloc_args){gid(g), 1 + gnum(g, (1ull << 62) - 1),
                                           gnum(g, (1u << 20) + 1), rnd(g, 2)};
        q->a.alloc.two_sided = rnd(g, 2);
        q->a.alloc.repair = rnd(g, 2);
        break;
    case DP_WIRE_OP_COMMIT:
        q->a.commit = (dp__wire_commit_args){gid(g), gnum(g, 0), gu64s(g)};
        break;
    case DP_WIRE_OP_PUT: {
        q->a.put = (dp__wire_put_args){gid(g), gbytes(g, 300), gnum(g, (1u << 20) + 1),
                                       rnd(g, 2), gnum(g, UINT64_MAX)};
        q->a.put.repair = rnd(g, 2);
        q->a.put.ver = gnum(g, 0);
        q->a.put.vers = gu64s(g);
        break;
    }
    case DP_WIRE_OP_ABORT:
        q->a.abort = (dp__wire_abort_args){gid(g), rnd(g, 2)};
        break;
    case DP_WIRE_OP_RESOLVE:
        q->a.resolve.blob_ids = glist(g, false);
        break;
    case DP_WIRE_OP_RESOLVE_KEYS:
        q->a.resolve_keys.keys = glist(g, true);
        q->a.resolve_keys.inline_bytes = gnum(g, 1ull << 62);
        break;
    case DP_WIRE_OP_RESOLVE_ROWS: {
        q->a.resolve_rows.fields = glist(g, true);
        q->a.resolve_rows.rows = gbytes(g, 300);
        q->a.resolve_rows.inline_bytes = gnum(g, 1ull << 62);
        break;
    }
    case DP_WIRE_OP_UNPIN:
        q->a.unpin.pin_id = gid(g);
        break;
    case DP_WIRE_OP_RELEASE_ROWS:
        q->a.release_rows = (dp__wire_release_rows_args){gu64s(g), gnum(g, 0)};
        break;
    case DP_WIRE_OP_READ_BYTES:
        q->a.read_bytes =
            (dp__wire_read_bytes_args){gnum(g, 1ull << 62), gnum(g, (16u << 20) + 1)};
        break;
    case DP_WIRE_OP_SAVE_SHARD:
        q->a.save_shard.path = gtext_n(g, 1, rnd(g, 4) ? 40 : PATH_MAX - 1);
        q->a.save_shard.home = rnd(g, 2);
        break;
    case DP_WIRE_OP_LOAD_SHARD:
        q->a.load_shard.path = gtext_n(g, 1, 60);
        q->a.load_shard.blobs = gshard(g);
        q->a.load_shard.spill = rnd(g, 2);
        q->a.load_shard.copy = rnd(g, 3);
        break;
    case DP_WIRE_OP_LIST_KEYS:
        q->a.list_keys =
            (dp__wire_list_keys_args){gnum(g, 0), gnum(g, 0), gnum(g, 0), rnd(g, 2)};
        break;
    case DP_WIRE_OP_LEASE:
        q->a.lease = (dp__wire_lease_args){gnum(g, 0), gnum(g, 0)};
        break;
    case DP_WIRE_OP_FENCE:
        q->a.fence = (dp__wire_fence_args){gu64s(g)};
        break;
    default: /* ping, info, scan, stats: no args */
        break;
    }
}

/* A value's description: text kind and dtype, 0..32 dims. */
static dp__wire_desc
gdesc(gen *g)
{
    dp__wire_desc e = {gtext(g), gtext(g), NULL, (uint32_t)rnd(g, 33)};
    uint64_t *s = galloc(g, e.ndim * sizeof *s);
    for (uint32_t j = 0; j < e.ndim; j++)
        s[j] = gnum(g, 1ull << 62);
    e.shape = e.ndim ? s : NULL;
    return e;
}

static dp__wire_descs
gdescs(gen *g)
{
    dp__wire_descs l = {NULL, (uint32_t)rnd(g, 6)};
    l.v = galloc(g, l.n * sizeof *l.v);
    for (uint32_t i = 0; i < l.n; i++)
        l.v[i] = gdesc(g);
    return l;
}

static dp__wire_fields
gfields(gen *g)
{
    dp__wire_fields f = {NULL, (uint32_t)rnd(g, 10)};
    f.v = galloc(g, f.n * sizeof *f.v);
    for (uint32_t i = 0; i < f.n; i++) {
        dp__wire_field *x = &f.v[i];
        x->name = gtext(g);
        x->type = (dp__wire_scalar_type)rnd(g, 6);
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

static dp__wire_str
gpin(gen *g)
{
    return rnd(g, 4) == 0 ? (dp__wire_str){"", 0} : gid(g);
}

static void
gresult(gen *g, dp__wire_reply *r)
{
    switch (r->op) {
    case DP_WIRE_OP_PING:
        r->r.unit_id = gnum(g, 0);
        break;
    case DP_WIRE_OP_INFO: {
        dp__wire_info *i = &r->r.info;
        i->unit_id = gnum(g, 0);
        i->n_units = gnum(g, 0);
        i->zmq = gtext(g);
        i->agent = gtext(g);
        dp__wire_str md = gtext_n(g, 0, 200);
        i->metadata = (dp__wire_bytes){(const uint8_t *)md.p, md.n};
        i->slab_bytes = gnum(g, 1ull << 62);
        i->io_bytes = gnum(g, 1ull << 62);
        i->numa = gtext(g);
        i->slab_addr = gnum(g, 0);
        i->read_pin_ms = gnum(g, 0);
        i->transports = gtext(g);
        i->replicas = gnum(g, 0);
        i->lease_ms = gnum(g, 0);
        break;
    }
    case DP_WIRE_OP_ALLOC:
        r->r.alloc.off = gnum(g, 1ull << 62);
        r->r.alloc.token = gnum(g, UINT64_MAX);
        break;
    case DP_WIRE_OP_COMMIT:
    case DP_WIRE_OP_PUT:
        r->r.commit = (dp__wire_commit_state)rnd(g, 3);
        break;
    case DP_WIRE_OP_RESOLVE: {
        dp__wire_resolve_res *x = &r->r.resolve;
        x->pin_id = gpin(g);
        x->blobs.n = (uint32_t)rnd(g, 10);
        x->blobs.v = galloc(g, x->blobs.n * sizeof *x->blobs.v);
        for (uint32_t i = 0; i < x->blobs.n; i++)
            x->blobs.v[i] =
                (dp__wire_blob_loc){gid(g), gnum(g, 1ull << 62), gnum(g, 1ull << 62)};
        x->missing = glist(g, false);
        x->pending = glist(g, false);
        x->failed = glist(g, false);
        break;
    }
    case DP_WIRE_OP_RESOLVE_ROWS: {
        dp__wire_resolve_rows_res *x = &r->r.resolve_rows;
        x->pin_id = gpin(g);
        x->locs = gbytes(g, 24 * 20);
        x->descs = gdescs(g);
        x->data = gbytes(g, 200);
        break;
    }
    case DP_WIRE_OP_RESOLVE_KEYS: {
        dp__wire_resolve_keys_res *x = &r->r.resolve_keys;
        x->pin_id = gpin(g);
        x->entries.n = (uint32_t)rnd(g, 10);
        x->entries.v = galloc(g, x->entries.n * sizeof *x->entries.v);
        for (uint32_t i = 0; i < x->entries.n; i++) {
            dp__wire_key_loc *e = &x->entries.v[i];
            e->key = gkey(g);
            e->off = gnum(g, 1ull << 62);
            e->len = gnum(g, 1ull << 62);
            dp__wire_desc w = gdesc(g);
            e->kind = w.kind;
            e->dtype = w.dtype;
            e->shape = w.shape;
            e->ndim = w.ndim;
            e->data = (dp__wire_bytes){NULL, 0};
            if (rnd(g, 2)) { /* inline: exactly len bytes (none: not inline) */
                e->data = gbytes(g, 200);
                e->len = e->data.n;
                if (e->data.n == 0)
                    e->data.p = NULL;
            }
        }
        x->missing = glist(g, true);
        x->pending = glist(g, true);
        x->failed = glist(g, true);
        x->fenced = glist(g, true);
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
        r->r.bytes = (dp__wire_bytes){p, n};
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
    case DP_WIRE_OP_LIST_KEYS:
        r->r.list_keys.keys = glist(g, true);
        r->r.list_keys.next = gnum(g, 0);
        r->r.list_keys.more = rnd(g, 2);
        r->r.list_keys.vers = gu64s(g);
        break;
    case DP_WIRE_OP_LEASE:
        r->r.lease = (dp__wire_lease_res){rnd(g, 2), gnum(g, 0), gnum(g, 0)};
        break;
    case DP_WIRE_OP_FENCE:
        r->r.fence.wait_ms = gnum(g, 0);
        break;
    default:
        CHECK(!"no result");
    }
}

static void
gerror(gen *g, dp__wire_reply *r)
{
    static const int codes[] = {DP_EUNITFULL, DP_EBUSY, DP_ELOST, DP_EPROTO, DP__ESTALE};
    r->ok = false;
    r->err.code = codes[rnd(g, 5)];
    r->err.msg = gtext(g);
    r->err.reason = rnd(g, 2) ? gtext_n(g, 1, 30) : (dp__wire_str){"", 0};
    r->err.blobs = glist(g, true);
    r->err.ver = r->err.code == DP__ESTALE ? gnum(g, 0) : 0;
}

/* ---- equality ---- */

#define CHECK_SV(a, b)                                                                   \
    CHECKF(dp__wire_str_same((a), (b)), "'%.*s' != '%.*s'", DP_WIRE_STR_ARG(a),          \
           DP_WIRE_STR_ARG(b))

static void
check_desc(dp__wire_desc a, dp__wire_desc b)
{
    CHECK_SV(a.kind, b.kind);
    CHECK_SV(a.dtype, b.dtype);
    CHECK_EQ(a.ndim, b.ndim);
    for (uint32_t j = 0; j < a.ndim; j++)
        CHECK_EQ_U64(a.shape[j], b.shape[j]);
}

static void
check_strs(dp__wire_strs a, dp__wire_strs b)
{
    CHECK_EQ(a.n, b.n);
    for (uint32_t i = 0; i < a.n; i++)
        CHECK_SV(a.v[i], b.v[i]);
}

static void
check_shard(dp__wire_shard_blobs a, dp__wire_shard_blobs b)
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
check_fields(const dp__wire_fields *a, const dp__wire_fields *b)
{
    CHECK_EQ(a->n, b->n);
    for (uint32_t i = 0; i < a->n; i++) {
        const dp__wire_field *x = &a->v[i], *y = &b->v[i];
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
check_req_eq(const dp__wire_request *a, const dp__wire_request *b)
{
    CHECK_EQ(a->op, b->op);
    CHECK_SV(a->rid, b->rid);
    switch (a->op) {
    case DP_WIRE_OP_ALLOC:
        CHECK_SV(a->a.alloc.blob_id, b->a.alloc.blob_id);
        CHECK_EQ_U64(a->a.alloc.nbytes, b->a.alloc.nbytes);
        CHECK_EQ_U64(a->a.alloc.n_entries, b->a.alloc.n_entries);
        CHECK_EQ(a->a.alloc.spill, b->a.alloc.spill);
        CHECK_EQ(a->a.alloc.two_sided, b->a.alloc.two_sided);
        CHECK_EQ(a->a.alloc.repair, b->a.alloc.repair);
        break;
    case DP_WIRE_OP_COMMIT:
        CHECK_SV(a->a.commit.blob_id, b->a.commit.blob_id);
        CHECK_EQ_U64(a->a.commit.ver, b->a.commit.ver);
        check_u64s(a->a.commit.vers, b->a.commit.vers);
        break;
    case DP_WIRE_OP_PUT:
        CHECK_SV(a->a.put.blob_id, b->a.put.blob_id);
        CHECK_EQ(a->a.put.data.n, b->a.put.data.n);
        CHECK(a->a.put.data.n == 0 ||
              memcmp(a->a.put.data.p, b->a.put.data.p, a->a.put.data.n) == 0);
        CHECK_EQ_U64(a->a.put.n_entries, b->a.put.n_entries);
        CHECK_EQ(a->a.put.spill, b->a.put.spill);
        CHECK_EQ_U64(a->a.put.incarnation, b->a.put.incarnation);
        CHECK_EQ(a->a.put.repair, b->a.put.repair);
        CHECK_EQ_U64(a->a.put.ver, b->a.put.ver);
        check_u64s(a->a.put.vers, b->a.put.vers);
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
        CHECK_EQ_U64(a->a.resolve_keys.inline_bytes, b->a.resolve_keys.inline_bytes);
        break;
    case DP_WIRE_OP_RESOLVE_ROWS:
        check_strs(a->a.resolve_rows.fields, b->a.resolve_rows.fields);
        check_bytes(a->a.resolve_rows.rows, b->a.resolve_rows.rows);
        CHECK_EQ_U64(a->a.resolve_rows.inline_bytes, b->a.resolve_rows.inline_bytes);
        break;
    case DP_WIRE_OP_UNPIN:
        CHECK_SV(a->a.unpin.pin_id, b->a.unpin.pin_id);
        break;
    case DP_WIRE_OP_RELEASE_ROWS:
        check_u64s(a->a.release_rows.gidxs, b->a.release_rows.gidxs);
        CHECK_EQ_U64(a->a.release_rows.ver, b->a.release_rows.ver);
        break;
    case DP_WIRE_OP_READ_BYTES:
        CHECK_EQ_U64(a->a.read_bytes.off, b->a.read_bytes.off);
        CHECK_EQ_U64(a->a.read_bytes.nbytes, b->a.read_bytes.nbytes);
        break;
    case DP_WIRE_OP_SAVE_SHARD:
        CHECK_SV(a->a.save_shard.path, b->a.save_shard.path);
        CHECK_EQ(a->a.save_shard.home, b->a.save_shard.home);
        break;
    case DP_WIRE_OP_LOAD_SHARD:
        CHECK_SV(a->a.load_shard.path, b->a.load_shard.path);
        check_shard(a->a.load_shard.blobs, b->a.load_shard.blobs);
        CHECK_EQ(a->a.load_shard.spill, b->a.load_shard.spill);
        CHECK_EQ_U64(a->a.load_shard.copy, b->a.load_shard.copy);
        break;
    case DP_WIRE_OP_LIST_KEYS:
        CHECK_EQ_U64(a->a.list_keys.unit, b->a.list_keys.unit);
        CHECK_EQ_U64(a->a.list_keys.from, b->a.list_keys.from);
        CHECK_EQ_U64(a->a.list_keys.max_rows, b->a.list_keys.max_rows);
        CHECK_EQ(a->a.list_keys.own, b->a.list_keys.own);
        break;
    case DP_WIRE_OP_LEASE:
        CHECK_EQ_U64(a->a.lease.unit, b->a.lease.unit);
        CHECK_EQ_U64(a->a.lease.done, b->a.lease.done);
        break;
    case DP_WIRE_OP_FENCE:
        check_u64s(a->a.fence.units, b->a.fence.units);
        break;
    default:
        break;
    }
}

static void
check_rep_eq(const dp__wire_reply *a, const dp__wire_reply *b)
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
        CHECK_EQ_U64(a->err.ver, b->err.ver);
        return;
    }
    switch (a->op) {
    case DP_WIRE_OP_PING:
        CHECK_EQ_U64(a->r.unit_id, b->r.unit_id);
        break;
    case DP_WIRE_OP_INFO: {
        const dp__wire_info *x = &a->r.info, *y = &b->r.info;
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
        CHECK_SV(x->transports, y->transports);
        CHECK_EQ_U64(x->replicas, y->replicas);
        CHECK_EQ_U64(x->lease_ms, y->lease_ms);
        break;
    }
    case DP_WIRE_OP_ALLOC:
        CHECK_EQ_U64(a->r.alloc.off, b->r.alloc.off);
        CHECK_EQ_U64(a->r.alloc.token, b->r.alloc.token);
        break;
    case DP_WIRE_OP_COMMIT:
    case DP_WIRE_OP_PUT:
        CHECK_EQ(a->r.commit, b->r.commit);
        break;
    case DP_WIRE_OP_RESOLVE: {
        const dp__wire_resolve_res *x = &a->r.resolve, *y = &b->r.resolve;
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
    case DP_WIRE_OP_RESOLVE_ROWS: {
        const dp__wire_resolve_rows_res *x = &a->r.resolve_rows, *y = &b->r.resolve_rows;
        CHECK_SV(x->pin_id, y->pin_id);
        check_bytes(x->locs, y->locs);
        check_bytes(x->data, y->data);
        CHECK_EQ(x->descs.n, y->descs.n);
        for (uint32_t i = 0; i < x->descs.n; i++)
            check_desc(x->descs.v[i], y->descs.v[i]);
        break;
    }
    case DP_WIRE_OP_RESOLVE_KEYS: {
        const dp__wire_resolve_keys_res *x = &a->r.resolve_keys, *y = &b->r.resolve_keys;
        CHECK_SV(x->pin_id, y->pin_id);
        CHECK_EQ(x->entries.n, y->entries.n);
        for (uint32_t i = 0; i < x->entries.n; i++) {
            const dp__wire_key_loc *e = &x->entries.v[i], *f = &y->entries.v[i];
            CHECK_SV(e->key, f->key);
            CHECK_EQ_U64(e->off, f->off);
            CHECK_EQ_U64(e->len, f->len);
            check_desc((dp__wire_desc){e->kind, e->dtype, e->shape, e->ndim},
                       (dp__wire_desc){f->kind, f->dtype, f->shape, f->ndim});
            check_bytes(e->data, f->data);
        }
        check_strs(x->missing, y->missing);
        check_strs(x->pending, y->pending);
        check_strs(x->failed, y->failed);
        check_strs(x->fenced, y->fenced);
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
    case DP_WIRE_OP_LIST_KEYS:
        check_strs(a->r.list_keys.keys, b->r.list_keys.keys);
        CHECK_EQ_U64(a->r.list_keys.next, b->r.list_keys.next);
        CHECK_EQ(a->r.list_keys.more, b->r.list_keys.more);
        check_u64s(a->r.list_keys.vers, b->r.list_keys.vers);
        break;
    case DP_WIRE_OP_LEASE:
        CHECK_EQ(a->r.lease.granted, b->r.lease.granted);
        CHECK_EQ_U64(a->r.lease.lease_ms, b->r.lease.lease_ms);
        CHECK_EQ_U64(a->r.lease.behind, b->r.lease.behind);
        break;
    case DP_WIRE_OP_FENCE:
        CHECK_EQ_U64(a->r.fence.wait_ms, b->r.fence.wait_ms);
        break;
    default:
        CHECK(!"no result");
    }
}

/* ---- round trips ---- */

static void
round_trip_request(gen *g, dp__wire_op op, dp__buf *out)
{
    dp__wire_request q = {.op = op, .rid = gid(g)};
    gargs(g, &q);
    dp_detail d;
    dp__buf_reset(out);
    CHECK_OK_D(dp__wire_request_encode(&q, NULL, out, &d), &d);
    dp__wire_request r;
    CHECK_OK_D(dp__wire_request_decode(out->data, out->len, NULL, &r, &d), &d);
    check_req_eq(&q, &r);
    dp__wire_op pop;
    dp__wire_str prid;
    CHECK_OK(dp__wire_request_peek(out->data, out->len, NULL, &pop, &prid, &d));
    CHECK_EQ(pop, op);
    CHECK_SV(prid, q.rid);
    dp__wire_request_fini(&r);
    CHECK_EQ(r.op, DP_WIRE_OP_NONE);
}

static void
round_trip_reply(gen *g, dp__wire_op op, bool error, dp__buf *out)
{
    dp__wire_reply a = {.op = op, .rid = gid(g), .ok = true};
    if (error)
        gerror(g, &a);
    else
        gresult(g, &a);
    dp_detail d;
    dp__buf_reset(out);
    CHECK_OK_D(dp__wire_reply_encode(&a, NULL, out, &d), &d);
    dp__wire_reply b;
    CHECK_OK_D(dp__wire_reply_decode(out->data, out->len, op, NULL, &b, &d), &d);
    check_rep_eq(&a, &b);
    dp__wire_str prid;
    CHECK_OK(dp__wire_reply_peek(out->data, out->len, NULL, &prid, &d));
    CHECK_SV(prid, a.rid);
    dp__wire_reply_fini(&b);
}

DP_TEST(every_op_round_trips)
{
    gen *g = calloc(1, sizeof *g);
    g->st = 12345;
    dp__buf b;
    dp__buf_init(&b);
    for (int op = 0; op < DP_WIRE_OP_COUNT_; op++) {
        for (int i = 0; i < 50; i++) {
            round_trip_request(g, (dp__wire_op)op, &b);
            if (!dp__wire_op_is_notify((dp__wire_op)op)) {
                round_trip_reply(g, (dp__wire_op)op, false, &b);
                round_trip_reply(g, (dp__wire_op)op, true, &b);
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
    dp__buf b;
    dp__buf_init(&b);
    for (int i = 0; i < 3000; i++) {
        dp__wire_op op = (dp__wire_op)rnd(g, DP_WIRE_OP_COUNT_);
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
        "ping",      "info",         "alloc",      "commit",       "abort",
        "resolve",   "resolve_keys", "unpin",      "release_rows", "scan",
        "stats",     "read_bytes",   "save_shard", "load_shard",   "put",
        "list_keys", "lease",        "fence",      "resolve_rows"};
    CHECK_EQ(DP_ARRAY_LEN(names), DP_WIRE_OP_COUNT_);
    for (int i = 0; i < DP_WIRE_OP_COUNT_; i++) {
        EXPECT_STR(dp__wire_op_name((dp__wire_op)i), names[i]);
        EXPECT_EQ(dp__wire_op_parse(dp__wire_s(names[i])), i);
        bool notify = strcmp(names[i], "unpin") == 0 || strcmp(names[i], "abort") == 0;
        EXPECT_EQ(dp__wire_op_is_notify((dp__wire_op)i), notify);
    }
    EXPECT_EQ(dp__wire_op_parse(dp__wire_s("Ping")), DP_WIRE_OP_NONE);
    EXPECT_EQ(dp__wire_op_parse(dp__wire_s("")), DP_WIRE_OP_NONE);
    EXPECT_EQ(dp__wire_op_parse((dp__wire_str){"pingx", 4}), DP_WIRE_OP_PING);
    EXPECT_STR(dp__wire_op_name(DP_WIRE_OP_NONE), "?");
    EXPECT_STR(dp__wire_op_name(DP_WIRE_OP_COUNT_), "?");
    EXPECT(!dp__wire_op_is_notify(DP_WIRE_OP_NONE));
    CHECK_STR(dp__wire_commit_state_name(DP_WIRE_COMMIT_PENDING), "pending");
}

DP_TEST(string_views_and_utf8)
{
    dp__wire_str s = dp__wire_s("abc");
    CHECK_EQ(s.n, 3);
    CHECK(dp__wire_str_eq(s, "abc"));
    CHECK(!dp__wire_str_eq(s, "ab"));
    CHECK(!dp__wire_str_eq(s, "abcd"));
    CHECK(dp__wire_s(NULL).n == 0 && dp__wire_s(NULL).p != NULL);
    CHECK(dp__wire_str_same((dp__wire_str){"abX", 2}, (dp__wire_str){"abY", 2}));
    char out[4];
    CHECK_EQ(dp__wire_str_copy((dp__wire_str){"hello", 5}, out, sizeof out), 5);
    CHECK_STR(out, "hel");
    CHECK_EQ(dp__wire_str_copy((dp__wire_str){"hi!", 2}, out, sizeof out), 2);
    CHECK_STR(out, "hi");
    char *z = dp__wire_str_dup((dp__wire_str){"key@x!", 5});
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

/* A key's text check: a NUL or a bad byte at any place of any length is
 * found at its offset, control bytes and good UTF-8 anywhere pass. */
DP_TEST(key_text_check_finds_every_bad_byte)
{
    dp_detail d;
    char k[48], want[32];
    for (uint32_t n = 1; n <= 40; n++) {
        for (uint32_t i = 0; i < n; i++)
            k[i] = (char)(i % 2 ? 0x01 + (char)(i % 31) : 'a' + (char)(i % 26));
        CHECK_OK_D(dp__wire_check_key((dp__wire_str){k, n}, NULL, "key", &d), &d);
        for (uint32_t at = 0; at < n; at++) {
            for (int bad = 0; bad < 3; bad++) {
                char keep = k[at];
                k[at] = bad == 0 ? '\0' : bad == 1 ? '\x80' : '\xff';
                CHECK_ERR(dp__wire_check_key((dp__wire_str){k, n}, NULL, "key", &d),
                          DP_EPROTO);
                snprintf(want, sizeof want, "at byte %u", at);
                CHECK_CONTAINS(d.msg, want);
                CHECK_CONTAINS(d.msg, bad == 0 ? "a NUL" : "invalid UTF-8");
                k[at] = keep;
            }
        }
        if (n >= 4) { /* a 3-byte character (the euro sign) at every place */
            for (uint32_t at = 0; at + 3 <= n; at++) {
                char t[48];
                memcpy(t, k, n);
                memcpy(t + at, "\xe2\x82\xac", 3);
                CHECK_OK_D(dp__wire_check_key((dp__wire_str){t, n}, NULL, "key", &d), &d);
                t[at + 2] = 'x'; /* cut short */
                CHECK_ERR(dp__wire_check_key((dp__wire_str){t, n}, NULL, "key", &d),
                          DP_EPROTO);
            }
        }
    }
}

DP_TEST(validators_name_the_value)
{
    dp_detail d;
    CHECK_OK(dp__wire_check_id(dp__wire_s("blob-1_a.b:c"), NULL, "blob_id", &d));
    CHECK_ERR(dp__wire_check_id(dp__wire_s(""), NULL, "blob_id", &d), DP_EPROTO);
    CHECK_CONTAINS(d.msg, "blob_id: empty id");
    CHECK_ERR(dp__wire_check_id(dp__wire_s("../etc"), NULL, "blob_id", &d), DP_EPROTO);
    CHECK_CONTAINS(d.msg, "blob_id: byte 0x2f at 2");
    CHECK_ERR(dp__wire_check_id((dp__wire_str){"a\0b", 3}, NULL, "pin_id", &d),
              DP_EPROTO);
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
        int rc = dp__wire_check_id((dp__wire_str){&one, 1}, NULL, "x", &d);
        CHECKF((rc == DP_OK) == want, "byte 0x%02x", c);
    }

    char key[300];
    memset(key, 'f', sizeof key);
    memcpy(key, "12@", 3);
    CHECK_OK(dp__wire_check_key((dp__wire_str){key, 276}, NULL, "keys[0]", &d));
    CHECK_ERR(dp__wire_check_key((dp__wire_str){key, 277}, NULL, "keys[0]", &d),
              DP_EPROTO);
    CHECK_CONTAINS(d.msg, "keys[0]: key of 277 bytes is longer than the limit 276");
    CHECK_ERR(dp__wire_check_key((dp__wire_str){"1@a\0", 4}, NULL, "k", &d), DP_EPROTO);
    CHECK_CONTAINS(d.msg, "k: key has a NUL at byte 3");
    CHECK_ERR(dp__wire_check_key(dp__wire_s("1@\xff"), NULL, "k", &d), DP_EPROTO);
    CHECK_CONTAINS(d.msg, "k: key has invalid UTF-8 at byte 2");
    CHECK_ERR(dp__wire_check_key(dp__wire_s(""), NULL, "k", &d), DP_EPROTO);
    CHECK_OK(dp__wire_check_key(dp__wire_s("7@caf\xc3\xa9"), NULL, "k", &d));

    CHECK_OK(dp__wire_check_path(dp__wire_s("/tmp/shard 1"), NULL, "path", &d));
    CHECK_ERR(dp__wire_check_path(dp__wire_s(""), NULL, "path", &d), DP_EPROTO);
    CHECK_CONTAINS(d.msg, "path: empty path");
    CHECK_ERR(dp__wire_check_path((dp__wire_str){"/a\0b", 4}, NULL, "path", &d),
              DP_EPROTO);
    char *longp = malloc(PATH_MAX + 1);
    memset(longp, 'p', PATH_MAX);
    CHECK_OK(dp__wire_check_path((dp__wire_str){longp, PATH_MAX - 1}, NULL, "path", &d));
    CHECK_ERR(dp__wire_check_path((dp__wire_str){longp, PATH_MAX}, NULL, "path", &d),
              DP_EPROTO);
    CHECK_CONTAINS(d.msg, "path: path of");
    free(longp);

    CHECK_OK(dp__wire_check_text(dp__wire_s(""), NULL, "msg", &d));
    CHECK_OK(dp__wire_check_text(dp__wire_s("line\nline\t"), NULL, "msg", &d));
    dp__wire_limits lim;
    dp__wire_limits_init(&lim);
    lim.max_text = 3;
    CHECK_ERR(dp__wire_check_text(dp__wire_s("abcd"), &lim, "dtype", &d), DP_EPROTO);
    CHECK_CONTAINS(d.msg, "dtype: string of 4 bytes is longer than the limit 3");
}

DP_TEST(request_ids_are_unique_and_valid)
{
    dp__wire_rid_gen g1, g2;
    dp_detail d;
    CHECK_OK(dp__wire_rid_gen_init(&g1, &d));
    CHECK_OK(dp__wire_rid_gen_init(&g2, &d));
    CHECK(strcmp(g1.prefix, g2.prefix) != 0);
    char a[DP_WIRE_RID_MAX], b[DP_WIRE_RID_MAX];
    dp__wire_str s = dp__wire_rid_next(&g1, a);
    CHECK_EQ(s.n, strlen(a));
    CHECK_EQ(a[16], '-');
    CHECK_STR(a + 17, "0");
    for (int i = 1; i < 2000; i++) {
        dp__wire_str t = dp__wire_rid_next(&g1, b);
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

/* ---- truncation and mutation ---- */

static void
decode_any(const uint8_t *p, size_t n)
{
    dp_detail d;
    dp__wire_request q;
    int rc = dp__wire_request_decode(p, n, NULL, &q, &d);
    CHECKF(rc == DP_OK || rc == DP_EPROTO || rc == DP_ETOOBIG, "%s", dp_errname(rc));
    dp__wire_request_fini(&q);
    dp__wire_op op;
    dp__wire_str rid;
    rc = dp__wire_request_peek(p, n, NULL, &op, &rid, &d);
    CHECK(rc == DP_OK || rc == DP_EPROTO);
    for (int o = 0; o < DP_WIRE_OP_COUNT_; o++) {
        if (dp__wire_op_is_notify((dp__wire_op)o))
            continue;
        dp__wire_reply r;
        rc = dp__wire_reply_decode(p, n, (dp__wire_op)o, NULL, &r, &d);
        CHECKF(rc == DP_OK || rc == DP_EPROTO || rc == DP_ETOOBIG, "%s", dp_errname(rc));
        dp__wire_reply_fini(&r);
    }
    rc = dp__wire_reply_peek(p, n, NULL, &rid, &d);
    CHECK(rc == DP_OK || rc == DP_EPROTO);
}

/* Every strict prefix of a valid message fails; the copy is exact-size for ASan. */
static void
check_prefixes(const dp__buf *b, bool request, dp__wire_op op)
{
    for (size_t cut = 0; cut < b->len; cut++) {
        uint8_t *h = malloc(cut ? cut : 1);
        memcpy(h, b->data, cut);
        dp_detail d;
        int rc;
        if (request) {
            dp__wire_request q;
            rc = dp__wire_request_decode(h, cut, NULL, &q, &d);
            dp__wire_request_fini(&q);
        } else {
            dp__wire_reply r;
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
    dp__buf b;
    dp__buf_init(&b);
    for (int op = 0; op < DP_WIRE_OP_COUNT_; op++) {
        for (int i = 0; i < 3; i++) {
            dp__wire_request q = {.op = (dp__wire_op)op, .rid = gid(g)};
            gargs(g, &q);
            if (op == DP_WIRE_OP_SAVE_SHARD)
                q.a.save_shard.path = dp__wire_s("/tmp/x");
            dp__buf_reset(&b);
            CHECK_OK(dp__wire_request_encode(&q, NULL, &b, NULL));
            check_prefixes(&b, true, (dp__wire_op)op);
            if (!dp__wire_op_is_notify((dp__wire_op)op)) {
                dp__wire_reply r = {.op = (dp__wire_op)op, .rid = gid(g), .ok = true};
                if (i == 2)
                    gerror(g, &r);
                else
                    gresult(g, &r);
                dp__buf_reset(&b);
                CHECK_OK(dp__wire_reply_encode(&r, NULL, &b, NULL));
                check_prefixes(&b, false, (dp__wire_op)op);
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
    dp__buf b;
    dp__buf_init(&b);
    for (int iter = 0; iter < 4000; iter++) {
        dp__wire_op op = (dp__wire_op)rnd(g, DP_WIRE_OP_COUNT_);
        dp__buf_reset(&b);
        if (rnd(g, 2) || dp__wire_op_is_notify(op)) {
            dp__wire_request q = {.op = op, .rid = gid(g)};
            gargs(g, &q);
            if (op == DP_WIRE_OP_SAVE_SHARD)
                q.a.save_shard.path = gtext_n(g, 1, 40);
            CHECK_OK(dp__wire_request_encode(&q, NULL, &b, NULL));
        } else {
            dp__wire_reply r = {.op = op, .rid = gid(g), .ok = true};
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
    dp__wire_str *keys = malloc(N * sizeof *keys);
    char *store = malloc((size_t)N * 24);
    for (int i = 0; i < N; i++) {
        int n = snprintf(store + (size_t)i * 24, 24, "%d@input_ids", i);
        keys[i] = (dp__wire_str){store + (size_t)i * 24, (uint32_t)n};
    }
    dp__wire_request q = {.op = DP_WIRE_OP_RESOLVE_KEYS, .rid = dp__wire_s("r")};
    q.a.resolve_keys.keys = (dp__wire_strs){keys, N};
    q.a.resolve_keys.inline_bytes = 0;
    dp__buf b;
    dp__buf_init(&b);
    dp_detail d;
    CHECK_OK(dp__wire_request_encode(&q, NULL, &b, &d));
    dp__wire_request x;
    CHECK_OK_D(dp__wire_request_decode(b.data, b.len, NULL, &x, &d), &d);
    CHECK_EQ(x.a.resolve_keys.keys.n, N);
    CHECK(dp__wire_str_eq(x.a.resolve_keys.keys.v[N - 1], "99999@input_ids"));
    dp__wire_request_fini(&x);
    dp__wire_limits lim;
    dp__wire_limits_init(&lim);
    lim.max_list = N - 1;
    CHECK_ERR(dp__wire_request_decode(b.data, b.len, &lim, &x, &d), DP_ETOOBIG);
    CHECK_CONTAINS(d.msg, "keys: list of 100000 items");
    dp__wire_request_fini(&x);
    dp__buf_fini(&b);
    free(keys);
    free(store);
}
