/*
 * Bounds-checked msgpack cursor and a msgpack writer into a dp__buf (see mp.h).
 * The reader decodes the msgpack format directly instead of going through
 * msgpack_unpack(): msgpack-c sizes its object arrays from the headers it
 * reads, so a few hostile bytes could make it allocate gigabytes. The writer
 * encodes directly too: msgpack-c's packer calls a write callback for every
 * piece, which cost a third of the time of encoding a blob index of small
 * entries. tests/test_mp.c checks both against msgpack-c.
 */
#include "wire/mp.h"

#include <string.h>

void
dp__mp_reader_init(dp__mp_reader *r, const void *data, size_t len)
{
    r->base = data;
    r->p = data;
    r->end = data == NULL ? r->p : r->p + len;
}

size_t
dp__mp_remaining(const dp__mp_reader *r)
{
    return (size_t)(r->end - r->p);
}

size_t
dp__mp_offset(const dp__mp_reader *r)
{
    return (size_t)(r->p - r->base);
}

static dp__mp_type
type_of(uint8_t b)
{
    if (b <= 0x7f || b == 0xcc || b == 0xcd || b == 0xce || b == 0xcf)
        return DP_MP_UINT;
    if (b >= 0xe0 || b == 0xd0 || b == 0xd1 || b == 0xd2 || b == 0xd3)
        return DP_MP_INT;
    if ((b & 0xf0) == 0x80 || b == 0xde || b == 0xdf)
        return DP_MP_MAP;
    if ((b & 0xf0) == 0x90 || b == 0xdc || b == 0xdd)
        return DP_MP_ARRAY;
    if ((b & 0xe0) == 0xa0 || b == 0xd9 || b == 0xda || b == 0xdb)
        return DP_MP_STR;
    switch (b) {
    case 0xc0:
        return DP_MP_NIL;
    case 0xc2:
    case 0xc3:
        return DP_MP_BOOL;
    case 0xc4:
    case 0xc5:
    case 0xc6:
        return DP_MP_BIN;
    case 0xca:
    case 0xcb:
        return DP_MP_FLOAT;
    case 0xc7:
    case 0xc8:
    case 0xc9:
    case 0xd4:
    case 0xd5:
    case 0xd6:
    case 0xd7:
    case 0xd8:
        return DP_MP_EXT;
    default:
        return DP_MP_INVALID;
    }
}

dp__mp_type
dp__mp_peek(const dp__mp_reader *r)
{
    return r->p < r->end ? type_of(*r->p) : DP_MP_END;
}

const char *
dp__mp_type_name(dp__mp_type t)
{
    static const char *const names[] = {
        [DP_MP_END] = "end of message",
        [DP_MP_NIL] = "nil",
        [DP_MP_BOOL] = "bool",
        [DP_MP_UINT] = "uint",
        [DP_MP_INT] = "int",
        [DP_MP_FLOAT] = "float",
        [DP_MP_STR] = "str",
        [DP_MP_BIN] = "bin",
        [DP_MP_ARRAY] = "array",
        [DP_MP_MAP] = "map",
        [DP_MP_EXT] = "ext",
        [DP_MP_INVALID] = "invalid byte",
    };
    return (unsigned)t < DP_ARRAY_LEN(names) ? names[t] : "?";
}

static int
mismatch(const dp__mp_reader *r, const char *want, const char *what, dp_detail *d)
{
    return dp__fail(d, DP_EPROTO, "%s%sexpected %s, got %s at byte %zu", what ? what : "",
                    what ? ": " : "", want, dp__mp_type_name(dp__mp_peek(r)),
                    dp__mp_offset(r));
}

static int
truncated(const dp__mp_reader *r, const char *what, dp_detail *d)
{
    return dp__fail(d, DP_EPROTO, "%s%struncated value at byte %zu", what ? what : "",
                    what ? ": " : "", dp__mp_offset(r));
}

static uint64_t
be(const uint8_t *p, unsigned n)
{
    uint64_t v = 0;
    for (unsigned i = 0; i < n; i++)
        v = (v << 8) | p[i];
    return v;
}

/*
 * Decode the header at r->p: its type, the width of the header, and its
 * argument (value for ints, length for str/bin/ext payloads, count for
 * containers). Returns false when the header itself is cut short.
 */
struct hdr {
    dp__mp_type type;
    size_t hlen;  /* header bytes */
    uint64_t arg; /* int value bits, payload length, or element count */
    size_t extra; /* ext: the type byte */
};

static bool
header(const dp__mp_reader *r, struct hdr *h)
{
    size_t left = dp__mp_remaining(r);
    if (left == 0)
        return false;
    uint8_t b = r->p[0];
    const uint8_t *q = r->p + 1;
    h->type = type_of(b);
    h->extra = 0;
    unsigned w = 0; /* width of a big-endian argument after the tag */
    if (b <= 0x7f) {
        h->hlen = 1;
        h->arg = b;
        return true;
    }
    if (b >= 0xe0) {
        h->hlen = 1;
        h->arg = (uint64_t)(int64_t)(int8_t)b;
        return true;
    }
    if ((b & 0xf0) == 0x80 || (b & 0xf0) == 0x90) {
        h->hlen = 1;
        h->arg = b & 0x0f;
        return true;
    }
    if ((b & 0xe0) == 0xa0) {
        h->hlen = 1;
        h->arg = b & 0x1f;
        return true;
    }
    switch (b) {
    case 0xc0:
    case 0xc2:
    case 0xc3:
    case 0xc1:
        h->hlen = 1;
        h->arg = b == 0xc3;
        return true;
    case 0xcc:
    case 0xd0:
    case 0xd9:
    case 0xc4:
        w = 1;
        break;
    case 0xcd:
    case 0xd1:
    case 0xda:
    case 0xc5:
    case 0xdc:
    case 0xde:
        w = 2;
        break;
    case 0xce:
    case 0xd2:
    case 0xdb:
    case 0xc6:
    case 0xdd:
    case 0xdf:
    case 0xca:
        w = 4;
        break;
    case 0xcf:
    case 0xd3:
    case 0xcb:
        w = 8;
        break;
    case 0xd4:
    case 0xd5:
    case 0xd6:
    case 0xd7:
    case 0xd8: /* fixext 1, 2, 4, 8, 16: tag, type byte, data */
        if (left < 2)
            return false;
        h->hlen = 2;
        h->extra = 1;
        h->arg = 1u << (b - 0xd4);
        return true;
    case 0xc7:
    case 0xc8:
    case 0xc9: /* ext 8/16/32: tag, length, type byte, data */
        w = 1u << (b - 0xc7);
        if (left < 2 + w)
            return false;
        h->hlen = 2 + w;
        h->extra = 1;
        h->arg = be(q, w);
        return true;
    }
    if (left < 1 + w)
        return false;
    h->hlen = 1 + w;
    h->arg = be(q, w);
    if (b == 0xd0 || b == 0xd1 || b == 0xd2) { /* sign-extend */
        unsigned bits = 8 * w;
        uint64_t sign = 1ull << (bits - 1);
        h->arg = (h->arg ^ sign) - sign;
    }
    return true;
}

int
dp__mp_read_nil(dp__mp_reader *r, const char *what, dp_detail *d)
{
    if (dp__mp_peek(r) != DP_MP_NIL)
        return mismatch(r, "nil", what, d);
    r->p++;
    return DP_OK;
}

bool
dp__mp_take_nil(dp__mp_reader *r)
{
    if (dp__mp_peek(r) != DP_MP_NIL)
        return false;
    r->p++;
    return true;
}

int
dp__mp_read_bool(dp__mp_reader *r, bool *v, const char *what, dp_detail *d)
{
    if (dp__mp_peek(r) != DP_MP_BOOL)
        return mismatch(r, "bool", what, d);
    *v = *r->p == 0xc3;
    r->p++;
    return DP_OK;
}

int
dp__mp_read_u64(dp__mp_reader *r, uint64_t *v, const char *what, dp_detail *d)
{
    /* Fast paths for what blob indexes and requests carry most: positive
     * fixint and uint 8..64 (builders patch offsets in as uint 64). */
    if (r->p < r->end && *r->p <= 0x7f) {
        *v = *r->p++;
        return DP_OK;
    }
    if (r->p < r->end && *r->p >= 0xcc && *r->p <= 0xcf) { /* uint 8..64 */
        unsigned w = 1u << (*r->p - 0xcc);
        if ((size_t)(r->end - r->p) > w) {
            *v = be(r->p + 1, w);
            r->p += 1 + w;
            return DP_OK;
        }
    }
    dp__mp_type t = dp__mp_peek(r);
    if (t != DP_MP_UINT && t != DP_MP_INT)
        return mismatch(r, "unsigned integer", what, d);
    struct hdr h;
    if (!header(r, &h))
        return truncated(r, what, d);
    /* int 8..64 may carry a non-negative value (valid msgpack, other encoders). */
    if (t == DP_MP_INT && (int64_t)h.arg < 0)
        return dp__fail(d, DP_EPROTO, "%s%snegative integer at byte %zu",
                        what ? what : "", what ? ": " : "", dp__mp_offset(r));
    *v = h.arg;
    r->p += h.hlen;
    return DP_OK;
}

int
dp__mp_read_i64(dp__mp_reader *r, int64_t *v, const char *what, dp_detail *d)
{
    dp__mp_type t = dp__mp_peek(r);
    if (t != DP_MP_UINT && t != DP_MP_INT)
        return mismatch(r, "integer", what, d);
    struct hdr h;
    if (!header(r, &h))
        return truncated(r, what, d);
    if (t == DP_MP_UINT && h.arg > (uint64_t)INT64_MAX)
        return dp__fail(d, DP_EPROTO, "%s%sinteger out of range at byte %zu",
                        what ? what : "", what ? ": " : "", dp__mp_offset(r));
    *v = (int64_t)h.arg;
    r->p += h.hlen;
    return DP_OK;
}

int
dp__mp_read_double(dp__mp_reader *r, double *v, const char *what, dp_detail *d)
{
    dp__mp_type t = dp__mp_peek(r);
    if (t == DP_MP_UINT || t == DP_MP_INT) {
        struct hdr h;
        if (!header(r, &h))
            return truncated(r, what, d);
        *v = t == DP_MP_UINT ? (double)h.arg : (double)(int64_t)h.arg;
        r->p += h.hlen;
        return DP_OK;
    }
    if (t != DP_MP_FLOAT)
        return mismatch(r, "number", what, d);
    struct hdr h;
    if (!header(r, &h))
        return truncated(r, what, d);
    if (h.hlen == 5) {
        uint32_t bits = (uint32_t)h.arg;
        float f;
        memcpy(&f, &bits, sizeof f);
        *v = f;
    } else {
        uint64_t bits = h.arg;
        memcpy(v, &bits, sizeof *v);
    }
    r->p += h.hlen;
    return DP_OK;
}

static int
read_bytes(dp__mp_reader *r, dp__mp_type want, const uint8_t **p, uint32_t *len,
           const char *what, dp_detail *d)
{
    if (dp__mp_peek(r) != want)
        return mismatch(r, dp__mp_type_name(want), what, d);
    struct hdr h;
    if (!header(r, &h))
        return truncated(r, what, d);
    if (h.arg > dp__mp_remaining(r) - h.hlen)
        return dp__fail(d, DP_EPROTO,
                        "%s%s%s of %llu bytes at byte %zu runs past the end",
                        what ? what : "", what ? ": " : "", dp__mp_type_name(want),
                        (unsigned long long)h.arg, dp__mp_offset(r));
    *p = r->p + h.hlen;
    *len = (uint32_t)h.arg;
    r->p += h.hlen + h.arg;
    return DP_OK;
}

int
dp__mp_read_str(dp__mp_reader *r, const char **s, uint32_t *len, const char *what,
                dp_detail *d)
{
    /* Fast path: fixstr (keys, kinds, dtypes, ids). */
    if (r->p < r->end && (*r->p & 0xe0) == 0xa0) {
        uint32_t n = *r->p & 0x1f;
        if ((size_t)(r->end - r->p) - 1 >= n) {
            *s = (const char *)r->p + 1;
            *len = n;
            r->p += 1 + n;
            return DP_OK;
        }
    }
    const uint8_t *p = NULL; /* set when rc is DP_OK (some -O3 builds cannot tell) */
    int rc = read_bytes(r, DP_MP_STR, &p, len, what, d);
    if (rc == DP_OK)
        *s = (const char *)p;
    return rc;
}

int
dp__mp_read_bin(dp__mp_reader *r, const uint8_t **p, uint32_t *len, const char *what,
                dp_detail *d)
{
    return read_bytes(r, DP_MP_BIN, p, len, what, d);
}

static int
read_container(dp__mp_reader *r, dp__mp_type want, uint32_t *n, const char *what,
               dp_detail *d)
{
    if (dp__mp_peek(r) != want)
        return mismatch(r, dp__mp_type_name(want), what, d);
    struct hdr h;
    if (!header(r, &h))
        return truncated(r, what, d);
    /* Every element takes at least one byte (a map entry two). */
    uint64_t min_bytes = want == DP_MP_MAP ? 2 * h.arg : h.arg;
    if (min_bytes > dp__mp_remaining(r) - h.hlen)
        return dp__fail(d, DP_EPROTO,
                        "%s%s%s of %llu elements at byte %zu is longer than the message",
                        what ? what : "", what ? ": " : "", dp__mp_type_name(want),
                        (unsigned long long)h.arg, dp__mp_offset(r));
    *n = (uint32_t)h.arg;
    r->p += h.hlen;
    return DP_OK;
}

int
dp__mp_read_array(dp__mp_reader *r, uint32_t *n, const char *what, dp_detail *d)
{
    /* Fast path: fixarray whose elements (a byte each at least) fit. */
    if (r->p < r->end && (*r->p & 0xf0) == 0x90) {
        uint32_t k = *r->p & 0x0f;
        if ((size_t)(r->end - r->p) - 1 >= k) {
            *n = k;
            r->p++;
            return DP_OK;
        }
    }
    return read_container(r, DP_MP_ARRAY, n, what, d);
}

int
dp__mp_read_map(dp__mp_reader *r, uint32_t *n, const char *what, dp_detail *d)
{
    return read_container(r, DP_MP_MAP, n, what, d);
}

int
dp__mp_skip(dp__mp_reader *r, dp_detail *d)
{
    /* Iterative: pending[k] counts the values still to skip at depth k. */
    uint64_t pending[DP_MP_MAX_DEPTH + 1];
    unsigned depth = 0;
    const uint8_t *start = r->p;
    pending[0] = 1;
    for (;;) {
        while (depth > 0 && pending[depth] == 0)
            depth--;
        if (pending[depth] == 0)
            return DP_OK;
        pending[depth]--;
        struct hdr h;
        if (!header(r, &h)) {
            int rc = truncated(r, NULL, d);
            r->p = start;
            return rc;
        }
        size_t left = dp__mp_remaining(r) - h.hlen;
        switch (h.type) {
        case DP_MP_INVALID:
            r->p = start;
            return dp__fail(d, DP_EPROTO, "invalid msgpack byte 0xc1 at byte %zu",
                            dp__mp_offset(r));
        case DP_MP_STR:
        case DP_MP_BIN:
        case DP_MP_EXT:
            if (h.arg > left) {
                int rc = truncated(r, NULL, d);
                r->p = start;
                return rc;
            }
            r->p += h.hlen + h.arg;
            break;
        case DP_MP_ARRAY:
        case DP_MP_MAP: {
            uint64_t n = h.type == DP_MP_MAP ? 2 * h.arg : h.arg;
            if (n > left) {
                int rc = truncated(r, NULL, d);
                r->p = start;
                return rc;
            }
            r->p += h.hlen;
            if (n > 0) {
                if (depth == DP_MP_MAX_DEPTH) {
                    r->p = start;
                    return dp__fail(d, DP_EPROTO, "msgpack nested deeper than %d",
                                    DP_MP_MAX_DEPTH);
                }
                pending[++depth] = n;
            }
            break;
        }
        default:
            r->p += h.hlen;
            break;
        }
    }
}

/* ---- writer ---- */

/*
 * Room for n more bytes at the end of w's buffer, or NULL (the buffer is then
 * marked oom and every later write is dropped). This runs for every value of
 * every message and blob index, so the common case is one comparison.
 */
static inline uint8_t *
room(dp__mp_writer *w, size_t n)
{
    dp__buf *b = w->out;
    if (b->oom || (b->cap - b->len < n && dp__buf_reserve(b, n) != DP_OK))
        return NULL;
    return b->data + b->len;
}

/* Tag byte then v in w bytes, big-endian. */
static inline void
put_tagged(dp__mp_writer *w, uint8_t tag, uint64_t v, unsigned nbytes)
{
    uint8_t *p = room(w, 1 + nbytes);
    if (p == NULL)
        return;
    p[0] = tag;
    for (unsigned i = 0; i < nbytes; i++)
        p[1 + i] = (uint8_t)(v >> (8 * (nbytes - 1 - i)));
    w->out->len += 1 + nbytes;
}

static inline void
put_raw(dp__mp_writer *w, const void *src, size_t n)
{
    if (n == 0)
        return;
    uint8_t *p = room(w, n);
    if (p == NULL)
        return;
    memcpy(p, src, n);
    w->out->len += n;
}

/* A length header: fix form under fix_max, then 8/16/32-bit forms. */
static inline void
put_len(dp__mp_writer *w, size_t n, uint8_t fix, size_t fix_max, uint8_t t8, uint8_t t16,
        uint8_t t32)
{
    if (n < fix_max)
        put_tagged(w, (uint8_t)(fix | n), 0, 0);
    else if (t8 != 0 && n <= 0xff)
        put_tagged(w, t8, n, 1);
    else if (n <= 0xffff)
        put_tagged(w, t16, n, 2);
    else
        put_tagged(w, t32, n, 4);
}

void
dp__mp_writer_init(dp__mp_writer *w, dp__buf *out)
{
    w->out = out;
}

void
dp__mp_put_nil(dp__mp_writer *w)
{
    put_tagged(w, 0xc0, 0, 0);
}

void
dp__mp_put_bool(dp__mp_writer *w, bool v)
{
    put_tagged(w, v ? 0xc3 : 0xc2, 0, 0);
}

void
dp__mp_put_u64(dp__mp_writer *w, uint64_t v)
{
    if (v < 0x80)
        put_tagged(w, (uint8_t)v, 0, 0);
    else if (v <= 0xff)
        put_tagged(w, 0xcc, v, 1);
    else if (v <= 0xffff)
        put_tagged(w, 0xcd, v, 2);
    else if (v <= 0xffffffffu)
        put_tagged(w, 0xce, v, 4);
    else
        put_tagged(w, 0xcf, v, 8);
}

void
dp__mp_put_i64(dp__mp_writer *w, int64_t v)
{
    if (v >= 0)
        dp__mp_put_u64(w, (uint64_t)v);
    else if (v >= -32)
        put_tagged(w, (uint8_t)(int8_t)v, 0, 0);
    else if (v >= INT8_MIN)
        put_tagged(w, 0xd0, (uint64_t)v & 0xff, 1);
    else if (v >= INT16_MIN)
        put_tagged(w, 0xd1, (uint64_t)v & 0xffff, 2);
    else if (v >= INT32_MIN)
        put_tagged(w, 0xd2, (uint64_t)v & 0xffffffffu, 4);
    else
        put_tagged(w, 0xd3, (uint64_t)v, 8);
}

void
dp__mp_put_double(dp__mp_writer *w, double v)
{
    uint64_t bits;
    memcpy(&bits, &v, sizeof bits);
    put_tagged(w, 0xcb, bits, 8);
}

void
dp__mp_put_str(dp__mp_writer *w, const char *s)
{
    dp__mp_put_strn(w, s, strlen(s));
}

void
dp__mp_put_strn(dp__mp_writer *w, const char *s, size_t n)
{
    put_len(w, n, 0xa0, 32, 0xd9, 0xda, 0xdb);
    put_raw(w, s, n);
}

void
dp__mp_put_bin(dp__mp_writer *w, const void *p, size_t n)
{
    put_len(w, n, 0, 0, 0xc4, 0xc5, 0xc6);
    put_raw(w, p, n);
}

void
dp__mp_put_array(dp__mp_writer *w, uint32_t n)
{
    put_len(w, n, 0x90, 16, 0, 0xdc, 0xdd);
}

void
dp__mp_put_map(dp__mp_writer *w, uint32_t n)
{
    put_len(w, n, 0x80, 16, 0, 0xde, 0xdf);
}

int
dp__mp_writer_status(const dp__mp_writer *w)
{
    return w->out->oom ? DP_ENOMEM : DP_OK;
}
