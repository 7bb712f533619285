/*
 * Supervision of the unit processes `dataplane up` runs (see supervise.h):
 * spawning, reading their pipes, signals, reaping, stopping with grace.
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
 * - A unit's first stdout line starting with tcp:// is its address; what
 *   comes before it is kept with its stderr tail.
 */
#include "cli/supervise.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

void
dp__sup_block_signals(sigset_t *sigs)
{
    sigemptyset(sigs);
    sigaddset(sigs, SIGINT);
    sigaddset(sigs, SIGTERM);
    sigaddset(sigs, SIGHUP);
    sigaddset(sigs, SIGCHLD);
    sigprocmask(SIG_BLOCK, sigs, NULL);
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
}

void
dp__sup_init(dp__sup *s)
{
    memset(s, 0, sizeof *s);
    s->sfd = -1;
}

int
dp__sup_open(dp__sup *s, uint32_t n, const sigset_t *sigs, dp_detail *d)
{
    if ((s->sfd = signalfd(-1, sigs, SFD_CLOEXEC)) < 0)
        return dp__fail_sys(d, errno, "signalfd");
    s->n = n;
    s->u = calloc(s->n, sizeof *s->u);
    if (s->u == NULL)
        return dp__fail(d, DP_ENOMEM, "out of memory");
    for (uint32_t i = 0; i < s->n; i++) {
        s->u[i].id = i;
        s->u[i].out_fd = s->u[i].err_fd = -1;
    }
    return DP_OK;
}

void
dp__sup_close(dp__sup *s)
{
    for (uint32_t i = 0; s->u != NULL && i < s->n; i++) {
        if (s->u[i].out_fd >= 0)
            close(s->u[i].out_fd);
        if (s->u[i].err_fd >= 0)
            close(s->u[i].err_fd);
    }
    free(s->u);
    s->u = NULL;
    if (s->sfd >= 0)
        close(s->sfd);
    s->sfd = -1;
}

/* ---- unit processes ---- */

static void
tail_add(dp__sup_unit *u, const char *line)
{
    snprintf(u->tail[u->tail_n % DP__SUP_TAIL_LINES], DP__SUP_LINE_MAX, "%s", line);
    u->tail_n++;
}

static void
print_tail(const dp__sup_unit *u)
{
    unsigned first = u->tail_n > DP__SUP_TAIL_LINES ? u->tail_n - DP__SUP_TAIL_LINES : 0;
    if (u->tail_n == 0) {
        fprintf(stderr, "  (it wrote nothing to stderr)\n");
        return;
    }
    fprintf(stderr, "  its last stderr line%s:\n", u->tail_n - first == 1 ? "" : "s");
    for (unsigned i = first; i < u->tail_n; i++)
        fprintf(stderr, "  | %s\n", u->tail[i % DP__SUP_TAIL_LINES]);
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

int
dp__sup_spawn(dp__sup *s, uint32_t id, const char *const *args, dp_detail *d)
{
    dp__sup_unit *u = &s->u[id];
    int out[2] = {-1, -1}, err[2] = {-1, -1};
    if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0) {
        int e = errno;
        for (int i = 0; i < 2; i++) {
            if (out[i] >= 0)
                close(out[i]);
            if (err[i] >= 0)
                close(err[i]);
        }
        return dp__fail_sys(d, e, "pipe for unit %u", u->id);
    }
    pid_t parent = getpid();
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
        int e = errno;
        close(out[0]);
        close(out[1]);
        close(err[0]);
        close(err[1]);
        return dp__fail_sys(d, e, "fork unit %u", u->id);
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
on_line(dp__sup *s, dp__sup_unit *u, bool is_err, const char *line)
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
drain(dp__sup *s, dp__sup_unit *u, bool is_err)
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
            if (buf[i] == '\n' || *len + 1 >= DP__SUP_LINE_MAX) {
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
n_running(const dp__sup *s)
{
    uint32_t k = 0;
    for (uint32_t i = 0; i < s->n; i++)
        k += s->u[i].pid > 0 && !s->u[i].exited;
    return k;
}

/* Reap every child that exited; returns the first unit that exited, or NULL. */
static dp__sup_unit *
reap(dp__sup *s)
{
    dp__sup_unit *first = NULL;
    for (;;) {
        int st;
        pid_t p = waitpid(-1, &st, WNOHANG);
        if (p <= 0)
            break;
        for (uint32_t i = 0; i < s->n; i++) {
            dp__sup_unit *u = &s->u[i];
            if (u->pid == p && !u->exited) {
                u->exited = true;
                u->dead_pending = u->started; /* a running unit: dp__sup_watch says so */
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
wait_event(dp__sup *s, double timeout_s)
{
    struct pollfd *p = calloc(1 + 2 * (size_t)s->n, sizeof *p);
    if (p == NULL) {
        dp__sleep_s(0.05);
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

bool
dp__sup_stop_all(dp__sup *s, double grace_s)
{
    bool clean = true;
    for (uint32_t i = 0; i < s->n; i++)
        if (s->u[i].pid > 0 && !s->u[i].exited)
            kill(s->u[i].pid, SIGTERM);
    double end = dp__now_s() + grace_s;
    while (n_running(s) > 0 && dp__now_s() < end) {
        int sig = wait_event(s, DP_MIN(0.2, end - dp__now_s()));
        if (sig == SIGINT || sig == SIGTERM) {
            fprintf(stderr, "dataplane up: asked again: killing the units now\n");
            break;
        }
        /* SIGCHLD is not the only wake-up cause: reap on every pass. */
        for (dp__sup_unit *u; (u = reap(s)) != NULL;) {
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
        dp__sup_unit *u = &s->u[i];
        if (u->pid <= 0 || u->exited)
            continue;
        fprintf(stderr,
                "dataplane up: unit %u (pid %d) did not stop within %.0f s: killing it\n",
                u->id, (int)u->pid, grace_s);
        kill(u->pid, SIGKILL);
        clean = false;
    }
    for (uint32_t i = 0; i < s->n; i++) {
        dp__sup_unit *u = &s->u[i];
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

bool
dp__sup_wait_started(dp__sup *s, double end, double start_timeout_s)
{
    for (;;) {
        uint32_t up = 0;
        for (uint32_t i = 0; i < s->n; i++)
            up += s->u[i].started;
        if (up == s->n)
            return true;
        if (dp__now_s() >= end) {
            for (uint32_t i = 0; i < s->n; i++) {
                if (s->u[i].started)
                    continue;
                fprintf(stderr,
                        "dataplane up: unit %u (pid %d) did not report its address "
                        "within %.0f s\n",
                        i, (int)s->u[i].pid, start_timeout_s);
                print_tail(&s->u[i]);
            }
            return false;
        }
        int sig = wait_event(s, end - dp__now_s());
        if (sig == SIGINT || sig == SIGTERM || sig == SIGHUP) {
            fprintf(stderr, "dataplane up: %s while starting: stopping\n",
                    strsignal(sig));
            s->stopping = true;
            s->stop_signal = sig;
            return false;
        }
        reap(s);
        /* A unit being started that died failed to start; one that was running
         * (another death while this one starts) is left to dp__sup_watch. */
        for (uint32_t i = 0; i < s->n; i++) {
            dp__sup_unit *dead = &s->u[i];
            if (!dead->exited || dead->started)
                continue;
            char why[96];
            fprintf(stderr, "dataplane up: unit %u (pid %d) failed to start: it %s\n",
                    dead->id, (int)dead->pid,
                    describe_status(dead->status, why, sizeof why));
            print_tail(dead);
            return false;
        }
    }
}

void
dp__sup_start_forwarding(dp__sup *s)
{
    for (uint32_t i = 0; i < s->n; i++) {
        dp__sup_unit *u = &s->u[i];
        if (u->err_fd >= 0)
            drain(s, u, true);
        unsigned first =
            u->tail_n > DP__SUP_TAIL_LINES ? u->tail_n - DP__SUP_TAIL_LINES : 0;
        for (unsigned k = first; k < u->tail_n; k++)
            fprintf(stderr, "%s\n", u->tail[k % DP__SUP_TAIL_LINES]);
    }
    fflush(stderr);
    s->forward = true;
}

dp__sup_unit *
dp__sup_watch(dp__sup *s)
{
    for (;;) {
        /* Deaths seen while something else was going on come first. */
        for (uint32_t i = 0; i < s->n; i++) {
            dp__sup_unit *dead = &s->u[i];
            if (!dead->dead_pending)
                continue;
            dead->dead_pending = false;
            char why[96];
            fprintf(stderr, "dataplane up: unit %u (pid %d, %s) %s\n", dead->id,
                    (int)dead->pid, dead->addr,
                    describe_status(dead->status, why, sizeof why));
            return dead;
        }
        int sig = wait_event(s, -1);
        if (sig == SIGINT || sig == SIGTERM || sig == SIGHUP) {
            printf("%s: stopping %u unit%s...\n", strsignal(sig), s->n,
                   s->n == 1 ? "" : "s");
            fflush(stdout);
            s->stopping = true;
            s->stop_signal = sig;
            return NULL;
        }
        reap(s);
    }
}

void
dp__sup_reset(dp__sup_unit *u)
{
    if (u->out_fd >= 0)
        close(u->out_fd);
    if (u->err_fd >= 0)
        close(u->err_fd);
    u->out_fd = u->err_fd = -1;
    u->pid = 0;
    u->out_len = u->err_len = 0;
    u->tail_n = 0;
    u->started = u->exited = u->dead_pending = false;
    u->status = 0;
}
