/*
 * Tests of the cluster commands through the real binary: `dataplane up` in
 * the background (cluster file appears, a second up in the same directory is
 * refused, a unit killed with SIGKILL is reported and stops the cluster,
 * SIGINT stops everything and removes the file, no unit is left behind), the
 * admin commands against it (stats, scan, clear), their usage errors and
 * --help, a cluster file in the wrong order (every command refuses it and
 * nothing is done), and the addresses `up --bind 0.0.0.0` writes.
 */
#include "dp_test.h"
#include "dp_proc.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cluster/cluster.h"

#ifndef DP_CLI_PATH
#error "DP_CLI_PATH must name the dataplane binary"
#endif

/* Run the CLI with args (a shell fragment); capture stdout+stderr; return status. */
static int
run(const char *args, char *out, size_t outlen)
{
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "'%s' %s 2>&1", DP_CLI_PATH, args);
    return dp_test_run_sh(cmd, out, outlen);
}

/* A fresh private directory for one test. */
static void
tmp_dir(char *dir, size_t cap)
{
    snprintf(dir, cap, "/tmp/dp-test-cli-XXXXXX");
    CHECK(mkdtemp(dir) != NULL);
}

static void
slurp(const char *path, char *out, size_t cap)
{
    out[0] = '\0';
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return;
    size_t n = fread(out, 1, cap - 1, f);
    out[n] = '\0';
    fclose(f);
}

/*
 * slurp, again until it holds want or timeout_s passed: up prints a line
 * after the file the test waited for appeared (the cluster file, then its
 * "export" line).
 */
static void
slurp_until(const char *path, const char *want, char *out, size_t cap, double timeout_s)
{
    double end = dp_test_now() + timeout_s;
    for (;;) {
        slurp(path, out, cap);
        if (strstr(out, want) != NULL || dp_test_now() >= end)
            return;
        usleep(20000);
    }
}

typedef struct up_proc {
    pid_t pid;
    char dir[128];
    char file[192]; /* dir/cluster.json */
    char out[192];  /* up's stdout and stderr, captured to files */
    char err[192];
} up_proc;

/* Start `dataplane up --dir dir <extra>` in the background (argv built by the shell). */
static void
up_start(up_proc *u, const char *dir, const char *extra)
{
    snprintf(u->dir, sizeof u->dir, "%s", dir);
    snprintf(u->file, sizeof u->file, "%s/cluster.json", dir);
    snprintf(u->out, sizeof u->out, "%s.out", dir);
    snprintf(u->err, sizeof u->err, "%s.err", dir);
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "exec '%s' up --dir '%s' %s >'%s' 2>'%s'", DP_CLI_PATH, dir,
             extra, u->out, u->err);
    fflush(NULL);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        /* up (sh execs it) stops its units on SIGTERM: none outlives a failed test. */
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    u->pid = pid;
}

/* Wait until the cluster file exists (true) or up exited / time ran out (false). */
static bool
up_wait_file(up_proc *u, double timeout_s)
{
    double end = dp_test_now() + timeout_s;
    while (dp_test_now() < end) {
        if (access(u->file, F_OK) == 0)
            return true;
        int st;
        if (waitpid(u->pid, &st, WNOHANG) == u->pid) {
            u->pid = -st - 1; /* keep the status for up_wait */
            return false;
        }
        usleep(20000);
    }
    return false;
}

/* Wait for up to exit (at most timeout_s, then SIGKILL); its exit status or -signal. */
static int
up_wait(up_proc *u, double timeout_s)
{
    int st;
    if (u->pid < 0) {
        st = -(u->pid + 1);
    } else {
        double end = dp_test_now() + timeout_s;
        pid_t r;
        while ((r = waitpid(u->pid, &st, WNOHANG)) == 0 && dp_test_now() < end)
            usleep(20000);
        if (r == 0) {
            kill(u->pid, SIGKILL);
            waitpid(u->pid, &st, 0);
            fprintf(stderr, "  up did not exit within %.0f s: killed\n", timeout_s);
            return -1000;
        }
    }
    return WIFEXITED(st) ? WEXITSTATUS(st) : -WTERMSIG(st);
}

static bool
pid_gone(int64_t pid)
{
    /* Units are up's children: once up has reaped them, the pid is free. */
    return kill((pid_t)pid, 0) != 0 && errno == ESRCH;
}

static void
load_pids(const char *file, int64_t *pids, uint32_t n)
{
    dp__cluster cl;
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_OK_D(dp__cluster_load(file, &cl, &d), &d);
    CHECK_EQ(cl.n_units, n);
    for (uint32_t i = 0; i < n; i++) {
        CHECK(cl.units[i].pid > 0);
        CHECK(strncmp(cl.units[i].zmq, "tcp://127.0.0.1:", 16) == 0);
        CHECK(cl.units[i].agent[0] != '\0');
        CHECK(cl.units[i].incarnation != 0); /* each unit process's own */
        for (uint32_t j = 0; j < i; j++)
            CHECK(cl.units[j].incarnation != cl.units[i].incarnation);
        pids[i] = cl.units[i].pid;
    }
    dp__cluster_fini(&cl);
}

static void
rm_dir(const char *dir)
{
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' '%s.out' '%s.err'", dir, dir, dir);
    CHECK(system(cmd) == 0);
}

DP_TEST(help_on_every_command)
{
    static const char *const cmds[] = {"up",  "stats", "scan", "clear",
                                       "put", "get",   "bench"};
    char out[8192], args[64];
    CHECK_EQ(run("--help", out, sizeof out), 0);
    for (size_t i = 0; i < DP_ARRAY_LEN(cmds); i++)
        CHECK_CONTAINS(out, cmds[i]);
    for (size_t i = 0; i < DP_ARRAY_LEN(cmds); i++) {
        snprintf(args, sizeof args, "%s --help", cmds[i]);
        CHECK_EQ(run(args, out, sizeof out), 0);
        char want[64];
        snprintf(want, sizeof want, "usage: dataplane %s", cmds[i]);
        CHECK_CONTAINS(out, want);
        CHECK_CONTAINS(out, strcmp(cmds[i], "up") == 0 ? "--dir" : "--cluster");
        snprintf(args, sizeof args, "%s -h", cmds[i]);
        CHECK_EQ(run(args, out, sizeof out), 0);
        CHECK_CONTAINS(out, want);
    }
}

DP_TEST(usage_errors)
{
    char out[8192];
    struct {
        const char *args, *want;
    } cases[] = {
        {"up --units 0", "--units"},
        {"up --units two", "--units"},
        {"up --slab 0", "--slab"},
        {"up --slab lots", "--slab"},
        {"up --bogus", "unknown option"},
        {"up --units", "missing value"},
        {"up extra", "unexpected argument 'extra'"},
        {"up --staging 1G", "--ssd-dir"},
        {"up --numa sideways", "--numa"},
        {"up --grace-s -1", "--grace-s"},
        {"stats extra", "unexpected argument 'extra'"},
        {"stats --timeout-s 0", "--timeout-s"},
        {"stats --bogus", "unknown option"},
        {"scan", "which unit"},
        {"scan abc", "UNIT"},
        {"scan 0 1", "unexpected argument '1'"},
        {"scan --raw 0", "unknown option"},
        {"clear", "which rows"},
        {"clear 5-3", "ends before it starts"},
        {"clear x", "not a row"},
        {"clear 0-99999999", "at most"},
        {"put --field f --file /dev/null", "--row"},
        {"put --row 1 --file /dev/null", "required"},
        {"put --row x --field f --file /dev/null", "--row"},
        {"put --row 1 --field a@b --file /dev/null", "--field"},
        {"put --row 1 --field f --file /dev/null --kind blob", "--kind"},
        {"put --row 1 --field f --file /dev/null --kind tensor", "--dtype"},
        {"put --row 1 --field f --file /dev/null --shape 2,z", "--shape"},
        {"get", "which key"},
        {"get nokey", "not a key"},
        {"get x@f", "not a key"},
        {"get 1@f 2@f", "unexpected argument"},
        {"bench --rows 0", "--rows"},
        {"bench --jagged 1", "--jagged"},
        {"bench --memory disk", "--memory"},
        {"bench extra", "unexpected argument"},
        {"save --keep 0 d", "--keep"},
        {"save --keep -1 d", "--keep"},
        {"load --keep 2 d", "option of save"},
        {"save --timeout 0 d", "--timeout"},
        {"save", "one directory"},
    };
    for (size_t i = 0; i < DP_ARRAY_LEN(cases); i++) {
        int st = run(cases[i].args, out, sizeof out);
        CHECKF(st == 2, "'%s' exited %d: %s", cases[i].args, st, out);
        CHECK_CONTAINS(out, cases[i].want);
        CHECK_CONTAINS(out, "--help");
    }
}

DP_TEST(no_cluster_says_how_to_start_one)
{
    char dir[64], out[8192], args[256];
    tmp_dir(dir, sizeof dir);
    snprintf(args, sizeof args, "stats --cluster %s", dir);
    CHECK_EQ(run(args, out, sizeof out), 1);
    CHECK_CONTAINS(out, "no cluster file");
    CHECK_CONTAINS(out, "dataplane up");
    snprintf(args, sizeof args, "clear 1 --cluster %s/cluster.json", dir);
    CHECK_EQ(run(args, out, sizeof out), 1);
    /* DP_CLUSTER is the fallback for --cluster. */
    snprintf(args, sizeof args, "stats");
    char cmd[512];
    snprintf(cmd, sizeof cmd, "DP_CLUSTER=%s '%s' stats 2>&1", dir, DP_CLI_PATH);
    FILE *p = popen(cmd, "r");
    CHECK(p != NULL);
    size_t n = fread(out, 1, sizeof out - 1, p);
    out[n] = '\0';
    CHECK_EQ(WEXITSTATUS(pclose(p)), 1);
    CHECK_CONTAINS(out, dir);
    rm_dir(dir);
}

DP_TEST(up_admin_commands_and_sigint)
{
    char dir[64], out[16384], args[512], log[16384];
    tmp_dir(dir, sizeof dir);
    up_proc u;
    up_start(&u, dir, "--units 2 --slab 16M");
    bool ok = up_wait_file(&u, 60);
    slurp(u.err, log, sizeof log);
    CHECKF(ok, "no cluster file; up said: %s", log);
    int64_t pids[2];
    load_pids(u.file, pids, 2);
    slurp_until(u.out, "export DP_CLUSTER=", log, sizeof log, 30);
    CHECK_CONTAINS(log, "starting 2 units");
    CHECK_CONTAINS(log, "unit 0 at tcp://");
    CHECK_CONTAINS(log, "unit 1 at tcp://");
    CHECK_CONTAINS(log, "export DP_CLUSTER=");
    CHECK_CONTAINS(log, u.file);

    snprintf(args, sizeof args, "stats --cluster %s", dir);
    CHECK_EQ(run(args, out, sizeof out), 0);
    CHECK_CONTAINS(out, "unit 0");
    CHECK_CONTAINS(out, "unit 1");
    CHECK_CONTAINS(out, "total");
    CHECK_CONTAINS(out, "slab_bytes");
    CHECK_CONTAINS(out, "16.00 MiB");
    snprintf(args, sizeof args, "stats --raw --cluster %s", u.file);
    CHECK_EQ(run(args, out, sizeof out), 0);
    CHECK_CONTAINS(out, "16777216");
    /* --lanes: this machine's data path to each unit (shared memory here). */
    snprintf(args, sizeof args, "stats --lanes --cluster %s", dir);
    CHECK_EQ(run(args, out, sizeof out), 0);
    CHECK_CONTAINS(out, "lanes: unit 0: shm one-sided (");
    CHECK_CONTAINS(out, "units' transports: unit 0: ");
    CHECK_CONTAINS(out, "posix"); /* shared memory, as every unit here has */
    CHECK_CONTAINS(out, "; unit 1: shm one-sided (");
    /* A unit that does not answer: reported, the others' counters and lanes shown. */
    CHECK(kill((pid_t)pids[1], SIGSTOP) == 0);
    snprintf(args, sizeof args, "stats --lanes --timeout-s 1 --cluster %s", dir);
    int down_rc = run(args, out, sizeof out);
    CHECK(kill((pid_t)pids[1], SIGCONT) == 0);
    CHECK_EQ(down_rc, 1);
    CHECK_CONTAINS(out, "(down)");
    CHECK_CONTAINS(out, "lanes: unit 0: shm one-sided (");
    CHECK_CONTAINS(out, "; unit 1: not connected (down)");
    snprintf(args, sizeof args, "scan 1 --lanes --cluster %s", dir);
    CHECK_EQ(run(args, out, sizeof out), 2);
    CHECK_CONTAINS(out, "unknown option '--lanes'");
    snprintf(args, sizeof args, "scan 1 --cluster %s", dir);
    CHECK_EQ(run(args, out, sizeof out), 0);
    CHECK_CONTAINS(out, "unit 1 (tcp://127.0.0.1:");
    CHECK_CONTAINS(out, "0 blobs");
    snprintf(args, sizeof args, "scan 2 --cluster %s", dir);
    CHECK_EQ(run(args, out, sizeof out), 2);
    CHECK_CONTAINS(out, "units 0..1");
    snprintf(args, sizeof args, "clear 0-9 17 --cluster %s", dir);
    CHECK_EQ(run(args, out, sizeof out), 0);
    CHECK_CONTAINS(out, "cleared 11 rows");
    CHECK_CONTAINS(out, "on 2 units");
    snprintf(args, sizeof args, "clear 3 --cluster %s", dir);
    CHECK_EQ(run(args, out, sizeof out), 0);
    CHECK_CONTAINS(out, "on 1 unit");

    /* A second up in the same directory is refused and leaves the first alone. */
    snprintf(args, sizeof args, "up --units 1 --slab 8M --dir %s", dir);
    CHECK_EQ(run(args, out, sizeof out), 1);
    CHECK_CONTAINS(out, dir);
    CHECK_CONTAINS(out, "--dir");
    CHECK(access(u.file, F_OK) == 0);
    snprintf(args, sizeof args, "stats --cluster %s", dir);
    CHECK_EQ(run(args, out, sizeof out), 0);

    CHECK(kill(u.pid, SIGINT) == 0);
    int st = up_wait(&u, 60);
    slurp(u.out, log, sizeof log);
    CHECKF(st == 0, "up exited %d: %s", st, log);
    CHECK_CONTAINS(log, "stopped 2 units");
    CHECK(access(u.file, F_OK) != 0);
    CHECK(pid_gone(pids[0]));
    CHECK(pid_gone(pids[1]));
    /* Stopped: the commands now say there is no cluster. */
    CHECK_EQ(run(args, out, sizeof out), 1);
    CHECK_CONTAINS(out, "no cluster file");
    rm_dir(dir);
}

DP_TEST(up_reports_a_killed_unit_and_stops_the_rest)
{
    char dir[64], log[16384];
    tmp_dir(dir, sizeof dir);
    up_proc u;
    up_start(&u, dir, "--units 3 --slab 8M --grace-s 5");
    bool ok = up_wait_file(&u, 60);
    slurp(u.err, log, sizeof log);
    CHECKF(ok, "no cluster file; up said: %s", log);
    int64_t pids[3];
    load_pids(u.file, pids, 3);
    CHECK(kill((pid_t)pids[1], SIGKILL) == 0);
    int st = up_wait(&u, 60);
    slurp(u.err, log, sizeof log);
    CHECKF(st == 1, "up exited %d: %s", st, log);
    CHECK_CONTAINS(log, "unit 1");
    CHECK_CONTAINS(log, "killed by signal 9");
    CHECK(access(u.file, F_OK) != 0);
    for (int i = 0; i < 3; i++)
        CHECK(pid_gone(pids[i]));
    rm_dir(dir);
}

DP_TEST(up_sigterm_stops_everything)
{
    char dir[64], log[16384];
    tmp_dir(dir, sizeof dir);
    up_proc u;
    up_start(&u, dir, "--units 1 --slab 8M");
    bool ok = up_wait_file(&u, 60);
    slurp(u.err, log, sizeof log);
    CHECKF(ok, "no cluster file; up said: %s", log);
    int64_t pid;
    load_pids(u.file, &pid, 1);
    CHECK(kill(u.pid, SIGTERM) == 0);
    CHECK_EQ(up_wait(&u, 60), 0);
    CHECK(access(u.file, F_OK) != 0);
    CHECK(pid_gone(pid));
    rm_dir(dir);
}

DP_TEST(up_reports_a_unit_that_fails_to_start)
{
    char dir[64], log[16384];
    tmp_dir(dir, sizeof dir);
    up_proc u;
    /* Not an address: the unit's control server cannot bind and the unit exits. */
    up_start(&u, dir, "--units 2 --slab 8M --bind 256.0.0.1");
    CHECK(!up_wait_file(&u, 60));
    int st = up_wait(&u, 60);
    slurp(u.err, log, sizeof log);
    CHECKF(st == 1, "up exited %d: %s", st, log);
    CHECK_CONTAINS(log, "failed to start");
    CHECK_CONTAINS(log, "exited with status");
    CHECK_CONTAINS(log, "256.0.0.1"); /* the unit's own words, from its stderr tail */
    CHECK(access(u.file, F_OK) != 0);
    rm_dir(dir);
}

DP_TEST(up_replaces_a_stale_cluster_file)
{
    char dir[64], log[16384];
    tmp_dir(dir, sizeof dir);
    /* A cluster file whose unit is gone (a reaped child's pid). */
    pid_t dead = fork();
    CHECK(dead >= 0);
    if (dead == 0)
        _exit(0);
    waitpid(dead, NULL, 0);
    dp__cluster_unit cu = {
        .id = 0, .zmq = "tcp://127.0.0.1:9", .agent = "gone", .pid = dead};
    dp__cluster cl = {.n_units = 1, .units = &cu};
    char file[192];
    snprintf(file, sizeof file, "%s/cluster.json", dir);
    CHECK_OK(dp__cluster_save(file, &cl, NULL));
    up_proc u;
    up_start(&u, dir, "--units 1 --slab 8M");
    bool ok = up_wait_file(&u, 60);
    /* The stale file exists from the start: wait for the new one's units. */
    int64_t pid = dead;
    for (double end = dp_test_now() + 60; ok && pid == dead && dp_test_now() < end;) {
        usleep(20000);
        dp__cluster c2;
        if (dp__cluster_load(file, &c2, NULL) == DP_OK) {
            pid = c2.units[0].pid;
            dp__cluster_fini(&c2);
        }
    }
    CHECK(pid != dead);
    slurp(u.out, log, sizeof log);
    CHECK_CONTAINS(log, "stale");
    kill(u.pid, SIGINT);
    CHECK_EQ(up_wait(&u, 60), 0);
    CHECK(pid_gone(pid));
    rm_dir(dir);
}

/* put a file, get it back byte for byte; get of a missing key fails; a small bench. */
DP_TEST(put_get_round_trip_and_bench)
{
    char dir[64], out[16384], args[1024], log[16384], in[128], back[128];
    tmp_dir(dir, sizeof dir);
    up_proc u;
    up_start(&u, dir, "--units 2 --slab 64M");
    bool ok = up_wait_file(&u, 60);
    slurp(u.err, log, sizeof log);
    CHECKF(ok, "no cluster file; up said: %s", log);

    /* 300 KiB of non-repeating bytes. */
    snprintf(in, sizeof in, "%s/in.bin", dir);
    snprintf(back, sizeof back, "%s/back.bin", dir);
    FILE *f = fopen(in, "wb");
    CHECK(f != NULL);
    uint64_t s = dp_test_seed();
    for (int i = 0; i < 300 * 1024 / 8; i++) {
        uint64_t w = dp_test_rand(&s);
        CHECK(fwrite(&w, 8, 1, f) == 1);
    }
    CHECK(fclose(f) == 0);
    snprintf(args, sizeof args, "put --row 5 --field obs --file %s --cluster %s", in,
             dir);
    CHECK_EQ(run(args, out, sizeof out), 0);
    CHECK_CONTAINS(out, "put 5@obs: 307200 bytes");
    CHECK_CONTAINS(out, "unit 1");
    snprintf(args, sizeof args, "get 5@obs -o %s --cluster %s", back, dir);
    CHECK_EQ(run(args, out, sizeof out), 0);
    CHECK_CONTAINS(out, "5@obs: 307200 bytes, bytes");
    snprintf(args, sizeof args, "cmp '%s' '%s'", in, back);
    CHECK_EQ(system(args), 0);

    /* A tensor keeps its description; a shape that does not match is refused. */
    snprintf(args, sizeof args,
             "put --row 8 --field lp --file %s --dtype float32 --shape 768,100 "
             "--cluster %s",
             in, dir);
    CHECK_EQ(run(args, out, sizeof out), 0);
    snprintf(args, sizeof args, "get 8@lp -o %s --cluster %s", back, dir);
    CHECK_EQ(run(args, out, sizeof out), 0);
    CHECK_CONTAINS(out, "tensor float32 [768,100], unit 0");
    snprintf(args, sizeof args,
             "put --row 8 --field lp --file %s --dtype float32 --shape 3 --cluster %s",
             in, dir);
    CHECK_EQ(run(args, out, sizeof out), 2);
    CHECK_CONTAINS(out, "--shape");

    /* stdin in, stdout out. */
    snprintf(args, sizeof args,
             "put --row 9 --field txt --file - --kind object --cluster %s < /dev/null; "
             "printf 'hello' | '%s' put --row 9 --field txt --file - --cluster %s && "
             "'%s' get 9@txt --cluster %s 2>/dev/null",
             dir, DP_CLI_PATH, dir, DP_CLI_PATH, dir);
    CHECK_EQ(run(args, out, sizeof out), 0);
    CHECK_CONTAINS(out, "hello");

    snprintf(args, sizeof args, "scan 1 --cluster %s", dir);
    CHECK_EQ(run(args, out, sizeof out), 0);
    CHECK_CONTAINS(out, "2 blobs");

    snprintf(args, sizeof args, "get 6@obs --cluster %s", dir);
    CHECK_EQ(run(args, out, sizeof out), 1);
    CHECK_CONTAINS(out, "6@obs");
    CHECK_CONTAINS(out, "not found");
    snprintf(args, sizeof args, "clear 5 --cluster %s", dir);
    CHECK_EQ(run(args, out, sizeof out), 0);
    CHECK_CONTAINS(out, "1 entry dropped");
    snprintf(args, sizeof args, "get 5@obs --cluster %s", dir);
    CHECK_EQ(run(args, out, sizeof out), 1);

    snprintf(args, sizeof args,
             "bench --rows 16 --fields 3 --bytes 8K --jagged 0.5 --iters 3 --warmup 1 "
             "--first-row 1000 --cluster %s",
             dir);
    CHECK_EQ(run(args, out, sizeof out), 0);
    CHECK_CONTAINS(out, "16 rows x 3 fields");
    CHECK_CONTAINS(out, "every value checked");
    CHECK_CONTAINS(out, "RESULT rows=16 fields=3");
    snprintf(args, sizeof args,
             "bench --rows 4 --bytes 1K --iters 2 --memory malloc --first-row 2000 "
             "--cluster %s",
             dir);
    CHECK_EQ(run(args, out, sizeof out), 0);
    CHECK_CONTAINS(out, "malloc memory");

    kill(u.pid, SIGINT);
    CHECK_EQ(up_wait(&u, 60), 0);
    rm_dir(dir);
}

/* A process is gone, or a zombie nobody reaped yet (init in a container may not). */
static bool
pid_dead(int64_t pid)
{
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%lld/stat", (long long)pid);
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return true;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *rp = strrchr(buf, ')');
    return rp != NULL && rp[1] == ' ' && (rp[2] == 'Z' || rp[2] == 'X');
}

DP_TEST(up_killed_hard_takes_its_units_along)
{
    char dir[64], log[16384], out[8192], args[256];
    tmp_dir(dir, sizeof dir);
    up_proc u;
    up_start(&u, dir, "--units 2 --slab 8M");
    bool ok = up_wait_file(&u, 60);
    slurp(u.err, log, sizeof log);
    CHECKF(ok, "no cluster file; up said: %s", log);
    int64_t pids[2];
    load_pids(u.file, pids, 2);
    CHECK(kill(u.pid, SIGKILL) == 0);
    CHECK_EQ(up_wait(&u, 30), -SIGKILL);
    /* PR_SET_PDEATHSIG: the units get SIGTERM when up dies. */
    double end = dp_test_now() + 30;
    while ((!pid_dead(pids[0]) || !pid_dead(pids[1])) && dp_test_now() < end)
        usleep(20000);
    CHECK(pid_dead(pids[0]));
    CHECK(pid_dead(pids[1]));
    /* The file it left behind is stale: the next up replaces it. */
    snprintf(args, sizeof args, "stats --cluster %s --timeout-s 1", dir);
    CHECK_EQ(run(args, out, sizeof out), 1);
    unlink(u.out);
    up_start(&u, dir, "--units 1 --slab 8M");
    for (end = dp_test_now() + 60; dp_test_now() < end; usleep(20000)) {
        slurp(u.out, log, sizeof log);
        if (strstr(log, "Ctrl-C stops it") != NULL)
            break;
    }
    CHECK_CONTAINS(log, "stale");
    kill(u.pid, SIGINT);
    CHECK_EQ(up_wait(&u, 60), 0);
    rm_dir(dir);
}

/* A cluster file naming a live unit (started by hand here) is never replaced. */
DP_TEST(up_refuses_a_live_cluster_file)
{
    char dir[64], out[8192], args[256], file[192];
    tmp_dir(dir, sizeof dir);
    int fds[2];
    CHECK(pipe(fds) == 0);
    fflush(NULL);
    pid_t unit = fork();
    CHECK(unit >= 0);
    if (unit == 0) {
        dup2(fds[1], 1);
        close(fds[0]);
        close(fds[1]);
        int nul = open("/dev/null", O_WRONLY);
        if (nul >= 0)
            dup2(nul, 2);
        execl(DP_CLI_PATH, "dataplane", "unit", "--slab", "8M", (char *)NULL);
        _exit(127);
    }
    close(fds[1]);
    char line[DP_CLUSTER_ADDR_MAX];
    size_t n = 0;
    while (n + 1 < sizeof line && read(fds[0], line + n, 1) == 1 && line[n] != '\n')
        n++;
    line[n] = '\0';
    close(fds[0]);
    CHECKF(strncmp(line, "tcp://", 6) == 0, "unit said '%s'", line);
    dp__cluster_unit cu = {.id = 0, .agent = "by-hand", .pid = unit};
    memcpy(cu.zmq, line, sizeof line);
    dp__cluster cl = {.n_units = 1, .units = &cu};
    snprintf(file, sizeof file, "%s/cluster.json", dir);
    CHECK_OK(dp__cluster_save(file, &cl, NULL));
    snprintf(args, sizeof args, "up --units 1 --slab 8M --dir %s", dir);
    int st = run(args, out, sizeof out);
    kill(unit, SIGTERM);
    waitpid(unit, NULL, 0);
    CHECKF(st == 1, "up exited %d: %s", st, out);
    CHECK_CONTAINS(out, "already running");
    char pid_s[32];
    snprintf(pid_s, sizeof pid_s, "%d", (int)unit);
    CHECK_CONTAINS(out, pid_s);
    rm_dir(dir);
}

/* SIGHUP (the terminal went away) stops up like SIGINT. */
DP_TEST(up_sighup_stops_it)
{
    char dir[64], log[16384];
    tmp_dir(dir, sizeof dir);
    up_proc u;
    up_start(&u, dir, "--units 1 --slab 8M");
    bool ok = up_wait_file(&u, 60);
    slurp(u.err, log, sizeof log);
    CHECKF(ok, "no cluster file; up said: %s", log);
    int64_t pid;
    load_pids(u.file, &pid, 1);
    CHECK(kill(u.pid, SIGHUP) == 0);
    CHECK_EQ(up_wait(&u, 60), 0);
    CHECK(access(u.file, F_OK) != 0);
    CHECK(pid_gone(pid));
    rm_dir(dir);
}

/* Run a shell fragment as is (its own redirections); stdout only. */
static int
run_sh(const char *sh, char *out, size_t cap)
{
    FILE *p = popen(sh, "r");
    CHECK(p != NULL);
    size_t n = fread(out, 1, cap - 1, p);
    out[n] = '\0';
    int st = pclose(p);
    CHECK(WIFEXITED(st));
    return WEXITSTATUS(st);
}

/* Write a cluster file listing addrs in this order (ids 0..n-1). */
static void
write_cluster(const char *file, const char *const *addrs, uint32_t n)
{
    dp__cluster_unit us[4];
    memset(us, 0, sizeof us);
    for (uint32_t i = 0; i < n; i++) {
        us[i].id = i;
        snprintf(us[i].zmq, sizeof us[i].zmq, "%s", addrs[i]);
        snprintf(us[i].agent, sizeof us[i].agent, "unit-%u", i);
    }
    dp__cluster cl = {.n_units = n, .units = us};
    CHECK_OK(dp__cluster_save(file, &cl, NULL));
}

/* Row g's field f holds "row-<g>" (checked through the good cluster file). */
static void
check_rows(const char *cluster, int from, int to, bool present)
{
    char args[512], out[8192], want[32];
    for (int g = from; g <= to; g++) {
        snprintf(args, sizeof args, "'%s' get %d@f --cluster %s 2>/dev/null", DP_CLI_PATH,
                 g, cluster);
        int st = run_sh(args, out, sizeof out);
        snprintf(want, sizeof want, "row-%d", g);
        if (present) {
            CHECKF(st == 0, "get %d@f exited %d", g, st);
            CHECK_STR(out, want);
        } else {
            CHECKF(st == 1, "get %d@f exited %d: %s", g, st, out);
        }
    }
}

/* A TCP port on 127.0.0.1 that never answers (listening, never accepted). */
static int
silent_port(char *addr, size_t cap)
{
    uint16_t port = 0;
    int fd = dp_test_silent_port(&port);
    snprintf(addr, cap, "tcp://127.0.0.1:%u", port);
    return fd;
}

/*
 * A cluster file listing live units in the wrong order, or a unit of another
 * cluster: clear, stats, scan, save, load, put and get refuse before doing
 * anything, naming the unit, its address, what it said and what the file
 * says. Nothing is cleared, saved or loaded: the rows are checked through the
 * right file afterwards. Also: load (both the same-shape path and re-homing)
 * gives up within its --timeout on a cluster that does not answer, and get
 * and bench keep stdout clean with UCX logging at info level.
 */
DP_TEST(wrong_order_is_refused_and_nothing_is_done)
{
    char dir[64], out[16384], args[2048], log[16384];
    char good[192], swapped[128], other[128], dead1[128], dead2[128], ck[128];
    tmp_dir(dir, sizeof dir);
    up_proc u;
    up_start(&u, dir, "--units 2 --slab 16M");
    bool ok = up_wait_file(&u, 60);
    slurp(u.err, log, sizeof log);
    CHECKF(ok, "no cluster file; up said: %s", log);
    snprintf(good, sizeof good, "%s", u.file);
    dp__cluster cl;
    CHECK_OK(dp__cluster_load(good, &cl, NULL));
    char a0[DP_CLUSTER_ADDR_MAX], a1[DP_CLUSTER_ADDR_MAX];
    snprintf(a0, sizeof a0, "%s", cl.units[0].zmq);
    snprintf(a1, sizeof a1, "%s", cl.units[1].zmq);
    dp__cluster_fini(&cl);
    snprintf(swapped, sizeof swapped, "%s/swapped.json", dir);
    snprintf(other, sizeof other, "%s/other.json", dir);
    snprintf(ck, sizeof ck, "%s/ck", dir);
    const char *sw[] = {a1, a0};
    write_cluster(swapped, sw, 2);
    const char *one[] = {a0};
    write_cluster(other, one, 1);

    for (int g = 0; g < 4; g++) {
        snprintf(args, sizeof args,
                 "printf 'row-%d' | '%s' put --row %d --field f --file - --cluster %s", g,
                 DP_CLI_PATH, g, good);
        CHECK_EQ(run_sh(args, out, sizeof out), 0);
    }
    check_rows(good, 0, 3, true);

    /* clear: before, each unit was sent the other's rows and "cleared" nothing. */
    snprintf(args, sizeof args, "clear 0-3 --cluster %s", swapped);
    CHECK_EQ(run(args, out, sizeof out), 1);
    CHECK_CONTAINS(out, "unit 0 (");
    CHECK_CONTAINS(out, a1);
    CHECK_CONTAINS(out, "says it is unit 1 of 2");
    CHECK_CONTAINS(out, "lists it as unit 0 of 2");
    CHECK_CONTAINS(out, "wrong order or a unit from another cluster");
    CHECK_CONTAINS(out, swapped);
    CHECK(strstr(out, "cleared") == NULL);
    check_rows(good, 0, 3, true);
    /* A unit of another cluster (this file has one unit; the unit says 2). */
    snprintf(args, sizeof args, "clear 0-3 --cluster %s", other);
    CHECK_EQ(run(args, out, sizeof out), 1);
    CHECK_CONTAINS(out, "says it is unit 0 of 2");
    CHECK_CONTAINS(out, "lists it as unit 0 of 1");
    check_rows(good, 0, 3, true);

    snprintf(args, sizeof args, "stats --cluster %s", swapped);
    CHECK_EQ(run(args, out, sizeof out), 1);
    CHECK_CONTAINS(out, "wrong order");
    CHECK(strstr(out, "slab_bytes") == NULL); /* no table of mislabelled counters */
    snprintf(args, sizeof args, "scan 1 --cluster %s", swapped);
    CHECK_EQ(run(args, out, sizeof out), 1);
    CHECK_CONTAINS(out, "unit 1 (");
    CHECK_CONTAINS(out, a0);
    CHECK_CONTAINS(out, "says it is unit 0 of 2");
    CHECK(strstr(out, "blobs") == NULL);

    /* save: no checkpoint is written, so none becomes current. */
    snprintf(args, sizeof args, "save -q --cluster %s %s", swapped, ck);
    CHECK_EQ(run(args, out, sizeof out), 1);
    CHECK_CONTAINS(out, "wrong order");
    char manifest[192];
    snprintf(manifest, sizeof manifest, "%s/MANIFEST.json", ck);
    CHECK(access(manifest, F_OK) != 0);

    /* The library's own check, through put and get. */
    snprintf(args, sizeof args, "put --row 0 --field f --file /dev/null --cluster %s",
             swapped);
    CHECK_EQ(run(args, out, sizeof out), 1);
    CHECK_CONTAINS(out, "wrong order");
    snprintf(args, sizeof args, "get 0@f --cluster %s", swapped);
    CHECK_EQ(run(args, out, sizeof out), 1);
    CHECK_CONTAINS(out, "wrong order");
    check_rows(good, 0, 3, true);

    /* load: save through the right file, clear, then a wrong-order load loads nothing. */
    snprintf(args, sizeof args, "save -q --cluster %s %s", good, ck);
    CHECK_EQ(run(args, out, sizeof out), 0);
    CHECK(access(manifest, F_OK) == 0);
    snprintf(args, sizeof args, "clear 0-3 --cluster %s", good);
    CHECK_EQ(run(args, out, sizeof out), 0);
    CHECK_CONTAINS(out, "4 entries dropped");
    snprintf(args, sizeof args, "load -q --cluster %s %s", swapped, ck);
    CHECK_EQ(run(args, out, sizeof out), 1);
    CHECK_CONTAINS(out, "wrong order");
    check_rows(good, 0, 3, false);
    snprintf(args, sizeof args, "load -q --cluster %s %s", good, ck);
    CHECK_EQ(run(args, out, sizeof out), 0);
    check_rows(good, 0, 3, true);

    /* load gives up within --timeout on units that do not answer, either path. */
    char dead_a[64], dead_b[64];
    int fa = silent_port(dead_a, sizeof dead_a), fb = silent_port(dead_b, sizeof dead_b);
    snprintf(dead1, sizeof dead1, "%s/dead1.json", dir);
    snprintf(dead2, sizeof dead2, "%s/dead2.json", dir);
    const char *d1[] = {dead_a};
    const char *d2[] = {dead_a, dead_b};
    write_cluster(dead1, d1, 1);
    write_cluster(dead2, d2, 2);
    for (int k = 0; k < 2; k++) {
        snprintf(args, sizeof args, "load --timeout 2 --cluster %s %s", k ? dead2 : dead1,
                 ck);
        double t0 = dp_test_now();
        int st = run(args, out, sizeof out);
        double took = dp_test_now() - t0;
        CHECKF(st == 1, "'%s' exited %d: %s", args, st, out);
        CHECKF(took >= 1.5 && took < 8, "'%s' took %.1f s: %s", args, took, out);
        CHECK_CONTAINS(out, dead_a);
        CHECK_CONTAINS(out, k ? "did not answer" : "re-homing");
    }
    close(fa);
    close(fb);

    /* UCX logging at info level stays off stdout: a value, a RESULT line. */
    snprintf(args, sizeof args,
             "UCX_LOG_LEVEL=info '%s' get 2@f --cluster %s 2>/dev/null", DP_CLI_PATH,
             good);
    CHECK_EQ(run_sh(args, out, sizeof out), 0);
    CHECK_STR(out, "row-2");
    snprintf(args, sizeof args,
             "UCX_LOG_LEVEL=info '%s' get 2@f --cluster %s 2>&1 >/dev/null", DP_CLI_PATH,
             good);
    CHECK_EQ(run_sh(args, out, sizeof out), 0);
    CHECK_CONTAINS(out, "UCX"); /* it did log, on stderr */
    snprintf(args, sizeof args,
             "UCX_LOG_LEVEL=info '%s' bench --rows 2 --bytes 1K --iters 1 --warmup 0 "
             "--first-row 5000 --cluster %s 2>/dev/null",
             DP_CLI_PATH, good);
    CHECK_EQ(run_sh(args, out, sizeof out), 0);
    CHECK_CONTAINS(out, "RESULT rows=2");
    CHECK(strstr(out, "UCX") == NULL);

    kill(u.pid, SIGINT);
    CHECK_EQ(up_wait(&u, 60), 0);
    rm_dir(dir);
}

/*
 * `up --bind 0.0.0.0` writes routable addresses (never 0.0.0.0) into the
 * cluster file, the ones the units print and answer in info; --advertise
 * sets the host written. Either file works for the commands.
 */
DP_TEST(up_with_a_wildcard_bind_writes_routable_addresses)
{
    char dir[64], out[16384], args[512], log[16384];
    for (int adv = 0; adv < 2; adv++) {
        tmp_dir(dir, sizeof dir);
        up_proc u;
        up_start(&u, dir,
                 adv ? "--units 2 --slab 8M --bind 0.0.0.0 --advertise 127.0.0.1"
                     : "--units 2 --slab 8M --bind 0.0.0.0");
        bool ok = up_wait_file(&u, 60);
        slurp(u.err, log, sizeof log);
        CHECKF(ok, "no cluster file; up said: %s", log);
        dp__cluster cl;
        CHECK_OK(dp__cluster_load(u.file, &cl, NULL));
        CHECK_EQ(cl.n_units, 2);
        slurp(u.out, log, sizeof log);
        for (uint32_t i = 0; i < cl.n_units; i++) {
            const char *z = cl.units[i].zmq;
            CHECKF(strstr(z, "0.0.0.0") == NULL, "unit %u at %s", i, z);
            if (adv)
                CHECK(strncmp(z, "tcp://127.0.0.1:", 16) == 0);
            char said[192];
            snprintf(said, sizeof said, "unit %u at %s ", i, z);
            CHECK_CONTAINS(log, said);
        }
        dp__cluster_fini(&cl);
        snprintf(args, sizeof args, "stats --cluster %s", u.file);
        CHECK_EQ(run(args, out, sizeof out), 0);
        CHECK_CONTAINS(out, "unit 1");
        kill(u.pid, SIGINT);
        CHECK_EQ(up_wait(&u, 60), 0);
        rm_dir(dir);
    }
}

/*
 * Two clusters of two units each: a file naming unit 0 of one and unit 1 of
 * the other (same index, same size) is refused by its cluster id, and
 * nothing lands in either cluster.
 */
DP_TEST(a_unit_of_another_cluster_is_refused)
{
    char dir[2][64], out[16384], args[2048], log[16384], mixed[128];
    up_proc u[2];
    dp__cluster cl[2];
    for (int k = 0; k < 2; k++) {
        tmp_dir(dir[k], sizeof dir[k]);
        up_start(&u[k], dir[k], "--units 2 --slab 8M");
        bool ok = up_wait_file(&u[k], 60);
        slurp(u[k].err, log, sizeof log);
        CHECKF(ok, "no cluster file; up said: %s", log);
        CHECK_OK(dp__cluster_load(u[k].file, &cl[k], NULL));
        CHECK(cl[k].cluster_id[0] != '\0');
    }
    CHECK(strcmp(cl[0].cluster_id, cl[1].cluster_id) != 0);
    /* The mixed file claims cluster 0's id. */
    dp__cluster_unit us[2] = {cl[0].units[0], cl[1].units[1]};
    dp__cluster m = {.n_units = 2, .units = us};
    snprintf(m.cluster_id, sizeof m.cluster_id, "%s", cl[0].cluster_id);
    snprintf(mixed, sizeof mixed, "%s/mixed.json", dir[0]);
    CHECK_OK(dp__cluster_save(mixed, &m, NULL));
    snprintf(args, sizeof args,
             "printf 'row-1' | '%s' put --row 1 --field f --file - --cluster %s 2>&1",
             DP_CLI_PATH, mixed);
    CHECK_EQ(run_sh(args, out, sizeof out), 1);
    CHECK_CONTAINS(out, "belongs to cluster");
    CHECK_CONTAINS(out, cl[1].cluster_id);
    snprintf(args, sizeof args, "stats --cluster %s", mixed);
    CHECK_EQ(run(args, out, sizeof out), 1);
    CHECK_CONTAINS(out, "a unit from another cluster");
    /* Nothing landed in either cluster. */
    for (int k = 0; k < 2; k++) {
        snprintf(args, sizeof args, "'%s' get 1@f --cluster %s 2>/dev/null", DP_CLI_PATH,
                 u[k].file);
        CHECK_EQ(run_sh(args, out, sizeof out), 1);
    }
    for (int k = 0; k < 2; k++) {
        dp__cluster_fini(&cl[k]);
        kill(u[k].pid, SIGINT);
        CHECK_EQ(up_wait(&u[k], 60), 0);
        rm_dir(dir[k]);
    }
}
