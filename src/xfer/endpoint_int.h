/*
 * Shared by the transfer endpoint's own files only: struct dp__endpoint, its
 * local regions, remotes and batches, the lock helpers and the calls between
 * the files. endpoint.h is the module's interface for the rest of the
 * project and shows no UCX type; this header includes <ucp/api/ucp.h> (the
 * only place that does), so only the .c files of src/xfer include it.
 *
 * Design notes
 * ------------
 * Files. endpoint.c: create/close (and the UCX configuration), the progress
 * thread, memory registration, metadata, stats. remote.c: remotes (add,
 * remove, check, describe, lane). transfer.c: posting and waiting, the
 * hand-off of unfinished transfers to the graveyard and the released list.
 * twosided.c: two-sided transfers (messages instead of RMA where UCX has no
 * native RMA), both the client's and the serving side.
 *
 * Invariants
 * - Local regions are a set of disjoint ranges (common/ranges.h: sorted by
 *   base, binary-searched), and so are a remote's regions; a region with
 *   transfers in flight (r_busy > 0) or touched by a retained transfer is
 *   never deregistered. A remote with transfers in flight or retained is never
 *   freed: remove_remote turns it into a zombie (unlisted, kept until close).
 * - If any transfer of this endpoint was retained, close() keeps the UCX
 *   context, worker, endpoints and registrations alive for good (the endpoint
 *   object moves to a process-wide list of abandoned endpoints): a retained
 *   operation may still use them.
 *
 * Threads and locks
 * - The worker runs in UCS_THREAD_MODE_SERIALIZED: UCX does no locking of its
 *   own on the data path and ep_mu (mu below) makes every worker call mutually
 *   exclusive (ucp_worker_progress, posting, rkey unpack, ep create/close, mem
 *   map). UCX callbacks (completion, peer error, active messages) therefore
 *   run with ep_mu held, from whichever thread progresses. Completion and
 *   error callbacks only update counters, flags, batches and the released
 *   list; the two-sided handlers (twosided.c) also post receives and replies
 *   and call the serve hooks.
 * - Blocking calls post under ep_mu, then alternate progress (under ep_mu)
 *   and a brief release of ep_mu, so other callers and the progress thread get
 *   in between. Waiting threads all progress the worker; whichever completes a
 *   request updates the owning batch under ep_mu.
 * - The optional progress thread progresses the worker when nobody else does
 *   and sleeps on the worker's event fd (ucp_worker_arm) when idle, so a target
 *   serves emulated RMA (TCP) without any caller.
 * - Lock order: ep_mu, then the graveyard's mutex (leaf), then the abandoned
 *   list's mutex (leaf). Nothing calls back into the endpoint with ep_mu held.
 *   The serve hooks run under ep_mu and take their owner's lock (a unit's mu),
 *   which is therefore never held while calling an endpoint function that
 *   locks.
 *   Functions named *_locked are called with ep_mu held.
 * - r_failed is written by the UCX error callback and read by waiters, both
 *   under ep_mu; it is also accessed atomically in case UCX ever invokes the
 *   callback from its async thread.
 *
 * Ownership
 * - The endpoint owns the UCX context, worker, its worker address, every
 *   region (memh and packed rkey; the memory itself only for alloc()), every
 *   remote (UCX ep, unpacked rkeys and their local mappings).
 * - A batch (one op of a call) is the endpoint's until its call ends; a
 *   retained one is owned by the graveyard from then on (transfer.c).
 * - The caller owns registered memory and the range arrays it passes.
 */
#ifndef DP_XFER_ENDPOINT_INT_H
#define DP_XFER_ENDPOINT_INT_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <ucp/api/ucp.h>

#include "common/copier.h"
#include "common/list.h"
#include "common/ranges.h"
#include "xfer/endpoint.h"
#include "xfer/metadata.h"

typedef struct region {
    uint64_t r_base, r_len;
    ucp_mem_h r_memh;
    void *r_rkey; /* packed rkey (ucp_rkey_buffer_release) */
    size_t r_rkey_len;
    bool r_allocated; /* memory came from ucp_mem_map ALLOCATE */
    uint64_t r_busy;  /* posted ranges not yet ended */
} region;

/* A remote's region, in r_regs (metadata order) and its r_index. */
typedef struct rregion {
    uint64_t rr_base, rr_len;
    ucp_rkey_h rr_rkey;
    uint8_t *rr_ptr; /* local mapping of the remote region (shared memory) or NULL */
    /* DP_PREFAULT=touch: one bit per 2 MiB chunk of the mapping already
     * faulted in (under ep_mu), or NULL (none wanted, or every chunk is:
     * freed then, so a transfer over a warm mapping checks one pointer). */
    uint8_t *rr_touched;
    uint64_t rr_untouched; /* chunks not faulted in yet */
} rregion;

/* DP_PREFAULT=touch faults a mapping in by chunks of this many bytes. */
#define DP__TOUCH_CHUNK_SHIFT 21

/* Fault in chunks first..last of rr's mapping not faulted in yet. ep_mu held. */
void dp__ep_rregion_touch_slow_locked(rregion *rr, uint64_t first, uint64_t last);

/* Fault in the chunks of rr's mapping that [p, p + n) touches, once each
 * (DP_PREFAULT=touch; a no-op otherwise). ep_mu held. Inline for the usual
 * case, a run inside one chunk faulted in already. */
static inline void
dp__ep_rregion_touch_locked(rregion *rr, const uint8_t *p, size_t n)
{
    if (rr->rr_touched == NULL || n == 0)
        return;
    uint64_t first = (uint64_t)(p - rr->rr_ptr) >> DP__TOUCH_CHUNK_SHIFT;
    uint64_t last = (uint64_t)(p + n - 1 - rr->rr_ptr) >> DP__TOUCH_CHUNK_SHIFT;
    if (first == last && (rr->rr_touched[first >> 3] & (1u << (first & 7))) != 0)
        return;
    dp__ep_rregion_touch_slow_locked(rr, first, last);
}

/* How an endpoint moves bytes with grants to a remote (its route's path). */
typedef enum dp__xfer_path {
    DP_XFER_PATH_RMA = 0,       /* one-sided UCX put/get (native, or emulated by UCX) */
    DP_XFER_PATH_TWO_SIDED = 1, /* ops with a grant go as messages the target serves */
} dp__xfer_path;

/* How this endpoint's RMA reaches a remote, from the lanes UCX chose. */
typedef enum dp__xfer_lane {
    DP_XFER_LANE_UNKNOWN = 0,
    DP_XFER_LANE_SHM = 1,  /* every lane is shared memory on this host */
    DP_XFER_LANE_RDMA = 2, /* RDMA transports (and same-host helpers) only */
    DP_XFER_LANE_TCP = 3,  /* some lane is TCP (RMA emulated) or unknown */
} dp__xfer_lane;

/* "shm", "rdma", "tcp", "?". */
const char *dp__xfer_lane_name(dp__xfer_lane lane);

typedef struct remote {
    char r_name[DP_MD_NAME_MAX + 1];
    uint64_t r_gen;
    ucp_ep_h r_ep;
    rregion *r_regs;
    uint32_t r_n_regs;
    dp__ranges r_index; /* r_regs as ranges (v: the rregion) */
    int r_failed;       /* ucs_status_t; UCS_OK while healthy (atomic access) */
    /* Its process, when its metadata names one on this host (peerproc.h),
     * and whether a check found it ended (then r_failed is set too). */
    dp__md_proc r_proc;
    bool r_local_proc;
    bool r_exited;
    uint64_t r_busy; /* ops in flight towards it */
    uint64_t r_retained;
    bool r_serves;        /* its metadata says it serves two-sided transfers */
    dp__xfer_lane r_lane; /* the lanes UCX chose for it, classified at add */
    char r_tls[128];      /* their transports, comma-separated */
    dp__xfer_path r_path; /* how ops with a grant go to it */
    struct dp__endpoint *r_owner;
    dp__list_node r_link; /* ep->remotes, or ep->zombies */
    /*
     * Background pre-faulting of its shared-memory mappings (remote.c): the
     * thread, and the flag that stops it; joined before the mappings go.
     */
    pthread_t r_pf_thread;
    bool r_pf_started;
    int r_pf_stop; /* atomic */
} remote;

/* Every region of r is mapped in this process (the memcpy path reaches all of it). */
static inline bool
dp__ep_remote_mapped(const remote *r)
{
    for (uint32_t i = 0; i < r->r_n_regs; i++)
        if (r->r_regs[i].rr_ptr == NULL)
            return false;
    return r->r_n_regs > 0;
}

/* One op of a call: its UCX requests and outcome. */
typedef struct batch {
    int b_pending;         /* UCX requests not yet completed */
    ucs_status_t b_status; /* first error reported by UCX */
    uint64_t b_done_ns;    /* when the last request completed, or the post did */
    /*
     * Retained in the graveyard (b_pending > 0 when its call ended): the
     * completion callback of its last request hands it to ep->released, and
     * dp__ep_reap_locked releases it from the graveyard: UCX no longer touches its
     * local ranges once every request of it completed.
     */
    bool b_retained;
    struct dp__endpoint *b_ep;
    struct remote *b_r;
    dp__list_node b_link; /* ep->released */
    /* Two-sided (twosided.c): the target's refusal, if it refused. */
    int b_peer_rc; /* dp_err; 0 while none */
    char b_peer_msg[200];
} batch;

/*
 * One two-sided message of an op (twosided.c): a WRITE of one contiguous run
 * of the target's memory, or a READ request. It counts once in its batch's
 * b_pending until its own parts (the send, the reply, a rendezvous receive)
 * have all ended; it lives in ep->tsops until then.
 */
typedef struct tsop {
    uint64_t t_seq;
    batch *t_b;
    remote *t_r;
    uint8_t t_kind;      /* TS_WRITE or TS_READ */
    bool t_awaiting;     /* the target's reply has not come */
    int t_parts;         /* of the send, the reply and a receive: not ended yet */
    uint64_t t_total;    /* bytes the message carries (WRITE) or asks for (READ) */
    ucp_dt_iov_t *t_iov; /* local runs: gathered (WRITE) or scattered into (READ) */
    size_t t_n_iov;
    void *t_req; /* READ: the (addr, len) list sent */
    size_t t_req_len;
    uint8_t t_hdr[160]; /* the header, alive until the send completes */
    size_t t_hdr_len;
    dp__list_node t_link; /* ep->tsops */
} tsop;

struct dp__endpoint {
    char name[DP_MD_NAME_MAX + 1];
    dp__endpoint_opts opts;
    size_t memcpy_max;  /* 0: fast path off */
    dp__copier *copier; /* the memcpy path's runs of one op, on several cores */
    dp__copy *runs;     /* an op's memcpy runs, waiting for the copier (transfer.c) */
    size_t n_runs, runs_cap;
    pthread_mutex_t mu;
    bool mu_init;
    bool closed;
    bool abandoned;
    bool keep_ucx; /* close keeps the UCX state: the process is exiting */
    ucp_context_h ctx;
    ucp_worker_h worker;
    ucp_address_t *waddr;
    size_t waddr_len;
    int efd;          /* worker event fd, -1 if none */
    dp__ranges regs;  /* the local regions (v: a malloc'd region) */
    dp__list remotes; /* listed (remote.r_link) */
    dp__list zombies; /* removed but kept: busy or retained */
    uint64_t gen;
    dp__md_proc self_proc; /* this process, in the metadata when has_self_proc */
    bool has_self_proc;
    uint64_t proc_check_ns; /* when same-host peers were last checked (remote.c) */
    uint64_t n_retained;
    dp__list released; /* retained batches whose last request completed (b_link) */
    pthread_t thr;
    bool thr_started;
    int thr_stop;     /* atomic */
    uint64_t spin_ns; /* the progress thread polls this long after an event */
    dp__endpoint_stats st;
    dp__list_node ab_link; /* the abandoned endpoints (endpoint.c) */
    /* Two-sided transfers (twosided.c) */
    int two_sided;     /* DP_XFER_TS_* in force */
    uint64_t rndv_min; /* messages from this size up go by rendezvous */
    size_t max_am_header;
    bool serving; /* serve hooks installed */
    dp__xfer_serve serve;
    uint64_t serve_gen;   /* bumps at every dp__endpoint_serve */
    uint64_t ts_inflight; /* served replies and receives UCX still runs */
    uint64_t ts_seq;      /* last message sequence number */
    dp__list tsops;       /* this endpoint's messages in flight (tsop.t_link) */
};

static inline void
lock(dp__endpoint *ep)
{
    pthread_mutex_lock(&ep->mu);
}

static inline void
unlock(dp__endpoint *ep)
{
    pthread_mutex_unlock(&ep->mu);
}

static inline int
check_open_locked(const dp__endpoint *ep, dp_detail *d)
{
    if (ep->closed)
        return dp__fail(d, DP_EINVAL, "endpoint %s is closed", ep->name);
    return DP_OK;
}

/*
 * Why r failed, for messages: UCX's status, or that its process ended (ep_mu
 * held).
 */
static inline const char *
remote_fail_str(const remote *r, ucs_status_t st)
{
    return r->r_exited ? "its process on this host has ended" : ucs_status_string(st);
}

/*
 * Check the processes of same-host peers with transfers in flight (at most
 * every 100 ms per endpoint): one that ended fails as if UCX had reported it
 * (remote.c). ep_mu held.
 */
void dp__ep_check_peers_locked(dp__endpoint *ep, uint64_t now);

static inline ucs_status_t
remote_failed(const remote *r)
{
    return (ucs_status_t)__atomic_load_n(&r->r_failed, __ATOMIC_ACQUIRE);
}

/* dp__fail with what (printf-style), a colon and UCX's text for st. endpoint.c. */
int dp__ep_ucx_fail(dp_detail *d, int code, ucs_status_t st, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/*
 * This process's UCX version as metadata carries it: major << 24 | minor << 16 |
 * release. endpoint.c.
 */
uint32_t dp__ep_ucx_version(void);

/* The listed (not zombie) remote of that name, or NULL. remote.c. */
remote *dp__ep_remote_find_locked(const dp__endpoint *ep, const char *name);

/*
 * Close a remote's UCX endpoint and free it (no transfers in flight or
 * retained); kept, with a warning, if the close does not complete. remote.c.
 */
void dp__ep_remote_free_locked(dp__endpoint *ep, remote *r);

/*
 * Release from the graveyard the retained batches whose last UCX request
 * completed since (the released list). Called after progressing the worker,
 * never from a UCX callback. transfer.c.
 */
void dp__ep_reap_locked(dp__endpoint *ep);

/* One of b's pending parts ended with status (UCX callbacks and twosided.c). */
void dp__ep_batch_part_done_locked(batch *b, ucs_status_t status);

/* ---- two-sided transfers (twosided.c) ---- */

/* Register the active-message handlers on ep's worker. */
int dp__ep_ts_init_locked(dp__endpoint *ep, dp_detail *d);
/* Whether op o towards r goes two-sided. */
bool dp__ep_ts_wanted(const dp__endpoint *ep, const remote *r, const dp__xfer_desc *o);
/* Post op o (validated) to r as two-sided messages into batch b. */
void dp__ep_ts_post_locked(dp__endpoint *ep, remote *r, const dp__xfer_desc *o, batch *b);
/* r failed: the replies its messages wait for will never come. */
void dp__ep_ts_remote_failed_locked(dp__endpoint *ep, remote *r, ucs_status_t st);
/* Set r->r_path from its metadata, lanes and ep's option. */
void dp__ep_ts_choose_path_locked(dp__endpoint *ep, remote *r, dp__xfer_lane lane);

#endif
