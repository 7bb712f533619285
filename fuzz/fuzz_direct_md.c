/*
 * libFuzzer target for the direct transport's metadata parser
 * (src/direct/direct_md.c): transport metadata crosses processes, so any byte
 * string must be parsed without reading out of bounds or allocating more than
 * the input can describe. Accepted metadata must hold the parser's promises
 * (printable id, known backend, endpoint metadata inside the input, non-empty
 * descriptors that do not wrap) and survive an encode/parse round trip with the
 * same values.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "direct/direct_md.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void
check_same(const dp__direct_md *a, const dp__direct_md *b)
{
    DP_ASSERT(strcmp(a->obj_id, b->obj_id) == 0);
    DP_ASSERT(strcmp(a->backend, b->backend) == 0);
    DP_ASSERT(strcmp(a->name, b->name) == 0);
    DP_ASSERT(a->version == b->version && a->ep_gen == b->ep_gen);
    DP_ASSERT(a->ep_md_len == b->ep_md_len &&
              memcmp(a->ep_md, b->ep_md, a->ep_md_len) == 0);
    DP_ASSERT(a->n_descs == b->n_descs && a->total_bytes == b->total_bytes);
    for (uint32_t i = 0; i < a->n_descs; i++)
        DP_ASSERT(a->descs[i].addr == b->descs[i].addr &&
                  a->descs[i].len == b->descs[i].len);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* A private copy of exactly size bytes, so ASan catches any overread. */
    uint8_t *buf = malloc(size ? size : 1);
    if (buf == NULL)
        return 0;
    memcpy(buf, data, size);
    dp__direct_md m;
    if (dp__direct_md_parse(buf, size, &m, NULL) == DP_OK) {
        DP_ASSERT(m.ep_md >= buf && m.ep_md + m.ep_md_len <= buf + size);
        DP_ASSERT(dp__direct_check_id(m.obj_id, strlen(m.obj_id), NULL) == DP_OK);
        DP_ASSERT(strcmp(m.backend, "UCX") == 0);
        uint64_t total = 0;
        for (uint32_t i = 0; i < m.n_descs; i++) {
            DP_ASSERT(m.descs[i].len > 0 && m.descs[i].addr != 0);
            DP_ASSERT(m.descs[i].addr + m.descs[i].len > m.descs[i].addr);
            total += m.descs[i].len;
        }
        DP_ASSERT(total == m.total_bytes);
        dp__buf out;
        dp__buf_init(&out);
        dp_direct_md_fields f = {.obj_id = m.obj_id,
                                 .backend = m.backend,
                                 .name = m.name,
                                 .version = m.version,
                                 .ep_md = m.ep_md,
                                 .ep_md_len = m.ep_md_len,
                                 .descs = m.descs,
                                 .n_descs = m.n_descs};
        int rc = dp__direct_md_encode(&out, &f, NULL);
        DP_ASSERT(rc == DP_OK);
        dp__direct_md m2;
        DP_ASSERT(dp__direct_md_parse(out.data, out.len, &m2, NULL) == DP_OK);
        check_same(&m, &m2);
        size_t n = 0;
        uint64_t sizes[4];
        DP_ASSERT(dp_direct_md_describe(out.data, out.len, &n, sizes, 4, NULL) == DP_OK);
        DP_ASSERT(n == m.n_descs);
        dp__direct_md_fini(&m2);
        dp__buf_fini(&out);
        dp__direct_md_fini(&m);
    }
    free(buf);
    return 0;
}
