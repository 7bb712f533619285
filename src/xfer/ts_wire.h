/*
 * The messages of two-sided transfers (docs/design.md, "Two-sided
 * transfers"), without UCX: the 32-byte header every message carries and
 * the range list of a READ request. Both parsers take untrusted bytes (a
 * peer's) and never read outside them (fuzzed: fuzz/fuzz_ts_wire.c).
 *
 * Header (little-endian): 0 "DPTS", 4 version (1), 5 kind (DP_TS_WRITE,
 * DP_TS_READ), 6 v: the length of what follows the header, 8 the sender's
 * sequence number, 16 a, 24 b, then v bytes. WRITE: a = the target address,
 * b = the length, v = the grant. READ request: a = n ranges, b = their total
 * bytes, v = the grant, and the message's data is n (addr u64, len u64)
 * pairs. A reply: a = the rc (as u32), b = the bytes it carries, v = the
 * target's reason for a refusal.
 * Threads: reentrant.
 */
#ifndef DP_XFER_TS_WIRE_H
#define DP_XFER_TS_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/common.h"
#include "xfer/graveyard.h" /* dp__range */

enum { DP_TS_WRITE = 1, DP_TS_READ = 2 };

#define DP_TS_HDR 32
#define DP_TS_RANGES_MAX (1u << 20) /* ranges one READ request may name */

typedef struct dp__ts_hdr {
    uint8_t kind;
    uint16_t vlen;
    uint64_t seq, a, b;
    const uint8_t *v; /* vlen bytes, inside the parsed header */
} dp__ts_hdr;

/* Write a header and v into h (DP_TS_HDR + vlen bytes); returns that length. */
size_t dp__ts_hdr_put(uint8_t *h, uint8_t kind, uint64_t seq, uint64_t a, uint64_t b,
                      const void *v, uint16_t vlen);

/* Parse header[0..len): true if it is a whole header of kind (and its v). */
bool dp__ts_hdr_get(const void *header, size_t len, uint8_t kind, dp__ts_hdr *h);

/*
 * A READ request's data[0..len) as h (a parsed READ header) announces it:
 * h->a ranges (1..DP_TS_RANGES_MAX), each non-empty and not wrapping, of
 * h->b bytes in all. out gets h->a ranges. DP_EPROTO with the reason in
 * msg[0..cap) otherwise.
 */
int dp__ts_ranges_parse(const dp__ts_hdr *h, const void *data, size_t len, dp__range *out,
                        char *msg, size_t cap);

#endif
