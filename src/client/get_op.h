/*
 * The state of one get's pass shared by get.c (its rounds: ask, READ, unpin)
 * and get_match.c (reading the units' answers). Not installed. get.c's
 * opening comment holds the get's design.
 */
#ifndef DP_CLIENT_GET_OP_H
#define DP_CLIENT_GET_OP_H

#include <string.h>

#include "client/get_int.h"
#include "common/le.h"

enum { K_ASK = 0, K_READ, K_DONE };

/* How a unit is asked in a round: resolve_keys, resolve_rows or resolve. */
enum { ASK_BY_KEY = 0, ASK_BY_ROW, ASK_BY_BLOB };

typedef struct key_state { /* members ordered to pack (72 bytes) */
    uint32_t unit;
    uint32_t klen;
    uint32_t fidx; /* its field's place in get_op.fields (by row: resolve_rows) */
    uint32_t bidx; /* hinted: its blob among its unit's distinct ids (bids) */
    int st;
    bool hinted;  /* its item's hint is used (K_ASK: asked by blob) */
    bool staged;  /* READ into staging, then copied */
    bool in_resv; /* alloc form, K_READ: lands in the place an earlier turn kept */
    uint64_t gidx;
    uint64_t off; /* slab offset (K_READ) */
    uint64_t len;
    uint64_t soff; /* its place in the round's staging buffer (alloc form: values) */
    /* K_READ: its bytes came in the reply (in c->fo.items until the next
     * round's ask): copied, not READ */
    const uint8_t *inl;
    uint64_t gap; /* alloc form, failed here: bytes kept at soff for the next replica */
} key_state;

typedef struct unit_round {
    dp__step st; /* its unit and why it failed this get (state unused) */
    char pin[DP_WIRE_RID_MAX + 32];
    double sent_at;
    bool asked;
    int how;           /* ASK_BY_KEY, ASK_BY_ROW or ASK_BY_BLOB (every key hinted) */
    uint64_t copy_max; /* values up to this size are READ by the memcpy path
                        * into any memory (dp__endpoint_remote_copy_max) */
    uint32_t nb;       /* its distinct blob ids (bids[start..start + nb)) */
    uint32_t nk;       /* its keys asked this round */
} unit_round;

/* A hinted blob's answer in this round. */
typedef struct blob_ans {
    uint64_t off, len;
    bool ok; /* pinned and whole: its hinted keys are READ from it */
} blob_ans;

/*
 * One get's state across its rounds: the keys (ks, grouped by unit in g),
 * each unit's round (ur), and the scratch of a round's requests and READs.
 * vals != NULL is the alloc form (destinations come from registered buffers
 * owned by vals).
 */
typedef struct get_op {
    dp_client *c;
    dp_get_item *items;
    size_t n;
    dp_values *vals;
    double deadline;
    uint32_t shift;     /* replicas: this pass asks each row's (gidx + shift) % N */
    const uint32_t *at; /* each item's place in the call (NULL: the same) */
    dp__get_resv *resv; /* per key of the call (alloc form with replicas), or NULL */
    key_state *ks;
    dp__groups g;
    dp__wire_str *keys;
    /* Asked by row (resolve_rows): the get's distinct fields, and a round's
     * records (DP_WIRE_ROW_LEN a key, at g.start[u] for unit u); fields NULL:
     * by key */
    dp__wire_str *fields;
    uint32_t n_fields;
    uint8_t *rows;
    uint32_t *slot_unit;
    unit_round *ur;
    dp__range *local, *remote;
    dp__xfer_desc *ops;
    dp__xfer_result *res; /* the READs' results, op by op */
    dp__wire_str *bids; /* hinted keys' distinct blob ids, unit by unit (at g.start[u]) */
    blob_ans *bans;     /* their answers, same places */
    bool slow_again;    /* this round asks again because of pending keys or a busy unit */
} get_op;

static inline bool
key_is(dp__wire_str s, const char *key, uint32_t klen)
{
    return s.n == klen && dp__bytes_eq(s.p, key, klen);
}

static inline void
item_fail(dp_get_item *it, key_state *ks, int code)
{
    it->status = code;
    ks->st = K_DONE;
}

/*
 * Unit u's answer matched to its keys still asked, each located (K_READ,
 * *stage_need growing by the staging it needs) or failed; returns whether a
 * key must be asked again. By key (resolve_keys), by row (resolve_rows) or
 * by blob (resolve: hinted keys).
 */
bool dp__get_match_keys(get_op *x, uint32_t u, const dp__wire_resolve_keys_res *res,
                        uint64_t *stage_need);
bool dp__get_match_rows(get_op *x, uint32_t u, const dp__wire_resolve_rows_res *res,
                        uint64_t *stage_need);
bool dp__get_match_blobs(get_op *x, uint32_t u, const dp__wire_resolve_res *res,
                         uint64_t *stage_need);

#endif
