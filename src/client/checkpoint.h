/*
 * Cluster checkpoints, the internal side (the API is
 * include/dataplane/checkpoint.h): save every unit's shard into a directory
 * and load them back into a cluster of the same shape. Save and load are
 * built on the fanout over a cluster's units (client/fanout.h: one request
 * per unit, under one deadline), independent of the client library's put
 * and get; the public calls run them over a dp_client's units (the CLI's is
 * a control-only one). Re-homing reads the shards through blob/shard.h and
 * puts through a dp_client.
 *
 * Layout of a checkpoint directory DIR:
 *   DIR/ckpt-<time>-<8 hex>/unit-<i>.shard        one shard per unit
 *   DIR/ckpt-<time>-<8 hex>/unit-<i>.shard.rows   its live keys
 *   DIR/ckpt-<time>-<8 hex>/manifest.json         this checkpoint's manifest
 *   DIR/MANIFEST.json                             the current checkpoint
 * A save writes a fresh ckpt-* directory (every shard written by its unit
 * under a temporary name, fsync'd, renamed), fsyncs it, writes its manifest,
 * and only then replaces DIR/MANIFEST.json atomically (temporary name, fsync,
 * rename, fsync of DIR): a save that dies at any point leaves the previous
 * checkpoint the current one. Older ckpt-* directories are left in place
 * unless opts.keep asks to prune them. Names are ckpt-<UTC to the
 * microsecond>-<8 hex>: they sort in save order.
 *
 * Manifest (JSON): {"version": 1, "checkpoint": "ckpt-...", "n_units": N,
 *   "units": [{"unit": i, "shard": "unit-i.shard", "rows": "unit-i.shard.rows",
 *              "nbytes": n, "shard_crc32c": c, "rows_crc32c": c,
 *              "blobs": {"id": [off_in_file, nbytes, refs], ...}}, ...]}
 *
 * Paths: DIR is made absolute here and sent to the units, which open the
 * files on their own host; the client reads them too (CRC32C in the
 * manifest, checked before a load), so DIR must be the same path on the
 * client's and the units' hosts (one host, or a shared filesystem).
 *
 * Threads: reentrant; one call at a time per dp__ctl_client is not required.
 */
#ifndef DP_CLIENT_CHECKPOINT_H
#define DP_CLIENT_CHECKPOINT_H

#include <stdint.h>

#include "cluster/cluster.h"
#include "common/common.h"
#include "ctl/ctl.h"
#include "dataplane/checkpoint.h"

#define DP_CKPT_MANIFEST "MANIFEST.json"

/*
 * dp_ckpt_save over the units of cl (cl->units[i].zmq is unit i), asked
 * through c (one fanout over cl: client/fanout.h): what dp_ckpt_save runs
 * over a client's units. Contract and errors as dp_ckpt_save.
 */
int dp__ckpt_save_units(dp__ctl_client *c, const dp__cluster *cl, const char *dir,
                        const dp_ckpt_opts *o, dp_ckpt_summary *sum, dp_detail *d);

/* dp_ckpt_load over the units of cl, asked through c. As dp_ckpt_load. */
int dp__ckpt_load_units(dp__ctl_client *c, const dp__cluster *cl, const char *dir,
                        const dp_ckpt_opts *o, dp_ckpt_summary *sum, dp_detail *d);

#endif
