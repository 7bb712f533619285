/*
 * `dataplane unit`: run one storage unit in the foreground, for launchers on
 * many machines and for `dataplane up`. It creates the UCX endpoint (with a
 * progress thread, so peers whose RMA is emulated are served), the unit and
 * its slab, the ticker and the ZMQ control server, prints the address clients
 * use (tcp://host:port: the advertised host, which is never a wildcard, and
 * the bound port) as the first line of stdout and nothing else there, and
 * runs until SIGINT or SIGTERM.
 */
#include <getopt.h>
#include <limits.h>
#include <sys/stat.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "common/common.h"
#include "ctl/ctl.h"
#include "http/http.h"
#include "registry/registry.h"
#include "unit/server.h"
#include "unit/unit.h"
#include "wire/wire.h"
#include "xfer/endpoint.h"

static const char usage_unit[] =
    "usage: dataplane unit [options]\n"
    "\n"
    "Run one storage unit: a registered DRAM slab that clients WRITE to and READ\n"
    "from one-sided, and a ZMQ control server for alloc/commit/resolve/release.\n"
    "Prints the address clients use (tcp://host:port) as the first line of stdout,\n"
    "and nothing else there (logs, UCX's too, go to stderr), and runs until SIGINT\n"
    "or SIGTERM.\n"
    "\n"
    "options:\n"
    "  --bind IP            address to bind the control server to (127.0.0.1);\n"
    "                       0.0.0.0 binds every IPv4 interface\n"
    "  --advertise HOST     address to tell clients (info, the first stdout line):\n"
    "                       an IPv4 address, [IPv6] or a host name; the port is the\n"
    "                       bound one. Default: the bound address; for a wildcard\n"
    "                       --bind, this host's primary IPv4 address (127.0.0.1,\n"
    "                       with a warning, if it has none)\n"
    "  --port N             port, 0 for a free one (0)\n"
    "  --slab SIZE          slab size, e.g. 512M, 4G (256M)\n"
    "  --read-pin-s S       how long a resolve pins what it returns (30)\n"
    "  --alloc-lease-s S    an alloc not committed by then is retired, 0 never (300)\n"
    "  --reclaim-grace-s S  a retired region (or an open alloc) of a writer on this\n"
    "                       host using shared memory comes back S seconds after its\n"
    "                       process exited; 'never' keeps retired regions for good (5)\n"
    "  --cluster-id ID      the cluster this unit belongs to (1..64 of "
    "[A-Za-z0-9_.:-]);\n"
    "                       info reports it and clients whose cluster file names\n"
    "                       another id refuse the unit (`up` sets one per cluster)\n"
    "  --numa MODE          auto, bind or off (auto); a no-op on one-node machines\n"
    "  --unit-id K|auto     this unit's index in the cluster (0); auto: from the\n"
    "                       launcher: SLURM_PROCID (N from SLURM_NTASKS), else the\n"
    "                       host name's -ORDINAL suffix (a Kubernetes StatefulSet pod)\n"
    "  --unit-id-env NAME   take the id from environment variable NAME (implies auto)\n"
    "  --units N            units in the cluster; row g belongs to unit g % N (1)\n"
    "  --replicas R         copies of each row (1..3, at most N): row g lives on units\n"
    "                       g % N, (g + 1) % N, ...; every unit of a cluster gets the\n"
    "                       same R (1)\n"
    "  --repair-from C      with R > 1: the cluster (file, directory, etcd:// URL or\n"
    "                       the units' tcp:// addresses in unit order, comma-\n"
    "                       separated) this unit fills itself from at start, in the\n"
    "                       background, when the file exists (default: --registry)\n"
    "  --repair-rate SIZE   the repair's bytes a second at most; 0: no repair (256M)\n"
    "  --repair-every S     with R > 1 and a cluster to read: every S seconds,\n"
    "                       compare this unit's copies with its peers' and copy in\n"
    "                       what they hold at a higher version; 0: never (600)\n"
    "  --lease S            read leases of S seconds (0: none; with R > 1, 3 units or\n"
    "                       more and a cluster to read): a put may land without a\n"
    "                       unit that does not answer, once most units fenced it;\n"
    "                       this unit answers reads only while most units grant it\n"
    "                       a lease (every unit of a cluster gets the same S) (0)\n"
    "  --registry URL       register in etcd: etcd://HOST:PORT[,HOST:PORT...]/NAME;\n"
    "                       clients then find the cluster by that URL. NAME is the\n"
    "                       cluster id. The record lives as long as a lease this\n"
    "                       unit renews; a unit id another live unit holds, or an N\n"
    "                       other than the cluster's, is refused\n"
    "  --registry-ttl S     the registration's lease: a unit that dies leaves the\n"
    "                       registry within S seconds (10)\n"
    "  --registry-wait-s S  how long to keep trying to reach etcd at start (60)\n"
    "  --curve-secret FILE  authenticate the control plane with CURVE: this unit's\n"
    "                       secret key (PATH.key of 'dataplane keygen', mode 0600)\n"
    "  --curve-allow DIR    with --curve-secret: serve only clients whose public key\n"
    "                       is a *.pub file in DIR (re-read on SIGHUP)\n"
    "  --metrics IP:PORT    serve /metrics (Prometheus text format) and /healthz over\n"
    "                       HTTP there (0.0.0.0:PORT: every interface; port 0: free)\n"
    "  --ssd-dir DIR        SSD tier: puts the slab cannot take spill to files in\n"
    "                       DIR (unlinked at once: nothing stays when the unit ends)\n"
    "  --staging SIZE       IO area for spills and staged reads, with --ssd-dir (64M)\n"
    "  --pickup-s S         keep a staged copy nobody pinned yet this long (10)\n"
    "  -h, --help           this text\n";

static int
unit_usage_error(const char *fmt, const char *arg)
{
    fprintf(stderr, "dataplane unit: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\nRun 'dataplane unit --help' for usage.\n");
    return 2;
}

/* What the command line asked for, and where a parse error is described. */
typedef struct unit_cmd {
    const char *bind_ip, *advertise;
    uint64_t port, unit_id, units, staging;
    bool staging_set, units_set, id_auto;
    const char *id_env, *registry, *metrics, *curve_allow;
    const char *repair_from; /* the cluster to repair from (NULL: the registry's) */
    uint64_t repair_rate;    /* bytes a second */
    double repair_every_s;   /* passes (docs/design.md, "Repair"); 0: none */
    char curve_secret[41], curve_public[41]; /* "" without CURVE */
    char id_source[320];
    dp__reg_url reg;
    double reg_ttl_s, reg_wait_s;
    dp__unit_opts uo;
    dp_detail d;
} unit_cmd;

enum {
    O_BIND = 1,
    O_ADVERTISE,
    O_PORT,
    O_SLAB,
    O_PIN,
    O_LEASE,
    O_RECLAIM,
    O_CLUSTER_ID,
    O_NUMA,
    O_REPLICAS,
    O_REPAIR_FROM,
    O_REPAIR_RATE,
    O_REPAIR_EVERY,
    O_READ_LEASE,
    O_ID,
    O_UNITS,
    O_SSD,
    O_STAGING,
    O_PICKUP,
    O_ID_ENV,
    O_REGISTRY,
    O_REG_TTL,
    O_REG_WAIT,
    O_METRICS,
    O_CURVE_SECRET,
    O_CURVE_ALLOW
};

/* unit_option and unit_parse: go on (anything else is the exit status). */
#define UNIT_GO_ON (-1)

/* --replicas, --repair-from, --repair-rate (docs/design.md, "Replicas", "Repair"). */
static int
replica_option(unit_cmd *u, int c)
{
    dp_detail *d = &u->d;
    int rc = 0;
    if (c == O_REPAIR_FROM) {
        u->repair_from = optarg;
    } else if (c == O_REPAIR_RATE) {
        rc = dp__parse_size(optarg, &u->repair_rate, "--repair-rate", d);
    } else if (c == O_REPAIR_EVERY) {
        rc = dp__parse_seconds(optarg, &u->repair_every_s, "--repair-every", d);
    } else if (c == O_READ_LEASE) {
        rc = dp__parse_seconds(optarg, &u->uo.lease_s, "--lease", d);
    } else {
        uint64_t r = 0;
        rc = dp__parse_u64(optarg, 1, DP_UNIT_MAX_REPLICAS, &r, "--replicas", d);
        u->uo.replicas = (uint32_t)r;
    }
    return rc;
}

/*
 * Apply option c (its argument in optarg) to u: UNIT_GO_ON, or the status to
 * exit with at once (0 after --help, 2 after a usage error it printed).
 */
static int
unit_option(unit_cmd *u, int c, char **argv)
{
    dp__unit_opts *uo = &u->uo;
    dp_detail *d = &u->d;
    int rc = 0;
    switch (c) {
    case O_BIND:
        u->bind_ip = optarg;
        break;
    case O_ADVERTISE:
        rc = dp__cli_check_advertise(optarg, d);
        u->advertise = optarg;
        break;
    case O_PORT:
        rc = dp__parse_u64(optarg, 0, 65535, &u->port, "--port", d);
        break;
    case O_SLAB:
        rc = dp__parse_size(optarg, &uo->slab_bytes, "--slab", d);
        break;
    case O_PIN:
        rc = dp__parse_seconds(optarg, &uo->read_pin_s, "--read-pin-s", d);
        if (rc == 0 && !(uo->read_pin_s > 0))
            rc = dp__fail(d, DP_EINVAL, "--read-pin-s must be > 0");
        break;
    case O_LEASE:
        rc = dp__parse_seconds(optarg, &uo->alloc_lease_s, "--alloc-lease-s", d);
        break;
    case O_CLUSTER_ID:
        if (dp__wire_check_id(dp__wire_s(optarg), NULL, "--cluster-id", d) != DP_OK)
            rc = DP_EINVAL;
        uo->cluster_id = optarg;
        break;
    case O_RECLAIM:
        if (strcmp(optarg, "never") == 0)
            uo->reclaim_grace_s = -1;
        else
            rc = dp__parse_seconds(optarg, &uo->reclaim_grace_s, "--reclaim-grace-s", d);
        break;
    case O_REPAIR_FROM:
    case O_REPAIR_RATE:
    case O_REPAIR_EVERY:
    case O_READ_LEASE:
    case O_REPLICAS:
        rc = replica_option(u, c);
        break;
    case O_NUMA:
        if (strcmp(optarg, "auto") == 0)
            uo->numa = DP_UNIT_NUMA_AUTO;
        else if (strcmp(optarg, "bind") == 0)
            uo->numa = DP_UNIT_NUMA_BIND;
        else if (strcmp(optarg, "off") == 0)
            uo->numa = DP_UNIT_NUMA_OFF;
        else
            return unit_usage_error("--numa must be auto, bind or off, not '%s'", optarg);
        break;
    case O_ID:
        u->id_auto = strcmp(optarg, "auto") == 0;
        if (!u->id_auto)
            rc = dp__parse_u64(optarg, 0, UINT32_MAX - 1, &u->unit_id, "--unit-id", d);
        break;
    case O_ID_ENV:
        if (optarg[0] == '\0')
            return unit_usage_error("--unit-id-env must name a variable%s", "");
        u->id_env = optarg;
        u->id_auto = true;
        break;
    case O_UNITS:
        rc = dp__parse_u64(optarg, 1, UINT32_MAX, &u->units, "--units", d);
        u->units_set = true;
        break;
    case O_REGISTRY:
        rc = dp__reg_url_parse(optarg, &u->reg, d);
        u->registry = optarg;
        break;
    case O_REG_TTL:
        rc = dp__parse_seconds(optarg, &u->reg_ttl_s, "--registry-ttl", d);
        if (rc == 0 && !(u->reg_ttl_s >= 1 && u->reg_ttl_s <= 3600))
            rc = dp__fail(d, DP_EINVAL, "--registry-ttl must be 1..3600 seconds");
        break;
    case O_CURVE_SECRET:
        rc = dp__ctl_key_read(optarg, true, u->curve_secret, d);
        if (rc == DP_OK)
            rc = dp__ctl_key_public(u->curve_secret, u->curve_public, d);
        break;
    case O_CURVE_ALLOW:
        u->curve_allow = optarg;
        break;
    case O_METRICS: {
        char ip[64];
        uint16_t port;
        rc = dp__http_parse_addr(optarg, ip, sizeof ip, &port, d);
        u->metrics = optarg;
        break;
    }
    case O_REG_WAIT:
        rc = dp__parse_seconds(optarg, &u->reg_wait_s, "--registry-wait-s", d);
        break;
    case O_SSD:
        if (optarg[0] == '\0')
            return unit_usage_error("--ssd-dir must not be empty%s", "");
        uo->ssd_dir = optarg;
        break;
    case O_STAGING:
        rc = dp__parse_size(optarg, &u->staging, "--staging", d);
        if (rc == 0 && u->staging < 4096)
            rc = dp__fail(d, DP_EINVAL, "--staging must be at least 4K");
        u->staging_set = true;
        break;
    case O_PICKUP:
        rc = dp__parse_seconds(optarg, &uo->pickup_s, "--pickup-s", d);
        break;
    case 'h':
        fputs(usage_unit, stdout);
        return 0;
    default:
        return unit_usage_error("unknown option or missing value '%s'", argv[optind - 1]);
    }
    if (rc != 0)
        return unit_usage_error("%s", dp_detail_msg(d));
    return UNIT_GO_ON;
}

/* Parse the command line into u: UNIT_GO_ON, or the status to exit with. */
/*
 * Whether a unit can fill itself from `from`: a registry, or a cluster file
 * (or a directory holding cluster.json) that exists. A cluster started
 * fresh has no file yet: its units have nothing to repair.
 */
static bool
repair_source_exists(const char *from)
{
    if (from == NULL)
        return false;
    if (dp__reg_is_url(from) ||
        strncmp(from, "tcp://", 6) == 0) /* a registry, addresses */
        return true;
    struct stat st;
    if (stat(from, &st) != 0)
        return false;
    if (!S_ISDIR(st.st_mode))
        return true;
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s/cluster.json", from);
    return stat(p, &st) == 0;
}

static int
unit_parse(int argc, char **argv, unit_cmd *u)
{
    static const struct option opts[] = {
        {"bind", required_argument, NULL, O_BIND},
        {"advertise", required_argument, NULL, O_ADVERTISE},
        {"port", required_argument, NULL, O_PORT},
        {"slab", required_argument, NULL, O_SLAB},
        {"read-pin-s", required_argument, NULL, O_PIN},
        {"alloc-lease-s", required_argument, NULL, O_LEASE},
        {"reclaim-grace-s", required_argument, NULL, O_RECLAIM},
        {"cluster-id", required_argument, NULL, O_CLUSTER_ID},
        {"numa", required_argument, NULL, O_NUMA},
        {"replicas", required_argument, NULL, O_REPLICAS},
        {"repair-from", required_argument, NULL, O_REPAIR_FROM},
        {"repair-rate", required_argument, NULL, O_REPAIR_RATE},
        {"repair-every", required_argument, NULL, O_REPAIR_EVERY},
        {"lease", required_argument, NULL, O_READ_LEASE},
        {"unit-id", required_argument, NULL, O_ID},
        {"units", required_argument, NULL, O_UNITS},
        {"ssd-dir", required_argument, NULL, O_SSD},
        {"staging", required_argument, NULL, O_STAGING},
        {"pickup-s", required_argument, NULL, O_PICKUP},
        {"unit-id-env", required_argument, NULL, O_ID_ENV},
        {"registry", required_argument, NULL, O_REGISTRY},
        {"registry-ttl", required_argument, NULL, O_REG_TTL},
        {"registry-wait-s", required_argument, NULL, O_REG_WAIT},
        {"metrics", required_argument, NULL, O_METRICS},
        {"curve-secret", required_argument, NULL, O_CURVE_SECRET},
        {"curve-allow", required_argument, NULL, O_CURVE_ALLOW},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0}};
    *u = (unit_cmd){.bind_ip = "127.0.0.1",
                    .units = 1,
                    .reg_ttl_s = 10,
                    .reg_wait_s = 60,
                    .repair_rate = 256ull << 20,
                    .repair_every_s = 600};
    dp__unit_opts_init(&u->uo);
    u->uo.slab_bytes = 256ull << 20;
    dp_detail_clear(&u->d);
    int c;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        int st = unit_option(u, c, argv);
        if (st != UNIT_GO_ON)
            return st;
    }
    if (optind < argc)
        return unit_usage_error("unexpected argument '%s'", argv[optind]);
    if (u->id_auto) {
        uint32_t id = 0, n = 0;
        if (dp__reg_auto_id(u->id_env, &id, &n, u->id_source, sizeof u->id_source,
                            &u->d) != DP_OK)
            return unit_usage_error("%s", dp_detail_msg(&u->d));
        u->unit_id = id;
        if (n != 0 && u->units_set && n != u->units) {
            char msg[512];
            snprintf(msg, sizeof msg,
                     "--units %" PRIu64 " but the launcher (%s) says %" PRIu32 " tasks",
                     u->units, u->id_source, n);
            return unit_usage_error("%s", msg);
        }
        if (n != 0)
            u->units = n;
        else if (!u->units_set)
            return unit_usage_error("--unit-id auto took the id from %s, which does not "
                                    "say how many units there are: give --units N",
                                    u->id_source);
    }
    if (u->registry != NULL) {
        if (u->uo.cluster_id != NULL && strcmp(u->uo.cluster_id, u->reg.name) != 0) {
            char msg[200];
            snprintf(msg, sizeof msg,
                     "--cluster-id %s differs from the registry's cluster name %s (leave "
                     "--cluster-id out: the name is the id)",
                     u->uo.cluster_id, u->reg.name);
            return unit_usage_error("%s", msg);
        }
        u->uo.cluster_id = u->reg.name;
    } else if (u->reg_wait_s != 60 || u->reg_ttl_s != 10) {
        return unit_usage_error("--registry-ttl and --registry-wait-s need --registry%s",
                                "");
    }
    if ((u->curve_secret[0] != '\0') != (u->curve_allow != NULL))
        return unit_usage_error("--curve-secret and --curve-allow go together%s", "");
    if (u->unit_id >= u->units) {
        char msg[96];
        snprintf(msg, sizeof msg, "--unit-id %" PRIu64 " must be below --units %" PRIu64,
                 u->unit_id, u->units);
        return unit_usage_error("%s", msg);
    }
    if (u->uo.replicas > u->units) {
        char msg[160];
        snprintf(msg, sizeof msg,
                 "--replicas %u needs at least as many units (--units %" PRIu64
                 "): each copy of a row lives on another unit",
                 u->uo.replicas, u->units);
        return unit_usage_error("%s", msg);
    }
    if (u->staging_set && u->uo.ssd_dir == NULL)
        return unit_usage_error("--staging needs --ssd-dir%s", "");
    if (u->uo.ssd_dir != NULL)
        u->uo.staging_bytes = u->staging_set ? u->staging : 64ull << 20;
    u->uo.unit_id = (uint32_t)u->unit_id;
    u->uo.n_units = (uint32_t)u->units;
    if (u->repair_from == NULL)
        u->repair_from = u->registry;
    u->uo.repair =
        u->uo.replicas > 1 && u->repair_rate > 0 && repair_source_exists(u->repair_from);
    /* Passes need a cluster to read by then (a fresh one's file comes later). */
    u->uo.repair_every_s = u->uo.replicas > 1 && u->repair_rate > 0 && u->repair_from
                               ? u->repair_every_s
                               : 0;
    if (u->uo.lease_s > 0 && (u->repair_from == NULL || u->uo.replicas < 2 ||
                              u->repair_rate == 0 || u->units < 3))
        return unit_usage_error(
            "--lease needs --replicas 2 or 3 on at least 3 units, a repair (--repair-"
            "rate above 0) and the cluster to ask (--repair-from or --registry)%s",
            "");
    return UNIT_GO_ON;
}

/*
 * The registry's probe: does holder's incarnation answer info at its address
 * within a second? A unit restarted at the same address answers as itself,
 * which is another incarnation: not alive.
 */
static int
probe_holder(void *ctx, const dp__reg_record *holder, char *why, size_t cap)
{
    const unit_cmd *u = ctx;
    uint64_t inc = 0;
    int rc = DP_ETIMEDOUT;
    /* Twice: a busy unit may miss one second. Over CURVE with this unit's key. */
    for (int i = 0; i < 2 && rc == DP_ETIMEDOUT; i++)
        rc = dp__cli_probe_unit(holder->zmq, holder->pubkey,
                                u->curve_secret[0] ? u->curve_secret : NULL, 1.0, &inc,
                                why, cap);
    if (rc == DP_ETIMEDOUT || rc == DP_ETRANSFER)
        return 0; /* silent or refused: gone */
    if (rc != DP_OK)
        return 1; /* it answered something (another version?), or cannot tell */
    if (inc == holder->incarnation)
        return 1;
    snprintf(why, cap, "incarnation %016" PRIx64 " answers at %s instead", inc,
             holder->zmq);
    return 0;
}

/* SIGINT or SIGTERM pending (they are blocked: sigwait takes them later). */
static bool
stop_pending(void *ctx)
{
    DP_UNUSED(ctx);
    sigset_t p;
    return sigpending(&p) == 0 &&
           (sigismember(&p, SIGINT) == 1 || sigismember(&p, SIGTERM) == 1);
}

/* Register the served unit in u's registry: *out, or an error in u->d. */
static int
unit_register(unit_cmd *u, dp__unit_server *srv, const char *name, dp__reg_unit **out)
{
    const dp__unit_opts *uo = &u->uo;
    dp__unit *un = dp__unit_server_unit(srv);
    dp__reg_record r;
    memset(&r, 0, sizeof r);
    r.id = uo->unit_id;
    r.n_units = uo->n_units;
    r.replicas = uo->replicas;
    snprintf(r.cluster, sizeof r.cluster, "%s", u->reg.name);
    snprintf(r.zmq, sizeof r.zmq, "%s", dp__unit_server_address(srv));
    snprintf(r.agent, sizeof r.agent, "%s", name);
    r.incarnation = dp__unit_incarnation(un);
    r.pid = (int64_t)getpid();
    gethostname(r.host, sizeof r.host - 1);
    r.slab_bytes = uo->slab_bytes;
    r.ssd_bytes = dp__unit_io_bytes(un);
    dp__endpoint_transports(dp__unit_server_endpoint(srv), r.transports,
                            sizeof r.transports);
    r.started = dp__wall_s();
    snprintf(r.pubkey, sizeof r.pubkey, "%s", u->curve_public);
    dp__reg_unit_opts ro = {.ttl_s = u->reg_ttl_s,
                            .start_budget_s = u->reg_wait_s,
                            .probe = probe_holder,
                            .probe_ctx = u,
                            .cancelled = stop_pending};
    int rc = dp__reg_unit_start(&u->reg, &r, &ro, out, &u->d);
    if (rc == DP_OK)
        DP_LOG_I("registered as unit %u of %u in %s (lease %.0f s)%s%s", uo->unit_id,
                 uo->n_units, u->reg.text, u->reg_ttl_s, u->id_auto ? "; id from " : "",
                 u->id_auto ? u->id_source : "");
    return rc;
}

/* Run the unit u describes until SIGINT or SIGTERM: the exit status. */
static int
unit_serve(unit_cmd *u)
{
    dp__unit_opts *uo = &u->uo;
    /* Every thread started from here on inherits this mask; sigwait takes them. */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGHUP); /* re-read --curve-allow */
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);

    char prefix[32];
    snprintf(prefix, sizeof prefix, "unit %u", uo->unit_id);
    dp__log_set_prefix(prefix);

    int status = 1, rc;
    dp__unit_server *srv = NULL;
    dp__reg_unit *reg = NULL;
    dp__unit_repairer *rep = NULL;
    dp__unit_leaser *lease = NULL;
    char name[64], rnd[33], numa[128];
    /*
     * A unit holds a descriptor per connected client (bench/scale.sh): the
     * soft open-file limit goes up to the hard one (docs/design.md, "Capacity").
     */
    uint64_t nofile = 0, nofile_hard = 0;
    dp__nofile_raise(0, &nofile, &nofile_hard);
    if (nofile < 4096)
        DP_LOG_W("unit %u: the open-file limit is %" PRIu64 " (hard %" PRIu64
                 "): a unit holds one per connected client, so about %" PRIu64
                 " clients at once; raise the hard limit (ulimit -Hn, systemd "
                 "LimitNOFILE=, a container's nofile) for more",
                 uo->unit_id, nofile, nofile_hard, nofile > 64 ? nofile - 64 : 0);
    /* NUMA first, so the endpoint's threads start on the unit's node too. */
    dp__unit_numa_apply(uo->numa, uo->unit_id, numa, sizeof numa);
    if ((rc = dp__random_hex_id(rnd, &u->d)) != 0)
        goto fail;
    snprintf(name, sizeof name, "unit%u-%.8s", uo->unit_id, rnd);
    dp__unit_server_opts so = {.bind_ip = u->bind_ip,
                               .port = (uint16_t)u->port,
                               .advertise = u->advertise,
                               .tick_s = 1.0,
                               .metrics = u->metrics,
                               .curve_secret =
                                   u->curve_secret[0] ? u->curve_secret : NULL,
                               .curve_allow_dir = u->curve_allow};
    if ((rc = dp__unit_server_start(uo, name, &so, &srv, &u->d)) != 0)
        goto fail;
    /* Registered before the address line: a launcher that saw it can find it. */
    if (u->registry != NULL && (rc = unit_register(u, srv, name, &reg)) != 0) {
        if (rc == DP_ECANCELED) {
            DP_LOG_I("stopped by a signal while registering");
            status = 0;
            goto out;
        }
        goto fail;
    }
    /* The contract with launchers: this is the first line of stdout. */
    printf("%s\n", dp__unit_server_address(srv));
    fflush(stdout);
    char sz[32], bound[160] = "";
    if (strcmp(dp__unit_server_bound_address(srv), dp__unit_server_address(srv)) != 0)
        snprintf(bound, sizeof bound, " (bound to %s)",
                 dp__unit_server_bound_address(srv));
    DP_LOG_I("serving %s%s: unit %u of %u (replicas %u), slab %s, endpoint %s, numa: %s, "
             "read_pin_s %.1f, alloc_lease_s %.1f",
             dp__unit_server_address(srv), bound, uo->unit_id, uo->n_units, uo->replicas,
             dp__fmt_size(uo->slab_bytes, sz, sizeof sz), name,
             dp__unit_numa_desc(dp__unit_server_unit(srv)), uo->read_pin_s,
             uo->alloc_lease_s);
    if (u->metrics != NULL)
        DP_LOG_I("metrics: http://%s/metrics", dp__unit_server_metrics_address(srv));
    if ((uo->repair || uo->repair_every_s > 0 || uo->lease_s > 0) &&
        dp__unit_repair_start(dp__unit_server_unit(srv), uo->unit_id, u->repair_from,
                              (double)u->repair_rate, uo->repair, uo->repair_every_s,
                              &rep, &u->d) != DP_OK) {
        DP_LOG_W("repair: %s; this unit holds only what is written from now on",
                 dp_detail_msg(&u->d));
        dp__unit_repair_failed(dp__unit_server_unit(srv), 1);
        dp__unit_repair_end(dp__unit_server_unit(srv));
    }
    if (uo->lease_s > 0 &&
        dp__unit_lease_start(dp__unit_server_unit(srv), uo->unit_id, u->repair_from,
                             uo->lease_s, &lease, &u->d) != DP_OK) {
        rc = u->d.code;
        goto fail;
    }
    if (uo->ssd_dir != NULL)
        DP_LOG_I("ssd tier: dir %s, IO area %s, pickup_s %.1f", uo->ssd_dir,
                 dp__fmt_size(uo->staging_bytes, sz, sizeof sz), uo->pickup_s);
    if (u->curve_secret[0] != '\0')
        DP_LOG_I("CURVE: public key %s; clients allowed from %s", u->curve_public,
                 u->curve_allow);
    else if (strncmp(dp__unit_server_bound_address(srv), "tcp://127.", 10) != 0)
        fprintf(
            stderr,
            "dataplane unit: warning: listening on %s without CURVE: any process that "
            "can reach it can read and write this unit's data (see 'dataplane keygen' "
            "and --curve-secret)\n",
            dp__unit_server_bound_address(srv));
    int sig = 0;
    for (;;) {
        while (sigwait(&sigs, &sig) != 0)
            ;
        if (sig != SIGHUP)
            break;
        size_t n = 0;
        dp_detail hd;
        dp_detail_clear(&hd);
        if (u->curve_secret[0] == '\0')
            DP_LOG_I("SIGHUP: nothing to re-read (no --curve-allow)");
        else if (dp__unit_server_reload_allow(srv, &n, &hd) == DP_OK)
            DP_LOG_W("SIGHUP: %zu client key%s allowed from %s", n, n == 1 ? "" : "s",
                     u->curve_allow);
        else
            DP_LOG_E("SIGHUP: %s (the keys allowed before stay)", dp_detail_msg(&hd));
    }
    DP_LOG_I("signal %d: stopping", sig);
    status = 0;
    goto out;
fail:
    fprintf(stderr, "dataplane unit: %s (%s)\n", dp_detail_msg(&u->d), dp_strerror(rc));
out:
    dp__unit_lease_stop(lease);
    dp__unit_repair_stop(rep);
    dp__reg_unit_stop(reg); /* first: clients stop coming before the unit goes */
    dp__unit_server_close_at_exit(srv);
    return status;
}

int
dp__cmd_unit(int argc, char **argv)
{
    unit_cmd u;
    int st = unit_parse(argc, argv, &u);
    if (st != UNIT_GO_ON)
        return st;
    return unit_serve(&u);
}
