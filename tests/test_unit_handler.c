/*
 * Tests for src/unit's control-message handler, in process: every op fed as
 * an encoded request, malformed and truncated messages, release_rows of a
 * row another unit owns, and stale requests (an id older than one the same
 * client sent later). The unit's core is tested in test_unit.c.
 */
#include "dp_test.h"
#include "dp_tsan_ucx.h"
#include "dp_unit_blob.h"
#include "dp_unit_fixture.h"

#include "blob/blob.h"
#include "common/common.h"
#include "common/le.h"
#include "unit/unit.h"
#include "wire/mp.h"
#include "wire/wire.h"

/* ---- the handler, fed encoded and malformed messages ---- */

static int
call_handler(dp__unit *u, const dp__wire_request *req, dp__wire_reply *rep, bool *replied)
{
    dp__buf in = {0}, out = {0};
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_OK_D(dp__wire_request_encode(req, NULL, &in, &d), &d);
    dp__unit_handle(u, in.data, in.len, &out);
    *replied = out.len > 0;
    int rc = 0;
    if (out.len > 0) {
        rc = dp__wire_reply_decode(out.data, out.len, req->op, NULL, rep, &d);
        CHECK_OK_D(rc, &d);
        CHECK(dp__wire_str_same(rep->rid, req->rid));
        /* the reply's views point into out: keep it alive with the reply */
        static dp__buf keep[64];
        static int nkeep;
        dp__buf_fini(&keep[nkeep % 64]);
        keep[nkeep++ % 64] = out;
        out = (dp__buf){0};
    }
    dp__buf_fini(&in);
    dp__buf_fini(&out);
    return rc;
}

DP_TEST(handler_ops)
{
    dp__unit *u = mk_unit(1 << 20, 1, 0);
    dp__unit_set_address(u, "tcp://127.0.0.1:1");
    dp__wire_request q;
    dp__wire_reply r;
    bool replied;
    memset(&q, 0, sizeof q);
    q.rid = dp__wire_s("r1");

    q.op = DP_WIRE_OP_PING;
    call_handler(u, &q, &r, &replied);
    CHECK(replied && r.ok);
    CHECK_EQ(r.r.unit_id, 0);
    dp__wire_reply_fini(&r);

    q.op = DP_WIRE_OP_INFO;
    call_handler(u, &q, &r, &replied);
    CHECK(replied && r.ok);
    CHECK_EQ(r.r.info.slab_bytes, 1 << 20);
    CHECK(dp__wire_str_eq(r.r.info.zmq, "tcp://127.0.0.1:1"));
    CHECK(dp__wire_str_eq(r.r.info.numa, "off"));
    dp__wire_reply_fini(&r);

    const char *keys[] = {"5@obs"};
    tblob t = mk_blob(keys, 1, 100, 3);
    q.op = DP_WIRE_OP_ALLOC;
    q.a.alloc = (dp__wire_alloc_args){dp__wire_s("blob-1"), t.len, 1, true};
    call_handler(u, &q, &r, &replied);
    CHECK(replied && r.ok);
    uint64_t off = r.r.alloc.off;
    dp__wire_reply_fini(&r);
    dp_test_write_blob(u, "blob-1", off, t.p, t.len);

    q.op = DP_WIRE_OP_READ_BYTES;
    q.a.read_bytes = (dp__wire_read_bytes_args){off, 8};
    call_handler(u, &q, &r, &replied);
    CHECK(replied && r.ok);
    CHECK_EQ(r.r.bytes.n, 8);
    CHECK_EQ(memcmp(r.r.bytes.p, DP_BLOB_MAGIC, 8), 0);
    dp__wire_reply_fini(&r);
    q.a.read_bytes = (dp__wire_read_bytes_args){(1 << 20) - 4, 8};
    call_handler(u, &q, &r, &replied);
    CHECK(replied && !r.ok);
    CHECK_EQ(r.err.code, DP_EPROTO);
    dp__wire_reply_fini(&r);

    q.op = DP_WIRE_OP_COMMIT;
    q.a.commit = (dp__wire_commit_args){.blob_id = dp__wire_s("blob-1")};
    call_handler(u, &q, &r, &replied);
    CHECK(replied && r.ok);
    CHECK_EQ(r.r.commit, DP_WIRE_COMMIT_DONE);
    dp__wire_reply_fini(&r);

    dp__wire_str ks[] = {dp__wire_s("5@obs"), dp__wire_s("6@obs")};
    q.op = DP_WIRE_OP_RESOLVE_KEYS;
    q.a.resolve_keys.keys = (dp__wire_strs){ks, 2};
    q.a.resolve_keys.inline_bytes = 0;
    call_handler(u, &q, &r, &replied);
    CHECK(replied && r.ok);
    CHECK_EQ(r.r.resolve_keys.entries.n, 1);
    CHECK_EQ(r.r.resolve_keys.missing.n, 1);
    CHECK(dp__wire_str_eq(r.r.resolve_keys.entries.v[0].dtype, "") ||
          dp__wire_str_eq(r.r.resolve_keys.entries.v[0].dtype, "float32"));
    char pin[64];
    dp__wire_str_copy(r.r.resolve_keys.pin_id, pin, sizeof pin);
    dp__wire_reply_fini(&r);
    CHECK_EQ(dp_test_unit_stats(u).pins, 1);

    q.op = DP_WIRE_OP_UNPIN;
    q.a.unpin.pin_id = dp__wire_s(pin);
    call_handler(u, &q, &r, &replied);
    CHECK(!replied);
    CHECK_EQ(dp_test_unit_stats(u).pins, 0);

    dp__wire_str ids[] = {dp__wire_s("blob-1"), dp__wire_s("gone")};
    q.op = DP_WIRE_OP_RESOLVE;
    q.a.resolve.blob_ids = (dp__wire_strs){ids, 2};
    call_handler(u, &q, &r, &replied);
    CHECK(replied && r.ok);
    CHECK_EQ(r.r.resolve.blobs.n, 1);
    CHECK_EQ(r.r.resolve.blobs.v[0].off, off);
    CHECK_EQ(r.r.resolve.missing.n, 1);
    /* Its one entry still maps to it: whole (location hints may use it). */
    CHECK_EQ(r.r.resolve.whole.n, 1);
    CHECK(dp__wire_str_eq(r.r.resolve.whole.v[0], "blob-1"));
    dp__wire_reply_fini(&r);

    q.op = DP_WIRE_OP_SCAN;
    call_handler(u, &q, &r, &replied);
    CHECK(replied && r.ok);
    CHECK_EQ(r.r.scan.n, 1);
    uint64_t refs = 0;
    CHECK(dp__wire_fields_u64(&r.r.scan.recs[0], "refs", &refs));
    CHECK_EQ(refs, 1);
    dp__wire_reply_fini(&r);

    q.op = DP_WIRE_OP_STATS;
    call_handler(u, &q, &r, &replied);
    CHECK(replied && r.ok);
    uint64_t pins = 99, commits = 0;
    CHECK(dp__wire_fields_u64(&r.r.stats, "pins", &pins));
    CHECK(dp__wire_fields_u64(&r.r.stats, "commits", &commits));
    CHECK_EQ(pins, 1); /* the resolve above */
    CHECK_EQ(commits, 1);
    dp__wire_reply_fini(&r);

    uint64_t g[] = {5, 6};
    q.op = DP_WIRE_OP_RELEASE_ROWS;
    q.a.release_rows = (dp__wire_release_rows_args){{g, 2}};
    call_handler(u, &q, &r, &replied);
    CHECK(replied && r.ok);
    CHECK_EQ(r.r.dropped, 1);
    dp__wire_reply_fini(&r);

    /* Busy/UnitFull map to their error kinds with a reason. */
    q.op = DP_WIRE_OP_ALLOC;
    q.a.alloc = (dp__wire_alloc_args){dp__wire_s("huge"), (1 << 20) - 64, 0, false};
    call_handler(u, &q, &r, &replied);
    CHECK(replied && !r.ok);
    CHECK_EQ(r.err.code, DP_EBUSY); /* the resolve pin above holds blob-1 */
    CHECK(r.err.reason.n > 0);
    dp__wire_reply_fini(&r);

    q.op = DP_WIRE_OP_ABORT;
    q.a.abort = (dp__wire_abort_args){dp__wire_s("nothing"), true};
    call_handler(u, &q, &r, &replied);
    CHECK(!replied);

    /* A relative path is refused (test_checkpoint tests real saves). */
    q.op = DP_WIRE_OP_SAVE_SHARD;
    q.a.save_shard.path = dp__wire_s("tmp/x");
    call_handler(u, &q, &r, &replied);
    CHECK(replied && !r.ok);
    CHECK_EQ(r.err.code, DP_EPROTO);
    dp__wire_reply_fini(&r);
    dp_test_unit_check(u);
    free(t.p);
    dp__unit_destroy(u);
}

/* Send raw bytes; return the reply (decoded as op) or false if none. */
/*
 * Inline values (docs/design.md, "Inline values"). put: the blob inside the
 * request is allocated, copied, stamped and committed in one step; refused
 * (and nothing kept) for another incarnation, an id in use, a blob too short
 * or one that fails its checks. resolve_keys with inline_bytes: values in
 * key order while they fit ride in the reply, unpinned; the rest are pinned.
 */
/* An error reply's message as a C string (the view is not terminated). */
static const char *
err_msg(const dp__wire_reply *r)
{
    static char buf[1024];
    dp__wire_str_copy(r->err.msg, buf, sizeof buf);
    return buf;
}

DP_TEST(inline_put_and_get)
{
    dp__unit *u = mk_unit(1 << 20, 1, 0);
    dp__wire_request q;
    dp__wire_reply r;
    bool replied;
    memset(&q, 0, sizeof q);
    q.rid = dp__wire_s("r1");
    const char *keys[] = {"5@obs", "6@obs", "7@obs"};
    tblob t = mk_blob(keys, 3, 100, 3);
    uint64_t inc = dp__unit_incarnation(u);

    /* Another incarnation's put stores nothing. */
    q.op = DP_WIRE_OP_PUT;
    q.a.put =
        (dp__wire_put_args){dp__wire_s("ib-1"), {t.p, (uint32_t)t.len}, 3, true, inc ^ 1};
    call_handler(u, &q, &r, &replied);
    CHECK(replied && !r.ok);
    CHECK_CONTAINS(err_msg(&r), "restarted");
    dp__wire_reply_fini(&r);
    CHECK_EQ(dp_test_unit_stats(u).allocated_bytes, 0);
    CHECK_EQ(dp_test_unit_stats(u).restart_refused, 1);
    CHECK_EQ(dp_test_unit_stats(u).n_proto, 0);

    /* A blob that fails its checks (wrong entry count) is freed at once. */
    q.a.put.incarnation = inc;
    q.a.put.n_entries = 2;
    call_handler(u, &q, &r, &replied);
    CHECK(replied && !r.ok);
    CHECK_EQ(r.err.code, DP_EPROTO);
    dp__wire_reply_fini(&r);
    CHECK_EQ(dp_test_unit_stats(u).allocated_bytes, 0);
    dp_test_unit_check(u);

    /* Too short to be a blob. */
    q.a.put.n_entries = 3;
    q.a.put.data.n = 63;
    call_handler(u, &q, &r, &replied);
    CHECK(replied && !r.ok);
    CHECK_CONTAINS(err_msg(&r), "inline blob");
    dp__wire_reply_fini(&r);

    /* The real thing: published, the header stamped by the unit. */
    q.a.put.data.n = (uint32_t)t.len;
    call_handler(u, &q, &r, &replied);
    CHECK(replied && r.ok);
    CHECK_EQ(r.r.commit, DP_WIRE_COMMIT_DONE);
    dp__wire_reply_fini(&r);
    dp__unit_stats st = dp_test_unit_stats(u);
    CHECK_EQ(st.n_put_inline, 1);
    CHECK_EQ(st.entries, 3);
    CHECK_EQ(st.writers, 0); /* nobody but the unit wrote it */
    dp_test_unit_check(u);

    /* The same id again: in use, and the published blob is untouched. */
    call_handler(u, &q, &r, &replied);
    CHECK(replied && !r.ok);
    CHECK_CONTAINS(err_msg(&r), "already in use");
    dp__wire_reply_fini(&r);

    /* resolve_keys: 250 bytes of budget do not carry the three 100-byte values:
     * none is inline (all or nothing), all are pinned. */
    dp__wire_str ks[] = {dp__wire_s("7@obs"), dp__wire_s("5@obs"), dp__wire_s("9@obs"),
                         dp__wire_s("6@obs")};
    q.op = DP_WIRE_OP_RESOLVE_KEYS;
    q.a.resolve_keys.keys = (dp__wire_strs){ks, 4};
    q.a.resolve_keys.inline_bytes = 250;
    call_handler(u, &q, &r, &replied);
    CHECK(replied && r.ok);
    const dp__wire_resolve_keys_res *x = &r.r.resolve_keys;
    CHECK_EQ(x->entries.n, 3);
    CHECK_EQ(x->missing.n, 1);
    for (uint32_t i = 0; i < 3; i++) {
        CHECK_EQ(x->entries.v[i].len, 100);
        CHECK_EQ(x->entries.v[i].data.n, 0);
    }
    CHECK(x->pin_id.n > 0);
    char pin[64];
    dp__wire_str_copy(x->pin_id, pin, sizeof pin);
    dp__wire_reply_fini(&r);
    CHECK_EQ(dp_test_unit_stats(u).pins, 1);
    CHECK_EQ(dp_test_unit_stats(u).inline_bytes, 0);
    q.op = DP_WIRE_OP_UNPIN;
    q.a.unpin.pin_id = dp__wire_s(pin);
    call_handler(u, &q, &r, &replied);

    /* Everything fits (300 bytes, the missing key aside): nothing is pinned. */
    q.op = DP_WIRE_OP_RESOLVE_KEYS;
    q.a.resolve_keys.keys = (dp__wire_strs){ks, 4};
    q.a.resolve_keys.inline_bytes = 300;
    call_handler(u, &q, &r, &replied);
    CHECK(replied && r.ok);
    x = &r.r.resolve_keys;
    CHECK_EQ(x->entries.n, 3);
    CHECK_EQ(x->pin_id.n, 0);
    for (uint32_t i = 0; i < 3; i++) {
        const dp__wire_key_loc *e = &x->entries.v[i];
        /* key k of the blob: mk_blob's bytes (seed 3) */
        uint32_t k = dp__wire_str_eq(e->key, "5@obs")   ? 0
                     : dp__wire_str_eq(e->key, "6@obs") ? 1
                                                        : 2;
        CHECK_EQ(e->data.n, 100);
        for (uint32_t b = 0; b < 100; b++)
            CHECK_EQ(e->data.p[b], (uint8_t)(3 * 31 + k * 7 + b));
    }
    dp__wire_reply_fini(&r);
    CHECK_EQ(dp_test_unit_stats(u).pins, 0);
    CHECK_EQ(dp_test_unit_stats(u).inline_bytes, 300);
    q.a.resolve_keys.keys = (dp__wire_strs){ks, 2};
    q.a.resolve_keys.inline_bytes = 1 << 30; /* the unit caps it */
    call_handler(u, &q, &r, &replied);
    CHECK(replied && r.ok && r.r.resolve_keys.pin_id.n == 0);
    dp__wire_reply_fini(&r);
    dp_test_unit_check(u);
    free(t.p);
    dp__unit_destroy(u);
}

/*
 * resolve_rows: values asked by row and field in binary records, answered in
 * the order asked (found, missing), each description of a field once, the
 * same offsets as resolve_keys'; inline values one after another in that
 * order, unpinned; every bad record, field or count refused with nothing
 * pinned.
 */
static void
row_rec(uint8_t *p, uint64_t gidx, uint32_t field)
{
    dp__le64_store(p, gidx);
    dp__le32_store(p + 8, field);
}

static const uint8_t *
loc_at(const dp__wire_resolve_rows_res *x, uint32_t i)
{
    return x->locs.p + (size_t)i * DP_WIRE_LOC_LEN;
}

DP_TEST(resolve_rows_answers_in_order_asked)
{
    dp__unit *u = mk_unit(1 << 20, 1, 0);
    const char *keys[] = {"5@obs", "6@obs", "7@obs", "5@act"};
    tblob t = mk_blob(keys, 4, 100, 3);
    put_blob(u, "b-1", &t);
    dp__wire_request q;
    dp__wire_reply r;
    bool replied;
    memset(&q, 0, sizeof q);
    q.rid = dp__wire_s("r1");
    dp__wire_str fields[] = {dp__wire_s("obs"), dp__wire_s("act"), dp__wire_s("rew")};
    /* 7@obs 5@act 9@obs 6@obs 5@rew 5@obs */
    uint64_t g[] = {7, 5, 9, 6, 5, 5};
    uint32_t f[] = {0, 1, 0, 0, 2, 0};
    uint32_t want[] = {DP_WIRE_ROW_FOUND, DP_WIRE_ROW_FOUND,   DP_WIRE_ROW_MISSING,
                       DP_WIRE_ROW_FOUND, DP_WIRE_ROW_MISSING, DP_WIRE_ROW_FOUND};
    uint32_t kidx[] = {2, 3, 0, 1, 0, 0}; /* found: the key's place in the blob */
    uint8_t rows[6 * DP_WIRE_ROW_LEN];
    for (int i = 0; i < 6; i++)
        row_rec(rows + i * DP_WIRE_ROW_LEN, g[i], f[i]);
    q.op = DP_WIRE_OP_RESOLVE_ROWS;
    q.a.resolve_rows = (dp__wire_resolve_rows_args){{fields, 3}, {rows, sizeof rows}, 0};
    call_handler(u, &q, &r, &replied);
    CHECK(replied && r.ok);
    const dp__wire_resolve_rows_res *x = &r.r.resolve_rows;
    CHECK_EQ(x->locs.n, 6 * DP_WIRE_LOC_LEN);
    CHECK_EQ(x->data.n, 0);
    CHECK(x->pin_id.n > 0);
    /* obs and act: one description each, shared by a field's values */
    CHECK_EQ(x->descs.n, 2);
    for (uint32_t j = 0; j < x->descs.n; j++) {
        CHECK(dp__wire_str_eq(x->descs.v[j].kind, "tensor"));
        CHECK(dp__wire_str_eq(x->descs.v[j].dtype, "float32"));
        CHECK_EQ(x->descs.v[j].ndim, 1);
        CHECK_EQ(x->descs.v[j].shape[0], 25);
    }
    uint64_t offs[6];
    for (uint32_t i = 0; i < 6; i++) {
        const uint8_t *o = loc_at(x, i);
        CHECK_EQ(dp__le32_load(o + 16), want[i]);
        offs[i] = dp__le64_load(o);
        if (want[i] != DP_WIRE_ROW_FOUND)
            continue;
        CHECK_EQ(dp__le64_load(o + 8), 100);
        CHECK_EQ(dp__le32_load(o + 20), f[i] == 0 ? 0u : 1u);
        const uint8_t *b = dp__unit_slab(u) + offs[i];
        for (uint32_t k = 0; k < 100; k++)
            CHECK_EQ(b[k], (uint8_t)(3 * 31 + kidx[i] * 7 + k));
    }
    dp__wire_reply_fini(&r);
    CHECK_EQ(dp_test_unit_stats(u).pins, 1);

    /* The same offsets as resolve_keys gives. */
    dp__wire_str ks[] = {dp__wire_s("7@obs"), dp__wire_s("5@act")};
    q.op = DP_WIRE_OP_RESOLVE_KEYS;
    q.a.resolve_keys.keys = (dp__wire_strs){ks, 2};
    call_handler(u, &q, &r, &replied);
    CHECK(replied && r.ok && r.r.resolve_keys.entries.n == 2);
    CHECK_EQ(r.r.resolve_keys.entries.v[0].off, offs[0]);
    CHECK_EQ(r.r.resolve_keys.entries.v[1].off, offs[1]);
    dp__wire_reply_fini(&r);

    /* Inline: every found value's bytes, one after another, nothing pinned. */
    uint64_t pins = dp_test_unit_stats(u).pins;
    q.op = DP_WIRE_OP_RESOLVE_ROWS; /* (the union's other member was set) */
    q.a.resolve_rows =
        (dp__wire_resolve_rows_args){{fields, 3}, {rows, sizeof rows}, 400};
    call_handler(u, &q, &r, &replied);
    CHECK(replied && r.ok);
    x = &r.r.resolve_rows;
    CHECK_EQ(x->pin_id.n, 0);
    CHECK_EQ(x->data.n, 400);
    uint32_t at = 0;
    for (uint32_t i = 0; i < 6; i++) {
        if (want[i] != DP_WIRE_ROW_FOUND)
            continue;
        for (uint32_t k = 0; k < 100; k++)
            CHECK_EQ(x->data.p[at + k], (uint8_t)(3 * 31 + kidx[i] * 7 + k));
        at += 100;
    }
    dp__wire_reply_fini(&r);
    CHECK_EQ(dp_test_unit_stats(u).pins, pins);
    /* 399 bytes of budget: none inline, all pinned. */
    q.a.resolve_rows.inline_bytes = 399;
    call_handler(u, &q, &r, &replied);
    CHECK(replied && r.ok && r.r.resolve_rows.data.n == 0 &&
          r.r.resolve_rows.pin_id.n > 0);
    dp__wire_reply_fini(&r);

    /* Refused, nothing pinned: a field out of range, a bad field, a row of
     * another unit, a cut record, no fields, too many fields. */
    pins = dp_test_unit_stats(u).pins;
    uint64_t proto = dp_test_unit_stats(u).n_proto;
    q.a.resolve_rows.inline_bytes = 0;
    row_rec(rows + 5 * DP_WIRE_ROW_LEN, 5, 3);
    call_handler(u, &q, &r, &replied);
    CHECK(replied && !r.ok && r.err.code == DP_EPROTO);
    CHECK_CONTAINS(err_msg(&r), "value 5 names field 3 of 3");
    dp__wire_reply_fini(&r);
    row_rec(rows + 5 * DP_WIRE_ROW_LEN, 5, 0);
    fields[2] = dp__wire_s("r@w");
    call_handler(u, &q, &r, &replied);
    CHECK(replied && !r.ok && r.err.code == DP_EPROTO);
    CHECK_CONTAINS(err_msg(&r), "fields[2]");
    dp__wire_reply_fini(&r);
    fields[2] = dp__wire_s("rew");
    q.a.resolve_rows.rows.n = sizeof rows - 1;
    call_handler(u, &q, &r, &replied);
    CHECK(replied && !r.ok && r.err.code == DP_EPROTO);
    CHECK_CONTAINS(err_msg(&r), "records of 12 bytes");
    dp__wire_reply_fini(&r);
    q.a.resolve_rows.rows.n = sizeof rows;
    q.a.resolve_rows.fields.n = 0;
    call_handler(u, &q, &r, &replied);
    CHECK(replied && !r.ok && r.err.code == DP_EPROTO);
    dp__wire_reply_fini(&r);
    dp__wire_str *many = calloc(DP_WIRE_FIELDS_MAX + 1, sizeof *many);
    for (uint32_t i = 0; i <= DP_WIRE_FIELDS_MAX; i++)
        many[i] = dp__wire_s("obs");
    q.a.resolve_rows.fields = (dp__wire_strs){many, DP_WIRE_FIELDS_MAX + 1};
    call_handler(u, &q, &r, &replied);
    CHECK(replied && !r.ok && r.err.code == DP_EPROTO);
    CHECK_CONTAINS(err_msg(&r), "4097 fields");
    dp__wire_reply_fini(&r);
    free(many);
    CHECK_EQ(dp_test_unit_stats(u).pins, pins);
    CHECK_EQ(dp_test_unit_stats(u).n_proto, proto + 5);

    dp__unit *u1 = mk_unit(1 << 20, 2, 1); /* unit 1 of 2: row 5 is unit 1's, 6 is not */
    q.a.resolve_rows.fields = (dp__wire_strs){fields, 3};
    q.a.resolve_rows.rows.n = 4 * DP_WIRE_ROW_LEN;
    call_handler(u1, &q, &r, &replied);
    CHECK(replied && !r.ok && r.err.code == DP_EPROTO);
    CHECK_CONTAINS(err_msg(&r), "row 6 belongs to unit 0, not to unit 1 of 2");
    dp__wire_reply_fini(&r);
    q.a.resolve_rows.rows = (dp__wire_bytes){rows + DP_WIRE_ROW_LEN, DP_WIRE_ROW_LEN};
    call_handler(u1, &q, &r, &replied);
    CHECK(replied && r.ok && r.r.resolve_rows.locs.n == DP_WIRE_LOC_LEN);
    CHECK_EQ(dp__le32_load(loc_at(&r.r.resolve_rows, 0) + 16), DP_WIRE_ROW_MISSING);
    CHECK_EQ(r.r.resolve_rows.pin_id.n, 0);
    dp__wire_reply_fini(&r);
    dp_test_unit_check(u);
    dp_test_unit_check(u1);
    free(t.p);
    dp__unit_destroy(u1);
    dp__unit_destroy(u);
}

static bool
raw_call(dp__unit *u, const void *msg, size_t len, dp__wire_reply *rep, dp__buf *out)
{
    dp__buf_reset(out);
    dp__unit_handle(u, msg, len, out);
    if (out->len == 0)
        return false;
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_OK_D(dp__wire_reply_decode(out->data, out->len, DP_WIRE_OP_PING, NULL, rep, &d),
               &d);
    return true;
}

DP_TEST(handler_malformed)
{
    dp__unit *u = mk_unit(1 << 20, 1, 0);
    dp__buf out = {0}, m = {0};
    dp__wire_reply r;
    dp__mp_writer w;

    /* Garbage and messages without a readable request id: no reply. */
    CHECK(!raw_call(u, "\xc1\xff\x00", 3, &r, &out));
    CHECK(!raw_call(u, "", 0, &r, &out));
    dp__mp_writer_init(&w, &m);
    dp__mp_put_array(&w, 3);
    dp__mp_put_str(&w, "ping");
    dp__mp_put_u64(&w, 7);
    dp__mp_put_map(&w, 0);
    CHECK(!raw_call(u, m.data, m.len, &r, &out));

    /* Unknown op with a readable id: Protocol error carrying the id. */
    dp__buf_reset(&m);
    dp__mp_writer_init(&w, &m);
    dp__mp_put_array(&w, 3);
    dp__mp_put_str(&w, "explode");
    dp__mp_put_str(&w, "rid-9");
    dp__mp_put_map(&w, 0);
    CHECK(raw_call(u, m.data, m.len, &r, &out));
    CHECK(!r.ok);
    CHECK(dp__wire_str_eq(r.rid, "rid-9"));
    CHECK(dp__wire_str_eq(r.err.kind, "Protocol"));
    dp__wire_reply_fini(&r);

    /* alloc with a wrong type and an unknown key: Protocol with the id. */
    dp__buf_reset(&m);
    dp__mp_writer_init(&w, &m);
    dp__mp_put_array(&w, 3);
    dp__mp_put_str(&w, "alloc");
    dp__mp_put_str(&w, "rid-10");
    dp__mp_put_map(&w, 2);
    dp__mp_put_str(&w, "blob_id");
    dp__mp_put_u64(&w, 5);
    dp__mp_put_str(&w, "evil");
    dp__mp_put_bool(&w, true);
    CHECK(raw_call(u, m.data, m.len, &r, &out));
    CHECK(!r.ok);
    CHECK_EQ(r.err.code, DP_EPROTO);
    CHECK(dp__wire_str_eq(r.rid, "rid-10"));
    dp__wire_reply_fini(&r);

    /* A malformed notify is dropped. */
    dp__buf_reset(&m);
    dp__mp_writer_init(&w, &m);
    dp__mp_put_array(&w, 3);
    dp__mp_put_str(&w, "unpin");
    dp__mp_put_str(&w, "rid-11");
    dp__mp_put_map(&w, 1);
    dp__mp_put_str(&w, "pin_id");
    dp__mp_put_u64(&w, 1);
    CHECK(!raw_call(u, m.data, m.len, &r, &out));

    /* Truncations of a valid request never crash and never reply wrongly. */
    dp__wire_request q;
    memset(&q, 0, sizeof q);
    q.op = DP_WIRE_OP_ALLOC;
    q.rid = dp__wire_s("rid-12");
    q.a.alloc = (dp__wire_alloc_args){dp__wire_s("b"), 100, 1, true};
    dp__buf_reset(&m);
    CHECK_OK(dp__wire_request_encode(&q, NULL, &m, NULL));
    for (size_t cut = 0; cut < m.len; cut++) {
        dp__buf_reset(&out);
        dp__unit_handle(u, m.data, cut, &out);
    }
    /* Random bit flips of it. */
    uint64_t rs = dp_test_seed();
    uint8_t *copy = malloc(m.len);
    for (int i = 0; i < 2000; i++) {
        memcpy(copy, m.data, m.len);
        copy[dp_test_rand(&rs) % m.len] ^= (uint8_t)(1u << (dp_test_rand(&rs) % 8));
        dp__buf_reset(&out);
        dp__unit_handle(u, copy, m.len, &out);
    }
    free(copy);
    /* Still serving. */
    q.op = DP_WIRE_OP_PING;
    bool replied;
    call_handler(u, &q, &r, &replied);
    CHECK(replied && r.ok);
    dp__wire_reply_fini(&r);
    dp__unit_handle_oversize(u, m.data, m.len, &out);
    CHECK(out.len > 0);
    dp_test_unit_check(u);
    dp__buf_fini(&out);
    dp__buf_fini(&m);
    dp__unit_destroy(u);
}

/* release_rows of a row another unit owns: Protocol error, nothing released. */
DP_TEST(release_rows_of_another_unit_is_refused)
{
    dp__unit *u = mk_unit(1 << 20, 2, 1);
    const char *keys[] = {"1@a"};
    tblob t = mk_blob(keys, 1, 64, 1);
    put_blob(u, "b", &t);
    uint64_t g[2] = {1, 2}; /* 2 belongs to unit 0 */
    dp__wire_request q;
    memset(&q, 0, sizeof q);
    q.op = DP_WIRE_OP_RELEASE_ROWS;
    q.rid = dp__wire_s("r1");
    q.a.release_rows = (dp__wire_release_rows_args){{g, 2}};
    dp__wire_reply r;
    bool replied = false;
    call_handler(u, &q, &r, &replied);
    CHECK(replied && !r.ok);
    CHECK(dp__wire_str_eq(r.err.kind, "Protocol"));
    char msg[512];
    dp__wire_str_copy(r.err.msg, msg, sizeof msg);
    CHECK_CONTAINS(msg, "row 2 belongs to unit 0");
    CHECK(r.incarnation == dp__unit_incarnation(u));
    dp__wire_reply_fini(&r);
    CHECK_EQ(dp_test_unit_stats(u).entries, 1);
    free(t.p);
    dp__unit_destroy(u);
}

/*
 * Request order: a request whose id is older than one the same client sent
 * later is refused (a notify dropped, unpin still carried out); other
 * clients, and ids of another form, are not affected.
 */
DP_TEST(stale_requests_are_refused)
{
    dp__unit *u = mk_unit(1 << 20, 1, 0);
    const char *A = "0123456789abcdef", *B = "fedcba9876543210";
    char rid[64];
    dp__wire_request q;
    dp__wire_reply r;
    bool replied = false;
    /* A's alloc with counter 5. */
    memset(&q, 0, sizeof q);
    q.op = DP_WIRE_OP_ALLOC;
    snprintf(rid, sizeof rid, "%s-5", A);
    q.rid = dp__wire_s(rid);
    q.a.alloc = (dp__wire_alloc_args){dp__wire_s("x"), 4096, 0, false};
    call_handler(u, &q, &r, &replied);
    CHECK(replied && r.ok);
    uint64_t off = r.r.alloc.off, token = r.r.alloc.token;
    dp__wire_reply_fini(&r);
    /* The same alloc sent again (its connection dropped): the same allocation. */
    call_handler(u, &q, &r, &replied);
    CHECK(replied && r.ok);
    CHECK_EQ(r.r.alloc.off, off);
    CHECK_EQ(r.r.alloc.token, token);
    dp__wire_reply_fini(&r);
    CHECK_EQ(dp_test_unit_stats(u).repeats_taken, 1);
    CHECK_EQ(dp_test_unit_stats(u).blobs, 1);
    /* A's older clear (counter 3) arrives late: refused, nothing released. */
    const char *keys[] = {"7@a"};
    tblob t = mk_blob(keys, 1, 64, 1);
    put_blob(u, "b", &t);
    uint64_t g = 7;
    memset(&q, 0, sizeof q);
    q.op = DP_WIRE_OP_RELEASE_ROWS;
    snprintf(rid, sizeof rid, "%s-3", A);
    q.rid = dp__wire_s(rid);
    q.a.release_rows = (dp__wire_release_rows_args){{&g, 1}};
    call_handler(u, &q, &r, &replied);
    CHECK(replied && !r.ok);
    CHECK(dp__wire_str_eq(r.err.kind, "Protocol"));
    char msg[512];
    dp__wire_str_copy(r.err.msg, msg, sizeof msg);
    CHECK_CONTAINS(msg, "stale request");
    dp__wire_reply_fini(&r);
    CHECK_EQ(dp_test_unit_stats(u).entries, 1);
    /* The same counter again with another op is stale too; an older abort is dropped. */
    snprintf(rid, sizeof rid, "%s-5", A);
    q.rid = dp__wire_s(rid);
    call_handler(u, &q, &r, &replied);
    CHECK(replied && !r.ok);
    dp__wire_reply_fini(&r);
    memset(&q, 0, sizeof q);
    q.op = DP_WIRE_OP_ABORT;
    snprintf(rid, sizeof rid, "%s-4", A);
    q.rid = dp__wire_s(rid);
    q.a.abort = (dp__wire_abort_args){dp__wire_s("x"), false};
    call_handler(u, &q, &r, &replied);
    CHECK(!replied);
    CHECK_EQ(dp_test_unit_stats(u).blobs, 2); /* "x" is still allocated */
    /* Another client's low counters are its own; a newer A goes through. */
    memset(&q, 0, sizeof q);
    q.op = DP_WIRE_OP_RELEASE_ROWS;
    snprintf(rid, sizeof rid, "%s-1", B);
    q.rid = dp__wire_s(rid);
    q.a.release_rows = (dp__wire_release_rows_args){{&g, 1}};
    call_handler(u, &q, &r, &replied);
    CHECK(replied && r.ok && r.r.dropped == 1);
    dp__wire_reply_fini(&r);
    memset(&q, 0, sizeof q);
    q.op = DP_WIRE_OP_ABORT;
    snprintf(rid, sizeof rid, "%s-6", A);
    q.rid = dp__wire_s(rid);
    q.a.abort = (dp__wire_abort_args){dp__wire_s("x"), false};
    call_handler(u, &q, &r, &replied);
    CHECK_EQ(dp_test_unit_stats(u).blobs, 0);
    /* Ids of another form are never stale. */
    memset(&q, 0, sizeof q);
    q.op = DP_WIRE_OP_PING;
    for (int i = 0; i < 2; i++) {
        q.rid = dp__wire_s("r1");
        call_handler(u, &q, &r, &replied);
        CHECK(replied && r.ok);
        dp__wire_reply_fini(&r);
    }
    /* A stale unpin is still carried out (it only ends a pin). */
    put_blob(u, "c", &t);
    dp__wire_str k = dp__wire_s("7@a");
    memset(&q, 0, sizeof q);
    q.op = DP_WIRE_OP_RESOLVE_KEYS;
    snprintf(rid, sizeof rid, "%s-9", A);
    q.rid = dp__wire_s(rid);
    q.a.resolve_keys.keys = (dp__wire_strs){&k, 1};
    q.a.resolve_keys.inline_bytes = 0;
    call_handler(u, &q, &r, &replied);
    CHECK(replied && r.ok && r.r.resolve_keys.pin_id.n > 0);
    char pin[64];
    dp__wire_str_copy(r.r.resolve_keys.pin_id, pin, sizeof pin);
    dp__wire_reply_fini(&r);
    CHECK_EQ(dp_test_unit_stats(u).pins, 1);
    memset(&q, 0, sizeof q);
    q.op = DP_WIRE_OP_UNPIN;
    snprintf(rid, sizeof rid, "%s-8", A);
    q.rid = dp__wire_s(rid);
    q.a.unpin.pin_id = dp__wire_s(pin);
    call_handler(u, &q, &r, &replied);
    CHECK_EQ(dp_test_unit_stats(u).pins, 0);
    CHECK_EQ(dp_test_unit_stats(u).stale_refused, 3);
    free(t.p);
    dp__unit_destroy(u);
}
