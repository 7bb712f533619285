/*
 * `dataplane up`: a whole cluster on this machine, in the foreground. It
 * starts N unit processes (this binary re-executed as `dataplane unit
 * --unit-id i --units N --port 0 ...`), reads each one's advertised control
 * address from the first line of its stdout, asks each who it is and for its
 * endpoint name (info), writes DIR/cluster.json and waits. Ctrl-C, SIGTERM or
 * SIGHUP stop every unit (SIGTERM, then SIGKILL after a grace period) and
 * remove the cluster file. A unit that dies on its own is reported (which one,
 * its exit status or signal) and the others are stopped: `up` then exits 1.
 * The unit processes themselves (spawning, signals, watching, stopping) are
 * supervise.c's; this file is the command: options, the directory, the
 * cluster file and the order of the phases.
 *
 * Design notes
 * - Two ups in one directory: an flock on DIR/.up.lock held for up's life,
 *   and a cluster file whose unit pids are alive (another launcher, or an up
 *   killed with SIGKILL whose units still run) is never replaced.
 * - Asking the units who they are (info) is part of starting them: it runs
 *   within what is left of --start-timeout-s (at least 1 s).
 * - Exit status: 0 when asked to stop and every unit stopped cleanly, 128 +
 *   the signal when asked to stop before the cluster came up, 1 otherwise.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/supervise.h"
#include "http/http.h"
#include "registry/registry.h"

static const char usage_up[] =
    "usage: dataplane up [options]\n"
    "\n"
    "Start a cluster of storage units on this machine and keep it running in the\n"
    "foreground. Writes DIR/cluster.json, which clients find through --cluster,\n"
    "DP_CLUSTER or the default directory. Ctrl-C (or SIGTERM) stops every unit and\n"
    "removes the cluster file. If a unit dies, up says which and how, stops the\n"
    "others and exits with status 1; with --restart it starts the unit again on\n"
    "its address instead (a new incarnation: clients re-bind by themselves, and what\n"
    "the unit held is gone) and updates the cluster file.\n"
    "\n"
    "options:\n"
    "  --units N            number of units (2)\n"
    "  --slab SIZE          slab of each unit, e.g. 512M, 4G (256M)\n"
    "  --dir DIR            where to write cluster.json (default: $XDG_RUNTIME_DIR/\n"
    "                       dataplane, else /tmp/dataplane-<uid>); created 0700\n"
    "  --bind IP            address the units' control servers bind (127.0.0.1)\n"
    "  --advertise HOST     address the units tell clients, written to cluster.json:\n"
    "                       an IPv4 address, [IPv6] or a host name; the port is the\n"
    "                       bound one (default: the bound address; for a wildcard\n"
    "                       --bind such as 0.0.0.0, this host's primary IPv4\n"
    "                       address)\n"
    "  --read-pin-s S       passed to each unit (see 'dataplane unit --help')\n"
    "  --alloc-lease-s S    passed to each unit\n"
    "  --reclaim-grace-s S  passed to each unit ('never' keeps retired regions)\n"
    "  --numa MODE          passed to each unit: auto, bind or off\n"
    "  --replicas R         copies of each row (1..3, at most --units): row g lives\n"
    "                       on units g % N, (g + 1) % N, ... (1); a unit started\n"
    "                       again (--restart) fills itself from its peers\n"
    "  --repair-rate SIZE   passed to each unit: its repair's bytes a second, 0: no\n"
    "                       repair (256M)\n"
    "  --repair-every S     passed to each unit: how often it compares its copies\n"
    "                       with its peers' (600; 0: never)\n"
    "  --lease S            with --replicas and 3 units or more: read leases of S\n"
    "                       seconds, passed to each unit (puts land without a unit\n"
    "                       that does not answer once most units fenced it)\n"
    "  --ssd-dir D          SSD tier: passed to each unit when given\n"
    "  --staging SIZE       SSD tier staging area: passed when given\n"
    "  --pickup-s S         SSD tier pickup time: passed when given\n"
    "  --grace-s S          how long stopping units may take before SIGKILL (10)\n"
    "  --start-timeout-s S  how long a unit may take to start (120)\n"
    "  --restart            start a unit that dies again, on the same port\n"
    "  --max-restarts N     restarts of one unit within --restart-window before up\n"
    "                       gives up and stops the cluster (10)\n"
    "  --restart-window S   the window --max-restarts counts in, from a unit's\n"
    "                       first restart in it; 'never': a unit's whole life (600)\n"
    "  --registry URL       also register every unit in etcd\n"
    "                       (etcd://HOST:PORT[,...]/NAME; NAME is the cluster id):\n"
    "                       clients on any machine then find it by that URL\n"
    "  --registry-ttl S     the units' registration lease (10)\n"
    "  --curve-secret FILE  every unit authenticates its control plane with this\n"
    "                       CURVE key (see 'dataplane unit --help'); its public key\n"
    "                       goes into cluster.json\n"
    "  --curve-allow DIR    the client keys the units allow (*.pub; SIGHUP to a unit\n"
    "                       re-reads it)\n"
    "  --metrics IP:PORT    unit i serves /metrics and /healthz on IP:PORT+i\n"
    "                       (port 0: each a free one, printed in its log)\n"
    "  -h, --help           this text\n"
    "\n"
    "example:\n"
    "  dataplane up --units 4 --slab 2G\n"
    "  export DP_CLUSTER=$XDG_RUNTIME_DIR/dataplane/cluster.json   # as printed\n";

/* ---- options ---- */

typedef struct up_opts {
    uint64_t units;
    const char *slab;
    const char *dir;
    const char *bind;
    const char *advertise;
    const char *read_pin_s, *alloc_lease_s, *reclaim_grace_s, *numa;
    uint64_t replicas;
    const char *cluster_file; /* where the cluster file goes (units repair from it) */
    const char *repair_rate;
    const char *repair_every;
    const char *lease; /* --lease: read leases of each unit (NULL: none) */
    const char *ssd_dir, *staging, *pickup_s;
    double grace_s, start_timeout_s;
    bool restart;
    uint64_t max_restarts;
    double restart_window_s; /* 0: restarts count for good */
    const char *registry, *registry_ttl;
    const char *curve_secret, *curve_allow;
    char curve_public[41]; /* "" without CURVE */
    char metrics_ip[64];   /* "" without --metrics */
    uint16_t metrics_port;
    char cluster_id[65]; /* drawn at start (the registry's name with one), given to
                            every unit and the file */
} up_opts;

/* getopt_long's values of up's options ('h': --help). */
enum {
    O_UNITS = 1,
    O_SLAB,
    O_DIR,
    O_BIND,
    O_ADVERTISE,
    O_PIN,
    O_LEASE,
    O_RECLAIM,
    O_NUMA,
    O_REPLICAS,
    O_REPAIR_RATE,
    O_REPAIR_EVERY,
    O_READ_LEASE,
    O_SSD,
    O_STAGING,
    O_PICKUP,
    O_GRACE,
    O_START,
    O_RESTART,
    O_MAX_RESTARTS,
    O_RESTART_WINDOW,
    O_REGISTRY,
    O_REG_TTL,
    O_METRICS,
    O_CURVE_SECRET,
    O_CURVE_ALLOW
};

/* The defaults of up's options. */
static void
opts_init(up_opts *o)
{
    memset(o, 0, sizeof *o);
    o->units = 2;
    o->replicas = 1;
    o->slab = "256M";
    o->bind = "127.0.0.1";
    o->grace_s = 10;
    o->start_timeout_s = 120;
    o->max_restarts = 10;
    o->restart_window_s = 600;
}

/*
 * One option of the command line (c from getopt_long, its value in optarg)
 * into o: checked here, so that a bad value fails before any unit starts,
 * even the values only passed on to the units. -1 to go on, else the exit
 * status (--help, or a usage error said, d the detail of the last check).
 */
static int
take_opt(up_opts *o, int c, char **argv, dp_detail *d)
{
    uint64_t v;
    double s;
    int rc = DP_OK;
    switch (c) {
    case O_UNITS:
        rc = dp__parse_u64(optarg, 1, DP_CLUSTER_MAX_UNITS, &o->units, "--units", d);
        break;
    case O_SLAB:
        rc = dp__parse_size(optarg, &v, "--slab", d);
        if (rc == DP_OK && v == 0)
            rc = dp__fail(d, DP_EINVAL, "--slab must be > 0");
        o->slab = optarg;
        break;
    case O_DIR:
        o->dir = optarg;
        break;
    case O_BIND:
        o->bind = optarg;
        break;
    case O_ADVERTISE:
        rc = dp__cli_check_advertise(optarg, d);
        o->advertise = optarg;
        break;
    case O_PIN:
        rc = dp__parse_seconds(optarg, &s, "--read-pin-s", d);
        o->read_pin_s = optarg;
        break;
    case O_LEASE:
        rc = dp__parse_seconds(optarg, &s, "--alloc-lease-s", d);
        o->alloc_lease_s = optarg;
        break;
    case O_RECLAIM:
        if (strcmp(optarg, "never") != 0)
            rc = dp__parse_seconds(optarg, &s, "--reclaim-grace-s", d);
        o->reclaim_grace_s = optarg;
        break;
    case O_REPLICAS:
        rc = dp__parse_u64(optarg, 1, 3, &o->replicas, "--replicas", d);
        break;
    case O_REPAIR_RATE:
        rc = dp__parse_size(optarg, &v, "--repair-rate", d);
        o->repair_rate = optarg;
        break;
    case O_REPAIR_EVERY:
        rc = dp__parse_seconds(optarg, &s, "--repair-every", d);
        o->repair_every = optarg;
        break;
    case O_READ_LEASE:
        rc = dp__parse_seconds(optarg, &s, "--lease", d);
        o->lease = optarg;
        break;
    case O_NUMA:
        if (strcmp(optarg, "auto") != 0 && strcmp(optarg, "bind") != 0 &&
            strcmp(optarg, "off") != 0)
            return dp__cli_usage("up", "--numa must be auto, bind or off, not '%s'",
                                 optarg);
        o->numa = optarg;
        break;
    case O_SSD:
        o->ssd_dir = optarg;
        break;
    case O_STAGING:
        rc = dp__parse_size(optarg, &v, "--staging", d);
        o->staging = optarg;
        break;
    case O_PICKUP:
        rc = dp__parse_seconds(optarg, &s, "--pickup-s", d);
        o->pickup_s = optarg;
        break;
    case O_GRACE:
        rc = dp__parse_seconds(optarg, &o->grace_s, "--grace-s", d);
        break;
    case O_START:
        rc = dp__cli_parse_timeout(optarg, "--start-timeout-s", &o->start_timeout_s, d);
        break;
    case O_RESTART:
        o->restart = true;
        break;
    case O_MAX_RESTARTS:
        rc = dp__parse_u64(optarg, 0, 1000000, &o->max_restarts, "--max-restarts", d);
        break;
    case O_RESTART_WINDOW:
        if (strcmp(optarg, "never") == 0)
            o->restart_window_s = 0;
        else if (dp__cli_parse_timeout(optarg, "--restart-window", &o->restart_window_s,
                                       d) != DP_OK)
            rc = dp__fail(d, DP_EINVAL,
                          "--restart-window %s: seconds (> 0), or 'never' for a unit's "
                          "whole life",
                          optarg);
        break;
    case O_REGISTRY: {
        dp__reg_url u;
        rc = dp__reg_url_parse(optarg, &u, d);
        if (rc == DP_OK)
            snprintf(o->cluster_id, sizeof o->cluster_id, "%s", u.name);
        o->registry = optarg;
        break;
    }
    case O_CURVE_SECRET: {
        char sec[41];
        rc = dp__ctl_key_read(optarg, true, sec, d);
        if (rc == DP_OK)
            rc = dp__ctl_key_public(sec, o->curve_public, d);
        explicit_bzero(sec, sizeof sec);
        o->curve_secret = optarg;
        break;
    }
    case O_CURVE_ALLOW:
        o->curve_allow = optarg;
        break;
    case O_METRICS:
        rc = dp__http_parse_addr(optarg, o->metrics_ip, sizeof o->metrics_ip,
                                 &o->metrics_port, d);
        break;
    case O_REG_TTL:
        rc = dp__parse_seconds(optarg, &s, "--registry-ttl", d);
        if (rc == DP_OK && !(s >= 1 && s <= 3600))
            rc = dp__fail(d, DP_EINVAL, "--registry-ttl must be 1..3600 seconds");
        o->registry_ttl = optarg;
        break;
    case 'h':
        fputs(usage_up, stdout);
        return 0;
    default:
        return dp__cli_bad_option("up", argv[optind - 1]);
    }
    if (rc != DP_OK)
        return dp__cli_usage("up", "%s", d->msg);
    return -1;
}

/* The options that go together or bound each other, once all are in. */
static int
check_opts(const up_opts *o)
{
    if ((o->staging != NULL || o->pickup_s != NULL) && o->ssd_dir == NULL)
        return dp__cli_usage("up", "--staging and --pickup-s need --ssd-dir");
    if ((o->curve_secret != NULL) != (o->curve_allow != NULL))
        return dp__cli_usage("up", "--curve-secret and --curve-allow go together");
    if (o->registry_ttl != NULL && o->registry == NULL)
        return dp__cli_usage("up", "--registry-ttl needs --registry");
    if (o->metrics_ip[0] != '\0' && o->metrics_port != 0 &&
        o->metrics_port + o->units - 1 > 65535)
        return dp__cli_usage("up", "--metrics: port %u + %" PRIu64 " units passes 65535",
                             o->metrics_port, o->units);
    if (o->replicas > o->units)
        return dp__cli_usage("up",
                             "--replicas %" PRIu64
                             " needs at least as many units (--units "
                             "%" PRIu64 "): each copy of a row lives on another unit",
                             o->replicas, o->units);
    return -1;
}

static int
parse_opts(int argc, char **argv, up_opts *o)
{
    static const struct option opts[] = {
        {"units", required_argument, NULL, O_UNITS},
        {"slab", required_argument, NULL, O_SLAB},
        {"dir", required_argument, NULL, O_DIR},
        {"bind", required_argument, NULL, O_BIND},
        {"advertise", required_argument, NULL, O_ADVERTISE},
        {"read-pin-s", required_argument, NULL, O_PIN},
        {"alloc-lease-s", required_argument, NULL, O_LEASE},
        {"reclaim-grace-s", required_argument, NULL, O_RECLAIM},
        {"numa", required_argument, NULL, O_NUMA},
        {"replicas", required_argument, NULL, O_REPLICAS},
        {"repair-rate", required_argument, NULL, O_REPAIR_RATE},
        {"repair-every", required_argument, NULL, O_REPAIR_EVERY},
        {"lease", required_argument, NULL, O_READ_LEASE},
        {"ssd-dir", required_argument, NULL, O_SSD},
        {"staging", required_argument, NULL, O_STAGING},
        {"pickup-s", required_argument, NULL, O_PICKUP},
        {"grace-s", required_argument, NULL, O_GRACE},
        {"start-timeout-s", required_argument, NULL, O_START},
        {"restart", no_argument, NULL, O_RESTART},
        {"max-restarts", required_argument, NULL, O_MAX_RESTARTS},
        {"restart-window", required_argument, NULL, O_RESTART_WINDOW},
        {"registry", required_argument, NULL, O_REGISTRY},
        {"registry-ttl", required_argument, NULL, O_REG_TTL},
        {"metrics", required_argument, NULL, O_METRICS},
        {"curve-secret", required_argument, NULL, O_CURVE_SECRET},
        {"curve-allow", required_argument, NULL, O_CURVE_ALLOW},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0}};
    opts_init(o);
    dp_detail d;
    dp_detail_clear(&d);
    int c;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        int st = take_opt(o, c, argv, &d);
        if (st >= 0)
            return st;
    }
    if (optind < argc)
        return dp__cli_unexpected("up", argv[optind]);
    return check_opts(o);
}

/* ---- the directory, its lock, an existing cluster file ---- */

/* mkdir -p with mode 0700 for what is created; the last component must be ours. */
static int
make_dir(const char *dir, dp_detail *d)
{
    char p[PATH_MAX];
    if (snprintf(p, sizeof p, "%s", dir) >= (int)sizeof p)
        return dp__fail(d, DP_EINVAL, "--dir '%s' is too long", dir);
    for (char *s = p + 1; *s != '\0'; s++) {
        if (*s != '/')
            continue;
        *s = '\0';
        if (mkdir(p, 0700) != 0 && errno != EEXIST)
            return dp__fail_sys(d, errno, "create directory %s", p);
        *s = '/';
    }
    if (mkdir(p, 0700) != 0 && errno != EEXIST)
        return dp__fail_sys(d, errno, "create directory %s", p);
    struct stat st;
    if (stat(p, &st) != 0)
        return dp__fail_sys(d, errno, "stat %s", p);
    if (!S_ISDIR(st.st_mode))
        return dp__fail(d, DP_EINVAL, "%s is not a directory", p);
    if (st.st_uid != getuid())
        return dp__fail(d, DP_EINVAL,
                        "%s belongs to another user (uid %u): choose another --dir", p,
                        (unsigned)st.st_uid);
    return DP_OK;
}

/* A unit process with this pid runs: alive, and (when readable) a `unit` command. */
static bool
unit_alive(int64_t pid)
{
    if (pid <= 0 || pid > INT32_MAX)
        return false;
    if (kill((pid_t)pid, 0) != 0 && errno != EPERM)
        return false;
    char path[64], buf[256];
    snprintf(path, sizeof path, "/proc/%" PRId64 "/cmdline", pid);
    FILE *f = fopen(path, "re");
    if (f == NULL)
        return true; /* cannot tell: assume it is */
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    /* argv[1] == "unit" (argv[0] is any path to the binary). */
    size_t a0 = strlen(buf);
    return a0 + 1 < n && strcmp(buf + a0 + 1, "unit") == 0;
}

/*
 * Refuse a cluster file that names live units or units elsewhere; a file whose
 * units are all gone is stale and will be replaced.
 */
static int
check_existing(const char *path, dp_detail *d)
{
    dp__cluster cl;
    dp_detail e;
    dp_detail_clear(&e);
    int rc = dp__cluster_load(path, &cl, &e);
    if (rc == DP_ENOTFOUND)
        return DP_OK;
    if (rc != DP_OK)
        return dp__fail(d, DP_EEXIST,
                        "%s exists but is not a usable cluster file (%s): remove it, or "
                        "use --dir for another directory",
                        path, e.msg);
    char live[256] = "";
    size_t k = 0;
    bool remote = false;
    for (uint32_t i = 0; i < cl.n_units; i++) {
        if (cl.units[i].pid == 0)
            remote = true;
        else if (unit_alive(cl.units[i].pid) && k + 24 < sizeof live)
            k += (size_t)snprintf(live + k, sizeof live - k, "%s%" PRId64, k ? ", " : "",
                                  cl.units[i].pid);
    }
    uint32_t n = cl.n_units;
    dp__cluster_fini(&cl);
    if (k > 0)
        return dp__fail(d, DP_EEXIST,
                        "a cluster is already running from %s (unit pids %s): stop it "
                        "first (Ctrl-C where it runs, or kill those pids), or use --dir "
                        "for a second cluster",
                        path, live);
    if (remote)
        return dp__fail(
            d, DP_EEXIST,
            "%s names units without a local pid (a cluster started by another "
            "launcher): remove it, or use --dir for another directory",
            path);
    printf("replacing stale %s (its %u unit%s are gone)\n", path, n, n == 1 ? "" : "s");
    return DP_OK;
}

/* MemAvailable of /proc/meminfo in bytes, 0 if unknown. */
static uint64_t
mem_available(void)
{
    FILE *f = fopen("/proc/meminfo", "re");
    if (f == NULL)
        return 0;
    char line[256];
    unsigned long long kb = 0;
    while (fgets(line, sizeof line, f) != NULL)
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1)
            break;
    fclose(f);
    return (uint64_t)kb * 1024;
}

/* ---- starting ---- */

/*
 * Start unit i of s->n: `dataplane unit --unit-id i --units N --port PORT`
 * (PORT "0": any free one) with up's --bind and --slab, and each option of up
 * that is passed on when given.
 */
static int
spawn_unit(dp__sup *s, uint32_t i, const up_opts *o, const char *port, dp_detail *d)
{
    char id[16], units[16];
    snprintf(id, sizeof id, "%u", i);
    snprintf(units, sizeof units, "%u", s->n);
    const char *args[64]; /* every option given: 12 + 2 x 22, and the NULL */
    int k = 0;
    args[k++] = "dataplane";
    args[k++] = "unit";
    args[k++] = "--unit-id";
    args[k++] = id;
    args[k++] = "--units";
    args[k++] = units;
    args[k++] = "--port";
    args[k++] = port;
    args[k++] = "--bind";
    args[k++] = o->bind;
    args[k++] = "--slab";
    args[k++] = o->slab;
#define PASS(flag, val)                                                                  \
    do {                                                                                 \
        if ((val) != NULL) {                                                             \
            args[k++] = flag;                                                            \
            args[k++] = (val);                                                           \
        }                                                                                \
    } while (0)
    PASS("--advertise", o->advertise);
    PASS("--read-pin-s", o->read_pin_s);
    PASS("--alloc-lease-s", o->alloc_lease_s);
    PASS("--reclaim-grace-s", o->reclaim_grace_s);
    args[k++] = "--cluster-id";
    args[k++] = o->cluster_id;
    PASS("--numa", o->numa);
    char reps[8];
    snprintf(reps, sizeof reps, "%u", (unsigned)o->replicas);
    if (o->replicas > 1) {
        args[k++] = "--replicas";
        args[k++] = reps;
        /* A unit started again fills itself from its peers (with a registry,
         * from the registry: the unit's default). */
        if (o->registry == NULL)
            PASS("--repair-from", o->cluster_file);
        PASS("--repair-rate", o->repair_rate);
        PASS("--repair-every", o->repair_every);
        PASS("--lease", o->lease);
    }
    PASS("--ssd-dir", o->ssd_dir);
    PASS("--staging", o->staging);
    PASS("--pickup-s", o->pickup_s);
    char metrics[96];
    if (o->metrics_ip[0] != '\0') {
        snprintf(metrics, sizeof metrics, "%s:%u", o->metrics_ip,
                 o->metrics_port == 0 ? 0u : o->metrics_port + i);
        args[k++] = "--metrics";
        args[k++] = metrics;
    }
    PASS("--registry", o->registry);
    PASS("--curve-secret", o->curve_secret);
    PASS("--curve-allow", o->curve_allow);
    PASS("--registry-ttl", o->registry_ttl);
#undef PASS
    args[k] = NULL;
    return dp__sup_spawn(s, i, args, d);
}

/*
 * info from every unit (only >= 0: from that one), within timeout_s: each says
 * it is unit i of n (as up started it) and gives its endpoint name for the
 * cluster file.
 */
static int
ask_info(dp__sup *s, const char *path, double timeout_s, int64_t only, dp_detail *d)
{
    dp__cli_conn c;
    memset(&c, 0, sizeof c);
    c.timeout_s = c.connect_timeout_s = timeout_s;
    c.cl.n_units = s->n;
    snprintf(c.path, sizeof c.path, "%s", path); /* the file up writes next */
    int rc = DP_OK;
    c.cl.units = calloc(s->n, sizeof *c.cl.units);
    c.units = calloc(s->n, sizeof *c.units);
    if (c.cl.units == NULL || c.units == NULL) {
        rc = dp__fail(d, DP_ENOMEM, "out of memory");
        goto out;
    }
    for (uint32_t i = 0; i < s->n; i++) {
        c.cl.units[i].id = i;
        snprintf(c.cl.units[i].zmq, sizeof c.cl.units[i].zmq, "%s", s->u[i].addr);
        snprintf(c.cl.units[i].pubkey, sizeof c.cl.units[i].pubkey, "%s", s->pubkey);
    }
    if ((rc = dp__wire_rid_gen_init(&c.rids, d)) != DP_OK ||
        (rc = dp__ctl_client_create(&c.ctl, d)) != DP_OK ||
        (rc = dp__cli_check_units(&c, only, 0, d)) != DP_OK)
        goto out;
    for (uint32_t i = 0; i < s->n; i++) {
        if (only >= 0 && i != (uint64_t)only)
            continue;
        snprintf(s->u[i].agent, sizeof s->u[i].agent, "%s", c.units[i].agent);
        s->u[i].incarnation = c.units[i].incarnation;
    }
out:
    dp__cli_disconnect(&c);
    return rc;
}

/* ---- phases of up ---- */

/*
 * The directory (made 0700), the cluster file's absolute path (into path),
 * up's lock on the directory and the check of an existing cluster file. Returns -1 with
 * *lock_fd held, else the exit status (the reason said, nothing held).
 */
static int
lock_dir(const up_opts *o, char path[PATH_MAX], int *lock_fd, dp_detail *d)
{
    char dir[PATH_MAX], lock_path[PATH_MAX];
    int rc;
    if (o->dir != NULL)
        snprintf(dir, PATH_MAX, "%s", o->dir);
    else
        dp__cluster_default_dir(dir, PATH_MAX);
    if (snprintf(path, PATH_MAX, "%s/%s", dir, DP_CLUSTER_FILE) >= PATH_MAX ||
        snprintf(lock_path, sizeof lock_path, "%s/.up.lock", dir) >=
            (int)sizeof lock_path) {
        return dp__cli_usage("up", "--dir '%s' is too long", dir);
    }
    if ((rc = make_dir(dir, d)) != DP_OK)
        return dp__cli_fail("up", rc, d);
    /* Print and record absolute paths: clients run from other directories. */
    char abs_dir[PATH_MAX];
    if (realpath(dir, abs_dir) != NULL && strlen(abs_dir) + 16 < PATH_MAX) {
        size_t n = strlen(abs_dir);
        memcpy(dir, abs_dir, n + 1);
        memcpy(path, abs_dir, n);
        snprintf(path + n, PATH_MAX - n, "/%s", DP_CLUSTER_FILE);
    }
    int fd = open(lock_path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0)
        return dp__cli_fail("up", dp__fail_sys(d, errno, "open %s", lock_path), d);
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        close(fd);
        fprintf(stderr,
                "dataplane up: another 'dataplane up' is running with its cluster file "
                "in %s: stop it first, or use --dir for a second cluster\n",
                dir);
        return 1;
    }
    if ((rc = check_existing(path, d)) != DP_OK) {
        close(fd);
        return dp__cli_fail("up", rc, d);
    }
    *lock_fd = fd;
    return -1;
}

/*
 * Start every unit and wait for its address and its info, within
 * --start-timeout-s; then forward their output. False when the cluster did
 * not come up (the reason said).
 */
static bool
start_units(dp__sup *s, const up_opts *o, const char *path, dp_detail *d)
{
    uint64_t slab_bytes = 0;
    dp__parse_size(o->slab, &slab_bytes, "--slab", NULL);
    char sz[32];
    uint64_t avail = mem_available();
    if (avail > 0 && slab_bytes > avail / s->n) {
        char a[32], b[32];
        fprintf(stderr,
                "dataplane up: warning: %u x %s of slab is more than the %s of memory "
                "available now; units may fail to start or be killed when they fill\n",
                s->n, dp__fmt_size(slab_bytes, a, sizeof a),
                dp__fmt_size(avail, b, sizeof b));
    }
    printf("starting %u unit%s (slab %s each%s%s)...\n", s->n, s->n == 1 ? "" : "s",
           dp__fmt_size(slab_bytes, sz, sizeof sz), o->ssd_dir ? ", SSD tier in " : "",
           o->ssd_dir ? o->ssd_dir : "");
    fflush(stdout);
    int rc;
    for (uint32_t i = 0; i < s->n; i++) {
        if ((rc = spawn_unit(s, i, o, "0", d)) != DP_OK) {
            dp__cli_fail("up", rc, d);
            return false;
        }
    }
    double end = dp__now_s() + o->start_timeout_s;
    if (!dp__sup_wait_started(s, end, o->start_timeout_s))
        return false;
    /* Asking the units who they are is part of starting them: the same budget. */
    if ((rc = ask_info(s, path, DP_MAX(end - dp__now_s(), 1.0), -1, d)) != DP_OK) {
        dp__cli_fail("up", rc, d);
        return false;
    }
    /*
     * What the units logged while starting sits in their tails: show it once,
     * in unit order, then forward their output live.
     */
    dp__sup_start_forwarding(s);
    return true;
}

/* Write the cluster file of the started units; false (said) if it fails. */
static bool
write_cluster(const dp__sup *s, const char *path, const char *o_cluster_id,
              const char *o_pubkey, dp_detail *d)
{
    dp__cluster cl = {.n_units = s->n, .units = calloc(s->n, sizeof(dp__cluster_unit))};
    snprintf(cl.cluster_id, sizeof cl.cluster_id, "%s", o_cluster_id);
    cl.replicas = s->replicas;
    if (cl.units == NULL) {
        dp__cli_fail("up", dp__fail(d, DP_ENOMEM, "out of memory"), d);
        return false;
    }
    for (uint32_t i = 0; i < s->n; i++) {
        cl.units[i].id = i;
        cl.units[i].pid = s->u[i].pid;
        snprintf(cl.units[i].zmq, sizeof cl.units[i].zmq, "%s", s->u[i].addr);
        snprintf(cl.units[i].agent, sizeof cl.units[i].agent, "%s", s->u[i].agent);
        cl.units[i].incarnation = s->u[i].incarnation;
        snprintf(cl.units[i].pubkey, sizeof cl.units[i].pubkey, "%s", o_pubkey);
    }
    int rc = dp__cluster_save(path, &cl, d);
    dp__cluster_fini(&cl);
    if (rc != DP_OK) {
        dp__cli_fail("up", rc, d);
        return false;
    }
    return true;
}

/*
 * Remove the cluster file (if written), stop every unit, and say how it
 * ended; returns up's exit status.
 */
static int
stop_units(dp__sup *s, const up_opts *o, const char *path, bool wrote)
{
    if (wrote && unlink(path) != 0 && errno != ENOENT)
        fprintf(stderr, "dataplane up: could not remove %s: %s\n", path, strerror(errno));
    bool clean = dp__sup_stop_all(s, o->grace_s);
    /* Asked to stop and every unit stopped cleanly: 0 (128 + signal if the
     * cluster never came up); a unit died or would not stop: 1. */
    int status;
    if (s->stopping && clean)
        status = wrote ? 0 : 128 + s->stop_signal;
    else
        status = 1;
    if (status == 0)
        printf("stopped %u unit%s%s\n", s->n, s->n == 1 ? "" : "s",
               wrote ? "; cluster file removed" : "");
    else if (wrote)
        fprintf(stderr, "dataplane up: cluster stopped; %s removed\n", path);
    fflush(stdout);
    return status;
}

/*
 * Start unit u, which died, again on the port of its address, with the same
 * id, options and cluster id; wait for it within --start-timeout-s, ask every
 * unit who it is, and rewrite the cluster file with its pid and incarnation.
 * False (said) when it could not be started.
 */
static bool
restart_unit(dp__sup *s, dp__sup_unit *u, const up_opts *o, const char *path,
             dp_detail *d)
{
    const char *colon = strrchr(u->addr, ':');
    char port[8];
    if (colon == NULL || strlen(colon + 1) >= sizeof port) {
        fprintf(stderr, "dataplane up: unit %u: no port in its address '%s'\n", u->id,
                u->addr);
        return false;
    }
    snprintf(port, sizeof port, "%s", colon + 1);
    fprintf(stderr, "dataplane up: restarting unit %u on port %s\n", u->id, port);
    dp__sup_reset(u);
    int rc = spawn_unit(s, u->id, o, port, d);
    if (rc != DP_OK) {
        dp__cli_fail("up", rc, d);
        return false;
    }
    double end = dp__now_s() + o->start_timeout_s;
    if (!dp__sup_wait_started(s, end, o->start_timeout_s))
        return false;
    /* Only the unit started again: another may be down meanwhile (its turn next). */
    if ((rc = ask_info(s, path, DP_MAX(end - dp__now_s(), 1.0), u->id, d)) != DP_OK) {
        dp__cli_fail("up", rc, d);
        return false;
    }
    if (!write_cluster(s, path, o->cluster_id, o->curve_public, d))
        return false;
    printf("unit %u restarted (pid %d, incarnation %016" PRIx64 "); %s updated\n", u->id,
           (int)u->pid, u->incarnation, path);
    fflush(stdout);
    return true;
}

/* A unit's restarts in its current window (--restart-window). */
typedef struct restart_count {
    uint64_t n;
    double since; /* dp__now_s() of the window's first restart */
} restart_count;

/*
 * Whether the unit may be started again: at most --max-restarts restarts in
 * a window of --restart-window seconds that opens at the first restart after
 * the last window ended (systemd's StartLimitBurst in StartLimitIntervalSec),
 * so a unit that dies now and then over weeks is not given up on, and one
 * that dies in a loop is. False after saying why.
 */
static bool
may_restart(restart_count *rc, unsigned id, const up_opts *o)
{
    double now = dp__now_s();
    if (o->restart_window_s > 0 &&
        (rc->n == 0 || now - rc->since >= o->restart_window_s)) {
        rc->n = 0;
        rc->since = now;
    }
    if (rc->n++ < o->max_restarts)
        return true;
    if (o->restart_window_s > 0)
        fprintf(stderr,
                "dataplane up: unit %u died %" PRIu64
                " times in %.0f s (--max-restarts %" PRIu64
                " within --restart-window %g s): stopping the cluster\n",
                id, rc->n, now - rc->since, o->max_restarts, o->restart_window_s);
    else
        fprintf(stderr,
                "dataplane up: unit %u died %" PRIu64 " times (--max-restarts %" PRIu64
                "): stopping the cluster\n",
                id, rc->n, o->max_restarts);
    return false;
}

/*
 * Watch the cluster until asked to stop or a unit dies; with --restart, a
 * dead unit is started again (may_restart: --max-restarts in a window).
 */
static void
watch_units(dp__sup *s, const up_opts *o, const char *path, dp_detail *d)
{
    restart_count *restarts = calloc(s->n, sizeof *restarts);
    for (;;) {
        dp__sup_unit *dead = dp__sup_watch(s);
        if (dead == NULL)
            break;
        if (!o->restart || restarts == NULL) {
            fprintf(stderr, "dataplane up: stopping the other units\n");
            break;
        }
        if (!may_restart(&restarts[dead->id], dead->id, o))
            break;
        if (!restart_unit(s, dead, o, path, d)) {
            if (s->stopping)
                break;
            fprintf(stderr,
                    "dataplane up: unit %u could not be restarted: stopping the "
                    "cluster\n",
                    dead->id);
            break;
        }
    }
    free(restarts);
}

int
dp__cmd_up(int argc, char **argv)
{
    up_opts o;
    int st = parse_opts(argc, argv, &o);
    if (st >= 0)
        return st;
    if (o.registry == NULL) {
        /* One id for this cluster: its units and its file name it. */
        char rnd[33];
        dp_detail rd;
        dp_detail_clear(&rd);
        if (dp__random_hex_id(rnd, &rd) != DP_OK)
            return dp__cli_fail("up", rd.code, &rd);
        snprintf(o.cluster_id, sizeof o.cluster_id, "up-%.24s", rnd);
    }

    /* Before any thread or child exists: the event loop reads these from a signalfd. */
    sigset_t sigs;
    dp__sup_block_signals(&sigs);

    dp_detail d;
    dp_detail_clear(&d);
    char path[PATH_MAX];
    int lock_fd = -1;
    int status = lock_dir(&o, path, &lock_fd, &d);
    if (status >= 0)
        return status;
    o.cluster_file = path;
    dp__sup s;
    dp__sup_init(&s);
    snprintf(s.pubkey, sizeof s.pubkey, "%s", o.curve_public);
    s.replicas = (uint32_t)o.replicas;
    /* up asks its units who they are with their own key (always allowed). */
    if (o.curve_secret != NULL)
        setenv("DP_CURVE_SECRET", o.curve_secret, 1);
    int rc = dp__sup_open(&s, (uint32_t)o.units, &sigs, &d);
    if (rc != DP_OK) {
        status = dp__cli_fail("up", rc, &d);
    } else {
        bool wrote = start_units(&s, &o, path, &d) &&
                     write_cluster(&s, path, o.cluster_id, o.curve_public, &d);
        if (wrote) {
            const char *where = o.registry != NULL ? o.registry : path;
            char reps[48] = "";
            if (s.replicas > 1)
                snprintf(reps, sizeof reps, " (%u copies of each row)", s.replicas);
            printf("cluster of %u unit%s%s up: %s%s%s\n"
                   "clients find it with --cluster %s, or:\n"
                   "  export DP_CLUSTER=%s\n"
                   "Ctrl-C stops it.\n",
                   s.n, s.n == 1 ? "" : "s", reps, path,
                   o.registry != NULL ? ", registered in " : "",
                   o.registry != NULL ? o.registry : "", where, where);
            fflush(stdout);
            watch_units(&s, &o, path, &d);
        }
        status = stop_units(&s, &o, path, wrote);
    }
    dp__sup_close(&s);
    close(lock_fd);
    return status;
}
