/*
 * Encoding and defensive parsing of the direct transport's metadata (the
 * layout is in direct_md.h). Everything here is pure: no I/O, no UCX.
 */
#include "direct_md.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "wire/mp.h"

int
dp__direct_check_id(const char *id, size_t len, dp_detail *d)
{
    if (id == NULL || len == 0 || len > DP_DIRECT_ID_MAX)
        return dp__fail(d, DP_EINVAL, "object id must be 1..%d bytes (got %zu)",
                        DP_DIRECT_ID_MAX, id == NULL ? 0 : len);
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)id[i];
        if (c < 0x20 || c > 0x7e)
            return dp__fail(d, DP_EINVAL,
                            "object id byte %zu is 0x%02x: only printable ASCII allowed",
                            i, c);
    }
    return DP_OK;
}

int
dp__direct_md_encode(dp__buf *out, const dp_direct_md_fields *f, dp_detail *d)
{
    int rc = dp__direct_check_id(f->obj_id, f->obj_id ? strlen(f->obj_id) : 0, d);
    if (rc != DP_OK)
        return rc;
    if (f->backend == NULL || strlen(f->backend) == 0 ||
        strlen(f->backend) > DP_DIRECT_BACKEND_MAX)
        return dp__fail(d, DP_EINVAL, "direct metadata: bad backend name");
    if (f->name == NULL || (rc = dp__md_check_name(f->name, strlen(f->name), d)) != DP_OK)
        return rc != DP_OK ? rc : dp__fail(d, DP_EINVAL, "direct metadata: no name");
    if (f->ep_md_len == 0 || f->ep_md_len > DP_MD_TOTAL_MAX ||
        f->n_descs > DP_DIRECT_BUFS_MAX)
        return dp__fail(d, DP_EINVAL,
                        "direct metadata: endpoint metadata of %zu bytes or %zu "
                        "buffers out of limits",
                        f->ep_md_len, f->n_descs);
    dp__mp_writer w;
    dp__mp_writer_init(&w, out);
    dp__mp_put_array(&w, 8);
    dp__mp_put_str(&w, DP_DIRECT_MD_MAGIC);
    dp__mp_put_u64(&w, DP_DIRECT_MD_VERSION);
    dp__mp_put_str(&w, f->obj_id);
    dp__mp_put_str(&w, f->backend);
    dp__mp_put_str(&w, f->name);
    dp__mp_put_u64(&w, f->version);
    dp__mp_put_bin(&w, f->ep_md, f->ep_md_len);
    dp__mp_put_array(&w, (uint32_t)f->n_descs);
    for (size_t i = 0; i < f->n_descs; i++) {
        dp__mp_put_array(&w, 2);
        dp__mp_put_u64(&w, f->descs[i].addr);
        dp__mp_put_u64(&w, f->descs[i].len);
    }
    if (dp__mp_writer_status(&w) != DP_OK)
        return dp__fail(d, DP_ENOMEM,
                        "direct metadata: out of memory encoding %zu buffers",
                        f->n_descs);
    return DP_OK;
}

/* Read a string into dst[0..cap] (NUL-terminated), 1..cap bytes. */
static int
read_str_copy(dp__mp_reader *r, char *dst, size_t cap, const char *what, dp_detail *d)
{
    const char *s;
    uint32_t n;
    size_t off = dp__mp_offset(r);
    int rc = dp__mp_read_str(r, &s, &n, what, d);
    if (rc != DP_OK)
        return rc;
    if (n == 0 || n > cap)
        return dp__fail(d, DP_EPROTO,
                        "direct metadata: %s of %" PRIu32
                        " bytes at offset %zu (allowed 1..%zu)",
                        what, n, off, cap);
    memcpy(dst, s, n);
    dst[n] = '\0';
    return DP_OK;
}

int
dp__direct_md_parse(const void *buf, size_t len, dp__direct_md *out, dp_detail *d)
{
    memset(out, 0, sizeof *out);
    dp__mp_reader r;
    dp__mp_reader_init(&r, buf, len);
    uint32_t n, k;
    uint64_t ver;
    const char *magic;
    int rc;
    if ((rc = dp__mp_read_array(&r, &n, "direct metadata", d)) != DP_OK)
        return rc;
    if (n != 8)
        return dp__fail(d, DP_EPROTO, "direct metadata: array of %" PRIu32 ", want 8", n);
    if ((rc = dp__mp_read_str(&r, &magic, &k, "magic", d)) != DP_OK)
        return rc;
    if (k != strlen(DP_DIRECT_MD_MAGIC) || memcmp(magic, DP_DIRECT_MD_MAGIC, k) != 0)
        return dp__fail(d, DP_EPROTO, "direct metadata: bad magic (not from dp_direct)");
    if ((rc = dp__mp_read_u64(&r, &ver, "version", d)) != DP_OK)
        return rc;
    if (ver != DP_DIRECT_MD_VERSION)
        return dp__fail(d, DP_EPROTO,
                        "direct metadata: version %" PRIu64 ", this build reads %d", ver,
                        DP_DIRECT_MD_VERSION);
    if ((rc = read_str_copy(&r, out->obj_id, DP_DIRECT_ID_MAX, "obj_id", d)) != DP_OK ||
        (rc = read_str_copy(&r, out->backend, DP_DIRECT_BACKEND_MAX, "backend", d)) !=
            DP_OK ||
        (rc = read_str_copy(&r, out->name, DP_MD_NAME_MAX, "name", d)) != DP_OK)
        return rc;
    if (dp__direct_check_id(out->obj_id, strlen(out->obj_id), NULL) != DP_OK)
        return dp__fail(d, DP_EPROTO,
                        "direct metadata: object id is not printable ASCII");
    if (strcmp(out->backend, "UCX") != 0)
        return dp__fail(d, DP_EPROTO,
                        "direct metadata: publisher used backend %s, this process "
                        "has UCX",
                        out->backend);
    if (dp__md_check_name(out->name, strlen(out->name), NULL) != DP_OK)
        return dp__fail(d, DP_EPROTO, "direct metadata: bad endpoint name");
    if ((rc = dp__mp_read_u64(&r, &out->version, "metadata version", d)) != DP_OK)
        return rc;
    const uint8_t *em;
    if ((rc = dp__mp_read_bin(&r, &em, &k, "endpoint metadata", d)) != DP_OK)
        return rc;
    dp__md md;
    if ((rc = dp__md_parse(em, k, &md, d)) != DP_OK) {
        dp__fail_ctx(d, rc, "direct metadata: endpoint metadata");
        return rc;
    }
    bool same = strcmp(md.name, out->name) == 0;
    out->ep_gen = md.gen;
    dp__md_fini(&md);
    if (!same)
        return dp__fail(
            d, DP_EPROTO,
            "direct metadata: endpoint metadata names another endpoint than %s",
            out->name);
    out->ep_md = em;
    out->ep_md_len = k;
    if ((rc = dp__mp_read_array(&r, &n, "descs", d)) != DP_OK)
        return rc;
    if (n > DP_DIRECT_BUFS_MAX)
        return dp__fail(d, DP_EPROTO, "direct metadata: %" PRIu32 " buffers (max %u)", n,
                        DP_DIRECT_BUFS_MAX);
    if (n > 0) {
        out->descs = calloc(n, sizeof *out->descs);
        if (out->descs == NULL)
            return dp__fail(d, DP_ENOMEM, "direct metadata: %" PRIu32 " descriptors", n);
    }
    for (uint32_t i = 0; i < n; i++) {
        uint32_t two;
        dp__direct_desc *x = &out->descs[i];
        if ((rc = dp__mp_read_array(&r, &two, "desc", d)) != DP_OK)
            goto fail;
        if (two != 2) {
            rc = dp__fail(d, DP_EPROTO,
                          "direct metadata: desc %" PRIu32 " has %" PRIu32
                          " items, want 2",
                          i, two);
            goto fail;
        }
        if ((rc = dp__mp_read_u64(&r, &x->addr, "desc addr", d)) != DP_OK ||
            (rc = dp__mp_read_u64(&r, &x->len, "desc len", d)) != DP_OK)
            goto fail;
        if (x->len == 0 || x->addr == 0 || x->addr + x->len < x->addr) {
            rc = dp__fail(d, DP_EPROTO,
                          "direct metadata: desc %" PRIu32 " [0x%" PRIx64 ", +%" PRIu64
                          ") is empty, null or wraps",
                          i, x->addr, x->len);
            goto fail;
        }
        if (out->total_bytes + x->len < out->total_bytes) {
            rc = dp__fail(d, DP_EPROTO, "direct metadata: total size overflows");
            goto fail;
        }
        out->total_bytes += x->len;
    }
    out->n_descs = n;
    if (dp__mp_remaining(&r) != 0) {
        rc = dp__fail(d, DP_EPROTO, "direct metadata: %zu trailing bytes",
                      dp__mp_remaining(&r));
        goto fail;
    }
    return DP_OK;
fail:
    free(out->descs);
    memset(out, 0, sizeof *out);
    return rc;
}

void
dp__direct_md_fini(dp__direct_md *m)
{
    if (m == NULL)
        return;
    free(m->descs);
    m->descs = NULL;
    m->n_descs = 0;
}
