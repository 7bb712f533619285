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
    dp_blob_builder *b = NULL;
    dp__blob_builder_create(0, &b, NULL);
    dp_blob_entry_spec s = {0};
    s.key = "18446744073709551615@x";
    s.kind = DP_BLOB_BYTES;
    s.len = plen;
    dp__blob_builder_add(b, &s, NULL, NULL);
    dp_blob_layout lay;
    dp__blob_builder_layout(b, &lay, NULL);
    dp__blob_builder_destroy(b);
    return lay.total_len;
}

static void
blob_write(uint8_t *dst, uint64_t cap, uint64_t g, const uint8_t *payload, uint64_t plen)
{
    char key[48];
    snprintf(key, sizeof key, "%" PRIu64 "@x", g);
    dp_blob_builder *b = NULL;
    dp_detail d;
    dp_detail_clear(&d);
    if (dp__blob_builder_create(0, &b, &d) != 0)
        die("builder", &d);
    dp_blob_entry_spec s = {0};
    s.key = key;
    s.kind = DP_BLOB_BYTES;
    s.len = plen;
    s.payload = payload;
    if (dp__blob_builder_add(b, &s, NULL, &d) != 0)
        die("builder add", &d);
    dp_blob_layout lay;
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

int
main(int argc, char **argv)
{
    const char *base = argc > 1 ? argv[1] : "/tmp";
    uint64_t total = (argc > 2 ? strtoull(argv[2], NULL, 10) : 512) << 20;
    uint64_t bsz = (argc > 3 ? strtoull(argv[3], NULL, 10) : 4) << 20;
    uint32_t threads = argc > 4 ? (uint32_t)strtoul(argv[4], NULL, 10) : 4;
    uint64_t staging = (argc > 5 ? strtoull(argv[5], NULL, 10) : 64) << 20;
    uint64_t n = total / bsz;
    if (n == 0 || bsz == 0 || threads == 0 || staging < 2 * bsz) {
        fprintf(stderr, "usage: bench_ssd [dir] [total_MiB] [blob_MiB] [io_threads] "
                        "[staging_MiB >= 2 blobs]\n");
        return 2;
    }
    dp__log_set_level(DP_LOG_WARN);
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/dp-bench-ssd-XXXXXX", base);
    if (mkdtemp(dir) == NULL) {
        perror("bench_ssd: mkdtemp");
        return 1;
    }
    uint64_t plen = bsz - 4096;
    uint64_t blen = blob_len(plen);
    uint8_t *payload = malloc(plen), *dst = malloc(blen);
    for (uint64_t i = 0; i < plen; i++)
        payload[i] = (uint8_t)(i * 131 + 7);

    dp_unit_opts o;
    dp__unit_opts_init(&o);
    o.slab_bytes = 4096;
    o.numa = DP_UNIT_NUMA_OFF;
    o.ssd_dir = dir;
    o.staging_bytes = staging;
    o.pickup_s = 0;
    o.io_threads = threads;
    o.read_pin_s = 600;
    dp_unit *u = NULL;
    dp_detail d;
    dp_detail_clear(&d);
    if (dp__unit_create(&o, &u, &d) != 0)
        die("unit", &d);
    printf("bench_ssd: %s, %" PRIu64 " blobs of %.1f MiB (%.0f MiB), %u io threads, "
           "IO area %.0f MiB\n",
           dir, n, (double)blen / (1 << 20), (double)(n * blen) / (1 << 20), threads,
           (double)staging / (1 << 20));

    /* ---- spill: puts with as many in flight as the IO area takes ---- */
    char id[32];
    double t0 = dp__now_s();
    uint64_t next = 0, done = 0;
    uint8_t *pend = calloc(n, 1);
    while (done < n) {
        bool progress = false;
        if (next < n) {
            uint64_t off;
            snprintf(id, sizeof id, "b%" PRIu64, next);
            int rc =
                dp__unit_alloc_spill(u, id, strlen(id), blen, 1, true, &off, NULL, &d);
            if (rc == 0) {
                blob_write(dp__unit_slab(u) + off, blen, next, payload, plen);
                dp__blob_header_set_alloc(dp__unit_slab(u) + off, dp__unit_incarnation(u),
                                          dp__unit_alloc_token(u, id, strlen(id)));
                dp_wire_commit_state st;
                if (dp__unit_commit(u, id, strlen(id), &st, &d) != 0)
                    die("commit", &d);
                if (st == DP_WIRE_COMMIT_DONE)
                    done++;
                else if (st == DP_WIRE_COMMIT_PENDING)
                    pend[next] = 1;
                else
                    die("spill lost", NULL);
                next++;
                progress = true;
            } else if (rc != DP_EBUSY) {
                die("alloc", &d);
            }
        }
        if (!progress) {
            for (uint64_t i = 0; i < next; i++) {
                if (!pend[i])
                    continue;
                dp_wire_commit_state st;
                snprintf(id, sizeof id, "b%" PRIu64, i);
                if (dp__unit_commit(u, id, strlen(id), &st, &d) != 0)
                    die("commit", &d);
                if (st == DP_WIRE_COMMIT_LOST)
                    die("spill lost", NULL);
                if (st == DP_WIRE_COMMIT_DONE) {
                    pend[i] = 0;
                    done++;
                }
            }
            dp__sleep_s(0.0002);
        }
    }
    sync_dir(dir);
    double t_spill = dp__now_s() - t0;
    fadvise_spill_files(dir);

    /* ---- stage: gets, as many in flight as the IO area takes ---- */
    t0 = dp__now_s();
    uint64_t got = 0;
    next = 0;
    memset(pend, 0, n);
    uint64_t window = staging / blen;
    uint64_t inflight = 0;
    while (got < n) {
        /* ask for the next ones, up to the window */
        for (; next < n && inflight < window; next++, inflight++)
            pend[next] = 1;
        for (uint64_t i = 0; i < next; i++) {
            if (pend[i] != 1)
                continue;
            snprintf(id, sizeof id, "b%" PRIu64, i);
            dp_wire_str s = {id, (uint32_t)strlen(id)};
            dp_unit_resolve_res r;
            dp__unit_lock(u);
            int rc = dp__unit_resolve_locked(u, &s, 1, &r, &d);
            dp__unit_unlock(u);
            if (rc != 0)
                die("resolve", &d);
            if (r.n_failed > 0 || r.n_missing > 0)
                die("stage failed", NULL);
            if (r.n_blobs == 1) {
                memcpy(dst, dp__unit_slab(u) + r.blobs[0].off, blen); /* the READ */
                dp__unit_unpin(u, r.pin_id, strlen(r.pin_id));
                pend[i] = 2;
                got++;
                inflight--;
            }
            dp__unit_resolve_res_fini(&r);
        }
        if (got < n)
            dp__sleep_s(0.0002);
    }
    double t_stage = dp__now_s() - t0;
    if (memcmp(dst + blen - plen, payload, plen) != 0)
        die("staged bytes differ", NULL);
    dp_unit_stats st;
    dp__unit_get_stats(u, &st);
    dp__unit_destroy(u);

    /* ---- the disk's limit: one sequential file, same bytes, same dir ---- */
    char path[4200];
    snprintf(path, sizeof path, "%s/plain", dir);
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
    if (fd < 0) {
        perror("bench_ssd: open");
        return 1;
    }
    blob_write(dst, blen, 0, payload, plen);
    t0 = dp__now_s();
    for (uint64_t i = 0; i < n; i++) {
        uint64_t w = 0;
        while (w < blen) {
            ssize_t k = write(fd, dst + w, blen - w);
            if (k < 0 && errno == EINTR)
                continue;
            if (k <= 0) {
                perror("bench_ssd: write");
                return 1;
            }
            w += (uint64_t)k;
        }
    }
    fsync(fd);
    double t_write = dp__now_s() - t0;
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    lseek(fd, 0, SEEK_SET);
    t0 = dp__now_s();
    for (uint64_t i = 0; i < n; i++) {
        uint64_t r = 0;
        while (r < blen) {
            ssize_t k = read(fd, dst + r, blen - r);
            if (k < 0 && errno == EINTR)
                continue;
            if (k <= 0) {
                perror("bench_ssd: read");
                return 1;
            }
            r += (uint64_t)k;
        }
    }
    double t_read = dp__now_s() - t0;
    close(fd);
    unlink(path);
    rmdir(dir);

    double gb = (double)(n * blen) / 1e9;
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
           st.spills, st.stages, st.evictions);
    free(pend);
    free(payload);
    free(dst);
    return 0;
}
