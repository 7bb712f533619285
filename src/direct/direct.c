/*
 * Direct transport: publish buffers under an object id, fetch them from
 * another process with one-sided READ over the endpoint (src/xfer). This
 * file is the transport itself: its options, create and destroy, its names,
 * the EFA probe and the stats. Publishing is publish.c, fetching fetch.c;
 * the parts behind them are regcache.c, lru.c and worker.c, all sharing
 * direct_int.h (the struct, the overview, the locks).
 *
 * Design notes
 * ------------
 * - A request uses its transport (workers, endpoint, cache) until it is
 *   destroyed, so dp_direct_destroy refuses (DP_EBUSY) while the live list
 *   is not empty, checked under mu; it never frees under a request.
 */
#include "direct/direct.h"

#include <dirent.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "dataplane/version.h"
#include "direct/direct_int.h"

#define DEFAULT_LRU 16
#define DEFAULT_TIMEOUT_S 60.0
#define DEFAULT_FETCH_CACHE (256u << 20)
#define DEFAULT_CHUNK (64u << 20)
#define DEFAULT_WORKERS 2

static const char *sysfs_root = "/sys";

/*
 * Physical memory of this host. UCX backs memory it allocates with shared
 * memory and populates it: a request larger than the host fills /dev/shm and
 * starves every process, so sizes that come from options or from untrusted
 * metadata are checked against this first.
 */
uint64_t
dp__direct_phys_bytes(void)
{
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    return pages > 0 && psz > 0 ? (uint64_t)pages * (uint64_t)psz : UINT64_MAX;
}

/* ---- test hooks ---- */

bool
dp__direct_find_efa(const char *root, char *what, size_t cap)
{
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/class/net", root);
    DIR *dir = opendir(path);
    if (dir != NULL) {
        struct dirent *e;
        while ((e = readdir(dir)) != NULL) {
            if (strncmp(e->d_name, "efa", 3) == 0) {
                snprintf(what, cap, "netdev %s", e->d_name);
                closedir(dir);
                return true;
            }
        }
        closedir(dir);
    }
    snprintf(path, sizeof path, "%s/class/infiniband", root);
    dir = opendir(path);
    if (dir == NULL)
        return false;
    struct dirent *e;
    bool found = false;
    while (!found && (e = readdir(dir)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        /* A verbs device is EFA only when bound to the efa driver, whatever
         * its name (an InfiniBand or RoCE NIC shows up here too). A broken
         * entry is skipped: it must not stop the scan. */
        char link[PATH_MAX + 320], real[PATH_MAX];
        snprintf(link, sizeof link, "%s/%s/device/driver", path, e->d_name);
        if (strlen(link) >= PATH_MAX || realpath(link, real) == NULL)
            continue;
        const char *slash = strrchr(real, '/');
        if (strcmp(slash != NULL ? slash + 1 : real, "efa") == 0) {
            snprintf(what, cap, "verbs device %s (driver efa)", e->d_name);
            found = true;
        }
    }
    closedir(dir);
    return found;
}

void
dp__direct_set_sysfs_root(const char *root)
{
    sysfs_root = root != NULL ? root : "/sys";
}

/* ---- public API ---- */

void
dp_direct_opts_init(dp_direct_opts *o)
{
    memset(o, 0, sizeof *o);
    o->remote_cache_size = DEFAULT_LRU;
    o->xfer_timeout_s = DEFAULT_TIMEOUT_S;
    o->chunk_bytes = DEFAULT_CHUNK;
    o->n_workers = DEFAULT_WORKERS;
}

const char *
dp_direct_name(const dp_direct *t)
{
    return t->name;
}

const char *
dp_direct_backend_name(const dp_direct *t)
{
    DP_UNUSED(t);
    return BACKEND;
}

int
dp_direct_create(const dp_direct_opts *opts, dp_direct **out, dp_detail *d)
{
    *out = NULL;
    dp_direct_opts o;
    if (opts != NULL)
        o = *opts;
    else
        memset(&o, 0, sizeof o); /* zero is every default */
    for (size_t i = 0; i < DP_ARRAY_LEN(o.reserved); i++)
        if (o.reserved[i] != 0)
            return dp__fail(d, DP_EINVAL,
                            "direct: dp_direct_opts.reserved[%zu] is not zero (zero the "
                            "struct; a program built against a newer dataplane than %s "
                            "needs that version)",
                            i, DP_VERSION_STRING);
    if (o.n_workers < 0 || o.n_workers > MAX_WORKERS || o.xfer_timeout_s < 0 ||
        !isfinite(o.xfer_timeout_s) ||
        (o.backend != DP_DIRECT_BACKEND_AUTO && o.backend != DP_DIRECT_BACKEND_UCX))
        return dp__fail(d, DP_EINVAL,
                        "direct: bad options (n_workers %d: 0..%d, xfer_timeout_s %g, "
                        "backend %d)",
                        o.n_workers, MAX_WORKERS, o.xfer_timeout_s, (int)o.backend);
    const char *eb = getenv("DP_DIRECT_BACKEND");
    if (eb != NULL && *eb != '\0') {
        if (strcasecmp(eb, "ucx") == 0)
            o.backend = DP_DIRECT_BACKEND_UCX;
        else
            return dp__fail(d, DP_EUNSUPPORTED,
                            "direct: DP_DIRECT_BACKEND=%s: only the UCX backend is "
                            "available in this build (the libfabric backend is not)",
                            eb);
    }
    char efa[300];
    if (o.backend == DP_DIRECT_BACKEND_AUTO &&
        dp__direct_find_efa(sysfs_root, efa, sizeof efa))
        return dp__fail(d, DP_EUNSUPPORTED,
                        "direct: AWS EFA found (%s): EFA wants the libfabric backend, "
                        "which is not available in this build. To use UCX anyway, set "
                        "backend = DP_DIRECT_BACKEND_UCX (or DP_DIRECT_BACKEND=ucx) and "
                        "check UCX_TLS and UCX_NET_DEVICES",
                        efa);

    dp_direct *t = calloc(1, sizeof *t);
    if (t == NULL)
        return dp__fail(d, DP_ENOMEM, "direct: transport object");
    int rc;
    t->lru_max = o.remote_cache_size == 0  ? DEFAULT_LRU
                 : o.remote_cache_size < 0 ? 0 /* DP_DIRECT_REMOTE_CACHE_OFF */
                                           : o.remote_cache_size;
    t->timeout_s = o.xfer_timeout_s > 0 ? o.xfer_timeout_s : DEFAULT_TIMEOUT_S;
    t->fbuf_max = o.fetch_cache_bytes == DP_DIRECT_FETCH_CACHE_OFF ? 0
                  : o.fetch_cache_bytes > 0
                      ? o.fetch_cache_bytes
                      : DP_MIN(DEFAULT_FETCH_CACHE, dp__direct_phys_bytes() / 8);
    t->chunk = o.chunk_bytes > 0 ? o.chunk_bytes : DEFAULT_CHUNK;
    t->n_workers = o.n_workers > 0 ? o.n_workers : DEFAULT_WORKERS;
    dp__map_init_u64(&t->regs);
    dp__map_init_str(&t->objs);
    dp__map_init_str(&t->aborted);
    pthread_mutex_init(&t->cache_mu, NULL);
    pthread_mutex_init(&t->mu, NULL);
    pthread_cond_init(&t->cv, NULL);
    pthread_cond_init(&t->work_cv, NULL);
    pthread_mutex_init(&t->lru_mu, NULL);
    pthread_cond_init(&t->lru_cv, NULL);
    t->locks_init = true;
    if (o.name != NULL) {
        snprintf(t->name, sizeof t->name, "%s", o.name);
    } else {
        char hex[33];
        if ((rc = dp__random_hex_id(hex, d)) != DP_OK)
            goto fail;
        snprintf(t->name, sizeof t->name, "direct-%.16s", hex);
    }
    dp__endpoint_opts eo;
    dp__endpoint_opts_init(&eo);
    eo.progress_thread = !o.no_progress_thread;
    /* Fetches of plain memory are emulated RMA this thread serves (above). */
    eo.spin_after_any_event = true;
    rc = dp__endpoint_create(t->name, &eo, &t->ep, d);
    if (rc != DP_OK) {
        dp__fail_ctx(d, rc,
                     "direct (backend " BACKEND "): cannot start the endpoint (UCX_TLS = "
                     "%s; rerun with UCX_LOG_LEVEL=debug)",
                     env_or("UCX_TLS", "unset"));
        goto fail;
    }
    if (o.pool_bytes > dp__direct_phys_bytes() / 2) {
        char a[32], b[32];
        rc = dp__fail(d, DP_EINVAL,
                      "direct: a memory pool of %s (%zu bytes) exceeds half of this "
                      "host's %s of memory",
                      dp__fmt_size(o.pool_bytes, a, sizeof a), o.pool_bytes,
                      dp__fmt_size(dp__direct_phys_bytes(), b, sizeof b));
        goto fail;
    }
    if (o.pool_bytes > 0) {
        rc = dp__endpoint_alloc(t->ep, o.pool_bytes, &t->pool_base, d);
        if (rc != DP_OK) {
            dp__direct_reg_fail(d, rc, "the memory pool", NULL, o.pool_bytes);
            goto fail;
        }
        t->pool_bytes = o.pool_bytes;
        if ((rc = dp__slab_alloc_create(o.pool_bytes, 64, &t->pool, d)) != DP_OK)
            goto fail;
    }
    for (int i = 0; i < t->n_workers; i++) {
        int e = pthread_create(&t->workers[i], NULL, dp__direct_worker_main, t);
        if (e != 0) {
            rc = dp__fail_sys(d, e, "direct: starting fetch worker %d", i);
            goto fail;
        }
        t->n_started++;
    }
    *out = t;
    return DP_OK;
fail:
    dp_direct_destroy(t, NULL);
    return rc;
}

int
dp_direct_destroy(dp_direct *t, dp_detail *d)
{
    if (t == NULL)
        return DP_OK;
    if (t->locks_init) {
        pthread_mutex_lock(&t->mu);
        if (!dp__list_empty(&t->live)) {
            size_t n = 0;
            for (dp__list_node *x = dp__list_first(&t->live); x != NULL;
                 x = dp__list_next(x))
                n++;
            int rc =
                dp__fail(d, DP_EBUSY,
                         "direct %s: %zu fetch request%s still alive (object %s): "
                         "dp_direct_req_destroy them before destroying the transport",
                         t->name, n, n == 1 ? " is" : "s are",
                         DP_LIST_FIRST(&t->live, dp_direct_req, llink)->obj_id);
            pthread_mutex_unlock(&t->mu);
            return rc;
        }
        /* No request lives: the queue is empty and no waiter runs a fetch. */
        t->stopping = true;
        pthread_cond_broadcast(&t->work_cv);
        pthread_mutex_unlock(&t->mu);
    }
    for (int i = 0; i < t->n_started; i++)
        pthread_join(t->workers[i], NULL);
    void *v;
    for (size_t it = 0; dp__map_next(&t->objs, &it, NULL, NULL, NULL, &v);) {
        pub_obj *o = v;
        free(o->keys);
        free(o);
    }
    for (size_t it = 0; dp__map_next(&t->regs, &it, NULL, NULL, NULL, &v);)
        free(v);
    dp__map_fini(&t->objs);
    dp__map_fini(&t->regs);
    dp__ranges_fini(&t->reg_ranges);
    dp__map_fini(&t->aborted);
    /* Retired buffers no longer touched are freed; the others stay registered
     * (the endpoint keeps what retained transfers touch) and charged. */
    if (t->locks_init)
        dp__direct_fbuf_reclaim(t);
    dp__direct_fbuf_drop(t, t->fbufs, t->n_fbufs);
    free(t->fbufs);
    free(t->retired);
    /* The endpoint deregisters everything, keeping what retained transfers touch. */
    dp__endpoint_destroy(t->ep);
    dp__slab_alloc_destroy(t->pool);
    free(t->lru);
    if (t->locks_init) {
        pthread_mutex_destroy(&t->cache_mu);
        pthread_mutex_destroy(&t->mu);
        pthread_cond_destroy(&t->cv);
        pthread_cond_destroy(&t->work_cv);
        pthread_mutex_destroy(&t->lru_mu);
        pthread_cond_destroy(&t->lru_cv);
    }
    free(t);
    return DP_OK;
}

void
dp_direct_get_stats(dp_direct *t, dp_direct_stats *st)
{
    memset(st, 0, sizeof *st);
    pthread_mutex_lock(&t->cache_mu);
    st->version = t->version;
    st->objects = dp__map_len(&t->objs);
    void *v;
    for (size_t it = 0; dp__map_next(&t->regs, &it, NULL, NULL, NULL, &v);) {
        reg_entry *e = v;
        if (!e->pool) {
            st->registrations++;
            st->registered_bytes += e->len;
        }
    }
    st->registers = t->registers;
    st->deregisters = t->deregisters;
    st->pool_bytes = t->pool_bytes;
    st->pool_used = t->pool_used;
    st->pool_blocks = t->pool_blocks;
    pthread_mutex_unlock(&t->cache_mu);
    pthread_mutex_lock(&t->mu);
    st->fetches = t->fetches;
    st->fetch_ok = t->fetch_ok;
    st->fetch_failed = t->fetch_failed;
    st->fetch_aborted = t->fetch_aborted;
    st->fetch_by_waiter = t->fetch_stolen;
    st->fetch_buf_reused = t->fbuf_reused;
    st->fetch_buf_cached = t->fbuf_bytes;
    st->fetch_buf_retired = t->n_retired;
    st->fetch_buf_reclaimed = t->fbuf_reclaimed;
    st->bytes_fetched = t->bytes_fetched;
    pthread_mutex_unlock(&t->mu);
    pthread_mutex_lock(&t->lru_mu);
    st->remote_adds = t->remote_adds;
    st->remote_readds = t->remote_readds;
    st->remote_hits = t->remote_hits;
    st->remote_evictions = t->remote_evictions;
    st->remotes_cached = t->lru_n;
    pthread_mutex_unlock(&t->lru_mu);
}
