/*
 * A put with replicas (docs/design.md, "Replicas"): which rows landed when
 * each row has a copy on each of its units, the report of those that did not,
 * and the put again of the rows whose copy met a flap or a restart. put.c
 * drives the put; put_int.h holds what they share.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "client/fanout.h"
#include "client/put_int.h"

/* Whether part pu failed unanswered on a live unit, with no put again to come. */
static bool
pu_silent(const put_op *p, const put_unit *pu)
{
    if (pu->st.state != ST_FAILED ||
        (pu->st.rc != DP_ETIMEDOUT && pu->st.rc != DP_ETRANSFER))
        return false;
    bool retry =
        p->round == 0 && dp__left_s(p->deadline) > 0.05 && pu->st.rc == DP_ETRANSFER;
    return !retry;
}

/*
 * With read leases (docs/design.md, "Leases"): the parts that failed because
 * their unit did not answer (alive: not gone) land without it if more than
 * half of the cluster's units fence it; this call then waits until the
 * leases they granted it ended, so that it answers no read of an older copy
 * once the put returns. Marks those parts fenced.
 */
static void
put_fence_locked(put_op *p)
{
    dp_client *c = p->c;
    if (!c->leases)
        return; /* no unit grants leases: a silent unit fails its rows */
    uint32_t n = c->n_units;
    uint64_t *silent = malloc(n * sizeof *silent);
    uint32_t ns = 0;
    bool *is_silent = calloc(n, sizeof *is_silent);
    dp__fanout f = {0};
    if (silent == NULL || is_silent == NULL)
        goto out;
    for (size_t i = 0; i < p->npu; i++) {
        put_unit *pu = &p->pus[i];
        if (pu_silent(p, pu) && !is_silent[pu->st.u] &&
            !dp__ctl_peer_gone(c->units[pu->st.u].addr)) {
            is_silent[pu->st.u] = true;
            silent[ns++] = pu->st.u;
        }
    }
    if (ns == 0 || dp__left_s(p->deadline) <= 0.05 ||
        dp__fanout_init(&f, n, NULL) != DP_OK)
        goto out;
    for (uint32_t u = 0; u < n; u++) {
        if (is_silent[u])
            continue;
        dp__wire_request q;
        memset(&q, 0, sizeof q);
        q.op = DP_WIRE_OP_FENCE;
        q.a.fence = (dp__wire_fence_args){{silent, ns}};
        dp__fanout_add(&f, &c->rids, u, c->units[u].addr, c->units[u].incarnation, &q);
    }
    dp__fanout_run(&f, c->ctl, DP_MIN(dp__left_s(p->deadline), c->o.timeout_s),
                   &c->words);
    uint32_t acks = 0;
    uint64_t wait_ms = 0;
    for (uint32_t u = 0; u < n; u++)
        if (f.u[u].op != DP_WIRE_OP_NONE && f.u[u].st.rc == DP_OK && f.u[u].decoded) {
            acks++;
            wait_ms = DP_MAX(wait_ms, f.u[u].rep.r.fence.wait_ms);
        }
    double wait = (double)wait_ms / 1000;
    if (2 * acks <= n || wait > dp__left_s(p->deadline)) {
        DP_LOG_W("client: put: %u unit(s) did not answer; %u of %u units fenced them%s: "
                 "their rows fail",
                 ns, acks, n,
                 2 * acks <= n ? " (more than half must)" : ", too late for the budget");
        goto out;
    }
    /* The lock stays held: this client's other calls wait, as behind a slow unit. */
    dp__sleep_s(wait);
    for (size_t i = 0; i < p->npu; i++)
        if (pu_silent(p, &p->pus[i]) && is_silent[p->pus[i].st.u])
            p->pus[i].fenced = true;
    DP_LOG_W(
        "client: put: %u unit(s) did not answer: fenced by %u of %u units, their rows "
        "land without them (waited %.3f s for their read leases to end)",
        ns, acks, n, wait);
out:
    dp__fanout_fini(&f);
    free(silent);
    free(is_silent);
}

/*
 * With replicas (p->copies > 1; docs/design.md, "Replicas"): a row landed when
 * every copy it has was committed, but for copies whose unit's process is gone
 * (refused: it comes back empty, holding no older value of the row), so long
 * as one was committed; such a row is under-replicated (counted). A copy that
 * failed on a live unit fails the row, except that a dropped connection or a
 * restart (the unit lives: a flap, a new process) marks it in again[] to be
 * put once more, every copy, within the budget. rst gets every row's code.
 */
static void
put_outcome_copies_locked(put_op *p, int *rst, bool *again, size_t *n_again)
{
    dp_client *c = p->c;
    size_t n = p->n_rows;
    uint8_t *need = calloc(n, 2), *landed = need != NULL ? need + n : NULL;
    *n_again = 0;
    for (size_t r = 0; r < n; r++) {
        rst[r] = DP_OK;
        again[r] = false;
    }
    for (size_t i = 0; i < p->npu; i++) {
        put_unit *pu = &p->pus[i];
        uint32_t u = pu->st.u;
        bool stale = pu->st.state == ST_AGAIN; /* dp__put_stale_locked */
        bool done = pu->st.state != ST_FAILED && !stale;
        pu->gone = !done && !stale && (pu->fenced || dp__ctl_peer_gone(c->units[u].addr));
        bool retry = stale || (!done && !pu->gone && p->round == 0 &&
                               dp__left_s(p->deadline) > 0.05 &&
                               (pu->st.rc == DP_ETRANSFER || pu->st.rc == DP_ERESTARTED));
        if (pu->gone && !pu->fenced)
            DP_LOG_W("client: put: unit %u (%s) is gone (refuses connections): its "
                     "rows in blob %s land on their other units",
                     u, c->units[u].addr, pu->blob_id);
        for (uint32_t k = p->g.start[u]; k < p->g.start[u + 1]; k++) {
            uint32_t r = p->g.order[k];
            if (need != NULL) {
                need[r]++;
                landed[r] += done;
            }
            if (retry) {
                if (!again[r]) {
                    again[r] = true;
                    (*n_again)++;
                }
            } else if (!done && !pu->gone && rst[r] == DP_OK) {
                rst[r] = pu->st.rc;
            }
        }
    }
    for (size_t r = 0; r < n; r++) {
        if (again[r] && rst[r] != DP_OK) { /* failed for good on another unit */
            again[r] = false;
            (*n_again)--;
        }
        if (need == NULL || rst[r] != DP_OK || again[r] || landed[r] == need[r])
            continue;
        if (landed[r] == 0)
            rst[r] = DP_ETRANSFER; /* every unit of the row is gone */
        else
            c->under_replicated_rows++;
    }
    if (need ==
        NULL) /* out of memory: no count, and a row is landed only if no copy failed */
        for (size_t i = 0; i < p->npu; i++)
            for (uint32_t k = p->g.start[p->pus[i].st.u];
                 p->pus[i].st.state == ST_FAILED && k < p->g.start[p->pus[i].st.u + 1];
                 k++)
                if (rst[p->g.order[k]] == DP_OK && !again[p->g.order[k]])
                    rst[p->g.order[k]] = p->pus[i].st.rc;
    free(need);
}

/* The detail of a put with replicas whose rows in rst did not all land. */
static int
put_report_copies(const put_op *p, const int *rst, dp_detail *d)
{
    dp_client *c = p->c;
    size_t bad = 0;
    int first = DP_OK;
    for (size_t r = 0; r < p->n_rows; r++)
        if (rst[r] != DP_OK && bad++ == 0)
            first = rst[r];
    if (bad == 0)
        return DP_OK;
    dp__fail(d, first,
             "put: %zu of %zu rows did not land (%u copies each); rows not landed:", bad,
             p->n_rows, p->copies);
    size_t shown = 0;
    for (size_t r = 0; r < p->n_rows && shown < 16; r++)
        if (rst[r] != DP_OK && ++shown)
            dp__detail_append(d, " %" PRIu64, p->gidxs[r]);
    if (bad > shown)
        dp__detail_append(d, " and %zu more", bad - shown);
    for (size_t i = 0; i < p->npu; i++) {
        const put_unit *pu = &p->pus[i];
        if (pu->st.state == ST_FAILED)
            dp__detail_append(d, "; unit %u (%s)%s: %s", pu->st.u,
                              c->units[pu->st.u].addr, pu->gone ? " is gone" : "",
                              dp_detail_msg(&pu->st.det));
    }
    return first;
}

void
dp__put_stale_locked(put_op *a)
{
    size_t n_stale = 0;
    for (size_t i = 0; i < a->npu; i++) {
        put_unit *pu = &a->pus[i];
        if (pu->st.state != ST_FAILED || pu->st.rc != DP__ESTALE)
            continue;
        if (a->round + 1 < DP__PUT_STALE_TRIES && dp__left_s(a->deadline) > 0.05) {
            pu->st.state = ST_AGAIN;
            a->ver_above = DP_MAX(a->ver_above, pu->stale);
            n_stale++;
            continue;
        }
        /* Other writers kept replacing these keys with newer versions. */
        pu->st.rc = DP_EBUSY;
        dp__detail_append(&pu->st.det,
                          "; newer versions kept being written while this put was "
                          "tried %u times: put again",
                          a->round + 1);
    }
    if (n_stale == 0 || a->copies > 1)
        return; /* dp__put_decide_copies_locked takes them */
    if (a->again == NULL && (a->again = calloc(a->n_rows, sizeof *a->again)) == NULL) {
        for (size_t i = 0; i < a->npu; i++)
            if (a->pus[i].st.state == ST_AGAIN) {
                a->pus[i].st.state = ST_FAILED;
                a->pus[i].st.rc = DP_ENOMEM;
            }
        return;
    }
    for (size_t i = 0; i < a->npu; i++) {
        const put_unit *pu = &a->pus[i];
        if (pu->st.state != ST_AGAIN)
            continue;
        for (uint32_t k = a->g.start[pu->st.u]; k < a->g.start[pu->st.u + 1]; k++) {
            uint32_t r = a->g.order[k];
            if (!a->again[r]) {
                a->again[r] = true;
                a->n_again++;
            }
        }
    }
}

int
dp__put_decide_copies_locked(put_op *a, int *row_status, dp_detail *d)
{
    int *rst = malloc(a->n_rows * sizeof *rst);
    a->again = malloc(a->n_rows * sizeof *a->again);
    if (rst == NULL || a->again == NULL) {
        free(rst);
        free(a->again);
        a->again = NULL;
        /* Out of memory: no put again; a part refused as stale failed. */
        for (size_t i = 0; i < a->npu; i++)
            if (a->pus[i].st.state == ST_AGAIN) {
                a->pus[i].st.state = ST_FAILED;
                a->pus[i].st.rc = DP_ENOMEM;
            }
        return dp__put_outcome_locked(a, row_status, d);
    }
    put_fence_locked(a);
    put_outcome_copies_locked(a, rst, a->again, &a->n_again);
    int rc = put_report_copies(a, rst, d);
    if (row_status != NULL)
        memcpy(row_status, rst, a->n_rows * sizeof *rst);
    free(rst);
    return rc;
}

int
dp__put_again(put_op *a, int rc, int *row_status, dp_loc *locs, dp_detail *d)
{
    size_t m = a->n_again, nf = a->n_fields, j = 0;
    uint64_t *gx = malloc(m * sizeof *gx);
    uint32_t *idx = malloc(m * sizeof *idx);
    dp_value *vx = malloc(m * nf * sizeof *vx);
    uint64_t *cx = a->cell_ver != NULL ? malloc(m * nf * sizeof *cx) : NULL;
    int *st = malloc(m * sizeof *st);
    dp_loc *lx = locs != NULL ? calloc(m * nf, sizeof *lx) : NULL;
    if (gx == NULL || idx == NULL || vx == NULL || st == NULL || (locs != NULL && !lx) ||
        (a->cell_ver != NULL && cx == NULL)) {
        for (size_t r = 0; r < a->n_rows && rc == DP_OK; r++)
            if (a->again[r])
                rc = dp__fail(d, DP_ENOMEM, "put: out of memory putting rows again");
        for (size_t r = 0; r < a->n_rows && row_status != NULL; r++)
            if (a->again[r])
                row_status[r] = DP_ENOMEM;
        goto out;
    }
    for (size_t r = 0; r < a->n_rows; r++)
        if (a->again[r]) {
            idx[j] = (uint32_t)r;
            gx[j] = a->gidxs[r];
            memcpy(vx + j * nf, a->values + r * nf, nf * sizeof *vx);
            if (cx != NULL)
                memcpy(cx + j * nf, a->cell_ver + r * nf, nf * sizeof *cx);
            j++;
        }
    if (a->ver_above != 0)
        DP_LOG_D("client: put: %zu row(s) held at a newer version (%" PRIu64
                 ") by a unit: putting them again above it",
                 m, a->ver_above);
    else
        DP_LOG_I("client: put: %zu row(s) met a dropped connection or a restarted "
                 "unit: putting them again",
                 m);
    pthread_mutex_lock(&a->c->mu);
    a->c->cnt.retries++;
    pthread_mutex_unlock(&a->c->mu);
    put_op b = {.c = a->c,
                .gidxs = gx,
                .n_rows = m,
                .fields = a->fields,
                .n_fields = nf,
                .values = vx,
                .deadline = a->deadline,
                .ver_above = a->ver_above,
                .round = a->round + 1,
                .cell_ver = cx};
    dp_detail e;
    dp_detail_clear(&e);
    int rc2 = dp__put_impl(&b, st, lx, &e);
    if (b.n_again > 0) /* stale again (bounded by DP__PUT_STALE_TRIES) */
        rc2 = dp__put_again(&b, rc2, st, lx, &e);
    free(b.again);
    for (size_t k = 0; k < m; k++) {
        if (row_status != NULL)
            row_status[idx[k]] = st[k];
        if (locs != NULL)
            memcpy(locs + (size_t)idx[k] * nf, lx + k * nf, nf * sizeof *lx);
    }
    if (rc2 != DP_OK && rc == DP_OK) {
        rc = rc2;
        if (d != NULL)
            *d = e;
    } else if (rc2 != DP_OK) {
        dp__detail_append(d, "; put again: %s", e.msg);
    }
out:
    free(gx);
    free(idx);
    free(vx);
    free(cx);
    free(st);
    free(lx);
    return rc;
}
