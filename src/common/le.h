/*
 * Little-endian loads and stores of 16-, 32- and 64-bit integers at any
 * alignment: every on-disk and on-the-wire binary format here (blobs,
 * shards, endpoint metadata) is little-endian. memcpy keeps them free of
 * alignment and aliasing trouble; compilers turn each into one move (and a
 * byte swap on a big-endian host).
 */
#ifndef DP_COMMON_LE_H
#define DP_COMMON_LE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
#define DP_LE16(v) __builtin_bswap16(v)
#define DP_LE32(v) __builtin_bswap32(v)
#define DP_LE64(v) __builtin_bswap64(v)
#else
#define DP_LE16(v) (v)
#define DP_LE32(v) (v)
#define DP_LE64(v) (v)
#endif

static inline uint16_t
dp__le16_load(const void *p)
{
    uint16_t v;
    memcpy(&v, p, sizeof v);
    return DP_LE16(v);
}

static inline uint32_t
dp__le32_load(const void *p)
{
    uint32_t v;
    memcpy(&v, p, sizeof v);
    return DP_LE32(v);
}

static inline uint64_t
dp__le64_load(const void *p)
{
    uint64_t v;
    memcpy(&v, p, sizeof v);
    return DP_LE64(v);
}

static inline void
dp__le16_store(void *p, uint16_t v)
{
    v = DP_LE16(v);
    memcpy(p, &v, sizeof v);
}

static inline void
dp__le32_store(void *p, uint32_t v)
{
    v = DP_LE32(v);
    memcpy(p, &v, sizeof v);
}

static inline void
dp__le64_store(void *p, uint64_t v)
{
    v = DP_LE64(v);
    memcpy(p, &v, sizeof v);
}

/*
 * Whether a[0..n) and b[0..n) hold the same bytes: eight at a time, then
 * the rest, inline. For the short strings compared per value (field names,
 * a blob entry's description) a memcmp call costs more than the compare.
 */
static inline bool
dp__bytes_eq(const void *a, const void *b, size_t n)
{
    const unsigned char *x = a, *y = b;
    for (; n >= 8; n -= 8, x += 8, y += 8) {
        uint64_t u, v;
        memcpy(&u, x, 8);
        memcpy(&v, y, 8);
        if (u != v)
            return false;
    }
    for (; n > 0; n--)
        if (*x++ != *y++)
            return false;
    return true;
}

#endif
