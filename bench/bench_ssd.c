/*
 * Benchmark of the unit's SSD tier: spill and stage throughput, next to a
 * plain sequential write and read of the same bytes to the same directory in
 * the same run (the disk's limit), as ratios.
 *
 * Usage: bench_ssd [dir] [total_MiB] [blob_MiB] [io_threads] [staging_MiB]
 * (defaults: /tmp 512 4 4 64). The unit is in-process (no UCX): a put is
 * alloc(spill) + a memcpy into the IO region (the client's WRITE) + commit
 * polled until "done"; a get is resolve (pending until staged) + a memcpy out
 * of the staged copy (the READ) + unpin. The put area is 4 KiB, so every blob
 * spills. Up to staging / blob puts (or gets) are in flight at once.
 *
 * Fairness, the same on both sides:
 *   - the write figures include getting the data onto the disk: the plain
 *     write ends with fsync, the spill phase with syncfs() on ssd_dir (the
 *     unit's files are unlinked; syncfs reaches them);
 *   - the read figures start from a cold page cache for those files:
 *     posix_fadvise(POSIX_FADV_DONTNEED) after the sync, on the plain file and
 *     on every spill file (found through /proc/self/fd).
 * No O_DIRECT and no global drop_caches: nothing outside these files is
 * disturbed.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "blob/blob.h"
#include "common/common.h"
#include "unit/unit.h"

static void
die(const char *what, const dp_detail *d)
{
    fprintf(stderr, "bench_ssd: %s: %s\n", what, d != NULL ? dp_detail_msg(d) : "");
    exit(1);
}

/* A one-entry blob "<g>@x" of plen payload bytes, laid out into dst. */
static uint64_t
blob_len(uint64_t plen)
{
    dp__blob_builder *b = NULL;
    dp__blob_builder_create(0, &b, NULL);
    dp__blob_entry_spec s = {0};
    s.key = "18446744073709551615@x";
    s.kind = DP_BLOB_BYTES;
    s.len = plen;
    dp__blob_builder_add(b, &s, NULL, NULL);
    dp__blob_layout lay;
    dp__blob_builder_layout(b, &lay, NULL);
    dp__blob_builder_destroy(b);
    return lay.total_len;
}

static void
blob_write(uint8_t *dst, uint64_t cap, uint64_t g, const uint8_t *payload, uint64_t plen)
{
    char key[48];
    snprintf(key, sizeof key, "%" PRIu64 "@x", g);
    dp__blob_builder *b = NULL;
    dp_detail d;
    dp_detail_clear(&d);
    if (dp__blob_builder_create(0, &b, &d) != 0)
        die("builder", &d);
    dp__blob_entry_spec s = {0};
    s.key = key;
    s.kind = DP_BLOB_BYTES;
    s.len = plen;
    s.payload = payload;
    if (dp__blob_builder_add(b, &s, NULL, &d) != 0)
        die("builder add", &d);
    dp__blob_layout lay;
    if (dp__blob_builder_layout(b, &lay, &d) != 0 || lay.total_len > cap ||
        dp__blob_builder_write(b, dst, cap, &d) != 0 ||
        dp__blob_builder_copy_payloads(b, dst, cap, &d) != 0)
        die("builder write", &d);
    dp__blob_builder_destroy(b);
}

/* fds of this process that point into dir (the unit's unlinked files). */
static void
fadvise_spill_files(const char *dir)
{
    DIR *dh = opendir("/proc/self/fd");
    if (dh == NULL)
        return;
    struct dirent *e;
    size_t dl = strlen(dir);
    while ((e = readdir(dh)) != NULL) {
        char p[300], t[4096];
        snprintf(p, sizeof p, "/proc/self/fd/%s", e->d_name);
        ssize_t k = readlink(p, t, sizeof t - 1);
        if (k <= 0)
            continue;
        t[k] = '\0';
        if (strncmp(t, dir, dl) == 0 && t[dl] == '/')
            posix_fadvise(atoi(e->d_name), 0, 0, POSIX_FADV_DONTNEED);
    }
    closedir(dh);
}

static void
sync_dir(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY);
    if (fd < 0 || syncfs(fd) != 0) {
        perror("bench_ssd: syncfs");
        exit(1);
    }
    close(fd);
}

/* What the arguments ask for, and the sizes that follow from them. */
typedef struct ssd_cfg {
    const char *base;
    uint64_t total, bsz, staging;
    uint32_t threads;
    uint64_t n;    /* blobs */
    uint64_t plen; /* payload bytes per blob */
    uint64_t blen; /* laid-out bytes per blob */
} ssd_cfg;

/* 0, or 2 after printing the usage line. */
static int
parse_args(int argc, char **argv, ssd_cfg *c)
{
    c->base = argc > 1 ? argv[1] : "/tmp";
    c->total = (argc > 2 ? strtoull(argv[2], NULL, 10) : 512) << 20;
    c->bsz = (argc > 3 ? strtoull(argv[3], NULL, 10) : 4) << 20;
    c->threads = argc > 4 ? (uint32_t)strtoul(argv[4], NULL, 10) : 4;
    c->staging = (argc > 5 ? strtoull(argv[5], NULL, 10) : 64) << 20;
    c->n = c->total / c->bsz;
    if (c->n == 0 || c->bsz == 0 || c->threads == 0 || c->staging < 2 * c->bsz) {
        fprintf(stderr, "usage: bench_ssd [dir] [total_MiB] [blob_MiB] [io_threads] "
                        "[staging_MiB >= 2 blobs]\n");
        return 2;
    }
    return 0;
}

/* The in-process unit: a 4 KiB put area, so every blob spills into dir. */
static dp__unit *
unit_open(const ssd_cfg *c, const char *dir)
{
    dp__unit_opts o;
    dp__unit_opts_init(&o);
    o.slab_bytes = 4096;
    o.numa = DP_UNIT_NUMA_OFF;
    o.ssd_dir = dir;
    o.staging_bytes = c->staging;
    o.pickup_s = 0;
    o.io_threads = c->threads;
    o.read_pin_s = 600;
    dp__unit *u = NULL;
    dp_detail d;
    dp_detail_clear(&d);
    if (dp__unit_create(&o, &u, &d) != 0)
        die("unit", &d);
    return u;
}

static void
blob_id(char *id, size_t cap, uint64_t g)
{
    snprintf(id, cap, "b%" PRIu64, g);
}

/*
 * One put of blob g: alloc(spill), WRITE, commit. False when the IO area is
 * full (try again later); a commit still pending is marked in pend.
 */
static bool
spill_put(dp__unit *u, const ssd_cfg *c, const uint8_t *payload, uint64_t g,
          uint8_t *pend, uint64_t *done)
{
    char id[32];
    blob_id(id, sizeof id, g);
    dp_detail d;
    dp_detail_clear(&d);
    dp__wire_alloc_args aa = {
        .blob_id = dp__wire_s(id), .nbytes = c->blen, .n_entries = 1, .spill = true};
    dp__wire_alloc_res ar;
    int rc = dp__unit_alloc_req(u, &aa, &ar, NULL, &d);
    if (rc == DP_EBUSY)
        return false;
    if (rc != 0)
        die("alloc", &d);
    uint64_t off = ar.off;
    blob_write(dp__unit_slab(u) + off, c->blen, g, payload, c->plen);
    dp__blob_header_set_alloc(dp__unit_slab(u) + off, dp__unit_incarnation(u),
                              dp__unit_alloc_token(u, id, strlen(id)));
    dp__wire_commit_state st;
    if (dp__unit_commit(u, id, strlen(id), &st, &d) != 0)
        die("commit", &d);
    if (st == DP_WIRE_COMMIT_DONE)
        (*done)++;
    else if (st == DP_WIRE_COMMIT_PENDING)
        pend[g] = 1;
    else
        die("spill lost", NULL);
    return true;
}

/* Commit again every pending put below next; the ones done are counted. */
static void
spill_poll(dp__unit *u, uint8_t *pend, uint64_t next, uint64_t *done)
{
    char id[32];
    dp_detail d;
    dp_detail_clear(&d);
    for (uint64_t i = 0; i < next; i++) {
        if (!pend[i])
            continue;
        dp__wire_commit_state st;
        blob_id(id, sizeof id, i);
        if (dp__unit_commit(u, id, strlen(id), &st, &d) != 0)
            die("commit", &d);
        if (st == DP_WIRE_COMMIT_LOST)
            die("spill lost", NULL);
        if (st == DP_WIRE_COMMIT_DONE) {
            pend[i] = 0;
            (*done)++;
        }
    }
}

/* Spill: puts with as many in flight as the IO area takes, then syncfs. Seconds. */
static double
spill_phase(dp__unit *u, const ssd_cfg *c, const char *dir, const uint8_t *payload,
            uint8_t *pend)
{
    double t0 = dp__now_s();
    uint64_t next = 0, done = 0;
    while (done < c->n) {
        bool progress = false;
        if (next < c->n && spill_put(u, c, payload, next, pend, &done)) {
            next++;
            progress = true;
        }
        if (!progress) {
            spill_poll(u, pend, next, &done);
            dp__sleep_s(0.0002);
        }
    }
    sync_dir(dir);
    return dp__now_s() - t0;
}

/* One resolve of blob g; true when it was staged and READ into dst (then unpinned). */
static bool
stage_get(dp__unit *u, const ssd_cfg *c, uint64_t g, uint8_t *dst)
{
    char id[32];
    blob_id(id, sizeof id, g);
    dp__wire_str s = {id, (uint32_t)strlen(id)};
    dp__unit_resolve_res r;
    dp_detail d;
    dp_detail_clear(&d);
    dp__unit_lock(u);
    int rc = dp__unit_resolve_locked(u, &s, 1, &r, &d);
    dp__unit_unlock(u);
    if (rc != 0)
        die("resolve", &d);
    if (r.n_failed > 0 || r.n_missing > 0)
        die("stage failed", NULL);
    bool got = r.n_blobs == 1;
    if (got) {
        memcpy(dst, dp__unit_slab(u) + r.blobs[0].off, c->blen); /* the READ */
        dp__unit_unpin(u, r.pin_id, strlen(r.pin_id));
    }
    dp__unit_resolve_res_fini(&r);
    return got;
}

/* Stage: gets, as many in flight as the IO area takes. Seconds. */
static double
stage_phase(dp__unit *u, const ssd_cfg *c, uint8_t *dst, uint8_t *pend)
{
    double t0 = dp__now_s();
    uint64_t got = 0, next = 0;
    memset(pend, 0, c->n);
    uint64_t window = c->staging / c->blen;
    uint64_t inflight = 0;
    while (got < c->n) {
        /* ask for the next ones, up to the window */
        for (; next < c->n && inflight < window; next++, inflight++)
            pend[next] = 1;
        for (uint64_t i = 0; i < next; i++) {
            if (pend[i] != 1 || !stage_get(u, c, i, dst))
                continue;
            pend[i] = 2;
            got++;
            inflight--;
        }
        if (got < c->n)
            dp__sleep_s(0.0002);
    }
    return dp__now_s() - t0;
}

/* n copies of buf, each written (wr) or read in full; exits on an error. */
static void
plain_io(int fd, uint8_t *buf, uint64_t len, uint64_t n, int wr)
{
    for (uint64_t i = 0; i < n; i++) {
        uint64_t w = 0;
        while (w < len) {
            ssize_t k = wr ? write(fd, buf + w, len - w) : read(fd, buf + w, len - w);
            if (k < 0 && errno == EINTR)
                continue;
            if (k <= 0) {
                perror(wr ? "bench_ssd: write" : "bench_ssd: read");
                exit(1);
            }
            w += (uint64_t)k;
        }
    }
}

/* The disk's limit: one sequential file, same bytes, same dir. Seconds each. */
static void
plain_phase(const ssd_cfg *c, const char *dir, const uint8_t *payload, uint8_t *dst,
            double *t_write, double *t_read)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/plain", dir);
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
    if (fd < 0) {
        perror("bench_ssd: open");
        exit(1);
    }
    blob_write(dst, c->blen, 0, payload, c->plen);
    double t0 = dp__now_s();
    plain_io(fd, dst, c->blen, c->n, 1);
    fsync(fd);
    *t_write = dp__now_s() - t0;
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    lseek(fd, 0, SEEK_SET);
    t0 = dp__now_s();
    plain_io(fd, dst, c->blen, c->n, 0);
    *t_read = dp__now_s() - t0;
    close(fd);
    unlink(path);
}

static void
print_results(const ssd_cfg *c, double t_spill, double t_stage, double t_write,
              double t_read, const dp__unit_stats *st)
{
    double gb = (double)(c->n * c->blen) / 1e9;
    printf("spill (put: alloc+WRITE+commit..done, +syncfs): %6.2f GB/s  (%.3f s)\n",
           gb / t_spill, t_spill);
    printf("plain write + fsync, same bytes, same dir:      %6.2f GB/s  (%.3f s)\n",
           gb / t_write, t_write);
    printf("stage (get: resolve..staged+READ+unpin, cold):   %6.2f GB/s  (%.3f s)\n",
           gb / t_stage, t_stage);
    printf("plain read, cold (POSIX_FADV_DONTNEED):          %6.2f GB/s  (%.3f s)\n",
           gb / t_read, t_read);
    printf("ratio spill / plain write: %.2f\n", t_write / t_spill);
    printf("ratio stage / plain read:  %.2f\n", t_read / t_stage);
    printf("unit: %" PRIu64 " spills, %" PRIu64 " stages, %" PRIu64 " evictions\n",
           st->spills, st->stages, st->evictions);
}

int
main(int argc, char **argv)
{
    ssd_cfg c;
    if (parse_args(argc, argv, &c) != 0)
        return 2;
    dp__log_set_level(DP_LOG_WARN);
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/dp-bench-ssd-XXXXXX", c.base);
    if (mkdtemp(dir) == NULL) {
        perror("bench_ssd: mkdtemp");
        return 1;
    }
    c.plen = c.bsz - 4096;
    c.blen = blob_len(c.plen);
    uint8_t *payload = malloc(c.plen), *dst = malloc(c.blen);
    for (uint64_t i = 0; i < c.plen; i++)
        payload[i] = (uint8_t)(i * 131 + 7);

    dp__unit *u = unit_open(&c, dir);
    printf("bench_ssd: %s, %" PRIu64 " blobs of %.1f MiB (%.0f MiB), %u io threads, "
           "IO area %.0f MiB\n",
           dir, c.n, (double)c.blen / (1 << 20), (double)(c.n * c.blen) / (1 << 20),
           c.threads, (double)c.staging / (1 << 20));

    uint8_t *pend = calloc(c.n, 1);
    double t_spill = spill_phase(u, &c, dir, payload, pend);
    fadvise_spill_files(dir);
    double t_stage = stage_phase(u, &c, dst, pend);
    if (memcmp(dst + c.blen - c.plen, payload, c.plen) != 0)
        die("staged bytes differ", NULL);
    dp__unit_stats st;
    dp__unit_get_stats(u, &st);
    dp__unit_destroy(u);

    double t_write, t_read;
    plain_phase(&c, dir, payload, dst, &t_write, &t_read);
    rmdir(dir);

    print_results(&c, t_spill, t_stage, t_write, t_read, &st);
    free(pend);
    free(payload);
    free(dst);
    return 0;
}
