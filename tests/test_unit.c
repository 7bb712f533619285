/*
 * Tests for src/unit, in process: the core (alloc, commit, resolve, release,
 * overwrite, pins, quarantine, leases, abort) against a fake clock; a
 * randomised model test of invariant 1 (no region is handed out again while a
 * transfer into or out of it may still run); rows wider than the inline
 * slots; the ticker thread; NUMA bind mode; threads hammering one unit; and
 * the regions of writers that are gone. The control-message handler is in
 * test_unit_handler.c, a unit served over real ZMQ and UCX in test_unit_zmq.c.
 */
#include "dp_test.h"
#include "dp_tsan_ucx.h"
#include "dp_unit_blob.h"
#include "dp_unit_fixture.h"

#include <math.h>
#include <numa.h>
#include <numaif.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "blob/blob.h"
#include "common/common.h"
#include "unit/unit.h"
#include "wire/wire.h"

/* ---- core tests ---- */

DP_TEST(put_resolve_read)
{
    dp__unit *u = mk_unit(1 << 20, 2, 0);
    const char *keys[] = {"0@input_ids", "2@input_ids", "4@reward"};
    tblob t = mk_blob(keys, 3, 256, 5);
    uint64_t off = put_blob(u, "b1", &t);

    dp__wire_str q[] = {dp__wire_s("2@input_ids"), dp__wire_s("0@input_ids"),
                        dp__wire_s("6@input_ids"), dp__wire_s("4@reward"),
                        dp__wire_s("0@nope")};
    dp__unit_resolve_keys_res r;
    dp_detail d;
    dp_detail_clear(&d);
    dp__unit_lock(u);
    CHECK_OK_D(dp__unit_resolve_keys_locked(u, q, 5, &r, &d), &d);
    dp__unit_unlock(u);
    CHECK_EQ(r.n_entries, 3);
    CHECK_EQ(r.n_missing, 2);
    CHECK(r.pin_id[0] != '\0');
    CHECK(dp__wire_str_eq(r.missing[0], "6@input_ids"));
    CHECK(dp__wire_str_eq(r.missing[1], "0@nope"));
    for (uint32_t i = 0; i < r.n_entries; i++) {
        dp__wire_key_loc *l = &r.entries[i];
        CHECK_EQ(l->len, 256);
        CHECK(dp__wire_str_eq(l->kind, "tensor"));
        CHECK(dp__wire_str_eq(l->dtype, "float32"));
        CHECK_EQ(l->ndim, 1);
        CHECK_EQ(l->shape[0], 64);
        CHECK(l->off >= off && l->off + l->len <= off + t.len);
        /* The bytes at the resolved offset are that key's payload. */
        uint32_t idx = dp__wire_str_eq(l->key, "0@input_ids")   ? 0
                       : dp__wire_str_eq(l->key, "2@input_ids") ? 1
                                                                : 2;
        const uint8_t *p = dp__unit_slab(u) + l->off;
        for (uint64_t k = 0; k < 256; k++)
            CHECK_EQ(p[k], (uint8_t)(5 * 31 + idx * 7 + k));
    }
    dp__unit_stats s = dp_test_unit_stats(u);
    CHECK_EQ(s.pins, 1);
    CHECK_EQ(s.entries, 3);
    CHECK_EQ(s.rows, 3);
    dp__unit_unpin(u, r.pin_id, strlen(r.pin_id));
    dp__unit_unpin(u, r.pin_id, strlen(r.pin_id)); /* unknown now: no-op */
    dp__unit_unpin(u, "nope", 4);
    CHECK_EQ(dp_test_unit_stats(u).pins, 0);
    dp__unit_resolve_keys_res_fini(&r);

    /* resolve by blob id */
    dp__wire_str ids[] = {dp__wire_s("b1"), dp__wire_s("zz"), dp__wire_s("b1")};
    dp__unit_resolve_res rr;
    dp__unit_lock(u);
    CHECK_OK_D(dp__unit_resolve_locked(u, ids, 3, &rr, &d), &d);
    dp__unit_unlock(u);
    CHECK_EQ(rr.n_blobs, 2);
    CHECK_EQ(rr.blobs[0].off, off);
    CHECK_EQ(rr.blobs[0].len, t.len);
    CHECK_EQ(rr.n_missing, 1);
    CHECK_EQ(dp_test_unit_stats(u).pins, 1);
    dp_test_unit_check(u);
    dp__unit_unpin(u, rr.pin_id, strlen(rr.pin_id));
    dp__unit_resolve_res_fini(&rr);

    /* A key of another unit or a malformed key is a Protocol error. */
    dp__wire_str bad[] = {dp__wire_s("0@input_ids"), dp__wire_s("1@input_ids")};
    dp__unit_lock(u);
    CHECK_ERR(dp__unit_resolve_keys_locked(u, bad, 2, &r, &d), DP_EPROTO);
    bad[1] = dp__wire_s("01@x");
    CHECK_ERR(dp__unit_resolve_keys_locked(u, bad, 2, &r, &d), DP_EPROTO);
    dp__unit_unlock(u);
    CHECK_EQ(dp_test_unit_stats(u).pins, 0);
    dp_test_unit_check(u);
    free(t.p);
    dp__unit_destroy(u);
}

DP_TEST(commit_idempotent_and_lost)
{
    dp__unit *u = mk_unit(1 << 20, 1, 0);
    const char *keys[] = {"1@a"};
    put_keys(u, "b", keys, 1, 64, 1);
    dp__wire_commit_state st;
    CHECK_OK(dp__unit_commit(u, "b", 1, &st, NULL));
    CHECK_EQ(st, DP_WIRE_COMMIT_DONE);
    CHECK_OK(dp__unit_commit(u, "nope", 4, &st, NULL));
    CHECK_EQ(st, DP_WIRE_COMMIT_LOST);
    CHECK_EQ(dp_test_unit_stats(u).n_commit, 1);
    /* an alloc for a committed id is refused; abort of a published blob is a no-op */
    uint64_t off;
    CHECK_ERR(dp_test_unit_alloc(u, "b", 1, 64, 0, false, &off, NULL, NULL), DP_EPROTO);
    dp__unit_abort(u, "b", 1, true);
    CHECK_EQ(dp_test_unit_stats(u).published, 1);
    CHECK_EQ(dp_test_unit_stats(u).retired_bytes, 0);
    /* bad ids */
    CHECK_ERR(dp_test_unit_alloc(u, "a/b", 3, 64, 0, false, &off, NULL, NULL), DP_EPROTO);
    CHECK_ERR(dp_test_unit_alloc(u, "", 0, 64, 0, false, &off, NULL, NULL), DP_EPROTO);
    CHECK_ERR(dp_test_unit_alloc(u, "x", 1, 0, 0, false, &off, NULL, NULL), DP_EPROTO);
    CHECK_ERR(dp_test_unit_alloc(u, "x", 1, 2 << 20, 0, false, &off, NULL, NULL),
              DP_EPROTO);
    /* release of the row: the commit is lost from then on */
    uint64_t g = 1;
    CHECK_EQ(dp__unit_release_rows(u, &g, 1), 1);
    CHECK_OK(dp__unit_commit(u, "b", 1, &st, NULL));
    CHECK_EQ(st, DP_WIRE_COMMIT_LOST);
    dp_test_unit_check(u);
    dp__unit_destroy(u);
}

DP_TEST(alloc_retry_same_id)
{
    dp__unit *u = mk_unit(1 << 20, 1, 0);
    uint64_t a, b;
    CHECK_OK(dp_test_unit_alloc(u, "x", 1, 1000, 0, false, &a, NULL, NULL));
    CHECK_OK(dp_test_unit_alloc(u, "x", 1, 1000, 0, false, &b, NULL, NULL));
    CHECK_EQ(a, b);
    CHECK_ERR(dp_test_unit_alloc(u, "x", 1, 2000, 0, false, &b, NULL, NULL), DP_EPROTO);
    CHECK_EQ(dp_test_unit_stats(u).blobs, 1);
    dp_test_unit_check(u);
    dp__unit_destroy(u);
}

DP_TEST(overwrite_and_release)
{
    dp__unit *u = mk_unit(1 << 20, 1, 0);
    const char *k1[] = {"0@x", "1@x", "1@y"};
    const char *k2[] = {"0@x"};
    uint64_t off1 = put_keys(u, "b1", k1, 3, 100, 1);
    uint64_t off2 = put_keys(u, "b2", k2, 1, 100, 2);
    CHECK(off1 != off2);
    uint64_t o, l;
    CHECK(locate(u, "0@x", &o, &l, NULL));
    CHECK(o >= off2 && o < off2 + 4096); /* 0@x now in b2 */
    CHECK(locate(u, "1@x", &o, &l, NULL));
    CHECK(o >= off1 && o < off1 + 4096);
    CHECK_EQ(dp_test_unit_stats(u).published, 2);
    CHECK_EQ(dp_test_unit_stats(u).entries, 3);
    dp_test_unit_check(u);
    /* Row 1 holds b1's last two refs: releasing it frees b1 at once (no pins). */
    uint64_t allocated = dp_test_unit_stats(u).allocated_bytes;
    uint64_t g[] = {1, 77, 1};
    CHECK_EQ(dp__unit_release_rows(u, g, 3), 2);
    CHECK_EQ(dp_test_unit_stats(u).published, 1);
    CHECK(dp_test_unit_stats(u).allocated_bytes < allocated);
    CHECK_EQ(dp_test_unit_stats(u).quarantined_bytes, 0);
    CHECK(!locate(u, "1@x", &o, &l, NULL));
    CHECK_EQ(dp__unit_release_rows(u, g, 3), 0);
    /* Overwrite b2's only key with b3: b2 is freed. */
    put_keys(u, "b3", k2, 1, 50, 3);
    CHECK_EQ(dp_test_unit_stats(u).published, 1);
    CHECK(locate(u, "0@x", &o, &l, NULL));
    CHECK_EQ(l, 50);
    dp_test_unit_check(u);
    uint64_t g0 = 0;
    CHECK_EQ(dp__unit_release_rows(u, &g0, 1), 1);
    CHECK_EQ(dp_test_unit_stats(u).allocated_bytes, 0);
    CHECK_EQ(dp_test_unit_stats(u).rows, 0);
    dp_test_unit_check(u);
    dp__unit_destroy(u);
}

/* Corrupt copies of a valid blob: each is refused and publishes nothing. */
DP_TEST(commit_rejects_bad_blobs)
{
    dp__unit *u = mk_unit(1 << 20, 2, 1);
    const char *keys[] = {"1@a", "3@a"};
    tblob t = mk_blob(keys, 2, 128, 9);
    const char *other[] = {"1@a", "2@a"}; /* 2 belongs to unit 0 */
    tblob t_other = mk_blob(other, 2, 128, 9);
    struct {
        const char *what;
        size_t at; /* byte to flip, or SIZE_MAX */
        tblob *src;
        uint64_t decl; /* n_entries announced at alloc */
    } cases[] = {
        {"bad magic", 0, &t, 2},
        {"bad version", 8, &t, 2},
        {"index crc", 40, &t, 2},
        {"index byte (the index lies)", 70, &t, 2},
        {"total_len", 32, &t, 2},
        {"names another incarnation", 48, &t, 2},
        {"names another allocation (stale bytes)", 56, &t, 2},
        {"key of another unit", SIZE_MAX, &t_other, 2},
        {"entry count differs from alloc", SIZE_MAX, &t, 3},
    };
    for (size_t c = 0; c < DP_ARRAY_LEN(cases); c++) {
        char id[16];
        snprintf(id, sizeof id, "bad%zu", c);
        uint64_t off;
        tblob *s = cases[c].src;
        CHECK_OK(dp_test_unit_alloc(u, id, strlen(id), s->len, cases[c].decl, false, &off,
                                    NULL, NULL));
        dp_test_write_blob(u, id, off, s->p, s->len);
        if (cases[c].at != SIZE_MAX)
            dp__unit_slab(u)[off + cases[c].at] ^= 0x5a;
        dp__wire_commit_state st;
        dp_detail d;
        dp_detail_clear(&d);
        int rc = dp__unit_commit(u, id, strlen(id), &st, &d);
        CHECKF(rc == DP_EPROTO, "%s: got %s", cases[c].what, dp_errname(rc));
        CHECK(dp_detail_msg(&d)[0] != '\0');
        CHECK_EQ(dp_test_unit_stats(u).published, 0);
        CHECK_EQ(dp_test_unit_stats(u).entries, 0);
        dp_test_unit_check(u);
        /* The allocation stays; a good blob written there later commits. */
        if (c == 0) {
            dp_test_write_blob(u, id, off, t.p, t.len);
            CHECK_OK(dp__unit_commit(u, id, strlen(id), &st, NULL));
            CHECK_EQ(st, DP_WIRE_COMMIT_DONE);
            uint64_t g[] = {1, 3};
            CHECK_EQ(dp__unit_release_rows(u, g, 2), 2);
        } else {
            dp__unit_abort(u, id, strlen(id), false);
        }
    }
    CHECK_EQ(dp_test_unit_stats(u).allocated_bytes, 0);
    CHECK(dp_test_unit_stats(u).n_proto >= DP_ARRAY_LEN(cases));
    free(t.p);
    free(t_other.p);
    dp__unit_destroy(u);
}

DP_TEST(abort_semantics)
{
    dp__unit *u = mk_unit(1 << 20, 1, 0);
    uint64_t a, b;
    CHECK_OK(dp_test_unit_alloc(u, "a", 1, 1000, 0, false, &a, NULL, NULL));
    CHECK_OK(dp_test_unit_alloc(u, "b", 1, 1000, 0, false, &b, NULL, NULL));
    dp__unit_abort(u, "a", 1, false); /* freed */
    dp__unit_abort(u, "b", 1, true);  /* retired */
    dp__unit_abort(u, "zz", 2, true); /* unknown: no-op */
    dp__unit_stats s = dp_test_unit_stats(u);
    CHECK_EQ(s.blobs, 0);
    CHECK_EQ(s.retired_bytes, 1024);
    CHECK_EQ(s.n_retired, 1);
    CHECK_EQ(s.allocated_bytes, 1024); /* the retired region is never freed */
    dp__wire_commit_state st;
    CHECK_OK(dp__unit_commit(u, "b", 1, &st, NULL));
    CHECK_EQ(st, DP_WIRE_COMMIT_LOST);
    /* The retired region is never handed out again: fill the slab. */
    for (int i = 0;; i++) {
        char id[16];
        snprintf(id, sizeof id, "f%d", i);
        uint64_t off;
        int rc = dp_test_unit_alloc(u, id, strlen(id), 1000, 0, false, &off, NULL, NULL);
        if (rc != 0) {
            CHECK_EQ(rc, DP_EUNITFULL);
            break;
        }
        CHECK(off + 1024 <= b || off >= b + 1024);
    }
    dp_test_unit_check(u);
    dp__unit_destroy(u);
}

DP_TEST(lease_expiry_retires)
{
    dp__unit *u = mk_unit(1 << 20, 1, 0);
    uint64_t a;
    CHECK_OK(dp_test_unit_alloc(u, "late", 4, 5000, 0, false, &a, NULL, NULL));
    fake_t += 59;
    dp__unit_tick(u);
    CHECK_EQ(dp_test_unit_stats(u).blobs, 1);
    fake_t += 2;
    dp__unit_tick(u);
    dp__unit_stats s = dp_test_unit_stats(u);
    CHECK_EQ(s.blobs, 0);
    CHECK_EQ(s.leases_expired, 1);
    CHECK_EQ(s.retired_bytes, 5056);
    CHECK_EQ(s.allocated_bytes, 5056);
    /* The writer comes back too late: its commit is lost. */
    const char *keys[] = {"0@a"};
    tblob t = mk_blob(keys, 1, 64, 1);
    memcpy(dp__unit_slab(u) + a, t.p, t.len);
    dp__wire_commit_state st;
    CHECK_OK(dp__unit_commit(u, "late", 4, &st, NULL));
    CHECK_EQ(st, DP_WIRE_COMMIT_LOST);
    /* Committed blobs are not subject to the lease. */
    put_blob(u, "ok", &t);
    fake_t += 1000;
    dp__unit_tick(u);
    CHECK_EQ(dp_test_unit_stats(u).published, 1);
    free(t.p);
    dp_test_unit_check(u);
    dp__unit_destroy(u);
}

/* Invariant 1: a released blob's region is not reused while it is pinned. */
DP_TEST(no_reuse_while_pinned)
{
    dp__unit *u = mk_unit(64 * 1024, 1, 0);
    const char *keys[] = {"0@a"};
    tblob t = mk_blob(keys, 1, 60 * 1024, 1);
    uint64_t off = put_blob(u, "big", &t);
    char pin[33];
    uint64_t o, l;
    CHECK(locate(u, "0@a", &o, &l, pin));
    uint64_t g = 0;
    CHECK_EQ(dp__unit_release_rows(u, &g, 1), 1);
    dp__unit_stats s = dp_test_unit_stats(u);
    CHECK_EQ(s.zombies, 1);
    CHECK_EQ(s.zombie_bytes, t.len);
    CHECK_EQ(s.published, 0);
    dp_test_unit_check(u);
    /* No room while the reader holds its pin: Busy (pins), not UnitFull. */
    uint64_t a;
    const char *reason = NULL;
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_ERR_D(dp_test_unit_alloc(u, "n", 1, 32 * 1024, 0, false, &a, &reason, &d),
                DP_EBUSY, &d);
    CHECK_STR(reason, "pins");
    /* The reader still sees its bytes (nobody wrote there). */
    CHECK_EQ(memcmp(dp__unit_slab(u) + off, t.p, 48), 0); /* 48..63: the alloc's name */
    CHECK_EQ(memcmp(dp__unit_slab(u) + off + 64, t.p + 64, t.len - 64), 0);
    /* The reader is done: the region is free at once. */
    dp__unit_unpin(u, pin, strlen(pin));
    CHECK_EQ(dp_test_unit_stats(u).zombies, 0);
    CHECK_EQ(dp_test_unit_stats(u).quarantined_bytes, 0);
    CHECK_OK(dp_test_unit_alloc(u, "n", 1, 32 * 1024, 0, false, &a, NULL, NULL));
    CHECK_EQ(a, off);
    /* Now really full and nothing pending: UnitFull. */
    CHECK_ERR(dp_test_unit_alloc(u, "m", 1, 40 * 1024, 0, false, &a, NULL, NULL),
              DP_EUNITFULL);
    CHECK_EQ(dp_test_unit_stats(u).n_full, 1);
    dp_test_unit_check(u);
    free(t.p);
    dp__unit_destroy(u);
}

/* A pin that expires sends its region through quarantine before reuse. */
DP_TEST(pin_expiry_quarantine)
{
    dp__unit *u = mk_unit(64 * 1024, 1, 0);
    const char *keys[] = {"0@a"};
    tblob t = mk_blob(keys, 1, 60 * 1024, 1);
    uint64_t off = put_blob(u, "big", &t);
    char pin[33];
    uint64_t o, l;
    CHECK(locate(u, "0@a", &o, &l, pin));
    uint64_t g = 0;
    dp__unit_release_rows(u, &g, 1);
    fake_t += 9.5;
    dp__unit_tick(u);
    CHECK_EQ(dp_test_unit_stats(u).pins, 1);
    fake_t += 1;
    dp__unit_tick(u); /* the pin expired (10 s): quarantine for 5 s */
    dp__unit_stats s = dp_test_unit_stats(u);
    CHECK_EQ(s.pins, 0);
    CHECK_EQ(s.pins_expired, 1);
    CHECK_EQ(s.zombies, 0);
    CHECK_EQ(s.quarantined_bytes, t.len);
    uint64_t a;
    const char *reason = NULL;
    CHECK_ERR(dp_test_unit_alloc(u, "n", 1, 8192, 0, false, &a, &reason, NULL), DP_EBUSY);
    CHECK_STR(reason, "quarantine");
    /* Unpinning the expired pin later is a no-op. */
    dp__unit_unpin(u, pin, strlen(pin));
    fake_t += 4;
    dp__unit_tick(u);
    CHECK_ERR(dp_test_unit_alloc(u, "n", 1, 8192, 0, false, &a, NULL, NULL), DP_EBUSY);
    fake_t += 1.5;
    /* alloc sweeps due quarantine itself, without waiting for the ticker. */
    CHECK_OK(dp_test_unit_alloc(u, "n", 1, 8192, 0, false, &a, NULL, NULL));
    CHECK_EQ(a, off);
    dp_test_unit_check(u);
    free(t.p);
    dp__unit_destroy(u);
}

/* A live blob whose pin expired is quarantined when released later, unpinned. */
DP_TEST(expired_pin_then_release)
{
    dp__unit *u = mk_unit(64 * 1024, 1, 0);
    const char *keys[] = {"0@a"};
    tblob t = mk_blob(keys, 1, 1000, 1);
    put_blob(u, "b", &t);
    uint64_t o, l;
    char pin[33];
    CHECK(locate(u, "0@a", &o, &l, pin));
    fake_t += 11;
    dp__unit_tick(u);
    CHECK_EQ(dp_test_unit_stats(u).pins, 0);
    CHECK_EQ(dp_test_unit_stats(u).quarantined_bytes, 0); /* still live */
    uint64_t g = 0;
    dp__unit_release_rows(u, &g, 1);
    CHECK_EQ(dp_test_unit_stats(u).quarantined_bytes, t.len);
    fake_t += 6;
    dp__unit_tick(u);
    CHECK_EQ(dp_test_unit_stats(u).quarantined_bytes, 0);
    CHECK_EQ(dp_test_unit_stats(u).allocated_bytes, 0);
    dp_test_unit_check(u);
    free(t.p);
    dp__unit_destroy(u);
}

/* Two pins on one released blob: freed only when both end. */
DP_TEST(two_pins_one_blob)
{
    dp__unit *u = mk_unit(64 * 1024, 1, 0);
    const char *keys[] = {"0@a", "0@b"};
    tblob t = mk_blob(keys, 2, 1000, 1);
    put_blob(u, "b", &t);
    uint64_t o, l;
    char p1[33], p2[33];
    CHECK(locate(u, "0@a", &o, &l, p1));
    CHECK(locate(u, "0@b", &o, &l, p2));
    uint64_t g = 0;
    CHECK_EQ(dp__unit_release_rows(u, &g, 1), 2);
    CHECK_EQ(dp_test_unit_stats(u).zombies, 1);
    dp__unit_unpin(u, p1, strlen(p1));
    CHECK_EQ(dp_test_unit_stats(u).zombies, 1);
    CHECK_EQ(dp_test_unit_stats(u).allocated_bytes, t.len);
    dp_test_unit_check(u);
    dp__unit_unpin(u, p2, strlen(p2));
    CHECK_EQ(dp_test_unit_stats(u).zombies, 0);
    CHECK_EQ(dp_test_unit_stats(u).allocated_bytes, 0);
    /* The blob id is free for a new alloc even while a zombie is pinned. */
    CHECK(locate(u, "0@a", &o, &l, NULL) == false);
    put_blob(u, "b", &t);
    CHECK(locate(u, "0@a", &o, &l, p1));
    CHECK_EQ(dp__unit_release_rows(u, &g, 1), 2);
    put_blob(u, "b", &t);
    CHECK_EQ(dp_test_unit_stats(u).zombies, 1);
    dp_test_unit_check(u);
    free(t.p);
    dp__unit_destroy(u); /* frees the zombie through its pin */
}

/*
 * Model test of invariant 1: random allocs, writes, commits, aborts, resolves,
 * unpins, releases and clock steps. The model keeps every region a transfer
 * may still touch: uncommitted allocations (a WRITE may run), retired ones
 * (forever), regions of blobs read under a pin (until the pin is unpinned, or
 * until pin expiry + quarantine). No new allocation may overlap any of them.
 */
typedef struct mregion {
    uint64_t off, len;
    double until; /* INFINITY: until the model says otherwise */
    int kind;     /* 0 uncommitted, 1 retired, 2 read by pin */
    int pin;      /* for kind 2: model pin index */
    bool live;
} mregion;

enum { MODEL_MAXR = 4096, MODEL_MAXB = 64, MODEL_MAXP = 64 };

typedef struct model {
    dp__unit *u;
    uint64_t rs;
    mregion reg[MODEL_MAXR];
    int nreg;
    struct {
        char id[16];
        uint64_t off, len;
        bool used, committed;
    } blobs[MODEL_MAXB];
    struct {
        char id[33];
        bool used;
        double t; /* when the pin was made */
    } pins[MODEL_MAXP];
    int next_id;
    /*
     * What the run exercised, asserted at the end: allocations checked
     * against live regions of each kind (uncommitted, retired, read by a
     * pin), commits, aborts with and without a WRITE in flight, pins made,
     * unpinned and expired.
     */
    struct {
        int allocs, vs_kind[3], commits, aborts, aborts_in_flight, pins, unpins, expired;
    } ran;
} model;

/*
 * Each step below returns false when it found nothing to do (a slot in use or
 * empty, the unit full): such a step ends there, as if it had not happened.
 */

/* Alloc a blob of 1 to 3 keys and WRITE it; it must not overlap a live region. */
static bool
model_alloc(model *m, int step)
{
    int bi = (int)(dp_test_rand(&m->rs) % MODEL_MAXB);
    if (m->blobs[bi].used)
        return false;
    uint32_t nk = 1 + (uint32_t)(dp_test_rand(&m->rs) % 3);
    char kb[3][32];
    const char *keys[3];
    for (uint32_t k = 0; k < nk; k++) {
        snprintf(kb[k], sizeof kb[k], "%u@f%u", (unsigned)(dp_test_rand(&m->rs) % 16), k);
        keys[k] = kb[k];
    }
    tblob t = mk_blob(keys, nk, 64 + dp_test_rand(&m->rs) % 8000, (uint32_t)step);
    snprintf(m->blobs[bi].id, sizeof m->blobs[bi].id, "m%d", m->next_id++);
    uint64_t off;
    int rc = dp_test_unit_alloc(m->u, m->blobs[bi].id, strlen(m->blobs[bi].id), t.len, nk,
                                false, &off, NULL, NULL);
    if (rc != 0) {
        CHECKF(rc == DP_EBUSY || rc == DP_EUNITFULL, "alloc: %s", dp_errname(rc));
        free(t.p);
        return false;
    }
    m->ran.allocs++;
    bool vs[3] = {false, false, false};
    for (int r = 0; r < m->nreg; r++)
        vs[m->reg[r].kind] = vs[m->reg[r].kind] || m->reg[r].live;
    for (int k = 0; k < 3; k++)
        m->ran.vs_kind[k] += vs[k];
    for (int r = 0; r < m->nreg; r++) {
        const mregion *g = &m->reg[r];
        if (g->live && off < g->off + g->len && g->off < off + t.len)
            CHECKF(false,
                   "step %d: alloc [%" PRIu64 ", +%" PRIu64 ") overlaps protected region "
                   "%d [%" PRIu64 ", +%" PRIu64 ") kind %d",
                   step, off, t.len, r, g->off, g->len, g->kind);
    }
    dp_test_write_blob(m->u, m->blobs[bi].id, off, t.p, t.len);
    free(t.p);
    m->blobs[bi].used = true;
    m->blobs[bi].committed = false;
    m->blobs[bi].off = off;
    m->blobs[bi].len = t.len;
    if (m->nreg < MODEL_MAXR)
        m->reg[m->nreg++] = (mregion){off, t.len, INFINITY, 0, -1, true};
    return true;
}

/* Commit or abort an uncommitted blob. */
static bool
model_end_write(model *m)
{
    int bi = (int)(dp_test_rand(&m->rs) % MODEL_MAXB), tries = 0;
    while ((!m->blobs[bi].used || m->blobs[bi].committed) && tries++ < MODEL_MAXB)
        bi = (bi + 1) % MODEL_MAXB;
    if (!m->blobs[bi].used || m->blobs[bi].committed)
        return false;
    const char *id = m->blobs[bi].id;
    /* mostly commits; some aborts, an eighth of them with the WRITE in flight */
    int how = (int)(dp_test_rand(&m->rs) % 16);
    how = how < 12 ? 0 : how < 14 ? 3 : how < 15 ? 2 : 1;
    /* after: 0 = no longer protected, 1 = retired for ever */
    int after;
    if (how <= 1) {
        dp__wire_commit_state st;
        dp_detail d;
        dp_detail_clear(&d);
        CHECK_OK_D(dp__unit_commit(m->u, id, strlen(id), &st, &d), &d);
        m->blobs[bi].committed = st == DP_WIRE_COMMIT_DONE;
        m->ran.commits += m->blobs[bi].committed;
        if (st != DP_WIRE_COMMIT_DONE)
            m->blobs[bi].used = false; /* retired by the lease meanwhile */
        after = st == DP_WIRE_COMMIT_DONE ? 0 : 1;
    } else {
        dp__unit_abort(m->u, id, strlen(id), how == 2);
        m->blobs[bi].used = false;
        if (how == 2)
            m->ran.aborts_in_flight++;
        else
            m->ran.aborts++;
        after = how == 2 ? 1 : 0;
    }
    for (int r = 0; r < m->nreg; r++) {
        if (m->reg[r].live && m->reg[r].kind == 0 && m->reg[r].off == m->blobs[bi].off) {
            m->reg[r].kind = 1;
            m->reg[r].live = after == 1;
        }
    }
    if (!m->blobs[bi].used)
        memset(&m->blobs[bi], 0, sizeof m->blobs[bi]);
    return true;
}

/* Resolve a few keys and pin what they read. */
static bool
model_resolve(model *m)
{
    int pi = (int)(dp_test_rand(&m->rs) % MODEL_MAXP);
    if (m->pins[pi].used)
        return false;
    char kb[4][32];
    dp__wire_str q[4];
    for (int k = 0; k < 4; k++) {
        snprintf(kb[k], sizeof kb[k], "%u@f%u", (unsigned)(dp_test_rand(&m->rs) % 16),
                 (unsigned)(dp_test_rand(&m->rs) % 3));
        q[k] = dp__wire_s(kb[k]);
    }
    dp__unit_resolve_keys_res r;
    dp__unit_lock(m->u);
    CHECK_OK(dp__unit_resolve_keys_locked(m->u, q, 4, &r, NULL));
    dp__unit_unlock(m->u);
    for (uint32_t e = 0; e < r.n_entries && m->nreg < MODEL_MAXR; e++)
        m->reg[m->nreg++] =
            (mregion){r.entries[e].off, r.entries[e].len, INFINITY, 2, pi, true};
    if (r.pin_id[0]) {
        m->ran.pins++;
        m->pins[pi].used = true;
        m->pins[pi].t = fake_t;
        memcpy(m->pins[pi].id, r.pin_id, 33);
    }
    dp__unit_resolve_keys_res_fini(&r);
    return true;
}

static bool
model_unpin(model *m)
{
    int pi = (int)(dp_test_rand(&m->rs) % MODEL_MAXP);
    if (!m->pins[pi].used)
        return false;
    dp__unit_unpin(m->u, m->pins[pi].id, strlen(m->pins[pi].id));
    m->pins[pi].used = false;
    m->ran.unpins++;
    for (int r = 0; r < m->nreg; r++)
        if (m->reg[r].kind == 2 && m->reg[r].pin == pi && isinf(m->reg[r].until))
            m->reg[r].live = false;
    return true;
}

/*
 * A pin made at t expires at t + 10 (read_pin_s); the ticker drops it at or
 * after that and quarantines its released regions for 5 s more, so nothing
 * read under it may be reused before t + 15.
 */
static void
model_expire_pins(model *m)
{
    for (int pi = 0; pi < MODEL_MAXP; pi++) {
        if (m->pins[pi].used && fake_t >= m->pins[pi].t + 15) {
            m->pins[pi].used = false;
            m->ran.expired++;
            for (int r = 0; r < m->nreg; r++)
                if (m->reg[r].kind == 2 && m->reg[r].pin == pi)
                    m->reg[r].live = false;
        }
    }
}

/* One random step: an op, then the pins that expired. */
static void
model_step(model *m, int step)
{
    int op = (int)(dp_test_rand(&m->rs) % 12);
    bool did = true;
    if (op <= 2) {
        did = model_alloc(m, step);
    } else if (op <= 4) {
        did = model_end_write(m);
    } else if (op <= 6) {
        did = model_resolve(m);
    } else if (op == 7) {
        did = model_unpin(m);
    } else if (op == 8) { /* release rows */
        uint64_t g[2] = {dp_test_rand(&m->rs) % 16, dp_test_rand(&m->rs) % 16};
        dp__unit_release_rows(m->u, g, 2);
    } else if (op == 9) { /* time passes */
        fake_t += (double)(dp_test_rand(&m->rs) % 4000) / 1000.0;
        dp__unit_tick(m->u);
    } else { /* a committed blob whose rows are all gone may be reused: forget it */
        int bi = (int)(dp_test_rand(&m->rs) % MODEL_MAXB);
        if (m->blobs[bi].used && m->blobs[bi].committed)
            memset(&m->blobs[bi], 0, sizeof m->blobs[bi]);
    }
    if (!did)
        return;
    model_expire_pins(m);
    if ((step % 64) == 63) {
        CHECK_OK(dp__unit_check(m->u, NULL));
        /* compact the region list */
        int w = 0;
        for (int r = 0; r < m->nreg; r++)
            if (m->reg[r].live)
                m->reg[w++] = m->reg[r];
        m->nreg = w;
    }
}

DP_TEST(model_no_reuse_under_transfer)
{
    static model m; /* 160 KiB of regions: not on the stack */
    memset(&m, 0, sizeof m);
    m.rs = dp_test_seed();
    m.u = mk_unit(384 * 1024, 1, 0);
    dp__log_set_level(DP_LOG_ERROR); /* lease expiries are expected here */
    for (int step = 0; step < 4000; step++)
        model_step(&m, step);
    dp__unit_stats s = dp_test_unit_stats(m.u);
    printf(
        "  model: %d allocs (%d, %d, %d checked against live uncommitted, retired and "
        "pinned regions), %d commits, %d + %d aborts, %d pins, %d unpinned, %d expired; "
        "unit: %" PRIu64 " busy, %" PRIu64 " full, %" PRIu64 " retired, %" PRIu64
        " pins expired\n",
        m.ran.allocs, m.ran.vs_kind[0], m.ran.vs_kind[1], m.ran.vs_kind[2], m.ran.commits,
        m.ran.aborts, m.ran.aborts_in_flight, m.ran.pins, m.ran.unpins, m.ran.expired,
        s.n_busy, s.n_full, s.n_retired, s.pins_expired);
    /* The invariant was checked against every kind of region, often. */
    EXPECT_GE(m.ran.allocs, 300);
    EXPECT_GE(m.ran.vs_kind[0], 100);
    EXPECT_GE(m.ran.vs_kind[1], 100);
    EXPECT_GE(m.ran.vs_kind[2], 100);
    EXPECT_GE(m.ran.commits, 100);
    EXPECT_GE(m.ran.aborts, 10);
    EXPECT_GE(m.ran.aborts_in_flight, 5);
    EXPECT_GE(m.ran.pins, 100);
    EXPECT_GE(m.ran.unpins, 10);
    EXPECT_GE(m.ran.expired, 50);
    EXPECT_EQ_U64(s.n_commit, (uint64_t)m.ran.commits);
    dp__log_set_level(DP_LOG_INFO);
    dp_test_unit_check(m.u);
    dp__unit_destroy(m.u);
}

/*
 * Rows wider than the inline slots: 300 fields of one row in one blob, half
 * overwritten by a second blob that adds 50 more, fields named alike
 * ("f1", "f10", "f100"), every key found in the right blob, then a release.
 */
DP_TEST(wide_rows)
{
    dp__unit *u = mk_unit(8 << 20, 1, 0);
    enum { A = 300, B = 200 };
    char(*ka)[32] = calloc(A, sizeof *ka), (*kb)[32] = calloc(B, sizeof *kb);
    const char **pa = calloc(A, sizeof *pa), **pb = calloc(B, sizeof *pb);
    for (int i = 0; i < A; i++) {
        snprintf(ka[i], sizeof ka[i], "7@f%d", i);
        pa[i] = ka[i];
    }
    for (int i = 0; i < B; i++) { /* f150..f349: 150 overwrites, 50 new */
        snprintf(kb[i], sizeof kb[i], "7@f%d", 150 + i);
        pb[i] = kb[i];
    }
    uint64_t offa = put_keys(u, "wa", pa, A, 64, 1);
    dp_test_unit_check(u);
    uint64_t offb = put_keys(u, "wb", pb, B, 64, 2);
    dp_test_unit_check(u);
    CHECK_EQ(dp_test_unit_stats(u).rows, 1);
    CHECK_EQ(dp_test_unit_stats(u).entries, 350);
    for (int i = 0; i < 350; i++) {
        char key[32];
        snprintf(key, sizeof key, "7@f%d", i);
        uint64_t off, len;
        CHECKF(locate(u, key, &off, &len, NULL), "%s missing", key);
        /* The blobs do not overlap: each runs up to the other or beyond. */
        uint64_t base = i < 150 ? offa : offb, other = i < 150 ? offb : offa;
        uint64_t end = other > base ? other : UINT64_MAX;
        CHECKF(off > base && off < end, "%s in the wrong blob", key);
        CHECK_EQ(len, 64);
    }
    uint64_t g = 7;
    CHECK_EQ(dp__unit_release_rows(u, &g, 1), 350);
    dp_test_unit_check(u);
    CHECK_EQ(dp_test_unit_stats(u).rows, 0);
    CHECK_EQ(dp_test_unit_stats(u).blobs, 0);
    free(ka);
    free(kb);
    free(pa);
    free(pb);
    dp__unit_destroy(u);
}

/* The ticker thread runs maintenance on the real clock. */
DP_TEST(ticker_thread)
{
    dp__unit_opts o;
    dp__unit_opts_init(&o);
    o.slab_bytes = 1 << 20;
    o.alloc_lease_s = 0.2;
    o.numa = DP_UNIT_NUMA_AUTO;
    dp__unit *u = NULL;
    CHECK_OK(dp__unit_create(&o, &u, NULL));
    CHECK(dp__unit_numa_desc(u)[0] != '\0');
    CHECK_OK(dp__unit_start_ticker(u, 0.05, NULL));
    uint64_t off;
    CHECK_OK(dp_test_unit_alloc(u, "x", 1, 100, 0, false, &off, NULL, NULL));
    double t0 = dp_test_now();
    while (dp_test_unit_stats(u).leases_expired == 0 && dp_test_now() - t0 < 5)
        dp__sleep_s(0.02);
    CHECK_EQ(dp_test_unit_stats(u).leases_expired, 1);
    CHECK_EQ(dp_test_unit_stats(u).retired_bytes, 128);
    dp__unit_destroy(u);
}

/* ---- NUMA bind mode ---- */

/* The calling thread's memory policy; false when the kernel refuses to say. */
static bool
thread_mempolicy(int *mode, unsigned long *mask, unsigned long maxnode)
{
    memset(mask, 0, (maxnode + 63) / 64 * sizeof *mask);
    return get_mempolicy(mode, mask, maxnode, NULL, 0) == 0;
}

/* The NUMA node of each page of [p, p + len) in node[] (at most 64 pages). */
static size_t
pages_nodes(const uint8_t *p, uint64_t len, int *node)
{
    uint64_t psz = (uint64_t)sysconf(_SC_PAGESIZE);
    uintptr_t first = (uintptr_t)p / psz * psz;
    void *pages[64];
    size_t n = 0;
    for (uintptr_t a = first; a < (uintptr_t)p + len && n < 64; a += psz)
        pages[n++] = (void *)a;
    for (size_t i = 0; i < n; i++)
        node[i] = -1000;
    if (move_pages(0, (unsigned long)n, pages, NULL, node, 0) != 0)
        DP_SKIP("move_pages (query): %s: the kernel refuses page placement queries",
                strerror(errno));
    return n;
}

/*
 * NUMA bind mode (numa.c, unit.h): the unit places the thread that creates it
 * on node unit_id % nodes, CPUs and memory, and says what it did (the info
 * reply's numa). On a multi-node host (unit 1 of 2: node 1): the thread's
 * memory policy is MPOL_BIND to exactly that node, its CPUs are that node's,
 * the slab pages a put wrote are on that node, and the description is "node 1
 * of N (bind)". On a one-node host (the development machine) bind is a no-op
 * by design, and says so ("one node: no-op"): the thread keeps its memory
 * policy and its CPU affinity, which this test first narrows to one CPU so
 * that a bind to node 0's CPUs would show; the slab's pages are on node 0.
 * Either way, applying bind again (a process may place itself before its
 * unit) gives the same description and placement, and a put into the slab
 * reads back. Skipped only when the kernel refuses the placement queries, or
 * (several nodes) when this process's cpuset excludes node 1.
 */
DP_TEST(numa_bind_places_thread_and_slab)
{
    enum { MAXNODE = 1024 };
    unsigned long mask0[MAXNODE / 64], mask[MAXNODE / 64];
    int mode0 = -1, mode = -1;
    if (!thread_mempolicy(&mode0, mask0, MAXNODE))
        DP_SKIP("get_mempolicy: %s: the kernel refuses memory policy queries",
                strerror(errno));
    CHECK(numa_available() >= 0);
    int nodes = numa_num_configured_nodes();
    CHECK_GE(nodes, 1);
    cpu_set_t cpus0, cpus;
    CHECK(sched_getaffinity(0, sizeof cpus0, &cpus0) == 0);
    if (nodes == 1) {
        /* One CPU only: binding to node 0 would widen it to all of node 0's. */
        int first = 0;
        while (!CPU_ISSET(first, &cpus0))
            first++;
        CPU_ZERO(&cpus0);
        CPU_SET(first, &cpus0);
        CHECK(sched_setaffinity(0, sizeof cpus0, &cpus0) == 0);
    } else {
        /* A cpuset without node 1's memory or CPUs: the kernel refuses the bind. */
        struct bitmask *mems = numa_get_mems_allowed(), *nc = numa_allocate_cpumask();
        CHECK(mems != NULL && nc != NULL);
        CHECK(numa_node_to_cpus(1 % nodes, nc) == 0);
        bool has_mem = numa_bitmask_isbitset(mems, (unsigned)(1 % nodes)) != 0;
        bool has_cpu = false;
        for (unsigned c = 0; c < nc->size; c++)
            if (numa_bitmask_isbitset(nc, c) &&
                numa_bitmask_isbitset(numa_all_cpus_ptr, c))
                has_cpu = true;
        numa_bitmask_free(mems);
        numa_free_cpumask(nc);
        if (!has_mem || !has_cpu)
            DP_SKIP("this process's cpuset allows no %s of node %d: the kernel refuses "
                    "a bind there",
                    has_mem ? "CPU" : "memory", 1 % nodes);
    }
    dp__unit_opts o;
    dp__unit_opts_init(&o);
    o.slab_bytes = 1 << 20;
    o.n_units = 2;
    o.unit_id = 1;
    o.read_pin_s = 10;
    o.alloc_lease_s = 60;
    o.quarantine_s = 5;
    o.numa = DP_UNIT_NUMA_BIND;
    o.now = fake_now;
    dp__unit *u = NULL;
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_OK_D(dp__unit_create(&o, &u, &d), &d);
    /* A put the bound thread writes: its pages are where bind put them. */
    const char *keys[] = {"1@numa", "3@numa"};
    tblob t = mk_blob(keys, 2, 64 * 1024, 9);
    uint64_t off = put_blob(u, "numa-blob", &t);
    /* Every byte past the header (where the unit stamps the writer's token). */
    CHECK(memcmp(dp__unit_slab(u) + off + DP_BLOB_HEADER_LEN, t.p + DP_BLOB_HEADER_LEN,
                 t.len - DP_BLOB_HEADER_LEN) == 0);
    int where[64];
    size_t npages = pages_nodes(dp__unit_slab(u) + off, t.len, where);
    CHECK_GE(npages, 1);
    free(t.p);
    CHECK(thread_mempolicy(&mode, mask, MAXNODE));
    CHECK(sched_getaffinity(0, sizeof cpus, &cpus) == 0);
    if (nodes == 1) {
        CHECK_STR(dp__unit_numa_desc(u), "one node: no-op");
        CHECK_EQ(mode, mode0);
        CHECK(memcmp(mask, mask0, sizeof mask) == 0);
        CHECK(CPU_EQUAL(&cpus, &cpus0));
        for (size_t i = 0; i < npages; i++)
            CHECK_EQ(where[i], 0);
    } else {
        int node = 1 % nodes;
        char want[128];
        snprintf(want, sizeof want, "node %d of %d (bind)", node, nodes);
        CHECK_STR(dp__unit_numa_desc(u), want);
        CHECK_EQ(mode, MPOL_BIND);
        for (int k = 0; k < MAXNODE; k++)
            CHECK_EQ((mask[k / 64] >> (k % 64)) & 1, k == node);
        struct bitmask *nc = numa_allocate_cpumask();
        CHECK(nc != NULL);
        CHECK(numa_node_to_cpus(node, nc) == 0);
        CHECK_GE(CPU_COUNT(&cpus), 1);
        for (int c = 0; c < CPU_SETSIZE; c++)
            if (CPU_ISSET(c, &cpus))
                CHECKF(numa_bitmask_isbitset(nc, (unsigned)c), "CPU %d is not on node %d",
                       c, node);
        numa_free_cpumask(nc);
        for (size_t i = 0; i < npages; i++)
            CHECK_EQ(where[i], node);
    }
    /* Idempotent: the same description, policy and CPUs again. */
    char again[128];
    dp__unit_numa_apply(DP_UNIT_NUMA_BIND, 1, again, sizeof again);
    CHECK_STR(again, dp__unit_numa_desc(u));
    int mode2 = -1;
    unsigned long mask2[MAXNODE / 64];
    cpu_set_t cpus2;
    CHECK(thread_mempolicy(&mode2, mask2, MAXNODE));
    CHECK(sched_getaffinity(0, sizeof cpus2, &cpus2) == 0);
    CHECK_EQ(mode2, mode);
    CHECK(memcmp(mask2, mask, sizeof mask) == 0);
    CHECK(CPU_EQUAL(&cpus2, &cpus));
    dp__unit_destroy(u);
}

/*
 * Threads hammer one unit (real clock, ticker on, short pins and leases) with
 * every op through the handler and the core; the unit's invariants hold after
 * (and ThreadSanitizer watches the locking).
 */
typedef struct hammer_arg {
    dp__unit *u;
    int tid;
    uint64_t seed;
} hammer_arg;

static void *
hammer(void *p)
{
    hammer_arg *a = p;
    uint64_t rs = a->seed;
    dp__buf out = {0}, in = {0};
    for (int i = 0; i < 300; i++) {
        char id[32], k1[32], k2[32];
        snprintf(id, sizeof id, "t%d-%d", a->tid, i);
        snprintf(k1, sizeof k1, "%u@f", (unsigned)(dp_test_rand(&rs) % 32));
        snprintf(k2, sizeof k2, "%u@g", (unsigned)(dp_test_rand(&rs) % 32));
        const char *keys[] = {k1, k2};
        tblob t = mk_blob(keys, 2, 64 + dp_test_rand(&rs) % 2000, (uint32_t)i);
        uint64_t off;
        if (dp_test_unit_alloc(a->u, id, strlen(id), t.len, 2, false, &off, NULL, NULL) ==
            0) {
            int how = (int)(dp_test_rand(&rs) % 8);
            if (how < 6) {
                dp_test_write_blob(a->u, id, off, t.p, t.len);
                dp__wire_commit_state st;
                dp__unit_commit(a->u, id, strlen(id), &st, NULL);
            } else if (how == 6) {
                dp__unit_abort(a->u, id, strlen(id), dp_test_rand(&rs) % 2 == 0);
            } /* else: left for the lease */
        }
        free(t.p);
        /* resolve through the handler, unpin some of the pins */
        dp__wire_str ks[] = {dp__wire_s(k1), dp__wire_s(k2)};
        dp__wire_request q;
        memset(&q, 0, sizeof q);
        q.op = DP_WIRE_OP_RESOLVE_KEYS;
        q.rid = dp__wire_s("h");
        q.a.resolve_keys.keys = (dp__wire_strs){ks, 2};
        q.a.resolve_keys.inline_bytes = 0;
        dp__buf_reset(&in);
        dp__wire_request_encode(&q, NULL, &in, NULL);
        dp__buf_reset(&out);
        dp__unit_handle(a->u, in.data, in.len, &out);
        dp__wire_reply r;
        if (dp__wire_reply_decode(out.data, out.len, q.op, NULL, &r, NULL) == 0 && r.ok &&
            r.r.resolve_keys.pin_id.n > 0 && dp_test_rand(&rs) % 2 == 0)
            dp__unit_unpin(a->u, r.r.resolve_keys.pin_id.p, r.r.resolve_keys.pin_id.n);
        dp__wire_reply_fini(&r);
        if (dp_test_rand(&rs) % 4 == 0) {
            uint64_t g = dp_test_rand(&rs) % 32;
            dp__unit_release_rows(a->u, &g, 1);
        }
        if (i % 50 == 0) {
            q.op = DP_WIRE_OP_SCAN;
            dp__buf_reset(&in);
            dp__wire_request_encode(&q, NULL, &in, NULL);
            dp__buf_reset(&out);
            dp__unit_handle(a->u, in.data, in.len, &out);
        }
    }
    dp__buf_fini(&in);
    dp__buf_fini(&out);
    return NULL;
}

DP_TEST(threads_hammer)
{
    dp__unit_opts o;
    dp__unit_opts_init(&o);
    o.slab_bytes = 1 << 20;
    o.read_pin_s = 0.05;
    o.alloc_lease_s = 0.05;
    o.quarantine_s = 0.02;
    o.numa = DP_UNIT_NUMA_OFF;
    dp__unit *u = NULL;
    CHECK_OK(dp__unit_create(&o, &u, NULL));
    CHECK_OK(dp__unit_start_ticker(u, 0.01, NULL));
    dp__log_set_level(DP_LOG_ERROR);
    enum { NT = 4 };
    pthread_t th[NT];
    hammer_arg args[NT];
    uint64_t seed = dp_test_seed();
    for (int i = 0; i < NT; i++) {
        args[i] = (hammer_arg){u, i, seed + (uint64_t)i * 7919};
        CHECK(pthread_create(&th[i], NULL, hammer, &args[i]) == 0);
    }
    for (int i = 0; i < NT; i++)
        pthread_join(th[i], NULL);
    dp__log_set_level(DP_LOG_INFO);
    dp_test_unit_check(u);
    /* Everything left ends: pins expire, leases retire, quarantine drains. */
    dp__unit_stats s = dp_test_unit_stats(u);
    double t0 = dp_test_now();
    while ((s.pins != 0 || s.zombies != 0 || s.quarantined_bytes != 0 ||
            s.blobs != s.published) &&
           dp_test_now() - t0 < 10) {
        dp__sleep_s(0.02);
        s = dp_test_unit_stats(u);
    }
    CHECK_EQ(s.pins, 0);
    CHECK_EQ(s.zombies, 0);
    CHECK_EQ(s.quarantined_bytes, 0);
    CHECK_EQ(s.blobs, s.published);
    printf("  hammer: %" PRIu64 " commits, %" PRIu64 " retired, %" PRIu64
           " busy, %" PRIu64 " full\n",
           s.n_commit, s.n_retired, s.n_busy, s.n_full);
    /* The threads did collide on the unit: commits, retirements, expired pins. */
    EXPECT_GE(s.n_commit, 200);
    EXPECT(s.n_retired > 0);
    EXPECT(s.pins_expired > 0);
    dp_test_unit_check(u);
    dp__unit_destroy(u);
}

/* ---- writers: retired regions come back when their writer is gone ---- */

static dp__wire_alloc_args
writer_alloc(const char *id, uint64_t nbytes, const char *writer, pid_t pid,
             const char *host, const char *lane)
{
    return (dp__wire_alloc_args){
        dp__wire_s(id),   nbytes,          0, false, dp__wire_s(writer), (uint64_t)pid,
        dp__wire_s(host), dp__wire_s(lane)};
}

/*
 * A same-host shared-memory writer's retired region and its open allocation
 * come back reclaim_grace_s after its process exited (a real child, watched
 * through a pidfd), not before; a TCP writer's, another host's and an
 * unnamed writer's retired regions are kept for good. Tokens: a retried
 * alloc answers the same one, a new alloc another.
 */
DP_TEST(gone_writers_regions_come_back)
{
    dp__unit *u = mk_unit(1 << 20, 1, 0);
    fflush(NULL);
    pid_t child = fork();
    CHECK(child >= 0);
    if (child == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        for (;;)
            pause();
    }
    const char *host = dp__host_key();
    CHECK(host[0] != '\0');
    dp__wire_alloc_res r1, r1b, r2, r3, r4, r5;
    dp_detail d;
    dp_detail_clear(&d);
    dp__wire_alloc_args a = writer_alloc("open", 4096, "w1", child, host, "shm");
    CHECK_OK_D(dp__unit_alloc_req(u, &a, &r1, NULL, &d), &d);
    CHECK_OK_D(dp__unit_alloc_req(u, &a, &r1b, NULL, &d), &d); /* retried */
    CHECK_EQ_U64(r1b.off, r1.off);
    CHECK_EQ_U64(r1b.token, r1.token);
    a = writer_alloc("retired", 8192, "w1", child, host, "shm");
    CHECK_OK_D(dp__unit_alloc_req(u, &a, &r2, NULL, &d), &d);
    CHECK(r2.token != r1.token);
    dp__unit_abort(u, "retired", 7, true);
    a = writer_alloc("tcp", 4096, "w2", child, host, "tcp");
    CHECK_OK_D(dp__unit_alloc_req(u, &a, &r3, NULL, &d), &d);
    dp__unit_abort(u, "tcp", 3, true);
    a = writer_alloc("far", 4096, "w3", child, "another-host/1", "shm");
    CHECK_OK_D(dp__unit_alloc_req(u, &a, &r4, NULL, &d), &d);
    dp__unit_abort(u, "far", 3, true);
    a = writer_alloc("anon", 4096, "", 0, "", "");
    CHECK_OK_D(dp__unit_alloc_req(u, &a, &r5, NULL, &d), &d);
    dp__unit_abort(u, "anon", 4, true);
    dp__unit_stats s = dp_test_unit_stats(u);
    CHECK_EQ(s.retired_bytes, 8192 + 3 * 4096);
    CHECK_EQ(s.retired_kept_bytes, 3 * 4096);
    CHECK_EQ(s.writers, 1); /* only w1's can ever be proved gone: tracked */
    /* Alive: nothing comes back (30 s: within the alloc's 60 s lease). */
    fake_t += 30;
    dp__unit_tick(u);
    s = dp_test_unit_stats(u);
    CHECK_EQ(s.retired_bytes, 8192 + 3 * 4096);
    CHECK_EQ(s.blobs, 1);
    CHECK_EQ(s.writers_gone, 0);
    /* Gone: seen at the next tick, handed back grace (5 s) later. */
    kill(child, SIGKILL);
    waitpid(child, NULL, 0);
    dp__unit_tick(u);
    s = dp_test_unit_stats(u);
    CHECK_EQ(s.writers_gone, 1);
    CHECK_EQ(s.retired_bytes, 8192 + 3 * 4096);
    fake_t += 4;
    dp__unit_tick(u);
    CHECK_EQ(dp_test_unit_stats(u).blobs, 1);
    fake_t += 2;
    dp__unit_tick(u);
    s = dp_test_unit_stats(u);
    EXPECT_EQ(s.retired_bytes, 3 * 4096);
    EXPECT_EQ(s.retired_kept_bytes, 3 * 4096);
    EXPECT_EQ(s.reclaimed_bytes, 8192);
    EXPECT_EQ(s.n_reclaimed, 1);
    EXPECT_EQ(s.allocs_reclaimed, 1);
    EXPECT_EQ(s.allocs_reclaimed_bytes, 4096);
    EXPECT_EQ(s.blobs, 0);
    EXPECT_EQ(s.allocated_bytes, 3 * 4096);
    dp__wire_commit_state st;
    CHECK_OK(dp__unit_commit(u, "open", 4, &st, NULL));
    CHECK_EQ(st, DP_WIRE_COMMIT_LOST);
    dp_test_unit_check(u);
    /* The space is reusable: the freed regions are allocated again. */
    uint64_t off;
    CHECK_OK(dp_test_unit_alloc(u, "again", 5, 8192 + 4096, 0, false, &off, NULL, NULL));
    dp__unit_destroy(u);
}
