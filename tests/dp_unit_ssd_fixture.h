/*
 * Fixtures of the SSD tier tests (test_unit_ssd, test_unit_ssd_io and
 * test_unit_ssd_zmq): a scratch ssd_dir that must end empty, a unit with an
 * SSD tier, rows whose bytes derive from (row, version) in blobs of fields
 * "a" and "b", a put that may spill and a read that waits out stages. Include
 * after dp_test.h (CHECK) and dp_unit_blob.h; tblob comes from
 * dp_unit_fixture.h.
 */
#ifndef DP_UNIT_SSD_FIXTURE_H
#define DP_UNIT_SSD_FIXTURE_H

#include <dirent.h>
#include <stdlib.h>
#include <string.h>

#include "dp_unit_fixture.h"

#include "blob/blob.h"
#include "blob/crc32c.h"
#include "common/common.h"
#include "unit/unit.h"
#include "wire/wire.h"

/* ---- scratch directories and units ---- */

static inline char *
mk_dir(void)
{
    char *p = strdup("/tmp/dp-ssd-test-XXXXXX");
    CHECK(p != NULL && mkdtemp(p) != NULL);
    return p;
}

/* Entries of dir other than . and .. */
static inline int
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

static inline void
rm_dir(char *dir)
{
    if (dir == NULL)
        return;
    CHECK_EQ(dir_count(dir), 0);
    rmdir(dir);
    free(dir);
}

static inline dp__unit *
mk_ssd_unit(uint64_t slab, uint64_t staging, const char *dir, double pickup_s,
            uint32_t n_units)
{
    dp__unit_opts o;
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
    dp__unit *u = NULL;
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_OK_D(dp__unit_create(&o, &u, &d), &d);
    return u;
}

/* Wait until no io job is queued or running (bounded). */
static inline void
wait_idle(dp__unit *u)
{
    double t0 = dp_test_now();
    while (dp_test_unit_stats(u).io_jobs > 0 && dp_test_now() - t0 < 30)
        dp__sleep_s(0.001);
    CHECK_EQ(dp_test_unit_stats(u).io_jobs, 0);
}

/* ---- rows with content we can check ---- */

/* Field "a" of row g, version v: length and bytes derived from (g, v). */
static inline uint64_t
row_len(uint64_t g, uint32_t v)
{
    return 1000 + (g * 7919 + v * 131) % 30000;
}

static inline void
row_fill(uint64_t g, uint32_t v, uint8_t *p, uint64_t len)
{
    uint64_t s = g * 1000003u + v;
    for (uint64_t k = 0; k < len; k += 8) {
        uint64_t x = dp_test_rand(&s);
        memcpy(p + k, &x, DP_MIN(8, len - k));
    }
}

/* One blob holding fields "a" (row_fill) and "b" (8 bytes: g, v) of rows. */
static inline tblob
rows_blob(const uint64_t *g, uint32_t n, uint32_t v)
{
    dp__blob_builder *b = NULL;
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
            dp__blob_entry_spec s = {0};
            s.key = keys[2 * i + f];
            s.kind = DP_BLOB_BYTES;
            s.len = f == 0 ? la : 8;
            s.payload = pay[2 * i + f];
            s.has_crc = true;
            s.crc = dp__crc32c(s.payload, s.len);
            CHECK_OK_D(dp__blob_builder_add(b, &s, NULL, &d), &d);
        }
    }
    dp__blob_layout lay;
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
static inline dp__wire_commit_state
put_spill(dp__unit *u, const char *id, const tblob *t, bool *spilled)
{
    uint64_t off = 0;
    dp_detail d;
    dp_detail_clear(&d);
    double t0 = dp_test_now();
    int rc;
    for (;;) {
        rc = dp_test_unit_alloc(u, id, strlen(id), t->len, t->n, true, &off, NULL, &d);
        if (rc != DP_EBUSY || dp_test_now() - t0 > 30)
            break;
        dp__sleep_s(0.001);
    }
    CHECK_OK_D(rc, &d);
    if (spilled != NULL)
        *spilled = off >= dp__unit_io_base(u) && dp__unit_io_bytes(u) > 0;
    dp_test_write_blob(u, id, off, t->p, t->len);
    dp__wire_commit_state st = DP_WIRE_COMMIT_LOST;
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
static inline int
read_row(dp__unit *u, uint64_t g, uint32_t v)
{
    char ka[48], kb[48];
    snprintf(ka, sizeof ka, "%" PRIu64 "@a", g);
    snprintf(kb, sizeof kb, "%" PRIu64 "@b", g);
    dp__wire_str keys[2] = {dp__wire_s(ka), dp__wire_s(kb)};
    dp_detail d;
    dp_detail_clear(&d);
    double t0 = dp_test_now();
    for (;;) {
        dp__unit_resolve_keys_res r;
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

#endif
