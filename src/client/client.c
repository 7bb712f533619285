/*
 * The client library's core (see dataplane/client.h): options, opening and
 * closing a client (full or control-only), its counters. The rest of the
 * client, one file per concern:
 *   connect.c    binding to each unit's incarnation, re-binding, the registry
 *   memory.c     registered memory (staging, user and values buffers, regions)
 *   put.c        a put's driver and network phases (put_build.c: its blobs)
 *   get.c        a get's rounds (values.c: what it hands back)
 *   admin.c      asking every unit at once: clear, stats, the CLI's calls
 *   fanout.c     every request to the units (whole batches, or put's and get's
 *                phases over its per-unit scratch)
 *   checkpoint.c what save (checkpoint_save.c) and load (checkpoint_load.c)
 *                share
 *
 * Design notes
 * - One mutex per client (c->mu) guards every mutable field; every public
 *   operation takes it for its whole run, including waits on the network, so
 *   operations on one client run one at a time. The endpoint and the control
 *   client have their own internal locks, taken inside c->mu (lock order:
 *   c->mu, then endpoint / ctl / graveyard internals). dp_values_destroy takes
 *   c->mu of the client that made the values.
 * - Every live dp_values holds a reference on its client (n_values, under
 *   c->mu): its memory is registered with c->ep. dp_client_close with values
 *   alive marks the client closed, drops its control client and the caller's
 *   regions, and leaves the rest to the last dp_values_destroy, which frees
 *   the client (dp__client_free). Exactly one of the two frees it: both
 *   decide under c->mu.
 * - Registered memory the client maps itself lives in c->bufs: staging
 *   buffers (one per operation, sized to the batch), buffers handed to the
 *   caller (dp_client_alloc), and buffers of dp_values. A buffer given back
 *   is cached (up to staging_cache_bytes) unless an unfinished transfer may
 *   still touch it (dp__endpoint_touches_unfinished): then it is retired
 *   whole, charged to the graveyard, and never reused, unmapped or freed
 *   while that transfer may run. When every such transfer ended after all
 *   (the endpoint released it from the graveyard: UCX completed its
 *   requests, e.g. purged them when the peer failed), the buffer is cached
 *   again at the next lookup. USER and VALUES buffers and the caller's
 *   regions are also kept as a set of ranges (c->direct), so whether a value
 *   lies in memory a transfer can use in place is a binary search.
 * - Each unit's data path is bound to one incarnation of it (its process):
 *   replies from another, and failed transfer endpoints, make the client
 *   re-bind before the next transfer (dp__client_ready_locked), never post
 *   through a binding of another process (docs/design.md, "Unit
 *   incarnations").
 * - Per-unit scratch (blob builders, the fanout's request buffers, ctl items
 *   and replies) is kept in the client and reset per operation, so a batch
 *   costs a few allocations, not one per key.
 * - A control-only client (dp__client_open_ctl) has no endpoint (ep NULL):
 *   no UCX, nothing mapped; it records what asking each unit who it is found
 *   (checks: checked, down with why, not asked) and sends nothing but info
 *   to a unit before it was checked. put, get and the memory calls refuse it
 *   (dp__client_data_check).
 */
#include "client/client_int.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "dataplane/version.h"

void (*dp__client_test_hook)(const char *stage);

/* ---- small helpers ---- */

double
dp__client_round_timeout(double deadline)
{
    double l = dp__left_s(deadline);
    return DP_MAX(l / 3, DP_MIN(l, 1.0));
}

/* The defaults of dp_client_opts (client.h): what 0 in a field stands for. */
#define DEFAULT_TIMEOUT_S 30.0
#define DEFAULT_CONNECT_TIMEOUT_S 30.0
#define DEFAULT_STAGING_CACHE (256ull << 20)
#define MAX_TIMEOUT_S 1e6
#define DEFAULT_INLINE (32ull << 10)

void
dp_client_opts_init(dp_client_opts *o)
{
    memset(o, 0, sizeof *o);
    o->timeout_s = DEFAULT_TIMEOUT_S;
    o->connect_timeout_s = DEFAULT_CONNECT_TIMEOUT_S;
    o->staging_cache_bytes = DEFAULT_STAGING_CACHE;
}

/*
 * The caller's options (NULL: all defaults) with every 0 replaced by its
 * default, checked. A non-zero reserved word is a field this library does not
 * know: refused rather than ignored.
 */
static int
opts_resolve(const dp_client_opts *in, dp_client_opts *o, dp_detail *d)
{
    if (in != NULL)
        *o = *in;
    else
        memset(o, 0, sizeof *o);
    for (size_t i = 0; i < DP_ARRAY_LEN(o->reserved); i++)
        if (o->reserved[i] != 0)
            return dp__fail(d, DP_EINVAL,
                            "client: dp_client_opts.reserved[%zu] is not zero (zero the "
                            "struct; a program built against a newer dataplane than %s "
                            "needs that version)",
                            i, DP_VERSION_STRING);
    if (o->timeout_s == 0)
        o->timeout_s = DEFAULT_TIMEOUT_S;
    if (o->connect_timeout_s == 0)
        o->connect_timeout_s = DEFAULT_CONNECT_TIMEOUT_S;
    if (o->staging_cache_bytes == 0)
        o->staging_cache_bytes = DEFAULT_STAGING_CACHE;
    if (o->inline_bytes == 0) {
        const char *e = getenv("DP_INLINE");
        o->inline_bytes = DEFAULT_INLINE;
        if (e != NULL && e[0] != '\0') {
            if (strcasecmp(e, "off") == 0)
                o->inline_bytes = 0;
            else if (dp__parse_size(e, &o->inline_bytes, "DP_INLINE", d) != DP_OK)
                return dp__fail_ctx(d, DP_EINVAL,
                                    "client: DP_INLINE must be a size (64K, 0 or off)");
        }
    } else if (o->inline_bytes == DP_INLINE_OFF) {
        o->inline_bytes = 0;
    }
    if (o->inline_bytes > DP_WIRE_INLINE_MAX)
        return dp__fail(d, DP_EINVAL,
                        "client: inline_bytes (or DP_INLINE) %" PRIu64
                        " is over the most a unit takes inline, %u bytes",
                        o->inline_bytes, DP_WIRE_INLINE_MAX);
    if (!(o->timeout_s > 0) || !(o->connect_timeout_s > 0) ||
        o->timeout_s > MAX_TIMEOUT_S || o->connect_timeout_s > MAX_TIMEOUT_S)
        return dp__fail(d, DP_EINVAL,
                        "client: timeouts must be in (0, 1e6] s, or 0 for the default "
                        "(timeout_s %g, connect_timeout_s %g)",
                        o->timeout_s, o->connect_timeout_s);
    return DP_OK;
}

int
dp__client_prepare_locked(dp_client *c, uint32_t u, size_t slot, dp__wire_request *q,
                          dp_detail *d)
{
    return dp__fanout_place(&c->fo, &c->rids, slot, u, c->units[u].addr, q, d);
}

int
dp__client_data_check(const dp_client *c, const char *what, dp_detail *d)
{
    if (c != NULL && c->ep == NULL)
        return dp__fail(d, DP_EINVAL,
                        "%s: this client is for the control plane only (no transfer "
                        "endpoint): open one with dp_client_open",
                        what);
    return DP_OK;
}

/* ---- opening and closing ---- */

static int
client_new(const dp_client_opts *opts, uint32_t n_units, bool ctl_only, dp_client **out,
           dp_detail *d)
{
    dp_client *c = calloc(1, sizeof *c);
    if (c == NULL)
        return dp__fail(d, DP_ENOMEM, "client: out of memory");
    pthread_mutex_init(&c->mu, NULL);
    c->only_unit = -1;
    *out = c;
    int rc = opts_resolve(opts, &c->o, d);
    if (rc != DP_OK)
        return rc;
    if (n_units == 0 || n_units > DP_CLUSTER_MAX_UNITS)
        return dp__fail(d, DP_EINVAL, "client: %u units (1..%u)", n_units,
                        DP_CLUSTER_MAX_UNITS);
    c->n_units = n_units;
    c->units = calloc(n_units, sizeof *c->units);
    c->builders = calloc(n_units, sizeof *c->builders);
    if (ctl_only)
        c->checks = calloc(n_units, sizeof *c->checks);
    if (c->units == NULL || c->builders == NULL || (ctl_only && c->checks == NULL))
        return dp__fail(d, DP_ENOMEM, "client: out of memory");
    if ((rc = dp__fanout_init(&c->fo, n_units, d)) != 0)
        return rc;
    rc = dp__wire_rid_gen_init(&c->rids, d);
    if (rc != 0)
        return rc;
    uint8_t rnd[8];
    rc = dp__random_bytes(rnd, sizeof rnd, d);
    if (rc != 0)
        return rc;
    for (int i = 0; i < 8; i++)
        snprintf(c->blob_prefix + 2 * i, 3, "%02x", rnd[i]);
    c->ver_salt = ((uint64_t)rnd[6] << 8 | rnd[7]) & ((1u << DP__VER_SALT_BITS) - 1);
    if (c->o.name != NULL) {
        size_t nl = strlen(c->o.name);
        if (nl == 0 || nl > 200)
            return dp__fail(d, DP_EINVAL, "client: name must be 1..200 bytes");
        memcpy(c->name, c->o.name, nl + 1);
    } else {
        snprintf(c->name, sizeof c->name, "client-%ld-%.8s", (long)getpid(),
                 c->blob_prefix);
    }
    c->o.name = NULL; /* not kept: the caller's string */
    const char *curve =
        c->o.curve_secret != NULL ? c->o.curve_secret : getenv("DP_CURVE_SECRET");
    c->o.curve_secret = NULL; /* not kept either */
    if (!ctl_only) {
        dp__endpoint_opts eo;
        dp__endpoint_opts_init(&eo);
        eo.require_rdma = c->o.require_rdma;
        rc = dp__endpoint_create(c->name, &eo, &c->ep, d);
        if (rc != 0)
            return dp__fail_ctx(d, rc, "client: transfer endpoint");
    }
    if ((rc = dp__ctl_client_create(&c->ctl, d)) != 0)
        return rc;
    if (curve != NULL && curve[0] != '\0') {
        char sec[41];
        rc = dp__ctl_key_read(curve, true, sec, d);
        if (rc == 0)
            rc = dp__ctl_client_set_curve(c->ctl, sec, d);
        explicit_bzero(sec, sizeof sec);
        if (rc != 0)
            return dp__fail_ctx(d, rc, "client: CURVE secret key (DP_CURVE_SECRET)");
    }
    return DP_OK;
}

int
dp_client_counters_get(dp_client *c, dp_client_counters *out)
{
    if (c == NULL || out == NULL)
        return DP_EINVAL;
    pthread_mutex_lock(&c->mu);
    *out = c->cnt;
    if (c->ep != NULL) {
        dp__endpoint_stats es;
        dp__endpoint_get_stats(c->ep, &es);
        out->transfers_retained = es.transfers_retained - es.transfers_released;
        out->transfers_released = es.transfers_released;
    }
    out->retained_bytes = dp__graveyard_bytes();
    pthread_mutex_unlock(&c->mu);
    return DP_OK;
}

uint64_t
dp_client_requests_resent(dp_client *c)
{
    return c == NULL ? 0 : dp__ctl_client_resent(c->ctl);
}

uint32_t
dp_client_replicas(dp_client *c)
{
    if (c == NULL)
        return 1;
    pthread_mutex_lock(&c->mu);
    uint32_t r = dp__client_replicas(c);
    pthread_mutex_unlock(&c->mu);
    return r;
}

uint64_t
dp_client_under_replicated_rows(dp_client *c)
{
    if (c == NULL)
        return 0;
    pthread_mutex_lock(&c->mu);
    uint64_t n = c->under_replicated_rows;
    pthread_mutex_unlock(&c->mu);
    return n;
}

int
dp_client_unit_path(dp_client *c, uint32_t unit, char *buf, size_t cap)
{
    if (c == NULL || buf == NULL || cap == 0)
        return DP_EINVAL;
    pthread_mutex_lock(&c->mu);
    int rc = DP_EINVAL;
    if (c->ep != NULL && unit < c->n_units) {
        const dp__unit_conn *uc = &c->units[unit];
        if (uc->incarnation == 0)
            snprintf(buf, cap, "not connected (down)");
        else
            snprintf(buf, cap, "%s %s (%s)", uc->route.lane, uc->route.path,
                     uc->route.tls);
        rc = DP_OK;
    }
    pthread_mutex_unlock(&c->mu);
    return rc;
}

/* A client of the units at addrs[0..n); cl (NULL: none) the cluster file or
 * registry they came from: its id, copies of each row and CURVE keys. */
static int
open_common(const char *const *addrs, uint32_t n, const dp__cluster *cl,
            const dp_client_opts *opts, dp_client **out, dp_detail *d)
{
    /*
     * About four descriptors per unit (its control socket, UCX's); the soft
     * open-file limit goes up when it is below that, never past the hard one
     * (docs/design.md, "Capacity").
     */
    uint64_t want = 8 * (uint64_t)n + 256, soft = 0, hard = 0;
    if (dp__nofile_raise(want, &soft, &hard) == DP_EINVAL)
        DP_LOG_W("client: %u units need about %" PRIu64 " open files and the hard limit "
                 "is %" PRIu64 ": connections may fail with 'Too many open files'; "
                 "raise it (ulimit -Hn, systemd LimitNOFILE=, a container's nofile)",
                 n, want, hard);
    dp_client *c = NULL;
    int rc = client_new(opts, n, false, &c, d);
    if (rc == 0 && cl != NULL) {
        snprintf(c->cluster_id, sizeof c->cluster_id, "%s", cl->cluster_id);
        c->replicas = cl->replicas; /* the file's word (0: none): the units must agree */
    }
    for (uint32_t u = 0; rc == 0 && u < n; u++)
        rc = dp__client_set_addr(c, u, addrs[u], d);
    if (rc == 0)
        rc = dp__client_set_server_keys(c, cl != NULL ? cl->units : NULL, n, d);
    if (rc == 0) {
        pthread_mutex_lock(&c->mu);
        rc = dp__client_check_units_locked(c, -1, DP__CTL_ALLOW_DOWN, d);
        pthread_mutex_unlock(&c->mu);
    }
    if (rc != 0) {
        dp_client_close(c);
        return rc;
    }
    *out = c;
    return DP_OK;
}

int
dp_client_open_units(const char *const *addrs, uint32_t n_units,
                     const dp_client_opts *opts, dp_client **out, dp_detail *d)
{
    if (out == NULL || (addrs == NULL && n_units > 0))
        return dp__fail(d, DP_EINVAL, "dp_client_open_units: NULL argument");
    *out = NULL;
    return open_common(addrs, n_units, NULL, opts, out, d);
}

int
dp_client_open(const char *cluster, const dp_client_opts *opts, dp_client **out,
               dp_detail *d)
{
    if (out == NULL)
        return dp__fail(d, DP_EINVAL, "dp_client_open: NULL out");
    *out = NULL;
    dp_client_opts o;
    if (opts != NULL)
        o = *opts;
    else
        dp_client_opts_init(&o);
    /* The registry's wait for every unit is part of connecting. */
    double budget =
        o.connect_timeout_s > 0 ? o.connect_timeout_s : DEFAULT_CONNECT_TIMEOUT_S;
    char where[PATH_MAX > DP_CLUSTER_REGISTRY_MAX ? PATH_MAX : DP_CLUSTER_REGISTRY_MAX];
    dp__cluster cl;
    int rc = dp__reg_resolve(cluster, budget, &cl, where, sizeof where, d);
    if (rc != 0)
        return rc;
    const char **addrs = calloc(cl.n_units, sizeof *addrs);
    if (addrs == NULL) {
        dp__cluster_fini(&cl);
        return dp__fail(d, DP_ENOMEM, "client: out of memory");
    }
    for (uint32_t u = 0; u < cl.n_units; u++)
        addrs[u] = cl.units[u].zmq;
    rc = open_common(addrs, cl.n_units, &cl, opts, out, d);
    if (rc == 0 && cl.registry[0] != '\0') {
        dp__reg_url u;
        rc = dp__reg_url_parse(cl.registry, &u, d);
        if (rc == 0)
            rc = dp__reg_watch_start(&u, cl.n_units, cl.revision, &(*out)->reg, d);
        if (rc != 0) {
            dp_client_close(*out);
            *out = NULL;
        }
    }
    if (rc != 0)
        dp__fail_ctx(d, rc, "cluster %s", where);
    free(addrs);
    dp__cluster_fini(&cl);
    return rc;
}

/* ---- control-only clients ---- */

/* A copy of s (NULL stays NULL); *oom set when out of memory. */
static char *
dup_or_null(const char *s, bool *oom)
{
    if (s == NULL)
        return NULL;
    char *p = strdup(s);
    if (p == NULL)
        *oom = true;
    return p;
}

int
dp__client_open_ctl(const dp__cluster *cl, const dp_client_opts *opts,
                    const dp__fanout_opts *words, unsigned flags, dp_client **out,
                    dp_detail *d)
{
    if (out == NULL || cl == NULL)
        return dp__fail(d, DP_EINVAL, "dp__client_open_ctl: NULL argument");
    *out = NULL;
    dp_client *c = NULL;
    int rc = client_new(opts, cl->n_units, true, &c, d);
    for (uint32_t u = 0; rc == DP_OK && u < cl->n_units; u++)
        rc = dp__client_set_addr(c, u, cl->units[u].zmq, d);
    if (rc == DP_OK)
        rc = dp__client_set_server_keys(c, cl->units, cl->n_units, d);
    if (rc == DP_OK) {
        snprintf(c->cluster_id, sizeof c->cluster_id, "%s", cl->cluster_id);
        c->replicas = cl->replicas;
    }
    if (rc == DP_OK && words != NULL) {
        bool oom = false;
        c->words.listed_by = dup_or_null(words->listed_by, &oom);
        c->words.misplaced_hint = dup_or_null(words->misplaced_hint, &oom);
        c->words.silence_hint = dup_or_null(words->silence_hint, &oom);
        if (oom)
            rc = dp__fail(d, DP_ENOMEM, "client: out of memory");
    }
    if (rc == DP_OK && !(flags & DP__CTL_NO_CHECK))
        rc = dp__client_check_units(c, -1, flags, d);
    if (rc != DP_OK) {
        dp_client_close(c);
        return rc;
    }
    *out = c;
    return DP_OK;
}

int
dp__client_check_units(dp_client *c, int64_t only, unsigned flags, dp_detail *d)
{
    if (c == NULL || c->checks == NULL || only >= (int64_t)c->n_units)
        return dp__fail(d, DP_EINVAL,
                        "dp__client_check_units: a control-only client and a unit of it");
    pthread_mutex_lock(&c->mu);
    int rc = dp__client_check_units_locked(c, only, flags, d);
    pthread_mutex_unlock(&c->mu);
    return rc;
}

int
dp__client_unit_check(const dp_client *c, uint32_t u, dp_detail *det, const char **agent,
                      uint64_t *incarnation)
{
    if (c == NULL || u >= c->n_units)
        return DP__UNIT_UNCHECKED;
    const dp__unit_probe *k = c->checks != NULL ? &c->checks[u] : NULL;
    int state = k != NULL ? k->state : DP__UNIT_CHECKED;
    if (det != NULL && state == DP__UNIT_DOWN)
        *det = k->det;
    if (agent != NULL && state == DP__UNIT_CHECKED)
        *agent = k != NULL ? k->agent : c->units[u].remote;
    if (incarnation != NULL && state == DP__UNIT_CHECKED)
        *incarnation = c->units[u].incarnation;
    return state;
}

void
dp_client_close(dp_client *c)
{
    if (c == NULL)
        return;
    /*
     * Live dp_values keep the client: their memory is registered with its
     * endpoint, and dp_values_destroy gives it back under c->mu. Close then
     * lets go of what values do not need (the units' connections, the
     * caller's regions, which the caller may free after close) and the last
     * dp_values_destroy frees the rest (dp__client_free).
     */
    pthread_mutex_lock(&c->mu);
    c->closed = true;
    bool keep = c->n_values > 0;
    dp__ctl_client *ctl = NULL;
    if (keep) {
        dp__client_regions_drop_locked(c);
        ctl = c->ctl;
        c->ctl = NULL;
    }
    pthread_mutex_unlock(&c->mu);
    if (keep) {
        dp__ctl_client_destroy(ctl);
        return;
    }
    dp__client_free(c);
}

void
dp__client_free(dp_client *c)
{
    dp__reg_watch_stop(c->reg);
    if (c->ep != NULL) {
        for (size_t i = 0; i < c->n_bufs; i++) {
            if (c->bufs[i].state == DP__BUF_RETIRED ||
                dp__endpoint_touches_unfinished(c->ep, c->bufs[i].p, c->bufs[i].len))
                continue; /* the endpoint keeps it (graveyard) */
            dp__endpoint_deregister(c->ep, c->bufs[i].p, NULL);
        }
        for (size_t i = 0; i < c->n_regions; i++)
            dp__endpoint_deregister(c->ep, c->regions[i].p, NULL);
        dp__endpoint_destroy(c->ep);
    }
    dp__ctl_client_destroy(c->ctl);
    for (uint32_t u = 0; c->builders != NULL && u < c->n_units; u++)
        dp__blob_builder_destroy(c->builders[u]);
    dp__fanout_fini(&c->fo);
    free((char *)c->words.listed_by);
    free((char *)c->words.misplaced_hint);
    free((char *)c->words.silence_hint);
    free(c->builders);
    free(c->checks);
    free(c->units);
    free(c->bufs);
    free(c->regions);
    dp__ranges_fini(&c->direct);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

uint32_t
dp_client_n_units(const dp_client *c)
{
    return c != NULL ? c->n_units : 0;
}

const char *
dp_client_unit_address(const dp_client *c, uint32_t i)
{
    return c != NULL && i < c->n_units ? c->units[i].addr : NULL;
}

uint32_t
dp_client_unit_of(const dp_client *c, uint64_t gidx)
{
    return c != NULL && c->n_units > 0 ? (uint32_t)(gidx % c->n_units) : 0;
}
