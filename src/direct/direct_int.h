/*
 * Shared by the direct transport's own files only: struct dp_direct, its
 * registration cache entries, objects, fetch requests and remote LRU
 * entries, and the calls between the files. The API is
 * include/dataplane/direct.h (test hooks: direct.h); nothing outside
 * src/direct includes this header.
 *
 * Design notes
 * ------------
 * Files. direct.c: the transport itself (options, create/destroy, names,
 * stats) and the EFA probe. publish.c: permanent registrations, publish and
 * free. fetch.c: fetch requests (fetch, wait, cancel, destroy, abort, the
 * request accessors), the fetch buffers kept for reuse, and describing
 * metadata. regcache.c: the registration cache and the pool. lru.c: the
 * remote LRU. worker.c: the fetch workers (running a request, chunk by
 * chunk).
 *
 * Ownership. The transport owns its endpoint, the pool and every cache
 * entry, object and LRU entry. A request is the caller's from
 * dp_direct_fetch to dp_direct_req_destroy; while it lives it holds
 * references on its targets' registrations (or owns a buffer from the
 * endpoint) and uses the transport, which therefore refuses to be destroyed.
 *
 * Locks (never nested, each a leaf except for calls into the endpoint, which
 * has its own internal lock and never calls back):
 * - cache_mu: regs, reg_ranges, objs, pool, version and the registration
 *   counters.
 * - mu + cv + work_cv: the queue, every live request's state, the abort set,
 *   stopping, fetch counters. cv is broadcast when a request ends (waiters);
 *   work_cv is signalled once per queued request (one worker) and broadcast
 *   on stopping, so a fetch does not wake every thread.
 * - lru_mu + lru_cv: the LRU and its counters; add/remove_remote run under it.
 * Functions named *_locked are called with the lock of their part held:
 * cache_mu for the cache, mu for the queue and requests, lru_mu for the LRU.
 */
#ifndef DP_DIRECT_DIRECT_INT_H
#define DP_DIRECT_DIRECT_INT_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "alloc/slab_alloc.h"
#include "common/common.h"
#include "common/list.h"
#include "common/map.h"
#include "common/ranges.h"
#include "direct/direct.h"
#include "direct/direct_md.h"
#include "xfer/endpoint.h"

#define BACKEND "UCX"
#define MAX_WORKERS 64

/*
 * A registration cache entry (regs, keyed by base): a registration of
 * [base, base+len), or a pool block holding a copy of the buffer at base.
 */
typedef struct reg_entry {
    uint64_t base, len;
    uint64_t refs;
    uint64_t pool_off; /* pool block offset (pool entries) */
    bool pool;
    bool permanent;
    bool stuck;
} reg_entry;

/* A published object: the regs keys it holds. */
typedef struct pub_obj {
    size_t n;
    uint64_t *keys; /* regs keys, one reference each */
} pub_obj;

/* A request's life: queued, run by a worker (or its waiter), ended. */
enum req_state { REQ_QUEUED = 0, REQ_RUNNING, REQ_END };

struct dp_direct_req {
    dp_direct *t;
    char obj_id[DP_DIRECT_ID_MAX + 1];
    uint8_t *md_bytes;
    dp__direct_md md;
    size_t n;
    dp__range *local;
    uint64_t *target_keys; /* caller targets: regs keys to release */
    bool targets_held;
    void *own_buf; /* the fetch's own memory (anonymous, registered), or NULL */
    size_t own_len;
    /* Under t->mu. */
    int state;
    bool aborted; /* also written atomically: the cancel flag of its READs */
    int rc;
    dp_detail det;
    uint64_t done_bytes;
    dp__list_node qlink; /* t->queue while QUEUED */
    dp__list_node llink; /* t->live, newest first */
};

/* A remote LRU entry: a connected publisher and what it was added with. */
typedef struct remote_entry {
    char name[DP_MD_NAME_MAX + 1];
    uint64_t gen, version, busy, tick;
    uint64_t peer; /* dp__md_peer_id: which process this name was added for */
    bool drop;
} remote_entry;

struct dp_direct {
    dp__endpoint *ep;
    char name[DP_MD_NAME_MAX + 1];
    int lru_max;
    double timeout_s;
    uint64_t chunk;
    int n_workers;

    pthread_mutex_t cache_mu;
    dp__map regs; /* u64 base -> reg_entry */
    dp__ranges
        reg_ranges; /* the registrations (not pool entries) in regs (v: reg_entry) */
    dp__map objs;   /* obj id -> pub_obj */
    void *pool_base;
    size_t pool_bytes;
    dp__slab_alloc *pool;
    uint64_t version, registers, deregisters, pool_used, pool_blocks;

    pthread_mutex_t mu;
    pthread_cond_t cv;      /* a request ended (waiters) */
    pthread_cond_t work_cv; /* a request was queued, or stopping (workers) */
    dp__list queue;         /* queued requests, oldest first (dp_direct_req.qlink) */
    dp__list live;          /* every request alive (dp_direct_req.llink) */
    dp__map aborted;        /* obj id -> (void *)1 */
    bool stopping;
    double chunk_pause;
    uint64_t fetches, fetch_ok, fetch_failed, fetch_aborted, bytes_fetched;
    uint64_t fetch_stolen; /* run by a waiting caller instead of a worker */
    pthread_t workers[MAX_WORKERS];
    int n_started;

    pthread_mutex_t lru_mu;
    pthread_cond_t lru_cv;
    remote_entry *lru;
    size_t lru_n, lru_cap;
    uint64_t lru_tick;
    uint64_t remote_adds, remote_readds, remote_hits, remote_evictions;

    /* Freed fetch buffers kept registered for reuse (fetch.c), under mu;
     * and retired ones a failed READ touched, taken back once it ended. */
    struct fetch_buf *fbufs;
    size_t n_fbufs;
    struct fetch_buf *retired;
    size_t n_retired, retired_cap;
    uint64_t fbuf_reclaimed;
    size_t fbuf_bytes, fbuf_max;
    uint64_t fbuf_reused;

    bool locks_init;
};

/* getenv(name), or dflt when it is unset or empty. */
static inline const char *
env_or(const char *name, const char *dflt)
{
    const char *v = getenv(name);
    return v != NULL && *v != '\0' ? v : dflt;
}

/* r's state (t->mu held). */
static inline void
set_state(dp_direct_req *r, int state)
{
    r->state = state;
}

/* ---- the transport (direct.c) ---- */

/*
 * Physical memory of this host. UCX backs memory it allocates with shared
 * memory and populates it: a request larger than the host fills /dev/shm and
 * starves every process, so sizes that come from options or from untrusted
 * metadata are checked against this first.
 */
uint64_t dp__direct_phys_bytes(void);

/* ---- fetch buffers kept for reuse (fetch.c) ---- */

struct fetch_buf;

/* Deregister and unmap n buffers (no lock held). */
void dp__direct_fbuf_drop(dp_direct *t, const struct fetch_buf *b, size_t n);

/*
 * Retired buffers whose READs ended (UCX completed or purged them) stop
 * counting and go to the cache, or are freed (all of them once stopping).
 * Takes mu.
 */
void dp__direct_fbuf_reclaim(dp_direct *t);

/* ---- registration cache (regcache.c; cache_mu held unless said) ---- */

/*
 * Turn an endpoint registration failure of what (len bytes at addr; NULL: an
 * allocation the endpoint registers, such as the pool) into one a user can act
 * on: the memlock advice for UCX's refusals, none for a range refused before
 * UCX saw it or for memory the transport registered itself (any lock).
 */
int dp__direct_reg_fail(dp_detail *d, int rc, const char *what, const void *addr,
                        size_t len);

/* The registration (not pool) entry covering [addr, addr+len), or an overlap error. */
int dp__direct_find_reg_locked(dp_direct *t, uint64_t addr, uint64_t len, reg_entry **out,
                               dp_detail *d);

/* Take one reference on a registration covering the buffer, registering it if needed. */
int dp__direct_reg_acquire_locked(dp_direct *t, void *addr, size_t len, const char *what,
                                  uint64_t *key, dp_detail *d);

/* Drop one reference; deregister (or return the pool block) at zero. */
void dp__direct_reg_release_locked(dp_direct *t, uint64_t key);

/* Copy a buffer into a pool block (or share the block it already has). */
int dp__direct_pool_acquire_locked(dp_direct *t, const dp_direct_buf *b, uint64_t *key,
                                   uint64_t *raddr, dp_detail *d);

/* ---- remote LRU (lru.c; each takes lru_mu) ---- */

/* Make md's remote usable for one fetch (busy + 1). */
int dp__direct_lru_acquire(dp_direct *t, const dp__direct_md *md, dp_detail *d);

/* End one fetch's use of remote name; failed: drop it once idle. */
void dp__direct_lru_release(dp_direct *t, const char *name, bool failed);

/* ---- fetch workers (worker.c) ---- */

/* A fetch worker's thread (arg: the transport); returns once stopping. */
void *dp__direct_worker_main(void *arg);

/* Take r off the queue if it is still there (mu held); true if it was. */
bool dp__direct_dequeue_locked(dp_direct *t, dp_direct_req *r);

/*
 * Run r (dequeued, mu held on entry and on return): RUNNING, the fetch
 * outside mu, then END with its result, waking every waiter.
 */
void dp__direct_run_req_locked(dp_direct *t, dp_direct_req *r);

/* Drop r's references on its targets' registrations, once (takes cache_mu). */
void dp__direct_release_targets(dp_direct_req *r);

#endif
