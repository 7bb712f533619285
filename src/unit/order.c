/*
 * Request order: a stale request (older than one its client sent later) is
 * refused (see dp__unit_order_check in unit.h and docs/design.md, "Request
 * order").
 *
 * Design notes
 * - Per client prefix the unit keeps the highest counter it took and when it
 *   last heard from that client. Clients that stay silent for ORDER_KEEP_S
 *   are forgotten (the sweep runs with the ticker, at most once a minute):
 *   a request still in flight after that long would have outlived TCP's own
 *   retransmission limit (about 15 minutes with Linux's defaults).
 * - Everything runs under the unit lock; the table is a string map.
 */
#include <stdlib.h>
#include <string.h>

#include "unit/unit_int.h"

#define ORDER_KEEP_S 1800.0
#define ORDER_SWEEP_S 60.0

typedef struct order_rec {
    uint64_t last;
    dp__wire_op last_op;
    double seen;
} order_rec;

/* The counter of a "<16 hex>-<1..16 hex>" id; false for any other form. */
static bool
parse_rid(const char *p, size_t n, uint64_t *counter)
{
    if (n < 18 || n > 33 || p[16] != '-')
        return false;
    for (size_t i = 0; i < 16; i++)
        if (!((p[i] >= '0' && p[i] <= '9') || (p[i] >= 'a' && p[i] <= 'f')))
            return false;
    uint64_t v = 0;
    for (size_t i = 17; i < n; i++) {
        char c = p[i];
        int x = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (x < 0)
            return false;
        v = v << 4 | (uint64_t)x;
    }
    *counter = v;
    return true;
}

int
dp__unit_order_check(dp__unit *u, const char *rid, size_t len, dp__wire_op op,
                     dp_detail *d)
{
    uint64_t k;
    if (!parse_rid(rid, len, &k))
        return DP_OK;
    int rc = DP_OK;
    pthread_mutex_lock(&u->mu);
    double now = dp__unit_now(u);
    order_rec *r = dp__map_get(&u->order, rid, 16);
    if (r == NULL) {
        r = calloc(1, sizeof *r);
        if (r != NULL && dp__map_put(&u->order, rid, 16, r, NULL) != 0) {
            free(r);
            r = NULL;
        }
        if (r == NULL) /* out of memory: no order to check against */
            goto out;
        r->last = k;
        r->last_op = op;
    } else if (k == r->last && op == r->last_op && dp__wire_op_repeatable(op)) {
        u->stats.repeats_taken++; /* sent again after a drop: as safe as once */
    } else if (k <= r->last) {
        u->stats.stale_refused++;
        rc = dp__fail(d, DP_EPROTO,
                      "stale request %.*s: this client already sent request %llx, "
                      "so this one travelled on a connection it gave up; refused",
                      (int)len, rid, (unsigned long long)r->last);
    } else {
        r->last = k;
        r->last_op = op;
    }
    r->seen = now;
out:
    pthread_mutex_unlock(&u->mu);
    return rc;
}

void
dp__order_sweep_locked(dp__unit *u, double now)
{
    if (now - u->order_swept < ORDER_SWEEP_S)
        return;
    u->order_swept = now;
    /* Collect first: the map must not change while it is iterated. */
    size_t n = 0, cap = 0;
    char(*gone)[16] = NULL;
    const void *key;
    size_t klen;
    void *v;
    for (size_t it = 0; dp__map_next(&u->order, &it, &key, &klen, NULL, &v);) {
        if (now - ((order_rec *)v)->seen < ORDER_KEEP_S || klen != 16)
            continue;
        if (n == cap) {
            size_t nc = cap ? cap * 2 : 16;
            char(*p)[16] = realloc(gone, nc * sizeof *p);
            if (p == NULL)
                break;
            gone = p;
            cap = nc;
        }
        memcpy(gone[n++], key, 16);
    }
    for (size_t i = 0; i < n; i++)
        free(dp__map_del(&u->order, gone[i], 16));
    free(gone);
}

void
dp__order_fini(dp__unit *u)
{
    void *v;
    for (size_t it = 0; dp__map_next(&u->order, &it, NULL, NULL, NULL, &v);)
        free(v);
    dp__map_fini(&u->order);
}
