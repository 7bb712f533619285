/*
 * Two-sided transfers (docs/design.md, "Two-sided transfers"): where UCX has
 * no native RMA towards a remote (TCP), an op with a grant travels as UCX
 * active messages instead of emulated put/get. A WRITE is one message per
 * contiguous run of the target's memory, gathered from the local ranges; the
 * target checks the grant, receives the bytes straight into its memory
 * (rendezvous) and acknowledges. A READ is one request listing the target's
 * ranges; the target checks the grant and sends the ranges, gathered, in one
 * reply that lands scattered in the local ranges.
 *
 * Design notes
 * ------------
 * Wire. The header and the READ range list are ts_wire.h's (no UCX there:
 * fuzzed). Replies go back on the connection the request came on
 * (UCP_AM_SEND_FLAG_REPLY), and a reply is matched to its message by
 * sequence number, kind and connection.
 *
 * Target. Handlers run in the progress thread with ep_mu held. A request is
 * refused (and counted) unless it parses, the endpoint serves, its ranges
 * lie in this endpoint's registered memory and the serve hook accepts its
 * grant; every refusal is answered with the reason. Each accepted request's
 * hold ends exactly once, when the endpoint no longer touches that memory: a
 * WRITE when its bytes are in (eager: copied in the handler; rendezvous: when
 * the receive completes), a READ when its reply's send completes. Replies to
 * a rendezvous WRITE are sent only from a receive that completed: its
 * connection is then alive (UCX destroys a failed connection's endpoint once
 * it has purged its requests, so no endpoint handle is kept past that).
 *
 * Client. A message counts once in its batch's b_pending until its send, its
 * reply and (READ by rendezvous) its receive have all ended; the batch's
 * local ranges are retained by the graveyard like any op's until then. A
 * remote that fails cancels the replies its messages wait for: no message
 * comes from a failed connection.
 */
#include "xfer/endpoint_int.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/le.h"
#include "xfer/ts_wire.h"

enum { TS_AM_WRITE = 1, TS_AM_READ = 2, TS_AM_ACK = 3, TS_AM_DATA = 4 };
#define TS_MSG_MAX 120                   /* bytes of a refusal's reason sent back */
#define TS_DEFAULT_RNDV_MIN (16u * 1024) /* docs/design.md, "Two-sided transfers" */
/* A range this large goes as a message of its own (contiguous on both sides:
 * zero-copy), several in flight; smaller ones are gathered into one message. */
#define TS_PIECE_MIN (128u * 1024)

static ucp_ep_h
reply_ep_of(const ucp_am_recv_param_t *param)
{
    return (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) ? param->reply_ep : NULL;
}

/* ---- client: messages and their batches ---- */

static void
tsop_free(tsop *t)
{
    free(t->t_iov);
    free(t->t_req);
    free(t);
}

/* One part of t ended; at the last, t ends and its batch has one part less. */
static void
part_end_locked(dp__endpoint *ep, tsop *t, ucs_status_t st)
{
    batch *b = t->t_b;
    if (st != UCS_OK && b->b_status == UCS_OK)
        b->b_status = st;
    if (--t->t_parts > 0)
        return;
    dp__list_remove(&ep->tsops, &t->t_link);
    tsop_free(t);
    dp__ep_batch_part_done_locked(b, UCS_OK);
}

/* The reply t waits for will not come (or came): that part ends. */
static void
reply_end_locked(dp__endpoint *ep, tsop *t, ucs_status_t st)
{
    if (!t->t_awaiting)
        return;
    t->t_awaiting = false;
    part_end_locked(ep, t, st);
}

static void
ts_send_cb(void *request, ucs_status_t status, void *user_data)
{
    tsop *t = user_data;
    dp__endpoint *ep = t->t_r->r_owner;
    if (status != UCS_OK)
        reply_end_locked(ep, t, status); /* the message may not have gone */
    part_end_locked(ep, t, status);
    ucp_request_free(request);
}

static void
ts_recv_cb(void *request, ucs_status_t status, size_t length, void *user_data)
{
    DP_UNUSED(length);
    tsop *t = user_data;
    part_end_locked(t->t_r->r_owner, t, status);
    ucp_request_free(request);
}

/* Local runs of ranges[k0..k1) (adjacent ones merged) as an iov. */
static ucp_dt_iov_t *
iov_of(const dp__range *r, size_t k0, size_t k1, size_t *n_out, uint64_t *total)
{
    ucp_dt_iov_t *iov = malloc((k1 - k0 ? k1 - k0 : 1) * sizeof *iov);
    size_t n = 0;
    *total = 0;
    if (iov == NULL)
        return NULL;
    for (size_t k = k0; k < k1; k++) {
        if (r[k].nbytes == 0)
            continue;
        *total += r[k].nbytes;
        if (n > 0 && (uint8_t *)iov[n - 1].buffer + iov[n - 1].length ==
                         (uint8_t *)(uintptr_t)r[k].addr) {
            iov[n - 1].length += r[k].nbytes;
            continue;
        }
        iov[n].buffer = (void *)(uintptr_t)r[k].addr;
        iov[n].length = r[k].nbytes;
        n++;
    }
    *n_out = n;
    return iov;
}

static tsop *
tsop_new_locked(dp__endpoint *ep, remote *r, batch *b, uint8_t kind)
{
    tsop *t = calloc(1, sizeof *t);
    if (t == NULL)
        return NULL;
    t->t_seq = ++ep->ts_seq;
    t->t_b = b;
    t->t_r = r;
    t->t_kind = kind;
    t->t_awaiting = true;
    t->t_parts = 2; /* the send and the reply */
    return t;
}

/* What a message carries after its header, as ucp_am_send_nbx takes it. */
typedef struct ts_body {
    const void *buf;
    size_t count;   /* bytes, or iov entries */
    bool iov;       /* buf is an iov of count entries */
    ucp_mem_h memh; /* contiguous bytes' registration (zero-copy), or NULL */
} ts_body;

/* Send t's message (its header, iov or request built); t joins its batch. */
static void
send_locked(dp__endpoint *ep, tsop *t, unsigned am_id, const ts_body *body, bool rndv)
{
    batch *b = t->t_b;
    b->b_pending++;
    dp__list_insert_tail(&ep->tsops, &t->t_link);
    ucp_request_param_t prm = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                        UCP_OP_ATTR_FIELD_DATATYPE | UCP_OP_ATTR_FIELD_FLAGS,
        .cb.send = ts_send_cb,
        .user_data = t,
        .datatype = body->iov ? ucp_dt_make_iov() : ucp_dt_make_contig(1),
        .flags = UCP_AM_SEND_FLAG_REPLY | (rndv ? UCP_AM_SEND_FLAG_RNDV : 0),
    };
    if (body->memh != NULL) {
        prm.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
        prm.memh = body->memh;
    }
    ucs_status_ptr_t sp = ucp_am_send_nbx(t->t_r->r_ep, am_id, t->t_hdr, t->t_hdr_len,
                                          body->buf, body->count, &prm);
    ep->st.ts_sent++;
    if (UCS_PTR_IS_ERR(sp)) {
        reply_end_locked(ep, t, UCS_PTR_STATUS(sp));
        part_end_locked(ep, t, UCS_PTR_STATUS(sp));
    } else if (sp == NULL) {
        part_end_locked(ep, t, UCS_OK); /* sent at once */
    }
}

/* The registration of [addr, addr + n) (validated), for a contiguous message. */
static ucp_mem_h
memh_of_locked(dp__endpoint *ep, uint64_t addr, uint64_t n)
{
    dp__ranges_ent *e = dp__ranges_find(&ep->regs, addr, n);
    return e != NULL ? ((region *)e->v)->r_memh : NULL;
}

static void
post_write_run_locked(dp__endpoint *ep, remote *r, const dp__xfer_desc *o, size_t k0,
                      size_t k1, batch *b)
{
    while (k0 < k1 && o->local[k0].nbytes == 0)
        k0++;
    if (k0 == k1)
        return;                          /* nothing to send */
    uint64_t raddr = o->remote[k0].addr; /* the run is contiguous on the target */
    tsop *t = tsop_new_locked(ep, r, b, DP_TS_WRITE);
    if (t == NULL ||
        (t->t_iov = iov_of(o->local, k0, k1, &t->t_n_iov, &t->t_total)) == NULL) {
        if (t != NULL)
            tsop_free(t);
        b->b_status = UCS_ERR_NO_MEMORY;
        return;
    }
    t->t_hdr_len = dp__ts_hdr_put(t->t_hdr, DP_TS_WRITE, t->t_seq, raddr, t->t_total,
                                  o->grant, (uint16_t)o->grant_len);
    bool one = t->t_n_iov == 1;
    ts_body body = {
        .buf = one ? t->t_iov[0].buffer : (void *)t->t_iov,
        .count = one ? t->t_iov[0].length : t->t_n_iov,
        .iov = !one,
        .memh =
            one ? memh_of_locked(ep, (uint64_t)(uintptr_t)t->t_iov[0].buffer, t->t_total)
                : NULL,
    };
    send_locked(ep, t, TS_AM_WRITE, &body, t->t_total >= ep->rndv_min);
}

/* One READ request for ranges [k0, k1) of o (local and remote pair up). */
static void
post_read_part_locked(dp__endpoint *ep, remote *r, const dp__xfer_desc *o, size_t k0,
                      size_t k1, batch *b)
{
    tsop *t = tsop_new_locked(ep, r, b, DP_TS_READ);
    uint8_t *req = malloc((k1 > k0 ? k1 - k0 : 1) * 16);
    if (t == NULL || req == NULL ||
        (t->t_iov = iov_of(o->local, k0, k1, &t->t_n_iov, &t->t_total)) == NULL) {
        free(req);
        if (t != NULL)
            tsop_free(t);
        b->b_status = UCS_ERR_NO_MEMORY;
        return;
    }
    /* The target's ranges, adjacent ones merged (independently of the local runs:
     * the reply is one stream of bytes). */
    size_t n = 0;
    uint64_t end = 0;
    for (size_t k = k0; k < k1; k++) {
        const dp__range *m = &o->remote[k];
        if (m->nbytes == 0)
            continue;
        if (n > 0 && m->addr == end) {
            dp__le64_store(req + 16 * (n - 1) + 8,
                           dp__le64_load(req + 16 * (n - 1) + 8) + m->nbytes);
        } else {
            dp__le64_store(req + 16 * n, m->addr);
            dp__le64_store(req + 16 * n + 8, m->nbytes);
            n++;
        }
        end = m->addr + m->nbytes;
    }
    if (n == 0) {
        free(req);
        tsop_free(t);
        return; /* nothing to READ */
    }
    t->t_req = req;
    t->t_req_len = 16 * n;
    t->t_hdr_len = dp__ts_hdr_put(t->t_hdr, DP_TS_READ, t->t_seq, n, t->t_total, o->grant,
                                  (uint16_t)o->grant_len);
    send_locked(ep, t, TS_AM_READ, &(ts_body){.buf = req, .count = t->t_req_len}, false);
}

/* Posts the piece [k0, k1) of o (post_write_run_locked, post_read_part_locked). */
typedef void post_piece_fn(dp__endpoint *ep, remote *r, const dp__xfer_desc *o, size_t k0,
                           size_t k1, batch *b);

/*
 * The pieces of ranges [k0, k1): a range of at least TS_PIECE_MIN bytes is a
 * piece of its own, runs of smaller ones one piece each. fn posts a piece.
 */
static void
post_pieces_locked(dp__endpoint *ep, remote *r, const dp__xfer_desc *o, size_t k0,
                   size_t k1, batch *b, post_piece_fn *fn)
{
    size_t k = k0;
    while (k < k1 && b->b_status == UCS_OK) {
        size_t j = k + 1;
        if (o->local[k].nbytes < TS_PIECE_MIN)
            while (j < k1 && o->local[j].nbytes < TS_PIECE_MIN)
                j++;
        fn(ep, r, o, k, j, b);
        k = j;
    }
}

/* Reads go as pieces: several replies in flight, large ones zero-copy. */
static void
post_read_locked(dp__endpoint *ep, remote *r, const dp__xfer_desc *o, batch *b)
{
    post_pieces_locked(ep, r, o, 0, o->n_local, b, post_read_part_locked);
}

bool
dp__ep_ts_wanted(const dp__endpoint *ep, const remote *r, const dp__xfer_desc *o)
{
    DP_UNUSED(ep);
    return r->r_path == DP_XFER_PATH_TWO_SIDED && o->grant_len > 0; /* validated */
}

void
dp__ep_ts_post_locked(dp__endpoint *ep, remote *r, const dp__xfer_desc *o, batch *b)
{
    if (o->op == DP_XFER_READ) {
        post_read_locked(ep, r, o, b);
        return;
    }
    /* One message per contiguous run of the target's memory. */
    size_t k = 0;
    while (k < o->n_local && b->b_status == UCS_OK) {
        if (o->remote[k].nbytes == 0) {
            k++;
            continue;
        }
        uint64_t start = o->remote[k].addr, end = start + o->remote[k].nbytes;
        size_t j = k + 1;
        while (j < o->n_local && (o->remote[j].nbytes == 0 || o->remote[j].addr == end)) {
            end += o->remote[j].nbytes;
            j++;
        }
        post_pieces_locked(ep, r, o, k, j, b, post_write_run_locked);
        k = j;
    }
}

/* A reply for one of our messages: t, if it is one we wait for from that connection. */
static tsop *
find_locked(dp__endpoint *ep, uint64_t seq, uint8_t kind, ucp_ep_h from)
{
    for (tsop *t = DP_LIST_FIRST(&ep->tsops, tsop, t_link); t != NULL;
         t = DP_LIST_NEXT(t, tsop, t_link))
        if (t->t_seq == seq)
            return t->t_kind == kind && t->t_awaiting && t->t_r->r_ep == from ? t : NULL;
    return NULL;
}

/* The target's verdict in a reply: 0, or its refusal recorded in the batch. */
static int
verdict_locked(tsop *t, const dp__ts_hdr *h)
{
    int rc = (int)(int32_t)(uint32_t)h->a;
    if (rc == 0)
        return 0;
    batch *b = t->t_b;
    if (strcmp(dp_errname(rc), "DP_E?") == 0)
        rc = DP_EPROTO; /* a code this build does not know */
    if (b->b_peer_rc == 0) {
        b->b_peer_rc = rc;
        size_t n = DP_MIN((size_t)h->vlen, sizeof b->b_peer_msg - 1);
        for (size_t i = 0; i < n; i++)
            b->b_peer_msg[i] = h->v[i] >= 0x20 && h->v[i] < 0x7f ? (char)h->v[i] : '?';
        b->b_peer_msg[n] = '\0';
    }
    return rc;
}

static ucs_status_t
ack_cb(void *arg, const void *header, size_t header_length, void *data, size_t length,
       const ucp_am_recv_param_t *param)
{
    DP_UNUSED(data);
    DP_UNUSED(length);
    dp__endpoint *ep = arg;
    dp__ts_hdr h;
    tsop *t;
    if (!dp__ts_hdr_get(header, header_length, DP_TS_WRITE, &h) ||
        (t = find_locked(ep, h.seq, DP_TS_WRITE, reply_ep_of(param))) == NULL)
        return UCS_OK; /* late (its op ended) or not ours */
    verdict_locked(t, &h);
    reply_end_locked(ep, t, UCS_OK);
    return UCS_OK;
}

static ucs_status_t
data_cb(void *arg, const void *header, size_t header_length, void *data, size_t length,
        const ucp_am_recv_param_t *param)
{
    dp__endpoint *ep = arg;
    dp__ts_hdr h;
    tsop *t;
    if (!dp__ts_hdr_get(header, header_length, DP_TS_READ, &h) ||
        (t = find_locked(ep, h.seq, DP_TS_READ, reply_ep_of(param))) == NULL)
        return UCS_OK;
    if (verdict_locked(t, &h) != 0) {
        reply_end_locked(ep, t, UCS_OK);
        return UCS_OK;
    }
    if (length != t->t_total || h.b != t->t_total) {
        batch *b = t->t_b;
        if (b->b_peer_rc == 0) {
            b->b_peer_rc = DP_EPROTO;
            snprintf(b->b_peer_msg, sizeof b->b_peer_msg,
                     "the reply carries %zu bytes, the READ asked for %" PRIu64, length,
                     t->t_total);
        }
        reply_end_locked(ep, t, UCS_OK);
        return UCS_OK;
    }
    if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) {
        bool one = t->t_n_iov == 1;
        ucp_request_param_t prm = {
            .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                            UCP_OP_ATTR_FIELD_DATATYPE,
            .cb.recv_am = ts_recv_cb,
            .user_data = t,
            .datatype = one ? ucp_dt_make_contig(1) : ucp_dt_make_iov(),
        };
        ucp_mem_h memh =
            one ? memh_of_locked(ep, (uint64_t)(uintptr_t)t->t_iov[0].buffer, t->t_total)
                : NULL;
        if (memh != NULL) {
            prm.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
            prm.memh = memh;
        }
        t->t_parts++; /* the receive */
        ucs_status_ptr_t sp = ucp_am_recv_data_nbx(
            ep->worker, data, one ? t->t_iov[0].buffer : (void *)t->t_iov,
            one ? t->t_iov[0].length : t->t_n_iov, &prm);
        reply_end_locked(ep, t, UCS_OK);
        if (UCS_PTR_IS_ERR(sp))
            part_end_locked(ep, t, UCS_PTR_STATUS(sp));
        else if (sp == NULL)
            part_end_locked(ep, t, UCS_OK);
        return UCS_INPROGRESS;
    }
    const uint8_t *src = data;
    for (size_t i = 0; i < t->t_n_iov; i++) {
        memcpy(t->t_iov[i].buffer, src, t->t_iov[i].length);
        src += t->t_iov[i].length;
    }
    reply_end_locked(ep, t, UCS_OK);
    return UCS_OK;
}

void
dp__ep_ts_remote_failed_locked(dp__endpoint *ep, remote *r, ucs_status_t st)
{
    for (tsop *t = DP_LIST_FIRST(&ep->tsops, tsop, t_link), *next; t != NULL; t = next) {
        next = DP_LIST_NEXT(t, tsop, t_link);
        if (t->t_r == r)
            reply_end_locked(ep, t, st);
    }
}

/* ---- target: serving WRITEs and READs ---- */

/* A reply in flight: its header and gathered ranges live until its send ends. */
typedef struct ts_reply {
    dp__endpoint *y_ep;
    void *y_hold; /* a READ's hold, NULL for an ACK */
    uint64_t y_gen;
    uint64_t y_total;
    ucp_dt_iov_t *y_iov;
    uint8_t y_hdr[DP_TS_HDR + TS_MSG_MAX];
} ts_reply;

/* A rendezvous WRITE being received. */
typedef struct ts_rx {
    dp__endpoint *x_ep;
    void *x_hold;
    uint64_t x_gen;
    uint64_t x_seq;
    uint64_t x_len;
    ucp_ep_h x_reply;
} ts_rx;

static void
reply_done_locked(ts_reply *y, ucs_status_t st)
{
    dp__endpoint *ep = y->y_ep;
    if (y->y_hold != NULL && ep->serving && y->y_gen == ep->serve_gen) {
        if (st == UCS_OK)
            ep->st.ts_bytes_out += y->y_total;
        ep->serve.read_end(ep->serve.ctx, y->y_hold);
    }
    free(y->y_iov);
    free(y);
}

static void
reply_cb(void *request, ucs_status_t status, void *user_data)
{
    ts_reply *y = user_data;
    y->y_ep->ts_inflight--;
    reply_done_locked(y, status);
    ucp_request_free(request);
}

/* An accepted READ's data: what its reply sends and the hold it ends. */
typedef struct ts_read_data {
    ucp_dt_iov_t *iov; /* the gathered ranges, n_iov of them */
    size_t n_iov;
    uint64_t total; /* their bytes */
    void *hold;
} ts_read_data;

/*
 * Answer message seq of kind on connection to: rc and msg, and for an accepted
 * READ its data rd (NULL: none), whose iov the reply owns from here on.
 */
static void
reply_locked(dp__endpoint *ep, ucp_ep_h to, uint8_t kind, uint64_t seq, int rc,
             const char *msg, const ts_read_data *rd)
{
    ucp_dt_iov_t *iov = rd != NULL ? rd->iov : NULL;
    size_t n_iov = rd != NULL ? rd->n_iov : 0;
    uint64_t total = rd != NULL ? rd->total : 0;
    void *hold = rd != NULL ? rd->hold : NULL;
    ts_reply *y = calloc(1, sizeof *y);
    if (y == NULL) {
        free(iov);
        if (hold != NULL)
            ep->serve.read_end(ep->serve.ctx, hold);
        return; /* the peer's op times out */
    }
    y->y_ep = ep;
    y->y_hold = hold;
    y->y_gen = ep->serve_gen;
    y->y_total = total;
    y->y_iov = iov;
    size_t mlen = msg != NULL ? DP_MIN(strlen(msg), (size_t)TS_MSG_MAX) : 0;
    size_t hlen =
        dp__ts_hdr_put(y->y_hdr, kind, seq, (uint32_t)rc, total, msg, (uint16_t)mlen);
    bool one = n_iov == 1;
    ucp_request_param_t prm = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                        UCP_OP_ATTR_FIELD_DATATYPE | UCP_OP_ATTR_FIELD_FLAGS,
        .cb.send = reply_cb,
        .user_data = y,
        .datatype = n_iov > 1 ? ucp_dt_make_iov() : ucp_dt_make_contig(1),
        .flags = UCP_AM_SEND_FLAG_REPLY |
                 (total >= ep->rndv_min ? UCP_AM_SEND_FLAG_RNDV : UCP_AM_SEND_FLAG_EAGER),
    };
    const void *buf = n_iov == 0 ? NULL : one ? iov[0].buffer : (void *)iov;
    size_t count = n_iov == 0 ? 0 : one ? iov[0].length : n_iov;
    ucp_mem_h memh =
        one ? memh_of_locked(ep, (uint64_t)(uintptr_t)iov[0].buffer, iov[0].length)
            : NULL;
    if (memh != NULL) { /* contiguous in registered memory: zero-copy */
        prm.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
        prm.memh = memh;
    }
    ucs_status_ptr_t sp =
        ucp_am_send_nbx(to, kind == DP_TS_WRITE ? TS_AM_ACK : TS_AM_DATA, y->y_hdr, hlen,
                        buf, count, &prm);
    if (UCS_PTR_IS_ERR(sp))
        reply_done_locked(y, UCS_PTR_STATUS(sp));
    else if (sp == NULL)
        reply_done_locked(y, UCS_OK);
    else
        ep->ts_inflight++;
}

static void
refuse_locked(dp__endpoint *ep, ucp_ep_h to, uint8_t kind, uint64_t seq, int rc,
              const char *msg)
{
    ep->st.ts_refused++;
    DP_LOG_D("endpoint %s: two-sided %s refused: %s", ep->name,
             kind == DP_TS_WRITE ? "WRITE" : "READ", msg);
    if (to != NULL)
        reply_locked(ep, to, kind, seq, rc, msg, NULL);
}

/*
 * The checks every request to serve passes first: its header parses as kind,
 * it came with a reply path (*to) and this endpoint serves. False: refused.
 */
static bool
request_ok_locked(dp__endpoint *ep, const void *header, size_t header_length,
                  uint8_t kind, const ucp_am_recv_param_t *param, dp__ts_hdr *h,
                  ucp_ep_h *to)
{
    const char *what = kind == DP_TS_WRITE ? "WRITE" : "READ";
    char msg[DP_DETAIL_MAX];
    *to = reply_ep_of(param);
    if (!dp__ts_hdr_get(header, header_length, kind, h)) {
        snprintf(msg, sizeof msg, "malformed %s header", what);
        refuse_locked(ep, NULL, kind, 0, DP_EPROTO, msg);
        return false;
    }
    if (*to == NULL) {
        snprintf(msg, sizeof msg, "%s without a reply path", what);
        refuse_locked(ep, NULL, kind, h->seq, DP_EPROTO, msg);
        return false;
    }
    if (!ep->serving) {
        snprintf(msg, sizeof msg, "endpoint %s does not serve two-sided transfers",
                 ep->name);
        refuse_locked(ep, *to, kind, h->seq, DP_EPROTO, msg);
        return false;
    }
    return true;
}

static void
rx_cb(void *request, ucs_status_t status, size_t length, void *user_data)
{
    DP_UNUSED(length);
    ts_rx *x = user_data;
    dp__endpoint *ep = x->x_ep;
    ep->ts_inflight--;
    bool live = ep->serving && x->x_gen == ep->serve_gen;
    if (live)
        ep->serve.write_end(ep->serve.ctx, x->x_hold, status == UCS_OK);
    if (status == UCS_OK) {
        ep->st.ts_bytes_in += x->x_len;
        /* Completed: the connection is alive, its endpoint handle valid. */
        reply_locked(ep, x->x_reply, DP_TS_WRITE, x->x_seq, 0, NULL, NULL);
    }
    free(x);
    ucp_request_free(request);
}

static ucs_status_t
write_cb(void *arg, const void *header, size_t header_length, void *data, size_t length,
         const ucp_am_recv_param_t *param)
{
    dp__endpoint *ep = arg;
    ucp_ep_h to;
    dp__ts_hdr h;
    char msg[DP_DETAIL_MAX];
    if (!request_ok_locked(ep, header, header_length, DP_TS_WRITE, param, &h, &to))
        return UCS_OK;
    if (h.b != length || length == 0 || h.a + h.b < h.a ||
        memh_of_locked(ep, h.a, h.b) == NULL) {
        snprintf(msg, sizeof msg,
                 "WRITE of %zu bytes (header: %" PRIu64 " at 0x%" PRIx64
                 ") does not fit this endpoint's memory",
                 length, h.b, h.a);
        refuse_locked(ep, to, DP_TS_WRITE, h.seq, DP_EPROTO, msg);
        return UCS_OK;
    }
    void *hold = NULL;
    dp_detail d;
    dp_detail_clear(&d);
    int rc = ep->serve.write_begin(ep->serve.ctx, h.v, h.vlen, h.a, h.b, &hold, &d);
    if (rc != 0) {
        refuse_locked(ep, to, DP_TS_WRITE, h.seq, rc, d.msg);
        return UCS_OK;
    }
    ep->st.ts_served++;
    if (!(param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV)) {
        memcpy((void *)(uintptr_t)h.a, data, length);
        ep->serve.write_end(ep->serve.ctx, hold, true);
        ep->st.ts_bytes_in += length;
        reply_locked(ep, to, DP_TS_WRITE, h.seq, 0, NULL, NULL);
        return UCS_OK;
    }
    ts_rx *x = calloc(1, sizeof *x);
    if (x == NULL) {
        ep->serve.write_end(ep->serve.ctx, hold, false);
        refuse_locked(ep, to, DP_TS_WRITE, h.seq, DP_ENOMEM, "out of memory");
        return UCS_OK;
    }
    *x = (ts_rx){ep, hold, ep->serve_gen, h.seq, h.b, to};
    ucp_request_param_t prm = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                        UCP_OP_ATTR_FIELD_DATATYPE | UCP_OP_ATTR_FIELD_MEMH,
        .cb.recv_am = rx_cb,
        .user_data = x,
        .datatype = ucp_dt_make_contig(1),
        .memh = memh_of_locked(ep, h.a, h.b),
    };
    ucs_status_ptr_t sp =
        ucp_am_recv_data_nbx(ep->worker, data, (void *)(uintptr_t)h.a, h.b, &prm);
    if (UCS_PTR_IS_ERR(sp)) {
        ep->serve.write_end(ep->serve.ctx, hold, false);
        snprintf(msg, sizeof msg, "receive failed: %s",
                 ucs_status_string(UCS_PTR_STATUS(sp)));
        refuse_locked(ep, to, DP_TS_WRITE, h.seq, DP_ETRANSFER, msg);
        free(x);
    } else if (sp == NULL) {
        ep->serve.write_end(ep->serve.ctx, hold, true);
        ep->st.ts_bytes_in += h.b;
        reply_locked(ep, to, DP_TS_WRITE, h.seq, 0, NULL, NULL);
        free(x);
    } else {
        ep->ts_inflight++;
    }
    return UCS_INPROGRESS;
}

static ucs_status_t
read_cb(void *arg, const void *header, size_t header_length, void *data, size_t length,
        const ucp_am_recv_param_t *param)
{
    dp__endpoint *ep = arg;
    ucp_ep_h to;
    dp__ts_hdr h;
    char msg[DP_DETAIL_MAX];
    if (!request_ok_locked(ep, header, header_length, DP_TS_READ, param, &h, &to))
        return UCS_OK;
    if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) {
        refuse_locked(ep, to, DP_TS_READ, h.seq, DP_EPROTO,
                      "malformed READ request: sent by rendezvous");
        return UCS_OK;
    }
    size_t n = h.a > 0 && h.a <= DP_TS_RANGES_MAX ? (size_t)h.a : 1;
    dp__range *rg = malloc(n * sizeof *rg);
    ucp_dt_iov_t *iov = malloc(n * sizeof *iov);
    if (rg == NULL || iov == NULL) {
        free(rg);
        free(iov);
        refuse_locked(ep, to, DP_TS_READ, h.seq, DP_ENOMEM, "out of memory");
        return UCS_OK;
    }
    int prc = dp__ts_ranges_parse(&h, data, length, rg, msg, sizeof msg);
    for (size_t i = 0; prc == DP_OK && i < n; i++) {
        iov[i].buffer = (void *)(uintptr_t)rg[i].addr;
        iov[i].length = rg[i].nbytes;
        if (memh_of_locked(ep, rg[i].addr, rg[i].nbytes) == NULL) {
            snprintf(msg, sizeof msg,
                     "READ range %zu (%" PRIu64 " bytes at 0x%" PRIx64
                     ") is outside this endpoint's memory",
                     i, rg[i].nbytes, rg[i].addr);
            prc = DP_EPROTO;
        }
    }
    if (prc != DP_OK) {
        free(rg);
        free(iov);
        refuse_locked(ep, to, DP_TS_READ, h.seq, DP_EPROTO, msg);
        return UCS_OK;
    }
    void *hold = NULL;
    dp_detail d;
    dp_detail_clear(&d);
    int rc = ep->serve.read_begin(ep->serve.ctx, h.v, h.vlen, rg, n, &hold, &d);
    free(rg);
    if (rc != 0) {
        free(iov);
        refuse_locked(ep, to, DP_TS_READ, h.seq, rc, d.msg);
        return UCS_OK;
    }
    ep->st.ts_served++;
    ts_read_data rd = {.iov = iov, .n_iov = n, .total = h.b, .hold = hold};
    reply_locked(ep, to, DP_TS_READ, h.seq, 0, NULL, &rd);
    return UCS_OK;
}

/* ---- setup ---- */

int
dp__ep_ts_init_locked(dp__endpoint *ep, dp_detail *d)
{
    ep->rndv_min = ep->opts.rndv_min > 0 ? ep->opts.rndv_min : TS_DEFAULT_RNDV_MIN;
    const char *rm = getenv("DP_RNDV_MIN");
    if (rm != NULL && *rm != '\0' &&
        dp__parse_size(rm, &ep->rndv_min, "DP_RNDV_MIN", d) != DP_OK)
        return DP_EINVAL;
    ep->two_sided = ep->opts.two_sided;
    const char *e = getenv("DP_TWO_SIDED");
    if (e != NULL && *e != '\0') {
        if (strcmp(e, "auto") == 0)
            ep->two_sided = DP_XFER_TS_AUTO;
        else if (strcmp(e, "always") == 0 || strcmp(e, "1") == 0)
            ep->two_sided = DP_XFER_TS_ALWAYS;
        else if (strcmp(e, "never") == 0 || strcmp(e, "0") == 0)
            ep->two_sided = DP_XFER_TS_NEVER;
        else
            return dp__fail(d, DP_EINVAL, "DP_TWO_SIDED=%.40s: use auto, always or never",
                            e);
    }
    ucp_worker_attr_t wa = {.field_mask = UCP_WORKER_ATTR_FIELD_MAX_AM_HEADER};
    ep->max_am_header =
        ucp_worker_query(ep->worker, &wa) == UCS_OK ? wa.max_am_header : 0;
    static const struct {
        unsigned id;
        ucp_am_recv_callback_t cb;
    } hs[] = {{TS_AM_WRITE, write_cb},
              {TS_AM_READ, read_cb},
              {TS_AM_ACK, ack_cb},
              {TS_AM_DATA, data_cb}};
    for (size_t i = 0; i < DP_ARRAY_LEN(hs); i++) {
        ucp_am_handler_param_t hp = {
            .field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                          UCP_AM_HANDLER_PARAM_FIELD_ARG |
                          UCP_AM_HANDLER_PARAM_FIELD_FLAGS,
            .id = hs[i].id,
            .cb = hs[i].cb,
            .arg = ep,
            .flags = UCP_AM_FLAG_WHOLE_MSG,
        };
        ucs_status_t st = ucp_worker_set_am_recv_handler(ep->worker, &hp);
        if (st != UCS_OK)
            return dp__ep_ucx_fail(d, DP_ETRANSFER, st,
                                   "endpoint %s: active-message handler %u", ep->name,
                                   hs[i].id);
    }
    return DP_OK;
}

void
dp__ep_ts_choose_path_locked(dp__endpoint *ep, remote *r, dp__xfer_lane lane)
{
    bool able = r->r_serves && ep->max_am_header >= DP_TS_HDR + DP_XFER_GRANT_MAX;
    if (!able || ep->two_sided == DP_XFER_TS_NEVER)
        r->r_path = DP_XFER_PATH_RMA;
    else if (ep->two_sided == DP_XFER_TS_ALWAYS)
        r->r_path = DP_XFER_PATH_TWO_SIDED;
    else
        r->r_path = lane == DP_XFER_LANE_TCP ? DP_XFER_PATH_TWO_SIDED : DP_XFER_PATH_RMA;
}

int
dp__endpoint_serve(dp__endpoint *ep, const dp__xfer_serve *hooks, dp_detail *d)
{
    if (hooks != NULL && (hooks->write_begin == NULL || hooks->write_end == NULL ||
                          hooks->read_begin == NULL || hooks->read_end == NULL))
        return dp__fail(d, DP_EINVAL, "endpoint %s: serve: every hook is needed",
                        ep->name);
    lock(ep);
    int rc = check_open_locked(ep, d);
    if (rc == DP_OK && hooks != NULL && !ep->opts.progress_thread)
        rc =
            dp__fail(d, DP_EINVAL,
                     "endpoint %s: serving two-sided transfers needs the progress thread",
                     ep->name);
    if (rc == DP_OK) {
        /* A new generation: holds of the old hooks are never ended by the new. */
        ep->serve_gen++;
        ep->serving = hooks != NULL;
        if (hooks != NULL)
            ep->serve = *hooks;
        ep->gen++; /* metadata says whether it serves */
    }
    unlock(ep);
    return rc;
}
