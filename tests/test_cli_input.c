/*
 * Tests of what the `dataplane` commands are given from outside, through the
 * real binary: a cluster file that is a FIFO, a directory, a device or a
 * socket; a cluster file naming an address where nothing answers (every
 * command must give up within its own timeout); --advertise and wildcard
 * binds of `dataplane unit`; and the first-stdout-line contract of a unit
 * with UCX logging at info level.
 */
#include "dp_test.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cluster/cluster.h"
#include "ctl/ctl.h"
#include "dp_proc.h"
#include "wire/wire.h"

#ifndef DP_CLI_PATH
#error "DP_CLI_PATH must name the dataplane binary"
#endif

/* Longest any command here may take; a command that blocks is killed then. */
#define HANG_S 25

/*
 * Run `env ENV dataplane ARGS` under timeout(1) with stdout and stderr
 * captured together; its exit status (124: it had to be killed) and how long
 * it took.
 */
static int
run_timed(const char *env, const char *args, char *out, size_t cap, double *took)
{
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "exec env %s timeout -k 2 %d '%s' %s 2>&1 </dev/null",
             env != NULL ? env : "", HANG_S, DP_CLI_PATH, args);
    double t0 = dp_test_now();
    int st = dp_test_run_sh(cmd, out, cap);
    if (took != NULL)
        *took = dp_test_now() - t0;
    return st;
}

static int
run(const char *args, char *out, size_t cap)
{
    return run_timed(NULL, args, out, cap, NULL);
}

static void
tmp_dir(char *dir, size_t cap)
{
    snprintf(dir, cap, "/tmp/dp-test-input-XXXXXX");
    CHECK(mkdtemp(dir) != NULL);
}

static void
rm_rf(const char *path)
{
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", path);
    CHECK(system(cmd) == 0);
}

/* Every command that reads a cluster file, with arguments that need one. */
static const char *const cluster_cmds[] = {
    "stats",      "scan 0",
    "clear 1",    "put --row 1 --field f --file /dev/null",
    "get 1@f",    "bench --rows 1 --bytes 1K --iters 1 --warmup 0",
    "save %s/ck", "load %s/ck",
};

/* args of cluster_cmds[i] (which may name dir) plus extra. */
static void
cmd_args(size_t i, const char *dir, const char *extra, char *out, size_t cap)
{
    char base[512];
    snprintf(base, sizeof base, cluster_cmds[i], dir);
    snprintf(out, cap, "%s %s", base, extra);
}

/*
 * A FIFO, a directory without cluster.json, a device and a socket given as
 * the cluster file: every command fails at once (exit 1), naming the path and
 * what it is; none blocks on the FIFO.
 */
DP_TEST(special_cluster_files_are_refused_by_every_command)
{
    char dir[64], fifo[128], sock[128], sub[128], out[8192], args[1024];
    tmp_dir(dir, sizeof dir);
    snprintf(fifo, sizeof fifo, "%s/fifo", dir);
    snprintf(sock, sizeof sock, "%s/sock", dir);
    snprintf(sub, sizeof sub, "%s/empty", dir);
    CHECK(mkfifo(fifo, 0600) == 0);
    CHECK(mkdir(sub, 0700) == 0);
    int sfd = socket(AF_UNIX, SOCK_STREAM, 0);
    CHECK(sfd >= 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    CHECK(strlen(sock) < sizeof sa.sun_path);
    memcpy(sa.sun_path, sock, strlen(sock) + 1);
    CHECK(bind(sfd, (struct sockaddr *)&sa, sizeof sa) == 0);
    struct {
        const char *path, *want;
    } files[] = {
        {fifo, "is a FIFO"},
        {"/dev/null", "is a character device"},
        {sock, "is a socket"},
        {sub, "no cluster file"}, /* a directory: its cluster.json is missing */
    };
    int runs = 0;
    for (size_t f = 0; f < DP_ARRAY_LEN(files); f++) {
        for (size_t i = 0; i < DP_ARRAY_LEN(cluster_cmds); i++) {
            char extra[256];
            snprintf(extra, sizeof extra, "--cluster %s", files[f].path);
            cmd_args(i, dir, extra, args, sizeof args);
            double took;
            int st = run_timed(NULL, args, out, sizeof out, &took);
            CHECKF(st == 1, "'%s' exited %d after %.1f s: %s", args, st, took, out);
            CHECK_CONTAINS(out, files[f].path);
            CHECK_CONTAINS(out, files[f].want);
            CHECKF(took < 10, "'%s' took %.1f s", args, took);
            runs++;
        }
    }
    /* DP_CLUSTER naming the FIFO is refused the same way. */
    char env[256];
    snprintf(env, sizeof env, "DP_CLUSTER=%s", fifo);
    CHECK_EQ(run_timed(env, "stats", out, sizeof out, NULL), 1);
    CHECK_CONTAINS(out, "is a FIFO");
    CHECK_CONTAINS(out, "not a regular file");
    CHECK_EQ(runs, DP_ARRAY_LEN(files) * DP_ARRAY_LEN(cluster_cmds));
    close(sfd);
    rm_rf(dir);
}

/*
 * A TCP port on 127.0.0.1 where nothing answers: listening, so the kernel
 * completes connections, but never accepted or read, like a hung unit or an
 * address whose packets go nowhere. (A refused connection fails at once.)
 */
static int
silent_port(uint16_t *port)
{
    return dp_test_silent_port(port);
}

/*
 * Every command honours its own timeout while connecting: against a unit that
 * never answers, `--timeout-s 2` (save and load: `--timeout 2`) fails within
 * a few seconds, naming the unit's address, instead of the library's 30 s
 * default.
 */
DP_TEST(every_command_gives_up_within_its_timeout)
{
    char dir[64], file[128], out[8192], args[1024], addr[64];
    tmp_dir(dir, sizeof dir);
    uint16_t port;
    int fd = silent_port(&port);
    snprintf(addr, sizeof addr, "tcp://127.0.0.1:%u", port);
    dp__cluster_unit cu = {.id = 0, .agent = "nobody", .pid = 0};
    snprintf(cu.zmq, sizeof cu.zmq, "%s", addr);
    dp__cluster cl = {.n_units = 1, .units = &cu};
    snprintf(file, sizeof file, "%s/cluster.json", dir);
    CHECK_OK(dp__cluster_save(file, &cl, NULL));
    int runs = 0;
    for (size_t i = 0; i < DP_ARRAY_LEN(cluster_cmds); i++) {
        if (strncmp(cluster_cmds[i], "load", 4) == 0)
            continue; /* needs a checkpoint: test_cli_cluster covers it */
        bool ckpt = strncmp(cluster_cmds[i], "save", 4) == 0;
        char extra[256];
        snprintf(extra, sizeof extra, "--cluster %s %s", file,
                 ckpt ? "--timeout 2" : "--timeout-s 2");
        cmd_args(i, dir, extra, args, sizeof args);
        double took;
        int st = run_timed(NULL, args, out, sizeof out, &took);
        CHECKF(st == 1, "'%s' exited %d after %.1f s: %s", args, st, took, out);
        CHECKF(took >= 1.5 && took < 8, "'%s' took %.1f s (timeout 2 s): %s", args, took,
               out);
        CHECK_CONTAINS(out, addr);
        CHECK_CONTAINS(out, "timed out");
        runs++;
    }
    CHECK_EQ(runs, DP_ARRAY_LEN(cluster_cmds) - 1);
    close(fd);
    rm_rf(dir);
}

DP_TEST(advertise_usage_errors)
{
    char out[8192];
    static const char *const bad[] = {
        "''",
        "'a b'",
        "fe80::1",
        "'[fe80::1'",
        "'[zz]'",
        "0.0.0.0",
        "'[::]'",
        "256.1.1.1",
        "1.2.3",
        "-host",
        "'host/x'",
        "'h\tx'",
        "'h@x'",
        "'a..b'",
        "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"
        "xx"
        "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx",
    };
    int runs = 0;
    for (size_t i = 0; i < DP_ARRAY_LEN(bad); i++) {
        for (int up = 0; up < 2; up++) {
            char args[512];
            snprintf(args, sizeof args, "%s --slab 8M --advertise %s", up ? "up" : "unit",
                     bad[i]);
            int st = run(args, out, sizeof out);
            CHECKF(st == 2, "'%s' exited %d: %s", args, st, out);
            CHECK_CONTAINS(out, "--advertise");
            CHECK_CONTAINS(out, "--help");
            runs++;
        }
    }
    CHECK_EQ(runs, 2 * DP_ARRAY_LEN(bad));
    CHECK_EQ(run("unit --help", out, sizeof out), 0);
    CHECK_CONTAINS(out, "--advertise HOST");
    CHECK_EQ(run("up --help", out, sizeof out), 0);
    CHECK_CONTAINS(out, "--advertise HOST");
}

/* unit i's info over the control plane, from address (may differ from its own). */
static void
ask_info(const char *address, char *zmq, size_t cap, uint64_t *unit_id)
{
    dp__ctl_client *c = NULL;
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_OK_D(dp__ctl_client_create(&c, &d), &d);
    dp__wire_rid_gen g;
    CHECK_OK_D(dp__wire_rid_gen_init(&g, &d), &d);
    char rid[DP_WIRE_RID_MAX];
    dp__wire_request q;
    memset(&q, 0, sizeof q);
    q.op = DP_WIRE_OP_INFO;
    q.rid = dp__wire_rid_next(&g, rid);
    dp__buf req, rb;
    dp__buf_init(&req);
    dp__buf_init(&rb);
    CHECK_OK_D(dp__wire_request_encode(&q, NULL, &req, &d), &d);
    CHECK_OK_D(dp__ctl_call(c, address, &req, rid, 10, &rb, &d), &d);
    dp__wire_reply rep;
    CHECK_OK_D(dp__wire_reply_decode(rb.data, rb.len, DP_WIRE_OP_INFO, NULL, &rep, &d),
               &d);
    CHECK(rep.ok);
    dp__wire_str_copy(rep.r.info.zmq, zmq, cap);
    *unit_id = rep.r.info.unit_id;
    dp__wire_reply_fini(&rep);
    dp__buf_fini(&req);
    dp__buf_fini(&rb);
    dp__ctl_client_destroy(c);
}

/* "tcp://host:port" -> port, 0 if it is not of that form. */
static unsigned
port_of(const char *addr)
{
    const char *colon = strrchr(addr, ':');
    if (strncmp(addr, "tcp://", 6) != 0 || colon == NULL || colon < addr + 6)
        return 0;
    return (unsigned)strtoul(colon + 1, NULL, 10);
}

static void
stop(pid_t pid)
{
    kill(pid, SIGTERM);
    CHECK_EQ(dp_test_wait_status(pid), 0);
}

/*
 * A unit bound to every interface advertises a routable address (never
 * 0.0.0.0) on its first stdout line and in info; --advertise sets the host
 * advertised (the port stays the bound one).
 */
DP_TEST(unit_advertises_a_routable_address)
{
    char line[256], zmq[256];
    uint64_t id = 99;
    const char *wild[] = {DP_CLI_PATH, "unit", "--bind",    "0.0.0.0", "--slab", "8M",
                          "--units",   "2",    "--unit-id", "1",       NULL};
    pid_t pid = dp_test_cli_start(wild, line, sizeof line);
    unsigned port = port_of(line);
    CHECKF(port > 0, "unit said '%s'", line);
    CHECKF(strstr(line, "0.0.0.0") == NULL, "unit advertises '%s'", line);
    ask_info(line, zmq, sizeof zmq, &id); /* reachable at what it advertises */
    CHECK_STR(zmq, line);
    CHECK_EQ(id, 1);
    char local[64];
    snprintf(local, sizeof local, "tcp://127.0.0.1:%u", port); /* bound everywhere */
    ask_info(local, zmq, sizeof zmq, &id);
    CHECK_STR(zmq, line);
    stop(pid);

    const char *named[] = {DP_CLI_PATH,   "unit",           "--slab", "8M",
                           "--advertise", "unit-7.example", NULL};
    pid = dp_test_cli_start(named, line, sizeof line);
    port = port_of(line);
    char want[128];
    snprintf(want, sizeof want, "tcp://unit-7.example:%u", port);
    CHECK_STR(line, want);
    snprintf(local, sizeof local, "tcp://127.0.0.1:%u", port);
    ask_info(local, zmq, sizeof zmq, &id);
    CHECK_STR(zmq, want);
    stop(pid);

    const char *v6[] = {DP_CLI_PATH, "unit",        "--bind",    "0.0.0.0", "--slab",
                        "8M",        "--advertise", "[fd00::7]", NULL};
    pid = dp_test_cli_start(v6, line, sizeof line);
    port = port_of(line);
    snprintf(want, sizeof want, "tcp://[fd00::7]:%u", port);
    CHECK_STR(line, want);
    stop(pid);
}

/*
 * In a network namespace with nothing but loopback, a wildcard bind falls
 * back to advertising 127.0.0.1 and says so on stderr. Skipped where
 * unshare(1) cannot make a namespace.
 */
DP_TEST(unit_without_an_address_advertises_loopback_and_warns)
{
    if (system("unshare -rn true >/dev/null 2>&1") != 0)
        DP_SKIP("unshare -rn cannot make a network namespace here");
    char dir[64], err[128], cmd[2048], out[8192];
    tmp_dir(dir, sizeof dir);
    snprintf(err, sizeof err, "%s/err", dir);
    /* The unit's first stdout line, then SIGTERM to that unit (its pid, $!). */
    snprintf(cmd, sizeof cmd,
             "timeout -k 2 %d unshare -rn sh -c '"
             "ip link set lo up 2>/dev/null; mkfifo \"$1/out\" || exit 1; "
             "\"$0\" unit --bind 0.0.0.0 --slab 8M >\"$1/out\" 2>\"$1/err\" & "
             "pid=$!; read line <\"$1/out\"; echo \"line=$line\"; "
             "kill $pid; wait $pid' '%s' '%s'",
             HANG_S, DP_CLI_PATH, dir);
    FILE *p = popen(cmd, "r");
    CHECK(p != NULL);
    size_t n = fread(out, 1, sizeof out - 1, p);
    out[n] = '\0';
    pclose(p);
    char log[8192] = "";
    FILE *f = fopen(err, "r");
    if (f != NULL) {
        log[fread(log, 1, sizeof log - 1, f)] = '\0';
        fclose(f);
    }
    CHECKF(strncmp(out, "line=tcp://127.0.0.1:", 21) == 0, "got '%s'; stderr: %s", out,
           log);
    CHECK_CONTAINS(log, "advertising 127.0.0.1");
    CHECK_CONTAINS(log, "--advertise");
    rm_rf(dir);
}

/*
 * With UCX logging at info level (UCX then prints lines of its own), a
 * unit's stdout holds exactly one line, its tcp:// address; UCX's lines go to
 * stderr.
 */
DP_TEST(unit_stdout_is_only_the_address_with_ucx_logging)
{
    char dir[64], err[128];
    tmp_dir(dir, sizeof dir);
    snprintf(err, sizeof err, "%s/err", dir);
    int fds[2];
    CHECK(pipe(fds) == 0);
    fflush(NULL);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        setenv("UCX_LOG_LEVEL", "info", 1);
        unsetenv("UCX_LOG_FILE");
        int e = open(err, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (e < 0)
            _exit(126);
        dup2(fds[1], 1);
        dup2(e, 2);
        close(fds[0]);
        close(fds[1]);
        execl(DP_CLI_PATH, DP_CLI_PATH, "unit", "--slab", "8M", (char *)NULL);
        _exit(127);
    }
    close(fds[1]);
    char out[8192];
    size_t n = 0;
    while (n + 1 < sizeof out) {
        ssize_t r = read(fds[0], out + n, 1);
        if (r <= 0 || out[n] == '\n')
            break;
        n++;
    }
    out[n] = '\0';
    char first[8192];
    memcpy(first, out, n + 1);
    kill(pid, SIGTERM);
    /* Everything else it wrote to stdout until it exited. */
    n = 0;
    for (ssize_t r;
         n + 1 < sizeof out && (r = read(fds[0], out + n, sizeof out - 1 - n)) > 0;)
        n += (size_t)r;
    out[n] = '\0';
    close(fds[0]);
    int st = dp_test_wait_status(pid);
    char log[16384] = "";
    FILE *f = fopen(err, "r");
    if (f != NULL) {
        log[fread(log, 1, sizeof log - 1, f)] = '\0';
        fclose(f);
    }
    CHECKF(strncmp(first, "tcp://127.0.0.1:", 16) == 0 && port_of(first) > 0,
           "first stdout line '%s'; stderr: %s", first, log);
    CHECKF(n == 0, "more on stdout: '%s'", out);
    CHECK_EQ(st, 0);
    CHECK_CONTAINS(log, "UCX"); /* UCX did print: on stderr */
    CHECK_CONTAINS(log, "INFO");
    rm_rf(dir);
}
