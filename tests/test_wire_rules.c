/*
 * Tests for src/wire/wire, the control-message codec, on hand-built messages:
 * a rejection case for every rule of requests (args, types, ranges, limits,
 * framing) and of replies (results, error text, unknown error kinds), with
 * the detail checked to name the field; optional args get their defaults;
 * encoders check the op and the size; every error kind round trips. Round
 * trips of every op and random mutations are in test_wire.c.
 */
#include "dp_test.h"

#include "wire/wire.h"
#include "wire/mp.h"

/* ---- hand-built messages for the rejection cases ---- */

typedef struct mb {
    dp__buf b;
    dp__mp_writer w;
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
mb_decode(mb *m, dp__wire_request *q, const dp__wire_limits *lim, dp_detail *d)
{
    dp_detail_clear(d);
    int rc = dp__wire_request_decode(m->b.data, m->b.len, lim, q, d);
    return rc;
}

/* Decode must fail with code and a detail containing each of the needles. */
static void
expect_req_fail(mb *m, const dp__wire_limits *lim, int code, const char *n1,
                const char *n2)
{
    dp__wire_request q;
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
put_good(dp__mp_writer *w, const char *name, const char *op)
{
    if (!strcmp(name, "blob_id") || !strcmp(name, "pin_id")) {
        dp__mp_put_str(w, "b1");
    } else if (!strcmp(name, "nbytes")) {
        dp__mp_put_u64(w, 4096);
    } else if (!strcmp(name, "n_entries") || !strcmp(name, "off")) {
        dp__mp_put_u64(w, 3);
    } else if (!strcmp(name, "data")) {
        uint8_t blob[64] = {0};
        dp__mp_put_bin(w, blob, sizeof blob);
    } else if (!strcmp(name, "inline_bytes")) {
        dp__mp_put_u64(w, 65536);
    } else if (!strcmp(name, "spill") || !strcmp(name, "in_flight")) {
        dp__mp_put_bool(w, false);
    } else if (!strcmp(name, "blob_ids")) {
        dp__mp_put_array(w, 2);
        dp__mp_put_str(w, "a");
        dp__mp_put_str(w, "b");
    } else if (!strcmp(name, "keys")) {
        dp__mp_put_array(w, 1);
        dp__mp_put_str(w, "1@x");
    } else if (!strcmp(name, "fields")) {
        dp__mp_put_array(w, 2);
        dp__mp_put_str(w, "obs");
        dp__mp_put_str(w, "act");
    } else if (!strcmp(name, "rows")) {
        uint8_t rec[DP_WIRE_ROW_LEN] = {7};
        dp__mp_put_bin(w, rec, sizeof rec);
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
    {"put", {"blob_id", "data", "n_entries", "spill"}, {1, 1, 1, 0}},
    {"abort", {"blob_id", "in_flight"}, {1, 0}},
    {"resolve", {"blob_ids"}, {1}},
    {"resolve_keys", {"keys", "inline_bytes"}, {1, 0}},
    {"resolve_rows", {"fields", "rows", "inline_bytes"}, {1, 1, 0}},
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
        dp__wire_request q;
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
    dp__wire_request q;
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
        dp__mp_writer *w = &(m)->w;                                                      \
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
    dp__wire_request q;
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
    dp__wire_limits lim;
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
    dp__wire_request q;
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
    dp__wire_op pop;
    dp__wire_str prid;
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
    dp__wire_limits lim;
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
    dp__buf b;
    dp__buf_init(&b);
    dp__buf_append(&b, "xyz", 3);
    dp_detail d;
    dp__wire_request q = {.op = DP_WIRE_OP_COUNT_, .rid = dp__wire_s("r")};
    CHECK_ERR(dp__wire_request_encode(&q, NULL, &b, &d), DP_EINVAL);
    q.op = DP_WIRE_OP_NONE;
    CHECK_ERR(dp__wire_request_encode(&q, NULL, &b, &d), DP_EINVAL);
    dp__wire_reply r = {.op = DP_WIRE_OP_UNPIN, .rid = dp__wire_s("r"), .ok = true};
    CHECK_ERR(dp__wire_reply_encode(&r, NULL, &b, &d), DP_EINVAL);
    CHECK_CONTAINS(d.msg, "unpin has no reply");
    dp__wire_reply rr;
    CHECK_ERR(dp__wire_reply_decode("x", 1, DP_WIRE_OP_ABORT, NULL, &rr, &d), DP_EINVAL);
    dp__wire_reply_fini(&rr);

    /* too big: nothing appended; the earlier bytes stay */
    dp__wire_limits lim;
    dp__wire_limits_init(&lim);
    lim.max_msg = 20;
    q.op = DP_WIRE_OP_SAVE_SHARD;
    q.a.save_shard.path = dp__wire_s("/some/path/that/is/long");
    CHECK_ERR(dp__wire_request_encode(&q, &lim, &b, &d), DP_ETOOBIG);
    CHECK_CONTAINS(d.msg, "save_shard: message of");
    CHECK_EQ(b.len, 3);
    r.op = DP_WIRE_OP_READ_BYTES;
    r.r.bytes = (dp__wire_bytes){(const uint8_t *)"0123456789012345678901234", 25};
    CHECK_ERR(dp__wire_reply_encode(&r, &lim, &b, &d), DP_ETOOBIG);
    CHECK_EQ(b.len, 3);
    /* appends after existing bytes */
    q.a.save_shard.path = dp__wire_s("/p");
    CHECK_OK(dp__wire_request_encode(&q, NULL, &b, &d));
    dp__wire_request x;
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
expect_rep(mb *m, dp__wire_op op, int code, const char *n1, const char *n2)
{
    dp__wire_reply r;
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
    dp__buf b;
    dp__buf_init(&b);
    for (size_t i = 0; i < DP_ARRAY_LEN(ks); i++) {
        CHECK_STR(dp__wire_err_kind(ks[i].code), ks[i].kind);
        CHECK_EQ(dp__wire_err_code(dp__wire_s(ks[i].kind)), ks[i].back);
        dp__wire_str blobs[] = {dp__wire_s("b1"), dp__wire_s("7@x")};
        dp_detail d;
        dp__buf_reset(&b);
        dp__wire_error err = {.code = ks[i].code,
                              .msg = dp__wire_s("it failed"),
                              .reason = dp__wire_s(i % 2 ? "pins" : NULL),
                              .blobs = {blobs, (uint32_t)(i % 3)}};
        CHECK_OK(dp__wire_reply_encode_error(dp__wire_s("r1"), 0, &err, NULL, &b, &d));
        dp__wire_reply r;
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
    dp__wire_error busy = {.code = DP_EBUSY};
    CHECK_OK(dp__wire_reply_encode_error(dp__wire_s("r1"), 0, &busy, NULL, &b, NULL));
    dp__wire_reply r;
    CHECK_OK(dp__wire_reply_decode(b.data, b.len, DP_WIRE_OP_COMMIT, NULL, &r, NULL));
    CHECK(dp__wire_str_eq(r.err.msg, dp_strerror(DP_EBUSY)));
    CHECK_EQ(r.err.blobs.n, 0);
    dp__wire_reply_fini(&r);
    dp__buf_fini(&b);
}

DP_TEST(error_text_is_sanitised_and_bounded)
{
    dp__buf b;
    dp__buf_init(&b);
    dp__wire_limits lim;
    dp__wire_limits_init(&lim);
    lim.max_text = 10;
    /* NUL and invalid bytes become '?'; a multi-byte char is never cut */
    static const char msg[] = "a\0b\xff\xc3\xa9\xe2\x82\xac\xe2\x82\xac!";
    dp__wire_reply e = {.op = DP_WIRE_OP_INFO, .rid = dp__wire_s("r"), .ok = false};
    e.err.code = DP_EPROTO;
    e.err.msg = (dp__wire_str){msg, sizeof msg - 1};
    e.err.reason = dp__wire_s("\x01ok");
    CHECK_OK(dp__wire_reply_encode(&e, &lim, &b, NULL));
    dp__wire_reply r;
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
    dp__wire_error cut = {
        .code = DP_EBUSY, .msg = dp__wire_s(big), .reason = dp__wire_s(big)};
    CHECK_OK(dp__wire_reply_encode_error(dp__wire_s("r"), 0, &cut, NULL, &b, NULL));
    CHECK_OK(dp__wire_reply_decode(b.data, b.len, DP_WIRE_OP_INFO, NULL, &r, &d));
    CHECK_EQ(r.err.msg.n, 4096);
    CHECK_EQ(r.err.reason.n, 4096);
    CHECK_EQ(dp__wire_error_to_detail(&r.err, &d), DP_EBUSY);
    CHECK(strlen(d.msg) < DP_DETAIL_MAX);
    dp__wire_reply_fini(&r);
    /* info's text fields are sanitised the same way */
    dp__wire_reply inf = {.op = DP_WIRE_OP_INFO, .rid = dp__wire_s("r"), .ok = true};
    inf.r.info.zmq = (dp__wire_str){"tcp\0x", 5};
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
    dp__wire_str v[200];
    char names[200][8];
    for (int i = 0; i < 200; i++) {
        snprintf(names[i], sizeof names[i], "b%d", i);
        v[i] = dp__wire_s(names[i]);
    }
    dp__wire_error e = {.code = DP_ELOST,
                        .kind = dp__wire_s("Missing"),
                        .msg = dp__wire_s("gone"),
                        .blobs = {v, 200}};
    dp_detail d;
    CHECK_EQ(dp__wire_error_to_detail(&e, &d), DP_ELOST);
    CHECK_CONTAINS(d.msg, "Missing: gone [blobs: b0, b1, b2");
    CHECK_CONTAINS(d.msg, "more");
    CHECK(strlen(d.msg) < DP_DETAIL_MAX);
    /* a zeroed error built by hand still reads well */
    dp__wire_error z = {.code = DP_EBUSY};
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
    dp__wire_reply r;
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
        dp__wire_reply r4;
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
    dp__wire_reply r;
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
        dp__mp_writer *w = &(m)->w;                                                      \
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
put_entry(dp__mp_writer *w, uint32_t n, uint64_t off, const char *kind, uint32_t ndim)
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
    dp__wire_reply r;
    dp_detail d;
    RK_ENTRY(&m, put_entry(w, 5, 128, "tensor", 32));
    CHECK_OK_D(
        dp__wire_reply_decode(m.b.data, m.b.len, DP_WIRE_OP_RESOLVE_KEYS, NULL, &r, &d),
        &d);
    CHECK_EQ(r.r.resolve_keys.pin_id.n, 0);
    CHECK_EQ(r.r.resolve_keys.entries.n, 1);
    const dp__wire_key_loc *e = &r.r.resolve_keys.entries.v[0];
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
    dp__wire_limits lim;
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
               "entries: '5@obs': array of 2 elements, expected 5 or 6", NULL);
    /* Inline: a sixth element, the value itself, exactly len (64) bytes. */
    static const uint8_t val[64] = {1, 2, 3};
    RK_ENTRY(&m, {
        put_entry(w, 6, 128, "tensor", 1);
        dp__mp_put_bin(w, val, 64);
    });
    CHECK_OK_D(
        dp__wire_reply_decode(m.b.data, m.b.len, DP_WIRE_OP_RESOLVE_KEYS, NULL, &r, &d),
        &d);
    e = &r.r.resolve_keys.entries.v[0];
    CHECK(e->data.n == 64 && memcmp(e->data.p, val, 64) == 0);
    dp__wire_reply_fini(&r);
    dp__buf_fini(&m.b);
    RK_ENTRY(&m, {
        put_entry(w, 6, 128, "tensor", 1);
        dp__mp_put_bin(w, val, 10);
    });
    expect_rep(&m, DP_WIRE_OP_RESOLVE_KEYS, DP_EPROTO,
               "'5@obs': data: 10 bytes for a value of 64 bytes", NULL);
    RK_ENTRY(&m, {
        put_entry(w, 6, 128, "tensor", 1);
        dp__mp_put_bin(w, val, 0);
    });
    expect_rep(&m, DP_WIRE_OP_RESOLVE_KEYS, DP_EPROTO,
               "'5@obs': data: 0 bytes for a value of 64 bytes", NULL);
    RK_ENTRY(&m, {
        put_entry(w, 6, 128, "tensor", 1);
        dp__mp_put_str(w, "not bin");
    });
    expect_rep(&m, DP_WIRE_OP_RESOLVE_KEYS, DP_EPROTO, "'5@obs': data:", NULL);
    RK_ENTRY(&m, put_entry(w, 7, 128, "tensor", 0));
    expect_rep(&m, DP_WIRE_OP_RESOLVE_KEYS, DP_EPROTO,
               "entries: '5@obs': array of 7 elements, expected 5 or 6", NULL);
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

/* resolve_rows reply whose descs list is written by the caller. */
static void
rr_reply(mb *m, uint32_t na, uint32_t ndim)
{
    static const uint8_t loc[DP_WIRE_LOC_LEN] = {0};
    reply_head(m, "r1", true);
    dp__mp_writer *w = &m->w;
    dp__mp_put_map(w, 3);
    dp__mp_put_str(w, "pin_id");
    dp__mp_put_nil(w);
    dp__mp_put_str(w, "locs");
    dp__mp_put_bin(w, loc, sizeof loc);
    dp__mp_put_str(w, "descs");
    dp__mp_put_array(w, 1);
    dp__mp_put_array(w, na);
    for (uint32_t i = 0; i < na && na < 3; i++)
        dp__mp_put_str(w, "x"); /* na short strings: too few elements */
    if (na < 3)
        return;
    dp__mp_put_str(w, "tensor");
    dp__mp_put_str(w, "float32");
    dp__mp_put_array(w, ndim);
    for (uint32_t i = 0; i < ndim; i++)
        dp__mp_put_u64(w, i + 1);
}

DP_TEST(resolve_rows_results_rules)
{
    mb m;
    dp__wire_reply r;
    dp_detail d;
    rr_reply(&m, 3, 32);
    CHECK_OK_D(
        dp__wire_reply_decode(m.b.data, m.b.len, DP_WIRE_OP_RESOLVE_ROWS, NULL, &r, &d),
        &d);
    CHECK_EQ(r.r.resolve_rows.locs.n, DP_WIRE_LOC_LEN);
    CHECK_EQ(r.r.resolve_rows.descs.n, 1);
    CHECK_EQ(r.r.resolve_rows.descs.v[0].ndim, 32);
    CHECK_EQ(r.r.resolve_rows.descs.v[0].shape[31], 32);
    CHECK_EQ(r.r.resolve_rows.data.n, 0); /* optional: absent */
    dp__wire_reply_fini(&r);
    dp__buf_fini(&m.b);
    rr_reply(&m, 3, 33);
    expect_rep(&m, DP_WIRE_OP_RESOLVE_ROWS, DP_EPROTO,
               "resolve_rows reply: result: descs[0]: shape: 33 dims, the limit is 32",
               NULL);
    rr_reply(&m, 2, 0);
    expect_rep(&m, DP_WIRE_OP_RESOLVE_ROWS, DP_EPROTO,
               "descs[0]: array of 2 elements, expected 3", NULL);
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
    dp__wire_reply r;
    dp_detail d;
    CHECK_OK_D(dp__wire_reply_decode(m.b.data, m.b.len, DP_WIRE_OP_SCAN, NULL, &r, &d),
               &d);
    CHECK_EQ(r.r.scan.n, 2);
    const dp__wire_fields *f = &r.r.scan.recs[0];
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
    dp__wire_limits lim;
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
