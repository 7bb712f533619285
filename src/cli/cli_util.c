/*
 * Helpers shared by the subcommands (see cli.h): house-style messages, the
 * control-plane session of the commands that talk to a running cluster (which
 * asks every unit who it is before anything else goes to it), the check of an
 * advertised address and the guard that keeps library logs off stdout.
 */
#include "cli/cli.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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
dp__cli_connect(const char *arg, double timeout_s, double connect_timeout_s,
                unsigned flags, dp__cli_conn *c, dp_detail *d)
{
    memset(c, 0, sizeof *c);
    c->timeout_s = timeout_s > 0 ? timeout_s : DP_CLI_TIMEOUT_S;
    c->connect_timeout_s = connect_timeout_s > 0 ? connect_timeout_s : c->timeout_s;
    int rc = dp_cluster_locate(arg, c->path, sizeof c->path, d);
    if (rc == DP_OK)
        rc = dp_cluster_load(c->path, &c->cl, d);
    if (rc == DP_OK && (c->units = calloc(c->cl.n_units, sizeof *c->units)) == NULL)
        rc = dp_fail(d, DP_ENOMEM, "out of memory");
    if (rc == DP_OK)
        rc = dp_wire_rid_gen_init(&c->rids, d);
    if (rc == DP_OK)
        rc = dp_ctl_client_create(&c->ctl, d);
    if (rc == DP_OK && !(flags & DP__CLI_NO_CHECK))
        rc = dp__cli_check_units(c, -1, flags, d);
    if (rc != DP_OK)
        dp__cli_disconnect(c);
    return rc;
}

void
dp__cli_disconnect(dp__cli_conn *c)
{
    dp_ctl_client_destroy(c->ctl);
    c->ctl = NULL;
    free(c->units);
    c->units = NULL;
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

/* Whether a request may go to unit i: checked, or an info while checking. */
static int
unit_usable(const dp__cli_conn *c, uint32_t i, dp_detail *d)
{
    const dp__cli_unit *u = &c->units[i];
    if (u->state == DP__CLI_CHECKED)
        return DP_OK;
    if (u->state == DP__CLI_DOWN) {
        if (d != NULL)
            *d = u->det;
        return u->rc;
    }
    return dp_fail(d, DP_EINVAL, "unit %u (%s) was not asked who it is before use", i,
                   c->cl.units[i].zmq);
}

static int
no_answer(const dp__cli_conn *c, uint32_t i, const char *what, double timeout_s,
          dp_detail *d)
{
    return dp_fail(d, DP_ETIMEDOUT,
                   "unit %u (%s) did not answer %s within %g s: is the cluster running? "
                   "(cluster file %s)",
                   i, c->cl.units[i].zmq, what, timeout_s, c->path);
}

int
dp__cli_call(dp__cli_conn *c, uint32_t i, dp_wire_request *q, dp_wire_reply *rep,
             dp_buf *rb, dp_detail *d)
{
    memset(rep, 0, sizeof *rep);
    rep->op = DP_WIRE_OP_NONE;
    int rc = unit_usable(c, i, d);
    if (rc != DP_OK)
        return rc;
    char rid[DP_WIRE_RID_MAX];
    q->rid = dp_wire_rid_next(&c->rids, rid);
    dp_buf req;
    dp_buf_init(&req);
    dp_buf_reset(rb);
    rc = dp_wire_request_encode(q, NULL, &req, d);
    if (rc == DP_OK)
        rc = dp_ctl_call(c->ctl, c->cl.units[i].zmq, req.data, req.len, rid, c->timeout_s,
                         rb, d);
    dp_buf_fini(&req);
    if (rc == DP_OK)
        rc = dp_wire_reply_decode(rb->data, rb->len, q->op, NULL, rep, d);
    if (rc == DP_OK)
        return reply_rc(c, i, rep, d);
    if (rc == DP_ETIMEDOUT)
        return no_answer(c, i, dp_wire_op_name(q->op), c->timeout_s, d);
    return dp_fail_ctx(d, rc, "unit %u (%s)", i, c->cl.units[i].zmq);
}

/*
 * dp__cli_call_all with its own timeout; checking false lets requests go to
 * units not checked yet (the info of dp__cli_check_units). answered (NULL or
 * n_units) says which units sent a reply, whatever it said.
 */
static int
call_all(dp__cli_conn *c, double timeout_s, bool checking, dp__cli_req_fn q_of, void *ctx,
         dp_wire_reply *reps, dp_buf *rbs, int *rcs, dp_detail *dets, bool *answered)
{
    uint32_t n = c->cl.n_units;
    int first = DP_OK;
    dp_ctl_item *items = calloc(n, sizeof *items);
    dp_buf *reqs = calloc(n, sizeof *reqs);
    char(*rids)[DP_WIRE_RID_MAX] = calloc(n, sizeof *rids);
    uint32_t *which = calloc(n, sizeof *which);
    if (items == NULL || reqs == NULL || rids == NULL || which == NULL) {
        for (uint32_t i = 0; i < n; i++) {
            memset(&reps[i], 0, sizeof reps[i]);
            reps[i].op = DP_WIRE_OP_NONE;
            rcs[i] = dp_fail(&dets[i], DP_ENOMEM, "out of memory");
        }
        first = DP_ENOMEM;
        goto out;
    }
    size_t k = 0;
    for (uint32_t i = 0; i < n; i++) {
        memset(&reps[i], 0, sizeof reps[i]);
        reps[i].op = DP_WIRE_OP_NONE;
        dp_detail_clear(&dets[i]);
        rcs[i] = DP_OK;
        if (answered != NULL)
            answered[i] = false;
        dp_wire_request q;
        memset(&q, 0, sizeof q);
        if (!q_of(i, &q, ctx))
            continue;
        if (!checking && (rcs[i] = unit_usable(c, i, &dets[i])) != DP_OK)
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
        dp_ctl_call_many(c->ctl, items, k, timeout_s);
    for (size_t j = 0; j < k; j++) {
        uint32_t i = which[j];
        rbs[i] = items[j].reply; /* hand the reply bytes over */
        dp_wire_op op = reps[i].op;
        if (items[j].rc == DP_ETIMEDOUT) {
            rcs[i] = no_answer(c, i, dp_wire_op_name(op), timeout_s, &dets[i]);
        } else if (items[j].rc != DP_OK) {
            dets[i] = items[j].det;
            rcs[i] =
                dp_fail_ctx(&dets[i], items[j].rc, "unit %u (%s)", i, c->cl.units[i].zmq);
        } else {
            if (answered != NULL)
                answered[i] = true;
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
dp__cli_call_all(dp__cli_conn *c, dp__cli_req_fn q_of, void *ctx, dp_wire_reply *reps,
                 dp_buf *rbs, int *rcs, dp_detail *dets)
{
    return call_all(c, c->timeout_s, false, q_of, ctx, reps, rbs, rcs, dets, NULL);
}

static bool
info_req(uint32_t i, dp_wire_request *q, void *ctx)
{
    int64_t only = *(const int64_t *)ctx;
    if (only >= 0 && (int64_t)i != only)
        return false;
    q->op = DP_WIRE_OP_INFO;
    return true;
}

int
dp__cli_check_units(dp__cli_conn *c, int64_t only, unsigned flags, dp_detail *d)
{
    uint32_t n = c->cl.n_units;
    dp_wire_reply *reps = calloc(n, sizeof *reps);
    dp_buf *rbs = calloc(n, sizeof *rbs);
    int *rcs = calloc(n, sizeof *rcs);
    dp_detail *dets = calloc(n, sizeof *dets);
    bool *answered = calloc(n, sizeof *answered);
    int rc = DP_OK;
    if (reps == NULL || rbs == NULL || rcs == NULL || dets == NULL || answered == NULL) {
        rc = dp_fail(d, DP_ENOMEM, "out of memory");
        goto out;
    }
    call_all(c, c->connect_timeout_s, true, info_req, &only, reps, rbs, rcs, dets,
             answered);
    for (uint32_t i = 0; i < n; i++) {
        dp__cli_unit *u = &c->units[i];
        if (only >= 0 && (int64_t)i != only)
            continue;
        if (rcs[i] != DP_OK && !answered[i] && (flags & DP__CLI_ALLOW_DOWN)) {
            u->state = DP__CLI_DOWN;
            u->rc = rcs[i];
            u->det = dets[i];
            continue;
        }
        if (rcs[i] != DP_OK) {
            if (rc == DP_OK) {
                if (d != NULL)
                    *d = dets[i];
                rc = rcs[i];
            }
            continue;
        }
        /* The words of the library's own check (dp_client_open), per unit. */
        const dp_wire_info *in = &reps[i].r.info;
        if (in->unit_id != i || in->n_units != n) {
            if (rc == DP_OK)
                rc = dp_fail(d, DP_EPROTO,
                             "unit %u (%s) says it is unit %" PRIu64 " of %" PRIu64
                             ", but the cluster file %s lists it as unit %u of %u (wrong "
                             "order or a unit from another cluster): nothing was done; "
                             "fix the order in the file, or point --cluster at the "
                             "file of the cluster these units belong to",
                             i, c->cl.units[i].zmq, in->unit_id, in->n_units, c->path, i,
                             n);
            continue;
        }
        u->incarnation = in->incarnation;
        if (dp_wire_str_copy(in->agent, u->agent, sizeof u->agent) >= sizeof u->agent) {
            if (rc == DP_OK)
                rc =
                    dp_fail(d, DP_EPROTO,
                            "unit %u (%s) has an endpoint name of %u bytes (at most %zu)",
                            i, c->cl.units[i].zmq, in->agent.n, sizeof u->agent - 1);
            continue;
        }
        u->state = DP__CLI_CHECKED;
    }
out:
    for (uint32_t i = 0; i < n; i++) {
        if (reps != NULL)
            dp_wire_reply_fini(&reps[i]);
        if (rbs != NULL)
            dp_buf_fini(&rbs[i]);
    }
    free(reps);
    free(rbs);
    free(rcs);
    free(dets);
    free(answered);
    return rc;
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

int
dp__cli_check_advertise(const char *h, dp_detail *d)
{
    size_t n = strlen(h);
    if (n == 0)
        return dp_fail(d, DP_EINVAL, "--advertise must not be empty");
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)h[i];
        if (ch <= 0x20 || ch >= 0x7f)
            return dp_fail(d, DP_EINVAL,
                           "--advertise has a space, control or non-ASCII character at "
                           "byte %zu: give an IPv4 address, [IPv6] or a host name",
                           i);
    }
    if (n > DP_CLUSTER_ADDR_MAX - sizeof "tcp://:65535")
        return dp_fail(d, DP_EINVAL,
                       "--advertise '%.40s...' is too long (at most %zu bytes)", h,
                       DP_CLUSTER_ADDR_MAX - sizeof "tcp://:65535");
    if (h[0] == '[') {
        char in[64];
        struct in6_addr a6;
        if (n < 3 || h[n - 1] != ']' || n - 2 >= sizeof in)
            return dp_fail(d, DP_EINVAL,
                           "--advertise '%s' is not a bracketed IPv6 address like "
                           "[fe80::1]",
                           h);
        memcpy(in, h + 1, n - 2);
        in[n - 2] = '\0';
        if (inet_pton(AF_INET6, in, &a6) != 1)
            return dp_fail(d, DP_EINVAL, "--advertise '%s' is not an IPv6 address", h);
        if (IN6_IS_ADDR_UNSPECIFIED(&a6))
            return dp_fail(
                d, DP_EINVAL,
                "--advertise '%s' is the wildcard address, which no client can "
                "reach: give this host's address",
                h);
        return DP_OK;
    }
    if (strchr(h, ':') != NULL)
        return dp_fail(d, DP_EINVAL,
                       "--advertise '%s': an IPv6 address goes in brackets, e.g. [%s]; "
                       "the port is always the bound one",
                       h, h);
    if (strspn(h, "0123456789.") == n) {
        struct in_addr a4;
        if (inet_pton(AF_INET, h, &a4) != 1)
            return dp_fail(d, DP_EINVAL,
                           "--advertise '%s' is not a dotted IPv4 address like 10.0.0.5",
                           h);
        if (a4.s_addr == htonl(INADDR_ANY))
            return dp_fail(
                d, DP_EINVAL,
                "--advertise '%s' is the wildcard address, which no client can "
                "reach: give this host's address",
                h);
        return DP_OK;
    }
    /* A host name: labels of letters, digits, '-' and '_', joined by dots. */
    if (strspn(h, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_.") !=
            n ||
        h[0] == '.' || h[0] == '-' || h[n - 1] == '-' || strstr(h, "..") != NULL)
        return dp_fail(
            d, DP_EINVAL,
            "--advertise '%s' is not an IPv4 address, a bracketed IPv6 address "
            "or a host name (letters, digits, '-', '_' and dots)",
            h);
    return DP_OK;
}

void
dp__cli_guard_stdout(void)
{
#ifdef __GLIBC__
    /*
     * glibc lets a program assign stdout. UCX keeps the FILE it saw (the
     * original stdout, now writing to descriptor 1, which is stderr); what
     * this program prints goes through the new stream.
     */
    if (fcntl(STDERR_FILENO, F_GETFD) < 0)
        return;
    int fd = fcntl(STDOUT_FILENO, F_DUPFD_CLOEXEC, 3);
    if (fd < 0)
        return;
    FILE *out = fdopen(fd, "w");
    if (out == NULL) {
        close(fd);
        return;
    }
    fflush(stdout);
    if (dup2(STDERR_FILENO, STDOUT_FILENO) < 0) {
        fclose(out);
        return;
    }
    stdout = out;
#endif
}
