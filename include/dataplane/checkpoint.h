/*
 * Checkpoints of a cluster, over a connected dp_client: save every unit's
 * data into a directory, load it back into a cluster of the same number of
 * units, or re-home it into a cluster of another size.
 *
 * A checkpoint directory DIR holds checkpoints (DIR/ckpt-<time>-<id>/, one
 * shard per unit, written by the unit itself) and DIR/MANIFEST.json, which
 * names the current one. A save writes a fresh ckpt-* directory and switches
 * MANIFEST.json to it atomically only once every shard is on disk: a save
 * that fails or dies at any point leaves the previous checkpoint current.
 * Puts, gets and clears may run during a save (on this client or any other).
 *
 * Paths: DIR is made absolute here and sent to the units, which open the
 * files on their own host; this process reads them too (CRC32C checks before
 * a load, every byte of a re-homing), so DIR must be the same path on the
 * client's and the units' hosts (one host, or a shared filesystem).
 *
 * Errors: 0 or a dp_err (dataplane/err.h), with the optional dp_detail
 * naming the unit, the file and the offset concerned.
 *
 * Threads: every function may be called from any thread, also while other
 * threads use the same client (a save or load talks to the units over
 * connections of its own; a re-homing puts through the client, one put at a
 * time under its lock). None may race with dp_client_close of that client.
 */
#ifndef DATAPLANE_CHECKPOINT_H
#define DATAPLANE_CHECKPOINT_H

#include <stdint.h>

#include "dataplane/client.h"
#include "dataplane/err.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Longest checkpoint name ("ckpt-...") plus its NUL. */
#define DP_CKPT_NAME_MAX 64

/*
 * Options. A zeroed struct (or dp_ckpt_opts_init) is valid and means the
 * defaults. reserved must be zero: it is where fields added later go; a call
 * refuses a non-zero reserved word (DP_EINVAL).
 */
typedef struct dp_ckpt_opts {
    /* Bound of each pass over the units, seconds. 0: the default, 600. */
    double timeout_s;
    /*
     * After a save: keep the new checkpoint and the keep - 1 newest older
     * ckpt-* directories, remove the older ones. 0 (the default): remove
     * nothing. A directory newer than the new checkpoint (another save in
     * progress) is never touched.
     */
    uint32_t keep;
    /*
     * Progress lines ("unit 3: 120 blobs, ..."), called on the calling
     * thread; NULL (the default): none. ctx is passed back as given.
     */
    void (*progress)(void *ctx, const char *line);
    void *progress_ctx;
    uint64_t reserved[8];
} dp_ckpt_opts;

/* Fill o with the defaults (the same as zeroing it). Threads: any. */
DP_API void dp_ckpt_opts_init(dp_ckpt_opts *o);

/*
 * What a call did. Filled (zeroed first) by every call; the struct grows into
 * its reserved tail (zeros today), fields keep their places.
 */
typedef struct dp_ckpt_summary {
    char checkpoint[DP_CKPT_NAME_MAX]; /* "ckpt-..." saved or loaded */
    uint32_t n_units;                  /* units of the checkpoint */
    uint64_t blobs, bytes;             /* blobs and shard bytes of the checkpoint */
    uint64_t clears_during_save;       /* save: clears that ran while it did */
    uint64_t loaded;                   /* load, re-home: blobs published / put */
    uint64_t spilled;                  /* load: of which to the SSD tier */
    uint32_t replicas; /* copies of each row the saved cluster kept (1..3) */
    uint32_t copies;   /* copies of each row the files hold: 1 (each row saved
                        * once, by its first unit: loads into any replicas) or,
                        * in checkpoints made before that, replicas (a load
                        * then needs the same; dp_ckpt_rehome takes any) */
    uint64_t reserved[7];
} dp_ckpt_summary;

/*
 * Save every unit of the cluster c is connected to into a new checkpoint in
 * dir (created if missing, one level); it becomes dir's current checkpoint
 * only when this returns DP_OK. Errors: DP_EINVAL (dir, options), a unit's
 * error (d names the unit), DP_ESYS, DP_ENOMEM. On any error the previous
 * checkpoint stays current, except a failed fsync of dir after the switch
 * itself (d then says MANIFEST.json is in place but may not be durable).
 */
DP_API int dp_ckpt_save(dp_client *c, const char *dir, const dp_ckpt_opts *o,
                        dp_ckpt_summary *sum, dp_detail *d);

/*
 * Check dir's current checkpoint as a load does first (manifest, every file's
 * size and CRC32C) and fill sum (checkpoint, n_units, blobs, bytes): what a
 * caller needs to choose between dp_ckpt_load (sum->n_units equal to the
 * cluster's) and dp_ckpt_rehome. Errors: DP_ENOTFOUND (no checkpoint),
 * DP_ECORRUPT (a file failed a check: d names it), DP_ESYS, DP_ENOMEM.
 */
DP_API int dp_ckpt_peek(const char *dir, dp_ckpt_summary *sum, dp_detail *d);

/*
 * Load dir's current checkpoint into the cluster c is connected to, which
 * must have the checkpoint's number of units (rows are placed by gidx %
 * n_units): every file is checked (as dp_ckpt_peek) before any unit is
 * asked; then each unit loads its own shard, RAM first on every unit, then
 * the SSD tier for the blobs that did not fit. Errors: DP_ENOTFOUND (no
 * checkpoint), DP_ECORRUPT (a file failed a check: nothing was loaded
 * anywhere), DP_EINVAL (another number of units: use dp_ckpt_rehome),
 * DP_EUNITFULL (blobs fit nowhere: the others are loaded), a unit's error
 * (its own checks publish nothing from a file that fails).
 */
DP_API int dp_ckpt_load(dp_client *c, const char *dir, const dp_ckpt_opts *o,
                        dp_ckpt_summary *sum, dp_detail *d);

/*
 * Load dir's current checkpoint into the cluster c is connected to, whatever
 * its number of units: after the checks of dp_ckpt_peek, each shard's blobs
 * are read here, each checked (CRC32C, index as a commit does), and their
 * live values put again through c, so rows land on gidx % the cluster's
 * units. Every byte moves through this client: slower than dp_ckpt_load, for
 * a change of cluster size. Errors: as dp_ckpt_peek before anything is put;
 * then a put's (the rows put before it stay, d says how many keys);
 * DP_ECORRUPT for a blob that fails its checks (nothing of it is put).
 * sum->loaded counts the blobs put.
 */
DP_API int dp_ckpt_rehome(dp_client *c, const char *dir, const dp_ckpt_opts *o,
                          dp_ckpt_summary *sum, dp_detail *d);

#ifdef __cplusplus
}
#endif
#endif
