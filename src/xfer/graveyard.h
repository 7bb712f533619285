/*
 * The graveyard: every transfer in this process that failed short of DONE.
 *
 * A transfer that timed out or whose peer failed may still be running inside
 * UCX: it may still read from or write into its local ranges. Releasing its
 * request or reusing/unmapping that memory would be a use-after-free, so the
 * transfer's bookkeeping object (owned by the endpoint until then) and its
 * local ranges are handed here and kept until the endpoint learns that UCX
 * completed every request of it after all (dp__graveyard_release: UCX then
 * touches its local memory no more), which may be never. Callers ask
 * dp__graveyard_touches() before reusing memory.
 *
 * Past max_bytes of retained memory (the local ranges of retained transfers,
 * plus every buffer retired whole through dp__graveyard_retain_buffer) the
 * process is poisoned: every later transfer fails with DP_EFATAL before it
 * touches UCX. Poisoning is sticky.
 *
 * There is one graveyard per process. max_bytes defaults to 4 GiB, or
 * DP_GRAVEYARD_MAX_BYTES from the environment (a size such as "512M"), or
 * whatever dp__graveyard_set_max_bytes set last.
 *
 * Threads: every function may be called from any thread; one internal mutex
 * guards the state, and no function calls out while holding it.
 */
#ifndef DP_XFER_GRAVEYARD_H
#define DP_XFER_GRAVEYARD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/common.h"

/* A byte range [addr, addr + nbytes) in this process or in a remote one. */
typedef struct dp__range {
    uint64_t addr;
    uint64_t nbytes;
} dp__range;

#define DP_GRAVEYARD_DEFAULT_MAX_BYTES (4ull << 30)

/*
 * Keep a transfer that may still run, forever. owner is its bookkeeping object
 * (never freed again; NULL allowed); local/n are its local ranges, which are
 * charged and reported by dp__graveyard_touches from now on. what names the
 * transfer in logs. Never fails: when the graveyard cannot grow its tables it
 * poisons the process instead (it can no longer vouch for memory).
 */
void dp__graveyard_retain(void *owner, const dp__range *local, size_t n,
                          const char *what);

/*
 * The transfer retained under owner ended: UCX completed every request of it,
 * so its local ranges are touched no more; they stop counting (and
 * dp__graveyard_touches forgets them, unless another retained transfer still
 * names them). Returns false if owner was not retained. A poisoned process
 * stays poisoned.
 */
bool dp__graveyard_release(void *owner);

/* A buffer charged by dp__graveyard_retain_buffer is touched no more: uncharge it. */
void dp__graveyard_release_buffer(uint64_t nbytes);

/* Transfers released so far (dp__graveyard_release). */
size_t dp__graveyard_released(void);

/*
 * Charge a buffer retired whole (never reused, never freed) because a failed
 * transfer touches it. Its transferred ranges were already charged by
 * dp__graveyard_retain, so they count twice: the limit errs on the side of
 * poisoning.
 */
void dp__graveyard_retain_buffer(uint64_t nbytes);

/* DP_EFATAL with the numbers in d when the process is poisoned, else DP_OK. */
int dp__graveyard_check(dp_detail *d);

/* True if [addr, addr + nbytes) overlaps a local range of a retained transfer. */
bool dp__graveyard_touches(uint64_t addr, uint64_t nbytes);

/* Set the limit; poisons at once if the retained bytes are already above it. */
void dp__graveyard_set_max_bytes(uint64_t max_bytes);
uint64_t dp__graveyard_max_bytes(void);

/* Counters: retained bytes, retained transfers, poisoned or not. */
uint64_t dp__graveyard_bytes(void);
size_t dp__graveyard_entries(void);
bool dp__graveyard_poisoned(void);

#endif
