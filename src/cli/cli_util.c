/*
 * Helpers shared by the subcommands (see cli.h): house-style messages and the
 * control-plane session of the commands that talk to a running cluster.
 */
#include "cli/cli.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int
dp__cli_usage(const char *cmd, const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "dataplane %s: ", cmd);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\nRun 'dataplane %s --help' for usage.\n", cmd);
    return 2;
}

int
dp__cli_fail(const char *cmd, int rc, const dp_detail *d)
{
    const char *m = dp_detail_msg(d);
    if (*m != '\0')
        fprintf(stderr, "dataplane %s: %s (%s)\n", cmd, m, dp_strerror(rc));
    else
        fprintf(stderr, "dataplane %s: %s\n", cmd, dp_strerror(rc));
    return 1;
}

int
dp__cli_connect(const char *arg, double timeout_s, dp__cli_conn *c, dp_detail *d)
{
    memset(c, 0, sizeof *c);
    c->timeout_s = timeout_s > 0 ? timeout_s : DP_CLI_TIMEOUT_S;
    int rc = dp_cluster_locate(arg, c->path, sizeof c->path, d);
    if (rc == DP_OK)
        rc = dp_cluster_load(c->path, &c->cl, d);
    if (rc == DP_OK)
        rc = dp_wire_rid_gen_init(&c->rids, d);
    if (rc == DP_OK)
        rc = dp_ctl_client_create(&c->ctl, d);
    if (rc != DP_OK)
        dp__cli_disconnect(c);
    return rc;
}

void
dp__cli_disconnect(dp__cli_conn *c)
{
    dp_ctl_client_destroy(c->ctl);
    c->ctl = NULL;
    dp_cluster_fini(&c->cl);
}

/* Turn a decoded reply into a code: an error reply's kind and words, per unit. */
static int
reply_rc(const dp__cli_conn *c, uint32_t i, const dp_wire_reply *rep, dp_detail *d)
{
    if (rep->ok)
        return DP_OK;
    dp_detail e;
    dp_detail_clear(&e);
    int rc = dp_wire_error_to_detail(&rep->err, &e);
    return dp_fail(d, rc, "unit %u (%s): %s", i, c->cl.units[i].zmq, e.msg);
}

int
dp__cli_call(dp__cli_conn *c, uint32_t i, dp_wire_request *q, dp_wire_reply *rep,
             dp_buf *rb, dp_detail *d)
{
    memset(rep, 0, sizeof *rep);
    rep->op = DP_WIRE_OP_NONE;
    char rid[DP_WIRE_RID_MAX];
    q->rid = dp_wire_rid_next(&c->rids, rid);
    dp_buf req;
    dp_buf_init(&req);
    dp_buf_reset(rb);
    int rc = dp_wire_request_encode(q, NULL, &req, d);
    if (rc == DP_OK)
        rc = dp_ctl_call(c->ctl, c->cl.units[i].zmq, req.data, req.len, rid, c->timeout_s,
                         rb, d);
    dp_buf_fini(&req);
    if (rc == DP_OK)
        rc = dp_wire_reply_decode(rb->data, rb->len, q->op, NULL, rep, d);
    if (rc == DP_OK)
        return reply_rc(c, i, rep, d);
    if (rc == DP_ETIMEDOUT)
        return dp_fail(d, rc,
                       "unit %u (%s) did not answer %s within %.0f s: is the cluster "
                       "running? (cluster file %s)",
                       i, c->cl.units[i].zmq, dp_wire_op_name(q->op), c->timeout_s,
                       c->path);
    return dp_fail_ctx(d, rc, "unit %u (%s)", i, c->cl.units[i].zmq);
}

int
dp__cli_call_all(dp__cli_conn *c, dp__cli_req_fn q_of, void *ctx, dp_wire_reply *reps,
                 dp_buf *rbs, int *rcs, dp_detail *dets)
{
    uint32_t n = c->cl.n_units;
    int first = DP_OK;
    dp_ctl_item *items = calloc(n, sizeof *items);
    dp_buf *reqs = calloc(n, sizeof *reqs);
    char(*rids)[DP_WIRE_RID_MAX] = calloc(n, sizeof *rids);
    uint32_t *which = calloc(n, sizeof *which);
    if (items == NULL || reqs == NULL || rids == NULL || which == NULL) {
        for (uint32_t i = 0; i < n; i++)
            rcs[i] = dp_fail(&dets[i], DP_ENOMEM, "out of memory");
        first = DP_ENOMEM;
        goto out;
    }
    size_t k = 0;
    for (uint32_t i = 0; i < n; i++) {
        memset(&reps[i], 0, sizeof reps[i]);
        reps[i].op = DP_WIRE_OP_NONE;
        dp_detail_clear(&dets[i]);
        rcs[i] = DP_OK;
        dp_wire_request q;
        memset(&q, 0, sizeof q);
        if (!q_of(i, &q, ctx))
            continue;
        q.rid = dp_wire_rid_next(&c->rids, rids[i]);
        reps[i].op = q.op;
        dp_buf_init(&reqs[i]);
        rcs[i] = dp_wire_request_encode(&q, NULL, &reqs[i], &dets[i]);
        if (rcs[i] != DP_OK)
            continue;
        items[k] = (dp_ctl_item){.address = c->cl.units[i].zmq,
                                 .req = reqs[i].data,
                                 .len = reqs[i].len,
                                 .rid = rids[i]};
        dp_buf_init(&items[k].reply);
        which[k++] = i;
    }
    if (k > 0)
        dp_ctl_call_many(c->ctl, items, k, c->timeout_s);
    for (size_t j = 0; j < k; j++) {
        uint32_t i = which[j];
        rbs[i] = items[j].reply; /* hand the reply bytes over */
        dp_wire_op op = reps[i].op;
        if (items[j].rc == DP_ETIMEDOUT)
            rcs[i] = dp_fail(&dets[i], DP_ETIMEDOUT,
                             "unit %u (%s) did not answer within %.0f s: is the cluster "
                             "running? (cluster file %s)",
                             i, c->cl.units[i].zmq, c->timeout_s, c->path);
        else if (items[j].rc != DP_OK) {
            dets[i] = items[j].det;
            rcs[i] =
                dp_fail_ctx(&dets[i], items[j].rc, "unit %u (%s)", i, c->cl.units[i].zmq);
        } else {
            rcs[i] = dp_wire_reply_decode(rbs[i].data, rbs[i].len, op, NULL, &reps[i],
                                          &dets[i]);
            if (rcs[i] == DP_OK)
                rcs[i] = reply_rc(c, i, &reps[i], &dets[i]);
        }
    }
    for (uint32_t i = 0; i < n; i++)
        if (rcs[i] != DP_OK && first == DP_OK)
            first = rcs[i];
out:
    if (reqs != NULL)
        for (uint32_t i = 0; i < n; i++)
            dp_buf_fini(&reqs[i]);
    free(items);
    free(reqs);
    free(rids);
    free(which);
    return first;
}

int
dp__cli_parse_unit(const dp__cli_conn *c, const char *s, uint32_t *out, dp_detail *d)
{
    uint64_t v;
    int rc = dp_parse_u64(s, 0, UINT32_MAX, &v, "UNIT", d);
    if (rc != DP_OK)
        return rc;
    if (v >= c->cl.n_units)
        return dp_fail(d, DP_EINVAL,
                       "unit %" PRIu64
                       " does not exist: the cluster in %s has units 0..%u",
                       v, c->path, c->cl.n_units - 1);
    *out = (uint32_t)v;
    return DP_OK;
}
