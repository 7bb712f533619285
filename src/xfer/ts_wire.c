/*
 * The two-sided transfer messages' header and READ range list (ts_wire.h).
 */
#include "xfer/ts_wire.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "common/le.h"

#define TS_MAGIC "DPTS"
#define TS_VERSION 1

size_t
dp__ts_hdr_put(uint8_t *h, uint8_t kind, uint64_t seq, uint64_t a, uint64_t b,
               const void *v, uint16_t vlen)
{
    memcpy(h, TS_MAGIC, 4);
    h[4] = TS_VERSION;
    h[5] = kind;
    dp__le16_store(h + 6, vlen);
    dp__le64_store(h + 8, seq);
    dp__le64_store(h + 16, a);
    dp__le64_store(h + 24, b);
    if (vlen > 0)
        memcpy(h + DP_TS_HDR, v, vlen);
    return DP_TS_HDR + (size_t)vlen;
}

bool
dp__ts_hdr_get(const void *header, size_t len, uint8_t kind, dp__ts_hdr *h)
{
    const uint8_t *p = header;
    if (p == NULL || len < DP_TS_HDR || memcmp(p, TS_MAGIC, 4) != 0 ||
        p[4] != TS_VERSION || p[5] != kind)
        return false;
    h->kind = p[5];
    h->vlen = dp__le16_load(p + 6);
    h->seq = dp__le64_load(p + 8);
    h->a = dp__le64_load(p + 16);
    h->b = dp__le64_load(p + 24);
    h->v = p + DP_TS_HDR;
    return len == DP_TS_HDR + (size_t)h->vlen;
}

int
dp__ts_ranges_parse(const dp__ts_hdr *h, const void *data, size_t len, dp__range *out,
                    char *msg, size_t cap)
{
    if (h->a == 0 || h->a > DP_TS_RANGES_MAX || len != h->a * 16 ||
        (len > 0 && data == NULL)) {
        snprintf(msg, cap, "malformed READ request: %" PRIu64 " ranges in %zu bytes",
                 h->a, len);
        return DP_EPROTO;
    }
    const uint8_t *p = data;
    uint64_t total = 0;
    for (size_t i = 0; i < (size_t)h->a; i++) {
        out[i].addr = dp__le64_load(p + 16 * i);
        out[i].nbytes = dp__le64_load(p + 16 * i + 8);
        if (out[i].nbytes == 0 || out[i].addr + out[i].nbytes < out[i].addr ||
            total + out[i].nbytes < total) {
            snprintf(msg, cap,
                     "READ range %zu (%" PRIu64 " bytes at 0x%" PRIx64
                     ") is empty or wraps",
                     i, out[i].nbytes, out[i].addr);
            return DP_EPROTO;
        }
        total += out[i].nbytes;
    }
    if (total != h->b) {
        snprintf(msg, cap,
                 "READ request: its ranges hold %" PRIu64
                 " bytes, its header says %" PRIu64,
                 total, h->b);
        return DP_EPROTO;
    }
    return DP_OK;
}
