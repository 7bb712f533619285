/*
 * Tests for versions on a unit (docs/design.md, "Versions"), in process: a
 * commit or inline put below the version a key is held at is refused as
 * "Stale" (nothing published, its region freed, the version it lost to in
 * the answer), a higher or equal one replaces the key, an unversioned one
 * (an older client) replaces it and keeps its version, and a repair's copy is
 * never refused but kept key by key by version; clears are versioned the same
 * way (refused below a key's version, refusing commits and repair copies
 * below their own). Through the handler too, so the wire carries ver.
 */
#include "dp_test.h"
#include "dp_tsan_ucx.h"
#include "dp_unit_blob.h"
#include "dp_unit_fixture.h"

#include "unit/unit.h"
#include "wire/wire.h"

/* alloc, "WRITE", commit at version ver: the commit's code; *stale as answered. */
static int
put_ver(dp__unit *u, const char *id, const char *const *keys, uint32_t n, uint32_t seed,
        uint64_t ver, uint64_t *stale)
{
    tblob t = mk_blob(keys, n, 64, seed);
    uint64_t off = 0;
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_OK_D(dp_test_unit_alloc(u, id, strlen(id), t.len, n, false, &off, NULL, &d),
               &d);
    dp_test_write_blob(u, id, off, t.p, t.len);
    dp__wire_commit_state st = DP_WIRE_COMMIT_LOST;
    *stale = 0;
    int rc = dp__unit_commit_ver(u, id, strlen(id), ver, NULL, &st, stale, &d);
    if (rc == 0)
        CHECK_EQ(st, DP_WIRE_COMMIT_DONE);
    else
        CHECK_CONTAINS(dp_detail_msg(&d), "nothing published");
    free(t.p);
    return rc;
}

/* The first payload byte of key (mk_blob's pattern names the seed), or -1. */
static int
first_byte(dp__unit *u, const char *key)
{
    uint64_t o, l;
    if (!locate(u, key, &o, &l, NULL))
        return -1;
    return dp__unit_slab(u)[o];
}

#define SEED_BYTE(seed) ((uint8_t)((seed)*31))

DP_TEST(a_commit_below_a_keys_version_is_refused)
{
    dp__unit *u = mk_unit(1 << 20, 1, 0);
    uint64_t stale = 0;
    const char *a[] = {"0@x", "1@x"};
    CHECK_OK(put_ver(u, "b1", a, 2, 1, 100, &stale));
    uint64_t used = dp_test_unit_stats(u).allocated_bytes;

    /* 1@x is held at 100: the whole commit is refused, 2@x is not published
     * either, and the region is free again. */
    const char *b[] = {"1@x", "2@x"};
    CHECK_ERR(put_ver(u, "b2", b, 2, 2, 50, &stale), DP__ESTALE);
    CHECK_EQ(stale, 100);
    CHECK_EQ(first_byte(u, "1@x"), SEED_BYTE(1) + 7);
    CHECK_EQ(first_byte(u, "2@x"), -1);
    dp__unit_stats st = dp_test_unit_stats(u);
    CHECK_EQ(st.versions_refused, 1);
    CHECK_EQ(st.allocated_bytes, used);
    CHECK_EQ(st.entries, 2);
    dp_test_unit_check(u);
    /* Its commit asked again (a lost reply) answers the same, never done. */
    dp__wire_commit_state cs = DP_WIRE_COMMIT_DONE;
    dp_detail d;
    dp_detail_clear(&d);
    stale = 0;
    CHECK_ERR(dp__unit_commit_ver(u, "b2", 2, 50, NULL, &cs, &stale, &d), DP__ESTALE);
    CHECK_EQ(stale, 100);
    CHECK_EQ(cs, DP_WIRE_COMMIT_DONE); /* untouched */
    CHECK_EQ(first_byte(u, "2@x"), -1);

    /* Above it: replaces; the same version again (a tie): the later wins. */
    CHECK_OK(put_ver(u, "b3", b, 2, 3, 150, &stale));
    CHECK_EQ(first_byte(u, "1@x"), SEED_BYTE(3));
    CHECK_OK(put_ver(u, "b4", b, 2, 4, 150, &stale));
    CHECK_EQ(first_byte(u, "1@x"), SEED_BYTE(4));
    /* 0@x is still at 100: a commit at 120 of 0@x and 1@x loses to 1@x's 150. */
    CHECK_ERR(put_ver(u, "b5", a, 2, 5, 120, &stale), DP__ESTALE);
    CHECK_EQ(stale, 150);
    CHECK_EQ(first_byte(u, "0@x"), SEED_BYTE(1));

    /* Unversioned (an older client): replaces by arrival and keeps 150. */
    const char *c[] = {"1@x"};
    CHECK_OK(put_ver(u, "b6", c, 1, 6, 0, &stale));
    CHECK_EQ(first_byte(u, "1@x"), SEED_BYTE(6));
    CHECK_ERR(put_ver(u, "b7", c, 1, 7, 149, &stale), DP__ESTALE);
    CHECK_EQ(stale, 150);

    /* A cleared row holds no version: anything lands. */
    uint64_t g = 1;
    CHECK_EQ(dp__unit_release_rows(u, &g, 1), 1);
    CHECK_OK(put_ver(u, "b8", c, 1, 8, 10, &stale));
    CHECK_EQ(first_byte(u, "1@x"), SEED_BYTE(8));
    CHECK_EQ(dp_test_unit_stats(u).versions_refused, 3);
    dp_test_unit_check(u);
    dp__unit_destroy(u);
}

DP_TEST(a_repair_copy_is_never_refused)
{
    dp__unit *u = mk_replica_unit(2, 0, 2, true);
    dp_detail d;
    dp_detail_clear(&d);
    uint64_t stale = 0;
    const char *a[] = {"0@x"};
    CHECK_OK(put_ver(u, "b1", a, 1, 1, 100, &stale));
    /* A repair's copy of 0@x and 1@x: 0@x is held, skipped; 1@x lands. */
    const char *b[] = {"0@x", "1@x"};
    tblob t = mk_blob(b, 2, 64, 2);
    dp__wire_alloc_args al = {
        .blob_id = dp__wire_s("r1"), .nbytes = t.len, .n_entries = 2, .repair = true};
    dp__wire_alloc_res r;
    CHECK_OK_D(dp__unit_alloc_req(u, &al, &r, NULL, &d), &d);
    dp_test_write_blob(u, "r1", r.off, t.p, t.len);
    dp__wire_commit_state st = DP_WIRE_COMMIT_LOST;
    CHECK_OK_D(dp__unit_commit_ver(u, "r1", 2, 0, NULL, &st, &stale, &d), &d);
    CHECK_EQ(st, DP_WIRE_COMMIT_DONE);
    free(t.p);
    CHECK_EQ(first_byte(u, "0@x"), SEED_BYTE(1));
    CHECK_EQ(first_byte(u, "1@x"), SEED_BYTE(2) + 7);
    /* The copy keeps no version: any versioned put replaces it. */
    const char *c[] = {"1@x"};
    CHECK_OK(put_ver(u, "b2", c, 1, 3, 1, &stale));
    CHECK_EQ(first_byte(u, "1@x"), SEED_BYTE(3));
    CHECK_EQ(dp_test_unit_stats(u).versions_refused, 0);
    dp__unit_destroy(u);
}

/* A repair's copy of keys (alloc with repair, WRITE, commit with vers). */
static int
put_repair_vers(dp__unit *u, const char *id, const char *const *keys, uint32_t n,
                uint32_t seed, uint64_t *vers, uint32_t n_vers, dp_detail *d)
{
    tblob t = mk_blob(keys, n, 64, seed);
    dp__wire_alloc_args al = {
        .blob_id = dp__wire_s(id), .nbytes = t.len, .n_entries = n, .repair = true};
    dp__wire_alloc_res r;
    CHECK_OK_D(dp__unit_alloc_req(u, &al, &r, NULL, d), d);
    dp_test_write_blob(u, id, r.off, t.p, t.len);
    dp__wire_commit_state st = DP_WIRE_COMMIT_LOST;
    dp__wire_u64s vs = {vers, n_vers};
    uint64_t stale = 0;
    int rc = dp__unit_commit_ver(u, id, strlen(id), 0, &vs, &st, &stale, d);
    if (rc == 0)
        CHECK_EQ(st, DP_WIRE_COMMIT_DONE);
    free(t.p);
    return rc;
}

DP_TEST(a_repair_copy_with_versions_keeps_the_higher)
{
    dp__unit *u = mk_replica_unit(2, 0, 2, true);
    dp_detail d;
    dp_detail_clear(&d);
    uint64_t stale = 0;
    const char *a[] = {"0@x", "1@x"};
    CHECK_OK(put_ver(u, "b1", a, 2, 1, 100, &stale));
    /* 0@x held at 100, the copy's at 90: skipped; 1@x held at 100, the copy's
     * at 120: the copy's replaces it; 2@x lacking: lands, at 50. */
    const char *b[] = {"0@x", "1@x", "2@x"};
    uint64_t vers[] = {90, 120, 50};
    CHECK_OK_D(put_repair_vers(u, "r1", b, 3, 2, vers, 3, &d), &d);
    CHECK_EQ(first_byte(u, "0@x"), SEED_BYTE(1));
    CHECK_EQ(first_byte(u, "1@x"), SEED_BYTE(2) + 7);
    CHECK_EQ(first_byte(u, "2@x"), SEED_BYTE(2) + 14);
    dp__unit_stats st = dp_test_unit_stats(u);
    CHECK_EQ(st.repair_keys, 2);
    CHECK_EQ(st.repair_skipped, 1);
    /* The copies' versions hold: below them is stale, above replaces. */
    const char *c1[] = {"1@x"}, *c2[] = {"2@x"};
    CHECK_ERR(put_ver(u, "b2", c1, 1, 3, 110, &stale), DP__ESTALE);
    CHECK_EQ(stale, 120);
    CHECK_ERR(put_ver(u, "b3", c2, 1, 3, 40, &stale), DP__ESTALE);
    CHECK_EQ(stale, 50);
    CHECK_OK(put_ver(u, "b4", c2, 1, 4, 60, &stale));
    /* Versions listed as held. */
    dp__unit_keys_page pg;
    dp__unit_lock(u);
    CHECK_OK_D(dp__unit_list_keys_locked(u, 1, 0, 10, &pg, &d), &d);
    dp__unit_unlock(u);
    CHECK_EQ(pg.keys.n, 3);
    for (uint32_t i = 0; i < pg.keys.n; i++) {
        uint64_t want = pg.keys.v[i].p[0] == '0'   ? 100
                        : pg.keys.v[i].p[0] == '1' ? 120
                                                   : 60;
        CHECK_EQ(pg.vers[i], want);
    }
    free(pg.keys.v);
    free(pg.vers);
    free(pg.text);
    /* One version per entry, and only for a repair's copy. */
    uint64_t two[] = {1, 2};
    CHECK_ERR(put_repair_vers(u, "r2", b, 3, 5, two, 2, &d), DP_EPROTO);
    CHECK_CONTAINS(dp_detail_msg(&d), "2 entry versions for a repair copy of 3");
    dp_test_unit_check(u);
    dp__unit_destroy(u);
}

DP_TEST(a_clear_below_a_keys_version_is_refused_and_one_above_holds)
{
    dp__unit *u = mk_unit(1 << 20, 1, 0);
    uint64_t stale = 0, g[] = {0, 1};
    const char *a[] = {"0@x", "1@x"};
    CHECK_OK(put_ver(u, "b1", a, 2, 1, 100, &stale));
    /* Below a key's version: nothing dropped, the version it lost to back. */
    CHECK_EQ(dp__unit_release_rows_ver(u, g, 2, 50, &stale), 0);
    CHECK_EQ(stale, 100);
    CHECK_EQ(first_byte(u, "0@x"), SEED_BYTE(1));
    CHECK_EQ(dp_test_unit_stats(u).entries, 2);
    /* Above: dropped, and the rows keep the clear's version. */
    CHECK_EQ(dp__unit_release_rows_ver(u, g, 2, 150, &stale), 2);
    CHECK_EQ(stale, 0);
    dp__unit_stats st = dp_test_unit_stats(u);
    CHECK_EQ(st.entries, 0);
    CHECK_EQ(st.repair_cleared, 2);
    /* A put below the clear (a commit that was on its way) is refused ... */
    const char *c[] = {"0@x"};
    CHECK_ERR(put_ver(u, "b2", c, 1, 2, 120, &stale), DP__ESTALE);
    CHECK_EQ(stale, 150);
    CHECK_EQ(first_byte(u, "0@x"), -1);
    /* ... one above it lands; a clear of an empty row is never refused. */
    CHECK_OK(put_ver(u, "b3", c, 1, 3, 200, &stale));
    CHECK_EQ(first_byte(u, "0@x"), SEED_BYTE(3));
    uint64_t nine = 9;
    CHECK_EQ(dp__unit_release_rows_ver(u, &nine, 1, 1, &stale), 0);
    CHECK_EQ(stale, 0);
    /* An unversioned clear drops whatever the version (an older client). */
    CHECK_EQ(dp__unit_release_rows(u, g, 1), 1);
    CHECK_EQ(dp_test_unit_stats(u).versions_refused, 2);
    dp_test_unit_check(u);
    dp__unit_destroy(u);
}

DP_TEST(a_repair_copy_older_than_a_clear_is_skipped)
{
    dp__unit *u = mk_replica_unit(2, 0, 2, false);
    dp_detail d;
    dp_detail_clear(&d);
    uint64_t stale = 0, g[] = {0, 1};
    CHECK_EQ(dp__unit_release_rows_ver(u, g, 2, 150, &stale), 0);
    /* Copies read before the clear (140) stay out; one put after it (160) lands. */
    const char *b[] = {"0@x", "1@x"};
    uint64_t vers[] = {140, 160};
    CHECK_OK_D(put_repair_vers(u, "r1", b, 2, 2, vers, 2, &d), &d);
    CHECK_EQ(first_byte(u, "0@x"), -1);
    CHECK_EQ(first_byte(u, "1@x"), SEED_BYTE(2) + 7);
    dp__unit_stats st = dp_test_unit_stats(u);
    CHECK_EQ(st.repair_keys, 1);
    CHECK_EQ(st.repair_skipped, 1);
    dp__unit_destroy(u);
}

/* ---- through the handler: ver in commit and put, "Stale" with ver back ---- */

DP_TEST(stale_travels_the_wire)
{
    dp__unit *u = mk_unit(1 << 20, 1, 0);
    dp__buf out = {0};
    dp__wire_request q;
    dp__wire_reply r;
    memset(&q, 0, sizeof q);
    q.rid = dp__wire_s("r1");
    const char *keys[] = {"3@obs"};
    tblob t1 = mk_blob(keys, 1, 64, 1), t2 = mk_blob(keys, 1, 64, 2);
    uint64_t inc = dp__unit_incarnation(u);

    /* An inline put at 1000, then one at 999: "Stale", with 1000. */
    q.op = DP_WIRE_OP_PUT;
    q.a.put = (dp__wire_put_args){.blob_id = dp__wire_s("ib-1"),
                                  .data = {t1.p, (uint32_t)t1.len},
                                  .n_entries = 1,
                                  .spill = true,
                                  .incarnation = inc,
                                  .ver = 1000};
    handler_call(u, &q, &r, &out);
    CHECK(r.ok && r.r.commit == DP_WIRE_COMMIT_DONE);
    dp__wire_reply_fini(&r);
    q.a.put.blob_id = dp__wire_s("ib-2");
    q.a.put.data = (dp__wire_bytes){t2.p, (uint32_t)t2.len};
    q.a.put.ver = 999;
    handler_call(u, &q, &r, &out);
    CHECK(!r.ok);
    CHECK_EQ(r.err.code, DP__ESTALE);
    CHECK(dp__wire_str_eq(r.err.kind, "Stale"));
    CHECK_EQ(r.err.ver, 1000);
    dp__wire_reply_fini(&r);
    CHECK_EQ(dp_test_unit_stats(u).allocated_bytes, (t1.len + 63) / 64 * 64);
    CHECK_EQ(dp_test_unit_stats(u).n_proto, 0);

    /* A commit at 999 after a WRITE: the same answer. */
    uint64_t off;
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_OK_D(dp_test_unit_alloc(u, "b-3", 3, t2.len, 1, false, &off, NULL, &d), &d);
    dp_test_write_blob(u, "b-3", off, t2.p, t2.len);
    memset(&q, 0, sizeof q);
    q.rid = dp__wire_s("r2");
    q.op = DP_WIRE_OP_COMMIT;
    q.a.commit = (dp__wire_commit_args){.blob_id = dp__wire_s("b-3"), .ver = 999};
    handler_call(u, &q, &r, &out);
    CHECK(!r.ok && r.err.code == DP__ESTALE && r.err.ver == 1000);
    dp__wire_reply_fini(&r);
    /* Other errors carry no version. */
    q.rid = dp__wire_s("r3");
    q.a.commit.blob_id = dp__wire_s("nope");
    handler_call(u, &q, &r, &out);
    CHECK(r.ok && r.r.commit == DP_WIRE_COMMIT_LOST);
    dp__wire_reply_fini(&r);
    CHECK_EQ(dp_test_unit_stats(u).versions_refused, 2);
    dp_test_unit_check(u);
    free(t1.p);
    free(t2.p);
    dp__buf_fini(&out);
    dp__unit_destroy(u);
}
