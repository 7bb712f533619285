/*
 * Internals shared by wire.c (strings, limits, ops, requests), wire_fields.c
 * (the field-table engine) and wire_reply.c (results, errors, replies). Not
 * for other modules.
 */
#ifndef DP_WIRE_WIRE_INT_H
#define DP_WIRE_WIRE_INT_H

#include "wire/mp.h"
#include "wire/wire.h"

/* One decoder allocation; the data follows the header (16-byte aligned). */
struct dp_wire_blk {
    struct dp_wire_blk *next;
    size_t size;
};

/* Zeroed memory linked into *head, NULL on out of memory. */
void *dp__wire_alloc(struct dp_wire_blk **head, size_t n);
void dp__wire_free_all(struct dp_wire_blk **head);

/* A growable array kept outside the chain until dp__wire_pool_finish(). */
typedef struct dp__wire_pool {
    struct dp_wire_blk *b;
    size_t n, cap, esz;
} dp__wire_pool;

void *dp__wire_pool_push(dp__wire_pool *p); /* zeroed element, NULL on OOM */
void *dp__wire_pool_finish(dp__wire_pool *p, struct dp_wire_blk **head);
void dp__wire_pool_drop(dp__wire_pool *p);

/* Decoding state of one message. */
typedef struct dp__wire_dec {
    dp__mp_reader r;
    const dp__wire_limits *lim;
    dp_detail *d;
    struct dp_wire_blk **mem;
    uint64_t items; /* list elements decoded so far (against max_items) */
} dp__wire_dec;

/* Value kinds of the field tables: how one map value is read and written. */
enum dp__wire_vk {
    DP__V_ID,          /* dp__wire_str, id rules */
    DP__V_ID_OR_NIL,   /* dp__wire_str, nil <-> empty */
    DP__V_PATH,        /* dp__wire_str, path rules */
    DP__V_TEXT,        /* dp__wire_str, text rules (encoder sanitises) */
    DP__V_TEXT_OR_NIL, /* dp__wire_str, nil <-> empty */
    DP__V_BOOL,        /* bool */
    DP__V_U64,         /* uint64_t, any value */
    DP__V_OFF,         /* uint64_t < max_size (EPROTO) */
    DP__V_SIZE,        /* uint64_t 1 .. max_size - 1 (ETOOBIG) */
    DP__V_SIZE0,       /* uint64_t 0 .. max_size - 1 (ETOOBIG) */
    DP__V_ENTRIES,     /* uint64_t 0 .. max_entries (ETOOBIG) */
    DP__V_READN,       /* uint64_t 0 .. max_read (ETOOBIG) */
    DP__V_BIN,         /* dp__wire_bytes */
    DP__V_IDS,         /* dp__wire_strs of ids */
    DP__V_KEYS,        /* dp__wire_strs of keys */
    DP__V_KEYS_OR_NIL, /* dp__wire_strs of keys, nil <-> empty */
    DP__V_U64S,        /* dp__wire_u64s */
    DP__V_SHARD_BLOBS, /* dp__wire_shard_blobs: {id: [off, nbytes, refs]} */
    DP__V_BLOB_LOCS,   /* dp__wire_blob_locs: {id: [off, len]} */
    DP__V_KEY_LOCS, /* dp__wire_key_locs: {key: [off, len, kind, dtype, shape(, data)]} */
    DP__V_DESCS,    /* dp__wire_descs: [[kind, dtype, shape]] */
};

typedef struct dp__wire_fdesc {
    const char *name;
    uint8_t kind;     /* enum dp__wire_vk */
    uint8_t required; /* missing -> "missing key" */
    uint8_t def;      /* default of an optional bool */
    uint16_t off;     /* offsetof the value in the struct */
} dp__wire_fdesc;

/*
 * Decode a map whose keys are described by f[0..nf) into base. strict: unknown
 * keys are errors, else skipped. Details name the key; the caller prefixes the
 * context ("alloc args"). what names the map itself.
 */
int dp__wire_map_decode(dp__wire_dec *c, const dp__wire_fdesc *f, size_t nf, bool strict,
                        void *base, const char *what);
void dp__wire_map_encode(dp__mp_writer *w, const dp__wire_fdesc *f, size_t nf,
                         const void *base, const dp__wire_limits *lim);
/* One value of kind k into p (what names it in details). */
int dp__wire_value_decode(dp__wire_dec *c, int k, const char *what, void *p);
void dp__wire_value_encode(dp__mp_writer *w, int k, const void *p,
                           const dp__wire_limits *lim);

/* s as a msgpack string, unchecked (an empty s may have p NULL). */
void dp__wire_put_view(dp__mp_writer *w, dp__wire_str s);
/* Text cut to max bytes at a character boundary, invalid bytes and NUL as '?'. */
void dp__wire_put_text(dp__mp_writer *w, dp__wire_str s, uint32_t max);
/* A printable, bounded rendering of untrusted s for details. */
const char *dp__wire_quote(dp__wire_str s, char *buf, size_t cap);
/* Charge n list elements against max_items. */
int dp__wire_charge(dp__wire_dec *c, uint64_t n, const char *what);
/* Finish an encode: size check against max_msg, rollback on failure. */
int dp__wire_encode_end(dp__buf *out, size_t start, bool oom_before,
                        const dp__wire_limits *lim, const char *what, dp_detail *d);

#define DP__WIRE_LIM(lim) ((lim) != NULL ? (lim) : &dp__wire_limits_default)
/* The "what: " prefix of a detail, as the two arguments of "%s%s" (none without what). */
#define DP__WIRE_WHAT(w) (w) ? (w) : "", (w) ? ": " : ""

#endif
