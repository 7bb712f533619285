/*
 * The unit's side of two-sided transfers (docs/design.md, "Two-sided
 * transfers"): the serve hooks its endpoint calls when a client sends a WRITE
 * or asks for a READ as messages instead of one-sided RMA.
 *
 * Design notes
 * ------------
 * - A WRITE's grant is the allocation: its token (8 bytes, little-endian)
 *   and its blob id. It is accepted only into an open allocation (in the
 *   blob table, not yet committed) with that id and token, and only inside
 *   [off, off + nbytes) of its region. It then holds the record (n_rx) until
 *   its bytes are in: a commit meanwhile is refused; an abort, lease expiry or
 *   reclaim takes the record out of the table at once (no new WRITE gets in)
 *   and leaves its region to the last WRITE's end (REC_DRAINING), which
 *   frees or retires it as was asked.
 * - A READ's grant is a live pin's id (random, 128 bits). Every range must lie
 *   inside one of the pin's blobs. It holds the pin (n_sends) until its send
 *   has ended: an unpin or expiry meanwhile ends the pin only then, so its
 *   blobs (and their regions) outlive every send from them.
 * - Every refusal is counted (two_sided_refused) and answered with its
 *   reason; nothing else changes.
 * - The hooks run on the endpoint's progress thread with the endpoint's lock
 *   held, then take the unit lock (lock order: the endpoint's lock, then mu;
 *   the unit never calls the endpoint with mu held, unit_int.h).
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/le.h"
#include "unit/unit_int.h"
#include "xfer/endpoint.h"

static int refuse_locked(dp__unit *u, dp_detail *d, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int
refuse_locked(dp__unit *u, dp_detail *d, int code, const char *fmt, ...)
{
    u->stats.ts_refused++;
    char msg[DP_DETAIL_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    DP_LOG_D("unit %u: two-sided transfer refused: %s", u->o.unit_id, msg);
    return dp__fail(d, code, "unit %u: %s", u->o.unit_id, msg);
}

static int
write_begin(void *ctx, const uint8_t *grant, size_t grant_len, uint64_t addr,
            uint64_t len, void **hold, dp_detail *d)
{
    dp__unit *u = ctx;
    pthread_mutex_lock(&u->mu);
    int rc;
    if (grant_len < 9 || grant_len > 8 + DP_UNIT_ID_MAX ||
        !dp__id_valid((const char *)grant + 8, grant_len - 8, DP_UNIT_ID_MAX)) {
        rc = refuse_locked(u, d, DP_EPROTO, "malformed WRITE grant (%zu bytes)",
                           grant_len);
        goto out;
    }
    uint64_t token = dp__le64_load(grant);
    const char *id = (const char *)grant + 8;
    int id_len = (int)(grant_len - 8);
    blob_rec *b = dp__map_get(&u->blobs, id, (size_t)id_len);
    if (b == NULL || b->token != token) {
        rc = refuse_locked(u, d, DP_ENOTFOUND,
                           "no open allocation %.*s with token %" PRIu64
                           " (never allocated here, aborted, or its lease expired)",
                           id_len, id, token);
        goto out;
    }
    if (b->state != REC_ALLOCATED || (b->flags & REC_JOB)) {
        rc = refuse_locked(u, d, DP_EPROTO, "allocation %.*s is already committed",
                           id_len, id);
        goto out;
    }
    uint64_t base = (uint64_t)(uintptr_t)u->slab + b->off;
    if (addr < base || addr - base > b->nbytes || len > b->nbytes - (addr - base)) {
        rc = refuse_locked(u, d, DP_EPROTO,
                           "WRITE of %" PRIu64 " bytes at offset %" PRId64
                           " of allocation %.*s (%" PRIu64 " bytes) goes past its end",
                           len, (int64_t)(addr - base), id_len, id, b->nbytes);
        goto out;
    }
    b->n_rx++;
    u->stats.ts_writes++;
    u->stats.ts_write_bytes += len;
    *hold = b;
    rc = 0;
out:
    pthread_mutex_unlock(&u->mu);
    return rc;
}

static void
write_end(void *ctx, void *hold, bool ok)
{
    DP_UNUSED(ok);
    dp__unit *u = ctx;
    blob_rec *b = hold;
    pthread_mutex_lock(&u->mu);
    DP_ASSERT(b->n_rx > 0);
    if (--b->n_rx == 0 && b->state == REC_DRAINING)
        dp__rec_drained_locked(u, b, dp__unit_now(u));
    pthread_mutex_unlock(&u->mu);
}

/* The pinned blob holding slab offsets [off, off + n), or NULL. */
static blob_rec *
pinned_blob(const dp__unit *u, const pin *p, uint64_t off, uint64_t n, uint32_t *hint)
{
    for (uint32_t k = 0; k < p->n; k++) {
        uint32_t i = (*hint + k) % p->n;
        const blob_rec *b = p->blobs[i];
        if (b->area == REC_AREA_NONE || off < b->off || off - b->off > b->nbytes ||
            n > b->nbytes - (off - b->off))
            continue;
        *hint = i;
        return p->blobs[i];
    }
    DP_UNUSED(u);
    return NULL;
}

static int
read_begin(void *ctx, const uint8_t *grant, size_t grant_len, const dp__range *ranges,
           size_t n, void **hold, dp_detail *d)
{
    dp__unit *u = ctx;
    pthread_mutex_lock(&u->mu);
    int rc;
    pin *p =
        grant_len > 0 && grant_len <= 32 ? dp__map_get(&u->pins, grant, grant_len) : NULL;
    double now = dp__unit_now(u);
    if (p == NULL || p->ending || p->expiry <= now) {
        rc = refuse_locked(u, d, DP_ETIMEDOUT,
                           "READ names no live pin (unpinned, expired after read_pin_s "
                           "%.3g s, or never given)",
                           u->o.read_pin_s);
        goto out;
    }
    uint64_t base = (uint64_t)(uintptr_t)u->slab, total = 0;
    uint32_t hint = 0;
    for (size_t i = 0; i < n; i++) {
        if (ranges[i].addr < base ||
            pinned_blob(u, p, ranges[i].addr - base, ranges[i].nbytes, &hint) == NULL) {
            rc = refuse_locked(u, d, DP_EPROTO,
                               "READ range %zu (%" PRIu64 " bytes at offset %" PRId64
                               ") lies in no blob of its pin",
                               i, ranges[i].nbytes, (int64_t)(ranges[i].addr - base));
            goto out;
        }
        total += ranges[i].nbytes;
    }
    p->n_sends++;
    u->stats.ts_reads++;
    u->stats.ts_read_bytes += total;
    *hold = p;
    rc = 0;
out:
    pthread_mutex_unlock(&u->mu);
    return rc;
}

static void
read_end(void *ctx, void *hold)
{
    dp__unit *u = ctx;
    pthread_mutex_lock(&u->mu);
    dp__pin_sent_locked(u, hold, dp__unit_now(u));
    pthread_mutex_unlock(&u->mu);
}

int
dp__unit_serve_transfers(dp__unit *u, dp_detail *d)
{
    if (u->o.ep == NULL)
        return dp__fail(d, DP_EINVAL, "unit %u has no endpoint to serve transfers on",
                        u->o.unit_id);
    dp__xfer_serve s = {write_begin, write_end, read_begin, read_end, u};
    return dp__endpoint_serve(u->o.ep, &s, d);
}

void
dp__unit_stop_serving(dp__unit *u)
{
    if (u != NULL && u->o.ep != NULL)
        dp__endpoint_serve(u->o.ep, NULL, NULL);
}
