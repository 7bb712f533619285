/*
 * A unit with its endpoint, ticker and control server (see server.h). The
 * order matters: the endpoint first (the slab is its memory), the unit over
 * it, then the control server, which may call into the unit from its first
 * request; closing runs the other way.
 *
 * The address a unit advertises is what clients connect to, so it must be
 * one they can reach: a wildcard bind (0.0.0.0) is replaced by this host's
 * primary IPv4 address, or by the host the caller asked to advertise. The
 * unit learns it before the address is handed to anyone.
 */
#include "unit/server.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "ctl/ctl.h"
#include "http/http.h"
#include "xfer/endpoint.h"

/* Longest advertised address: what a cluster file holds (DP_CLUSTER_ADDR_MAX). */
#define ADDR_MAX 128

struct dp__unit_server {
    dp__endpoint *ep;
    dp__http_server *http; /* metrics, when asked for */
    dp__unit *u;
    dp__ctl_server *srv;
    char address[ADDR_MAX]; /* advertised: tcp://host:port */
};

/* A host no client can connect to as such: it means "every interface". */
static bool
is_wildcard(const char *host, size_t n)
{
    static const char *const any[] = {"0.0.0.0", "*", "::", "[::]", "[0:0:0:0:0:0:0:0]"};
    for (size_t i = 0; i < sizeof any / sizeof any[0]; i++)
        if (strlen(any[i]) == n && memcmp(host, any[i], n) == 0)
            return true;
    return false;
}

/*
 * This host's primary IPv4 address into buf: the source address the kernel
 * picks for a UDP socket connected to an address of a documentation range
 * (RFC 5737; connecting a UDP socket sends nothing), i.e. the address of the
 * default route; else the first interface that is up and not loopback.
 */
static bool
primary_ipv4(char *buf, size_t cap)
{
    int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd >= 0) {
        struct sockaddr_in to = {.sin_family = AF_INET, .sin_port = htons(9)};
        struct sockaddr_in me;
        socklen_t len = sizeof me;
        inet_pton(AF_INET, "203.0.113.1", &to.sin_addr);
        bool ok = connect(fd, (const struct sockaddr *)&to, sizeof to) == 0 &&
                  getsockname(fd, (struct sockaddr *)&me, &len) == 0 &&
                  me.sin_family == AF_INET && me.sin_addr.s_addr != htonl(INADDR_ANY) &&
                  (ntohl(me.sin_addr.s_addr) >> 24) != 127 &&
                  inet_ntop(AF_INET, &me.sin_addr, buf, (socklen_t)cap) != NULL;
        close(fd);
        if (ok)
            return true;
    }
    struct ifaddrs *ifs = NULL;
    if (getifaddrs(&ifs) != 0)
        return false;
    bool found = false;
    for (struct ifaddrs *i = ifs; i != NULL && !found; i = i->ifa_next) {
        if (i->ifa_addr == NULL || i->ifa_addr->sa_family != AF_INET ||
            !(i->ifa_flags & IFF_UP) || (i->ifa_flags & IFF_LOOPBACK))
            continue;
        const struct sockaddr_in *a = (const struct sockaddr_in *)(void *)i->ifa_addr;
        found = inet_ntop(AF_INET, &a->sin_addr, buf, (socklen_t)cap) != NULL;
    }
    freeifaddrs(ifs);
    return found;
}

/* The advertised "tcp://host:port" from the bound one and the options. */
static int
advertised(const char *bound, const char *advertise, char *out, size_t cap, dp_detail *d)
{
    const char *host = strncmp(bound, "tcp://", 6) == 0 ? bound + 6 : NULL;
    const char *colon = host != NULL ? strrchr(host, ':') : NULL;
    if (colon == NULL)
        return dp__fail(d, DP_EPROTO, "unit server: cannot read the bound address '%s'",
                        bound);
    char ip[INET_ADDRSTRLEN];
    const char *h = advertise;
    size_t hn = h != NULL ? strlen(h) : 0;
    if (h == NULL && is_wildcard(host, (size_t)(colon - host))) {
        if (primary_ipv4(ip, sizeof ip)) {
            h = ip;
        } else {
            h = "127.0.0.1";
            DP_LOG_W("bound to every interface (%s) but this host has no IPv4 address "
                     "other than loopback: advertising 127.0.0.1, which only clients on "
                     "this host reach; give --advertise HOST",
                     bound);
        }
        hn = strlen(h);
    }
    if (h == NULL) {
        h = host;
        hn = (size_t)(colon - host);
    }
    int n = snprintf(out, cap, "tcp://%.*s%s", (int)hn, h, colon);
    if (n < 0 || (size_t)n >= cap)
        return dp__fail(d, DP_EINVAL,
                        "unit server: advertised address 'tcp://%.*s%s' is "
                        "longer than %zu bytes",
                        (int)hn, h, colon, cap - 1);
    return DP_OK;
}

/* The unit's auth_refused counter: the control server's refusals. */
static uint64_t
auth_refused(const void *srv)
{
    return dp__ctl_server_auth_refused(srv);
}

/* /metrics and /healthz (the metrics server's handler). */
static int
http_answer(void *ctx, const char *path, dp__buf *body, const char **type)
{
    dp__unit *u = ctx;
    if (strcmp(path, "/metrics") == 0) {
        *type = "text/plain; version=0.0.4; charset=utf-8";
        return dp__unit_metrics_text(u, body) == DP_OK ? 200 : 500;
    }
    if (strcmp(path, "/healthz") == 0) {
        dp__buf_printf(body, "ok: unit %u serving\n", dp__unit_id(u));
        return 200;
    }
    dp__buf_printf(body, "not found: this unit serves /metrics and /healthz\n");
    return 404;
}

int
dp__unit_server_start(const dp__unit_opts *uo, const char *endpoint_name,
                      const dp__unit_server_opts *so, dp__unit_server **out, dp_detail *d)
{
    dp__unit_server_opts def = {0};
    if (so == NULL)
        so = &def;
    dp__unit_server *s = calloc(1, sizeof *s);
    if (s == NULL)
        return dp__fail(d, DP_ENOMEM, "unit server: out of memory");
    dp__endpoint_opts eo;
    dp__endpoint_opts_init(&eo);
    eo.progress_thread = true; /* emulated RMA (tcp) needs the unit to progress */
    int rc = dp__endpoint_create(endpoint_name, &eo, &s->ep, d);
    if (rc != 0)
        goto fail;
    dp__unit_opts o = *uo;
    o.ep = s->ep;
    if ((rc = dp__unit_create(&o, &s->u, d)) != 0 ||
        (rc = dp__unit_serve_transfers(s->u, d)) != 0 ||
        (rc = dp__unit_start_ticker(s->u, so->tick_s > 0 ? so->tick_s : 1.0, d)) != 0)
        goto fail;
    dp__ctl_server_opts cso = {.bind_ip = so->bind_ip,
                               .port = so->port,
                               .curve_secret = so->curve_secret,
                               .curve_allow_dir = so->curve_allow_dir};
    if ((rc = dp__ctl_server_open(&cso, dp__unit_handle, dp__unit_handle_oversize, s->u,
                                  &s->srv, d)) != 0 ||
        (rc = advertised(dp__ctl_server_address(s->srv), so->advertise, s->address,
                         sizeof s->address, d)) != 0)
        goto fail;
    dp__unit_set_address(s->u, s->address);
    dp__unit_set_auth_source(s->u, auth_refused, s->srv);
    if (so->metrics != NULL &&
        (rc = dp__http_server_open(so->metrics, http_answer, s->u, &s->http, d)) != 0)
        goto fail;
    *out = s;
    return DP_OK;
fail:
    dp__unit_server_close(s);
    return rc;
}

int
dp__unit_server_open(const dp__unit_opts *uo, const char *endpoint_name,
                     const char *bind_ip, uint16_t port, double tick_s,
                     dp__unit_server **out, dp_detail *d)
{
    dp__unit_server_opts so = {.bind_ip = bind_ip, .port = port, .tick_s = tick_s};
    return dp__unit_server_start(uo, endpoint_name, &so, out, d);
}

const char *
dp__unit_server_address(const dp__unit_server *s)
{
    return s->address;
}

const char *
dp__unit_server_bound_address(const dp__unit_server *s)
{
    return dp__ctl_server_address(s->srv);
}

dp__unit *
dp__unit_server_unit(const dp__unit_server *s)
{
    return s->u;
}

int
dp__unit_server_reload_allow(dp__unit_server *s, size_t *n_keys, dp_detail *d)
{
    return dp__ctl_server_reload_allow(s->srv, n_keys, d);
}

const char *
dp__unit_server_metrics_address(const dp__unit_server *s)
{
    return s->http != NULL ? dp__http_server_address(s->http) : NULL;
}

struct dp__endpoint *
dp__unit_server_endpoint(const dp__unit_server *s)
{
    return s->ep;
}

void
dp__unit_server_close_at_exit(dp__unit_server *s)
{
    if (s != NULL)
        dp__endpoint_keep_ucx_at_close(s->ep);
    dp__unit_server_close(s);
}

void
dp__unit_server_close(dp__unit_server *s)
{
    if (s == NULL)
        return;
    dp__http_server_close(s->http); /* first: its handler reads the unit */
    if (s->u != NULL)
        dp__unit_set_auth_source(s->u, NULL, NULL); /* the ticker reads it */
    dp__ctl_server_close(s->srv);
    dp__unit_stop_serving(s->u);
    dp__unit_destroy(s->u);
    dp__endpoint_destroy(s->ep);
    free(s);
}
