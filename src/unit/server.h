/*
 * A storage unit ready to serve: its transfer endpoint (progress thread on),
 * the unit over that endpoint's memory, the ticker, and the ZMQ control server
 * whose requests go to dp__unit_handle. What `dataplane unit` runs, and what
 * tests and benchmarks start in a child process.
 */
#ifndef DP_UNIT_SERVER_H
#define DP_UNIT_SERVER_H

#include <stdint.h>

#include "unit/unit.h"

typedef struct dp__unit_server dp__unit_server;

/* Where the control server listens and what it tells clients. Zeroed: defaults. */
typedef struct dp__unit_server_opts {
    const char *bind_ip; /* NULL or "": 127.0.0.1; 0.0.0.0 (or "*") binds every IPv4 */
    uint16_t port;       /* 0: a free port */
    /*
     * The host clients are told (info, dp__unit_server_address): a host name,
     * an IPv4 address or a bracketed IPv6 address, checked by the caller; the
     * port is always the bound one. NULL: the bound address, except that a
     * wildcard bind (0.0.0.0, ::) advertises this host's primary IPv4
     * address (the source address of its default route, else the first
     * non-loopback interface that is up), or 127.0.0.1 with a warning on
     * stderr if it has none.
     */
    const char *advertise;
    double tick_s; /* ticker period; 0: 1 s */
    /*
     * NULL: no metrics. "IP:PORT": serve /metrics (Prometheus text) and
     * /healthz over HTTP there (src/http; port 0: a free one).
     */
    const char *metrics;
    /*
     * CURVE on the control plane (NULL: none): the unit's secret key (Z85)
     * and the directory of allowed client keys (*.pub); see ctl.h.
     */
    const char *curve_secret;
    const char *curve_allow_dir;
} dp__unit_server_opts;

/*
 * Start a unit from uo (uo->ep is ignored: the server creates the endpoint,
 * named endpoint_name) and serve it as so says (NULL: defaults). Errors from
 * the endpoint, the unit or the bind, with a detail; DP_EINVAL for an
 * advertised address longer than a cluster file holds (127
 * bytes). Threads: any;
 * the server's threads inherit the caller's signal mask.
 */
int dp__unit_server_start(const dp__unit_opts *uo, const char *endpoint_name,
                          const dp__unit_server_opts *so, dp__unit_server **out,
                          dp_detail *d);

/*
 * dp__unit_server_start binding bind_ip:port (NULL: 127.0.0.1; port 0: a free
 * port), ticking every tick_s seconds, advertising the default.
 */
int dp__unit_server_open(const dp__unit_opts *uo, const char *endpoint_name,
                         const char *bind_ip, uint16_t port, double tick_s,
                         dp__unit_server **out, dp_detail *d);

/*
 * "tcp://host:port" clients use (what info reports): the advertised host and
 * the bound port. Valid until close.
 */
const char *dp__unit_server_address(const dp__unit_server *s);

/* "tcp://ip:port" the control server bound (0.0.0.0 for a wildcard). */
const char *dp__unit_server_bound_address(const dp__unit_server *s);

/* The unit (owned by the server). */
dp__unit *dp__unit_server_unit(const dp__unit_server *s);

/* Read the allow directory again (SIGHUP): *n_keys. DP_EINVAL without CURVE. */
int dp__unit_server_reload_allow(dp__unit_server *s, size_t *n_keys, dp_detail *d);

/* "IP:PORT" the metrics are served on, NULL without. */
const char *dp__unit_server_metrics_address(const dp__unit_server *s);

/* Its transfer endpoint. */
struct dp__endpoint *dp__unit_server_endpoint(const dp__unit_server *s);

/* Stop serving and free everything, control server first. NULL allowed. */
void dp__unit_server_close(dp__unit_server *s);

/* The same before the process exits: the endpoint's UCX worker is left to the
 * exit (dp__endpoint_keep_ucx_at_close). */
void dp__unit_server_close_at_exit(dp__unit_server *s);

#endif
