/*
 * A small HTTP server for metrics and health checks, over libmicrohttpd (its
 * own thread; this is the only module that includes <microhttpd.h>). Only
 * GET and HEAD are served; the handler says what a path answers.
 *
 * Threads: the handler runs on the server's thread; open and close from any
 * one thread.
 */
#ifndef DP_HTTP_HTTP_H
#define DP_HTTP_HTTP_H

#include <stdint.h>

#include "common/common.h"

typedef struct dp__http_server dp__http_server;

/*
 * Answer path: append the body to body, set *content_type (a static
 * string), return the HTTP status (404 for a path it does not serve).
 */
typedef int (*dp__http_handler)(void *ctx, const char *path, dp__buf *body,
                                const char **content_type);

/*
 * Serve "IP:PORT" (an IPv4 address, or "*" / "0.0.0.0" for every
 * interface; port 0: a free one). Errors: DP_EINVAL (not IP:PORT), DP_ESYS
 * (the bind failed: in use, no such address), DP_ENOMEM.
 */
int dp__http_server_open(const char *addr, dp__http_handler fn, void *ctx,
                         dp__http_server **out, dp_detail *d);

/* "IP:PORT" as bound (the real port). */
const char *dp__http_server_address(const dp__http_server *s);

/* Scrapes served so far (any path). */
uint64_t dp__http_server_requests(const dp__http_server *s);

void dp__http_server_close(dp__http_server *s); /* NULL allowed */

/* Parse "IP:PORT" (IPv4 or "*"), as the server does. DP_EINVAL saying why. */
int dp__http_parse_addr(const char *s, char *ip, size_t cap, uint16_t *port,
                        dp_detail *d);

#endif
