/*
 * Test helpers shared by the unit, SSD tier and checkpoint tests: write a
 * blob into an allocation the way a client does, check a unit's invariants,
 * read its counters. Include after dp_test.h (CHECK).
 */
#ifndef DP_TEST_UNIT_BLOB_H
#define DP_TEST_UNIT_BLOB_H

#include <string.h>

#include "blob/blob.h"
#include "unit/unit.h"

/*
 * Copy len bytes of a blob into blob id's allocation at slab offset off and
 * name the allocation in its header (this unit's incarnation and the alloc's
 * token), so that its commit may publish it.
 */
static inline void
dp_test_write_blob(dp_unit *u, const char *id, uint64_t off, const void *p, uint64_t len)
{
    memcpy(dp__unit_slab(u) + off, p, len);
    if (len >= DP_BLOB_HEADER_LEN)
        dp__blob_header_set_alloc(dp__unit_slab(u) + off, dp__unit_incarnation(u),
                                  dp__unit_alloc_token(u, id, strlen(id)));
}

/* The unit's invariants hold (dp__unit_check); the test fails otherwise. */
static inline void
dp_test_unit_check(dp_unit *u)
{
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_OK_D(dp__unit_check(u, &d), &d);
}

/* The unit's counters now. */
static inline dp_unit_stats
dp_test_unit_stats(dp_unit *u)
{
    dp_unit_stats s;
    dp__unit_get_stats(u, &s);
    return s;
}

#endif
