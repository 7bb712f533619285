/*
 * Direct transport: publish buffers under an object id, fetch them from
 * another process with one-sided READ over the endpoint (src/xfer). This
 * file is the API: create/destroy, publish and free, fetch, wait, abort and
 * the request accessors, stats; the parts behind it are regcache.c, lru.c
 * and worker.c, sharing direct_int.h (the struct, the overview, the locks).
 *
 * Design notes
 * ------------
 * - dp_direct_fetch parses the metadata, registers the targets (or allocates
 *   registered memory of its own, bounded by half the host's memory: the
 *   metadata is from outside) and queues the request for one worker; a
 *   pending abort of the id fails it instead (and is used up), checked in the
 *   critical section that makes the request live.
 * - dp_direct_wait(-1) on a request no worker took yet runs it on the
 *   caller's thread; a bounded wait never does, so it can return in time.
 * - dp_direct_req_destroy waits for the request to end (aborting it first), so
 *   memory is released only by the caller's thread, never under a transfer.
 * - A request uses its transport (workers, endpoint, cache) until it is
 *   destroyed, so dp_direct_destroy refuses (DP_EBUSY) while the live list
 *   is not empty, checked under mu; it never frees under a request.
 */
#include "direct/direct.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "dataplane/version.h"
#include "direct/direct_int.h"
#include "xfer/graveyard.h"

#define DEFAULT_LRU 16
#define DEFAULT_TIMEOUT_S 60.0
#define DEFAULT_FETCH_CACHE (256u << 20)
#define DEFAULT_CHUNK (64u << 20)
#define DEFAULT_WORKERS 2

/* A fetch buffer the transport allocated (kept for reuse, or retired). */
struct fetch_buf {
    void *p;
    size_t len;
};

static void fbuf_drop(dp_direct *t, const struct fetch_buf *b, size_t n);
static void fbuf_reclaim(dp_direct *t);

static const char *sysfs_root = "/sys";

/*
 * Physical memory of this host. UCX backs memory it allocates with shared
 * memory and populates it: a request larger than the host fills /dev/shm and
 * starves every process, so sizes that come from options or from untrusted
 * metadata are checked against this first.
 */
static uint64_t
phys_bytes(void)
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
                      : DP_MIN(DEFAULT_FETCH_CACHE, phys_bytes() / 8);
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
    if (o.pool_bytes > phys_bytes() / 2) {
        char a[32], b[32];
        rc = dp__fail(d, DP_EINVAL,
                      "direct: a memory pool of %s (%zu bytes) exceeds half of this "
                      "host's %s of memory",
                      dp__fmt_size(o.pool_bytes, a, sizeof a), o.pool_bytes,
                      dp__fmt_size(phys_bytes(), b, sizeof b));
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
        fbuf_reclaim(t);
    fbuf_drop(t, t->fbufs, t->n_fbufs);
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

int
dp_direct_register_permanent(dp_direct *t, void *addr, size_t len, dp_detail *d)
{
    if (addr == NULL || len == 0)
        return dp__fail(d, DP_EINVAL, "direct: register_permanent needs memory (%p, %zu)",
                        addr, len);
    uint64_t key;
    pthread_mutex_lock(&t->cache_mu);
    int rc = dp__direct_reg_acquire_locked(t, addr, len, "permanent buffer", &key, d);
    if (rc == DP_OK) {
        reg_entry *e = dp__map_get_u64(&t->regs, key);
        e->permanent = true;
        e->refs--;
    }
    pthread_mutex_unlock(&t->cache_mu);
    return rc;
}

int
dp_direct_deregister_permanent(dp_direct *t, void *addr, size_t len, dp_detail *d)
{
    if (addr == NULL || len == 0)
        return dp__fail(d, DP_EINVAL,
                        "direct: deregister_permanent needs memory (%p, %zu)", addr, len);
    pthread_mutex_lock(&t->cache_mu);
    reg_entry *e = NULL;
    dp_detail fd;
    dp_detail_clear(&fd);
    int rc = dp__direct_find_reg_locked(t, (uint64_t)(uintptr_t)addr, len, &e, &fd);
    if (rc != DP_OK || e == NULL || !e->permanent) {
        pthread_mutex_unlock(&t->cache_mu);
        return dp__fail(d, DP_ENOTFOUND,
                        "direct: no permanent registration holds %p (%zu bytes): "
                        "register_permanent it first",
                        addr, len);
    }
    e->permanent = false;
    e->refs++; /* released at once: deregistered unless an object or fetch holds it */
    dp__direct_reg_release_locked(t, e->base);
    pthread_mutex_unlock(&t->cache_mu);
    return DP_OK;
}

int
dp_direct_publish(dp_direct *t, const char *obj_id, const dp_direct_buf *bufs, size_t n,
                  uint8_t **md, size_t *md_len, dp_detail *d)
{
    *md = NULL;
    *md_len = 0;
    size_t idlen = obj_id != NULL ? strlen(obj_id) : 0;
    int rc = dp__direct_check_id(obj_id, idlen, d);
    if (rc != DP_OK)
        return rc;
    if (n > DP_DIRECT_BUFS_MAX || (n > 0 && bufs == NULL))
        return dp__fail(d, DP_EINVAL, "direct: publish of %zu buffers (max %u)", n,
                        DP_DIRECT_BUFS_MAX);
    for (size_t i = 0; i < n; i++)
        if (bufs[i].addr == NULL || bufs[i].len == 0)
            return dp__fail(d, DP_EINVAL,
                            "direct: object %s buffer %zu is empty (%p, %zu)", obj_id, i,
                            bufs[i].addr, bufs[i].len);
    pub_obj *o = calloc(1, sizeof *o);
    dp__direct_desc *descs = calloc(n ? n : 1, sizeof *descs);
    uint64_t *keys = calloc(n ? n : 1, sizeof *keys);
    uint8_t *emd = NULL;
    size_t emd_len = 0, taken = 0;
    dp__buf out;
    dp__buf_init(&out);
    if (o == NULL || descs == NULL || keys == NULL) {
        free(o);
        free(descs);
        free(keys);
        return dp__fail(d, DP_ENOMEM, "direct: publish of %zu buffers", n);
    }
    pthread_mutex_lock(&t->cache_mu);
    if (dp__map_get(&t->objs, obj_id, idlen) != NULL) {
        rc = dp__fail(d, DP_EEXIST, "direct: object %s is already published", obj_id);
        goto fail;
    }
    /* The pool takes the buffers only if none has a registration of its own. */
    bool use_pool = t->pool != NULL;
    for (size_t i = 0; use_pool && i < n; i++) {
        reg_entry *e = NULL;
        if (dp__direct_find_reg_locked(t, (uint64_t)(uintptr_t)bufs[i].addr, bufs[i].len,
                                       &e, NULL) != DP_OK ||
            e != NULL)
            use_pool = false;
    }
    for (taken = 0; taken < n; taken++) {
        const dp_direct_buf *b = &bufs[taken];
        if (use_pool) {
            rc =
                dp__direct_pool_acquire_locked(t, b, &keys[taken], &descs[taken].addr, d);
        } else {
            rc = dp__direct_reg_acquire_locked(t, b->addr, b->len, "buffer", &keys[taken],
                                               d);
            descs[taken].addr = (uint64_t)(uintptr_t)b->addr;
        }
        if (rc != DP_OK) {
            dp__fail_ctx(d, rc, "direct: publish %s, buffer %zu of %zu", obj_id, taken,
                         n);
            goto fail;
        }
        descs[taken].len = b->len;
    }
    if ((rc = dp__endpoint_metadata(t->ep, &emd, &emd_len, d)) != DP_OK)
        goto fail;
    dp_direct_md_fields f = {
        .obj_id = obj_id,
        .backend = BACKEND,
        .name = t->name,
        .version = t->version,
        .ep_md = emd,
        .ep_md_len = emd_len,
        .descs = descs,
        .n_descs = n,
    };
    if ((rc = dp__direct_md_encode(&out, &f, d)) != DP_OK)
        goto fail;
    o->n = n;
    o->keys = keys;
    if (dp__map_put(&t->objs, obj_id, idlen, o, NULL) != DP_OK) {
        rc = dp__fail(d, DP_ENOMEM, "direct: object table");
        goto fail;
    }
    pthread_mutex_unlock(&t->cache_mu);
    free(emd);
    free(descs);
    *md = dp__buf_steal(&out, md_len);
    return DP_OK;
fail:
    /* Undo exactly what this call took, newest first. */
    while (taken-- > 0)
        dp__direct_reg_release_locked(t, keys[taken]);
    pthread_mutex_unlock(&t->cache_mu);
    dp__buf_fini(&out);
    free(emd);
    free(descs);
    free(keys);
    free(o);
    return rc;
}

int
dp_direct_free(dp_direct *t, const char *obj_id, dp_detail *d)
{
    size_t idlen = obj_id != NULL ? strlen(obj_id) : 0;
    pthread_mutex_lock(&t->cache_mu);
    pub_obj *o = obj_id != NULL ? dp__map_del(&t->objs, obj_id, idlen) : NULL;
    if (o == NULL) {
        pthread_mutex_unlock(&t->cache_mu);
        return dp__fail(d, DP_ENOTFOUND, "direct: object %s is not published",
                        obj_id != NULL ? obj_id : "(null)");
    }
    for (size_t i = o->n; i-- > 0;)
        dp__direct_reg_release_locked(t, o->keys[i]);
    pthread_mutex_unlock(&t->cache_mu);
    free(o->keys);
    free(o);
    return DP_OK;
}

/* ---- fetch buffers kept for reuse (fetch_cache_bytes) ---- */

/* At most this many buffers are kept (the oldest go first). */
#define FBUF_MAX 64

/* Deregister and unmap n buffers (no lock held). */
static void
fbuf_drop(dp_direct *t, const struct fetch_buf *b, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        dp_detail d;
        if (dp__endpoint_deregister(t->ep, b[i].p, &d) == DP_OK)
            munmap(b[i].p, b[i].len);
        else /* never touched by a transfer once cached; kept if ever */
            DP_LOG_W("direct %s: cached fetch buffer kept for good: %s", t->name, d.msg);
    }
}

/*
 * A freed fetch buffer: kept registered for the next fetches (true), the
 * oldest ones let go to make room. Not kept when larger than the cache or
 * touched by an unfinished transfer (the caller deregisters or keeps it).
 */
static bool
fbuf_keep(dp_direct *t, void *p, size_t len)
{
    if (len > t->fbuf_max || dp__graveyard_touches((uint64_t)(uintptr_t)p, len))
        return false;
    pthread_mutex_lock(&t->mu);
    if (t->stopping ||
        (t->fbufs == NULL && (t->fbufs = calloc(FBUF_MAX, sizeof *t->fbufs)) == NULL)) {
        pthread_mutex_unlock(&t->mu);
        return false;
    }
    size_t k = 0, freed = 0;
    while (k < t->n_fbufs &&
           (t->fbuf_bytes - freed + len > t->fbuf_max || t->n_fbufs - k >= FBUF_MAX))
        freed += t->fbufs[k++].len;
    struct fetch_buf out[FBUF_MAX];
    memcpy(out, t->fbufs, k * sizeof *out);
    memmove(t->fbufs, t->fbufs + k, (t->n_fbufs - k) * sizeof *t->fbufs);
    t->n_fbufs -= k;
    t->fbufs[t->n_fbufs++] = (struct fetch_buf){p, len};
    t->fbuf_bytes = t->fbuf_bytes - freed + len;
    pthread_mutex_unlock(&t->mu);
    fbuf_drop(t, out, k);
    return true;
}

/*
 * Retire a fetch buffer a failed READ still touches (charged to the
 * graveyard): fbuf_take takes it back once that READ ended. False when the
 * list cannot grow (the caller keeps the buffer for good).
 */
static bool
fbuf_retire(dp_direct *t, void *p, size_t len)
{
    pthread_mutex_lock(&t->mu);
    if (t->n_retired == t->retired_cap) {
        size_t cap = t->retired_cap ? 2 * t->retired_cap : 8;
        struct fetch_buf *g = realloc(t->retired, cap * sizeof *g);
        if (g == NULL) {
            pthread_mutex_unlock(&t->mu);
            return false;
        }
        t->retired = g;
        t->retired_cap = cap;
    }
    t->retired[t->n_retired++] = (struct fetch_buf){p, len};
    pthread_mutex_unlock(&t->mu);
    dp__graveyard_retain_buffer(len);
    return true;
}

/*
 * Retired buffers whose READs ended (UCX completed or purged them) stop
 * counting and go to the cache, or are freed (all of them once stopping).
 */
static void
fbuf_reclaim(dp_direct *t)
{
    for (;;) {
        struct fetch_buf back[8];
        size_t n = 0;
        pthread_mutex_lock(&t->mu);
        for (size_t i = 0; i < t->n_retired && n < 8;) {
            struct fetch_buf b = t->retired[i];
            if (dp__graveyard_touches((uint64_t)(uintptr_t)b.p, b.len)) {
                i++;
                continue;
            }
            back[n++] = b;
            t->retired[i] = t->retired[--t->n_retired];
            t->fbuf_reclaimed++;
        }
        pthread_mutex_unlock(&t->mu);
        if (n == 0)
            return;
        for (size_t i = 0; i < n; i++) {
            dp__graveyard_release_buffer(back[i].len);
            DP_LOG_I("direct %s: a retired fetch buffer (%zu bytes) is touched no more: "
                     "taken back",
                     t->name, back[i].len);
            if (!fbuf_keep(t, back[i].p, back[i].len))
                fbuf_drop(t, &back[i], 1);
        }
    }
}

/*
 * The smallest cached buffer of len to 2 len bytes, taken out of the cache;
 * NULL if none.
 */
static void *
fbuf_take(dp_direct *t, size_t len, size_t *got)
{
    pthread_mutex_lock(&t->mu);
    if (t->n_retired > 0) {
        pthread_mutex_unlock(&t->mu);
        fbuf_reclaim(t);
        pthread_mutex_lock(&t->mu);
    }
    size_t best = SIZE_MAX;
    for (size_t i = 0; i < t->n_fbufs; i++)
        if (t->fbufs[i].len >= len && t->fbufs[i].len / 2 <= len &&
            (best == SIZE_MAX || t->fbufs[i].len < t->fbufs[best].len))
            best = i;
    void *p = NULL;
    if (best != SIZE_MAX) {
        p = t->fbufs[best].p;
        *got = t->fbufs[best].len;
        t->fbuf_bytes -= *got;
        memmove(t->fbufs + best, t->fbufs + best + 1,
                (t->n_fbufs - best - 1) * sizeof *t->fbufs);
        t->n_fbufs--;
        t->fbuf_reused++;
    }
    pthread_mutex_unlock(&t->mu);
    return p;
}

static void
req_free(dp_direct_req *r)
{
    if (r == NULL)
        return;
    dp_direct *t = r->t;
    dp__direct_release_targets(r);
    if (r->own_buf != NULL && !fbuf_keep(t, r->own_buf, r->own_len)) {
        dp_detail d;
        dp_detail_clear(&d);
        if (dp__endpoint_deregister(t->ep, r->own_buf, &d) == DP_OK) {
            munmap(r->own_buf, r->own_len);
        } else if (!fbuf_retire(t, r->own_buf, r->own_len)) {
            /* A retained transfer may still write into it: never freed. */
            dp__graveyard_retain_buffer(r->own_len);
            DP_LOG_W("direct %s: fetch buffer of object %s kept for good: %s", t->name,
                     r->obj_id, d.msg);
        } else {
            DP_LOG_I("direct %s: fetch buffer of object %s retired until the failed "
                     "READ that touches it ends: %s",
                     t->name, r->obj_id, d.msg);
        }
    }
    dp__direct_md_fini(&r->md);
    free(r->md_bytes);
    free(r->local);
    free(r->target_keys);
    free(r);
}

/* Give r its own copy of the metadata md, parsed and checked to be of r's object. */
static int
req_load_md(dp_direct_req *r, const void *md, size_t md_len, dp_detail *d)
{
    int rc;
    r->md_bytes = malloc(md_len);
    if (r->md_bytes == NULL)
        return dp__fail(d, DP_ENOMEM, "direct: %zu bytes of metadata", md_len);
    memcpy(r->md_bytes, md, md_len);
    if ((rc = dp__direct_md_parse(r->md_bytes, md_len, &r->md, d)) != DP_OK)
        return rc;
    if (strcmp(r->md.obj_id, r->obj_id) != 0)
        return dp__fail(d, DP_EINVAL,
                        "direct: fetch of %s with the metadata of object %s", r->obj_id,
                        r->md.obj_id);
    r->n = r->md.n_descs;
    return DP_OK;
}

/*
 * Allocate r's per-buffer arrays; with targets, first check there is one per
 * buffer of the object, then that each has its buffer's length.
 */
static int
req_check_targets(dp_direct_req *r, const dp_direct_buf *targets, size_t n_targets,
                  dp_detail *d)
{
    if (targets != NULL && n_targets != r->n)
        return dp__fail(d, DP_EINVAL,
                        "direct: object %s has %zu buffers, %zu targets given", r->obj_id,
                        r->n, n_targets);
    r->local = calloc(r->n ? r->n : 1, sizeof *r->local);
    r->target_keys = calloc(r->n ? r->n : 1, sizeof *r->target_keys);
    if (r->local == NULL || r->target_keys == NULL)
        return dp__fail(d, DP_ENOMEM, "direct: fetch of %zu buffers", r->n);
    for (size_t i = 0; targets != NULL && i < r->n; i++)
        if (targets[i].addr == NULL || targets[i].len != r->md.descs[i].len)
            return dp__fail(d, DP_EINVAL,
                            "direct: object %s buffer %zu has %" PRIu64
                            " bytes, target has %zu at %p",
                            r->obj_id, i, r->md.descs[i].len, targets[i].len,
                            targets[i].addr);
    return DP_OK;
}

/* Register the caller's targets as r's local side (all of them, or none). */
static int
req_hold_targets(dp_direct_req *r, const dp_direct_buf *targets, dp_detail *d)
{
    dp_direct *t = r->t;
    int rc = DP_OK;
    size_t k;
    pthread_mutex_lock(&t->cache_mu);
    for (k = 0; k < r->n; k++) {
        rc = dp__direct_reg_acquire_locked(t, targets[k].addr, targets[k].len,
                                           "fetch target", &r->target_keys[k], d);
        if (rc != DP_OK)
            break;
        r->local[k] = (dp__range){(uint64_t)(uintptr_t)targets[k].addr, targets[k].len};
    }
    if (rc != DP_OK)
        while (k-- > 0)
            dp__direct_reg_release_locked(t, r->target_keys[k]);
    pthread_mutex_unlock(&t->cache_mu);
    if (rc != DP_OK)
        return rc;
    r->targets_held = true;
    return DP_OK;
}

/*
 * Give r a buffer of its own (own_buf) as its local side: a 64-byte aligned
 * slot per buffer of the object.
 */
static int
req_own_buffer(dp_direct_req *r, dp_detail *d)
{
    dp_direct *t = r->t;
    int rc;
    /* Each length is bounded first, so the sum cannot wrap (metadata is
     * from outside). */
    uint64_t total = 0, limit = phys_bytes() / 2;
    for (size_t i = 0; i < r->n && total <= limit; i++)
        total +=
            r->md.descs[i].len > limit ? limit + 1 : DP_ALIGN_UP(r->md.descs[i].len, 64);
    if (total > SIZE_MAX || total > limit) {
        char a[32];
        return dp__fail(d, DP_ETOOBIG,
                        "direct: object %s needs %" PRIu64 " bytes, more than half of "
                        "this host's %s of memory: fetch it into targets of your own",
                        r->obj_id, total, dp__fmt_size(phys_bytes(), a, sizeof a));
    }
    /*
     * A freed fetch buffer of about the size, kept registered and faulted
     * in (fetch_cache_bytes), else plain anonymous memory, registered: the
     * local side of a READ need not be shared memory (UCX's shared-memory
     * allocation creates and fills a file). A 64 MiB fetch: 44 ms into
     * UCX-allocated memory, 36 ms into fresh anonymous memory, 11-14 ms
     * into memory already faulted in (docs/design.md, "Direct transport").
     */
    size_t len = DP_ALIGN_UP((size_t)total, (size_t)sysconf(_SC_PAGESIZE));
    void *buf = fbuf_take(t, len, &len);
    if (buf == NULL) {
        buf = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (buf == MAP_FAILED)
            return dp__fail(d, DP_ENOMEM, "direct: fetch buffer of %zu bytes: %s", len,
                            strerror(errno));
        rc = dp__endpoint_register(t->ep, buf, len, d);
        if (rc != DP_OK) {
            munmap(buf, len);
            dp__direct_reg_fail(d, rc, "the fetch buffer", NULL, len);
            return rc;
        }
    }
    r->own_buf = buf;
    r->own_len = len;
    uint64_t off = 0;
    for (size_t i = 0; i < r->n; i++) {
        r->local[i] =
            (dp__range){(uint64_t)(uintptr_t)r->own_buf + off, r->md.descs[i].len};
        off += DP_ALIGN_UP(r->md.descs[i].len, 64);
    }
    return DP_OK;
}

/*
 * Make r live and queue it for the worker. A pending abort of this id fails
 * this fetch (and is used up). Checked in the same critical section that
 * makes the request live, so an abort in between either finds the request or
 * leaves its mark for this check.
 */
static int
req_go_live(dp_direct_req *r, size_t idlen, dp_detail *d)
{
    dp_direct *t = r->t;
    pthread_mutex_lock(&t->mu);
    if (t->stopping) {
        pthread_mutex_unlock(&t->mu);
        return dp__fail(d, DP_ECLOSED, "direct: transport is being destroyed");
    }
    if (dp__map_del(&t->aborted, r->obj_id, idlen) != NULL) {
        pthread_mutex_unlock(&t->mu);
        return dp__fail(d, DP_ECANCELED, "direct: fetch of object %s aborted", r->obj_id);
    }
    set_state(r, REQ_QUEUED);
    dp__list_insert_head(&t->live, &r->llink);
    dp__list_insert_tail(&t->queue, &r->qlink);
    t->fetches++;
    pthread_cond_signal(&t->work_cv); /* one worker; waiters wait for END only */
    pthread_mutex_unlock(&t->mu);
    return DP_OK;
}

int
dp_direct_fetch(dp_direct *t, const char *obj_id, const void *md, size_t md_len,
                const dp_direct_buf *targets, size_t n_targets, dp_direct_req **out,
                dp_detail *d)
{
    *out = NULL;
    size_t idlen = obj_id != NULL ? strlen(obj_id) : 0;
    int rc = dp__direct_check_id(obj_id, idlen, d);
    if (rc != DP_OK)
        return rc;
    if (md == NULL || md_len == 0)
        return dp__fail(d, DP_EINVAL, "direct: fetch of %s without metadata", obj_id);
    dp_direct_req *r = calloc(1, sizeof *r);
    if (r == NULL)
        return dp__fail(d, DP_ENOMEM, "direct: fetch request");
    r->t = t;
    snprintf(r->obj_id, sizeof r->obj_id, "%s", obj_id);
    if ((rc = req_load_md(r, md, md_len, d)) != DP_OK ||
        (rc = req_check_targets(r, targets, n_targets, d)) != DP_OK)
        goto fail;
    if (targets != NULL)
        rc = req_hold_targets(r, targets, d);
    else if (r->n > 0)
        rc = req_own_buffer(r, d);
    if (rc != DP_OK || (rc = req_go_live(r, idlen, d)) != DP_OK)
        goto fail;
    *out = r;
    return DP_OK;
fail:
    req_free(r);
    return rc;
}

int
dp_direct_wait(dp_direct_req *r, double timeout_s, dp_detail *d)
{
    dp_direct *t = r->t;
    int rc;
    struct timespec ts;
    bool timed = timeout_s > 0 && isfinite(timeout_s);
    if (timed) {
        clock_gettime(CLOCK_REALTIME, &ts);
        double s = (double)ts.tv_sec + (double)ts.tv_nsec / 1e9 + timeout_s;
        ts.tv_sec = (time_t)s;
        ts.tv_nsec = (long)((s - (double)ts.tv_sec) * 1e9);
        if (ts.tv_nsec >= 1000000000L)
            ts.tv_nsec = 999999999L;
    }
    pthread_mutex_lock(&t->mu);
    /*
     * A wait for ever on a request no worker took yet runs it here: no hand-off
     * to a worker and back (most of a small fetch's time). A bounded wait
     * leaves it to the workers, so that it can return in time.
     */
    if (timeout_s < 0 && r->state == REQ_QUEUED && !t->stopping &&
        dp__direct_dequeue_locked(t, r)) {
        t->fetch_stolen++;
        dp__direct_run_req_locked(t, r);
    }
    for (;;) {
        if (r->state == REQ_END) {
            rc = r->rc;
            if (rc != DP_OK && d != NULL)
                *d = r->det;
            break;
        }
        if (timeout_s == 0) {
            rc = DP_ETIMEDOUT;
            break;
        }
        if (timed) {
            if (pthread_cond_timedwait(&t->cv, &t->mu, &ts) == ETIMEDOUT &&
                r->state != REQ_END) {
                rc = DP_ETIMEDOUT;
                break;
            }
        } else {
            pthread_cond_wait(&t->cv, &t->mu);
        }
    }
    uint64_t done = r->done_bytes;
    bool ended = r->state == REQ_END;
    pthread_mutex_unlock(&t->mu);
    if (rc == DP_ETIMEDOUT && !ended)
        return dp__fail(d, DP_ETIMEDOUT,
                        "direct: fetch of object %s still running after %gs (%" PRIu64
                        " of %" PRIu64 " bytes)",
                        r->obj_id, timeout_s, done, r->md.total_bytes);
    return rc;
}

bool
dp_direct_req_ended(dp_direct_req *r)
{
    pthread_mutex_lock(&r->t->mu);
    bool e = r->state == REQ_END;
    pthread_mutex_unlock(&r->t->mu);
    return e;
}

void
dp_direct_req_progress(dp_direct_req *r, uint64_t *done, uint64_t *total)
{
    pthread_mutex_lock(&r->t->mu);
    if (done != NULL)
        *done = r->done_bytes;
    pthread_mutex_unlock(&r->t->mu);
    if (total != NULL)
        *total = r->md.total_bytes;
}

size_t
dp_direct_req_count(const dp_direct_req *r)
{
    return r->n;
}

int
dp_direct_req_buffer(const dp_direct_req *r, size_t i, void **addr, size_t *len)
{
    if (i >= r->n)
        return DP_EINVAL;
    *addr = (void *)(uintptr_t)r->local[i].addr;
    *len = (size_t)r->local[i].nbytes;
    return DP_OK;
}

/* End r as canceled if no worker took it yet (its waiters wake); false if one did. */
static bool
cancel_queued_locked(dp_direct *t, dp_direct_req *r)
{
    if (r->state != REQ_QUEUED || !dp__direct_dequeue_locked(t, r))
        return false;
    r->rc =
        dp__fail(&r->det, DP_ECANCELED, "direct: fetch of object %s canceled", r->obj_id);
    set_state(r, REQ_END);
    t->fetch_aborted++;
    pthread_cond_broadcast(&t->cv);
    return true;
}

void
dp_direct_req_cancel(dp_direct_req *r)
{
    if (r == NULL)
        return;
    dp_direct *t = r->t;
    pthread_mutex_lock(&t->mu);
    if (!cancel_queued_locked(t, r) && r->state != REQ_END)
        r->aborted = true; /* the worker running it stops at the next chunk */
    pthread_mutex_unlock(&t->mu);
}

void
dp_direct_req_destroy(dp_direct_req *r)
{
    if (r == NULL)
        return;
    dp_direct *t = r->t;
    pthread_mutex_lock(&t->mu);
    cancel_queued_locked(t, r);
    r->aborted = true;
    while (r->state != REQ_END)
        pthread_cond_wait(&t->cv, &t->mu);
    dp__list_remove(&t->live, &r->llink);
    pthread_mutex_unlock(&t->mu);
    req_free(r);
}

int
dp_direct_abort(dp_direct *t, const char *obj_id, dp_detail *d)
{
    size_t idlen = obj_id != NULL ? strlen(obj_id) : 0;
    int rc = dp__direct_check_id(obj_id, idlen, d);
    if (rc != DP_OK)
        return rc;
    pthread_mutex_lock(&t->mu);
    bool hit = false;
    for (dp_direct_req *r = DP_LIST_FIRST(&t->live, dp_direct_req, llink); r != NULL;
         r = DP_LIST_NEXT(r, dp_direct_req, llink)) {
        if (r->state != REQ_END && strcmp(r->obj_id, obj_id) == 0) {
            r->aborted = true;
            hit = true;
        }
    }
    if (!hit)
        rc = dp__map_put(&t->aborted, obj_id, idlen, (void *)1, NULL);
    pthread_mutex_unlock(&t->mu);
    if (rc != DP_OK)
        return dp__fail(d, DP_ENOMEM, "direct: abort set");
    return DP_OK;
}

bool
dp_direct_touches_unfinished(dp_direct *t, const void *addr, size_t len)
{
    return dp__endpoint_touches_unfinished(t->ep, addr, len);
}

int
dp_direct_md_describe(const void *md, size_t md_len, size_t *n, uint64_t *sizes,
                      size_t cap, dp_detail *d)
{
    dp__direct_md m;
    int rc = dp__direct_md_parse(md, md_len, &m, d);
    if (rc != DP_OK)
        return rc;
    *n = m.n_descs;
    for (size_t i = 0; i < m.n_descs && i < cap; i++)
        sizes[i] = m.descs[i].len;
    dp__direct_md_fini(&m);
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
