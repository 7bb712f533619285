/*
 * The metrics HTTP server (see http.h) over libmicrohttpd: one internal
 * polling thread, a bounded number of connections and a per-connection
 * timeout, so a slow or hostile scraper cannot hold it. Each request builds
 * its whole body through the handler, then answers it at once.
 */
#include "http/http.h"

#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

struct dp__http_server {
    struct MHD_Daemon *mhd;
    dp__http_handler fn;
    void *ctx;
    char address[96];
    _Atomic uint64_t requests;
};

int
dp__http_parse_addr(const char *s, char *ip, size_t cap, uint16_t *port, dp_detail *d)
{
    const char *colon = s != NULL ? strrchr(s, ':') : NULL;
    if (colon == NULL || colon == s || (size_t)(colon - s) >= cap)
        return dp__fail(d, DP_EINVAL,
                        "'%s' is not IP:PORT (e.g. 127.0.0.1:9464, or "
                        "0.0.0.0:9464 for every interface)",
                        s != NULL ? s : "(null)");
    memcpy(ip, s, (size_t)(colon - s));
    ip[colon - s] = '\0';
    if (strcmp(ip, "*") == 0)
        snprintf(ip, cap, "0.0.0.0");
    struct in_addr a;
    if (inet_pton(AF_INET, ip, &a) != 1)
        return dp__fail(d, DP_EINVAL, "'%s': '%s' is not an IPv4 address", s, ip);
    uint64_t p;
    if (dp__parse_u64(colon + 1, 0, 65535, &p, "port", d) != DP_OK)
        return dp__fail(d, DP_EINVAL, "'%s': the port must be 0..65535", s);
    *port = (uint16_t)p;
    return DP_OK;
}

static enum MHD_Result
answer(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
       const char *version, const char *upload, size_t *upload_len, void **con_cls)
{
    DP_UNUSED(version);
    DP_UNUSED(upload);
    dp__http_server *s = cls;
    /* The first call only announces the request (its headers are in). */
    if (*con_cls == NULL) {
        *con_cls = s;
        return MHD_YES;
    }
    if (*upload_len != 0) {
        *upload_len = 0; /* a body nobody asked for: read and dropped */
        return MHD_YES;
    }
    atomic_fetch_add(&s->requests, 1);
    dp__buf body;
    dp__buf_init(&body);
    const char *type = "text/plain; charset=utf-8";
    int status;
    if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0) {
        status = MHD_HTTP_METHOD_NOT_ALLOWED;
        dp__buf_printf(&body, "only GET and HEAD\n");
    } else {
        status = s->fn(s->ctx, url, &body, &type);
    }
    if (body.oom) {
        status = MHD_HTTP_INTERNAL_SERVER_ERROR;
        dp__buf_reset(&body);
    }
    struct MHD_Response *r = MHD_create_response_from_buffer(
        body.len, body.len > 0 ? body.data : (void *)"", MHD_RESPMEM_MUST_COPY);
    dp__buf_fini(&body);
    if (r == NULL)
        return MHD_NO;
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    enum MHD_Result ret = MHD_queue_response(conn, (unsigned)status, r);
    MHD_destroy_response(r);
    return ret;
}

static void
mhd_log(void *cls, const char *fmt, va_list ap)
{
    DP_UNUSED(cls);
    char msg[256];
    vsnprintf(msg, sizeof msg, fmt, ap);
    size_t n = strlen(msg);
    while (n > 0 && msg[n - 1] == '\n')
        msg[--n] = '\0';
    DP_LOG_D("metrics http: %s", msg);
}

int
dp__http_server_open(const char *addr, dp__http_handler fn, void *ctx,
                     dp__http_server **out, dp_detail *d)
{
    *out = NULL;
    char ip[64];
    uint16_t port;
    int rc = dp__http_parse_addr(addr, ip, sizeof ip, &port, d);
    if (rc != DP_OK)
        return rc;
    dp__http_server *s = calloc(1, sizeof *s);
    if (s == NULL)
        return dp__fail(d, DP_ENOMEM, "metrics: out of memory");
    s->fn = fn;
    s->ctx = ctx;
    atomic_init(&s->requests, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port)};
    inet_pton(AF_INET, ip, &sa.sin_addr);
    s->mhd = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG, port,
                              NULL, NULL, answer, s, MHD_OPTION_SOCK_ADDR,
                              (struct sockaddr *)&sa, MHD_OPTION_CONNECTION_LIMIT,
                              (unsigned)16, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)10,
                              MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL, MHD_OPTION_END);
    if (s->mhd == NULL) {
        free(s);
        return dp__fail(d, DP_ESYS,
                        "metrics: cannot serve http on %s (address in use, or not this "
                        "host's?)",
                        addr);
    }
    const union MHD_DaemonInfo *di =
        MHD_get_daemon_info(s->mhd, MHD_DAEMON_INFO_BIND_PORT);
    snprintf(s->address, sizeof s->address, "%s:%u", ip,
             di != NULL ? (unsigned)di->port : (unsigned)port);
    *out = s;
    return DP_OK;
}

const char *
dp__http_server_address(const dp__http_server *s)
{
    return s->address;
}

uint64_t
dp__http_server_requests(const dp__http_server *s)
{
    return atomic_load(&((dp__http_server *)s)->requests);
}

void
dp__http_server_close(dp__http_server *s)
{
    if (s == NULL)
        return;
    MHD_stop_daemon(s->mhd);
    free(s);
}
