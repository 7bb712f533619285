/*
 * bench_rl_batch: an RL-shaped batch through a running cluster, next to
 * memcpy of the same bytes measured in the same loop (issue 17).
 *
 * A batch is ROWS rows (512) of four fields, as a rollout step hands them to
 * a trainer: input_ids (int64, one token id per token, jagged: each row
 * 128..8192 tokens), logprobs (float32, the same length), reward (a float32
 * scalar) and done (a bool scalar). Values live in memory registered with
 * the client (or plain malloc memory with --memory malloc). Each iteration
 * fills the values (untimed), puts the batch, gets every value back into a
 * second buffer, checks every value's CRC32C (untimed), clears the rows
 * (untimed), and copies the same values with memcpy, piece by piece, into a
 * third buffer (timed: the limit). GB/s are value bytes / time; the table
 * gives medians over the iterations and their ratios to memcpy.
 *
 *   bench_rl_batch [--cluster C] [--rows 512] [--min-tokens 128]
 *                  [--max-tokens 8192] [--iters 20] [--warmup 3] [--hints]
 *                  [--memory registered|malloc] [--first-row G] [--seed S]
 *
 * --hints hands each put's location hints to the get. Timings are printed,
 * never asserted.
 */
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blob/crc32c.h"
#include "common/common.h"
#include "dataplane/client.h"
#include "bench_util.h"

enum { NF = 4 };
static const char *const fields[NF] = {"input_ids", "logprobs", "reward", "done"};

typedef struct opts {
    const char *cluster;
    uint64_t rows, min_tok, max_tok, iters, warmup, first, seed;
    bool hints, registered;
} opts;

static void
usage(FILE *f)
{
    fputs(
        "usage: bench_rl_batch [--cluster C] [--rows 512] [--min-tokens 128]\n"
        "                      [--max-tokens 8192] [--iters 20] [--warmup 3] [--hints]\n"
        "                      [--memory registered|malloc] [--first-row G] [--seed S]\n",
        f);
}

static int
parse(int argc, char **argv, opts *o)
{
    static const struct option lo[] = {{"cluster", required_argument, NULL, 'c'},
                                       {"rows", required_argument, NULL, 'r'},
                                       {"min-tokens", required_argument, NULL, 'm'},
                                       {"max-tokens", required_argument, NULL, 'M'},
                                       {"iters", required_argument, NULL, 'i'},
                                       {"warmup", required_argument, NULL, 'w'},
                                       {"hints", no_argument, NULL, 'H'},
                                       {"memory", required_argument, NULL, 'e'},
                                       {"first-row", required_argument, NULL, 'g'},
                                       {"seed", required_argument, NULL, 's'},
                                       {"help", no_argument, NULL, 'h'},
                                       {NULL, 0, NULL, 0}};
    *o = (opts){.rows = 512,
                .min_tok = 128,
                .max_tok = 8192,
                .iters = 20,
                .warmup = 3,
                .first = 0,
                .seed = 1,
                .registered = true};
    int c;
    while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
        char *end = NULL;
        uint64_t v = optarg != NULL ? strtoull(optarg, &end, 10) : 0;
        bool num = optarg != NULL && end != optarg && *end == '\0';
        switch (c) {
        case 'c':
            o->cluster = optarg;
            continue;
        case 'H':
            o->hints = true;
            continue;
        case 'e':
            if (strcmp(optarg, "registered") != 0 && strcmp(optarg, "malloc") != 0) {
                fprintf(stderr, "bench_rl_batch: --memory registered or malloc\n");
                return 2;
            }
            o->registered = strcmp(optarg, "registered") == 0;
            continue;
        case 'h':
            usage(stdout);
            return 0;
        case 'r':
        case 'm':
        case 'M':
        case 'i':
        case 'w':
        case 'g':
        case 's':
            if (!num) {
                fprintf(stderr, "bench_rl_batch: %s needs a number, not '%s'\n",
                        argv[optind - 1], optarg);
                return 2;
            }
            if (c == 'r')
                o->rows = v;
            else if (c == 'm')
                o->min_tok = v;
            else if (c == 'M')
                o->max_tok = v;
            else if (c == 'i')
                o->iters = v;
            else if (c == 'w')
                o->warmup = v;
            else if (c == 'g')
                o->first = v;
            else
                o->seed = v;
            continue;
        default:
            usage(stderr);
            return 2;
        }
    }
    if (optind < argc || o->rows == 0 || o->rows > 65536 || o->iters == 0 ||
        o->min_tok == 0 || o->min_tok > o->max_tok || o->max_tok > (1u << 22)) {
        fprintf(stderr, "bench_rl_batch: need 1 <= rows <= 65536, iters >= 1 and "
                        "1 <= min-tokens <= max-tokens <= 4194304\n");
        return 2;
    }
    return -1;
}

int
main(int argc, char **argv)
{
    opts o;
    int prc = parse(argc, argv, &o);
    if (prc >= 0)
        return prc;
    dp_detail d;
    dp_detail_clear(&d);
    dp_client *c = NULL;
    if (dp_client_open(o.cluster, NULL, &c, &d) != DP_OK) {
        fprintf(stderr, "bench_rl_batch: %s\n", dp_detail_msg(&d));
        return 1;
    }
    size_t R = o.rows, cells = R * NF;
    uint64_t *gidx = calloc(R, sizeof *gidx), *len = calloc(cells, sizeof *len);
    uint64_t *off = calloc(cells, sizeof *off), *shape = calloc(cells, sizeof *shape);
    uint32_t *crc = calloc(cells, sizeof *crc);
    dp_value *vals = calloc(cells, sizeof *vals);
    dp_get_item *items = calloc(cells, sizeof *items);
    dp_loc *locs = o.hints ? calloc(cells, sizeof *locs) : NULL;
    char(*keys)[48] = calloc(cells, sizeof *keys);
    double *tp = calloc(o.iters, sizeof *tp), *tg = calloc(o.iters, sizeof *tg);
    double *tm = calloc(o.iters, sizeof *tm);
    if (!gidx || !len || !off || !shape || !crc || !vals || !items || !keys || !tp ||
        !tg || !tm || (o.hints && !locs)) {
        fprintf(stderr, "bench_rl_batch: out of memory\n");
        return 1;
    }
    uint64_t s = o.seed, total = 0, bytes = 0;
    static const char *const dtypes[NF] = {"int64", "float32", "float32", "bool"};
    static const uint64_t esz[NF] = {8, 4, 4, 1};
    for (size_t r = 0; r < R; r++) {
        gidx[r] = o.first + r;
        uint64_t tok = o.min_tok + dp__splitmix64(&s) % (o.max_tok - o.min_tok + 1);
        for (size_t f = 0; f < NF; f++) {
            size_t i = r * NF + f;
            len[i] = f < 2 ? tok * esz[f] : esz[f];
            shape[i] = tok;
            off[i] = total;
            total += DP_ALIGN_UP(len[i], 64);
            bytes += len[i];
        }
    }
    uint8_t *src = NULL, *dst = NULL, *mdst = malloc(total);
    if (o.registered) {
        if (dp_client_alloc(c, total, (void **)&src, &d) != DP_OK ||
            dp_client_alloc(c, total, (void **)&dst, &d) != DP_OK) {
            fprintf(stderr, "bench_rl_batch: %s\n", dp_detail_msg(&d));
            return 1;
        }
    } else {
        src = malloc(total);
        dst = malloc(total);
    }
    if (src == NULL || dst == NULL || mdst == NULL) {
        fprintf(stderr, "bench_rl_batch: out of memory for 3 x %" PRIu64 " bytes\n",
                total);
        return 1;
    }
    memset(src, 0, total);
    memset(dst, 0, total);
    memset(mdst, 0, total);
    for (size_t r = 0; r < R; r++)
        for (size_t f = 0; f < NF; f++) {
            size_t i = r * NF + f;
            vals[i] = (dp_value){.data = src + off[i],
                                 .nbytes = len[i],
                                 .kind = DP_KIND_TENSOR,
                                 .dtype = dtypes[f],
                                 .shape = &shape[i],
                                 .ndim = f < 2 ? 1 : 0};
            snprintf(keys[i], sizeof keys[i], "%" PRIu64 "@%s", gidx[r], fields[f]);
            items[i] = (dp_get_item){.key = keys[i],
                                     .dst = dst + off[i],
                                     .cap = len[i],
                                     .loc = locs != NULL ? &locs[i] : NULL};
        }
    printf("bench_rl_batch: %zu rows x {input_ids int64, logprobs float32} of %" PRIu64
           "..%" PRIu64 " tokens, reward float32, done bool: %.2f MiB per batch, "
           "%s memory%s\n",
           R, o.min_tok, o.max_tok, (double)bytes / (1 << 20),
           o.registered ? "registered" : "malloc", o.hints ? ", location hints" : "");
    size_t n = 0;
    for (uint64_t it = 0; it < o.warmup + o.iters; it++) {
        for (size_t i = 0; i < cells; i++) {
            uint64_t w = o.seed ^ (it << 32) ^ i, *p = (uint64_t *)(void *)(src + off[i]);
            for (uint64_t k = 0; k < len[i] / 8; k++)
                p[k] = dp__splitmix64(&w);
            for (uint64_t k = len[i] / 8 * 8; k < len[i]; k++)
                src[off[i] + k] = (uint8_t)dp__splitmix64(&w);
            crc[i] = dp__crc32c(src + off[i], len[i]);
        }
        double t0 = dp__now_s();
        int rc = dp_client_put_locs(c, gidx, R, fields, NF, vals, NULL, locs, &d);
        double t1 = dp__now_s();
        if (rc == DP_OK)
            rc = dp_client_get(c, items, cells, &d);
        double t2 = dp__now_s();
        if (rc != DP_OK) {
            fprintf(stderr, "bench_rl_batch: iteration %" PRIu64 ": %s\n", it,
                    dp_detail_msg(&d));
            return 1;
        }
        for (size_t i = 0; i < cells; i++)
            if (items[i].nbytes != len[i] || dp__crc32c(dst + off[i], len[i]) != crc[i]) {
                fprintf(stderr, "bench_rl_batch: iteration %" PRIu64 ": %s differs\n", it,
                        keys[i]);
                return 1;
            }
        double t3 = dp__now_s();
        for (size_t i = 0; i < cells; i++)
            memcpy(mdst + off[i], src + off[i], len[i]);
        double t4 = dp__now_s();
        uint64_t dropped;
        if (dp_client_clear(c, gidx, R, &dropped, &d) != DP_OK) {
            fprintf(stderr, "bench_rl_batch: clear: %s\n", dp_detail_msg(&d));
            return 1;
        }
        if (it >= o.warmup) {
            tp[n] = (double)bytes / (t1 - t0) / 1e9;
            tg[n] = (double)bytes / (t2 - t1) / 1e9;
            tm[n] = (double)bytes / (t4 - t3) / 1e9;
            n++;
        }
    }
    double put = bench_median(tp, n), get = bench_median(tg, n), mc = bench_median(tm, n);
    dp_client_counters k;
    dp_client_counters_get(c, &k);
    printf("put %.3f GB/s (%.2fx memcpy), get %.3f GB/s (%.2fx), memcpy %.3f GB/s; "
           "medians of %zu iterations; every value checked (CRC32C); %" PRIu64
           " hint misses\n",
           put, put / mc, get, get / mc, mc, n, k.loc_misses);
    printf("RESULT rows=%zu bytes=%" PRIu64 " hints=%d put_GBps=%.3f get_GBps=%.3f "
           "memcpy_GBps=%.3f put_x=%.2f get_x=%.2f\n",
           R, bytes, o.hints, put, get, mc, put / mc, get / mc);
    if (o.registered) {
        dp_client_free(c, src);
        dp_client_free(c, dst);
    } else {
        free(src);
        free(dst);
    }
    free(mdst);
    free(gidx);
    free(len);
    free(off);
    free(shape);
    free(crc);
    free(vals);
    free(items);
    free(locs);
    free(keys);
    free(tp);
    free(tg);
    free(tm);
    dp_client_close(c);
    return 0;
}
