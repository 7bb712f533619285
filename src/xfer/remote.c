/*
 * Remotes of a transfer endpoint: adding one from its metadata (connect,
 * unpack its keys, map and pre-fault its shared memory), replacing, removing
 * and freeing it, checking its connection, and describing and classifying
 * the UCX lanes towards it.
 *
 * Design notes
 * ------------
 * - add_remote refuses metadata packed by another UCX major.minor before UCX
 *   sees its bytes: UCX asserts on a worker address format it does not know.
 * - Shared-memory mappings of a remote are faulted in ahead of the copies
 *   that use them (docs/design.md, "Endpoint and graveyard"). DP_PREFAULT
 *   picks when: "touch" (the default): nothing at open; before a transfer's
 *   copy, each 2 MiB chunk of the mapping it touches that is not yet faulted
 *   in is, in one madvise (a bit per chunk, under ep_mu), so a client pays
 *   for the part of a slab it uses, when it first uses it; "open": all of
 *   it before publishing, with ep_mu dropped (nothing can unmap a mapping of
 *   an unlisted remote); "background": the remote is published at once and
 *   a thread of its own faults the mappings in, 2 MiB at a time, while
 *   transfers may already run (freeing the remote stops and joins it before
 *   the mappings go); "off": never (pages fault one by one inside the
 *   copies). Figures: docs/benchmarks.md, "Opening a client, and what its
 *   first puts pay".
 * - A remote being replaced or removed while transfers towards it are in
 *   flight or retained becomes a zombie (ep->zombies): unlisted, its UCX
 *   endpoint and keys kept until close, since those transfers use them.
 * - A UCX endpoint close that does not complete within EP_CLOSE_WAIT_NS is
 *   left to UCX (its request is never freed while running) and the remote's
 *   state is kept.
 * - The lanes come from ucp_ep_print_info, the only place UCX 1.13 tells them.
 */
#include "xfer/endpoint_int.h"

#include <inttypes.h>
#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "xfer/metadata.h"

/* How long close() waits for a UCX endpoint close to complete. */
#define EP_CLOSE_WAIT_NS 2000000000ull

static void regs_free(remote *r);
static int lane_locked(dp__endpoint *ep, remote *r, dp__xfer_lane *lane, char *tls,
                       size_t tls_cap, dp_detail *d);
static int check_lanes_locked(dp__endpoint *ep, const remote *r, dp_detail *d);

/* UCX's peer error callback (ep_mu held, from whichever thread progresses). */
static void
ep_err_cb(void *arg, ucp_ep_h uep, ucs_status_t status)
{
    DP_UNUSED(uep);
    remote *r = arg;
    __atomic_store_n(&r->r_failed, (int)status, __ATOMIC_RELEASE);
    /* No reply comes from a failed connection (docs/design.md, "Two-sided transfers"). */
    dp__ep_ts_remote_failed_locked(r->r_owner, r, status);
}

/* Poll same-host peers' processes this often while transfers wait on them. */
#define PEER_CHECK_NS 100000000ull

/*
 * r's process has ended: fail r as UCX's error callback would. Its requests
 * still pending end when UCX purges them (the remote's removal closes its UCX
 * endpoint); until then the graveyard keeps what they touch.
 */
static void
mark_exited_locked(dp__endpoint *ep, remote *r)
{
    r->r_exited = true;
    DP_LOG_I("endpoint %s: peer %s (pid %u on this host) has ended; failing its "
             "transfers",
             ep->name, r->r_name, r->r_proc.pid);
    __atomic_store_n(&r->r_failed, (int)UCS_ERR_CONNECTION_RESET, __ATOMIC_RELEASE);
    dp__ep_ts_remote_failed_locked(ep, r, UCS_ERR_CONNECTION_RESET);
}

static bool
proc_to_check(const remote *r)
{
    return r->r_local_proc && !r->r_exited && remote_failed(r) == UCS_OK;
}

void
dp__ep_check_peers_locked(dp__endpoint *ep, uint64_t now)
{
    if (now - ep->proc_check_ns < PEER_CHECK_NS)
        return;
    ep->proc_check_ns = now;
    dp__list *lists[2] = {&ep->remotes, &ep->zombies};
    for (int k = 0; k < 2; k++)
        for (remote *r = DP_LIST_FIRST(lists[k], remote, r_link); r != NULL;
             r = DP_LIST_NEXT(r, remote, r_link))
            if (r->r_busy > 0 && proc_to_check(r) && dp__proc_exited(&r->r_proc))
                mark_exited_locked(ep, r);
}

remote *
dp__ep_remote_find_locked(const dp__endpoint *ep, const char *name)
{
    for (remote *r = DP_LIST_FIRST(&ep->remotes, remote, r_link); r != NULL;
         r = DP_LIST_NEXT(r, remote, r_link))
        if (strcmp(r->r_name, name) == 0)
            return r;
    return NULL;
}

/* Take listed r off the list: a zombie while transfers use it, else freed. */
static void
unlist_locked(dp__endpoint *ep, remote *r)
{
    dp__list_remove(&ep->remotes, &r->r_link);
    if (r->r_busy > 0 || r->r_retained > 0)
        dp__list_insert_head(&ep->zombies, &r->r_link);
    else
        dp__ep_remote_free_locked(ep, r);
}

/* Wait (progressing) for a close request; true when it completed. */
static bool
wait_close_locked(dp__endpoint *ep, ucs_status_ptr_t req)
{
    if (req == NULL)
        return true;
    if (UCS_PTR_IS_ERR(req))
        return true; /* nothing left in flight for it */
    uint64_t deadline = dp__now_ns() + EP_CLOSE_WAIT_NS;
    while (ucp_request_check_status(req) == UCS_INPROGRESS) {
        if (dp__now_ns() > deadline)
            return false; /* leave the request to UCX; never free it while running */
        ucp_worker_progress(ep->worker);
    }
    ucp_request_free(req);
    return true;
}

void
dp__ep_remote_free_locked(dp__endpoint *ep, remote *r)
{
    /* The pre-fault thread touches the mappings the rkeys hold: stop it first
     * (it takes no lock, and stops within one 2 MiB step). */
    if (r->r_pf_started) {
        __atomic_store_n(&r->r_pf_stop, 1, __ATOMIC_RELEASE);
        pthread_join(r->r_pf_thread, NULL);
        r->r_pf_started = false;
    }
    for (uint32_t i = 0; i < r->r_n_regs; i++)
        if (r->r_regs[i].rr_rkey != NULL)
            ucp_rkey_destroy(r->r_regs[i].rr_rkey);
    bool closed = true;
    if (r->r_ep != NULL) {
        ucp_request_param_t prm = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                                   .flags = UCP_EP_CLOSE_FLAG_FORCE};
        closed = wait_close_locked(ep, ucp_ep_close_nbx(r->r_ep, &prm));
    }
    regs_free(r);
    dp__ranges_fini(&r->r_index);
    if (closed)
        free(r);
    else
        DP_LOG_W("endpoint %s: closing remote %s did not complete; its state is kept",
                 ep->name, r->r_name);
}

/*
 * Fault in [p, p + len) of a remote's shared-memory mapping, 2 MiB at a time,
 * until *stop (NULL: never) becomes nonzero.
 */
static void
prefault(uint8_t *p, uint64_t len, const int *stop)
{
    long pg = sysconf(_SC_PAGESIZE);
    uintptr_t lo = (uintptr_t)p & ~((uintptr_t)pg - 1);
    uintptr_t hi = (uintptr_t)p + len;
    const uintptr_t step = 2u << 20;
    for (uintptr_t a = lo; a < hi; a += step) {
        if (stop != NULL && __atomic_load_n(stop, __ATOMIC_ACQUIRE))
            return;
        uintptr_t e = a + step < hi ? a + step : hi;
#ifdef MADV_POPULATE_WRITE
        if (madvise((void *)a, e - a, MADV_POPULATE_WRITE) == 0)
            continue;
#endif
        /* Older kernels: a read per page maps it; a later write only upgrades it. */
        for (uintptr_t x = a < (uintptr_t)p ? (uintptr_t)p : a; x < e; x += (uintptr_t)pg)
            (void)*(volatile uint8_t *)x;
    }
}

/* When to pre-fault (DP_PREFAULT): see the Design notes. */
enum { PF_BACKGROUND, PF_OPEN, PF_OFF, PF_TOUCH };

static int
prefault_mode(void)
{
    const char *v = getenv("DP_PREFAULT");
    if (v == NULL || v[0] == '\0' || strcmp(v, "touch") == 0)
        return PF_TOUCH;
    if (strcmp(v, "open") == 0)
        return PF_OPEN;
    if (strcmp(v, "background") == 0)
        return PF_BACKGROUND;
    if (strcmp(v, "off") == 0)
        return PF_OFF;
    DP_LOG_W("DP_PREFAULT=%s is not touch, open, background or off: using touch", v);
    return PF_TOUCH;
}

#define TOUCH_CHUNK ((uint64_t)1 << DP__TOUCH_CHUNK_SHIFT)

void
dp__ep_rregion_touch_slow_locked(rregion *rr, uint64_t first, uint64_t last)
{
    for (uint64_t k = first; k <= last; k++) {
        uint8_t bit = (uint8_t)(1u << (k & 7));
        if (rr->rr_touched[k >> 3] & bit)
            continue;
        uint64_t lo = k * TOUCH_CHUNK;
        uint64_t hi = DP_MIN(lo + TOUCH_CHUNK, rr->rr_len);
        /* The mapping's own pages, faulted in one call instead of one fault
         * per page inside the copy; the bytes are not changed. */
        prefault(rr->rr_ptr + lo, hi - lo, NULL);
        rr->rr_touched[k >> 3] |= bit;
        if (--rr->rr_untouched == 0) { /* all of it: nothing left to check */
            free(rr->rr_touched);
            rr->rr_touched = NULL;
            return;
        }
    }
}

/* Free r's regions (their touched maps too). */
static void
regs_free(remote *r)
{
    for (uint32_t i = 0; r->r_regs != NULL && i < r->r_n_regs; i++)
        free(r->r_regs[i].rr_touched);
    free(r->r_regs);
    r->r_regs = NULL;
}

static void *
prefault_main(void *arg)
{
    remote *r = arg;
    for (uint32_t i = 0; i < r->r_n_regs; i++)
        if (r->r_regs[i].rr_ptr != NULL)
            prefault(r->r_regs[i].rr_ptr, r->r_regs[i].rr_len, &r->r_pf_stop);
    return NULL;
}

/*
 * Refuse metadata packed by another UCX major.minor before UCX sees its bytes
 * (see the Design notes).
 */
static int
check_xver(const dp__endpoint *ep, const dp__md *md, dp_detail *d)
{
    uint32_t mine = dp__ep_ucx_version();
    if ((md->xver >> 16) == (mine >> 16))
        return DP_OK;
    return dp__fail(d, DP_EPROTO,
                    "endpoint %s: remote %s runs UCX %u.%u.%u and this process UCX "
                    "%u.%u.%u: their worker addresses and keys do not mix; use the same "
                    "UCX version on both",
                    ep->name, md->name, md->xver >> 24, (md->xver >> 16) & 0xff,
                    md->xver & 0xffff, mine >> 24, (mine >> 16) & 0xff, mine & 0xffff);
}

/* A new, unconnected remote for md, its regions indexed; NULL when out of memory. */
static remote *
remote_new(dp__endpoint *ep, const dp__md *md)
{
    remote *r = calloc(1, sizeof *r);
    if (r == NULL || (md->n_regions > 0 &&
                      ((r->r_regs = calloc(md->n_regions, sizeof *r->r_regs)) == NULL ||
                       dp__ranges_reserve(&r->r_index, md->n_regions) != DP_OK))) {
        if (r != NULL) {
            regs_free(r);
            dp__ranges_fini(&r->r_index);
        }
        free(r);
        return NULL;
    }
    /* Sorted and disjoint (dp__md_parse checked): the adds cannot fail. */
    for (uint32_t i = 0; i < md->n_regions; i++) {
        int rc = dp__ranges_add(&r->r_index, md->regions[i].base, md->regions[i].len,
                                &r->r_regs[i]);
        DP_ASSERT(rc == DP_OK);
    }
    snprintf(r->r_name, sizeof r->r_name, "%s", md->name);
    r->r_gen = md->gen;
    r->r_failed = UCS_OK;
    r->r_owner = ep;
    r->r_serves = (md->flags & DP_MD_F_SERVES) != 0;
    r->r_proc = md->proc;
    return r;
}

/*
 * Connect r to md's worker and unpack its regions' keys (r_n_regs counts those
 * unpacked), noting which regions UCX maps into this process. ep_mu held.
 */
static int
connect_locked(dp__endpoint *ep, remote *r, const dp__md *md, dp_detail *d)
{
    ucp_ep_params_t epp = {
        .field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS |
                      UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                      UCP_EP_PARAM_FIELD_ERR_HANDLER,
        .address = (const ucp_address_t *)md->addr,
        .err_mode = ep->opts.err_mode == DP_EP_ERR_PEER ? UCP_ERR_HANDLING_MODE_PEER
                                                        : UCP_ERR_HANDLING_MODE_NONE,
        .err_handler = {.cb = ep_err_cb, .arg = r},
    };
    ucs_status_t st = ucp_ep_create(ep->worker, &epp, &r->r_ep);
    if (st != UCS_OK) {
        r->r_ep = NULL;
        return dp__ep_ucx_fail(d, DP_ETRANSFER, st, "endpoint %s: connect to %s",
                               ep->name, md->name);
    }
    for (uint32_t i = 0; i < md->n_regions; i++) {
        rregion *rr = &r->r_regs[i];
        rr->rr_base = md->regions[i].base;
        rr->rr_len = md->regions[i].len;
        st = ucp_ep_rkey_unpack(r->r_ep, md->regions[i].rkey, &rr->rr_rkey);
        if (st != UCS_OK) {
            rr->rr_rkey = NULL;
            return dp__ep_ucx_fail(d, DP_ETRANSFER, st,
                                   "endpoint %s: remote %s region %u: rkey", ep->name,
                                   md->name, i);
        }
        r->r_n_regs = i + 1;
        void *p = NULL;
        if (ucp_rkey_ptr(rr->rr_rkey, rr->rr_base, &p) == UCS_OK)
            rr->rr_ptr = p;
    }
    return DP_OK;
}

/* With DP_PREFAULT=touch: a touched map (a bit per chunk) per mapped region. */
static int
touch_maps_alloc(dp__endpoint *ep, remote *r, dp_detail *d)
{
    for (uint32_t i = 0; i < r->r_n_regs; i++) {
        rregion *rr = &r->r_regs[i];
        uint64_t chunks = (rr->rr_len + TOUCH_CHUNK - 1) / TOUCH_CHUNK;
        if (rr->rr_ptr != NULL && (rr->rr_touched = calloc((chunks + 7) / 8, 1)) == NULL)
            return dp__fail(d, DP_ENOMEM, "endpoint %s: out of memory", ep->name);
        rr->rr_untouched = chunks;
    }
    return DP_OK;
}

int
dp__endpoint_add_remote(dp__endpoint *ep, const void *md_bytes, size_t len,
                        char *name_out, dp_detail *d)
{
    dp__md md;
    int rc = dp__md_parse(md_bytes, len, &md, d);
    if (rc != DP_OK)
        return rc;
    if ((rc = check_xver(ep, &md, d)) != DP_OK) {
        dp__md_fini(&md);
        return rc;
    }
    remote *r = remote_new(ep, &md);
    if (r == NULL) {
        dp__md_fini(&md);
        return dp__fail(d, DP_ENOMEM, "endpoint %s: out of memory", ep->name);
    }
    lock(ep);
    r->r_local_proc = ep->has_self_proc && (md.flags & DP_MD_F_PROC) &&
                      dp__proc_same_host(&ep->self_proc, &md.proc);
    rc = check_open_locked(ep, d);
    if (rc != DP_OK)
        goto fail_locked;
    if ((rc = connect_locked(ep, r, &md, d)) != DP_OK)
        goto fail_locked;
    int pf = prefault_mode();
    if (pf == PF_TOUCH && (rc = touch_maps_alloc(ep, r, d)) != DP_OK)
        goto fail_locked;
    rc = lane_locked(ep, r, &r->r_lane, r->r_tls, sizeof r->r_tls, d);
    if (rc != DP_OK)
        goto fail_locked;
    if ((rc = check_lanes_locked(ep, r, d)) != DP_OK)
        goto fail_locked;
    dp__ep_ts_choose_path_locked(ep, r, r->r_lane);
    unlock(ep);
    /* The remote is not published yet: nothing else can unmap these mappings. */
    for (uint32_t i = 0; pf == PF_OPEN && i < r->r_n_regs; i++)
        if (r->r_regs[i].rr_ptr != NULL)
            prefault(r->r_regs[i].rr_ptr, r->r_regs[i].rr_len, NULL);
    lock(ep);
    rc = check_open_locked(ep, d);
    if (rc != DP_OK)
        goto fail_locked;
    /* Replace a remote of the same name (its metadata may have changed). */
    remote *old = dp__ep_remote_find_locked(ep, r->r_name);
    if (old != NULL)
        unlist_locked(ep, old);
    dp__list_insert_head(&ep->remotes, &r->r_link);
    bool any_map = false;
    for (uint32_t i = 0; i < r->r_n_regs; i++)
        any_map = any_map || r->r_regs[i].rr_ptr != NULL;
    /* Under ep_mu: a remove or replace (which joins the thread) waits for it. */
    if (pf == PF_BACKGROUND && any_map &&
        pthread_create(&r->r_pf_thread, NULL, prefault_main, r) == 0)
        r->r_pf_started = true;
    unlock(ep);
    if (name_out != NULL)
        snprintf(name_out, DP_MD_NAME_MAX + 1, "%s", md.name);
    dp__md_fini(&md);
    return DP_OK;
fail_locked:
    if (ep->closed) {
        /* The worker is gone with everything made from it. */
        regs_free(r);
        dp__ranges_fini(&r->r_index);
        free(r);
    } else {
        dp__ep_remote_free_locked(ep, r);
    }
    unlock(ep);
    dp__md_fini(&md);
    return rc;
}

/* A flush of a remote's UCX endpoint, waited for by remote_connect. */
typedef struct flush_wait {
    bool done, abandoned;
    ucs_status_t st;
} flush_wait;

static void
flush_cb(void *request, ucs_status_t status, void *user_data)
{
    flush_wait *w = user_data;
    w->st = status;
    w->done = true;
    if (w->abandoned)
        free(w); /* its waiter gave up */
    ucp_request_free(request);
}

/* The lanes of r (set up) against require_rdma: DP_EPOLICY if they break it. */
static int
check_lanes_locked(dp__endpoint *ep, const remote *r, dp_detail *d)
{
    if (!ep->opts.require_rdma || r->r_lane == DP_XFER_LANE_RDMA ||
        r->r_lane == DP_XFER_LANE_SHM)
        return DP_OK;
    /* What UCX really opened, not only what the environment allows. */
    return dp__fail(d, DP_EPOLICY,
                    "endpoint %s: require_rdma: UCX reaches %s over %s (%s), not RDMA; "
                    "give both hosts an RDMA device UCX can use, or unset "
                    "DP_REQUIRE_RDMA",
                    ep->name, r->r_name, dp__xfer_lane_name(r->r_lane),
                    r->r_tls[0] ? r->r_tls : "?");
}

int
dp__endpoint_remote_connect(dp__endpoint *ep, const char *name, double timeout_s,
                            dp_detail *d)
{
    if (!(timeout_s > 0) || !isfinite(timeout_s) || timeout_s > 1e9)
        return dp__fail(d, DP_EINVAL, "remote_connect: timeout %g s", timeout_s);
    lock(ep);
    int rc = check_open_locked(ep, d);
    remote *r = rc == DP_OK && name != NULL ? dp__ep_remote_find_locked(ep, name) : NULL;
    if (rc == DP_OK && r == NULL)
        rc = dp__fail(d, DP_ENOTFOUND, "endpoint %s: no remote named %s", ep->name,
                      name ? name : "(null)");
    flush_wait *w = rc == DP_OK ? calloc(1, sizeof *w) : NULL;
    if (rc == DP_OK && w == NULL)
        rc = dp__fail(d, DP_ENOMEM, "endpoint %s: out of memory", ep->name);
    if (rc != DP_OK) {
        unlock(ep);
        return rc;
    }
    r->r_busy++; /* kept (a zombie at worst) while the lock drops */
    ucp_request_param_t prm = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA,
        .cb.send = flush_cb,
        .user_data = w,
    };
    ucs_status_ptr_t sp = ucp_ep_flush_nbx(r->r_ep, &prm);
    if (UCS_PTR_IS_ERR(sp) || sp == NULL)
        *w = (flush_wait){.done = true, .st = UCS_PTR_STATUS(sp)};
    uint64_t deadline = dp__now_ns() + (uint64_t)(timeout_s * 1e9);
    while (!w->done && dp__now_ns() < deadline) {
        unsigned n = ucp_worker_progress(ep->worker);
        unlock(ep);
        if (n == 0)
            sched_yield();
        lock(ep);
    }
    if (!w->done) {
        w->abandoned = true; /* flush_cb frees it */
        rc = dp__fail(d, DP_ETIMEDOUT, "endpoint %s: connecting to %s took over %g s",
                      ep->name, r->r_name, timeout_s);
    } else {
        if (w->st != UCS_OK)
            rc = dp__ep_ucx_fail(d, DP_ETRANSFER, w->st, "endpoint %s: connect to %s",
                                 ep->name, r->r_name);
        free(w);
    }
    if (rc == DP_OK)
        rc = lane_locked(ep, r, &r->r_lane, r->r_tls, sizeof r->r_tls, d);
    if (rc == DP_OK)
        rc = check_lanes_locked(ep, r, d);
    if (rc == DP_OK)
        dp__ep_ts_choose_path_locked(ep, r, r->r_lane);
    r->r_busy--;
    unlock(ep);
    return rc;
}

bool
dp__endpoint_has_remote(dp__endpoint *ep, const char *name)
{
    if (name == NULL)
        return false;
    lock(ep);
    bool has = !ep->closed && dp__ep_remote_find_locked(ep, name) != NULL;
    unlock(ep);
    return has;
}

uint64_t
dp__endpoint_remote_copy_max(dp__endpoint *ep, const char *name)
{
    if (name == NULL)
        return 0;
    lock(ep);
    remote *r = ep->closed ? NULL : dp__ep_remote_find_locked(ep, name);
    uint64_t max =
        r != NULL && r->r_path != DP_XFER_PATH_TWO_SIDED && dp__ep_remote_mapped(r)
            ? (uint64_t)ep->memcpy_max
            : 0;
    unlock(ep);
    return max;
}

int
dp__endpoint_remove_remote(dp__endpoint *ep, const char *name, dp_detail *d)
{
    lock(ep);
    int rc = check_open_locked(ep, d);
    if (rc != DP_OK)
        goto out;
    rc = dp__fail(d, DP_ENOTFOUND, "endpoint %s: no remote named %s", ep->name,
                  name ? name : "(null)");
    remote *r = name != NULL ? dp__ep_remote_find_locked(ep, name) : NULL;
    if (r != NULL) {
        unlist_locked(ep, r);
        rc = DP_OK;
    }
out:
    unlock(ep);
    return rc;
}

int
dp__endpoint_describe_remote(dp__endpoint *ep, const char *name, char **out, dp_detail *d)
{
    *out = NULL;
    lock(ep);
    int rc = check_open_locked(ep, d);
    remote *r = rc == DP_OK && name != NULL ? dp__ep_remote_find_locked(ep, name) : NULL;
    if (rc == DP_OK && r == NULL)
        rc = dp__fail(d, DP_ENOTFOUND, "endpoint %s: no remote named %s", ep->name,
                      name ? name : "(null)");
    if (rc == DP_OK) {
        size_t n = 0;
        FILE *f = open_memstream(out, &n);
        if (f == NULL) {
            rc = dp__fail(d, DP_ENOMEM, "endpoint %s: out of memory", ep->name);
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

int
dp__endpoint_remote_check(dp__endpoint *ep, const char *name, dp_detail *d)
{
    lock(ep);
    int rc = check_open_locked(ep, d);
    remote *r = rc == DP_OK && name != NULL ? dp__ep_remote_find_locked(ep, name) : NULL;
    if (rc == DP_OK && r == NULL)
        rc = dp__fail(d, DP_ENOTFOUND, "endpoint %s: no remote named %s", ep->name,
                      name ? name : "(null)");
    if (rc == DP_OK) {
        /* Run keepalive and error callbacks that are due (the worker may have
         * been idle since the last operation). */
        for (int i = 0; i < 64 && ucp_worker_progress(ep->worker) != 0; i++) {
        }
        ucp_worker_progress(ep->worker);
        dp__ep_reap_locked(ep);
        if (proc_to_check(r) && dp__proc_exited(&r->r_proc))
            mark_exited_locked(ep, r);
        ucs_status_t st = remote_failed(r);
        if (st != UCS_OK)
            rc = dp__fail(d, DP_ETRANSFER, "endpoint %s: the connection to %s failed: %s",
                          ep->name, name, remote_fail_str(r, st));
    }
    unlock(ep);
    return rc;
}

/* Classify the lanes UCX chose towards r (from ucp_ep_print_info). */
static int
lane_locked(dp__endpoint *ep, remote *r, dp__xfer_lane *lane, char *tls, size_t tls_cap,
            dp_detail *d)
{
    char *info = NULL;
    size_t info_n = 0;
    *lane = DP_XFER_LANE_UNKNOWN;
    if (tls_cap > 0)
        tls[0] = '\0';
    FILE *f = open_memstream(&info, &info_n);
    if (f == NULL)
        return dp__fail(d, DP_ENOMEM, "endpoint %s: out of memory", ep->name);
    ucp_ep_print_info(r->r_ep, f);
    fclose(f);
    if (info == NULL)
        return dp__fail(d, DP_ENOMEM, "endpoint %s: out of memory", ep->name);
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

int
dp__endpoint_remote_route(dp__endpoint *ep, const char *name, dp__xfer_route *out,
                          dp_detail *d)
{
    *out = (dp__xfer_route){.lane = "?", .path = "one-sided"};
    lock(ep);
    int rc = check_open_locked(ep, d);
    remote *r = rc == DP_OK && name != NULL ? dp__ep_remote_find_locked(ep, name) : NULL;
    if (rc == DP_OK && r == NULL)
        rc = dp__fail(d, DP_ENOTFOUND, "endpoint %s: no remote named %s", ep->name,
                      name ? name : "(null)");
    if (rc == DP_OK) {
        out->lane = dp__xfer_lane_name(r->r_lane);
        out->two_sided = r->r_path == DP_XFER_PATH_TWO_SIDED;
        out->path = out->two_sided ? "two-sided" : "one-sided";
        snprintf(out->tls, sizeof out->tls, "%s", r->r_tls);
    }
    unlock(ep);
    return rc;
}

const char *
dp__xfer_lane_name(dp__xfer_lane lane)
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
