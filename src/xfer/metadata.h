/*
 * Endpoint metadata: the versioned byte string one endpoint hands to another
 * (through the control plane) so the other can reach it: the endpoint's name, a
 * generation counter, its UCX worker address and, per registered region, the
 * base address, the length and the packed remote key.
 *
 * Layout (version 3, all integers little-endian):
 *
 *   0   4  magic "DPMD"
 *   4   2  version (2)
 *   6   2  name_len            1..DP_MD_NAME_MAX
 *   8   4  addr_len            1..DP_MD_ADDR_MAX
 *   12  4  n_regions           0..DP_MD_REGIONS_MAX
 *   16  8  gen                 bumps on every register/deregister
 *   24  4  xver                the transport library's version that packed the
 *                              address and keys (UCX: major << 24 | minor << 16 |
 *                              release); a peer of another major.minor cannot
 *                              read them, so add_remote refuses it (never hands
 *                              UCX bytes of a format it does not know)
 *   28  4  flags               DP_MD_F_SERVES: the endpoint serves two-sided
 *                              transfers; DP_MD_F_PROC: the process block
 *                              follows the regions; other bits must be 0
 *   32  .. name bytes, then worker address bytes
 *   ..  per region: base u64, len u64, rkey_len u32, rkey bytes
 *   ..  with DP_MD_F_PROC, the process (peerproc.h), 40 bytes: boot id (16),
 *       PID namespace u64, start time u64, pid u32, 4 zero bytes
 *
 * The blob ends exactly after the last region (or the process block). The parser takes
 * untrusted bytes: it never reads outside [buf, buf+len) and rejects, with a reason,
 * anything the layout does not allow. No UCX type appears here.
 *
 * Threads: every function is reentrant; objects belong to their caller.
 */
#ifndef DP_XFER_METADATA_H
#define DP_XFER_METADATA_H

#include <stddef.h>
#include <stdint.h>

#include "common/common.h"
#include "xfer/peerproc.h"

#define DP_MD_MAGIC "DPMD"
#define DP_MD_VERSION 3
#define DP_MD_HEADER_LEN 32
#define DP_MD_F_SERVES 1u
#define DP_MD_F_PROC 2u
#define DP_MD_F_KNOWN (DP_MD_F_SERVES | DP_MD_F_PROC)
#define DP_MD_PROC_LEN 40
#define DP_MD_NAME_MAX 255
#define DP_MD_ADDR_MAX (64u * 1024)
#define DP_MD_REGIONS_MAX 65536u
#define DP_MD_RKEY_MAX 4096u
#define DP_MD_TOTAL_MAX (64u * 1024 * 1024)

/* One registered region as described by metadata. rkey points into the parsed blob. */
typedef struct dp__md_region {
    uint64_t base;
    uint64_t len;
    const uint8_t *rkey;
    uint32_t rkey_len;
} dp__md_region;

/*
 * Parsed metadata. name is NUL-terminated (copied); addr and each region's rkey
 * point into the buffer given to dp__md_parse, which must outlive this object.
 * regions is heap-allocated: release with dp__md_fini.
 */
typedef struct dp__md {
    char name[DP_MD_NAME_MAX + 1];
    uint64_t gen;
    uint32_t xver;
    uint32_t flags;   /* DP_MD_F_* */
    dp__md_proc proc; /* the process, when flags has DP_MD_F_PROC (else zero) */
    const uint8_t *addr;
    uint32_t addr_len;
    uint32_t n_regions;
    dp__md_region *regions;
} dp__md;

/*
 * Check that name is a valid endpoint name: 1..DP_MD_NAME_MAX bytes, printable
 * ASCII (0x21..0x7e). DP_EINVAL with a reason otherwise.
 */
int dp__md_check_name(const char *name, size_t len, dp_detail *d);

/*
 * What dp__md_encode writes: the fields of the layout above, pointing at the
 * caller's memory (nothing is copied into this object).
 */
typedef struct dp__md_fields {
    const char *name; /* NUL-terminated */
    uint64_t gen;
    uint32_t xver;
    uint32_t flags;          /* DP_MD_F_*; DP_MD_F_PROC follows proc */
    const dp__md_proc *proc; /* the process block, or NULL for none */
    const void *addr;        /* the worker address */
    size_t addr_len;
    const dp__md_region *regions;
    size_t n_regions;
} dp__md_fields;

/*
 * Encode f into out (appended). f->proc (may be NULL) adds the process block
 * and DP_MD_F_PROC (a DP_MD_F_PROC in f->flags without f->proc is dropped).
 * Fails with DP_EINVAL when a field is out of the limits above, DP_ENOMEM when
 * out cannot grow.
 */
int dp__md_encode(dp__buf *out, const dp__md_fields *f, dp_detail *d);

/*
 * Parse untrusted bytes. On success *out is filled (release with dp__md_fini).
 * Fails with DP_EPROTO and a reason for malformed input (bad magic, unknown
 * version, a length past the end or the limits, trailing bytes, a region whose
 * base+len overflows, regions that overlap), DP_ENOMEM on allocation failure.
 * On failure *out needs no fini.
 */
int dp__md_parse(const void *buf, size_t len, dp__md *out, dp_detail *d);

/*
 * A 64-bit hash of the worker address in metadata buf (0 if the header does
 * not hold one): the address names one UCX worker of one process, so two
 * metadata with the same endpoint name but different ids come from different
 * processes (a restarted publisher). Reads only the header; no allocation.
 */
uint64_t dp__md_peer_id(const void *buf, size_t len);

/* Release what dp__md_parse allocated (NULL and zeroed objects allowed). */
void dp__md_fini(dp__md *md);

#endif
