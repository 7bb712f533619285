/*
 * Read leases between the units of a cluster (docs/design.md, "Leases"):
 * what lets a write land without a unit that does not answer (alive behind a
 * network outage, or stopped) while no get can then read that unit's older
 * copy.
 *
 * Design notes
 * ------------
 * - A unit answers reads (resolve_keys, a resolve's `whole`, a peer's
 *   list_keys) only while it holds a lease from more than half of the
 *   cluster's units, itself counted: each other unit grants it for lease_s,
 *   asked every lease_s / 4 by the unit's lease thread (the CLI's). The
 *   holder counts a grant from when it sent the request, less a tenth, so
 *   its lease ends before the grantor's record of it.
 * - A fence: a client whose write reached some units of a row but not one
 *   that is not gone asks every other unit to fence it. Each one grants it
 *   nothing more until it says it caught up, and answers when the leases it
 *   granted end; the client waits that long and counts the row landed, but
 *   only if more than half of the units fenced it. Two majorities share a
 *   unit, so the fenced unit cannot hold a lease once the wait is over.
 * - Catching up: a fenced unit learns it from the next denial (`behind`,
 *   the fence's number) and runs a pass ("Repair"); a pass that read every
 *   peer catches it up with the fences it knew of when it began, which it
 *   says in its next requests (`done`), and the grants resume.
 * - A unit whose process is gone (refuses connections) grants nothing, and
 *   its copies went with it; the holder counts it as granting (so that units
 *   killed for good leave the others readable) if its grant still held when
 *   it was found gone: it fenced nothing the holder missed. A unit found
 *   gone after its grant ended (the holder was cut off meanwhile) counts only
 *   once a process answers there again. A fence's number starts from the unit's clock
 * (dp__ver_now), so a restarted grantor never takes an old `done` for one of its new
 * fences, and it treats every unit as holding a lease from it for its first lease_s (an
 * earlier process of it may have granted one).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "unit/unit_int.h"

/* A peer's leases, both ways. */
typedef struct lease_peer {
    double held_until;    /* its grant to this unit ends (this unit's clock) */
    uint64_t behind;      /* its fence on this unit, not caught up with (0: none) */
    uint64_t done;        /* the highest of its fences this unit caught up with */
    bool gone;            /* its process was found gone while its grant held */
    double granted_until; /* this unit's grant to it ends */
    uint64_t fence;       /* this unit fenced it (0: not) */
} lease_peer;

/* The part of a grant the holder counts on (clock rates differ a little). */
#define LEASE_HOLD_SHARE 0.9

int
dp__lease_init(dp__unit *u, dp_detail *d)
{
    if (!(u->o.lease_s > 0))
        return DP_OK;
    u->lease = calloc(u->o.n_units, sizeof *u->lease);
    u->lease_scratch = calloc(u->o.n_units, sizeof *u->lease_scratch);
    if (u->lease == NULL || u->lease_scratch == NULL)
        return dp__fail(d, DP_ENOMEM, "unit: out of memory");
    double now = dp__unit_now(u);
    for (uint32_t p = 0; p < u->o.n_units; p++)
        u->lease[p].granted_until = now + u->o.lease_s;
    u->lease_seq = dp__ver_now();
    u->lease_ok_until = 0;
    return DP_OK;
}

void
dp__lease_fini(dp__unit *u)
{
    free(u->lease);
    free(u->lease_scratch);
    u->lease = NULL;
    u->lease_scratch = NULL;
}

static int
cmp_desc(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x > y ? -1 : x < y;
}

/* Until when more than half of the units (this one counted) grant it a lease. */
static void
recompute_locked(dp__unit *u)
{
    uint32_t n = u->o.n_units, k = 0, need = n / 2; /* grants besides its own */
    double *v = u->lease_scratch;
    for (uint32_t p = 0; p < n; p++) {
        if (p == u->o.unit_id)
            continue;
        const lease_peer *x = &u->lease[p];
        v[k++] = x->behind != 0 ? 0 : x->gone ? INFINITY : x->held_until;
    }
    qsort(v, k, sizeof *v, cmp_desc);
    u->lease_ok_until = need == 0 ? INFINITY : v[need - 1];
}

static int
check_peer(const dp__unit *u, uint64_t peer, const char *op, dp_detail *d)
{
    if (!(u->o.lease_s > 0))
        return dp__fail(d, DP_EINVAL,
                        "%s: unit %u runs without read leases (start every unit with "
                        "the same --lease)",
                        op, u->o.unit_id);
    if (peer >= u->o.n_units || peer == u->o.unit_id)
        return dp__fail(d, DP_EPROTO, "%s: unit %llu is not another unit of %u", op,
                        (unsigned long long)peer, u->o.n_units);
    return DP_OK;
}

int
dp__unit_lease_grant(dp__unit *u, uint64_t peer, uint64_t done, dp__wire_lease_res *out,
                     dp_detail *d)
{
    memset(out, 0, sizeof *out);
    int rc = check_peer(u, peer, "lease", d);
    if (rc != DP_OK)
        return rc;
    pthread_mutex_lock(&u->mu);
    lease_peer *x = &u->lease[peer];
    if (x->fence != 0 && done >= x->fence)
        x->fence = 0; /* its pass caught it up */
    if (x->fence != 0) {
        out->behind = x->fence;
    } else {
        x->granted_until = DP_MAX(x->granted_until, dp__unit_now(u) + u->o.lease_s);
        out->granted = true;
        out->lease_ms = (uint64_t)(u->o.lease_s * 1000);
    }
    pthread_mutex_unlock(&u->mu);
    return DP_OK;
}

int
dp__unit_fence(dp__unit *u, const uint64_t *peers, uint32_t n, uint64_t *wait_ms,
               dp_detail *d)
{
    *wait_ms = 0;
    for (uint32_t i = 0; i < n; i++) {
        int rc = check_peer(u, peers[i], "fence", d);
        if (rc != DP_OK)
            return rc;
    }
    pthread_mutex_lock(&u->mu);
    double now = dp__unit_now(u), wait = 0;
    for (uint32_t i = 0; i < n; i++) {
        lease_peer *x = &u->lease[peers[i]];
        x->fence = ++u->lease_seq;
        wait = DP_MAX(wait, x->granted_until - now);
        u->stats.fences++;
    }
    pthread_mutex_unlock(&u->mu);
    /* A millisecond more than the grant: the asker waits by its own clock. */
    *wait_ms = wait > 0 ? (uint64_t)ceil(wait * 1000) + 1 : 0;
    return DP_OK;
}

void
dp__unit_lease_answer(dp__unit *u, uint32_t peer, double sent_at,
                      const dp__wire_lease_res *r)
{
    if (u->lease == NULL || peer >= u->o.n_units || peer == u->o.unit_id)
        return;
    pthread_mutex_lock(&u->mu);
    lease_peer *x = &u->lease[peer];
    x->gone = false;
    if (r->granted) {
        x->held_until = sent_at + LEASE_HOLD_SHARE * (double)r->lease_ms / 1000;
        x->behind = 0;
    } else {
        x->held_until = 0;
        x->behind = r->behind;
        if (x->behind == 0) /* denied with no fence: a malformed answer, no lease */
            x->behind = UINT64_MAX;
    }
    recompute_locked(u);
    pthread_mutex_unlock(&u->mu);
}

void
dp__unit_lease_unanswered(dp__unit *u, uint32_t peer, bool gone)
{
    if (u->lease == NULL || peer >= u->o.n_units || peer == u->o.unit_id)
        return;
    pthread_mutex_lock(&u->mu);
    lease_peer *x = &u->lease[peer];
    /* Gone counts only if its grant held when it went (it fenced nothing this
     * unit missed); found gone later, it counts only once it answers again. */
    x->gone = gone && (x->gone || (x->behind == 0 && dp__unit_now(u) < x->held_until));
    recompute_locked(u);
    pthread_mutex_unlock(&u->mu);
}

bool
dp__unit_lease_state(dp__unit *u, char *why, size_t cap)
{
    size_t at = 0;
    why[0] = '\0';
    if (u->lease == NULL)
        return true;
    pthread_mutex_lock(&u->mu);
    double now = dp__unit_now(u);
    bool ok = dp__lease_reads_ok_locked(u, now);
    for (uint32_t p = 0; !ok && p < u->o.n_units && at + 48 < cap; p++) {
        const lease_peer *x = &u->lease[p];
        if (p == u->o.unit_id)
            continue;
        const char *sep = at ? ", " : "";
        int w;
        if (x->behind != 0)
            w = snprintf(why + at, cap - at, "%su%u behind %llu", sep, p,
                         (unsigned long long)x->behind);
        else if (x->gone)
            w = snprintf(why + at, cap - at, "%su%u gone", sep, p);
        else if (x->held_until > now)
            w = snprintf(why + at, cap - at, "%su%u %.1fs left", sep, p,
                         x->held_until - now);
        else
            w = snprintf(why + at, cap - at, "%su%u none", sep, p);
        if (w > 0)
            at += (size_t)w;
    }
    pthread_mutex_unlock(&u->mu);
    return ok;
}

bool
dp__unit_lease_on(const dp__unit *u)
{
    return u->o.lease_s > 0;
}

bool
dp__unit_reads_ok_locked(dp__unit *u)
{
    return dp__lease_reads_ok_locked(u, dp__unit_now(u));
}

uint64_t
dp__unit_lease_done(dp__unit *u, uint32_t peer)
{
    if (u->lease == NULL || peer >= u->o.n_units)
        return 0;
    pthread_mutex_lock(&u->mu);
    uint64_t v = u->lease[peer].done;
    pthread_mutex_unlock(&u->mu);
    return v;
}

bool
dp__unit_lease_behind(dp__unit *u)
{
    if (u->lease == NULL)
        return false;
    bool b = false;
    pthread_mutex_lock(&u->mu);
    for (uint32_t p = 0; p < u->o.n_units && !b; p++)
        b = u->lease[p].behind > u->lease[p].done;
    pthread_mutex_unlock(&u->mu);
    return b;
}

void
dp__unit_lease_snapshot(dp__unit *u, uint64_t *snap)
{
    if (u->lease == NULL)
        return;
    pthread_mutex_lock(&u->mu);
    for (uint32_t p = 0; p < u->o.n_units; p++)
        snap[p] = u->lease[p].behind;
    pthread_mutex_unlock(&u->mu);
}

void
dp__unit_lease_caught_up(dp__unit *u, const uint64_t *snap)
{
    if (u->lease == NULL)
        return;
    pthread_mutex_lock(&u->mu);
    for (uint32_t p = 0; p < u->o.n_units; p++)
        if (snap[p] != UINT64_MAX && snap[p] > u->lease[p].done)
            u->lease[p].done = snap[p];
    pthread_mutex_unlock(&u->mu);
}
