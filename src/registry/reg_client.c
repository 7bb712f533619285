/*
 * The unit registry (see registry.h), a client's side: reading a cluster
 * from the records (dp__reg_load, and dp__reg_resolve over a registry or a
 * cluster file), the watch that follows units that restart or move, and the
 * operator's list. Records and URLs are reg_record.c; a unit's registration
 * is reg_unit.c.
 *
 * Design notes
 * - Locks: dp__reg_watch.mu guards the table. It is never held across an
 *   etcd call.
 */
#include "registry/registry.h"

#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define WATCH_IDLE_S 60.0 /* a watch silent this long is read afresh */

/* ---- reading a cluster ---- */

/* "2, 5, 7" (at most 16, then "and K more") of the ids missing in have[0..n). */
static void
missing_ids(const bool *have, uint32_t n, char *buf, size_t cap)
{
    size_t len = 0;
    uint32_t shown = 0, more = 0;
    buf[0] = '\0';
    for (uint32_t i = 0; i < n; i++) {
        if (have[i])
            continue;
        if (shown == 16) {
            more++;
            continue;
        }
        int k = snprintf(buf + len, cap - len, "%s%" PRIu32, shown ? ", " : "", i);
        if (k > 0)
            len = DP_MIN(cap - 1, len + (size_t)k);
        shown++;
    }
    if (more > 0)
        snprintf(buf + len, cap - len, " and %" PRIu32 " more", more);
}

/*
 * One read of the records: out filled when all N are there and valid (DP_OK);
 * DP_ENOTFOUND / DP_EPROTO with d saying what is missing or wrong.
 */
static int
load_once(const dp__reg_url *u, dp__etcd *e, dp__cluster *out, int64_t *revision,
          dp_detail *d)
{
    char prefix[DP_REG_KEY_MAX];
    dp__reg_prefix(u, prefix, sizeof prefix);
    dp__etcd_kvs kvs;
    int rc = dp__etcd_range(e, prefix, true, &kvs, d);
    if (rc != DP_OK)
        return rc;
    uint32_t n = 0;
    dp__reg_record *recs = calloc(DP_MAX(kvs.n, 1), sizeof *recs);
    bool *have = NULL;
    if (recs == NULL) {
        rc = dp__fail(d, DP_ENOMEM, "registry: out of memory");
        goto out;
    }
    const char *n_key = NULL;
    uint32_t reps = 0;
    dp_detail bad;
    dp_detail_clear(&bad);
    int n_bad = 0;
    for (size_t i = 0; i < kvs.n; i++) {
        dp_detail why;
        dp_detail_clear(&why);
        if (dp__reg_record_decode(u, kvs.kv[i].key, kvs.kv[i].value, kvs.kv[i].value_len,
                                  &recs[i], &why) != DP_OK) {
            recs[i].n_units = 0; /* skipped */
            if (n_bad++ == 0)
                bad = why;
            continue;
        }
        if (n == 0) {
            n = recs[i].n_units;
            reps = recs[i].replicas;
            n_key = kvs.kv[i].key;
        } else if (recs[i].replicas != reps || recs[i].n_units != n) {
            bool r = recs[i].replicas != reps; /* else the number of units */
            rc = dp__fail(
                d, DP_EPROTO,
                "registry %s: records disagree on %s: %s says %" PRIu32
                ", %s says %" PRIu32 " (a unit started with the wrong %s: stop it)",
                u->text, r ? "the copies of each row" : "the number of units", n_key,
                r ? reps : n, kvs.kv[i].key, r ? recs[i].replicas : recs[i].n_units,
                r ? "--replicas" : "--units");
            goto out;
        }
    }
    if (n == 0) {
        if (n_bad > 0)
            rc = dp__fail(d, DP_EPROTO, "registry %s: %s%s", u->text, dp_detail_msg(&bad),
                          n_bad > 1 ? " (and more malformed records)" : "");
        else
            rc = dp__fail(d, DP_ENOTFOUND,
                          "no unit is registered in %s (keys %s*): start units with "
                          "'dataplane unit --registry %s --unit-id K --units N' (or "
                          "'dataplane up --registry %s')",
                          u->text, prefix, u->text, u->text);
        goto out;
    }
    have = calloc(n, sizeof *have);
    out->units = calloc(n, sizeof *out->units);
    if (have == NULL || out->units == NULL) {
        rc = dp__fail(d, DP_ENOMEM, "registry: out of memory");
        goto out;
    }
    uint32_t got = 0;
    for (size_t i = 0; i < kvs.n; i++) {
        const dp__reg_record *r = &recs[i];
        if (r->n_units == 0 || have[r->id])
            continue;
        have[r->id] = true;
        got++;
        dp__cluster_unit *cu = &out->units[r->id];
        cu->id = r->id;
        snprintf(cu->zmq, sizeof cu->zmq, "%s", r->zmq);
        snprintf(cu->agent, sizeof cu->agent, "%s", r->agent);
        cu->incarnation = r->incarnation;
        cu->pid = 0; /* maybe another machine's */
        snprintf(cu->pubkey, sizeof cu->pubkey, "%s", r->pubkey);
    }
    if (got < n) {
        char ids[160];
        missing_ids(have, n, ids, sizeof ids);
        rc = dp__fail(
            d, DP_ENOTFOUND,
            "registry %s: %" PRIu32 " of %" PRIu32 " units registered; unit%s %s "
            "missing%s%s (start them with 'dataplane unit --registry %s --unit-id K "
            "--units %" PRIu32 "')",
            u->text, got, n, n - got > 1 ? "s" : "", ids, n_bad > 0 ? "; " : "",
            n_bad > 0 ? dp_detail_msg(&bad) : "", u->text, n);
        goto out;
    }
    out->n_units = n;
    out->replicas = reps;
    snprintf(out->cluster_id, sizeof out->cluster_id, "%s", u->name);
    if (revision != NULL)
        *revision = kvs.revision;
    rc = DP_OK;
out:
    if (rc != DP_OK) {
        free(out->units);
        memset(out, 0, sizeof *out);
    }
    free(have);
    free(recs);
    dp__etcd_kvs_fini(&kvs);
    return rc;
}

int
dp__reg_load(const dp__reg_url *u, double budget_s, dp__cluster *out, int64_t *revision,
             dp_detail *d)
{
    memset(out, 0, sizeof *out);
    double deadline = dp__now_s() + budget_s;
    dp__etcd *e = NULL;
    int rc = dp__etcd_create(u->endpoints, DP_MAX(0.5, DP_MIN(budget_s, 5.0)), &e, d);
    if (rc != DP_OK)
        return rc;
    bool said = false;
    for (;;) {
        rc = load_once(u, e, out, revision, d);
        if (rc == DP_OK || rc == DP_ENOMEM || dp__now_s() >= deadline)
            break;
        /* Records disagreeing on N do not fix themselves quickly; still wait:
         * the wrong unit's record goes when it is stopped. */
        if (!said && dp__now_s() + 0.5 < deadline) {
            DP_LOG_I("registry: waiting up to %.0f s: %s", deadline - dp__now_s(),
                     dp_detail_msg(d));
            said = true;
        }
        dp__sleep_s(DP_MIN(0.2, dp__left_s(deadline)));
    }
    dp__etcd_destroy(e);
    if (rc != DP_OK && budget_s > 0)
        dp__fail_ctx(d, rc, "after waiting %.1f s", budget_s);
    return rc;
}

int
dp__reg_resolve(const char *arg, double budget_s, dp__cluster *out, char *where,
                size_t cap, dp_detail *d)
{
    memset(out, 0, sizeof *out);
    const char *p = arg;
    if (p == NULL || *p == '\0')
        p = getenv("DP_CLUSTER");
    if (dp__reg_is_url(p)) {
        snprintf(where, cap, "%s", p);
        dp__reg_url u;
        int rc = dp__reg_url_parse(p, &u, d);
        if (rc == DP_OK)
            rc = dp__reg_load(&u, budget_s, out, &out->revision, d);
        if (rc == DP_OK)
            snprintf(out->registry, sizeof out->registry, "%s", u.text);
        return rc;
    }
    char path[PATH_MAX];
    int rc = dp__cluster_locate(p, path, sizeof path, d);
    if (rc != DP_OK)
        return rc;
    snprintf(where, cap, "%s", path);
    return dp__cluster_load(path, out, d);
}

/* ---- a client's watch ---- */

struct dp__reg_watch {
    dp__reg_url u;
    uint32_t n;
    dp__etcd *e;
    pthread_t th;
    pthread_mutex_t mu;
    dp__reg_record *recs; /* n */
    bool *have;           /* n */
    int64_t from;         /* watch after this revision */
    _Atomic uint64_t gen;
    atomic_bool stop;
};

/* Apply one record (or its delete) at key to the table. */
static void
watch_apply(dp__reg_watch *w, bool deleted, const char *key, const char *value,
            size_t len)
{
    char prefix[DP_REG_KEY_MAX];
    dp__reg_prefix(&w->u, prefix, sizeof prefix);
    size_t pl = strlen(prefix);
    uint64_t id = 0;
    char canon[DP_REG_KEY_MAX] = "";
    if (strncmp(key, prefix, pl) == 0 &&
        dp__parse_u64(key + pl, 0, UINT32_MAX, &id, "id", NULL) == DP_OK && id < w->n)
        dp__reg_key(&w->u, (uint32_t)id, canon, sizeof canon);
    if (strcmp(canon, key) != 0) {
        DP_LOG_W("registry: ignoring key %s (not a unit of this %" PRIu32
                 "-unit cluster)",
                 key, w->n);
        return;
    }
    dp__reg_record r;
    if (!deleted) {
        dp_detail why;
        dp_detail_clear(&why);
        if (dp__reg_record_decode(&w->u, key, value, len, &r, &why) != DP_OK) {
            DP_LOG_W("registry: ignoring %s", dp_detail_msg(&why));
            deleted = true; /* no valid record there now */
        } else if (r.n_units != w->n) {
            DP_LOG_W("registry: ignoring %s: it says the cluster has %" PRIu32
                     " units, this client opened %" PRIu32,
                     key, r.n_units, w->n);
            return;
        }
    }
    pthread_mutex_lock(&w->mu);
    if (deleted) {
        w->have[id] = false;
    } else {
        w->recs[id] = r;
        w->have[id] = true;
    }
    pthread_mutex_unlock(&w->mu);
    atomic_fetch_add(&w->gen, 1);
}

static int
watch_event(void *ctx, bool deleted, const dp__etcd_kv *kv, int64_t revision)
{
    dp__reg_watch *w = ctx;
    watch_apply(w, deleted, kv->key, kv->value, kv->value_len);
    if (revision > w->from)
        w->from = revision;
    return 0;
}

/* Read every record afresh (after etcd came back): the table, and w->from. */
static int
watch_reload(dp__reg_watch *w, dp_detail *d)
{
    char prefix[DP_REG_KEY_MAX];
    dp__reg_prefix(&w->u, prefix, sizeof prefix);
    dp__etcd_kvs kvs;
    int rc = dp__etcd_range(w->e, prefix, true, &kvs, d);
    if (rc != DP_OK)
        return rc;
    bool *seen = calloc(w->n, sizeof *seen);
    if (seen == NULL) {
        dp__etcd_kvs_fini(&kvs);
        return dp__fail(d, DP_ENOMEM, "registry: out of memory");
    }
    for (size_t i = 0; i < kvs.n; i++) {
        watch_apply(w, false, kvs.kv[i].key, kvs.kv[i].value, kvs.kv[i].value_len);
        for (uint32_t id = 0; id < w->n; id++) {
            char k[DP_REG_KEY_MAX];
            dp__reg_key(&w->u, id, k, sizeof k);
            if (strcmp(k, kvs.kv[i].key) == 0)
                seen[id] = true;
        }
    }
    pthread_mutex_lock(&w->mu);
    for (uint32_t i = 0; i < w->n; i++)
        if (!seen[i])
            w->have[i] = false;
    pthread_mutex_unlock(&w->mu);
    atomic_fetch_add(&w->gen, 1);
    w->from = kvs.revision;
    free(seen);
    dp__etcd_kvs_fini(&kvs);
    return DP_OK;
}

static void *
watch_main(void *arg)
{
    dp__reg_watch *w = arg;
    bool lost = false, reload = false;
    while (!atomic_load(&w->stop)) {
        dp_detail d;
        dp_detail_clear(&d);
        int rc = DP_OK;
        if (reload)
            rc = watch_reload(w, &d);
        if (rc == DP_OK) {
            if (lost)
                DP_LOG_I("registry %s answers again; following it", w->u.text);
            lost = false;
            reload = false;
            char prefix[DP_REG_KEY_MAX];
            dp__reg_prefix(&w->u, prefix, sizeof prefix);
            rc = dp__etcd_watch(w->e, prefix, w->from + 1, WATCH_IDLE_S, watch_event, w,
                                &d);
        }
        if (rc == DP_ECANCELED || atomic_load(&w->stop))
            break;
        if (rc == DP_ETIMEDOUT && !lost && !reload) {
            /* Silent for a while: read afresh, which also finds a stream
             * that stalled without breaking. */
            reload = true;
            continue;
        }
        if (!lost)
            DP_LOG_W("registry %s: %s; serving on with the units known, watching again "
                     "when etcd answers",
                     w->u.text, dp_detail_msg(&d));
        lost = true;
        reload = true;
        for (int i = 0; i < 10 && !atomic_load(&w->stop); i++)
            dp__sleep_s(0.1);
    }
    return NULL;
}

int
dp__reg_watch_start(const dp__reg_url *u, uint32_t n_units, int64_t from_rev,
                    dp__reg_watch **out, dp_detail *d)
{
    *out = NULL;
    dp__reg_watch *w = calloc(1, sizeof *w);
    if (w == NULL)
        return dp__fail(d, DP_ENOMEM, "registry: out of memory");
    w->u = *u;
    w->n = n_units;
    w->from = from_rev;
    atomic_init(&w->gen, 0);
    atomic_init(&w->stop, false);
    pthread_mutex_init(&w->mu, NULL);
    w->recs = calloc(n_units, sizeof *w->recs);
    w->have = calloc(n_units, sizeof *w->have);
    int rc = w->recs == NULL || w->have == NULL
                 ? dp__fail(d, DP_ENOMEM, "registry: out of memory")
                 : dp__etcd_create(u->endpoints, 2.0, &w->e, d);
    if (rc == DP_OK && pthread_create(&w->th, NULL, watch_main, w) != 0)
        rc = dp__fail(d, DP_ESYS, "registry: cannot start its watch thread");
    if (rc != DP_OK) {
        dp__etcd_destroy(w->e);
        free(w->recs);
        free(w->have);
        pthread_mutex_destroy(&w->mu);
        free(w);
        return rc;
    }
    *out = w;
    return DP_OK;
}

uint64_t
dp__reg_watch_gen(const dp__reg_watch *w)
{
    return atomic_load(&((dp__reg_watch *)w)->gen);
}

bool
dp__reg_watch_get(dp__reg_watch *w, uint32_t id, dp__reg_record *out)
{
    if (id >= w->n)
        return false;
    pthread_mutex_lock(&w->mu);
    bool have = w->have[id];
    if (have)
        *out = w->recs[id];
    pthread_mutex_unlock(&w->mu);
    return have;
}

void
dp__reg_watch_stop(dp__reg_watch *w)
{
    if (w == NULL)
        return;
    atomic_store(&w->stop, true);
    dp__etcd_watch_stop(w->e);
    pthread_join(w->th, NULL);
    dp__etcd_destroy(w->e);
    free(w->recs);
    free(w->have);
    pthread_mutex_destroy(&w->mu);
    free(w);
}

/* ---- the operator's view ---- */

int
dp__reg_list(const dp__reg_url *u, double timeout_s, dp__reg_entry **entries, size_t *n,
             dp_detail *d)
{
    *entries = NULL;
    *n = 0;
    dp__etcd *e = NULL;
    int rc = dp__etcd_create(u->endpoints, timeout_s, &e, d);
    if (rc != DP_OK)
        return rc;
    char prefix[DP_REG_KEY_MAX];
    dp__reg_prefix(u, prefix, sizeof prefix);
    dp__etcd_kvs kvs;
    if ((rc = dp__etcd_range(e, prefix, true, &kvs, d)) != DP_OK) {
        dp__etcd_destroy(e);
        return rc;
    }
    dp__reg_entry *es = calloc(DP_MAX(kvs.n, 1), sizeof *es);
    if (es == NULL)
        rc = dp__fail(d, DP_ENOMEM, "registry: out of memory");
    for (size_t i = 0; rc == DP_OK && i < kvs.n; i++) {
        dp__reg_entry *x = &es[i];
        const dp__etcd_kv *kv = &kvs.kv[i];
        snprintf(x->key, sizeof x->key, "%s", kv->key);
        dp_detail why;
        dp_detail_clear(&why);
        x->valid = dp__reg_record_decode(u, kv->key, kv->value, kv->value_len, &x->r,
                                         &why) == DP_OK;
        if (!x->valid)
            snprintf(x->why, sizeof x->why, "%s", dp_detail_msg(&why));
        x->lease = kv->lease;
        x->ttl_left = -1;
        if (kv->lease != 0)
            rc = dp__etcd_lease_ttl(e, kv->lease, &x->ttl_left, d);
    }
    size_t count = kvs.n;
    dp__etcd_kvs_fini(&kvs);
    dp__etcd_destroy(e);
    if (rc != DP_OK) {
        free(es);
        return rc;
    }
    *entries = es;
    *n = count;
    return DP_OK;
}
