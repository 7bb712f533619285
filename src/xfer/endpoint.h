/*
 * Transfer endpoint: one UCX context and worker, the memory it registered, the
 * remote endpoints it can reach, and blocking one-sided WRITE (put) and READ
 * (get) between registered local memory and a remote's registered regions.
 *
 * No UCX type appears here: dp__endpoint is opaque, remotes are named by the
 * string their metadata carries, memory by plain addresses.
 *
 * Every posted transfer ends DONE or is retained in the process graveyard
 * (graveyard.h) with its local ranges, on every exit path; a retained one
 * whose UCX requests all complete later (a failed peer's are purged by UCX)
 * is released from it when the worker is next progressed. Callers must not
 * reuse or free memory for which dp__endpoint_touches_unfinished() is true.
 *
 * Threads: every function may be called from any thread unless its comment
 * says otherwise; the endpoint serialises access to its UCX worker with one
 * mutex. Blocking calls (transfer, transfer_many, add_remote) do not hold it
 * while idle, so several threads can wait at once.
 */
#ifndef DP_XFER_ENDPOINT_H
#define DP_XFER_ENDPOINT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/common.h"
#include "common/copier.h"
#include "xfer/graveyard.h"

typedef struct dp__endpoint dp__endpoint;

typedef enum dp__xfer_op {
    DP_XFER_WRITE = 1, /* local -> remote (UCX put) */
    DP_XFER_READ = 2,  /* remote -> local (UCX get) */
} dp__xfer_op;

typedef enum dp__ep_err_mode {
    /*
     * Detect failed peers (UCP_ERR_HANDLING_MODE_PEER): a dead peer's transfers
     * fail instead of hanging. Shared-memory error handling is switched on in the
     * endpoint's UCX config so same-host RMA still goes over posix/sysv.
     */
    DP_EP_ERR_PEER = 0,
    /* No peer-failure detection (UCP_ERR_HANDLING_MODE_NONE); deadlines still hold. */
    DP_EP_ERR_NONE = 1,
} dp__ep_err_mode;

/* Creation options. A zeroed struct (or dp__endpoint_opts_init) gives the defaults. */
typedef struct dp__endpoint_opts {
    /*
     * Run a thread that progresses the worker whenever no caller does. Needed by
     * a target whose peers may use emulated RMA (TCP): it serves them without any
     * caller. Default off.
     */
    bool progress_thread;
    /*
     * How long the progress thread keeps polling (yielding the core to any
     * other runnable thread between polls) after it last served a two-sided
     * message before it sleeps on the worker's event fd, in microseconds: a
     * stream of messages is then served without a wake-up per message
     * (docs/design.md, "Two-sided transfers"). 0: default (200); negative: never (sleep
     * at once). The environment's DP_PROGRESS_SPIN_US (0 for never) overrides it.
     */
    int32_t progress_spin_us;
    /*
     * Poll on after any event the progress thread handled, not only two-sided
     * serving: for an endpoint whose peers read plain (malloc) memory of it,
     * which UCX serves with emulated RMA, a stream of active messages this
     * thread must answer one by one (the direct transport's publishers).
     */
    bool spin_after_any_event;
    /*
     * Refuse to create the endpoint (DP_EPOLICY and the reason) unless UCX_TLS
     * and UCX_NET_DEVICES restrict UCX to RDMA transports. Also switched on by the
     * environment variable DP_REQUIRE_RDMA=1.
     */
    bool require_rdma;
    dp__ep_err_mode err_mode;
    /*
     * Ranges up to this many bytes whose remote region is mapped into this
     * process (shared memory on one host) are copied with memcpy instead of a
     * UCX operation; such a copy completes synchronously. 0: default (no
     * limit); negative: never.
     */
    int64_t memcpy_max;
    /*
     * Threads that share an op's memcpy-path copies of 512 KiB or more, the
     * caller included (docs/design.md, "Parallel copies"): 1..16; 0: the
     * environment's DP_COPY_THREADS, else 2 on a machine of 2 or more cores.
     */
    unsigned copy_threads;
    /*
     * When ops with a grant go two-sided (docs/design.md, "Two-sided
     * transfers"): DP_XFER_TS_AUTO (default) towards a remote that serves them
     * and whose lanes have no native RMA (TCP); ALWAYS towards every remote that
     * serves them; NEVER. The environment variable DP_TWO_SIDED=auto|always|never
     * overrides it.
     */
    int two_sided;
    /* Messages from this many bytes up go by rendezvous (0: default, 16 KiB). */
    uint64_t rndv_min;
} dp__endpoint_opts;

enum { DP_XFER_TS_AUTO = 0, DP_XFER_TS_ALWAYS = 1, DP_XFER_TS_NEVER = 2 };

/* One transfer of a batch: parallel lists of local and remote ranges. */
typedef struct dp__xfer_desc {
    dp__xfer_op op;
    const dp__range *local;
    size_t n_local;
    const dp__range *remote;
    size_t n_remote;
    const char *remote_name;
    /*
     * What entitles this op to the target's memory when it goes two-sided
     * (docs/design.md, "Two-sided transfers"): opaque bytes the target's serve
     * hooks check (a unit: the allocation for a WRITE, the pin for a READ).
     * NULL: the op is always one-sided. At most DP_XFER_GRANT_MAX bytes.
     */
    const void *grant;
    uint32_t grant_len;
    /*
     * Local ranges that go by the memcpy path (their remote region is mapped
     * in this process, the op is one-sided, and the range is within
     * memcpy_max: dp__endpoint_remote_copy_max) may lie in plain memory,
     * registered or not: the CPU copies them before the call returns and
     * nothing touches them after it. Every other local range must lie in a
     * registered region, as without this flag.
     */
    bool local_plain_ok;
    /*
     * NULL, or a flag another thread may set (written and read with atomic
     * builtins): once true, the op's wait ends as at its deadline, with
     * DP_ECANCELED, whatever is unfinished retained by the graveyard; an op
     * of the batch not yet posted is not posted.
     */
    const bool *cancel;
} dp__xfer_desc;

#define DP_XFER_GRANT_MAX 96

/*
 * What became of one op of a batch (dp__endpoint_transfer_many), said as what
 * its caller must do about it: nothing outside src/xfer needs to know which
 * lane or path the op took or how UCX ended it.
 */
typedef struct dp__xfer_result {
    int rc;        /* DP_OK, or the error (det says why) */
    dp_detail det; /* cleared when the op is done */
    /*
     * Bytes of the failed op may still reach the remote's memory: what it
     * aimed at must not be reused there (a put's abort says "in flight").
     * False for an op that was never posted, one that ended on shared memory
     * or completed after its deadline, and every two-sided op (the target
     * receives its bytes itself and takes none after an abort: docs/design.md,
     * "Two-sided transfers").
     */
    bool may_land;
    /*
     * A posted op failed over a network lane: the connection may be stalled
     * (TCP backing off after an outage). The caller re-adds the remote from
     * fresh metadata (dp__endpoint_add_remote) before its next transfer there.
     */
    bool suspect;
    /*
     * The same for a message: "nothing posted", "may still land", "two-sided:
     * the target takes none of it after an abort", "ended"; "" when done.
     */
    const char *fate;
} dp__xfer_result;

/*
 * How an endpoint reaches a remote, for reports and for the remote's own
 * bookkeeping (a unit counts its writers by lane): names only, so nobody
 * outside src/xfer branches on them (dp__endpoint_remote_route).
 */
typedef struct dp__xfer_route {
    const char *lane; /* "shm", "rdma", "tcp", "?": what RMA rides on */
    const char *path; /* "one-sided", "two-sided": how ops with a grant go */
    bool two_sided;   /* path is "two-sided" */
    char tls[128];    /* the lane's UCX transports, comma-separated ("" unknown) */
} dp__xfer_route;

/* Fill o with the defaults. */
void dp__endpoint_opts_init(dp__endpoint_opts *o);

/*
 * Create an endpoint named name (1..255 printable ASCII bytes; it is how peers
 * name this endpoint) with opts (NULL: defaults). On success *out owns the UCX
 * context and worker. Errors: DP_EINVAL (bad name or options), DP_EPOLICY
 * (require_rdma and the UCX configuration allows non-RDMA transports; d says
 * why), DP_ETRANSFER (UCX failed to initialise; d has the UCX status), DP_ENOMEM.
 */
int dp__endpoint_create(const char *name, const dp__endpoint_opts *opts,
                        dp__endpoint **out, dp_detail *d);

/*
 * Release the UCX resources: stop the progress thread, disconnect remotes,
 * unmap memory from dp__endpoint_alloc, deregister the rest. If a transfer of
 * this endpoint was retained in the graveyard, the UCX context, worker and
 * every registration are kept (owned by the graveyard) instead, because that
 * transfer may still run. Later calls on ep fail with DP_EINVAL. Idempotent.
 * Must not race with other calls on ep.
 */
void dp__endpoint_close(dp__endpoint *ep);

/* Close (if needed) and free. NULL and half-built endpoints allowed. */
void dp__endpoint_destroy(dp__endpoint *ep);

/*
 * The process exits after this endpoint's close: close keeps its UCX worker
 * and context as it does for retained transfers (nothing to give back to a
 * process about to end). UCX 1.13 may abort in a worker's destroy when a
 * peer's wireup reply is still pending on a connection an outage left
 * stuck (an assertion upstream removed, openucx/ucx#8175).
 */
void dp__endpoint_keep_ucx_at_close(dp__endpoint *ep);

/* The endpoint's name (valid until destroy). */
const char *dp__endpoint_name(const dp__endpoint *ep);

/*
 * Register [addr, addr + len) that the caller owns and keeps alive until
 * deregistered. Regions must not overlap. Errors: DP_EINVAL, DP_EEXIST
 * (overlaps a registered region), DP_ETRANSFER (UCX refused; d gives the size
 * and RLIMIT_MEMLOCK).
 */
int dp__endpoint_register(dp__endpoint *ep, void *addr, size_t len, dp_detail *d);

/*
 * Allocate len bytes of registered memory through UCX (shared memory where
 * possible, so a peer on the same host gets true one-sided access: use it for
 * slabs) and return its address in *addr. Freed by dp__endpoint_deregister or
 * close. Errors as for register, plus DP_ENOMEM.
 */
int dp__endpoint_alloc(dp__endpoint *ep, size_t len, void **addr, dp_detail *d);

/*
 * Deregister the region starting at addr (and free it if it came from
 * dp__endpoint_alloc). Errors: DP_ENOTFOUND (no region starts there), DP_EBUSY
 * (an unfinished transfer touches it: it stays registered for good and the
 * memory must not be reused).
 */
int dp__endpoint_deregister(dp__endpoint *ep, void *addr, dp_detail *d);

/*
 * This endpoint's metadata: the bytes a peer passes to dp__endpoint_add_remote.
 * *out is malloc'd (caller frees), *len its size. The generation inside bumps
 * on every register/deregister, so take it again after those.
 */
int dp__endpoint_metadata(dp__endpoint *ep, uint8_t **out, size_t *len, dp_detail *d);

/*
 * Parse untrusted metadata md[0..len) and connect to that endpoint. The remote's
 * name is copied to name_out (at least 256 bytes; NULL allowed). The remote's
 * shared-memory mappings, if any, are pre-faulted here once. Adding a name that
 * is already known replaces it (its metadata may have changed). Errors: DP_EPROTO
 * (malformed metadata), DP_ETRANSFER (UCX could not reach it or unpack a key),
 * DP_EINVAL, DP_ENOMEM.
 */
int dp__endpoint_add_remote(dp__endpoint *ep, const void *md, size_t len, char *name_out,
                            dp_detail *d);

/*
 * Finish connecting to remote name within timeout_s (finite, > 0): wait until
 * UCX's connection setup (wireup) with it is over, then classify its lanes
 * again and choose its path (dp__endpoint_remote_route tells both) from the lanes
 * UCX settled on. The remote must progress meanwhile (a progress thread). A
 * peer killed while UCX 1.13 still sets up its side of a TCP connection can
 * abort that peer inside UCX (docs/design.md, "Known limitations"), so a
 * client finishes it before its first transfer rather than during one.
 * Errors: DP_ENOTFOUND, DP_EINVAL, DP_ETIMEDOUT, DP_ETRANSFER (UCX failed:
 * the peer is gone), DP_EPOLICY (require_rdma and the lanes are not RDMA).
 */
int dp__endpoint_remote_connect(dp__endpoint *ep, const char *name, double timeout_s,
                                dp_detail *d);

/* True if a remote of that name was added and not removed. */
bool dp__endpoint_has_remote(dp__endpoint *ep, const char *name);

/*
 * The largest range an op to remote `name` copies with the CPU (the memcpy
 * path: every region of the remote is mapped in this process and its path is
 * one-sided), so that its local side may be plain memory (local_plain_ok);
 * 0 when none is (another host, the two-sided path, the path turned off, or
 * no such remote). Fixed from the remote's connection to its removal.
 */
uint64_t dp__endpoint_remote_copy_max(dp__endpoint *ep, const char *name);

/*
 * Disconnect and forget a remote. Errors: DP_ENOTFOUND. A remote with retained
 * transfers is forgotten, but its UCX endpoint and keys are kept.
 */
int dp__endpoint_remove_remote(dp__endpoint *ep, const char *name, dp_detail *d);

/*
 * Copy jobs within this process (a client's staging copies) on the endpoint's
 * copy threads when they come to 512 KiB or more (docs/design.md, "Parallel
 * copies"). Takes no endpoint lock; a batch that comes while another runs is
 * copied by its caller alone. Not after dp__endpoint_close.
 */
void dp__endpoint_copy(dp__endpoint *ep, const dp__copy *jobs, size_t n);

/*
 * Blocking transfer of one op: WRITE copies op->local[i] to op->remote[i], READ
 * the other way, for every i; local ranges must lie in this endpoint's registered
 * regions and remote ranges in the remote's. Returns once every byte is done
 * (for WRITE: visible in the remote memory) or timeout_s (finite, > 0) passed.
 * Destination ranges of one op that overlap land in no defined order (UCX
 * ops never had one, and the memcpy path copies on several threads).
 *
 * Errors: DP_EINVAL before anything is posted (closed endpoint, unknown
 * remote, list lengths or per-range sizes that differ, a range outside the
 * registered regions, bad op or timeout); DP_EFATAL (process poisoned);
 * DP_ETIMEDOUT (deadline passed: the transfer is retained in the graveyard);
 * DP_ETRANSFER (the peer failed or UCX reported an error; retained if it may
 * still run).
 */
int dp__endpoint_transfer(dp__endpoint *ep, const dp__xfer_desc *op, double timeout_s,
                          dp_detail *d);

/*
 * Post every transfer of ops[0..n_ops) (as dp__endpoint_transfer), then wait for
 * all of them under one deadline, so N peers cost about the slowest one.
 * res[i] (n_ops entries, required) says what became of op i. Ops are
 * independent: one failing does not stop the others.
 *
 * on_done (NULL: none) is called as fn(ctx, i, rc) once for each op i that was
 * posted or tried, as soon as it ends (rc as res[i].rc), in the calling
 * thread, without the endpoint's lock, before this returns. An op that ends at
 * its post (same-host memcpy path, a dead peer) is reported before the next op
 * is posted, so the caller can overlap its next step (a commit) with the rest
 * of the batch. Not called when the whole batch is refused.
 *
 * Returns DP_OK when every op is done. DP_EINVAL (any op invalid), DP_EFATAL
 * and DP_ENOMEM refuse the whole batch before anything is posted (every
 * res[i].rc set to it); otherwise the code of the first failed op, with d
 * naming it.
 */
typedef struct dp__xfer_notify {
    void (*fn)(void *ctx, size_t i, int rc);
    void *ctx;
} dp__xfer_notify;
int dp__endpoint_transfer_many(dp__endpoint *ep, const dp__xfer_desc *ops, size_t n_ops,
                               double timeout_s, dp__xfer_result *res,
                               const dp__xfer_notify *on_done, dp_detail *d);

/*
 * Progress the worker briefly (keepalive and error callbacks that are due run
 * now, even after a long idle) and say whether the connection to remote name
 * is healthy: DP_OK, DP_ETRANSFER when UCX reported it failed (re-add it from
 * fresh metadata: dp__endpoint_add_remote replaces it), DP_ENOTFOUND.
 */
int dp__endpoint_remote_check(dp__endpoint *ep, const char *name, dp_detail *d);

/*
 * The UCX transports this endpoint's context found ("tcp,sysv,posix,cma,self":
 * each once, as UCX lists its resources) into buf[cap]. DP_ENOMEM.
 */
int dp__endpoint_transports(dp__endpoint *ep, char *buf, size_t cap);

/*
 * How this endpoint reaches remote name (dp__xfer_route: its lanes as
 * classified when it was added or connected, and the path ops with a grant
 * take). Errors: DP_ENOTFOUND, DP_EINVAL.
 */
int dp__endpoint_remote_route(dp__endpoint *ep, const char *name, dp__xfer_route *out,
                              dp_detail *d);

/*
 * True if [addr, addr + nbytes) overlaps the local ranges of a retained
 * (possibly still running) transfer, in this endpoint or any other of the
 * process. Such memory must never be reused or freed.
 */
bool dp__endpoint_touches_unfinished(const dp__endpoint *ep, const void *addr,
                                     size_t nbytes);

/*
 * Describe the UCX lanes (transports) used towards remote name: what
 * ucp_ep_print_info prints, into a malloc'd string (*out, caller frees).
 * For benchmarks and diagnostics. Errors: DP_ENOTFOUND, DP_EINVAL, DP_ENOMEM.
 */
int dp__endpoint_describe_remote(dp__endpoint *ep, const char *name, char **out,
                                 dp_detail *d);

/*
 * The target's side of two-sided transfers (docs/design.md, "Two-sided
 * transfers"). The endpoint calls these from its progress thread with its
 * lock held (so a hook must not call the endpoint); each begin that returns
 * 0 is matched by exactly one end, once the endpoint touches that memory no
 * more. begin checks grant (untrusted bytes from the peer) and the ranges and
 * returns 0 with *hold set, or a dp_err with d saying why (sent back to the
 * peer, which fails its op with it).
 */
typedef struct dp__xfer_serve {
    /* A peer sends len bytes to land at [addr, addr + len) of this endpoint. */
    int (*write_begin)(void *ctx, const uint8_t *grant, size_t grant_len, uint64_t addr,
                       uint64_t len, void **hold, dp_detail *d);
    /* ok: every byte landed. */
    void (*write_end)(void *ctx, void *hold, bool ok);
    /* A peer asks for ranges[0..n) of this endpoint, gathered, in order. */
    int (*read_begin)(void *ctx, const uint8_t *grant, size_t grant_len,
                      const dp__range *ranges, size_t n, void **hold, dp_detail *d);
    void (*read_end)(void *ctx, void *hold);
    void *ctx;
} dp__xfer_serve;

/*
 * Serve two-sided transfers with hooks (copied; NULL: stop serving: later
 * messages are refused and no hook is called again, not even an end). Needs
 * the progress thread. Call before taking the metadata peers get (it says
 * whether this endpoint serves). Errors: DP_EINVAL.
 */
int dp__endpoint_serve(dp__endpoint *ep, const dp__xfer_serve *hooks, dp_detail *d);

/* Counters for tests and stats. Any thread. */
typedef struct dp__endpoint_stats {
    uint64_t transfers_ok;
    uint64_t transfers_failed;
    uint64_t transfers_retained; /* handed to the graveyard */
    uint64_t transfers_released; /* of those, ended later: released from it */
    uint64_t memcpy_ranges;      /* ranges done by the direct memcpy path */
    uint64_t ucx_ranges;         /* ranges posted to UCX */
    uint64_t copies_parallel;    /* batches of memcpy runs shared by several threads */
    uint64_t copies_parallel_bytes;
    uint64_t ts_sent;      /* two-sided messages sent (WRITE, READ request) */
    uint64_t ts_served;    /* two-sided requests this endpoint served */
    uint64_t ts_refused;   /* two-sided requests it refused */
    uint64_t ts_bytes_in;  /* bytes received by served WRITEs */
    uint64_t ts_bytes_out; /* bytes sent by served READs */
    size_t n_regions;
    size_t n_remotes;
} dp__endpoint_stats;
void dp__endpoint_get_stats(dp__endpoint *ep, dp__endpoint_stats *st);

#endif
