/*
 * Direct transport: publish buffers under an object id, fetch them from
 * another process with one-sided READ over the endpoint (src/xfer).
 *
 * Design notes
 * ------------
 * Registration cache
 * - regs maps a base address to a regent: a registration of [base, base+len)
 *   with a reference count (one per object or running fetch holding it), or a
 *   pool block holding a copy of the buffer that starts at base. A buffer
 *   inside a registration (same base or contained) shares it; a buffer that
 *   partly overlaps one is refused (the endpoint's regions never overlap).
 * - A registration whose count reaches zero is deregistered and the metadata
 *   version bumps, unless it is permanent (register_permanent) or the endpoint
 *   refuses because a retained transfer touches it: then it stays registered
 *   for good (stuck) and its memory must never be reused.
 * - Publish takes one reference per buffer and undoes, in reverse, exactly the
 *   references it took when anything fails, so blocks and registrations of
 *   other objects are never touched by a failed publish (pool rollback).
 *
 * Fetches
 * - dp_direct_fetch parses the metadata, registers the targets (or allocates
 *   registered memory) and queues a request; worker threads run requests (or
 *   a dp_direct_wait(-1) caller runs its own request if no worker took it yet,
 *   saving two thread hand-offs): they
 *   connect the remote through the LRU, read the object chunk by chunk with
 *   blocking dp_endpoint_transfer calls, and end the request (state END, rc).
 *   Aborts are checked before each chunk; a chunk in flight is never
 *   abandoned, so when a request ends nothing of ours writes into its memory
 *   any more, except transfers the endpoint retained in the graveyard (their
 *   memory is never freed: regions stay registered, own buffers are leaked and
 *   charged with dp_graveyard_retain_buffer).
 * - dp_direct_req_destroy waits for the request to end (aborting it first), so
 *   memory is released only by the caller's thread, never under a transfer.
 * - A request uses its transport (workers, endpoint, cache) until it is
 *   destroyed, so dp_direct_destroy refuses (DP_EBUSY) while the live list
 *   is not empty, checked under mu; it never frees under a request.
 *
 * Remote LRU
 * - lru holds the connected remotes with the endpoint generation, metadata
 *   version and peer id (a hash of the UCX worker address: which process) they
 *   were added with, a busy count (fetches using it) and a use tick. A fetch
 *   whose metadata is newer, or comes from another process under the same name
 *   (a restarted publisher), re-adds the remote once no other fetch uses it;
 *   only idle entries are evicted; size 0 removes an entry as soon as it is
 *   idle; a failed fetch drops its remote once idle.
 *
 * Locks (never nested, each a leaf except for calls into the endpoint, which
 * has its own internal lock and never calls back):
 * - cache_mu: regs, objs, pool, version and the registration counters.
 * - mu + cv + work_cv: the queue, every live request's state, the abort set,
 *   stopping, fetch counters. cv is broadcast when a request ends (waiters);
 *   work_cv is signalled once per queued request (one worker) and broadcast
 *   on stopping, so a fetch does not wake every thread.
 * - lru_mu + lru_cv: the LRU and its counters; add/remove_remote run under it.
 */
#include "direct/direct.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "alloc/slab_alloc.h"
#include "common/common.h"
#include "common/map.h"
#include "dataplane/version.h"
#include "direct/direct_md.h"
#include "xfer/endpoint.h"
#include "xfer/graveyard.h"

#define BACKEND "UCX"
#define DEFAULT_LRU 16
#define DEFAULT_TIMEOUT_S 60.0
#define DEFAULT_CHUNK (64u << 20)
#define DEFAULT_WORKERS 2
#define MAX_WORKERS 64
#define CHUNK_RANGES 256

typedef struct regent {
    uint64_t base, len;
    uint64_t refs;
    uint64_t pool_off; /* pool block offset (pool entries) */
    bool pool;
    bool permanent;
    bool stuck;
} regent;

typedef struct dobj {
    size_t n;
    uint64_t *keys; /* regs keys, one reference each */
} dobj;

enum req_state { REQ_QUEUED = 0, REQ_RUNNING, REQ_END };

struct dp_direct_req {
    dp_direct *t;
    char obj_id[DP_DIRECT_ID_MAX + 1];
    uint8_t *md_bytes;
    dp_direct_md md;
    size_t n;
    dp_range *local;
    uint64_t *target_keys; /* caller targets: regs keys to release */
    bool targets_held;
    void *own_buf;
    /* Under t->mu. */
    int state;
    bool aborted;
    int rc;
    dp_detail det;
    uint64_t done_bytes;
    struct dp_direct_req *qnext;
    struct dp_direct_req *lprev, *lnext; /* live list */
};

typedef struct rment {
    char name[DP_MD_NAME_MAX + 1];
    uint64_t gen, version, busy, tick;
    uint64_t peer; /* dp_md_peer_id: which process this name was added for */
    bool drop;
} rment;

struct dp_direct {
    dp_endpoint *ep;
    char name[DP_MD_NAME_MAX + 1];
    int lru_max;
    double timeout_s;
    uint64_t chunk;
    int n_workers;

    pthread_mutex_t cache_mu;
    dp_map regs; /* u64 base -> regent */
    dp_map objs; /* obj id -> dobj */
    void *pool_base;
    size_t pool_bytes;
    dp_slab_alloc *pool;
    uint64_t version, registers, deregisters, pool_used, pool_blocks;

    pthread_mutex_t mu;
    pthread_cond_t cv;      /* a request ended (waiters) */
    pthread_cond_t work_cv; /* a request was queued, or stopping (workers) */
    dp_direct_req *qhead, *qtail;
    dp_direct_req *live;
    dp_map aborted; /* obj id -> (void *)1 */
    bool stopping;
    double chunk_pause;
    uint64_t fetches, fetch_ok, fetch_failed, fetch_aborted, bytes_fetched;
    uint64_t fetch_stolen; /* run by a waiting caller instead of a worker */
    pthread_t workers[MAX_WORKERS];
    int n_started;

    pthread_mutex_t lru_mu;
    pthread_cond_t lru_cv;
    rment *lru;
    size_t lru_n, lru_cap;
    uint64_t lru_tick;
    uint64_t remote_adds, remote_readds, remote_hits, remote_evictions;

    bool locks_init;
};

static const char *sysfs_root = "/sys";

/*
 * Physical memory of this host. UCX backs memory it allocates with shared
 * memory and populates it: a request larger than the host fills /dev/shm and
 * starves every process, so sizes that come from options or from untrusted
 * metadata are checked against this first.
 */
static uint64_t
phys_bytes(void)
{
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    return pages > 0 && psz > 0 ? (uint64_t)pages * (uint64_t)psz : UINT64_MAX;
}

/* ---- helpers ---- */

static const char *
env_or(const char *name, const char *dflt)
{
    const char *v = getenv(name);
    return v != NULL && *v != '\0' ? v : dflt;
}

static void
memlock_text(char *buf, size_t cap)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_MEMLOCK, &rl) != 0)
        snprintf(buf, cap, "unknown");
    else if (rl.rlim_cur == RLIM_INFINITY)
        snprintf(buf, cap, "unlimited");
    else
        snprintf(buf, cap, "%llu KiB", (unsigned long long)rl.rlim_cur / 1024);
}

/* Turn an endpoint registration failure into one a user can act on. */
static int
reg_fail(dp_detail *d, int rc, const char *what, const void *addr, size_t len)
{
    if (rc == DP_EEXIST)
        return dp_fail_ctx(
            d, rc,
            "direct: registering %s of %zu bytes at %p: it overlaps memory "
            "this transport registered itself (its pool, or the buffers of "
            "a fetch request still alive)",
            what, len, addr);
    char ml[32];
    memlock_text(ml, sizeof ml);
    return dp_fail_ctx(d, rc,
                       "direct (backend " BACKEND "): registering %s of %zu bytes at %p "
                       "failed (check the memlock limit, ulimit -l = %s; UCX_TLS = %s; "
                       "rerun with UCX_LOG_LEVEL=debug)",
                       what, len, addr, ml, env_or("UCX_TLS", "unset"));
}

bool
dp__direct_find_efa(const char *root, char *what, size_t cap)
{
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/class/net", root);
    DIR *dir = opendir(path);
    if (dir != NULL) {
        struct dirent *e;
        while ((e = readdir(dir)) != NULL) {
            if (strncmp(e->d_name, "efa", 3) == 0) {
                snprintf(what, cap, "netdev %s", e->d_name);
                closedir(dir);
                return true;
            }
        }
        closedir(dir);
    }
    snprintf(path, sizeof path, "%s/class/infiniband", root);
    dir = opendir(path);
    if (dir == NULL)
        return false;
    struct dirent *e;
    bool found = false;
    while (!found && (e = readdir(dir)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        if (strncmp(e->d_name, "efa", 3) == 0) {
            snprintf(what, cap, "verbs device %s", e->d_name);
            found = true;
            break;
        }
        /* A broken entry is skipped: it must not stop the scan. */
        char link[PATH_MAX + 320], real[PATH_MAX];
        snprintf(link, sizeof link, "%s/%s/device/driver", path, e->d_name);
        if (strlen(link) >= PATH_MAX || realpath(link, real) == NULL)
            continue;
        const char *slash = strrchr(real, '/');
        if (strcmp(slash != NULL ? slash + 1 : real, "efa") == 0) {
            snprintf(what, cap, "verbs device %s (driver efa)", e->d_name);
            found = true;
        }
    }
    closedir(dir);
    return found;
}

void
dp__direct_set_sysfs_root(const char *root)
{
    sysfs_root = root != NULL ? root : "/sys";
}

int
dp__direct_describe_remote(dp_direct *t, const char *name, char **out, dp_detail *d)
{
    pthread_mutex_lock(&t->lru_mu);
    int rc = dp_endpoint_describe_remote(t->ep, name, out, d);
    pthread_mutex_unlock(&t->lru_mu);
    return rc;
}

void
dp__direct_set_chunk_pause(dp_direct *t, double seconds)
{
    pthread_mutex_lock(&t->mu);
    t->chunk_pause = seconds;
    pthread_mutex_unlock(&t->mu);
}

/* ---- registration cache (cache_mu held) ---- */

/* The registration (not pool) entry covering [addr, addr+len), or an overlap error. */
static int
find_reg_locked(dp_direct *t, uint64_t addr, uint64_t len, regent **out, dp_detail *d)
{
    *out = NULL;
    regent *e = dp_map_get_u64(&t->regs, addr);
    if (e != NULL && !e->pool) {
        if (len <= e->len) {
            *out = e;
            return DP_OK;
        }
        return dp_fail(d, DP_EEXIST,
                       "direct: buffer %#" PRIx64 " of %" PRIu64 " bytes starts a "
                       "registration of only %" PRIu64 " bytes",
                       addr, len, e->len);
    }
    void *v;
    for (size_t it = 0; dp_map_next(&t->regs, &it, NULL, NULL, NULL, &v);) {
        regent *x = v;
        if (x->pool)
            continue;
        if (addr >= x->base && addr + len <= x->base + x->len) {
            *out = x;
            return DP_OK;
        }
        if (addr < x->base + x->len && x->base < addr + len)
            return dp_fail(d, DP_EEXIST,
                           "direct: buffer %#" PRIx64 " of %" PRIu64 " bytes partly "
                           "overlaps the registration %#" PRIx64 " of %" PRIu64 " bytes",
                           addr, len, x->base, x->len);
    }
    return DP_OK;
}

/* Take one reference on a registration covering the buffer, registering it if needed. */
static int
reg_acquire_locked(dp_direct *t, void *addr, size_t len, const char *what, uint64_t *key,
                   dp_detail *d)
{
    uint64_t a = (uint64_t)(uintptr_t)addr;
    regent *e = dp_map_get_u64(&t->regs, a);
    if (e != NULL && e->pool)
        return dp_fail(d, DP_EEXIST,
                       "direct: %s %p is held in a pool block by a published object; "
                       "free that object first",
                       what, addr);
    int rc = find_reg_locked(t, a, len, &e, d);
    if (rc != DP_OK)
        return rc;
    if (e == NULL) {
        e = calloc(1, sizeof *e);
        if (e == NULL)
            return dp_fail(d, DP_ENOMEM, "direct: registration cache entry");
        rc = dp_endpoint_register(t->ep, addr, len, d);
        if (rc != DP_OK) {
            free(e);
            return reg_fail(d, rc, what, addr, len);
        }
        e->base = a;
        e->len = len;
        if (dp_map_put_u64(&t->regs, a, e, NULL) != DP_OK) {
            dp_endpoint_deregister(t->ep, addr, NULL);
            free(e);
            return dp_fail(d, DP_ENOMEM, "direct: registration cache");
        }
        t->registers++;
    }
    e->refs++;
    *key = e->base;
    return DP_OK;
}

/* Drop one reference; deregister (or return the pool block) at zero. */
static void
reg_release_locked(dp_direct *t, uint64_t key)
{
    regent *e = dp_map_get_u64(&t->regs, key);
    DP_ASSERT(e != NULL && e->refs > 0);
    if (--e->refs > 0 || e->permanent || e->stuck)
        return;
    if (e->pool) {
        int frc = dp_slab_alloc_free(t->pool, e->pool_off, NULL);
        DP_ASSERT(frc == DP_OK);
        t->pool_used -= e->len;
        t->pool_blocks--;
    } else {
        dp_detail d;
        dp_detail_clear(&d);
        int rc = dp_endpoint_deregister(t->ep, (void *)(uintptr_t)e->base, &d);
        if (rc != DP_OK) {
            /* A retained transfer touches it: registered for good. */
            DP_LOG_W("direct %s: keeping %#" PRIx64 " registered: %s", t->name, e->base,
                     d.msg);
            e->stuck = true;
            return;
        }
        t->deregisters++;
        t->version++;
    }
    dp_map_del_u64(&t->regs, key);
    free(e);
}

/* Copy a buffer into a pool block (or share the block it already has). */
static int
pool_acquire_locked(dp_direct *t, const dp_direct_buf *b, uint64_t *key, uint64_t *raddr,
                    dp_detail *d)
{
    uint64_t a = (uint64_t)(uintptr_t)b->addr;
    regent *e = dp_map_get_u64(&t->regs, a);
    if (e != NULL && e->pool && b->len <= e->len) {
        e->refs++;
        *key = a;
        *raddr = (uint64_t)(uintptr_t)t->pool_base + e->pool_off;
        return DP_OK;
    }
    if (e != NULL)
        return dp_fail(d, DP_EEXIST,
                       "direct: buffer %p of %zu bytes is pooled with %" PRIu64
                       " bytes by another object",
                       b->addr, b->len, e->len);
    uint64_t off;
    dp_detail ad;
    dp_detail_clear(&ad);
    int rc = dp_slab_alloc_alloc(t->pool, b->len, &off, &ad);
    if (rc != DP_OK) {
        char sz[32], psz[32], used[32];
        dp_fmt_size(b->len, sz, sizeof sz);
        dp_fmt_size(t->pool_bytes, psz, sizeof psz);
        dp_fmt_size(t->pool_used, used, sizeof used);
        int code = rc == DP_EUNITFULL ? DP_EBUSY : rc;
        return dp_fail(d, code,
                       "memory pool cannot take a buffer of %s (pool %s, %s "
                       "held): %s; free objects, grow pool_bytes or publish without a "
                       "pool",
                       sz, psz, used, ad.msg);
    }
    e = calloc(1, sizeof *e);
    if (e == NULL || dp_map_put_u64(&t->regs, a, e, NULL) != DP_OK) {
        free(e);
        dp_slab_alloc_free(t->pool, off, NULL);
        return dp_fail(d, DP_ENOMEM, "direct: registration cache");
    }
    e->base = a;
    e->len = b->len;
    e->pool = true;
    e->pool_off = off;
    e->refs = 1;
    memcpy((uint8_t *)t->pool_base + off, b->addr, b->len);
    t->pool_used += b->len;
    t->pool_blocks++;
    *key = a;
    *raddr = (uint64_t)(uintptr_t)t->pool_base + off;
    return DP_OK;
}

/* ---- remote LRU (lru_mu held) ---- */

static rment *
lru_find_locked(dp_direct *t, const char *name)
{
    for (size_t i = 0; i < t->lru_n; i++)
        if (strcmp(t->lru[i].name, name) == 0)
            return &t->lru[i];
    return NULL;
}

static void
lru_remove_locked(dp_direct *t, rment *e)
{
    dp_endpoint_remove_remote(t->ep, e->name, NULL);
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
        rment *victim = NULL;
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
newer(const dp_direct_md *md, uint64_t peer, const rment *e)
{
    if (peer != e->peer)
        return true; /* another process under the same name: a restarted publisher */
    if (md->version != e->version)
        return md->version > e->version;
    return md->ep_gen > e->gen;
}

/* Make md's remote usable for one fetch (busy + 1). */
static int
lru_acquire(dp_direct *t, const dp_direct_md *md, dp_detail *d)
{
    int rc = DP_OK;
    uint64_t peer = dp_md_peer_id(md->ep_md, md->ep_md_len);
    pthread_mutex_lock(&t->lru_mu);
    rment *e = lru_find_locked(t, md->name);
    while (e != NULL && newer(md, peer, e) && e->busy > 0) {
        pthread_cond_wait(&t->lru_cv, &t->lru_mu);
        e = lru_find_locked(t, md->name);
    }
    if (e != NULL) {
        if (newer(md, peer, e)) {
            /* The publisher's registrations changed: connect again with the new keys. */
            dp_endpoint_remove_remote(t->ep, e->name, NULL);
            rc = dp_endpoint_add_remote(t->ep, md->ep_md, md->ep_md_len, NULL, d);
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
            rment *nl = realloc(t->lru, cap * sizeof *nl);
            if (nl == NULL) {
                rc = dp_fail(d, DP_ENOMEM, "direct: remote cache");
                goto out;
            }
            t->lru = nl;
            t->lru_cap = cap;
        }
        rc = dp_endpoint_add_remote(t->ep, md->ep_md, md->ep_md_len, NULL, d);
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

static void
lru_release(dp_direct *t, const char *name, bool failed)
{
    pthread_mutex_lock(&t->lru_mu);
    rment *e = lru_find_locked(t, name);
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

/* ---- fetch worker ---- */

/* t->mu held. */
static void
set_state(dp_direct_req *r, int state)
{
    r->state = state;
}

static bool
req_aborted(dp_direct_req *r, double *pause)
{
    dp_direct *t = r->t;
    pthread_mutex_lock(&t->mu);
    bool a = r->aborted || t->stopping;
    if (pause != NULL)
        *pause = t->chunk_pause;
    pthread_mutex_unlock(&t->mu);
    return a;
}

static void
release_targets(dp_direct_req *r)
{
    if (!r->targets_held)
        return;
    dp_direct *t = r->t;
    pthread_mutex_lock(&t->cache_mu);
    for (size_t i = r->n; i-- > 0;)
        reg_release_locked(t, r->target_keys[i]);
    pthread_mutex_unlock(&t->cache_mu);
    r->targets_held = false;
}

/* Read r's object; returns the request's result, details in *d. */
static int
run_fetch(dp_direct_req *r, dp_detail *d)
{
    dp_direct *t = r->t;
    const dp_direct_md *md = &r->md;
    double pause = 0;
    if (req_aborted(r, NULL))
        return dp_fail(d, DP_ECANCELED,
                       "direct: fetch of object %s aborted before it started", r->obj_id);
    if (r->n == 0)
        return DP_OK;
    int rc = lru_acquire(t, md, d);
    if (rc != DP_OK) {
        dp_fail_ctx(d, rc,
                    "direct (backend " BACKEND "): cannot connect to publisher %s for "
                    "object %s (check UCX_TLS = %s; rerun with UCX_LOG_LEVEL=debug)",
                    md->name, r->obj_id, env_or("UCX_TLS", "unset"));
        return rc;
    }
    dp_range l[CHUNK_RANGES], rr[CHUNK_RANGES];
    size_t i = 0;
    uint64_t off = 0, done = 0;
    bool xfer_failed = false;
    while (i < r->n) {
        size_t k = 0;
        uint64_t bytes = 0;
        while (i < r->n && k < CHUNK_RANGES && bytes < t->chunk) {
            uint64_t take = DP_MIN(md->descs[i].len - off, t->chunk - bytes);
            l[k] = (dp_range){r->local[i].addr + off, take};
            rr[k] = (dp_range){md->descs[i].addr + off, take};
            k++;
            bytes += take;
            off += take;
            if (off == md->descs[i].len) {
                i++;
                off = 0;
            }
        }
        if (req_aborted(r, &pause)) {
            rc = dp_fail(d, DP_ECANCELED,
                         "direct: fetch of object %s aborted after %" PRIu64
                         " of %" PRIu64 " bytes",
                         r->obj_id, done, md->total_bytes);
            break;
        }
        if (pause > 0)
            dp_sleep_s(pause);
        rc = dp_endpoint_transfer(t->ep, DP_XFER_READ, l, k, rr, k, md->name,
                                  t->timeout_s, d);
        if (rc != DP_OK) {
            xfer_failed = true;
            char tot[32];
            dp_fmt_size(md->total_bytes, tot, sizeof tot);
            dp_fail_ctx(d, rc,
                        "direct (backend " BACKEND "): READ of object %s (%zu buffers, "
                        "%s) from %s failed after %" PRIu64 " bytes; the publisher may "
                        "have died or freed it (UCX_TLS = %s; rerun with "
                        "UCX_LOG_LEVEL=debug)",
                        r->obj_id, r->n, tot, md->name, done, env_or("UCX_TLS", "unset"));
            break;
        }
        done += bytes;
        pthread_mutex_lock(&t->mu);
        r->done_bytes = done;
        pthread_mutex_unlock(&t->mu);
    }
    /* After a failed READ the remote is dropped: the publisher may be gone. */
    lru_release(t, md->name, xfer_failed);
    return rc;
}

/* Take r off the queue if it is still there (mu held); true if it was. */
static bool
dequeue_locked(dp_direct *t, dp_direct_req *r)
{
    dp_direct_req **pp = &t->qhead;
    while (*pp != NULL && *pp != r)
        pp = &(*pp)->qnext;
    if (*pp == NULL)
        return false;
    *pp = r->qnext;
    if (t->qtail == r) {
        t->qtail = NULL;
        for (dp_direct_req *q = t->qhead; q != NULL; q = q->qnext)
            t->qtail = q;
    }
    r->qnext = NULL;
    return true;
}

/*
 * Run r (dequeued, mu held on entry and on return): RUNNING, the fetch
 * outside mu, then END with its result, waking every waiter.
 */
static void
run_req_locked(dp_direct *t, dp_direct_req *r)
{
    set_state(r, REQ_RUNNING);
    pthread_mutex_unlock(&t->mu);

    dp_detail d;
    dp_detail_clear(&d);
    int rc = run_fetch(r, &d);
    release_targets(r);

    pthread_mutex_lock(&t->mu);
    r->rc = rc;
    r->det = d;
    set_state(r, REQ_END);
    if (rc == DP_OK) {
        t->fetch_ok++;
        t->bytes_fetched += r->md.total_bytes;
    } else if (r->aborted) {
        t->fetch_aborted++;
    } else {
        t->fetch_failed++;
    }
    pthread_cond_broadcast(&t->cv);
}

static void *
worker_main(void *arg)
{
    dp_direct *t = arg;
    pthread_mutex_lock(&t->mu);
    for (;;) {
        while (!t->stopping && t->qhead == NULL)
            pthread_cond_wait(&t->work_cv, &t->mu);
        if (t->stopping)
            break;
        dp_direct_req *r = t->qhead;
        dequeue_locked(t, r);
        run_req_locked(t, r);
    }
    pthread_mutex_unlock(&t->mu);
    return NULL;
}

/* ---- public API ---- */

void
dp_direct_opts_init(dp_direct_opts *o)
{
    memset(o, 0, sizeof *o);
    o->remote_cache_size = DEFAULT_LRU;
    o->xfer_timeout_s = DEFAULT_TIMEOUT_S;
    o->chunk_bytes = DEFAULT_CHUNK;
    o->n_workers = DEFAULT_WORKERS;
}

const char *
dp_direct_name(const dp_direct *t)
{
    return t->name;
}

const char *
dp_direct_backend_name(const dp_direct *t)
{
    DP_UNUSED(t);
    return BACKEND;
}

int
dp_direct_create(const dp_direct_opts *opts, dp_direct **out, dp_detail *d)
{
    *out = NULL;
    dp_direct_opts o;
    if (opts != NULL)
        o = *opts;
    else
        memset(&o, 0, sizeof o); /* zero is every default */
    for (size_t i = 0; i < DP_ARRAY_LEN(o.reserved); i++)
        if (o.reserved[i] != 0)
            return dp_fail(d, DP_EINVAL,
                           "direct: dp_direct_opts.reserved[%zu] is not zero (zero the "
                           "struct; a program built against a newer dataplane than %s "
                           "needs that version)",
                           i, DP_VERSION_STRING);
    if (o.n_workers < 0 || o.n_workers > MAX_WORKERS || o.xfer_timeout_s < 0 ||
        !isfinite(o.xfer_timeout_s) ||
        (o.backend != DP_DIRECT_BACKEND_AUTO && o.backend != DP_DIRECT_BACKEND_UCX))
        return dp_fail(d, DP_EINVAL,
                       "direct: bad options (n_workers %d: 0..%d, xfer_timeout_s %g, "
                       "backend %d)",
                       o.n_workers, MAX_WORKERS, o.xfer_timeout_s, (int)o.backend);
    const char *eb = getenv("DP_DIRECT_BACKEND");
    if (eb != NULL && *eb != '\0') {
        if (strcasecmp(eb, "ucx") == 0)
            o.backend = DP_DIRECT_BACKEND_UCX;
        else
            return dp_fail(d, DP_EUNSUPPORTED,
                           "direct: DP_DIRECT_BACKEND=%s: only the UCX backend is "
                           "available in this build (the libfabric backend is not)",
                           eb);
    }
    char efa[300];
    if (o.backend == DP_DIRECT_BACKEND_AUTO &&
        dp__direct_find_efa(sysfs_root, efa, sizeof efa))
        return dp_fail(d, DP_EUNSUPPORTED,
                       "direct: AWS EFA found (%s): EFA wants the libfabric backend, "
                       "which is not available in this build. To use UCX anyway, set "
                       "backend = DP_DIRECT_BACKEND_UCX (or DP_DIRECT_BACKEND=ucx) and "
                       "check UCX_TLS and UCX_NET_DEVICES",
                       efa);

    dp_direct *t = calloc(1, sizeof *t);
    if (t == NULL)
        return dp_fail(d, DP_ENOMEM, "direct: transport object");
    int rc;
    t->lru_max = o.remote_cache_size == 0  ? DEFAULT_LRU
                 : o.remote_cache_size < 0 ? 0 /* DP_DIRECT_REMOTE_CACHE_OFF */
                                           : o.remote_cache_size;
    t->timeout_s = o.xfer_timeout_s > 0 ? o.xfer_timeout_s : DEFAULT_TIMEOUT_S;
    t->chunk = o.chunk_bytes > 0 ? o.chunk_bytes : DEFAULT_CHUNK;
    t->n_workers = o.n_workers > 0 ? o.n_workers : DEFAULT_WORKERS;
    dp_map_init_u64(&t->regs);
    dp_map_init_str(&t->objs);
    dp_map_init_str(&t->aborted);
    pthread_mutex_init(&t->cache_mu, NULL);
    pthread_mutex_init(&t->mu, NULL);
    pthread_cond_init(&t->cv, NULL);
    pthread_cond_init(&t->work_cv, NULL);
    pthread_mutex_init(&t->lru_mu, NULL);
    pthread_cond_init(&t->lru_cv, NULL);
    t->locks_init = true;
    if (o.name != NULL) {
        snprintf(t->name, sizeof t->name, "%s", o.name);
    } else {
        char hex[33];
        if ((rc = dp_random_hex_id(hex, d)) != DP_OK)
            goto fail;
        snprintf(t->name, sizeof t->name, "direct-%.16s", hex);
    }
    dp_endpoint_opts eo;
    dp_endpoint_opts_init(&eo);
    eo.progress_thread = !o.no_progress_thread;
    rc = dp_endpoint_create(t->name, &eo, &t->ep, d);
    if (rc != DP_OK) {
        dp_fail_ctx(d, rc,
                    "direct (backend " BACKEND "): cannot start the endpoint (UCX_TLS = "
                    "%s; rerun with UCX_LOG_LEVEL=debug)",
                    env_or("UCX_TLS", "unset"));
        goto fail;
    }
    if (o.pool_bytes > phys_bytes() / 2) {
        char a[32], b[32];
        rc = dp_fail(d, DP_EINVAL,
                     "direct: a memory pool of %s (%zu bytes) exceeds half of this "
                     "host's %s of memory",
                     dp_fmt_size(o.pool_bytes, a, sizeof a), o.pool_bytes,
                     dp_fmt_size(phys_bytes(), b, sizeof b));
        goto fail;
    }
    if (o.pool_bytes > 0) {
        rc = dp_endpoint_alloc(t->ep, o.pool_bytes, &t->pool_base, d);
        if (rc != DP_OK) {
            reg_fail(d, rc, "the memory pool", NULL, o.pool_bytes);
            goto fail;
        }
        t->pool_bytes = o.pool_bytes;
        if ((rc = dp_slab_alloc_create(o.pool_bytes, 64, &t->pool, d)) != DP_OK)
            goto fail;
    }
    for (int i = 0; i < t->n_workers; i++) {
        int e = pthread_create(&t->workers[i], NULL, worker_main, t);
        if (e != 0) {
            rc = dp_fail_sys(d, e, "direct: starting fetch worker %d", i);
            goto fail;
        }
        t->n_started++;
    }
    *out = t;
    return DP_OK;
fail:
    dp_direct_destroy(t, NULL);
    return rc;
}

int
dp_direct_destroy(dp_direct *t, dp_detail *d)
{
    if (t == NULL)
        return DP_OK;
    if (t->locks_init) {
        pthread_mutex_lock(&t->mu);
        if (t->live != NULL) {
            size_t n = 0;
            for (dp_direct_req *r = t->live; r != NULL; r = r->lnext)
                n++;
            int rc = dp_fail(d, DP_EBUSY,
                             "direct %s: %zu fetch request%s still alive (object %s): "
                             "dp_direct_req_destroy them before destroying the transport",
                             t->name, n, n == 1 ? " is" : "s are", t->live->obj_id);
            pthread_mutex_unlock(&t->mu);
            return rc;
        }
        /* No request lives: the queue is empty and no waiter runs a fetch. */
        t->stopping = true;
        pthread_cond_broadcast(&t->work_cv);
        pthread_mutex_unlock(&t->mu);
    }
    for (int i = 0; i < t->n_started; i++)
        pthread_join(t->workers[i], NULL);
    void *v;
    for (size_t it = 0; dp_map_next(&t->objs, &it, NULL, NULL, NULL, &v);) {
        dobj *o = v;
        free(o->keys);
        free(o);
    }
    for (size_t it = 0; dp_map_next(&t->regs, &it, NULL, NULL, NULL, &v);)
        free(v);
    dp_map_fini(&t->objs);
    dp_map_fini(&t->regs);
    dp_map_fini(&t->aborted);
    /* The endpoint deregisters everything, keeping what retained transfers touch. */
    dp_endpoint_destroy(t->ep);
    dp_slab_alloc_destroy(t->pool);
    free(t->lru);
    if (t->locks_init) {
        pthread_mutex_destroy(&t->cache_mu);
        pthread_mutex_destroy(&t->mu);
        pthread_cond_destroy(&t->cv);
        pthread_cond_destroy(&t->work_cv);
        pthread_mutex_destroy(&t->lru_mu);
        pthread_cond_destroy(&t->lru_cv);
    }
    free(t);
    return DP_OK;
}

int
dp_direct_register_permanent(dp_direct *t, void *addr, size_t len, dp_detail *d)
{
    if (addr == NULL || len == 0)
        return dp_fail(d, DP_EINVAL, "direct: register_permanent needs memory (%p, %zu)",
                       addr, len);
    uint64_t key;
    pthread_mutex_lock(&t->cache_mu);
    int rc = reg_acquire_locked(t, addr, len, "permanent buffer", &key, d);
    if (rc == DP_OK) {
        regent *e = dp_map_get_u64(&t->regs, key);
        e->permanent = true;
        e->refs--;
    }
    pthread_mutex_unlock(&t->cache_mu);
    return rc;
}

int
dp_direct_publish(dp_direct *t, const char *obj_id, const dp_direct_buf *bufs, size_t n,
                  uint8_t **md, size_t *md_len, dp_detail *d)
{
    *md = NULL;
    *md_len = 0;
    size_t idlen = obj_id != NULL ? strlen(obj_id) : 0;
    int rc = dp__direct_check_id(obj_id, idlen, d);
    if (rc != DP_OK)
        return rc;
    if (n > DP_DIRECT_BUFS_MAX || (n > 0 && bufs == NULL))
        return dp_fail(d, DP_EINVAL, "direct: publish of %zu buffers (max %u)", n,
                       DP_DIRECT_BUFS_MAX);
    for (size_t i = 0; i < n; i++)
        if (bufs[i].addr == NULL || bufs[i].len == 0)
            return dp_fail(d, DP_EINVAL,
                           "direct: object %s buffer %zu is empty (%p, %zu)", obj_id, i,
                           bufs[i].addr, bufs[i].len);
    dobj *o = calloc(1, sizeof *o);
    dp_direct_desc *descs = calloc(n ? n : 1, sizeof *descs);
    uint64_t *keys = calloc(n ? n : 1, sizeof *keys);
    uint8_t *emd = NULL;
    size_t emd_len = 0, taken = 0;
    dp_buf out;
    dp_buf_init(&out);
    if (o == NULL || descs == NULL || keys == NULL) {
        free(o);
        free(descs);
        free(keys);
        return dp_fail(d, DP_ENOMEM, "direct: publish of %zu buffers", n);
    }
    pthread_mutex_lock(&t->cache_mu);
    if (dp_map_get(&t->objs, obj_id, idlen) != NULL) {
        rc = dp_fail(d, DP_EEXIST, "direct: object %s is already published", obj_id);
        goto fail;
    }
    /* The pool takes the buffers only if none has a registration of its own. */
    bool use_pool = t->pool != NULL;
    for (size_t i = 0; use_pool && i < n; i++) {
        regent *e = NULL;
        if (find_reg_locked(t, (uint64_t)(uintptr_t)bufs[i].addr, bufs[i].len, &e,
                            NULL) != DP_OK ||
            e != NULL)
            use_pool = false;
    }
    for (taken = 0; taken < n; taken++) {
        const dp_direct_buf *b = &bufs[taken];
        if (use_pool) {
            rc = pool_acquire_locked(t, b, &keys[taken], &descs[taken].addr, d);
        } else {
            rc = reg_acquire_locked(t, b->addr, b->len, "buffer", &keys[taken], d);
            descs[taken].addr = (uint64_t)(uintptr_t)b->addr;
        }
        if (rc != DP_OK) {
            dp_fail_ctx(d, rc, "direct: publish %s, buffer %zu of %zu", obj_id, taken, n);
            goto fail;
        }
        descs[taken].len = b->len;
    }
    if ((rc = dp_endpoint_metadata(t->ep, &emd, &emd_len, d)) != DP_OK ||
        (rc = dp__direct_md_encode(&out, obj_id, BACKEND, t->name, t->version, emd,
                                   emd_len, descs, n, d)) != DP_OK)
        goto fail;
    o->n = n;
    o->keys = keys;
    if (dp_map_put(&t->objs, obj_id, idlen, o, NULL) != DP_OK) {
        rc = dp_fail(d, DP_ENOMEM, "direct: object table");
        goto fail;
    }
    pthread_mutex_unlock(&t->cache_mu);
    free(emd);
    free(descs);
    *md = dp_buf_steal(&out, md_len);
    return DP_OK;
fail:
    /* Undo exactly what this call took, newest first. */
    while (taken-- > 0)
        reg_release_locked(t, keys[taken]);
    pthread_mutex_unlock(&t->cache_mu);
    dp_buf_fini(&out);
    free(emd);
    free(descs);
    free(keys);
    free(o);
    return rc;
}

int
dp_direct_free(dp_direct *t, const char *obj_id, dp_detail *d)
{
    size_t idlen = obj_id != NULL ? strlen(obj_id) : 0;
    pthread_mutex_lock(&t->cache_mu);
    dobj *o = obj_id != NULL ? dp_map_del(&t->objs, obj_id, idlen) : NULL;
    if (o == NULL) {
        pthread_mutex_unlock(&t->cache_mu);
        return dp_fail(d, DP_ENOTFOUND, "direct: object %s is not published",
                       obj_id != NULL ? obj_id : "(null)");
    }
    for (size_t i = o->n; i-- > 0;)
        reg_release_locked(t, o->keys[i]);
    pthread_mutex_unlock(&t->cache_mu);
    free(o->keys);
    free(o);
    return DP_OK;
}

static void
req_free(dp_direct_req *r)
{
    if (r == NULL)
        return;
    dp_direct *t = r->t;
    release_targets(r);
    if (r->own_buf != NULL) {
        dp_detail d;
        dp_detail_clear(&d);
        if (dp_endpoint_deregister(t->ep, r->own_buf, &d) != DP_OK) {
            /* A retained transfer may still write into it: never freed. */
            uint64_t total = 0;
            for (size_t i = 0; i < r->n; i++)
                total += DP_ALIGN_UP(r->local[i].nbytes, 64);
            dp_graveyard_retain_buffer(total);
            DP_LOG_W("direct %s: fetch buffer of object %s kept for good: %s", t->name,
                     r->obj_id, d.msg);
        }
    }
    dp__direct_md_fini(&r->md);
    free(r->md_bytes);
    free(r->local);
    free(r->target_keys);
    free(r);
}

int
dp_direct_fetch(dp_direct *t, const char *obj_id, const void *md, size_t md_len,
                const dp_direct_buf *targets, size_t n_targets, dp_direct_req **out,
                dp_detail *d)
{
    *out = NULL;
    size_t idlen = obj_id != NULL ? strlen(obj_id) : 0;
    int rc = dp__direct_check_id(obj_id, idlen, d);
    if (rc != DP_OK)
        return rc;
    if (md == NULL || md_len == 0)
        return dp_fail(d, DP_EINVAL, "direct: fetch of %s without metadata", obj_id);
    dp_direct_req *r = calloc(1, sizeof *r);
    if (r == NULL)
        return dp_fail(d, DP_ENOMEM, "direct: fetch request");
    r->t = t;
    snprintf(r->obj_id, sizeof r->obj_id, "%s", obj_id);
    r->md_bytes = malloc(md_len);
    if (r->md_bytes == NULL) {
        rc = dp_fail(d, DP_ENOMEM, "direct: %zu bytes of metadata", md_len);
        goto fail;
    }
    memcpy(r->md_bytes, md, md_len);
    if ((rc = dp__direct_md_parse(r->md_bytes, md_len, &r->md, d)) != DP_OK)
        goto fail;
    if (strcmp(r->md.obj_id, obj_id) != 0) {
        rc = dp_fail(d, DP_EINVAL, "direct: fetch of %s with the metadata of object %s",
                     obj_id, r->md.obj_id);
        goto fail;
    }
    r->n = r->md.n_descs;
    if (targets != NULL && n_targets != r->n) {
        rc = dp_fail(d, DP_EINVAL, "direct: object %s has %zu buffers, %zu targets given",
                     obj_id, r->n, n_targets);
        goto fail;
    }
    r->local = calloc(r->n ? r->n : 1, sizeof *r->local);
    r->target_keys = calloc(r->n ? r->n : 1, sizeof *r->target_keys);
    if (r->local == NULL || r->target_keys == NULL) {
        rc = dp_fail(d, DP_ENOMEM, "direct: fetch of %zu buffers", r->n);
        goto fail;
    }
    for (size_t i = 0; targets != NULL && i < r->n; i++)
        if (targets[i].addr == NULL || targets[i].len != r->md.descs[i].len) {
            rc = dp_fail(d, DP_EINVAL,
                         "direct: object %s buffer %zu has %" PRIu64
                         " bytes, target has %zu at %p",
                         obj_id, i, r->md.descs[i].len, targets[i].len, targets[i].addr);
            goto fail;
        }

    if (targets != NULL) {
        size_t k;
        pthread_mutex_lock(&t->cache_mu);
        for (k = 0; k < r->n; k++) {
            rc = reg_acquire_locked(t, targets[k].addr, targets[k].len, "fetch target",
                                    &r->target_keys[k], d);
            if (rc != DP_OK)
                break;
            r->local[k] =
                (dp_range){(uint64_t)(uintptr_t)targets[k].addr, targets[k].len};
        }
        if (rc != DP_OK)
            while (k-- > 0)
                reg_release_locked(t, r->target_keys[k]);
        pthread_mutex_unlock(&t->cache_mu);
        if (rc != DP_OK)
            goto fail;
        r->targets_held = true;
    } else if (r->n > 0) {
        /* Each length is bounded first, so the sum cannot wrap (metadata is
         * from outside). */
        uint64_t total = 0, limit = phys_bytes() / 2;
        for (size_t i = 0; i < r->n && total <= limit; i++)
            total += r->md.descs[i].len > limit ? limit + 1
                                                : DP_ALIGN_UP(r->md.descs[i].len, 64);
        if (total > SIZE_MAX || total > limit) {
            char a[32];
            rc = dp_fail(d, DP_ETOOBIG,
                         "direct: object %s needs %" PRIu64 " bytes, more than half of "
                         "this host's %s of memory: fetch it into targets of your own",
                         obj_id, total, dp_fmt_size(phys_bytes(), a, sizeof a));
            goto fail;
        }
        rc = dp_endpoint_alloc(t->ep, (size_t)total, &r->own_buf, d);
        if (rc != DP_OK) {
            reg_fail(d, rc, "the fetch buffer", NULL, (size_t)total);
            r->own_buf = NULL;
            goto fail;
        }
        uint64_t off = 0;
        for (size_t i = 0; i < r->n; i++) {
            r->local[i] =
                (dp_range){(uint64_t)(uintptr_t)r->own_buf + off, r->md.descs[i].len};
            off += DP_ALIGN_UP(r->md.descs[i].len, 64);
        }
    }

    /*
     * A pending abort of this id fails this fetch (and is used up). Checked in
     * the same critical section that makes the request live, so an abort in
     * between either finds the request or leaves its mark for this check.
     */
    pthread_mutex_lock(&t->mu);
    if (t->stopping) {
        pthread_mutex_unlock(&t->mu);
        rc = dp_fail(d, DP_ECLOSED, "direct: transport is being destroyed");
        goto fail;
    }
    if (dp_map_del(&t->aborted, obj_id, idlen) != NULL) {
        pthread_mutex_unlock(&t->mu);
        rc = dp_fail(d, DP_ECANCELED, "direct: fetch of object %s aborted", obj_id);
        goto fail;
    }
    set_state(r, REQ_QUEUED);
    r->lnext = t->live;
    if (t->live != NULL)
        t->live->lprev = r;
    t->live = r;
    if (t->qtail != NULL)
        t->qtail->qnext = r;
    else
        t->qhead = r;
    t->qtail = r;
    t->fetches++;
    pthread_cond_signal(&t->work_cv); /* one worker; waiters wait for END only */
    pthread_mutex_unlock(&t->mu);
    *out = r;
    return DP_OK;
fail:
    req_free(r);
    return rc;
}

int
dp_direct_wait(dp_direct_req *r, double timeout_s, dp_detail *d)
{
    dp_direct *t = r->t;
    int rc;
    struct timespec ts;
    bool timed = timeout_s > 0 && isfinite(timeout_s);
    if (timed) {
        clock_gettime(CLOCK_REALTIME, &ts);
        double s = (double)ts.tv_sec + (double)ts.tv_nsec / 1e9 + timeout_s;
        ts.tv_sec = (time_t)s;
        ts.tv_nsec = (long)((s - (double)ts.tv_sec) * 1e9);
        if (ts.tv_nsec >= 1000000000L)
            ts.tv_nsec = 999999999L;
    }
    pthread_mutex_lock(&t->mu);
    /*
     * A wait for ever on a request no worker took yet runs it here: no hand-off
     * to a worker and back (most of a small fetch's time). A bounded wait
     * leaves it to the workers, so that it can return in time.
     */
    if (timeout_s < 0 && r->state == REQ_QUEUED && !t->stopping && dequeue_locked(t, r)) {
        t->fetch_stolen++;
        run_req_locked(t, r);
    }
    for (;;) {
        if (r->state == REQ_END) {
            rc = r->rc;
            if (rc != DP_OK && d != NULL)
                *d = r->det;
            break;
        }
        if (timeout_s == 0) {
            rc = DP_ETIMEDOUT;
            break;
        }
        if (timed) {
            if (pthread_cond_timedwait(&t->cv, &t->mu, &ts) == ETIMEDOUT &&
                r->state != REQ_END) {
                rc = DP_ETIMEDOUT;
                break;
            }
        } else {
            pthread_cond_wait(&t->cv, &t->mu);
        }
    }
    uint64_t done = r->done_bytes;
    bool ended = r->state == REQ_END;
    pthread_mutex_unlock(&t->mu);
    if (rc == DP_ETIMEDOUT && !ended)
        return dp_fail(d, DP_ETIMEDOUT,
                       "direct: fetch of object %s still running after %gs (%" PRIu64
                       " of %" PRIu64 " bytes)",
                       r->obj_id, timeout_s, done, r->md.total_bytes);
    return rc;
}

bool
dp_direct_req_ended(dp_direct_req *r)
{
    pthread_mutex_lock(&r->t->mu);
    bool e = r->state == REQ_END;
    pthread_mutex_unlock(&r->t->mu);
    return e;
}

void
dp_direct_req_progress(dp_direct_req *r, uint64_t *done, uint64_t *total)
{
    pthread_mutex_lock(&r->t->mu);
    if (done != NULL)
        *done = r->done_bytes;
    pthread_mutex_unlock(&r->t->mu);
    if (total != NULL)
        *total = r->md.total_bytes;
}

size_t
dp_direct_req_count(const dp_direct_req *r)
{
    return r->n;
}

int
dp_direct_req_buffer(const dp_direct_req *r, size_t i, void **addr, size_t *len)
{
    if (i >= r->n)
        return DP_EINVAL;
    *addr = (void *)(uintptr_t)r->local[i].addr;
    *len = (size_t)r->local[i].nbytes;
    return DP_OK;
}

void
dp_direct_req_destroy(dp_direct_req *r)
{
    if (r == NULL)
        return;
    dp_direct *t = r->t;
    pthread_mutex_lock(&t->mu);
    if (r->state == REQ_QUEUED) {
        dequeue_locked(t, r);
        r->rc = DP_ECANCELED;
        set_state(r, REQ_END);
        t->fetch_aborted++;
    }
    r->aborted = true;
    while (r->state != REQ_END)
        pthread_cond_wait(&t->cv, &t->mu);
    if (r->lprev != NULL)
        r->lprev->lnext = r->lnext;
    else
        t->live = r->lnext;
    if (r->lnext != NULL)
        r->lnext->lprev = r->lprev;
    pthread_mutex_unlock(&t->mu);
    req_free(r);
}

int
dp_direct_abort(dp_direct *t, const char *obj_id, dp_detail *d)
{
    size_t idlen = obj_id != NULL ? strlen(obj_id) : 0;
    int rc = dp__direct_check_id(obj_id, idlen, d);
    if (rc != DP_OK)
        return rc;
    pthread_mutex_lock(&t->mu);
    bool hit = false;
    for (dp_direct_req *r = t->live; r != NULL; r = r->lnext) {
        if (r->state != REQ_END && strcmp(r->obj_id, obj_id) == 0) {
            r->aborted = true;
            hit = true;
        }
    }
    if (!hit)
        rc = dp_map_put(&t->aborted, obj_id, idlen, (void *)1, NULL);
    pthread_mutex_unlock(&t->mu);
    if (rc != DP_OK)
        return dp_fail(d, DP_ENOMEM, "direct: abort set");
    return DP_OK;
}

bool
dp_direct_touches_unfinished(dp_direct *t, const void *addr, size_t len)
{
    return dp_endpoint_touches_unfinished(t->ep, addr, len);
}

int
dp_direct_md_describe(const void *md, size_t md_len, size_t *n, uint64_t *sizes,
                      size_t cap, dp_detail *d)
{
    dp_direct_md m;
    int rc = dp__direct_md_parse(md, md_len, &m, d);
    if (rc != DP_OK)
        return rc;
    *n = m.n_descs;
    for (size_t i = 0; i < m.n_descs && i < cap; i++)
        sizes[i] = m.descs[i].len;
    dp__direct_md_fini(&m);
    return DP_OK;
}

void
dp_direct_get_stats(dp_direct *t, dp_direct_stats *st)
{
    memset(st, 0, sizeof *st);
    pthread_mutex_lock(&t->cache_mu);
    st->version = t->version;
    st->objects = dp_map_len(&t->objs);
    void *v;
    for (size_t it = 0; dp_map_next(&t->regs, &it, NULL, NULL, NULL, &v);) {
        regent *e = v;
        if (!e->pool) {
            st->registrations++;
            st->registered_bytes += e->len;
        }
    }
    st->registers = t->registers;
    st->deregisters = t->deregisters;
    st->pool_bytes = t->pool_bytes;
    st->pool_used = t->pool_used;
    st->pool_blocks = t->pool_blocks;
    pthread_mutex_unlock(&t->cache_mu);
    pthread_mutex_lock(&t->mu);
    st->fetches = t->fetches;
    st->fetch_ok = t->fetch_ok;
    st->fetch_failed = t->fetch_failed;
    st->fetch_aborted = t->fetch_aborted;
    st->fetch_by_waiter = t->fetch_stolen;
    st->bytes_fetched = t->bytes_fetched;
    pthread_mutex_unlock(&t->mu);
    pthread_mutex_lock(&t->lru_mu);
    st->remote_adds = t->remote_adds;
    st->remote_readds = t->remote_readds;
    st->remote_hits = t->remote_hits;
    st->remote_evictions = t->remote_evictions;
    st->remotes_cached = t->lru_n;
    pthread_mutex_unlock(&t->lru_mu);
}
