/*
 * The unit registry (see registry.h): records, reading a cluster from them,
 * a unit's registration and a client's watch.
 *
 * Design notes
 * - A unit's claim on its id: the key is created only if absent (a
 *   transaction on its create revision), or replaced only at the mod
 *   revision the unit saw (so two units racing for one id cannot both win).
 *   A record of another incarnation is replaced only when that unit does not
 *   answer at its address: a unit SIGKILLed and started again comes back at
 *   once instead of waiting out its old lease, and a live unit is never
 *   pushed out by a second one given the same id.
 * - A unit that lost its record to another incarnation (it was partitioned
 *   from the one that took over) says so as an error and stops renewing;
 *   clients that follow the registry go to the new one.
 * - Locks: dp__reg_unit.mu guards stop (the cond wakes the thread);
 *   dp__reg_watch.mu guards the table. Neither is held across an etcd call.
 */
#include "registry/registry.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define REG_VERSION 1
#define WATCH_IDLE_S 60.0 /* a watch silent this long is read afresh */

bool
dp__reg_is_url(const char *s)
{
    return s != NULL && strncmp(s, DP_REG_SCHEME, strlen(DP_REG_SCHEME)) == 0;
}

int
dp__reg_url_parse(const char *s, dp__reg_url *u, dp_detail *d)
{
    memset(u, 0, sizeof *u);
    if (!dp__reg_is_url(s))
        return dp__fail(d, DP_EINVAL, "registry '%s' is not etcd://HOST:PORT/NAME",
                        s != NULL ? s : "(null)");
    if (strlen(s) >= sizeof u->text)
        return dp__fail(d, DP_EINVAL, "registry URL is longer than %zu bytes",
                        sizeof u->text - 1);
    snprintf(u->text, sizeof u->text, "%s", s);
    const char *hosts = s + strlen(DP_REG_SCHEME);
    const char *slash = strchr(hosts, '/');
    if (slash == NULL || slash == hosts)
        return dp__fail(d, DP_EINVAL,
                        "registry '%s' needs etcd's address and a cluster name: "
                        "etcd://HOST:PORT[,HOST:PORT...]/NAME",
                        s);
    size_t hn = (size_t)(slash - hosts);
    if (hn >= sizeof u->endpoints)
        return dp__fail(d, DP_EINVAL, "registry '%s': the etcd endpoints are too long",
                        s);
    memcpy(u->endpoints, hosts, hn);
    const char *name = slash + 1;
    if (!dp__id_valid(name, strlen(name), sizeof u->name - 1))
        return dp__fail(d, DP_EINVAL,
                        "registry '%s': the cluster name '%s' must be 1..%zu bytes of "
                        "[A-Za-z0-9_.:-]",
                        s, name, sizeof u->name - 1);
    snprintf(u->name, sizeof u->name, "%s", name);
    /* Check the endpoints the way the etcd client will read them. */
    dp__etcd *e = NULL;
    int rc = dp__etcd_create(u->endpoints, 1.0, &e, d);
    dp__etcd_destroy(e);
    if (rc != DP_OK)
        return dp__fail_ctx(d, rc, "registry '%s'", s);
    return DP_OK;
}

void
dp__reg_prefix(const dp__reg_url *u, char *buf, size_t cap)
{
    snprintf(buf, cap, "dataplane/%s/units/", u->name);
}

void
dp__reg_key(const dp__reg_url *u, uint32_t id, char *buf, size_t cap)
{
    snprintf(buf, cap, "dataplane/%s/units/%" PRIu32, u->name, id);
}

/* ---- records ---- */

static bool
add_hex64(cJSON *o, const char *name, uint64_t v)
{
    char s[17];
    snprintf(s, sizeof s, "%016" PRIx64, v);
    return cJSON_AddStringToObject(o, name, s) != NULL;
}

int
dp__reg_record_encode(const dp__reg_record *r, dp__buf *out, dp_detail *d)
{
    cJSON *o = cJSON_CreateObject();
    bool ok = o != NULL && cJSON_AddNumberToObject(o, "version", REG_VERSION) &&
              cJSON_AddStringToObject(o, "cluster", r->cluster) &&
              cJSON_AddNumberToObject(o, "id", r->id) &&
              cJSON_AddNumberToObject(o, "units", r->n_units) &&
              cJSON_AddStringToObject(o, "zmq", r->zmq) &&
              cJSON_AddStringToObject(o, "agent", r->agent) &&
              add_hex64(o, "incarnation", r->incarnation) &&
              cJSON_AddNumberToObject(o, "pid", (double)r->pid) &&
              cJSON_AddStringToObject(o, "host", r->host) &&
              cJSON_AddNumberToObject(o, "slab_bytes", (double)r->slab_bytes) &&
              cJSON_AddNumberToObject(o, "ssd_bytes", (double)r->ssd_bytes) &&
              cJSON_AddStringToObject(o, "transports", r->transports) &&
              cJSON_AddStringToObject(o, "pubkey", r->pubkey) &&
              cJSON_AddNumberToObject(o, "started", (double)(int64_t)r->started);
    char *s = ok ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    if (s == NULL || dp__buf_append(out, s, strlen(s)) != 0) {
        cJSON_free(s);
        return dp__fail(d, DP_ENOMEM, "registry: out of memory");
    }
    cJSON_free(s);
    return DP_OK;
}

/* Field checks of a record; each failure names the key and the field. */
static int
rec_str(const cJSON *o, const char *f, char *dst, size_t cap, bool may_be_empty,
        const char *key, dp_detail *d)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, f);
    if (!cJSON_IsString(v))
        return dp__fail(d, DP_EPROTO, "registry record %s: \"%s\" must be a string", key,
                        f);
    size_t n = strlen(v->valuestring);
    if ((n == 0 && !may_be_empty) || n >= cap)
        return dp__fail(d, DP_EPROTO, "registry record %s: \"%s\" must be %s..%zu bytes",
                        key, f, may_be_empty ? "0" : "1", cap - 1);
    for (size_t k = 0; k < n; k++)
        if ((unsigned char)v->valuestring[k] < 0x20 || v->valuestring[k] == 0x7f)
            return dp__fail(d, DP_EPROTO,
                            "registry record %s: \"%s\" has a control character", key, f);
    memcpy(dst, v->valuestring, n + 1);
    return DP_OK;
}

static int
rec_num(const cJSON *o, const char *f, double lo, double hi, double *out, const char *key,
        dp_detail *d)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, f);
    /* The range first: converting a double outside int64's is undefined. */
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= lo && v->valuedouble <= hi) ||
        v->valuedouble != (double)(int64_t)v->valuedouble)
        return dp__fail(d, DP_EPROTO,
                        "registry record %s: \"%s\" must be an integer in [%.0f, %.0f]",
                        key, f, lo, hi);
    *out = v->valuedouble;
    return DP_OK;
}

int
dp__reg_record_decode(const dp__reg_url *u, const char *key, const char *json, size_t len,
                      dp__reg_record *r, dp_detail *d)
{
    memset(r, 0, sizeof *r);
    cJSON *o = cJSON_ParseWithLength(json, len);
    if (!cJSON_IsObject(o)) {
        cJSON_Delete(o);
        return dp__fail(d, DP_EPROTO, "registry record %s is not a JSON object", key);
    }
    double ver = 0, id = 0, n = 0, pid = 0, slab = 0, ssd = 0, started = 0;
    char inc[17];
    int rc;
    if ((rc = rec_num(o, "version", REG_VERSION, REG_VERSION, &ver, key, d)) != 0 ||
        (rc = rec_str(o, "cluster", r->cluster, sizeof r->cluster, false, key, d)) != 0 ||
        (rc = rec_num(o, "id", 0, DP_CLUSTER_MAX_UNITS - 1, &id, key, d)) != 0 ||
        (rc = rec_num(o, "units", 1, DP_CLUSTER_MAX_UNITS, &n, key, d)) != 0 ||
        (rc = rec_str(o, "zmq", r->zmq, sizeof r->zmq, false, key, d)) != 0 ||
        (rc = rec_str(o, "agent", r->agent, sizeof r->agent, false, key, d)) != 0 ||
        (rc = rec_str(o, "incarnation", inc, sizeof inc, false, key, d)) != 0 ||
        (rc = rec_num(o, "pid", 0, 4194304, &pid, key, d)) != 0 ||
        (rc = rec_str(o, "host", r->host, sizeof r->host, true, key, d)) != 0 ||
        (rc = rec_num(o, "slab_bytes", 0, 9007199254740992.0, &slab, key, d)) != 0 ||
        (rc = rec_num(o, "ssd_bytes", 0, 9007199254740992.0, &ssd, key, d)) != 0 ||
        (rc = rec_str(o, "transports", r->transports, sizeof r->transports, true, key,
                      d)) != 0 ||
        (rc = rec_str(o, "pubkey", r->pubkey, sizeof r->pubkey, true, key, d)) != 0 ||
        (rc = rec_num(o, "started", 0, 1e11, &started, key, d)) != 0)
        goto out;
    r->id = (uint32_t)id;
    r->n_units = (uint32_t)n;
    r->pid = (int64_t)pid;
    r->slab_bytes = (uint64_t)slab;
    r->ssd_bytes = (uint64_t)ssd;
    r->started = started;
    rc = DP_EPROTO;
    char want[DP_REG_KEY_MAX];
    dp__reg_key(u, r->id, want, sizeof want);
    if (strcmp(r->cluster, u->name) != 0) {
        dp__fail(d, rc, "registry record %s names cluster '%s', not '%s'", key,
                 r->cluster, u->name);
        goto out;
    }
    if (strcmp(want, key) != 0) {
        dp__fail(d, rc, "registry record %s says it is unit %" PRIu32 " (key %s)", key,
                 r->id, want);
        goto out;
    }
    if (r->id >= r->n_units) {
        dp__fail(d, rc, "registry record %s: unit %" PRIu32 " of %" PRIu32 " units", key,
                 r->id, r->n_units);
        goto out;
    }
    const char *colon = strrchr(r->zmq, ':');
    if (strncmp(r->zmq, "tcp://", 6) != 0 || colon == NULL || colon <= r->zmq + 6 ||
        colon[1] == '\0') {
        dp__fail(d, rc, "registry record %s: \"zmq\" '%s' is not tcp://host:port", key,
                 r->zmq);
        goto out;
    }
    /* A CURVE public key: 40 characters of Z85's alphabet, or none. */
    size_t pkn = strlen(r->pubkey);
    bool pk_ok = pkn == 0 || pkn == 40;
    for (size_t k = 0; pk_ok && k < pkn; k++)
        pk_ok = strchr("0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                       ".-:+=^!/*?&<>()[]{}@%$#",
                       r->pubkey[k]) != NULL;
    if (!pk_ok) {
        dp__fail(d, rc,
                 "registry record %s: \"pubkey\" is not a CURVE public key (40 Z85 "
                 "characters)",
                 key);
        goto out;
    }
    bool hex = strlen(inc) == 16;
    for (int k = 0; hex && k < 16; k++) {
        char c = inc[k];
        int x = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        hex = x >= 0;
        r->incarnation = r->incarnation << 4 | (uint64_t)(x >= 0 ? x : 0);
    }
    if (!hex || r->incarnation == 0) {
        dp__fail(d, rc,
                 "registry record %s: \"incarnation\" must be 16 lowercase hex digits, "
                 "not all zero",
                 key);
        goto out;
    }
    rc = DP_OK;
out:
    cJSON_Delete(o);
    return rc;
}

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
            n_key = kvs.kv[i].key;
        } else if (recs[i].n_units != n) {
            rc = dp__fail(d, DP_EPROTO,
                          "registry %s: records disagree on the number of units: %s says "
                          "%" PRIu32 ", %s says %" PRIu32
                          " (a unit started with the wrong --units: stop it)",
                          u->text, n_key, n, kvs.kv[i].key, recs[i].n_units);
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

/* ---- a unit's registration ---- */

struct dp__reg_unit {
    dp__reg_url u;
    dp__reg_record self;
    dp__reg_unit_opts o;
    char key[DP_REG_KEY_MAX];
    dp__buf value;
    dp__etcd *e;
    int64_t lease;
    pthread_t th;
    bool started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool stop;
};

/* Is the holder of a record alive? Without a probe: assume so. */
static int
holder_alive(dp__reg_unit *r, const dp__reg_record *h, char *why, size_t cap)
{
    if (r->o.probe == NULL) {
        snprintf(why, cap, "no probe");
        return 1;
    }
    return r->o.probe(r->o.probe_ctx, h, why, cap);
}

/*
 * A live unit of the cluster registered before this one with another N:
 * DP_EINVAL naming it, after withdrawing this unit's record.
 */
static int
check_n(dp__reg_unit *r, dp_detail *d)
{
    char prefix[DP_REG_KEY_MAX];
    dp__reg_prefix(&r->u, prefix, sizeof prefix);
    dp__etcd_kvs kvs;
    int rc = dp__etcd_range(r->e, prefix, true, &kvs, d);
    if (rc != DP_OK)
        return rc;
    int64_t mine = 0, mine_mod = 0;
    for (size_t i = 0; i < kvs.n; i++)
        if (strcmp(kvs.kv[i].key, r->key) == 0) {
            mine = kvs.kv[i].create_rev;
            mine_mod = kvs.kv[i].mod_rev;
        }
    for (size_t i = 0; rc == DP_OK && i < kvs.n; i++) {
        dp__reg_record o;
        const dp__etcd_kv *kv = &kvs.kv[i];
        if (strcmp(kv->key, r->key) == 0 ||
            dp__reg_record_decode(&r->u, kv->key, kv->value, kv->value_len, &o, NULL) !=
                0 ||
            o.n_units == r->self.n_units || (mine != 0 && kv->create_rev > mine))
            continue;
        char why[256];
        if (holder_alive(r, &o, why, sizeof why) != 1)
            continue;
        bool done;
        dp__etcd_delete_if(r->e, r->key, mine_mod, &done, NULL);
        rc =
            dp__fail(d, DP_EINVAL,
                     "cluster %s has %" PRIu32 " units (unit %" PRIu32
                     " at %s, pid %" PRId64 " on %s, registered under %s, says so); this "
                     "unit was started with --units %" PRIu32 ": give it --units %" PRIu32
                     ", or use another cluster name",
                     r->u.name, o.n_units, o.id, o.zmq, o.pid, o.host[0] ? o.host : "?",
                     kv->key, r->self.n_units, o.n_units);
    }
    dp__etcd_kvs_fini(&kvs);
    return rc;
}

/*
 * One attempt to hold the key under r->lease (granting a lease first when
 * there is none): DP_OK, DP_EEXIST / DP_EINVAL (refused: d says why),
 * DP_EBUSY (lost a race: try again), or an etcd error.
 */
static int
claim_once(dp__reg_unit *r, dp_detail *d)
{
    int rc;
    if (r->lease != 0) {
        /* It may have run out while etcd was out of reach: then a new one. */
        int64_t ttl = 0;
        if ((rc = dp__etcd_lease_keepalive(r->e, r->lease, &ttl, d)) != DP_OK)
            return rc;
        if (ttl <= 0)
            r->lease = 0;
    }
    if (r->lease == 0 &&
        (rc = dp__etcd_lease_grant(r->e, (int64_t)r->o.ttl_s, &r->lease, d)) != DP_OK)
        return rc;
    dp__etcd_kvs kvs;
    if ((rc = dp__etcd_range(r->e, r->key, false, &kvs, d)) != DP_OK)
        return rc;
    int64_t mod = 0;
    if (kvs.n == 1) {
        const dp__etcd_kv *kv = &kvs.kv[0];
        mod = kv->mod_rev;
        dp__reg_record h;
        dp_detail why;
        dp_detail_clear(&why);
        if (dp__reg_record_decode(&r->u, kv->key, kv->value, kv->value_len, &h, &why) !=
            0) {
            DP_LOG_W("registry: replacing the malformed record at %s: %s", r->key,
                     dp_detail_msg(&why));
        } else if (h.incarnation != r->self.incarnation) {
            char seen[256] = "";
            if (holder_alive(r, &h, seen, sizeof seen) == 1) {
                rc = dp__fail(d, DP_EEXIST,
                              "unit %" PRIu32 " of cluster %s is already served by "
                              "incarnation %016" PRIx64 " at %s (pid %" PRId64
                              " on %s); this one (%s) would be a second unit %" PRIu32
                              ": stop the other, or give this one another --unit-id",
                              r->self.id, r->u.name, h.incarnation, h.zmq, h.pid,
                              h.host[0] ? h.host : "?", r->self.zmq, r->self.id);
                dp__etcd_kvs_fini(&kvs);
                return rc;
            }
            DP_LOG_W("registry: taking over unit %" PRIu32 "'s record from incarnation "
                     "%016" PRIx64 " at %s (%s)",
                     r->self.id, h.incarnation, h.zmq, seen);
        }
    }
    dp__etcd_kvs_fini(&kvs);
    bool done = false;
    rc = dp__etcd_put_if(r->e, r->key, (const char *)r->value.data, r->lease, mod, &done,
                         d);
    if (rc != DP_OK)
        return rc;
    if (!done)
        return dp__fail(d, DP_EBUSY, "registry: %s changed while claiming it", r->key);
    return check_n(r, d);
}

/* Whether the thread should stop; waits up to s seconds for that first. */
static bool
wait_stop(dp__reg_unit *r, double s)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts); /* the cond's clock (reg_unit_start) */
    double t = (double)ts.tv_sec + ts.tv_nsec / 1e9 + s;
    ts.tv_sec = (time_t)t;
    ts.tv_nsec = (long)((t - (double)ts.tv_sec) * 1e9);
    pthread_mutex_lock(&r->mu);
    while (!r->stop)
        if (pthread_cond_timedwait(&r->cv, &r->mu, &ts) != 0)
            break;
    bool stop = r->stop;
    pthread_mutex_unlock(&r->mu);
    return stop;
}

/* Claim until done, refused, or (deadline > 0) past the deadline. */
static int
claim(dp__reg_unit *r, double deadline, dp_detail *d)
{
    bool said = false;
    for (unsigned k = 0;; k++) {
        int rc = claim_once(r, d);
        if (rc == DP_OK || rc == DP_EEXIST || rc == DP_EINVAL || rc == DP_ENOMEM)
            return rc;
        if (deadline > 0 && dp__now_s() >= deadline)
            return rc;
        if (rc != DP_EBUSY && !said) {
            DP_LOG_W("registry %s: %s; retrying%s", r->u.text, dp_detail_msg(d),
                     deadline > 0 ? " within the start budget" : "");
            said = true;
        }
        /* Sleep in short slices: a stop request must not wait out a step. */
        double step = dp__backoff_step(0.2, 2.0, k);
        for (double slept = 0; slept < step; slept += 0.1) {
            if (wait_stop(r, 0.1) ||
                (r->o.cancelled != NULL && r->o.cancelled(r->o.probe_ctx)))
                return dp__fail(d, DP_ECANCELED, "registry: stopped while registering");
        }
    }
}

static void *
keepalive_main(void *arg)
{
    dp__reg_unit *r = arg;
    double period = DP_MAX(0.3, r->o.ttl_s / 3);
    bool lost_etcd = false;
    while (!wait_stop(r, period)) {
        dp_detail d;
        dp_detail_clear(&d);
        int64_t ttl = 0;
        int rc = dp__etcd_lease_keepalive(r->e, r->lease, &ttl, &d);
        dp__etcd_kvs kvs = {0};
        if (rc == DP_OK && ttl > 0)
            rc = dp__etcd_range(r->e, r->key, false, &kvs, &d);
        if (rc != DP_OK) {
            if (!lost_etcd)
                DP_LOG_W(
                    "registry %s unreachable (%s): serving on; the record is renewed "
                    "when etcd answers again",
                    r->u.text, dp_detail_msg(&d));
            lost_etcd = true;
            continue;
        }
        if (lost_etcd)
            DP_LOG_I("registry %s answers again", r->u.text);
        lost_etcd = false;
        dp__reg_record h;
        bool ours = kvs.n == 1 && kvs.kv[0].lease == r->lease;
        bool other = kvs.n == 1 && !ours &&
                     dp__reg_record_decode(&r->u, kvs.kv[0].key, kvs.kv[0].value,
                                           kvs.kv[0].value_len, &h, NULL) == DP_OK &&
                     h.incarnation != r->self.incarnation;
        dp__etcd_kvs_fini(&kvs);
        if (other) {
            DP_LOG_E("registry: unit %" PRIu32
                     "'s record now names incarnation %016" PRIx64
                     " at %s: another process took this id over (this unit was cut off "
                     "from etcd or from it); clients that follow the registry go there. "
                     "This unit stops renewing its registration",
                     r->self.id, h.incarnation, h.zmq);
            break;
        }
        if (ours)
            continue;
        /* The lease expired (etcd was out of reach longer than it) or the record
         * went: register again, under a new lease when the old one is gone. */
        if (ttl <= 0)
            r->lease = 0;
        DP_LOG_W("registry: unit %" PRIu32 "'s record is gone (%s); registering again",
                 r->self.id, ttl <= 0 ? "its lease expired" : "deleted");
        rc = claim(r, 0, &d);
        if (rc == DP_ECANCELED)
            break;
        if (rc != DP_OK) {
            DP_LOG_E("registry: unit %" PRIu32 " cannot register again: %s", r->self.id,
                     dp_detail_msg(&d));
            if (rc == DP_EEXIST || rc == DP_EINVAL)
                break;
        } else {
            DP_LOG_I("registry: unit %" PRIu32 " registered again", r->self.id);
        }
    }
    return NULL;
}

static void
reg_unit_free(dp__reg_unit *r)
{
    dp__etcd_destroy(r->e);
    dp__buf_fini(&r->value);
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
    free(r);
}

int
dp__reg_unit_start(const dp__reg_url *u, const dp__reg_record *self,
                   const dp__reg_unit_opts *o, dp__reg_unit **out, dp_detail *d)
{
    *out = NULL;
    if (!(o->ttl_s >= 1))
        return dp__fail(d, DP_EINVAL, "registry: the lease TTL must be at least 1 s");
    dp__reg_unit *r = calloc(1, sizeof *r);
    if (r == NULL)
        return dp__fail(d, DP_ENOMEM, "registry: out of memory");
    r->u = *u;
    r->self = *self;
    r->o = *o;
    pthread_mutex_init(&r->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca,
                              CLOCK_MONOTONIC); /* a clock step cannot stall renewal */
    pthread_cond_init(&r->cv, &ca);
    pthread_condattr_destroy(&ca);
    dp__reg_key(u, self->id, r->key, sizeof r->key);
    /* Each call is bounded by a third of the lease, so renewing never waits
     * past it on an etcd that does not answer. */
    double call_s = DP_MAX(0.3, DP_MIN(5.0, o->ttl_s / 3));
    int rc = dp__etcd_create(u->endpoints, call_s, &r->e, d);
    if (rc == DP_OK && (rc = dp__reg_record_encode(self, &r->value, d)) == DP_OK &&
        dp__buf_append(&r->value, "", 1) != 0)
        rc = dp__fail(d, DP_ENOMEM, "registry: out of memory");
    if (rc == DP_OK)
        rc = claim(r, dp__now_s() + DP_MAX(o->start_budget_s, 0.001), d);
    if (rc == DP_OK && pthread_create(&r->th, NULL, keepalive_main, r) != 0)
        rc = dp__fail(d, DP_ESYS, "registry: cannot start its thread");
    if (rc != DP_OK) {
        if (r->lease != 0)
            dp__etcd_lease_revoke(r->e, r->lease, NULL);
        reg_unit_free(r);
        return dp__fail_ctx(d, rc, "registry %s", u->text);
    }
    r->started = true;
    *out = r;
    return DP_OK;
}

void
dp__reg_unit_stop(dp__reg_unit *r)
{
    if (r == NULL)
        return;
    pthread_mutex_lock(&r->mu);
    r->stop = true;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    if (r->started)
        pthread_join(r->th, NULL);
    dp_detail d;
    dp_detail_clear(&d);
    if (r->lease != 0 && dp__etcd_lease_revoke(r->e, r->lease, &d) != DP_OK)
        DP_LOG_W("registry: could not withdraw unit %" PRIu32 "'s record (%s); it goes "
                 "when its lease expires",
                 r->self.id, dp_detail_msg(&d));
    reg_unit_free(r);
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

/* ---- --unit-id auto ---- */

static int
env_u32(const char *name, uint32_t hi, uint32_t *out, bool *found, dp_detail *d)
{
    const char *v = getenv(name);
    *found = v != NULL && v[0] != '\0';
    if (!*found)
        return DP_OK;
    uint64_t x;
    if (dp__parse_u64(v, 0, hi, &x, name, d) != DP_OK)
        return dp__fail(d, DP_EINVAL,
                        "environment variable %s='%s' is not a number in "
                        "[0, %" PRIu32 "]",
                        name, v, hi);
    *out = (uint32_t)x;
    return DP_OK;
}

int
dp__reg_auto_id(const char *env_name, uint32_t *id, uint32_t *n_units, char *source,
                size_t cap, dp_detail *d)
{
    *n_units = 0;
    bool found = false;
    int rc;
    if (env_name != NULL) {
        if ((rc = env_u32(env_name, DP_CLUSTER_MAX_UNITS - 1, id, &found, d)) != DP_OK)
            return rc;
        if (!found)
            return dp__fail(d, DP_EINVAL,
                            "--unit-id-env %s: that environment variable is not set",
                            env_name);
        snprintf(source, cap, "$%s", env_name);
        return DP_OK;
    }
    if ((rc = env_u32("SLURM_PROCID", DP_CLUSTER_MAX_UNITS - 1, id, &found, d)) != DP_OK)
        return rc;
    if (found) {
        bool nf = false;
        if ((rc = env_u32("SLURM_NTASKS", DP_CLUSTER_MAX_UNITS, n_units, &nf, d)) !=
            DP_OK)
            return rc;
        if (nf && *n_units == 0)
            return dp__fail(d, DP_EINVAL, "SLURM_NTASKS is 0");
        snprintf(source, cap, "Slurm (SLURM_PROCID%s)", nf ? ", SLURM_NTASKS" : "");
        return DP_OK;
    }
    char host[256] = "";
    gethostname(host, sizeof host - 1);
    const char *dash = strrchr(host, '-');
    uint64_t x;
    if (dash != NULL && dash[1] != '\0' &&
        strspn(dash + 1, "0123456789") == strlen(dash + 1) &&
        dp__parse_u64(dash + 1, 0, DP_CLUSTER_MAX_UNITS - 1, &x, "ordinal", NULL) ==
            DP_OK) {
        *id = (uint32_t)x;
        snprintf(source, cap, "host name %s (StatefulSet ordinal)", host);
        return DP_OK;
    }
    return dp__fail(
        d, DP_EINVAL,
        "--unit-id auto found no launcher: SLURM_PROCID is not set and the host "
        "name '%s' has no -ORDINAL suffix (a StatefulSet pod's); give --unit-id K "
        "or --unit-id-env NAME",
        host);
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
