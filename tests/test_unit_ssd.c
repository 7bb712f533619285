/*
 * Tests for the unit's SSD tier (DESIGN section 9): spills of puts the put
 * area cannot take, stages of disk blobs back into the IO area, eviction of
 * staged copies, files that never outlive the unit, disks that fail (a file
 * size limit, a truncated file) answering "lost" / failed and never a wrong
 * byte, concurrent readers of one staged blob, a randomised check of
 * invariant 1 over both areas, and a unit in another process over real ZMQ
 * and UCX that is SIGKILLed with its files open.
 */
#include "dp_test.h"
#include "dp_tsan_ucx.h"
#include "dp_proc.h"
#include "dp_unit_blob.h"

#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "blob/blob.h"
#include "blob/crc32c.h"
#include "common/common.h"
#include "ctl/ctl.h"
#include "unit/server.h"
#include "unit/unit.h"
#include "wire/wire.h"
#include "xfer/endpoint.h"

/* ---- helpers ---- */

static char *
mk_dir(void)
{
    char *p = strdup("/tmp/dp-ssd-test-XXXXXX");
    CHECK(p != NULL && mkdtemp(p) != NULL);
    return p;
}

/* Entries of dir other than . and .. */
static int
dir_count(const char *dir)
{
    DIR *dh = opendir(dir);
    if (dh == NULL)
        return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(dh)) != NULL)
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0)
            n++;
    closedir(dh);
    return n;
}

static void
rm_dir(char *dir)
{
    if (dir == NULL)
        return;
    CHECK_EQ(dir_count(dir), 0);
    rmdir(dir);
    free(dir);
}

static dp_unit *
mk_ssd_unit(uint64_t slab, uint64_t staging, const char *dir, double pickup_s,
            uint32_t n_units)
{
    dp_unit_opts o;
    dp__unit_opts_init(&o);
    o.slab_bytes = slab;
    o.n_units = n_units;
    o.read_pin_s = 30;
    o.alloc_lease_s = 60;
    o.quarantine_s = 0.05;
    o.numa = DP_UNIT_NUMA_OFF;
    o.ssd_dir = dir;
    o.staging_bytes = staging;
    o.pickup_s = pickup_s;
    o.io_threads = 3;
    dp_unit *u = NULL;
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_OK_D(dp__unit_create(&o, &u, &d), &d);
    return u;
}

/* Wait until no io job is queued or running (bounded). */
static void
wait_idle(dp_unit *u)
{
    double t0 = dp_test_now();
    while (dp_test_unit_stats(u).io_jobs > 0 && dp_test_now() - t0 < 30)
        dp__sleep_s(0.001);
    CHECK_EQ(dp_test_unit_stats(u).io_jobs, 0);
}

/* ---- rows with content we can check ---- */

/* Field "a" of row g, version v: length and bytes derived from (g, v). */
static uint64_t
row_len(uint64_t g, uint32_t v)
{
    return 1000 + (g * 7919 + v * 131) % 30000;
}

static void
row_fill(uint64_t g, uint32_t v, uint8_t *p, uint64_t len)
{
    uint64_t s = g * 1000003u + v;
    for (uint64_t k = 0; k < len; k += 8) {
        uint64_t x = dp_test_rand(&s);
        memcpy(p + k, &x, DP_MIN(8, len - k));
    }
}

typedef struct tblob {
    uint8_t *p;
    uint64_t len;
    uint32_t n;
} tblob;

/* One blob holding fields "a" (row_fill) and "b" (8 bytes: g, v) of rows. */
static tblob
rows_blob(const uint64_t *g, uint32_t n, uint32_t v)
{
    dp_blob_builder *b = NULL;
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_OK_D(dp__blob_builder_create(DP_BLOB_FLAG_CRC, &b, &d), &d);
    uint8_t **pay = calloc(2 * n, sizeof *pay);
    char(*keys)[48] = calloc(2 * n, sizeof *keys);
    for (uint32_t i = 0; i < n; i++) {
        uint64_t la = row_len(g[i], v);
        pay[2 * i] = malloc(la);
        row_fill(g[i], v, pay[2 * i], la);
        pay[2 * i + 1] = malloc(8);
        uint64_t tag = g[i] << 16 | v;
        memcpy(pay[2 * i + 1], &tag, 8);
        snprintf(keys[2 * i], 48, "%" PRIu64 "@a", g[i]);
        snprintf(keys[2 * i + 1], 48, "%" PRIu64 "@b", g[i]);
        for (int f = 0; f < 2; f++) {
            dp_blob_entry_spec s = {0};
            s.key = keys[2 * i + f];
            s.kind = DP_BLOB_BYTES;
            s.len = f == 0 ? la : 8;
            s.payload = pay[2 * i + f];
            s.has_crc = true;
            s.crc = dp__crc32c(s.payload, s.len);
            CHECK_OK_D(dp__blob_builder_add(b, &s, NULL, &d), &d);
        }
    }
    dp_blob_layout lay;
    CHECK_OK_D(dp__blob_builder_layout(b, &lay, &d), &d);
    tblob t = {calloc(1, lay.total_len), lay.total_len, 2 * n};
    CHECK_OK_D(dp__blob_builder_write(b, t.p, lay.total_len, &d), &d);
    CHECK_OK_D(dp__blob_builder_copy_payloads(b, t.p, lay.total_len, &d), &d);
    dp__blob_builder_destroy(b);
    for (uint32_t i = 0; i < 2 * n; i++)
        free(pay[i]);
    free(pay);
    free(keys);
    return t;
}

/* alloc(spill) with Busy retried, WRITE, commit polled; returns the final state. */
static dp_wire_commit_state
put_spill(dp_unit *u, const char *id, const tblob *t, bool *spilled)
{
    uint64_t off = 0;
    dp_detail d;
    dp_detail_clear(&d);
    double t0 = dp_test_now();
    int rc;
    for (;;) {
        rc = dp__unit_alloc_spill(u, id, strlen(id), t->len, t->n, true, &off, NULL, &d);
        if (rc != DP_EBUSY || dp_test_now() - t0 > 30)
            break;
        dp__sleep_s(0.001);
    }
    CHECK_OK_D(rc, &d);
    if (spilled != NULL)
        *spilled = off >= dp__unit_io_base(u) && dp__unit_io_bytes(u) > 0;
    dp_test_write_blob(u, id, off, t->p, t->len);
    dp_wire_commit_state st = DP_WIRE_COMMIT_LOST;
    t0 = dp_test_now();
    for (;;) {
        CHECK_OK_D(dp__unit_commit(u, id, strlen(id), &st, &d), &d);
        if (st != DP_WIRE_COMMIT_PENDING || dp_test_now() - t0 > 30)
            break;
        dp__sleep_s(0.0005);
    }
    return st;
}

enum { RD_OK = 0, RD_MISSING, RD_FAILED };

/*
 * Read key g@a (and g@b) as a client would: resolve_keys, pending -> ask
 * again, then "READ" (copy out under the pin, outside the lock) and unpin.
 * Checks the bytes against version v. Returns RD_OK, RD_MISSING or RD_FAILED.
 */
static int
read_row(dp_unit *u, uint64_t g, uint32_t v)
{
    char ka[48], kb[48];
    snprintf(ka, sizeof ka, "%" PRIu64 "@a", g);
    snprintf(kb, sizeof kb, "%" PRIu64 "@b", g);
    dp_wire_str keys[2] = {dp__wire_s(ka), dp__wire_s(kb)};
    dp_detail d;
    dp_detail_clear(&d);
    double t0 = dp_test_now();
    for (;;) {
        dp_unit_resolve_keys_res r;
        dp__unit_lock(u);
        int rc = dp__unit_resolve_keys_locked(u, keys, 2, &r, &d);
        dp__unit_unlock(u);
        CHECK_OK_D(rc, &d);
        if (r.n_pending > 0) {
            CHECK_EQ(r.n_pending, 2); /* both keys live in one blob */
            CHECK(r.pin_id[0] == '\0');
            dp__unit_resolve_keys_res_fini(&r);
            CHECKF(dp_test_now() - t0 < 30, "row %" PRIu64 " pending for 30 s", g);
            dp__sleep_s(0.0005);
            continue;
        }
        if (r.n_failed > 0 || r.n_missing > 0) {
            int out = r.n_failed > 0 ? RD_FAILED : RD_MISSING;
            CHECK_EQ(r.n_entries, 0);
            CHECK(r.pin_id[0] == '\0');
            dp__unit_resolve_keys_res_fini(&r);
            return out;
        }
        CHECK_EQ(r.n_entries, 2);
        uint64_t la = row_len(g, v);
        uint8_t *want = malloc(la), *got = malloc(la);
        row_fill(g, v, want, la);
        uint64_t off_a = 0, off_b = 0, len_a = 0;
        for (int i = 0; i < 2; i++) {
            if (dp__wire_str_eq(r.entries[i].key, ka)) {
                off_a = r.entries[i].off;
                len_a = r.entries[i].len;
            } else {
                off_b = r.entries[i].off;
            }
        }
        CHECK_EQ_U64(len_a, la);
        /* The READ: outside the lock, under the pin. */
        memcpy(got, dp__unit_slab(u) + off_a, la);
        uint64_t tag;
        memcpy(&tag, dp__unit_slab(u) + off_b, 8);
        CHECKF(memcmp(got, want, la) == 0, "row %" PRIu64 " v%u: wrong bytes", g, v);
        CHECK_EQ_U64(tag, g << 16 | v);
        dp__unit_unpin(u, r.pin_id, strlen(r.pin_id));
        dp__unit_resolve_keys_res_fini(&r);
        free(want);
        free(got);
        return RD_OK;
    }
}

/* ---- core tests ---- */

DP_TEST(options_and_info)
{
    char *dir = mk_dir();
    dp_unit_opts o;
    dp__unit_opts_init(&o);
    o.slab_bytes = 1 << 20;
    o.numa = DP_UNIT_NUMA_OFF;
    dp_unit *u = NULL;
    o.staging_bytes = 1 << 20; /* without ssd_dir */
    CHECK_ERR(dp__unit_create(&o, &u, NULL), DP_EINVAL);
    o.ssd_dir = dir;
    o.staging_bytes = 0;
    CHECK_ERR(dp__unit_create(&o, &u, NULL), DP_EINVAL);
    o.staging_bytes = 1 << 20;
    o.ssd_dir = "/nonexistent/dp-ssd";
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_ERR_D(dp__unit_create(&o, &u, &d), DP_ESYS, &d);
    CHECK_CONTAINS(dp_detail_msg(&d), "/nonexistent/dp-ssd");
    o.ssd_dir = dir;
    o.slab_bytes = (1 << 20) + 100; /* the IO area starts 4 KiB aligned */
    CHECK_OK_D(dp__unit_create(&o, &u, &d), &d);
    CHECK_EQ(dp__unit_io_bytes(u), 1 << 20);
    CHECK_EQ(dp__unit_io_base(u), (1 << 20) + 4096);
    dp_wire_info info;
    dp__unit_lock(u);
    dp__unit_info_locked(u, &info);
    const uint8_t *p = NULL;
    /* read_bytes covers both areas, not the gap nor past the end */
    CHECK_OK(dp__unit_read_bytes_locked(u, dp__unit_io_base(u), 1 << 20, &p, NULL));
    CHECK_ERR(dp__unit_read_bytes_locked(u, (1 << 20) + 200, 16, &p, NULL), DP_EPROTO);
    CHECK_ERR(dp__unit_read_bytes_locked(u, dp__unit_io_base(u) + 1, 1 << 20, &p, NULL),
              DP_EPROTO);
    dp_wire_fields f = {0};
    CHECK_OK(dp__unit_stats_locked(u, &f, NULL));
    dp__unit_unlock(u);
    CHECK_EQ(info.io_bytes, 1 << 20);
    uint64_t v = 0;
    CHECK(dp__wire_fields_u64(&f, "io_bytes", &v) && v == 1 << 20);
    CHECK(dp__wire_fields_u64(&f, "spills", &v) && v == 0);
    CHECK(dp__wire_fields_u64(&f, "stages_failed", &v) && v == 0);
    free(f.v);
    CHECK_EQ(dir_count(dir), 0); /* the probe file is gone */
    /* Too big for either area is a Protocol error; for the put area only without
     * spill. */
    uint64_t off;
    CHECK_ERR(dp__unit_alloc_spill(u, "x", 1, 3 << 20, 0, true, &off, NULL, NULL),
              DP_EPROTO);
    CHECK_ERR(
        dp__unit_alloc_spill(u, "x", 1, (1 << 20) + 8192, 0, false, &off, NULL, NULL),
        DP_EPROTO);
    CHECK_OK(
        dp__unit_alloc_spill(u, "x", 1, (1 << 20) - 4096, 0, true, &off, NULL, NULL));
    CHECK(off < (1 << 20));
    /* The put area is full now: a spill lands in the IO area. */
    CHECK_OK(dp__unit_alloc_spill(u, "y", 1, 64 << 10, 0, true, &off, NULL, NULL));
    CHECK(off >= dp__unit_io_base(u));
    dp_test_unit_check(u);
    dp__unit_destroy(u);
    rm_dir(dir);
}

DP_TEST(fill_past_ram_read_overwrite_clear)
{
    char *dir = mk_dir();
    dp_unit *u = mk_ssd_unit(1 << 20, 512 << 10, dir, 0.2, 1);
    enum { ROWS = 240, PER = 4 };
    uint32_t ver[ROWS];
    uint64_t total = 0;
    int spilled_n = 0;
    for (uint32_t b = 0; b < ROWS / PER; b++) {
        uint64_t g[PER];
        for (uint32_t i = 0; i < PER; i++) {
            g[i] = b * PER + i;
            ver[g[i]] = 1;
        }
        tblob t = rows_blob(g, PER, 1);
        total += t.len;
        char id[32];
        snprintf(id, sizeof id, "fill-%u", b);
        bool sp = false;
        CHECK_EQ(put_spill(u, id, &t, &sp), DP_WIRE_COMMIT_DONE);
        spilled_n += sp;
        free(t.p);
    }
    dp_unit_stats s = dp_test_unit_stats(u);
    printf("  %" PRIu64 " bytes in %u blobs on a 1 MiB slab: %d spilled, %" PRIu64
           " disk blobs\n",
           total, ROWS / PER, spilled_n, s.disk_blobs);
    CHECK(total > 3 * (1 << 20));
    CHECK(spilled_n > 0);
    EXPECT_EQ(s.spills, (uint64_t)spilled_n);
    EXPECT_EQ(s.disk_blobs, (uint64_t)spilled_n);
    EXPECT_EQ(s.files_open, (uint64_t)spilled_n);
    EXPECT_EQ(s.spills_failed, 0);
    EXPECT_EQ(s.entries, 2 * ROWS);
    EXPECT_EQ(dir_count(dir), 0); /* the files have no names */
    dp_test_unit_check(u);

    /* Every row back, twice (the second pass stages again after evictions). */
    for (int pass = 0; pass < 2; pass++)
        for (uint64_t g = 0; g < ROWS; g++)
            CHECK_EQ(read_row(u, g, ver[g]), RD_OK);
    s = dp_test_unit_stats(u);
    CHECK(s.stages >= (uint64_t)spilled_n);
    CHECK(s.evictions > 0);
    CHECK_EQ(s.stages_failed, 0);
    dp_test_unit_check(u);

    /* Overwrite a third of the rows (new versions, spilled as needed). */
    for (uint32_t b = 0; b < ROWS / PER; b += 3) {
        uint64_t g[PER];
        for (uint32_t i = 0; i < PER; i++) {
            g[i] = b * PER + i;
            ver[g[i]] = 2;
        }
        tblob t = rows_blob(g, PER, 2);
        char id[32];
        snprintf(id, sizeof id, "over-%u", b);
        CHECK_EQ(put_spill(u, id, &t, NULL), DP_WIRE_COMMIT_DONE);
        free(t.p);
    }
    wait_idle(u);
    dp_test_unit_check(u);
    for (uint64_t g = 0; g < ROWS; g++)
        CHECK_EQ(read_row(u, g, ver[g]), RD_OK);

    /* Clear half of the rows: gone, files of fully cleared blobs closed. */
    uint64_t clear[ROWS / 2];
    for (uint32_t i = 0; i < ROWS / 2; i++)
        clear[i] = i;
    CHECK_EQ(dp__unit_release_rows(u, clear, ROWS / 2), ROWS);
    for (uint64_t g = 0; g < ROWS; g++)
        CHECK_EQ(read_row(u, g, ver[g]), g < ROWS / 2 ? RD_MISSING : RD_OK);
    dp_test_unit_check(u);
    uint64_t rest[ROWS / 2];
    for (uint32_t i = 0; i < ROWS / 2; i++)
        rest[i] = ROWS / 2 + i;
    CHECK_EQ(dp__unit_release_rows(u, rest, ROWS / 2), ROWS);
    wait_idle(u);
    s = dp_test_unit_stats(u);
    CHECK_EQ(s.disk_blobs, 0);
    CHECK_EQ(s.files_open, 0);
    CHECK_EQ(s.staged_blobs, 0);
    CHECK_EQ(s.published, 0);
    dp_test_unit_check(u);
    dp__unit_destroy(u);
    rm_dir(dir);
}

/* Leave only fds of this process that point into dir (unlinked spill files). */
static int
spill_fds(const char *dir, int *fds, int cap)
{
    DIR *dh = opendir("/proc/self/fd");
    CHECK(dh != NULL);
    int n = 0;
    struct dirent *e;
    size_t dl = strlen(dir);
    while ((e = readdir(dh)) != NULL) {
        char p[300], t[4096];
        snprintf(p, sizeof p, "/proc/self/fd/%s", e->d_name);
        ssize_t k = readlink(p, t, sizeof t - 1);
        if (k <= 0)
            continue;
        t[k] = '\0';
        if (strncmp(t, dir, dl) == 0 && t[dl] == '/' && n < cap)
            fds[n++] = atoi(e->d_name);
    }
    closedir(dh);
    return n;
}

DP_TEST(failing_disk_lost_and_failed)
{
    char *dir = mk_dir();
    dp_unit *u = mk_ssd_unit(64 << 10, 512 << 10, dir, 0.2, 1);
    /* Fill the put area so every put below spills. */
    uint64_t off;
    CHECK_OK(dp__unit_alloc_spill(u, "fill", 4, 64 << 10, 0, false, &off, NULL, NULL));

    /* A file size limit (SIGXFSZ ignored): writes past it fail with EFBIG. */
    struct rlimit old, lim;
    CHECK(getrlimit(RLIMIT_FSIZE, &old) == 0);
    struct sigaction ign = {0}, oldsa;
    ign.sa_handler = SIG_IGN;
    CHECK(sigaction(SIGXFSZ, &ign, &oldsa) == 0);
    lim = old;
    lim.rlim_cur = 40 << 10;
    CHECK(setrlimit(RLIMIT_FSIZE, &lim) == 0);
    uint64_t gs[3] = {1, 2, 3}, gb[1] = {9};
    tblob small = rows_blob(gs, 1, 1); /* < 40 KiB: fits the limit */
    tblob big = rows_blob(gs + 1, 2, 1);
    CHECK(small.len < (40 << 10) && big.len > (40 << 10));
    CHECK_EQ(put_spill(u, "small", &small, NULL), DP_WIRE_COMMIT_DONE);
    CHECK_EQ(put_spill(u, "big", &big, NULL), DP_WIRE_COMMIT_LOST);
    CHECK(setrlimit(RLIMIT_FSIZE, &old) == 0);
    CHECK(sigaction(SIGXFSZ, &oldsa, NULL) == 0);
    /* lost stays lost; nothing of it was published */
    dp_wire_commit_state st;
    CHECK_OK(dp__unit_commit(u, "big", 3, &st, NULL));
    CHECK_EQ(st, DP_WIRE_COMMIT_LOST);
    dp_unit_stats s = dp_test_unit_stats(u);
    EXPECT_EQ(s.spills_failed, 1);
    EXPECT_EQ(s.spills, 1);
    EXPECT_EQ(s.io_allocated_bytes, 0);
    EXPECT_EQ(s.files_open, 1);
    CHECK_EQ(read_row(u, 1, 1), RD_OK);
    CHECK_EQ(read_row(u, 2, 1), RD_MISSING);
    CHECK_EQ(read_row(u, 3, 1), RD_MISSING);
    dp_test_unit_check(u);

    /* A disk that loses data: a truncated file fails its stage, never a wrong byte. */
    tblob other = rows_blob(gb, 1, 1);
    CHECK_EQ(put_spill(u, "other", &other, NULL), DP_WIRE_COMMIT_DONE);
    /* Evict row 1's staged copy: it was picked up and unpinned. */
    dp__sleep_s(0.25);
    wait_idle(u);
    int fds[8];
    int nf = spill_fds(dir, fds, 8);
    CHECK_EQ(nf, 2);
    for (int i = 0; i < nf; i++)
        CHECK(ftruncate(fds[i], 100) == 0);
    /* Row 1 may still be staged from before; row 9 never was. */
    CHECK_EQ(read_row(u, 9, 1), RD_FAILED);
    s = dp_test_unit_stats(u);
    CHECK(s.stages_failed >= 1);
    /* failed is answered once; the next resolve tries again (and fails again) */
    CHECK_EQ(read_row(u, 9, 1), RD_FAILED);
    dp_test_unit_check(u);
    uint64_t all[4] = {1, 2, 3, 9};
    CHECK_EQ(dp__unit_release_rows(u, all, 4), 4);
    wait_idle(u);
    CHECK_EQ(dp_test_unit_stats(u).files_open, 0);
    dp_test_unit_check(u);
    free(small.p);
    free(big.p);
    free(other.p);
    dp__unit_destroy(u);
    rm_dir(dir);
}

DP_TEST(pickup_and_eviction_order)
{
    char *dir = mk_dir();
    /* An IO area that holds two staged copies of these blobs, not three. */
    uint64_t g[3][1] = {{1}, {2}, {3}};
    tblob t[3];
    for (int i = 0; i < 3; i++)
        t[i] = rows_blob(g[i], 1, 1);
    /* Sizes grow with the row: copies of 1 and 3 fit together, not of all three. */
    uint64_t io =
        DP_ALIGN_UP(DP_ALIGN_UP(t[0].len, 64) + DP_ALIGN_UP(t[2].len, 64), 4096);
    CHECK(io < t[0].len + t[1].len + t[2].len);
    dp_unit *u = mk_ssd_unit(4096, io, dir, 0.5, 1);
    for (int i = 0; i < 3; i++) {
        char id[8];
        snprintf(id, sizeof id, "b%d", i);
        CHECK_EQ(put_spill(u, id, &t[i], NULL), DP_WIRE_COMMIT_DONE);
    }
    CHECK_EQ(dp_test_unit_stats(u).disk_blobs, 3);
    /* Stage 1 and 2 but do not pick them up (a resolve that stays pending). */
    dp_wire_str k1 = dp__wire_s("1@a"), k2 = dp__wire_s("2@a"), k3 = dp__wire_s("3@a");
    dp_unit_resolve_keys_res r;
    dp__unit_lock(u);
    CHECK_OK(dp__unit_resolve_keys_locked(u, &k1, 1, &r, NULL));
    CHECK_EQ(r.n_pending, 1);
    dp__unit_resolve_keys_res_fini(&r);
    CHECK_OK(dp__unit_resolve_keys_locked(u, &k2, 1, &r, NULL));
    CHECK_EQ(r.n_pending, 1);
    dp__unit_resolve_keys_res_fini(&r);
    dp__unit_unlock(u);
    wait_idle(u);
    CHECK_EQ(dp_test_unit_stats(u).staged_blobs, 2);
    /* Row 3 has to wait: the copies are kept pickup_s for their readers. */
    double t0 = dp_test_now();
    dp__unit_lock(u);
    CHECK_OK(dp__unit_resolve_keys_locked(u, &k3, 1, &r, NULL));
    dp__unit_unlock(u);
    CHECK_EQ(r.n_pending, 1);
    dp__unit_resolve_keys_res_fini(&r);
    if (dp_test_now() - t0 < 0.4) {
        CHECK_EQ(dp_test_unit_stats(u).staged_blobs, 2);
        CHECK_EQ(dp_test_unit_stats(u).evictions, 0);
    }
    /* Row 1 is picked up and pinned: never evicted while pinned. */
    dp__unit_lock(u);
    CHECK_OK(dp__unit_resolve_keys_locked(u, &k1, 1, &r, NULL));
    dp__unit_unlock(u);
    CHECK_EQ(r.n_entries, 1);
    char pin[33];
    memcpy(pin, r.pin_id, 33);
    uint64_t off1 = r.entries[0].off;
    dp__unit_resolve_keys_res_fini(&r);
    /* After pickup_s, row 3's stage evicts row 2 (the unpinned one), not row 1. */
    dp__sleep_s(0.55);
    CHECK_EQ(read_row(u, 3, 1), RD_OK);
    dp_unit_stats s = dp_test_unit_stats(u);
    CHECK_EQ(s.evictions, 1);
    uint8_t *want = malloc(row_len(1, 1));
    row_fill(1, 1, want, row_len(1, 1));
    CHECK(memcmp(dp__unit_slab(u) + off1, want, row_len(1, 1)) == 0);
    free(want);
    dp__unit_unpin(u, pin, strlen(pin));
    CHECK_EQ(read_row(u, 2, 1), RD_OK);
    CHECK_EQ(read_row(u, 1, 1), RD_OK);
    dp_test_unit_check(u);
    for (int i = 0; i < 3; i++)
        free(t[i].p);
    dp__unit_destroy(u);
    rm_dir(dir);
}

DP_TEST(abort_and_lease_in_io_area)
{
    char *dir = mk_dir();
    dp_unit *u = mk_ssd_unit(4096, 256 << 10, dir, 0.2, 1);
    uint64_t a = 0, b = 0, c = 0;
    CHECK_OK(dp__unit_alloc_spill(u, "a", 1, 64 << 10, 0, true, &a, NULL, NULL));
    CHECK(a >= dp__unit_io_base(u));
    /* a retried alloc gets the same region */
    CHECK_OK(dp__unit_alloc_spill(u, "a", 1, 64 << 10, 0, true, &b, NULL, NULL));
    CHECK_EQ(a, b);
    /* abort without a WRITE in flight frees; with, retires */
    dp__unit_abort(u, "a", 1, false);
    CHECK_OK(dp__unit_alloc_spill(u, "b", 1, 64 << 10, 0, true, &b, NULL, NULL));
    CHECK_EQ(b, a);
    dp__unit_abort(u, "b", 1, true);
    CHECK_EQ(dp_test_unit_stats(u).retired_bytes, 64 << 10);
    CHECK_OK(dp__unit_alloc_spill(u, "c", 1, 64 << 10, 0, true, &c, NULL, NULL));
    CHECK(c + (64 << 10) <= b || c >= b + (64 << 10));
    /* The rest of the area: one more fits, then UnitFull (nothing will free). */
    uint64_t d1;
    CHECK_OK(dp__unit_alloc_spill(u, "d", 1, 128 << 10, 0, true, &d1, NULL, NULL));
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_ERR_D(dp__unit_alloc_spill(u, "e", 1, 64 << 10, 0, true, &d1, NULL, &d),
                DP_EUNITFULL, &d);
    /* A bad blob committed in the IO area is a Protocol error, nothing spills. */
    dp_wire_commit_state st;
    memset(dp__unit_slab(u) + c, 0, 64 << 10);
    CHECK_ERR(dp__unit_commit(u, "c", 1, &st, NULL), DP_EPROTO);
    CHECK_EQ(dp_test_unit_stats(u).io_jobs, 0);
    /* A spill aborted while its job may run is never published. */
    uint64_t gs[1] = {5};
    tblob t = rows_blob(gs, 1, 1);
    dp__unit_abort(u, "c", 1, false);
    CHECK_OK(dp__unit_alloc_spill(u, "f", 1, t.len, t.n, true, &c, NULL, NULL));
    dp_test_write_blob(u, "f", c, t.p, t.len);
    CHECK_OK(dp__unit_commit(u, "f", 1, &st, NULL));
    dp__unit_abort(u, "f", 1, false);
    CHECK_OK(dp__unit_commit(u, "f", 1, &st, NULL));
    CHECK(st == DP_WIRE_COMMIT_LOST || st == DP_WIRE_COMMIT_DONE);
    wait_idle(u);
    dp_test_unit_check(u);
    dp__unit_destroy(u);
    free(t.p);
    rm_dir(dir);
}

DP_TEST(io_queue_limit_and_release_while_staging)
{
    char *dir = mk_dir();
    dp_unit_opts o;
    dp__unit_opts_init(&o);
    o.slab_bytes = 4096;
    o.numa = DP_UNIT_NUMA_OFF;
    o.ssd_dir = dir;
    o.staging_bytes = 16 << 20;
    o.pickup_s = 0;
    o.io_threads = 1;
    dp_unit *u = NULL;
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_OK_D(dp__unit_create(&o, &u, &d), &d);
    /* More commits than the queue holds, back to back: never more than 256 jobs. */
    enum { NB = 400 };
    tblob t[NB];
    uint64_t max_jobs = 0, n_spilled = 0;
    for (uint64_t i = 0; i < NB; i++) {
        uint64_t g = 1000 + i;
        t[i] = rows_blob(&g, 1, 1);
    }
    for (uint64_t i = 0; i < NB; i++) {
        char id[32];
        snprintf(id, sizeof id, "q%" PRIu64, i);
        uint64_t off;
        int rc;
        while ((rc = dp__unit_alloc_spill(u, id, strlen(id), t[i].len, t[i].n, true, &off,
                                          NULL, &d)) == DP_EBUSY)
            dp__sleep_s(0.0005);
        CHECK_OK_D(rc, &d);
        n_spilled += off >= dp__unit_io_base(u); /* a few fit the 4 KiB put area */
        dp_test_write_blob(u, id, off, t[i].p, t[i].len);
        dp_wire_commit_state st;
        CHECK_OK_D(dp__unit_commit(u, id, strlen(id), &st, &d), &d);
        CHECK(st == DP_WIRE_COMMIT_PENDING || st == DP_WIRE_COMMIT_DONE);
        max_jobs = DP_MAX(max_jobs, dp_test_unit_stats(u).io_jobs);
    }
    CHECK(max_jobs <= DP_UNIT_MAX_IO_JOBS);
    /* Commits polled until done (a commit refused a queue slot is queued later). */
    for (uint64_t i = 0; i < NB; i++) {
        char id[32];
        snprintf(id, sizeof id, "q%" PRIu64, i);
        dp_wire_commit_state st;
        double t0 = dp_test_now();
        do {
            CHECK_OK_D(dp__unit_commit(u, id, strlen(id), &st, &d), &d);
            if (st == DP_WIRE_COMMIT_PENDING)
                dp__sleep_s(0.0005);
        } while (st == DP_WIRE_COMMIT_PENDING && dp_test_now() - t0 < 30);
        CHECK_EQ(st, DP_WIRE_COMMIT_DONE);
        free(t[i].p);
    }
    printf("  %" PRIu64 " spills, at most %" PRIu64 " io jobs at once\n", n_spilled,
           max_jobs);
    CHECK_EQ(dp_test_unit_stats(u).spills, n_spilled);
    CHECK(n_spilled > DP_UNIT_MAX_IO_JOBS);
    dp_test_unit_check(u);
    /* Release rows while their stages may run: files close once the jobs end. */
    for (uint64_t i = 0; i < NB; i++) {
        char k[48];
        snprintf(k, sizeof k, "%" PRIu64 "@a", 1000 + i);
        dp_wire_str kk = dp__wire_s(k);
        dp_unit_resolve_keys_res r;
        dp__unit_lock(u);
        CHECK_OK(dp__unit_resolve_keys_locked(u, &kk, 1, &r, NULL));
        dp__unit_unlock(u);
        CHECK(r.n_pending == 1 || r.n_entries == 1);
        if (r.pin_id[0] != '\0')
            dp__unit_unpin(u, r.pin_id, strlen(r.pin_id));
        dp__unit_resolve_keys_res_fini(&r);
        uint64_t g = 1000 + i;
        CHECK_EQ(dp__unit_release_rows(u, &g, 1), 2);
    }
    wait_idle(u);
    dp_unit_stats s = dp_test_unit_stats(u);
    CHECK_EQ(s.files_open, 0);
    CHECK_EQ(s.disk_blobs, 0);
    CHECK_EQ(s.io_allocated_bytes, 0);
    dp_test_unit_check(u);
    dp__unit_destroy(u);
    rm_dir(dir);
}

DP_TEST(named_files_fallback_and_stale_names)
{
    char *dir = mk_dir();
    /* A name a unit killed between open and unlink would leave, and a user file. */
    char stale[4200], keep[4200];
    snprintf(stale, sizeof stale, "%s/dp-spill-0123456789abcdef0123456789abcdef", dir);
    snprintf(keep, sizeof keep, "%s/dp-spill-not-ours", dir);
    int fd = open(stale, O_CREAT | O_WRONLY, 0600);
    CHECK(fd >= 0);
    close(fd);
    fd = open(keep, O_CREAT | O_WRONLY, 0600);
    CHECK(fd >= 0);
    close(fd);
    dp_unit_opts o;
    dp__unit_opts_init(&o);
    o.slab_bytes = 4096;
    o.numa = DP_UNIT_NUMA_OFF;
    o.ssd_dir = dir;
    o.staging_bytes = 1 << 20;
    o.pickup_s = 0;
    o.ssd_no_tmpfile = true;
    dp_unit *u = NULL;
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_OK_D(dp__unit_create(&o, &u, &d), &d);
    CHECK(access(stale, F_OK) != 0);
    CHECK(access(keep, F_OK) == 0);
    CHECK(unlink(keep) == 0);
    /* Named files, unlinked at once: the directory stays empty. */
    for (uint64_t g = 0; g < 24; g++) {
        tblob t = rows_blob(&g, 1, 1);
        char id[32];
        snprintf(id, sizeof id, "n%" PRIu64, g);
        CHECK_EQ(put_spill(u, id, &t, NULL), DP_WIRE_COMMIT_DONE);
        free(t.p);
        CHECK_EQ(dir_count(dir), 0);
    }
    CHECK(dp_test_unit_stats(u).spills > 0);
    for (uint64_t g = 0; g < 24; g++)
        CHECK_EQ(read_row(u, g, 1), RD_OK);
    dp_test_unit_check(u);
    dp__unit_destroy(u);
    rm_dir(dir);
}

/*
 * One resolve_keys answers a staged copy and starts a stage that needs its
 * room: the answered copy is pinned at the end of the call, so the stage must
 * not evict it first (its offsets are in the reply).
 */
DP_TEST(one_resolve_never_evicts_what_it_answers)
{
    char *dir = mk_dir();
    uint64_t g2 = 2, g3 = 3;
    tblob t2 = rows_blob(&g2, 1, 1), t3 = rows_blob(&g3, 1, 1);
    uint64_t io = DP_ALIGN_UP(DP_MAX(t2.len, t3.len) + 64, 4096);
    CHECK(io < t2.len + t3.len);
    dp_unit *u = mk_ssd_unit(4096, io, dir, 0.0, 1);
    CHECK_EQ(put_spill(u, "two", &t2, NULL), DP_WIRE_COMMIT_DONE);
    CHECK_EQ(put_spill(u, "three", &t3, NULL), DP_WIRE_COMMIT_DONE);
    CHECK_EQ(read_row(u, 2, 1), RD_OK); /* staged, picked up, unpinned */
    CHECK_EQ(dp_test_unit_stats(u).staged_blobs, 1);
    dp_wire_str keys[2] = {dp__wire_s("2@a"), dp__wire_s("3@a")};
    dp_unit_resolve_keys_res r;
    dp__unit_lock(u);
    CHECK_OK(dp__unit_resolve_keys_locked(u, keys, 2, &r, NULL));
    dp__unit_unlock(u);
    CHECK_EQ(r.n_entries, 1);
    CHECK_EQ(r.n_pending, 1);
    CHECK_EQ(dp_test_unit_stats(u).evictions, 0);
    wait_idle(u);
    uint64_t la = row_len(2, 1);
    uint8_t *want = malloc(la);
    row_fill(2, 1, want, la);
    CHECK(memcmp(dp__unit_slab(u) + r.entries[0].off, want, la) == 0);
    free(want);
    dp__unit_unpin(u, r.pin_id, strlen(r.pin_id));
    dp__unit_resolve_keys_res_fini(&r);
    /* Unpinned now: row 3's stage may take the room. */
    CHECK_EQ(read_row(u, 3, 1), RD_OK);
    CHECK_EQ(read_row(u, 2, 1), RD_OK);
    dp_test_unit_check(u);
    free(t2.p);
    free(t3.p);
    dp__unit_destroy(u);
    rm_dir(dir);
}

/* ---- concurrent readers of one staged blob while writers force evictions ---- */

typedef struct reader_arg {
    dp_unit *u;
    int tid;
    int reads, errors;
    volatile int *stop;
} reader_arg;

static void *
reader_main(void *p)
{
    reader_arg *a = p;
    dp_wire_str k = dp__wire_s("7@a");
    uint64_t la = row_len(7, 1);
    uint8_t *want = malloc(la), *got = malloc(la);
    row_fill(7, 1, want, la);
    while (!__atomic_load_n(a->stop, __ATOMIC_ACQUIRE)) {
        dp_unit_resolve_keys_res r;
        dp__unit_lock(a->u);
        int rc = dp__unit_resolve_keys_locked(a->u, &k, 1, &r, NULL);
        dp__unit_unlock(a->u);
        if (rc != 0) {
            a->errors++;
            break;
        }
        if (r.n_entries == 1) {
            memcpy(got, dp__unit_slab(a->u) + r.entries[0].off, la);
            if (r.entries[0].len != la || memcmp(got, want, la) != 0)
                a->errors++;
            a->reads++;
            dp__unit_unpin(a->u, r.pin_id, strlen(r.pin_id));
        } else if (r.n_pending != 1) {
            a->errors++;
        }
        dp__unit_resolve_keys_res_fini(&r);
    }
    free(want);
    free(got);
    return NULL;
}

DP_TEST(concurrent_readers_of_a_staged_blob)
{
    char *dir = mk_dir();
    dp_unit *u = mk_ssd_unit(4096, 256 << 10, dir, 0.0, 1);
    uint64_t g7[1] = {7};
    tblob t = rows_blob(g7, 1, 1);
    CHECK_EQ(put_spill(u, "seven", &t, NULL), DP_WIRE_COMMIT_DONE);
    free(t.p);
    volatile int stop = 0;
    enum { NR = 6 };
    reader_arg ra[NR];
    pthread_t th[NR];
    for (int i = 0; i < NR; i++) {
        ra[i] = (reader_arg){u, i, 0, 0, &stop};
        CHECK(pthread_create(&th[i], NULL, reader_main, &ra[i]) == 0);
    }
    /* Writers: spills and reads of other rows need the IO area too. */
    for (uint64_t g = 100; g < 160; g++) {
        tblob w = rows_blob(&g, 1, 1);
        char id[32];
        snprintf(id, sizeof id, "w%" PRIu64, g);
        CHECK_EQ(put_spill(u, id, &w, NULL), DP_WIRE_COMMIT_DONE);
        free(w.p);
        CHECK_EQ(read_row(u, g, 1), RD_OK);
    }
    __atomic_store_n(&stop, 1, __ATOMIC_RELEASE);
    int reads = 0;
    for (int i = 0; i < NR; i++) {
        pthread_join(th[i], NULL);
        CHECK_EQ(ra[i].errors, 0);
        reads += ra[i].reads;
    }
    dp_unit_stats s = dp_test_unit_stats(u);
    printf("  %d concurrent reads of one staged blob, %" PRIu64 " stages, %" PRIu64
           " evictions\n",
           reads, s.stages, s.evictions);
    CHECK(reads > 0);
    dp_test_unit_check(u);
    dp__unit_destroy(u);
    rm_dir(dir);
}

/*
 * Invariant 1 over both areas, randomised: no region handed out by alloc
 * (or a staged copy a resolve answers) overlaps a region some client may
 * still WRITE (uncommitted, or aborted in flight) or READ (pinned).
 */
typedef struct live {
    uint64_t off, len;
    int kind; /* 1 write, 2 read (pin), 3 retired (for good) */
    char id[33];
    uint64_t g;
} live;

static void
no_overlap(const live *lv, int n, uint64_t off, uint64_t len, const char *what)
{
    for (int i = 0; i < n; i++)
        CHECKF(off + len <= lv[i].off || off >= lv[i].off + lv[i].len,
               "%s [%" PRIu64 ", +%" PRIu64 ") overlaps a live %s [%" PRIu64 ", +%" PRIu64
               ")",
               what, off, len,
               lv[i].kind == 1   ? "write"
               : lv[i].kind == 2 ? "read"
                                 : "retired region",
               lv[i].off, lv[i].len);
}

DP_TEST(model_no_reuse_across_areas)
{
    uint64_t seed = dp_test_seed();
    uint64_t rs = seed;
    char *dir = mk_dir();
    dp_unit *u = mk_ssd_unit(128 << 10, 192 << 10, dir, 0.0, 1);
    enum { MAXL = 256 };
    live lv[MAXL];
    int nl = 0;
    uint32_t ver[32] = {0};
    int steps = 2000;
    /*
     * What the run exercised, asserted at the end: allocations in each area
     * checked against live WRITEs and READs, reads (pins) of rows in each
     * area, transfers ended, commits, retirements.
     */
    struct {
        int allocs[2], vs_write, vs_read, vs_retired, reads[2], ended, commits, retired;
    } ran = {{0}, 0, 0, 0, {0}, 0, 0, 0};
    for (int step = 0; step < steps; step++) {
        uint64_t op = dp_test_rand(&rs) % 10;
        uint64_t g = dp_test_rand(&rs) % 32;
        if (op < 4 && nl < MAXL - 4) { /* alloc (+ maybe WRITE and commit) */
            uint32_t v = ver[g] + 1;
            tblob t = rows_blob(&g, 1, v);
            char id[33];
            snprintf(id, sizeof id, "m%d", step);
            uint64_t off;
            int rc = dp__unit_alloc_spill(u, id, strlen(id), t.len, t.n, true, &off, NULL,
                                          NULL);
            if (rc == 0) {
                ran.allocs[off >= dp__unit_io_base(u)]++;
                bool vs[4] = {false, false, false, false};
                for (int i = 0; i < nl; i++)
                    vs[lv[i].kind] = true;
                ran.vs_write += vs[1];
                ran.vs_read += vs[2];
                ran.vs_retired += vs[3];
                no_overlap(lv, nl, off, t.len, "alloc");
                dp_test_write_blob(u, id, off, t.p, t.len);
                /*
                 * A quarter left uncommitted, one in 16 retired (at most 8: a
                 * retired region never comes back, more would fill the areas
                 * for the rest of the run), the rest committed.
                 */
                uint64_t what = dp_test_rand(&rs) % 16;
                if (what < 4) { /* left uncommitted: a WRITE may still run */
                    lv[nl++] = (live){off, t.len, 1, "", 0};
                    snprintf(lv[nl - 1].id, 33, "%s", id);
                } else if (what == 4 && ran.retired < 8) {
                    dp__unit_abort(u, id, strlen(id), true); /* retired for good */
                    lv[nl++] = (live){off, t.len, 3, "", 0};
                    snprintf(lv[nl - 1].id, 33, "retired-%s", id);
                    ran.retired++;
                } else {
                    dp_wire_commit_state st;
                    do {
                        CHECK_OK(dp__unit_commit(u, id, strlen(id), &st, NULL));
                        if (st == DP_WIRE_COMMIT_PENDING)
                            dp__sleep_s(0.0002);
                    } while (st == DP_WIRE_COMMIT_PENDING);
                    CHECK_EQ(st, DP_WIRE_COMMIT_DONE);
                    ver[g] = v;
                    ran.commits++;
                }
            } else {
                CHECK(rc == DP_EBUSY || rc == DP_EUNITFULL);
            }
            free(t.p);
        } else if (op < 7 && nl < MAXL - 4) { /* resolve and keep the pin */
            char k[48];
            snprintf(k, sizeof k, "%" PRIu64 "@a", g);
            dp_wire_str kk = dp__wire_s(k);
            dp_unit_resolve_keys_res r;
            /*
             * A row on disk answers pending while it is staged: ask again, as a
             * client does, so that READs of the IO area are modelled too; not
             * when no stage runs (the IO area is held by live transfers).
             */
            for (double t0 = dp_test_now();;) {
                dp__unit_lock(u);
                CHECK_OK(dp__unit_resolve_keys_locked(u, &kk, 1, &r, NULL));
                dp__unit_unlock(u);
                if (r.n_pending == 0 || dp_test_unit_stats(u).io_jobs == 0)
                    break;
                dp__unit_resolve_keys_res_fini(&r);
                CHECKF(dp_test_now() - t0 < 30, "row %" PRIu64 " pending for 30 s", g);
                dp__sleep_s(0.0002);
            }
            if (r.n_entries == 1) {
                ran.reads[r.entries[0].off >= dp__unit_io_base(u)]++;
                /* overlap with its own blob's other pins is fine: same bytes */
                uint8_t *want = malloc(r.entries[0].len);
                row_fill(g, ver[g], want, r.entries[0].len);
                CHECKF(memcmp(dp__unit_slab(u) + r.entries[0].off, want,
                              r.entries[0].len) == 0,
                       "row %" PRIu64 " v%u: wrong bytes", g, ver[g]);
                free(want);
                for (int i = 0; i < nl; i++)
                    if (lv[i].kind != 2)
                        no_overlap(&lv[i], 1, r.entries[0].off, r.entries[0].len,
                                   "resolve");
                lv[nl++] = (live){r.entries[0].off, r.entries[0].len, 2, "", g};
                memcpy(lv[nl - 1].id, r.pin_id, 33);
            }
            dp__unit_resolve_keys_res_fini(&r);
        } else if (op < 9 && nl > 0) { /* end a transfer */
            int i = (int)(dp_test_rand(&rs) % (uint64_t)nl);
            if (lv[i].kind == 3)
                continue; /* retired: never ends */
            ran.ended++;
            if (lv[i].kind == 1)
                dp__unit_abort(u, lv[i].id, strlen(lv[i].id), false);
            else
                dp__unit_unpin(u, lv[i].id, strlen(lv[i].id));
            /* other pins with the same id end too */
            char id[33];
            memcpy(id, lv[i].id, 33);
            int w = 0;
            for (int j = 0; j < nl; j++)
                if (strcmp(lv[j].id, id) != 0)
                    lv[w++] = lv[j];
            nl = w;
        } else { /* clear a row */
            dp__unit_release_rows(u, &g, 1);
            ver[g] = 0;
        }
        if (step % 50 == 0)
            dp_test_unit_check(u);
    }
    for (int i = 0; i < nl; i++)
        if (lv[i].kind == 2)
            dp__unit_unpin(u, lv[i].id, strlen(lv[i].id));
    wait_idle(u);
    dp_test_unit_check(u);
    dp_unit_stats s = dp_test_unit_stats(u);
    printf("  seed %" PRIu64 ": %" PRIu64 " spills, %" PRIu64 " stages, %" PRIu64
           " evictions, %" PRIu64
           " busy; allocs %d + %d (put area + IO area), %d, %d and "
           "%d checked against live WRITEs, READs and retired regions, reads %d + %d, %d "
           "ended, %d commits, %d retired\n",
           seed, s.spills, s.stages, s.evictions, s.n_busy, ran.allocs[0], ran.allocs[1],
           ran.vs_write, ran.vs_read, ran.vs_retired, ran.reads[0], ran.reads[1],
           ran.ended, ran.commits, ran.retired);
    /*
     * Both areas were used, for WRITEs and READs, and every allocation was
     * checked against live WRITEs, READs and retired regions (at about half
     * the least of 200 seeds).
     */
    EXPECT_GE(ran.allocs[0], 60);
    EXPECT_GE(ran.allocs[1], 60);
    EXPECT_GE(ran.vs_write, 150);
    EXPECT_GE(ran.vs_read, 150);
    EXPECT_GE(ran.vs_retired, 150);
    EXPECT_GE(ran.reads[0], 40);
    EXPECT_GE(ran.reads[1], 15);
    EXPECT_GE(ran.ended, 100);
    EXPECT_GE(ran.commits, 100);
    EXPECT_GE(ran.retired, 4);
    EXPECT_GE(s.spills, 30);
    EXPECT_GE(s.stages, 10);
    dp__unit_destroy(u);
    rm_dir(dir);
}

/* ---- a unit in another process, over real ZMQ and UCX ---- */

/*
 * The peer is this program re-executed with DP_TEST_SSD_PEER=unit: a unit
 * with an endpoint, ticker, SSD tier in DP_TEST_SSD_DIR and a control server;
 * it writes its address to DP_TEST_SSD_FD and runs until killed. With
 * DP_TEST_SSD_FSIZE, its files are limited to that many bytes (SIGXFSZ
 * ignored): a disk that fills up.
 */
static int
peer_unit(int fd)
{
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    dp_detail d;
    dp_detail_clear(&d);
    dp_unit_opts o;
    dp__unit_opts_init(&o);
    o.slab_bytes = 1 << 20;
    o.read_pin_s = 10;
    o.quarantine_s = 0.1;
    o.numa = DP_UNIT_NUMA_OFF;
    o.ssd_dir = getenv("DP_TEST_SSD_DIR");
    o.staging_bytes = 1 << 20;
    o.pickup_s = 0.2;
    dp_unit_server *srv = NULL;
    if (dp__unit_server_open(&o, "ssd-unit", "127.0.0.1", 0, 0.1, &srv, &d) != 0)
        goto fail;
    /*
     * The size limit comes last: UCX's shared-memory transport sizes its own
     * files with ftruncate, which the limit would refuse too.
     */
    const char *fs = getenv("DP_TEST_SSD_FSIZE");
    if (fs != NULL) {
        signal(SIGXFSZ, SIG_IGN);
        struct rlimit lim;
        getrlimit(RLIMIT_FSIZE, &lim);
        lim.rlim_cur = strtoull(fs, NULL, 10);
        setrlimit(RLIMIT_FSIZE, &lim);
    }
    char line[300];
    snprintf(line, sizeof line, "%s\n", dp__unit_server_address(srv));
    dp_test_write_str(fd, line);
    int sig;
    sigwait(&sigs, &sig);
    dp__unit_server_close(srv);
    return 0;
fail:
    fprintf(stderr, "ssd unit peer: %s\n", dp_detail_msg(&d));
    return 1;
}

__attribute__((constructor)) static void
peer_main(void)
{
    const char *mode = getenv("DP_TEST_SSD_PEER");
    if (mode == NULL)
        return;
    _exit(peer_unit(atoi(getenv("DP_TEST_SSD_FD"))));
}

typedef struct peer {
    pid_t pid;
    char addr[300];
} peer;

static void
peer_start(peer *p, const char *dir, const char *fsize)
{
    int fds[2];
    CHECK(pipe2(fds, O_CLOEXEC) == 0);
    char fdbuf[16];
    snprintf(fdbuf, sizeof fdbuf, "%d", fds[1]);
    const char *env[] = {"DP_TEST_SSD_PEER",
                         "unit",
                         "DP_TEST_SSD_FD",
                         fdbuf,
                         "DP_TEST_SSD_DIR",
                         dir,
                         fsize != NULL ? "DP_TEST_SSD_FSIZE" : NULL,
                         fsize,
                         NULL};
    p->pid = dp_test_spawn_self(env, fds[1]);
    close(fds[1]);
    size_t n = dp_test_read_line(fds[0], p->addr, sizeof p->addr, 30);
    close(fds[0]);
    CHECKF(n > 0, "the unit peer reported nothing");
}

static int
peer_stop(peer *p, int sig)
{
    return dp_test_kill_wait(p->pid, sig);
}

typedef struct zc {
    dp_ctl_client *c;
    const char *addr;
    dp_wire_rid_gen rid;
    dp_endpoint *ep;
    char name[256];
    uint64_t base;
    dp_buf rb;
} zc;

static int
zcall(zc *z, dp_wire_request *q, dp_wire_reply *rep, dp_detail *d)
{
    char rid[DP_WIRE_RID_MAX];
    q->rid = dp__wire_rid_next(&z->rid, rid);
    dp_buf req = {0};
    CHECK_OK_D(dp__wire_request_encode(q, NULL, &req, d), d);
    dp__buf_reset(&z->rb);
    int rc = dp__ctl_call(z->c, z->addr, req.data, req.len, rid, 10.0, &z->rb, d);
    dp__buf_fini(&req);
    if (rc != 0)
        return rc;
    return dp__wire_reply_decode(z->rb.data, z->rb.len, q->op, NULL, rep, d);
}

static void
zc_open(zc *z, const char *addr)
{
    memset(z, 0, sizeof *z);
    z->addr = addr;
    CHECK_OK(dp__wire_rid_gen_init(&z->rid, NULL));
    CHECK_OK(dp__ctl_client_create(&z->c, NULL));
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_OK_D(dp__endpoint_create("ssd-client", NULL, &z->ep, &d), &d);
    dp_wire_request q;
    memset(&q, 0, sizeof q);
    q.op = DP_WIRE_OP_INFO;
    dp_wire_reply r;
    CHECK_OK_D(zcall(z, &q, &r, &d), &d);
    CHECK(r.ok);
    CHECK_EQ(r.r.info.slab_bytes, 1 << 20);
    CHECK_EQ(r.r.info.io_bytes, 1 << 20);
    CHECK_OK_D(dp__endpoint_add_remote(z->ep, r.r.info.metadata.p, r.r.info.metadata.n,
                                       z->name, &d),
               &d);
    z->base = r.r.info.slab_addr;
    dp__wire_reply_fini(&r);
}

static void
zc_close(zc *z)
{
    dp__buf_fini(&z->rb);
    dp__endpoint_destroy(z->ep);
    dp__ctl_client_destroy(z->c);
}

/* alloc(spill) (Busy retried), WRITE over UCX, commit polled. */
static dp_wire_commit_state
zput(zc *z, const char *id, const tblob *t)
{
    dp_detail d;
    dp_detail_clear(&d);
    void *buf = NULL;
    CHECK_OK_D(dp__endpoint_alloc(z->ep, t->len, &buf, &d), &d);
    memcpy(buf, t->p, t->len);
    dp_wire_request q;
    dp_wire_reply r;
    memset(&q, 0, sizeof q);
    uint64_t off = 0;
    double t0 = dp_test_now();
    for (;;) {
        q.op = DP_WIRE_OP_ALLOC;
        q.a.alloc = (dp_wire_alloc_args){dp__wire_s(id), t->len, t->n, true};
        CHECK_OK_D(zcall(z, &q, &r, &d), &d);
        if (r.ok) {
            off = r.r.alloc.off;
            dp__blob_header_set_alloc(buf, r.incarnation, r.r.alloc.token);
            dp__wire_reply_fini(&r);
            break;
        }
        CHECKF(dp__wire_str_eq(r.err.kind, "Busy") && dp_test_now() - t0 < 30,
               "%.*s: %.*s", DP_WIRE_STR_ARG(r.err.kind), DP_WIRE_STR_ARG(r.err.msg));
        dp__wire_reply_fini(&r);
        dp__sleep_s(0.002);
    }
    dp_range l = {(uint64_t)(uintptr_t)buf, t->len};
    dp_range rr = {z->base + off, t->len};
    CHECK_OK_D(
        dp__endpoint_transfer(z->ep, DP_XFER_WRITE, &l, 1, &rr, 1, z->name, 10, &d), &d);
    dp_wire_commit_state st;
    t0 = dp_test_now();
    for (;;) {
        q.op = DP_WIRE_OP_COMMIT;
        q.a.commit.blob_id = dp__wire_s(id);
        CHECK_OK_D(zcall(z, &q, &r, &d), &d);
        CHECK(r.ok);
        st = r.r.commit;
        dp__wire_reply_fini(&r);
        if (st != DP_WIRE_COMMIT_PENDING || dp_test_now() - t0 > 30)
            break;
        dp__sleep_s(0.001);
    }
    dp__endpoint_deregister(z->ep, buf, NULL);
    return st;
}

/* resolve_keys g@a: pending -> again -> READ over UCX, bytes checked, unpin. */
static int
zread(zc *z, uint64_t g, uint32_t v)
{
    char ka[48];
    snprintf(ka, sizeof ka, "%" PRIu64 "@a", g);
    dp_wire_str k = dp__wire_s(ka);
    dp_detail d;
    dp_detail_clear(&d);
    dp_wire_request q;
    dp_wire_reply r;
    memset(&q, 0, sizeof q);
    double t0 = dp_test_now();
    for (;;) {
        q.op = DP_WIRE_OP_RESOLVE_KEYS;
        q.a.resolve_keys.keys = (dp_wire_strs){&k, 1};
        CHECK_OK_D(zcall(z, &q, &r, &d), &d);
        CHECK(r.ok);
        dp_wire_resolve_keys_res *x = &r.r.resolve_keys;
        if (x->pending.n > 0) {
            dp__wire_reply_fini(&r);
            CHECKF(dp_test_now() - t0 < 30, "row %" PRIu64 " pending for 30 s", g);
            dp__sleep_s(0.001);
            continue;
        }
        if (x->failed.n > 0 || x->missing.n > 0) {
            int out = x->failed.n > 0 ? RD_FAILED : RD_MISSING;
            dp__wire_reply_fini(&r);
            return out;
        }
        CHECK_EQ(x->entries.n, 1);
        uint64_t la = row_len(g, v);
        CHECK_EQ_U64(x->entries.v[0].len, la);
        void *dst = NULL;
        CHECK_OK_D(dp__endpoint_alloc(z->ep, la, &dst, &d), &d);
        dp_range l = {(uint64_t)(uintptr_t)dst, la};
        dp_range rr = {z->base + x->entries.v[0].off, la};
        CHECK_OK_D(
            dp__endpoint_transfer(z->ep, DP_XFER_READ, &l, 1, &rr, 1, z->name, 10, &d),
            &d);
        uint8_t *want = malloc(la);
        row_fill(g, v, want, la);
        CHECKF(memcmp(dst, want, la) == 0, "row %" PRIu64 ": wrong bytes over UCX", g);
        free(want);
        dp__endpoint_deregister(z->ep, dst, NULL);
        char pin[64];
        dp__wire_str_copy(x->pin_id, pin, sizeof pin);
        dp__wire_reply_fini(&r);
        q.op = DP_WIRE_OP_UNPIN;
        q.a.unpin.pin_id = dp__wire_s(pin);
        char rid[DP_WIRE_RID_MAX];
        q.rid = dp__wire_rid_next(&z->rid, rid);
        dp_buf req = {0};
        CHECK_OK(dp__wire_request_encode(&q, NULL, &req, NULL));
        CHECK_OK(dp__ctl_notify(z->c, z->addr, req.data, req.len, NULL));
        dp__buf_fini(&req);
        return RD_OK;
    }
}

static uint64_t
zstat(zc *z, const char *name)
{
    dp_wire_request q;
    memset(&q, 0, sizeof q);
    q.op = DP_WIRE_OP_STATS;
    dp_wire_reply r;
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_OK_D(zcall(z, &q, &r, &d), &d);
    CHECK(r.ok);
    uint64_t v = 0;
    CHECKF(dp__wire_fields_u64(&r.r.stats, name, &v), "stat %s", name);
    dp__wire_reply_fini(&r);
    return v;
}

DP_TEST(zmq_ucx_spill_stage_and_sigkill)
{
    char *dir = mk_dir();
    peer up;
    peer_start(&up, dir, NULL);
    zc z;
    zc_open(&z, up.addr);
    enum { ROWS = 120, PER = 3 };
    for (uint32_t b = 0; b < ROWS / PER; b++) {
        uint64_t g[PER] = {b * PER, b * PER + 1, b * PER + 2};
        tblob t = rows_blob(g, PER, 1);
        char id[32];
        snprintf(id, sizeof id, "z%u", b);
        CHECK_EQ(zput(&z, id, &t), DP_WIRE_COMMIT_DONE);
        free(t.p);
    }
    uint64_t spills = zstat(&z, "spills");
    printf("  %u rows over UCX, %" PRIu64 " blobs spilled\n", ROWS, spills);
    CHECK(spills > 0);
    for (uint64_t g = 0; g < ROWS; g++)
        CHECK_EQ(zread(&z, g, 1), RD_OK);
    CHECK(zstat(&z, "stages") > 0);
    CHECK_EQ(dir_count(dir), 0);
    /* The unit dies with its files open: nothing is left in ssd_dir. */
    CHECK(zstat(&z, "files_open") > 0);
    CHECK_EQ(peer_stop(&up, SIGKILL), -SIGKILL);
    CHECK_EQ(dir_count(dir), 0);
    zc_close(&z);
    rm_dir(dir);
}

DP_TEST(zmq_ucx_full_disk_is_lost)
{
    char *dir = mk_dir();
    peer up;
    peer_start(&up, dir, "40000");
    zc z;
    zc_open(&z, up.addr);
    /* Fill the put area (spill off), then puts spill into a 40000-byte limit. */
    int lost = 0, done = 0;
    for (uint32_t b = 0; b < 40; b++) {
        uint64_t g[2] = {2 * b, 2 * b + 1};
        tblob t = rows_blob(g, 2, 1);
        char id[32];
        snprintf(id, sizeof id, "f%u", b);
        dp_wire_commit_state st = zput(&z, id, &t);
        CHECK(st == DP_WIRE_COMMIT_DONE || st == DP_WIRE_COMMIT_LOST);
        if (st == DP_WIRE_COMMIT_LOST) {
            lost++;
            CHECK(t.len > 40000);
            CHECK_EQ(zread(&z, g[0], 1), RD_MISSING);
        } else {
            done++;
            CHECK_EQ(zread(&z, g[0], 1), RD_OK);
            CHECK_EQ(zread(&z, g[1], 1), RD_OK);
        }
        free(t.p);
    }
    printf("  %d puts done, %d lost to the file size limit\n", done, lost);
    CHECK(lost > 0);
    CHECK_EQ(zstat(&z, "spills_failed"), (uint64_t)lost);
    CHECK_EQ(peer_stop(&up, SIGTERM), 0);
    CHECK_EQ(dir_count(dir), 0);
    zc_close(&z);
    rm_dir(dir);
}

/* ---- the `dataplane unit` flags, through the real binary ---- */

DP_TEST(cli_ssd_flags)
{
    const char *cli = dp_test_cli_path();
    if (cli == NULL)
        DP_SKIP("the dataplane binary is not built next to this test");
    char *dir = mk_dir();
    char line[300];
    const char *bad[] = {cli, "unit", "--staging", "8M", NULL};
    CHECK_EQ(dp_test_wait_status(dp_test_cli_start(bad, line, sizeof line)), 2);
    const char *bad2[] = {cli, "unit", "--ssd-dir", dir, "--staging", "12", NULL};
    CHECK_EQ(dp_test_wait_status(dp_test_cli_start(bad2, line, sizeof line)), 2);
    const char *bad3[] = {cli, "unit", "--ssd-dir", dir, "--pickup-s", "-1", NULL};
    CHECK_EQ(dp_test_wait_status(dp_test_cli_start(bad3, line, sizeof line)), 2);
    const char *nodir[] = {cli, "unit", "--ssd-dir", "/nonexistent/dp", NULL};
    CHECK_EQ(dp_test_wait_status(dp_test_cli_start(nodir, line, sizeof line)), 1);
    const char *args[] = {cli,         "unit", "--slab",     "4M", "--ssd-dir", dir,
                          "--staging", "2M",   "--pickup-s", "3",  NULL};
    pid_t pid = dp_test_cli_start(args, line, sizeof line);
    CHECKF(strncmp(line, "tcp://127.0.0.1:", 16) == 0, "first line '%s'", line);
    zc z;
    memset(&z, 0, sizeof z);
    z.addr = line;
    CHECK_OK(dp__wire_rid_gen_init(&z.rid, NULL));
    CHECK_OK(dp__ctl_client_create(&z.c, NULL));
    dp_wire_request q;
    memset(&q, 0, sizeof q);
    q.op = DP_WIRE_OP_INFO;
    dp_wire_reply r;
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_OK_D(zcall(&z, &q, &r, &d), &d);
    CHECK(r.ok);
    CHECK_EQ(r.r.info.slab_bytes, 4 << 20);
    CHECK_EQ(r.r.info.io_bytes, 2 << 20);
    dp__wire_reply_fini(&r);
    CHECK_EQ(zstat(&z, "io_bytes"), 2 << 20);
    dp__buf_fini(&z.rb);
    dp__ctl_client_destroy(z.c);
    kill(pid, SIGKILL);
    CHECK_EQ(dp_test_wait_status(pid), -SIGKILL);
    CHECK_EQ(dir_count(dir), 0);
    rm_dir(dir);
}

/*
 * Commit order decides, not the order io jobs finish: a spill committed before
 * a newer put of the same row, and before a release of another of its rows,
 * must not bring back its older value or the released row when its job ends.
 */
DP_TEST(late_spill_never_overrides_later_commits_or_releases)
{
    char *dir = mk_dir();
    dp_unit *u = mk_ssd_unit(64 << 10, 256 << 20, dir, 10, 1);
    enum { N = 4000 };
    uint64_t *g1 = malloc(N * sizeof *g1);
    for (uint64_t i = 0; i < N; i++)
        g1[i] = i;
    tblob t1 = rows_blob(g1, N, 1); /* far larger than the put area: spills */
    uint64_t g2[1] = {0};
    tblob t2 = rows_blob(g2, 1, 2); /* fits the put area */
    dp_detail d;
    dp_detail_clear(&d);
    uint64_t off = 0;
    dp_wire_commit_state st;
    CHECK_OK_D(dp__unit_alloc_spill(u, "x1", 2, t1.len, t1.n, true, &off, NULL, &d), &d);
    CHECK(off >= dp__unit_io_base(u));
    dp_test_write_blob(u, "x1", off, t1.p, t1.len);
    CHECK_OK_D(dp__unit_commit(u, "x1", 2, &st, &d), &d);
    CHECK_EQ(st, DP_WIRE_COMMIT_PENDING);
    /* Row 0 again, committed after x1; then row 5 released. */
    CHECK_OK_D(dp__unit_alloc_spill(u, "x2", 2, t2.len, t2.n, false, &off, NULL, &d), &d);
    dp_test_write_blob(u, "x2", off, t2.p, t2.len);
    CHECK_OK_D(dp__unit_commit(u, "x2", 2, &st, &d), &d);
    CHECK_EQ(st, DP_WIRE_COMMIT_DONE);
    uint64_t rel = 5;
    dp__unit_release_rows(u, &rel, 1);
    wait_idle(u);
    CHECK_OK_D(dp__unit_commit(u, "x1", 2, &st, &d), &d);
    CHECK_EQ(st, DP_WIRE_COMMIT_DONE);
    CHECK_EQ(read_row(u, 0, 2), RD_OK);      /* the newer put stays */
    CHECK_EQ(read_row(u, 5, 1), RD_MISSING); /* the release stays */
    CHECK_EQ(read_row(u, 3, 1), RD_OK);      /* the spill's other rows landed */
    dp_test_unit_check(u);
    free(t1.p);
    free(t2.p);
    free(g1);
    dp__unit_destroy(u);
    rm_dir(dir);
}

/* The io thread reads the clock while the test moves it. */
static _Atomic double lease_clock = 1000;
static double
lease_now(void *ctx)
{
    (void)ctx;
    return atomic_load(&lease_clock);
}

/*
 * Spills whose commit validated while the io queue was full wait for a slot:
 * the ticker queues them, and the lease never retires them (their WRITE is
 * done), even when the client stopped asking.
 */
DP_TEST(validated_spills_waiting_for_the_queue_are_never_retired)
{
    char *dir = mk_dir();
    dp_unit_opts o;
    dp__unit_opts_init(&o);
    o.slab_bytes = 64 << 10;
    o.alloc_lease_s = 60;
    o.quarantine_s = 0.05;
    o.numa = DP_UNIT_NUMA_OFF;
    o.ssd_dir = dir;
    o.staging_bytes = 256 << 20;
    o.io_threads = 1;
    o.now = lease_now;
    dp_unit *u = NULL;
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_OK_D(dp__unit_create(&o, &u, &d), &d);
    enum { M = 300 }; /* more than the 256 io jobs */
    char id[32];
    uint64_t off;
    dp_wire_commit_state st;
    /* Rows of their own per spill: none supersedes another. */
    for (int i = 0; i < M; i++) {
        uint64_t gs[8];
        for (int k = 0; k < 8; k++)
            gs[k] = (uint64_t)i * 8 + (uint64_t)k; /* > the 64 KiB put area */
        tblob small = rows_blob(gs, 8, 1);
        snprintf(id, sizeof id, "s%d", i);
        CHECK_OK_D(dp__unit_alloc_spill(u, id, strlen(id), small.len, small.n, true, &off,
                                        NULL, &d),
                   &d);
        CHECK(off >= dp__unit_io_base(u));
        dp_test_write_blob(u, id, off, small.p, small.len);
        free(small.p);
    }
    for (int i = 0; i < M; i++) {
        snprintf(id, sizeof id, "s%d", i);
        CHECK_OK_D(dp__unit_commit(u, id, strlen(id), &st, &d), &d);
    }
    /* The client stops asking; the lease passes; the ticker runs. */
    atomic_store(&lease_clock, atomic_load(&lease_clock) + 61);
    for (int round = 0; round < 100 && dp_test_unit_stats(u).spills < M; round++) {
        dp__unit_tick(u);
        wait_idle(u);
    }
    dp_unit_stats s = dp_test_unit_stats(u);
    CHECK_EQ(s.leases_expired, 0);
    CHECK_EQ(s.retired_bytes, 0);
    CHECK_EQ(s.spills, M);
    for (int i = 0; i < M; i++) {
        snprintf(id, sizeof id, "s%d", i);
        CHECK_OK_D(dp__unit_commit(u, id, strlen(id), &st, &d), &d);
        CHECK_EQ(st, DP_WIRE_COMMIT_DONE);
    }
    CHECK_EQ(read_row(u, 4, 1), RD_OK);
    CHECK_EQ(read_row(u, 8 * M - 1, 1), RD_OK);
    dp_test_unit_check(u);
    dp__unit_destroy(u);
    rm_dir(dir);
}

/*
 * Commit a big spill of rows [g0, g0 + 4000) as id and clear its rows at once,
 * while its io job writes the file (tens of ms). True if the job then found
 * nothing left to publish (superseded); false if it won the race.
 */
static bool
spill_then_clear(dp_unit *u, const char *id, uint64_t g0)
{
    enum { N = 4000 };
    uint64_t *g = malloc(N * sizeof *g);
    CHECK(g != NULL);
    for (uint64_t i = 0; i < N; i++)
        g[i] = g0 + i;
    tblob t = rows_blob(g, N, 1);
    dp_detail d;
    dp_detail_clear(&d);
    uint64_t off;
    dp_wire_commit_state st;
    uint64_t before = dp_test_unit_stats(u).spills_superseded;
    CHECK_OK_D(dp__unit_alloc_spill(u, id, strlen(id), t.len, t.n, true, &off, NULL, &d),
               &d);
    dp_test_write_blob(u, id, off, t.p, t.len);
    CHECK_OK_D(dp__unit_commit(u, id, strlen(id), &st, &d), &d);
    CHECK_EQ(st, DP_WIRE_COMMIT_PENDING);
    dp__unit_release_rows(u, g, N);
    wait_idle(u);
    free(t.p);
    free(g);
    return dp_test_unit_stats(u).spills_superseded == before + 1;
}

/*
 * A spill whose rows were all cleared (or overwritten) before its io job
 * ended publishes nothing, and its commit answers "done" (it landed and was
 * replaced), not "lost", for as long as a client may still ask (the lease,
 * 60 s here); then the id is forgotten. An id allocated again names the new
 * blob.
 */
DP_TEST(superseded_spill_commit_answers_done)
{
    char *dir = mk_dir();
    dp_unit_opts o;
    dp__unit_opts_init(&o);
    o.slab_bytes = 64 << 10;
    o.alloc_lease_s = 60;
    o.numa = DP_UNIT_NUMA_OFF;
    o.ssd_dir = dir;
    o.staging_bytes = 256 << 20;
    o.io_threads = 1;
    o.now = lease_now;
    dp_unit *u = NULL;
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_OK_D(dp__unit_create(&o, &u, &d), &d);
    dp_wire_commit_state st;
    char id[32] = "";
    bool sup = false;
    for (int a = 0; a < 3 && !sup; a++) { /* the io job may win the race: try again */
        snprintf(id, sizeof id, "x%d", a);
        sup = spill_then_clear(u, id, (uint64_t)a * 10000);
    }
    CHECK(sup);
    CHECK_EQ(dp_test_unit_stats(u).entries, 0); /* the clears stand */
    CHECK_OK_D(dp__unit_commit(u, id, strlen(id), &st, &d), &d);
    CHECK_EQ(st, DP_WIRE_COMMIT_DONE);
    CHECK_OK_D(dp__unit_commit(u, "never", 5, &st, &d), &d);
    CHECK_EQ(st, DP_WIRE_COMMIT_LOST);
    atomic_store(&lease_clock, atomic_load(&lease_clock) + 30);
    dp__unit_tick(u);
    CHECK_OK_D(dp__unit_commit(u, id, strlen(id), &st, &d), &d);
    CHECK_EQ(st, DP_WIRE_COMMIT_DONE);
    atomic_store(&lease_clock, atomic_load(&lease_clock) + 31);
    dp__unit_tick(u);
    CHECK_OK_D(dp__unit_commit(u, id, strlen(id), &st, &d), &d);
    CHECK_EQ(st, DP_WIRE_COMMIT_LOST);

    /* The id allocated again names the new (unwritten) blob, not the old spill. */
    sup = false;
    for (int a = 0; a < 3 && !sup; a++) {
        snprintf(id, sizeof id, "y%d", a);
        sup = spill_then_clear(u, id, 100000 + (uint64_t)a * 10000);
    }
    CHECK(sup);
    uint64_t off;
    CHECK_OK_D(dp__unit_alloc_spill(u, id, strlen(id), 4096, 1, false, &off, NULL, &d),
               &d);
    memset(dp__unit_slab(u) + off, 0, 4096);
    CHECK_ERR(dp__unit_commit(u, id, strlen(id), &st, &d), DP_EPROTO);
    dp__unit_abort(u, id, strlen(id), false);
    CHECK_OK_D(dp__unit_commit(u, id, strlen(id), &st, &d), &d);
    CHECK_EQ(st, DP_WIRE_COMMIT_LOST);
    dp_test_unit_check(u);
    dp__unit_destroy(u);
    rm_dir(dir);
}

/* A checkpoint path naming a FIFO is refused at once, never blocks the unit. */
DP_TEST(load_refuses_a_fifo)
{
    char *dir = mk_dir();
    dp_unit *u = mk_ssd_unit(1 << 20, 1 << 20, dir, 10, 1);
    char p[256], pr[300];
    snprintf(p, sizeof p, "%s/shard", dir);
    snprintf(pr, sizeof pr, "%s/shard.rows", dir);
    CHECK(mkfifo(p, 0600) == 0);
    CHECK(mkfifo(pr, 0600) == 0);
    dp_wire_shard_blob b = {dp__wire_s("b1"), 0, 64, 1};
    dp_unit_load_res res;
    dp_detail d;
    dp_detail_clear(&d);
    double t0 = dp_test_now();
    int rc = dp__unit_load_shard(u, p, strlen(p), &b, 1, false, &res, &d);
    CHECK(rc != DP_OK);
    CHECK_CONTAINS(d.msg, "not a regular file");
    CHECK(dp_test_now() - t0 < 5);
    unlink(p);
    unlink(pr);
    dp__unit_destroy(u);
    rm_dir(dir);
}
