/*
 * What a get hands back (get.c runs the get's rounds; get_int.h holds what
 * the two share): the values' descriptions, from a resolve's answer or from
 * a location hint; the alloc form (dp_client_get_alloc, _locs), whose values
 * lie in registered buffers their dp_values owns; and dp_values_count, _get
 * and _destroy.
 */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "client/get_int.h"

dp_kind
dp__kind_of(dp__wire_str kind)
{
    dp__blob_kind k = DP_BLOB_BYTES;
    if (dp__blob_kind_parse(kind.p, kind.n, &k) != 0)
        k = DP_BLOB_BYTES;
    return (dp_kind)k;
}

void
dp__fill_desc(dp_value_desc *o, const dp__wire_key_loc *l)
{
    dp__wire_desc w = {l->kind, l->dtype, l->shape, l->ndim};
    dp__fill_desc_wire(o, &w, dp__kind_of(l->kind), l->len);
}

void
dp__fill_desc_wire(dp_value_desc *o, const dp__wire_desc *w, dp_kind kind, uint64_t len)
{
    o->kind = kind;
    dp__wire_str_copy(w->dtype, o->dtype, sizeof o->dtype);
    o->ndim = DP_MIN(w->ndim, (uint32_t)DP_SHAPE_MAX);
    if (o->ndim > 0)
        memcpy(o->shape, w->shape, o->ndim * sizeof *o->shape);
    o->nbytes = len;
}

void
dp__fill_desc_loc(dp_value_desc *o, const dp_loc *l)
{
    memset(o, 0, sizeof *o);
    o->kind = (dp_kind)l->kind;
    memcpy(o->dtype, l->dtype, strnlen(l->dtype, sizeof l->dtype));
    o->ndim = l->ndim;
    for (uint32_t i = 0; i < l->ndim; i++)
        o->shape[i] = l->shape[i];
    o->nbytes = l->nbytes;
}

int
dp_client_get_alloc(dp_client *c, const char *const *keys, size_t n, dp_values **out,
                    dp_detail *d)
{
    return dp_client_get_alloc_locs(c, keys, NULL, n, out, d);
}

int
dp_client_get_alloc_locs(dp_client *c, const char *const *keys, const dp_loc *locs,
                         size_t n, dp_values **out, dp_detail *d)
{
    if (c == NULL || out == NULL || (keys == NULL && n > 0))
        return dp__fail(d, DP_EINVAL, "dp_client_get_alloc: NULL argument");
    *out = NULL;
    int rc = dp__client_data_check(c, "get", d);
    if (rc != DP_OK)
        return rc;
    if (n > (1u << 24))
        return dp__fail(d, DP_ETOOBIG, "get: %zu keys in one call", n);
    dp_values *v = calloc(1, sizeof *v);
    if (v == NULL)
        return dp__fail(d, DP_ENOMEM, "get: out of memory");
    v->n = n;
    v->items = calloc(n > 0 ? n : 1, sizeof *v->items);
    v->descs = calloc(n > 0 ? n : 1, sizeof *v->descs);
    if (v->items == NULL || v->descs == NULL) {
        dp_values_destroy(v);
        return dp__fail(d, DP_ENOMEM, "get: out of memory");
    }
    for (size_t i = 0; i < n; i++) {
        v->items[i].key = keys[i];
        v->items[i].desc = &v->descs[i];
        v->items[i].loc = locs != NULL ? &locs[i] : NULL;
    }
    pthread_mutex_lock(&c->mu);
    v->c = c;
    c->n_values++; /* v keeps c alive until dp_values_destroy */
    if (n > 0)
        rc = dp__get_locked(c, v->items, n, v, d);
    pthread_mutex_unlock(&c->mu);
    if (rc == DP_EINVAL || rc == DP_ENOMEM) {
        bool any = false;
        for (size_t i = 0; i < n && !any; i++)
            any = v->items[i].status == 0;
        if (!any) {
            dp_values_destroy(v);
            return rc;
        }
    }
    for (size_t i = 0; i < n; i++) {
        v->items[i].key = NULL; /* the caller's strings are not kept */
        v->items[i].loc = NULL;
    }
    *out = v;
    return rc;
}

size_t
dp_values_count(const dp_values *v)
{
    return v != NULL ? v->n : 0;
}

int
dp_values_get(const dp_values *v, size_t i, const void **data, uint64_t *nbytes,
              const dp_value_desc **desc)
{
    if (v == NULL || i >= v->n)
        return DP_EINVAL;
    const dp_get_item *it = &v->items[i];
    if (it->status != 0)
        return it->status;
    if (data != NULL)
        *data = it->dst;
    if (nbytes != NULL)
        *nbytes = it->nbytes;
    if (desc != NULL)
        *desc = &v->descs[i];
    return DP_OK;
}

void
dp_values_destroy(dp_values *v)
{
    if (v == NULL)
        return;
    dp_client *c = v->c;
    bool last = false;
    if (c != NULL) {
        pthread_mutex_lock(&c->mu);
        for (size_t i = 0; i < v->n_bufs; i++)
            dp__client_buf_put_locked(c, v->bufs[i]);
        c->n_values--;
        last = c->closed && c->n_values == 0;
        pthread_mutex_unlock(&c->mu);
    }
    free(v->bufs);
    free(v->items);
    free(v->descs);
    free(v);
    if (last)
        dp__client_free(c); /* closed, and these were its last values */
}
