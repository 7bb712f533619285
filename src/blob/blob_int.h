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

/* An index entry is a msgpack array of this many fields (blob.h). */
#define ENTRY_FIELDS 7

/* The kinds' names, by dp__blob_kind (blob_parse.c). */
extern const char *const dp__blob_kind_names[DP_BLOB_OBJECT + 1];

/*
 * Keys are checked for duplicates, and found, through an open-addressing
 * table of entry numbers: one pass, no sort (sorting 2048 keys cost a seventh
 * of a commit of small entries). The parser indexes a blob's keys in one;
 * the builder checks its keys for duplicates with another (blob_parse.c).
 */
uint64_t dp__blob_key_hash(const char *k, size_t n);

/* Slots for n keys: a power of two at least 2n (n <= DP_BLOB_MAX_ENTRIES). */
uint32_t dp__blob_key_slots_for(uint32_t n);

/* A table of entry numbers being filled, and how to read the entries' keys. */
typedef struct dp__blob_key_table {
    uint32_t *slots; /* mask + 1 of them: entry number + 1, 0 = empty */
    uint32_t mask;
    /* key_of(ctx, j) gives entry j's key. */
    const char *(*key_of)(const void *ctx, uint32_t j, uint32_t *len);
    const void *ctx;
} dp__blob_key_table;

/*
 * Insert entry idx (key k, n bytes) into t. Returns the entry number already
 * holding that key, or UINT32_MAX after inserting.
 */
uint32_t dp__blob_key_slots_insert(const dp__blob_key_table *t, const char *k, uint32_t n,
                                   uint32_t idx);

#endif
