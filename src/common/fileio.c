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

/* One full transfer: which system call, on which file, from where. */
typedef struct io_call {
    int fd;
    const char *label; /* the file in messages */
    bool write_op;
    /* pos: at file offset off (pread / pwrite), else at the file's position
     * (off then only names offsets in messages). */
    bool pos;
    uint64_t off;
} io_call;

/*
 * Move n bytes between p and q's file: write or read, at its offset or
 * position. *got (reads only) gets what was read before the end of the file.
 */
static int
full_io(const io_call *q, void *p, size_t n, size_t *got, dp_detail *d)
{
    uint8_t *c = p;
    size_t done = 0;
    while (done < n) {
        size_t chunk = DP_MIN(n - done, CALL_MAX);
        ssize_t r;
        if (q->write_op)
            r = q->pos ? pwrite(q->fd, c + done, chunk, (off_t)(q->off + done))
                       : write(q->fd, c + done, chunk);
        else
            r = q->pos ? pread(q->fd, c + done, chunk, (off_t)(q->off + done))
                       : read(q->fd, c + done, chunk);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0 || (r == 0 && q->write_op))
            return dp__fail_sys(d, r < 0 ? errno : EIO, "%s %s at offset %" PRIu64,
                                q->write_op ? "writing" : "reading", q->label,
                                q->off + done);
        if (r == 0) {
            if (got != NULL)
                break;
            return dp__fail(d, DP_ECORRUPT, "%s: truncated: ends at offset %" PRIu64,
                            q->label, q->off + done);
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
    io_call q = {.fd = fd, .label = label, .off = off, .pos = true};
    return full_io(&q, p, n, got, d);
}

int
dp__pwrite_full(int fd, const void *p, size_t n, uint64_t off, const char *label,
                dp_detail *d)
{
    io_call q = {.fd = fd, .label = label, .off = off, .pos = true, .write_op = true};
    return full_io(&q, (void *)p, n, NULL, d);
}

int
dp__read_full(int fd, void *p, size_t n, uint64_t pos, size_t *got, const char *label,
              dp_detail *d)
{
    io_call q = {.fd = fd, .label = label, .off = pos};
    return full_io(&q, p, n, got, d);
}

int
dp__write_full(int fd, const void *p, size_t n, uint64_t pos, const char *label,
               dp_detail *d)
{
    io_call q = {.fd = fd, .label = label, .off = pos, .write_op = true};
    return full_io(&q, (void *)p, n, NULL, d);
}
