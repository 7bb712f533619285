/*
 * The direct transport's fetch workers: threads that take queued requests
 * and run them, reading the object chunk by chunk over the endpoint.
 *
 * Design notes
 * ------------
 * - A worker (or a dp_direct_wait(-1) caller that takes its own request
 *   before any worker does, saving two thread hand-offs) connects the remote
 *   through the LRU, reads the object with blocking dp__endpoint_transfer
 *   calls of at most chunk bytes (CHUNK_RANGES ranges), and ends the request
 *   (state END, rc), broadcasting cv.
 * - Aborts are checked before each chunk, and end the wait for a chunk in
 *   flight (r->aborted is the READ's cancel flag: a publisher that stopped
 *   answering would otherwise hold the worker until the chunk's deadline, and
 *   with it every fetch queued behind). When a request ends nothing of ours
 *   writes into its memory any more, except transfers the endpoint retained
 *   in the graveyard (their memory is never freed: regions stay registered,
 *   own buffers are leaked and charged with dp__graveyard_retain_buffer by
 *   fetch.c; the Python package keeps caller targets alive for good).
 * - A request's targets are released as soon as it ends, by whoever ran it.
 */
#include <inttypes.h>
#include <stdio.h>

#include "direct/direct_int.h"

#define CHUNK_RANGES 256

void
dp__direct_set_chunk_pause(dp_direct *t, double seconds)
{
    pthread_mutex_lock(&t->mu);
    t->chunk_pause = seconds;
    pthread_mutex_unlock(&t->mu);
}

/* ---- fetch worker ---- */

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

void
dp__direct_release_targets(dp_direct_req *r)
{
    if (!r->targets_held)
        return;
    dp_direct *t = r->t;
    pthread_mutex_lock(&t->cache_mu);
    for (size_t i = r->n; i-- > 0;)
        dp__direct_reg_release_locked(t, r->target_keys[i]);
    pthread_mutex_unlock(&t->cache_mu);
    r->targets_held = false;
}

/* Read r's object; returns the request's result, details in *d. */
static int
run_fetch(dp_direct_req *r, dp_detail *d)
{
    dp_direct *t = r->t;
    const dp__direct_md *md = &r->md;
    double pause = 0;
    if (req_aborted(r, NULL))
        return dp__fail(d, DP_ECANCELED,
                        "direct: fetch of object %s aborted before it started",
                        r->obj_id);
    if (r->n == 0)
        return DP_OK;
    int rc = dp__direct_lru_acquire(t, md, d);
    if (rc != DP_OK) {
        dp__fail_ctx(d, rc,
                     "direct (backend " BACKEND "): cannot connect to publisher %s for "
                     "object %s (check UCX_TLS = %s; rerun with UCX_LOG_LEVEL=debug)",
                     md->name, r->obj_id, env_or("UCX_TLS", "unset"));
        return rc;
    }
    dp__range l[CHUNK_RANGES], rr[CHUNK_RANGES];
    size_t i = 0;
    uint64_t off = 0, done = 0;
    bool xfer_failed = false;
    while (i < r->n) {
        size_t k = 0;
        uint64_t bytes = 0;
        while (i < r->n && k < CHUNK_RANGES && bytes < t->chunk) {
            uint64_t take = DP_MIN(md->descs[i].len - off, t->chunk - bytes);
            l[k] = (dp__range){r->local[i].addr + off, take};
            rr[k] = (dp__range){md->descs[i].addr + off, take};
            k++;
            bytes += take;
            off += take;
            if (off == md->descs[i].len) {
                i++;
                off = 0;
            }
        }
        if (req_aborted(r, &pause)) {
            rc = dp__fail(d, DP_ECANCELED,
                          "direct: fetch of object %s aborted after %" PRIu64
                          " of %" PRIu64 " bytes",
                          r->obj_id, done, md->total_bytes);
            break;
        }
        if (pause > 0)
            dp__sleep_s(pause);
        rc = dp__endpoint_transfer(t->ep,
                                   &(dp__xfer_desc){.op = DP_XFER_READ,
                                                    .local = l,
                                                    .n_local = k,
                                                    .remote = rr,
                                                    .n_remote = k,
                                                    .remote_name = md->name,
                                                    .cancel = &r->aborted},
                                   t->timeout_s, d);
        if (rc == DP_ECANCELED) {
            xfer_failed = true; /* a publisher that stopped answering is suspect */
            dp__fail_ctx(d, rc,
                         "direct: fetch of object %s aborted after %" PRIu64
                         " of %" PRIu64 " bytes, during a READ from %s",
                         r->obj_id, done, md->total_bytes, md->name);
            break;
        }
        if (rc != DP_OK) {
            xfer_failed = true;
            char tot[32];
            dp__fmt_size(md->total_bytes, tot, sizeof tot);
            dp__fail_ctx(d, rc,
                         "direct (backend " BACKEND "): READ of object %s (%zu buffers, "
                         "%s) from %s failed after %" PRIu64 " bytes; the publisher may "
                         "have died or freed it (UCX_TLS = %s; rerun with "
                         "UCX_LOG_LEVEL=debug)",
                         r->obj_id, r->n, tot, md->name, done,
                         env_or("UCX_TLS", "unset"));
            break;
        }
        done += bytes;
        pthread_mutex_lock(&t->mu);
        r->done_bytes = done;
        pthread_mutex_unlock(&t->mu);
    }
    /* After a failed READ the remote is dropped: the publisher may be gone. */
    dp__direct_lru_release(t, md->name, xfer_failed);
    return rc;
}

bool
dp__direct_dequeue_locked(dp_direct *t, dp_direct_req *r)
{
    if (!dp__list_contains(&t->queue, &r->qlink))
        return false;
    dp__list_remove(&t->queue, &r->qlink);
    return true;
}

void
dp__direct_run_req_locked(dp_direct *t, dp_direct_req *r)
{
    set_state(r, REQ_RUNNING);
    pthread_mutex_unlock(&t->mu);

    dp_detail d;
    dp_detail_clear(&d);
    int rc = run_fetch(r, &d);
    dp__direct_release_targets(r);

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

void *
dp__direct_worker_main(void *arg)
{
    dp_direct *t = arg;
    pthread_mutex_lock(&t->mu);
    for (;;) {
        while (!t->stopping && dp__list_empty(&t->queue))
            pthread_cond_wait(&t->work_cv, &t->mu);
        if (t->stopping)
            break;
        dp_direct_req *r = DP_LIST_FIRST(&t->queue, dp_direct_req, qlink);
        dp__direct_dequeue_locked(t, r);
        dp__direct_run_req_locked(t, r);
    }
    pthread_mutex_unlock(&t->mu);
    return NULL;
}
