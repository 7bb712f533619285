/*
 * Tests for src/wire/mp: the bounds-checked msgpack reader and the dp__buf
 * writer. Well-formed data is checked against msgpack-c's own unpacker (the
 * oracle); hostile data (truncations, lengths past the end, huge counts, 0xc1,
 * deep nesting, wrong types) must fail with DP_EPROTO, leave the cursor where
 * it was and never read out of bounds (run under ASan).
 */
#include "dp_test.h"

#include <math.h>
#include <msgpack.h>

#include "wire/mp.h"

/* ---- helpers ---- */

typedef struct pk {
    msgpack_sbuffer sb;
    msgpack_packer p;
} pk;

static void
pk_init(pk *k)
{
    msgpack_sbuffer_init(&k->sb);
    msgpack_packer_init(&k->p, &k->sb, msgpack_sbuffer_write);
}

static void
pk_fini(pk *k)
{
    msgpack_sbuffer_destroy(&k->sb);
}

/* Compare what our reader sees at r with the oracle's object o, consuming it. */
static void
walk(dp__mp_reader *r, const msgpack_object *o)
{
    dp_detail d;
    dp__mp_reader save = *r;
    switch (o->type) {
    case MSGPACK_OBJECT_NIL:
        CHECK_EQ(dp__mp_peek(r), DP_MP_NIL);
        CHECK_OK(dp__mp_read_nil(r, NULL, &d));
        break;
    case MSGPACK_OBJECT_BOOLEAN: {
        bool b;
        CHECK_EQ(dp__mp_peek(r), DP_MP_BOOL);
        CHECK_OK(dp__mp_read_bool(r, &b, NULL, &d));
        CHECK_EQ(b, o->via.boolean);
        break;
    }
    case MSGPACK_OBJECT_POSITIVE_INTEGER: {
        uint64_t u;
        dp__mp_type t = dp__mp_peek(r);
        CHECK(t == DP_MP_UINT || t == DP_MP_INT); /* int 8..64 may hold >= 0 */
        CHECK_OK_D(dp__mp_read_u64(r, &u, NULL, &d), &d);
        CHECK_EQ_U64(u, o->via.u64);
        dp__mp_reader again = save;
        int64_t i;
        if (o->via.u64 <= (uint64_t)INT64_MAX) {
            CHECK_OK(dp__mp_read_i64(&again, &i, NULL, &d));
            CHECK_EQ(i, (int64_t)o->via.u64);
        } else {
            CHECK_ERR(dp__mp_read_i64(&again, &i, "big", &d), DP_EPROTO);
            CHECK_CONTAINS(d.msg, "big: integer out of range");
            CHECK(again.p == save.p);
        }
        again = save;
        double f;
        CHECK_OK(dp__mp_read_double(&again, &f, NULL, &d));
        CHECK(f == (double)o->via.u64);
        break;
    }
    case MSGPACK_OBJECT_NEGATIVE_INTEGER: {
        int64_t i;
        uint64_t u;
        CHECK_EQ(dp__mp_peek(r), DP_MP_INT);
        CHECK_ERR(dp__mp_read_u64(r, &u, "n", &d), DP_EPROTO);
        CHECK_CONTAINS(d.msg, "n: negative integer");
        CHECK(r->p == save.p);
        dp__mp_reader again = save;
        double f;
        CHECK_OK(dp__mp_read_double(&again, &f, NULL, &d));
        CHECK(f == (double)o->via.i64);
        CHECK_OK(dp__mp_read_i64(r, &i, NULL, &d));
        CHECK_EQ(i, o->via.i64);
        break;
    }
    case MSGPACK_OBJECT_FLOAT32:
    case MSGPACK_OBJECT_FLOAT64: {
        double f;
        CHECK_EQ(dp__mp_peek(r), DP_MP_FLOAT);
        CHECK_OK(dp__mp_read_double(r, &f, NULL, &d));
        CHECK((isnan(f) && isnan(o->via.f64)) || f == o->via.f64);
        break;
    }
    case MSGPACK_OBJECT_STR: {
        const char *s;
        uint32_t n;
        CHECK_EQ(dp__mp_peek(r), DP_MP_STR);
        CHECK_OK(dp__mp_read_str(r, &s, &n, NULL, &d));
        CHECK_EQ(n, o->via.str.size);
        CHECK(n == 0 || memcmp(s, o->via.str.ptr, n) == 0);
        break;
    }
    case MSGPACK_OBJECT_BIN: {
        const uint8_t *p;
        uint32_t n;
        CHECK_EQ(dp__mp_peek(r), DP_MP_BIN);
        CHECK_OK(dp__mp_read_bin(r, &p, &n, NULL, &d));
        CHECK_EQ(n, o->via.bin.size);
        CHECK(n == 0 || memcmp(p, o->via.bin.ptr, n) == 0);
        break;
    }
    case MSGPACK_OBJECT_ARRAY: {
        uint32_t n;
        CHECK_EQ(dp__mp_peek(r), DP_MP_ARRAY);
        CHECK_OK(dp__mp_read_array(r, &n, NULL, &d));
        CHECK_EQ(n, o->via.array.size);
        for (uint32_t i = 0; i < n; i++)
            walk(r, &o->via.array.ptr[i]);
        break;
    }
    case MSGPACK_OBJECT_MAP: {
        uint32_t n;
        CHECK_EQ(dp__mp_peek(r), DP_MP_MAP);
        CHECK_OK(dp__mp_read_map(r, &n, NULL, &d));
        CHECK_EQ(n, o->via.map.size);
        for (uint32_t i = 0; i < n; i++) {
            walk(r, &o->via.map.ptr[i].key);
            walk(r, &o->via.map.ptr[i].val);
        }
        break;
    }
    case MSGPACK_OBJECT_EXT:
        CHECK_EQ(dp__mp_peek(r), DP_MP_EXT);
        CHECK_OK(dp__mp_skip(r, &d));
        break;
    default:
        CHECK(!"unexpected oracle type");
    }
    /* Whatever was read, skip from the same place lands at the same byte. */
    dp__mp_reader s2 = save;
    CHECK_OK_D(dp__mp_skip(&s2, &d), &d);
    CHECK(s2.p == r->p);
}

/* Check every object in data against the oracle; all bytes must be consumed. */
static void
check_against_oracle(const void *data, size_t len)
{
    dp__mp_reader r;
    dp__mp_reader_init(&r, data, len);
    size_t off = 0;
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    while (off < len) {
        size_t before = off;
        msgpack_unpack_return ret = msgpack_unpack_next(&u, data, len, &off);
        CHECKF(ret == MSGPACK_UNPACK_SUCCESS, "oracle failed (%d) at %zu", (int)ret,
               before);
        CHECK_EQ(dp__mp_offset(&r), before);
        walk(&r, &u.data);
        CHECK_EQ(dp__mp_offset(&r), off);
    }
    msgpack_unpacked_destroy(&u);
    CHECK_EQ(dp__mp_remaining(&r), 0);
    CHECK_EQ(dp__mp_peek(&r), DP_MP_END);
}

/* ---- well-formed data, every type and width ---- */

DP_TEST(ints_every_width_match_oracle)
{
    static const uint64_t us[] = {
        0,         1,       0x7f,       0x80,        0xff,      0x100,
        0xffff,    0x10000, 0xffffffff, 0x100000000, INT64_MAX, (uint64_t)INT64_MAX + 1,
        UINT64_MAX};
    static const int64_t is[] = {-1,
                                 -31,
                                 -32,
                                 -33,
                                 -127,
                                 -128,
                                 -129,
                                 -32767,
                                 -32768,
                                 -32769,
                                 INT32_MIN,
                                 (int64_t)INT32_MIN - 1,
                                 INT64_MIN + 1,
                                 INT64_MIN};
    pk k;
    pk_init(&k);
    for (size_t i = 0; i < DP_ARRAY_LEN(us); i++) {
        msgpack_pack_uint64(&k.p, us[i]); /* smallest width */
        msgpack_pack_fix_uint64(&k.p, us[i]);
        if (us[i] <= 0xff)
            msgpack_pack_fix_uint8(&k.p, (uint8_t)us[i]);
        if (us[i] <= 0xffff)
            msgpack_pack_fix_uint16(&k.p, (uint16_t)us[i]);
        if (us[i] <= 0xffffffff)
            msgpack_pack_fix_uint32(&k.p, (uint32_t)us[i]);
        /* non-negative values in signed formats */
        if (us[i] <= INT8_MAX)
            msgpack_pack_fix_int8(&k.p, (int8_t)us[i]);
        if (us[i] <= INT16_MAX)
            msgpack_pack_fix_int16(&k.p, (int16_t)us[i]);
        if (us[i] <= INT32_MAX)
            msgpack_pack_fix_int32(&k.p, (int32_t)us[i]);
        if (us[i] <= INT64_MAX)
            msgpack_pack_fix_int64(&k.p, (int64_t)us[i]);
    }
    for (size_t i = 0; i < DP_ARRAY_LEN(is); i++) {
        msgpack_pack_int64(&k.p, is[i]);
        msgpack_pack_fix_int64(&k.p, is[i]);
        if (is[i] >= INT8_MIN)
            msgpack_pack_fix_int8(&k.p, (int8_t)is[i]);
        if (is[i] >= INT16_MIN)
            msgpack_pack_fix_int16(&k.p, (int16_t)is[i]);
        if (is[i] >= INT32_MIN)
            msgpack_pack_fix_int32(&k.p, (int32_t)is[i]);
    }
    check_against_oracle(k.sb.data, k.sb.size);
    pk_fini(&k);
}

DP_TEST(scalars_floats_nil_bool_match_oracle)
{
    pk k;
    pk_init(&k);
    msgpack_pack_nil(&k.p);
    msgpack_pack_true(&k.p);
    msgpack_pack_false(&k.p);
    static const double ds[] = {0.0, -0.0, 1.5, -2.25, 1e300, -1e-300, INFINITY, NAN};
    for (size_t i = 0; i < DP_ARRAY_LEN(ds); i++) {
        msgpack_pack_double(&k.p, ds[i]);
        msgpack_pack_float(&k.p, (float)ds[i]);
    }
    check_against_oracle(k.sb.data, k.sb.size);
    pk_fini(&k);
}

DP_TEST(str_bin_every_width_match_oracle)
{
    static const size_t lens[] = {0, 1, 31, 32, 255, 256, 65535, 65536, 70000};
    char *blob = malloc(70000);
    CHECK(blob != NULL);
    for (size_t i = 0; i < 70000; i++)
        blob[i] = (char)('a' + i % 26);
    pk k;
    pk_init(&k);
    for (size_t i = 0; i < DP_ARRAY_LEN(lens); i++) {
        msgpack_pack_str(&k.p, lens[i]);
        msgpack_pack_str_body(&k.p, blob, lens[i]);
        msgpack_pack_bin(&k.p, lens[i]);
        msgpack_pack_bin_body(&k.p, blob, lens[i]);
    }
    check_against_oracle(k.sb.data, k.sb.size);
    pk_fini(&k);
    free(blob);
}

DP_TEST(containers_every_width_match_oracle)
{
    static const uint32_t ns[] = {0, 1, 15, 16, 65535, 65536};
    pk k;
    pk_init(&k);
    for (size_t i = 0; i < DP_ARRAY_LEN(ns); i++) {
        msgpack_pack_array(&k.p, ns[i]);
        for (uint32_t j = 0; j < ns[i]; j++)
            msgpack_pack_uint32(&k.p, j);
        msgpack_pack_map(&k.p, ns[i]);
        for (uint32_t j = 0; j < ns[i]; j++) {
            msgpack_pack_uint32(&k.p, j);
            msgpack_pack_nil(&k.p);
        }
    }
    check_against_oracle(k.sb.data, k.sb.size);
    pk_fini(&k);
}

DP_TEST(ext_every_width_skips_like_oracle)
{
    static const size_t lens[] = {1, 2, 4, 8, 16, 0, 3, 255, 256, 65536};
    char data[65536] = {0};
    pk k;
    pk_init(&k);
    for (size_t i = 0; i < DP_ARRAY_LEN(lens); i++) {
        msgpack_pack_ext(&k.p, lens[i], 7);
        msgpack_pack_ext_body(&k.p, data, lens[i]);
    }
    /* ext inside containers too */
    msgpack_pack_array(&k.p, 2);
    msgpack_pack_ext(&k.p, 16, -3);
    msgpack_pack_ext_body(&k.p, data, 16);
    msgpack_pack_nil(&k.p);
    check_against_oracle(k.sb.data, k.sb.size);
    pk_fini(&k);
}

/* Pack a random value: every type, random widths, nested up to depth. */
static void
pack_random(msgpack_packer *p, uint64_t *st, int depth)
{
    static char body[300];
    uint64_t x = dp_test_rand(st);
    int t = (int)(x % (depth > 0 ? 12 : 9));
    x >>= 8;
    switch (t) {
    case 0:
        msgpack_pack_nil(p);
        break;
    case 1:
        if (x & 1)
            msgpack_pack_true(p);
        else
            msgpack_pack_false(p);
        break;
    case 2: {
        uint64_t v = dp_test_rand(st) >> (dp_test_rand(st) % 64);
        switch (x % 3) {
        case 0:
            msgpack_pack_uint64(p, v);
            break;
        case 1:
            msgpack_pack_fix_uint64(p, v);
            break;
        default:
            msgpack_pack_fix_uint32(p, (uint32_t)v);
        }
        break;
    }
    case 3: {
        int64_t v = (int64_t)(dp_test_rand(st) >> (dp_test_rand(st) % 64));
        v = -v;
        switch (x % 4) {
        case 0:
            msgpack_pack_int64(p, v);
            break;
        case 1:
            msgpack_pack_fix_int8(p, (int8_t)v);
            break;
        case 2:
            msgpack_pack_fix_int16(p, (int16_t)v);
            break;
        default:
            msgpack_pack_fix_int32(p, (int32_t)v);
        }
        break;
    }
    case 4:
        msgpack_pack_double(p, (double)(int64_t)dp_test_rand(st) / 7.0);
        break;
    case 5:
        msgpack_pack_float(p, (float)(x % 100000) / 3.0f);
        break;
    case 6: {
        size_t n = dp_test_rand(st) % (x & 1 ? 300 : 40);
        msgpack_pack_str(p, n);
        msgpack_pack_str_body(p, body, n);
        break;
    }
    case 7: {
        size_t n = dp_test_rand(st) % 300;
        msgpack_pack_bin(p, n);
        msgpack_pack_bin_body(p, body, n);
        break;
    }
    case 8: {
        size_t n = dp_test_rand(st) % 20;
        msgpack_pack_ext(p, n, (int8_t)(x & 0x7f));
        msgpack_pack_ext_body(p, body, n);
        break;
    }
    case 9:
    case 10: {
        uint32_t n = (uint32_t)(dp_test_rand(st) % 20);
        msgpack_pack_array(p, n);
        for (uint32_t i = 0; i < n; i++)
            pack_random(p, st, depth - 1);
        break;
    }
    default: {
        uint32_t n = (uint32_t)(dp_test_rand(st) % 20);
        msgpack_pack_map(p, n);
        for (uint32_t i = 0; i < n; i++) {
            pack_random(p, st, depth - 1);
            pack_random(p, st, depth - 1);
        }
        break;
    }
    }
}

DP_TEST(random_values_match_oracle)
{
    uint64_t st = dp_test_seed() ^ 0x6d70;
    for (int iter = 0; iter < 400; iter++) {
        pk k;
        pk_init(&k);
        int n = 1 + (int)(dp_test_rand(&st) % 4);
        for (int i = 0; i < n; i++)
            pack_random(&k.p, &st, 4);
        check_against_oracle(k.sb.data, k.sb.size);
        /* Every strict prefix fails to skip the whole stream. */
        for (size_t cut = 0; cut < k.sb.size; cut += 1 + cut / 8) {
            dp__mp_reader r;
            dp__mp_reader_init(&r, k.sb.data, cut);
            dp_detail d;
            int rc = DP_OK;
            while (rc == DP_OK && dp__mp_remaining(&r) > 0)
                rc = dp__mp_skip(&r, &d);
            CHECK(rc == DP_EPROTO || cut == 0 || dp__mp_remaining(&r) == 0);
        }
        pk_fini(&k);
    }
}

/* ---- writer ---- */

DP_TEST(writer_round_trips_through_oracle)
{
    dp__buf b;
    dp__buf_init(&b);
    dp__mp_writer w;
    dp__mp_writer_init(&w, &b);
    dp__mp_put_array(&w, 11);
    dp__mp_put_nil(&w);
    dp__mp_put_bool(&w, true);
    dp__mp_put_u64(&w, UINT64_MAX);
    dp__mp_put_i64(&w, INT64_MIN);
    dp__mp_put_double(&w, 0.5);
    dp__mp_put_str(&w, "héllo");
    dp__mp_put_strn(&w, "abc\0def", 7);
    dp__mp_put_bin(&w, "\x00\x01", 2);
    dp__mp_put_map(&w, 1);
    dp__mp_put_str(&w, "k");
    dp__mp_put_i64(&w, 5);
    dp__mp_put_array(&w, 0);
    dp__mp_put_map(&w, 0);
    CHECK_OK(dp__mp_writer_status(&w));
    check_against_oracle(b.data, b.len);

    dp__mp_reader r;
    dp_detail d;
    dp__mp_reader_init(&r, b.data, b.len);
    uint32_t n;
    CHECK_OK(dp__mp_read_array(&r, &n, NULL, &d));
    CHECK_EQ(n, 11);
    CHECK_OK(dp__mp_read_nil(&r, NULL, &d));
    CHECK(!dp__mp_take_nil(&r));
    bool bv;
    CHECK_OK(dp__mp_read_bool(&r, &bv, NULL, &d));
    CHECK(bv);
    uint64_t u;
    CHECK_OK(dp__mp_read_u64(&r, &u, NULL, &d));
    CHECK_EQ_U64(u, UINT64_MAX);
    int64_t i;
    CHECK_OK(dp__mp_read_i64(&r, &i, NULL, &d));
    CHECK(i == INT64_MIN);
    double f;
    CHECK_OK(dp__mp_read_double(&r, &f, NULL, &d));
    CHECK(f == 0.5);
    const char *s;
    uint32_t sn;
    CHECK_OK(dp__mp_read_str(&r, &s, &sn, NULL, &d));
    CHECK_EQ(sn, strlen("héllo"));
    CHECK_OK(dp__mp_read_str(&r, &s, &sn, NULL, &d));
    CHECK_EQ(sn, 7);
    CHECK(memcmp(s, "abc\0def", 7) == 0);
    dp__buf_fini(&b);

    /* A buffer already out of memory reports it. */
    dp__buf_init(&b);
    b.oom = true;
    dp__mp_writer_init(&w, &b);
    dp__mp_put_u64(&w, 1);
    CHECK_ERR(dp__mp_writer_status(&w), DP_ENOMEM);
    CHECK_EQ(b.len, 0);
    dp__buf_fini(&b);
}

/* ---- hostile inputs ---- */

/* Every reader on data must fail with DP_EPROTO and not move the cursor. */
static void
all_readers_fail(const uint8_t *data, size_t len)
{
    dp__mp_reader r;
    dp_detail d;
    dp__mp_reader_init(&r, data, len);
    bool b;
    uint64_t u;
    int64_t i;
    double f;
    const char *s;
    const uint8_t *p;
    uint32_t n;
    CHECK_ERR(dp__mp_read_nil(&r, "x", &d), DP_EPROTO);
    CHECK_ERR(dp__mp_read_bool(&r, &b, "x", &d), DP_EPROTO);
    CHECK_ERR(dp__mp_read_u64(&r, &u, "x", &d), DP_EPROTO);
    CHECK_ERR(dp__mp_read_i64(&r, &i, "x", &d), DP_EPROTO);
    CHECK_ERR(dp__mp_read_double(&r, &f, "x", &d), DP_EPROTO);
    CHECK_ERR(dp__mp_read_str(&r, &s, &n, "x", &d), DP_EPROTO);
    CHECK_ERR(dp__mp_read_bin(&r, &p, &n, "x", &d), DP_EPROTO);
    CHECK_ERR(dp__mp_read_array(&r, &n, "x", &d), DP_EPROTO);
    CHECK_ERR(dp__mp_read_map(&r, &n, "x", &d), DP_EPROTO);
    CHECK_ERR(dp__mp_skip(&r, &d), DP_EPROTO);
    CHECK_EQ(dp__mp_offset(&r), 0);
    CHECK(!dp__mp_take_nil(&r) || (len > 0 && data[0] == 0xc0));
}

/* Copy into an exact-size heap block so ASan catches any overread. */
static void
all_readers_fail_heap(const uint8_t *data, size_t len)
{
    uint8_t *h = malloc(len ? len : 1);
    CHECK(h != NULL);
    if (len > 0)
        memcpy(h, data, len);
    all_readers_fail(h, len);
    free(h);
}

DP_TEST(truncated_headers_of_every_width_fail)
{
    /* tag and the number of bytes its header needs after the tag */
    static const struct {
        uint8_t tag;
        unsigned w;
    } hs[] = {
        {0xcc, 1}, {0xcd, 2}, {0xce, 4}, {0xcf, 8},             /* uint */
        {0xd0, 1}, {0xd1, 2}, {0xd2, 4}, {0xd3, 8},             /* int */
        {0xca, 4}, {0xcb, 8},                                   /* float */
        {0xd9, 1}, {0xda, 2}, {0xdb, 4},                        /* str */
        {0xc4, 1}, {0xc5, 2}, {0xc6, 4},                        /* bin */
        {0xdc, 2}, {0xdd, 4}, {0xde, 2}, {0xdf, 4},             /* array, map */
        {0xc7, 2}, {0xc8, 3}, {0xc9, 5},                        /* ext: length + type */
        {0xd4, 2}, {0xd5, 3}, {0xd6, 5}, {0xd7, 9}, {0xd8, 17}, /* fixext: type + data */
    };
    uint8_t buf[32];
    for (size_t i = 0; i < DP_ARRAY_LEN(hs); i++) {
        for (unsigned cut = 0; cut < 1 + hs[i].w; cut++) {
            buf[0] = hs[i].tag;
            memset(buf + 1, 0x01, sizeof buf - 1);
            all_readers_fail_heap(buf, cut);
            if (cut > 0) {
                dp__mp_reader r;
                dp_detail d;
                dp__mp_reader_init(&r, buf, cut);
                CHECK_ERR(dp__mp_skip(&r, &d), DP_EPROTO);
                CHECK_CONTAINS(d.msg, "at byte");
            }
        }
    }
    all_readers_fail_heap(NULL, 0);
    dp__mp_reader r;
    dp__mp_reader_init(&r, NULL, 0);
    CHECK_EQ(dp__mp_peek(&r), DP_MP_END);
    CHECK_EQ(dp__mp_remaining(&r), 0);
}

DP_TEST(lengths_past_the_end_fail)
{
    static const uint8_t cases[][8] = {
        {0xdb, 0xff, 0xff, 0xff, 0xff, 'a', 'b', 'c'}, /* str32 of 4 GiB */
        {0xda, 0x00, 0x06, 'a', 'b', 'c', 'd', 'e'},   /* str16 one short */
        {0xc6, 0x80, 0x00, 0x00, 0x00, 1, 2, 3},       /* bin32 */
        {0xc4, 0x07, 1, 2, 3, 4, 5, 6},                /* bin8 one short */
        {0xc9, 0xff, 0xff, 0xff, 0xff, 1, 2, 3},       /* ext32 */
        {0xbf, 'a', 'b', 'c', 'd', 'e', 'f', 'g'},     /* fixstr 31 */
    };
    for (size_t i = 0; i < DP_ARRAY_LEN(cases); i++) {
        all_readers_fail_heap(cases[i], 8);
    }
    dp__mp_reader r;
    dp_detail d;
    const char *s;
    uint32_t n;
    dp__mp_reader_init(&r, cases[0], 8);
    CHECK_ERR(dp__mp_read_str(&r, &s, &n, "blob_id", &d), DP_EPROTO);
    CHECK_CONTAINS(d.msg, "blob_id: str of 4294967295 bytes at byte 0 runs past the end");
}

DP_TEST(huge_counts_in_a_few_bytes_fail)
{
    static const uint8_t cases[][6] = {
        {0xdd, 0xff, 0xff, 0xff, 0xff, 0x00}, /* array of 4G */
        {0xdf, 0xff, 0xff, 0xff, 0xff, 0x00}, /* map of 4G (8G values) */
        {0xdf, 0x80, 0x00, 0x00, 0x00, 0x00}, /* 2 * count overflows 32 bits */
        {0xdc, 0xff, 0xff, 0x00, 0x00, 0x00}, /* array16 of 65535 */
        {0xde, 0x00, 0x02, 0xc0, 0xc0, 0xc0}, /* map of 2 needs 4 values, has 3 */
        {0x9f, 0xc0, 0xc0, 0xc0, 0xc0, 0xc0}, /* fixarray 15 */
    };
    for (size_t i = 0; i < DP_ARRAY_LEN(cases); i++)
        all_readers_fail_heap(cases[i], 6);
    dp__mp_reader r;
    dp_detail d;
    uint32_t n;
    dp__mp_reader_init(&r, cases[0], 6);
    CHECK_ERR(dp__mp_read_array(&r, &n, "keys", &d), DP_EPROTO);
    CHECK_CONTAINS(d.msg, "keys: array of 4294967295 elements");
    /* A map of 2 with exactly 4 one-byte values is fine. */
    static const uint8_t ok[] = {0x82, 0xc0, 0xc0, 0xc0, 0xc0};
    dp__mp_reader_init(&r, ok, sizeof ok);
    CHECK_OK(dp__mp_read_map(&r, &n, NULL, &d));
    CHECK_EQ(n, 2);
}

DP_TEST(invalid_byte_c1_fails)
{
    static const uint8_t c1[] = {0xc1};
    all_readers_fail_heap(c1, 1);
    dp__mp_reader r;
    dp_detail d;
    dp__mp_reader_init(&r, c1, 1);
    CHECK_EQ(dp__mp_peek(&r), DP_MP_INVALID);
    CHECK_ERR(dp__mp_skip(&r, &d), DP_EPROTO);
    CHECK_CONTAINS(d.msg, "0xc1");
    static const uint8_t nested[] = {0x92, 0x01, 0xc1};
    dp__mp_reader_init(&r, nested, sizeof nested);
    CHECK_ERR(dp__mp_skip(&r, &d), DP_EPROTO);
    CHECK_EQ(dp__mp_offset(&r), 0);
    CHECK_STR(dp__mp_type_name(DP_MP_INVALID), "invalid byte");
    CHECK_STR(dp__mp_type_name((dp__mp_type)99), "?");
}

static size_t
nested_arrays(uint8_t *buf, unsigned depth)
{
    for (unsigned i = 0; i < depth; i++)
        buf[i] = 0x91; /* fixarray of 1 */
    buf[depth] = 0xc0;
    return depth + 1;
}

DP_TEST(nesting_is_bounded)
{
    uint8_t *buf = malloc(1000001);
    CHECK(buf != NULL);
    dp__mp_reader r;
    dp_detail d;
    size_t n = nested_arrays(buf, DP_MP_MAX_DEPTH);
    dp__mp_reader_init(&r, buf, n);
    CHECK_OK_D(dp__mp_skip(&r, &d), &d);
    CHECK_EQ(dp__mp_remaining(&r), 0);
    n = nested_arrays(buf, DP_MP_MAX_DEPTH + 1);
    dp__mp_reader_init(&r, buf, n);
    CHECK_ERR(dp__mp_skip(&r, &d), DP_EPROTO);
    CHECK_CONTAINS(d.msg, "nested deeper than");
    CHECK_EQ(dp__mp_offset(&r), 0);
    /* A million levels: fails fast, no recursion to overflow. */
    n = nested_arrays(buf, 1000000);
    dp__mp_reader_init(&r, buf, n);
    CHECK_ERR(dp__mp_skip(&r, &d), DP_EPROTO);
    /* Empty containers at the limit do not count as deeper. */
    n = nested_arrays(buf, DP_MP_MAX_DEPTH);
    buf[DP_MP_MAX_DEPTH] = 0x90;
    dp__mp_reader_init(&r, buf, n);
    CHECK_OK(dp__mp_skip(&r, &d));
    /* Maps nest too. */
    for (unsigned i = 0; i <= DP_MP_MAX_DEPTH; i++) {
        buf[2 * i] = 0x81;
        buf[2 * i + 1] = 0xc0;
    }
    buf[2 * (DP_MP_MAX_DEPTH + 1)] = 0xc0;
    dp__mp_reader_init(&r, buf, 2 * (DP_MP_MAX_DEPTH + 1) + 1);
    CHECK_ERR(dp__mp_skip(&r, &d), DP_EPROTO);
    free(buf);
}

DP_TEST(wrong_types_name_the_value_and_keep_the_cursor)
{
    static const uint8_t neg[] = {0xff}; /* -1 */
    static const uint8_t neg64[] = {0xd3, 0x80, 0, 0, 0, 0, 0, 0, 0};
    static const uint8_t big[] = {0xcf, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
    static const uint8_t str[] = {0xa1, 'x'};
    dp__mp_reader r;
    dp_detail d;
    uint64_t u;
    int64_t i;
    bool b;
    uint32_t n;
    dp__mp_reader_init(&r, neg, sizeof neg);
    CHECK_ERR(dp__mp_read_u64(&r, &u, "nbytes", &d), DP_EPROTO);
    CHECK_CONTAINS(d.msg, "nbytes: negative integer at byte 0");
    dp__mp_reader_init(&r, neg64, sizeof neg64);
    CHECK_ERR(dp__mp_read_u64(&r, &u, "off", &d), DP_EPROTO);
    CHECK_CONTAINS(d.msg, "off: negative");
    CHECK_OK(dp__mp_read_i64(&r, &i, NULL, &d));
    CHECK(i == INT64_MIN);
    dp__mp_reader_init(&r, big, sizeof big);
    CHECK_ERR(dp__mp_read_i64(&r, &i, "x", &d), DP_EPROTO);
    CHECK_EQ(dp__mp_offset(&r), 0);
    dp__mp_reader_init(&r, str, sizeof str);
    CHECK_ERR(dp__mp_read_u64(&r, &u, "nbytes", &d), DP_EPROTO);
    CHECK_CONTAINS(d.msg, "nbytes: expected unsigned integer, got str at byte 0");
    CHECK_ERR(dp__mp_read_bool(&r, &b, NULL, &d), DP_EPROTO);
    CHECK_CONTAINS(d.msg, "expected bool, got str");
    CHECK_ERR(dp__mp_read_map(&r, &n, "args", &d), DP_EPROTO);
    CHECK_CONTAINS(d.msg, "args: expected map");
    CHECK_ERR(dp__mp_read_nil(&r, NULL, &d), DP_EPROTO);
    CHECK_EQ(dp__mp_offset(&r), 0);
    const uint8_t *p;
    CHECK_ERR(dp__mp_read_bin(&r, &p, &n, "metadata", &d), DP_EPROTO);
    CHECK_CONTAINS(d.msg, "metadata: expected bin, got str");
    double f;
    CHECK_ERR(dp__mp_read_double(&r, &f, NULL, &d), DP_EPROTO);
    CHECK_EQ(dp__mp_offset(&r), 0);
    CHECK_ERR(dp__mp_read_u64(&r, &u, NULL, NULL), DP_EPROTO); /* NULL detail is fine */
}

/* Every input of 1 or 2 bytes: skip agrees with the oracle on what is complete. */
DP_TEST(all_short_inputs_agree_with_oracle)
{
    uint8_t *h = malloc(2);
    CHECK(h != NULL);
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    for (unsigned len = 1; len <= 2; len++) {
        for (unsigned v = 0; v < (len == 1 ? 256u : 65536u); v++) {
            h[0] = (uint8_t)(len == 1 ? v : v >> 8);
            if (len == 2)
                h[1] = (uint8_t)v;
            size_t off = 0;
            msgpack_unpack_return ret =
                msgpack_unpack_next(&u, (const char *)h, len, &off);
            dp__mp_reader r;
            dp__mp_reader_init(&r, h, len);
            int rc = dp__mp_skip(&r, NULL);
            if (ret == MSGPACK_UNPACK_SUCCESS) {
                CHECKF(rc == DP_OK, "input %02x%02x len %u", h[0], len > 1 ? h[1] : 0,
                       len);
                CHECK_EQ(dp__mp_offset(&r), off);
            } else {
                CHECKF(rc == DP_EPROTO, "input %02x%02x len %u: oracle %d", h[0],
                       len > 1 ? h[1] : 0, len, (int)ret);
                CHECK_EQ(dp__mp_offset(&r), 0);
            }
        }
    }
    msgpack_unpacked_destroy(&u);
    free(h);
}

/* Random bytes: skipping and typed reads never crash or read out of bounds. */
DP_TEST(random_bytes_never_crash)
{
    uint64_t st = dp_test_seed() ^ 0x72616e64;
    uint8_t tmp[64];
    for (int iter = 0; iter < 200000; iter++) {
        size_t len = dp_test_rand(&st) % sizeof tmp;
        for (size_t i = 0; i < len; i += 8) {
            uint64_t x = dp_test_rand(&st);
            memcpy(tmp + i, &x, DP_MIN(8, len - i));
        }
        uint8_t *h = malloc(len ? len : 1);
        memcpy(h, tmp, len);
        dp__mp_reader r;
        dp__mp_reader_init(&r, h, len);
        while (dp__mp_remaining(&r) > 0 && dp__mp_skip(&r, NULL) == DP_OK) {
        }
        dp__mp_reader_init(&r, h, len);
        const char *s;
        uint32_t n;
        uint64_t u;
        int rc = DP_OK;
        while (rc == DP_OK && dp__mp_remaining(&r) > 0) {
            switch (dp__mp_peek(&r)) {
            case DP_MP_STR:
                rc = dp__mp_read_str(&r, &s, &n, NULL, NULL);
                if (rc == DP_OK)
                    CHECK((const uint8_t *)s + n <= h + len);
                break;
            case DP_MP_ARRAY:
                rc = dp__mp_read_array(&r, &n, NULL, NULL);
                if (rc == DP_OK)
                    CHECK(n <= dp__mp_remaining(&r));
                break;
            case DP_MP_MAP:
                rc = dp__mp_read_map(&r, &n, NULL, NULL);
                if (rc == DP_OK)
                    CHECK(2ull * n <= dp__mp_remaining(&r));
                break;
            case DP_MP_UINT:
                rc = dp__mp_read_u64(&r, &u, NULL, NULL);
                break;
            default:
                rc = dp__mp_skip(&r, NULL);
            }
            CHECK(rc == DP_OK || rc == DP_EPROTO);
        }
        free(h);
    }
}

/* msgpack-c's packer into a dp__buf, the reference for byte-exact encodings. */
static int
ref_write(void *data, const char *buf, size_t len)
{
    return dp__buf_append(data, buf, len) == DP_OK ? 0 : -1;
}

DP_TEST(writer_matches_msgpack_c_byte_for_byte)
{
    dp__buf ours, ref;
    dp__buf_init(&ours);
    dp__buf_init(&ref);
    dp__mp_writer w;
    dp__mp_writer_init(&w, &ours);
    msgpack_packer refpk;
    msgpack_packer_init(&refpk, &ref, ref_write);
    static const uint64_t us[] = {0,     1,     127,         128,        255,       256,
                                  65535, 65536, 4294967295u, 4294967296, UINT64_MAX};
    static const int64_t is[] = {-1,        -32,       -33,
                                 -128,      -129,      -32768,
                                 -32769,    INT32_MIN, (int64_t)INT32_MIN - 1,
                                 INT64_MIN, 5,         70000};
    static const size_t lens[] = {0, 1, 15, 16, 31, 32, 255, 256, 65535, 65536, 70000};
    for (size_t i = 0; i < DP_ARRAY_LEN(us); i++) {
        dp__mp_put_u64(&w, us[i]);
        msgpack_pack_uint64(&refpk, us[i]);
    }
    for (size_t i = 0; i < DP_ARRAY_LEN(is); i++) {
        dp__mp_put_i64(&w, is[i]);
        msgpack_pack_int64(&refpk, is[i]);
    }
    char *blob = calloc(1, 70000);
    CHECK(blob != NULL);
    for (size_t i = 0; i < DP_ARRAY_LEN(lens); i++) {
        size_t n = lens[i];
        dp__mp_put_strn(&w, blob, n);
        msgpack_pack_str(&refpk, n);
        msgpack_pack_str_body(&refpk, blob, n);
        dp__mp_put_bin(&w, blob, n);
        msgpack_pack_bin(&refpk, n);
        msgpack_pack_bin_body(&refpk, blob, n);
        dp__mp_put_array(&w, (uint32_t)n);
        msgpack_pack_array(&refpk, n);
        dp__mp_put_map(&w, (uint32_t)n);
        msgpack_pack_map(&refpk, n);
    }
    free(blob);
    dp__mp_put_nil(&w);
    msgpack_pack_nil(&refpk);
    dp__mp_put_bool(&w, true);
    msgpack_pack_true(&refpk);
    dp__mp_put_bool(&w, false);
    msgpack_pack_false(&refpk);
    dp__mp_put_double(&w, -1.5e300);
    msgpack_pack_double(&refpk, -1.5e300);
    dp__mp_put_str(&w, "abc");
    msgpack_pack_str_with_body(&refpk, "abc", 3);
    CHECK_OK(dp__mp_writer_status(&w));
    CHECK_EQ(ours.len, ref.len);
    for (size_t i = 0; i < ours.len; i++)
        CHECKF(ours.data[i] == ref.data[i], "byte %zu: 0x%02x != 0x%02x", i, ours.data[i],
               ref.data[i]);
    dp__buf_fini(&ours);
    dp__buf_fini(&ref);
}
