/*
 * libFuzzer target for the control-message codec (src/wire/: wire.c,
 * wire_fields.c, wire_reply.c).
 *
 * Input: one selector byte, then the message. The low 7 bits of the selector
 * pick what decodes it: 0 the request decoder (and peek), k >= 1 the reply
 * decoder for op k - 1 (a notify op falls back to the request decoder). The
 * high bit picks tight limits, so the limit paths get exercised with small
 * inputs.
 *
 * Beyond "no crash, no leak, no out-of-bounds read", a message that decodes
 * must re-encode, and the re-encoding must decode to the same bytes again
 * (encode(decode(encode(decode(x)))) == encode(decode(x))): the encoder and
 * decoder agree on everything the decoder accepts.
 *
 * Built with -DFUZZ_WIRE_CORPUS_MAIN instead, this file is the generator of the
 * seed corpus: `fuzz_wire_corpus DIR` writes one valid message per op and kind.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wire/wire.h"

static const dp__wire_limits *
pick_limits(uint8_t sel)
{
    static dp__wire_limits tight;
    static int init;
    if (!init) {
        dp__wire_limits_init(&tight);
        tight.max_msg = 4096;
        tight.max_list = 8;
        tight.max_items = 16;
        tight.max_id = 8;
        tight.max_key = 12;
        tight.max_path = 16;
        tight.max_text = 16;
        tight.max_dims = 4;
        tight.max_fields = 4;
        tight.max_entries = 100;
        tight.max_size = 1u << 20;
        tight.max_read = 1000;
        init = 1;
    }
    return (sel & 0x80) ? &tight : NULL;
}

static void
check_rc(int rc)
{
    if (rc != DP_OK && rc != DP_EPROTO && rc != DP_ETOOBIG)
        abort();
}

static void
fuzz_request(const uint8_t *p, size_t n, const dp__wire_limits *lim)
{
    dp_detail d;
    dp__wire_op op;
    dp__wire_str rid;
    int prc = dp__wire_request_peek(p, n, lim, &op, &rid, &d);
    check_rc(prc);
    dp__wire_request q;
    int rc = dp__wire_request_decode(p, n, lim, &q, &d);
    check_rc(rc);
    if (rc == DP_OK) {
        if (prc != DP_OK || op != q.op || !dp__wire_str_same(rid, q.rid))
            abort();
        dp__buf a, b;
        dp__buf_init(&a);
        dp__buf_init(&b);
        if (dp__wire_request_encode(&q, lim, &a, &d) != DP_OK)
            abort();
        dp__wire_request q2;
        if (dp__wire_request_decode(a.data, a.len, lim, &q2, &d) != DP_OK)
            abort();
        if (dp__wire_request_encode(&q2, lim, &b, &d) != DP_OK)
            abort();
        if (a.len != b.len || memcmp(a.data, b.data, a.len) != 0)
            abort();
        dp__wire_request_fini(&q2);
        dp__buf_fini(&a);
        dp__buf_fini(&b);
    } else if (q.rid.n > 0 && !dp__wire_op_is_notify(q.op)) {
        /* What a server does with a bad request: answer with its id. */
        dp__buf e;
        dp__buf_init(&e);
        dp__wire_error we = {.code = rc, .msg = dp__wire_s(d.msg)};
        if (dp__wire_reply_encode_error(q.rid, 0, &we, lim, &e, NULL) != DP_OK)
            abort();
        dp__wire_reply r;
        if (dp__wire_reply_decode(e.data, e.len, DP_WIRE_OP_PING, lim, &r, &d) != DP_OK ||
            r.ok || r.err.code != DP_EPROTO)
            abort();
        dp__wire_reply_fini(&r);
        dp__buf_fini(&e);
    }
    dp__wire_request_fini(&q);
}

static void
fuzz_reply(const uint8_t *p, size_t n, dp__wire_op op, const dp__wire_limits *lim)
{
    dp_detail d;
    dp__wire_str rid;
    check_rc(dp__wire_reply_peek(p, n, lim, &rid, &d));
    dp__wire_reply r;
    int rc = dp__wire_reply_decode(p, n, op, lim, &r, &d);
    check_rc(rc);
    if (rc == DP_OK) {
        dp_detail e;
        dp__wire_error_to_detail(&r.err, &e);
        dp__buf a, b;
        dp__buf_init(&a);
        dp__buf_init(&b);
        /* float32 fields re-encode as float64: the copy may outgrow max_msg */
        int erc = dp__wire_reply_encode(&r, lim, &a, &d);
        if (erc == DP_ETOOBIG) {
            dp__buf_fini(&a);
            dp__wire_reply_fini(&r);
            return;
        }
        if (erc != DP_OK)
            abort();
        dp__wire_reply r2;
        if (dp__wire_reply_decode(a.data, a.len, op, lim, &r2, &d) != DP_OK)
            abort();
        if (dp__wire_reply_encode(&r2, lim, &b, &d) != DP_OK)
            abort();
        if (a.len != b.len || memcmp(a.data, b.data, a.len) != 0)
            abort();
        dp__wire_reply_fini(&r2);
        dp__buf_fini(&a);
        dp__buf_fini(&b);
    }
    dp__wire_reply_fini(&r);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    uint8_t sel = data[0];
    const dp__wire_limits *lim = pick_limits(sel);
    /* An exact-size copy: any overread is a heap overflow ASan reports. */
    size_t n = size - 1;
    uint8_t *p = malloc(n ? n : 1);
    if (p == NULL)
        return 0;
    memcpy(p, data + 1, n);
    unsigned mode = (sel & 0x7f) % (DP_WIRE_OP_COUNT_ + 1);
    if (mode == 0 || dp__wire_op_is_notify((dp__wire_op)(mode - 1)))
        fuzz_request(p, n, lim);
    else
        fuzz_reply(p, n, (dp__wire_op)(mode - 1), lim);
    free(p);
    return 0;
}

#ifdef FUZZ_WIRE_CORPUS_MAIN
/* ---- seed corpus generator ---- */

static const char *dir;
static int nfiles;

static void
emit(uint8_t sel, const dp__buf *b, const char *name)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (f == NULL || fwrite(&sel, 1, 1, f) != 1 ||
        fwrite(b->data, 1, b->len, f) != b->len)
        abort();
    fclose(f);
    nfiles++;
}

/* A dp__wire_str of string literal z, usable in a static initializer. */
// clang-format off
#define SEED_S(z) {(z), (uint32_t)(sizeof(z) - 1)}
// clang-format on

/* The values the seed messages carry. */
static dp__wire_str seed_ids[] = {SEED_S("blob-1"), SEED_S("blob.2"), SEED_S("b:3")};
static dp__wire_str seed_keys[] = {SEED_S("0@input_ids"), SEED_S("3@caf\xc3\xa9"),
                                   SEED_S("18446744073709551615@reward")};
static uint64_t seed_gidxs[] = {0, 7, 1ull << 40, UINT64_MAX};
static dp__wire_shard_blob seed_shards[] = {{SEED_S("blob-1"), 0, 4096, 2},
                                            {SEED_S("blob.2"), 4096, 70000, 1}};
static const uint64_t seed_shape[] = {2, 1024};
static dp__wire_key_loc seed_key_locs[] = {
    {SEED_S("0@input_ids"), 128, 8192, SEED_S("tensor"), SEED_S("int64"), seed_shape, 2},
    {SEED_S("3@caf\xc3\xa9"),
     1ull << 33,
     5,
     SEED_S("bytes"),
     SEED_S(""),
     NULL,
     0,
     {(const uint8_t *)"hello", 5}}, /* inline: the value rides in the reply */
};
static dp__wire_str seed_field_names[] = {SEED_S("input_ids"), SEED_S("caf\xc3\xa9")};
/* 2 values: (7, field 0) and (12, field 1), little-endian */
static const uint8_t seed_rows[2 * DP_WIRE_ROW_LEN] = {
    7, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 12, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0};
/* found at 4096 (64 bytes, description 0), missing */
static const uint8_t seed_locs[2 * DP_WIRE_LOC_LEN] = {
    0, 16, 0, 0, 0, 0, 0, 0, 64, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 0,  0, 0, 0, 0, 0, 0, 0,  0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0};
static dp__wire_desc seed_descs[] = {
    {SEED_S("tensor"), SEED_S("float32"), seed_shape, 2}};
static dp__wire_blob_loc seed_blob_locs[] = {{SEED_S("blob-1"), 0, 4096},
                                             {SEED_S("b:3"), 300, 1}};
static dp__wire_field seed_fields[] = {
    {.name = SEED_S("id"), .type = DP_WIRE_STR, .v.s = SEED_S("blob-1")},
    {.name = SEED_S("off"), .type = DP_WIRE_U64, .v.u = 65536},
    {.name = SEED_S("published"), .type = DP_WIRE_BOOL, .v.b = true},
    {.name = SEED_S("disk"), .type = DP_WIRE_NIL},
    {.name = SEED_S("age_s"), .type = DP_WIRE_F64, .v.f = 1.5},
    {.name = SEED_S("delta"), .type = DP_WIRE_I64, .v.i = -3},
};
static dp__wire_fields seed_records[] = {{seed_fields, 6}, {seed_fields, 2}};
static const uint8_t seed_md[] = "\x01\x00mdv1 endpoint metadata";

/* The arguments of a valid request of q->op (ops without arguments keep none). */
static void
seed_request_args(dp__wire_request *q)
{
    switch (q->op) {
    case DP_WIRE_OP_ALLOC:
        q->a.alloc = (dp__wire_alloc_args){.blob_id = dp__wire_s("blob-1"),
                                           .nbytes = 1 << 20,
                                           .n_entries = 64,
                                           .spill = true,
                                           .writer = dp__wire_s("c0ffee"),
                                           .pid = 4242,
                                           .host = dp__wire_s("boot/1"),
                                           .lane = dp__wire_s("shm")};
        break;
    case DP_WIRE_OP_COMMIT:
        q->a.commit = (dp__wire_commit_args){.blob_id = dp__wire_s("blob-1"), .ver = 7};
        break;
    case DP_WIRE_OP_PUT:
        q->a.put = (dp__wire_put_args){dp__wire_s("blob-1"),
                                       {seed_md, sizeof seed_md - 1},
                                       2,
                                       true,
                                       0x9f3c0a5d11e2b7c4ull};
        break;
    case DP_WIRE_OP_ABORT:
        q->a.abort = (dp__wire_abort_args){dp__wire_s("blob-1"), true};
        break;
    case DP_WIRE_OP_RESOLVE:
        q->a.resolve.blob_ids = (dp__wire_strs){seed_ids, 3};
        break;
    case DP_WIRE_OP_RESOLVE_KEYS:
        q->a.resolve_keys.keys = (dp__wire_strs){seed_keys, 3};
        q->a.resolve_keys.inline_bytes = 65536;
        break;
    case DP_WIRE_OP_RESOLVE_ROWS:
        q->a.resolve_rows = (dp__wire_resolve_rows_args){
            {seed_field_names, 2}, {seed_rows, sizeof seed_rows}, 65536};
        break;
    case DP_WIRE_OP_UNPIN:
        q->a.unpin.pin_id = dp__wire_s("pin-9");
        break;
    case DP_WIRE_OP_RELEASE_ROWS:
        q->a.release_rows = (dp__wire_release_rows_args){{seed_gidxs, 4}};
        break;
    case DP_WIRE_OP_READ_BYTES:
        q->a.read_bytes = (dp__wire_read_bytes_args){4096, 64};
        break;
    case DP_WIRE_OP_SAVE_SHARD:
        q->a.save_shard.path = dp__wire_s("/tmp/ckpt/unit-0.shard");
        break;
    case DP_WIRE_OP_LOAD_SHARD:
        q->a.load_shard = (dp__wire_load_shard_args){
            dp__wire_s("/tmp/ckpt/unit-0.shard"), {seed_shards, 2}, false};
        break;
    default:
        break;
    }
}

/* The result of a successful reply to r->op (ops without one keep none). */
static void
seed_reply_result(dp__wire_reply *r)
{
    switch (r->op) {
    case DP_WIRE_OP_PING:
        r->r.unit_id = 3;
        break;
    case DP_WIRE_OP_INFO:
        r->r.info = (dp__wire_info){3,
                                    4,
                                    dp__wire_s("tcp://10.0.0.1:5555"),
                                    dp__wire_s("unit-3"),
                                    {seed_md, sizeof seed_md - 1},
                                    1ull << 31,
                                    1ull << 28,
                                    dp__wire_s("node0"),
                                    1ull << 40,
                                    30000,
                                    0x9f3c0a5d11e2b7c4ull,
                                    DP_WIRE_PROTO,
                                    4242,
                                    dp__wire_s("boot-id/4026531836")};
        break;
    case DP_WIRE_OP_ALLOC:
        r->r.alloc.off = 1ull << 20;
        r->r.alloc.token = 7;
        break;
    case DP_WIRE_OP_COMMIT:
    case DP_WIRE_OP_PUT:
        r->r.commit = DP_WIRE_COMMIT_PENDING;
        break;
    case DP_WIRE_OP_RESOLVE:
        r->r.resolve = (dp__wire_resolve_res){dp__wire_s("pin-9"),
                                              {seed_blob_locs, 2},
                                              {seed_ids, 1},
                                              {seed_ids + 1, 1},
                                              {seed_ids + 2, 1}};
        break;
    case DP_WIRE_OP_RESOLVE_KEYS:
        r->r.resolve_keys = (dp__wire_resolve_keys_res){dp__wire_s("pin-9"),
                                                        {seed_key_locs, 2},
                                                        {seed_keys + 2, 1},
                                                        {NULL, 0},
                                                        {seed_keys, 1}};
        break;
    case DP_WIRE_OP_RESOLVE_ROWS:
        r->r.resolve_rows = (dp__wire_resolve_rows_res){dp__wire_s("pin-9"),
                                                        {seed_locs, sizeof seed_locs},
                                                        {seed_descs, 1},
                                                        {NULL, 0}};
        break;
    case DP_WIRE_OP_RELEASE_ROWS:
        r->r.dropped = 12;
        break;
    case DP_WIRE_OP_SCAN:
        r->r.scan = (dp__wire_scan_res){seed_records, 2};
        break;
    case DP_WIRE_OP_STATS:
        r->r.stats = seed_records[0];
        break;
    case DP_WIRE_OP_READ_BYTES:
        r->r.bytes = (dp__wire_bytes){seed_md, sizeof seed_md - 1};
        break;
    case DP_WIRE_OP_SAVE_SHARD:
        r->r.save_shard = (dp__wire_save_shard_res){{seed_shards, 2}, 74096, 1};
        break;
    case DP_WIRE_OP_LOAD_SHARD:
        r->r.load_shard = (dp__wire_load_shard_res){{seed_ids, 2}, {seed_ids + 2, 1}};
        break;
    default:
        break;
    }
}

/* req_<op>, and for an op that is answered rep_<op> and rep_<op>_tight. */
static void
emit_op(int op, dp__buf *b)
{
    char name[64];
    dp__wire_request q = {.op = (dp__wire_op)op, .rid = dp__wire_s("0123abcd-1f")};
    seed_request_args(&q);
    dp__buf_reset(b);
    if (dp__wire_request_encode(&q, NULL, b, NULL) != DP_OK)
        abort();
    snprintf(name, sizeof name, "req_%s", dp__wire_op_name(q.op));
    emit(0, b, name);
    if (dp__wire_op_is_notify(q.op))
        return;

    /* Every other op's reply carries an incarnation (the 4-element form). */
    dp__wire_reply r = {
        .op = q.op, .rid = q.rid, .ok = true, .incarnation = op % 2 ? 0x1234abcdull : 0};
    seed_reply_result(&r);
    dp__buf_reset(b);
    if (dp__wire_reply_encode(&r, NULL, b, NULL) != DP_OK)
        abort();
    snprintf(name, sizeof name, "rep_%s", dp__wire_op_name(r.op));
    emit((uint8_t)(op + 1), b, name);
    emit((uint8_t)(0x80 | (op + 1)), b,
         (snprintf(name, sizeof name, "rep_%s_tight", dp__wire_op_name(r.op)), name));
}

/* err_<kind>: an error reply of every kind. */
static void
emit_errors(dp__buf *b)
{
    static const int codes[] = {DP_EUNITFULL, DP_EBUSY, DP_ELOST, DP_EPROTO};
    char name[64];
    for (size_t i = 0; i < 4; i++) {
        dp__buf_reset(b);
        dp__wire_error e = {.code = codes[i],
                            .msg = dp__wire_s("no room"),
                            .reason = dp__wire_s(i == 1 ? "pins held" : NULL),
                            .blobs = {seed_keys, i == 2 ? 2 : 0}};
        if (dp__wire_reply_encode_error(dp__wire_s("0123abcd-20"), i * 77, &e, NULL, b,
                                        NULL) != DP_OK)
            abort();
        snprintf(name, sizeof name, "err_%s", dp__wire_err_kind(codes[i]));
        emit((uint8_t)(1 + DP_WIRE_OP_ALLOC), b, name);
    }
}

int
main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s DIR\n", argv[0]);
        return 2;
    }
    dir = argv[1];
    dp__buf b;
    dp__buf_init(&b);
    for (int op = 0; op < DP_WIRE_OP_COUNT_; op++)
        emit_op(op, &b);
    emit_errors(&b);
    dp__buf_fini(&b);
    printf("wrote %d files to %s\n", nfiles, dir);
    return 0;
}
#endif
