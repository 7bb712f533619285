/*
 * The storage unit core (docs/design.md, "Storage unit"): one registered
 * DRAM slab, its put-area allocator, the blob table, the row index, pins,
 * quarantine and retired regions, the SSD tier and checkpoints. It knows
 * nothing of ZMQ: handler.c decodes control messages and calls the operations
 * here; tests call them directly. This is the module's interface; its files
 * share src/unit/unit_int.h among themselves only.
 *
 * Clients move the bytes themselves (one-sided WRITE into an alloc'd region,
 * READ out of a resolved one); the unit only hands out regions, publishes
 * blobs whose embedded index validates, and makes sure a region is never
 * handed out again while a transfer into or out of it may still run.
 *
 * Threads: every function may be called from any thread unless its comment
 * says otherwise. Operations take the unit lock themselves, except those whose
 * name ends in _locked: their caller holds it (dp__unit_lock) and the views
 * they return stay valid until it unlocks.
 */
#ifndef DP_UNIT_UNIT_H
#define DP_UNIT_UNIT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/common.h"
#include "wire/wire.h"
#include "xfer/endpoint.h"

typedef struct dp__unit dp__unit;

/* Longest blob or pin id, bytes (the wire's default max_id). */
#define DP_UNIT_ID_MAX DP_ID_MAX

typedef enum dp__unit_numa {
    DP_UNIT_NUMA_AUTO = 0, /* prefer the node unit_id % nodes on multi-node machines */
    DP_UNIT_NUMA_BIND = 1, /* bind CPU and memory to that node */
    DP_UNIT_NUMA_OFF = 2,
} dp__unit_numa;

/* Creation options. dp__unit_opts_init gives the defaults. */
typedef struct dp__unit_opts {
    uint32_t unit_id; /* this unit's index, < n_units */
    uint32_t n_units; /* units of the cluster (gidx % n_units picks the unit) */
    /*
     * Copies of each row the cluster keeps (1..DP_UNIT_MAX_REPLICAS, at most
     * n_units): row g lives on units g % N, (g + 1) % N, ... Every unit of a
     * cluster is started with the same value; info reports it and clients put
     * and get by it (docs/design.md, "Replicas"). Default (and 0) 1.
     */
    uint32_t replicas;
    /*
     * The unit fills itself from its peers after it starts (docs/design.md,
     * "Repair"): until dp__unit_repair_end it records the rows it is asked to
     * clear, so that no repair copy brings them back.
     */
    bool repair;
    /*
     * Passes (docs/design.md, "Repair"): the unit compares its copies with its
     * peers' this often and copies in what they hold at a higher version
     * (dp__unit_repair_begin starts one); 0: none. While passes run it keeps
     * the rows it was asked to clear for DP_UNIT_TOMB_KEEP_S, not only during
     * a repair, so that no pass brings back a row whose clear reached it just
     * before the pass began.
     */
    double repair_every_s;
    /*
     * How long a cleared row's record is kept (docs/design.md, "Versions"): a
     * commit below a clear's version is refused while it is kept, and no repair
     * copy brings the row back. 0: the alloc lease (at least 120 s) + 60 s, the
     * longest a put's commit can come after its version was taken.
     */
    double tomb_keep_s;
    /*
     * Read leases (docs/design.md, "Leases"), 0: off. With them the unit
     * answers reads only while more than half of the cluster's units grant it
     * a lease (a unit whose process is gone counts as granting), and a client
     * may land a write without a unit that does not answer once more than
     * half of the units have fenced it (fence): the fenced unit answers no
     * read until a pass caught it up. Its lease thread (the CLI's) asks every
     * other unit for one each lease_s / 4. Needs at least 3 units.
     */
    double lease_s;
    uint64_t slab_bytes;
    double read_pin_s;    /* pin lifetime of a resolve (default 30) */
    double alloc_lease_s; /* an alloc not committed by then is retired; 0: never (300) */
    double quarantine_s;  /* a region whose pin expired waits this long (default 5) */
    dp__unit_numa numa;
    /*
     * SSD tier (docs/design.md, "SSD tier"), on when ssd_dir is set: a put the put area
     * cannot take (alloc with spill) goes to a file in ssd_dir through the IO
     * area, and a read of such a blob stages it back into the IO area first.
     * ssd_dir is copied at create; it must be an existing directory the unit
     * can create files in. staging_bytes is the IO area (required, >= 4 KiB,
     * with ssd_dir); it follows the put area in the same registered region,
     * so every offset the unit hands out is relative to one base. pickup_s
     * (default 10) is how long a staged copy nobody pinned yet is kept for
     * the reader that asked for it. io_threads (default 4) run the io jobs.
     */
    const char *ssd_dir;
    uint64_t staging_bytes;
    double pickup_s;
    uint32_t io_threads;
    /*
     * A retired region (its writer may still WRITE into it) and an open
     * allocation come back this long after their writer provably can no
     * longer write (src/unit/writers.h; docs/design.md, "Reclaiming retired
     * memory"). < 0: never (retired regions are kept for good). Default 5.
     */
    double reclaim_grace_s;
    /*
     * The id of the cluster this unit was started for (NULL or "": none),
     * 1..64 bytes of [A-Za-z0-9_.:-]; info reports it, so a client whose
     * cluster file names another cluster refuses this unit. Copied at create.
     */
    const char *cluster_id;
    /*
     * Name files and unlink them at once even where O_TMPFILE works (tests).
     * Either way, create removes names of that form (dp-spill-<32 hex>) that a
     * unit killed between its open and its unlink left in ssd_dir.
     */
    bool ssd_no_tmpfile;
    /*
     * The slab comes from dp__endpoint_alloc(ep) (borrowed; it must outlive the
     * unit) so same-host peers get shared memory. NULL: plain host memory, for
     * tests and fuzzing without UCX.
     */
    dp__endpoint *ep;
    /* Clock in seconds (default dp__now_s); tests pass a fake one. */
    double (*now)(void *ctx);
    void *now_ctx;
} dp__unit_opts;

void dp__unit_opts_init(dp__unit_opts *o);

/* The most copies of a row a cluster keeps. */
#define DP_UNIT_MAX_REPLICAS 3

/* At most this many io jobs (spills and stages) are queued or running. */
#define DP_UNIT_MAX_IO_JOBS 256

/*
 * Place the calling thread (and the threads and memory it creates after) on
 * NUMA node unit_id % nodes: preferred memory (auto) or bound CPU and memory
 * (bind). A no-op on one-node machines, without libnuma support, or with
 * DP_UNIT_NUMA_OFF. desc[cap] says what was done (for info). Idempotent;
 * dp__unit_create calls it, and a process can call it earlier so threads it
 * starts before the unit (the endpoint's) are placed too.
 */
void dp__unit_numa_apply(dp__unit_numa mode, uint32_t unit_id, char *desc, size_t cap);

/*
 * Create a unit: place the process (NUMA), take the slab (put area + IO
 * area), build the tables; with ssd_dir, check the directory by creating and
 * dropping one file and start the io threads.
 * Errors: DP_EINVAL (bad options), DP_ENOMEM, DP_ESYS (ssd_dir unusable,
 * threads), errors of dp__endpoint_alloc.
 */
int dp__unit_create(const dp__unit_opts *opts, dp__unit **out, dp_detail *d);

/*
 * Stop the ticker and the io threads (a running io job finishes first; queued
 * ones are dropped), close every file, free every table and the slab. NULL
 * allowed. Not concurrent with other calls.
 */
void dp__unit_destroy(dp__unit *u);

/*
 * Serve two-sided transfers on the unit's endpoint (transfers.c; docs/design.md,
 * "Two-sided transfers"); before peers take its metadata. dp__unit_stop_serving
 * must run before dp__unit_destroy. Errors: DP_EINVAL.
 */
int dp__unit_serve_transfers(dp__unit *u, dp_detail *d);
void dp__unit_stop_serving(dp__unit *u);

/*
 * Admin work running off the ctl thread (a save or load whose reply is
 * deferred): begin before starting it, end when it no longer touches the
 * unit. dp__unit_admin_wait blocks until none runs; destroy first asks the
 * running ones to stop (they fail with DP_ECLOSED at their next blob) and then
 * calls it.
 */
void dp__unit_admin_begin(dp__unit *u);
void dp__unit_admin_end(dp__unit *u);
void dp__unit_admin_wait(dp__unit *u);

/* Start the 1 s maintenance thread (dp__unit_tick); stopped by destroy. */
int dp__unit_start_ticker(dp__unit *u, double period_s, dp_detail *d);

/* The address the control server bound, reported by info (copied). */
void dp__unit_set_address(dp__unit *u, const char *zmq_address);

void dp__unit_lock(dp__unit *u);
void dp__unit_unlock(dp__unit *u);

/* Constant after create. */
uint32_t dp__unit_id(const dp__unit *u);
uint64_t dp__unit_slab_bytes(const dp__unit *u); /* the put area */
uint64_t dp__unit_io_bytes(const dp__unit *u);   /* the IO area, 0 without SSD tier */
uint64_t dp__unit_io_base(const dp__unit *u);    /* offset of the IO area */
/* The region's base: put area at [0, slab_bytes), IO area at io_base. */
uint8_t *dp__unit_slab(const dp__unit *u);
dp__endpoint *dp__unit_endpoint(const dp__unit *u);
const char *dp__unit_numa_desc(const dp__unit *u); /* what NUMA placement did */

/*
 * info without the metadata: the zmq address (as set), the endpoint name ("" if
 * none). Views into the unit, valid until destroy / the next set_address.
 */
void dp__unit_info_locked(dp__unit *u, dp__wire_info *info);

/*
 * alloc as the wire asks it (dp__wire_alloc_args): reserve nbytes for blob_id
 * (1..DP_UNIT_ID_MAX bytes of [A-Za-z0-9_.:-]); n_entries (0: unchecked) must
 * then match the blob's index at commit; the writer is who WRITEs it (its
 * region is reclaimed if it dies). res gets the region's offset and the
 * allocation's token, which the blob's header must name (with this unit's
 * incarnation) for its commit to publish it. Asking again for an uncommitted
 * id with the same nbytes answers the same offset and token (a retried
 * request). With spill and the SSD tier on, a blob the put area cannot take
 * now gets an IO-area region instead (evicting unpinned staged copies, oldest
 * first, if that makes room); its commit then spills it to a file. Errors:
 *   DP_EBUSY      no room now, but something will free enough in an area
 *                 that could take it: retry; *reason (static text: "pins",
 *                 "quarantine", "io jobs", "staged copies") says what;
 *   DP_EUNITFULL  no room and nothing pending will make any;
 *   DP_EPROTO     bad id, id in use, nbytes over the slab (and over the IO
 *                 area, or no spill).
 */
int dp__unit_alloc_req(dp__unit *u, const dp__wire_alloc_args *args,
                       dp__wire_alloc_res *res, const char **reason, dp_detail *d);

/*
 * This unit process's incarnation: random and non-zero, drawn at create, in
 * info and in every reply (a client tells a restarted unit by it).
 */
uint64_t dp__unit_incarnation(const dp__unit *u);

/*
 * The token of blob_id's open (uncommitted) allocation, 0 if there is none:
 * for tests and tools that write blobs into the slab themselves (they stamp it
 * with dp__blob_header_set_alloc).
 */
uint64_t dp__unit_alloc_token(dp__unit *u, const char *blob_id, size_t id_len);

/*
 * Publish blob_id whose WRITE is done: validate its embedded index over the
 * allocation (TOCTOU-safe copy), check that its header names this very
 * allocation (this unit's incarnation and the alloc's token: otherwise the
 * bytes are stale or were meant for another unit process), check every key
 * belongs to this unit, then
 * install all its keys at once; a key that pointed at another blob drops that
 * blob's ref. *state: DONE (also when already published), LOST (unknown id:
 * aborted, retired, released, or its spill failed). A blob in the IO area
 * (a spill) answers PENDING: an io job writes it to a fresh file and then
 * publishes it as a disk blob; ask again (a full io queue also answers
 * PENDING, and the job is queued by a later commit). Errors: DP_EPROTO (the blob failed
 * validation: nothing is published, the allocation stays until abort or its
 * lease), DP_ENOMEM (nothing published).
 */
int dp__unit_commit(dp__unit *u, const char *blob_id, size_t id_len,
                    dp__wire_commit_state *state, dp_detail *d);

/*
 * dp__unit_commit of a put of version ver (0: unversioned; docs/design.md,
 * "Versions"): at its validation, a key it would replace held at a higher
 * version refuses it with DP__ESTALE and that version in *stale (nothing
 * published, the region freed). A repair's copy is not refused (its keep
 * rule decides, key by key); vers (NULL or empty: none) are its entries'
 * versions, one each, where they were copied from (DP_EPROTO for another
 * put, or another count).
 */
int dp__unit_commit_ver(dp__unit *u, const char *blob_id, size_t id_len, uint64_t ver,
                        const dp__wire_u64s *vers, dp__wire_commit_state *state,
                        uint64_t *stale, dp_detail *d);

/* The largest blob an inline put may carry, and the most value bytes one
 * resolve_keys reply carries. */
#define DP_UNIT_INLINE_MAX DP_WIRE_INLINE_MAX

/*
 * An inline put (docs/design.md, "Inline values"): alloc as
 * dp__unit_alloc_req (no writer: the unit copies the bytes itself), copy
 * args->data into the region, stamp this allocation into its header, and
 * commit as dp__unit_commit. A blob that fails to commit is freed at once.
 * Errors: those of alloc (DP_EBUSY with *reason, DP_EUNITFULL) and commit
 * (DP__ESTALE with *stale, as dp__unit_commit_ver);
 * DP_EPROTO for an id already in use or a blob outside 64..DP_UNIT_INLINE_MAX
 * bytes.
 */
int dp__unit_put_inline(dp__unit *u, const dp__wire_put_args *args,
                        dp__wire_commit_state *state, const char **reason,
                        uint64_t *stale, dp_detail *d);

/*
 * Forget an uncommitted blob. in_flight: its WRITE may still run, so the region
 * is retired for good (counted in retired_bytes); otherwise freed. Unknown and
 * published blobs: no-op. A spill whose io job runs is dropped (not
 * published) when the job ends, and its region freed or retired then.
 * Never fails.
 */
void dp__unit_abort(dp__unit *u, const char *blob_id, size_t id_len, bool in_flight);

/* Result of resolve: arrays malloc'd, views valid while the unit lock is held. */
typedef struct dp__unit_resolve_res {
    char pin_id[33]; /* "" when nothing was pinned */
    dp__wire_blob_loc *blobs;
    uint32_t n_blobs;
    dp__wire_str *missing;
    uint32_t n_missing;
    dp__wire_str *pending; /* disk blobs being staged: ask again */
    uint32_t n_pending;
    dp__wire_str *failed; /* disk blobs whose stage failed */
    uint32_t n_failed;
    dp__wire_str *whole; /* of blobs: every entry still current (location hints) */
    uint32_t n_whole;
} dp__unit_resolve_res;

typedef struct dp__unit_resolve_keys_res {
    char pin_id[33];
    dp__wire_key_loc *entries;
    uint32_t n_entries;
    dp__wire_str *missing;
    uint32_t n_missing;
    dp__wire_str *pending;
    uint32_t n_pending;
    dp__wire_str *failed;
    uint32_t n_failed;
    dp__wire_str *fenced; /* no read lease: not answered (docs/design.md, "Leases") */
    uint32_t n_fenced;
} dp__unit_resolve_keys_res;

/*
 * Locate published blobs and pin them for read_pin_s (one pin for the call).
 * Unknown ids are listed as missing. A disk blob is answered only once a
 * staged copy of it is in the IO area (pinned like any other); until then it
 * is pending (the first resolve starts the stage), or failed once if the stage
 * failed (the next resolve tries again). The ids must outlive the result.
 * Errors: DP_ENOMEM, DP_ESYS (no random pin id). Free with _fini.
 */
int dp__unit_resolve_locked(dp__unit *u, const dp__wire_str *ids, uint32_t n,
                            dp__unit_resolve_res *res, dp_detail *d);
void dp__unit_resolve_res_fini(dp__unit_resolve_res *res);

/*
 * Locate "<gidx>@<field>" keys: [slab_off of the entry, len, kind, dtype,
 * shape] each, and pin their blobs. A malformed key or one owned by another
 * unit is DP_EPROTO (nothing pinned); a key not held is missing.
 */
int dp__unit_resolve_keys_locked(dp__unit *u, const dp__wire_str *keys, uint32_t n,
                                 dp__unit_resolve_keys_res *res, dp_detail *d);
/*
 * The same, carrying values in the answer (docs/design.md, "Inline values"):
 * when the bytes of every entry answered fit in inline_bytes (at most
 * DP_UNIT_INLINE_MAX), each entry gets data pointing at its bytes in the slab
 * and nothing is pinned; otherwise no entry does. Those views are valid only
 * while u->mu stays held: encode the reply before unlocking.
 */
int dp__unit_resolve_keys_inline_locked(dp__unit *u, const dp__wire_str *keys, uint32_t n,
                                        uint64_t inline_bytes,
                                        dp__unit_resolve_keys_res *res, dp_detail *d);
void dp__unit_resolve_keys_res_fini(dp__unit_resolve_keys_res *res);

/* resolve_rows' answer (wire.h, dp__wire_resolve_rows_res). */
typedef struct dp__unit_resolve_rows_res {
    char pin_id[33];
    uint8_t *locs; /* n * DP_WIRE_LOC_LEN bytes, a record per value asked */
    uint32_t n;
    dp__wire_desc *descs; /* the distinct descriptions (views into the blobs' indexes:
                             valid while u->mu stays held) */
    uint32_t n_descs;
    uint8_t *data; /* inline: every found value's bytes in the order asked, or NULL */
    uint64_t data_len;
} dp__unit_resolve_rows_res;

/*
 * Locate values asked by row and field (docs/design.md, "Resolve by row"):
 * rows holds a DP_WIRE_ROW_LEN record a value (gidx, index into fields). Each
 * value's state, offset, length and description go into a fixed-size record,
 * in the order asked; blobs are pinned as resolve_keys' are, or (inline_bytes,
 * as there) every found value is copied into data and nothing is pinned. A
 * bad field, a bad record or a row owned by another unit is DP_EPROTO
 * (nothing pinned). Encode the reply before unlocking; free with _fini.
 */
int dp__unit_resolve_rows_locked(dp__unit *u, const dp__wire_strs *fields,
                                 dp__wire_bytes rows, uint64_t inline_bytes,
                                 dp__unit_resolve_rows_res *res, dp_detail *d);
void dp__unit_resolve_rows_res_fini(dp__unit_resolve_rows_res *res);

/*
 * Request order (docs/design.md, "Request order"). A request id of the form
 * "<16 hex>-<hex counter>" names its client (the prefix) and its place among
 * that client's requests (the counter, increasing). A request older than one
 * this unit already took from the same client is stale: it travelled on a
 * connection the client gave up (a timeout, a dropped link) and arrives late,
 * after the client moved on; acting on it could undo what a later request did
 * (a clear carried out after a confirmed put of the same rows). Returns
 * DP_EPROTO (naming both counters) for a stale id, else DP_OK, and records
 * the id as the client's newest. Ids of another form are never stale. The
 * newest id again, with the same op, is a request the client sent again
 * after its connection dropped (docs/design.md, "Requests sent again"): taken
 * again when the op is safe to repeat (dp__wire_op_repeatable), counted in
 * repeats_taken.
 */
int dp__unit_order_check(dp__unit *u, const char *rid, size_t len, dp__wire_op op,
                         dp_detail *d);

/* End a pin (the reader is done). Unknown pins: no-op. */
void dp__unit_unpin(dp__unit *u, const char *pin_id, size_t len);

/* ---- repair (docs/design.md, "Repair") ---- */

enum {
    DP_UNIT_REPAIR_NONE = 0,    /* not asked for (opts.repair false) */
    DP_UNIT_REPAIR_RUNNING = 1, /* filling itself from its peers */
    DP_UNIT_REPAIR_DONE = 2,    /* every row its peers hold was copied */
    DP_UNIT_REPAIR_PARTIAL = 3, /* ended with keys it could not copy (repair_failed) */
};

/*
 * Keys the repair could not copy (its peers held them). What it copied in is
 * counted by the commits of its copies (repair_keys, repair_bytes, and
 * repair_skipped: keys the unit had, or of rows cleared meanwhile).
 */
void dp__unit_repair_failed(dp__unit *u, uint64_t failed);

/* A pass begins (docs/design.md, "Repair"): RUNNING, and it is counted. */
void dp__unit_repair_begin(dp__unit *u);

/* What the last repair or pass found: keys this unit holds that a peer sharing
 * their row lacked (every one shared with a peer it could not list). */
void dp__unit_repair_under(dp__unit *u, uint64_t keys);

/* The repair ended (DONE, or PARTIAL when keys failed); the cleared rows kept longer
 * than tomb_keep_s are forgotten.
 */
void dp__unit_repair_end(dp__unit *u);

/* A page of list_keys: keys (malloc'd views into text: free both), the row
 * after the last one (next), and whether rows remain (more). */
typedef struct dp__unit_keys_page {
    dp__wire_strs keys;
    uint64_t *vers; /* each key's version (docs/design.md, "Versions") */
    char *text;
    uint64_t next;
    bool more;
} dp__unit_keys_page;

/*
 * Keys of rows this unit holds that unit for_unit also holds a copy of, rows
 * from `from` on in gidx order, at most max_rows rows (1 .. 65536) and 65,536
 * keys (whole rows, one at least), into *pg. A repair lists its rows this way.
 */
int dp__unit_list_keys_locked(dp__unit *u, uint32_t for_unit, uint64_t from,
                              uint32_t max_rows, dp__unit_keys_page *pg, dp_detail *d);

/* Drop every field of these rows; returns the entries dropped. Idempotent. */
uint64_t dp__unit_release_rows(dp__unit *u, const uint64_t *gidxs, uint32_t n);

/*
 * A clear of version ver (docs/design.md, "Versions"; 0: unversioned, as
 * dp__unit_release_rows): when a key of these rows is held at a higher
 * version, nothing is dropped and *stale gets the highest (the client clears
 * again above it); else every key is dropped and the rows' records take ver,
 * so that commits below it are refused for tomb_keep_s.
 */
uint64_t dp__unit_release_rows_ver(dp__unit *u, const uint64_t *gidxs, uint32_t n,
                                   uint64_t ver, uint64_t *stale);

/*
 * One flat record per blob of the table (id, off, nbytes, refs, published,
 * pins, n_entries, created_at, last_resolve_at). *recs and each record's
 * fields are malloc'd (free with dp__unit_fields_free); views valid under the
 * lock.
 */
int dp__unit_scan_locked(dp__unit *u, dp__wire_fields **recs, uint32_t *n, dp_detail *d);
void dp__unit_fields_free(dp__wire_fields *recs, uint32_t n);

/*
 * The unit's counters, one table: X(field, wire name). It gives the fields of
 * dp__unit_stats, the stats reply's fields in this order (under these names:
 * tests and the CLI read them) and what the 30 s log line reports. Most are
 * counted by the unit as it goes; the rest (marked "read") are read off its
 * options, tables, allocators and writers when asked (src/unit/stats.c).
 */
#define DP_UNIT_STATS(X)                                                                 \
    X(unit_id, "unit_id")             /* read: this unit's index */                      \
    X(n_units, "n_units")             /* read */                                         \
    X(slab_bytes, "slab_bytes")       /* read: the put area */                           \
    X(blobs, "blobs")                 /* read: in the table: uncommitted + published */  \
    X(published, "published")         /* published blobs in the table */                 \
    X(rows, "rows")                   /* read: rows of the row index */                  \
    X(entries, "entries")             /* keys of the row index */                        \
    X(pins, "pins")                   /* read: live pins */                              \
    X(zombies, "zombies")             /* released blobs kept for their pins or holds */  \
    X(zombie_bytes, "zombie_bytes")   /* of those, in the put area */                    \
    X(retired_bytes, "retired_bytes") /* read: retired: a WRITE may still land there */  \
    X(n_retired, "retired")           /* read */                                         \
    X(retired_kept_bytes, "retired_kept_bytes") /* read: of those, kept for good */      \
    X(reclaimed_bytes, "reclaimed_bytes")       /* read: retired regions handed back */  \
    X(n_reclaimed, "reclaimed")                 /* read */                               \
    X(allocs_reclaimed, "allocs_reclaimed")     /* open allocations of writers gone */   \
    X(allocs_reclaimed_bytes, "allocs_reclaimed_bytes")                                  \
    X(writers, "writers") /* read: with an open allocation or retired region */          \
    X(writers_gone, "writers_gone")         /* read: of those, proved unable to write */ \
    X(identity_refused, "identity_refused") /* commits naming another allocation */      \
    X(stale_refused,                                                                     \
      "stale_refused") /* requests older than one the client sent later */               \
    X(repeats_taken, "repeats_taken")     /* requests sent again after a drop, taken */  \
    X(restart_refused, "restart_refused") /* inline puts meant for an earlier process */ \
    X(versions_refused,                                                                  \
      "versions_refused")               /* commits below a key's version ("Stale") */    \
    X(leases_expired, "leases_expired") /* allocations retired by the ticker */          \
    X(pins_expired, "pins_expired")                                                      \
    X(allocated_bytes, "allocated_bytes")     /* read: the put area's allocator */       \
    X(free_bytes, "free_bytes")               /* read */                                 \
    X(quarantined_bytes, "quarantined_bytes") /* read */                                 \
    X(largest_free, "largest_free")           /* read */                                 \
    X(n_alloc, "allocs")                                                                 \
    X(n_commit, "commits")                                                               \
    X(n_abort, "aborts")                                                                 \
    X(n_resolve, "resolves")                                                             \
    X(n_resolve_blobs, "resolves_by_blob") /* of them, by blob id (location hints) */    \
    X(n_resolve_rows, "resolves_by_row") /* of them, by row and field (resolve_rows) */  \
    X(n_put_inline, "puts_inline")       /* blobs carried in their put request */        \
    X(inline_bytes, "inline_bytes")      /* value bytes carried in resolve replies */    \
    X(n_unpin, "unpins")                                                                 \
    X(n_release, "releases")                                                             \
    X(n_busy, "busy")                                                                    \
    X(n_full, "unit_full")                                                               \
    X(n_proto, "protocol_errors")                                                        \
    X(n_ticks, "ticks")                                                                  \
    X(io_bytes, "io_bytes") /* read: the IO area, 0 without the SSD tier */              \
    X(io_allocated_bytes, "io_allocated_bytes")     /* read: the IO area's allocator */  \
    X(io_free_bytes, "io_free_bytes")               /* read */                           \
    X(io_quarantined_bytes, "io_quarantined_bytes") /* read */                           \
    X(io_jobs, "io_jobs")                           /* read: queued + running */         \
    X(disk_blobs, "disk_blobs") /* published blobs on disk (and zombies of them) */      \
    X(disk_bytes, "disk_bytes")                                                          \
    X(staged_blobs, "staged_blobs") /* disk blobs with a staged copy */                  \
    X(staged_bytes, "staged_bytes")                                                      \
    X(spills, "spills")                                                                  \
    X(spill_bytes, "spill_bytes")                                                        \
    X(spills_failed, "spills_failed")                                                    \
    X(spills_superseded, "spills_superseded") /* every key replaced before it ended */   \
    X(stages, "stages")                                                                  \
    X(stage_bytes, "stage_bytes")                                                        \
    X(stages_failed, "stages_failed")                                                    \
    X(evictions, "evictions")                                                            \
    X(files_open, "files_open")                                                          \
    X(io_zombie_bytes, "io_zombie_bytes") /* zombies' bytes in the IO area */            \
    X(saves, "saves")                                                                    \
    X(loads, "loads")                                                                    \
    X(loaded_blobs, "loaded_blobs")                                                      \
    X(admin_running, "saves_loads_running") /* read: saves and loads running now */      \
    X(ts_writes, "two_sided_writes") /* two-sided WRITEs accepted into allocations */    \
    X(ts_write_bytes, "two_sided_write_bytes")                                           \
    X(ts_reads, "two_sided_reads") /* two-sided READs accepted from pins */              \
    X(ts_read_bytes, "two_sided_read_bytes")                                             \
    X(ts_refused, "two_sided_refused")    /* refused: no such grant, out of bounds... */ \
    X(committed_bytes, "committed_bytes") /* bytes published by commits (put in) */      \
    X(resolved_bytes, "resolved_bytes")   /* bytes pinned for READs by resolves (out) */ \
    X(auth_refused, "auth_refused") /* control-plane clients refused: key not allowed */ \
    X(replicas, "replicas")         /* read: copies of each row the cluster keeps */     \
    X(repair_state, "repair_state") /* read: 0 none, 1 running, 2 done, 3 partial */     \
    X(repair_keys, "repair_keys")   /* keys a repair copied in */                        \
    X(repair_bytes, "repair_bytes")                                                      \
    X(repair_skipped, "repair_skipped") /* copies the unit had, or of rows cleared */    \
    X(repair_failed, "repair_failed")   /* keys its peers had that it could not copy */  \
    X(repair_passes, "repair_passes")   /* passes begun after the repair at start */     \
    X(under_replicated,                                                                  \
      "under_replicated")         /* keys a peer lacked at the last repair or pass */    \
    X(fenced_keys, "fenced_keys") /* keys not answered: no read lease (Leases) */        \
    X(fences, "fences")           /* units fenced at a client's request */               \
    X(lease_ok, "lease_ok")       /* read: 1 while this unit holds its read lease */     \
    X(repair_cleared, "repair_cleared") /* read: rows cleared while it repairs */

/* The counters as numbers (tests; copied under the lock). */
typedef struct dp__unit_stats {
#define DP_UNIT_STATS_FIELD(field, wire) uint64_t field;
    DP_UNIT_STATS(DP_UNIT_STATS_FIELD)
#undef DP_UNIT_STATS_FIELD
} dp__unit_stats;

/*
 * The counters as the stats reply carries them (names are static strings).
 * fields->v malloc'd: free(fields->v).
 */
int dp__unit_stats_locked(dp__unit *u, dp__wire_fields *fields, dp_detail *d);

void dp__unit_get_stats(dp__unit *u, dp__unit_stats *st);

/*
 * slab[off, off + nbytes) for the read_bytes test helper (a view; the bytes may
 * change under a concurrent WRITE). DP_EPROTO if out of the put area and the
 * IO area.
 */
int dp__unit_read_bytes_locked(dp__unit *u, uint64_t off, uint64_t nbytes,
                               const uint8_t **p, dp_detail *d);

/*
 * Maintenance: drop expired pins, retire allocations past their lease, hand
 * back the retired regions and open allocations of writers that are gone,
 * sweep the quarantine, log the counters (and the SSD counters) every 30 s when they
 * changed. Called by the ticker; tests with a fake clock call it.
 */
void dp__unit_tick(dp__unit *u);

/*
 * Check the unit's own invariants (refs match the row index, zombie and pin
 * accounting, allocator). DP_ECORRUPT with the first violation. O(n): tests.
 */
int dp__unit_check(dp__unit *u, dp_detail *d);

/* ---- checkpoints (docs/design.md, "Checkpoints") ---- */

/*
 * Paths. The control plane is trusted to name files on the unit's host: a
 * checkpoint path comes from the client and the unit opens it with its own
 * rights. It must be absolute, at most DP_UNIT_PATH_MAX bytes, with no NUL or
 * control characters. A save writes exactly two files, path and path.rows,
 * each created O_CREAT|O_EXCL under path.tmp / path.rows.tmp, fsync'd and then
 * renamed, so an existing path.tmp (a save that died) makes the save fail with
 * DP_EEXIST instead of being followed or overwritten. A load only reads. No
 * client string ever reaches an SSD tier path (spill files are random names).
 */
#define DP_UNIT_PATH_MAX 1024

/* Magic, version and layout of the two files of a shard: blob/shard.h. */

/* Result of a save; every pointer is owned by it (free with _fini). */
typedef struct dp__unit_save_res {
    dp__wire_shard_blob *blobs; /* off: in the shard file; ids point into ids */
    uint32_t n_blobs;
    uint64_t nbytes; /* the shard file's size */
    uint64_t clears_during_save;
    uint32_t shard_crc, rows_crc; /* CRC32C of each whole file as written */
    char (*ids)[DP_UNIT_ID_MAX + 1];
} dp__unit_save_res;

/*
 * save_shard: copy every live (published) blob back to back into path and the
 * keys the row index points at each of them with into path.rows. The snapshot
 * (which blobs, which of their entries are live) is taken under the unit lock;
 * the file I/O runs outside it, on the calling thread (handler.c runs it on a
 * thread of its own and answers through a deferred reply, so the unit goes on
 * answering other requests meanwhile).
 * Each snapshotted blob is held: a release meanwhile frees it only when the
 * save ends. Disk blobs are copied through a dup of their fd. Spills not yet
 * acknowledged are not published, so not saved. clears_during_save counts
 * the release_rows calls that dropped something while the file I/O ran.
 * Errors: DP_EINVAL (path), DP_EEXIST (a temporary name exists), DP_ESYS,
 * DP_ENOMEM. On error no final name is created or replaced.
 */
int dp__unit_save_shard(dp__unit *u, const char *path, size_t path_len,
                        dp__unit_save_res *res, dp_detail *d);
/*
 * save_shard as the wire asks it: a->home saves only the rows whose first
 * unit this is (gidx % n_units): a blob that also holds copies of other
 * units' rows is written as a new blob of its home rows' live entries alone,
 * under its id with ":h" (docs/design.md, "Checkpoints"); a blob of copies
 * alone is not saved. Without it, as dp__unit_save_shard.
 */
int dp__unit_save_shard_as(dp__unit *u, const dp__wire_save_shard_args *a,
                           dp__unit_save_res *res, dp_detail *d);
void dp__unit_save_res_fini(dp__unit_save_res *res);

/* Result of a load: id views into the caller's blobs array (must outlive it). */
typedef struct dp__unit_load_res {
    dp__wire_str *loaded; /* published now, or already in the table */
    uint32_t n_loaded;
    dp__wire_str *failed; /* no room: ask again (with spill) or elsewhere */
    uint32_t n_failed;
} dp__unit_load_res;

/*
 * load_shard as the wire asks it (a->path, a->blobs, a->spill): read the
 * blobs (ids, offsets and sizes as save reported them)
 * from the shard at path into fresh put-area regions and publish each with
 * only the entries path.rows lists as live. With spill and the SSD tier on, a
 * blob the put area cannot take goes to a fresh spill file (it must fit the IO
 * area to be read back). Regions are allocated under the lock, filled and
 * validated outside it; only then is everything published, under the lock.
 * Validation: both files' magic, version, lengths and CRC32C (the whole data
 * section and each blob), the unit id and cluster size (a shard of another
 * unit or of a cluster with another number of units is refused), and every
 * blob's own index (dp__blob_parse, as a commit). a->copy k > 0 (below the
 * cluster's replicas) loads instead the one-copy shard (a home save) of unit
 * (this - k) mod n_units, whose rows this unit keeps a copy of; every key of
 * it must be such a row. Any failure publishes
 * nothing and names the file and offset. Blobs already in the table count as
 * loaded. Errors: DP_EINVAL (path, request), DP_ECORRUPT (a file failed
 * validation), DP_EPROTO (a blob's index), DP_ESYS, DP_ENOMEM.
 */
int dp__unit_load_shard(dp__unit *u, const dp__wire_load_shard_args *a,
                        dp__unit_load_res *res, dp_detail *d);
void dp__unit_load_res_fini(dp__unit_load_res *res);

/* ---- read leases (lease.c; docs/design.md, "Leases") ---- */

/* lease from unit `peer` (done: the fence it caught up with): grant or deny. */
int dp__unit_lease_grant(dp__unit *u, uint64_t peer, uint64_t done,
                         dp__wire_lease_res *out, dp_detail *d);

/*
 * fence of units peers[0..n) (none this unit): they get no lease from it
 * until they catch up; *wait_ms: when the leases it granted them end.
 */
int dp__unit_fence(dp__unit *u, const uint64_t *peers, uint32_t n, uint64_t *wait_ms,
                   dp_detail *d);

/*
 * This unit's lease thread: unit `peer` answered the request sent at
 * sent_at (the unit's clock) with r; or did not (gone: its process refuses
 * connections).
 */
void dp__unit_lease_answer(dp__unit *u, uint32_t peer, double sent_at,
                           const dp__wire_lease_res *r);
void dp__unit_lease_unanswered(dp__unit *u, uint32_t peer, bool gone);

/*
 * Whether it holds its read lease now; if not, why, into why[cap]: each
 * other unit's grant ("u1 0.4s" left, "u2 behind 123", "u0 none", "u3 gone").
 */
bool dp__unit_lease_state(dp__unit *u, char *why, size_t cap);

/* Whether it runs with read leases (opts.lease_s > 0). */
bool dp__unit_lease_on(const dp__unit *u);

/* Whether it answers reads now (holds its read lease, or runs without). */
bool dp__unit_reads_ok_locked(dp__unit *u);

/* The fence of unit peer this unit has caught up with, for its next request. */
uint64_t dp__unit_lease_done(dp__unit *u, uint32_t peer);

/*
 * Catching up (the repair thread): whether a peer said this unit is behind;
 * at a pass's start the fences it must catch up with (snap: n_units
 * entries), and after a pass that read every peer, that it did.
 */
bool dp__unit_lease_behind(dp__unit *u);
void dp__unit_lease_snapshot(dp__unit *u, uint64_t *snap);
void dp__unit_lease_caught_up(dp__unit *u, const uint64_t *snap);

/* ---- control-message handler (handler.c) ---- */

/*
 * The dp_ctl_handler of a unit: ctx is the dp__unit. Decodes the request
 * (src/wire), runs the op under the unit lock and encodes the reply into
 * reply; malformed messages get a Protocol error reply when their request id
 * is readable and are dropped otherwise (and always for notify ops).
 * Threads: the control server thread (any one thread at a time per reply).
 */
void dp__unit_handle(void *ctx, const uint8_t *msg, size_t len, dp__buf *reply);

/* The dp_ctl_oversize callback: a Protocol error naming the limit. */
void dp__unit_handle_oversize(void *ctx, const uint8_t *msg, size_t len, dp__buf *reply);

/*
 * Where the unit's auth_refused counter comes from (the control server's
 * refusals; fn(src) is called under the unit lock and must not block).
 */
void dp__unit_set_auth_source(dp__unit *u, uint64_t (*fn)(const void *src),
                              const void *src);

/* ---- metrics (metrics.c) ---- */

/* Record that the unit handled op in ns nanoseconds. Threads: any. */
void dp__unit_hist_record(dp__unit *u, int op, uint64_t ns);

/*
 * The unit's counters and op latencies in the Prometheus text format
 * (version 0.0.4), appended to out: every DP_UNIT_STATS counter and gauge
 * under a dataplane_ name with its unit in the name, a histogram per control
 * op, and bytes in and out; each sample labelled with the unit's id and
 * cluster. Copies the counters under the unit lock (briefly), reads the
 * histograms without it. DP_ENOMEM. Threads: any.
 */
int dp__unit_metrics_text(dp__unit *u, dp__buf *out);

#endif
