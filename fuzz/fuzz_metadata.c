/*
 * libFuzzer target for the endpoint metadata parser (src/xfer/metadata.c):
 * metadata arrives from other processes through the control plane, so any
 * byte string must be parsed without reading out of bounds. An accepted blob
 * must point only inside the input and re-encode to the same bytes.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "xfer/metadata.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* A private copy of exactly size bytes, so ASan catches any overread. */
    uint8_t *buf = malloc(size ? size : 1);
    if (buf == NULL)
        return 0;
    memcpy(buf, data, size);
    dp__md md;
    if (dp__md_parse(buf, size, &md, NULL) == DP_OK) {
        DP_ASSERT(md.addr >= buf && md.addr + md.addr_len <= buf + size);
        for (uint32_t i = 0; i < md.n_regions; i++) {
            const dp__md_region *r = &md.regions[i];
            DP_ASSERT(r->rkey >= buf && r->rkey + r->rkey_len <= buf + size);
            DP_ASSERT(r->len > 0 && r->base + r->len > r->base);
        }
        dp__buf out;
        dp__buf_init(&out);
        dp__md_fields f = {.name = md.name,
                           .gen = md.gen,
                           .xver = md.xver,
                           .flags = md.flags,
                           .proc = (md.flags & DP_MD_F_PROC) ? &md.proc : NULL,
                           .addr = md.addr,
                           .addr_len = md.addr_len,
                           .regions = md.regions,
                           .n_regions = md.n_regions};
        int rc = dp__md_encode(&out, &f, NULL);
        DP_ASSERT(rc == DP_OK);
        DP_ASSERT(out.len == size && memcmp(out.data, buf, size) == 0);
        dp__buf_fini(&out);
        dp__md_fini(&md);
    }
    free(buf);
    return 0;
}
