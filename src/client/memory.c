/*
 * The client's registered memory (docs/design.md, "Client put"; client.c's
 * opening comment): buffers it maps itself (staging, user, values), cached
 * up to staging_cache_bytes and retired whole while an unfinished transfer
 * may touch them; the caller's registered regions; and the set of ranges
 * transfers use in place.
 */
#include "client/client_int.h"

#include <stdlib.h>
#include <string.h>

/* The smallest buffer the client maps; bigger ones are powers of two (round_buf). */
#define MIN_BUF (1u << 20)

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
direct_add_locked(dp_client *c, const dp__client_buf *b)
{
    if (!buf_direct(b->state))
        return;
    int rc = dp__ranges_add(&c->direct, (uintptr_t)b->p, b->len, NULL);
    DP_ASSERT(rc == DP_OK); /* the endpoint's regions never overlap */
}

static void
direct_remove_locked(dp_client *c, const void *p)
{
    dp__ranges_ent *e = dp__ranges_at(&c->direct, (uintptr_t)p);
    if (e != NULL)
        dp__ranges_remove(&c->direct, e);
}

static dp__client_buf *
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
        dp__client_buf b = c->bufs[best];
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
dp__client_buf_get_locked(dp_client *c, size_t nbytes, int state, dp__client_buf **out,
                          dp_detail *d)
{
    if (nbytes == 0)
        nbytes = 1;
    if (buf_direct(state) && dp__ranges_reserve(&c->direct, 1) != DP_OK)
        return dp__fail(d, DP_ENOMEM, "client: out of memory (buffer table)");
    size_t best = SIZE_MAX;
    for (size_t i = 0; i < c->n_bufs; i++) {
        dp__client_buf *b = &c->bufs[i];
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
        dp__client_buf *nb = realloc(c->bufs, nc * sizeof *nb);
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
    dp__client_buf *b = &c->bufs[c->n_bufs++];
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
    dp__client_buf *b = buf_find_locked(c, p);
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
    dp__client_buf *b = NULL;
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
    dp__client_buf *b = buf_find_locked(c, p);
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

void
dp__client_regions_drop_locked(dp_client *c)
{
    for (size_t i = 0; i < c->n_regions; i++) {
        dp__endpoint_deregister(c->ep, c->regions[i].p, NULL);
        direct_remove_locked(c, c->regions[i].p);
    }
    c->n_regions = 0;
}
