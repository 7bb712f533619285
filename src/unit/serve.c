/*
 * The unit's control-message handler (DESIGN section 7): the dp_ctl_handler
 * that dp_ctl_server calls on its thread for every request. It decodes the
 * message with src/wire, runs the op on the unit core under the unit lock and
 * encodes the reply while still holding it (results of resolve, scan and
 * read_bytes are views into unit state that only the lock keeps valid).
 *
 * Invariant 4 (bad input never stops the unit): every malformed request whose
 * request id can be read gets a Protocol error reply naming what was wrong;
 * one whose id cannot be read, and every failed notify (unpin, abort), is
 * dropped. Nothing here can fail in a way that stops the server thread.
 *
 * Threads: the server thread; the unit lock is taken per request and never
 * held across a call into the endpoint (info fetches the metadata first).
 */
#include <stdlib.h>
#include <string.h>

#include "unit/unit.h"
#include "wire/wire.h"

static void
reply_error(dp_wire_str rid, int code, const dp_detail *d, const char *reason,
            dp_buf *out)
{
    dp_buf_reset(out);
    if (rid.n == 0)
        return;
    if (code != DP_EUNITFULL && code != DP_EBUSY && code != DP_ELOST)
        code = DP_EPROTO;
    const char *msg = dp_detail_msg(d);
    if (dp_wire_reply_encode_error(rid, code, msg[0] ? msg : NULL, reason, NULL, 0, NULL,
                                   out, NULL) != 0)
        dp_buf_reset(out);
}

/* Encode rep; if that fails (too big, out of memory) answer the failure instead. */
static void
reply_ok(dp_wire_reply *rep, dp_buf *out)
{
    dp_detail d;
    dp_detail_clear(&d);
    rep->ok = true;
    int rc = dp_wire_reply_encode(rep, NULL, out, &d);
    if (rc != 0) {
        dp_fail_ctx(&d, rc, "unit: encoding the %s reply", dp_wire_op_name(rep->op));
        reply_error(rep->rid, rc, &d, NULL, out);
    }
}

static void
do_info(dp_unit *u, dp_wire_reply *rep, dp_buf *out)
{
    uint8_t *md = NULL;
    size_t mdlen = 0;
    dp_detail d;
    dp_detail_clear(&d);
    dp_endpoint *ep = dp_unit_endpoint(u);
    if (ep != NULL && dp_endpoint_metadata(ep, &md, &mdlen, &d) != 0) {
        reply_error(rep->rid, DP_EPROTO, &d, NULL, out);
        return;
    }
    dp_unit_lock(u);
    dp_unit_info_locked(u, &rep->r.info);
    if (md != NULL)
        rep->r.info.metadata = (dp_wire_bytes){md, (uint32_t)mdlen};
    reply_ok(rep, out);
    dp_unit_unlock(u);
    free(md);
}

void
dp_unit_handle(void *ctx, const uint8_t *msg, size_t len, dp_buf *reply)
{
    dp_unit *u = ctx;
    dp_wire_request req;
    dp_detail d;
    dp_detail_clear(&d);
    int rc = dp_wire_request_decode(msg, len, NULL, &req, &d);
    if (rc != 0) {
        DP_LOG_D("unit %u: bad request: %s", dp_unit_id(u), dp_detail_msg(&d));
        if (!(req.op != DP_WIRE_OP_NONE && dp_wire_op_is_notify(req.op)))
            reply_error(req.rid, rc, &d, NULL, reply);
        dp_wire_request_fini(&req);
        return;
    }
    dp_wire_reply rep;
    memset(&rep, 0, sizeof rep);
    rep.op = req.op;
    rep.rid = req.rid;
    switch (req.op) {
    case DP_WIRE_OP_PING:
        rep.r.unit_id = dp_unit_id(u);
        reply_ok(&rep, reply);
        break;
    case DP_WIRE_OP_INFO:
        do_info(u, &rep, reply);
        break;
    case DP_WIRE_OP_ALLOC: {
        const dp_wire_alloc_args *a = &req.a.alloc;
        const char *reason = NULL;
        /* spill is honoured only with the SSD tier on. */
        rc = dp_unit_alloc_spill(u, a->blob_id.p, a->blob_id.n, a->nbytes, a->n_entries,
                                 a->spill, &rep.r.off, &reason, &d);
        if (rc == 0)
            reply_ok(&rep, reply);
        else
            reply_error(req.rid, rc, &d, reason, reply);
        break;
    }
    case DP_WIRE_OP_COMMIT:
        rc = dp_unit_commit(u, req.a.commit.blob_id.p, req.a.commit.blob_id.n,
                            &rep.r.commit, &d);
        if (rc == 0)
            reply_ok(&rep, reply);
        else
            reply_error(req.rid, rc, &d, NULL, reply);
        break;
    case DP_WIRE_OP_ABORT:
        dp_unit_abort(u, req.a.abort.blob_id.p, req.a.abort.blob_id.n,
                      req.a.abort.in_flight);
        break;
    case DP_WIRE_OP_UNPIN:
        dp_unit_unpin(u, req.a.unpin.pin_id.p, req.a.unpin.pin_id.n);
        break;
    case DP_WIRE_OP_RESOLVE: {
        dp_unit_resolve_res res;
        dp_unit_lock(u);
        rc = dp_unit_resolve_locked(u, req.a.resolve.blob_ids.v, req.a.resolve.blob_ids.n,
                                    &res, &d);
        if (rc == 0) {
            dp_wire_resolve_res *r = &rep.r.resolve;
            r->pin_id = (dp_wire_str){res.pin_id, (uint32_t)strlen(res.pin_id)};
            r->blobs = (dp_wire_blob_locs){res.blobs, res.n_blobs};
            r->missing = (dp_wire_strs){res.missing, res.n_missing};
            r->pending = (dp_wire_strs){res.pending, res.n_pending};
            r->failed = (dp_wire_strs){res.failed, res.n_failed};
            reply_ok(&rep, reply);
            dp_unit_resolve_res_fini(&res);
        } else {
            reply_error(req.rid, rc, &d, NULL, reply);
        }
        dp_unit_unlock(u);
        break;
    }
    case DP_WIRE_OP_RESOLVE_KEYS: {
        dp_unit_resolve_keys_res res;
        dp_unit_lock(u);
        rc = dp_unit_resolve_keys_locked(u, req.a.resolve_keys.keys.v,
                                         req.a.resolve_keys.keys.n, &res, &d);
        if (rc == 0) {
            dp_wire_resolve_keys_res *r = &rep.r.resolve_keys;
            r->pin_id = (dp_wire_str){res.pin_id, (uint32_t)strlen(res.pin_id)};
            r->entries = (dp_wire_key_locs){res.entries, res.n_entries};
            r->missing = (dp_wire_strs){res.missing, res.n_missing};
            r->pending = (dp_wire_strs){res.pending, res.n_pending};
            r->failed = (dp_wire_strs){res.failed, res.n_failed};
            reply_ok(&rep, reply);
            dp_unit_resolve_keys_res_fini(&res);
        } else {
            reply_error(req.rid, rc, &d, NULL, reply);
        }
        dp_unit_unlock(u);
        break;
    }
    case DP_WIRE_OP_RELEASE_ROWS:
        rep.r.dropped = dp_unit_release_rows(u, req.a.release_rows.gidxs.v,
                                             req.a.release_rows.gidxs.n);
        reply_ok(&rep, reply);
        break;
    case DP_WIRE_OP_SCAN: {
        dp_wire_fields *recs = NULL;
        uint32_t n = 0;
        dp_unit_lock(u);
        rc = dp_unit_scan_locked(u, &recs, &n, &d);
        if (rc == 0) {
            rep.r.scan = (dp_wire_scan_res){recs, n};
            reply_ok(&rep, reply);
        } else {
            reply_error(req.rid, rc, &d, NULL, reply);
        }
        dp_unit_unlock(u);
        dp_unit_fields_free(recs, n);
        break;
    }
    case DP_WIRE_OP_STATS: {
        dp_wire_fields f = {0};
        dp_unit_lock(u);
        rc = dp_unit_stats_locked(u, &f, &d);
        if (rc == 0) {
            rep.r.stats = f;
            reply_ok(&rep, reply);
        } else {
            reply_error(req.rid, rc, &d, NULL, reply);
        }
        dp_unit_unlock(u);
        free(f.v);
        break;
    }
    case DP_WIRE_OP_READ_BYTES: {
        const uint8_t *p = NULL;
        dp_unit_lock(u);
        rc = dp_unit_read_bytes_locked(u, req.a.read_bytes.off, req.a.read_bytes.nbytes,
                                       &p, &d);
        if (rc == 0) {
            rep.r.bytes = (dp_wire_bytes){p, (uint32_t)req.a.read_bytes.nbytes};
            reply_ok(&rep, reply);
        } else {
            reply_error(req.rid, rc, &d, NULL, reply);
        }
        dp_unit_unlock(u);
        break;
    }
    case DP_WIRE_OP_SAVE_SHARD: {
        /*
         * The file I/O runs here, on the ctl thread, outside the unit lock:
         * the unit answers other requests once the save ends (the io workers
         * and the ticker keep running meanwhile).
         */
        dp_unit_save_res sr;
        rc = dp_unit_save_shard(u, req.a.save_shard.path.p, req.a.save_shard.path.n, &sr,
                                &d);
        if (rc == 0) {
            rep.r.save_shard.blobs = (dp_wire_shard_blobs){sr.blobs, sr.n_blobs};
            rep.r.save_shard.nbytes = sr.nbytes;
            rep.r.save_shard.clears_during_save = sr.clears_during_save;
            reply_ok(&rep, reply);
            dp_unit_save_res_fini(&sr);
        } else {
            DP_LOG_W("unit %u: %s", dp_unit_id(u), dp_detail_msg(&d));
            reply_error(req.rid, rc, &d, NULL, reply);
        }
        break;
    }
    case DP_WIRE_OP_LOAD_SHARD: {
        const dp_wire_load_shard_args *a = &req.a.load_shard;
        dp_unit_load_res lr;
        rc = dp_unit_load_shard(u, a->path.p, a->path.n, a->blobs.v, a->blobs.n, a->spill,
                                &lr, &d);
        if (rc == 0) {
            rep.r.load_shard.loaded = (dp_wire_strs){lr.loaded, lr.n_loaded};
            rep.r.load_shard.failed = (dp_wire_strs){lr.failed, lr.n_failed};
            reply_ok(&rep, reply);
            dp_unit_load_res_fini(&lr);
        } else {
            DP_LOG_W("unit %u: %s", dp_unit_id(u), dp_detail_msg(&d));
            reply_error(req.rid, rc, &d, NULL, reply);
        }
        break;
    }
    default:
        dp_fail(&d, DP_EPROTO, "unknown op");
        reply_error(req.rid, DP_EPROTO, &d, NULL, reply);
        break;
    }
    dp_wire_request_fini(&req);
}

void
dp_unit_handle_oversize(void *ctx, const uint8_t *msg, size_t len, dp_buf *reply)
{
    dp_unit *u = ctx;
    dp_wire_op op = DP_WIRE_OP_NONE;
    dp_wire_str rid = {"", 0};
    dp_wire_limits lim = dp_wire_limits_default;
    lim.max_msg = UINT64_MAX; /* only the head is read */
    dp_wire_request_peek(msg, len, &lim, &op, &rid, NULL);
    if (op != DP_WIRE_OP_NONE && dp_wire_op_is_notify(op))
        return;
    dp_detail d;
    dp_fail(&d, DP_ETOOBIG, "unit %u: message of %zu bytes is over the size limit",
            dp_unit_id(u), len);
    reply_error(rid, DP_EPROTO, &d, NULL, reply);
}
