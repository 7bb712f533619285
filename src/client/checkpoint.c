/*
 * Cluster checkpoints: drive save_shard / load_shard on every unit at once
 * (the fanout, client/fanout.h) and keep the manifest that makes a
 * checkpoint complete; re-home a checkpoint through a client, reading its
 * shards with the format's owner (blob/shard.h). See checkpoint.h for the
 * layout and the crash guarantees, include/dataplane/checkpoint.h for the
 * API.
 *
 * This file holds what save and load share (options, paths, the units'
 * requests) and the public save and load over a client's units;
 * checkpoint_save.c the save, checkpoint_load.c reading a checkpoint back
 * (load, peek, re-home); checkpoint_int.h what they share.
 */
#include "client/checkpoint_int.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "blob/crc32c.h"
#include "common/fileio.h"

#define DEFAULT_TIMEOUT_S 600.0

void
dp_ckpt_opts_init(dp_ckpt_opts *o)
{
    memset(o, 0, sizeof *o);
    o->timeout_s = DEFAULT_TIMEOUT_S;
}

void
dp__ckpt_say(const dp_ckpt_opts *o, const char *fmt, ...)
{
    if (o->progress == NULL)
        return;
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    o->progress(o->progress_ctx, line);
}

int
dp__ckpt_pathf(char *out, size_t cap, dp_detail *d, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(out, cap, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= cap)
        return dp__fail(d, DP_EINVAL, "checkpoint: path too long: %s...", out);
    return 0;
}

int
dp__ckpt_abs_dir(const char *dir, char *out, size_t cap, dp_detail *d)
{
    if (dir == NULL || dir[0] == '\0')
        return dp__fail(d, DP_EINVAL, "checkpoint: no directory given");
    int n;
    if (dir[0] == '/') {
        n = snprintf(out, cap, "%s", dir);
    } else {
        char cwd[PATH_MAX];
        if (getcwd(cwd, sizeof cwd) == NULL)
            return dp__fail_sys(d, errno, "checkpoint: getcwd");
        n = snprintf(out, cap, "%s/%s", cwd, dir);
    }
    if (n < 0 || (size_t)n >= cap || (size_t)n > 800)
        return dp__fail(d, DP_EINVAL, "checkpoint: directory path too long");
    for (const char *p = out; *p; p++)
        if ((unsigned char)*p < 0x20 || *p == 0x7f)
            return dp__fail(d, DP_EINVAL, "checkpoint: control character in the path");
    while (n > 1 && out[n - 1] == '/')
        out[--n] = '\0';
    return 0;
}

int
dp__ckpt_file_crc(const char *path, uint32_t *crc, uint64_t *size, dp_detail *d)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return dp__fail_sys(d, errno, "opening %s", path);
    size_t cap = (size_t)1 << 20;
    uint8_t *buf = malloc(cap);
    int rc = 0;
    uint32_t c = 0;
    uint64_t n = 0;
    if (buf == NULL) {
        rc = dp__fail(d, DP_ENOMEM, "checkpoint: out of memory");
        goto out;
    }
    /* A read that stops short of cap found the end of the file. */
    size_t got = cap;
    while (got == cap) {
        if ((rc = dp__pread_full(fd, buf, cap, n, &got, path, d)) != 0)
            goto out;
        c = dp__crc32c_update(c, buf, got);
        n += got;
    }
    *crc = c;
    *size = n;
out:
    free(buf);
    close(fd);
    return rc;
}

int
dp__ckpt_begin(const dp_ckpt_opts **o, dp_ckpt_opts *defo, dp_ckpt_summary *sum,
               const char *dir, char adir[PATH_MAX], dp_detail *d)
{
    if (sum == NULL)
        return dp__fail(d, DP_EINVAL, "checkpoint: NULL summary");
    memset(sum, 0, sizeof *sum);
    if (*o != NULL)
        *defo = **o;
    else
        memset(defo, 0, sizeof *defo);
    *o = defo;
    for (size_t i = 0; i < DP_ARRAY_LEN(defo->reserved); i++)
        if (defo->reserved[i] != 0)
            return dp__fail(d, DP_EINVAL,
                            "checkpoint: dp_ckpt_opts.reserved[%zu] is not zero (zero "
                            "the struct)",
                            i);
    if (defo->timeout_s == 0)
        defo->timeout_s = DEFAULT_TIMEOUT_S;
    if (!(defo->timeout_s > 0) || defo->timeout_s > 1e9)
        return dp__fail(d, DP_EINVAL,
                        "checkpoint: timeout_s %g (seconds > 0, or 0 for the default)",
                        defo->timeout_s);
    return dp__ckpt_abs_dir(dir, adir, PATH_MAX, d);
}

int
dp__ckpt_ask_units(dp__fanout *f, dp__wire_rid_gen *g, const dp__cluster *cl,
                   dp__fanout_req_fn q_of, void *ctx, dp_detail *d)
{
    dp__fanout_reset(f);
    for (uint32_t i = 0; i < cl->n_units; i++) {
        dp__wire_request q;
        memset(&q, 0, sizeof q);
        if (!q_of(i, &q, ctx))
            continue;
        int rc = dp__fanout_add(f, g, i, cl->units[i].zmq, 0, &q);
        if (rc != DP_OK)
            return dp__fail(d, rc, "checkpoint: %s", f->u[i].st.det.msg);
    }
    return DP_OK;
}

int
dp__ckpt_units_failed(const dp__fanout *f, const char *what, dp_detail *d)
{
    int rc = dp__fanout_first(f, d);
    return dp__fail_ctx(d, rc, "%s", what);
}

/*
 * The units c is connected to as a cluster (unit i at its address: the
 * client checked, at open or when binding a unit that was down then, that
 * unit i says it is unit i of n) and a control client of this call's own,
 * so a save or load never waits for c's lock and its requests never mix
 * with c's.
 */
static int
client_units(dp_client *c, dp__cluster *cl, dp__ctl_client **ctl, dp_detail *d)
{
    memset(cl, 0, sizeof *cl);
    *ctl = NULL;
    if (c == NULL)
        return dp__fail(d, DP_EINVAL, "checkpoint: NULL client");
    int rc = dp__client_bind_all(c, d);
    if (rc != DP_OK)
        return dp__fail_ctx(d, rc, "checkpoint: a unit was down when the client opened");
    uint32_t n = dp_client_n_units(c);
    cl->units = calloc(n > 0 ? n : 1, sizeof *cl->units);
    if (cl->units == NULL)
        return dp__fail(d, DP_ENOMEM, "checkpoint: out of memory");
    cl->n_units = n;
    cl->replicas = dp_client_replicas(c);
    for (uint32_t i = 0; i < n; i++) {
        cl->units[i].id = i;
        snprintf(cl->units[i].zmq, sizeof cl->units[i].zmq, "%s",
                 dp_client_unit_address(c, i));
    }
    rc = dp__ctl_client_create(ctl, d);
    if (rc != 0)
        dp__cluster_fini(cl);
    return rc;
}

int
dp_ckpt_save(dp_client *c, const char *dir, const dp_ckpt_opts *o, dp_ckpt_summary *sum,
             dp_detail *d)
{
    dp__cluster cl;
    dp__ctl_client *ctl;
    int rc = client_units(c, &cl, &ctl, d);
    if (rc != 0)
        return rc;
    rc = dp__ckpt_save_units(ctl, &cl, dir, o, sum, d);
    dp__ctl_client_destroy(ctl);
    dp__cluster_fini(&cl);
    return rc;
}

int
dp_ckpt_load(dp_client *c, const char *dir, const dp_ckpt_opts *o, dp_ckpt_summary *sum,
             dp_detail *d)
{
    dp__cluster cl;
    dp__ctl_client *ctl;
    int rc = client_units(c, &cl, &ctl, d);
    if (rc != 0)
        return rc;
    rc = dp__ckpt_load_units(ctl, &cl, dir, o, sum, d);
    dp__ctl_client_destroy(ctl);
    dp__cluster_fini(&cl);
    return rc;
}
