/*
 * Filling a unit that came back empty from the copies its peers hold
 * (docs/design.md, "Repair"): page by page, list_keys on a peer (its rows
 * that the unit also holds), a get of those keys from that peer, and a put of
 * them into the unit as a repair copy, which publishes only keys the unit
 * lacks, of rows not cleared since it started. The client is the repair's own:
 * while this runs its gets ask one unit and its puts write one (only_unit).
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "blob/keys.h"
#include "client/client_int.h"

/* One page of a listing: its keys (copied) and their versions, where the next
 * one starts. */
typedef struct page {
    char **keys;
    uint64_t *vers;
    uint32_t n;
    uint64_t next;
    bool more;
} page;

static void
page_fini(page *pg)
{
    for (uint32_t i = 0; i < pg->n; i++)
        free(pg->keys[i]);
    free(pg->keys);
    free(pg->vers);
    memset(pg, 0, sizeof *pg);
}

static int list_page_once(dp_client *c, uint32_t p, uint32_t u, uint64_t from,
                          uint32_t max_rows, bool own, page *pg, dp_detail *d);

/*
 * list_keys on peer p for unit u's rows from `from` on (own: p is the unit
 * repaired, listing itself). A peer that holds no read lease yet (it started
 * a moment ago, or is catching up: "Leases") answers Busy: asked again, with
 * backoff, within the client's budget.
 */
static int
list_page(dp_client *c, uint32_t p, uint32_t u, uint64_t from, uint32_t max_rows,
          bool own, page *pg, dp_detail *d)
{
    double end = dp__now_s() + c->o.timeout_s, step = 0.02;
    for (;;) {
        int rc = list_page_once(c, p, u, from, max_rows, own, pg, d);
        if (rc != DP_EBUSY || dp__now_s() + step > end)
            return rc;
        dp__sleep_s(step);
        step = DP_MIN(step * 2, 0.5);
    }
}

static int
list_page_once(dp_client *c, uint32_t p, uint32_t u, uint64_t from, uint32_t max_rows,
               bool own, page *pg, dp_detail *d)
{
    memset(pg, 0, sizeof *pg);
    pthread_mutex_lock(&c->mu);
    dp__fanout_reset(&c->fo);
    dp__wire_request q;
    memset(&q, 0, sizeof q);
    q.op = DP_WIRE_OP_LIST_KEYS;
    q.a.list_keys = (dp__wire_list_keys_args){u, from, max_rows, own};
    int rc = dp__client_prepare_locked(c, p, 0, &q, d);
    if (rc == DP_OK) {
        dp__ctl_call_many(c->ctl, c->fo.items, 1, c->o.timeout_s);
        dp__wire_reply rep;
        rc = dp__fanout_reply(&c->fo.items[0], DP_WIRE_OP_LIST_KEYS, &rep, d);
        if (rc == DP_OK && !rep.ok)
            rc = dp__wire_error_to_detail(&rep.err, d);
        if (rc == DP_OK) {
            const dp__wire_list_keys_res *r = &rep.r.list_keys;
            pg->keys = calloc(r->keys.n > 0 ? r->keys.n : 1, sizeof *pg->keys);
            pg->vers = calloc(r->keys.n > 0 ? r->keys.n : 1, sizeof *pg->vers);
            for (uint32_t i = 0; pg->keys != NULL && pg->vers != NULL && i < r->keys.n;
                 i++, pg->n++) {
                if ((pg->keys[i] = strndup(r->keys.v[i].p, r->keys.v[i].n)) == NULL)
                    break;
                pg->vers[i] = r->vers.n == r->keys.n ? r->vers.v[i] : 0;
            }
            if (pg->keys == NULL || pg->vers == NULL || pg->n < r->keys.n)
                rc = dp__fail(d, DP_ENOMEM, "repair: out of memory");
            pg->next = r->next;
            pg->more = r->more;
        }
        dp__wire_reply_fini(&rep);
    }
    dp__fanout_reset(&c->fo);
    pthread_mutex_unlock(&c->mu);
    if (rc != DP_OK)
        page_fini(pg);
    return rc;
}

static void
route(dp_client *c, int64_t unit)
{
    pthread_mutex_lock(&c->mu);
    c->only_unit = unit;
    pthread_mutex_unlock(&c->mu);
}

/* A page's values as put's grid: its rows (in order) x its distinct fields,
 * and each cell's version. */
typedef struct grid {
    uint64_t *rows;
    char **fields; /* borrowed from the keys' text: NUL-terminated copies */
    dp_value *cells;
    uint64_t *vers;
    size_t n_rows, n_fields;
} grid;

static void
grid_fini(grid *g)
{
    for (size_t f = 0; f < g->n_fields; f++)
        free(g->fields[f]);
    free(g->rows);
    free(g->fields);
    free(g->cells);
    free(g->vers);
    memset(g, 0, sizeof *g);
}

/* Build the grid of what came back (status 0) from v's items for keys. */
static int
grid_make(const page *pg, dp_values *v, grid *g, dp_detail *d)
{
    memset(g, 0, sizeof *g);
    size_t n = pg->n;
    g->rows = malloc((n > 0 ? n : 1) * sizeof *g->rows);
    g->fields = calloc(n > 0 ? n : 1, sizeof *g->fields);
    uint32_t *fi = malloc((n > 0 ? n : 1) * sizeof *fi);
    uint32_t *ri = malloc((n > 0 ? n : 1) * sizeof *ri);
    int rc = DP_OK;
    if (g->rows == NULL || g->fields == NULL || fi == NULL || ri == NULL) {
        rc = dp__fail(d, DP_ENOMEM, "repair: out of memory");
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        ri[i] = fi[i] = UINT32_MAX;
        if (dp_values_get(v, i, NULL, NULL, NULL) != DP_OK)
            continue; /* gone meanwhile, or failed: counted by the caller */
        dp__key_parts kp;
        if (dp__key_split(pg->keys[i], strlen(pg->keys[i]), &kp, NULL) != DP_OK)
            continue;
        if (g->n_rows == 0 || g->rows[g->n_rows - 1] != kp.gidx) /* listed by row */
            g->rows[g->n_rows++] = kp.gidx;
        ri[i] = (uint32_t)(g->n_rows - 1);
        size_t f = 0;
        while (f < g->n_fields && !(strlen(g->fields[f]) == kp.field_len &&
                                    memcmp(g->fields[f], kp.field, kp.field_len) == 0))
            f++;
        if (f == g->n_fields &&
            (g->fields[g->n_fields++] = strndup(kp.field, kp.field_len)) == NULL) {
            g->n_fields--;
            rc = dp__fail(d, DP_ENOMEM, "repair: out of memory");
            goto out;
        }
        fi[i] = (uint32_t)f;
    }
    g->cells = calloc(g->n_rows * g->n_fields + 1, sizeof *g->cells);
    g->vers = calloc(g->n_rows * g->n_fields + 1, sizeof *g->vers);
    if (g->cells == NULL || g->vers == NULL) {
        rc = dp__fail(d, DP_ENOMEM, "repair: out of memory");
        goto out;
    }
    for (size_t k = 0; k < g->n_rows * g->n_fields; k++)
        g->cells[k].kind = DP_KIND_SKIP;
    for (size_t i = 0; i < n; i++) {
        if (ri[i] == UINT32_MAX)
            continue;
        dp_value *c = &g->cells[(size_t)ri[i] * g->n_fields + fi[i]];
        g->vers[(size_t)ri[i] * g->n_fields + fi[i]] = pg->vers[i];
        const dp_value_desc *dsc = NULL;
        dp_values_get(v, i, &c->data, &c->nbytes, &dsc);
        c->kind = dsc->kind;
        c->dtype = dsc->dtype;
        c->shape = dsc->shape;
        c->ndim = dsc->ndim;
    }
out:
    free(fi);
    free(ri);
    if (rc != DP_OK)
        grid_fini(g);
    return rc;
}

/* One page: get its keys from peer p, put them into unit u. */
static int
copy_page(dp_client *c, uint32_t p, uint32_t u, const page *pg, dp__repair_sum *sum,
          uint64_t *bytes, dp_detail *d)
{
    dp_values *v = NULL;
    route(c, p);
    int rc = dp_client_get_alloc(c, (const char *const *)pg->keys, pg->n, &v, d);
    route(c, -1);
    if (v == NULL)
        return rc;
    uint64_t failed = 0;
    for (size_t i = 0; i < pg->n; i++) {
        int st = dp_values_get(v, i, NULL, NULL, NULL);
        if (st == DP_ENOMEM ||
            st == DP_ETOOBIG) { /* no room here: copy_split halves it */
            dp_values_destroy(v);
            return dp__fail(d, st, "repair: no room for a page of %u keys", pg->n);
        }
        if (st != DP_OK && st != DP_ENOTFOUND) /* missing: cleared meanwhile */
            failed++;
    }
    grid g;
    rc = grid_make(pg, v, &g, d);
    if (rc != DP_OK) {
        dp_values_destroy(v);
        return rc;
    }
    int *row_status = calloc(g.n_rows + 1, sizeof *row_status);
    if (row_status == NULL)
        rc = dp__fail(d, DP_ENOMEM, "repair: out of memory");
    *bytes = 0;
    uint64_t keys = 0;
    if (rc == DP_OK && g.n_rows > 0) {
        route(c, u);
        rc = dp__client_put_copy(c, g.rows, g.n_rows, (const char *const *)g.fields,
                                 g.n_fields, g.cells, g.vers, row_status, d);
        route(c, -1);
        for (size_t r = 0; r < g.n_rows; r++)
            for (size_t f = 0; f < g.n_fields; f++) {
                const dp_value *x = &g.cells[r * g.n_fields + f];
                if (x->kind == DP_KIND_SKIP)
                    continue;
                if (row_status[r] != DP_OK) {
                    failed++;
                } else {
                    keys++;
                    *bytes += x->nbytes;
                }
            }
    }
    sum->keys += keys;
    sum->bytes += *bytes;
    sum->failed += failed;
    free(row_status);
    grid_fini(&g);
    dp_values_destroy(v);
    return rc;
}

/* Row of key k of a page (keys are listed row by row); UINT64_MAX if malformed. */
static uint64_t
row_of(const page *pg, uint32_t k)
{
    dp__key_parts kp;
    return dp__key_split(pg->keys[k], strlen(pg->keys[k]), &kp, NULL) == DP_OK
               ? kp.gidx
               : UINT64_MAX;
}

/*
 * copy_page, and when it fails for want of room (the client's memory, the
 * unit's slab: values of a page can be large), each half of the page's rows
 * on its own, down to one row.
 */
static int
copy_split(dp_client *c, uint32_t p, uint32_t u, const page *pg, dp__repair_sum *sum,
           uint64_t *bytes, dp_detail *d)
{
    dp__repair_sum s0 = *sum;
    int rc = copy_page(c, p, u, pg, sum, bytes, d);
    if (rc != DP_ENOMEM && rc != DP_ETOOBIG && rc != DP_EUNITFULL)
        return rc;
    /* Split at a row boundary near the middle; one row cannot be split. */
    uint32_t mid = pg->n / 2;
    dp__key_parts a, b;
    while (mid > 0 &&
           dp__key_split(pg->keys[mid - 1], strlen(pg->keys[mid - 1]), &a, NULL) ==
               DP_OK &&
           dp__key_split(pg->keys[mid], strlen(pg->keys[mid]), &b, NULL) == DP_OK &&
           a.gidx == b.gidx)
        mid--;
    if (mid == 0)
        return rc;
    *sum = s0; /* the halves count again what the whole counted as failed */
    page lo = {pg->keys, pg->vers, mid, 0, false};
    page hi = {pg->keys + mid, pg->vers + mid, pg->n - mid, 0, false};
    uint64_t b1 = 0, b2 = 0;
    int r1 = copy_split(c, p, u, &lo, sum, &b1, d);
    int r2 = copy_split(c, p, u, &hi, sum, &b2, r1 == DP_OK ? d : NULL);
    *bytes = b1 + b2;
    return r1 != DP_OK ? r1 : r2;
}

/*
 * Of the peer's page pg, the keys unit u must be sent (into *want, whose
 * strings are pg's): those u does not hold at the peer's version or a
 * higher one, as u's own listing from the same row on (own) says; a row past
 * the end of own's page (own->more) is not known, and is sent. *held counts
 * the others. Both listings go row by row in gidx order.
 */
static int
want_page(const page *pg, const page *own, page *want, uint64_t *held, dp_detail *d)
{
    memset(want, 0, sizeof *want);
    want->keys = malloc((pg->n > 0 ? pg->n : 1) * sizeof *want->keys);
    want->vers = malloc((pg->n > 0 ? pg->n : 1) * sizeof *want->vers);
    if (want->keys == NULL || want->vers == NULL) {
        free(want->keys);
        free(want->vers);
        return dp__fail(d, DP_ENOMEM, "repair: out of memory");
    }
    uint32_t j = 0; /* own's first key of a row >= the current one */
    for (uint32_t i = 0; i < pg->n; i++) {
        dp__key_parts kp;
        bool send = true;
        if (dp__key_split(pg->keys[i], strlen(pg->keys[i]), &kp, NULL) == DP_OK &&
            !(own->more && kp.gidx >= own->next)) {
            dp__key_parts op;
            while (j < own->n &&
                   dp__key_split(own->keys[j], strlen(own->keys[j]), &op, NULL) ==
                       DP_OK &&
                   op.gidx < kp.gidx)
                j++;
            for (uint32_t k = j; k < own->n; k++) {
                if (dp__key_split(own->keys[k], strlen(own->keys[k]), &op, NULL) !=
                        DP_OK ||
                    op.gidx != kp.gidx)
                    break;
                if (strcmp(own->keys[k], pg->keys[i]) == 0) {
                    send = own->vers[k] < pg->vers[i];
                    break;
                }
            }
        }
        if (!send) {
            (*held)++;
            continue;
        }
        want->keys[want->n] = pg->keys[i];
        want->vers[want->n++] = pg->vers[i];
    }
    return DP_OK;
}

/*
 * Of unit u's own keys (own, listed from the same row as the peer's page pg),
 * those in the rows pg covers that pg lacks: the peer holds no copy of them.
 */
static uint64_t
missing_at_peer(const page *pg, const page *own)
{
    uint64_t n = 0;
    uint32_t j = 0; /* pg's first key of a row >= the current one */
    for (uint32_t i = 0; i < own->n; i++) {
        dp__key_parts kp, pp;
        if (dp__key_split(own->keys[i], strlen(own->keys[i]), &kp, NULL) != DP_OK ||
            (pg->more && kp.gidx >= pg->next))
            continue; /* a later page of the peer's covers it */
        while (j < pg->n &&
               dp__key_split(pg->keys[j], strlen(pg->keys[j]), &pp, NULL) == DP_OK &&
               pp.gidx < kp.gidx)
            j++;
        bool found = false;
        for (uint32_t k = j; k < pg->n && !found; k++) {
            if (dp__key_split(pg->keys[k], strlen(pg->keys[k]), &pp, NULL) != DP_OK ||
                pp.gidx != kp.gidx)
                break;
            found = strcmp(pg->keys[k], own->keys[i]) == 0;
        }
        n += !found;
    }
    return n;
}

/* The keys unit u holds of rows it shares with peer p, from `from` on. */
static uint64_t
count_shared(dp_client *c, uint32_t u, uint32_t p, uint64_t from)
{
    uint64_t n = 0;
    for (bool more = true; more;) {
        page own;
        dp_detail e;
        dp_detail_clear(&e);
        if (list_page(c, u, p, from, 4096, true, &own, &e) != DP_OK)
            break;
        n += own.n;
        more = own.more;
        from = own.next;
        page_fini(&own);
    }
    return n;
}

/* The units that share rows with unit u (R copies on N units), each once. */
static uint32_t
peers_of(uint32_t u, uint32_t N, uint32_t R, uint32_t *out)
{
    uint32_t n = 0;
    for (uint32_t k = 1; k < R; k++) {
        uint32_t cand[2] = {(u + k) % N, (u + N - k) % N};
        for (int j = 0; j < 2; j++) {
            bool seen = cand[j] == u;
            for (uint32_t i = 0; i < n && !seen; i++)
                seen = out[i] == cand[j];
            if (!seen)
                out[n++] = cand[j];
        }
    }
    return n;
}

int
dp__client_repair(dp_client *c, const dp__repair_opts *o, dp__repair_sum *sum,
                  dp_detail *d)
{
    memset(sum, 0, sizeof *sum);
    uint32_t N = dp_client_n_units(c), R = dp_client_replicas(c), u = o->unit;
    uint32_t page_rows = o->page_rows > 0 ? o->page_rows : 64;
    if (u >= N)
        return dp__fail(d, DP_EINVAL, "repair: no unit %u in a cluster of %u", u, N);
    uint32_t peers[2 * 3];
    uint32_t np = R > 1 ? peers_of(u, N, R, peers) : 0;
    int first = DP_OK;
    double t0 = dp__now_s();
    for (uint32_t i = 0; i < np; i++) {
        uint64_t from = 0;
        for (bool more = true;
             more && !(o->stop != NULL && __atomic_load_n(o->stop, __ATOMIC_RELAXED));) {
            page pg;
            dp_detail e;
            dp_detail_clear(&e);
            int rc = list_page(c, peers[i], u, from, page_rows, false, &pg, &e);
            if (rc != DP_OK) {
                DP_LOG_W("repair of unit %u: listing unit %u's rows failed: %s", u,
                         peers[i], dp_detail_msg(&e));
                sum->peers_failed++;
                sum->peers_gone += dp__ctl_peer_gone(c->units[peers[i]].addr);
                sum->under += count_shared(c, u, peers[i], from);
                if (first == DP_OK) {
                    first = rc;
                    if (d != NULL)
                        *d = e;
                }
                break;
            }
            /* What the unit holds of those rows: only what it lacks, or holds
             * at a lower version, is copied (a pass over a unit that holds it
             * all copies nothing). */
            page own = {0}, want = {0};
            int orc = list_page(c, u, peers[i], from, DP_MIN(65536u, 2 * page_rows + 16),
                                true, &own, &e);
            if (orc != DP_OK) {
                DP_LOG_D("repair of unit %u: listing its own rows failed (%s): copying "
                         "the peer's page whole",
                         u, dp_detail_msg(&e));
                dp_detail_clear(&e);
            }
            if (pg.n > 0 && (rc = want_page(&pg, &own, &want, &sum->held, &e)) != DP_OK)
                want = (page){pg.keys, pg.vers, pg.n, 0, false}; /* borrowed: not freed */
            /* What the peer lacks of this unit's keys in the rows its page
             * covers (own pages on, when the first did not reach its end). */
            sum->under += missing_at_peer(&pg, &own);
            for (uint64_t at = own.next;
                 orc == DP_OK && own.more && (!pg.more || at < pg.next);) {
                page o2;
                if (list_page(c, u, peers[i], at, 4096, true, &o2, &e) != DP_OK) {
                    dp_detail_clear(&e);
                    break;
                }
                sum->under += missing_at_peer(&pg, &o2);
                own.more = o2.more;
                at = o2.next;
                page_fini(&o2);
            }
            page_fini(&own);
            uint64_t bytes = 0, k0 = sum->keys, f0 = sum->failed;
            if (want.n > 0 &&
                (rc = copy_split(c, peers[i], u, &want, sum, &bytes, &e)) != DP_OK) {
                DP_LOG_W("repair of unit %u: copying from unit %u: %s", u, peers[i],
                         dp_detail_msg(&e));
                if (first == DP_OK) {
                    first = rc;
                    if (d != NULL)
                        *d = e;
                }
            }
            if (o->progress != NULL)
                o->progress(o->ctx, sum->keys - k0, bytes, sum->failed - f0);
            if (want.keys != pg.keys) {
                free(want.keys); /* its strings are pg's */
                free(want.vers);
            }
            more = pg.more;
            from = pg.next;
            /*
             * The next page's rows: about 50 ms of the rate's bytes (64 MiB
             * without one), from this page's bytes a row, so the throttle
             * spreads the copies instead of letting a page go in one burst.
             */
            uint32_t rows = 0;
            for (uint32_t k = 0; k < pg.n; k++)
                rows += k == 0 || row_of(&pg, k) != row_of(&pg, k - 1);
            if (rows > 0 && bytes > 0) {
                double target =
                    o->rate_bytes_s > 0 ? o->rate_bytes_s * 0.05 : 64.0 * (1 << 20);
                double per_row = (double)bytes / rows;
                page_rows = (uint32_t)DP_MAX(1.0, DP_MIN(4096.0, target / per_row));
            }
            page_fini(&pg);
            /* Throttled: at most rate_bytes_s on average since the start (in
             * steps of 0.1 s at most, so a stop is seen). */
            while (o->rate_bytes_s > 0 &&
                   !(o->stop != NULL && __atomic_load_n(o->stop, __ATOMIC_RELAXED))) {
                double due = t0 + (double)sum->bytes / o->rate_bytes_s - dp__now_s();
                if (!(due > 0))
                    break;
                dp__sleep_s(DP_MIN(due, 0.1));
            }
        }
    }
    if (first == DP_OK && sum->failed > 0)
        first =
            dp__fail(d, DP_ETRANSFER, "repair of unit %u: %" PRIu64 " keys not copied", u,
                     sum->failed);
    return first;
}
