/*
 * dp_client_put (docs/design.md, "Client put"): one blob per unit, alloc on
 * every unit at once, WRITE every blob at once, and each unit's commit sent
 * the moment its own WRITE is done (so a unit publishes while the other
 * WRITEs still run), then every commit reply awaited under one deadline.
 *
 * Each unit's part moves through ALLOC -> WRITE -> COMMIT -> DONE, or, when
 * its blob is small, INLINE -> DONE (the blob inside one put request; COMMIT
 * polls it if the unit spills it: docs/design.md, "Inline values"), or ends in
 * FAILED with its own code and detail; one unit failing does not stop the
 * others (a batch spanning units is not atomic), and the caller learns per
 * row what landed.
 *
 * Rows are grouped by unit with dp__groups, requests go through the client's
 * fanout scratch (dp__client_prepare_locked) and replies are decoded with
 * dp__fanout_reply (client/fanout.h); the phases below send on their own.
 *
 * The blobs themselves are sized, built and staged, and the location hints
 * of what landed filled, in put_build.c; put_int.h holds the types both
 * files share (put_op, put_unit).
 *
 * The blob's header and index always go through the staging buffer. A
 * payload in memory registered with the client, or any payload when the
 * unit's slab is mapped in this process (a unit on this host: the WRITE's
 * memcpy path copies it from where it lies), is written straight from there
 * as one more range of the same WRITE; any other payload is copied into
 * staging once, at its place in the blob. Gaps between payloads are
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
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/le.h"
#include "blob/keys.h"
#include "client/put_int.h"
#include "common/map.h"

/* Fail part pu with code and a message; returns code. */
static int pu_fail(put_unit *pu, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int
pu_fail(put_unit *pu, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    dp__step_vfail(&pu->st, code, fmt, ap);
    va_end(ap);
    pu->st.state = ST_FAILED;
    return code;
}

static void
send_abort_locked(dp_client *c, put_unit *pu, bool in_flight)
{
    dp__client_abort_locked(c, pu->st.u, pu->blob_id, in_flight);
}

static int
check_args(const dp_client *c, const uint64_t *gidxs, size_t n_rows,
           const char *const *fields, size_t n_fields, const dp_value *values,
           dp_detail *d)
{
    if (c == NULL || (n_rows > 0 && gidxs == NULL) || (n_fields > 0 && fields == NULL) ||
        (n_rows > 0 && n_fields > 0 && values == NULL))
        return dp__fail(d, DP_EINVAL, "put: NULL argument");
    if (n_rows > UINT32_MAX || n_fields > UINT32_MAX ||
        (n_fields > 0 && n_rows > (size_t)DP_BLOB_MAX_ENTRIES * 64 / n_fields))
        return dp__fail(d, DP_ETOOBIG, "put: %zu rows x %zu fields is too many", n_rows,
                        n_fields);
    for (size_t f = 0; f < n_fields; f++) {
        if (fields[f] == NULL)
            return dp__fail(d, DP_EINVAL, "put: field %zu is NULL", f);
        int rc = dp__field_check(fields[f], strlen(fields[f]), d);
        if (rc != 0)
            return dp__fail_ctx(d, rc, "put: field %zu", f);
        for (size_t g = 0; g < f; g++)
            if (strcmp(fields[f], fields[g]) == 0)
                return dp__fail(d, DP_EINVAL, "put: field '%s' given twice", fields[f]);
    }
    const char *ok_dtype = NULL; /* the last dtype found good, for ok_kind */
    int ok_kind = -1;
    for (size_t i = 0; i < n_rows * n_fields; i++) {
        const dp_value *v = &values[i];
        if ((unsigned)v->kind > DP_KIND_SKIP)
            return dp__fail(d, DP_EINVAL, "put: row %" PRIu64 " field '%s': bad kind %d",
                            gidxs[i / n_fields], fields[i % n_fields], (int)v->kind);
        if (v->kind == DP_KIND_SKIP)
            continue;
        if (v->data == NULL && v->nbytes > 0)
            return dp__fail(d, DP_EINVAL,
                            "put: row %" PRIu64 " field '%s': NULL data of %" PRIu64
                            " bytes",
                            gidxs[i / n_fields], fields[i % n_fields], v->nbytes);
        /* What the blob builder would refuse, refused before anything is sent. */
        const char *dt = v->dtype != NULL ? v->dtype : "", *why = NULL;
        if (dt != ok_dtype || (int)v->kind != ok_kind) { /* a batch repeats one */
            why = dp__blob_dtype_problem(dt, strnlen(dt, DP_BLOB_DTYPE_MAX + 1),
                                         (dp__blob_kind)v->kind);
            ok_dtype = why == NULL ? dt : NULL;
            ok_kind = (int)v->kind;
        }
        if (why == NULL && v->ndim > DP_BLOB_MAX_DIMS)
            why = "shape has more than 32 dims";
        if (why == NULL && v->ndim > 0 && v->shape == NULL)
            why = "shape is NULL";
        if (why != NULL)
            return dp__fail(d, DP_EINVAL, "put: row %" PRIu64 " field '%s': %s",
                            gidxs[i / n_fields], fields[i % n_fields], why);
    }
    return DP_OK;
}

/*
 * Rows must be unique: two values for one key in one blob are ambiguous.
 * Rows in increasing order (the usual batch) are unique at a glance; others
 * go through a map of the rows (sorting them cost a put of 4 KiB values about 360
 * instructions a value, bench/pervalue.sh).
 */
static int
check_unique_rows(const uint64_t *gidxs, size_t n, dp_detail *d)
{
    size_t i = 1;
    while (i < n && gidxs[i] > gidxs[i - 1])
        i++;
    if (i >= n)
        return DP_OK;
    dp__map seen;
    dp__map_init_u64(&seen);
    int rc = DP_OK;
    for (size_t k = 0; k < n && rc == DP_OK; k++) {
        void *old = NULL;
        if (dp__map_put_u64(&seen, gidxs[k], (void *)1, &old) != DP_OK)
            rc = dp__fail(d, DP_ENOMEM, "put: out of memory");
        else if (old != NULL)
            rc = dp__fail(d, DP_EINVAL, "put: row %" PRIu64 " given twice", gidxs[k]);
    }
    dp__map_fini(&seen);
    return rc;
}

/*
 * Send q (unit pu's alloc or inline put) as c->fo.items[slot] without
 * waiting. False when it could not be prepared (pu failed); a failed send
 * leaves its code in the item, read like a lost reply.
 */
static bool
send_part_locked(dp_client *c, put_unit *pu, size_t slot, dp__wire_request *q)
{
    dp_detail_clear(&pu->st.det);
    int rc = dp__client_prepare_locked(c, pu->st.u, slot, q, &pu->st.det);
    if (rc != 0) {
        pu->st.rc = rc;
        pu->st.state = ST_FAILED;
        return false;
    }
    dp__ctl_send(c->ctl, &c->fo.items[slot]);
    return true;
}

/*
 * Send unit pu's alloc as c->fo.items[slot] without waiting (its reply is
 * read by alloc_replies_locked). False when it could not be prepared (pu
 * failed); a failed send leaves its code in the item, read like a lost reply.
 */
static bool
alloc_send_locked(dp_client *c, put_unit *pu, size_t slot)
{
    dp__wire_request q;
    memset(&q, 0, sizeof q);
    q.op = DP_WIRE_OP_ALLOC;
    q.a.alloc.blob_id = dp__wire_s(pu->blob_id);
    q.a.alloc.nbytes = pu->size;
    q.a.alloc.n_entries = pu->n_ent;
    q.a.alloc.spill = !c->o.no_spill && c->only_unit < 0;
    q.a.alloc.repair = c->only_unit >= 0; /* a repair's copy: only missing keys */
    /* Who writes the region: lets the unit reclaim it if this process dies. */
    q.a.alloc.writer = dp__wire_s(c->blob_prefix);
    q.a.alloc.pid = (uint64_t)getpid();
    q.a.alloc.host = dp__wire_s(dp__host_key());
    q.a.alloc.lane = dp__wire_s(c->units[pu->st.u].route.lane);
    q.a.alloc.two_sided = c->units[pu->st.u].route.two_sided;
    return send_part_locked(c, pu, slot, &q);
}

/*
 * Wait for the allocs sent as slots [0, ns) (slot s: unit pus[slot_pu[s]])
 * and take their answers: ST_WRITE with the region, ST_FAILED, or still
 * ST_ALLOC when the unit was busy (returns true then).
 */
static bool
alloc_replies_locked(put_op *p, size_t ns)
{
    dp_client *c = p->c;
    put_unit *pus = p->pus;
    const uint32_t *slot_pu = p->slot_pu;
    double deadline = p->deadline;
    dp__ctl_wait_many(c->ctl, c->fo.items, ns, dp__client_round_timeout(deadline));
    bool busy = false;
    for (size_t s = 0; s < ns; s++) {
        put_unit *pu = &pus[slot_pu[s]];
        dp__ctl_item *it = &c->fo.items[s];
        dp__wire_reply rep;
        int rc = dp__fanout_reply(it, DP_WIRE_OP_ALLOC, &rep, &pu->st.det);
        if (rc == 0 &&
            dp__client_reply_check_locked(c, pu->st.u, &rep, true, &pu->st.det)) {
            /* Another process answered: free what it allocated, WRITE nothing. */
            pu->st.rc = DP_ERESTARTED;
            pu->st.state = ST_FAILED;
            if (rep.ok)
                send_abort_locked(c, pu, false);
        } else if (rc == 0 && rep.ok) {
            pu->off = rep.r.alloc.off;
            pu->token = rep.r.alloc.token;
            if (pu->off > c->units[pu->st.u].region_bytes ||
                pu->size > c->units[pu->st.u].region_bytes - pu->off)
                pu_fail(pu, DP_EPROTO,
                        "alloc answered offset %" PRIu64 " for %" PRIu64
                        " bytes, outside the unit's region of %" PRIu64 " bytes",
                        pu->off, pu->size, c->units[pu->st.u].region_bytes);
            else
                pu->st.state = ST_WRITE;
        } else if (rc == 0) {
            rc = dp__wire_error_to_detail(&rep.err, &pu->st.det);
            if (rc == DP_EBUSY && dp__left_s(deadline) > 0) {
                busy = true; /* stays in ST_ALLOC */
                c->cnt.busy_waits++;
            } else {
                pu->st.rc = rc;
                pu->st.state = ST_FAILED;
                if (rc == DP_EBUSY)
                    dp__fail_ctx(&pu->st.det, rc,
                                 "alloc stayed busy for the whole budget");
            }
        } else {
            /* No reply, or none that decodes: the unit may have allocated. */
            if (it->rc == DP_ETRANSFER)
                c->cnt.units_down++;
            pu->st.rc = rc;
            pu->st.state = ST_FAILED;
            send_abort_locked(c, pu, false);
        }
        dp__wire_reply_fini(&rep);
    }
    return busy;
}

/*
 * The allocs: the first round's requests were sent already (slots [0,
 * ns_sent), before the build); take their answers, then send again to busy
 * units with backoff until the deadline.
 */
static void
alloc_phase_locked(put_op *p, size_t ns_sent)
{
    dp_client *c = p->c;
    put_unit *pus = p->pus;
    size_t npu = p->npu;
    uint32_t *slot_pu = p->slot_pu;
    double deadline = p->deadline;
    double step = DP__CLIENT_BACKOFF_FIRST_S;
    size_t ns = ns_sent;
    for (;;) {
        if (ns == 0 || !alloc_replies_locked(p, ns))
            return;
        c->cnt.retries++;
        dp__backoff_sleep(&step, DP__CLIENT_BACKOFF_MAX_S, deadline);
        ns = 0;
        for (size_t i = 0; i < npu; i++)
            if (pus[i].st.state == ST_ALLOC && alloc_send_locked(c, &pus[i], ns))
                slot_pu[ns++] = (uint32_t)i;
    }
}

/*
 * Send unit pu's inline put (its staged blob inside the request) as
 * c->fo.items[slot] without waiting. False when it could not be prepared.
 */
static bool
inline_send_locked(dp_client *c, put_unit *pu, const uint8_t *stage, size_t slot)
{
    dp__wire_request q;
    memset(&q, 0, sizeof q);
    q.op = DP_WIRE_OP_PUT;
    q.a.put.blob_id = dp__wire_s(pu->blob_id);
    q.a.put.data = (dp__wire_bytes){stage + pu->stage_off, (uint32_t)pu->lay.total_len};
    q.a.put.n_entries = pu->n_ent;
    q.a.put.spill = !c->o.no_spill && c->only_unit < 0;
    q.a.put.repair = c->only_unit >= 0;
    q.a.put.ver = pu->ver;
    q.a.put.vers = (dp__wire_u64s){pu->vers, pu->vers != NULL ? pu->n_ent : 0};
    /* Only the process this client is bound to may store it. */
    q.a.put.incarnation = c->units[pu->st.u].incarnation;
    return send_part_locked(c, pu, slot, &q);
}

/* Send every ST_INLINE unit's put into slots base.. (slot_pu); returns how many. */
static size_t
inline_send_all_locked(put_op *p, size_t base)
{
    dp_client *c = p->c;
    put_unit *pus = p->pus;
    size_t npu = p->npu;
    uint32_t *slot_pu = p->slot_pu;
    const uint8_t *stage = p->stage;
    size_t n = 0;
    for (size_t i = 0; i < npu; i++)
        if (pus[i].st.state == ST_INLINE &&
            inline_send_locked(c, &pus[i], stage, base + n))
            slot_pu[base + n++] = (uint32_t)i;
    return n;
}

/*
 * How long a put waits for its units' answers: what is left of the budget,
 * and a moment (50 ms) even when it is spent (an answer may be here). With
 * read leases a share of it (dp__client_round_timeout): a unit silent that
 * long is fenced, and the rest of the budget is the fence's
 * (docs/design.md, "Leases").
 */
static double
answer_wait(const dp_client *c, double deadline)
{
    return DP_MAX(c->leases ? dp__client_round_timeout(deadline) : dp__left_s(deadline),
                  0.05);
}

/*
 * The inline puts sent as slots [base, base + n): "done" lands the unit's
 * rows; "pending" (a spill) leaves it to the commit phase's polls (poll);
 * a busy unit is sent the same put again, with backoff, until the deadline.
 * A put with no answer may still have landed: it is aborted (a no-op once
 * published) and its rows reported as not landed.
 */
static void
inline_phase_locked(put_op *p, size_t base, size_t n)
{
    dp_client *c = p->c;
    put_unit *pus = p->pus;
    uint32_t *slot_pu = p->slot_pu;
    double deadline = p->deadline;
    double step = DP__CLIENT_BACKOFF_FIRST_S;
    while (n > 0) {
        /*
         * As a commit: what is left of the budget, and a moment (50 ms) even
         * when the WRITEs of other units spent it (the answer may be here).
         */
        dp__ctl_wait_many(c->ctl, c->fo.items + base, n, answer_wait(c, deadline));
        bool busy = false;
        for (size_t s = base; s < base + n; s++) {
            put_unit *pu = &pus[slot_pu[s]];
            dp__ctl_item *it = &c->fo.items[s];
            dp__wire_reply rep;
            int rc = dp__fanout_reply(it, DP_WIRE_OP_PUT, &rep, &pu->st.det);
            if (rc == 0 &&
                dp__client_reply_check_locked(c, pu->st.u, &rep, true, &pu->st.det)) {
                /* Another process answered: the restart is reported; a blob it
                 * did not publish yet (a spill) is dropped. */
                pu->st.rc = DP_ERESTARTED;
                pu->st.state = ST_FAILED;
                if (rep.ok)
                    send_abort_locked(c, pu, false);
            } else if (rc == 0 && rep.ok) {
                if (rep.r.commit == DP_WIRE_COMMIT_DONE) {
                    pu->st.state = ST_DONE;
                } else if (rep.r.commit == DP_WIRE_COMMIT_PENDING) {
                    pu->st.state = ST_COMMIT;
                    pu->poll = true;
                } else {
                    pu_fail(pu, DP_ELOST, "put of blob %s: the unit lost it",
                            pu->blob_id);
                }
            } else if (rc == 0) {
                rc = dp__wire_error_to_detail(&rep.err, &pu->st.det);
                if (rc == DP_EBUSY && dp__left_s(deadline) > 0) {
                    busy = true; /* stays ST_INLINE: nothing was allocated */
                    c->cnt.busy_waits++;
                } else if (rc == DP__ESTALE) {
                    pu->st.rc = rc; /* as a commit's (nothing stored) */
                    pu->st.state = ST_FAILED;
                    pu->stale = rep.err.ver;
                } else {
                    pu->st.rc = rc;
                    pu->st.state = ST_FAILED;
                    dp__fail_ctx(&pu->st.det, rc,
                                 rc == DP_EBUSY ? "put stayed busy for the whole budget"
                                                : "put of blob %s",
                                 pu->blob_id);
                }
            } else {
                if (it->rc == DP_ETRANSFER)
                    c->cnt.units_down++;
                dp_detail why = pu->st.det; /* pu_fail writes pu->st.det */
                pu_fail(pu, rc,
                        "put of blob %s got no answer (%s): its rows may or may not have "
                        "landed; aborted",
                        pu->blob_id, dp_detail_msg(&why));
                send_abort_locked(c, pu, false);
            }
            dp__wire_reply_fini(&rep);
        }
        if (!busy)
            return;
        c->cnt.retries++;
        dp__backoff_sleep(&step, DP__CLIENT_BACKOFF_MAX_S, deadline);
        n = inline_send_all_locked(p, base);
    }
}

/* Sends the commit of unit pu as c->fo.items[slot]; sent[slot] says it went. */
static void
send_commit_locked(dp_client *c, put_unit *pu, size_t slot, bool *sent)
{
    dp__wire_request q;
    memset(&q, 0, sizeof q);
    q.op = DP_WIRE_OP_COMMIT;
    q.a.commit.blob_id = dp__wire_s(pu->blob_id);
    q.a.commit.ver = pu->ver;
    q.a.commit.vers = (dp__wire_u64s){pu->vers, pu->vers != NULL ? pu->n_ent : 0};
    int rc = dp__client_prepare_locked(c, pu->st.u, slot, &q, &pu->st.det);
    if (rc != 0) {
        pu->st.rc = rc;
        pu->st.state = ST_FAILED;
        send_abort_locked(c, pu, false);
        return;
    }
    /* A failed send leaves its code in the item: the reply loop reports it. */
    dp__ctl_send(c->ctl, &c->fo.items[slot]);
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
    pu->st.state = ST_COMMIT;
    send_commit_locked(w->c, pu, slot, w->sent);
}

/*
 * WRITE every blob in ST_WRITE at once; each commit is sent as soon as its
 * WRITE is done (sent[slot], slots as slot_pu), for commit_phase_locked to
 * wait for. Returns the number of slots.
 */
static size_t
write_phase_locked(put_op *p)
{
    dp_client *c = p->c;
    put_unit *pus = p->pus;
    size_t npu = p->npu;
    dp__xfer_desc *ops = p->ops;
    dp__xfer_result *res = p->results;
    uint32_t *slot_pu = p->slot_pu;
    bool *sent = p->sent;
    const dp__range *local = p->local, *remote = p->remote;
    double deadline = p->deadline;
    size_t nops = 0;
    for (size_t i = 0; i < npu; i++) {
        put_unit *pu = &pus[i];
        if (pu->st.state != ST_WRITE)
            continue;
        size_t idn = strlen(pu->blob_id);
        dp__le64_store(pu->grant, pu->token);
        memcpy(pu->grant + 8, pu->blob_id, idn);
        pu->grant_len = (uint32_t)(8 + idn);
        ops[nops] = (dp__xfer_desc){.op = DP_XFER_WRITE,
                                    .local = local + pu->r0,
                                    .n_local = pu->nr,
                                    .remote = remote + pu->r0,
                                    .n_remote = pu->nr,
                                    .remote_name = c->units[pu->st.u].remote,
                                    .grant = pu->grant,
                                    .grant_len = pu->grant_len,
                                    .local_plain_ok = pu->copy_max > 0};
        sent[nops] = false;
        slot_pu[nops++] = (uint32_t)i;
    }
    if (nops == 0)
        return 0;
    double left = dp__left_s(deadline);
    if (!(left > 0)) {
        for (size_t s = 0; s < nops; s++) {
            put_unit *pu = &pus[slot_pu[s]];
            pu_fail(pu, DP_ETIMEDOUT, "no time left for the WRITE of blob %s",
                    pu->blob_id);
            send_abort_locked(c, pu, false);
        }
        return nops;
    }
    write_ctx w = {c, pus, slot_pu, sent};
    dp__endpoint_transfer_many(c->ep, ops, nops, left, res,
                               &(dp__xfer_notify){write_done, &w}, NULL);
    for (size_t s = 0; s < nops; s++) {
        put_unit *pu = &pus[slot_pu[s]];
        if (res[s].rc == 0)
            continue; /* committing (or failed to send it) since write_done */
        pu->st.det = res[s].det;
        pu->st.rc = res[s].rc;
        pu->st.state = ST_FAILED;
        /*
         * Its alloc was just answered, so the unit lives: a WRITE that failed
         * over a network lane means a stalled connection (TCP backing off
         * after an outage): a new one is made before the next transfer.
         */
        if (res[s].suspect)
            c->units[pu->st.u].ep_suspect = true;
        /* Tell the unit the truth: in flight only if bytes may still land. */
        send_abort_locked(c, pu, res[s].may_land);
        dp__fail_ctx(&pu->st.det, res[s].rc, "WRITE of blob %s (%" PRIu64 " bytes, %s%s)",
                     pu->blob_id, pu->lay.total_len, res[s].fate,
                     res[s].may_land ? ": the unit retires it" : ": the unit frees it");
    }
    return nops;
}

/*
 * Wait for the commits of every blob in ST_COMMIT, asking again while one is
 * "pending" (spill) or busy. The first round's commits went out from
 * write_done: slots [0, ns) as slot_pu, those with sent[slot].
 */
static void
commit_phase_locked(put_op *p, size_t ns)
{
    dp_client *c = p->c;
    put_unit *pus = p->pus;
    size_t npu = p->npu;
    uint32_t *slot_pu = p->slot_pu;
    bool *sent = p->sent;
    double deadline = p->deadline;
    double step = DP__CLIENT_BACKOFF_FIRST_S;
    /* Inline puts that answered "pending": their first commit is a poll. */
    bool extra = false;
    for (size_t i = 0; i < npu; i++)
        extra = extra || (pus[i].st.state == ST_COMMIT && pus[i].poll);
    for (bool first = true;; first = false) {
        if (!first) {
            ns = 0;
            for (size_t i = 0; i < npu; i++) {
                if (pus[i].st.state != ST_COMMIT)
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
        if (nsent == 0 && !(first && extra))
            return;
        /* Give a commit a moment (50 ms) even when the budget is spent: its WRITE is
         * done. */
        dp__ctl_wait_many(c->ctl, c->fo.items, ns, answer_wait(c, deadline));
        bool again = false;
        for (size_t s = 0; s < ns; s++) {
            if (!sent[s])
                continue;
            put_unit *pu = &pus[slot_pu[s]];
            dp__ctl_item *it = &c->fo.items[s];
            if (it->rc != 0) {
                pu->st.det = it->det;
                if (it->rc == DP_ETRANSFER)
                    c->cnt.units_down++;
                pu_fail(pu, it->rc,
                        "commit of blob %s got no answer (%s): its rows may or may not "
                        "have landed; aborted",
                        pu->blob_id, dp_detail_msg(&it->det));
                send_abort_locked(c, pu, false);
                continue;
            }
            dp__wire_reply rep;
            int rc = dp__fanout_reply(it, DP_WIRE_OP_COMMIT, &rep, &pu->st.det);
            if (rc == 0 &&
                dp__client_reply_check_locked(c, pu->st.u, &rep, true, &pu->st.det)) {
                /* The process that took the WRITE is gone: its rows did not land. */
                pu->st.rc = DP_ERESTARTED;
                pu->st.state = ST_FAILED;
            } else if (rc == 0 && rep.ok) {
                switch (rep.r.commit) {
                case DP_WIRE_COMMIT_DONE:
                    pu->st.state = ST_DONE;
                    break;
                case DP_WIRE_COMMIT_PENDING:
                    if (dp__left_s(deadline) > 0)
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
                    rc = dp__wire_error_to_detail(&rep.err, &pu->st.det);
                if (rc == DP_EBUSY && dp__left_s(deadline) > 0) {
                    again = true;
                    c->cnt.busy_waits++;
                } else if (rc == DP__ESTALE) {
                    /* A key is held at a newer version: nothing published, the
                     * unit freed the region; put again above it. */
                    pu->st.rc = rc;
                    pu->st.state = ST_FAILED;
                    pu->stale = rep.err.ver;
                } else {
                    pu->st.rc = rc;
                    pu->st.state = ST_FAILED;
                    dp__fail_ctx(&pu->st.det, rc, "commit of blob %s", pu->blob_id);
                    /* Nothing was published: free the region (the WRITE is done). */
                    send_abort_locked(c, pu, false);
                }
            }
            dp__wire_reply_fini(&rep);
        }
        if (!again && !(first && extra))
            return;
        c->cnt.retries++;
        dp__backoff_sleep(&step, DP__CLIENT_BACKOFF_MAX_S, deadline);
    }
}

/* The detail of a put with failed units: which units, why, which rows. */
static void
put_report(const put_op *p, dp_detail *d)
{
    dp_client *c = p->c;
    const put_unit *pus = p->pus;
    size_t npu = p->npu;
    const dp__groups *g = &p->g;
    const uint64_t *gidxs = p->gidxs;
    size_t n_rows = p->n_rows;
    size_t bad = 0;
    const put_unit *first = NULL;
    for (size_t i = 0; i < npu; i++) {
        if (pus[i].st.state != ST_FAILED)
            continue;
        bad += pus[i].n_rows;
        if (first == NULL)
            first = &pus[i];
    }
    dp__fail(d, first->st.rc, "put: %zu of %zu rows did not land: unit %u (%s): %s", bad,
             n_rows, first->st.u, c->units[first->st.u].addr,
             dp_detail_msg(&first->st.det));
    for (size_t i = 0; i < npu; i++)
        if (pus[i].st.state == ST_FAILED && &pus[i] != first)
            dp__detail_append(d, "; unit %u (%s): %s", pus[i].st.u,
                              c->units[pus[i].st.u].addr, dp_errname(pus[i].st.rc));
    dp__detail_append(d, "; rows not landed:");
    for (size_t i = 0; i < npu; i++) {
        if (pus[i].st.state != ST_FAILED)
            continue;
        uint32_t u = pus[i].st.u;
        for (uint32_t k = g->start[u]; k < g->start[u + 1]; k++)
            dp__detail_append(d, " %" PRIu64, gidxs[g->order[k]]);
    }
}

/* A put's per-call arrays, sized for its client and batch (put_op_make / _fini). */

static void
put_op_fini(put_op *a)
{
    dp__groups_fini(&a->g);
    free(a->pus);
    free(a->ent_val);
    free(a->ent_key);
    free(a->local);
    free(a->remote);
    free(a->slot_pu);
    free(a->ops);
    free(a->results);
    free(a->sent);
    free(a->flen);
    free(a->fseen);
    free(a->ent_ver);
    memset(a, 0, sizeof *a);
}

static int
put_op_make(put_op *a, bool locs, dp_detail *d)
{
    uint32_t N = a->c->n_units;
    size_t n_cells = a->n_rows * a->n_fields * a->copies; /* every copy's entries */
    a->pus = calloc(N, sizeof *a->pus);
    a->ent_val = malloc(n_cells * sizeof *a->ent_val);
    if (locs && (a->ent_key = malloc(n_cells * sizeof *a->ent_key)) == NULL)
        return dp__fail(d, DP_ENOMEM, "put: out of memory");
    if (a->cell_ver != NULL &&
        (a->ent_ver = malloc(n_cells * sizeof *a->ent_ver)) == NULL)
        return dp__fail(d, DP_ENOMEM, "put: out of memory");
    a->local = malloc((n_cells + N) * sizeof *a->local);
    a->remote = malloc((n_cells + N) * sizeof *a->remote);
    a->slot_pu = malloc(N * sizeof *a->slot_pu);
    a->ops = malloc(N * sizeof *a->ops);
    a->results = malloc(N * sizeof *a->results);
    a->sent = calloc(N, sizeof *a->sent);
    a->flen = malloc(a->n_fields * sizeof *a->flen);
    a->fseen = malloc(2 * a->n_fields * sizeof *a->fseen);
    if (a->pus == NULL || a->ent_val == NULL || a->local == NULL || a->remote == NULL ||
        a->slot_pu == NULL || a->ops == NULL || a->results == NULL || a->sent == NULL ||
        a->flen == NULL || a->fseen == NULL)
        return dp__fail(d, DP_ENOMEM, "put: out of memory");
    a->fnum = a->fseen + a->n_fields; /* both set where they are used */
    for (size_t f = 0; f < a->n_fields; f++)
        a->flen[f] = strlen(a->fields[f]); /* checked by check_args */
    if (a->c->only_unit < 0)
        return dp__groups_make_copies(&a->g, N, a->gidxs, a->n_rows, 0, a->copies, d);
    /* A repair's copy: every row to the one unit it fills. */
    uint64_t *to = malloc((a->n_rows > 0 ? a->n_rows : 1) * sizeof *to);
    if (to == NULL)
        return dp__fail(d, DP_ENOMEM, "put: out of memory");
    for (size_t r = 0; r < a->n_rows; r++)
        to[r] = (uint64_t)a->c->only_unit;
    int rc = dp__groups_make_copies(&a->g, N, to, a->n_rows, 0, 1, d);
    free(to);
    return rc;
}

/* Re-bind units that restarted or whose endpoint failed; others wait. */
static int
put_ready_locked(put_op *p, dp_detail *d)
{
    dp_client *c = p->c;
    double deadline = p->deadline;
    size_t npu = p->npu;
    uint32_t *us = malloc(npu * sizeof *us);
    int *rcs = malloc(npu * sizeof *rcs);
    dp_detail *dets = malloc(npu * sizeof *dets);
    int rc = DP_OK;
    if (us == NULL || rcs == NULL || dets == NULL) {
        rc = dp__fail(d, DP_ENOMEM, "put: out of memory");
        goto out;
    }
    for (size_t i = 0; i < npu; i++)
        us[i] = p->pus[i].st.u;
    dp__client_ready_locked(c, us, npu, deadline, rcs, dets);
    for (size_t i = 0; i < npu; i++)
        if (rcs[i] != 0 && !(rcs[i] == DP_ERESTARTED && p->copies > 1)) {
            /* With replicas a restarted unit (re-bound now) takes its copy:
             * the restart lost no row (docs/design.md, "Replicas"). */
            p->pus[i].st.rc = rcs[i];
            p->pus[i].st.det = dets[i];
            p->pus[i].st.state = ST_FAILED;
        }
out:
    free(us);
    free(rcs);
    free(dets);
    return rc;
}

int
dp__put_outcome_locked(const put_op *p, int *row_status, dp_detail *d)
{
    bool failed = false;
    int first = DP_OK;
    for (size_t i = 0; i < p->npu; i++) {
        const put_unit *pu = &p->pus[i];
        if (pu->st.state != ST_FAILED)
            continue;
        failed = true;
        if (first == DP_OK)
            first = pu->st.rc;
        if (row_status != NULL)
            for (uint32_t k = p->g.start[pu->st.u]; k < p->g.start[pu->st.u + 1]; k++)
                row_status[p->g.order[k]] = pu->st.rc;
    }
    if (!failed)
        return DP_OK;
    put_report(p, d);
    return d != NULL ? d->code : first;
}

/* A put of a's call arguments, and its rows put again when a part asked for it. */
static int
put_call(put_op *a, int *row_status, dp_loc *locs, dp_detail *d)
{
    int rc = dp__put_impl(a, row_status, locs, d);
    if (a->n_again > 0)
        rc = dp__put_again(a, rc, row_status, locs, d);
    free(a->again);
    return rc;
}

int
dp_client_put(dp_client *c, const uint64_t *gidxs, size_t n_rows,
              const char *const *fields, size_t n_fields, const dp_value *values,
              int *row_status, dp_detail *d)
{
    put_op a = {.c = c,
                .gidxs = gidxs,
                .n_rows = n_rows,
                .fields = fields,
                .n_fields = n_fields,
                .values = values};
    return put_call(&a, row_status, NULL, d);
}

int
dp__client_put_copy(dp_client *c, const uint64_t *gidxs, size_t n_rows,
                    const char *const *fields, size_t n_fields, const dp_value *values,
                    const uint64_t *cell_ver, int *row_status, dp_detail *d)
{
    put_op a = {.c = c,
                .gidxs = gidxs,
                .n_rows = n_rows,
                .fields = fields,
                .n_fields = n_fields,
                .values = values,
                .cell_ver = cell_ver};
    return put_call(&a, row_status, NULL, d);
}

int
dp_client_put_locs(dp_client *c, const uint64_t *gidxs, size_t n_rows,
                   const char *const *fields, size_t n_fields, const dp_value *values,
                   int *row_status, dp_loc *locs, dp_detail *d)
{
    if (locs != NULL && n_rows > 0 && n_fields > 0 && n_rows <= SIZE_MAX / n_fields)
        memset(locs, 0, n_rows * n_fields * sizeof *locs);
    put_op a = {.c = c,
                .gidxs = gidxs,
                .n_rows = n_rows,
                .fields = fields,
                .n_fields = n_fields,
                .values = values};
    return put_call(&a, row_status, locs, d);
}

int
dp__put_impl(put_op *ap, int *row_status, dp_loc *locs, dp_detail *d)
{
    put_op a = *ap; /* the call's arguments; the rest is filled below */
    dp_client *c = a.c;
    const uint64_t *gidxs = a.gidxs;
    size_t n_rows = a.n_rows, n_fields = a.n_fields;
    const dp_value *values = a.values;
    int rc = check_args(c, gidxs, n_rows, a.fields, n_fields, values, d);
    if (rc == 0)
        rc = dp__client_data_check(c, "put", d);
    if (rc == 0 && n_rows > 0 && n_fields > 0)
        rc = check_unique_rows(gidxs, n_rows, d);
    /* Every row: 0 (landed, or nothing to do) unless a unit's part says otherwise. */
    if (row_status != NULL)
        for (size_t r = 0; r < n_rows; r++)
            row_status[r] = rc;
    if (rc != 0 || n_rows == 0 || n_fields == 0)
        return rc;

    pthread_mutex_lock(&c->mu);
    if (a.deadline == 0) /* a put again keeps its call's budget */
        a.deadline = dp__now_s() + c->o.timeout_s;
    a.copies = c->only_unit >= 0 ? 1 : dp__client_replicas(c);
    /* A repair's copy keeps no version of its own (docs/design.md, "Versions"). */
    a.ver = c->only_unit >= 0 ? 0 : dp__client_ver_next_locked(c, a.ver_above);
    dp__client_buf *stage = NULL;
    size_t stage_total = 0;
    bool decided = false; /* put_outcome_locked set row_status */
    rc = put_op_make(&a, locs != NULL, d);
    if (rc == 0)
        rc = dp__put_size_locked(&a, d);
    if (rc != 0 || a.npu == 0 || (rc = put_ready_locked(&a, d)) != 0 ||
        (rc = dp__put_fits_locked(&a, d)) != 0)
        goto out;
    /*
     * Every check passed and every blob is sized: the allocs go out now, and
     * the indexes are built and staged while they travel.
     */
    size_t ns = 0;
    for (size_t i = 0; i < a.npu; i++)
        if (a.pus[i].st.state == ST_ALLOC && alloc_send_locked(c, &a.pus[i], ns))
            a.slot_pu[ns++] = (uint32_t)i;
    rc = dp__put_build_locked(&a, &stage_total, d);
    if (rc == 0)
        rc = dp__client_buf_get_locked(c, stage_total, DP__BUF_STAGING, &stage, d);
    if (rc != 0) {
        stage = NULL;
    } else {
        a.stage = stage->p;
        rc = dp__put_stage_locked(&a, d);
    }
    if (rc != 0) {
        /* Nothing was written: take the allocs' answers and free what they got. */
        alloc_replies_locked(&a, ns);
        for (size_t i = 0; i < a.npu; i++)
            if (a.pus[i].st.state == ST_WRITE)
                send_abort_locked(c, &a.pus[i], false);
        goto out;
    }
    /*
     * Small blobs go inside their put requests, in the slots after the allocs'
     * (alloc retries, WRITEs and commits use at most as many slots as allocs
     * were sent, so these stay untouched until inline_phase_locked reads them).
     */
    for (size_t i = 0; i < a.npu; i++)
        if (a.pus[i].size_bug && a.pus[i].st.state == ST_INLINE)
            pu_fail(&a.pus[i], DP_EPROTO,
                    "internal error: blob %s built to another size "
                    "than sized; nothing sent",
                    a.pus[i].blob_id);
    size_t ni = inline_send_all_locked(&a, ns);
    alloc_phase_locked(&a, ns);
    for (size_t i = 0; i < a.npu; i++)
        if (a.pus[i].size_bug && a.pus[i].st.state == ST_WRITE) {
            send_abort_locked(c, &a.pus[i], false);
            pu_fail(&a.pus[i], DP_EPROTO,
                    "internal error: blob %s built to another size than its alloc asked "
                    "for; aborted",
                    a.pus[i].blob_id);
        }
    if (dp__client_test_hook != NULL)
        dp__client_test_hook("put:allocated");
    dp__put_remote_ranges_locked(&a);
    size_t nw = write_phase_locked(&a);
    inline_phase_locked(&a, ns, ni);
    commit_phase_locked(&a, nw);
    dp__put_stale_locked(&a);
    rc = a.copies > 1 ? dp__put_decide_copies_locked(&a, row_status, d)
                      : dp__put_outcome_locked(&a, row_status, d);
    decided = true;
    if (locs != NULL)
        dp__put_locs_locked(&a, locs);
    c->cnt.puts++;
    for (size_t r = 0; r < n_rows; r++)
        if ((row_status == NULL ? rc == 0 : row_status[r] == 0) &&
            (a.again == NULL || !a.again[r]))
            for (size_t f = 0; f < n_fields; f++)
                c->cnt.put_bytes += values[r * n_fields + f].nbytes;
out:
    if (!decided && rc != 0 && row_status != NULL) /* refused before any transfer */
        for (size_t r = 0; r < n_rows; r++)
            row_status[r] = rc;
    if (stage != NULL)
        dp__client_buf_put_locked(c, stage->p);
    pthread_mutex_unlock(&c->mu);
    ap->again = a.again; /* the caller's, to put those rows again */
    ap->n_again = a.n_again;
    ap->deadline = a.deadline;
    ap->ver_above = a.ver_above; /* raised by a "Stale" answer */
    a.again = NULL;
    put_op_fini(&a);
    return rc;
}
