/*
 * `dataplane top`: a live view of a running cluster, refreshed every
 * interval: per unit and in total, ops/s by op, GB/s in (committed by puts)
 * and out (pinned for gets), slab fill, pins, retired and quarantined bytes,
 * the SSD tier and saves. Rates are differences of the units' counters
 * between two rounds of stats requests (the control plane; no HTTP needed).
 *
 * On a terminal it redraws one screen (ANSI) and reads keys: q quits. When
 * stdout is not a terminal it prints plain lines instead, one block per
 * round, so it can be logged or piped. A unit that does not answer shows as
 * down and is asked again every round.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#include "cli/cli.h"
#include "common/common.h"

static const char usage_top[] =
    "usage: dataplane top [--cluster PATH|URL] [--interval S] [--iterations N]\n"
    "\n"
    "A live view of a running cluster, like redis-cli --stat or htop: per unit and\n"
    "in total, ops/s (alloc, commit, resolve, release), GB/s in (committed by puts)\n"
    "and out (pinned for gets), slab fill, pins, retired and quarantined bytes, the\n"
    "SSD tier (on disk, staged) and saves, refreshed every interval. On a terminal:\n"
    "one screen, q (or Ctrl-C) quits. Otherwise: plain lines, one block per round.\n"
    "\n"
    "options:\n"
    "  --cluster PATH   the cluster file, its directory, or etcd://HOST:PORT/NAME\n"
    "                   (default: $DP_CLUSTER, else the default directory)\n"
    "  --interval S     seconds between refreshes (1)\n"
    "  --iterations N   stop after N refreshes (default: until q or a signal)\n"
    "  --timeout-s S    bound of each round of stats requests (2)\n"
    "  -h, --help       this text\n";

/* The counters a row shows (a snapshot of one unit). */
typedef struct snap {
    bool up;
    double t;
    uint64_t allocs, commits, resolves, releases, in_b, out_b;
    uint64_t slab, allocated, pins, retired, quarantined, disk, staged, saves, loads;
    uint64_t rows, entries;
} snap;

static volatile sig_atomic_t g_stop;

static void
on_signal(int sig)
{
    DP_UNUSED(sig);
    g_stop = 1;
}

static uint64_t
get(const dp__wire_fields *f, const char *name)
{
    const dp__wire_field *x = dp__wire_fields_get(f, name);
    return x != NULL && x->type == DP_WIRE_U64 ? x->v.u : 0;
}

static void
take(const dp__wire_fields *f, double t, snap *s)
{
    *s = (snap){.up = true, .t = t};
    s->allocs = get(f, "allocs");
    s->commits = get(f, "commits");
    s->resolves = get(f, "resolves");
    s->releases = get(f, "releases");
    s->in_b = get(f, "committed_bytes");
    s->out_b = get(f, "resolved_bytes");
    s->slab = get(f, "slab_bytes");
    s->allocated = get(f, "allocated_bytes");
    s->pins = get(f, "pins");
    s->retired = get(f, "retired_bytes");
    s->quarantined = get(f, "quarantined_bytes");
    s->disk = get(f, "disk_bytes");
    s->staged = get(f, "staged_bytes");
    s->saves = get(f, "saves");
    s->loads = get(f, "loads");
    s->rows = get(f, "rows");
    s->entries = get(f, "entries");
}

/* Per-second rate of a counter between two snapshots (0 at the first). */
static double
rate(uint64_t now, uint64_t was, double dt)
{
    return dt > 0 && now >= was ? (double)(now - was) / dt : 0;
}

/* One row: a unit's (or the total's) line, into out. */
static void
row(char *out, size_t cap, const char *label, const snap *s, const snap *p)
{
    if (!s->up) {
        snprintf(out, cap, "%-7s %s", label, "down");
        return;
    }
    double dt = p->up ? s->t - p->t : 0;
    char slab[16], ret[16], quar[16], disk[16], staged[16];
    dp__fmt_size(s->slab, slab, sizeof slab);
    dp__fmt_size(s->retired, ret, sizeof ret);
    dp__fmt_size(s->quarantined, quar, sizeof quar);
    dp__fmt_size(s->disk, disk, sizeof disk);
    dp__fmt_size(s->staged, staged, sizeof staged);
    double fill = s->slab > 0 ? 100.0 * (double)s->allocated / (double)s->slab : 0;
    snprintf(out, cap,
             "%-7s %8.0f %8.0f %8.0f %8.0f %8.3f %8.3f %5.1f%% of %-10s %6" PRIu64
             " %10s %10s %10s %10s %5" PRIu64,
             label, rate(s->allocs, p->allocs, dt), rate(s->commits, p->commits, dt),
             rate(s->resolves, p->resolves, dt), rate(s->releases, p->releases, dt),
             rate(s->in_b, p->in_b, dt) / 1e9, rate(s->out_b, p->out_b, dt) / 1e9, fill,
             slab, s->pins, ret, quar, disk, staged, s->saves);
}

static const char header[] =
    "%-7s %8s %8s %8s %8s %8s %8s %-19s %6s %10s %10s %10s %10s %5s";

static void
sum_into(snap *t, const snap *s)
{
    if (!s->up)
        return;
    t->up = true;
    t->t = s->t;
    t->allocs += s->allocs;
    t->commits += s->commits;
    t->resolves += s->resolves;
    t->releases += s->releases;
    t->in_b += s->in_b;
    t->out_b += s->out_b;
    t->slab += s->slab;
    t->allocated += s->allocated;
    t->pins += s->pins;
    t->retired += s->retired;
    t->quarantined += s->quarantined;
    t->disk += s->disk;
    t->staged += s->staged;
    t->saves += s->saves;
    t->loads += s->loads;
    t->rows += s->rows;
    t->entries += s->entries;
}

/* What top was asked for. */
typedef struct top_opts {
    const char *cluster;
    double interval, timeout_s;
    uint64_t iterations; /* 0: until q or a signal */
} top_opts;

/* The command line into o: -1 to go on, else the exit status. */
static int
parse_opts(int argc, char **argv, top_opts *o)
{
    static const struct option opts[] = {{"cluster", required_argument, NULL, 'c'},
                                         {"interval", required_argument, NULL, 'i'},
                                         {"iterations", required_argument, NULL, 'n'},
                                         {"timeout-s", required_argument, NULL, 't'},
                                         {"help", no_argument, NULL, 'h'},
                                         {NULL, 0, NULL, 0}};
    *o = (top_opts){.interval = 1, .timeout_s = 2};
    dp_detail d;
    dp_detail_clear(&d);
    int c;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        int rc = DP_OK;
        switch (c) {
        case 'c':
            o->cluster = optarg;
            break;
        case 'i':
            rc = dp__parse_seconds(optarg, &o->interval, "--interval", &d);
            if (rc == DP_OK && !(o->interval >= 0.1))
                rc = dp__fail(&d, DP_EINVAL, "--interval must be at least 0.1 s");
            break;
        case 'n':
            rc = dp__parse_u64(optarg, 1, UINT32_MAX, &o->iterations, "--iterations", &d);
            break;
        case 't':
            rc = dp__cli_parse_timeout(optarg, "--timeout-s", &o->timeout_s, &d);
            break;
        case 'h':
            fputs(usage_top, stdout);
            return 0;
        default:
            return dp__cli_bad_option("top", argv[optind - 1]);
        }
        if (rc != DP_OK)
            return dp__cli_usage("top", "%s", dp_detail_msg(&d));
    }
    if (optind < argc)
        return dp__cli_unexpected("top", argv[optind]);
    return -1;
}

/* The terminal top draws on: tty (stdout is one), keys (q is read from stdin). */
typedef struct screen {
    bool tty, keys;
    struct termios saved; /* stdin's settings before, when keys */
} screen;

/*
 * Take the screen: keys read one at a time without echo when both stdout and
 * stdin are a terminal, the signals that stop the view caught, the cursor
 * hidden on a terminal.
 */
static void
screen_open(screen *sc)
{
    sc->tty = isatty(STDOUT_FILENO) == 1;
    sc->keys = sc->tty && isatty(STDIN_FILENO) == 1;
    if (sc->keys && tcgetattr(STDIN_FILENO, &sc->saved) == 0) {
        struct termios raw = sc->saved;
        raw.c_lflag &= ~(tcflag_t)(ICANON | ECHO);
        raw.c_cc[VMIN] = 0;
        raw.c_cc[VTIME] = 0;
        tcsetattr(STDIN_FILENO, TCSANOW, &raw);
    } else {
        sc->keys = false;
    }
    struct sigaction sa = {.sa_handler = on_signal};
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL); /* its terminal went away */
    if (sc->tty)
        printf("\033[?25l"); /* hide the cursor while redrawing */
}

/* Give the screen back as it was: the cursor shown, stdin's settings restored. */
static void
screen_close(const screen *sc)
{
    if (sc->tty)
        printf("\033[?25h");
    if (sc->keys)
        tcsetattr(STDIN_FILENO, TCSANOW, &sc->saved);
    fflush(stdout);
}

/* One round of stats requests: now[i] for unit i of n (down when it did not
 * answer), their total in now[n]. */
static void
take_round(dp__cli_conn *conn, snap *now)
{
    uint32_t n = conn->cl.n_units;
    /* Units down earlier are asked again: they may be back. */
    for (uint32_t i = 0; i < n; i++)
        if (conn->units[i].state != DP__CLI_CHECKED)
            dp__cli_check_units(conn, i, DP__CLI_ALLOW_DOWN, NULL);
    dp__fanout f;
    dp_detail d;
    dp_detail_clear(&d);
    dp__wire_op op = DP_WIRE_OP_STATS;
    dp__client_call_all(conn->client, &f, dp__fanout_req_op, &op, &d);
    double t = dp__now_s();
    memset(&now[n], 0, sizeof now[n]);
    for (uint32_t i = 0; i < n; i++) {
        if (f.n > 0 && f.u[i].st.rc == DP_OK)
            take(&f.u[i].rep.r.stats, t, &now[i]);
        else
            now[i] = (snap){.up = false};
        sum_into(&now[n], &now[i]);
    }
    dp__fanout_fini(&f);
}

/* Draw a round: the title, the header and a row per unit (and the total). */
static void
draw(const dp__cli_conn *conn, const top_opts *o, const screen *sc, const snap *now,
     const snap *prev)
{
    uint32_t n = conn->cl.n_units;
    char line[512];
    time_t wall = time(NULL);
    char ts[32];
    strftime(ts, sizeof ts, "%H:%M:%S", localtime(&wall));
    if (sc->tty)
        printf("\033[H\033[2J");
    printf("dataplane top  %s  cluster %s  %u unit%s  every %.1f s%s\n", ts, conn->path,
           n, n == 1 ? "" : "s", o->interval, sc->keys ? "  (q quits)" : "");
    printf(header, "unit", "alloc/s", "commit/s", "resolv/s", "relea/s", "inGB/s",
           "outGB/s", "slab fill", "pins", "retired", "quarant", "on disk", "staged",
           "saves");
    printf("\n");
    for (uint32_t i = 0; i <= n; i++) {
        if (i == n && n == 1)
            break;
        char label[16];
        if (i < n)
            snprintf(label, sizeof label, "%u", i);
        else
            snprintf(label, sizeof label, "total");
        row(line, sizeof line, label, &now[i], &prev[i]);
        printf("%s\n", line);
    }
    if (!sc->tty)
        printf("\n");
}

/* Wait for the next round, or a key. */
static void
wait_round(double interval, bool keys)
{
    double until = dp__now_s() + interval;
    while (!g_stop && dp__now_s() < until) {
        struct pollfd p = {.fd = STDIN_FILENO, .events = POLLIN};
        int ms = (int)((until - dp__now_s()) * 1000) + 1;
        int k = poll(&p, keys ? 1 : 0, ms > 0 ? ms : 1);
        if (k > 0 && keys) {
            char ch;
            ssize_t r = read(STDIN_FILENO, &ch, 1);
            if (r == 1 && (ch == 'q' || ch == 'Q'))
                g_stop = 1;
            /* The terminal hung up: nobody sees this view any more. */
            if ((r == 0 || (r < 0 && errno != EINTR && errno != EAGAIN)) &&
                (p.revents & (POLLHUP | POLLERR)) != 0)
                g_stop = 1;
        }
        if (k < 0 && errno != EINTR)
            break;
    }
}

int
dp__cmd_top(int argc, char **argv)
{
    top_opts o;
    int st = parse_opts(argc, argv, &o);
    if (st >= 0)
        return st;
    dp_detail d;
    dp_detail_clear(&d);
    dp__cli_conn conn;
    int rc = dp__cli_connect(o.cluster, o.timeout_s, DP_MAX(o.timeout_s, 10.0),
                             DP__CLI_ALLOW_DOWN, &conn, &d);
    if (rc != DP_OK)
        return dp__cli_fail("top", rc, &d);
    uint32_t n = conn.cl.n_units;
    snap *now = calloc(n + 1, sizeof *now), *prev = calloc(n + 1, sizeof *prev);
    if (now == NULL || prev == NULL) {
        free(now);
        free(prev);
        dp__cli_disconnect(&conn);
        return dp__cli_fail("top", DP_ENOMEM, NULL);
    }
    screen sc;
    screen_open(&sc);
    int status = 0;
    for (uint64_t round = 0; !g_stop && (o.iterations == 0 || round < o.iterations);
         round++) {
        take_round(&conn, now);
        draw(&conn, &o, &sc, now, prev);
        if (fflush(stdout) != 0 || ferror(stdout))
            break; /* nobody reads it any more (a closed terminal or pipe) */
        memcpy(prev, now, (n + 1) * sizeof *now);
        if (o.iterations != 0 && round + 1 >= o.iterations)
            break;
        wait_round(o.interval, sc.keys);
    }
    screen_close(&sc);
    free(now);
    free(prev);
    dp__cli_disconnect(&conn);
    return status;
}
