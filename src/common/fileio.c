/*
 * Full reads and writes (fileio.h): the one loop over read(2), write(2),
 * pread(2) and pwrite(2) that retries EINTR and short transfers.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "common/fileio.h"

#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <unistd.h>

/* Largest single system call: Linux moves at most about 2 GiB per call. */
#define CALL_MAX ((size_t)1 << 30)

/*
 * Move n bytes between p and fd: at file offset off (pos), or at the file's
 * position (!pos: off then only names offsets in messages); write or read.
 * *got (reads only) gets what was read before the end of the file.
 */
static int
full_io(int fd, void *p, size_t n, uint64_t off, bool pos, bool write_op, size_t *got,
        const char *label, dp_detail *d)
{
    uint8_t *c = p;
    size_t done = 0;
    while (done < n) {
        size_t chunk = DP_MIN(n - done, CALL_MAX);
        ssize_t r;
        if (write_op)
            r = pos ? pwrite(fd, c + done, chunk, (off_t)(off + done))
                    : write(fd, c + done, chunk);
        else
            r = pos ? pread(fd, c + done, chunk, (off_t)(off + done))
                    : read(fd, c + done, chunk);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0 || (r == 0 && write_op))
            return dp__fail_sys(d, r < 0 ? errno : EIO, "%s %s at offset %" PRIu64,
                                write_op ? "writing" : "reading", label, off + done);
        if (r == 0) {
            if (got != NULL)
                break;
            return dp__fail(d, DP_ECORRUPT, "%s: truncated: ends at offset %" PRIu64,
                            label, off + done);
        }
        done += (size_t)r;
    }
    if (got != NULL)
        *got = done;
    return DP_OK;
}

int
dp__pread_full(int fd, void *p, size_t n, uint64_t off, size_t *got, const char *label,
               dp_detail *d)
{
    return full_io(fd, p, n, off, true, false, got, label, d);
}

int
dp__pwrite_full(int fd, const void *p, size_t n, uint64_t off, const char *label,
                dp_detail *d)
{
    return full_io(fd, (void *)p, n, off, true, true, NULL, label, d);
}

int
dp__read_full(int fd, void *p, size_t n, uint64_t pos, size_t *got, const char *label,
              dp_detail *d)
{
    return full_io(fd, p, n, pos, false, false, got, label, d);
}

int
dp__write_full(int fd, const void *p, size_t n, uint64_t pos, const char *label,
               dp_detail *d)
{
    return full_io(fd, (void *)p, n, pos, false, true, NULL, label, d);
}
