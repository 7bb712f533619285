/*
 * A get with replicas (docs/design.md, "Replicas"): each key asked of its
 * row's units in turn, within the call, until one has it; a unit whose
 * process is gone counts as missing the key, not as unreachable. get.c runs
 * each turn (dp__get_pass); get_int.h holds what they share.
 */
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
    uint8_t *gone_n; /* per key: its units found gone */
    int8_t *gone;    /* per unit: gone (1), not (0), not probed (-1) */
} turns;

/*
 * With replicas: the keys that failed on the row's replica turn - 1 asked of
 * the next one, in a share of what is left of the budget. first_fail keeps a
 * key's first failure other than "missing", so a key missing on one replica
 * and unreachable on a live one reports the latter (it may be there).
 */
static int
get_next_replica(const dp__get_ctx *g, dp_get_item *items, size_t n, double deadline,
                 uint32_t turn, turns *t, dp_detail *d)
{
    dp_client *c = g->c;
    size_t m = 0;
    for (size_t i = 0; i < n; i++)
        m += dp__get_falls_back(items[i].status);
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
        if (dp__get_falls_back(items[i].status)) {
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

int
dp__get_turns(const dp__get_ctx *g, dp_get_item *items, size_t n, dp_detail *d)
{
    dp_client *c = g->c;
    uint32_t R = dp__client_replicas(c);
    double t0 = dp__now_s(), deadline = t0 + c->o.timeout_s;
    turns t = {calloc(n > 0 ? n : 1, sizeof *t.first_fail),
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
    free(t.gone_n);
    free(t.gone);
    return rc;
}
