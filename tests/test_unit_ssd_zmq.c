/*
 * Tests for the unit's SSD tier (docs/design.md, SSD tier) across processes:
 * a unit in another process over real ZMQ and UCX, whose puts spill and whose
 * rows stage back and are read byte for byte, which is SIGKILLed with its
 * files open and leaves nothing in ssd_dir, and whose disk fills up (puts
 * answer "lost"); and the `dataplane unit` SSD flags through the real binary.
 * The tier in process is tested in test_unit_ssd.c and test_unit_ssd_io.c.
 */
#include "dp_test.h"
#include "dp_tsan_ucx.h"
#include "dp_proc.h"
#include "dp_unit_blob.h"
#include "dp_unit_ssd_fixture.h"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "blob/blob.h"
#include "common/common.h"
#include "ctl/ctl.h"
#include "unit/server.h"
#include "unit/unit.h"
#include "wire/wire.h"
#include "xfer/endpoint.h"

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
    dp__unit_opts o;
    dp__unit_opts_init(&o);
    o.slab_bytes = 1 << 20;
    o.read_pin_s = 10;
    o.quarantine_s = 0.1;
    o.numa = DP_UNIT_NUMA_OFF;
    o.ssd_dir = getenv("DP_TEST_SSD_DIR");
    o.staging_bytes = 1 << 20;
    o.pickup_s = 0.2;
    dp__unit_server *srv = NULL;
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
    dp__ctl_client *c;
    const char *addr;
    dp__wire_rid_gen rid;
    dp__endpoint *ep;
    char name[256];
    uint64_t base;
    dp__buf rb;
} zc;

static int
zcall(zc *z, dp__wire_request *q, dp__wire_reply *rep, dp_detail *d)
{
    char rid[DP_WIRE_RID_MAX];
    q->rid = dp__wire_rid_next(&z->rid, rid);
    dp__buf req = {0};
    CHECK_OK_D(dp__wire_request_encode(q, NULL, &req, d), d);
    dp__buf_reset(&z->rb);
    int rc = dp__ctl_call(z->c, z->addr, &req, rid, 10.0, &z->rb, d);
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
    dp__wire_request q;
    memset(&q, 0, sizeof q);
    q.op = DP_WIRE_OP_INFO;
    dp__wire_reply r;
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
static dp__wire_commit_state
zput(zc *z, const char *id, const tblob *t)
{
    dp_detail d;
    dp_detail_clear(&d);
    void *buf = NULL;
    CHECK_OK_D(dp__endpoint_alloc(z->ep, t->len, &buf, &d), &d);
    memcpy(buf, t->p, t->len);
    dp__wire_request q;
    dp__wire_reply r;
    memset(&q, 0, sizeof q);
    uint64_t off = 0;
    double t0 = dp_test_now();
    for (;;) {
        q.op = DP_WIRE_OP_ALLOC;
        q.a.alloc = (dp__wire_alloc_args){dp__wire_s(id), t->len, t->n, true};
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
    dp__range l = {(uint64_t)(uintptr_t)buf, t->len};
    dp__range rr = {z->base + off, t->len};
    CHECK_OK_D(
        dp__endpoint_transfer(
            z->ep, &(dp__xfer_desc){DP_XFER_WRITE, &l, 1, &rr, 1, z->name}, 10, &d),
        &d);
    dp__wire_commit_state st;
    t0 = dp_test_now();
    for (;;) {
        q.op = DP_WIRE_OP_COMMIT;
        q.a.commit = (dp__wire_commit_args){.blob_id = dp__wire_s(id)};
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
    dp__wire_str k = dp__wire_s(ka);
    dp_detail d;
    dp_detail_clear(&d);
    dp__wire_request q;
    dp__wire_reply r;
    memset(&q, 0, sizeof q);
    double t0 = dp_test_now();
    for (;;) {
        q.op = DP_WIRE_OP_RESOLVE_KEYS;
        q.a.resolve_keys.keys = (dp__wire_strs){&k, 1};
        q.a.resolve_keys.inline_bytes = 0;
        CHECK_OK_D(zcall(z, &q, &r, &d), &d);
        CHECK(r.ok);
        dp__wire_resolve_keys_res *x = &r.r.resolve_keys;
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
        dp__range l = {(uint64_t)(uintptr_t)dst, la};
        dp__range rr = {z->base + x->entries.v[0].off, la};
        CHECK_OK_D(
            dp__endpoint_transfer(
                z->ep, &(dp__xfer_desc){DP_XFER_READ, &l, 1, &rr, 1, z->name}, 10, &d),
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
        dp__buf req = {0};
        CHECK_OK(dp__wire_request_encode(&q, NULL, &req, NULL));
        CHECK_OK(dp__ctl_notify(z->c, z->addr, req.data, req.len, NULL));
        dp__buf_fini(&req);
        return RD_OK;
    }
}

static uint64_t
zstat(zc *z, const char *name)
{
    dp__wire_request q;
    memset(&q, 0, sizeof q);
    q.op = DP_WIRE_OP_STATS;
    dp__wire_reply r;
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
        dp__wire_commit_state st = zput(&z, id, &t);
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
    dp__wire_request q;
    memset(&q, 0, sizeof q);
    q.op = DP_WIRE_OP_INFO;
    dp__wire_reply r;
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
