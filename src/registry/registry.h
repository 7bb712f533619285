/*
 * The unit registry in etcd (docs/design.md, "The registry"): units register
 * a record under a lease they keep alive, clients read the records to find
 * the cluster and watch them to follow units that restart or move.
 *
 *   URL    etcd://HOST:PORT[,HOST:PORT...]/NAME   (NAME: 1..64 of [A-Za-z0-9_.:-])
 *   key    dataplane/NAME/units/<id>              (decimal id, no padding)
 *   value  {"version":1, "cluster":NAME, "id":K, "units":N,
 *           "zmq":"tcp://host:port", "agent":"unit3-...", "incarnation":"16 hex",
 *           "pid":P, "host":"...", "slab_bytes":S, "ssd_bytes":B,
 *           "transports":"tcp,sm,self", "pubkey":"", "started":unix-seconds}
 *
 * A record lives as long as its unit's lease: it goes when the unit dies
 * (its lease expires) or stops (it revokes the lease), and comes back when
 * the unit starts again. Everything read from etcd is checked as input from
 * outside: a record that is not one is refused, naming its key.
 *
 * Threads: every function is reentrant; a dp__reg_unit and a dp__reg_watch
 * run a thread of their own, and their functions may be called from any one
 * thread at a time.
 */
#ifndef DP_REGISTRY_REGISTRY_H
#define DP_REGISTRY_REGISTRY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cluster/cluster.h"
#include "common/common.h"
#include "registry/etcd.h"

#define DP_REG_SCHEME "etcd://"
#define DP_REG_URL_MAX DP_CLUSTER_REGISTRY_MAX
#define DP_REG_KEY_MAX 128

/* A parsed registry URL. */
typedef struct dp__reg_url {
    char endpoints[DP_ETCD_ENDPOINTS_MAX]; /* "host:port[,...]" */
    char name[65];                         /* the cluster's name */
    char text[DP_REG_URL_MAX];             /* the URL as given, for messages */
} dp__reg_url;

/* Whether s names a registry (starts with etcd://). */
bool dp__reg_is_url(const char *s);

/* Parse "etcd://HOST:PORT[,HOST:PORT...]/NAME". DP_EINVAL saying what is wrong. */
int dp__reg_url_parse(const char *s, dp__reg_url *u, dp_detail *d);

/* "dataplane/NAME/units/" and "dataplane/NAME/units/<id>". */
void dp__reg_prefix(const dp__reg_url *u, char *buf, size_t cap);
void dp__reg_key(const dp__reg_url *u, uint32_t id, char *buf, size_t cap);

/* One unit's record. */
typedef struct dp__reg_record {
    uint32_t id, n_units;
    uint32_t replicas; /* copies of each row ("replicas": optional, 1 when absent) */
    char cluster[65];
    char zmq[DP_CLUSTER_ADDR_MAX];
    char agent[DP_CLUSTER_ADDR_MAX];
    uint64_t incarnation;
    int64_t pid;
    char host[128];
    uint64_t slab_bytes, ssd_bytes;
    char transports[128];
    char pubkey[128]; /* "" until the control plane authenticates */
    double started;   /* wall-clock seconds */
} dp__reg_record;

/* The record's JSON into out (appended). DP_ENOMEM. */
int dp__reg_record_encode(const dp__reg_record *r, dp__buf *out, dp_detail *d);

/*
 * Decode and check the record stored at key (len bytes of json) for cluster
 * u->name: every field present and in range, the id the key's, the cluster
 * the URL's. DP_EPROTO naming the key and the field.
 */
int dp__reg_record_decode(const dp__reg_url *u, const char *key, const char *json,
                          size_t len, dp__reg_record *r, dp_detail *d);

/*
 * Read the cluster's records into out (a dp__cluster, as a cluster file
 * gives; cluster_id = the name), waiting up to budget_s for all N units (N
 * from the records, which must agree) while some are missing. *revision (if
 * not NULL): the store's revision the records were read at (a watch starts
 * after it). Errors: DP_ENOTFOUND (no unit registered at all, or some
 * missing at the deadline: d names the missing ids and says how to start
 * units), DP_EPROTO (records disagree on N, or a malformed record is still
 * there at the deadline: d names the key), the etcd call's error when etcd
 * cannot be reached within the budget, DP_ENOMEM.
 */
int dp__reg_load(const dp__reg_url *u, double budget_s, dp__cluster *out,
                 int64_t *revision, dp_detail *d);

/* ---- a unit's registration ---- */

typedef struct dp__reg_unit dp__reg_unit;

/*
 * Is the unit named by holder still serving (its incarnation answers at its
 * address)? 1 yes, 0 no (why says what was seen).
 */
typedef int (*dp__reg_probe_fn)(void *ctx, const dp__reg_record *holder, char *why,
                                size_t cap);

typedef struct dp__reg_unit_opts {
    double ttl_s;          /* the lease (>= 1; renewed every third of it) */
    double start_budget_s; /* how long start keeps trying to reach etcd */
    dp__reg_probe_fn probe;
    void *probe_ctx;
    /*
     * Asked between tries at start (NULL: never): true ends the start at
     * once with DP_ECANCELED (the unit was told to stop while etcd was out
     * of reach).
     */
    bool (*cancelled)(void *ctx);
} dp__reg_unit_opts;

/*
 * Register self under u with a lease of o->ttl_s, then keep it alive on a
 * thread of its own until dp__reg_unit_stop. A record of another
 * incarnation at the key is taken over only when its unit does not answer
 * (o->probe): a live one is refused (DP_EEXIST, naming both). A live unit of
 * the cluster registered earlier with another N refuses this one
 * (DP_EINVAL, naming both). etcd unreachable: retried (with a message once)
 * until start_budget_s, then its error. After start: etcd lost is logged
 * once and the unit serves on; the record is renewed, or registered again
 * under a new lease, when etcd answers again; a record taken over by another
 * incarnation is logged as an error and left to it.
 */
int dp__reg_unit_start(const dp__reg_url *u, const dp__reg_record *self,
                       const dp__reg_unit_opts *o, dp__reg_unit **out, dp_detail *d);

/* Stop renewing and revoke the lease (the record goes at once); NULL allowed. */
void dp__reg_unit_stop(dp__reg_unit *r);

/* ---- a client's watch ---- */

typedef struct dp__reg_watch dp__reg_watch;

/*
 * Follow the records of units 0..n_units-1 under u from revision
 * from_rev + 1 on a thread of its own (from_rev: the revision dp__reg_load
 * read at). etcd lost: logged once, watched again when it answers (reading
 * the records afresh).
 */
int dp__reg_watch_start(const dp__reg_url *u, uint32_t n_units, int64_t from_rev,
                        dp__reg_watch **out, dp_detail *d);

/* A number that changes whenever a record changed. Any thread. */
uint64_t dp__reg_watch_gen(const dp__reg_watch *w);

/* Unit id's newest record into out: false when it has none now. */
bool dp__reg_watch_get(dp__reg_watch *w, uint32_t id, dp__reg_record *out);

void dp__reg_watch_stop(dp__reg_watch *w); /* NULL allowed */

/* ---- the operator's view ---- */

typedef struct dp__reg_entry {
    char key[DP_REG_KEY_MAX];
    bool valid; /* false: why says what is wrong with the record */
    char why[256];
    dp__reg_record r; /* valid */
    int64_t lease;    /* 0: none (a record written by hand) */
    int64_t ttl_left; /* seconds its lease has left; -1: gone or none */
} dp__reg_entry;

/*
 * Every record under u's prefix (in key order), with its lease's time left:
 * *entries (free it) and *n. Errors of the etcd calls, DP_ENOMEM.
 */
int dp__reg_list(const dp__reg_url *u, double timeout_s, dp__reg_entry **entries,
                 size_t *n, dp_detail *d);

/*
 * `--unit-id auto`: the unit's id (and, when the launcher says, the number
 * of units: *n_units, else 0) from env_name when given (an environment
 * variable holding the id), else SLURM_PROCID (and SLURM_NTASKS), else the
 * host name's "-<ordinal>" suffix (a Kubernetes StatefulSet pod, e.g.
 * dataplane-3). DP_EINVAL saying what was looked at and what to pass instead.
 */
int dp__reg_auto_id(const char *env_name, uint32_t *id, uint32_t *n_units, char *source,
                    size_t cap, dp_detail *d);

/*
 * Where a cluster is, and its units: arg (NULL or "": $DP_CLUSTER, else the
 * default directory) is either a registry URL (etcd://HOST:PORT[,...]/NAME:
 * its records are read, waiting up to budget_s for every unit to register;
 * see above) or a cluster file or its directory
 * (dp__cluster_locate, dp__cluster_load). where (cap bytes) gets the URL or
 * the file's path, for messages. Errors of either.
 */
int dp__reg_resolve(const char *arg, double budget_s, dp__cluster *out, char *where,
                    size_t cap, dp_detail *d);

#endif
