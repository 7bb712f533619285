/*
 * Tests for read leases on a unit (docs/design.md, "Leases"), in process on a
 * fake clock: a unit answers reads only while more than half of the units
 * grant it a lease (a unit found gone counts, unless it had fenced it); a
 * grantor fences a unit at a client's request, says when its grant ends and
 * grants it nothing until it says it caught up; a fenced unit answers
 * resolve_keys and resolve_rows as fenced, no blob as whole, and no peer's list_keys.
 */
#include "dp_test.h"
#include "dp_tsan_ucx.h"
#include "dp_unit_blob.h"
#include "dp_unit_fixture.h"

#include "unit/unit.h"
#include "wire/wire.h"

/* Unit unit_id of n (R = 2) with leases of lease_s on the fake clock. */
static dp__unit *
mk_lease_unit(uint32_t n, uint32_t unit_id, double lease_s)
{
    return mk_replica_unit_lease(n, unit_id, 2, false, lease_s);
}

static bool
reads_ok(dp__unit *u)
{
    dp__unit_lock(u);
    bool ok = dp__unit_reads_ok_locked(u);
    dp__unit_unlock(u);
    return ok;
}

static void
answer(dp__unit *u, uint32_t peer, bool granted, uint64_t behind)
{
    dp__wire_lease_res r = {granted, granted ? 2000 : 0, behind};
    dp__unit_lease_answer(u, peer, fake_t, &r);
}

DP_TEST(reads_need_grants_from_more_than_half)
{
    dp__unit *u = mk_lease_unit(5, 0, 2.0);
    CHECK(!reads_ok(u)); /* no grant yet */
    answer(u, 1, true, 0);
    CHECK(!reads_ok(u)); /* itself and 1: 2 of 5 */
    answer(u, 3, true, 0);
    CHECK(reads_ok(u)); /* 3 of 5 */
    CHECK_EQ(dp_test_unit_stats(u).lease_ok, 1);
    /* A grant counts from when it was asked, less a tenth: 1.8 s. */
    fake_t += 1.7;
    CHECK(reads_ok(u));
    fake_t += 0.2;
    CHECK(!reads_ok(u));
    CHECK_EQ(dp_test_unit_stats(u).lease_ok, 0);
    /* Units found gone count if their grants still held (they fenced
     * nothing it missed): not 1 and 3, whose grants ended first. */
    dp__unit_lease_unanswered(u, 1, true);
    dp__unit_lease_unanswered(u, 3, true);
    CHECK(!reads_ok(u));
    answer(u, 1, true, 0);
    answer(u, 3, true, 0);
    fake_t += 1;
    dp__unit_lease_unanswered(u, 1, true);
    dp__unit_lease_unanswered(u, 3, true);
    fake_t += 5;
    CHECK(reads_ok(u)); /* their processes went while it held their grants */
    dp__unit_lease_unanswered(u, 3, true); /* still gone: still counts */
    CHECK(reads_ok(u));
    dp__unit_lease_unanswered(u, 3, false); /* a process listens there again */
    dp__unit_lease_unanswered(u, 1, false);
    CHECK(!reads_ok(u));
    answer(u, 3, true, 0);
    CHECK(!reads_ok(u));
    answer(u, 4, true, 0);
    CHECK(reads_ok(u));
    dp__unit_destroy(u);
}

DP_TEST(a_fenced_unit_answers_no_read_until_it_caught_up)
{
    dp__unit *u = mk_lease_unit(3, 0, 2.0);
    const char *keys[] = {"0@x", "2@x"};
    put_keys(u, "b1", keys, 2, 64, 1);
    answer(u, 1, true, 0);
    uint64_t off, len;
    CHECK(locate(u, "0@x", &off, &len, NULL));
    /* Unit 1 fenced it: denied; 2, found gone with no grant held, does not
     * count (it may have fenced it too before it went). */
    answer(u, 1, false, 77);
    dp__unit_lease_unanswered(u, 2, true);
    CHECK(!reads_ok(u));
    CHECK(dp__unit_lease_behind(u));
    dp__unit_resolve_keys_res r;
    dp__wire_str k[2] = {dp__wire_s("0@x"), dp__wire_s("5@x")};
    dp_detail d;
    dp_detail_clear(&d);
    dp__unit_lock(u);
    CHECK_OK_D(dp__unit_resolve_keys_locked(u, k, 2, &r, &d), &d);
    dp__unit_unlock(u);
    CHECK_EQ(r.n_fenced, 2); /* present or not: it cannot tell */
    CHECK_EQ(r.n_entries + r.n_missing, 0);
    CHECK_EQ(r.pin_id[0], '\0');
    dp__unit_resolve_keys_res_fini(&r);
    CHECK_EQ(dp_test_unit_stats(u).fenced_keys, 2);
    /* By row: every value's record says fenced, nothing pinned. */
    uint8_t rows[2 * DP_WIRE_ROW_LEN] = {0};
    rows[DP_WIRE_ROW_LEN] = 5; /* 0@x, 5@x */
    dp__wire_str fx = dp__wire_s("x");
    dp__unit_resolve_rows_res rr;
    dp__unit_lock(u);
    CHECK_OK_D(dp__unit_resolve_rows_locked(u, &(dp__wire_strs){&fx, 1},
                                            (dp__wire_bytes){rows, sizeof rows}, 0, &rr,
                                            &d),
               &d);
    dp__unit_unlock(u);
    CHECK_EQ(rr.n, 2);
    for (uint32_t i = 0; i < 2; i++)
        CHECK_EQ(rr.locs[i * DP_WIRE_LOC_LEN + 16], DP_WIRE_ROW_FENCED);
    CHECK_EQ(rr.pin_id[0], '\0');
    dp__unit_resolve_rows_res_fini(&rr);
    CHECK_EQ(dp_test_unit_stats(u).fenced_keys, 4);
    /* ... and no blob is whole (location hints go by key). */
    dp__unit_resolve_res rb;
    dp__wire_str id = dp__wire_s("b1");
    dp__unit_lock(u);
    CHECK_OK_D(dp__unit_resolve_locked(u, &id, 1, &rb, &d), &d);
    dp__unit_unlock(u);
    CHECK_EQ(rb.n_blobs, 1);
    CHECK_EQ(rb.n_whole, 0);
    if (rb.pin_id[0])
        dp__unit_unpin(u, rb.pin_id, strlen(rb.pin_id));
    dp__unit_resolve_res_fini(&rb);
    /* A pass that began knowing fence 77 catches it up: it says so. */
    uint64_t snap[3] = {0};
    dp__unit_lease_snapshot(u, snap);
    CHECK_EQ(snap[1], 77);
    CHECK_EQ(dp__unit_lease_done(u, 1), 0);
    dp__unit_lease_caught_up(u, snap);
    CHECK_EQ(dp__unit_lease_done(u, 1), 77);
    CHECK(!dp__unit_lease_behind(u));
    answer(u, 1, true, 0);
    CHECK(reads_ok(u));
    CHECK(locate(u, "0@x", &off, &len, NULL));
    dp__unit_destroy(u);
}

DP_TEST(a_grantor_fences_says_when_and_grants_again_once_caught_up)
{
    dp__unit *g = mk_lease_unit(3, 1, 2.0);
    dp_detail d;
    dp_detail_clear(&d);
    uint64_t wait = 0, peer = 0;
    /* A fresh process waits a whole lease: an earlier one may have granted. */
    CHECK_OK_D(dp__unit_fence(g, &peer, 1, &wait, &d), &d);
    CHECK(wait >= 2000 && wait <= 2002);
    dp__wire_lease_res r;
    CHECK_OK_D(dp__unit_lease_grant(g, 0, 0, &r, &d), &d);
    CHECK(!r.granted);
    uint64_t f1 = r.behind;
    CHECK(f1 != 0);
    fake_t += 3;
    CHECK_OK_D(dp__unit_fence(g, &peer, 1, &wait, &d), &d);
    CHECK_EQ(wait, 0); /* no grant since */
    CHECK_OK_D(dp__unit_lease_grant(g, 0, f1, &r, &d), &d);
    CHECK(!r.granted); /* a later fence: not caught up with it */
    uint64_t f2 = r.behind;
    CHECK(f2 > f1);
    CHECK_OK_D(dp__unit_lease_grant(g, 0, f2, &r, &d), &d);
    CHECK(r.granted);
    CHECK_EQ(r.lease_ms, 2000);
    fake_t += 0.5;
    CHECK_OK_D(dp__unit_fence(g, &peer, 1, &wait, &d), &d);
    CHECK(wait >= 1500 && wait <= 1502); /* its grant ends 1.5 s from now */
    CHECK_EQ(dp_test_unit_stats(g).fences, 3);
    /* Bad asks. */
    uint64_t self = 1, far = 3;
    CHECK_ERR_D(dp__unit_fence(g, &self, 1, &wait, &d), DP_EPROTO, &d);
    CHECK_ERR_D(dp__unit_fence(g, &far, 1, &wait, &d), DP_EPROTO, &d);
    CHECK_ERR_D(dp__unit_lease_grant(g, 1, 0, &r, &d), DP_EPROTO, &d);
    dp__unit_destroy(g);
    /* A unit without leases refuses both; a cluster of 2 cannot have them. */
    dp__unit *plain = mk_replica_unit(3, 1, 2, false);
    CHECK_ERR_D(dp__unit_fence(plain, &peer, 1, &wait, &d), DP_EINVAL, &d);
    CHECK_CONTAINS(dp_detail_msg(&d), "--lease");
    CHECK_ERR_D(dp__unit_lease_grant(plain, 0, 0, &r, &d), DP_EINVAL, &d);
    CHECK(reads_ok(plain));
    dp__unit_destroy(plain);
    dp__unit_opts o;
    dp__unit_opts_init(&o);
    o.slab_bytes = 1 << 20;
    o.n_units = 2;
    o.replicas = 2;
    o.lease_s = 2;
    o.numa = DP_UNIT_NUMA_OFF;
    dp__unit *u = NULL;
    CHECK_ERR_D(dp__unit_create(&o, &u, &d), DP_EINVAL, &d);
    CHECK_CONTAINS(dp_detail_msg(&d), "at least 3 units");
}

/* ---- through the handler ---- */

DP_TEST(lease_fence_and_list_keys_travel_the_wire)
{
    dp__unit *u = mk_lease_unit(3, 1, 2.0);
    dp__buf out = {0};
    dp__wire_request q;
    dp__wire_reply r;
    memset(&q, 0, sizeof q);
    q.rid = dp__wire_s("r1");
    q.op = DP_WIRE_OP_LEASE;
    q.a.lease = (dp__wire_lease_args){.unit = 2};
    handler_call(u, &q, &r, &out);
    CHECK(r.ok && r.r.lease.granted && r.r.lease.lease_ms == 2000);
    dp__wire_reply_fini(&r);
    uint64_t two = 2;
    q.op = DP_WIRE_OP_FENCE;
    q.a.fence = (dp__wire_fence_args){{&two, 1}};
    handler_call(u, &q, &r, &out);
    CHECK(r.ok && r.r.fence.wait_ms >= 2000);
    dp__wire_reply_fini(&r);
    q.op = DP_WIRE_OP_LEASE;
    q.a.lease = (dp__wire_lease_args){.unit = 2};
    handler_call(u, &q, &r, &out);
    CHECK(r.ok && !r.r.lease.granted && r.r.lease.behind != 0);
    dp__wire_reply_fini(&r);
    /* It holds no lease itself: a peer's listing is refused, its own repair's not. */
    q.op = DP_WIRE_OP_LIST_KEYS;
    q.a.list_keys = (dp__wire_list_keys_args){.unit = 0, .max_rows = 64};
    handler_call(u, &q, &r, &out);
    CHECK(!r.ok && r.err.code == DP_EBUSY);
    CHECK(memmem(r.err.msg.p, r.err.msg.n, "no read lease", 13) != NULL);
    dp__wire_reply_fini(&r);
    q.a.list_keys = (dp__wire_list_keys_args){.unit = 0, .max_rows = 64, .own = true};
    handler_call(u, &q, &r, &out);
    CHECK(r.ok);
    dp__wire_reply_fini(&r);
    dp__buf_fini(&out);
    dp__unit_destroy(u);
}
