/*
 * The cluster file: the ordered list of a cluster's storage units, written by
 * `dataplane up` (or any launcher) and read by clients. Row gidx belongs to
 * units[gidx % n_units], so the order is part of the data's placement.
 *
 *   {"version": 1, "cluster": "up-6f1c...",
 *    "units": [{"id": 0, "zmq": "tcp://127.0.0.1:41234", "agent": "unit-0", "pid": 123,
 *               "incarnation": "9f3c0a5d11e2b7c4"},
 *              ...]}
 *
 * pid and incarnation (the unit process's random id, 16 hex digits: a JSON
 * number would lose bits) are optional: a file written by hand may leave
 * them out. A client binds to whatever incarnation answers; the file's only
 * tells a reader which process `up` started.
 *
 * Where it is: an explicit path (a file, or a directory holding cluster.json),
 * else $DP_CLUSTER (same forms), else the default directory
 * ($XDG_RUNTIME_DIR/dataplane, or /tmp/dataplane-<uid>) + "/cluster.json".
 * A cluster may instead be found in a registry (etcd://...: dp__reg_resolve in
 * registry/registry.h).
 *
 * Threads: every function is reentrant.
 */
#ifndef DP_CLUSTER_CLUSTER_H
#define DP_CLUSTER_CLUSTER_H

#include <limits.h>
#include <stdint.h>

#include "common/common.h"

#define DP_CLUSTER_FILE "cluster.json"
#define DP_CLUSTER_MAX_UNITS 4096
#define DP_CLUSTER_ADDR_MAX 128
#define DP_CLUSTER_REGISTRY_MAX 600 /* an etcd:// URL */

typedef struct dp__cluster_unit {
    uint32_t id;
    char zmq[DP_CLUSTER_ADDR_MAX];   /* "tcp://ip:port" */
    char agent[DP_CLUSTER_ADDR_MAX]; /* the unit's endpoint name */
    int64_t pid;                     /* 0 when unknown (another machine) */
    uint64_t incarnation;            /* 0 when unknown */
    char pubkey[41];                 /* its CURVE public key (Z85), "" when none */
} dp__cluster_unit;

typedef struct dp__cluster {
    uint32_t n_units;
    dp__cluster_unit *units; /* units[i].id == i */
    /*
     * The cluster's id ("cluster": optional, 1..64 bytes of [A-Za-z0-9_.:-];
     * "" when the file has none): every unit must report the same id, so a
     * file mixing units of two clusters is refused.
     */
    char cluster_id[65];
    /*
     * Copies of each row ("replicas": optional, 1..3; 0 when the file does not
     * say): every unit must report the same (docs/design.md, "Replicas").
     */
    uint32_t replicas;
    /*
     * Read from a registry (dp__reg_resolve of an etcd:// URL): its URL,
     * and the store's revision the records were read at; "" and 0 for a file.
     */
    char registry[DP_CLUSTER_REGISTRY_MAX];
    int64_t revision;
} dp__cluster;

/* The default directory into buf; returns buf. */
const char *dp__cluster_default_dir(char *buf, size_t len);

/*
 * Resolve where the cluster file is: arg (file or directory; NULL or "" for
 * none), else $DP_CLUSTER, else the default directory. The file need not exist.
 */
int dp__cluster_locate(const char *arg, char *path, size_t len, dp_detail *d);

/*
 * Read and validate a cluster file: version 1, 1..DP_CLUSTER_MAX_UNITS units
 * with ids 0..n-1 in order, zmq addresses "tcp://host:port", bounded strings.
 * Only a regular file of at most 4 MiB is read; nothing here blocks (a FIFO,
 * a device, a socket or a directory is refused without reading it).
 * Errors: DP_ENOTFOUND (no file: says how to start a cluster), DP_EINVAL (the
 * path names something other than a regular file: says what), DP_EPROTO (the
 * file is not a valid cluster file: says which field), DP_ESYS, DP_ENOMEM.
 */
int dp__cluster_load(const char *path, dp__cluster *out, dp_detail *d);

/* Write atomically: a temporary file in the same directory, fsync, rename. */
int dp__cluster_save(const char *path, const dp__cluster *c, dp_detail *d);

void dp__cluster_fini(dp__cluster *c);

#endif
