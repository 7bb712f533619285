/*
 * Test helper shared by the unit, SSD tier and checkpoint tests: write a blob
 * into an allocation the way a client does.
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
    memcpy(dp_unit_slab(u) + off, p, len);
    if (len >= DP_BLOB_HEADER_LEN)
        dp_blob_header_set_alloc(dp_unit_slab(u) + off, dp_unit_incarnation(u),
                                 dp_unit_alloc_token(u, id, strlen(id)));
}

#endif
