/*
 * The checkpoint shard format (see shard.h): the shard file's header and
 * trailer, the rows file, and reading a shard's blobs back with every check
 * a load makes. The unit writes shards with the encoders and loads them with
 * the readers; a client that re-homes a checkpoint reads them with the same
 * code, so the format and its checks have one owner.
 */
#include "blob/shard.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "blob/crc32c.h"
#include "common/fileio.h"
#include "common/le.h"

/* Scratch for bytes a sequential pass reads only for their CRC. */
#define SCRATCH_BYTES ((size_t)1 << 20)
/* Bytes read into a caller's buffer per step (each step's CRC follows it). */
#define READ_MAX ((uint64_t)1 << 30)

/* ---- shard file: header and trailer ---- */

void
dp__shard_header_encode(const dp__shard_header *h, uint8_t out[DP_SHARD_HEADER_LEN])
{
    memcpy(out, DP_SHARD_MAGIC, 8);
    dp__le32_store(out + 8, DP_SHARD_VERSION);
    dp__le32_store(out + 12, h->unit_id);
    dp__le32_store(out + 16, h->n_units);
    dp__le32_store(out + 20, h->n_blobs);
    dp__le64_store(out + 24, h->data_bytes);
}

int
dp__shard_header_decode(const uint8_t p[DP_SHARD_HEADER_LEN], const char *name,
                        dp__shard_header *h, dp_detail *d)
{
    memset(h, 0, sizeof *h);
    if (memcmp(p, DP_SHARD_MAGIC, 8) != 0)
        return dp__fail(d, DP_ECORRUPT, "%s: bad magic at offset 0", name);
    if (dp__le32_load(p + 8) != DP_SHARD_VERSION)
        return dp__fail(d, DP_ECORRUPT, "%s: version %u at offset 8, expected %u", name,
                        dp__le32_load(p + 8), DP_SHARD_VERSION);
    h->unit_id = dp__le32_load(p + 12);
    h->n_units = dp__le32_load(p + 16);
    h->n_blobs = dp__le32_load(p + 20);
    h->data_bytes = dp__le64_load(p + 24);
    h->crc = dp__crc32c(p, DP_SHARD_HEADER_LEN);
    return DP_OK;
}

uint64_t
dp__shard_data_end(const dp__shard_header *h)
{
    return DP_SHARD_HEADER_LEN + h->data_bytes;
}

int
dp__shard_check_len(const dp__shard_header *h, uint64_t file_len, const char *name,
                    dp_detail *d)
{
    if (h->data_bytes > file_len ||
        file_len - h->data_bytes != DP_SHARD_HEADER_LEN + DP_SHARD_TRAILER_LEN)
        return dp__fail(d, DP_ECORRUPT,
                        "%s: %" PRIu64 " bytes, the header (offset 24) says %" PRIu64
                        " of data: truncated or corrupted",
                        name, file_len, h->data_bytes);
    return DP_OK;
}

void
dp__shard_trailer_encode(const dp__shard_header *h, uint32_t data_crc,
                         uint8_t out[DP_SHARD_TRAILER_LEN])
{
    uint8_t hdr[DP_SHARD_HEADER_LEN];
    dp__shard_header_encode(h, hdr);
    memcpy(out, DP_SHARD_END_MAGIC, 8);
    dp__le64_store(out + 8, h->data_bytes);
    dp__le32_store(out + 16, data_crc);
    dp__le32_store(out + 20, dp__crc32c(hdr, sizeof hdr));
}

int
dp__shard_trailer_decode(const uint8_t p[DP_SHARD_TRAILER_LEN], const dp__shard_header *h,
                         const char *name, uint32_t *data_crc, dp_detail *d)
{
    if (memcmp(p, DP_SHARD_END_MAGIC, 8) != 0 || dp__le64_load(p + 8) != h->data_bytes ||
        dp__le32_load(p + 20) != h->crc)
        return dp__fail(d, DP_ECORRUPT, "%s: bad trailer at offset %" PRIu64, name,
                        dp__shard_data_end(h));
    *data_crc = dp__le32_load(p + 16);
    return DP_OK;
}

/* ---- rows file ---- */

uint32_t
dp__shard_row_live(const dp__shard_row *r, uint32_t k)
{
    return dp__le32_load(r->live + 4 * (size_t)k);
}

void
dp__shard_rows_fini(dp__shard_rows *r)
{
    if (r == NULL)
        return;
    free(r->v);
    memset(r, 0, sizeof *r);
}

int
dp__shard_rows_parse(const uint8_t *p, uint64_t len, const char *name,
                     dp__shard_rows *out, dp_detail *d)
{
    memset(out, 0, sizeof *out);
    if (len < DP_SHARD_ROWS_HEADER_LEN + DP_SHARD_ROWS_TRAILER_LEN)
        return dp__fail(d, DP_ECORRUPT,
                        "%s: %" PRIu64 " bytes: not a rows file (offset 0)", name, len);
    if (memcmp(p, DP_ROWS_MAGIC, 8) != 0 ||
        memcmp(p + len - 8, DP_ROWS_END_MAGIC, 8) != 0)
        return dp__fail(d, DP_ECORRUPT, "%s: bad magic at offset %" PRIu64, name,
                        memcmp(p, DP_ROWS_MAGIC, 8) != 0 ? 0 : len - 8);
    if (dp__le32_load(p + len - 12) != dp__crc32c(p, (size_t)len - 12))
        return dp__fail(d, DP_ECORRUPT, "%s: CRC mismatch over [0, %" PRIu64 ")", name,
                        len - 12);
    if (dp__le32_load(p + 8) != DP_SHARD_VERSION)
        return dp__fail(d, DP_ECORRUPT, "%s: version %u at offset 8, expected %u", name,
                        dp__le32_load(p + 8), DP_SHARD_VERSION);
    out->unit_id = dp__le32_load(p + 12);
    out->n_units = dp__le32_load(p + 16);
    uint32_t n = dp__le32_load(p + 20);
    if (n > (len - 36) / 25)
        return dp__fail(d, DP_ECORRUPT, "%s: %u blobs cannot fit (offset 20)", name, n);
    dp__shard_row *r = calloc(n ? n : 1, sizeof *r);
    if (r == NULL)
        return dp__fail(d, DP_ENOMEM, "%s: out of memory for %u blobs", name, n);
    uint64_t pos = DP_SHARD_ROWS_HEADER_LEN, end = len - DP_SHARD_ROWS_TRAILER_LEN;
    for (uint32_t i = 0; i < n; i++) {
        if (end - pos < 1 || end - pos - 1 < (uint64_t)p[pos] + 24 || p[pos] == 0 ||
            p[pos] > DP_SHARD_ID_MAX) {
            free(r);
            return dp__fail(d, DP_ECORRUPT, "%s: bad record at offset %" PRIu64, name,
                            pos);
        }
        r[i].id_len = p[pos];
        r[i].id = (const char *)p + pos + 1;
        const uint8_t *q = p + pos + 1 + r[i].id_len;
        r[i].off = dp__le64_load(q);
        r[i].nbytes = dp__le64_load(q + 8);
        r[i].crc = dp__le32_load(q + 16);
        r[i].n_live = dp__le32_load(q + 20);
        pos += 1 + r[i].id_len + 24;
        if ((end - pos) / 4 < r[i].n_live ||
            !dp__id_valid(r[i].id, r[i].id_len, DP_SHARD_ID_MAX)) {
            free(r);
            return dp__fail(d, DP_ECORRUPT, "%s: bad record at offset %" PRIu64, name,
                            pos);
        }
        r[i].live = p + pos;
        pos += 4 * (uint64_t)r[i].n_live;
    }
    if (pos != end) {
        free(r);
        return dp__fail(d, DP_ECORRUPT, "%s: %" PRIu64 " stray bytes at offset %" PRIu64,
                        name, end - pos, pos);
    }
    out->n = n;
    out->v = r;
    return DP_OK;
}

int
dp__shard_rows_load(const char *name, uint8_t **buf, dp__shard_rows *out, dp_detail *d)
{
    *buf = NULL;
    memset(out, 0, sizeof *out);
    int fd = -1;
    uint64_t len = 0;
    int rc = dp__shard_file_open(name, &fd, &len, d);
    if (rc != 0)
        return rc;
    if (len < DP_SHARD_ROWS_HEADER_LEN + DP_SHARD_ROWS_TRAILER_LEN ||
        len > DP_SHARD_ROWS_MAX) {
        rc = dp__fail(d, DP_ECORRUPT, "%s: %" PRIu64 " bytes: not a rows file (offset 0)",
                      name, len);
        goto out;
    }
    uint8_t *p = malloc((size_t)len);
    if (p == NULL) {
        rc = dp__fail(d, DP_ENOMEM, "load: out of memory for %s", name);
        goto out;
    }
    *buf = p;
    if ((rc = dp__pread_full(fd, p, (size_t)len, 0, NULL, name, d)) != 0)
        goto out;
    rc = dp__shard_rows_parse(p, len, name, out, d);
out:
    close(fd);
    if (rc != 0) {
        free(*buf);
        *buf = NULL;
    }
    return rc;
}

int
dp__shard_rows_check(const dp__shard_rows *rows, const dp__shard_header *h,
                     const char *rows_name, const char *shard_name, dp_detail *d)
{
    if (h->n_blobs != rows->n)
        return dp__fail(d, DP_ECORRUPT, "%s: %u blobs (offset 20), %s lists %u",
                        shard_name, h->n_blobs, rows_name, rows->n);
    uint64_t end = dp__shard_data_end(h);
    for (uint32_t i = 0; i < rows->n; i++) {
        const dp__shard_row *r = &rows->v[i];
        if (r->off < DP_SHARD_HEADER_LEN || r->nbytes == 0 || r->off > end ||
            r->nbytes > end - r->off)
            return dp__fail(
                d, DP_ECORRUPT,
                "%s: blob %.*s at [%" PRIu64 ", +%" PRIu64 ") is outside the data of %s",
                rows_name, (int)r->id_len, r->id, r->off, r->nbytes, shard_name);
    }
    return DP_OK;
}

void
dp__shard_rows_header_encode(uint32_t unit_id, uint32_t n_units, uint32_t n_blobs,
                             uint8_t out[DP_SHARD_ROWS_HEADER_LEN])
{
    memcpy(out, DP_ROWS_MAGIC, 8);
    dp__le32_store(out + 8, DP_SHARD_VERSION);
    dp__le32_store(out + 12, unit_id);
    dp__le32_store(out + 16, n_units);
    dp__le32_store(out + 20, n_blobs);
}

size_t
dp__shard_row_encode(const dp__shard_row *r, uint8_t out[DP_SHARD_ROW_HEAD_MAX])
{
    DP_ASSERT(r->id_len > 0 && r->id_len <= DP_SHARD_ID_MAX);
    out[0] = (uint8_t)r->id_len;
    memcpy(out + 1, r->id, r->id_len);
    uint8_t *q = out + 1 + r->id_len;
    dp__le64_store(q, r->off);
    dp__le64_store(q + 8, r->nbytes);
    dp__le32_store(q + 16, r->crc);
    dp__le32_store(q + 20, r->n_live);
    return (size_t)(q + 24 - out);
}

void
dp__shard_live_encode(uint32_t entry, uint8_t out[4])
{
    dp__le32_store(out, entry);
}

void
dp__shard_rows_trailer_encode(uint32_t crc, uint8_t out[DP_SHARD_ROWS_TRAILER_LEN])
{
    dp__le32_store(out, crc);
    memcpy(out + 4, DP_ROWS_END_MAGIC, 8);
}

/* ---- reading ---- */

int
dp__shard_file_open(const char *name, int *out, uint64_t *len, dp_detail *d)
{
    int fd = open(name, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return dp__fail_sys(d, errno, "opening %s", name);
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return dp__fail_sys(d, e, "stat of %s", name);
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return dp__fail(d, DP_EINVAL, "%s is not a regular file", name);
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0)
        fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    *out = fd;
    *len = (uint64_t)st.st_size;
    return DP_OK;
}

/*
 * Read r's bytes at r->off into dst (in reads of up to 1 GiB), or, with dst
 * NULL, through scratch (SCRATCH_BYTES); *crc gets their CRC32C.
 */
static int
read_blob(int fd, const char *name, const dp__shard_row *r, uint8_t *dst,
          uint8_t *scratch, uint32_t *crc, dp_detail *d)
{
    uint32_t c = 0;
    uint64_t pos = r->off;
    for (uint64_t done = 0; done < r->nbytes;) {
        size_t n = (size_t)DP_MIN(r->nbytes - done, dst ? READ_MAX : SCRATCH_BYTES);
        uint8_t *p = dst ? dst + done : scratch;
        int rc = dp__pread_full(fd, p, n, pos, NULL, name, d);
        if (rc != 0)
            return rc;
        c = dp__crc32c_update(c, p, n);
        done += n;
        pos += n;
    }
    *crc = c;
    return DP_OK;
}

static int
crc_mismatch(const char *name, const dp__shard_row *r, dp_detail *d)
{
    return dp__fail(d, DP_ECORRUPT,
                    "%s: blob %.*s at offset %" PRIu64 " (%" PRIu64
                    " bytes): CRC mismatch",
                    name, (int)r->id_len, r->id, r->off, r->nbytes);
}

/* Pass over [rd->pos, off), keeping only the CRC. */
static int
reader_skip(dp__shard_reader *rd, uint64_t off, dp_detail *d)
{
    while (rd->pos < off) {
        size_t n = (size_t)DP_MIN(off - rd->pos, (uint64_t)SCRATCH_BYTES);
        int rc = dp__pread_full(rd->fd, rd->buf, n, rd->pos, NULL, rd->name, d);
        if (rc != 0)
            return rc;
        rd->crc = dp__crc32c_update(rd->crc, rd->buf, n);
        rd->pos += n;
    }
    return DP_OK;
}

int
dp__shard_reader_init(dp__shard_reader *rd, int fd, const char *name,
                      const dp__shard_header *h, dp_detail *d)
{
    memset(rd, 0, sizeof *rd);
    rd->fd = fd;
    rd->name = name;
    rd->pos = DP_SHARD_HEADER_LEN;
    rd->end = dp__shard_data_end(h);
    rd->buf = malloc(SCRATCH_BYTES);
    if (rd->buf == NULL)
        return dp__fail(d, DP_ENOMEM, "load: out of memory");
    return DP_OK;
}

void
dp__shard_reader_fini(dp__shard_reader *rd)
{
    if (rd == NULL)
        return;
    free(rd->buf);
    rd->buf = NULL;
}

int
dp__shard_reader_blob(dp__shard_reader *rd, const dp__shard_row *r, uint8_t *dst,
                      dp_detail *d)
{
    if (r->off < rd->pos || r->off > rd->end || r->nbytes > rd->end - r->off)
        return dp__fail(d, DP_EINVAL,
                        "%s: blob %.*s at [%" PRIu64 ", +%" PRIu64
                        ") is behind offset %" PRIu64 " or outside the data",
                        rd->name, (int)r->id_len, r->id, r->off, r->nbytes, rd->pos);
    int rc = reader_skip(rd, r->off, d);
    if (rc != 0)
        return rc;
    uint32_t c = 0;
    if ((rc = read_blob(rd->fd, rd->name, r, dst, rd->buf, &c, d)) != 0)
        return rc;
    rd->pos += r->nbytes;
    rd->crc = dp__crc32c_combine(rd->crc, c, r->nbytes);
    return c == r->crc ? DP_OK : crc_mismatch(rd->name, r, d);
}

int
dp__shard_reader_end(dp__shard_reader *rd, uint32_t data_crc, dp_detail *d)
{
    int rc = reader_skip(rd, rd->end, d);
    if (rc != 0)
        return rc;
    if (rd->crc != data_crc)
        return dp__fail(d, DP_ECORRUPT, "%s: data CRC mismatch over [%u, %" PRIu64 ")",
                        rd->name, DP_SHARD_HEADER_LEN, rd->end);
    return DP_OK;
}

int
dp__shard_blob_read(int fd, const char *name, const dp__shard_row *r, uint8_t *dst,
                    dp_detail *d)
{
    uint32_t c = 0;
    int rc = read_blob(fd, name, r, dst, NULL, &c, d);
    if (rc != 0)
        return rc;
    return c == r->crc ? DP_OK : crc_mismatch(name, r, d);
}

/* ---- checking a blob ---- */

void
dp__shard_blob_fini(dp__shard_blob *b)
{
    if (b == NULL)
        return;
    dp__blob_destroy(b->parsed);
    free(b->keep);
    free(b->live);
    memset(b, 0, sizeof *b);
}

int
dp__shard_blob_check(const dp__shard_row *r, const uint8_t *p,
                     const dp__blob_parse_opts *po, const char *shard_name,
                     const char *rows_name, dp__shard_blob *out, dp_detail *d)
{
    memset(out, 0, sizeof *out);
    int rc = dp__blob_parse(p, (size_t)r->nbytes, po, &out->parsed, d);
    if (rc != 0)
        return dp__fail_ctx(d, rc, "%s: blob %.*s at offset %" PRIu64, shard_name,
                            (int)r->id_len, r->id, r->off);
    uint32_t ne = dp__blob_count(out->parsed);
    out->keep = calloc(ne ? ne : 1, 1);
    out->live = malloc((r->n_live ? r->n_live : 1) * sizeof *out->live);
    if (out->keep == NULL || out->live == NULL) {
        rc = dp__fail(d, DP_ENOMEM, "load: out of memory");
        goto fail;
    }
    for (uint32_t j = 0; j < r->n_live; j++) {
        uint32_t e = dp__shard_row_live(r, j);
        if (e >= ne || out->keep[e]) {
            rc = dp__fail(d, DP_ECORRUPT, "%s: blob %.*s: live entry %u of %u", rows_name,
                          (int)r->id_len, r->id, e, ne);
            goto fail;
        }
        out->keep[e] = 1;
        out->live[out->n_live++] = e;
    }
    if (out->n_live == 0) {
        rc = dp__fail(d, DP_ECORRUPT, "%s: blob %.*s has no live entry", rows_name,
                      (int)r->id_len, r->id);
        goto fail;
    }
    return DP_OK;
fail:
    dp__shard_blob_fini(out);
    return rc;
}
