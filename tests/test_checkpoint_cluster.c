/*
 * Tests for checkpoints (docs/design.md, Checkpoints) of a cluster:
 * dp__ckpt_save_units and dp__ckpt_load_units over units served by ZMQ
 * (round trip, another shape refused, a corrupted or truncated shard and a
 * bad manifest refused, the newest checkpoints kept, rows on the SSD tier, a
 * saver killed midway and a unit gone during a save keeping the previous
 * checkpoint), and the CLI through real unit processes. One unit's
 * save_shard and load_shard are tested in test_checkpoint.c.
 */
#include "dp_test.h"
#include "dp_proc.h"
#include "dp_tsan_ucx.h"
#include "dp_unit_blob.h"
#include "dp_checkpoint_fixture.h"

#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "client/checkpoint.h"
#include "cluster/cluster.h"
#include "common/common.h"
#include "ctl/ctl.h"
#include "unit/unit.h"
#include "wire/wire.h"

/* ---- cluster level: units served over ZMQ, dp__ckpt_save_units / _load_units ---- */

static void
rm_tree_ckpt(const char *dir)
{
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    CHECK_EQ(system(cmd), 0);
}

DP_TEST(cluster_save_load_and_refusals)
{
    char dir[512];
    tpath("cl-ck", dir, sizeof dir);
    rm_tree_ckpt(dir);
    tcluster a, b, c3;
    tc_start(&a, 2, 8 << 20, NULL, "cl-a.json");
    tc_fill(&a, 100, 3000, 5);
    dp__ctl_client *cc = NULL;
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_OK_D(dp__ctl_client_create(&cc, &d), &d);
    dp_ckpt_summary s;
    /* Nothing saved yet. */
    tc_start(&b, 2, 8 << 20, NULL, "cl-b.json");
    CHECK_ERR_D(dp__ckpt_load_units(cc, &b.cl, dir, NULL, &s, &d), DP_ENOTFOUND, &d);
    CHECK_OK_D(dp__ckpt_save_units(cc, &a.cl, dir, NULL, &s, &d), &d);
    CHECK_EQ(s.n_units, 2);
    CHECK(s.blobs > 0);
    /* Restore into fresh units, byte for byte; cleared rows stay gone. */
    dp_ckpt_summary ls;
    CHECK_OK_D(dp__ckpt_load_units(cc, &b.cl, dir, NULL, &ls, &d), &d);
    CHECK_EQ(ls.loaded, s.blobs);
    CHECK_EQ(dp_test_unit_stats(a.u[0]).saves, 1);
    CHECK(dp_test_unit_stats(b.u[0]).loads >= 1);
    CHECK_EQ(dp_test_unit_stats(b.u[0]).loaded_blobs +
                 dp_test_unit_stats(b.u[1]).loaded_blobs,
             s.blobs);
    CHECK_EQ(dp_test_unit_stats(a.u[0]).admin_running, 0);
    CHECK_STR(ls.checkpoint, s.checkpoint);
    tc_same(&a, &b, 100, 3000, 2);
    CHECK_EQ(row_version(b.u[1], 1, 3000, 2), 0);
    CHECK_EQ(row_version(b.u[0], 0, 3000, 2), 2);
    tc_stop(&b);
    /* Another shape is refused. */
    tc_start(&c3, 3, 8 << 20, NULL, "cl-c.json");
    CHECK_ERR_D(dp__ckpt_load_units(cc, &c3.cl, dir, NULL, &ls, &d), DP_EINVAL, &d);
    CHECK_CONTAINS(dp_detail_msg(&d), "gidx % n_units");
    tc_stop(&c3);
    /* A second save becomes current; corrupting its shard is refused with the file. */
    dp_ckpt_summary s2;
    CHECK_OK_D(dp__ckpt_save_units(cc, &a.cl, dir, NULL, &s2, &d), &d);
    CHECK(strcmp(s2.checkpoint, s.checkpoint) != 0);
    char shard[1024];
    snprintf(shard, sizeof shard, "%s/%s/unit-1.shard", dir, s2.checkpoint);
    corrupt_at(shard, 100);
    tc_start(&b, 2, 8 << 20, NULL, "cl-b.json");
    CHECK_ERR_D(dp__ckpt_load_units(cc, &b.cl, dir, NULL, &ls, &d), DP_ECORRUPT, &d);
    CHECK_CONTAINS(dp_detail_msg(&d), shard);
    for (uint32_t i = 0; i < 2; i++) {
        CHECK_EQ(dp_test_unit_stats(b.u[i]).blobs, 0);
        CHECK_EQ(dp_test_unit_stats(b.u[i]).allocated_bytes, 0);
    }
    /* Truncated. */
    corrupt_at(shard, 100);
    struct stat st;
    CHECK(stat(shard, &st) == 0);
    CHECK_EQ(truncate(shard, st.st_size - 1), 0);
    CHECK_ERR_D(dp__ckpt_load_units(cc, &b.cl, dir, NULL, &ls, &d), DP_ECORRUPT, &d);
    CHECK_CONTAINS(dp_detail_msg(&d), "truncated");
    CHECK_EQ(dp_test_unit_stats(b.u[0]).blobs + dp_test_unit_stats(b.u[1]).blobs, 0);
    /* A manifest whose blob numbers are not whole numbers >= 0 is refused. */
    char mpath[1024];
    snprintf(mpath, sizeof mpath, "%s/%s", dir, DP_CKPT_MANIFEST);
    FILE *mf = fopen(mpath, "rb");
    CHECK(mf != NULL);
    char *mtext = calloc(1, 1 << 20);
    size_t mlen = fread(mtext, 1, (1 << 20) - 1, mf);
    fclose(mf);
    CHECK(mlen > 0);
    const char *bad_numbers[] = {"-1", "1.5", "1e300"};
    for (size_t k = 0; k < DP_ARRAY_LEN(bad_numbers); k++) {
        char *blobs = strstr(mtext, "\"blobs\"");
        CHECK(blobs != NULL);
        char *open_br = strchr(blobs, '[');
        CHECK(open_br != NULL);
        size_t num_len = strcspn(open_br + 1, ",");
        mf = fopen(mpath, "wb");
        CHECK(mf != NULL);
        fwrite(mtext, 1, (size_t)(open_br + 1 - mtext), mf);
        fputs(bad_numbers[k], mf);
        fputs(open_br + 1 + num_len, mf);
        fclose(mf);
        CHECK_ERR_D(dp__ckpt_load_units(cc, &b.cl, dir, NULL, &ls, &d), DP_ECORRUPT, &d);
        CHECK_CONTAINS(dp_detail_msg(&d), "bad blob entry");
        CHECK_CONTAINS(dp_detail_msg(&d), mpath);
    }
    CHECK_EQ(dp_test_unit_stats(b.u[0]).blobs + dp_test_unit_stats(b.u[1]).blobs, 0);
    free(mtext);
    tc_stop(&b);
    dp__ctl_client_destroy(cc);
    tc_stop(&a);
    rm_tree_ckpt(dir);
}

/* Count DIR's ckpt-* entries; *has gets whether name is among them. */
static int
count_ckpts(const char *dir, const char *name, bool *has)
{
    DIR *dd = opendir(dir);
    CHECK(dd != NULL);
    int n = 0;
    *has = false;
    struct dirent *e;
    while ((e = readdir(dd)) != NULL) {
        if (strncmp(e->d_name, "ckpt-", 5) != 0)
            continue;
        n++;
        if (strcmp(e->d_name, name) == 0)
            *has = true;
    }
    closedir(dd);
    return n;
}

/*
 * save with keep = 2 leaves the new checkpoint and the newest older one; a
 * directory that sorts after the new one (a save still running elsewhere) is
 * left alone; the current checkpoint loads.
 */
DP_TEST(save_keeps_the_newest_checkpoints)
{
    char dir[512];
    tpath("keep-ck", dir, sizeof dir);
    rm_tree_ckpt(dir);
    tcluster a;
    tc_start(&a, 2, 8 << 20, NULL, "keep-a.json");
    tc_fill(&a, 40, 2000, 4);
    dp__ctl_client *cc = NULL;
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_OK_D(dp__ctl_client_create(&cc, &d), &d);
    dp_ckpt_opts o;
    dp_ckpt_opts_init(&o);
    dp_ckpt_summary s[4];
    for (int i = 0; i < 3; i++)
        CHECK_OK_D(dp__ckpt_save_units(cc, &a.cl, dir, &o, &s[i], &d), &d);
    CHECK(strcmp(s[0].checkpoint, s[1].checkpoint) < 0);
    CHECK(strcmp(s[1].checkpoint, s[2].checkpoint) < 0);
    /* "Another save", newer than anything this test saves: never removed. */
    char later[600];
    snprintf(later, sizeof later, "%s/ckpt-99991231T235959.999999Z-00000000", dir);
    CHECK_EQ(mkdir(later, 0755), 0);
    bool has;
    CHECK_EQ(count_ckpts(dir, s[0].checkpoint, &has), 4);
    o.keep = 2;
    CHECK_OK_D(dp__ckpt_save_units(cc, &a.cl, dir, &o, &s[3], &d), &d);
    CHECK_EQ(count_ckpts(dir, s[3].checkpoint, &has), 3);
    CHECK(has);
    count_ckpts(dir, s[2].checkpoint, &has);
    CHECK(has);
    count_ckpts(dir, s[1].checkpoint, &has);
    CHECK(!has);
    count_ckpts(dir, "ckpt-99991231T235959.999999Z-00000000", &has);
    CHECK(has);
    CHECK_EQ(rmdir(later), 0);
    tcluster b;
    tc_start(&b, 2, 8 << 20, NULL, "keep-b.json");
    dp_ckpt_summary ls;
    CHECK_OK_D(dp__ckpt_load_units(cc, &b.cl, dir, NULL, &ls, &d), &d);
    CHECK_STR(ls.checkpoint, s[3].checkpoint);
    tc_same(&a, &b, 40, 2000, 2);
    tc_stop(&b);
    dp__ctl_client_destroy(cc);
    tc_stop(&a);
    rm_tree_ckpt(dir);
}

DP_TEST(cluster_ssd_rows_two_passes)
{
    char dir[512], ssd[512];
    tpath("cl-ssd", dir, sizeof dir);
    tpath("ssd", ssd, sizeof ssd);
    rm_tree_ckpt(dir);
    mkdir(ssd, 0700);
    tcluster a, b;
    /* 256 KiB put areas: most of the 1.2 MiB per unit spills to the SSD tier. */
    tc_start(&a, 2, 256 << 10, ssd, "ssd-a.json");
    uint32_t nb = 0;
    for (uint64_t g = 0; g < 40; g++) {
        char id[32];
        snprintf(id, sizeof id, "s%u", nb++);
        CHECK_OK(
            put_rows_spill(a.u[g % 2], id, &g, 1, 1 + (uint32_t)(g % 2), 60000, true));
    }
    uint64_t gc = 5;
    dp__unit_release_rows(a.u[1], &gc, 1);
    CHECK(dp_test_unit_stats(a.u[0]).disk_blobs > 0);
    dp__ctl_client *cc = NULL;
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_OK_D(dp__ctl_client_create(&cc, &d), &d);
    dp_ckpt_summary s, ls;
    CHECK_OK_D(dp__ckpt_save_units(cc, &a.cl, dir, NULL, &s, &d), &d);
    CHECK_EQ(s.blobs, 39);
    tc_start(&b, 2, 256 << 10, ssd, "ssd-b.json");
    CHECK_OK_D(dp__ckpt_load_units(cc, &b.cl, dir, NULL, &ls, &d), &d);
    CHECK_EQ(ls.loaded, 39);
    CHECK(ls.spilled > 0);
    CHECK(dp_test_unit_stats(b.u[0]).disk_blobs > 0);
    tc_same(&a, &b, 40, 60000, 2);
    tc_stop(&b);
    dp__ctl_client_destroy(cc);
    tc_stop(&a);
    rm_tree_ckpt(dir);
    rmdir(ssd);
}

/*
 * A saver killed midway: this program re-executed with DP_CKPT_SAVER=
 * "<cluster file>|<dir>" runs one dp__ckpt_save_units and exits.
 */
__attribute__((constructor)) static void
saver_main(void)
{
    const char *e = getenv("DP_CKPT_SAVER");
    if (e == NULL)
        return;
    char buf[1100];
    snprintf(buf, sizeof buf, "%s", e);
    char *bar = strchr(buf, '|');
    if (bar == NULL)
        _exit(3);
    *bar = '\0';
    dp__cluster cl;
    dp_detail d;
    dp_detail_clear(&d);
    dp__ctl_client *cc = NULL;
    dp_ckpt_summary s;
    if (dp__cluster_load(buf, &cl, &d) != 0 || dp__ctl_client_create(&cc, &d) != 0)
        _exit(4);
    int rc = dp__ckpt_save_units(cc, &cl, bar + 1, NULL, &s, &d);
    dp__ctl_client_destroy(cc);
    dp__cluster_fini(&cl);
    _exit(rc == 0 ? 0 : 5);
}

static char *
read_manifest(const char *dir)
{
    char p[1100];
    snprintf(p, sizeof p, "%s/%s", dir, DP_CKPT_MANIFEST);
    FILE *f = fopen(p, "rb");
    CHECK(f != NULL);
    char *m = calloc(1, 1 << 20);
    size_t n = fread(m, 1, (1 << 20) - 1, f);
    (void)n;
    fclose(f);
    return m;
}

/* Saves and loads running now on t's units, summed. */
static uint64_t
tc_admin_running(tcluster *t)
{
    uint64_t n = 0;
    for (uint32_t i = 0; i < t->n; i++)
        n += dp_test_unit_stats(t->u[i]).admin_running;
    return n;
}

/* Saves t's units have completed, summed. */
static uint64_t
tc_saves(tcluster *t)
{
    uint64_t n = 0;
    for (uint32_t i = 0; i < t->n; i++)
        n += dp_test_unit_stats(t->u[i]).saves;
    return n;
}

DP_TEST(save_killed_midway_keeps_previous)
{
    char dir[512];
    tpath("cl-kill", dir, sizeof dir);
    rm_tree_ckpt(dir);
    tcluster a, b;
    tc_start(&a, 2, 64 << 20, NULL, "kill-a.json");
    tc_fill(&a, 64, 400000, 4); /* ~16 MiB per unit: a save takes a while */
    dp__ctl_client *cc = NULL;
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_OK_D(dp__ctl_client_create(&cc, &d), &d);
    dp_ckpt_summary s;
    CHECK_OK_D(dp__ckpt_save_units(cc, &a.cl, dir, NULL, &s, &d), &d);
    uint64_t rs = dp_test_seed();
    int killed = 0, midway = 0;
    for (int round = 0; round < 6; round++) {
        char *before = read_manifest(dir);
        char env[1200];
        snprintf(env, sizeof env, "%s|%s", a.file, dir);
        const char *saver[] = {"DP_CKPT_SAVER", env, NULL};
        uint64_t saves0 = tc_saves(&a);
        pid_t pid = dp_test_spawn_self(saver, -1);
        /* Midway: once a unit runs the save (not before the saver connected). */
        bool began = false;
        for (double t0 = dp_test_now(); !began;) {
            began = tc_admin_running(&a) > 0 || tc_saves(&a) > saves0;
            siginfo_t si = {0};
            if (waitid(P_PID, (id_t)pid, &si, WEXITED | WNOHANG | WNOWAIT) == 0 &&
                si.si_pid == pid)
                break; /* the saver ended by itself */
            CHECKF(dp_test_now() - t0 < 60, "the saver did not reach the units in 60 s");
            usleep(200);
        }
        usleep((useconds_t)(dp_test_rand(&rs) % 40000));
        kill(pid, SIGKILL);
        int st = 0;
        CHECK_EQ(waitpid(pid, &st, 0), pid);
        if (WIFSIGNALED(st))
            killed++;
        else
            CHECK_EQ(WEXITSTATUS(st), 0);
        midway += began && WIFSIGNALED(st);
        /* The units finish the shards of a killed save before the next round. */
        for (double t0 = dp_test_now(); tc_admin_running(&a) > 0;)
            CHECKF(dp_test_now() - t0 < 60, "a save still runs after 60 s");
        char *after = read_manifest(dir);
        /* Killed: the previous manifest, whole; finished: a complete new one. */
        if (WIFSIGNALED(st) && strcmp(before, after) != 0)
            CHECK(strstr(after, "\"units\"") != NULL);
        free(before);
        free(after);
    }
    DP_LOG_I("checkpoint: %d of 6 saves killed, %d of them midway", killed, midway);
    CHECK_GE(midway, 1); /* a save was killed while the units ran it */
    /* The units finish the shards of a killed save; give them time, then load. */
    usleep(300000);
    tc_start(&b, 2, 64 << 20, NULL, "kill-b.json");
    dp_ckpt_summary ls;
    CHECK_OK_D(dp__ckpt_load_units(cc, &b.cl, dir, NULL, &ls, &d), &d);
    tc_same(&a, &b, 64, 400000, 2);
    tc_stop(&b);
    dp__ctl_client_destroy(cc);
    tc_stop(&a);
    rm_tree_ckpt(dir);
}

DP_TEST(unit_gone_during_save_keeps_previous)
{
    char dir[512];
    tpath("cl-gone", dir, sizeof dir);
    rm_tree_ckpt(dir);
    tcluster a, b;
    tc_start(&a, 2, 8 << 20, NULL, "gone-a.json");
    tc_fill(&a, 40, 2000, 4);
    dp__ctl_client *cc = NULL;
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_OK_D(dp__ctl_client_create(&cc, &d), &d);
    dp_ckpt_summary s, s2, ls;
    CHECK_OK_D(dp__ckpt_save_units(cc, &a.cl, dir, NULL, &s, &d), &d);
    /* More data, then unit 1 stops answering: the save fails, naming it. */
    uint64_t g = 2;
    CHECK_OK(put_rows(a.u[0], "late", &g, 1, 3, 2000));
    dp__ctl_server_close(a.srv[1]);
    a.srv[1] = NULL;
    dp_ckpt_opts o;
    dp_ckpt_opts_init(&o);
    o.timeout_s = 1;
    CHECK(dp__ckpt_save_units(cc, &a.cl, dir, &o, &s2, &d) != 0);
    CHECK_CONTAINS(dp_detail_msg(&d), "unit 1");
    char failed[1100];
    snprintf(failed, sizeof failed, "%s/%s", dir, s2.checkpoint);
    CHECKF(access(failed, F_OK) != 0, "%s left behind", failed);
    /* The previous checkpoint is still the current one, and loads. */
    tc_start(&b, 2, 8 << 20, NULL, "gone-b.json");
    CHECK_OK_D(dp__ckpt_load_units(cc, &b.cl, dir, NULL, &ls, &d), &d);
    CHECK_STR(ls.checkpoint, s.checkpoint);
    CHECK_EQ(row_version(b.u[0], 2, 2000, 3), 1); /* not the late put */
    tc_stop(&b);
    dp__ctl_client_destroy(cc);
    tc_stop(&a);
    rm_tree_ckpt(dir);
}

/* ---- the CLI through real unit processes (dataplane up / put / save / load / get) ----
 */

#if defined(DP_CLI_PATH)
static int
cli(const char *args, char *out, size_t cap)
{
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "'%s' %s 2>&1", DP_CLI_PATH, args);
    return dp_test_run_sh(cmd, out, cap);
}

static pid_t
up_start(const char *dir, uint32_t units)
{
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "exec '%s' up --dir '%s' --units %u --slab 32M --numa off >'%s.out' 2>&1",
             DP_CLI_PATH, dir, units, dir);
    fflush(NULL);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    char file[600];
    snprintf(file, sizeof file, "%s/cluster.json", dir);
    double end = dp_test_now() + 60;
    while (access(file, F_OK) != 0 && dp_test_now() < end)
        usleep(20000);
    CHECKF(access(file, F_OK) == 0, "dataplane up did not write %s", file);
    return pid;
}

static void
up_stop(pid_t pid)
{
    kill(pid, SIGTERM);
    int st = 0;
    CHECK_EQ(waitpid(pid, &st, 0), pid);
}

DP_TEST(cli_save_load_fresh_processes)
{
#ifdef DP_TEST_TSAN
    DP_SKIP("real `dataplane up` processes are not run under ThreadSanitizer (the "
            "in-process save and load tests cover the threads)");
#endif
    char dir[512], c1[600], c2[600], ck[600], args[3000], out[8192], f[600], g[600];
    tpath("cli", dir, sizeof dir);
    rm_tree_ckpt(dir);
    CHECK_EQ(mkdir(dir, 0700), 0);
    snprintf(c1, sizeof c1, "%s/c1", dir);
    snprintf(c2, sizeof c2, "%s/c2", dir);
    snprintf(ck, sizeof ck, "%s/ck", dir);
    pid_t up1 = up_start(c1, 2);
    /* Values: rows 0..5, row 4 overwritten, row 5 cleared. */
    for (int r = 0; r < 6; r++) {
        snprintf(f, sizeof f, "%s/v%d", dir, r);
        FILE *fp = fopen(f, "wb");
        CHECK(fp != NULL);
        for (int k = 0; k < 3000 + r * 10007; k++)
            fputc((r * 37 + k * 11) & 0xff, fp);
        fclose(fp);
        snprintf(args, sizeof args, "put --cluster '%s' --row %d --field x --file '%s'",
                 c1, r, f);
        CHECKF(cli(args, out, sizeof out) == 0, "%s", out);
    }
    snprintf(f, sizeof f, "%s/v0", dir);
    snprintf(args, sizeof args, "put --cluster '%s' --row 4 --field x --file '%s'", c1,
             f);
    CHECKF(cli(args, out, sizeof out) == 0, "%s", out);
    snprintf(args, sizeof args, "clear --cluster '%s' 5", c1);
    CHECKF(cli(args, out, sizeof out) == 0, "%s", out);
    snprintf(args, sizeof args, "save --cluster '%s' '%s'", c1, ck);
    CHECKF(cli(args, out, sizeof out) == 0, "%s", out);
    CHECK_CONTAINS(out, "saved ckpt-");
    CHECK_CONTAINS(out, "save: unit 1:");
    up_stop(up1);

    pid_t up2 = up_start(c2, 2);
    snprintf(args, sizeof args, "load --cluster '%s' '%s'", c2, ck);
    CHECKF(cli(args, out, sizeof out) == 0, "%s", out);
    CHECK_CONTAINS(out, "loaded ckpt-");
    for (int r = 0; r < 6; r++) {
        snprintf(g, sizeof g, "%s/got%d", dir, r);
        snprintf(args, sizeof args, "get --cluster '%s' %d@x -o '%s'", c2, r, g);
        int st = cli(args, out, sizeof out);
        if (r == 5) {
            CHECKF(st != 0, "cleared row 5 came back: %s", out);
            continue;
        }
        CHECKF(st == 0, "%s", out);
        snprintf(f, sizeof f, "%s/v%d", dir, r == 4 ? 0 : r);
        snprintf(args, sizeof args, "cmp -s '%s' '%s'", f, g);
        CHECKF(system(args) == 0, "row %d differs after the restore", r);
    }
    up_stop(up2);
    /* Another shape: re-homed through the command, every row where it now lives. */
    pid_t up3 = up_start(c1, 3);
    snprintf(args, sizeof args, "load --cluster '%s' '%s'", c1, ck);
    CHECKF(cli(args, out, sizeof out) == 0, "%s", out);
    CHECK_CONTAINS(out, "re-homing");
    CHECK_CONTAINS(out, "re-homed from 2 units into 3");
    for (int r = 0; r < 6; r++) {
        snprintf(g, sizeof g, "%s/got%d", dir, r);
        snprintf(args, sizeof args, "get --cluster '%s' %d@x -o '%s'", c1, r, g);
        int st = cli(args, out, sizeof out);
        if (r == 5) {
            CHECKF(st != 0, "cleared row 5 came back: %s", out);
            continue;
        }
        CHECKF(st == 0, "%s", out);
        CHECK_CONTAINS(out, r % 3 == 0 ? "unit 0" : r % 3 == 1 ? "unit 1" : "unit 2");
        snprintf(f, sizeof f, "%s/v%d", dir, r == 4 ? 0 : r);
        snprintf(args, sizeof args, "cmp -s '%s' '%s'", f, g);
        CHECKF(system(args) == 0, "row %d differs after the re-homed restore", r);
    }
    up_stop(up3);
    rm_tree_ckpt(dir);
    snprintf(args, sizeof args, "%s.out", c1);
    unlink(args);
    snprintf(args, sizeof args, "%s.out", c2);
    unlink(args);
}
#endif
