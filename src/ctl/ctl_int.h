/*
 * Internals shared by ctl_server.c (the ROUTER server thread, CURVE on the
 * server side), ctl_client.c (the DEALER pool, requests and waits) and
 * ctl_common.c (key files, socket monitors). Not for other modules.
 */
#ifndef DP_CTL_CTL_INT_H
#define DP_CTL_CTL_INT_H

#include <stdbool.h>
#include <stdint.h>

#include "ctl/ctl.h"

/*
 * One event from a socket monitor, without blocking: its number and value
 * (0 when the frame is short), the endpoint frame read and dropped. False
 * when none is queued.
 */
bool dp__ctl_mon_recv(void *mon, uint16_t *ev, uint32_t *val);

#endif
