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
 *     commit (index validates   -> published
 *       and names this alloc)
 *     abort(in_flight=false)    -> freed now (the writer says nothing runs)
 *     abort(in_flight=true)     -> retired, counted in retired_bytes
 *     lease (alloc_lease_s)     -> retired, as abort(in_flight=true)
 *     its writer is gone        -> freed (writers.h: same-host, shared memory,
 *                                  process exited, reclaim_grace_s ago)
 *   retired: handed back when its writer is gone (writers.h), else kept for
 *     good (retired_kept_bytes).
 *   published, refs > 0: readers resolve it; each resolve pins it.
 *     refs reach 0 (overwrite, release_rows):
 *       not pinned              -> freed now, or quarantined if a pin on it
 *                                  ever expired (a late READ may still run)
 *       pinned                  -> zombie until its last pin ends, then as above
 * A pin ended by unpin means the reader is done; a pin that expired marks its
 * blobs, so their region goes through quarantine (quarantine_s) before reuse.
 *
 * Identity. Each allocation gets a token (a counter); the blob's header must
 * name it and this unit's incarnation (drawn at create) for its commit to
 * publish it, so bytes left in a recycled region by an earlier put, or
 * written for an earlier process on the same port, are never published.
 * An allocation holds a reference to its writer (writers.h) until its commit
 * validates; a retired region holds one until it is handed back.
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
 * serve.c), save/load threads, the ticker, the io workers and test callers
 * take it; nothing blocking runs
 * under it (no transfer, no file I/O, no ZMQ). The ticker's condition variable
 * waits on mu itself. Lock order: mu, then the allocator (not thread-safe,
 * used only under mu), then the endpoint's internal lock (only
 * dp_endpoint_name, which takes none, is called under mu; metadata is fetched
 * by serve.c outside mu).
 *
 * SSD tier (DESIGN section 9, seed 002 _alloc_io/_spill/_stage)
 * ------------------------------------------------------------
 * Layout. The unit's memory is one registered region (one endpoint
 * allocation, so one rkey and one metadata region): the put area at
 * [0, slab_bytes) and the IO area at [io_base, io_base + staging_bytes),
 * io_base = slab_bytes rounded up to 4 KiB. Every offset handed to a client
 * (alloc, resolve) is relative to that one base, whichever area it is in; each
 * area has its own dp_slab_alloc. A record's off/size name its current region
 * and in_io says which allocator owns it.
 *
 * Spill. alloc(spill) that the put area cannot take gets an IO-area region
 * (a "spill"); the client WRITEs it like any region (uncommitted: lease and
 * abort rules as for the put area). Its commit validates the index (as for a
 * put) and queues a spill job instead of publishing, answering "pending"; the
 * job writes the region to a fresh file and, back under the lock, publishes
 * the record as a disk blob (fd set, region freed: the client's WRITE ended
 * before its commit) or, if the write failed, drops it (commit: "lost").
 *
 * Order. Commits are ordered when their index validates (commit_seq), not
 * when a spill's io job ends: a finished spill publishes only the keys whose
 * slot does not already point at a later commit, and not those a release
 * since its commit dropped (spill_keep, set by release_rows). A spill with no
 * key left is dropped (spills_superseded); its id is remembered for a while
 * (superseded list, SUPERSEDED_KEEP_S or the lease if longer) so that its
 * commit answers "done": it was ordered before what replaced it, as if it had
 * landed and been overwritten at once.
 * A validated spill that found the io queue full waits on the pend list: the
 * ticker queues it as slots free, and the lease never retires it (its WRITE
 * is done).
 *
 * Stage. A resolve of a disk blob without a staged copy allocates an IO-area
 * region (evicting unpinned staged copies, oldest first, past pickup_s or
 * already picked up) and queues a stage job that preads the file into it;
 * the resolve answers "pending". When the job ends the copy is "staged": later
 * resolves pin it and answer its offsets like any blob (picked_up). A copy
 * one resolve answers is pinned only at the end of that call, so a stage the
 * same call starts never evicts it (resolving_epoch). A staged
 * copy is evicted only with no pins; one that had a pin expire goes through
 * quarantine like any region. A failed stage answers "failed" once.
 *
 * Jobs. At most DP_UNIT_MAX_IO_JOBS jobs are queued or running; a ring of
 * that size feeds io_threads workers (io_cv on mu). A job owns its record's
 * region and fd while it runs (rec->job): nothing frees them meanwhile. A
 * record released (or aborted) while its job runs is "doomed": it leaves
 * the table at once and the job's end frees it. File I/O (open, pread,
 * pwrite, close) runs only in the workers, never under mu: fds to close are
 * handed to the workers through a list (closes), so release never blocks
 * on the filesystem.
 *
 * Files. Each spill gets a new file: O_TMPFILE in ssd_dir where the
 * filesystem supports it (no name ever exists), else a fresh random name
 * (dp-spill-<32 hex>) opened O_EXCL and unlinked at once; the fd keeps the
 * data. Nothing a client sends reaches a path. Whatever kills the unit, the
 * kernel frees the files with the fds. The fallback leaves a name only if
 * the unit dies between its open and its unlink; the next unit created on
 * that directory removes such names (sweep_stale_names).
 *
 * Checkpoints (DESIGN section 9, seed 002 save_shard / load_shard)
 * ----------------------------------------------------------------
 * Save. Under mu: list the published blobs, the entries of each that the row
 * index still points at (the live keys: an overwritten or cleared key of a
 * blob's own index is not saved as live), dup the fd of each disk blob, and
 * take a hold on each (n_holds; the running saves' hold sets are listed in
 * u->holds for dp_unit_check). A hold keeps a record like a pin does: a
 * release meanwhile makes it a zombie (its region and fd stay), freed when the
 * last pin and hold end. Outside mu, on the caller's thread (for serve.c a
 * thread of its own, whose reply is deferred: the ctl thread goes on serving;
 * destroy stops it at its next blob and waits, see dp_unit_admin_wait), the
 * blobs are copied from the put area (published bytes never change) or from
 * the dup'd fd into path.tmp and path.rows.tmp (O_EXCL), fsync'd and renamed
 * without replacing anything. Back under mu the holds end. A spill not yet
 * acknowledged is not published: not saved.
 *
 * Load. Under mu: a put-area region per blob not already in the table (or,
 * with spill and the SSD tier, a spill file to come). Outside mu: one
 * sequential pass over the shard filling the regions, checking each blob's
 * CRC32C and the whole data's, parsing each blob's index as commit does, and
 * writing the spill files. Back under mu: everything is published (only the
 * live entries, publish_locked's keep), or, on any failure, the regions are
 * freed (never exposed: no transfer can have touched them) and nothing is.
 * Trust: paths come from the control plane, which is trusted to name files
 * on this host (checked: absolute, bounded, no control characters); the unit
 * writes only path.tmp / path.rows.tmp and their renames.
 */
#include "unit/unit.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <numa.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "alloc/slab_alloc.h"
#include "blob/blob.h"
#include "blob/crc32c.h"
#include "blob/keys.h"
#include "common/map.h"
#include "unit/writers.h"

typedef struct blob_rec blob_rec;
struct blob_rec {
    char id[DP_UNIT_ID_MAX + 1];
    uint32_t id_len;
    uint64_t off;    /* slab offset */
    uint64_t nbytes; /* as asked by alloc: the blob's total_len */
    uint64_t size;   /* as allocated (rounded up) */
    uint64_t n_entries_decl;
    uint64_t token;     /* the allocation's token: its blob's header must name it */
    dp__writer *writer; /* who WRITEs it, until its commit validates (a reference) */
    uint64_t refs;
    uint32_t n_pins;
    uint32_t n_holds; /* saves copying it (checkpoint): keep it like a pin */
    bool published;
    bool dead;        /* released while pinned: a zombie */
    bool pin_expired; /* sticky: some pin on it expired */
    dp_blob *parsed;  /* after commit */
    uint64_t pin_mark;
    double created_at;
    double last_resolve_at;
    blob_rec *pprev, *pnext; /* uncommitted list, creation order */
    /* SSD tier (see the Design notes) */
    bool has_region;     /* off/size name a region this record holds */
    bool in_io;          /* that region is in the IO area */
    bool disk;           /* published from a file: fd holds the bytes */
    bool job;            /* an io job owns the region and fd now */
    bool staged;         /* disk blob with a complete copy at off */
    bool stage_failed;   /* the last stage failed; reported once */
    bool picked_up;      /* the staged copy was pinned by a reader */
    bool doomed;         /* out of the table while its job runs */
    uint8_t abort_req;   /* spill aborted while its job ran: 1, 2 in flight */
    uint64_t commit_seq; /* order of its validated commit (0: not yet) */
    uint8_t *spill_keep; /* validated spill: entries a later release cleared (0),
                            NULL while none */
    uint8_t res_state;   /* resolve state in the call of res_epoch */
    int fd;              /* -1: none */
    uint64_t res_epoch;
    double staged_at;
    blob_rec *sprev, *snext; /* staged copies, oldest first */
};

/* The records one running save copies (n_holds counts them). */
typedef struct hold_set hold_set;
struct hold_set {
    blob_rec **b;
    uint32_t n;
    hold_set *next;
};

typedef struct pin pin;
struct pin {
    char id[33];
    double expiry;
    blob_rec **blobs;
    uint32_t n;
    pin *prev, *next; /* creation (= expiry) order */
};

/*
 * A key's place in the row index. Its field name points into the strings of
 * its blob's parsed index (the committing blob's for a placeholder): it moves
 * with b, so it lives as long as the blob the slot holds a ref on.
 */
typedef struct slot {
    blob_rec *b;       /* NULL only while commit builds placeholders */
    const char *field; /* not NUL-terminated */
    uint32_t flen;
    uint32_t hash; /* of the field name, to skip most comparisons */
    uint32_t i;    /* entry index in b->parsed */
} slot;

/*
 * A row: its fields' slots in a small array, inline for the usual few fields
 * (a new row then costs one allocation, not one per field plus a hash map),
 * on the heap past ROW_INLINE. Lookup is a scan of the hashes.
 */
enum { ROW_INLINE = 4 };
typedef struct row {
    uint64_t gidx;
    uint32_t n, cap;
    slot *s; /* inl, or a heap array */
    slot inl[ROW_INLINE];
} row;

enum { JOB_SPILL = 1, JOB_STAGE = 2 };

/* A spill whose keys were all replaced before its io job ended (see Order). */
typedef struct superseded {
    struct superseded *next;
    double until;
    bool gone; /* its id was allocated again: forgotten */
    uint8_t id_len;
    char id[DP_UNIT_ID_MAX + 1];
} superseded;

#define SUPERSEDED_KEEP_S 60.0

typedef struct io_job {
    int kind;
    blob_rec *b;
} io_job;

struct dp_unit {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    dp_unit_opts o;
    uint8_t *slab;
    size_t slab_map_len; /* mmap'd length when not from the endpoint */
    dp_slab_alloc *alloc;
    dp_map blobs;        /* id -> blob_rec* */
    dp_map rows;         /* gidx -> row* */
    uint64_t commit_seq; /* last commit_seq handed out */
    dp_map pins;         /* pin id -> pin* */
    blob_rec *pend_head, *pend_tail;
    pin *pin_head, *pin_tail;
    uint64_t pin_epoch;
    uint64_t n_published, n_entries;
    uint64_t n_zombies, zombie_bytes;
    uint64_t leases_expired, pins_expired;
    uint64_t incarnation;        /* random, drawn at create */
    uint64_t token_seq;          /* last allocation token handed out */
    dp__writers *writers;        /* retired regions and who may still write them */
    uint64_t n_identity_refused; /* commits of blobs naming another allocation */
    uint64_t n_allocs_reclaimed; /* open allocations of writers that are gone */
    uint64_t allocs_reclaimed_bytes;
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
    /* SSD tier */
    bool ssd;
    char *ssd_dir;
    bool use_tmpfile;    /* O_TMPFILE works in ssd_dir */
    uint64_t io_base;    /* offset of the IO area in the region */
    uint64_t region_len; /* put area + gap + IO area */
    dp_slab_alloc *io_alloc;
    pthread_cond_t io_cv;
    pthread_t *io_th;
    uint32_t n_io_th;
    bool io_stopping;
    io_job jobs[DP_UNIT_MAX_IO_JOBS]; /* ring */
    uint32_t q_head, q_n, n_running;
    int *closes; /* fds for the workers to close */
    size_t n_closes, cap_closes;
    blob_rec *st_head, *st_tail; /* staged copies, oldest first */
    uint64_t staged_bytes, n_staged, io_job_bytes, io_zombie_bytes, n_doomed;
    uint64_t n_disk, disk_bytes, files_open;
    uint64_t n_spills, spill_bytes, n_spills_failed, n_spills_superseded;
    uint64_t n_stages, stage_bytes, n_stages_failed, n_evictions;
    uint64_t ssd_report_sig;
    uint64_t resolving_epoch; /* set while a resolve starts a stage */
    dp_map superseded;        /* id -> superseded*, also listed oldest first */
    superseded *sup_head, *sup_tail;
    /* Checkpoints */
    struct hold_set *holds; /* running saves, each holding its snapshot */
    uint64_t n_clears;      /* release_rows calls that dropped something */
    uint64_t n_saves, n_loads, n_loaded_blobs;
    /* Admin work (a save or load) running off the ctl thread */
    uint32_t n_admin;
    pthread_cond_t admin_cv;
    int admin_cancel; /* atomic: destroy asks running saves and loads to stop */
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
    o->pickup_s = 10.0;
    o->io_threads = 4;
    o->reclaim_grace_s = 5.0;
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
rec_free(dp_unit *u, blob_rec *b)
{
    if (b == NULL)
        return;
    dp__writers_unref(u->writers, b->writer);
    dp_blob_destroy(b->parsed);
    free(b->spill_keep);
    free(b);
}

/* Give the region back: now, or through quarantine if a pin on it expired. */
static void
region_release_locked(dp_unit *u, blob_rec *b, double now)
{
    DP_ASSERT(b->has_region && !b->job);
    dp_slab_alloc *a = b->in_io ? u->io_alloc : u->alloc;
    uint64_t o = b->in_io ? b->off - u->io_base : b->off;
    int rc;
    if (b->pin_expired)
        rc = dp_slab_alloc_free_at(a, o, now + u->o.quarantine_s, NULL);
    else
        rc = dp_slab_alloc_free(a, o, NULL);
    if (rc != 0) {
        /* Only quarantine can fail (no memory for its heap): then keep the
         * region for good rather than free it early. */
        dp__writers_retire(u->writers, NULL, b->in_io ? DP__AREA_IO : DP__AREA_PUT,
                           b->off, b->size);
    }
    b->has_region = false;
}

/* The fd is closed by an io worker, outside the lock. */
static void
close_later_locked(dp_unit *u, blob_rec *b)
{
    if (b->fd < 0)
        return;
    if (u->n_closes == u->cap_closes) {
        size_t cap = u->cap_closes ? u->cap_closes * 2 : 64;
        int *p = realloc(u->closes, cap * sizeof *p);
        if (p == NULL) {
            /* Out of memory: close here rather than leak the file. */
            close(b->fd);
            b->fd = -1;
            u->files_open--;
            return;
        }
        u->closes = p;
        u->cap_closes = cap;
    }
    u->closes[u->n_closes++] = b->fd;
    b->fd = -1;
    u->files_open--;
    pthread_cond_signal(&u->io_cv);
}

static void
staged_unlink_locked(dp_unit *u, blob_rec *b)
{
    DP_ASSERT(b->staged);
    if (b->sprev != NULL)
        b->sprev->snext = b->snext;
    else
        u->st_head = b->snext;
    if (b->snext != NULL)
        b->snext->sprev = b->sprev;
    else
        u->st_tail = b->sprev;
    b->sprev = b->snext = NULL;
    b->staged = false;
    u->n_staged--;
    u->staged_bytes -= b->size;
}

static void
staged_append_locked(dp_unit *u, blob_rec *b)
{
    b->staged = true;
    b->sprev = u->st_tail;
    b->snext = NULL;
    if (u->st_tail != NULL)
        u->st_tail->snext = b;
    else
        u->st_head = b;
    u->st_tail = b;
    u->n_staged++;
    u->staged_bytes += b->size;
}

/*
 * Free a record that is out of the table and unpinned, with its region and
 * file; if an io job owns them, the job's end does it (doomed).
 */
static void
drop_locked(dp_unit *u, blob_rec *b, double now)
{
    DP_ASSERT(b->n_pins == 0 && b->n_holds == 0);
    if (b->job) {
        if (!b->doomed) {
            b->doomed = true;
            u->n_doomed++;
        }
        return;
    }
    if (b->doomed) {
        b->doomed = false;
        u->n_doomed--;
    }
    if (b->staged)
        staged_unlink_locked(u, b);
    if (b->has_region)
        region_release_locked(u, b, now);
    if (b->disk) {
        u->n_disk--;
        u->disk_bytes -= b->nbytes;
    }
    close_later_locked(u, b);
    rec_free(u, b);
}

/* The region stays allocated for good: a WRITE may still land in it. */
static void
retire_locked(dp_unit *u, blob_rec *b)
{
    DP_ASSERT(!b->published && !b->job);
    dp_map_del(&u->blobs, b->id, b->id_len);
    pend_unlink(u, b);
    dp__writers_retire(u->writers, b->writer, b->in_io ? DP__AREA_IO : DP__AREA_PUT,
                       b->off, b->size);
    DP_LOG_D("retired blob %s: %" PRIu64 " bytes at %" PRIu64 " (writer %s)", b->id,
             b->size, b->off, dp__writer_name(b->writer));
    rec_free(u, b);
}

static void
zombie_count_locked(dp_unit *u, blob_rec *b, int dir)
{
    uint64_t sz = b->has_region ? b->size : 0;
    if (dir > 0) {
        u->n_zombies++;
        if (b->in_io)
            u->io_zombie_bytes += sz;
        else
            u->zombie_bytes += sz;
    } else {
        u->n_zombies--;
        if (b->in_io)
            u->io_zombie_bytes -= sz;
        else
            u->zombie_bytes -= sz;
    }
}

/* A published blob lost its last ref: free it, or keep it for its pins. */
static void
dispose_locked(dp_unit *u, blob_rec *b, double now)
{
    DP_ASSERT(b->published && b->refs == 0 && !b->dead);
    dp_map_del(&u->blobs, b->id, b->id_len);
    u->n_published--;
    if (b->n_pins > 0 || b->n_holds > 0) {
        b->dead = true;
        zombie_count_locked(u, b, +1);
        return;
    }
    drop_locked(u, b, now);
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
        if (b->dead && b->n_pins == 0 && b->n_holds == 0) {
            zombie_count_locked(u, b, -1);
            drop_locked(u, b, now);
        }
    }
    if (expired)
        u->pins_expired++;
    free(p->blobs);
    free(p);
}

static uint32_t
field_hash(const char *f, uint32_t n)
{
    uint32_t h = 2166136261u; /* FNV-1a */
    for (uint32_t k = 0; k < n; k++)
        h = (h ^ (uint8_t)f[k]) * 16777619u;
    return h;
}

static row *
row_new(uint64_t gidx)
{
    row *r = malloc(sizeof *r);
    if (r == NULL)
        return NULL;
    r->gidx = gidx;
    r->n = 0;
    r->cap = ROW_INLINE;
    r->s = r->inl;
    return r;
}

static void
row_free(row *r)
{
    if (r->s != r->inl)
        free(r->s);
    free(r);
}

/* Index of field f's slot in r, or -1. */
static int32_t
row_find(const row *r, const char *f, uint32_t flen, uint32_t h)
{
    for (uint32_t k = 0; k < r->n; k++) {
        const slot *s = &r->s[k];
        if (s->hash == h && s->flen == flen && memcmp(s->field, f, flen) == 0)
            return (int32_t)k;
    }
    return -1;
}

/* r's slot for f, or NULL: a lookup by name. */
static slot *
row_slot(row *r, const char *f, uint32_t flen)
{
    if (r == NULL)
        return NULL;
    int32_t k = row_find(r, f, flen, field_hash(f, flen));
    return k < 0 ? NULL : &r->s[k];
}

/* Append a placeholder slot for f (b NULL); its index, or -1 out of memory. */
static int32_t
row_add(row *r, const char *f, uint32_t flen, uint32_t h)
{
    if (r->n == r->cap) {
        uint32_t cap = r->cap * 2;
        slot *ns = malloc((size_t)cap * sizeof *ns);
        if (ns == NULL)
            return -1;
        memcpy(ns, r->s, (size_t)r->n * sizeof *ns);
        if (r->s != r->inl)
            free(r->s);
        r->s = ns;
        r->cap = cap;
    }
    r->s[r->n] = (slot){.b = NULL, .field = f, .flen = flen, .hash = h, .i = 0};
    return (int32_t)r->n++;
}

/* Remove slot k (the last one takes its place). */
static void
row_del(row *r, uint32_t k)
{
    r->s[k] = r->s[--r->n];
}

/* ---- SSD tier: files and io jobs ---- */

/*
 * A fresh file in ssd_dir with no name left behind: O_TMPFILE when the
 * filesystem has it, else a random name opened O_EXCL and unlinked at once.
 * label gets a description for messages. Worker threads and create only.
 */
static int
new_file(dp_unit *u, bool try_tmpfile, int *out, char *label, size_t cap, dp_detail *d)
{
#ifdef O_TMPFILE
    if (try_tmpfile) {
        int fd = open(u->ssd_dir, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
        if (fd >= 0) {
            snprintf(label, cap, "an O_TMPFILE file in %s", u->ssd_dir);
            *out = fd;
            return 0;
        }
    }
#else
    (void)try_tmpfile;
#endif
    char rnd[33];
    int rc = dp_random_hex_id(rnd, d);
    if (rc != 0)
        return rc;
    snprintf(label, cap, "%s/dp-spill-%s", u->ssd_dir, rnd);
    int fd = open(label, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0)
        return dp_fail_sys(d, errno, "ssd: creating %s", label);
    /* ENOENT: a starting unit swept the name first (see sweep_stale_names). */
    if (unlink(label) != 0 && errno != ENOENT) {
        int e = errno;
        close(fd);
        return dp_fail_sys(d, e, "ssd: unlinking %s", label);
    }
    *out = fd;
    return 0;
}

/* Write p[0, n) at file offset 0: short writes and EINTR are retried. */
static int
write_all(int fd, const uint8_t *p, uint64_t n, const char *label, dp_detail *d)
{
    uint64_t done = 0;
    while (done < n) {
        size_t chunk = (size_t)DP_MIN(n - done, (uint64_t)1 << 30);
        ssize_t w = pwrite(fd, p + done, chunk, (off_t)done);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return dp_fail_sys(d, errno,
                               "ssd: writing %s at offset %" PRIu64 " of %" PRIu64, label,
                               done, n);
        }
        if (w == 0)
            return dp_fail_sys(d, EIO, "ssd: writing %s: no progress at offset %" PRIu64,
                               label, done);
        done += (uint64_t)w;
    }
    return 0;
}

/* Read file offsets [0, n) into p: short reads and EINTR are retried. */
static int
read_all(int fd, uint8_t *p, uint64_t n, const char *what, dp_detail *d)
{
    uint64_t done = 0;
    while (done < n) {
        size_t chunk = (size_t)DP_MIN(n - done, (uint64_t)1 << 30);
        ssize_t r = pread(fd, p + done, chunk, (off_t)done);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return dp_fail_sys(d, errno,
                               "ssd: reading %s at offset %" PRIu64 " of %" PRIu64, what,
                               done, n);
        }
        if (r == 0)
            return dp_fail_sys(d, EIO,
                               "ssd: reading %s: the file ends at %" PRIu64
                               " bytes, the blob has %" PRIu64,
                               what, done, n);
        done += (uint64_t)r;
    }
    return 0;
}

static bool
jobs_full_locked(const dp_unit *u)
{
    return u->q_n + u->n_running >= DP_UNIT_MAX_IO_JOBS;
}

/* Queue a job owning b's region (the caller checked jobs_full_locked). */
static void
submit_locked(dp_unit *u, int kind, blob_rec *b)
{
    DP_ASSERT(!jobs_full_locked(u) && !b->job && b->has_region);
    b->job = true;
    u->io_job_bytes += b->size;
    u->jobs[(u->q_head + u->q_n) % DP_UNIT_MAX_IO_JOBS] = (io_job){kind, b};
    u->q_n++;
    pthread_cond_signal(&u->io_cv);
}

static int publish_locked(dp_unit *u, blob_rec *b, const uint8_t *keep, double now,
                          dp_detail *d);

/*
 * The entries a finished spill may still publish: not cleared by a release
 * since its commit (spill_keep), and not pointing at a blob whose commit came
 * later. *keep (malloc'd, one byte per entry) is NULL when none remain.
 */
static int
spill_keep_locked(dp_unit *u, blob_rec *b, uint8_t **keep, uint32_t *kept, dp_detail *d)
{
    uint32_t n = dp_blob_count(b->parsed);
    uint8_t *k = malloc(n ? n : 1);
    if (k == NULL)
        return dp_fail(d, DP_ENOMEM, "spill of %s: out of memory", b->id);
    uint32_t c = 0;
    for (uint32_t i = 0; i < n; i++) {
        const dp_blob_entry *e = dp_blob_entry_at(b->parsed, i);
        bool live = b->spill_keep == NULL || b->spill_keep[i];
        if (live) {
            row *r = dp_map_get_u64(&u->rows, e->gidx);
            slot *s = row_slot(r, e->field, (uint32_t)e->field_len);
            if (s != NULL && s->b != NULL && s->b->commit_seq > b->commit_seq)
                live = false;
        }
        k[i] = live;
        c += live;
    }
    if (c == 0) {
        free(k);
        k = NULL;
    }
    *keep = k;
    *kept = c;
    return DP_OK;
}

/* Remember b's id as superseded (its commit answers "done"); best effort. */
static void
superseded_add_locked(dp_unit *u, const blob_rec *b, double now)
{
    superseded *x = calloc(1, sizeof *x);
    if (x == NULL)
        return; /* the commit answers "lost": a false alarm, never a false "done" */
    memcpy(x->id, b->id, b->id_len);
    x->id_len = (uint8_t)b->id_len;
    x->until = now + DP_MAX(SUPERSEDED_KEEP_S, u->o.alloc_lease_s);
    if (dp_map_put(&u->superseded, x->id, x->id_len, x, NULL) != 0) {
        free(x);
        return;
    }
    if (u->sup_tail != NULL)
        u->sup_tail->next = x;
    else
        u->sup_head = x;
    u->sup_tail = x;
}

/* Forget superseded ids past their time. */
static void
superseded_expire_locked(dp_unit *u, double now)
{
    while (u->sup_head != NULL && (u->sup_head->gone || u->sup_head->until <= now)) {
        superseded *x = u->sup_head;
        u->sup_head = x->next;
        if (u->sup_head == NULL)
            u->sup_tail = NULL;
        if (!x->gone)
            dp_map_del(&u->superseded, x->id, x->id_len);
        free(x);
    }
}

/* A spill job ended (rc, fd): publish the disk blob or drop it. */
static void
spill_done_locked(dp_unit *u, blob_rec *b, int rc, int fd, const dp_detail *jd)
{
    double now = now_s(u);
    b->job = false;
    u->io_job_bytes -= b->size;
    if (fd >= 0) {
        b->fd = fd;
        u->files_open++;
    }
    dp_detail pd;
    dp_detail_clear(&pd);
    uint8_t *keep = NULL;
    if (rc == 0 && b->abort_req == 0) {
        uint32_t kept = 0;
        rc = spill_keep_locked(u, b, &keep, &kept, &pd);
        if (rc != 0)
            jd = &pd;
        else if (kept == 0) {
            u->n_spills_superseded++; /* every key overwritten or released since */
            superseded_add_locked(u, b, now);
        }
    }
    if (rc == 0 && b->abort_req == 0 && keep != NULL) {
        b->disk = true; /* before publish: drop_locked counts disk blobs */
        u->n_disk++;
        u->disk_bytes += b->nbytes;
        rc = publish_locked(u, b, keep, now, &pd);
        free(keep);
        keep = NULL;
        if (rc == 0) {
            region_release_locked(u, b, now);
            b->in_io = false;
            u->n_spills++;
            u->spill_bytes += b->nbytes;
            return;
        }
        jd = &pd;
    }
    if (rc != 0) {
        u->n_spills_failed++;
        DP_LOG_W("unit %u: spill of blob %s (%" PRIu64 " bytes) failed, commit answers "
                 "lost: %s",
                 u->o.unit_id, b->id, b->nbytes, dp_detail_msg(jd));
    }
    dp_map_del(&u->blobs, b->id, b->id_len);
    pend_unlink(u, b);
    if (b->abort_req == 2) {
        /* abort(in_flight): the client says a WRITE may still run. */
        close_later_locked(u, b);
        if (b->disk) {
            u->n_disk--;
            u->disk_bytes -= b->nbytes;
        }
        dp__writers_retire(u->writers, b->writer, b->in_io ? DP__AREA_IO : DP__AREA_PUT,
                           b->off, b->size);
        rec_free(u, b);
        return;
    }
    drop_locked(u, b, now);
}

/* A stage job ended: the copy is staged, or the stage failed. */
static void
stage_done_locked(dp_unit *u, blob_rec *b, int rc, const dp_detail *jd)
{
    double now = now_s(u);
    b->job = false;
    u->io_job_bytes -= b->size;
    if (b->doomed) { /* released while staging */
        drop_locked(u, b, now);
        return;
    }
    if (rc == 0) {
        b->staged_at = now;
        b->picked_up = false;
        staged_append_locked(u, b);
        u->n_stages++;
        u->stage_bytes += b->nbytes;
        return;
    }
    u->n_stages_failed++;
    DP_LOG_W("unit %u: stage of blob %s (%" PRIu64 " bytes) failed: %s", u->o.unit_id,
             b->id, b->nbytes, dp_detail_msg(jd));
    region_release_locked(u, b, now);
    b->in_io = false;
    b->stage_failed = true;
}

/* io worker: closes first (cheap, unbounded list), then one job at a time. */
static void *
io_main(void *arg)
{
    dp_unit *u = arg;
    pthread_mutex_lock(&u->mu);
    for (;;) {
        while (!u->io_stopping && u->q_n == 0 && u->n_closes == 0)
            pthread_cond_wait(&u->io_cv, &u->mu);
        if (u->n_closes > 0) {
            int fd = u->closes[--u->n_closes];
            pthread_mutex_unlock(&u->mu);
            close(fd);
            pthread_mutex_lock(&u->mu);
            continue;
        }
        if (u->io_stopping)
            break;
        io_job j = u->jobs[u->q_head];
        u->q_head = (u->q_head + 1) % DP_UNIT_MAX_IO_JOBS;
        u->q_n--;
        u->n_running++;
        blob_rec *b = j.b;
        uint8_t *p = u->slab + b->off;
        uint64_t n = b->nbytes;
        int fd = b->fd;
        char id[DP_UNIT_ID_MAX + 1];
        memcpy(id, b->id, sizeof id);
        pthread_mutex_unlock(&u->mu);

        dp_detail jd;
        dp_detail_clear(&jd);
        char label[512];
        int rc;
        if (j.kind == JOB_SPILL) {
            fd = -1;
            rc = new_file(u, u->use_tmpfile, &fd, label, sizeof label, &jd);
            if (rc == 0)
                rc = write_all(fd, p, n, label, &jd);
            if (rc != 0 && fd >= 0) {
                close(fd);
                fd = -1;
            }
        } else {
            snprintf(label, sizeof label, "the file of blob %s in %s", id, u->ssd_dir);
            rc = read_all(fd, p, n, label, &jd);
        }

        pthread_mutex_lock(&u->mu);
        u->n_running--;
        if (j.kind == JOB_SPILL)
            spill_done_locked(u, b, rc, fd, &jd);
        else
            stage_done_locked(u, b, rc, &jd);
    }
    pthread_mutex_unlock(&u->mu);
    return NULL;
}

/*
 * IO-area region of nbytes: free room, then quarantine that is due, then
 * unpinned staged copies (oldest first; one not picked up yet only after
 * pickup_s). DP_EBUSY (+reason) if jobs, staged copies or quarantine will
 * free enough, DP_EUNITFULL if nothing will, DP_ENOMEM.
 */
static int
io_alloc_locked(dp_unit *u, uint64_t nbytes, double now, uint64_t *off,
                const char **reason, dp_detail *d)
{
    uint64_t o = 0;
    dp_detail ad;
    dp_detail_clear(&ad);
    int rc = dp_slab_alloc_alloc(u->io_alloc, nbytes, &o, &ad);
    if (rc == DP_EUNITFULL && dp_slab_alloc_sweep(u->io_alloc, now) > 0)
        rc = dp_slab_alloc_alloc(u->io_alloc, nbytes, &o, &ad);
    blob_rec *b = u->st_head;
    while (rc == DP_EUNITFULL && b != NULL) {
        blob_rec *next = b->snext;
        /* A copy answered earlier in the running resolve is pinned at its end. */
        bool answered = u->resolving_epoch != 0 && b->res_epoch == u->resolving_epoch;
        if (b->n_pins == 0 && !b->dead && !answered &&
            (b->picked_up || now - b->staged_at >= u->o.pickup_s)) {
            staged_unlink_locked(u, b);
            region_release_locked(u, b, now);
            b->in_io = false;
            b->pin_expired = false; /* the next copy is a new region */
            u->n_evictions++;
            rc = dp_slab_alloc_alloc(u->io_alloc, nbytes, &o, &ad);
        }
        b = next;
    }
    if (rc == 0) {
        *off = o + u->io_base;
        return 0;
    }
    if (rc != DP_EUNITFULL)
        return dp_fail(d, rc == DP_ETOOBIG ? DP_EPROTO : rc, "%s", dp_detail_msg(&ad));
    dp_slab_alloc_stats st;
    dp_slab_alloc_get_stats(u->io_alloc, &st);
    uint64_t pending = st.quarantined_bytes + u->staged_bytes + u->io_job_bytes;
    if (pending > 0 && st.free_bytes + pending >= nbytes) {
        const char *why = u->io_job_bytes > 0   ? "io jobs"
                          : u->staged_bytes > 0 ? "staged copies"
                                                : "quarantine";
        if (reason != NULL)
            *reason = why;
        return dp_fail(d, DP_EBUSY,
                       "unit %u: no room for %" PRIu64
                       " bytes in the IO area now (largest "
                       "free %" PRIu64 ", free %" PRIu64 "); %" PRIu64
                       " bytes held by io jobs, %" PRIu64 " by staged copies and %" PRIu64
                       " in quarantine will free: retry",
                       u->o.unit_id, nbytes, st.largest_free, st.free_bytes,
                       u->io_job_bytes, u->staged_bytes, st.quarantined_bytes);
    }
    return dp_fail(d, DP_EUNITFULL,
                   "unit %u: no room for %" PRIu64
                   " bytes in the IO area (largest free %" PRIu64 ", free %" PRIu64
                   ") and nothing pending frees any",
                   u->o.unit_id, nbytes, st.largest_free, st.free_bytes);
}

/*
 * Start staging disk blob b: 0 (queued), DP_EBUSY (not now: the queue is full
 * or room will free), DP_EUNITFULL (it can never be staged now).
 */
static int
start_stage_locked(dp_unit *u, blob_rec *b, double now)
{
    DP_ASSERT(b->disk && !b->staged && !b->job && !b->has_region);
    if (jobs_full_locked(u))
        return DP_EBUSY;
    uint64_t o = 0;
    int rc = io_alloc_locked(u, b->nbytes, now, &o, NULL, NULL);
    if (rc != 0)
        return rc == DP_EUNITFULL ? DP_EUNITFULL : DP_EBUSY;
    b->off = o;
    b->size = b->nbytes;
    dp_slab_alloc_size_of(u->io_alloc, o - u->io_base, &b->size);
    b->has_region = true;
    b->in_io = true;
    b->stage_failed = false;
    submit_locked(u, JOB_STAGE, b);
    return 0;
}

enum { RES_READY = 1, RES_PENDING, RES_FAILED };

/* How a resolve answers for published blob b (once per call: epoch). */
static int
resolve_state_locked(dp_unit *u, blob_rec *b, uint64_t epoch, double now)
{
    if (!b->disk)
        return RES_READY;
    if (b->res_epoch == epoch)
        return b->res_state;
    int st;
    if (b->staged) {
        b->picked_up = true;
        st = RES_READY;
    } else if (b->job) {
        st = RES_PENDING;
    } else if (b->stage_failed) {
        b->stage_failed = false; /* reported once; the next resolve tries again */
        st = RES_FAILED;
    } else {
        u->resolving_epoch = epoch;
        int rc = start_stage_locked(u, b, now);
        u->resolving_epoch = 0;
        st = rc == DP_EUNITFULL ? RES_FAILED : RES_PENDING;
    }
    b->res_epoch = epoch;
    b->res_state = (uint8_t)st;
    return st;
}

/*
 * Remove names "dp-spill-<32 hex>" from ssd_dir: files of a unit killed
 * between the open and the unlink of the fallback path. A running unit that
 * loses such a name to this sweep loses nothing (its fd keeps the data and
 * new_file accepts ENOENT from its own unlink).
 */
static void
sweep_stale_names(dp_unit *u)
{
    DIR *dh = opendir(u->ssd_dir);
    if (dh == NULL)
        return;
    int dfd = dirfd(dh);
    unsigned n = 0;
    struct dirent *e;
    while ((e = readdir(dh)) != NULL) {
        const char *nm = e->d_name;
        if (strncmp(nm, "dp-spill-", 9) != 0 || strlen(nm) != 9 + 32 ||
            strspn(nm + 9, "0123456789abcdef") != 32)
            continue;
        if (unlinkat(dfd, nm, 0) == 0)
            n++;
    }
    closedir(dh);
    if (n > 0)
        DP_LOG_W("unit %u: removed %u stale spill file names from %s", u->o.unit_id, n,
                 u->ssd_dir);
}

/* Check ssd_dir, pick the file method and start the io threads. */
static int
ssd_open(dp_unit *u, dp_detail *d)
{
    struct stat sb;
    if (stat(u->ssd_dir, &sb) != 0)
        return dp_fail_sys(d, errno, "unit: ssd_dir %s", u->ssd_dir);
    if (!S_ISDIR(sb.st_mode))
        return dp_fail(d, DP_EINVAL, "unit: ssd_dir %s is not a directory", u->ssd_dir);
    sweep_stale_names(u);
    char label[512];
    int fd = -1;
    int rc = new_file(u, !u->o.ssd_no_tmpfile, &fd, label, sizeof label, d);
    if (rc != 0)
        return rc;
    close(fd);
    u->use_tmpfile = strncmp(label, "an O_TMPFILE", 12) == 0;
    DP_LOG_D("unit %u: ssd_dir %s: files %s", u->o.unit_id, u->ssd_dir,
             u->use_tmpfile ? "O_TMPFILE" : "opened and unlinked");
    u->io_th = calloc(u->o.io_threads, sizeof *u->io_th);
    if (u->io_th == NULL)
        return dp_fail(d, DP_ENOMEM, "unit: out of memory");
    for (uint32_t i = 0; i < u->o.io_threads; i++) {
        int e = pthread_create(&u->io_th[i], NULL, io_main, u);
        if (e != 0)
            return dp_fail_sys(d, e, "unit: starting io thread %u", i);
        u->n_io_th++;
    }
    return 0;
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
    bool ssd = opts->ssd_dir != NULL && opts->ssd_dir[0] != '\0';
    if (ssd && (opts->staging_bytes < 4096 || opts->staging_bytes > (1ull << 50)))
        return dp_fail(
            d, DP_EINVAL,
            "unit: the SSD tier needs staging_bytes of 4 KiB or more, not %" PRIu64,
            opts->staging_bytes);
    if (!ssd && opts->staging_bytes != 0)
        return dp_fail(d, DP_EINVAL, "unit: staging_bytes without ssd_dir");
    if (ssd && (!(opts->pickup_s >= 0) || !isfinite(opts->pickup_s) ||
                opts->io_threads == 0 || opts->io_threads > 256))
        return dp_fail(d, DP_EINVAL,
                       "unit: pickup_s must be >= 0 and io_threads 1..256 with ssd_dir");
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
    pthread_cond_init(&u->admin_cv, NULL);
    pthread_condattr_destroy(&ca);
    pthread_cond_init(&u->io_cv, NULL);
    u->ssd = ssd;
    u->region_len = (size_t)u->o.slab_bytes;
    if (ssd) {
        u->io_base = DP_ALIGN_UP(u->o.slab_bytes, 4096);
        u->region_len = u->io_base + u->o.staging_bytes;
        u->ssd_dir = strdup(opts->ssd_dir);
        u->o.ssd_dir = u->ssd_dir;
        if (u->ssd_dir == NULL) {
            free(u);
            return dp_fail(d, DP_ENOMEM, "unit: out of memory");
        }
    }
    dp_map_init_str(&u->blobs);
    dp_map_init_u64(&u->rows);
    dp_map_init_str(&u->pins);
    dp_map_init_str(&u->superseded);
    dp_unit_numa_apply(u->o.numa, u->o.unit_id, u->numa_desc, sizeof u->numa_desc);
    int rc = dp__writers_create(u->o.reclaim_grace_s, dp_host_key(), &u->writers, d);
    if (rc != 0)
        goto fail;
    /* A random, non-zero incarnation tells this process from any earlier one. */
    do {
        rc = dp_random_bytes(&u->incarnation, sizeof u->incarnation, d);
        if (rc != 0)
            goto fail;
    } while (u->incarnation == 0);
    if (u->o.ep != NULL) {
        void *addr = NULL;
        rc = dp_endpoint_alloc(u->o.ep, (size_t)u->region_len, &addr, d);
        if (rc != 0) {
            dp_fail_ctx(d, rc,
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
            rc = dp_fail_sys(d, errno, "unit: mmap of a %" PRIu64 "-byte slab",
                             u->region_len);
            u->slab_map_len = 0;
            goto fail;
        }
        u->slab = p;
    }
    rc = dp_slab_alloc_create(u->o.slab_bytes, DP_BLOB_ALIGN, &u->alloc, d);
    if (rc != 0)
        goto fail;
    if (ssd) {
        rc = dp_slab_alloc_create(u->o.staging_bytes, DP_BLOB_ALIGN, &u->io_alloc, d);
        if (rc == 0)
            rc = ssd_open(u, d);
        if (rc != 0)
            goto fail;
    }
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
dp_unit_admin_begin(dp_unit *u)
{
    pthread_mutex_lock(&u->mu);
    u->n_admin++;
    pthread_mutex_unlock(&u->mu);
}

void
dp_unit_admin_end(dp_unit *u)
{
    pthread_mutex_lock(&u->mu);
    if (--u->n_admin == 0)
        pthread_cond_broadcast(&u->admin_cv);
    pthread_mutex_unlock(&u->mu);
}

/* A save or load asked to stop (the unit is being destroyed): fail it now. */
static int
admin_cancelled(dp_unit *u, const char *what, dp_detail *d)
{
    if (!__atomic_load_n(&u->admin_cancel, __ATOMIC_ACQUIRE))
        return DP_OK;
    return dp_fail(d, DP_ECLOSED, "%s: the unit is stopping", what);
}

void
dp_unit_admin_wait(dp_unit *u)
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
dp_unit_destroy(dp_unit *u)
{
    if (u == NULL)
        return;
    __atomic_store_n(&u->admin_cancel, 1, __ATOMIC_RELEASE);
    dp_unit_admin_wait(u);
    pthread_mutex_lock(&u->mu);
    bool join = u->ticker_on;
    u->stopping = true;
    pthread_cond_broadcast(&u->cv);
    pthread_mutex_unlock(&u->mu);
    if (join)
        pthread_join(u->ticker, NULL);
    /* io threads: a running job ends (and completes) first. */
    pthread_mutex_lock(&u->mu);
    u->io_stopping = true;
    pthread_cond_broadcast(&u->io_cv);
    pthread_mutex_unlock(&u->mu);
    for (uint32_t i = 0; i < u->n_io_th; i++)
        pthread_join(u->io_th[i], NULL);
    free(u->io_th);
    /* Queued jobs never run: their records give up the job. */
    for (uint32_t i = 0; i < u->q_n; i++) {
        blob_rec *b = u->jobs[(u->q_head + i) % DP_UNIT_MAX_IO_JOBS].b;
        b->job = false;
        if (b->doomed)
            drop_locked(u, b, 0);
    }
    u->q_n = 0;
    /* Pins first: they own the zombies. */
    while (u->pin_head != NULL)
        pin_end_locked(u, u->pin_head, false, 0);
    size_t it = 0;
    void *v;
    while (dp_map_next(&u->rows, &it, NULL, NULL, NULL, &v))
        row_free(v);
    it = 0;
    while (dp_map_next(&u->blobs, &it, NULL, NULL, NULL, &v)) {
        blob_rec *b = v;
        if (b->fd >= 0)
            close(b->fd);
        rec_free(u, b);
    }
    for (size_t i = 0; i < u->n_closes; i++)
        close(u->closes[i]);
    free(u->closes);
    dp_slab_alloc_destroy(u->io_alloc);
    free(u->ssd_dir);
    dp_map_fini(&u->rows);
    dp_map_fini(&u->blobs);
    dp_map_fini(&u->pins);
    dp_map_fini(&u->superseded);
    for (superseded *x = u->sup_head, *next; x != NULL; x = next) {
        next = x->next;
        free(x);
    }
    dp__writers_destroy(u->writers);
    dp_slab_alloc_destroy(u->alloc);
    if (u->slab != NULL) {
        if (u->o.ep != NULL)
            dp_endpoint_deregister(u->o.ep, u->slab, NULL);
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

uint64_t
dp_unit_io_bytes(const dp_unit *u)
{
    return u->ssd ? u->o.staging_bytes : 0;
}

uint64_t
dp_unit_io_base(const dp_unit *u)
{
    return u->io_base;
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
    info->io_bytes = dp_unit_io_bytes(u);
    info->numa = zview(u->numa_desc);
    info->slab_addr = (uint64_t)(uintptr_t)u->slab;
    info->read_pin_ms = (uint64_t)(u->o.read_pin_s * 1000.0);
    info->incarnation = u->incarnation;
    info->proto = DP_WIRE_PROTO;
    info->pid = (uint64_t)getpid();
    info->host = zview(dp_host_key());
}

uint64_t
dp_unit_incarnation(const dp_unit *u)
{
    return u->incarnation;
}

uint64_t
dp_unit_alloc_token(dp_unit *u, const char *blob_id, size_t id_len)
{
    pthread_mutex_lock(&u->mu);
    blob_rec *b = dp_map_get(&u->blobs, blob_id, id_len);
    uint64_t t = b != NULL && !b->published ? b->token : 0;
    pthread_mutex_unlock(&u->mu);
    return t;
}

/* ---- alloc ---- */

static uint64_t
retired_now_locked(const dp_unit *u)
{
    dp__writers_stats ws;
    dp__writers_get_stats(u->writers, &ws);
    return ws.retired_bytes;
}

/* Put-area region: 0, DP_EBUSY/DP_EUNITFULL (counted by the caller), others. */
static int
put_alloc_locked(dp_unit *u, uint64_t nbytes, double now, uint64_t *off,
                 const char **reason, dp_detail *d)
{
    dp_detail ad;
    dp_detail_clear(&ad);
    int rc = dp_slab_alloc_alloc(u->alloc, nbytes, off, &ad);
    if (rc == DP_EUNITFULL && dp_slab_alloc_sweep(u->alloc, now) > 0)
        rc = dp_slab_alloc_alloc(u->alloc, nbytes, off, &ad);
    if (rc == 0)
        return 0;
    if (rc != DP_EUNITFULL)
        return dp_fail(d, rc == DP_ETOOBIG ? DP_EPROTO : rc, "%s", dp_detail_msg(&ad));
    dp_slab_alloc_stats st;
    dp_slab_alloc_get_stats(u->alloc, &st);
    uint64_t pending = st.quarantined_bytes + u->zombie_bytes;
    if (pending > 0 && st.free_bytes + pending >= nbytes) {
        if (reason != NULL)
            *reason = st.quarantined_bytes > 0 ? "quarantine" : "pins";
        return dp_fail(d, DP_EBUSY,
                       "unit %u: no room for %" PRIu64 " bytes now (largest free %" PRIu64
                       ", free %" PRIu64 "); %" PRIu64 " bytes in quarantine and %" PRIu64
                       " held by pins of released blobs will free: retry",
                       u->o.unit_id, nbytes, st.largest_free, st.free_bytes,
                       st.quarantined_bytes, u->zombie_bytes);
    }
    return dp_fail(
        d, DP_EUNITFULL,
        "unit %u: no room for %" PRIu64 " bytes (largest free %" PRIu64 ", free %" PRIu64
        ", retired %" PRIu64 ") and nothing pending frees any",
        u->o.unit_id, nbytes, st.largest_free, st.free_bytes, retired_now_locked(u));
}

int
dp_unit_alloc(dp_unit *u, const char *blob_id, size_t id_len, uint64_t nbytes,
              uint64_t n_entries, uint64_t *off, const char **reason, dp_detail *d)
{
    return dp_unit_alloc_spill(u, blob_id, id_len, nbytes, n_entries, false, off, reason,
                               d);
}

int
dp_unit_alloc_spill(dp_unit *u, const char *blob_id, size_t id_len, uint64_t nbytes,
                    uint64_t n_entries, bool spill, uint64_t *off, const char **reason,
                    dp_detail *d)
{
    dp_wire_alloc_args a = {.blob_id = {blob_id, (uint32_t)id_len},
                            .nbytes = nbytes,
                            .n_entries = n_entries,
                            .spill = spill};
    dp_wire_alloc_res r;
    int rc = dp_unit_alloc_req(u, &a, &r, reason, d);
    if (rc == 0)
        *off = r.off;
    return rc;
}

int
dp_unit_alloc_req(dp_unit *u, const dp_wire_alloc_args *args, dp_wire_alloc_res *res,
                  const char **reason, dp_detail *d)
{
    const char *blob_id = args->blob_id.p;
    size_t id_len = args->blob_id.n;
    uint64_t nbytes = args->nbytes, n_entries = args->n_entries;
    bool spill = args->spill;
    uint64_t dummy_off;
    uint64_t *off = &dummy_off;
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
    bool to_io = spill && u->ssd && nbytes <= u->o.staging_bytes;
    bool to_put = nbytes <= u->o.slab_bytes;
    blob_rec *b = dp_map_get(&u->blobs, blob_id, id_len);
    if (b != NULL) {
        if (!b->published && b->parsed == NULL && b->nbytes == nbytes) {
            *off = b->off; /* a retried alloc */
            res->off = b->off;
            res->token = b->token;
            goto out;
        }
        u->n_proto++;
        rc = dp_fail(d, DP_EPROTO,
                     "alloc %.*s: blob id already in use (%s, %" PRIu64 " bytes)",
                     (int)id_len, blob_id,
                     b->published ? "committed"
                     : b->parsed  ? "committing"
                                  : "allocated",
                     b->nbytes);
        goto out;
    }
    if (!to_put && !to_io) {
        u->n_proto++;
        rc = dp_fail(d, DP_EPROTO,
                     "alloc %.*s: %" PRIu64 " bytes can never fit a %" PRIu64
                     "-byte slab%s (IO area %" PRIu64 " bytes)",
                     (int)id_len, blob_id, nbytes, u->o.slab_bytes,
                     spill ? "" : " without spill", dp_unit_io_bytes(u));
        goto out;
    }
    uint64_t o = 0;
    bool in_io = false;
    const char *why = NULL;
    dp_detail pd;
    dp_detail_clear(&pd);
    rc = to_put ? put_alloc_locked(u, nbytes, now, &o, &why, &pd) : DP_EUNITFULL;
    if ((rc == DP_EUNITFULL || rc == DP_EBUSY) && to_io) {
        int prc = rc;
        const char *iwhy = NULL;
        rc = io_alloc_locked(u, nbytes, now, &o, &iwhy, d);
        if (rc == 0) {
            in_io = true;
        } else if (prc == DP_EBUSY && rc == DP_EUNITFULL) {
            rc = DP_EBUSY; /* the put area will free room */
            dp_fail(d, rc, "%s", dp_detail_msg(&pd));
        } else if (rc == DP_EBUSY) {
            why = iwhy;
        }
    } else if (rc != 0) {
        dp_fail(d, rc, "%s", dp_detail_msg(&pd));
    }
    if (rc == DP_EBUSY) {
        u->n_busy++;
        if (reason != NULL)
            *reason = why;
        goto out;
    }
    if (rc == DP_EUNITFULL) {
        u->n_full++;
        goto out;
    }
    if (rc != 0) {
        if (rc == DP_EPROTO)
            u->n_proto++;
        dp_fail_ctx(d, rc, "alloc %.*s", (int)id_len, blob_id);
        goto out;
    }
    dp_slab_alloc *a = in_io ? u->io_alloc : u->alloc;
    uint64_t ao = in_io ? o - u->io_base : o;
    b = calloc(1, sizeof *b);
    if (b == NULL) {
        dp_slab_alloc_free(a, ao, NULL);
        rc = dp_fail(d, DP_ENOMEM, "alloc: out of memory");
        goto out;
    }
    memcpy(b->id, blob_id, id_len);
    b->id_len = (uint32_t)id_len;
    b->off = o;
    b->nbytes = nbytes;
    b->size = nbytes;
    dp_slab_alloc_size_of(a, ao, &b->size);
    b->has_region = true;
    b->in_io = in_io;
    b->fd = -1;
    b->n_entries_decl = n_entries;
    b->created_at = now;
    b->token = ++u->token_seq;
    if (dp_map_put(&u->blobs, b->id, b->id_len, b, NULL) != 0) {
        dp_slab_alloc_free(a, ao, NULL);
        free(b);
        rc = dp_fail(d, DP_ENOMEM, "alloc: out of memory");
        goto out;
    }
    b->writer = dp__writers_ref(u->writers, args);
    b->pprev = u->pend_tail;
    if (u->pend_tail != NULL)
        u->pend_tail->pnext = b;
    else
        u->pend_head = b;
    u->pend_tail = b;
    u->n_alloc++;
    /* The id names a new blob now, not a superseded spill. */
    superseded *x = dp_map_del(&u->superseded, b->id, b->id_len);
    if (x != NULL)
        x->gone = true;
    *off = o;
    res->off = o;
    res->token = b->token;
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
        uint32_t flen = (uint32_t)e->field_len;
        int32_t k = row_find(r, e->field, flen, field_hash(e->field, flen));
        if (k >= 0 && r->s[k].b == NULL)
            row_del(r, (uint32_t)k);
        if (r->n == 0) {
            dp_map_del_u64(&u->rows, e->gidx);
            row_free(r);
        }
    }
}

/*
 * Install b's parsed index in the row index (b->parsed set, b unpublished).
 * keep (NULL: all) names the entries to install, one byte per entry: a
 * restored blob brings back only the keys its checkpoint listed as live; the
 * caller makes sure at least one is kept. DP_ENOMEM: nothing changed.
 */
static int
publish_locked(dp_unit *u, blob_rec *b, const uint8_t *keep, double now, dp_detail *d)
{
    const dp_blob *pb = b->parsed;
    uint32_t n = dp_blob_count(pb), i = 0, kept = 0;
    /*
     * Each entry's (row, slot index), found once (a row's fields are usually
     * adjacent); an index, not a pointer: a row's array may move as it grows.
     */
    struct at {
        row *r;
        uint32_t k;
    } *at = malloc((size_t)n * sizeof *at);
    if (at == NULL)
        return dp_fail(d, DP_ENOMEM, "commit %s: out of memory; nothing published",
                       b->id);
    row *r = NULL;
    /* Pass 1: every row and slot exists (the only step that allocates). */
    for (i = 0; i < n; i++) {
        at[i].r = NULL;
        if (keep != NULL && !keep[i])
            continue;
        kept++;
        const dp_blob_entry *e = dp_blob_entry_at(pb, i);
        if (r == NULL || r->gidx != e->gidx)
            r = dp_map_get_u64(&u->rows, e->gidx);
        if (r == NULL) {
            r = row_new(e->gidx);
            if (r == NULL)
                goto nomem;
            if (dp_map_put_u64(&u->rows, e->gidx, r, NULL) != 0) {
                row_free(r);
                r = NULL;
                goto nomem;
            }
        }
        uint32_t flen = (uint32_t)e->field_len, h = field_hash(e->field, flen);
        int32_t k = row_find(r, e->field, flen, h);
        if (k < 0 && (k = row_add(r, e->field, flen, h)) < 0) {
            if (r->n == 0) {
                dp_map_del_u64(&u->rows, e->gidx);
                row_free(r);
            }
            r = NULL;
            goto nomem;
        }
        at[i] = (struct at){r, (uint32_t)k};
    }
    /* Pass 2: publish, cannot fail. */
    b->published = true;
    b->refs = kept;
    pend_unlink(u, b);
    u->n_published++;
    u->n_commit++;
    for (i = 0; i < n; i++) {
        if (at[i].r == NULL)
            continue;
        slot *s = &at[i].r->s[at[i].k];
        blob_rec *old = s->b;
        s->b = b;
        s->i = i;
        s->field = dp_blob_entry_at(pb, i)->field; /* the name now lives in b */
        if (old != NULL)
            unref_locked(u, old, now);
        else
            u->n_entries++;
    }
    free(at);
    return 0;
nomem:
    free(at);
    publish_rollback_locked(u, pb, i + 1 < n ? i + 1 : n);
    return dp_fail(d, DP_ENOMEM, "commit %s: out of memory; nothing published", b->id);
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
    dp_blob *pb = NULL;
    pthread_mutex_lock(&u->mu);
    double now = now_s(u);
    blob_rec *b = dp_map_get(&u->blobs, blob_id, id_len);
    if (b == NULL && dp_map_get(&u->superseded, blob_id, id_len) != NULL) {
        *state = DP_WIRE_COMMIT_DONE; /* landed, and replaced before its spill ended */
        goto out;
    }
    if (b == NULL || b->abort_req != 0) {
        *state = DP_WIRE_COMMIT_LOST;
        goto out;
    }
    if (b->published) {
        *state = DP_WIRE_COMMIT_DONE;
        goto out;
    }
    if (b->job) { /* its spill runs */
        *state = DP_WIRE_COMMIT_PENDING;
        goto out;
    }
    if (b->parsed == NULL) {
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
        const dp_blob_header *h = dp_blob_get_header(pb);
        if (h->alloc_incarnation != u->incarnation || h->alloc_token != b->token) {
            u->n_proto++;
            u->n_identity_refused++;
            rc = dp_fail(
                d, DP_EPROTO,
                "commit %s: the blob names allocation %016" PRIx64 "/%" PRIu64
                ", not this one (%016" PRIx64 "/%" PRIu64
                "): stale bytes of an earlier put, or a blob written for another "
                "unit process; nothing published",
                b->id, h->alloc_incarnation, h->alloc_token, u->incarnation, b->token);
            goto out;
        }
        uint32_t n = dp_blob_count(pb);
        if (b->n_entries_decl != 0 && n != b->n_entries_decl) {
            u->n_proto++;
            rc = dp_fail(d, DP_EPROTO,
                         "commit %s: the blob's index has %u entries, alloc announced "
                         "%" PRIu64,
                         b->id, n, b->n_entries_decl);
            goto out;
        }
        b->parsed = pb;
        pb = NULL;
        /* Validated: the client's WRITE is done, nothing of the writer's runs. */
        dp__writers_unref(u->writers, b->writer);
        b->writer = NULL;
    }
    /* Commits are ordered here, when the index validated: a spill published
     * later by its io job never overrides what a later commit or release did. */
    if (b->commit_seq == 0)
        b->commit_seq = ++u->commit_seq;
    if (b->in_io) {
        /* A spill: an io job writes it to a file, then publishes it. */
        if (!jobs_full_locked(u)) {
            pend_unlink(u, b); /* no lease: the client's WRITE is done */
            submit_locked(u, JOB_SPILL, b);
        }
        *state = DP_WIRE_COMMIT_PENDING;
        goto out;
    }
    rc = publish_locked(u, b, NULL, now, d);
    if (rc != 0) {
        dp_blob_destroy(b->parsed);
        b->parsed = NULL;
        goto out;
    }
    *state = DP_WIRE_COMMIT_DONE;
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
    if (b != NULL && !b->published && b->abort_req == 0) {
        u->n_abort++;
        if (b->job) {
            /* Its spill runs: the job's end drops it instead of publishing. */
            b->abort_req = in_flight ? 2 : 1;
        } else if (in_flight) {
            retire_locked(u, b);
        } else {
            dp_map_del(&u->blobs, b->id, b->id_len);
            pend_unlink(u, b);
            region_release_locked(u, b, now_s(u));
            rec_free(u, b);
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
    res->pending = calloc(cap, sizeof *res->pending);
    res->failed = calloc(cap, sizeof *res->failed);
    blob_rec **pinned = calloc(cap, sizeof *pinned);
    uint32_t np = 0;
    if (res->blobs == NULL || res->missing == NULL || res->pending == NULL ||
        res->failed == NULL || pinned == NULL) {
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
        int st = resolve_state_locked(u, b, epoch, now);
        if (st == RES_PENDING) {
            res->pending[res->n_pending++] = ids[i];
            continue;
        }
        if (st == RES_FAILED) {
            res->failed[res->n_failed++] = ids[i];
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
    free(res->pending);
    free(res->failed);
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
    res->pending = calloc(cap, sizeof *res->pending);
    res->failed = calloc(cap, sizeof *res->failed);
    blob_rec **pinned = calloc(cap, sizeof *pinned);
    uint32_t np = 0;
    int rc;
    if (res->entries == NULL || res->missing == NULL || res->pending == NULL ||
        res->failed == NULL || pinned == NULL) {
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
        slot *s = row_slot(r, kp.field, (uint32_t)kp.field_len);
        if (s == NULL) {
            res->missing[res->n_missing++] = keys[i];
            continue;
        }
        blob_rec *b = s->b;
        int st = resolve_state_locked(u, b, epoch, now);
        if (st == RES_PENDING) {
            res->pending[res->n_pending++] = keys[i];
            continue;
        }
        if (st == RES_FAILED) {
            res->failed[res->n_failed++] = keys[i];
            continue;
        }
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
    free(res->pending);
    free(res->failed);
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

/*
 * A release reaches spills committed but not yet published too: their entries
 * for those rows are marked so the io job's end does not bring them back.
 * Walks the blob table (SSD tier only); a spill's entries are looked up in a
 * set of the released rows.
 */
static void
release_spills_locked(dp_unit *u, const uint64_t *gidxs, uint32_t n)
{
    dp_map set;
    dp_map_init_u64(&set);
    bool built = false;
    size_t it = 0;
    void *v;
    while (dp_map_next(&u->blobs, &it, NULL, NULL, NULL, &v)) {
        blob_rec *b = v;
        if (b->published || b->parsed == NULL || !b->in_io || b->commit_seq == 0)
            continue;
        if (!built) {
            for (uint32_t i = 0; i < n; i++)
                if (dp_map_put_u64(&set, gidxs[i], &set, NULL) != 0) {
                    /* Out of memory: mark nothing rather than guess. */
                    DP_LOG_W("unit %u: release of %u rows: no memory to mark pending "
                             "spills; a spill finishing later may bring rows back",
                             u->o.unit_id, n);
                    dp_map_fini(&set);
                    return;
                }
            built = true;
        }
        uint32_t ne = dp_blob_count(b->parsed);
        for (uint32_t i = 0; i < ne; i++) {
            const dp_blob_entry *e = dp_blob_entry_at(b->parsed, i);
            if (dp_map_get_u64(&set, e->gidx) == NULL)
                continue;
            if (b->spill_keep == NULL) {
                b->spill_keep = malloc(ne);
                if (b->spill_keep == NULL)
                    break;
                memset(b->spill_keep, 1, ne);
            }
            b->spill_keep[i] = 0;
        }
    }
    dp_map_fini(&set);
}

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
        for (uint32_t k = 0; k < r->n; k++) {
            unref_locked(u, r->s[k].b, now);
            dropped++;
        }
        row_free(r);
    }
    if (u->io_alloc != NULL)
        release_spills_locked(u, gidxs, n);
    u->n_entries -= dropped;
    u->n_release++;
    if (dropped > 0)
        u->n_clears++;
    pthread_mutex_unlock(&u->mu);
    return dropped;
}

/* ---- admin ---- */

#define SCAN_FIELDS 12

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
        x[9] = (dp_wire_field){zview("in_slab"),
                               DP_WIRE_BOOL,
                               {.b = b->has_region && !b->in_io && !b->disk}};
        x[10] = (dp_wire_field){zview("disk"), DP_WIRE_BOOL, {.b = b->disk}};
        x[11] = (dp_wire_field){zview("staged"), DP_WIRE_BOOL, {.b = b->staged}};
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
    dp__writers_stats ws;
    dp__writers_get_stats(u->writers, &ws);
    st->retired_bytes = ws.retired_bytes;
    st->n_retired = ws.retired;
    st->retired_kept_bytes = ws.retired_kept_bytes;
    st->reclaimed_bytes = ws.reclaimed_bytes;
    st->n_reclaimed = ws.reclaimed;
    st->writers = ws.writers;
    st->writers_gone = ws.writers_gone;
    st->allocs_reclaimed = u->n_allocs_reclaimed;
    st->allocs_reclaimed_bytes = u->allocs_reclaimed_bytes;
    st->identity_refused = u->n_identity_refused;
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
    if (u->io_alloc != NULL) {
        dp_slab_alloc_get_stats(u->io_alloc, &as);
        st->io_allocated_bytes = as.allocated_bytes;
        st->io_free_bytes = as.free_bytes;
        st->io_quarantined_bytes = as.quarantined_bytes;
    }
    st->disk_blobs = u->n_disk;
    st->disk_bytes = u->disk_bytes;
    st->staged_blobs = u->n_staged;
    st->staged_bytes = u->staged_bytes;
    st->io_jobs = u->q_n + u->n_running;
    st->spills = u->n_spills;
    st->spill_bytes = u->spill_bytes;
    st->spills_failed = u->n_spills_failed;
    st->spills_superseded = u->n_spills_superseded;
    st->saves = u->n_saves;
    st->loads = u->n_loads;
    st->loaded_blobs = u->n_loaded_blobs;
    st->admin_running = u->n_admin;
    st->stages = u->n_stages;
    st->stage_bytes = u->stage_bytes;
    st->stages_failed = u->n_stages_failed;
    st->evictions = u->n_evictions;
    st->files_open = u->files_open;
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
    enum { N = 59 };
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
    f[k++] = fu64("retired_kept_bytes", s.retired_kept_bytes);
    f[k++] = fu64("reclaimed_bytes", s.reclaimed_bytes);
    f[k++] = fu64("reclaimed", s.n_reclaimed);
    f[k++] = fu64("allocs_reclaimed", s.allocs_reclaimed);
    f[k++] = fu64("allocs_reclaimed_bytes", s.allocs_reclaimed_bytes);
    f[k++] = fu64("writers", s.writers);
    f[k++] = fu64("writers_gone", s.writers_gone);
    f[k++] = fu64("identity_refused", s.identity_refused);
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
    f[k++] = fu64("io_bytes", dp_unit_io_bytes(u));
    f[k++] = fu64("io_allocated_bytes", s.io_allocated_bytes);
    f[k++] = fu64("io_free_bytes", s.io_free_bytes);
    f[k++] = fu64("io_quarantined_bytes", s.io_quarantined_bytes);
    f[k++] = fu64("io_jobs", s.io_jobs);
    f[k++] = fu64("disk_blobs", s.disk_blobs);
    f[k++] = fu64("disk_bytes", s.disk_bytes);
    f[k++] = fu64("staged_blobs", s.staged_blobs);
    f[k++] = fu64("staged_bytes", s.staged_bytes);
    f[k++] = fu64("spills", s.spills);
    f[k++] = fu64("spill_bytes", s.spill_bytes);
    f[k++] = fu64("spills_failed", s.spills_failed);
    f[k++] = fu64("spills_superseded", s.spills_superseded);
    f[k++] = fu64("stages", s.stages);
    f[k++] = fu64("stage_bytes", s.stage_bytes);
    f[k++] = fu64("stages_failed", s.stages_failed);
    f[k++] = fu64("evictions", s.evictions);
    f[k++] = fu64("files_open", s.files_open);
    f[k++] = fu64("io_zombie_bytes", u->io_zombie_bytes);
    f[k++] = fu64("saves", s.saves);
    f[k++] = fu64("loads", s.loads);
    f[k++] = fu64("loaded_blobs", s.loaded_blobs);
    f[k++] = fu64("saves_loads_running", s.admin_running);
    DP_ASSERT(k == N);
    fields->v = f;
    fields->n = k;
    return 0;
}

int
dp_unit_read_bytes_locked(dp_unit *u, uint64_t off, uint64_t nbytes, const uint8_t **p,
                          dp_detail *d)
{
    bool in_put = off <= u->o.slab_bytes && nbytes <= u->o.slab_bytes - off;
    bool in_io = u->ssd && off >= u->io_base && off - u->io_base <= u->o.staging_bytes &&
                 nbytes <= u->o.staging_bytes - (off - u->io_base);
    if (!in_put && !in_io)
        return dp_fail(d, DP_EPROTO,
                       "read_bytes: [%" PRIu64 ", +%" PRIu64 ") is outside the %" PRIu64
                       "-byte slab and the %" PRIu64 "-byte IO area at %" PRIu64,
                       off, nbytes, u->o.slab_bytes, dp_unit_io_bytes(u), u->io_base);
    *p = u->slab + off;
    return 0;
}

/* ---- maintenance ---- */

/* dp__writers_give_fn: a retired region whose writer is gone comes back. */
static void
give_back_region(void *ctx, int area, uint64_t off, uint64_t size)
{
    dp_unit *u = ctx;
    dp_slab_alloc *a = area == DP__AREA_IO ? u->io_alloc : u->alloc;
    uint64_t ao = area == DP__AREA_IO ? off - u->io_base : off;
    dp_detail d;
    dp_detail_clear(&d);
    if (a == NULL || dp_slab_alloc_free(a, ao, &d) != 0)
        DP_LOG_E("unit %u: retired region at %" PRIu64 " (%" PRIu64
                 " bytes) could not be handed back: %s",
                 u->o.unit_id, off, size, dp_detail_msg(&d));
}

/*
 * Writers that are gone (see writers.h): their retired regions come back,
 * and so do their open allocations (nothing will WRITE or commit them).
 */
static void
reclaim_locked(dp_unit *u, double now)
{
    dp__writers_reclaim(u->writers, now, give_back_region, u);
    if (u->o.reclaim_grace_s < 0)
        return;
    for (blob_rec *b = u->pend_head, *next; b != NULL; b = next) {
        next = b->pnext;
        if (b->parsed != NULL || b->job || b->abort_req != 0 ||
            !dp__writer_gone(b->writer, now - u->o.reclaim_grace_s))
            continue;
        DP_LOG_I("unit %u: blob %s (%" PRIu64 " bytes) was never committed and its "
                 "writer %s is gone: region freed",
                 u->o.unit_id, b->id, b->size, dp__writer_name(b->writer));
        u->n_allocs_reclaimed++;
        u->allocs_reclaimed_bytes += b->size;
        dp_map_del(&u->blobs, b->id, b->id_len);
        pend_unlink(u, b);
        region_release_locked(u, b, now);
        rec_free(u, b);
    }
}

void
dp_unit_tick(dp_unit *u)
{
    pthread_mutex_lock(&u->mu);
    double now = now_s(u);
    u->n_ticks++;
    while (u->pin_head != NULL && u->pin_head->expiry <= now)
        pin_end_locked(u, u->pin_head, true, now);
    /*
     * Spills whose commit validated while the io queue was full wait on the
     * pend list: queue them as slots free. Their WRITE is done, so the lease
     * below never retires them.
     */
    for (blob_rec *b = u->pend_head, *next; b != NULL && !jobs_full_locked(u); b = next) {
        next = b->pnext;
        if (b->parsed != NULL && b->in_io && !b->job && b->abort_req == 0) {
            pend_unlink(u, b);
            submit_locked(u, JOB_SPILL, b);
        }
    }
    if (u->o.alloc_lease_s > 0) {
        for (blob_rec *b = u->pend_head, *next;
             b != NULL && now - b->created_at >= u->o.alloc_lease_s; b = next) {
            next = b->pnext;
            if (b->parsed != NULL && b->in_io)
                continue; /* a validated spill waiting for the io queue */
            DP_LOG_W("unit %u: blob %s not committed within %.1f s: region of %" PRIu64
                     " bytes retired",
                     u->o.unit_id, b->id, u->o.alloc_lease_s, b->size);
            u->leases_expired++;
            retire_locked(u, b);
        }
    }
    reclaim_locked(u, now);
    dp_slab_alloc_sweep(u->alloc, now);
    if (u->io_alloc != NULL)
        dp_slab_alloc_sweep(u->io_alloc, now);
    superseded_expire_locked(u, now);
    /* Every 30 s, one log line with the counters if anything changed. */
    char line[320], ssd_line[400];
    line[0] = '\0';
    ssd_line[0] = '\0';
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
        uint64_t ssig = st.spills * 1000003u ^ st.stages * 10007u ^ st.evictions * 101u ^
                        st.spills_failed * 7u ^ st.stages_failed * 31u ^ st.disk_blobs;
        if (u->ssd && ssig != u->ssd_report_sig) {
            char a[32], b[32], c[32], e[32];
            snprintf(ssd_line, sizeof ssd_line,
                     "unit %u ssd: %" PRIu64 " spills (%s), %" PRIu64 " failed; %" PRIu64
                     " stages (%s), %" PRIu64 " failed; %" PRIu64 " evictions; %" PRIu64
                     " disk blobs (%s), %" PRIu64 " staged (%s), %" PRIu64 " io jobs",
                     u->o.unit_id, st.spills, dp_fmt_size(st.spill_bytes, a, sizeof a),
                     st.spills_failed, st.stages,
                     dp_fmt_size(st.stage_bytes, b, sizeof b), st.stages_failed,
                     st.evictions, st.disk_blobs, dp_fmt_size(st.disk_bytes, c, sizeof c),
                     st.staged_blobs, dp_fmt_size(st.staged_bytes, e, sizeof e),
                     st.io_jobs);
            u->ssd_report_sig = ssig;
        }
        u->last_report = now;
    }
    pthread_mutex_unlock(&u->mu);
    if (line[0] != '\0')
        DP_LOG_I("%s", line);
    if (ssd_line[0] != '\0')
        DP_LOG_I("%s", ssd_line);
}

/* ---- self-check ---- */

/* SSD-tier consistency: disk blobs, staged copies and their counters. */
static int
check_ssd_locked(dp_unit *u, dp_detail *d)
{
    uint64_t ns = 0, sb = 0, ndisk = 0, dbytes = 0;
    for (blob_rec *b = u->st_head; b != NULL; b = b->snext) {
        ns++;
        sb += b->size;
        if (!b->staged || !b->disk || !b->has_region || !b->in_io || b->job)
            return dp_fail(d, DP_ECORRUPT, "staged list: blob %s in a wrong state",
                           b->id);
        if (b->snext == NULL && u->st_tail != b)
            return dp_fail(d, DP_ECORRUPT, "staged list tail");
    }
    if (ns != u->n_staged || sb != u->staged_bytes)
        return dp_fail(d, DP_ECORRUPT,
                       "staged %" PRIu64 "/%" PRIu64 " blobs, %" PRIu64 "/%" PRIu64
                       " bytes",
                       ns, u->n_staged, sb, u->staged_bytes);
    size_t it = 0;
    void *v;
    while (dp_map_next(&u->blobs, &it, NULL, NULL, NULL, &v)) {
        blob_rec *b = v;
        if (b->disk) {
            ndisk++;
            dbytes += b->nbytes;
            if (!b->published || b->fd < 0)
                return dp_fail(d, DP_ECORRUPT, "disk blob %s: published %d, fd %d", b->id,
                               b->published, b->fd);
            if (b->has_region && !b->in_io)
                return dp_fail(d, DP_ECORRUPT, "disk blob %s holds a put-area region",
                               b->id);
            if (b->has_region && !b->staged && !b->job)
                return dp_fail(d, DP_ECORRUPT, "disk blob %s holds an idle region",
                               b->id);
        } else if (!b->has_region) {
            return dp_fail(d, DP_ECORRUPT, "blob %s has no region and no file", b->id);
        }
        if (b->in_io && !u->ssd)
            return dp_fail(d, DP_ECORRUPT, "blob %s in an IO area that does not exist",
                           b->id);
    }
    /* Zombies and doomed records are counted until their file closes. */
    if (ndisk > u->n_disk || dbytes > u->disk_bytes)
        return dp_fail(d, DP_ECORRUPT, "disk blobs %" PRIu64 " > counter %" PRIu64, ndisk,
                       u->n_disk);
    if (u->q_n + u->n_running > DP_UNIT_MAX_IO_JOBS)
        return dp_fail(d, DP_ECORRUPT, "io jobs over the limit");
    return 0;
}

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
        if (r->n == 0) {
            rc = dp_fail(d, DP_ECORRUPT, "row %" PRIu64 " is empty", g);
            goto out;
        }
        if (r->gidx != g || r->n > r->cap || (r->cap == ROW_INLINE) != (r->s == r->inl)) {
            rc = dp_fail(d, DP_ECORRUPT, "row %" PRIu64 ": bad header", g);
            goto out;
        }
        for (uint32_t k = 0; k < r->n; k++) {
            const slot *s = &r->s[k];
            if (s->b == NULL || !s->b->published || s->b->dead) {
                rc = dp_fail(d, DP_ECORRUPT, "row %" PRIu64 " points at a dead blob", g);
                goto out;
            }
            const dp_blob_entry *e = dp_blob_entry_at(s->b->parsed, s->i);
            if (e->gidx != g || s->field != e->field || s->flen != e->field_len ||
                s->hash != field_hash(s->field, s->flen) ||
                row_find(r, s->field, s->flen, s->hash) != (int32_t)k) {
                rc = dp_fail(d, DP_ECORRUPT,
                             "row %" PRIu64 " slot %u does not match its blob entry", g,
                             k);
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
                if (!p->blobs[i]->in_io)
                    zb += p->blobs[i]->size;
            }
        }
    }
    /* Holds of running saves keep released records alive like pins. */
    dp_map hc;
    dp_map_init_u64(&hc);
    for (struct hold_set *h = u->holds; h != NULL; h = h->next) {
        for (uint32_t i = 0; i < h->n; i++) {
            blob_rec *b = h->b[i];
            uintptr_t key = (uintptr_t)b;
            uintptr_t c = (uintptr_t)dp_map_get_u64(&hc, key);
            dp_map_put_u64(&hc, key, (void *)(c + 1), NULL);
            if (c == 0 && b->dead && dp_map_get_u64(&counts, key) == NULL) {
                nz++;
                if (!b->in_io)
                    zb += b->size;
            }
        }
    }
    it = 0;
    uint64_t hkey;
    while (rc == 0 && dp_map_next(&hc, &it, NULL, NULL, &hkey, &v)) {
        blob_rec *b = (blob_rec *)(uintptr_t)hkey;
        if (b->n_holds != (uint64_t)(uintptr_t)v)
            rc = dp_fail(d, DP_ECORRUPT, "blob %s: n_holds %u, holds %" PRIu64, b->id,
                         b->n_holds, (uint64_t)(uintptr_t)v);
    }
    dp_map_fini(&hc);
    if (rc != 0)
        goto out;
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
    if (rc == 0 && u->io_alloc != NULL)
        rc = dp_slab_alloc_check(u->io_alloc, d);
    if (rc == 0)
        rc = check_ssd_locked(u, d);
out:
    pthread_mutex_unlock(&u->mu);
    dp_map_fini(&counts);
    return rc;
}

/* ---- checkpoints: save_shard / load_shard (DESIGN section 9) ---- */

/*
 * The shard and rows files: layout in blob/shard.h (the rows-file parser is
 * shared with a client that re-homes a checkpoint).
 */

#define CK_CHUNK ((size_t)1 << 20)
#define CK_ROWS_MAX ((uint64_t)1 << 32)

static void
put_u32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void
put_u64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t
get_u32(const uint8_t *p)
{
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

static uint64_t
get_u64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

/* Copy a client path into buf (NUL-terminated) if it passes the rules. */
static int
ck_path(const char *p, size_t n, char *buf, const char *op, dp_detail *d)
{
    if (n < 2 || n > DP_UNIT_PATH_MAX || p[0] != '/')
        return dp_fail(d, DP_EINVAL, "%s: path must be absolute and 2..%d bytes long", op,
                       DP_UNIT_PATH_MAX);
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)p[i] < 0x20 || p[i] == 0x7f)
            return dp_fail(d, DP_EINVAL,
                           "%s: path has a NUL or control character at byte %zu", op, i);
    memcpy(buf, p, n);
    buf[n] = '\0';
    return 0;
}

/* dst = base + suffix; dst has DP_UNIT_PATH_MAX + 16 bytes, base passed ck_path. */
static void
ck_name(char *dst, const char *base, const char *suffix)
{
    size_t n = strlen(base), m = strlen(suffix);
    DP_ASSERT(n <= DP_UNIT_PATH_MAX && m < 16);
    memcpy(dst, base, n);
    memcpy(dst + n, suffix, m + 1);
}

/* Sequential writer with a running CRC32C of what it wrote. */
typedef struct ck_out {
    int fd;
    uint64_t pos;
    uint32_t crc;
    const char *name;
} ck_out;

static int
ck_write(ck_out *o, const void *pv, size_t n, dp_detail *d)
{
    const uint8_t *p = pv;
    o->crc = dp_crc32c_update(o->crc, p, n);
    while (n > 0) {
        ssize_t w = write(o->fd, p, DP_MIN(n, (size_t)1 << 30));
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return dp_fail_sys(d, w < 0 ? errno : EIO, "writing %s at offset %" PRIu64,
                               o->name, o->pos);
        p += w;
        n -= (size_t)w;
        o->pos += (uint64_t)w;
    }
    return 0;
}

/* pread exactly n bytes at off; a short file is DP_ECORRUPT naming the offset. */
static int
ck_pread(int fd, void *pv, size_t n, uint64_t off, const char *name, dp_detail *d)
{
    uint8_t *p = pv;
    while (n > 0) {
        ssize_t r = pread(fd, p, DP_MIN(n, (size_t)1 << 30), (off_t)off);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return dp_fail_sys(d, errno, "reading %s at offset %" PRIu64, name, off);
        if (r == 0)
            return dp_fail(d, DP_ECORRUPT, "%s: truncated: ends at offset %" PRIu64, name,
                           off);
        p += r;
        n -= (size_t)r;
        off += (uint64_t)r;
    }
    return 0;
}

static int
ck_create_tmp(const char *tmp, int *fd, dp_detail *d)
{
    *fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (*fd < 0 && errno == EEXIST)
        return dp_fail(d, DP_EEXIST,
                       "creating %s: it exists (a save that died?); not overwritten",
                       tmp);
    if (*fd < 0)
        return dp_fail_sys(d, errno, "creating %s", tmp);
    return 0;
}

/* fsync, close and rename tmp to final; the fd is closed either way. */
static int
ck_finish(int fd, const char *tmp, const char *final, dp_detail *d)
{
    int rc = 0;
    if (fsync(fd) != 0)
        rc = dp_fail_sys(d, errno, "fsync of %s", tmp);
    if (close(fd) != 0 && rc == 0)
        rc = dp_fail_sys(d, errno, "closing %s", tmp);
    /* Never replaces a file: a save writes only names that did not exist. */
    if (rc == 0 && renameat2(AT_FDCWD, tmp, AT_FDCWD, final, RENAME_NOREPLACE) != 0)
        rc = errno == EEXIST ? dp_fail(d, DP_EEXIST,
                                       "renaming %s: %s exists; not replaced", tmp, final)
                             : dp_fail_sys(d, errno, "renaming %s to %s", tmp, final);
    return rc;
}

typedef struct ck_snap {
    blob_rec *b;
    uint64_t nbytes;
    uint64_t refs;
    const uint8_t *src; /* put-area copy, or NULL */
    int fd;             /* dup of a disk blob's fd, or -1 */
    uint32_t *live;
    uint32_t n_live;
} ck_snap;

/* Drop the holds of a save (its blobs may be freed now). */
static void
holds_release_locked(dp_unit *u, hold_set *h)
{
    for (hold_set **pp = &u->holds; *pp != NULL; pp = &(*pp)->next) {
        if (*pp == h) {
            *pp = h->next;
            break;
        }
    }
    double now = now_s(u);
    for (uint32_t i = 0; i < h->n; i++) {
        blob_rec *b = h->b[i];
        DP_ASSERT(b->n_holds > 0);
        b->n_holds--;
        if (b->dead && b->n_pins == 0 && b->n_holds == 0) {
            zombie_count_locked(u, b, -1);
            drop_locked(u, b, now);
        }
    }
    h->n = 0;
}

/* Snapshot the live blobs and hold them. Nothing held on error. */
static int
snapshot_locked(dp_unit *u, hold_set *h, ck_snap **out, uint32_t *n_out, dp_detail *d)
{
    int rc = DP_ENOMEM;
    uint64_t cap = u->n_published;
    ck_snap *sn = calloc(cap ? cap : 1, sizeof *sn);
    h->b = calloc(cap ? cap : 1, sizeof *h->b);
    h->n = 0;
    if (sn == NULL || h->b == NULL)
        goto nomem;
    size_t it = 0;
    void *v;
    uint32_t n = 0;
    while (dp_map_next(&u->blobs, &it, NULL, NULL, NULL, &v)) {
        blob_rec *b = v;
        if (!b->published || b->dead)
            continue;
        DP_ASSERT(n < cap);
        ck_snap *s = &sn[n];
        s->fd = -1;
        uint32_t ne = dp_blob_count(b->parsed);
        s->live = malloc((ne ? ne : 1) * sizeof *s->live);
        if (s->live == NULL)
            goto nomem;
        for (uint32_t i = 0; i < ne; i++) {
            const dp_blob_entry *e = dp_blob_entry_at(b->parsed, i);
            row *r = dp_map_get_u64(&u->rows, e->gidx);
            slot *sl = row_slot(r, e->field, (uint32_t)e->field_len);
            if (sl != NULL && sl->b == b && sl->i == i)
                s->live[s->n_live++] = i;
        }
        if (b->disk) {
            s->fd = fcntl(b->fd, F_DUPFD_CLOEXEC, 0);
            if (s->fd < 0) {
                int e = errno;
                free(s->live);
                s->live = NULL;
                for (uint32_t j = 0; j < n; j++)
                    if (sn[j].fd >= 0)
                        close(sn[j].fd);
                rc = dp_fail_sys(d, e, "save: dup of the file of disk blob %s", b->id);
                goto undo;
            }
        } else {
            s->src = u->slab + b->off;
        }
        s->b = b;
        s->nbytes = b->nbytes;
        s->refs = b->refs;
        n++;
    }
    for (uint32_t i = 0; i < n; i++) {
        sn[i].b->n_holds++;
        h->b[h->n++] = sn[i].b;
    }
    h->next = u->holds;
    u->holds = h;
    *out = sn;
    *n_out = n;
    return 0;
nomem:
    dp_fail(d, DP_ENOMEM, "save: out of memory");
    if (sn != NULL)
        for (uint64_t j = 0; j < cap; j++)
            if (sn[j].fd >= 0 && sn[j].b != NULL)
                close(sn[j].fd);
undo:
    if (sn != NULL)
        for (uint64_t j = 0; j < cap; j++)
            free(sn[j].live);
    free(sn);
    free(h->b);
    h->b = NULL;
    return rc;
}

void
dp_unit_save_res_fini(dp_unit_save_res *res)
{
    if (res == NULL)
        return;
    free(res->blobs);
    free(res->ids);
    memset(res, 0, sizeof *res);
}

int
dp_unit_save_shard(dp_unit *u, const char *path, size_t path_len, dp_unit_save_res *res,
                   dp_detail *d)
{
    memset(res, 0, sizeof *res);
    char fin[DP_UNIT_PATH_MAX + 16], tmp[DP_UNIT_PATH_MAX + 16];
    char rfin[DP_UNIT_PATH_MAX + 16], rtmp[DP_UNIT_PATH_MAX + 16];
    int rc = ck_path(path, path_len, fin, "save_shard", d);
    if (rc != 0)
        return rc;
    ck_name(tmp, fin, ".tmp");
    ck_name(rfin, fin, ".rows");
    ck_name(rtmp, fin, ".rows.tmp");

    hold_set h = {0};
    ck_snap *sn = NULL;
    uint32_t n = 0;
    uint8_t *buf = NULL;
    int fd = -1, rfd = -1;
    bool tmp_made = false, rtmp_made = false;
    pthread_mutex_lock(&u->mu);
    rc = snapshot_locked(u, &h, &sn, &n, d);
    uint64_t clears0 = u->n_clears;
    uint32_t unit_id = u->o.unit_id, n_units = u->o.n_units;
    pthread_mutex_unlock(&u->mu);
    if (rc != 0)
        return rc;

    /* File I/O without the lock: the holds keep every snapshotted copy. */
    res->blobs = calloc(n ? n : 1, sizeof *res->blobs);
    res->ids = calloc(n ? n : 1, sizeof *res->ids);
    buf = malloc(CK_CHUNK);
    if (res->blobs == NULL || res->ids == NULL || buf == NULL) {
        rc = dp_fail(d, DP_ENOMEM, "save: out of memory");
        goto out;
    }
    if ((rc = ck_create_tmp(tmp, &fd, d)) != 0)
        goto out;
    tmp_made = true;
    if ((rc = ck_create_tmp(rtmp, &rfd, d)) != 0)
        goto out;
    rtmp_made = true;
    uint64_t data_bytes = 0;
    for (uint32_t i = 0; i < n; i++)
        data_bytes += sn[i].nbytes;
    uint8_t hdr[DP_SHARD_HEADER_LEN];
    memcpy(hdr, DP_SHARD_MAGIC, 8);
    put_u32(hdr + 8, DP_SHARD_VERSION);
    put_u32(hdr + 12, unit_id);
    put_u32(hdr + 16, n_units);
    put_u32(hdr + 20, n);
    put_u64(hdr + 24, data_bytes);
    ck_out so = {fd, 0, 0, tmp};
    ck_out ro = {rfd, 0, 0, rtmp};
    if ((rc = ck_write(&so, hdr, sizeof hdr, d)) != 0)
        goto out;
    uint8_t rh[24];
    memcpy(rh, DP_ROWS_MAGIC, 8);
    put_u32(rh + 8, DP_SHARD_VERSION);
    put_u32(rh + 12, unit_id);
    put_u32(rh + 16, n_units);
    put_u32(rh + 20, n);
    if ((rc = ck_write(&ro, rh, sizeof rh, d)) != 0)
        goto out;
    uint32_t data_crc = 0;
    for (uint32_t i = 0; i < n; i++) {
        ck_snap *s = &sn[i];
        uint64_t off = so.pos;
        uint32_t bcrc = 0;
        if ((rc = admin_cancelled(u, "save", d)) != 0)
            goto out;
        if (s->src != NULL) {
            bcrc = dp_crc32c(s->src, (size_t)s->nbytes);
            rc = ck_write(&so, s->src, (size_t)s->nbytes, d);
        } else {
            for (uint64_t done = 0; rc == 0 && done < s->nbytes;) {
                size_t c = (size_t)DP_MIN(s->nbytes - done, (uint64_t)CK_CHUNK);
                rc = ck_pread(s->fd, buf, c, done, "a disk blob's file", d);
                if (rc == 0) {
                    bcrc = dp_crc32c_update(bcrc, buf, c);
                    rc = ck_write(&so, buf, c, d);
                }
                done += c;
            }
        }
        if (rc != 0) {
            dp_fail_ctx(d, rc, "save: blob %s", s->b->id);
            goto out;
        }
        data_crc = dp_crc32c_combine(data_crc, bcrc, s->nbytes);
        memcpy(res->ids[i], s->b->id, s->b->id_len + 1);
        res->blobs[i] =
            (dp_wire_shard_blob){{res->ids[i], s->b->id_len}, off, s->nbytes, s->refs};
        uint8_t rb[1 + DP_UNIT_ID_MAX + 24];
        rb[0] = (uint8_t)s->b->id_len;
        memcpy(rb + 1, s->b->id, s->b->id_len);
        uint8_t *q = rb + 1 + s->b->id_len;
        put_u64(q, off);
        put_u64(q + 8, s->nbytes);
        put_u32(q + 16, bcrc);
        put_u32(q + 20, s->n_live);
        if ((rc = ck_write(&ro, rb, (size_t)(q + 24 - rb), d)) != 0)
            goto out;
        for (uint32_t k = 0; k < s->n_live; k++) {
            uint8_t e4[4];
            put_u32(e4, s->live[k]);
            if ((rc = ck_write(&ro, e4, 4, d)) != 0)
                goto out;
        }
    }
    uint8_t tr[DP_SHARD_TRAILER_LEN];
    memcpy(tr, DP_SHARD_END_MAGIC, 8);
    put_u64(tr + 8, data_bytes);
    put_u32(tr + 16, data_crc);
    put_u32(tr + 20, dp_crc32c(hdr, sizeof hdr));
    if ((rc = ck_write(&so, tr, sizeof tr, d)) != 0)
        goto out;
    uint8_t rt[12];
    put_u32(rt, ro.crc);
    memcpy(rt + 4, DP_ROWS_END_MAGIC, 8);
    if ((rc = ck_write(&ro, rt, sizeof rt, d)) != 0)
        goto out;
    res->nbytes = so.pos;
    res->shard_crc = so.crc;
    res->rows_crc = ro.crc;
    res->n_blobs = n;
    /* Rows first: a shard name never exists without its rows file. */
    rc = ck_finish(rfd, rtmp, rfin, d);
    rfd = -1;
    if (rc != 0)
        goto out;
    rtmp_made = false;
    rc = ck_finish(fd, tmp, fin, d);
    fd = -1;
    if (rc != 0) {
        unlink(rfin);
        goto out;
    }
    tmp_made = false;
out:
    if (fd >= 0)
        close(fd);
    if (rfd >= 0)
        close(rfd);
    if (tmp_made)
        unlink(tmp);
    if (rtmp_made)
        unlink(rtmp);
    free(buf);
    for (uint32_t i = 0; i < n; i++) {
        if (sn[i].fd >= 0)
            close(sn[i].fd);
        free(sn[i].live);
    }
    free(sn);
    pthread_mutex_lock(&u->mu);
    holds_release_locked(u, &h);
    res->clears_during_save = u->n_clears - clears0;
    if (rc == 0)
        u->n_saves++;
    pthread_mutex_unlock(&u->mu);
    free(h.b);
    if (rc != 0)
        dp_unit_save_res_fini(res);
    return rc;
}

/* One blob of the rows file. */
typedef dp_shard_row ck_row;

enum { LB_FAILED = 0, LB_PRESENT, LB_REGION, LB_DISK };

typedef struct ck_lb {
    const dp_wire_shard_blob *w;
    const ck_row *r;
    int state;
    uint64_t off, size; /* LB_REGION */
    uint8_t *buf;       /* LB_DISK: the bytes, until written to the spill file */
    int fd;             /* LB_DISK */
    dp_blob *parsed;
    uint8_t *keep;
} ck_lb;

static int
lb_cmp(const void *a, const void *b)
{
    const ck_lb *x = *(ck_lb *const *)a, *y = *(ck_lb *const *)b;
    return x->r->off < y->r->off ? -1 : x->r->off > y->r->off;
}

/*
 * Open a checkpoint file for reading: a regular file only (a FIFO or device
 * named by the control plane must not block or feed the ctl thread forever).
 */
static int
ck_open_regular(const char *name, int *out, dp_detail *d)
{
    int fd = open(name, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return dp_fail_sys(d, errno, "opening %s", name);
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return dp_fail_sys(d, e, "stat of %s", name);
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return dp_fail(d, DP_EINVAL, "%s is not a regular file", name);
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0)
        fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    *out = fd;
    return DP_OK;
}

/* Read and check path.rows; rows[] point into *buf. */
static int
ck_read_rows(const char *name, uint32_t unit_id, uint32_t n_units, uint8_t **buf,
             ck_row **rows, uint32_t *n_rows, dp_detail *d)
{
    *buf = NULL;
    *rows = NULL;
    int fd = -1;
    int rc = ck_open_regular(name, &fd, d);
    if (rc != 0)
        return rc;
    struct stat st;
    if (fstat(fd, &st) != 0) {
        rc = dp_fail_sys(d, errno, "stat of %s", name);
        goto out;
    }
    uint64_t len = (uint64_t)st.st_size;
    if (len < 36 || len > CK_ROWS_MAX) {
        rc = dp_fail(d, DP_ECORRUPT, "%s: %" PRIu64 " bytes: not a rows file (offset 0)",
                     name, len);
        goto out;
    }
    uint8_t *p = malloc((size_t)len);
    if (p == NULL) {
        rc = dp_fail(d, DP_ENOMEM, "load: out of memory for %s", name);
        goto out;
    }
    *buf = p;
    if ((rc = ck_pread(fd, p, (size_t)len, 0, name, d)) != 0)
        goto out;
    dp_shard_rows sr;
    if ((rc = dp_shard_rows_parse(p, len, name, &sr, d)) != 0)
        goto out;
    if (sr.unit_id != unit_id || sr.n_units != n_units) {
        rc = dp_fail(d, DP_EINVAL,
                     "%s: written by unit %u of %u, this is unit %u of %u (offset 12)",
                     name, sr.unit_id, sr.n_units, unit_id, n_units);
        dp_shard_rows_fini(&sr);
        goto out;
    }
    *rows = sr.v;
    *n_rows = sr.n;
out:
    close(fd);
    if (rc != 0) {
        free(*buf);
        *buf = NULL;
        *rows = NULL;
    }
    return rc;
}

void
dp_unit_load_res_fini(dp_unit_load_res *res)
{
    if (res == NULL)
        return;
    free(res->loaded);
    free(res->failed);
    memset(res, 0, sizeof *res);
}

int
dp_unit_load_shard(dp_unit *u, const char *path, size_t path_len,
                   const dp_wire_shard_blob *blobs, uint32_t n, bool spill,
                   dp_unit_load_res *res, dp_detail *d)
{
    memset(res, 0, sizeof *res);
    char fin[DP_UNIT_PATH_MAX + 16], rfin[DP_UNIT_PATH_MAX + 16];
    int rc = ck_path(path, path_len, fin, "load_shard", d);
    if (rc != 0)
        return rc;
    ck_name(rfin, fin, ".rows");
    uint8_t *rbuf = NULL, *buf = NULL;
    ck_row *rows = NULL;
    uint32_t n_rows = 0;
    ck_lb *lb = NULL;
    ck_lb **ord = NULL;
    dp_map byid;
    dp_map_init_str(&byid);
    int fd = -1;
    if ((rc = ck_open_regular(fin, &fd, d)) != 0)
        goto out;
    /* Header and trailer. */
    struct stat st;
    if (fstat(fd, &st) != 0) {
        rc = dp_fail_sys(d, errno, "stat of %s", fin);
        goto out;
    }
    uint64_t flen = (uint64_t)st.st_size;
    uint8_t hdr[DP_SHARD_HEADER_LEN], tr[DP_SHARD_TRAILER_LEN];
    if ((rc = ck_pread(fd, hdr, sizeof hdr, 0, fin, d)) != 0)
        goto out;
    if (memcmp(hdr, DP_SHARD_MAGIC, 8) != 0) {
        rc = dp_fail(d, DP_ECORRUPT, "%s: bad magic at offset 0", fin);
        goto out;
    }
    if (get_u32(hdr + 8) != DP_SHARD_VERSION) {
        rc = dp_fail(d, DP_ECORRUPT, "%s: version %u at offset 8, expected %u", fin,
                     get_u32(hdr + 8), DP_SHARD_VERSION);
        goto out;
    }
    if (get_u32(hdr + 12) != u->o.unit_id || get_u32(hdr + 16) != u->o.n_units) {
        rc = dp_fail(d, DP_EINVAL,
                     "%s: shard of unit %u of a %u-unit cluster, this is unit %u of %u "
                     "(rows are placed by gidx %% units)",
                     fin, get_u32(hdr + 12), get_u32(hdr + 16), u->o.unit_id,
                     u->o.n_units);
        goto out;
    }
    uint64_t data_bytes = get_u64(hdr + 24);
    if (data_bytes > flen ||
        flen - data_bytes != DP_SHARD_HEADER_LEN + DP_SHARD_TRAILER_LEN) {
        rc = dp_fail(d, DP_ECORRUPT,
                     "%s: %" PRIu64 " bytes, the header (offset 24) says %" PRIu64
                     " of data: truncated or corrupted",
                     fin, flen, data_bytes);
        goto out;
    }
    uint64_t toff = DP_SHARD_HEADER_LEN + data_bytes;
    if ((rc = ck_pread(fd, tr, sizeof tr, toff, fin, d)) != 0)
        goto out;
    if (memcmp(tr, DP_SHARD_END_MAGIC, 8) != 0 || get_u64(tr + 8) != data_bytes ||
        get_u32(tr + 20) != dp_crc32c(hdr, sizeof hdr)) {
        rc = dp_fail(d, DP_ECORRUPT, "%s: bad trailer at offset %" PRIu64, fin, toff);
        goto out;
    }
    rc = ck_read_rows(rfin, u->o.unit_id, u->o.n_units, &rbuf, &rows, &n_rows, d);
    if (rc != 0)
        goto out;
    if (get_u32(hdr + 20) != n_rows) {
        rc = dp_fail(d, DP_ECORRUPT, "%s: %u blobs (offset 20), %s lists %u", fin,
                     get_u32(hdr + 20), rfin, n_rows);
        goto out;
    }
    for (uint32_t i = 0; i < n_rows; i++) {
        if (rows[i].off < DP_SHARD_HEADER_LEN || rows[i].nbytes == 0 ||
            rows[i].off > toff || rows[i].nbytes > toff - rows[i].off) {
            rc = dp_fail(
                d, DP_ECORRUPT,
                "%s: blob %.*s at [%" PRIu64 ", +%" PRIu64 ") is outside the data of %s",
                rfin, (int)rows[i].id_len, rows[i].id, rows[i].off, rows[i].nbytes, fin);
            goto out;
        }
        if (dp_map_put(&byid, rows[i].id, rows[i].id_len, &rows[i], NULL) != 0) {
            rc = dp_fail(d, DP_ENOMEM, "load: out of memory");
            goto out;
        }
    }
    /* The request: every blob must be in the rows file, as save reported it. */
    lb = calloc(n ? n : 1, sizeof *lb);
    ord = calloc(n ? n : 1, sizeof *ord);
    res->loaded = calloc(n ? n : 1, sizeof *res->loaded);
    res->failed = calloc(n ? n : 1, sizeof *res->failed);
    buf = malloc(CK_CHUNK);
    if (lb == NULL || ord == NULL || res->loaded == NULL || res->failed == NULL ||
        buf == NULL) {
        rc = dp_fail(d, DP_ENOMEM, "load: out of memory");
        goto out;
    }
    for (uint32_t i = 0; i < n; i++) {
        lb[i].w = &blobs[i];
        lb[i].fd = -1;
        lb[i].r = dp_map_get(&byid, blobs[i].id.p, blobs[i].id.n);
        if (lb[i].r == NULL || lb[i].r->off != blobs[i].off ||
            lb[i].r->nbytes != blobs[i].nbytes) {
            rc = dp_fail(d, DP_EINVAL,
                         "load_shard: blob %.*s [%" PRIu64 ", +%" PRIu64 ") is not in %s",
                         (int)blobs[i].id.n, blobs[i].id.p, blobs[i].off, blobs[i].nbytes,
                         rfin);
            goto out;
        }
        ord[i] = &lb[i];
    }
    qsort(ord, n, sizeof *ord, lb_cmp);
    for (uint32_t i = 1; i < n; i++)
        if (ord[i]->r == ord[i - 1]->r ||
            ord[i]->r->off < ord[i - 1]->r->off + ord[i - 1]->r->nbytes) {
            rc = dp_fail(d, DP_EINVAL, "load_shard: blob %.*s asked twice or overlapping",
                         (int)ord[i]->r->id_len, ord[i]->r->id);
            goto out;
        }
    /* Allocate under the lock. */
    pthread_mutex_lock(&u->mu);
    double now = now_s(u);
    for (uint32_t i = 0; i < n; i++) {
        const ck_row *r = lb[i].r;
        blob_rec *b = dp_map_get(&u->blobs, r->id, r->id_len);
        if (b != NULL) {
            lb[i].state = b->published ? LB_PRESENT : LB_FAILED;
            continue;
        }
        uint64_t o = 0;
        dp_detail ad;
        dp_detail_clear(&ad);
        if (r->nbytes <= u->o.slab_bytes &&
            put_alloc_locked(u, r->nbytes, now, &o, NULL, &ad) == 0) {
            lb[i].state = LB_REGION;
            lb[i].off = o;
            lb[i].size = r->nbytes;
            dp_slab_alloc_size_of(u->alloc, o, &lb[i].size);
        } else if (spill && u->ssd && r->nbytes <= u->o.staging_bytes) {
            lb[i].state = LB_DISK;
        } else {
            lb[i].state = LB_FAILED;
        }
    }
    pthread_mutex_unlock(&u->mu);

    /* Fill without the lock: one pass over the data, checking every CRC. */
    uint64_t pos = DP_SHARD_HEADER_LEN;
    uint32_t crc = 0;
    for (uint32_t k = 0; k <= n && rc == 0; k++) {
        ck_lb *x = k < n ? ord[k] : NULL;
        uint64_t start = x ? x->r->off : toff;
        while (rc == 0 && pos < start) { /* blobs not asked for */
            size_t c = (size_t)DP_MIN(start - pos, (uint64_t)CK_CHUNK);
            rc = ck_pread(fd, buf, c, pos, fin, d);
            crc = dp_crc32c_update(crc, buf, c);
            pos += c;
        }
        if (x == NULL || rc != 0)
            break;
        if ((rc = admin_cancelled(u, "load", d)) != 0)
            break;
        uint8_t *dst = NULL;
        if (x->state == LB_REGION) {
            dst = u->slab + x->off;
        } else if (x->state == LB_DISK) {
            dst = x->buf = malloc((size_t)x->r->nbytes);
            if (dst == NULL) {
                rc = dp_fail(d, DP_ENOMEM, "load: out of memory for blob %.*s",
                             (int)x->r->id_len, x->r->id);
                break;
            }
        }
        uint32_t bcrc = 0;
        for (uint64_t done = 0; rc == 0 && done < x->r->nbytes;) {
            /* Straight into its region: one pread per blob (up to 1 GiB). */
            size_t c = (size_t)DP_MIN(x->r->nbytes - done,
                                      dst ? (uint64_t)1 << 30 : (uint64_t)CK_CHUNK);
            uint8_t *p = dst ? dst + done : buf;
            rc = ck_pread(fd, p, c, pos, fin, d);
            bcrc = dp_crc32c_update(bcrc, p, c);
            done += c;
            pos += c;
        }
        if (rc != 0)
            break;
        crc = dp_crc32c_combine(crc, bcrc, x->r->nbytes);
        if (bcrc != x->r->crc) {
            rc = dp_fail(d, DP_ECORRUPT,
                         "%s: blob %.*s at offset %" PRIu64 " (%" PRIu64
                         " bytes): CRC mismatch",
                         fin, (int)x->r->id_len, x->r->id, x->r->off, x->r->nbytes);
            break;
        }
        if (dst == NULL)
            continue;
        dp_blob_parse_opts po = {0};
        po.n_units = u->o.n_units;
        po.unit_index = u->o.unit_id;
        rc = dp_blob_parse(dst, (size_t)x->r->nbytes, &po, &x->parsed, d);
        if (rc != 0) {
            dp_fail_ctx(d, rc, "%s: blob %.*s at offset %" PRIu64, fin, (int)x->r->id_len,
                        x->r->id, x->r->off);
            break;
        }
        uint32_t ne = dp_blob_count(x->parsed);
        x->keep = calloc(ne ? ne : 1, 1);
        if (x->keep == NULL) {
            rc = dp_fail(d, DP_ENOMEM, "load: out of memory");
            break;
        }
        uint32_t kept = 0;
        for (uint32_t j = 0; j < x->r->n_live; j++) {
            uint32_t e = dp_shard_row_live(x->r, j);
            if (e >= ne || x->keep[e]) {
                rc = dp_fail(d, DP_ECORRUPT, "%s: blob %.*s: live entry %u of %u", rfin,
                             (int)x->r->id_len, x->r->id, e, ne);
                break;
            }
            x->keep[e] = 1;
            kept++;
        }
        if (rc == 0 && kept == 0)
            rc = dp_fail(d, DP_ECORRUPT, "%s: blob %.*s has no live entry", rfin,
                         (int)x->r->id_len, x->r->id);
    }
    if (rc == 0 && crc != get_u32(tr + 16))
        rc = dp_fail(d, DP_ECORRUPT, "%s: data CRC mismatch over [%u, %" PRIu64 ")", fin,
                     DP_SHARD_HEADER_LEN, toff);
    /* Spill files (outside the lock, as an io job would). */
    for (uint32_t i = 0; rc == 0 && i < n; i++) {
        if (lb[i].state != LB_DISK)
            continue;
        char label[DP_UNIT_PATH_MAX + 64];
        dp_detail fd_d;
        dp_detail_clear(&fd_d);
        if (new_file(u, u->use_tmpfile, &lb[i].fd, label, sizeof label, &fd_d) != 0 ||
            write_all(lb[i].fd, lb[i].buf, lb[i].r->nbytes, label, &fd_d) != 0) {
            DP_LOG_W("unit %u: load: spill of blob %s failed: %s", u->o.unit_id,
                     lb[i].r->id, dp_detail_msg(&fd_d));
            if (lb[i].fd >= 0)
                close(lb[i].fd);
            lb[i].fd = -1;
            lb[i].state = LB_FAILED;
        }
        free(lb[i].buf);
        lb[i].buf = NULL;
    }

    /* Publish (or undo) under the lock. */
    pthread_mutex_lock(&u->mu);
    now = now_s(u);
    for (uint32_t i = 0; i < n; i++) {
        ck_lb *x = &lb[i];
        blob_rec *b = NULL;
        if (rc == 0 && (x->state == LB_REGION || x->state == LB_DISK) &&
            dp_map_get(&u->blobs, x->r->id, x->r->id_len) == NULL) {
            b = calloc(1, sizeof *b);
            if (b != NULL) {
                memcpy(b->id, x->r->id, x->r->id_len);
                b->id_len = x->r->id_len;
                b->nbytes = x->r->nbytes;
                b->fd = -1;
                b->created_at = now;
                b->parsed = x->parsed;
                if (x->state == LB_REGION) {
                    b->off = x->off;
                    b->size = x->size;
                    b->has_region = true;
                } else {
                    b->size = x->r->nbytes;
                    b->disk = true;
                    b->fd = x->fd;
                    u->files_open++;
                    u->n_disk++;
                    u->disk_bytes += b->nbytes;
                }
                if (dp_map_put(&u->blobs, b->id, b->id_len, b, NULL) != 0 ||
                    publish_locked(u, b, x->keep, now, NULL) != 0) {
                    dp_map_del(&u->blobs, b->id, b->id_len);
                    if (b->disk) {
                        u->n_disk--;
                        u->disk_bytes -= b->nbytes;
                        u->files_open--;
                    }
                    b->parsed = NULL;
                    free(b);
                    b = NULL;
                } else {
                    x->parsed = NULL; /* the record owns it */
                    x->fd = -1;
                    x->state = LB_PRESENT;
                    u->n_loaded_blobs++;
                }
            }
        } else if (rc == 0 && x->state != LB_FAILED) {
            /* Already there, or a put of the same id won meanwhile. */
            if (x->state == LB_REGION)
                dp_slab_alloc_free(u->alloc, x->off, NULL);
            x->state = LB_PRESENT;
        }
        if (x->state == LB_REGION) {
            /* Never exposed: no transfer can run into it. */
            dp_slab_alloc_free(u->alloc, x->off, NULL);
            if (rc == 0)
                x->state = LB_FAILED;
        }
        if (rc == 0) {
            if (x->state == LB_PRESENT)
                res->loaded[res->n_loaded++] = x->w->id;
            else
                res->failed[res->n_failed++] = x->w->id;
        }
    }
    if (rc == 0)
        u->n_loads++;
    pthread_mutex_unlock(&u->mu);
out:
    if (fd >= 0)
        close(fd);
    for (uint32_t i = 0; lb != NULL && i < n; i++) {
        if (lb[i].fd >= 0)
            close(lb[i].fd);
        free(lb[i].buf);
        free(lb[i].keep);
        dp_blob_destroy(lb[i].parsed);
    }
    free(lb);
    free(ord);
    free(buf);
    free(rows);
    free(rbuf);
    dp_map_fini(&byid);
    if (rc != 0)
        dp_unit_load_res_fini(res);
    return rc;
}
