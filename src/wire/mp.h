/*
 * msgpack reading and writing for every byte string that crosses a trust
 * boundary (control messages, blob indexes, checkpoint files).
 *
 * The reader is a bounds-checked cursor over untrusted bytes. It allocates
 * nothing, never reads past the end, and rejects every length that claims more
 * elements or bytes than remain (so a 5-byte message cannot make anyone
 * allocate gigabytes). Strings and bins come back as pointers into the input.
 * Each failure is DP_EPROTO with a detail that names what was expected, what
 * was found, and at which byte offset.
 *
 * The writer encodes straight into a dp__buf, always in the shortest form (as
 * msgpack-c's packer does), so any msgpack reader takes what it writes.
 *
 * Threads: a reader or writer belongs to one thread at a time.
 */
#ifndef DP_WIRE_MP_H
#define DP_WIRE_MP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/common.h"

/* Deepest nesting dp__mp_skip() follows before it reports DP_EPROTO. */
#define DP_MP_MAX_DEPTH 32

typedef enum dp__mp_type {
    DP_MP_END = 0, /* no bytes left */
    DP_MP_NIL,
    DP_MP_BOOL,
    DP_MP_UINT, /* non-negative integer (any width) */
    DP_MP_INT,  /* signed format (negative fixint, int 8..64): usually negative */
    DP_MP_FLOAT,
    DP_MP_STR,
    DP_MP_BIN,
    DP_MP_ARRAY,
    DP_MP_MAP,
    DP_MP_EXT,
    DP_MP_INVALID, /* 0xc1, the one byte msgpack never uses */
} dp__mp_type;

typedef struct dp__mp_reader {
    const uint8_t *base;
    const uint8_t *p;
    const uint8_t *end;
} dp__mp_reader;

void dp__mp_reader_init(dp__mp_reader *r, const void *data, size_t len);
size_t dp__mp_remaining(const dp__mp_reader *r);
size_t dp__mp_offset(const dp__mp_reader *r);
/* The type of the next value, without consuming it. */
dp__mp_type dp__mp_peek(const dp__mp_reader *r);
const char *dp__mp_type_name(dp__mp_type t);

/*
 * Each reader consumes one value of the named type or fails with DP_EPROTO and
 * leaves the cursor where it was. what names the value in the detail ("args",
 * "blob_id"), may be NULL.
 */
int dp__mp_read_nil(dp__mp_reader *r, const char *what, dp_detail *d);
int dp__mp_read_bool(dp__mp_reader *r, bool *v, const char *what, dp_detail *d);
int dp__mp_read_u64(dp__mp_reader *r, uint64_t *v, const char *what, dp_detail *d);
int dp__mp_read_i64(dp__mp_reader *r, int64_t *v, const char *what, dp_detail *d);
/* Accepts float32, float64 and integers. */
int dp__mp_read_double(dp__mp_reader *r, double *v, const char *what, dp_detail *d);
/* *s points into the input and is NOT NUL-terminated. */
int dp__mp_read_str(dp__mp_reader *r, const char **s, uint32_t *len, const char *what,
                    dp_detail *d);
int dp__mp_read_bin(dp__mp_reader *r, const uint8_t **p, uint32_t *len, const char *what,
                    dp_detail *d);
/* Array/map headers: n is checked against the bytes left (every element needs one). */
int dp__mp_read_array(dp__mp_reader *r, uint32_t *n, const char *what, dp_detail *d);
int dp__mp_read_map(dp__mp_reader *r, uint32_t *n, const char *what, dp_detail *d);
/* Skip one complete value of any type, nesting at most DP_MP_MAX_DEPTH deep. */
int dp__mp_skip(dp__mp_reader *r, dp_detail *d);
/* True (and consumed) if the next value is nil. */
bool dp__mp_take_nil(dp__mp_reader *r);

/* Writer: appends to a dp__buf (the buffer's oom flag is sticky). */
typedef struct dp__mp_writer {
    dp__buf *out;
} dp__mp_writer;

void dp__mp_writer_init(dp__mp_writer *w, dp__buf *out);
void dp__mp_put_nil(dp__mp_writer *w);
void dp__mp_put_bool(dp__mp_writer *w, bool v);
void dp__mp_put_u64(dp__mp_writer *w, uint64_t v);
void dp__mp_put_i64(dp__mp_writer *w, int64_t v);
void dp__mp_put_double(dp__mp_writer *w, double v);
void dp__mp_put_str(dp__mp_writer *w, const char *s); /* NUL-terminated */
void dp__mp_put_strn(dp__mp_writer *w, const char *s, size_t n);
void dp__mp_put_bin(dp__mp_writer *w, const void *p, size_t n);
void dp__mp_put_array(dp__mp_writer *w, uint32_t n);
void dp__mp_put_map(dp__mp_writer *w, uint32_t n);
/* DP_OK, or DP_ENOMEM if any write since init ran out of memory. */
int dp__mp_writer_status(const dp__mp_writer *w);

#endif
