/*
 * Checkpoints of one unit: save_shard writes its live blobs into a shard and
 * its rows file, load_shard reads them back (docs/design.md, "Checkpoints").
 * The files' format, and every check a reader makes, belong to
 * src/blob/shard.c; this file decides what is saved, holds it while the
 * bytes go to disk, and allocates, fills and publishes what is loaded.
 *
 * Design notes
 * ------------
 * Save. Under mu: list the published blobs, the entries of each that the row
 * index still points at (the live keys: an overwritten or cleared key of a
 * blob's own index is not saved as live), dup the fd of each disk blob, and
 * take a hold on each (n_holds; the running saves' hold sets are listed in
 * u->holds for dp__unit_check). A hold keeps a record like a pin does: a
 * release meanwhile makes it a zombie (its region and fd stay), freed when the
 * last pin and hold end. Outside mu, on the caller's thread (for handler.c a
 * thread of its own, whose reply is deferred: the ctl thread goes on serving;
 * destroy stops it at its next blob and waits, see dp__unit_admin_wait), the
 * blobs are copied from the put area (published bytes never change) or from
 * the dup'd fd into path.tmp and path.rows.tmp (O_EXCL), fsync'd and renamed
 * without replacing anything. Back under mu the holds end. A spill not yet
 * acknowledged is not published: not saved.
 *
 * Load. Under mu: a put-area region per blob not already in the table (or,
 * with spill and the SSD tier, a spill file to come). Outside mu: one
 * sequential pass over the shard filling the regions, checking each blob's
 * CRC32C and the whole data's, parsing each blob's index as commit does
 * (dp__shard_reader_blob, dp__shard_blob_check), and writing the spill files.
 * Back under mu: everything is published (only the live entries,
 * dp__rows_publish_locked's keep), or, on any failure, the regions are freed
 * (never exposed: no transfer can have touched them) and nothing is.
 *
 * Trust: paths come from the control plane, which is trusted to name files
 * on this host (checked: absolute, bounded, no control characters); the unit
 * writes only path.tmp / path.rows.tmp and their renames.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "alloc/slab_alloc.h"
#include "blob/crc32c.h"
#include "blob/shard.h"
#include "common/fileio.h"
#include "unit/unit_int.h"

/* Chunk of a disk blob's file copied at a time by a save. */
#define CK_CHUNK ((size_t)1 << 20)
/* Live entry indexes encoded per write of a rows record. */
#define CK_LIVE_BATCH 256

/* Copy a client path into buf (NUL-terminated) if it passes the rules. */
static int
ck_path(const char *p, size_t n, char *buf, const char *op, dp_detail *d)
{
    if (n < 2 || n > DP_UNIT_PATH_MAX || p[0] != '/')
        return dp__fail(d, DP_EINVAL, "%s: path must be absolute and 2..%d bytes long",
                        op, DP_UNIT_PATH_MAX);
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)p[i] < 0x20 || p[i] == 0x7f)
            return dp__fail(d, DP_EINVAL,
                            "%s: path has a NUL or control character at byte %zu", op, i);
    memcpy(buf, p, n);
    buf[n] = '\0';
    return 0;
}

/* dst = base + suffix; dst has DP_UNIT_PATH_MAX + 16 bytes, base passed ck_path. */
static void
ck_name(char *dst, const char *base, const char *suffix)
{
    size_t n = strlen(base), m = strlen(suffix);
    DP_ASSERT(n <= DP_UNIT_PATH_MAX && m < 16);
    memcpy(dst, base, n);
    memcpy(dst + n, suffix, m + 1);
}

/* Sequential writer with a running CRC32C of what it wrote. */
typedef struct ck_out {
    int fd;
    uint64_t pos;
    uint32_t crc;
    const char *name;
} ck_out;

/* The file is new (O_EXCL) and written only here: pos is its offset. */
static int
ck_write(ck_out *o, const void *p, size_t n, dp_detail *d)
{
    o->crc = dp__crc32c_update(o->crc, p, n);
    int rc = dp__pwrite_full(o->fd, p, n, o->pos, o->name, d);
    if (rc == 0)
        o->pos += n;
    return rc;
}

static int
ck_create_tmp(const char *tmp, int *fd, dp_detail *d)
{
    *fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (*fd < 0 && errno == EEXIST)
        return dp__fail(d, DP_EEXIST,
                        "creating %s: it exists (a save that died?); not overwritten",
                        tmp);
    if (*fd < 0)
        return dp__fail_sys(d, errno, "creating %s", tmp);
    return 0;
}

/* fsync, close and rename tmp to final; the fd is closed either way. */
static int
ck_finish(int fd, const char *tmp, const char *final, dp_detail *d)
{
    int rc = 0;
    if (fsync(fd) != 0)
        rc = dp__fail_sys(d, errno, "fsync of %s", tmp);
    if (close(fd) != 0 && rc == 0)
        rc = dp__fail_sys(d, errno, "closing %s", tmp);
    /* Never replaces a file: a save writes only names that did not exist. */
    if (rc == 0 && renameat2(AT_FDCWD, tmp, AT_FDCWD, final, RENAME_NOREPLACE) != 0)
        rc = errno == EEXIST
                 ? dp__fail(d, DP_EEXIST, "renaming %s: %s exists; not replaced", tmp,
                            final)
                 : dp__fail_sys(d, errno, "renaming %s to %s", tmp, final);
    return rc;
}

/* One blob of a save's snapshot. */
typedef struct ck_snap {
    blob_rec *b;
    uint64_t nbytes;
    uint64_t refs;
    const uint8_t *src; /* put-area copy, or NULL */
    int fd;             /* dup of a disk blob's fd, or -1 */
    uint32_t *live;
    uint32_t n_live;
    /* A home save of a blob holding other units' rows: a new blob of the
     * live[] entries alone (in their order), under its own id. */
    bool rewrite;
    dp__blob_builder *bb;
    dp__blob_layout lay;
    char id[DP_UNIT_ID_MAX + 1];
    size_t id_len;
} ck_snap;

/* A running save: its files and its snapshot. */
typedef struct ck_save {
    char fin[DP_UNIT_PATH_MAX + 16], tmp[DP_UNIT_PATH_MAX + 16];
    char rfin[DP_UNIT_PATH_MAX + 16], rtmp[DP_UNIT_PATH_MAX + 16];
    uint32_t unit_id, n_units;
    bool home; /* only the rows whose first unit this is (one copy of each) */
    hold_set h;
    ck_snap *sn;
    uint32_t n;
    uint8_t *buf; /* CK_CHUNK, for disk blobs */
    int fd, rfd;
    bool tmp_made, rtmp_made;
    ck_out so, ro; /* the shard and the rows file */
    uint32_t data_crc;
} ck_save;

/* Drop the holds of a save (its blobs may be freed now). */
static void
holds_release_locked(dp__unit *u, hold_set *h)
{
    dp__list_remove(&u->holds, &h->link);
    double now = dp__unit_now(u);
    for (uint32_t i = 0; i < h->n; i++) {
        blob_rec *b = h->b[i];
        DP_ASSERT(b->n_holds > 0);
        b->n_holds--;
        if (b->state == REC_ZOMBIE && b->n_pins == 0 && b->n_holds == 0) {
            dp__rec_zombie_count_locked(u, b, -1);
            dp__rec_drop_locked(u, b, now);
        }
    }
    h->n = 0;
}

/* Snapshot the live blobs and hold them (home: see ck_save). Nothing held on error. */
static int
snapshot_locked(dp__unit *u, bool home, hold_set *h, ck_snap **out, uint32_t *n_out,
                dp_detail *d)
{
    int rc = DP_ENOMEM;
    uint64_t cap = u->stats.published;
    ck_snap *sn = calloc(cap ? cap : 1, sizeof *sn);
    h->b = calloc(cap ? cap : 1, sizeof *h->b);
    h->n = 0;
    if (sn == NULL || h->b == NULL)
        goto nomem;
    size_t it = 0;
    void *v;
    uint32_t n = 0;
    while (dp__map_next(&u->blobs, &it, NULL, NULL, NULL, &v)) {
        blob_rec *b = v;
        if (b->state != REC_PUBLISHED)
            continue;
        DP_ASSERT(n < cap);
        ck_snap *s = &sn[n];
        *s = (ck_snap){.fd = -1};
        uint32_t ne = dp__blob_count(b->parsed);
        s->live = malloc((ne ? ne : 1) * sizeof *s->live);
        if (s->live == NULL)
            goto nomem;
        bool all_home = true;
        for (uint32_t i = 0; i < ne; i++) {
            const dp__blob_entry *e = dp__blob_entry_at(b->parsed, i);
            bool mine = !home || e->gidx % u->o.n_units == u->o.unit_id;
            all_home = all_home && mine;
            row *r = dp__map_get_u64(&u->rows, e->gidx);
            slot *sl = dp__row_slot(r, e->field, (uint32_t)e->field_len);
            if (mine && sl != NULL && sl->b == b && sl->i == i)
                s->live[s->n_live++] = i;
        }
        if (s->n_live == 0 && home) {
            /* Only copies of other units' rows: their first units save them. */
            free(s->live);
            s->live = NULL;
            continue;
        }
        /* Its entries of other rows (live or not) would not load into another
         * count of replicas: a new blob of the home rows' live entries. */
        s->rewrite = !all_home;
        if (b->flags & REC_DISK) {
            s->fd = fcntl(b->fd, F_DUPFD_CLOEXEC, 0);
            if (s->fd < 0) {
                int e = errno;
                free(s->live);
                s->live = NULL;
                for (uint32_t j = 0; j < n; j++)
                    if (sn[j].fd >= 0)
                        close(sn[j].fd);
                rc = dp__fail_sys(d, e, "save: dup of the file of disk blob %s", b->id);
                goto undo;
            }
        } else {
            s->src = u->slab + b->off;
        }
        s->b = b;
        s->nbytes = b->nbytes;
        s->refs = b->refs;
        n++;
    }
    for (uint32_t i = 0; i < n; i++) {
        sn[i].b->n_holds++;
        h->b[h->n++] = sn[i].b;
    }
    dp__list_insert_head(&u->holds, &h->link);
    *out = sn;
    *n_out = n;
    return 0;
nomem:
    dp__fail(d, DP_ENOMEM, "save: out of memory");
    if (sn != NULL)
        for (uint64_t j = 0; j < cap; j++)
            if (sn[j].fd >= 0 && sn[j].b != NULL)
                close(sn[j].fd);
undo:
    if (sn != NULL)
        for (uint64_t j = 0; j < cap; j++)
            free(sn[j].live);
    free(sn);
    free(h->b);
    h->b = NULL;
    return rc;
}

void
dp__unit_save_res_fini(dp__unit_save_res *res)
{
    if (res == NULL)
        return;
    free(res->blobs);
    free(res->ids);
    memset(res, 0, sizeof *res);
}

/*
 * Lay out snapshot blob s's rewrite (a home save): its live entries alone, in
 * their index order, under a new id: the old one with ":h", or, when that
 * would pass the id limit, its first 50 bytes, ":h" and the CRC32C of the
 * whole old id (ids are unique per unit part of a put, so the new one is
 * unique on any unit that loads it).
 */
static int
rewrite_plan(ck_snap *s, dp_detail *d)
{
    const dp__blob *pb = s->b->parsed;
    bool crc = (dp__blob_get_header(pb)->flags & DP_BLOB_FLAG_CRC) != 0;
    int rc = dp__blob_builder_create(crc ? DP_BLOB_FLAG_CRC : 0, &s->bb, d);
    if (rc == 0) /* its entries' fields were checked by its parse */
        dp__blob_builder_trust_keys(s->bb, true);
    for (uint32_t j = 0; rc == 0 && j < s->n_live; j++) {
        const dp__blob_entry *e = dp__blob_entry_at(pb, s->live[j]);
        uint32_t field = 0;
        rc = dp__blob_builder_field(s->bb, e->field, e->field_len, &field, d);
        dp__blob_entry_spec sp = {.gidx = e->gidx,
                                  .field = field,
                                  .kind = e->kind,
                                  .dtype = e->dtype,
                                  .shape = e->shape,
                                  .ndim = e->ndim,
                                  .len = e->len,
                                  .has_crc = crc && e->has_crc,
                                  .crc = e->crc};
        if (rc == 0)
            rc = dp__blob_builder_add(s->bb, &sp, NULL, d);
    }
    if (rc == 0)
        rc = dp__blob_builder_layout(s->bb, &s->lay, d);
    if (rc != 0)
        return dp__fail_ctx(d, rc, "save: blob %s, its home rows", s->b->id);
    s->nbytes = s->lay.total_len;
    s->refs = s->n_live;
    if (s->b->id_len + 2 <= DP_UNIT_ID_MAX) {
        memcpy(s->id, s->b->id, s->b->id_len);
        memcpy(s->id + s->b->id_len, ":h", 3);
    } else {
        snprintf(s->id, sizeof s->id, "%.50s:h%08x", s->b->id,
                 dp__crc32c(s->b->id, s->b->id_len));
    }
    s->id_len = strlen(s->id);
    return 0;
}

/* Append p[0..n) of a blob to the shard, into its CRC32C too. */
static int
blob_out(ck_save *sv, uint32_t *bcrc, const void *p, size_t n, dp_detail *d)
{
    *bcrc = dp__crc32c_update(*bcrc, p, n);
    return ck_write(&sv->so, p, n, d);
}

/* Zeros up to the blob's offset `to` (less than an alignment away). */
static int
blob_pad(ck_save *sv, uint32_t *bcrc, uint64_t *pos, uint64_t to, dp_detail *d)
{
    static const uint8_t zeros[DP_BLOB_ALIGN];
    DP_ASSERT(to >= *pos && to - *pos <= sizeof zeros);
    int rc = blob_out(sv, bcrc, zeros, (size_t)(to - *pos), d);
    *pos = to;
    return rc;
}

/* Write blob s's rewrite (rewrite_plan): header and index, each payload, padding. */
static int
save_rewrite(ck_save *sv, ck_snap *s, uint32_t *bcrc, dp_detail *d)
{
    uint64_t pos = s->lay.payload_off;
    uint8_t *hb = malloc((size_t)pos);
    if (hb == NULL)
        return dp__fail(d, DP_ENOMEM, "save: out of memory");
    int rc = dp__blob_builder_write(s->bb, hb, (size_t)pos, d);
    if (rc == 0)
        rc = blob_out(sv, bcrc, hb, (size_t)pos, d);
    free(hb);
    for (uint32_t j = 0; rc == 0 && j < s->n_live; j++) {
        const dp__blob_entry *e = dp__blob_entry_at(s->b->parsed, s->live[j]);
        rc = blob_pad(sv, bcrc, &pos, dp__blob_builder_offset(s->bb, j), d);
        if (s->src != NULL && rc == 0)
            rc = blob_out(sv, bcrc, s->src + e->off, (size_t)e->len, d);
        for (uint64_t done = 0; s->src == NULL && rc == 0 && done < e->len;) {
            size_t c = (size_t)DP_MIN(e->len - done, (uint64_t)CK_CHUNK);
            rc = dp__pread_full(s->fd, sv->buf, c, e->off + done, NULL,
                                "a disk blob's file", d);
            if (rc == 0)
                rc = blob_out(sv, bcrc, sv->buf, c, d);
            done += c;
        }
        pos += e->len;
    }
    if (rc == 0)
        rc = blob_pad(sv, bcrc, &pos, s->lay.total_len, d);
    return rc;
}

/* Copy snapshot blob i into the shard and its record into the rows file. */
static int
save_blob(dp__unit *u, ck_save *sv, uint32_t i, dp__unit_save_res *res, dp_detail *d)
{
    ck_snap *s = &sv->sn[i];
    uint64_t off = sv->so.pos;
    uint32_t bcrc = 0;
    int rc = dp__unit_admin_cancelled(u, "save", d);
    if (rc != 0)
        return rc;
    if (s->bb != NULL) {
        rc = save_rewrite(sv, s, &bcrc, d);
    } else if (s->src != NULL) {
        bcrc = dp__crc32c(s->src, (size_t)s->nbytes);
        rc = ck_write(&sv->so, s->src, (size_t)s->nbytes, d);
    } else {
        for (uint64_t done = 0; rc == 0 && done < s->nbytes;) {
            size_t c = (size_t)DP_MIN(s->nbytes - done, (uint64_t)CK_CHUNK);
            rc = dp__pread_full(s->fd, sv->buf, c, done, NULL, "a disk blob's file", d);
            if (rc == 0) {
                bcrc = dp__crc32c_update(bcrc, sv->buf, c);
                rc = ck_write(&sv->so, sv->buf, c, d);
            }
            done += c;
        }
    }
    if (rc != 0)
        return dp__fail_ctx(d, rc, "save: blob %s", s->b->id);
    DP_ASSERT(sv->so.pos - off == s->nbytes);
    sv->data_crc = dp__crc32c_combine(sv->data_crc, bcrc, s->nbytes);
    const char *id = s->bb != NULL ? s->id : s->b->id;
    size_t id_len = s->bb != NULL ? s->id_len : s->b->id_len;
    memcpy(res->ids[i], id, id_len + 1);
    res->blobs[i] = (dp__wire_shard_blob){{res->ids[i], id_len}, off, s->nbytes, s->refs};
    dp__shard_row rec = {.id = id,
                         .id_len = (uint32_t)id_len,
                         .off = off,
                         .nbytes = s->nbytes,
                         .crc = bcrc,
                         .n_live = s->n_live};
    uint8_t rb[DP_SHARD_ROW_HEAD_MAX];
    if ((rc = ck_write(&sv->ro, rb, dp__shard_row_encode(&rec, rb), d)) != 0)
        return rc;
    uint8_t lv[4 * CK_LIVE_BATCH];
    for (uint32_t k = 0; k < s->n_live;) {
        uint32_t m = DP_MIN(s->n_live - k, (uint32_t)CK_LIVE_BATCH);
        /* A rewrite holds its live entries alone: 0, 1, ... */
        for (uint32_t j = 0; j < m; j++)
            dp__shard_live_encode(s->bb != NULL ? k + j : s->live[k + j], lv + 4 * j);
        if ((rc = ck_write(&sv->ro, lv, 4 * (size_t)m, d)) != 0)
            return rc;
        k += m;
    }
    return 0;
}

/* Write both temporaries, then rename them: rows first, then the shard. */
static int
save_files(dp__unit *u, ck_save *sv, dp__unit_save_res *res, dp_detail *d)
{
    uint32_t n = sv->n;
    res->blobs = calloc(n ? n : 1, sizeof *res->blobs);
    res->ids = calloc(n ? n : 1, sizeof *res->ids);
    sv->buf = malloc(CK_CHUNK);
    if (res->blobs == NULL || res->ids == NULL || sv->buf == NULL)
        return dp__fail(d, DP_ENOMEM, "save: out of memory");
    int rc = ck_create_tmp(sv->tmp, &sv->fd, d);
    if (rc != 0)
        return rc;
    sv->tmp_made = true;
    if ((rc = ck_create_tmp(sv->rtmp, &sv->rfd, d)) != 0)
        return rc;
    sv->rtmp_made = true;
    dp__shard_header h = {.unit_id = sv->unit_id, .n_units = sv->n_units, .n_blobs = n};
    for (uint32_t i = 0; i < n; i++) {
        if (sv->sn[i].rewrite && (rc = rewrite_plan(&sv->sn[i], d)) != 0)
            return rc;
        h.data_bytes += sv->sn[i].nbytes;
    }
    uint8_t hdr[DP_SHARD_HEADER_LEN], rh[DP_SHARD_ROWS_HEADER_LEN];
    dp__shard_header_encode(&h, hdr);
    dp__shard_rows_header_encode(sv->unit_id, sv->n_units, n, rh);
    sv->so = (ck_out){sv->fd, 0, 0, sv->tmp};
    sv->ro = (ck_out){sv->rfd, 0, 0, sv->rtmp};
    if ((rc = ck_write(&sv->so, hdr, sizeof hdr, d)) != 0 ||
        (rc = ck_write(&sv->ro, rh, sizeof rh, d)) != 0)
        return rc;
    for (uint32_t i = 0; i < n; i++)
        if ((rc = save_blob(u, sv, i, res, d)) != 0)
            return rc;
    uint8_t tr[DP_SHARD_TRAILER_LEN], rt[DP_SHARD_ROWS_TRAILER_LEN];
    dp__shard_trailer_encode(&h, sv->data_crc, tr);
    if ((rc = ck_write(&sv->so, tr, sizeof tr, d)) != 0)
        return rc;
    dp__shard_rows_trailer_encode(sv->ro.crc, rt);
    if ((rc = ck_write(&sv->ro, rt, sizeof rt, d)) != 0)
        return rc;
    res->nbytes = sv->so.pos;
    res->shard_crc = sv->so.crc;
    res->rows_crc = sv->ro.crc;
    res->n_blobs = n;
    /* Rows first: a shard name never exists without its rows file. */
    rc = ck_finish(sv->rfd, sv->rtmp, sv->rfin, d);
    sv->rfd = -1;
    if (rc != 0)
        return rc;
    sv->rtmp_made = false;
    rc = ck_finish(sv->fd, sv->tmp, sv->fin, d);
    sv->fd = -1;
    if (rc != 0) {
        unlink(sv->rfin);
        return rc;
    }
    sv->tmp_made = false;
    return 0;
}

int
dp__unit_save_shard(dp__unit *u, const char *path, size_t path_len,
                    dp__unit_save_res *res, dp_detail *d)
{
    dp__wire_save_shard_args a = {.path = {path, path_len}};
    return dp__unit_save_shard_as(u, &a, res, d);
}

int
dp__unit_save_shard_as(dp__unit *u, const dp__wire_save_shard_args *a,
                       dp__unit_save_res *res, dp_detail *d)
{
    const char *path = a->path.p;
    size_t path_len = a->path.n;
    memset(res, 0, sizeof *res);
    ck_save sv = {.fd = -1, .rfd = -1, .home = a->home};
    int rc = ck_path(path, path_len, sv.fin, "save_shard", d);
    if (rc != 0)
        return rc;
    ck_name(sv.tmp, sv.fin, ".tmp");
    ck_name(sv.rfin, sv.fin, ".rows");
    ck_name(sv.rtmp, sv.fin, ".rows.tmp");
    pthread_mutex_lock(&u->mu);
    rc = snapshot_locked(u, sv.home, &sv.h, &sv.sn, &sv.n, d);
    uint64_t clears0 = u->n_clears;
    sv.unit_id = u->o.unit_id;
    sv.n_units = u->o.n_units;
    pthread_mutex_unlock(&u->mu);
    if (rc != 0)
        return rc;

    /* File I/O without the lock: the holds keep every snapshotted copy. */
    rc = save_files(u, &sv, res, d);
    if (sv.fd >= 0)
        close(sv.fd);
    if (sv.rfd >= 0)
        close(sv.rfd);
    if (sv.tmp_made)
        unlink(sv.tmp);
    if (sv.rtmp_made)
        unlink(sv.rtmp);
    free(sv.buf);
    for (uint32_t i = 0; i < sv.n; i++) {
        if (sv.sn[i].fd >= 0)
            close(sv.sn[i].fd);
        free(sv.sn[i].live);
        dp__blob_builder_destroy(sv.sn[i].bb);
    }
    free(sv.sn);
    pthread_mutex_lock(&u->mu);
    holds_release_locked(u, &sv.h);
    res->clears_during_save = u->n_clears - clears0;
    if (rc == 0)
        u->stats.saves++;
    pthread_mutex_unlock(&u->mu);
    free(sv.h.b);
    if (rc != 0)
        dp__unit_save_res_fini(res);
    return rc;
}

/* ---- load ---- */

/* What happens to one requested blob. */
enum { LB_FAILED = 0, LB_PRESENT, LB_REGION, LB_DISK };

typedef struct load_blob {
    const dp__wire_shard_blob *w;
    const dp__shard_row *r;
    int state;
    uint64_t off, size; /* LB_REGION */
    uint8_t *buf;       /* LB_DISK: the bytes, until written to the spill file */
    int fd;             /* LB_DISK */
    dp__shard_blob sb;  /* its checked index and live entries */
} load_blob;

/* A running load: its files, the rows file's records and the request. */
typedef struct ck_load {
    char fin[DP_UNIT_PATH_MAX + 16], rfin[DP_UNIT_PATH_MAX + 16];
    uint32_t of; /* the unit whose shard it is (load_of) */
    int fd;
    dp__shard_header h;
    uint32_t data_crc; /* the trailer's */
    uint8_t *rbuf;     /* the rows file; rows point into it */
    dp__shard_rows rows;
    dp__map byid;    /* blob id -> its row */
    load_blob *lb;   /* the request, in its order */
    load_blob **ord; /* the same, in file order */
    uint32_t n;
} ck_load;

static int
lb_cmp(const void *a, const void *b)
{
    const load_blob *x = *(load_blob *const *)a, *y = *(load_blob *const *)b;
    return x->r->off < y->r->off ? -1 : x->r->off > y->r->off;
}

void
dp__unit_load_res_fini(dp__unit_load_res *res)
{
    if (res == NULL)
        return;
    free(res->loaded);
    free(res->failed);
    memset(res, 0, sizeof *res);
}

/* The unit whose shard a load asks for: this one, or a copy's first unit. */
static uint32_t
load_of(const dp__unit *u, uint64_t copy)
{
    uint32_t n = u->o.n_units;
    return (uint32_t)((u->o.unit_id + n - copy % n) % n);
}

/* Open the shard and check its frame; a shard of another unit is refused. */
static int
load_open(dp__unit *u, ck_load *ld, dp_detail *d)
{
    uint64_t flen = 0;
    int rc = dp__shard_file_open(ld->fin, &ld->fd, &flen, d);
    if (rc != 0)
        return rc;
    uint8_t hdr[DP_SHARD_HEADER_LEN], tr[DP_SHARD_TRAILER_LEN];
    if ((rc = dp__pread_full(ld->fd, hdr, sizeof hdr, 0, NULL, ld->fin, d)) != 0 ||
        (rc = dp__shard_header_decode(hdr, ld->fin, &ld->h, d)) != 0)
        return rc;
    if (ld->h.unit_id != ld->of || ld->h.n_units != u->o.n_units)
        return dp__fail(
            d, DP_EINVAL,
            "%s: shard of unit %u of a %u-unit cluster, this is unit %u of %u "
            "loading %s%u's (rows are placed by gidx %% units)",
            ld->fin, ld->h.unit_id, ld->h.n_units, u->o.unit_id, u->o.n_units,
            ld->of == u->o.unit_id ? "unit " : "the copies of unit ", ld->of);
    if ((rc = dp__shard_check_len(&ld->h, flen, ld->fin, d)) != 0)
        return rc;
    uint64_t toff = dp__shard_data_end(&ld->h);
    if ((rc = dp__pread_full(ld->fd, tr, sizeof tr, toff, NULL, ld->fin, d)) != 0)
        return rc;
    return dp__shard_trailer_decode(tr, &ld->h, ld->fin, &ld->data_crc, d);
}

/* Read path.rows: of this unit, agreeing with the shard; index it by id. */
static int
load_rows(dp__unit *u, ck_load *ld, dp_detail *d)
{
    int rc = dp__shard_rows_load(ld->rfin, &ld->rbuf, &ld->rows, d);
    if (rc != 0)
        return rc;
    if (ld->rows.unit_id != ld->of || ld->rows.n_units != u->o.n_units)
        return dp__fail(d, DP_EINVAL,
                        "%s: written by unit %u of %u, unit %u of %u was asked for "
                        "(offset 12)",
                        ld->rfin, ld->rows.unit_id, ld->rows.n_units, ld->of,
                        u->o.n_units);
    if ((rc = dp__shard_rows_check(&ld->rows, &ld->h, ld->rfin, ld->fin, d)) != 0)
        return rc;
    for (uint32_t i = 0; i < ld->rows.n; i++) {
        const dp__shard_row *r = &ld->rows.v[i];
        if (dp__map_put(&ld->byid, r->id, r->id_len, (void *)r, NULL) != 0)
            return dp__fail(d, DP_ENOMEM, "load: out of memory");
    }
    return 0;
}

/* The request: every blob must be in the rows file, as save reported it. */
static int
load_plan(ck_load *ld, const dp__wire_shard_blob *blobs, uint32_t n,
          dp__unit_load_res *res, dp_detail *d)
{
    ld->lb = calloc(n ? n : 1, sizeof *ld->lb);
    ld->ord = calloc(n ? n : 1, sizeof *ld->ord);
    res->loaded = calloc(n ? n : 1, sizeof *res->loaded);
    res->failed = calloc(n ? n : 1, sizeof *res->failed);
    if (ld->lb == NULL || ld->ord == NULL || res->loaded == NULL || res->failed == NULL)
        return dp__fail(d, DP_ENOMEM, "load: out of memory");
    ld->n = n;
    for (uint32_t i = 0; i < n; i++)
        ld->lb[i].fd = -1; /* before any check can fail: load_fini closes them */
    for (uint32_t i = 0; i < n; i++) {
        load_blob *x = &ld->lb[i];
        x->w = &blobs[i];
        x->r = dp__map_get(&ld->byid, blobs[i].id.p, blobs[i].id.n);
        if (x->r == NULL || x->r->off != blobs[i].off || x->r->nbytes != blobs[i].nbytes)
            return dp__fail(d, DP_EINVAL,
                            "load_shard: blob %.*s [%" PRIu64 ", +%" PRIu64
                            ") is not in %s",
                            (int)blobs[i].id.n, blobs[i].id.p, blobs[i].off,
                            blobs[i].nbytes, ld->rfin);
        ld->ord[i] = x;
    }
    qsort(ld->ord, n, sizeof *ld->ord, lb_cmp);
    for (uint32_t i = 1; i < n; i++) {
        const dp__shard_row *r = ld->ord[i]->r, *q = ld->ord[i - 1]->r;
        if (r == q || r->off < q->off + q->nbytes)
            return dp__fail(d, DP_EINVAL,
                            "load_shard: blob %.*s asked twice or overlapping",
                            (int)r->id_len, r->id);
    }
    return 0;
}

/* A put-area region for each blob not in the table, else a spill file to come. */
static void
load_alloc_locked(dp__unit *u, ck_load *ld, bool spill)
{
    double now = dp__unit_now(u);
    for (uint32_t i = 0; i < ld->n; i++) {
        load_blob *x = &ld->lb[i];
        const dp__shard_row *r = x->r;
        blob_rec *b = dp__map_get(&u->blobs, r->id, r->id_len);
        if (b != NULL) {
            x->state = b->state == REC_PUBLISHED ? LB_PRESENT : LB_FAILED;
            continue;
        }
        uint64_t o = 0;
        dp_detail ad;
        dp_detail_clear(&ad);
        if (r->nbytes <= u->o.slab_bytes &&
            dp__unit_put_alloc_locked(u, r->nbytes, now, &o, NULL, &ad) == 0) {
            x->state = LB_REGION;
            x->off = o;
            x->size = r->nbytes;
            dp__slab_alloc_size_of(u->alloc, o, &x->size);
        } else if (spill && u->ssd && r->nbytes <= u->o.staging_bytes) {
            x->state = LB_DISK;
        } else {
            x->state = LB_FAILED;
        }
    }
}

/*
 * Fill without the lock: one pass over the data in file order, every blob's
 * CRC32C and the whole data's checked, each blob to be published checked as a
 * commit would (its index, its live list).
 */
static int
load_fill(dp__unit *u, ck_load *ld, dp_detail *d)
{
    dp__shard_reader rd;
    int rc = dp__shard_reader_init(&rd, ld->fd, ld->fin, &ld->h, d);
    dp__blob_parse_opts po = {0};
    po.n_units = u->o.n_units;
    po.unit_index = u->o.unit_id;
    po.replicas = u->o.replicas;
    for (uint32_t k = 0; k < ld->n && rc == 0; k++) {
        load_blob *x = ld->ord[k];
        if ((rc = dp__unit_admin_cancelled(u, "load", d)) != 0)
            break;
        uint8_t *dst = NULL;
        if (x->state == LB_REGION) {
            dst = u->slab + x->off;
        } else if (x->state == LB_DISK) {
            dst = x->buf = malloc((size_t)x->r->nbytes);
            if (dst == NULL) {
                rc = dp__fail(d, DP_ENOMEM, "load: out of memory for blob %.*s",
                              (int)x->r->id_len, x->r->id);
                break;
            }
        }
        /* Straight into its region: one pread per blob (up to 1 GiB). */
        if ((rc = dp__shard_reader_blob(&rd, x->r, dst, d)) != 0)
            break;
        if (dst != NULL)
            rc = dp__shard_blob_check(x->r, dst, &po, ld->fin, ld->rfin, &x->sb, d);
    }
    if (rc == 0)
        rc = dp__shard_reader_end(&rd, ld->data_crc, d);
    dp__shard_reader_fini(&rd);
    return rc;
}

/* Spill files (outside the lock, as an io job would); a failure fails the blob. */
static void
load_spill_files(dp__unit *u, ck_load *ld)
{
    for (uint32_t i = 0; i < ld->n; i++) {
        load_blob *x = &ld->lb[i];
        if (x->state != LB_DISK)
            continue;
        char label[DP_UNIT_PATH_MAX + 64];
        dp_detail fd_d;
        dp_detail_clear(&fd_d);
        if (dp__ssd_new_file(u, u->use_tmpfile, &x->fd, label, sizeof label, &fd_d) !=
                0 ||
            dp__pwrite_full(x->fd, x->buf, (size_t)x->r->nbytes, 0, label, &fd_d) != 0) {
            DP_LOG_W("unit %u: load: spill of blob %.*s failed: %s", u->o.unit_id,
                     (int)x->r->id_len, x->r->id, dp_detail_msg(&fd_d));
            if (x->fd >= 0)
                close(x->fd);
            x->fd = -1;
            x->state = LB_FAILED;
        }
        free(x->buf);
        x->buf = NULL;
    }
}

/* Publish x as a new record; false (nothing changed) if that failed. */
static bool
load_publish_one_locked(dp__unit *u, load_blob *x, double now)
{
    blob_rec *b = calloc(1, sizeof *b);
    if (b == NULL)
        return false;
    memcpy(b->id, x->r->id, x->r->id_len);
    b->id_len = x->r->id_len;
    b->nbytes = x->r->nbytes;
    b->fd = -1;
    b->created_at = now;
    b->parsed = x->sb.parsed;
    if (x->state == LB_REGION) {
        b->off = x->off;
        b->size = x->size;
        b->area = REC_AREA_PUT;
    } else {
        b->size = x->r->nbytes;
        dp__rec_flag_locked(b, REC_DISK, true);
        b->fd = x->fd;
        u->stats.files_open++;
        u->stats.disk_blobs++;
        u->stats.disk_bytes += b->nbytes;
    }
    if (dp__map_put(&u->blobs, b->id, b->id_len, b, NULL) != 0 ||
        dp__rows_publish_locked(u, b, x->sb.keep, now, NULL) != 0) {
        dp__map_del(&u->blobs, b->id, b->id_len);
        if (b->flags & REC_DISK) {
            u->stats.disk_blobs--;
            u->stats.disk_bytes -= b->nbytes;
            u->stats.files_open--;
        }
        free(b);
        return false;
    }
    x->sb.parsed = NULL; /* the record owns it */
    x->fd = -1;
    return true;
}

/*
 * Publish every filled blob (rc 0), or free every region (rc != 0: nothing
 * is published), and report each blob as loaded or failed.
 */
static void
load_publish_locked(dp__unit *u, ck_load *ld, int rc, dp__unit_load_res *res)
{
    double now = dp__unit_now(u);
    for (uint32_t i = 0; i < ld->n; i++) {
        load_blob *x = &ld->lb[i];
        bool fresh = x->state == LB_REGION || x->state == LB_DISK;
        if (rc == 0 && fresh && dp__map_get(&u->blobs, x->r->id, x->r->id_len) == NULL) {
            if (load_publish_one_locked(u, x, now)) {
                x->state = LB_PRESENT;
                u->stats.loaded_blobs++;
            }
        } else if (rc == 0 && x->state != LB_FAILED) {
            /* Already there, or a put of the same id won meanwhile. */
            if (x->state == LB_REGION)
                dp__slab_alloc_free(u->alloc, x->off, NULL);
            x->state = LB_PRESENT;
        }
        if (x->state == LB_REGION) {
            /* Never exposed: no transfer can run into it. */
            dp__slab_alloc_free(u->alloc, x->off, NULL);
            if (rc == 0)
                x->state = LB_FAILED;
        }
        if (rc == 0) {
            if (x->state == LB_PRESENT)
                res->loaded[res->n_loaded++] = x->w->id;
            else
                res->failed[res->n_failed++] = x->w->id;
        }
    }
    if (rc == 0)
        u->stats.loads++;
}

static void
load_fini(ck_load *ld)
{
    if (ld->fd >= 0)
        close(ld->fd);
    for (uint32_t i = 0; ld->lb != NULL && i < ld->n; i++) {
        if (ld->lb[i].fd >= 0)
            close(ld->lb[i].fd);
        free(ld->lb[i].buf);
        dp__shard_blob_fini(&ld->lb[i].sb);
    }
    free(ld->lb);
    free(ld->ord);
    dp__shard_rows_fini(&ld->rows);
    free(ld->rbuf);
    dp__map_fini(&ld->byid);
}

int
dp__unit_load_shard(dp__unit *u, const dp__wire_load_shard_args *a,
                    dp__unit_load_res *res, dp_detail *d)
{
    const char *path = a->path.p;
    size_t path_len = a->path.n;
    const dp__wire_shard_blob *blobs = a->blobs.v;
    uint32_t n = a->blobs.n;
    bool spill = a->spill;
    memset(res, 0, sizeof *res);
    ck_load ld = {.fd = -1};
    dp__map_init_str(&ld.byid);
    int rc = ck_path(path, path_len, ld.fin, "load_shard", d);
    if (rc != 0)
        goto out;
    ck_name(ld.rfin, ld.fin, ".rows");
    uint32_t reps = u->o.replicas > 0 ? u->o.replicas : 1;
    if (a->copy >= reps) {
        rc = dp__fail(d, DP_EINVAL,
                      "load_shard: copy %" PRIu64 " asked of a unit of a cluster that "
                      "keeps %u cop%s of each row (0 .. %u)",
                      a->copy, reps, reps == 1 ? "y" : "ies", reps - 1);
        goto out;
    }
    ld.of = load_of(u, a->copy);
    if ((rc = load_open(u, &ld, d)) != 0 || (rc = load_rows(u, &ld, d)) != 0 ||
        (rc = load_plan(&ld, blobs, n, res, d)) != 0)
        goto out;
    pthread_mutex_lock(&u->mu);
    load_alloc_locked(u, &ld, spill);
    pthread_mutex_unlock(&u->mu);
    rc = load_fill(u, &ld, d);
    if (rc == 0)
        load_spill_files(u, &ld);
    pthread_mutex_lock(&u->mu);
    load_publish_locked(u, &ld, rc, res);
    pthread_mutex_unlock(&u->mu);
out:
    load_fini(&ld);
    if (rc != 0)
        dp__unit_load_res_fini(res);
    return rc;
}
