/*
 * Tests for the unit's SSD tier (docs/design.md, SSD tier), its io jobs and
 * failing disks, in process: a file size limit and a truncated file answering
 * "lost" / failed and never a wrong byte, aborts and leases of regions in the
 * IO area, the io queue's limit and releases while stages run, commit order
 * over the order io jobs finish, validated spills waiting for a queue slot,
 * superseded spills whose commit answers "done", and a checkpoint path that
 * names a FIFO. Spills, stages and evictions are tested in test_unit_ssd.c.
 */
#include "dp_test.h"
#include "dp_tsan_ucx.h"
#include "dp_unit_blob.h"
#include "dp_unit_ssd_fixture.h"

#include <dirent.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/common.h"
#include "unit/unit.h"
#include "wire/wire.h"

/* ---- disks that fail ---- */

/* Leave only fds of this process that point into dir (unlinked spill files). */
static int
spill_fds(const char *dir, int *fds, int cap)
{
    DIR *dh = opendir("/proc/self/fd");
    CHECK(dh != NULL);
    int n = 0;
    struct dirent *e;
    size_t dl = strlen(dir);
    while ((e = readdir(dh)) != NULL) {
        char p[300], t[4096];
        snprintf(p, sizeof p, "/proc/self/fd/%s", e->d_name);
        ssize_t k = readlink(p, t, sizeof t - 1);
        if (k <= 0)
            continue;
        t[k] = '\0';
        if (strncmp(t, dir, dl) == 0 && t[dl] == '/' && n < cap)
            fds[n++] = atoi(e->d_name);
    }
    closedir(dh);
    return n;
}

DP_TEST(failing_disk_lost_and_failed)
{
    char *dir = mk_dir();
    dp_unit *u = mk_ssd_unit(64 << 10, 512 << 10, dir, 0.2, 1);
    /* Fill the put area so every put below spills. */
    uint64_t off;
    CHECK_OK(dp__unit_alloc_spill(u, "fill", 4, 64 << 10, 0, false, &off, NULL, NULL));

    /* A file size limit (SIGXFSZ ignored): writes past it fail with EFBIG. */
    struct rlimit old, lim;
    CHECK(getrlimit(RLIMIT_FSIZE, &old) == 0);
    struct sigaction ign = {0}, oldsa;
    ign.sa_handler = SIG_IGN;
    CHECK(sigaction(SIGXFSZ, &ign, &oldsa) == 0);
    lim = old;
    lim.rlim_cur = 40 << 10;
    CHECK(setrlimit(RLIMIT_FSIZE, &lim) == 0);
    uint64_t gs[3] = {1, 2, 3}, gb[1] = {9};
    tblob small = rows_blob(gs, 1, 1); /* < 40 KiB: fits the limit */
    tblob big = rows_blob(gs + 1, 2, 1);
    CHECK(small.len < (40 << 10) && big.len > (40 << 10));
    CHECK_EQ(put_spill(u, "small", &small, NULL), DP_WIRE_COMMIT_DONE);
    CHECK_EQ(put_spill(u, "big", &big, NULL), DP_WIRE_COMMIT_LOST);
    CHECK(setrlimit(RLIMIT_FSIZE, &old) == 0);
    CHECK(sigaction(SIGXFSZ, &oldsa, NULL) == 0);
    /* lost stays lost; nothing of it was published */
    dp_wire_commit_state st;
    CHECK_OK(dp__unit_commit(u, "big", 3, &st, NULL));
    CHECK_EQ(st, DP_WIRE_COMMIT_LOST);
    dp_unit_stats s = dp_test_unit_stats(u);
    EXPECT_EQ(s.spills_failed, 1);
    EXPECT_EQ(s.spills, 1);
    EXPECT_EQ(s.io_allocated_bytes, 0);
    EXPECT_EQ(s.files_open, 1);
    CHECK_EQ(read_row(u, 1, 1), RD_OK);
    CHECK_EQ(read_row(u, 2, 1), RD_MISSING);
    CHECK_EQ(read_row(u, 3, 1), RD_MISSING);
    dp_test_unit_check(u);

    /* A disk that loses data: a truncated file fails its stage, never a wrong byte. */
    tblob other = rows_blob(gb, 1, 1);
    CHECK_EQ(put_spill(u, "other", &other, NULL), DP_WIRE_COMMIT_DONE);
    /* Evict row 1's staged copy: it was picked up and unpinned. */
    dp__sleep_s(0.25);
    wait_idle(u);
    int fds[8];
    int nf = spill_fds(dir, fds, 8);
    CHECK_EQ(nf, 2);
    for (int i = 0; i < nf; i++)
        CHECK(ftruncate(fds[i], 100) == 0);
    /* Row 1 may still be staged from before; row 9 never was. */
    CHECK_EQ(read_row(u, 9, 1), RD_FAILED);
    s = dp_test_unit_stats(u);
    CHECK(s.stages_failed >= 1);
    /* failed is answered once; the next resolve tries again (and fails again) */
    CHECK_EQ(read_row(u, 9, 1), RD_FAILED);
    dp_test_unit_check(u);
    uint64_t all[4] = {1, 2, 3, 9};
    CHECK_EQ(dp__unit_release_rows(u, all, 4), 4);
    wait_idle(u);
    CHECK_EQ(dp_test_unit_stats(u).files_open, 0);
    dp_test_unit_check(u);
    free(small.p);
    free(big.p);
    free(other.p);
    dp__unit_destroy(u);
    rm_dir(dir);
}

/* ---- io jobs: the IO area's leases, the queue, commit order ---- */

DP_TEST(abort_and_lease_in_io_area)
{
    char *dir = mk_dir();
    dp_unit *u = mk_ssd_unit(4096, 256 << 10, dir, 0.2, 1);
    uint64_t a = 0, b = 0, c = 0;
    CHECK_OK(dp__unit_alloc_spill(u, "a", 1, 64 << 10, 0, true, &a, NULL, NULL));
    CHECK(a >= dp__unit_io_base(u));
    /* a retried alloc gets the same region */
    CHECK_OK(dp__unit_alloc_spill(u, "a", 1, 64 << 10, 0, true, &b, NULL, NULL));
    CHECK_EQ(a, b);
    /* abort without a WRITE in flight frees; with, retires */
    dp__unit_abort(u, "a", 1, false);
    CHECK_OK(dp__unit_alloc_spill(u, "b", 1, 64 << 10, 0, true, &b, NULL, NULL));
    CHECK_EQ(b, a);
    dp__unit_abort(u, "b", 1, true);
    CHECK_EQ(dp_test_unit_stats(u).retired_bytes, 64 << 10);
    CHECK_OK(dp__unit_alloc_spill(u, "c", 1, 64 << 10, 0, true, &c, NULL, NULL));
    CHECK(c + (64 << 10) <= b || c >= b + (64 << 10));
    /* The rest of the area: one more fits, then UnitFull (nothing will free). */
    uint64_t d1;
    CHECK_OK(dp__unit_alloc_spill(u, "d", 1, 128 << 10, 0, true, &d1, NULL, NULL));
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_ERR_D(dp__unit_alloc_spill(u, "e", 1, 64 << 10, 0, true, &d1, NULL, &d),
                DP_EUNITFULL, &d);
    /* A bad blob committed in the IO area is a Protocol error, nothing spills. */
    dp_wire_commit_state st;
    memset(dp__unit_slab(u) + c, 0, 64 << 10);
    CHECK_ERR(dp__unit_commit(u, "c", 1, &st, NULL), DP_EPROTO);
    CHECK_EQ(dp_test_unit_stats(u).io_jobs, 0);
    /* A spill aborted while its job may run is never published. */
    uint64_t gs[1] = {5};
    tblob t = rows_blob(gs, 1, 1);
    dp__unit_abort(u, "c", 1, false);
    CHECK_OK(dp__unit_alloc_spill(u, "f", 1, t.len, t.n, true, &c, NULL, NULL));
    dp_test_write_blob(u, "f", c, t.p, t.len);
    CHECK_OK(dp__unit_commit(u, "f", 1, &st, NULL));
    dp__unit_abort(u, "f", 1, false);
    CHECK_OK(dp__unit_commit(u, "f", 1, &st, NULL));
    CHECK(st == DP_WIRE_COMMIT_LOST || st == DP_WIRE_COMMIT_DONE);
    wait_idle(u);
    dp_test_unit_check(u);
    dp__unit_destroy(u);
    free(t.p);
    rm_dir(dir);
}

DP_TEST(io_queue_limit_and_release_while_staging)
{
    char *dir = mk_dir();
    dp_unit_opts o;
    dp__unit_opts_init(&o);
    o.slab_bytes = 4096;
    o.numa = DP_UNIT_NUMA_OFF;
    o.ssd_dir = dir;
    o.staging_bytes = 16 << 20;
    o.pickup_s = 0;
    o.io_threads = 1;
    dp_unit *u = NULL;
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_OK_D(dp__unit_create(&o, &u, &d), &d);
    /* More commits than the queue holds, back to back: never more than 256 jobs. */
    enum { NB = 400 };
    tblob t[NB];
    uint64_t max_jobs = 0, n_spilled = 0;
    for (uint64_t i = 0; i < NB; i++) {
        uint64_t g = 1000 + i;
        t[i] = rows_blob(&g, 1, 1);
    }
    for (uint64_t i = 0; i < NB; i++) {
        char id[32];
        snprintf(id, sizeof id, "q%" PRIu64, i);
        uint64_t off;
        int rc;
        while ((rc = dp__unit_alloc_spill(u, id, strlen(id), t[i].len, t[i].n, true, &off,
                                          NULL, &d)) == DP_EBUSY)
            dp__sleep_s(0.0005);
        CHECK_OK_D(rc, &d);
        n_spilled += off >= dp__unit_io_base(u); /* a few fit the 4 KiB put area */
        dp_test_write_blob(u, id, off, t[i].p, t[i].len);
        dp_wire_commit_state st;
        CHECK_OK_D(dp__unit_commit(u, id, strlen(id), &st, &d), &d);
        CHECK(st == DP_WIRE_COMMIT_PENDING || st == DP_WIRE_COMMIT_DONE);
        max_jobs = DP_MAX(max_jobs, dp_test_unit_stats(u).io_jobs);
    }
    CHECK(max_jobs <= DP_UNIT_MAX_IO_JOBS);
    /* Commits polled until done (a commit refused a queue slot is queued later). */
    for (uint64_t i = 0; i < NB; i++) {
        char id[32];
        snprintf(id, sizeof id, "q%" PRIu64, i);
        dp_wire_commit_state st;
        double t0 = dp_test_now();
        do {
            CHECK_OK_D(dp__unit_commit(u, id, strlen(id), &st, &d), &d);
            if (st == DP_WIRE_COMMIT_PENDING)
                dp__sleep_s(0.0005);
        } while (st == DP_WIRE_COMMIT_PENDING && dp_test_now() - t0 < 30);
        CHECK_EQ(st, DP_WIRE_COMMIT_DONE);
        free(t[i].p);
    }
    printf("  %" PRIu64 " spills, at most %" PRIu64 " io jobs at once\n", n_spilled,
           max_jobs);
    CHECK_EQ(dp_test_unit_stats(u).spills, n_spilled);
    CHECK(n_spilled > DP_UNIT_MAX_IO_JOBS);
    dp_test_unit_check(u);
    /* Release rows while their stages may run: files close once the jobs end. */
    for (uint64_t i = 0; i < NB; i++) {
        char k[48];
        snprintf(k, sizeof k, "%" PRIu64 "@a", 1000 + i);
        dp_wire_str kk = dp__wire_s(k);
        dp_unit_resolve_keys_res r;
        dp__unit_lock(u);
        CHECK_OK(dp__unit_resolve_keys_locked(u, &kk, 1, &r, NULL));
        dp__unit_unlock(u);
        CHECK(r.n_pending == 1 || r.n_entries == 1);
        if (r.pin_id[0] != '\0')
            dp__unit_unpin(u, r.pin_id, strlen(r.pin_id));
        dp__unit_resolve_keys_res_fini(&r);
        uint64_t g = 1000 + i;
        CHECK_EQ(dp__unit_release_rows(u, &g, 1), 2);
    }
    wait_idle(u);
    dp_unit_stats s = dp_test_unit_stats(u);
    CHECK_EQ(s.files_open, 0);
    CHECK_EQ(s.disk_blobs, 0);
    CHECK_EQ(s.io_allocated_bytes, 0);
    dp_test_unit_check(u);
    dp__unit_destroy(u);
    rm_dir(dir);
}

/*
 * Commit order decides, not the order io jobs finish: a spill committed before
 * a newer put of the same row, and before a release of another of its rows,
 * must not bring back its older value or the released row when its job ends.
 */
DP_TEST(late_spill_never_overrides_later_commits_or_releases)
{
    char *dir = mk_dir();
    dp_unit *u = mk_ssd_unit(64 << 10, 256 << 20, dir, 10, 1);
    enum { N = 4000 };
    uint64_t *g1 = malloc(N * sizeof *g1);
    for (uint64_t i = 0; i < N; i++)
        g1[i] = i;
    tblob t1 = rows_blob(g1, N, 1); /* far larger than the put area: spills */
    uint64_t g2[1] = {0};
    tblob t2 = rows_blob(g2, 1, 2); /* fits the put area */
    dp_detail d;
    dp_detail_clear(&d);
    uint64_t off = 0;
    dp_wire_commit_state st;
    CHECK_OK_D(dp__unit_alloc_spill(u, "x1", 2, t1.len, t1.n, true, &off, NULL, &d), &d);
    CHECK(off >= dp__unit_io_base(u));
    dp_test_write_blob(u, "x1", off, t1.p, t1.len);
    CHECK_OK_D(dp__unit_commit(u, "x1", 2, &st, &d), &d);
    CHECK_EQ(st, DP_WIRE_COMMIT_PENDING);
    /* Row 0 again, committed after x1; then row 5 released. */
    CHECK_OK_D(dp__unit_alloc_spill(u, "x2", 2, t2.len, t2.n, false, &off, NULL, &d), &d);
    dp_test_write_blob(u, "x2", off, t2.p, t2.len);
    CHECK_OK_D(dp__unit_commit(u, "x2", 2, &st, &d), &d);
    CHECK_EQ(st, DP_WIRE_COMMIT_DONE);
    uint64_t rel = 5;
    dp__unit_release_rows(u, &rel, 1);
    wait_idle(u);
    CHECK_OK_D(dp__unit_commit(u, "x1", 2, &st, &d), &d);
    CHECK_EQ(st, DP_WIRE_COMMIT_DONE);
    CHECK_EQ(read_row(u, 0, 2), RD_OK);      /* the newer put stays */
    CHECK_EQ(read_row(u, 5, 1), RD_MISSING); /* the release stays */
    CHECK_EQ(read_row(u, 3, 1), RD_OK);      /* the spill's other rows landed */
    dp_test_unit_check(u);
    free(t1.p);
    free(t2.p);
    free(g1);
    dp__unit_destroy(u);
    rm_dir(dir);
}

/* The io thread reads the clock while the test moves it. */
static _Atomic double lease_clock = 1000;
static double
lease_now(void *ctx)
{
    (void)ctx;
    return atomic_load(&lease_clock);
}

/*
 * Spills whose commit validated while the io queue was full wait for a slot:
 * the ticker queues them, and the lease never retires them (their WRITE is
 * done), even when the client stopped asking.
 */
DP_TEST(validated_spills_waiting_for_the_queue_are_never_retired)
{
    char *dir = mk_dir();
    dp_unit_opts o;
    dp__unit_opts_init(&o);
    o.slab_bytes = 64 << 10;
    o.alloc_lease_s = 60;
    o.quarantine_s = 0.05;
    o.numa = DP_UNIT_NUMA_OFF;
    o.ssd_dir = dir;
    o.staging_bytes = 256 << 20;
    o.io_threads = 1;
    o.now = lease_now;
    dp_unit *u = NULL;
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_OK_D(dp__unit_create(&o, &u, &d), &d);
    enum { M = 300 }; /* more than the 256 io jobs */
    char id[32];
    uint64_t off;
    dp_wire_commit_state st;
    /* Rows of their own per spill: none supersedes another. */
    for (int i = 0; i < M; i++) {
        uint64_t gs[8];
        for (int k = 0; k < 8; k++)
            gs[k] = (uint64_t)i * 8 + (uint64_t)k; /* > the 64 KiB put area */
        tblob small = rows_blob(gs, 8, 1);
        snprintf(id, sizeof id, "s%d", i);
        CHECK_OK_D(dp__unit_alloc_spill(u, id, strlen(id), small.len, small.n, true, &off,
                                        NULL, &d),
                   &d);
        CHECK(off >= dp__unit_io_base(u));
        dp_test_write_blob(u, id, off, small.p, small.len);
        free(small.p);
    }
    for (int i = 0; i < M; i++) {
        snprintf(id, sizeof id, "s%d", i);
        CHECK_OK_D(dp__unit_commit(u, id, strlen(id), &st, &d), &d);
    }
    /* The client stops asking; the lease passes; the ticker runs. */
    atomic_store(&lease_clock, atomic_load(&lease_clock) + 61);
    for (int round = 0; round < 100 && dp_test_unit_stats(u).spills < M; round++) {
        dp__unit_tick(u);
        wait_idle(u);
    }
    dp_unit_stats s = dp_test_unit_stats(u);
    CHECK_EQ(s.leases_expired, 0);
    CHECK_EQ(s.retired_bytes, 0);
    CHECK_EQ(s.spills, M);
    for (int i = 0; i < M; i++) {
        snprintf(id, sizeof id, "s%d", i);
        CHECK_OK_D(dp__unit_commit(u, id, strlen(id), &st, &d), &d);
        CHECK_EQ(st, DP_WIRE_COMMIT_DONE);
    }
    CHECK_EQ(read_row(u, 4, 1), RD_OK);
    CHECK_EQ(read_row(u, 8 * M - 1, 1), RD_OK);
    dp_test_unit_check(u);
    dp__unit_destroy(u);
    rm_dir(dir);
}

/*
 * Commit a big spill of rows [g0, g0 + 4000) as id and clear its rows at once,
 * while its io job writes the file (tens of ms). True if the job then found
 * nothing left to publish (superseded); false if it won the race.
 */
static bool
spill_then_clear(dp_unit *u, const char *id, uint64_t g0)
{
    enum { N = 4000 };
    uint64_t *g = malloc(N * sizeof *g);
    CHECK(g != NULL);
    for (uint64_t i = 0; i < N; i++)
        g[i] = g0 + i;
    tblob t = rows_blob(g, N, 1);
    dp_detail d;
    dp_detail_clear(&d);
    uint64_t off;
    dp_wire_commit_state st;
    uint64_t before = dp_test_unit_stats(u).spills_superseded;
    CHECK_OK_D(dp__unit_alloc_spill(u, id, strlen(id), t.len, t.n, true, &off, NULL, &d),
               &d);
    dp_test_write_blob(u, id, off, t.p, t.len);
    CHECK_OK_D(dp__unit_commit(u, id, strlen(id), &st, &d), &d);
    CHECK_EQ(st, DP_WIRE_COMMIT_PENDING);
    dp__unit_release_rows(u, g, N);
    wait_idle(u);
    free(t.p);
    free(g);
    return dp_test_unit_stats(u).spills_superseded == before + 1;
}

/*
 * A spill whose rows were all cleared (or overwritten) before its io job
 * ended publishes nothing, and its commit answers "done" (it landed and was
 * replaced), not "lost", for as long as a client may still ask (the lease,
 * 60 s here); then the id is forgotten. An id allocated again names the new
 * blob.
 */
DP_TEST(superseded_spill_commit_answers_done)
{
    char *dir = mk_dir();
    dp_unit_opts o;
    dp__unit_opts_init(&o);
    o.slab_bytes = 64 << 10;
    o.alloc_lease_s = 60;
    o.numa = DP_UNIT_NUMA_OFF;
    o.ssd_dir = dir;
    o.staging_bytes = 256 << 20;
    o.io_threads = 1;
    o.now = lease_now;
    dp_unit *u = NULL;
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_OK_D(dp__unit_create(&o, &u, &d), &d);
    dp_wire_commit_state st;
    char id[32] = "";
    bool sup = false;
    for (int a = 0; a < 3 && !sup; a++) { /* the io job may win the race: try again */
        snprintf(id, sizeof id, "x%d", a);
        sup = spill_then_clear(u, id, (uint64_t)a * 10000);
    }
    CHECK(sup);
    CHECK_EQ(dp_test_unit_stats(u).entries, 0); /* the clears stand */
    CHECK_OK_D(dp__unit_commit(u, id, strlen(id), &st, &d), &d);
    CHECK_EQ(st, DP_WIRE_COMMIT_DONE);
    CHECK_OK_D(dp__unit_commit(u, "never", 5, &st, &d), &d);
    CHECK_EQ(st, DP_WIRE_COMMIT_LOST);
    atomic_store(&lease_clock, atomic_load(&lease_clock) + 30);
    dp__unit_tick(u);
    CHECK_OK_D(dp__unit_commit(u, id, strlen(id), &st, &d), &d);
    CHECK_EQ(st, DP_WIRE_COMMIT_DONE);
    atomic_store(&lease_clock, atomic_load(&lease_clock) + 31);
    dp__unit_tick(u);
    CHECK_OK_D(dp__unit_commit(u, id, strlen(id), &st, &d), &d);
    CHECK_EQ(st, DP_WIRE_COMMIT_LOST);

    /* The id allocated again names the new (unwritten) blob, not the old spill. */
    sup = false;
    for (int a = 0; a < 3 && !sup; a++) {
        snprintf(id, sizeof id, "y%d", a);
        sup = spill_then_clear(u, id, 100000 + (uint64_t)a * 10000);
    }
    CHECK(sup);
    uint64_t off;
    CHECK_OK_D(dp__unit_alloc_spill(u, id, strlen(id), 4096, 1, false, &off, NULL, &d),
               &d);
    memset(dp__unit_slab(u) + off, 0, 4096);
    CHECK_ERR(dp__unit_commit(u, id, strlen(id), &st, &d), DP_EPROTO);
    dp__unit_abort(u, id, strlen(id), false);
    CHECK_OK_D(dp__unit_commit(u, id, strlen(id), &st, &d), &d);
    CHECK_EQ(st, DP_WIRE_COMMIT_LOST);
    dp_test_unit_check(u);
    dp__unit_destroy(u);
    rm_dir(dir);
}

/* A checkpoint path naming a FIFO is refused at once, never blocks the unit. */
DP_TEST(load_refuses_a_fifo)
{
    char *dir = mk_dir();
    dp_unit *u = mk_ssd_unit(1 << 20, 1 << 20, dir, 10, 1);
    char p[256], pr[300];
    snprintf(p, sizeof p, "%s/shard", dir);
    snprintf(pr, sizeof pr, "%s/shard.rows", dir);
    CHECK(mkfifo(p, 0600) == 0);
    CHECK(mkfifo(pr, 0600) == 0);
    dp_wire_shard_blob b = {dp__wire_s("b1"), 0, 64, 1};
    dp_unit_load_res res;
    dp_detail d;
    dp_detail_clear(&d);
    double t0 = dp_test_now();
    int rc = dp__unit_load_shard(u, p, strlen(p), &b, 1, false, &res, &d);
    CHECK(rc != DP_OK);
    CHECK_CONTAINS(d.msg, "not a regular file");
    CHECK(dp_test_now() - t0 < 5);
    unlink(p);
    unlink(pr);
    dp__unit_destroy(u);
    rm_dir(dir);
}
