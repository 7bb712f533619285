/*
 * Transfer endpoint over UCX's UCP API: one context and one worker per
 * endpoint, registered local regions, remote endpoints added from their
 * metadata, and blocking one-sided WRITE (ucp_put_nbx) and READ (ucp_get_nbx).
 * This is the only file that includes <ucp/api/ucp.h>.
 *
 * Design notes
 * ------------
 * Invariants
 * - Every posted transfer ends DONE (all its UCX requests completed and
 *   released) or is retained in the process graveyard with its local ranges,
 *   on every exit path: success, error, timeout, peer failure. A retained
 *   transfer's bookkeeping (struct batch) is owned by the graveyard and never
 *   freed, because UCX may still invoke its completion callback.
 * - Arguments are validated completely (endpoint open, process not poisoned,
 *   remote known, every range inside a registered region, list lengths and
 *   range sizes equal) before the first operation of a call is posted.
 * - A request handle is released (ucp_request_free) only inside its own
 *   completion callback; no code path frees an incomplete request.
 * - Local regions are kept sorted by base and disjoint; a region with
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
 *   own on the data path and ep_mu makes every worker call mutually exclusive
 *   (ucp_worker_progress, posting, rkey unpack, ep create/close, mem map).
 *   UCX callbacks (completion, peer error) therefore run with ep_mu held, from
 *   whichever thread progresses; they only update counters and flags.
 * - Blocking calls post under ep_mu, then alternate progress (under ep_mu)
 *   and a brief release of ep_mu, so other callers and the progress thread get
 *   in between. Waiting threads all progress the worker; whichever completes a
 *   request updates the owning batch under ep_mu.
 * - The optional progress thread progresses the worker when nobody else does
 *   and sleeps on the worker's event fd (ucp_worker_arm) when idle, so a target
 *   serves emulated RMA (TCP) without any caller.
 * - Lock order: ep_mu, then the graveyard's mutex (leaf), then the abandoned
 *   list's mutex (leaf). Nothing calls back into the endpoint with ep_mu held.
 * - r_failed is written by the UCX error callback and read by waiters, both
 *   under ep_mu; it is also accessed atomically in case UCX ever invokes the
 *   callback from its async thread.
 *
 * Ownership
 * - The endpoint owns the UCX context, worker, its worker address, every
 *   region (memh and packed rkey; the memory itself only for alloc()), every
 *   remote (UCX ep, unpacked rkeys and their local mappings).
 * - The caller owns registered memory and the range arrays it passes.
 */
#include "endpoint.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <ucp/api/ucp.h>

#include "xfer/metadata.h"
#include "xfer/policy.h"

#define DEFAULT_MEMCPY_MAX (64 * 1024)
/* How long a failed peer's pending requests get to be purged by UCX. */
#define FAILED_GRACE_NS 50000000ull
/* How long close() waits for a UCX endpoint close to complete. */
#define EP_CLOSE_WAIT_NS 2000000000ull

typedef struct region {
    uint64_t r_base, r_len;
    ucp_mem_h r_memh;
    void *r_rkey; /* packed rkey (ucp_rkey_buffer_release) */
    size_t r_rkey_len;
    bool r_allocated; /* memory came from ucp_mem_map ALLOCATE */
    uint64_t r_busy;  /* posted ranges not yet ended */
} region;

typedef struct rregion {
    uint64_t rr_base, rr_len;
    ucp_rkey_h rr_rkey;
    uint8_t *rr_ptr; /* local mapping of the remote region (shared memory) or NULL */
} rregion;

typedef struct remote {
    char r_name[DP_MD_NAME_MAX + 1];
    uint64_t r_gen;
    ucp_ep_h r_ep;
    rregion *r_regs;
    uint32_t r_n_regs;
    int r_failed;    /* ucs_status_t; UCS_OK while healthy (atomic access) */
    uint64_t r_busy; /* ops in flight towards it */
    uint64_t r_retained;
    struct remote *r_next;
} remote;

/* One op of a call: its UCX requests and outcome. */
typedef struct batch {
    int b_pending;         /* UCX requests not yet completed */
    ucs_status_t b_status; /* first error reported by UCX */
    uint64_t b_done_ns;    /* when the last request completed, or the post did */
    /*
     * Retained in the graveyard (b_pending > 0 when its call ended): the
     * completion callback of its last request hands it to ep->released, and
     * reap_locked releases it from the graveyard: UCX no longer touches its
     * local ranges once every request of it completed.
     */
    bool b_retained;
    struct dp_endpoint *b_ep;
    struct remote *b_r;
    struct batch *b_next;
} batch;

struct dp_endpoint {
    char name[DP_MD_NAME_MAX + 1];
    dp_endpoint_opts opts;
    size_t memcpy_max; /* 0: fast path off */
    pthread_mutex_t mu;
    bool mu_init;
    bool closed;
    bool abandoned;
    ucp_context_h ctx;
    ucp_worker_h worker;
    ucp_address_t *waddr;
    size_t waddr_len;
    int efd; /* worker event fd, -1 if none */
    region *regs;
    size_t n_regs, cap_regs;
    remote *remotes; /* listed */
    remote *zombies; /* removed but kept: busy or retained */
    uint64_t gen;
    uint64_t n_retained;
    batch *released; /* retained batches whose last request completed */
    pthread_t thr;
    bool thr_started;
    int thr_stop; /* atomic */
    dp_endpoint_stats st;
    struct dp_endpoint *ab_next;
};

/* Endpoints closed with retained transfers: reachable forever, never freed. */
static pthread_mutex_t ab_mu = PTHREAD_MUTEX_INITIALIZER;
static dp_endpoint *ab_list;

/* ---- small helpers ---- */

static int ucx_fail(dp_detail *d, int code, ucs_status_t st, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int
ucx_fail(dp_detail *d, int code, ucs_status_t st, const char *fmt, ...)
{
    char what[DP_DETAIL_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return dp_fail(d, code, "%s: %s", what, ucs_status_string(st));
}

static void
lock(dp_endpoint *ep)
{
    pthread_mutex_lock(&ep->mu);
}

static void
unlock(dp_endpoint *ep)
{
    pthread_mutex_unlock(&ep->mu);
}

static bool
env_true(const char *name)
{
    const char *e = getenv(name);
    return e != NULL && (strcmp(e, "1") == 0 || strcasecmp(e, "y") == 0 ||
                         strcasecmp(e, "yes") == 0 || strcasecmp(e, "true") == 0);
}

static const char *
memlock_str(char *buf, size_t len)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_MEMLOCK, &rl) != 0)
        snprintf(buf, len, "unknown");
    else if (rl.rlim_cur == RLIM_INFINITY)
        snprintf(buf, len, "unlimited");
    else
        dp_fmt_size((uint64_t)rl.rlim_cur, buf, len);
    return buf;
}

/* Index of the region containing [addr, addr+n), or -1. */
static ptrdiff_t
region_find_locked(const dp_endpoint *ep, uint64_t addr, uint64_t n)
{
    size_t a = 0, b = ep->n_regs;
    while (a < b) { /* first region with base > addr */
        size_t m = a + (b - a) / 2;
        if (ep->regs[m].r_base <= addr)
            a = m + 1;
        else
            b = m;
    }
    if (a == 0)
        return -1;
    const region *r = &ep->regs[a - 1];
    if (addr - r->r_base <= r->r_len && n <= r->r_len - (addr - r->r_base))
        return (ptrdiff_t)(a - 1);
    return -1;
}

static rregion *
rregion_find(const remote *r, uint64_t addr, uint64_t n)
{
    size_t a = 0, b = r->r_n_regs;
    while (a < b) {
        size_t m = a + (b - a) / 2;
        if (r->r_regs[m].rr_base <= addr)
            a = m + 1;
        else
            b = m;
    }
    if (a == 0)
        return NULL;
    rregion *rr = &r->r_regs[a - 1];
    if (addr - rr->rr_base <= rr->rr_len && n <= rr->rr_len - (addr - rr->rr_base))
        return rr;
    return NULL;
}

static remote *
remote_find_locked(const dp_endpoint *ep, const char *name)
{
    for (remote *r = ep->remotes; r != NULL; r = r->r_next)
        if (strcmp(r->r_name, name) == 0)
            return r;
    return NULL;
}

static ucs_status_t
remote_failed(const remote *r)
{
    return (ucs_status_t)__atomic_load_n(&r->r_failed, __ATOMIC_ACQUIRE);
}

/* ---- UCX callbacks (run with ep_mu held, from whichever thread progresses) ---- */

static void
op_done_cb(void *request, ucs_status_t status, void *user_data)
{
    batch *b = user_data;
    if (status != UCS_OK && b->b_status == UCS_OK)
        b->b_status = status;
    if (--b->b_pending == 0) {
        b->b_done_ns = dp_now_ns();
        if (b->b_retained) {
            /* Freed later, outside the callback (reap_locked). */
            b->b_next = b->b_ep->released;
            b->b_ep->released = b;
        }
    }
    ucp_request_free(request);
}

/*
 * Retained transfers that ended after all: UCX completed every request of
 * theirs (done or failed), so nothing touches their local ranges any more.
 */
static void
reap_locked(dp_endpoint *ep)
{
    while (ep->released != NULL) {
        batch *b = ep->released;
        ep->released = b->b_next;
        dp_graveyard_release(b);
        b->b_r->r_retained--;
        ep->n_retained--;
        ep->st.transfers_released++;
        DP_LOG_I("endpoint %s: a retained transfer to %s ended (%s): its memory is "
                 "released",
                 ep->name, b->b_r->r_name, ucs_status_string(b->b_status));
        free(b);
    }
}

static void
ep_err_cb(void *arg, ucp_ep_h uep, ucs_status_t status)
{
    DP_UNUSED(uep);
    remote *r = arg;
    __atomic_store_n(&r->r_failed, (int)status, __ATOMIC_RELEASE);
}

/* ---- progress thread ---- */

static void *
progress_main(void *arg)
{
    dp_endpoint *ep = arg;
    unsigned idle_us = 1;
    while (!__atomic_load_n(&ep->thr_stop, __ATOMIC_ACQUIRE)) {
        lock(ep);
        unsigned n = 0, k;
        for (int i = 0; i < 64 && (k = ucp_worker_progress(ep->worker)) != 0; i++)
            n += k;
        ucs_status_t st = UCS_ERR_UNSUPPORTED;
        if (n == 0 && ep->efd >= 0)
            st = ucp_worker_arm(ep->worker);
        unlock(ep);
        if (n != 0 || st == UCS_ERR_BUSY) {
            idle_us = 1;
            continue;
        }
        if (st == UCS_OK) {
            /* Armed: sleep until the worker has an event (or stop signals it). */
            struct pollfd pfd = {.fd = ep->efd, .events = POLLIN};
            poll(&pfd, 1, 100);
        } else {
            /* No event fd: back off from 1 us to 1 ms while idle. */
            usleep(idle_us);
            idle_us = idle_us < 1000 ? idle_us * 2 : 1000;
        }
    }
    return NULL;
}

/* ---- create / close ---- */

void
dp_endpoint_opts_init(dp_endpoint_opts *o)
{
    memset(o, 0, sizeof *o);
    o->err_mode = DP_EP_ERR_PEER;
}

/* Set a UCX option in cfg unless the user's environment sets it (theirs wins). */
static void
config_default(ucp_config_t *cfg, const char *env_name, const char *name,
               const char *value)
{
    if (getenv(env_name) != NULL)
        return;
    ucs_status_t st = ucp_config_modify(cfg, name, value);
    if (st != UCS_OK)
        DP_LOG_W("endpoint: UCX option %s=%s not applied: %s", name, value,
                 ucs_status_string(st));
}

/* Whether UCX_TLS allows the posix/sysv transports (else their options warn). */
static bool
tls_may_use_mm(void)
{
    const char *t = getenv("UCX_TLS");
    if (t == NULL || *t == '\0' || t[0] == '^')
        return true;
    static const char *const mm[] = {"all", "sm", "shm", "mm", "posix", "sysv"};
    char buf[512];
    snprintf(buf, sizeof buf, "%s", t);
    char *save = NULL;
    for (char *tok = strtok_r(buf, ",", &save); tok != NULL;
         tok = strtok_r(NULL, ",", &save)) {
        if (*tok == '\\')
            tok++;
        for (size_t i = 0; i < DP_ARRAY_LEN(mm); i++)
            if (strcasecmp(tok, mm[i]) == 0)
                return true;
    }
    return false;
}

int
dp_endpoint_create(const char *name, const dp_endpoint_opts *opts, dp_endpoint **out,
                   dp_detail *d)
{
    *out = NULL;
    int rc = dp_md_check_name(name, name ? strlen(name) : 0, d);
    if (rc != DP_OK)
        return rc;
    dp_endpoint_opts o;
    if (opts != NULL)
        o = *opts;
    else
        dp_endpoint_opts_init(&o);
    if (o.err_mode != DP_EP_ERR_PEER && o.err_mode != DP_EP_ERR_NONE)
        return dp_fail(d, DP_EINVAL, "endpoint %s: unknown error mode %d", name,
                       (int)o.err_mode);
    if (o.require_rdma || env_true("DP_REQUIRE_RDMA")) {
        char desc[256];
        dp_detail pd;
        dp_detail_clear(&pd);
        if (dp_policy_check_rdma_only(NULL, desc, sizeof desc, &pd) != DP_OK)
            return dp_fail(d, DP_EPOLICY, "endpoint %s: require_rdma: %s", name, pd.msg);
        o.require_rdma = true;
        DP_LOG_I("endpoint %s: transport policy: %s", name, desc);
    }

    dp_endpoint *ep = calloc(1, sizeof *ep);
    if (ep == NULL)
        return dp_fail(d, DP_ENOMEM, "endpoint %s: out of memory", name);
    snprintf(ep->name, sizeof ep->name, "%s", name);
    ep->opts = o;
    ep->efd = -1;
    ep->memcpy_max = o.memcpy_max < 0    ? 0
                     : o.memcpy_max == 0 ? DEFAULT_MEMCPY_MAX
                                         : (size_t)o.memcpy_max;
    if (pthread_mutex_init(&ep->mu, NULL) != 0) {
        free(ep);
        return dp_fail(d, DP_ENOMEM, "endpoint %s: cannot create mutex", name);
    }
    ep->mu_init = true;

    ucp_config_t *cfg = NULL;
    ucs_status_t st = ucp_config_read(NULL, NULL, &cfg);
    if (st != UCS_OK) {
        rc = ucx_fail(d, DP_ETRANSFER, st, "endpoint %s: ucp_config_read", name);
        goto fail;
    }
    if (o.err_mode == DP_EP_ERR_PEER) {
        /*
         * Without this, peer error handling excludes the shared-memory transports
         * and a same-host endpoint gets only an emulated-RMA tcp lane (DESIGN 11).
         */
        if (getenv("UCX_POSIX_ERROR_HANDLING") == NULL &&
            getenv("UCX_SYSV_ERROR_HANDLING") == NULL && tls_may_use_mm())
            config_default(cfg, "UCX_MM_ERROR_HANDLING", "MM_ERROR_HANDLING", "y");
        /* Detect a dead same-host peer within seconds, not the default 20 s. */
        config_default(cfg, "UCX_KEEPALIVE_INTERVAL", "KEEPALIVE_INTERVAL", "1s");
    }
    ucp_params_t cp = {
        .field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_NAME,
        .features = UCP_FEATURE_RMA | UCP_FEATURE_WAKEUP,
        .name = ep->name,
    };
    st = ucp_init(&cp, cfg, &ep->ctx);
    ucp_config_release(cfg);
    if (st != UCS_OK) {
        ep->ctx = NULL;
        rc = ucx_fail(d, DP_ETRANSFER, st, "endpoint %s: ucp_init", name);
        goto fail;
    }
    ucp_worker_params_t wp = {
        .field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
        .thread_mode = UCS_THREAD_MODE_SERIALIZED,
    };
    st = ucp_worker_create(ep->ctx, &wp, &ep->worker);
    if (st != UCS_OK) {
        ep->worker = NULL;
        rc = ucx_fail(d, DP_ETRANSFER, st, "endpoint %s: ucp_worker_create", name);
        goto fail;
    }
    st = ucp_worker_get_address(ep->worker, &ep->waddr, &ep->waddr_len);
    if (st != UCS_OK) {
        ep->waddr = NULL;
        rc = ucx_fail(d, DP_ETRANSFER, st, "endpoint %s: ucp_worker_get_address", name);
        goto fail;
    }
    if (ep->waddr_len > DP_MD_ADDR_MAX) {
        rc = dp_fail(d, DP_ETRANSFER,
                     "endpoint %s: worker address has %zu bytes, limit %u", name,
                     ep->waddr_len, DP_MD_ADDR_MAX);
        goto fail;
    }
    if (o.progress_thread) {
        int fd;
        if (ucp_worker_get_efd(ep->worker, &fd) == UCS_OK)
            ep->efd = fd;
        int e = pthread_create(&ep->thr, NULL, progress_main, ep);
        if (e != 0) {
            rc = dp_fail_sys(d, e, "endpoint %s: progress thread", name);
            goto fail;
        }
        ep->thr_started = true;
    }
    *out = ep;
    return DP_OK;
fail:
    dp_endpoint_destroy(ep);
    return rc;
}

/* Wait (progressing) for a close request; true when it completed. */
static bool
wait_close_locked(dp_endpoint *ep, ucs_status_ptr_t req)
{
    if (req == NULL)
        return true;
    if (UCS_PTR_IS_ERR(req))
        return true; /* nothing left in flight for it */
    uint64_t deadline = dp_now_ns() + EP_CLOSE_WAIT_NS;
    while (ucp_request_check_status(req) == UCS_INPROGRESS) {
        if (dp_now_ns() > deadline)
            return false; /* leave the request to UCX; never free it while running */
        ucp_worker_progress(ep->worker);
    }
    ucp_request_free(req);
    return true;
}

/* Close a remote's UCX endpoint and free it (no transfers in flight or retained). */
static void
remote_free_locked(dp_endpoint *ep, remote *r)
{
    for (uint32_t i = 0; i < r->r_n_regs; i++)
        if (r->r_regs[i].rr_rkey != NULL)
            ucp_rkey_destroy(r->r_regs[i].rr_rkey);
    bool closed = true;
    if (r->r_ep != NULL) {
        ucp_request_param_t prm = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                                   .flags = UCP_EP_CLOSE_FLAG_FORCE};
        closed = wait_close_locked(ep, ucp_ep_close_nbx(r->r_ep, &prm));
    }
    free(r->r_regs);
    if (closed)
        free(r);
    else
        DP_LOG_W("endpoint %s: closing remote %s did not complete; its state is kept",
                 ep->name, r->r_name);
}

void
dp_endpoint_close(dp_endpoint *ep)
{
    if (ep == NULL)
        return;
    if (ep->thr_started) {
        __atomic_store_n(&ep->thr_stop, 1, __ATOMIC_RELEASE);
        lock(ep);
        if (ep->worker != NULL && ep->efd >= 0)
            ucp_worker_signal(ep->worker);
        unlock(ep);
        pthread_join(ep->thr, NULL);
        ep->thr_started = false;
    }
    if (!ep->mu_init)
        return;
    lock(ep);
    if (ep->closed) {
        unlock(ep);
        return;
    }
    ep->closed = true;
    if (ep->n_retained > 0) {
        /*
         * A retained transfer may still run: keep the context, worker, endpoints,
         * keys and memory registrations, for good.
         */
        ep->abandoned = true;
        DP_LOG_W("endpoint %s: closed with %" PRIu64 " unfinished transfers: its UCX "
                 "worker and memory are kept for the life of the process",
                 ep->name, ep->n_retained);
        unlock(ep);
        pthread_mutex_lock(&ab_mu);
        ep->ab_next = ab_list;
        ab_list = ep;
        pthread_mutex_unlock(&ab_mu);
        return;
    }
    remote *lists[2] = {ep->remotes, ep->zombies};
    ep->remotes = ep->zombies = NULL;
    for (int k = 0; k < 2; k++) {
        for (remote *r = lists[k], *next; r != NULL; r = next) {
            next = r->r_next;
            remote_free_locked(ep, r);
        }
    }
    for (size_t i = 0; i < ep->n_regs; i++) {
        region *g = &ep->regs[i];
        if (g->r_rkey != NULL)
            ucp_rkey_buffer_release(g->r_rkey);
        ucs_status_t st = ucp_mem_unmap(ep->ctx, g->r_memh);
        if (st != UCS_OK)
            DP_LOG_W("endpoint %s: ucp_mem_unmap: %s", ep->name, ucs_status_string(st));
    }
    free(ep->regs);
    ep->regs = NULL;
    ep->n_regs = ep->cap_regs = 0;
    if (ep->waddr != NULL)
        ucp_worker_release_address(ep->worker, ep->waddr);
    ep->waddr = NULL;
    if (ep->worker != NULL)
        ucp_worker_destroy(ep->worker);
    ep->worker = NULL;
    if (ep->ctx != NULL)
        ucp_cleanup(ep->ctx);
    ep->ctx = NULL;
    unlock(ep);
}

void
dp_endpoint_destroy(dp_endpoint *ep)
{
    if (ep == NULL)
        return;
    dp_endpoint_close(ep);
    if (ep->abandoned)
        return; /* owned by ab_list now */
    if (ep->mu_init)
        pthread_mutex_destroy(&ep->mu);
    free(ep);
}

const char *
dp_endpoint_name(const dp_endpoint *ep)
{
    return ep->name;
}

/* ---- memory ---- */

static int
check_open_locked(const dp_endpoint *ep, dp_detail *d)
{
    if (ep->closed)
        return dp_fail(d, DP_EINVAL, "endpoint %s is closed", ep->name);
    return DP_OK;
}

static int
region_add_locked(dp_endpoint *ep, uint64_t base, uint64_t len, bool allocate,
                  void **addr_out, dp_detail *d)
{
    char lim[32], sz[32];
    if (!allocate) {
        if (len == 0 || base + len < base)
            goto overlap_or_bad;
        for (size_t i = 0; i < ep->n_regs; i++)
            if (ep->regs[i].r_base < base + len &&
                base < ep->regs[i].r_base + ep->regs[i].r_len)
                goto overlap_or_bad;
    }
    if (ep->n_regs == ep->cap_regs) {
        size_t cap = ep->cap_regs ? ep->cap_regs * 2 : 8;
        region *p = realloc(ep->regs, cap * sizeof *p);
        if (p == NULL)
            return dp_fail(d, DP_ENOMEM, "endpoint %s: out of memory", ep->name);
        ep->regs = p;
        ep->cap_regs = cap;
    }
    ucp_mem_map_params_t mp = {
        .field_mask = UCP_MEM_MAP_PARAM_FIELD_LENGTH | UCP_MEM_MAP_PARAM_FIELD_FLAGS,
        .length = len,
        .flags = allocate ? UCP_MEM_MAP_ALLOCATE : 0,
    };
    if (!allocate) {
        mp.field_mask |= UCP_MEM_MAP_PARAM_FIELD_ADDRESS;
        mp.address = (void *)(uintptr_t)base;
    }
    ucp_mem_h memh;
    ucs_status_t st = ucp_mem_map(ep->ctx, &mp, &memh);
    if (st != UCS_OK)
        return dp_fail(d, st == UCS_ERR_NO_MEMORY ? DP_ENOMEM : DP_ETRANSFER,
                       "endpoint %s: %s of %s failed: %s (RLIMIT_MEMLOCK %s; RDMA "
                       "registration of large regions needs `ulimit -l unlimited`)",
                       ep->name, allocate ? "allocation" : "registration",
                       dp_fmt_size(len, sz, sizeof sz), ucs_status_string(st),
                       memlock_str(lim, sizeof lim));
    if (allocate) {
        ucp_mem_attr_t ma = {.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS};
        st = ucp_mem_query(memh, &ma);
        if (st != UCS_OK) {
            ucp_mem_unmap(ep->ctx, memh);
            return ucx_fail(d, DP_ETRANSFER, st, "endpoint %s: ucp_mem_query", ep->name);
        }
        base = (uint64_t)(uintptr_t)ma.address;
    }
    void *rkey = NULL;
    size_t rkey_len = 0;
    st = ucp_rkey_pack(ep->ctx, memh, &rkey, &rkey_len);
    if (st != UCS_OK || rkey_len == 0 || rkey_len > DP_MD_RKEY_MAX) {
        if (st == UCS_OK)
            ucp_rkey_buffer_release(rkey);
        ucp_mem_unmap(ep->ctx, memh);
        return dp_fail(d, DP_ETRANSFER, "endpoint %s: ucp_rkey_pack: %s (%zu bytes)",
                       ep->name, ucs_status_string(st), rkey_len);
    }
    size_t pos = 0;
    while (pos < ep->n_regs && ep->regs[pos].r_base < base)
        pos++;
    memmove(ep->regs + pos + 1, ep->regs + pos, (ep->n_regs - pos) * sizeof *ep->regs);
    ep->regs[pos] = (region){.r_base = base,
                             .r_len = len,
                             .r_memh = memh,
                             .r_rkey = rkey,
                             .r_rkey_len = rkey_len,
                             .r_allocated = allocate};
    ep->n_regs++;
    ep->gen++;
    if (addr_out != NULL)
        *addr_out = (void *)(uintptr_t)base;
    return DP_OK;
overlap_or_bad:
    if (len == 0 || base + len < base)
        return dp_fail(d, DP_EINVAL,
                       "endpoint %s: cannot register %" PRIu64 " bytes at 0x%" PRIx64,
                       ep->name, len, base);
    return dp_fail(d, DP_EEXIST,
                   "endpoint %s: [0x%" PRIx64 ", +%" PRIu64
                   ") overlaps a registered region",
                   ep->name, base, len);
}

int
dp_endpoint_register(dp_endpoint *ep, void *addr, size_t len, dp_detail *d)
{
    if (addr == NULL || len == 0)
        return dp_fail(d, DP_EINVAL,
                       "endpoint %s: register needs memory (addr %p, %zu "
                       "bytes)",
                       ep->name, addr, len);
    lock(ep);
    int rc = check_open_locked(ep, d);
    if (rc == DP_OK)
        rc = region_add_locked(ep, (uint64_t)(uintptr_t)addr, len, false, NULL, d);
    unlock(ep);
    return rc;
}

int
dp_endpoint_alloc(dp_endpoint *ep, size_t len, void **addr, dp_detail *d)
{
    *addr = NULL;
    if (len == 0)
        return dp_fail(d, DP_EINVAL, "endpoint %s: alloc of 0 bytes", ep->name);
    /*
     * UCX backs this memory with a shared-memory file that it fills: a size
     * beyond the host's RAM would take all of it (and tmpfs) before failing.
     */
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    if (pages > 0 && psz > 0 && (uint64_t)len > (uint64_t)pages * (uint64_t)psz)
        return dp_fail(d, DP_ENOMEM,
                       "endpoint %s: alloc of %zu bytes is more than this host's "
                       "memory (%" PRIu64 " bytes); ask for less",
                       ep->name, len, (uint64_t)pages * (uint64_t)psz);
    lock(ep);
    int rc = check_open_locked(ep, d);
    if (rc == DP_OK)
        rc = region_add_locked(ep, 0, len, true, addr, d);
    unlock(ep);
    return rc;
}

int
dp_endpoint_deregister(dp_endpoint *ep, void *addr, dp_detail *d)
{
    uint64_t base = (uint64_t)(uintptr_t)addr;
    lock(ep);
    int rc = check_open_locked(ep, d);
    if (rc != DP_OK)
        goto out;
    size_t i;
    for (i = 0; i < ep->n_regs && ep->regs[i].r_base != base; i++) {
    }
    if (i == ep->n_regs) {
        rc = dp_fail(d, DP_ENOTFOUND, "endpoint %s: no region starts at %p", ep->name,
                     addr);
        goto out;
    }
    region *g = &ep->regs[i];
    if (g->r_busy > 0 || dp_graveyard_touches(g->r_base, g->r_len)) {
        rc = dp_fail(d, DP_EBUSY,
                     "endpoint %s: region %p (%" PRIu64 " bytes) is %s; it "
                     "stays registered and its memory must not be reused",
                     ep->name, addr, g->r_len,
                     g->r_busy > 0 ? "in use by a running transfer"
                                   : "touched by an unfinished transfer");
        goto out;
    }
    ucp_rkey_buffer_release(g->r_rkey);
    ucs_status_t st = ucp_mem_unmap(ep->ctx, g->r_memh);
    memmove(ep->regs + i, ep->regs + i + 1, (ep->n_regs - i - 1) * sizeof *ep->regs);
    ep->n_regs--;
    ep->gen++;
    if (st != UCS_OK)
        rc = ucx_fail(d, DP_ETRANSFER, st, "endpoint %s: ucp_mem_unmap", ep->name);
out:
    unlock(ep);
    return rc;
}

/* ---- metadata and remotes ---- */

/* This process's UCX version as metadata carries it: major << 24 | minor << 16 | release.
 */
static uint32_t
ucx_version(void)
{
    unsigned major = 0, minor = 0, release = 0;
    ucp_get_version(&major, &minor, &release);
    return (uint32_t)(major & 0xff) << 24 | (uint32_t)(minor & 0xff) << 16 |
           (uint32_t)(release & 0xffff);
}

int
dp_endpoint_metadata(dp_endpoint *ep, uint8_t **out, size_t *len, dp_detail *d)
{
    *out = NULL;
    *len = 0;
    lock(ep);
    int rc = check_open_locked(ep, d);
    if (rc != DP_OK) {
        unlock(ep);
        return rc;
    }
    dp_md_region *mr = calloc(ep->n_regs ? ep->n_regs : 1, sizeof *mr);
    if (mr == NULL) {
        unlock(ep);
        return dp_fail(d, DP_ENOMEM, "endpoint %s: out of memory", ep->name);
    }
    for (size_t i = 0; i < ep->n_regs; i++)
        mr[i] = (dp_md_region){.base = ep->regs[i].r_base,
                               .len = ep->regs[i].r_len,
                               .rkey = ep->regs[i].r_rkey,
                               .rkey_len = (uint32_t)ep->regs[i].r_rkey_len};
    dp_buf b;
    dp_buf_init(&b);
    rc = dp_md_encode(&b, ep->name, ep->gen, ucx_version(), ep->waddr, ep->waddr_len, mr,
                      ep->n_regs, d);
    unlock(ep);
    free(mr);
    if (rc != DP_OK) {
        dp_buf_fini(&b);
        return rc;
    }
    *out = dp_buf_steal(&b, len);
    return DP_OK;
}

/* Fault in a remote's shared-memory mapping once, so first transfers run at full speed.
 */
static void
prefault(uint8_t *p, uint64_t len)
{
    long pg = sysconf(_SC_PAGESIZE);
    uintptr_t lo = (uintptr_t)p & ~((uintptr_t)pg - 1);
    uintptr_t hi = (uintptr_t)p + len;
#ifdef MADV_POPULATE_WRITE
    if (madvise((void *)lo, hi - lo, MADV_POPULATE_WRITE) == 0)
        return;
#endif
    /* Older kernels: a read per page maps it; a later write only upgrades it. */
    for (uintptr_t a = (uintptr_t)p; a < hi; a += (uintptr_t)pg)
        (void)*(volatile uint8_t *)a;
}

int
dp_endpoint_add_remote(dp_endpoint *ep, const void *md_bytes, size_t len, char *name_out,
                       dp_detail *d)
{
    dp_md md;
    int rc = dp_md_parse(md_bytes, len, &md, d);
    if (rc != DP_OK)
        return rc;
    uint32_t mine = ucx_version();
    if ((md.xver >> 16) != (mine >> 16)) {
        rc = dp_fail(d, DP_EPROTO,
                     "endpoint %s: remote %s runs UCX %u.%u.%u and this process UCX "
                     "%u.%u.%u: their worker addresses and keys do not mix; use the same "
                     "UCX version on both",
                     ep->name, md.name, md.xver >> 24, (md.xver >> 16) & 0xff,
                     md.xver & 0xffff, mine >> 24, (mine >> 16) & 0xff, mine & 0xffff);
        dp_md_fini(&md);
        return rc;
    }
    remote *r = calloc(1, sizeof *r);
    if (r == NULL || (md.n_regions > 0 &&
                      (r->r_regs = calloc(md.n_regions, sizeof *r->r_regs)) == NULL)) {
        free(r);
        dp_md_fini(&md);
        return dp_fail(d, DP_ENOMEM, "endpoint %s: out of memory", ep->name);
    }
    snprintf(r->r_name, sizeof r->r_name, "%s", md.name);
    r->r_gen = md.gen;
    r->r_failed = UCS_OK;
    lock(ep);
    rc = check_open_locked(ep, d);
    if (rc != DP_OK)
        goto fail_locked;
    ucp_ep_params_t epp = {
        .field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS |
                      UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                      UCP_EP_PARAM_FIELD_ERR_HANDLER,
        .address = (const ucp_address_t *)md.addr,
        .err_mode = ep->opts.err_mode == DP_EP_ERR_PEER ? UCP_ERR_HANDLING_MODE_PEER
                                                        : UCP_ERR_HANDLING_MODE_NONE,
        .err_handler = {.cb = ep_err_cb, .arg = r},
    };
    ucs_status_t st = ucp_ep_create(ep->worker, &epp, &r->r_ep);
    if (st != UCS_OK) {
        r->r_ep = NULL;
        rc = ucx_fail(d, DP_ETRANSFER, st, "endpoint %s: connect to %s", ep->name,
                      md.name);
        goto fail_locked;
    }
    for (uint32_t i = 0; i < md.n_regions; i++) {
        rregion *rr = &r->r_regs[i];
        rr->rr_base = md.regions[i].base;
        rr->rr_len = md.regions[i].len;
        st = ucp_ep_rkey_unpack(r->r_ep, md.regions[i].rkey, &rr->rr_rkey);
        if (st != UCS_OK) {
            rr->rr_rkey = NULL;
            rc = ucx_fail(d, DP_ETRANSFER, st, "endpoint %s: remote %s region %u: rkey",
                          ep->name, md.name, i);
            goto fail_locked;
        }
        r->r_n_regs = i + 1;
        void *p = NULL;
        if (ucp_rkey_ptr(rr->rr_rkey, rr->rr_base, &p) == UCS_OK)
            rr->rr_ptr = p;
    }
    unlock(ep);
    /* The remote is not published yet: nothing else can unmap these mappings. */
    for (uint32_t i = 0; i < r->r_n_regs; i++)
        if (r->r_regs[i].rr_ptr != NULL)
            prefault(r->r_regs[i].rr_ptr, r->r_regs[i].rr_len);
    lock(ep);
    rc = check_open_locked(ep, d);
    if (rc != DP_OK)
        goto fail_locked;
    /* Replace a remote of the same name (its metadata may have changed). */
    for (remote **pp = &ep->remotes; *pp != NULL; pp = &(*pp)->r_next) {
        remote *old = *pp;
        if (strcmp(old->r_name, r->r_name) != 0)
            continue;
        *pp = old->r_next;
        if (old->r_busy > 0 || old->r_retained > 0) {
            old->r_next = ep->zombies;
            ep->zombies = old;
        } else {
            remote_free_locked(ep, old);
        }
        break;
    }
    r->r_next = ep->remotes;
    ep->remotes = r;
    unlock(ep);
    if (name_out != NULL)
        snprintf(name_out, DP_MD_NAME_MAX + 1, "%s", md.name);
    dp_md_fini(&md);
    return DP_OK;
fail_locked:
    if (ep->closed) {
        /* The worker is gone with everything made from it. */
        free(r->r_regs);
        free(r);
    } else {
        remote_free_locked(ep, r);
    }
    unlock(ep);
    dp_md_fini(&md);
    return rc;
}

bool
dp_endpoint_has_remote(dp_endpoint *ep, const char *name)
{
    if (name == NULL)
        return false;
    lock(ep);
    bool has = !ep->closed && remote_find_locked(ep, name) != NULL;
    unlock(ep);
    return has;
}

int
dp_endpoint_remove_remote(dp_endpoint *ep, const char *name, dp_detail *d)
{
    lock(ep);
    int rc = check_open_locked(ep, d);
    if (rc != DP_OK)
        goto out;
    rc = dp_fail(d, DP_ENOTFOUND, "endpoint %s: no remote named %s", ep->name,
                 name ? name : "(null)");
    for (remote **pp = &ep->remotes; name != NULL && *pp != NULL; pp = &(*pp)->r_next) {
        remote *r = *pp;
        if (strcmp(r->r_name, name) != 0)
            continue;
        *pp = r->r_next;
        if (r->r_busy > 0 || r->r_retained > 0) {
            r->r_next = ep->zombies;
            ep->zombies = r;
        } else {
            remote_free_locked(ep, r);
        }
        rc = DP_OK;
        break;
    }
out:
    unlock(ep);
    return rc;
}

int
dp_endpoint_describe_remote(dp_endpoint *ep, const char *name, char **out, dp_detail *d)
{
    *out = NULL;
    lock(ep);
    int rc = check_open_locked(ep, d);
    remote *r = rc == DP_OK && name != NULL ? remote_find_locked(ep, name) : NULL;
    if (rc == DP_OK && r == NULL)
        rc = dp_fail(d, DP_ENOTFOUND, "endpoint %s: no remote named %s", ep->name,
                     name ? name : "(null)");
    if (rc == DP_OK) {
        size_t n = 0;
        FILE *f = open_memstream(out, &n);
        if (f == NULL) {
            rc = dp_fail(d, DP_ENOMEM, "endpoint %s: out of memory", ep->name);
        } else {
            ucp_ep_print_info(r->r_ep, f);
            for (uint32_t i = 0; i < r->r_n_regs; i++)
                fprintf(f, "# region %u: %" PRIu64 " bytes, %s\n", i, r->r_regs[i].rr_len,
                        r->r_regs[i].rr_ptr ? "mapped here (shared memory)"
                                            : "not mapped here");
            fclose(f);
        }
    }
    unlock(ep);
    return rc;
}

/* ---- transfers ---- */

/* Per-op state of one call. */
typedef struct opstate {
    const dp_xfer_desc *o;
    remote *r;
    batch *b;          /* NULL until posted */
    uint64_t deadline; /* dp_now_ns() clock */
    uint64_t fail_deadline;
    int rc;
    bool posted, finished;
    bool via_ucx;    /* some range went to UCX (not only the memcpy path) */
    dp_xfer_end end; /* what became of it (for the caller's abort) */
} opstate;

static const char *
op_name(dp_xfer_op op)
{
    return op == DP_XFER_WRITE ? "WRITE" : "READ";
}

/* Check op i completely; DP_EINVAL with a detail if anything is wrong. */
static int
validate_locked(dp_endpoint *ep, const dp_xfer_desc *o, size_t i, remote **rout,
                dp_detail *d)
{
    if (o->op != DP_XFER_WRITE && o->op != DP_XFER_READ)
        return dp_fail(d, DP_EINVAL, "op %zu: unknown operation %d", i, (int)o->op);
    if (o->remote_name == NULL)
        return dp_fail(d, DP_EINVAL, "op %zu: no remote name", i);
    remote *r = remote_find_locked(ep, o->remote_name);
    if (r == NULL)
        return dp_fail(d, DP_EINVAL, "op %zu: unknown remote %s (add_remote first)", i,
                       o->remote_name);
    if (o->n_local != o->n_remote)
        return dp_fail(d, DP_EINVAL, "op %zu: %zu local ranges but %zu remote ranges", i,
                       o->n_local, o->n_remote);
    if (o->n_local > 0 && (o->local == NULL || o->remote == NULL))
        return dp_fail(d, DP_EINVAL, "op %zu: range list is NULL", i);
    for (size_t k = 0; k < o->n_local; k++) {
        const dp_range *l = &o->local[k], *m = &o->remote[k];
        if (l->nbytes != m->nbytes)
            return dp_fail(d, DP_EINVAL,
                           "op %zu range %zu: local has %" PRIu64
                           " bytes, remote %" PRIu64,
                           i, k, l->nbytes, m->nbytes);
        if (l->nbytes == 0)
            continue;
        if (region_find_locked(ep, l->addr, l->nbytes) < 0)
            return dp_fail(d, DP_EINVAL,
                           "op %zu range %zu: local [0x%" PRIx64 ", +%" PRIu64
                           ") is not inside a region registered with endpoint %s",
                           i, k, l->addr, l->nbytes, ep->name);
        if (rregion_find(r, m->addr, m->nbytes) == NULL)
            return dp_fail(d, DP_EINVAL,
                           "op %zu range %zu: remote [0x%" PRIx64 ", +%" PRIu64
                           ") is not inside a region of remote %s",
                           i, k, m->addr, m->nbytes, r->r_name);
    }
    *rout = r;
    return DP_OK;
}

/* Mark/unmark the local regions of an op's ranges as in use. */
static void
busy_locked(dp_endpoint *ep, const dp_xfer_desc *o, int delta)
{
    for (size_t k = 0; k < o->n_local; k++) {
        if (o->local[k].nbytes == 0)
            continue;
        ptrdiff_t g = region_find_locked(ep, o->local[k].addr, o->local[k].nbytes);
        DP_ASSERT(g >= 0);
        ep->regs[g].r_busy += (uint64_t)(int64_t)delta;
    }
}

/*
 * Every validated op holds its remote and its local regions busy from
 * validation to its end, so that neither can go while the batch is posted with
 * the lock dropped between ops (for a done callback). finish_locked ends the
 * hold of a posted op; this ends that of an op never posted.
 */
static void
reserve_locked(dp_endpoint *ep, opstate *s)
{
    s->r->r_busy++;
    busy_locked(ep, s->o, +1);
}

static void
unreserve_locked(dp_endpoint *ep, opstate *s)
{
    s->finished = true;
    s->r->r_busy--;
    busy_locked(ep, s->o, -1);
}

/* Post every range of op s (validated and reserved). Sets s->rc for immediate
 * failures. */
static void
post_locked(dp_endpoint *ep, opstate *s, dp_detail *det)
{
    const dp_xfer_desc *o = s->o;
    remote *r = s->r;
    ucs_status_t fst = remote_failed(r);
    if (fst != UCS_OK) {
        s->rc = dp_fail(det, DP_ETRANSFER, "%s to %s: peer failed: %s (nothing posted)",
                        op_name(o->op), r->r_name, ucs_status_string(fst));
        unreserve_locked(ep, s);
        return;
    }
    batch *b = calloc(1, sizeof *b);
    if (b == NULL) {
        s->rc = dp_fail(det, DP_ENOMEM, "%s to %s: out of memory (nothing posted)",
                        op_name(o->op), r->r_name);
        unreserve_locked(ep, s);
        return;
    }
    s->b = b;
    s->posted = true;
    bool any_ucx = false;
    for (size_t k = 0; k < o->n_local && b->b_status == UCS_OK; k++) {
        const dp_range *l = &o->local[k], *m = &o->remote[k];
        if (l->nbytes == 0)
            continue;
        rregion *rr = rregion_find(r, m->addr, m->nbytes);
        void *lp = (void *)(uintptr_t)l->addr;
        if (rr->rr_ptr != NULL && l->nbytes <= ep->memcpy_max) {
            uint8_t *rp = rr->rr_ptr + (m->addr - rr->rr_base);
            if (o->op == DP_XFER_WRITE)
                memcpy(rp, lp, l->nbytes);
            else
                memcpy(lp, rp, l->nbytes);
            ep->st.memcpy_ranges++;
            continue;
        }
        ptrdiff_t g = region_find_locked(ep, l->addr, l->nbytes);
        ucp_request_param_t prm = {
            .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                            UCP_OP_ATTR_FIELD_MEMH,
            .cb.send = op_done_cb,
            .user_data = b,
            .memh = ep->regs[g].r_memh,
        };
        ucs_status_ptr_t sp =
            o->op == DP_XFER_WRITE
                ? ucp_put_nbx(r->r_ep, lp, l->nbytes, m->addr, rr->rr_rkey, &prm)
                : ucp_get_nbx(r->r_ep, lp, l->nbytes, m->addr, rr->rr_rkey, &prm);
        ep->st.ucx_ranges++;
        any_ucx = true;
        s->via_ucx = true;
        if (UCS_PTR_IS_ERR(sp))
            b->b_status = UCS_PTR_STATUS(sp);
        else if (sp != NULL)
            b->b_pending++;
    }
    /* A put is complete locally at its callback; the flush makes it remote-visible. */
    if (o->op == DP_XFER_WRITE && any_ucx && b->b_status == UCS_OK) {
        ucp_request_param_t prm = {
            .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA,
            .cb.send = op_done_cb,
            .user_data = b,
        };
        ucs_status_ptr_t sp = ucp_ep_flush_nbx(r->r_ep, &prm);
        if (UCS_PTR_IS_ERR(sp))
            b->b_status = UCS_PTR_STATUS(sp);
        else if (sp != NULL)
            b->b_pending++;
    }
    if (b->b_pending == 0)
        b->b_done_ns = dp_now_ns(); /* done at its post (memcpy, inline completions) */
}

/* End op s: DONE (batch freed) or retained (batch handed to the graveyard). */
static void
finish_locked(dp_endpoint *ep, opstate *s, bool deadline_passed, dp_detail *det)
{
    const dp_xfer_desc *o = s->o;
    remote *r = s->r;
    batch *b = s->b;
    s->finished = true;
    r->r_busy--;
    busy_locked(ep, o, -1);
    s->end = s->via_ucx ? DP_XFER_ENDED : DP_XFER_ENDED_LOCAL;
    if (b->b_pending == 0) {
        if (b->b_status == UCS_OK && b->b_done_ns > s->deadline) {
            /*
             * Done, but only after the deadline (a long post, or seen late
             * between two looks): the caller's deadline may guard something (a
             * READ within a pin's life), so it is not reported as done in time.
             */
            s->rc = dp_fail(det, DP_ETIMEDOUT,
                            "%s of %zu ranges to %s ended %.3f ms after its deadline",
                            op_name(o->op), o->n_local, r->r_name,
                            (double)(b->b_done_ns - s->deadline) / 1e6);
            ep->st.transfers_failed++;
        } else if (b->b_status == UCS_OK) {
            s->rc = DP_OK;
            ep->st.transfers_ok++;
        } else {
            s->rc = dp_fail(det, DP_ETRANSFER, "%s of %zu ranges to %s failed: %s",
                            op_name(o->op), o->n_local, r->r_name,
                            ucs_status_string(b->b_status));
            ep->st.transfers_failed++;
        }
        free(b);
        s->b = NULL;
        return;
    }
    ucs_status_t fst = remote_failed(r);
    char what[2 * DP_MD_NAME_MAX + 96];
    snprintf(what, sizeof what, "%s of %zu ranges to %s from endpoint %s", op_name(o->op),
             o->n_local, r->r_name, ep->name);
    b->b_retained = true;
    b->b_ep = ep;
    b->b_r = r;
    dp_graveyard_retain(b, o->local, o->n_local, what);
    s->b = NULL;
    s->end = DP_XFER_UNFINISHED;
    r->r_retained++;
    ep->n_retained++;
    ep->st.transfers_retained++;
    ep->st.transfers_failed++;
    if (fst != UCS_OK || b->b_status != UCS_OK || !deadline_passed)
        s->rc = dp_fail(det, DP_ETRANSFER,
                        "%s failed (%s) with %d operations unfinished: retained, its "
                        "local memory must not be reused",
                        what, ucs_status_string(fst != UCS_OK ? fst : b->b_status),
                        b->b_pending);
    else
        s->rc = dp_fail(det, DP_ETIMEDOUT,
                        "%s timed out with %d operations unfinished: retained, its local "
                        "memory must not be reused",
                        what, b->b_pending);
}

/* The engine behind transfer and transfer_many; details may be NULL. */
static int
run_ops(dp_endpoint *ep, const dp_xfer_desc *ops, size_t n_ops, double timeout_s,
        int *results, dp_detail *details, dp_xfer_end *ends, dp_xfer_done_fn on_done,
        void *ctx, dp_detail *d)
{
    if (ends != NULL)
        for (size_t i = 0; i < n_ops; i++)
            ends[i] = DP_XFER_NOT_POSTED;
    uint64_t t0 = dp_now_ns();
    if (!(timeout_s > 0) || !isfinite(timeout_s) || timeout_s > 1e9) {
        for (size_t i = 0; i < n_ops; i++) {
            results[i] = DP_EINVAL;
            if (details != NULL)
                dp_fail(&details[i], DP_EINVAL, "timeout %g s: must be finite and > 0",
                        timeout_s);
        }
        return dp_fail(d, DP_EINVAL, "timeout %g s: must be finite and > 0", timeout_s);
    }
    uint64_t deadline = t0 + (uint64_t)(timeout_s * 1e9);
    opstate *ss = calloc(n_ops ? n_ops : 1, sizeof *ss);
    if (ss == NULL) {
        /* Nothing was posted: every op says so, as for invalid arguments. */
        for (size_t i = 0; i < n_ops; i++) {
            results[i] = DP_ENOMEM;
            if (details != NULL)
                dp_fail(&details[i], DP_ENOMEM,
                        "transfer: out of memory (nothing posted)");
        }
        return dp_fail(d, DP_ENOMEM, "transfer: out of memory");
    }
    dp_detail vd;
    dp_detail_clear(&vd);
    lock(ep);
    int rc = check_open_locked(ep, &vd);
    if (rc == DP_OK)
        rc = dp_graveyard_check(&vd);
    for (size_t i = 0; rc == DP_OK && i < n_ops; i++) {
        ss[i].o = &ops[i];
        ss[i].deadline = deadline;
        rc = validate_locked(ep, &ops[i], i, &ss[i].r, &vd);
    }
    if (rc != DP_OK) {
        unlock(ep);
        for (size_t i = 0; i < n_ops; i++) {
            results[i] = rc;
            if (details != NULL)
                dp_fail(&details[i], rc, "%s", vd.msg);
        }
        dp_fail(d, rc, "%s", vd.msg);
        free(ss);
        return rc;
    }
    for (size_t i = 0; i < n_ops; i++)
        reserve_locked(ep, &ss[i]);
    for (size_t i = 0; i < n_ops; i++) {
        opstate *s = &ss[i];
        dp_detail *det = details ? &details[i] : NULL;
        if (i > 0 && dp_now_ns() >= deadline) {
            /* Earlier posts or callbacks used the whole time: not posted. */
            s->rc = dp_fail(det, DP_ETIMEDOUT,
                            "%s to %s: the deadline passed before it was posted "
                            "(nothing posted)",
                            op_name(s->o->op), s->r->r_name);
            unreserve_locked(ep, s);
        } else {
            post_locked(ep, s, det);
        }
        /* Done at post (memcpy path, or failed): ended now, so a callback can
         * act on it while the next op is posted. */
        if (s->posted && s->b->b_pending == 0)
            finish_locked(ep, s, false, det);
        if (s->finished && on_done != NULL) {
            unlock(ep);
            on_done(ctx, i, s->rc);
            lock(ep);
        }
    }

    size_t open = 0;
    for (size_t i = 0; i < n_ops; i++)
        open += ss[i].posted && !ss[i].finished;
    while (open > 0) {
        uint64_t now = dp_now_ns();
        for (size_t i = 0; i < n_ops; i++) {
            opstate *s = &ss[i];
            if (!s->posted || s->finished)
                continue;
            if (s->b->b_pending > 0 && remote_failed(s->r) != UCS_OK &&
                s->fail_deadline == 0)
                s->fail_deadline = now + FAILED_GRACE_NS;
            bool out =
                now >= deadline || (s->fail_deadline != 0 && now >= s->fail_deadline);
            if (s->b->b_pending == 0 || out) {
                finish_locked(ep, s, now >= deadline, details ? &details[i] : NULL);
                open--;
                if (on_done != NULL) {
                    unlock(ep);
                    on_done(ctx, i, s->rc);
                    lock(ep);
                }
            }
        }
        if (open == 0)
            break;
        unsigned n = ucp_worker_progress(ep->worker);
        reap_locked(ep);
        unlock(ep);
        if (n == 0)
            sched_yield();
        lock(ep);
    }
    reap_locked(ep);
    unlock(ep);

    size_t nfail = 0, first = 0;
    for (size_t i = 0; i < n_ops; i++) {
        results[i] = ss[i].rc;
        if (ends != NULL)
            ends[i] = ss[i].end;
        if (ss[i].rc != DP_OK && nfail++ == 0)
            first = i;
    }
    if (nfail > 0) {
        rc = ss[first].rc;
        if (d != NULL) {
            if (details != NULL)
                dp_fail(d, rc, "%zu of %zu transfers failed; first, op %zu: %s", nfail,
                        n_ops, first, details[first].msg);
            else
                dp_fail(d, rc, "%zu of %zu transfers failed; first: op %zu", nfail, n_ops,
                        first);
        }
    }
    free(ss);
    return rc;
}

int
dp_endpoint_transfer(dp_endpoint *ep, dp_xfer_op op, const dp_range *local,
                     size_t n_local, const dp_range *remote_ranges, size_t n_remote,
                     const char *remote_name, double timeout_s, dp_detail *d)
{
    dp_xfer_desc o = {.op = op,
                      .local = local,
                      .n_local = n_local,
                      .remote = remote_ranges,
                      .n_remote = n_remote,
                      .remote_name = remote_name};
    int result;
    dp_detail det;
    dp_detail_clear(&det);
    int rc = run_ops(ep, &o, 1, timeout_s, &result, &det, NULL, NULL, NULL, NULL);
    if (rc != DP_OK && d != NULL)
        dp_fail(d, rc, "%s", det.msg);
    return rc;
}

int
dp_endpoint_transfer_many(dp_endpoint *ep, const dp_xfer_desc *ops, size_t n_ops,
                          double timeout_s, int *results, dp_detail *details,
                          dp_detail *d)
{
    return dp_endpoint_transfer_many_cb(ep, ops, n_ops, timeout_s, results, details, NULL,
                                        NULL, d);
}

int
dp_endpoint_transfer_many_cb(dp_endpoint *ep, const dp_xfer_desc *ops, size_t n_ops,
                             double timeout_s, int *results, dp_detail *details,
                             dp_xfer_done_fn on_done, void *ctx, dp_detail *d)
{
    return dp_endpoint_transfer_many_ends(ep, ops, n_ops, timeout_s, results, details,
                                          NULL, on_done, ctx, d);
}

int
dp_endpoint_transfer_many_ends(dp_endpoint *ep, const dp_xfer_desc *ops, size_t n_ops,
                               double timeout_s, int *results, dp_detail *details,
                               dp_xfer_end *ends, dp_xfer_done_fn on_done, void *ctx,
                               dp_detail *d)
{
    if (n_ops > 0 && (ops == NULL || results == NULL))
        return dp_fail(d, DP_EINVAL, "transfer_many: ops or results is NULL");
    if (details != NULL)
        for (size_t i = 0; i < n_ops; i++)
            dp_detail_clear(&details[i]);
    return run_ops(ep, ops, n_ops, timeout_s, results, details, ends, on_done, ctx, d);
}

int
dp_endpoint_remote_check(dp_endpoint *ep, const char *name, dp_detail *d)
{
    lock(ep);
    int rc = check_open_locked(ep, d);
    remote *r = rc == DP_OK && name != NULL ? remote_find_locked(ep, name) : NULL;
    if (rc == DP_OK && r == NULL)
        rc = dp_fail(d, DP_ENOTFOUND, "endpoint %s: no remote named %s", ep->name,
                     name ? name : "(null)");
    if (rc == DP_OK) {
        /* Run keepalive and error callbacks that are due (the worker may have
         * been idle since the last operation). */
        for (int i = 0; i < 64 && ucp_worker_progress(ep->worker) != 0; i++) {
        }
        ucp_worker_progress(ep->worker);
        reap_locked(ep);
        ucs_status_t st = remote_failed(r);
        if (st != UCS_OK)
            rc = dp_fail(d, DP_ETRANSFER, "endpoint %s: the connection to %s failed: %s",
                         ep->name, name, ucs_status_string(st));
    }
    unlock(ep);
    return rc;
}

int
dp_endpoint_remote_lane(dp_endpoint *ep, const char *name, dp_xfer_lane *lane, char *tls,
                        size_t tls_cap, dp_detail *d)
{
    char *info = NULL;
    *lane = DP_XFER_LANE_UNKNOWN;
    if (tls_cap > 0)
        tls[0] = '\0';
    int rc = dp_endpoint_describe_remote(ep, name, &info, d);
    if (rc != DP_OK)
        return rc;
    /* Lines "lane[i]:  N:tl/dev.0 md[...] -> ...": collect each lane's tl. */
    static const char *const shm[] = {"posix", "sysv", "xpmem", "cma", "knem", "self"};
    static const char *const rdma[] = {"rc", "rc_verbs", "rc_mlx5", "dc", "dc_mlx5",
                                       "ud", "ud_verbs", "ud_mlx5", "ib"};
    bool any = false, all_shm = true, any_rdma = false, any_other = false;
    size_t tl_len = 0;
    for (const char *p = strstr(info, "lane["); p != NULL; p = strstr(p + 1, "lane[")) {
        const char *c = strchr(p, ':');
        const char *nl = strchr(p, '\n');
        if (c == NULL || (nl != NULL && c > nl))
            continue;
        c++;
        while (*c == ' ')
            c++;
        while (*c >= '0' && *c <= '9')
            c++;
        if (*c != ':')
            continue;
        c++;
        size_t n = strcspn(c, "/ \n");
        if (n == 0 || n > 31)
            continue;
        char tl[32];
        memcpy(tl, c, n);
        tl[n] = '\0';
        any = true;
        bool is_shm = false, is_rdma = false;
        for (size_t i = 0; i < DP_ARRAY_LEN(shm); i++)
            is_shm = is_shm || strcmp(tl, shm[i]) == 0;
        for (size_t i = 0; i < DP_ARRAY_LEN(rdma); i++)
            is_rdma = is_rdma || strcmp(tl, rdma[i]) == 0;
        all_shm = all_shm && is_shm;
        any_rdma = any_rdma || is_rdma;
        any_other = any_other || (!is_shm && !is_rdma);
        if (tls_cap > 0 && strstr(tls, tl) == NULL && tl_len + n + 2 < tls_cap) {
            tl_len += (size_t)snprintf(tls + tl_len, tls_cap - tl_len, "%s%s",
                                       tl_len > 0 ? "," : "", tl);
        }
    }
    free(info);
    if (!any)
        *lane = DP_XFER_LANE_UNKNOWN;
    else if (all_shm)
        *lane = DP_XFER_LANE_SHM;
    else if (any_rdma && !any_other)
        *lane = DP_XFER_LANE_RDMA;
    else
        *lane = DP_XFER_LANE_TCP;
    return DP_OK;
}

const char *
dp_xfer_lane_name(dp_xfer_lane lane)
{
    switch (lane) {
    case DP_XFER_LANE_SHM:
        return "shm";
    case DP_XFER_LANE_RDMA:
        return "rdma";
    case DP_XFER_LANE_TCP:
        return "tcp";
    default:
        return "?";
    }
}

bool
dp_endpoint_touches_unfinished(const dp_endpoint *ep, const void *addr, size_t nbytes)
{
    DP_UNUSED(ep);
    return dp_graveyard_touches((uint64_t)(uintptr_t)addr, nbytes);
}

void
dp_endpoint_get_stats(dp_endpoint *ep, dp_endpoint_stats *st)
{
    lock(ep);
    *st = ep->st;
    st->n_regions = ep->n_regs;
    size_t n = 0;
    for (remote *r = ep->remotes; r != NULL; r = r->r_next)
        n++;
    st->n_remotes = n;
    unlock(ep);
}
