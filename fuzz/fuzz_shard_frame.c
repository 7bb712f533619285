/*
 * libFuzzer target for src/blob/shard: the shard file's frame decoders
 * (dp__shard_header_decode, dp__shard_check_len, dp__shard_trailer_decode) on
 * arbitrary bytes taken as a whole shard file: its first 32 bytes the
 * header, its last 24 the trailer. Whatever decodes must encode back to the
 * same bytes. Each input runs twice: as it is, and with the magics, version,
 * length and header CRC made right, so the success path is always reached
 * (a mutation almost never keeps a CRC valid).
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "blob/crc32c.h"
#include "blob/shard.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
static void one(const uint8_t *data, size_t size, bool fix);

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    one(data, size, false);
    one(data, size, true);
    return 0;
}

static void
put_le(uint8_t *p, uint64_t v, int n)
{
    for (int i = 0; i < n; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void
one(const uint8_t *data, size_t size, bool fix)
{
    if (size < DP_SHARD_HEADER_LEN + DP_SHARD_TRAILER_LEN)
        return;
    /* Copies of exactly 32 and 24 bytes: reads past them are caught by ASan. */
    uint8_t *hdr = malloc(DP_SHARD_HEADER_LEN), *tr = malloc(DP_SHARD_TRAILER_LEN);
    if (hdr == NULL || tr == NULL)
        abort();
    memcpy(hdr, data, DP_SHARD_HEADER_LEN);
    memcpy(tr, data + size - DP_SHARD_TRAILER_LEN, DP_SHARD_TRAILER_LEN);
    uint64_t data_bytes = size - DP_SHARD_HEADER_LEN - DP_SHARD_TRAILER_LEN;
    if (fix) {
        memcpy(hdr, DP_SHARD_MAGIC, 8);
        put_le(hdr + 8, DP_SHARD_VERSION, 4);
        put_le(hdr + 24, data_bytes, 8);
        memcpy(tr, DP_SHARD_END_MAGIC, 8);
        put_le(tr + 8, data_bytes, 8);
        put_le(tr + 20, dp__crc32c(hdr, DP_SHARD_HEADER_LEN), 4);
    }
    dp__shard_header h;
    dp_detail d;
    int rc = dp__shard_header_decode(hdr, "fuzz.shard", &h, &d);
    if (rc == DP_OK) {
        uint8_t again[DP_SHARD_HEADER_LEN];
        dp__shard_header_encode(&h, again);
        if (memcmp(again, hdr, sizeof again) != 0 ||
            h.crc != dp__crc32c(hdr, DP_SHARD_HEADER_LEN))
            abort();
        rc = dp__shard_check_len(&h, size, "fuzz.shard", &d);
    }
    if (rc == DP_OK) {
        if (dp__shard_data_end(&h) != size - DP_SHARD_TRAILER_LEN)
            abort();
        uint32_t data_crc = 0;
        rc = dp__shard_trailer_decode(tr, &h, "fuzz.shard", &data_crc, &d);
        if (rc == DP_OK) {
            uint8_t again[DP_SHARD_TRAILER_LEN];
            dp__shard_trailer_encode(&h, data_crc, again);
            if (memcmp(again, tr, sizeof again) != 0)
                abort();
        }
    }
    if (rc != DP_OK && (rc != DP_ECORRUPT || d.msg[0] == '\0'))
        abort();
    if (fix && rc != DP_OK)
        abort();
    free(hdr);
    free(tr);
}
