/*
 * The storage unit core: the slab, its allocator, the blob table, the row
 * index and pins (DESIGN section 6, seed 002 NixlStorageUnit).
 *
 * Design notes
 * ------------
 * Ownership. The unit owns the slab (from dp_endpoint_alloc, or mmap without
 * an endpoint), the allocator, every blob record, row, slot and pin. A blob
 * record lives in the blob table (id -> rec) from alloc until it is retired,
 * aborted or released; a released record that is still pinned leaves the table
 * (its id may be reused at once) and lives on as a "zombie", owned by its pins,
 * until the last pin ends. A record owns its parsed index (dp_blob): row-index
 * slots and resolve results point into it.
 *
 * Lifecycle of a region (invariant 1, no reuse under a transfer):
 *   alloc -> uncommitted: a client WRITE may be running into it.
 *     commit (index validates)  -> published
 *     abort(in_flight=false)    -> freed now (the writer says nothing runs)
 *     abort(in_flight=true)     -> retired: never freed, counted in retired_bytes
 *     lease (alloc_lease_s)     -> retired, as abort(in_flight=true)
 *   published, refs > 0: readers resolve it; each resolve pins it.
 *     refs reach 0 (overwrite, release_rows):
 *       not pinned              -> freed now, or quarantined if a pin on it
 *                                  ever expired (a late READ may still run)
 *       pinned                  -> zombie until its last pin ends, then as above
 * A pin ended by unpin means the reader is done; a pin that expired marks its
 * blobs, so their region goes through quarantine (quarantine_s) before reuse.
 *
 * Refs. A published record's refs is the number of row-index slots pointing
 * at it; the slots are the only counted references. Pins do not hold refs:
 * they hold n_pins, and keep a dead record alive.
 *
 * Atomic publish. commit first makes sure every row and slot it needs exists
 * (creating empty placeholders), which is the only step that allocates; on
 * failure it removes the placeholders and nothing changed. Then it points the
 * slots at the new blob, which cannot fail, and drops the old blobs' refs.
 *
 * Time. Every timestamp comes from one monotonic clock (opts.now, dp_now_s by
 * default). Pins are kept in a list in creation order; as every pin lives
 * read_pin_s, that is also expiry order, so the ticker pops expired pins from
 * the head. Uncommitted records are kept in creation order the same way for
 * the lease.
 *
 * Locks. One unit lock (mu) guards everything above. The ctl thread (through
 * serve.c), the ticker thread and test callers take it; nothing blocking runs
 * under it (no transfer, no file I/O, no ZMQ). The ticker's condition variable
 * waits on mu itself. Lock order: mu, then the allocator (not thread-safe,
 * used only under mu), then the endpoint's internal lock (only
 * dp_endpoint_name, which takes none, is called under mu; metadata is fetched
 * by serve.c outside mu).
 */
#include "unit/unit.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <numa.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "alloc/slab_alloc.h"
#include "blob/blob.h"
#include "blob/keys.h"
#include "common/map.h"

typedef struct blob_rec blob_rec;
struct blob_rec {
    char id[DP_UNIT_ID_MAX + 1];
    uint32_t id_len;
    uint64_t off;    /* slab offset */
    uint64_t nbytes; /* as asked by alloc: the blob's total_len */
    uint64_t size;   /* as allocated (rounded up) */
    uint64_t n_entries_decl;
    uint64_t refs;
    uint32_t n_pins;
    bool published;
    bool dead;        /* released while pinned: a zombie */
    bool pin_expired; /* sticky: some pin on it expired */
    dp_blob *parsed;  /* after commit */
    uint64_t pin_mark;
    double created_at;
    double last_resolve_at;
    blob_rec *pprev, *pnext; /* uncommitted list, creation order */
};

typedef struct pin pin;
struct pin {
    char id[33];
    double expiry;
    blob_rec **blobs;
    uint32_t n;
    pin *prev, *next; /* creation (= expiry) order */
};

typedef struct slot {
    blob_rec *b; /* NULL only while commit builds placeholders */
    uint32_t i;  /* entry index in b->parsed */
} slot;

typedef struct row {
    dp_map fields; /* field -> slot* */
} row;

struct dp_unit {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    dp_unit_opts o;
    uint8_t *slab;
    size_t slab_map_len; /* mmap'd length when not from the endpoint */
    dp_slab_alloc *alloc;
    dp_map blobs; /* id -> blob_rec* */
    dp_map rows;  /* gidx -> row* */
    dp_map pins;  /* pin id -> pin* */
    blob_rec *pend_head, *pend_tail;
    pin *pin_head, *pin_tail;
    uint64_t pin_epoch;
    uint64_t n_published, n_entries;
    uint64_t n_zombies, zombie_bytes;
    uint64_t retired_bytes, n_retired, leases_expired, pins_expired;
    uint64_t n_alloc, n_commit, n_abort, n_busy, n_full, n_proto;
    uint64_t n_resolve, n_unpin, n_release, n_ticks;
    char address[256];
    char numa_desc[128];
    pthread_t ticker;
    bool ticker_on;
    bool stopping;
    double period_s;
    double last_report; /* when the ticker last logged the counters */
    uint64_t report_sig;
};

static double
default_now(void *ctx)
{
    (void)ctx;
    return dp_now_s();
}

static double
now_s(dp_unit *u)
{
    return u->o.now(u->o.now_ctx);
}

void
dp_unit_opts_init(dp_unit_opts *o)
{
    memset(o, 0, sizeof *o);
    o->n_units = 1;
    o->read_pin_s = 30.0;
    o->alloc_lease_s = 300.0;
    o->quarantine_s = 5.0;
    o->numa = DP_UNIT_NUMA_AUTO;
}

static bool
valid_id(const char *p, size_t n)
{
    if (n == 0 || n > DP_UNIT_ID_MAX)
        return false;
    for (size_t i = 0; i < n; i++) {
        char c = p[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
              (c >= '0' && c <= '9') || c == '_' || c == '.' || c == ':' || c == '-'))
            return false;
    }
    return true;
}

/* ---- NUMA placement ---- */

void
dp_unit_numa_apply(dp_unit_numa mode, uint32_t unit_id, char *desc, size_t cap)
{
    if (mode == DP_UNIT_NUMA_OFF) {
        snprintf(desc, cap, "off");
        return;
    }
    if (numa_available() < 0) {
        snprintf(desc, cap, "no NUMA support: no-op");
        return;
    }
    int nodes = numa_num_configured_nodes();
    if (nodes <= 1) {
        snprintf(desc, cap, "one node: no-op");
        return;
    }
    int node = (int)(unit_id % (uint32_t)nodes);
    if (numa_run_on_node(node) != 0) {
        snprintf(desc, cap, "node %d: run_on_node failed (%s)", node, strerror(errno));
        return;
    }
    if (mode == DP_UNIT_NUMA_BIND) {
        struct bitmask *m = numa_allocate_nodemask();
        if (m != NULL) {
            numa_bitmask_setbit(m, (unsigned)node);
            numa_set_membind(m);
            numa_bitmask_free(m);
        }
        snprintf(desc, cap, "node %d of %d (bind)", node, nodes);
    } else {
        numa_set_preferred(node);
        snprintf(desc, cap, "node %d of %d (preferred)", node, nodes);
    }
}

/* ---- records, pins, rows ---- */

static void
pend_unlink(dp_unit *u, blob_rec *b)
{
    if (b->pprev != NULL)
        b->pprev->pnext = b->pnext;
    else if (u->pend_head == b)
        u->pend_head = b->pnext;
    if (b->pnext != NULL)
        b->pnext->pprev = b->pprev;
    else if (u->pend_tail == b)
        u->pend_tail = b->pprev;
    b->pprev = b->pnext = NULL;
}

static void
rec_free(blob_rec *b)
{
    if (b == NULL)
        return;
    dp_blob_destroy(b->parsed);
    free(b);
}

/* Give the region back: now, or through quarantine if a pin on it expired. */
static void
region_release_locked(dp_unit *u, blob_rec *b, double now)
{
    int rc;
    if (b->pin_expired)
        rc = dp_slab_alloc_free_at(u->alloc, b->off, now + u->o.quarantine_s, NULL);
    else
        rc = dp_slab_alloc_free(u->alloc, b->off, NULL);
    DP_ASSERT(rc == 0);
}

/* The region stays allocated for good: a WRITE may still land in it. */
static void
retire_locked(dp_unit *u, blob_rec *b)
{
    DP_ASSERT(!b->published);
    dp_map_del(&u->blobs, b->id, b->id_len);
    pend_unlink(u, b);
    u->retired_bytes += b->size;
    u->n_retired++;
    DP_LOG_D("retired blob %s: %" PRIu64 " bytes at %" PRIu64, b->id, b->size, b->off);
    rec_free(b);
}

/* A published blob lost its last ref: free it, or keep it for its pins. */
static void
dispose_locked(dp_unit *u, blob_rec *b, double now)
{
    DP_ASSERT(b->published && b->refs == 0 && !b->dead);
    dp_map_del(&u->blobs, b->id, b->id_len);
    u->n_published--;
    if (b->n_pins > 0) {
        b->dead = true;
        u->n_zombies++;
        u->zombie_bytes += b->size;
        return;
    }
    region_release_locked(u, b, now);
    rec_free(b);
}

static void
unref_locked(dp_unit *u, blob_rec *b, double now)
{
    DP_ASSERT(b->refs > 0);
    if (--b->refs == 0)
        dispose_locked(u, b, now);
}

/* End pin p (unpinned or expired) and free it. */
static void
pin_end_locked(dp_unit *u, pin *p, bool expired, double now)
{
    dp_map_del(&u->pins, p->id, strlen(p->id));
    if (p->prev != NULL)
        p->prev->next = p->next;
    else
        u->pin_head = p->next;
    if (p->next != NULL)
        p->next->prev = p->prev;
    else
        u->pin_tail = p->prev;
    for (uint32_t i = 0; i < p->n; i++) {
        blob_rec *b = p->blobs[i];
        DP_ASSERT(b->n_pins > 0);
        b->n_pins--;
        if (expired)
            b->pin_expired = true;
        if (b->dead && b->n_pins == 0) {
            u->n_zombies--;
            u->zombie_bytes -= b->size;
            region_release_locked(u, b, now);
            rec_free(b);
        }
    }
    if (expired)
        u->pins_expired++;
    free(p->blobs);
    free(p);
}

static void
row_free(row *r)
{
    size_t it = 0;
    void *v;
    while (dp_map_next(&r->fields, &it, NULL, NULL, NULL, &v))
        free(v);
    dp_map_fini(&r->fields);
    free(r);
}

/* ---- lifecycle ---- */

int
dp_unit_create(const dp_unit_opts *opts, dp_unit **out, dp_detail *d)
{
    if (opts == NULL || out == NULL)
        return dp_fail(d, DP_EINVAL, "unit: opts and out are required");
    *out = NULL;
    if (opts->n_units == 0 || opts->unit_id >= opts->n_units)
        return dp_fail(d, DP_EINVAL, "unit: unit id %u must be below the unit count %u",
                       opts->unit_id, opts->n_units);
    if (opts->slab_bytes < 4096)
        return dp_fail(d, DP_EINVAL, "unit: slab of %" PRIu64 " bytes is below 4 KiB",
                       opts->slab_bytes);
    if (!(opts->read_pin_s > 0) || !isfinite(opts->read_pin_s) ||
        !(opts->alloc_lease_s >= 0) || !isfinite(opts->alloc_lease_s) ||
        !(opts->quarantine_s >= 0) || !isfinite(opts->quarantine_s))
        return dp_fail(
            d, DP_EINVAL,
            "unit: read_pin_s must be > 0, alloc_lease_s and quarantine_s >= 0");
    dp_unit *u = calloc(1, sizeof *u);
    if (u == NULL)
        return dp_fail(d, DP_ENOMEM, "unit: out of memory");
    u->o = *opts;
    if (u->o.now == NULL)
        u->o.now = default_now;
    u->last_report = now_s(u);
    pthread_mutex_init(&u->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&u->cv, &ca);
    pthread_condattr_destroy(&ca);
    dp_map_init_str(&u->blobs);
    dp_map_init_u64(&u->rows);
    dp_map_init_str(&u->pins);
    dp_unit_numa_apply(u->o.numa, u->o.unit_id, u->numa_desc, sizeof u->numa_desc);
    int rc;
    if (u->o.ep != NULL) {
        void *addr = NULL;
        rc = dp_endpoint_alloc(u->o.ep, (size_t)u->o.slab_bytes, &addr, d);
        if (rc != 0) {
            dp_fail_ctx(d, rc, "unit %u: slab of %" PRIu64 " bytes", u->o.unit_id,
                        u->o.slab_bytes);
            goto fail;
        }
        u->slab = addr;
    } else {
        u->slab_map_len = (size_t)u->o.slab_bytes;
        void *p = mmap(NULL, u->slab_map_len, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) {
            rc = dp_fail_sys(d, errno, "unit: mmap of a %" PRIu64 "-byte slab",
                             u->o.slab_bytes);
            u->slab_map_len = 0;
            goto fail;
        }
        u->slab = p;
    }
    rc = dp_slab_alloc_create(u->o.slab_bytes, DP_BLOB_ALIGN, &u->alloc, d);
    if (rc != 0)
        goto fail;
    *out = u;
    return 0;
fail:
    dp_unit_destroy(u);
    return rc;
}

static void *
ticker_main(void *arg)
{
    dp_unit *u = arg;
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
            dp_unit_tick(u);
            pthread_mutex_lock(&u->mu);
        }
    }
    pthread_mutex_unlock(&u->mu);
    return NULL;
}

int
dp_unit_start_ticker(dp_unit *u, double period_s, dp_detail *d)
{
    if (!(period_s > 0) || !isfinite(period_s))
        return dp_fail(d, DP_EINVAL, "unit: ticker period must be > 0");
    pthread_mutex_lock(&u->mu);
    if (u->ticker_on) {
        pthread_mutex_unlock(&u->mu);
        return dp_fail(d, DP_EINVAL, "unit: ticker already running");
    }
    u->period_s = period_s;
    int e = pthread_create(&u->ticker, NULL, ticker_main, u);
    if (e == 0)
        u->ticker_on = true;
    pthread_mutex_unlock(&u->mu);
    if (e != 0)
        return dp_fail_sys(d, e, "unit: starting the ticker thread");
    return 0;
}

void
dp_unit_destroy(dp_unit *u)
{
    if (u == NULL)
        return;
    pthread_mutex_lock(&u->mu);
    bool join = u->ticker_on;
    u->stopping = true;
    pthread_cond_broadcast(&u->cv);
    pthread_mutex_unlock(&u->mu);
    if (join)
        pthread_join(u->ticker, NULL);
    /* Pins first: they own the zombies. */
    while (u->pin_head != NULL)
        pin_end_locked(u, u->pin_head, false, 0);
    size_t it = 0;
    void *v;
    while (dp_map_next(&u->rows, &it, NULL, NULL, NULL, &v))
        row_free(v);
    it = 0;
    while (dp_map_next(&u->blobs, &it, NULL, NULL, NULL, &v))
        rec_free(v);
    dp_map_fini(&u->rows);
    dp_map_fini(&u->blobs);
    dp_map_fini(&u->pins);
    dp_slab_alloc_destroy(u->alloc);
    if (u->slab != NULL) {
        if (u->o.ep != NULL)
            dp_endpoint_deregister(u->o.ep, u->slab, NULL);
        else
            munmap(u->slab, u->slab_map_len);
    }
    pthread_cond_destroy(&u->cv);
    pthread_mutex_destroy(&u->mu);
    free(u);
}

void
dp_unit_set_address(dp_unit *u, const char *zmq_address)
{
    pthread_mutex_lock(&u->mu);
    snprintf(u->address, sizeof u->address, "%s", zmq_address ? zmq_address : "");
    pthread_mutex_unlock(&u->mu);
}

void
dp_unit_lock(dp_unit *u)
{
    pthread_mutex_lock(&u->mu);
}

void
dp_unit_unlock(dp_unit *u)
{
    pthread_mutex_unlock(&u->mu);
}

uint32_t
dp_unit_id(const dp_unit *u)
{
    return u->o.unit_id;
}

uint64_t
dp_unit_slab_bytes(const dp_unit *u)
{
    return u->o.slab_bytes;
}

uint8_t *
dp_unit_slab(const dp_unit *u)
{
    return u->slab;
}

dp_endpoint *
dp_unit_endpoint(const dp_unit *u)
{
    return u->o.ep;
}

const char *
dp_unit_numa_desc(const dp_unit *u)
{
    return u->numa_desc;
}

static dp_wire_str
zview(const char *z)
{
    return (dp_wire_str){z, (uint32_t)strlen(z)};
}

void
dp_unit_info_locked(dp_unit *u, dp_wire_info *info)
{
    memset(info, 0, sizeof *info);
    info->unit_id = u->o.unit_id;
    info->n_units = u->o.n_units;
    info->zmq = zview(u->address);
    info->agent = zview(u->o.ep != NULL ? dp_endpoint_name(u->o.ep) : "");
    info->metadata = (dp_wire_bytes){(const uint8_t *)"", 0};
    info->slab_bytes = u->o.slab_bytes;
    info->io_bytes = 0;
    info->numa = zview(u->numa_desc);
    info->slab_addr = (uint64_t)(uintptr_t)u->slab;
    info->read_pin_ms = (uint64_t)(u->o.read_pin_s * 1000.0);
}

/* ---- alloc ---- */

int
dp_unit_alloc(dp_unit *u, const char *blob_id, size_t id_len, uint64_t nbytes,
              uint64_t n_entries, uint64_t *off, const char **reason, dp_detail *d)
{
    if (reason != NULL)
        *reason = NULL;
    if (!valid_id(blob_id, id_len))
        return dp_fail(d, DP_EPROTO,
                       "alloc: blob id must be 1..%d bytes of [A-Za-z0-9_.:-]",
                       DP_UNIT_ID_MAX);
    if (nbytes == 0)
        return dp_fail(d, DP_EPROTO, "alloc %.*s: nbytes must be > 0", (int)id_len,
                       blob_id);
    int rc = 0;
    pthread_mutex_lock(&u->mu);
    double now = now_s(u);
    blob_rec *b = dp_map_get(&u->blobs, blob_id, id_len);
    if (b != NULL) {
        if (!b->published && b->nbytes == nbytes) {
            *off = b->off; /* a retried alloc */
            goto out;
        }
        u->n_proto++;
        rc = dp_fail(
            d, DP_EPROTO, "alloc %.*s: blob id already in use (%s, %" PRIu64 " bytes)",
            (int)id_len, blob_id, b->published ? "committed" : "allocated", b->nbytes);
        goto out;
    }
    if (nbytes > u->o.slab_bytes) {
        u->n_proto++;
        rc =
            dp_fail(d, DP_EPROTO,
                    "alloc %.*s: %" PRIu64 " bytes can never fit a %" PRIu64 "-byte slab",
                    (int)id_len, blob_id, nbytes, u->o.slab_bytes);
        goto out;
    }
    uint64_t o = 0;
    dp_detail ad;
    dp_detail_clear(&ad);
    rc = dp_slab_alloc_alloc(u->alloc, nbytes, &o, &ad);
    if (rc == DP_EUNITFULL && dp_slab_alloc_sweep(u->alloc, now) > 0)
        rc = dp_slab_alloc_alloc(u->alloc, nbytes, &o, &ad);
    if (rc == DP_EUNITFULL) {
        dp_slab_alloc_stats st;
        dp_slab_alloc_get_stats(u->alloc, &st);
        uint64_t pending = st.quarantined_bytes + u->zombie_bytes;
        if (pending > 0 && st.free_bytes + pending >= nbytes) {
            u->n_busy++;
            const char *why = st.quarantined_bytes > 0 ? "quarantine" : "pins";
            if (reason != NULL)
                *reason = why;
            rc = dp_fail(d, DP_EBUSY,
                         "unit %u: no room for %" PRIu64
                         " bytes now (largest free %" PRIu64 ", free %" PRIu64
                         "); %" PRIu64 " bytes in quarantine and %" PRIu64
                         " held by pins of released blobs will free: retry",
                         u->o.unit_id, nbytes, st.largest_free, st.free_bytes,
                         st.quarantined_bytes, u->zombie_bytes);
        } else {
            u->n_full++;
            rc = dp_fail(
                d, DP_EUNITFULL,
                "unit %u: no room for %" PRIu64 " bytes (largest free %" PRIu64
                ", free %" PRIu64 ", retired %" PRIu64 ") and nothing pending frees any",
                u->o.unit_id, nbytes, st.largest_free, st.free_bytes, u->retired_bytes);
        }
        goto out;
    }
    if (rc != 0) {
        if (rc == DP_ETOOBIG) {
            u->n_proto++;
            rc = DP_EPROTO;
        }
        dp_fail(d, rc, "alloc %.*s: %s", (int)id_len, blob_id, dp_detail_msg(&ad));
        goto out;
    }
    b = calloc(1, sizeof *b);
    if (b == NULL) {
        dp_slab_alloc_free(u->alloc, o, NULL);
        rc = dp_fail(d, DP_ENOMEM, "alloc: out of memory");
        goto out;
    }
    memcpy(b->id, blob_id, id_len);
    b->id_len = (uint32_t)id_len;
    b->off = o;
    b->nbytes = nbytes;
    b->size = nbytes;
    dp_slab_alloc_size_of(u->alloc, o, &b->size);
    b->n_entries_decl = n_entries;
    b->created_at = now;
    if (dp_map_put(&u->blobs, b->id, b->id_len, b, NULL) != 0) {
        dp_slab_alloc_free(u->alloc, o, NULL);
        free(b);
        rc = dp_fail(d, DP_ENOMEM, "alloc: out of memory");
        goto out;
    }
    b->pprev = u->pend_tail;
    if (u->pend_tail != NULL)
        u->pend_tail->pnext = b;
    else
        u->pend_head = b;
    u->pend_tail = b;
    u->n_alloc++;
    *off = o;
out:
    pthread_mutex_unlock(&u->mu);
    return rc;
}

/* ---- commit ---- */

/* Remove the placeholders of a failed publish (slots still pointing nowhere). */
static void
publish_rollback_locked(dp_unit *u, const dp_blob *pb, uint32_t upto)
{
    for (uint32_t i = 0; i < upto; i++) {
        const dp_blob_entry *e = dp_blob_entry_at(pb, i);
        row *r = dp_map_get_u64(&u->rows, e->gidx);
        if (r == NULL)
            continue;
        slot *s = dp_map_get(&r->fields, e->field, e->field_len);
        if (s != NULL && s->b == NULL) {
            dp_map_del(&r->fields, e->field, e->field_len);
            free(s);
        }
        if (dp_map_len(&r->fields) == 0) {
            dp_map_del_u64(&u->rows, e->gidx);
            row_free(r);
        }
    }
}

int
dp_unit_commit(dp_unit *u, const char *blob_id, size_t id_len,
               dp_wire_commit_state *state, dp_detail *d)
{
    if (!valid_id(blob_id, id_len))
        return dp_fail(d, DP_EPROTO,
                       "commit: blob id must be 1..%d bytes of [A-Za-z0-9_.:-]",
                       DP_UNIT_ID_MAX);
    int rc = 0;
    uint32_t i = 0, n = 0;
    dp_blob *pb = NULL;
    pthread_mutex_lock(&u->mu);
    double now = now_s(u);
    blob_rec *b = dp_map_get(&u->blobs, blob_id, id_len);
    if (b == NULL) {
        *state = DP_WIRE_COMMIT_LOST;
        goto out;
    }
    if (b->published) {
        *state = DP_WIRE_COMMIT_DONE;
        goto out;
    }
    dp_blob_parse_opts po = {0};
    po.n_units = u->o.n_units;
    po.unit_index = u->o.unit_id;
    rc = dp_blob_parse(u->slab + b->off, (size_t)b->nbytes, &po, &pb, d);
    if (rc != 0) {
        if (rc == DP_EPROTO)
            u->n_proto++;
        dp_fail_ctx(d, rc, "commit %s", b->id);
        goto out;
    }
    n = dp_blob_count(pb);
    if (b->n_entries_decl != 0 && n != b->n_entries_decl) {
        u->n_proto++;
        rc = dp_fail(
            d, DP_EPROTO,
            "commit %s: the blob's index has %u entries, alloc announced %" PRIu64, b->id,
            n, b->n_entries_decl);
        goto out;
    }
    /* Pass 1: every row and slot exists (the only step that allocates). */
    for (i = 0; i < n; i++) {
        const dp_blob_entry *e = dp_blob_entry_at(pb, i);
        row *r = dp_map_get_u64(&u->rows, e->gidx);
        if (r == NULL) {
            r = calloc(1, sizeof *r);
            if (r == NULL)
                goto nomem;
            dp_map_init_str(&r->fields);
            if (dp_map_put_u64(&u->rows, e->gidx, r, NULL) != 0) {
                row_free(r);
                goto nomem;
            }
        }
        if (dp_map_get(&r->fields, e->field, e->field_len) == NULL) {
            slot *s = calloc(1, sizeof *s);
            if (s == NULL ||
                dp_map_put(&r->fields, e->field, e->field_len, s, NULL) != 0) {
                free(s);
                if (dp_map_len(&r->fields) == 0) {
                    dp_map_del_u64(&u->rows, e->gidx);
                    row_free(r);
                }
                goto nomem;
            }
        }
    }
    /* Pass 2: publish, cannot fail. */
    b->parsed = pb;
    pb = NULL;
    b->published = true;
    b->refs = n;
    pend_unlink(u, b);
    u->n_published++;
    u->n_commit++;
    for (i = 0; i < n; i++) {
        const dp_blob_entry *e = dp_blob_entry_at(b->parsed, i);
        row *r = dp_map_get_u64(&u->rows, e->gidx);
        slot *s = dp_map_get(&r->fields, e->field, e->field_len);
        blob_rec *old = s->b;
        s->b = b;
        s->i = i;
        if (old != NULL)
            unref_locked(u, old, now);
        else
            u->n_entries++;
    }
    *state = DP_WIRE_COMMIT_DONE;
    goto out;
nomem:
    publish_rollback_locked(u, pb, i + 1 < n ? i + 1 : n);
    rc = dp_fail(d, DP_ENOMEM, "commit %s: out of memory; nothing published", b->id);
out:
    pthread_mutex_unlock(&u->mu);
    dp_blob_destroy(pb);
    return rc;
}

/* ---- abort ---- */

void
dp_unit_abort(dp_unit *u, const char *blob_id, size_t id_len, bool in_flight)
{
    if (!valid_id(blob_id, id_len))
        return;
    pthread_mutex_lock(&u->mu);
    blob_rec *b = dp_map_get(&u->blobs, blob_id, id_len);
    if (b != NULL && !b->published) {
        u->n_abort++;
        if (in_flight) {
            retire_locked(u, b);
        } else {
            dp_map_del(&u->blobs, b->id, b->id_len);
            pend_unlink(u, b);
            int rc = dp_slab_alloc_free(u->alloc, b->off, NULL);
            DP_ASSERT(rc == 0);
            rec_free(b);
        }
    }
    pthread_mutex_unlock(&u->mu);
}

/* ---- resolve ---- */

/* Pin blobs[0..n) for read_pin_s; the id goes to out. */
static int
pin_create_locked(dp_unit *u, blob_rec **blobs, uint32_t n, double now, char out[33],
                  dp_detail *d)
{
    out[0] = '\0';
    if (n == 0) {
        free(blobs);
        return 0;
    }
    pin *p = calloc(1, sizeof *p);
    if (p == NULL) {
        free(blobs);
        return dp_fail(d, DP_ENOMEM, "resolve: out of memory");
    }
    int rc = dp_random_hex_id(p->id, d);
    if (rc == 0 && dp_map_put(&u->pins, p->id, strlen(p->id), p, NULL) != 0)
        rc = dp_fail(d, DP_ENOMEM, "resolve: out of memory");
    if (rc != 0) {
        free(blobs);
        free(p);
        return rc;
    }
    p->blobs = blobs;
    p->n = n;
    p->expiry = now + u->o.read_pin_s;
    for (uint32_t i = 0; i < n; i++) {
        blobs[i]->n_pins++;
        blobs[i]->last_resolve_at = now;
    }
    p->prev = u->pin_tail;
    if (u->pin_tail != NULL)
        u->pin_tail->next = p;
    else
        u->pin_head = p;
    u->pin_tail = p;
    memcpy(out, p->id, 33);
    return 0;
}

int
dp_unit_resolve_locked(dp_unit *u, const dp_wire_str *ids, uint32_t n,
                       dp_unit_resolve_res *res, dp_detail *d)
{
    memset(res, 0, sizeof *res);
    double now = now_s(u);
    size_t cap = n > 0 ? n : 1;
    res->blobs = calloc(cap, sizeof *res->blobs);
    res->missing = calloc(cap, sizeof *res->missing);
    blob_rec **pinned = calloc(cap, sizeof *pinned);
    uint32_t np = 0;
    if (res->blobs == NULL || res->missing == NULL || pinned == NULL) {
        free(pinned);
        dp_unit_resolve_res_fini(res);
        return dp_fail(d, DP_ENOMEM, "resolve: out of memory");
    }
    uint64_t epoch = ++u->pin_epoch;
    u->n_resolve++;
    for (uint32_t i = 0; i < n; i++) {
        blob_rec *b = dp_map_get(&u->blobs, ids[i].p, ids[i].n);
        if (b == NULL || !b->published) {
            res->missing[res->n_missing++] = ids[i];
            continue;
        }
        res->blobs[res->n_blobs++] = (dp_wire_blob_loc){ids[i], b->off, b->nbytes};
        if (b->pin_mark != epoch) {
            b->pin_mark = epoch;
            pinned[np++] = b;
        }
    }
    int rc = pin_create_locked(u, pinned, np, now, res->pin_id, d);
    if (rc != 0)
        dp_unit_resolve_res_fini(res);
    return rc;
}

void
dp_unit_resolve_res_fini(dp_unit_resolve_res *res)
{
    free(res->blobs);
    free(res->missing);
    memset(res, 0, sizeof *res);
}

int
dp_unit_resolve_keys_locked(dp_unit *u, const dp_wire_str *keys, uint32_t n,
                            dp_unit_resolve_keys_res *res, dp_detail *d)
{
    memset(res, 0, sizeof *res);
    double now = now_s(u);
    size_t cap = n > 0 ? n : 1;
    res->entries = calloc(cap, sizeof *res->entries);
    res->missing = calloc(cap, sizeof *res->missing);
    blob_rec **pinned = calloc(cap, sizeof *pinned);
    uint32_t np = 0;
    int rc;
    if (res->entries == NULL || res->missing == NULL || pinned == NULL) {
        rc = dp_fail(d, DP_ENOMEM, "resolve_keys: out of memory");
        goto fail;
    }
    uint64_t epoch = ++u->pin_epoch;
    for (uint32_t i = 0; i < n; i++) {
        dp_key_parts kp;
        rc = dp_key_split(keys[i].p, keys[i].n, &kp, d);
        if (rc != 0) {
            u->n_proto++;
            dp_fail_ctx(d, DP_EPROTO, "resolve_keys");
            rc = DP_EPROTO;
            goto fail;
        }
        if (kp.gidx % u->o.n_units != u->o.unit_id) {
            u->n_proto++;
            rc = dp_fail(d, DP_EPROTO,
                         "resolve_keys: key '%.*s' belongs to unit %" PRIu64
                         ", not to unit %u of %u",
                         (int)DP_MIN(keys[i].n, 80u), keys[i].p, kp.gidx % u->o.n_units,
                         u->o.unit_id, u->o.n_units);
            goto fail;
        }
        row *r = dp_map_get_u64(&u->rows, kp.gidx);
        slot *s = r != NULL ? dp_map_get(&r->fields, kp.field, kp.field_len) : NULL;
        if (s == NULL) {
            res->missing[res->n_missing++] = keys[i];
            continue;
        }
        blob_rec *b = s->b;
        const dp_blob_entry *e = dp_blob_entry_at(b->parsed, s->i);
        dp_wire_key_loc *l = &res->entries[res->n_entries++];
        l->key = keys[i];
        l->off = b->off + e->off;
        l->len = e->len;
        l->kind = zview(dp_blob_kind_name(e->kind));
        l->dtype = (dp_wire_str){e->dtype, e->dtype_len};
        l->shape = e->ndim > 0 ? e->shape : NULL;
        l->ndim = e->ndim;
        if (b->pin_mark != epoch) {
            b->pin_mark = epoch;
            pinned[np++] = b;
        }
    }
    u->n_resolve++;
    rc = pin_create_locked(u, pinned, np, now, res->pin_id, d);
    if (rc != 0)
        dp_unit_resolve_keys_res_fini(res);
    return rc;
fail:
    free(pinned);
    dp_unit_resolve_keys_res_fini(res);
    return rc;
}

void
dp_unit_resolve_keys_res_fini(dp_unit_resolve_keys_res *res)
{
    free(res->entries);
    free(res->missing);
    memset(res, 0, sizeof *res);
}

void
dp_unit_unpin(dp_unit *u, const char *pin_id, size_t len)
{
    pthread_mutex_lock(&u->mu);
    pin *p = len <= 32 ? dp_map_get(&u->pins, pin_id, len) : NULL;
    if (p != NULL) {
        u->n_unpin++;
        pin_end_locked(u, p, false, now_s(u));
    }
    pthread_mutex_unlock(&u->mu);
}

/* ---- release ---- */

uint64_t
dp_unit_release_rows(dp_unit *u, const uint64_t *gidxs, uint32_t n)
{
    uint64_t dropped = 0;
    pthread_mutex_lock(&u->mu);
    double now = now_s(u);
    for (uint32_t i = 0; i < n; i++) {
        row *r = dp_map_del_u64(&u->rows, gidxs[i]);
        if (r == NULL)
            continue;
        size_t it = 0;
        void *v;
        while (dp_map_next(&r->fields, &it, NULL, NULL, NULL, &v)) {
            slot *s = v;
            unref_locked(u, s->b, now);
            dropped++;
        }
        row_free(r);
    }
    u->n_entries -= dropped;
    u->n_release++;
    pthread_mutex_unlock(&u->mu);
    return dropped;
}

/* ---- admin ---- */

#define SCAN_FIELDS 10

static dp_wire_field
fu64(const char *name, uint64_t v)
{
    dp_wire_field f = {zview(name), DP_WIRE_U64, {.u = v}};
    return f;
}

static dp_wire_field
ff64(const char *name, double v)
{
    dp_wire_field f = {zview(name), DP_WIRE_F64, {.f = v}};
    return f;
}

int
dp_unit_scan_locked(dp_unit *u, dp_wire_fields **recs, uint32_t *n, dp_detail *d)
{
    size_t nb = dp_map_len(&u->blobs);
    *recs = NULL;
    *n = 0;
    dp_wire_fields *r = calloc(nb > 0 ? nb : 1, sizeof *r);
    dp_wire_field *f = calloc((nb > 0 ? nb : 1) * SCAN_FIELDS, sizeof *f);
    if (r == NULL || f == NULL) {
        free(r);
        free(f);
        return dp_fail(d, DP_ENOMEM, "scan: out of memory");
    }
    r[0].v = f; /* owns the field storage, see dp_unit_fields_free */
    size_t it = 0, k = 0;
    void *v;
    while (dp_map_next(&u->blobs, &it, NULL, NULL, NULL, &v)) {
        blob_rec *b = v;
        dp_wire_field *x = f + k * SCAN_FIELDS;
        x[0] = (dp_wire_field){zview("id"), DP_WIRE_STR, {.s = {b->id, b->id_len}}};
        x[1] = fu64("off", b->off);
        x[2] = fu64("nbytes", b->nbytes);
        x[3] = fu64("refs", b->refs);
        x[4] = (dp_wire_field){zview("published"), DP_WIRE_BOOL, {.b = b->published}};
        x[5] = fu64("pins", b->n_pins);
        x[6] =
            fu64("n_entries", b->parsed ? dp_blob_count(b->parsed) : b->n_entries_decl);
        x[7] = ff64("created_at", b->created_at);
        x[8] = ff64("last_resolve_at", b->last_resolve_at);
        x[9] = (dp_wire_field){zview("in_slab"), DP_WIRE_BOOL, {.b = true}};
        r[k].v = x;
        r[k].n = SCAN_FIELDS;
        k++;
    }
    if (k == 0) {
        free(r);
        free(f);
        return 0;
    }
    *recs = r;
    *n = (uint32_t)k;
    return 0;
}

void
dp_unit_fields_free(dp_wire_fields *recs, uint32_t n)
{
    if (recs == NULL)
        return;
    (void)n;
    free(recs[0].v);
    free(recs);
}

static void
get_stats_locked(dp_unit *u, dp_unit_stats *st)
{
    memset(st, 0, sizeof *st);
    dp_slab_alloc_stats as;
    dp_slab_alloc_get_stats(u->alloc, &as);
    st->blobs = dp_map_len(&u->blobs);
    st->published = u->n_published;
    st->rows = dp_map_len(&u->rows);
    st->entries = u->n_entries;
    st->pins = dp_map_len(&u->pins);
    st->zombies = u->n_zombies;
    st->zombie_bytes = u->zombie_bytes;
    st->retired_bytes = u->retired_bytes;
    st->n_retired = u->n_retired;
    st->leases_expired = u->leases_expired;
    st->pins_expired = u->pins_expired;
    st->allocated_bytes = as.allocated_bytes;
    st->free_bytes = as.free_bytes;
    st->quarantined_bytes = as.quarantined_bytes;
    st->largest_free = as.largest_free;
    st->n_alloc = u->n_alloc;
    st->n_commit = u->n_commit;
    st->n_busy = u->n_busy;
    st->n_full = u->n_full;
    st->n_proto = u->n_proto;
}

void
dp_unit_get_stats(dp_unit *u, dp_unit_stats *st)
{
    pthread_mutex_lock(&u->mu);
    get_stats_locked(u, st);
    pthread_mutex_unlock(&u->mu);
}

int
dp_unit_stats_locked(dp_unit *u, dp_wire_fields *fields, dp_detail *d)
{
    dp_unit_stats s;
    get_stats_locked(u, &s);
    enum { N = 28 };
    dp_wire_field *f = calloc(N, sizeof *f);
    if (f == NULL)
        return dp_fail(d, DP_ENOMEM, "stats: out of memory");
    uint32_t k = 0;
    f[k++] = fu64("unit_id", u->o.unit_id);
    f[k++] = fu64("n_units", u->o.n_units);
    f[k++] = fu64("slab_bytes", u->o.slab_bytes);
    f[k++] = fu64("blobs", s.blobs);
    f[k++] = fu64("published", s.published);
    f[k++] = fu64("rows", s.rows);
    f[k++] = fu64("entries", s.entries);
    f[k++] = fu64("pins", s.pins);
    f[k++] = fu64("zombies", s.zombies);
    f[k++] = fu64("zombie_bytes", s.zombie_bytes);
    f[k++] = fu64("retired_bytes", s.retired_bytes);
    f[k++] = fu64("retired", s.n_retired);
    f[k++] = fu64("leases_expired", s.leases_expired);
    f[k++] = fu64("pins_expired", s.pins_expired);
    f[k++] = fu64("allocated_bytes", s.allocated_bytes);
    f[k++] = fu64("free_bytes", s.free_bytes);
    f[k++] = fu64("quarantined_bytes", s.quarantined_bytes);
    f[k++] = fu64("largest_free", s.largest_free);
    f[k++] = fu64("allocs", s.n_alloc);
    f[k++] = fu64("commits", s.n_commit);
    f[k++] = fu64("aborts", u->n_abort);
    f[k++] = fu64("resolves", u->n_resolve);
    f[k++] = fu64("unpins", u->n_unpin);
    f[k++] = fu64("releases", u->n_release);
    f[k++] = fu64("busy", s.n_busy);
    f[k++] = fu64("unit_full", s.n_full);
    f[k++] = fu64("protocol_errors", s.n_proto);
    f[k++] = fu64("ticks", u->n_ticks);
    DP_ASSERT(k == N);
    fields->v = f;
    fields->n = k;
    return 0;
}

int
dp_unit_read_bytes_locked(dp_unit *u, uint64_t off, uint64_t nbytes, const uint8_t **p,
                          dp_detail *d)
{
    if (off > u->o.slab_bytes || nbytes > u->o.slab_bytes - off)
        return dp_fail(d, DP_EPROTO,
                       "read_bytes: [%" PRIu64 ", +%" PRIu64 ") is outside the %" PRIu64
                       "-byte slab",
                       off, nbytes, u->o.slab_bytes);
    *p = u->slab + off;
    return 0;
}

/* ---- maintenance ---- */

void
dp_unit_tick(dp_unit *u)
{
    pthread_mutex_lock(&u->mu);
    double now = now_s(u);
    u->n_ticks++;
    while (u->pin_head != NULL && u->pin_head->expiry <= now)
        pin_end_locked(u, u->pin_head, true, now);
    if (u->o.alloc_lease_s > 0) {
        while (u->pend_head != NULL &&
               now - u->pend_head->created_at >= u->o.alloc_lease_s) {
            blob_rec *b = u->pend_head;
            DP_LOG_W("unit %u: blob %s not committed within %.1f s: region of %" PRIu64
                     " bytes retired",
                     u->o.unit_id, b->id, u->o.alloc_lease_s, b->size);
            u->leases_expired++;
            retire_locked(u, b);
        }
    }
    dp_slab_alloc_sweep(u->alloc, now);
    /* Every 30 s, one log line with the counters if anything changed. */
    char line[320];
    line[0] = '\0';
    if (now - u->last_report >= 30.0) {
        dp_unit_stats st;
        get_stats_locked(u, &st);
        uint64_t sig = st.n_alloc * 1000003u ^ st.n_commit * 10007u ^
                       u->n_release * 101u ^ u->n_resolve * 7u ^ st.n_retired ^
                       st.pins_expired * 31u;
        if (sig != u->report_sig) {
            char a[32], f[32], q[32], r[32];
            snprintf(line, sizeof line,
                     "unit %u: %" PRIu64 " blobs, %" PRIu64 " entries, %" PRIu64
                     " pins; allocated %s, free %s, quarantined %s, retired %s",
                     u->o.unit_id, st.published, st.entries, st.pins,
                     dp_fmt_size(st.allocated_bytes, a, sizeof a),
                     dp_fmt_size(st.free_bytes, f, sizeof f),
                     dp_fmt_size(st.quarantined_bytes, q, sizeof q),
                     dp_fmt_size(st.retired_bytes, r, sizeof r));
            u->report_sig = sig;
        }
        u->last_report = now;
    }
    pthread_mutex_unlock(&u->mu);
    if (line[0] != '\0')
        DP_LOG_I("%s", line);
}

/* ---- self-check ---- */

int
dp_unit_check(dp_unit *u, dp_detail *d)
{
    int rc = 0;
    dp_map counts;
    dp_map_init_u64(&counts);
    pthread_mutex_lock(&u->mu);
    uint64_t entries = 0;
    size_t it = 0;
    void *v;
    uint64_t g;
    while (dp_map_next(&u->rows, &it, NULL, NULL, &g, &v)) {
        row *r = v;
        if (dp_map_len(&r->fields) == 0) {
            rc = dp_fail(d, DP_ECORRUPT, "row %" PRIu64 " is empty", g);
            goto out;
        }
        size_t it2 = 0;
        void *sv;
        while (dp_map_next(&r->fields, &it2, NULL, NULL, NULL, &sv)) {
            slot *s = sv;
            if (s->b == NULL || !s->b->published || s->b->dead) {
                rc = dp_fail(d, DP_ECORRUPT, "row %" PRIu64 " points at a dead blob", g);
                goto out;
            }
            uintptr_t key = (uintptr_t)s->b;
            uintptr_t c = (uintptr_t)dp_map_get_u64(&counts, key);
            dp_map_put_u64(&counts, key, (void *)(c + 1), NULL);
            entries++;
        }
    }
    if (entries != u->n_entries) {
        rc = dp_fail(d, DP_ECORRUPT, "entries %" PRIu64 " != counter %" PRIu64, entries,
                     u->n_entries);
        goto out;
    }
    uint64_t pub = 0, pend = 0;
    it = 0;
    while (dp_map_next(&u->blobs, &it, NULL, NULL, NULL, &v)) {
        blob_rec *b = v;
        uint64_t c = (uint64_t)(uintptr_t)dp_map_get_u64(&counts, (uintptr_t)b);
        if (b->published) {
            pub++;
            if (b->refs == 0 || c != b->refs) {
                rc = dp_fail(d, DP_ECORRUPT, "blob %s: refs %" PRIu64 ", slots %" PRIu64,
                             b->id, b->refs, c);
                goto out;
            }
        } else {
            pend++;
            if (b->refs != 0 || c != 0) {
                rc = dp_fail(d, DP_ECORRUPT, "uncommitted blob %s has refs", b->id);
                goto out;
            }
        }
    }
    if (pub != u->n_published) {
        rc = dp_fail(d, DP_ECORRUPT, "published %" PRIu64 " != counter %" PRIu64, pub,
                     u->n_published);
        goto out;
    }
    uint64_t np = 0;
    for (blob_rec *b = u->pend_head; b != NULL; b = b->pnext)
        np++;
    if (np != pend) {
        rc =
            dp_fail(d, DP_ECORRUPT, "uncommitted list %" PRIu64 " != %" PRIu64, np, pend);
        goto out;
    }
    /* Pins: recount n_pins of every pinned record. */
    dp_map_fini(&counts);
    dp_map_init_u64(&counts);
    uint64_t npins = 0, zb = 0, nz = 0;
    for (pin *p = u->pin_head; p != NULL; p = p->next) {
        npins++;
        if (p->next != NULL && p->next->expiry < p->expiry) {
            rc = dp_fail(d, DP_ECORRUPT, "pin list out of expiry order");
            goto out;
        }
        for (uint32_t i = 0; i < p->n; i++) {
            uintptr_t key = (uintptr_t)p->blobs[i];
            uintptr_t c = (uintptr_t)dp_map_get_u64(&counts, key);
            dp_map_put_u64(&counts, key, (void *)(c + 1), NULL);
            if (c == 0 && p->blobs[i]->dead) {
                nz++;
                zb += p->blobs[i]->size;
            }
        }
    }
    if (npins != dp_map_len(&u->pins) || nz != u->n_zombies || zb != u->zombie_bytes) {
        rc = dp_fail(d, DP_ECORRUPT, "pins %" PRIu64 "/%zu, zombies %" PRIu64 "/%" PRIu64,
                     npins, dp_map_len(&u->pins), nz, u->n_zombies);
        goto out;
    }
    it = 0;
    uint64_t key;
    while (dp_map_next(&counts, &it, NULL, NULL, &key, &v)) {
        blob_rec *b = (blob_rec *)(uintptr_t)key;
        if (b->n_pins != (uint64_t)(uintptr_t)v) {
            rc = dp_fail(d, DP_ECORRUPT, "blob %s: n_pins %u, pins %" PRIu64, b->id,
                         b->n_pins, (uint64_t)(uintptr_t)v);
            goto out;
        }
    }
    rc = dp_slab_alloc_check(u->alloc, d);
out:
    pthread_mutex_unlock(&u->mu);
    dp_map_fini(&counts);
    return rc;
}
