/*
 * libFuzzer target for src/blob/blob: dp__blob_parse on arbitrary bytes.
 *
 * Each input is parsed twice: as it is, and with the header's index CRC
 * recomputed over the bytes it names (when they lie inside the input), so
 * the fuzzer gets past the CRC and into the index parser. A blob that parses
 * must hold only entries inside its bounds, survive the payload check, and
 * round-trip through the builder: building a blob from the parsed entries
 * and parsing that gives the same entries back.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "blob/blob.h"
#include "blob/crc32c.h"
#include "blob/keys.h"
#include "common/le.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void
check_entries(const dp__blob *b, size_t size)
{
    const dp__blob_header *h = dp__blob_get_header(b);
    if (h->total_len != size || h->n_entries == 0 || dp__blob_count(b) != h->n_entries)
        abort();
    for (uint32_t i = 0; i < dp__blob_count(b); i++) {
        const dp__blob_entry *e = dp__blob_entry_at(b, i);
        if (e->off < h->payload_off || e->off % 64 != 0 || e->off > size ||
            e->len > size - e->off)
            abort();
        if (strlen(e->field) != e->field_len || strlen(e->dtype) != e->dtype_len ||
            e->ndim > DP_BLOB_MAX_DIMS)
            abort();
        char key[DP_KEY_MAX + 1];
        size_t kl = dp__blob_entry_key(e, key);
        dp__key_parts kp;
        if (dp__key_split(key, kl, &kp, NULL) != DP_OK || kp.gidx != e->gidx ||
            kp.field_len != e->field_len || memcmp(kp.field, e->field, kp.field_len) != 0)
            abort();
        if (dp__blob_find(b, key, kl) != e)
            abort();
    }
}

/* Build a blob from b's entries, parse it, compare. */
static void
round_trip(const dp__blob *b)
{
    const dp__blob_header *h = dp__blob_get_header(b);
    dp__blob_builder *bb = NULL;
    if (dp__blob_builder_create(h->flags, &bb, NULL) != DP_OK)
        abort();
    for (uint32_t i = 0; i < dp__blob_count(b); i++) {
        const dp__blob_entry *e = dp__blob_entry_at(b, i);
        /* keep the rebuilt blob small: lengths are capped, the check below
         * knows it */
        char key[DP_KEY_MAX + 1];
        size_t kl = dp__blob_entry_key(e, key);
        dp__blob_entry_spec s = {.key = key,
                                 .key_len = kl,
                                 .kind = e->kind,
                                 .dtype = e->dtype,
                                 .shape = e->shape,
                                 .ndim = e->ndim,
                                 .len = e->len % 4096,
                                 .has_crc = e->has_crc,
                                 .crc = e->crc};
        if (dp__blob_builder_add(bb, &s, NULL, NULL) != DP_OK)
            abort();
    }
    dp__blob_layout l;
    if (dp__blob_builder_layout(bb, &l, NULL) != DP_OK)
        abort();
    uint8_t *p = calloc(1, (size_t)l.total_len);
    if (p == NULL)
        abort();
    if (dp__blob_builder_write(bb, p, (size_t)l.total_len, NULL) != DP_OK)
        abort();
    dp__blob *c = NULL;
    if (dp__blob_parse(p, (size_t)l.total_len, NULL, &c, NULL) != DP_OK)
        abort();
    for (uint32_t i = 0; i < dp__blob_count(b); i++) {
        const dp__blob_entry *x = dp__blob_entry_at(b, i), *y = dp__blob_entry_at(c, i);
        if (x->gidx != y->gidx || strcmp(x->field, y->field) != 0 ||
            strcmp(x->dtype, y->dtype) != 0 || x->kind != y->kind || x->ndim != y->ndim ||
            y->len != x->len % 4096 || x->has_crc != y->has_crc || x->crc != y->crc ||
            memcmp(x->shape, y->shape, x->ndim * sizeof(uint64_t)) != 0)
            abort();
    }
    dp__blob_destroy(c);
    free(p);
    dp__blob_builder_destroy(bb);
}

static void
one(const uint8_t *p, size_t size, const dp__blob_parse_opts *o)
{
    dp__blob *b = NULL;
    dp_detail d;
    int rc = dp__blob_parse(p, size, o, &b, &d);
    if (rc != DP_OK) {
        if ((rc != DP_EPROTO && rc != DP_ENOMEM) || b != NULL || d.msg[0] == '\0')
            abort();
        return;
    }
    check_entries(b, size);
    if (dp__blob_get_header(b)->flags & DP_BLOB_FLAG_CRC) {
        rc = dp__blob_check_payload(b, p, size, NULL);
        if (rc != DP_OK && rc != DP_ECORRUPT)
            abort();
    }
    if (o == NULL)
        round_trip(b);
    dp__blob_destroy(b);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    one(data, size, NULL);
    if (size < 64)
        return 0;
    uint64_t index_len = dp__le64_load(data + 16);
    if (index_len > size - 64)
        return 0;
    uint8_t *q = malloc(size);
    if (q == NULL)
        return 0;
    memcpy(q, data, size);
    uint32_t crc = dp__crc32c(q + 64, (size_t)index_len);
    dp__le32_store(q + 40, crc);
    one(q, size, NULL);
    dp__blob_parse_opts o = {.allow_overlap = true,
                             .n_units = 1 + data[size - 1] % 4,
                             .unit_index = data[size - 1] % 2};
    one(q, size, &o);
    free(q);
    return 0;
}
