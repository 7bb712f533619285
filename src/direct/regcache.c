/*
 * The direct transport's registration cache: which memory is registered with
 * the endpoint (or copied into the pool) for published objects and for fetch
 * targets, with a reference count per registration.
 *
 * Design notes
 * ------------
 * - regs maps a base address to a reg_entry: a registration of [base, base+len)
 *   with a reference count (one per object or running fetch holding it), or a
 *   pool block holding a copy of the buffer that starts at base. A buffer
 *   inside a registration (same base or contained) shares it; a buffer that
 *   partly overlaps one is refused (the endpoint's regions never overlap).
 *   The registrations are also a set of ranges (reg_ranges), so finding the
 *   one that holds a buffer is a binary search.
 * - A registration whose count reaches zero is deregistered and the metadata
 *   version bumps, unless it is permanent (register_permanent) or the endpoint
 *   refuses because a retained transfer touches it: then it stays registered
 *   for good (stuck) and its memory must never be reused.
 * - Publish (publish.c) takes one reference per buffer and undoes, in reverse,
 *   exactly the references it took when anything fails, so blocks and
 *   registrations of other objects are never touched by a failed publish
 *   (pool rollback).
 * - Everything here runs with cache_mu held, except dp__direct_reg_fail.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "direct/direct_int.h"

int
dp__direct_reg_fail(dp_detail *d, int rc, const char *what, const void *addr, size_t len)
{
    if (rc == DP_EEXIST)
        return dp__fail_ctx(
            d, rc,
            "direct: registering %s of %zu bytes at %p: it overlaps memory "
            "this transport registered itself (its pool, or the buffers of "
            "a fetch request still alive)",
            what, len, addr);
    /*
     * DP_EINVAL: the endpoint refused the range before UCX saw it (it wraps
     * past the address space, or is not this process's to register): the
     * memlock advice below would send the reader the wrong way.
     */
    if (rc == DP_EINVAL)
        return dp__fail_ctx(d, rc,
                            "direct: registering %s of %zu bytes at %p: refused before "
                            "UCX saw it: the range is not one this process can register",
                            what, len, addr);
    char ml[32], at[40] = "";
    dp__fmt_memlock(ml, sizeof ml);
    if (addr != NULL)
        snprintf(at, sizeof at, " at %p", addr);
    return dp__fail_ctx(d, rc,
                        "direct (backend " BACKEND
                        "): %s %s of %zu bytes%s failed (check "
                        "the memlock limit, ulimit -l = %s; UCX_TLS = %s; rerun with "
                        "UCX_LOG_LEVEL=debug)",
                        addr != NULL ? "registering" : "allocating and registering", what,
                        len, at, ml, env_or("UCX_TLS", "unset"));
}

/* ---- registration cache (cache_mu held) ---- */

int
dp__direct_find_reg_locked(dp_direct *t, uint64_t addr, uint64_t len, reg_entry **out,
                           dp_detail *d)
{
    *out = NULL;
    reg_entry *e = dp__map_get_u64(&t->regs, addr);
    if (e != NULL && !e->pool) {
        if (len <= e->len) {
            *out = e;
            return DP_OK;
        }
        return dp__fail(d, DP_EEXIST,
                        "direct: buffer %#" PRIx64 " of %" PRIu64 " bytes starts a "
                        "registration of only %" PRIu64 " bytes",
                        addr, len, e->len);
    }
    dp__ranges_ent *x = dp__ranges_find(&t->reg_ranges, addr, len);
    if (x != NULL) {
        *out = x->v;
        return DP_OK;
    }
    x = dp__ranges_overlap(&t->reg_ranges, addr, len);
    if (x != NULL)
        return dp__fail(d, DP_EEXIST,
                        "direct: buffer %#" PRIx64 " of %" PRIu64 " bytes partly "
                        "overlaps the registration %#" PRIx64 " of %" PRIu64 " bytes",
                        addr, len, x->base, x->len);
    return DP_OK;
}

int
dp__direct_reg_acquire_locked(dp_direct *t, void *addr, size_t len, const char *what,
                              uint64_t *key, dp_detail *d)
{
    uint64_t a = (uint64_t)(uintptr_t)addr;
    reg_entry *e = dp__map_get_u64(&t->regs, a);
    if (e != NULL && e->pool)
        return dp__fail(d, DP_EEXIST,
                        "direct: %s %p is held in a pool block by a published object; "
                        "free that object first",
                        what, addr);
    int rc = dp__direct_find_reg_locked(t, a, len, &e, d);
    if (rc != DP_OK)
        return rc;
    if (e == NULL) {
        e = calloc(1, sizeof *e);
        if (e == NULL || dp__ranges_reserve(&t->reg_ranges, 1) != DP_OK) {
            free(e);
            return dp__fail(d, DP_ENOMEM, "direct: registration cache entry");
        }
        rc = dp__endpoint_register(t->ep, addr, len, d);
        if (rc != DP_OK) {
            free(e);
            return dp__direct_reg_fail(d, rc, what, addr, len);
        }
        e->base = a;
        e->len = len;
        if (dp__map_put_u64(&t->regs, a, e, NULL) != DP_OK) {
            dp__endpoint_deregister(t->ep, addr, NULL);
            free(e);
            return dp__fail(d, DP_ENOMEM, "direct: registration cache");
        }
        /* Room was reserved, and nothing registered overlaps (checked above). */
        rc = dp__ranges_add(&t->reg_ranges, e->base, e->len, e);
        DP_ASSERT(rc == DP_OK);
        t->registers++;
    }
    e->refs++;
    *key = e->base;
    return DP_OK;
}

void
dp__direct_reg_release_locked(dp_direct *t, uint64_t key)
{
    reg_entry *e = dp__map_get_u64(&t->regs, key);
    DP_ASSERT(e != NULL && e->refs > 0);
    if (--e->refs > 0 || e->permanent || e->stuck)
        return;
    if (e->pool) {
        int frc = dp__slab_alloc_free(t->pool, e->pool_off, NULL);
        DP_ASSERT(frc == DP_OK);
        t->pool_used -= e->len;
        t->pool_blocks--;
    } else {
        dp_detail d;
        dp_detail_clear(&d);
        int rc = dp__endpoint_deregister(t->ep, (void *)(uintptr_t)e->base, &d);
        if (rc != DP_OK) {
            /* A retained transfer touches it: registered for good. */
            DP_LOG_W("direct %s: keeping %#" PRIx64 " registered: %s", t->name, e->base,
                     d.msg);
            e->stuck = true;
            return;
        }
        t->deregisters++;
        t->version++;
        dp__ranges_remove(&t->reg_ranges, dp__ranges_at(&t->reg_ranges, e->base));
    }
    dp__map_del_u64(&t->regs, key);
    free(e);
}

int
dp__direct_pool_acquire_locked(dp_direct *t, const dp_direct_buf *b, uint64_t *key,
                               uint64_t *raddr, dp_detail *d)
{
    uint64_t a = (uint64_t)(uintptr_t)b->addr;
    reg_entry *e = dp__map_get_u64(&t->regs, a);
    if (e != NULL && e->pool && b->len <= e->len) {
        e->refs++;
        *key = a;
        *raddr = (uint64_t)(uintptr_t)t->pool_base + e->pool_off;
        return DP_OK;
    }
    if (e != NULL)
        return dp__fail(d, DP_EEXIST,
                        "direct: buffer %p of %zu bytes is pooled with %" PRIu64
                        " bytes by another object",
                        b->addr, b->len, e->len);
    uint64_t off;
    dp_detail ad;
    dp_detail_clear(&ad);
    int rc = dp__slab_alloc_alloc(t->pool, b->len, &off, &ad);
    if (rc != DP_OK) {
        char sz[32], psz[32], used[32];
        dp__fmt_size(b->len, sz, sizeof sz);
        dp__fmt_size(t->pool_bytes, psz, sizeof psz);
        dp__fmt_size(t->pool_used, used, sizeof used);
        int code = rc == DP_EUNITFULL ? DP_EBUSY : rc;
        return dp__fail(d, code,
                        "memory pool cannot take a buffer of %s (pool %s, %s "
                        "held): %s; free objects, grow pool_bytes or publish without a "
                        "pool",
                        sz, psz, used, ad.msg);
    }
    e = calloc(1, sizeof *e);
    if (e == NULL || dp__map_put_u64(&t->regs, a, e, NULL) != DP_OK) {
        free(e);
        dp__slab_alloc_free(t->pool, off, NULL);
        return dp__fail(d, DP_ENOMEM, "direct: registration cache");
    }
    e->base = a;
    e->len = b->len;
    e->pool = true;
    e->pool_off = off;
    e->refs = 1;
    memcpy((uint8_t *)t->pool_base + off, b->addr, b->len);
    t->pool_used += b->len;
    t->pool_blocks++;
    *key = a;
    *raddr = (uint64_t)(uintptr_t)t->pool_base + off;
    return DP_OK;
}
