/*
 * Blob layouts version 3 and 2: the unit-side parser/validator (format and
 * rules in blob.h), the kinds and dtypes, the header's decoding and the lookup of a
 * parsed blob's entries by key. The client-side sizer and builder are
 * blob_build.c; what the two share is blob_int.h.
 *
 * Design notes
 * - The parser trusts nothing in the blob. The blob lives in slab memory a
 *   hostile client may still be writing, so the header and the index are
 *   read from it exactly once, by memcpy into memory the dp__blob owns; every
 *   check and every returned pointer refers to that copy. The payload is
 *   never read by dp__blob_parse (dp__blob_check_payload reads it, inside the
 *   bounds the parse established).
 * - Every size is checked before it is used in arithmetic, in an order that
 *   cannot overflow: index_len <= len - 64, then payload_off >= 64 +
 *   index_len, off <= total_len, then len <= total_len - off.
 * - Memory the parser allocates is bounded by the index length: n_entries is
 *   at most index_len / DP_BLOB_MIN_ENTRY_LEN, strings and dims together are
 *   at most index_len plus two NULs per entry.
 */
#include "blob/blob.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blob/blob_int.h"
#include "blob/crc32c.h"
#include "blob/keys.h"
#include "common/common.h"
#include "common/hash64.h"
#include "common/le.h"
#include "dataplane/client.h"
#include "wire/mp.h"

const char *const dp__blob_kind_names[] = {
    [DP_BLOB_TENSOR] = "tensor",
    [DP_BLOB_BYTES] = "bytes",
    [DP_BLOB_OBJECT] = "object",
};

int
dp__blob_kind_parse(const char *s, size_t len, dp__blob_kind *out)
{
    for (unsigned k = 0; k < DP_ARRAY_LEN(dp__blob_kind_names); k++) {
        if (strlen(dp__blob_kind_names[k]) == len &&
            memcmp(dp__blob_kind_names[k], s, len) == 0) {
            *out = (dp__blob_kind)k;
            return DP_OK;
        }
    }
    return DP_EINVAL;
}

/* Why dtype[0..len) is not a valid dtype for kind, or NULL. */
static const char *
dtype_problem(const char *dtype, size_t len, dp__blob_kind kind)
{
    if (len > DP_BLOB_DTYPE_MAX)
        return "dtype is longer than 32 bytes";
    if (len == 0 && kind == DP_BLOB_TENSOR)
        return "a tensor needs a dtype";
    for (size_t i = 0; i < len; i++) {
        char c = dtype[i];
        if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_'))
            return "dtype has a character outside [a-z0-9_]";
    }
    return NULL;
}

const char *
dp__blob_dtype_problem(const char *dtype, size_t len, dp__blob_kind kind)
{
    return dtype_problem(dtype, len, kind);
}

/* ---- header ---- */

static uint32_t
opt_max_entries(const dp__blob_parse_opts *o)
{
    return o != NULL && o->max_entries != 0 ? o->max_entries : DP_BLOB_MAX_ENTRIES;
}

static uint64_t
opt_max_index_len(const dp__blob_parse_opts *o)
{
    return o != NULL && o->max_index_len != 0 ? o->max_index_len : DP_BLOB_MAX_INDEX_LEN;
}

int
dp__blob_header_decode(const uint8_t hdr64[64], uint64_t len,
                       const dp__blob_parse_opts *opts, dp__blob_header *out,
                       dp_detail *d)
{
    dp__blob_header h;
    if (len < DP_BLOB_HEADER_LEN)
        return dp__fail(d, DP_EPROTO, "blob: %llu bytes, shorter than the %u-byte header",
                        (unsigned long long)len, DP_BLOB_HEADER_LEN);
    if (memcmp(hdr64, DP_BLOB_MAGIC, 8) != 0) {
        char q[48];
        return dp__fail(d, DP_EPROTO, "blob: bad magic '%s' (want '%s')",
                        dp__quote_bytes((const char *)hdr64, 8, 8, q, sizeof q),
                        DP_BLOB_MAGIC);
    }
    h.version = dp__le32_load(hdr64 + 8);
    h.n_entries = dp__le32_load(hdr64 + 12);
    h.index_len = dp__le64_load(hdr64 + 16);
    h.payload_off = dp__le64_load(hdr64 + 24);
    h.total_len = dp__le64_load(hdr64 + 32);
    h.index_crc = dp__le32_load(hdr64 + 40);
    h.flags = dp__le32_load(hdr64 + 44);
    h.alloc_incarnation = dp__le64_load(hdr64 + 48);
    h.alloc_token = dp__le64_load(hdr64 + 56);
    if (h.version == 1)
        return dp__fail(d, DP_EPROTO,
                        "blob: layout version 1 (written by an older client or saved by "
                        "an older unit, before blobs named their allocation); this code "
                        "reads version %u only: put the data again with this version",
                        DP_BLOB_VERSION);
    if (h.version != DP_BLOB_VERSION && h.version != 2)
        return dp__fail(d, DP_EPROTO,
                        "blob: version %u, this unit reads versions 2 and %u", h.version,
                        DP_BLOB_VERSION);
    if ((h.flags & ~DP_BLOB_FLAG_CRC) != 0)
        return dp__fail(d, DP_EPROTO, "blob: unknown flags 0x%x", h.flags);
    if (h.total_len != len)
        return dp__fail(d, DP_EPROTO,
                        "blob: total_len %llu differs from the allocation of %llu bytes",
                        (unsigned long long)h.total_len, (unsigned long long)len);
    if (h.n_entries == 0)
        return dp__fail(d, DP_EPROTO, "blob: no entries");
    uint32_t max_entries = opt_max_entries(opts);
    if (h.n_entries > max_entries)
        return dp__fail(d, DP_EPROTO, "blob: %u entries, more than the limit of %u",
                        h.n_entries, max_entries);
    uint64_t max_index = opt_max_index_len(opts);
    if (h.index_len > max_index)
        return dp__fail(d, DP_EPROTO, "blob: index_len %llu is over the limit of %llu",
                        (unsigned long long)h.index_len, (unsigned long long)max_index);
    if (h.index_len > len - DP_BLOB_HEADER_LEN)
        return dp__fail(d, DP_EPROTO,
                        "blob: index_len %llu runs past the blob end (%llu)",
                        (unsigned long long)h.index_len, (unsigned long long)len);
    if ((uint64_t)h.n_entries * DP_BLOB_MIN_ENTRY_LEN > h.index_len)
        return dp__fail(d, DP_EPROTO,
                        "blob: %u entries cannot fit in an index of %llu bytes",
                        h.n_entries, (unsigned long long)h.index_len);
    if (h.payload_off % DP_BLOB_ALIGN != 0)
        return dp__fail(d, DP_EPROTO, "blob: payload_off %llu is not 64-byte aligned",
                        (unsigned long long)h.payload_off);
    if (h.payload_off < DP_BLOB_HEADER_LEN + h.index_len)
        return dp__fail(d, DP_EPROTO,
                        "blob: payload_off %llu overlaps the index (ends at %llu)",
                        (unsigned long long)h.payload_off,
                        (unsigned long long)(DP_BLOB_HEADER_LEN + h.index_len));
    if (h.payload_off > h.total_len)
        return dp__fail(d, DP_EPROTO, "blob: payload_off %llu is past total_len %llu",
                        (unsigned long long)h.payload_off,
                        (unsigned long long)h.total_len);
    *out = h;
    return DP_OK;
}

/* ---- parser ---- */

struct dp__blob {
    dp__blob_header h;
    uint8_t *copy; /* private copy of header + index */
    dp__blob_entry *entries;
    char *strs;
    uint64_t *dims;
    /* Key hash index (entry number + 1, 0 = empty), made to find keys that
     * appear twice; NULL when the index's order showed there are none
     * (keys_ordered). */
    uint32_t *kslots;
    uint32_t kmask;    /* slots - 1 (a power of two, at least twice the entries) */
    bool keys_ordered; /* v3: distinct fields, entries by increasing (gidx, field) */
};

/* Re-label an inner failure (keys, msgpack) as DP_EPROTO with context. */
__attribute__((format(printf, 2, 3))) static int
reject_ctx(dp_detail *d, const char *fmt, ...)
{
    if (d == NULL)
        return DP_EPROTO;
    char prefix[160];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    dp__fail_ctx(d, DP_EPROTO, "%s", prefix);
    d->code = DP_EPROTO;
    return DP_EPROTO;
}

/* An entry as read from the index; strings point into the private copy. */
struct raw_entry {
    const char *key;
    uint32_t key_len;
    dp__key_parts kp;
    dp__blob_kind kind;
    const char *dtype;
    uint32_t dtype_len;
    uint32_t ndim;
    uint64_t dims[DP_BLOB_MAX_DIMS];
    uint64_t off, len;
    bool has_crc;
    uint32_t crc;
};

static int
parse_entry(dp__mp_reader *r, uint32_t i, const dp__blob_header *h, struct raw_entry *e,
            dp_detail *d)
{
    char q[80];
    uint32_t n;
    if (dp__mp_read_array(r, &n, NULL, d) != DP_OK)
        return reject_ctx(d, "blob entry %u", i);
    if (n != ENTRY_FIELDS)
        return dp__fail(d, DP_EPROTO, "blob entry %u: %u fields, want %d", i, n,
                        ENTRY_FIELDS);
    if (dp__mp_read_str(r, &e->key, &e->key_len, "key", d) != DP_OK)
        return reject_ctx(d, "blob entry %u", i);
    if (dp__key_split(e->key, e->key_len, &e->kp, d) != DP_OK)
        return reject_ctx(d, "blob entry %u", i);
        /* The quoted key, made only on an error path (this runs per entry). */
#define qk dp__quote_bytes(e->key, e->key_len, 60, q, sizeof q)

    const char *s;
    uint32_t slen;
    if (dp__mp_read_str(r, &s, &slen, "kind", d) != DP_OK)
        return reject_ctx(d, "blob entry %u ('%s')", i, qk);
    if (dp__blob_kind_parse(s, slen, &e->kind) != DP_OK) {
        char qs[48];
        return dp__fail(d, DP_EPROTO,
                        "blob entry %u ('%s'): kind '%s' is not tensor, bytes or object",
                        i, qk, dp__quote_bytes(s, slen, 16, qs, sizeof qs));
    }
    if (dp__mp_read_str(r, &e->dtype, &e->dtype_len, "dtype", d) != DP_OK)
        return reject_ctx(d, "blob entry %u ('%s')", i, qk);
    const char *why = dtype_problem(e->dtype, e->dtype_len, e->kind);
    if (why != NULL)
        return dp__fail(d, DP_EPROTO, "blob entry %u ('%s'): %s", i, qk, why);

    if (dp__mp_read_array(r, &e->ndim, "shape", d) != DP_OK)
        return reject_ctx(d, "blob entry %u ('%s')", i, qk);
    if (e->ndim > DP_BLOB_MAX_DIMS)
        return dp__fail(d, DP_EPROTO, "blob entry %u ('%s'): shape has %u dims, max %u",
                        i, qk, e->ndim, DP_BLOB_MAX_DIMS);
    for (uint32_t k = 0; k < e->ndim; k++)
        if (dp__mp_read_u64(r, &e->dims[k], "shape dim", d) != DP_OK)
            return reject_ctx(d, "blob entry %u ('%s')", i, qk);

    if (dp__mp_read_u64(r, &e->off, "off", d) != DP_OK ||
        dp__mp_read_u64(r, &e->len, "len", d) != DP_OK)
        return reject_ctx(d, "blob entry %u ('%s')", i, qk);
    if (dp__mp_take_nil(r)) {
        e->has_crc = false;
        e->crc = 0;
    } else {
        uint64_t crc;
        if (dp__mp_read_u64(r, &crc, "crc", d) != DP_OK)
            return reject_ctx(d, "blob entry %u ('%s')", i, qk);
        if (crc > UINT32_MAX)
            return dp__fail(d, DP_EPROTO, "blob entry %u ('%s'): crc %llu is not 32-bit",
                            i, qk, (unsigned long long)crc);
        e->has_crc = true;
        e->crc = (uint32_t)crc;
    }
    bool want_crc = (h->flags & DP_BLOB_FLAG_CRC) != 0;
    if (e->has_crc != want_crc)
        return dp__fail(d, DP_EPROTO, "blob entry %u ('%s'): %s", i, qk,
                        want_crc ? "no crc, but the header says every entry has one"
                                 : "has a crc, but the header says entries have none");

    if (e->off < h->payload_off)
        return dp__fail(
            d, DP_EPROTO, "blob entry %u ('%s'): off %llu is before payload_off %llu", i,
            qk, (unsigned long long)e->off, (unsigned long long)h->payload_off);
    if (e->off % DP_BLOB_ALIGN != 0)
        return dp__fail(d, DP_EPROTO,
                        "blob entry %u ('%s'): off %llu is not 64-byte aligned", i, qk,
                        (unsigned long long)e->off);
    if (e->off > h->total_len || e->len > h->total_len - e->off)
        return dp__fail(
            d, DP_EPROTO,
            "blob entry %u ('%s'): off %llu + len %llu runs past total_len %llu", i, qk,
            (unsigned long long)e->off, (unsigned long long)e->len,
            (unsigned long long)h->total_len);
    return DP_OK;
#undef qk
}

/*
 * Keys are checked for duplicates, and found, through an open-addressing
 * table of entry numbers: one pass, no sort (sorting 2048 keys cost a seventh
 * of a commit of small entries).
 */
uint64_t
dp__blob_key_hash(uint64_t gidx, const char *field, size_t n)
{
    return dp__hash64(field, n, gidx);
}

/* Slots for n keys: a power of two at least 2n (n <= DP_BLOB_MAX_ENTRIES). */
uint32_t
dp__blob_key_slots_for(uint32_t n)
{
    uint32_t cap = 16;
    while (cap < 2 * n)
        cap *= 2;
    return cap;
}

/*
 * Insert entry idx (key k, n bytes) into t. Returns the entry number already
 * holding that key, or UINT32_MAX after inserting.
 */
uint32_t
dp__blob_key_slots_insert(const dp__blob_key_table *t, uint64_t gidx, const char *f,
                          uint32_t n, uint32_t idx)
{
    for (uint32_t i = (uint32_t)dp__blob_key_hash(gidx, f, n) & t->mask;;
         i = (i + 1) & t->mask) {
        if (t->slots[i] == 0) {
            t->slots[i] = idx + 1;
            return UINT32_MAX;
        }
        uint64_t jg;
        uint32_t jl;
        const char *jf = t->key_of(t->ctx, t->slots[i] - 1, &jg, &jl);
        if (jg == gidx && jl == n && memcmp(jf, f, n) == 0)
            return t->slots[i] - 1;
    }
}

static const char *
parsed_key_of(const void *ctx, uint32_t j, uint64_t *gidx, uint32_t *len)
{
    const dp__blob *b = ctx;
    *gidx = b->entries[j].gidx;
    *len = b->entries[j].field_len;
    return b->entries[j].field;
}

size_t
dp__blob_entry_key(const dp__blob_entry *e, char *out)
{
    return dp__key_format(e->gidx, e->field, e->field_len, out);
}

/* The key of (gidx, field[0..flen)) quoted for a message into q (error paths). */
static const char *
quote_key(uint64_t gidx, const char *field, size_t flen, char *q, size_t cap)
{
    char k[DP_KEY_MAX + 1];
    return dp__quote_bytes(k, dp__key_format(gidx, field, flen, k), 60, q, cap);
}

static const char *
quote_entry(const dp__blob_entry *e, char *q, size_t cap)
{
    return quote_key(e->gidx, e->field, e->field_len, q, cap);
}

static int
entry_off_cmp(const void *pa, const void *pb)
{
    const dp__blob_entry *a = *(const dp__blob_entry *const *)pa;
    const dp__blob_entry *b = *(const dp__blob_entry *const *)pb;
    if (a->off != b->off)
        return a->off < b->off ? -1 : 1;
    if (a->len != b->len)
        return a->len < b->len ? -1 : 1;
    return 0;
}

static int
check_overlap(dp__blob *b, dp_detail *d)
{
    uint32_t n = b->h.n_entries;
    /* A builder lays entries out one after another: each non-empty payload
     * ends before the next begins, seen in one pass (end: the last one's). */
    uint64_t end = 0;
    bool apart = true;
    for (uint32_t i = 0; i < n && apart; i++) {
        const dp__blob_entry *e = &b->entries[i];
        if (e->len == 0)
            continue;
        apart = e->off >= end; /* off + len fits: place_v3 / v2 checked it */
        end = e->off + e->len;
    }
    if (apart)
        return DP_OK;
    const dp__blob_entry **by_off = malloc(n * sizeof *by_off);
    if (by_off == NULL)
        return dp__fail(d, DP_ENOMEM, "blob: no memory for %u entries", n);
    uint32_t m = 0;
    for (uint32_t i = 0; i < n; i++)
        if (b->entries[i].len > 0)
            by_off[m++] = &b->entries[i];
    qsort(by_off, m, sizeof *by_off, entry_off_cmp);
    int rc = DP_OK;
    for (uint32_t i = 1; i < m; i++) {
        const dp__blob_entry *p = by_off[i - 1], *c = by_off[i];
        if (p->off + p->len >
            c->off) { /* sorted by off: p->off + p->len cannot overflow */
            char q1[80], q2[80];
            rc = dp__fail(
                d, DP_EPROTO,
                "blob: entries '%s' [%llu, +%llu) and '%s' [%llu, +%llu) overlap",
                quote_entry(p, q1, sizeof q1), (unsigned long long)p->off,
                (unsigned long long)p->len, quote_entry(c, q2, sizeof q2),
                (unsigned long long)c->off, (unsigned long long)c->len);
            break;
        }
    }
    free(by_off);
    return rc;
}

void
dp__blob_destroy(dp__blob *b)
{
    if (b == NULL)
        return;
    free(b->copy);
    free(b->entries);
    free(b->strs);
    free(b->dims);
    free(b->kslots);
    free(b);
}

/* Where an entry's strings and dims lie in the arenas while they grow. */
struct entry_at {
    size_t field, dtype, dims;
};

/* With opts naming a unit, an entry whose row another unit owns is refused. */
static int
entry_on_unit(const dp__blob_parse_opts *opts, uint64_t gidx, const char *field,
              size_t flen, uint32_t i, dp_detail *d)
{
    if (opts == NULL || opts->n_units == 0 ||
        dp__row_on_unit(gidx, opts->unit_index, opts->n_units, opts->replicas))
        return DP_OK;
    char q[80];
    return dp__fail(d, DP_EPROTO,
                    "blob entry %u ('%s'): row %llu belongs to unit %llu of %u%s, not "
                    "to unit %u",
                    i, quote_key(gidx, field, flen, q, sizeof q),
                    (unsigned long long)gidx, (unsigned long long)(gidx % opts->n_units),
                    opts->n_units,
                    opts->replicas > 1 ? " (and the units after it: replicas)" : "",
                    opts->unit_index);
}

/* Copies a checked entry into o, its field and dtype into strs (reserved large
 * enough by the caller) and its dims into dims; at records the arena offsets. */
static void
keep_entry(dp__blob_entry *o, struct entry_at *at, const struct raw_entry *e,
           dp__buf *strs, dp__buf *dims)
{
    DP_ASSERT(strs->cap - strs->len >= e->kp.field_len + e->dtype_len + 2);
    at->field = strs->len;
    memcpy(strs->data + strs->len, e->kp.field, e->kp.field_len);
    strs->data[strs->len + e->kp.field_len] = '\0';
    strs->len += e->kp.field_len + 1;
    at->dtype = strs->len;
    memcpy(strs->data + strs->len, e->dtype, e->dtype_len);
    strs->data[strs->len + e->dtype_len] = '\0';
    strs->len += (size_t)e->dtype_len + 1;
    at->dims = dims->len / sizeof(uint64_t);
    if (e->ndim > 0)
        dp__buf_append(dims, e->dims, e->ndim * sizeof(uint64_t));
    o->gidx = e->kp.gidx;
    o->field_len = (uint32_t)e->kp.field_len;
    o->kind = e->kind;
    o->dtype_len = e->dtype_len;
    o->ndim = e->ndim;
    o->off = e->off;
    o->len = e->len;
    o->has_crc = e->has_crc;
    o->crc = e->crc;
}

/*
 * Copy the header and the index out of p (len bytes of shared memory) into
 * b->copy, the header decoded into b->h, and check the index's CRC32C.
 */
static int
copy_index(dp__blob *b, const void *p, size_t len, const dp__blob_parse_opts *opts,
           dp_detail *d)
{
    /* One read of the header from the shared memory, then only the copy. */
    uint8_t hdr[DP_BLOB_HEADER_LEN];
    memcpy(hdr, p, sizeof hdr);
    int rc = dp__blob_header_decode(hdr, len, opts, &b->h, d);
    if (rc != DP_OK)
        return rc;
    const dp__blob_header *h = &b->h;
    /* index_len <= len - 64 and len is a size_t: the sum fits. */
    size_t copy_len = (size_t)(DP_BLOB_HEADER_LEN + h->index_len);
    b->copy = malloc(copy_len);
    if (b->copy == NULL)
        return dp__fail(d, DP_ENOMEM, "blob: no memory for an index of %llu bytes",
                        (unsigned long long)h->index_len);
    memcpy(b->copy, hdr, DP_BLOB_HEADER_LEN);
    memcpy(b->copy + DP_BLOB_HEADER_LEN, (const uint8_t *)p + DP_BLOB_HEADER_LEN,
           (size_t)h->index_len);
    const uint8_t *index = b->copy + DP_BLOB_HEADER_LEN;

    uint32_t crc = dp__crc32c(index, (size_t)h->index_len);
    if (crc != h->index_crc)
        return dp__fail(d, DP_EPROTO, "blob: index CRC32C 0x%08x, header says 0x%08x",
                        crc, h->index_crc);
    return DP_OK;
}

/*
 * The arenas become the blob's (a zero dim at the end: a shape is never NULL)
 * and each entry's field, dtype and shape point into them (at: their offsets).
 */
static int
arenas_finish(dp__blob *b, dp__buf *strs, dp__buf *dims, const struct entry_at *at,
              dp_detail *d)
{
    dp__buf_append(dims, &(uint64_t){0}, sizeof(uint64_t));
    if (strs->oom || dims->oom)
        return dp__fail(d, DP_ENOMEM, "blob: no memory for the index strings");
    b->strs = (char *)dp__buf_steal(strs, NULL);
    b->dims = (uint64_t *)(void *)dp__buf_steal(dims, NULL);
    for (uint32_t i = 0; i < b->h.n_entries; i++) {
        dp__blob_entry *o = &b->entries[i];
        o->field = b->strs + at[i].field;
        o->dtype = b->strs + at[i].dtype;
        o->shape = b->dims + at[i].dims;
    }
    return DP_OK;
}

/*
 * Read the entries of the copied version 2 index (each checked, and on opts'
 * unit) into b->entries, their fields and dtypes into b->strs and their dims
 * into b->dims, and allocate b->kslots for their keys.
 */
static int
read_entries_v2(dp__blob *b, const dp__blob_parse_opts *opts, dp_detail *d)
{
    const dp__blob_header *h = &b->h;
    dp__buf strs, dims;
    dp__buf_init(&strs);
    dp__buf_init(&dims);
    struct entry_at *at = NULL;
    int rc;
    dp__mp_reader r;
    dp__mp_reader_init(&r, b->copy + DP_BLOB_HEADER_LEN, (size_t)h->index_len);
    uint32_t n;
    if (dp__mp_read_array(&r, &n, "blob index", d) != DP_OK) {
        rc = reject_ctx(d, "blob");
        goto out;
    }
    if (n != h->n_entries) {
        rc = dp__fail(d, DP_EPROTO, "blob: index has %u entries, header says %u", n,
                      h->n_entries);
        goto out;
    }
    b->entries = calloc(n, sizeof *b->entries);
    if (b->entries == NULL) {
        rc = dp__fail(d, DP_ENOMEM, "blob: no memory for %u entries", n);
        goto out;
    }
    /* Strings and dims go to growing arenas; their offsets are kept aside
     * (the arenas move while they grow) and turned into pointers at the end. */
    at = malloc(n * sizeof *at);
    if (at == NULL) {
        rc = dp__fail(d, DP_ENOMEM, "blob: no memory for %u entries", n);
        goto out;
    }
    /* Every key and dtype is a string of the index: the index's length bounds
     * them all, so the string arena is sized once and never grows. */
    if (dp__buf_reserve(&strs, (size_t)h->index_len + 2 * (size_t)n) != DP_OK) {
        rc = dp__fail(d, DP_ENOMEM, "blob: no memory for the index strings");
        goto out;
    }
    struct raw_entry e;
    for (uint32_t i = 0; i < n; i++) {
        rc = parse_entry(&r, i, h, &e, d);
        if (rc != DP_OK)
            goto out;
        rc = entry_on_unit(opts, e.kp.gidx, e.kp.field, e.kp.field_len, i, d);
        if (rc != DP_OK)
            goto out;
        keep_entry(&b->entries[i], &at[i], &e, &strs, &dims);
    }
    if (dp__mp_remaining(&r) != 0) {
        rc = dp__fail(d, DP_EPROTO, "blob: %zu stray bytes after the index's %u entries",
                      dp__mp_remaining(&r), n);
        goto out;
    }
    rc = arenas_finish(b, &strs, &dims, at, d);
out:
    free(at);
    dp__buf_fini(&strs); /* stolen (empty) on success */
    dp__buf_fini(&dims);
    return rc;
}

/* Version 3: each field's name, its place in b->strs, and the last
 * description (kind, dtype, dims) an entry of it carried. */
struct v3_field {
    const char *p; /* in the index copy */
    uint32_t len;
    size_t at;   /* its NUL-terminated copy in the strs arena */
    size_t desc; /* the last description's bytes (kind on), in the index; 0: none */
    uint32_t desc_len;
    size_t dtype_at, dims_at;
};

/* The fields of a version 3 index from *pos on, each checked, into fs and strs. */
static int
read_fields_v3(const uint8_t *ix, uint64_t len, uint64_t *pos, struct v3_field *fs,
               uint32_t nf, dp__buf *strs, dp_detail *d)
{
    for (uint32_t f = 0; f < nf; f++) {
        if (*pos + 1 > len || *pos + 1 + ix[*pos] > len)
            return dp__fail(d, DP_EPROTO, "blob: field %u of %u runs past the index", f,
                            nf);
        uint32_t fl = ix[*pos];
        const char *fp = (const char *)ix + *pos + 1;
        if (dp__field_check(fp, fl, d) != DP_OK)
            return reject_ctx(d, "blob: field %u", f);
        fs[f] = (struct v3_field){fp, fl, strs->len, 0, 0, 0, 0};
        memcpy(strs->data + strs->len, fp, fl);
        strs->data[strs->len + fl] = '\0';
        strs->len += (size_t)fl + 1;
        *pos += 1 + (uint64_t)fl;
    }
    uint64_t padded = DP_ALIGN_UP(*pos, 8);
    for (; *pos < padded; (*pos)++)
        if (*pos >= len || ix[*pos] != 0)
            return dp__fail(d, DP_EPROTO,
                            "blob: the padding after the fields is not zero");
    return DP_OK;
}

/* No two of the fields fs[0..nf) alike (past 16, not looked at: false). */
static bool
fields_distinct(const struct v3_field *fs, uint32_t nf)
{
    if (nf > 16)
        return false;
    for (uint32_t i = 0; i < nf; i++)
        for (uint32_t j = i + 1; j < nf; j++)
            if (fs[i].len == fs[j].len && memcmp(fs[i].p, fs[j].p, fs[i].len) == 0)
                return false;
    return true;
}

/*
 * Entry i's description at p (its fixed part; dtype and dims follow): the
 * same bytes as the last entry of its field (shared, checked once) or new
 * (checked, copied into the arenas). e gets kind, dtype and shape offsets.
 */
static int
desc_v3(const uint8_t *ix, size_t pos, struct v3_field *f, dp__blob_entry *e,
        struct entry_at *at, dp__buf *strs, dp__buf *dims, uint32_t i, dp_detail *d)
{
    const uint8_t *p = ix + pos;
    uint32_t dl = p[33], nd = p[34], n = 3 + dl + 8 * nd;
    e->kind = (dp__blob_kind)p[32];
    e->dtype_len = dl;
    e->ndim = nd;
    /* kind, dtype_len, ndim, the zero byte, dtype and dims: one compare */
    if (f->desc != 0 && f->desc_len == n &&
        dp__bytes_eq(p + 32, ix + f->desc, DP_BLOB_ENTRY_FIXED - 32 + n - 3)) {
        at->dtype = f->dtype_at;
        at->dims = f->dims_at;
        return DP_OK;
    }
    char q[80];
    if (p[32] >= DP_ARRAY_LEN(dp__blob_kind_names))
        return dp__fail(d, DP_EPROTO, "blob entry %u ('%s'): kind %u is not 0, 1 or 2", i,
                        quote_key(dp__le64_load(p), f->p, f->len, q, sizeof q), p[32]);
    const char *dtype = (const char *)p + DP_BLOB_ENTRY_FIXED;
    const char *why = dl > DP_BLOB_DTYPE_MAX  ? "dtype is longer than 32 bytes"
                      : nd > DP_BLOB_MAX_DIMS ? "shape has more than 32 dims"
                                              : dtype_problem(dtype, dl, e->kind);
    if (why != NULL)
        return dp__fail(d, DP_EPROTO, "blob entry %u ('%s'): %s", i,
                        quote_key(dp__le64_load(p), f->p, f->len, q, sizeof q), why);
    at->dtype = strs->len;
    memcpy(strs->data + strs->len, dtype, dl);
    strs->data[strs->len + dl] = '\0';
    strs->len += (size_t)dl + 1;
    at->dims = dims->len / sizeof(uint64_t);
    for (uint32_t k = 0; k < nd; k++) {
        uint64_t v = dp__le64_load(p + DP_BLOB_ENTRY_FIXED + dl + 8 * k);
        dp__buf_append(dims, &v, sizeof v);
    }
    f->desc = pos + 32; /* never 0: the fields come first */
    f->desc_len = n;
    f->dtype_at = at->dtype;
    f->dims_at = at->dims;
    return DP_OK;
}

/* Entry i's offset and length against the header (q: its key, quoted on demand). */
static int
place_v3(const dp__blob_header *h, const dp__blob_entry *e, uint32_t i, dp_detail *d)
{
    char q[80];
    if (e->off < h->payload_off)
        return dp__fail(d, DP_EPROTO,
                        "blob entry %u ('%s'): off %llu is before payload_off %llu", i,
                        quote_key(e->gidx, e->field, e->field_len, q, sizeof q),
                        (unsigned long long)e->off, (unsigned long long)h->payload_off);
    if (e->off % DP_BLOB_ALIGN != 0)
        return dp__fail(d, DP_EPROTO,
                        "blob entry %u ('%s'): off %llu is not 64-byte aligned", i,
                        quote_key(e->gidx, e->field, e->field_len, q, sizeof q),
                        (unsigned long long)e->off);
    if (e->off > h->total_len || e->len > h->total_len - e->off)
        return dp__fail(
            d, DP_EPROTO,
            "blob entry %u ('%s'): off %llu + len %llu runs past total_len %llu", i,
            quote_key(e->gidx, e->field, e->field_len, q, sizeof q),
            (unsigned long long)e->off, (unsigned long long)e->len,
            (unsigned long long)h->total_len);
    return DP_OK;
}

/*
 * Version 3: the fields, then the entries of the copied index (each checked,
 * and on opts' unit) into b->entries; fields and dtypes into b->strs (a
 * field's name once for all its entries, a description once while the
 * entries of a field repeat it), dims into b->dims; b->kslots allocated.
 */
static int
read_entries_v3(dp__blob *b, const dp__blob_parse_opts *opts, dp_detail *d)
{
    const dp__blob_header *h = &b->h;
    const uint8_t *ix = b->copy + DP_BLOB_HEADER_LEN;
    uint64_t len = h->index_len, pos = 4;
    uint32_t n = h->n_entries, nf = len >= 4 ? dp__le32_load(ix) : 0;
    if (nf == 0 || nf > n || nf > len / 2) /* a field no entry uses names nothing */
        return dp__fail(d, DP_EPROTO,
                        "blob: %u fields for %u entries in an index of %llu bytes", nf, n,
                        (unsigned long long)len);
    dp__buf strs, dims;
    dp__buf_init(&strs);
    dp__buf_init(&dims);
    struct v3_field *fs = malloc((size_t)nf * sizeof *fs);
    struct entry_at *at = malloc((size_t)n * sizeof *at);
    b->entries = malloc((size_t)n * sizeof *b->entries);
    /* Fields and dtypes are strings of the index, each copied once with a NUL. */
    int rc = fs == NULL || at == NULL || b->entries == NULL ||
                     dp__buf_reserve(&strs, (size_t)len + nf + n) != DP_OK
                 ? dp__fail(d, DP_ENOMEM, "blob: no memory for %u entries", n)
                 : read_fields_v3(ix, len, &pos, fs, nf, &strs, d);
    bool crc = (h->flags & DP_BLOB_FLAG_CRC) != 0;
    /* Entries by increasing (gidx, field) of distinct fields (what a builder
     * writes) repeat no key: no key table needed (index_keys). */
    bool ordered = rc == DP_OK && fields_distinct(fs, nf);
    uint64_t pg = 0, pg_row = 0;
    uint32_t pf = 0;
    for (uint32_t i = 0; i < n && rc == DP_OK; i++) {
        const uint8_t *p = ix + pos;
        dp__blob_entry *e = &b->entries[i];
        uint32_t fi = len - pos >= DP_BLOB_ENTRY_FIXED ? dp__le32_load(p + 24) : 0;
        if (len - pos < DP_BLOB_ENTRY_FIXED ||
            len - pos - DP_BLOB_ENTRY_FIXED < (uint64_t)p[33] + 8ull * p[34]) {
            rc = dp__fail(d, DP_EPROTO, "blob entry %u of %u runs past the index", i, n);
            break;
        }
        if (fi >= nf || p[35] != 0 || (!crc && dp__le32_load(p + 28) != 0)) {
            rc = dp__fail(d, DP_EPROTO, "blob entry %u: %s", i,
                          fi >= nf ? "its field is not in the index's fields"
                          : p[35] != 0
                              ? "its zero byte is not zero"
                              : "has a crc, but the header says entries have none");
            break;
        }
        e->gidx = dp__le64_load(p);
        ordered &= (i == 0) | (e->gidx > pg) | ((e->gidx == pg) & (fi > pf));
        pg = e->gidx;
        pf = fi;
        e->off = dp__le64_load(p + 8);
        e->len = dp__le64_load(p + 16);
        e->has_crc = crc;
        e->crc = dp__le32_load(p + 28);
        e->field = fs[fi].p; /* for messages until the arena's is set */
        e->field_len = fs[fi].len;
        at[i].field = fs[fi].at;
        if ((rc = desc_v3(ix, (size_t)pos, &fs[fi], e, &at[i], &strs, &dims, i, d)) !=
                DP_OK ||
            (rc = place_v3(h, e, i, d)) != DP_OK ||
            /* a row's entries one after another: its unit checked once */
            ((i == 0 || e->gidx != pg_row) &&
             (rc = entry_on_unit(opts, e->gidx, e->field, e->field_len, i, d)) != DP_OK))
            break;
        pg_row = e->gidx;
        pos += dp__blob_v3_entry_len(p[33], p[34]);
    }
    if (rc == DP_OK && pos != len)
        rc = dp__fail(d, DP_EPROTO, "blob: %llu stray bytes after the index's %u entries",
                      (unsigned long long)(len - pos), n);
    if (rc == DP_OK)
        rc = arenas_finish(b, &strs, &dims, at, d);
    b->keys_ordered = rc == DP_OK && ordered;
    free(fs);
    free(at);
    dp__buf_fini(&strs);
    dp__buf_fini(&dims);
    return rc;
}

/* Index the entries' keys in b->kslots: a key that appears twice is refused. */
static int
index_keys(dp__blob *b, dp_detail *d)
{
    b->kmask = dp__blob_key_slots_for(b->h.n_entries) - 1;
    b->kslots = calloc((size_t)b->kmask + 1, sizeof *b->kslots);
    if (b->kslots == NULL)
        return dp__fail(d, DP_ENOMEM, "blob: no memory for %u keys", b->h.n_entries);
    dp__blob_key_table t = {b->kslots, b->kmask, parsed_key_of, b};
    for (uint32_t i = 0; i < b->h.n_entries; i++) {
        const dp__blob_entry *o = &b->entries[i];
        if (dp__blob_key_slots_insert(&t, o->gidx, o->field, o->field_len, i) !=
            UINT32_MAX) {
            char q[80];
            return dp__fail(d, DP_EPROTO, "blob: key '%s' appears twice",
                            quote_entry(o, q, sizeof q));
        }
    }
    return DP_OK;
}

int
dp__blob_parse(const void *p, size_t len, const dp__blob_parse_opts *opts, dp__blob **out,
               dp_detail *d)
{
    *out = NULL;
    if (opts != NULL && opts->n_units > 0 && opts->unit_index >= opts->n_units)
        return dp__fail(d, DP_EINVAL, "blob parse options: unit %u of %u units",
                        opts->unit_index, opts->n_units);
    if (p == NULL || len < DP_BLOB_HEADER_LEN)
        return dp__fail(d, DP_EPROTO, "blob: %zu bytes, shorter than the %u-byte header",
                        p == NULL ? (size_t)0 : len, DP_BLOB_HEADER_LEN);
    dp__blob *b = calloc(1, sizeof *b);
    if (b == NULL)
        return dp__fail(d, DP_ENOMEM, "blob: no memory");
    int rc = copy_index(b, p, len, opts, d);
    if (rc == DP_OK)
        rc =
            b->h.version == 2 ? read_entries_v2(b, opts, d) : read_entries_v3(b, opts, d);
    if (rc == DP_OK && !b->keys_ordered)
        rc = index_keys(b, d);
    if (rc == DP_OK && (opts == NULL || !opts->allow_overlap))
        rc = check_overlap(b, d);
    if (rc != DP_OK) {
        dp__blob_destroy(b);
        return rc;
    }
    *out = b;
    return DP_OK;
}

const dp__blob_header *
dp__blob_get_header(const dp__blob *b)
{
    return &b->h;
}

uint32_t
dp__blob_count(const dp__blob *b)
{
    return b->h.n_entries;
}

const dp__blob_entry *
dp__blob_entry_at(const dp__blob *b, uint32_t i)
{
    DP_ASSERT(i < b->h.n_entries);
    return &b->entries[i];
}

const dp__blob_entry *
dp__blob_entries(const dp__blob *b)
{
    return b->entries;
}

const dp__blob_entry *
dp__blob_find(const dp__blob *b, const char *key, size_t key_len)
{
    dp__key_parts kp;
    if (key_len > DP_KEY_MAX || dp__key_split(key, key_len, &kp, NULL) != DP_OK)
        return NULL;
    if (b->kslots == NULL) { /* keys in order: by halves on (gidx, field) */
        uint32_t lo = 0, hi = b->h.n_entries;
        while (lo < hi) {
            uint32_t mid = lo + (hi - lo) / 2;
            if (b->entries[mid].gidx < kp.gidx)
                lo = mid + 1;
            else
                hi = mid;
        }
        for (; lo < b->h.n_entries && b->entries[lo].gidx == kp.gidx; lo++) {
            const dp__blob_entry *e = &b->entries[lo];
            if (e->field_len == kp.field_len &&
                memcmp(e->field, kp.field, kp.field_len) == 0)
                return e;
        }
        return NULL;
    }
    for (uint32_t i =
             (uint32_t)dp__blob_key_hash(kp.gidx, kp.field, kp.field_len) & b->kmask;
         ; i = (i + 1) & b->kmask) {
        if (b->kslots[i] == 0)
            return NULL;
        const dp__blob_entry *e = &b->entries[b->kslots[i] - 1];
        if (e->gidx == kp.gidx && e->field_len == kp.field_len &&
            memcmp(e->field, kp.field, kp.field_len) == 0)
            return e;
    }
}

int
dp__blob_entry_check(const dp__blob_entry *e, const void *payload, dp_detail *d)
{
    char q[80];
    if (!e->has_crc)
        return dp__fail(d, DP_EINVAL, "blob entry '%s' carries no crc",
                        quote_entry(e, q, sizeof q));
    uint32_t crc = dp__crc32c(payload, (size_t)e->len);
    if (crc != e->crc)
        return dp__fail(d, DP_ECORRUPT,
                        "blob entry '%s': payload CRC32C 0x%08x, index says 0x%08x",
                        quote_entry(e, q, sizeof q), crc, e->crc);
    return DP_OK;
}

int
dp__blob_check_payload(const dp__blob *b, const void *p, size_t len, dp_detail *d)
{
    if ((b->h.flags & DP_BLOB_FLAG_CRC) == 0)
        return dp__fail(d, DP_EINVAL, "blob carries no payload CRCs");
    if (p == NULL || len != b->h.total_len)
        return dp__fail(d, DP_EINVAL, "blob check: %zu bytes given, the blob has %llu",
                        len, (unsigned long long)b->h.total_len);
    for (uint32_t i = 0; i < b->h.n_entries; i++) {
        const dp__blob_entry *e = &b->entries[i];
        int rc = dp__blob_entry_check(e, (const uint8_t *)p + e->off, d);
        if (rc != DP_OK)
            return rc;
    }
    return DP_OK;
}

const char *
dp_kind_name(dp_kind k)
{
    switch (k) {
    case DP_KIND_TENSOR:
        return "tensor";
    case DP_KIND_BYTES:
        return "bytes";
    case DP_KIND_OBJECT:
        return "object";
    case DP_KIND_SKIP:
        return "skip";
    }
    return "?";
}
