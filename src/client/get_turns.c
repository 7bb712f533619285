/*
 * The get call (dp_client_get, dp__get_locked) and its report, over the
 * passes get.c runs (dp__get_pass); get_int.h holds what they share.
 *
 * With replicas (docs/design.md, "Replicas") each key is asked of its row's
 * units in turn, within the call, until one has it; a unit whose process is
 * gone counts as missing the key, not as unreachable.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "blob/keys.h"
#include "client/get_int.h"

/*
 * With replicas, after the turn shift asked items[0..n) (at[k]: the key's place
 * in the call, or NULL for the same): a key that failed because its unit is
 * down, on a unit whose process is gone (refuses connections: it comes back
 * empty), is missing there, not unreachable; gone_n counts such units per key.
 * gone[u] caches each unit's probe for the call (-1: not probed).
 */
static void
settle_gone(dp_client *c, dp_get_item *items, size_t n, const uint32_t *at,
            uint32_t shift, int8_t *gone, uint8_t *gone_n)
{
    uint32_t N = c->n_units;
    for (size_t k = 0; k < n; k++) {
        if (items[k].status != DP_ETRANSFER)
            continue;
        dp__key_parts kp;
        if (dp__key_split(items[k].key, strlen(items[k].key), &kp, NULL) != DP_OK)
            continue;
        uint32_t u = (uint32_t)((kp.gidx % N + shift) % N);
        if (gone[u] < 0)
            gone[u] = dp__ctl_peer_gone(c->units[u].addr);
        if (gone[u]) {
            items[k].status = DP_ENOTFOUND;
            gone_n[at != NULL ? at[k] : k]++;
        }
    }
}

/* The scratch of a get with replicas across its turns. */
typedef struct turns {
    int *first_fail; /* per key: its first failure other than "missing" */
    uint8_t *cycle;  /* per key: asked again in this cycle (leases), or NULL */
    uint8_t *gone_n; /* per key: its units found gone */
    int8_t *gone;    /* per unit: gone (1), not (0), not probed (-1) */
} turns;

/*
 * With replicas: the keys that failed on the row's replica turn - 1 asked of
 * the next one, in a share of what is left of the budget. first_fail keeps a
 * key's first failure other than "missing", so a key missing on one replica
 * and unreachable on a live one reports the latter (it may be there).
 */
/* Whether key i is asked of the next unit: it failed, and in a cycle, is in it. */
static bool
asked_again(const turns *t, size_t i, int status)
{
    return dp__get_falls_back(status) && (t->cycle == NULL || t->cycle[i]);
}

static int
get_next_replica(const dp__get_ctx *g, dp_get_item *items, size_t n, double deadline,
                 uint32_t turn, turns *t, dp_detail *d)
{
    dp_client *c = g->c;
    size_t m = 0;
    for (size_t i = 0; i < n; i++)
        m += asked_again(t, i, items[i].status);
    if (m == 0)
        return DP_OK;
    uint32_t *idx = malloc(m * sizeof *idx);
    dp_get_item *sub = malloc(m * sizeof *sub);
    if (idx == NULL || sub == NULL) {
        free(idx);
        free(sub);
        return dp__fail(d, DP_ENOMEM, "get: out of memory asking the next replica");
    }
    size_t j = 0;
    for (size_t i = 0; i < n; i++)
        if (asked_again(t, i, items[i].status)) {
            if (items[i].status != DP_ENOTFOUND && t->first_fail[i] == DP_OK)
                t->first_fail[i] = items[i].status;
            idx[j] = (uint32_t)i;
            sub[j++] = items[i];
        }
    c->cnt.retries++;
    int rc = dp__get_pass(g, sub, idx, m, deadline, turn, d);
    if (rc == DP_OK)
        settle_gone(c, sub, m, idx, turn, t->gone, t->gone_n);
    for (size_t k = 0; k < m && rc == DP_OK; k++)
        items[idx[k]] = sub[k];
    free(idx);
    free(sub);
    return rc;
}

/*
 * With replicas, each turn asks the keys that failed so far of their rows'
 * next unit, in a share of what is left of the budget (a unit that does not
 * answer leaves the next replica time; the last turn gets the rest). A key
 * missing everywhere is missing, unless a live unit did not answer for it
 * (its first such failure) or every unit of its row is gone (DP_ETRANSFER).
 */
static int
get_turns(const dp__get_ctx *g, dp_get_item *items, size_t n, dp_detail *d)
{
    dp_client *c = g->c;
    uint32_t R = dp__client_replicas(c);
    double t0 = dp__now_s(), deadline = t0 + c->o.timeout_s;
    turns t = {calloc(n > 0 ? n : 1, sizeof *t.first_fail), NULL,
               calloc(n > 0 ? n : 1, sizeof *t.gone_n), malloc(c->n_units)};
    int rc = DP_ENOMEM;
    if (t.first_fail == NULL || t.gone_n == NULL || t.gone == NULL) {
        dp__fail(d, rc, "get: out of memory");
        goto out;
    }
    memset(t.gone, -1, c->n_units);
    rc = dp__get_pass(g, items, NULL, n, t0 + c->o.timeout_s / R, 0, d);
    if (rc == DP_OK)
        settle_gone(c, items, n, NULL, 0, t.gone, t.gone_n);
    for (uint32_t k = 1; k < R && rc == DP_OK; k++) {
        double now = dp__now_s(), share = (deadline - now) / (R - k);
        rc = get_next_replica(g, items, n, k + 1 == R ? deadline : now + share, k, &t, d);
    }
    /*
     * With read leases, a key every unit of its row answered as fenced (none
     * held its lease: all cut off from most units, or the ones that hold it
     * were just caught up) is asked again, every unit in turn, after a short
     * backoff, while the budget lasts ("Leases").
     */
    for (uint32_t cyc = 0; c->leases && rc == DP_OK && dp__left_s(deadline) > 0.1;
         cyc++) {
        if (t.cycle == NULL && (t.cycle = calloc(n > 0 ? n : 1, 1)) == NULL)
            break;
        bool busy = false;
        for (size_t i = 0; i < n; i++) {
            t.cycle[i] = items[i].status == DP_EBUSY ||
                         (items[i].status == DP_ENOTFOUND && t.first_fail[i] == DP_EBUSY);
            if (t.cycle[i]) { /* asked of every unit again: this cycle's failures count */
                items[i].status = DP_EBUSY;
                t.first_fail[i] = DP_OK;
                busy = true;
            }
        }
        if (!busy)
            break;
        dp__sleep_s(DP_MIN(0.02 * (cyc + 1), 0.2));
        for (uint32_t k = 0; k < R && rc == DP_OK; k++) {
            double now = dp__now_s(), share = (deadline - now) / (R - k);
            rc = get_next_replica(g, items, n, k + 1 == R ? deadline : now + share, k, &t,
                                  d);
        }
    }
    for (size_t i = 0; i < n && rc == DP_OK; i++) {
        if (items[i].status != DP_ENOTFOUND)
            continue;
        if (t.first_fail[i] != DP_OK)
            items[i].status = t.first_fail[i];
        else if (t.gone_n[i] == R)
            items[i].status = DP_ETRANSFER;
    }
out:
    free(t.first_fail);
    free(t.cycle);
    free(t.gone_n);
    free(t.gone);
    return rc;
}

/* Report: first failure's code; missing keys by name; failed units (ust). */
static int
get_report(dp_client *c, const dp_get_item *items, size_t n, const dp__step *ust,
           dp_detail *d)
{
    size_t n_bad = 0, n_missing = 0, n_small = 0;
    int first = DP_OK;
    for (size_t i = 0; i < n; i++) {
        if (items[i].status == 0)
            continue;
        n_bad++;
        if (first == DP_OK)
            first = items[i].status;
        if (items[i].status == DP_ENOTFOUND)
            n_missing++;
        else if (items[i].status == DP_ETOOBIG)
            n_small++;
    }
    if (first == DP_OK)
        return DP_OK;
    dp__fail(d, first, "get: %zu of %zu keys failed", n_bad, n);
    for (uint32_t u = 0; u < c->n_units; u++)
        if (ust[u].rc != 0)
            dp__detail_append(d, "; unit %u (%s): %s", u, c->units[u].addr,
                              dp_detail_msg(&ust[u].det));
    if (n_missing > 0) {
        dp__detail_append(d, "; %zu missing:", n_missing);
        for (size_t i = 0; i < n; i++)
            if (items[i].status == DP_ENOTFOUND)
                dp__detail_append(d, " '%s'", items[i].key);
    }
    if (n_bad > n_missing + n_small) {
        /* Lost (failed stage) and unreachable keys, by name, with their code. */
        dp__detail_append(d, "; failed:");
        for (size_t i = 0; i < n; i++)
            if (items[i].status != 0 && items[i].status != DP_ENOTFOUND &&
                items[i].status != DP_ETOOBIG)
                dp__detail_append(d, " '%s' (%s)", items[i].key,
                                  dp_errname(items[i].status));
    }
    for (size_t i = 0; i < n; i++)
        if (items[i].status == DP_ETOOBIG) {
            dp__detail_append(d,
                              "; '%s' needs %" PRIu64 " bytes, destination has %" PRIu64,
                              items[i].key, items[i].nbytes, items[i].cap);
            break;
        }
    return first;
}

int
dp__get_locked(dp_client *c, dp_get_item *items, size_t n, dp_values *vals, dp_detail *d)
{
    dp__step *ust = calloc(c->n_units, sizeof *ust);
    if (ust == NULL)
        return dp__fail(d, DP_ENOMEM, "get: out of memory");
    bool by_turns = dp__client_replicas(c) > 1 && c->only_unit < 0;
    dp__get_ctx g = {c, vals, ust, NULL};
    if (by_turns && vals != NULL && (g.resv = calloc(n, sizeof *g.resv)) == NULL) {
        free(ust);
        return dp__fail(d, DP_ENOMEM, "get: out of memory");
    }
    int rc = by_turns
                 ? get_turns(&g, items, n, d)
                 : dp__get_pass(&g, items, NULL, n, dp__now_s() + c->o.timeout_s, 0, d);
    free(g.resv);
    if (rc == DP_OK)
        rc = get_report(c, items, n, ust, d);
    free(ust);
    c->cnt.gets++;
    for (size_t i = 0; i < n; i++)
        if (items[i].status == 0)
            c->cnt.get_bytes += items[i].nbytes;
    return rc;
}

int
dp_client_get(dp_client *c, dp_get_item *items, size_t n, dp_detail *d)
{
    if (c == NULL || (items == NULL && n > 0))
        return dp__fail(d, DP_EINVAL, "dp_client_get: NULL argument");
    int rc = dp__client_data_check(c, "get", d);
    if (rc != DP_OK || n == 0)
        return rc;
    if (n > (1u << 24))
        return dp__fail(d, DP_ETOOBIG, "get: %zu keys in one call", n);
    pthread_mutex_lock(&c->mu);
    rc = dp__get_locked(c, items, n, NULL, d);
    pthread_mutex_unlock(&c->mu);
    return rc;
}
