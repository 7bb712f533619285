/*
 * A small client of etcd's v3 API through its HTTP/JSON gateway (libcurl for
 * HTTP, cJSON for the bodies): the key-value calls, leases and a watch, as
 * much as the unit registry needs (registry.h). Keys and values are byte
 * strings on the wire (base64 in the JSON); here they are C strings, since
 * every key and value dataplane writes is text.
 *
 * Endpoints: "host:port[,host:port...]" (http). A call goes to the endpoint
 * that answered last; when it cannot be reached, the next is tried, each at
 * most once per call. Every call is bounded by the handle's timeout.
 *
 * This is the only module that includes <curl/curl.h>.
 *
 * Threads: a dp__etcd belongs to one thread at a time; dp__etcd_watch_stop
 * may be called from any thread while another runs dp__etcd_watch.
 */
#ifndef DP_REGISTRY_ETCD_H
#define DP_REGISTRY_ETCD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/common.h"

#define DP_ETCD_ENDPOINTS_MAX 512 /* bytes of "host:port,..." */

typedef struct dp__etcd dp__etcd;

/* One key-value pair of a range or a watch event. */
typedef struct dp__etcd_kv {
    char *key;
    char *value; /* NUL-terminated; value_len bytes before it */
    size_t value_len;
    int64_t lease; /* 0: none */
    int64_t create_rev, mod_rev;
} dp__etcd_kv;

typedef struct dp__etcd_kvs {
    dp__etcd_kv *kv;
    size_t n;
    int64_t revision; /* the store's revision the range saw */
} dp__etcd_kvs;

/*
 * A handle for endpoints ("host:port[,...]": 1..16 of them; host a name, an
 * IPv4 address or a bracketed IPv6 address), each call bounded by timeout_s.
 * Nothing is sent yet. Errors: DP_EINVAL (says which endpoint is bad),
 * DP_ENOMEM, DP_ESYS (libcurl could not start).
 */
int dp__etcd_create(const char *endpoints, double timeout_s, dp__etcd **out,
                    dp_detail *d);
void dp__etcd_destroy(dp__etcd *e); /* NULL allowed */

/* The endpoint calls go to now ("host:port"). */
const char *dp__etcd_endpoint(const dp__etcd *e);

/*
 * Every call: DP_ETIMEDOUT when no endpoint answered in time or could be
 * reached, or each answered HTTP 5xx (d names them and what libcurl or etcd
 * said), DP_EPROTO when etcd answered with an error or
 * with a body that is not what the API promises (d quotes etcd's message).
 */

/* The pairs of key (prefix: every key starting with it), in key order. */
int dp__etcd_range(dp__etcd *e, const char *key, bool prefix, dp__etcd_kvs *out,
                   dp_detail *d);
void dp__etcd_kvs_fini(dp__etcd_kvs *k);

/* Put key = value (lease 0: none). */
int dp__etcd_put(dp__etcd *e, const char *key, const char *value, int64_t lease,
                 dp_detail *d);

/*
 * Put key = value under lease if the key's mod revision is mod_rev (0: only
 * if the key does not exist), in one transaction: *done says whether it did.
 */
int dp__etcd_put_if(dp__etcd *e, const char *key, const char *value, int64_t lease,
                    int64_t mod_rev, bool *done, dp_detail *d);

/* Delete key if its mod revision is mod_rev: *done says whether it did. */
int dp__etcd_delete_if(dp__etcd *e, const char *key, int64_t mod_rev, bool *done,
                       dp_detail *d);

/* Grant a lease of ttl_s seconds (>= 1): *id. */
int dp__etcd_lease_grant(dp__etcd *e, int64_t ttl_s, int64_t *id, dp_detail *d);

/* Renew lease id once: *ttl_left the seconds it now has, 0 when it is gone. */
int dp__etcd_lease_keepalive(dp__etcd *e, int64_t id, int64_t *ttl_left, dp_detail *d);

/* Seconds lease id has left without renewal, -1 when it is gone (no renewal). */
int dp__etcd_lease_ttl(dp__etcd *e, int64_t id, int64_t *ttl_left, dp_detail *d);

/* Revoke lease id: its keys are deleted at once. A lease already gone is DP_OK. */
int dp__etcd_lease_revoke(dp__etcd *e, int64_t id, dp_detail *d);

/*
 * Watch every key under prefix from revision from_rev (0: from now), calling
 * fn for each event (deleted: a delete; kv->value is "" then) with the
 * revision of its batch, until fn returns nonzero (then that value),
 * dp__etcd_watch_stop is called (DP_ECANCELED), or the stream fails (its
 * error: the caller re-reads and watches again). A watch is not bounded by
 * the handle's timeout; a silent stream is noticed within idle_s seconds
 * (etcd sends nothing while nothing changes, so the caller picks how often
 * it re-checks: then DP_ETIMEDOUT). DP_ELOST: from_rev was compacted away.
 */
typedef int (*dp__etcd_watch_fn)(void *ctx, bool deleted, const dp__etcd_kv *kv,
                                 int64_t revision);
int dp__etcd_watch(dp__etcd *e, const char *prefix, int64_t from_rev, double idle_s,
                   dp__etcd_watch_fn fn, void *ctx, dp_detail *d);

/* Make a running (or the next) dp__etcd_watch of e return DP_ECANCELED. Any thread. */
void dp__etcd_watch_stop(dp__etcd *e);

/* Base64 (standard alphabet, padded), exposed for the fuzz target and tests. */
char *dp__etcd_b64_encode(const void *p, size_t n);
/* Decode s (len bytes) into a new NUL-terminated buffer; NULL on bad input. */
char *dp__etcd_b64_decode(const char *s, size_t len, size_t *out_len);

#endif
