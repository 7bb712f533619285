/*
 * Fixtures of the checkpoint tests (test_checkpoint and
 * test_checkpoint_cluster): a unit on the real clock (dp_unit_fixture.h's
 * mk_unit runs a fake one: the two headers do not go together), puts of rows
 * whose bytes derive from (row, version), the version a unit holds of a row,
 * a scratch directory, save and load of one shard, a file corrupted in place,
 * and a cluster of units each served by a ctl server in this process. Include
 * after dp_test.h (CHECK) and dp_unit_blob.h.
 */
#ifndef DP_CHECKPOINT_FIXTURE_H
#define DP_CHECKPOINT_FIXTURE_H

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dp_unit_blob.h"

#include "blob/blob.h"
#include "cluster/cluster.h"
#include "common/common.h"
#include "ctl/ctl.h"
#include "unit/unit.h"
#include "wire/wire.h"

/* ---- units, rows and shards ---- */

/* A unit of a cluster keeping `replicas` copies of each row. */
static inline dp__unit *
mk_unit_r(uint64_t slab, uint32_t n_units, uint32_t unit_id, uint32_t replicas)
{
    dp__unit_opts o;
    dp__unit_opts_init(&o);
    o.slab_bytes = slab;
    o.n_units = n_units;
    o.unit_id = unit_id;
    o.replicas = replicas;
    o.numa = DP_UNIT_NUMA_OFF;
    dp__unit *u = NULL;
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_OK_D(dp__unit_create(&o, &u, &d), &d);
    return u;
}

static inline dp__unit *
mk_unit(uint64_t slab, uint32_t n_units, uint32_t unit_id)
{
    return mk_unit_r(slab, n_units, unit_id, 1);
}

/* Payload byte k of key (gidx, field) at version ver. */
static inline uint8_t
pat(uint64_t gidx, uint32_t ver, uint64_t k)
{
    return (uint8_t)(gidx * 131 + ver * 17 + k * 3 + 1);
}

/* Put one blob holding rows gidxs[0..n) (field "f"), version ver, plen bytes each. */
static inline int put_rows_spill(dp__unit *u, const char *id, const uint64_t *gidxs,
                                 uint32_t n, uint32_t ver, uint64_t plen, bool spill);

static inline int
put_rows(dp__unit *u, const char *id, const uint64_t *gidxs, uint32_t n, uint32_t ver,
         uint64_t plen)
{
    return put_rows_spill(u, id, gidxs, n, ver, plen, false);
}

/* As put_rows; with spill, a blob the put area cannot take goes to the SSD tier. */
static inline int
put_rows_spill(dp__unit *u, const char *id, const uint64_t *gidxs, uint32_t n,
               uint32_t ver, uint64_t plen, bool spill)
{
    dp__blob_builder *b = NULL;
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_OK_D(dp__blob_builder_create(DP_BLOB_FLAG_CRC, &b, &d), &d);
    uint8_t *pay = malloc(n * plen);
    char key[64];
    for (uint32_t i = 0; i < n; i++) {
        for (uint64_t k = 0; k < plen; k++)
            pay[i * plen + k] = pat(gidxs[i], ver, k);
        snprintf(key, sizeof key, "%llu@f", (unsigned long long)gidxs[i]);
        dp__blob_entry_spec s = {0};
        s.key = key;
        s.kind = DP_BLOB_BYTES;
        s.len = plen;
        s.payload = pay + i * plen;
        CHECK_OK_D(dp__blob_builder_add(b, &s, NULL, &d), &d);
    }
    dp__blob_layout lay;
    CHECK_OK_D(dp__blob_builder_layout(b, &lay, &d), &d);
    uint64_t off = 0;
    int rc =
        dp_test_unit_alloc(u, id, strlen(id), lay.total_len, n, spill, &off, NULL, &d);
    if (rc == 0) {
        uint8_t *dst = dp__unit_slab(u) + off;
        CHECK_OK_D(dp__blob_builder_write(b, dst, lay.total_len, &d), &d);
        CHECK_OK_D(dp__blob_builder_copy_payloads(b, dst, lay.total_len, &d), &d);
        dp__blob_header_set_alloc(dst, dp__unit_incarnation(u),
                                  dp__unit_alloc_token(u, id, strlen(id)));
        dp__wire_commit_state st = DP_WIRE_COMMIT_LOST;
        for (int tries = 0; tries < 10000; tries++) {
            CHECK_OK_D(dp__unit_commit(u, id, strlen(id), &st, &d), &d);
            if (st != DP_WIRE_COMMIT_PENDING)
                break;
            usleep(1000);
        }
        CHECK_EQ(st, DP_WIRE_COMMIT_DONE);
    }
    dp__blob_builder_destroy(b);
    free(pay);
    return rc;
}

/* The version of row gidx's "f" held by u (0: missing), its bytes checked. */
static inline uint32_t
row_version(dp__unit *u, uint64_t gidx, uint64_t plen, uint32_t max_ver)
{
    char key[64];
    snprintf(key, sizeof key, "%llu@f", (unsigned long long)gidx);
    dp__wire_str k = {key, (uint32_t)strlen(key)};
    dp__unit_resolve_keys_res r;
    dp_detail d;
    dp_detail_clear(&d);
    /* A disk blob answers pending while it is staged: ask again. */
    for (int tries = 0;; tries++) {
        dp__unit_lock(u);
        CHECK_OK_D(dp__unit_resolve_keys_locked(u, &k, 1, &r, &d), &d);
        dp__unit_unlock(u);
        if (r.n_pending == 0 || tries > 5000)
            break;
        dp__unit_resolve_keys_res_fini(&r);
        usleep(1000);
    }
    CHECK_EQ(r.n_failed, 0);
    dp__unit_lock(u);
    uint32_t ver = 0;
    if (r.n_entries == 1) {
        CHECK_EQ(r.entries[0].len, plen);
        const uint8_t *p = dp__unit_slab(u) + r.entries[0].off;
        for (uint32_t v = 1; v <= max_ver && ver == 0; v++) {
            uint64_t k2 = 0;
            while (k2 < plen && p[k2] == pat(gidx, v, k2))
                k2++;
            if (k2 == plen)
                ver = v;
        }
        CHECKF(ver != 0, "row %llu: bytes match no version", (unsigned long long)gidx);
    }
    dp__unit_unlock(u);
    if (r.pin_id[0])
        dp__unit_unpin(u, r.pin_id, strlen(r.pin_id));
    dp__unit_resolve_keys_res_fini(&r);
    return ver;
}

static char tmpdir[256];

/* Every test removes its files; the directory goes at exit (if empty). */
static inline void
rm_tmpdir(void)
{
    rmdir(tmpdir);
}

static inline const char *
tpath(const char *name, char *buf, size_t cap)
{
    if (tmpdir[0] == '\0') {
        snprintf(tmpdir, sizeof tmpdir, "/tmp/dp-ckpt-test-XXXXXX");
        CHECK(mkdtemp(tmpdir) != NULL);
        atexit(rm_tmpdir);
    }
    mkdir(tmpdir, 0700); /* again if a test removed it */
    snprintf(buf, cap, "%s/%s", tmpdir, name);
    return buf;
}

static inline void
rm_shard(const char *p)
{
    char b[1100];
    unlink(p);
    snprintf(b, sizeof b, "%s.rows", p);
    unlink(b);
    snprintf(b, sizeof b, "%s.tmp", p);
    unlink(b);
    snprintf(b, sizeof b, "%s.rows.tmp", p);
    unlink(b);
}

static inline int
save(dp__unit *u, const char *p, dp__unit_save_res *res, dp_detail *d)
{
    return dp__unit_save_shard(u, p, strlen(p), res, d);
}

static inline int
load(dp__unit *u, const char *p, const dp__unit_save_res *sr, bool spill,
     dp__unit_load_res *lr, dp_detail *d)
{
    return dp_test_load_shard(u, p, sr->blobs, sr->n_blobs, spill, lr, d);
}

/* A save of only the rows whose first unit u is (one copy of each row). */
static inline int
save_home(dp__unit *u, const char *p, dp__unit_save_res *res, dp_detail *d)
{
    dp__wire_save_shard_args a = {.path = {p, (uint32_t)strlen(p)}, .home = true};
    return dp__unit_save_shard_as(u, &a, res, d);
}

/* Load the one-copy shard at p as copy k of its rows (0: u's own). */
static inline int
load_copy(dp__unit *u, const char *p, const dp__unit_save_res *sr, uint64_t copy,
          dp__unit_load_res *lr, dp_detail *d)
{
    dp__wire_load_shard_args a = {.path = {p, (uint32_t)strlen(p)},
                                  .blobs = {sr->blobs, sr->n_blobs},
                                  .copy = copy};
    return dp__unit_load_shard(u, &a, lr, d);
}

static inline void
corrupt_at(const char *p, uint64_t off)
{
    int fd = open(p, O_RDWR);
    CHECK(fd >= 0);
    uint8_t c = 0;
    CHECK_EQ(pread(fd, &c, 1, (off_t)off), 1);
    c ^= 0x40;
    CHECK_EQ(pwrite(fd, &c, 1, (off_t)off), 1);
    close(fd);
}

/* ---- a cluster of units in this process, each served by a ctl server ---- */

typedef struct tcluster {
    uint32_t n;
    dp__unit *u[4];
    dp__ctl_server *srv[4];
    dp__cluster cl;
    char file[512];
} tcluster;

/* n units (SSD tier on with ssd_dir) each served by a ctl server. */
static inline void
tc_start(tcluster *t, uint32_t n, uint64_t slab, const char *ssd_dir, const char *name)
{
    memset(t, 0, sizeof *t);
    t->n = n;
    t->cl.n_units = n;
    t->cl.units = calloc(n, sizeof *t->cl.units);
    dp_detail d;
    dp_detail_clear(&d);
    for (uint32_t i = 0; i < n; i++) {
        dp__unit_opts o;
        dp__unit_opts_init(&o);
        o.slab_bytes = slab;
        o.n_units = n;
        o.unit_id = i;
        o.numa = DP_UNIT_NUMA_OFF;
        if (ssd_dir != NULL) {
            o.ssd_dir = ssd_dir;
            o.staging_bytes = 4 << 20;
            o.io_threads = 2;
        }
        CHECK_OK_D(dp__unit_create(&o, &t->u[i], &d), &d);
        dp__ctl_server_opts so = {0};
        CHECK_OK_D(dp__ctl_server_open(&so, dp__unit_handle, dp__unit_handle_oversize,
                                       t->u[i], &t->srv[i], &d),
                   &d);
        dp__unit_set_address(t->u[i], dp__ctl_server_address(t->srv[i]));
        t->cl.units[i].id = i;
        snprintf(t->cl.units[i].zmq, sizeof t->cl.units[i].zmq, "%s",
                 dp__ctl_server_address(t->srv[i]));
        snprintf(t->cl.units[i].agent, sizeof t->cl.units[i].agent, "unit-%u", i);
    }
    tpath(name, t->file, sizeof t->file);
    CHECK_OK_D(dp__cluster_save(t->file, &t->cl, &d), &d);
}

static inline void
tc_stop(tcluster *t)
{
    for (uint32_t i = 0; i < t->n; i++) {
        dp__ctl_server_close(t->srv[i]);
        dp_test_unit_check(t->u[i]);
        dp__unit_destroy(t->u[i]);
    }
    unlink(t->file);
    dp__cluster_fini(&t->cl);
}

/* Rows 0..rows-1 (plen bytes each) of two clusters hold the same versions. */
static inline void
tc_same(tcluster *a, tcluster *b, uint64_t rows, uint64_t plen, uint32_t max_ver)
{
    for (uint64_t g = 0; g < rows; g++)
        CHECK_EQ(row_version(b->u[g % b->n], g, plen, max_ver),
                 row_version(a->u[g % a->n], g, plen, max_ver));
    uint64_t ea = 0, eb = 0;
    for (uint32_t i = 0; i < a->n; i++)
        ea += dp_test_unit_stats(a->u[i]).entries;
    for (uint32_t i = 0; i < b->n; i++)
        eb += dp_test_unit_stats(b->u[i]).entries;
    CHECK_EQ(eb, ea);
}

/* Puts (per unit), overwrites and clears, in process. */
static inline void
tc_fill(tcluster *t, uint64_t rows, uint64_t plen, uint32_t per_blob)
{
    uint32_t nb = 0;
    for (uint32_t ver = 1; ver <= 2; ver++) {
        for (uint32_t u = 0; u < t->n; u++) {
            uint64_t g[64];
            uint32_t k = 0;
            for (uint64_t r = u; r < rows; r += t->n) {
                if (ver == 2 && r % 3 != 0)
                    continue; /* overwrite every third row */
                g[k++] = r;
                if (k == per_blob || r + t->n >= rows) {
                    char id[32];
                    snprintf(id, sizeof id, "c%u", nb++);
                    CHECK_OK(put_rows(t->u[u], id, g, k, ver, plen));
                    k = 0;
                }
            }
            if (k > 0) {
                char id[32];
                snprintf(id, sizeof id, "c%u", nb++);
                CHECK_OK(put_rows(t->u[u], id, g, k, ver, plen));
            }
        }
    }
    for (uint64_t g = 1; g < rows; g += 7) /* clears */
        dp__unit_release_rows(t->u[g % t->n], &g, 1);
}

#endif
