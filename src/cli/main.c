/*
 * The `dataplane` command: one binary, one subcommand per task. Each
 * subcommand parses its own options, answers --help, and reports errors as one
 * line that says what was wrong and what to do, with exit status 2 for usage
 * errors and 1 for failures.
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "common/common.h"
#include "dataplane/version.h"
#include "xfer/policy.h"

#if defined(__SANITIZE_ADDRESS__)
/*
 * Sanitizer builds: UCX's own allocations are not ours to report (the tests'
 * tests/lsan.supp says the same). A stopping unit leaves its UCX worker to the
 * exit (dp__unit_server_close_at_exit), and UCX keeps pointers to some of its
 * objects only in shared memory the leak checker does not scan.
 */
const char *__lsan_default_suppressions(void);
const char *
__lsan_default_suppressions(void)
{
    return "leak:libucs.so\nleak:libuct.so\nleak:libucp.so\n";
}
#endif

int dp__cmd_unit(int argc, char **argv); /* cmd_unit.c */
int dp__cmd_save(int argc, char **argv); /* cmd_checkpoint.c */
int dp__cmd_load(int argc, char **argv); /* cmd_checkpoint.c */

static const char usage_main[] =
    "usage: dataplane <command> [options]\n"
    "\n"
    "commands:\n"
    "  policy     check that UCX is configured to use RDMA only (never TCP)\n"
    "  unit       run one storage unit (slab + control server) in the foreground\n"
    "  up         start a cluster of units on this machine (foreground, Ctrl-C stops)\n"
    "  stats      every unit's counters of a running cluster, as a table\n"
    "  cluster    a registry's view of a cluster: units, addresses, leases, up/down\n"
    "  keygen     a CURVE key pair for authenticating the control plane\n"
    "  top        a live view of a running cluster: ops/s, GB/s, fill, pins, SSD tier\n"
    "  scan       one unit's blob table\n"
    "  clear      drop rows from a running cluster\n"
    "  put        store one value (a file) as a row's field\n"
    "  get        fetch one value by key into a file or stdout\n"
    "  bench      put/get/clear batches shaped like RL rollouts: GB/s, latency\n"
    "  save       checkpoint a running cluster into a directory\n"
    "  load       load a directory's checkpoint into a running cluster\n"
    "  version    print the version\n"
    "  help       this text\n"
    "\n"
    "Run 'dataplane <command> --help' for a command's options.\n"
    "\n"
    "Commands that talk to a cluster (all but unit, up, keygen, policy) also take\n"
    "--curve-secret FILE: this client's CURVE secret key for units that require\n"
    "one (as DP_CURVE_SECRET; see 'dataplane keygen --help').\n";

static const char usage_policy[] =
    "usage: dataplane policy [--tls LIST] [--net-devices LIST]\n"
    "\n"
    "Check the RDMA-only transport policy: UCX_TLS must name at least one RDMA\n"
    "transport (rc, dc, ud, ib...) and otherwise only same-host helpers (self, sm,\n"
    "cma...), never tcp or all, or be an exclusion list (^...) naming tcp;\n"
    "UCX_NET_DEVICES, if set, must name only RDMA ports such as mlx5_0:1.\n"
    "\n"
    "By default the values come from the environment; the options check the given\n"
    "values instead. Exit status: 0 allowed, 1 refused, 2 usage error.\n"
    "\n"
    "options:\n"
    "  --tls LIST           check this UCX_TLS value instead of the environment's\n"
    "  --net-devices LIST   check this UCX_NET_DEVICES value\n"
    "  -h, --help           this text\n";

static int
usage_error(const char *cmd, const char *fmt, const char *arg)
{
    fprintf(stderr, "dataplane %s: ", cmd);
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\nRun 'dataplane %s --help' for usage.\n", cmd);
    return 2;
}

static int
cmd_policy(int argc, char **argv)
{
    static const struct option opts[] = {{"tls", required_argument, NULL, 't'},
                                         {"net-devices", required_argument, NULL, 'n'},
                                         {"help", no_argument, NULL, 'h'},
                                         {NULL, 0, NULL, 0}};
    const char *tls = getenv("UCX_TLS");
    const char *dev = getenv("UCX_NET_DEVICES");
    int c;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 't':
            tls = optarg;
            break;
        case 'n':
            dev = optarg;
            break;
        case 'h':
            fputs(usage_policy, stdout);
            return 0;
        default:
            return usage_error("policy", "unknown option '%s'", argv[optind - 1]);
        }
    }
    if (optind < argc)
        return usage_error("policy", "unexpected argument '%s'", argv[optind]);
    char desc[512];
    int rc = dp__policy_check_rdma_only_values(tls, dev, desc, sizeof desc, NULL);
    if (rc == DP_OK) {
        printf("allowed: %s\n", desc);
        return 0;
    }
    printf("refused: %s\n", desc);
    return 1;
}

/*
 * A client command's --curve-secret FILE (or --curve-secret=FILE): taken out
 * of argv into DP_CURVE_SECRET, which the library reads. Returns argc.
 */
static int
take_curve_secret(int argc, char **argv)
{
    int k = 1;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--") == 0) {
            while (i < argc)
                argv[k++] = argv[i++];
            break;
        }
        if (strcmp(argv[i], "--curve-secret") == 0 && i + 1 < argc) {
            setenv("DP_CURVE_SECRET", argv[++i], 1);
            continue;
        }
        if (strncmp(argv[i], "--curve-secret=", 15) == 0) {
            setenv("DP_CURVE_SECRET", argv[i] + 15, 1);
            continue;
        }
        argv[k++] = argv[i];
    }
    argv[k] = NULL;
    return k;
}

int
main(int argc, char **argv)
{
    /*
     * Launchers read what commands print on stdout (a unit's address on its
     * first line, a value from get, bench's RESULT line): library logs go to
     * stderr only, UCX's included.
     */
    dp__cli_guard_stdout();
    if (argc < 2) {
        fputs(usage_main, stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "help") == 0 || strcmp(cmd, "--help") == 0 ||
        strcmp(cmd, "-h") == 0) {
        fputs(usage_main, stdout);
        return 0;
    }
    if (strcmp(cmd, "version") == 0 || strcmp(cmd, "--version") == 0) {
        printf("dataplane %s\n", DP_VERSION_STRING);
        return 0;
    }
    if (strcmp(cmd, "policy") == 0)
        return cmd_policy(argc - 1, argv + 1);
    /* unit and up take --curve-secret as the unit's key; the rest as the client's. */
    if (strcmp(cmd, "unit") != 0 && strcmp(cmd, "up") != 0 && strcmp(cmd, "keygen") != 0)
        argc = 1 + take_curve_secret(argc - 1, argv + 1);
    if (strcmp(cmd, "unit") == 0)
        return dp__cmd_unit(argc - 1, argv + 1);
    if (strcmp(cmd, "up") == 0)
        return dp__cmd_up(argc - 1, argv + 1);
    if (strcmp(cmd, "stats") == 0)
        return dp__cmd_stats(argc - 1, argv + 1);
    if (strcmp(cmd, "keygen") == 0)
        return dp__cmd_keygen(argc - 1, argv + 1);
    if (strcmp(cmd, "top") == 0)
        return dp__cmd_top(argc - 1, argv + 1);
    if (strcmp(cmd, "cluster") == 0)
        return dp__cmd_cluster(argc - 1, argv + 1);
    if (strcmp(cmd, "scan") == 0)
        return dp__cmd_scan(argc - 1, argv + 1);
    if (strcmp(cmd, "clear") == 0)
        return dp__cmd_clear(argc - 1, argv + 1);
    if (strcmp(cmd, "put") == 0)
        return dp__cmd_put(argc - 1, argv + 1);
    if (strcmp(cmd, "get") == 0)
        return dp__cmd_get(argc - 1, argv + 1);
    if (strcmp(cmd, "bench") == 0)
        return dp__cmd_bench(argc - 1, argv + 1);
    if (strcmp(cmd, "save") == 0)
        return dp__cmd_save(argc - 1, argv + 1);
    if (strcmp(cmd, "load") == 0)
        return dp__cmd_load(argc - 1, argv + 1);
    fprintf(stderr, "dataplane: unknown command '%s'\n\n%s", cmd, usage_main);
    return 2;
}
