/*
 * Transfers of an endpoint: validating a batch of ops, posting each op's
 * ranges (UCX put/get, or memcpy into a remote region mapped here), waiting
 * for all of them under one deadline, ending each op DONE or handing it to
 * the graveyard, and releasing retained ops whose UCX requests completed
 * later (the released list).
 *
 * Design notes
 * ------------
 * Invariants
 * - Every posted transfer ends DONE (all its UCX requests completed and
 *   released) or is retained in the process graveyard with its local ranges,
 *   on every exit path: success, error, timeout, peer failure. A retained
 *   transfer's bookkeeping (struct batch) is owned by the graveyard and is
 *   not freed while UCX may still invoke its completion callback: only once
 *   that callback saw its last request complete, and then outside it
 *   (dp__ep_reap_locked, after a progress).
 * - Arguments are validated completely (endpoint open, process not poisoned,
 *   remote known, every range inside a registered region, list lengths and
 *   range sizes equal) before the first operation of a call is posted.
 * - A request handle is released (ucp_request_free) only inside its own
 *   completion callback; no code path frees an incomplete request.
 * - Every validated op holds its remote and its local regions busy from
 *   validation to its end, so the lock can drop between posts (a done
 *   callback runs without it) and neither can go meanwhile.
 * - The deadline is a promise: an op that ends after it is DP_ETIMEDOUT
 *   although its bytes moved, and an op whose turn to be posted comes after
 *   it is not posted.
 * - A caller's cancel flag (dp__xfer_desc.cancel) ends an op's wait as its
 *   deadline would, with DP_ECANCELED: what is unfinished goes to the
 *   graveyard like a timed-out op's, so a caller (a fetch that Ray aborts)
 *   gets its thread back at once instead of at the deadline.
 */
#include "xfer/endpoint_int.h"

#include <inttypes.h>
#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "xfer/graveyard.h"

/* How long a failed peer's pending requests get to be purged by UCX. */
#define FAILED_GRACE_NS 50000000ull
/* A wait this long starts checking same-host peers' processes (remote.c). */
#define PEER_CHECK_AFTER_NS 20000000ull

/* ---- lookups (ep_mu held) ---- */

/*
 * dp__ranges_find trying *last first, the entry that held the previous
 * range: an op's ranges mostly lie in one region (thousands of small values
 * of one batch), and a search per range cost about a tenth of a 4 KiB copy.
 * *last is set to what is found.
 */
static void *
find_near(const dp__ranges *rs, uint64_t addr, uint64_t n, dp__ranges_ent **last)
{
    dp__ranges_ent *e = *last;
    if (e == NULL || addr - e->base > e->len || n > e->len - (addr - e->base)) {
        e = dp__ranges_find(rs, addr, n);
        if (e == NULL)
            return NULL;
        *last = e;
    }
    return e->v;
}

/* ---- UCX callbacks (run with ep_mu held, from whichever thread progresses) ---- */

void
dp__ep_batch_part_done_locked(batch *b, ucs_status_t status)
{
    if (status != UCS_OK && b->b_status == UCS_OK)
        b->b_status = status;
    if (--b->b_pending == 0) {
        b->b_done_ns = dp__now_ns();
        if (b->b_retained) {
            /* Freed later, outside the callback (dp__ep_reap_locked). */
            dp__list_insert_head(&b->b_ep->released, &b->b_link);
        }
    }
}

static void
op_done_cb(void *request, ucs_status_t status, void *user_data)
{
    dp__ep_batch_part_done_locked(user_data, status);
    ucp_request_free(request);
}

/*
 * Retained transfers that ended after all: UCX completed every request of
 * theirs (done or failed), so nothing touches their local ranges any more.
 */
void
dp__ep_reap_locked(dp__endpoint *ep)
{
    for (batch *b; (b = DP_LIST_FIRST(&ep->released, batch, b_link)) != NULL;) {
        dp__list_remove(&ep->released, &b->b_link);
        dp__graveyard_release(b);
        b->b_r->r_retained--;
        ep->n_retained--;
        ep->st.transfers_released++;
        DP_LOG_I("endpoint %s: a retained transfer to %s ended (%s): its memory is "
                 "released",
                 ep->name, b->b_r->r_name, ucs_status_string(b->b_status));
        free(b);
    }
}

/* ---- transfers ---- */

/* What became of one op (op_result turns it into what its caller must do). */
typedef enum op_end {
    END_NOT_POSTED = 0, /* nothing was handed to UCX or copied: no byte moved */
    END_LOCAL = 1,      /* only the synchronous memcpy path ran: it is over */
    END_UCX = 2,        /* UCX completed every request of it (done or failed) */
    END_UNFINISHED = 3, /* retained: UCX may still run it */
} op_end;

/* Per-op state of one call. */
typedef struct opstate {
    const dp__xfer_desc *o;
    remote *r;
    batch *b;          /* NULL until posted */
    uint64_t deadline; /* dp__now_ns() clock */
    uint64_t fail_deadline;
    int rc;
    bool posted, finished;
    bool via_ucx;   /* some range went to UCX (not only the memcpy path) */
    bool two_sided; /* it went as messages the target serves */
    bool refused;   /* the target answered no (two-sided): not a connection fault */
    bool op_plain;  /* its ranges may be copied from plain memory (op_plain) */
    bool all_plain; /* every range goes by the memcpy path with plain memory
                     * allowed (plain_copy): no local region held */
    op_end end;     /* what became of it (op_result) */
} opstate;

static const char *
op_name(dp__xfer_op op)
{
    return op == DP_XFER_WRITE ? "WRITE" : "READ";
}

/*
 * Whether op o (remote r) may copy a range from plain memory at all: the
 * part of plain_copy that holds for every range of the op, found once.
 */
static bool
op_plain(const dp__endpoint *ep, const remote *r, const dp__xfer_desc *o)
{
    return o->local_plain_ok && !dp__ep_ts_wanted(ep, r, o);
}

/*
 * True if a range of n bytes (its remote range in rr) of an op that may copy
 * from plain memory (op_plain) goes by the memcpy path: post_locked then
 * copies it with the CPU, and neither validation nor the busy hold needs its
 * local region. Fixed for the op's life (r is held, its path and mappings set).
 */
static bool
plain_copy(const dp__endpoint *ep, bool op_plain, const rregion *rr, uint64_t n)
{
    return op_plain && rr->rr_ptr != NULL && n <= ep->memcpy_max;
}

/* Check op i completely; DP_EINVAL with a detail if anything is wrong. */
static int
validate_locked(dp__endpoint *ep, const dp__xfer_desc *o, size_t i, opstate *s,
                dp_detail *d)
{
    if (o->op != DP_XFER_WRITE && o->op != DP_XFER_READ)
        return dp__fail(d, DP_EINVAL, "op %zu: unknown operation %d", i, (int)o->op);
    if (o->remote_name == NULL)
        return dp__fail(d, DP_EINVAL, "op %zu: no remote name", i);
    remote *r = dp__ep_remote_find_locked(ep, o->remote_name);
    if (r == NULL)
        return dp__fail(d, DP_EINVAL, "op %zu: unknown remote %s (add_remote first)", i,
                        o->remote_name);
    if (o->n_local != o->n_remote)
        return dp__fail(d, DP_EINVAL, "op %zu: %zu local ranges but %zu remote ranges", i,
                        o->n_local, o->n_remote);
    if (o->n_local > 0 && (o->local == NULL || o->remote == NULL))
        return dp__fail(d, DP_EINVAL, "op %zu: range list is NULL", i);
    dp__ranges_ent *near_l = NULL, *near_r = NULL;
    bool all_plain = true, opp = op_plain(ep, r, o);
    for (size_t k = 0; k < o->n_local; k++) {
        const dp__range *l = &o->local[k], *m = &o->remote[k];
        if (l->nbytes != m->nbytes)
            return dp__fail(d, DP_EINVAL,
                            "op %zu range %zu: local has %" PRIu64
                            " bytes, remote %" PRIu64,
                            i, k, l->nbytes, m->nbytes);
        if (l->nbytes == 0)
            continue;
        const rregion *rr = find_near(&r->r_index, m->addr, m->nbytes, &near_r);
        if (rr == NULL)
            return dp__fail(d, DP_EINVAL,
                            "op %zu range %zu: remote [0x%" PRIx64 ", +%" PRIu64
                            ") is not inside a region of remote %s",
                            i, k, m->addr, m->nbytes, r->r_name);
        /* Copied from any memory: its local region (if any) is not needed. */
        if (plain_copy(ep, opp, rr, l->nbytes))
            continue;
        all_plain = false;
        bool registered = find_near(&ep->regs, l->addr, l->nbytes, &near_l) != NULL;
        if (!registered && !o->local_plain_ok)
            return dp__fail(d, DP_EINVAL,
                            "op %zu range %zu: local [0x%" PRIx64 ", +%" PRIu64
                            ") is not inside a region registered with endpoint %s",
                            i, k, l->addr, l->nbytes, ep->name);
        if (!registered)
            return dp__fail(d, DP_EINVAL,
                            "op %zu range %zu: local [0x%" PRIx64 ", +%" PRIu64
                            ") is not inside a region registered with endpoint %s, and "
                            "remote %s's memory is not copied from here (plain memory "
                            "goes only by the memcpy path)",
                            i, k, l->addr, l->nbytes, ep->name, r->r_name);
    }
    if (o->grant_len > DP_XFER_GRANT_MAX || (o->grant_len > 0 && o->grant == NULL))
        return dp__fail(d, DP_EINVAL, "op %zu: a grant of %u bytes (1..%d, not NULL)", i,
                        o->grant_len, DP_XFER_GRANT_MAX);
    s->r = r;
    s->op_plain = opp;
    s->all_plain = all_plain;
    return DP_OK;
}

/* Mark/unmark the local regions of an op's ranges as in use (not those of
 * ranges copied from plain memory: nothing of them outlives the post). */
static void
busy_locked(dp__endpoint *ep, const opstate *s, int delta)
{
    const remote *r = s->r;
    const dp__xfer_desc *o = s->o;
    /* Every range copied from plain memory (validation found it out):
     * nothing to hold, and no lookup per range. */
    if (s->all_plain)
        return;
    dp__ranges_ent *near = NULL, *near_r = NULL;
    for (size_t k = 0; k < o->n_local; k++) {
        if (o->local[k].nbytes == 0)
            continue;
        if (s->op_plain) {
            const rregion *rr =
                find_near(&r->r_index, o->remote[k].addr, o->remote[k].nbytes, &near_r);
            DP_ASSERT(rr != NULL);
            if (plain_copy(ep, true, rr, o->local[k].nbytes))
                continue;
        }
        region *g = find_near(&ep->regs, o->local[k].addr, o->local[k].nbytes, &near);
        DP_ASSERT(g != NULL);
        g->r_busy += (uint64_t)(int64_t)delta;
    }
}

/*
 * Every validated op holds its remote and its local regions busy from
 * validation to its end, so that neither can go while the batch is posted with
 * the lock dropped between ops (for a done callback). finish_locked ends the
 * hold of a posted op; this ends that of an op never posted.
 */
static void
reserve_locked(dp__endpoint *ep, opstate *s)
{
    s->r->r_busy++;
    busy_locked(ep, s, +1);
}

static void
unreserve_locked(dp__endpoint *ep, opstate *s)
{
    s->finished = true;
    s->r->r_busy--;
    busy_locked(ep, s, -1);
}

/* Copy the runs waiting (before any UCX op of the op is posted: order holds). */
static void
flush_runs_locked(dp__endpoint *ep)
{
    if (ep->n_runs == 0)
        return;
    dp__copier_run(ep->copier, ep->runs, ep->n_runs);
    ep->n_runs = 0;
}

/*
 * The memcpy path's run: local bytes l, the remote's mapping r. Runs wait in
 * ep->runs until flush_runs_locked copies them, on several cores when they
 * are large enough. Out of memory, the waiting runs and then this one are
 * copied at once, in order.
 */
static void
add_run_locked(dp__endpoint *ep, dp__xfer_op op, uint8_t *l, uint8_t *r, size_t n)
{
    if (n == 0)
        return;
    uint8_t *dst = op == DP_XFER_WRITE ? r : l;
    const uint8_t *src = op == DP_XFER_WRITE ? l : r;
    if (ep->n_runs == ep->runs_cap) {
        size_t cap = ep->runs_cap ? 2 * ep->runs_cap : 64;
        dp__copy *g = realloc(ep->runs, cap * sizeof *g);
        if (g == NULL) {
            flush_runs_locked(ep);
            memcpy(dst, src, n);
            return;
        }
        ep->runs = g;
        ep->runs_cap = cap;
    }
    ep->runs[ep->n_runs++] = (dp__copy){dst, src, n};
}

/* A run of n bytes ends (none: n == 0): the remote mapping's pages under it
 * faulted in at once (once a run, not a range), then it waits its copy. */
static void
end_run_locked(dp__endpoint *ep, dp__xfer_op op, rregion *rr, uint8_t *l, uint8_t *r,
               size_t n)
{
    if (n == 0)
        return;
    dp__ep_rregion_touch_locked(rr, r, n);
    add_run_locked(ep, op, l, r, n);
}

/* Post every range of op s (validated and reserved). Sets s->rc for immediate
 * failures. */
static void
post_locked(dp__endpoint *ep, opstate *s, dp_detail *det)
{
    const dp__xfer_desc *o = s->o;
    remote *r = s->r;
    ucs_status_t fst = remote_failed(r);
    if (fst != UCS_OK) {
        s->rc = dp__fail(det, DP_ETRANSFER, "%s to %s: peer failed: %s (nothing posted)",
                         op_name(o->op), r->r_name, remote_fail_str(r, fst));
        unreserve_locked(ep, s);
        return;
    }
    batch *b = calloc(1, sizeof *b);
    if (b == NULL) {
        s->rc = dp__fail(det, DP_ENOMEM, "%s to %s: out of memory (nothing posted)",
                         op_name(o->op), r->r_name);
        unreserve_locked(ep, s);
        return;
    }
    s->b = b;
    s->posted = true;
    if (dp__ep_ts_wanted(ep, r, o)) {
        s->via_ucx = true;
        s->two_sided = true;
        dp__ep_ts_post_locked(ep, r, o, b);
        if (b->b_pending == 0)
            b->b_done_ns = dp__now_ns();
        return;
    }
    bool any_ucx = false;
    /*
     * Ranges for the memcpy path that continue one another on both sides
     * (values laid out back to back in one buffer and in the blob) are
     * copied as one run: one memcpy of the union, the same bytes in the same
     * places, without a call per value. A run never spans two remote regions
     * (their mappings are separate) and ends before any UCX op is posted, so
     * the order of the ranges is kept.
     */
    uint8_t *run_l = NULL, *run_r = NULL;
    size_t run_n = 0;
    rregion *run_rr = NULL;
    dp__ranges_ent *near_r = NULL, *near_l = NULL;
    for (size_t k = 0; k < o->n_local && b->b_status == UCS_OK; k++) {
        const dp__range *l = &o->local[k], *m = &o->remote[k];
        if (l->nbytes == 0)
            continue;
        rregion *rr = find_near(&r->r_index, m->addr, m->nbytes, &near_r);
        void *lp = (void *)(uintptr_t)l->addr;
        if (rr->rr_ptr != NULL && l->nbytes <= ep->memcpy_max) {
            uint8_t *rp = rr->rr_ptr + (m->addr - rr->rr_base);
            if (run_n > 0 && rr == run_rr && (uint8_t *)lp == run_l + run_n &&
                rp == run_r + run_n) {
                run_n += l->nbytes;
            } else {
                end_run_locked(ep, o->op, run_rr, run_l, run_r, run_n);
                run_l = lp;
                run_r = rp;
                run_n = l->nbytes;
                run_rr = rr;
            }
            ep->st.memcpy_ranges++;
            continue;
        }
        end_run_locked(ep, o->op, run_rr, run_l, run_r, run_n);
        flush_runs_locked(ep);
        run_n = 0;
        region *g = find_near(&ep->regs, l->addr, l->nbytes, &near_l);
        ucp_request_param_t prm = {
            .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                            UCP_OP_ATTR_FIELD_MEMH,
            .cb.send = op_done_cb,
            .user_data = b,
            .memh = g->r_memh,
        };
        ucs_status_ptr_t sp =
            o->op == DP_XFER_WRITE
                ? ucp_put_nbx(r->r_ep, lp, l->nbytes, m->addr, rr->rr_rkey, &prm)
                : ucp_get_nbx(r->r_ep, lp, l->nbytes, m->addr, rr->rr_rkey, &prm);
        ep->st.ucx_ranges++;
        any_ucx = true;
        s->via_ucx = true;
        if (UCS_PTR_IS_ERR(sp))
            b->b_status = UCS_PTR_STATUS(sp);
        else if (sp != NULL)
            b->b_pending++;
    }
    end_run_locked(ep, o->op, run_rr, run_l, run_r, run_n);
    flush_runs_locked(ep);
    /* A put is complete locally at its callback; the flush makes it remote-visible. */
    if (o->op == DP_XFER_WRITE && any_ucx && b->b_status == UCS_OK) {
        ucp_request_param_t prm = {
            .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA,
            .cb.send = op_done_cb,
            .user_data = b,
        };
        ucs_status_ptr_t sp = ucp_ep_flush_nbx(r->r_ep, &prm);
        if (UCS_PTR_IS_ERR(sp))
            b->b_status = UCS_PTR_STATUS(sp);
        else if (sp != NULL)
            b->b_pending++;
    }
    if (b->b_pending == 0)
        b->b_done_ns = dp__now_ns(); /* done at its post (memcpy, inline completions) */
}

/* Whether op o's caller canceled it (dp__xfer_desc.cancel). */
static bool
canceled(const dp__xfer_desc *o)
{
    return o->cancel != NULL && __atomic_load_n(o->cancel, __ATOMIC_ACQUIRE);
}

/*
 * End op s: DONE (batch freed) or retained (batch handed to the graveyard);
 * deadline_passed or cut (its caller canceled it) say why it ends unfinished.
 */
static void
finish_locked(dp__endpoint *ep, opstate *s, bool deadline_passed, bool cut,
              dp_detail *det)
{
    const dp__xfer_desc *o = s->o;
    remote *r = s->r;
    batch *b = s->b;
    s->finished = true;
    r->r_busy--;
    busy_locked(ep, s, -1);
    s->end = s->via_ucx ? END_UCX : END_LOCAL;
    if (b->b_pending == 0) {
        if (b->b_peer_rc != 0) {
            s->refused = true;
            s->rc =
                dp__fail(det, b->b_peer_rc, "%s of %zu ranges to %s refused by it: %s",
                         op_name(o->op), o->n_local, r->r_name, b->b_peer_msg);
            ep->st.transfers_failed++;
        } else if (b->b_status == UCS_OK && b->b_done_ns > s->deadline) {
            /*
             * Done, but only after the deadline (a long post, or seen late
             * between two looks): the caller's deadline may guard something (a
             * READ within a pin's life), so it is not reported as done in time.
             */
            s->rc = dp__fail(det, DP_ETIMEDOUT,
                             "%s of %zu ranges to %s ended %.3f ms after its deadline",
                             op_name(o->op), o->n_local, r->r_name,
                             (double)(b->b_done_ns - s->deadline) / 1e6);
            ep->st.transfers_failed++;
        } else if (b->b_status == UCS_OK) {
            s->rc = DP_OK;
            ep->st.transfers_ok++;
        } else {
            s->rc = dp__fail(det, DP_ETRANSFER, "%s of %zu ranges to %s failed: %s",
                             op_name(o->op), o->n_local, r->r_name,
                             ucs_status_string(b->b_status));
            ep->st.transfers_failed++;
        }
        free(b);
        s->b = NULL;
        return;
    }
    ucs_status_t fst = remote_failed(r);
    char what[2 * DP_MD_NAME_MAX + 96];
    snprintf(what, sizeof what, "%s of %zu ranges to %s from endpoint %s", op_name(o->op),
             o->n_local, r->r_name, ep->name);
    b->b_retained = true;
    b->b_ep = ep;
    b->b_r = r;
    dp__graveyard_retain(b, o->local, o->n_local, what);
    s->b = NULL;
    s->end = END_UNFINISHED;
    r->r_retained++;
    ep->n_retained++;
    ep->st.transfers_retained++;
    ep->st.transfers_failed++;
    if (cut && fst == UCS_OK && b->b_status == UCS_OK && !deadline_passed)
        s->rc = dp__fail(det, DP_ECANCELED,
                         "%s canceled with %d operations unfinished: retained, its "
                         "local memory must not be reused",
                         what, b->b_pending);
    else if (fst != UCS_OK || b->b_status != UCS_OK || !deadline_passed)
        s->rc = dp__fail(det, DP_ETRANSFER,
                         "%s failed (%s) with %d operations unfinished: retained, its "
                         "local memory must not be reused",
                         what,
                         fst != UCS_OK ? remote_fail_str(r, fst)
                                       : ucs_status_string(b->b_status),
                         b->b_pending);
    else
        s->rc =
            dp__fail(det, DP_ETIMEDOUT,
                     "%s timed out with %d operations unfinished: retained, its local "
                     "memory must not be reused",
                     what, b->b_pending);
}

/*
 * What op s's caller must do about how it ended (dp__xfer_result): bytes of a
 * failed op may still land while UCX may still run it, or after a failure
 * over a network lane (a completion with an error does not say no byte
 * moved), but never after one that completed late, ran on shared memory
 * (the copy is over when its request is), or went two-sided (the target
 * takes no byte after an abort).
 */
static void
op_result(const opstate *s, dp__xfer_result *res)
{
    res->rc = s->rc;
    res->may_land = false;
    res->suspect = false;
    if (s->rc == DP_OK) {
        res->fate = "";
        return;
    }
    bool net = s->r != NULL && s->r->r_lane != DP_XFER_LANE_SHM;
    res->suspect = net && !s->refused && (s->end == END_UCX || s->end == END_UNFINISHED);
    if (s->end == END_NOT_POSTED) {
        res->fate = "nothing posted";
    } else if (s->two_sided) {
        res->fate = "two-sided: the target takes none of it after an abort";
    } else if (s->end == END_UNFINISHED ||
               (s->end == END_UCX && s->rc != DP_ETIMEDOUT && net)) {
        res->may_land = true;
        res->fate = "may still land";
    } else {
        res->fate = "ended";
    }
}

/* Every op refused before anything was posted: each says so. */
static int
refuse_all(dp__xfer_result *res, size_t n_ops, int rc, const char *msg, dp_detail *d)
{
    for (size_t i = 0; i < n_ops; i++) {
        res[i] = (dp__xfer_result){.rc = rc, .fate = "nothing posted"};
        dp__fail(&res[i].det, rc, "%s", msg);
    }
    return dp__fail(d, rc, "%s", msg);
}

/* The engine behind transfer and transfer_many. */
static int
run_ops(dp__endpoint *ep, const dp__xfer_desc *ops, size_t n_ops, double timeout_s,
        dp__xfer_result *res, const dp__xfer_notify *on_done, dp_detail *d)
{
    uint64_t t0 = dp__now_ns();
    if (!(timeout_s > 0) || !isfinite(timeout_s) || timeout_s > 1e9) {
        char msg[96];
        snprintf(msg, sizeof msg, "timeout %g s: must be finite and > 0", timeout_s);
        return refuse_all(res, n_ops, DP_EINVAL, msg, d);
    }
    uint64_t deadline = t0 + (uint64_t)(timeout_s * 1e9);
    opstate *ss = calloc(n_ops ? n_ops : 1, sizeof *ss);
    if (ss == NULL)
        return refuse_all(res, n_ops, DP_ENOMEM,
                          "transfer: out of memory (nothing posted)", d);
    dp_detail vd;
    dp_detail_clear(&vd);
    lock(ep);
    int rc = check_open_locked(ep, &vd);
    if (rc == DP_OK)
        rc = dp__graveyard_check(&vd);
    for (size_t i = 0; rc == DP_OK && i < n_ops; i++) {
        ss[i].o = &ops[i];
        ss[i].deadline = deadline;
        rc = validate_locked(ep, &ops[i], i, &ss[i], &vd);
    }
    if (rc != DP_OK) {
        unlock(ep);
        free(ss);
        return refuse_all(res, n_ops, rc, vd.msg, d);
    }
    for (size_t i = 0; i < n_ops; i++)
        reserve_locked(ep, &ss[i]);
    for (size_t i = 0; i < n_ops; i++) {
        opstate *s = &ss[i];
        dp_detail *det = &res[i].det;
        if (i > 0 && dp__now_ns() >= deadline) {
            /* Earlier posts or callbacks used the whole time: not posted. */
            s->rc = dp__fail(det, DP_ETIMEDOUT,
                             "%s to %s: the deadline passed before it was posted "
                             "(nothing posted)",
                             op_name(s->o->op), s->r->r_name);
            unreserve_locked(ep, s);
        } else if (canceled(s->o)) {
            s->rc = dp__fail(det, DP_ECANCELED, "%s to %s: canceled (nothing posted)",
                             op_name(s->o->op), s->r->r_name);
            unreserve_locked(ep, s);
        } else {
            post_locked(ep, s, det);
        }
        /* Done at post (memcpy path, or failed): ended now, so a callback can
         * act on it while the next op is posted. */
        if (s->posted && s->b->b_pending == 0)
            finish_locked(ep, s, false, false, det);
        if (s->finished && on_done != NULL) {
            unlock(ep);
            on_done->fn(on_done->ctx, i, s->rc);
            lock(ep);
        }
    }

    size_t open = 0;
    for (size_t i = 0; i < n_ops; i++)
        open += ss[i].posted && !ss[i].finished;
    while (open > 0) {
        uint64_t now = dp__now_ns();
        if (now - t0 >= PEER_CHECK_AFTER_NS)
            dp__ep_check_peers_locked(ep, now);
        for (size_t i = 0; i < n_ops; i++) {
            opstate *s = &ss[i];
            if (!s->posted || s->finished)
                continue;
            if (s->b->b_pending > 0 && remote_failed(s->r) != UCS_OK &&
                s->fail_deadline == 0)
                s->fail_deadline = now + FAILED_GRACE_NS;
            bool cut = canceled(s->o);
            bool out = now >= deadline || cut ||
                       (s->fail_deadline != 0 && now >= s->fail_deadline);
            if (s->b->b_pending == 0 || out) {
                finish_locked(ep, s, now >= deadline, cut, &res[i].det);
                open--;
                if (on_done != NULL) {
                    unlock(ep);
                    on_done->fn(on_done->ctx, i, s->rc);
                    lock(ep);
                }
            }
        }
        if (open == 0)
            break;
        unsigned n = ucp_worker_progress(ep->worker);
        dp__ep_reap_locked(ep);
        unlock(ep);
        if (n == 0)
            sched_yield();
        lock(ep);
    }
    dp__ep_reap_locked(ep);
    unlock(ep);

    size_t nfail = 0, first = 0;
    for (size_t i = 0; i < n_ops; i++) {
        op_result(&ss[i], &res[i]);
        if (ss[i].rc != DP_OK && nfail++ == 0)
            first = i;
    }
    if (nfail > 0) {
        rc = ss[first].rc;
        dp__fail(d, rc, "%zu of %zu transfers failed; first, op %zu: %s", nfail, n_ops,
                 first, res[first].det.msg);
    }
    free(ss);
    return rc;
}

int
dp__endpoint_transfer(dp__endpoint *ep, const dp__xfer_desc *op, double timeout_s,
                      dp_detail *d)
{
    if (op == NULL)
        return dp__fail(d, DP_EINVAL, "transfer: op is NULL");
    dp__xfer_result res;
    int rc = run_ops(ep, op, 1, timeout_s, &res, NULL, NULL);
    if (rc != DP_OK)
        dp__fail(d, rc, "%s", res.det.msg);
    return rc;
}

int
dp__endpoint_transfer_many(dp__endpoint *ep, const dp__xfer_desc *ops, size_t n_ops,
                           double timeout_s, dp__xfer_result *res,
                           const dp__xfer_notify *on_done, dp_detail *d)
{
    if (n_ops > 0 && (ops == NULL || res == NULL))
        return dp__fail(d, DP_EINVAL, "transfer_many: ops or res is NULL");
    for (size_t i = 0; i < n_ops; i++)
        dp_detail_clear(&res[i].det);
    return run_ops(ep, ops, n_ops, timeout_s, res, on_done, d);
}

bool
dp__endpoint_touches_unfinished(const dp__endpoint *ep, const void *addr, size_t nbytes)
{
    DP_UNUSED(ep);
    return dp__graveyard_touches((uint64_t)(uintptr_t)addr, nbytes);
}
