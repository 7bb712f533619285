/*
 * dp_longclient: a long-lived client process that fault tests drive through
 * its stdin. It opens a cluster once, then runs one command per input line
 * and answers each with exactly one line on stdout (flushed at once):
 *
 *   <verdict> <elapsed_s> [details]
 *
 * verdict is ok, err, corrupt or missing; elapsed_s is the time the library
 * call took, in seconds with 3 decimals, so a test can check that no call
 * hangs past its budget. After `err` comes the DP_ error name, then details.
 *
 *   put ROW0 NROWS BYTES SEED
 *       Rows ROW0..ROW0+NROWS-1, field "f", BYTES bytes each whose content is
 *       a function of (row, SEED) (value_fill), from registered memory
 *       (dp_client_alloc).
 *       ok T | err T NAME landed=RANGES failed=RANGES DETAIL
 *   get ROW0 NROWS BYTES SEED
 *       Gets them into registered memory (poisoned first) and checks every
 *       byte of every value that came back with status 0.
 *       ok T
 *       corrupt T ROWS first=ROW@OFFSET rc=NAME  (a value returned with
 *                 status 0 whose size or bytes are wrong: a false success)
 *       missing T ROWS                (every failed row is DP_ENOTFOUND)
 *       err T NAME ok=RANGES failed=RANGES missing=RANGES DETAIL
 *   clear ROW0 NROWS       ok T dropped=N | err T NAME DETAIL
 *   stats [all]            ok T u0:name=v,name=v u1:down=NAME ... (key
 *                          counters, or all of them) | err T NAME DETAIL ...
 *   counters               ok T restarts_seen=N,rebinds=N,units_down=N,
 *                          transfers_retained=N,transfers_released=N,
 *                          retained_bytes=N,resent=N (this client's own counters,
 *                          dp_client_counters_get; one word)
 *   sleep S                ok T
 *   quit                   ok 0.000, then close and exit 0 (also at end of input)
 *
 * Before any command it prints `ready T units=N` once the cluster is open,
 * or `err T NAME DETAIL` and exits 1. RANGES are "a-b,c" lists, "-" if none.
 *
 * Options: --cluster PATH (a cluster file or directory) or --units
 * tcp://a,tcp://b (unit addresses in cluster order); --timeout S sets
 * dp_client_opts.timeout_s and connect_timeout_s.
 *
 * Library and UCX messages never reach the answer stream: the answers go to
 * a private copy of stdout, and fd 1 is pointed at stderr before the client
 * opens. A failed call never ends the process; SIGTERM and SIGINT end it at
 * once (exit 143 / 130), which also works when it is the first process of a
 * PID namespace.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "dataplane/client.h"

#define FIELD "f"
#define MAX_ROWS (1u << 20)
#define MAX_TOTAL_BYTES (16ull << 30)

static FILE *answers;
static dp_client *cl;

static double
now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* ---- the deterministic content of a value ---- */

static uint64_t
splitmix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* xorshift64* seeded by row and seed: the bytes of row's value. */
typedef struct stream {
    uint64_t s;
} stream;

static void
stream_init(stream *st, uint64_t row, uint64_t seed)
{
    st->s = splitmix64(row * 0x100000001b3ull + seed) | 1;
}

static uint64_t
stream_next(stream *st)
{
    st->s ^= st->s >> 12;
    st->s ^= st->s << 25;
    st->s ^= st->s >> 27;
    return st->s * 0x2545f4914f6cdd1dull;
}

static void
value_fill(uint8_t *p, uint64_t n, uint64_t row, uint64_t seed)
{
    stream st;
    stream_init(&st, row, seed);
    uint64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w = stream_next(&st);
        memcpy(p + i, &w, 8);
    }
    if (i < n) {
        uint64_t w = stream_next(&st);
        memcpy(p + i, &w, n - i);
    }
}

/* Offset of the first wrong byte, or n when all match. */
static uint64_t
value_check(const uint8_t *p, uint64_t n, uint64_t row, uint64_t seed)
{
    stream st;
    stream_init(&st, row, seed);
    for (uint64_t i = 0; i < n; i += 8) {
        uint64_t w = stream_next(&st);
        uint64_t m = n - i < 8 ? n - i : 8;
        if (memcmp(p + i, &w, m) != 0) {
            const uint8_t *e = (const uint8_t *)&w;
            for (uint64_t j = 0; j < m; j++)
                if (p[i + j] != e[j])
                    return i + j;
        }
    }
    return n;
}

/* ---- answers ---- */

/* A list of row numbers as "a-b,c" ranges, "-" when empty. */
typedef struct rowset {
    char buf[1024];
    size_t len;
    uint64_t first, last, count;
    bool open;
} rowset;

static void
rowset_flush(rowset *r)
{
    if (!r->open)
        return;
    if (r->len + 48 >= sizeof r->buf) {
        if (r->len + 4 < sizeof r->buf && strcmp(r->buf + r->len - 3, "...") != 0)
            r->len += (size_t)snprintf(r->buf + r->len, sizeof r->buf - r->len, ",...");
    } else if (r->first == r->last) {
        r->len += (size_t)snprintf(r->buf + r->len, sizeof r->buf - r->len, "%s%" PRIu64,
                                   r->len ? "," : "", r->first);
    } else {
        r->len += (size_t)snprintf(r->buf + r->len, sizeof r->buf - r->len,
                                   "%s%" PRIu64 "-%" PRIu64, r->len ? "," : "", r->first,
                                   r->last);
    }
    r->open = false;
}

/* Rows must be added in increasing order. */
static void
rowset_add(rowset *r, uint64_t row)
{
    r->count++;
    if (r->open && row == r->last + 1) {
        r->last = row;
        return;
    }
    rowset_flush(r);
    r->first = r->last = row;
    r->open = true;
}

static const char *
rowset_str(rowset *r)
{
    rowset_flush(r);
    return r->len ? r->buf : "-";
}

/* One answer line: verdict, elapsed, then the rest (newlines made spaces). */
__attribute__((format(printf, 3, 4))) static void
answer(const char *verdict, double elapsed, const char *fmt, ...)
{
    char rest[16384] = "";
    if (fmt != NULL) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(rest, sizeof rest, fmt, ap);
        va_end(ap);
    }
    for (char *c = rest; *c; c++)
        if (*c == '\n' || *c == '\r')
            *c = ' ';
    fprintf(answers, "%s %.3f%s%s\n", verdict, elapsed, rest[0] ? " " : "", rest);
    fflush(answers);
}

static void answer_err(double elapsed, int rc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void
answer_err(double elapsed, int rc, const char *fmt, ...)
{
    char rest[16000];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(rest, sizeof rest, fmt, ap);
    va_end(ap);
    answer("err", elapsed, "%s %s", dp_errname(rc), rest);
}

/* ---- commands ---- */

static bool
parse_u64(const char *s, uint64_t *out)
{
    if (s == NULL || *s == '\0' || *s == '-')
        return false;
    char *end = NULL;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 0);
    if (errno != 0 || *end != '\0')
        return false;
    *out = v;
    return true;
}

/* Parse ROW0 NROWS [BYTES SEED] and check the sizes; false after answering. */
static bool
parse_rows(char **tok, int ntok, int want, uint64_t *row0, uint64_t *nrows,
           uint64_t *bytes, uint64_t *seed)
{
    if (ntok != want + 1 || !parse_u64(tok[1], row0) || !parse_u64(tok[2], nrows) ||
        (want == 4 && (!parse_u64(tok[3], bytes) || !parse_u64(tok[4], seed)))) {
        answer_err(0, DP_EINVAL, "usage: %s ROW0 NROWS%s", tok[0],
                   want == 4 ? " BYTES SEED" : "");
        return false;
    }
    if (*nrows == 0 || *nrows > MAX_ROWS || *row0 + *nrows < *row0) {
        answer_err(0, DP_EINVAL, "NROWS must be 1..%u", MAX_ROWS);
        return false;
    }
    if (want == 4 && (*bytes > MAX_TOTAL_BYTES || *bytes * *nrows > MAX_TOTAL_BYTES)) {
        answer_err(0, DP_EINVAL, "NROWS x BYTES above %llu",
                   (unsigned long long)MAX_TOTAL_BYTES);
        return false;
    }
    return true;
}

static uint64_t *
row_list(uint64_t row0, uint64_t nrows)
{
    uint64_t *g = malloc(nrows * sizeof *g);
    if (g != NULL)
        for (uint64_t r = 0; r < nrows; r++)
            g[r] = row0 + r;
    return g;
}

static void
cmd_put(char **tok, int ntok)
{
    uint64_t row0, nrows, bytes, seed;
    if (!parse_rows(tok, ntok, 4, &row0, &nrows, &bytes, &seed))
        return;
    dp_detail d;
    dp_detail_clear(&d);
    uint64_t *gidxs = row_list(row0, nrows);
    dp_value *vals = calloc(nrows, sizeof *vals);
    int *status = calloc(nrows, sizeof *status);
    void *mem = NULL;
    int rc = DP_ENOMEM;
    if (gidxs == NULL || vals == NULL || status == NULL) {
        answer_err(0, rc, "out of memory for %" PRIu64 " rows", nrows);
        goto out;
    }
    size_t total = (size_t)(bytes * nrows);
    if ((rc = dp_client_alloc(cl, total ? total : 1, &mem, &d)) != 0) {
        answer_err(0, rc, "dp_client_alloc(%zu): %s", total, dp_detail_msg(&d));
        goto out;
    }
    for (uint64_t r = 0; r < nrows; r++) {
        uint8_t *p = (uint8_t *)mem + r * bytes;
        value_fill(p, bytes, row0 + r, seed);
        vals[r] = (dp_value){.data = p, .nbytes = bytes, .kind = DP_KIND_BYTES};
    }
    const char *fields[] = {FIELD};
    double t0 = now_s();
    rc = dp_client_put(cl, gidxs, nrows, fields, 1, vals, status, &d);
    double el = now_s() - t0;
    if (rc == 0) {
        answer("ok", el, NULL);
    } else {
        rowset landed = {0}, failed = {0};
        for (uint64_t r = 0; r < nrows; r++)
            rowset_add(status[r] == 0 ? &landed : &failed, row0 + r);
        answer_err(el, rc, "landed=%s failed=%s %s", rowset_str(&landed),
                   rowset_str(&failed), dp_detail_msg(&d));
    }
out:
    /* dp_client_free keeps memory a failed transfer may still touch (retired). */
    dp_client_free(cl, mem);
    free(gidxs);
    free(vals);
    free(status);
}

static void
cmd_get(char **tok, int ntok)
{
    uint64_t row0, nrows, bytes, seed;
    if (!parse_rows(tok, ntok, 4, &row0, &nrows, &bytes, &seed))
        return;
    dp_detail d;
    dp_detail_clear(&d);
    dp_get_item *items = calloc(nrows, sizeof *items);
    char(*keys)[48] = calloc(nrows, sizeof *keys);
    void *mem = NULL;
    int rc = DP_ENOMEM;
    if (items == NULL || keys == NULL) {
        answer_err(0, rc, "out of memory for %" PRIu64 " rows", nrows);
        goto out;
    }
    size_t total = (size_t)(bytes * nrows);
    if ((rc = dp_client_alloc(cl, total ? total : 1, &mem, &d)) != 0) {
        answer_err(0, rc, "dp_client_alloc(%zu): %s", total, dp_detail_msg(&d));
        goto out;
    }
    /* Poison: a get that reports success without writing is caught. */
    memset(mem, 0xa5, total ? total : 1);
    for (uint64_t r = 0; r < nrows; r++) {
        snprintf(keys[r], sizeof keys[r], "%" PRIu64 "@" FIELD, row0 + r);
        items[r] = (dp_get_item){
            .key = keys[r], .dst = (uint8_t *)mem + r * bytes, .cap = bytes};
    }
    double t0 = now_s();
    rc = dp_client_get(cl, items, nrows, &d);
    double el = now_s() - t0;
    rowset good = {0}, bad = {0}, corrupt = {0}, missing = {0};
    uint64_t first_row = 0, first_off = 0;
    for (uint64_t r = 0; r < nrows; r++) {
        if (items[r].status == 0) {
            uint64_t off = items[r].nbytes != bytes
                               ? 0
                               : value_check(items[r].dst, bytes, row0 + r, seed);
            if (items[r].nbytes != bytes || off < bytes) {
                if (corrupt.count == 0) {
                    first_row = row0 + r;
                    first_off = items[r].nbytes != bytes ? UINT64_MAX : off;
                }
                rowset_add(&corrupt, row0 + r);
            } else {
                rowset_add(&good, row0 + r);
            }
        } else if (items[r].status == DP_ENOTFOUND) {
            rowset_add(&missing, row0 + r);
        } else {
            rowset_add(&bad, row0 + r);
        }
    }
    if (corrupt.count > 0) {
        char where[64];
        if (first_off == UINT64_MAX)
            snprintf(where, sizeof where, "%" PRIu64 "@size", first_row);
        else
            snprintf(where, sizeof where, "%" PRIu64 "@%" PRIu64, first_row, first_off);
        answer("corrupt", el, "%s first=%s rc=%s", rowset_str(&corrupt), where,
               rc == 0 ? "DP_OK" : dp_errname(rc));
    } else if (rc == 0 && bad.count == 0 && missing.count == 0) {
        answer("ok", el, NULL);
    } else if (bad.count == 0 && missing.count > 0) {
        answer("missing", el, "%s", rowset_str(&missing));
    } else {
        answer_err(el, rc ? rc : DP_EPROTO, "ok=%s failed=%s missing=%s %s",
                   rowset_str(&good), rowset_str(&bad), rowset_str(&missing),
                   rc ? dp_detail_msg(&d) : "(DP_OK returned with failed items)");
    }
out:
    dp_client_free(cl, mem);
    free(items);
    free(keys);
}

static void
cmd_clear(char **tok, int ntok)
{
    uint64_t row0, nrows;
    if (!parse_rows(tok, ntok, 2, &row0, &nrows, NULL, NULL))
        return;
    uint64_t *gidxs = row_list(row0, nrows);
    if (gidxs == NULL) {
        answer_err(0, DP_ENOMEM, "out of memory");
        return;
    }
    dp_detail d;
    dp_detail_clear(&d);
    uint64_t dropped = 0;
    double t0 = now_s();
    int rc = dp_client_clear(cl, gidxs, nrows, &dropped, &d);
    double el = now_s() - t0;
    if (rc == 0)
        answer("ok", el, "dropped=%" PRIu64, dropped);
    else
        answer_err(el, rc, "dropped=%" PRIu64 " %s", dropped, dp_detail_msg(&d));
    free(gidxs);
}

static const char *const key_counters[] = {
    "blobs",        "rows",          "entries", "pins",         "allocated_bytes",
    "free_bytes",   "allocs",        "commits", "aborts",       "resolves",
    "unpins",       "releases",      "busy",    "unit_full",    "leases_expired",
    "pins_expired", "retired_bytes", "writers", "writers_gone", "protocol_errors",
};

static void
cmd_stats(char **tok, int ntok)
{
    bool all = ntok == 2 && strcmp(tok[1], "all") == 0;
    if (ntok > 2 || (ntok == 2 && !all)) {
        answer_err(0, DP_EINVAL, "usage: stats [all]");
        return;
    }
    dp_detail d;
    dp_detail_clear(&d);
    dp_client_stats *s = NULL;
    double t0 = now_s();
    int rc = dp_client_stats_get(cl, &s, &d);
    double el = now_s() - t0;
    char line[12288];
    size_t k = 0;
    line[0] = '\0';
    for (uint32_t u = 0; s != NULL && u < dp_client_stats_units(s); u++) {
        int st = dp_client_stats_status(s, u);
        if (k + 64 >= sizeof line)
            break;
        if (st != 0) {
            k += (size_t)snprintf(line + k, sizeof line - k, "%su%u:down=%s",
                                  k ? " " : "", u, dp_errname(st));
            continue;
        }
        k += (size_t)snprintf(line + k, sizeof line - k, "%su%u:", k ? " " : "", u);
        size_t n = all ? dp_client_stats_count(s, u)
                       : sizeof key_counters / sizeof key_counters[0];
        bool first = true;
        for (size_t i = 0; i < n && k + 64 < sizeof line; i++) {
            const char *name = NULL;
            double v = 0;
            if (all ? !dp_client_stats_at(s, u, i, &name, &v)
                    : !dp_client_stats_find(s, u, (name = key_counters[i]), &v))
                continue;
            k += (size_t)snprintf(line + k, sizeof line - k, "%s%s=%.17g",
                                  first ? "" : ",", name, v);
            first = false;
        }
    }
    dp_client_stats_destroy(s);
    if (rc == 0)
        answer("ok", el, "%s", line);
    else
        answer_err(el, rc, "%s %s", line, dp_detail_msg(&d));
}

static void
cmd_counters(char **tok, int ntok)
{
    (void)tok;
    if (ntok != 1) {
        answer_err(0, DP_EINVAL, "usage: counters");
        return;
    }
    dp_client_counters k;
    double t0 = now_s();
    int rc = dp_client_counters_get(cl, &k);
    double el = now_s() - t0;
    if (rc != 0) {
        answer_err(el, rc, "dp_client_counters_get");
        return;
    }
    answer("ok", el,
           "restarts_seen=%" PRIu64 ",rebinds=%" PRIu64 ",units_down=%" PRIu64
           ",transfers_retained=%" PRIu64 ",transfers_released=%" PRIu64
           ",retained_bytes=%" PRIu64 ",resent=%" PRIu64,
           k.restarts_seen, k.rebinds, k.units_down, k.transfers_retained,
           k.transfers_released, k.retained_bytes, dp_client_requests_resent(cl));
}

static void
cmd_sleep(char **tok, int ntok)
{
    char *end = NULL;
    double s = ntok == 2 ? strtod(tok[1], &end) : -1;
    if (ntok != 2 || end == tok[1] || *end != '\0' || !(s >= 0 && s <= 3600)) {
        answer_err(0, DP_EINVAL, "usage: sleep SECONDS (0..3600)");
        return;
    }
    double t0 = now_s();
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
    answer("ok", now_s() - t0, NULL);
}

/* ---- main ---- */

static void
on_signal(int sig)
{
    _exit(128 + sig);
}

static const char usage[] =
    "usage: dp_longclient (--cluster PATH | --units tcp://a,tcp://b) [--timeout S]\n"
    "Reads commands from stdin (put, get, clear, stats, counters, sleep, quit),\n"
    "one line each, and answers each with one line on stdout (see the source's\n"
    "header).\n";

int
main(int argc, char **argv)
{
    static const struct option opts[] = {
        {"cluster", required_argument, NULL, 'c'},
        {"units", required_argument, NULL, 'u'},
        {"timeout", required_argument, NULL, 't'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *cluster = NULL, *units = NULL;
    double timeout = -1;
    int c;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 'c':
            cluster = optarg;
            break;
        case 'u':
            units = optarg;
            break;
        case 't': {
            char *end = NULL;
            timeout = strtod(optarg, &end);
            if (end == optarg || *end != '\0' || !(timeout > 0)) {
                fprintf(stderr, "dp_longclient: bad --timeout %s\n", optarg);
                return 2;
            }
            break;
        }
        case 'h':
            fputs(usage, stdout);
            return 0;
        default:
            fputs(usage, stderr);
            return 2;
        }
    }
    if (optind != argc || (cluster != NULL) == (units != NULL)) {
        fputs(usage, stderr);
        return 2;
    }

    /* Answers go to a private copy of stdout; fd 1 becomes stderr. */
    int afd = dup(1);
    if (afd < 0 || (answers = fdopen(afd, "w")) == NULL || dup2(2, 1) < 0) {
        perror("dp_longclient: stdout");
        return 1;
    }
    signal(SIGPIPE, SIG_IGN);
    signal(SIGTERM, on_signal);
    signal(SIGINT, on_signal);

    dp_client_opts o;
    dp_client_opts_init(&o);
    if (timeout > 0)
        o.timeout_s = o.connect_timeout_s = timeout;
    dp_detail d;
    dp_detail_clear(&d);
    char *units_buf = NULL;
    const char *addrs[256];
    uint32_t n_addrs = 0;
    if (units != NULL) {
        units_buf = strdup(units);
        char *save = NULL;
        for (char *t = strtok_r(units_buf, ",", &save); t != NULL && n_addrs < 256;
             t = strtok_r(NULL, ",", &save))
            addrs[n_addrs++] = t;
    }
    double t0 = now_s();
    int rc = units != NULL ? dp_client_open_units(addrs, n_addrs, &o, &cl, &d)
                           : dp_client_open(cluster, &o, &cl, &d);
    double el = now_s() - t0;
    if (rc != 0) {
        answer_err(el, rc, "open: %s", dp_detail_msg(&d));
        fprintf(stderr, "dp_longclient: open: %s (%s)\n", dp_detail_msg(&d),
                dp_strerror(rc));
        free(units_buf);
        return 1;
    }
    answer("ready", el, "units=%u", dp_client_n_units(cl));

    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    while ((len = getline(&line, &cap, stdin)) >= 0) {
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r'))
            line[--len] = '\0';
        char *tok[8];
        int ntok = 0;
        char *save = NULL;
        for (char *t = strtok_r(line, " \t", &save); t != NULL;
             t = strtok_r(NULL, " \t", &save)) {
            if (ntok == 8) {
                ntok++;
                break;
            }
            tok[ntok++] = t;
        }
        if (ntok == 0 || ntok > 8) {
            answer_err(0, DP_EINVAL, "%s", ntok ? "too many words" : "empty command");
        } else if (strcmp(tok[0], "put") == 0) {
            cmd_put(tok, ntok);
        } else if (strcmp(tok[0], "get") == 0) {
            cmd_get(tok, ntok);
        } else if (strcmp(tok[0], "clear") == 0) {
            cmd_clear(tok, ntok);
        } else if (strcmp(tok[0], "stats") == 0) {
            cmd_stats(tok, ntok);
        } else if (strcmp(tok[0], "counters") == 0) {
            cmd_counters(tok, ntok);
        } else if (strcmp(tok[0], "sleep") == 0) {
            cmd_sleep(tok, ntok);
        } else if (strcmp(tok[0], "quit") == 0) {
            answer("ok", 0, NULL);
            break;
        } else {
            answer_err(0, DP_EINVAL,
                       "unknown command %s (put, get, clear, stats, counters, "
                       "sleep, quit)",
                       tok[0]);
        }
        if (ferror(answers)) {
            fprintf(stderr, "dp_longclient: stdout failed: %s\n", strerror(errno));
            break;
        }
    }
    free(line);
    dp_client_close(cl);
    free(units_buf);
    fclose(answers);
    return 0;
}
