/*
 * Tests for src/unit served over real ZMQ, with real UCX transfers from
 * another process: puts and gets with CRCs checked, a client killed between
 * alloc and commit, a pinned read that survives a release while writers fill
 * the slab; and the `dataplane unit` command through the real binary.
 */
#include "dp_test.h"
#include "dp_tsan_ucx.h"
#include "dp_proc.h"
#include "dp_unit_blob.h"
#include "dp_unit_fixture.h"

#include <pthread.h>
#include <signal.h>
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
#include "xfer/metadata.h"

/* ---- over real ZMQ, with real UCX transfers from another process ---- */

/*
 * Peers are this program re-executed with DP_TEST_UNIT_PEER set, so that no
 * UCX or ZMQ state crosses a fork:
 *   "unit":   a unit with an endpoint (progress thread), ticker and control
 *             server; writes its address to DP_TEST_UNIT_FD, runs until SIGTERM
 *             and exits 0 after a clean shutdown;
 *   "client": allocs blob "doomed" on DP_TEST_UNIT_ADDR, WRITEs half of it,
 *             reports "ok" on the fd and waits to be killed.
 */
static dp__wire_rid_gen rid_gen;
static bool rid_init;

/* Request q to addr; the reply decodes into rep with views into rbuf. */
static int
zcall(dp__ctl_client *c, const char *addr, dp__wire_request *q, dp__wire_reply *rep,
      dp__buf *rbuf, dp_detail *d)
{
    if (!rid_init) {
        CHECK_OK(dp__wire_rid_gen_init(&rid_gen, NULL));
        rid_init = true;
    }
    char rid[DP_WIRE_RID_MAX];
    q->rid = dp__wire_rid_next(&rid_gen, rid);
    dp__buf req = {0};
    CHECK_OK_D(dp__wire_request_encode(q, NULL, &req, d), d);
    dp__buf_reset(rbuf);
    int rc = dp__ctl_call(c, addr, &req, rid, 10.0, rbuf, d);
    dp__buf_fini(&req);
    if (rc != 0)
        return rc;
    return dp__wire_reply_decode(rbuf->data, rbuf->len, q->op, NULL, rep, d);
}

static void
znotify(dp__ctl_client *c, const char *addr, dp__wire_request *q)
{
    char rid[DP_WIRE_RID_MAX];
    q->rid = dp__wire_rid_next(&rid_gen, rid);
    dp__buf req = {0};
    CHECK_OK(dp__wire_request_encode(q, NULL, &req, NULL));
    CHECK_OK(dp__ctl_notify(c, addr, req.data, req.len, NULL));
    dp__buf_fini(&req);
}

static int
peer_unit(int fd)
{
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    dp_detail d;
    dp_detail_clear(&d);
    dp__unit_opts o;
    dp__unit_opts_init(&o);
    o.slab_bytes = 16 << 20;
    o.read_pin_s = 10;
    o.alloc_lease_s = atof(getenv("DP_TEST_UNIT_LEASE"));
    o.quarantine_s = 1;
    o.numa = DP_UNIT_NUMA_AUTO;
    dp__unit_server *srv = NULL;
    if (dp__unit_server_open(&o, "test-unit", "127.0.0.1", 0, 0.1, &srv, &d) != 0)
        goto fail;
    char line[300];
    snprintf(line, sizeof line, "%s\n", dp__unit_server_address(srv));
    dp_test_write_str(fd, line);
    int sig;
    sigwait(&sigs, &sig);
    dp__unit_server_close(srv);
    return 0;
fail:
    fprintf(stderr, "unit peer: %s\n", dp_detail_msg(&d));
    return 1;
}

/* The slab's base address in the unit process: its only registered region. */
static uint64_t
slab_base(const dp__wire_bytes *md)
{
    dp__md m;
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_OK_D(dp__md_parse(md->p, md->n, &m, &d), &d);
    CHECK_EQ(m.n_regions, 1);
    uint64_t base = m.regions[0].base;
    dp__md_fini(&m);
    return base;
}

/* Connect ep to the unit at addr; returns the remote name and slab base. */
static uint64_t
connect_unit(dp__ctl_client *c, const char *addr, dp__endpoint *ep, char name[256])
{
    dp__wire_request q;
    memset(&q, 0, sizeof q);
    q.op = DP_WIRE_OP_INFO;
    dp__wire_reply r;
    dp__buf rb = {0};
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_OK_D(zcall(c, addr, &q, &r, &rb, &d), &d);
    CHECK(r.ok);
    CHECK(r.r.info.metadata.n > 0);
    CHECK(dp__wire_str_eq(r.r.info.zmq, addr));
    CHECK(dp__wire_str_eq(r.r.info.agent, "test-unit"));
    CHECK_OK_D(
        dp__endpoint_add_remote(ep, r.r.info.metadata.p, r.r.info.metadata.n, name, &d),
        &d);
    uint64_t base = slab_base(&r.r.info.metadata);
    /* info names the slab base directly too; it must agree with the metadata. */
    CHECK_EQ_U64(r.r.info.slab_addr, base);
    CHECK(r.r.info.read_pin_ms > 0);
    dp__wire_reply_fini(&r);
    dp__buf_fini(&rb);
    return base;
}

static int
peer_client(int fd)
{
    const char *addr = getenv("DP_TEST_UNIT_ADDR");
    dp__ctl_client *c = NULL;
    if (dp__ctl_client_create(&c, NULL) != 0)
        return 1;
    dp__endpoint *ep = NULL;
    if (dp__endpoint_create("doomed-client", NULL, &ep, NULL) != 0)
        return 1;
    char name[256];
    uint64_t base = connect_unit(c, addr, ep, name);
    dp__wire_request q;
    memset(&q, 0, sizeof q);
    q.op = DP_WIRE_OP_ALLOC;
    q.a.alloc = (dp__wire_alloc_args){dp__wire_s("doomed"), 1 << 20, 0, false};
    dp__wire_reply r;
    dp__buf rb = {0};
    if (zcall(c, addr, &q, &r, &rb, NULL) != 0 || !r.ok)
        return 1;
    uint64_t off = r.r.alloc.off;
    dp__wire_reply_fini(&r);
    void *buf = NULL;
    if (dp__endpoint_alloc(ep, 512 << 10, &buf, NULL) != 0)
        return 1;
    memset(buf, 0xab, 512 << 10);
    dp__range l = {(uint64_t)(uintptr_t)buf, 512 << 10};
    dp__range rr = {base + off, 512 << 10};
    if (dp__endpoint_transfer(ep, &(dp__xfer_desc){DP_XFER_WRITE, &l, 1, &rr, 1, name},
                              10, NULL) != 0)
        return 1;
    char line[64];
    snprintf(line, sizeof line, "%" PRIu64 "\n", off);
    dp_test_write_str(fd, line);
    for (;;)
        pause();
}

__attribute__((constructor)) static void
peer_main(void)
{
    const char *mode = getenv("DP_TEST_UNIT_PEER");
    if (mode == NULL)
        return;
    int fd = atoi(getenv("DP_TEST_UNIT_FD"));
    int rc = strcmp(mode, "unit") == 0 ? peer_unit(fd) : peer_client(fd);
    _exit(rc);
}

typedef struct peer {
    pid_t pid;
    char line[300];
} peer;

/* Start a peer (this program re-executed) and read the first line it reports. */
static void
peer_start(peer *p, const char *mode, const char *lease, const char *addr)
{
    int fds[2];
    CHECK(pipe2(fds, O_CLOEXEC) == 0);
    char fdbuf[16];
    snprintf(fdbuf, sizeof fdbuf, "%d", fds[1]);
    const char *env[] = {"DP_TEST_UNIT_PEER",
                         mode,
                         "DP_TEST_UNIT_FD",
                         fdbuf,
                         "DP_TEST_UNIT_LEASE",
                         lease != NULL ? lease : "60",
                         addr != NULL ? "DP_TEST_UNIT_ADDR" : NULL,
                         addr,
                         NULL};
    p->pid = dp_test_spawn_self(env, fds[1]);
    close(fds[1]);
    size_t n = dp_test_read_line(fds[0], p->line, sizeof p->line, 30);
    close(fds[0]);
    CHECKF(n > 0, "peer %s reported nothing", mode);
}

/* SIGTERM (or SIGKILL) the peer; returns its exit status (or -signal). */
static int
peer_stop(peer *p, int sig)
{
    return dp_test_kill_wait(p->pid, sig);
}

static uint64_t
zstat(dp__ctl_client *c, const char *addr, const char *name)
{
    dp__wire_request q;
    memset(&q, 0, sizeof q);
    q.op = DP_WIRE_OP_STATS;
    dp__wire_reply r;
    dp__buf rb = {0};
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_OK_D(zcall(c, addr, &q, &r, &rb, &d), &d);
    CHECK(r.ok);
    uint64_t v = 0;
    CHECKF(dp__wire_fields_u64(&r.r.stats, name, &v), "stat %s", name);
    dp__wire_reply_fini(&r);
    dp__buf_fini(&rb);
    return v;
}

DP_TEST(zmq_ucx_put_get)
{
    peer up;
    peer_start(&up, "unit", "60", NULL);
    const char *addr = up.line;
    CHECK(strncmp(addr, "tcp://127.0.0.1:", 16) == 0);
    dp__ctl_client *c = NULL;
    CHECK_OK(dp__ctl_client_create(&c, NULL));
    dp__endpoint *ep = NULL;
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_OK_D(dp__endpoint_create("test-client", NULL, &ep, &d), &d);
    char name[256];
    uint64_t base = connect_unit(c, addr, ep, name);

    /* A blob of three entries with payload CRCs, built in registered memory. */
    const char *keys[] = {"0@input_ids", "1@input_ids", "1@logprobs"};
    const uint64_t lens[] = {1000, 300 * 1024 + 7, 8};
    dp__blob_builder *bb = NULL;
    CHECK_OK(dp__blob_builder_create(DP_BLOB_FLAG_CRC, &bb, NULL));
    uint64_t rs = dp_test_seed();
    uint8_t *pay[3];
    uint32_t crc[3];
    for (int i = 0; i < 3; i++) {
        pay[i] = malloc(lens[i]);
        for (uint64_t k = 0; k < lens[i]; k++)
            pay[i][k] = (uint8_t)dp_test_rand(&rs);
        crc[i] = dp__crc32c(pay[i], lens[i]);
        dp__blob_entry_spec s = {0};
        s.key = keys[i];
        s.kind = DP_BLOB_BYTES;
        s.len = lens[i];
        s.payload = pay[i];
        CHECK_OK_D(dp__blob_builder_add(bb, &s, NULL, &d), &d);
    }
    dp__blob_layout lay;
    CHECK_OK_D(dp__blob_builder_layout(bb, &lay, &d), &d);
    void *stage = NULL;
    CHECK_OK_D(dp__endpoint_alloc(ep, lay.total_len, &stage, &d), &d);
    CHECK_OK(dp__blob_builder_write(bb, stage, lay.total_len, NULL));
    CHECK_OK(dp__blob_builder_copy_payloads(bb, stage, lay.total_len, NULL));

    dp__wire_request q;
    dp__wire_reply r;
    dp__buf rb = {0};
    memset(&q, 0, sizeof q);
    q.op = DP_WIRE_OP_ALLOC;
    q.a.alloc = (dp__wire_alloc_args){dp__wire_s("put-1"), lay.total_len, 3, true};
    CHECK_OK_D(zcall(c, addr, &q, &r, &rb, &d), &d);
    CHECK(r.ok);
    uint64_t off = r.r.alloc.off;
    CHECK(r.incarnation != 0);
    dp__blob_header_set_alloc(stage, r.incarnation, r.r.alloc.token);
    dp__wire_reply_fini(&r);

    /* Commit before the WRITE: the zeroed region fails validation. */
    q.op = DP_WIRE_OP_COMMIT;
    q.a.commit = (dp__wire_commit_args){.blob_id = dp__wire_s("put-1")};
    CHECK_OK_D(zcall(c, addr, &q, &r, &rb, &d), &d);
    CHECK(!r.ok);
    CHECK(dp__wire_str_eq(r.err.kind, "Protocol"));
    dp__wire_reply_fini(&r);

    dp__range l = {(uint64_t)(uintptr_t)stage, lay.total_len};
    dp__range rr = {base + off, lay.total_len};
    CHECK_OK_D(dp__endpoint_transfer(
                   ep, &(dp__xfer_desc){DP_XFER_WRITE, &l, 1, &rr, 1, name}, 10, &d),
               &d);
    CHECK_OK_D(zcall(c, addr, &q, &r, &rb, &d), &d);
    CHECK(r.ok);
    CHECK_EQ(r.r.commit, DP_WIRE_COMMIT_DONE);
    dp__wire_reply_fini(&r);
    CHECK_OK_D(zcall(c, addr, &q, &r, &rb, &d), &d); /* idempotent */
    CHECK(r.ok);
    CHECK_EQ(r.r.commit, DP_WIRE_COMMIT_DONE);
    dp__wire_reply_fini(&r);

    /* resolve_keys, READ each entry into registered memory, check CRCs. */
    dp__wire_str ks[] = {dp__wire_s("1@logprobs"), dp__wire_s("0@input_ids"),
                         dp__wire_s("9@nothing"), dp__wire_s("1@input_ids")};
    q.op = DP_WIRE_OP_RESOLVE_KEYS;
    q.a.resolve_keys.keys = (dp__wire_strs){ks, 4};
    q.a.resolve_keys.inline_bytes = 0;
    CHECK_OK_D(zcall(c, addr, &q, &r, &rb, &d), &d);
    CHECK(r.ok);
    CHECK_EQ(r.r.resolve_keys.entries.n, 3);
    CHECK_EQ(r.r.resolve_keys.missing.n, 1);
    CHECK(r.r.resolve_keys.pin_id.n > 0);
    void *dst = NULL;
    CHECK_OK_D(dp__endpoint_alloc(ep, 512 << 10, &dst, &d), &d);
    for (uint32_t i = 0; i < r.r.resolve_keys.entries.n; i++) {
        const dp__wire_key_loc *e = &r.r.resolve_keys.entries.v[i];
        int k = dp__wire_str_eq(e->key, "0@input_ids")   ? 0
                : dp__wire_str_eq(e->key, "1@input_ids") ? 1
                                                         : 2;
        CHECK_EQ(e->len, lens[k]);
        CHECK(dp__wire_str_eq(e->kind, "bytes"));
        memset(dst, 0, e->len);
        dp__range ll = {(uint64_t)(uintptr_t)dst, e->len};
        dp__range rl = {base + e->off, e->len};
        CHECK_OK_D(dp__endpoint_transfer(
                       ep, &(dp__xfer_desc){DP_XFER_READ, &ll, 1, &rl, 1, name}, 10, &d),
                   &d);
        CHECK_EQ(dp__crc32c(dst, e->len), crc[k]);
        CHECK_EQ(memcmp(dst, pay[k], e->len), 0);
    }
    char pin[64];
    dp__wire_str_copy(r.r.resolve_keys.pin_id, pin, sizeof pin);
    dp__wire_reply_fini(&r);
    CHECK_EQ(zstat(c, addr, "pins"), 1);
    q.op = DP_WIRE_OP_UNPIN;
    q.a.unpin.pin_id = dp__wire_s(pin);
    znotify(c, addr, &q);
    double t0 = dp_test_now();
    while (zstat(c, addr, "pins") != 0 && dp_test_now() - t0 < 5)
        dp__sleep_s(0.01);
    CHECK_EQ(zstat(c, addr, "pins"), 0);

    /* read_bytes sees the header the WRITE put there. */
    q.op = DP_WIRE_OP_READ_BYTES;
    q.a.read_bytes = (dp__wire_read_bytes_args){off, 8};
    CHECK_OK_D(zcall(c, addr, &q, &r, &rb, &d), &d);
    CHECK(r.ok && r.r.bytes.n == 8 && memcmp(r.r.bytes.p, DP_BLOB_MAGIC, 8) == 0);
    dp__wire_reply_fini(&r);

    /* Garbage on the wire: no reply, and the unit keeps serving. */
    CHECK_OK(dp__ctl_notify(c, addr, "\x93\xc1\xc1", 3, NULL));
    uint64_t g[] = {0, 1};
    q.op = DP_WIRE_OP_RELEASE_ROWS;
    q.a.release_rows = (dp__wire_release_rows_args){{g, 2}};
    CHECK_OK_D(zcall(c, addr, &q, &r, &rb, &d), &d);
    CHECK(r.ok);
    CHECK_EQ(r.r.dropped, 3);
    dp__wire_reply_fini(&r);
    CHECK_EQ(zstat(c, addr, "allocated_bytes"), 0);
    CHECK_EQ(zstat(c, addr, "entries"), 0);

    dp__buf_fini(&rb);
    for (int i = 0; i < 3; i++)
        free(pay[i]);
    dp__blob_builder_destroy(bb);
    dp__endpoint_destroy(ep);
    dp__ctl_client_destroy(c);
    CHECK_EQ(peer_stop(&up, SIGTERM), 0);
}

/* A client killed between alloc and commit: the unit stays healthy and the
 * region is retired (never reused) once the lease runs out. */
DP_TEST(zmq_client_killed_before_commit)
{
    peer up;
    peer_start(&up, "unit", "1.0", NULL);
    char addr[300];
    snprintf(addr, sizeof addr, "%s", up.line);
    peer cl;
    peer_start(&cl, "client", NULL, addr);
    uint64_t off = strtoull(cl.line, NULL, 10);
    CHECK_EQ(peer_stop(&cl, SIGKILL), -SIGKILL);

    dp__ctl_client *c = NULL;
    CHECK_OK(dp__ctl_client_create(&c, NULL));
    double t0 = dp_test_now();
    while (zstat(c, addr, "leases_expired") == 0 && dp_test_now() - t0 < 10)
        dp__sleep_s(0.05);
    CHECK_EQ(zstat(c, addr, "leases_expired"), 1);
    CHECK_EQ(zstat(c, addr, "retired_bytes"), 1 << 20);
    CHECK_EQ(zstat(c, addr, "blobs"), 0);

    dp__wire_request q;
    dp__wire_reply r;
    dp__buf rb = {0};
    dp_detail d;
    dp_detail_clear(&d);
    memset(&q, 0, sizeof q);
    q.op = DP_WIRE_OP_COMMIT;
    q.a.commit = (dp__wire_commit_args){.blob_id = dp__wire_s("doomed")};
    CHECK_OK_D(zcall(c, addr, &q, &r, &rb, &d), &d);
    CHECK(r.ok);
    CHECK_EQ(r.r.commit, DP_WIRE_COMMIT_LOST);
    dp__wire_reply_fini(&r);
    /* Fill the rest of the slab: nothing overlaps the retired region. */
    for (int i = 0; i < 64; i++) {
        char id[16];
        snprintf(id, sizeof id, "fill%d", i);
        q.op = DP_WIRE_OP_ALLOC;
        q.a.alloc = (dp__wire_alloc_args){dp__wire_s(id), 1 << 20, 0, false};
        CHECK_OK_D(zcall(c, addr, &q, &r, &rb, &d), &d);
        if (!r.ok) {
            CHECK(dp__wire_str_eq(r.err.kind, "UnitFull"));
            dp__wire_reply_fini(&r);
            break;
        }
        CHECK(r.r.alloc.off + (1 << 20) <= off || r.r.alloc.off >= off + (1 << 20));
        dp__wire_reply_fini(&r);
    }
    q.op = DP_WIRE_OP_PING;
    CHECK_OK_D(zcall(c, addr, &q, &r, &rb, &d), &d);
    CHECK(r.ok);
    dp__wire_reply_fini(&r);
    dp__buf_fini(&rb);
    dp__ctl_client_destroy(c);
    CHECK_EQ(peer_stop(&up, SIGTERM), 0);
}

/* ---- the `dataplane unit` command, through the real binary ---- */

DP_TEST(cli_unit_command)
{
    const char *cli = dp_test_cli_path();
    if (cli == NULL)
        DP_SKIP("the dataplane binary is not built next to this test");
    char line[300];
    const char *bad[] = {cli, "unit", "--numa", "sideways", NULL};
    CHECK_EQ(dp_test_wait_status(dp_test_cli_start(bad, line, sizeof line)), 2);
    const char *bad2[] = {cli, "unit", "--unit-id", "2", "--units", "2", NULL};
    CHECK_EQ(dp_test_wait_status(dp_test_cli_start(bad2, line, sizeof line)), 2);
    const char *help[] = {cli, "unit", "--help", NULL};
    pid_t hp = dp_test_cli_first_line(help, line, sizeof line);
    CHECK_CONTAINS(line, "usage: dataplane unit");
    CHECK_EQ(dp_test_wait_status(hp), 0);

    const char *args[] = {
        cli,      "unit", "--bind",       "127.0.0.1", "--port",          "0",
        "--slab", "8M",   "--read-pin-s", "5",         "--alloc-lease-s", "2",
        "--numa", "auto", "--unit-id",    "1",         "--units",         "3",
        NULL};
    pid_t pid = dp_test_cli_start(args, line, sizeof line);
    CHECKF(strncmp(line, "tcp://127.0.0.1:", 16) == 0, "first line '%s'", line);
    dp__ctl_client *c = NULL;
    CHECK_OK(dp__ctl_client_create(&c, NULL));
    dp__wire_request q;
    dp__wire_reply r;
    dp__buf rb = {0};
    dp_detail d;
    dp_detail_clear(&d);
    memset(&q, 0, sizeof q);
    q.op = DP_WIRE_OP_INFO;
    CHECK_OK_D(zcall(c, line, &q, &r, &rb, &d), &d);
    CHECK(r.ok);
    CHECK_EQ(r.r.info.unit_id, 1);
    CHECK_EQ(r.r.info.n_units, 3);
    CHECK_EQ(r.r.info.slab_bytes, 8 << 20);
    CHECK(dp__wire_str_eq(r.r.info.zmq, line));
    CHECK(r.r.info.numa.n > 0);
    CHECK(r.r.info.metadata.n > 0);
    dp__wire_reply_fini(&r);
    /* A key of another unit is refused; this unit owns gidx 1, 4, 7... */
    dp__wire_str ks[] = {dp__wire_s("4@a"), dp__wire_s("2@a")};
    q.op = DP_WIRE_OP_RESOLVE_KEYS;
    q.a.resolve_keys.keys = (dp__wire_strs){ks, 2};
    q.a.resolve_keys.inline_bytes = 0;
    CHECK_OK_D(zcall(c, line, &q, &r, &rb, &d), &d);
    CHECK(!r.ok);
    CHECK(dp__wire_str_eq(r.err.kind, "Protocol"));
    dp__wire_reply_fini(&r);
    dp__buf_fini(&rb);
    dp__ctl_client_destroy(c);
    kill(pid, SIGINT);
    CHECK_EQ(dp_test_wait_status(pid), 0);
}

/*
 * Invariant 1 over real transfers: a reader's pinned entry keeps its bytes
 * while its rows are released and writers fill the slab around it; the
 * writers get Busy (pins), never its region, until the reader unpins.
 */
DP_TEST(zmq_pinned_read_survives_release)
{
    peer up;
    peer_start(&up, "unit", "60", NULL);
    char addr[300];
    snprintf(addr, sizeof addr, "%s", up.line);
    dp__ctl_client *c = NULL;
    CHECK_OK(dp__ctl_client_create(&c, NULL));
    dp__endpoint *ep = NULL;
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_OK_D(dp__endpoint_create("test-client2", NULL, &ep, &d), &d);
    char name[256];
    uint64_t base = connect_unit(c, addr, ep, name);

    const uint64_t plen = 4 << 20;
    const char *keys[] = {"3@obs"};
    tblob t = mk_blob(keys, 1, plen, 77);
    uint32_t want = 0;
    void *stage = NULL;
    CHECK_OK_D(dp__endpoint_alloc(ep, t.len, &stage, &d), &d);
    memcpy(stage, t.p, t.len);
    dp__wire_request q;
    dp__wire_reply r;
    dp__buf rb = {0};
    memset(&q, 0, sizeof q);
    q.op = DP_WIRE_OP_ALLOC;
    q.a.alloc = (dp__wire_alloc_args){dp__wire_s("A"), t.len, 1, false};
    CHECK_OK_D(zcall(c, addr, &q, &r, &rb, &d), &d);
    CHECK(r.ok);
    uint64_t aoff = r.r.alloc.off;
    dp__blob_header_set_alloc(stage, r.incarnation, r.r.alloc.token);
    dp__wire_reply_fini(&r);
    dp__range l = {(uint64_t)(uintptr_t)stage, t.len};
    dp__range rr = {base + aoff, t.len};
    CHECK_OK_D(dp__endpoint_transfer(
                   ep, &(dp__xfer_desc){DP_XFER_WRITE, &l, 1, &rr, 1, name}, 10, &d),
               &d);
    q.op = DP_WIRE_OP_COMMIT;
    q.a.commit = (dp__wire_commit_args){.blob_id = dp__wire_s("A")};
    CHECK_OK_D(zcall(c, addr, &q, &r, &rb, &d), &d);
    CHECK(r.ok && r.r.commit == DP_WIRE_COMMIT_DONE);
    dp__wire_reply_fini(&r);

    dp__wire_str k = dp__wire_s("3@obs");
    q.op = DP_WIRE_OP_RESOLVE_KEYS;
    q.a.resolve_keys.keys = (dp__wire_strs){&k, 1};
    q.a.resolve_keys.inline_bytes = 0;
    CHECK_OK_D(zcall(c, addr, &q, &r, &rb, &d), &d);
    CHECK(r.ok && r.r.resolve_keys.entries.n == 1);
    uint64_t eoff = r.r.resolve_keys.entries.v[0].off,
             elen = r.r.resolve_keys.entries.v[0].len;
    char pin[64];
    dp__wire_str_copy(r.r.resolve_keys.pin_id, pin, sizeof pin);
    dp__wire_reply_fini(&r);
    CHECK_EQ(elen, plen);
    want = dp__crc32c(t.p + (eoff - aoff), plen);

    uint64_t g = 3;
    q.op = DP_WIRE_OP_RELEASE_ROWS;
    q.a.release_rows = (dp__wire_release_rows_args){{&g, 1}};
    CHECK_OK_D(zcall(c, addr, &q, &r, &rb, &d), &d);
    CHECK(r.ok && r.r.dropped == 1);
    dp__wire_reply_fini(&r);

    /* Writers fill the slab with 0xee: never A's region; then Busy. */
    memset(stage, 0xee, t.len);
    bool busy = false;
    for (int i = 0; i < 8 && !busy; i++) {
        char id[16];
        snprintf(id, sizeof id, "W%d", i);
        q.op = DP_WIRE_OP_ALLOC;
        q.a.alloc = (dp__wire_alloc_args){dp__wire_s(id), t.len, 0, false};
        CHECK_OK_D(zcall(c, addr, &q, &r, &rb, &d), &d);
        if (!r.ok) {
            CHECKF(dp__wire_str_eq(r.err.kind, "Busy"), "%.*s",
                   DP_WIRE_STR_ARG(r.err.kind));
            CHECK(dp__wire_str_eq(r.err.reason, "pins"));
            busy = true;
        } else {
            CHECK(r.r.alloc.off + t.len <= aoff || r.r.alloc.off >= aoff + t.len);
            dp__range wr = {base + r.r.alloc.off, t.len};
            CHECK_OK_D(
                dp__endpoint_transfer(
                    ep, &(dp__xfer_desc){DP_XFER_WRITE, &l, 1, &wr, 1, name}, 10, &d),
                &d);
        }
        dp__wire_reply_fini(&r);
    }
    CHECK(busy);

    /* The reader's READ still gets A's bytes. */
    void *dst = NULL;
    CHECK_OK_D(dp__endpoint_alloc(ep, plen, &dst, &d), &d);
    dp__range ll = {(uint64_t)(uintptr_t)dst, plen};
    dp__range rl = {base + eoff, plen};
    CHECK_OK_D(dp__endpoint_transfer(
                   ep, &(dp__xfer_desc){DP_XFER_READ, &ll, 1, &rl, 1, name}, 10, &d),
               &d);
    CHECK_EQ(dp__crc32c(dst, plen), want);

    /* Unpinned: A's region is handed out again. */
    q.op = DP_WIRE_OP_UNPIN;
    q.a.unpin.pin_id = dp__wire_s(pin);
    znotify(c, addr, &q);
    bool got = false;
    double t0 = dp_test_now();
    while (!got && dp_test_now() - t0 < 5) {
        q.op = DP_WIRE_OP_ALLOC;
        q.a.alloc = (dp__wire_alloc_args){dp__wire_s("after"), t.len, 0, false};
        CHECK_OK_D(zcall(c, addr, &q, &r, &rb, &d), &d);
        if (r.ok) {
            got = true;
            CHECK_EQ(r.r.alloc.off, aoff);
        }
        dp__wire_reply_fini(&r);
        if (!got)
            dp__sleep_s(0.01);
    }
    CHECK(got);
    dp__buf_fini(&rb);
    free(t.p);
    dp__endpoint_destroy(ep);
    dp__ctl_client_destroy(c);
    CHECK_EQ(peer_stop(&up, SIGTERM), 0);
}
