/*
 * Direct transport, the publishing side (the API: include/dataplane/direct.h):
 * registering memory for good, publishing buffers under an object id (their
 * metadata for the fetching side), and freeing them. The registrations and
 * the pool behind it are regcache.c; the transport itself is direct.c, the
 * fetching side fetch.c, sharing direct_int.h.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "direct/direct_int.h"

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
