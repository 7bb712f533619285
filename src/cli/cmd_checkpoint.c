/*
 * dataplane save DIR / dataplane load DIR: checkpoint a running cluster into
 * a directory and load the current checkpoint of a directory back into a
 * cluster of the same number of units, or re-home it into another size
 * (client/checkpoint.h has the layout and the crash guarantees). Save and
 * load run through the library's control-only client of the cluster file's
 * units (dp_ckpt_save / dp_ckpt_load over it, no UCX) once each unit said who
 * it is; re-homing opens a full client (dp_ckpt_rehome). Progress lines go
 * to stderr, the summary to stdout.
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "dataplane/checkpoint.h"
#include "dataplane/client.h"

int dp__cmd_save(int argc, char **argv);
int dp__cmd_load(int argc, char **argv);

static const char usage_save[] =
    "usage: dataplane save [--cluster PATH] [--timeout S] [--keep N] [-q] DIR\n"
    "\n"
    "Save every unit of a running cluster into a new checkpoint in DIR: one\n"
    "shard per unit (written by the unit on its host: DIR must be the same path\n"
    "there) and a manifest. The checkpoint becomes DIR's current one only once\n"
    "every shard is on disk; a save that fails or dies leaves the previous one.\n"
    "\n"
    "options:\n"
    "  --cluster PATH   cluster file or its directory, or etcd://HOST:PORT/NAME\n"
    "                   (default: $DP_CLUSTER, then the default directory)\n"
    "  --timeout S      seconds allowed for all units to write (default 600);\n"
    "                   asking the units who they are waits at most min(S, 30)\n"
    "  --keep N         then remove DIR's older checkpoints but the N - 1 newest\n"
    "                   (N >= 1; default: keep all). A checkpoint newer than this\n"
    "                   one (another save running) is never removed.\n"
    "  -q, --quiet      no progress lines\n"
    "  -h, --help       this text\n";

static const char usage_load[] =
    "usage: dataplane load [--cluster PATH] [--timeout S] [-q] DIR\n"
    "\n"
    "Load DIR's current checkpoint into a running cluster. Every file is checked\n"
    "(size, CRC32C) before any unit is asked. With as many units as the saved\n"
    "cluster, each unit loads its own shard (checking it again, publishing\n"
    "nothing from a file that fails): RAM first on every unit, then the SSD\n"
    "tier for what did not fit. With another number of units, the checkpoint is\n"
    "re-homed: every live value is read here and put again, so rows land on\n"
    "gidx % the cluster's units (every byte moves through this command).\n"
    "\n"
    "options:\n"
    "  --cluster PATH   cluster file or its directory, or etcd://HOST:PORT/NAME\n"
    "  --timeout S      seconds allowed for each pass over the units (default 600);\n"
    "                   connecting to the units waits at most min(S, 30)\n"
    "  -q, --quiet      no progress lines\n"
    "  -h, --help       this text\n";

/*
 * How long asking the units who they are may take: the command's --timeout
 * bounds the whole save or load, but a dead unit should not take minutes to
 * report.
 */
static double
connect_budget(double timeout_s)
{
    return DP_MIN(timeout_s, DP_CLI_CONNECT_MAX_S);
}

static void
progress(void *ctx, const char *line)
{
    fprintf(stderr, "%s: %s\n", (const char *)ctx, line);
}

/*
 * The checkpoint has another number of units than the cluster c loaded: its
 * values are read here and put again through a client of c's cluster file
 * or registry (rows land on gidx % the cluster's units).
 */
static int
rehome(const char *cmd, const dp__cli_conn *c, const dp_ckpt_opts *o, const char *dir,
       const dp_ckpt_summary *peek, dp_ckpt_summary *s, dp_detail *d)
{
    uint32_t n_units = c->cl.n_units;
    if (o->progress != NULL)
        fprintf(stderr,
                "%s: %s was saved from %u units keeping %u copies of each row, the "
                "cluster has %u: re-homing every value through this client (slower "
                "than a load of the same shape)\n",
                cmd, peek->checkpoint, peek->n_units, peek->replicas, n_units);
    dp_client_opts co;
    dp_client_opts_init(&co);
    /* The library asks every unit who it is, within the command's budget. */
    co.connect_timeout_s = connect_budget(o->timeout_s);
    dp_client *cl = NULL;
    int rc = dp_client_open(c->path, &co, &cl, d);
    if (rc != DP_OK)
        return rc;
    rc = dp_ckpt_rehome(cl, dir, o, s, d);
    dp_client_close(cl);
    if (rc == DP_OK)
        printf("loaded %s: re-homed from %u units into %u, %llu blobs, %llu bytes of "
               "shards\n",
               s->checkpoint, s->n_units, n_units, (unsigned long long)s->loaded,
               (unsigned long long)s->bytes);
    return rc;
}

static int
run(const char *cmd, const char *usage, int argc, char **argv)
{
    static const struct option opts[] = {{"cluster", required_argument, NULL, 'c'},
                                         {"timeout", required_argument, NULL, 't'},
                                         {"keep", required_argument, NULL, 'k'},
                                         {"quiet", no_argument, NULL, 'q'},
                                         {"help", no_argument, NULL, 'h'},
                                         {NULL, 0, NULL, 0}};
    const char *cluster = NULL;
    dp_ckpt_opts o;
    dp_ckpt_opts_init(&o);
    o.progress = progress;
    o.progress_ctx = (void *)cmd;
    int ch;
    optind = 1;
    opterr = 0;
    while ((ch = getopt_long(argc, argv, "qh", opts, NULL)) != -1) {
        switch (ch) {
        case 'c':
            cluster = optarg;
            break;
        case 't': {
            char *end = NULL;
            o.timeout_s = strtod(optarg, &end);
            if (end == optarg || *end != '\0' || !(o.timeout_s > 0))
                return dp__cli_usage(cmd, "--timeout wants seconds > 0, not '%s'",
                                     optarg);
            break;
        }
        case 'k': {
            char *end = NULL;
            unsigned long long k = strtoull(optarg, &end, 10);
            if (strcmp(cmd, "save") != 0)
                return dp__cli_usage(cmd, "--keep is an option of save");
            if (end == optarg || *end != '\0' || optarg[0] == '-' || k < 1 || k > 1000000)
                return dp__cli_usage(cmd, "--keep wants a count >= 1, not '%s'", optarg);
            o.keep = (uint32_t)k;
            break;
        }
        case 'q':
            o.progress = NULL;
            break;
        case 'h':
            fputs(usage, stdout);
            return 0;
        default:
            return dp__cli_usage(cmd, "unknown option '%s'", argv[optind - 1]);
        }
    }
    if (optind + 1 != argc)
        return dp__cli_usage(cmd, "one directory, please (got %d arguments)",
                             argc - optind);
    dp_detail d;
    dp_detail_clear(&d);
    dp__cli_conn c;
    /*
     * The file first, no unit yet: a re-homing load connects through the
     * client library, which asks the units itself. Everything else asks every
     * unit who it is before a shard is written or loaded, so no unit's shard
     * is saved or loaded as another's.
     */
    int rc = dp__cli_connect(cluster, o.timeout_s, connect_budget(o.timeout_s),
                             DP__CLI_NO_CHECK, &c, &d);
    if (rc != DP_OK)
        return dp__cli_fail(cmd, rc, &d);
    dp_ckpt_summary s;
    if (strcmp(cmd, "save") == 0) {
        rc = dp__cli_check_units(&c, -1, 0, &d);
        if (rc == DP_OK)
            rc = dp_ckpt_save(c.client, argv[optind], &o, &s, &d);
        if (rc == DP_OK)
            printf("saved %s: %u units, %llu blobs, %llu bytes\n", s.checkpoint,
                   s.n_units, (unsigned long long)s.blobs, (unsigned long long)s.bytes);
    } else {
        dp_ckpt_summary peek;
        rc = dp_ckpt_peek(argv[optind], &peek, &d);
        bool same = rc == DP_OK && peek.n_units == c.cl.n_units;
        if (same) /* and as many copies of each row: the units say how many */
            rc = dp__cli_check_units(&c, -1, 0, &d);
        /* A one-copy checkpoint loads into any replicas; one that kept every
         * copy into the same number only. */
        if (rc == DP_OK && (!same || (peek.copies != 1 &&
                                      peek.replicas != dp_client_replicas(c.client)))) {
            rc = rehome(cmd, &c, &o, argv[optind], &peek, &s, &d);
        } else if (rc == DP_OK) {
            rc = dp_ckpt_load(c.client, argv[optind], &o, &s, &d);
            uint32_t r = dp_client_replicas(c.client);
            if (rc == DP_OK)
                printf("loaded %s: %u units, %u cop%s of each row, %llu blobs (%llu on "
                       "SSD), %llu bytes of shards\n",
                       s.checkpoint, s.n_units, r, r == 1 ? "y" : "ies",
                       (unsigned long long)s.loaded, (unsigned long long)s.spilled,
                       (unsigned long long)s.bytes);
        }
    }
    dp__cli_disconnect(&c);
    if (rc != DP_OK)
        return dp__cli_fail(cmd, rc, &d);
    return 0;
}

int
dp__cmd_save(int argc, char **argv)
{
    return run("save", usage_save, argc, argv);
}

int
dp__cmd_load(int argc, char **argv)
{
    return run("load", usage_load, argc, argv);
}
