/*
 * Encode and decode rate of typical control messages: alloc and commit
 * requests and replies, resolve_keys with 1024 keys and its reply with 1024
 * entries. For each message: encode alone, decode alone (+ fini), and the
 * round trip, as the median of 7 runs of about 40 ms each; ns per message and
 * MB/s of message bytes. Total under 10 s.
 *
 *   bench_wire [runs]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wire/wire.h"

enum { NKEYS = 1024, RUNS_DEFAULT = 7 };

typedef struct msg {
    const char *name;
    bool request;
    dp__wire_request q;
    dp__wire_reply r;
} msg;

static void
encode(const msg *m, dp__buf *b)
{
    dp__buf_reset(b);
    int rc = m->request ? dp__wire_request_encode(&m->q, NULL, b, NULL)
                        : dp__wire_reply_encode(&m->r, NULL, b, NULL);
    if (rc != DP_OK) {
        fprintf(stderr, "%s: encode failed: %s\n", m->name, dp_strerror(rc));
        exit(1);
    }
}

static void
decode(const msg *m, const dp__buf *b)
{
    dp_detail d;
    int rc;
    if (m->request) {
        dp__wire_request q;
        rc = dp__wire_request_decode(b->data, b->len, NULL, &q, &d);
        dp__wire_request_fini(&q);
    } else {
        dp__wire_reply r;
        rc = dp__wire_reply_decode(b->data, b->len, m->r.op, NULL, &r, &d);
        dp__wire_reply_fini(&r);
    }
    if (rc != DP_OK) {
        fprintf(stderr, "%s: decode failed: %s\n", m->name, d.msg);
        exit(1);
    }
}

static int
cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* what: 0 encode, 1 decode, 2 both. Returns the median ns per message. */
static double
measure(const msg *m, int what, int runs)
{
    dp__buf b;
    dp__buf_init(&b);
    encode(m, &b);
    /* calibrate: iterations for about 40 ms */
    uint64_t iters = 1;
    for (;;) {
        uint64_t t0 = dp__now_ns();
        for (uint64_t i = 0; i < iters; i++) {
            if (what != 1)
                encode(m, &b);
            if (what != 0)
                decode(m, &b);
        }
        uint64_t dt = dp__now_ns() - t0;
        if (dt > 10000000 || iters > (1u << 30))
            break;
        iters *= 2;
    }
    iters *= 4;
    double *ns = malloc(sizeof(double) * (size_t)runs);
    for (int r = 0; r < runs; r++) {
        uint64_t t0 = dp__now_ns();
        for (uint64_t i = 0; i < iters; i++) {
            if (what != 1)
                encode(m, &b);
            if (what != 0)
                decode(m, &b);
        }
        ns[r] = (double)(dp__now_ns() - t0) / (double)iters;
    }
    qsort(ns, (size_t)runs, sizeof *ns, cmp_double);
    double med = ns[runs / 2];
    free(ns);
    dp__buf_fini(&b);
    return med;
}

int
main(int argc, char **argv)
{
    int runs = argc > 1 ? atoi(argv[1]) : RUNS_DEFAULT;
    if (runs < 1)
        runs = RUNS_DEFAULT;

    static char keybuf[NKEYS][32];
    static dp__wire_str keys[NKEYS];
    static dp__wire_key_loc locs[NKEYS];
    static const uint64_t shape[] = {1, 2048};
    for (int i = 0; i < NKEYS; i++) {
        snprintf(keybuf[i], sizeof keybuf[i], "%d@input_ids", 1000000 + i * 8);
        keys[i] = dp__wire_s(keybuf[i]);
        locs[i] = (dp__wire_key_loc){keys[i],
                                     (1ull << 30) + (uint64_t)i * 16448,
                                     16384,
                                     dp__wire_s("tensor"),
                                     dp__wire_s("int64"),
                                     shape,
                                     2};
    }
    dp__wire_str rid = dp__wire_s("9f3c2a7be0d14c55-1a2b");

    msg ms[6];
    memset(ms, 0, sizeof ms);
    ms[0].name = "alloc request";
    ms[0].request = true;
    ms[0].q = (dp__wire_request){.op = DP_WIRE_OP_ALLOC, .rid = rid};
    ms[0].q.a.alloc =
        (dp__wire_alloc_args){dp__wire_s("9f3c2a7be0d14c55-b-17"), 33 << 20, 1024, true};
    ms[1].name = "alloc reply";
    ms[1].r = (dp__wire_reply){.op = DP_WIRE_OP_ALLOC, .rid = rid, .ok = true};
    ms[1].r.r.alloc.off = 5ull << 30;
    ms[1].r.r.alloc.token = 12345;
    ms[2].name = "commit request";
    ms[2].request = true;
    ms[2].q = (dp__wire_request){.op = DP_WIRE_OP_COMMIT, .rid = rid};
    ms[2].q.a.commit.blob_id = dp__wire_s("9f3c2a7be0d14c55-b-17");
    ms[3].name = "commit reply";
    ms[3].r = (dp__wire_reply){.op = DP_WIRE_OP_COMMIT, .rid = rid, .ok = true};
    ms[3].r.r.commit = DP_WIRE_COMMIT_DONE;
    ms[4].name = "resolve_keys req (1024 keys)";
    ms[4].request = true;
    ms[4].q = (dp__wire_request){.op = DP_WIRE_OP_RESOLVE_KEYS, .rid = rid};
    ms[4].q.a.resolve_keys.keys = (dp__wire_strs){keys, NKEYS};
    ms[4].q.a.resolve_keys.inline_bytes = 0;
    ms[5].name = "resolve_keys reply (1024 ent)";
    ms[5].r = (dp__wire_reply){.op = DP_WIRE_OP_RESOLVE_KEYS, .rid = rid, .ok = true};
    ms[5].r.r.resolve_keys.pin_id = dp__wire_s("pin-9f3c2a7be0d14c55-42");
    ms[5].r.r.resolve_keys.entries = (dp__wire_key_locs){locs, NKEYS};

    printf("bench_wire: median of %d runs\n", runs);
    printf("%-30s %8s %12s %12s %12s %10s\n", "message", "bytes", "encode ns",
           "decode ns", "round ns", "round MB/s");
    uint64_t t0 = dp__now_ns();
    for (size_t i = 0; i < DP_ARRAY_LEN(ms); i++) {
        dp__buf b;
        dp__buf_init(&b);
        encode(&ms[i], &b);
        size_t bytes = b.len;
        dp__buf_fini(&b);
        double e = measure(&ms[i], 0, runs);
        double dcd = measure(&ms[i], 1, runs);
        double rt = measure(&ms[i], 2, runs);
        printf("%-30s %8zu %12.1f %12.1f %12.1f %10.1f\n", ms[i].name, bytes, e, dcd, rt,
               (double)bytes / rt * 1e3);
        if (i >= 4)
            printf("%-30s %8s %12.1f %12.1f %12.1f   (ns per key)\n", "", "", e / NKEYS,
                   dcd / NKEYS, rt / NKEYS);
    }
    printf("total %.2f s\n", (double)(dp__now_ns() - t0) / 1e9);
    return 0;
}
