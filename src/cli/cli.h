/*
 * Helpers shared by the `dataplane` subcommands (internal to src/cli): usage
 * and failure messages in the house form, and a connection to a running
 * cluster (its cluster file and the library's control-only client of its
 * units, which checks that every unit is the one the file says) for the
 * commands that talk to units over the control plane only (stats, scan,
 * clear, save, load, up): no UCX.
 *
 * Threads: a dp__cli_conn belongs to one thread.
 */
#ifndef DP_CLI_CLI_H
#define DP_CLI_CLI_H

#include <limits.h>
#include <stdbool.h>
#include <stdint.h>

#include "cluster/cluster.h"
#include "client/fanout.h"
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
int dp__cmd_cluster(int argc, char **argv);
int dp__cmd_top(int argc, char **argv);
int dp__cmd_keygen(int argc, char **argv);

/*
 * "dataplane <cmd>: <message>" and "Run 'dataplane <cmd> --help' for usage."
 * on stderr; returns 2 (the exit status of a usage error).
 */
int dp__cli_usage(const char *cmd, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/*
 * The usage errors of every command's getopt_long loop (opterr 0):
 * dp__cli_bad_option for the word it refused ("unknown option or missing
 * value '<word>'", word = argv[optind - 1]), dp__cli_unexpected for an
 * argument left over ("unexpected argument '<arg>'"). Both return 2.
 */
int dp__cli_bad_option(const char *cmd, const char *word);
int dp__cli_unexpected(const char *cmd, const char *arg);

/*
 * A timeout option's value (opt names it, e.g. "--timeout-s"): seconds
 * (dp__parse_seconds), and more than 0 ("<opt> must be > 0"). DP_EINVAL with
 * what is wrong.
 */
int dp__cli_parse_timeout(const char *arg, const char *opt, double *out, dp_detail *d);

/* "dataplane <cmd>: <detail> (<strerror(rc)>)" on stderr; returns 1. */
int dp__cli_fail(const char *cmd, int rc, const dp_detail *d);

/* A data client of cluster (NULL: $DP_CLUSTER, else the default directory)
 * whose connecting and calls each get timeout_s; 0, or 1 after saying why
 * (dp__cli_fail) with *out NULL. */
int dp__cli_open_client(const char *cmd, const char *cluster, double timeout_s,
                        dp_client **out);

/* One line on stdout: how cl's data path reaches each unit
 * ("lanes: unit 0: shm one-sided (posix,sysv); unit 1: ..."). */
void dp__cli_print_lanes(dp_client *cl);

/* Default control-call timeout of the admin commands, seconds. */
#define DP_CLI_TIMEOUT_S 10.0

/*
 * The longest save and load wait for the units to say who they are, seconds:
 * their --timeout (600) bounds writing shards, not connecting.
 */
#define DP_CLI_CONNECT_MAX_S 30.0

/* What a command knows of one unit of its cluster file. */
typedef enum dp__cli_unit_state {
    DP__CLI_UNCHECKED = 0, /* not asked yet: no request but info may go to it */
    DP__CLI_CHECKED,       /* it said it is unit i of n, as the file says */
    DP__CLI_DOWN,          /* it did not answer info (rc and det say why) */
} dp__cli_unit_state;

typedef struct dp__cli_unit {
    dp__cli_unit_state state;
    int rc; /* DP__CLI_DOWN: why */
    dp_detail det;
    char agent[DP_CLUSTER_ADDR_MAX]; /* its endpoint name, from its info */
    uint64_t incarnation;            /* its process's, from its info */
} dp__cli_unit;

/*
 * A running cluster as seen from a command. Requests go through client, the
 * library's control-only client of cl's units (client/fanout.h: no transfer
 * endpoint, so no UCX), opened by dp__cli_connect or by the first
 * dp__cli_check_units of a conn filled in by hand. ctl and rids are a
 * caller's own, for calls of its own (closed by dp__cli_disconnect when
 * set); nothing here uses them.
 */
typedef struct dp__cli_conn {
    char path[PATH_MAX]; /* the cluster file, or the registry's URL */
    dp__cluster cl;
    dp__ctl_client *ctl;
    dp__wire_rid_gen rids;
    double timeout_s;         /* each control call */
    double connect_timeout_s; /* asking the units who they are */
    dp__cli_unit *units;      /* n_units: what the last check found */
    dp_client *client;
} dp__cli_conn;

/*
 * Flags of dp__cli_connect and dp__cli_check_units. NO_CHECK: load the
 * cluster file only, ask no unit yet. ALLOW_DOWN: a unit that does not answer
 * is marked down (calls to it then fail with why) instead of an error.
 */
#define DP__CLI_NO_CHECK 1u
#define DP__CLI_ALLOW_DOWN 2u

/*
 * Locate (arg, else $DP_CLUSTER, else the default directory) and load the
 * cluster file, or read the registry arg names (etcd://...: waiting up to
 * connect_timeout_s for every unit to register; dp__reg_resolve), open the
 * control-only client of its units, and (unless DP__CLI_NO_CHECK) ask every unit who it
 * is (dp__cli_check_units, within connect_timeout_s). Control calls then wait timeout_s.
 * Errors of dp__cluster_locate and dp__cluster_load (DP_ENOTFOUND says how to start a
 * cluster), of dp__cli_check_units, DP_ENOMEM. On an error nothing is left
 * to disconnect.
 */
int dp__cli_connect(const char *arg, double timeout_s, double connect_timeout_s,
                    unsigned flags, dp__cli_conn *c, dp_detail *d);
void dp__cli_disconnect(dp__cli_conn *c);

/*
 * Ask unit only (or every unit: only < 0) for its info, all at once, and
 * check that unit i says it is unit i of n as the cluster file does: a unit
 * listed in the wrong order, or a unit of another cluster, would be cleared,
 * saved or loaded as if it were another (dp__client_check_units; c->units
 * get what it found). Nothing but info is sent to a unit before this
 * succeeded for it: the client's calls (dp__client_call_all,
 * dp__client_clear_units) refuse unchecked units and give a unit marked
 * down its reason. Errors: DP_EPROTO (a unit says otherwise: d names the
 * unit, its address, what it said and what the file says), the error of a
 * unit that does not answer (with DP__CLI_ALLOW_DOWN it is marked down
 * instead), an error reply of a unit.
 */
int dp__cli_check_units(dp__cli_conn *c, int64_t only, unsigned flags, dp_detail *d);

/*
 * Ask the unit at addr for its info within timeout_s (over CURVE when
 * server_pub is a key: with client_secret, a Z85 secret key, or NULL for the
 * file $DP_CURVE_SECRET names): DP_OK with the
 * incarnation that answered, else why (cap bytes) says what happened (the
 * error of the call: DP_ETRANSFER / DP_ETIMEDOUT for a unit that is down).
 */
int dp__cli_probe_unit(const char *addr, const char *server_pub,
                       const char *client_secret, double timeout_s, uint64_t *incarnation,
                       char *why, size_t cap);

/* Parse a cluster-relative unit index ("3") against the loaded cluster. */
int dp__cli_parse_unit(const dp__cli_conn *c, const char *s, uint32_t *out, dp_detail *d);

/*
 * Check an --advertise value: a dotted IPv4 address, a bracketed IPv6 address
 * ("[fe80::1]") or a host name (letters, digits, '-', '.', '_'), not a
 * wildcard, short enough for "tcp://HOST:65535" to fit a cluster file.
 * DP_EINVAL with what is wrong.
 */
int dp__cli_check_advertise(const char *host, dp_detail *d);

/*
 * Keep library logs off stdout: UCX writes its log to the stdout it saw when
 * it was loaded, before main. This points file descriptor 1 at stderr and
 * stdout at a new stream on the original standard output, so what the
 * commands print (addresses, values, tables) is all that reaches it. Call
 * first thing in main, before any thread exists. Does nothing if stdout or
 * stderr is closed.
 */
void dp__cli_guard_stdout(void);

/*
 * A unit's repair (unit_repair.c; docs/design.md, "Repair"): a thread that
 * opens the cluster at `from` (a cluster file, registry URL or addresses) and,
 * when `initial` (u created with opts.repair), fills unit unit_id from its
 * peers at most `rate` bytes a second, then ends the unit's repair; then,
 * every `every_s` seconds (0: never), runs a pass the same way, which copies
 * only what the peers hold at a higher version. Stop joins it (at the end of
 * the page it is on).
 */
typedef struct dp__unit_repairer dp__unit_repairer;
struct dp__unit;
int dp__unit_repair_start(struct dp__unit *u, uint32_t unit_id, const char *from,
                          double rate, bool initial, double every_s,
                          dp__unit_repairer **out, dp_detail *d);
void dp__unit_repair_stop(dp__unit_repairer *r);

/*
 * Open the cluster at from as a unit's repair and lease threads find it: a
 * cluster file or directory, a registry URL, or the units' addresses in unit
 * order, comma-separated ("tcp://a:1,tcp://b:2": what a launcher that knows
 * them passes, e.g. the Ray actors). ctl_only: the addresses and the control
 * transport only (no data path, no unit asked anything yet; a registry's
 * records followed), what the lease thread needs.
 */
struct dp_client;
struct dp_client_opts;
int dp__cli_open_cluster(const char *from, const struct dp_client_opts *co, bool ctl_only,
                         struct dp_client **c, dp_detail *d);

/*
 * A unit's lease thread (unit_lease.c; docs/design.md, "Leases"): every
 * lease_s / 4 it asks every other unit of the cluster at `from` for a read
 * lease and hands the answers to u. Stop joins it.
 */
typedef struct dp__unit_leaser dp__unit_leaser;
int dp__unit_lease_start(struct dp__unit *u, uint32_t unit_id, const char *from,
                         double lease_s, dp__unit_leaser **out, dp_detail *d);
void dp__unit_lease_stop(dp__unit_leaser *l);

#endif
