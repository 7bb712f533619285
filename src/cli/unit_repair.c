/*
 * A unit's repair thread (docs/design.md, "Repair"): a unit of a cluster that
 * keeps replicas, started where it can find its cluster (--repair-from, or its
 * registry), fills itself from its peers in the background, as a client of
 * them and of itself, throttled; the unit counts the progress and, when it
 * ends, forgets the rows it was asked to clear meanwhile. Then, every
 * --repair-every seconds, a pass does the same over a unit that holds its
 * rows: only what a peer holds at a higher version is copied.
 */
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "client/client_int.h"
#include "unit/unit.h"

struct dp__unit_repairer {
    pthread_t th;
    dp__unit *u;
    char *from;
    uint32_t unit_id;
    double rate;
    bool initial;   /* the unit starts empty: fill it first */
    double every_s; /* then a pass this often (0: none) */
    bool leases;    /* and one whenever a peer says the unit is behind */
    int stop;       /* atomic: the unit is stopping */
};

/* What the repair copied in, the unit counts as it commits: here the failures. */
static void
progress(void *ctx, uint64_t keys, uint64_t bytes, uint64_t failed)
{
    (void)keys;
    (void)bytes;
    if (failed > 0)
        dp__unit_repair_failed(ctx, failed);
}

/* The units of a comma-separated "tcp://a:1,tcp://b:2" list, in unit order. */
static int
cluster_of_list(const char *from, dp__cluster *cl, dp_detail *d)
{
    memset(cl, 0, sizeof *cl);
    uint32_t n = 1;
    for (const char *p = from; *p != '\0'; p++)
        n += *p == ',';
    if (n > DP_CLUSTER_MAX_UNITS)
        return dp__fail(d, DP_EINVAL, "%u units listed (at most %u)", n,
                        DP_CLUSTER_MAX_UNITS);
    if ((cl->units = calloc(n, sizeof *cl->units)) == NULL)
        return dp__fail(d, DP_ENOMEM, "out of memory");
    const char *p = from;
    for (uint32_t i = 0; i < n; i++) {
        size_t len = strcspn(p, ",");
        if (len == 0 || len >= sizeof cl->units[i].zmq) {
            dp__cluster_fini(cl);
            return dp__fail(d, DP_EINVAL,
                            "unit %u's address in '%s' is empty or too long", i, from);
        }
        memcpy(cl->units[i].zmq, p, len);
        cl->units[i].id = i;
        p += len + (p[len] == ',');
    }
    cl->n_units = n;
    return DP_OK;
}

/* The cluster a unit's repair and lease threads read (cli.h). */
int
dp__cli_open_cluster(const char *from, const dp_client_opts *co, bool ctl_only,
                     dp_client **c, dp_detail *d)
{
    bool list = strncmp(from, "tcp://", 6) == 0;
    if (!list && !ctl_only)
        return dp_client_open(from, co, c, d);
    dp__cluster cl;
    char where[DP_CLUSTER_REGISTRY_MAX > PATH_MAX ? DP_CLUSTER_REGISTRY_MAX : PATH_MAX];
    int rc =
        list ? cluster_of_list(from, &cl, d)
             : dp__reg_resolve(from, co->connect_timeout_s, &cl, where, sizeof where, d);
    if (rc != DP_OK)
        return rc;
    if (!ctl_only) {
        const char *addrs[DP_CLUSTER_MAX_UNITS];
        for (uint32_t i = 0; i < cl.n_units; i++)
            addrs[i] = cl.units[i].zmq;
        rc = dp_client_open_units(addrs, cl.n_units, co, c, d);
    } else {
        /* Addresses and the control transport: no data path, nothing asked yet. */
        rc = dp__client_open_ctl(&cl, co, NULL, DP__CTL_NO_CHECK, c, d);
        dp__reg_url url;
        if (rc == DP_OK && cl.registry[0] != '\0' &&
            ((rc = dp__reg_url_parse(cl.registry, &url, d)) != DP_OK ||
             (rc = dp__reg_watch_start(&url, cl.n_units, cl.revision, &(*c)->reg, d)) !=
                 DP_OK)) {
            dp_client_close(*c);
            *c = NULL;
        }
    }
    dp__cluster_fini(&cl);
    return rc;
}

/* One repair or pass, to its end; the unit's repair ends with it. */
static void
run_once(dp__unit_repairer *r, bool pass)
{
    const char *what = pass ? "repair pass" : "repair";
    dp_client_opts co;
    dp_client_opts_init(&co);
    /* Short budgets: a unit that stops waits for the page its repair is on. */
    co.connect_timeout_s = 10;
    co.timeout_s = 10;
    dp_client *c = NULL;
    dp_detail d;
    dp_detail_clear(&d);
    double t0 = dp__now_s();
    /* The cluster may still be coming up (a fresh start): try for a minute. */
    int rc;
    while ((rc = dp__cli_open_cluster(r->from, &co, false, &c, &d)) != DP_OK &&
           !__atomic_load_n(&r->stop, __ATOMIC_RELAXED) && dp__now_s() - t0 < 60)
        dp__sleep_s(1.0);
    if (rc != DP_OK) {
        DP_LOG_W("%s: cannot open the cluster %s: %s%s", what, r->from, dp_detail_msg(&d),
                 pass ? "" : "; this unit holds only what is written from now on");
        dp__unit_repair_failed(r->u, 1);
        dp__unit_repair_end(r->u);
        return;
    }
    if (!pass)
        DP_LOG_I("repair: filling this unit from its peers (%s, at most %.0f MB/s)",
                 r->from, r->rate / 1e6);
    dp__repair_opts o = {.unit = r->unit_id,
                         .page_rows = 64,
                         .rate_bytes_s = r->rate,
                         .progress = progress,
                         .ctx = r->u,
                         .stop = &r->stop};
    dp__repair_sum s;
    /* The fences this pass catches the unit up with, if it reads every peer. */
    uint64_t *snap = calloc(dp_client_n_units(c), sizeof *snap);
    if (snap != NULL)
        dp__unit_lease_snapshot(r->u, snap);
    rc = dp__client_repair(c, &o, &s, &d);
    /* A gone peer's copies went with it: nothing there to catch up with. */
    if (s.failed == 0 && s.peers_failed == s.peers_gone && snap != NULL &&
        (rc == DP_OK || s.peers_gone > 0))
        dp__unit_lease_caught_up(r->u, snap);
    free(snap);
    dp_client_close(c);
    dp__unit_repair_under(r->u, s.under);
    if (s.under > 0)
        DP_LOG_W("%s: %" PRIu64 " keys of this unit have no copy on a peer that shares "
                 "their row (under-replicated; a peer's repair or next pass copies them)",
                 what, s.under);
    if (rc == DP_OK && (!pass || s.keys > 0))
        DP_LOG_I("%s: done in %.1f s: %" PRIu64 " keys, %" PRIu64
                 " bytes copied in; %" PRIu64 " held already",
                 what, dp__now_s() - t0, s.keys, s.bytes, s.held);
    else if (rc != DP_OK)
        DP_LOG_W("%s: ended in %.1f s with %" PRIu64 " keys copied and %" PRIu64
                 " not (%u peer(s) not listed): %s",
                 what, dp__now_s() - t0, s.keys, s.failed, s.peers_failed,
                 dp_detail_msg(&d));
    if (rc != DP_OK && s.failed == 0)
        dp__unit_repair_failed(r->u, 1); /* a peer not listed: partial */
    dp__unit_repair_end(r->u);
}

static void *
repair_main(void *arg)
{
    dp__unit_repairer *r = arg;
    unsigned seed = (unsigned)getpid() ^ (unsigned)(dp__now_s() * 1e6) ^ r->unit_id;
    if (r->initial)
        run_once(r, false);
    while ((r->every_s > 0 || r->leases) &&
           !__atomic_load_n(&r->stop, __ATOMIC_RELAXED)) {
        /* Wait in steps of 0.1 s, so that a stop is seen; 0.9 to 1.1 periods,
         * so that units started together do not open their passes' clients
         * at the same moment forever. A unit told it is behind (a peer fenced
         * it: "Leases") runs a pass at once, at most one a second. */
        double t0 = dp__now_s();
        double due =
            r->every_s > 0
                ? t0 + r->every_s * (0.9 + 0.2 * (double)rand_r(&seed) / RAND_MAX)
                : INFINITY;
        while (!__atomic_load_n(&r->stop, __ATOMIC_RELAXED) && dp__now_s() < due &&
               !(dp__now_s() - t0 >= 1.0 && dp__unit_lease_behind(r->u)))
            dp__sleep_s(DP_MIN(0.1, due - dp__now_s()));
        if (__atomic_load_n(&r->stop, __ATOMIC_RELAXED))
            break;
        dp__unit_repair_begin(r->u);
        run_once(r, true);
    }
    return NULL;
}

int
dp__unit_repair_start(dp__unit *u, uint32_t unit_id, const char *from, double rate,
                      bool initial, double every_s, dp__unit_repairer **out, dp_detail *d)
{
    *out = NULL;
    dp__unit_repairer *r = calloc(1, sizeof *r);
    if (r == NULL || (r->from = strdup(from)) == NULL) {
        free(r);
        return dp__fail(d, DP_ENOMEM, "repair: out of memory");
    }
    r->u = u;
    r->unit_id = unit_id;
    r->rate = rate;
    r->initial = initial;
    r->every_s = every_s;
    r->leases = dp__unit_lease_on(u);
    int e = pthread_create(&r->th, NULL, repair_main, r);
    if (e != 0) {
        free(r->from);
        free(r);
        return dp__fail(d, DP_ESYS, "repair: cannot start its thread (errno %d)", e);
    }
    *out = r;
    return DP_OK;
}

void
dp__unit_repair_stop(dp__unit_repairer *r)
{
    if (r == NULL)
        return;
    __atomic_store_n(&r->stop, 1, __ATOMIC_RELAXED);
    pthread_join(r->th, NULL);
    free(r->from);
    free(r);
}
