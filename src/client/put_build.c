/*
 * Building the blobs of dp_client_put (put.c drives the put, through its
 * network phases, and holds its design notes; put_int.h the types both
 * share): each unit's part sized before any index is built
 * (dp__put_size_locked, dp__put_fits_locked), its index built while its alloc
 * travels (dp__put_build_locked), staged with its WRITE's local ranges
 * (dp__put_stage_locked) and remote ones once the alloc answered
 * (dp__put_remote_ranges_locked), and the location hints of the values that
 * landed (dp__put_locs_locked; docs/design.md, "Location hints").
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blob/crc32c.h"
#include "common/hash64.h"
#include "blob/keys.h"
#include "client/put_int.h"

/*
 * A payload written from where it lies, without a staging copy: memory
 * registered with the client (UCX reads it), or any memory when the unit's
 * slab is mapped here (the memcpy path copies it during the WRITE:
 * dp__endpoint_remote_copy_max, local_plain_ok).
 */
static bool
payload_direct(const dp_client *c, const put_unit *pu, const dp_value *v)
{
    return v->nbytes <= pu->copy_max || dp__client_direct_locked(c, v->data, v->nbytes);
}

/* Build unit pu's blob index from its rows (order[0..n_rows)). */
static int
build_unit_locked(put_op *p, put_unit *pu, dp_detail *d)
{
    dp_client *c = p->c;
    const uint32_t *order = p->g.order + p->g.start[pu->st.u]; /* the unit's rows */
    const uint64_t *gidxs = p->gidxs;
    const char *const *fields = p->fields;
    const size_t *flen = p->flen;
    size_t n_fields = p->n_fields;
    const dp_value *values = p->values;
    const dp_value **ent_val = p->ent_val;
    put_key *ent_key = p->ent_key;
    dp__blob_builder *b = c->builders[pu->st.u];
    if (b == NULL) {
        int rc = dp__blob_builder_create(c->o.crc ? DP_BLOB_FLAG_CRC : 0, &b, d);
        if (rc != 0)
            return rc;
        /* Checked fields and unique rows (dp_client_put's checks). */
        dp__blob_builder_trust_keys(b, true);
        c->builders[pu->st.u] = b;
    }
    dp__blob_builder_reset(b);
    /* The fields its entries use, each declared at its first use (as
     * dp__put_size_locked told the sizer; the put's fields are distinct). */
    uint32_t *fnum = p->fnum;
    memset(fnum, 0xff, n_fields * sizeof *fnum);
    char key[DP_KEY_MAX + 1];
    pu->n_ent = 0;
    pu->vers = p->ent_ver != NULL ? p->ent_ver + pu->ent0 : NULL;
    for (uint32_t k = 0; k < pu->n_rows; k++) {
        uint32_t r = order[k];
        for (size_t f = 0; f < n_fields; f++) {
            const dp_value *v = &values[(size_t)r * n_fields + f];
            if (v->kind == DP_KIND_SKIP)
                continue;
            if (fnum[f] == UINT32_MAX) {
                int rc = dp__blob_builder_field(b, fields[f], flen[f], &fnum[f], d);
                if (rc != 0)
                    return rc;
            }
            dp__blob_entry_spec s;
            memset(&s, 0, sizeof s);
            s.gidx = gidxs[r];
            s.field = fnum[f];
            s.kind = (dp__blob_kind)v->kind;
            s.dtype = v->dtype;
            s.shape = v->shape;
            s.ndim = v->ndim;
            s.len = v->nbytes;
            if (c->o.crc) {
                s.has_crc = true;
                s.crc = v->nbytes > 0 ? dp__crc32c(v->data, v->nbytes) : 0;
            }
            int rc = dp__blob_builder_add(b, &s, NULL, d);
            if (rc != 0)
                return dp__fail_ctx(d, rc, "put: row %" PRIu64 " field '%s'", gidxs[r],
                                    fields[f]);
            if (ent_key != NULL) { /* location hints: the key's CRC32C and hash */
                size_t klen = dp__key_format(gidxs[r], fields[f], flen[f], key);
                ent_key[pu->ent0 + pu->n_ent].crc = dp__crc32c(key, klen);
                ent_key[pu->ent0 + pu->n_ent].hash = dp__hash64(key, klen, 0);
            }
            if (p->ent_ver != NULL) /* a repair's copy: its versions */
                p->ent_ver[pu->ent0 + pu->n_ent] = p->cell_ver[(size_t)r * n_fields + f];
            ent_val[pu->ent0 + pu->n_ent++] = v;
        }
    }
    if (pu->n_ent == 0)
        return DP_OK;
    int rc = dp__blob_builder_layout(b, &pu->lay, d);
    if (rc != 0)
        return dp__fail_ctx(d, rc, "put: blob for unit %u", pu->st.u);
    return DP_OK;
}

/* A blob of size bytes fits unit u's put area or (spilling) its IO area. */
static int
blob_fits(const dp_client *c, uint32_t u, uint64_t size, dp_detail *d)
{
    const dp__unit_conn *uc = &c->units[u];
    if (size <= uc->slab_bytes || (!c->o.no_spill && size <= uc->io_bytes))
        return DP_OK;
    return dp__fail(d, DP_ETOOBIG,
                    "put: the blob for unit %u (%s) needs %" PRIu64
                    " bytes, more than its slab of %" PRIu64 " bytes",
                    u, uc->addr, size, uc->slab_bytes);
}

int
dp__put_size_locked(put_op *p, dp_detail *d)
{
    dp_client *c = p->c;
    size_t n_fields = p->n_fields;
    const dp_value *values = p->values;
    size_t n_ent = 0;
    memset(p->fseen, 0xff, n_fields * sizeof *p->fseen); /* a call may size again */
    for (uint32_t u = 0; u < c->n_units; u++) {
        if (dp__groups_count(&p->g, u) == 0)
            continue;
        put_unit *pu = &p->pus[p->npu];
        pu->st.u = u;
        pu->ver = p->ver;
        pu->n_rows = dp__groups_count(&p->g, u);
        pu->ent0 = (uint32_t)n_ent;
        dp__blob_sizer z;
        dp__blob_sizer_init(&z, c->o.crc ? DP_BLOB_FLAG_CRC : 0);
        const uint32_t *order = p->g.order + p->g.start[u];
        const char *last = NULL; /* the last dtype measured: dl its length */
        size_t dl = 0;
        for (uint32_t k = 0; k < pu->n_rows; k++) {
            uint32_t r = order[k];
            for (size_t f = 0; f < n_fields; f++) {
                const dp_value *v = &values[(size_t)r * n_fields + f];
                if (v->kind == DP_KIND_SKIP)
                    continue;
                if (v->dtype != last) /* checked: <= 32 bytes */
                    dl = (last = v->dtype) != NULL ? strlen(last) : 0;
                if (p->fseen[f] != u) { /* a field the blob uses, counted once */
                    p->fseen[f] = u;
                    dp__blob_sizer_field(&z, p->flen[f]);
                }
                dp__blob_sizer_add(&z, dl, v->ndim, v->nbytes);
            }
        }
        if (z.n == 0)
            continue; /* every cell skipped: nothing to send */
        pu->n_ent = z.n;
        n_ent += z.n;
        uint64_t total = dp__blob_sizer_total(&z);
        if (z.n > DP_BLOB_MAX_ENTRIES || total == 0 ||
            dp__blob_sizer_index_len(&z) > DP_BLOB_MAX_INDEX_LEN)
            return dp__fail(d, DP_ETOOBIG,
                            "put: the blob for unit %u would have %u entries and %" PRIu64
                            " bytes of index: over the limits (%u entries, %llu bytes)",
                            u, z.n, dp__blob_sizer_index_len(&z), DP_BLOB_MAX_ENTRIES,
                            (unsigned long long)DP_BLOB_MAX_INDEX_LEN);
        /* Too big for a bound unit's areas: refused before anything is sent. */
        pu->unsized = c->units[u].incarnation == 0;
        int rc = pu->unsized ? DP_OK : blob_fits(c, u, total, d);
        if (rc != DP_OK)
            return rc;
        pu->size = total;
        /* Small: the whole blob is staged and travels in the request. */
        pu->inl = c->o.inline_bytes > 0 && total <= c->o.inline_bytes;
        snprintf(pu->blob_id, sizeof pu->blob_id, "%s-%" PRIx64, c->blob_prefix,
                 ++c->blob_seq);
        pu->st.state = pu->inl ? ST_INLINE : ST_ALLOC;
        p->npu++;
    }
    return DP_OK;
}

int
dp__put_build_locked(put_op *p, size_t *stage_total, dp_detail *d)
{
    dp_client *c = p->c;
    *stage_total = 0;
    for (size_t i = 0; i < p->npu; i++) {
        put_unit *pu = &p->pus[i];
        uint32_t n_ent = pu->n_ent;
        int rc = build_unit_locked(p, pu, d);
        if (rc != 0)
            return rc;
        if (pu->n_ent != n_ent || pu->lay.total_len != pu->size) {
            pu->size_bug = true;
            DP_LOG_E("put: blob %s built with %u entries and %" PRIu64
                     " bytes, sized %u and %" PRIu64 " (a bug: the part fails)",
                     pu->blob_id, pu->n_ent, pu->lay.total_len, n_ent, pu->size);
            continue;
        }
        bool any_staged = pu->inl;
        pu->copy_max =
            pu->inl ? 0 : dp__endpoint_remote_copy_max(c->ep, c->units[pu->st.u].remote);
        for (uint32_t e = 0; e < pu->n_ent && !pu->inl; e++) {
            const dp_value *v = p->ent_val[pu->ent0 + e];
            if (v->nbytes == 0)
                continue;
            if (payload_direct(c, pu, v))
                pu->any_direct = true;
            else
                any_staged = true;
        }
        pu->stage_off = *stage_total;
        pu->stage_len = any_staged ? pu->lay.total_len : pu->lay.payload_off;
        *stage_total += DP_ALIGN_UP(pu->stage_len, 64);
    }
    return DP_OK;
}

/*
 * Whether n bytes at p, for blob offset off, continue the range l (whose
 * blob offset is l_off) on both sides: then l grows by them. Only within
 * copy_max (what the memcpy path copies from any memory), so a grown range
 * never needs one registered region under two values (docs/design.md,
 * "Ranges of a transfer").
 */
static bool
continues(dp__range *l, uint64_t l_off, const void *p, uint64_t off, uint64_t n,
          uint64_t copy_max)
{
    if (l->addr + l->nbytes != (uint64_t)(uintptr_t)p || l_off + l->nbytes != off ||
        l->nbytes + n > copy_max)
        return false;
    l->nbytes += n;
    return true;
}

int
dp__put_stage_locked(put_op *p, dp_detail *d)
{
    dp_client *c = p->c;
    uint8_t *stage = p->stage;
    size_t nr = 0, nc = 0, max_c = 0;
    dp__range *local = p->local, *remote = p->remote;
    for (size_t i = 0; i < p->npu; i++)
        max_c += p->pus[i].n_ent;
    /* The copies into the staging area run as one batch at the end, on the
     * endpoint's copy threads when large enough; out of memory, one by one. */
    dp__copy *cp = max_c > 0 ? malloc(max_c * sizeof *cp) : NULL;
    for (size_t i = 0; i < p->npu; i++) {
        put_unit *pu = &p->pus[i];
        if (pu->size_bug)
            continue; /* fails after its alloc's answer (put_impl) */
        uint8_t *base = stage + pu->stage_off;
        dp__blob_builder *b = c->builders[pu->st.u];
        int rc = dp__blob_builder_write(b, base, pu->stage_len, d);
        if (rc != 0) {
            free(cp);
            return rc;
        }
        pu->r0 = nr;
        if (!pu->any_direct) {
            local[nr++] = (dp__range){(uint64_t)(uintptr_t)base, pu->lay.total_len};
        } else {
            local[nr++] = (dp__range){(uint64_t)(uintptr_t)base, pu->lay.payload_off};
        }
        for (uint32_t e = 0; e < pu->n_ent; e++) {
            const dp_value *v = p->ent_val[pu->ent0 + e];
            if (v->nbytes == 0)
                continue;
            uint64_t off = dp__blob_builder_offset(b, e);
            if (!pu->inl && payload_direct(c, pu, v)) {
                if (nr - 1 > pu->r0 && continues(&local[nr - 1], remote[nr - 1].nbytes,
                                                 v->data, off, v->nbytes, pu->copy_max))
                    continue; /* one range with the last value's */
                local[nr++] = (dp__range){(uint64_t)(uintptr_t)v->data, v->nbytes};
                remote[nr - 1].nbytes = off; /* remote filled after alloc */
            } else {
                if (cp != NULL)
                    cp[nc++] = (dp__copy){base + off, v->data, v->nbytes};
                else
                    memcpy(base + off, v->data, v->nbytes);
                if (!pu->inl) /* an inline put's copy is its request's */
                    c->cnt.staged_put_bytes += v->nbytes;
                if (pu->any_direct &&
                    !(nr - 1 > pu->r0 &&
                      continues(&local[nr - 1], remote[nr - 1].nbytes, base + off, off,
                                v->nbytes, pu->copy_max))) {
                    local[nr++] =
                        (dp__range){(uint64_t)(uintptr_t)(base + off), v->nbytes};
                    remote[nr - 1].nbytes = off;
                }
            }
        }
        pu->nr = nr - pu->r0;
    }
    if (nc > 0)
        dp__endpoint_copy(c->ep, cp, nc);
    free(cp);
    return DP_OK;
}

int
dp__put_fits_locked(const put_op *p, dp_detail *d)
{
    dp_client *c = p->c;
    for (size_t i = 0; i < p->npu; i++) {
        const put_unit *pu = &p->pus[i];
        int rc;
        if (!pu->unsized || pu->st.state == ST_FAILED ||
            (rc = blob_fits(c, pu->st.u, pu->size, d)) == DP_OK)
            continue;
        for (size_t j = 0; j < p->npu; j++)
            if (p->pus[j].st.state == ST_FAILED && p->pus[j].st.rc == DP_ERESTARTED)
                c->units[p->pus[j].st.u].restart_unreported = true;
        return rc;
    }
    return DP_OK;
}

void
dp__put_remote_ranges_locked(put_op *p)
{
    dp_client *c = p->c;
    uint8_t *stage = p->stage;
    for (size_t i = 0; i < p->npu; i++) {
        put_unit *pu = &p->pus[i];
        if (pu->st.state != ST_WRITE)
            continue;
        uint64_t rbase = c->units[pu->st.u].slab_addr + pu->off;
        /* The header names the allocation: only it can publish these bytes. */
        dp__blob_header_set_alloc(stage + pu->stage_off, c->units[pu->st.u].incarnation,
                                  pu->token);
        p->remote[pu->r0] = (dp__range){rbase, p->local[pu->r0].nbytes};
        for (size_t k = pu->r0 + 1; k < pu->r0 + pu->nr; k++)
            p->remote[k] = (dp__range){rbase + p->remote[k].nbytes, p->local[k].nbytes};
    }
}

/* One hint from a written value: entry e of unit pu's blob (docs/design.md,
 * "Location hints"); idn: strlen(pu->blob_id). */
static void
loc_fill(dp_loc *l, const put_unit *pu, size_t idn, const dp__blob_builder *b, uint32_t e,
         const dp_value *v, const put_key *key)
{
    memset(l, 0, sizeof *l);
    memcpy(l->blob, pu->blob_id, idn);
    l->off = dp__blob_builder_offset(b, e);
    l->nbytes = v->nbytes;
    l->unit = pu->st.u;
    l->key_crc = key->crc;
    l->kind = (uint8_t)v->kind;
    size_t dl = v->dtype != NULL ? strlen(v->dtype) : 0;
    if (v->ndim > DP_LOC_DIMS || dl > DP_LOC_DTYPE_MAX) {
        l->ndim = DP_LOC_NO_DESC; /* a get that asks for a description looks it up */
        l->seal = dp__loc_seal(l, key->hash);
        return;
    }
    l->ndim = (uint8_t)v->ndim;
    if (dl > 0)
        memcpy(l->dtype, v->dtype, dl);
    for (uint32_t i = 0; i < v->ndim; i++)
        l->shape[i] = v->shape[i];
    l->seal = dp__loc_seal(l, key->hash);
}

void
dp__put_locs_locked(const put_op *p, dp_loc *locs)
{
    dp_client *c = p->c;
    size_t n_fields = p->n_fields;
    const dp_value *values = p->values;
    for (size_t i = 0; i < p->npu; i++) {
        const put_unit *pu = &p->pus[i];
        if (pu->st.state != ST_DONE)
            continue;
        const dp__blob_builder *b = c->builders[pu->st.u];
        const uint32_t *order = p->g.order + p->g.start[pu->st.u];
        size_t idn = strnlen(pu->blob_id, DP_LOC_BLOB_MAX);
        uint32_t e = 0;
        for (uint32_t k = 0; k < pu->n_rows; k++) {
            size_t cell = (size_t)order[k] * n_fields;
            /* With replicas the hint names the row's first unit that took it. */
            uint32_t N = c->n_units, home = (uint32_t)(p->gidxs[order[k]] % N);
            uint32_t rank = (pu->st.u + N - home) % N;
            for (size_t f = 0; f < n_fields; f++, cell++) {
                const dp_value *v = &values[cell];
                if (v->kind == DP_KIND_SKIP)
                    continue;
                if (locs[cell].blob[0] == '\0' || (locs[cell].unit + N - home) % N > rank)
                    loc_fill(&locs[cell], pu, idn, b, e, v, &p->ent_key[pu->ent0 + e]);
                e++;
            }
        }
    }
}
