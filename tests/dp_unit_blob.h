/*
 * Test helpers shared by the unit, SSD tier and checkpoint tests: write a
 * blob into an allocation the way a client does, check a unit's invariants,
 * read its counters. Include after dp_test.h (CHECK).
 */
#ifndef DP_TEST_UNIT_BLOB_H
#define DP_TEST_UNIT_BLOB_H

#include <stdbool.h>
#include <string.h>

#include "blob/blob.h"
#include "unit/unit.h"
#include "wire/wire.h"

/*
 * An alloc as a client asks it (dp__unit_alloc_req), the arguments spelled
 * out: blob id[0..id_len), nbytes, n_entries (0: unchecked), spill; *off gets
 * the region's offset. Codes and *reason as dp__unit_alloc_req's.
 */
static inline int
dp_test_unit_alloc(dp__unit *u, const char *id, size_t id_len, uint64_t nbytes,
                   uint64_t n_entries, bool spill, uint64_t *off, const char **reason,
                   dp_detail *d)
{
    dp__wire_alloc_args a = {.blob_id = {id, (uint32_t)id_len},
                             .nbytes = nbytes,
                             .n_entries = n_entries,
                             .spill = spill};
    dp__wire_alloc_res r;
    int rc = dp__unit_alloc_req(u, &a, &r, reason, d);
    if (rc == 0)
        *off = r.off;
    return rc;
}

/*
 * A load_shard as a client asks it (dp__unit_load_shard): the shard at path
 * (a C string), blobs[0, n), spill.
 */
static inline int
dp_test_load_shard(dp__unit *u, const char *path, const dp__wire_shard_blob *blobs,
                   uint32_t n, bool spill, dp__unit_load_res *res, dp_detail *d)
{
    dp__wire_load_shard_args a = {.path = {path, (uint32_t)strlen(path)},
                                  .blobs = {(dp__wire_shard_blob *)blobs, n},
                                  .spill = spill};
    return dp__unit_load_shard(u, &a, res, d);
}

/*
 * Copy len bytes of a blob into blob id's allocation at slab offset off and
 * name the allocation in its header (this unit's incarnation and the alloc's
 * token), so that its commit may publish it.
 */
static inline void
dp_test_write_blob(dp__unit *u, const char *id, uint64_t off, const void *p, uint64_t len)
{
    memcpy(dp__unit_slab(u) + off, p, len);
    if (len >= DP_BLOB_HEADER_LEN)
        dp__blob_header_set_alloc(dp__unit_slab(u) + off, dp__unit_incarnation(u),
                                  dp__unit_alloc_token(u, id, strlen(id)));
}

/* The unit's invariants hold (dp__unit_check); the test fails otherwise. */
static inline void
dp_test_unit_check(dp__unit *u)
{
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_OK_D(dp__unit_check(u, &d), &d);
}

/* The unit's counters now. */
static inline dp__unit_stats
dp_test_unit_stats(dp__unit *u)
{
    dp__unit_stats s;
    dp__unit_get_stats(u, &s);
    return s;
}

#endif
