/*
 * bench_ctl: round-trip latency of the control plane (issue 4), next to a bare
 * ZMQ DEALER/ROUTER ping-pong measured in the same run.
 *
 * Two child processes: a storage unit exactly as `dataplane unit` builds it
 * (UCX endpoint with a progress thread, slab from the endpoint, ticker, ZMQ
 * control server), and a bare ROUTER that echoes every message. The parent is
 * the client: it measures, one request at a time, with the full client path
 * (encode the request, dp__ctl_call, decode the reply):
 *
 *   bare       a DEALER sends a message the size of a ping request, the ROUTER
 *              echoes it: the floor for any request/reply over ZMQ here;
 *   ping       the unit's cheapest op;
 *   alloc, commit
 *              a real 1-entry blob: alloc a region, WRITE the blob (built with
 *              src/blob's builder) into it with the parent's UCX endpoint, then
 *              commit, which validates the blob's index and publishes its key.
 *              The WRITE is not timed: alloc and commit are timed one by one,
 *              and "alloc+commit" is their sum per iteration. Each commit
 *              overwrites the same key, so the previous blob is freed and the
 *              slab never fills;
 *   resolve_keys x1 and x1024
 *              keys of a published 1024-entry blob; every resolve pins, so an
 *              unpin notify follows each one (not timed).
 *
 * Output: p50 and p99 in microseconds per op, the ratios ping/bare, and the
 * per-key cost of resolve_keys ((p50 x1024 - p50 x1) / 1023). Targets: ping
 * within 1.5x of bare, per key under 1 us. Timings are printed, not asserted.
 *
 * Usage: bench_ctl [--iters N]   (N: ping and bare iterations; the others scale)
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zmq.h>

#include "blob/blob.h"
#include "common/common.h"
#include "ctl/ctl.h"
#include "unit/server.h"
#include "unit/unit.h"
#include "wire/wire.h"
#include "xfer/endpoint.h"
#include "bench_util.h"

#define KEYS 1024

static void
die(const char *what, const dp_detail *d)
{
    fprintf(stderr, "bench_ctl: %s: %s\n", what, d ? d->msg : "");
    exit(1);
}

static void
write_line(int fd, const char *s)
{
    size_t n = strlen(s);
    while (n > 0) {
        ssize_t w = write(fd, s, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            _exit(3);
        s += w;
        n -= (size_t)w;
    }
}

/* ---- child 1: the unit ---- */

static int
unit_main(int fd)
{
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    dp_detail d;
    dp_detail_clear(&d);
    dp__unit_opts o;
    dp__unit_opts_init(&o);
    o.slab_bytes = 64ull << 20;
    o.unit_id = 0;
    o.n_units = 1;
    dp__unit_server *srv = NULL;
    if (dp__unit_server_open(&o, "bench-unit", "127.0.0.1", 0, 1.0, &srv, &d) != DP_OK)
        die("unit endpoint", &d);
    char line[256];
    snprintf(line, sizeof line, "%s\n", dp__unit_server_address(srv));
    write_line(fd, line);
    int sig;
    sigwait(&sigs, &sig);
    dp__unit_server_close(srv);
    return 0;
}

/* ---- child 2: a bare ROUTER echo ---- */

static int
echo_main(int fd)
{
    void *ctx = zmq_ctx_new();
    void *s = zmq_socket(ctx, ZMQ_ROUTER);
    if (s == NULL || zmq_bind(s, "tcp://127.0.0.1:*") != 0) {
        fprintf(stderr, "bench_ctl: echo bind: %s\n", zmq_strerror(zmq_errno()));
        return 1;
    }
    char addr[256];
    size_t alen = sizeof addr - 1;
    zmq_getsockopt(s, ZMQ_LAST_ENDPOINT, addr, &alen);
    char line[300];
    snprintf(line, sizeof line, "%s\n", addr);
    write_line(fd, line);
    zmq_msg_t id, body;
    zmq_msg_init(&id);
    zmq_msg_init(&body);
    for (;;) {
        if (zmq_msg_recv(&id, s, 0) < 0 || zmq_msg_recv(&body, s, 0) < 0)
            continue;
        zmq_msg_send(&id, s, ZMQ_SNDMORE);
        zmq_msg_send(&body, s, 0);
    }
}

static pid_t
spawn(int (*fn)(int), char *line, size_t cap)
{
    int fds[2];
    if (pipe(fds) != 0)
        die("pipe", NULL);
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0)
        die("fork", NULL);
    if (pid == 0) {
        close(fds[0]);
        _exit(fn(fds[1]));
    }
    close(fds[1]);
    size_t n = 0;
    while (n + 1 < cap) {
        ssize_t r = read(fds[0], line + n, 1);
        if (r <= 0 || line[n] == '\n')
            break;
        n++;
    }
    line[n] = '\0';
    close(fds[0]);
    if (n == 0)
        die("a child reported no address", NULL);
    return pid;
}

/* ---- measuring ---- */

typedef struct samples {
    double *v;
    size_t n, cap;
} samples;

static void
sample_add(samples *s, double us)
{
    if (s->n == s->cap) {
        s->cap = s->cap ? s->cap * 2 : 1024;
        s->v = realloc(s->v, s->cap * sizeof *s->v);
        if (s->v == NULL)
            die("out of memory", NULL);
    }
    s->v[s->n++] = us;
}

static double
pct(samples *s, double p)
{
    if (s->n == 0)
        return 0;
    qsort(s->v, s->n, sizeof *s->v, bench_cmp_double);
    size_t i = (size_t)(p * (double)(s->n - 1) + 0.5);
    return s->v[i];
}

typedef struct client {
    dp__ctl_client *ctl;
    dp__wire_rid_gen rids;
    const char *addr;
    dp__buf req, rep;
} client;

/* One request with the full client path; the reply stays decoded in *r. */
static double
call(client *c, dp__wire_request *q, dp__wire_reply *r)
{
    dp_detail d;
    dp_detail_clear(&d);
    char rid[DP_WIRE_RID_MAX];
    uint64_t t0 = dp__now_ns();
    q->rid = dp__wire_rid_next(&c->rids, rid);
    dp__buf_reset(&c->req);
    dp__buf_reset(&c->rep);
    if (dp__wire_request_encode(q, NULL, &c->req, &d) != DP_OK ||
        dp__ctl_call(c->ctl, c->addr, &c->req, rid, 10.0, &c->rep, &d) != DP_OK ||
        dp__wire_reply_decode(c->rep.data, c->rep.len, q->op, NULL, r, &d) != DP_OK)
        die(dp__wire_op_name(q->op), &d);
    double us = (double)(dp__now_ns() - t0) / 1e3;
    if (!r->ok) {
        dp__wire_error_to_detail(&r->err, &d);
        die(dp__wire_op_name(q->op), &d);
    }
    return us;
}

static void
unpin(client *c, dp__wire_str pin)
{
    if (pin.n == 0)
        return;
    dp__wire_request q;
    memset(&q, 0, sizeof q);
    q.op = DP_WIRE_OP_UNPIN;
    q.a.unpin.pin_id = pin;
    char rid[DP_WIRE_RID_MAX];
    q.rid = dp__wire_rid_next(&c->rids, rid);
    dp__buf_reset(&c->req);
    dp_detail d;
    if (dp__wire_request_encode(&q, NULL, &c->req, &d) != DP_OK ||
        dp__ctl_notify(c->ctl, c->addr, c->req.data, c->req.len, &d) != DP_OK)
        die("unpin", &d);
}

/* A laid-out blob of n entries "<g>@x" (g < n), 64 bytes each, in registered memory. */
typedef struct blob_img {
    void *buf;
    uint64_t len;
} blob_img;

static void
build_blob(dp__endpoint *ep, uint32_t n, blob_img *img)
{
    dp_detail d;
    dp_detail_clear(&d);
    dp__blob_builder *b = NULL;
    if (dp__blob_builder_create(0, &b, &d) != DP_OK)
        die("builder", &d);
    static uint8_t payload[64];
    memset(payload, 0x5a, sizeof payload);
    char key[32];
    for (uint32_t i = 0; i < n; i++) {
        snprintf(key, sizeof key, "%u@x", i);
        dp__blob_entry_spec e = {
            .key = key, .kind = DP_BLOB_BYTES, .len = sizeof payload, .payload = payload};
        if (dp__blob_builder_add(b, &e, NULL, &d) != DP_OK)
            die("builder add", &d);
    }
    dp__blob_layout lay;
    if (dp__blob_builder_layout(b, &lay, &d) != DP_OK)
        die("layout", &d);
    img->len = lay.total_len;
    if (dp__endpoint_alloc(ep, img->len, &img->buf, &d) != DP_OK)
        die("client alloc", &d);
    if (dp__blob_builder_write(b, img->buf, img->len, &d) != DP_OK ||
        dp__blob_builder_copy_payloads(b, img->buf, img->len, &d) != DP_OK)
        die("builder write", &d);
    dp__blob_builder_destroy(b);
}

/* alloc (timed), WRITE (not timed), commit (timed). */
static void
put_blob(client *c, dp__endpoint *ep, const char *remote, uint64_t slab_addr,
         const blob_img *img, uint32_t n_entries, const char *id, samples *s_alloc,
         samples *s_commit, samples *s_both)
{
    dp_detail d;
    dp_detail_clear(&d);
    dp__wire_request q;
    dp__wire_reply r;
    memset(&q, 0, sizeof q);
    q.op = DP_WIRE_OP_ALLOC;
    q.a.alloc = (dp__wire_alloc_args){dp__wire_s(id), img->len, n_entries, false};
    double ta = call(c, &q, &r);
    uint64_t off = r.r.alloc.off;
    /* The header names this allocation, or the commit refuses the blob (stale bytes). */
    dp__blob_header_set_alloc(img->buf, r.incarnation, r.r.alloc.token);
    dp__wire_reply_fini(&r);
    dp__range l = {(uint64_t)(uintptr_t)img->buf, img->len};
    dp__range rr = {slab_addr + off, img->len};
    if (dp__endpoint_transfer(ep, &(dp__xfer_desc){DP_XFER_WRITE, &l, 1, &rr, 1, remote},
                              10, &d) != DP_OK)
        die("WRITE", &d);
    memset(&q, 0, sizeof q);
    q.op = DP_WIRE_OP_COMMIT;
    q.a.commit.blob_id = dp__wire_s(id);
    double tc = call(c, &q, &r);
    if (r.r.commit != DP_WIRE_COMMIT_DONE)
        die("commit did not answer done", NULL);
    dp__wire_reply_fini(&r);
    if (s_alloc != NULL) {
        sample_add(s_alloc, ta);
        sample_add(s_commit, tc);
        sample_add(s_both, ta + tc);
    }
}

static void
row(const char *name, samples *s)
{
    printf("%-22s %10zu %10.1f %10.1f\n", name, s->n, pct(s, 0.5), pct(s, 0.99));
}

/* Every series the run measures. */
typedef struct ctl_samples {
    samples bare, ping, alloc, commit, both, rk1, rk1024;
} ctl_samples;

/* 0, or 2 after printing the usage line. */
static int
parse_args(int argc, char **argv, long *iters)
{
    *iters = 20000;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--iters") == 0 && i + 1 < argc) {
            *iters = strtol(argv[++i], NULL, 10);
        } else {
            fprintf(stderr, "usage: bench_ctl [--iters N]\n");
            return 2;
        }
    }
    if (*iters < 100)
        *iters = 100;
    return 0;
}

/* A ping request as the client encodes it: what the bare ping-pong carries. */
static void
encode_ping(client *c, dp__buf *msg)
{
    dp_detail d;
    dp_detail_clear(&d);
    dp__wire_request q;
    memset(&q, 0, sizeof q);
    q.op = DP_WIRE_OP_PING;
    char rid[DP_WIRE_RID_MAX];
    q.rid = dp__wire_rid_next(&c->rids, rid);
    dp__buf_init(msg);
    if (dp__wire_request_encode(&q, NULL, msg, &d) != DP_OK)
        die("encode", &d);
}

/* Bare ping-pongs and pings, interleaved, so both see the same machine. */
static void
ping_phase(client *c, void *dealer, const dp__buf *ping_msg, long iters, ctl_samples *s)
{
    dp__wire_request q;
    dp__wire_reply r;
    char back[256];
    long warm = iters / 10;
    for (long i = -warm; i < iters; i++) {
        uint64_t t0 = dp__now_ns();
        if (zmq_send(dealer, ping_msg->data, ping_msg->len, 0) < 0 ||
            zmq_recv(dealer, back, sizeof back, 0) < 0)
            die("bare ping-pong", NULL);
        double bus = (double)(dp__now_ns() - t0) / 1e3;
        memset(&q, 0, sizeof q);
        q.op = DP_WIRE_OP_PING;
        double us = call(c, &q, &r);
        dp__wire_reply_fini(&r);
        if (i >= 0) {
            sample_add(&s->bare, bus);
            sample_add(&s->ping, us);
        }
    }
}

/* The data path, to WRITE the blobs that alloc+commit publish. */
static dp__endpoint *
data_path_open(client *c, char *remote, uint64_t *slab_addr)
{
    dp_detail d;
    dp_detail_clear(&d);
    dp__endpoint *ep = NULL;
    if (dp__endpoint_create("bench-ctl-client", NULL, &ep, &d) != DP_OK)
        die("client endpoint", &d);
    dp__wire_request q;
    dp__wire_reply r;
    memset(&q, 0, sizeof q);
    q.op = DP_WIRE_OP_INFO;
    call(c, &q, &r);
    if (dp__endpoint_add_remote(ep, r.r.info.metadata.p, r.r.info.metadata.n, remote,
                                &d) != DP_OK)
        die("add_remote", &d);
    *slab_addr = r.r.info.slab_addr;
    dp__wire_reply_fini(&r);
    return ep;
}

/* alloc+commit of 1-entry blobs, then the 1024-entry blob resolve_keys reads. */
static void
put_phase(client *c, dp__endpoint *ep, const char *remote, uint64_t slab_addr, long iters,
          ctl_samples *s)
{
    blob_img one, many;
    build_blob(ep, 1, &one);
    build_blob(ep, KEYS, &many);
    long n_put = iters / 4;
    char id[64];
    for (long i = -n_put / 10; i < n_put; i++) {
        snprintf(id, sizeof id, "b%ld", i + n_put);
        bool keep = i >= 0;
        put_blob(c, ep, remote, slab_addr, &one, 1, id, keep ? &s->alloc : NULL,
                 &s->commit, &s->both);
    }
    put_blob(c, ep, remote, slab_addr, &many, KEYS, "many", NULL, NULL, NULL);
}

/* n resolve_keys of nk keys from keys (one key: a different one each time). */
static void
resolve_keys_pass(client *c, dp__wire_str *keys, uint32_t nk, long n, samples *s)
{
    dp__wire_request q;
    dp__wire_reply r;
    for (long i = -n / 10; i < n; i++) {
        memset(&q, 0, sizeof q);
        q.op = DP_WIRE_OP_RESOLVE_KEYS;
        q.a.resolve_keys.keys = (dp__wire_strs){keys + (nk == 1 ? i & 1023 : 0), nk};
        q.a.resolve_keys.inline_bytes = 0;
        double us = call(c, &q, &r);
        if (r.r.resolve_keys.entries.n != nk)
            die("resolve_keys: not every key was found", NULL);
        unpin(c, r.r.resolve_keys.pin_id);
        dp__wire_reply_fini(&r);
        if (i >= 0)
            sample_add(s, us);
    }
}

static void
resolve_keys_phase(client *c, long iters, ctl_samples *s)
{
    dp__wire_str keys[KEYS];
    char keybuf[KEYS][16];
    for (uint32_t i = 0; i < KEYS; i++) {
        snprintf(keybuf[i], sizeof keybuf[i], "%u@x", i);
        keys[i] = dp__wire_s(keybuf[i]);
    }
    resolve_keys_pass(c, keys, 1, iters / 2, &s->rk1);
    resolve_keys_pass(c, keys, KEYS, iters / 20, &s->rk1024);
}

static void
print_results(long iters, ctl_samples *s)
{
    printf("bench_ctl: one request at a time, client and servers on 127.0.0.1, "
           "%ld ping iterations\n",
           iters);
    printf("%-22s %10s %10s %10s\n", "op", "n", "p50 us", "p99 us");
    row("bare zmq ping-pong", &s->bare);
    row("ping", &s->ping);
    row("alloc", &s->alloc);
    row("commit (1 entry)", &s->commit);
    row("alloc+commit", &s->both);
    row("resolve_keys x1", &s->rk1);
    row("resolve_keys x1024", &s->rk1024);
    double b50 = pct(&s->bare, 0.5), b99 = pct(&s->bare, 0.99);
    double per_key = (pct(&s->rk1024, 0.5) - pct(&s->rk1, 0.5)) / (KEYS - 1);
    printf("\nping / bare: p50 %.2fx, p99 %.2fx (target <= 1.5x)\n",
           pct(&s->ping, 0.5) / b50, pct(&s->ping, 0.99) / b99);
    printf("alloc+commit / bare: p50 %.2fx\n", pct(&s->both, 0.5) / b50);
    printf("resolve_keys per key: %.3f us (p50 x1024 - p50 x1) / 1023 (target < 1 us)\n",
           per_key);
    printf("RESULT bare_p50=%.1f bare_p99=%.1f ping_p50=%.1f ping_p99=%.1f "
           "alloc_commit_p50=%.1f alloc_commit_p99=%.1f rk1_p50=%.1f rk1_p99=%.1f "
           "rk1024_p50=%.1f rk1024_p99=%.1f per_key_us=%.3f\n",
           b50, b99, pct(&s->ping, 0.5), pct(&s->ping, 0.99), pct(&s->both, 0.5),
           pct(&s->both, 0.99), pct(&s->rk1, 0.5), pct(&s->rk1, 0.99),
           pct(&s->rk1024, 0.5), pct(&s->rk1024, 0.99), per_key);
    fflush(stdout);
}

static void
samples_free(ctl_samples *s)
{
    free(s->bare.v);
    free(s->ping.v);
    free(s->alloc.v);
    free(s->commit.v);
    free(s->both.v);
    free(s->rk1.v);
    free(s->rk1024.v);
}

int
main(int argc, char **argv)
{
    long iters;
    if (parse_args(argc, argv, &iters) != 0)
        return 2;
    char unit_addr[256], echo_addr[256];
    pid_t unit_pid = spawn(unit_main, unit_addr, sizeof unit_addr);
    pid_t echo_pid = spawn(echo_main, echo_addr, sizeof echo_addr);

    dp_detail d;
    dp_detail_clear(&d);
    client c = {.addr = unit_addr};
    if (dp__ctl_client_create(&c.ctl, &d) != DP_OK || dp__wire_rid_gen_init(&c.rids, &d))
        die("client", &d);
    dp__buf ping_msg;
    encode_ping(&c, &ping_msg);

    void *zctx = zmq_ctx_new();
    void *dealer = zmq_socket(zctx, ZMQ_DEALER);
    if (dealer == NULL || zmq_connect(dealer, echo_addr) != 0)
        die("bare connect", NULL);
    ctl_samples s;
    memset(&s, 0, sizeof s);
    ping_phase(&c, dealer, &ping_msg, iters, &s);

    char remote[256];
    uint64_t slab_addr;
    dp__endpoint *ep = data_path_open(&c, remote, &slab_addr);
    put_phase(&c, ep, remote, slab_addr, iters, &s);
    resolve_keys_phase(&c, iters, &s);
    print_results(iters, &s);

    zmq_close(dealer);
    zmq_ctx_term(zctx);
    dp__endpoint_destroy(ep);
    dp__ctl_client_destroy(c.ctl);
    dp__buf_fini(&c.req);
    dp__buf_fini(&c.rep);
    dp__buf_fini(&ping_msg);
    kill(unit_pid, SIGTERM);
    kill(echo_pid, SIGKILL);
    waitpid(unit_pid, NULL, 0);
    waitpid(echo_pid, NULL, 0);
    samples_free(&s);
    return 0;
}
