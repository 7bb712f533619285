/*
 * Control-message codec, part 1: string views and validators, the text and
 * string writers, limits, op names, request ids, and requests with their
 * field tables (see wire.h for the contract). The field-table engine that
 * decodes and encodes every map-shaped message is in wire_fields.c (its
 * design notes are there); results, errors and replies in wire_reply.c.
 */
#include "wire/wire_int.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

/* ---- strings ---- */

dp__wire_str
dp__wire_s(const char *z)
{
    dp__wire_str s = {"", 0};
    if (z != NULL) {
        s.p = z;
        s.n = (uint32_t)strlen(z);
    }
    return s;
}

bool
dp__wire_str_eq(dp__wire_str s, const char *z)
{
    size_t n = strlen(z);
    return n == s.n && (n == 0 || memcmp(s.p, z, n) == 0);
}

bool
dp__wire_str_same(dp__wire_str a, dp__wire_str b)
{
    return a.n == b.n && (a.n == 0 || memcmp(a.p, b.p, a.n) == 0);
}

size_t
dp__wire_str_copy(dp__wire_str s, char *out, size_t cap)
{
    if (cap > 0) {
        size_t n = s.n < cap - 1 ? s.n : cap - 1;
        if (n > 0)
            memcpy(out, s.p, n);
        out[n] = '\0';
    }
    return s.n;
}

char *
dp__wire_str_dup(dp__wire_str s)
{
    char *z = malloc((size_t)s.n + 1);
    if (z != NULL)
        dp__wire_str_copy(s, z, (size_t)s.n + 1);
    return z;
}

/* Length of the well-formed UTF-8 sequence at s (1..4), 0 if ill-formed. */
static size_t
utf8_seq(const uint8_t *s, const uint8_t *e)
{
    uint8_t c = s[0];
    if (c < 0x80)
        return 1;
    size_t need;
    uint32_t cp, min;
    if (c >= 0xc2 && c <= 0xdf) {
        need = 1;
        cp = c & 0x1f;
        min = 0x80;
    } else if ((c & 0xf0) == 0xe0) {
        need = 2;
        cp = c & 0x0f;
        min = 0x800;
    } else if (c >= 0xf0 && c <= 0xf4) {
        need = 3;
        cp = c & 0x07;
        min = 0x10000;
    } else {
        return 0;
    }
    if ((size_t)(e - s) <= need)
        return 0;
    for (size_t i = 1; i <= need; i++) {
        if ((s[i] & 0xc0) != 0x80)
            return 0;
        cp = (cp << 6) | (s[i] & 0x3f);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
        return 0;
    return need + 1;
}

bool
dp__wire_utf8_valid(const void *p, size_t n)
{
    const uint8_t *s = p, *e = s + n;
    while (s < e) {
        if (*s < 0x80) {
            s++;
            continue;
        }
        size_t k = utf8_seq(s, e);
        if (k == 0)
            return false;
        s += k;
    }
    return true;
}

/* 0 if p[0..n) is UTF-8 without NUL, else 1 + the offset of the first bad byte. */
static size_t
text_bad(const char *p, uint32_t n)
{
    if (n == 0)
        return 0; /* p may be NULL: no pointer arithmetic on it */
    const uint8_t *s = (const uint8_t *)p, *e = s + n;
    while (s < e) {
        if (*s >= 0x20 && *s < 0x80) {
            s++;
            continue;
        }
        if (*s == 0)
            return (size_t)(s - (const uint8_t *)p) + 1;
        size_t k = utf8_seq(s, e);
        if (k == 0)
            return (size_t)(s - (const uint8_t *)p) + 1;
        s += k;
    }
    return 0;
}

const char *
dp__wire_quote(dp__wire_str s, char *buf, size_t cap)
{
    size_t max = cap > 4 ? cap - 4 : 0, i;
    for (i = 0; i < s.n && i < max; i++) {
        unsigned char ch = (unsigned char)s.p[i];
        buf[i] = ch >= 0x20 && ch < 0x7f ? (char)ch : '?';
    }
    if (i < s.n && cap >= 4) {
        memcpy(buf + i, "...", 3);
        i += 3;
    }
    if (cap > 0)
        buf[i < cap ? i : cap - 1] = '\0';
    return buf;
}

int
dp__wire_check_id(dp__wire_str s, const dp__wire_limits *lim, const char *what,
                  dp_detail *d)
{
    lim = DP__WIRE_LIM(lim);
    if (s.n == 0)
        return dp__fail(d, DP_EPROTO, "%s%sempty id", DP__WIRE_WHAT(what));
    if (s.n > lim->max_id)
        return dp__fail(d, DP_EPROTO, "%s%sid of %u bytes is longer than the limit %u",
                        DP__WIRE_WHAT(what), s.n, lim->max_id);
    size_t i = dp__id_bad_byte(s.p, s.n);
    if (i < s.n)
        return dp__fail(d, DP_EPROTO,
                        "%s%sbyte 0x%02x at %zu is not allowed in an id "
                        "(allowed: A-Z a-z 0-9 _ . : -)",
                        DP__WIRE_WHAT(what), (unsigned char)s.p[i], i);
    return DP_OK;
}

static int
check_text_like(dp__wire_str s, uint32_t min, uint32_t max, const char *kind,
                const char *what, dp_detail *d)
{
    if (s.n < min)
        return dp__fail(d, DP_EPROTO, "%s%sempty %s", DP__WIRE_WHAT(what), kind);
    if (s.n > max)
        return dp__fail(d, DP_EPROTO, "%s%s%s of %u bytes is longer than the limit %u",
                        DP__WIRE_WHAT(what), kind, s.n, max);
    size_t bad = text_bad(s.p, s.n);
    if (bad != 0) {
        unsigned char ch = (unsigned char)s.p[bad - 1];
        return dp__fail(d, DP_EPROTO, "%s%s%s has %s at byte %zu", DP__WIRE_WHAT(what),
                        kind, ch == 0 ? "a NUL" : "invalid UTF-8", bad - 1);
    }
    return DP_OK;
}

int
dp__wire_check_key(dp__wire_str s, const dp__wire_limits *lim, const char *what,
                   dp_detail *d)
{
    return check_text_like(s, 1, DP__WIRE_LIM(lim)->max_key, "key", what, d);
}

int
dp__wire_check_path(dp__wire_str s, const dp__wire_limits *lim, const char *what,
                    dp_detail *d)
{
    return check_text_like(s, 1, DP__WIRE_LIM(lim)->max_path, "path", what, d);
}

int
dp__wire_check_text(dp__wire_str s, const dp__wire_limits *lim, const char *what,
                    dp_detail *d)
{
    return check_text_like(s, 0, DP__WIRE_LIM(lim)->max_text, "string", what, d);
}

/* ---- writing strings ---- */

void
dp__wire_put_view(dp__mp_writer *w, dp__wire_str s)
{
    dp__mp_put_strn(w, s.n ? s.p : "", s.n);
}

void
dp__wire_put_text(dp__mp_writer *w, dp__wire_str s, uint32_t max)
{
    if (s.n <= max && text_bad(s.p, s.n) == 0) {
        dp__wire_put_view(w, s);
        return;
    }
    size_t cap = s.n < max ? s.n : max;
    char *t = malloc(cap + 1);
    if (t == NULL) {
        w->out->oom = true;
        return;
    }
    const uint8_t *p = (const uint8_t *)s.p, *e = p + s.n;
    size_t n = 0;
    while (p < e) {
        size_t k = *p == 0 ? 0 : utf8_seq(p, e);
        if (k == 0) {
            if (n + 1 > cap)
                break;
            t[n++] = '?';
            p++;
        } else {
            if (n + k > cap)
                break;
            memcpy(t + n, p, k);
            n += k;
            p += k;
        }
    }
    dp__mp_put_strn(w, t, n);
    free(t);
}

/* ---- limits ---- */

const dp__wire_limits dp__wire_limits_default = {
    .max_msg = 64ull << 20,
    .max_list = 1u << 20,
    .max_items = 1u << 23,
    .max_id = DP_ID_MAX,
    .max_key = 20 + 1 + 255,
    .max_path = PATH_MAX - 1,
    .max_text = 4096,
    .max_dims = 32,
    .max_fields = 4096,
    .max_entries = 1u << 20,
    .max_size = 1ull << 62,
    .max_read = 16ull << 20,
};

void
dp__wire_limits_init(dp__wire_limits *lim)
{
    *lim = dp__wire_limits_default;
}

/* ---- ops ---- */

static const char *const op_names[] = {
#define DP_WIRE_OP_NAME_(name, str, notify) str,
    DP_WIRE_OPS(DP_WIRE_OP_NAME_)
#undef DP_WIRE_OP_NAME_
};

static const bool op_notify[] = {
#define DP_WIRE_OP_NOTIFY_(name, str, notify) notify,
    DP_WIRE_OPS(DP_WIRE_OP_NOTIFY_)
#undef DP_WIRE_OP_NOTIFY_
};

const char *
dp__wire_op_name(dp__wire_op op)
{
    if ((int)op < 0 || op >= DP_WIRE_OP_COUNT_)
        return "?";
    return op_names[op];
}

dp__wire_op
dp__wire_op_parse(dp__wire_str s)
{
    for (int i = 0; i < DP_WIRE_OP_COUNT_; i++)
        if (dp__wire_str_eq(s, op_names[i]))
            return (dp__wire_op)i;
    return DP_WIRE_OP_NONE;
}

bool
dp__wire_op_is_notify(dp__wire_op op)
{
    return (int)op >= 0 && op < DP_WIRE_OP_COUNT_ && op_notify[op];
}

bool
dp__wire_op_repeatable(dp__wire_op op)
{
    switch (op) {
    case DP_WIRE_OP_PING:
    case DP_WIRE_OP_INFO:
    case DP_WIRE_OP_STATS:
    case DP_WIRE_OP_SCAN:
    case DP_WIRE_OP_READ_BYTES: /* read only */
    case DP_WIRE_OP_LIST_KEYS:
    case DP_WIRE_OP_LEASE: /* a grant is renewed by the next one */
    case DP_WIRE_OP_FENCE: /* a second fence of the same units: a later one */
    case DP_WIRE_OP_RESOLVE:
    case DP_WIRE_OP_RESOLVE_KEYS: /* a pin never answered ends with its lease */
    case DP_WIRE_OP_RESOLVE_ROWS:
    case DP_WIRE_OP_RELEASE_ROWS: /* idempotent */
    case DP_WIRE_OP_ALLOC:        /* same blob id and size: the same allocation */
    case DP_WIRE_OP_COMMIT:       /* done once: done (or lost), never twice */
        return true;
    default: /* put (inline: the blob id is then in use), save/load_shard, notifies */
        return false;
    }
}

/* ---- request ids ---- */

static const char hexdig[] = "0123456789abcdef";

int
dp__wire_rid_gen_init(dp__wire_rid_gen *g, dp_detail *d)
{
    uint8_t rnd[8];
    int rc = dp__random_bytes(rnd, sizeof rnd, d);
    if (rc != DP_OK)
        return rc;
    for (int i = 0; i < 8; i++) {
        g->prefix[2 * i] = hexdig[rnd[i] >> 4];
        g->prefix[2 * i + 1] = hexdig[rnd[i] & 15];
    }
    g->prefix[16] = '\0';
    g->next = 0;
    return DP_OK;
}

dp__wire_str
dp__wire_rid_next(dp__wire_rid_gen *g, char out[DP_WIRE_RID_MAX])
{
    uint64_t k = __atomic_fetch_add(&g->next, 1, __ATOMIC_RELAXED);
    memcpy(out, g->prefix, 16);
    out[16] = '-';
    char tmp[16];
    int n = 0;
    do {
        tmp[n++] = hexdig[k & 15];
        k >>= 4;
    } while (k != 0);
    for (int i = 0; i < n; i++)
        out[17 + i] = tmp[n - 1 - i];
    out[17 + n] = '\0';
    return (dp__wire_str){out, (uint32_t)(17 + n)};
}

/* ---- requests ---- */

/* One field-table row: name, value kind, required, default, offset. */
// clang-format off
#define F(t, n, k, r, df) {#n, DP__V_##k, r, df, (uint16_t)offsetof(t, n)}
// clang-format on

static const dp__wire_fdesc alloc_f[] = {
    F(dp__wire_alloc_args, blob_id, ID, 1, 0),
    F(dp__wire_alloc_args, nbytes, SIZE, 1, 0),
    F(dp__wire_alloc_args, n_entries, ENTRIES, 1, 0),
    F(dp__wire_alloc_args, spill, BOOL, 0, 1),
    F(dp__wire_alloc_args, writer, ID_OR_NIL, 0, 0),
    F(dp__wire_alloc_args, pid, U64, 0, 0),
    F(dp__wire_alloc_args, host, TEXT_OR_NIL, 0, 0),
    F(dp__wire_alloc_args, lane, TEXT_OR_NIL, 0, 0),
    F(dp__wire_alloc_args, two_sided, BOOL, 0, 0),
    F(dp__wire_alloc_args, repair, BOOL, 0, 0),
};
static const dp__wire_fdesc commit_f[] = {
    F(dp__wire_commit_args, blob_id, ID, 1, 0),
    F(dp__wire_commit_args, ver, U64, 0, 0),
    F(dp__wire_commit_args, vers, U64S, 0, 0),
};
static const dp__wire_fdesc put_f[] = {
    F(dp__wire_put_args, blob_id, ID, 1, 0),
    F(dp__wire_put_args, data, BIN, 1, 0),
    F(dp__wire_put_args, n_entries, ENTRIES, 1, 0),
    F(dp__wire_put_args, spill, BOOL, 0, 1),
    F(dp__wire_put_args, incarnation, U64, 0, 0),
    F(dp__wire_put_args, repair, BOOL, 0, 0),
    F(dp__wire_put_args, ver, U64, 0, 0),
    F(dp__wire_put_args, vers, U64S, 0, 0),
};
static const dp__wire_fdesc abort_f[] = {
    F(dp__wire_abort_args, blob_id, ID, 1, 0),
    F(dp__wire_abort_args, in_flight, BOOL, 0, 1),
};
static const dp__wire_fdesc resolve_f[] = {
    F(dp__wire_resolve_args, blob_ids, IDS, 1, 0),
};
static const dp__wire_fdesc resolve_keys_f[] = {
    F(dp__wire_resolve_keys_args, keys, KEYS, 1, 0),
    F(dp__wire_resolve_keys_args, inline_bytes, SIZE0, 0, 0),
};
static const dp__wire_fdesc resolve_rows_f[] = {
    F(dp__wire_resolve_rows_args, fields, KEYS, 1, 0),
    F(dp__wire_resolve_rows_args, rows, BIN, 1, 0),
    F(dp__wire_resolve_rows_args, inline_bytes, SIZE0, 0, 0),
};
static const dp__wire_fdesc unpin_f[] = {
    F(dp__wire_unpin_args, pin_id, ID, 1, 0),
};
static const dp__wire_fdesc release_rows_f[] = {
    F(dp__wire_release_rows_args, gidxs, U64S, 1, 0),
    F(dp__wire_release_rows_args, ver, U64, 0, 0),
};
static const dp__wire_fdesc read_bytes_f[] = {
    F(dp__wire_read_bytes_args, off, OFF, 1, 0),
    F(dp__wire_read_bytes_args, nbytes, READN, 1, 0),
};
static const dp__wire_fdesc save_shard_f[] = {
    F(dp__wire_save_shard_args, path, PATH, 1, 0),
    F(dp__wire_save_shard_args, home, BOOL, 0, 0),
};
static const dp__wire_fdesc load_shard_f[] = {
    F(dp__wire_load_shard_args, path, PATH, 1, 0),
    F(dp__wire_load_shard_args, blobs, SHARD_BLOBS, 1, 0),
    F(dp__wire_load_shard_args, spill, BOOL, 0, 0),
    F(dp__wire_load_shard_args, copy, U64, 0, 0),
};

static const dp__wire_fdesc list_keys_f[] = {
    F(dp__wire_list_keys_args, unit, U64, 1, 0),
    F(dp__wire_list_keys_args, from, U64, 0, 0),
    F(dp__wire_list_keys_args, max_rows, U64, 1, 0),
    F(dp__wire_list_keys_args, own, BOOL, 0, 0),
};
static const dp__wire_fdesc lease_f[] = {
    F(dp__wire_lease_args, unit, U64, 1, 0),
    F(dp__wire_lease_args, done, U64, 0, 0),
};
static const dp__wire_fdesc fence_f[] = {
    F(dp__wire_fence_args, units, U64S, 1, 0),
};

static const struct {
    const dp__wire_fdesc *f;
    size_t n;
} args_tab[DP_WIRE_OP_COUNT_] = {
#define T(op, tab) [DP_WIRE_OP_##op] = {tab, DP_ARRAY_LEN(tab)}
    T(ALLOC, alloc_f),
    T(COMMIT, commit_f),
    T(PUT, put_f),
    T(ABORT, abort_f),
    T(RESOLVE, resolve_f),
    T(RESOLVE_KEYS, resolve_keys_f),
    T(UNPIN, unpin_f),
    T(RELEASE_ROWS, release_rows_f),
    T(READ_BYTES, read_bytes_f),
    T(SAVE_SHARD, save_shard_f),
    T(LOAD_SHARD, load_shard_f),
    T(LIST_KEYS, list_keys_f),
    T(LEASE, lease_f),
    T(FENCE, fence_f),
    T(RESOLVE_ROWS, resolve_rows_f),
#undef T
};

int
dp__wire_request_encode(const dp__wire_request *req, const dp__wire_limits *lim,
                        dp__buf *out, dp_detail *d)
{
    lim = DP__WIRE_LIM(lim);
    if ((int)req->op < 0 || req->op >= DP_WIRE_OP_COUNT_)
        return dp__fail(d, DP_EINVAL, "request: invalid op %d", (int)req->op);
    size_t start = out->len;
    bool oom = out->oom;
    dp__mp_writer w;
    dp__mp_writer_init(&w, out);
    dp__mp_put_array(&w, 3);
    dp__mp_put_str(&w, op_names[req->op]);
    dp__wire_put_view(&w, req->rid);
    dp__wire_map_encode(&w, args_tab[req->op].f, args_tab[req->op].n, &req->a, lim);
    return dp__wire_encode_end(out, start, oom, lim, op_names[req->op], d);
}

/* The [op, rid, ...] head shared by peek and decode; *n gets the element count. */
static int
request_head(dp__mp_reader *r, const dp__wire_limits *lim, dp__wire_op *op,
             dp__wire_str *rid, uint32_t *n, dp_detail *d)
{
    *op = DP_WIRE_OP_NONE;
    *rid = (dp__wire_str){"", 0};
    int rc = dp__mp_read_array(r, n, "request", d);
    if (rc != DP_OK)
        return rc;
    if (*n < 2)
        return dp__fail(d, DP_EPROTO,
                        "request: array of %u elements, expected [op, request_id, args]",
                        *n);
    dp__wire_str name, id;
    if ((rc = dp__mp_read_str(r, &name.p, &name.n, "op", d)) != DP_OK)
        return rc;
    if ((rc = dp__mp_read_str(r, &id.p, &id.n, "request_id", d)) != DP_OK)
        return rc;
    if ((rc = dp__wire_check_id(id, lim, "request_id", d)) != DP_OK)
        return rc;
    *rid = id;
    *op = dp__wire_op_parse(name);
    if (*op == DP_WIRE_OP_NONE) {
        char q[80];
        return dp__fail(d, DP_EPROTO, "unknown op '%s'",
                        dp__wire_quote(name, q, sizeof q));
    }
    return DP_OK;
}

int
dp__wire_request_peek(const void *msg, size_t len, const dp__wire_limits *lim,
                      dp__wire_op *op, dp__wire_str *rid, dp_detail *d)
{
    dp__mp_reader r;
    uint32_t n;
    dp__mp_reader_init(&r, msg, len);
    return request_head(&r, DP__WIRE_LIM(lim), op, rid, &n, d);
}

int
dp__wire_request_decode(const void *msg, size_t len, const dp__wire_limits *lim,
                        dp__wire_request *req, dp_detail *d)
{
    lim = DP__WIRE_LIM(lim);
    memset(req, 0, sizeof *req);
    dp__wire_dec c = {.lim = lim, .d = d, .mem = &req->mem_};
    dp__mp_reader_init(&c.r, msg, len);
    uint32_t n;
    int rc = request_head(&c.r, lim, &req->op, &req->rid, &n, d);
    if (rc != DP_OK)
        return rc;
    const char *name = op_names[req->op];
    if (len > lim->max_msg)
        return dp__fail(d, DP_ETOOBIG, "%s: message of %zu bytes is over the limit %llu",
                        name, len, (unsigned long long)lim->max_msg);
    if (n != 3)
        return dp__fail(d, DP_EPROTO,
                        "%s: request of %u elements, expected [op, request_id, args]",
                        name, n);
    rc = dp__wire_map_decode(&c, args_tab[req->op].f, args_tab[req->op].n, true, &req->a,
                             "args");
    if (rc != DP_OK) {
        rc = dp__fail_ctx(d, rc, "%s args", name);
        goto fail;
    }
    if (dp__mp_remaining(&c.r) != 0) {
        rc = dp__fail(d, DP_EPROTO, "%s: %zu trailing bytes after the request", name,
                      dp__mp_remaining(&c.r));
        goto fail;
    }
    return DP_OK;
fail:
    dp__wire_free_all(&req->mem_);
    memset(&req->a, 0, sizeof req->a);
    return rc;
}

void
dp__wire_request_fini(dp__wire_request *req)
{
    if (req == NULL)
        return;
    dp__wire_free_all(&req->mem_);
    memset(req, 0, sizeof *req);
    req->op = DP_WIRE_OP_NONE;
}
