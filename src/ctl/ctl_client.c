/*
 * The control client (see ctl.h): a pool of DEALER sockets per address, the
 * units' CURVE keys, requests and notifies, and the wait that gathers the
 * replies of a batch, sending a repeatable request again after a drop. The
 * server is in ctl_server.c; what both use (key files, a socket monitor's
 * events) in ctl_common.c.
 *
 * Design notes
 * - Client: sockets are pooled per address under the pool mutex; a socket is
 *   owned by exactly one call from the moment it leaves the pool until it goes
 *   back (after a complete reply with the right id) or is closed (after a
 *   timeout, a wrong id, or any error). A socket that was closed had LINGER 0,
 *   so nothing queued on it is sent later.
 * - Down detection: every client socket carries a monitor (a PAIR socket on
 *   an inproc endpoint, owned with it), heartbeats and a connect timeout. A
 *   wait fails a request at once when the connection that carried it drops,
 *   or when it was sent unconnected and two connect attempts failed since;
 *   the snapshot taken at the send (sent_*) tells which events are later.
 * - Lock order: the pool mutex is a leaf; no ZMQ call blocks while it is held.
 */
#include "ctl/ctl_int.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <zmq.h>

#include "common/list.h"

#include "wire/mp.h"

/*
 * A pooled DEALER socket and the PAIR socket that receives its monitor
 * events, so a call learns at once when its unit cannot be reached (the
 * connection is refused, or a connection that carried the request drops)
 * instead of waiting out its timeout. See the Design notes at the top.
 */
typedef struct csock {
    void *s;      /* DEALER */
    void *mon;    /* PAIR: s's monitor events */
    bool up;      /* a ZMTP handshake succeeded and no disconnect since */
    bool ever_up; /* a handshake succeeded at some point */
    uint64_t n_disconnects;
    uint64_t n_refused; /* connect attempts that failed (refused, timed out) */
    uint64_t n_handshakes;
    uint64_t n_auth_failed;  /* the unit's ZAP handler refused this client's key */
    uint64_t n_proto_failed; /* a handshake failed otherwise (last_proto says how) */
    uint32_t last_proto;
    bool curve;     /* this socket speaks CURVE (the client has a key and the unit's) */
    uint64_t epoch; /* the client's epoch when it was made or taken from the pool */
    /* Snapshot at the send of the request this socket waits for. */
    bool sent_up;
    uint64_t sent_disconnects, sent_refused, sent_handshakes, sent_auth, sent_proto;
} csock;

struct pooled {
    char *address;
    csock *cs;
    dp__list_node link; /* dp__ctl_client.idle, most recently given back first */
};

/* A unit's CURVE public key, by address (dp__ctl_client_server_key). */
struct server_key {
    char *address;
    char key[41];
};

struct dp__ctl_client {
    void *zctx;
    pthread_mutex_t mu;
    dp__list idle; /* struct pooled; under mu */
    /*
     * Bumped (under mu) when idle sockets to an address are closed (forget,
     * a changed key): a socket a running call held then (taken in an earlier
     * epoch) is closed when given back instead of pooled, whatever its
     * address (rare: a unit moved or was re-keyed meanwhile).
     */
    uint64_t epoch;
    uint64_t n_socks;  /* monitor endpoint names; atomic */
    uint64_t n_resent; /* requests sent again after a drop; atomic */
    /* CURVE: this client's keys (curve), and the units' keys; under mu. */
    bool curve;
    char pub[41], sec[41];
    struct server_key *keys;
    size_t n_keys;
};

int
dp__ctl_client_set_curve(dp__ctl_client *c, const char secret[41], dp_detail *d)
{
    char pub[41];
    if (!dp__ctl_key_valid(secret))
        return dp__fail(d, DP_EINVAL, "ctl client: not a CURVE secret key");
    int rc = dp__ctl_key_public(secret, pub, d);
    if (rc != DP_OK)
        return rc;
    pthread_mutex_lock(&c->mu);
    c->curve = true;
    memcpy(c->sec, secret, 41);
    memcpy(c->pub, pub, 41);
    pthread_mutex_unlock(&c->mu);
    return DP_OK;
}

/* Heartbeats and connect bounds: a dead or cut-off peer shows within seconds. */
#define HEARTBEAT_IVL_MS 1000
#define HEARTBEAT_TIMEOUT_MS 4000
#define CONNECT_TIMEOUT_MS 2000

int
dp__ctl_client_create(dp__ctl_client **out, dp_detail *d)
{
    dp__ctl_client *c = calloc(1, sizeof *c);
    if (c == NULL)
        return dp__fail(d, DP_ENOMEM, "ctl client: out of memory");
    c->zctx = zmq_ctx_new();
    if (c->zctx == NULL) {
        int e = zmq_errno();
        free(c);
        return dp__fail_sys(d, e, "ctl client: zmq_ctx_new");
    }
    pthread_mutex_init(&c->mu, NULL);
    *out = c;
    return DP_OK;
}

static void
zsock_close(void *sock)
{
    int zero = 0;
    zmq_setsockopt(sock, ZMQ_LINGER, &zero, sizeof zero);
    zmq_close(sock);
}

static void
sock_close(csock *cs)
{
    if (cs == NULL)
        return;
    if (cs->s != NULL) {
        zmq_socket_monitor(cs->s, NULL, 0);
        zsock_close(cs->s);
    }
    if (cs->mon != NULL)
        zsock_close(cs->mon);
    free(cs);
}

/*
 * Move the idle sockets to address from c's pool to gone (under c->mu); a
 * new epoch, so a socket to it that a running call holds is not pooled
 * again. A notify (an unpin) still queued on a closed socket is dropped:
 * this happens when the unit moved or its key changed, and the process that
 * held the pin is then gone or unreachable by this socket anyway.
 */
static void
idle_take_locked(dp__ctl_client *c, const char *address, dp__list *gone)
{
    c->epoch++;
    for (struct pooled *p = DP_LIST_FIRST(&c->idle, struct pooled, link), *next;
         p != NULL; p = next) {
        next = DP_LIST_NEXT(p, struct pooled, link);
        if (strcmp(p->address, address) == 0) {
            dp__list_remove(&c->idle, &p->link);
            dp__list_insert_head(gone, &p->link);
        }
    }
}

/* Close the sockets idle_take_locked took (outside c->mu), or a whole pool; how many. */
static size_t
idle_close(dp__list *gone)
{
    size_t n = 0;
    for (struct pooled *p; (p = DP_LIST_FIRST(gone, struct pooled, link)) != NULL; n++) {
        dp__list_remove(gone, &p->link);
        sock_close(p->cs);
        free(p->address);
        free(p);
    }
    return n;
}

size_t
dp__ctl_client_forget(dp__ctl_client *c, const char *address)
{
    if (c == NULL || address == NULL)
        return 0;
    dp__list gone;
    dp__list_init(&gone);
    pthread_mutex_lock(&c->mu);
    idle_take_locked(c, address, &gone);
    pthread_mutex_unlock(&c->mu);
    return idle_close(&gone);
}

int
dp__ctl_client_server_key(dp__ctl_client *c, const char *address, const char *key,
                          dp_detail *d)
{
    if (key != NULL && key[0] != '\0' && !dp__ctl_key_valid(key))
        return dp__fail(d, DP_EINVAL,
                        "unit %s: its public key '%.48s' is not a CURVE key", address,
                        key);
    dp__list gone;
    dp__list_init(&gone);
    pthread_mutex_lock(&c->mu);
    size_t i = 0;
    while (i < c->n_keys && strcmp(c->keys[i].address, address) != 0)
        i++;
    int rc = DP_OK;
    /* Idle sockets made with another key (or none) would fail their handshake
     * (only a client with a key of its own uses the units' keys). */
    bool had = i < c->n_keys, has = key != NULL && key[0] != '\0';
    if (c->curve && (had != has || (had && memcmp(c->keys[i].key, key, 41) != 0)))
        idle_take_locked(c, address, &gone);
    if (key == NULL || key[0] == '\0') {
        if (i < c->n_keys) {
            free(c->keys[i].address);
            c->keys[i] = c->keys[--c->n_keys];
        }
    } else if (i < c->n_keys) {
        memcpy(c->keys[i].key, key, 41);
    } else {
        void *nk = realloc(c->keys, (c->n_keys + 1) * sizeof *c->keys);
        char *a = strdup(address);
        if (nk == NULL || a == NULL) {
            if (nk != NULL)
                c->keys = nk;
            free(a);
            rc = dp__fail(d, DP_ENOMEM, "ctl client: out of memory");
        } else {
            c->keys = nk;
            c->keys[c->n_keys].address = a;
            memcpy(c->keys[c->n_keys].key, key, 41);
            c->n_keys++;
        }
    }
    pthread_mutex_unlock(&c->mu);
    idle_close(&gone);
    return rc;
}

void
dp__ctl_client_destroy(dp__ctl_client *c)
{
    if (c == NULL)
        return;
    idle_close(&c->idle);
    zmq_ctx_term(c->zctx);
    pthread_mutex_destroy(&c->mu);
    for (size_t i = 0; i < c->n_keys; i++)
        free(c->keys[i].address);
    free(c->keys);
    explicit_bzero(c->sec, sizeof c->sec);
    free(c);
}

/* Read every queued monitor event of cs (never blocks). */
static void
drain_events(csock *cs)
{
    uint16_t ev;
    uint32_t val;
    while (dp__ctl_mon_recv(cs->mon, &ev, &val)) {
        switch (ev) {
        case ZMQ_EVENT_HANDSHAKE_SUCCEEDED:
            cs->up = cs->ever_up = true;
            cs->n_handshakes++;
            break;
        case ZMQ_EVENT_DISCONNECTED:
            cs->up = false;
            cs->n_disconnects++;
            break;
        case ZMQ_EVENT_CONNECT_RETRIED:
            cs->n_refused++;
            break;
        case ZMQ_EVENT_HANDSHAKE_FAILED_AUTH:
            cs->n_auth_failed++;
            break;
        case ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL:
            cs->n_proto_failed++;
            cs->last_proto = val;
            break;
        default:
            break;
        }
    }
}

static int
sock_new(dp__ctl_client *c, const char *address, csock **out, dp_detail *d)
{
    csock *cs = calloc(1, sizeof *cs);
    if (cs == NULL)
        return dp__fail(d, DP_ENOMEM, "ctl client: out of memory");
    cs->s = zmq_socket(c->zctx, ZMQ_DEALER);
    if (cs->s == NULL) {
        int e = zmq_errno();
        free(cs);
        return dp__fail_sys(d, e, "zmq_socket(DEALER)");
    }
    int zero = 0, hb = HEARTBEAT_IVL_MS, hbt = HEARTBEAT_TIMEOUT_MS,
        cto = CONNECT_TIMEOUT_MS;
    zmq_setsockopt(cs->s, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(cs->s, ZMQ_HEARTBEAT_IVL, &hb, sizeof hb);
    zmq_setsockopt(cs->s, ZMQ_HEARTBEAT_TIMEOUT, &hbt, sizeof hbt);
    zmq_setsockopt(cs->s, ZMQ_CONNECT_TIMEOUT, &cto, sizeof cto);
    /* CURVE towards a unit whose key this client knows. */
    pthread_mutex_lock(&c->mu);
    cs->epoch = c->epoch;
    char skey[41] = "";
    for (size_t i = 0; c->curve && i < c->n_keys; i++)
        if (strcmp(c->keys[i].address, address) == 0)
            memcpy(skey, c->keys[i].key, 41);
    bool curve = skey[0] != '\0';
    char pub[41], sec[41];
    memcpy(pub, c->pub, sizeof pub);
    memcpy(sec, c->sec, sizeof sec);
    pthread_mutex_unlock(&c->mu);
    cs->curve = curve;
    if (curve && (zmq_setsockopt(cs->s, ZMQ_CURVE_SERVERKEY, skey, 41) != 0 ||
                  zmq_setsockopt(cs->s, ZMQ_CURVE_PUBLICKEY, pub, 41) != 0 ||
                  zmq_setsockopt(cs->s, ZMQ_CURVE_SECRETKEY, sec, 41) != 0)) {
        explicit_bzero(sec, sizeof sec);
        int e = zmq_errno();
        sock_close(cs);
        return dp__fail_sys(d, e, "ctl client: CURVE (libzmq without it?)");
    }
    explicit_bzero(sec, sizeof sec);
    char mon[96];
    snprintf(mon, sizeof mon, "inproc://dp-ctl-mon-%p-%" PRIu64, (void *)c,
             __atomic_add_fetch(&c->n_socks, 1, __ATOMIC_RELAXED));
    int rc = DP_OK;
    if (zmq_socket_monitor(cs->s, mon,
                           ZMQ_EVENT_HANDSHAKE_SUCCEEDED | ZMQ_EVENT_DISCONNECTED |
                               ZMQ_EVENT_CONNECT_RETRIED |
                               ZMQ_EVENT_HANDSHAKE_FAILED_AUTH |
                               ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL) != 0) {
        rc = dp__fail_sys(d, zmq_errno(), "ctl client: zmq_socket_monitor");
        goto fail;
    }
    cs->mon = zmq_socket(c->zctx, ZMQ_PAIR);
    if (cs->mon == NULL || zmq_connect(cs->mon, mon) != 0) {
        rc = dp__fail_sys(d, zmq_errno(), "ctl client: monitor socket");
        goto fail;
    }
    if (zmq_connect(cs->s, address) != 0) {
        rc = dp__fail_sys(d, zmq_errno(), "connect to unit %s", address);
        goto fail;
    }
    *out = cs;
    return DP_OK;
fail:
    sock_close(cs);
    return rc;
}

/* A socket connected to address: an idle pooled one, or a new one. */
static int
sock_take(dp__ctl_client *c, const char *address, csock **out, dp_detail *d)
{
    pthread_mutex_lock(&c->mu);
    for (struct pooled *p = DP_LIST_FIRST(&c->idle, struct pooled, link); p != NULL;
         p = DP_LIST_NEXT(p, struct pooled, link)) {
        if (strcmp(p->address, address) == 0) {
            dp__list_remove(&c->idle, &p->link);
            p->cs->epoch = c->epoch; /* idle through any forget: not its address */
            pthread_mutex_unlock(&c->mu);
            *out = p->cs;
            free(p->address);
            free(p);
            return DP_OK;
        }
    }
    pthread_mutex_unlock(&c->mu);
    if (strncmp(address, "tcp://", 6) != 0 && strncmp(address, "ipc://", 6) != 0)
        return dp__fail(d, DP_EINVAL, "unit address '%s' is not tcp://host:port",
                        address);
    return sock_new(c, address, out, d);
}

static void
sock_give_back(dp__ctl_client *c, const char *address, csock *cs)
{
    struct pooled *p = malloc(sizeof *p);
    char *a = strdup(address);
    if (p == NULL || a == NULL) {
        free(p);
        free(a);
        sock_close(cs);
        return;
    }
    p->address = a;
    p->cs = cs;
    pthread_mutex_lock(&c->mu);
    bool stale = cs->epoch != c->epoch; /* its address was forgotten or re-keyed since */
    if (!stale)
        dp__list_insert_head(&c->idle, &p->link);
    pthread_mutex_unlock(&c->mu);
    if (stale) {
        sock_close(cs);
        free(a);
        free(p);
    }
}

/* True if msg is a msgpack array whose first element is the string rid. */
static bool
reply_has_rid(const uint8_t *msg, size_t len, const char *rid)
{
    dp__mp_reader r;
    dp__mp_reader_init(&r, msg, len);
    uint32_t n;
    const char *s;
    uint32_t slen;
    if (dp__mp_read_array(&r, &n, NULL, NULL) != DP_OK || n < 1)
        return false;
    if (dp__mp_read_str(&r, &s, &slen, NULL, NULL) != DP_OK)
        return false;
    return slen == strlen(rid) && memcmp(s, rid, slen) == 0;
}

static int
send_req(csock *cs, const char *address, const void *req, size_t len, dp_detail *d)
{
    drain_events(cs);
    cs->sent_up = cs->up;
    cs->sent_disconnects = cs->n_disconnects;
    cs->sent_refused = cs->n_refused;
    cs->sent_handshakes = cs->n_handshakes;
    cs->sent_auth = cs->n_auth_failed;
    cs->sent_proto = cs->n_proto_failed;
    if (zmq_send(cs->s, req, len, ZMQ_DONTWAIT) < 0)
        return dp__fail_sys(d, zmq_errno(), "send to unit %s", address);
    return DP_OK;
}

/*
 * What the monitor says about the request cs waits for: DP_OK (nothing
 * wrong yet), or DP_ETRANSFER when the unit cannot answer it any more.
 * resent: cs carries a request sent again after its connection dropped (the
 * unit spoke to this client before).
 */
static int
sock_verdict(csock *cs, const char *address, bool resent, dp_detail *d)
{
    drain_events(cs);
    /*
     * A failure since the send, or one before it on a socket that never came
     * up: the handshake of a fresh socket can fail before the request is
     * even sent (the send's snapshot then already counts it, and ZMQ need not
     * try again).
     */
    bool fresh = !cs->ever_up;
    if (cs->n_auth_failed > cs->sent_auth || (fresh && cs->n_auth_failed > 0))
        return dp__fail(
            d, DP_EPOLICY,
            "unit %s refused this client's key (CURVE): its operator must put "
            "this client's public key in the unit's --curve-allow directory "
            "(then SIGHUP the unit); nothing was delivered",
            address);
    if (cs->n_proto_failed > cs->sent_proto || (fresh && cs->n_proto_failed > 0)) {
        if (cs->last_proto == ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH)
            return dp__fail(d, DP_EPOLICY,
                            cs->curve
                                ? "unit %s does not use CURVE, but this client was "
                                  "told it does (its public key is in the cluster "
                                  "file or registry): nothing was delivered"
                                : "unit %s requires CURVE authentication and this "
                                  "client has no key for it: set DP_CURVE_SECRET (or "
                                  "--curve-secret) to a key the unit allows, and "
                                  "give the unit's public key in the cluster file "
                                  "or registry; nothing was delivered",
                            address);
        return dp__fail(
            d, DP_EPOLICY,
            "the CURVE handshake with unit %s failed (ZMQ protocol error "
            "0x%x%s); nothing was delivered",
            address, cs->last_proto,
            cs->curve ? ": is the unit's public key in the cluster file right?" : "");
    }
    /*
     * Dropped before any handshake completed: what a unit requiring CURVE
     * does to a client without it (the mismatch is only seen on its side).
     */
    /*
     * On a request sent again, the unit answered this client without CURVE
     * before: a new connection closed in its handshake is another program
     * holding the port now, or the unit restarting, not a CURVE demand.
     */
    if (cs->n_disconnects > cs->sent_disconnects && !cs->ever_up && !cs->curve && resent)
        return dp__fail(d, DP_ETRANSFER,
                        "unit %s closed a new connection during the handshake, after "
                        "the one that carried the request dropped (restarting, or "
                        "another program holds its port; the request may or may not "
                        "have been carried out)",
                        address);
    if (cs->n_disconnects > cs->sent_disconnects && !cs->ever_up && !cs->curve)
        return dp__fail(
            d, DP_EPOLICY,
            "unit %s closed the connection during the handshake: it requires "
            "CURVE authentication (or speaks another protocol) and this "
            "client has no key for it: set DP_CURVE_SECRET (or --curve-secret) "
            "to a key the unit allows, with the unit's public key in the "
            "cluster file or registry; nothing was delivered",
            address);
    if (cs->n_disconnects > cs->sent_disconnects)
        return dp__fail(
            d, DP_ETRANSFER,
            "unit %s is down or unreachable: the connection that carried the "
            "request dropped before the reply (the request may or may not have "
            "been carried out)",
            address);
    /*
     * Two failed attempts, not one: the first after an outage may fail on a
     * stale neighbour entry while the next (100 ms later) gets through.
     */
    if (!cs->sent_up && cs->n_handshakes == cs->sent_handshakes &&
        cs->n_refused >= cs->sent_refused + 2)
        return dp__fail(d, DP_ETRANSFER,
                        "unit %s is down or unreachable: %sno connection could be made "
                        "(refused, or the host cannot be reached); nothing was delivered",
                        address, cs->ever_up ? "the connection was lost and " : "");
    return DP_OK;
}

/* Read one message from cs into reply and check its id. */
static int
recv_reply(csock *cs, const char *address, const char *rid, dp__buf *reply, dp_detail *d)
{
    zmq_msg_t m;
    zmq_msg_init(&m);
    if (zmq_msg_recv(&m, cs->s, ZMQ_DONTWAIT) < 0) {
        int e = zmq_errno();
        zmq_msg_close(&m);
        return dp__fail_sys(d, e, "receive from unit %s", address);
    }
    bool more = zmq_msg_more(&m);
    const uint8_t *p = zmq_msg_data(&m);
    size_t n = zmq_msg_size(&m);
    int rc = DP_OK;
    if (more || !reply_has_rid(p, n, rid))
        rc = dp__fail(d, DP_EPROTO,
                      "unit %s sent a reply that does not carry request id %s", address,
                      rid);
    else if (dp__buf_append(reply, p, n) != DP_OK)
        rc = dp__fail(d, DP_ENOMEM, "reply from unit %s: out of memory (%zu bytes)",
                      address, n);
    zmq_msg_close(&m);
    return rc;
}

int
dp__ctl_call(dp__ctl_client *c, const char *address, const dp__buf *req, const char *rid,
             double timeout_s, dp__buf *reply, dp_detail *d)
{
    dp__ctl_item it = {.address = address, .req = req->data, .len = req->len, .rid = rid};
    dp__buf_init(&it.reply);
    int rc = dp__ctl_call_many(c, &it, 1, timeout_s);
    if (rc == DP_OK) {
        if (dp__buf_append(reply, it.reply.data, it.reply.len) != DP_OK)
            rc = dp__fail(d, DP_ENOMEM, "reply from unit %s: out of memory", address);
    } else if (d != NULL) {
        *d = it.det;
    }
    dp__buf_fini(&it.reply);
    return rc;
}

/* Send it->req on a socket of the pool (or a new one); det says why not. */
static int
item_send(dp__ctl_client *c, dp__ctl_item *it, dp_detail *det)
{
    csock *cs = NULL;
    it->sock = NULL;
    int rc = sock_take(c, it->address, &cs, det);
    if (rc == DP_OK)
        rc = send_req(cs, it->address, it->req, it->len, det);
    if (rc != DP_OK) {
        sock_close(cs);
        return rc;
    }
    it->sock = cs;
    return DP_OK;
}

uint64_t
dp__ctl_client_resent(const dp__ctl_client *c)
{
    return c == NULL ? 0 : __atomic_load_n(&c->n_resent, __ATOMIC_RELAXED);
}

int
dp__ctl_send(dp__ctl_client *c, dp__ctl_item *it)
{
    dp_detail_clear(&it->det);
    it->resent = 0;
    it->dropped = false;
    it->resend_at = 0;
    it->refused_since = 0;
    it->rc = item_send(c, it, &it->det);
    if (it->rc != DP_OK)
        return it->rc;
    it->rc = DP_CTL_PENDING;
    return DP_OK;
}

/* Slices of a wait: how often the monitor verdicts are looked at (at most). */
#define WAIT_SLICE_MS 100
/* Sending a repeatable request again after a drop: 50 ms, doubling, at most 1 s. */
#define RESEND_FIRST_S 0.05
#define RESEND_MAX_S 1.0

/*
 * A repeatable item whose connection dropped goes out again on a new socket
 * at its resend_at; one that cannot be sent is tried again later. Returns
 * whether it waits on a socket now.
 */
static bool
item_resend(dp__ctl_client *c, dp__ctl_item *it, double now)
{
    if (it->sock != NULL || now < it->resend_at)
        return it->sock != NULL;
    dp_detail e;
    dp_detail_clear(&e);
    if (item_send(c, it, &e) == DP_OK) {
        it->resent++;
        __atomic_add_fetch(&c->n_resent, 1, __ATOMIC_RELAXED);
        return true;
    }
    it->resend_at = now + RESEND_MAX_S;
    it->det = e;
    return false;
}

/*
 * Whether a fresh TCP connection to address ("tcp://HOST:PORT", HOST numeric)
 * is refused right now: the host answers and nothing listens there, so the
 * unit's process is gone. ZMQ's events cannot tell that from a link that is
 * down (both are "connect retried"), and only the link deserves the request
 * again; a host that does not answer within PROBE_MS, a name that is not
 * numeric, or any other error counts as not refused.
 */
/*
 * A refusal comes back within a round trip; the wait loop probes each failed
 * item in turn, so a flap that leaves many units unanswering costs PROBE_MS
 * each: kept short (a probe that times out only means "send it again").
 */
#define PROBE_MS 20
static bool
peer_refuses(const char *address)
{
    if (strncmp(address, "tcp://", 6) != 0)
        return false;
    char host[256];
    snprintf(host, sizeof host, "%s", address + 6);
    char *colon = strrchr(host, ':');
    if (colon == NULL)
        return false;
    *colon = '\0';
    const char *port = colon + 1, *h = host;
    size_t hl = strlen(host);
    if (hl >= 2 && host[0] == '[' && host[hl - 1] == ']') { /* [v6 address] */
        host[hl - 1] = '\0';
        h = host + 1;
    }
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_NUMERICHOST | AI_NUMERICSERV};
    struct addrinfo *ai = NULL;
    if (getaddrinfo(h, port, &hints, &ai) != 0 || ai == NULL)
        return false;
    bool refused = false;
    int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
                    ai->ai_protocol);
    if (fd >= 0) {
        int rc = connect(fd, ai->ai_addr, ai->ai_addrlen);
        if (rc != 0 && errno == EINPROGRESS) {
            struct pollfd p = {.fd = fd, .events = POLLOUT};
            int err = 0;
            socklen_t el = sizeof err;
            if (poll(&p, 1, PROBE_MS) == 1 &&
                getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) == 0)
                refused = err == ECONNREFUSED;
        } else if (rc != 0) {
            refused = errno == ECONNREFUSED;
        }
        close(fd);
    }
    freeaddrinfo(ai);
    return refused;
}

bool
dp__ctl_peer_gone(const char *address)
{
    return address != NULL && peer_refuses(address);
}

/*
 * After a failed verdict (e): whether the item is sent again (later) instead:
 * a repeatable request whose connection dropped, while the budget lasts,
 * unless its address has refused fresh connections for REFUSED_GIVE_UP_S: a
 * unit back on its port within that (a quick restart) still answers, but a
 * process gone for good is not a flap, and waiting for it would cost the
 * caller its whole round (with replicas, the next replica's turn).
 */
#define REFUSED_GIVE_UP_S 2.0
static bool
item_may_resend(dp__ctl_item *it, const csock *cs, int vrc, double now, double deadline,
                dp_detail *e)
{
    if (cs->n_disconnects > cs->sent_disconnects)
        it->dropped = true;
    if (!it->repeat || !it->dropped || vrc != DP_ETRANSFER || deadline - now < 0.01)
        return false;
    if (!peer_refuses(it->address)) {
        it->refused_since = 0;
    } else if (it->refused_since == 0) {
        it->refused_since = now;
    } else if (now - it->refused_since >= REFUSED_GIVE_UP_S) {
        dp__fail(e, DP_ETRANSFER,
                 "unit %s is down: the connection that carried the request dropped, "
                 "it was sent again %u time(s), and fresh connections to it have been "
                 "refused for %.1f s: its process is gone (the request may or may "
                 "not have been carried out)",
                 it->address, it->resent, now - it->refused_since);
        return false;
    }
    it->resend_at = now + dp__backoff_step(RESEND_FIRST_S, RESEND_MAX_S, it->resent);
    return true;
}

/*
 * The pending items of one dp__ctl_wait_many and their poll set, which is
 * made again every slice (an item may be resent on a new socket, or fail).
 */
typedef struct waitset {
    dp__ctl_item *items;
    size_t n;
    size_t waiting;      /* items still pending */
    zmq_pollitem_t *pis; /* two per pending item: its socket and its monitor */
    size_t *which;       /* the item of each of pis; SIZE_MAX: a monitor */
    size_t np;           /* pis in use */
    double deadline;
    double wake; /* the earliest resend before the deadline, this slice */
} waitset;

/* Count the pending items and allocate their poll set; out of memory, they fail. */
static void
waitset_init(waitset *w)
{
    w->waiting = 0;
    for (size_t i = 0; i < w->n; i++)
        w->waiting += w->items[i].rc == DP_CTL_PENDING;
    w->pis = w->waiting > 0 ? calloc(2 * w->waiting, sizeof *w->pis) : NULL;
    w->which = w->waiting > 0 ? calloc(2 * w->waiting, sizeof *w->which) : NULL;
    if (w->waiting > 0 && (w->pis == NULL || w->which == NULL)) {
        /* Each pending socket may still get its reply: close, never reuse. */
        for (size_t i = 0; i < w->n; i++) {
            dp__ctl_item *it = &w->items[i];
            if (it->rc != DP_CTL_PENDING)
                continue;
            sock_close(it->sock);
            it->sock = NULL;
            it->rc = dp__fail(&it->det, DP_ENOMEM, "call: out of memory");
        }
        w->waiting = 0;
    }
}

/*
 * The poll set of this slice: each pending item's socket and monitor, once
 * it is (re)sent. An item the monitor says cannot be answered fails now, or
 * waits for its resend (w->wake).
 */
static void
waitset_fill(dp__ctl_client *c, waitset *w, double now)
{
    w->np = 0;
    w->wake = w->deadline;
    for (size_t i = 0; i < w->n; i++) {
        dp__ctl_item *it = &w->items[i];
        if (it->rc != DP_CTL_PENDING)
            continue;
        if (!item_resend(c, it, now)) {
            w->wake = it->resend_at < w->wake ? it->resend_at : w->wake;
            continue;
        }
        csock *cs = it->sock;
        dp_detail e;
        dp_detail_clear(&e);
        int vrc = sock_verdict(cs, it->address, it->dropped && it->resent > 0, &e);
        if (vrc != DP_OK) {
            bool again = item_may_resend(it, cs, vrc, now, w->deadline, &e);
            sock_close(cs);
            it->sock = NULL;
            it->det = e;
            if (again) { /* the unit may answer on a new connection */
                w->wake = it->resend_at < w->wake ? it->resend_at : w->wake;
                continue;
            }
            /* The unit cannot answer this request: fail it now. */
            it->rc = vrc;
            w->waiting--;
            continue;
        }
        w->pis[w->np] = (zmq_pollitem_t){.socket = cs->s, .events = ZMQ_POLLIN};
        w->which[w->np++] = i;
        w->pis[w->np] = (zmq_pollitem_t){.socket = cs->mon, .events = ZMQ_POLLIN};
        w->which[w->np++] = SIZE_MAX;
    }
}

/* Receive the replies zmq_poll found ready; a socket is pooled again after a good one. */
static void
waitset_take(dp__ctl_client *c, waitset *w)
{
    for (size_t j = 0; j < w->np; j++) {
        if (w->which[j] == SIZE_MAX || !(w->pis[j].revents & ZMQ_POLLIN))
            continue;
        dp__ctl_item *it = &w->items[w->which[j]];
        csock *cs = it->sock;
        it->rc = recv_reply(cs, it->address, it->rid, &it->reply, &it->det);
        if (it->rc == DP_OK)
            sock_give_back(c, it->address, cs);
        else
            sock_close(cs);
        it->sock = NULL;
        w->waiting--;
    }
}

/* An item still pending at the deadline gets its error: why no reply came. */
static void
item_expire(dp__ctl_item *it, double timeout_s)
{
    bool never_up = false;
    if (it->rc == DP_CTL_PENDING && it->sock != NULL) {
        csock *cs = it->sock;
        drain_events(cs); /* a handshake may have come after the last look */
        never_up = !cs->sent_up && cs->n_handshakes == cs->sent_handshakes;
    }
    if (it->rc == DP_CTL_PENDING && it->dropped && (it->sock == NULL || never_up)) {
        /* Dropped, sent again, and the unit never reached before the deadline. */
        sock_close(it->sock);
        it->sock = NULL;
        char last[DP_DETAIL_MAX];
        snprintf(last, sizeof last, "%s", it->det.msg);
        it->rc = dp__fail(&it->det, DP_ETRANSFER,
                          "unit %s is down or unreachable: the connection that "
                          "carried the request dropped, and it was sent again %u "
                          "time(s) within %.3g s without an answer (the request may "
                          "or may not have been carried out; last: %s)",
                          it->address, it->resent, timeout_s, last);
    } else if (it->rc == DP_CTL_PENDING) {
        /* No reply in time: the socket may still get one; never reuse it. */
        csock *cs = it->sock;
        sock_close(cs);
        it->sock = NULL;
        char again[96] = "";
        if (it->resent > 0)
            snprintf(again, sizeof again,
                     " (sent %u times: the connections of the earlier ones dropped)",
                     it->resent + 1);
        if (never_up)
            it->rc = dp__fail(&it->det, DP_ETIMEDOUT,
                              "unit %s did not answer within %.3g s: no connection "
                              "could be made (unit unreachable?)%s",
                              it->address, timeout_s, again);
        else
            it->rc =
                dp__fail(&it->det, DP_ETIMEDOUT, "unit %s did not reply within %.3g s%s",
                         it->address, timeout_s, again);
    }
}

int
dp__ctl_wait_many(dp__ctl_client *c, dp__ctl_item *items, size_t n, double timeout_s)
{
    waitset w = {.items = items, .n = n};
    waitset_init(&w);
    w.deadline = dp__now_s() + (timeout_s > 0 ? timeout_s : 0);
    while (w.waiting > 0) {
        waitset_fill(c, &w, dp__now_s());
        if (w.waiting == 0)
            break;
        double left = w.deadline - dp__now_s();
        if (left <= 0)
            break;
        if (w.wake - dp__now_s() < left)
            left = w.wake - dp__now_s() > 0 ? w.wake - dp__now_s() : 0;
        long ms = (long)(left * 1000) + 1;
        int k = zmq_poll(w.pis, (int)w.np, ms < WAIT_SLICE_MS ? ms : WAIT_SLICE_MS);
        if (k < 0) {
            if (zmq_errno() == EINTR)
                continue;
            break;
        }
        waitset_take(c, &w);
    }
    int first = DP_OK;
    for (size_t i = 0; i < n; i++) {
        item_expire(&items[i], timeout_s);
        if (items[i].rc != DP_OK && first == DP_OK)
            first = items[i].rc;
    }
    free(w.pis);
    free(w.which);
    return first;
}

int
dp__ctl_call_many(dp__ctl_client *c, dp__ctl_item *items, size_t n, double timeout_s)
{
    /* Every request goes out before any reply is read. */
    for (size_t i = 0; i < n; i++)
        dp__ctl_send(c, &items[i]);
    return dp__ctl_wait_many(c, items, n, timeout_s);
}

int
dp__ctl_notify(dp__ctl_client *c, const char *address, const void *msg, size_t len,
               dp_detail *d)
{
    csock *cs = NULL;
    int rc = sock_take(c, address, &cs, d);
    if (rc != DP_OK)
        return rc;
    rc = send_req(cs, address, msg, len, d);
    if (rc != DP_OK) {
        sock_close(cs);
        return rc;
    }
    /* Nothing comes back for a notify, so the socket stays clean for reuse. */
    sock_give_back(c, address, cs);
    return DP_OK;
}
