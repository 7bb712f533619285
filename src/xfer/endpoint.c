/*
 * Transfer endpoint over UCX's UCP API: one context and one worker per
 * endpoint, its lifecycle, the UCX configuration it runs with, the optional
 * progress thread, registered local regions and the metadata peers connect
 * with. Remotes are remote.c's, transfers transfer.c's; the struct, the lock
 * and the overview of the three files are in endpoint_int.h.
 *
 * Design notes
 * ------------
 * - Creation sets UCX options in the endpoint's own config, never in the
 *   environment, and only where the user's environment does not set them:
 *   with peer error handling, MM_ERROR_HANDLING=y (shared-memory transports
 *   are otherwise excluded and a same-host peer gets only an emulated-RMA
 *   tcp lane; docs/design.md, "Endpoint and graveyard") and a 1 s keepalive.
 * - close() of an endpoint with retained transfers keeps the UCX context,
 *   worker, endpoints, keys and registrations for good and moves the object
 *   to the abandoned list (ab_list): a retained operation may still use them.
 *   destroy() then leaves the object to that list.
 * - Regions are sorted by base and disjoint, so transfer.c finds them by
 *   binary search. Deregistration refuses a region in use by a running
 *   transfer (r_busy) or touched by a retained one (the graveyard); it stays
 *   registered for good and its memory must not be reused.
 * - Every register/deregister bumps the generation that metadata carries, so
 *   a peer can tell newer metadata from older.
 */
#include "xfer/endpoint_int.h"

#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "xfer/metadata.h"
#include "xfer/policy.h"

/* Endpoints closed with retained transfers: reachable forever, never freed. */
static pthread_mutex_t ab_mu = PTHREAD_MUTEX_INITIALIZER;
static dp__list ab_list; /* dp__endpoint.ab_link */

/* ---- small helpers ---- */

int
dp__ep_ucx_fail(dp_detail *d, int code, ucs_status_t st, const char *fmt, ...)
{
    char what[DP_DETAIL_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return dp__fail(d, code, "%s: %s", what, ucs_status_string(st));
}

static bool
env_true(const char *name)
{
    const char *e = getenv(name);
    return e != NULL && (strcmp(e, "1") == 0 || strcasecmp(e, "y") == 0 ||
                         strcasecmp(e, "yes") == 0 || strcasecmp(e, "true") == 0);
}

/*
 * require_rdma: UCX_TLS may name only RDMA transports and still find none on
 * this host (UCX then has only the same-host ones). Say so now rather than at
 * the first connect.
 */
static int
check_rdma_resources(dp__endpoint *ep, dp_detail *d)
{
    char *info = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&info, &n);
    if (f == NULL)
        return dp__fail(d, DP_ENOMEM, "endpoint %s: out of memory", ep->name);
    ucp_context_print_info(ep->ctx, f);
    fclose(f);
    if (info == NULL)
        return dp__fail(d, DP_ENOMEM, "endpoint %s: out of memory", ep->name);
    bool rdma = false;
    /* Resource lines end in "<tl>/<device>": rc_verbs/mlx5_0:1, dc_mlx5/..., ud_... */
    for (char *line = info; line != NULL && *line != '\0' && !rdma;) {
        char *nl = strchr(line, '\n');
        if (nl != NULL)
            *nl = '\0';
        if (strstr(line, "resource") != NULL) {
            const char *sp = strrchr(line, ' ');
            const char *tl = sp != NULL ? sp + 1 : line;
            rdma = strncmp(tl, "rc", 2) == 0 || strncmp(tl, "dc", 2) == 0 ||
                   strncmp(tl, "ud", 2) == 0 || strncmp(tl, "ib", 2) == 0;
        }
        line = nl != NULL ? nl + 1 : NULL;
    }
    free(info);
    if (!rdma)
        return dp__fail(d, DP_EPOLICY,
                        "endpoint %s: require_rdma: UCX found no RDMA transport on this "
                        "host (UCX_TLS=%s allows only RDMA and same-host ones); check "
                        "`ucx_info -d` for an rc, dc or ud transport, or unset "
                        "DP_REQUIRE_RDMA",
                        ep->name, getenv("UCX_TLS") ? getenv("UCX_TLS") : "");
    return DP_OK;
}

int
dp__endpoint_transports(dp__endpoint *ep, char *buf, size_t cap)
{
    buf[0] = '\0';
    char *info = NULL;
    size_t n = 0, len = 0;
    FILE *f = open_memstream(&info, &n);
    if (f == NULL)
        return DP_ENOMEM;
    ucp_context_print_info(ep->ctx, f);
    fclose(f);
    if (info == NULL)
        return DP_ENOMEM;
    /* Resource lines end in "<tl>/<device>"; list each tl once, in order. */
    for (char *line = info; line != NULL && *line != '\0';) {
        char *nl = strchr(line, '\n');
        if (nl != NULL)
            *nl = '\0';
        const char *sp = strrchr(line, ' ');
        char *slash = sp != NULL ? strchr(sp + 1, '/') : NULL;
        if (strstr(line, "resource") != NULL && slash != NULL) {
            *slash = '\0';
            const char *tl = sp + 1;
            size_t tn = strlen(tl);
            bool dup = false;
            for (const char *p = buf; *p != '\0' && !dup;) {
                const char *c = strchr(p, ',');
                size_t pn = c != NULL ? (size_t)(c - p) : strlen(p);
                dup = pn == tn && strncmp(p, tl, tn) == 0;
                p = c != NULL ? c + 1 : p + pn;
            }
            if (!dup && tn > 0 && len + tn + 2 < cap) {
                len += (size_t)snprintf(buf + len, cap - len, "%s%s", len ? "," : "", tl);
            }
        }
        line = nl != NULL ? nl + 1 : NULL;
    }
    free(info);
    return DP_OK;
}

/* ---- progress thread ---- */

#define DEFAULT_SPIN_US 200 /* docs/design.md, "Two-sided transfers" */

static void *
progress_main(void *arg)
{
    dp__endpoint *ep = arg;
    unsigned idle_us = 1;
    uint64_t last_event = 0, last_served = 0, last_inflight = 0;
    while (!__atomic_load_n(&ep->thr_stop, __ATOMIC_ACQUIRE)) {
        lock(ep);
        unsigned n = 0, k;
        for (int i = 0; i < 64 && (k = ucp_worker_progress(ep->worker)) != 0; i++)
            n += k;
        /*
         * Shortly after a two-sided message more usually follow (the next one
         * of a stream, the data after a rendezvous): keep polling, yielding
         * the core, instead of sleeping and paying a wake-up for each. Only
         * two-sided serving counts: one-sided traffic needs nothing of this
         * thread, and on a small machine a polling thread takes cores from
         * the copies of same-host clients.
         */
        uint64_t now = ep->spin_ns > 0 ? dp__now_ns() : 0;
        bool served = ep->st.ts_served != last_served || ep->ts_inflight > 0 ||
                      ep->ts_inflight != last_inflight;
        last_served = ep->st.ts_served;
        last_inflight = ep->ts_inflight;
        if (n != 0 && (served || ep->opts.spin_after_any_event))
            last_event = now;
        bool spin = n == 0 && ep->spin_ns > 0 && now - last_event < ep->spin_ns;
        ucs_status_t st = UCS_ERR_UNSUPPORTED;
        if (n == 0 && !spin && ep->efd >= 0)
            st = ucp_worker_arm(ep->worker);
        unlock(ep);
        if (spin) {
            sched_yield();
            continue;
        }
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
dp__endpoint_opts_init(dp__endpoint_opts *o)
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

/*
 * *v = the environment's `var` when it is set, a number in [lo, hi]; a
 * malformed one is DP_EINVAL naming it and what to use ("use WHAT to HI").
 */
static int
env_u64(const char *ep_name, const char *var, uint64_t lo, uint64_t hi, const char *what,
        uint64_t *v, dp_detail *d)
{
    const char *e = getenv(var);
    if (e == NULL || *e == '\0')
        return DP_OK;
    if (dp__parse_u64(e, lo, hi, v, var, NULL) != DP_OK)
        return dp__fail(d, DP_EINVAL, "endpoint %s: %s=%.40s: use %s to %llu", ep_name,
                        var, e, what, (unsigned long long)hi);
    return DP_OK;
}

/*
 * The options an endpoint runs with: *o is opts (or the defaults), checked,
 * with require_rdma set when the environment asks for it; *threads and
 * *spin_us are the copier's threads and the progress thread's polling time,
 * from the options or the environment.
 */
static int
resolve_opts(const char *name, const dp__endpoint_opts *opts, dp__endpoint_opts *o,
             uint64_t *threads, uint64_t *spin_us, dp_detail *d)
{
    int rc;
    if (opts != NULL)
        *o = *opts;
    else
        dp__endpoint_opts_init(o);
    if (o->err_mode != DP_EP_ERR_PEER && o->err_mode != DP_EP_ERR_NONE)
        return dp__fail(d, DP_EINVAL, "endpoint %s: unknown error mode %d", name,
                        (int)o->err_mode);
    if (o->require_rdma || env_true("DP_REQUIRE_RDMA")) {
        char desc[256];
        dp_detail pd;
        dp_detail_clear(&pd);
        if (dp__policy_check_rdma_only(NULL, desc, sizeof desc, &pd) != DP_OK)
            return dp__fail(d, DP_EPOLICY, "endpoint %s: require_rdma: %s", name, pd.msg);
        o->require_rdma = true;
        DP_LOG_I("endpoint %s: transport policy: %s", name, desc);
    }

    *threads = o->copy_threads > 0 ? o->copy_threads : dp__copier_default_threads();
    *spin_us = o->progress_spin_us < 0    ? 0
               : o->progress_spin_us == 0 ? DEFAULT_SPIN_US
                                          : (uint64_t)o->progress_spin_us;
    if (*threads > DP_COPIER_THREADS_MAX)
        return dp__fail(d, DP_EINVAL, "endpoint %s: copy_threads %llu: at most %d", name,
                        (unsigned long long)*threads, DP_COPIER_THREADS_MAX);
    if (o->copy_threads == 0 &&
        (rc = env_u64(name, "DP_COPY_THREADS", 1, DP_COPIER_THREADS_MAX,
                      "a count of threads from 1 (no helper)", threads, d)) != DP_OK)
        return rc;
    if ((rc = env_u64(name, "DP_PROGRESS_SPIN_US", 0, 1000000,
                      "microseconds from 0 (never poll, sleep at once)", spin_us, d)) !=
        DP_OK)
        return rc;
    return DP_OK;
}

/* The UCX options the endpoint's own config gets (see the Design notes). */
static void
config_defaults(ucp_config_t *cfg, dp__ep_err_mode err_mode)
{
    if (err_mode == DP_EP_ERR_PEER) {
        /*
         * Without this, peer error handling excludes the shared-memory transports
         * and a same-host endpoint gets only an emulated-RMA tcp lane
         * (docs/design.md, "Endpoint and graveyard").
         */
        if (getenv("UCX_POSIX_ERROR_HANDLING") == NULL &&
            getenv("UCX_SYSV_ERROR_HANDLING") == NULL && tls_may_use_mm())
            config_default(cfg, "UCX_MM_ERROR_HANDLING", "MM_ERROR_HANDLING", "y");
        /* Detect a dead same-host peer within seconds, not the default 20 s. */
        config_default(cfg, "UCX_KEEPALIVE_INTERVAL", "KEEPALIVE_INTERVAL", "1s");
    }
    /*
     * TCP segments of 64 KiB instead of 8 KiB: two-sided transfers over TCP went
     * from 0.73 to 2.1 GB/s (64 x 1 MiB put across namespaces; docs/design.md,
     * "Two-sided transfers").
     */
    config_default(cfg, "UCX_TCP_TX_SEG_SIZE", "TX_SEG_SIZE", "64k");
    config_default(cfg, "UCX_TCP_RX_SEG_SIZE", "RX_SEG_SIZE", "64k");
}

/*
 * Open ep's UCX context and worker and get the worker's address. On failure
 * what was made stays in ep for dp__endpoint_destroy.
 */
static int
ucx_open(dp__endpoint *ep, dp_detail *d)
{
    ucp_config_t *cfg = NULL;
    ucs_status_t st = ucp_config_read(NULL, NULL, &cfg);
    if (st != UCS_OK)
        return dp__ep_ucx_fail(d, DP_ETRANSFER, st, "endpoint %s: ucp_config_read",
                               ep->name);
    config_defaults(cfg, ep->opts.err_mode);
    ucp_params_t cp = {
        .field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_NAME,
        .features = UCP_FEATURE_RMA | UCP_FEATURE_AM | UCP_FEATURE_WAKEUP,
        .name = ep->name,
    };
    st = ucp_init(&cp, cfg, &ep->ctx);
    ucp_config_release(cfg);
    if (st != UCS_OK) {
        ep->ctx = NULL;
        return dp__ep_ucx_fail(d, DP_ETRANSFER, st, "endpoint %s: ucp_init", ep->name);
    }
    ucp_worker_params_t wp = {
        .field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
        .thread_mode = UCS_THREAD_MODE_SERIALIZED,
    };
    st = ucp_worker_create(ep->ctx, &wp, &ep->worker);
    if (st != UCS_OK) {
        ep->worker = NULL;
        return dp__ep_ucx_fail(d, DP_ETRANSFER, st, "endpoint %s: ucp_worker_create",
                               ep->name);
    }
    st = ucp_worker_get_address(ep->worker, &ep->waddr, &ep->waddr_len);
    if (st != UCS_OK) {
        ep->waddr = NULL;
        return dp__ep_ucx_fail(d, DP_ETRANSFER, st, "endpoint %s: ucp_worker_get_address",
                               ep->name);
    }
    if (ep->waddr_len > DP_MD_ADDR_MAX)
        return dp__fail(d, DP_ETRANSFER,
                        "endpoint %s: worker address has %zu bytes, limit %u", ep->name,
                        ep->waddr_len, DP_MD_ADDR_MAX);
    return DP_OK;
}

int
dp__endpoint_create(const char *name, const dp__endpoint_opts *opts, dp__endpoint **out,
                    dp_detail *d)
{
    *out = NULL;
    int rc = dp__md_check_name(name, name ? strlen(name) : 0, d);
    if (rc != DP_OK)
        return rc;
    dp__endpoint_opts o;
    uint64_t threads, spin_us;
    if ((rc = resolve_opts(name, opts, &o, &threads, &spin_us, d)) != DP_OK)
        return rc;

    dp__endpoint *ep = calloc(1, sizeof *ep);
    if (ep == NULL)
        return dp__fail(d, DP_ENOMEM, "endpoint %s: out of memory", name);
    snprintf(ep->name, sizeof ep->name, "%s", name);
    ep->opts = o;
    ep->efd = -1;
    ep->has_self_proc = dp__proc_self(&ep->self_proc);
    ep->memcpy_max = o.memcpy_max < 0    ? 0
                     : o.memcpy_max == 0 ? SIZE_MAX
                                         : (size_t)o.memcpy_max;
    ep->spin_ns = spin_us * 1000;
    if (threads > 1 && (ep->copier = dp__copier_new((unsigned)threads)) == NULL) {
        free(ep);
        return dp__fail(d, DP_ENOMEM, "endpoint %s: out of memory", name);
    }
    if (pthread_mutex_init(&ep->mu, NULL) != 0) {
        dp__copier_destroy(ep->copier);
        free(ep);
        return dp__fail(d, DP_ENOMEM, "endpoint %s: cannot create mutex", name);
    }
    ep->mu_init = true;

    if ((rc = ucx_open(ep, d)) != DP_OK)
        goto fail;
    if (o.require_rdma && (rc = check_rdma_resources(ep, d)) != DP_OK)
        goto fail;
    dp__list_init(&ep->tsops);
    if ((rc = dp__ep_ts_init_locked(ep, d)) != DP_OK)
        goto fail;
    if (o.progress_thread) {
        int fd;
        if (ucp_worker_get_efd(ep->worker, &fd) == UCS_OK)
            ep->efd = fd;
        int e = pthread_create(&ep->thr, NULL, progress_main, ep);
        if (e != 0) {
            rc = dp__fail_sys(d, e, "endpoint %s: progress thread", name);
            goto fail;
        }
        ep->thr_started = true;
    }
    *out = ep;
    return DP_OK;
fail:
    dp__endpoint_destroy(ep);
    return rc;
}

void
dp__endpoint_close(dp__endpoint *ep)
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
    /* No op copies any more (they hold the lock while they do). */
    dp__copier_destroy(ep->copier);
    ep->copier = NULL;
    free(ep->runs);
    ep->runs = NULL;
    ep->n_runs = ep->runs_cap = 0;
    if (ep->n_retained > 0 || ep->ts_inflight > 0 || ep->keep_ucx) {
        /*
         * A retained transfer may still run: keep the context, worker, endpoints,
         * keys and memory registrations, for good. So for a served two-sided
         * reply or receive UCX still runs (UCX 1.13 asserts when a worker is
         * destroyed with requests on a connection a peer opened). And when the
         * process exits next (dp__endpoint_keep_ucx_at_close).
         */
        ep->abandoned = true;
        if (ep->n_retained > 0 || ep->ts_inflight > 0)
            DP_LOG_W("endpoint %s: closed with %" PRIu64 " unfinished transfers: its UCX "
                     "worker and memory are kept for the life of the process",
                     ep->name, ep->n_retained + ep->ts_inflight);
        unlock(ep);
        pthread_mutex_lock(&ab_mu);
        dp__list_insert_head(&ab_list, &ep->ab_link);
        pthread_mutex_unlock(&ab_mu);
        return;
    }
    dp__list all = {0};
    dp__list_move_tail(&all, &ep->remotes);
    dp__list_move_tail(&all, &ep->zombies);
    for (remote *r; (r = DP_LIST_FIRST(&all, remote, r_link)) != NULL;) {
        dp__list_remove(&all, &r->r_link);
        dp__ep_remote_free_locked(ep, r);
    }
    for (size_t i = 0; i < ep->regs.n; i++) {
        region *g = ep->regs.e[i].v;
        if (g->r_rkey != NULL)
            ucp_rkey_buffer_release(g->r_rkey);
        ucs_status_t st = ucp_mem_unmap(ep->ctx, g->r_memh);
        if (st != UCS_OK)
            DP_LOG_W("endpoint %s: ucp_mem_unmap: %s", ep->name, ucs_status_string(st));
        free(g);
    }
    dp__ranges_fini(&ep->regs);
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
dp__endpoint_keep_ucx_at_close(dp__endpoint *ep)
{
    if (ep != NULL)
        ep->keep_ucx = true;
}

void
dp__endpoint_destroy(dp__endpoint *ep)
{
    if (ep == NULL)
        return;
    dp__endpoint_close(ep);
    if (ep->abandoned)
        return; /* owned by ab_list now */
    if (ep->mu_init)
        pthread_mutex_destroy(&ep->mu);
    free(ep);
}

void
dp__endpoint_copy(dp__endpoint *ep, const dp__copy *jobs, size_t n)
{
    dp__copier_run(ep != NULL ? ep->copier : NULL, jobs, n);
}

const char *
dp__endpoint_name(const dp__endpoint *ep)
{
    return ep->name;
}

/* ---- memory ---- */

static int
region_add_locked(dp__endpoint *ep, uint64_t base, uint64_t len, bool allocate,
                  void **addr_out, dp_detail *d)
{
    char lim[32], sz[32];
    if (!allocate && (len == 0 || base + len < base ||
                      dp__ranges_overlap(&ep->regs, base, len) != NULL))
        goto overlap_or_bad;
    /* Room first: nothing can fail once UCX has mapped the memory. */
    if (dp__ranges_reserve(&ep->regs, 1) != DP_OK)
        return dp__fail(d, DP_ENOMEM, "endpoint %s: out of memory", ep->name);
    region *g = malloc(sizeof *g);
    if (g == NULL)
        return dp__fail(d, DP_ENOMEM, "endpoint %s: out of memory", ep->name);
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
    if (st != UCS_OK) {
        free(g);
        return dp__fail(d, st == UCS_ERR_NO_MEMORY ? DP_ENOMEM : DP_ETRANSFER,
                        "endpoint %s: %s of %s failed: %s (RLIMIT_MEMLOCK %s; RDMA "
                        "registration of large regions needs `ulimit -l unlimited`)",
                        ep->name, allocate ? "allocation" : "registration",
                        dp__fmt_size(len, sz, sizeof sz), ucs_status_string(st),
                        dp__fmt_memlock(lim, sizeof lim));
    }
    if (allocate) {
        ucp_mem_attr_t ma = {.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS};
        st = ucp_mem_query(memh, &ma);
        if (st != UCS_OK) {
            ucp_mem_unmap(ep->ctx, memh);
            free(g);
            return dp__ep_ucx_fail(d, DP_ETRANSFER, st, "endpoint %s: ucp_mem_query",
                                   ep->name);
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
        free(g);
        return dp__fail(d, DP_ETRANSFER, "endpoint %s: ucp_rkey_pack: %s (%zu bytes)",
                        ep->name, ucs_status_string(st), rkey_len);
    }
    *g = (region){.r_base = base,
                  .r_len = len,
                  .r_memh = memh,
                  .r_rkey = rkey,
                  .r_rkey_len = rkey_len,
                  .r_allocated = allocate};
    if (dp__ranges_add(&ep->regs, base, len, g) != DP_OK) {
        /* Memory UCX allocated over a region still registered (freed by its
         * owner without deregistering it): refused, the set stays disjoint. */
        ucp_rkey_buffer_release(rkey);
        ucp_mem_unmap(ep->ctx, memh);
        free(g);
        goto overlap_or_bad;
    }
    ep->gen++;
    if (addr_out != NULL)
        *addr_out = (void *)(uintptr_t)base;
    return DP_OK;
overlap_or_bad:
    if (len == 0 || base + len < base)
        return dp__fail(d, DP_EINVAL,
                        "endpoint %s: cannot register %" PRIu64 " bytes at 0x%" PRIx64,
                        ep->name, len, base);
    return dp__fail(d, DP_EEXIST,
                    "endpoint %s: [0x%" PRIx64 ", +%" PRIu64
                    ") overlaps a registered region",
                    ep->name, base, len);
}

int
dp__endpoint_register(dp__endpoint *ep, void *addr, size_t len, dp_detail *d)
{
    if (addr == NULL || len == 0)
        return dp__fail(d, DP_EINVAL,
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
dp__endpoint_alloc(dp__endpoint *ep, size_t len, void **addr, dp_detail *d)
{
    *addr = NULL;
    if (len == 0)
        return dp__fail(d, DP_EINVAL, "endpoint %s: alloc of 0 bytes", ep->name);
    /*
     * UCX backs this memory with a shared-memory file that it fills: a size
     * beyond the host's RAM would take all of it (and tmpfs) before failing.
     */
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    if (pages > 0 && psz > 0 && (uint64_t)len > (uint64_t)pages * (uint64_t)psz)
        return dp__fail(d, DP_ENOMEM,
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
dp__endpoint_deregister(dp__endpoint *ep, void *addr, dp_detail *d)
{
    uint64_t base = (uint64_t)(uintptr_t)addr;
    lock(ep);
    int rc = check_open_locked(ep, d);
    if (rc != DP_OK)
        goto out;
    dp__ranges_ent *e = dp__ranges_at(&ep->regs, base);
    if (e == NULL) {
        rc = dp__fail(d, DP_ENOTFOUND, "endpoint %s: no region starts at %p", ep->name,
                      addr);
        goto out;
    }
    region *g = e->v;
    if (g->r_busy > 0 || dp__graveyard_touches(g->r_base, g->r_len)) {
        rc = dp__fail(d, DP_EBUSY,
                      "endpoint %s: region %p (%" PRIu64 " bytes) is %s; it "
                      "stays registered and its memory must not be reused",
                      ep->name, addr, g->r_len,
                      g->r_busy > 0 ? "in use by a running transfer"
                                    : "touched by an unfinished transfer");
        goto out;
    }
    ucp_rkey_buffer_release(g->r_rkey);
    ucs_status_t st = ucp_mem_unmap(ep->ctx, g->r_memh);
    dp__ranges_remove(&ep->regs, e);
    free(g);
    ep->gen++;
    if (st != UCS_OK)
        rc = dp__ep_ucx_fail(d, DP_ETRANSFER, st, "endpoint %s: ucp_mem_unmap", ep->name);
out:
    unlock(ep);
    return rc;
}

/* ---- metadata ---- */

uint32_t
dp__ep_ucx_version(void)
{
    unsigned major = 0, minor = 0, release = 0;
    ucp_get_version(&major, &minor, &release);
    return (uint32_t)(major & 0xff) << 24 | (uint32_t)(minor & 0xff) << 16 |
           (uint32_t)(release & 0xffff);
}

int
dp__endpoint_metadata(dp__endpoint *ep, uint8_t **out, size_t *len, dp_detail *d)
{
    *out = NULL;
    *len = 0;
    lock(ep);
    int rc = check_open_locked(ep, d);
    if (rc != DP_OK) {
        unlock(ep);
        return rc;
    }
    dp__md_region *mr = calloc(ep->regs.n ? ep->regs.n : 1, sizeof *mr);
    if (mr == NULL) {
        unlock(ep);
        return dp__fail(d, DP_ENOMEM, "endpoint %s: out of memory", ep->name);
    }
    for (size_t i = 0; i < ep->regs.n; i++) {
        const region *g = ep->regs.e[i].v;
        mr[i] = (dp__md_region){.base = g->r_base,
                                .len = g->r_len,
                                .rkey = g->r_rkey,
                                .rkey_len = (uint32_t)g->r_rkey_len};
    }
    dp__buf b;
    dp__buf_init(&b);
    dp__md_fields f = {
        .name = ep->name,
        .gen = ep->gen,
        .xver = dp__ep_ucx_version(),
        .flags = ep->serving ? DP_MD_F_SERVES : 0,
        .proc = ep->has_self_proc ? &ep->self_proc : NULL,
        .addr = ep->waddr,
        .addr_len = ep->waddr_len,
        .regions = mr,
        .n_regions = ep->regs.n,
    };
    rc = dp__md_encode(&b, &f, d);
    unlock(ep);
    free(mr);
    if (rc != DP_OK) {
        dp__buf_fini(&b);
        return rc;
    }
    *out = dp__buf_steal(&b, len);
    return DP_OK;
}

void
dp__endpoint_get_stats(dp__endpoint *ep, dp__endpoint_stats *st)
{
    lock(ep);
    *st = ep->st;
    if (ep->copier != NULL)
        dp__copier_counts(ep->copier, &st->copies_parallel, &st->copies_parallel_bytes,
                          NULL);
    st->n_regions = ep->regs.n;
    size_t n = 0;
    for (dp__list_node *x = dp__list_first(&ep->remotes); x != NULL; x = dp__list_next(x))
        n++;
    st->n_remotes = n;
    unlock(ep);
}
