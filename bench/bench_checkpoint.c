/*
 * Benchmark of unit checkpoints: save_shard and load_shard throughput next to
 * a plain sequential write and read of the same number of bytes to the same
 * directory in the same run (the disk's limit), as ratios.
 *
 * Usage: bench_checkpoint [dir] [total_MiB] [blob_MiB] (defaults: /tmp 512 4).
 * The unit is in-process (no UCX, no ZMQ): blobs are put with alloc + memcpy
 * + commit. Fairness, the same on both sides:
 *   - writes include getting the data onto the disk (the plain write ends
 *     with fsync; save_shard fsyncs its two files itself);
 *   - reads start from a cold page cache for those files (fsync, then
 *     posix_fadvise(POSIX_FADV_DONTNEED) on each file before reading);
 *   - the plain read lands in a buffer of the same size as the load's slab.
 * Load also checks every CRC32C and parses every blob's index: that cost is
 * part of its figure.
 */
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
    fprintf(stderr, "bench_checkpoint: %s: %s\n", what,
            d != NULL ? dp_detail_msg(d) : "");
    exit(1);
}

static dp__unit *
mk_unit(uint64_t slab)
{
    dp__unit_opts o;
    dp__unit_opts_init(&o);
    o.slab_bytes = slab;
    o.n_units = 1;
    o.numa = DP_UNIT_NUMA_OFF;
    dp__unit *u = NULL;
    dp_detail d;
    dp_detail_clear(&d);
    if (dp__unit_create(&o, &u, &d) != 0)
        die("unit", &d);
    return u;
}

static void
drop_cache(const char *path)
{
    int fd = open(path, O_RDONLY);
    if (fd < 0)
        return;
    fsync(fd);
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    close(fd);
}

int
main(int argc, char **argv)
{
    const char *dir = argc > 1 ? argv[1] : "/tmp";
    uint64_t total = (argc > 2 ? strtoull(argv[2], NULL, 0) : 512) << 20;
    uint64_t blob = (argc > 3 ? strtoull(argv[3], NULL, 0) : 4) << 20;
    if (blob == 0 || total < blob)
        die("usage: bench_checkpoint [dir] [total_MiB] [blob_MiB]", NULL);
    uint32_t n = (uint32_t)(total / blob);
    dp__log_set_level(DP_LOG_WARN);
    dp__unit *u = mk_unit(total + total / 8 + (1 << 20));
    dp_detail d;
    dp_detail_clear(&d);
    uint8_t *pay = malloc(blob);
    for (uint64_t k = 0; k < blob; k++)
        pay[k] = (uint8_t)(k * 7 + 3);
    uint64_t bytes = 0;
    for (uint32_t i = 0; i < n; i++) {
        dp__blob_builder *b = NULL;
        dp__blob_builder_create(0, &b, NULL);
        char key[32], id[32];
        snprintf(key, sizeof key, "%u@x", i);
        snprintf(id, sizeof id, "b%u", i);
        dp__blob_entry_spec s = {0};
        s.key = key;
        s.kind = DP_BLOB_BYTES;
        s.len = blob - 4096;
        s.payload = pay;
        dp__blob_builder_add(b, &s, NULL, NULL);
        dp__blob_layout lay;
        dp__blob_builder_layout(b, &lay, NULL);
        dp__wire_alloc_args aa = {
            .blob_id = dp__wire_s(id), .nbytes = lay.total_len, .n_entries = 1};
        dp__wire_alloc_res ar;
        if (dp__unit_alloc_req(u, &aa, &ar, NULL, &d) != 0)
            die("alloc", &d);
        uint64_t off = ar.off;
        dp__blob_builder_write(b, dp__unit_slab(u) + off, lay.total_len, NULL);
        dp__blob_builder_copy_payloads(b, dp__unit_slab(u) + off, lay.total_len, NULL);
        dp__blob_header_set_alloc(dp__unit_slab(u) + off, dp__unit_incarnation(u),
                                  dp__unit_alloc_token(u, id, strlen(id)));
        dp__blob_builder_destroy(b);
        dp__wire_commit_state st;
        if (dp__unit_commit(u, id, strlen(id), &st, &d) != 0)
            die("commit", &d);
        bytes += lay.total_len;
    }
    char plain[1024], shard[1024], rows[1100];
    snprintf(plain, sizeof plain, "%s/bench-ckpt-plain-%d", dir, (int)getpid());
    snprintf(shard, sizeof shard, "%s/bench-ckpt-shard-%d", dir, (int)getpid());
    snprintf(rows, sizeof rows, "%s.rows", shard);

    /* Plain write of the same bytes (from the same slab), then fsync. */
    double t0 = dp__now_s();
    int fd = open(plain, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0)
        die(plain, NULL);
    for (uint64_t done = 0; done < bytes;) {
        ssize_t w =
            write(fd, dp__unit_slab(u) + done, (size_t)DP_MIN(bytes - done, 1u << 26));
        if (w <= 0)
            die("plain write", NULL);
        done += (uint64_t)w;
    }
    fsync(fd);
    close(fd);
    double t_pw = dp__now_s() - t0;

    dp__unit_save_res sr;
    t0 = dp__now_s();
    if (dp__unit_save_shard(u, shard, strlen(shard), &sr, &d) != 0)
        die("save", &d);
    double t_save = dp__now_s() - t0;

    drop_cache(plain);
    drop_cache(shard);
    drop_cache(rows);
    uint8_t *buf = malloc(bytes);
    t0 = dp__now_s();
    fd = open(plain, O_RDONLY);
    for (uint64_t done = 0; done < bytes;) {
        ssize_t r = read(fd, buf + done, (size_t)DP_MIN(bytes - done, 1u << 26));
        if (r <= 0)
            die("plain read", NULL);
        done += (uint64_t)r;
    }
    close(fd);
    double t_pr = dp__now_s() - t0;

    dp__unit *v = mk_unit(total + total / 8 + (1 << 20));
    dp__unit_load_res lr;
    t0 = dp__now_s();
    dp__wire_load_shard_args la = {.path = dp__wire_s(shard),
                                   .blobs = {sr.blobs, sr.n_blobs}};
    if (dp__unit_load_shard(v, &la, &lr, &d) != 0)
        die("load", &d);
    double t_load = dp__now_s() - t0;
    if (lr.n_loaded != n)
        die("load: not every blob fit", NULL);

    double gb = (double)bytes / 1e9;
    printf("checkpoint bench: %u blobs of %.1f MiB, %.2f GB, dir %s\n", n,
           (double)blob / (1 << 20), gb, dir);
    printf("  write: plain %.2f GB/s, save_shard %.2f GB/s, ratio %.2f\n", gb / t_pw,
           gb / t_save, t_pw / t_save);
    printf("  read:  plain %.2f GB/s, load_shard %.2f GB/s, ratio %.2f\n", gb / t_pr,
           gb / t_load, t_pr / t_load);
    dp__unit_load_res_fini(&lr);
    dp__unit_save_res_fini(&sr);
    unlink(plain);
    unlink(shard);
    unlink(rows);
    free(buf);
    free(pay);
    dp__unit_destroy(v);
    dp__unit_destroy(u);
    return 0;
}
