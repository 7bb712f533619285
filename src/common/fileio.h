/*
 * Full reads and writes of a file descriptor: one loop that retries EINTR and
 * short transfers, in system calls of at most 1 GiB, and names the file and
 * the offset when it fails. Every module that moves a file's bytes (the SSD
 * tier, checkpoints and shards, cluster files, the CLI's inputs and outputs)
 * uses these instead of a loop of its own.
 *
 * label names the file in messages ("shard /x/unit-0.shard", "stdin"). Errors:
 * DP_ESYS with errno kept, "reading LABEL at offset N" / "writing LABEL at
 * offset N" (a write that makes no progress is EIO), N the offset of the byte
 * that failed. Thread-safe as the system calls are: the positional calls never
 * move the file's position, so threads may share the descriptor.
 */
#ifndef DP_COMMON_FILEIO_H
#define DP_COMMON_FILEIO_H

#include <stddef.h>
#include <stdint.h>

#include "common/common.h"

/*
 * Read p[0, n) from file offset off (pread). With got NULL, a file that ends
 * first is DP_ECORRUPT "LABEL: truncated: ends at offset N"; with got, the
 * call stops there and returns 0 with *got < n (the caller words that case).
 */
int dp__pread_full(int fd, void *p, size_t n, uint64_t off, size_t *got,
                   const char *label, dp_detail *d);

/* Write p[0, n) at file offset off (pwrite). */
int dp__pwrite_full(int fd, const void *p, size_t n, uint64_t off, const char *label,
                    dp_detail *d);

/*
 * The same at the file's own position (read / write), for pipes, terminals
 * and descriptors the caller did not open. pos is only for messages: how far
 * into the stream this call starts (the bytes the caller moved before it).
 */
int dp__read_full(int fd, void *p, size_t n, uint64_t pos, size_t *got, const char *label,
                  dp_detail *d);
int dp__write_full(int fd, const void *p, size_t n, uint64_t pos, const char *label,
                   dp_detail *d);

#endif
