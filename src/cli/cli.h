/*
 * Helpers shared by the `dataplane` subcommands (internal to src/cli): usage
 * and failure messages in the house form, and a connection to a running
 * cluster (its cluster file, a control client, request ids) for the commands
 * that talk to units (stats, scan, clear, put, get, bench).
 *
 * Threads: a dp__cli_conn belongs to one thread.
 */
#ifndef DP_CLI_CLI_H
#define DP_CLI_CLI_H

#include <limits.h>
#include <stdbool.h>
#include <stdint.h>

#include "client/cluster.h"
#include "common/common.h"
#include "ctl/ctl.h"
#include "wire/wire.h"

/* The subcommands (one function each, argv[0] is the subcommand's name). */
int dp__cmd_unit(int argc, char **argv);
int dp__cmd_up(int argc, char **argv);
int dp__cmd_stats(int argc, char **argv);
int dp__cmd_scan(int argc, char **argv);
int dp__cmd_clear(int argc, char **argv);
int dp__cmd_put(int argc, char **argv);
int dp__cmd_get(int argc, char **argv);
int dp__cmd_bench(int argc, char **argv);

/*
 * "dataplane <cmd>: <message>" and "Run 'dataplane <cmd> --help' for usage."
 * on stderr; returns 2 (the exit status of a usage error).
 */
int dp__cli_usage(const char *cmd, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* "dataplane <cmd>: <detail> (<strerror(rc)>)" on stderr; returns 1. */
int dp__cli_fail(const char *cmd, int rc, const dp_detail *d);

/* Default control-call timeout of the admin commands, seconds. */
#define DP_CLI_TIMEOUT_S 10.0

/* A running cluster as seen from a command. */
typedef struct dp__cli_conn {
    char path[PATH_MAX]; /* the cluster file */
    dp_cluster cl;
    dp_ctl_client *ctl;
    dp_wire_rid_gen rids;
    double timeout_s;
} dp__cli_conn;

/*
 * Locate (arg, else $DP_CLUSTER, else the default directory) and load the
 * cluster file, and create a control client. Errors of dp_cluster_locate and
 * dp_cluster_load (DP_ENOTFOUND says how to start a cluster), DP_ENOMEM.
 */
int dp__cli_connect(const char *arg, double timeout_s, dp__cli_conn *c, dp_detail *d);
void dp__cli_disconnect(dp__cli_conn *c);

/*
 * One request to unit i and its decoded reply (call dp_wire_reply_fini on rep
 * whatever the result; rb holds the bytes rep points into). An error reply
 * from the unit is returned as its code with the unit's words in d, prefixed
 * with the unit. q->rid is set here.
 */
int dp__cli_call(dp__cli_conn *c, uint32_t i, dp_wire_request *q, dp_wire_reply *rep,
                 dp_buf *rb, dp_detail *d);

/*
 * The same request to every unit at once (dp_ctl_call_many): reps[i], rbs[i]
 * and rcs[i]/dets[i] per unit (arrays of n_units; rbs zero-initialised by the
 * caller and freed with dp_buf_fini, reps finied by the caller). q_of(i, q,
 * ctx) fills unit i's request, or returns false to skip that unit (rcs[i] =
 * DP_OK, reps[i] zeroed with ok = false and op = DP_WIRE_OP_NONE).
 * Returns DP_OK if every unit answered with a result.
 */
typedef bool (*dp__cli_req_fn)(uint32_t i, dp_wire_request *q, void *ctx);
int dp__cli_call_all(dp__cli_conn *c, dp__cli_req_fn q_of, void *ctx, dp_wire_reply *reps,
                     dp_buf *rbs, int *rcs, dp_detail *dets);

/* Parse a cluster-relative unit index ("3") against the loaded cluster. */
int dp__cli_parse_unit(const dp__cli_conn *c, const char *s, uint32_t *out, dp_detail *d);

#endif
