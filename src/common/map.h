/*
 * Hash maps for the unit's tables: string keys (blob ids, pin ids, fields) and
 * u64 keys (row gidx), each mapping to a pointer. Open addressing with linear
 * probing and backward-shift deletion (no tombstones), so lookups stay short
 * however many inserts and removes a long-running unit does.
 *
 * String maps copy their keys (any bytes, with a length). Values are the
 * caller's; the map never frees them. Not thread-safe: the owner's lock guards it.
 */
#ifndef DP_COMMON_MAP_H
#define DP_COMMON_MAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct dp__map_slot dp__map_slot;

typedef struct dp__map {
    dp__map_slot *slots;
    size_t cap; /* power of two, or 0 */
    size_t len;
    bool u64_keys;
} dp__map;

void dp__map_init_str(dp__map *m);
void dp__map_init_u64(dp__map *m);
/* Frees the map's storage and key copies (not the values). */
void dp__map_fini(dp__map *m);
size_t dp__map_len(const dp__map *m);

/* String keys. put replaces an existing value (returning it in *old if asked). */
void *dp__map_get(const dp__map *m, const void *key, size_t klen);
int dp__map_put(dp__map *m, const void *key, size_t klen, void *val, void **old);
void *dp__map_del(dp__map *m, const void *key, size_t klen); /* removed value or NULL */

/* u64 keys. */
void *dp__map_get_u64(const dp__map *m, uint64_t key);
int dp__map_put_u64(dp__map *m, uint64_t key, void *val, void **old);
void *dp__map_del_u64(dp__map *m, uint64_t key);

/*
 * Iteration: for (size_t it = 0; dp__map_next(m, &it, &k, &klen, &ku, &v);) ...
 * Any out-parameter may be NULL. The map must not change during iteration
 * (collect what to delete, then delete).
 */
bool dp__map_next(const dp__map *m, size_t *it, const void **key, size_t *klen,
                  uint64_t *ukey, void **val);

#endif
