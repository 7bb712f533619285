/*
 * The unit registry (see registry.h), a unit's side: registering its record
 * under a lease, claiming its id, keeping the lease alive, and finding its
 * id for --unit-id auto. Records and URLs are reg_record.c; a client's side
 * is reg_client.c.
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
 * - Locks: dp__reg_unit.mu guards stop (the cond wakes the thread). It is
 *   never held across an etcd call.
 */
#include "registry/registry.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

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
 * A live unit of the cluster registered before this one with another N or
 * replicas: DP_EINVAL naming it, after withdrawing this unit's record. A unit
 * that took over a dead one's record (took_over) keeps that record's creation
 * revision: it is checked against every live unit, the cluster being there
 * already.
 */
static int
check_n(dp__reg_unit *r, bool took_over, dp_detail *d)
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
            (o.n_units == r->self.n_units && o.replicas == r->self.replicas) ||
            (mine != 0 && kv->create_rev > mine && !took_over))
            continue;
        char why[256];
        if (holder_alive(r, &o, why, sizeof why) != 1)
            continue;
        bool done;
        dp__etcd_delete_if(r->e, r->key, mine_mod, &done, NULL);
        rc = dp__fail(d, DP_EINVAL,
                      "cluster %s has %" PRIu32 " units keeping %" PRIu32
                      " copies of each row (unit %" PRIu32 " at %s, pid %" PRId64
                      " on %s, registered under %s, says so); this unit was started with "
                      "--units %" PRIu32 " --replicas %" PRIu32
                      ": give it --units %" PRIu32 " --replicas %" PRIu32
                      ", or use another cluster name",
                      r->u.name, o.n_units, o.replicas, o.id, o.zmq, o.pid,
                      o.host[0] ? o.host : "?", kv->key, r->self.n_units,
                      r->self.replicas, o.n_units, o.replicas);
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
    return check_n(r, mod != 0, d);
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
    if (r->self.replicas == 0)
        r->self.replicas = 1;
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
