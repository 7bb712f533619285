/*
 * One request per unit: the layer every "ask each unit" path goes through
 * (internal to the client library and the CLI; not installed). A client's
 * info at open and at re-bind, its clear and stats, a checkpoint's
 * save_shard and load_shard passes, and the CLI's control-only commands all
 * encode one request per unit here, send them all before waiting for any
 * (dp__ctl_call_many), wait under one deadline, decode each reply for its op
 * and get a report per unit: a code, a detail naming the unit's index and
 * address, and the decoded reply. Where asked, it checks who answered: that
 * unit i says it is unit i of n (an info reply), and that the reply came
 * from the process (incarnation) the request was meant for.
 *
 * put and get send in phases of their own (a commit leaves the moment its
 * WRITE is done): they use the same per-unit scratch through
 * dp__fanout_place and decode through dp__fanout_reply, and keep their own
 * per-op handling of each answer.
 *
 * Also here: rows grouped by the unit that owns them (dp__groups), and the
 * client's control-only mode (a dp_client without a transfer endpoint, for
 * the CLI's commands that need no UCX).
 *
 * Threads: a dp__fanout or dp__groups belongs to one thread at a time (a
 * client's own fanout is used under its mutex).
 */
#ifndef DP_CLIENT_FANOUT_H
#define DP_CLIENT_FANOUT_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cluster/cluster.h"
#include "common/common.h"
#include "ctl/ctl.h"
#include "dataplane/client.h"
#include "wire/wire.h"

/* ---- one unit's step ---- */

/*
 * One unit's part of an operation: the record every per-unit path of the
 * client is built on (put's parts, get's rounds, and through the fanout
 * info, clear, stats and checkpoints): which unit, how far its part got,
 * and, once it failed, why. Each path embeds one (as `st`) beside what only
 * it needs, so a part fails (dp__step_fail) and is read back the same way
 * everywhere; with replicas a row's step on each of its units is one more
 * record of the same kind.
 */
typedef struct dp__step {
    uint32_t u;    /* the unit's index in the cluster */
    int state;     /* how far the part got: the operation's own phases */
    int rc;        /* DP_OK, or why the part failed (det) */
    dp_detail det; /* rc != 0: the failure (the fanout's names the unit first) */
} dp__step;

/* Fail step s with code rc and a message (state unchanged). Returns rc. */
int dp__step_fail(dp__step *s, int rc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
int dp__step_vfail(dp__step *s, int rc, const char *fmt, va_list ap);
/* True once s failed. */
static inline bool
dp__step_failed(const dp__step *s)
{
    return s->rc != DP_OK;
}

/* ---- the fanout ---- */

/* One unit of a fanout: its request, then its outcome. */
typedef struct dp__fanout_unit {
    /* The request (dp__fanout_add / _place): */
    const char *addr;     /* its control address (borrowed) */
    dp__wire_op op;       /* DP_WIRE_OP_NONE: nothing was asked of it */
    uint64_t incarnation; /* the process it is meant for; 0: any */
    dp__buf req;
    char rid[DP_WIRE_RID_MAX];
    /*
     * The outcome (dp__fanout_run): st.u the unit, st.rc DP_OK when rep holds
     * its result, else st.det "unit U (ADDR)...: why" (the fanout's reports
     * name the unit first; st.state unused).
     */
    dp__step st;
    size_t why;     /* where the cause starts in st.det.msg (after the unit) */
    bool answered;  /* a reply came, whatever it said */
    bool restarted; /* it came from another process than incarnation */
    bool misplaced; /* an info reply naming another unit or cluster size */
    bool decoded;   /* rep holds a decoded reply (finished by reset) */
    dp__wire_reply rep;
} dp__fanout_unit;

/*
 * Per-unit scratch for requests to n units, reused batch after batch
 * (dp__fanout_reset): one request buffer per unit and n slots of
 * dp__ctl_item, the requests of one batch side by side as dp__ctl_call_many
 * wants them.
 */
typedef struct dp__fanout {
    uint32_t n;          /* units */
    dp__fanout_unit *u;  /* n: by unit index */
    dp__ctl_item *items; /* n: slot k's request, reply bytes and transport outcome */
    uint32_t *slot_unit; /* n: the unit of slot k */
    uint32_t n_slots;    /* slots filled by dp__fanout_add since the last reset */
} dp__fanout;

/* Checks of dp__fanout_run (flags of dp__fanout_opts). */
#define DP__FANOUT_IDENTITY 1u     /* an info reply must say "unit u of n_units" */
#define DP__FANOUT_SAME_PROCESS 2u /* a reply from another incarnation fails */

/* How dp__fanout_run checks replies and words its reports. NULL: defaults. */
typedef struct dp__fanout_opts {
    unsigned flags;
    uint32_t n_units;           /* IDENTITY: the cluster's size (0: the fanout's n) */
    const char *listed_by;      /* IDENTITY: whose list it contradicts ("the cluster") */
    const char *misplaced_hint; /* appended to an IDENTITY failure ("") */
    const char *silence_hint;   /* appended to "did not answer OP within S s" ("") */
    const char *cluster_id;     /* IDENTITY: the id every unit must report (NULL: any) */
} dp__fanout_opts;

/*
 * Scratch for n units (n >= 1). On an error f is left empty and safe to
 * finish. DP_ENOMEM.
 */
int dp__fanout_init(dp__fanout *f, uint32_t n, dp_detail *d);
/* Free everything; f may be zeroed or half-built. */
void dp__fanout_fini(dp__fanout *f);
/* Forget the last batch (decoded replies are finished): nothing asked, no slots. */
void dp__fanout_reset(dp__fanout *f);

/*
 * Encode q for unit u (its rid drawn from rids; addr borrowed until the
 * batch is done) into the next slot; incarnation is the process the request
 * is meant for (0: any), checked by dp__fanout_run. A unit is asked at most
 * once per batch (DP_EINVAL otherwise). On an encoding error the unit's
 * outcome says so and no slot is used. Returns the unit's rc.
 */
int dp__fanout_add(dp__fanout *f, dp__wire_rid_gen *rids, uint32_t u, const char *addr,
                   uint64_t incarnation, dp__wire_request *q);

/*
 * For callers that send each request themselves (put, get): encode q for
 * unit u into its request buffer and point items[slot] at it (reply emptied,
 * rc 0), outside the slots dp__fanout_add counts. Errors of
 * dp__wire_request_encode, into d naming the unit and the op.
 */
int dp__fanout_place(dp__fanout *f, dp__wire_rid_gen *rids, size_t slot, uint32_t u,
                     const char *addr, dp__wire_request *q, dp_detail *d);

/*
 * Send every slot's request at once and wait for the replies under one
 * deadline of timeout_s; then, per unit asked: the transport's outcome (a
 * unit silent past the deadline: "unit U (ADDR) did not answer OP within S
 * s"), the reply decoded for its op, an error reply as its code with the
 * unit's words, and the checks o asks for. Returns the first failure in unit
 * order (dp__fanout_first has its detail), DP_OK when every unit asked
 * answered with a result.
 */
int dp__fanout_run(dp__fanout *f, dp__ctl_client *ctl, double timeout_s,
                   const dp__fanout_opts *o);

/* The first failed unit's code and detail (unit order); DP_OK when none failed. */
int dp__fanout_first(const dp__fanout *f, dp_detail *d);

/* Units asked whose outcome is not DP_OK. */
uint32_t dp__fanout_failed(const dp__fanout *f);

/*
 * Set unit u's outcome: code rc, detail "unit U (ADDR)" + sep + the
 * formatted cause (sep ": " for most causes, " " where the cause reads on,
 * "unit 3 (...) says it is ..."). Returns rc.
 */
int dp__fanout_fail(dp__fanout *f, uint32_t u, int rc, const char *sep, const char *fmt,
                    ...) __attribute__((format(printf, 5, 6)));

/* The cause of a failed unit's report, without the words naming the unit. */
const char *dp__fanout_why(const dp__fanout_unit *r);

/*
 * The reply of one item sent by dp__ctl_send / _call_many, decoded for op:
 * the item's own failure (its rc and det), else dp__wire_reply_decode's. rep
 * is zeroed first and needs dp__wire_reply_fini whatever the result. An
 * error reply decodes with DP_OK (rep->ok false), for the caller to judge.
 */
int dp__fanout_reply(const dp__ctl_item *it, dp__wire_op op, dp__wire_reply *rep,
                     dp_detail *d);

/*
 * Whether a reply's incarnation names another process than the one a
 * binding holds (0 on either side is unknown: not another).
 */
static inline bool
dp__fanout_other_process(uint64_t bound, uint64_t answered)
{
    return bound != 0 && answered != 0 && answered != bound;
}

/* Fill unit u's request q (op and args); false leaves u out of the batch. */
typedef bool (*dp__fanout_req_fn)(uint32_t u, dp__wire_request *q, void *ctx);

/* A dp__fanout_req_fn asking every unit the op without arguments that ctx
 * points at (a dp__wire_op: stats, info). */
bool dp__fanout_req_op(uint32_t u, dp__wire_request *q, void *ctx);

/* ---- rows grouped by unit ---- */

/*
 * Items grouped by the unit that owns them (gidx % n_units), stable: unit
 * u's items are order[start[u]] .. order[start[u + 1] - 1], in input order.
 * With copies (dp__groups_make_copies) an item is in several units' groups.
 */
typedef struct dp__groups {
    uint32_t n_units;
    uint32_t *start; /* n_units + 1 */
    uint32_t *order; /* one item index per item */
} dp__groups;

/* Group gidxs[0..n) (n <= UINT32_MAX) over n_units. DP_ENOMEM; g is then empty. */
int dp__groups_make(dp__groups *g, uint32_t n_units, const uint64_t *gidxs, size_t n,
                    dp_detail *d);
/* Group items whose unit is known: item i in unit units[i] (< n_units). */
int dp__groups_of_units(dp__groups *g, uint32_t n_units, const uint32_t *units, size_t n,
                        dp_detail *d);
/*
 * The same with replicas: item i goes to units (gidxs[i] + shift + k) % n_units
 * for k in [0, copies) (copies <= n_units, shift < n_units, n * copies <=
 * UINT32_MAX): a put's every copy (shift 0, copies R), or a get's turn at the
 * k-th replica (shift k, copies 1).
 */
int dp__groups_make_copies(dp__groups *g, uint32_t n_units, const uint64_t *gidxs,
                           size_t n, uint32_t shift, uint32_t copies, dp_detail *d);
void dp__groups_fini(dp__groups *g);

/* How many items unit u owns. */
static inline uint32_t
dp__groups_count(const dp__groups *g, uint32_t u)
{
    return g->start[u + 1] - g->start[u];
}

/* ---- control-only clients (client.c) ---- */

/*
 * Flags of dp__client_open_ctl and dp__client_check_units. NO_CHECK: ask no
 * unit yet. ALLOW_DOWN: a unit that does not answer info is marked down
 * (requests to it then fail with why) instead of an error.
 */
#define DP__CTL_NO_CHECK 1u
#define DP__CTL_ALLOW_DOWN 2u

/* What asking a unit who it is found (dp__client_unit_check). */
enum {
    DP__UNIT_UNCHECKED = 0, /* not asked yet: only info may go to it */
    DP__UNIT_CHECKED,       /* it said it is unit u of n */
    DP__UNIT_DOWN,          /* it did not answer info */
};

/*
 * A client of cl's units for the control plane only: no transfer endpoint
 * (no UCX), no mapped slab; dp_client_clear, dp_client_stats_get,
 * dp_ckpt_save / _load, dp__client_call_all and dp__client_clear_units work,
 * put and get are refused (DP_EINVAL). opts: timeout_s bounds each call,
 * connect_timeout_s asking the units who they are (as dp_client_open).
 * words (NULL: the library's) word its reports: listed_by names the list
 * a misplaced unit contradicts ("the cluster file P"), the hints are
 * appended (copied). Unless DP__CTL_NO_CHECK, every unit is asked who it is
 * (dp__client_check_units). Errors of dp__client_check_units, DP_EINVAL,
 * DP_ENOMEM; *out is then NULL. Close with dp_client_close.
 */
int dp__client_open_ctl(const dp__cluster *cl, const dp_client_opts *opts,
                        const dp__fanout_opts *words, unsigned flags, dp_client **out,
                        dp_detail *d);

/*
 * A full client's units that were down when it opened are bound now (info,
 * checked to be unit u of n), for callers that reach the units by address
 * (the checkpoint's save and load). DP_OK when every unit is bound (always
 * for a control-only client: its own checks guard it), else the first
 * unit's error, naming it.
 */
int dp__client_bind_all(dp_client *c, dp_detail *d);

/*
 * Ask unit only (every unit: only < 0) of a control-only client who it is,
 * all at once, and check that unit u says it is unit u of n: nothing but
 * info goes to a unit before this succeeded for it. Errors, the first in
 * unit order into d: DP_EPROTO (a unit says otherwise, or its info is
 * unusable), the error of a unit that does not answer (with
 * DP__CTL_ALLOW_DOWN it is marked down instead), an error reply.
 */
int dp__client_check_units(dp_client *c, int64_t only, unsigned flags, dp_detail *d);

/*
 * Unit u as the last check left it: DP__UNIT_* (a full client's units are
 * all checked); *det (may be NULL) gets why a unit is down; *agent (its
 * endpoint name) and *incarnation (its process) are set once checked.
 */
int dp__client_unit_check(const dp_client *c, uint32_t u, dp_detail *det,
                          const char **agent, uint64_t *incarnation);

/*
 * The request q_of gives each unit, to every unit at once (under the
 * client's lock, its timeout_s): f is initialised here for the client's
 * units (dp__fanout_fini it whatever the result) and holds each unit's
 * outcome. A unit marked down gets its reason, one never checked DP_EINVAL,
 * without a request. Returns the first failure, into d.
 */
int dp__client_call_all(dp_client *c, dp__fanout *f, dp__fanout_req_fn q_of, void *ctx,
                        dp_detail *d);

/*
 * dp_client_clear of gidxs[0..n) with the report per unit: g (made here,
 * dp__groups_fini it) groups the rows by unit; f (as dp__client_call_all)
 * holds each asked unit's outcome, rep.r.dropped its entries dropped. d gets
 * dp_client_clear's summary.
 */
int dp__client_clear_units(dp_client *c, const uint64_t *gidxs, size_t n, dp__fanout *f,
                           dp__groups *g, dp_detail *d);

#endif
