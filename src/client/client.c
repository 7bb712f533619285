/*
 * The client library's core (see dataplane/client.h): connecting to the units,
 * the pool of registered memory, clear and stats, and the control-only
 * clients the CLI uses (client/fanout.h). put.c and get.c hold the data
 * operations. Every request to the units goes through the client's fanout
 * (fanout.c): info at open and re-bind, clear, stats and the CLI's calls
 * run whole batches there; put and get use its scratch for their phases.
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
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "blob/keys.h"
#include "dataplane/version.h"

void (*dp__client_test_hook)(const char *stage);

#define MIN_BUF (1u << 20)

/* ---- small helpers ---- */

double
dp__client_left(double deadline)
{
    double l = deadline - dp__now_s();
    return l > 0 ? l : 0;
}

double
dp__client_round_timeout(double deadline)
{
    double l = dp__client_left(deadline);
    return DP_MAX(l / 3, DP_MIN(l, 1.0));
}

void
dp__client_backoff(double *step, double deadline)
{
    double l = dp__client_left(deadline);
    double s = DP_MIN(*step, l);
    if (s > 0)
        dp__sleep_s(s);
    *step = DP_MIN(*step * 2, 0.1);
}

void
dp__detail_append(dp_detail *d, const char *fmt, ...)
{
    if (d == NULL)
        return;
    size_t n = strnlen(d->msg, sizeof d->msg);
    if (n + 1 >= sizeof d->msg)
        return;
    va_list ap;
    va_start(ap, fmt);
    int w = vsnprintf(d->msg + n, sizeof d->msg - n, fmt, ap);
    va_end(ap);
    if (w > 0 && (size_t)w >= sizeof d->msg - n && sizeof d->msg > 4)
        memcpy(d->msg + sizeof d->msg - 4, "...", 4);
}

const char *
dp_kind_name(dp_kind k)
{
    switch (k) {
    case DP_KIND_TENSOR:
        return "tensor";
    case DP_KIND_BYTES:
        return "bytes";
    case DP_KIND_OBJECT:
        return "object";
    case DP_KIND_SKIP:
        return "skip";
    }
    return "?";
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
dp__client_prepare_locked(dp_client *c, uint32_t u, size_t slot, dp_wire_request *q,
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

void
dp__client_notify_locked(dp_client *c, uint32_t u, dp_wire_request *q)
{
    char rid[DP_WIRE_RID_MAX];
    q->rid = dp__wire_rid_next(&c->rids, rid);
    dp_buf b = {0};
    dp_detail d;
    dp_detail_clear(&d);
    int rc = dp__wire_request_encode(q, NULL, &b, &d);
    if (rc == 0)
        rc = dp__ctl_notify(c->ctl, c->units[u].addr, b.data, b.len, &d);
    if (rc != 0)
        DP_LOG_W("client: %s to unit %u (%s) not sent: %s", dp__wire_op_name(q->op), u,
                 c->units[u].addr, dp_detail_msg(&d));
    dp__buf_fini(&b);
}

static void
send_abort(dp_client *c, uint32_t u, const char *blob_id, bool in_flight)
{
    dp_wire_request q;
    memset(&q, 0, sizeof q);
    q.op = DP_WIRE_OP_ABORT;
    q.a.abort.blob_id = dp__wire_s(blob_id);
    q.a.abort.in_flight = in_flight;
    dp__client_notify_locked(c, u, &q);
}

void
dp__client_abort_locked(dp_client *c, uint32_t u, const char *blob_id, bool in_flight)
{
    dp__unit_conn *uc = &c->units[u];
    send_abort(c, u, blob_id, in_flight);
    uint32_t cap = (uint32_t)DP_ARRAY_LEN(uc->aborts);
    if (uc->n_aborts == cap) { /* the oldest goes: its lease covers it */
        memmove(uc->aborts, uc->aborts + 1, (cap - 1) * sizeof uc->aborts[0]);
        uc->n_aborts--;
    }
    snprintf(uc->aborts[uc->n_aborts].id, sizeof uc->aborts[0].id, "%s", blob_id);
    uc->aborts[uc->n_aborts++].in_flight = in_flight;
}

/*
 * Unit u answered: the aborts sent to it since it last did go out once more
 * (to the same process only: another one never heard of those blobs).
 */
static void
aborts_again_locked(dp_client *c, uint32_t u, bool same_process)
{
    dp__unit_conn *uc = &c->units[u];
    uint32_t n = uc->n_aborts;
    uc->n_aborts = 0;
    for (uint32_t i = 0; same_process && i < n; i++)
        send_abort(c, u, uc->aborts[i].id, uc->aborts[i].in_flight);
}

/* ---- registered memory ---- */

static size_t
round_buf(size_t n)
{
    size_t r = MIN_BUF;
    while (r < n && r < ((size_t)1 << 62))
        r <<= 1;
    return r;
}

/* A buffer in this state is the caller's memory: transfers use it in place. */
static bool
buf_direct(int state)
{
    return state == DP__BUF_USER || state == DP__BUF_VALUES;
}

/* b (its state set) joins c->direct if its state counts; room was reserved. */
static void
direct_add_locked(dp_client *c, const dp__buf *b)
{
    if (!buf_direct(b->state))
        return;
    int rc = dp__ranges_add(&c->direct, (uintptr_t)b->p, b->len, NULL);
    DP_ASSERT(rc == DP_OK); /* the endpoint's regions never overlap */
}

static void
direct_remove_locked(dp_client *c, const void *p)
{
    dp_ranges_ent *e = dp__ranges_at(&c->direct, (uintptr_t)p);
    if (e != NULL)
        dp__ranges_remove(&c->direct, e);
}

static dp__buf *
buf_find_locked(dp_client *c, const void *p)
{
    for (size_t i = 0; i < c->n_bufs; i++)
        if (c->bufs[i].p == p)
            return &c->bufs[i];
    return NULL;
}

/*
 * Unmap FREE buffers while more than the cache limit is cached, least
 * recently used first (a buffer that each batch needs stays mapped: mapping
 * and faulting in registered memory costs more than the copy it serves).
 */
static void
trim_cache_locked(dp_client *c)
{
    while (c->cached_bytes > c->o.staging_cache_bytes) {
        size_t best = SIZE_MAX;
        for (size_t i = 0; i < c->n_bufs; i++)
            if (c->bufs[i].state == DP__BUF_FREE &&
                (best == SIZE_MAX || c->bufs[i].last_use < c->bufs[best].last_use))
                best = i;
        if (best == SIZE_MAX)
            return;
        dp__buf b = c->bufs[best];
        dp_detail d;
        dp_detail_clear(&d);
        c->cached_bytes -= b.len;
        if (dp__endpoint_deregister(c->ep, b.p, &d) != 0) {
            /* Still in use by a transfer: keep it, never reuse it. */
            DP_LOG_W("client: staging buffer kept: %s", dp_detail_msg(&d));
            c->bufs[best].state = DP__BUF_RETIRED;
            dp__graveyard_retain_buffer(b.len);
            continue;
        }
        c->bufs[best] = c->bufs[--c->n_bufs];
    }
}

int
dp__client_buf_get_locked(dp_client *c, size_t nbytes, int state, dp__buf **out,
                          dp_detail *d)
{
    if (nbytes == 0)
        nbytes = 1;
    if (buf_direct(state) && dp__ranges_reserve(&c->direct, 1) != DP_OK)
        return dp__fail(d, DP_ENOMEM, "client: out of memory (buffer table)");
    size_t best = SIZE_MAX;
    for (size_t i = 0; i < c->n_bufs; i++) {
        dp__buf *b = &c->bufs[i];
        if (b->state == DP__BUF_RETIRED &&
            !dp__endpoint_touches_unfinished(c->ep, b->p, b->len)) {
            /* The transfers that touched it ended after all: usable again. */
            b->state = DP__BUF_FREE;
            b->last_use = ++c->use_clock;
            c->cached_bytes += b->len;
            dp__graveyard_release_buffer(b->len);
        }
        if (b->state != DP__BUF_FREE || b->len < nbytes)
            continue;
        if (dp__endpoint_touches_unfinished(c->ep, b->p, b->len)) {
            c->cached_bytes -= b->len;
            b->state = DP__BUF_RETIRED;
            dp__graveyard_retain_buffer(b->len);
            continue;
        }
        if (best == SIZE_MAX || b->len < c->bufs[best].len)
            best = i;
    }
    if (best != SIZE_MAX && c->bufs[best].len <= 4 * round_buf(nbytes)) {
        c->bufs[best].state = state;
        c->cached_bytes -= c->bufs[best].len;
        direct_add_locked(c, &c->bufs[best]);
        *out = &c->bufs[best];
        return DP_OK;
    }
    if (c->n_bufs == c->cap_bufs) {
        size_t nc = c->cap_bufs ? c->cap_bufs * 2 : 16;
        dp__buf *nb = realloc(c->bufs, nc * sizeof *nb);
        if (nb == NULL)
            return dp__fail(d, DP_ENOMEM, "client: out of memory (buffer table)");
        c->bufs = nb;
        c->cap_bufs = nc;
    }
    size_t len = round_buf(nbytes);
    void *p = NULL;
    int rc = dp__endpoint_alloc(c->ep, len, &p, d);
    if (rc != 0)
        return dp__fail_ctx(d, rc, "client: mapping %zu bytes of registered memory", len);
    dp__buf *b = &c->bufs[c->n_bufs++];
    b->p = p;
    b->len = len;
    b->state = state;
    direct_add_locked(c, b);
    *out = b;
    return DP_OK;
}

void
dp__client_buf_put_locked(dp_client *c, uint8_t *p)
{
    dp__buf *b = buf_find_locked(c, p);
    if (b == NULL || b->state == DP__BUF_FREE || b->state == DP__BUF_RETIRED)
        return;
    if (buf_direct(b->state))
        direct_remove_locked(c, b->p);
    if (dp__endpoint_touches_unfinished(c->ep, b->p, b->len)) {
        b->state = DP__BUF_RETIRED;
        dp__graveyard_retain_buffer(b->len);
        DP_LOG_W(
            "client: buffer of %zu bytes retired (an unfinished transfer touches it)",
            b->len);
        return;
    }
    b->state = DP__BUF_FREE;
    b->last_use = ++c->use_clock;
    c->cached_bytes += b->len;
    trim_cache_locked(c);
}

bool
dp__client_direct_locked(const dp_client *c, const void *p, uint64_t n)
{
    return dp__ranges_find(&c->direct, (uintptr_t)p, n) != NULL;
}

int
dp_client_alloc(dp_client *c, size_t nbytes, void **out, dp_detail *d)
{
    if (c == NULL || out == NULL || nbytes == 0)
        return dp__fail(d, DP_EINVAL, "dp_client_alloc: NULL argument or zero size");
    int rc = dp__client_data_check(c, "dp_client_alloc", d);
    if (rc != DP_OK)
        return rc;
    pthread_mutex_lock(&c->mu);
    dp__buf *b = NULL;
    rc = dp__client_buf_get_locked(c, nbytes, DP__BUF_USER, &b, d);
    if (rc == 0)
        *out = b->p;
    pthread_mutex_unlock(&c->mu);
    return rc;
}

bool
dp_client_touches_unfinished(const dp_client *c, const void *p, size_t nbytes)
{
    return c != NULL && c->ep != NULL &&
           dp__endpoint_touches_unfinished(c->ep, p, nbytes);
}

void
dp_client_free(dp_client *c, void *p)
{
    if (c == NULL || p == NULL)
        return;
    pthread_mutex_lock(&c->mu);
    dp__buf *b = buf_find_locked(c, p);
    if (b != NULL && b->state == DP__BUF_USER)
        dp__client_buf_put_locked(c, p);
    else
        DP_LOG_W("client: dp_client_free of %p, which dp_client_alloc did not return", p);
    pthread_mutex_unlock(&c->mu);
}

int
dp_client_register(dp_client *c, void *addr, size_t nbytes, dp_detail *d)
{
    if (c == NULL || addr == NULL || nbytes == 0)
        return dp__fail(d, DP_EINVAL, "dp_client_register: NULL address or zero size");
    int rc = dp__client_data_check(c, "dp_client_register", d);
    if (rc != DP_OK)
        return rc;
    pthread_mutex_lock(&c->mu);
    if (c->n_regions == c->cap_regions) {
        size_t nc = c->cap_regions ? c->cap_regions * 2 : 8;
        dp__region *nr = realloc(c->regions, nc * sizeof *nr);
        if (nr == NULL) {
            rc = dp__fail(d, DP_ENOMEM, "client: out of memory (region table)");
            goto out;
        }
        c->regions = nr;
        c->cap_regions = nc;
    }
    if (dp__ranges_reserve(&c->direct, 1) != DP_OK) {
        rc = dp__fail(d, DP_ENOMEM, "client: out of memory (region table)");
        goto out;
    }
    rc = dp__endpoint_register(c->ep, addr, nbytes, d);
    if (rc == 0) {
        c->regions[c->n_regions++] = (dp__region){addr, nbytes};
        rc = dp__ranges_add(&c->direct, (uintptr_t)addr, nbytes, NULL);
        DP_ASSERT(rc == DP_OK); /* the endpoint refuses overlapping regions */
    }
out:
    pthread_mutex_unlock(&c->mu);
    return rc;
}

int
dp_client_deregister(dp_client *c, void *addr, dp_detail *d)
{
    if (c == NULL)
        return dp__fail(d, DP_EINVAL, "dp_client_deregister: NULL client");
    if (c->ep == NULL)
        return dp__fail(d, DP_ENOTFOUND, "no region registered at %p", addr);
    pthread_mutex_lock(&c->mu);
    int rc = dp__fail(d, DP_ENOTFOUND, "no region registered at %p", addr);
    for (size_t i = 0; i < c->n_regions; i++) {
        if (c->regions[i].p != addr)
            continue;
        dp_detail_clear(d);
        rc = dp__endpoint_deregister(c->ep, addr, d);
        if (rc == 0) {
            c->regions[i] = c->regions[--c->n_regions];
            direct_remove_locked(c, addr);
        }
        break;
    }
    pthread_mutex_unlock(&c->mu);
    return rc;
}

/* ---- connecting ---- */

static int
client_new(const dp_client_opts *opts, uint32_t n_units, bool ctl_only, dp_client **out,
           dp_detail *d)
{
    dp_client *c = calloc(1, sizeof *c);
    if (c == NULL)
        return dp__fail(d, DP_ENOMEM, "client: out of memory");
    pthread_mutex_init(&c->mu, NULL);
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
        dp_endpoint_opts eo;
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

/* The units' CURVE public keys (cu: n entries, or NULL) for the control client. */
static int
set_server_keys(dp_client *c, const dp_cluster_unit *cu, uint32_t n, dp_detail *d)
{
    int rc = 0;
    for (uint32_t u = 0; cu != NULL && rc == 0 && u < n; u++)
        if (cu[u].pubkey[0] != '\0')
            rc = dp__ctl_client_server_key(c->ctl, c->units[u].addr, cu[u].pubkey, d);
    return rc;
}

/* Unit u's control address a, checked. */
static int
set_addr(dp_client *c, uint32_t u, const char *a, dp_detail *d)
{
    if (a == NULL || strlen(a) >= DP_CLUSTER_ADDR_MAX || strncmp(a, "tcp://", 6) != 0)
        return dp__fail(d, DP_EINVAL, "unit %u: bad control address '%s'", u,
                        a ? a : "(null)");
    snprintf(c->units[u].addr, sizeof c->units[u].addr, "%s", a);
    return DP_OK;
}

/*
 * Bind unit u's data path to the process whose info this is (the fanout
 * checked that it is unit u of this cluster): check that it speaks this
 * protocol, connect the transfer endpoint to it (replacing the remote of an
 * earlier incarnation), and take its slab's place, sizes and incarnation.
 */
static int
bind_unit_locked(dp_client *c, uint32_t u, const dp_wire_info *in, dp_detail *d)
{
    dp__unit_conn *uc = &c->units[u];
    if (in->proto < DP_WIRE_PROTO || in->incarnation == 0)
        return dp__fail(
            d, DP_EPROTO,
            "speaks control protocol %" PRIu64
            " and this client %d: run the same dataplane version on units and "
            "clients",
            in->proto, DP_WIRE_PROTO);
    if (in->metadata.n == 0)
        return dp__fail(d, DP_EPROTO, "has no transfer endpoint (no metadata in info)");
    if (in->slab_addr == 0)
        return dp__fail(d, DP_EPROTO, "info carries no slab address");
    char name[256];
    int rc = dp__endpoint_add_remote(c->ep, in->metadata.p, in->metadata.n, name, d);
    if (rc != 0)
        return rc;
    for (uint32_t v = 0; v < c->n_units; v++)
        if (v != u && strcmp(c->units[v].remote, name) == 0)
            return dp__fail(d, DP_EPROTO,
                            "has the same endpoint name '%s' as unit %u: names must be "
                            "unique",
                            name, v);
    if (uc->remote[0] != '\0' && strcmp(uc->remote, name) != 0)
        dp__endpoint_remove_remote(c->ep, uc->remote, NULL); /* the old process's */
    snprintf(uc->remote, sizeof uc->remote, "%s", name);
    uc->slab_addr = in->slab_addr;
    uc->slab_bytes = in->slab_bytes;
    uc->io_bytes = in->io_bytes;
    uc->region_bytes = uc->slab_bytes + uc->io_bytes;
    uc->read_pin_s = in->read_pin_ms > 0 ? (double)in->read_pin_ms / 1e3 : 10.0;
    aborts_again_locked(c, u, uc->incarnation == in->incarnation);
    uint64_t was = uc->incarnation;
    uc->incarnation = in->incarnation;
    uc->stale = false;
    uc->ep_suspect = false;
    /* Connection setup over before any transfer (dp__endpoint_remote_connect). */
    rc = dp__endpoint_remote_connect(c->ep, name, c->o.connect_timeout_s, d);
    if (rc != 0) {
        /* Not bound: the next operation asks it again (a restart counted once). */
        uc->incarnation = was;
        uc->stale = true;
        uc->seen_incarnation = in->incarnation;
        return rc;
    }
    uc->lane = DP_XFER_LANE_UNKNOWN;
    uc->tls[0] = '\0';
    dp__endpoint_remote_lane(c->ep, uc->remote, &uc->lane, uc->tls, sizeof uc->tls, NULL);
    uc->path = DP_XFER_PATH_RMA;
    dp__endpoint_remote_path(c->ep, uc->remote, &uc->path, NULL);
    return DP_OK;
}

/*
 * A control-only client's unit u answered info (the fanout checked who it
 * is): keep its process and endpoint name, and record the check.
 */
static void
bind_ctl_locked(dp_client *c, uint32_t u, dp__fanout_unit *r)
{
    dp__unit_probe *k = &c->checks[u];
    const dp_wire_info *in = &r->rep.r.info;
    if (dp__wire_str_copy(in->agent, k->agent, sizeof k->agent) >= sizeof k->agent) {
        k->agent[0] = '\0';
        dp__fanout_fail(&c->fo, u, DP_EPROTO, " ",
                        "has an endpoint name of %u bytes (at most %zu)", in->agent.n,
                        sizeof k->agent - 1);
        return;
    }
    c->units[u].incarnation = in->incarnation;
    k->state = DP__UNIT_CHECKED;
}

/* The fanout's options for info: who answered must be unit u of this cluster. */
static dp__fanout_opts
info_opts(const dp_client *c)
{
    dp__fanout_opts o = c->words;
    o.flags |= DP__FANOUT_IDENTITY;
    o.n_units = c->n_units;
    o.cluster_id = c->cluster_id;
    return o;
}

/*
 * info from unit only (every unit: only < 0) at once, each checked by the
 * fanout to be unit u of n, then bound: a full client's data path (binding
 * stops at the first failure: the open fails), a control-only client's
 * record. With DP__CTL_ALLOW_DOWN a unit that does not answer is marked down
 * instead of an error: a control-only client's requests to it then fail with
 * why; a full client leaves it unbound (stale, incarnation 0), so the first
 * put or get that needs it binds it (dp__client_ready_locked) or finds it
 * still down; unless no unit answers at all. The first failure (unit order)
 * goes into d: the unit's report, "connecting to unit U (ADDR): why" for a
 * full client.
 */
static int
check_units_locked(dp_client *c, int64_t only, unsigned flags, dp_detail *d)
{
    dp__fanout *f = &c->fo;
    dp__fanout_reset(f);
    dp_wire_request q;
    memset(&q, 0, sizeof q);
    q.op = DP_WIRE_OP_INFO;
    for (uint32_t u = 0; u < c->n_units; u++)
        if (only < 0 || (int64_t)u == only)
            dp__fanout_add(f, &c->rids, u, c->units[u].addr, 0, &q);
    dp__fanout_opts o = info_opts(c);
    dp__fanout_run(f, c->ctl, c->o.connect_timeout_s, &o);
    int first = DP_OK;
    uint32_t asked = 0, n_down = 0, first_down = 0;
    for (uint32_t u = 0; u < c->n_units; u++) {
        dp__fanout_unit *r = &f->u[u];
        if (r->op == DP_WIRE_OP_NONE)
            continue;
        asked++;
        bool down = r->rc != DP_OK && !r->answered && (flags & DP__CTL_ALLOW_DOWN);
        if (down && n_down++ == 0)
            first_down = u;
        if (c->checks == NULL && down) {
            /* Left unbound: the first operation that needs it binds it. */
            dp__unit_conn *uc = &c->units[u];
            uc->stale = true;
            uc->incarnation = 0;
            c->cnt.units_down++;
        } else if (c->checks != NULL) {
            if (r->rc == DP_OK)
                bind_ctl_locked(c, u, r);
            dp__unit_probe *k = &c->checks[u];
            if (down) {
                k->state = DP__UNIT_DOWN;
                k->rc = r->rc;
                k->det = r->det;
                k->why = r->why;
            } else if (r->rc != DP_OK) {
                k->state = DP__UNIT_UNCHECKED;
            }
        } else if (r->rc == DP_OK && first == DP_OK) {
            dp_detail e;
            dp_detail_clear(&e);
            int rc = bind_unit_locked(c, u, &r->rep.r.info, &e);
            if (rc != DP_OK)
                dp__fanout_fail(f, u, rc, ": ", "%s", e.msg);
        }
        if (r->rc == DP_OK || down || first != DP_OK)
            continue;
        first = r->rc;
        if (c->checks != NULL) {
            if (d != NULL)
                *d = r->det;
        } else {
            dp__fail(d, r->rc, "connecting to unit %u (%s): %s", u, c->units[u].addr,
                     dp__fanout_why(r));
        }
    }
    if (first == DP_OK && c->checks == NULL && asked > 0 && n_down == asked) {
        /* No unit answers: a wrong file or no cluster, not an outage. */
        dp__fanout_unit *r = &f->u[first_down];
        first = r->rc;
        dp__fail(d, r->rc, "no unit answers; unit %u (%s): %s", first_down,
                 c->units[first_down].addr, dp__fanout_why(r));
    }
    for (uint32_t u = first_down;
         first == DP_OK && c->checks == NULL && n_down > 0 && u < c->n_units; u++)
        if (f->u[u].op != DP_WIRE_OP_NONE && f->u[u].rc != DP_OK)
            DP_LOG_W("client: unit %u (%s) is down: %s; its rows fail until it answers, "
                     "and the first put or get after that connects to it",
                     u, c->units[u].addr, dp__fanout_why(&f->u[u]));
    dp__fanout_reset(f);
    return first;
}

int
dp__client_reply_check_locked(dp_client *c, uint32_t u, const dp_wire_reply *rep,
                              bool report, dp_detail *d)
{
    dp__unit_conn *uc = &c->units[u];
    bool other = dp__fanout_other_process(uc->incarnation, rep->incarnation);
    aborts_again_locked(c, u, !other);
    if (!other)
        return DP_OK;
    if (!uc->stale || uc->seen_incarnation != rep->incarnation) {
        c->cnt.restarts_seen++;
        DP_LOG_W("client: unit %u (%s) restarted: incarnation %016" PRIx64
                 " answers, the data path is bound to %016" PRIx64 "; re-binding",
                 u, uc->addr, rep->incarnation, uc->incarnation);
        uc->restart_unreported = true;
    }
    uc->stale = true;
    uc->seen_incarnation = rep->incarnation;
    if (!report)
        return DP_OK;
    uc->restart_unreported = false;
    return dp__fail(d, DP_ERESTARTED,
                    "unit %u (%s) restarted (incarnation %016" PRIx64 " -> %016" PRIx64
                    "): what it held is gone unless it loaded a checkpoint; this client "
                    "re-binds to it and the next operation uses the new process",
                    u, uc->addr, uc->incarnation, rep->incarnation);
}

/*
 * Re-bind unit u after the fanout's info (r): the restart bookkeeping, the
 * new binding, and a restart reported once. Returns the unit's code for the
 * operation, its detail into det.
 */
static int
rebind_locked(dp_client *c, uint32_t u, const dp__fanout_unit *r, dp_detail *det)
{
    dp__unit_conn *uc = &c->units[u];
    int rc = r->rc;
    if (rc == DP_ETRANSFER || rc == DP_ETIMEDOUT) {
        c->cnt.units_down++;
        return dp__fail(det, rc, "unit %u (%s) is down: %s", u, uc->addr,
                        dp__fanout_why(r));
    }
    if (rc != DP_OK)
        return dp__fail(det, rc, "%s", dp__fanout_why(r));
    uint64_t was = uc->incarnation; /* 0: down when the client opened */
    uint64_t now_inc = r->rep.r.info.incarnation;
    bool restarted = was != 0 && now_inc != was, stalled = uc->ep_suspect;
    if (restarted && (!uc->stale || uc->seen_incarnation != now_inc)) {
        c->cnt.restarts_seen++;
        uc->restart_unreported = true;
    }
    rc = bind_unit_locked(c, u, &r->rep.r.info, det);
    if (rc != DP_OK)
        return rc;
    if (was != 0)
        c->cnt.rebinds++;
    DP_LOG_I("client: unit %u (%s) %s incarnation %016" PRIx64 " (%s)", u, uc->addr,
             was != 0 ? "re-bound to" : "bound to", now_inc,
             was == 0    ? "it was down when the client opened"
             : restarted ? "it restarted"
             : stalled   ? "its transfers stalled"
                         : "its transfer endpoint failed");
    if (!uc->restart_unreported)
        return DP_OK;
    uc->restart_unreported = false;
    return dp__fail(
        det, DP_ERESTARTED,
        "unit %u (%s) restarted (incarnation %016" PRIx64 " -> %016" PRIx64
        "): what it held is gone unless it loaded a checkpoint; re-bound, the "
        "next operation uses it",
        u, uc->addr, was, now_inc);
}

void
dp__client_follow_locked(dp_client *c)
{
    if (c->reg == NULL)
        return;
    uint64_t gen = dp__reg_watch_gen(c->reg);
    if (gen == c->reg_gen)
        return;
    c->reg_gen = gen;
    for (uint32_t u = 0; u < c->n_units; u++) {
        dp__unit_conn *uc = &c->units[u];
        dp__reg_record r;
        if (!dp__reg_watch_get(c->reg, u, &r))
            continue; /* down (or not back yet): keep what is known */
        bool moved = strcmp(r.zmq, uc->addr) != 0;
        /* A unit that came back (or moved) may have a new key. */
        dp__ctl_client_server_key(c->ctl, r.zmq, r.pubkey, NULL);
        bool other = c->ep != NULL && r.incarnation != uc->incarnation && !uc->stale;
        if (!moved && !other)
            continue;
        DP_LOG_W("client: the registry says unit %u is incarnation %016" PRIx64 " at %s "
                 "(bound to %016" PRIx64 " at %s); re-binding",
                 u, r.incarnation, r.zmq, uc->incarnation, uc->addr);
        if (moved) {
            char old[sizeof uc->addr];
            snprintf(old, sizeof old, "%s", uc->addr);
            snprintf(uc->addr, sizeof uc->addr, "%s", r.zmq);
            /* No unit there any more: its idle sockets would reconnect for ever. */
            bool used = false;
            for (uint32_t v = 0; v < c->n_units && !used; v++)
                used = strcmp(c->units[v].addr, old) == 0;
            if (!used)
                dp__ctl_client_forget(c->ctl, old);
        }
        /*
         * Only a re-bind: whether the unit restarted (and which incarnation
         * it is) is what its info answers, not what a record, maybe stale,
         * says (rebind_locked counts and reports it).
         */
        if (c->ep != NULL)
            uc->stale = true;
    }
}

void
dp__client_ready_locked(dp_client *c, const uint32_t *units, size_t n, double deadline,
                        int *rcs, dp_detail *dets)
{
    dp__client_follow_locked(c);
    dp__fanout *f = &c->fo;
    dp__fanout_reset(f);
    dp_wire_request q;
    memset(&q, 0, sizeof q);
    q.op = DP_WIRE_OP_INFO;
    for (size_t i = 0; i < n; i++) {
        rcs[i] = 0;
        dp_detail_clear(&dets[i]);
        dp__unit_conn *uc = &c->units[units[i]];
        if (f->u[units[i]].op != DP_WIRE_OP_NONE)
            continue; /* named twice: asked once */
        bool failed =
            !uc->stale &&
            (uc->ep_suspect || dp__endpoint_remote_check(c->ep, uc->remote, NULL) != 0);
        if (uc->stale || failed)
            dp__fanout_add(f, &c->rids, units[i], uc->addr, 0, &q);
    }
    if (f->n_slots == 0 && dp__fanout_failed(f) == 0)
        return;
    dp__fanout_opts o = info_opts(c);
    dp__fanout_run(f, c->ctl, dp__client_round_timeout(deadline), &o);
    for (size_t i = 0; i < n; i++) {
        bool first = f->u[units[i]].op != DP_WIRE_OP_NONE;
        for (size_t j = 0; j < i && first; j++)
            first = units[j] != units[i];
        if (first)
            rcs[i] = rebind_locked(c, units[i], &f->u[units[i]], &dets[i]);
    }
    /* Units named twice get the same answer. */
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < i; j++)
            if (units[j] == units[i] && rcs[j] != 0 && rcs[i] == 0) {
                rcs[i] = rcs[j];
                dets[i] = dets[j];
            }
    dp__fanout_reset(f);
}

/*
 * A full client's units not bound since the open (incarnation 0) that q_of
 * picks (NULL: all), bound now (dp__client_ready_locked: info, checked to be
 * unit u of n). *rcs (NULL when there was none) gets n_units codes, 0 for
 * every other unit, and *dets their details; free both. DP_ENOMEM else.
 */
static int
bind_unbound_locked(dp_client *c, dp__fanout_req_fn q_of, void *ctx, double deadline,
                    int **rcs, dp_detail **dets, dp_detail *d)
{
    *rcs = NULL;
    *dets = NULL;
    uint32_t *us = NULL, n = 0;
    for (uint32_t u = 0; c->checks == NULL && u < c->n_units; u++) {
        dp_wire_request q;
        memset(&q, 0, sizeof q);
        if (c->units[u].incarnation != 0 || (q_of != NULL && !q_of(u, &q, ctx)))
            continue;
        if (us == NULL && (us = malloc(c->n_units * sizeof *us)) == NULL)
            return dp__fail(d, DP_ENOMEM, "client: out of memory");
        us[n++] = u;
    }
    if (n == 0)
        return DP_OK;
    int *r = calloc(c->n_units, sizeof *r), *rk = malloc(n * sizeof *rk);
    dp_detail *e = calloc(c->n_units, sizeof *e), *ek = malloc(n * sizeof *ek);
    int rc = DP_OK;
    if (r == NULL || rk == NULL || e == NULL || ek == NULL) {
        rc = dp__fail(d, DP_ENOMEM, "client: out of memory");
        free(r);
        free(e);
    } else {
        dp__client_ready_locked(c, us, n, deadline, rk, ek);
        for (uint32_t k = 0; k < n; k++) {
            r[us[k]] = rk[k];
            e[us[k]] = ek[k];
        }
        *rcs = r;
        *dets = e;
    }
    free(us);
    free(rk);
    free(ek);
    return rc;
}

int
dp__client_bind_all(dp_client *c, dp_detail *d)
{
    if (c == NULL)
        return dp__fail(d, DP_EINVAL, "dp__client_bind_all: NULL client");
    pthread_mutex_lock(&c->mu);
    int *rcs;
    dp_detail *dets;
    int rc = bind_unbound_locked(c, NULL, NULL, dp__now_s() + c->o.connect_timeout_s,
                                 &rcs, &dets, d);
    for (uint32_t u = 0; rc == DP_OK && rcs != NULL && u < c->n_units; u++)
        if (rcs[u] != 0) {
            rc = rcs[u];
            if (d != NULL)
                *d = dets[u];
        }
    pthread_mutex_unlock(&c->mu);
    free(rcs);
    free(dets);
    return rc;
}

int
dp_client_counters_get(dp_client *c, dp_client_counters *out)
{
    if (c == NULL || out == NULL)
        return DP_EINVAL;
    pthread_mutex_lock(&c->mu);
    *out = c->cnt;
    if (c->ep != NULL) {
        dp_endpoint_stats es;
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
            snprintf(buf, cap, "%s %s (%s)", dp__xfer_lane_name(uc->lane),
                     dp__xfer_path_name(uc->path), uc->tls);
        rc = DP_OK;
    }
    pthread_mutex_unlock(&c->mu);
    return rc;
}

static int
open_common(const char *const *addrs, uint32_t n, const char *cluster_id,
            const dp_cluster_unit *cu, const dp_client_opts *opts, dp_client **out,
            dp_detail *d)
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
    if (rc == 0 && cluster_id != NULL)
        snprintf(c->cluster_id, sizeof c->cluster_id, "%s", cluster_id);
    for (uint32_t u = 0; rc == 0 && u < n; u++)
        rc = set_addr(c, u, addrs[u], d);
    if (rc == 0)
        rc = set_server_keys(c, cu, n, d);
    if (rc == 0) {
        pthread_mutex_lock(&c->mu);
        rc = check_units_locked(c, -1, DP__CTL_ALLOW_DOWN, d);
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
    return open_common(addrs, n_units, NULL, NULL, opts, out, d);
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
    dp_cluster cl;
    int rc = dp__cluster_resolve(cluster, budget, &cl, where, sizeof where, d);
    if (rc != 0)
        return rc;
    const char **addrs = calloc(cl.n_units, sizeof *addrs);
    if (addrs == NULL) {
        dp__cluster_fini(&cl);
        return dp__fail(d, DP_ENOMEM, "client: out of memory");
    }
    for (uint32_t u = 0; u < cl.n_units; u++)
        addrs[u] = cl.units[u].zmq;
    rc = open_common(addrs, cl.n_units, cl.cluster_id, cl.units, opts, out, d);
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
dp__client_open_ctl(const dp_cluster *cl, const dp_client_opts *opts,
                    const dp__fanout_opts *words, unsigned flags, dp_client **out,
                    dp_detail *d)
{
    if (out == NULL || cl == NULL)
        return dp__fail(d, DP_EINVAL, "dp__client_open_ctl: NULL argument");
    *out = NULL;
    dp_client *c = NULL;
    int rc = client_new(opts, cl->n_units, true, &c, d);
    for (uint32_t u = 0; rc == DP_OK && u < cl->n_units; u++)
        rc = set_addr(c, u, cl->units[u].zmq, d);
    if (rc == DP_OK)
        rc = set_server_keys(c, cl->units, cl->n_units, d);
    if (rc == DP_OK)
        snprintf(c->cluster_id, sizeof c->cluster_id, "%s", cl->cluster_id);
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
    int rc = check_units_locked(c, only, flags, d);
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

/*
 * Whether a control-only client may send op to unit u: checked, or not at
 * all (a unit down gets its reason, one never asked who it is DP_EINVAL, as
 * its outcome in f).
 */
static bool
refused_locked(dp_client *c, dp__fanout *f, uint32_t u, dp_wire_op op)
{
    const dp__unit_probe *k = c->checks != NULL ? &c->checks[u] : NULL;
    if (k == NULL || k->state == DP__UNIT_CHECKED)
        return false;
    dp__fanout_unit *r = &f->u[u];
    r->addr = c->units[u].addr;
    r->op = op;
    if (k->state == DP__UNIT_DOWN) {
        r->rc = k->rc;
        r->det = k->det;
        r->why = k->why;
    } else {
        dp__fanout_fail(f, u, DP_EINVAL, " ", "was not asked who it is before use");
    }
    return true;
}

/*
 * q_of's request to every unit it picks, at once, into f (reset first):
 * clear, stats and the CLI's calls. A full client notes each reply's
 * incarnation (a restart seen here is reported to the next put or get).
 * Returns the first failure, into d.
 */
static int
call_all_locked(dp_client *c, dp__fanout *f, dp__fanout_req_fn q_of, void *ctx,
                dp_detail *d)
{
    dp__client_follow_locked(c);
    /*
     * A full client's units that were down when it opened have not said who
     * they are: they are bound first, and one that is still down, or is
     * another cluster's, is not sent q_of's request but fails with why.
     */
    int *rcs;
    dp_detail *dets;
    int rc =
        bind_unbound_locked(c, q_of, ctx, dp__now_s() + c->o.timeout_s, &rcs, &dets, d);
    dp__fanout_reset(f); /* after: binding uses the client's own fanout, maybe f */
    if (rc != DP_OK)
        return rc;
    for (uint32_t u = 0; u < c->n_units; u++) {
        dp_wire_request q;
        memset(&q, 0, sizeof q);
        if (!q_of(u, &q, ctx) || refused_locked(c, f, u, q.op))
            continue;
        if (rcs != NULL && rcs[u] != 0) {
            dp__fanout_unit *r = &f->u[u];
            r->addr = c->units[u].addr;
            r->op = q.op;
            /* Its report names the unit already: "unit U (ADDR) is down: ...". */
            char pre[DP_CLUSTER_ADDR_MAX + 32];
            int pl = snprintf(pre, sizeof pre, "unit %u (%s) ", u, r->addr);
            const char *m = dp_detail_msg(&dets[u]);
            if (pl > 0 && strncmp(m, pre, (size_t)pl) == 0)
                m += pl;
            dp__fanout_fail(f, u, rcs[u], " ", "%s", m);
            continue;
        }
        dp__fanout_add(f, &c->rids, u, c->units[u].addr, c->units[u].incarnation, &q);
    }
    free(rcs);
    free(dets);
    dp__fanout_run(f, c->ctl, c->o.timeout_s, &c->words);
    for (uint32_t u = 0; c->checks == NULL && u < c->n_units; u++)
        if (f->u[u].decoded && f->u[u].answered)
            /* A restarted unit answers as well as the old one: note it, go on. */
            dp__client_reply_check_locked(c, u, &f->u[u].rep, false, NULL);
    return dp__fanout_first(f, d);
}

int
dp__client_call_all(dp_client *c, dp__fanout *f, dp__fanout_req_fn q_of, void *ctx,
                    dp_detail *d)
{
    memset(f, 0, sizeof *f);
    if (c == NULL || q_of == NULL)
        return dp__fail(d, DP_EINVAL, "dp__client_call_all: NULL argument");
    int rc = dp__fanout_init(f, c->n_units, d);
    if (rc != DP_OK)
        return rc;
    pthread_mutex_lock(&c->mu);
    rc = call_all_locked(c, f, q_of, ctx, d);
    pthread_mutex_unlock(&c->mu);
    return rc;
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
    dp_ctl_client *ctl = NULL;
    if (keep) {
        for (size_t i = 0; i < c->n_regions; i++) {
            dp__endpoint_deregister(c->ep, c->regions[i].p, NULL);
            direct_remove_locked(c, c->regions[i].p);
        }
        c->n_regions = 0;
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

/* ---- clear ---- */

typedef struct clear_ctx {
    const dp__groups *g;
    uint64_t *sorted; /* the rows in g's order: each unit's side by side */
} clear_ctx;

static bool
clear_req(uint32_t u, dp_wire_request *q, void *ctx)
{
    const clear_ctx *x = ctx;
    uint32_t n = dp__groups_count(x->g, u);
    if (n == 0)
        return false;
    q->op = DP_WIRE_OP_RELEASE_ROWS;
    q->a.release_rows.gidxs = (dp_wire_u64s){x->sorted + x->g->start[u], n};
    return true;
}

/*
 * release_rows of gidxs[0..n) (1..UINT32_MAX rows) on the units that own
 * them, at once: g gets the rows grouped by unit, f each unit's outcome,
 * *dropped the entries dropped; d the summary of the failed units.
 */
static int
clear_locked(dp_client *c, const uint64_t *gidxs, size_t n, dp__fanout *f, dp__groups *g,
             uint64_t *dropped, dp_detail *d)
{
    int rc = dp__groups_make(g, c->n_units, gidxs, n, d);
    if (rc != DP_OK)
        return dp__fail_ctx(d, rc, "clear");
    uint64_t *sorted = malloc(n * sizeof *sorted);
    if (sorted == NULL)
        return dp__fail(d, DP_ENOMEM, "clear: out of memory");
    for (size_t k = 0; k < n; k++)
        sorted[k] = gidxs[g->order[k]];
    clear_ctx x = {g, sorted};
    call_all_locked(c, f, clear_req, &x, NULL);
    free(sorted);
    size_t n_failed_rows = 0;
    for (uint32_t u = 0; u < c->n_units; u++) {
        const dp__fanout_unit *r = &f->u[u];
        if (r->op == DP_WIRE_OP_NONE)
            continue;
        if (r->rc == DP_OK) {
            *dropped += r->rep.r.dropped;
            continue;
        }
        if (rc == DP_OK)
            rc = dp__fail(d, r->rc, "clear: rows of unit %u (%s) not cleared: %s", u,
                          c->units[u].addr, dp__fanout_why(r));
        else
            dp__detail_append(d, "; unit %u (%s) also failed: %s", u, c->units[u].addr,
                              dp_errname(r->rc));
        n_failed_rows += dp__groups_count(g, u);
    }
    if (rc != DP_OK)
        dp__detail_append(d, " (%zu of %zu rows not cleared)", n_failed_rows, n);
    return rc;
}

/* dp_client_clear's argument checks; *go false when there is nothing to do. */
static int
clear_args(const dp_client *c, const uint64_t *gidxs, size_t n, bool *go, dp_detail *d)
{
    *go = false;
    if (c == NULL || (gidxs == NULL && n > 0))
        return dp__fail(d, DP_EINVAL, "dp_client_clear: NULL argument");
    if (n > UINT32_MAX)
        return dp__fail(d, DP_ETOOBIG, "clear: %zu rows in one call", n);
    *go = n > 0;
    return DP_OK;
}

int
dp_client_clear(dp_client *c, const uint64_t *gidxs, size_t n, uint64_t *dropped,
                dp_detail *d)
{
    uint64_t dropped_here = 0;
    bool go;
    int rc = clear_args(c, gidxs, n, &go, d);
    if (dropped != NULL)
        *dropped = 0;
    if (rc != DP_OK || !go)
        return rc;
    dp__groups g;
    pthread_mutex_lock(&c->mu);
    rc = clear_locked(c, gidxs, n, &c->fo, &g, &dropped_here, d);
    c->cnt.clears++;
    dp__fanout_reset(&c->fo);
    pthread_mutex_unlock(&c->mu);
    dp__groups_fini(&g);
    if (dropped != NULL)
        *dropped = dropped_here;
    return rc;
}

int
dp__client_clear_units(dp_client *c, const uint64_t *gidxs, size_t n, dp__fanout *f,
                       dp__groups *g, dp_detail *d)
{
    memset(f, 0, sizeof *f);
    memset(g, 0, sizeof *g);
    uint64_t dropped = 0;
    bool go;
    int rc = clear_args(c, gidxs, n, &go, d);
    if (rc == DP_OK)
        rc = dp__fanout_init(f, c->n_units, d);
    if (rc != DP_OK)
        return rc;
    if (!go)
        return dp__groups_make(g, c->n_units, gidxs, 0, d);
    pthread_mutex_lock(&c->mu);
    rc = clear_locked(c, gidxs, n, f, g, &dropped, d);
    pthread_mutex_unlock(&c->mu);
    return rc;
}

/* ---- stats ---- */

typedef struct stat_kv {
    char *name;
    double value;
} stat_kv;

typedef struct unit_stats {
    int status;
    stat_kv *kv;
    size_t n;
} unit_stats;

struct dp_client_stats {
    uint32_t n_units;
    unit_stats *u;
};

void
dp_client_stats_destroy(dp_client_stats *s)
{
    if (s == NULL)
        return;
    for (uint32_t u = 0; s->u != NULL && u < s->n_units; u++) {
        for (size_t i = 0; i < s->u[u].n; i++)
            free(s->u[u].kv[i].name);
        free(s->u[u].kv);
    }
    free(s->u);
    free(s);
}

static int
stats_fill(unit_stats *us, const dp_wire_fields *f, dp_detail *d)
{
    us->kv = calloc(f->n > 0 ? f->n : 1, sizeof *us->kv);
    if (us->kv == NULL)
        return dp__fail(d, DP_ENOMEM, "stats: out of memory");
    for (uint32_t i = 0; i < f->n; i++) {
        const dp_wire_field *x = &f->v[i];
        double v;
        switch (x->type) {
        case DP_WIRE_BOOL:
            v = x->v.b ? 1 : 0;
            break;
        case DP_WIRE_U64:
            v = (double)x->v.u;
            break;
        case DP_WIRE_I64:
            v = (double)x->v.i;
            break;
        case DP_WIRE_F64:
            v = x->v.f;
            break;
        default:
            continue;
        }
        char *name = dp__wire_str_dup(x->name);
        if (name == NULL)
            return dp__fail(d, DP_ENOMEM, "stats: out of memory");
        us->kv[us->n++] = (stat_kv){name, v};
    }
    return DP_OK;
}

int
dp_client_stats_get(dp_client *c, dp_client_stats **out, dp_detail *d)
{
    if (c == NULL || out == NULL)
        return dp__fail(d, DP_EINVAL, "dp_client_stats_get: NULL argument");
    *out = NULL;
    dp_client_stats *s = calloc(1, sizeof *s);
    if (s == NULL)
        return dp__fail(d, DP_ENOMEM, "stats: out of memory");
    s->n_units = c->n_units;
    s->u = calloc(c->n_units, sizeof *s->u);
    if (s->u == NULL) {
        free(s);
        return dp__fail(d, DP_ENOMEM, "stats: out of memory");
    }
    pthread_mutex_lock(&c->mu);
    dp_wire_op op = DP_WIRE_OP_STATS;
    call_all_locked(c, &c->fo, dp__fanout_req_op, &op, NULL);
    int rc = DP_OK;
    for (uint32_t u = 0; u < c->n_units; u++) {
        const dp__fanout_unit *r = &c->fo.u[u];
        dp_detail ud;
        dp_detail_clear(&ud);
        int urc = r->rc;
        if (urc == DP_OK)
            urc = stats_fill(&s->u[u], &r->rep.r.stats, &ud);
        s->u[u].status = urc;
        if (urc != DP_OK && rc == DP_OK)
            rc = dp__fail(d, urc, "stats: unit %u (%s): %s", u, c->units[u].addr,
                          r->rc != DP_OK ? dp__fanout_why(r) : ud.msg);
    }
    dp__fanout_reset(&c->fo);
    pthread_mutex_unlock(&c->mu);
    *out = s;
    return rc;
}

uint32_t
dp_client_stats_units(const dp_client_stats *s)
{
    return s != NULL ? s->n_units : 0;
}

int
dp_client_stats_status(const dp_client_stats *s, uint32_t unit)
{
    if (s == NULL || unit >= s->n_units)
        return DP_EINVAL;
    return s->u[unit].status;
}

size_t
dp_client_stats_count(const dp_client_stats *s, uint32_t unit)
{
    if (s == NULL || unit >= s->n_units)
        return 0;
    return s->u[unit].n;
}

bool
dp_client_stats_at(const dp_client_stats *s, uint32_t unit, size_t i, const char **name,
                   double *value)
{
    if (s == NULL || unit >= s->n_units || i >= s->u[unit].n)
        return false;
    if (name != NULL)
        *name = s->u[unit].kv[i].name;
    if (value != NULL)
        *value = s->u[unit].kv[i].value;
    return true;
}

bool
dp_client_stats_find(const dp_client_stats *s, uint32_t unit, const char *name,
                     double *value)
{
    if (s == NULL || name == NULL || unit >= s->n_units)
        return false;
    for (size_t i = 0; i < s->u[unit].n; i++) {
        if (strcmp(s->u[unit].kv[i].name, name) == 0) {
            if (value != NULL)
                *value = s->u[unit].kv[i].value;
            return true;
        }
    }
    return false;
}

int
dp_key_check(const char *key, size_t len, uint64_t *gidx, dp_detail *d)
{
    if (key == NULL)
        return dp__fail(d, DP_EINVAL, "key: NULL");
    dp_key_parts kp;
    int rc = dp__key_split(key, len, &kp, d);
    if (rc == DP_OK && gidx != NULL)
        *gidx = kp.gidx;
    return rc;
}
