/*
 * A unit with its endpoint, ticker and control server (see server.h). The
 * order matters: the endpoint first (the slab is its memory), the unit over
 * it, then the control server, which may call into the unit from its first
 * request; closing runs the other way.
 */
#include "unit/server.h"

#include <stdlib.h>

#include "ctl/ctl.h"
#include "xfer/endpoint.h"

struct dp_unit_server {
    dp_endpoint *ep;
    dp_unit *u;
    dp_ctl_server *srv;
};

int
dp_unit_server_open(const dp_unit_opts *uo, const char *endpoint_name,
                    const char *bind_ip, uint16_t port, double tick_s,
                    dp_unit_server **out, dp_detail *d)
{
    dp_unit_server *s = calloc(1, sizeof *s);
    if (s == NULL)
        return dp_fail(d, DP_ENOMEM, "unit server: out of memory");
    dp_endpoint_opts eo;
    dp_endpoint_opts_init(&eo);
    eo.progress_thread = true; /* emulated RMA (tcp) needs the unit to progress */
    int rc = dp_endpoint_create(endpoint_name, &eo, &s->ep, d);
    if (rc != 0)
        goto fail;
    dp_unit_opts o = *uo;
    o.ep = s->ep;
    if ((rc = dp_unit_create(&o, &s->u, d)) != 0 ||
        (rc = dp_unit_start_ticker(s->u, tick_s, d)) != 0)
        goto fail;
    dp_ctl_server_opts so = {.bind_ip = bind_ip, .port = port};
    if ((rc = dp_ctl_server_open(&so, dp_unit_handle, dp_unit_handle_oversize, s->u,
                                 &s->srv, d)) != 0)
        goto fail;
    dp_unit_set_address(s->u, dp_ctl_server_address(s->srv));
    *out = s;
    return DP_OK;
fail:
    dp_unit_server_close(s);
    return rc;
}

const char *
dp_unit_server_address(const dp_unit_server *s)
{
    return dp_ctl_server_address(s->srv);
}

dp_unit *
dp_unit_server_unit(const dp_unit_server *s)
{
    return s->u;
}

void
dp_unit_server_close(dp_unit_server *s)
{
    if (s == NULL)
        return;
    dp_ctl_server_close(s->srv);
    dp_unit_destroy(s->u);
    dp_endpoint_destroy(s->ep);
    free(s);
}
