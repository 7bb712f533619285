/*
 * The control server (see ctl.h): a ZMQ ROUTER socket on its own thread,
 * deferred replies, and CURVE on the server side (the allow list and the ZAP
 * handler). The client is in ctl_client.c; what both use (key files, a
 * socket monitor's events) in ctl_common.c.
 *
 * Design notes
 * - Server: one thread owns the ROUTER socket from bind to close; nothing else
 *   touches it. It polls with a short timeout so close() can stop it through an
 *   atomic flag. A request is one frame behind the peer's routing id; anything
 *   else (more frames, empty frames) is dropped. The handler runs on this thread.
 * - Deferred replies: a handler may hand its request's reply to another
 *   thread (dp__ctl_defer). That thread never touches the ROUTER socket: it
 *   queues the reply in the server's outbox (mutex) and writes a byte to the
 *   outbox's pipe, which the server thread polls next to the socket and
 *   drains, sending each reply behind its saved routing id. The outbox is
 *   reference counted (the server and every open token), so a token may
 *   outlive the server: its reply is then dropped.
 * - Lock order: the outbox mutex and the allow list mutex are leaves; no ZMQ
 *   call blocks while either is held.
 */
#include "ctl/ctl_int.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

#include "common/list.h"

#define DEFAULT_MAX_MSG (64u << 20)
#define POLL_MS 50

/* A reply waiting for the server thread. */
struct out_item {
    dp__list_node link; /* outbox.items */
    size_t id_len, len;
    uint8_t *data; /* routing id, then the reply */
};

/* Replies of deferred requests, handed to the server thread. */
typedef struct outbox {
    pthread_mutex_t mu;
    int refs;    /* the server and each open token; under mu */
    bool closed; /* the server is gone: replies are dropped */
    int pipe_r, pipe_w;
    dp__list items; /* struct out_item, oldest first; under mu */
} outbox;

struct dp__ctl_deferred {
    outbox *ob;
    size_t id_len;
    uint8_t id[256]; /* ROUTER routing ids are at most 255 bytes */
};

static void
outbox_unref(outbox *ob)
{
    pthread_mutex_lock(&ob->mu);
    bool last = --ob->refs == 0;
    pthread_mutex_unlock(&ob->mu);
    if (!last)
        return;
    for (struct out_item *it;
         (it = DP_LIST_FIRST(&ob->items, struct out_item, link)) != NULL;) {
        dp__list_remove(&ob->items, &it->link);
        free(it->data);
        free(it);
    }
    close(ob->pipe_r);
    close(ob->pipe_w);
    pthread_mutex_destroy(&ob->mu);
    free(ob);
}

/* The request the server thread is handling now (NULL elsewhere). */
static _Thread_local struct {
    outbox *ob;
    const zmq_msg_t *id;
} cur_req;

dp__ctl_deferred *
dp__ctl_defer(void)
{
    if (cur_req.ob == NULL ||
        zmq_msg_size((zmq_msg_t *)cur_req.id) > sizeof((dp__ctl_deferred *)NULL)->id)
        return NULL;
    dp__ctl_deferred *t = malloc(sizeof *t);
    if (t == NULL)
        return NULL;
    t->ob = cur_req.ob;
    t->id_len = zmq_msg_size((zmq_msg_t *)cur_req.id);
    memcpy(t->id, zmq_msg_data((zmq_msg_t *)cur_req.id), t->id_len);
    pthread_mutex_lock(&t->ob->mu);
    t->ob->refs++;
    pthread_mutex_unlock(&t->ob->mu);
    return t;
}

void
dp__ctl_deferred_send(dp__ctl_deferred *t, const void *msg, size_t len)
{
    if (t == NULL)
        return;
    outbox *ob = t->ob;
    struct out_item *it = len > 0 ? calloc(1, sizeof *it) : NULL;
    uint8_t *data = it != NULL ? malloc(t->id_len + len) : NULL;
    if (it != NULL && data != NULL) {
        memcpy(data, t->id, t->id_len);
        memcpy(data + t->id_len, msg, len);
        it->data = data;
        it->id_len = t->id_len;
        it->len = len;
        pthread_mutex_lock(&ob->mu);
        bool queued = !ob->closed;
        if (queued)
            dp__list_insert_tail(&ob->items, &it->link);
        pthread_mutex_unlock(&ob->mu);
        if (queued) {
            ssize_t w = write(ob->pipe_w, "r", 1); /* full pipe: a wake-up is pending */
            (void)w;
            it = NULL;
            data = NULL;
        }
    } else if (len > 0) {
        DP_LOG_W("ctl server: a deferred reply was dropped (out of memory)");
    }
    free(data);
    free(it);
    free(t);
    outbox_unref(ob);
}

struct dp__ctl_server {
    void *zctx;
    void *sock;
    outbox *ob;
    pthread_t thread;
    bool thread_started;
    int stop; /* atomic */
    dp_ctl_handler handler;
    dp_ctl_oversize oversize;
    void *ctx;
    size_t max_msg;
    uint64_t served; /* atomic */
    char address[128];
    /* CURVE (curve_on): the ZAP socket (server thread) and the allowed keys. */
    bool curve_on;
    void *zap;
    void *mon; /* PAIR: handshakes that failed before ZAP (no CURVE at all) */
    char allow_dir[512];
    pthread_mutex_t allow_mu; /* guards allow, n_allow */
    uint8_t (*allow)[32];
    size_t n_allow;
    uint8_t own_pub[32];   /* the server's own public key: always allowed */
    uint64_t auth_refused; /* atomic */
    uint64_t auth_allowed; /* atomic */
};

/* ---- the allow list ---- */

int
dp__ctl_server_reload_allow(dp__ctl_server *s, size_t *n_keys, dp_detail *d)
{
    if (!s->curve_on)
        return dp__fail(d, DP_EINVAL, "ctl server: no CURVE, so no allow list");
    DIR *dir = opendir(s->allow_dir);
    if (dir == NULL)
        return dp__fail_sys(d, errno, "allow directory %s", s->allow_dir);
    uint8_t(*keys)[32] = NULL;
    size_t n = 0, cap = 0;
    int rc = DP_OK;
    struct dirent *e;
    while ((e = readdir(dir)) != NULL) {
        size_t len = strlen(e->d_name);
        if (len < 5 || strcmp(e->d_name + len - 4, ".pub") != 0)
            continue;
        char path[1024], z[41];
        snprintf(path, sizeof path, "%s/%s", s->allow_dir, e->d_name);
        dp_detail why;
        dp_detail_clear(&why);
        if (dp__ctl_key_read(path, false, z, &why) != DP_OK) {
            DP_LOG_W("ctl server: skipping %s", dp_detail_msg(&why));
            continue;
        }
        if (n == cap) {
            size_t nc = cap ? cap * 2 : 16;
            void *nk = realloc(keys, nc * sizeof *keys);
            if (nk == NULL) {
                rc = dp__fail(d, DP_ENOMEM, "ctl server: out of memory");
                break;
            }
            keys = nk;
            cap = nc;
        }
        zmq_z85_decode(keys[n++], z);
    }
    closedir(dir);
    if (rc != DP_OK) {
        free(keys);
        return rc;
    }
    pthread_mutex_lock(&s->allow_mu);
    free(s->allow);
    s->allow = keys;
    s->n_allow = n;
    pthread_mutex_unlock(&s->allow_mu);
    if (n_keys != NULL)
        *n_keys = n;
    return DP_OK;
}

uint64_t
dp__ctl_server_auth_refused(const dp__ctl_server *s)
{
    return __atomic_load_n(&s->auth_refused, __ATOMIC_RELAXED);
}

static bool
key_allowed(dp__ctl_server *s, const uint8_t *key)
{
    /* Whoever holds the unit's own secret key (its launcher, its peers) is in. */
    if (memcmp(key, s->own_pub, 32) == 0)
        return true;
    pthread_mutex_lock(&s->allow_mu);
    bool ok = false;
    for (size_t i = 0; i < s->n_allow && !ok; i++)
        ok = memcmp(s->allow[i], key, 32) == 0;
    pthread_mutex_unlock(&s->allow_mu);
    return ok;
}

/*
 * A handshake that failed on the server socket without reaching ZAP: a
 * client without CURVE (a mechanism mismatch) or a broken one. Counted and
 * logged as a refusal. Server thread.
 */
static void
mon_event(dp__ctl_server *s)
{
    uint16_t ev;
    uint32_t val;
    if (!dp__ctl_mon_recv(s->mon, &ev, &val))
        return;
    if (ev != ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL &&
        ev != ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL)
        return;
    uint64_t k = __atomic_add_fetch(&s->auth_refused, 1, __ATOMIC_RELAXED);
    if (k <= 10 || k % 1000 == 0)
        DP_LOG_W("ctl server: refused a client that does not speak CURVE (%s; %" PRIu64
                 " refused so far)",
                 val == ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH ? "no key"
                                                                   : "a broken handshake",
                 k);
}

/*
 * One ZAP request (RFC 27): version, request id, domain, address, identity,
 * mechanism, credentials; answered 200 for a CURVE key in the allow list,
 * else 400. Server thread.
 */
static void
zap_answer(dp__ctl_server *s)
{
    zmq_msg_t f[8];
    int nf = 0;
    bool more = true;
    while (more && nf < 8) {
        zmq_msg_init(&f[nf]);
        if (zmq_msg_recv(&f[nf], s->zap, 0) < 0) {
            zmq_msg_close(&f[nf]);
            break;
        }
        more = zmq_msg_more(&f[nf]);
        nf++;
    }
    while (more) { /* more frames than ZAP has: drain */
        zmq_msg_t x;
        zmq_msg_init(&x);
        if (zmq_msg_recv(&x, s->zap, 0) < 0) {
            zmq_msg_close(&x);
            break;
        }
        more = zmq_msg_more(&x);
        zmq_msg_close(&x);
    }
    bool ok = false;
    char peer[64] = "?", key[41] = "?";
    if (nf >= 7) {
        size_t an = DP_MIN(zmq_msg_size(&f[3]), sizeof peer - 1);
        memcpy(peer, zmq_msg_data(&f[3]), an);
        peer[an] = '\0';
        bool curve =
            zmq_msg_size(&f[5]) == 5 && memcmp(zmq_msg_data(&f[5]), "CURVE", 5) == 0;
        if (curve && zmq_msg_size(&f[6]) == 32) {
            zmq_z85_encode(key, zmq_msg_data(&f[6]), 32);
            ok = key_allowed(s, zmq_msg_data(&f[6]));
        }
    }
    if (ok) {
        __atomic_add_fetch(&s->auth_allowed, 1, __ATOMIC_RELAXED);
    } else {
        uint64_t k = __atomic_add_fetch(&s->auth_refused, 1, __ATOMIC_RELAXED);
        /* Every refusal is counted; the first ones and then one in 1000 logged. */
        if (k <= 10 || k % 1000 == 0)
            DP_LOG_W("ctl server: refused a client from %s: key %s is not in %s (%" PRIu64
                     " refused so far)",
                     peer, key, s->allow_dir, k);
    }
    /* Reply: version, request id, status code, status text, user id, metadata. */
    if (nf >= 2) {
        zmq_send(s->zap, zmq_msg_data(&f[0]), zmq_msg_size(&f[0]), ZMQ_SNDMORE);
        zmq_send(s->zap, zmq_msg_data(&f[1]), zmq_msg_size(&f[1]), ZMQ_SNDMORE);
        zmq_send(s->zap, ok ? "200" : "400", 3, ZMQ_SNDMORE);
        const char *txt = ok ? "OK" : "key not allowed";
        zmq_send(s->zap, txt, strlen(txt), ZMQ_SNDMORE);
        zmq_send(s->zap, ok ? key : "", ok ? 40 : 0, ZMQ_SNDMORE);
        zmq_send(s->zap, "", 0, 0);
    }
    for (int i = 0; i < nf; i++)
        zmq_msg_close(&f[i]);
}

/* Send the replies deferred requests queued (server thread). */
static void
send_outbox(dp__ctl_server *s)
{
    char junk[64];
    while (read(s->ob->pipe_r, junk, sizeof junk) > 0) {
    }
    dp__list items = {0};
    pthread_mutex_lock(&s->ob->mu);
    dp__list_move_tail(&items, &s->ob->items);
    pthread_mutex_unlock(&s->ob->mu);
    for (struct out_item *it;
         (it = DP_LIST_FIRST(&items, struct out_item, link)) != NULL;) {
        dp__list_remove(&items, &it->link);
        if (zmq_send(s->sock, it->data, it->id_len, ZMQ_SNDMORE | ZMQ_DONTWAIT) >= 0 &&
            zmq_send(s->sock, it->data + it->id_len, it->len, ZMQ_DONTWAIT) < 0)
            DP_LOG_D("ctl server: deferred reply dropped: %s", zmq_strerror(zmq_errno()));
        free(it->data);
        free(it);
    }
}

static void *
server_main(void *arg)
{
    dp__ctl_server *s = arg;
    dp__buf reply;
    dp__buf_init(&reply);
    zmq_msg_t id, body;
    zmq_msg_init(&id);
    zmq_msg_init(&body);
    while (!__atomic_load_n(&s->stop, __ATOMIC_ACQUIRE)) {
        zmq_pollitem_t pi[4] = {{.socket = s->sock, .events = ZMQ_POLLIN},
                                {.fd = s->ob->pipe_r, .events = ZMQ_POLLIN},
                                {.socket = s->zap, .events = ZMQ_POLLIN},
                                {.socket = s->mon, .events = ZMQ_POLLIN}};
        int n = zmq_poll(pi, s->zap != NULL ? 4 : 2, POLL_MS);
        if (n < 0) {
            if (zmq_errno() == EINTR)
                continue;
            DP_LOG_E("ctl server: zmq_poll: %s", zmq_strerror(zmq_errno()));
            break;
        }
        if (pi[1].revents & ZMQ_POLLIN)
            send_outbox(s);
        if (s->zap != NULL && (pi[2].revents & ZMQ_POLLIN))
            zap_answer(s);
        if (s->mon != NULL && (pi[3].revents & ZMQ_POLLIN))
            mon_event(s);
        if (!(pi[0].revents & ZMQ_POLLIN))
            continue;
        if (zmq_msg_recv(&id, s->sock, ZMQ_DONTWAIT) < 0)
            continue;
        if (!zmq_msg_more(&id))
            continue; /* ROUTER always prefixes the peer id; defensive */
        if (zmq_msg_recv(&body, s->sock, 0) < 0)
            continue;
        if (zmq_msg_more(&body)) {
            /* Not our protocol: drain the rest of the message and drop it. */
            while (zmq_msg_more(&body) && zmq_msg_recv(&body, s->sock, 0) >= 0) {
            }
            DP_LOG_W("ctl server: dropped a multi-frame message");
            continue;
        }
        size_t len = zmq_msg_size(&body);
        const uint8_t *msg = zmq_msg_data(&body);
        dp__buf_reset(&reply);
        if (len > s->max_msg) {
            if (s->oversize != NULL)
                s->oversize(s->ctx, msg, len, &reply);
        } else {
            cur_req.ob = s->ob;
            cur_req.id = &id;
            s->handler(s->ctx, msg, len, &reply);
            cur_req.ob = NULL;
            cur_req.id = NULL;
        }
        __atomic_add_fetch(&s->served, 1, __ATOMIC_RELAXED);
        if (reply.len == 0 || reply.oom)
            continue;
        /* The routing id first, then the reply; a gone peer drops it. */
        zmq_msg_t rid;
        zmq_msg_init(&rid);
        zmq_msg_copy(&rid, &id);
        if (zmq_msg_send(&rid, s->sock, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&rid);
            continue;
        }
        if (zmq_send(s->sock, reply.data, reply.len, ZMQ_DONTWAIT) < 0)
            DP_LOG_D("ctl server: reply dropped: %s", zmq_strerror(zmq_errno()));
    }
    zmq_msg_close(&id);
    zmq_msg_close(&body);
    dp__buf_fini(&reply);
    return NULL;
}

int
dp__ctl_server_open(const dp__ctl_server_opts *opts, dp_ctl_handler handler,
                    dp_ctl_oversize oversize, void *ctx, dp__ctl_server **out,
                    dp_detail *d)
{
    int rc;
    if (handler == NULL || out == NULL)
        return dp__fail(d, DP_EINVAL, "ctl server: handler and out are required");
    dp__ctl_server *s = calloc(1, sizeof *s);
    if (s == NULL)
        return dp__fail(d, DP_ENOMEM, "ctl server: out of memory");
    s->handler = handler;
    s->oversize = oversize;
    s->ctx = ctx;
    s->max_msg = opts && opts->max_msg_bytes ? opts->max_msg_bytes : DEFAULT_MAX_MSG;
    const char *ip =
        opts && opts->bind_ip && *opts->bind_ip ? opts->bind_ip : "127.0.0.1";
    unsigned port = opts ? opts->port : 0;

    s->ob = calloc(1, sizeof *s->ob);
    int pfd[2];
    if (s->ob == NULL) {
        rc = dp__fail(d, DP_ENOMEM, "ctl server: out of memory");
        goto fail;
    }
    if (pipe2(pfd, O_NONBLOCK | O_CLOEXEC) != 0) {
        rc = dp__fail_sys(d, errno, "ctl server: pipe");
        free(s->ob);
        s->ob = NULL;
        goto fail;
    }
    pthread_mutex_init(&s->ob->mu, NULL);
    s->ob->refs = 1;
    s->ob->pipe_r = pfd[0];
    s->ob->pipe_w = pfd[1];
    s->zctx = zmq_ctx_new();
    if (s->zctx == NULL) {
        rc = dp__fail_sys(d, zmq_errno(), "ctl server: zmq_ctx_new");
        goto fail;
    }
    s->sock = zmq_socket(s->zctx, ZMQ_ROUTER);
    if (s->sock == NULL) {
        rc = dp__fail_sys(d, zmq_errno(), "ctl server: zmq_socket(ROUTER)");
        goto fail;
    }
    int zero = 0;
    zmq_setsockopt(s->sock, ZMQ_LINGER, &zero, sizeof zero);
    pthread_mutex_init(&s->allow_mu, NULL);
    if (opts != NULL && opts->curve_secret != NULL) {
        /* CURVE: the ZAP handler is bound first, so no handshake goes unchecked. */
        if (!dp__ctl_key_valid(opts->curve_secret) || opts->curve_allow_dir == NULL) {
            rc = dp__fail(d, DP_EINVAL,
                          "ctl server: CURVE needs a secret key and an "
                          "allow directory");
            goto fail;
        }
        s->curve_on = true;
        snprintf(s->allow_dir, sizeof s->allow_dir, "%s", opts->curve_allow_dir);
        char own[41];
        if ((rc = dp__ctl_key_public(opts->curve_secret, own, d)) != DP_OK)
            goto fail;
        zmq_z85_decode(s->own_pub, own);
        if ((rc = dp__ctl_server_reload_allow(s, NULL, d)) != DP_OK)
            goto fail;
        s->zap = zmq_socket(s->zctx, ZMQ_REP);
        if (s->zap == NULL ||
            zmq_setsockopt(s->zap, ZMQ_LINGER, &zero, sizeof zero) != 0 ||
            zmq_bind(s->zap, "inproc://zeromq.zap.01") != 0) {
            rc = dp__fail_sys(d, zmq_errno(), "ctl server: ZAP handler socket");
            goto fail;
        }
        int one = 1;
        if (zmq_setsockopt(s->sock, ZMQ_CURVE_SERVER, &one, sizeof one) != 0 ||
            zmq_setsockopt(s->sock, ZMQ_CURVE_SECRETKEY, opts->curve_secret, 41) != 0) {
            rc = dp__fail_sys(d, zmq_errno(), "ctl server: CURVE (libzmq without it?)");
            goto fail;
        }
        /* ZAP requests carry this domain; failures are answered, not dropped. */
        zmq_setsockopt(s->sock, ZMQ_ZAP_DOMAIN, "dataplane", 9);
        char mon[96];
        snprintf(mon, sizeof mon, "inproc://dp-ctl-srv-mon-%p", (void *)s);
        if (zmq_socket_monitor(s->sock, mon,
                               ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                                   ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL) != 0 ||
            (s->mon = zmq_socket(s->zctx, ZMQ_PAIR)) == NULL ||
            zmq_setsockopt(s->mon, ZMQ_LINGER, &zero, sizeof zero) != 0 ||
            zmq_connect(s->mon, mon) != 0) {
            rc = dp__fail_sys(d, zmq_errno(), "ctl server: monitor socket");
            goto fail;
        }
    }
    /* Past twice the limit ZMQ drops the connection instead of buffering it. */
    int64_t hard = (int64_t)s->max_msg * 2;
    zmq_setsockopt(s->sock, ZMQ_MAXMSGSIZE, &hard, sizeof hard);
    char ep[160];
    if (port == 0)
        snprintf(ep, sizeof ep, "tcp://%s:*", ip);
    else
        snprintf(ep, sizeof ep, "tcp://%s:%u", ip, port);
    if (zmq_bind(s->sock, ep) != 0) {
        rc = dp__fail_sys(d, zmq_errno(),
                          "ctl server: bind %s (is the address local and "
                          "the port free?)",
                          ep);
        goto fail;
    }
    size_t alen = sizeof s->address;
    if (zmq_getsockopt(s->sock, ZMQ_LAST_ENDPOINT, s->address, &alen) != 0) {
        rc = dp__fail_sys(d, zmq_errno(), "ctl server: ZMQ_LAST_ENDPOINT");
        goto fail;
    }
    int err = pthread_create(&s->thread, NULL, server_main, s);
    if (err != 0) {
        rc = dp__fail_sys(d, err, "ctl server: pthread_create");
        goto fail;
    }
    s->thread_started = true;
    *out = s;
    return DP_OK;
fail:
    dp__ctl_server_close(s);
    return rc;
}

const char *
dp__ctl_server_address(const dp__ctl_server *s)
{
    return s->address;
}

uint64_t
dp__ctl_server_served(const dp__ctl_server *s)
{
    return __atomic_load_n(&s->served, __ATOMIC_RELAXED);
}

void
dp__ctl_server_close(dp__ctl_server *s)
{
    if (s == NULL)
        return;
    if (s->thread_started) {
        __atomic_store_n(&s->stop, 1, __ATOMIC_RELEASE);
        pthread_join(s->thread, NULL);
    }
    if (s->mon != NULL) {
        zmq_socket_monitor(s->sock, NULL, 0);
        zmq_close(s->mon);
    }
    if (s->sock != NULL)
        zmq_close(s->sock);
    if (s->zap != NULL)
        zmq_close(s->zap);
    if (s->zctx != NULL)
        zmq_ctx_term(s->zctx);
    free(s->allow);
    pthread_mutex_destroy(&s->allow_mu);
    if (s->ob != NULL) {
        pthread_mutex_lock(&s->ob->mu);
        s->ob->closed = true; /* replies of tokens still open are dropped */
        pthread_mutex_unlock(&s->ob->mu);
        outbox_unref(s->ob);
    }
    free(s);
}
