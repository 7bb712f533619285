/*
 * The files of a checkpoint shard (docs/design.md, "Checkpoints"): this
 * module owns their format, for the unit that writes and loads them and for
 * a client that re-homes a checkpoint into a cluster of another size.
 * Little-endian throughout.
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
 *
 * What a reader checks, and where: the frame of the shard file (header,
 * length, trailer: dp__shard_header_decode, dp__shard_check_len,
 * dp__shard_trailer_decode), the rows file (dp__shard_rows_load) and its
 * agreement with the shard (dp__shard_rows_check), each blob's bytes against
 * the CRC32C the rows file gives (dp__shard_reader_blob in one sequential pass
 * that also checks the whole data's CRC, or dp__shard_blob_read for one
 * blob), and each blob's index and live list (dp__shard_blob_check). Which
 * unit and cluster size a shard may be loaded into is the caller's to check
 * (the headers carry them).
 *
 * Threads: no shared state; every function may be called from any thread.
 * Errors name the file and the offset.
 */
#ifndef DP_BLOB_SHARD_H
#define DP_BLOB_SHARD_H

#include <stddef.h>
#include <stdint.h>

#include "blob/blob.h"
#include "common/common.h"

#define DP_SHARD_MAGIC "DPSHARD1"
#define DP_SHARD_END_MAGIC "DPSHEND1"
#define DP_ROWS_MAGIC "DPROWS01"
#define DP_ROWS_END_MAGIC "DPROWEND"
#define DP_SHARD_VERSION 1u
#define DP_SHARD_HEADER_LEN 32u
#define DP_SHARD_TRAILER_LEN 24u
#define DP_SHARD_ROWS_HEADER_LEN 24u
#define DP_SHARD_ROWS_TRAILER_LEN 12u
#define DP_SHARD_ID_MAX DP_ID_MAX /* a blob id (dp__id_valid) */
/* A rows-file record before its live list: u8 id_len, id, 2 x u64, 2 x u32. */
#define DP_SHARD_ROW_HEAD_MAX (1 + DP_SHARD_ID_MAX + 24)
/* The largest rows file dp__shard_rows_load reads. */
#define DP_SHARD_ROWS_MAX ((uint64_t)1 << 32)

/* ---- shard file: header and trailer ---- */

typedef struct dp__shard_header {
    uint32_t unit_id, n_units; /* the unit that wrote it, of how many */
    uint32_t n_blobs;
    uint64_t data_bytes; /* the data section: the blobs back to back */
    uint32_t crc;        /* CRC32C of the encoded header (set by decode) */
} dp__shard_header;

/* The 32 header bytes of h (version DP_SHARD_VERSION; h->crc is ignored). */
void dp__shard_header_encode(const dp__shard_header *h, uint8_t out[DP_SHARD_HEADER_LEN]);

/*
 * Decode a shard header (name is for messages): magic and version are
 * checked, the rest is the caller's (unit and cluster size, then
 * dp__shard_check_len). DP_ECORRUPT.
 */
int dp__shard_header_decode(const uint8_t p[DP_SHARD_HEADER_LEN], const char *name,
                            dp__shard_header *h, dp_detail *d);

/* Where the data section ends and the trailer starts. */
uint64_t dp__shard_data_end(const dp__shard_header *h);

/*
 * A shard file of file_len bytes holds exactly h's header, data and trailer.
 * DP_ECORRUPT (truncated or corrupted).
 */
int dp__shard_check_len(const dp__shard_header *h, uint64_t file_len, const char *name,
                        dp_detail *d);

/* The 24 trailer bytes after h's data, whose CRC32C is data_crc. */
void dp__shard_trailer_encode(const dp__shard_header *h, uint32_t data_crc,
                              uint8_t out[DP_SHARD_TRAILER_LEN]);

/*
 * Decode the trailer of a shard whose header decoded to h: magic, data_bytes
 * and the header's CRC32C must match; *data_crc gets the data's CRC32C (for
 * dp__shard_reader_end). DP_ECORRUPT naming the trailer's offset.
 */
int dp__shard_trailer_decode(const uint8_t p[DP_SHARD_TRAILER_LEN],
                             const dp__shard_header *h, const char *name,
                             uint32_t *data_crc, dp_detail *d);

/* ---- rows file ---- */

/* One blob of a rows file (views into the parsed bytes). */
typedef struct dp__shard_row {
    const char *id; /* not NUL-terminated */
    uint32_t id_len;
    uint64_t off, nbytes; /* its place in the shard file */
    uint32_t crc, n_live;
    const uint8_t *live; /* n_live little-endian u32 entry indexes */
} dp__shard_row;

typedef struct dp__shard_rows {
    uint32_t unit_id, n_units, n;
    dp__shard_row *v; /* n entries, malloc'd */
} dp__shard_rows;

/*
 * Parse and check a whole rows file p[0..len) (name is for messages): magic,
 * trailer CRC, version, every record within bounds with a valid id, no stray
 * bytes. DP_ECORRUPT naming the file and offset, DP_ENOMEM. The records point
 * into p, which must outlive out. dp__shard_rows_fini frees out->v.
 */
int dp__shard_rows_parse(const uint8_t *p, uint64_t len, const char *name,
                         dp__shard_rows *out, dp_detail *d);
void dp__shard_rows_fini(dp__shard_rows *r);

/* Entry index k (< n_live) of r. */
uint32_t dp__shard_row_live(const dp__shard_row *r, uint32_t k);

/*
 * Read the rows file name (a regular file of at most DP_SHARD_ROWS_MAX
 * bytes) and parse it. *buf (malloc'd, the caller frees it, also on error:
 * NULL then) holds the bytes out's records point into. Errors: DP_ESYS (open,
 * read), DP_EINVAL (not a regular file), DP_ECORRUPT, DP_ENOMEM.
 */
int dp__shard_rows_load(const char *name, uint8_t **buf, dp__shard_rows *out,
                        dp_detail *d);

/*
 * The rows file rows_name agrees with the shard shard_name whose header is h:
 * as many blobs, each inside the data section and not empty. DP_ECORRUPT.
 */
int dp__shard_rows_check(const dp__shard_rows *rows, const dp__shard_header *h,
                         const char *rows_name, const char *shard_name, dp_detail *d);

/* The 24 header bytes of a rows file. */
void dp__shard_rows_header_encode(uint32_t unit_id, uint32_t n_units, uint32_t n_blobs,
                                  uint8_t out[DP_SHARD_ROWS_HEADER_LEN]);
/*
 * The record of r up to its live list (r->live is not read: r->n_live entry
 * indexes follow, each dp__shard_live_encode'd). Returns its length.
 */
size_t dp__shard_row_encode(const dp__shard_row *r, uint8_t out[DP_SHARD_ROW_HEAD_MAX]);
void dp__shard_live_encode(uint32_t entry, uint8_t out[4]);
/* The 12 trailer bytes; crc is the CRC32C of every byte before them. */
void dp__shard_rows_trailer_encode(uint32_t crc, uint8_t out[DP_SHARD_ROWS_TRAILER_LEN]);

/* ---- reading ---- */

/*
 * Open a shard or rows file for reading: a regular file only (a FIFO or a
 * device must not block or feed the reader forever). *len gets its size.
 * DP_ESYS, DP_EINVAL (not a regular file).
 */
int dp__shard_file_open(const char *name, int *fd, uint64_t *len, dp_detail *d);

/*
 * One sequential pass over a shard's data section: blobs in offset order
 * (dp__shard_reader_blob), the bytes between them passed over, and the CRC32C
 * of the whole data checked at the end against the trailer's
 * (dp__shard_reader_end). Caller-owned storage; fd is borrowed.
 */
typedef struct dp__shard_reader {
    int fd;
    const char *name; /* the shard file, for messages (borrowed) */
    uint64_t pos;     /* next file offset */
    uint64_t end;     /* end of the data section */
    uint32_t crc;     /* CRC32C of the data section up to pos */
    uint8_t *buf;     /* scratch for bytes read only for their CRC */
} dp__shard_reader;

/* DP_ENOMEM. */
int dp__shard_reader_init(dp__shard_reader *rd, int fd, const char *name,
                          const dp__shard_header *h, dp_detail *d);
void dp__shard_reader_fini(dp__shard_reader *rd);

/*
 * Read blob r (at or after the reader's position, inside the data section)
 * into dst (r->nbytes bytes; NULL: read only to check it) and check its
 * CRC32C against r->crc. DP_ECORRUPT (CRC mismatch, truncated), DP_ESYS,
 * DP_EINVAL (r is behind the reader or outside the data).
 */
int dp__shard_reader_blob(dp__shard_reader *rd, const dp__shard_row *r, uint8_t *dst,
                          dp_detail *d);

/* Pass over the rest of the data; its CRC32C must be data_crc. DP_ECORRUPT. */
int dp__shard_reader_end(dp__shard_reader *rd, uint32_t data_crc, dp_detail *d);

/*
 * Read one blob r of the shard fd (name) into dst (r->nbytes bytes) and
 * check its CRC32C against r->crc, without a sequential pass. Errors as
 * dp__shard_reader_blob.
 */
int dp__shard_blob_read(int fd, const char *name, const dp__shard_row *r, uint8_t *dst,
                        dp_detail *d);

/* A blob read from a shard, checked by dp__shard_blob_check. */
typedef struct dp__shard_blob {
    dp__blob *parsed; /* its index, parsed as a commit does (owned) */
    uint8_t *keep;    /* one byte per entry of parsed: 1 for a live one (owned) */
    uint32_t *live;   /* the live entry indexes, in the rows file's order (owned) */
    uint32_t n_live;
} dp__shard_blob;

/*
 * Check blob r whose bytes (r->nbytes, CRC already checked) are p: parse its
 * index as a commit does (po: a unit's n_units and unit_index, or NULL for
 * no ownership check) and its live list against that index (every entry in
 * range, none twice, at least one). Errors: those of dp__blob_parse (a bad
 * index: DP_EPROTO), DP_ECORRUPT (the live list), DP_ENOMEM; out is then
 * empty. dp__shard_blob_fini frees out.
 */
int dp__shard_blob_check(const dp__shard_row *r, const uint8_t *p,
                         const dp__blob_parse_opts *po, const char *shard_name,
                         const char *rows_name, dp__shard_blob *out, dp_detail *d);
void dp__shard_blob_fini(dp__shard_blob *b);

#endif
