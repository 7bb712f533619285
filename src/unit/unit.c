/*
 * The storage unit core (docs/design.md, "Storage unit"): create and
 * destroy, the operations that move a blob record through its life (alloc,
 * commit, abort, release_rows), and the ticker thread (its step, which
 * expires leases and pins and hands back what gone writers left, is in
 * tick.c). The shared struct, the record states and the lock order are in
 * unit_int.h; every state change and a record's end are in rec.c.
 *
 * Design notes
 * ------------
 * Lifecycle of a region (no reuse under a transfer), with each record's state:
 *   alloc -> REC_ALLOCATED: a client WRITE may be running into it.
 *     commit (index validates   -> REC_PUBLISHED (a spill: REC_VALIDATED,
 *       and names this alloc)      then published by its io job, ssd.c)
 *     abort(in_flight=false)    -> freed now (the writer says nothing runs)
 *     abort(in_flight=true)     -> retired, counted in retired_bytes
 *     lease (alloc_lease_s)     -> retired, as abort(in_flight=true)
 *     its writer is gone        -> freed (writers.h: same-host, shared memory,
 *                                  process exited, reclaim_grace_s ago)
 *   retired: out of the table; handed back when its writer is gone
 *     (writers.h), else kept for good (retired_kept_bytes).
 *   REC_PUBLISHED, refs > 0: readers resolve it; each resolve pins it.
 *     refs reach 0 (overwrite, release_rows): it leaves the table, and is
 *       not pinned or held      -> freed now, or quarantined if a pin on it
 *                                  ever expired (a late READ may still run)
 *       pinned or held          -> REC_ZOMBIE until its last pin and hold
 *                                  end, then as above
 *       an io job owns it       -> REC_DOOMED until the job ends, then freed
 *
 * Identity. Each allocation gets a token (a counter); the blob's header must
 * name it and this unit's incarnation (drawn at create) for its commit to
 * publish it, so bytes left in a recycled region by an earlier put, or
 * written for an earlier process on the same port, are never published.
 * An allocation holds a reference to its writer (writers.h) until its commit
 * validates; a retired region holds one until it is handed back.
 *
 * Leases. Uncommitted records are kept on the pend list in creation order;
 * as every lease is alloc_lease_s long, that is also expiry order, so the
 * ticker retires expired ones from its head (a validated spill waiting for
 * the io queue is skipped: its WRITE is done).
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

#include "alloc/slab_alloc.h"
#include "unit/unit_int.h"

static double
default_now(void *ctx)
{
    (void)ctx;
    return dp__now_s();
}

void
dp__unit_opts_init(dp__unit_opts *o)
{
    memset(o, 0, sizeof *o);
    o->n_units = 1;
    o->replicas = 1;
    o->read_pin_s = 30.0;
    o->alloc_lease_s = 300.0;
    o->quarantine_s = 5.0;
    o->numa = DP_UNIT_NUMA_AUTO;
    o->pickup_s = 10.0;
    o->io_threads = 4;
    o->reclaim_grace_s = 5.0;
}

/* ---- lifecycle ---- */

/* The creation options' own consistency. */
static int
opts_check(const dp__unit_opts *opts, dp_detail *d)
{
    if (opts->n_units == 0 || opts->unit_id >= opts->n_units)
        return dp__fail(d, DP_EINVAL, "unit: unit id %u must be below the unit count %u",
                        opts->unit_id, opts->n_units);
    if (opts->slab_bytes < 4096)
        return dp__fail(d, DP_EINVAL, "unit: slab of %" PRIu64 " bytes is below 4 KiB",
                        opts->slab_bytes);
    if (!(opts->read_pin_s > 0) || !isfinite(opts->read_pin_s) ||
        !(opts->alloc_lease_s >= 0) || !isfinite(opts->alloc_lease_s) ||
        !(opts->quarantine_s >= 0) || !isfinite(opts->quarantine_s))
        return dp__fail(
            d, DP_EINVAL,
            "unit: read_pin_s must be > 0, alloc_lease_s and quarantine_s >= 0");
    bool ssd = opts->ssd_dir != NULL && opts->ssd_dir[0] != '\0';
    if (ssd && (opts->staging_bytes < 4096 || opts->staging_bytes > (1ull << 50)))
        return dp__fail(
            d, DP_EINVAL,
            "unit: the SSD tier needs staging_bytes of 4 KiB or more, not %" PRIu64,
            opts->staging_bytes);
    if (!ssd && opts->staging_bytes != 0)
        return dp__fail(d, DP_EINVAL, "unit: staging_bytes without ssd_dir");
    if (ssd && (!(opts->pickup_s >= 0) || !isfinite(opts->pickup_s) ||
                opts->io_threads == 0 || opts->io_threads > 256))
        return dp__fail(d, DP_EINVAL,
                        "unit: pickup_s must be >= 0 and io_threads 1..256 with ssd_dir");
    if (opts->replicas > DP_UNIT_MAX_REPLICAS || opts->replicas > opts->n_units)
        return dp__fail(d, DP_EINVAL,
                        "unit: replicas %u must be 1..%d (0: 1) and at most the %u units "
                        "of the cluster (each copy of a row lives on another unit)",
                        opts->replicas, DP_UNIT_MAX_REPLICAS, opts->n_units);
    if (!(opts->lease_s >= 0) || !isfinite(opts->lease_s) ||
        (opts->lease_s > 0 && opts->n_units < 3))
        return dp__fail(d, DP_EINVAL,
                        "unit: lease_s %g: read leases take seconds >= 0 (0: none) and "
                        "at least 3 units (%u): with 2, neither side of a cut link can "
                        "tell whether the other took writes",
                        opts->lease_s, opts->n_units);
    size_t cid_len = opts->cluster_id != NULL ? strlen(opts->cluster_id) : 0;
    if (cid_len > 0 && !dp__id_valid(opts->cluster_id, cid_len, DP_UNIT_ID_MAX))
        return dp__fail(d, DP_EINVAL,
                        "unit: cluster id '%s' must be 1..%d bytes of [A-Za-z0-9_.:-]",
                        opts->cluster_id, DP_UNIT_ID_MAX);
    return DP_OK;
}

int
dp__unit_create(const dp__unit_opts *opts, dp__unit **out, dp_detail *d)
{
    if (opts == NULL || out == NULL)
        return dp__fail(d, DP_EINVAL, "unit: opts and out are required");
    *out = NULL;
    int rc0 = opts_check(opts, d);
    if (rc0 != DP_OK)
        return rc0;
    size_t cid_len = opts->cluster_id != NULL ? strlen(opts->cluster_id) : 0;
    dp__unit *u = calloc(1, sizeof *u);
    if (u == NULL)
        return dp__fail(d, DP_ENOMEM, "unit: out of memory");
    u->o = *opts;
    if (u->o.replicas == 0)
        u->o.replicas = 1;
    memcpy(u->cluster_id, opts->cluster_id != NULL ? opts->cluster_id : "", cid_len + 1);
    u->o.cluster_id = u->cluster_id;
    if (u->o.ep != NULL)
        dp__endpoint_transports(u->o.ep, u->transports, sizeof u->transports);
    if (u->o.now == NULL)
        u->o.now = default_now;
    u->last_report = dp__unit_now(u);
    pthread_mutex_init(&u->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&u->cv, &ca);
    pthread_cond_init(&u->admin_cv, NULL);
    pthread_condattr_destroy(&ca);
    pthread_cond_init(&u->io_cv, NULL);
    u->ssd = opts->ssd_dir != NULL && opts->ssd_dir[0] != '\0';
    u->region_len = (size_t)u->o.slab_bytes;
    if (u->ssd) {
        u->io_base = DP_ALIGN_UP(u->o.slab_bytes, 4096);
        u->region_len = u->io_base + u->o.staging_bytes;
        u->ssd_dir = strdup(opts->ssd_dir);
        u->o.ssd_dir = u->ssd_dir;
        if (u->ssd_dir == NULL) {
            free(u);
            return dp__fail(d, DP_ENOMEM, "unit: out of memory");
        }
    }
    dp__map_init_str(&u->blobs);
    dp__map_init_u64(&u->rows);
    dp__map_init_u64(&u->tombs);
    u->repair_state = u->o.repair ? DP_UNIT_REPAIR_RUNNING : DP_UNIT_REPAIR_NONE;
    dp__map_init_str(&u->pins);
    dp__map_init_str(&u->superseded);
    dp__map_init_str(&u->order);
    dp__unit_numa_apply(u->o.numa, u->o.unit_id, u->numa_desc, sizeof u->numa_desc);
    int rc = dp__writers_create(u->o.reclaim_grace_s, dp__host_key(), &u->writers, d);
    if (rc == 0)
        rc = dp__lease_init(u, d);
    if (rc != 0)
        goto fail;
    /* A random, non-zero incarnation tells this process from any earlier one. */
    do {
        rc = dp__random_bytes(&u->incarnation, sizeof u->incarnation, d);
        if (rc != 0)
            goto fail;
    } while (u->incarnation == 0);
    if (u->o.ep != NULL) {
        void *addr = NULL;
        rc = dp__endpoint_alloc(u->o.ep, (size_t)u->region_len, &addr, d);
        if (rc != 0) {
            dp__fail_ctx(d, rc,
                         "unit %u: slab of %" PRIu64 " bytes (IO area %" PRIu64 " bytes)",
                         u->o.unit_id, u->o.slab_bytes, u->o.staging_bytes);
            goto fail;
        }
        u->slab = addr;
    } else {
        u->slab_map_len = (size_t)u->region_len;
        void *p = mmap(NULL, u->slab_map_len, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) {
            rc = dp__fail_sys(d, errno, "unit: mmap of a %" PRIu64 "-byte slab",
                              u->region_len);
            u->slab_map_len = 0;
            goto fail;
        }
        u->slab = p;
    }
    rc = dp__slab_alloc_create(u->o.slab_bytes, DP_BLOB_ALIGN, &u->alloc, d);
    if (rc != 0)
        goto fail;
    if (u->ssd) {
        rc = dp__slab_alloc_create(u->o.staging_bytes, DP_BLOB_ALIGN, &u->io_alloc, d);
        if (rc == 0)
            rc = dp__ssd_open(u, d);
        if (rc != 0)
            goto fail;
    }
    *out = u;
    return 0;
fail:
    dp__unit_destroy(u);
    return rc;
}

static void *
ticker_main(void *arg)
{
    dp__unit *u = arg;
    pthread_mutex_lock(&u->mu);
    while (!u->stopping) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        double t = (double)ts.tv_sec + (double)ts.tv_nsec / 1e9 + u->period_s;
        ts.tv_sec = (time_t)t;
        ts.tv_nsec = (long)((t - (double)ts.tv_sec) * 1e9);
        int rc = pthread_cond_timedwait(&u->cv, &u->mu, &ts);
        if (u->stopping)
            break;
        if (rc == ETIMEDOUT) {
            pthread_mutex_unlock(&u->mu);
            dp__unit_tick(u);
            pthread_mutex_lock(&u->mu);
        }
    }
    pthread_mutex_unlock(&u->mu);
    return NULL;
}

int
dp__unit_start_ticker(dp__unit *u, double period_s, dp_detail *d)
{
    if (!(period_s > 0) || !isfinite(period_s))
        return dp__fail(d, DP_EINVAL, "unit: ticker period must be > 0");
    pthread_mutex_lock(&u->mu);
    if (u->ticker_on) {
        pthread_mutex_unlock(&u->mu);
        return dp__fail(d, DP_EINVAL, "unit: ticker already running");
    }
    u->period_s = period_s;
    int e = pthread_create(&u->ticker, NULL, ticker_main, u);
    if (e == 0)
        u->ticker_on = true;
    pthread_mutex_unlock(&u->mu);
    if (e != 0)
        return dp__fail_sys(d, e, "unit: starting the ticker thread");
    return 0;
}

void
dp__unit_admin_begin(dp__unit *u)
{
    pthread_mutex_lock(&u->mu);
    u->n_admin++;
    pthread_mutex_unlock(&u->mu);
}

void
dp__unit_admin_end(dp__unit *u)
{
    pthread_mutex_lock(&u->mu);
    if (--u->n_admin == 0)
        pthread_cond_broadcast(&u->admin_cv);
    pthread_mutex_unlock(&u->mu);
}

/* A save or load asked to stop (the unit is being destroyed): fail it now. */
int
dp__unit_admin_cancelled(dp__unit *u, const char *what, dp_detail *d)
{
    if (!__atomic_load_n(&u->admin_cancel, __ATOMIC_ACQUIRE))
        return DP_OK;
    return dp__fail(d, DP_ECLOSED, "%s: the unit is stopping", what);
}

void
dp__unit_admin_wait(dp__unit *u)
{
    pthread_mutex_lock(&u->mu);
    if (u->n_admin > 0)
        DP_LOG_I("unit %u: stopping %u running save/load (each stops at its next blob)",
                 u->o.unit_id, u->n_admin);
    while (u->n_admin > 0)
        pthread_cond_wait(&u->admin_cv, &u->mu);
    pthread_mutex_unlock(&u->mu);
}

void
dp__unit_destroy(dp__unit *u)
{
    if (u == NULL)
        return;
    __atomic_store_n(&u->admin_cancel, 1, __ATOMIC_RELEASE);
    dp__unit_admin_wait(u);
    pthread_mutex_lock(&u->mu);
    bool join = u->ticker_on;
    u->stopping = true;
    pthread_cond_broadcast(&u->cv);
    pthread_mutex_unlock(&u->mu);
    if (join)
        pthread_join(u->ticker, NULL);
    dp__ssd_stop(u);
    /* Pins first: they own the zombies. */
    dp__pins_fini_locked(u);
    /* Draining records: serving stopped, no WRITE lands any more. */
    for (blob_rec *b; (b = DP_LIST_FIRST(&u->draining, blob_rec, pend_link)) != NULL;) {
        dp__list_remove(&u->draining, &b->pend_link);
        dp__rec_free_locked(u, b);
    }
    size_t it = 0;
    void *v;
    while (dp__map_next(&u->rows, &it, NULL, NULL, NULL, &v))
        dp__row_free_locked(u, v);
    it = 0;
    while (dp__map_next(&u->blobs, &it, NULL, NULL, NULL, &v)) {
        blob_rec *b = v;
        if (b->fd >= 0)
            close(b->fd);
        dp__rec_free_locked(u, b);
    }
    dp__ssd_fini(u);
    dp__order_fini(u);
    dp__map_fini(&u->rows);
    dp__rows_spare_fini(u);
    dp__map_fini(&u->tombs);
    dp__lease_fini(u);
    dp__map_fini(&u->blobs);
    dp__map_fini(&u->pins);
    dp__writers_destroy(u->writers);
    dp__slab_alloc_destroy(u->alloc);
    if (u->slab != NULL) {
        if (u->o.ep != NULL)
            dp__endpoint_deregister(u->o.ep, u->slab, NULL);
        else
            munmap(u->slab, u->slab_map_len);
    }
    pthread_cond_destroy(&u->cv);
    pthread_cond_destroy(&u->admin_cv);
    pthread_cond_destroy(&u->io_cv);
    pthread_mutex_destroy(&u->mu);
    free(u);
}

void
dp__unit_set_address(dp__unit *u, const char *zmq_address)
{
    pthread_mutex_lock(&u->mu);
    snprintf(u->address, sizeof u->address, "%s", zmq_address ? zmq_address : "");
    pthread_mutex_unlock(&u->mu);
}

void
dp__unit_lock(dp__unit *u)
{
    pthread_mutex_lock(&u->mu);
}

void
dp__unit_unlock(dp__unit *u)
{
    pthread_mutex_unlock(&u->mu);
}

uint32_t
dp__unit_id(const dp__unit *u)
{
    return u->o.unit_id;
}

uint64_t
dp__unit_slab_bytes(const dp__unit *u)
{
    return u->o.slab_bytes;
}

uint64_t
dp__unit_io_bytes(const dp__unit *u)
{
    return u->ssd ? u->o.staging_bytes : 0;
}

uint64_t
dp__unit_io_base(const dp__unit *u)
{
    return u->io_base;
}

uint8_t *
dp__unit_slab(const dp__unit *u)
{
    return u->slab;
}

dp__endpoint *
dp__unit_endpoint(const dp__unit *u)
{
    return u->o.ep;
}

const char *
dp__unit_numa_desc(const dp__unit *u)
{
    return u->numa_desc;
}

uint64_t
dp__unit_incarnation(const dp__unit *u)
{
    return u->incarnation;
}

uint64_t
dp__unit_alloc_token(dp__unit *u, const char *blob_id, size_t id_len)
{
    pthread_mutex_lock(&u->mu);
    blob_rec *b = dp__map_get(&u->blobs, blob_id, id_len);
    uint64_t t = b != NULL && b->state != REC_PUBLISHED ? b->token : 0;
    pthread_mutex_unlock(&u->mu);
    return t;
}

/* ---- alloc ---- */

static uint64_t
retired_now_locked(const dp__unit *u)
{
    dp__writers_stats ws;
    dp__writers_get_stats(u->writers, &ws);
    return ws.retired_bytes;
}

/* Put-area region: 0, DP_EBUSY/DP_EUNITFULL (counted by the caller), others. */
int
dp__unit_put_alloc_locked(dp__unit *u, uint64_t nbytes, double now, uint64_t *off,
                          const char **reason, dp_detail *d)
{
    dp_detail ad;
    dp_detail_clear(&ad);
    int rc = dp__slab_alloc_alloc(u->alloc, nbytes, off, &ad);
    if (rc == DP_EUNITFULL && dp__slab_alloc_sweep(u->alloc, now) > 0)
        rc = dp__slab_alloc_alloc(u->alloc, nbytes, off, &ad);
    if (rc == 0)
        return 0;
    if (rc != DP_EUNITFULL)
        return dp__fail(d, rc == DP_ETOOBIG ? DP_EPROTO : rc, "%s", dp_detail_msg(&ad));
    dp__slab_alloc_stats st;
    dp__slab_alloc_get_stats(u->alloc, &st);
    uint64_t pending = st.quarantined_bytes + u->stats.zombie_bytes;
    if (pending > 0 && st.free_bytes + pending >= nbytes) {
        if (reason != NULL)
            *reason = st.quarantined_bytes > 0 ? "quarantine" : "pins";
        return dp__fail(d, DP_EBUSY,
                        "unit %u: no room for %" PRIu64
                        " bytes now (largest free %" PRIu64 ", free %" PRIu64
                        "); %" PRIu64 " bytes in quarantine and %" PRIu64
                        " held by pins of released blobs will free: retry",
                        u->o.unit_id, nbytes, st.largest_free, st.free_bytes,
                        st.quarantined_bytes, u->stats.zombie_bytes);
    }
    return dp__fail(
        d, DP_EUNITFULL,
        "unit %u: no room for %" PRIu64 " bytes (largest free %" PRIu64 ", free %" PRIu64
        ", retired %" PRIu64 ") and nothing pending frees any",
        u->o.unit_id, nbytes, st.largest_free, st.free_bytes, retired_now_locked(u));
}

/*
 * A region of nbytes for an alloc: in the put area, else (spill with the SSD
 * tier on) in the IO area. Busy and UnitFull are counted here; Busy's static
 * reason goes to *reason.
 */
static int
region_locked(dp__unit *u, const dp__wire_alloc_args *args, double now, uint64_t *o,
              bool *in_io, const char **reason, dp_detail *d)
{
    uint64_t nbytes = args->nbytes;
    bool to_io = args->spill && !args->repair && u->ssd && nbytes <= u->o.staging_bytes;
    bool to_put = nbytes <= u->o.slab_bytes;
    const char *why = NULL;
    dp_detail pd;
    dp_detail_clear(&pd);
    *in_io = false;
    int rc =
        to_put ? dp__unit_put_alloc_locked(u, nbytes, now, o, &why, &pd) : DP_EUNITFULL;
    if ((rc == DP_EUNITFULL || rc == DP_EBUSY) && to_io) {
        int prc = rc;
        const char *iwhy = NULL;
        rc = dp__ssd_io_alloc_locked(u, nbytes, now, o, &iwhy, d);
        if (rc == 0) {
            *in_io = true;
        } else if (prc == DP_EBUSY && rc == DP_EUNITFULL) {
            rc = DP_EBUSY; /* the put area will free room */
            dp__fail(d, rc, "%s", dp_detail_msg(&pd));
        } else if (rc == DP_EBUSY) {
            why = iwhy;
        }
    } else if (rc != 0) {
        dp__fail(d, rc, "%s", dp_detail_msg(&pd));
    }
    if (rc == DP_EBUSY) {
        u->stats.n_busy++;
        if (reason != NULL)
            *reason = why;
    } else if (rc == DP_EUNITFULL) {
        u->stats.n_full++;
    } else if (rc != 0) {
        if (rc == DP_EPROTO)
            u->stats.n_proto++;
        dp__fail_ctx(d, rc, "alloc %.*s", (int)args->blob_id.n, args->blob_id.p);
    }
    return rc;
}

/* The record of a new allocation at region o (in_io: the IO area), in the table. */
static int
rec_new_locked(dp__unit *u, const dp__wire_alloc_args *args, uint64_t o, bool in_io,
               double now, blob_rec **out, dp_detail *d)
{
    dp__slab_alloc *a = in_io ? u->io_alloc : u->alloc;
    uint64_t ao = in_io ? o - u->io_base : o;
    blob_rec *b = calloc(1, sizeof *b);
    if (b == NULL) {
        dp__slab_alloc_free(a, ao, NULL);
        return dp__fail(d, DP_ENOMEM, "alloc: out of memory");
    }
    memcpy(b->id, args->blob_id.p, args->blob_id.n);
    b->id_len = args->blob_id.n;
    b->off = o;
    b->nbytes = args->nbytes;
    b->size = args->nbytes;
    dp__slab_alloc_size_of(a, ao, &b->size);
    dp__rec_set_state(b, REC_ALLOCATED);
    b->area = in_io ? REC_AREA_IO : REC_AREA_PUT;
    b->fd = -1;
    b->n_entries_decl = args->n_entries;
    b->created_at = now;
    b->token = ++u->token_seq;
    if (dp__map_put(&u->blobs, b->id, b->id_len, b, NULL) != 0) {
        dp__slab_alloc_free(a, ao, NULL);
        free(b);
        return dp__fail(d, DP_ENOMEM, "alloc: out of memory");
    }
    b->writer = dp__writers_ref(u->writers, args);
    if (args->two_sided)
        dp__rec_flag_locked(b, REC_TWO_SIDED, true);
    if (args->repair)
        dp__rec_flag_locked(b, REC_REPAIR, true);
    dp__list_insert_tail(&u->pend, &b->pend_link);
    u->stats.n_alloc++;
    /* The id names a new blob now, not a superseded spill. */
    dp__ssd_superseded_forget_locked(u, b->id, b->id_len);
    *out = b;
    return DP_OK;
}

/*
 * alloc under u->mu. fresh (an inline put): an id already in the table is
 * refused, never answered as a retried alloc (the unit is about to copy into
 * the region itself). *out: the new or retried record.
 */
static int
alloc_locked(dp__unit *u, const dp__wire_alloc_args *args, bool fresh,
             dp__wire_alloc_res *res, blob_rec **out, const char **reason, dp_detail *d)
{
    const char *blob_id = args->blob_id.p;
    size_t id_len = args->blob_id.n;
    uint64_t nbytes = args->nbytes;
    *out = NULL;
    if (reason != NULL)
        *reason = NULL;
    if (!dp__id_valid(blob_id, id_len, DP_UNIT_ID_MAX))
        return dp__fail(d, DP_EPROTO,
                        "alloc: blob id must be 1..%d bytes of [A-Za-z0-9_.:-]",
                        DP_UNIT_ID_MAX);
    if (nbytes == 0)
        return dp__fail(d, DP_EPROTO, "alloc %.*s: nbytes must be > 0", (int)id_len,
                        blob_id);
    blob_rec *b = dp__map_get(&u->blobs, blob_id, id_len);
    if (b != NULL) {
        if (!fresh && b->state == REC_ALLOCATED && b->nbytes == nbytes) {
            *out = b; /* a retried alloc */
            res->off = b->off;
            res->token = b->token;
            return DP_OK;
        }
        u->stats.n_proto++;
        return dp__fail(d, DP_EPROTO,
                        "alloc %.*s: blob id already in use (%s, %" PRIu64 " bytes)",
                        (int)id_len, blob_id,
                        b->state == REC_PUBLISHED   ? "committed"
                        : b->state != REC_ALLOCATED ? "committing"
                                                    : "allocated",
                        b->nbytes);
    }
    if (nbytes > u->o.slab_bytes &&
        !(args->spill && u->ssd && nbytes <= u->o.staging_bytes)) {
        u->stats.n_proto++;
        return dp__fail(d, DP_EPROTO,
                        "alloc %.*s: %" PRIu64 " bytes can never fit a %" PRIu64
                        "-byte slab%s (IO area %" PRIu64 " bytes)",
                        (int)id_len, blob_id, nbytes, u->o.slab_bytes,
                        args->spill ? "" : " without spill", dp__unit_io_bytes(u));
    }
    double now = dp__unit_now(u);
    uint64_t o = 0;
    bool in_io = false;
    int rc = region_locked(u, args, now, &o, &in_io, reason, d);
    if (rc == DP_OK)
        rc = rec_new_locked(u, args, o, in_io, now, out, d);
    if (rc == DP_OK) {
        res->off = o;
        res->token = (*out)->token;
    }
    return rc;
}

int
dp__unit_alloc_req(dp__unit *u, const dp__wire_alloc_args *args, dp__wire_alloc_res *res,
                   const char **reason, dp_detail *d)
{
    blob_rec *b;
    pthread_mutex_lock(&u->mu);
    int rc = alloc_locked(u, args, false, res, &b, reason, d);
    pthread_mutex_unlock(&u->mu);
    return rc;
}

/* ---- commit ---- */

/* A repair copy's entry versions (vers, if any) into b; n its entries. */
static int
take_vers_locked(blob_rec *b, const dp__wire_u64s *vers, uint32_t n, dp_detail *d)
{
    free(b->vers); /* a commit asked again after a failed publish parses again */
    b->vers = NULL;
    if (vers == NULL || vers->n == 0)
        return 0;
    if (!(b->flags & REC_REPAIR) || vers->n != n)
        return dp__fail(d, DP_EPROTO,
                        "commit %s: %u entry versions for a %s of %u entries (a "
                        "repair's copy names one per entry, other puts none)",
                        b->id, vers->n, (b->flags & REC_REPAIR) ? "repair copy" : "put",
                        n);
    if ((b->vers = malloc((size_t)n * sizeof *b->vers)) == NULL)
        return dp__fail(d, DP_ENOMEM, "commit %s: out of memory", b->id);
    memcpy(b->vers, vers->v, (size_t)n * sizeof *b->vers);
    return 0;
}

/*
 * Refuse validated b as stale ("Versions"): nothing published, the region
 * freed (the client's WRITE is done); *stale gets the highest version held
 * of a key it would replace.
 */
static int
refuse_stale_locked(dp__unit *u, blob_rec *b, uint64_t *stale, double now, dp_detail *d)
{
    uint64_t high = dp__rows_stale_locked(u, b);
    u->stats.versions_refused++;
    if (stale != NULL)
        *stale = high;
    int rc = dp__fail(d, DP__ESTALE,
                      "commit %s: version %" PRIu64 " is below version %" PRIu64
                      " of a key it would replace; nothing published",
                      b->id, b->ver, high);
    /* A commit asked again (its reply lost) answers the same, not "lost". */
    dp__ssd_superseded_add_stale_locked(u, b, now, high);
    dp__rec_discard_open_locked(u, b, now);
    return rc;
}

static int
commit_locked(dp__unit *u, const char *blob_id, size_t id_len, uint64_t ver,
              const dp__wire_u64s *vers, dp__wire_commit_state *state, uint64_t *stale,
              dp_detail *d)
{
    int rc = 0;
    dp__blob *pb = NULL;
    double now = dp__unit_now(u);
    blob_rec *b = dp__map_get(&u->blobs, blob_id, id_len);
    const superseded *sup =
        b == NULL ? dp__map_get(&u->superseded, blob_id, id_len) : NULL;
    if (sup != NULL && sup->stale != 0) { /* refused as stale: asked again */
        if (stale != NULL)
            *stale = sup->stale;
        rc = dp__fail(d, DP__ESTALE,
                      "commit %.*s: refused before, below version %" PRIu64
                      " of a key it would replace; nothing published",
                      (int)id_len, blob_id, sup->stale);
        goto out;
    }
    if (sup != NULL) {
        *state = DP_WIRE_COMMIT_DONE; /* landed, and replaced before its spill ended */
        goto out;
    }
    if (b == NULL || b->state == REC_ABORTING || b->state == REC_ABORTING_RETIRE) {
        *state = DP_WIRE_COMMIT_LOST;
        goto out;
    }
    if (b->state == REC_PUBLISHED) {
        *state = DP_WIRE_COMMIT_DONE;
        goto out;
    }
    if (b->flags & REC_JOB) { /* its spill runs */
        *state = DP_WIRE_COMMIT_PENDING;
        goto out;
    }
    if (b->state == REC_ALLOCATED && b->n_rx > 0) {
        u->stats.n_proto++;
        rc = dp__fail(d, DP_EPROTO,
                      "commit %s: a two-sided WRITE into it is still landing; commit "
                      "after the WRITE has ended",
                      b->id);
        goto out;
    }
    if (b->state == REC_ALLOCATED) {
        dp__blob_parse_opts po = {0};
        po.n_units = u->o.n_units;
        po.unit_index = u->o.unit_id;
        po.replicas = u->o.replicas;
        rc = dp__blob_parse(u->slab + b->off, (size_t)b->nbytes, &po, &pb, d);
        if (rc != 0) {
            if (rc == DP_EPROTO)
                u->stats.n_proto++;
            dp__fail_ctx(d, rc, "commit %s", b->id);
            goto out;
        }
        const dp__blob_header *h = dp__blob_get_header(pb);
        if (h->alloc_incarnation != u->incarnation || h->alloc_token != b->token) {
            u->stats.n_proto++;
            u->stats.identity_refused++;
            rc = dp__fail(
                d, DP_EPROTO,
                "commit %s: the blob names allocation %016" PRIx64 "/%" PRIu64
                ", not this one (%016" PRIx64 "/%" PRIu64
                "): stale bytes of an earlier put, or a blob written for another "
                "unit process; nothing published",
                b->id, h->alloc_incarnation, h->alloc_token, u->incarnation, b->token);
            goto out;
        }
        uint32_t n = dp__blob_count(pb);
        if (b->n_entries_decl != 0 && n != b->n_entries_decl) {
            u->stats.n_proto++;
            rc = dp__fail(d, DP_EPROTO,
                          "commit %s: the blob's index has %u entries, alloc announced "
                          "%" PRIu64,
                          b->id, n, b->n_entries_decl);
            goto out;
        }
        if ((rc = take_vers_locked(b, vers, n, d)) != 0) {
            if (rc == DP_EPROTO)
                u->stats.n_proto++;
            goto out;
        }
        b->parsed = pb;
        pb = NULL;
        /* Validated: the client's WRITE is done, nothing of the writer's runs. */
        dp__writers_unref(u->writers, b->writer);
        b->writer = NULL;
        b->ver = ver;
        /* A spill is checked now (the publish is its io job's); other blobs
         * as they publish, below. The client puts again above a refusal. */
        if (b->area == REC_AREA_IO && !(b->flags & REC_REPAIR) &&
            dp__rows_stale_locked(u, b) != 0) {
            rc = refuse_stale_locked(u, b, stale, now, d);
            goto out;
        }
    }
    /* Commits are ordered here, when the index validated: a spill published
     * later by its io job never overrides what a later commit or release did. */
    if (b->commit_seq == 0)
        b->commit_seq = ++u->commit_seq;
    if (b->area == REC_AREA_IO) {
        /* A spill: an io job writes it to a file, then publishes it. */
        dp__rec_set_state(b, REC_VALIDATED);
        if (!dp__ssd_jobs_full_locked(u)) {
            /* Off the pend list: no lease, the client's WRITE is done. */
            dp__list_remove(&u->pend, &b->pend_link);
            dp__ssd_submit_locked(u, JOB_SPILL, b);
        }
        *state = DP_WIRE_COMMIT_PENDING;
        goto out;
    }
    uint8_t *keep = NULL;
    if (b->flags & REC_REPAIR) {
        /* A repair's copy: only keys the unit lacks, of rows not cleared since. */
        uint32_t kept = 0;
        if ((keep = dp__repair_keep_locked(u, b, &kept)) == NULL) {
            dp__blob_destroy(b->parsed);
            b->parsed = NULL;
            rc = dp__fail(d, DP_ENOMEM, "commit %s: out of memory", b->id);
            goto out;
        }
        dp__repair_counted_locked(u, b, keep, kept);
        if (kept == 0) { /* nothing to publish: the region goes back */
            free(keep);
            /* A commit asked again (its reply lost) answers done too. */
            dp__ssd_superseded_add_locked(u, b, now);
            dp__rec_discard_open_locked(u, b, now);
            *state = DP_WIRE_COMMIT_DONE;
            goto out;
        }
    }
    rc = dp__rows_publish_locked(u, b, keep, now, d);
    free(keep);
    if (rc == DP__ESTALE) {
        rc = refuse_stale_locked(u, b, stale, now, d);
        goto out;
    }
    if (rc != 0) {
        dp__blob_destroy(b->parsed);
        b->parsed = NULL;
        goto out;
    }
    *state = DP_WIRE_COMMIT_DONE;
out:
    dp__blob_destroy(pb);
    return rc;
}

int
dp__unit_commit_ver(dp__unit *u, const char *blob_id, size_t id_len, uint64_t ver,
                    const dp__wire_u64s *vers, dp__wire_commit_state *state,
                    uint64_t *stale, dp_detail *d)
{
    if (!dp__id_valid(blob_id, id_len, DP_UNIT_ID_MAX))
        return dp__fail(d, DP_EPROTO,
                        "commit: blob id must be 1..%d bytes of [A-Za-z0-9_.:-]",
                        DP_UNIT_ID_MAX);
    pthread_mutex_lock(&u->mu);
    int rc = commit_locked(u, blob_id, id_len, ver, vers, state, stale, d);
    pthread_mutex_unlock(&u->mu);
    return rc;
}

int
dp__unit_commit(dp__unit *u, const char *blob_id, size_t id_len,
                dp__wire_commit_state *state, dp_detail *d)
{
    return dp__unit_commit_ver(u, blob_id, id_len, 0, NULL, state, NULL, d);
}

/* ---- inline put ---- */

int
dp__unit_put_inline(dp__unit *u, const dp__wire_put_args *args,
                    dp__wire_commit_state *state, const char **reason, uint64_t *stale,
                    dp_detail *d)
{
    const char *blob_id = args->blob_id.p;
    size_t id_len = args->blob_id.n;
    uint64_t nbytes = args->data.n;
    if (reason != NULL)
        *reason = NULL;
    if (!dp__id_valid(blob_id, id_len, DP_UNIT_ID_MAX))
        return dp__fail(d, DP_EPROTO,
                        "put: blob id must be 1..%d bytes of [A-Za-z0-9_.:-]",
                        DP_UNIT_ID_MAX);
    pthread_mutex_lock(&u->mu);
    int rc = 0;
    if (args->incarnation != 0 && args->incarnation != u->incarnation) {
        /* Meant for the process before a restart: as an alloc answered by
         * this one, it stores nothing (the client reports the restart). */
        u->stats.restart_refused++;
        rc = dp__fail(d, DP_EPROTO,
                      "put %.*s was meant for unit process %016" PRIx64
                      ", this is %016" PRIx64 " (restarted): nothing stored",
                      (int)id_len, blob_id, args->incarnation, u->incarnation);
        goto out;
    }
    if (nbytes < DP_BLOB_HEADER_LEN || nbytes > DP_UNIT_INLINE_MAX) {
        u->stats.n_proto++;
        rc = dp__fail(d, DP_EPROTO,
                      "put %.*s: an inline blob is %u..%u bytes, not %" PRIu64
                      " (alloc and WRITE a larger one)",
                      (int)id_len, blob_id, DP_BLOB_HEADER_LEN, DP_UNIT_INLINE_MAX,
                      nbytes);
        goto out;
    }
    /* No writer: nobody but this thread ever writes the region. */
    dp__wire_alloc_args a = {.blob_id = args->blob_id,
                             .nbytes = nbytes,
                             .n_entries = args->n_entries,
                             .spill = args->spill,
                             .repair = args->repair};
    dp__wire_alloc_res r;
    blob_rec *b = NULL;
    rc = alloc_locked(u, &a, true, &r, &b, reason, d);
    if (rc != 0) {
        dp__fail_ctx(d, rc, "put");
        goto out;
    }
    uint8_t *dst = u->slab + b->off;
    memcpy(dst, args->data.p, nbytes);
    /* The unit names the allocation itself: the client never learnt it. */
    dp__blob_header_set_alloc(dst, u->incarnation, b->token);
    rc = commit_locked(u, blob_id, id_len, args->ver, &args->vers, state, stale, d);
    if (rc != 0) {
        /* Nothing published and nobody else writes it: free it now, not at the
         * client's abort or the lease's end (a stale one was). */
        if (rc != DP__ESTALE && b->state == REC_ALLOCATED)
            dp__rec_discard_open_locked(u, b, dp__unit_now(u));
        dp__fail_ctx(d, rc, "put");
        goto out;
    }
    u->stats.n_put_inline++;
out:
    pthread_mutex_unlock(&u->mu);
    return rc;
}

/* ---- abort ---- */

void
dp__unit_abort(dp__unit *u, const char *blob_id, size_t id_len, bool in_flight)
{
    if (!dp__id_valid(blob_id, id_len, DP_UNIT_ID_MAX))
        return;
    pthread_mutex_lock(&u->mu);
    blob_rec *b = dp__map_get(&u->blobs, blob_id, id_len);
    if (b != NULL && (b->state == REC_ALLOCATED || b->state == REC_VALIDATED)) {
        u->stats.n_abort++;
        if (b->flags & REC_JOB) {
            /* Its spill runs: the job's end drops it instead of publishing. */
            dp__rec_set_state(b, in_flight ? REC_ABORTING_RETIRE : REC_ABORTING);
        } else if (in_flight) {
            dp__rec_retire_locked(u, b);
        } else {
            dp__rec_discard_open_locked(u, b, dp__unit_now(u));
        }
    }
    pthread_mutex_unlock(&u->mu);
}
