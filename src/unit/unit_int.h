/*
 * Shared by the storage unit's own files only: the unit's struct, its blob
 * records, pins, rows and io jobs, and the internal calls between the files.
 * unit.h is the module's interface for the rest of the project; nothing
 * outside src/unit includes this header.
 *
 * Design notes
 * ------------
 * Files. unit.c: create/destroy, alloc, commit, abort, release, the ticker
 * and the lifecycle of a record. rows.c: the row index and the atomic
 * publish. pins.c: resolve, resolve_keys, pins and their end. ssd.c: the SSD
 * tier (IO area, spill and stage jobs, files). ckpt.c: save_shard and
 * load_shard (the file format is src/blob/shard.c's). stats.c: the counters
 * (one table: DP_UNIT_STATS in unit.h) and the blob scan. check.c:
 * dp__unit_check. numa.c: NUMA placement. writers.c: who may still WRITE into
 * a retired region. transfers.c: the serve hooks of two-sided transfers.
 * handler.c / server.c: the control-message handler and the serving unit over
 * the endpoint and the ctl server.
 *
 * Ownership. The unit owns the slab (from dp__endpoint_alloc, or mmap without
 * an endpoint), the allocators, every blob record, row, slot and pin. A blob
 * record lives in the blob table (id -> rec) from alloc until it is retired,
 * aborted or released; a released record that is still pinned or held leaves
 * the table (its id may be reused at once) and lives on as a zombie, owned by
 * its pins and holds, until the last one ends. A record owns its parsed index
 * (dp__blob): row-index slots and resolve results point into it. Its state
 * (rec_state below) says where it is in that life; facts orthogonal to it are
 * flag bits.
 *
 * Refs. A published record's refs is the number of row-index slots pointing
 * at it; the slots are the only counted references. Pins (pins.c) and save
 * holds (ckpt.c) do not hold refs: they hold n_pins and n_holds, and keep a
 * released record alive as a zombie.
 *
 * Time. Every timestamp comes from one monotonic clock (opts.now, dp__now_s by
 * default; dp__unit_now).
 *
 * Locks. One unit lock (mu) guards everything here. The ctl thread (through
 * handler.c), save/load threads, the ticker, the io workers and test callers
 * take it; nothing blocking runs under it (no transfer, no file I/O, no ZMQ).
 * The ticker's and the io workers' condition variables wait on mu itself.
 * Lock order: the endpoint's internal lock, then mu, then the allocators (not
 * thread-safe, used only under mu). The endpoint calls the two-sided serve
 * hooks (transfers.c) with its lock held and they take mu; so nothing under
 * mu calls an endpoint function that locks (only dp__endpoint_name, which
 * takes none; metadata is fetched by handler.c outside mu). Functions named
 * *_locked are called with mu held.
 */
#ifndef DP_UNIT_UNIT_INT_H
#define DP_UNIT_UNIT_INT_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "alloc/slab_alloc.h"
#include "blob/blob.h"
#include "common/list.h"
#include "common/map.h"
#include "unit/unit.h"
#include "wire/wire.h"
#include "unit/writers.h"

/*
 * Where a blob record is in its life (see "Lifecycle of a region" in unit.c
 * and "Spill" in ssd.c). A record in the blob table is ALLOCATED, VALIDATED,
 * ABORTING, ABORTING_RETIRE or PUBLISHED; a ZOMBIE or DOOMED one has left it.
 */
typedef enum rec_state {
    /* Uncommitted: a client WRITE may run into its region (on the pend list). */
    REC_ALLOCATED = 0,
    /* A spill whose commit validated: an io job writes it to a file, then
     * publishes it (on the pend list until its job is queued). */
    REC_VALIDATED,
    /* A VALIDATED spill aborted while its job ran: the job's end frees it. */
    REC_ABORTING,
    /* The same, aborted with in_flight: the job's end retires its region. */
    REC_ABORTING_RETIRE,
    /* In the row index (refs > 0): resolves answer it. */
    REC_PUBLISHED,
    /* Released while pinned or held: freed when its last pin and hold end. */
    REC_ZOMBIE,
    /* Released, unpinned, while an io job owns its region: the job's end frees it. */
    REC_DOOMED,
    /*
     * Out of the table (aborted, retired, reclaimed) while two-sided WRITEs
     * still land in its region (n_rx > 0): on u->draining; the last one's end
     * frees or retires it as was asked (transfers.c).
     */
    REC_DRAINING,
} rec_state;

/* Which area the region that off/size name is in (one allocator each). */
typedef enum rec_area {
    REC_AREA_NONE = 0, /* no region: an unstaged disk blob, or given back */
    REC_AREA_PUT,      /* the put area (u->alloc) */
    REC_AREA_IO,       /* the IO area (u->io_alloc): a spill, or a staged copy */
} rec_area;

/* Facts about a record orthogonal to its state (blob_rec.flags). */
enum {
    REC_DISK = 1u << 0,   /* published from a file: fd holds the bytes */
    REC_JOB = 1u << 1,    /* an io job owns its region and fd now: nothing frees them */
    REC_STAGED = 1u << 2, /* a disk blob's complete copy is at off (staged list) */
    REC_STAGE_FAILED = 1u << 3, /* its last stage failed: the next resolve says so once */
    REC_PICKED_UP = 1u << 4,    /* a reader pinned its staged copy: evictable at once */
    REC_PIN_EXPIRED = 1u << 5,  /* sticky: a pin on its region expired: quarantine it */
    REC_TWO_SIDED = 1u << 6, /* its writer WRITEs two-sided: only received bytes land */
    REC_REPAIR = 1u << 7,    /* a repair's copy: its commit publishes only missing keys */
};

typedef struct blob_rec blob_rec;
struct blob_rec {
    char id[DP_UNIT_ID_MAX + 1];
    uint32_t id_len;
    uint8_t state;   /* rec_state */
    uint8_t area;    /* rec_area */
    uint16_t flags;  /* REC_DISK ... */
    uint64_t off;    /* offset in the unit's region (put or IO area) */
    uint64_t nbytes; /* as asked by alloc: the blob's total_len */
    uint64_t size;   /* as allocated (rounded up) */
    uint64_t n_entries_decl;
    uint64_t token;     /* the allocation's token: its blob's header must name it */
    uint64_t ver;       /* the version its commit named (0: unversioned; "Versions") */
    uint64_t *vers;     /* a repair's copy: each entry's version (NULL: none) */
    dp__writer *writer; /* who WRITEs it, until its commit validates (a reference) */
    uint64_t refs;
    uint32_t n_pins;
    uint32_t n_holds;  /* saves copying it (checkpoint): keep it like a pin */
    uint32_t n_rx;     /* two-sided WRITEs landing in its region now (transfers.c) */
    bool drain_retire; /* REC_DRAINING: retire the region at the end, not free it */
    dp__blob *parsed;  /* once its commit validated */
    uint64_t pin_mark;
    double created_at;
    double last_resolve_at;
    dp__list_node pend_link; /* u->pend: uncommitted, creation order */
    /* SSD tier (see ssd.c) */
    uint64_t commit_seq; /* order of its validated commit (0: not yet) */
    uint8_t *spill_keep; /* validated spill: entries a later release cleared (0),
                            NULL while none */
    uint8_t res_state;   /* resolve state in the call of res_epoch */
    int fd;              /* -1: none */
    uint64_t res_epoch;
    double staged_at;
    dp__list_node staged_link; /* u->staged: staged copies, oldest first */
};

/* The writers.h area of b's region. */
static inline int
rec_writers_area(const blob_rec *b)
{
    return b->area == REC_AREA_IO ? DP__AREA_IO : DP__AREA_PUT;
}

/* A record in the table between its commit's validation and its publish. */
static inline bool
rec_committing(const blob_rec *b)
{
    return b->state == REC_VALIDATED || b->state == REC_ABORTING ||
           b->state == REC_ABORTING_RETIRE;
}

/* The records one running save copies (n_holds counts them; ckpt.c). */
typedef struct hold_set hold_set;
struct hold_set {
    blob_rec **b;
    uint32_t n;
    dp__list_node link; /* u->holds */
};

/* One resolve's pin on the records it answered (pins.c). */
typedef struct pin pin;
struct pin {
    char id[33];
    double expiry;
    blob_rec **blobs;
    uint32_t n;
    uint32_t n_sends; /* two-sided READs sending from its blobs now (transfers.c) */
    bool ending;      /* unpinned or expired while sending: ends with the last send */
    bool end_expired;
    dp__list_node link; /* u->pins_by_expiry: creation (= expiry) order */
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
    uint64_t ver;  /* the key's version (docs/design.md, "Versions"); 0: none */
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

/* A spill whose keys were all replaced before its io job ended (ssd.c, Order). */
typedef struct superseded {
    dp__list_node link; /* u->sup_order: oldest first */
    double until;
    bool gone;      /* its id was allocated again: forgotten */
    uint64_t stale; /* refused as stale at this version: asked again, so answered */
    uint8_t id_len;
    char id[DP_UNIT_ID_MAX + 1];
} superseded;

#define SUPERSEDED_KEEP_S 60.0

typedef struct io_job {
    int kind;
    blob_rec *b;
} io_job;

/* How a resolve answers for a published blob (once per call). */
enum { RES_READY = 1, RES_PENDING, RES_FAILED };

/*
 * Latency of one control op as the unit handled it (metrics.c): counts per
 * bucket (upper bounds in DP_UNIT_HIST_BOUNDS_US, the last one +Inf), the
 * count and the sum. Atomics, no lock: the handler records, a scrape reads.
 */
#define DP_UNIT_HIST_N 18
typedef struct dp__op_hist {
    _Atomic uint64_t b[DP_UNIT_HIST_N];
    _Atomic uint64_t count, sum_ns;
} dp__op_hist;

struct dp__unit {
    pthread_mutex_t mu;
    dp__unit_opts o;
    dp__unit_stats stats; /* what the unit counts as it goes (see DP_UNIT_STATS) */
    dp__op_hist hist[DP_WIRE_OP_COUNT_]; /* per op: metrics.c */
    uint64_t (*auth_fn)(const void *);   /* auth_refused's source (server.c) */
    const void *auth_src;
    /* The region and the put area (unit.c) */
    uint8_t *slab;
    size_t slab_map_len; /* mmap'd length when not from the endpoint */
    uint64_t region_len; /* put area + gap + IO area */
    dp__slab_alloc *alloc;
    uint64_t incarnation; /* random, drawn at create */
    /* Blob records (unit.c) */
    dp__map blobs;        /* id -> blob_rec* */
    dp__list pend;        /* uncommitted records (blob_rec.pend_link) */
    dp__list draining;    /* REC_DRAINING records (blob_rec.pend_link) */
    uint64_t token_seq;   /* last allocation token handed out */
    uint64_t commit_seq;  /* last commit_seq handed out */
    dp__writers *writers; /* retired regions and who may still write them */
    /* The row index (rows.c) */
    dp__map rows; /* gidx -> row* */
    /* Rows freed, kept for new ones (rows.c): a batch cleared and put again
     * costs no malloc and free a row (about 90 instructions a value). */
    row **spare_rows;
    uint32_t n_spare_rows, cap_spare_rows;
    /* Pins (pins.c) */
    dp__map pins;            /* pin id -> pin* */
    dp__list pins_by_expiry; /* pin.link */
    uint64_t pin_epoch;
    /* Info (unit.c) */
    char address[256];
    char numa_desc[128];
    char cluster_id[DP_UNIT_ID_MAX + 1]; /* "" when none */
    char transports[128]; /* its endpoint's UCX transports (info), "" without one */
    /* The ticker (unit.c) and its log line (stats.c) */
    pthread_cond_t cv;
    pthread_t ticker;
    bool ticker_on;
    bool stopping;
    double period_s;
    double last_report; /* when the ticker last logged the counters */
    uint64_t report_sig, ssd_report_sig;
    /* SSD tier (ssd.c) */
    bool ssd;
    char *ssd_dir;
    bool use_tmpfile; /* O_TMPFILE works in ssd_dir */
    uint64_t io_base; /* offset of the IO area in the region */
    dp__slab_alloc *io_alloc;
    pthread_cond_t io_cv;
    pthread_t *io_th;
    uint32_t n_io_th;
    bool io_stopping;
    io_job jobs[DP_UNIT_MAX_IO_JOBS]; /* ring */
    uint32_t q_head, q_n, n_running;
    int *closes; /* fds for the workers to close */
    size_t n_closes, cap_closes;
    dp__list staged;       /* staged copies, oldest first */
    uint64_t io_job_bytes; /* regions io jobs own */
    uint64_t n_doomed;
    uint64_t resolving_epoch; /* set while a resolve starts a stage */
    dp__map superseded;       /* id -> superseded*, also listed oldest first */
    dp__map order;            /* client prefix -> order_rec* (order.c) */
    double order_swept;       /* when order.c last dropped idle clients */
    double trimmed;           /* the ticker's last malloc_trim */
    dp__list sup_order;       /* the superseded, oldest first (superseded.link) */
    /* Checkpoints (ckpt.c) */
    dp__list holds;    /* running saves, each holding its snapshot (hold_set.link) */
    uint64_t n_clears; /* release_rows calls that dropped something */
    /*
     * Repair (repair.c; docs/design.md, "Repair"): DP_UNIT_REPAIR_*, and while
     * it runs the rows cleared since the unit started (gidx -> 1), which no
     * repair copy brings back.
     */
    int repair_state;
    dp__map tombs; /* gidx -> the version of its last clear (dp__ver_now's scale) */
    uint64_t repair_failed0; /* repair_failed when the running repair or pass began */
    double tombs_pruned;     /* the ticker's last prune of tombs */
    /* Read leases (lease.c; docs/design.md, "Leases"), with o.lease_s > 0 */
    struct lease_peer *lease; /* n_units entries, this unit's unused */
    double *lease_scratch;    /* n_units: the grants' ends, sorted (lease.c) */
    uint64_t lease_seq;       /* this unit's last fence (starts at dp__ver_now) */
    double lease_ok_until;    /* it answers reads until then */
    /* Admin work (a save or load) running off the ctl thread (unit.c) */
    uint32_t n_admin;
    pthread_cond_t admin_cv;
    int admin_cancel; /* atomic: destroy asks running saves and loads to stop */
};

/* The unit's clock (opts.now). */
static inline double
dp__unit_now(dp__unit *u)
{
    return u->o.now(u->o.now_ctx);
}

/* A wire string viewing a NUL-terminated one. */
static inline dp__wire_str
dp__zview(const char *z)
{
    return (dp__wire_str){z, (uint32_t)strlen(z)};
}

/* ---- read leases (lease.c) ---- */

/* Set up (create) and free (destroy) a unit's lease table. */
int dp__lease_init(dp__unit *u, dp_detail *d);
void dp__lease_fini(dp__unit *u);

/* Whether the unit may answer reads now (always without leases). */
static inline bool
dp__lease_reads_ok_locked(const dp__unit *u, double now)
{
    return !(u->o.lease_s > 0) || now < u->lease_ok_until;
}

/* ---- repair (repair.c) ---- */

/*
 * Record the clear of these rows at version ver ("Versions"; 0, unversioned:
 * this host's clock, and only while a repair runs or with passes): commits
 * below it are refused and no repair copy brings the rows back.
 */
void dp__repair_cleared_locked(dp__unit *u, const uint64_t *gidxs, uint32_t n,
                               uint64_t ver);

/* The version of row g's last recorded clear; 0: none. */
static inline uint64_t
dp__tomb_ver_locked(dp__unit *u, uint64_t g)
{
    return dp__map_len(&u->tombs) > 0 ? (uint64_t)(uintptr_t)dp__map_get_u64(&u->tombs, g)
                                      : 0;
}

/* Forget the clears recorded longer ago than tomb_keep_s (none while a repair
 * or pass runs). */
void dp__repair_prune_tombs_locked(dp__unit *u);

/*
 * A repair copy's commit (b parsed): which entries to publish (keep, n bytes,
 * malloc'd, or NULL out of memory) and how many (*kept): those whose key the
 * unit lacks, or holds at a lower version than the copy's (b->vers), and whose
 * row has no record of a clear (dp__repair_cleared_locked).
 */
uint8_t *dp__repair_keep_locked(dp__unit *u, const blob_rec *b, uint32_t *kept);

/* Count a repair copy's commit: the keys and bytes it publishes, the rest skipped. */
void dp__repair_counted_locked(dp__unit *u, const blob_rec *b, const uint8_t *keep,
                               uint32_t kept);

/* ---- records (rec.c) ---- */

/* The one way a record's state changes; a transition its life forbids is a bug. */
void dp__rec_set_state(blob_rec *b, rec_state to);
/* Set (on) or clear one of b's flags (REC_*); JOB and STAGED must change. */
void dp__rec_flag_locked(blob_rec *b, unsigned flag, bool on);
/* Hand b's fd to the io workers to close (never closed under the lock). */
void dp__rec_close_later_locked(dp__unit *u, blob_rec *b);
/* b's staged copy joins (the newest) or leaves u->staged, counted in the stats. */
void dp__rec_staged_append_locked(dp__unit *u, blob_rec *b);
void dp__rec_staged_unlink_locked(dp__unit *u, blob_rec *b);

/* Free the record itself (its writer reference, index, spill_keep). NULL allowed. */
void dp__rec_free_locked(dp__unit *u, blob_rec *b);
/* Give b's region back: now, or through quarantine if a pin on it expired. */
void dp__rec_release_region_locked(dp__unit *u, blob_rec *b, double now);
/*
 * Free a record out of the table and unpinned, with its region and file; if
 * an io job owns them, it becomes DOOMED and the job's end does it.
 */
void dp__rec_drop_locked(dp__unit *u, blob_rec *b, double now);
/* Out of the table for good, its region retired: a WRITE may still land in it. */
void dp__rec_retire_locked(dp__unit *u, blob_rec *b);
/* An open allocation out of the table, its region freed (or drained first). */
void dp__rec_discard_open_locked(dp__unit *u, blob_rec *b, double now);
/* A REC_DRAINING record whose last two-sided WRITE ended: finish its end. */
void dp__rec_drained_locked(dp__unit *u, blob_rec *b, double now);
/* Count b in (dir > 0) or out of the zombies and their bytes. */
void dp__rec_zombie_count_locked(dp__unit *u, blob_rec *b, int dir);
/* Drop a slot's ref; at zero the record leaves the table (freed, or a zombie). */
void dp__rec_unref_locked(dp__unit *u, blob_rec *b, double now);
/* A put-area region: 0, DP_EBUSY (+reason) or DP_EUNITFULL (not counted), others. */
int dp__unit_put_alloc_locked(dp__unit *u, uint64_t nbytes, double now, uint64_t *off,
                              const char **reason, dp_detail *d);
/* DP_ECLOSED once destroy asked running saves and loads to stop. Any thread. */
int dp__unit_admin_cancelled(dp__unit *u, const char *what, dp_detail *d);

/* ---- the row index (rows.c) ---- */

uint32_t dp__row_hash(const char *f, uint32_t n);
/* Free r, or keep it for dp__row_new_locked (up to a bound). */
void dp__row_free_locked(dp__unit *u, row *r);
/* Free the rows kept (destroy). */
void dp__rows_spare_fini(dp__unit *u);
/* Index of field f's slot in r (h its hash), or -1. */
int32_t dp__row_find(const row *r, const char *f, uint32_t flen, uint32_t h);
/* r's slot for f, or NULL (r may be NULL). */
slot *dp__row_slot(row *r, const char *f, uint32_t flen);
/*
 * Install b's parsed index (b->parsed set, b not yet published) in the row
 * index; keep (NULL: all) names the entries to install, one byte each, at
 * least one kept. DP_ENOMEM, or DP__ESTALE (b versioned, not a repair's copy,
 * and a key it would replace held at a higher version): nothing changed.
 */
int dp__rows_publish_locked(dp__unit *u, blob_rec *b, const uint8_t *keep, double now,
                            dp_detail *d);
/*
 * The highest version held of a key that b (validated, versioned) would
 * replace, when it is above b's own; 0 when b may publish (docs/design.md,
 * "Versions").
 */
uint64_t dp__rows_stale_locked(dp__unit *u, const blob_rec *b);
/*
 * Whether the key held in s wins over an entry of b committed after it: a
 * higher version, or the same one (both unversioned) committed later
 * (ssd.c: a spill publishing after later commits).
 */
bool dp__slot_wins_locked(const slot *s, const blob_rec *b);

/* ---- pins (pins.c) ---- */

/*
 * End pin p (unpinned or expired) and free it; zombies it kept may go. A pin
 * that two-sided READs still send from leaves the expiry list and ends with
 * the last of them (dp__pin_sent_locked).
 */
void dp__pin_end_locked(dp__unit *u, pin *p, bool expired, double now);
/* One two-sided READ from p's blobs ended its send. */
void dp__pin_sent_locked(dp__unit *u, pin *p, double now);
/* End every pin (destroy). */
void dp__pins_fini_locked(dp__unit *u);

/* ---- SSD tier (ssd.c) ---- */

/* Check ssd_dir, pick the file method, start the io threads (create). */
int dp__ssd_open(dp__unit *u, dp_detail *d);
/* Stop the io threads (a running job ends first) and drop the queued jobs. */
void dp__ssd_stop(dp__unit *u);
/* Close the fds left to close and free the tier's tables (destroy, last). */
void dp__ssd_fini(dp__unit *u);
/* A fresh file in ssd_dir with no name left behind. Worker threads and create. */
int dp__ssd_new_file(dp__unit *u, bool try_tmpfile, int *out, char *label, size_t cap,
                     dp_detail *d);
bool dp__ssd_jobs_full_locked(const dp__unit *u);
/* Queue a job owning b's region (the caller checked dp__ssd_jobs_full_locked). */
void dp__ssd_submit_locked(dp__unit *u, int kind, blob_rec *b);
/* An id allocated again is no longer a superseded spill's. */
void dp__ssd_superseded_forget_locked(dp__unit *u, const char *id, size_t id_len);
/* Remember b's id as superseded (a commit of it answers "done"; with stale, a
 * commit refused at that version answers "Stale" again); best effort. */
void dp__ssd_superseded_add_locked(dp__unit *u, const blob_rec *b, double now);
void dp__ssd_superseded_add_stale_locked(dp__unit *u, const blob_rec *b, double now,
                                         uint64_t stale);
void dp__ssd_superseded_expire_locked(dp__unit *u, double now);
/* An IO-area region (evicting staged copies): 0, DP_EBUSY, DP_EUNITFULL, others. */
int dp__ssd_io_alloc_locked(dp__unit *u, uint64_t nbytes, double now, uint64_t *off,
                            const char **reason, dp_detail *d);
/* RES_* for published b in the resolve call of epoch (starts a stage if needed). */
int dp__ssd_resolve_state_locked(dp__unit *u, blob_rec *b, uint64_t epoch, double now);
/* Mark released rows' entries in validated, unpublished spills (of a version up
 * to ver, the clear's; 0: all). */
void dp__ssd_release_spills_locked(dp__unit *u, const uint64_t *gidxs, uint32_t n,
                                   uint64_t ver);

/* ---- counters (stats.c) ---- */

void dp__unit_get_stats_locked(dp__unit *u, dp__unit_stats *st);
/*
 * The 30 s log lines (the counters, and the SSD tier's): set when 30 s have
 * passed since the last and something changed, else "". The caller logs them
 * after unlocking.
 */
void dp__unit_report_locked(dp__unit *u, double now, char *line, size_t cap,
                            char *ssd_line, size_t ssd_cap);

/* Request order (order.c). */
void dp__order_fini(dp__unit *u);
void dp__order_sweep_locked(dp__unit *u, double now);

#endif
