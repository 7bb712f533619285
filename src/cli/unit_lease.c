/*
 * A unit's lease thread (docs/design.md, "Leases"): with --lease S, every S / 4
 * it asks every other unit of its cluster (found as its repair finds it:
 * --repair-from, or its registry) for a read lease, at once, and hands each
 * answer to the unit, which counts its grants. It holds only the units'
 * addresses and a control transport (no data path, nothing asked before its
 * first round), so it asks from the moment the unit starts: a fault that
 * begins then costs the unit no lease it could have had. A unit that does not answer is
 * probed, to tell a gone process (refuses connections) from one that is
 * silent. A denial says this unit is behind: its repair thread runs a pass.
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "client/client_int.h"
#include "client/fanout.h"
#include "unit/unit.h"

struct dp__unit_leaser {
    pthread_t th;
    dp__unit *u;
    char (*addr)[DP_CLUSTER_ADDR_MAX]; /* the units' addresses, as last seen */
    char *from;
    uint32_t unit_id;
    double lease_s;
    int stop; /* atomic */
};

static bool
stopping(const dp__unit_leaser *l)
{
    return __atomic_load_n(&l->stop, __ATOMIC_RELAXED) != 0;
}

/* Sleep s seconds in steps, so that a stop is seen. */
static void
nap(const dp__unit_leaser *l, double s)
{
    double end = dp__now_s() + s;
    while (!stopping(l) && dp__now_s() < end)
        dp__sleep_s(DP_MIN(0.05, end - dp__now_s()));
}

/*
 * One round: every other unit asked at once, each answer handed to the unit.
 * Straight to their addresses, whatever process answers there (no binding: a
 * silent unit costs this round its timeout once, not twice), through the
 * control-only client's transport; nothing but this thread uses the client.
 */
static void
round_once(dp__unit_leaser *l, dp_client *c, dp__wire_rid_gen *g, dp__fanout *f,
           double timeout_s)
{
    uint32_t n = dp_client_n_units(c);
    dp__fanout_reset(f);
    /* A registry may move units: where its records say they are now. */
    pthread_mutex_lock(&c->mu);
    dp__client_follow_locked(c);
    for (uint32_t i = 0; i < n; i++)
        snprintf(l->addr[i], sizeof l->addr[i], "%s", c->units[i].addr);
    pthread_mutex_unlock(&c->mu);
    double sent_at = dp__now_s(); /* the unit's clock (its default) */
    for (uint32_t i = 0; i < n; i++) {
        if (i == l->unit_id)
            continue;
        dp__wire_request q;
        memset(&q, 0, sizeof q);
        q.op = DP_WIRE_OP_LEASE;
        q.a.lease = (dp__wire_lease_args){l->unit_id, dp__unit_lease_done(l->u, i)};
        dp__fanout_add(f, g, i, l->addr[i], 0, &q);
    }
    dp__fanout_run(f, c->ctl, timeout_s, NULL);
    for (uint32_t i = 0; i < n; i++) {
        const dp__fanout_unit *r = &f->u[i];
        if (i == l->unit_id || r->op == DP_WIRE_OP_NONE)
            continue;
        if (r->st.rc == DP_OK && r->decoded) {
            dp__unit_lease_answer(l->u, i, sent_at, &r->rep.r.lease);
            continue;
        }
        bool gone = dp__ctl_peer_gone(l->addr[i]);
        dp__unit_lease_unanswered(l->u, i, gone);
        DP_LOG_D("lease: unit %u (%s) %s: %s", i, l->addr[i],
                 gone ? "is gone" : "did not grant", dp_detail_msg(&r->st.det));
    }
}

static void *
lease_main(void *arg)
{
    dp__unit_leaser *l = arg;
    dp_client_opts co;
    dp_client_opts_init(&co);
    /* Each round well within a lease: a silent unit costs at most half of it. */
    co.timeout_s = DP_MAX(0.1, l->lease_s / 2);
    co.connect_timeout_s = co.timeout_s;
    dp_client *c = NULL;
    dp_detail d;
    dp_detail_clear(&d);
    double warned = 0;
    while (!stopping(l) && dp__cli_open_cluster(l->from, &co, true, &c, &d) != DP_OK) {
        if (dp__now_s() - warned > 30) {
            DP_LOG_W(
                "lease: cannot open the cluster %s yet (%s): answering no read until "
                "most units grant a lease",
                l->from, dp_detail_msg(&d));
            warned = dp__now_s();
        }
        nap(l, DP_MIN(1.0, l->lease_s / 4));
    }
    if (c != NULL)
        DP_LOG_I("lease: asking %u units for read leases of %.1f s every %.2f s",
                 dp_client_n_units(c) - 1, l->lease_s, l->lease_s / 4);
    dp__fanout f = {0};
    dp__wire_rid_gen g;
    if (c != NULL && (l->addr = calloc(dp_client_n_units(c), sizeof *l->addr)) == NULL)
        dp__fail(&d, DP_ENOMEM, "out of memory");
    if (c != NULL && (l->addr == NULL || dp__wire_rid_gen_init(&g, &d) != DP_OK ||
                      dp__fanout_init(&f, dp_client_n_units(c), &d) != DP_OK)) {
        DP_LOG_E("lease: %s: answering no read", dp_detail_msg(&d));
        dp_client_close(c);
        c = NULL;
    }
    bool had = true; /* said so at the last change */
    while (c != NULL && !stopping(l)) {
        double t0 = dp__now_s();
        /* A round within a quarter lease: a grant counts for 0.9 of one. */
        round_once(l, c, &g, &f, l->lease_s / 4);
        char why[512];
        bool ok = dp__unit_lease_state(l->u, why, sizeof why);
        if (ok != had) {
            if (ok)
                DP_LOG_I("lease: most units grant this unit a read lease: it answers "
                         "reads again");
            else
                DP_LOG_W("lease: fewer than half of the other units grant this unit a "
                         "read lease (%s): it answers no read until they do",
                         why);
            had = ok;
        }
        nap(l, l->lease_s / 4 - (dp__now_s() - t0));
    }
    dp__fanout_fini(&f);
    dp_client_close(c);
    return NULL;
}

int
dp__unit_lease_start(dp__unit *u, uint32_t unit_id, const char *from, double lease_s,
                     dp__unit_leaser **out, dp_detail *d)
{
    *out = NULL;
    dp__unit_leaser *l = calloc(1, sizeof *l);
    if (l == NULL || (l->from = strdup(from)) == NULL) {
        free(l);
        return dp__fail(d, DP_ENOMEM, "lease: out of memory");
    }
    l->u = u;
    l->unit_id = unit_id;
    l->lease_s = lease_s;
    int e = pthread_create(&l->th, NULL, lease_main, l);
    if (e != 0) {
        free(l->from);
        free(l);
        return dp__fail(d, DP_ESYS, "lease: cannot start its thread (errno %d)", e);
    }
    *out = l;
    return DP_OK;
}

void
dp__unit_lease_stop(dp__unit_leaser *l)
{
    if (l == NULL)
        return;
    __atomic_store_n(&l->stop, 1, __ATOMIC_RELAXED);
    pthread_join(l->th, NULL);
    free(l->addr);
    free(l->from);
    free(l);
}
