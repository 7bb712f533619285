/*
 * Tests for checkpoints (docs/design.md, Checkpoints) of one unit: its
 * save_shard and load_shard called in process (round trip byte for byte,
 * overwritten and cleared keys stay gone, not enough room, corrupted and
 * truncated files refused with nothing published, another cluster shape
 * refused, path rules, holds under concurrent puts, overwrites and clears),
 * through the control handler, and over ZMQ while the unit saves (it answers
 * others, two saves or a save and a load at once, destroyed midway). The
 * cluster-level checkpoints and the CLI are tested in test_checkpoint_cluster.c.
 */
#include "dp_test.h"
#include "dp_tsan_ucx.h"
#include "dp_unit_blob.h"
#include "dp_checkpoint_fixture.h"

#include <pthread.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include "blob/crc32c.h"
#include "common/common.h"
#include "ctl/ctl.h"
#include "unit/unit.h"
#include "wire/mp.h"
#include "wire/wire.h"

/* ---- one unit, in process ---- */

DP_TEST(round_trip_live_keys_only)
{
    char p[512];
    tpath("rt", p, sizeof p);
    rm_shard(p);
    dp__unit *u = mk_unit(1 << 20, 2, 1);
    uint64_t g1[] = {1, 3, 5}, g2[] = {7}, g3[] = {3}, g4[] = {9, 11};
    CHECK_OK(put_rows(u, "b1", g1, 3, 1, 300));
    CHECK_OK(put_rows(u, "b2", g2, 1, 1, 300));
    CHECK_OK(put_rows(u, "b3", g3, 1, 2, 300)); /* overwrites 3@f */
    CHECK_OK(put_rows(u, "b4", g4, 2, 1, 300));
    uint64_t clr[] = {7, 9};
    CHECK_EQ(dp__unit_release_rows(u, clr, 2), 2); /* b2 gone, b4 half */
    dp__unit_save_res sr;
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_OK_D(save(u, p, &sr, &d), &d);
    CHECK_EQ(sr.n_blobs, 3);
    CHECK_EQ(sr.clears_during_save, 0);
    struct stat st;
    CHECK(stat(p, &st) == 0);
    CHECK_EQ((uint64_t)st.st_size, sr.nbytes);
    dp_test_unit_check(u);

    dp__unit *v = mk_unit(1 << 20, 2, 1);
    dp__unit_load_res lr;
    CHECK_OK_D(load(v, p, &sr, false, &lr, &d), &d);
    CHECK_EQ(lr.n_loaded, 3);
    CHECK_EQ(lr.n_failed, 0);
    dp__unit_load_res_fini(&lr);
    dp_test_unit_check(v);
    for (uint64_t g = 1; g < 13; g += 2)
        CHECK_EQ(row_version(v, g, 300, 2), row_version(u, g, 300, 2));
    CHECK_EQ(row_version(v, 3, 300, 2), 2);
    CHECK_EQ(row_version(v, 7, 300, 2), 0);
    CHECK_EQ(row_version(v, 9, 300, 2), 0);
    CHECK_EQ(dp_test_unit_stats(v).entries, dp_test_unit_stats(u).entries);
    CHECK_EQ(dp_test_unit_stats(v).published, 3);
    /* Loading again: everything is already there. */
    CHECK_OK_D(load(v, p, &sr, false, &lr, &d), &d);
    CHECK_EQ(lr.n_loaded, 3);
    dp__unit_load_res_fini(&lr);
    CHECK_EQ(dp_test_unit_stats(v).published, 3);
    dp_test_unit_check(v);

    /* The final name exists: a save never replaces it, nor a stale .tmp. */
    dp__unit_save_res sr2;
    CHECK_ERR_D(save(u, p, &sr2, &d), DP_EEXIST, &d);
    CHECK_CONTAINS(dp_detail_msg(&d), "not replaced");
    dp__unit_destroy(v);
    dp__unit_save_res_fini(&sr);
    dp__unit_destroy(u);
    rm_shard(p);
}

/*
 * A blob of layout version 2, as clients before version 3 wrote them (a
 * msgpack index), holding rows gidxs[0..n) of field "f" at version ver with
 * CRCs: committed into u as a client's WRITE would leave it.
 */
static void
put_rows_v2(dp__unit *u, const char *id, const uint64_t *gidxs, uint32_t n, uint32_t ver,
            uint64_t plen)
{
    dp__buf ix;
    dp__buf_init(&ix);
    uint64_t payload_off = 0, index_len = 0, slot = DP_ALIGN_UP(plen, 64);
    for (int pass = 0; pass < 2; pass++) { /* the offsets are full width: same length */
        dp__buf_reset(&ix);
        dp__mp_writer w;
        dp__mp_writer_init(&w, &ix);
        dp__mp_put_array(&w, n);
        for (uint32_t i = 0; i < n; i++) {
            char key[64];
            snprintf(key, sizeof key, "%llu@f", (unsigned long long)gidxs[i]);
            uint8_t pay[4096];
            for (uint64_t k = 0; k < plen; k++)
                pay[k] = pat(gidxs[i], ver, k);
            dp__mp_put_array(&w, 7);
            dp__mp_put_str(&w, key);
            dp__mp_put_str(&w, "bytes");
            dp__mp_put_str(&w, "");
            dp__mp_put_array(&w, 0);
            uint64_t off = payload_off + i * slot;
            uint8_t raw[9] = {0xcf};
            for (int k = 0; k < 8; k++)
                raw[1 + k] = (uint8_t)(off >> (56 - 8 * k));
            dp__buf_append(&ix, raw, sizeof raw);
            dp__mp_put_u64(&w, plen);
            dp__mp_put_u64(&w, dp__crc32c(pay, (size_t)plen));
        }
        index_len = ix.len;
        payload_off = DP_ALIGN_UP(64 + index_len, 64);
    }
    uint64_t total = payload_off + n * slot, off = 0;
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_OK_D(dp_test_unit_alloc(u, id, strlen(id), total, n, false, &off, NULL, &d),
               &d);
    uint8_t *p = dp__unit_slab(u) + off;
    memset(p, 0, (size_t)total);
    dp__blob_header h = {.version = 2,
                         .n_entries = n,
                         .index_len = index_len,
                         .payload_off = payload_off,
                         .total_len = total,
                         .index_crc = dp__crc32c(ix.data, ix.len),
                         .flags = DP_BLOB_FLAG_CRC};
    dp__blob_header_encode(&h, p);
    memcpy(p + 64, ix.data, ix.len);
    for (uint32_t i = 0; i < n; i++)
        for (uint64_t k = 0; k < plen; k++)
            p[payload_off + i * slot + k] = pat(gidxs[i], ver, k);
    dp__blob_header_set_alloc(p, dp__unit_incarnation(u),
                              dp__unit_alloc_token(u, id, strlen(id)));
    dp__wire_commit_state st = DP_WIRE_COMMIT_LOST;
    CHECK_OK_D(dp__unit_commit(u, id, strlen(id), &st, &d), &d);
    CHECK_EQ(st, DP_WIRE_COMMIT_DONE);
    dp__buf_fini(&ix);
}

/*
 * Blobs of layout version 2 (checkpoints saved before version 3) still
 * commit, save, load and answer; a home save writes a mixed one anew (in
 * version 3) with its home rows alone.
 */
DP_TEST(version_2_blobs_still_load)
{
    char p[512], q[512];
    tpath("v2", p, sizeof p);
    tpath("v2h", q, sizeof q);
    rm_shard(p);
    rm_shard(q);
    dp__unit *u = mk_unit_r(1 << 20, 3, 0, 2); /* holds rows g % 3 == 0 and == 2 */
    uint64_t g[] = {0, 2, 3, 5};
    put_rows_v2(u, "old-1", g, 4, 1, 300);
    uint64_t g2[] = {6};
    CHECK_OK(put_rows(u, "new-1", g2, 1, 2, 300));
    for (int i = 0; i < 4; i++)
        CHECK_EQ(row_version(u, g[i], 300, 2), 1);
    dp__unit_save_res sr, sh;
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_OK_D(save(u, p, &sr, &d), &d);
    CHECK_OK_D(save_home(u, q, &sh, &d), &d);
    dp__unit *v = mk_unit_r(1 << 20, 3, 0, 2);
    dp__unit_load_res lr;
    CHECK_OK_D(load(v, p, &sr, false, &lr, &d), &d);
    CHECK_EQ(lr.n_loaded, 2);
    dp__unit_load_res_fini(&lr);
    for (int i = 0; i < 4; i++)
        CHECK_EQ(row_version(v, g[i], 300, 2), 1);
    CHECK_EQ(row_version(v, 6, 300, 2), 2);
    dp_test_unit_check(v);
    dp__unit_destroy(v);
    /* The home shard: rows 0, 3 and 6 (unit 0's own), the old blob rewritten. */
    v = mk_unit_r(1 << 20, 3, 0, 1);
    CHECK_OK_D(load(v, q, &sh, false, &lr, &d), &d);
    CHECK_EQ(lr.n_loaded, 2);
    dp__unit_load_res_fini(&lr);
    CHECK_EQ(row_version(v, 0, 300, 2), 1);
    CHECK_EQ(row_version(v, 3, 300, 2), 1);
    CHECK_EQ(row_version(v, 6, 300, 2), 2);
    CHECK_EQ(dp_test_unit_stats(v).entries, 3);
    dp_test_unit_check(v);
    dp__unit_destroy(v);
    dp__unit_save_res_fini(&sr);
    dp__unit_save_res_fini(&sh);
    dp__unit_destroy(u);
    rm_shard(p);
    rm_shard(q);
}

/* The ids of a save's blobs, sorted, joined by ' '. */
static void
saved_ids(const dp__unit_save_res *sr, char *out, size_t cap)
{
    const char *v[16];
    uint32_t n = sr->n_blobs < 16 ? sr->n_blobs : 16;
    for (uint32_t i = 0; i < n; i++)
        v[i] = sr->blobs[i].id.p;
    for (uint32_t i = 1; i < n; i++)
        for (uint32_t j = i; j > 0 && strcmp(v[j - 1], v[j]) > 0; j--) {
            const char *t = v[j];
            v[j] = v[j - 1];
            v[j - 1] = t;
        }
    out[0] = '\0';
    for (uint32_t i = 0; i < n; i++)
        snprintf(out + strlen(out), cap - strlen(out), "%s%s", i ? " " : "", v[i]);
}

/*
 * With replicas, a home save keeps each row once: unit 0 of 3 (R = 2) holds
 * its own rows (g % 3 == 0) and copies of unit 2's; its shard holds its own
 * alone, loads as they are into R = 1, and as the copies of unit 0's rows
 * into unit 1 (R = 2 or 3). Blobs mixing both kinds are written anew.
 */
DP_TEST(home_save_keeps_each_row_once_and_loads_as_copies)
{
    char p[512], pf[512];
    tpath("home", p, sizeof p);
    tpath("full", pf, sizeof pf);
    rm_shard(p);
    rm_shard(pf);
    const uint64_t plen = 3000;
    dp__unit *u = mk_unit_r(1 << 20, 3, 0, 2);
    uint64_t g1[] = {0, 2, 3, 5}, g2[] = {6, 9}, g3[] = {8, 11}, g4[] = {3, 2};
    CHECK_OK(put_rows(u, "b1", g1, 4, 1, plen)); /* own and copies */
    CHECK_OK(put_rows(u, "b2", g2, 2, 1, plen)); /* own rows only: saved as is */
    CHECK_OK(put_rows(u, "b3", g3, 2, 1, plen)); /* copies only: not saved */
    CHECK_OK(put_rows(u, "b4", g4, 2, 2, plen)); /* b1 keeps only 0 of its own */
    dp__unit_save_res sr, sf;
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_OK_D(save_home(u, p, &sr, &d), &d);
    CHECK_OK_D(save(u, pf, &sf, &d), &d);
    char ids[256];
    saved_ids(&sr, ids, sizeof ids);
    CHECK_STR(ids, "b1:h b2 b4:h");
    /* Three own values' payloads (rows 0, 3, 6, 9: four) against ten. */
    CHECK(sr.nbytes < 4 * plen + 4096);
    CHECK(sf.nbytes > 8 * plen);
    dp_test_unit_check(u);

    /* Into unit 0 of a cluster with one copy: only its own rows. */
    dp__unit *r1 = mk_unit_r(1 << 20, 3, 0, 1);
    dp__unit_load_res lr;
    CHECK_OK_D(load_copy(r1, p, &sr, 0, &lr, &d), &d);
    CHECK_EQ(lr.n_loaded, 3);
    dp__unit_load_res_fini(&lr);
    CHECK_EQ(row_version(r1, 0, plen, 2), 1);
    CHECK_EQ(row_version(r1, 3, plen, 2), 2);
    CHECK_EQ(row_version(r1, 6, plen, 2), 1);
    CHECK_EQ(row_version(r1, 9, plen, 2), 1);
    CHECK_EQ(dp_test_unit_stats(r1).entries, 4);
    dp_test_unit_check(r1);
    /* The full shard holds other units' rows: refused there, nothing published. */
    CHECK_ERR_D(load(r1, pf, &sf, false, &lr, &d), DP_EPROTO, &d);
    CHECK_EQ(dp_test_unit_stats(r1).entries, 4);
    dp__unit_destroy(r1);

    /* Into unit 1 (R = 2 and 3): copy 2 of unit 0's rows. */
    for (uint32_t reps = 2; reps <= 3; reps++) {
        dp__unit *v = mk_unit_r(1 << 20, 3, 1, reps);
        CHECK_OK_D(load_copy(v, p, &sr, 1, &lr, &d), &d);
        CHECK_EQ(lr.n_loaded, 3);
        dp__unit_load_res_fini(&lr);
        CHECK_EQ(row_version(v, 0, plen, 2), 1);
        CHECK_EQ(row_version(v, 3, plen, 2), 2);
        CHECK_EQ(row_version(v, 9, plen, 2), 1);
        CHECK_EQ(dp_test_unit_stats(v).entries, 4);
        dp_test_unit_check(v);
        /* Its own shard is not unit 0's; copy 1 of R = 2 is the last. */
        CHECK_ERR_D(load_copy(v, p, &sr, 0, &lr, &d), DP_EINVAL, &d);
        CHECK_CONTAINS(dp_detail_msg(&d), "shard of unit 0");
        if (reps == 2) {
            CHECK_ERR_D(load_copy(v, p, &sr, 2, &lr, &d), DP_EINVAL, &d);
            CHECK_CONTAINS(dp_detail_msg(&d), "keeps 2 copies");
        }
        dp__unit_destroy(v);
    }
    /* Unit 2 keeps no copy of unit 0's rows at R = 2 (its copy 1 is unit 1's). */
    dp__unit *w = mk_unit_r(1 << 20, 3, 2, 2);
    CHECK_ERR_D(load_copy(w, p, &sr, 1, &lr, &d), DP_EINVAL, &d);
    CHECK_CONTAINS(dp_detail_msg(&d), "copies of unit 1");
    dp__unit_destroy(w);
    dp__unit_save_res_fini(&sr);
    dp__unit_save_res_fini(&sf);
    dp__unit_destroy(u);
    rm_shard(p);
    rm_shard(pf);
}

/* The same for a blob on the SSD tier: its home rows are read from its file. */
DP_TEST(home_save_rewrites_a_disk_blob)
{
    char p[512], dir[512];
    tpath("home-disk", p, sizeof p);
    tpath("ssd-XXXXXX", dir, sizeof dir);
    CHECK(mkdtemp(dir) != NULL);
    rm_shard(p);
    dp__unit_opts o;
    dp__unit_opts_init(&o);
    o.slab_bytes = 64 << 10; /* the blob below does not fit: it spills */
    o.n_units = 3;
    o.replicas = 2;
    o.numa = DP_UNIT_NUMA_OFF;
    o.ssd_dir = dir;
    o.staging_bytes = 1 << 20;
    dp__unit *u = NULL;
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_OK_D(dp__unit_create(&o, &u, &d), &d);
    const uint64_t plen = 30000;
    uint64_t g[] = {12, 14, 15};
    CHECK_OK(put_rows_spill(u, "d1", g, 3, 1, plen, true));
    CHECK_EQ(dp_test_unit_stats(u).disk_blobs, 1);
    dp__unit_save_res sr;
    CHECK_OK_D(save_home(u, p, &sr, &d), &d);
    CHECK_EQ(sr.n_blobs, 1);
    CHECK_STR(sr.blobs[0].id.p, "d1:h");
    CHECK(sr.nbytes < 2 * plen + 4096);
    dp__unit *v = mk_unit_r(1 << 20, 3, 0, 1);
    dp__unit_load_res lr;
    CHECK_OK_D(load_copy(v, p, &sr, 0, &lr, &d), &d);
    CHECK_EQ(lr.n_loaded, 1);
    dp__unit_load_res_fini(&lr);
    CHECK_EQ(row_version(v, 12, plen, 1), 1);
    CHECK_EQ(row_version(v, 15, plen, 1), 1);
    CHECK_EQ(dp_test_unit_stats(v).entries, 2);
    dp_test_unit_check(v);
    dp__unit_destroy(v);
    dp__unit_save_res_fini(&sr);
    dp__unit_destroy(u);
    rm_shard(p);
    rmdir(dir);
}

DP_TEST(not_enough_room_then_failed)
{
    char p[512];
    tpath("room", p, sizeof p);
    rm_shard(p);
    dp__unit *u = mk_unit(1 << 20, 1, 0);
    for (uint32_t i = 0; i < 8; i++) {
        char id[16];
        snprintf(id, sizeof id, "b%u", i);
        uint64_t g = i;
        CHECK_OK(put_rows(u, id, &g, 1, 1, 20000));
    }
    dp__unit_save_res sr;
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_OK_D(save(u, p, &sr, &d), &d);
    dp__unit *v = mk_unit(64 << 10, 1, 0); /* room for 3 */
    dp__unit_load_res lr;
    CHECK_OK_D(load(v, p, &sr, false, &lr, &d), &d);
    CHECK(lr.n_loaded >= 2 && lr.n_loaded < 8);
    CHECK_EQ(lr.n_loaded + lr.n_failed, 8);
    CHECK_EQ(dp_test_unit_stats(v).published, lr.n_loaded);
    dp__unit_load_res_fini(&lr);
    dp_test_unit_check(v);
    dp__unit_destroy(v);
    dp__unit_save_res_fini(&sr);
    dp__unit_destroy(u);
    rm_shard(p);
}

static void
copy_file(const char *from, const char *to)
{
    FILE *a = fopen(from, "rb"), *b = fopen(to, "wb");
    CHECK(a != NULL && b != NULL);
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, a)) > 0)
        CHECK_EQ(fwrite(buf, 1, n, b), n);
    fclose(a);
    fclose(b);
}

/* Loading p into a fresh unit fails with code, naming needle; nothing published. */
static void
refused(const char *p, const dp__unit_save_res *sr, uint32_t n_units, int code,
        const char *needle)
{
    dp__unit *v = mk_unit(1 << 20, n_units, 0);
    dp__unit_load_res lr;
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_ERR_D(load(v, p, sr, true, &lr, &d), code, &d);
    CHECK_CONTAINS(dp_detail_msg(&d), needle);
    dp__unit_stats s = dp_test_unit_stats(v);
    CHECK_EQ(s.blobs, 0);
    CHECK_EQ(s.entries, 0);
    CHECK_EQ(s.allocated_bytes, 0);
    dp_test_unit_check(v);
    dp__unit_destroy(v);
}

DP_TEST(corrupted_and_truncated_refused)
{
    char p[512], q[512], qr[600], pr[600];
    tpath("good", p, sizeof p);
    tpath("bad", q, sizeof q);
    rm_shard(p);
    dp__unit *u = mk_unit(1 << 20, 1, 0);
    uint64_t g1[] = {1, 2}, g2[] = {3};
    CHECK_OK(put_rows(u, "b1", g1, 2, 1, 5000));
    CHECK_OK(put_rows(u, "b2", g2, 1, 1, 5000));
    dp__unit_save_res sr;
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_OK_D(save(u, p, &sr, &d), &d);
    snprintf(pr, sizeof pr, "%s.rows", p);
    snprintf(qr, sizeof qr, "%s.rows", q);
    /* Payload byte of the second blob: its CRC names it and its offset. */
    copy_file(p, q);
    copy_file(pr, qr);
    uint64_t off2 = sr.blobs[1].off;
    corrupt_at(q, off2 + sr.blobs[1].nbytes - 10);
    char needle[64];
    snprintf(needle, sizeof needle, "at offset %llu", (unsigned long long)off2);
    refused(q, &sr, 1, DP_ECORRUPT, needle);
    /* Header magic, version, trailer. */
    copy_file(p, q);
    corrupt_at(q, 0);
    refused(q, &sr, 1, DP_ECORRUPT, "bad magic at offset 0");
    copy_file(p, q);
    corrupt_at(q, 8);
    refused(q, &sr, 1, DP_ECORRUPT, "version");
    copy_file(p, q);
    corrupt_at(q, sr.nbytes - 3);
    refused(q, &sr, 1, DP_ECORRUPT, "bad trailer");
    /* Truncated. */
    copy_file(p, q);
    CHECK_EQ(truncate(q, (off_t)(sr.nbytes - 100)), 0);
    refused(q, &sr, 1, DP_ECORRUPT, "truncated");
    /* Rows file corrupted or truncated. */
    copy_file(p, q);
    corrupt_at(qr, 30);
    refused(q, &sr, 1, DP_ECORRUPT, "CRC mismatch");
    copy_file(pr, qr);
    struct stat st;
    CHECK(stat(qr, &st) == 0);
    CHECK_EQ(truncate(qr, st.st_size - 5), 0);
    refused(q, &sr, 1, DP_ECORRUPT, ".rows");
    /* Another cluster shape. */
    copy_file(pr, qr);
    refused(q, &sr, 2, DP_EINVAL, "cluster");
    /* Missing files. */
    unlink(qr);
    refused(q, &sr, 1, DP_ESYS, ".rows");
    rm_shard(q);
    refused(q, &sr, 1, DP_ESYS, q);
    dp__unit_save_res_fini(&sr);
    dp__unit_destroy(u);
    rm_shard(p);
}

DP_TEST(path_rules)
{
    dp__unit *u = mk_unit(1 << 20, 1, 0);
    dp__unit_save_res sr;
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_ERR_D(dp__unit_save_shard(u, "rel/x", 5, &sr, &d), DP_EINVAL, &d);
    CHECK_ERR_D(dp__unit_save_shard(u, "/tmp/a\nb", 8, &sr, &d), DP_EINVAL, &d);
    CHECK_ERR_D(dp__unit_save_shard(u, "/tmp/a\0b", 8, &sr, &d), DP_EINVAL, &d);
    char *longp = malloc(DP_UNIT_PATH_MAX + 2);
    memset(longp, 'a', DP_UNIT_PATH_MAX + 1);
    longp[0] = '/';
    CHECK_ERR_D(dp__unit_save_shard(u, longp, DP_UNIT_PATH_MAX + 1, &sr, &d), DP_EINVAL,
                &d);
    free(longp);
    dp__unit_load_res lr;
    CHECK_ERR_D(dp_test_load_shard(u, "x", NULL, 0, false, &lr, &d), DP_EINVAL, &d);
    /* A stale temporary name makes the save fail, nothing replaced. */
    char p[512], t[600];
    tpath("stale", p, sizeof p);
    rm_shard(p);
    snprintf(t, sizeof t, "%s.tmp", p);
    FILE *f = fopen(t, "w");
    CHECK(f != NULL);
    fclose(f);
    CHECK_ERR_D(dp__unit_save_shard(u, p, strlen(p), &sr, &d), DP_EEXIST, &d);
    CHECK(access(p, F_OK) != 0);
    rm_shard(p);
    dp__unit_destroy(u);
}

/* Run one request through the unit's handler; the reply keeps out alive. */
static void
handle(dp__unit *u, const dp__wire_request *req, dp__wire_reply *rep, dp__buf *out)
{
    dp__buf in = {0};
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_OK_D(dp__wire_request_encode(req, NULL, &in, &d), &d);
    dp__buf_reset(out);
    dp__unit_handle(u, in.data, in.len, out);
    CHECK(out->len > 0);
    CHECK_OK_D(dp__wire_reply_decode(out->data, out->len, req->op, NULL, rep, &d), &d);
    dp__buf_fini(&in);
}

DP_TEST(handler_save_load)
{
    char p[512];
    tpath("handler", p, sizeof p);
    rm_shard(p);
    dp__unit *u = mk_unit(1 << 20, 1, 0);
    uint64_t g1[] = {1, 2}, g2[] = {2};
    CHECK_OK(put_rows(u, "b1", g1, 2, 1, 100));
    CHECK_OK(put_rows(u, "b2", g2, 1, 2, 100));
    dp__wire_request q;
    memset(&q, 0, sizeof q);
    q.rid = (dp__wire_str){"r1", 2};
    q.op = DP_WIRE_OP_SAVE_SHARD;
    q.a.save_shard.path = (dp__wire_str){p, (uint32_t)strlen(p)};
    dp__wire_reply r;
    dp__buf out = {0}, out2 = {0};
    handle(u, &q, &r, &out);
    CHECK(r.ok);
    CHECK_EQ(r.r.save_shard.blobs.n, 2);
    struct stat st;
    CHECK(stat(p, &st) == 0);
    CHECK_EQ((uint64_t)st.st_size, r.r.save_shard.nbytes);

    dp__unit *v = mk_unit(1 << 20, 1, 0);
    dp__wire_request lq;
    memset(&lq, 0, sizeof lq);
    lq.rid = (dp__wire_str){"r2", 2};
    lq.op = DP_WIRE_OP_LOAD_SHARD;
    lq.a.load_shard.path = q.a.save_shard.path;
    lq.a.load_shard.blobs = r.r.save_shard.blobs;
    dp__wire_reply lr;
    handle(v, &lq, &lr, &out2);
    CHECK(lr.ok);
    CHECK_EQ(lr.r.load_shard.loaded.n, 2);
    CHECK_EQ(lr.r.load_shard.failed.n, 0);
    dp__wire_reply_fini(&lr);
    CHECK_EQ(row_version(v, 1, 100, 2), 1);
    CHECK_EQ(row_version(v, 2, 100, 2), 2);
    CHECK_EQ(dp_test_unit_stats(v).entries, 2);
    dp_test_unit_check(v);
    /* Saving to the same name again is refused (Protocol error, nothing replaced). */
    dp__wire_reply_fini(&r);
    handle(u, &q, &r, &out);
    CHECK(!r.ok);
    CHECK_EQ(r.err.code, DP_EPROTO);
    dp__wire_reply_fini(&r);
    dp__buf_fini(&out);
    dp__buf_fini(&out2);
    dp__unit_destroy(v);
    dp__unit_destroy(u);
    rm_shard(p);
}

/* ---- concurrency: save while puts, overwrites and clears run ---- */

#define CC_ROWS 64
#define CC_PLEN 2048

typedef struct cc_state {
    dp__unit *u;
    volatile int stop;
    uint64_t seed;
    uint32_t puts;
} cc_state;

static void *
cc_writer(void *arg)
{
    cc_state *s = arg;
    uint64_t rs = s->seed;
    uint32_t n = 0;
    while (!__atomic_load_n(&s->stop, __ATOMIC_ACQUIRE)) {
        uint64_t g[3];
        uint32_t k = 1 + (uint32_t)(dp_test_rand(&rs) % 3);
        for (uint32_t i = 0; i < k; i++)
            g[i] = (dp_test_rand(&rs) % CC_ROWS) * 3 + i; /* distinct */
        char id[32];
        snprintf(id, sizeof id, "w%u", n);
        if (dp_test_rand(&rs) % 4 == 0) {
            dp__unit_release_rows(s->u, g, k);
        } else if (put_rows(s->u, id, g, k, 1 + n % 5, CC_PLEN) == 0) {
            n++;
            __atomic_store_n(&s->puts, n, __ATOMIC_RELEASE);
        }
    }
    s->puts = n;
    return NULL;
}

DP_TEST(save_during_puts_overwrites_clears)
{
    char p[512];
    tpath("cc", p, sizeof p);
    dp__unit *u = mk_unit(4 << 20, 1, 0);
    cc_state s = {.u = u, .seed = dp_test_seed()};
    pthread_t th;
    CHECK_EQ(pthread_create(&th, NULL, cc_writer, &s), 0);
    dp_detail d;
    dp_detail_clear(&d);
    uint64_t clears = 0;
    int overlapped = 0, restored = 0; /* saves that puts overlapped; rows restored */
    for (int round = 0; round < 12; round++) {
        rm_shard(p);
        dp__unit_save_res sr;
        uint32_t puts0 = __atomic_load_n(&s.puts, __ATOMIC_ACQUIRE);
        CHECK_OK_D(save(u, p, &sr, &d), &d);
        overlapped += __atomic_load_n(&s.puts, __ATOMIC_ACQUIRE) > puts0;
        clears += sr.clears_during_save;
        dp_test_unit_check(u);
        dp__unit *v = mk_unit(4 << 20, 1, 0);
        dp__unit_load_res lr;
        CHECK_OK_D(load(v, p, &sr, false, &lr, &d), &d);
        CHECK_EQ(lr.n_failed, 0);
        CHECK_EQ(lr.n_loaded, sr.n_blobs);
        dp__unit_load_res_fini(&lr);
        dp_test_unit_check(v);
        /* Every restored row holds one whole version's bytes. */
        for (uint64_t g = 0; g < CC_ROWS * 3; g++)
            restored += row_version(v, g, CC_PLEN, 5) != 0;
        dp__unit_destroy(v);
        dp__unit_save_res_fini(&sr);
    }
    __atomic_store_n(&s.stop, 1, __ATOMIC_RELEASE);
    pthread_join(th, NULL);
    dp_test_unit_check(u);
    CHECK(s.puts > 0);
    DP_LOG_I("checkpoint: %u puts, %llu clears during saves, %d of 12 saves overlapped "
             "by puts, %d rows restored",
             s.puts, (unsigned long long)clears, overlapped, restored);
    CHECK_GE(overlapped, 1); /* saves ran under concurrent puts */
    CHECK_GE(restored, 1);   /* and restored rows whose bytes were checked */
    /* Quiet now: a save then a load reproduces every row exactly. */
    rm_shard(p);
    dp__unit_save_res sr;
    CHECK_OK_D(save(u, p, &sr, &d), &d);
    dp__unit *v = mk_unit(4 << 20, 1, 0);
    dp__unit_load_res lr;
    CHECK_OK_D(load(v, p, &sr, false, &lr, &d), &d);
    dp__unit_load_res_fini(&lr);
    for (uint64_t g = 0; g < CC_ROWS * 3; g++)
        CHECK_EQ(row_version(v, g, CC_PLEN, 5), row_version(u, g, CC_PLEN, 5));
    CHECK_EQ(dp_test_unit_stats(v).entries, dp_test_unit_stats(u).entries);
    dp__unit_destroy(v);
    dp__unit_save_res_fini(&sr);
    dp__unit_destroy(u);
    rm_shard(p);
    rmdir(tmpdir);
}

/* ---- holds: rows cleared while the save copies ---- */

typedef struct hold_ctx {
    dp__unit *u;
    const char *path;
    dp__unit_save_res sr;
    int rc;
} hold_ctx;

static void *
hold_saver(void *arg)
{
    hold_ctx *h = arg;
    dp_detail d;
    dp_detail_clear(&d);
    h->rc = dp__unit_save_shard(h->u, h->path, strlen(h->path), &h->sr, &d);
    return NULL;
}

DP_TEST(clear_during_save_frees_after_copy)
{
    char p[512], tmp[600];
    tpath("hold", p, sizeof p);
    snprintf(tmp, sizeof tmp, "%s.tmp", p);
    int tries = 0, seen = 0;
    for (; tries < 5 && !seen; tries++) {
        rm_shard(p);
        dp__unit *u = mk_unit(80 << 20, 1, 0);
        uint64_t g[16];
        for (uint32_t i = 0; i < 16; i++) {
            char id[16];
            snprintf(id, sizeof id, "h%u", i);
            g[i] = i;
            CHECK_OK(put_rows(u, id, &g[i], 1, 1, 4 << 20));
        }
        hold_ctx h = {.u = u, .path = p};
        pthread_t th;
        CHECK_EQ(pthread_create(&th, NULL, hold_saver, &h), 0);
        /* path.tmp exists only after the snapshot: clear everything then. */
        double end = dp_test_now() + 10;
        while (access(tmp, F_OK) != 0 && dp_test_now() < end)
            ;
        CHECK_EQ(dp__unit_release_rows(u, g, 16), 16);
        dp__unit_stats s = dp_test_unit_stats(u);
        bool during = access(tmp, F_OK) == 0; /* still copying after the clear */
        if (during) {
            /* Held: out of the table, regions kept until the copy ends. */
            CHECK_EQ(s.published, 0);
            CHECK_EQ(s.zombies, 16);
            CHECK(s.allocated_bytes >= 64 << 20);
            dp_test_unit_check(u);
        }
        CHECK_EQ(pthread_join(th, NULL), 0);
        CHECK_OK(h.rc);
        s = dp_test_unit_stats(u);
        CHECK_EQ(s.zombies, 0);
        CHECK_EQ(s.allocated_bytes, 0);
        dp_test_unit_check(u);
        if (during) {
            seen = 1;
            CHECK_EQ(h.sr.clears_during_save, 1);
            /* The copy is whole: all 16 rows come back. */
            dp__unit *v = mk_unit(80 << 20, 1, 0);
            dp__unit_load_res lr;
            dp_detail d;
            dp_detail_clear(&d);
            CHECK_OK_D(load(v, p, &h.sr, false, &lr, &d), &d);
            CHECK_EQ(lr.n_loaded, 16);
            dp__unit_load_res_fini(&lr);
            for (uint64_t r = 0; r < 16; r++)
                CHECK_EQ(row_version(v, r, 4 << 20, 1), 1);
            dp__unit_destroy(v);
        }
        dp__unit_save_res_fini(&h.sr);
        dp__unit_destroy(u);
    }
    DP_LOG_I("checkpoint: clear landed during the copy after %d tries", tries);
    CHECKF(seen, "the save always ended before the clear (%d tries)", tries);
    rm_shard(p);
}

/* ---- one unit served over ZMQ: saves and loads on threads of their own ---- */

typedef struct busy_save {
    const char *addr;
    const char *path;
    dp__buf reply;
    int rc;
    int done;         /* atomic */
    double timeout_s; /* 0: 60 */
} busy_save;

/* save_shard sent straight to the unit; done once its reply is in. */
static void *
busy_saver(void *arg)
{
    busy_save *b = arg;
    dp__ctl_client *cc = NULL;
    dp_detail d;
    dp_detail_clear(&d);
    dp__wire_request q;
    memset(&q, 0, sizeof q);
    q.op = DP_WIRE_OP_SAVE_SHARD;
    q.rid = (dp__wire_str){"s1", 2};
    q.a.save_shard.path = dp__wire_s(b->path);
    dp__buf req = {0};
    b->rc = dp__ctl_client_create(&cc, &d);
    if (b->rc == 0)
        b->rc = dp__wire_request_encode(&q, NULL, &req, &d);
    if (b->rc == 0)
        b->rc = dp__ctl_call(cc, b->addr, &req, "s1",
                             b->timeout_s > 0 ? b->timeout_s : 60, &b->reply, &d);
    __atomic_store_n(&b->done, 1, __ATOMIC_RELEASE);
    dp__buf_fini(&req);
    dp__ctl_client_destroy(cc);
    return NULL;
}

/*
 * A unit writing its shard keeps answering: save_shard runs on a thread of
 * its own and replies through the ctl server later, so pings sent meanwhile
 * are answered while the save is still running (before, they waited behind
 * it, and at most one could be answered before its reply).
 */
DP_TEST(unit_answers_others_while_it_saves)
{
    char path[512];
    tpath("busy-shard", path, sizeof path);
    rm_shard(path);
    tcluster a;
    tc_start(&a, 1, 512 << 20, NULL, "busy.json");
    tc_fill(&a, 192 / DP_TEST_BULK_DIV, 1 << 20, 4); /* ~190 MiB to write and fsync */
    uint64_t live = dp_test_unit_stats(a.u[0]).entries;
    dp__ctl_client *pc = NULL;
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_OK_D(dp__ctl_client_create(&pc, &d), &d);
    busy_save b = {a.cl.units[0].zmq, path, {0}, -1, 0, 0};
    pthread_t th;
    CHECK_EQ(pthread_create(&th, NULL, busy_saver, &b), 0);
    dp__wire_request q;
    memset(&q, 0, sizeof q);
    q.op = DP_WIRE_OP_PING;
    q.rid = (dp__wire_str){"p1", 2};
    dp__buf req = {0}, rep = {0};
    CHECK_OK_D(dp__wire_request_encode(&q, NULL, &req, &d), &d);
    int during = 0, total = 0;
    while (!__atomic_load_n(&b.done, __ATOMIC_ACQUIRE)) {
        dp__buf_reset(&rep);
        CHECK_OK_D(dp__ctl_call(pc, a.cl.units[0].zmq, &req, "p1", 60, &rep, &d), &d);
        total++;
        if (!__atomic_load_n(&b.done, __ATOMIC_ACQUIRE))
            during++;
    }
    pthread_join(th, NULL);
    CHECK_OK(b.rc);
    dp__wire_reply r;
    CHECK_OK_D(dp__wire_reply_decode(b.reply.data, b.reply.len, DP_WIRE_OP_SAVE_SHARD,
                                     NULL, &r, &d),
               &d);
    CHECK(r.ok);
    CHECK(r.r.save_shard.nbytes > (100u << 20) / DP_TEST_BULK_DIV);
    dp__wire_reply_fini(&r);
    printf("  %d of %d pings answered while save_shard ran\n", during, total);
    CHECKF(during >= 3, "only %d of %d pings answered during the save", during, total);
    CHECK_EQ(dp_test_unit_stats(a.u[0]).entries, live);
    dp__buf_fini(&req);
    dp__buf_fini(&rep);
    dp__buf_fini(&b.reply);
    dp__ctl_client_destroy(pc);
    tc_stop(&a);
    rm_shard(path);
}

/*
 * Two saves of one unit at once (possible since saves left the ctl thread):
 * both complete, and each shard loads back into a fresh unit as a full copy.
 */
DP_TEST(two_saves_of_one_unit_at_once)
{
    char p1[512], p2[512];
    tpath("twin-1", p1, sizeof p1);
    tpath("twin-2", p2, sizeof p2);
    rm_shard(p1);
    rm_shard(p2);
    tcluster a;
    const uint64_t rows = 96 / DP_TEST_BULK_DIV;
    tc_start(&a, 1, 256 << 20, NULL, "twin.json");
    tc_fill(&a, rows, 1 << 20, 4);
    busy_save b1 = {a.cl.units[0].zmq, p1, {0}, -1, 0, 0};
    busy_save b2 = {a.cl.units[0].zmq, p2, {0}, -1, 0, 0};
    pthread_t t1, t2;
    CHECK_EQ(pthread_create(&t1, NULL, busy_saver, &b1), 0);
    CHECK_EQ(pthread_create(&t2, NULL, busy_saver, &b2), 0);
    pthread_join(t1, NULL);
    pthread_join(t2, NULL);
    CHECK_OK(b1.rc);
    CHECK_OK(b2.rc);
    busy_save *bs[2] = {&b1, &b2};
    dp_detail d;
    dp_detail_clear(&d);
    for (int k = 0; k < 2; k++) {
        dp__wire_reply r;
        CHECK_OK_D(dp__wire_reply_decode(bs[k]->reply.data, bs[k]->reply.len,
                                         DP_WIRE_OP_SAVE_SHARD, NULL, &r, &d),
                   &d);
        CHECK(r.ok);
        tcluster c;
        tc_start(&c, 1, 256 << 20, NULL, "twin-c.json");
        dp__unit_load_res lr;
        CHECK_OK_D(dp_test_load_shard(c.u[0], bs[k]->path, r.r.save_shard.blobs.v,
                                      r.r.save_shard.blobs.n, false, &lr, &d),
                   &d);
        CHECK_EQ(lr.n_failed, 0);
        dp__unit_load_res_fini(&lr);
        tc_same(&a, &c, rows, 1 << 20, 2);
        tc_stop(&c);
        dp__wire_reply_fini(&r);
        dp__buf_fini(&bs[k]->reply);
    }
    tc_stop(&a);
    rm_shard(p1);
    rm_shard(p2);
}

typedef struct busy_load {
    const char *addr, *path;
    const dp__wire_shard_blob *blobs;
    uint32_t n;
    dp__buf reply;
    int rc;
} busy_load;

/* load_shard sent straight to the unit. */
static void *
busy_loader(void *arg)
{
    busy_load *b = arg;
    dp__ctl_client *cc = NULL;
    dp_detail d;
    dp_detail_clear(&d);
    dp__wire_request q;
    memset(&q, 0, sizeof q);
    q.op = DP_WIRE_OP_LOAD_SHARD;
    q.rid = (dp__wire_str){"l1", 2};
    q.a.load_shard.path = dp__wire_s(b->path);
    q.a.load_shard.blobs = (dp__wire_shard_blobs){(dp__wire_shard_blob *)b->blobs, b->n};
    dp__buf req = {0};
    b->rc = dp__ctl_client_create(&cc, &d);
    if (b->rc == 0)
        b->rc = dp__wire_request_encode(&q, NULL, &req, &d);
    if (b->rc == 0)
        b->rc = dp__ctl_call(cc, b->addr, &req, "l1", 60, &b->reply, &d);
    dp__buf_fini(&req);
    dp__ctl_client_destroy(cc);
    return NULL;
}

/*
 * A save and a load of one unit at once: both complete; the unit holds its
 * own rows and the loaded ones; the saved shard loads back with every row it
 * has equal to the unit's (a loaded row is in it or not, never half).
 */
DP_TEST(save_and_load_of_one_unit_at_once)
{
    char pa[512], pb[512];
    tpath("sl-a", pa, sizeof pa);
    tpath("sl-b", pb, sizeof pb);
    rm_shard(pa);
    rm_shard(pb);
    /* Shard b: rows 1000..1063 of another unit 0 of 1. */
    tcluster b;
    tc_start(&b, 1, 256 << 20, NULL, "sl-b.json");
    for (uint32_t k = 0; k < 16; k++) {
        uint64_t g[4];
        for (uint32_t j = 0; j < 4; j++)
            g[j] = 1000 + 4 * k + j;
        char id[16];
        snprintf(id, sizeof id, "b%u", k);
        CHECK_OK(put_rows(b.u[0], id, g, 4, 1, 1 << 20));
    }
    dp__unit_save_res sr;
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_OK_D(dp__unit_save_shard(b.u[0], pb, strlen(pb), &sr, &d), &d);
    tc_stop(&b);
    tcluster a;
    const uint64_t rows = 96 / DP_TEST_BULK_DIV;
    tc_start(&a, 1, 512 << 20, NULL, "sl-a.json");
    tc_fill(&a, rows, 1 << 20, 4);
    busy_save bs = {a.cl.units[0].zmq, pa, {0}, -1, 0, 0};
    busy_load bl = {a.cl.units[0].zmq, pb, sr.blobs, sr.n_blobs, {0}, -1};
    pthread_t t1, t2;
    CHECK_EQ(pthread_create(&t1, NULL, busy_saver, &bs), 0);
    CHECK_EQ(pthread_create(&t2, NULL, busy_loader, &bl), 0);
    pthread_join(t1, NULL);
    pthread_join(t2, NULL);
    CHECK_OK(bs.rc);
    CHECK_OK(bl.rc);
    dp__wire_reply rl, rs;
    CHECK_OK_D(dp__wire_reply_decode(bl.reply.data, bl.reply.len, DP_WIRE_OP_LOAD_SHARD,
                                     NULL, &rl, &d),
               &d);
    CHECK(rl.ok);
    CHECK_EQ(rl.r.load_shard.loaded.n, 16);
    dp__wire_reply_fini(&rl);
    for (uint64_t g = 1000; g < 1064; g++)
        CHECK_EQ(row_version(a.u[0], g, 1 << 20, 1), 1);
    CHECK_OK_D(dp__wire_reply_decode(bs.reply.data, bs.reply.len, DP_WIRE_OP_SAVE_SHARD,
                                     NULL, &rs, &d),
               &d);
    CHECK(rs.ok);
    tcluster c;
    tc_start(&c, 1, 512 << 20, NULL, "sl-c.json");
    dp__unit_load_res lr;
    CHECK_OK_D(dp_test_load_shard(c.u[0], pa, rs.r.save_shard.blobs.v,
                                  rs.r.save_shard.blobs.n, false, &lr, &d),
               &d);
    CHECK_EQ(lr.n_failed, 0);
    dp__unit_load_res_fini(&lr);
    for (uint64_t g = 0; g < rows; g++)
        CHECK_EQ(row_version(c.u[0], g, 1 << 20, 2), row_version(a.u[0], g, 1 << 20, 2));
    uint32_t with = 0;
    for (uint64_t g = 1000; g < 1064; g++) {
        uint32_t v = row_version(c.u[0], g, 1 << 20, 1);
        CHECK(v == 0 || v == 1);
        with += v;
    }
    printf("  the save caught %u of the 64 rows loaded meanwhile\n", with);
    dp__wire_reply_fini(&rs);
    tc_stop(&c);
    tc_stop(&a);
    dp__unit_save_res_fini(&sr);
    dp__buf_fini(&bs.reply);
    dp__buf_fini(&bl.reply);
    rm_shard(pa);
    rm_shard(pb);
}

/*
 * A unit destroyed while it writes a shard stops the save at its next blob
 * (it used to wait for the whole save): no shard and no temporary is left,
 * and the save's reply is dropped with the server.
 */
DP_TEST(destroy_stops_a_running_save)
{
    char path[512], tmp[600], rows[600], rtmp[600];
    tpath("stopped-shard", path, sizeof path);
    rm_shard(path);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    snprintf(rows, sizeof rows, "%s.rows", path);
    snprintf(rtmp, sizeof rtmp, "%s.rows.tmp", path);
    tcluster a;
    tc_start(&a, 1, 768 << 20, NULL, "stopped.json");
    tc_fill(&a, 384 / DP_TEST_BULK_DIV, 1 << 20, 4); /* ~380 MiB to write */
    busy_save b = {a.cl.units[0].zmq, path, {0}, -1, 0, 2.0};
    pthread_t th;
    CHECK_EQ(pthread_create(&th, NULL, busy_saver, &b), 0);
    double t0 = dp_test_now();
    while (dp_test_unit_stats(a.u[0]).admin_running == 0 && dp_test_now() - t0 < 10)
        usleep(200);
    CHECK_EQ(dp_test_unit_stats(a.u[0]).admin_running, 1);
    dp__ctl_server_close(a.srv[0]);
    dp__unit_destroy(a.u[0]); /* returns once the save has stopped */
    CHECK(access(path, F_OK) != 0);
    CHECK(access(tmp, F_OK) != 0);
    CHECK(access(rows, F_OK) != 0);
    CHECK(access(rtmp, F_OK) != 0);
    pthread_join(th, NULL);
    /* The reply went with the server: its connection dropped (or the wait ran out). */
    CHECKF(b.rc == DP_ETRANSFER || b.rc == DP_ETIMEDOUT, "got %s", dp_errname(b.rc));
    dp__buf_fini(&b.reply);
    unlink(a.file);
    dp__cluster_fini(&a.cl);
}
