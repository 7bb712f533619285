/*
 * Operations on every unit that move no data: clear (rows dropped on their
 * units) and stats (each unit's counters), as whole fanout batches.
 */
#include "client/client_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- asking every unit ---- */

/*
 * Whether a control-only client may send op to unit u: checked, or not at
 * all (a unit down gets its reason, one never asked who it is DP_EINVAL, as
 * its outcome in f).
 */
static bool
refused_locked(dp_client *c, dp__fanout *f, uint32_t u, dp__wire_op op)
{
    const dp__unit_probe *k = c->checks != NULL ? &c->checks[u] : NULL;
    if (k == NULL || k->state == DP__UNIT_CHECKED)
        return false;
    dp__fanout_unit *r = &f->u[u];
    r->addr = c->units[u].addr;
    r->op = op;
    if (k->state == DP__UNIT_DOWN) {
        r->st.rc = k->rc;
        r->st.det = k->det;
        r->why = k->why;
    } else {
        dp__fanout_fail(f, u, DP_EINVAL, " ", "was not asked who it is before use");
    }
    return true;
}

/*
 * q_of's request to every unit it picks, at once, into f (reset first):
 * clear, stats and the CLI's calls. A full client notes each reply's
 * incarnation (a restart seen here is reported to the next put or get).
 * Returns the first failure, into d.
 */
static int
call_all_locked(dp_client *c, dp__fanout *f, dp__fanout_req_fn q_of, void *ctx,
                dp_detail *d)
{
    dp__client_follow_locked(c);
    /*
     * A full client's units that were down when it opened have not said who
     * they are: they are bound first, and one that is still down, or is
     * another cluster's, is not sent q_of's request but fails with why.
     */
    int *rcs;
    dp_detail *dets;
    int rc = dp__client_bind_unbound_locked(c, q_of, ctx, dp__now_s() + c->o.timeout_s,
                                            &rcs, &dets, d);
    dp__fanout_reset(f); /* after: binding uses the client's own fanout, maybe f */
    if (rc != DP_OK)
        return rc;
    for (uint32_t u = 0; u < c->n_units; u++) {
        dp__wire_request q;
        memset(&q, 0, sizeof q);
        if (!q_of(u, &q, ctx) || refused_locked(c, f, u, q.op))
            continue;
        if (rcs != NULL && rcs[u] != 0) {
            dp__fanout_unit *r = &f->u[u];
            r->addr = c->units[u].addr;
            r->op = q.op;
            /* Its report names the unit already: "unit U (ADDR) is down: ...". */
            char pre[DP_CLUSTER_ADDR_MAX + 32];
            int pl = snprintf(pre, sizeof pre, "unit %u (%s) ", u, r->addr);
            const char *m = dp_detail_msg(&dets[u]);
            if (pl > 0 && strncmp(m, pre, (size_t)pl) == 0)
                m += pl;
            dp__fanout_fail(f, u, rcs[u], " ", "%s", m);
            continue;
        }
        dp__fanout_add(f, &c->rids, u, c->units[u].addr, c->units[u].incarnation, &q);
    }
    free(rcs);
    free(dets);
    dp__fanout_run(f, c->ctl, c->o.timeout_s, &c->words);
    for (uint32_t u = 0; c->checks == NULL && u < c->n_units; u++)
        if (f->u[u].decoded && f->u[u].answered)
            /* A restarted unit answers as well as the old one: note it, go on. */
            dp__client_reply_check_locked(c, u, &f->u[u].rep, false, NULL);
    return dp__fanout_first(f, d);
}

int
dp__client_call_all(dp_client *c, dp__fanout *f, dp__fanout_req_fn q_of, void *ctx,
                    dp_detail *d)
{
    memset(f, 0, sizeof *f);
    if (c == NULL || q_of == NULL)
        return dp__fail(d, DP_EINVAL, "dp__client_call_all: NULL argument");
    int rc = dp__fanout_init(f, c->n_units, d);
    if (rc != DP_OK)
        return rc;
    pthread_mutex_lock(&c->mu);
    rc = call_all_locked(c, f, q_of, ctx, d);
    pthread_mutex_unlock(&c->mu);
    return rc;
}

/* ---- clear ---- */

typedef struct clear_ctx {
    const dp__groups *g;
    uint64_t *sorted; /* the rows in g's order: each unit's side by side */
    uint64_t ver;     /* the clear's version (docs/design.md, "Versions") */
} clear_ctx;

static bool
clear_req(uint32_t u, dp__wire_request *q, void *ctx)
{
    const clear_ctx *x = ctx;
    uint32_t n = dp__groups_count(x->g, u);
    if (n == 0)
        return false;
    q->op = DP_WIRE_OP_RELEASE_ROWS;
    q->a.release_rows.gidxs = (dp__wire_u64s){x->sorted + x->g->start[u], n};
    q->a.release_rows.ver = x->ver;
    return true;
}

/*
 * release_rows of gidxs[0..n) (1..UINT32_MAX rows) on the units that own
 * them, at once: g gets the rows grouped by unit, f each unit's outcome,
 * *dropped the entries dropped; d the summary of the failed units.
 */
static int
clear_locked(dp_client *c, const uint64_t *gidxs, size_t n, dp__fanout *f, dp__groups *g,
             uint64_t *dropped, dp_detail *d)
{
    /* With replicas every copy is cleared: a row on each of its units. */
    uint32_t copies = dp__client_replicas(c);
    int rc = dp__groups_make_copies(g, c->n_units, gidxs, n, 0, copies, d);
    if (rc != DP_OK)
        return dp__fail_ctx(d, rc, "clear");
    uint64_t *sorted = malloc(n * copies * sizeof *sorted);
    if (sorted == NULL)
        return dp__fail(d, DP_ENOMEM, "clear: out of memory");
    for (size_t k = 0; k < n * copies; k++)
        sorted[k] = gidxs[g->order[k]];
    /*
     * A unit holding a key of these rows at a higher version than the
     * clear's (put after it, in version order) refuses it, dropping nothing:
     * the clear goes again, to every unit, above that version (idempotent
     * where it was carried out), at most DP__PUT_STALE_TRIES times.
     */
    clear_ctx x = {g, sorted, 0};
    double deadline = dp__now_s() + c->o.timeout_s;
    for (uint32_t round = 0;; round++) {
        x.ver = dp__client_ver_next_locked(c, x.ver);
        dp_detail e;
        dp_detail_clear(&e);
        int crc = call_all_locked(c, f, clear_req, &x, &e);
        bool asked = false;
        for (uint32_t u = 0; u < c->n_units; u++)
            asked = asked || f->u[u].op != DP_WIRE_OP_NONE;
        if (crc != DP_OK && !asked) { /* nothing was sent (binding failed) */
            free(sorted);
            if (d != NULL)
                *d = e;
            return crc;
        }
        uint64_t high = 0;
        for (uint32_t u = 0; u < c->n_units; u++) {
            const dp__fanout_unit *r = &f->u[u];
            if (r->op == DP_WIRE_OP_NONE)
                continue;
            if (r->st.rc == DP_OK)
                *dropped += r->rep.r.dropped;
            else if (r->st.rc == DP__ESTALE && r->decoded)
                high = DP_MAX(high, r->rep.err.ver);
        }
        if (high == 0 || round + 1 >= DP__CLEAR_STALE_TRIES || dp__left_s(deadline) <= 0)
            break;
        x.ver = high;
        c->cnt.retries++;
    }
    free(sorted);
    size_t n_failed_rows = 0;
    for (uint32_t u = 0; u < c->n_units; u++) {
        const dp__fanout_unit *r = &f->u[u];
        if (r->op == DP_WIRE_OP_NONE || r->st.rc == DP_OK)
            continue;
        if (r->st.rc == DP__ESTALE) {
            if (rc == DP_OK)
                rc = dp__fail(d, DP_EBUSY,
                              "clear: rows of unit %u (%s) not cleared: newer versions "
                              "of them kept being put while this clear was tried %u "
                              "times: clear again",
                              u, c->units[u].addr, DP__CLEAR_STALE_TRIES);
            n_failed_rows += dp__groups_count(g, u);
            continue;
        }
        if (copies > 1 && dp__ctl_peer_gone(c->units[u].addr)) {
            /* Its process is gone and comes back empty: its copies went with it. */
            DP_LOG_W("client: clear: unit %u (%s) is gone: its copies went with it", u,
                     c->units[u].addr);
            continue;
        }
        if (rc == DP_OK)
            rc = dp__fail(d, r->st.rc, "clear: rows of unit %u (%s) not cleared: %s", u,
                          c->units[u].addr, dp__fanout_why(r));
        else
            dp__detail_append(d, "; unit %u (%s) also failed: %s", u, c->units[u].addr,
                              dp_errname(r->st.rc));
        n_failed_rows += dp__groups_count(g, u);
    }
    if (rc != DP_OK)
        dp__detail_append(d, " (%zu of %zu rows not cleared%s)", n_failed_rows, n,
                          copies > 1 ? " on every unit" : "");
    return rc;
}

/* dp_client_clear's argument checks; *go false when there is nothing to do. */
static int
clear_args(const dp_client *c, const uint64_t *gidxs, size_t n, bool *go, dp_detail *d)
{
    *go = false;
    if (c == NULL || (gidxs == NULL && n > 0))
        return dp__fail(d, DP_EINVAL, "dp_client_clear: NULL argument");
    if (n > UINT32_MAX)
        return dp__fail(d, DP_ETOOBIG, "clear: %zu rows in one call", n);
    *go = n > 0;
    return DP_OK;
}

int
dp_client_clear(dp_client *c, const uint64_t *gidxs, size_t n, uint64_t *dropped,
                dp_detail *d)
{
    uint64_t dropped_here = 0;
    bool go;
    int rc = clear_args(c, gidxs, n, &go, d);
    if (dropped != NULL)
        *dropped = 0;
    if (rc != DP_OK || !go)
        return rc;
    dp__groups g;
    pthread_mutex_lock(&c->mu);
    rc = clear_locked(c, gidxs, n, &c->fo, &g, &dropped_here, d);
    c->cnt.clears++;
    dp__fanout_reset(&c->fo);
    pthread_mutex_unlock(&c->mu);
    dp__groups_fini(&g);
    if (dropped != NULL)
        *dropped = dropped_here;
    return rc;
}

int
dp__client_clear_units(dp_client *c, const uint64_t *gidxs, size_t n, dp__fanout *f,
                       dp__groups *g, dp_detail *d)
{
    memset(f, 0, sizeof *f);
    memset(g, 0, sizeof *g);
    uint64_t dropped = 0;
    bool go;
    int rc = clear_args(c, gidxs, n, &go, d);
    if (rc == DP_OK)
        rc = dp__fanout_init(f, c->n_units, d);
    if (rc != DP_OK)
        return rc;
    if (!go)
        return dp__groups_make(g, c->n_units, gidxs, 0, d);
    pthread_mutex_lock(&c->mu);
    rc = clear_locked(c, gidxs, n, f, g, &dropped, d);
    pthread_mutex_unlock(&c->mu);
    return rc;
}

/* ---- stats ---- */

typedef struct stat_kv {
    char *name;
    double value;
} stat_kv;

typedef struct unit_stats {
    int status;
    stat_kv *kv;
    size_t n;
} unit_stats;

struct dp_client_stats {
    uint32_t n_units;
    unit_stats *u;
};

void
dp_client_stats_destroy(dp_client_stats *s)
{
    if (s == NULL)
        return;
    for (uint32_t u = 0; s->u != NULL && u < s->n_units; u++) {
        for (size_t i = 0; i < s->u[u].n; i++)
            free(s->u[u].kv[i].name);
        free(s->u[u].kv);
    }
    free(s->u);
    free(s);
}

static int
stats_fill(unit_stats *us, const dp__wire_fields *f, dp_detail *d)
{
    us->kv = calloc(f->n > 0 ? f->n : 1, sizeof *us->kv);
    if (us->kv == NULL)
        return dp__fail(d, DP_ENOMEM, "stats: out of memory");
    for (uint32_t i = 0; i < f->n; i++) {
        const dp__wire_field *x = &f->v[i];
        double v;
        switch (x->type) {
        case DP_WIRE_BOOL:
            v = x->v.b ? 1 : 0;
            break;
        case DP_WIRE_U64:
            v = (double)x->v.u;
            break;
        case DP_WIRE_I64:
            v = (double)x->v.i;
            break;
        case DP_WIRE_F64:
            v = x->v.f;
            break;
        default:
            continue;
        }
        char *name = dp__wire_str_dup(x->name);
        if (name == NULL)
            return dp__fail(d, DP_ENOMEM, "stats: out of memory");
        us->kv[us->n++] = (stat_kv){name, v};
    }
    return DP_OK;
}

int
dp_client_stats_get(dp_client *c, dp_client_stats **out, dp_detail *d)
{
    if (c == NULL || out == NULL)
        return dp__fail(d, DP_EINVAL, "dp_client_stats_get: NULL argument");
    *out = NULL;
    dp_client_stats *s = calloc(1, sizeof *s);
    if (s == NULL)
        return dp__fail(d, DP_ENOMEM, "stats: out of memory");
    s->n_units = c->n_units;
    s->u = calloc(c->n_units, sizeof *s->u);
    if (s->u == NULL) {
        free(s);
        return dp__fail(d, DP_ENOMEM, "stats: out of memory");
    }
    pthread_mutex_lock(&c->mu);
    dp__wire_op op = DP_WIRE_OP_STATS;
    call_all_locked(c, &c->fo, dp__fanout_req_op, &op, NULL);
    int rc = DP_OK;
    for (uint32_t u = 0; u < c->n_units; u++) {
        const dp__fanout_unit *r = &c->fo.u[u];
        dp_detail ud;
        dp_detail_clear(&ud);
        int urc = r->st.rc;
        if (urc == DP_OK)
            urc = stats_fill(&s->u[u], &r->rep.r.stats, &ud);
        s->u[u].status = urc;
        if (urc != DP_OK && rc == DP_OK)
            rc = dp__fail(d, urc, "stats: unit %u (%s): %s", u, c->units[u].addr,
                          r->st.rc != DP_OK ? dp__fanout_why(r) : ud.msg);
    }
    dp__fanout_reset(&c->fo);
    pthread_mutex_unlock(&c->mu);
    *out = s;
    return rc;
}

uint32_t
dp_client_stats_units(const dp_client_stats *s)
{
    return s != NULL ? s->n_units : 0;
}

int
dp_client_stats_status(const dp_client_stats *s, uint32_t unit)
{
    if (s == NULL || unit >= s->n_units)
        return DP_EINVAL;
    return s->u[unit].status;
}

size_t
dp_client_stats_count(const dp_client_stats *s, uint32_t unit)
{
    if (s == NULL || unit >= s->n_units)
        return 0;
    return s->u[unit].n;
}

bool
dp_client_stats_at(const dp_client_stats *s, uint32_t unit, size_t i, const char **name,
                   double *value)
{
    if (s == NULL || unit >= s->n_units || i >= s->u[unit].n)
        return false;
    if (name != NULL)
        *name = s->u[unit].kv[i].name;
    if (value != NULL)
        *value = s->u[unit].kv[i].value;
    return true;
}

bool
dp_client_stats_find(const dp_client_stats *s, uint32_t unit, const char *name,
                     double *value)
{
    if (s == NULL || name == NULL || unit >= s->n_units)
        return false;
    for (size_t i = 0; i < s->u[unit].n; i++) {
        if (strcmp(s->u[unit].kv[i].name, name) == 0) {
            if (value != NULL)
                *value = s->u[unit].kv[i].value;
            return true;
        }
    }
    return false;
}
