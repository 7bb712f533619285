/*
 * Process identity and liveness from /proc (peerproc.h).
 */
#include "xfer/peerproc.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Read up to cap-1 bytes of path, NUL-terminated; the count or -1. */
static ssize_t
read_small(const char *path, char *buf, size_t cap)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t n;
    do
        n = read(fd, buf, cap - 1);
    while (n < 0 && errno == EINTR);
    close(fd);
    if (n < 0)
        return -1;
    buf[n] = '\0';
    return n;
}

static int
hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

static bool
boot_id(uint8_t out[16])
{
    char b[64];
    if (read_small("/proc/sys/kernel/random/boot_id", b, sizeof b) < 32)
        return false;
    int k = 0;
    for (const char *p = b; *p != '\0' && *p != '\n' && k < 32; p++) {
        if (*p == '-')
            continue;
        int v = hexval(*p);
        if (v < 0)
            return false;
        if (k % 2 == 0)
            out[k / 2] = (uint8_t)(v << 4);
        else
            out[k / 2] |= (uint8_t)v;
        k++;
    }
    return k == 32;
}

/*
 * The state letter and start time of pid from /proc/PID/stat: after the
 * command (which may hold spaces and parentheses: the last ')' ends it) come
 * the state (field 3) and, 19 fields on, the start time (field 22).
 */
static bool
stat_of(uint32_t pid, char *state, uint64_t *start)
{
    char path[64], b[1024];
    snprintf(path, sizeof path, "/proc/%u/stat", pid);
    if (read_small(path, b, sizeof b) <= 0)
        return false;
    char *p = strrchr(b, ')');
    if (p == NULL || p[1] != ' ' || p[2] == '\0')
        return false;
    p += 2; /* field 3 */
    *state = *p;
    for (int field = 3; field < 22; field++) { /* on to field 22 */
        p = strchr(p, ' ');
        if (p == NULL)
            return false;
        p++;
    }
    char *end;
    errno = 0;
    unsigned long long v = strtoull(p, &end, 10);
    if (errno != 0 || end == p)
        return false;
    *start = v;
    return true;
}

bool
dp__proc_self(dp__md_proc *out)
{
    memset(out, 0, sizeof *out);
    struct stat ns;
    char state;
    if (!boot_id(out->boot_id) || stat("/proc/self/ns/pid", &ns) != 0)
        return false;
    out->pidns = (uint64_t)ns.st_ino;
    out->pid = (uint32_t)getpid();
    return stat_of(out->pid, &state, &out->start);
}

bool
dp__proc_same_host(const dp__md_proc *self, const dp__md_proc *peer)
{
    return memcmp(self->boot_id, peer->boot_id, sizeof self->boot_id) == 0 &&
           self->pidns == peer->pidns && peer->pid != 0;
}

bool
dp__proc_exited(const dp__md_proc *peer)
{
    if (peer->pid == 0 || peer->pid > (uint32_t)INT32_MAX)
        return false;
    if (kill((pid_t)peer->pid, 0) != 0 && errno == ESRCH)
        return true;
    char state;
    uint64_t start;
    if (!stat_of(peer->pid, &state, &start))
        return false; /* hidden from this process (hidepid): say nothing */
    return state == 'Z' || state == 'X' || start != peer->start;
}
