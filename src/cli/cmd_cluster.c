/*
 * `dataplane cluster`: the registry's view of a cluster, for operators: each
 * unit's record (address, incarnation, pid and host, sizes, transports), the
 * time its lease has left, and whether it answers at its address now; ids
 * the cluster should have but no record names are listed as down, and
 * records that are not records are named with what is wrong with them.
 */
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "common/common.h"
#include "registry/registry.h"

static const char usage_cluster[] =
    "usage: dataplane cluster [--cluster etcd://HOST:PORT/NAME] [options]\n"
    "\n"
    "Show a registry's view of a cluster: per unit its state, address,\n"
    "incarnation, process and host, slab and SSD sizes, transports and the seconds\n"
    "its registration lease has left. State: up (registered and answering at its\n"
    "address), silent (registered, but it does not answer: it may have just died\n"
    "and its lease not yet run out), restarted (another incarnation answers there),\n"
    "down (no record). Exit status 0 when every unit is up, 1 otherwise.\n"
    "\n"
    "options:\n"
    "  --cluster URL    the registry (default: $DP_CLUSTER)\n"
    "  --timeout S      bound of each etcd call and each unit's answer (2)\n"
    "  -h, --help       this text\n";

int
dp__cmd_cluster(int argc, char **argv)
{
    static const struct option opts[] = {{"cluster", required_argument, NULL, 'c'},
                                         {"timeout", required_argument, NULL, 't'},
                                         {"help", no_argument, NULL, 'h'},
                                         {NULL, 0, NULL, 0}};
    const char *url = NULL;
    double timeout_s = 2;
    dp_detail d;
    dp_detail_clear(&d);
    int c;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 'c':
            url = optarg;
            break;
        case 't':
            if (dp__parse_seconds(optarg, &timeout_s, "--timeout", &d) != DP_OK ||
                !(timeout_s > 0))
                return dp__cli_usage("cluster",
                                     "--timeout must be a number of seconds > 0");
            break;
        case 'h':
            fputs(usage_cluster, stdout);
            return 0;
        default:
            return dp__cli_bad_option("cluster", argv[optind - 1]);
        }
    }
    if (optind < argc)
        return dp__cli_unexpected("cluster", argv[optind]);
    if (url == NULL || url[0] == '\0')
        url = getenv("DP_CLUSTER");
    if (url == NULL || !dp__reg_is_url(url))
        return dp__cli_usage("cluster",
                             "needs a registry: --cluster etcd://HOST:PORT/NAME (or "
                             "DP_CLUSTER); a cluster file's units are shown by "
                             "'dataplane stats'");
    dp__reg_url u;
    int rc = dp__reg_url_parse(url, &u, &d);
    if (rc != DP_OK)
        return dp__cli_usage("cluster", "%s", dp_detail_msg(&d));
    dp__reg_entry *es = NULL;
    size_t n = 0;
    if ((rc = dp__reg_list(&u, timeout_s, &es, &n, &d)) != DP_OK)
        return dp__cli_fail("cluster", rc, &d);

    /* N: what the valid records say (the first one's, disagreements named). */
    uint32_t n_units = 0;
    for (size_t i = 0; i < n; i++)
        if (es[i].valid && n_units == 0)
            n_units = es[i].r.n_units;
    printf("cluster %s in etcd %s: ", u.name, u.endpoints);
    if (n_units == 0)
        printf("no unit registered\n");
    else
        printf("%" PRIu32 " unit%s\n", n_units, n_units == 1 ? "" : "s");
    if (n == 0) {
        free(es);
        return 1;
    }
    printf("%-5s %-10s %-26s %-16s %-8s %-12s %-10s %-9s %-9s %s\n", "unit", "state",
           "address", "incarnation", "pid", "host", "slab", "ssd", "lease", "transports");
    bool all_up = n_units > 0;
    for (uint32_t id = 0; id < n_units; id++) {
        const dp__reg_entry *x = NULL;
        for (size_t i = 0; i < n && x == NULL; i++)
            if (es[i].valid && es[i].r.id == id)
                x = &es[i];
        if (x == NULL) {
            printf("%-5" PRIu32 " %-10s (no record: not started, or its lease ran out)\n",
                   id, "down");
            all_up = false;
            continue;
        }
        uint64_t inc = 0;
        char why[512];
        int prc = dp__cli_probe_unit(x->r.zmq, x->r.pubkey, NULL, timeout_s, &inc, why,
                                     sizeof why);
        const char *state = prc != DP_OK              ? "silent"
                            : inc != x->r.incarnation ? "restarted"
                                                      : "up";
        all_up = all_up && strcmp(state, "up") == 0;
        char slab[32], ssd[32], lease[24], hex[17];
        dp__fmt_size(x->r.slab_bytes, slab, sizeof slab);
        if (x->r.ssd_bytes > 0)
            dp__fmt_size(x->r.ssd_bytes, ssd, sizeof ssd);
        else
            snprintf(ssd, sizeof ssd, "-");
        if (x->ttl_left >= 0)
            snprintf(lease, sizeof lease, "%" PRId64 " s", x->ttl_left);
        else
            snprintf(lease, sizeof lease, x->lease == 0 ? "none" : "gone");
        snprintf(hex, sizeof hex, "%016" PRIx64, x->r.incarnation);
        printf("%-5" PRIu32 " %-10s %-26s %-16s %-8" PRId64 " %-12s %-10s %-9s %-9s %s\n",
               id, state, x->r.zmq, hex, x->r.pid, x->r.host[0] ? x->r.host : "?", slab,
               ssd, lease, x->r.transports[0] ? x->r.transports : "?");
        if (prc != DP_OK)
            printf("      %s\n", why);
    }
    for (size_t i = 0; i < n; i++) {
        if (!es[i].valid) {
            printf("bad   %s\n", es[i].why);
            all_up = false;
        } else if (es[i].r.n_units != n_units) {
            printf("bad   %s says the cluster has %" PRIu32 " units, not %" PRIu32 "\n",
                   es[i].key, es[i].r.n_units, n_units);
            all_up = false;
        }
    }
    free(es);
    return all_up ? 0 : 1;
}
