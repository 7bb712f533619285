/*
 * Internals of the client's get shared by its files (not installed): get.c,
 * a pass's rounds (resolve, READ, unpin); get_turns.c, the call (its turns
 * over replicas, its report); values.c, what a get hands back (the values'
 * descriptions, the alloc form and its dp_values).
 * get.c's opening comment holds the get's design.
 */
#ifndef DP_CLIENT_GET_INT_H
#define DP_CLIENT_GET_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "client/client_int.h"

/* Values a get handed back (the alloc form: values.c). */
struct dp_values {
    dp_client *c; /* counted in c->n_values once set; NULL before */
    size_t n;
    dp_get_item *items;
    dp_value_desc *descs;
    uint8_t **bufs; /* registered buffers holding the values */
    size_t n_bufs;
};

/* ---- get.c: the get's rounds ---- */

/*
 * The engine: vals != NULL is the alloc form (destinations come from
 * registered buffers owned by vals).
 */
int dp__get_locked(dp_client *c, dp_get_item *items, size_t n, dp_values *vals,
                   dp_detail *d);

/* A place kept in an earlier turn's values buffer for a key asked again of
 * the next replica (the alloc form with replicas; dst NULL: none). */
typedef struct dp__get_resv {
    uint8_t *dst;
    uint64_t cap;
} dp__get_resv;

/*
 * One pass over items: every key asked of the unit (gidx + shift) % N, in
 * rounds until each is answered or the deadline. Each unit's first failure
 * goes into g->ust (kept from an earlier pass). DP_OK, or why the pass could
 * not run (a bad key, out of memory).
 */
typedef struct dp__get_ctx {
    dp_client *c;
    dp_values *vals;    /* the alloc form's, or NULL */
    dp__step *ust;      /* n_units: each unit's first failure in the call */
    dp__get_resv *resv; /* the alloc form with replicas: per key of the call, or NULL */
} dp__get_ctx;

/* at: each item's place in the call (NULL: the same). */
int dp__get_pass(const dp__get_ctx *g, dp_get_item *items, const uint32_t *at, size_t n,
                 double deadline, uint32_t shift, dp_detail *d);

/* Whether a key that failed with code may be had from its row's next replica. */
static inline bool
dp__get_falls_back(int code)
{
    return code != DP_OK && code != DP_ETOOBIG && code != DP_EINVAL && code != DP_ENOMEM;
}

/* ---- values.c: what a get hands back ---- */

/* The kind a unit's description names (bytes for one this code does not know). */
dp_kind dp__kind_of(dp__wire_str kind);

/* The description of a value from its entry l in a resolve_keys answer. */
void dp__fill_desc(dp_value_desc *o, const dp__wire_key_loc *l);

/* The same from a resolve_rows description w (its kind parsed once). */
void dp__fill_desc_wire(dp_value_desc *o, const dp__wire_desc *w, dp_kind kind,
                        uint64_t len);

/* The description of a value from its location hint l (one that has it). */
void dp__fill_desc_loc(dp_value_desc *o, const dp_loc *l);

#endif
