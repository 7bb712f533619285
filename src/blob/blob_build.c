/*
 * Blob layout version 3: the client-side sizer and builder (format and rules
 * in blob.h): sizes before building, the header's encoding, and the builder
 * that lays a blob out and writes it. The unit-side parser/validator, the
 * kinds and the key table both use are blob_parse.c; what the two share is
 * blob_int.h.
 *
 * Design notes
 * - An entry's bytes in the index depend on its dtype and dims only, never
 *   on its offset or CRC: the layout sums them, places the payloads, and
 *   writes the index once; a CRC set later is patched in place.
 * - Fields are declared once a blob (dp__blob_builder_field) and entries name
 *   them by number, so a put's keys are never formatted or split.
 */
#include "blob/blob.h"

#include <stdlib.h>
#include <string.h>

#include "blob/blob_int.h"
#include "blob/crc32c.h"
#include "blob/keys.h"
#include "common/common.h"
#include "common/le.h"
#include "common/map.h"

/* ---- sizes before building (dp__blob_sizer): what the builder writes ---- */

void
dp__blob_sizer_init(dp__blob_sizer *z, uint32_t flags)
{
    (void)flags; /* a CRC takes its 4 bytes either way */
    memset(z, 0, sizeof *z);
}

void
dp__blob_sizer_field(dp__blob_sizer *z, size_t field_len)
{
    z->fields += 1 + field_len;
}

void
dp__blob_sizer_add(dp__blob_sizer *z, size_t dtype_len, uint32_t ndim, uint64_t len)
{
    z->index_body += dp__blob_v3_entry_len((uint32_t)dtype_len, ndim);
    z->payloads += DP_ALIGN_UP(len, DP_BLOB_ALIGN);
    if (z->payloads < len) /* overflow: never a valid blob */
        z->payloads = UINT64_MAX;
    z->n++;
}

uint64_t
dp__blob_sizer_index_len(const dp__blob_sizer *z)
{
    return DP_ALIGN_UP(4 + z->fields, 8) + z->index_body;
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
    uint64_t gidx;
    uint32_t field;  /* its number in the builder's fields */
    size_t dtype_at; /* offset into the builder's string arena */
    uint32_t dtype_len;
    size_t dims_at; /* index into the dims arena (uint64_t units) */
    uint32_t ndim;
    dp__blob_kind kind;
    uint64_t len;
    const void *payload;
    bool has_crc;
    uint32_t crc;
    uint64_t off;
    size_t crc_pos; /* where crc's 4 bytes sit in the index */
};

struct bfield {
    size_t at; /* offset into the string arena */
    uint32_t len;
};

/* Fields past this many are found through a map, not a scan. */
#define FIELD_SCAN 8

struct dp__blob_builder {
    uint32_t flags;
    bool keys_trusted;
    struct bentry *e;
    uint32_t n, cap;
    struct bfield *f;
    uint32_t nf, fcap;
    dp__map fmap; /* field bytes -> number + 1, once past FIELD_SCAN */
    dp__buf strs;
    dp__buf dims;
    dp__buf index;
    bool laid_out;
    dp__blob_layout layout;
    /* The last entry's dtype, checked for its kind and kept at
     * last_dtype_at: the next entry with the same bytes and kind (a put's
     * usual run) reuses both (has_last false: none since the reset). */
    uint64_t entries_len; /* the entries' part of the index, as added */
    bool has_last;
    dp__blob_kind last_kind;
    uint32_t last_dtype_len;
    size_t last_dtype_at;
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
    dp__map_init_str(&b->fmap);
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
    free(b->f);
    dp__map_fini(&b->fmap);
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
    if (b->nf > FIELD_SCAN) {
        dp__map_fini(&b->fmap);
        dp__map_init_str(&b->fmap);
    }
    b->nf = 0;
    dp__buf_reset(&b->strs);
    dp__buf_reset(&b->dims);
    dp__buf_reset(&b->index);
    b->laid_out = false;
    b->has_last = false;
    b->entries_len = 0;
}

uint32_t
dp__blob_builder_count(const dp__blob_builder *b)
{
    return b->n;
}

static const char *
field_at(const dp__blob_builder *b, uint32_t i)
{
    return (const char *)b->strs.data + b->f[i].at;
}

/* Field f[0..len)'s number, or UINT32_MAX when not declared yet. */
static uint32_t
field_find(const dp__blob_builder *b, const char *f, size_t len)
{
    if (b->nf <= FIELD_SCAN) {
        for (uint32_t i = 0; i < b->nf; i++)
            if (b->f[i].len == len && memcmp(field_at(b, i), f, len) == 0)
                return i;
        return UINT32_MAX;
    }
    void *v = dp__map_get(&b->fmap, f, len);
    return v != NULL ? (uint32_t)((uintptr_t)v - 1) : UINT32_MAX;
}

/* Field field[0..len)'s number, declared when new (checked first if check). */
static int
field_intern(dp__blob_builder *b, const char *field, size_t len, bool check,
             uint32_t *idx, dp_detail *d)
{
    if (check) {
        int rc = dp__field_check(field, len, d);
        if (rc != DP_OK)
            return rc;
    }
    uint32_t i = field_find(b, field, len);
    if (i != UINT32_MAX) {
        *idx = i;
        return DP_OK;
    }
    if (b->nf == b->fcap) {
        uint32_t cap = b->fcap == 0 ? 8 : b->fcap * 2;
        struct bfield *nf = realloc(b->f, (size_t)cap * sizeof *nf);
        if (nf == NULL)
            return dp__fail(d, DP_ENOMEM, "blob builder: no memory for %u fields", cap);
        b->f = nf;
        b->fcap = cap;
    }
    i = b->nf++;
    b->f[i] = (struct bfield){b->strs.len, (uint32_t)len};
    dp__buf_append(&b->strs, field, len);
    dp__buf_append(&b->strs, "", 1); /* NUL-terminated: quoted in messages */
    if (b->strs.oom)
        return dp__fail(d, DP_ENOMEM, "blob builder: no memory");
    if (b->nf == FIELD_SCAN + 1) { /* from now on by map: index the ones so far */
        for (uint32_t k = 0; k < b->nf; k++)
            if (dp__map_put(&b->fmap, field_at(b, k), b->f[k].len,
                            (void *)(uintptr_t)(k + 1), NULL) != DP_OK)
                return dp__fail(d, DP_ENOMEM, "blob builder: no memory");
    } else if (b->nf > FIELD_SCAN &&
               dp__map_put(&b->fmap, field_at(b, i), (size_t)len,
                           (void *)(uintptr_t)(i + 1), NULL) != DP_OK) {
        return dp__fail(d, DP_ENOMEM, "blob builder: no memory");
    }
    *idx = i;
    return DP_OK;
}

int
dp__blob_builder_field(dp__blob_builder *b, const char *field, size_t len, uint32_t *idx,
                       dp_detail *d)
{
    return field_intern(b, field, len, !b->keys_trusted, idx, d);
}

/* The entry's row and field: from its key (split, its field declared) or as given. */
static int
spec_key(dp__blob_builder *b, const dp__blob_entry_spec *s, uint64_t *gidx,
         uint32_t *field, dp_detail *d)
{
    if (s->key == NULL) {
        if (s->field >= b->nf)
            return dp__fail(d, DP_EINVAL,
                            "blob builder: field %u was not declared (%u fields)",
                            s->field, b->nf);
        *gidx = s->gidx;
        *field = s->field;
        return DP_OK;
    }
    size_t key_len = s->key_len != 0 ? s->key_len : strlen(s->key);
    dp__key_parts kp;
    int rc = dp__key_split(s->key, key_len, &kp, d);
    if (rc != DP_OK)
        return rc;
    *gidx = kp.gidx;
    return field_intern(b, kp.field, kp.field_len, false, field, d); /* split: checked */
}

/* a[0..n) (no NUL in it) is the NUL-terminated s: read no further than s's NUL. */
static bool
same_str(const char *a, uint32_t n, const char *s)
{
    for (uint32_t i = 0; i < n; i++)
        if (a[i] != s[i])
            return false;
    return s[n] == '\0';
}

/* Entry (gidx, field)'s key, quoted for a message, into q. */
static const char *
quote_key(const dp__blob_builder *b, uint64_t gidx, uint32_t field, char *q, size_t cap)
{
    char k[DP_KEY_MAX + 1];
    size_t n = dp__key_format(gidx, field_at(b, field), b->f[field].len, k);
    return dp__quote_bytes(k, n, 60, q, cap);
}

int
dp__blob_builder_add(dp__blob_builder *b, const dp__blob_entry_spec *s, uint32_t *idx,
                     dp_detail *d)
{
    char q[80];
    uint64_t gidx = 0;
    uint32_t field = 0;
    int rc = spec_key(b, s, &gidx, &field, d);
    if (rc != DP_OK)
        return rc;
        /* The quoted key, made only on an error path (this runs per entry). */
#define qk quote_key(b, gidx, field, q, sizeof q)
    if ((unsigned)s->kind >= DP_ARRAY_LEN(dp__blob_kind_names))
        return dp__fail(d, DP_EINVAL, "blob entry '%s': unknown kind %d", qk,
                        (int)s->kind);
    const char *dtype = s->dtype != NULL ? s->dtype : "";
    if (!b->has_last || s->kind != b->last_kind ||
        !same_str((const char *)b->strs.data + b->last_dtype_at, b->last_dtype_len,
                  dtype)) {
        size_t dtype_len = strnlen(dtype, DP_BLOB_DTYPE_MAX + 1);
        const char *why = dp__blob_dtype_problem(dtype, dtype_len, s->kind);
        if (why != NULL)
            return dp__fail(d, DP_EINVAL, "blob entry '%s': %s", qk, why);
        b->last_kind = s->kind;
        b->last_dtype_len = (uint32_t)dtype_len;
        b->last_dtype_at = b->strs.len;
        dp__buf_append(&b->strs, dtype, dtype_len);
        b->has_last = !b->strs.oom;
    }
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
    e->gidx = gidx;
    e->field = field;
    e->dtype_at = b->last_dtype_at;
    e->dtype_len = b->last_dtype_len;
    e->dims_at = b->dims.len / sizeof(uint64_t);
    e->ndim = s->ndim;
    if (s->ndim > 0)
        dp__buf_append(&b->dims, s->shape, s->ndim * sizeof(uint64_t));
    if (b->strs.oom || b->dims.oom)
        return dp__fail(d, DP_ENOMEM, "blob builder: no memory");
    e->kind = s->kind;
    e->len = s->len;
    e->payload = s->payload;
    e->has_crc = false;
    e->crc = 0;
    e->off = 0;
    e->crc_pos = 0;
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
    b->entries_len += dp__blob_v3_entry_len(e->dtype_len, e->ndim);
    return DP_OK;
#undef qk
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
        dp__le32_store(b->index.data + b->e[i].crc_pos, crc);
    return DP_OK;
}

static const char *
builder_key_of(const void *ctx, uint32_t j, uint64_t *gidx, uint32_t *len)
{
    const dp__blob_builder *b = ctx;
    *gidx = b->e[j].gidx;
    *len = b->f[b->e[j].field].len;
    return field_at(b, b->e[j].field);
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
        uint64_t g;
        uint32_t len;
        const char *f = builder_key_of(b, i, &g, &len);
        if (dp__blob_key_slots_insert(&t, g, f, len, i) != UINT32_MAX) {
            char q[80];
            rc = dp__fail(d, DP_EINVAL, "blob builder: key '%s' added twice",
                          quote_key(b, g, b->e[i].field, q, sizeof q));
            break;
        }
    }
    free(slots);
    return rc;
}

/* The index of the laid-out entries into b->index (sized index_len). */
static void
write_index(dp__blob_builder *b, uint64_t index_len)
{
    uint8_t *o = (uint8_t *)b->index.data, *p = o;
    dp__le32_store(p, b->nf);
    p += 4;
    for (uint32_t i = 0; i < b->nf; i++) {
        *p++ = (uint8_t)b->f[i].len;
        memcpy(p, field_at(b, i), b->f[i].len);
        p += b->f[i].len;
    }
    size_t pad = (size_t)(DP_ALIGN_UP((uint64_t)(p - o), 8) - (uint64_t)(p - o));
    memset(p, 0, pad);
    p += pad;
    const char *strs = (const char *)b->strs.data;
    const uint64_t *dims = (const uint64_t *)(const void *)b->dims.data;
    for (uint32_t i = 0; i < b->n; i++) {
        struct bentry *e = &b->e[i];
        dp__le64_store(p, e->gidx);
        dp__le64_store(p + 8, e->off);
        dp__le64_store(p + 16, e->len);
        dp__le32_store(p + 24, e->field);
        e->crc_pos = (size_t)(p + 28 - o);
        dp__le32_store(p + 28, e->has_crc ? e->crc : 0);
        p[32] = (uint8_t)e->kind;
        p[33] = (uint8_t)e->dtype_len;
        p[34] = (uint8_t)e->ndim;
        p[35] = 0;
        p += DP_BLOB_ENTRY_FIXED;
        memcpy(p, strs + e->dtype_at, e->dtype_len);
        p += e->dtype_len;
        for (uint32_t k = 0; k < e->ndim; k++, p += 8)
            dp__le64_store(p, dims[e->dims_at + k]);
    }
    DP_ASSERT((uint64_t)(p - o) == index_len);
    b->index.len = (size_t)index_len;
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
    uint64_t fields = 4;
    for (uint32_t i = 0; i < b->nf; i++)
        fields += 1 + (uint64_t)b->f[i].len;
    uint64_t index_len = DP_ALIGN_UP(fields, 8) + b->entries_len;
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
    }
    uint64_t total = DP_ALIGN_UP(cursor, DP_BLOB_ALIGN);
    if (total > SIZE_MAX)
        return dp__fail(d, DP_ETOOBIG, "blob: %llu bytes do not fit in memory",
                        (unsigned long long)total);
    dp__buf_reset(&b->index);
    if (dp__buf_reserve(&b->index, (size_t)index_len) != DP_OK)
        return dp__fail(d, DP_ENOMEM, "blob builder: no memory for the index");
    write_index(b, index_len);
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
