/*
 * Tests for src/blob/keys: "<gidx>@<field>" make, split and field rules.
 */
#include "dp_test.h"

#include "blob/keys.h"
#include "common/common.h"

struct good_key {
    const char *key;
    uint64_t gidx;
    const char *field;
};

static const struct good_key good_keys[] = {
    {"0@a", 0, "a"},
    {"17@input_ids", 17, "input_ids"},
    {"1@obs/image", 1, "obs/image"},
    {"2@..", 2, ".."},
    {"3@a b", 3, "a b"},
    {"4@ ", 4, " "},
    {"5@caf\xc3\xa9", 5, "caf\xc3\xa9"},
    {"6@\xe6\x97\xa5\xe6\x9c\xac", 6, "\xe6\x97\xa5\xe6\x9c\xac"}, /* 3-byte UTF-8 */
    {"7@\xf0\x9f\x98\x80", 7, "\xf0\x9f\x98\x80"},                 /* 4-byte UTF-8 */
    {"8@\xc2\xa0", 8, "\xc2\xa0"},                                 /* U+00A0, after C1 */
    {"9@\xed\x9f\xbf", 9, "\xed\x9f\xbf"},                         /* U+D7FF */
    {"10@\xf4\x8f\xbf\xbf", 10, "\xf4\x8f\xbf\xbf"},               /* U+10FFFF */
    {"18446744073709551615@x", UINT64_MAX, "x"},
    {"18446744073709551614@x", UINT64_MAX - 1, "x"},
    {"9999999999999999999@x", 9999999999999999999ull, "x"},
    {"12345@log-probs.v2", 12345, "log-probs.v2"},
};

struct bad_key {
    const char *key;
    const char *why; /* a piece of the expected detail */
};

static const struct bad_key bad_keys[] = {
    {"", "no '@'"},
    {"12", "no '@'"},
    {"abc", "no '@'"},
    {"@a", "gidx is empty"},
    {"1@", "field is empty"},
    {"01@a", "leading zero"},
    {"00@a", "leading zero"},
    {"+1@a", "not a decimal number"},
    {"-1@a", "not a decimal number"},
    {" 1@a", "not a decimal number"},
    {"1 @a", "not a decimal number"},
    {"12x@a", "gidx is not a decimal number"},
    {"0x1@a", "not a decimal number"},
    {"1.0@a", "not a decimal number"},
    {"18446744073709551616@a", "does not fit in 64 bits"},
    {"99999999999999999999@a", "does not fit in 64 bits"},
    {"100000000000000000000@a", "does not fit in 64 bits"},
    {"1@a@b", "'@'"},
    {"1@@", "'@'"},
    {"1@a\tb", "control character 0x09"},
    {"1@a\nb", "control character 0x0a"},
    {"1@\x7f", "control character 0x7f"},
    {"1@\x1b[0m", "control character 0x1b"},
    {"1@\xc2\x85", "control character U+0085"}, /* C1 NEL */
    {"1@\xc2\x9f", "control character U+009F"},
    {"1@\xff", "not valid UTF-8"},
    {"1@\x80", "not valid UTF-8"},
    {"1@\xc0\xaf", "not valid UTF-8"},         /* overlong '/' */
    {"1@\xc1\xbf", "not valid UTF-8"},         /* overlong */
    {"1@\xe0\x80\xaf", "not valid UTF-8"},     /* overlong 3-byte */
    {"1@\xf0\x80\x80\xaf", "not valid UTF-8"}, /* overlong 4-byte */
    {"1@\xed\xa0\x80", "not valid UTF-8"},     /* surrogate U+D800 */
    {"1@\xf4\x90\x80\x80", "not valid UTF-8"}, /* U+110000 */
    {"1@\xf5\x80\x80\x80", "not valid UTF-8"},
    {"1@\xc3", "truncated sequence"},
    {"1@a\xe6\x97", "truncated sequence"},
    {"1@\xc3\x28", "not valid UTF-8"}, /* bad continuation */
    {"1@\xe6\x28\xa1", "not valid UTF-8"},
};

DP_TEST(good_keys_split)
{
    for (size_t i = 0; i < DP_ARRAY_LEN(good_keys); i++) {
        const struct good_key *g = &good_keys[i];
        dp__key_parts kp;
        dp_detail d;
        dp_detail_clear(&d);
        CHECK_OK_D(dp__key_split(g->key, strlen(g->key), &kp, &d), &d);
        CHECK_EQ_U64(kp.gidx, g->gidx);
        CHECK_EQ(kp.field_len, strlen(g->field));
        CHECK(memcmp(kp.field, g->field, kp.field_len) == 0);
        /* the one-pass split of a NUL-terminated key agrees */
        dp__key_parts kz;
        size_t kl = 0;
        CHECK_OK_D(dp__key_split_z(g->key, &kl, &kz, &d), &d);
        CHECK_EQ(kl, strlen(g->key));
        CHECK_EQ_U64(kz.gidx, kp.gidx);
        CHECK(kz.field == kp.field && kz.field_len == kp.field_len);
        CHECK(dp__field_valid(g->field, strlen(g->field)));
        /* make gives back the same spelling */
        char buf[DP_KEY_MAX + 1];
        size_t n = 0;
        CHECK_OK_D(
            dp__key_make(g->gidx, g->field, strlen(g->field), buf, sizeof buf, &n, &d),
            &d);
        CHECK_EQ(n, strlen(g->key));
        CHECK_STR(buf, g->key);
        /* format (unchecked) spells it the same */
        char buf2[DP_KEY_MAX + 1];
        memset(buf2, 'x', sizeof buf2);
        CHECK_EQ(dp__key_format(g->gidx, g->field, strlen(g->field), buf2), n);
        CHECK_STR(buf2, g->key);
    }
}

DP_TEST(bad_keys_rejected_with_reason)
{
    for (size_t i = 0; i < DP_ARRAY_LEN(bad_keys); i++) {
        const struct bad_key *b = &bad_keys[i];
        dp__key_parts kp;
        dp_detail d;
        dp_detail_clear(&d);
        int rc = dp__key_split(b->key, strlen(b->key), &kp, &d);
        CHECKF(rc == DP_EINVAL, "key #%zu: got %s", i, dp_errname(rc));
        CHECK_EQ(d.code, DP_EINVAL);
        CHECK_CONTAINS(d.msg, b->why);
        CHECK_CONTAINS(d.msg, "key '");
        /* NULL detail is fine too */
        CHECK_ERR(dp__key_split(b->key, strlen(b->key), &kp, NULL), DP_EINVAL);
        /* the one-pass split refuses it with the same words */
        dp_detail dz;
        size_t kl = 0;
        CHECKF(dp__key_split_z(b->key, &kl, &kp, &dz) == DP_EINVAL, "key #%zu", i);
        CHECK_STR(dz.msg, d.msg);
        CHECK_EQ(kl, strlen(b->key));
    }
}

DP_TEST(detail_names_the_key)
{
    dp_detail d;
    dp__key_parts kp;
    CHECK_ERR(dp__key_split("12x@a", 5, &kp, &d), DP_EINVAL);
    CHECK_STR(d.msg, "key '12x@a': gidx is not a decimal number");
    /* unprintable bytes are escaped in the message */
    CHECK_ERR(dp__key_split("1@a\nb", 5, &kp, &d), DP_EINVAL);
    CHECK_CONTAINS(d.msg, "key '1@a\\x0ab'");
    CHECK_ERR(dp__key_split("1@\xff", 3, &kp, &d), DP_EINVAL);
    CHECK_CONTAINS(d.msg, "'1@\\xff'");
}

DP_TEST(embedded_nul_rejected)
{
    dp__key_parts kp;
    dp_detail d;
    CHECK_ERR_D(dp__key_split("1@a\0b", 5, &kp, &d), DP_EINVAL, &d);
    CHECK_CONTAINS(d.msg, "control character 0x00");
    CHECK_ERR(dp__key_split("1\0@a", 4, &kp, &d), DP_EINVAL);
    CHECK_CONTAINS(d.msg, "not a decimal number");
    CHECK_ERR(dp__key_split("1@\0", 3, &kp, &d), DP_EINVAL);
}

DP_TEST(field_length_limits)
{
    char key[600];
    dp__key_parts kp;
    dp_detail d;
    /* "7@" + 255 bytes: ok; 256: rejected. */
    strcpy(key, "7@");
    memset(key + 2, 'f', 256);
    CHECK_OK_D(dp__key_split(key, 2 + 255, &kp, &d), &d);
    CHECK_EQ(kp.field_len, 255);
    CHECK_ERR(dp__key_split(key, 2 + 256, &kp, &d), DP_EINVAL);
    CHECK_CONTAINS(d.msg, "longer than 255");
    /* the same through the one-pass split of NUL-terminated keys */
    size_t kl = 0;
    key[2 + 255] = '\0';
    CHECK_OK_D(dp__key_split_z(key, &kl, &kp, &d), &d);
    CHECK(kl == 2 + 255 && kp.field_len == 255);
    key[2 + 255] = 'f';
    key[2 + 256] = '\0';
    CHECK_ERR(dp__key_split_z(key, &kl, &kp, &d), DP_EINVAL);
    CHECK_CONTAINS(d.msg, "longer than 255");
    /* Longest possible key: 20 digits + '@' + 255. */
    memcpy(key, "18446744073709551615@", 21);
    memset(key + 21, 'g', 255);
    CHECK_OK_D(dp__key_split(key, DP_KEY_MAX, &kp, &d), &d);
    CHECK_EQ_U64(kp.gidx, UINT64_MAX);
    CHECK_ERR(dp__key_split(key, DP_KEY_MAX + 1, &kp, &d), DP_EINVAL);
    CHECK_EQ(DP_KEY_MAX, 276);
    /* 255 bytes made of 2-byte characters is 254 bytes + one more ASCII */
    char f[300];
    for (int i = 0; i < 127; i++) {
        f[2 * i] = '\xc3';
        f[2 * i + 1] = '\xa9';
    }
    f[254] = 'z';
    CHECK(dp__field_valid(f, 255));
    /* a multibyte character cut by the end of the field */
    CHECK(!dp__field_valid(f, 253));
    CHECK(!dp__field_valid(f, 0));
    CHECK_ERR(dp__field_check(f, 256, &d), DP_EINVAL);
}

DP_TEST(split_does_not_read_past_len)
{
    /* The key sits at the very end of a heap block, no NUL after it: ASan
     * catches any read past len. */
    const char *src = "42@reward";
    size_t n = strlen(src);
    char *k = malloc(n);
    memcpy(k, src, n);
    dp__key_parts kp;
    CHECK_OK(dp__key_split(k, n, &kp, NULL));
    CHECK_EQ_U64(kp.gidx, 42);
    CHECK_EQ(kp.field_len, 6);
    CHECK(kp.field == k + 3);
    /* every prefix is either a valid key or rejected, never read past */
    for (size_t len = 0; len <= n; len++) {
        char *p = malloc(len ? len : 1);
        memcpy(p, src, len);
        int rc = dp__key_split(p, len, &kp, NULL);
        CHECK(rc == (len >= 4 ? DP_OK : DP_EINVAL));
        free(p);
    }
    free(k);
}

DP_TEST(first_at_splits)
{
    dp__key_parts kp;
    dp_detail d;
    /* the gidx part ends at the first '@'; a second one lands in the field */
    CHECK_ERR(dp__key_split("5@x@y", 5, &kp, &d), DP_EINVAL);
    CHECK_CONTAINS(d.msg, "field has '@' at byte 1");
    CHECK_ERR(dp__key_split("5@@", 3, &kp, &d), DP_EINVAL);
}

DP_TEST(make_checks_field_and_buffer)
{
    char buf[DP_KEY_MAX + 1];
    size_t n;
    dp_detail d;
    CHECK_ERR(dp__key_make(1, "a@b", 3, buf, sizeof buf, &n, &d), DP_EINVAL);
    CHECK_CONTAINS(d.msg, "'@'");
    CHECK_STR(buf, "");
    CHECK_ERR(dp__key_make(1, "", 0, buf, sizeof buf, &n, &d), DP_EINVAL);
    CHECK_ERR(dp__key_make(1, "a\x01", 2, buf, sizeof buf, &n, &d), DP_EINVAL);
    /* exact fit: "123@ab" + NUL = 7 */
    CHECK_OK(dp__key_make(123, "ab", 2, buf, 7, &n, &d));
    CHECK_STR(buf, "123@ab");
    CHECK_ERR(dp__key_make(123, "ab", 2, buf, 6, &n, &d), DP_EINVAL);
    CHECK_CONTAINS(d.msg, "too small");
    CHECK_ERR(dp__key_make(123, "ab", 2, NULL, 0, &n, &d), DP_EINVAL);
    /* field need not be NUL-terminated */
    CHECK_OK(dp__key_make(0, "abcdef", 3, buf, sizeof buf, NULL, &d));
    CHECK_STR(buf, "0@abc");
    /* largest key fits in DP_KEY_MAX + 1 */
    char f[DP_FIELD_MAX];
    memset(f, 'q', sizeof f);
    CHECK_OK(dp__key_make(UINT64_MAX, f, sizeof f, buf, sizeof buf, &n, &d));
    CHECK_EQ(n, DP_KEY_MAX);
}

DP_TEST(gidx_parse)
{
    uint64_t v;
    dp_detail d;
    CHECK_OK(dp__gidx_parse("0", 1, &v, &d));
    CHECK_EQ_U64(v, 0);
    CHECK_OK(dp__gidx_parse("18446744073709551615", 20, &v, &d));
    CHECK_EQ_U64(v, UINT64_MAX);
    CHECK_ERR(dp__gidx_parse("18446744073709551616", 20, &v, &d), DP_EINVAL);
    CHECK_CONTAINS(d.msg, "64 bits");
    CHECK_ERR(dp__gidx_parse("", 0, &v, &d), DP_EINVAL);
    CHECK_ERR(dp__gidx_parse("007", 3, &v, &d), DP_EINVAL);
    CHECK_ERR(dp__gidx_parse("7 ", 2, &v, &d), DP_EINVAL);
    /* only len bytes count */
    CHECK_OK(dp__gidx_parse("12junk", 2, &v, &d));
    CHECK_EQ_U64(v, 12);
}

DP_TEST(random_keys_round_trip)
{
    uint64_t s = dp_test_seed();
    for (int it = 0; it < 20000; it++) {
        uint64_t gidx = dp_test_rand(&s);
        if (it % 3 == 0)
            gidx %= 1000;
        /* random field of printable ASCII without '@' and some 2-byte chars */
        char f[DP_FIELD_MAX];
        size_t n = 1 + dp_test_rand(&s) % DP_FIELD_MAX, i = 0;
        while (i < n) {
            if (i + 2 <= n && dp_test_rand(&s) % 8 == 0) {
                f[i++] = '\xd0';
                f[i++] = (char)(0x80 + dp_test_rand(&s) % 64);
            } else {
                char c = (char)(0x20 + dp_test_rand(&s) % 95);
                f[i++] = c == '@' ? '_' : c;
            }
        }
        char buf[DP_KEY_MAX + 1];
        size_t klen;
        dp_detail d;
        CHECK_OK_D(dp__key_make(gidx, f, n, buf, sizeof buf, &klen, &d), &d);
        dp__key_parts kp;
        CHECK_OK_D(dp__key_split(buf, klen, &kp, &d), &d);
        CHECK_EQ_U64(kp.gidx, gidx);
        CHECK_EQ(kp.field_len, n);
        CHECK(memcmp(kp.field, f, n) == 0);
    }
}

DP_TEST(random_bytes_never_crash)
{
    /* Random short byte strings: split either succeeds with a field that
     * passes dp__field_valid, or fails with DP_EINVAL. */
    uint64_t s = dp_test_seed();
    static const char alphabet[] = "0123456789@@ab\x00\x7f\xc3\xa9\xff\x80 +-";
    for (int it = 0; it < 50000; it++) {
        size_t n = dp_test_rand(&s) % 12;
        char *k = malloc(n ? n : 1);
        for (size_t i = 0; i < n; i++)
            k[i] = alphabet[dp_test_rand(&s) % (sizeof alphabet - 1)];
        dp__key_parts kp;
        int rc = dp__key_split(k, n, &kp, NULL);
        CHECK(rc == DP_OK || rc == DP_EINVAL);
        if (rc == DP_OK) {
            CHECK(dp__field_valid(kp.field, kp.field_len));
            char buf[DP_KEY_MAX + 1];
            size_t m;
            CHECK_OK(
                dp__key_make(kp.gidx, kp.field, kp.field_len, buf, sizeof buf, &m, NULL));
            CHECK(m == n && memcmp(buf, k, n) == 0); /* one spelling per key */
        }
        free(k);
    }
}

DP_TEST(quote_bytes_cuts_and_escapes)
{
    char out[32];
    CHECK_STR(dp__quote_bytes("ab'\\\x01", 5, 100, out, sizeof out), "ab\\'\\\\\\x01");
    CHECK_STR(dp__quote_bytes("abcdefgh", 8, 4, out, sizeof out), "abcd...");
    char small[8];
    dp__quote_bytes("abcdefghijkl", 12, 100, small, sizeof small);
    CHECK(strlen(small) < sizeof small);
    CHECK_CONTAINS(small, "...");
}
