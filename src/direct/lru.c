/*
 * The direct transport's remote LRU: the publishers this transport is
 * connected to (remotes of its endpoint), shared by the fetches that read
 * from them, evicted least recently used first when idle.
 *
 * Design notes
 * ------------
 * - lru holds the connected remotes with the endpoint generation, metadata
 *   version and peer id (a hash of the UCX worker address: which process) they
 *   were added with, a busy count (fetches using it) and a use tick. A fetch
 *   whose metadata is newer, or comes from another process under the same name
 *   (a restarted publisher), re-adds the remote once no other fetch uses it
 *   (waiting on lru_cv meanwhile); only idle entries are evicted; size 0
 *   removes an entry as soon as it is idle; a failed fetch drops its remote
 *   once idle.
 * - lru_mu guards the LRU and its counters, and every add_remote and
 *   remove_remote on the endpoint runs under it, so the LRU and the
 *   endpoint's remotes agree.
 */
#include <stdio.h>
#include <string.h>

#include "direct/direct_int.h"

int
dp__direct_describe_remote(dp_direct *t, const char *name, char **out, dp_detail *d)
{
    pthread_mutex_lock(&t->lru_mu);
    int rc = dp__endpoint_describe_remote(t->ep, name, out, d);
    pthread_mutex_unlock(&t->lru_mu);
    return rc;
}

/* ---- remote LRU (lru_mu held) ---- */

static remote_entry *
lru_find_locked(dp_direct *t, const char *name)
{
    for (size_t i = 0; i < t->lru_n; i++)
        if (strcmp(t->lru[i].name, name) == 0)
            return &t->lru[i];
    return NULL;
}

static void
lru_remove_locked(dp_direct *t, remote_entry *e)
{
    dp__endpoint_remove_remote(t->ep, e->name, NULL);
    t->remote_evictions++;
    size_t i = (size_t)(e - t->lru);
    memmove(t->lru + i, t->lru + i + 1, (t->lru_n - i - 1) * sizeof *t->lru);
    t->lru_n--;
}

/* Evict idle entries, least recently used first, until at most keep remain. */
static void
lru_trim_locked(dp_direct *t, size_t keep)
{
    while (t->lru_n > keep) {
        remote_entry *victim = NULL;
        for (size_t i = 0; i < t->lru_n; i++)
            if (t->lru[i].busy == 0 && (victim == NULL || t->lru[i].tick < victim->tick))
                victim = &t->lru[i];
        if (victim == NULL)
            return;
        lru_remove_locked(t, victim);
    }
}

/*
 * True if md is newer than what e was added with. Both counters only grow in
 * a publisher, so (version, gen) orders its metadata. Older metadata needs no
 * re-add: the object it describes is still published (fetching a freed object
 * is the caller's error), so its regions are still registered and appear, with
 * the same keys, in every later metadata of that publisher.
 */
static bool
newer(const dp__direct_md *md, uint64_t peer, const remote_entry *e)
{
    if (peer != e->peer)
        return true; /* another process under the same name: a restarted publisher */
    if (md->version != e->version)
        return md->version > e->version;
    return md->ep_gen > e->gen;
}

int
dp__direct_lru_acquire(dp_direct *t, const dp__direct_md *md, dp_detail *d)
{
    int rc = DP_OK;
    uint64_t peer = dp__md_peer_id(md->ep_md, md->ep_md_len);
    pthread_mutex_lock(&t->lru_mu);
    remote_entry *e = lru_find_locked(t, md->name);
    while (e != NULL && newer(md, peer, e) && e->busy > 0) {
        pthread_cond_wait(&t->lru_cv, &t->lru_mu);
        e = lru_find_locked(t, md->name);
    }
    if (e != NULL) {
        if (newer(md, peer, e)) {
            /* The publisher's registrations changed: connect again with the new keys. */
            dp__endpoint_remove_remote(t->ep, e->name, NULL);
            rc = dp__endpoint_add_remote(t->ep, md->ep_md, md->ep_md_len, NULL, d);
            if (rc != DP_OK) {
                size_t i = (size_t)(e - t->lru);
                memmove(t->lru + i, t->lru + i + 1, (t->lru_n - i - 1) * sizeof *t->lru);
                t->lru_n--;
                t->remote_evictions++;
                goto out;
            }
            e->gen = md->ep_gen;
            e->version = md->version;
            e->peer = peer;
            e->drop = false;
            t->remote_readds++;
        } else {
            t->remote_hits++;
        }
    } else {
        if (t->lru_max > 0)
            lru_trim_locked(t, (size_t)t->lru_max - 1);
        if (t->lru_n == t->lru_cap) {
            size_t cap = t->lru_cap ? 2 * t->lru_cap : 8;
            remote_entry *nl = realloc(t->lru, cap * sizeof *nl);
            if (nl == NULL) {
                rc = dp__fail(d, DP_ENOMEM, "direct: remote cache");
                goto out;
            }
            t->lru = nl;
            t->lru_cap = cap;
        }
        rc = dp__endpoint_add_remote(t->ep, md->ep_md, md->ep_md_len, NULL, d);
        if (rc != DP_OK)
            goto out;
        e = &t->lru[t->lru_n++];
        memset(e, 0, sizeof *e);
        snprintf(e->name, sizeof e->name, "%s", md->name);
        e->gen = md->ep_gen;
        e->version = md->version;
        e->peer = peer;
        t->remote_adds++;
    }
    e->busy++;
    e->tick = ++t->lru_tick;
out:
    pthread_mutex_unlock(&t->lru_mu);
    return rc;
}

void
dp__direct_lru_release(dp_direct *t, const char *name, bool failed)
{
    pthread_mutex_lock(&t->lru_mu);
    remote_entry *e = lru_find_locked(t, name);
    if (e != NULL) {
        DP_ASSERT(e->busy > 0);
        e->busy--;
        if (failed)
            e->drop = true;
        if (e->busy == 0 && (e->drop || t->lru_max == 0))
            lru_remove_locked(t, e);
        else if (t->lru_max > 0)
            lru_trim_locked(t, (size_t)t->lru_max);
    }
    pthread_cond_broadcast(&t->lru_cv);
    pthread_mutex_unlock(&t->lru_mu);
}
