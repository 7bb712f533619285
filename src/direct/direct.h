/*
 * Internal hooks of the direct transport for tests and benchmarks (the API
 * is include/dataplane/direct.h).
 */
#ifndef DP_DIRECT_DIRECT_H
#define DP_DIRECT_DIRECT_H

#include <stdbool.h>
#include <stddef.h>

#include "dataplane/direct.h"

/*
 * Sleep this long before each chunk a worker reads (0: never). Lets tests
 * catch a fetch in the middle. Threads: any.
 */
void dp__direct_set_chunk_pause(dp_direct *t, double seconds);

/*
 * Look for AWS EFA devices under sysfs root (normally "/sys"): netdevs named
 * efa*, verbs devices named efa* or bound to the kernel efa driver. Writes the
 * first one found to what (NUL-terminated, may be cut) and returns true.
 */
bool dp__direct_find_efa(const char *root, char *what, size_t cap);

/* The sysfs root create() scans (default "/sys"); NULL restores it. Not thread-safe. */
void dp__direct_set_sysfs_root(const char *root);

/*
 * What UCX uses towards a connected remote (dp__endpoint_describe_remote):
 * *out malloc'd, caller frees. DP_ENOTFOUND if not connected. Threads: any.
 */
int dp__direct_describe_remote(dp_direct *t, const char *name, char **out, dp_detail *d);

#endif
