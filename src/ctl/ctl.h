/*
 * The control plane's transport: a ZMQ ROUTER server thread for a storage unit
 * and a pool of DEALER sockets for clients. It moves whole messages (msgpack
 * bytes, see src/wire) and knows nothing of their meaning, except that a reply
 * starts with its request's id: a client socket goes back to the pool only
 * after a complete reply carrying the id of the request it sent, so a late
 * reply can never be read as the answer to the next request.
 *
 * This is the only module that includes <zmq.h>.
 */
#ifndef DP_CTL_CTL_H
#define DP_CTL_CTL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/common.h"

/* ---- server ---- */

typedef struct dp__ctl_server dp__ctl_server;

/*
 * Called on the server thread for every request of at most max_msg_bytes.
 * Fill reply with the complete reply message, or leave it empty to send
 * nothing (notify ops, messages without a readable request id). The handler
 * takes whatever locks it needs; it must not block for long.
 */
typedef void (*dp_ctl_handler)(void *ctx, const uint8_t *msg, size_t len, dp__buf *reply);

/*
 * Called instead of the handler for a message over max_msg_bytes (up to twice
 * that; larger ones make ZMQ drop the connection). may fill reply.
 */
typedef void (*dp_ctl_oversize)(void *ctx, const uint8_t *msg, size_t len,
                                dp__buf *reply);

typedef struct dp__ctl_server_opts {
    const char *bind_ip;  /* default "127.0.0.1" */
    uint16_t port;        /* 0 = a free port */
    size_t max_msg_bytes; /* default 64 MiB */
    /*
     * CURVE (NULL: none): the server's secret key (40 Z85 characters) and a
     * directory of allowed clients' public keys (*.pub, as dataplane keygen
     * writes): a client whose key is not there is refused at the handshake
     * (a ZAP handler on the server thread), counted and logged. The server's
     * own key pair is always allowed (its launcher and its peers hold it).
     */
    const char *curve_secret;
    const char *curve_allow_dir;
} dp__ctl_server_opts;

/* ---- CURVE keys (Z85 text: 40 characters and a NUL) ---- */

/*
 * Read a key file (one Z85 key; whitespace around it ignored). secret: the
 * file must not be readable by group or others (DP_EPOLICY saying how to
 * fix it). DP_EINVAL for a file that holds no key, DP_ESYS.
 */
int dp__ctl_key_read(const char *path, bool secret, char out[41], dp_detail *d);
/* The public key of a secret one; a new key pair. DP_EUNSUPPORTED without CURVE. */
int dp__ctl_key_public(const char secret[41], char out[41], dp_detail *d);
int dp__ctl_keypair(char pub[41], char secret[41], dp_detail *d);
/* Whether z85 is a well-formed key. */
bool dp__ctl_key_valid(const char *z85);

/*
 * Read the allow directory again (SIGHUP): *n_keys (NULL ok) the keys now
 * allowed; files that hold no key are logged and skipped. Threads: any.
 */
int dp__ctl_server_reload_allow(dp__ctl_server *s, size_t *n_keys, dp_detail *d);
/* Handshakes refused (keys not allowed, or no CURVE at all). Threads: any. */
uint64_t dp__ctl_server_auth_refused(const dp__ctl_server *s);

/*
 * Bind a ROUTER socket and start the server thread. The address actually bound
 * (with the real port) is available from dp__ctl_server_address().
 * Threads: any. Errors: DP_ESYS (bind failed: address in use, bad ip), DP_ENOMEM.
 */
int dp__ctl_server_open(const dp__ctl_server_opts *opts, dp_ctl_handler handler,
                        dp_ctl_oversize oversize, void *ctx, dp__ctl_server **out,
                        dp_detail *d);

/* "tcp://ip:port"; valid until close. Threads: any. */
const char *dp__ctl_server_address(const dp__ctl_server *s);

/* Requests served so far (handler calls). Threads: any. */
uint64_t dp__ctl_server_served(const dp__ctl_server *s);

/* Stop the thread and close the socket. NULL allowed. Not from the handler. */
void dp__ctl_server_close(dp__ctl_server *s);

/*
 * Deferred replies, for a request too slow to answer on the server thread (it
 * would hold up every other request). Called from inside a handler,
 * dp__ctl_defer returns a token for the request being handled (NULL when not
 * in a server's handler, or out of memory: then answer as usual); the handler
 * leaves its reply empty and hands the work and the token to another thread,
 * which calls dp__ctl_deferred_send exactly once, with the reply (len 0: none).
 * That call never blocks, frees the token, and drops the reply if the server
 * has closed meanwhile. Threads: any.
 */
typedef struct dp__ctl_deferred dp__ctl_deferred;
dp__ctl_deferred *dp__ctl_defer(void);
void dp__ctl_deferred_send(dp__ctl_deferred *t, const void *msg, size_t len);

/* ---- client ---- */

typedef struct dp__ctl_client dp__ctl_client;

/* Threads: any thread may use one client; calls run concurrently. */
int dp__ctl_client_create(dp__ctl_client **out, dp_detail *d);

/*
 * CURVE: this client's secret key (its public key is derived), and a unit's
 * public key by address (key NULL or "": none). Sockets made afterwards
 * towards an address with a key speak CURVE (idle ones made with another
 * key are closed: a unit that moved or came back with a new key answers at
 * once); a unit that refuses the key,
 * or requires CURVE from a client without it, fails calls at once with
 * DP_EPOLICY saying so (not a timeout). Threads: any.
 */
int dp__ctl_client_set_curve(dp__ctl_client *c, const char secret[41], dp_detail *d);
int dp__ctl_client_server_key(dp__ctl_client *c, const char *address, const char *key,
                              dp_detail *d);
/*
 * Close the idle pooled sockets to address (a unit that moved away: ZMQ
 * would go on reconnecting to the old address for the life of the client);
 * returns how many were closed. A socket in use by a running call is not
 * touched (it is pooled again when the call ends). Threads: any.
 */
size_t dp__ctl_client_forget(dp__ctl_client *c, const char *address);

/* Requests sent again after a dropped connection (dp__ctl_item.repeat), so far. */
uint64_t dp__ctl_client_resent(const dp__ctl_client *c);

/*
 * Whether the process that served address ("tcp://HOST:PORT", HOST numeric) is
 * gone: a fresh TCP connection to it is refused right now (the host answers,
 * nothing listens). False for a host that does not answer within 20 ms (maybe
 * a link down: the process may live on), for other transports, and on errors.
 */
bool dp__ctl_peer_gone(const char *address);

/* Close every pooled socket. NULL allowed; no call may be running. */
void dp__ctl_client_destroy(dp__ctl_client *c);

/*
 * Send req->data[0, req->len) (a request whose id is rid) to address and wait
 * at most timeout_s for the reply carrying rid, which is appended to reply.
 * Errors: DP_ETIMEDOUT (no reply in time: the socket is closed, never
 * reused), DP_EPROTO (a reply that does not carry rid), DP_ESYS, DP_EINVAL
 * (bad address).
 */
int dp__ctl_call(dp__ctl_client *c, const char *address, const dp__buf *req,
                 const char *rid, double timeout_s, dp__buf *reply, dp_detail *d);

/*
 * One request of a dp__ctl_call_many batch; rc/reply/det are its outcome.
 * repeat: the request is safe to carry out twice (dp__wire_op_repeatable):
 * when the connection that carried it drops before the reply (a link down
 * longer than the heartbeat's 4 s, the unit's process gone), it is sent again
 * on a new connection, after 50 ms doubling to 1 s, until a reply or the
 * deadline, instead of failing at once; resent counts those sends. A unit
 * that refuses connections from the start still fails the call at once.
 */
typedef struct dp__ctl_item {
    const char *address;
    const void *req;
    size_t len;
    const char *rid;
    dp__buf reply; /* caller inits and finis */
    int rc;        /* DP_CTL_PENDING between dp__ctl_send and its reply */
    dp_detail det;
    bool repeat;
    unsigned resent;
    void *sock;           /* private: the socket a sent request waits on */
    bool dropped;         /* private: a connection carrying it dropped */
    double resend_at;     /* private: when to send it again (sock is NULL until then) */
    double refused_since; /* private: since when its address refuses (0: it does not) */
} dp__ctl_item;

#define DP_CTL_PENDING (-1)

/*
 * Send every request before reading any reply; one deadline bounds the whole
 * batch. Each item gets its own rc (and det): one failure does not stop the
 * others. Returns DP_OK if every item succeeded, else the first failure's code.
 */
int dp__ctl_call_many(dp__ctl_client *c, dp__ctl_item *items, size_t n, double timeout_s);

/*
 * The two halves of dp__ctl_call_many, for a caller that sends each request as
 * soon as it can (a commit right after its own WRITE) and waits for them all
 * later. dp__ctl_send sends it->req without blocking: it->rc becomes
 * DP_CTL_PENDING, or the error (also returned). dp__ctl_wait_many then waits
 * for the pending items of items[0..n) under one deadline, leaving the others
 * as they are; every pending item ends with a code. An item sent must be
 * waited for (its socket is held until then).
 */
int dp__ctl_send(dp__ctl_client *c, dp__ctl_item *it);
int dp__ctl_wait_many(dp__ctl_client *c, dp__ctl_item *items, size_t n, double timeout_s);

/* Fire-and-forget (notify ops get no reply). Never blocks. */
int dp__ctl_notify(dp__ctl_client *c, const char *address, const void *msg, size_t len,
                   dp_detail *d);

#endif
