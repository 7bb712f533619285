/*
 * Internals of the client's put shared by its two files (not installed):
 * put.c, the put's driver and its network phases (alloc, inline, WRITE,
 * commit), and put_build.c, building the blobs (sizing, indexes, staging,
 * location hints). put.c's opening comment holds the put's design.
 */
#ifndef DP_CLIENT_PUT_INT_H
#define DP_CLIENT_PUT_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "client/client_int.h"

/* ST_AGAIN: refused as stale (a key held at a higher version): its rows are
 * put again above that version (docs/design.md, "Versions"). */
enum {
    ST_NONE = 0,
    ST_ALLOC,
    ST_INLINE,
    ST_WRITE,
    ST_COMMIT,
    ST_DONE,
    ST_FAILED,
    ST_AGAIN
};

/* How many times a put's rows are put again after a "Stale" refusal. */
#define DP__PUT_STALE_TRIES 8

/* An entry's key, for its location hint: its CRC32C and hash (dp__hash64). */
typedef struct put_key {
    uint64_t hash;
    uint32_t crc;
} put_key;

typedef struct put_unit {
    dp__step st; /* its unit, its phase (ST_*), and why it failed */
    uint32_t n_rows;
    uint32_t ent0; /* first entry of this unit in the per-call entry arrays */
    uint32_t n_ent;
    bool any_direct;
    uint64_t copy_max; /* payloads up to this size are copied into the unit's
                        * mapped slab from wherever they lie (payload_direct) */
    bool inl;          /* small: the blob goes inside a put request (ST_INLINE) */
    bool size_bug;     /* built to another size than sized: fails after its alloc */
    uint64_t size;     /* the blob's size, known before its index is built */
    bool unsized;      /* its unit was not bound yet: size checked once it is */
    bool poll;         /* its inline put answered "pending": commit polls it */
    bool gone;         /* failed, and its unit's process is gone (replicas: skipped) */
    bool fenced;       /* failed unanswered, and most units fenced it ("Leases") */
    uint64_t ver;      /* the put's version, named by its commit or inline put */
    uint64_t *vers;    /* a repair's copy: its entries' versions (n_ent), or NULL */
    uint64_t stale;    /* refused as stale: the version the unit holds */
    dp__blob_layout lay;
    size_t stage_off, stage_len;
    char blob_id[40];
    uint64_t off;   /* slab offset from alloc */
    uint64_t token; /* the allocation's token, stamped into the blob header */
    uint8_t grant[8 + DP_ID_MAX]; /* token + blob id: a two-sided WRITE's grant */
    uint32_t grant_len;
    size_t r0, nr; /* its ranges in the per-call range arrays */
} put_unit;

/*
 * One put: the call's arguments, its deadline and staging area, and the
 * per-call arrays every phase works on (one put_unit per unit with something
 * to put; the phases drive them from state to state).
 */
typedef struct put_op {
    dp_client *c;
    const uint64_t *gidxs;
    size_t n_rows;
    const char *const *fields;
    size_t n_fields;
    const dp_value *values;
    double deadline;
    uint32_t copies; /* of each row (the cluster's replicas): g has each row that often */
    uint8_t *stage;  /* the staging buffer's bytes, once taken */
    dp__groups g;    /* the rows grouped by unit, every copy */
    put_unit *pus;   /* one per unit with something to put (npu) */
    size_t npu;
    const dp_value **ent_val;  /* every entry's value, unit by unit */
    put_key *ent_key;          /* their keys' CRC32C and hash (location hints), or NULL */
    dp__range *local, *remote; /* the WRITEs' ranges */
    uint32_t *slot_pu;         /* slot -> index in pus, for the phase that runs */
    dp__xfer_desc *ops;
    dp__xfer_result *results; /* the WRITEs' */
    bool *sent;               /* slot's commit was sent (write_done) */
    size_t *flen;             /* field name lengths */
    /* Per field: the unit whose blob the sizer last counted it for, and its
     * number in the blob being built (UINT32_MAX: not declared yet). A
     * unit's blob names only the fields its entries use. */
    uint32_t *fseen, *fnum;
    /*
     * With replicas: the rows whose copy met a flap or a restart, to be put
     * again (n_again of them; put_outcome_copies_locked). Kept past the op.
     */
    bool *again;
    size_t n_again;
    /*
     * Versions (docs/design.md, "Versions"): this put's (0 for a repair's
     * copy: its keys keep none), and one it must be above (a unit's answer
     * to an earlier try). round: 0 for the call's first try; a flap or a
     * restart puts rows again only after it, a "Stale" refusal up to
     * DP__PUT_STALE_TRIES times.
     */
    uint64_t ver, ver_above;
    uint32_t round;
    /* A repair's copy: each cell's version where it was copied from (n_rows x
     * n_fields, or NULL), and each entry's, unit by unit as ent_val. */
    const uint64_t *cell_ver;
    uint64_t *ent_ver;
} put_op;

/* ---- put_build.c: building the blobs ---- */

/*
 * One part per unit with something to put, sized before any index is built
 * (dp__blob_sizer), so that the allocs can leave first and the indexes be
 * built while they travel: entries, blob size, the checks against a bound
 * unit's areas (dp__put_fits_locked checks an unbound one's once it is bound),
 * the blob id, and whether it goes inline. The parts go
 * into a->pus (a->npu).
 */
int dp__put_size_locked(put_op *p, dp_detail *d);

/*
 * Build every part's index (while its alloc travels) and its staging needs;
 * *stage_total is the staging they all need. A part whose built size is not
 * the one its alloc asked for (a bug) fails and is aborted with the others'
 * answers.
 */
int dp__put_build_locked(put_op *p, size_t *stage_total, dp_detail *d);

/*
 * Staging: the header and index of every blob, and the payloads to copy;
 * the local ranges of each WRITE (a payload written from registered memory
 * is a range of its own, its offset in the blob kept in remote[].nbytes
 * until the alloc answers).
 */
int dp__put_stage_locked(put_op *p, dp_detail *d);

/*
 * The size check of the parts whose unit dp__put_size_locked found unbound (down
 * when the client opened), once put_ready_locked bound it. A refusal sends
 * nothing; a restart put_ready_locked found stays to be reported.
 */
int dp__put_fits_locked(const put_op *p, dp_detail *d);

/* Remote ranges now that the offsets are known; each header names its allocation. */
void dp__put_remote_ranges_locked(put_op *p);

/* Every landed value's hint into locs (cells in the order of values). */
void dp__put_locs_locked(const put_op *p, dp_loc *locs);

/* ---- put.c ---- */

/* The put of ap's call arguments (its other fields zero, but for a put
 * again's deadline, round and ver_above): every phase, in order. ap gets the rows to
 * put again (ap->again, ap->n_again: the caller frees again). */
int dp__put_impl(put_op *ap, int *row_status, dp_loc *locs, dp_detail *d);

/* Which rows landed (row_status) and the report of the failed units. */
int dp__put_outcome_locked(const put_op *p, int *row_status, dp_detail *d);

/* ---- put_copies.c: replicas ---- */

/*
 * Parts refused as stale (DP__ESTALE) go to ST_AGAIN while tries and budget
 * are left, raising a->ver_above to the version they lost to; the others
 * fail with DP_EBUSY. Without replicas their rows go to a->again here (with
 * replicas dp__put_decide_copies_locked takes them).
 */
void dp__put_stale_locked(put_op *a);

/*
 * With replicas: which rows landed (row_status, when given) and the report;
 * a->again holds the rows to put once more. Out of memory, as without
 * replicas (any failed copy fails its row).
 */
int dp__put_decide_copies_locked(put_op *a, int *row_status, dp_detail *d);

/*
 * The rows in a->again put once more, every copy, in what is left of the
 * call's budget; their statuses, hints and report replace the first try's
 * (rc: the first try's code). Returns the call's code.
 */
int dp__put_again(put_op *a, int rc, int *row_status, dp_loc *locs, dp_detail *d);

#endif
