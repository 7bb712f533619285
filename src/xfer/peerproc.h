/*
 * Who a peer process is, and whether it still runs: the identity an endpoint
 * puts in its metadata (metadata.h, DP_MD_F_PROC) and the check a waiting
 * transfer makes on a peer of the same host.
 *
 * Why: UCX 1.13 does not notice a same-host peer that dies while an
 * endpoint to it is still being wired up, nor one whose process is a zombie
 * (killed, not yet reaped): a transfer to it hangs until its deadline (60 s
 * by default for the direct transport) although the kernel knows at once.
 * docs/design.md, "Endpoint and graveyard".
 *
 * Same host means the same boot (the kernel's boot id) and the same PID
 * namespace: only then does the peer's pid name a process here. A peer
 * elsewhere is left to UCX's keepalive.
 *
 * Threads: every function is reentrant.
 */
#ifndef DP_XFER_PEERPROC_H
#define DP_XFER_PEERPROC_H

#include <stdbool.h>
#include <stdint.h>

typedef struct dp__md_proc {
    uint8_t boot_id[16]; /* /proc/sys/kernel/random/boot_id */
    uint64_t pidns;      /* inode of /proc/self/ns/pid */
    uint64_t start;      /* start time, clock ticks after boot (/proc/PID/stat) */
    uint32_t pid;
} dp__md_proc;

/* This process's identity; false where /proc does not tell it. */
bool dp__proc_self(dp__md_proc *out);

/* Whether peer's pid names a process on the host of self (same boot, same
 * PID namespace). */
bool dp__proc_same_host(const dp__md_proc *self, const dp__md_proc *peer);

/*
 * Whether the same-host process peer describes has ended: no such pid, a
 * zombie, or the pid reused by a process that started at another time. A
 * process this one may not signal (another user) counts as running. Costs a
 * kill(2) and a read of /proc/PID/stat.
 */
bool dp__proc_exited(const dp__md_proc *peer);

#endif
