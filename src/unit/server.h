/*
 * A storage unit ready to serve: its transfer endpoint (progress thread on),
 * the unit over that endpoint's memory, the ticker, and the ZMQ control server
 * whose requests go to dp_unit_handle. What `dataplane unit` runs, and what
 * tests and benchmarks start in a child process.
 */
#ifndef DP_UNIT_SERVER_H
#define DP_UNIT_SERVER_H

#include <stdint.h>

#include "unit/unit.h"

typedef struct dp_unit_server dp_unit_server;

/*
 * Start a unit from uo (uo->ep is ignored: the server creates the endpoint,
 * named endpoint_name), tick it every tick_s seconds, and bind its control
 * server on bind_ip:port (NULL: 127.0.0.1; port 0: a free port). Errors from
 * the endpoint, the unit or the bind, with a detail. Threads: any; the
 * server's threads inherit the caller's signal mask.
 */
int dp_unit_server_open(const dp_unit_opts *uo, const char *endpoint_name,
                        const char *bind_ip, uint16_t port, double tick_s,
                        dp_unit_server **out, dp_detail *d);

/* "tcp://ip:port" of the control server; valid until close. */
const char *dp_unit_server_address(const dp_unit_server *s);

/* The unit (owned by the server). */
dp_unit *dp_unit_server_unit(const dp_unit_server *s);

/* Stop serving and free everything, control server first. NULL allowed. */
void dp_unit_server_close(dp_unit_server *s);

#endif
