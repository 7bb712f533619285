/*
 * Two-sided transfers (docs/design.md, "Two-sided transfers") against a real
 * unit and its real endpoint: a client endpoint forced onto the two-sided path
 * (two_sided = always, so the unit's active-message handlers run over this
 * host's transports) WRITEs into allocations and READs from pins, and bad
 * peers send where they must not: to no allocation, with a wrong token, past
 * an allocation's end, after its abort and after its lease, from no pin,
 * outside a pin's blobs, after an unpin. Each is refused with its reason and
 * counted, no byte of the slab changes, and the unit keeps serving (a good
 * WRITE, commit and READ afterwards check byte for byte). A client put/get of
 * jagged and small rows through the same path checks content end to end.
 * The same path across network namespaces runs in test_netns and test_outage
 * (there the lanes are TCP, so it is the default).
 */
#include "dp_test.h"
#include "dp_tsan_ucx.h"
#include "dp_unit_blob.h"
#include "dp_unit_fixture.h"

#include <unistd.h>

#include "blob/blob.h"
#include "blob/crc32c.h"
#include "common/le.h"
#include "dataplane/client.h"
#include "unit/server.h"
#include "unit/unit.h"
#include "xfer/endpoint.h"

#define SLAB (8u << 20)

typedef struct rig {
    dp__endpoint *uep, *cep;
    dp__unit *u;
    uint8_t *lbuf; /* 1 MiB registered with cep */
    char remote[256];
} rig;

static void
rig_open(rig *r, double lease_s)
{
    memset(r, 0, sizeof *r);
    dp_detail d;
    dp_detail_clear(&d);
    dp__endpoint_opts eo;
    dp__endpoint_opts_init(&eo);
    eo.progress_thread = true;
    CHECK_OK_D(dp__endpoint_create("ts-unit", &eo, &r->uep, &d), &d);
    dp__unit_opts o;
    dp__unit_opts_init(&o);
    o.slab_bytes = SLAB;
    o.n_units = 1;
    o.read_pin_s = 10;
    o.alloc_lease_s = lease_s;
    o.quarantine_s = 5;
    o.numa = DP_UNIT_NUMA_OFF;
    o.now = fake_now;
    o.ep = r->uep;
    CHECK_OK_D(dp__unit_create(&o, &r->u, &d), &d);
    CHECK_OK_D(dp__unit_serve_transfers(r->u, &d), &d);
    dp__endpoint_opts_init(&eo);
    eo.two_sided = DP_XFER_TS_ALWAYS;
    CHECK_OK_D(dp__endpoint_create("ts-client", &eo, &r->cep, &d), &d);
    void *p = NULL;
    CHECK_OK_D(dp__endpoint_alloc(r->cep, 1u << 20, &p, &d), &d);
    r->lbuf = p;
    uint8_t *md = NULL;
    size_t mdlen = 0;
    CHECK_OK_D(dp__endpoint_metadata(r->uep, &md, &mdlen, &d), &d);
    CHECK_OK_D(dp__endpoint_add_remote(r->cep, md, mdlen, r->remote, &d), &d);
    free(md);
    dp__xfer_route rt;
    CHECK_OK_D(dp__endpoint_remote_route(r->cep, r->remote, &rt, &d), &d);
    CHECK(rt.two_sided);
    CHECK_STR(rt.path, "two-sided");
}

static void
rig_close(rig *r)
{
    dp__endpoint_destroy(r->cep);
    dp__unit_stop_serving(r->u);
    dp__unit_destroy(r->u);
    dp__endpoint_destroy(r->uep);
}

/* One op: local lbuf[loff..+n) <-> unit slab[roff..+n), with a grant. */
static int
xfer(rig *r, dp__xfer_op op, uint64_t loff, uint64_t roff, uint64_t n, const void *grant,
     uint32_t glen, dp__xfer_result *out, dp_detail *d)
{
    dp__range l = {(uint64_t)(uintptr_t)(r->lbuf + loff), n};
    dp__range m = {(uint64_t)(uintptr_t)(dp__unit_slab(r->u) + roff), n};
    dp__xfer_desc o = {.op = op,
                       .local = &l,
                       .n_local = 1,
                       .remote = &m,
                       .n_remote = 1,
                       .remote_name = r->remote,
                       .grant = grant,
                       .grant_len = glen};
    dp__xfer_result res;
    int rc = dp__endpoint_transfer_many(r->cep, &o, 1, 5.0, &res, NULL, NULL);
    if (d != NULL)
        *d = res.det;
    if (out != NULL)
        *out = res;
    return rc;
}

static uint32_t
wgrant(uint8_t *g, uint64_t token, const char *id)
{
    dp__le64_store(g, token);
    memcpy(g + 8, id, strlen(id));
    return (uint32_t)(8 + strlen(id));
}

/*
 * The slab is read under the unit lock: the unit's progress thread wrote it,
 * then took the lock to end the WRITE's hold, which orders the two for
 * ThreadSanitizer (the acknowledgement that told the test travels through
 * UCX, where TSan sees no order).
 */
static uint32_t
slab_crc(rig *r)
{
    dp__unit_lock(r->u);
    uint32_t c = dp__crc32c(dp__unit_slab(r->u), SLAB);
    dp__unit_unlock(r->u);
    return c;
}

static bool
slab_equal(rig *r, uint64_t off, const void *p, uint64_t n)
{
    dp__unit_lock(r->u);
    bool eq = memcmp(dp__unit_slab(r->u) + off, p, n) == 0;
    dp__unit_unlock(r->u);
    return eq;
}

DP_TEST(bad_peers_are_refused_and_counted)
{
    rig r;
    rig_open(&r, 60);
    dp_detail d;
    dp_detail_clear(&d);
    uint8_t g[96];
    const char *keys[] = {"0@a", "1@a", "2@a"};
    tblob t = mk_blob(keys, 3, 20000, 5);
    uint64_t off = 0;
    CHECK_OK_D(dp_test_unit_alloc(r.u, "b1", 2, t.len, 3, false, &off, NULL, &d), &d);
    uint64_t token = dp__unit_alloc_token(r.u, "b1", 2);
    memcpy(r.lbuf, t.p, t.len);
    dp__blob_header_set_alloc(r.lbuf, dp__unit_incarnation(r.u), token);
    uint32_t before = slab_crc(&r);
    dp__xfer_result end;

    /* No such allocation; a wrong token; past its end. */
    CHECK_ERR_D(
        xfer(&r, DP_XFER_WRITE, 0, off, t.len, g, wgrant(g, token, "nope"), &end, &d),
        DP_ENOTFOUND, &d);
    CHECK_CONTAINS(d.msg, "no open allocation nope");
    /* Refused or acknowledged: nothing more lands, and the connection is sound. */
    CHECK(!end.may_land && !end.suspect);
    CHECK_ERR_D(
        xfer(&r, DP_XFER_WRITE, 0, off, t.len, g, wgrant(g, token + 1, "b1"), NULL, &d),
        DP_ENOTFOUND, &d);
    CHECK_ERR_D(
        xfer(&r, DP_XFER_WRITE, 0, off + 64, t.len, g, wgrant(g, token, "b1"), NULL, &d),
        DP_EPROTO, &d);
    CHECK_CONTAINS(d.msg, "past its end");
    CHECK_ERR_D(xfer(&r, DP_XFER_WRITE, 0, off, t.len, g, 3, NULL, &d), DP_EPROTO, &d);
    CHECK_CONTAINS(d.msg, "malformed WRITE grant");
    CHECK_EQ(slab_crc(&r), before);
    CHECK_EQ_U64(dp_test_unit_stats(r.u).ts_refused, 4);
    CHECK_EQ_U64(dp_test_unit_stats(r.u).ts_writes, 0);

    /* The good WRITE lands; its commit publishes it. */
    CHECK_OK_D(
        xfer(&r, DP_XFER_WRITE, 0, off, t.len, g, wgrant(g, token, "b1"), &end, &d), &d);
    /* Refused or acknowledged: nothing more lands, and the connection is sound. */
    CHECK(!end.may_land && !end.suspect);
    CHECK(slab_equal(&r, off, r.lbuf, t.len));
    dp__wire_commit_state st = DP_WIRE_COMMIT_LOST;
    CHECK_OK_D(dp__unit_commit(r.u, "b1", 2, &st, &d), &d);
    CHECK_EQ(st, DP_WIRE_COMMIT_DONE);
    /* Committed: no WRITE gets into it any more. */
    before = slab_crc(&r);
    CHECK_ERR_D(
        xfer(&r, DP_XFER_WRITE, 0, off, t.len, g, wgrant(g, token, "b1"), NULL, &d),
        DP_EPROTO, &d);
    CHECK_CONTAINS(d.msg, "already committed");

    /* READs: from a pin, outside its blob, with no pin, after the unpin. */
    uint64_t koff = 0, klen = 0;
    char pin[33];
    CHECK(locate(r.u, "1@a", &koff, &klen, pin));
    memset(r.lbuf, 0xee, 1u << 20);
    CHECK_OK_D(
        xfer(&r, DP_XFER_READ, 4096, koff, klen, pin, (uint32_t)strlen(pin), NULL, &d),
        &d);
    CHECK(slab_equal(&r, koff, r.lbuf + 4096, klen));
    CHECK_ERR_D(xfer(&r, DP_XFER_READ, 0, off + t.len + 4096, 4096, pin,
                     (uint32_t)strlen(pin), NULL, &d),
                DP_EPROTO, &d);
    CHECK_CONTAINS(d.msg, "lies in no blob of its pin");
    CHECK_ERR_D(xfer(&r, DP_XFER_READ, 0, koff, klen, "0123456789abcdef0123456789abcdef",
                     32, NULL, &d),
                DP_ETIMEDOUT, &d);
    CHECK_CONTAINS(d.msg, "no live pin");
    dp__unit_unpin(r.u, pin, strlen(pin));
    CHECK_ERR_D(
        xfer(&r, DP_XFER_READ, 0, koff, klen, pin, (uint32_t)strlen(pin), NULL, &d),
        DP_ETIMEDOUT, &d);

    /* Aborted, and past its lease: refused, nothing written. */
    CHECK_OK_D(dp_test_unit_alloc(r.u, "b2", 2, 65536, 0, false, &off, NULL, &d), &d);
    token = dp__unit_alloc_token(r.u, "b2", 2);
    dp__unit_abort(r.u, "b2", 2, false);
    CHECK_ERR_D(
        xfer(&r, DP_XFER_WRITE, 0, off, 65536, g, wgrant(g, token, "b2"), NULL, &d),
        DP_ENOTFOUND, &d);
    CHECK_OK_D(dp_test_unit_alloc(r.u, "b3", 2, 65536, 0, false, &off, NULL, &d), &d);
    token = dp__unit_alloc_token(r.u, "b3", 2);
    fake_t += 61;
    dp__unit_tick(r.u);
    CHECK_EQ_U64(dp_test_unit_stats(r.u).leases_expired, 1);
    CHECK_ERR_D(
        xfer(&r, DP_XFER_WRITE, 0, off, 65536, g, wgrant(g, token, "b3"), NULL, &d),
        DP_ENOTFOUND, &d);
    CHECK_EQ(slab_crc(&r), before);
    /* Retired for good: a one-sided WRITE might still land. A two-sided
     * writer's region is freed instead: only what the unit receives lands. */
    uint64_t retired = dp_test_unit_stats(r.u).retired_bytes;
    CHECK(retired >= 65536);
    uint64_t used = dp_test_unit_stats(r.u).allocated_bytes;
    dp__wire_alloc_args a4 = {
        .blob_id = dp__wire_s("b4"), .nbytes = 65536, .two_sided = true};
    dp__wire_alloc_res r4;
    CHECK_OK_D(dp__unit_alloc_req(r.u, &a4, &r4, NULL, &d), &d);
    CHECK(dp_test_unit_stats(r.u).allocated_bytes > used);
    fake_t += 61;
    dp__unit_tick(r.u);
    CHECK_EQ_U64(dp_test_unit_stats(r.u).leases_expired, 2);
    CHECK_EQ_U64(dp_test_unit_stats(r.u).retired_bytes, retired);
    CHECK_EQ_U64(dp_test_unit_stats(r.u).allocated_bytes, used);
    CHECK_ERR_D(
        xfer(&r, DP_XFER_WRITE, 0, r4.off, 65536, g, wgrant(g, r4.token, "b4"), NULL, &d),
        DP_ENOTFOUND, &d);
    CHECK_EQ(slab_crc(&r), before);
    dp__unit_stats s = dp_test_unit_stats(r.u);
    CHECK_EQ_U64(s.ts_refused, 11);
    CHECK_EQ_U64(s.ts_writes, 1);
    CHECK_EQ_U64(s.ts_reads, 1);
    dp__endpoint_stats es;
    dp__endpoint_get_stats(r.uep, &es);
    CHECK_EQ_U64(es.ts_refused, 11);
    CHECK_EQ_U64(es.ts_served, 2);

    /* Still serving: a fresh allocation written and read back byte for byte. */
    tblob t2 = mk_blob(keys, 3, 3000, 9);
    CHECK_OK_D(dp_test_unit_alloc(r.u, "b4", 2, t2.len, 3, false, &off, NULL, &d), &d);
    token = dp__unit_alloc_token(r.u, "b4", 2);
    memcpy(r.lbuf, t2.p, t2.len);
    dp__blob_header_set_alloc(r.lbuf, dp__unit_incarnation(r.u), token);
    CHECK_OK_D(
        xfer(&r, DP_XFER_WRITE, 0, off, t2.len, g, wgrant(g, token, "b4"), NULL, &d), &d);
    CHECK_OK_D(dp__unit_commit(r.u, "b4", 2, &st, &d), &d);
    CHECK(locate(r.u, "2@a", &koff, &klen, pin));
    CHECK_OK_D(
        xfer(&r, DP_XFER_READ, 8192, koff, klen, pin, (uint32_t)strlen(pin), NULL, &d),
        &d);
    CHECK(slab_equal(&r, koff, r.lbuf + 8192, klen));
    dp__unit_unpin(r.u, pin, strlen(pin));
    dp_test_unit_check(r.u);
    free(t.p);
    free(t2.p);
    rig_close(&r);
}

/* A client's put/get/clear of jagged and small rows on the two-sided path. */
DP_TEST(client_rows_over_two_sided)
{
    setenv("DP_TWO_SIDED", "always", 1);
    dp_detail d;
    dp_detail_clear(&d);
    dp__unit_server *s[2];
    const char *addrs[2];
    for (uint32_t i = 0; i < 2; i++) {
        dp__unit_opts o;
        dp__unit_opts_init(&o);
        o.slab_bytes = 32u << 20;
        o.n_units = 2;
        o.unit_id = i;
        o.numa = DP_UNIT_NUMA_OFF;
        char name[32];
        snprintf(name, sizeof name, "ts-u%u-%d", i, (int)getpid());
        CHECK_OK_D(dp__unit_server_open(&o, name, "127.0.0.1", 0, 0.2, &s[i], &d), &d);
        addrs[i] = dp__unit_server_address(s[i]);
    }
    dp_client_opts co;
    dp_client_opts_init(&co);
    co.timeout_s = 10;
    dp_client *c = NULL;
    CHECK_OK_D(dp_client_open_units(addrs, 2, &co, &c, &d), &d);
    char path[128];
    CHECK_OK(dp_client_unit_path(c, 0, path, sizeof path));
    CHECK_CONTAINS(path, "two-sided");
    enum { N = 300, CAP = 9000 };
    uint64_t rows[N];
    static uint8_t src[N][CAP], dst[N][CAP];
    dp_value vals[N];
    uint64_t rs = dp_test_seed();
    for (uint32_t i = 0; i < N; i++) {
        rows[i] = 1000 + i;
        size_t len =
            i % 7 == 0 ? 0 : 1 + dp_test_rand(&rs) % CAP; /* jagged, some empty */
        for (size_t k = 0; k < len; k++)
            src[i][k] = (uint8_t)dp_test_rand(&rs);
        vals[i] = (dp_value){.data = src[i], .nbytes = len, .kind = DP_KIND_BYTES};
    }
    const char *fields[] = {"x"};
    CHECK_OK_D(dp_client_put(c, rows, N, fields, 1, vals, NULL, &d), &d);
    static char keys[N][32];
    dp_get_item gi[N];
    memset(gi, 0, sizeof gi);
    memset(dst, 0xee, sizeof dst);
    for (uint32_t i = 0; i < N; i++) {
        snprintf(keys[i], sizeof keys[i], "%" PRIu64 "@x", rows[i]);
        gi[i] = (dp_get_item){.key = keys[i], .dst = dst[i], .cap = CAP};
    }
    CHECK_OK_D(dp_client_get(c, gi, N, &d), &d);
    for (uint32_t i = 0; i < N; i++) {
        CHECK_EQ(gi[i].status, 0);
        CHECK_EQ_U64(gi[i].nbytes, vals[i].nbytes);
        CHECK(memcmp(dst[i], src[i], gi[i].nbytes) == 0);
    }
    uint64_t dropped = 0;
    CHECK_OK_D(dp_client_clear(c, rows, N, &dropped, &d), &d);
    CHECK_EQ_U64(dropped, N);

    /*
     * Large values from registered memory among small ones: each range of 128
     * KiB or more is a message of its own (several in flight), the small ones
     * between them gathered; gets into registered and into plain memory.
     */
    enum { M = 12 };
    /* Multiples of 64: the blob is one run of the unit's memory, so the message
     * count is the pieces': {header, 128}, 200K, 1M, 130K, {64, 64K, 128K-64},
     * 128K, 300K, {64}, 2M. */
    static const uint64_t sizes[M] = {0,         128,       200 << 10, 1 << 20,
                                      130 << 10, 64,        64 << 10,  (128 << 10) - 64,
                                      128 << 10, 300 << 10, 64,        2 << 20};
    uint64_t total = 0, mrows[M];
    for (uint32_t i = 0; i < M; i++)
        total += sizes[i];
    uint8_t *reg = NULL, *back = NULL;
    CHECK_OK_D(dp_client_alloc(c, total, (void **)&reg, &d), &d);
    CHECK_OK_D(dp_client_alloc(c, total, (void **)&back, &d), &d);
    uint8_t *plain = malloc(total);
    dp_value mv[M];
    uint64_t at = 0;
    for (uint32_t i = 0; i < M; i++) {
        mrows[i] = 5000 + 2 * i; /* all on unit 0: one blob, one run */
        for (uint64_t k = 0; k < sizes[i]; k++)
            reg[at + k] = (uint8_t)dp_test_rand(&rs);
        mv[i] = (dp_value){.data = reg + at, .nbytes = sizes[i], .kind = DP_KIND_BYTES};
        at += sizes[i];
    }
    dp__unit_stats s0;
    dp__unit_get_stats(dp__unit_server_unit(s[0]), &s0);
    CHECK_OK_D(dp_client_put(c, mrows, M, fields, 1, mv, NULL, &d), &d);
    dp__unit_stats s1;
    dp__unit_get_stats(dp__unit_server_unit(s[0]), &s1);
    CHECK_EQ_U64(s1.ts_writes - s0.ts_writes, 9);
    for (int form = 0; form < 2; form++) {
        uint8_t *dstbase = form == 0 ? back : plain;
        memset(dstbase, 0xee, total);
        at = 0;
        for (uint32_t i = 0; i < M; i++) {
            snprintf(keys[i], sizeof keys[i], "%" PRIu64 "@x", mrows[i]);
            gi[i] = (dp_get_item){.key = keys[i], .dst = dstbase + at, .cap = sizes[i]};
            at += sizes[i];
        }
        CHECK_OK_D(dp_client_get(c, gi, M, &d), &d);
        CHECK(memcmp(dstbase, reg, total) == 0);
    }
    /* Jagged large ones: runs split by the blob's alignment gaps, then pieces. */
    static const uint64_t jag[3] = {(1 << 20) + 3, 7, (200 << 10) + 1};
    uint64_t jrows[3] = {7000, 7002, 7004};
    dp_value jv[3];
    at = 0;
    for (uint32_t i = 0; i < 3; i++) {
        jv[i] = (dp_value){.data = reg + at, .nbytes = jag[i], .kind = DP_KIND_BYTES};
        at += jag[i];
    }
    CHECK_OK_D(dp_client_put(c, jrows, 3, fields, 1, jv, NULL, &d), &d);
    memset(back, 0xee, at);
    at = 0;
    for (uint32_t i = 0; i < 3; i++) {
        snprintf(keys[i], sizeof keys[i], "%" PRIu64 "@x", jrows[i]);
        gi[i] = (dp_get_item){.key = keys[i], .dst = back + at, .cap = jag[i]};
        at += jag[i];
    }
    CHECK_OK_D(dp_client_get(c, gi, 3, &d), &d);
    CHECK(memcmp(back, reg, at) == 0);
    free(plain);
    dp_client_free(c, reg);
    dp_client_free(c, back);
    dp_client_close(c);
    for (uint32_t i = 0; i < 2; i++) {
        dp__unit_stats st;
        dp__unit_get_stats(dp__unit_server_unit(s[i]), &st);
        CHECK(st.ts_writes > 0 && st.ts_reads > 0);
        CHECK_EQ_U64(st.ts_refused, 0);
        dp__unit_server_close(s[i]);
    }
    unsetenv("DP_TWO_SIDED");
}
