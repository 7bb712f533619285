/*
 * `dataplane bench`: batches shaped like RL rollouts against a running
 * cluster (put, get and clear of rows x fields, jagged sizes, content checked
 * by CRC32C, GB/s and batch latency percentiles), over the client library.
 *
 * It puts from and gets into memory registered with the client
 * (dp_client_alloc) by default, so each byte moves once per operation, as a
 * trainer that allocates through the library would; --memory malloc puts
 * plain memory instead (copied straight into units on this host, through
 * staging, one more copy, towards units on other hosts).
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "blob/crc32c.h"
#include "cli/cli.h"
#include "http/http.h"
#include "dataplane/client.h"

static const char usage_bench[] =
    "usage: dataplane bench [options]\n"
    "\n"
    "Put, get and clear batches shaped like RL rollouts against a running cluster:\n"
    "each iteration puts ROWS rows x FIELDS fields in one batch, gets every value\n"
    "back in one batch and checks its CRC32C, then clears the rows. Prints GB/s\n"
    "and the p50/p99 latency of a batch per operation (and progress on long runs).\n"
    "Rows G .. G+ROWS-1 (--first-row) are overwritten and cleared: keep them away\n"
    "from data that matters.\n"
    "\n"
    "options:\n"
    "  --rows N          rows per batch (64)\n"
    "  --fields N        fields per row (1)\n"
    "  --bytes SIZE      bytes per value, e.g. 4K, 1M (1M)\n"
    "  --jagged F        value sizes uniform in [SIZE*(1-F), SIZE], 0 <= F < 1 (0)\n"
    "  --iters N         measured iterations (20)\n"
    "  --warmup N        iterations run first and not counted (2)\n"
    "  --first-row G     rows used are G .. G+N-1 (0)\n"
    "  --memory M        registered (values in client-registered memory, no copy)\n"
    "                    or malloc (plain memory: copied straight to units on\n"
    "                    this host, through staging to others) (registered)\n"
    "  --no-verify       skip the CRC32C check of what get returns\n"
    "  --hints           keep each put's location hints and hand them to the get\n"
    "                    (it pins whole blobs instead of looking up every key)\n"
    "  --seed S          seed of the sizes and contents (time)\n"
    "  --cluster PATH    the cluster file, or a directory holding cluster.json\n"
    "                    or a registry: etcd://HOST:PORT/NAME\n"
    "                    (default: $DP_CLUSTER, else the default directory)\n"
    "  --timeout-s S     time budget of connecting, and of each batch operation (30)\n"
    "  --metrics IP:PORT serve this client's counters at http://IP:PORT/metrics\n"
    "                    (Prometheus text format) while the benchmark runs\n"
    "  -h, --help        this text\n"
    "\n"
    "example:\n"
    "  dataplane bench --rows 1024 --fields 4 --bytes 4K --jagged 0.5 --iters 50\n";

enum {
    O_CLUSTER = 1,
    O_TIMEOUT,
    O_ROWS,
    O_FIELDS,
    O_BYTES,
    O_JAGGED,
    O_ITERS,
    O_WARMUP,
    O_FIRST,
    O_MEMORY,
    O_NOVERIFY,
    O_SEED,
    O_METRICS,
    O_HINTS,
};

typedef struct bench_opts {
    uint64_t rows, fields, bytes, iters, warmup, first_row, seed;
    double jagged, timeout_s;
    bool registered, verify, hints;
    const char *cluster, *metrics;
} bench_opts;

/* Fill p[0..n) with a pattern unique to (seed, iteration, cell): cheap, not memset. */
static void
fill(uint8_t *p, uint64_t n, uint64_t seed)
{
    uint64_t s = seed, w = dp__splitmix64(&s), step = dp__splitmix64(&s) | 1;
    uint64_t i = 0;
    for (; i + 8 <= n; i += 8, w += step)
        memcpy(p + i, &w, 8);
    for (; i < n; i++)
        p[i] = (uint8_t)(w >> (8 * (i & 7)));
}

typedef struct lat {
    double *v;
    size_t n;
    double total_s;
    uint64_t bytes;
} lat;

static int
cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double
pctl(lat *l, double p)
{
    if (l->n == 0)
        return 0;
    qsort(l->v, l->n, sizeof *l->v, cmp_d);
    return l->v[(size_t)(p * (double)(l->n - 1) + 0.5)];
}

/* One batch's layout and buffers, and the timings of every operation. */
typedef struct bench_state {
    uint64_t cells;       /* rows x fields */
    uint64_t batch_bytes; /* the values' bytes in one batch */
    uint64_t alloc_len;   /* of src and dst */
    uint64_t *size, *off; /* per cell: its size, its offset in src and dst */
    uint32_t *crc;        /* per cell: CRC32C of what was put */
    uint64_t *gidx;
    char **fields;
    dp_value *vals;
    dp_get_item *items;
    dp_loc *locs; /* --hints: the put's, handed to the get */
    char *keybuf;
    lat put, get, clr;
    uint8_t *src, *dst;
} bench_state;

/* The options of bench; returns -1 when it is to run, else the exit status. */
static int
bench_parse(int argc, char **argv, bench_opts *o)
{
    static const struct option opts[] = {
        {"rows", required_argument, NULL, O_ROWS},
        {"fields", required_argument, NULL, O_FIELDS},
        {"bytes", required_argument, NULL, O_BYTES},
        {"jagged", required_argument, NULL, O_JAGGED},
        {"iters", required_argument, NULL, O_ITERS},
        {"warmup", required_argument, NULL, O_WARMUP},
        {"first-row", required_argument, NULL, O_FIRST},
        {"memory", required_argument, NULL, O_MEMORY},
        {"no-verify", no_argument, NULL, O_NOVERIFY},
        {"hints", no_argument, NULL, O_HINTS},
        {"seed", required_argument, NULL, O_SEED},
        {"cluster", required_argument, NULL, O_CLUSTER},
        {"timeout-s", required_argument, NULL, O_TIMEOUT},
        {"metrics", required_argument, NULL, O_METRICS},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0}};
    *o = (bench_opts){.rows = 64,
                      .fields = 1,
                      .bytes = 1 << 20,
                      .iters = 20,
                      .warmup = 2,
                      .timeout_s = 30,
                      .registered = true,
                      .verify = true,
                      .seed = (uint64_t)(dp__wall_s() * 1e6)};
    dp_detail d;
    dp_detail_clear(&d);
    int c;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        int rc = DP_OK;
        switch (c) {
        case O_ROWS:
            rc = dp__parse_u64(optarg, 1, 1u << 20, &o->rows, "--rows", &d);
            break;
        case O_FIELDS:
            rc = dp__parse_u64(optarg, 1, 1024, &o->fields, "--fields", &d);
            break;
        case O_BYTES:
            rc = dp__parse_size(optarg, &o->bytes, "--bytes", &d);
            break;
        case O_JAGGED:
            rc = dp__parse_seconds(optarg, &o->jagged, "--jagged", &d);
            if (rc == DP_OK && !(o->jagged < 1))
                rc = dp__fail(&d, DP_EINVAL, "--jagged must be in [0, 1)");
            break;
        case O_ITERS:
            rc = dp__parse_u64(optarg, 1, UINT32_MAX, &o->iters, "--iters", &d);
            break;
        case O_WARMUP:
            rc = dp__parse_u64(optarg, 0, UINT32_MAX, &o->warmup, "--warmup", &d);
            break;
        case O_FIRST:
            rc = dp__parse_u64(optarg, 0, UINT64_MAX / 2, &o->first_row, "--first-row",
                               &d);
            break;
        case O_MEMORY:
            if (strcmp(optarg, "registered") == 0)
                o->registered = true;
            else if (strcmp(optarg, "malloc") == 0)
                o->registered = false;
            else
                return dp__cli_usage(
                    "bench", "--memory must be registered or malloc, not '%s'", optarg);
            break;
        case O_NOVERIFY:
            o->verify = false;
            break;
        case O_HINTS:
            o->hints = true;
            break;
        case O_SEED:
            rc = dp__parse_u64(optarg, 0, UINT64_MAX, &o->seed, "--seed", &d);
            break;
        case O_CLUSTER:
            o->cluster = optarg;
            break;
        case O_TIMEOUT:
            rc = dp__cli_parse_timeout(optarg, "--timeout-s", &o->timeout_s, &d);
            break;
        case O_METRICS: {
            char ip[64];
            uint16_t port;
            rc = dp__http_parse_addr(optarg, ip, sizeof ip, &port, &d);
            o->metrics = optarg;
            break;
        }
        case 'h':
            fputs(usage_bench, stdout);
            return 0;
        default:
            return dp__cli_bad_option("bench", argv[optind - 1]);
        }
        if (rc != DP_OK)
            return dp__cli_usage("bench", "%s", d.msg);
    }
    if (optind < argc)
        return dp__cli_unexpected("bench", argv[optind]);
    uint64_t cells = o->rows * o->fields;
    if (cells > (1u << 22))
        return dp__cli_usage("bench", "--rows x --fields must be at most %u", 1u << 22);
    if (o->bytes > (64ull << 30) / cells)
        return dp__cli_usage("bench",
                             "a batch of more than 64 GiB is not a benchmark here");
    return -1;
}

/*
 * Sizes (jagged) and the layout of one batch, each value 64-byte aligned, its
 * buffers (client-registered or malloc'd), keys and values. Returns -1 when
 * ready, else the exit status (said); b is freed by bench_free either way.
 */
static int
bench_setup(dp_client *cl, const bench_opts *o, bench_state *b)
{
    dp_detail d;
    dp_detail_clear(&d);
    uint64_t cells = b->cells = o->rows * o->fields;
    b->size = calloc(cells, sizeof *b->size);
    b->off = calloc(cells, sizeof *b->off);
    b->crc = calloc(cells, sizeof *b->crc);
    b->gidx = calloc(o->rows, sizeof *b->gidx);
    b->fields = calloc(o->fields, sizeof *b->fields);
    b->vals = calloc(cells, sizeof *b->vals);
    b->items = calloc(cells, sizeof *b->items);
    b->locs = o->hints ? calloc(cells, sizeof *b->locs) : NULL;
    b->keybuf = calloc(cells, 48);
    b->put = (lat){calloc(o->iters, sizeof(double)), 0, 0, 0};
    b->get = (lat){calloc(o->iters, sizeof(double)), 0, 0, 0};
    b->clr = (lat){calloc(o->iters, sizeof(double)), 0, 0, 0};
    if (!b->size || !b->off || !b->crc || !b->gidx || !b->fields || !b->vals ||
        !b->items || !b->keybuf || !b->put.v || !b->get.v || !b->clr.v ||
        (o->hints && !b->locs))
        return dp__cli_fail("bench", dp__fail(&d, DP_ENOMEM, "out of memory"), &d);
    uint64_t rs = o->seed, total = 0;
    for (uint64_t i = 0; i < cells; i++) {
        uint64_t lo = (uint64_t)((double)o->bytes * (1 - o->jagged));
        b->size[i] =
            o->jagged > 0 ? lo + dp__splitmix64(&rs) % (o->bytes - lo + 1) : o->bytes;
        b->off[i] = total;
        total += DP_ALIGN_UP(b->size[i], 64);
    }
    b->batch_bytes = 0;
    for (uint64_t i = 0; i < cells; i++)
        b->batch_bytes += b->size[i];
    b->alloc_len = DP_MAX(total, 64);
    int rc;
    if (o->registered) {
        if ((rc = dp_client_alloc(cl, b->alloc_len, (void **)&b->src, &d)) != DP_OK ||
            (rc = dp_client_alloc(cl, b->alloc_len, (void **)&b->dst, &d)) != DP_OK)
            return dp__cli_fail("bench", rc, &d);
    } else {
        b->src = malloc(b->alloc_len);
        b->dst = malloc(b->alloc_len);
        if (b->src == NULL || b->dst == NULL)
            return dp__cli_fail("bench", dp__fail(&d, DP_ENOMEM, "out of memory"), &d);
    }
    memset(b->src, 0, b->alloc_len);
    memset(b->dst, 0, b->alloc_len);
    for (uint64_t f = 0; f < o->fields; f++) {
        b->fields[f] = malloc(24);
        if (b->fields[f] == NULL)
            return dp__cli_fail("bench", dp__fail(&d, DP_ENOMEM, "out of memory"), &d);
        snprintf(b->fields[f], 24, "f%" PRIu64, f);
    }
    for (uint64_t r = 0; r < o->rows; r++) {
        b->gidx[r] = o->first_row + r;
        for (uint64_t f = 0; f < o->fields; f++) {
            uint64_t i = r * o->fields + f;
            b->vals[i] = (dp_value){
                .data = b->src + b->off[i], .nbytes = b->size[i], .kind = DP_KIND_BYTES};
            char *k = b->keybuf + i * 48;
            snprintf(k, 48, "%" PRIu64 "@%s", b->gidx[r], b->fields[f]);
            b->items[i] = (dp_get_item){.key = k,
                                        .dst = b->dst + b->off[i],
                                        .cap = b->size[i],
                                        .loc = b->locs != NULL ? &b->locs[i] : NULL};
        }
    }
    return -1;
}

/*
 * Iteration it: fill the values, put them, get them back (and check them),
 * clear the rows; timings kept past the warm-up. Returns -1, else the exit
 * status (said).
 */
static int
bench_iter(dp_client *cl, const bench_opts *o, bench_state *b, uint64_t it)
{
    dp_detail d;
    dp_detail_clear(&d);
    bool keep = it >= o->warmup;
    for (uint64_t i = 0; i < b->cells; i++) {
        fill(b->src + b->off[i], b->size[i], o->seed ^ (it << 32) ^ i);
        if (o->verify)
            b->crc[i] = dp__crc32c(b->src + b->off[i], b->size[i]);
    }
    double t0 = dp__now_s();
    int rc = dp_client_put_locs(cl, b->gidx, o->rows, (const char *const *)b->fields,
                                o->fields, b->vals, NULL, b->locs, &d);
    double t1 = dp__now_s();
    if (rc != DP_OK) {
        dp__fail_ctx(&d, rc, "iteration %" PRIu64 ": put", it);
        return dp__cli_fail("bench", rc, &d);
    }
    rc = dp_client_get(cl, b->items, b->cells, &d);
    double t2 = dp__now_s();
    if (rc != DP_OK) {
        dp__fail_ctx(&d, rc, "iteration %" PRIu64 ": get", it);
        return dp__cli_fail("bench", rc, &d);
    }
    if (o->verify) {
        for (uint64_t i = 0; i < b->cells; i++) {
            if (b->items[i].nbytes != b->size[i] ||
                dp__crc32c(b->dst + b->off[i], b->size[i]) != b->crc[i]) {
                fprintf(stderr,
                        "dataplane bench: iteration %" PRIu64 ": %s came back "
                        "different (%" PRIu64 " bytes, put %" PRIu64 ")\n",
                        it, b->items[i].key, b->items[i].nbytes, b->size[i]);
                return 1;
            }
        }
    }
    uint64_t dropped = 0;
    double t3 = dp__now_s();
    rc = dp_client_clear(cl, b->gidx, o->rows, &dropped, &d);
    double t4 = dp__now_s();
    if (rc != DP_OK) {
        dp__fail_ctx(&d, rc, "iteration %" PRIu64 ": clear", it);
        return dp__cli_fail("bench", rc, &d);
    }
    if (keep) {
        b->put.v[b->put.n++] = t1 - t0;
        b->put.total_s += t1 - t0;
        b->put.bytes += b->batch_bytes;
        b->get.v[b->get.n++] = t2 - t1;
        b->get.total_s += t2 - t1;
        b->get.bytes += b->batch_bytes;
        b->clr.v[b->clr.n++] = t4 - t3;
        b->clr.total_s += t4 - t3;
    }
    return -1;
}

/* The table, the content line and the RESULT line. */
static void
bench_report(const bench_opts *o, bench_state *b)
{
    char sz[32];
    lat *put = &b->put, *get = &b->get, *clr = &b->clr;
    printf("%-6s %8s %12s %10s %10s %10s\n", "op", "batches", "bytes/batch", "GB/s",
           "p50 ms", "p99 ms");
    double gput = (double)put->bytes / put->total_s / 1e9;
    double gget = (double)get->bytes / get->total_s / 1e9;
    printf("%-6s %8zu %12s %10.3f %10.3f %10.3f\n", "put", put->n,
           dp__fmt_size(b->batch_bytes, sz, sizeof sz), gput, pctl(put, 0.5) * 1e3,
           pctl(put, 0.99) * 1e3);
    printf("%-6s %8zu %12s %10.3f %10.3f %10.3f\n", "get", get->n,
           dp__fmt_size(b->batch_bytes, sz, sizeof sz), gget, pctl(get, 0.5) * 1e3,
           pctl(get, 0.99) * 1e3);
    printf("%-6s %8zu %12s %10s %10.3f %10.3f\n", "clear", clr->n, "-", "-",
           pctl(clr, 0.5) * 1e3, pctl(clr, 0.99) * 1e3);
    printf("%s%s\n",
           o->verify ? "content: every value checked (CRC32C)"
                     : "content: not checked (--no-verify)",
           o->hints ? "; gets with the puts' location hints" : "");
    printf("RESULT rows=%" PRIu64 " fields=%" PRIu64 " bytes=%" PRIu64
           " put_GBps=%.3f get_GBps=%.3f put_p50_ms=%.3f put_p99_ms=%.3f "
           "get_p50_ms=%.3f get_p99_ms=%.3f clear_p50_ms=%.3f\n",
           o->rows, o->fields, o->bytes, gput, gget, pctl(put, 0.5) * 1e3,
           pctl(put, 0.99) * 1e3, pctl(get, 0.5) * 1e3, pctl(get, 0.99) * 1e3,
           pctl(clr, 0.5) * 1e3);
}

/* Say what the client did to stay correct (if anything), free b, close cl. */
static void
bench_free(dp_client *cl, const bench_opts *o, bench_state *b)
{
    /* What the client did to stay correct: visible, so nobody misses it. */
    dp_client_counters cn;
    if (dp_client_counters_get(cl, &cn) == DP_OK &&
        (cn.restarts_seen | cn.rebinds | cn.units_down | cn.transfers_retained |
         cn.transfers_released) != 0)
        printf("client: %" PRIu64 " unit restarts seen, %" PRIu64 " re-binds, %" PRIu64
               " unit parts down, %" PRIu64 " transfers retained now (%" PRIu64
               " bytes), %" PRIu64 " released\n",
               cn.restarts_seen, cn.rebinds, cn.units_down, cn.transfers_retained,
               cn.retained_bytes, cn.transfers_released);
    if (o->registered) {
        dp_client_free(cl, b->src);
        dp_client_free(cl, b->dst);
    } else {
        free(b->src);
        free(b->dst);
    }
    if (b->fields != NULL)
        for (uint64_t f = 0; f < o->fields; f++)
            free(b->fields[f]);
    free(b->fields);
    free(b->size);
    free(b->off);
    free(b->crc);
    free(b->gidx);
    free(b->vals);
    free(b->items);
    free(b->locs);
    free(b->keybuf);
    free(b->put.v);
    free(b->get.v);
    free(b->clr.v);
    dp_client_close(cl);
}

/* The client's counters in the Prometheus text format (bench --metrics). */
static int
client_metrics(void *ctx, const char *path, dp__buf *body, const char **type)
{
    dp_client *cl = ctx;
    if (strcmp(path, "/healthz") == 0) {
        dp__buf_printf(body, "ok: bench running\n");
        return 200;
    }
    if (strcmp(path, "/metrics") != 0) {
        dp__buf_printf(body, "not found: /metrics and /healthz\n");
        return 404;
    }
    dp_client_counters k;
    if (dp_client_counters_get(cl, &k) != DP_OK)
        return 500;
    const struct {
        const char *name, *help;
        bool counter;
        uint64_t v;
    } m[] = {
        {"puts_total", "put calls", true, k.puts},
        {"put_bytes_total", "Value bytes of rows that landed", true, k.put_bytes},
        {"gets_total", "get calls", true, k.gets},
        {"get_bytes_total", "Value bytes gets returned", true, k.get_bytes},
        {"clears_total", "clear calls", true, k.clears},
        {"retries_total", "Backoff rounds (a unit busy, keys pending)", true, k.retries},
        {"busy_waits_total", "Requests a unit answered Busy", true, k.busy_waits},
        {"rebinds_total", "Data paths re-bound", true, k.rebinds},
        {"restarts_seen_total", "Unit restarts noticed", true, k.restarts_seen},
        {"units_down_total", "Operation parts failed on a unit down", true, k.units_down},
        {"staged_put_bytes_total", "Bytes puts copied into staging", true,
         k.staged_put_bytes},
        {"staged_get_bytes_total", "Bytes gets copied out of staging", true,
         k.staged_get_bytes},
        {"transfers_retained", "Transfers kept in the graveyard now", false,
         k.transfers_retained},
        {"transfers_released_total", "Retained transfers released", true,
         k.transfers_released},
        {"retained_bytes", "Memory retained transfers keep now", false, k.retained_bytes},
    };
    *type = "text/plain; version=0.0.4; charset=utf-8";
    for (size_t i = 0; i < DP_ARRAY_LEN(m); i++)
        dp__buf_printf(body,
                       "# HELP dataplane_client_%s %s\n# TYPE dataplane_client_%s %s\n"
                       "dataplane_client_%s{pid=\"%ld\"} %" PRIu64 "\n",
                       m[i].name, m[i].help, m[i].name,
                       m[i].counter ? "counter" : "gauge", m[i].name, (long)getpid(),
                       m[i].v);
    return 200;
}

int
dp__cmd_bench(int argc, char **argv)
{
    bench_opts o;
    int status = bench_parse(argc, argv, &o);
    if (status >= 0)
        return status;
    dp_client *cl = NULL;
    status = dp__cli_open_client("bench", o.cluster, o.timeout_s, &cl);
    if (status != 0)
        return status;
    bench_state b;
    memset(&b, 0, sizeof b);
    dp__http_server *http = NULL;
    if (o.metrics != NULL) {
        dp_detail md;
        dp_detail_clear(&md);
        int mrc = dp__http_server_open(o.metrics, client_metrics, cl, &http, &md);
        if (mrc != DP_OK) {
            status = dp__cli_fail("bench", mrc, &md);
            goto out;
        }
        fprintf(stderr, "bench: metrics at http://%s/metrics\n",
                dp__http_server_address(http));
    }
    status = bench_setup(cl, &o, &b);
    if (status >= 0)
        goto out;

    char sz[32], sz2[32];
    printf("bench: %u unit%s, %" PRIu64 " rows x %" PRIu64 " fields, %s per value%s, "
           "%s per batch, %s memory, %" PRIu64 " iterations (+%" PRIu64 " warm-up), "
           "seed %" PRIu64 "\n",
           dp_client_n_units(cl), dp_client_n_units(cl) == 1 ? "" : "s", o.rows, o.fields,
           dp__fmt_size(o.bytes, sz, sizeof sz), o.jagged > 0 ? " (jagged)" : "",
           dp__fmt_size(b.batch_bytes, sz2, sizeof sz2),
           o.registered ? "registered" : "malloc", o.iters, o.warmup, o.seed);
    fflush(stdout);
    dp__cli_print_lanes(cl);
    double t_report = dp__now_s() + 2;
    uint64_t n_all = o.warmup + o.iters;
    for (uint64_t it = 0; it < n_all; it++) {
        if ((status = bench_iter(cl, &o, &b, it)) >= 0)
            goto out;
        if (dp__now_s() >= t_report && b.put.n > 0) {
            fprintf(stderr, "  %" PRIu64 "/%" PRIu64 ": put %.2f GB/s, get %.2f GB/s\n",
                    it + 1, n_all, (double)b.put.bytes / b.put.total_s / 1e9,
                    (double)b.get.bytes / b.get.total_s / 1e9);
            t_report = dp__now_s() + 2;
        }
    }
    bench_report(&o, &b);
    status = 0;
out:
    dp__http_server_close(http); /* before the client its handler reads */
    bench_free(cl, &o, &b);
    return status;
}
