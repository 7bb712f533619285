/*
 * Helpers shared by the subcommands (see cli.h): house-style messages, the
 * control-plane session of the commands that talk to a running cluster (the
 * library's control-only client, which asks every unit who it is before
 * anything else goes to it; this file gives its reports the command's
 * words), the check of an advertised address and the guard that keeps
 * library logs off stdout.
 */
#include "cli/cli.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "registry/registry.h"

int
dp__cli_usage(const char *cmd, const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "dataplane %s: ", cmd);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\nRun 'dataplane %s --help' for usage.\n", cmd);
    return 2;
}

int
dp__cli_bad_option(const char *cmd, const char *word)
{
    return dp__cli_usage(cmd, "unknown option or missing value '%s'", word);
}

int
dp__cli_unexpected(const char *cmd, const char *arg)
{
    return dp__cli_usage(cmd, "unexpected argument '%s'", arg);
}

int
dp__cli_parse_timeout(const char *arg, const char *opt, double *out, dp_detail *d)
{
    int rc = dp__parse_seconds(arg, out, opt, d);
    if (rc == DP_OK && !(*out > 0))
        rc = dp__fail(d, DP_EINVAL, "%s must be > 0", opt);
    return rc;
}

int
dp__cli_fail(const char *cmd, int rc, const dp_detail *d)
{
    const char *m = dp_detail_msg(d);
    if (*m != '\0')
        fprintf(stderr, "dataplane %s: %s (%s)\n", cmd, m, dp_strerror(rc));
    else
        fprintf(stderr, "dataplane %s: %s\n", cmd, dp_strerror(rc));
    return 1;
}

int
dp__cli_open_client(const char *cmd, const char *cluster, double timeout_s,
                    dp_client **out)
{
    dp_client_opts co;
    dp_client_opts_init(&co);
    co.timeout_s = timeout_s;
    /* One budget: asking the units who they are must not outlast it either. */
    co.connect_timeout_s = timeout_s;
    dp_detail d;
    dp_detail_clear(&d);
    int rc = dp_client_open(cluster, &co, out, &d);
    if (rc != DP_OK)
        return dp__cli_fail(cmd, rc, &d);
    return 0;
}

int
dp__cli_connect(const char *arg, double timeout_s, double connect_timeout_s,
                unsigned flags, dp__cli_conn *c, dp_detail *d)
{
    memset(c, 0, sizeof *c);
    c->timeout_s = timeout_s > 0 ? timeout_s : DP_CLI_TIMEOUT_S;
    c->connect_timeout_s = connect_timeout_s > 0 ? connect_timeout_s : c->timeout_s;
    int rc =
        dp__reg_resolve(arg, c->connect_timeout_s, &c->cl, c->path, sizeof c->path, d);
    if (rc == DP_OK && (c->units = calloc(c->cl.n_units, sizeof *c->units)) == NULL)
        rc = dp__fail(d, DP_ENOMEM, "out of memory");
    if (rc == DP_OK)
        rc = dp__wire_rid_gen_init(&c->rids, d);
    if (rc == DP_OK && !(flags & DP__CLI_NO_CHECK))
        rc = dp__cli_check_units(c, -1, flags, d);
    if (rc != DP_OK)
        dp__cli_disconnect(c);
    return rc;
}

void
dp__cli_disconnect(dp__cli_conn *c)
{
    dp_client_close(c->client);
    c->client = NULL;
    dp__ctl_client_destroy(c->ctl);
    c->ctl = NULL;
    free(c->units);
    c->units = NULL;
    dp__cluster_fini(&c->cl);
}

/* The client takes timeouts of at most 1e6 s (11 days): longer is as good as that. */
static double
client_timeout(double s)
{
    return DP_MIN(s, 1e6);
}

/*
 * The control-only client of c's units, its reports in the command's words:
 * the cluster file a misplaced unit contradicts, and what to do about a unit
 * that does not answer.
 */
static int
open_client(dp__cli_conn *c, dp_detail *d)
{
    char listed_by[PATH_MAX + 32], silence[PATH_MAX + 64];
    snprintf(listed_by, sizeof listed_by, "the cluster file %s", c->path);
    snprintf(silence, sizeof silence, ": is the cluster running? (cluster file %s)",
             c->path);
    dp__fanout_opts words = {
        .listed_by = listed_by,
        .misplaced_hint = ": nothing was done; fix the order in the file, or point "
                          "--cluster at the file of the cluster these units belong to",
        .silence_hint = silence,
    };
    dp_client_opts o;
    dp_client_opts_init(&o);
    o.timeout_s = client_timeout(c->timeout_s > 0 ? c->timeout_s : DP_CLI_TIMEOUT_S);
    o.connect_timeout_s =
        client_timeout(c->connect_timeout_s > 0 ? c->connect_timeout_s : o.timeout_s);
    return dp__client_open_ctl(&c->cl, &o, &words, DP__CTL_NO_CHECK, &c->client, d);
}

int
dp__cli_check_units(dp__cli_conn *c, int64_t only, unsigned flags, dp_detail *d)
{
    int rc = c->client == NULL ? open_client(c, d) : DP_OK;
    if (rc == DP_OK)
        rc = dp__client_check_units(
            c->client, only, (flags & DP__CLI_ALLOW_DOWN) ? DP__CTL_ALLOW_DOWN : 0, d);
    for (uint32_t i = 0; c->client != NULL && i < c->cl.n_units; i++) {
        if (only >= 0 && (int64_t)i != only)
            continue;
        dp__cli_unit *u = &c->units[i];
        const char *agent = NULL;
        int st = dp__client_unit_check(c->client, i, &u->det, &agent, &u->incarnation);
        u->state = st == DP__UNIT_CHECKED ? DP__CLI_CHECKED
                   : st == DP__UNIT_DOWN  ? DP__CLI_DOWN
                                          : DP__CLI_UNCHECKED;
        u->rc = st == DP__UNIT_DOWN ? u->det.code : DP_OK;
        if (agent != NULL)
            snprintf(u->agent, sizeof u->agent, "%s", agent);
    }
    return rc;
}

int
dp__cli_parse_unit(const dp__cli_conn *c, const char *s, uint32_t *out, dp_detail *d)
{
    uint64_t v;
    int rc = dp__parse_u64(s, 0, UINT32_MAX, &v, "UNIT", d);
    if (rc != DP_OK)
        return rc;
    if (v >= c->cl.n_units)
        return dp__fail(d, DP_EINVAL,
                        "unit %" PRIu64
                        " does not exist: the cluster in %s has units 0..%u",
                        v, c->path, c->cl.n_units - 1);
    *out = (uint32_t)v;
    return DP_OK;
}

int
dp__cli_check_advertise(const char *h, dp_detail *d)
{
    size_t n = strlen(h);
    if (n == 0)
        return dp__fail(d, DP_EINVAL, "--advertise must not be empty");
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)h[i];
        if (ch <= 0x20 || ch >= 0x7f)
            return dp__fail(d, DP_EINVAL,
                            "--advertise has a space, control or non-ASCII character at "
                            "byte %zu: give an IPv4 address, [IPv6] or a host name",
                            i);
    }
    if (n > DP_CLUSTER_ADDR_MAX - sizeof "tcp://:65535")
        return dp__fail(d, DP_EINVAL,
                        "--advertise '%.40s...' is too long (at most %zu bytes)", h,
                        DP_CLUSTER_ADDR_MAX - sizeof "tcp://:65535");
    if (h[0] == '[') {
        char in[64];
        struct in6_addr a6;
        if (n < 3 || h[n - 1] != ']' || n - 2 >= sizeof in)
            return dp__fail(d, DP_EINVAL,
                            "--advertise '%s' is not a bracketed IPv6 address like "
                            "[fe80::1]",
                            h);
        memcpy(in, h + 1, n - 2);
        in[n - 2] = '\0';
        if (inet_pton(AF_INET6, in, &a6) != 1)
            return dp__fail(d, DP_EINVAL, "--advertise '%s' is not an IPv6 address", h);
        if (IN6_IS_ADDR_UNSPECIFIED(&a6))
            return dp__fail(
                d, DP_EINVAL,
                "--advertise '%s' is the wildcard address, which no client can "
                "reach: give this host's address",
                h);
        return DP_OK;
    }
    if (strchr(h, ':') != NULL)
        return dp__fail(d, DP_EINVAL,
                        "--advertise '%s': an IPv6 address goes in brackets, e.g. [%s]; "
                        "the port is always the bound one",
                        h, h);
    if (strspn(h, "0123456789.") == n) {
        struct in_addr a4;
        if (inet_pton(AF_INET, h, &a4) != 1)
            return dp__fail(d, DP_EINVAL,
                            "--advertise '%s' is not a dotted IPv4 address like 10.0.0.5",
                            h);
        if (a4.s_addr == htonl(INADDR_ANY))
            return dp__fail(
                d, DP_EINVAL,
                "--advertise '%s' is the wildcard address, which no client can "
                "reach: give this host's address",
                h);
        return DP_OK;
    }
    /* A host name: labels of letters, digits, '-' and '_', joined by dots. */
    if (strspn(h, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_.") !=
            n ||
        h[0] == '.' || h[0] == '-' || h[n - 1] == '-' || strstr(h, "..") != NULL)
        return dp__fail(
            d, DP_EINVAL,
            "--advertise '%s' is not an IPv4 address, a bracketed IPv6 address "
            "or a host name (letters, digits, '-', '_' and dots)",
            h);
    return DP_OK;
}

void
dp__cli_guard_stdout(void)
{
#ifdef __GLIBC__
    /*
     * glibc lets a program assign stdout. UCX keeps the FILE it saw (the
     * original stdout, now writing to descriptor 1, which is stderr); what
     * this program prints goes through the new stream.
     */
    if (fcntl(STDERR_FILENO, F_GETFD) < 0)
        return;
    int fd = fcntl(STDOUT_FILENO, F_DUPFD_CLOEXEC, 3);
    if (fd < 0)
        return;
    FILE *out = fdopen(fd, "w");
    if (out == NULL) {
        close(fd);
        return;
    }
    fflush(stdout);
    if (dup2(STDERR_FILENO, STDOUT_FILENO) < 0) {
        fclose(out);
        return;
    }
    stdout = out;
#endif
}

int
dp__cli_probe_unit(const char *addr, const char *server_pub, const char *client_secret,
                   double timeout_s, uint64_t *incarnation, char *why, size_t cap)
{
    *incarnation = 0;
    dp__ctl_client *ctl = NULL;
    dp__wire_rid_gen rids;
    dp_detail d;
    dp_detail_clear(&d);
    dp__buf req, rep;
    dp__buf_init(&req);
    dp__buf_init(&rep);
    char rid[DP_WIRE_RID_MAX];
    dp__wire_request q;
    memset(&q, 0, sizeof q);
    q.op = DP_WIRE_OP_INFO;
    int rc = dp__ctl_client_create(&ctl, &d);
    if (rc == DP_OK && server_pub != NULL && server_pub[0] != '\0') {
        char sec[41] = "";
        const char *env = getenv("DP_CURVE_SECRET");
        if (client_secret != NULL)
            snprintf(sec, sizeof sec, "%s", client_secret);
        else if (env != NULL && env[0] != '\0')
            rc = dp__ctl_key_read(env, true, sec, &d);
        if (rc == DP_OK && sec[0] != '\0' &&
            (rc = dp__ctl_client_set_curve(ctl, sec, &d)) == DP_OK)
            rc = dp__ctl_client_server_key(ctl, addr, server_pub, &d);
        explicit_bzero(sec, sizeof sec);
    }
    if (rc == DP_OK)
        rc = dp__wire_rid_gen_init(&rids, &d);
    if (rc == DP_OK) {
        q.rid = dp__wire_rid_next(&rids, rid);
        rc = dp__wire_request_encode(&q, NULL, &req, &d);
    }
    if (rc == DP_OK)
        rc = dp__ctl_call(ctl, addr, &req, rid, timeout_s, &rep, &d);
    if (rc == DP_OK) {
        dp__wire_reply r;
        memset(&r, 0, sizeof r);
        rc = dp__wire_reply_decode(rep.data, rep.len, DP_WIRE_OP_INFO, NULL, &r, &d);
        if (rc == DP_OK && !r.ok)
            rc = dp__fail(&d, DP_EPROTO, "it answered info with an error");
        if (rc == DP_OK)
            *incarnation = r.r.info.incarnation;
        dp__wire_reply_fini(&r);
    }
    if (rc != DP_OK)
        snprintf(why, cap, "it does not answer: %s", dp_detail_msg(&d));
    dp__buf_fini(&req);
    dp__buf_fini(&rep);
    dp__ctl_client_destroy(ctl);
    return rc;
}

void
dp__cli_print_lanes(dp_client *cl)
{
    printf("lanes:");
    for (uint32_t u = 0; u < dp_client_n_units(cl); u++) {
        char p[128];
        if (dp_client_unit_path(cl, u, p, sizeof p) != DP_OK)
            snprintf(p, sizeof p, "?");
        printf("%s unit %u: %s", u > 0 ? ";" : "", u, p);
    }
    printf("\n");
}
