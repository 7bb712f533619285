/*
 * A fast 64-bit hash of bytes (not cryptographic): 8 bytes a step with
 * multiply and rotate mixing, a final avalanche. Location hints seal their
 * key and contents with it (docs/design.md, "Location hints"): unlike a CRC,
 * which is linear, two inputs that differ anywhere collide with odds of
 * about 2^-64 unless someone searches for a collision on purpose.
 *
 * Threads: reentrant.
 */
#ifndef DP_COMMON_HASH64_H
#define DP_COMMON_HASH64_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

static inline uint64_t
dp__rotl64(uint64_t x, unsigned r)
{
    return (x << r) | (x >> (64 - r));
}

static inline uint64_t
dp__hash64_word(uint64_t h, uint64_t w)
{
    w *= 0x87c37b91114253d5ull;
    w = dp__rotl64(w, 31);
    w *= 0x4cf5ad432745937full;
    h ^= w;
    return dp__rotl64(h, 27) * 5 + 0x52dce729;
}

/* The hash of p[0..n), chained from seed (a previous hash, or 0). */
static inline uint64_t
dp__hash64(const void *p, size_t n, uint64_t seed)
{
    const unsigned char *b = p;
    uint64_t h = seed ^ (n * 0x9e3779b97f4a7c15ull);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, b + i, 8);
        h = dp__hash64_word(h, w);
    }
    if (i < n) {
        uint64_t w = 0;
        memcpy(&w, b + i, n - i);
        h = dp__hash64_word(h, w ^ ((uint64_t)(n - i) << 56));
    }
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ull;
    h ^= h >> 33;
    return h;
}

#endif
