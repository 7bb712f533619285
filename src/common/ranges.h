/*
 * Sets of disjoint address ranges [base, base+len), kept sorted by base in one
 * array, each with a caller's pointer: "which registered region holds [p,
 * p+n)" is a binary search. The endpoint's local and remote regions, the
 * client's memory that transfers use in place, the direct transport's
 * registration cache and the graveyard's retained ranges are such sets.
 *
 * Adding and removing move the entries after the place (memmove): fine for
 * sets that change far less often than they are searched. Entry pointers stay
 * valid until the set next changes. A zeroed dp__ranges is an empty set. Not
 * thread-safe: the owner's lock guards a set.
 */
#ifndef DP_COMMON_RANGES_H
#define DP_COMMON_RANGES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct dp__ranges_ent {
    uint64_t base, len; /* len > 0; base + len does not wrap */
    void *v;            /* the caller's; NULL for merged ranges */
} dp__ranges_ent;

typedef struct dp__ranges {
    dp__ranges_ent *e; /* n entries, sorted by base, disjoint */
    size_t n, cap;
} dp__ranges;

void dp__ranges_fini(dp__ranges *rs);

/* Room for extra more entries, so that as many adds cannot fail: 0, DP_ENOMEM. */
int dp__ranges_reserve(dp__ranges *rs, size_t extra);

/*
 * Add [base, base+len) with v. DP_EINVAL (len 0, or the range wraps),
 * DP_EEXIST (it overlaps a range of the set: touching one is fine), DP_ENOMEM.
 * Nothing changes on an error.
 */
int dp__ranges_add(dp__ranges *rs, uint64_t base, uint64_t len, void *v);

/*
 * Add [base, base+len) as a union: it and every range it overlaps or touches
 * become one range (value NULL), so the set stays disjoint and no two ranges
 * touch. len 0 adds nothing; an end past 2^64 is taken as 2^64 - 1. 0, or
 * DP_ENOMEM (nothing changed).
 */
int dp__ranges_merge(dp__ranges *rs, uint64_t base, uint64_t len);

/* The range that starts at base, or NULL. */
dp__ranges_ent *dp__ranges_at(const dp__ranges *rs, uint64_t base);

/* Remove e, an entry of rs (from dp__ranges_at, _find, _overlap or rs->e). */
void dp__ranges_remove(dp__ranges *rs, dp__ranges_ent *e);

/*
 * The range holding all of [addr, addr+n), or NULL. With n == 0: a range
 * holding addr or ending right at it.
 */
dp__ranges_ent *dp__ranges_find(const dp__ranges *rs, uint64_t addr, uint64_t n);

/*
 * The lowest range sharing a byte with [addr, addr+n) (an end past 2^64 is
 * taken as 2^64 - 1), or NULL; NULL for n == 0.
 */
dp__ranges_ent *dp__ranges_overlap(const dp__ranges *rs, uint64_t addr, uint64_t n);

/* Empty the set, keeping its storage. */
static inline void
dp__ranges_clear(dp__ranges *rs)
{
    rs->n = 0;
}

#endif
