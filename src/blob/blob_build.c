/*
 * Blob layout version 2: the client-side sizer and builder (format and rules
 * in blob.h): sizes before building, the header's encoding, and the builder
 * that lays a blob out and writes it. The unit-side parser/validator, the
 * kinds and the key table both use are blob_parse.c; what the two share is
 * blob_int.h.
 *
 * Design notes
 * - The builder encodes off as a full-width msgpack uint64 and crc as a
 *   full-width uint32, so index_len does not depend on their values: it
 *   encodes the index once with placeholders, derives the offsets, and
 *   patches them (and later CRCs) in place.
 */
#include "blob/blob.h"

#include <stdlib.h>
#include <string.h>

#include "blob/blob_int.h"
#include "blob/crc32c.h"
#include "blob/keys.h"
#include "common/common.h"
#include "common/le.h"
#include "wire/mp.h"

/* ---- sizes before building (dp__blob_sizer): the encodings of dp__mp_put_* ---- */

static uint64_t
mp_str_hdr(uint64_t n)
{
    return n < 32 ? 1 : n <= 0xff ? 2 : n <= 0xffff ? 3 : 5;
}

static uint64_t
mp_arr_hdr(uint64_t n)
{
    return n < 16 ? 1 : n <= 0xffff ? 3 : 5;
}

static uint64_t
mp_uint(uint64_t v)
{
    return v < 0x80 ? 1 : v <= 0xff ? 2 : v <= 0xffff ? 3 : v <= 0xffffffffu ? 5 : 9;
}

void
dp__blob_sizer_init(dp__blob_sizer *z, uint32_t flags)
{
    memset(z, 0, sizeof *z);
    z->crc = (flags & DP_BLOB_FLAG_CRC) != 0;
}

void
dp__blob_sizer_add(dp__blob_sizer *z, size_t key_len, dp__blob_kind kind,
                   size_t dtype_len, const uint64_t *shape, uint32_t ndim, uint64_t len)
{
    size_t kl = strlen(dp__blob_kind_names[kind]);
    /* [key, kind, dtype, shape, off (full width), len, crc (full width) | nil] */
    uint64_t e = 1 + mp_str_hdr(key_len) + key_len + mp_str_hdr(kl) + kl +
                 mp_str_hdr(dtype_len) + dtype_len + mp_arr_hdr(ndim);
    for (uint32_t k = 0; k < ndim; k++)
        e += mp_uint(shape[k]);
    e += 9 + mp_uint(len) + (z->crc ? 5 : 1);
    z->index_body += e;
    z->payloads += DP_ALIGN_UP(len, DP_BLOB_ALIGN);
    if (z->payloads < len) /* overflow: never a valid blob */
        z->payloads = UINT64_MAX;
    z->n++;
}

uint64_t
dp__blob_sizer_index_len(const dp__blob_sizer *z)
{
    return mp_arr_hdr(z->n) + z->index_body;
}

uint64_t
dp__blob_sizer_total(const dp__blob_sizer *z)
{
    uint64_t off =
        DP_ALIGN_UP(DP_BLOB_HEADER_LEN + dp__blob_sizer_index_len(z), DP_BLOB_ALIGN);
    return z->payloads > UINT64_MAX - 2 * DP_BLOB_ALIGN - off ? 0 : off + z->payloads;
}

/* ---- header ---- */

void
dp__blob_header_encode(const dp__blob_header *h, uint8_t out[64])
{
    memset(out, 0, DP_BLOB_HEADER_LEN);
    memcpy(out, DP_BLOB_MAGIC, 8);
    dp__le32_store(out + 8, h->version);
    dp__le32_store(out + 12, h->n_entries);
    dp__le64_store(out + 16, h->index_len);
    dp__le64_store(out + 24, h->payload_off);
    dp__le64_store(out + 32, h->total_len);
    dp__le32_store(out + 40, h->index_crc);
    dp__le32_store(out + 44, h->flags);
    dp__le64_store(out + 48, h->alloc_incarnation);
    dp__le64_store(out + 56, h->alloc_token);
}

void
dp__blob_header_set_alloc(uint8_t hdr64[64], uint64_t incarnation, uint64_t token)
{
    dp__le64_store(hdr64 + 48, incarnation);
    dp__le64_store(hdr64 + 56, token);
}

/* ---- builder ---- */

struct bentry {
    size_t key_at; /* offsets into the builder's string arena */
    uint32_t key_len;
    size_t dtype_at;
    uint32_t dtype_len;
    size_t dims_at; /* index into the dims arena (uint64_t units) */
    uint32_t ndim;
    dp__blob_kind kind;
    uint64_t len;
    const void *payload;
    bool has_crc;
    uint32_t crc;
    uint64_t off;
    size_t off_pos; /* where off's 8 bytes sit in the encoded index */
    size_t crc_pos; /* where crc's 4 bytes sit */
};

struct dp__blob_builder {
    uint32_t flags;
    bool keys_trusted;
    struct bentry *e;
    uint32_t n, cap;
    dp__buf strs;
    dp__buf dims;
    dp__buf index;
    bool laid_out;
    dp__blob_layout layout;
};

int
dp__blob_builder_create(uint32_t flags, dp__blob_builder **out, dp_detail *d)
{
    *out = NULL;
    if ((flags & ~DP_BLOB_FLAG_CRC) != 0)
        return dp__fail(d, DP_EINVAL, "blob builder: unknown flags 0x%x", flags);
    dp__blob_builder *b = calloc(1, sizeof *b);
    if (b == NULL)
        return dp__fail(d, DP_ENOMEM, "blob builder: no memory");
    b->flags = flags;
    dp__buf_init(&b->strs);
    dp__buf_init(&b->dims);
    dp__buf_init(&b->index);
    *out = b;
    return DP_OK;
}

void
dp__blob_builder_destroy(dp__blob_builder *b)
{
    if (b == NULL)
        return;
    free(b->e);
    dp__buf_fini(&b->strs);
    dp__buf_fini(&b->dims);
    dp__buf_fini(&b->index);
    free(b);
}

void
dp__blob_builder_trust_keys(dp__blob_builder *b, bool trusted)
{
    b->keys_trusted = trusted;
}

void
dp__blob_builder_reset(dp__blob_builder *b)
{
    b->n = 0;
    dp__buf_reset(&b->strs);
    dp__buf_reset(&b->dims);
    dp__buf_reset(&b->index);
    b->laid_out = false;
}

uint32_t
dp__blob_builder_count(const dp__blob_builder *b)
{
    return b->n;
}

int
dp__blob_builder_add(dp__blob_builder *b, const dp__blob_entry_spec *s, uint32_t *idx,
                     dp_detail *d)
{
    char q[80];
    if (s->key == NULL)
        return dp__fail(d, DP_EINVAL, "blob builder: key is NULL");
    size_t key_len = s->key_len != 0 ? s->key_len : strlen(s->key);
    if (!b->keys_trusted) {
        dp__key_parts kp;
        int rc = dp__key_split(s->key, key_len, &kp, d);
        if (rc != DP_OK)
            return rc;
    }
    /* The quoted key, made only on an error path (this runs per entry). */
#define qk dp__quote_bytes(s->key, key_len, 60, q, sizeof q)
    if ((unsigned)s->kind >= DP_ARRAY_LEN(dp__blob_kind_names))
        return dp__fail(d, DP_EINVAL, "blob entry '%s': unknown kind %d", qk,
                        (int)s->kind);
    const char *dtype = s->dtype != NULL ? s->dtype : "";
    size_t dtype_len = strnlen(dtype, DP_BLOB_DTYPE_MAX + 1);
    const char *why = dp__blob_dtype_problem(dtype, dtype_len, s->kind);
    if (why != NULL)
        return dp__fail(d, DP_EINVAL, "blob entry '%s': %s", qk, why);
    if (s->ndim > DP_BLOB_MAX_DIMS)
        return dp__fail(d, DP_EINVAL, "blob entry '%s': shape has %u dims, max %u", qk,
                        s->ndim, DP_BLOB_MAX_DIMS);
    if (s->ndim > 0 && s->shape == NULL)
        return dp__fail(d, DP_EINVAL, "blob entry '%s': shape is NULL", qk);
    bool want_crc = (b->flags & DP_BLOB_FLAG_CRC) != 0;
    if (!want_crc && s->has_crc)
        return dp__fail(d, DP_EINVAL,
                        "blob entry '%s': a crc for a blob built without crcs", qk);
    /* With crcs on, an entry with neither crc nor payload is allowed: the
     * caller sets its crc with dp__blob_builder_set_crc before the write. */
    if (b->n >= DP_BLOB_MAX_ENTRIES)
        return dp__fail(d, DP_ETOOBIG, "blob: more than %u entries", DP_BLOB_MAX_ENTRIES);
    if (b->n == b->cap) {
        uint32_t cap = b->cap == 0 ? 16 : b->cap * 2;
        struct bentry *ne = realloc(b->e, (size_t)cap * sizeof *ne);
        if (ne == NULL)
            return dp__fail(d, DP_ENOMEM, "blob builder: no memory for %u entries", cap);
        b->e = ne;
        b->cap = cap;
    }
    struct bentry *e = &b->e[b->n];
    memset(e, 0, sizeof *e);
    e->key_at = b->strs.len;
    e->key_len = (uint32_t)key_len;
    dp__buf_append(&b->strs, s->key, key_len);
    e->dtype_at = b->strs.len;
    e->dtype_len = (uint32_t)dtype_len;
    dp__buf_append(&b->strs, dtype, dtype_len);
    e->dims_at = b->dims.len / sizeof(uint64_t);
    e->ndim = s->ndim;
    if (s->ndim > 0)
        dp__buf_append(&b->dims, s->shape, s->ndim * sizeof(uint64_t));
    if (b->strs.oom || b->dims.oom)
        return dp__fail(d, DP_ENOMEM, "blob builder: no memory");
    e->kind = s->kind;
    e->len = s->len;
    e->payload = s->payload;
    if (want_crc) {
        if (s->has_crc) {
            e->has_crc = true;
            e->crc = s->crc;
        } else if (s->payload != NULL || s->len == 0) {
            e->has_crc = true;
            e->crc = dp__crc32c(s->payload, (size_t)s->len);
        }
    }
    b->laid_out = false;
    if (idx != NULL)
        *idx = b->n;
    b->n++;
    return DP_OK;
#undef qk
}

static void
patch_be(uint8_t *p, uint64_t v, int nbytes)
{
    for (int i = nbytes - 1; i >= 0; i--) {
        p[i] = (uint8_t)v;
        v >>= 8;
    }
}

int
dp__blob_builder_set_crc(dp__blob_builder *b, uint32_t i, uint32_t crc, dp_detail *d)
{
    if ((b->flags & DP_BLOB_FLAG_CRC) == 0)
        return dp__fail(d, DP_EINVAL, "blob builder: built without crcs");
    if (i >= b->n)
        return dp__fail(d, DP_EINVAL, "blob builder: no entry %u (%u entries)", i, b->n);
    b->e[i].has_crc = true;
    b->e[i].crc = crc;
    if (b->laid_out)
        patch_be(b->index.data + b->e[i].crc_pos, crc, 4);
    return DP_OK;
}

static const char *
builder_key_of(const void *ctx, uint32_t j, uint32_t *len)
{
    const dp__blob_builder *b = ctx;
    *len = b->e[j].key_len;
    return (const char *)b->strs.data + b->e[j].key_at;
}

static int
check_duplicates(const dp__blob_builder *b, dp_detail *d)
{
    uint32_t cap = dp__blob_key_slots_for(b->n);
    uint32_t *slots = calloc(cap, sizeof *slots);
    if (slots == NULL)
        return dp__fail(d, DP_ENOMEM, "blob builder: no memory");
    dp__blob_key_table t = {slots, cap - 1, builder_key_of, b};
    int rc = DP_OK;
    for (uint32_t i = 0; i < b->n; i++) {
        uint32_t len;
        const char *k = builder_key_of(b, i, &len);
        if (dp__blob_key_slots_insert(&t, k, len, i) != UINT32_MAX) {
            char q[80];
            rc = dp__fail(d, DP_EINVAL, "blob builder: key '%s' added twice",
                          dp__quote_bytes(k, len, 60, q, sizeof q));
            break;
        }
    }
    free(slots);
    return rc;
}

int
dp__blob_builder_layout(dp__blob_builder *b, dp__blob_layout *out, dp_detail *d)
{
    b->laid_out = false;
    if (b->n == 0)
        return dp__fail(d, DP_EINVAL, "blob builder: a blob needs at least one entry");
    if (!b->keys_trusted) {
        int rc = check_duplicates(b, d);
        if (rc != DP_OK)
            return rc;
    }

    static const uint8_t off_placeholder[9] = {0xcf};
    static const uint8_t crc_placeholder[5] = {0xce};
    bool with_crc = (b->flags & DP_BLOB_FLAG_CRC) != 0;
    dp__buf_reset(&b->index);
    dp__mp_writer w;
    dp__mp_writer_init(&w, &b->index);
    dp__mp_put_array(&w, b->n);
    const uint64_t *dims = (const uint64_t *)(const void *)b->dims.data;
    for (uint32_t i = 0; i < b->n; i++) {
        struct bentry *e = &b->e[i];
        const char *strs = (const char *)b->strs.data;
        dp__mp_put_array(&w, ENTRY_FIELDS);
        dp__mp_put_strn(&w, strs + e->key_at, e->key_len);
        dp__mp_put_str(&w, dp__blob_kind_names[e->kind]);
        /* msgpack-c packs an empty str body with a NULL pointer fine. */
        dp__mp_put_strn(&w, e->dtype_len ? strs + e->dtype_at : "", e->dtype_len);
        dp__mp_put_array(&w, e->ndim);
        for (uint32_t k = 0; k < e->ndim; k++)
            dp__mp_put_u64(&w, dims[e->dims_at + k]);
        e->off_pos = b->index.len + 1;
        dp__buf_append(&b->index, off_placeholder, sizeof off_placeholder);
        dp__mp_put_u64(&w, e->len);
        if (with_crc) {
            e->crc_pos = b->index.len + 1;
            dp__buf_append(&b->index, crc_placeholder, sizeof crc_placeholder);
        } else {
            dp__mp_put_nil(&w);
        }
    }
    if (dp__mp_writer_status(&w) != DP_OK)
        return dp__fail(d, DP_ENOMEM, "blob builder: no memory for the index");
    uint64_t index_len = b->index.len;
    if (index_len > DP_BLOB_MAX_INDEX_LEN)
        return dp__fail(
            d, DP_ETOOBIG, "blob: index of %llu bytes, over the limit of %llu",
            (unsigned long long)index_len, (unsigned long long)DP_BLOB_MAX_INDEX_LEN);
    uint64_t payload_off = DP_ALIGN_UP(DP_BLOB_HEADER_LEN + index_len, DP_BLOB_ALIGN);
    uint64_t cursor = payload_off;
    const uint64_t limit = UINT64_MAX - 2 * DP_BLOB_ALIGN;
    for (uint32_t i = 0; i < b->n; i++) {
        struct bentry *e = &b->e[i];
        uint64_t off = DP_ALIGN_UP(cursor, DP_BLOB_ALIGN);
        if (e->len > limit - off)
            return dp__fail(d, DP_ETOOBIG, "blob: payloads overflow 64 bits at entry %u",
                            i);
        e->off = off;
        cursor = off + e->len;
        patch_be(b->index.data + e->off_pos, off, 8);
        if (with_crc)
            patch_be(b->index.data + e->crc_pos, e->crc, 4);
    }
    uint64_t total = DP_ALIGN_UP(cursor, DP_BLOB_ALIGN);
    if (total > SIZE_MAX)
        return dp__fail(d, DP_ETOOBIG, "blob: %llu bytes do not fit in memory",
                        (unsigned long long)total);
    b->layout = (dp__blob_layout){.n_entries = b->n,
                                  .index_len = index_len,
                                  .payload_off = payload_off,
                                  .total_len = total};
    b->laid_out = true;
    if (out != NULL)
        *out = b->layout;
    return DP_OK;
}

uint64_t
dp__blob_builder_offset(const dp__blob_builder *b, uint32_t i)
{
    DP_ASSERT(b->laid_out && i < b->n);
    return b->e[i].off;
}

uint64_t
dp__blob_builder_len(const dp__blob_builder *b, uint32_t i)
{
    DP_ASSERT(i < b->n);
    return b->e[i].len;
}

int
dp__blob_builder_write(const dp__blob_builder *b, void *dst, size_t cap, dp_detail *d)
{
    if (!b->laid_out)
        return dp__fail(d, DP_EINVAL, "blob builder: write before layout");
    if (b->flags & DP_BLOB_FLAG_CRC) {
        for (uint32_t i = 0; i < b->n; i++)
            if (!b->e[i].has_crc)
                return dp__fail(d, DP_EINVAL, "blob builder: entry %u has no crc yet", i);
    }
    const dp__blob_layout *l = &b->layout;
    if (dst == NULL || cap < l->payload_off)
        return dp__fail(d, DP_EINVAL,
                        "blob builder: %zu bytes given, header and index need %llu", cap,
                        (unsigned long long)l->payload_off);
    dp__blob_header h = {.version = DP_BLOB_VERSION,
                         .n_entries = b->n,
                         .index_len = l->index_len,
                         .payload_off = l->payload_off,
                         .total_len = l->total_len,
                         .index_crc = dp__crc32c(b->index.data, b->index.len),
                         .flags = b->flags};
    uint8_t *o = dst;
    dp__blob_header_encode(&h, o);
    memcpy(o + DP_BLOB_HEADER_LEN, b->index.data, b->index.len);
    size_t end = DP_BLOB_HEADER_LEN + b->index.len;
    memset(o + end, 0, (size_t)l->payload_off - end);
    return DP_OK;
}

int
dp__blob_builder_copy_payloads(const dp__blob_builder *b, void *dst, size_t cap,
                               dp_detail *d)
{
    if (!b->laid_out)
        return dp__fail(d, DP_EINVAL, "blob builder: copy before layout");
    const dp__blob_layout *l = &b->layout;
    if (dst == NULL || cap < l->total_len)
        return dp__fail(d, DP_EINVAL,
                        "blob builder: %zu bytes given, the blob needs %llu", cap,
                        (unsigned long long)l->total_len);
    uint8_t *o = dst;
    uint64_t pos = l->payload_off;
    for (uint32_t i = 0; i < b->n; i++) {
        const struct bentry *e = &b->e[i];
        memset(o + pos, 0, (size_t)(e->off - pos));
        if (e->payload != NULL && e->len > 0)
            memcpy(o + e->off, e->payload, (size_t)e->len);
        pos = e->off + e->len;
    }
    memset(o + pos, 0, (size_t)(l->total_len - pos));
    return DP_OK;
}
