/*
 * Helpers the multi-host fault tests share (test_netns, test_outage): a
 * topology or a skip (DP_SKIP), progress lines with timings, unit processes
 * (the dataplane binary) and long-lived clients (dp_longclient) inside hosts,
 * their one-line answers, the checks every fault test makes on them (an
 * answer within its budget, never a false success) and recovery after a
 * fault is lifted. Include after dp_test.h (CHECK) and dp_netns.h.
 *
 * Every exchange with a client is printed ("    NAME CMD -> ANSWER"), so a
 * reader of a test log sees what the client answered and how long it took.
 *
 * Threads: one, the test's.
 */
#ifndef DP_LC_H
#define DP_LC_H

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dp_netns.h"

/* When the current test began: dp_lc_step prints times relative to it. */
static double dp_lc_t_start;

/*
 * A topology, or the test ends as skipped (DP_SKIP) with the reason when the
 * machine does not allow one (no root, no namespaces, no iptables). When
 * every test of the program skips, it exits 77: CTest reports it skipped.
 */
static inline dp_netns *
dp_lc_topology(uint32_t n_hosts, unsigned flags)
{
    dp_netns *n = NULL;
    dp_detail d;
    dp_detail_clear(&d);
    int rc = dp_netns_create(n_hosts, flags, &n, &d);
    if (rc == DP_EUNSUPPORTED)
        DP_SKIP("%s", dp_detail_msg(&d));
    CHECK_OK_D(rc, &d);
    return n;
}

/* A progress line with the time since the test began and the step's duration. */
static inline void
dp_lc_step(double t0, const char *what)
{
    double t = dp_test_now();
    printf("  [%6.2f s] %-48s %7.3f s\n", t - dp_lc_t_start, what, t - t0);
}

/*
 * Start `dataplane unit --bind <host's ip> --port PORT --slab SLAB` and the
 * options in extra (NULL-terminated, at most 23; NULL for none) inside host
 * as another machine; addr gets the tcp:// address it printed. A port
 * just freed by a killed unit may still be taken for a moment: the start is
 * tried again for up to 10 s.
 */
static inline void
dp_lc_unit_start_with(dp_netns *n, uint32_t host, const char *cli, const char *port,
                      const char *slab, const char *const *extra, dp_netns_proc *unit,
                      char *addr, size_t cap)
{
    const char *argv[32] = {cli,      "unit", "--bind", dp_netns_ip(n, host),
                            "--port", port,   "--slab", slab};
    for (size_t k = 0; extra != NULL && extra[k] != NULL && k < 23; k++)
        argv[8 + k] = extra[k];
    char want[64];
    snprintf(want, sizeof want, "tcp://%s:", dp_netns_ip(n, host));
    double t0 = dp_test_now();
    dp_detail d;
    for (;;) {
        dp_detail_clear(&d);
        CHECK_OK_D(dp_netns_spawn(n, host, argv, DP_NETNS_OWN_MACHINE, unit, &d), &d);
        int rc = dp_netns_readline(unit, addr, cap, 30, &d);
        if (rc == 0 && strncmp(addr, want, strlen(want)) == 0)
            break;
        int st = dp_netns_proc_stop(unit, SIGKILL, 5);
        CHECKF(dp_test_now() - t0 < 10,
               "unit did not start in host %u on port %s: %s (exit status %d)", host,
               port, rc == 0 ? addr : dp_detail_msg(&d), st);
        usleep(100000);
    }
}

static inline void
dp_lc_unit_start(dp_netns *n, uint32_t host, const char *cli, const char *port,
                 const char *slab, dp_netns_proc *unit, char *addr, size_t cap)
{
    dp_lc_unit_start_with(n, host, cli, port, slab, NULL, unit, addr, cap);
}

/* The port of a tcp://host:port address, as a string, into out. */
static inline void
dp_lc_port_of(const char *addr, char *out, size_t cap)
{
    const char *colon = strrchr(addr, ':');
    CHECKF(colon != NULL, "no port in \"%s\"", addr);
    snprintf(out, cap, "%s", colon + 1);
}

/* A long-lived client: dp_longclient inside a host, driven over its stdin. */
typedef struct dp_lc {
    dp_netns_proc p;
    char name[16];    /* printed before each exchange ("" for none) */
    double timeout_s; /* its --timeout: the budget of every call */
} dp_lc;

/* One answer of dp_longclient: "<verdict> <elapsed> <rest>". */
typedef struct dp_lc_answer {
    char line[16384];
    char verdict[16];
    double elapsed; /* the library call, as the client measured it */
    double wall;    /* the whole exchange, as the test saw it */
    const char *rest;
} dp_lc_answer;

/*
 * Spawn dp_longclient (path lc_path) in host as another machine, for the
 * units addresses (comma-separated), with --timeout timeout_s; env, if not
 * NULL, is one NAME=VALUE put in its environment. first gets its first line
 * (`ready ...` or `err ...`), not checked here.
 */
static inline void
dp_lc_spawn(dp_lc *c, dp_netns *n, uint32_t host, const char *lc_path, const char *name,
            const char *units, double timeout_s, const char *env, char *first, size_t cap)
{
    char tmo[32];
    snprintf(tmo, sizeof tmo, "%g", timeout_s);
    snprintf(c->name, sizeof c->name, "%s", name);
    c->timeout_s = timeout_s;
    const char *plain[] = {lc_path, "--units", units, "--timeout", tmo, NULL};
    const char *with_env[] = {"/usr/bin/env", env,         lc_path, "--units",
                              units,          "--timeout", tmo,     NULL};
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_OK_D(dp_netns_spawn(n, host, env != NULL ? with_env : plain,
                              DP_NETNS_OWN_MACHINE | DP_NETNS_STDIN, &c->p, &d),
               &d);
    CHECK_OK_D(dp_netns_readline(&c->p, first, cap, timeout_s + 30, &d), &d);
}

/* dp_lc_spawn, then check that it opened the cluster of n_units units. */
static inline void
dp_lc_start(dp_lc *c, dp_netns *n, uint32_t host, const char *lc_path, const char *name,
            const char *units, uint32_t n_units, double timeout_s)
{
    char line[4096], want[32];
    dp_lc_spawn(c, n, host, lc_path, name, units, timeout_s, NULL, line, sizeof line);
    printf("    %s%sclient in host %u: %s\n", c->name, c->name[0] ? " " : "", host, line);
    snprintf(want, sizeof want, "units=%u", n_units);
    CHECKF(strncmp(line, "ready ", 6) == 0 && strstr(line, want) != NULL,
           "client %s's first line \"%s\"", c->name, line);
}

/* Send cmd, read its answer (within the budget plus 20 s) and print both. */
static inline void
dp_lc_ask(dp_lc *c, const char *cmd, dp_lc_answer *a)
{
    dp_detail d;
    dp_detail_clear(&d);
    double t0 = dp_test_now();
    int rc = dp_netns_ask(&c->p, cmd, a->line, sizeof a->line, c->timeout_s + 20, &d);
    a->wall = dp_test_now() - t0;
    CHECKF(rc == 0, "%s `%s`: no answer: %s (%s)", c->name, cmd, dp_detail_msg(&d),
           dp_errname(rc));
    a->verdict[0] = '\0';
    a->elapsed = -1;
    int used = 0;
    CHECKF(sscanf(a->line, "%15s %lf %n", a->verdict, &a->elapsed, &used) >= 2,
           "%s `%s`: malformed answer \"%s\"", c->name, cmd, a->line);
    a->rest = a->line + used;
    if (c->name[0] != '\0')
        printf("    %-5s %-24s -> %.200s%s\n", c->name, cmd, a->line,
               strlen(a->line) > 200 ? "..." : "");
    else
        printf("    %-24s -> %.200s%s\n", cmd, a->line,
               strlen(a->line) > 200 ? "..." : "");
}

static inline void
dp_lc_ask_ok(dp_lc *c, const char *cmd, dp_lc_answer *a)
{
    dp_lc_ask(c, cmd, a);
    CHECKF(strcmp(a->verdict, "ok") == 0, "%s `%s` answered \"%s\"", c->name, cmd,
           a->line);
}

/*
 * A command during a fault: it must fail (err), never lie (corrupt or ok),
 * and answer within the client's budget plus margin_s (the exchange as the
 * test sees it: one second more).
 */
static inline void
dp_lc_ask_fails_in_budget(dp_lc *c, const char *cmd, double margin_s, dp_lc_answer *a)
{
    dp_lc_ask(c, cmd, a);
    CHECKF(strcmp(a->verdict, "err") == 0, "%s `%s` during the fault answered \"%s\"",
           c->name, cmd, a->line);
    CHECKF(a->elapsed <= c->timeout_s + margin_s,
           "%s `%s` took %.3f s, budget %.1f s + %.1f s", c->name, cmd, a->elapsed,
           c->timeout_s, margin_s);
    CHECKF(a->wall <= c->timeout_s + margin_s + 1.0, "%s `%s` took %.3f s wall", c->name,
           cmd, a->wall);
}

/*
 * The number after "name=" in an answer's rest, within the word that starts
 * with scope (e.g. "u0:" for a unit's counters in a stats answer; NULL: the
 * whole rest). False when absent.
 */
static inline bool
dp_lc_value(const char *rest, const char *scope, const char *name, double *v)
{
    const char *p = rest;
    size_t len = strlen(rest);
    if (scope != NULL) {
        size_t sl = strlen(scope);
        for (p = rest; (p = strstr(p, scope)) != NULL; p += sl)
            if (p == rest || p[-1] == ' ')
                break;
        if (p == NULL)
            return false;
        const char *end = strchr(p, ' ');
        len = end != NULL ? (size_t)(end - p) : strlen(p);
    }
    size_t nl = strlen(name);
    for (const char *q = p; q < p + len; q++) {
        if (strncmp(q, name, nl) != 0 || q[nl] != '=' ||
            (q != p && q[-1] != ',' && q[-1] != ':' && q[-1] != ' '))
            continue;
        char *end = NULL;
        *v = strtod(q + nl + 1, &end);
        return end != q + nl + 1;
    }
    return false;
}

/* dp_lc_value that must find the value; the answer is printed otherwise. */
static inline double
dp_lc_value_of(const dp_lc_answer *a, const char *scope, const char *name)
{
    double v = 0;
    CHECKF(dp_lc_value(a->rest, scope, name, &v), "no %s%s in \"%s\"", scope ? scope : "",
           name, a->line);
    return v;
}

/*
 * After a fault is lifted: `get ROWS SEED_OLD` (rows: "ROW0 NROWS BYTES")
 * until one answers ok, within recover_s, then a put and a get of seed_new.
 * Not recovering fails with a line starting "RECOVERY FAILED" naming the fault
 * and every answer seen. A first get that still fails is reported on a line
 * starting "NOTE first call after"; with DP_TEST_STRICT_RECOVERY=1 it fails
 * the test. No answer may be a false success (corrupt). Returns the number of
 * gets it took.
 */
static inline int
dp_lc_recover(dp_lc *c, const char *fault, const char *rows, int seed_old, int seed_new,
              double recover_s)
{
    char cmd[128], seen[4096] = "";
    size_t k = 0;
    double t0 = dp_test_now();
    dp_lc_answer a;
    int tries = 0;
    const char *strict = getenv("DP_TEST_STRICT_RECOVERY");
    snprintf(cmd, sizeof cmd, "get %s %d", rows, seed_old);
    for (;;) {
        dp_lc_ask(c, cmd, &a);
        tries++;
        CHECKF(strcmp(a.verdict, "corrupt") != 0, "%s after the %s: false success: %s",
               c->name, fault, a.line);
        if (strcmp(a.verdict, "ok") == 0)
            break;
        if (tries == 1) {
            printf("    NOTE first call after the %s was lifted failed: %.400s\n", fault,
                   a.line);
            CHECKF(strict == NULL || strcmp(strict, "1") != 0,
                   "DP_TEST_STRICT_RECOVERY: %s's first get after the %s failed: %s",
                   c->name, fault, a.line);
        }
        if (k + 200 < sizeof seen)
            k += (size_t)snprintf(seen + k, sizeof seen - k, " [%.2f s] %.160s;",
                                  dp_test_now() - t0, a.line);
        CHECKF(dp_test_now() - t0 < recover_s,
               "RECOVERY FAILED: %s after the %s: no ok get within %.0f s (%d tries):%s",
               c->name, fault, recover_s, tries, seen);
        usleep(200000);
    }
    printf("    %s%srecovered after the %s: %d get%s, %.3f s\n", c->name,
           c->name[0] ? " " : "", fault, tries, tries == 1 ? "" : "s",
           dp_test_now() - t0);
    snprintf(cmd, sizeof cmd, "put %s %d", rows, seed_new);
    dp_lc_ask(c, cmd, &a);
    CHECKF(strcmp(a.verdict, "ok") == 0, "RECOVERY FAILED: %s after the %s: put: %s",
           c->name, fault, a.line);
    snprintf(cmd, sizeof cmd, "get %s %d", rows, seed_new);
    dp_lc_ask(c, cmd, &a);
    CHECKF(strcmp(a.verdict, "ok") == 0, "RECOVERY FAILED: %s after the %s: get: %s",
           c->name, fault, a.line);
    return tries;
}

/* `quit`, then the process must exit 0 within 10 s. */
static inline void
dp_lc_quit(dp_lc *c)
{
    dp_lc_answer a;
    dp_lc_ask_ok(c, "quit", &a);
    CHECK_EQ(dp_netns_proc_stop(&c->p, 0, 10), 0);
}

#endif
