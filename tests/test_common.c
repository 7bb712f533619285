/*
 * Tests for src/common: error codes and details, buffers, size parsing, ids.
 */
#include "dp_test.h"

#include "common/common.h"

DP_TEST(strerror_covers_every_code)
{
    CHECK_STR(dp_strerror(DP_OK), "success");
    static const int codes[] = {
#define TC_CODE_(name, value, msg) name,
        DP_ERRORS(TC_CODE_)
#undef TC_CODE_
    };
    for (size_t i = 0; i < DP_ARRAY_LEN(codes); i++) {
        CHECK(strcmp(dp_strerror(codes[i]), "unknown error code") != 0);
        CHECK(strncmp(dp_errname(codes[i]), "DP_E", 4) == 0);
    }
    CHECK_STR(dp_errname(DP_EINVAL), "DP_EINVAL");
    CHECK_STR(dp_errname(DP_ESYS), "DP_ESYS");
    CHECK_STR(dp_strerror(-1), "unknown error code");
    CHECK_STR(dp_strerror(DP_ERR_LAST), "unknown error code");
}

DP_TEST(detail_fail_and_context)
{
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_STR(dp_detail_msg(&d), "");
    CHECK_STR(dp_detail_msg(NULL), "");
    CHECK_EQ(dp__fail(NULL, DP_EINVAL, "x"), DP_EINVAL);
    CHECK_EQ(dp__fail(&d, DP_EINVAL, "bad key '%s'", "1@"), DP_EINVAL);
    CHECK_EQ(d.code, DP_EINVAL);
    CHECK_STR(d.msg, "bad key '1@'");
    CHECK_EQ(dp__fail_ctx(&d, DP_EPROTO, "unit %d", 3), DP_EINVAL);
    CHECK_STR(d.msg, "unit 3: bad key '1@'");
    dp_detail_clear(&d);
    CHECK_EQ(dp__fail_ctx(&d, DP_EPROTO, "commit"), DP_EPROTO);
    CHECK_STR(d.msg, "commit: protocol error");
    CHECK_EQ(dp__fail_sys(&d, 2, "open %s", "/x"), DP_ESYS);
    CHECK_EQ(d.sys_errno, 2);
    CHECK_CONTAINS(d.msg, "open /x: No such file");
}

DP_TEST(buf_grows_and_steals)
{
    dp__buf b;
    dp__buf_init(&b);
    for (int i = 0; i < 1000; i++)
        CHECK_OK(dp__buf_append(&b, "abcd", 4));
    CHECK_EQ(b.len, 4000);
    CHECK_OK(dp__buf_printf(&b, "%d-%s", 42, "z"));
    CHECK_EQ(b.len, 4004);
    CHECK(memcmp(b.data + 4000, "42-z", 4) == 0);
    size_t n = 0;
    uint8_t *p = dp__buf_steal(&b, &n);
    CHECK_EQ(n, 4004);
    CHECK(b.data == NULL && b.len == 0);
    free(p);
    dp__buf_fini(&b);
}

DP_TEST(parse_size_accepts_units)
{
    uint64_t v = 0;
    dp_detail d;
    CHECK_OK_D(dp__parse_size("123", &v, "--slab", &d), &d);
    CHECK_EQ_U64(v, 123);
    CHECK_OK_D(dp__parse_size("64K", &v, "--slab", &d), &d);
    CHECK_EQ_U64(v, 65536);
    CHECK_OK_D(dp__parse_size("1.5G", &v, "--slab", &d), &d);
    CHECK_EQ_U64(v, 1536ull << 20);
    CHECK_OK_D(dp__parse_size("2GiB", &v, "--slab", &d), &d);
    CHECK_EQ_U64(v, 2ull << 30);
    CHECK_OK_D(dp__parse_size("512mb", &v, "--slab", &d), &d);
    CHECK_EQ_U64(v, 512ull << 20);
    CHECK_OK_D(dp__parse_size("1T", &v, "--slab", &d), &d);
    CHECK_EQ_U64(v, 1ull << 40);
}

DP_TEST(parse_size_rejects_junk)
{
    uint64_t v = 7;
    dp_detail d;
    const char *bad[] = {"",    "-1",  "+5", "1X",    "1GG",
                         "abc", "1.3", " 1", "1e400", "99999999999999999999999T"};
    for (size_t i = 0; i < DP_ARRAY_LEN(bad); i++) {
        CHECK_ERR_D(dp__parse_size(bad[i], &v, "--slab", &d), DP_EINVAL, &d);
        CHECK_CONTAINS(d.msg, "--slab");
    }
    CHECK_EQ_U64(v, 7);
}

DP_TEST(parse_u64_and_seconds)
{
    uint64_t v;
    double s;
    dp_detail d;
    CHECK_OK(dp__parse_u64("18446744073709551615", 0, UINT64_MAX, &v, "n", &d));
    CHECK_EQ_U64(v, UINT64_MAX);
    CHECK_ERR(dp__parse_u64("18446744073709551616", 0, UINT64_MAX, &v, "n", &d),
              DP_EINVAL);
    CHECK_ERR(dp__parse_u64("5", 6, 9, &v, "n", &d), DP_EINVAL);
    CHECK_CONTAINS(d.msg, "outside [6, 9]");
    CHECK_ERR(dp__parse_u64("-5", 0, 9, &v, "n", &d), DP_EINVAL);
    CHECK_OK(dp__parse_seconds("2.5", &s, "t", &d));
    CHECK(s == 2.5);
    CHECK_ERR(dp__parse_seconds("-1", &s, "t", &d), DP_EINVAL);
    CHECK_ERR(dp__parse_seconds("nan", &s, "t", &d), DP_EINVAL);
    CHECK_ERR(dp__parse_seconds("1s", &s, "t", &d), DP_EINVAL);
}

DP_TEST(random_ids_differ)
{
    char a[33], b[33];
    CHECK_OK(dp__random_hex_id(a, NULL));
    CHECK_OK(dp__random_hex_id(b, NULL));
    CHECK_EQ(strlen(a), 32);
    CHECK(strcmp(a, b) != 0);
}

DP_TEST(fmt_size)
{
    char buf[32];
    CHECK_STR(dp__fmt_size(512, buf, sizeof buf), "512 B");
    CHECK_STR(dp__fmt_size(3ull << 29, buf, sizeof buf), "1.50 GiB");
}
