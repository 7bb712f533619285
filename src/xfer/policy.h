/*
 * The RDMA-only transport policy (check_rdma_only): decide from the
 * UCX_TLS and UCX_NET_DEVICES settings whether UCX can move data only over
 * RDMA (plus same-host helpers), never over TCP.
 *
 * The rule:
 *   - UCX_TLS unset or empty is rejected: UCX would then pick its own
 *     transports and fall back to TCP whenever RDMA is unavailable.
 *   - An explicit list must name at least one RDMA transport (rc, dc, ud, ib
 *     families) and otherwise only same-host helpers (self, sm, shm, mm, posix,
 *     sysv, cma, knem, xpmem) or same-host GPU copy transports (cuda*, rocm*,
 *     gdr_copy). It must not name tcp (in any spelling: TCP, tcp:aux, \tcp) or
 *     all. Anything else is rejected by name.
 *   - An exclusion list (^a,b,...) is accepted only if it names tcp exactly as
 *     UCX matches it, so that UCX really cannot use tcp.
 *   - UCX_NET_DEVICES, if set, must name only RDMA ports of the form
 *     <dev>:<port> (mlx5_0:1). A netdev (eth0, lo, ib0), "all", and an empty
 *     value are rejected.
 * The reasons for each of these choices are in policy.c.
 *
 * What it checks is the environment UCX reads. UCX 1.13 also reads ucx.conf,
 * but environment values override the file, so a file cannot loosen a set of
 * values this check accepted; it can only make an unset UCX_TLS look set to
 * UCX, which this check rejects anyway. A caller that enforces the policy
 * should still pass the checked values to ucp_config_modify() so that the
 * endpoint uses exactly what was checked.
 *
 * Threads: any thread. With env == NULL the process environment is read with
 * getenv(), which must not race with setenv()/putenv() in another thread.
 */
#ifndef DP_XFER_POLICY_H
#define DP_XFER_POLICY_H

#include <stddef.h>

#include "dataplane/err.h"

/*
 * Check the RDMA-only policy against env, a NULL-terminated array of
 * "KEY=VALUE" strings like environ; env == NULL means the process environment.
 * Only UCX_TLS and UCX_NET_DEVICES are read; entries without '=' are skipped,
 * and when a key appears twice the first entry wins (as getenv() does).
 *
 * Returns DP_OK when UCX can only use RDMA and same-host helpers, DP_EPOLICY
 * otherwise (never anything else). In both cases desc (if desc != NULL and
 * desc_len > 0) receives one NUL-terminated line, truncated to desc_len: on
 * success a description such as
 *   "UCX_TLS=rc_x,sm,self: RDMA (rc_x) + same-host (sm, self);
 *    UCX_NET_DEVICES=mlx5_0:1"  (one line)
 * and on failure the reason, which quotes the offending item and says what to
 * set instead. On failure d (NULL allowed) gets the same reason with code
 * DP_EPOLICY; on success d is left untouched.
 *
 * Values are untrusted: any length and any bytes are accepted. Quoted items
 * are shortened and non-printable bytes shown as \xNN, so desc and d are
 * always printable ASCII without newlines.
 */
int dp__policy_check_rdma_only(const char *const *env, char *desc, size_t desc_len,
                               dp_detail *d);

/*
 * The same check on the two values directly; NULL means the variable is unset.
 * Used by dp__policy_check_rdma_only(), the fuzz target, and callers that hold
 * the values elsewhere (a config file, a command line).
 */
int dp__policy_check_rdma_only_values(const char *ucx_tls, const char *ucx_net_devices,
                                      char *desc, size_t desc_len, dp_detail *d);

#endif
