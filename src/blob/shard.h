/*
 * The files of a checkpoint shard (DESIGN section 9), shared by the unit that
 * writes and loads them and by a client that re-homes a checkpoint into a
 * cluster of another size. Little-endian throughout.
 *
 * Shard file:
 *   header  32: "DPSHARD1", u32 version, u32 unit_id, u32 n_units,
 *               u32 n_blobs, u64 data_bytes
 *   data       the blobs back to back, each a DPBLOB01 blob as committed
 *   trailer 24: "DPSHEND1", u64 data_bytes, u32 CRC32C(data),
 *               u32 CRC32C(header)
 * Rows file (the shard's name + ".rows"):
 *   header  24: "DPROWS01", u32 version, u32 unit_id, u32 n_units, u32 n_blobs
 *   per blob:   u8 id_len, id, u64 offset in the shard file, u64 nbytes,
 *               u32 CRC32C(blob), u32 n_live, n_live x u32 entry index
 *   trailer 12: u32 CRC32C(everything before), "DPROWEND"
 * A blob's own index may list keys that were overwritten or cleared before
 * the save; the rows file names the entries that were live: only those load.
 */
#ifndef DP_BLOB_SHARD_H
#define DP_BLOB_SHARD_H

#include <stdint.h>

#include "common/common.h"

#define DP_SHARD_MAGIC "DPSHARD1"
#define DP_SHARD_END_MAGIC "DPSHEND1"
#define DP_ROWS_MAGIC "DPROWS01"
#define DP_ROWS_END_MAGIC "DPROWEND"
#define DP_SHARD_VERSION 1u
#define DP_SHARD_HEADER_LEN 32u
#define DP_SHARD_TRAILER_LEN 24u
#define DP_SHARD_ID_MAX 64 /* a blob id: 1..64 bytes of [A-Za-z0-9_.:-] */

/* One blob of a rows file (views into the parsed bytes). */
typedef struct dp_shard_row {
    const char *id; /* not NUL-terminated */
    uint32_t id_len;
    uint64_t off, nbytes; /* its place in the shard file */
    uint32_t crc, n_live;
    const uint8_t *live; /* n_live little-endian u32 entry indexes */
} dp_shard_row;

typedef struct dp_shard_rows {
    uint32_t unit_id, n_units, n;
    dp_shard_row *v; /* n entries, malloc'd */
} dp_shard_rows;

/*
 * Parse and check a whole rows file p[0..len) (name is for messages): magic,
 * trailer CRC, version, every record within bounds with a valid id, no stray
 * bytes. DP_ECORRUPT naming the file and offset, DP_ENOMEM. The records point
 * into p, which must outlive out. dp_shard_rows_fini frees out->v.
 */
int dp_shard_rows_parse(const uint8_t *p, uint64_t len, const char *name,
                        dp_shard_rows *out, dp_detail *d);
void dp_shard_rows_fini(dp_shard_rows *r);

/* Entry index k (< n_live) of r. */
uint32_t dp_shard_row_live(const dp_shard_row *r, uint32_t k);

#endif
