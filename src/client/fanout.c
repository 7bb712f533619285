/*
 * One request per unit (see fanout.h): encoding each unit's request into
 * per-unit scratch, sending a batch at once under one deadline, decoding each
 * reply for its op into a report per unit, and the checks of who answered
 * (unit identity in info replies, the answering process's incarnation). Also
 * the grouping of rows by unit that put, get and clear share.
 *
 * Design notes
 * - A unit's report is one dp_detail that names the unit first ("unit 3
 *   (tcp://...)") and then the cause; why is the offset of the cause, so a
 *   caller that words the unit itself ("rows of unit 3 (...) not cleared:
 *   ...") takes only the cause and no message says the unit twice.
 * - Reply bytes stay in the slot's dp__ctl_item and the decoded reply points
 *   into them: both live until dp__fanout_reset or _fini. A unit is asked at
 *   most once per batch, so a slot's request buffer is never rewritten while
 *   the slot is in flight.
 */
#include "client/fanout.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- scratch ---- */

int
dp__fanout_init(dp__fanout *f, uint32_t n, dp_detail *d)
{
    memset(f, 0, sizeof *f);
    if (n == 0)
        return dp__fail(d, DP_EINVAL, "fanout: no units");
    f->u = calloc(n, sizeof *f->u);
    f->items = calloc(n, sizeof *f->items);
    f->slot_unit = calloc(n, sizeof *f->slot_unit);
    if (f->u == NULL || f->items == NULL || f->slot_unit == NULL) {
        dp__fanout_fini(f);
        return dp__fail(d, DP_ENOMEM, "fanout: out of memory for %u units", n);
    }
    f->n = n;
    for (uint32_t u = 0; u < n; u++) {
        f->u[u].op = DP_WIRE_OP_NONE;
        f->u[u].st.u = u;
    }
    return DP_OK;
}

void
dp__fanout_fini(dp__fanout *f)
{
    if (f == NULL)
        return;
    if (f->u != NULL)
        dp__fanout_reset(f);
    for (uint32_t u = 0; u < f->n; u++) {
        if (f->u != NULL)
            dp__buf_fini(&f->u[u].req);
        if (f->items != NULL)
            dp__buf_fini(&f->items[u].reply);
    }
    free(f->u);
    free(f->items);
    free(f->slot_unit);
    memset(f, 0, sizeof *f);
}

/* Unit u's outcome emptied (its request buffer is kept). */
static void
outcome_clear(dp__fanout_unit *r)
{
    if (r->decoded)
        dp__wire_reply_fini(&r->rep);
    memset(&r->rep, 0, sizeof r->rep);
    r->rep.op = DP_WIRE_OP_NONE;
    r->st.rc = DP_OK;
    dp_detail_clear(&r->st.det);
    r->why = 0;
    r->answered = r->restarted = r->misplaced = r->decoded = false;
}

void
dp__fanout_reset(dp__fanout *f)
{
    for (uint32_t u = 0; u < f->n; u++) {
        dp__fanout_unit *r = &f->u[u];
        outcome_clear(r);
        r->op = DP_WIRE_OP_NONE;
        r->addr = NULL;
        r->incarnation = 0;
    }
    f->n_slots = 0;
}

/* ---- reports ---- */

static int
vfail(dp__fanout_unit *r, uint32_t u, int rc, const char *sep, const char *fmt,
      va_list ap)
{
    char why[DP_DETAIL_MAX];
    vsnprintf(why, sizeof why, fmt, ap);
    int n = snprintf(r->st.det.msg, sizeof r->st.det.msg, "unit %u (%s)%s", u,
                     r->addr != NULL ? r->addr : "?", sep);
    r->why =
        n > 0 && (size_t)n < sizeof r->st.det.msg ? (size_t)n : sizeof r->st.det.msg - 1;
    size_t room = sizeof r->st.det.msg - 1 - r->why, len = strnlen(why, room);
    memcpy(r->st.det.msg + r->why, why, len);
    r->st.det.msg[r->why + len] = '\0';
    r->st.det.code = rc;
    r->st.det.sys_errno = 0;
    r->st.rc = rc;
    return rc;
}

int
dp__step_vfail(dp__step *s, int rc, const char *fmt, va_list ap)
{
    dp__vfail(&s->det, rc, fmt, ap);
    s->rc = rc;
    return rc;
}

int
dp__step_fail(dp__step *s, int rc, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    dp__step_vfail(s, rc, fmt, ap);
    va_end(ap);
    return rc;
}

int
dp__fanout_fail(dp__fanout *f, uint32_t u, int rc, const char *sep, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vfail(&f->u[u], u, rc, sep, fmt, ap);
    va_end(ap);
    return rc;
}

const char *
dp__fanout_why(const dp__fanout_unit *r)
{
    return r->st.det.msg + r->why;
}

int
dp__fanout_first(const dp__fanout *f, dp_detail *d)
{
    for (uint32_t u = 0; u < f->n; u++) {
        const dp__fanout_unit *r = &f->u[u];
        if (r->op == DP_WIRE_OP_NONE || r->st.rc == DP_OK)
            continue;
        if (d != NULL)
            *d = r->st.det;
        return r->st.rc;
    }
    return DP_OK;
}

uint32_t
dp__fanout_failed(const dp__fanout *f)
{
    uint32_t n = 0;
    for (uint32_t u = 0; u < f->n; u++)
        n += f->u[u].op != DP_WIRE_OP_NONE && f->u[u].st.rc != DP_OK;
    return n;
}

/* ---- requests ---- */

int
dp__fanout_place(dp__fanout *f, dp__wire_rid_gen *rids, size_t slot, uint32_t u,
                 const char *addr, dp__wire_request *q, dp_detail *d)
{
    DP_ASSERT(u < f->n && slot < f->n);
    dp__fanout_unit *r = &f->u[u];
    r->addr = addr;
    r->op = q->op;
    q->rid = dp__wire_rid_next(rids, r->rid);
    dp__buf_reset(&r->req);
    int rc = dp__wire_request_encode(q, NULL, &r->req, d);
    if (rc != 0)
        return dp__fail_ctx(d, rc, "unit %u (%s): %s request", u, addr,
                            dp__wire_op_name(q->op));
    dp__ctl_item *it = &f->items[slot];
    dp__buf_reset(&it->reply);
    it->address = addr;
    it->req = r->req.data;
    it->len = r->req.len;
    it->rid = r->rid;
    it->repeat = dp__wire_op_repeatable(q->op);
    it->rc = 0;
    dp_detail_clear(&it->det);
    f->slot_unit[slot] = u;
    return DP_OK;
}

int
dp__fanout_add(dp__fanout *f, dp__wire_rid_gen *rids, uint32_t u, const char *addr,
               uint64_t incarnation, dp__wire_request *q)
{
    DP_ASSERT(u < f->n);
    dp__fanout_unit *r = &f->u[u];
    if (r->op != DP_WIRE_OP_NONE)
        return DP_EINVAL; /* asked already: that request's outcome stands */
    outcome_clear(r);
    r->incarnation = incarnation;
    dp_detail e;
    dp_detail_clear(&e);
    int rc = dp__fanout_place(f, rids, f->n_slots, u, addr, q, &e);
    if (rc != 0)
        return dp__fanout_fail(f, u, rc, ": ", "encoding the %s request: %s",
                               dp__wire_op_name(q->op), e.msg);
    f->n_slots++;
    return DP_OK;
}

/* ---- replies ---- */

bool
dp__fanout_req_op(uint32_t u, dp__wire_request *q, void *ctx)
{
    DP_UNUSED(u);
    q->op = *(const dp__wire_op *)ctx;
    return true;
}

int
dp__fanout_reply(const dp__ctl_item *it, dp__wire_op op, dp__wire_reply *rep,
                 dp_detail *d)
{
    memset(rep, 0, sizeof *rep);
    rep->op = DP_WIRE_OP_NONE;
    if (it->rc != 0) {
        if (d != NULL)
            *d = it->det;
        return it->rc;
    }
    return dp__wire_reply_decode(it->reply.data, it->reply.len, op, NULL, rep, d);
}

/* An info reply from unit u must say it is unit u of the cluster's n. */
static void
check_identity(dp__fanout *f, uint32_t u, const dp__fanout_opts *o)
{
    dp__fanout_unit *r = &f->u[u];
    const dp__wire_info *in = &r->rep.r.info;
    uint32_t n = o->n_units > 0 ? o->n_units : f->n;
    if (in->unit_id == u && in->n_units == n &&
        (o->cluster_id == NULL || o->cluster_id[0] == '\0' ||
         dp__wire_str_eq(in->cluster, o->cluster_id)))
        return;
    if (in->unit_id == u && in->n_units == n) {
        char got[72];
        dp__wire_str_copy(in->cluster, got, sizeof got);
        r->misplaced = true;
        dp__fanout_fail(f, u, DP_EPROTO, " ",
                        "belongs to cluster '%s', but %s names cluster '%s' (a unit "
                        "from another cluster)%s",
                        got[0] ? got : "(none)",
                        o->listed_by ? o->listed_by : "the cluster", o->cluster_id,
                        o->misplaced_hint ? o->misplaced_hint : "");
        return;
    }
    r->misplaced = true;
    dp__fanout_fail(f, u, DP_EPROTO, " ",
                    "says it is unit %" PRIu64 " of %" PRIu64
                    ", but %s lists it as unit %u of %u (wrong order or a unit from "
                    "another cluster)%s",
                    in->unit_id, in->n_units, o->listed_by ? o->listed_by : "the cluster",
                    u, n, o->misplaced_hint ? o->misplaced_hint : "");
}

/* Unit u's outcome from its slot's item. */
static void
judge(dp__fanout *f, uint32_t u, const dp__ctl_item *it, double timeout_s,
      const dp__fanout_opts *o)
{
    dp__fanout_unit *r = &f->u[u];
    const char *opname = dp__wire_op_name(r->op);
    if (it->rc == DP_ETIMEDOUT) {
        dp__fanout_fail(f, u, DP_ETIMEDOUT, " ", "did not answer %s within %g s%s",
                        opname, timeout_s, o->silence_hint ? o->silence_hint : "");
        return;
    }
    if (it->rc != 0) {
        dp__fanout_fail(f, u, it->rc, ": ", "%s", it->det.msg);
        return;
    }
    r->answered = true;
    dp_detail e;
    dp_detail_clear(&e);
    int rc = dp__fanout_reply(it, r->op, &r->rep, &e);
    r->decoded = true;
    if (rc != 0) {
        dp__fanout_fail(f, u, rc, ": ", "%s", e.msg);
        return;
    }
    r->restarted = dp__fanout_other_process(r->incarnation, r->rep.incarnation);
    if (r->restarted && (o->flags & DP__FANOUT_SAME_PROCESS)) {
        dp__fanout_fail(f, u, DP_ERESTARTED, " ",
                        "restarted (incarnation %016" PRIx64 " -> %016" PRIx64
                        "): what it held is gone unless it loaded a checkpoint",
                        r->incarnation, r->rep.incarnation);
        return;
    }
    if (!r->rep.ok) {
        rc = dp__wire_error_to_detail(&r->rep.err, &e);
        dp__fanout_fail(f, u, rc, ": ", "%s", e.msg);
        return;
    }
    if ((o->flags & DP__FANOUT_IDENTITY) && r->op == DP_WIRE_OP_INFO)
        check_identity(f, u, o);
}

int
dp__fanout_run(dp__fanout *f, dp__ctl_client *ctl, double timeout_s,
               const dp__fanout_opts *o)
{
    static const dp__fanout_opts none;
    if (o == NULL)
        o = &none;
    if (f->n_slots > 0)
        dp__ctl_call_many(ctl, f->items, f->n_slots, timeout_s);
    for (uint32_t k = 0; k < f->n_slots; k++)
        judge(f, f->slot_unit[k], &f->items[k], timeout_s, o);
    return dp__fanout_first(f, NULL);
}

/* ---- rows grouped by unit ---- */

int
dp__groups_make(dp__groups *g, uint32_t n_units, const uint64_t *gidxs, size_t n,
                dp_detail *d)
{
    return dp__groups_make_copies(g, n_units, gidxs, n, 0, 1, d);
}

int
dp__groups_make_copies(dp__groups *g, uint32_t n_units, const uint64_t *gidxs, size_t n,
                       uint32_t shift, uint32_t copies, dp_detail *d)
{
    memset(g, 0, sizeof *g);
    DP_ASSERT(n_units > 0 && copies >= 1 && copies <= n_units && shift < n_units &&
              n <= UINT32_MAX / copies);
    /* Each item's first unit, computed once (two divisions). */
    uint32_t *first = malloc((n > 0 ? n : 1) * sizeof *first);
    if (first == NULL)
        return dp__fail(d, DP_ENOMEM, "out of memory grouping %zu rows by unit", n);
    for (size_t i = 0; i < n; i++)
        first[i] = (uint32_t)((gidxs[i] % n_units + shift) % n_units);
    if (copies == 1) { /* the usual case */
        int rc = dp__groups_of_units(g, n_units, first, n, d);
        free(first);
        return rc;
    }
    size_t m = n * copies;
    g->start = calloc((size_t)n_units + 1, sizeof *g->start);
    g->order = malloc((m > 0 ? m : 1) * sizeof *g->order);
    uint32_t *pos = malloc(n_units * sizeof *pos);
    if (g->start == NULL || g->order == NULL || pos == NULL) {
        free(pos);
        free(first);
        dp__groups_fini(g);
        return dp__fail(d, DP_ENOMEM, "out of memory grouping %zu rows by unit", n);
    }
    g->n_units = n_units;
    /* Counting sort: counts, prefix sums, then each item at its units' next places. */
    for (size_t i = 0; i < n; i++) {
        uint32_t u = first[i];
        for (uint32_t k = 0; k < copies; k++, u = u + 1 == n_units ? 0 : u + 1)
            g->start[u + 1]++;
    }
    for (uint32_t u = 0; u < n_units; u++) {
        g->start[u + 1] += g->start[u];
        pos[u] = g->start[u]; /* u's next place */
    }
    for (size_t i = 0; i < n; i++) {
        uint32_t u = first[i];
        for (uint32_t k = 0; k < copies; k++, u = u + 1 == n_units ? 0 : u + 1)
            g->order[pos[u]++] = (uint32_t)i;
    }
    free(pos);
    free(first);
    return DP_OK;
}

int
dp__groups_of_units(dp__groups *g, uint32_t n_units, const uint32_t *units, size_t n,
                    dp_detail *d)
{
    memset(g, 0, sizeof *g);
    DP_ASSERT(n_units > 0 && n <= UINT32_MAX);
    g->start = calloc((size_t)n_units + 1, sizeof *g->start);
    g->order = malloc((n > 0 ? n : 1) * sizeof *g->order);
    uint32_t *pos = malloc(n_units * sizeof *pos);
    if (g->start == NULL || g->order == NULL || pos == NULL) {
        free(pos);
        dp__groups_fini(g);
        return dp__fail(d, DP_ENOMEM, "out of memory grouping %zu keys by unit", n);
    }
    g->n_units = n_units;
    for (size_t i = 0; i < n; i++)
        g->start[units[i] + 1]++;
    for (uint32_t u = 0; u < n_units; u++) {
        g->start[u + 1] += g->start[u];
        pos[u] = g->start[u];
    }
    for (size_t i = 0; i < n; i++)
        g->order[pos[units[i]]++] = (uint32_t)i;
    free(pos);
    return DP_OK;
}

void
dp__groups_fini(dp__groups *g)
{
    if (g == NULL)
        return;
    free(g->start);
    free(g->order);
    memset(g, 0, sizeof *g);
}
