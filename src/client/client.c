/*
 * The client library's core (see dataplane/client.h): connecting to the units,
 * the pool of registered memory, clear and stats. put.c and get.c hold the
 * data operations.
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
 *   still touch it (dp_endpoint_touches_unfinished): then it is retired
 *   whole, charged to the graveyard, and never reused, unmapped or freed
 *   while that transfer may run. When every such transfer ended after all
 *   (the endpoint released it from the graveyard: UCX completed its
 *   requests, e.g. purged them when the peer failed), the buffer is cached
 *   again at the next lookup.
 * - Each unit's data path is bound to one incarnation of it (its process):
 *   replies from another, and failed transfer endpoints, make the client
 *   re-bind before the next transfer (dp__client_ready_locked), never post
 *   through a binding of another process (docs/design.md, "Unit
 *   incarnations").
 * - Per-unit scratch (blob builders, request buffers, ctl items) is kept in
 *   the client and reset per operation, so a batch costs a few allocations,
 *   not one per key.
 */
#include "client/client_int.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "blob/keys.h"
#include "dataplane/version.h"

void (*dp__client_test_hook)(const char *stage);

#define MIN_BUF (1u << 20)

/* ---- small helpers ---- */

double
dp__client_left(double deadline)
{
    double l = deadline - dp_now_s();
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
        dp_sleep_s(s);
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
            return dp_fail(d, DP_EINVAL,
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
    if (!(o->timeout_s > 0) || !(o->connect_timeout_s > 0) ||
        o->timeout_s > MAX_TIMEOUT_S || o->connect_timeout_s > MAX_TIMEOUT_S)
        return dp_fail(d, DP_EINVAL,
                       "client: timeouts must be in (0, 1e6] s, or 0 for the default "
                       "(timeout_s %g, connect_timeout_s %g)",
                       o->timeout_s, o->connect_timeout_s);
    return DP_OK;
}

int
dp__client_prepare_locked(dp_client *c, uint32_t u, size_t slot, dp_wire_request *q,
                          dp_detail *d)
{
    q->rid = dp_wire_rid_next(&c->rids, c->rid[u]);
    dp_buf_reset(&c->reqs[u]);
    int rc = dp_wire_request_encode(q, NULL, &c->reqs[u], d);
    if (rc != 0)
        return dp_fail_ctx(d, rc, "unit %u (%s): %s request", u, c->units[u].addr,
                           dp_wire_op_name(q->op));
    dp_ctl_item *it = &c->items[slot];
    dp_buf_reset(&it->reply);
    it->address = c->units[u].addr;
    it->req = c->reqs[u].data;
    it->len = c->reqs[u].len;
    it->rid = c->rid[u];
    it->rc = 0;
    dp_detail_clear(&it->det);
    return DP_OK;
}

void
dp__client_notify_locked(dp_client *c, uint32_t u, dp_wire_request *q)
{
    char rid[DP_WIRE_RID_MAX];
    q->rid = dp_wire_rid_next(&c->rids, rid);
    dp_buf b = {0};
    dp_detail d;
    dp_detail_clear(&d);
    int rc = dp_wire_request_encode(q, NULL, &b, &d);
    if (rc == 0)
        rc = dp_ctl_notify(c->ctl, c->units[u].addr, b.data, b.len, &d);
    if (rc != 0)
        DP_LOG_W("client: %s to unit %u (%s) not sent: %s", dp_wire_op_name(q->op), u,
                 c->units[u].addr, dp_detail_msg(&d));
    dp_buf_fini(&b);
}

static void
send_abort(dp_client *c, uint32_t u, const char *blob_id, bool in_flight)
{
    dp_wire_request q;
    memset(&q, 0, sizeof q);
    q.op = DP_WIRE_OP_ABORT;
    q.a.abort.blob_id = dp_wire_s(blob_id);
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
        if (dp_endpoint_deregister(c->ep, b.p, &d) != 0) {
            /* Still in use by a transfer: keep it, never reuse it. */
            DP_LOG_W("client: staging buffer kept: %s", dp_detail_msg(&d));
            c->bufs[best].state = DP__BUF_RETIRED;
            dp_graveyard_retain_buffer(b.len);
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
    size_t best = SIZE_MAX;
    for (size_t i = 0; i < c->n_bufs; i++) {
        dp__buf *b = &c->bufs[i];
        if (b->state == DP__BUF_RETIRED &&
            !dp_endpoint_touches_unfinished(c->ep, b->p, b->len)) {
            /* The transfers that touched it ended after all: usable again. */
            b->state = DP__BUF_FREE;
            b->last_use = ++c->use_clock;
            c->cached_bytes += b->len;
            dp_graveyard_release_buffer(b->len);
        }
        if (b->state != DP__BUF_FREE || b->len < nbytes)
            continue;
        if (dp_endpoint_touches_unfinished(c->ep, b->p, b->len)) {
            c->cached_bytes -= b->len;
            b->state = DP__BUF_RETIRED;
            dp_graveyard_retain_buffer(b->len);
            continue;
        }
        if (best == SIZE_MAX || b->len < c->bufs[best].len)
            best = i;
    }
    if (best != SIZE_MAX && c->bufs[best].len <= 4 * round_buf(nbytes)) {
        c->bufs[best].state = state;
        c->cached_bytes -= c->bufs[best].len;
        *out = &c->bufs[best];
        return DP_OK;
    }
    if (c->n_bufs == c->cap_bufs) {
        size_t nc = c->cap_bufs ? c->cap_bufs * 2 : 16;
        dp__buf *nb = realloc(c->bufs, nc * sizeof *nb);
        if (nb == NULL)
            return dp_fail(d, DP_ENOMEM, "client: out of memory (buffer table)");
        c->bufs = nb;
        c->cap_bufs = nc;
    }
    size_t len = round_buf(nbytes);
    void *p = NULL;
    int rc = dp_endpoint_alloc(c->ep, len, &p, d);
    if (rc != 0)
        return dp_fail_ctx(d, rc, "client: mapping %zu bytes of registered memory", len);
    dp__buf *b = &c->bufs[c->n_bufs++];
    b->p = p;
    b->len = len;
    b->state = state;
    *out = b;
    return DP_OK;
}

void
dp__client_buf_put_locked(dp_client *c, uint8_t *p)
{
    dp__buf *b = buf_find_locked(c, p);
    if (b == NULL || b->state == DP__BUF_FREE || b->state == DP__BUF_RETIRED)
        return;
    if (dp_endpoint_touches_unfinished(c->ep, b->p, b->len)) {
        b->state = DP__BUF_RETIRED;
        dp_graveyard_retain_buffer(b->len);
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
    uintptr_t a = (uintptr_t)p;
    for (size_t i = 0; i < c->n_bufs; i++) {
        const dp__buf *b = &c->bufs[i];
        if ((b->state == DP__BUF_USER || b->state == DP__BUF_VALUES) &&
            a >= (uintptr_t)b->p && n <= b->len && a - (uintptr_t)b->p <= b->len - n)
            return true;
    }
    for (size_t i = 0; i < c->n_regions; i++) {
        const dp__region *r = &c->regions[i];
        if (a >= (uintptr_t)r->p && n <= r->len && a - (uintptr_t)r->p <= r->len - n)
            return true;
    }
    return false;
}

int
dp_client_alloc(dp_client *c, size_t nbytes, void **out, dp_detail *d)
{
    if (c == NULL || out == NULL || nbytes == 0)
        return dp_fail(d, DP_EINVAL, "dp_client_alloc: NULL argument or zero size");
    pthread_mutex_lock(&c->mu);
    dp__buf *b = NULL;
    int rc = dp__client_buf_get_locked(c, nbytes, DP__BUF_USER, &b, d);
    if (rc == 0)
        *out = b->p;
    pthread_mutex_unlock(&c->mu);
    return rc;
}

bool
dp_client_touches_unfinished(const dp_client *c, const void *p, size_t nbytes)
{
    return c != NULL && dp_endpoint_touches_unfinished(c->ep, p, nbytes);
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
        return dp_fail(d, DP_EINVAL, "dp_client_register: NULL address or zero size");
    pthread_mutex_lock(&c->mu);
    int rc = DP_OK;
    if (c->n_regions == c->cap_regions) {
        size_t nc = c->cap_regions ? c->cap_regions * 2 : 8;
        dp__region *nr = realloc(c->regions, nc * sizeof *nr);
        if (nr == NULL) {
            rc = dp_fail(d, DP_ENOMEM, "client: out of memory (region table)");
            goto out;
        }
        c->regions = nr;
        c->cap_regions = nc;
    }
    rc = dp_endpoint_register(c->ep, addr, nbytes, d);
    if (rc == 0)
        c->regions[c->n_regions++] = (dp__region){addr, nbytes};
out:
    pthread_mutex_unlock(&c->mu);
    return rc;
}

int
dp_client_deregister(dp_client *c, void *addr, dp_detail *d)
{
    if (c == NULL)
        return dp_fail(d, DP_EINVAL, "dp_client_deregister: NULL client");
    pthread_mutex_lock(&c->mu);
    int rc = dp_fail(d, DP_ENOTFOUND, "no region registered at %p", addr);
    for (size_t i = 0; i < c->n_regions; i++) {
        if (c->regions[i].p != addr)
            continue;
        dp_detail_clear(d);
        rc = dp_endpoint_deregister(c->ep, addr, d);
        if (rc == 0)
            c->regions[i] = c->regions[--c->n_regions];
        break;
    }
    pthread_mutex_unlock(&c->mu);
    return rc;
}

/* ---- connecting ---- */

static int
client_new(const dp_client_opts *opts, uint32_t n_units, dp_client **out, dp_detail *d)
{
    dp_client *c = calloc(1, sizeof *c);
    if (c == NULL)
        return dp_fail(d, DP_ENOMEM, "client: out of memory");
    pthread_mutex_init(&c->mu, NULL);
    *out = c;
    int rc = opts_resolve(opts, &c->o, d);
    if (rc != DP_OK)
        return rc;
    if (n_units == 0 || n_units > DP_CLUSTER_MAX_UNITS)
        return dp_fail(d, DP_EINVAL, "client: %u units (1..%u)", n_units,
                       DP_CLUSTER_MAX_UNITS);
    c->n_units = n_units;
    c->units = calloc(n_units, sizeof *c->units);
    c->builders = calloc(n_units, sizeof *c->builders);
    c->reqs = calloc(n_units, sizeof *c->reqs);
    c->items = calloc(n_units, sizeof *c->items);
    c->rid = calloc(n_units, sizeof *c->rid);
    if (c->units == NULL || c->builders == NULL || c->reqs == NULL || c->items == NULL ||
        c->rid == NULL)
        return dp_fail(d, DP_ENOMEM, "client: out of memory");
    rc = dp_wire_rid_gen_init(&c->rids, d);
    if (rc != 0)
        return rc;
    uint8_t rnd[8];
    rc = dp_random_bytes(rnd, sizeof rnd, d);
    if (rc != 0)
        return rc;
    for (int i = 0; i < 8; i++)
        snprintf(c->blob_prefix + 2 * i, 3, "%02x", rnd[i]);
    if (c->o.name != NULL) {
        size_t nl = strlen(c->o.name);
        if (nl == 0 || nl > 200)
            return dp_fail(d, DP_EINVAL, "client: name must be 1..200 bytes");
        memcpy(c->name, c->o.name, nl + 1);
    } else {
        snprintf(c->name, sizeof c->name, "client-%ld-%.8s", (long)getpid(),
                 c->blob_prefix);
    }
    c->o.name = NULL; /* not kept: the caller's string */
    dp_endpoint_opts eo;
    dp_endpoint_opts_init(&eo);
    eo.require_rdma = c->o.require_rdma;
    rc = dp_endpoint_create(c->name, &eo, &c->ep, d);
    if (rc != 0)
        return dp_fail_ctx(d, rc, "client: transfer endpoint");
    return dp_ctl_client_create(&c->ctl, d);
}

/*
 * Bind unit u's data path to the process whose info this is: check that it
 * is unit u of this cluster and speaks this protocol, connect the transfer
 * endpoint to it (replacing the remote of an earlier incarnation), and take
 * its slab's place, sizes and incarnation.
 */
static int
bind_unit_locked(dp_client *c, uint32_t u, const dp_wire_info *in, dp_detail *d)
{
    dp__unit_conn *uc = &c->units[u];
    if (in->unit_id != u || in->n_units != c->n_units)
        return dp_fail(d, DP_EPROTO,
                       "says it is unit %" PRIu64 " of %" PRIu64
                       ", but the cluster lists it as unit %u of %u (wrong order or a "
                       "unit from another cluster)",
                       in->unit_id, in->n_units, u, c->n_units);
    if (in->proto < DP_WIRE_PROTO || in->incarnation == 0)
        return dp_fail(d, DP_EPROTO,
                       "speaks control protocol %" PRIu64
                       " and this client %d: run the same dataplane version on units and "
                       "clients",
                       in->proto, DP_WIRE_PROTO);
    if (in->metadata.n == 0)
        return dp_fail(d, DP_EPROTO, "has no transfer endpoint (no metadata in info)");
    if (in->slab_addr == 0)
        return dp_fail(d, DP_EPROTO, "info carries no slab address");
    char name[256];
    int rc = dp_endpoint_add_remote(c->ep, in->metadata.p, in->metadata.n, name, d);
    if (rc != 0)
        return rc;
    for (uint32_t v = 0; v < c->n_units; v++)
        if (v != u && strcmp(c->units[v].remote, name) == 0)
            return dp_fail(d, DP_EPROTO,
                           "has the same endpoint name '%s' as unit %u: names must be "
                           "unique",
                           name, v);
    if (uc->remote[0] != '\0' && strcmp(uc->remote, name) != 0)
        dp_endpoint_remove_remote(c->ep, uc->remote, NULL); /* the old process's */
    snprintf(uc->remote, sizeof uc->remote, "%s", name);
    uc->slab_addr = in->slab_addr;
    uc->slab_bytes = in->slab_bytes;
    uc->io_bytes = in->io_bytes;
    uc->region_bytes = uc->slab_bytes + uc->io_bytes;
    uc->read_pin_s = in->read_pin_ms > 0 ? (double)in->read_pin_ms / 1e3 : 10.0;
    aborts_again_locked(c, u, uc->incarnation == in->incarnation);
    uc->incarnation = in->incarnation;
    uc->stale = false;
    uc->ep_suspect = false;
    uc->lane = DP_XFER_LANE_UNKNOWN;
    uc->tls[0] = '\0';
    dp_endpoint_remote_lane(c->ep, uc->remote, &uc->lane, uc->tls, sizeof uc->tls, NULL);
    return DP_OK;
}

/*
 * info from units[0..n) at once (the items' slots 0..n-1), each reply
 * decoded into reps[i] (rcs[i] 0) or its failure in rcs[i] / dets[i].
 * reps[i] must be finished by the caller when rcs[i] is 0.
 */
static void
info_many_locked(dp_client *c, const uint32_t *units, size_t n, double timeout_s,
                 dp_wire_reply *reps, int *rcs, dp_detail *dets)
{
    dp_wire_request q;
    memset(&q, 0, sizeof q);
    q.op = DP_WIRE_OP_INFO;
    size_t ns = 0;
    size_t *slot = calloc(n > 0 ? n : 1, sizeof *slot);
    for (size_t i = 0; i < n; i++) {
        dp_detail_clear(&dets[i]);
        memset(&reps[i], 0, sizeof reps[i]);
        rcs[i] = slot == NULL ? dp_fail(&dets[i], DP_ENOMEM, "out of memory")
                              : dp__client_prepare_locked(c, units[i], ns, &q, &dets[i]);
        if (rcs[i] == 0)
            slot[i] = ns++;
    }
    dp_ctl_call_many(c->ctl, c->items, ns, timeout_s);
    for (size_t i = 0; i < n; i++) {
        if (rcs[i] != 0)
            continue;
        dp_ctl_item *it = &c->items[slot[i]];
        if (it->rc != 0) {
            rcs[i] = it->rc;
            dets[i] = it->det;
            continue;
        }
        rcs[i] = dp_wire_reply_decode(it->reply.data, it->reply.len, DP_WIRE_OP_INFO,
                                      NULL, &reps[i], &dets[i]);
        if (rcs[i] == 0 && !reps[i].ok)
            rcs[i] = dp_wire_error_to_detail(&reps[i].err, &dets[i]);
        if (rcs[i] != 0)
            dp_wire_reply_fini(&reps[i]);
    }
    free(slot);
}

/* info from every unit at once, then bind each unit's data path. */
static int
client_connect(dp_client *c, dp_detail *d)
{
    double deadline = dp_now_s() + c->o.connect_timeout_s;
    uint32_t N = c->n_units;
    uint32_t *units = calloc(N, sizeof *units);
    dp_wire_reply *reps = calloc(N, sizeof *reps);
    int *rcs = calloc(N, sizeof *rcs);
    dp_detail *dets = calloc(N, sizeof *dets);
    int first = DP_OK;
    if (units == NULL || reps == NULL || rcs == NULL || dets == NULL) {
        first = dp_fail(d, DP_ENOMEM, "client: out of memory");
        goto out;
    }
    for (uint32_t u = 0; u < N; u++)
        units[u] = u;
    info_many_locked(c, units, N, dp__client_left(deadline), reps, rcs, dets);
    for (uint32_t u = 0; u < N; u++) {
        int rc = rcs[u];
        if (rc == 0) {
            if (first == DP_OK)
                rc = bind_unit_locked(c, u, &reps[u].r.info, &dets[u]);
            dp_wire_reply_fini(&reps[u]);
        }
        if (rc != 0 && first == DP_OK) {
            if (d != NULL)
                *d = dets[u];
            first = dp_fail_ctx(d, rc, "connecting to unit %u (%s)", u, c->units[u].addr);
        }
    }
out:
    free(units);
    free(reps);
    free(rcs);
    free(dets);
    return first;
}

int
dp__client_reply_check_locked(dp_client *c, uint32_t u, const dp_wire_reply *rep,
                              bool report, dp_detail *d)
{
    dp__unit_conn *uc = &c->units[u];
    aborts_again_locked(c, u,
                        rep->incarnation == 0 || rep->incarnation == uc->incarnation);
    if (rep->incarnation == 0 || rep->incarnation == uc->incarnation)
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
    return dp_fail(d, DP_ERESTARTED,
                   "unit %u (%s) restarted (incarnation %016" PRIx64 " -> %016" PRIx64
                   "): what it held is gone unless it loaded a checkpoint; this client "
                   "re-binds to it and the next operation uses the new process",
                   u, uc->addr, uc->incarnation, rep->incarnation);
}

void
dp__client_ready_locked(dp_client *c, const uint32_t *units, size_t n, double deadline,
                        int *rcs, dp_detail *dets)
{
    uint32_t *need = calloc(n > 0 ? n : 1, sizeof *need);
    size_t *which = calloc(n > 0 ? n : 1, sizeof *which);
    dp_wire_reply *reps = calloc(n > 0 ? n : 1, sizeof *reps);
    int *irc = calloc(n > 0 ? n : 1, sizeof *irc);
    dp_detail *idet = calloc(n > 0 ? n : 1, sizeof *idet);
    bool oom =
        need == NULL || which == NULL || reps == NULL || irc == NULL || idet == NULL;
    size_t nn = 0;
    for (size_t i = 0; i < n; i++) {
        rcs[i] = 0;
        dp_detail_clear(&dets[i]);
        dp__unit_conn *uc = &c->units[units[i]];
        bool failed =
            !uc->stale &&
            (uc->ep_suspect || dp_endpoint_remote_check(c->ep, uc->remote, NULL) != 0);
        if (!uc->stale && !failed)
            continue;
        if (oom) {
            rcs[i] = dp_fail(&dets[i], DP_ENOMEM, "client: out of memory");
            continue;
        }
        need[nn] = units[i];
        which[nn++] = i;
    }
    if (nn > 0) {
        info_many_locked(c, need, nn, dp__client_round_timeout(deadline), reps, irc,
                         idet);
        for (size_t k = 0; k < nn; k++) {
            size_t i = which[k];
            uint32_t u = need[k];
            dp__unit_conn *uc = &c->units[u];
            int rc = irc[k];
            if (rc == 0) {
                uint64_t was = uc->incarnation;
                uint64_t now_inc = reps[k].r.info.incarnation;
                bool restarted = now_inc != was, stalled = uc->ep_suspect;
                if (restarted && (!uc->stale || uc->seen_incarnation != now_inc)) {
                    c->cnt.restarts_seen++;
                    uc->restart_unreported = true;
                }
                rc = bind_unit_locked(c, u, &reps[k].r.info, &idet[k]);
                dp_wire_reply_fini(&reps[k]);
                if (rc == 0) {
                    c->cnt.rebinds++;
                    DP_LOG_I("client: unit %u (%s) re-bound to incarnation %016" PRIx64
                             " (%s)",
                             u, uc->addr, now_inc,
                             restarted ? "it restarted"
                             : stalled ? "its transfers stalled"
                                       : "its transfer endpoint failed");
                    if (uc->restart_unreported) {
                        uc->restart_unreported = false;
                        rc = dp_fail(&idet[k], DP_ERESTARTED,
                                     "unit %u (%s) restarted (incarnation %016" PRIx64
                                     " -> %016" PRIx64
                                     "): what it held is gone unless it loaded a "
                                     "checkpoint; re-bound, the next operation uses it",
                                     u, uc->addr, was, now_inc);
                    }
                }
            } else if (rc == DP_ETRANSFER || rc == DP_ETIMEDOUT) {
                c->cnt.units_down++;
                dp_fail_ctx(&idet[k], rc, "unit %u (%s) is down", u, uc->addr);
            }
            if (rc != 0) {
                rcs[i] = rc;
                dets[i] = idet[k];
            }
        }
    }
    /* Units named twice get the same answer. */
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < i; j++)
            if (units[j] == units[i] && rcs[j] != 0 && rcs[i] == 0) {
                rcs[i] = rcs[j];
                dets[i] = dets[j];
            }
    free(need);
    free(which);
    free(reps);
    free(irc);
    free(idet);
}

int
dp_client_counters_get(dp_client *c, dp_client_counters *out)
{
    if (c == NULL || out == NULL)
        return DP_EINVAL;
    pthread_mutex_lock(&c->mu);
    *out = c->cnt;
    dp_endpoint_stats es;
    dp_endpoint_get_stats(c->ep, &es);
    out->transfers_retained = es.transfers_retained - es.transfers_released;
    out->transfers_released = es.transfers_released;
    out->retained_bytes = dp_graveyard_bytes();
    pthread_mutex_unlock(&c->mu);
    return DP_OK;
}

static int
open_common(const char *const *addrs, uint32_t n, const dp_client_opts *opts,
            dp_client **out, dp_detail *d)
{
    dp_client *c = NULL;
    int rc = client_new(opts, n, &c, d);
    for (uint32_t u = 0; rc == 0 && u < n; u++) {
        if (addrs[u] == NULL || strlen(addrs[u]) >= DP_CLUSTER_ADDR_MAX ||
            strncmp(addrs[u], "tcp://", 6) != 0)
            rc = dp_fail(d, DP_EINVAL, "unit %u: bad control address '%s'", u,
                         addrs[u] ? addrs[u] : "(null)");
        else
            snprintf(c->units[u].addr, sizeof c->units[u].addr, "%s", addrs[u]);
    }
    if (rc == 0) {
        pthread_mutex_lock(&c->mu);
        rc = client_connect(c, d);
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
        return dp_fail(d, DP_EINVAL, "dp_client_open_units: NULL argument");
    *out = NULL;
    return open_common(addrs, n_units, opts, out, d);
}

int
dp_client_open(const char *cluster, const dp_client_opts *opts, dp_client **out,
               dp_detail *d)
{
    if (out == NULL)
        return dp_fail(d, DP_EINVAL, "dp_client_open: NULL out");
    *out = NULL;
    char path[PATH_MAX];
    int rc = dp_cluster_locate(cluster, path, sizeof path, d);
    if (rc != 0)
        return rc;
    dp_cluster cl;
    memset(&cl, 0, sizeof cl);
    rc = dp_cluster_load(path, &cl, d);
    if (rc != 0)
        return rc;
    const char **addrs = calloc(cl.n_units, sizeof *addrs);
    if (addrs == NULL) {
        dp_cluster_fini(&cl);
        return dp_fail(d, DP_ENOMEM, "client: out of memory");
    }
    for (uint32_t u = 0; u < cl.n_units; u++)
        addrs[u] = cl.units[u].zmq;
    rc = open_common(addrs, cl.n_units, opts, out, d);
    if (rc != 0)
        dp_fail_ctx(d, rc, "cluster %s", path);
    free(addrs);
    dp_cluster_fini(&cl);
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
        for (size_t i = 0; i < c->n_regions; i++)
            dp_endpoint_deregister(c->ep, c->regions[i].p, NULL);
        c->n_regions = 0;
        ctl = c->ctl;
        c->ctl = NULL;
    }
    pthread_mutex_unlock(&c->mu);
    if (keep) {
        dp_ctl_client_destroy(ctl);
        return;
    }
    dp__client_free(c);
}

void
dp__client_free(dp_client *c)
{
    if (c->ep != NULL) {
        for (size_t i = 0; i < c->n_bufs; i++) {
            if (c->bufs[i].state == DP__BUF_RETIRED ||
                dp_endpoint_touches_unfinished(c->ep, c->bufs[i].p, c->bufs[i].len))
                continue; /* the endpoint keeps it (graveyard) */
            dp_endpoint_deregister(c->ep, c->bufs[i].p, NULL);
        }
        for (size_t i = 0; i < c->n_regions; i++)
            dp_endpoint_deregister(c->ep, c->regions[i].p, NULL);
        dp_endpoint_destroy(c->ep);
    }
    dp_ctl_client_destroy(c->ctl);
    for (uint32_t u = 0; u < c->n_units; u++) {
        if (c->builders != NULL)
            dp_blob_builder_destroy(c->builders[u]);
        if (c->reqs != NULL)
            dp_buf_fini(&c->reqs[u]);
        if (c->items != NULL)
            dp_buf_fini(&c->items[u].reply);
    }
    free(c->builders);
    free(c->reqs);
    free(c->items);
    free(c->rid);
    free(c->units);
    free(c->bufs);
    free(c->regions);
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

int
dp_client_clear(dp_client *c, const uint64_t *gidxs, size_t n, uint64_t *dropped,
                dp_detail *d)
{
    if (c == NULL || (gidxs == NULL && n > 0))
        return dp_fail(d, DP_EINVAL, "dp_client_clear: NULL argument");
    if (dropped != NULL)
        *dropped = 0;
    if (n == 0)
        return DP_OK;
    if (n > UINT32_MAX)
        return dp_fail(d, DP_ETOOBIG, "clear: %zu rows in one call", n);
    pthread_mutex_lock(&c->mu);
    double deadline = dp_now_s() + c->o.timeout_s;
    int rc = DP_OK;
    uint32_t N = c->n_units;
    /* Group the rows by unit: counting sort into one array. */
    uint64_t *sorted = malloc(n * sizeof *sorted);
    uint32_t *cnt = calloc(N + 1, sizeof *cnt);
    uint32_t *slot_unit = malloc(N * sizeof *slot_unit);
    if (sorted == NULL || cnt == NULL || slot_unit == NULL) {
        rc = dp_fail(d, DP_ENOMEM, "clear: out of memory");
        goto out;
    }
    for (size_t i = 0; i < n; i++)
        cnt[gidxs[i] % N + 1]++;
    for (uint32_t u = 0; u < N; u++)
        cnt[u + 1] += cnt[u];
    {
        uint32_t *pos = calloc(N, sizeof *pos);
        if (pos == NULL) {
            rc = dp_fail(d, DP_ENOMEM, "clear: out of memory");
            goto out;
        }
        for (size_t i = 0; i < n; i++) {
            uint32_t u = (uint32_t)(gidxs[i] % N);
            sorted[cnt[u] + pos[u]++] = gidxs[i];
        }
        free(pos);
    }
    size_t ns = 0;
    dp_wire_request q;
    for (uint32_t u = 0; u < N; u++) {
        if (cnt[u + 1] == cnt[u])
            continue;
        memset(&q, 0, sizeof q);
        q.op = DP_WIRE_OP_RELEASE_ROWS;
        q.a.release_rows.gidxs = (dp_wire_u64s){sorted + cnt[u], cnt[u + 1] - cnt[u]};
        rc = dp__client_prepare_locked(c, u, ns, &q, d);
        if (rc != 0)
            goto out;
        slot_unit[ns++] = u;
    }
    dp_ctl_call_many(c->ctl, c->items, ns, dp__client_left(deadline));
    size_t n_failed_rows = 0;
    for (size_t s = 0; s < ns; s++) {
        uint32_t u = slot_unit[s];
        dp_ctl_item *it = &c->items[s];
        dp_detail ud = it->det;
        int urc = it->rc;
        if (urc == 0) {
            dp_wire_reply rep;
            urc = dp_wire_reply_decode(it->reply.data, it->reply.len,
                                       DP_WIRE_OP_RELEASE_ROWS, NULL, &rep, &ud);
            /* A restarted unit clears as well as the old one: note it, go on. */
            if (urc == 0)
                dp__client_reply_check_locked(c, u, &rep, false, NULL);
            if (urc == 0 && !rep.ok)
                urc = dp_wire_error_to_detail(&rep.err, &ud);
            if (urc == 0 && dropped != NULL)
                *dropped += rep.r.dropped;
            dp_wire_reply_fini(&rep);
        }
        if (urc == 0)
            continue;
        if (rc == 0) {
            rc = urc;
            dp_fail(d, urc, "clear: rows of unit %u (%s) not cleared: %s", u,
                    c->units[u].addr, dp_detail_msg(&ud));
        } else {
            dp__detail_append(d, "; unit %u (%s) also failed: %s", u, c->units[u].addr,
                              dp_errname(urc));
        }
        n_failed_rows += cnt[u + 1] - cnt[u];
    }
    if (rc != 0)
        dp__detail_append(d, " (%zu of %zu rows not cleared)", n_failed_rows, n);
out:
    free(sorted);
    free(cnt);
    free(slot_unit);
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
        return dp_fail(d, DP_ENOMEM, "stats: out of memory");
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
        char *name = dp_wire_str_dup(x->name);
        if (name == NULL)
            return dp_fail(d, DP_ENOMEM, "stats: out of memory");
        us->kv[us->n++] = (stat_kv){name, v};
    }
    return DP_OK;
}

int
dp_client_stats_get(dp_client *c, dp_client_stats **out, dp_detail *d)
{
    if (c == NULL || out == NULL)
        return dp_fail(d, DP_EINVAL, "dp_client_stats_get: NULL argument");
    *out = NULL;
    dp_client_stats *s = calloc(1, sizeof *s);
    if (s == NULL)
        return dp_fail(d, DP_ENOMEM, "stats: out of memory");
    s->n_units = c->n_units;
    s->u = calloc(c->n_units, sizeof *s->u);
    if (s->u == NULL) {
        free(s);
        return dp_fail(d, DP_ENOMEM, "stats: out of memory");
    }
    pthread_mutex_lock(&c->mu);
    double deadline = dp_now_s() + c->o.timeout_s;
    dp_wire_request q;
    memset(&q, 0, sizeof q);
    q.op = DP_WIRE_OP_STATS;
    int rc = DP_OK;
    for (uint32_t u = 0; u < c->n_units && rc == 0; u++)
        rc = dp__client_prepare_locked(c, u, u, &q, d);
    if (rc != 0) {
        pthread_mutex_unlock(&c->mu);
        dp_client_stats_destroy(s);
        return rc;
    }
    dp_ctl_call_many(c->ctl, c->items, c->n_units, dp__client_left(deadline));
    for (uint32_t u = 0; u < c->n_units; u++) {
        dp_ctl_item *it = &c->items[u];
        dp_detail ud = it->det;
        int urc = it->rc;
        if (urc == 0) {
            dp_wire_reply rep;
            urc = dp_wire_reply_decode(it->reply.data, it->reply.len, DP_WIRE_OP_STATS,
                                       NULL, &rep, &ud);
            if (urc == 0)
                dp__client_reply_check_locked(c, u, &rep, false, NULL);
            if (urc == 0 && !rep.ok)
                urc = dp_wire_error_to_detail(&rep.err, &ud);
            if (urc == 0)
                urc = stats_fill(&s->u[u], &rep.r.stats, &ud);
            dp_wire_reply_fini(&rep);
        }
        s->u[u].status = urc;
        if (urc != 0 && rc == 0)
            rc = dp_fail(d, urc, "stats: unit %u (%s): %s", u, c->units[u].addr,
                         dp_detail_msg(&ud));
    }
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
