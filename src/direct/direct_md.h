/*
 * Transport metadata of the direct transport: the bytes a publisher hands to a
 * fetcher, in another process. A msgpack array of 8 values:
 *
 *   ["DPDIRECT", 1, obj_id: str, backend: str, name: str, version: uint,
 *    endpoint_md: bin, descs: [[addr: uint, len: uint], ...]]
 *
 * version is the publisher's metadata version (bumps on every
 * deregistration); endpoint_md is its endpoint metadata (src/xfer/metadata.h)
 * whose name must equal name. The parser takes untrusted bytes: it never reads
 * outside the input, allocates at most one descriptor array bounded by the
 * input size, and rejects with a reason anything this layout does not allow.
 *
 * Threads: every function is reentrant; objects belong to their caller.
 */
#ifndef DP_DIRECT_MD_H
#define DP_DIRECT_MD_H

#include <stddef.h>
#include <stdint.h>

#include "common/common.h"
#include "dataplane/direct.h"
#include "xfer/metadata.h"

#define DP_DIRECT_MD_MAGIC "DPDIRECT"
#define DP_DIRECT_MD_VERSION 1
#define DP_DIRECT_BACKEND_MAX 15

typedef struct dp__direct_desc {
    uint64_t addr;
    uint64_t len;
} dp__direct_desc;

/*
 * Parsed metadata. Strings are copied and NUL-terminated; ep_md points into
 * the parsed input, which must outlive this object. descs is malloc'd:
 * release with dp__direct_md_fini.
 */
typedef struct dp__direct_md {
    char obj_id[DP_DIRECT_ID_MAX + 1];
    char backend[DP_DIRECT_BACKEND_MAX + 1];
    char name[DP_MD_NAME_MAX + 1];
    uint64_t version;
    uint64_t ep_gen; /* the endpoint metadata's generation */
    const uint8_t *ep_md;
    uint32_t ep_md_len;
    uint32_t n_descs;
    dp__direct_desc *descs;
    uint64_t total_bytes;
} dp__direct_md;

/* DP_EINVAL unless id is 1..DP_DIRECT_ID_MAX bytes of printable ASCII. */
int dp__direct_check_id(const char *id, size_t len, dp_detail *d);

/*
 * What dp__direct_md_encode writes: the values of the layout above, pointing
 * at the caller's memory (nothing is copied into this object).
 */
typedef struct dp_direct_md_fields {
    const char *obj_id;
    const char *backend;
    const char *name; /* the publisher's endpoint name */
    uint64_t version;
    const uint8_t *ep_md; /* the publisher's endpoint metadata */
    size_t ep_md_len;
    const dp__direct_desc *descs;
    size_t n_descs;
} dp_direct_md_fields;

/* Append the encoding of f to out. DP_EINVAL for out-of-limit fields, DP_ENOMEM. */
int dp__direct_md_encode(dp__buf *out, const dp_direct_md_fields *f, dp_detail *d);

/*
 * Parse untrusted bytes into *out (release with dp__direct_md_fini). DP_EPROTO
 * with a reason for malformed input, DP_ENOMEM. On failure *out needs no fini.
 */
int dp__direct_md_parse(const void *buf, size_t len, dp__direct_md *out, dp_detail *d);

void dp__direct_md_fini(dp__direct_md *m);

#endif
