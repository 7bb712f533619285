/*
 * Reading a cluster checkpoint back (checkpoint.h has the layout; checkpoint.c
 * what save and load share): its manifest and every file checked against it
 * (the plan), loaded into a cluster of the same shape (load_shard on every
 * unit at once, RAM then spill), peeked at, or re-homed through a client into
 * a cluster of another shape, reading its shards with the format's owner
 * (blob/shard.h).
 */
#include "client/checkpoint_int.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "blob/blob.h"
#include "blob/keys.h"
#include "blob/shard.h"
#include "common/fileio.h"
#include "common/map.h"

#define MANIFEST_MAX ((size_t)1 << 30)

/* A file name of the manifest: a plain name in the checkpoint directory. */
static bool
plain_name(const cJSON *s)
{
    if (!cJSON_IsString(s) || s->valuestring[0] == '\0' || s->valuestring[0] == '.')
        return false;
    size_t n = strlen(s->valuestring);
    if (n > 200)
        return false;
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s->valuestring[i];
        if (ch == '/' || ch < 0x20 || ch == 0x7f)
            return false;
    }
    return true;
}

/* x is a whole number in [0, 2^53] (exact in a JSON double). */
static bool
num_u64(const cJSON *x, uint64_t *v)
{
    if (!cJSON_IsNumber(x) || !(x->valuedouble >= 0) ||
        x->valuedouble > 9007199254740992.0)
        return false;
    *v = (uint64_t)x->valuedouble;
    return (double)*v == x->valuedouble;
}

static bool
get_u64(const cJSON *o, const char *k, uint64_t *v)
{
    return num_u64(cJSON_GetObjectItemCaseSensitive(o, k), v);
}

typedef struct lunit {
    char shard[PATH_MAX];
    char rows[PATH_MAX];
    dp__wire_shard_blob *blobs;
    uint32_t n_blobs;
    dp__wire_shard_blob *retry; /* failed in the RAM pass */
    uint32_t n_retry;
} lunit;

/* A checkpoint to load: its manifest (kept: blob ids point into it), checked. */
typedef struct plan {
    char mpath[PATH_MAX + 32];
    char *text;
    cJSON *man;
    uint32_t n;
    lunit *lu;
} plan;

static void
plan_fini(plan *pl)
{
    for (uint32_t i = 0; pl->lu != NULL && i < pl->n; i++) {
        free(pl->lu[i].blobs);
        free(pl->lu[i].retry);
    }
    free(pl->lu);
    cJSON_Delete(pl->man);
    free(pl->text);
    memset(pl, 0, sizeof *pl);
}

/* The manifest's bytes (at most MANIFEST_MAX, a regular file) parsed into pl->man. */
static int
manifest_read(plan *pl, dp_detail *d)
{
    const char *mpath = pl->mpath;
    FILE *f = fopen(mpath, "rb");
    if (f == NULL) {
        if (errno == ENOENT)
            return dp__fail(d, DP_ENOTFOUND, "checkpoint: no %s (no complete checkpoint)",
                            mpath);
        return dp__fail_sys(d, errno, "checkpoint: opening %s", mpath);
    }
    struct stat stt;
    if (fstat(fileno(f), &stt) != 0 || !S_ISREG(stt.st_mode)) {
        fclose(f);
        return dp__fail(d, DP_ECORRUPT, "%s: not a regular file", mpath);
    }
    if ((uint64_t)stt.st_size > MANIFEST_MAX) {
        fclose(f);
        return dp__fail(d, DP_ECORRUPT,
                        "%s: %lld bytes, larger than a manifest can be (%zu)", mpath,
                        (long long)stt.st_size, MANIFEST_MAX);
    }
    size_t want = (size_t)stt.st_size;
    pl->text = malloc(want + 1);
    size_t len = pl->text ? fread(pl->text, 1, want, f) : 0;
    int read_err = pl->text != NULL && ferror(f) ? (errno ? errno : EIO) : 0;
    fclose(f);
    if (pl->text == NULL)
        return dp__fail(d, DP_ENOMEM, "checkpoint: reading %s: out of memory", mpath);
    if (read_err != 0)
        return dp__fail_sys(d, read_err, "checkpoint: reading %s", mpath);
    if (len != want)
        return dp__fail(d, DP_ECORRUPT,
                        "%s: read %zu of its %zu bytes (changed while read?)", mpath, len,
                        want);
    pl->text[len] = '\0';
    pl->man = cJSON_ParseWithLength(pl->text, len);
    if (pl->man == NULL)
        return dp__fail(d, DP_ECORRUPT, "%s: not valid JSON (near offset %td)", mpath,
                        cJSON_GetErrorPtr() ? cJSON_GetErrorPtr() - pl->text
                                            : (ptrdiff_t)0);
    return DP_OK;
}

/* A file's CRC32C (and for a shard its size) against the manifest's. */
static int
file_check(const char *path, uint64_t want_crc, const uint64_t *want_size, dp_detail *d)
{
    uint32_t crc = 0;
    uint64_t size = 0;
    int rc = dp__ckpt_file_crc(path, &crc, &size, d);
    if (rc != 0)
        return rc;
    if (want_size != NULL && size != *want_size)
        return dp__fail(d, DP_ECORRUPT,
                        "%s: %" PRIu64 " bytes, the manifest says %" PRIu64
                        " (truncated at offset %" PRIu64 "?)",
                        path, size, *want_size, size < *want_size ? size : *want_size);
    if (crc != want_crc)
        return dp__fail(d, DP_ECORRUPT,
                        "%s: CRC32C %08x over [0, %" PRIu64 "), the manifest says %08x",
                        path, crc, size, (uint32_t)want_crc);
    return DP_OK;
}

/* Unit i's blob list ({"id": [shard offset, length, entries]...}) into lu. */
static int
unit_blobs_read(const plan *pl, uint32_t i, const cJSON *bl, lunit *lu, dp_detail *d)
{
    uint32_t k = 0, m = (uint32_t)cJSON_GetArraySize(bl);
    lu->blobs = calloc(m ? m : 1, sizeof *lu->blobs);
    lu->retry = calloc(m ? m : 1, sizeof *lu->retry);
    if (lu->blobs == NULL || lu->retry == NULL)
        return dp__fail(d, DP_ENOMEM, "checkpoint: out of memory");
    const cJSON *x;
    cJSON_ArrayForEach(x, bl)
    {
        uint64_t v0, v1, v2;
        if (x->string == NULL || !cJSON_IsArray(x) || cJSON_GetArraySize(x) != 3 ||
            !num_u64(cJSON_GetArrayItem(x, 0), &v0) ||
            !num_u64(cJSON_GetArrayItem(x, 1), &v1) ||
            !num_u64(cJSON_GetArrayItem(x, 2), &v2))
            return dp__fail(d, DP_ECORRUPT,
                            "%s: unit %u: bad blob entry '%.64s' (want \"id\": [three "
                            "whole numbers >= 0])",
                            pl->mpath, i, x->string ? x->string : "");
        lu->blobs[k++] = (dp__wire_shard_blob){dp__wire_s(x->string), v0, v1, v2};
    }
    lu->n_blobs = k;
    return DP_OK;
}

/* Unit i's manifest entry u: its files checked against it, its blobs read. */
static int
unit_read(plan *pl, const char *adir, const char *ck, uint32_t i, const cJSON *u,
          dp_ckpt_summary *sum, dp_detail *d)
{
    lunit *lu = &pl->lu[i];
    const cJSON *sh = cJSON_GetObjectItemCaseSensitive(u, "shard");
    const cJSON *rw = cJSON_GetObjectItemCaseSensitive(u, "rows");
    const cJSON *bl = cJSON_GetObjectItemCaseSensitive(u, "blobs");
    uint64_t uid = 0, nb = 0, scrc = 0, rcrc = 0;
    if (!get_u64(u, "unit", &uid) || uid != i || !plain_name(sh) || !plain_name(rw) ||
        !get_u64(u, "nbytes", &nb) || !get_u64(u, "shard_crc32c", &scrc) ||
        !get_u64(u, "rows_crc32c", &rcrc) || !cJSON_IsObject(bl))
        return dp__fail(d, DP_ECORRUPT, "%s: unit %u: bad entry", pl->mpath, i);
    int rc;
    if ((rc = dp__ckpt_pathf(lu->shard, PATH_MAX, d, "%s/%s/%s", adir, ck,
                             sh->valuestring)) != 0 ||
        (rc = dp__ckpt_pathf(lu->rows, PATH_MAX, d, "%s/%s/%s", adir, ck,
                             rw->valuestring)) != 0 ||
        (rc = file_check(lu->shard, scrc, &nb, d)) != 0 ||
        (rc = file_check(lu->rows, rcrc, NULL, d)) != 0 ||
        (rc = unit_blobs_read(pl, i, bl, lu, d)) != 0)
        return rc;
    sum->blobs += lu->n_blobs;
    sum->bytes += nb;
    return DP_OK;
}

/*
 * Read adir's current checkpoint: the manifest, and every file's size and
 * CRC32C against it, before anything is loaded anywhere. sum gets the
 * checkpoint's name, units, blobs and bytes.
 */
static int
plan_read(const char *adir, plan *pl, dp_ckpt_summary *sum, dp_detail *d)
{
    memset(pl, 0, sizeof *pl);
    snprintf(pl->mpath, sizeof pl->mpath, "%s/%s", adir, DP_CKPT_MANIFEST);
    int rc = manifest_read(pl, d);
    if (rc != DP_OK)
        goto fail;
    uint64_t ver = 0, nu = 0;
    const cJSON *ck = cJSON_GetObjectItemCaseSensitive(pl->man, "checkpoint");
    const cJSON *units = cJSON_GetObjectItemCaseSensitive(pl->man, "units");
    if (!get_u64(pl->man, "version", &ver) || ver != 1 ||
        !get_u64(pl->man, "n_units", &nu) || nu == 0 || nu > UINT32_MAX ||
        !plain_name(ck) || !cJSON_IsArray(units) ||
        (uint64_t)cJSON_GetArraySize(units) != nu) {
        rc =
            dp__fail(d, DP_ECORRUPT,
                     "%s: not a version 1 manifest (version, checkpoint, n_units, units)",
                     pl->mpath);
        goto fail;
    }
    uint64_t reps = 1;
    if (cJSON_GetObjectItemCaseSensitive(pl->man, "replicas") != NULL &&
        (!get_u64(pl->man, "replicas", &reps) || reps < 1 || reps > 3 || reps > nu)) {
        rc = dp__fail(d, DP_ECORRUPT, "%s: \"replicas\" must be 1..3 and at most n_units",
                      pl->mpath);
        goto fail;
    }
    /* "copies": 1 (each row saved once, by its first unit); absent in
     * checkpoints that saved every copy (then replicas). */
    uint64_t copies = reps;
    if (cJSON_GetObjectItemCaseSensitive(pl->man, "copies") != NULL &&
        (!get_u64(pl->man, "copies", &copies) || (copies != 1 && copies != reps))) {
        rc = dp__fail(d, DP_ECORRUPT, "%s: \"copies\" must be 1 or \"replicas\"",
                      pl->mpath);
        goto fail;
    }
    snprintf(sum->checkpoint, sizeof sum->checkpoint, "%s", ck->valuestring);
    pl->n = (uint32_t)nu;
    sum->n_units = pl->n;
    sum->replicas = (uint32_t)reps;
    sum->copies = (uint32_t)copies;
    pl->lu = calloc(pl->n, sizeof *pl->lu);
    if (pl->lu == NULL) {
        rc = dp__fail(d, DP_ENOMEM, "checkpoint: out of memory");
        goto fail;
    }
    /* Check every file before any unit is asked: nothing is loaded otherwise. */
    for (uint32_t i = 0; i < pl->n; i++)
        if ((rc = unit_read(pl, adir, ck->valuestring, i,
                            cJSON_GetArrayItem(units, (int)i), sum, d)) != 0)
            goto fail;
    return DP_OK;
fail:
    plan_fini(pl);
    return rc;
}

/*
 * A load pass's requests: every unit's shard (RAM pass), or what did not fit;
 * in round k > 0 (a one-copy checkpoint into replicas > k), each unit loads
 * the shard of the unit k before it: the rows it keeps copy k + 1 of.
 */
typedef struct load_pass {
    const lunit *lu;
    uint32_t n;
    uint32_t copy; /* the round */
    int pass;      /* 0: RAM only; 1: spill */
} load_pass;

/* The shard unit i loads in round copy. */
static uint32_t
shard_of(uint32_t i, uint32_t copy, uint32_t n)
{
    return (i + n - copy % n) % n;
}

static bool
load_req(uint32_t i, dp__wire_request *q, void *ctx)
{
    const load_pass *p = ctx;
    const lunit *lu = &p->lu[shard_of(i, p->copy, p->n)];
    if (p->pass == 1 && lu->n_retry == 0)
        return false;
    q->op = DP_WIRE_OP_LOAD_SHARD;
    q->a.load_shard = (dp__wire_load_shard_args){
        .path = dp__wire_s(lu->shard),
        .blobs = p->pass == 0 ? (dp__wire_shard_blobs){lu->blobs, lu->n_blobs}
                              : (dp__wire_shard_blobs){lu->retry, lu->n_retry},
        .spill = p->pass == 1,
        .copy = p->copy};
    return true;
}

/* The RAM pass's failed ids of unit i, as the manifest has them (views stay valid). */
static void
load_retry(lunit *lu, const dp__wire_load_shard_res *r)
{
    for (uint32_t k = 0; k < r->failed.n; k++)
        for (uint32_t j = 0; j < lu->n_blobs; j++)
            if (dp__wire_str_same(lu->blobs[j].id, r->failed.v[k])) {
                /* Each blob once, however the unit lists it. */
                bool seen = false;
                for (uint32_t q = 0; q < lu->n_retry && !seen; q++)
                    seen = dp__wire_str_same(lu->retry[q].id, r->failed.v[k]);
                if (!seen && lu->n_retry < lu->n_blobs)
                    lu->retry[lu->n_retry++] = lu->blobs[j];
                break;
            }
}

/*
 * Round copy of a load: every unit loads its shard of the round (load_req),
 * RAM first on every unit at once, then the SSD tier for what did not fit.
 */
static int
load_round(dp__ctl_client *c, const dp__cluster *cl, plan *pl, uint32_t copy,
           dp__fanout *f, dp__wire_rid_gen *g, const dp_ckpt_opts *o,
           dp_ckpt_summary *sum, dp_detail *d)
{
    uint32_t n = pl->n;
    lunit *lu = pl->lu;
    for (uint32_t i = 0; i < n; i++)
        lu[i].n_retry = 0;
    for (int pass = 0; pass < 2; pass++) {
        load_pass lp = {lu, n, copy, pass};
        int rc = dp__ckpt_ask_units(f, g, cl, load_req, &lp, d);
        if (rc != 0)
            return rc;
        uint32_t asked = f->n_slots;
        if (asked == 0)
            break;
        if (copy == 0)
            dp__ckpt_say(o, "%s pass: loading %s into %u units",
                         pass == 0 ? "RAM" : "spill", sum->checkpoint, asked);
        else
            dp__ckpt_say(o, "%s pass: loading copy %u of each row of %s into %u units",
                         pass == 0 ? "RAM" : "spill", copy + 1, sum->checkpoint, asked);
        if ((rc = dp__fanout_run(f, c, o->timeout_s, NULL)) != 0)
            return dp__ckpt_units_failed(f, "checkpoint load", d);
        uint64_t left = 0;
        for (uint32_t i = 0; i < n; i++) {
            if (f->u[i].op == DP_WIRE_OP_NONE)
                continue;
            const dp__wire_load_shard_res *r = &f->u[i].rep.r.load_shard;
            uint32_t s = shard_of(i, copy, n);
            sum->loaded += r->loaded.n;
            if (pass == 1)
                sum->spilled += r->loaded.n;
            dp__ckpt_say(o, "unit %u: %u blobs of shard %u loaded, %u did not fit", i,
                         r->loaded.n, s, r->failed.n);
            left += r->failed.n;
            if (pass == 0)
                load_retry(&lu[s], r);
        }
        if (pass == 1 && left > 0)
            return dp__fail(d, DP_EUNITFULL,
                            "checkpoint load: %" PRIu64
                            " blobs fit neither RAM nor SSD (%" PRIu64
                            " loaded, copy %u of each row)",
                            left, sum->loaded, copy + 1);
    }
    return DP_OK;
}

int
dp__ckpt_load_units(dp__ctl_client *c, const dp__cluster *cl, const char *dir,
                    const dp_ckpt_opts *o, dp_ckpt_summary *sum, dp_detail *d)
{
    dp_ckpt_opts defo;
    char adir[PATH_MAX];
    int rc = dp__ckpt_begin(&o, &defo, sum, dir, adir, d);
    if (rc != 0)
        return rc;
    plan pl;
    dp__fanout f = {0};
    if ((rc = plan_read(adir, &pl, sum, d)) != 0)
        return rc;
    uint32_t n = pl.n;
    if (n != cl->n_units) {
        rc = dp__fail(
            d, DP_EINVAL,
            "checkpoint %s has %u units, the cluster has %u: rows are placed by "
            "gidx %% n_units, so its shards cannot be loaded as they are (re-home "
            "it through a client: dp_ckpt_rehome, as `dataplane load` does)",
            sum->checkpoint, n, cl->n_units);
        goto out;
    }
    uint32_t reps = cl->replicas > 0 ? cl->replicas : 1;
    if (sum->copies != 1 && sum->replicas != reps) {
        rc = dp__fail(d, DP_EINVAL,
                      "checkpoint %s keeps %u copies of each row, the cluster %u: its "
                      "shards hold other units' copies than this cluster's units keep "
                      "(re-home it through a client: dp_ckpt_rehome, as `dataplane "
                      "load` does)",
                      sum->checkpoint, sum->replicas, reps);
        goto out;
    }
    /* A one-copy checkpoint: round k loads every row's copy k + 1 from the
     * shard of its first unit; one that kept every copy: one round. */
    uint32_t rounds = sum->copies == 1 ? reps : 1;
    dp__wire_rid_gen g;
    if ((rc = dp__wire_rid_gen_init(&g, d)) != 0 || (rc = dp__fanout_init(&f, n, d)) != 0)
        goto out;
    for (uint32_t k = 0; k < rounds && rc == 0; k++)
        rc = load_round(c, cl, &pl, k, &f, &g, o, sum, d);
    if (rc == 0)
        dp__ckpt_say(o,
                     "loaded %s: %" PRIu64 " blobs (%" PRIu64
                     " spilled to SSD), %u cop%s of each row",
                     sum->checkpoint, sum->loaded, sum->spilled, reps,
                     reps == 1 ? "y" : "ies");
out:
    dp__fanout_fini(&f);
    plan_fini(&pl);
    return rc;
}

int
dp_ckpt_peek(const char *dir, dp_ckpt_summary *sum, dp_detail *d)
{
    if (sum == NULL)
        return dp__fail(d, DP_EINVAL, "checkpoint: NULL summary");
    memset(sum, 0, sizeof *sum);
    char adir[PATH_MAX];
    int rc = dp__ckpt_abs_dir(dir, adir, sizeof adir, d);
    if (rc != 0)
        return rc;
    plan pl;
    if ((rc = plan_read(adir, &pl, sum, d)) != 0)
        return rc;
    plan_fini(&pl);
    return DP_OK;
}

/* ---- re-homing: a checkpoint of N units into a cluster of M ---- */

/*
 * Put the live entries of one parsed blob (entry indexes live[0..n)) through
 * c. One put of rows x fields when that grid is dense, else one put per field
 * (a sparse blob would make a huge grid of skipped cells).
 */
static int
put_entries(dp_client *c, const uint8_t *base, const dp__blob *pb, const uint32_t *live,
            uint32_t n, dp_detail *d)
{
    int rc = DP_OK;
    dp__map rows, fields;
    dp__map_init_u64(&rows);
    dp__map_init_str(&fields);
    uint64_t *gidxs = malloc((size_t)n * sizeof *gidxs);
    const char **fnames = malloc((size_t)n * sizeof *fnames);
    uint32_t *ri = malloc((size_t)n * sizeof *ri), *fi = malloc((size_t)n * sizeof *fi);
    dp_value *vals = NULL;
    uint32_t nr = 0, nf = 0;
    if (gidxs == NULL || fnames == NULL || ri == NULL || fi == NULL) {
        rc = dp__fail(d, DP_ENOMEM, "re-home: out of memory");
        goto out;
    }
    for (uint32_t k = 0; k < n; k++) {
        const dp__blob_entry *e = dp__blob_entry_at(pb, live[k]);
        void *v = dp__map_get_u64(&rows, e->gidx);
        if (v == NULL) {
            gidxs[nr] = e->gidx;
            v = (void *)(uintptr_t)(++nr);
            if (dp__map_put_u64(&rows, e->gidx, v, NULL) != 0) {
                rc = dp__fail(d, DP_ENOMEM, "re-home: out of memory");
                goto out;
            }
        }
        ri[k] = (uint32_t)(uintptr_t)v - 1;
        v = dp__map_get(&fields, e->field, e->field_len);
        if (v == NULL) {
            fnames[nf] = e->field; /* NUL-terminated in the parsed blob */
            v = (void *)(uintptr_t)(++nf);
            if (dp__map_put(&fields, e->field, e->field_len, v, NULL) != 0) {
                rc = dp__fail(d, DP_ENOMEM, "re-home: out of memory");
                goto out;
            }
        }
        fi[k] = (uint32_t)(uintptr_t)v - 1;
    }
    bool dense = (uint64_t)nr * nf <= 2 * (uint64_t)n + 64;
    uint32_t groups = dense ? 1 : nf;
    vals = malloc((size_t)(dense ? (uint64_t)nr * nf : nr) * sizeof *vals);
    uint64_t *g1 = dense ? NULL : malloc((size_t)nr * sizeof *g1);
    if (vals == NULL || (!dense && g1 == NULL)) {
        free(g1);
        rc = dp__fail(d, DP_ENOMEM, "re-home: out of memory");
        goto out;
    }
    for (uint32_t g = 0; g < groups && rc == DP_OK; g++) {
        uint32_t rows_here = 0;
        if (dense) {
            for (size_t q = 0; q < (size_t)nr * nf; q++)
                vals[q] = (dp_value){.kind = DP_KIND_SKIP};
        }
        for (uint32_t k = 0; k < n; k++) {
            if (!dense && fi[k] != g)
                continue;
            const dp__blob_entry *e = dp__blob_entry_at(pb, live[k]);
            dp_value v = {base + e->off, e->len,   (dp_kind)e->kind,
                          e->dtype,      e->shape, e->ndim};
            if (dense) {
                vals[(size_t)ri[k] * nf + fi[k]] = v;
            } else {
                g1[rows_here] = e->gidx;
                vals[rows_here++] = v;
            }
        }
        if (dense)
            rc = dp_client_put(c, gidxs, nr, fnames, nf, vals, NULL, d);
        else
            rc = dp_client_put(c, g1, rows_here, &fnames[g], 1, vals, NULL, d);
    }
    free(g1);
out:
    dp__map_fini(&rows);
    dp__map_fini(&fields);
    free(gidxs);
    free(fnames);
    free(ri);
    free(fi);
    free(vals);
    return rc;
}

/*
 * A shard's frame checked before its blobs are read: header (its unit and
 * cluster size as the manifest says), length and trailer, through the
 * format's owner (blob/shard.h). *h gets the header.
 */
static int
shard_frame(int fd, uint64_t len, const char *shard, uint32_t unit, uint32_t n_units,
            dp__shard_header *h, dp_detail *d)
{
    uint8_t hb[DP_SHARD_HEADER_LEN], tb[DP_SHARD_TRAILER_LEN];
    uint32_t data_crc;
    int rc = dp__pread_full(fd, hb, sizeof hb, 0, NULL, shard, d);
    if (rc == DP_OK)
        rc = dp__shard_header_decode(hb, shard, h, d);
    if (rc == DP_OK)
        rc = dp__shard_check_len(h, len, shard, d);
    if (rc == DP_OK)
        rc = dp__pread_full(fd, tb, sizeof tb, dp__shard_data_end(h), NULL, shard, d);
    if (rc == DP_OK)
        rc = dp__shard_trailer_decode(tb, h, shard, &data_crc, d);
    if (rc == DP_OK && (h->unit_id != unit || h->n_units != n_units))
        rc = dp__fail(
            d, DP_ECORRUPT,
            "%s: written by unit %u of %u (offset 12), the manifest says %u of %u", shard,
            h->unit_id, h->n_units, unit, n_units);
    return rc;
}

/*
 * A damaged checkpoint is DP_ECORRUPT whatever check of its files found it:
 * the format's owner words a bad blob index as a commit would (DP_EPROTO)
 * and a file that is not a regular one as DP_EINVAL. Out of memory and
 * system errors stay what they are.
 */
static int
as_corrupt(int rc, dp_detail *d)
{
    if (rc == DP_OK || rc == DP_ENOMEM || rc == DP_ESYS || rc == DP_ECORRUPT)
        return rc;
    if (d != NULL)
        d->code = DP_ECORRUPT;
    return DP_ECORRUPT;
}

/* A re-home under way. */
typedef struct rehome {
    dp_client *c;
    const plan *pl;
    const dp_ckpt_opts *o;
    dp_ckpt_summary *sum;
    uint64_t keys;    /* put so far (all units) */
    uint64_t skipped; /* copies of keys put already from another shard */
    dp__map *seen;    /* with replicas: the keys put so far (gidx, then field) */
} rehome;

/*
 * With replicas, drop from blob sb's live list (in place: only the list is
 * read after this, not sb->keep) the keys an earlier shard's copy put already:
 * each key is put once, from the first shard that holds it. The keys kept are
 * marked seen.
 */
static int
first_copies(rehome *rh, dp__shard_blob *sb, dp_detail *d)
{
    uint32_t n = 0;
    for (uint32_t k = 0; k < sb->n_live; k++) {
        const dp__blob_entry *e = dp__blob_entry_at(sb->parsed, sb->live[k]);
        char key[8 + DP_FIELD_MAX];
        size_t fl =
            DP_MIN((size_t)e->field_len, (size_t)DP_FIELD_MAX); /* split checked it */
        memcpy(key, &e->gidx, 8);
        memcpy(key + 8, e->field, fl);
        if (dp__map_get(rh->seen, key, 8 + fl) != NULL) {
            rh->skipped++;
            continue;
        }
        if (dp__map_put(rh->seen, key, 8 + fl, (void *)1, NULL) != 0)
            return dp__fail(d, DP_ENOMEM, "re-home: out of memory");
        sb->live[n++] = sb->live[k];
    }
    sb->n_live = n;
    return DP_OK;
}

/*
 * Re-home the shard of unit i of checkpoint pl (of pl->n units) through c: its
 * rows file and frame checked, then blob by blob: read and CRC-checked, its
 * index and live list checked (blob/shard.h), its live entries put (with
 * replicas, those no earlier shard's copy put).
 */
static int
rehome_unit(rehome *rh, uint32_t i, dp_detail *d)
{
    const plan *pl = rh->pl;
    const lunit *lu = &pl->lu[i];
    uint32_t n = pl->n;
    const char *shard = lu->shard, *rows = lu->rows;
    uint8_t *rbuf = NULL, *buf = NULL;
    dp__shard_rows sr = {0};
    dp__shard_header h;
    int fd = -1;
    uint64_t fsize = 0, unit_keys = 0, skipped0 = rh->skipped;
    int rc = as_corrupt(dp__shard_rows_load(rows, &rbuf, &sr, d), d);
    if (rc == DP_OK && (sr.unit_id != i || sr.n_units != n))
        rc = dp__fail(d, DP_ECORRUPT,
                      "%s: written by unit %u of %u, the manifest says %u of %u", rows,
                      sr.unit_id, sr.n_units, i, n);
    if (rc == DP_OK)
        rc = as_corrupt(dp__shard_file_open(shard, &fd, &fsize, d), d);
    if (rc == DP_OK)
        rc = shard_frame(fd, fsize, shard, i, n, &h, d);
    if (rc == DP_OK)
        rc = dp__shard_rows_check(&sr, &h, rows, shard, d);
    for (uint32_t k = 0; k < sr.n && rc == DP_OK; k++) {
        const dp__shard_row *r = &sr.v[k];
        if (r->n_live == 0)
            continue;
        free(buf);
        if ((buf = malloc((size_t)r->nbytes)) == NULL) {
            rc = dp__fail(d, DP_ENOMEM,
                          "re-home: out of memory for a blob of %" PRIu64 " bytes",
                          r->nbytes);
            break;
        }
        dp__shard_blob sb;
        if ((rc = dp__shard_blob_read(fd, shard, r, buf, d)) != DP_OK ||
            (rc = as_corrupt(dp__shard_blob_check(r, buf, NULL, shard, rows, &sb, d),
                             d)) != DP_OK)
            break;
        if (rh->seen != NULL)
            rc = first_copies(rh, &sb, d);
        if (rc == DP_OK && sb.n_live > 0)
            rc = put_entries(rh->c, buf, sb.parsed, sb.live, sb.n_live, d);
        if (rc != DP_OK)
            dp__fail_ctx(d, rc,
                         "re-home: putting blob %.*s of unit %u (%" PRIu64
                         " keys put before it)",
                         (int)r->id_len, r->id, i, rh->keys + unit_keys);
        if (rc == DP_OK) {
            unit_keys += sb.n_live;
            rh->sum->loaded++;
        }
        dp__shard_blob_fini(&sb);
    }
    if (rc == DP_OK) {
        rh->keys += unit_keys;
        dp__ckpt_say(rh->o,
                     "shard of unit %u: %u blobs, %" PRIu64 " keys put, %" PRIu64
                     " copies of keys put already skipped",
                     i, sr.n, unit_keys, rh->skipped - skipped0);
    }
    if (fd >= 0)
        close(fd);
    free(buf);
    free(rbuf);
    dp__shard_rows_fini(&sr);
    return rc;
}

int
dp_ckpt_rehome(dp_client *c, const char *dir, const dp_ckpt_opts *o, dp_ckpt_summary *sum,
               dp_detail *d)
{
    if (c == NULL)
        return dp__fail(d, DP_EINVAL, "checkpoint: NULL client");
    dp_ckpt_opts defo;
    char adir[PATH_MAX];
    int rc = dp__ckpt_begin(&o, &defo, sum, dir, adir, d);
    if (rc != 0)
        return rc;
    plan pl;
    if ((rc = plan_read(adir, &pl, sum, d)) != 0)
        return rc;
    /* Every unit first: a unit down since the open fails it before anything is put. */
    if ((rc = dp__client_bind_all(c, d)) != 0) {
        plan_fini(&pl);
        return dp__fail_ctx(d, rc, "re-home: a unit was down when the client opened");
    }
    dp__ckpt_say(o, "re-homing %s: %u units into %u, every value through this client",
                 sum->checkpoint, pl.n, dp_client_n_units(c));
    /* A checkpoint that kept every copy holds each row R times: each key is
     * put once. */
    dp__map seen;
    dp__map_init_str(&seen);
    rehome rh = {c, &pl, o, sum, 0, 0, sum->copies > 1 ? &seen : NULL};
    for (uint32_t i = 0; i < pl.n && rc == DP_OK; i++)
        rc = rehome_unit(&rh, i, d);
    if (rc == DP_OK)
        dp__ckpt_say(o,
                     "re-homed %s: %" PRIu64 " keys from %" PRIu64 " blobs (%" PRIu64
                     " copies skipped)",
                     sum->checkpoint, rh.keys, sum->loaded, rh.skipped);
    dp__map_fini(&seen);
    plan_fini(&pl);
    return rc;
}
