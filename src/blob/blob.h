/*
 * Blob layout version 3 (docs/design.md, "Blob layout"): what one put sends
 * to one unit.
 *
 *     0    8   magic "DPBLOB01"
 *     8    4   version (3; 2 is still read: checkpoints saved before)
 *     12   4   n_entries
 *     16   8   index_len     bytes of the index at offset 64
 *     24   8   payload_off   64-byte aligned, >= 64 + index_len
 *     32   8   total_len     the whole blob; equals the allocation
 *     40   4   index_crc32c  CRC32C of the index bytes
 *     44   4   flags         bit 0: every entry carries a payload CRC32C
 *     48   8   alloc_incarnation  the incarnation of the unit that allocated
 *     56   8   alloc_token        the token its alloc answered
 *     64   ..  index
 *     ...      payload; each entry 64-byte aligned, off relative to the blob
 *
 * The index of version 3, binary, every integer little-endian:
 *
 *     n_fields: u32, then n_fields fields, each len: u8 (1..255) and its bytes
 *     zero bytes up to a multiple of 8 from the index's start
 *     n_entries entries, each a fixed part of 36 bytes
 *         gidx: u64, off: u64, len: u64, field: u32 (its place in the fields),
 *         crc: u32, kind: u8, dtype_len: u8 (0..32), ndim: u8 (0..32), zero: u8
 *     followed by dtype_len bytes of dtype and ndim dims of u64
 *
 * An entry's key is "<gidx>@<field>". Version 2's index was a msgpack array of
 * n_entries arrays [key: str, kind: str, dtype: str, shape: [uint], off: uint,
 * len: uint, crc: uint | nil]; the parser reads both (a checkpoint saved by an
 * older unit holds version 2 blobs) and refuses version 1 with a message
 * saying so. Rules the parser enforces beyond the table (decisions of this
 * implementation):
 * - n_entries >= 1: a blob with no entries publishes nothing and would only
 *   hold a region, so it is rejected (and the builder refuses to make one).
 * - Unknown flag bits are rejected. The allocation identity (bytes 48..63) is
 *   not checked by the parser (any value parses); the unit compares it with
 *   its record, so a unit publishes a region's bytes only if they were
 *   written for that very allocation.
 * - The index is exactly index_len bytes: nothing after the last entry.
 * - key: a valid "<gidx>@<field>" (blob/keys.h); no two entries share a key.
 *   Version 3: 1 <= n_fields <= n_entries, each field valid, every entry's
 *   field < n_fields (a field no entry uses is allowed, within that count).
 * - kind: "tensor", "bytes" or "object" (version 3: 0, 1, 2).
 * - dtype: 0..32 bytes of [a-z0-9_]; non-empty for a tensor, may be empty
 *   for bytes and object. Not checked against a list of known dtypes.
 * - shape: at most 32 dims, each a uint.
 * - off: 64-byte aligned, payload_off <= off, off + len <= total_len.
 * - crc: a uint below 2^32 on every entry when flags bit 0 is set, none
 *   (version 2: nil; version 3: 0) on every entry when it is clear.
 * - Version 3: the padding and each entry's zero byte are zero.
 * - Entries do not overlap (zero-length entries overlap nothing), unless the
 *   parse options allow it.
 *
 * The size of the index does not depend on any entry's offset or CRC, so the
 * layout can be computed before the payload exists (dp__blob_sizer computes
 * it before the builder has the entries).
 *
 * Threads: a builder or a parsed blob belongs to one thread at a time; a
 * parsed blob is read-only after dp__blob_parse() and may then be read from
 * several threads. Everything else is reentrant.
 */
#ifndef DP_BLOB_BLOB_H
#define DP_BLOB_BLOB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dataplane/err.h"

#define DP_BLOB_MAGIC "DPBLOB01"
#define DP_BLOB_VERSION 3u
#define DP_BLOB_HEADER_LEN 64u
#define DP_BLOB_ALIGN 64u
#define DP_BLOB_MAX_DIMS 32u
#define DP_BLOB_DTYPE_MAX 32u
#define DP_BLOB_FLAG_CRC 1u /* flags bit 0: per-entry payload CRC32C present */
/* Default limits of the parser (and hard limits of the builder). */
#define DP_BLOB_MAX_ENTRIES (1u << 20)
#define DP_BLOB_MAX_INDEX_LEN (64ull << 20)
/* The smallest possible encoded index entry, used to bound n_entries by index_len. */
#define DP_BLOB_MIN_ENTRY_LEN 16u
/* Version 3: an entry's fixed part. */
#define DP_BLOB_ENTRY_FIXED 36u

typedef enum dp__blob_kind {
    DP_BLOB_TENSOR = 0,
    DP_BLOB_BYTES = 1,
    DP_BLOB_OBJECT = 2,
} dp__blob_kind;

/* "tensor", "bytes", "object"; "?" for anything else. */
extern const char *const dp__blob_kind_names[DP_BLOB_OBJECT + 1];
static inline const char *
dp__blob_kind_name(dp__blob_kind k)
{
    return (unsigned)k <= DP_BLOB_OBJECT ? dp__blob_kind_names[k] : "?";
}
/* The kind spelled s[0..len); DP_EINVAL if it is none of the three. */
int dp__blob_kind_parse(const char *s, size_t len, dp__blob_kind *out);

/* The decoded header fields. */
typedef struct dp__blob_header {
    uint32_t version;
    uint32_t n_entries;
    uint64_t index_len;
    uint64_t payload_off;
    uint64_t total_len;
    uint32_t index_crc;
    uint32_t flags;
    uint64_t alloc_incarnation; /* bytes 48..55 */
    uint64_t alloc_token;       /* bytes 56..63 */
} dp__blob_header;

/* ------------------------------------------------------------------ */
/* Builder (client side).                                              */
/* ------------------------------------------------------------------ */

/*
 * One entry as the builder's caller describes it. Everything is copied by add.
 * Its key is key, or (key NULL) gidx and a field the caller declared with
 * dp__blob_builder_field.
 */
typedef struct dp__blob_entry_spec {
    const char *key; /* "<gidx>@<field>", need not be NUL-terminated; or NULL */
    size_t key_len;  /* 0 means strlen(key) */
    uint64_t gidx;   /* key NULL: the row */
    uint32_t field;  /* key NULL: the field's number from dp__blob_builder_field */
    dp__blob_kind kind;
    const char *dtype; /* NUL-terminated; NULL or "" allowed for bytes/object */
    const uint64_t *shape;
    uint32_t ndim;       /* <= DP_BLOB_MAX_DIMS; shape may be NULL when 0 */
    uint64_t len;        /* payload bytes */
    const void *payload; /* optional, len bytes; borrowed, see below */
    bool has_crc;        /* crc below is the payload's CRC32C */
    uint32_t crc;
} dp__blob_entry_spec;

typedef struct dp__blob_builder dp__blob_builder;

/* Sizes and offsets of a laid-out blob. */
typedef struct dp__blob_layout {
    uint32_t n_entries;
    uint64_t index_len;
    uint64_t
        payload_off;    /* header + index + padding: what dp__blob_builder_write fills */
    uint64_t total_len; /* the allocation to ask for: payload end, rounded up to 64 */
} dp__blob_layout;

/*
 * New empty builder. flags: 0 or DP_BLOB_FLAG_CRC (every entry then needs a
 * payload CRC32C). DP_EINVAL for unknown flags, DP_ENOMEM.
 */
int dp__blob_builder_create(uint32_t flags, dp__blob_builder **out, dp_detail *d);
/* NULL allowed. */
void dp__blob_builder_destroy(dp__blob_builder *b);
/* Forget every entry (keeps the flags and the memory), to build the next blob. */
void dp__blob_builder_reset(dp__blob_builder *b);

/*
 * The caller promises that every field it declares from now on was checked
 * (keys.h) and that no key repeats: dp__blob_builder_field then skips the
 * field check and layout the duplicate search (a put of 4096 small values
 * spent a fifth of its index building there). Keys given as strings are
 * still split (that checks them). A broken promise makes a blob the unit
 * refuses at commit (it checks both), never a corrupt one. Kept across resets.
 */
void dp__blob_builder_trust_keys(dp__blob_builder *b, bool trusted);

/*
 * The number of field[0..len) in the blob being built (the same number for
 * the same bytes), for entries added by gidx and field. Checked (keys.h)
 * unless the keys are trusted. The fields declared go into the blob's index
 * whether entries use them or not (so a sizer told the same fields agrees).
 * DP_EINVAL (a bad field), DP_ENOMEM.
 */
int dp__blob_builder_field(dp__blob_builder *b, const char *field, size_t len,
                           uint32_t *idx, dp_detail *d);

/*
 * Add an entry; its index (0, 1, ...) into *idx (NULL allowed). Checks the key,
 * kind, dtype and shape against the rules above; duplicate keys are caught
 * by dp__blob_builder_layout. With DP_BLOB_FLAG_CRC the entry needs has_crc,
 * or a payload from which add computes the CRC (a pass over len bytes); a
 * crc without the flag is DP_EINVAL. If payload is given the builder keeps
 * the pointer for dp__blob_builder_copy_payloads(): the bytes must stay valid
 * until then. Invalidates an earlier layout.
 * Returns DP_EINVAL (with the reason), DP_ETOOBIG (entry count), DP_ENOMEM.
 */
int dp__blob_builder_add(dp__blob_builder *b, const dp__blob_entry_spec *spec,
                         uint32_t *idx, dp_detail *d);

/*
 * Set entry i's payload CRC32C (blob built with DP_BLOB_FLAG_CRC), e.g. once
 * the payload has been produced after the layout. Does not change the layout.
 */
int dp__blob_builder_set_crc(dp__blob_builder *b, uint32_t i, uint32_t crc, dp_detail *d);

/*
 * Lay the blob out: encode the index, place each entry's payload, size the
 * blob. Needs at least one entry. DP_EINVAL for duplicate keys or no entries,
 * DP_ETOOBIG if the index or the blob would pass the limits or overflow,
 * DP_ENOMEM. After it, dp__blob_builder_offset() gives each payload's place.
 */
int dp__blob_builder_layout(dp__blob_builder *b, dp__blob_layout *out, dp_detail *d);

/*
 * The size of a blob before building it: the sum of what the builder will
 * write for the same fields (dp__blob_sizer_field, in the order declared to
 * the builder) and entries (the index's exact length and the aligned
 * payloads), so that a put can ask for its allocation while the index is
 * still to be built. dp__blob_sizer_total equals dp__blob_builder_layout's
 * total_len for the same fields and entries (tested).
 */
typedef struct dp__blob_sizer {
    uint32_t n;
    uint64_t fields;     /* the fields' encodings */
    uint64_t index_body; /* the entries' encodings */
    uint64_t payloads;   /* the payloads, each rounded up to 64 */
} dp__blob_sizer;

void dp__blob_sizer_init(dp__blob_sizer *z, uint32_t flags);
void dp__blob_sizer_field(dp__blob_sizer *z, size_t field_len);
void dp__blob_sizer_add(dp__blob_sizer *z, size_t dtype_len, uint32_t ndim, uint64_t len);
/* The index's length and the whole blob's (0 when it overflows). */
uint64_t dp__blob_sizer_index_len(const dp__blob_sizer *z);
uint64_t dp__blob_sizer_total(const dp__blob_sizer *z);

/* Why an entry's dtype is refused for kind (static text), or NULL. */
const char *dp__blob_dtype_problem(const char *dtype, size_t len, dp__blob_kind kind);

/* Entry i's payload offset in the blob (after a layout) and length. */
uint64_t dp__blob_builder_offset(const dp__blob_builder *b, uint32_t i);
uint64_t dp__blob_builder_len(const dp__blob_builder *b, uint32_t i);
uint32_t dp__blob_builder_count(const dp__blob_builder *b);

/*
 * Write bytes [0, payload_off) of the laid-out blob (header, index, zero
 * padding) into dst[0..cap); the allocation identity is zero until
 * dp__blob_header_set_alloc. cap >= payload_off, else DP_EINVAL. The payload
 * goes to dst + dp__blob_builder_offset(b, i), by the caller (copy or RDMA
 * WRITE) or by dp__blob_builder_copy_payloads(). DP_EINVAL before a layout
 * or when a CRC is still missing.
 */
int dp__blob_builder_write(const dp__blob_builder *b, void *dst, size_t cap,
                           dp_detail *d);

/*
 * Copy every payload given to add into dst (cap >= total_len) at its offset
 * and zero the gaps between payloads. Entries added without a payload are
 * left alone. DP_EINVAL before a layout or when cap is too small.
 */
int dp__blob_builder_copy_payloads(const dp__blob_builder *b, void *dst, size_t cap,
                                   dp_detail *d);

/* ------------------------------------------------------------------ */
/* Parser / validator (unit side).                                     */
/* ------------------------------------------------------------------ */

/* One entry of a parsed blob. Strings and shape live in the dp__blob. */
typedef struct dp__blob_entry {
    uint64_t gidx;
    const char *field; /* NUL-terminated (entries of one field may share it) */
    uint32_t field_len;
    dp__blob_kind kind;
    const char *dtype; /* NUL-terminated, may be "" */
    uint32_t dtype_len;
    const uint64_t *shape; /* ndim dims (not NULL even when ndim == 0) */
    uint32_t ndim;
    uint64_t off; /* relative to the blob start */
    uint64_t len;
    bool has_crc;
    uint32_t crc;
} dp__blob_entry;

typedef struct dp__blob_parse_opts {
    uint32_t max_entries;   /* 0: DP_BLOB_MAX_ENTRIES */
    uint64_t max_index_len; /* 0: DP_BLOB_MAX_INDEX_LEN */
    bool allow_overlap;     /* accept entries whose payloads overlap */
    /* When n_units > 0, every key's row must have a copy on unit_index: gidx %
     * n_units is unit_index or one of the replicas - 1 units before it. */
    uint32_t n_units;
    uint32_t unit_index;
    uint32_t replicas; /* 0: 1 */
} dp__blob_parse_opts;

typedef struct dp__blob dp__blob;

/*
 * Validate the untrusted blob p[0..len) (len: the allocation the unit handed
 * out) and return its entries in *out. The header and index are first copied
 * into memory the dp__blob owns; everything is validated on that copy and the
 * entries point into it, so a writer still scribbling on p cannot change
 * what was validated. Nothing outside p[0..len) is read; the payload is not
 * read at all (see dp__blob_check_payload). opts NULL: defaults.
 * Returns DP_EPROTO with the reason in d, DP_ENOMEM, or DP_EINVAL for bad
 * opts (unit_index >= n_units). *out is NULL on error.
 */
int dp__blob_parse(const void *p, size_t len, const dp__blob_parse_opts *opts,
                   dp__blob **out, dp_detail *d);
/* NULL allowed. */
void dp__blob_destroy(dp__blob *b);

const dp__blob_header *dp__blob_get_header(const dp__blob *b);
uint32_t dp__blob_count(const dp__blob *b);
/* Entry i < dp__blob_count(b), in index order. */
const dp__blob_entry *dp__blob_entry_at(const dp__blob *b, uint32_t i);
/* All dp__blob_count(b) entries, in index order (for loops over them). */
const dp__blob_entry *dp__blob_entries(const dp__blob *b);
/* The entry with this key, or NULL (a hash lookup; a binary search of a
 * version-3 index in key order, which the parse checked without a table). */
const dp__blob_entry *dp__blob_find(const dp__blob *b, const char *key, size_t key_len);
/* The entry's key "<gidx>@<field>" into out (NUL-terminated); its length. */
size_t dp__blob_entry_key(const dp__blob_entry *e, char *out /* DP_KEY_MAX + 1 bytes */);

/*
 * Check every entry's payload CRC32C against the blob bytes p[0..len) (the
 * same region that was parsed: len must equal total_len). A pass over all
 * the payload. DP_ECORRUPT naming the first bad entry, DP_EINVAL if the blob
 * carries no CRCs or len differs.
 */
int dp__blob_check_payload(const dp__blob *b, const void *p, size_t len, dp_detail *d);

/* Check one entry's payload (payload = the entry's len bytes). DP_ECORRUPT/DP_EINVAL. */
int dp__blob_entry_check(const dp__blob_entry *e, const void *payload, dp_detail *d);

/*
 * Decode and check the 64-byte header alone (magic, version, flags, reserved,
 * sizes against len and the limits), from hdr64 (64 bytes the caller owns).
 * Used by dp__blob_parse; exposed for tools. DP_EPROTO with the reason.
 */
int dp__blob_header_decode(const uint8_t hdr64[64], uint64_t len,
                           const dp__blob_parse_opts *opts, dp__blob_header *out,
                           dp_detail *d);

/* Write the 64-byte header for h into out (little-endian). */
void dp__blob_header_encode(const dp__blob_header *h, uint8_t out[64]);

/*
 * Name the allocation in an encoded header (bytes 48..63 of hdr64): the
 * client does this once its alloc answered, before the WRITE.
 */
void dp__blob_header_set_alloc(uint8_t hdr64[64], uint64_t incarnation, uint64_t token);

#endif
