/*
 * Binding a client to its units (docs/design.md, "Unit incarnations"): each
 * unit's address and CURVE key, asking who it is (info), binding the data
 * path to the incarnation that answered, re-binding after a restart or a
 * suspect connection, following a registry's records, and the aborts a
 * client owes a unit (sent again when it next answers).
 */
#include "client/client_int.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- aborts and notifications ---- */

void
dp__client_notify_locked(dp_client *c, uint32_t u, dp__wire_request *q)
{
    char rid[DP_WIRE_RID_MAX];
    q->rid = dp__wire_rid_next(&c->rids, rid);
    dp__buf b = {0};
    dp_detail d;
    dp_detail_clear(&d);
    int rc = dp__wire_request_encode(q, NULL, &b, &d);
    if (rc == 0)
        rc = dp__ctl_notify(c->ctl, c->units[u].addr, b.data, b.len, &d);
    if (rc != 0)
        DP_LOG_W("client: %s to unit %u (%s) not sent: %s", dp__wire_op_name(q->op), u,
                 c->units[u].addr, dp_detail_msg(&d));
    dp__buf_fini(&b);
}

static void
send_abort(dp_client *c, uint32_t u, const char *blob_id, bool in_flight)
{
    dp__wire_request q;
    memset(&q, 0, sizeof q);
    q.op = DP_WIRE_OP_ABORT;
    q.a.abort.blob_id = dp__wire_s(blob_id);
    q.a.abort.in_flight = in_flight;
    dp__client_notify_locked(c, u, &q);
}

void
dp__client_abort_locked(dp_client *c, uint32_t u, const char *blob_id, bool in_flight)
{
    dp__unit_conn *uc = &c->units[u];
    send_abort(c, u, blob_id, in_flight);
    uint32_t cap = (uint32_t)DP_ARRAY_LEN(uc->aborts);
    if (uc->n_aborts == cap) { /* the oldest goes: its lease covers it */
        memmove(uc->aborts, uc->aborts + 1, (cap - 1) * sizeof uc->aborts[0]);
        uc->n_aborts--;
    }
    snprintf(uc->aborts[uc->n_aborts].id, sizeof uc->aborts[0].id, "%s", blob_id);
    uc->aborts[uc->n_aborts++].in_flight = in_flight;
}

/*
 * Unit u answered: the aborts sent to it since it last did go out once more
 * (to the same process only: another one never heard of those blobs).
 */
static void
aborts_again_locked(dp_client *c, uint32_t u, bool same_process)
{
    dp__unit_conn *uc = &c->units[u];
    uint32_t n = uc->n_aborts;
    uc->n_aborts = 0;
    for (uint32_t i = 0; same_process && i < n; i++)
        send_abort(c, u, uc->aborts[i].id, uc->aborts[i].in_flight);
}

/* ---- binding ---- */

int
dp__client_set_server_keys(dp_client *c, const dp__cluster_unit *cu, uint32_t n,
                           dp_detail *d)
{
    int rc = 0;
    for (uint32_t u = 0; cu != NULL && rc == 0 && u < n; u++)
        if (cu[u].pubkey[0] != '\0')
            rc = dp__ctl_client_server_key(c->ctl, c->units[u].addr, cu[u].pubkey, d);
    return rc;
}

int
dp__client_set_addr(dp_client *c, uint32_t u, const char *a, dp_detail *d)
{
    if (a == NULL || strlen(a) >= DP_CLUSTER_ADDR_MAX || strncmp(a, "tcp://", 6) != 0)
        return dp__fail(d, DP_EINVAL, "unit %u: bad control address '%s'", u,
                        a ? a : "(null)");
    snprintf(c->units[u].addr, sizeof c->units[u].addr, "%s", a);
    return DP_OK;
}

int
dp__client_take_replicas_locked(dp_client *c, uint32_t u, const dp__wire_info *in,
                                dp_detail *d)
{
    uint64_t r = in->replicas > 0 ? in->replicas : 1;
    if (r > 3 || r > c->n_units)
        return dp__fail(d, DP_EPROTO,
                        "says the cluster keeps %" PRIu64
                        " copies of each row, more than "
                        "3 or its %u units",
                        r, c->n_units);
    if (c->replicas != 0 && c->replicas != r)
        return dp__fail(d, DP_EPROTO,
                        "says the cluster keeps %" PRIu64
                        " copies of each row, but the cluster file or the units asked "
                        "before say %u: start every unit of a cluster with the same "
                        "--replicas",
                        r, c->replicas);
    if (c->replicas == 0 && r > 1)
        DP_LOG_I("client: unit %u says the cluster keeps %" PRIu64 " copies of each row",
                 u, r);
    c->replicas = (uint32_t)r;
    c->leases = c->leases || in->lease_ms > 0;
    return DP_OK;
}

/*
 * Bind unit u's data path to the process whose info this is (the fanout
 * checked that it is unit u of this cluster): check that it speaks this
 * protocol, connect the transfer endpoint to it (replacing the remote of an
 * earlier incarnation), and take its slab's place, sizes and incarnation.
 */
static int
bind_unit_locked(dp_client *c, uint32_t u, const dp__wire_info *in, dp_detail *d)
{
    dp__unit_conn *uc = &c->units[u];
    if (in->proto < DP_WIRE_PROTO || in->incarnation == 0)
        return dp__fail(
            d, DP_EPROTO,
            "speaks control protocol %" PRIu64
            " and this client %d: run the same dataplane version on units and "
            "clients",
            in->proto, DP_WIRE_PROTO);
    if (in->metadata.n == 0)
        return dp__fail(d, DP_EPROTO, "has no transfer endpoint (no metadata in info)");
    if (in->slab_addr == 0)
        return dp__fail(d, DP_EPROTO, "info carries no slab address");
    int rc = dp__client_take_replicas_locked(c, u, in, d);
    if (rc != DP_OK)
        return rc;
    char name[256];
    rc = dp__endpoint_add_remote(c->ep, in->metadata.p, in->metadata.n, name, d);
    if (rc != 0)
        return rc;
    for (uint32_t v = 0; v < c->n_units; v++)
        if (v != u && strcmp(c->units[v].remote, name) == 0)
            return dp__fail(d, DP_EPROTO,
                            "has the same endpoint name '%s' as unit %u: names must be "
                            "unique",
                            name, v);
    if (uc->remote[0] != '\0' && strcmp(uc->remote, name) != 0)
        dp__endpoint_remove_remote(c->ep, uc->remote, NULL); /* the old process's */
    snprintf(uc->remote, sizeof uc->remote, "%s", name);
    uc->slab_addr = in->slab_addr;
    uc->slab_bytes = in->slab_bytes;
    uc->io_bytes = in->io_bytes;
    uc->region_bytes = uc->slab_bytes + uc->io_bytes;
    uc->read_pin_s = in->read_pin_ms > 0 ? (double)in->read_pin_ms / 1e3 : 10.0;
    aborts_again_locked(c, u, uc->incarnation == in->incarnation);
    uint64_t was = uc->incarnation;
    uc->incarnation = in->incarnation;
    uc->stale = false;
    uc->ep_suspect = false;
    /* Connection setup over before any transfer (dp__endpoint_remote_connect). */
    rc = dp__endpoint_remote_connect(c->ep, name, c->o.connect_timeout_s, d);
    if (rc != 0) {
        /* Not bound: the next operation asks it again (a restart counted once). */
        uc->incarnation = was;
        uc->stale = true;
        uc->seen_incarnation = in->incarnation;
        return rc;
    }
    dp__endpoint_remote_route(c->ep, uc->remote, &uc->route, NULL);
    return DP_OK;
}

/*
 * A control-only client's unit u answered info (the fanout checked who it
 * is): keep its process and endpoint name, and record the check.
 */
static void
bind_ctl_locked(dp_client *c, uint32_t u, dp__fanout_unit *r)
{
    dp__unit_probe *k = &c->checks[u];
    const dp__wire_info *in = &r->rep.r.info;
    if (dp__wire_str_copy(in->agent, k->agent, sizeof k->agent) >= sizeof k->agent) {
        k->agent[0] = '\0';
        dp__fanout_fail(&c->fo, u, DP_EPROTO, " ",
                        "has an endpoint name of %u bytes (at most %zu)", in->agent.n,
                        sizeof k->agent - 1);
        return;
    }
    dp_detail e;
    dp_detail_clear(&e);
    if (dp__client_take_replicas_locked(c, u, in, &e) != DP_OK) {
        dp__fanout_fail(&c->fo, u, DP_EPROTO, " ", "%s", e.msg);
        return;
    }
    c->units[u].incarnation = in->incarnation;
    k->state = DP__UNIT_CHECKED;
}

/* The fanout's options for info: who answered must be unit u of this cluster. */
static dp__fanout_opts
info_opts(const dp_client *c)
{
    dp__fanout_opts o = c->words;
    o.flags |= DP__FANOUT_IDENTITY;
    o.n_units = c->n_units;
    o.cluster_id = c->cluster_id;
    return o;
}

int
dp__client_check_units_locked(dp_client *c, int64_t only, unsigned flags, dp_detail *d)
{
    dp__fanout *f = &c->fo;
    dp__fanout_reset(f);
    dp__wire_request q;
    memset(&q, 0, sizeof q);
    q.op = DP_WIRE_OP_INFO;
    for (uint32_t u = 0; u < c->n_units; u++)
        if (only < 0 || (int64_t)u == only)
            dp__fanout_add(f, &c->rids, u, c->units[u].addr, 0, &q);
    dp__fanout_opts o = info_opts(c);
    dp__fanout_run(f, c->ctl, c->o.connect_timeout_s, &o);
    int first = DP_OK;
    uint32_t asked = 0, n_down = 0, first_down = 0;
    for (uint32_t u = 0; u < c->n_units; u++) {
        dp__fanout_unit *r = &f->u[u];
        if (r->op == DP_WIRE_OP_NONE)
            continue;
        asked++;
        bool down = r->st.rc != DP_OK && !r->answered && (flags & DP__CTL_ALLOW_DOWN);
        if (down && n_down++ == 0)
            first_down = u;
        if (c->checks == NULL && down) {
            /* Left unbound: the first operation that needs it binds it. */
            dp__unit_conn *uc = &c->units[u];
            uc->stale = true;
            uc->incarnation = 0;
            c->cnt.units_down++;
        } else if (c->checks != NULL) {
            if (r->st.rc == DP_OK)
                bind_ctl_locked(c, u, r);
            dp__unit_probe *k = &c->checks[u];
            if (down) {
                k->state = DP__UNIT_DOWN;
                k->rc = r->st.rc;
                k->det = r->st.det;
                k->why = r->why;
            } else if (r->st.rc != DP_OK) {
                k->state = DP__UNIT_UNCHECKED;
            }
        } else if (r->st.rc == DP_OK && first == DP_OK) {
            dp_detail e;
            dp_detail_clear(&e);
            int rc = bind_unit_locked(c, u, &r->rep.r.info, &e);
            if (rc != DP_OK)
                dp__fanout_fail(f, u, rc, ": ", "%s", e.msg);
        }
        if (r->st.rc == DP_OK || down || first != DP_OK)
            continue;
        first = r->st.rc;
        if (c->checks != NULL) {
            if (d != NULL)
                *d = r->st.det;
        } else {
            dp__fail(d, r->st.rc, "connecting to unit %u (%s): %s", u, c->units[u].addr,
                     dp__fanout_why(r));
        }
    }
    if (first == DP_OK && c->checks == NULL && asked > 0 && n_down == asked) {
        /* No unit answers: a wrong file or no cluster, not an outage. */
        dp__fanout_unit *r = &f->u[first_down];
        first = r->st.rc;
        dp__fail(d, r->st.rc, "no unit answers; unit %u (%s): %s", first_down,
                 c->units[first_down].addr, dp__fanout_why(r));
    }
    for (uint32_t u = first_down;
         first == DP_OK && c->checks == NULL && n_down > 0 && u < c->n_units; u++)
        if (f->u[u].op != DP_WIRE_OP_NONE && f->u[u].st.rc != DP_OK)
            DP_LOG_W("client: unit %u (%s) is down: %s; its rows fail until it answers, "
                     "and the first put or get after that connects to it",
                     u, c->units[u].addr, dp__fanout_why(&f->u[u]));
    dp__fanout_reset(f);
    return first;
}

int
dp__client_reply_check_locked(dp_client *c, uint32_t u, const dp__wire_reply *rep,
                              bool report, dp_detail *d)
{
    dp__unit_conn *uc = &c->units[u];
    bool other = dp__fanout_other_process(uc->incarnation, rep->incarnation);
    aborts_again_locked(c, u, !other);
    if (!other)
        return DP_OK;
    if (!uc->stale || uc->seen_incarnation != rep->incarnation) {
        c->cnt.restarts_seen++;
        DP_LOG_W("client: unit %u (%s) restarted: incarnation %016" PRIx64
                 " answers, the data path is bound to %016" PRIx64 "; re-binding",
                 u, uc->addr, rep->incarnation, uc->incarnation);
        uc->restart_unreported = true;
    }
    uc->stale = true;
    uc->seen_incarnation = rep->incarnation;
    if (!report)
        return DP_OK;
    uc->restart_unreported = false;
    return dp__fail(d, DP_ERESTARTED,
                    "unit %u (%s) restarted (incarnation %016" PRIx64 " -> %016" PRIx64
                    "): what it held is gone unless it loaded a checkpoint; this client "
                    "re-binds to it and the next operation uses the new process",
                    u, uc->addr, uc->incarnation, rep->incarnation);
}

/*
 * Re-bind unit u after the fanout's info (r): the restart bookkeeping, the
 * new binding, and a restart reported once. Returns the unit's code for the
 * operation, its detail into det.
 */
static int
rebind_locked(dp_client *c, uint32_t u, const dp__fanout_unit *r, dp_detail *det)
{
    dp__unit_conn *uc = &c->units[u];
    int rc = r->st.rc;
    if (rc == DP_ETRANSFER || rc == DP_ETIMEDOUT) {
        c->cnt.units_down++;
        return dp__fail(det, rc, "unit %u (%s) is down: %s", u, uc->addr,
                        dp__fanout_why(r));
    }
    if (rc != DP_OK)
        return dp__fail(det, rc, "%s", dp__fanout_why(r));
    uint64_t was = uc->incarnation; /* 0: down when the client opened */
    uint64_t now_inc = r->rep.r.info.incarnation;
    bool restarted = was != 0 && now_inc != was, stalled = uc->ep_suspect;
    if (restarted && (!uc->stale || uc->seen_incarnation != now_inc)) {
        c->cnt.restarts_seen++;
        uc->restart_unreported = true;
    }
    rc = bind_unit_locked(c, u, &r->rep.r.info, det);
    if (rc != DP_OK)
        return rc;
    if (was != 0)
        c->cnt.rebinds++;
    DP_LOG_I("client: unit %u (%s) %s incarnation %016" PRIx64 " (%s)", u, uc->addr,
             was != 0 ? "re-bound to" : "bound to", now_inc,
             was == 0    ? "it was down when the client opened"
             : restarted ? "it restarted"
             : stalled   ? "its transfers stalled"
                         : "its transfer endpoint failed");
    if (!uc->restart_unreported)
        return DP_OK;
    uc->restart_unreported = false;
    return dp__fail(
        det, DP_ERESTARTED,
        "unit %u (%s) restarted (incarnation %016" PRIx64 " -> %016" PRIx64
        "): what it held is gone unless it loaded a checkpoint; re-bound, the "
        "next operation uses it",
        u, uc->addr, was, now_inc);
}

void
dp__client_follow_locked(dp_client *c)
{
    if (c->reg == NULL)
        return;
    uint64_t gen = dp__reg_watch_gen(c->reg);
    if (gen == c->reg_gen)
        return;
    c->reg_gen = gen;
    for (uint32_t u = 0; u < c->n_units; u++) {
        dp__unit_conn *uc = &c->units[u];
        dp__reg_record r;
        if (!dp__reg_watch_get(c->reg, u, &r))
            continue; /* down (or not back yet): keep what is known */
        bool moved = strcmp(r.zmq, uc->addr) != 0;
        /* A unit that came back (or moved) may have a new key. */
        dp__ctl_client_server_key(c->ctl, r.zmq, r.pubkey, NULL);
        bool other = c->ep != NULL && r.incarnation != uc->incarnation && !uc->stale;
        if (!moved && !other)
            continue;
        DP_LOG_W("client: the registry says unit %u is incarnation %016" PRIx64 " at %s "
                 "(bound to %016" PRIx64 " at %s); re-binding",
                 u, r.incarnation, r.zmq, uc->incarnation, uc->addr);
        if (moved) {
            char old[sizeof uc->addr];
            snprintf(old, sizeof old, "%s", uc->addr);
            snprintf(uc->addr, sizeof uc->addr, "%s", r.zmq);
            /* No unit there any more: its idle sockets would reconnect for ever. */
            bool used = false;
            for (uint32_t v = 0; v < c->n_units && !used; v++)
                used = strcmp(c->units[v].addr, old) == 0;
            if (!used)
                dp__ctl_client_forget(c->ctl, old);
        }
        /*
         * Only a re-bind: whether the unit restarted (and which incarnation
         * it is) is what its info answers, not what a record, maybe stale,
         * says (rebind_locked counts and reports it).
         */
        if (c->ep != NULL)
            uc->stale = true;
    }
}

void
dp__client_ready_locked(dp_client *c, const uint32_t *units, size_t n, double deadline,
                        int *rcs, dp_detail *dets)
{
    dp__client_follow_locked(c);
    dp__fanout *f = &c->fo;
    dp__fanout_reset(f);
    dp__wire_request q;
    memset(&q, 0, sizeof q);
    q.op = DP_WIRE_OP_INFO;
    for (size_t i = 0; i < n; i++) {
        rcs[i] = 0;
        dp_detail_clear(&dets[i]);
        dp__unit_conn *uc = &c->units[units[i]];
        if (f->u[units[i]].op != DP_WIRE_OP_NONE)
            continue; /* named twice: asked once */
        bool failed =
            !uc->stale &&
            (uc->ep_suspect || dp__endpoint_remote_check(c->ep, uc->remote, NULL) != 0);
        if (uc->stale || failed)
            dp__fanout_add(f, &c->rids, units[i], uc->addr, 0, &q);
    }
    if (f->n_slots == 0 && dp__fanout_failed(f) == 0)
        return;
    dp__fanout_opts o = info_opts(c);
    dp__fanout_run(f, c->ctl, dp__client_round_timeout(deadline), &o);
    for (size_t i = 0; i < n; i++) {
        bool first = f->u[units[i]].op != DP_WIRE_OP_NONE;
        for (size_t j = 0; j < i && first; j++)
            first = units[j] != units[i];
        if (first)
            rcs[i] = rebind_locked(c, units[i], &f->u[units[i]], &dets[i]);
    }
    /* Units named twice get the same answer. */
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < i; j++)
            if (units[j] == units[i] && rcs[j] != 0 && rcs[i] == 0) {
                rcs[i] = rcs[j];
                dets[i] = dets[j];
            }
    dp__fanout_reset(f);
}

int
dp__client_bind_unbound_locked(dp_client *c, dp__fanout_req_fn q_of, void *ctx,
                               double deadline, int **rcs, dp_detail **dets, dp_detail *d)
{
    *rcs = NULL;
    *dets = NULL;
    uint32_t *us = NULL, n = 0;
    for (uint32_t u = 0; c->checks == NULL && u < c->n_units; u++) {
        dp__wire_request q;
        memset(&q, 0, sizeof q);
        if (c->units[u].incarnation != 0 || (q_of != NULL && !q_of(u, &q, ctx)))
            continue;
        if (us == NULL && (us = malloc(c->n_units * sizeof *us)) == NULL)
            return dp__fail(d, DP_ENOMEM, "client: out of memory");
        us[n++] = u;
    }
    if (n == 0)
        return DP_OK;
    int *r = calloc(c->n_units, sizeof *r), *rk = malloc(n * sizeof *rk);
    dp_detail *e = calloc(c->n_units, sizeof *e), *ek = malloc(n * sizeof *ek);
    int rc = DP_OK;
    if (r == NULL || rk == NULL || e == NULL || ek == NULL) {
        rc = dp__fail(d, DP_ENOMEM, "client: out of memory");
        free(r);
        free(e);
    } else {
        dp__client_ready_locked(c, us, n, deadline, rk, ek);
        for (uint32_t k = 0; k < n; k++) {
            r[us[k]] = rk[k];
            e[us[k]] = ek[k];
        }
        *rcs = r;
        *dets = e;
    }
    free(us);
    free(rk);
    free(ek);
    return rc;
}

int
dp__client_bind_all(dp_client *c, dp_detail *d)
{
    if (c == NULL)
        return dp__fail(d, DP_EINVAL, "dp__client_bind_all: NULL client");
    pthread_mutex_lock(&c->mu);
    int *rcs;
    dp_detail *dets;
    int rc = dp__client_bind_unbound_locked(
        c, NULL, NULL, dp__now_s() + c->o.connect_timeout_s, &rcs, &dets, d);
    for (uint32_t u = 0; rc == DP_OK && rcs != NULL && u < c->n_units; u++)
        if (rcs[u] != 0) {
            rc = rcs[u];
            if (d != NULL)
                *d = dets[u];
        }
    pthread_mutex_unlock(&c->mu);
    free(rcs);
    free(dets);
    return rc;
}
