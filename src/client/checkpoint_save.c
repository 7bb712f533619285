/*
 * A cluster checkpoint's save (checkpoint.h has the layout and the crash
 * guarantees; checkpoint.c what save and load share): every unit writes its
 * shard at once (save_shard), the client takes each file's size and CRC32C
 * into the checkpoint's manifest, writes it, then makes it the current one
 * (DIR/MANIFEST.json); older checkpoints are pruned when asked (opts.keep).
 */
#include "client/checkpoint_int.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/fileio.h"

static int
cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/*
 * Remove checkpoint directory adir/name: its regular files, then itself.
 * Anything else inside (a subdirectory, a link) makes it stay. Best effort.
 */
static bool
remove_ckpt_dir(const char *adir, const char *name)
{
    char sub[PATH_MAX];
    if (snprintf(sub, sizeof sub, "%s/%s", adir, name) >= (int)sizeof sub)
        return false;
    int dfd = open(sub, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (dfd < 0)
        return false;
    DIR *dir = fdopendir(dfd);
    if (dir == NULL) {
        close(dfd);
        return false;
    }
    struct dirent *e;
    while ((e = readdir(dir)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        struct stat st;
        if (fstatat(dfd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode))
            unlinkat(dfd, e->d_name, 0);
    }
    closedir(dir);
    return rmdir(sub) == 0;
}

/*
 * After a save of `current` into adir: remove the ckpt-* directories older
 * than it beyond the keep - 1 newest (names sort by time). Newer ones are
 * another save's, possibly running: never touched.
 */
static void
prune(const char *adir, const char *current, uint32_t keep, const dp_ckpt_opts *o)
{
    DIR *dir = opendir(adir);
    if (dir == NULL)
        return;
    char **older = NULL;
    size_t n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(dir)) != NULL) {
        if (strncmp(e->d_name, "ckpt-", 5) != 0 || strcmp(e->d_name, current) >= 0)
            continue;
        if (n == cap) {
            size_t nc = cap ? 2 * cap : 16;
            char **no = realloc(older, nc * sizeof *no);
            if (no == NULL)
                break;
            older = no;
            cap = nc;
        }
        if ((older[n] = strdup(e->d_name)) == NULL)
            break;
        n++;
    }
    closedir(dir);
    if (n > 0)
        qsort(older, n, sizeof *older, cmp_str);
    size_t keep_older = keep - 1;
    for (size_t i = 0; i + keep_older < n; i++) {
        if (remove_ckpt_dir(adir, older[i]))
            dp__ckpt_say(o, "removed old checkpoint %s", older[i]);
        else
            dp__ckpt_say(o, "could not remove old checkpoint %s/%s", adir, older[i]);
    }
    for (size_t i = 0; i < n; i++)
        free(older[i]);
    free(older);
}

static int
fsync_dir(const char *dir, dp_detail *d)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return dp__fail_sys(d, errno, "opening directory %s", dir);
    int rc = 0;
    if (fsync(fd) != 0)
        rc = dp__fail_sys(d, errno, "fsync of directory %s", dir);
    close(fd);
    return rc;
}

/* Write data to path: path.tmp, fsync, rename, fsync of dir. */
static int
write_atomic(const char *dir, const char *path, const char *data, size_t len,
             dp_detail *d)
{
    /* A name of its own: two saves into one DIR must never share a temporary. */
    char tmp[PATH_MAX], rnd[33];
    int rc = dp__random_hex_id(rnd, d);
    if (rc != 0)
        return rc;
    snprintf(tmp, sizeof tmp, "%s.tmp.%.16s", path, rnd);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd < 0)
        return dp__fail_sys(d, errno, "creating %s", tmp);
    rc = dp__write_full(fd, data, len, 0, tmp, d);
    if (rc == 0 && fsync(fd) != 0)
        rc = dp__fail_sys(d, errno, "fsync of %s", tmp);
    if (close(fd) != 0 && rc == 0)
        rc = dp__fail_sys(d, errno, "closing %s", tmp);
    if (rc == 0 && rename(tmp, path) != 0)
        rc = dp__fail_sys(d, errno, "renaming %s to %s", tmp, path);
    if (rc != 0) {
        unlink(tmp);
        return rc;
    }
    rc = fsync_dir(dir, d);
    if (rc != 0)
        dp__fail_ctx(d, rc, "%s is in place but may not be durable yet", path);
    return rc;
}

/* What every unit of a save is asked. */
typedef struct save_ask {
    char (*paths)[PATH_MAX];
    bool home; /* replicas: each row saved once, by its first unit */
} save_ask;

static bool
save_req(uint32_t i, dp__wire_request *q, void *ctx)
{
    const save_ask *sa = ctx;
    q->op = DP_WIRE_OP_SAVE_SHARD;
    q->a.save_shard = (dp__wire_save_shard_args){dp__wire_s(sa->paths[i]), sa->home};
    return true;
}

/*
 * The manifest's entry of every unit of a save (f holds their answers):
 * each shard's and rows file's size and CRC32C, checked against what the
 * unit wrote; sum and progress lines.
 */
static int
manifest_units(cJSON *units, const dp__fanout *f, char (*paths)[PATH_MAX], uint32_t n,
               const dp_ckpt_opts *o, dp_ckpt_summary *sum, dp_detail *d)
{
    int rc = DP_OK;
    for (uint32_t i = 0; i < n; i++) {
        const dp__wire_save_shard_res *r = &f->u[i].rep.r.save_shard;
        char rows[PATH_MAX + 8];
        snprintf(rows, sizeof rows, "%s.rows", paths[i]);
        uint32_t scrc = 0, rcrc = 0;
        uint64_t ssize = 0, rsize = 0;
        if ((rc = dp__ckpt_file_crc(paths[i], &scrc, &ssize, d)) != 0 ||
            (rc = dp__ckpt_file_crc(rows, &rcrc, &rsize, d)) != 0)
            return rc;
        if (ssize != r->nbytes)
            return dp__fail(d, DP_ECORRUPT,
                            "%s: %" PRIu64 " bytes, unit %u wrote %" PRIu64, paths[i],
                            ssize, i, r->nbytes);
        cJSON *u = cJSON_CreateObject();
        cJSON_AddItemToArray(units, u);
        char name[64];
        cJSON_AddNumberToObject(u, "unit", i);
        snprintf(name, sizeof name, "unit-%u.shard", i);
        cJSON_AddStringToObject(u, "shard", name);
        snprintf(name, sizeof name, "unit-%u.shard.rows", i);
        cJSON_AddStringToObject(u, "rows", name);
        cJSON_AddNumberToObject(u, "nbytes", (double)r->nbytes);
        cJSON_AddNumberToObject(u, "shard_crc32c", scrc);
        cJSON_AddNumberToObject(u, "rows_crc32c", rcrc);
        cJSON *bl = cJSON_AddObjectToObject(u, "blobs");
        if (bl == NULL)
            return dp__fail(d, DP_ENOMEM, "checkpoint: out of memory");
        for (uint32_t k = 0; k < r->blobs.n; k++) {
            const dp__wire_shard_blob *x = &r->blobs.v[k];
            char id[128];
            snprintf(id, sizeof id, "%.*s", (int)x->id.n, x->id.p);
            double v[3] = {(double)x->off, (double)x->nbytes, (double)x->refs};
            cJSON_AddItemToObject(bl, id, cJSON_CreateDoubleArray(v, 3));
        }
        sum->blobs += r->blobs.n;
        sum->bytes += r->nbytes;
        sum->clears_during_save += r->clears_during_save;
        dp__ckpt_say(o,
                     "unit %u: %u blobs, %" PRIu64 " bytes (%" PRIu64
                     " clears during the save)",
                     i, r->blobs.n, r->nbytes, r->clears_during_save);
    }
    return rc;
}

/*
 * Make DIR (adir) if it is new, durably; name the new checkpoint (UTC to the
 * microsecond: names sort in save order, prune relies on it) into
 * sum->checkpoint and create its directory sub.
 */
static int
save_dirs(const char *adir, char sub[PATH_MAX], dp_ckpt_summary *sum, dp_detail *d)
{
    int rc;
    if (mkdir(adir, 0755) == 0) {
        /* A new DIR: its own entry must be durable too. */
        char parent[PATH_MAX];
        snprintf(parent, sizeof parent, "%s", adir);
        char *slash = strrchr(parent, '/');
        if (slash != NULL) {
            if (slash == parent)
                slash[1] = '\0';
            else
                *slash = '\0';
            if ((rc = fsync_dir(parent, d)) != 0)
                return dp__fail_ctx(d, rc, "checkpoint: creating %s", adir);
        }
    } else if (errno != EEXIST) {
        return dp__fail_sys(d, errno, "checkpoint: creating %s", adir);
    }
    char rnd[33], ts[32];
    if ((rc = dp__random_hex_id(rnd, d)) != 0)
        return rc;
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    struct tm tmv;
    gmtime_r(&now.tv_sec, &tmv);
    strftime(ts, sizeof ts, "%Y%m%dT%H%M%S", &tmv);
    snprintf(sum->checkpoint, sizeof sum->checkpoint, "ckpt-%s.%06dZ-%.8s", ts,
             (int)(now.tv_nsec / 1000), rnd);
    if ((rc = dp__ckpt_pathf(sub, PATH_MAX, d, "%s/%s", adir, sum->checkpoint)) != 0)
        return rc;
    if (mkdir(sub, 0755) != 0)
        return dp__fail_sys(d, errno, "checkpoint: creating %s", sub);
    return DP_OK;
}

/*
 * Best effort after a failed save: remove what it wrote. A unit that did
 * not answer in time may still create its files later; the directory then
 * stays, never referenced by a manifest.
 */
static void
save_undo(const char *sub, char (*paths)[PATH_MAX], uint32_t n)
{
    char p[PATH_MAX + 32];
    for (uint32_t i = 0; paths != NULL && i < n; i++) {
        if (paths[i][0] == '\0')
            continue;
        unlink(paths[i]);
        snprintf(p, sizeof p, "%s.rows", paths[i]);
        unlink(p);
    }
    snprintf(p, sizeof p, "%s/manifest.json", sub);
    unlink(p);
    snprintf(p, sizeof p, "%s/manifest.json.tmp", sub);
    unlink(p);
    rmdir(sub);
}

int
dp__ckpt_save_units(dp__ctl_client *c, const dp__cluster *cl, const char *dir,
                    const dp_ckpt_opts *o, dp_ckpt_summary *sum, dp_detail *d)
{
    dp_ckpt_opts defo;
    char adir[PATH_MAX], sub[PATH_MAX];
    int rc = dp__ckpt_begin(&o, &defo, sum, dir, adir, d);
    if (rc == 0)
        rc = save_dirs(adir, sub, sum, d);
    if (rc != 0)
        return rc;
    sum->n_units = cl->n_units;
    sum->replicas = cl->replicas > 0 ? cl->replicas : 1;
    sum->copies = 1;

    uint32_t n = cl->n_units;
    dp__fanout f;
    char(*paths)[PATH_MAX] = calloc(n, sizeof *paths);
    cJSON *man = cJSON_CreateObject(), *units = NULL;
    char *text = NULL;
    bool flipping = false; /* DIR's manifest may name this checkpoint: keep it */
    if ((rc = dp__fanout_init(&f, n, d)) != 0) {
        free(paths);
        cJSON_Delete(man);
        rmdir(sub);
        return rc;
    }
    dp__wire_rid_gen g;
    if (paths == NULL || man == NULL) {
        rc = dp__fail(d, DP_ENOMEM, "checkpoint: out of memory");
        goto out;
    }
    if ((rc = dp__wire_rid_gen_init(&g, d)) != 0)
        goto out;
    for (uint32_t i = 0; i < n; i++)
        if ((rc = dp__ckpt_pathf(paths[i], PATH_MAX, d, "%s/unit-%u.shard", sub, i)) != 0)
            goto out;
    save_ask sa = {paths, sum->replicas > 1};
    if ((rc = dp__ckpt_ask_units(&f, &g, cl, save_req, &sa, d)) != 0)
        goto out;
    dp__ckpt_say(o, "saving %u units into %s", n, sub);
    if ((rc = dp__fanout_run(&f, c, o->timeout_s, NULL)) != 0) {
        rc = dp__ckpt_units_failed(&f, "checkpoint save", d);
        goto out;
    }
    cJSON_AddNumberToObject(man, "version", 1);
    cJSON_AddStringToObject(man, "checkpoint", sum->checkpoint);
    cJSON_AddNumberToObject(man, "n_units", n);
    /* Each row once, saved by its first unit; a load of the same number of
     * units makes each row's copies from its shard, whatever the cluster's
     * replicas (docs/design.md, "Checkpoints"). */
    if (sum->replicas > 1) {
        cJSON_AddNumberToObject(man, "replicas", sum->replicas);
        cJSON_AddNumberToObject(man, "copies", 1);
    }
    units = cJSON_AddArrayToObject(man, "units");
    if ((rc = manifest_units(units, &f, paths, n, o, sum, d)) != 0 ||
        (rc = fsync_dir(sub, d)) != 0)
        goto out;
    text = cJSON_Print(man);
    if (text == NULL) {
        rc = dp__fail(d, DP_ENOMEM, "checkpoint: out of memory");
        goto out;
    }
    char mpath[PATH_MAX + 32];
    snprintf(mpath, sizeof mpath, "%s/manifest.json", sub);
    if ((rc = write_atomic(sub, mpath, text, strlen(text), d)) != 0)
        goto out;
    /* The commit point: the current checkpoint becomes this one. */
    snprintf(mpath, sizeof mpath, "%s/%s", adir, DP_CKPT_MANIFEST);
    flipping = true;
    if ((rc = write_atomic(adir, mpath, text, strlen(text), d)) != 0)
        goto out;
    dp__ckpt_say(o, "saved %s: %" PRIu64 " blobs, %" PRIu64 " bytes", sum->checkpoint,
                 sum->blobs, sum->bytes);
    if (o->keep > 0)
        prune(adir, sum->checkpoint, o->keep, o);
out:
    if (rc != 0 && paths != NULL && !flipping)
        save_undo(sub, paths, n);
    free(text);
    cJSON_Delete(man);
    dp__fanout_fini(&f);
    free(paths);
    return rc;
}
