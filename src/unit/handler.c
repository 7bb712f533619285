/*
 * The unit's control-message handler (docs/design.md, "Control-message codec"
 * and "Storage unit"): the dp_ctl_handler that dp__ctl_server calls on its
 * thread for every request. It decodes the
 * message with src/wire, runs the op on the unit core under the unit lock and
 * encodes the reply while still holding it (results of resolve, scan and
 * read_bytes are views into unit state that only the lock keeps valid).
 *
 * Bad input never stops the unit: every malformed request whose
 * request id can be read gets a Protocol error reply naming what was wrong;
 * one whose id cannot be read, and every failed notify (unpin, abort), is
 * dropped. Nothing here can fail in a way that stops the server thread.
 *
 * Threads: the server thread; the unit lock is taken per request and never
 * held across a call into the endpoint (info fetches the metadata first).
 * save_shard and load_shard run on a thread of their own (admin_main) and
 * answer through a deferred reply (dp__ctl_defer): their file I/O would
 * otherwise hold up every other request for as long as it runs. The unit
 * counts them (dp__unit_admin_begin/end); its destroy stops them at their next
 * blob and waits for them.
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "blob/keys.h"
#include "ctl/ctl.h"
#include "unit/unit.h"
#include "wire/wire.h"

/*
 * Every reply carries the unit's incarnation, so a client can tell this
 * process from an earlier one on the same address (docs/design.md, "Unit
 * incarnations").
 */
static void
reply_error_ver(dp__unit *u, dp__wire_str rid, int code, const dp_detail *d,
                const char *reason, uint64_t ver, dp__buf *out)
{
    dp__buf_reset(out);
    if (rid.n == 0)
        return;
    if (code != DP_EUNITFULL && code != DP_EBUSY && code != DP_ELOST &&
        code != DP__ESTALE)
        code = DP_EPROTO;
    dp__wire_error e = {
        .code = code,
        .msg = dp__wire_s(dp_detail_msg(d)),
        .reason = dp__wire_s(reason),
        .ver = code == DP__ESTALE ? ver : 0,
    };
    if (dp__wire_reply_encode_error(rid, dp__unit_incarnation(u), &e, NULL, out, NULL) !=
        0)
        dp__buf_reset(out);
}

static void
reply_error(dp__unit *u, dp__wire_str rid, int code, const dp_detail *d,
            const char *reason, dp__buf *out)
{
    reply_error_ver(u, rid, code, d, reason, 0, out);
}

/* Encode rep; if that fails (too big, out of memory) answer the failure instead. */
static void
reply_ok(dp__unit *u, dp__wire_reply *rep, dp__buf *out)
{
    dp_detail d;
    dp_detail_clear(&d);
    rep->ok = true;
    rep->incarnation = dp__unit_incarnation(u);
    int rc = dp__wire_reply_encode(rep, NULL, out, &d);
    if (rc != 0) {
        dp__fail_ctx(&d, rc, "unit: encoding the %s reply", dp__wire_op_name(rep->op));
        reply_error(u, rep->rid, rc, &d, NULL, out);
    }
}

static void
do_info(dp__unit *u, dp__wire_reply *rep, dp__buf *out)
{
    uint8_t *md = NULL;
    size_t mdlen = 0;
    dp_detail d;
    dp_detail_clear(&d);
    dp__endpoint *ep = dp__unit_endpoint(u);
    if (ep != NULL && dp__endpoint_metadata(ep, &md, &mdlen, &d) != 0) {
        reply_error(u, rep->rid, DP_EPROTO, &d, NULL, out);
        return;
    }
    dp__unit_lock(u);
    dp__unit_info_locked(u, &rep->r.info);
    if (md != NULL)
        rep->r.info.metadata = (dp__wire_bytes){md, (uint32_t)mdlen};
    reply_ok(u, rep, out);
    dp__unit_unlock(u);
    free(md);
}

/* save_shard and load_shard: file I/O outside the unit lock. */
static void run_admin_timed(dp__unit *u, const dp__wire_request *req, dp__wire_reply *rep,
                            dp__buf *reply);

static void
run_admin(dp__unit *u, const dp__wire_request *req, dp__wire_reply *rep, dp__buf *reply)
{
    uint64_t t0 = dp__now_ns();
    run_admin_timed(u, req, rep, reply);
    dp__unit_hist_record(u, req->op, dp__now_ns() - t0);
}

static void
run_admin_timed(dp__unit *u, const dp__wire_request *req, dp__wire_reply *rep,
                dp__buf *reply)
{
    dp_detail d;
    dp_detail_clear(&d);
    int rc;
    if (req->op == DP_WIRE_OP_SAVE_SHARD) {
        dp__unit_save_res sr;
        rc = dp__unit_save_shard_as(u, &req->a.save_shard, &sr, &d);
        if (rc == 0) {
            rep->r.save_shard.blobs = (dp__wire_shard_blobs){sr.blobs, sr.n_blobs};
            rep->r.save_shard.nbytes = sr.nbytes;
            rep->r.save_shard.clears_during_save = sr.clears_during_save;
            reply_ok(u, rep, reply);
            dp__unit_save_res_fini(&sr);
            return;
        }
    } else {
        const dp__wire_load_shard_args *a = &req->a.load_shard;
        dp__unit_load_res lr;
        rc = dp__unit_load_shard(u, a, &lr, &d);
        if (rc == 0) {
            rep->r.load_shard.loaded = (dp__wire_strs){lr.loaded, lr.n_loaded};
            rep->r.load_shard.failed = (dp__wire_strs){lr.failed, lr.n_failed};
            reply_ok(u, rep, reply);
            dp__unit_load_res_fini(&lr);
            return;
        }
    }
    DP_LOG_W("unit %u: %s", dp__unit_id(u), dp_detail_msg(&d));
    reply_error(u, req->rid, rc, &d, NULL, reply);
}

/* A save or load running on a thread of its own, its reply deferred. */
typedef struct admin_job {
    dp__unit *u;
    dp__ctl_deferred *t;
    uint8_t *msg;
    size_t len;
} admin_job;

static void *
admin_main(void *arg)
{
    admin_job *j = arg;
    dp__unit *u = j->u;
    dp__buf out;
    dp__buf_init(&out);
    dp__wire_request req;
    dp_detail d;
    dp_detail_clear(&d);
    /* The bytes the ctl thread decoded: they decode the same again. */
    if (dp__wire_request_decode(j->msg, j->len, NULL, &req, &d) == 0) {
        dp__wire_reply rep;
        memset(&rep, 0, sizeof rep);
        rep.op = req.op;
        rep.rid = req.rid;
        run_admin(u, &req, &rep, &out);
        dp__wire_request_fini(&req);
    }
    dp__ctl_deferred_send(j->t, out.data, out.oom ? 0 : out.len);
    dp__buf_fini(&out);
    free(j->msg);
    free(j);
    dp__unit_admin_end(u);
    return NULL;
}

/*
 * Run this save or load on a thread of its own and answer from there, so
 * that the ctl thread goes on serving puts and gets while the shard's file
 * I/O runs (seconds for gigabytes). False when the request did not come
 * through a ctl server (tests call the handler directly): the caller then
 * runs it in place.
 */
static bool
defer_admin(dp__unit *u, const uint8_t *msg, size_t len)
{
    admin_job *j = calloc(1, sizeof *j);
    uint8_t *copy = malloc(len ? len : 1);
    dp__ctl_deferred *t = j != NULL && copy != NULL ? dp__ctl_defer() : NULL;
    if (t == NULL) {
        free(j);
        free(copy);
        return false;
    }
    memcpy(copy, msg, len);
    *j = (admin_job){u, t, copy, len};
    dp__unit_admin_begin(u);
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    pthread_t th;
    int err = pthread_create(&th, &at, admin_main, j);
    pthread_attr_destroy(&at);
    if (err != 0) {
        DP_LOG_W("unit %u: no thread for a save/load (%s): it runs on the ctl thread",
                 dp__unit_id(u), strerror(err));
        admin_main(j); /* answers through the token */
    }
    return true;
}

static void
do_resolve(dp__unit *u, const dp__wire_request *req, dp__wire_reply *rep, dp__buf *reply)
{
    dp_detail d;
    dp_detail_clear(&d);
    dp__unit_resolve_res res;
    dp__unit_lock(u);
    int rc = dp__unit_resolve_locked(u, req->a.resolve.blob_ids.v,
                                     req->a.resolve.blob_ids.n, &res, &d);
    if (rc == 0) {
        dp__wire_resolve_res *r = &rep->r.resolve;
        r->pin_id = (dp__wire_str){res.pin_id, (uint32_t)strlen(res.pin_id)};
        r->blobs = (dp__wire_blob_locs){res.blobs, res.n_blobs};
        r->missing = (dp__wire_strs){res.missing, res.n_missing};
        r->pending = (dp__wire_strs){res.pending, res.n_pending};
        r->failed = (dp__wire_strs){res.failed, res.n_failed};
        r->whole = (dp__wire_strs){res.whole, res.n_whole};
        reply_ok(u, rep, reply);
        dp__unit_resolve_res_fini(&res);
    } else {
        reply_error(u, req->rid, rc, &d, NULL, reply);
    }
    dp__unit_unlock(u);
}

static void
do_resolve_keys(dp__unit *u, const dp__wire_request *req, dp__wire_reply *rep,
                dp__buf *reply)
{
    dp_detail d;
    dp_detail_clear(&d);
    dp__unit_resolve_keys_res res;
    dp__unit_lock(u);
    int rc = dp__unit_resolve_keys_inline_locked(
        u, req->a.resolve_keys.keys.v, req->a.resolve_keys.keys.n,
        req->a.resolve_keys.inline_bytes, &res, &d);
    if (rc == 0) {
        dp__wire_resolve_keys_res *r = &rep->r.resolve_keys;
        r->pin_id = (dp__wire_str){res.pin_id, (uint32_t)strlen(res.pin_id)};
        r->entries = (dp__wire_key_locs){res.entries, res.n_entries};
        r->missing = (dp__wire_strs){res.missing, res.n_missing};
        r->pending = (dp__wire_strs){res.pending, res.n_pending};
        r->failed = (dp__wire_strs){res.failed, res.n_failed};
        r->fenced = (dp__wire_strs){res.fenced, res.n_fenced};
        reply_ok(u, rep, reply);
        dp__unit_resolve_keys_res_fini(&res);
    } else {
        reply_error(u, req->rid, rc, &d, NULL, reply);
    }
    dp__unit_unlock(u);
}

static void
do_resolve_rows(dp__unit *u, const dp__wire_request *req, dp__wire_reply *rep,
                dp__buf *reply)
{
    dp_detail d;
    dp_detail_clear(&d);
    dp__unit_resolve_rows_res res;
    const dp__wire_resolve_rows_args *a = &req->a.resolve_rows;
    dp__unit_lock(u);
    int rc =
        dp__unit_resolve_rows_locked(u, &a->fields, a->rows, a->inline_bytes, &res, &d);
    if (rc == 0) {
        dp__wire_resolve_rows_res *r = &rep->r.resolve_rows;
        r->pin_id = (dp__wire_str){res.pin_id, (uint32_t)strlen(res.pin_id)};
        r->locs = (dp__wire_bytes){res.locs, res.n * DP_WIRE_LOC_LEN};
        r->descs = (dp__wire_descs){res.descs, res.n_descs};
        r->data = (dp__wire_bytes){res.data, (uint32_t)res.data_len};
        reply_ok(u, rep, reply); /* the descriptions are views: under the lock */
        dp__unit_resolve_rows_res_fini(&res);
    } else {
        reply_error(u, req->rid, rc, &d, NULL, reply);
    }
    dp__unit_unlock(u);
}

static void
do_release_rows(dp__unit *u, const dp__wire_request *req, dp__wire_reply *rep,
                dp__buf *reply)
{
    dp_detail d;
    dp_detail_clear(&d);
    /* A row of another unit: the client's cluster is not this unit's. */
    const dp__wire_u64s *g = &req->a.release_rows.gidxs;
    dp__wire_info me;
    dp__unit_lock(u);
    dp__unit_info_locked(u, &me);
    dp__unit_unlock(u);
    uint32_t bad = g->n;
    for (uint32_t i = 0; i < g->n && bad == g->n; i++)
        if (!dp__row_on_unit(g->v[i], (uint32_t)me.unit_id, (uint32_t)me.n_units,
                             (uint32_t)me.replicas))
            bad = i;
    if (bad < g->n) {
        dp__fail(&d, DP_EPROTO,
                 "release_rows: row %" PRIu64 " belongs to unit %" PRIu64
                 ", this is unit %" PRIu64 " of %" PRIu64
                 " (the client's cluster lists the units in another order, or has "
                 "another size); nothing released",
                 g->v[bad], g->v[bad] % me.n_units, me.unit_id, me.n_units);
        reply_error(u, req->rid, DP_EPROTO, &d, NULL, reply);
        return;
    }
    uint64_t stale = 0;
    rep->r.dropped =
        dp__unit_release_rows_ver(u, g->v, g->n, req->a.release_rows.ver, &stale);
    if (stale != 0) {
        dp__fail(&d, DP__ESTALE,
                 "release_rows: a key of these rows is held at version %" PRIu64
                 ", above the clear's %" PRIu64 "; nothing released",
                 stale, req->a.release_rows.ver);
        reply_error_ver(u, req->rid, DP__ESTALE, &d, NULL, stale, reply);
        return;
    }
    reply_ok(u, rep, reply);
}

static void
do_scan(dp__unit *u, const dp__wire_request *req, dp__wire_reply *rep, dp__buf *reply)
{
    dp_detail d;
    dp_detail_clear(&d);
    dp__wire_fields *recs = NULL;
    uint32_t n = 0;
    dp__unit_lock(u);
    int rc = dp__unit_scan_locked(u, &recs, &n, &d);
    if (rc == 0) {
        rep->r.scan = (dp__wire_scan_res){recs, n};
        reply_ok(u, rep, reply);
    } else {
        reply_error(u, req->rid, rc, &d, NULL, reply);
    }
    dp__unit_unlock(u);
    dp__unit_fields_free(recs, n);
}

static void
do_list_keys(dp__unit *u, const dp__wire_request *req, dp__wire_reply *rep,
             dp__buf *reply)
{
    const dp__wire_list_keys_args *a = &req->a.list_keys;
    dp_detail d;
    dp_detail_clear(&d);
    dp__unit_keys_page pg = {0};
    dp__unit_lock(u);
    int rc = a->unit > UINT32_MAX || a->max_rows > UINT32_MAX
                 ? dp__fail(&d, DP_EPROTO, "list_keys: unit or max_rows out of range")
             : !dp__unit_reads_ok_locked(u) && !a->own
                 ? dp__fail(&d, DP_EBUSY,
                            "list_keys: unit %u holds no read lease (it may hold older "
                            "copies until a pass catches it up): list another copy",
                            dp__unit_id(u))
                 : dp__unit_list_keys_locked(u, (uint32_t)a->unit, a->from,
                                             (uint32_t)a->max_rows, &pg, &d);
    if (rc == 0) {
        rep->r.list_keys =
            (dp__wire_list_keys_res){pg.keys, pg.next, pg.more, {pg.vers, pg.keys.n}};
        reply_ok(u, rep, reply);
    } else {
        reply_error(u, req->rid, rc, &d, NULL, reply);
    }
    dp__unit_unlock(u);
    free(pg.keys.v);
    free(pg.vers);
    free(pg.text);
}

static void
do_stats(dp__unit *u, const dp__wire_request *req, dp__wire_reply *rep, dp__buf *reply)
{
    dp_detail d;
    dp_detail_clear(&d);
    dp__wire_fields f = {0};
    dp__unit_lock(u);
    int rc = dp__unit_stats_locked(u, &f, &d);
    if (rc == 0) {
        rep->r.stats = f;
        reply_ok(u, rep, reply);
    } else {
        reply_error(u, req->rid, rc, &d, NULL, reply);
    }
    dp__unit_unlock(u);
    free(f.v);
}

static void
do_read_bytes(dp__unit *u, const dp__wire_request *req, dp__wire_reply *rep,
              dp__buf *reply)
{
    dp_detail d;
    dp_detail_clear(&d);
    const uint8_t *p = NULL;
    dp__unit_lock(u);
    int rc = dp__unit_read_bytes_locked(u, req->a.read_bytes.off,
                                        req->a.read_bytes.nbytes, &p, &d);
    if (rc == 0) {
        rep->r.bytes = (dp__wire_bytes){p, (uint32_t)req->a.read_bytes.nbytes};
        reply_ok(u, rep, reply);
    } else {
        reply_error(u, req->rid, rc, &d, NULL, reply);
    }
    dp__unit_unlock(u);
}

void
dp__unit_handle(void *ctx, const uint8_t *msg, size_t len, dp__buf *reply)
{
    dp__unit *u = ctx;
    uint64_t t0 = dp__now_ns();
    dp__wire_request req;
    dp_detail d;
    dp_detail_clear(&d);
    int rc = dp__wire_request_decode(msg, len, NULL, &req, &d);
    if (rc != 0) {
        DP_LOG_D("unit %u: bad request: %s", dp__unit_id(u), dp_detail_msg(&d));
        if (!(req.op != DP_WIRE_OP_NONE && dp__wire_op_is_notify(req.op)))
            reply_error(u, req.rid, rc, &d, NULL, reply);
        dp__wire_request_fini(&req);
        return;
    }
    /*
     * A request older than one its client sent later arrived on a connection
     * the client gave up: refused (a notify dropped), except unpin, which
     * only ends a pin (docs/design.md, "Request order").
     */
    if (req.op != DP_WIRE_OP_UNPIN &&
        dp__unit_order_check(u, req.rid.p, req.rid.n, req.op, &d) != DP_OK) {
        DP_LOG_W("unit %u: %s %s", dp__unit_id(u), dp__wire_op_name(req.op),
                 dp_detail_msg(&d));
        if (!dp__wire_op_is_notify(req.op))
            reply_error(u, req.rid, DP_EPROTO, &d, NULL, reply);
        dp__wire_request_fini(&req);
        return;
    }
    dp__wire_reply rep;
    memset(&rep, 0, sizeof rep);
    rep.op = req.op;
    rep.rid = req.rid;
    switch (req.op) {
    case DP_WIRE_OP_PING:
        rep.r.unit_id = dp__unit_id(u);
        reply_ok(u, &rep, reply);
        break;
    case DP_WIRE_OP_INFO:
        do_info(u, &rep, reply);
        break;
    case DP_WIRE_OP_ALLOC: {
        const dp__wire_alloc_args *a = &req.a.alloc;
        const char *reason = NULL;
        /* spill is honoured only with the SSD tier on. */
        rc = dp__unit_alloc_req(u, a, &rep.r.alloc, &reason, &d);
        if (rc == 0)
            reply_ok(u, &rep, reply);
        else
            reply_error(u, req.rid, rc, &d, reason, reply);
        break;
    }
    case DP_WIRE_OP_COMMIT: {
        uint64_t stale = 0;
        rc = dp__unit_commit_ver(u, req.a.commit.blob_id.p, req.a.commit.blob_id.n,
                                 req.a.commit.ver, &req.a.commit.vers, &rep.r.commit,
                                 &stale, &d);
        if (rc == 0)
            reply_ok(u, &rep, reply);
        else
            reply_error_ver(u, req.rid, rc, &d, NULL, stale, reply);
        break;
    }
    case DP_WIRE_OP_PUT: {
        const char *reason = NULL;
        uint64_t stale = 0;
        rc = dp__unit_put_inline(u, &req.a.put, &rep.r.commit, &reason, &stale, &d);
        if (rc == 0)
            reply_ok(u, &rep, reply);
        else
            reply_error_ver(u, req.rid, rc, &d, reason, stale, reply);
        break;
    }
    case DP_WIRE_OP_ABORT:
        dp__unit_abort(u, req.a.abort.blob_id.p, req.a.abort.blob_id.n,
                       req.a.abort.in_flight);
        break;
    case DP_WIRE_OP_UNPIN:
        dp__unit_unpin(u, req.a.unpin.pin_id.p, req.a.unpin.pin_id.n);
        break;
    case DP_WIRE_OP_RESOLVE:
        do_resolve(u, &req, &rep, reply);
        break;
    case DP_WIRE_OP_RESOLVE_KEYS:
        do_resolve_keys(u, &req, &rep, reply);
        break;
    case DP_WIRE_OP_RESOLVE_ROWS:
        do_resolve_rows(u, &req, &rep, reply);
        break;
    case DP_WIRE_OP_RELEASE_ROWS:
        do_release_rows(u, &req, &rep, reply);
        break;
    case DP_WIRE_OP_SCAN:
        do_scan(u, &req, &rep, reply);
        break;
    case DP_WIRE_OP_STATS:
        do_stats(u, &req, &rep, reply);
        break;
    case DP_WIRE_OP_READ_BYTES:
        do_read_bytes(u, &req, &rep, reply);
        break;
    case DP_WIRE_OP_LIST_KEYS:
        do_list_keys(u, &req, &rep, reply);
        break;
    case DP_WIRE_OP_LEASE:
        rc =
            dp__unit_lease_grant(u, req.a.lease.unit, req.a.lease.done, &rep.r.lease, &d);
        if (rc == 0)
            reply_ok(u, &rep, reply);
        else
            reply_error(u, req.rid, rc, &d, NULL, reply);
        break;
    case DP_WIRE_OP_FENCE:
        rc = dp__unit_fence(u, req.a.fence.units.v, req.a.fence.units.n,
                            &rep.r.fence.wait_ms, &d);
        if (rc == 0)
            reply_ok(u, &rep, reply);
        else
            reply_error(u, req.rid, rc, &d, NULL, reply);
        break;
    case DP_WIRE_OP_SAVE_SHARD:
    case DP_WIRE_OP_LOAD_SHARD:
        if (!defer_admin(u, msg, len))
            run_admin(u, &req, &rep, reply);
        break;
    default:
        dp__fail(&d, DP_EPROTO, "unknown op");
        reply_error(u, req.rid, DP_EPROTO, &d, NULL, reply);
        break;
    }
    /* save/load are timed where they run (run_admin), often on their own thread. */
    if (req.op != DP_WIRE_OP_SAVE_SHARD && req.op != DP_WIRE_OP_LOAD_SHARD)
        dp__unit_hist_record(u, req.op, dp__now_ns() - t0);
    dp__wire_request_fini(&req);
}

void
dp__unit_handle_oversize(void *ctx, const uint8_t *msg, size_t len, dp__buf *reply)
{
    dp__unit *u = ctx;
    dp__wire_op op = DP_WIRE_OP_NONE;
    dp__wire_str rid = {"", 0};
    dp__wire_limits lim = dp__wire_limits_default;
    lim.max_msg = UINT64_MAX; /* only the head is read */
    dp__wire_request_peek(msg, len, &lim, &op, &rid, NULL);
    if (op != DP_WIRE_OP_NONE && dp__wire_op_is_notify(op))
        return;
    dp_detail d;
    dp__fail(&d, DP_ETOOBIG, "unit %u: message of %zu bytes is over the size limit",
             dp__unit_id(u), len);
    reply_error(u, rid, DP_EPROTO, &d, NULL, reply);
}
