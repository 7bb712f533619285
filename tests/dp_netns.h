/*
 * A multi-host topology on one machine, for fault tests: K "hosts", each a
 * network namespace with lo up and one address 10.213.<o>.<i+1>/24 on its
 * eth0, joined by a Linux bridge that lives in a "switch" namespace of its own
 * (host i's eth0 is a veth whose peer p<i> is a port of that bridge). Nothing
 * is created in the caller's namespace: no interface, route or firewall rule
 * of the machine is touched, and the addresses are reachable only from inside
 * the topology (every topology is its own island, so two topologies may even
 * share addresses).
 *
 * Namespaces are named "dpns-<pid>-<seq>-sw" and "dpns-<pid>-<seq>-h<i>"
 * (pid of the creating process, seq a per-process counter), so parallel test
 * programs never collide. Cleanup happens on every path:
 *   - dp_netns_destroy, which checks and reports every removal;
 *   - an atexit handler and a handler for fatal signals (SIGINT, SIGTERM,
 *     SIGHUP, SIGQUIT, SIGABRT, SIGSEGV, SIGBUS), installed only where the
 *     signal's disposition is still the default; both act only in the
 *     creating process, never in a forked child;
 *   - a guardian process (double-forked, own session) that removes the
 *     namespaces when the creator dies without destroying them, even by
 *     SIGKILL (a ctest timeout);
 *   - dp_netns_sweep (also run by dp_netns_create), which removes namespaces
 *     of this prefix whose creating pid is dead.
 *
 * Faults are applied inside host i's namespace, on its eth0: a blackhole
 * (iptables DROP of everything in and out), link down/up, random packet loss
 * (iptables statistic match). A blackholed or down host's own sends fail
 * locally (EPERM / no route) while its peers see silence, as when a host
 * drops off the network.
 *
 * Processes run inside a host with dp_netns_spawn: fork, setns(CLONE_NEWNET)
 * into the host, a private mount namespace with sysfs mounted again (so
 * /sys/class/net lists the host's interfaces, as UCX reads them), optionally
 * new IPC, PID and UTS namespaces (DP_NETNS_OWN_MACHINE: UCX's shared-memory
 * and cross-memory-attach transports then see another machine and traffic
 * goes over the topology's network), then exec. The child gets
 * PR_SET_PDEATHSIG SIGKILL. Its stdout goes to an anonymous in-memory file
 * that the caller reads line by line with a timeout, so a child that writes a
 * lot (or is never read again) never blocks; its stderr is the caller's.
 *
 * Errors: functions return 0 or a dp_err code and fill the optional
 * dp_detail with the failing command line, its exit status and its output.
 * DP_EUNSUPPORTED from dp_netns_create means the machine does not allow the
 * topology (not root, no `ip`, no network namespaces, veth or bridge, no
 * working iptables when asked for); the detail is the skip reason.
 *
 * Threads: one thread at a time per topology. Requires root.
 */
#ifndef DP_NETNS_H
#define DP_NETNS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "dataplane/err.h"

#define DP_NETNS_MAX_HOSTS 16
#define DP_NETNS_PREFIX "dpns-"

typedef struct dp_netns dp_netns;

/* dp_netns_create flags. */
#define DP_NETNS_IPTABLES (1u << 0) /* fail (DP_EUNSUPPORTED) unless iptables works */

/*
 * Build a topology of n_hosts (1..DP_NETNS_MAX_HOSTS) hosts. Sweeps stale
 * namespaces of dead creators first. On success *out is live until
 * dp_netns_destroy (or process exit). On failure everything made so far is
 * removed again. Errors: DP_EUNSUPPORTED (skip reason in d), DP_ESYS,
 * DP_EINVAL, DP_ENOMEM.
 */
int dp_netns_create(uint32_t n_hosts, unsigned flags, dp_netns **out, dp_detail *d);

/*
 * Stop every process spawned in the topology still running (SIGKILL), remove
 * the fault rules, the links and the namespaces, and check that each
 * namespace is gone. NULL allowed. Returns 0, or the first failure (d says
 * which step); everything else is still attempted.
 */
int dp_netns_destroy(dp_netns *n, dp_detail *d);

uint32_t dp_netns_n_hosts(const dp_netns *n);
/* Host i's address ("10.213.x.y"), its namespace's name; NULL if out of range. */
const char *dp_netns_ip(const dp_netns *n, uint32_t host);
const char *dp_netns_name(const dp_netns *n, uint32_t host);

/* Faults on host i's eth0. Each is idempotent (on twice adds one rule). */
int dp_netns_blackhole(dp_netns *n, uint32_t host, bool on, dp_detail *d);
int dp_netns_link(dp_netns *n, uint32_t host, bool up, dp_detail *d);
/* Drop each packet in and out with probability p (0..1); 0 removes the rule. */
int dp_netns_loss(dp_netns *n, uint32_t host, double p, dp_detail *d);

/* Host i's iptables rules (`iptables -S`, filter table) into out. */
int dp_netns_rules(dp_netns *n, uint32_t host, char *out, size_t cap, dp_detail *d);

/*
 * Run argv (argv[0] a path, or a name looked up in PATH) inside host i, or
 * in the caller's namespace when host is DP_NETNS_HERE (n may then be NULL);
 * out (NULL allowed) gets its stdout and stderr (the first 4 KiB). Returns 0 only when it
 * exited 0; otherwise DP_ESYS with the command line, status and output in d.
 */
#define DP_NETNS_HERE UINT32_MAX
int dp_netns_exec(dp_netns *n, uint32_t host, const char *const *argv, char *out,
                  size_t cap, dp_detail *d);

/* Remove namespaces of our prefix whose creator is dead; *removed (NULL ok). */
int dp_netns_sweep(int *removed, dp_detail *d);

/*
 * Names of the namespaces (of any topology) that process pid created and
 * that still exist, space-separated, into out (NULL allowed); returns how
 * many, or -1 if /run/netns cannot be read for another reason than not
 * existing.
 */
int dp_netns_leftovers(pid_t pid, char *out, size_t cap);

/* ---- processes inside a host ---- */

/* dp_netns_spawn flags. */
#define DP_NETNS_OWN_MACHINE (1u << 0) /* new IPC, PID and UTS namespaces too */
#define DP_NETNS_STDIN (1u << 1)       /* a pipe to the child's stdin */

/* A spawned process. Caller-owned storage, filled by dp_netns_spawn. */
typedef struct dp_netns_proc {
    pid_t pid;        /* as the caller sees it; -1 once reaped */
    int status;       /* once reaped: exit code, or -signal */
    int in_fd;        /* write end of its stdin (DP_NETNS_STDIN), else -1 */
    int out_fd;       /* the in-memory file holding its stdout */
    uint64_t out_off; /* how much of it readline consumed */
    dp_netns *n;
    int slot; /* in n's process table */
} dp_netns_proc;

/*
 * Start argv (argv[0] a path or a name in PATH) inside host i with flags.
 * Returns once the exec succeeded (a failure of any step before the exec,
 * setns, mount, unshare or the exec itself, comes back as DP_ESYS naming
 * it). The process is killed by dp_netns_destroy if still running.
 */
int dp_netns_spawn(dp_netns *n, uint32_t host, const char *const *argv, unsigned flags,
                   dp_netns_proc *p, dp_detail *d);

/*
 * The next line of p's stdout (without the newline) within timeout_s.
 * Errors: DP_ETIMEDOUT (no complete line yet), DP_ECLOSED (the process
 * exited and its output holds no further line; a last line without newline is
 * still returned first), DP_ETOOBIG (line longer than cap - 1: truncated, the
 * rest skipped).
 */
int dp_netns_readline(dp_netns_proc *p, char *line, size_t cap, double timeout_s,
                      dp_detail *d);

/* Write line plus a newline to p's stdin. Errors: DP_ECLOSED, DP_ESYS. */
int dp_netns_writeline(dp_netns_proc *p, const char *line, dp_detail *d);

/* writeline then readline: one command, one answer. */
int dp_netns_ask(dp_netns_proc *p, const char *cmd, char *answer, size_t cap,
                 double timeout_s, dp_detail *d);

/*
 * Close p's stdin, send sig (0: none), wait up to grace_s for it to exit,
 * then SIGKILL it and wait; then close its output. Returns its status (exit
 * code, or -signal); p->pid becomes -1 and a second stop returns the same
 * status. Call it before dp_netns_destroy: destroy kills and reaps what is
 * still running and closes its descriptors, after which p must not be used.
 */
int dp_netns_proc_stop(dp_netns_proc *p, int sig, double grace_s);

/* Whether p is still running (reaps it, setting p->status, if it is not). */
bool dp_netns_proc_alive(dp_netns_proc *p);

#endif
