/*
 * Internals of the client library shared by its files (client.c says which
 * holds what). Not installed. Requests to units go through the client's
 * fanout (client/fanout.h).
 */
#ifndef DP_CLIENT_CLIENT_INT_H
#define DP_CLIENT_CLIENT_INT_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "blob/blob.h"
#include "cluster/cluster.h"
#include "client/fanout.h"
#include "common/common.h"
#include "common/hash64.h"
#include "common/ranges.h"
#include "ctl/ctl.h"
#include "dataplane/client.h"
#include "registry/registry.h"
#include "wire/wire.h"
#include "xfer/endpoint.h"

/*
 * A unit as the client sees it. The address is constant after open (but for
 * a client following a registry, where a unit that moved gets its new one:
 * dp__client_follow_locked); the rest
 * is the data path's binding to one incarnation of the unit (one process),
 * replaced when the client re-binds (docs/design.md, "Unit incarnations").
 */
typedef struct dp__unit_conn {
    char addr[DP_CLUSTER_ADDR_MAX]; /* control address */
    char remote[256];               /* its endpoint name (for transfers) */
    uint64_t slab_addr;             /* remote address of slab offset 0 */
    uint64_t slab_bytes;            /* the put area */
    uint64_t io_bytes;     /* the IO area (SSD tier), after the put area; 0 if none */
    uint64_t region_bytes; /* slab_bytes + io_bytes: every offset lies below it */
    double read_pin_s;     /* how long a resolve pins */
    uint64_t incarnation;  /* the process the data path is bound to */
    /*
     * How this client's transfers reach it (its lane, its transports, and
     * whether puts and gets go two-sided: docs/design.md, "Two-sided
     * transfers"), as names for reports and for the unit's bookkeeping.
     */
    dp__xfer_route route;
    /*
     * A reply came from another incarnation (seen_incarnation): re-bind before
     * the next transfer. restart_unreported: no put or get was told of that
     * restart yet (it was seen by clear or stats): the next one is.
     */
    bool stale;
    bool restart_unreported;
    uint64_t seen_incarnation;
    /*
     * ep_suspect: a transfer to it stalled while its control plane answered
     * (a stalled connection, not a dead unit): re-create the endpoint before
     * the next transfer. aborts: the aborts sent to it since it last answered
     * (the newest 16). A notify gets no reply, and one queued on a connection
     * that then drops is lost; so each is sent once more when the unit next
     * answers (aborts are idempotent: blob ids are never reused), and a lost
     * one does not leave its region to the lease.
     */
    bool ep_suspect;
    uint32_t n_aborts;
    struct {
        char id[40];
        bool in_flight;
    } aborts[16];
} dp__unit_conn;

/*
 * A control-only client's record of asking a unit who it is
 * (dp__client_check_units): its state (DP__UNIT_*), why it is down (rc, det,
 * why as in dp__fanout_unit) and the endpoint name its info gave.
 */
typedef struct dp__unit_probe {
    int state;
    int rc;
    dp_detail det;
    size_t why;
    char agent[DP_CLUSTER_ADDR_MAX];
} dp__unit_probe;

/* State of a registered buffer the client mapped itself. */
enum {
    DP__BUF_FREE = 0, /* cached, may be handed out again */
    DP__BUF_STAGING,  /* used by the running operation */
    DP__BUF_USER,     /* handed to the caller by dp_client_alloc */
    DP__BUF_VALUES,   /* owned by a dp_values */
    DP__BUF_RETIRED,  /* touched by an unfinished transfer: never reused or freed */
};

typedef struct dp__client_buf {
    uint8_t *p;
    size_t len;
    int state;
    uint64_t last_use; /* c->use_clock when last given back (LRU trimming) */
} dp__client_buf;

/* A caller-registered region. */
typedef struct dp__region {
    uint8_t *p;
    size_t len;
} dp__region;

struct dp_client {
    pthread_mutex_t mu; /* guards everything below that is not constant */
    dp_client_opts o;
    char name[256];
    char cluster_id[65]; /* the cluster file's id ("" for none): units must report it */
    dp__endpoint *ep;    /* NULL: a control-only client (dp__client_open_ctl) */
    dp__ctl_client *ctl;
    dp__wire_rid_gen rids;
    char blob_prefix[17]; /* random per client: blob ids "<prefix>-<seq>" */
    uint64_t blob_seq;
    /* The puts' versions (docs/design.md, "Versions"): the last one given, and
     * this client's salt in their low bits (random, DP__VER_SALT_BITS). */
    uint64_t ver_last;
    uint64_t ver_salt;
    uint32_t n_units;
    /*
     * Copies of each row (docs/design.md, "Replicas"): row g lives on units
     * g % N, (g + 1) % N, ... From the units' info (every unit must say the
     * same); 0 until one answered, then 1..3.
     */
    uint32_t replicas;
    /* Whether a unit said it runs with read leases (docs/design.md, "Leases"):
     * a put then waits a share of its budget for a silent unit, and fences it. */
    bool leases;
    /*
     * A repair's client (dp__client_repair): every get asks only_unit and
     * every put writes it only, as a repair copy (-1: rows go where they
     * live, the normal case).
     */
    int64_t only_unit;
    dp__unit_conn *units;
    /*
     * A control-only client's: each unit's check (n_units; NULL for a full
     * client, whose units are all bound at open), and the words of its
     * reports (dp__fanout_opts, strings owned).
     */
    dp__unit_probe *checks;
    dp__fanout_opts words;

    /* Registered memory the client mapped (staging, user, values). */
    dp__client_buf *bufs;
    size_t n_bufs, cap_bufs;
    uint64_t cached_bytes; /* sum of FREE buffers */
    uint64_t use_clock;
    /* Caller-registered regions. */
    dp__region *regions;
    size_t n_regions, cap_regions;
    /*
     * The memory transfers use in place (dp__client_direct_locked): USER and
     * VALUES buffers and the caller's regions, as ranges (v unused). Kept as
     * buffers change state and regions come and go.
     */
    dp__ranges direct;

    dp_client_counters cnt;         /* the caller's view: dp_client_counters_get */
    uint64_t under_replicated_rows; /* dp_client_under_replicated_rows */

    /*
     * A client opened through a registry follows its records (NULL: opened
     * from a cluster file or addresses): reg_gen is the watch's generation
     * last applied (dp__client_follow_locked).
     */
    dp__reg_watch *reg;
    uint64_t reg_gen;

    /*
     * Live dp_values of this client (each keeps it alive), and whether
     * dp_client_close was called: the last dp_values_destroy then frees it.
     */
    size_t n_values;
    bool closed;

    /*
     * Per-unit scratch reused by every operation (no per-op allocation):
     * blob builders, and the fanout's requests, ctl items and replies.
     */
    dp__blob_builder **builders; /* n_units, created on first use */
    dp__fanout fo;               /* n_units */
};

/* ---- shared between the client's files ---- */

/* ---- repair (repair.c; docs/design.md, "Repair") ---- */

typedef struct dp__repair_opts {
    uint32_t unit;       /* the unit to fill from its peers */
    uint32_t page_rows;  /* rows of the first listing (0: 64); then about 50 ms
                          * of rate_bytes_s a page */
    double rate_bytes_s; /* throttle: at most this many bytes a second (0: none) */
    /* after each page: keys copied in, their bytes, keys that could not be */
    void (*progress)(void *ctx, uint64_t keys, uint64_t bytes, uint64_t failed);
    void *ctx;
    const int *stop; /* read between pages: nonzero stops the repair early */
} dp__repair_opts;

typedef struct dp__repair_sum {
    uint64_t keys, bytes, skipped, failed;
    uint64_t held; /* listed keys the unit held at that version already: not copied */
    /* keys the unit holds that a peer sharing their row lacked (all those shared
     * with a peer that could not be listed): under-replicated */
    uint64_t under;
    uint32_t peers_failed; /* peers that could not be listed to the end */
    uint32_t peers_gone;   /* of which their processes were gone (refused) */
} dp__repair_sum;

/*
 * Fill unit o->unit with the copies of its rows its peers hold (the units
 * that share rows with it), page by page: list_keys on a peer and on the
 * unit, a get from the peer of the keys the unit lacks or holds at a lower
 * version, and a put of them into the unit as a repair copy carrying the
 * peer's versions (it publishes only keys it lacks or holds at a lower
 * version, of rows not cleared since the repair began). c is the repair's own
 * client (its routing is changed while this runs). DP_OK when every peer was
 * listed to its end and every key was copied or found gone; else the first
 * failure (the rest goes on: *sum counts).
 */
int dp__client_repair(dp_client *c, const dp__repair_opts *o, dp__repair_sum *sum,
                      dp_detail *d);

/*
 * Versions of puts and clears (docs/design.md, "Versions"; dp__ver_now): a
 * hybrid clock, never below the last version this client gave nor below one
 * a unit answered "Stale" with, and the client's random salt in the low 12
 * bits, so that two clients writing one key in the same microsecond still
 * differ. A version above both the last one given and above (locked).
 */
/* How many times a clear goes again after a "Stale" refusal. */
#define DP__CLEAR_STALE_TRIES 8

static inline uint64_t
dp__client_ver_next_locked(dp_client *c, uint64_t above)
{
    uint64_t t = dp__ver_now() >> DP__VER_SALT_BITS;
    uint64_t floor = DP_MAX(c->ver_last, above) >> DP__VER_SALT_BITS;
    if (t <= floor)
        t = floor + 1;
    c->ver_last = t << DP__VER_SALT_BITS | c->ver_salt;
    return c->ver_last;
}

/*
 * A repair's put (only_unit set): dp_client_put with each cell's version
 * where it was copied from (n_rows x n_fields), which the unit keeps instead
 * of a version of this client's (docs/design.md, "Versions").
 */
int dp__client_put_copy(dp_client *c, const uint64_t *gidxs, size_t n_rows,
                        const char *const *fields, size_t n_fields,
                        const dp_value *values, const uint64_t *cell_ver, int *row_status,
                        dp_detail *d);

/* The copies of each row this client writes (1 until a unit said). */
static inline uint32_t
dp__client_replicas(const dp_client *c)
{
    return c->replicas > 0 ? c->replicas : 1;
}

/*
 * Take the copies of each row unit u's info says (in); DP_EPROTO into d when
 * another unit already said otherwise.
 */
int dp__client_take_replicas_locked(dp_client *c, uint32_t u, const dp__wire_info *in,
                                    dp_detail *d);

/*
 * Apply what the registry's watch saw since last time: a unit whose record
 * names another address or incarnation gets that address and is marked for
 * re-binding (its restart reported to the next put or get). No-op without a
 * registry.
 */
void dp__client_follow_locked(dp_client *c);

double dp__client_round_timeout(double deadline);

/* A busy unit is asked again after a backoff doubling from 2 ms up to 100 ms. */
#define DP__CLIENT_BACKOFF_FIRST_S 0.002
#define DP__CLIENT_BACKOFF_MAX_S 0.1

/*
 * Encode request q for unit u with a fresh rid and point c->fo.items[slot]
 * at it (dp__fanout_place). Returns DP_ENOMEM/DP_ETOOBIG/DP_EINVAL.
 */
int dp__client_prepare_locked(dp_client *c, uint32_t u, size_t slot, dp__wire_request *q,
                              dp_detail *d);

/*
 * DP_OK if c can transfer (put, get, memory); a control-only client is
 * refused with DP_EINVAL naming what (the call) was asked.
 */
int dp__client_data_check(const dp_client *c, const char *what, dp_detail *d);

/* Send a notify (abort, unpin) to unit u; failures are only logged. */
void dp__client_notify_locked(dp_client *c, uint32_t u, dp__wire_request *q);

/*
 * abort(blob_id, in_flight) to unit u, kept to be sent once more when u next
 * answers (see dp__unit_conn.aborts).
 */
void dp__client_abort_locked(dp_client *c, uint32_t u, const char *blob_id,
                             bool in_flight);

/*
 * Check which process answered: DP_OK when rep came from the incarnation u's
 * data path is bound to (or names none). Otherwise u is marked for re-binding
 * and, when report (a put or get acting on the reply), DP_ERESTARTED with d
 * naming the unit; without report (clear, stats) DP_OK, the restart then being
 * reported to the next put or get.
 */
int dp__client_reply_check_locked(dp_client *c, uint32_t u, const dp__wire_reply *rep,
                                  bool report, dp_detail *d);

/*
 * A full client's units not bound since the open (incarnation 0) that q_of
 * picks (NULL: all), bound now (dp__client_ready_locked: info, checked to be
 * unit u of n). *rcs (NULL when there was none) gets n_units codes, 0 for
 * every other unit, and *dets their details; free both. DP_ENOMEM else.
 */
int dp__client_bind_unbound_locked(dp_client *c, dp__fanout_req_fn q_of, void *ctx,
                                   double deadline, int **rcs, dp_detail **dets,
                                   dp_detail *d);

/* The units' CURVE public keys (cu: n entries, or NULL) for the control client. */
int dp__client_set_server_keys(dp_client *c, const dp__cluster_unit *cu, uint32_t n,
                               dp_detail *d);

/* Unit u's control address a, checked. */
int dp__client_set_addr(dp_client *c, uint32_t u, const char *a, dp_detail *d);

/*
 * info from unit only (every unit: only < 0) at once, each checked by the
 * fanout to be unit u of n, then bound: a full client's data path (binding
 * stops at the first failure: the open fails), a control-only client's
 * record. With DP__CTL_ALLOW_DOWN a unit that does not answer is marked down
 * instead of an error: a control-only client's requests to it then fail with
 * why; a full client leaves it unbound (stale, incarnation 0), so the first
 * put or get that needs it binds it (dp__client_ready_locked) or finds it
 * still down; unless no unit answers at all. The first failure (unit order)
 * goes into d: the unit's report, "connecting to unit U (ADDR): why" for a
 * full client.
 */
int dp__client_check_units_locked(dp_client *c, int64_t only, unsigned flags,
                                  dp_detail *d);

/*
 * Before a put or get transfers to units[0..n): re-bind each one whose
 * restart was seen or whose transfer endpoint failed (fresh info, metadata,
 * endpoint). rcs[i] (and dets[i]) get 0, or why unit units[i] cannot take part:
 * DP_ERESTARTED (it restarted: re-bound now, reported once), DP_ETRANSFER (it
 * is down or unreachable) or another code of the info call.
 */
void dp__client_ready_locked(dp_client *c, const uint32_t *units, size_t n,
                             double deadline, int *rcs, dp_detail *dets);

/*
 * A registered buffer of at least nbytes from the pool (reused when cached
 * and not touched by an unfinished transfer, else mapped), marked state.
 */
int dp__client_buf_get_locked(dp_client *c, size_t nbytes, int state,
                              dp__client_buf **out, dp_detail *d);
/* Give a buffer back: cached, or retired when an unfinished transfer touches it. */
void dp__client_buf_put_locked(dp_client *c, uint8_t *p);

/*
 * Free c and everything it holds (the end of dp_client_close, or of the last
 * dp_values_destroy after it). Nothing else may use c.
 */
void dp__client_free(dp_client *c);

/* Deregister and forget every caller-registered region (the client closes). */
void dp__client_regions_drop_locked(dp_client *c);

/* True if [p, p + n) lies in memory the caller may transfer to/from directly. */
bool dp__client_direct_locked(const dp_client *c, const void *p, uint64_t n);

/*
 * The process-wide test hook: called with a stage name while the client lock
 * is held: "put:allocated" (every alloc answered, no WRITE posted),
 * "put:written" (a unit's WRITE is done, its commit not yet sent). NULL: none.
 * Tests only.
 */
extern void (*dp__client_test_hook)(const char *stage);

/*
 * A location hint's seal: the hash of every byte before its seal field
 * (seal zero), chained from its key's hash (dp__hash64 of the key). A put
 * fills it; a get uses a hint only when it matches (docs/design.md,
 * "Location hints").
 */
static inline uint64_t
dp__loc_seal(const dp_loc *l, uint64_t key_hash)
{
    return dp__hash64(l, offsetof(dp_loc, seal), key_hash);
}

#endif
