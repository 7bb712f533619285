/*
 * Rows-file parser of a checkpoint shard (see shard.h).
 */
#include "blob/shard.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "blob/crc32c.h"

static uint32_t
rd_u32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
           (uint32_t)p[3] << 24;
}

static uint64_t
rd_u64(const uint8_t *p)
{
    return (uint64_t)rd_u32(p) | (uint64_t)rd_u32(p + 4) << 32;
}

static bool
id_ok(const char *s, uint32_t n)
{
    if (n == 0 || n > DP_SHARD_ID_MAX)
        return false;
    for (uint32_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
              (c >= '0' && c <= '9') || c == '_' || c == '.' || c == ':' || c == '-'))
            return false;
    }
    return true;
}

uint32_t
dp_shard_row_live(const dp_shard_row *r, uint32_t k)
{
    return rd_u32(r->live + 4 * (size_t)k);
}

void
dp_shard_rows_fini(dp_shard_rows *r)
{
    if (r == NULL)
        return;
    free(r->v);
    memset(r, 0, sizeof *r);
}

int
dp_shard_rows_parse(const uint8_t *p, uint64_t len, const char *name, dp_shard_rows *out,
                    dp_detail *d)
{
    memset(out, 0, sizeof *out);
    if (len < 36)
        return dp_fail(d, DP_ECORRUPT,
                       "%s: %" PRIu64 " bytes: not a rows file (offset 0)", name, len);
    if (memcmp(p, DP_ROWS_MAGIC, 8) != 0 ||
        memcmp(p + len - 8, DP_ROWS_END_MAGIC, 8) != 0)
        return dp_fail(d, DP_ECORRUPT, "%s: bad magic at offset %" PRIu64, name,
                       memcmp(p, DP_ROWS_MAGIC, 8) != 0 ? 0 : len - 8);
    if (rd_u32(p + len - 12) != dp_crc32c(p, (size_t)len - 12))
        return dp_fail(d, DP_ECORRUPT, "%s: CRC mismatch over [0, %" PRIu64 ")", name,
                       len - 12);
    if (rd_u32(p + 8) != DP_SHARD_VERSION)
        return dp_fail(d, DP_ECORRUPT, "%s: version %u at offset 8, expected %u", name,
                       rd_u32(p + 8), DP_SHARD_VERSION);
    out->unit_id = rd_u32(p + 12);
    out->n_units = rd_u32(p + 16);
    uint32_t n = rd_u32(p + 20);
    if (n > (len - 36) / 25)
        return dp_fail(d, DP_ECORRUPT, "%s: %u blobs cannot fit (offset 20)", name, n);
    dp_shard_row *r = calloc(n ? n : 1, sizeof *r);
    if (r == NULL)
        return dp_fail(d, DP_ENOMEM, "%s: out of memory for %u blobs", name, n);
    uint64_t pos = 24, end = len - 12;
    for (uint32_t i = 0; i < n; i++) {
        if (end - pos < 1 || end - pos - 1 < (uint64_t)p[pos] + 24 || p[pos] == 0 ||
            p[pos] > DP_SHARD_ID_MAX) {
            free(r);
            return dp_fail(d, DP_ECORRUPT, "%s: bad record at offset %" PRIu64, name,
                           pos);
        }
        r[i].id_len = p[pos];
        r[i].id = (const char *)p + pos + 1;
        const uint8_t *q = p + pos + 1 + r[i].id_len;
        r[i].off = rd_u64(q);
        r[i].nbytes = rd_u64(q + 8);
        r[i].crc = rd_u32(q + 16);
        r[i].n_live = rd_u32(q + 20);
        pos += 1 + r[i].id_len + 24;
        if ((end - pos) / 4 < r[i].n_live || !id_ok(r[i].id, r[i].id_len)) {
            free(r);
            return dp_fail(d, DP_ECORRUPT, "%s: bad record at offset %" PRIu64, name,
                           pos);
        }
        r[i].live = p + pos;
        pos += 4 * (uint64_t)r[i].n_live;
    }
    if (pos != end) {
        free(r);
        return dp_fail(d, DP_ECORRUPT, "%s: %" PRIu64 " stray bytes at offset %" PRIu64,
                       name, end - pos, pos);
    }
    out->n = n;
    out->v = r;
    return DP_OK;
}
