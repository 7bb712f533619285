/*
 * Commands for a person poking at a running cluster: `dataplane stats` (every
 * unit's counters side by side), `dataplane scan UNIT` (one unit's blob table)
 * and `dataplane clear G...` (drop rows). They need only the cluster file and
 * the control plane: they run through the client library's control-only
 * client (client/fanout.h), no UCX. Each asks the units it talks to who they
 * are before anything else (cli_util.c).
 */
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"

static const char usage_stats[] =
    "usage: dataplane stats [--cluster PATH] [--raw] [--lanes] [--timeout-s S]\n"
    "\n"
    "Print every unit's counters as a table: one row per counter, one column per\n"
    "unit and a total. A unit that does not answer is reported and the others are\n"
    "still printed (exit status 1).\n"
    "\n"
    "options:\n"
    "  --cluster PATH   the cluster file, or a directory holding cluster.json\n"
    "                   or a registry: etcd://HOST:PORT/NAME\n"
    "                   (default: $DP_CLUSTER, else the default directory)\n"
    "  --raw            exact numbers instead of human-readable byte sizes\n"
    "  --lanes          also open a data path from this machine to every unit\n"
    "                   and say which UCX transports it uses and whether RMA is\n"
    "                   one-sided or two-sided (TCP), as clients here would get\n"
    "                   (a unit that is down: \"not connected (down)\")\n"
    "  --timeout-s S    how long to wait for the units (10)\n"
    "  -h, --help       this text\n";

static const char usage_scan[] =
    "usage: dataplane scan UNIT [--cluster PATH] [--timeout-s S]\n"
    "\n"
    "Print the blob table of unit UNIT (0..N-1): one line per blob with its id,\n"
    "slab offset, size, references (row fields pointing at it), pins, entries\n"
    "and times.\n"
    "\n"
    "options:\n"
    "  --cluster PATH   the cluster file, or a directory holding cluster.json\n"
    "                   or a registry: etcd://HOST:PORT/NAME\n"
    "                   (default: $DP_CLUSTER, else the default directory)\n"
    "  --timeout-s S    how long to wait for the unit (10)\n"
    "  -h, --help       this text\n";

static const char usage_clear[] =
    "usage: dataplane clear G... [--cluster PATH] [--timeout-s S]\n"
    "\n"
    "Drop every field of rows G (a row index, or a range A-B inclusive) from the\n"
    "units that own them (row g lives on unit g % N). Idempotent: clearing rows\n"
    "that hold nothing is not an error. Prints how many entries were dropped.\n"
    "\n"
    "examples:\n"
    "  dataplane clear 17\n"
    "  dataplane clear 0-1023 4096\n"
    "\n"
    "options:\n"
    "  --cluster PATH   the cluster file, or a directory holding cluster.json\n"
    "                   or a registry: etcd://HOST:PORT/NAME\n"
    "                   (default: $DP_CLUSTER, else the default directory)\n"
    "  --timeout-s S    how long to wait for the units (10)\n"
    "  -h, --help       this text\n";

/* Rows one clear may name (ranges included): bounded so a typo cannot eat memory. */
#define CLEAR_MAX_ROWS (1u << 20)

enum { O_CLUSTER = 1, O_TIMEOUT, O_RAW, O_LANES };

typedef struct common_opts {
    const char *cluster;
    double timeout_s;
    bool raw;
    bool lanes;
} common_opts;

/*
 * Parse the options every admin command takes; positional arguments are left
 * in argv[optind..]. Returns -1 to go on, else the exit status.
 */
static int
parse_common(const char *cmd, const char *usage, bool allow_raw, int argc, char **argv,
             common_opts *o)
{
    static const struct option opts[] = {
        {"cluster", required_argument, NULL, O_CLUSTER},
        {"timeout-s", required_argument, NULL, O_TIMEOUT},
        {"raw", no_argument, NULL, O_RAW},
        {"lanes", no_argument, NULL, O_LANES},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0}};
    o->cluster = NULL;
    o->timeout_s = DP_CLI_TIMEOUT_S;
    o->raw = false;
    o->lanes = false;
    dp_detail d;
    dp_detail_clear(&d);
    int c;
    optind = 1;
    opterr = 0;
    /* '+' is not used: options may follow the positional arguments. */
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case O_CLUSTER:
            o->cluster = optarg;
            break;
        case O_TIMEOUT:
            if (dp__cli_parse_timeout(optarg, "--timeout-s", &o->timeout_s, &d) != DP_OK)
                return dp__cli_usage(cmd, "%s", d.msg);
            break;
        case O_RAW:
            if (!allow_raw)
                return dp__cli_usage(cmd, "unknown option '--raw'");
            o->raw = true;
            break;
        case O_LANES: /* stats' options, as --raw */
            if (!allow_raw)
                return dp__cli_usage(cmd, "unknown option '--lanes'");
            o->lanes = true;
            break;
        case 'h':
            fputs(usage, stdout);
            return 0;
        default:
            return dp__cli_bad_option(cmd, argv[optind - 1]);
        }
    }
    return -1;
}

/* ---- stats ---- */

static bool
is_size_counter(const char *name)
{
    size_t n = strlen(name);
    return (n > 6 && strcmp(name + n - 6, "_bytes") == 0) ||
           strcmp(name, "largest_free") == 0;
}

/* A counter's value as text into buf. */
static const char *
fmt_field(const dp__wire_field *f, bool size, bool raw, char *buf, size_t cap)
{
    switch (f->type) {
    case DP_WIRE_U64:
        if (size && !raw)
            return dp__fmt_size(f->v.u, buf, cap);
        snprintf(buf, cap, "%" PRIu64, f->v.u);
        break;
    case DP_WIRE_I64:
        snprintf(buf, cap, "%" PRId64, f->v.i);
        break;
    case DP_WIRE_F64:
        snprintf(buf, cap, "%.3f", f->v.f);
        break;
    case DP_WIRE_BOOL:
        snprintf(buf, cap, "%s", f->v.b ? "yes" : "no");
        break;
    case DP_WIRE_STR:
        snprintf(buf, cap, "%.*s", DP_WIRE_STR_ARG(f->v.s));
        break;
    default:
        snprintf(buf, cap, "-");
    }
    return buf;
}

/* Counters that make no sense summed over units. */
static bool
no_total(const char *name)
{
    return strcmp(name, "unit_id") == 0 || strcmp(name, "n_units") == 0 ||
           strcmp(name, "largest_free") == 0;
}

int
dp__cmd_stats(int argc, char **argv)
{
    common_opts o;
    int st = parse_common("stats", usage_stats, true, argc, argv, &o);
    if (st >= 0)
        return st;
    if (optind < argc)
        return dp__cli_unexpected("stats", argv[optind]);
    dp_detail d;
    dp_detail_clear(&d);
    dp__cli_conn c;
    /* A unit that does not answer is shown (down); the others still are. */
    int rc =
        dp__cli_connect(o.cluster, o.timeout_s, o.timeout_s, DP__CLI_ALLOW_DOWN, &c, &d);
    if (rc != DP_OK)
        return dp__cli_fail("stats", rc, &d);
    uint32_t n = c.cl.n_units;
    dp__fanout f;
    dp__wire_op op = DP_WIRE_OP_STATS;
    dp__client_call_all(c.client, &f, dp__fanout_req_op, &op, &d);
    if (f.n == 0) { /* not even asked: out of memory */
        dp__cli_disconnect(&c);
        return dp__cli_fail("stats", d.code, &d);
    }
    int status = 0;
    for (uint32_t i = 0; i < n; i++)
        if (f.u[i].st.rc != DP_OK) {
            fprintf(stderr, "dataplane stats: %s (%s)\n", f.u[i].st.det.msg,
                    dp_strerror(f.u[i].st.rc));
            status = 1;
        }
    /* Rows: the counter names of the first unit that answered, in its order. */
    const dp__wire_fields *names = NULL;
    for (uint32_t i = 0; i < n && names == NULL; i++)
        if (f.u[i].st.rc == DP_OK)
            names = &f.u[i].rep.r.stats;
    printf("cluster %s: %u unit%s\n", c.path, n, n == 1 ? "" : "s");
    int w = 18; /* the name column fits the longest counter name */
    for (uint32_t k = 0; names != NULL && k < names->n; k++)
        w = DP_MAX(w, (int)DP_MIN(names->v[k].name.n, 63u));
    /* Units in groups of 8 columns, so a wide cluster stays readable. */
    for (uint32_t g0 = 0; names != NULL && g0 < n; g0 += 8) {
        uint32_t g1 = DP_MIN(n, g0 + 8);
        bool last = g1 == n;
        printf("\n%-*s", w, "counter");
        for (uint32_t i = g0; i < g1; i++) {
            char h[24];
            snprintf(h, sizeof h, "unit %u", i);
            printf(" %12s", h);
        }
        if (last && n > 1)
            printf(" %12s", "total");
        printf("\n");
        for (uint32_t k = 0; k < names->n; k++) {
            char name[64], buf[64];
            dp__wire_str_copy(names->v[k].name, name, sizeof name);
            bool size = is_size_counter(name);
            printf("%-*s", w, name);
            uint64_t total = 0;
            bool summable = !no_total(name);
            for (uint32_t i = 0; i < n; i++) {
                const dp__wire_field *x =
                    f.u[i].st.rc == DP_OK ? dp__wire_fields_get(&f.u[i].rep.r.stats, name)
                                          : NULL;
                if (x != NULL && x->type == DP_WIRE_U64)
                    total += x->v.u;
                else
                    summable = false;
                if (i < g0 || i >= g1)
                    continue;
                printf(" %12s", x != NULL ? fmt_field(x, size, o.raw, buf, sizeof buf)
                                          : (f.u[i].st.rc != DP_OK ? "(down)" : "-"));
            }
            if (last && n > 1) {
                if (summable) {
                    dp__wire_field t = {.type = DP_WIRE_U64, .v.u = total};
                    printf(" %12s", fmt_field(&t, size, o.raw, buf, sizeof buf));
                } else {
                    printf(" %12s", "");
                }
            }
            printf("\n");
        }
    }
    dp__fanout_fini(&f);
    if (o.lanes) {
        /* What each unit's own UCX found, then what a client here gets. */
        op = DP_WIRE_OP_INFO;
        dp__client_call_all(c.client, &f, dp__fanout_req_op, &op, &d);
        printf("\nunits' transports:");
        for (uint32_t i = 0; i < f.n; i++) {
            char t[160] = "?";
            if (f.u[i].st.rc == DP_OK && f.u[i].rep.r.info.transports.n > 0)
                dp__wire_str_copy(f.u[i].rep.r.info.transports, t, sizeof t);
            printf("%s unit %u: %s", i > 0 ? ";" : "", i, t);
        }
        printf("\n");
        dp__fanout_fini(&f);
    }
    dp__cli_disconnect(&c);
    if (o.lanes) {
        /* The lanes are this machine's to each unit: a data client finds them. */
        dp_client_opts co;
        dp_client_opts_init(&co);
        co.timeout_s = o.timeout_s;
        co.connect_timeout_s = o.timeout_s;
        dp_client *dc = NULL;
        dp_detail_clear(&d);
        rc = dp_client_open(o.cluster, &co, &dc, &d);
        if (rc != DP_OK) {
            dp__fail_ctx(&d, rc, "no data path to show the lanes of");
            return dp__cli_fail("stats", rc, &d);
        }
        dp__cli_print_lanes(dc);
        dp_client_close(dc);
    }
    return status;
}

/* ---- scan ---- */

static bool
scan_req(uint32_t i, dp__wire_request *q, void *ctx)
{
    if (i != *(const uint32_t *)ctx)
        return false;
    q->op = DP_WIRE_OP_SCAN;
    return true;
}

int
dp__cmd_scan(int argc, char **argv)
{
    common_opts o;
    int st = parse_common("scan", usage_scan, false, argc, argv, &o);
    if (st >= 0)
        return st;
    if (optind >= argc)
        return dp__cli_usage("scan",
                             "which unit? Give its index, e.g. 'dataplane scan 0'");
    if (optind + 1 < argc)
        return dp__cli_unexpected("scan", argv[optind + 1]);
    const char *unit_arg = argv[optind];
    dp_detail d;
    dp_detail_clear(&d);
    uint64_t probe;
    if (dp__parse_u64(unit_arg, 0, UINT32_MAX, &probe, "UNIT", &d) != DP_OK)
        return dp__cli_usage("scan", "%s", d.msg);
    dp__cli_conn c;
    int rc =
        dp__cli_connect(o.cluster, o.timeout_s, o.timeout_s, DP__CLI_NO_CHECK, &c, &d);
    if (rc != DP_OK)
        return dp__cli_fail("scan", rc, &d);
    uint32_t u;
    if ((rc = dp__cli_parse_unit(&c, unit_arg, &u, &d)) != DP_OK) {
        dp__cli_disconnect(&c);
        return dp__cli_usage("scan", "%s", d.msg);
    }
    /* Only the unit scanned is asked who it is. */
    if ((rc = dp__cli_check_units(&c, u, 0, &d)) != DP_OK) {
        dp__cli_disconnect(&c);
        return dp__cli_fail("scan", rc, &d);
    }
    dp__fanout fo;
    rc = dp__client_call_all(c.client, &fo, scan_req, &u, &d);
    int status = 0;
    if (rc != DP_OK) {
        status = dp__cli_fail("scan", rc, &d);
    } else {
        const dp__wire_scan_res *s = &fo.u[u].rep.r.scan;
        printf("unit %u (%s): %u blob%s\n", u, c.cl.units[u].zmq, s->n,
               s->n == 1 ? "" : "s");
        if (s->n > 0) {
            /* Columns: the first record's fields; ids get a wide column. */
            const dp__wire_fields *h = &s->recs[0];
            for (uint32_t k = 0; k < h->n; k++) {
                int w = dp__wire_str_eq(h->v[k].name, "id") ? -34 : 12;
                printf("%s%*.*s", k ? " " : "", w, DP_WIRE_STR_ARG(h->v[k].name));
            }
            printf("\n");
            for (uint32_t j = 0; j < s->n; j++) {
                for (uint32_t k = 0; k < h->n; k++) {
                    char name[64], buf[96];
                    dp__wire_str_copy(h->v[k].name, name, sizeof name);
                    const dp__wire_field *f = dp__wire_fields_get(&s->recs[j], name);
                    int w = strcmp(name, "id") == 0 ? -34 : 12;
                    printf("%s%*s", k ? " " : "", w,
                           f ? fmt_field(f, false, true, buf, sizeof buf) : "-");
                }
                printf("\n");
            }
        }
    }
    dp__fanout_fini(&fo);
    dp__cli_disconnect(&c);
    return status;
}

/* ---- clear ---- */

/* "G" or "A-B" into [lo, hi]. */
static int
parse_rows(const char *s, uint64_t *lo, uint64_t *hi, dp_detail *d)
{
    const char *dash = strchr(s, '-');
    if (dash == NULL) {
        *hi = *lo = 0;
        if (dp__parse_u64(s, 0, UINT64_MAX, lo, "row", NULL) != DP_OK)
            return dp__fail(d, DP_EINVAL, "'%s' is not a row or a range A-B", s);
        *hi = *lo;
        return DP_OK;
    }
    char a[32];
    size_t n = (size_t)(dash - s);
    if (n == 0 || n >= sizeof a)
        return dp__fail(d, DP_EINVAL, "'%s' is not a row or a range A-B", s);
    memcpy(a, s, n);
    a[n] = '\0';
    int rc = dp__parse_u64(a, 0, UINT64_MAX, lo, "row", d);
    if (rc == DP_OK)
        rc = dp__parse_u64(dash + 1, 0, UINT64_MAX, hi, "row", d);
    if (rc != DP_OK)
        return dp__fail(d, DP_EINVAL, "'%s' is not a row or a range A-B", s);
    if (*hi < *lo)
        return dp__fail(d, DP_EINVAL, "range '%s' ends before it starts", s);
    return DP_OK;
}

int
dp__cmd_clear(int argc, char **argv)
{
    common_opts o;
    int st = parse_common("clear", usage_clear, false, argc, argv, &o);
    if (st >= 0)
        return st;
    if (optind >= argc)
        return dp__cli_usage("clear", "which rows? e.g. 'dataplane clear 17' or "
                                      "'dataplane clear 0-63'");
    dp_detail d;
    dp_detail_clear(&d);
    uint64_t total = 0;
    for (int a = optind; a < argc; a++) {
        uint64_t lo, hi;
        if (parse_rows(argv[a], &lo, &hi, &d) != DP_OK)
            return dp__cli_usage("clear", "%s", d.msg);
        total += hi - lo + 1;
        if (hi - lo >= CLEAR_MAX_ROWS || total > CLEAR_MAX_ROWS)
            return dp__cli_usage("clear", "at most %u rows per clear", CLEAR_MAX_ROWS);
    }
    dp__cli_conn c;
    /*
     * Every unit says who it is first: a file in the wrong order would clear
     * rows on units that do not own them. A unit that does not answer keeps
     * its rows, and the clear says so.
     */
    int rc =
        dp__cli_connect(o.cluster, o.timeout_s, o.timeout_s, DP__CLI_ALLOW_DOWN, &c, &d);
    if (rc != DP_OK)
        return dp__cli_fail("clear", rc, &d);
    uint32_t n = c.cl.n_units;
    dp__fanout f = {0};
    dp__groups g = {0};
    int status = 0;
    /* The rows in the order given; the library groups them by unit. */
    uint64_t *gidxs = malloc(total * sizeof *gidxs);
    if (gidxs == NULL) {
        status = dp__cli_fail("clear", dp__fail(&d, DP_ENOMEM, "out of memory"), &d);
        goto out;
    }
    size_t k = 0;
    for (int a = optind; a < argc; a++) {
        uint64_t lo, hi;
        parse_rows(argv[a], &lo, &hi, NULL);
        for (uint64_t r = lo;; r++) {
            gidxs[k++] = r;
            if (r == hi)
                break;
        }
    }
    rc = dp__client_clear_units(c.client, gidxs, total, &f, &g, &d);
    /* Every unit with rows was asked, or given its reason; else nothing was. */
    bool asked = f.n > 0 && g.start != NULL;
    for (uint32_t u = 0; asked && u < n; u++)
        asked = dp__groups_count(&g, u) == 0 || f.u[u].op != DP_WIRE_OP_NONE;
    if (!asked) {
        status = dp__cli_fail("clear", rc, &d);
        goto out;
    }
    uint64_t dropped = 0;
    uint32_t units_ok = 0;
    for (uint32_t u = 0; u < n; u++) {
        uint32_t rows = dp__groups_count(&g, u);
        if (rows == 0)
            continue;
        if (f.u[u].st.rc != DP_OK) {
            fprintf(stderr,
                    "dataplane clear: %s (%s); its %u row%s may still hold data: run the "
                    "same clear again once the unit is back\n",
                    f.u[u].st.det.msg, dp_strerror(f.u[u].st.rc), rows,
                    rows == 1 ? "" : "s");
            status = 1;
            continue;
        }
        dropped += f.u[u].rep.r.dropped;
        units_ok++;
    }
    printf("cleared %" PRIu64 " row%s: %" PRIu64 " entr%s dropped on %u unit%s\n", total,
           total == 1 ? "" : "s", dropped, dropped == 1 ? "y" : "ies", units_ok,
           units_ok == 1 ? "" : "s");
out:
    dp__fanout_fini(&f);
    dp__groups_fini(&g);
    free(gidxs);
    dp__cli_disconnect(&c);
    return status;
}
