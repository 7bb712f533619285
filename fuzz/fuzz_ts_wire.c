/*
 * libFuzzer target for the two-sided transfer messages (src/xfer/ts_wire.c):
 * the header parser and the READ request's range list, on bytes a peer
 * sends.
 *
 * Input layout: byte 0 picks the kind (its low bit: WRITE or READ), bytes
 * 1..2 (little-endian) how many of the rest are the header; the remaining
 * bytes are the message's data.
 *
 * Beyond "no crash, no sanitizer report": a header that parses re-encodes to
 * the same bytes and its v lies inside it; a range list that parses holds
 * exactly the announced count of non-empty, non-wrapping ranges whose sum is
 * the announced total; a refusal always says why (one NUL-terminated line).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dataplane/err.h"
#include "xfer/ts_wire.h"

#define FAIL_IF(cond)                                                                    \
    do {                                                                                 \
        if (cond) {                                                                      \
            fprintf(stderr, "fuzz_ts_wire: %s (line %d)\n", #cond, __LINE__);            \
            abort();                                                                     \
        }                                                                                \
    } while (0)

int
LLVMFuzzerTestOneInput(const uint8_t *buf, size_t size)
{
    if (size < 3)
        return 0;
    uint8_t kind = (buf[0] & 1) ? DP_TS_READ : DP_TS_WRITE;
    size_t hlen = (size_t)buf[1] | (size_t)buf[2] << 8;
    const uint8_t *rest = buf + 3;
    size_t nrest = size - 3;
    if (hlen > nrest)
        hlen = nrest;
    /* Copies of exactly the given lengths, so a read past them is caught. */
    uint8_t *hdr = malloc(hlen ? hlen : 1);
    uint8_t *data = malloc(nrest - hlen ? nrest - hlen : 1);
    FAIL_IF(hdr == NULL || data == NULL);
    memcpy(hdr, rest, hlen);
    memcpy(data, rest + hlen, nrest - hlen);
    dp__ts_hdr h;
    if (dp__ts_hdr_get(hdr, hlen, kind, &h)) {
        FAIL_IF(h.kind != kind || (size_t)DP_TS_HDR + h.vlen != hlen);
        FAIL_IF(h.v != hdr + DP_TS_HDR);
        uint8_t *again = malloc(hlen);
        FAIL_IF(again == NULL);
        FAIL_IF(dp__ts_hdr_put(again, kind, h.seq, h.a, h.b, h.v, h.vlen) != hlen);
        FAIL_IF(memcmp(again, hdr, hlen) != 0);
        free(again);
        if (kind == DP_TS_READ) {
            size_t n = h.a > 0 && h.a <= DP_TS_RANGES_MAX ? (size_t)h.a : 1;
            dp__range *r = malloc(n * sizeof *r);
            FAIL_IF(r == NULL);
            char msg[256];
            msg[0] = '\0';
            int rc = dp__ts_ranges_parse(&h, data, nrest - hlen, r, msg, sizeof msg);
            if (rc == DP_OK) {
                uint64_t total = 0;
                FAIL_IF(h.a * 16 != nrest - hlen);
                for (size_t i = 0; i < n; i++) {
                    FAIL_IF(r[i].nbytes == 0 || r[i].addr + r[i].nbytes < r[i].addr);
                    total += r[i].nbytes;
                }
                FAIL_IF(total != h.b);
            } else {
                FAIL_IF(rc != DP_EPROTO || msg[0] == '\0' || strchr(msg, '\n') != NULL);
            }
            free(r);
        }
    } else if (hlen >= DP_TS_HDR && memcmp(hdr, "DPTS", 4) == 0 && hdr[4] == 1 &&
               hdr[5] == kind) {
        /* Refused only for a v that does not match the length. */
        FAIL_IF((size_t)DP_TS_HDR + (hdr[6] | (size_t)hdr[7] << 8) == hlen);
    }
    free(hdr);
    free(data);
    return 0;
}
