/*
 * The unit's SSD tier (docs/design.md, "SSD tier"): the IO area, the spill
 * and stage io jobs and their workers, the files they write and read, and
 * the rules that keep a late spill from undoing a later commit or release.
 *
 * Design notes
 * ------------
 * Layout. The unit's memory is one registered region (one endpoint
 * allocation, so one rkey and one metadata region): the put area at
 * [0, slab_bytes) and the IO area at [io_base, io_base + staging_bytes),
 * io_base = slab_bytes rounded up to 4 KiB. Every offset handed to a client
 * (alloc, resolve) is relative to that one base, whichever area it is in; each
 * area has its own dp__slab_alloc. A record's off/size name its current region
 * and its area (REC_AREA_PUT, REC_AREA_IO) says which allocator owns it.
 *
 * Spill. alloc(spill) that the put area cannot take gets an IO-area region
 * (a "spill"); the client WRITEs it like any region (uncommitted: lease and
 * abort rules as for the put area). Its commit validates the index (as for a
 * put) and queues a spill job instead of publishing, answering "pending"; the
 * job writes the region to a fresh file and, back under the lock, publishes
 * the record as a disk blob (fd set, region freed: the client's WRITE ended
 * before its commit) or, if the write failed, drops it (commit: "lost").
 *
 * Order. Commits are ordered when their index validates (commit_seq), not
 * when a spill's io job ends: a finished spill publishes only the keys whose
 * slot does not already point at a later commit, and not those a release
 * since its commit dropped (spill_keep, set by release_rows). A spill with no
 * key left is dropped (spills_superseded); its id is remembered for a while
 * (superseded list, SUPERSEDED_KEEP_S or the lease if longer) so that its
 * commit answers "done": it was ordered before what replaced it, as if it had
 * landed and been overwritten at once.
 * A validated spill that found the io queue full waits on the pend list: the
 * ticker queues it as slots free, and the lease never retires it (its WRITE
 * is done).
 *
 * Stage. A resolve of a disk blob without a staged copy allocates an IO-area
 * region (evicting unpinned staged copies, oldest first, past pickup_s or
 * already picked up) and queues a stage job that preads the file into it;
 * the resolve answers "pending". When the job ends the copy is "staged": later
 * resolves pin it and answer its offsets like any blob (REC_PICKED_UP). A copy
 * one resolve answers is pinned only at the end of that call, so a stage the
 * same call starts never evicts it (resolving_epoch). A staged
 * copy is evicted only with no pins; one that had a pin expire goes through
 * quarantine like any region. A failed stage answers "failed" once.
 *
 * Jobs. At most DP_UNIT_MAX_IO_JOBS jobs are queued or running; a ring of
 * that size feeds io_threads workers (io_cv on mu). A job owns its record's
 * region and fd while it runs (REC_JOB): nothing frees them meanwhile. A
 * record released while its job runs is REC_DOOMED: it leaves the table at
 * once and the job's end frees it; a spill aborted while its job runs is
 * REC_ABORTING(_RETIRE): the job's end frees (retires) it. File I/O (open, pread,
 * pwrite, close) runs only in the workers, never under mu: fds to close are
 * handed to the workers through a list (closes), so release never blocks
 * on the filesystem.
 *
 * Files. Each spill gets a new file: O_TMPFILE in ssd_dir where the
 * filesystem supports it (no name ever exists), else a fresh random name
 * (dp-spill-<32 hex>) opened O_EXCL and unlinked at once; the fd keeps the
 * data. Nothing a client sends reaches a path. Whatever kills the unit, the
 * kernel frees the files with the fds. The fallback leaves a name only if
 * the unit dies between its open and its unlink; the next unit created on
 * that directory removes such names (sweep_stale_names).
 *
 * States. A spill is REC_ALLOCATED until its commit validates, then
 * REC_VALIDATED (REC_ABORTING or REC_ABORTING_RETIRE if aborted while its job
 * runs) until its job ends; a disk blob is REC_PUBLISHED with REC_DISK, and
 * its copy in the IO area is REC_JOB while a stage runs, then REC_STAGED
 * (REC_PICKED_UP once a reader pinned it), or REC_STAGE_FAILED.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "alloc/slab_alloc.h"
#include "common/fileio.h"
#include "unit/unit_int.h"

/*
 * A fresh file in ssd_dir with no name left behind: O_TMPFILE when the
 * filesystem has it, else a random name opened O_EXCL and unlinked at once.
 * label gets a description for messages. Worker threads and create only.
 */
int
dp__ssd_new_file(dp__unit *u, bool try_tmpfile, int *out, char *label, size_t cap,
                 dp_detail *d)
{
#ifdef O_TMPFILE
    if (try_tmpfile) {
        int fd = open(u->ssd_dir, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
        if (fd >= 0) {
            snprintf(label, cap, "an O_TMPFILE file in %s", u->ssd_dir);
            *out = fd;
            return 0;
        }
    }
#else
    (void)try_tmpfile;
#endif
    char rnd[33];
    int rc = dp__random_hex_id(rnd, d);
    if (rc != 0)
        return rc;
    snprintf(label, cap, "%s/dp-spill-%s", u->ssd_dir, rnd);
    int fd = open(label, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0)
        return dp__fail_sys(d, errno, "ssd: creating %s", label);
    /* ENOENT: a starting unit swept the name first (see sweep_stale_names). */
    if (unlink(label) != 0 && errno != ENOENT) {
        int e = errno;
        close(fd);
        return dp__fail_sys(d, e, "ssd: unlinking %s", label);
    }
    *out = fd;
    return 0;
}

bool
dp__ssd_jobs_full_locked(const dp__unit *u)
{
    return u->q_n + u->n_running >= DP_UNIT_MAX_IO_JOBS;
}

/* Queue a job owning b's region (the caller checked jobs_full_locked). */
void
dp__ssd_submit_locked(dp__unit *u, int kind, blob_rec *b)
{
    DP_ASSERT(!dp__ssd_jobs_full_locked(u) && !(b->flags & REC_JOB) &&
              b->area != REC_AREA_NONE);
    dp__rec_flag_locked(b, REC_JOB, true);
    u->io_job_bytes += b->size;
    u->jobs[(u->q_head + u->q_n) % DP_UNIT_MAX_IO_JOBS] = (io_job){kind, b};
    u->q_n++;
    pthread_cond_signal(&u->io_cv);
}

/*
 * The entries a finished spill may still publish: not cleared by a release
 * since its commit (spill_keep), and not held at a higher version, or at the
 * same one by a later commit (dp__slot_wins_locked). *keep (malloc'd, one byte per entry)
 * is NULL when none remain.
 */
static int
spill_keep_locked(dp__unit *u, blob_rec *b, uint8_t **keep, uint32_t *kept, dp_detail *d)
{
    uint32_t n = dp__blob_count(b->parsed);
    uint8_t *k = malloc(n ? n : 1);
    if (k == NULL)
        return dp__fail(d, DP_ENOMEM, "spill of %s: out of memory", b->id);
    uint32_t c = 0;
    for (uint32_t i = 0; i < n; i++) {
        const dp__blob_entry *e = dp__blob_entry_at(b->parsed, i);
        bool live = b->spill_keep == NULL || b->spill_keep[i];
        if (live) {
            row *r = dp__map_get_u64(&u->rows, e->gidx);
            slot *s = dp__row_slot(r, e->field, (uint32_t)e->field_len);
            /* The higher version wins (docs/design.md, "Versions"). */
            if (s != NULL && s->b != NULL && dp__slot_wins_locked(s, b))
                live = false;
        }
        k[i] = live;
        c += live;
    }
    if (c == 0) {
        free(k);
        k = NULL;
    }
    *keep = k;
    *kept = c;
    return DP_OK;
}

void
dp__ssd_superseded_add_locked(dp__unit *u, const blob_rec *b, double now)
{
    dp__ssd_superseded_add_stale_locked(u, b, now, 0);
}

void
dp__ssd_superseded_add_stale_locked(dp__unit *u, const blob_rec *b, double now,
                                    uint64_t stale)
{
    superseded *x = calloc(1, sizeof *x);
    if (x == NULL)
        return; /* the commit answers "lost": a false alarm, never a false "done" */
    x->stale = stale;
    memcpy(x->id, b->id, b->id_len);
    x->id_len = (uint8_t)b->id_len;
    x->until = now + DP_MAX(SUPERSEDED_KEEP_S, u->o.alloc_lease_s);
    if (dp__map_put(&u->superseded, x->id, x->id_len, x, NULL) != 0) {
        free(x);
        return;
    }
    dp__list_insert_tail(&u->sup_order, &x->link);
}

void
dp__ssd_superseded_forget_locked(dp__unit *u, const char *id, size_t id_len)
{
    superseded *x = dp__map_del(&u->superseded, id, id_len);
    if (x != NULL)
        x->gone = true;
}

/* Forget superseded ids past their time. */
void
dp__ssd_superseded_expire_locked(dp__unit *u, double now)
{
    for (superseded *x; (x = DP_LIST_FIRST(&u->sup_order, superseded, link)) != NULL &&
                        (x->gone || x->until <= now);) {
        dp__list_remove(&u->sup_order, &x->link);
        if (!x->gone)
            dp__map_del(&u->superseded, x->id, x->id_len);
        free(x);
    }
}

/* A spill job ended (rc, fd): publish the disk blob or drop it. */
static void
spill_done_locked(dp__unit *u, blob_rec *b, int rc, int fd, const dp_detail *jd)
{
    double now = dp__unit_now(u);
    dp__rec_flag_locked(b, REC_JOB, false);
    u->io_job_bytes -= b->size;
    if (fd >= 0) {
        b->fd = fd;
        u->stats.files_open++;
    }
    dp_detail pd;
    dp_detail_clear(&pd);
    uint8_t *keep = NULL;
    if (rc == 0 && b->state == REC_VALIDATED) {
        uint32_t kept = 0;
        rc = spill_keep_locked(u, b, &keep, &kept, &pd);
        if (rc != 0)
            jd = &pd;
        else if (kept == 0) {
            u->stats.spills_superseded++; /* every key overwritten or released since */
            dp__ssd_superseded_add_locked(u, b, now);
        }
    }
    if (rc == 0 && b->state == REC_VALIDATED && keep != NULL) {
        dp__rec_flag_locked(
            b, REC_DISK,
            true); /* before publish: dp__rec_drop_locked counts disk blobs */
        u->stats.disk_blobs++;
        u->stats.disk_bytes += b->nbytes;
        rc = dp__rows_publish_locked(u, b, keep, now, &pd);
        free(keep);
        keep = NULL;
        if (rc == 0) {
            dp__rec_release_region_locked(u, b, now);
            u->stats.spills++;
            u->stats.spill_bytes += b->nbytes;
            return;
        }
        jd = &pd;
    }
    if (rc != 0) {
        u->stats.spills_failed++;
        DP_LOG_W("unit %u: spill of blob %s (%" PRIu64 " bytes) failed, commit answers "
                 "lost: %s",
                 u->o.unit_id, b->id, b->nbytes, dp_detail_msg(jd));
    }
    dp__map_del(&u->blobs, b->id, b->id_len);
    dp__list_remove(&u->pend, &b->pend_link);
    if (b->state == REC_ABORTING_RETIRE) {
        /* abort(in_flight): the client says a WRITE may still run. */
        dp__rec_close_later_locked(u, b);
        if (b->flags & REC_DISK) {
            u->stats.disk_blobs--;
            u->stats.disk_bytes -= b->nbytes;
        }
        dp__writers_retire(u->writers, b->writer, rec_writers_area(b), b->off, b->size);
        dp__rec_free_locked(u, b);
        return;
    }
    dp__rec_drop_locked(u, b, now);
}

/* A stage job ended: the copy is staged, or the stage failed. */
static void
stage_done_locked(dp__unit *u, blob_rec *b, int rc, const dp_detail *jd)
{
    double now = dp__unit_now(u);
    dp__rec_flag_locked(b, REC_JOB, false);
    u->io_job_bytes -= b->size;
    if (b->state == REC_DOOMED) { /* released while staging */
        dp__rec_drop_locked(u, b, now);
        return;
    }
    if (rc == 0) {
        b->staged_at = now;
        dp__rec_flag_locked(b, REC_PICKED_UP, false);
        dp__rec_staged_append_locked(u, b);
        u->stats.stages++;
        u->stats.stage_bytes += b->nbytes;
        return;
    }
    u->stats.stages_failed++;
    DP_LOG_W("unit %u: stage of blob %s (%" PRIu64 " bytes) failed: %s", u->o.unit_id,
             b->id, b->nbytes, dp_detail_msg(jd));
    dp__rec_release_region_locked(u, b, now);
    dp__rec_flag_locked(b, REC_STAGE_FAILED, true);
}

/* io worker: closes first (cheap, unbounded list), then one job at a time. */
static void *
io_main(void *arg)
{
    dp__unit *u = arg;
    pthread_mutex_lock(&u->mu);
    for (;;) {
        while (!u->io_stopping && u->q_n == 0 && u->n_closes == 0)
            pthread_cond_wait(&u->io_cv, &u->mu);
        if (u->n_closes > 0) {
            int fd = u->closes[--u->n_closes];
            pthread_mutex_unlock(&u->mu);
            close(fd);
            pthread_mutex_lock(&u->mu);
            continue;
        }
        if (u->io_stopping)
            break;
        io_job j = u->jobs[u->q_head];
        u->q_head = (u->q_head + 1) % DP_UNIT_MAX_IO_JOBS;
        u->q_n--;
        u->n_running++;
        blob_rec *b = j.b;
        uint8_t *p = u->slab + b->off;
        uint64_t n = b->nbytes;
        int fd = b->fd;
        char id[DP_UNIT_ID_MAX + 1];
        memcpy(id, b->id, sizeof id);
        pthread_mutex_unlock(&u->mu);

        dp_detail jd;
        dp_detail_clear(&jd);
        char label[512];
        int rc;
        if (j.kind == JOB_SPILL) {
            fd = -1;
            rc = dp__ssd_new_file(u, u->use_tmpfile, &fd, label, sizeof label, &jd);
            if (rc == 0 && (rc = dp__pwrite_full(fd, p, (size_t)n, 0, label, &jd)) != 0)
                dp__fail_ctx(&jd, rc, "ssd");
            if (rc != 0 && fd >= 0) {
                close(fd);
                fd = -1;
            }
        } else {
            snprintf(label, sizeof label, "the file of blob %s in %s", id, u->ssd_dir);
            size_t got = 0;
            rc = dp__pread_full(fd, p, (size_t)n, 0, &got, label, &jd);
            if (rc != 0)
                dp__fail_ctx(&jd, rc, "ssd");
            else if (got < n)
                rc = dp__fail_sys(&jd, EIO,
                                  "ssd: reading %s: the file ends at %zu bytes, the blob "
                                  "has %" PRIu64,
                                  label, got, n);
        }

        pthread_mutex_lock(&u->mu);
        u->n_running--;
        if (j.kind == JOB_SPILL)
            spill_done_locked(u, b, rc, fd, &jd);
        else
            stage_done_locked(u, b, rc, &jd);
    }
    pthread_mutex_unlock(&u->mu);
    return NULL;
}

/*
 * IO-area region of nbytes: free room, then quarantine that is due, then
 * unpinned staged copies (oldest first; one not picked up yet only after
 * pickup_s). DP_EBUSY (+reason) if jobs, staged copies or quarantine will
 * free enough, DP_EUNITFULL if nothing will, DP_ENOMEM.
 */
int
dp__ssd_io_alloc_locked(dp__unit *u, uint64_t nbytes, double now, uint64_t *off,
                        const char **reason, dp_detail *d)
{
    uint64_t o = 0;
    dp_detail ad;
    dp_detail_clear(&ad);
    int rc = dp__slab_alloc_alloc(u->io_alloc, nbytes, &o, &ad);
    if (rc == DP_EUNITFULL && dp__slab_alloc_sweep(u->io_alloc, now) > 0)
        rc = dp__slab_alloc_alloc(u->io_alloc, nbytes, &o, &ad);
    blob_rec *b = DP_LIST_FIRST(&u->staged, blob_rec, staged_link);
    while (rc == DP_EUNITFULL && b != NULL) {
        blob_rec *next = DP_LIST_NEXT(b, blob_rec, staged_link);
        /* A copy answered earlier in the running resolve is pinned at its end. */
        bool answered = u->resolving_epoch != 0 && b->res_epoch == u->resolving_epoch;
        if (b->n_pins == 0 && b->state != REC_ZOMBIE && !answered &&
            ((b->flags & REC_PICKED_UP) || now - b->staged_at >= u->o.pickup_s)) {
            dp__rec_staged_unlink_locked(u, b);
            dp__rec_release_region_locked(u, b, now);
            dp__rec_flag_locked(b, REC_PIN_EXPIRED,
                                false); /* the next copy is a new region */
            u->stats.evictions++;
            rc = dp__slab_alloc_alloc(u->io_alloc, nbytes, &o, &ad);
        }
        b = next;
    }
    if (rc == 0) {
        *off = o + u->io_base;
        return 0;
    }
    if (rc != DP_EUNITFULL)
        return dp__fail(d, rc == DP_ETOOBIG ? DP_EPROTO : rc, "%s", dp_detail_msg(&ad));
    dp__slab_alloc_stats st;
    dp__slab_alloc_get_stats(u->io_alloc, &st);
    uint64_t pending = st.quarantined_bytes + u->stats.staged_bytes + u->io_job_bytes;
    if (pending > 0 && st.free_bytes + pending >= nbytes) {
        const char *why = u->io_job_bytes > 0         ? "io jobs"
                          : u->stats.staged_bytes > 0 ? "staged copies"
                                                      : "quarantine";
        if (reason != NULL)
            *reason = why;
        return dp__fail(
            d, DP_EBUSY,
            "unit %u: no room for %" PRIu64 " bytes in the IO area now (largest "
            "free %" PRIu64 ", free %" PRIu64 "); %" PRIu64
            " bytes held by io jobs, %" PRIu64 " by staged copies and %" PRIu64
            " in quarantine will free: retry",
            u->o.unit_id, nbytes, st.largest_free, st.free_bytes, u->io_job_bytes,
            u->stats.staged_bytes, st.quarantined_bytes);
    }
    return dp__fail(d, DP_EUNITFULL,
                    "unit %u: no room for %" PRIu64
                    " bytes in the IO area (largest free %" PRIu64 ", free %" PRIu64
                    ") and nothing pending frees any",
                    u->o.unit_id, nbytes, st.largest_free, st.free_bytes);
}

/*
 * Start staging disk blob b: 0 (queued), DP_EBUSY (not now: the queue is full
 * or room will free), DP_EUNITFULL (it can never be staged now).
 */
static int
start_stage_locked(dp__unit *u, blob_rec *b, double now)
{
    DP_ASSERT((b->flags & REC_DISK) && !(b->flags & (REC_STAGED | REC_JOB)) &&
              b->area == REC_AREA_NONE);
    if (dp__ssd_jobs_full_locked(u))
        return DP_EBUSY;
    uint64_t o = 0;
    int rc = dp__ssd_io_alloc_locked(u, b->nbytes, now, &o, NULL, NULL);
    if (rc != 0)
        return rc == DP_EUNITFULL ? DP_EUNITFULL : DP_EBUSY;
    b->off = o;
    b->size = b->nbytes;
    dp__slab_alloc_size_of(u->io_alloc, o - u->io_base, &b->size);
    b->area = REC_AREA_IO;
    dp__rec_flag_locked(b, REC_STAGE_FAILED, false);
    dp__ssd_submit_locked(u, JOB_STAGE, b);
    return 0;
}

/* How a resolve answers for published blob b (once per call: epoch). */
int
dp__ssd_resolve_state_locked(dp__unit *u, blob_rec *b, uint64_t epoch, double now)
{
    if (!(b->flags & REC_DISK))
        return RES_READY;
    if (b->res_epoch == epoch)
        return b->res_state;
    int st;
    if (b->flags & REC_STAGED) {
        dp__rec_flag_locked(b, REC_PICKED_UP, true);
        st = RES_READY;
    } else if (b->flags & REC_JOB) {
        st = RES_PENDING;
    } else if (b->flags & REC_STAGE_FAILED) {
        dp__rec_flag_locked(b, REC_STAGE_FAILED,
                            false); /* reported once; the next resolve tries again */
        st = RES_FAILED;
    } else {
        u->resolving_epoch = epoch;
        int rc = start_stage_locked(u, b, now);
        u->resolving_epoch = 0;
        st = rc == DP_EUNITFULL ? RES_FAILED : RES_PENDING;
    }
    b->res_epoch = epoch;
    b->res_state = (uint8_t)st;
    return st;
}

/*
 * Remove names "dp-spill-<32 hex>" from ssd_dir: files of a unit killed
 * between the open and the unlink of the fallback path. A running unit that
 * loses such a name to this sweep loses nothing (its fd keeps the data and
 * new_file accepts ENOENT from its own unlink).
 */
static void
sweep_stale_names(dp__unit *u)
{
    DIR *dh = opendir(u->ssd_dir);
    if (dh == NULL)
        return;
    int dfd = dirfd(dh);
    unsigned n = 0;
    struct dirent *e;
    while ((e = readdir(dh)) != NULL) {
        const char *nm = e->d_name;
        if (strncmp(nm, "dp-spill-", 9) != 0 || strlen(nm) != 9 + 32 ||
            strspn(nm + 9, "0123456789abcdef") != 32)
            continue;
        if (unlinkat(dfd, nm, 0) == 0)
            n++;
    }
    closedir(dh);
    if (n > 0)
        DP_LOG_W("unit %u: removed %u stale spill file names from %s", u->o.unit_id, n,
                 u->ssd_dir);
}

/* Check ssd_dir, pick the file method and start the io threads. */
int
dp__ssd_open(dp__unit *u, dp_detail *d)
{
    struct stat sb;
    if (stat(u->ssd_dir, &sb) != 0)
        return dp__fail_sys(d, errno, "unit: ssd_dir %s", u->ssd_dir);
    if (!S_ISDIR(sb.st_mode))
        return dp__fail(d, DP_EINVAL, "unit: ssd_dir %s is not a directory", u->ssd_dir);
    sweep_stale_names(u);
    char label[512];
    int fd = -1;
    int rc = dp__ssd_new_file(u, !u->o.ssd_no_tmpfile, &fd, label, sizeof label, d);
    if (rc != 0)
        return rc;
    close(fd);
    u->use_tmpfile = strncmp(label, "an O_TMPFILE", 12) == 0;
    DP_LOG_D("unit %u: ssd_dir %s: files %s", u->o.unit_id, u->ssd_dir,
             u->use_tmpfile ? "O_TMPFILE" : "opened and unlinked");
    u->io_th = calloc(u->o.io_threads, sizeof *u->io_th);
    if (u->io_th == NULL)
        return dp__fail(d, DP_ENOMEM, "unit: out of memory");
    for (uint32_t i = 0; i < u->o.io_threads; i++) {
        int e = pthread_create(&u->io_th[i], NULL, io_main, u);
        if (e != 0)
            return dp__fail_sys(d, e, "unit: starting io thread %u", i);
        u->n_io_th++;
    }
    return 0;
}

/*
 * A release reaches spills committed but not yet published too: their entries
 * for those rows are marked so the io job's end does not bring them back.
 * Walks the blob table (SSD tier only); a spill's entries are looked up in a
 * set of the released rows.
 */
void
dp__ssd_release_spills_locked(dp__unit *u, const uint64_t *gidxs, uint32_t n,
                              uint64_t ver)
{
    dp__map set;
    dp__map_init_u64(&set);
    bool built = false;
    size_t it = 0;
    void *v;
    while (dp__map_next(&u->blobs, &it, NULL, NULL, NULL, &v)) {
        blob_rec *b = v;
        if (!rec_committing(b) || b->area != REC_AREA_IO || b->commit_seq == 0)
            continue;
        if (ver != 0 && b->ver > ver)
            continue; /* put after the clear, in version order: it publishes */
        if (!built) {
            for (uint32_t i = 0; i < n; i++)
                if (dp__map_put_u64(&set, gidxs[i], &set, NULL) != 0) {
                    /* Out of memory: mark nothing rather than guess. */
                    DP_LOG_W("unit %u: release of %u rows: no memory to mark pending "
                             "spills; a spill finishing later may bring rows back",
                             u->o.unit_id, n);
                    dp__map_fini(&set);
                    return;
                }
            built = true;
        }
        uint32_t ne = dp__blob_count(b->parsed);
        for (uint32_t i = 0; i < ne; i++) {
            const dp__blob_entry *e = dp__blob_entry_at(b->parsed, i);
            if (dp__map_get_u64(&set, e->gidx) == NULL)
                continue;
            if (b->spill_keep == NULL) {
                b->spill_keep = malloc(ne);
                if (b->spill_keep == NULL)
                    break;
                memset(b->spill_keep, 1, ne);
            }
            b->spill_keep[i] = 0;
        }
    }
    dp__map_fini(&set);
}

void
dp__ssd_stop(dp__unit *u)
{
    /* io threads: a running job ends (and completes) first. */
    pthread_mutex_lock(&u->mu);
    u->io_stopping = true;
    pthread_cond_broadcast(&u->io_cv);
    pthread_mutex_unlock(&u->mu);
    for (uint32_t i = 0; i < u->n_io_th; i++)
        pthread_join(u->io_th[i], NULL);
    free(u->io_th);
    u->io_th = NULL;
    u->n_io_th = 0;
    /* Queued jobs never run: their records give up the job. */
    for (uint32_t i = 0; i < u->q_n; i++) {
        blob_rec *b = u->jobs[(u->q_head + i) % DP_UNIT_MAX_IO_JOBS].b;
        dp__rec_flag_locked(b, REC_JOB, false);
        if (b->state == REC_DOOMED)
            dp__rec_drop_locked(u, b, 0);
    }
    u->q_n = 0;
}

void
dp__ssd_fini(dp__unit *u)
{
    for (size_t i = 0; i < u->n_closes; i++)
        close(u->closes[i]);
    free(u->closes);
    u->closes = NULL;
    u->n_closes = u->cap_closes = 0;
    dp__slab_alloc_destroy(u->io_alloc);
    u->io_alloc = NULL;
    free(u->ssd_dir);
    u->ssd_dir = NULL;
    dp__map_fini(&u->superseded);
    for (superseded *x; (x = DP_LIST_FIRST(&u->sup_order, superseded, link)) != NULL;) {
        dp__list_remove(&u->sup_order, &x->link);
        free(x);
    }
}
