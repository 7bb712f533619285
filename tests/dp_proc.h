/*
 * Helpers the test programs share for child processes: whole reads and
 * writes on pipes, a child's exit status, and the dataplane binary built next
 * to the tests. Include after dp_test.h (CHECK).
 */
#ifndef DP_PROC_H
#define DP_PROC_H

#include <errno.h>
#include <signal.h>
#include <sys/prctl.h>
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

/* Wait for child pid: its exit code, or -signal if a signal ended it. */
static inline int
dp_test_wait_status(pid_t pid)
{
    int st = 0;
    CHECK(waitpid(pid, &st, 0) == pid);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -WTERMSIG(st);
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

/* Start args[0] with args; its first stdout line into line. */
static inline pid_t
dp_test_cli_start(const char *const *args, char *line, size_t cap)
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
    size_t n = 0;
    while (n + 1 < cap) {
        ssize_t r = read(fds[0], line + n, 1);
        if (r <= 0 || line[n] == '\n')
            break;
        n++;
    }
    line[n] = '\0';
    close(fds[0]);
    return pid;
}

#endif
