/*
 * Control-message codec: the field-table engine shared by every map-shaped
 * message (requests in wire.c; results and the error map in wire_reply.c):
 * decoder allocations, the value decoders and encoders, map decode and
 * encode, and the size check that ends an encode (see wire_int.h).
 *
 * Design notes:
 * - Every map with fixed keys (each op's args, most results, the error map) is
 *   described once by a table of (name, value kind, required, default,
 *   offset). The same table drives the decoder and the encoder, so the two
 *   cannot disagree on names, types or optionality.
 * - Decoded lists live in blocks chained from the request/reply (mem_); one
 *   _fini frees them all. Every list length is checked against max_list and
 *   charged to a per-message budget (max_items) before anything is allocated,
 *   and the reader has already checked that the bytes for that many elements
 *   exist, so memory stays proportional to min(message, limits).
 * - Details are built outward: a value names itself ("nbytes: ..."), the map
 *   decoder leaves it, and the framing adds the op ("alloc args: nbytes: ...").
 */
#include "wire/wire_int.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

/* ---- allocations ---- */

#define BLK_HDR sizeof(struct dp_wire_blk)
_Static_assert(sizeof(struct dp_wire_blk) % 16 == 0, "block data must stay aligned");

void *
dp__wire_alloc(struct dp_wire_blk **head, size_t n)
{
    struct dp_wire_blk *b = calloc(1, BLK_HDR + n);
    if (b == NULL)
        return NULL;
    b->size = n;
    b->next = *head;
    *head = b;
    return (char *)b + BLK_HDR;
}

void
dp__wire_free_all(struct dp_wire_blk **head)
{
    struct dp_wire_blk *b = *head;
    while (b != NULL) {
        struct dp_wire_blk *next = b->next;
        free(b);
        b = next;
    }
    *head = NULL;
}

void *
dp__wire_pool_push(dp__wire_pool *p)
{
    if (p->n == p->cap) {
        size_t cap = p->cap ? 2 * p->cap : 16;
        struct dp_wire_blk *b = realloc(p->b, BLK_HDR + cap * p->esz);
        if (b == NULL)
            return NULL;
        p->b = b;
        p->cap = cap;
    }
    char *e = (char *)p->b + BLK_HDR + p->n * p->esz;
    memset(e, 0, p->esz);
    p->n++;
    return e;
}

void *
dp__wire_pool_finish(dp__wire_pool *p, struct dp_wire_blk **head)
{
    if (p->b == NULL)
        return NULL;
    struct dp_wire_blk *b = p->b;
    b->size = p->n * p->esz;
    b->next = *head;
    *head = b;
    p->b = NULL;
    return (char *)b + BLK_HDR;
}

void
dp__wire_pool_drop(dp__wire_pool *p)
{
    free(p->b);
    p->b = NULL;
    p->n = p->cap = 0;
}

int
dp__wire_charge(dp__wire_dec *c, uint64_t n, const char *what)
{
    if (n > c->lim->max_list)
        return dp__fail(c->d, DP_ETOOBIG,
                        "%s%slist of %llu items is longer than the limit %u",
                        DP__WIRE_WHAT(what), (unsigned long long)n, c->lim->max_list);
    c->items += n;
    if (c->items > c->lim->max_items)
        return dp__fail(c->d, DP_ETOOBIG, "%s%smore than %u list items in one message",
                        DP__WIRE_WHAT(what), c->lim->max_items);
    return DP_OK;
}

/* ---- values ---- */

static int
nomem(dp__wire_dec *c, const char *what)
{
    return dp__fail(c->d, DP_ENOMEM, "%s%sout of memory", DP__WIRE_WHAT(what));
}

static int
rd_str_checked(dp__wire_dec *c, int k, dp__wire_str *s, const char *what)
{
    int rc = dp__mp_read_str(&c->r, &s->p, &s->n, what, c->d);
    if (rc != DP_OK)
        return rc;
    switch (k) {
    case DP__V_ID:
    case DP__V_ID_OR_NIL:
    case DP__V_IDS:
        return dp__wire_check_id(*s, c->lim, what, c->d);
    case DP__V_PATH:
        return dp__wire_check_path(*s, c->lim, what, c->d);
    case DP__V_KEYS:
    case DP__V_KEYS_OR_NIL:
        return dp__wire_check_key(*s, c->lim, what, c->d);
    default:
        return dp__wire_check_text(*s, c->lim, what, c->d);
    }
}

static int
rd_bounded(dp__wire_dec *c, uint64_t *v, uint64_t lo, uint64_t hi, int code,
           const char *what)
{
    int rc = dp__mp_read_u64(&c->r, v, what, c->d);
    if (rc != DP_OK)
        return rc;
    if (*v < lo)
        return dp__fail(c->d, DP_EPROTO, "%s%s%llu is below the minimum %llu",
                        DP__WIRE_WHAT(what), (unsigned long long)*v,
                        (unsigned long long)lo);
    if (*v > hi)
        return dp__fail(c->d, code, "%s%s%llu is above the limit %llu",
                        DP__WIRE_WHAT(what), (unsigned long long)*v,
                        (unsigned long long)hi);
    return DP_OK;
}

static int
rd_list_head(dp__wire_dec *c, uint32_t *n, const char *what)
{
    int rc = dp__mp_read_array(&c->r, n, what, c->d);
    if (rc == DP_OK)
        rc = dp__wire_charge(c, *n, what);
    return rc;
}

static int
rd_strs(dp__wire_dec *c, int k, dp__wire_strs *out, const char *what)
{
    uint32_t n;
    int rc = rd_list_head(c, &n, what);
    if (rc != DP_OK)
        return rc;
    out->n = 0;
    out->v = NULL;
    if (n == 0)
        return DP_OK;
    dp__wire_str *v = dp__wire_alloc(c->mem, (size_t)n * sizeof *v);
    if (v == NULL)
        return nomem(c, what);
    for (uint32_t i = 0; i < n; i++) {
        rc = rd_str_checked(c, k, &v[i], NULL);
        if (rc != DP_OK)
            return dp__fail_ctx(c->d, rc, "%s[%u]", what, i);
    }
    out->v = v;
    out->n = n;
    return DP_OK;
}

static int
rd_u64s(dp__wire_dec *c, dp__wire_u64s *out, const char *what)
{
    uint32_t n;
    int rc = rd_list_head(c, &n, what);
    if (rc != DP_OK)
        return rc;
    out->n = 0;
    out->v = NULL;
    if (n == 0)
        return DP_OK;
    uint64_t *v = dp__wire_alloc(c->mem, (size_t)n * sizeof *v);
    if (v == NULL)
        return nomem(c, what);
    for (uint32_t i = 0; i < n; i++) {
        rc = dp__mp_read_u64(&c->r, &v[i], NULL, c->d);
        if (rc != DP_OK)
            return dp__fail_ctx(c->d, rc, "%s[%u]", what, i);
    }
    out->v = v;
    out->n = n;
    return DP_OK;
}

/* The header of a data-keyed map: an element count like a list's. */
static int
rd_dmap_head(dp__wire_dec *c, uint32_t *n, const char *what)
{
    int rc = dp__mp_read_map(&c->r, n, what, c->d);
    if (rc == DP_OK)
        rc = dp__wire_charge(c, *n, what);
    return rc;
}

/* The [..] tuple of a data-keyed map entry: exactly want elements. */
static int
rd_tuple(dp__wire_dec *c, uint32_t want)
{
    uint32_t n;
    int rc = dp__mp_read_array(&c->r, &n, NULL, c->d);
    if (rc != DP_OK)
        return rc;
    if (n != want)
        return dp__fail(c->d, DP_EPROTO, "array of %u elements, expected %u", n, want);
    return DP_OK;
}

static int
rd_shard_blobs(dp__wire_dec *c, dp__wire_shard_blobs *out, const char *what)
{
    uint32_t n;
    int rc = rd_dmap_head(c, &n, what);
    if (rc != DP_OK)
        return rc;
    out->n = 0;
    out->v = NULL;
    if (n == 0)
        return DP_OK;
    dp__wire_shard_blob *v = dp__wire_alloc(c->mem, (size_t)n * sizeof *v);
    if (v == NULL)
        return nomem(c, what);
    char q[80];
    for (uint32_t i = 0; i < n; i++) {
        dp__wire_shard_blob *b = &v[i];
        rc = rd_str_checked(c, DP__V_ID, &b->id, NULL);
        if (rc != DP_OK)
            return dp__fail_ctx(c->d, rc, "%s: key %u", what, i);
        uint64_t max = c->lim->max_size - 1;
        if ((rc = rd_tuple(c, 3)) != DP_OK ||
            (rc = rd_bounded(c, &b->off, 0, max, DP_EPROTO, "off")) != DP_OK ||
            (rc = rd_bounded(c, &b->nbytes, 0, max, DP_ETOOBIG, "nbytes")) != DP_OK ||
            (rc = rd_bounded(c, &b->refs, 0, max, DP_EPROTO, "refs")) != DP_OK)
            return dp__fail_ctx(c->d, rc, "%s: '%s'", what,
                                dp__wire_quote(b->id, q, sizeof q));
    }
    out->v = v;
    out->n = n;
    return DP_OK;
}

static int
rd_blob_locs(dp__wire_dec *c, dp__wire_blob_locs *out, const char *what)
{
    uint32_t n;
    int rc = rd_dmap_head(c, &n, what);
    if (rc != DP_OK)
        return rc;
    out->n = 0;
    out->v = NULL;
    if (n == 0)
        return DP_OK;
    dp__wire_blob_loc *v = dp__wire_alloc(c->mem, (size_t)n * sizeof *v);
    if (v == NULL)
        return nomem(c, what);
    char q[80];
    for (uint32_t i = 0; i < n; i++) {
        dp__wire_blob_loc *b = &v[i];
        rc = rd_str_checked(c, DP__V_ID, &b->id, NULL);
        if (rc != DP_OK)
            return dp__fail_ctx(c->d, rc, "%s: key %u", what, i);
        uint64_t max = c->lim->max_size - 1;
        if ((rc = rd_tuple(c, 2)) != DP_OK ||
            (rc = rd_bounded(c, &b->off, 0, max, DP_EPROTO, "off")) != DP_OK ||
            (rc = rd_bounded(c, &b->len, 0, max, DP_ETOOBIG, "len")) != DP_OK)
            return dp__fail_ctx(c->d, rc, "%s: '%s'", what,
                                dp__wire_quote(b->id, q, sizeof q));
    }
    out->v = v;
    out->n = n;
    return DP_OK;
}

/* A value's description: kind, dtype and shape (its dims pushed onto dims). */
static int
rd_desc(dp__wire_dec *c, dp__wire_str *kind, dp__wire_str *dtype, uint32_t *ndim,
        dp__wire_pool *dims)
{
    int rc;
    uint32_t nd;
    if ((rc = rd_str_checked(c, DP__V_TEXT, kind, "kind")) != DP_OK ||
        (rc = rd_str_checked(c, DP__V_TEXT, dtype, "dtype")) != DP_OK ||
        (rc = dp__mp_read_array(&c->r, &nd, "shape", c->d)) != DP_OK)
        return rc;
    if (nd > c->lim->max_dims)
        return dp__fail(c->d, DP_EPROTO, "shape: %u dims, the limit is %u", nd,
                        c->lim->max_dims);
    if ((rc = dp__wire_charge(c, nd, "shape")) != DP_OK)
        return rc;
    for (uint32_t j = 0; j < nd; j++) {
        uint64_t *dim = dp__wire_pool_push(dims);
        if (dim == NULL)
            return nomem(c, "shape");
        rc = rd_bounded(c, dim, 0, c->lim->max_size - 1, DP_EPROTO, NULL);
        if (rc != DP_OK)
            return dp__fail_ctx(c->d, rc, "shape[%u]", j);
    }
    *ndim = nd;
    return DP_OK;
}

static int
rd_key_loc(dp__wire_dec *c, dp__wire_key_loc *e, dp__wire_pool *dims)
{
    uint64_t max = c->lim->max_size - 1;
    int rc;
    uint32_t n;
    if ((rc = dp__mp_read_array(&c->r, &n, NULL, c->d)) != DP_OK)
        return rc;
    if (n != 5 && n != 6)
        return dp__fail(c->d, DP_EPROTO, "array of %u elements, expected 5 or 6", n);
    if ((rc = rd_bounded(c, &e->off, 0, max, DP_EPROTO, "off")) != DP_OK ||
        (rc = rd_bounded(c, &e->len, 0, max, DP_ETOOBIG, "len")) != DP_OK ||
        (rc = rd_desc(c, &e->kind, &e->dtype, &e->ndim, dims)) != DP_OK)
        return rc;
    e->data = (dp__wire_bytes){NULL, 0};
    if (n == 6) {
        /* The value itself: exactly len bytes, never empty (nothing to carry). */
        if ((rc = dp__mp_read_bin(&c->r, &e->data.p, &e->data.n, "data", c->d)) != DP_OK)
            return rc;
        if (e->data.n == 0 || e->data.n != e->len)
            return dp__fail(c->d, DP_EPROTO,
                            "data: %u bytes for a value of %" PRIu64 " bytes", e->data.n,
                            e->len);
    }
    return DP_OK;
}

static int
rd_key_locs(dp__wire_dec *c, dp__wire_key_locs *out, const char *what)
{
    uint32_t n;
    int rc = rd_dmap_head(c, &n, what);
    if (rc != DP_OK)
        return rc;
    out->n = 0;
    out->v = NULL;
    if (n == 0)
        return DP_OK;
    dp__wire_key_loc *v = dp__wire_alloc(c->mem, (size_t)n * sizeof *v);
    if (v == NULL)
        return nomem(c, what);
    dp__wire_pool dims = {.esz = sizeof(uint64_t)};
    char q[80];
    for (uint32_t i = 0; i < n; i++) {
        rc = rd_str_checked(c, DP__V_KEYS, &v[i].key, NULL);
        if (rc != DP_OK) {
            rc = dp__fail_ctx(c->d, rc, "%s: key %u", what, i);
            goto fail;
        }
        rc = rd_key_loc(c, &v[i], &dims);
        if (rc != DP_OK) {
            rc = dp__fail_ctx(c->d, rc, "%s: '%s'", what,
                              dp__wire_quote(v[i].key, q, sizeof q));
            goto fail;
        }
    }
    /* Dims were pushed in entry order: hand out consecutive slices. */
    const uint64_t *all = dp__wire_pool_finish(&dims, c->mem);
    size_t pos = 0;
    for (uint32_t i = 0; i < n; i++) {
        v[i].shape = v[i].ndim > 0 ? all + pos : NULL;
        pos += v[i].ndim;
    }
    out->v = v;
    out->n = n;
    return DP_OK;
fail:
    dp__wire_pool_drop(&dims);
    return rc;
}

/* [[kind, dtype, shape]]: the distinct descriptions of a resolve_rows answer. */
static int
rd_descs(dp__wire_dec *c, dp__wire_descs *out, const char *what)
{
    uint32_t n;
    int rc = rd_list_head(c, &n, what);
    if (rc != DP_OK)
        return rc;
    out->n = 0;
    out->v = NULL;
    if (n == 0)
        return DP_OK;
    dp__wire_desc *v = dp__wire_alloc(c->mem, (size_t)n * sizeof *v);
    if (v == NULL)
        return nomem(c, what);
    dp__wire_pool dims = {.esz = sizeof(uint64_t)};
    for (uint32_t i = 0; i < n; i++) {
        uint32_t na;
        dp__wire_desc *e = &v[i];
        if ((rc = dp__mp_read_array(&c->r, &na, NULL, c->d)) == DP_OK && na != 3)
            rc = dp__fail(c->d, DP_EPROTO, "array of %u elements, expected 3", na);
        if (rc == DP_OK)
            rc = rd_desc(c, &e->kind, &e->dtype, &e->ndim, &dims);
        if (rc != DP_OK) {
            dp__wire_pool_drop(&dims);
            return dp__fail_ctx(c->d, rc, "%s[%u]", what, i);
        }
    }
    const uint64_t *all = dp__wire_pool_finish(&dims, c->mem);
    size_t pos = 0;
    for (uint32_t i = 0; i < n; i++) {
        v[i].shape = v[i].ndim > 0 ? all + pos : NULL;
        pos += v[i].ndim;
    }
    out->v = v;
    out->n = n;
    return DP_OK;
}

int
dp__wire_value_decode(dp__wire_dec *c, int k, const char *what, void *p)
{
    const dp__wire_limits *lim = c->lim;
    switch (k) {
    case DP__V_ID_OR_NIL:
    case DP__V_TEXT_OR_NIL:
        if (dp__mp_take_nil(&c->r)) {
            *(dp__wire_str *)p = (dp__wire_str){"", 0};
            return DP_OK;
        }
        /* fall through */
    case DP__V_ID:
    case DP__V_PATH:
    case DP__V_TEXT:
        return rd_str_checked(c, k, p, what);
    case DP__V_BOOL:
        return dp__mp_read_bool(&c->r, p, what, c->d);
    case DP__V_U64:
        return dp__mp_read_u64(&c->r, p, what, c->d);
    case DP__V_OFF:
        return rd_bounded(c, p, 0, lim->max_size - 1, DP_EPROTO, what);
    case DP__V_SIZE:
        return rd_bounded(c, p, 1, lim->max_size - 1, DP_ETOOBIG, what);
    case DP__V_SIZE0:
        return rd_bounded(c, p, 0, lim->max_size - 1, DP_ETOOBIG, what);
    case DP__V_ENTRIES:
        return rd_bounded(c, p, 0, lim->max_entries, DP_ETOOBIG, what);
    case DP__V_READN:
        return rd_bounded(c, p, 0, lim->max_read, DP_ETOOBIG, what);
    case DP__V_BIN: {
        dp__wire_bytes *b = p;
        return dp__mp_read_bin(&c->r, &b->p, &b->n, what, c->d);
    }
    case DP__V_KEYS_OR_NIL:
        if (dp__mp_take_nil(&c->r)) {
            *(dp__wire_strs *)p = (dp__wire_strs){NULL, 0};
            return DP_OK;
        }
        /* fall through */
    case DP__V_IDS:
    case DP__V_KEYS:
        return rd_strs(c, k, p, what);
    case DP__V_U64S:
        return rd_u64s(c, p, what);
    case DP__V_SHARD_BLOBS:
        return rd_shard_blobs(c, p, what);
    case DP__V_BLOB_LOCS:
        return rd_blob_locs(c, p, what);
    case DP__V_KEY_LOCS:
        return rd_key_locs(c, p, what);
    case DP__V_DESCS:
        return rd_descs(c, p, what);
    }
    DP_ASSERT(!"unknown value kind");
    return DP_EPROTO;
}

int
dp__wire_map_decode(dp__wire_dec *c, const dp__wire_fdesc *f, size_t nf, bool strict,
                    void *base, const char *what)
{
    DP_ASSERT(nf <= 64);
    uint32_t n;
    int rc = dp__mp_read_map(&c->r, &n, what, c->d);
    if (rc != DP_OK)
        return rc;
    uint64_t seen = 0;
    char q[80];
    for (uint32_t i = 0; i < n; i++) {
        dp__wire_str key;
        rc = dp__mp_read_str(&c->r, &key.p, &key.n, "map key", c->d);
        if (rc != DP_OK)
            return rc;
        size_t j;
        for (j = 0; j < nf; j++)
            if (dp__wire_str_eq(key, f[j].name))
                break;
        if (j == nf) {
            if (strict)
                return dp__fail(c->d, DP_EPROTO, "unknown key '%s'",
                                dp__wire_quote(key, q, sizeof q));
            if ((rc = dp__mp_skip(&c->r, c->d)) != DP_OK)
                return dp__fail_ctx(c->d, rc, "%s", dp__wire_quote(key, q, sizeof q));
            continue;
        }
        if (seen & (1ull << j))
            return dp__fail(c->d, DP_EPROTO, "duplicate key '%s'", f[j].name);
        seen |= 1ull << j;
        rc = dp__wire_value_decode(c, f[j].kind, f[j].name, (char *)base + f[j].off);
        if (rc != DP_OK)
            return rc;
    }
    for (size_t j = 0; j < nf; j++) {
        if (seen & (1ull << j))
            continue;
        if (f[j].required)
            return dp__fail(c->d, DP_EPROTO, "missing key '%s'", f[j].name);
        void *p = (char *)base + f[j].off;
        switch (f[j].kind) {
        case DP__V_BOOL:
            *(bool *)p = f[j].def != 0;
            break;
        case DP__V_ID:
        case DP__V_ID_OR_NIL:
        case DP__V_PATH:
        case DP__V_TEXT:
        case DP__V_TEXT_OR_NIL:
            *(dp__wire_str *)p = (dp__wire_str){"", 0};
            break;
        case DP__V_BIN:
            *(dp__wire_bytes *)p = (dp__wire_bytes){(const uint8_t *)"", 0};
            break;
        default: /* numbers 0, lists empty: the struct was zeroed */
            break;
        }
    }
    return DP_OK;
}

/* ---- encoding ---- */

/* A value's description: kind, dtype, [dims]. */
static void
put_desc(dp__mp_writer *w, dp__wire_str kind, dp__wire_str dtype, const uint64_t *shape,
         uint32_t ndim, const dp__wire_limits *lim)
{
    dp__wire_put_text(w, kind, lim->max_text);
    dp__wire_put_text(w, dtype, lim->max_text);
    dp__mp_put_array(w, ndim);
    for (uint32_t j = 0; j < ndim; j++)
        dp__mp_put_u64(w, shape[j]);
}

static void
put_strs(dp__mp_writer *w, const dp__wire_strs *l)
{
    dp__mp_put_array(w, l->n);
    for (uint32_t i = 0; i < l->n; i++)
        dp__wire_put_view(w, l->v[i]);
}

void
dp__wire_value_encode(dp__mp_writer *w, int k, const void *p, const dp__wire_limits *lim)
{
    switch (k) {
    case DP__V_ID_OR_NIL:
        if (((const dp__wire_str *)p)->n == 0) {
            dp__mp_put_nil(w);
            return;
        }
        /* fall through */
    case DP__V_ID:
    case DP__V_PATH:
        dp__wire_put_view(w, *(const dp__wire_str *)p);
        return;
    case DP__V_TEXT_OR_NIL:
        if (((const dp__wire_str *)p)->n == 0) {
            dp__mp_put_nil(w);
            return;
        }
        /* fall through */
    case DP__V_TEXT:
        dp__wire_put_text(w, *(const dp__wire_str *)p, lim->max_text);
        return;
    case DP__V_BOOL:
        dp__mp_put_bool(w, *(const bool *)p);
        return;
    case DP__V_U64:
    case DP__V_OFF:
    case DP__V_SIZE:
    case DP__V_SIZE0:
    case DP__V_ENTRIES:
    case DP__V_READN:
        dp__mp_put_u64(w, *(const uint64_t *)p);
        return;
    case DP__V_BIN: {
        const dp__wire_bytes *b = p;
        dp__mp_put_bin(w, b->n ? b->p : (const uint8_t *)"", b->n);
        return;
    }
    case DP__V_KEYS_OR_NIL:
        if (((const dp__wire_strs *)p)->n == 0) {
            dp__mp_put_nil(w);
            return;
        }
        /* fall through */
    case DP__V_IDS:
    case DP__V_KEYS:
        put_strs(w, p);
        return;
    case DP__V_U64S: {
        const dp__wire_u64s *l = p;
        dp__mp_put_array(w, l->n);
        for (uint32_t i = 0; i < l->n; i++)
            dp__mp_put_u64(w, l->v[i]);
        return;
    }
    case DP__V_SHARD_BLOBS: {
        const dp__wire_shard_blobs *l = p;
        dp__mp_put_map(w, l->n);
        for (uint32_t i = 0; i < l->n; i++) {
            dp__wire_put_view(w, l->v[i].id);
            dp__mp_put_array(w, 3);
            dp__mp_put_u64(w, l->v[i].off);
            dp__mp_put_u64(w, l->v[i].nbytes);
            dp__mp_put_u64(w, l->v[i].refs);
        }
        return;
    }
    case DP__V_BLOB_LOCS: {
        const dp__wire_blob_locs *l = p;
        dp__mp_put_map(w, l->n);
        for (uint32_t i = 0; i < l->n; i++) {
            dp__wire_put_view(w, l->v[i].id);
            dp__mp_put_array(w, 2);
            dp__mp_put_u64(w, l->v[i].off);
            dp__mp_put_u64(w, l->v[i].len);
        }
        return;
    }
    case DP__V_KEY_LOCS: {
        const dp__wire_key_locs *l = p;
        dp__mp_put_map(w, l->n);
        for (uint32_t i = 0; i < l->n; i++) {
            const dp__wire_key_loc *e = &l->v[i];
            dp__wire_put_view(w, e->key);
            dp__mp_put_array(w, e->data.n > 0 ? 6 : 5);
            dp__mp_put_u64(w, e->off);
            dp__mp_put_u64(w, e->len);
            put_desc(w, e->kind, e->dtype, e->shape, e->ndim, lim);
            if (e->data.n > 0)
                dp__mp_put_bin(w, e->data.p, e->data.n);
        }
        return;
    }
    case DP__V_DESCS: {
        const dp__wire_descs *l = p;
        dp__mp_put_array(w, l->n);
        for (uint32_t i = 0; i < l->n; i++) {
            const dp__wire_desc *e = &l->v[i];
            dp__mp_put_array(w, 3);
            put_desc(w, e->kind, e->dtype, e->shape, e->ndim, lim);
        }
        return;
    }
    }
    DP_ASSERT(!"unknown value kind");
}

void
dp__wire_map_encode(dp__mp_writer *w, const dp__wire_fdesc *f, size_t nf,
                    const void *base, const dp__wire_limits *lim)
{
    dp__mp_put_map(w, (uint32_t)nf);
    for (size_t j = 0; j < nf; j++) {
        dp__mp_put_str(w, f[j].name);
        dp__wire_value_encode(w, f[j].kind, (const char *)base + f[j].off, lim);
    }
}

int
dp__wire_encode_end(dp__buf *out, size_t start, bool oom_before,
                    const dp__wire_limits *lim, const char *what, dp_detail *d)
{
    if (out->oom && !oom_before) {
        out->len = start;
        out->oom = false;
        return dp__fail(d, DP_ENOMEM, "%s: out of memory while encoding", what);
    }
    if (out->oom)
        return dp__fail(d, DP_ENOMEM, "%s: output buffer already out of memory", what);
    size_t n = out->len - start;
    if (n > lim->max_msg) {
        out->len = start;
        return dp__fail(d, DP_ETOOBIG, "%s: message of %zu bytes is over the limit %llu",
                        what, n, (unsigned long long)lim->max_msg);
    }
    return DP_OK;
}
