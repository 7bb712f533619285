/*
 * Tests of the one-request-per-unit layer (src/client/fanout.c) and the
 * client's control-only mode, against fake units: ZMQ control servers in
 * this process whose answers each test sets (a unit that says it is another,
 * one that restarted, one that answers with an error, one that never
 * answers), so every report can be checked word for word. Also the grouping
 * of rows by unit, as a property test over random rows (seed printed).
 */
#include "dp_test.h"

#include <stdatomic.h>
#include <string.h>

#include "client/client_int.h"
#include "client/fanout.h"
#include "common/common.h"
#include "ctl/ctl.h"
#include "dataplane/client.h"
#include "wire/wire.h"

/* ---- fake units ---- */

enum { FAKE_OK = 0, FAKE_SILENT, FAKE_BUSY };

/* Set by the test, read by the server thread: atomics. */
typedef struct fake {
    dp__ctl_server *srv;
    _Atomic uint64_t says_id, says_n; /* what its info says */
    _Atomic uint64_t incarnation;     /* what its replies carry */
    atomic_int mode;
    _Atomic uint64_t dropped; /* release_rows answers this */
    atomic_uint asked;
    atomic_uint rows; /* gidxs release_rows named */
} fake;

static void
fake_handler(void *ctx, const uint8_t *msg, size_t len, dp__buf *out)
{
    fake *f = ctx;
    dp__wire_request q;
    if (dp__wire_request_decode(msg, len, NULL, &q, NULL) != DP_OK) {
        dp__wire_request_fini(&q);
        return;
    }
    atomic_fetch_add(&f->asked, 1);
    if (f->mode == FAKE_SILENT) {
        dp__wire_request_fini(&q);
        return;
    }
    if (f->mode == FAKE_BUSY) {
        dp__wire_error e = {.code = DP_EBUSY, .msg = dp__wire_s("try later")};
        dp__wire_reply_encode_error(q.rid, f->incarnation, &e, NULL, out, NULL);
        dp__wire_request_fini(&q);
        return;
    }
    dp__wire_reply r;
    memset(&r, 0, sizeof r);
    r.op = q.op;
    r.rid = q.rid;
    r.ok = true;
    r.incarnation = f->incarnation;
    dp__wire_field counters[2] = {
        {.name = {"entries", 7}, .type = DP_WIRE_U64, .v.u = 7},
        {.name = {"unit_id", 7}, .type = DP_WIRE_U64, .v.u = f->says_id},
    };
    switch (q.op) {
    case DP_WIRE_OP_INFO:
        r.r.info.unit_id = f->says_id;
        r.r.info.n_units = f->says_n;
        r.r.info.zmq = dp__wire_s("tcp://127.0.0.1:1"); /* not read by a client */
        r.r.info.agent = dp__wire_s("fake-unit");
        r.r.info.metadata = (dp__wire_bytes){(const uint8_t *)"x", 1};
        r.r.info.slab_bytes = 1 << 20;
        r.r.info.incarnation = f->incarnation;
        r.r.info.proto = DP_WIRE_PROTO;
        break;
    case DP_WIRE_OP_STATS:
        r.r.stats = (dp__wire_fields){counters, 2};
        break;
    case DP_WIRE_OP_RELEASE_ROWS:
        atomic_fetch_add(&f->rows, q.a.release_rows.gidxs.n);
        r.r.dropped = f->dropped;
        break;
    default: {
        dp__wire_error e = {.code = DP_EPROTO, .msg = dp__wire_s("not faked")};
        dp__wire_reply_encode_error(q.rid, f->incarnation, &e, NULL, out, NULL);
        dp__wire_request_fini(&q);
        return;
    }
    }
    dp__wire_reply_encode(&r, NULL, out, NULL);
    dp__wire_request_fini(&q);
}

/* n fake units; unit i says it is unit i of n and runs incarnation 100 + i. */
static void
fakes_start(fake *fs, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++) {
        memset(&fs[i], 0, sizeof fs[i]);
        fs[i].says_id = i;
        fs[i].says_n = n;
        fs[i].incarnation = 100 + i;
        dp__ctl_server_opts o = {.bind_ip = "127.0.0.1"};
        dp_detail d;
        dp_detail_clear(&d);
        CHECK_OK_D(dp__ctl_server_open(&o, fake_handler, NULL, &fs[i], &fs[i].srv, &d),
                   &d);
    }
}

static void
fakes_stop(fake *fs, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        dp__ctl_server_close(fs[i].srv);
}

static void
cluster_of(const fake *fs, uint32_t n, dp__cluster *cl, dp__cluster_unit *us)
{
    memset(us, 0, n * sizeof *us);
    for (uint32_t i = 0; i < n; i++) {
        us[i].id = i;
        snprintf(us[i].zmq, sizeof us[i].zmq, "%s", dp__ctl_server_address(fs[i].srv));
    }
    memset(cl, 0, sizeof *cl); /* no cluster id: only index and size are checked */
    cl->n_units = n;
    cl->units = us;
}

/* info to every unit through a fanout f, with o's checks. */
static int
ask_info(dp__fanout *f, dp__ctl_client *ctl, dp__wire_rid_gen *g, const dp__cluster *cl,
         double timeout_s, const dp__fanout_opts *o)
{
    dp__fanout_reset(f);
    dp__wire_request q;
    memset(&q, 0, sizeof q);
    q.op = DP_WIRE_OP_INFO;
    for (uint32_t i = 0; i < cl->n_units; i++)
        CHECK_OK(dp__fanout_add(f, g, i, cl->units[i].zmq, 100 + i, &q));
    return dp__fanout_run(f, ctl, timeout_s, o);
}

/* ---- the fanout ---- */

/*
 * Every unit answers: one result per unit; then one says it is another
 * unit, one of another size, one answers busy, one from another process:
 * each report names the unit and its address first and says why; the
 * others' results stand.
 */
DP_TEST(fanout_reports_each_unit)
{
    fake fs[4];
    dp__cluster_unit us[4];
    dp__cluster cl;
    fakes_start(fs, 4);
    cluster_of(fs, 4, &cl, us);
    dp__ctl_client *ctl = NULL;
    CHECK_OK(dp__ctl_client_create(&ctl, NULL));
    dp__wire_rid_gen g;
    CHECK_OK(dp__wire_rid_gen_init(&g, NULL));
    dp__fanout f;
    dp_detail d;
    CHECK_OK(dp__fanout_init(&f, 4, NULL));
    dp__fanout_opts o = {.flags = DP__FANOUT_IDENTITY, .listed_by = "the list"};

    CHECK_OK(ask_info(&f, ctl, &g, &cl, 5, &o));
    CHECK_EQ(dp__fanout_failed(&f), 0);
    for (uint32_t i = 0; i < 4; i++) {
        CHECK(f.u[i].answered && f.u[i].decoded && !f.u[i].restarted);
        CHECK_EQ(f.u[i].rep.r.info.unit_id, i);
        CHECK(dp__wire_str_eq(f.u[i].rep.r.info.agent, "fake-unit"));
    }

    fs[1].says_id = 2;       /* wrong order */
    fs[2].says_n = 5;        /* another cluster's size */
    fs[3].incarnation = 999; /* another process than the one expected */
    fs[0].mode = FAKE_BUSY;  /* an error reply */
    dp_detail_clear(&d);
    CHECK_ERR(ask_info(&f, ctl, &g, &cl, 5, &o), DP_EBUSY);
    CHECK_EQ(dp__fanout_failed(&f), 3);
    CHECK_ERR(dp__fanout_first(&f, &d), DP_EBUSY);
    char want[256];
    snprintf(want, sizeof want, "unit 0 (%s): Busy: try later", us[0].zmq);
    CHECK_CONTAINS(d.msg, want);
    CHECK(strncmp(dp__fanout_why(&f.u[0]), "Busy: try later", 15) == 0);
    snprintf(want, sizeof want,
             "unit 1 (%s) says it is unit 2 of 4, but the list lists it as unit 1 of 4 "
             "(wrong order or a unit from another cluster)",
             us[1].zmq);
    CHECK_STR(f.u[1].st.det.msg, want);
    CHECK(f.u[1].misplaced);
    CHECK_EQ(f.u[1].st.rc, DP_EPROTO);
    CHECK_CONTAINS(f.u[2].st.det.msg, "says it is unit 2 of 5");
    CHECK_CONTAINS(dp__fanout_why(&f.u[2]), "says it is");
    /* Another process answered: noted, a failure only where asked. */
    CHECK_EQ(f.u[3].st.rc, DP_OK);
    CHECK(f.u[3].restarted);
    fs[0].mode = FAKE_OK;
    o.flags |= DP__FANOUT_SAME_PROCESS;
    CHECK_ERR(ask_info(&f, ctl, &g, &cl, 5, &o), DP_EPROTO);
    CHECK_EQ(f.u[3].st.rc, DP_ERESTARTED);
    CHECK_CONTAINS(f.u[3].st.det.msg, "restarted (incarnation 0000000000000067 -> "
                                      "00000000000003e7)");

    dp__fanout_fini(&f);
    dp__fanout_fini(&f); /* twice: harmless */
    dp__ctl_client_destroy(ctl);
    fakes_stop(fs, 4);
}

/*
 * A unit that never answers: the others' answers come back within the one
 * deadline, and its report says it did not answer, with the caller's hint.
 * Units left out of a batch are not asked and report nothing.
 */
DP_TEST(fanout_silent_unit_and_units_left_out)
{
    fake fs[3];
    dp__cluster_unit us[3];
    dp__cluster cl;
    fakes_start(fs, 3);
    cluster_of(fs, 3, &cl, us);
    fs[2].mode = FAKE_SILENT;
    dp__ctl_client *ctl = NULL;
    CHECK_OK(dp__ctl_client_create(&ctl, NULL));
    dp__wire_rid_gen g;
    CHECK_OK(dp__wire_rid_gen_init(&g, NULL));
    dp__fanout f;
    CHECK_OK(dp__fanout_init(&f, 3, NULL));
    dp__fanout_opts o = {.silence_hint = ": is it running?"};
    double t0 = dp__now_s();
    CHECK_ERR(ask_info(&f, ctl, &g, &cl, 0.5, &o), DP_ETIMEDOUT);
    double took = dp__now_s() - t0;
    CHECKF(took >= 0.4 && took < 3, "took %.2f s", took);
    CHECK_EQ(f.u[0].st.rc, DP_OK);
    CHECK_EQ(f.u[1].st.rc, DP_OK);
    CHECK(!f.u[2].answered);
    char want[256];
    snprintf(want, sizeof want,
             "unit 2 (%s) did not answer info within 0.5 s: is it running?", us[2].zmq);
    CHECK_STR(f.u[2].st.det.msg, want);

    /* Only unit 1: the others are not asked. */
    unsigned before0 = atomic_load(&fs[0].asked);
    dp__fanout_reset(&f);
    dp__wire_request q;
    memset(&q, 0, sizeof q);
    q.op = DP_WIRE_OP_STATS;
    CHECK_OK(dp__fanout_add(&f, &g, 1, us[1].zmq, 0, &q));
    CHECK_ERR(dp__fanout_add(&f, &g, 1, us[1].zmq, 0, &q), DP_EINVAL); /* once a batch */
    CHECK_EQ(f.n_slots, 1);
    CHECK_OK(dp__fanout_run(&f, ctl, 5, NULL));
    CHECK_EQ(atomic_load(&fs[0].asked), before0);
    CHECK(f.u[0].op == DP_WIRE_OP_NONE && f.u[2].op == DP_WIRE_OP_NONE);
    uint64_t v = 0;
    CHECK(dp__wire_fields_u64(&f.u[1].rep.r.stats, "entries", &v));
    CHECK_EQ(v, 7);
    CHECK_OK(dp__fanout_first(&f, NULL));

    dp__fanout_fini(&f);
    dp__ctl_client_destroy(ctl);
    fakes_stop(fs, 3);
}

/* dp__fanout_place and dp__fanout_reply: the phased senders' half. */
DP_TEST(fanout_place_and_reply)
{
    fake fs[2];
    dp__cluster_unit us[2];
    dp__cluster cl;
    fakes_start(fs, 2);
    cluster_of(fs, 2, &cl, us);
    dp__ctl_client *ctl = NULL;
    CHECK_OK(dp__ctl_client_create(&ctl, NULL));
    dp__wire_rid_gen g;
    CHECK_OK(dp__wire_rid_gen_init(&g, NULL));
    dp__fanout f;
    CHECK_OK(dp__fanout_init(&f, 2, NULL));
    dp__wire_request q;
    memset(&q, 0, sizeof q);
    q.op = DP_WIRE_OP_INFO;
    /* Unit 1 in slot 0, unit 0 in slot 1. */
    CHECK_OK(dp__fanout_place(&f, &g, 0, 1, us[1].zmq, &q, NULL));
    CHECK_OK(dp__fanout_place(&f, &g, 1, 0, us[0].zmq, &q, NULL));
    CHECK_EQ(f.slot_unit[0], 1);
    CHECK_OK(dp__ctl_send(ctl, &f.items[1]));
    CHECK_OK(dp__ctl_send(ctl, &f.items[0]));
    dp__ctl_wait_many(ctl, f.items, 2, 5);
    for (uint32_t s = 0; s < 2; s++) {
        dp__wire_reply rep;
        dp_detail d;
        dp_detail_clear(&d);
        CHECK_OK_D(dp__fanout_reply(&f.items[s], DP_WIRE_OP_INFO, &rep, &d), &d);
        CHECK(rep.ok);
        CHECK_EQ(rep.r.info.unit_id, f.slot_unit[s]);
        dp__wire_reply_fini(&rep);
    }
    /* A transport failure is the item's own. */
    dp__ctl_item bad = {.rc = DP_ETRANSFER};
    dp__fail(&bad.det, DP_ETRANSFER, "gone");
    dp__wire_reply rep;
    dp_detail d;
    CHECK_ERR(dp__fanout_reply(&bad, DP_WIRE_OP_INFO, &rep, &d), DP_ETRANSFER);
    CHECK_STR(d.msg, "gone");
    dp__wire_reply_fini(&rep);
    dp__fanout_fini(&f);
    dp__ctl_client_destroy(ctl);
    fakes_stop(fs, 2);
}

/* ---- rows grouped by unit ---- */

DP_TEST(groups_are_stable_and_complete)
{
    uint64_t seed = dp_test_seed();
    uint64_t st = seed;
    for (int round = 0; round < 200; round++) {
        uint32_t n_units = 1 + (uint32_t)(dp_test_rand(&st) % 9);
        size_t n = (size_t)(dp_test_rand(&st) % 300);
        uint64_t *gidxs = malloc((n ? n : 1) * sizeof *gidxs);
        for (size_t i = 0; i < n; i++)
            gidxs[i] = round % 2 ? dp_test_rand(&st) : dp_test_rand(&st) % 50;
        dp__groups g;
        CHECK_OK(dp__groups_make(&g, n_units, gidxs, n, NULL));
        CHECK_EQ(g.start[0], 0);
        CHECK_EQ(g.start[n_units], n);
        size_t seen = 0;
        for (uint32_t u = 0; u < n_units; u++) {
            for (uint32_t k = g.start[u]; k < g.start[u + 1]; k++) {
                uint32_t i = g.order[k];
                CHECKF(gidxs[i] % n_units == u, "seed %" PRIu64, seed);
                /* Stable: input order within a unit. */
                if (k > g.start[u])
                    CHECKF(g.order[k - 1] < i, "seed %" PRIu64, seed);
                seen++;
            }
            CHECK_EQ(dp__groups_count(&g, u), g.start[u + 1] - g.start[u]);
        }
        CHECK_EQ(seen, n);
        /* Grouped by units known already: the same groups. */
        uint32_t *units = malloc((n ? n : 1) * sizeof *units);
        for (size_t i = 0; i < n; i++)
            units[i] = (uint32_t)(gidxs[i] % n_units);
        dp__groups h;
        CHECK_OK(dp__groups_of_units(&h, n_units, units, n, NULL));
        CHECK(memcmp(h.start, g.start, (n_units + 1) * sizeof *g.start) == 0);
        CHECK(n == 0 || memcmp(h.order, g.order, n * sizeof *g.order) == 0);
        dp__groups_fini(&h);
        free(units);
        dp__groups_fini(&g);
        dp__groups_fini(&g);
        free(gidxs);
    }
}

/* ---- control-only clients ---- */

/*
 * A control-only client over 3 units, one of which never answers: with
 * ALLOW_DOWN it opens, the down unit keeps its reason and is sent nothing
 * more; stats and clear go to the others; put and get are refused, and no
 * transfer endpoint exists.
 */
DP_TEST(control_only_client_with_a_unit_down)
{
    fake fs[3];
    dp__cluster_unit us[3];
    dp__cluster cl;
    fakes_start(fs, 3);
    cluster_of(fs, 3, &cl, us);
    fs[1].mode = FAKE_SILENT;
    fs[0].dropped = 4;
    fs[2].dropped = 1;
    dp_client_opts co;
    dp_client_opts_init(&co);
    co.timeout_s = 0.5;
    co.connect_timeout_s = 0.5;
    dp__fanout_opts words = {.listed_by = "the file F", .silence_hint = ": hint"};
    dp_client *c = NULL;
    dp_detail d;
    dp_detail_clear(&d);
    /* Without ALLOW_DOWN the silent unit fails the open, naming it. */
    CHECK_ERR_D(dp__client_open_ctl(&cl, &co, &words, 0, &c, &d), DP_ETIMEDOUT, &d);
    CHECK(c == NULL);
    char want[256];
    snprintf(want, sizeof want, "unit 1 (%s) did not answer info within 0.5 s: hint",
             us[1].zmq);
    CHECK_STR(d.msg, want);
    CHECK_OK_D(dp__client_open_ctl(&cl, &co, &words, DP__CTL_ALLOW_DOWN, &c, &d), &d);
    CHECK(c->ep == NULL);
    dp_detail ud;
    const char *agent = NULL;
    uint64_t inc = 0;
    CHECK_EQ(dp__client_unit_check(c, 1, &ud, NULL, NULL), DP__UNIT_DOWN);
    CHECK_STR(ud.msg, want);
    CHECK_EQ(dp__client_unit_check(c, 2, NULL, &agent, &inc), DP__UNIT_CHECKED);
    CHECK_STR(agent, "fake-unit");
    CHECK_EQ(inc, 102);
    unsigned asked1 = atomic_load(&fs[1].asked);

    /* stats: two results, the down unit's reason. */
    dp__fanout f;
    CHECK_ERR(dp__client_call_all(c, &f, NULL, NULL, NULL), DP_EINVAL);
    dp__fanout_fini(&f);
    dp_client_stats *s = NULL;
    CHECK_ERR_D(dp_client_stats_get(c, &s, &d), DP_ETIMEDOUT, &d);
    CHECK_EQ(dp_client_stats_status(s, 0), 0);
    CHECK_EQ(dp_client_stats_status(s, 1), DP_ETIMEDOUT);
    double v = 0;
    CHECK(dp_client_stats_find(s, 2, "entries", &v));
    CHECK_EQ((int)v, 7);
    dp_client_stats_destroy(s);

    /* clear: rows grouped by unit, the down unit's rows reported, not sent. */
    uint64_t rows[] = {0, 1, 2, 3, 4, 5, 6};
    dp__groups g;
    int rc = dp__client_clear_units(c, rows, 7, &f, &g, &d);
    CHECK_ERR(rc, DP_ETIMEDOUT);
    CHECK_EQ(dp__groups_count(&g, 0), 3);
    CHECK_EQ(dp__groups_count(&g, 1), 2);
    CHECK_EQ(f.u[0].rep.r.dropped, 4);
    CHECK_EQ(f.u[2].rep.r.dropped, 1);
    CHECK_EQ(f.u[1].st.rc, DP_ETIMEDOUT);
    CHECK_CONTAINS(d.msg, "clear: rows of unit 1 (");
    CHECK_CONTAINS(d.msg, "not cleared: did not answer info within 0.5 s: hint");
    CHECK_CONTAINS(d.msg, "(2 of 7 rows not cleared)");
    CHECK_EQ(atomic_load(&fs[0].rows), 3);
    dp__fanout_fini(&f);
    dp__groups_fini(&g);
    uint64_t dropped = 0;
    CHECK_ERR(dp_client_clear(c, rows, 7, &dropped, NULL), DP_ETIMEDOUT);
    CHECK_EQ(dropped, 5);
    CHECK_EQ(atomic_load(&fs[1].asked), asked1); /* nothing more went to it */

    /* No data path. */
    const char *field = "f";
    dp_value val = {.data = "x", .nbytes = 1, .kind = DP_KIND_BYTES};
    uint64_t row = 0;
    CHECK_ERR(dp_client_put(c, &row, 1, &field, 1, &val, NULL, &d), DP_EINVAL);
    CHECK_CONTAINS(d.msg, "control plane only");
    dp_get_item it = {.key = "0@f"};
    CHECK_ERR(dp_client_get(c, &it, 1, NULL), DP_EINVAL);
    void *p = NULL;
    CHECK_ERR(dp_client_alloc(c, 64, &p, NULL), DP_EINVAL);
    CHECK(!dp_client_touches_unfinished(c, &row, 8));
    dp_client_counters cnt;
    CHECK_OK(dp_client_counters_get(c, &cnt));
    dp_client_close(c);
    fakes_stop(fs, 3);
}

/*
 * NO_CHECK opens without asking anyone; units are then checked one at a
 * time, and a unit never checked is refused without a request. A unit
 * that says it is another fails its check with the caller's words.
 */
DP_TEST(control_only_client_checks_before_use)
{
    fake fs[2];
    dp__cluster_unit us[2];
    dp__cluster cl;
    fakes_start(fs, 2);
    cluster_of(fs, 2, &cl, us);
    dp_client *c = NULL;
    dp_detail d;
    dp_detail_clear(&d);
    dp__fanout_opts words = {.listed_by = "the file F", .misplaced_hint = ": fix it"};
    CHECK_OK_D(dp__client_open_ctl(&cl, NULL, &words, DP__CTL_NO_CHECK, &c, &d), &d);
    CHECK_EQ(atomic_load(&fs[0].asked) + atomic_load(&fs[1].asked), 0);
    CHECK_EQ(dp__client_unit_check(c, 0, NULL, NULL, NULL), DP__UNIT_UNCHECKED);
    CHECK_OK_D(dp__client_check_units(c, 1, 0, &d), &d);
    CHECK_EQ(atomic_load(&fs[0].asked), 0);
    dp_client_stats *s = NULL;
    CHECK_ERR(dp_client_stats_get(c, &s, &d), DP_EINVAL);
    char want[256];
    snprintf(want, sizeof want, "stats: unit 0 (%s): was not asked who it is before use",
             us[0].zmq);
    CHECK_STR(d.msg, want);
    CHECK_EQ(dp_client_stats_status(s, 1), 0);
    dp_client_stats_destroy(s);
    CHECK_EQ(atomic_load(&fs[0].asked), 0);
    /* Unit 0 says it is unit 1: refused, in the caller's words, and still unchecked. */
    fs[0].says_id = 1;
    CHECK_ERR_D(dp__client_check_units(c, -1, 0, &d), DP_EPROTO, &d);
    snprintf(want, sizeof want,
             "unit 0 (%s) says it is unit 1 of 2, but the file F lists it as unit 0 of 2 "
             "(wrong order or a unit from another cluster): fix it",
             us[0].zmq);
    CHECK_STR(d.msg, want);
    CHECK_EQ(dp__client_unit_check(c, 0, NULL, NULL, NULL), DP__UNIT_UNCHECKED);
    CHECK_ERR(dp__client_check_units(c, 2, 0, NULL), DP_EINVAL);
    dp_client_close(c);
    fakes_stop(fs, 2);
}
