/*
 * Supervision of the unit processes `dataplane up` runs (internal to
 * src/cli): starting each one (this binary re-executed with the arguments
 * up builds), reading its address from the first line of its stdout,
 * collecting and forwarding its output, watching for signals and deaths,
 * and stopping every unit with a grace period.
 *
 * Messages go to up's stdout and stderr in up's words ("dataplane up: ...").
 *
 * Threads: a dp__sup belongs to one thread, the one that blocked the signals
 * (dp__sup_block_signals) before any other thread or child existed.
 */
#ifndef DP_CLI_SUPERVISE_H
#define DP_CLI_SUPERVISE_H

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "cluster/cluster.h"
#include "common/common.h"

/* Stderr lines kept per unit (shown when it fails to start), and line length. */
#define DP__SUP_TAIL_LINES 20
#define DP__SUP_LINE_MAX 1024

/* One unit process. */
typedef struct dp__sup_unit {
    uint32_t id;
    pid_t pid;
    int out_fd, err_fd; /* read ends; -1 once closed */
    char addr[DP_CLUSTER_ADDR_MAX];
    char agent[DP_CLUSTER_ADDR_MAX]; /* from its info (the caller fills it) */
    uint64_t incarnation;            /* from its info (the caller fills it) */
    char out_line[DP__SUP_LINE_MAX];
    size_t out_len;
    char err_line[DP__SUP_LINE_MAX];
    size_t err_len;
    char tail[DP__SUP_TAIL_LINES][DP__SUP_LINE_MAX];
    unsigned tail_n; /* lines seen (the ring holds the last DP__SUP_TAIL_LINES) */
    bool started;    /* its address was read */
    bool exited;
    bool dead_pending; /* exited while running, not yet reported by dp__sup_watch */
    int status;        /* waitpid status once exited */
} dp__sup_unit;

/* Every unit of one up, and the signals that reach it. */
typedef struct dp__sup {
    dp__sup_unit *u;
    uint32_t n;
    int sfd;           /* signalfd; -1 if none */
    bool forward;      /* forward unit output (after the start) */
    bool stopping;     /* a stop was requested */
    int stop_signal;   /* the signal that asked for it */
    char pubkey[41];   /* the units' CURVE public key ("": none), for up's own calls */
    uint32_t replicas; /* copies of each row (the cluster file says so when > 1) */
} dp__sup;

/*
 * Block INT, TERM, HUP and CHLD (into *sigs, for dp__sup_open's signalfd),
 * take INT, TERM and HUP back to their default action even if they were
 * ignored, and ignore PIPE. Call before any thread or child exists, so every
 * thread inherits the mask.
 */
void dp__sup_block_signals(sigset_t *sigs);

/* A dp__sup with no units and no signalfd: dp__sup_close is safe on it. */
void dp__sup_init(dp__sup *s);

/*
 * Open the signalfd for sigs and make room for n units (none started yet;
 * every fd -1). Errors: DP_ESYS ("signalfd"), DP_ENOMEM ("out of memory").
 */
int dp__sup_open(dp__sup *s, uint32_t n, const sigset_t *sigs, dp_detail *d);

/*
 * Start unit i: fork, and in the child exec /proc/self/exe with args
 * (NULL-terminated; args[0] is its name), stdin on /dev/null, stdout and
 * stderr on pipes read here, in a process group of its own, with
 * PR_SET_PDEATHSIG SIGTERM (it stops if up dies). Errors: DP_ESYS ("pipe for
 * unit i", "fork unit i").
 */
int dp__sup_spawn(dp__sup *s, uint32_t i, const char *const *args, dp_detail *d);

/*
 * Wait until every unit printed its address, or end (dp__now_s clock)
 * passed, a unit died, or INT/TERM/HUP came. True when every unit started;
 * otherwise the reason was printed (with the unit's stderr tail), and for a
 * signal stopping and stop_signal are set.
 */
bool dp__sup_wait_started(dp__sup *s, double end, double start_timeout_s);

/*
 * Print what each unit logged while starting, once and in unit order, then
 * forward their output live (stderr lines as they are, stdout lines
 * prefixed with the unit).
 */
void dp__sup_start_forwarding(dp__sup *s);

/*
 * Forward output until INT/TERM/HUP (stopping and stop_signal set, said on
 * stdout; returns NULL) or a unit dies (said on stderr, with its exit status
 * or signal; returns it). Units started again keep being watched.
 */
dp__sup_unit *dp__sup_watch(dp__sup *s);

/*
 * Make a unit that exited startable again (dp__sup_spawn): its pipes closed,
 * its state cleared; its id and last address stay.
 */
void dp__sup_reset(dp__sup_unit *u);

/*
 * Stop every running unit: SIGTERM, wait up to grace_s, SIGKILL the rest. A
 * second INT/TERM while waiting skips the grace. Returns false if a unit had
 * to be killed or did not stop cleanly.
 */
bool dp__sup_stop_all(dp__sup *s, double grace_s);

/* Close every pipe and the signalfd and free the units. */
void dp__sup_close(dp__sup *s);

#endif
