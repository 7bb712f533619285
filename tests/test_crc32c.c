/*
 * Tests for src/blob/crc32c: known vectors, hardware == table on random
 * buffers at random alignments, incremental == one-shot, combine.
 */
#include "dp_test.h"

#include "blob/crc32c.h"
#include "common/common.h"

typedef uint32_t (*crc_fn)(uint32_t, const void *, size_t);

static const struct {
    const char *name;
    crc_fn fn;
} impls[] = {
    {"dispatch", dp__crc32c_update},
    {"table", dp__crc32c_update_table},
    {"hw", dp__crc32c_update_hw},
};

DP_TEST(known_vectors)
{
    uint8_t zeros[32], ones[32], inc[32], dec[32];
    for (int i = 0; i < 32; i++) {
        zeros[i] = 0;
        ones[i] = 0xff;
        inc[i] = (uint8_t)i;
        dec[i] = (uint8_t)(31 - i);
    }
    fprintf(stderr, "  crc32c implementation: %s\n", dp__crc32c_impl());
    for (size_t k = 0; k < DP_ARRAY_LEN(impls); k++) {
        crc_fn f = impls[k].fn;
        CHECK_EQ_U64(f(0, "123456789", 9), 0xE3069283u);
        CHECK_EQ_U64(f(0, "", 0), 0);
        CHECK_EQ_U64(f(0, NULL, 0), 0);
        CHECK_EQ_U64(f(0, "a", 1), 0xC1D04330u);
        /* RFC 3720 (iSCSI) appendix B.4 */
        CHECK_EQ_U64(f(0, zeros, 32), 0x8A9136AAu);
        CHECK_EQ_U64(f(0, ones, 32), 0x62A8AB43u);
        CHECK_EQ_U64(f(0, inc, 32), 0x46DD794Eu);
        CHECK_EQ_U64(f(0, dec, 32), 0x113FDB5Cu);
        const char *fox = "The quick brown fox jumps over the lazy dog";
        CHECK_EQ_U64(f(0, fox, strlen(fox)), 0x22620404u);
    }
    CHECK_EQ_U64(dp__crc32c("123456789", 9), 0xE3069283u);
}

DP_TEST(hw_equals_table_random)
{
    uint64_t s = dp_test_seed();
    enum { MAX = 40000 };
    uint8_t *buf = malloc(MAX + 64);
    for (size_t i = 0; i < MAX + 64; i++)
        buf[i] = (uint8_t)dp_test_rand(&s);
    for (int it = 0; it < 4000; it++) {
        size_t align = dp_test_rand(&s) % 64;
        /* mostly 0..several KiB, sometimes long enough for the 3 x 4 KiB blocks */
        size_t n = it % 10 == 0 ? dp_test_rand(&s) % MAX : dp_test_rand(&s) % 5000;
        uint32_t seed_crc = it % 2 ? (uint32_t)dp_test_rand(&s) : 0;
        uint32_t a = dp__crc32c_update_table(seed_crc, buf + align, n);
        uint32_t b = dp__crc32c_update_hw(seed_crc, buf + align, n);
        CHECKF(a == b, "align %zu len %zu: table 0x%08x hw 0x%08x", align, n, a, b);
    }
    free(buf);
}

DP_TEST(block_boundaries)
{
    /* Lengths around the interleaved block sizes (3 x 256, 3 x 4096). */
    enum { MAX = 3 * 4096 * 3 + 200 };
    uint8_t *buf = malloc(MAX);
    uint64_t s = 12345;
    for (size_t i = 0; i < MAX; i++)
        buf[i] = (uint8_t)dp_test_rand(&s);
    static const size_t centers[] = {8, 768, 1536, 12288, 24576, 12288 + 768};
    for (size_t c = 0; c < DP_ARRAY_LEN(centers); c++) {
        for (size_t n = centers[c] - 8; n <= centers[c] + 16; n++) {
            for (size_t off = 0; off < 9; off++) {
                uint32_t a = dp__crc32c_update_table(0, buf + off, n);
                uint32_t b = dp__crc32c_update_hw(0, buf + off, n);
                CHECKF(a == b, "off %zu len %zu: table 0x%08x hw 0x%08x", off, n, a, b);
            }
        }
    }
    free(buf);
}

DP_TEST(incremental_equals_one_shot)
{
    uint64_t s = dp_test_seed();
    enum { MAX = 70000 };
    uint8_t *buf = malloc(MAX);
    for (size_t i = 0; i < MAX; i++)
        buf[i] = (uint8_t)dp_test_rand(&s);
    for (int it = 0; it < 300; it++) {
        size_t n = dp_test_rand(&s) % MAX;
        uint32_t whole = dp__crc32c(buf, n);
        for (size_t k = 0; k < DP_ARRAY_LEN(impls); k++) {
            uint32_t crc = 0;
            size_t pos = 0;
            while (pos < n) {
                size_t step = dp_test_rand(&s) % (it % 2 ? 50 : 9000) + 1;
                if (step > n - pos)
                    step = n - pos;
                crc = impls[k].fn(crc, buf + pos, step);
                pos += step;
            }
            CHECKF(crc == whole, "%s len %zu: 0x%08x != 0x%08x", impls[k].name, n, crc,
                   whole);
        }
        /* combine of two halves */
        size_t cut = n ? dp_test_rand(&s) % (n + 1) : 0;
        uint32_t ca = dp__crc32c(buf, cut), cb = dp__crc32c(buf + cut, n - cut);
        CHECK_EQ_U64(dp__crc32c_combine(ca, cb, n - cut), whole);
    }
    free(buf);
}

DP_TEST(detects_single_bit_flips)
{
    uint8_t buf[4096];
    uint64_t s = dp_test_seed();
    for (size_t i = 0; i < sizeof buf; i++)
        buf[i] = (uint8_t)dp_test_rand(&s);
    uint32_t ref = dp__crc32c(buf, sizeof buf);
    for (int it = 0; it < 2000; it++) {
        size_t bit = dp_test_rand(&s) % (8 * sizeof buf);
        buf[bit / 8] ^= (uint8_t)(1u << (bit % 8));
        CHECK(dp__crc32c(buf, sizeof buf) != ref);
        buf[bit / 8] ^= (uint8_t)(1u << (bit % 8));
    }
    CHECK_EQ_U64(dp__crc32c(buf, sizeof buf), ref);
}
