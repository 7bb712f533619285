/*
 * dp_client_put (DESIGN section 5): one blob per unit, alloc on every unit at
 * once, WRITE every blob at once, and each unit's commit sent the moment its
 * own WRITE is done (so a unit publishes while the other WRITEs still run),
 * then every commit reply awaited under one deadline.
 *
 * Each unit's part moves through ALLOC -> WRITE -> COMMIT -> DONE, or ends in
 * FAILED with its own code and detail; one unit failing does not stop the
 * others (a batch spanning units is not atomic), and the caller learns per
 * row what landed.
 *
 * The blob's header and index always go through the staging buffer. A
 * payload in memory registered with the client is written straight from
 * there as one more range of the same WRITE; any other payload is copied
 * into staging once, at its place in the blob. Gaps between payloads are
 * never written (the unit does not read them). All units' staging shares one
 * buffer per call, given back (or retired, if a failed WRITE may still read
 * it) at the end.
 *
 * Cleanup on failure: a unit whose WRITE may still run gets
 * abort(in_flight=true), so it retires the region; a unit whose alloc reply
 * was lost, or whose WRITE never started or provably ended (every UCX request
 * completed over shared memory, or only the synchronous memcpy path ran),
 * gets abort(in_flight=false), so it frees the region at once. Over TCP or
 * RDMA a failed WRITE counts as in flight: bytes the transport already took
 * may still land after UCX gave up on them.
 *
 * Restarts. Before anything is sent, every unit of the batch is made ready
 * (dp__client_ready_locked: re-bound after a restart or a failed endpoint).
 * Every reply names the process that answered; an alloc or commit answered by
 * another incarnation than the one the data path is bound to fails that
 * unit's part with DP_ERESTARTED (the alloc is aborted: the WRITE is never
 * posted through an endpoint bound to another process). The blob's header
 * names the allocation (incarnation and token), so even bytes that reach a
 * region by some other path are never published for the wrong allocation.
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "blob/crc32c.h"
#include "blob/keys.h"
#include "client/client_int.h"

enum { ST_NONE = 0, ST_ALLOC, ST_WRITE, ST_COMMIT, ST_DONE, ST_FAILED };

typedef struct put_unit {
    uint32_t u;
    int state;
    int rc;
    uint32_t n_rows;
    uint32_t ent0; /* first entry of this unit in the per-call entry arrays */
    uint32_t n_ent;
    bool any_direct;
    dp_blob_layout lay;
    size_t stage_off, stage_len;
    char blob_id[40];
    uint64_t off;   /* slab offset from alloc */
    uint64_t token; /* the allocation's token, stamped into the blob header */
    size_t r0, nr;  /* its ranges in the per-call range arrays */
    dp_detail det;
} put_unit;

static int
cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Fail part pu with code and a message; returns code. */
static int pu_fail(put_unit *pu, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int
pu_fail(put_unit *pu, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    dp_vfail(&pu->det, code, fmt, ap);
    va_end(ap);
    pu->rc = code;
    pu->state = ST_FAILED;
    return code;
}

static void
send_abort_locked(dp_client *c, put_unit *pu, bool in_flight)
{
    dp__client_abort_locked(c, pu->u, pu->blob_id, in_flight);
}

static int
check_args(const dp_client *c, const uint64_t *gidxs, size_t n_rows,
           const char *const *fields, size_t n_fields, const dp_value *values,
           dp_detail *d)
{
    if (c == NULL || (n_rows > 0 && gidxs == NULL) || (n_fields > 0 && fields == NULL) ||
        (n_rows > 0 && n_fields > 0 && values == NULL))
        return dp_fail(d, DP_EINVAL, "put: NULL argument");
    if (n_rows > UINT32_MAX || n_fields > UINT32_MAX ||
        (n_fields > 0 && n_rows > (size_t)DP_BLOB_MAX_ENTRIES * 64 / n_fields))
        return dp_fail(d, DP_ETOOBIG, "put: %zu rows x %zu fields is too many", n_rows,
                       n_fields);
    for (size_t f = 0; f < n_fields; f++) {
        if (fields[f] == NULL)
            return dp_fail(d, DP_EINVAL, "put: field %zu is NULL", f);
        int rc = dp_field_check(fields[f], strlen(fields[f]), d);
        if (rc != 0)
            return dp_fail_ctx(d, rc, "put: field %zu", f);
        for (size_t g = 0; g < f; g++)
            if (strcmp(fields[f], fields[g]) == 0)
                return dp_fail(d, DP_EINVAL, "put: field '%s' given twice", fields[f]);
    }
    for (size_t i = 0; i < n_rows * n_fields; i++) {
        const dp_value *v = &values[i];
        if ((unsigned)v->kind > DP_KIND_SKIP)
            return dp_fail(d, DP_EINVAL, "put: row %" PRIu64 " field '%s': bad kind %d",
                           gidxs[i / n_fields], fields[i % n_fields], (int)v->kind);
        if (v->kind != DP_KIND_SKIP && v->data == NULL && v->nbytes > 0)
            return dp_fail(d, DP_EINVAL,
                           "put: row %" PRIu64 " field '%s': NULL data of %" PRIu64
                           " bytes",
                           gidxs[i / n_fields], fields[i % n_fields], v->nbytes);
    }
    return DP_OK;
}

/* Rows must be unique: two values for one key in one blob are ambiguous. */
static int
check_unique_rows(const uint64_t *gidxs, size_t n, dp_detail *d)
{
    uint64_t *s = malloc((n > 0 ? n : 1) * sizeof *s);
    if (s == NULL)
        return dp_fail(d, DP_ENOMEM, "put: out of memory");
    memcpy(s, gidxs, n * sizeof *s);
    qsort(s, n, sizeof *s, cmp_u64);
    int rc = DP_OK;
    for (size_t i = 1; i < n; i++)
        if (s[i] == s[i - 1]) {
            rc = dp_fail(d, DP_EINVAL, "put: row %" PRIu64 " given twice", s[i]);
            break;
        }
    free(s);
    return rc;
}

/* Build unit pu's blob index from its rows (order[0..n_rows)). */
static int
build_unit_locked(dp_client *c, put_unit *pu, const uint32_t *order,
                  const uint64_t *gidxs, const char *const *fields, const size_t *flen,
                  size_t n_fields, const dp_value *values, const dp_value **ent_val,
                  dp_detail *d)
{
    dp_blob_builder *b = c->builders[pu->u];
    if (b == NULL) {
        int rc = dp_blob_builder_create(c->o.crc ? DP_BLOB_FLAG_CRC : 0, &b, d);
        if (rc != 0)
            return rc;
        /* Keys come from dp_key_format over checked fields and unique rows. */
        dp_blob_builder_trust_keys(b, true);
        c->builders[pu->u] = b;
    }
    dp_blob_builder_reset(b);
    char key[DP_KEY_MAX + 1];
    pu->n_ent = 0;
    for (uint32_t k = 0; k < pu->n_rows; k++) {
        uint32_t r = order[k];
        for (size_t f = 0; f < n_fields; f++) {
            const dp_value *v = &values[(size_t)r * n_fields + f];
            if (v->kind == DP_KIND_SKIP)
                continue;
            size_t klen = dp_key_format(gidxs[r], fields[f], flen[f], key);
            dp_blob_entry_spec s;
            memset(&s, 0, sizeof s);
            s.key = key;
            s.key_len = klen;
            s.kind = (dp_blob_kind)v->kind;
            s.dtype = v->dtype;
            s.shape = v->shape;
            s.ndim = v->ndim;
            s.len = v->nbytes;
            if (c->o.crc) {
                s.has_crc = true;
                s.crc = v->nbytes > 0 ? dp_crc32c(v->data, v->nbytes) : 0;
            }
            int rc = dp_blob_builder_add(b, &s, NULL, d);
            if (rc != 0)
                return dp_fail_ctx(d, rc, "put: row %" PRIu64 " field '%s'", gidxs[r],
                                   fields[f]);
            ent_val[pu->ent0 + pu->n_ent++] = v;
        }
    }
    if (pu->n_ent == 0)
        return DP_OK;
    int rc = dp_blob_builder_layout(b, &pu->lay, d);
    if (rc != 0)
        return dp_fail_ctx(d, rc, "put: blob for unit %u", pu->u);
    return DP_OK;
}

/* alloc on every unit in ST_ALLOC, retrying busy ones until the deadline. */
static void
alloc_phase_locked(dp_client *c, put_unit *pus, size_t npu, uint32_t *slot_pu,
                   double deadline)
{
    double step = 0.002;
    for (;;) {
        size_t ns = 0;
        for (size_t i = 0; i < npu; i++) {
            put_unit *pu = &pus[i];
            if (pu->state != ST_ALLOC)
                continue;
            dp_wire_request q;
            memset(&q, 0, sizeof q);
            q.op = DP_WIRE_OP_ALLOC;
            q.a.alloc.blob_id = dp_wire_s(pu->blob_id);
            q.a.alloc.nbytes = pu->lay.total_len;
            q.a.alloc.n_entries = pu->n_ent;
            q.a.alloc.spill = !c->o.no_spill;
            /* Who writes the region: lets the unit reclaim it if this process dies. */
            q.a.alloc.writer = dp_wire_s(c->blob_prefix);
            q.a.alloc.pid = (uint64_t)getpid();
            q.a.alloc.host = dp_wire_s(dp_host_key());
            q.a.alloc.lane = dp_wire_s(dp_xfer_lane_name(c->units[pu->u].lane));
            dp_detail_clear(&pu->det);
            int rc = dp__client_prepare_locked(c, pu->u, ns, &q, &pu->det);
            if (rc != 0) {
                pu->rc = rc;
                pu->state = ST_FAILED;
                continue;
            }
            slot_pu[ns++] = (uint32_t)i;
        }
        if (ns == 0)
            return;
        dp_ctl_call_many(c->ctl, c->items, ns, dp__client_round_timeout(deadline));
        bool busy = false;
        for (size_t s = 0; s < ns; s++) {
            put_unit *pu = &pus[slot_pu[s]];
            dp_ctl_item *it = &c->items[s];
            if (it->rc != 0) {
                /* The unit may have allocated and its reply got lost. */
                pu->det = it->det;
                pu->rc = it->rc;
                pu->state = ST_FAILED;
                if (it->rc == DP_ETRANSFER)
                    c->cnt.units_down++;
                send_abort_locked(c, pu, false);
                continue;
            }
            dp_wire_reply rep;
            int rc = dp_wire_reply_decode(it->reply.data, it->reply.len, DP_WIRE_OP_ALLOC,
                                          NULL, &rep, &pu->det);
            if (rc == 0 &&
                dp__client_reply_check_locked(c, pu->u, &rep, true, &pu->det)) {
                /* Another process answered: free what it allocated, WRITE nothing. */
                pu->rc = DP_ERESTARTED;
                pu->state = ST_FAILED;
                if (rep.ok)
                    send_abort_locked(c, pu, false);
            } else if (rc == 0 && rep.ok) {
                pu->off = rep.r.alloc.off;
                pu->token = rep.r.alloc.token;
                if (pu->off > c->units[pu->u].region_bytes ||
                    pu->lay.total_len > c->units[pu->u].region_bytes - pu->off)
                    pu_fail(pu, DP_EPROTO,
                            "alloc answered offset %" PRIu64 " for %" PRIu64
                            " bytes, outside the unit's region of %" PRIu64 " bytes",
                            pu->off, pu->lay.total_len, c->units[pu->u].region_bytes);
                else
                    pu->state = ST_WRITE;
            } else if (rc == 0) {
                rc = dp_wire_error_to_detail(&rep.err, &pu->det);
                if (rc == DP_EBUSY && dp__client_left(deadline) > 0) {
                    busy = true; /* stays in ST_ALLOC */
                } else {
                    pu->rc = rc;
                    pu->state = ST_FAILED;
                    if (rc == DP_EBUSY)
                        dp_fail_ctx(&pu->det, rc,
                                    "alloc stayed busy for the whole budget");
                }
            } else {
                pu->rc = rc;
                pu->state = ST_FAILED;
                send_abort_locked(c, pu, false);
            }
            dp_wire_reply_fini(&rep);
        }
        if (!busy)
            return;
        dp__client_backoff(&step, deadline);
    }
}

/* Sends the commit of unit pu as c->items[slot]; sent[slot] says it went. */
static void
send_commit_locked(dp_client *c, put_unit *pu, size_t slot, bool *sent)
{
    dp_wire_request q;
    memset(&q, 0, sizeof q);
    q.op = DP_WIRE_OP_COMMIT;
    q.a.commit.blob_id = dp_wire_s(pu->blob_id);
    int rc = dp__client_prepare_locked(c, pu->u, slot, &q, &pu->det);
    if (rc != 0) {
        pu->rc = rc;
        pu->state = ST_FAILED;
        send_abort_locked(c, pu, false);
        return;
    }
    /* A failed send leaves its code in the item: the reply loop reports it. */
    dp_ctl_send(c->ctl, &c->items[slot]);
    sent[slot] = true;
}

typedef struct write_ctx {
    dp_client *c;
    put_unit *pus;
    const uint32_t *slot_pu;
    bool *sent;
} write_ctx;

/*
 * A unit's WRITE is done: its commit goes out now, so that the unit publishes
 * while the other units' WRITEs run (on one host those are memcpys done one
 * after the other by this thread).
 */
static void
write_done(void *ctx, size_t slot, int rc)
{
    write_ctx *w = ctx;
    if (rc != 0)
        return;
    put_unit *pu = &w->pus[w->slot_pu[slot]];
    if (dp__client_test_hook != NULL)
        dp__client_test_hook("put:written");
    pu->state = ST_COMMIT;
    send_commit_locked(w->c, pu, slot, w->sent);
}

/*
 * WRITE every blob in ST_WRITE at once; each commit is sent as soon as its
 * WRITE is done (sent[slot], slots as slot_pu), for commit_phase_locked to
 * wait for. Returns the number of slots.
 */
static size_t
write_phase_locked(dp_client *c, put_unit *pus, size_t npu, dp_xfer_desc *ops,
                   int *results, uint32_t *slot_pu, bool *sent, const dp_range *local,
                   const dp_range *remote, double deadline)
{
    size_t nops = 0;
    for (size_t i = 0; i < npu; i++) {
        put_unit *pu = &pus[i];
        if (pu->state != ST_WRITE)
            continue;
        ops[nops] =
            (dp_xfer_desc){DP_XFER_WRITE,   local + pu->r0, pu->nr,
                           remote + pu->r0, pu->nr,         c->units[pu->u].remote};
        sent[nops] = false;
        slot_pu[nops++] = (uint32_t)i;
    }
    if (nops == 0)
        return 0;
    double left = dp__client_left(deadline);
    if (!(left > 0)) {
        for (size_t s = 0; s < nops; s++) {
            put_unit *pu = &pus[slot_pu[s]];
            pu_fail(pu, DP_ETIMEDOUT, "no time left for the WRITE of blob %s",
                    pu->blob_id);
            send_abort_locked(c, pu, false);
        }
        return nops;
    }
    dp_detail *dets = calloc(nops, sizeof *dets);
    dp_xfer_end *ends = calloc(nops, sizeof *ends);
    write_ctx w = {c, pus, slot_pu, sent};
    dp_endpoint_transfer_many_ends(c->ep, ops, nops, left, results, dets, ends,
                                   write_done, &w, NULL);
    for (size_t s = 0; s < nops; s++) {
        put_unit *pu = &pus[slot_pu[s]];
        if (results[s] == 0)
            continue; /* committing (or failed to send it) since write_done */
        if (dets != NULL)
            pu->det = dets[s];
        else
            dp_fail(&pu->det, results[s], "WRITE failed");
        pu->rc = results[s];
        pu->state = ST_FAILED;
        /*
         * Tell the unit the truth: in flight only if bytes may still land. Without
         * the ends (out of memory) every posted WRITE counts as in flight.
         */
        dp_xfer_end e = ends != NULL ? ends[s] : DP_XFER_UNFINISHED;
        if (ends == NULL && (results[s] == DP_EINVAL || results[s] == DP_EFATAL))
            e = DP_XFER_NOT_POSTED;
        bool in_flight = e == DP_XFER_UNFINISHED ||
                         (e == DP_XFER_ENDED && results[s] != DP_ETIMEDOUT &&
                          c->units[pu->u].lane != DP_XFER_LANE_SHM);
        /*
         * Its alloc was just answered, so the unit lives: a WRITE that stalls
         * over a network lane means a stalled connection (TCP backing off after
         * an outage): a new one is made before the next transfer.
         */
        if (e == DP_XFER_UNFINISHED && c->units[pu->u].lane != DP_XFER_LANE_SHM)
            c->units[pu->u].ep_suspect = true;
        send_abort_locked(c, pu, in_flight);
        dp_fail_ctx(&pu->det, results[s], "WRITE of blob %s (%" PRIu64 " bytes%s)",
                    pu->blob_id, pu->lay.total_len,
                    e == DP_XFER_NOT_POSTED ? ", nothing posted"
                    : in_flight             ? ", may still land: the unit retires it"
                                            : ", ended: the unit frees it");
    }
    free(dets);
    free(ends);
    return nops;
}

/*
 * Wait for the commits of every blob in ST_COMMIT, asking again while one is
 * "pending" (spill) or busy. The first round's commits went out from
 * write_done: slots [0, ns) as slot_pu, those with sent[slot].
 */
static void
commit_phase_locked(dp_client *c, put_unit *pus, size_t npu, uint32_t *slot_pu,
                    bool *sent, size_t ns, double deadline)
{
    double step = 0.002;
    for (bool first = true;; first = false) {
        if (!first) {
            ns = 0;
            for (size_t i = 0; i < npu; i++) {
                if (pus[i].state != ST_COMMIT)
                    continue;
                slot_pu[ns] = (uint32_t)i;
                sent[ns] = false;
                send_commit_locked(c, &pus[i], ns, sent);
                ns++;
            }
        }
        size_t nsent = 0;
        for (size_t s = 0; s < ns; s++)
            nsent += sent[s];
        if (nsent == 0)
            return;
        /* Give a commit a moment (50 ms) even when the budget is spent: its WRITE is
         * done. */
        double left = DP_MAX(dp__client_left(deadline), 0.05);
        dp_ctl_wait_many(c->ctl, c->items, ns, left);
        bool again = false;
        for (size_t s = 0; s < ns; s++) {
            if (!sent[s])
                continue;
            put_unit *pu = &pus[slot_pu[s]];
            dp_ctl_item *it = &c->items[s];
            if (it->rc != 0) {
                pu->det = it->det;
                if (it->rc == DP_ETRANSFER)
                    c->cnt.units_down++;
                pu_fail(pu, it->rc,
                        "commit of blob %s got no answer (%s): its rows may or may not "
                        "have landed; aborted",
                        pu->blob_id, dp_detail_msg(&it->det));
                send_abort_locked(c, pu, false);
                continue;
            }
            dp_wire_reply rep;
            int rc = dp_wire_reply_decode(it->reply.data, it->reply.len,
                                          DP_WIRE_OP_COMMIT, NULL, &rep, &pu->det);
            if (rc == 0 &&
                dp__client_reply_check_locked(c, pu->u, &rep, true, &pu->det)) {
                /* The process that took the WRITE is gone: its rows did not land. */
                pu->rc = DP_ERESTARTED;
                pu->state = ST_FAILED;
            } else if (rc == 0 && rep.ok) {
                switch (rep.r.commit) {
                case DP_WIRE_COMMIT_DONE:
                    pu->state = ST_DONE;
                    break;
                case DP_WIRE_COMMIT_PENDING:
                    if (dp__client_left(deadline) > 0)
                        again = true;
                    else {
                        /*
                         * The unit's spill job may still publish it: ask the unit
                         * to drop it instead (a no-op once published), and say
                         * that the rows may still have landed.
                         */
                        pu_fail(pu, DP_ETIMEDOUT,
                                "commit of blob %s still pending (spill to SSD) when the "
                                "budget ran out: aborted, but its rows may have landed",
                                pu->blob_id);
                        send_abort_locked(c, pu, false);
                    }
                    break;
                case DP_WIRE_COMMIT_LOST:
                default:
                    pu_fail(
                        pu, DP_ELOST,
                        "commit of blob %s: the unit no longer has it (aborted, lease "
                        "expired or spill failed)",
                        pu->blob_id);
                    break;
                }
            } else {
                if (rc == 0)
                    rc = dp_wire_error_to_detail(&rep.err, &pu->det);
                if (rc == DP_EBUSY && dp__client_left(deadline) > 0) {
                    again = true;
                } else {
                    pu->rc = rc;
                    pu->state = ST_FAILED;
                    dp_fail_ctx(&pu->det, rc, "commit of blob %s", pu->blob_id);
                    /* Nothing was published: free the region (the WRITE is done). */
                    send_abort_locked(c, pu, false);
                }
            }
            dp_wire_reply_fini(&rep);
        }
        if (!again)
            return;
        dp__client_backoff(&step, deadline);
    }
}

/* The detail of a put with failed units: which units, why, which rows. */
static void
put_report(dp_client *c, const put_unit *pus, size_t npu, const uint32_t *order,
           const uint32_t *cnt, const uint64_t *gidxs, size_t n_rows, dp_detail *d)
{
    size_t bad = 0;
    const put_unit *first = NULL;
    for (size_t i = 0; i < npu; i++) {
        if (pus[i].state != ST_FAILED)
            continue;
        bad += pus[i].n_rows;
        if (first == NULL)
            first = &pus[i];
    }
    dp_fail(d, first->rc, "put: %zu of %zu rows did not land: unit %u (%s): %s", bad,
            n_rows, first->u, c->units[first->u].addr, dp_detail_msg(&first->det));
    for (size_t i = 0; i < npu; i++)
        if (pus[i].state == ST_FAILED && &pus[i] != first)
            dp__detail_append(d, "; unit %u (%s): %s", pus[i].u, c->units[pus[i].u].addr,
                              dp_errname(pus[i].rc));
    dp__detail_append(d, "; rows not landed:");
    for (size_t i = 0; i < npu; i++) {
        if (pus[i].state != ST_FAILED)
            continue;
        uint32_t u = pus[i].u;
        for (uint32_t k = cnt[u]; k < cnt[u + 1]; k++)
            dp__detail_append(d, " %" PRIu64, gidxs[order[k]]);
    }
}

int
dp_client_put(dp_client *c, const uint64_t *gidxs, size_t n_rows,
              const char *const *fields, size_t n_fields, const dp_value *values,
              int *row_status, dp_detail *d)
{
    int rc = check_args(c, gidxs, n_rows, fields, n_fields, values, d);
    if (rc != 0)
        return rc;
    if (row_status != NULL)
        for (size_t r = 0; r < n_rows; r++)
            row_status[r] = 0;
    if (n_rows == 0 || n_fields == 0)
        return DP_OK;
    rc = check_unique_rows(gidxs, n_rows, d);
    if (rc != 0)
        return rc;

    pthread_mutex_lock(&c->mu);
    double deadline = dp_now_s() + c->o.timeout_s;
    uint32_t N = c->n_units;
    size_t n_cells = n_rows * n_fields;
    uint32_t *cnt = calloc((size_t)N + 1, sizeof *cnt);
    uint32_t *order = malloc(n_rows * sizeof *order);
    put_unit *pus = calloc(N, sizeof *pus);
    const dp_value **ent_val = malloc(n_cells * sizeof *ent_val);
    dp_range *local = malloc((n_cells + N) * sizeof *local);
    dp_range *remote = malloc((n_cells + N) * sizeof *remote);
    uint32_t *slot_pu = malloc(N * sizeof *slot_pu);
    dp_xfer_desc *ops = malloc(N * sizeof *ops);
    int *results = malloc(N * sizeof *results);
    bool *sent = calloc(N, sizeof *sent);
    uint32_t *pos = calloc(N, sizeof *pos);
    size_t *flen = malloc(n_fields * sizeof *flen);
    dp__buf *stage = NULL;
    size_t npu = 0;
    if (cnt == NULL || order == NULL || pus == NULL || ent_val == NULL || local == NULL ||
        remote == NULL || slot_pu == NULL || ops == NULL || results == NULL ||
        sent == NULL || pos == NULL || flen == NULL) {
        rc = dp_fail(d, DP_ENOMEM, "put: out of memory");
        goto out;
    }

    for (size_t f = 0; f < n_fields; f++)
        flen[f] = strlen(fields[f]); /* checked by check_args */
    /* Group rows by unit (counting sort, stable). */
    for (size_t r = 0; r < n_rows; r++)
        cnt[gidxs[r] % N + 1]++;
    for (uint32_t u = 0; u < N; u++)
        cnt[u + 1] += cnt[u];
    for (size_t r = 0; r < n_rows; r++) {
        uint32_t u = (uint32_t)(gidxs[r] % N);
        order[cnt[u] + pos[u]++] = (uint32_t)r;
    }

    /* One blob per unit: index, layout, staging needs. */
    size_t stage_total = 0, n_ent = 0;
    for (uint32_t u = 0; u < N; u++) {
        if (cnt[u + 1] == cnt[u])
            continue;
        put_unit *pu = &pus[npu];
        pu->u = u;
        pu->n_rows = cnt[u + 1] - cnt[u];
        pu->ent0 = (uint32_t)n_ent;
        rc = build_unit_locked(c, pu, order + cnt[u], gidxs, fields, flen, n_fields,
                               values, ent_val, d);
        if (rc != 0)
            goto out;
        if (pu->n_ent == 0)
            continue; /* every cell skipped: nothing to send */
        n_ent += pu->n_ent;
        /* Too big for the put area and (spilling) for the IO area: refused up front. */
        if (pu->lay.total_len > c->units[u].slab_bytes &&
            (c->o.no_spill || pu->lay.total_len > c->units[u].io_bytes)) {
            rc = dp_fail(d, DP_ETOOBIG,
                         "put: the blob for unit %u (%s) needs %" PRIu64
                         " bytes, more than its slab of %" PRIu64 " bytes",
                         u, c->units[u].addr, pu->lay.total_len, c->units[u].slab_bytes);
            goto out;
        }
        bool any_staged = false;
        for (uint32_t i = 0; i < pu->n_ent; i++) {
            const dp_value *v = ent_val[pu->ent0 + i];
            if (v->nbytes == 0)
                continue;
            if (dp__client_direct_locked(c, v->data, v->nbytes))
                pu->any_direct = true;
            else
                any_staged = true;
        }
        pu->stage_off = stage_total;
        pu->stage_len = any_staged ? pu->lay.total_len : pu->lay.payload_off;
        stage_total += DP_ALIGN_UP(pu->stage_len, 64);
        snprintf(pu->blob_id, sizeof pu->blob_id, "%s-%" PRIx64, c->blob_prefix,
                 ++c->blob_seq);
        pu->state = ST_ALLOC;
        npu++;
    }
    if (npu == 0)
        goto out;

    /* Staging: header + index of every blob, and the payloads to copy. */
    rc = dp__client_buf_get_locked(c, stage_total, DP__BUF_STAGING, &stage, d);
    if (rc != 0) {
        stage = NULL;
        goto out;
    }
    size_t nr = 0;
    for (size_t i = 0; i < npu; i++) {
        put_unit *pu = &pus[i];
        uint8_t *base = stage->p + pu->stage_off;
        dp_blob_builder *b = c->builders[pu->u];
        rc = dp_blob_builder_write(b, base, pu->stage_len, d);
        if (rc != 0)
            goto out;
        pu->r0 = nr;
        if (!pu->any_direct) {
            local[nr++] = (dp_range){(uint64_t)(uintptr_t)base, pu->lay.total_len};
        } else {
            local[nr++] = (dp_range){(uint64_t)(uintptr_t)base, pu->lay.payload_off};
        }
        for (uint32_t e = 0; e < pu->n_ent; e++) {
            const dp_value *v = ent_val[pu->ent0 + e];
            if (v->nbytes == 0)
                continue;
            uint64_t off = dp_blob_builder_offset(b, e);
            if (dp__client_direct_locked(c, v->data, v->nbytes)) {
                local[nr++] = (dp_range){(uint64_t)(uintptr_t)v->data, v->nbytes};
                remote[nr - 1].nbytes = off; /* remote filled after alloc */
            } else {
                memcpy(base + off, v->data, v->nbytes);
                if (pu->any_direct) {
                    local[nr++] =
                        (dp_range){(uint64_t)(uintptr_t)(base + off), v->nbytes};
                    remote[nr - 1].nbytes = off;
                }
            }
        }
        pu->nr = nr - pu->r0;
    }

    /* Re-bind units that restarted or whose endpoint failed; others wait. */
    {
        uint32_t *us = malloc(npu * sizeof *us);
        int *rcs = malloc(npu * sizeof *rcs);
        dp_detail *dets = malloc(npu * sizeof *dets);
        if (us == NULL || rcs == NULL || dets == NULL) {
            free(us);
            free(rcs);
            free(dets);
            rc = dp_fail(d, DP_ENOMEM, "put: out of memory");
            goto out;
        }
        for (size_t i = 0; i < npu; i++)
            us[i] = pus[i].u;
        dp__client_ready_locked(c, us, npu, deadline, rcs, dets);
        for (size_t i = 0; i < npu; i++)
            if (rcs[i] != 0) {
                pus[i].rc = rcs[i];
                pus[i].det = dets[i];
                pus[i].state = ST_FAILED;
            }
        free(us);
        free(rcs);
        free(dets);
    }
    alloc_phase_locked(c, pus, npu, slot_pu, deadline);
    if (dp__client_test_hook != NULL)
        dp__client_test_hook("put:allocated");

    /* Remote ranges now that the offsets are known. */
    for (size_t i = 0; i < npu; i++) {
        put_unit *pu = &pus[i];
        if (pu->state != ST_WRITE)
            continue;
        uint64_t rbase = c->units[pu->u].slab_addr + pu->off;
        /* The header names the allocation: only it can publish these bytes. */
        dp_blob_header_set_alloc(stage->p + pu->stage_off, c->units[pu->u].incarnation,
                                 pu->token);
        remote[pu->r0] = (dp_range){rbase, local[pu->r0].nbytes};
        for (size_t k = pu->r0 + 1; k < pu->r0 + pu->nr; k++)
            remote[k] = (dp_range){rbase + remote[k].nbytes, local[k].nbytes};
    }
    size_t nw = write_phase_locked(c, pus, npu, ops, results, slot_pu, sent, local,
                                   remote, deadline);
    commit_phase_locked(c, pus, npu, slot_pu, sent, nw, deadline);

    bool failed = false;
    for (size_t i = 0; i < npu; i++) {
        put_unit *pu = &pus[i];
        if (pu->state != ST_FAILED)
            continue;
        failed = true;
        if (row_status != NULL)
            for (uint32_t k = cnt[pu->u]; k < cnt[pu->u + 1]; k++)
                row_status[order[k]] = pu->rc;
    }
    if (failed) {
        put_report(c, pus, npu, order, cnt, gidxs, n_rows, d);
        rc = d != NULL ? d->code : DP_ETRANSFER;
        if (d == NULL)
            for (size_t i = 0; i < npu; i++)
                if (pus[i].state == ST_FAILED) {
                    rc = pus[i].rc;
                    break;
                }
    }
out:
    if (stage != NULL)
        dp__client_buf_put_locked(c, stage->p);
    pthread_mutex_unlock(&c->mu);
    free(cnt);
    free(order);
    free(pus);
    free(ent_val);
    free(local);
    free(remote);
    free(slot_pu);
    free(ops);
    free(results);
    free(sent);
    free(pos);
    free(flen);
    return rc;
}
