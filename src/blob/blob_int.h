/*
 * Shared by the blob layout's two files only: blob_parse.c (the unit-side
 * parser/validator, the kinds, the index lookup) and blob_build.c (the
 * client-side sizer and builder). The API is blob.h; nothing outside
 * src/blob includes this header.
 */
#ifndef DP_BLOB_BLOB_INT_H
#define DP_BLOB_BLOB_INT_H

#include <stdint.h>

#include "blob/blob.h"

/* A version 2 index entry is a msgpack array of this many fields (blob.h). */
#define ENTRY_FIELDS 7

/* The kinds' names, by dp__blob_kind (blob_parse.c). */

/*
 * Keys are checked for duplicates, and found, through an open-addressing
 * table of entry numbers: one pass, no sort (sorting 2048 keys cost a seventh
 * of a commit of small entries). A key is its row and field: the hash mixes
 * the gidx with the field's bytes, 8 at a time. The parser indexes a blob's
 * keys in one; the builder checks its keys for duplicates with another.
 */
uint64_t dp__blob_key_hash(uint64_t gidx, const char *field, size_t n);

/* Slots for n keys: a power of two at least 2n (n <= DP_BLOB_MAX_ENTRIES). */
uint32_t dp__blob_key_slots_for(uint32_t n);

/* A table of entry numbers being filled, and how to read the entries' keys. */
typedef struct dp__blob_key_table {
    uint32_t *slots; /* mask + 1 of them: entry number + 1, 0 = empty */
    uint32_t mask;
    /* key_of(ctx, j) gives entry j's row and field. */
    const char *(*key_of)(const void *ctx, uint32_t j, uint64_t *gidx, uint32_t *len);
    const void *ctx;
} dp__blob_key_table;

/*
 * Insert entry idx (row gidx, field f of n bytes) into t. Returns the entry
 * number already holding that key, or UINT32_MAX after inserting.
 */
uint32_t dp__blob_key_slots_insert(const dp__blob_key_table *t, uint64_t gidx,
                                   const char *f, uint32_t n, uint32_t idx);

/* Version 3 entry bytes: the fixed part, then dtype and dims. */
static inline uint64_t
dp__blob_v3_entry_len(uint32_t dtype_len, uint32_t ndim)
{
    return DP_BLOB_ENTRY_FIXED + dtype_len + 8ull * ndim;
}

#endif
