/*
 * Encode and parse endpoint metadata (layout in metadata.h). The parser is the
 * only code that reads bytes another process produced before UCX sees them, so
 * every length is checked against the bytes left and against a fixed limit
 * before it is used, and the region table must be sorted and non-overlapping
 * (the endpoint looks regions up by binary search).
 */
#include "metadata.h"

#include <stdlib.h>
#include <string.h>

#include "common/le.h"

int
dp__md_check_name(const char *name, size_t len, dp_detail *d)
{
    if (name == NULL || len == 0)
        return dp__fail(d, DP_EINVAL, "endpoint name is empty");
    if (len > DP_MD_NAME_MAX)
        return dp__fail(d, DP_EINVAL, "endpoint name has %zu bytes, limit %d", len,
                        DP_MD_NAME_MAX);
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)name[i];
        if (c < 0x21 || c > 0x7e)
            return dp__fail(d, DP_EINVAL,
                            "endpoint name has byte 0x%02x at %zu: printable ASCII only, "
                            "no spaces",
                            c, i);
    }
    return DP_OK;
}

int
dp__md_encode(dp__buf *out, const dp__md_fields *f, dp_detail *d)
{
    uint32_t flags = f->proc != NULL ? f->flags | DP_MD_F_PROC : f->flags & ~DP_MD_F_PROC;
    size_t name_len = f->name ? strlen(f->name) : 0;
    int rc = dp__md_check_name(f->name, name_len, d);
    if (rc != DP_OK)
        return rc;
    if (f->addr_len == 0 || f->addr_len > DP_MD_ADDR_MAX)
        return dp__fail(d, DP_EINVAL, "worker address has %zu bytes, limit %u",
                        f->addr_len, DP_MD_ADDR_MAX);
    if (f->n_regions > DP_MD_REGIONS_MAX)
        return dp__fail(d, DP_EINVAL, "%zu regions, limit %u", f->n_regions,
                        DP_MD_REGIONS_MAX);
    size_t total = DP_MD_HEADER_LEN + name_len + f->addr_len;
    for (size_t i = 0; i < f->n_regions; i++) {
        if (f->regions[i].rkey_len == 0 || f->regions[i].rkey_len > DP_MD_RKEY_MAX)
            return dp__fail(d, DP_EINVAL, "region %zu: rkey has %u bytes, limit %u", i,
                            f->regions[i].rkey_len, DP_MD_RKEY_MAX);
        total += 20 + f->regions[i].rkey_len;
    }
    if (f->proc != NULL)
        total += DP_MD_PROC_LEN;
    if (total > DP_MD_TOTAL_MAX)
        return dp__fail(d, DP_EINVAL, "metadata would take %zu bytes, limit %u", total,
                        DP_MD_TOTAL_MAX);
    if (dp__buf_reserve(out, total) != DP_OK)
        return dp__fail(d, DP_ENOMEM, "metadata: cannot allocate %zu bytes", total);
    uint8_t h[DP_MD_HEADER_LEN];
    memcpy(h, DP_MD_MAGIC, 4);
    dp__le16_store(h + 4, DP_MD_VERSION);
    dp__le16_store(h + 6, (uint16_t)name_len);
    dp__le32_store(h + 8, (uint32_t)f->addr_len);
    dp__le32_store(h + 12, (uint32_t)f->n_regions);
    dp__le64_store(h + 16, f->gen);
    dp__le32_store(h + 24, f->xver);
    dp__le32_store(h + 28, flags);
    dp__buf_append(out, h, sizeof h);
    dp__buf_append(out, f->name, name_len);
    dp__buf_append(out, f->addr, f->addr_len);
    for (size_t i = 0; i < f->n_regions; i++) {
        const dp__md_region *g = &f->regions[i];
        uint8_t r[20];
        dp__le64_store(r, g->base);
        dp__le64_store(r + 8, g->len);
        dp__le32_store(r + 16, g->rkey_len);
        dp__buf_append(out, r, sizeof r);
        dp__buf_append(out, g->rkey, g->rkey_len);
    }
    if (f->proc != NULL) {
        uint8_t q[DP_MD_PROC_LEN] = {0};
        memcpy(q, f->proc->boot_id, 16);
        dp__le64_store(q + 16, f->proc->pidns);
        dp__le64_store(q + 24, f->proc->start);
        dp__le32_store(q + 32, f->proc->pid);
        dp__buf_append(out, q, sizeof q);
    }
    return out->oom ? dp__fail(d, DP_ENOMEM, "metadata: out of memory") : DP_OK;
}

void
dp__md_fini(dp__md *md)
{
    if (md == NULL)
        return;
    free(md->regions);
    md->regions = NULL;
    md->n_regions = 0;
}

/*
 * Read n region entries at p + *off (the table is sorted and disjoint: the
 * endpoint looks regions up by binary search) into regs; *off moves past them.
 * DP_EPROTO with a reason when one is cut short, empty, wraps, overlaps or
 * precedes the one before, or has an rkey length out of limits.
 */
static int
parse_regions(const uint8_t *p, size_t len, size_t *off, uint32_t n, dp__md_region *regs,
              dp_detail *d)
{
    for (uint32_t i = 0; i < n; i++) {
        if (len - *off < 20)
            return dp__fail(d, DP_EPROTO, "metadata: region %u cut short", i);
        dp__md_region *r = &regs[i];
        r->base = dp__le64_load(p + *off);
        r->len = dp__le64_load(p + *off + 8);
        r->rkey_len = dp__le32_load(p + *off + 16);
        *off += 20;
        if (r->len == 0 || r->base + r->len < r->base)
            return dp__fail(d, DP_EPROTO,
                            "metadata: region %u: base 0x%llx len %llu is empty or "
                            "wraps",
                            i, (unsigned long long)r->base, (unsigned long long)r->len);
        if (i > 0 && r->base < regs[i - 1].base + regs[i - 1].len)
            return dp__fail(d, DP_EPROTO,
                            "metadata: region %u overlaps or precedes region %u", i,
                            i - 1);
        if (r->rkey_len == 0 || r->rkey_len > DP_MD_RKEY_MAX || r->rkey_len > len - *off)
            return dp__fail(d, DP_EPROTO,
                            "metadata: region %u: rkey length %u outside 1..%u or "
                            "past the end",
                            i, r->rkey_len, DP_MD_RKEY_MAX);
        r->rkey = p + *off;
        *off += r->rkey_len;
    }
    return DP_OK;
}

/* Read the process block at p + *off into *proc; *off moves past it. */
static int
parse_proc(const uint8_t *p, size_t len, size_t *off, dp__md_proc *proc, dp_detail *d)
{
    if (len - *off < DP_MD_PROC_LEN)
        return dp__fail(d, DP_EPROTO, "metadata: the process block is cut short");
    const uint8_t *q = p + *off;
    memcpy(proc->boot_id, q, 16);
    proc->pidns = dp__le64_load(q + 16);
    proc->start = dp__le64_load(q + 24);
    proc->pid = dp__le32_load(q + 32);
    if (dp__le32_load(q + 36) != 0)
        return dp__fail(d, DP_EPROTO,
                        "metadata: the process block's last 4 bytes are not 0");
    *off += DP_MD_PROC_LEN;
    return DP_OK;
}

int
dp__md_parse(const void *buf, size_t len, dp__md *out, dp_detail *d)
{
    const uint8_t *p = buf;
    memset(out, 0, sizeof *out);
    if (p == NULL || len < DP_MD_HEADER_LEN)
        return dp__fail(d, DP_EPROTO,
                        "metadata: %zu bytes, shorter than the %d-byte header",
                        p ? len : 0, DP_MD_HEADER_LEN);
    if (len > DP_MD_TOTAL_MAX)
        return dp__fail(d, DP_EPROTO, "metadata: %zu bytes, limit %u", len,
                        DP_MD_TOTAL_MAX);
    if (memcmp(p, DP_MD_MAGIC, 4) != 0)
        return dp__fail(d, DP_EPROTO, "metadata: bad magic (not endpoint metadata)");
    uint16_t version = dp__le16_load(p + 4);
    if (version == 1 || version == 2)
        return dp__fail(
            d, DP_EPROTO,
            "metadata: version %u, from a dataplane older than this one (%d): "
            "run the same version on both sides",
            version, DP_MD_VERSION);
    if (version != DP_MD_VERSION)
        return dp__fail(d, DP_EPROTO, "metadata: version %u, this build reads %d",
                        version, DP_MD_VERSION);
    uint32_t name_len = dp__le16_load(p + 6);
    uint32_t addr_len = dp__le32_load(p + 8);
    uint32_t n_regions = dp__le32_load(p + 12);
    out->gen = dp__le64_load(p + 16);
    out->xver = dp__le32_load(p + 24);
    out->flags = dp__le32_load(p + 28);
    if (out->flags & ~DP_MD_F_KNOWN)
        return dp__fail(d, DP_EPROTO, "metadata: unknown flags 0x%x", out->flags);
    if (name_len == 0 || name_len > DP_MD_NAME_MAX)
        return dp__fail(d, DP_EPROTO, "metadata: name length %u outside 1..%d", name_len,
                        DP_MD_NAME_MAX);
    if (addr_len == 0 || addr_len > DP_MD_ADDR_MAX)
        return dp__fail(d, DP_EPROTO, "metadata: worker address length %u outside 1..%u",
                        addr_len, DP_MD_ADDR_MAX);
    if (n_regions > DP_MD_REGIONS_MAX)
        return dp__fail(d, DP_EPROTO, "metadata: %u regions, limit %u", n_regions,
                        DP_MD_REGIONS_MAX);
    size_t off = DP_MD_HEADER_LEN;
    /* Each region takes at least 21 bytes: a count the bytes cannot hold is a lie. */
    if ((size_t)name_len + addr_len > len - off ||
        (size_t)n_regions * 21 > len - off - name_len - addr_len)
        return dp__fail(
            d, DP_EPROTO,
            "metadata: %zu bytes cannot hold name %u, address %u and %u regions", len,
            name_len, addr_len, n_regions);
    dp_detail tmp;
    if (dp__md_check_name((const char *)p + off, name_len, &tmp) != DP_OK)
        return dp__fail(d, DP_EPROTO, "metadata: %s", tmp.msg);
    memcpy(out->name, p + off, name_len);
    out->name[name_len] = '\0';
    off += name_len;
    out->addr = p + off;
    out->addr_len = addr_len;
    off += addr_len;
    if (n_regions > 0) {
        out->regions = calloc(n_regions, sizeof *out->regions);
        if (out->regions == NULL)
            return dp__fail(d, DP_ENOMEM, "metadata: cannot allocate %u regions",
                            n_regions);
    }
    if (parse_regions(p, len, &off, n_regions, out->regions, d) != DP_OK)
        goto fail;
    out->n_regions = n_regions;
    if ((out->flags & DP_MD_F_PROC) && parse_proc(p, len, &off, &out->proc, d) != DP_OK)
        goto fail;
    if (off != len) {
        dp__fail(d, DP_EPROTO, "metadata: %zu trailing bytes", len - off);
        goto fail;
    }
    return DP_OK;
fail:
    free(out->regions);
    out->regions = NULL;
    out->n_regions = 0;
    return DP_EPROTO;
}

uint64_t
dp__md_peer_id(const void *buf, size_t len)
{
    const uint8_t *p = buf;
    if (p == NULL || len < DP_MD_HEADER_LEN || memcmp(p, DP_MD_MAGIC, 4) != 0)
        return 0;
    size_t name_len = dp__le16_load(p + 6);
    size_t addr_len = dp__le32_load(p + 8);
    if (name_len + addr_len > len - DP_MD_HEADER_LEN)
        return 0;
    const uint8_t *a = p + DP_MD_HEADER_LEN + name_len;
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */
    for (size_t i = 0; i < addr_len; i++)
        h = (h ^ a[i]) * 0x100000001b3ull;
    return h | 1;
}
