/*
 * The process-wide graveyard (see graveyard.h).
 *
 * Design notes:
 * - State: the retained entries (owner, a copy of its local ranges, bytes;
 *   kept reachable from a global so leak checkers see the owners as live),
 *   the charged bytes, the limit, the poisoned flag, and the union of the
 *   live entries' local ranges as a set of disjoint, non-adjacent ranges
 *   (common/ranges.h: a sorted array; merging inserts, binary-search
 *   lookups). Retained transfers are rare, so inserting with memmove is fine.
 * - An entry leaves only when its owner tells (dp__graveyard_release: the
 *   endpoint saw UCX complete every request of it); the interval set is then
 *   rebuilt from the entries that remain, so ranges shared with another
 *   retained transfer stay covered. Releases are rarer still.
 * - One mutex (gy_mu) guards all of it. It is a leaf lock: callers may hold
 *   their own locks (the endpoint's) when calling in, and nothing here calls
 *   out while holding it, except logging.
 */
#include "graveyard.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "common/ranges.h"

static pthread_mutex_t gy_mu = PTHREAD_MUTEX_INITIALIZER;
static bool gy_limit_set;
static uint64_t gy_max = DP_GRAVEYARD_DEFAULT_MAX_BYTES;
static uint64_t gy_bytes;
static bool gy_poisoned;
typedef struct entry {
    void *owner;
    dp__range *ranges; /* a copy of its local ranges (NULL if none was kept) */
    size_t n;
    uint64_t bytes;
} entry;

static entry *gy_ents;
static size_t gy_n_ents, gy_cap_ents;
static size_t gy_entries, gy_released;
static dp__ranges gy_iv; /* the union of the entries' ranges */

static void
limit_init_locked(void)
{
    if (gy_limit_set)
        return;
    gy_limit_set = true;
    const char *e = getenv("DP_GRAVEYARD_MAX_BYTES");
    if (e != NULL && *e != '\0') {
        uint64_t v;
        dp_detail det;
        if (dp__parse_size(e, &v, "DP_GRAVEYARD_MAX_BYTES", &det) == DP_OK)
            gy_max = v;
        else
            DP_LOG_W("graveyard: ignoring %s", det.msg);
    }
}

static void
poison_check_locked(void)
{
    if (!gy_poisoned && gy_bytes > gy_max) {
        gy_poisoned = true;
        DP_LOG_E("graveyard: %" PRIu64
                 " bytes retained by unfinished transfers, limit %" PRIu64
                 ": process poisoned, every later transfer fails",
                 gy_bytes, gy_max);
    }
}

void
dp__graveyard_retain(void *owner, const dp__range *local, size_t n, const char *what)
{
    pthread_mutex_lock(&gy_mu);
    limit_init_locked();
    bool ok = true;
    entry *e = NULL;
    if (gy_n_ents == gy_cap_ents) {
        size_t cap = gy_cap_ents ? gy_cap_ents * 2 : 16;
        entry *p = realloc(gy_ents, cap * sizeof *p);
        if (p != NULL) {
            gy_ents = p;
            gy_cap_ents = cap;
        }
    }
    if (gy_n_ents < gy_cap_ents) {
        e = &gy_ents[gy_n_ents++];
        *e = (entry){.owner = owner};
        if (n > 0 && (e->ranges = malloc(n * sizeof *e->ranges)) != NULL) {
            memcpy(e->ranges, local, n * sizeof *e->ranges);
            e->n = n;
        }
        /* Without its ranges, the entry can never be released (ok stays). */
        if (n > 0 && e->ranges == NULL)
            e->owner = NULL;
    } else {
        ok = false;
    }
    uint64_t charged = 0;
    for (size_t i = 0; i < n; i++) {
        if (dp__ranges_merge(&gy_iv, local[i].addr, local[i].nbytes) != DP_OK)
            ok = false;
        charged += local[i].nbytes;
    }
    gy_bytes = gy_bytes + charged < gy_bytes ? UINT64_MAX : gy_bytes + charged;
    if (e != NULL)
        e->bytes = charged;
    gy_entries++;
    DP_LOG_W("graveyard: retained %s: %zu local ranges, %" PRIu64 " bytes (total %" PRIu64
             " of %" PRIu64 ")",
             what ? what : "transfer", n, charged, gy_bytes, gy_max);
    if (!ok && !gy_poisoned) {
        gy_poisoned = true;
        DP_LOG_E("graveyard: out of memory recording an unfinished transfer: process "
                 "poisoned");
    }
    poison_check_locked();
    pthread_mutex_unlock(&gy_mu);
}

bool
dp__graveyard_release(void *owner)
{
    if (owner == NULL)
        return false;
    pthread_mutex_lock(&gy_mu);
    size_t i = 0;
    while (i < gy_n_ents && gy_ents[i].owner != owner)
        i++;
    if (i == gy_n_ents) {
        pthread_mutex_unlock(&gy_mu);
        return false;
    }
    entry e = gy_ents[i];
    gy_ents[i] = gy_ents[--gy_n_ents];
    gy_bytes = e.bytes <= gy_bytes ? gy_bytes - e.bytes : 0;
    gy_entries--;
    gy_released++;
    free(e.ranges);
    /* Rebuild the interval set from the entries that remain. */
    dp__ranges_clear(&gy_iv);
    bool ok = true;
    for (size_t k = 0; k < gy_n_ents; k++)
        for (size_t j = 0; j < gy_ents[k].n; j++) {
            const dp__range *r = &gy_ents[k].ranges[j];
            ok = dp__ranges_merge(&gy_iv, r->addr, r->nbytes) == DP_OK && ok;
        }
    if (!ok && !gy_poisoned) {
        gy_poisoned = true;
        DP_LOG_E("graveyard: out of memory rebuilding the retained ranges: process "
                 "poisoned");
    }
    pthread_mutex_unlock(&gy_mu);
    return true;
}

void
dp__graveyard_release_buffer(uint64_t nbytes)
{
    pthread_mutex_lock(&gy_mu);
    gy_bytes = nbytes <= gy_bytes ? gy_bytes - nbytes : 0;
    pthread_mutex_unlock(&gy_mu);
}

size_t
dp__graveyard_released(void)
{
    pthread_mutex_lock(&gy_mu);
    size_t v = gy_released;
    pthread_mutex_unlock(&gy_mu);
    return v;
}

void
dp__graveyard_retain_buffer(uint64_t nbytes)
{
    pthread_mutex_lock(&gy_mu);
    limit_init_locked();
    gy_bytes = gy_bytes + nbytes < gy_bytes ? UINT64_MAX : gy_bytes + nbytes;
    poison_check_locked();
    pthread_mutex_unlock(&gy_mu);
}

int
dp__graveyard_check(dp_detail *d)
{
    pthread_mutex_lock(&gy_mu);
    bool p = gy_poisoned;
    uint64_t bytes = gy_bytes, max = gy_max;
    size_t entries = gy_entries;
    pthread_mutex_unlock(&gy_mu);
    if (!p)
        return DP_OK;
    return dp__fail(d, DP_EFATAL,
                    "process poisoned: %zu unfinished transfers retain %" PRIu64
                    " bytes, limit %" PRIu64
                    " (DP_GRAVEYARD_MAX_BYTES); restart the process",
                    entries, bytes, max);
}

bool
dp__graveyard_touches(uint64_t addr, uint64_t nbytes)
{
    if (nbytes == 0)
        return false;
    pthread_mutex_lock(&gy_mu);
    bool hit = dp__ranges_overlap(&gy_iv, addr, nbytes) != NULL;
    pthread_mutex_unlock(&gy_mu);
    return hit;
}

void
dp__graveyard_set_max_bytes(uint64_t max_bytes)
{
    pthread_mutex_lock(&gy_mu);
    gy_limit_set = true;
    gy_max = max_bytes;
    poison_check_locked();
    pthread_mutex_unlock(&gy_mu);
}

uint64_t
dp__graveyard_max_bytes(void)
{
    pthread_mutex_lock(&gy_mu);
    limit_init_locked();
    uint64_t v = gy_max;
    pthread_mutex_unlock(&gy_mu);
    return v;
}

uint64_t
dp__graveyard_bytes(void)
{
    pthread_mutex_lock(&gy_mu);
    uint64_t v = gy_bytes;
    pthread_mutex_unlock(&gy_mu);
    return v;
}

size_t
dp__graveyard_entries(void)
{
    pthread_mutex_lock(&gy_mu);
    size_t v = gy_entries;
    pthread_mutex_unlock(&gy_mu);
    return v;
}

bool
dp__graveyard_poisoned(void)
{
    pthread_mutex_lock(&gy_mu);
    bool v = gy_poisoned;
    pthread_mutex_unlock(&gy_mu);
    return v;
}
