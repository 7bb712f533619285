/*
 * Direct transport, the fetching side (the API: include/dataplane/direct.h):
 * fetch requests (fetch, wait, cancel, destroy, abort, the request
 * accessors), the fetch buffers kept for reuse, and reading metadata without
 * fetching. The workers that run requests are worker.c, the remotes they read
 * from lru.c; the transport itself is direct.c, the publishing side
 * publish.c, sharing direct_int.h.
 *
 * Design notes
 * ------------
 * - dp_direct_fetch parses the metadata, registers the targets (or allocates
 *   registered memory of its own, bounded by half the host's memory: the
 *   metadata is from outside) and queues the request for one worker; a
 *   pending abort of the id fails it instead (and is used up), checked in the
 *   critical section that makes the request live.
 * - dp_direct_wait(-1) on a request no worker took yet runs it on the
 *   caller's thread; a bounded wait never does, so it can return in time.
 * - dp_direct_req_destroy waits for the request to end (aborting it first), so
 *   memory is released only by the caller's thread, never under a transfer.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "direct/direct_int.h"
#include "xfer/graveyard.h"

/* A fetch buffer the transport allocated (kept for reuse, or retired). */
struct fetch_buf {
    void *p;
    size_t len;
};

/* ---- fetch buffers kept for reuse (fetch_cache_bytes) ---- */

/* At most this many buffers are kept (the oldest go first). */
#define FBUF_MAX 64

/* Deregister and unmap n buffers (no lock held). */
void
dp__direct_fbuf_drop(dp_direct *t, const struct fetch_buf *b, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        dp_detail d;
        if (dp__endpoint_deregister(t->ep, b[i].p, &d) == DP_OK)
            munmap(b[i].p, b[i].len);
        else /* never touched by a transfer once cached; kept if ever */
            DP_LOG_W("direct %s: cached fetch buffer kept for good: %s", t->name, d.msg);
    }
}

/*
 * A freed fetch buffer: kept registered for the next fetches (true), the
 * oldest ones let go to make room. Not kept when larger than the cache or
 * touched by an unfinished transfer (the caller deregisters or keeps it).
 */
static bool
fbuf_keep(dp_direct *t, void *p, size_t len)
{
    if (len > t->fbuf_max || dp__graveyard_touches((uint64_t)(uintptr_t)p, len))
        return false;
    pthread_mutex_lock(&t->mu);
    if (t->stopping ||
        (t->fbufs == NULL && (t->fbufs = calloc(FBUF_MAX, sizeof *t->fbufs)) == NULL)) {
        pthread_mutex_unlock(&t->mu);
        return false;
    }
    size_t k = 0, freed = 0;
    while (k < t->n_fbufs &&
           (t->fbuf_bytes - freed + len > t->fbuf_max || t->n_fbufs - k >= FBUF_MAX))
        freed += t->fbufs[k++].len;
    struct fetch_buf out[FBUF_MAX];
    memcpy(out, t->fbufs, k * sizeof *out);
    memmove(t->fbufs, t->fbufs + k, (t->n_fbufs - k) * sizeof *t->fbufs);
    t->n_fbufs -= k;
    t->fbufs[t->n_fbufs++] = (struct fetch_buf){p, len};
    t->fbuf_bytes = t->fbuf_bytes - freed + len;
    pthread_mutex_unlock(&t->mu);
    dp__direct_fbuf_drop(t, out, k);
    return true;
}

/*
 * Retire a fetch buffer a failed READ still touches (charged to the
 * graveyard): fbuf_take takes it back once that READ ended. False when the
 * list cannot grow (the caller keeps the buffer for good).
 */
static bool
fbuf_retire(dp_direct *t, void *p, size_t len)
{
    pthread_mutex_lock(&t->mu);
    if (t->n_retired == t->retired_cap) {
        size_t cap = t->retired_cap ? 2 * t->retired_cap : 8;
        struct fetch_buf *g = realloc(t->retired, cap * sizeof *g);
        if (g == NULL) {
            pthread_mutex_unlock(&t->mu);
            return false;
        }
        t->retired = g;
        t->retired_cap = cap;
    }
    t->retired[t->n_retired++] = (struct fetch_buf){p, len};
    pthread_mutex_unlock(&t->mu);
    dp__graveyard_retain_buffer(len);
    return true;
}

/*
 * Retired buffers whose READs ended (UCX completed or purged them) stop
 * counting and go to the cache, or are freed (all of them once stopping).
 */
void
dp__direct_fbuf_reclaim(dp_direct *t)
{
    for (;;) {
        struct fetch_buf back[8];
        size_t n = 0;
        pthread_mutex_lock(&t->mu);
        for (size_t i = 0; i < t->n_retired && n < 8;) {
            struct fetch_buf b = t->retired[i];
            if (dp__graveyard_touches((uint64_t)(uintptr_t)b.p, b.len)) {
                i++;
                continue;
            }
            back[n++] = b;
            t->retired[i] = t->retired[--t->n_retired];
            t->fbuf_reclaimed++;
        }
        pthread_mutex_unlock(&t->mu);
        if (n == 0)
            return;
        for (size_t i = 0; i < n; i++) {
            dp__graveyard_release_buffer(back[i].len);
            DP_LOG_I("direct %s: a retired fetch buffer (%zu bytes) is touched no more: "
                     "taken back",
                     t->name, back[i].len);
            if (!fbuf_keep(t, back[i].p, back[i].len))
                dp__direct_fbuf_drop(t, &back[i], 1);
        }
    }
}

/*
 * The smallest cached buffer of len to 2 len bytes, taken out of the cache;
 * NULL if none.
 */
static void *
fbuf_take(dp_direct *t, size_t len, size_t *got)
{
    pthread_mutex_lock(&t->mu);
    if (t->n_retired > 0) {
        pthread_mutex_unlock(&t->mu);
        dp__direct_fbuf_reclaim(t);
        pthread_mutex_lock(&t->mu);
    }
    size_t best = SIZE_MAX;
    for (size_t i = 0; i < t->n_fbufs; i++)
        if (t->fbufs[i].len >= len && t->fbufs[i].len / 2 <= len &&
            (best == SIZE_MAX || t->fbufs[i].len < t->fbufs[best].len))
            best = i;
    void *p = NULL;
    if (best != SIZE_MAX) {
        p = t->fbufs[best].p;
        *got = t->fbufs[best].len;
        t->fbuf_bytes -= *got;
        memmove(t->fbufs + best, t->fbufs + best + 1,
                (t->n_fbufs - best - 1) * sizeof *t->fbufs);
        t->n_fbufs--;
        t->fbuf_reused++;
    }
    pthread_mutex_unlock(&t->mu);
    return p;
}

static void
req_free(dp_direct_req *r)
{
    if (r == NULL)
        return;
    dp_direct *t = r->t;
    dp__direct_release_targets(r);
    if (r->own_buf != NULL && !fbuf_keep(t, r->own_buf, r->own_len)) {
        dp_detail d;
        dp_detail_clear(&d);
        if (dp__endpoint_deregister(t->ep, r->own_buf, &d) == DP_OK) {
            munmap(r->own_buf, r->own_len);
        } else if (!fbuf_retire(t, r->own_buf, r->own_len)) {
            /* A retained transfer may still write into it: never freed. */
            dp__graveyard_retain_buffer(r->own_len);
            DP_LOG_W("direct %s: fetch buffer of object %s kept for good: %s", t->name,
                     r->obj_id, d.msg);
        } else {
            DP_LOG_I("direct %s: fetch buffer of object %s retired until the failed "
                     "READ that touches it ends: %s",
                     t->name, r->obj_id, d.msg);
        }
    }
    dp__direct_md_fini(&r->md);
    free(r->md_bytes);
    free(r->local);
    free(r->target_keys);
    free(r);
}

/* Give r its own copy of the metadata md, parsed and checked to be of r's object. */
static int
req_load_md(dp_direct_req *r, const void *md, size_t md_len, dp_detail *d)
{
    int rc;
    r->md_bytes = malloc(md_len);
    if (r->md_bytes == NULL)
        return dp__fail(d, DP_ENOMEM, "direct: %zu bytes of metadata", md_len);
    memcpy(r->md_bytes, md, md_len);
    if ((rc = dp__direct_md_parse(r->md_bytes, md_len, &r->md, d)) != DP_OK)
        return rc;
    if (strcmp(r->md.obj_id, r->obj_id) != 0)
        return dp__fail(d, DP_EINVAL,
                        "direct: fetch of %s with the metadata of object %s", r->obj_id,
                        r->md.obj_id);
    r->n = r->md.n_descs;
    return DP_OK;
}

/*
 * Allocate r's per-buffer arrays; with targets, first check there is one per
 * buffer of the object, then that each has its buffer's length.
 */
static int
req_check_targets(dp_direct_req *r, const dp_direct_buf *targets, size_t n_targets,
                  dp_detail *d)
{
    if (targets != NULL && n_targets != r->n)
        return dp__fail(d, DP_EINVAL,
                        "direct: object %s has %zu buffers, %zu targets given", r->obj_id,
                        r->n, n_targets);
    r->local = calloc(r->n ? r->n : 1, sizeof *r->local);
    r->target_keys = calloc(r->n ? r->n : 1, sizeof *r->target_keys);
    if (r->local == NULL || r->target_keys == NULL)
        return dp__fail(d, DP_ENOMEM, "direct: fetch of %zu buffers", r->n);
    for (size_t i = 0; targets != NULL && i < r->n; i++)
        if (targets[i].addr == NULL || targets[i].len != r->md.descs[i].len)
            return dp__fail(d, DP_EINVAL,
                            "direct: object %s buffer %zu has %" PRIu64
                            " bytes, target has %zu at %p",
                            r->obj_id, i, r->md.descs[i].len, targets[i].len,
                            targets[i].addr);
    return DP_OK;
}

/* Register the caller's targets as r's local side (all of them, or none). */
static int
req_hold_targets(dp_direct_req *r, const dp_direct_buf *targets, dp_detail *d)
{
    dp_direct *t = r->t;
    int rc = DP_OK;
    size_t k;
    pthread_mutex_lock(&t->cache_mu);
    for (k = 0; k < r->n; k++) {
        rc = dp__direct_reg_acquire_locked(t, targets[k].addr, targets[k].len,
                                           "fetch target", &r->target_keys[k], d);
        if (rc != DP_OK)
            break;
        r->local[k] = (dp__range){(uint64_t)(uintptr_t)targets[k].addr, targets[k].len};
    }
    if (rc != DP_OK)
        while (k-- > 0)
            dp__direct_reg_release_locked(t, r->target_keys[k]);
    pthread_mutex_unlock(&t->cache_mu);
    if (rc != DP_OK)
        return rc;
    r->targets_held = true;
    return DP_OK;
}

/*
 * Give r a buffer of its own (own_buf) as its local side: a 64-byte aligned
 * slot per buffer of the object.
 */
static int
req_own_buffer(dp_direct_req *r, dp_detail *d)
{
    dp_direct *t = r->t;
    int rc;
    /* Each length is bounded first, so the sum cannot wrap (metadata is
     * from outside). */
    uint64_t total = 0, limit = dp__direct_phys_bytes() / 2;
    for (size_t i = 0; i < r->n && total <= limit; i++)
        total +=
            r->md.descs[i].len > limit ? limit + 1 : DP_ALIGN_UP(r->md.descs[i].len, 64);
    if (total > SIZE_MAX || total > limit) {
        char a[32];
        return dp__fail(d, DP_ETOOBIG,
                        "direct: object %s needs %" PRIu64 " bytes, more than half of "
                        "this host's %s of memory: fetch it into targets of your own",
                        r->obj_id, total,
                        dp__fmt_size(dp__direct_phys_bytes(), a, sizeof a));
    }
    /*
     * A freed fetch buffer of about the size, kept registered and faulted
     * in (fetch_cache_bytes), else plain anonymous memory, registered: the
     * local side of a READ need not be shared memory (UCX's shared-memory
     * allocation creates and fills a file). A 64 MiB fetch: 44 ms into
     * UCX-allocated memory, 36 ms into fresh anonymous memory, 11-14 ms
     * into memory already faulted in (docs/design.md, "Direct transport").
     */
    size_t len = DP_ALIGN_UP((size_t)total, (size_t)sysconf(_SC_PAGESIZE));
    void *buf = fbuf_take(t, len, &len);
    if (buf == NULL) {
        buf = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (buf == MAP_FAILED)
            return dp__fail(d, DP_ENOMEM, "direct: fetch buffer of %zu bytes: %s", len,
                            strerror(errno));
        rc = dp__endpoint_register(t->ep, buf, len, d);
        if (rc != DP_OK) {
            munmap(buf, len);
            dp__direct_reg_fail(d, rc, "the fetch buffer", NULL, len);
            return rc;
        }
    }
    r->own_buf = buf;
    r->own_len = len;
    uint64_t off = 0;
    for (size_t i = 0; i < r->n; i++) {
        r->local[i] =
            (dp__range){(uint64_t)(uintptr_t)r->own_buf + off, r->md.descs[i].len};
        off += DP_ALIGN_UP(r->md.descs[i].len, 64);
    }
    return DP_OK;
}

/*
 * Make r live and queue it for the worker. A pending abort of this id fails
 * this fetch (and is used up). Checked in the same critical section that
 * makes the request live, so an abort in between either finds the request or
 * leaves its mark for this check.
 */
static int
req_go_live(dp_direct_req *r, size_t idlen, dp_detail *d)
{
    dp_direct *t = r->t;
    pthread_mutex_lock(&t->mu);
    if (t->stopping) {
        pthread_mutex_unlock(&t->mu);
        return dp__fail(d, DP_ECLOSED, "direct: transport is being destroyed");
    }
    if (dp__map_del(&t->aborted, r->obj_id, idlen) != NULL) {
        pthread_mutex_unlock(&t->mu);
        return dp__fail(d, DP_ECANCELED, "direct: fetch of object %s aborted", r->obj_id);
    }
    set_state(r, REQ_QUEUED);
    dp__list_insert_head(&t->live, &r->llink);
    dp__list_insert_tail(&t->queue, &r->qlink);
    t->fetches++;
    pthread_cond_signal(&t->work_cv); /* one worker; waiters wait for END only */
    pthread_mutex_unlock(&t->mu);
    return DP_OK;
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
        return dp__fail(d, DP_EINVAL, "direct: fetch of %s without metadata", obj_id);
    dp_direct_req *r = calloc(1, sizeof *r);
    if (r == NULL)
        return dp__fail(d, DP_ENOMEM, "direct: fetch request");
    r->t = t;
    snprintf(r->obj_id, sizeof r->obj_id, "%s", obj_id);
    if ((rc = req_load_md(r, md, md_len, d)) != DP_OK ||
        (rc = req_check_targets(r, targets, n_targets, d)) != DP_OK)
        goto fail;
    if (targets != NULL)
        rc = req_hold_targets(r, targets, d);
    else if (r->n > 0)
        rc = req_own_buffer(r, d);
    if (rc != DP_OK || (rc = req_go_live(r, idlen, d)) != DP_OK)
        goto fail;
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
    if (timeout_s < 0 && r->state == REQ_QUEUED && !t->stopping &&
        dp__direct_dequeue_locked(t, r)) {
        t->fetch_stolen++;
        dp__direct_run_req_locked(t, r);
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
        return dp__fail(d, DP_ETIMEDOUT,
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

/* End r as canceled if no worker took it yet (its waiters wake); false if one did. */
static bool
cancel_queued_locked(dp_direct *t, dp_direct_req *r)
{
    if (r->state != REQ_QUEUED || !dp__direct_dequeue_locked(t, r))
        return false;
    r->rc =
        dp__fail(&r->det, DP_ECANCELED, "direct: fetch of object %s canceled", r->obj_id);
    set_state(r, REQ_END);
    t->fetch_aborted++;
    pthread_cond_broadcast(&t->cv);
    return true;
}

void
dp_direct_req_cancel(dp_direct_req *r)
{
    if (r == NULL)
        return;
    dp_direct *t = r->t;
    pthread_mutex_lock(&t->mu);
    if (!cancel_queued_locked(t, r) && r->state != REQ_END) {
        /* the worker running it ends its READ's wait and stops */
        __atomic_store_n(&r->aborted, true, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&t->mu);
}

void
dp_direct_req_destroy(dp_direct_req *r)
{
    if (r == NULL)
        return;
    dp_direct *t = r->t;
    pthread_mutex_lock(&t->mu);
    cancel_queued_locked(t, r);
    __atomic_store_n(&r->aborted, true, __ATOMIC_RELEASE);
    while (r->state != REQ_END)
        pthread_cond_wait(&t->cv, &t->mu);
    dp__list_remove(&t->live, &r->llink);
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
    for (dp_direct_req *r = DP_LIST_FIRST(&t->live, dp_direct_req, llink); r != NULL;
         r = DP_LIST_NEXT(r, dp_direct_req, llink)) {
        if (r->state != REQ_END && strcmp(r->obj_id, obj_id) == 0) {
            __atomic_store_n(&r->aborted, true, __ATOMIC_RELEASE);
            hit = true;
        }
    }
    if (!hit)
        rc = dp__map_put(&t->aborted, obj_id, idlen, (void *)1, NULL);
    pthread_mutex_unlock(&t->mu);
    if (rc != DP_OK)
        return dp__fail(d, DP_ENOMEM, "direct: abort set");
    return DP_OK;
}

bool
dp_direct_touches_unfinished(dp_direct *t, const void *addr, size_t len)
{
    return dp__endpoint_touches_unfinished(t->ep, addr, len);
}

int
dp_direct_md_describe(const void *md, size_t md_len, size_t *n, uint64_t *sizes,
                      size_t cap, dp_detail *d)
{
    dp__direct_md m;
    int rc = dp__direct_md_parse(md, md_len, &m, d);
    if (rc != DP_OK)
        return rc;
    *n = m.n_descs;
    for (size_t i = 0; i < m.n_descs && i < cap; i++)
        sizes[i] = m.descs[i].len;
    dp__direct_md_fini(&m);
    return DP_OK;
}
