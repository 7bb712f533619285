/*
 * Cluster checkpoints (DESIGN section 9, issue 7): save every unit's shard
 * into a directory and load them back into a cluster of the same shape. Built
 * directly on the control plane (src/ctl), the wire format (src/wire) and the
 * cluster file (client/cluster.h); independent of the client library's put
 * and get.
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
 * Threads: reentrant; one call at a time per dp_ctl_client is not required.
 */
#ifndef DP_CLIENT_CHECKPOINT_H
#define DP_CLIENT_CHECKPOINT_H

#include <stdint.h>

#include "client/cluster.h"
#include "common/common.h"
#include "ctl/ctl.h"

#define DP_CKPT_MANIFEST "MANIFEST.json"

typedef struct dp_ckpt_opts {
    double timeout_s; /* bound of each pass over the units (default 600) */
    /*
     * After a save: keep the new checkpoint and the keep - 1 newest older
     * ckpt-* directories, remove the older ones (0: remove nothing). A
     * directory newer than the new checkpoint (another save in progress) is
     * never touched.
     */
    uint32_t keep;
    /* Progress lines ("unit 3: saved 120 blobs, 1.2 GB"), or NULL. */
    void (*progress)(void *ctx, const char *line);
    void *progress_ctx;
} dp_ckpt_opts;

void dp_ckpt_opts_init(dp_ckpt_opts *o);

typedef struct dp_ckpt_summary {
    char checkpoint[64]; /* "ckpt-..." saved or loaded */
    uint32_t n_units;
    uint64_t blobs, bytes;
    uint64_t clears_during_save; /* save */
    uint64_t loaded, spilled;    /* load: blobs published, of which in a 2nd pass */
} dp_ckpt_summary;

/*
 * Save every unit of cl into dir (created if missing, one level). Complete
 * only when it returns DP_OK. Errors: DP_EINVAL (dir), errors of a unit
 * (the detail names the unit), DP_ESYS, DP_ENOMEM; the previous checkpoint
 * stays current on any error, except a failed fsync of DIR after the switch
 * itself (the detail then says MANIFEST.json is in place but may not be
 * durable).
 */
int dp_ckpt_save(dp_ctl_client *c, const dp_cluster *cl, const char *dir,
                 const dp_ckpt_opts *o, dp_ckpt_summary *sum, dp_detail *d);

/*
 * Load the current checkpoint of dir into cl: checks the manifest (version,
 * n_units equal to the cluster's: rows are placed by gidx % n_units, so
 * another shape is refused) and every file's size and CRC32C before any unit
 * is asked; then a RAM-only pass on every unit, then a pass with spill for the
 * blobs that did not fit. Errors: DP_ENOTFOUND (no checkpoint), DP_ECORRUPT
 * (a file failed validation: nothing was loaded anywhere), DP_EINVAL (another
 * cluster shape), DP_EUNITFULL (blobs fit nowhere: the others are loaded),
 * errors of a unit (its own validation publishes nothing on that unit).
 */
int dp_ckpt_load(dp_ctl_client *c, const dp_cluster *cl, const char *dir,
                 const dp_ckpt_opts *o, dp_ckpt_summary *sum, dp_detail *d);

/*
 * Check dir's current checkpoint as a load does first (manifest, every file's
 * size and CRC32C) and fill sum (checkpoint, n_units, blobs, bytes): what a
 * caller needs to choose between dp_ckpt_load and dp_ckpt_rehome.
 */
int dp_ckpt_peek(const char *dir, dp_ckpt_summary *sum, dp_detail *d);

typedef struct dp_client dp_client;

/*
 * Load dir's current checkpoint into the cluster c is connected to, whatever
 * its number of units: after the same file checks as dp_ckpt_load, each
 * shard's blobs are read here, each checked (CRC32C, index as a commit does),
 * and their live values put again through c, so rows land on gidx % the
 * cluster's units. Every byte moves through this client: slower than
 * dp_ckpt_load, for a change of cluster size. Errors: as dp_ckpt_peek before
 * anything is put; then a put's (the rows put before it stay, the detail says
 * how many keys); DP_ECORRUPT for a blob that fails its checks (nothing of it
 * is put). sum->loaded counts the blobs put.
 */
int dp_ckpt_rehome(dp_client *c, const char *dir, const dp_ckpt_opts *o,
                   dp_ckpt_summary *sum, dp_detail *d);

#endif
