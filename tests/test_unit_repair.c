/*
 * Tests for a unit's side of replicas and repair (src/unit/repair.c), in
 * process on a fake clock: which rows a unit holds with R copies, list_keys
 * (the rows it shares with another unit, in pages), and a repair copy's
 * commit (only keys the unit lacks, of rows not cleared since it started; a
 * copy with nothing left gives its region back), with the repair's counters.
 */
#include "dp_test.h"
#include "dp_unit_blob.h"
#include "dp_unit_fixture.h"

#include "blob/keys.h"

/* A put of keys as a repair's copy (alloc with repair, WRITE, commit). */
static void
put_repair(dp__unit *u, const char *id, const char *const *keys, uint32_t n,
           uint32_t seed)
{
    tblob t = mk_blob(keys, n, 64, seed);
    dp__wire_alloc_args a = {
        .blob_id = dp__wire_s(id), .nbytes = t.len, .n_entries = n, .repair = true};
    dp__wire_alloc_res r;
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_OK_D(dp__unit_alloc_req(u, &a, &r, NULL, &d), &d);
    dp_test_write_blob(u, id, r.off, t.p, t.len);
    dp__wire_commit_state st = DP_WIRE_COMMIT_LOST;
    CHECK_OK_D(dp__unit_commit(u, id, strlen(id), &st, &d), &d);
    CHECK_EQ(st, DP_WIRE_COMMIT_DONE);
    free(t.p);
}

/* The bytes of key: its first payload byte (mk_blob's pattern names the seed). */
static int
first_byte(dp__unit *u, const char *key)
{
    uint64_t o, l;
    if (!locate(u, key, &o, &l, NULL))
        return -1;
    return dp__unit_slab(u)[o];
}

DP_TEST(rows_on_units_with_replicas)
{
    /* R = 2 on 3 units: row g on g % 3 and (g + 1) % 3. */
    CHECK(dp__row_on_unit(4, 1, 3, 2) && dp__row_on_unit(4, 2, 3, 2));
    CHECK(!dp__row_on_unit(4, 0, 3, 2));
    CHECK(dp__row_on_unit(2, 0, 3, 2) && dp__row_on_unit(2, 2, 3, 2)); /* wraps */
    CHECK(dp__row_on_unit(7, 1, 3, 0) && !dp__row_on_unit(7, 2, 3, 1));
    CHECK(dp__row_on_unit(UINT64_MAX, (uint32_t)(UINT64_MAX % 3), 3, 1));
    /* R = 3 on 3: every unit holds every row. */
    for (uint32_t k = 0; k < 3; k++)
        CHECK(dp__row_on_unit(5, k, 3, 3));
    /* A unit takes its own rows and those of the unit before it, no others. */
    dp__unit *u = mk_replica_unit(3, 1, 2, false);
    const char *mine[] = {"0@x", "1@x", "3@x", "4@y"};
    put_keys(u, "b1", mine, 4, 64, 1);
    const char *not_mine[] = {"2@x"};
    tblob t = mk_blob(not_mine, 1, 64, 2);
    uint64_t off;
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_OK_D(dp_test_unit_alloc(u, "b2", 2, t.len, 1, false, &off, NULL, &d), &d);
    dp_test_write_blob(u, "b2", off, t.p, t.len);
    dp__wire_commit_state st;
    CHECK_ERR(dp__unit_commit(u, "b2", 2, &st, &d), DP_EPROTO);
    CHECK(strstr(dp_detail_msg(&d), "the units after it: replicas") != NULL);
    free(t.p);
    uint64_t g[] = {0, 2};
    CHECK_ERR(dp__unit_release_rows(u, g, 1) == 1 ? DP_OK : DP_EPROTO, DP_OK);
    dp__unit_destroy(u);
    /* Units refuse more copies than units, or than 3. */
    dp__unit_opts o;
    dp__unit_opts_init(&o);
    o.n_units = 2;
    o.replicas = 3;
    o.numa = DP_UNIT_NUMA_OFF;
    CHECK_ERR(dp__unit_create(&o, &u, &d), DP_EINVAL);
    o.n_units = 5;
    o.replicas = 4;
    CHECK_ERR(dp__unit_create(&o, &u, &d), DP_EINVAL);
}

/* list_keys into owned strings "k1 k2 ...", for comparing. */
static int
list(dp__unit *u, uint32_t for_unit, uint64_t from, uint32_t max_rows, char *out,
     size_t cap, uint64_t *next, bool *more)
{
    dp__unit_keys_page pg;
    dp_detail d;
    dp_detail_clear(&d);
    dp__unit_lock(u);
    int rc = dp__unit_list_keys_locked(u, for_unit, from, max_rows, &pg, &d);
    dp__unit_unlock(u);
    *next = pg.next;
    *more = pg.more;
    out[0] = '\0';
    for (uint32_t i = 0; rc == DP_OK && i < pg.keys.n; i++)
        snprintf(out + strlen(out), cap - strlen(out), "%s%.*s", i ? " " : "",
                 (int)pg.keys.v[i].n, pg.keys.v[i].p);
    free(pg.keys.v);
    free(pg.vers);
    free(pg.text);
    return rc;
}

DP_TEST(list_keys_pages_the_rows_two_units_share)
{
    dp__unit *u = mk_replica_unit(3, 1, 2, false);
    /* Unit 1 holds rows homed on 1 (shared with 2) and on 0 (shared with 0). */
    const char *keys[] = {"0@a", "0@b", "1@a", "3@a", "4@a", "6@a", "7@a", "7@b", "10@a"};
    put_keys(u, "b1", keys, 9, 64, 1);
    char s[512];
    uint64_t next = 0;
    bool more = true;
    CHECK_OK(list(u, 2, 0, 100, s, sizeof s, &next, &more));
    CHECK(strcmp(s, "1@a 4@a 7@a 7@b 10@a") == 0 ||
          strcmp(s, "1@a 4@a 7@b 7@a 10@a") == 0);
    CHECK(!more);
    CHECK_EQ(next, 11);
    CHECK_OK(list(u, 0, 0, 100, s, sizeof s, &next, &more));
    CHECK(strncmp(s, "0@", 2) == 0 && strstr(s, "3@a 6@a") != NULL && !more);
    /* Pages: two rows at a time, from where the last one ended. */
    CHECK_OK(list(u, 2, 0, 2, s, sizeof s, &next, &more));
    CHECK(strcmp(s, "1@a 4@a") == 0 && more && next == 5);
    CHECK_OK(list(u, 2, next, 2, s, sizeof s, &next, &more));
    CHECK(strstr(s, "10@a") != NULL && strncmp(s, "7@", 2) == 0 && !more);
    CHECK_OK(list(u, 2, 11, 2, s, sizeof s, &next, &more));
    CHECK(s[0] == '\0' && !more && next == 11);
    /* Itself: every row it holds. */
    CHECK_OK(list(u, 1, 0, 100, s, sizeof s, &next, &more));
    CHECK(strstr(s, "0@a") != NULL && strstr(s, "10@a") != NULL);
    /* Bad asks. */
    CHECK_ERR(list(u, 3, 0, 10, s, sizeof s, &next, &more), DP_EPROTO);
    CHECK_ERR(list(u, 0, 0, 0, s, sizeof s, &next, &more), DP_EPROTO);
    CHECK_ERR(list(u, 0, 0, 65537, s, sizeof s, &next, &more), DP_EPROTO);
    dp__unit_destroy(u);
}

DP_TEST(list_keys_pages_many_rows_in_order)
{
    /* 600 rows put in a scrambled order, in 6 blobs: every page holds the
     * next rows in order, and the pages together every row shared, once
     * (pages of 1, 5, 21 rows). */
    dp__unit *u = mk_replica_unit(4, 1, 2, false);
    enum { ROWS = 600, PER_BLOB = 100 };
    static char names[ROWS][24];
    const char *keys[PER_BLOB];
    for (uint32_t b = 0; b < ROWS / PER_BLOB; b++) {
        for (uint32_t i = 0; i < PER_BLOB; i++) {
            uint32_t k = ((b * PER_BLOB + i) * 367u) % ROWS; /* 367 is prime to 600 */
            uint32_t g = 4 * (k / 2) + k % 2; /* homed on unit 0 or 1: held by 1 */
            snprintf(names[k], sizeof names[k], "%u@a", g);
            keys[i] = names[k];
        }
        char id[8];
        snprintf(id, sizeof id, "b%u", b);
        put_keys(u, id, keys, PER_BLOB, 64, b + 1);
    }
    for (uint32_t page = 1; page <= 64; page = page * 4 + 1) {
        uint64_t from = 0, next = 0, want = 0;
        size_t seen = 0;
        bool more = true;
        static char s[65536];
        while (more) {
            CHECK_OK(list(u, 2, from, page, s, sizeof s, &next, &more));
            size_t in_page = 0;
            for (char *p = s; *p != '\0';) {
                uint64_t g = strtoull(p, &p, 10);
                /* the next row unit 1 holds that unit 2 holds too (homed on 1) */
                while (!dp__row_on_unit(want, 2, 4, 2) || !dp__row_on_unit(want, 1, 4, 2))
                    want++;
                CHECK_EQ(g, want);
                want++;
                in_page++;
                p += strcspn(p, " ");
                p += *p == ' ';
            }
            CHECK(in_page <= page && (in_page == page || !more));
            seen += in_page;
            from = next;
        }
        CHECK_EQ(seen, ROWS / 2); /* the rows homed on unit 1 */
    }
    dp__unit_destroy(u);
}

DP_TEST(a_repair_copy_publishes_only_missing_keys_of_rows_not_cleared)
{
    dp__unit *u = mk_replica_unit(3, 1, 2, true);
    CHECK_EQ(dp_test_unit_stats(u).repair_state, DP_UNIT_REPAIR_RUNNING);
    /* Written since the unit started: newer than any peer's copy. */
    const char *fresh[] = {"1@x"};
    put_keys(u, "new", fresh, 1, 64, 9);
    int fresh_byte = first_byte(u, "1@x");
    /* Row 7 is cleared while the repair runs (nothing held yet). */
    uint64_t seven = 7;
    CHECK_EQ(dp__unit_release_rows(u, &seven, 1), 0);
    CHECK_EQ(dp_test_unit_stats(u).repair_cleared, 1);
    /* The repair's copy of rows 1, 4 and 7 (read from a peer before all that). */
    const char *copy[] = {"1@x", "4@x", "4@y", "7@x"};
    put_repair(u, "r1", copy, 4, 3);
    CHECK_EQ(first_byte(u, "1@x"), fresh_byte); /* not replaced */
    CHECK(first_byte(u, "4@x") >= 0 && first_byte(u, "4@y") >= 0);
    CHECK_EQ(first_byte(u, "7@x"), -1); /* not brought back */
    dp__unit_stats s = dp_test_unit_stats(u);
    CHECK_EQ(s.repair_skipped, 2);
    CHECK_EQ(s.repair_keys, 2); /* counted by the commit: what it published */
    CHECK_EQ(s.repair_bytes, 128);
    CHECK_EQ(s.entries, 3);
    dp_test_unit_check(u);
    /* A copy with nothing left to publish gives its region back at once. */
    uint64_t before = s.allocated_bytes;
    const char *dup[] = {"1@x", "4@x"};
    put_repair(u, "r2", dup, 2, 4);
    s = dp_test_unit_stats(u);
    CHECK_EQ(s.allocated_bytes, before);
    CHECK_EQ(s.repair_skipped, 4);
    CHECK_EQ(s.repair_keys, 2);
    CHECK_EQ(s.published, 2);
    dp_test_unit_check(u);
    /* Its commit asked again (a lost reply) answers done, as a superseded spill. */
    dp__wire_commit_state st = DP_WIRE_COMMIT_LOST;
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_OK_D(dp__unit_commit(u, "r2", 2, &st, &d), &d);
    CHECK_EQ(st, DP_WIRE_COMMIT_DONE);
    /* The repair's end: the cleared row stays recorded for tomb_keep_s (a
     * copy read before its clear may still come), then is forgotten. */
    dp__unit_repair_end(u);
    s = dp_test_unit_stats(u);
    CHECK_EQ(s.repair_state, DP_UNIT_REPAIR_DONE);
    CHECK_EQ(s.repair_keys, 2);
    CHECK_EQ(s.repair_bytes, 128);
    CHECK_EQ(s.repair_cleared, 1);
    const char *late[] = {"7@x"};
    put_repair(u, "r3", late, 1, 5);
    CHECK_EQ(first_byte(u, "7@x"), -1);
    dp__unit_destroy(u);
    /* Kept 50 ms: forgotten at the next prune after that. An unversioned clear
     * after the repair records nothing; a later repair copy of row 7 (a unit
     * that repairs no more still takes only missing keys) lands. */
    dp__unit_opts o;
    dp__unit_opts_init(&o);
    o.slab_bytes = 1 << 20;
    o.n_units = 3;
    o.unit_id = 1;
    o.replicas = 2;
    o.repair = true;
    o.tomb_keep_s = 0.05;
    o.numa = DP_UNIT_NUMA_OFF;
    o.now = fake_now;
    CHECK_OK_D(dp__unit_create(&o, &u, &d), &d);
    CHECK_EQ(dp__unit_release_rows(u, &seven, 1), 0);
    CHECK_EQ(dp_test_unit_stats(u).repair_cleared, 1);
    dp__sleep_s(0.1);
    dp__unit_repair_end(u);
    CHECK_EQ(dp_test_unit_stats(u).repair_cleared, 0);
    CHECK_EQ(dp__unit_release_rows(u, &seven, 1), 0);
    CHECK_EQ(dp_test_unit_stats(u).repair_cleared, 0);
    put_repair(u, "r3", late, 1, 5);
    CHECK(first_byte(u, "7@x") >= 0);
    dp_test_unit_check(u);
    dp__unit_destroy(u);
}

DP_TEST(a_repair_that_ends_with_failures_is_partial)
{
    dp__unit *u = mk_replica_unit(2, 0, 2, true);
    dp__unit_repair_failed(u, 2);
    dp__unit_repair_end(u);
    dp__unit_stats s = dp_test_unit_stats(u);
    CHECK_EQ(s.repair_state, DP_UNIT_REPAIR_PARTIAL);
    CHECK_EQ(s.repair_failed, 2);
    CHECK_EQ(s.replicas, 2);
    dp__unit_destroy(u);
    /* Without repair asked for: state none, clears record nothing. */
    u = mk_replica_unit(2, 0, 2, false);
    uint64_t g = 4;
    dp__unit_release_rows(u, &g, 1);
    s = dp_test_unit_stats(u);
    CHECK_EQ(s.repair_state, DP_UNIT_REPAIR_NONE);
    CHECK_EQ(s.repair_cleared, 0);
    dp__unit_destroy(u);
}
