/*
 * The multi-host topology of dp_netns.h: namespaces, bridge, veths, fault
 * rules, processes inside hosts, and the cleanup paths.
 *
 * Design notes.
 *   - Every external command (ip, iptables) runs through run_cmd: fork, an
 *     optional setns into a host, execv of an absolute path, stdout and
 *     stderr captured, a time limit; anything but exit 0 becomes DP_ESYS
 *     with the command line, its status and its output.
 *   - A topology owns: its namespaces (the switch and one per host), the
 *     bridge and veths inside them, the iptables rules it added inside the
 *     hosts, the processes spawned in it (a table of slots: pid, status, fds)
 *     and a guardian process. dp_netns_destroy undoes them in reverse order:
 *     processes, rules, links, namespaces, guardian.
 *   - Live topologies are listed in a small static table that the atexit and
 *     signal handlers walk. Both act only on topologies whose owner is the
 *     current pid, so a forked child that exits never tears down its parent's
 *     topology. The signal handler does only the part that cannot be left to
 *     anyone else (kill the processes, delete the namespaces, which takes
 *     their links and rules with them), using fork, execv and waitpid.
 *   - The guardian is /bin/sh, double-forked into its own session so that a
 *     kill of the test's process tree or group misses it, blocked on a read
 *     of a pipe whose write end only the creator holds (close-on-exec). It
 *     reads "q" from a clean destroy and exits; on end of file (the creator
 *     died) it kills what runs in the namespaces and deletes them.
 *   - Spawned children: fork (or a raw clone with CLONE_NEWPID | NEWIPC |
 *     NEWUTS for DP_NETNS_OWN_MACHINE, since a new PID namespace applies only
 *     to children), then only async-signal-safe calls until execv, since the
 *     caller may be multithreaded (a UCX client in the test process). A
 *     failed step is reported through a close-on-exec pipe: the parent reads
 *     end of file when the exec succeeded.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "dp_netns.h"

#include "common/common.h" /* dp__fail, dp__fail_sys */

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define NS_NAME_MAX 64
#define MAX_PROCS 64
#define CMD_TIMEOUT_S 30.0
#define RUN_NETNS "/run/netns"

typedef struct proc_slot {
    pid_t pid; /* 0: free */
    bool reaped;
    int status;
    int in_fd, out_fd;
} proc_slot;

struct dp_netns {
    uint32_t n_hosts;
    pid_t owner;
    unsigned seq;
    char sw[NS_NAME_MAX];
    char host[DP_NETNS_MAX_HOSTS][NS_NAME_MAX];
    char ip[DP_NETNS_MAX_HOSTS][16];
    char ip_bin[256];
    char ipt_bin[256]; /* "" when iptables was not found working */
    bool sw_made, br_made;
    bool host_made[DP_NETNS_MAX_HOSTS];
    bool veth_made[DP_NETNS_MAX_HOSTS];
    bool blackhole[DP_NETNS_MAX_HOSTS];
    char loss[DP_NETNS_MAX_HOSTS][24]; /* the probability of the loss rule, "" none */
    int guard_fd;                      /* write end of the guardian's pipe, -1 */
    proc_slot procs[MAX_PROCS];
};

/* ---- small helpers ---- */

static double
now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void
sleep_s(double s)
{
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

static int
status_of(int st)
{
    return WIFEXITED(st) ? WEXITSTATUS(st) : WIFSIGNALED(st) ? -WTERMSIG(st) : -1000;
}

/* Write all of p without being killed by SIGPIPE; 0 or an errno. */
static int
write_nosigpipe(int fd, const void *p, size_t n)
{
    sigset_t set, old;
    sigemptyset(&set);
    sigaddset(&set, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &set, &old);
    int err = 0;
    const char *c = p;
    while (n > 0) {
        ssize_t k = write(fd, c, n);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0) {
            err = k < 0 ? errno : EIO;
            break;
        }
        c += k;
        n -= (size_t)k;
    }
    if (err == EPIPE) {
        struct timespec zero = {0, 0};
        sigtimedwait(&set, NULL, &zero); /* consume the SIGPIPE we caused */
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return err;
}

/* An executable called name: an absolute or relative path as is, else PATH. */
static bool
find_bin(const char *name, char *out, size_t cap)
{
    if (strchr(name, '/') != NULL) {
        snprintf(out, cap, "%s", name);
        return access(out, X_OK) == 0;
    }
    const char *env = getenv("PATH");
    char path[4096];
    /* sbin first: root's tools live there even when PATH lacks it. */
    snprintf(path, sizeof path, "/usr/sbin:/sbin:%s:/usr/bin:/bin", env ? env : "");
    char *save = NULL;
    for (char *dir = strtok_r(path, ":", &save); dir != NULL;
         dir = strtok_r(NULL, ":", &save)) {
        if (*dir == '\0')
            continue;
        snprintf(out, cap, "%s/%s", dir, name);
        if (access(out, X_OK) == 0)
            return true;
    }
    out[0] = '\0';
    return false;
}

static void
join_argv(const char *const *argv, char *out, size_t cap)
{
    size_t k = 0;
    out[0] = '\0';
    for (size_t i = 0; argv[i] != NULL && k + 1 < cap; i++) {
        int w = snprintf(out + k, cap - k, "%s%s", i ? " " : "", argv[i]);
        if (w < 0)
            break;
        k += (size_t)w;
    }
    if (k >= cap && cap > 4)
        memcpy(out + cap - 4, "...", 4);
}

/* Cut trailing whitespace and turn newlines into " | " for one-line details. */
static void
one_line(char *s)
{
    size_t n = strlen(s);
    while (n > 0 && (s[n - 1] == '\n' || s[n - 1] == ' ' || s[n - 1] == '\r'))
        s[--n] = '\0';
    for (size_t i = 0; i < n; i++)
        if (s[i] == '\n' || s[i] == '\r')
            s[i] = ';';
}

static void
ns_path(const char *name, char *out, size_t cap)
{
    snprintf(out, cap, RUN_NETNS "/%.*s", NS_NAME_MAX - 1, name);
}

/* ---- running commands ---- */

/*
 * Run argv (argv[0] an absolute path) inside the namespace file nspath (NULL:
 * here); its stdout and stderr into out (NULL allowed). 0 when it exited 0.
 */
static int
run_cmd(const char *nspath, const char *const *argv, char *out, size_t cap, dp_detail *d)
{
    char cmdline[1024], buf[4096];
    join_argv(argv, cmdline, sizeof cmdline);
    int nsfd = -1, fds[2] = {-1, -1}, devnull = -1;
    if (nspath != NULL && (nsfd = open(nspath, O_RDONLY | O_CLOEXEC)) < 0)
        return dp__fail_sys(d, errno, "`%s`: open %s", cmdline, nspath);
    if (pipe2(fds, O_CLOEXEC) != 0 ||
        (devnull = open("/dev/null", O_RDONLY | O_CLOEXEC)) < 0) {
        int e = errno;
        if (nsfd >= 0)
            close(nsfd);
        if (fds[0] >= 0) {
            close(fds[0]);
            close(fds[1]);
        }
        return dp__fail_sys(d, e, "`%s`: pipe", cmdline);
    }
    pid_t pid = fork();
    if (pid == 0) {
        dup2(devnull, 0);
        dup2(fds[1], 1);
        dup2(fds[1], 2);
        if (nsfd >= 0 && setns(nsfd, CLONE_NEWNET) != 0) {
            static const char m[] = "setns into the host's namespace failed\n";
            (void)!write(2, m, sizeof m - 1);
            _exit(126);
        }
        execv(argv[0], (char *const *)argv);
        static const char m[] = "execv failed\n";
        (void)!write(2, m, sizeof m - 1);
        _exit(127);
    }
    int fork_errno = errno;
    close(fds[1]);
    close(devnull);
    if (nsfd >= 0)
        close(nsfd);
    if (pid < 0) {
        close(fds[0]);
        return dp__fail_sys(d, fork_errno, "`%s`: fork", cmdline);
    }
    size_t n = 0;
    double end = now_s() + CMD_TIMEOUT_S;
    bool timed_out = false;
    for (;;) {
        double left = end - now_s();
        if (left <= 0) {
            timed_out = true;
            break;
        }
        struct pollfd pf = {fds[0], POLLIN, 0};
        int r = poll(&pf, 1, (int)(left * 1000) + 1);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            continue;
        ssize_t k = read(fds[0], buf + n, sizeof buf - 1 - n);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            break;
        n += (size_t)k;
        if (n == sizeof buf - 1) { /* keep the head, drain the rest */
            char sink[4096];
            while (read(fds[0], sink, sizeof sink) > 0)
                ;
            break;
        }
    }
    buf[n] = '\0';
    close(fds[0]);
    if (timed_out)
        kill(pid, SIGKILL);
    int st = 0;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
        ;
    if (out != NULL && cap > 0)
        snprintf(out, cap, "%s", buf);
    if (!timed_out && WIFEXITED(st) && WEXITSTATUS(st) == 0)
        return 0;
    one_line(buf);
    if (timed_out)
        return dp__fail(d, DP_ESYS, "`%s` did not finish within %.0f s (killed): %s",
                        cmdline, CMD_TIMEOUT_S, buf);
    if (WIFEXITED(st))
        return dp__fail(d, DP_ESYS, "`%s` exited %d: %s", cmdline, WEXITSTATUS(st),
                        buf[0] ? buf : "(no output)");
    return dp__fail(d, DP_ESYS, "`%s` killed by signal %d: %s", cmdline,
                    WIFSIGNALED(st) ? WTERMSIG(st) : -1, buf);
}

#define MAX_ARGS 32

/* Run bin with the NULL-terminated string arguments, in nsname (NULL: here). */
static int
vcmd(const char *nsname, const char *bin, char *out, size_t cap, dp_detail *d, va_list ap)
{
    const char *argv[MAX_ARGS + 2];
    size_t k = 0;
    argv[k++] = bin;
    const char *a;
    while ((a = va_arg(ap, const char *)) != NULL && k < MAX_ARGS + 1)
        argv[k++] = a;
    argv[k] = NULL;
    char path[NS_NAME_MAX + 16];
    if (nsname != NULL)
        ns_path(nsname, path, sizeof path);
    return run_cmd(nsname ? path : NULL, argv, out, cap, d);
}

/* `ip ARGS...` in the caller's namespace (ARGS name namespaces with -n). */
static int
ipc(dp_netns *n, dp_detail *d, ...)
{
    va_list ap;
    va_start(ap, d);
    int rc = vcmd(NULL, n->ip_bin, NULL, 0, d, ap);
    va_end(ap);
    return rc;
}

/* `iptables ARGS...` inside host h; output into out. */
static int
iptc(dp_netns *n, uint32_t h, char *out, size_t cap, dp_detail *d, ...)
{
    if (n->ipt_bin[0] == '\0')
        return dp__fail(d, DP_EUNSUPPORTED,
                        "no working iptables (install the iptables package: "
                        "scripts/deps.sh)");
    va_list ap;
    va_start(ap, d);
    int rc = vcmd(n->host[h], n->ipt_bin, out, cap, d, ap);
    va_end(ap);
    return rc;
}

/* ---- the live table, atexit, signals ---- */

#define MAX_LIVE 16
static dp_netns *live[MAX_LIVE];
static bool handlers_installed;
static volatile sig_atomic_t in_handler;

static const int fatal_sigs[] = {SIGINT,  SIGTERM, SIGHUP, SIGQUIT,
                                 SIGABRT, SIGSEGV, SIGBUS};

static void
live_add(dp_netns *n)
{
    for (int i = 0; i < MAX_LIVE; i++)
        if (live[i] == NULL) {
            live[i] = n;
            return;
        }
}

static void
live_del(dp_netns *n)
{
    for (int i = 0; i < MAX_LIVE; i++)
        if (live[i] == n)
            live[i] = NULL;
}

/* Kill and reap every process of n still running (async-signal-safe). */
static void
kill_procs(dp_netns *n)
{
    for (int i = 0; i < MAX_PROCS; i++) {
        proc_slot *s = &n->procs[i];
        if (s->pid > 0 && !s->reaped) {
            kill(s->pid, SIGKILL);
            int st = 0;
            while (waitpid(s->pid, &st, 0) < 0 && errno == EINTR)
                ;
            s->reaped = true;
            s->status = status_of(st);
        }
    }
}

/* Delete the namespaces of n with fork/execv/waitpid only (signal handler). */
static void
delete_namespaces_fast(dp_netns *n)
{
    for (int i = -1; i < (int)n->n_hosts; i++) {
        bool made = i < 0 ? n->sw_made : n->host_made[i];
        if (!made)
            continue;
        const char *argv[] = {n->ip_bin, "netns", "del", i < 0 ? n->sw : n->host[i],
                              NULL};
        pid_t pid = fork();
        if (pid == 0) {
            int fd = open("/dev/null", O_RDWR);
            if (fd >= 0) {
                dup2(fd, 1);
                dup2(fd, 2);
            }
            execv(argv[0], (char *const *)argv);
            _exit(127);
        }
        if (pid > 0)
            while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
                ;
    }
}

static void
on_fatal_signal(int sig)
{
    if (!in_handler) {
        in_handler = 1;
        for (int i = 0; i < MAX_LIVE; i++) {
            dp_netns *n = live[i];
            if (n == NULL || n->owner != getpid())
                continue;
            kill_procs(n);
            delete_namespaces_fast(n);
            if (n->guard_fd >= 0)
                (void)!write(n->guard_fd, "q\n", 2);
        }
    }
    signal(sig, SIG_DFL);
    raise(sig);
}

static void
on_exit_cleanup(void)
{
    for (int i = 0; i < MAX_LIVE; i++) {
        dp_netns *n = live[i];
        if (n == NULL || n->owner != getpid())
            continue;
        dp_detail d;
        dp_detail_clear(&d);
        if (dp_netns_destroy(n, &d) != 0)
            fprintf(stderr, "dp_netns: cleanup at exit: %s\n", dp_detail_msg(&d));
    }
}

static void
install_handlers(void)
{
    if (handlers_installed)
        return;
    handlers_installed = true;
    atexit(on_exit_cleanup);
    for (size_t i = 0; i < sizeof fatal_sigs / sizeof fatal_sigs[0]; i++) {
        struct sigaction old;
        if (sigaction(fatal_sigs[i], NULL, &old) != 0 || old.sa_handler != SIG_DFL ||
            (old.sa_flags & SA_SIGINFO))
            continue; /* the program has its own handler: leave it */
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_fatal_signal;
        sigemptyset(&sa.sa_mask);
        sigaction(fatal_sigs[i], &sa, NULL);
    }
}

/* ---- the guardian ---- */

static const char guardian_script[] =
    "ip=\"$1\"; shift\n"
    "read -r x\n"
    "[ \"$x\" = q ] && exit 0\n"
    "for ns in \"$@\"; do\n"
    "  for p in $(\"$ip\" netns pids \"$ns\" 2>/dev/null); do kill -9 \"$p\"; done\n"
    "done\n"
    "for ns in \"$@\"; do \"$ip\" netns del \"$ns\"; done\n"
    "exit 0\n";

static int
guardian_start(dp_netns *n, dp_detail *d)
{
    const char *argv[DP_NETNS_MAX_HOSTS + 8];
    size_t k = 0;
    argv[k++] = "/bin/sh";
    argv[k++] = "-c";
    argv[k++] = guardian_script;
    argv[k++] = "dp_netns-guardian";
    argv[k++] = n->ip_bin;
    argv[k++] = n->sw;
    for (uint32_t i = 0; i < n->n_hosts; i++)
        argv[k++] = n->host[i];
    argv[k] = NULL;
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0)
        return dp__fail_sys(d, errno, "guardian: pipe");
    int devnull = open("/dev/null", O_RDWR | O_CLOEXEC);
    if (devnull < 0) {
        int e = errno;
        close(fds[0]);
        close(fds[1]);
        return dp__fail_sys(d, e, "guardian: open /dev/null");
    }
    pid_t mid = fork();
    if (mid == 0) {
        setsid();
        pid_t g = fork();
        if (g != 0)
            _exit(g > 0 ? 0 : 1);
        dup2(fds[0], 0);
        dup2(devnull, 1);
        dup2(devnull, 2);
        closefrom(3);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    int e = errno;
    close(fds[0]);
    close(devnull);
    if (mid < 0) {
        close(fds[1]);
        return dp__fail_sys(d, e, "guardian: fork");
    }
    int st = 0;
    while (waitpid(mid, &st, 0) < 0 && errno == EINTR)
        ;
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        close(fds[1]);
        return dp__fail(d, DP_ESYS, "guardian: the second fork failed");
    }
    n->guard_fd = fds[1];
    return 0;
}

static void
guardian_release(dp_netns *n)
{
    if (n->guard_fd < 0)
        return;
    write_nosigpipe(n->guard_fd, "q\n", 2);
    close(n->guard_fd);
    n->guard_fd = -1;
}

/* ---- sweep and leftovers ---- */

/* The creator pid in a name "dpns-<pid>-...", or 0. */
static pid_t
creator_of(const char *name)
{
    size_t pl = strlen(DP_NETNS_PREFIX);
    if (strncmp(name, DP_NETNS_PREFIX, pl) != 0)
        return 0;
    char *end = NULL;
    long pid = strtol(name + pl, &end, 10);
    if (end == name + pl || *end != '-' || pid <= 0)
        return 0;
    return (pid_t)pid;
}

int
dp_netns_sweep(int *removed, dp_detail *d)
{
    if (removed != NULL)
        *removed = 0;
    char ip_bin[256];
    if (!find_bin("ip", ip_bin, sizeof ip_bin))
        return dp__fail(d, DP_EUNSUPPORTED, "no `ip` command (install iproute2)");
    DIR *dir = opendir(RUN_NETNS);
    if (dir == NULL)
        return errno == ENOENT ? 0 : dp__fail_sys(d, errno, "opendir " RUN_NETNS);
    char names[64][NS_NAME_MAX];
    int n = 0, rc = 0;
    struct dirent *e;
    while ((e = readdir(dir)) != NULL && n < 64) {
        pid_t pid = creator_of(e->d_name);
        if (pid <= 0 || pid == getpid() || strlen(e->d_name) >= NS_NAME_MAX)
            continue;
        if (kill(pid, 0) == 0 || errno != ESRCH)
            continue; /* creator alive (or not ours to judge) */
        snprintf(names[n++], NS_NAME_MAX, "%s", e->d_name);
    }
    closedir(dir);
    for (int i = 0; i < n; i++) {
        char pids[1024], path[NS_NAME_MAX + 16];
        const char *lsv[] = {ip_bin, "netns", "pids", names[i], NULL};
        if (run_cmd(NULL, lsv, pids, sizeof pids, NULL) == 0) {
            char *save = NULL;
            for (char *t = strtok_r(pids, " \n", &save); t != NULL;
                 t = strtok_r(NULL, " \n", &save))
                kill((pid_t)atol(t), SIGKILL);
        }
        const char *delv[] = {ip_bin, "netns", "del", names[i], NULL};
        dp_detail dd;
        dp_detail_clear(&dd);
        ns_path(names[i], path, sizeof path);
        if (run_cmd(NULL, delv, NULL, 0, &dd) != 0 && access(path, F_OK) == 0) {
            if (rc == 0)
                rc = dp__fail(d, DP_ESYS, "sweep of stale namespace %s: %s", names[i],
                              dd.msg);
            continue;
        }
        if (removed != NULL)
            (*removed)++;
    }
    return rc;
}

int
dp_netns_leftovers(pid_t pid, char *out, size_t cap)
{
    if (out != NULL && cap > 0)
        out[0] = '\0';
    DIR *dir = opendir(RUN_NETNS);
    if (dir == NULL)
        return errno == ENOENT ? 0 : -1;
    char pre[48];
    snprintf(pre, sizeof pre, DP_NETNS_PREFIX "%ld-", (long)pid);
    int count = 0;
    size_t k = 0;
    struct dirent *e;
    while ((e = readdir(dir)) != NULL) {
        if (strncmp(e->d_name, pre, strlen(pre)) != 0)
            continue;
        count++;
        if (out != NULL && k + 1 < cap) {
            int w = snprintf(out + k, cap - k, "%s%s", k ? " " : "", e->d_name);
            if (w > 0)
                k += (size_t)w;
        }
    }
    closedir(dir);
    return count;
}

/* ---- create / destroy ---- */

static unsigned next_seq;

/* The first failure of a kind of step that tells whether the machine allows it. */
static int
unsupported(dp_detail *d, const char *what)
{
    if (d != NULL) {
        char m[DP_DETAIL_MAX];
        memcpy(m, d->msg, sizeof m);
        m[sizeof m - 1] = '\0';
        dp__fail(d, DP_EUNSUPPORTED, "%s: %s", what, m);
    }
    return DP_EUNSUPPORTED;
}

static int
probe_iptables(dp_netns *n, dp_detail *d)
{
    static const char *const names[] = {"iptables", "iptables-nft", "iptables-legacy"};
    char first[DP_DETAIL_MAX] = "";
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char bin[256];
        if (!find_bin(names[i], bin, sizeof bin))
            continue;
        snprintf(n->ipt_bin, sizeof n->ipt_bin, "%s", bin);
        dp_detail pd;
        dp_detail_clear(&pd);
        char out[2048];
        if (iptc(n, 0, out, sizeof out, &pd, "-w", "-S", (char *)NULL) == 0)
            return 0;
        if (first[0] == '\0')
            snprintf(first, sizeof first, "%s", pd.msg);
    }
    n->ipt_bin[0] = '\0';
    return dp__fail(d, DP_EUNSUPPORTED, "no working iptables inside a namespace%s%s",
                    first[0] ? ": " : " (install the iptables package: scripts/deps.sh)",
                    first);
}

int
dp_netns_create(uint32_t n_hosts, unsigned flags, dp_netns **out, dp_detail *d)
{
    *out = NULL;
    if (n_hosts < 1 || n_hosts > DP_NETNS_MAX_HOSTS)
        return dp__fail(d, DP_EINVAL, "n_hosts %u not in 1..%d", n_hosts,
                        DP_NETNS_MAX_HOSTS);
    if (geteuid() != 0)
        return dp__fail(d, DP_EUNSUPPORTED,
                        "not root: network namespaces, veths and bridges need "
                        "CAP_SYS_ADMIN and CAP_NET_ADMIN");
    dp_netns *n = calloc(1, sizeof *n);
    if (n == NULL)
        return dp__fail(d, DP_ENOMEM, "dp_netns: out of memory");
    n->guard_fd = -1;
    for (int i = 0; i < MAX_PROCS; i++)
        n->procs[i].in_fd = n->procs[i].out_fd = -1;
    n->n_hosts = n_hosts;
    n->owner = getpid();
    n->seq = next_seq++;
    if (!find_bin("ip", n->ip_bin, sizeof n->ip_bin)) {
        free(n);
        return dp__fail(d, DP_EUNSUPPORTED, "no `ip` command (install iproute2)");
    }
    snprintf(n->sw, sizeof n->sw, DP_NETNS_PREFIX "%ld-%u-sw", (long)n->owner, n->seq);
    unsigned octet = (unsigned)(n->owner % 250) + 1;
    for (uint32_t i = 0; i < n_hosts; i++) {
        snprintf(n->host[i], sizeof n->host[i], DP_NETNS_PREFIX "%ld-%u-h%u",
                 (long)n->owner, n->seq, i);
        snprintf(n->ip[i], sizeof n->ip[i], "10.213.%u.%u", octet, i + 1);
    }

    int rc, removed = 0;
    dp_detail sd;
    dp_detail_clear(&sd);
    if (dp_netns_sweep(&removed, &sd) != 0)
        fprintf(stderr, "dp_netns: %s\n", sd.msg);
    else if (removed > 0)
        fprintf(stderr, "dp_netns: removed %d stale namespace%s\n", removed,
                removed == 1 ? "" : "s");

    install_handlers();
    live_add(n);
    if ((rc = guardian_start(n, d)) != 0)
        goto fail;

    if ((rc = ipc(n, d, "netns", "add", n->sw, (char *)NULL)) != 0) {
        rc = unsupported(d, "network namespaces not available");
        goto fail;
    }
    n->sw_made = true;
    if ((rc = ipc(n, d, "-n", n->sw, "link", "add", "br0", "type", "bridge",
                  (char *)NULL)) != 0) {
        rc = unsupported(d, "bridges not available");
        goto fail;
    }
    n->br_made = true;
    if ((rc = ipc(n, d, "-n", n->sw, "link", "set", "br0", "up", (char *)NULL)) != 0)
        goto fail;
    for (uint32_t i = 0; i < n_hosts; i++) {
        char port[16], cidr[24];
        snprintf(port, sizeof port, "p%u", i);
        snprintf(cidr, sizeof cidr, "%s/24", n->ip[i]);
        if ((rc = ipc(n, d, "netns", "add", n->host[i], (char *)NULL)) != 0)
            goto fail;
        n->host_made[i] = true;
        if ((rc = ipc(n, d, "-n", n->sw, "link", "add", port, "type", "veth", "peer",
                      "name", "eth0", "netns", n->host[i], (char *)NULL)) != 0) {
            if (i == 0)
                rc = unsupported(d, "veth pairs not available");
            goto fail;
        }
        n->veth_made[i] = true;
        if ((rc = ipc(n, d, "-n", n->sw, "link", "set", port, "master", "br0",
                      (char *)NULL)) != 0 ||
            (rc = ipc(n, d, "-n", n->sw, "link", "set", port, "up", (char *)NULL)) != 0 ||
            (rc = ipc(n, d, "-n", n->host[i], "link", "set", "lo", "up", (char *)NULL)) !=
                0 ||
            (rc = ipc(n, d, "-n", n->host[i], "addr", "add", cidr, "dev", "eth0",
                      (char *)NULL)) != 0 ||
            (rc = ipc(n, d, "-n", n->host[i], "link", "set", "eth0", "up",
                      (char *)NULL)) != 0)
            goto fail;
    }

    /* Can a process enter a host as its own machine (setns, mounts, clone)? */
    {
        const char *argv[] = {"/bin/true", NULL};
        dp_netns_proc p;
        if ((rc = dp_netns_spawn(n, 0, argv, DP_NETNS_OWN_MACHINE, &p, d)) != 0) {
            rc = unsupported(d, "cannot start a process inside a namespace");
            goto fail;
        }
        int st = dp_netns_proc_stop(&p, 0, 10.0);
        if (st != 0) {
            rc = dp__fail(d, DP_EUNSUPPORTED,
                          "/bin/true inside a namespace exited with status %d", st);
            goto fail;
        }
    }
    if ((rc = probe_iptables(n, d)) != 0 && (flags & DP_NETNS_IPTABLES))
        goto fail;
    *out = n;
    return 0;
fail:
    dp_netns_destroy(n, NULL);
    return rc;
}

int
dp_netns_destroy(dp_netns *n, dp_detail *d)
{
    if (n == NULL)
        return 0;
    int rc = 0, r;
    dp_detail sd;
#define STEP(expr)                                                                       \
    do {                                                                                 \
        dp_detail_clear(&sd);                                                            \
        if ((r = (expr)) != 0 && rc == 0)                                                \
            rc = dp__fail(d, r, "teardown: %s", sd.msg);                                 \
    } while (0)
    kill_procs(n);
    for (int i = 0; i < MAX_PROCS; i++) {
        proc_slot *s = &n->procs[i];
        if (s->in_fd >= 0)
            close(s->in_fd);
        if (s->out_fd >= 0)
            close(s->out_fd);
        s->in_fd = s->out_fd = -1;
    }
    for (uint32_t i = 0; i < n->n_hosts; i++) {
        if (!n->host_made[i])
            continue;
        if (n->blackhole[i])
            STEP(dp_netns_blackhole(n, i, false, &sd));
        if (n->loss[i][0] != '\0')
            STEP(dp_netns_loss(n, i, 0.0, &sd));
    }
    for (uint32_t i = 0; i < n->n_hosts; i++) {
        if (!n->veth_made[i])
            continue;
        char port[16];
        snprintf(port, sizeof port, "p%u", i);
        STEP(ipc(n, &sd, "-n", n->sw, "link", "del", port, (char *)NULL));
        n->veth_made[i] = false;
    }
    if (n->br_made) {
        STEP(ipc(n, &sd, "-n", n->sw, "link", "del", "br0", (char *)NULL));
        n->br_made = false;
    }
    for (int i = (int)n->n_hosts - 1; i >= -1; i--) {
        bool *made = i < 0 ? &n->sw_made : &n->host_made[i];
        const char *name = i < 0 ? n->sw : n->host[i];
        if (!*made)
            continue;
        STEP(ipc(n, &sd, "netns", "del", name, (char *)NULL));
        char path[NS_NAME_MAX + 16];
        ns_path(name, path, sizeof path);
        if (access(path, F_OK) == 0 && rc == 0)
            rc = dp__fail(d, DP_ESYS, "teardown: namespace %s still exists", name);
        *made = false;
    }
#undef STEP
    guardian_release(n);
    live_del(n);
    free(n);
    return rc;
}

uint32_t
dp_netns_n_hosts(const dp_netns *n)
{
    return n->n_hosts;
}

const char *
dp_netns_ip(const dp_netns *n, uint32_t host)
{
    return host < n->n_hosts ? n->ip[host] : NULL;
}

const char *
dp_netns_name(const dp_netns *n, uint32_t host)
{
    return host < n->n_hosts ? n->host[host] : NULL;
}

/* ---- faults ---- */

static int
check_host(const dp_netns *n, uint32_t host, dp_detail *d)
{
    if (host >= n->n_hosts || !n->host_made[host])
        return dp__fail(d, DP_EINVAL, "host %u not in this topology of %u", host,
                        n->n_hosts);
    return 0;
}

int
dp_netns_blackhole(dp_netns *n, uint32_t host, bool on, dp_detail *d)
{
    int rc = check_host(n, host, d);
    if (rc != 0 || n->blackhole[host] == on)
        return rc;
    if (on) {
        if ((rc = iptc(n, host, NULL, 0, d, "-w", "-I", "INPUT", "1", "-i", "eth0", "-j",
                       "DROP", (char *)NULL)) != 0)
            return rc;
        if ((rc = iptc(n, host, NULL, 0, d, "-w", "-I", "OUTPUT", "1", "-o", "eth0", "-j",
                       "DROP", (char *)NULL)) != 0) {
            iptc(n, host, NULL, 0, NULL, "-w", "-D", "INPUT", "-i", "eth0", "-j", "DROP",
                 (char *)NULL);
            return rc;
        }
        n->blackhole[host] = true;
        return 0;
    }
    int r1 = iptc(n, host, NULL, 0, d, "-w", "-D", "INPUT", "-i", "eth0", "-j", "DROP",
                  (char *)NULL);
    dp_detail d2;
    dp_detail_clear(&d2);
    int r2 = iptc(n, host, NULL, 0, r1 ? &d2 : d, "-w", "-D", "OUTPUT", "-o", "eth0",
                  "-j", "DROP", (char *)NULL);
    n->blackhole[host] = false;
    return r1 ? r1 : r2;
}

int
dp_netns_loss(dp_netns *n, uint32_t host, double p, dp_detail *d)
{
    int rc = check_host(n, host, d);
    if (rc != 0)
        return rc;
    if (!(p >= 0.0 && p <= 1.0))
        return dp__fail(d, DP_EINVAL, "loss probability %g not in 0..1", p);
    char prob[24];
    snprintf(prob, sizeof prob, "%.6f", p);
    if (p > 0.0 && strcmp(prob, n->loss[host]) == 0)
        return 0;
    if (n->loss[host][0] != '\0') {
        const char *old = n->loss[host];
        int r1 = iptc(n, host, NULL, 0, d, "-w", "-D", "INPUT", "-i", "eth0", "-m",
                      "statistic", "--mode", "random", "--probability", old, "-j", "DROP",
                      (char *)NULL);
        int r2 = iptc(n, host, NULL, 0, r1 ? NULL : d, "-w", "-D", "OUTPUT", "-o", "eth0",
                      "-m", "statistic", "--mode", "random", "--probability", old, "-j",
                      "DROP", (char *)NULL);
        n->loss[host][0] = '\0';
        if (r1 || r2)
            return r1 ? r1 : r2;
    }
    if (p == 0.0)
        return 0;
    if ((rc = iptc(n, host, NULL, 0, d, "-w", "-A", "INPUT", "-i", "eth0", "-m",
                   "statistic", "--mode", "random", "--probability", prob, "-j", "DROP",
                   (char *)NULL)) != 0)
        return rc;
    if ((rc = iptc(n, host, NULL, 0, d, "-w", "-A", "OUTPUT", "-o", "eth0", "-m",
                   "statistic", "--mode", "random", "--probability", prob, "-j", "DROP",
                   (char *)NULL)) != 0) {
        iptc(n, host, NULL, 0, NULL, "-w", "-D", "INPUT", "-i", "eth0", "-m", "statistic",
             "--mode", "random", "--probability", prob, "-j", "DROP", (char *)NULL);
        return rc;
    }
    snprintf(n->loss[host], sizeof n->loss[host], "%s", prob);
    return 0;
}

int
dp_netns_link(dp_netns *n, uint32_t host, bool up, dp_detail *d)
{
    int rc = check_host(n, host, d);
    if (rc != 0)
        return rc;
    return ipc(n, d, "-n", n->host[host], "link", "set", "dev", "eth0",
               up ? "up" : "down", (char *)NULL);
}

int
dp_netns_rules(dp_netns *n, uint32_t host, char *out, size_t cap, dp_detail *d)
{
    int rc = check_host(n, host, d);
    if (rc != 0)
        return rc;
    return iptc(n, host, out, cap, d, "-w", "-S", (char *)NULL);
}

int
dp_netns_exec(dp_netns *n, uint32_t host, const char *const *argv, char *out, size_t cap,
              dp_detail *d)
{
    if (argv == NULL || argv[0] == NULL)
        return dp__fail(d, DP_EINVAL, "dp_netns_exec: empty argv");
    if (host != DP_NETNS_HERE) {
        int rc = check_host(n, host, d);
        if (rc != 0)
            return rc;
    }
    char bin[4096];
    if (!find_bin(argv[0], bin, sizeof bin))
        return dp__fail(d, DP_ENOTFOUND, "dp_netns_exec: no executable %s", argv[0]);
    const char *args[MAX_ARGS + 1];
    size_t k = 0;
    args[k++] = bin;
    for (size_t i = 1; argv[i] != NULL && k < MAX_ARGS; i++)
        args[k++] = argv[i];
    args[k] = NULL;
    char path[NS_NAME_MAX + 16];
    if (host != DP_NETNS_HERE)
        ns_path(n->host[host], path, sizeof path);
    return run_cmd(host != DP_NETNS_HERE ? path : NULL, args, out, cap, d);
}

/* ---- processes ---- */

/* The steps of a spawned child before exec, as reported through its pipe. */
enum spawn_step {
    S_OPEN_NS,
    S_SETNS,
    S_UNSHARE_MNT,
    S_MOUNT_PRIVATE,
    S_MOUNT_SYS,
    S_MOUNT_PROC,
    S_HOSTNAME,
    S_DUP,
    S_EXEC,
};
static const char *const spawn_step_names[] = {
    "open the host's namespace file",
    "setns(CLONE_NEWNET)",
    "unshare(CLONE_NEWNS)",
    "make / a slave mount",
    "mount a fresh /sys",
    "mount a fresh /proc",
    "sethostname",
    "dup2 of stdio",
    "execv",
};

struct spawn_err {
    int step;
    int err;
};

__attribute__((noreturn)) static void
child_fail(int fd, int step)
{
    struct spawn_err e = {step, errno};
    (void)!write(fd, &e, sizeof e);
    _exit(126);
}

int
dp_netns_spawn(dp_netns *n, uint32_t host, const char *const *argv, unsigned flags,
               dp_netns_proc *p, dp_detail *d)
{
    memset(p, 0, sizeof *p);
    p->pid = -1;
    p->in_fd = p->out_fd = -1;
    p->slot = -1;
    int rc = check_host(n, host, d);
    if (rc != 0)
        return rc;
    if (argv == NULL || argv[0] == NULL)
        return dp__fail(d, DP_EINVAL, "dp_netns_spawn: empty argv");
    int slot = -1;
    for (int i = 0; i < MAX_PROCS && slot < 0; i++)
        if (n->procs[i].pid == 0)
            slot = i;
    if (slot < 0)
        return dp__fail(d, DP_ENOMEM, "dp_netns_spawn: more than %d processes",
                        MAX_PROCS);
    char bin[4096], path[NS_NAME_MAX + 16], cmdline[512];
    join_argv(argv, cmdline, sizeof cmdline);
    if (!find_bin(argv[0], bin, sizeof bin))
        return dp__fail(d, DP_ENOTFOUND, "spawn `%s`: no executable %s", cmdline,
                        argv[0]);
    const char *args[256];
    size_t k = 0;
    args[k++] = bin;
    for (size_t i = 1; argv[i] != NULL && k < 255; i++)
        args[k++] = argv[i];
    args[k] = NULL;
    ns_path(n->host[host], path, sizeof path);
    const char *hostname = n->host[host];
    bool own = (flags & DP_NETNS_OWN_MACHINE) != 0;

    int out_fd = memfd_create("dp_netns-stdout", MFD_CLOEXEC);
    int in[2] = {-1, -1}, errp[2] = {-1, -1};
    if (out_fd < 0)
        return dp__fail_sys(d, errno, "spawn `%s`: memfd_create", cmdline);
    if (pipe2(errp, O_CLOEXEC) != 0 ||
        ((flags & DP_NETNS_STDIN) && pipe2(in, O_CLOEXEC) != 0)) {
        rc = dp__fail_sys(d, errno, "spawn `%s`: pipe", cmdline);
        goto fail_fds;
    }
    int devnull = -1;
    if (!(flags & DP_NETNS_STDIN) &&
        (devnull = open("/dev/null", O_RDONLY | O_CLOEXEC)) < 0) {
        rc = dp__fail_sys(d, errno, "spawn `%s`: open /dev/null", cmdline);
        goto fail_fds;
    }
    pid_t parent = getpid();
    fflush(NULL);
    pid_t pid;
    if (own)
        pid = (pid_t)syscall(SYS_clone,
                             CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS | SIGCHLD, NULL,
                             NULL, NULL, NULL);
    else
        pid = fork();
    if (pid == 0) {
        /* The child: async-signal-safe calls only (see the design notes). */
        int ef = errp[1];
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (!own && getppid() != parent)
            _exit(125);
        if (dup2(in[0] >= 0 ? in[0] : devnull, 0) < 0 || dup2(out_fd, 1) < 0)
            child_fail(ef, S_DUP);
        int nsfd = open(path, O_RDONLY | O_CLOEXEC);
        if (nsfd < 0)
            child_fail(ef, S_OPEN_NS);
        if (setns(nsfd, CLONE_NEWNET) != 0)
            child_fail(ef, S_SETNS);
        if (unshare(CLONE_NEWNS) != 0)
            child_fail(ef, S_UNSHARE_MNT);
        if (mount(NULL, "/", NULL, MS_REC | MS_SLAVE, NULL) != 0)
            child_fail(ef, S_MOUNT_PRIVATE);
        umount2("/sys", MNT_DETACH); /* may not be mounted: then nothing to hide */
        if (mount("sysfs", "/sys", "sysfs", MS_NOSUID | MS_NOEXEC | MS_NODEV, NULL) != 0)
            child_fail(ef, S_MOUNT_SYS);
        if (own) {
            if (mount("proc", "/proc", "proc", MS_NOSUID | MS_NOEXEC | MS_NODEV, NULL) !=
                0)
                child_fail(ef, S_MOUNT_PROC);
            if (sethostname(hostname, strlen(hostname)) != 0)
                child_fail(ef, S_HOSTNAME);
        }
        /* Nothing else of the caller's reaches the program (errp[1] until exec). */
        close_range(3, ~0u, CLOSE_RANGE_CLOEXEC);
        execv(args[0], (char *const *)args);
        child_fail(ef, S_EXEC);
    }
    int fork_errno = errno;
    close(errp[1]);
    errp[1] = -1;
    if (in[0] >= 0) {
        close(in[0]);
        in[0] = -1;
    }
    if (devnull >= 0)
        close(devnull);
    if (pid < 0) {
        rc = dp__fail_sys(d, fork_errno, "spawn `%s`: %s", cmdline,
                          own ? "clone(CLONE_NEWPID|CLONE_NEWIPC|CLONE_NEWUTS)" : "fork");
        goto fail_fds;
    }
    struct spawn_err se;
    ssize_t got;
    while ((got = read(errp[0], &se, sizeof se)) < 0 && errno == EINTR)
        ;
    close(errp[0]);
    errp[0] = -1;
    if (got > 0) {
        int st = 0;
        while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
            ;
        const char *step = se.step >= 0 && se.step <= S_EXEC ? spawn_step_names[se.step]
                                                             : "an unknown step";
        rc = dp__fail(d, DP_ESYS, "spawn `%s` in %s: %s failed: %s", cmdline, hostname,
                      step, strerror(se.err));
        goto fail_fds;
    }
    proc_slot *s = &n->procs[slot];
    s->pid = pid;
    s->reaped = false;
    s->status = 0;
    s->in_fd = in[1];
    s->out_fd = out_fd;
    p->pid = pid;
    p->in_fd = in[1];
    p->out_fd = out_fd;
    p->n = n;
    p->slot = slot;
    return 0;
fail_fds:
    if (errp[0] >= 0)
        close(errp[0]);
    if (errp[1] >= 0)
        close(errp[1]);
    if (in[0] >= 0)
        close(in[0]);
    if (in[1] >= 0)
        close(in[1]);
    close(out_fd);
    return rc;
}

/* Reap p if it exited (options 0: wait for it). True if it is gone. */
static bool
reap(dp_netns_proc *p, int options)
{
    if (p->pid < 0)
        return true;
    proc_slot *s = &p->n->procs[p->slot];
    if (s->reaped) {
        p->status = s->status;
        return true;
    }
    int st = 0;
    pid_t r;
    while ((r = waitpid(p->pid, &st, options)) < 0 && errno == EINTR)
        ;
    if (r == 0)
        return false;
    s->reaped = true;
    s->status = r == p->pid ? status_of(st) : -1000;
    p->status = s->status;
    return true;
}

bool
dp_netns_proc_alive(dp_netns_proc *p)
{
    return !reap(p, WNOHANG);
}

int
dp_netns_readline(dp_netns_proc *p, char *line, size_t cap, double timeout_s,
                  dp_detail *d)
{
    if (cap == 0)
        return dp__fail(d, DP_EINVAL, "readline: cap 0");
    line[0] = '\0';
    if (p->out_fd < 0)
        return dp__fail(d, DP_ECLOSED, "readline: process already stopped");
    double end = now_s() + timeout_s, nap = 0.0005;
    for (;;) {
        bool gone = !dp_netns_proc_alive(p); /* before reading: no output is missed */
        uint64_t off = p->out_off;
        char buf[4096];
        ssize_t k;
        size_t kept = 0;
        bool nl = false;
        while ((k = pread(p->out_fd, buf, sizeof buf, (off_t)off)) > 0) {
            char *e = memchr(buf, '\n', (size_t)k);
            size_t take = e ? (size_t)(e - buf) : (size_t)k;
            size_t room = cap - 1 - kept;
            memcpy(line + kept, buf, take < room ? take : room);
            kept += take < room ? take : room;
            off += take;
            if (e != NULL) {
                nl = true;
                off++;
                break;
            }
        }
        line[kept] = '\0';
        bool truncated = off - p->out_off - (nl ? 1 : 0) > kept;
        if (nl || (gone && off > p->out_off)) {
            p->out_off = off;
            if (truncated)
                return dp__fail(d, DP_ETOOBIG, "readline: line longer than %zu bytes",
                                cap - 1);
            return 0;
        }
        line[0] = '\0';
        if (gone)
            return dp__fail(d, DP_ECLOSED,
                            "process %ld exited (status %d), no more output",
                            (long)p->pid, p->status);
        if (now_s() >= end)
            return dp__fail(d, DP_ETIMEDOUT, "no line from process %ld within %.1f s",
                            (long)p->pid, timeout_s);
        sleep_s(nap);
        if (nap < 0.005)
            nap *= 2;
    }
}

int
dp_netns_writeline(dp_netns_proc *p, const char *line, dp_detail *d)
{
    if (p->in_fd < 0)
        return dp__fail(d, DP_ECLOSED,
                        "writeline: no stdin pipe (DP_NETNS_STDIN) or closed");
    size_t n = strlen(line);
    char *buf = malloc(n + 1);
    if (buf == NULL)
        return dp__fail(d, DP_ENOMEM, "writeline: out of memory");
    memcpy(buf, line, n);
    buf[n] = '\n';
    int err = write_nosigpipe(p->in_fd, buf, n + 1);
    free(buf);
    if (err == EPIPE)
        return dp__fail(d, DP_ECLOSED, "writeline: process %ld closed its stdin",
                        (long)p->pid);
    if (err != 0)
        return dp__fail_sys(d, err, "writeline to process %ld", (long)p->pid);
    return 0;
}

int
dp_netns_ask(dp_netns_proc *p, const char *cmd, char *answer, size_t cap,
             double timeout_s, dp_detail *d)
{
    int rc = dp_netns_writeline(p, cmd, d);
    if (rc != 0)
        return rc;
    return dp_netns_readline(p, answer, cap, timeout_s, d);
}

int
dp_netns_proc_stop(dp_netns_proc *p, int sig, double grace_s)
{
    if (p->pid < 0)
        return p->status;
    if (p->in_fd >= 0) {
        close(p->in_fd);
        p->in_fd = -1;
        p->n->procs[p->slot].in_fd = -1;
    }
    if (!reap(p, WNOHANG)) {
        if (sig != 0)
            kill(p->pid, sig);
        double end = now_s() + grace_s;
        while (!reap(p, WNOHANG) && now_s() < end)
            sleep_s(0.005);
        if (!reap(p, WNOHANG)) {
            kill(p->pid, SIGKILL);
            reap(p, 0);
        }
    }
    if (p->out_fd >= 0) {
        close(p->out_fd);
        p->out_fd = -1;
        p->n->procs[p->slot].out_fd = -1;
    }
    p->n->procs[p->slot].pid = 0;
    p->pid = -1;
    return p->status;
}
