/*
 * CRC32C: SSE4.2 crc32 instruction with runtime dispatch, slicing-by-8 table
 * fallback (see crc32c.h).
 *
 * Design notes
 * - Arithmetic is in the reflected domain: bit 31 of a register is the
 *   coefficient of x^0, bit 0 that of x^31. The "register" is the CRC before
 *   the final inversion; finished CRCs are ~register.
 * - The register update is linear: feeding A || B from register r gives
 *   shift(run(r, A), |B|) ^ run(0, B), where shift(r, n) = r * x^(8n) mod P
 *   is what feeding n zero bytes does. The hardware path uses that to run
 *   three independent streams over three consecutive chunks of a block (the
 *   crc32 instruction has a latency of 3 cycles and a throughput of 1, so one
 *   stream leaves two thirds of the unit idle) and merges them with
 *   shift-by-chunk tables: 4 x 256 entries per chunk size, applied a byte of
 *   the register at a time.
 * - Tables are built once (pthread_once) on first use.
 */
#include "blob/crc32c.h"

#include <pthread.h>
#include <string.h>

#include "common/le.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define CRC_HAVE_X86 1
#include <nmmintrin.h>
#else
#define CRC_HAVE_X86 0
#endif

#define POLY 0x82f63b78u

/* Chunk sizes of the interleaved hardware path: blocks of 3 x LONG, then 3 x SHORT. */
#define CHUNK_LONG 4096
#define CHUNK_SHORT 256

static uint32_t table[8][256];
static uint32_t shift_long[4][256];
static uint32_t shift_short[4][256];
static bool have_hw;
static pthread_once_t crc_once = PTHREAD_ONCE_INIT;

/* a * b mod P, reflected. */
static uint32_t
multmodp(uint32_t a, uint32_t b)
{
    uint32_t prod = 0;
    for (uint32_t m = 1u << 31; m != 0; m >>= 1) {
        if (a & m)
            prod ^= b;
        b = (b & 1) ? (b >> 1) ^ POLY : b >> 1;
    }
    return prod;
}

/* x^(8n) mod P, reflected. */
static uint32_t
x8n_modp(uint64_t n)
{
    uint32_t result = 1u << 31; /* x^0 */
    uint32_t base = 1u << 23;   /* x^8 */
    while (n != 0) {
        if (n & 1)
            result = multmodp(base, result);
        base = multmodp(base, base);
        n >>= 1;
    }
    return result;
}

static void
shift_table_init(uint32_t t[4][256], uint64_t nbytes)
{
    uint32_t k = x8n_modp(nbytes);
    for (unsigned byte = 0; byte < 4; byte++)
        for (unsigned v = 0; v < 256; v++)
            t[byte][v] = multmodp(k, (uint32_t)v << (8 * byte));
}

static inline uint32_t
shift_apply(const uint32_t t[4][256], uint32_t r)
{
    return t[0][r & 0xff] ^ t[1][(r >> 8) & 0xff] ^ t[2][(r >> 16) & 0xff] ^
           t[3][r >> 24];
}

static void
crc_init(void)
{
    for (unsigned i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = (c & 1) ? (c >> 1) ^ POLY : c >> 1;
        table[0][i] = c;
    }
    for (unsigned i = 0; i < 256; i++)
        for (unsigned k = 1; k < 8; k++)
            table[k][i] = (table[k - 1][i] >> 8) ^ table[0][table[k - 1][i] & 0xff];
    shift_table_init(shift_long, CHUNK_LONG);
    shift_table_init(shift_short, CHUNK_SHORT);
#if CRC_HAVE_X86
    __builtin_cpu_init();
    have_hw = __builtin_cpu_supports("sse4.2");
#endif
}

static inline void
crc_setup(void)
{
    pthread_once(&crc_once, crc_init);
}

static uint32_t
table_run(uint32_t r, const uint8_t *p, size_t n)
{
    while (n > 0 && ((uintptr_t)p & 7) != 0) {
        r = table[0][(r ^ *p++) & 0xff] ^ (r >> 8);
        n--;
    }
    while (n >= 8) {
        uint32_t lo = r ^ dp__le32_load(p), hi = dp__le32_load(p + 4);
        r = table[7][lo & 0xff] ^ table[6][(lo >> 8) & 0xff] ^
            table[5][(lo >> 16) & 0xff] ^ table[4][lo >> 24] ^ table[3][hi & 0xff] ^
            table[2][(hi >> 8) & 0xff] ^ table[1][(hi >> 16) & 0xff] ^ table[0][hi >> 24];
        p += 8;
        n -= 8;
    }
    while (n > 0) {
        r = table[0][(r ^ *p++) & 0xff] ^ (r >> 8);
        n--;
    }
    return r;
}

uint32_t
dp__crc32c_update_table(uint32_t crc, const void *p, size_t n)
{
    crc_setup();
    if (n == 0)
        return crc;
    return ~table_run(~crc, p, n);
}

#if CRC_HAVE_X86
static inline uint64_t
load64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* Three streams over chunks of len bytes at p, p + len, p + 2 len; len % 8 == 0. */
__attribute__((target("sse4.2"))) static inline uint64_t
hw_block(uint64_t r, const uint8_t *p, size_t len, const uint32_t t[4][256])
{
    uint64_t r1 = 0, r2 = 0;
    const uint8_t *end = p + len;
    do {
        r = _mm_crc32_u64(r, load64(p));
        r1 = _mm_crc32_u64(r1, load64(p + len));
        r2 = _mm_crc32_u64(r2, load64(p + 2 * len));
        p += 8;
    } while (p < end);
    r = shift_apply(t, (uint32_t)r) ^ (uint32_t)r1;
    r = shift_apply(t, (uint32_t)r) ^ (uint32_t)r2;
    return r;
}

__attribute__((target("sse4.2"))) static uint32_t
hw_run(uint32_t reg, const uint8_t *p, size_t n)
{
    uint64_t r = reg;
    while (n > 0 && ((uintptr_t)p & 7) != 0) {
        r = _mm_crc32_u8((uint32_t)r, *p++);
        n--;
    }
    while (n >= 3 * CHUNK_LONG) {
        r = hw_block(r, p, CHUNK_LONG, shift_long);
        p += 3 * CHUNK_LONG;
        n -= 3 * CHUNK_LONG;
    }
    while (n >= 3 * CHUNK_SHORT) {
        r = hw_block(r, p, CHUNK_SHORT, shift_short);
        p += 3 * CHUNK_SHORT;
        n -= 3 * CHUNK_SHORT;
    }
    while (n >= 8) {
        r = _mm_crc32_u64(r, load64(p));
        p += 8;
        n -= 8;
    }
    while (n > 0) {
        r = _mm_crc32_u8((uint32_t)r, *p++);
        n--;
    }
    return (uint32_t)r;
}
#endif

uint32_t
dp__crc32c_update_hw(uint32_t crc, const void *p, size_t n)
{
    crc_setup();
    if (n == 0)
        return crc;
#if CRC_HAVE_X86
    if (have_hw)
        return ~hw_run(~crc, p, n);
#endif
    return ~table_run(~crc, p, n);
}

uint32_t
dp__crc32c_update(uint32_t crc, const void *p, size_t n)
{
    return dp__crc32c_update_hw(crc, p, n);
}

uint32_t
dp__crc32c(const void *p, size_t n)
{
    return dp__crc32c_update_hw(0, p, n);
}

bool
dp__crc32c_hw_available(void)
{
    crc_setup();
    return have_hw;
}

const char *
dp__crc32c_impl(void)
{
    return dp__crc32c_hw_available() ? "sse4.2" : "table";
}

uint32_t
dp__crc32c_combine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b)
{
    /* Registers: ra = ~crc_a runs over b: shift(ra, |b|) ^ run(0, b), and
     * run(0, b) = ~crc_b ^ shift(~0, |b|) (b's own CRC starts from ~0). So
     * crc(a||b) = ~(shift(~crc_a ^ ~0, |b|) ^ ~crc_b) = shift(crc_a, |b|) ^ crc_b. */
    return multmodp(x8n_modp(len_b), crc_a) ^ crc_b;
}
