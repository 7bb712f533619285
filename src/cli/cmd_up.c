/*
 * `dataplane up`: a whole cluster on this machine, in the foreground. It
 * starts N unit processes (this binary re-executed as `dataplane unit
 * --unit-id i --units N --port 0 ...`), reads each one's advertised control
 * address from the first line of its stdout, asks each who it is and for its
 * endpoint name (info), writes DIR/cluster.json and waits. Ctrl-C, SIGTERM or
 * SIGHUP stop every unit (SIGTERM, then SIGKILL after a grace period) and
 * remove the cluster file. A unit that dies on its own is reported (which one,
 * its exit status or signal) and the others are stopped: `up` then exits 1.
 *
 * Design notes
 * - One thread. Every signal up cares about (INT, TERM, HUP, CHLD) is blocked
 *   from the start and read from a signalfd, so the event loop is a single
 *   poll() over the signalfd and every unit's stdout and stderr pipes, and the
 *   ZMQ threads of the control client inherit the blocked mask.
 * - Units run in their own process group (a terminal's Ctrl-C reaches only
 *   up, which decides the order of the shutdown) and with PR_SET_PDEATHSIG
 *   SIGTERM, so they stop even if up is killed with SIGKILL.
 * - Unit stderr is collected while the cluster starts (a unit that fails to
 *   start is reported with the tail of it) and forwarded line by line after.
 * - Two ups in one directory: an flock on DIR/.up.lock held for up's life,
 *   and a cluster file whose unit pids are alive (another launcher, or an up
 *   killed with SIGKILL whose units still run) is never replaced.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli/cli.h"

static const char usage_up[] =
    "usage: dataplane up [options]\n"
    "\n"
    "Start a cluster of storage units on this machine and keep it running in the\n"
    "foreground. Writes DIR/cluster.json, which clients find through --cluster,\n"
    "DP_CLUSTER or the default directory. Ctrl-C (or SIGTERM) stops every unit and\n"
    "removes the cluster file. If a unit dies, up says which and how, stops the\n"
    "others and exits with status 1.\n"
    "\n"
    "options:\n"
    "  --units N            number of units (2)\n"
    "  --slab SIZE          slab of each unit, e.g. 512M, 4G (256M)\n"
    "  --dir DIR            where to write cluster.json (default: $XDG_RUNTIME_DIR/\n"
    "                       dataplane, else /tmp/dataplane-<uid>); created 0700\n"
    "  --bind IP            address the units' control servers bind (127.0.0.1)\n"
    "  --advertise HOST     address the units tell clients, written to cluster.json:\n"
    "                       an IPv4 address, [IPv6] or a host name; the port is the\n"
    "                       bound one (default: the bound address; for a wildcard\n"
    "                       --bind such as 0.0.0.0, this host's primary IPv4\n"
    "                       address)\n"
    "  --read-pin-s S       passed to each unit (see 'dataplane unit --help')\n"
    "  --alloc-lease-s S    passed to each unit\n"
    "  --reclaim-grace-s S  passed to each unit ('never' keeps retired regions)\n"
    "  --numa MODE          passed to each unit: auto, bind or off\n"
    "  --ssd-dir D          SSD tier: passed to each unit when given\n"
    "  --staging SIZE       SSD tier staging area: passed when given\n"
    "  --pickup-s S         SSD tier pickup time: passed when given\n"
    "  --grace-s S          how long stopping units may take before SIGKILL (10)\n"
    "  --start-timeout-s S  how long a unit may take to start (120)\n"
    "  -h, --help           this text\n"
    "\n"
    "example:\n"
    "  dataplane up --units 4 --slab 2G\n"
    "  export DP_CLUSTER=$XDG_RUNTIME_DIR/dataplane/cluster.json   # as printed\n";

#define TAIL_LINES 20
#define LINE_MAX_ 1024

typedef struct unit_proc {
    uint32_t id;
    pid_t pid;
    int out_fd, err_fd; /* read ends; -1 once closed */
    char addr[DP_CLUSTER_ADDR_MAX];
    char agent[DP_CLUSTER_ADDR_MAX];
    uint64_t incarnation; /* from its info */
    char out_line[LINE_MAX_];
    size_t out_len;
    char err_line[LINE_MAX_];
    size_t err_len;
    char tail[TAIL_LINES][LINE_MAX_];
    unsigned tail_n; /* lines seen (the ring holds the last TAIL_LINES) */
    bool started;    /* its address was read */
    bool exited;
    int status; /* waitpid status once exited */
} unit_proc;

typedef struct up_state {
    unit_proc *u;
    uint32_t n;
    int sfd;         /* signalfd */
    bool forward;    /* forward unit output (after the start) */
    bool stopping;   /* a stop was requested */
    int stop_signal; /* the signal that asked for it */
} up_state;

/* ---- options ---- */

typedef struct up_opts {
    uint64_t units;
    const char *slab;
    const char *dir;
    const char *bind;
    const char *advertise;
    const char *read_pin_s, *alloc_lease_s, *reclaim_grace_s, *numa;
    const char *ssd_dir, *staging, *pickup_s;
    double grace_s, start_timeout_s;
} up_opts;

static int
parse_opts(int argc, char **argv, up_opts *o)
{
    enum {
        O_UNITS = 1,
        O_SLAB,
        O_DIR,
        O_BIND,
        O_ADVERTISE,
        O_PIN,
        O_LEASE,
        O_RECLAIM,
        O_NUMA,
        O_SSD,
        O_STAGING,
        O_PICKUP,
        O_GRACE,
        O_START
    };
    static const struct option opts[] = {
        {"units", required_argument, NULL, O_UNITS},
        {"slab", required_argument, NULL, O_SLAB},
        {"dir", required_argument, NULL, O_DIR},
        {"bind", required_argument, NULL, O_BIND},
        {"advertise", required_argument, NULL, O_ADVERTISE},
        {"read-pin-s", required_argument, NULL, O_PIN},
        {"alloc-lease-s", required_argument, NULL, O_LEASE},
        {"reclaim-grace-s", required_argument, NULL, O_RECLAIM},
        {"numa", required_argument, NULL, O_NUMA},
        {"ssd-dir", required_argument, NULL, O_SSD},
        {"staging", required_argument, NULL, O_STAGING},
        {"pickup-s", required_argument, NULL, O_PICKUP},
        {"grace-s", required_argument, NULL, O_GRACE},
        {"start-timeout-s", required_argument, NULL, O_START},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0}};
    memset(o, 0, sizeof *o);
    o->units = 2;
    o->slab = "256M";
    o->bind = "127.0.0.1";
    o->grace_s = 10;
    o->start_timeout_s = 120;
    dp_detail d;
    dp_detail_clear(&d);
    uint64_t v;
    double s;
    int c;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        int rc = DP_OK;
        switch (c) {
        case O_UNITS:
            rc = dp_parse_u64(optarg, 1, DP_CLUSTER_MAX_UNITS, &o->units, "--units", &d);
            break;
        case O_SLAB:
            rc = dp_parse_size(optarg, &v, "--slab", &d);
            if (rc == DP_OK && v == 0)
                rc = dp_fail(&d, DP_EINVAL, "--slab must be > 0");
            o->slab = optarg;
            break;
        case O_DIR:
            o->dir = optarg;
            break;
        case O_BIND:
            o->bind = optarg;
            break;
        case O_ADVERTISE:
            rc = dp__cli_check_advertise(optarg, &d);
            o->advertise = optarg;
            break;
        case O_PIN:
            rc = dp_parse_seconds(optarg, &s, "--read-pin-s", &d);
            o->read_pin_s = optarg;
            break;
        case O_LEASE:
            rc = dp_parse_seconds(optarg, &s, "--alloc-lease-s", &d);
            o->alloc_lease_s = optarg;
            break;
        case O_RECLAIM:
            if (strcmp(optarg, "never") != 0)
                rc = dp_parse_seconds(optarg, &s, "--reclaim-grace-s", &d);
            o->reclaim_grace_s = optarg;
            break;
        case O_NUMA:
            if (strcmp(optarg, "auto") != 0 && strcmp(optarg, "bind") != 0 &&
                strcmp(optarg, "off") != 0)
                return dp__cli_usage("up", "--numa must be auto, bind or off, not '%s'",
                                     optarg);
            o->numa = optarg;
            break;
        case O_SSD:
            o->ssd_dir = optarg;
            break;
        case O_STAGING:
            rc = dp_parse_size(optarg, &v, "--staging", &d);
            o->staging = optarg;
            break;
        case O_PICKUP:
            rc = dp_parse_seconds(optarg, &s, "--pickup-s", &d);
            o->pickup_s = optarg;
            break;
        case O_GRACE:
            rc = dp_parse_seconds(optarg, &o->grace_s, "--grace-s", &d);
            break;
        case O_START:
            rc = dp_parse_seconds(optarg, &o->start_timeout_s, "--start-timeout-s", &d);
            if (rc == DP_OK && !(o->start_timeout_s > 0))
                rc = dp_fail(&d, DP_EINVAL, "--start-timeout-s must be > 0");
            break;
        case 'h':
            fputs(usage_up, stdout);
            return 0;
        default:
            return dp__cli_usage("up", "unknown option or missing value '%s'",
                                 argv[optind - 1]);
        }
        if (rc != DP_OK)
            return dp__cli_usage("up", "%s", d.msg);
    }
    if (optind < argc)
        return dp__cli_usage("up", "unexpected argument '%s'", argv[optind]);
    if ((o->staging != NULL || o->pickup_s != NULL) && o->ssd_dir == NULL)
        return dp__cli_usage("up", "--staging and --pickup-s need --ssd-dir");
    return -1;
}

/* ---- the directory, its lock, an existing cluster file ---- */

/* mkdir -p with mode 0700 for what is created; the last component must be ours. */
static int
make_dir(const char *dir, dp_detail *d)
{
    char p[PATH_MAX];
    if (snprintf(p, sizeof p, "%s", dir) >= (int)sizeof p)
        return dp_fail(d, DP_EINVAL, "--dir '%s' is too long", dir);
    for (char *s = p + 1; *s != '\0'; s++) {
        if (*s != '/')
            continue;
        *s = '\0';
        if (mkdir(p, 0700) != 0 && errno != EEXIST)
            return dp_fail_sys(d, errno, "create directory %s", p);
        *s = '/';
    }
    if (mkdir(p, 0700) != 0 && errno != EEXIST)
        return dp_fail_sys(d, errno, "create directory %s", p);
    struct stat st;
    if (stat(p, &st) != 0)
        return dp_fail_sys(d, errno, "stat %s", p);
    if (!S_ISDIR(st.st_mode))
        return dp_fail(d, DP_EINVAL, "%s is not a directory", p);
    if (st.st_uid != getuid())
        return dp_fail(d, DP_EINVAL,
                       "%s belongs to another user (uid %u): choose another --dir", p,
                       (unsigned)st.st_uid);
    return DP_OK;
}

/* A unit process with this pid runs: alive, and (when readable) a `unit` command. */
static bool
unit_alive(int64_t pid)
{
    if (pid <= 0 || pid > INT32_MAX)
        return false;
    if (kill((pid_t)pid, 0) != 0 && errno != EPERM)
        return false;
    char path[64], buf[256];
    snprintf(path, sizeof path, "/proc/%" PRId64 "/cmdline", pid);
    FILE *f = fopen(path, "re");
    if (f == NULL)
        return true; /* cannot tell: assume it is */
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    /* argv[1] == "unit" (argv[0] is any path to the binary). */
    size_t a0 = strlen(buf);
    return a0 + 1 < n && strcmp(buf + a0 + 1, "unit") == 0;
}

/*
 * Refuse a cluster file that names live units or units elsewhere; a file whose
 * units are all gone is stale and will be replaced.
 */
static int
check_existing(const char *path, dp_detail *d)
{
    dp_cluster cl;
    dp_detail e;
    dp_detail_clear(&e);
    int rc = dp_cluster_load(path, &cl, &e);
    if (rc == DP_ENOTFOUND)
        return DP_OK;
    if (rc != DP_OK)
        return dp_fail(d, DP_EEXIST,
                       "%s exists but is not a usable cluster file (%s): remove it, or "
                       "use --dir for another directory",
                       path, e.msg);
    char live[256] = "";
    size_t k = 0;
    bool remote = false;
    for (uint32_t i = 0; i < cl.n_units; i++) {
        if (cl.units[i].pid == 0)
            remote = true;
        else if (unit_alive(cl.units[i].pid) && k + 24 < sizeof live)
            k += (size_t)snprintf(live + k, sizeof live - k, "%s%" PRId64, k ? ", " : "",
                                  cl.units[i].pid);
    }
    uint32_t n = cl.n_units;
    dp_cluster_fini(&cl);
    if (k > 0)
        return dp_fail(d, DP_EEXIST,
                       "a cluster is already running from %s (unit pids %s): stop it "
                       "first (Ctrl-C where it runs, or kill those pids), or use --dir "
                       "for a second cluster",
                       path, live);
    if (remote)
        return dp_fail(d, DP_EEXIST,
                       "%s names units without a local pid (a cluster started by another "
                       "launcher): remove it, or use --dir for another directory",
                       path);
    printf("replacing stale %s (its %u unit%s are gone)\n", path, n, n == 1 ? "" : "s");
    return DP_OK;
}

/* MemAvailable of /proc/meminfo in bytes, 0 if unknown. */
static uint64_t
mem_available(void)
{
    FILE *f = fopen("/proc/meminfo", "re");
    if (f == NULL)
        return 0;
    char line[256];
    unsigned long long kb = 0;
    while (fgets(line, sizeof line, f) != NULL)
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1)
            break;
    fclose(f);
    return (uint64_t)kb * 1024;
}

/* ---- unit processes ---- */

static void
tail_add(unit_proc *u, const char *line)
{
    snprintf(u->tail[u->tail_n % TAIL_LINES], LINE_MAX_, "%s", line);
    u->tail_n++;
}

static void
print_tail(const unit_proc *u)
{
    unsigned first = u->tail_n > TAIL_LINES ? u->tail_n - TAIL_LINES : 0;
    if (u->tail_n == 0) {
        fprintf(stderr, "  (it wrote nothing to stderr)\n");
        return;
    }
    fprintf(stderr, "  its last stderr line%s:\n", u->tail_n - first == 1 ? "" : "s");
    for (unsigned i = first; i < u->tail_n; i++)
        fprintf(stderr, "  | %s\n", u->tail[i % TAIL_LINES]);
}

/* "exited with status 1", "was killed by signal 9 (Killed)". */
static const char *
describe_status(int st, char *buf, size_t cap)
{
    if (WIFEXITED(st))
        snprintf(buf, cap, "exited with status %d", WEXITSTATUS(st));
    else if (WIFSIGNALED(st))
        snprintf(buf, cap, "was killed by signal %d (%s)%s", WTERMSIG(st),
                 strsignal(WTERMSIG(st)), WCOREDUMP(st) ? ", core dumped" : "");
    else
        snprintf(buf, cap, "ended with wait status %#x", (unsigned)st);
    return buf;
}

static int
spawn_unit(unit_proc *u, uint32_t n, const up_opts *o, dp_detail *d)
{
    int out[2] = {-1, -1}, err[2] = {-1, -1};
    if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0) {
        int e = errno;
        for (int i = 0; i < 2; i++) {
            if (out[i] >= 0)
                close(out[i]);
            if (err[i] >= 0)
                close(err[i]);
        }
        return dp_fail_sys(d, e, "pipe for unit %u", u->id);
    }
    char id[16], units[16];
    snprintf(id, sizeof id, "%u", u->id);
    snprintf(units, sizeof units, "%u", n);
    const char *args[40];
    int k = 0;
    args[k++] = "dataplane";
    args[k++] = "unit";
    args[k++] = "--unit-id";
    args[k++] = id;
    args[k++] = "--units";
    args[k++] = units;
    args[k++] = "--port";
    args[k++] = "0";
    args[k++] = "--bind";
    args[k++] = o->bind;
    args[k++] = "--slab";
    args[k++] = o->slab;
#define PASS(flag, val)                                                                  \
    do {                                                                                 \
        if ((val) != NULL) {                                                             \
            args[k++] = flag;                                                            \
            args[k++] = (val);                                                           \
        }                                                                                \
    } while (0)
    PASS("--advertise", o->advertise);
    PASS("--read-pin-s", o->read_pin_s);
    PASS("--alloc-lease-s", o->alloc_lease_s);
    PASS("--reclaim-grace-s", o->reclaim_grace_s);
    PASS("--numa", o->numa);
    PASS("--ssd-dir", o->ssd_dir);
    PASS("--staging", o->staging);
    PASS("--pickup-s", o->pickup_s);
#undef PASS
    args[k] = NULL;
    pid_t parent = getpid();
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
        int e = errno;
        close(out[0]);
        close(out[1]);
        close(err[0]);
        close(err[1]);
        return dp_fail_sys(d, e, "fork unit %u", u->id);
    }
    if (pid == 0) {
        /* Child: only async-signal-safe calls until exec. */
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        signal(SIGPIPE, SIG_DFL);
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        if (getppid() != parent)
            _exit(126);
        setpgid(0, 0);
        int nul = open("/dev/null", O_RDONLY);
        if (nul >= 0)
            dup2(nul, 0);
        dup2(out[1], 1);
        dup2(err[1], 2);
        execv("/proc/self/exe", (char *const *)args);
        static const char msg[] = "dataplane up: cannot execute /proc/self/exe\n";
        ssize_t w = write(2, msg, sizeof msg - 1);
        (void)w;
        _exit(127);
    }
    close(out[1]);
    close(err[1]);
    fcntl(out[0], F_SETFL, O_NONBLOCK);
    fcntl(err[0], F_SETFL, O_NONBLOCK);
    u->pid = pid;
    u->out_fd = out[0];
    u->err_fd = err[0];
    return DP_OK;
}

/* A complete line from unit u's stdout (is_err false) or stderr. */
static void
on_line(up_state *s, unit_proc *u, bool is_err, const char *line)
{
    if (!is_err && !u->started) {
        if (strncmp(line, "tcp://", 6) == 0 && strlen(line) < sizeof u->addr) {
            snprintf(u->addr, sizeof u->addr, "%s", line);
            u->started = true;
            printf("unit %u at %s (pid %d)\n", u->id, u->addr, (int)u->pid);
            fflush(stdout);
        } else {
            tail_add(u, line);
        }
        return;
    }
    if (is_err)
        tail_add(u, line);
    if (s->forward) {
        if (is_err)
            fprintf(stderr, "%s\n", line);
        else
            fprintf(stderr, "[unit %u stdout] %s\n", u->id, line);
    }
}

/* Read what is there on fd; split into lines. Closes fd at EOF. */
static void
drain(up_state *s, unit_proc *u, bool is_err)
{
    int *fd = is_err ? &u->err_fd : &u->out_fd;
    char *line = is_err ? u->err_line : u->out_line;
    size_t *len = is_err ? &u->err_len : &u->out_len;
    char buf[4096];
    for (;;) {
        ssize_t r = read(*fd, buf, sizeof buf);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return;
        if (r <= 0) {
            if (*len > 0) {
                line[*len] = '\0';
                on_line(s, u, is_err, line);
                *len = 0;
            }
            close(*fd);
            *fd = -1;
            return;
        }
        for (ssize_t i = 0; i < r; i++) {
            if (buf[i] == '\n' || *len + 1 >= LINE_MAX_) {
                line[*len] = '\0';
                on_line(s, u, is_err, line);
                *len = 0;
                if (buf[i] == '\n')
                    continue;
            }
            line[(*len)++] = buf[i];
        }
    }
}

static uint32_t
n_running(const up_state *s)
{
    uint32_t k = 0;
    for (uint32_t i = 0; i < s->n; i++)
        k += s->u[i].pid > 0 && !s->u[i].exited;
    return k;
}

/* Reap every child that exited; returns the first unit that exited, or NULL. */
static unit_proc *
reap(up_state *s)
{
    unit_proc *first = NULL;
    for (;;) {
        int st;
        pid_t p = waitpid(-1, &st, WNOHANG);
        if (p <= 0)
            break;
        for (uint32_t i = 0; i < s->n; i++) {
            unit_proc *u = &s->u[i];
            if (u->pid == p && !u->exited) {
                u->exited = true;
                u->status = st;
                /* Collect what it wrote before it went. */
                if (u->err_fd >= 0)
                    drain(s, u, true);
                if (u->out_fd >= 0)
                    drain(s, u, false);
                if (first == NULL)
                    first = u;
            }
        }
    }
    return first;
}

/*
 * Wait up to timeout_s (< 0: forever) for something: pipe data is handled,
 * signals are returned (0: none, the signal number otherwise; SIGCHLD reaps).
 */
static int
wait_event(up_state *s, double timeout_s)
{
    struct pollfd *p = calloc(1 + 2 * (size_t)s->n, sizeof *p);
    if (p == NULL) {
        dp_sleep_s(0.05);
        return 0;
    }
    size_t k = 0;
    p[k++] = (struct pollfd){.fd = s->sfd, .events = POLLIN};
    for (uint32_t i = 0; i < s->n; i++) {
        if (s->u[i].out_fd >= 0)
            p[k++] = (struct pollfd){.fd = s->u[i].out_fd, .events = POLLIN};
        if (s->u[i].err_fd >= 0)
            p[k++] = (struct pollfd){.fd = s->u[i].err_fd, .events = POLLIN};
    }
    int ms = timeout_s < 0 ? -1 : (int)(timeout_s * 1000) + 1;
    int r = poll(p, k, ms);
    int sig = 0;
    if (r > 0) {
        for (size_t j = 1; j < k; j++) {
            if (p[j].revents == 0)
                continue;
            for (uint32_t i = 0; i < s->n; i++) {
                if (p[j].fd == s->u[i].out_fd)
                    drain(s, &s->u[i], false);
                else if (p[j].fd == s->u[i].err_fd)
                    drain(s, &s->u[i], true);
            }
        }
        if (p[0].revents & POLLIN) {
            struct signalfd_siginfo si;
            if (read(s->sfd, &si, sizeof si) == (ssize_t)sizeof si)
                sig = (int)si.ssi_signo;
        }
    }
    free(p);
    return sig;
}

/*
 * Stop every running unit: SIGTERM, wait up to grace_s, SIGKILL the rest. A
 * second INT/TERM while waiting skips the grace. Returns false if a unit had
 * to be killed or did not stop cleanly.
 */
static bool
stop_all(up_state *s, double grace_s)
{
    bool clean = true;
    for (uint32_t i = 0; i < s->n; i++)
        if (s->u[i].pid > 0 && !s->u[i].exited)
            kill(s->u[i].pid, SIGTERM);
    double end = dp_now_s() + grace_s;
    while (n_running(s) > 0 && dp_now_s() < end) {
        int sig = wait_event(s, DP_MIN(0.2, end - dp_now_s()));
        if (sig == SIGINT || sig == SIGTERM) {
            fprintf(stderr, "dataplane up: asked again: killing the units now\n");
            break;
        }
        /* SIGCHLD is not the only wake-up cause: reap on every pass. */
        for (unit_proc *u; (u = reap(s)) != NULL;) {
            if (!(WIFEXITED(u->status) && WEXITSTATUS(u->status) == 0) &&
                !(WIFSIGNALED(u->status) && WTERMSIG(u->status) == SIGTERM)) {
                char why[96];
                fprintf(stderr, "dataplane up: unit %u (pid %d) %s while stopping\n",
                        u->id, (int)u->pid, describe_status(u->status, why, sizeof why));
                clean = false;
            }
        }
    }
    for (uint32_t i = 0; i < s->n; i++) {
        unit_proc *u = &s->u[i];
        if (u->pid <= 0 || u->exited)
            continue;
        fprintf(stderr,
                "dataplane up: unit %u (pid %d) did not stop within %.0f s: killing it\n",
                u->id, (int)u->pid, grace_s);
        kill(u->pid, SIGKILL);
        clean = false;
    }
    for (uint32_t i = 0; i < s->n; i++) {
        unit_proc *u = &s->u[i];
        if (u->pid > 0 && !u->exited) {
            while (waitpid(u->pid, &u->status, 0) < 0 && errno == EINTR)
                ;
            u->exited = true;
        }
        if (u->err_fd >= 0)
            drain(s, u, true);
        if (u->out_fd >= 0)
            drain(s, u, false);
    }
    return clean;
}

/*
 * info from every unit, within timeout_s: each says it is unit i of n (as up
 * started it) and gives its endpoint name for the cluster file.
 */
static int
ask_info(up_state *s, const char *path, double timeout_s, dp_detail *d)
{
    dp__cli_conn c;
    memset(&c, 0, sizeof c);
    c.timeout_s = c.connect_timeout_s = timeout_s;
    c.cl.n_units = s->n;
    snprintf(c.path, sizeof c.path, "%s", path); /* the file up writes next */
    int rc = DP_OK;
    c.cl.units = calloc(s->n, sizeof *c.cl.units);
    c.units = calloc(s->n, sizeof *c.units);
    if (c.cl.units == NULL || c.units == NULL) {
        rc = dp_fail(d, DP_ENOMEM, "out of memory");
        goto out;
    }
    for (uint32_t i = 0; i < s->n; i++) {
        c.cl.units[i].id = i;
        snprintf(c.cl.units[i].zmq, sizeof c.cl.units[i].zmq, "%s", s->u[i].addr);
    }
    if ((rc = dp_wire_rid_gen_init(&c.rids, d)) != DP_OK ||
        (rc = dp_ctl_client_create(&c.ctl, d)) != DP_OK ||
        (rc = dp__cli_check_units(&c, -1, 0, d)) != DP_OK)
        goto out;
    for (uint32_t i = 0; i < s->n; i++) {
        snprintf(s->u[i].agent, sizeof s->u[i].agent, "%s", c.units[i].agent);
        s->u[i].incarnation = c.units[i].incarnation;
    }
out:
    dp__cli_disconnect(&c);
    return rc;
}

int
dp__cmd_up(int argc, char **argv)
{
    up_opts o;
    int st = parse_opts(argc, argv, &o);
    if (st >= 0)
        return st;

    /* Before any thread or child exists: the event loop reads these from a signalfd. */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGHUP);
    sigaddset(&sigs, SIGCHLD);
    sigprocmask(SIG_BLOCK, &sigs, NULL);
    /*
     * A background job of a script starts with SIGINT ignored: take it anyway,
     * so `kill -INT` stops up. (An ignored SIGHUP cannot be honoured either:
     * UCX's constructor installs its own SIGHUP handler before main runs, so
     * nohup does not protect up; start it with setsid to detach it.)
     */
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    signal(SIGHUP, SIG_DFL);
    signal(SIGPIPE, SIG_IGN);

    dp_detail d;
    dp_detail_clear(&d);
    up_state s;
    memset(&s, 0, sizeof s);
    s.sfd = -1;
    int status = 1, rc, lock_fd = -1;
    bool wrote = false;
    char dir[PATH_MAX], path[PATH_MAX], lock_path[PATH_MAX];
    if (o.dir != NULL)
        snprintf(dir, sizeof dir, "%s", o.dir);
    else
        dp_cluster_default_dir(dir, sizeof dir);
    if (snprintf(path, sizeof path, "%s/%s", dir, DP_CLUSTER_FILE) >= (int)sizeof path ||
        snprintf(lock_path, sizeof lock_path, "%s/.up.lock", dir) >=
            (int)sizeof lock_path) {
        return dp__cli_usage("up", "--dir '%s' is too long", dir);
    }
    if ((rc = make_dir(dir, &d)) != DP_OK)
        return dp__cli_fail("up", rc, &d);
    /* Print and record absolute paths: clients run from other directories. */
    char abs_dir[PATH_MAX];
    if (realpath(dir, abs_dir) != NULL && strlen(abs_dir) + 16 < sizeof path) {
        size_t n = strlen(abs_dir);
        memcpy(dir, abs_dir, n + 1);
        memcpy(path, abs_dir, n);
        snprintf(path + n, sizeof path - n, "/%s", DP_CLUSTER_FILE);
    }
    lock_fd = open(lock_path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (lock_fd < 0)
        return dp__cli_fail("up", dp_fail_sys(&d, errno, "open %s", lock_path), &d);
    if (flock(lock_fd, LOCK_EX | LOCK_NB) != 0) {
        close(lock_fd);
        fprintf(stderr,
                "dataplane up: another 'dataplane up' is running with its cluster file "
                "in %s: stop it first, or use --dir for a second cluster\n",
                dir);
        return 1;
    }
    if ((rc = check_existing(path, &d)) != DP_OK) {
        status = dp__cli_fail("up", rc, &d);
        goto out;
    }
    if ((s.sfd = signalfd(-1, &sigs, SFD_CLOEXEC)) < 0) {
        status = dp__cli_fail("up", dp_fail_sys(&d, errno, "signalfd"), &d);
        goto out;
    }

    s.n = (uint32_t)o.units;
    s.u = calloc(s.n, sizeof *s.u);
    if (s.u == NULL) {
        status = dp__cli_fail("up", dp_fail(&d, DP_ENOMEM, "out of memory"), &d);
        goto out;
    }
    uint64_t slab_bytes = 0;
    dp_parse_size(o.slab, &slab_bytes, "--slab", NULL);
    char sz[32];
    uint64_t avail = mem_available();
    if (avail > 0 && slab_bytes > avail / s.n) {
        char a[32], b[32];
        fprintf(stderr,
                "dataplane up: warning: %u x %s of slab is more than the %s of memory "
                "available now; units may fail to start or be killed when they fill\n",
                s.n, dp_fmt_size(slab_bytes, a, sizeof a),
                dp_fmt_size(avail, b, sizeof b));
    }
    printf("starting %u unit%s (slab %s each%s%s)...\n", s.n, s.n == 1 ? "" : "s",
           dp_fmt_size(slab_bytes, sz, sizeof sz), o.ssd_dir ? ", SSD tier in " : "",
           o.ssd_dir ? o.ssd_dir : "");
    fflush(stdout);
    for (uint32_t i = 0; i < s.n; i++) {
        s.u[i].id = i;
        s.u[i].out_fd = s.u[i].err_fd = -1;
        if ((rc = spawn_unit(&s.u[i], s.n, &o, &d)) != DP_OK) {
            dp__cli_fail("up", rc, &d);
            goto stop;
        }
    }

    /* Wait for every address. */
    double end = dp_now_s() + o.start_timeout_s;
    for (;;) {
        uint32_t up = 0;
        for (uint32_t i = 0; i < s.n; i++)
            up += s.u[i].started;
        if (up == s.n)
            break;
        if (dp_now_s() >= end) {
            for (uint32_t i = 0; i < s.n; i++) {
                if (s.u[i].started)
                    continue;
                fprintf(stderr,
                        "dataplane up: unit %u (pid %d) did not report its address "
                        "within %.0f s\n",
                        i, (int)s.u[i].pid, o.start_timeout_s);
                print_tail(&s.u[i]);
            }
            goto stop;
        }
        int sig = wait_event(&s, end - dp_now_s());
        if (sig == SIGINT || sig == SIGTERM || sig == SIGHUP) {
            fprintf(stderr, "dataplane up: %s while starting: stopping\n",
                    strsignal(sig));
            s.stopping = true;
            s.stop_signal = sig;
            goto stop;
        }
        unit_proc *dead = reap(&s);
        if (dead != NULL) {
            char why[96];
            fprintf(stderr, "dataplane up: unit %u (pid %d) failed to start: it %s\n",
                    dead->id, (int)dead->pid,
                    describe_status(dead->status, why, sizeof why));
            print_tail(dead);
            goto stop;
        }
    }
    /* Asking the units who they are is part of starting them: the same budget. */
    if ((rc = ask_info(&s, path, DP_MAX(end - dp_now_s(), 1.0), &d)) != DP_OK) {
        dp__cli_fail("up", rc, &d);
        goto stop;
    }
    /*
     * What the units logged while starting sits in their tails: show it once,
     * in unit order, then forward their output live.
     */
    for (uint32_t i = 0; i < s.n; i++) {
        unit_proc *u = &s.u[i];
        if (u->err_fd >= 0)
            drain(&s, u, true);
        unsigned first = u->tail_n > TAIL_LINES ? u->tail_n - TAIL_LINES : 0;
        for (unsigned k = first; k < u->tail_n; k++)
            fprintf(stderr, "%s\n", u->tail[k % TAIL_LINES]);
    }
    fflush(stderr);
    s.forward = true;

    dp_cluster cl = {.n_units = s.n, .units = calloc(s.n, sizeof(dp_cluster_unit))};
    if (cl.units == NULL) {
        dp__cli_fail("up", dp_fail(&d, DP_ENOMEM, "out of memory"), &d);
        goto stop;
    }
    for (uint32_t i = 0; i < s.n; i++) {
        cl.units[i].id = i;
        cl.units[i].pid = s.u[i].pid;
        snprintf(cl.units[i].zmq, sizeof cl.units[i].zmq, "%s", s.u[i].addr);
        snprintf(cl.units[i].agent, sizeof cl.units[i].agent, "%s", s.u[i].agent);
        cl.units[i].incarnation = s.u[i].incarnation;
    }
    rc = dp_cluster_save(path, &cl, &d);
    dp_cluster_fini(&cl);
    if (rc != DP_OK) {
        dp__cli_fail("up", rc, &d);
        goto stop;
    }
    wrote = true;
    printf("cluster of %u unit%s up: %s\n"
           "clients find it with --cluster %s, or:\n"
           "  export DP_CLUSTER=%s\n"
           "Ctrl-C stops it.\n",
           s.n, s.n == 1 ? "" : "s", path, path, path);
    fflush(stdout);

    for (;;) {
        int sig = wait_event(&s, -1);
        if (sig == SIGINT || sig == SIGTERM || sig == SIGHUP) {
            printf("%s: stopping %u unit%s...\n", strsignal(sig), s.n,
                   s.n == 1 ? "" : "s");
            fflush(stdout);
            s.stopping = true;
            s.stop_signal = sig;
            break;
        }
        unit_proc *dead = reap(&s);
        if (dead != NULL) {
            char why[96];
            fprintf(stderr,
                    "dataplane up: unit %u (pid %d, %s) %s: stopping the other units\n",
                    dead->id, (int)dead->pid, dead->addr,
                    describe_status(dead->status, why, sizeof why));
            break;
        }
    }

stop:
    if (wrote && unlink(path) != 0 && errno != ENOENT)
        fprintf(stderr, "dataplane up: could not remove %s: %s\n", path, strerror(errno));
    if (s.u != NULL) {
        bool clean = stop_all(&s, o.grace_s);
        /* Asked to stop and every unit stopped cleanly: 0 (128 + signal if the
         * cluster never came up); a unit died or would not stop: 1. */
        if (s.stopping && clean)
            status = wrote ? 0 : 128 + s.stop_signal;
        else
            status = 1;
        if (status == 0)
            printf("stopped %u unit%s%s\n", s.n, s.n == 1 ? "" : "s",
                   wrote ? "; cluster file removed" : "");
        else if (wrote)
            fprintf(stderr, "dataplane up: cluster stopped; %s removed\n", path);
        fflush(stdout);
    }
out:
    if (s.u != NULL)
        for (uint32_t i = 0; i < s.n; i++) {
            if (s.u[i].out_fd >= 0)
                close(s.u[i].out_fd);
            if (s.u[i].err_fd >= 0)
                close(s.u[i].err_fd);
        }
    free(s.u);
    if (s.sfd >= 0)
        close(s.sfd);
    if (lock_fd >= 0)
        close(lock_fd);
    return status;
}
