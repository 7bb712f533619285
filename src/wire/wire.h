/*
 * The control-message codec: every request and reply that clients and storage
 * units exchange over ZMQ (docs/design.md, "Wire protocol"), as typed C structs.
 *
 *   request = [op: str, request_id: str, args: map]
 *   reply   = [request_id: str, ok: bool, result | error, incarnation: uint]
 *   error   = {"kind": str, "msg": str, "reason": str|nil, "blobs": [str]|nil}
 *
 * Encoders append one message to a dp__buf. Decoders read untrusted bytes through
 * the bounds-checked reader of mp.h and hand back validated C values: a handler
 * never sees a raw msgpack object.
 *
 * Memory model. Decoded strings and bins are views into the message bytes
 * (pointer + length, NOT NUL-terminated): the message must outlive the decoded
 * struct. Lists go into arrays the decoder allocates (bounded by the limits) and
 * that dp__wire_request_fini() / dp__wire_reply_fini() free. A decoded view is
 * never NULL: an empty or nil string is {"", 0}.
 *
 * Strictness. Argument maps (read by the unit) are strict: an unknown key, a
 * duplicate key, a missing required key or a value of the wrong type is a
 * Protocol error whose detail names the op and the key; clients and units ship
 * together, so an unknown key is a client bug, not a newer client. Result and
 * error maps (read by the client) skip unknown keys so a unit can add fields
 * without breaking older clients; duplicate and missing required keys are
 * still errors. Maps keyed by data (blob ids, keys) come back as arrays in wire
 * order; duplicates there are not detected (the consumer decides).
 *
 * Errors. Every decoding failure is DP_EPROTO, or DP_ETOOBIG when a size or
 * count is over a limit (message size, list lengths, the list-item budget,
 * alloc nbytes / n_entries, read_bytes nbytes); the detail names the field and
 * the limit. Encoders fail only with DP_ENOMEM, DP_EINVAL (bad op) or
 * DP_ETOOBIG (message over max_msg); they trust ids, keys and paths (the peer
 * validates them; dp__wire_check_id() is there for callers that generate ids)
 * but sanitise free text (error messages, addresses) so the peer accepts it.
 *
 * Threads: everything here is pure, reentrant logic with no I/O; a struct or
 * buffer belongs to one thread at a time. dp__wire_rid_next() may be called from
 * several threads on one generator.
 */
#ifndef DP_WIRE_WIRE_H
#define DP_WIRE_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/common.h"

/* ---- strings ---- */

/* A string view: p is never NULL in decoded values and not NUL-terminated. */
typedef struct dp__wire_str {
    const char *p;
    uint32_t n;
} dp__wire_str;

typedef struct dp__wire_bytes {
    const uint8_t *p;
    uint32_t n;
} dp__wire_bytes;

typedef struct dp__wire_strs {
    dp__wire_str *v;
    uint32_t n;
} dp__wire_strs;

typedef struct dp__wire_u64s {
    uint64_t *v;
    uint32_t n;
} dp__wire_u64s;

/* printf("%.*s", DP_WIRE_STR_ARG(s)) */
#define DP_WIRE_STR_ARG(s) (int)(s).n, (s).p

/* A view of NUL-terminated z (NULL gives ""). */
dp__wire_str dp__wire_s(const char *z);
/* True if s holds exactly the bytes of NUL-terminated z. */
bool dp__wire_str_eq(dp__wire_str s, const char *z);
bool dp__wire_str_same(dp__wire_str a, dp__wire_str b);
/*
 * Copy s into out[cap] NUL-terminated, truncated to cap - 1 bytes. Returns s.n:
 * the copy is complete when the result is < cap (strlcpy semantics).
 */
size_t dp__wire_str_copy(dp__wire_str s, char *out, size_t cap);
/* A malloc'd NUL-terminated copy (free() it), NULL on out of memory. */
char *dp__wire_str_dup(dp__wire_str s);

/* True if p[0..n) is well-formed UTF-8 (no overlongs, surrogates or > U+10FFFF). */
bool dp__wire_utf8_valid(const void *p, size_t n);

/* ---- limits ---- */

typedef struct dp__wire_limits {
    uint64_t max_msg;     /* bytes of one message (64 MiB); DP_ETOOBIG */
    uint32_t max_list;    /* elements of one list or data-keyed map (1 << 20); ETOOBIG */
    uint32_t max_items;   /* list elements (and dims) in one message (1 << 23); ETOOBIG */
    uint32_t max_id;      /* blob, pin and request ids, bytes (64) */
    uint32_t max_key;     /* "<gidx>@<field>" keys, bytes (20 + 1 + 255) */
    uint32_t max_path;    /* paths, bytes (PATH_MAX - 1) */
    uint32_t max_text;    /* other strings: messages, dtypes, addresses (4096) */
    uint32_t max_dims;    /* dims of one shape (32) */
    uint32_t max_fields;  /* fields of one scan record or of stats (4096) */
    uint64_t max_entries; /* alloc n_entries (1 << 20); ETOOBIG */
    uint64_t max_size;    /* sizes, offsets, counts must be < this (2^62) */
    uint64_t max_read;    /* read_bytes nbytes (16 MiB); ETOOBIG */
} dp__wire_limits;

/* The defaults above. Every function taking limits accepts NULL for them. */
extern const dp__wire_limits dp__wire_limits_default;
void dp__wire_limits_init(dp__wire_limits *lim);

/*
 * Validators shared with callers. what names the value in the detail.
 * An id is 1..max_id bytes of [A-Za-z0-9_.:-] (the id rule of common.h,
 * dp__id_bad_byte: no '/', NUL or control bytes, as ids are client-generated
 * and may end up in logs and file names). A key is
 * 1..max_key bytes of UTF-8 without NUL (its syntax is checked by src/blob).
 * A path is 1..max_path bytes of UTF-8 without NUL. Text is 0..max_text bytes of
 * UTF-8 without NUL. All fail with DP_EPROTO.
 */
int dp__wire_check_id(dp__wire_str s, const dp__wire_limits *lim, const char *what,
                      dp_detail *d);
int dp__wire_check_key(dp__wire_str s, const dp__wire_limits *lim, const char *what,
                       dp_detail *d);
int dp__wire_check_path(dp__wire_str s, const dp__wire_limits *lim, const char *what,
                        dp_detail *d);
int dp__wire_check_text(dp__wire_str s, const dp__wire_limits *lim, const char *what,
                        dp_detail *d);

/* ---- ops ---- */

/* X(NAME, "wire name", is_notify) */
#define DP_WIRE_OPS(X)                                                                   \
    X(PING, "ping", false)                                                               \
    X(INFO, "info", false)                                                               \
    X(ALLOC, "alloc", false)                                                             \
    X(COMMIT, "commit", false)                                                           \
    X(ABORT, "abort", true)                                                              \
    X(RESOLVE, "resolve", false)                                                         \
    X(RESOLVE_KEYS, "resolve_keys", false)                                               \
    X(UNPIN, "unpin", true)                                                              \
    X(RELEASE_ROWS, "release_rows", false)                                               \
    X(SCAN, "scan", false)                                                               \
    X(STATS, "stats", false)                                                             \
    X(READ_BYTES, "read_bytes", false)                                                   \
    X(SAVE_SHARD, "save_shard", false)                                                   \
    X(LOAD_SHARD, "load_shard", false)                                                   \
    X(PUT, "put", false)                                                                 \
    X(LIST_KEYS, "list_keys", false)                                                     \
    X(LEASE, "lease", false)                                                             \
    X(FENCE, "fence", false)                                                             \
    X(RESOLVE_ROWS, "resolve_rows", false)

typedef enum dp__wire_op {
    DP_WIRE_OP_NONE = -1, /* not (yet) known */
#define DP_WIRE_OP_ENUM_(name, str, notify) DP_WIRE_OP_##name,
    DP_WIRE_OPS(DP_WIRE_OP_ENUM_)
#undef DP_WIRE_OP_ENUM_
        DP_WIRE_OP_COUNT_
} dp__wire_op;

/* "alloc", ...; "?" for anything else. */
const char *dp__wire_op_name(dp__wire_op op);
/* The op named s, or DP_WIRE_OP_NONE. */
dp__wire_op dp__wire_op_parse(dp__wire_str s);
/* unpin and abort: the unit sends no reply. False for invalid ops. */
bool dp__wire_op_is_notify(dp__wire_op op);
/*
 * A request of this op may be sent again when the connection that carried it
 * dropped before the reply (the unit may or may not have carried it out):
 * carrying it out twice answers as once would have, or leaves only what a
 * lease reclaims. docs/design.md, "Requests sent again", says why for each.
 */
bool dp__wire_op_repeatable(dp__wire_op op);

/* ---- request ids ---- */

/* Enough for any generated id and its NUL. */
#define DP_WIRE_RID_MAX 40

/*
 * Request ids for one client: a random 64-bit prefix fixed at init and a
 * counter, "<16 hex>-<counter hex>". Unique per generator without a syscall
 * per request; the random prefix tells clients (and restarts) apart.
 */
typedef struct dp__wire_rid_gen {
    char prefix[17];
    uint64_t next; /* atomically incremented */
} dp__wire_rid_gen;

/* Fails only if the OS gives no random bytes (DP_ESYS). */
int dp__wire_rid_gen_init(dp__wire_rid_gen *g, dp_detail *d);
/* Write the next id into out and return its view (valid as long as out). Thread-safe. */
dp__wire_str dp__wire_rid_next(dp__wire_rid_gen *g, char out[DP_WIRE_RID_MAX]);

/* ---- arguments, one struct per op (ping, info, scan, stats take none) ---- */

/*
 * alloc. The writer fields say who will WRITE the region (optional: absent or
 * empty means unknown, and the unit then never reclaims the region if it is
 * retired): writer is the client's id, pid its process id, host the client's
 * host key (dp__host_key: boot id and pid namespace), lane how its RMA reaches
 * this unit ("shm", "rdma", "tcp"). See docs/design.md, "Reclaiming retired
 * memory".
 */
typedef struct dp__wire_alloc_args {
    dp__wire_str blob_id;
    uint64_t nbytes;     /* 1 .. max_size - 1 (ETOOBIG) */
    uint64_t n_entries;  /* 0 .. max_entries (ETOOBIG) */
    bool spill;          /* optional, default true */
    dp__wire_str writer; /* optional id, "" when unknown */
    uint64_t pid;        /* optional, 0 when unknown */
    dp__wire_str host;   /* optional text */
    dp__wire_str lane;   /* optional text */
    /* optional, default false: the writer moves its bytes two-sided (docs/design.md,
     * "Two-sided transfers"), so nothing lands in the region but what this unit
     * receives itself, and an expired lease may free it instead of retiring it */
    bool two_sided;
    /* optional, default false: a repair's copy (docs/design.md, "Repair"): its
     * commit publishes only keys the unit lacks, of rows not cleared since the
     * unit started repairing */
    bool repair;
} dp__wire_alloc_args;

typedef struct dp__wire_commit_args {
    dp__wire_str blob_id;
    /* optional, 0: unversioned. The put's version (docs/design.md, "Versions"):
     * a key held at a higher version refuses the commit ("Stale"). */
    uint64_t ver;
    /* optional, a repair's copy only: each entry's version, in index order
     * (the versions its keys had where they were copied from); empty: none */
    dp__wire_u64s vers;
} dp__wire_commit_args;

/*
 * put: a small blob carried inside the request (docs/design.md, "Inline
 * values"): the unit allocates, copies, stamps the allocation into the
 * header and commits, as alloc + WRITE + commit would. The answer is
 * commit's; "pending" (a spill) is polled with commit.
 */
/* The most an inline put's blob, or the values of one resolve_keys reply, may
 * carry: such a request holds a unit's control thread for its copy. */
#define DP_WIRE_INLINE_MAX (1u << 20)

typedef struct dp__wire_put_args {
    dp__wire_str blob_id;
    dp__wire_bytes data; /* the whole blob (its size is the allocation's) */
    uint64_t n_entries;  /* 0 .. max_entries (ETOOBIG); 0: not announced */
    bool spill;          /* optional, default true */
    /* optional, 0: any. The unit process the client's view is bound to: another
     * one refuses the put (a restarted unit stores nothing of it). */
    uint64_t incarnation;
    bool repair;        /* optional, default false: as alloc's */
    uint64_t ver;       /* optional, 0: unversioned; as commit's */
    dp__wire_u64s vers; /* optional, a repair's copy only: as commit's */
} dp__wire_put_args;

typedef struct dp__wire_abort_args {
    dp__wire_str blob_id;
    bool in_flight; /* optional, default true */
} dp__wire_abort_args;

typedef struct dp__wire_resolve_args {
    dp__wire_strs blob_ids;
} dp__wire_resolve_args;

typedef struct dp__wire_resolve_keys_args {
    dp__wire_strs keys;
    /* optional, default 0: when all the values answered fit in this many bytes,
     * the reply carries them itself, unpinned (docs/design.md, "Inline values") */
    uint64_t inline_bytes;
} dp__wire_resolve_keys_args;

/*
 * resolve_rows (proto 6): a get's lookup by row and field, its per-value
 * arrays in a fixed binary layout (docs/design.md, "Resolve by row"). rows
 * holds one DP_WIRE_ROW_LEN record a value: its gidx (u64 LE) and the index
 * (u32 LE) of its field in fields; the unit answers the values in that order.
 */
#define DP_WIRE_ROW_LEN 12
/* The most distinct fields one resolve_rows names. */
#define DP_WIRE_FIELDS_MAX 4096

typedef struct dp__wire_resolve_rows_args {
    dp__wire_strs fields;  /* 1 .. DP_WIRE_FIELDS_MAX field names (key rules) */
    dp__wire_bytes rows;   /* n * DP_WIRE_ROW_LEN bytes, n >= 1 */
    uint64_t inline_bytes; /* optional, default 0: as resolve_keys' */
} dp__wire_resolve_rows_args;

typedef struct dp__wire_unpin_args {
    dp__wire_str pin_id;
} dp__wire_unpin_args;

typedef struct dp__wire_release_rows_args {
    dp__wire_u64s gidxs; /* any u64 */
    /* optional, 0: unversioned (drops every key of the rows). The clear's
     * version (docs/design.md, "Versions"): a key held at a higher one refuses
     * the whole clear ("Stale"); commits below it are refused after it. */
    uint64_t ver;
} dp__wire_release_rows_args;

typedef struct dp__wire_read_bytes_args {
    uint64_t off;    /* < max_size */
    uint64_t nbytes; /* 0 .. max_read (ETOOBIG) */
} dp__wire_read_bytes_args;

typedef struct dp__wire_save_shard_args {
    dp__wire_str path;
    /* optional (proto 5): save only the rows this unit is the first unit of
     * (gidx % n_units), one copy of each row in the cluster's files
     * (docs/design.md, "Checkpoints") */
    bool home;
} dp__wire_save_shard_args;

/*
 * list_keys: the keys of rows this unit holds that unit `unit` also holds a
 * copy of (replicas), rows from `from` on in gidx order, at most max_rows rows
 * (1 .. 65536) a reply: a repair's listing (docs/design.md, "Repair").
 */
typedef struct dp__wire_list_keys_args {
    uint64_t unit;
    uint64_t from;
    uint64_t max_rows;
    bool own; /* optional (proto 5): the unit's own repair lists it (answered
                 without a read lease: "Leases") */
} dp__wire_list_keys_args;

/*
 * lease: unit `unit` asks this unit for its read lease (docs/design.md,
 * "Leases"); `done` is the highest fence of this unit on it that its passes
 * have caught up with (0: none).
 */
typedef struct dp__wire_lease_args {
    uint64_t unit;
    uint64_t done;
} dp__wire_lease_args;

/*
 * fence: a client is landing a write without the copies on `units` (their
 * units did not answer): this unit grants them no read lease until their
 * passes catch up, and says when the leases it granted them end.
 */
typedef struct dp__wire_fence_args {
    dp__wire_u64s units;
} dp__wire_fence_args;

/* One blob of a shard file: wire form {id: [off, nbytes, refs]}. */
typedef struct dp__wire_shard_blob {
    dp__wire_str id;
    uint64_t off;    /* offset in the file, < max_size */
    uint64_t nbytes; /* < max_size */
    uint64_t refs;   /* < max_size */
} dp__wire_shard_blob;

typedef struct dp__wire_shard_blobs {
    dp__wire_shard_blob *v;
    uint32_t n;
} dp__wire_shard_blobs;

typedef struct dp__wire_load_shard_args {
    dp__wire_str path;
    dp__wire_shard_blobs blobs;
    bool spill; /* optional, default false; true also writes each blob to a fresh SSD file
                 */
    /* optional (proto 5): 0 loads this unit's own shard; k in 1 .. replicas - 1
     * the one-copy shard of unit (this - k) mod n_units, whose rows this unit
     * keeps copy k + 1 of */
    uint64_t copy;
} dp__wire_load_shard_args;

struct dp_wire_blk; /* decoder allocations, freed by the _fini functions */

typedef struct dp__wire_request {
    dp__wire_op op;
    dp__wire_str rid;
    union {
        dp__wire_alloc_args alloc;
        dp__wire_commit_args commit;
        dp__wire_put_args put;
        dp__wire_abort_args abort;
        dp__wire_resolve_args resolve;
        dp__wire_resolve_keys_args resolve_keys;
        dp__wire_unpin_args unpin;
        dp__wire_release_rows_args release_rows;
        dp__wire_read_bytes_args read_bytes;
        dp__wire_save_shard_args save_shard;
        dp__wire_load_shard_args load_shard;
        dp__wire_list_keys_args list_keys;
        dp__wire_lease_args lease;
        dp__wire_fence_args fence;
        dp__wire_resolve_rows_args resolve_rows;
    } a;
    struct dp_wire_blk *mem_;
} dp__wire_request;

/*
 * Append the request [op, rid, args] to out. The fields of req->a for req->op
 * are encoded, optional ones included. On failure out is left as it was.
 */
int dp__wire_request_encode(const dp__wire_request *req, const dp__wire_limits *lim,
                            dp__buf *out, dp_detail *d);

/*
 * Decode a request from msg[0..len) (the whole message: trailing bytes are an
 * error). On success req holds validated args; call dp__wire_request_fini().
 * On failure req->rid and req->op are still set when they could be read
 * (rid.n > 0, op != DP_WIRE_OP_NONE) so the server can answer with a Protocol
 * error carrying the id; a request whose rid could not be read is dropped, as
 * is any failed notify. req needs dp__wire_request_fini() either way.
 */
int dp__wire_request_decode(const void *msg, size_t len, const dp__wire_limits *lim,
                            dp__wire_request *req, dp_detail *d);
void dp__wire_request_fini(dp__wire_request *req);

/*
 * Read only the op and the request id, without the args. *rid is set (n > 0)
 * whenever a valid id could be read, even if the op is unknown or the message
 * is otherwise bad; *op is DP_WIRE_OP_NONE unless the op is known. Returns 0
 * when both were read.
 */
int dp__wire_request_peek(const void *msg, size_t len, const dp__wire_limits *lim,
                          dp__wire_op *op, dp__wire_str *rid, dp_detail *d);

/* ---- results ---- */

/*
 * The control protocol this code speaks (info's proto). 2: replies carry the
 * unit's incarnation, alloc answers {off, token}, blobs carry their
 * allocation's identity (blob layout version 2). 3: put, inline values. 4:
 * versions on commit and put, the "Stale" error (docs/design.md, "Versions").
 * 5: save_shard home, load_shard copy (one-copy checkpoints); lease, fence and
 * resolve_keys' fenced keys (read leases: "Leases"). 6: resolve_rows (a get's
 * lookup by row and field, per-value arrays in binary: "Resolve by row").
 */
#define DP_WIRE_PROTO 6

typedef struct dp__wire_info {
    uint64_t unit_id;
    uint64_t n_units;
    dp__wire_str zmq;        /* the unit's ROUTER address */
    dp__wire_str agent;      /* its endpoint name */
    dp__wire_bytes metadata; /* its endpoint metadata (bin) */
    uint64_t slab_bytes;
    uint64_t io_bytes;       /* optional, default 0 */
    dp__wire_str numa;       /* optional, default "" */
    uint64_t slab_addr;      /* optional: the slab's base address in the unit's
                                registered region (remote address = slab_addr + off) */
    uint64_t read_pin_ms;    /* optional: how long a resolve pins (READ deadline) */
    uint64_t incarnation;    /* optional (0: unknown): the unit process's random id */
    uint64_t proto;          /* optional (0: before versions): DP_WIRE_PROTO it speaks */
    uint64_t pid;            /* optional: the unit's process id (diagnostics) */
    dp__wire_str host;       /* optional: the unit's host key (dp__host_key) */
    dp__wire_str cluster;    /* optional: the id of the cluster it was started for ("") */
    dp__wire_str transports; /* optional: UCX transports its endpoint found ("tcp,...") */
    uint64_t lease_ms;       /* optional (0: none): its read leases ("Leases") */
    uint64_t replicas;       /* optional (0: 1): copies of each row the cluster keeps */
} dp__wire_info;

/* alloc: the region's offset and the allocation's token (the blob header names it). */
typedef struct dp__wire_alloc_res {
    uint64_t off;
    uint64_t token;
} dp__wire_alloc_res;

typedef enum dp__wire_commit_state {
    DP_WIRE_COMMIT_DONE = 0,
    DP_WIRE_COMMIT_PENDING,
    DP_WIRE_COMMIT_LOST,
} dp__wire_commit_state;

const char *dp__wire_commit_state_name(dp__wire_commit_state s);

/* resolve: {id: [off, len]} */
typedef struct dp__wire_blob_loc {
    dp__wire_str id;
    uint64_t off;
    uint64_t len;
} dp__wire_blob_loc;

typedef struct dp__wire_blob_locs {
    dp__wire_blob_loc *v;
    uint32_t n;
} dp__wire_blob_locs;

typedef struct dp__wire_resolve_res {
    dp__wire_str pin_id; /* n == 0: nil (nothing pinned) */
    dp__wire_blob_locs blobs;
    dp__wire_strs missing, pending, failed; /* blob ids */
    /* Ids in blobs every entry of which is still current (each key still maps
     * to it); optional: absent (a unit before location hints) means none. */
    dp__wire_strs whole;
} dp__wire_resolve_res;

/* resolve_keys: {key: [slab_off, len, kind, dtype, shape]}, and a sixth element,
 * the value's bytes, when the reply carries them (inline) */
typedef struct dp__wire_key_loc {
    dp__wire_str key;
    uint64_t off; /* slab offset of the entry itself */
    uint64_t len;
    dp__wire_str kind;
    dp__wire_str dtype;
    const uint64_t *shape; /* ndim dims (NULL when ndim == 0) */
    uint32_t ndim;
    dp__wire_bytes data; /* n > 0: the value itself (n == len), not pinned */
} dp__wire_key_loc;

typedef struct dp__wire_key_locs {
    dp__wire_key_loc *v;
    uint32_t n;
} dp__wire_key_locs;

typedef struct dp__wire_resolve_keys_res {
    dp__wire_str pin_id; /* n == 0: nil */
    dp__wire_key_locs entries;
    dp__wire_strs missing, pending, failed; /* keys */
    /* optional (proto 5): keys this unit does not answer for, holding no read
     * lease (it may hold older copies: docs/design.md, "Leases") */
    dp__wire_strs fenced;
} dp__wire_resolve_keys_res;

/*
 * resolve_rows' answer: locs holds one DP_WIRE_LOC_LEN record a value asked,
 * in the order asked: the value's slab offset (u64 LE), its length (u64 LE),
 * its state (u32 LE, dp__wire_row_state) and, when found, the index (u32 LE)
 * of its description in descs (each distinct description once). data, when
 * not empty, carries every found value's bytes, one after another in the
 * order asked (inline: nothing pinned).
 */
#define DP_WIRE_LOC_LEN 24

typedef enum dp__wire_row_state {
    DP_WIRE_ROW_FOUND = 0,
    DP_WIRE_ROW_MISSING,
    DP_WIRE_ROW_PENDING, /* being staged from SSD: ask again */
    DP_WIRE_ROW_FAILED,  /* staging from SSD failed */
    DP_WIRE_ROW_FENCED,  /* not answered: no read lease ("Leases") */
    DP_WIRE_ROW_STATES_
} dp__wire_row_state;

/* A value's description: wire form [kind, dtype, shape]. */
typedef struct dp__wire_desc {
    dp__wire_str kind;
    dp__wire_str dtype;
    const uint64_t *shape; /* ndim dims (NULL when ndim == 0) */
    uint32_t ndim;
} dp__wire_desc;

typedef struct dp__wire_descs {
    dp__wire_desc *v;
    uint32_t n;
} dp__wire_descs;

typedef struct dp__wire_resolve_rows_res {
    dp__wire_str pin_id; /* n == 0: nil */
    dp__wire_bytes locs;
    dp__wire_descs descs;
    dp__wire_bytes data; /* optional: empty, nothing inline */
} dp__wire_resolve_rows_res;

/* A scalar of a generic record (scan) or counter map (stats). */
typedef enum dp__wire_scalar_type {
    DP_WIRE_NIL = 0,
    DP_WIRE_BOOL,
    DP_WIRE_U64,
    DP_WIRE_I64, /* negative integers only, as decoded */
    DP_WIRE_F64,
    DP_WIRE_STR,
} dp__wire_scalar_type;

typedef struct dp__wire_field {
    dp__wire_str name;
    dp__wire_scalar_type type;
    union {
        bool b;
        uint64_t u;
        int64_t i;
        double f;
        dp__wire_str s;
    } v;
} dp__wire_field;

/* A flat map name -> scalar, in wire order. */
typedef struct dp__wire_fields {
    dp__wire_field *v;
    uint32_t n;
} dp__wire_fields;

/* The field called name, or NULL. */
const dp__wire_field *dp__wire_fields_get(const dp__wire_fields *f, const char *name);
/* Its value as a number (bool, u64, i64 >= 0 or an integral f64 >= 0), else false. */
bool dp__wire_fields_u64(const dp__wire_fields *f, const char *name, uint64_t *out);

typedef struct dp__wire_scan_res {
    dp__wire_fields *recs; /* one flat map per blob: id, off, nbytes, refs, ... */
    uint32_t n;
} dp__wire_scan_res;

typedef struct dp__wire_save_shard_res {
    dp__wire_shard_blobs blobs;
    uint64_t nbytes;
    uint64_t clears_during_save;
} dp__wire_save_shard_res;

typedef struct dp__wire_load_shard_res {
    dp__wire_strs loaded, failed;
} dp__wire_load_shard_res;

/* list_keys: the keys, the next row to ask from, and whether rows remain. */
typedef struct dp__wire_list_keys_res {
    dp__wire_strs keys;
    uint64_t next;
    bool more;
    dp__wire_u64s vers; /* each key's version (0: none); absent: all 0 */
} dp__wire_list_keys_res;

/* lease: granted (for lease_ms), or not: the asker is behind (fence `behind`). */
typedef struct dp__wire_lease_res {
    bool granted;
    uint64_t lease_ms;
    uint64_t behind; /* the fence the asker must catch up with (0: none) */
} dp__wire_lease_res;

/* fence: the leases this unit granted the fenced units end within wait_ms. */
typedef struct dp__wire_fence_res {
    uint64_t wait_ms;
} dp__wire_fence_res;

/* ---- errors ---- */

/*
 * A commit (or inline put) refused because a key it would replace is held at
 * a higher version (docs/design.md, "Versions"). Internal to the library: the
 * client puts the rows again above that version, and reports DP_EBUSY if they
 * keep losing.
 */
#define DP__ESTALE 8990

typedef struct dp__wire_error {
    int code;            /* DP_EUNITFULL, DP_EBUSY, DP_ELOST, DP__ESTALE or DP_EPROTO */
    dp__wire_str kind;   /* decode: as received; encode: ignored (derived from code) */
    dp__wire_str msg;    /* text */
    dp__wire_str reason; /* n == 0: nil */
    dp__wire_strs blobs; /* blob ids or keys; n == 0: nil */
    uint64_t ver;        /* "Stale": the version that refused the commit; 0: not sent */
} dp__wire_error;

/*
 * Kind names: DP_EUNITFULL "UnitFull", DP_EBUSY "Busy", DP_ELOST "Missing",
 * DP__ESTALE "Stale", any other code "Protocol". Parsing an unknown kind gives DP_EPROTO
 * (a newer unit's kind is still an error the client can report).
 */
const char *dp__wire_err_kind(int code);
int dp__wire_err_code(dp__wire_str kind);

/*
 * Fill d with what the unit said ("Busy: <msg> (reason: ...) [blobs: a, b, ...]")
 * and return e->code, for a client turning an error reply into its return value.
 */
int dp__wire_error_to_detail(const dp__wire_error *e, dp_detail *d);

/* ---- replies ---- */

typedef struct dp__wire_reply {
    dp__wire_op op; /* the op of the request: selects the member of r */
    dp__wire_str rid;
    /*
     * The incarnation of the unit process that answered (0: unknown, not sent).
     * Every reply of a unit carries it, so a client can tell a restarted unit
     * (same address, new process) from the one its data path is bound to.
     */
    uint64_t incarnation;
    bool ok;
    dp__wire_error err; /* when !ok */
    union {
        uint64_t unit_id; /* ping */
        dp__wire_info info;
        dp__wire_alloc_res alloc;
        dp__wire_commit_state commit;
        dp__wire_resolve_res resolve;
        dp__wire_resolve_keys_res resolve_keys;
        dp__wire_resolve_rows_res resolve_rows;
        uint64_t dropped; /* release_rows */
        dp__wire_scan_res scan;
        dp__wire_fields stats;
        dp__wire_bytes bytes; /* read_bytes */
        dp__wire_save_shard_res save_shard;
        dp__wire_load_shard_res load_shard;
        dp__wire_list_keys_res list_keys;
        dp__wire_lease_res lease;
        dp__wire_fence_res fence;
    } r;
    struct dp_wire_blk *mem_;
} dp__wire_reply;

/*
 * Append the reply [rid, ok, result | error, incarnation] to out: the result
 * of rep->op when rep->ok, else rep->err; the incarnation element only when
 * rep->incarnation is not 0. Notify ops have no reply (DP_EINVAL).
 */
int dp__wire_reply_encode(const dp__wire_reply *rep, const dp__wire_limits *lim,
                          dp__buf *out, dp_detail *d);

/*
 * Append an error reply [rid, false, e, incarnation] for a failure the unit
 * met (the incarnation element only when it is not 0): kind from e->code
 * (section 7, e->kind is ignored), e->msg (empty: dp_strerror(e->code)),
 * e->reason and e->blobs optional (n == 0). Text is sanitised to UTF-8 and
 * cut to max_text.
 */
int dp__wire_reply_encode_error(dp__wire_str rid, uint64_t incarnation,
                                const dp__wire_error *e, const dp__wire_limits *lim,
                                dp__buf *out, dp_detail *d);

/*
 * Decode the reply to a request of op op (the caller knows what it sent).
 * A reply of three elements (no incarnation) decodes with incarnation 0.
 * rep->ok tells a result from an error (an error reply decodes with DP_OK: the
 * unit's code is in rep->err.code). On failure rep->rid is set when it could be
 * read. Call dp__wire_reply_fini() either way.
 */
int dp__wire_reply_decode(const void *msg, size_t len, dp__wire_op op,
                          const dp__wire_limits *lim, dp__wire_reply *rep, dp_detail *d);
void dp__wire_reply_fini(dp__wire_reply *rep);

/* Read only the request id of a reply (the client matches it before decoding). */
int dp__wire_reply_peek(const void *msg, size_t len, const dp__wire_limits *lim,
                        dp__wire_str *rid, dp_detail *d);

#endif
