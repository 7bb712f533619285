/*
 * dataplane client library: put, get and clear rows of named fields on a
 * cluster of storage units (docs/design.md).
 *
 * Rows are addressed by a global index gidx; row gidx lives on unit
 * units[gidx % n_units]. A row holds one value per field; a value is bytes
 * plus a description (kind, dtype, shape). A value is named by its key
 * "<gidx>@<field>", e.g. "17@input_ids".
 *
 * The client moves the bytes itself with one-sided WRITE and READ into and
 * out of the units' slabs, and talks to the units only for small control
 * messages:
 *   put:   one blob per unit; alloc on every unit at once, one WRITE per unit
 *          (all posted before any is waited for), each unit's commit sent as
 *          soon as its own WRITE is done;
 *   get:   resolve_keys on every unit at once, one READ of every value
 *          straight into its destination within the pins' lifetime, unpin;
 *   clear: release_rows on the owning units.
 *
 * Memory and copies. Values in memory this client registered
 * (dp_client_alloc, dp_client_register) are written to / read into directly:
 * a put or get then moves each byte once. So do values anywhere else when
 * their unit is on this host (its slab is mapped here: the transfer is a
 * memcpy from or into the caller's memory that ends before the call returns).
 * Towards another host, values elsewhere go through the client's registered
 * staging pool: a put copies them once into staging, a get READs into
 * staging and copies out once more. Staging memory that a
 * failed (possibly still running) transfer touches is retired for good, never
 * reused or freed.
 *
 * Errors. Every function returns 0 or a dp_err code (dataplane/err.h) and
 * fills the optional dp_detail with what went wrong, naming the unit (index
 * and address) and the rows or keys concerned:
 *   DP_EINVAL     bad arguments (nothing was sent);
 *   DP_EUNITFULL  a unit has no room and nothing will free any;
 *   DP_EBUSY      a unit stayed busy for the whole time budget (the client
 *                 retries busy units with backoff inside the budget);
 *   DP_ETIMEDOUT  no reply or transfer completion within the budget (for a
 *                 get: within the pin's life; the data is then discarded);
 *   DP_ETRANSFER  a unit is down or unreachable (its connection was refused
 *                 or dropped), or a WRITE or READ failed;
 *   DP_ERESTARTED a unit restarted (a new process answers on its address):
 *                 what it held is gone unless it loaded a checkpoint. The
 *                 client re-binds to it by itself; the operation that met the
 *                 restart fails for that unit's rows (once), the next one
 *                 works;
 *   DP_ELOST      the unit lost data it had accepted (commit answered "lost":
 *                 aborted, lease expired or spill failed; a stage from SSD
 *                 failed);
 *   DP_ENOTFOUND  get: a key is not held (never put, or cleared);
 *   DP_ETOOBIG    get: a destination is smaller than its value;
 *   DP_EPROTO     a unit rejected a request or answered something invalid;
 *   DP_EFATAL     the process is poisoned by unfinished transfers (graveyard);
 *   DP_ENOMEM, DP_ESYS as usual.
 * Batch operations also report per row (put) or per key (get) status, since
 * a batch spanning several units is not atomic: some units may take their
 * part while another fails.
 *
 * Threads. A dp_client may be used from any number of threads: it holds one
 * mutex per client, and every operation on a client (put, get, clear, stats,
 * alloc, register...) runs under it, one at a time. Use one client per thread
 * for parallelism. dp_client_close must not race with other calls on the same
 * client (dp_values_destroy excepted). Different clients are independent. A client does
 * not survive fork(): use it only in the process that opened it.
 */
#ifndef DATAPLANE_CLIENT_H
#define DATAPLANE_CLIENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dataplane/err.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dp_client dp_client;

/* ------------------------------------------------------------------ */
/* Values                                                              */
/* ------------------------------------------------------------------ */

/* What a value is. The numbers are stable (they are also the blob's kinds). */
typedef enum dp_kind {
    DP_KIND_TENSOR = 0, /* dtype required ("float32", "bfloat16", "int64"...) */
    DP_KIND_BYTES = 1,  /* raw bytes; dtype and shape optional */
    DP_KIND_OBJECT = 2, /* a serialized object; dtype and shape optional */
    /*
     * put only: this cell of the rows x fields matrix is not written; the row
     * keeps whatever it held for that field. Lets one put carry rows with
     * different sets of fields.
     */
    DP_KIND_SKIP = 3,
} dp_kind;

/* "tensor", "bytes", "object", "skip"; "?" for anything else. */
DP_API const char *dp_kind_name(dp_kind k);

/* Limits of a value's description. */
/* Field names: 1..255 bytes of UTF-8 without '@' or control characters. */
#define DP_DTYPE_MAX 32 /* bytes of a dtype: [a-z0-9_], 0..32 */
#define DP_SHAPE_MAX 32 /* dims of a shape */

/*
 * One value to put. Everything is borrowed for the duration of the call.
 * reserved: zero (calloc, `= {0}` or designated initializers do it); future
 * fields take its place, so the size and every offset stay as they are.
 */
typedef struct dp_value {
    const void *data; /* nbytes bytes; may be NULL when nbytes == 0 */
    uint64_t nbytes;
    dp_kind kind;
    const char *dtype;     /* NUL-terminated; NULL or "" allowed unless tensor */
    const uint64_t *shape; /* ndim dims; NULL allowed when ndim == 0 */
    uint32_t ndim;         /* <= DP_SHAPE_MAX */
    uint64_t reserved[2];
} dp_value;

/* A value's description as stored (filled by get; reserved comes back zero). */
typedef struct dp_value_desc {
    dp_kind kind;
    char dtype[DP_DTYPE_MAX + 1]; /* NUL-terminated, may be "" */
    uint32_t ndim;
    uint64_t shape[DP_SHAPE_MAX];
    uint64_t nbytes;
    uint64_t reserved[4];
} dp_value_desc;

/* ------------------------------------------------------------------ */
/* Connecting                                                          */
/* ------------------------------------------------------------------ */

/*
 * Options. A zeroed struct (`dp_client_opts o = {0};`, or dp_client_opts_init)
 * is valid and means the defaults: 0, false or NULL in any field leaves it at
 * its default. reserved must be zero: it is where fields added later go (so a
 * program built against this header keeps working with later libraries);
 * open refuses a non-zero reserved word (DP_EINVAL: the program was built
 * against a newer header than this library).
 */
typedef struct dp_client_opts {
    /*
     * Time budget of one operation (put, get, clear, stats), seconds: every
     * retry, poll and transfer of the operation fits inside it. 0: the
     * default, 30. At most 1e6.
     */
    double timeout_s;
    /*
     * Budget of connecting (info from every unit, adding remotes), seconds.
     * 0: the default, 30. At most 1e6.
     */
    double connect_timeout_s;
    /*
     * Registered staging memory kept cached between operations (buffers freed
     * beyond this are unmapped). 0: the default, 256 MiB (give 1 to keep
     * next to nothing). Staging grows as a batch needs; this only bounds what
     * is kept.
     */
    uint64_t staging_cache_bytes;
    /* Write a CRC32C of every payload into the blob index. Default false. */
    bool crc;
    /*
     * Do not let a unit whose RAM area is full spill the blob to its SSD tier
     * (a blob its RAM cannot take then fails the put). Default false: puts may spill,
     * and commit polls "pending" while they do.
     */
    bool no_spill;
    /*
     * Refuse to connect unless UCX is restricted to RDMA transports
     * (DP_EPOLICY; see `dataplane policy`). Default false; also switched on by
     * DP_REQUIRE_RDMA=1.
     */
    bool require_rdma;
    /*
     * Endpoint name peers see; NULL (the default): "client-<pid>-<random>".
     * 1..200 printable ASCII bytes.
     */
    const char *name;
    /*
     * CURVE authentication of the control plane: a secret key file (PATH.key
     * of `dataplane keygen`, mode 0600). NULL: $DP_CURVE_SECRET when set;
     * "": none. Units that require CURVE are reached with it when the
     * cluster file or registry gives their public keys ("pubkey").
     */
    const char *curve_secret;
    /*
     * Small values travel inside the control messages (docs/design.md,
     * "Inline values"): a put whose blob for a unit is at most this many
     * bytes goes in its request (one round trip, no WRITE), and a unit whose
     * answer to a get holds at most this many bytes of values sends them in
     * its reply (no pin, no READ). 0: the default, $DP_INLINE (a size such as 64K, or 0 /
     * off) or else 32 KiB; DP_INLINE_OFF: never. At most 1 MiB.
     */
    uint64_t inline_bytes;
    uint64_t reserved[6];
} dp_client_opts;

/* dp_client_opts.inline_bytes: no value travels inside a control message. */
#define DP_INLINE_OFF UINT64_MAX

/* Fill o with the defaults (the same as zeroing it). Threads: any. */
DP_API void dp_client_opts_init(dp_client_opts *o);

/*
 * Connect to the cluster described by a cluster file: cluster is a file or a
 * directory holding cluster.json; NULL or "" means $DP_CLUSTER, else the
 * default directory ($XDG_RUNTIME_DIR/dataplane or /tmp/dataplane-<uid>).
 * Or through a registry: cluster (or $DP_CLUSTER) is
 * "etcd://HOST:PORT[,HOST:PORT...]/NAME"; the units' records are read,
 * waiting up to opts.connect_timeout_s for all N to register (DP_ENOTFOUND
 * names the missing ones), and the client then follows them: a unit that
 * registers again with another address or incarnation is re-bound before
 * the next operation (which reports DP_ERESTARTED for it, as for a unit
 * restarted in place). etcd lost meanwhile: the client serves on with the
 * units it knows.
 * Asks every unit for its info (all at once), checks that unit i says it is
 * unit i of n, and connects the transfer endpoint to each. opts NULL: the
 * defaults. On success *out is a connected client (dp_client_close it).
 * Errors: DP_ENOTFOUND (no cluster file; d says how to start one), DP_EPROTO
 * (bad cluster file, or a unit's info disagrees with it), DP_ETIMEDOUT (a
 * unit did not answer; d names it), DP_ETRANSFER, DP_EPOLICY, DP_EINVAL,
 * DP_ENOMEM, DP_ESYS. Threads: any.
 */
DP_API int dp_client_open(const char *cluster, const dp_client_opts *opts,
                          dp_client **out, dp_detail *d);

/*
 * Connect to units given by their control addresses ("tcp://ip:port"), in
 * cluster order: addrs[i] must be unit i of n_units. For tests and launchers
 * that know the addresses. Errors as dp_client_open.
 */
DP_API int dp_client_open_units(const char *const *addrs, uint32_t n_units,
                                const dp_client_opts *opts, dp_client **out,
                                dp_detail *d);

/*
 * Disconnect and free. Memory from dp_client_alloc is unmapped (unless a
 * failed transfer may still touch it); regions from dp_client_register are
 * deregistered. NULL allowed. After it, c must not be used again.
 *
 * Values of dp_client_get_alloc keep their client alive: close with values
 * still alive disconnects from the units and deregisters the caller's regions
 * at once, but the values stay readable, and their memory (with the transfer
 * endpoint it is registered with) is freed by the last dp_values_destroy.
 * Threads: must not race with any other call on c, except dp_values_destroy
 * of its values (any thread).
 */
DP_API void dp_client_close(dp_client *c);

/* Number of units (constant after open). Threads: any. */
DP_API uint32_t dp_client_n_units(const dp_client *c);

/*
 * Unit i's control address (valid until close), NULL if i is out of range.
 * A client following a registry may change it (a unit that moved) during
 * any operation of another thread: copy it then.
 */
DP_API const char *dp_client_unit_address(const dp_client *c, uint32_t i);

/* The unit that owns row gidx: gidx % n_units. */
DP_API uint32_t dp_client_unit_of(const dp_client *c, uint64_t gidx);

/* ------------------------------------------------------------------ */
/* Memory the client can transfer to and from directly                 */
/* ------------------------------------------------------------------ */

/*
 * Allocate nbytes (> 0) of registered memory (mapped through UCX so that a
 * unit on the same host is reached through shared memory). Values put from it
 * and values got into it move without an extra copy. Free with
 * dp_client_free. Errors: DP_EINVAL, DP_ENOMEM, DP_ETRANSFER (registration
 * refused; d gives the size and the memlock limit). Threads: any (locks c).
 */
DP_API int dp_client_alloc(dp_client *c, size_t nbytes, void **out, dp_detail *d);

/*
 * Give back memory from dp_client_alloc (values from dp_client_get_alloc are
 * freed with dp_values_destroy instead). NULL allowed. Memory that a failed
 * transfer may still touch is kept (retired) instead of being reused.
 */
DP_API void dp_client_free(dp_client *c, void *p);

/*
 * Register caller-owned memory [addr, addr + nbytes) so puts from it and gets
 * into it need no staging copy. The caller keeps it alive until
 * dp_client_deregister (or close). Note: on one host, memory that UCX did not
 * allocate may not be reachable through shared memory; prefer
 * dp_client_alloc there. Errors: DP_EINVAL, DP_EEXIST (overlaps a registered
 * region), DP_ETRANSFER.
 */
DP_API int dp_client_register(dp_client *c, void *addr, size_t nbytes, dp_detail *d);

/*
 * Deregister a region registered at addr. Errors: DP_ENOTFOUND, DP_EBUSY (a
 * failed transfer may still touch it: it stays registered for good and the
 * caller must not reuse or free it).
 */
DP_API int dp_client_deregister(dp_client *c, void *addr, dp_detail *d);

/*
 * True if a transfer of this process that failed without finishing (a put or
 * get that returned DP_ETIMEDOUT or DP_ETRANSFER) may still read or write
 * [p, p + nbytes): such memory must never be reused or freed. False means no
 * unfinished transfer touches it. Threads: any.
 */
DP_API bool dp_client_touches_unfinished(const dp_client *c, const void *p,
                                         size_t nbytes);

/* ------------------------------------------------------------------ */
/* Operations                                                          */
/* ------------------------------------------------------------------ */

/*
 * Where a value landed: a location hint (dp_client_put_locs fills them, a
 * get takes them back). With hints, a get pins whole blobs by id and READs
 * at once, instead of asking the unit to look up every key. A hint is only
 * ever a shortcut: one whose blob no longer holds the key's current value
 * (overwritten, cleared, the unit restarted or re-loaded another checkpoint),
 * or that names another key or unit, is not used and the key is looked up
 * as without it, so a stale hint never gives a wrong answer. A hint is
 * sealed: seal is a 64-bit hash of its key and every byte before it, so a
 * hint given with another key or changed in any byte is not used either
 * (counted in loc_misses). Hints are plain bytes (128, no pointers): they may
 * be stored, copied and handed to another process of the same cluster.
 * blob[0] == '\0': no location (nothing landed, or a cell skipped).
 * docs/design.md, "Location hints".
 */
#define DP_LOC_BLOB_MAX 39 /* bytes of a blob id */
#define DP_LOC_DIMS 4      /* dims a hint keeps; more: no description kept */
#define DP_LOC_DTYPE_MAX 15
typedef struct dp_loc {
    char blob[DP_LOC_BLOB_MAX + 1];   /* the blob's id, NUL-terminated; "" = none */
    uint64_t off;                     /* the value's offset inside its blob */
    uint64_t nbytes;                  /* its size */
    uint32_t unit;                    /* the unit holding it (gidx % n_units) */
    uint32_t key_crc;                 /* CRC32C of its key */
    uint8_t kind;                     /* dp_kind */
    uint8_t ndim;                     /* <= DP_LOC_DIMS; DP_LOC_NO_DESC: not kept */
    char dtype[DP_LOC_DTYPE_MAX + 1]; /* NUL-terminated (a longer dtype: no desc) */
    uint8_t pad[6];
    uint64_t shape[DP_LOC_DIMS];
    uint64_t seal; /* hash of the key and the bytes above (a put makes it) */
} dp_loc;
#define DP_LOC_NO_DESC 0xff

/*
 * Put a batch: n_rows rows (gidxs, no duplicates) x n_fields fields (names,
 * no duplicates); values[r * n_fields + f] is row r's value of field f (kind
 * DP_KIND_SKIP leaves that cell out). Rows of one field may differ in shape
 * and size (0 bytes to the unit's area size). A key that already holds a
 * value is overwritten; readers see the old or the new value, never a mix.
 *
 * One blob per unit: alloc on every unit at once, WRITE every blob at once,
 * each unit's commit sent when its own WRITE is done, the replies awaited
 * together ("pending": polled). Busy units are retried
 * with backoff within opts.timeout_s. A unit whose WRITE failed gets an abort
 * (its region is retired by the unit).
 *
 * row_status (NULL, or n_rows entries) gets 0 for every row that landed and
 * the error code of its unit's part otherwise (every row gets the code when
 * the put was refused before anything was sent). Returns DP_OK when every row
 * landed; else the first failing unit's code, with d naming the unit(s) and
 * the rows that did not land (a list, cut when long). Rows of other units
 * did land. Errors: DP_EINVAL (bad field, key, dtype or shape, duplicate
 * row or field: nothing sent), and the codes of the header comment.
 * Threads: any (locks c).
 */
DP_API int dp_client_put(dp_client *c, const uint64_t *gidxs, size_t n_rows,
                         const char *const *fields, size_t n_fields,
                         const dp_value *values, int *row_status, dp_detail *d);

/*
 * dp_client_put, and locs (n_rows x n_fields entries, in the order of values)
 * gets each value's location hint: filled for every cell of a row that
 * landed, blob "" for skipped cells and rows that did not land.
 */
DP_API int dp_client_put_locs(dp_client *c, const uint64_t *gidxs, size_t n_rows,
                              const char *const *fields, size_t n_fields,
                              const dp_value *values, int *row_status, dp_loc *locs,
                              dp_detail *d);

/* One value to get (dp_client_get). reserved: zero, as in dp_value. */
typedef struct dp_get_item {
    const char *key;     /* in: "<gidx>@<field>", NUL-terminated */
    void *dst;           /* in: destination of cap bytes (NULL allowed when cap == 0) */
    uint64_t cap;        /* in */
    dp_value_desc *desc; /* in: NULL, or where to store kind, dtype, shape */
    uint64_t nbytes;     /* out: the value's size (also when it did not fit) */
    int status;          /* out: 0, DP_ENOTFOUND, DP_ETOOBIG, DP_ELOST, ... */
    const dp_loc *loc;   /* in: NULL, or this key's location hint from a put */
    uint64_t reserved[1];
} dp_get_item;

/*
 * Get a batch of values into caller buffers. resolve_keys on every unit at
 * once (keys being staged from SSD are asked again within the budget), one
 * READ of every value at once with a deadline inside the pins' lifetime,
 * then unpin. A destination inside memory registered with c (dp_client_alloc,
 * dp_client_register), or any destination when the value's unit is on this
 * host, is READ into directly; any other destination goes through staging
 * (one more copy).
 *
 * Per item: status 0 and nbytes on success; DP_ENOTFOUND if the key is not
 * held; DP_ETOOBIG if cap < nbytes (nothing copied; nbytes says what is
 * needed, so cap 0 asks only for the size and description); the unit's
 * error otherwise (DP_ETRANSFER, DP_ETIMEDOUT, DP_ELOST...). Returns DP_OK
 * when every item succeeded, else the code of the first failed item, with d
 * listing the missing keys by name (cut when long) and naming failed units.
 * Keys may repeat. Errors: DP_EINVAL (a malformed key or location hint;
 * nothing sent). Items with a location hint (loc) skip the lookup when every
 * key of their unit has one (see dp_loc); loc_misses counts hints not used.
 * Threads: any (locks c).
 */
DP_API int dp_client_get(dp_client *c, dp_get_item *items, size_t n, dp_detail *d);

/*
 * Values fetched by dp_client_get_alloc: opaque, freed with dp_values_destroy.
 * They keep the client that made them alive (see dp_client_close).
 */
typedef struct dp_values dp_values;

/*
 * Get a batch of values into memory the library allocates (registered memory
 * of c, so the READ lands in place). *out is set even when some keys failed
 * (look at each one's status); NULL only when nothing could be tried (EINVAL,
 * ENOMEM, ...). Return codes as dp_client_get. Threads: any (locks c).
 */
DP_API int dp_client_get_alloc(dp_client *c, const char *const *keys, size_t n,
                               dp_values **out, dp_detail *d);

/* dp_client_get_alloc with location hints: locs NULL, or n entries (each
 * one's blob "" where a key has none). */
DP_API int dp_client_get_alloc_locs(dp_client *c, const char *const *keys,
                                    const dp_loc *locs, size_t n, dp_values **out,
                                    dp_detail *d);

/* Number of values (the n given to get_alloc). */
DP_API size_t dp_values_count(const dp_values *v);

/*
 * Value i: returns its status (0 or the error, as dp_get_item.status); on 0,
 * *data / *nbytes / *desc (each NULL allowed) give its bytes (valid until
 * dp_values_destroy) and description.
 */
DP_API int dp_values_get(const dp_values *v, size_t i, const void **data,
                         uint64_t *nbytes, const dp_value_desc **desc);

/*
 * Free the values: their memory goes back to the client that made them, or,
 * when that client was closed and these were its last values, the client's
 * remains are freed. NULL allowed. Threads: any.
 */
DP_API void dp_values_destroy(dp_values *v);

/*
 * Clear rows: every field of each gidx is dropped on its unit
 * (release_rows, all units at once). Idempotent: unknown rows are fine.
 * *dropped (NULL allowed) gets the number of values dropped. A unit that
 * failed is named in d with its rows; the other units' rows are cleared.
 * Threads: any (locks c).
 */
DP_API int dp_client_clear(dp_client *c, const uint64_t *gidxs, size_t n,
                           uint64_t *dropped, dp_detail *d);

/*
 * Check a key as a get checks it: key[0..len) (not NUL-terminated) must be
 * "<gidx>@<field>" (the rules of docs/design.md, "Keys and blobs"); *gidx
 * (NULL allowed) gets its row. Returns DP_OK, or DP_EINVAL with a detail
 * that quotes the key and says what is wrong. For bindings whose keys reach
 * no put or get (a clear of the rows that keys name). Threads: any.
 */
DP_API int dp_key_check(const char *key, size_t len, uint64_t *gidx, dp_detail *d);

/* ------------------------------------------------------------------ */
/* Stats                                                               */
/* ------------------------------------------------------------------ */

/* Counters of every unit (dp_client_stats_get); opaque. */
typedef struct dp_client_stats dp_client_stats;

/*
 * Ask every unit for its counters at once. *out is set even when some units
 * failed (dp_client_stats_status says which); the return code is the first
 * unit's failure, with d naming it. Threads: any (locks c).
 */
DP_API int dp_client_stats_get(dp_client *c, dp_client_stats **out, dp_detail *d);

/* Number of units in s. */
DP_API uint32_t dp_client_stats_units(const dp_client_stats *s);

/* 0 if unit answered, else its error code (its counters are then empty). */
DP_API int dp_client_stats_status(const dp_client_stats *s, uint32_t unit);

/* Number of counters of unit (0 for a failed or out-of-range unit). */
DP_API size_t dp_client_stats_count(const dp_client_stats *s, uint32_t unit);

/*
 * Counter i of unit: *name (valid until destroy) and *value. Counters that are
 * not numbers (text) are skipped by the listing. Returns false when out of
 * range.
 */
DP_API bool dp_client_stats_at(const dp_client_stats *s, uint32_t unit, size_t i,
                               const char **name, double *value);

/* The counter called name of unit, as a double; false if absent. */
DP_API bool dp_client_stats_find(const dp_client_stats *s, uint32_t unit,
                                 const char *name, double *value);

/* NULL allowed. */
DP_API void dp_client_stats_destroy(dp_client_stats *s);

/*
 * This client's own counters (not the units'): what it did to stay correct
 * across unit restarts and outages. The struct grows into its reserved tail
 * (filled with zeros today); fields keep their places.
 */
typedef struct dp_client_counters {
    uint64_t restarts_seen;      /* unit restarts noticed (a new incarnation answered) */
    uint64_t rebinds;            /* data paths re-bound (after a restart or a failed
                                    transfer endpoint) */
    uint64_t units_down;         /* operation parts failed because a unit was down or
                                    unreachable */
    uint64_t transfers_retained; /* this process's transfers kept in the graveyard
                                    (they may still touch their memory), now */
    uint64_t transfers_released; /* retained transfers that ended later, released */
    uint64_t retained_bytes;     /* memory those retained transfers keep, now */
    uint64_t staged_put_bytes;   /* value bytes puts copied into staging (values
                                    outside registered memory, to units on
                                    another host; not inline puts, whose values
                                    are copied into the request) */
    uint64_t staged_get_bytes;   /* value bytes gets copied out of staging
                                    (destinations outside registered memory,
                                    from units on another host; not values that
                                    came inline in a reply) */
    uint64_t puts;               /* dp_client_put calls that moved something */
    uint64_t put_bytes;          /* value bytes of those calls' rows that landed */
    uint64_t gets;               /* dp_client_get / _get_alloc calls */
    uint64_t get_bytes;          /* value bytes they returned */
    uint64_t clears;             /* dp_client_clear calls */
    uint64_t retries;            /* backoff rounds: a unit busy, keys pending */
    uint64_t busy_waits;         /* requests a unit answered Busy (then retried) */
    uint64_t loc_misses;         /* values a get had a hint for but looked up by key
                                    (stale: overwritten, cleared, unit restarted) */
} dp_client_counters;

/* Fill *out. Threads: any (locks c). DP_EINVAL for NULL arguments. */
DP_API int dp_client_counters_get(dp_client *c, dp_client_counters *out);

/*
 * Control requests this client sent again because the connection that carried
 * them dropped before the reply (only requests safe to repeat; see
 * docs/design.md, "Requests sent again"), so far. 0 for NULL. Threads: any.
 */
DP_API uint64_t dp_client_requests_resent(dp_client *c);

/*
 * Copies of each row the cluster keeps (its units' --replicas; 1 before any
 * unit answered, and for NULL). Row g lives on units g % N, (g + 1) % N, ...
 * (docs/design.md, "Replicas"). Threads: any.
 */
DP_API uint32_t dp_client_replicas(dp_client *c);

/*
 * Rows this client's puts landed on fewer than all their units because a
 * unit's process was gone, or (read leases) a unit did not answer and most
 * units fenced it (a row is counted once per put that left it short), so
 * far. 0 for NULL. Threads: any.
 */
DP_API uint64_t dp_client_under_replicated_rows(dp_client *c);

/*
 * How this client's data path reaches unit `unit`, as one line into
 * buf[0..cap): the lane class (shm, rdma, tcp), the path (one-sided: UCX
 * put/get; two-sided: messages the unit receives and sends itself, where the
 * lane has no native RMA) and the UCX transports, e.g. "tcp two-sided (tcp)"
 * or "shm one-sided (posix,sysv)". A unit not bound yet reads "? one-sided ()".
 * Threads: any (locks c). Errors: DP_EINVAL (NULL, cap 0, a unit out of range,
 * a control-only client).
 */
DP_API int dp_client_unit_path(dp_client *c, uint32_t unit, char *buf, size_t cap);

#ifdef __cplusplus
}
#endif
#endif
