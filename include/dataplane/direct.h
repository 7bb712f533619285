/*
 * Direct transport: one process publishes buffers under an object id, another
 * fetches them with one-sided READ, with no storage unit in between (model
 * weights, activations, large objects handed from worker to worker).
 *
 * The publisher calls dp_direct_publish(obj_id, buffers) and gets transport
 * metadata: a byte string (descriptors of the buffers, the publisher's
 * endpoint metadata, its name and its metadata version) that the caller hands
 * to the fetching process by any means (a control message, a Ray object, a
 * file). The fetcher calls dp_direct_fetch(obj_id, metadata, targets), which
 * starts the READ and returns a request, then dp_direct_wait(request,
 * timeout). The publisher keeps the buffers alive and unchanged until it
 * calls dp_direct_free(obj_id); a fetch of an object already freed may read
 * whatever the memory holds by then (there is no round trip to check).
 *
 * Memory: a published buffer is either registered with the transport (a
 * registration cache keyed by the buffer's base address with a reference
 * count: a buffer in several objects is registered once, and deregistered
 * when the last object holding it is freed) or, with a memory pool configured
 * and no registration of its own, copied into a block of the pre-registered
 * pool at publish time.
 *
 * Backend: UCX. On hosts with AWS EFA devices creation fails with
 * DP_EUNSUPPORTED unless the UCX backend is asked for explicitly: the libfabric
 * backend EFA wants is not available in this build.
 *
 * Threads: every function may be called from any thread unless its comment
 * says otherwise. A dp_direct runs its own worker threads for fetches.
 */
#ifndef DATAPLANE_DIRECT_H
#define DATAPLANE_DIRECT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dataplane/err.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dp_direct dp_direct;
typedef struct dp_direct_req dp_direct_req;

/* Longest object id in bytes (printable ASCII, 0x20..0x7e). */
#define DP_DIRECT_ID_MAX 255
/* Most buffers in one object. */
#define DP_DIRECT_BUFS_MAX 65536u

/* One buffer: [addr, addr + len), len > 0. Its layout is fixed (like struct iovec). */
typedef struct dp_direct_buf {
    void *addr;
    size_t len;
} dp_direct_buf;

typedef enum dp_direct_backend {
    /* UCX, unless EFA devices are present (then DP_EUNSUPPORTED, see top). */
    DP_DIRECT_BACKEND_AUTO = 0,
    DP_DIRECT_BACKEND_UCX = 1,
} dp_direct_backend;

/* remote_cache_size: keep no remote connected (connect around every fetch). */
#define DP_DIRECT_REMOTE_CACHE_OFF (-1)
#define DP_DIRECT_FETCH_CACHE_OFF ((size_t)-1)

/*
 * Creation options. A zeroed struct (`dp_direct_opts o = {0};`, or
 * dp_direct_opts_init) is valid and means the defaults: 0, false or NULL in
 * any field leaves it at its default. reserved must be zero: it is where
 * fields added later go; create refuses a non-zero reserved word (DP_EINVAL:
 * the program was built against a newer header than this library).
 */
typedef struct dp_direct_opts {
    /* The endpoint's name as peers see it; NULL (the default): "direct-<random hex>". */
    const char *name;
    /*
     * AUTO (0, the default), or UCX. The environment variable
     * DP_DIRECT_BACKEND=ucx forces UCX.
     */
    dp_direct_backend backend;
    /*
     * Remote endpoints kept connected, least recently used evicted first.
     * 0: the default, 16. DP_DIRECT_REMOTE_CACHE_OFF (any negative value):
     * none, connect before and disconnect after every fetch.
     */
    int remote_cache_size;
    /* Bytes of the pre-registered memory pool; 0 (the default): no pool. */
    size_t pool_bytes;
    /* Deadline of each READ the worker posts, seconds (> 0); 0: the default, 60. */
    double xfer_timeout_s;
    /*
     * A fetch is read in pieces of at most this many bytes; an abort takes
     * effect between pieces. 0: the default, 64 MiB.
     */
    size_t chunk_bytes;
    /* Fetch worker threads (1..64); 0: the default, 2. */
    int n_workers;
    /*
     * Do not run the endpoint's progress thread (default false: it runs). A
     * publisher whose memory the transport cannot map for its peers (plain
     * malloc memory: RMA is then emulated) must progress to serve fetches, so
     * leave this off there.
     */
    bool no_progress_thread;
    /*
     * Fetch buffers the transport allocated (a fetch without targets) are
     * kept registered and faulted in once freed, up to this many bytes, for
     * the next fetches to reuse (a 64 MiB fetch into fresh memory spends most
     * of its time faulting pages in). 0: the default, 256 MiB (at most an
     * eighth of the host's memory); DP_DIRECT_FETCH_CACHE_OFF: none.
     */
    size_t fetch_cache_bytes;
    uint64_t reserved[7];
} dp_direct_opts;

/* Fill o with the defaults (the same as zeroing it). Threads: any. */
DP_API void dp_direct_opts_init(dp_direct_opts *o);

/*
 * Create a direct transport (its endpoint, its pool if asked for, its worker
 * threads) with opts (NULL: defaults). Errors: DP_EINVAL (bad options),
 * DP_EUNSUPPORTED (EFA present and backend AUTO; d says what to do),
 * DP_ETRANSFER (UCX failed to start; d names what to check), DP_ENOMEM,
 * DP_ESYS (a thread could not start). Threads: any.
 */
DP_API int dp_direct_create(const dp_direct_opts *opts, dp_direct **out, dp_detail *d);

/*
 * Stop the workers, drop every object and registration, close the endpoint
 * and free t. Memory a failed transfer may still touch is kept for good (the
 * process graveyard).
 *
 * Refused while requests of t live (created by dp_direct_fetch and not yet
 * dp_direct_req_destroy'ed, ended or not): DP_EBUSY, with d saying how many
 * and the object id of one; nothing changes and t stays fully usable. Destroy
 * the requests (which waits for running ones), then t. A request uses t's
 * workers, endpoint and registration cache until it is destroyed, so t cannot
 * go first. NULL allowed (DP_OK). Threads: must not race with other calls on
 * t.
 */
DP_API int dp_direct_destroy(dp_direct *t, dp_detail *d);

/* The endpoint name peers see (valid until destroy). Threads: any. */
DP_API const char *dp_direct_name(const dp_direct *t);

/* The backend in use ("UCX"). Threads: any. */
DP_API const char *dp_direct_backend_name(const dp_direct *t);

/*
 * Register [addr, addr + len) for good: it is never deregistered by free()
 * and published buffers inside it use this registration (and never the pool).
 * Idempotent for a range already inside a registration. Errors: DP_EINVAL,
 * DP_EEXIST (overlaps a registration or a pooled buffer without lying inside
 * it), DP_ETRANSFER (registration refused: d gives the size, the memlock
 * limit and what to check). Threads: any.
 */
DP_API int dp_direct_register_permanent(dp_direct *t, void *addr, size_t len,
                                        dp_detail *d);

/*
 * Drop what dp_direct_register_permanent kept for good: the registration
 * holding [addr, addr + len) is no longer permanent, and it is deregistered
 * now if no published object or running fetch holds it, else when the last
 * one lets go (as any registration). Errors: DP_EINVAL, DP_ENOTFOUND (no
 * permanent registration holds that range: nothing changed). Threads: any.
 */
DP_API int dp_direct_deregister_permanent(dp_direct *t, void *addr, size_t len,
                                          dp_detail *d);

/*
 * Publish bufs[0..n) (n may be 0) under obj_id and return the transport
 * metadata in *md and *md_len: the caller's, freed with dp_free. The buffers must stay
 * alive and unchanged until dp_direct_free(obj_id). With a pool, and when no
 * buffer has a registration of its own, the buffers are copied into pool
 * blocks (a buffer already pooled by another object shares that block and is
 * not copied again); otherwise each buffer is registered (once, however many
 * objects hold it). On failure nothing changed: registrations and pool blocks
 * this call took are released, those of other objects are untouched.
 *
 * Errors: DP_EINVAL (bad id, NULL or empty buffer, too many), DP_EEXIST (id
 * already published, or a buffer partly overlaps a registration), DP_EBUSY
 * (the pool has no room now: free objects, or publish without a pool),
 * DP_ETRANSFER (registration refused; d says why), DP_ENOMEM. Threads: any.
 */
DP_API int dp_direct_publish(dp_direct *t, const char *obj_id, const dp_direct_buf *bufs,
                             size_t n, uint8_t **md, size_t *md_len, dp_detail *d);

/*
 * Drop obj_id's hold on its buffers: registrations whose count reaches zero
 * are deregistered (and the metadata version increases), pool blocks are
 * returned. Errors: DP_ENOTFOUND (not published). Threads: any.
 */
DP_API int dp_direct_free(dp_direct *t, const char *obj_id, dp_detail *d);

/*
 * Start fetching obj_id described by md[0..md_len) (from the publisher's
 * dp_direct_publish) and return the request in *out. targets (n_targets equal
 * to the object's buffer count, each exactly the size of its buffer) receive
 * the bytes; they are registered for the fetch (through the same cache) and
 * must stay alive until the request ends. targets NULL: the transport
 * allocates registered buffers, read them with dp_direct_req_buffer.
 *
 * Errors (the request is not created): DP_EPROTO (malformed metadata),
 * DP_EINVAL (obj_id differs from the metadata's, targets do not match),
 * DP_EEXIST (a target partly overlaps a registration, or memory the transport
 * allocated itself), DP_ETOOBIG (no targets and the object is larger than half
 * of this host's memory),
 * DP_ECANCELED (aborted before it started: see dp_direct_abort),
 * DP_ETRANSFER (target registration refused), DP_ECLOSED, DP_ENOMEM.
 * Threads: any.
 */
DP_API int dp_direct_fetch(dp_direct *t, const char *obj_id, const void *md,
                           size_t md_len, const dp_direct_buf *targets, size_t n_targets,
                           dp_direct_req **out, dp_detail *d);

/*
 * Wait for r to end: timeout_s < 0 waits for ever, 0 polls, > 0 waits that
 * many seconds. Returns DP_OK once every byte arrived; DP_ETIMEDOUT if r is
 * still running (wait again, or destroy it); otherwise r's error, the same on
 * every later call: DP_ECANCELED (aborted), DP_ETRANSFER (the publisher died
 * or UCX failed; d says which, with sizes and what to check), DP_ETIMEDOUT with
 * "deadline" in d (a READ outlived xfer_timeout_s), DP_EFATAL (process poisoned),
 * DP_ECLOSED. After a failure, target memory for which dp_direct_touches_unfinished() is
 * true must never be reused. Threads: any; several may wait on one request.
 */
DP_API int dp_direct_wait(dp_direct_req *r, double timeout_s, dp_detail *d);

/* True once r ended (done or failed). Threads: any. */
DP_API bool dp_direct_req_ended(dp_direct_req *r);

/* Bytes of r transferred so far and in total. Threads: any. */
DP_API void dp_direct_req_progress(dp_direct_req *r, uint64_t *done, uint64_t *total);

/* Number of buffers of r. Threads: any. */
DP_API size_t dp_direct_req_count(const dp_direct_req *r);

/*
 * Buffer i of r: the caller's target, or the transport's own buffer (valid
 * until dp_direct_req_destroy). Errors: DP_EINVAL (i out of range). Read it
 * only after dp_direct_wait returned DP_OK. Threads: any.
 */
DP_API int dp_direct_req_buffer(const dp_direct_req *r, size_t i, void **addr,
                                size_t *len);

/*
 * Abort r if it still runs (it ends within one chunk with DP_ECANCELED) and free
 * it. Blocks until the worker has let go of r. NULL allowed. Threads: any, but
 * not concurrently with other calls on the same r.
 */
DP_API void dp_direct_req_destroy(dp_direct_req *r);

/*
 * Make r (only r) end with DP_ECANCELED if it has not ended: a queued r at
 * once, a running one at its next chunk. An r that already ended is left as
 * it is, and nothing is kept for later fetches (unlike dp_direct_abort, whose
 * mark a fetch that ended meanwhile would leave for the next fetch of the
 * id). NULL allowed. Threads: any, also while others wait on r.
 */
DP_API void dp_direct_req_cancel(dp_direct_req *r);

/*
 * Make fetches of obj_id fail with DP_ECANCELED: every fetch of it
 * still queued or running (running ones stop at the next chunk); if there is
 * none, the next dp_direct_fetch of obj_id (the mark is used once). Threads: any.
 */
DP_API int dp_direct_abort(dp_direct *t, const char *obj_id, dp_detail *d);

/*
 * True if [addr, addr + len) may still be written by a failed transfer of
 * this process; such memory must never be reused or freed. Threads: any.
 */
DP_API bool dp_direct_touches_unfinished(dp_direct *t, const void *addr, size_t len);

/*
 * Read the buffer count and sizes out of transport metadata without fetching:
 * *n gets the count, sizes[0..min(n, cap)) the sizes (sizes NULL allowed when
 * cap is 0). Errors: DP_EPROTO. Threads: any.
 */
DP_API int dp_direct_md_describe(const void *md, size_t md_len, size_t *n,
                                 uint64_t *sizes, size_t cap, dp_detail *d);

/*
 * Counters. The struct grows into its reserved tail (filled with zeros
 * today); fields keep their places. Threads: any.
 */
typedef struct dp_direct_stats {
    uint64_t version;          /* metadata version: bumps on every deregistration */
    uint64_t objects;          /* published and not freed */
    uint64_t registrations;    /* live registrations (cache entries, pool excluded) */
    uint64_t registered_bytes; /* their bytes */
    uint64_t registers;        /* registrations made so far */
    uint64_t deregisters;      /* deregistrations made so far */
    uint64_t pool_bytes;       /* pool size, 0 without a pool */
    uint64_t pool_used;        /* bytes in pool blocks held by objects */
    uint64_t pool_blocks;      /* pool blocks held */
    uint64_t fetches;          /* requests created */
    uint64_t fetch_ok, fetch_failed, fetch_aborted;
    uint64_t bytes_fetched;
    uint64_t remote_adds;         /* remotes connected (first time or after eviction) */
    uint64_t remote_readds;       /* reconnected because the metadata changed */
    uint64_t remote_hits;         /* fetches that found their remote connected */
    uint64_t remote_evictions;    /* removed: LRU, size 0, or after a failure */
    uint64_t remotes_cached;      /* connected now */
    uint64_t fetch_by_waiter;     /* run by a dp_direct_wait(-1) caller, not a worker */
    uint64_t fetch_buf_reused;    /* fetches into a cached buffer (fetch_cache_bytes) */
    uint64_t fetch_buf_cached;    /* bytes of freed fetch buffers kept for reuse now */
    uint64_t fetch_buf_retired;   /* freed ones a failed READ still touches */
    uint64_t fetch_buf_reclaimed; /* retired ones taken back after their READ ended */
    uint64_t reserved[8];
} dp_direct_stats;
DP_API void dp_direct_get_stats(dp_direct *t, dp_direct_stats *st);

#ifdef __cplusplus
}
#endif
#endif
