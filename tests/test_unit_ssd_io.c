/*
 * Tests for the unit's SSD tier (docs/design.md, SSD tier), its io jobs and
 * failing disks, in process: a file size limit and a truncated file answering
 * "lost" / failed and never a wrong byte, aborts and leases of regions in the
 * IO area, the io queue's limit and releases while stages run, commit order
 * over the order io jobs finish, validated spills waiting for a queue slot,
 * superseded spills whose commit answers "done", a checkpoint path that names
 * a FIFO; Busy (staged copies, quarantine) and UnitFull in the IO area, a save
 * while a spill's commit is pending, loads that cannot place a blob on disk
 * (the tier off, an IO area too small, a write that fails), and the 30 s log
 * lines of a running unit. Spills, stages and evictions are tested in
 * test_unit_ssd.c.
 */
#include "dp_test.h"
#include "dp_tsan_ucx.h"
#include "dp_unit_blob.h"
#include "dp_unit_ssd_fixture.h"

#include <dirent.h>
#include <fcntl.h>
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
    dp__unit *u = mk_ssd_unit(64 << 10, 512 << 10, dir, 0.2, 1);
    /* Fill the put area so every put below spills. */
    uint64_t off;
    CHECK_OK(dp_test_unit_alloc(u, "fill", 4, 64 << 10, 0, false, &off, NULL, NULL));

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
    dp__wire_commit_state st;
    CHECK_OK(dp__unit_commit(u, "big", 3, &st, NULL));
    CHECK_EQ(st, DP_WIRE_COMMIT_LOST);
    dp__unit_stats s = dp_test_unit_stats(u);
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
    dp__unit *u = mk_ssd_unit(4096, 256 << 10, dir, 0.2, 1);
    uint64_t a = 0, b = 0, c = 0;
    CHECK_OK(dp_test_unit_alloc(u, "a", 1, 64 << 10, 0, true, &a, NULL, NULL));
    CHECK(a >= dp__unit_io_base(u));
    /* a retried alloc gets the same region */
    CHECK_OK(dp_test_unit_alloc(u, "a", 1, 64 << 10, 0, true, &b, NULL, NULL));
    CHECK_EQ(a, b);
    /* abort without a WRITE in flight frees; with, retires */
    dp__unit_abort(u, "a", 1, false);
    CHECK_OK(dp_test_unit_alloc(u, "b", 1, 64 << 10, 0, true, &b, NULL, NULL));
    CHECK_EQ(b, a);
    dp__unit_abort(u, "b", 1, true);
    CHECK_EQ(dp_test_unit_stats(u).retired_bytes, 64 << 10);
    CHECK_OK(dp_test_unit_alloc(u, "c", 1, 64 << 10, 0, true, &c, NULL, NULL));
    CHECK(c + (64 << 10) <= b || c >= b + (64 << 10));
    /* The rest of the area: one more fits, then UnitFull (nothing will free). */
    uint64_t d1;
    CHECK_OK(dp_test_unit_alloc(u, "d", 1, 128 << 10, 0, true, &d1, NULL, NULL));
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_ERR_D(dp_test_unit_alloc(u, "e", 1, 64 << 10, 0, true, &d1, NULL, &d),
                DP_EUNITFULL, &d);
    /* A bad blob committed in the IO area is a Protocol error, nothing spills. */
    dp__wire_commit_state st;
    memset(dp__unit_slab(u) + c, 0, 64 << 10);
    CHECK_ERR(dp__unit_commit(u, "c", 1, &st, NULL), DP_EPROTO);
    CHECK_EQ(dp_test_unit_stats(u).io_jobs, 0);
    /* A spill aborted while its job may run is never published. */
    uint64_t gs[1] = {5};
    tblob t = rows_blob(gs, 1, 1);
    dp__unit_abort(u, "c", 1, false);
    CHECK_OK(dp_test_unit_alloc(u, "f", 1, t.len, t.n, true, &c, NULL, NULL));
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
    dp__unit_opts o;
    dp__unit_opts_init(&o);
    o.slab_bytes = 4096;
    o.numa = DP_UNIT_NUMA_OFF;
    o.ssd_dir = dir;
    o.staging_bytes = 16 << 20;
    o.pickup_s = 0;
    o.io_threads = 1;
    dp__unit *u = NULL;
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
        while ((rc = dp_test_unit_alloc(u, id, strlen(id), t[i].len, t[i].n, true, &off,
                                        NULL, &d)) == DP_EBUSY)
            dp__sleep_s(0.0005);
        CHECK_OK_D(rc, &d);
        n_spilled += off >= dp__unit_io_base(u); /* a few fit the 4 KiB put area */
        dp_test_write_blob(u, id, off, t[i].p, t[i].len);
        dp__wire_commit_state st;
        CHECK_OK_D(dp__unit_commit(u, id, strlen(id), &st, &d), &d);
        CHECK(st == DP_WIRE_COMMIT_PENDING || st == DP_WIRE_COMMIT_DONE);
        max_jobs = DP_MAX(max_jobs, dp_test_unit_stats(u).io_jobs);
    }
    CHECK(max_jobs <= DP_UNIT_MAX_IO_JOBS);
    /* Commits polled until done (a commit refused a queue slot is queued later). */
    for (uint64_t i = 0; i < NB; i++) {
        char id[32];
        snprintf(id, sizeof id, "q%" PRIu64, i);
        dp__wire_commit_state st;
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
        dp__wire_str kk = dp__wire_s(k);
        dp__unit_resolve_keys_res r;
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
    dp__unit_stats s = dp_test_unit_stats(u);
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
    dp__unit *u = mk_ssd_unit(64 << 10, 256 << 20, dir, 10, 1);
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
    dp__wire_commit_state st;
    CHECK_OK_D(dp_test_unit_alloc(u, "x1", 2, t1.len, t1.n, true, &off, NULL, &d), &d);
    CHECK(off >= dp__unit_io_base(u));
    dp_test_write_blob(u, "x1", off, t1.p, t1.len);
    CHECK_OK_D(dp__unit_commit(u, "x1", 2, &st, &d), &d);
    CHECK_EQ(st, DP_WIRE_COMMIT_PENDING);
    /* Row 0 again, committed after x1; then row 5 released. */
    CHECK_OK_D(dp_test_unit_alloc(u, "x2", 2, t2.len, t2.n, false, &off, NULL, &d), &d);
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

/*
 * A repair's copy committed while a put's spill is still being written (the
 * key not yet in the row index, so the copy is published) never wins over
 * that spill: the copy is older than anything written to the unit since it
 * started. If the spill ends first, the copy is skipped: the same outcome.
 */
DP_TEST(a_repair_copy_never_overrides_a_spill_in_flight)
{
    char *dir = mk_dir();
    dp__unit_opts o;
    dp__unit_opts_init(&o);
    o.slab_bytes = 64 << 10;
    o.read_pin_s = 30;
    o.alloc_lease_s = 60;
    o.quarantine_s = 0.05;
    o.numa = DP_UNIT_NUMA_OFF;
    o.ssd_dir = dir;
    o.staging_bytes = 256 << 20;
    o.pickup_s = 10;
    o.io_threads = 3;
    o.repair = true;
    dp__unit *u = NULL;
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_OK_D(dp__unit_create(&o, &u, &d), &d);
    enum { N = 4000 };
    uint64_t *g1 = malloc(N * sizeof *g1);
    for (uint64_t i = 0; i < N; i++)
        g1[i] = i;
    tblob t1 = rows_blob(g1, N, 1); /* the put: far larger than the put area, spills */
    uint64_t g2[1] = {0};
    tblob t2 = rows_blob(g2, 1, 2); /* the repair's copy of row 0 (read from a peer) */
    uint64_t off = 0;
    dp__wire_commit_state st;
    CHECK_OK_D(dp_test_unit_alloc(u, "x1", 2, t1.len, t1.n, true, &off, NULL, &d), &d);
    dp_test_write_blob(u, "x1", off, t1.p, t1.len);
    CHECK_OK_D(dp__unit_commit(u, "x1", 2, &st, &d), &d);
    CHECK_EQ(st, DP_WIRE_COMMIT_PENDING);
    dp__wire_alloc_args a = {.blob_id = dp__wire_s("r2"),
                             .nbytes = t2.len,
                             .n_entries = t2.n,
                             .spill = true,
                             .repair = true};
    dp__wire_alloc_res r;
    CHECK_OK_D(dp__unit_alloc_req(u, &a, &r, NULL, &d), &d);
    CHECK(r.off < dp__unit_io_base(u)); /* a repair's copy never spills */
    dp_test_write_blob(u, "r2", r.off, t2.p, t2.len);
    CHECK_OK_D(dp__unit_commit(u, "r2", 2, &st, &d), &d);
    CHECK_EQ(st, DP_WIRE_COMMIT_DONE);
    wait_idle(u);
    CHECK_OK_D(dp__unit_commit(u, "x1", 2, &st, &d), &d);
    CHECK_EQ(st, DP_WIRE_COMMIT_DONE);
    CHECK_EQ(read_row(u, 0, 1), RD_OK); /* the put's value, not the copy's */
    CHECK_EQ(read_row(u, 3, 1), RD_OK);
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
    dp__unit_opts o;
    dp__unit_opts_init(&o);
    o.slab_bytes = 64 << 10;
    o.alloc_lease_s = 60;
    o.quarantine_s = 0.05;
    o.numa = DP_UNIT_NUMA_OFF;
    o.ssd_dir = dir;
    o.staging_bytes = 256 << 20;
    o.io_threads = 1;
    o.now = lease_now;
    dp__unit *u = NULL;
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_OK_D(dp__unit_create(&o, &u, &d), &d);
    enum { M = 300 }; /* more than the 256 io jobs */
    char id[32];
    uint64_t off;
    dp__wire_commit_state st;
    /* Rows of their own per spill: none supersedes another. */
    for (int i = 0; i < M; i++) {
        uint64_t gs[8];
        for (int k = 0; k < 8; k++)
            gs[k] = (uint64_t)i * 8 + (uint64_t)k; /* > the 64 KiB put area */
        tblob small = rows_blob(gs, 8, 1);
        snprintf(id, sizeof id, "s%d", i);
        CHECK_OK_D(dp_test_unit_alloc(u, id, strlen(id), small.len, small.n, true, &off,
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
    dp__unit_stats s = dp_test_unit_stats(u);
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
spill_then_clear(dp__unit *u, const char *id, uint64_t g0)
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
    dp__wire_commit_state st;
    uint64_t before = dp_test_unit_stats(u).spills_superseded;
    CHECK_OK_D(dp_test_unit_alloc(u, id, strlen(id), t.len, t.n, true, &off, NULL, &d),
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
    dp__unit_opts o;
    dp__unit_opts_init(&o);
    o.slab_bytes = 64 << 10;
    o.alloc_lease_s = 60;
    o.numa = DP_UNIT_NUMA_OFF;
    o.ssd_dir = dir;
    o.staging_bytes = 256 << 20;
    o.io_threads = 1;
    o.now = lease_now;
    dp__unit *u = NULL;
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_OK_D(dp__unit_create(&o, &u, &d), &d);
    dp__wire_commit_state st;
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
    CHECK_OK_D(dp_test_unit_alloc(u, id, strlen(id), 4096, 1, false, &off, NULL, &d), &d);
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
    dp__unit *u = mk_ssd_unit(1 << 20, 1 << 20, dir, 10, 1);
    char p[256], pr[300];
    snprintf(p, sizeof p, "%s/shard", dir);
    snprintf(pr, sizeof pr, "%s/shard.rows", dir);
    CHECK(mkfifo(p, 0600) == 0);
    CHECK(mkfifo(pr, 0600) == 0);
    dp__wire_shard_blob b = {dp__wire_s("b1"), 0, 64, 1};
    dp__unit_load_res res;
    dp_detail d;
    dp_detail_clear(&d);
    double t0 = dp_test_now();
    int rc = dp_test_load_shard(u, p, &b, 1, false, &res, &d);
    CHECK(rc != DP_OK);
    CHECK_CONTAINS(d.msg, "not a regular file");
    CHECK(dp_test_now() - t0 < 5);
    unlink(p);
    unlink(pr);
    dp__unit_destroy(u);
    rm_dir(dir);
}

/* ---- Busy and UnitFull in the IO area ---- */

/*
 * A unit on lease_clock (one io thread, put area of slab bytes): pickup_s,
 * pins, quarantine and leases pass only when the test moves the clock, so each
 * state below holds for as long as the test needs it. dir NULL: no SSD tier.
 */
static dp__unit *
mk_clock_unit(uint64_t slab, uint64_t staging, const char *dir, double pickup_s)
{
    dp__unit_opts o;
    dp__unit_opts_init(&o);
    o.slab_bytes = slab;
    o.read_pin_s = 30;
    o.alloc_lease_s = 60;
    o.quarantine_s = 5;
    o.numa = DP_UNIT_NUMA_OFF;
    o.ssd_dir = dir;
    o.staging_bytes = dir != NULL ? staging : 0;
    o.pickup_s = pickup_s;
    o.io_threads = 1;
    o.now = lease_now;
    dp__unit *u = NULL;
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_OK_D(dp__unit_create(&o, &u, &d), &d);
    return u;
}

static void
clock_add(double s)
{
    atomic_store(&lease_clock, atomic_load(&lease_clock) + s);
}

/* Resolve row g of a disk blob once: it answers pending; its copy is staged. */
static void
stage_row(dp__unit *u, uint64_t g)
{
    char k[48];
    snprintf(k, sizeof k, "%" PRIu64 "@a", g);
    dp__wire_str kk = dp__wire_s(k);
    dp__unit_resolve_keys_res r;
    dp_detail d;
    dp_detail_clear(&d);
    uint64_t staged = dp_test_unit_stats(u).staged_blobs;
    dp__unit_lock(u);
    int rc = dp__unit_resolve_keys_locked(u, &kk, 1, &r, &d);
    dp__unit_unlock(u);
    CHECK_OK_D(rc, &d);
    CHECK_EQ(r.n_pending, 1);
    dp__unit_resolve_keys_res_fini(&r);
    wait_idle(u);
    CHECK_EQ(dp_test_unit_stats(u).staged_blobs, staged + 1);
}

/* Field "a" of row g at slab offset off has version v's bytes. */
static bool
row_bytes_at(dp__unit *u, uint64_t off, uint64_t g, uint32_t v)
{
    uint64_t la = row_len(g, v);
    uint8_t *want = malloc(la);
    row_fill(g, v, want, la);
    bool same = memcmp(dp__unit_slab(u) + off, want, la) == 0;
    free(want);
    return same;
}

/*
 * Resolve row g's field "a" (staged or in RAM) and keep the pin (into pin);
 * its bytes are checked against version v. Returns its slab offset.
 */
static uint64_t
pin_row(dp__unit *u, uint64_t g, uint32_t v, char pin[33])
{
    char k[48];
    snprintf(k, sizeof k, "%" PRIu64 "@a", g);
    dp__wire_str kk = dp__wire_s(k);
    dp__unit_resolve_keys_res r;
    dp__unit_lock(u);
    int rc = dp__unit_resolve_keys_locked(u, &kk, 1, &r, NULL);
    dp__unit_unlock(u);
    CHECK_OK(rc);
    CHECK_EQ(r.n_entries, 1);
    CHECK_EQ_U64(r.entries[0].len, row_len(g, v));
    uint64_t off = r.entries[0].off;
    CHECK(row_bytes_at(u, off, g, v));
    memcpy(pin, r.pin_id, 33);
    dp__unit_resolve_keys_res_fini(&r);
    return off;
}

/* The message of a Busy answer of the IO area (ssd.c) with these numbers. */
static void
io_busy_msg(char *buf, size_t cap, uint64_t nbytes, uint64_t largest, uint64_t free_b,
            uint64_t staged, uint64_t quarantined)
{
    snprintf(buf, cap,
             "unit 0: no room for %" PRIu64
             " bytes in the IO area now (largest free %" PRIu64 ", free %" PRIu64
             "); 0 bytes held by io jobs, %" PRIu64 " by staged copies and %" PRIu64
             " in quarantine will free: retry",
             nbytes, largest, free_b, staged, quarantined);
}

/* alloc(spill) of nbytes as a client sends it, through the unit's handler. */
static void
wire_alloc(dp__unit *u, const char *id, uint64_t nbytes, dp__wire_reply *r, dp__buf *out)
{
    static dp__wire_rid_gen gen;
    static bool gen_ok;
    if (!gen_ok)
        CHECK_OK(dp__wire_rid_gen_init(&gen, NULL));
    gen_ok = true;
    dp__wire_request q;
    memset(&q, 0, sizeof q);
    char rid[DP_WIRE_RID_MAX];
    q.rid = dp__wire_rid_next(&gen, rid);
    q.op = DP_WIRE_OP_ALLOC;
    q.a.alloc = (dp__wire_alloc_args){dp__wire_s(id), nbytes, 0, true};
    dp__buf in = {0};
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_OK_D(dp__wire_request_encode(&q, NULL, &in, &d), &d);
    dp__buf_reset(out);
    dp__unit_handle(u, in.data, in.len, out);
    dp__buf_fini(&in);
    CHECK(out->len > 0);
    CHECK_OK_D(dp__wire_reply_decode(out->data, out->len, DP_WIRE_OP_ALLOC, NULL, r, &d),
               &d);
}

/* The wire reply is an error of kind with message msg and reason (NULL: none). */
static void
check_wire_error(const dp__wire_reply *r, int code, const char *kind, const char *msg,
                 const char *reason)
{
    CHECK(!r->ok);
    CHECK_EQ(r->err.code, code);
    CHECKF(dp__wire_str_eq(r->err.kind, kind), "kind %.*s, not %s",
           DP_WIRE_STR_ARG(r->err.kind), kind);
    CHECKF(dp__wire_str_eq(r->err.msg, msg), "message '%.*s', not '%s'",
           DP_WIRE_STR_ARG(r->err.msg), msg);
    if (reason == NULL)
        CHECK_EQ(r->err.reason.n, 0);
    else
        CHECKF(dp__wire_str_eq(r->err.reason, reason), "reason %.*s, not %s",
               DP_WIRE_STR_ARG(r->err.reason), reason);
}

/*
 * Busy, reason "staged copies": the IO area cannot take an alloc(spill) now,
 * but a staged copy holds the room it needs and will give it up: a copy not
 * picked up yet is kept pickup_s for its reader, a pinned one until its pin
 * ends. Checked: the code, reason and whole message, in process and as a
 * client reads the reply; the copy's bytes stay while it is answered Busy;
 * and the room does free: once unpinned, or once pickup_s passed, the same
 * alloc evicts the copy and gets the whole area.
 */
DP_TEST(io_area_busy_while_staged_copies_hold_room)
{
    char *dir = mk_dir();
    dp__unit *u = mk_clock_unit(4096, 64 << 10, dir, 10);
    uint64_t g = 3;
    tblob t = rows_blob(&g, 1, 1);
    CHECK(t.len > 4096 && t.len < (32 << 10)); /* spills; its copy leaves room */
    CHECK_EQ(put_spill(u, "x", &t, NULL), DP_WIRE_COMMIT_DONE);
    CHECK_EQ(dp_test_unit_stats(u).disk_blobs, 1);
    /* Staged, not picked up (the clock stands still): the only region in the area. */
    stage_row(u, g);
    uint64_t io = dp__unit_io_bytes(u);
    dp__unit_stats s = dp_test_unit_stats(u);
    uint64_t staged = s.staged_bytes;
    CHECK(staged >= t.len);
    CHECK_EQ(s.io_allocated_bytes, staged);
    CHECK_EQ(s.io_free_bytes, io - staged); /* one free block, after the copy */

    /* The whole IO area (more than the put area: nowhere else): Busy. */
    char want[512];
    io_busy_msg(want, sizeof want, io, io - staged, io - staged, staged, 0);
    uint64_t off = 0;
    const char *why = NULL;
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_ERR_D(dp_test_unit_alloc(u, "w", 1, io, 0, true, &off, &why, &d), DP_EBUSY, &d);
    CHECK(why != NULL);
    CHECK_STR(why, "staged copies");
    CHECK_STR(dp_detail_msg(&d), want);
    s = dp_test_unit_stats(u);
    CHECK_EQ(s.n_busy, 1);
    CHECK_EQ(s.n_full, 0);
    CHECK_EQ(s.evictions, 0);
    CHECK_EQ(s.staged_blobs, 1);
    CHECK_EQ(s.blobs, 1); /* nothing allocated */
    dp__wire_reply r;
    dp__buf out = {0};
    wire_alloc(u, "w", io, &r, &out);
    check_wire_error(&r, DP_EBUSY, "Busy", want, "staged copies");
    dp__wire_reply_fini(&r);

    /* Picked up and pinned: Busy still; the copy's bytes stay as they were. */
    char pin[33];
    uint64_t copy = pin_row(u, g, 1, pin);
    CHECK(copy >= dp__unit_io_base(u));
    why = NULL;
    CHECK_ERR_D(dp_test_unit_alloc(u, "w", 1, io, 0, true, &off, &why, &d), DP_EBUSY, &d);
    CHECK_STR(why, "staged copies");
    CHECK_STR(dp_detail_msg(&d), want);
    CHECK_EQ(dp_test_unit_stats(u).evictions, 0);
    CHECK(row_bytes_at(u, copy, g, 1));
    dp__unit_unpin(u, pin, strlen(pin));

    /* Unpinned: the same alloc evicts the copy and gets the whole area. */
    CHECK_OK_D(dp_test_unit_alloc(u, "w", 1, io, 0, true, &off, &why, &d), &d);
    CHECK_EQ(off, dp__unit_io_base(u));
    s = dp_test_unit_stats(u);
    CHECK_EQ(s.evictions, 1);
    CHECK_EQ(s.staged_blobs, 0);
    CHECK_EQ(s.io_quarantined_bytes, 0);
    dp__unit_abort(u, "w", 1, false);

    /* Staged again, never picked up: Busy until pickup_s passes, then evicted. */
    stage_row(u, g);
    CHECK_ERR_D(dp_test_unit_alloc(u, "w", 1, io, 0, true, &off, &why, &d), DP_EBUSY, &d);
    CHECK_STR(why, "staged copies");
    CHECK_STR(dp_detail_msg(&d), want);
    clock_add(11);
    CHECK_OK_D(dp_test_unit_alloc(u, "w", 1, io, 0, true, &off, &why, &d), &d);
    CHECK_EQ(off, dp__unit_io_base(u));
    CHECK_EQ(dp_test_unit_stats(u).evictions, 2);
    dp__unit_abort(u, "w", 1, false);
    CHECK_EQ(read_row(u, g, 1), RD_OK); /* staged again, byte for byte */
    CHECK_EQ(dp_test_unit_stats(u).n_busy, 4);
    dp_test_unit_check(u);
    dp__buf_fini(&out);
    free(t.p);
    dp__unit_destroy(u);
    rm_dir(dir);
}

/*
 * Busy, reason "quarantine": a staged copy whose pin expired (its reader may
 * still be READing it) is evicted into quarantine, not freed. The alloc that
 * evicted it is answered Busy with the copy's bytes in quarantine (code,
 * reason, whole message, in process and on the wire), and so is every alloc
 * until quarantine_s has passed; then the same alloc gets the whole area.
 */
DP_TEST(io_area_busy_while_quarantine_holds_room)
{
    char *dir = mk_dir();
    dp__unit *u = mk_clock_unit(4096, 64 << 10, dir, 10);
    uint64_t g = 3;
    tblob t = rows_blob(&g, 1, 1);
    CHECK(t.len > 4096 && t.len < (32 << 10));
    CHECK_EQ(put_spill(u, "x", &t, NULL), DP_WIRE_COMMIT_DONE);
    stage_row(u, g);
    char pin[33];
    pin_row(u, g, 1, pin);
    /* The reader lets its pin expire (read_pin_s 30 s): the ticker ends it. */
    clock_add(31);
    dp__unit_tick(u);
    dp__unit_stats s = dp_test_unit_stats(u);
    CHECK_EQ(s.pins_expired, 1);
    CHECK_EQ(s.pins, 0);
    CHECK_EQ(s.staged_blobs, 1);
    uint64_t io = dp__unit_io_bytes(u), q = s.staged_bytes;
    CHECK_EQ(s.io_free_bytes, io - q);

    char want[512];
    io_busy_msg(want, sizeof want, io, io - q, io - q, 0, q);
    uint64_t off = 0;
    const char *why = NULL;
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_ERR_D(dp_test_unit_alloc(u, "w", 1, io, 0, true, &off, &why, &d), DP_EBUSY, &d);
    CHECK(why != NULL);
    CHECK_STR(why, "quarantine");
    CHECK_STR(dp_detail_msg(&d), want);
    s = dp_test_unit_stats(u);
    CHECK_EQ(s.evictions, 1);
    CHECK_EQ(s.staged_blobs, 0);
    CHECK_EQ(s.staged_bytes, 0);
    CHECK_EQ(s.io_quarantined_bytes, q);
    CHECK_EQ(s.io_allocated_bytes, 0);
    CHECK_EQ(s.n_busy, 1);
    CHECK_EQ(s.n_full, 0);
    /* Until quarantine_s (5 s) passes, nothing frees: Busy again, on the wire too. */
    dp__wire_reply r;
    dp__buf out = {0};
    wire_alloc(u, "w", io, &r, &out);
    check_wire_error(&r, DP_EBUSY, "Busy", want, "quarantine");
    dp__wire_reply_fini(&r);
    clock_add(4);
    why = NULL;
    CHECK_ERR_D(dp_test_unit_alloc(u, "w", 1, io, 0, true, &off, &why, &d), DP_EBUSY, &d);
    CHECK_STR(why, "quarantine");
    CHECK_STR(dp_detail_msg(&d), want);
    clock_add(2);
    CHECK_OK_D(dp_test_unit_alloc(u, "w", 1, io, 0, true, &off, &why, &d), &d);
    CHECK_EQ(off, dp__unit_io_base(u));
    s = dp_test_unit_stats(u);
    CHECK_EQ(s.io_quarantined_bytes, 0);
    CHECK_EQ(s.n_busy, 3);
    dp__unit_abort(u, "w", 1, false);
    CHECK_EQ(read_row(u, g, 1), RD_OK); /* staged again, byte for byte */
    dp_test_unit_check(u);
    dp__buf_fini(&out);
    free(t.p);
    dp__unit_destroy(u);
    rm_dir(dir);
}

/*
 * UnitFull: what will free does not cover the request. An open allocation
 * (an uncommitted spill: a WRITE may still run into it) frees only when its
 * client commits or aborts, so it never counts; a staged copy counts, but
 * only its own size. An alloc the copy would cover is Busy; one larger than
 * the free room plus the copy is UnitFull (code, no reason, whole message,
 * in process and on the wire) and stays so once the copy is unpinned; it
 * fits once the open allocation is aborted.
 */
DP_TEST(io_area_unit_full_when_nothing_pending_covers_it)
{
    char *dir = mk_dir();
    dp__unit *u = mk_clock_unit(4096, 64 << 10, dir, 10);
    uint64_t io = dp__unit_io_bytes(u), hold = 16 << 10, off = 0;
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_OK_D(dp_test_unit_alloc(u, "open", 4, hold, 0, true, &off, NULL, &d), &d);
    CHECK_EQ(off, dp__unit_io_base(u)); /* first in the area: the rest stays one block */
    uint64_t g = 3;
    tblob t = rows_blob(&g, 1, 1);
    CHECK(t.len > 4096 && t.len < (32 << 10));
    CHECK_EQ(put_spill(u, "x", &t, NULL), DP_WIRE_COMMIT_DONE);
    stage_row(u, g);
    char pin[33];
    pin_row(u, g, 1, pin);
    dp__unit_stats s = dp_test_unit_stats(u);
    uint64_t staged = s.staged_bytes, free_b = io - hold - staged;
    CHECK_EQ(s.io_free_bytes, free_b);

    /* Covered by the copy (which sits next to the free room): Busy. */
    const char *why = NULL;
    char want[512];
    io_busy_msg(want, sizeof want, free_b + staged, free_b, free_b, staged, 0);
    CHECK_ERR_D(dp_test_unit_alloc(u, "w", 1, free_b + staged, 0, true, &off, &why, &d),
                DP_EBUSY, &d);
    CHECK_STR(why, "staged copies");
    CHECK_STR(dp_detail_msg(&d), want);

    /* One granule more: nothing pending covers it. */
    uint64_t n = free_b + staged + 64;
    snprintf(want, sizeof want,
             "unit 0: no room for %" PRIu64 " bytes in the IO area (largest free %" PRIu64
             ", free %" PRIu64 ") and nothing pending frees any",
             n, free_b, free_b);
    why = "unset";
    CHECK_ERR_D(dp_test_unit_alloc(u, "w", 1, n, 0, true, &off, &why, &d), DP_EUNITFULL,
                &d);
    CHECK(why == NULL);
    CHECK_STR(dp_detail_msg(&d), want);
    s = dp_test_unit_stats(u);
    CHECK_EQ(s.n_full, 1);
    CHECK_EQ(s.n_busy, 1);
    CHECK_EQ(s.blobs, 2); /* "open" and x: nothing allocated */
    dp__wire_reply r;
    dp__buf out = {0};
    wire_alloc(u, "w", n, &r, &out);
    check_wire_error(&r, DP_EUNITFULL, "UnitFull", want, NULL);
    dp__wire_reply_fini(&r);

    /* The copy unpinned (evictable): still short of the open allocation's room. */
    dp__unit_unpin(u, pin, strlen(pin));
    CHECK_ERR_D(dp_test_unit_alloc(u, "w", 1, n, 0, true, &off, &why, &d), DP_EUNITFULL,
                &d);
    CHECK_CONTAINS(dp_detail_msg(&d), "and nothing pending frees any");
    /* Its client aborts it: the same alloc fits. */
    dp__unit_abort(u, "open", 4, false);
    CHECK_OK_D(dp_test_unit_alloc(u, "w", 1, n, 0, true, &off, &why, &d), &d);
    CHECK(off >= dp__unit_io_base(u));
    dp__unit_abort(u, "w", 1, false);
    CHECK_EQ(read_row(u, g, 1), RD_OK);
    dp_test_unit_check(u);
    dp__buf_fini(&out);
    free(t.p);
    dp__unit_destroy(u);
    rm_dir(dir);
}

/* ---- checkpoints and the SSD tier ---- */

/* The bytes [off, off + n) of file path equal p. */
static bool
file_has(const char *path, uint64_t off, const uint8_t *p, uint64_t n)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    CHECK(fd >= 0);
    uint8_t *buf = malloc(n ? n : 1);
    bool same = pread(fd, buf, n, (off_t)off) == (ssize_t)n && memcmp(buf, p, n) == 0;
    free(buf);
    close(fd);
    return same;
}

static void
rm_shard_files(const char *path)
{
    char b[600];
    unlink(path);
    snprintf(b, sizeof b, "%s.rows", path);
    unlink(b);
}

/* The index of blob id in a save's result, or -1. */
static int
saved_index(const dp__unit_save_res *sr, const char *id)
{
    for (uint32_t i = 0; i < sr->n_blobs; i++)
        if (dp__wire_str_eq(sr->blobs[i].id, id))
            return (int)i;
    return -1;
}

/*
 * The unit of unacked_spill_unit: P (rows 1 and 2, version 1) in the put area,
 * then the put area taken by an open allocation, DP_UNIT_MAX_IO_JOBS disk
 * blobs (D0: rows 1000..1099, over 1 MiB, so a save copies its file in more
 * than one chunk; then row 2000 + i each; version 1), and X (rows 1 and 50,
 * version 2) allocated and written in the IO area, not committed.
 */
enum { UA_ND = DP_UNIT_MAX_IO_JOBS, UA_D0 = 100 };

typedef struct unacked {
    char *dir;
    dp__unit *u;
    tblob p, x;
    uint64_t off_p;
    uint64_t dg[UA_ND]; /* a row of each disk blob */
} unacked;

static void
unacked_fini(unacked *a)
{
    if (a->u != NULL)
        dp__unit_destroy(a->u);
    rm_dir(a->dir);
    free(a->p.p);
    free(a->x.p);
    memset(a, 0, sizeof *a);
}

/*
 * Build the unit above, then fill the io queue with stage jobs of the disk
 * blobs (queued under the unit lock, so none can start, let alone end) and
 * commit X at once. True if X's commit found the queue full: X is validated
 * and waits, unpublished and with no io job, until it is committed again (or
 * the ticker, not running here, queues it). False if a stage ended first and
 * X was queued (it has landed by now): the caller tries again.
 */
static bool
unacked_spill_unit(unacked *a)
{
    memset(a, 0, sizeof *a);
    a->dir = mk_dir();
    a->u = mk_clock_unit(64 << 10, 32 << 20, a->dir, 10);
    dp__unit *u = a->u;
    uint64_t gp[2] = {1, 2}, gx[2] = {1, 50};
    a->p = rows_blob(gp, 2, 1);
    a->x = rows_blob(gx, 2, 2);
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_OK_D(
        dp_test_unit_alloc(u, "P", 1, a->p.len, a->p.n, false, &a->off_p, NULL, &d), &d);
    dp_test_write_blob(u, "P", a->off_p, a->p.p, a->p.len);
    dp__wire_commit_state st;
    CHECK_OK_D(dp__unit_commit(u, "P", 1, &st, &d), &d);
    CHECK_EQ(st, DP_WIRE_COMMIT_DONE);
    uint64_t off;
    CHECK_OK_D(dp_test_unit_alloc(u, "fill", 4, dp_test_unit_stats(u).largest_free, 0,
                                  false, &off, NULL, &d),
               &d);
    for (uint32_t i = 0; i < UA_ND; i++) {
        uint64_t g[UA_D0];
        uint32_t n = i == 0 ? UA_D0 : 1;
        for (uint32_t k = 0; k < n; k++)
            g[k] = i == 0 ? 1000 + k : 2000 + i;
        a->dg[i] = g[0];
        tblob t = rows_blob(g, n, 1);
        CHECK(i > 0 || t.len > (1 << 20));
        char id[16];
        snprintf(id, sizeof id, "D%u", i);
        bool sp = false;
        CHECK_EQ(put_spill(u, id, &t, &sp), DP_WIRE_COMMIT_DONE);
        CHECK(sp);
        free(t.p);
    }
    CHECK_OK_D(dp_test_unit_alloc(u, "X", 1, a->x.len, a->x.n, true, &off, NULL, &d), &d);
    CHECK(off >= dp__unit_io_base(u));
    dp_test_write_blob(u, "X", off, a->x.p, a->x.len);
    dp__unit_stats s = dp_test_unit_stats(u);
    CHECK_EQ(s.io_jobs, 0);
    CHECK_EQ(s.disk_blobs, UA_ND);
    uint64_t spills = s.spills;

    uint32_t pending = 0;
    dp__unit_lock(u);
    for (uint32_t i = 0; i < UA_ND; i++) {
        char k[48];
        snprintf(k, sizeof k, "%" PRIu64 "@a", a->dg[i]);
        dp__wire_str kk = dp__wire_s(k);
        dp__unit_resolve_keys_res r;
        if (dp__unit_resolve_keys_locked(u, &kk, 1, &r, NULL) == 0) {
            pending += r.n_pending;
            dp__unit_resolve_keys_res_fini(&r);
        }
    }
    dp__unit_unlock(u);
    CHECK_OK_D(dp__unit_commit(u, "X", 1, &st, &d), &d);
    CHECK_EQ(pending, UA_ND);
    CHECK_EQ(st, DP_WIRE_COMMIT_PENDING);
    wait_idle(u);
    s = dp_test_unit_stats(u);
    CHECK_EQ(s.stages, UA_ND);
    return s.spills == spills;
}

/*
 * A save while a spill's commit is still "pending" (validated, its io job
 * not run: here it found the io queue full) skips that spill: the spill is
 * not published, so the checkpoint holds what the unit published, and the
 * rows the spill overwrites keep their older version there. Checked byte for
 * byte: the shard holds the put-area blob exactly as the unit does and no
 * blob of the spill; loaded into a fresh unit, row 1 reads at version 1 and
 * the spill's new row 50 is missing, the disk blobs are all there. The spill
 * is not lost: committed again it lands (row 1 at version 2, row 50), and a
 * save then holds it.
 */
DP_TEST(save_skips_a_spill_not_yet_acknowledged)
{
    /*
     * X's commit races the io thread's first stage: it wins at once on an
     * idle machine; with every core busy the test thread, once it waits for
     * the unit lock, can be kept off the CPU while stages end, and lost about
     * one try in three here (under 3 busy loops on 2 cores): 12 tries.
     */
    unacked a = {0};
    bool waiting = false;
    int tries = 0;
    while (tries < 12 && !waiting) {
        if (a.u != NULL)
            unacked_fini(&a);
        waiting = unacked_spill_unit(&a);
        tries++;
    }
    CHECKF(waiting, "in 12 tries, a stage job always ended before X's commit");
    printf("  X's commit found the io queue full on try %d\n", tries);
    dp__unit *u = a.u;
    char *cdir = mk_dir();
    char path[300], path2[300];
    snprintf(path, sizeof path, "%s/one", cdir);
    snprintf(path2, sizeof path2, "%s/two", cdir);
    dp__unit_save_res sr;
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_OK_D(dp__unit_save_shard(u, path, strlen(path), &sr, &d), &d);
    CHECK_EQ(sr.n_blobs, 1 + UA_ND); /* P and the disk blobs: not X, not "fill" */
    CHECK_EQ(saved_index(&sr, "X"), -1);
    CHECK_EQ(saved_index(&sr, "fill"), -1);
    int ip = saved_index(&sr, "P");
    CHECK(ip >= 0);
    CHECK_EQ_U64(sr.blobs[ip].nbytes, a.p.len);
    CHECK(file_has(path, sr.blobs[ip].off, dp__unit_slab(u) + a.off_p, a.p.len));
    CHECK_EQ(dp_test_unit_stats(u).spills, UA_ND); /* X is still pending */

    dp__unit *v = mk_clock_unit(16 << 20, 0, NULL, 10);
    dp__unit_load_res lr;
    CHECK_OK_D(dp_test_load_shard(v, path, sr.blobs, sr.n_blobs, false, &lr, &d), &d);
    CHECK_EQ(lr.n_loaded, 1 + UA_ND);
    CHECK_EQ(lr.n_failed, 0);
    dp__unit_load_res_fini(&lr);
    CHECK_EQ(read_row(v, 1, 1), RD_OK);
    CHECK_EQ(read_row(v, 2, 1), RD_OK);
    CHECK_EQ(read_row(v, 50, 2), RD_MISSING);
    CHECK_EQ(read_row(v, 1000, 1), RD_OK);
    CHECK_EQ(read_row(v, 1000 + UA_D0 - 1, 1), RD_OK);
    CHECK_EQ(read_row(v, a.dg[UA_ND - 1], 1), RD_OK);
    CHECK_EQ(dp_test_unit_stats(v).entries, 2 * (2 + UA_D0 + (UA_ND - 1)));
    dp_test_unit_check(v);
    dp__unit_destroy(v);

    /* Committed again, X is queued and lands: it was pending, never lost. */
    dp__wire_commit_state st;
    double t0 = dp_test_now();
    do {
        CHECK_OK_D(dp__unit_commit(u, "X", 1, &st, &d), &d);
        if (st == DP_WIRE_COMMIT_PENDING)
            dp__sleep_s(0.001);
    } while (st == DP_WIRE_COMMIT_PENDING && dp_test_now() - t0 < 30);
    CHECK_EQ(st, DP_WIRE_COMMIT_DONE);
    CHECK_EQ(read_row(u, 1, 2), RD_OK);
    CHECK_EQ(read_row(u, 50, 2), RD_OK);
    CHECK_EQ(read_row(u, 2, 1), RD_OK);

    /* A save now holds X; P keeps only row 2 live. */
    dp__unit_save_res sr2;
    CHECK_OK_D(dp__unit_save_shard(u, path2, strlen(path2), &sr2, &d), &d);
    CHECK_EQ(sr2.n_blobs, 2 + UA_ND);
    CHECK(saved_index(&sr2, "X") >= 0);
    v = mk_clock_unit(16 << 20, 0, NULL, 10);
    CHECK_OK_D(dp_test_load_shard(v, path2, sr2.blobs, sr2.n_blobs, false, &lr, &d), &d);
    CHECK_EQ(lr.n_loaded, 2 + UA_ND);
    dp__unit_load_res_fini(&lr);
    CHECK_EQ(read_row(v, 1, 2), RD_OK);
    CHECK_EQ(read_row(v, 50, 2), RD_OK);
    CHECK_EQ(read_row(v, 2, 1), RD_OK);
    CHECK_EQ(dp_test_unit_stats(v).entries, 2 * (3 + UA_D0 + (UA_ND - 1)));
    dp_test_unit_check(v);
    dp__unit_destroy(v);
    dp_test_unit_check(u);

    dp__unit_save_res_fini(&sr);
    dp__unit_save_res_fini(&sr2);
    rm_shard_files(path);
    rm_shard_files(path2);
    rm_dir(cdir);
    unacked_fini(&a);
}

/* ---- loads that cannot place a blob on disk ---- */

/*
 * stderr (where the unit logs) into a file from cap_begin to cap_end; the
 * text is echoed to stderr at the end so the test's output keeps it.
 */
typedef struct capture {
    int saved;
    char path[64];
} capture;

static void
cap_begin(capture *c)
{
    snprintf(c->path, sizeof c->path, "/tmp/dp-ssd-log-XXXXXX");
    int fd = mkstemp(c->path);
    CHECK(fd >= 0);
    fflush(stderr);
    c->saved = dup(2);
    CHECK(c->saved >= 0);
    CHECK(dup2(fd, 2) == 2);
    close(fd);
}

/* What was captured so far (malloc'd, NUL-terminated). */
static char *
cap_text(const capture *c)
{
    int fd = open(c->path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    char *t = NULL;
    if (fd >= 0 && fstat(fd, &st) == 0 &&
        (t = calloc(1, (size_t)st.st_size + 1)) != NULL) {
        ssize_t n = pread(fd, t, (size_t)st.st_size, 0);
        t[n > 0 ? n : 0] = '\0';
    }
    if (fd >= 0)
        close(fd);
    return t != NULL ? t : strdup("");
}

static char *
cap_end(capture *c)
{
    fflush(stderr);
    dup2(c->saved, 2);
    close(c->saved);
    char *t = cap_text(c);
    unlink(c->path);
    fputs(t, stderr);
    return t;
}

/*
 * A shard at path of three blobs (version 1) saved from a unit without the
 * SSD tier: B1 (row 1) and B3 (row 5), each under 40 KiB, and B2 (rows
 * 20..27), over 64 KiB.
 */
static void
save_b123(const char *path, dp__unit_save_res *sr)
{
    dp__unit *u = mk_clock_unit(1 << 20, 0, NULL, 10);
    uint64_t g1 = 1, g3 = 5, g2[8];
    for (int i = 0; i < 8; i++)
        g2[i] = 20 + (uint64_t)i;
    tblob t[3] = {rows_blob(&g1, 1, 1), rows_blob(g2, 8, 1), rows_blob(&g3, 1, 1)};
    CHECK(t[0].len < (40 << 10) && t[2].len < (40 << 10));
    CHECK(t[0].len + t[2].len < (60 << 10) && t[1].len > (64 << 10));
    const char *ids[3] = {"B1", "B2", "B3"};
    for (int i = 0; i < 3; i++) {
        CHECK_EQ(put_spill(u, ids[i], &t[i], NULL), DP_WIRE_COMMIT_DONE);
        free(t[i].p);
    }
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_OK_D(dp__unit_save_shard(u, path, strlen(path), sr, &d), &d);
    CHECK_EQ(sr->n_blobs, 3);
    dp__unit_destroy(u);
}

/* Rows of B1 and B3 (b13) and of B2 (b2) read back byte for byte, or are missing. */
static void
check_b123(dp__unit *u, bool b13, bool b2)
{
    CHECK_EQ(read_row(u, 1, 1), b13 ? RD_OK : RD_MISSING);
    CHECK_EQ(read_row(u, 5, 1), b13 ? RD_OK : RD_MISSING);
    for (uint64_t g = 20; g < 28; g++)
        CHECK_EQ(read_row(u, g, 1), b2 ? RD_OK : RD_MISSING);
}

/* A load's lists: loaded ids joined by ',', then '|', then the failed ones. */
static void
load_lists(const dp__unit_load_res *lr, char *buf, size_t cap)
{
    size_t k = 0;
    buf[0] = '\0';
    for (uint32_t i = 0; i < lr->n_loaded; i++)
        k += (size_t)snprintf(buf + k, cap - k, "%s%.*s", i ? "," : "",
                              DP_WIRE_STR_ARG(lr->loaded[i]));
    k += (size_t)snprintf(buf + k, cap - k, "|");
    for (uint32_t i = 0; i < lr->n_failed; i++)
        k += (size_t)snprintf(buf + k, cap - k, "%s%.*s", i ? "," : "",
                              DP_WIRE_STR_ARG(lr->failed[i]));
}

/* Load blobs[0, n) of path into u with spill; rc, and the lists into buf. */
static int
load_spill(dp__unit *u, const char *path, const dp__wire_shard_blob *blobs, uint32_t n,
           char *buf, size_t cap, dp_detail *d)
{
    dp__unit_load_res lr;
    int rc = dp_test_load_shard(u, path, blobs, n, true, &lr, d);
    buf[0] = '\0';
    if (rc == 0)
        load_lists(&lr, buf, cap);
    dp__unit_load_res_fini(&lr);
    return rc;
}

/*
 * A load that cannot place a blob on disk answers it "failed" (the load
 * itself succeeds with what it could place), so that its caller loads it
 * elsewhere: here with the SSD tier off though spill was asked for, and with
 * the tier on but an IO area smaller than the blob (it could never be staged
 * back). The blobs that fit are loaded byte for byte, nothing of the failed
 * one is published or left open, the unit goes on serving (a put, a read, the
 * same load again), and a unit whose IO area takes the blob loads it to disk.
 */
DP_TEST(load_answers_failed_for_blobs_it_cannot_place_on_disk)
{
    char *cdir = mk_dir();
    char path[300], lists[128];
    snprintf(path, sizeof path, "%s/b123", cdir);
    dp__unit_save_res sr;
    save_b123(path, &sr);
    int i2 = saved_index(&sr, "B2");
    CHECK(i2 >= 0);
    dp_detail d;
    dp_detail_clear(&d);

    /* The tier off: B2 fits neither the 64 KiB put area nor anywhere else. */
    dp__unit *v = mk_clock_unit(64 << 10, 0, NULL, 10);
    CHECK_OK_D(load_spill(v, path, sr.blobs, sr.n_blobs, lists, sizeof lists, &d), &d);
    CHECK_STR(lists, "B1,B3|B2");
    dp__unit_stats s = dp_test_unit_stats(v);
    CHECK_EQ(s.published, 2);
    CHECK_EQ(s.loaded_blobs, 2);
    CHECK_EQ(s.loads, 1);
    CHECK_EQ(s.disk_blobs, 0);
    CHECK_EQ(s.files_open, 0);
    check_b123(v, true, false);
    uint64_t g9 = 9;
    tblob t9 = rows_blob(&g9, 1, 1);
    CHECK_EQ(put_spill(v, "after", &t9, NULL), DP_WIRE_COMMIT_DONE);
    CHECK_EQ(read_row(v, 9, 1), RD_OK);
    CHECK_OK_D(load_spill(v, path, sr.blobs, sr.n_blobs, lists, sizeof lists, &d), &d);
    CHECK_STR(lists, "B1,B3|B2"); /* B1 and B3 already there */
    CHECK_EQ(dp_test_unit_stats(v).published, 3);
    dp_test_unit_check(v);
    dp__unit_destroy(v);

    /* The tier on, its IO area (64 KiB) smaller than B2: failed, no file made. */
    char *dir = mk_dir();
    dp__unit *w = mk_clock_unit(4096, 64 << 10, dir, 10);
    CHECK_OK_D(load_spill(w, path, &sr.blobs[i2], 1, lists, sizeof lists, &d), &d);
    CHECK_STR(lists, "|B2");
    s = dp_test_unit_stats(w);
    CHECK_EQ(s.published, 0);
    CHECK_EQ(s.files_open, 0);
    CHECK_EQ(s.loads, 1);
    CHECK_EQ(read_row(w, 20, 1), RD_MISSING);
    CHECK_EQ(put_spill(w, "after", &t9, NULL), DP_WIRE_COMMIT_DONE);
    CHECK_EQ(read_row(w, 9, 1), RD_OK);
    dp_test_unit_check(w);
    dp__unit_destroy(w);

    /* Elsewhere: an IO area that takes it; B2 goes to disk and reads back. */
    dp__unit *x = mk_clock_unit(4096, 1 << 20, dir, 10);
    CHECK_OK_D(load_spill(x, path, &sr.blobs[i2], 1, lists, sizeof lists, &d), &d);
    CHECK_STR(lists, "B2|");
    s = dp_test_unit_stats(x);
    CHECK_EQ(s.disk_blobs, 1);
    CHECK_EQ(s.files_open, 1);
    CHECK_EQ(dir_count(dir), 0);
    for (uint64_t g = 20; g < 28; g++)
        CHECK_EQ(read_row(x, g, 1), RD_OK);
    dp_test_unit_check(x);
    dp__unit_destroy(x);
    free(t9.p);
    dp__unit_save_res_fini(&sr);
    rm_shard_files(path);
    rm_dir(cdir);
    rm_dir(dir);
}

/*
 * The same when writing the blob to disk fails for real: past a file size
 * limit (SIGXFSZ ignored) the write fails with EFBIG, and with ssd_dir
 * removed the file cannot be created. The blob is answered "failed" and the
 * warning names it and the cause; no file of it stays open; the blobs whose
 * files were written are loaded and read back from disk byte for byte; the
 * unit goes on serving, and once the disk works the same load places it.
 */
DP_TEST(load_answers_failed_when_the_spill_file_fails)
{
    char *cdir = mk_dir();
    char path[300], lists[128];
    snprintf(path, sizeof path, "%s/b123", cdir);
    dp__unit_save_res sr;
    save_b123(path, &sr);
    int i2 = saved_index(&sr, "B2");
    CHECK(i2 >= 0);
    char *dir = mk_dir();
    char sub[300];
    snprintf(sub, sizeof sub, "%s/ssd", dir);
    CHECK(mkdir(sub, 0700) == 0);
    /* A 4 KiB put area: every blob of the shard goes to disk. */
    dp__unit *u = mk_clock_unit(4096, 1 << 20, sub, 10);
    dp_detail d;
    dp_detail_clear(&d);

    struct rlimit old, lim;
    CHECK(getrlimit(RLIMIT_FSIZE, &old) == 0);
    struct sigaction ign = {0}, oldsa;
    ign.sa_handler = SIG_IGN;
    CHECK(sigaction(SIGXFSZ, &ign, &oldsa) == 0);
    lim = old;
    lim.rlim_cur = 40 << 10;
    CHECK(setrlimit(RLIMIT_FSIZE, &lim) == 0);
    capture c;
    cap_begin(&c);
    int rc = load_spill(u, path, sr.blobs, sr.n_blobs, lists, sizeof lists, &d);
    char *log = cap_end(&c);
    CHECK(setrlimit(RLIMIT_FSIZE, &old) == 0);
    CHECK(sigaction(SIGXFSZ, &oldsa, NULL) == 0);
    CHECK_OK_D(rc, &d);
    CHECK_STR(lists, "B1,B3|B2");
    /* (Not "blob B2 failed": the id is printed with %s from the rows file,
     * where it is not NUL-terminated, so bytes after it follow.) */
    CHECK_CONTAINS(log, "unit 0: load: spill of blob B2");
    CHECK_CONTAINS(log, "File too large");
    CHECK(strstr(log, "blob B1") == NULL && strstr(log, "blob B3") == NULL);
    free(log);
    dp__unit_stats s = dp_test_unit_stats(u);
    CHECK_EQ(s.published, 2);
    CHECK_EQ(s.loaded_blobs, 2);
    CHECK_EQ(s.disk_blobs, 2);
    CHECK_EQ(s.files_open, 2);
    int fds[8];
    CHECK_EQ(spill_fds(sub, fds, 8), 2); /* B2's file is closed */
    check_b123(u, true, false);          /* B1 and B3 staged back from disk */
    dp_test_unit_check(u);

    /* ssd_dir gone: B2's file cannot be created. */
    CHECK(rmdir(sub) == 0);
    cap_begin(&c);
    rc = load_spill(u, path, &sr.blobs[i2], 1, lists, sizeof lists, &d);
    log = cap_end(&c);
    CHECK(mkdir(sub, 0700) == 0);
    CHECK_OK_D(rc, &d);
    CHECK_STR(lists, "|B2");
    CHECK_CONTAINS(log, "unit 0: load: spill of blob B2");
    CHECK_CONTAINS(log, sub);
    free(log);
    s = dp_test_unit_stats(u);
    CHECK_EQ(s.files_open, 2);
    CHECK_EQ(s.loads, 2);
    CHECK_EQ(read_row(u, 20, 1), RD_MISSING);

    /* It goes on serving; with the disk back, the same load places B2. */
    uint64_t g9 = 9;
    tblob t9 = rows_blob(&g9, 1, 1);
    CHECK_EQ(put_spill(u, "after", &t9, NULL), DP_WIRE_COMMIT_DONE);
    free(t9.p);
    CHECK_OK_D(load_spill(u, path, &sr.blobs[i2], 1, lists, sizeof lists, &d), &d);
    CHECK_STR(lists, "B2|");
    s = dp_test_unit_stats(u);
    CHECK_EQ(s.disk_blobs, 4);
    CHECK_EQ(s.files_open, 4);
    check_b123(u, true, true);
    CHECK_EQ(read_row(u, 9, 1), RD_OK);
    dp_test_unit_check(u);
    uint64_t all[11] = {1, 5, 9, 20, 21, 22, 23, 24, 25, 26, 27};
    CHECK_EQ(dp__unit_release_rows(u, all, 11), 22); /* two fields each */
    wait_idle(u);
    CHECK_EQ(dp_test_unit_stats(u).files_open, 0);
    dp__unit_destroy(u);
    CHECK(rmdir(sub) == 0);
    rm_dir(dir);
    dp__unit_save_res_fini(&sr);
    rm_shard_files(path);
    rm_dir(cdir);
}

/* ---- the 30 s log lines ---- */

/* Wait (bounded) for u's ticker to run twice more: a tick that saw the clock as
 * it is now has ended, and logged. False if it did not. */
static bool
two_more_ticks(dp__unit *u)
{
    uint64_t t0 = dp_test_unit_stats(u).n_ticks;
    double s = dp_test_now();
    while (dp_test_unit_stats(u).n_ticks < t0 + 2 && dp_test_now() - s < 30)
        dp__sleep_s(0.001);
    return dp_test_unit_stats(u).n_ticks >= t0 + 2;
}

static int
count_of(const char *hay, const char *needle)
{
    int n = 0;
    for (const char *p = hay; (p = strstr(p, needle)) != NULL; p += strlen(needle))
        n++;
    return n;
}

/*
 * A running unit (its ticker started) logs a line of its counters once 30 s
 * have passed and they changed, and with the SSD tier a second line of the
 * tier's counters: each with the counters' values (sizes as dp__fmt_size
 * writes them), none before 30 s have passed, none while nothing changed, new
 * ones once something did. A unit without the tier logs no SSD line. On
 * lease_clock: the tickers run every 2 ms and the test moves the clock.
 */
DP_TEST(running_unit_logs_its_counters_and_ssd_counters)
{
    dp__log_set_level(DP_LOG_INFO);
    char *dir = mk_dir();
    dp__unit *u = mk_clock_unit(4096, 1 << 20, dir, 10);
    /* Without the tier: unit 1 of 2 (row 7 is its own). */
    dp__unit_opts o;
    dp__unit_opts_init(&o);
    o.slab_bytes = 1 << 20;
    o.n_units = 2;
    o.unit_id = 1;
    o.numa = DP_UNIT_NUMA_OFF;
    o.now = lease_now;
    dp__unit *v = NULL;
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_OK_D(dp__unit_create(&o, &v, &d), &d);
    uint64_t g = 3, g7 = 7;
    tblob t = rows_blob(&g, 1, 1), t7 = rows_blob(&g7, 1, 1);
    CHECK_EQ(put_spill(u, "x", &t, NULL), DP_WIRE_COMMIT_DONE);
    CHECK_EQ(read_row(u, 3, 1), RD_OK); /* staged, picked up, unpinned */
    CHECK_EQ(put_spill(v, "y", &t7, NULL), DP_WIRE_COMMIT_DONE);
    dp__unit_stats su = dp_test_unit_stats(u), sv = dp_test_unit_stats(v);
    CHECK_EQ(su.spills, 1);
    CHECK_EQ(su.stages, 1);
    CHECK_EQ(su.staged_blobs, 1);
    CHECK_EQ(su.pins, 0);
    CHECK_EQ(su.allocated_bytes, 0);
    char sz[32], st[32], a[32], f[32];
    dp__fmt_size(t.len, sz, sizeof sz);
    dp__fmt_size(su.staged_bytes, st, sizeof st);
    char u1[256], s1[400], v1[256], u2[256], s2[400];
    snprintf(u1, sizeof u1,
             "info: unit 0: 1 blobs, 2 entries, 0 pins; allocated 0 B, free 4.00 KiB, "
             "quarantined 0 B, retired 0 B\n");
    snprintf(s1, sizeof s1,
             "info: unit 0 ssd: 1 spills (%s), 0 failed; 1 stages (%s), 0 failed; 0 "
             "evictions; 1 disk blobs (%s), 1 staged (%s), 0 io jobs\n",
             sz, sz, sz, st);
    snprintf(v1, sizeof v1,
             "info: unit 1: 1 blobs, 2 entries, 0 pins; allocated %s, free %s, "
             "quarantined 0 B, retired 0 B\n",
             dp__fmt_size(sv.allocated_bytes, a, sizeof a),
             dp__fmt_size(sv.free_bytes, f, sizeof f));
    snprintf(u2, sizeof u2,
             "info: unit 0: 0 blobs, 0 entries, 0 pins; allocated 0 B, free 4.00 KiB, "
             "quarantined 0 B, retired 0 B\n");
    snprintf(s2, sizeof s2,
             "info: unit 0 ssd: 1 spills (%s), 0 failed; 1 stages (%s), 0 failed; 0 "
             "evictions; 0 disk blobs (0 B), 0 staged (0 B), 0 io jobs\n",
             sz, sz);

    CHECK_OK_D(dp__unit_start_ticker(u, 0.002, &d), &d);
    CHECK_OK_D(dp__unit_start_ticker(v, 0.002, &d), &d);
    capture c;
    cap_begin(&c);
    /* No check fails while stderr is captured: the outcomes are kept for after. */
    clock_add(29);
    bool ticked = two_more_ticks(u) && two_more_ticks(v);
    char *early = cap_text(&c);
    clock_add(2);
    ticked = ticked && two_more_ticks(u) && two_more_ticks(v);
    char *first = cap_text(&c);
    clock_add(31); /* nothing changed */
    ticked = ticked && two_more_ticks(u) && two_more_ticks(v);
    char *quiet = cap_text(&c);
    uint64_t dropped = dp__unit_release_rows(u, &g, 1); /* u's counters change */
    clock_add(31);
    ticked = ticked && two_more_ticks(u) && two_more_ticks(v);
    char *all = cap_end(&c);

    CHECK(ticked);
    CHECK_EQ(dropped, 2);
    CHECKF(count_of(early, "info: unit") == 0, "logged before 30 s: %s", early);
    CHECKF(count_of(first, u1) == 1, "no line '%s' in:\n%s", u1, first);
    CHECKF(count_of(first, s1) == 1, "no line '%s' in:\n%s", s1, first);
    CHECKF(count_of(first, v1) == 1, "no line '%s' in:\n%s", v1, first);
    CHECK_EQ(count_of(first, "info: unit"), 3);
    CHECKF(count_of(quiet, "info: unit") == 3, "logged with nothing changed:\n%s", quiet);
    CHECKF(count_of(all, u2) == 1, "no line '%s' in:\n%s", u2, all);
    CHECKF(count_of(all, s2) == 1, "no line '%s' in:\n%s", s2, all);
    CHECK_EQ(count_of(all, v1), 1); /* v's counters did not change */
    CHECK_EQ(count_of(all, "info: unit"), 5);
    CHECK_EQ(count_of(all, "unit 1 ssd:"), 0);
    free(early);
    free(first);
    free(quiet);
    free(all);
    free(t.p);
    free(t7.p);
    dp__unit_destroy(v);
    dp__unit_destroy(u);
    rm_dir(dir);
}
