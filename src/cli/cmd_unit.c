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
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "common/common.h"
#include "unit/server.h"

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
    "  --unit-id K          this unit's index in the cluster (0)\n"
    "  --units N            units in the cluster; row g belongs to unit g % N (1)\n"
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
    bool staging_set;
    dp_unit_opts uo;
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
    O_ID,
    O_UNITS,
    O_SSD,
    O_STAGING,
    O_PICKUP
};

/* unit_option and unit_parse: go on (anything else is the exit status). */
#define UNIT_GO_ON (-1)

/*
 * Apply option c (its argument in optarg) to u: UNIT_GO_ON, or the status to
 * exit with at once (0 after --help, 2 after a usage error it printed).
 */
static int
unit_option(unit_cmd *u, int c, char **argv)
{
    dp_unit_opts *uo = &u->uo;
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
        rc = dp__parse_u64(optarg, 0, UINT32_MAX - 1, &u->unit_id, "--unit-id", d);
        break;
    case O_UNITS:
        rc = dp__parse_u64(optarg, 1, UINT32_MAX, &u->units, "--units", d);
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
        {"unit-id", required_argument, NULL, O_ID},
        {"units", required_argument, NULL, O_UNITS},
        {"ssd-dir", required_argument, NULL, O_SSD},
        {"staging", required_argument, NULL, O_STAGING},
        {"pickup-s", required_argument, NULL, O_PICKUP},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0}};
    *u = (unit_cmd){.bind_ip = "127.0.0.1", .units = 1};
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
    if (u->unit_id >= u->units) {
        char msg[96];
        snprintf(msg, sizeof msg, "--unit-id %" PRIu64 " must be below --units %" PRIu64,
                 u->unit_id, u->units);
        return unit_usage_error("%s", msg);
    }
    if (u->staging_set && u->uo.ssd_dir == NULL)
        return unit_usage_error("--staging needs --ssd-dir%s", "");
    if (u->uo.ssd_dir != NULL)
        u->uo.staging_bytes = u->staging_set ? u->staging : 64ull << 20;
    u->uo.unit_id = (uint32_t)u->unit_id;
    u->uo.n_units = (uint32_t)u->units;
    return UNIT_GO_ON;
}

/* Run the unit u describes until SIGINT or SIGTERM: the exit status. */
static int
unit_serve(unit_cmd *u)
{
    dp_unit_opts *uo = &u->uo;
    /* Every thread started from here on inherits this mask; sigwait takes them. */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);

    char prefix[32];
    snprintf(prefix, sizeof prefix, "unit %u", uo->unit_id);
    dp__log_set_prefix(prefix);

    int status = 1, rc;
    dp_unit_server *srv = NULL;
    char name[64], rnd[33], numa[128];
    /* NUMA first, so the endpoint's threads start on the unit's node too. */
    dp__unit_numa_apply(uo->numa, uo->unit_id, numa, sizeof numa);
    if ((rc = dp__random_hex_id(rnd, &u->d)) != 0)
        goto fail;
    snprintf(name, sizeof name, "unit%u-%.8s", uo->unit_id, rnd);
    dp_unit_server_opts so = {.bind_ip = u->bind_ip,
                              .port = (uint16_t)u->port,
                              .advertise = u->advertise,
                              .tick_s = 1.0};
    if ((rc = dp__unit_server_start(uo, name, &so, &srv, &u->d)) != 0)
        goto fail;
    /* The contract with launchers: this is the first line of stdout. */
    printf("%s\n", dp__unit_server_address(srv));
    fflush(stdout);
    char sz[32], bound[160] = "";
    if (strcmp(dp__unit_server_bound_address(srv), dp__unit_server_address(srv)) != 0)
        snprintf(bound, sizeof bound, " (bound to %s)",
                 dp__unit_server_bound_address(srv));
    DP_LOG_I(
        "serving %s%s: unit %u of %u, slab %s, endpoint %s, numa: %s, read_pin_s %.1f, "
        "alloc_lease_s %.1f",
        dp__unit_server_address(srv), bound, uo->unit_id, uo->n_units,
        dp__fmt_size(uo->slab_bytes, sz, sizeof sz), name,
        dp__unit_numa_desc(dp__unit_server_unit(srv)), uo->read_pin_s, uo->alloc_lease_s);
    if (uo->ssd_dir != NULL)
        DP_LOG_I("ssd tier: dir %s, IO area %s, pickup_s %.1f", uo->ssd_dir,
                 dp__fmt_size(uo->staging_bytes, sz, sizeof sz), uo->pickup_s);
    int sig = 0;
    while (sigwait(&sigs, &sig) != 0)
        ;
    DP_LOG_I("signal %d: stopping", sig);
    status = 0;
    goto out;
fail:
    fprintf(stderr, "dataplane unit: %s (%s)\n", dp_detail_msg(&u->d), dp_strerror(rc));
out:
    dp__unit_server_close(srv);
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
