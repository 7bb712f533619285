/*
 * libFuzzer target for src/blob/shard: dp__shard_rows_parse on arbitrary
 * bytes (a checkpoint's rows file comes from disk). A file that parses must
 * have every record, id and live list inside the bytes, ids of the allowed
 * characters, parse to the same records again, and encode back to the same
 * bytes with the rows-file encoders a save writes it with.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "blob/crc32c.h"
#include "blob/shard.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
static int one(const uint8_t *data, size_t size, bool fix_crc);
static void reencode(const uint8_t *p, size_t size, const dp__shard_rows *r);

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    one(data, size, false);
    /* Again with the trailer CRC made right, so the structure behind it is
     * fuzzed too (a mutation almost never keeps a CRC valid). */
    one(data, size, true);
    return 0;
}

static int
one(const uint8_t *data, size_t size, bool fix_crc)
{
    /* A copy of exactly size bytes: reads past it are caught by ASan. */
    uint8_t *p = malloc(size ? size : 1);
    if (p == NULL)
        return 0;
    memcpy(p, data, size);
    if (fix_crc && size >= 12) {
        uint32_t c = dp__crc32c(p, size - 12);
        for (int k = 0; k < 4; k++)
            p[size - 12 + k] = (uint8_t)(c >> (8 * k));
    }
    dp__shard_rows r;
    dp_detail d;
    int rc = dp__shard_rows_parse(p, size, "fuzz.rows", &r, &d);
    if (rc != DP_OK) {
        if ((rc != DP_ECORRUPT && rc != DP_ENOMEM) || d.msg[0] == '\0')
            abort();
        free(p);
        return 0;
    }
    uint64_t live_total = 0;
    for (uint32_t i = 0; i < r.n; i++) {
        const dp__shard_row *x = &r.v[i];
        const uint8_t *id = (const uint8_t *)x->id;
        if (id < p || id + x->id_len > p + size || x->id_len == 0 ||
            x->id_len > DP_SHARD_ID_MAX)
            abort();
        if (x->live < p || x->live + 4 * (size_t)x->n_live > p + size)
            abort();
        for (uint32_t k = 0; k < x->n_live; k++)
            live_total += dp__shard_row_live(x, k) & 1;
    }
    dp__shard_rows again;
    if (dp__shard_rows_parse(p, size, "fuzz.rows", &again, &d) != DP_OK || again.n != r.n)
        abort();
    for (uint32_t i = 0; i < r.n; i++)
        if (again.v[i].off != r.v[i].off || again.v[i].nbytes != r.v[i].nbytes ||
            again.v[i].n_live != r.v[i].n_live)
            abort();
    dp__shard_rows_fini(&again);
    reencode(p, size, &r);
    dp__shard_rows_fini(&r);
    free(p);
    return (int)(live_total & 0); /* keep the loop */
}

/* The encoders give back exactly the bytes that parsed to r. */
static void
reencode(const uint8_t *p, size_t size, const dp__shard_rows *r)
{
    uint8_t *q = malloc(size);
    if (q == NULL)
        return;
    size_t n = 0;
    dp__shard_rows_header_encode(r->unit_id, r->n_units, r->n, q);
    n += DP_SHARD_ROWS_HEADER_LEN;
    for (uint32_t i = 0; i < r->n; i++) {
        uint8_t rec[DP_SHARD_ROW_HEAD_MAX];
        size_t m = dp__shard_row_encode(&r->v[i], rec);
        if (n + m > size)
            abort();
        memcpy(q + n, rec, m);
        n += m;
        for (uint32_t k = 0; k < r->v[i].n_live; k++) {
            if (n + 4 > size)
                abort();
            dp__shard_live_encode(dp__shard_row_live(&r->v[i], k), q + n);
            n += 4;
        }
    }
    if (n + DP_SHARD_ROWS_TRAILER_LEN != size)
        abort();
    dp__shard_rows_trailer_encode(dp__crc32c(q, n), q + n);
    if (memcmp(p, q, size) != 0)
        abort();
    free(q);
}
