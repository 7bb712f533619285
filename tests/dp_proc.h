/*
 * Helpers the test programs share for child processes: whole reads and
 * writes on pipes, a line with a deadline, a child's exit status, this
 * program re-executed as a helper (a peer, a unit, a doomed client), shell
 * commands with their output, and the dataplane binary built next to the
 * tests. Include after dp_test.h (CHECK).
 */
#ifndef DP_PROC_H
#define DP_PROC_H

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <netinet/in.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

/* Write or read exactly n bytes; 0, or -1 on an error or end of file. */
static inline int
dp_test_write_all(int fd, const void *p, size_t n)
{
    const uint8_t *c = p;
    while (n > 0) {
        ssize_t k = write(fd, c, n);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return -1;
        c += k;
        n -= (size_t)k;
    }
    return 0;
}

static inline int
dp_test_read_all(int fd, void *p, size_t n)
{
    uint8_t *c = p;
    while (n > 0) {
        ssize_t k = read(fd, c, n);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return -1;
        c += k;
        n -= (size_t)k;
    }
    return 0;
}

/* In a child: write string s whole, or exit 3 (the parent sees it died). */
static inline void
dp_test_write_str(int fd, const char *s)
{
    if (dp_test_write_all(fd, s, strlen(s)) != 0)
        _exit(3);
}

/*
 * Read one line from fd into buf (without its newline): up to a newline, end
 * of file, cap - 1 bytes or timeout_s. Returns the bytes read (0: nothing).
 */
static inline size_t
dp_test_read_line(int fd, char *buf, size_t cap, double timeout_s)
{
    size_t n = 0;
    double end = dp_test_now() + timeout_s;
    while (n + 1 < cap) {
        int left_ms = (int)((end - dp_test_now()) * 1000);
        if (left_ms <= 0)
            break;
        struct pollfd p = {fd, POLLIN, 0};
        int r = poll(&p, 1, left_ms);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        ssize_t k = read(fd, buf + n, 1);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0 || buf[n] == '\n')
            break;
        n++;
    }
    buf[n] = '\0';
    return n;
}

/* Wait for child pid: its exit code, or -signal if a signal ended it. */
static inline int
dp_test_wait_status(pid_t pid)
{
    int st = 0;
    CHECK(waitpid(pid, &st, 0) == pid);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -WTERMSIG(st);
}

/* Send sig to child pid and wait for it: dp_test_wait_status. */
static inline int
dp_test_kill_wait(pid_t pid, int sig)
{
    kill(pid, sig);
    return dp_test_wait_status(pid);
}

/*
 * Start this program again as a helper: fork; in the child die with the test
 * (PR_SET_PDEATHSIG: a failed check that skips the cleanup leaves no helper
 * behind), keep fd open across exec (-1: none; make the caller's other pipe
 * ends O_CLOEXEC), put env (NAME, VALUE pairs, NULL-terminated) into its
 * environment and exec /proc/self/exe. The program's role constructor reads
 * those variables and turns the process into the helper before main runs: a
 * fresh process, without the test's UCX, ZMQ or thread state. Returns its pid.
 */
static inline pid_t
dp_test_spawn_self(const char *const *env, int fd)
{
    fflush(NULL);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (fd >= 0)
            fcntl(fd, F_SETFD, 0);
        for (size_t i = 0; env != NULL && env[i] != NULL; i += 2)
            setenv(env[i], env[i + 1], 1);
        char *argv[] = {program_invocation_short_name, NULL};
        execv("/proc/self/exe", argv);
        _exit(127);
    }
    return pid;
}

/*
 * Run cmd with /bin/sh (add 2>&1 for its stderr), its output into out (cap
 * bytes with the terminating zero; the rest is read and dropped). Returns its
 * exit status; a command killed by a signal fails the test.
 */
static inline int
dp_test_run_sh(const char *cmd, char *out, size_t cap)
{
    FILE *p = popen(cmd, "r");
    CHECKF(p != NULL, "popen %s: %s", cmd, strerror(errno));
    size_t n = fread(out, 1, cap - 1, p);
    out[n] = '\0';
    char drop[4096];
    while (fread(drop, 1, sizeof drop, p) > 0)
        ;
    int st = pclose(p);
    CHECKF(WIFEXITED(st), "`%s` did not exit (status 0x%x)", cmd, st);
    return WEXITSTATUS(st);
}

/*
 * A TCP socket listening on 127.0.0.1 that never accepts: connections are
 * made (the kernel's backlog) and then nothing answers. *port gets its port;
 * returns the socket (close it to stop).
 */
static inline int
dp_test_silent_port(uint16_t *port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    CHECK(fd >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    CHECK(bind(fd, (struct sockaddr *)&a, sizeof a) == 0);
    socklen_t len = sizeof a;
    CHECK(getsockname(fd, (struct sockaddr *)&a, &len) == 0);
    CHECK(listen(fd, 64) == 0);
    *port = ntohs(a.sin_port);
    return fd;
}

/* The dataplane binary next to the test programs (build/dataplane), or NULL. */
static inline const char *
dp_test_cli_path(void)
{
    static char path[4096];
    char self[4000];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0)
        return NULL;
    self[n] = '\0';
    char *slash = strrchr(self, '/');
    if (slash == NULL)
        return NULL;
    *slash = '\0';
    snprintf(path, sizeof path, "%s/../dataplane", self);
    return access(path, X_OK) == 0 ? path : NULL;
}

/* Start args[0] with args, its stdout into a pipe; *rfd reads it. */
static inline pid_t
dp_test_cli_spawn(const char *const *args, int *rfd)
{
    int fds[2];
    CHECK(pipe(fds) == 0);
    fflush(NULL);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlive a failed test */
        dup2(fds[1], 1);
        close(fds[0]);
        close(fds[1]);
        execv(args[0], (char *const *)args);
        _exit(127);
    }
    close(fds[1]);
    *rfd = fds[0];
    return pid;
}

/*
 * Its first stdout line into line (at most cap - 1 bytes); with drain, the
 * rest is read and dropped, so a long text (--help) never meets a closed pipe.
 */
static inline void
dp_test_cli_read_line(int fd, char *line, size_t cap, bool drain)
{
    size_t n = 0;
    char c;
    while (n + 1 < cap && read(fd, &c, 1) == 1 && c != '\n')
        line[n++] = c;
    line[n] = '\0';
    while (drain && read(fd, &c, 1) == 1) {
    }
    close(fd);
}

/* Start args[0] with args; its first stdout line into line. */
static inline pid_t
dp_test_cli_start(const char *const *args, char *line, size_t cap)
{
    int fd;
    pid_t pid = dp_test_cli_spawn(args, &fd);
    dp_test_cli_read_line(fd, line, cap, false);
    return pid;
}

/* dp_test_cli_start for a command that ends by itself (--help): the rest of
 * its stdout is read and dropped, so a long text never meets a closed pipe. */
static inline pid_t
dp_test_cli_first_line(const char *const *args, char *line, size_t cap)
{
    int fd;
    pid_t pid = dp_test_cli_spawn(args, &fd);
    dp_test_cli_read_line(fd, line, cap, true);
    return pid;
}

#endif
