/*
 * Outages and restarts across hosts, with real processes: a unit (the
 * dataplane binary) in host 0 of a network-namespace topology, long-lived
 * clients (dp_longclient) in other hosts as other machines (UCX uses TCP
 * between them), every value checked byte for byte.
 *
 *   blackhole_40s: host 0 blackholed (iptables DROP) for 40 s, longer than
 *     UCX's keepalive, with a busy client (a put or a get about every second;
 *     a put in flight as the blackhole begins) and an idle one (nothing
 *     during the outage). Every answer during the outage is an error within
 *     the budget, never a false success. After the lift both clients recover
 *     by themselves within RECOVER_S, their earlier data is intact, new puts
 *     and gets work, the unit holds at most one put's worth per client beyond
 *     its live rows, retired or still allocated (its counters through `stats
 *     all`), and a fresh client works and can put a quarter of the slab.
 *     A busy client whose WRITE was in flight as the network went keeps that
 *     stalled UCX connection until TCP retransmits on it (its backoff: about
 *     51 s after the outage began, for an outage of 26..51 s); until then its
 *     gets fail within their budget (printed as NOTE and the tries seen).
 *   link_down_5s: host 0's link down for 5 s with a busy client: the same
 *     checks, shorter.
 *   link_flap_inside_the_budget: host 0's link down for 5 s (past the
 *     control connection's 4 s heartbeat, so the connection drops) under a
 *     clear from a client whose budget is 20 s: the clear is sent again
 *     once the connection dropped and answers ok after the link is back (the
 *     client counts the resend); the rows are gone, new puts and gets work.
 *   unit_restart: the unit SIGKILLed and started again on its port. While it
 *     is down, calls fail with DP_ETRANSFER within the budget; once it is
 *     back each long-lived client's first call fails once with
 *     DP_ERESTARTED and the next works; rows put before the restart are
 *     missing (the new process is empty); a fresh client works; the new
 *     unit's identity_refused stays 0 (no stale bytes were ever published).
 *   unit_killed_mid_transfer: the unit SIGKILLed 1-10 ms into a client's
 *     32 MiB get, 3-22 ms into its put, over TCP: each answers in budget, ok or
 *     err, never wrong bytes; after each restart the client fails once
 *     (DP_ERESTARTED), the old rows are missing, new ones round-trip.
 *   replicas_ride_a_host_outage: two units keeping two copies of each row, in
 *     hosts 0 and 1, a client in host 2; host 0's link down for 5 s: every
 *     get answers ok from host 1's copy within the budget, every put of rows
 *     with a copy on host 0 fails within it (a unit behind an outage is not
 *     gone: its copy would go stale), never a false success; after the link
 *     is back puts land on both, and with host 1's unit stopped host 0's copy
 *     answers them.
 *   leases_let_puts_ride_a_host_outage: three units keeping two copies, with
 *     read leases, in hosts 0-2, a client in host 3; host 0's link down 16 s:
 *     every put lands without host 0 once its peers fenced it and every get
 *     reads it back; with the link back, every get reads the last version
 *     (host 0 answers no read of its older copies until a pass caught it up),
 *     and with unit 1 killed host 0's caught-up copies answer.
 *   leases_start_behind_a_fault: the same units, host 0's link down as they
 *     start: units 1 and 2 come to hold their leases during the outage, a put
 *     lands without host 0 and a get reads it back.
 *   clients_killed_mid_transfer: clients SIGKILLed inside 32 MiB puts and
 *     gets over TCP (the two-sided path): the unit stays up, a checked
 *     client's rows come back byte for byte after every kill.
 *
 * Every step prints its time and every answer, so a CI log shows the
 * behaviour. Needs root and network namespaces with iptables: otherwise
 * every test skips (DP_SKIP) and the program exits 77 (ctest reports the test
 * as skipped).
 */
#include "dp_test.h"
#include "dp_proc.h"

#include <signal.h>
#include <unistd.h>

#include "common/common.h"
#include "dp_netns.h"
#include "dp_lc.h"

#ifndef DP_CLI_PATH
#error "DP_CLI_PATH must name the dataplane binary"
#endif
#ifndef DP_LONGCLIENT_PATH
#error "DP_LONGCLIENT_PATH must name the dp_longclient binary"
#endif

#define SLAB "128M"
#define TIMEOUT_S 3.0     /* every client's --timeout: the budget of each call */
#define MARGIN_S 1.0      /* allowed past the budget */
#define PACE_S 1.0        /* the busy client issues a call about this often */
#define BLACKHOLE_S 40.0  /* longer than UCX's keepalive */
#define LINK_DOWN_S 5.0   /* the link-down outage */
#define RECOVER_S 30.0    /* how long a client may take to work again */
#define META_SLACK 65536u /* a blob's metadata on top of its values, at most */

/* Rows as "ROW0 NROWS BYTES", and the bytes of a put of them. */
#define BUSY_ROWS "0 16 262144" /* the busy client's checked rows, 4 MiB */
#define BUSY_PUT_BYTES (16u * 262144u)
#define SPARE_ROWS "100 16 1048576" /* the put in flight as the outage begins */
#define SPARE_PUT_BYTES (16u * 1048576u)
#define LOOP_ROWS "120 4 1048576"  /* the busy client's puts during the outage */
#define IDLE_ROWS "200 16 1048576" /* the idle client's rows, 16 MiB */
#define IDLE_PUT_BYTES (16u * 1048576u)
#define FRESH_ROWS "300 8 1048576" /* the fresh client's rows */
#define BIG_ROWS "400 32 1048576"  /* a quarter of the slab at once */

static double
max2(double a, double b)
{
    return a > b ? a : b;
}

/* A topology of n hosts with iptables, or the test skips. */
static dp_netns *
topology(uint32_t n_hosts)
{
    return dp_lc_topology(n_hosts, DP_NETNS_IPTABLES);
}

/* The first word of an err answer's rest: the DP_ error name. */
static void
err_name(const dp_lc_answer *a, char *out, size_t cap)
{
    char w[32] = "";
    if (sscanf(a->rest, "%31s", w) != 1)
        snprintf(w, sizeof w, "?");
    snprintf(out, cap, "%s", w);
}

/*
 * The unit's counters through client c (`stats all`), the ones that matter
 * here printed on one line; a gets the whole answer (dp_lc_value_of(a, "u0:",
 * name) reads any).
 */
static void
unit_counters(dp_lc *c, dp_lc_answer *a)
{
    static const char *const names[] = {
        "rows",          "blobs",           "allocated_bytes",    "free_bytes",
        "retired_bytes", "retired",         "retired_kept_bytes", "allocs",
        "commits",       "aborts",          "leases_expired",     "identity_refused",
        "writers",       "protocol_errors", "stale_refused",
    };
    dp_lc_ask_ok(c, "stats all", a);
    printf("    unit:");
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        printf(" %s=%.0f", names[i], dp_lc_value_of(a, "u0:", names[i]));
    printf("\n");
}

/*
 * The busy client while a fault lasts (it began at t_fault and lasts dur_s):
 * a put of LOOP_ROWS (a new seed each time) or a get of BUSY_ROWS (seed
 * get_seed), alternately, about every PACE_S; each must fail within the
 * budget plus MARGIN_S, never lie. Stops issuing calls when the next would
 * start after the fault's end, then waits for that end. Prints a summary;
 * returns the number of calls.
 */
static int
busy_during(dp_lc *c, const char *fault, double t_fault, double dur_s, int get_seed)
{
    char names[8][32];
    int counts[8] = {0}, n_names = 0, calls = 0, puts = 0;
    double slowest = 0;
    dp_lc_answer a;
    while (dp_test_now() + PACE_S < t_fault + dur_s) {
        double t0 = dp_test_now();
        char cmd[96];
        if (calls % 2 == 0) {
            snprintf(cmd, sizeof cmd, "put " LOOP_ROWS " %d", 1000 + calls);
            puts++;
        } else {
            snprintf(cmd, sizeof cmd, "get " BUSY_ROWS " %d", get_seed);
        }
        printf("    [%6.2f s into the %s]\n", t0 - t_fault, fault);
        dp_lc_ask_fails_in_budget(c, cmd, MARGIN_S, &a);
        calls++;
        slowest = max2(slowest, a.elapsed);
        char name[32];
        err_name(&a, name, sizeof name);
        int k = 0;
        while (k < n_names && strcmp(names[k], name) != 0)
            k++;
        if (k == n_names && n_names < 8)
            snprintf(names[n_names++], sizeof names[0], "%s", name);
        if (k < 8)
            counts[k]++;
        double left = t0 + PACE_S - dp_test_now();
        if (left > 0)
            usleep((useconds_t)(left * 1e6));
    }
    double left = t_fault + dur_s - dp_test_now();
    if (left > 0)
        usleep((useconds_t)(left * 1e6));
    printf("    busy client during the %s (%.1f s): %d calls (%d puts, %d gets), all err,"
           " slowest %.3f s:",
           fault, dp_test_now() - t_fault, calls, puts, calls - puts, slowest);
    for (int k = 0; k < n_names; k++)
        printf(" %s x%d", names[k], counts[k]);
    printf("\n");
    /* About one call a second, at worst one per budget: it was busy. */
    CHECKF(calls >= (int)(dur_s / (TIMEOUT_S + MARGIN_S + PACE_S)),
           "only %d calls in the %.0f s %s", calls, dur_s, fault);
    return calls;
}

/* What SPARE_ROWS hold after put_as_fault_begins. */
typedef struct spare {
    double t_fault; /* when the fault was in place */
    int sure;       /* the seed of the last put of them that answered ok */
    int maybe; /* the put in flight's seed if it failed (it may have landed), or -1 */
} spare;

#define SPARE_TRIES 4

/*
 * Puts of SPARE_ROWS sent so that the fault begins while one is in flight,
 * timed from a put just before (seed0; the first one warms the client's
 * memory pools) and aimed earlier at each try: apply(n, 0, true) starts the
 * fault on host 0, apply(n, 0, false) lifts it. A put that still finished first (ok) is
 * followed by lifting the fault at once (it was in place for milliseconds) and another
 * try with the next seed, SPARE_TRIES in all; the last try's fault stays.
 * Each answer must be ok or err within the budget, and is printed.
 */
static spare
put_as_fault_begins(dp_lc *c, dp_netns *n,
                    int (*apply)(dp_netns *, uint32_t, bool, dp_detail *), int seed0)
{
    dp_lc_answer a;
    char cmd[96];
    snprintf(cmd, sizeof cmd, "put " SPARE_ROWS " %d", seed0);
    dp_lc_ask_ok(c, cmd, &a);
    dp_lc_ask_ok(c, cmd, &a);
    spare sp = {.sure = seed0, .maybe = -1};
    double prep = max2(a.wall - a.elapsed, 0), lib = a.elapsed;
    dp_detail d;
    dp_detail_clear(&d);
    /* How long a command inside host 0 takes to run (the fault's is alike). */
    char rules[4096];
    double t_cmd = dp_test_now();
    CHECK_OK_D(dp_netns_rules(n, 0, rules, sizeof rules, &d), &d);
    double lat = dp_test_now() - t_cmd;
    for (int k = 0; k < SPARE_TRIES; k++) {
        int seed = seed0 + 1 + k;
        snprintf(cmd, sizeof cmd, "put " SPARE_ROWS " %d", seed);
        double t0 = dp_test_now();
        CHECK_OK_D(dp_netns_writeline(&c->p, cmd, &d), &d);
        double wait = prep + lib * (0.5 - 0.15 * k) - lat;
        if (wait > 0)
            usleep((useconds_t)(wait * 1e6));
        CHECK_OK_D(apply(n, 0, true, &d), &d);
        sp.t_fault = dp_test_now();
        double t_fault = sp.t_fault - t0;
        CHECK_OK_D(dp_netns_readline(&c->p, a.line, sizeof a.line, c->timeout_s + 20, &d),
                   &d);
        a.wall = dp_test_now() - t0;
        int used = 0;
        CHECKF(sscanf(a.line, "%15s %lf %n", a.verdict, &a.elapsed, &used) >= 2,
               "malformed answer \"%s\"", a.line);
        a.rest = a.line + used;
        printf("    %-5s %-24s -> %.600s (fault in place %.3f s after sending; the put"
               " before took %.3f s + %.3f s to prepare, a command in host 0 %.3f s)\n",
               c->name, cmd, a.line, t_fault, lib, prep, lat);
        CHECKF(strcmp(a.verdict, "ok") == 0 || strcmp(a.verdict, "err") == 0,
               "the put in flight as the fault began answered \"%s\"", a.line);
        CHECKF(a.elapsed <= c->timeout_s + MARGIN_S, "the put in flight took %.3f s",
               a.elapsed);
        if (strcmp(a.verdict, "err") == 0) {
            sp.maybe = seed;
            printf("    the fault began while the put was in flight (try %d)\n", k + 1);
            return sp;
        }
        sp.sure = seed;
        if (k + 1 == SPARE_TRIES)
            break;
        CHECK_OK_D(apply(n, 0, false, &d), &d);
    }
    printf("    NOTE every put finished before the fault (%d tries): none in flight\n",
           SPARE_TRIES);
    return sp;
}

/* The link fault in the shape of dp_netns_blackhole: on takes the link down. */
static int
link_fault(dp_netns *n, uint32_t host, bool on, dp_detail *d)
{
    return dp_netns_link(n, host, !on, d);
}

/*
 * After recovery: SPARE_ROWS hold the put that answered ok last, or the put
 * in flight as the fault began if that one failed: it may have landed all
 * the same (its commit's outcome can be unknown).
 */
static void
check_spare(dp_lc *c, spare sp)
{
    dp_lc_answer a;
    char cmd[96];
    if (sp.maybe >= 0)
        printf("    the spare rows hold seed %d, or %d if the failed put in flight landed"
               " (then seed %d's get answers corrupt)\n",
               sp.sure, sp.maybe, sp.sure);
    snprintf(cmd, sizeof cmd, "get " SPARE_ROWS " %d", sp.sure);
    dp_lc_ask(c, cmd, &a);
    if (strcmp(a.verdict, "ok") == 0)
        return;
    CHECKF(sp.maybe >= 0 && strcmp(a.verdict, "corrupt") == 0,
           "the spare rows after recovery: \"%s\"", a.line);
    snprintf(cmd, sizeof cmd, "get " SPARE_ROWS " %d", sp.maybe);
    dp_lc_ask_ok(c, cmd, &a);
    printf("    the put in flight as the fault began landed although it failed\n");
}

/*
 * The unit is not wedged: it holds the live rows (live_rows rows of
 * live_bytes bytes of values), and beyond them at most bound bytes (one put
 * per client, plus each live blob's metadata): retired regions and
 * allocations whose abort was lost in the outage (held until their lease
 * ends, then retired for good when their writer's WRITE cannot be proven
 * over). Printed with the other counters.
 */
static void
check_not_wedged(dp_lc *c, double live_rows, double live_bytes, double bound,
                 const char *what)
{
    dp_lc_answer a;
    unit_counters(c, &a);
    double rows = dp_lc_value_of(&a, "u0:", "rows");
    double retired = dp_lc_value_of(&a, "u0:", "retired_bytes");
    double published = dp_lc_value_of(&a, "u0:", "published");
    double held = dp_lc_value_of(&a, "u0:", "allocated_bytes") - live_bytes;
    double held_bound = bound + published * META_SLACK;
    printf("    retired_bytes %.0f (bound %.0f); held beyond the live rows' values %.0f"
           " (bound %.0f: %s, and %.0f live blobs' metadata)\n",
           retired, bound, held, held_bound, what, published);
    CHECKF(rows == live_rows, "the unit holds %.0f rows, want %.0f: %s", rows, live_rows,
           a.line);
    CHECKF(retired <= bound,
           "WEDGED: the unit holds %.0f retired bytes, more than %.0f (%s): %s", retired,
           bound, what, a.line);
    CHECKF(
        held <= held_bound,
        "WEDGED: the unit holds %.0f bytes beyond its live rows' values, more than %.0f"
        " (%s): %s",
        held, held_bound, what, a.line);
    CHECKF(dp_lc_value_of(&a, "u0:", "identity_refused") == 0,
           "identity_refused != 0: %s", a.line);
}

/* 40 s of outage, then up to RECOVER_S for each client: more than the default limit. */
DP_TEST_TIMEOUT(blackhole_40s, 150)
{
    dp_lc_t_start = dp_test_now();
    dp_detail d;
    dp_detail_clear(&d);
    double t0 = dp_test_now();
    dp_netns *n = topology(3);
    dp_netns_proc unit;
    char addr[256];
    dp_lc_unit_start(n, 0, DP_CLI_PATH, "0", SLAB, &unit, addr, sizeof addr);
    dp_lc busy, idle, fresh;
    dp_lc_start(&busy, n, 1, DP_LONGCLIENT_PATH, "busy", addr, 1, TIMEOUT_S);
    dp_lc_start(&idle, n, 2, DP_LONGCLIENT_PATH, "idle", addr, 1, TIMEOUT_S);
    printf("    unit at %s (host 0), busy client in host 1 (%s), idle in host 2 (%s)\n",
           addr, dp_netns_ip(n, 1), dp_netns_ip(n, 2));
    dp_lc_step(t0, "topology of 3 hosts, unit, two clients");

    t0 = dp_test_now();
    dp_lc_answer a;
    dp_lc_ask_ok(&busy, "put " BUSY_ROWS " 7", &a);
    dp_lc_ask_ok(&busy, "get " BUSY_ROWS " 7", &a);
    dp_lc_ask_ok(&idle, "put " IDLE_ROWS " 21", &a);
    dp_lc_ask_ok(&idle, "get " IDLE_ROWS " 21", &a);
    dp_lc_ask_ok(&busy, "counters", &a);
    unit_counters(&busy, &a);
    dp_lc_step(t0, "data put and checked by both clients");

    /* The outage: busy calls all along, idle does nothing. */
    t0 = dp_test_now();
    spare sp = put_as_fault_begins(&busy, n, dp_netns_blackhole, 50);
    busy_during(&busy, "blackhole", sp.t_fault, BLACKHOLE_S, 7);
    CHECK_OK_D(dp_netns_blackhole(n, 0, false, &d), &d);
    dp_lc_step(t0, "blackhole of host 0: every call failed in budget");

    t0 = dp_test_now();
    double t1 = dp_test_now();
    dp_lc_recover(&busy, "blackhole", BUSY_ROWS, 7, 9, RECOVER_S);
    dp_lc_step(t1, "busy client recovered, old data intact");
    t1 = dp_test_now();
    dp_lc_recover(&idle, "blackhole", IDLE_ROWS, 21, 23, RECOVER_S);
    dp_lc_step(t1, "idle client recovered, old data intact");
    check_spare(&busy, sp);
    dp_lc_ask_ok(&busy, "counters", &a);
    dp_lc_ask_ok(&idle, "counters", &a);
    check_not_wedged(&busy, 48, BUSY_PUT_BYTES + SPARE_PUT_BYTES + IDLE_PUT_BYTES,
                     SPARE_PUT_BYTES + IDLE_PUT_BYTES + 2.0 * META_SLACK,
                     "one put per client: busy 16 MiB, idle 16 MiB");
    dp_lc_step(t0, "blackhole lifted: both recovered, unit not wedged");

    /* A fresh client after the outage: it reads both clients' rows, and it can
     * put a quarter of the slab at once. */
    t0 = dp_test_now();
    dp_lc_start(&fresh, n, 2, DP_LONGCLIENT_PATH, "fresh", addr, 1, TIMEOUT_S);
    dp_lc_ask_ok(&fresh, "get " BUSY_ROWS " 9", &a);
    dp_lc_ask_ok(&fresh, "get " IDLE_ROWS " 23", &a);
    dp_lc_ask_ok(&fresh, "put " FRESH_ROWS " 31", &a);
    dp_lc_ask_ok(&fresh, "get " FRESH_ROWS " 31", &a);
    dp_lc_ask_ok(&fresh, "put " BIG_ROWS " 33", &a);
    dp_lc_ask_ok(&fresh, "get " BIG_ROWS " 33", &a);
    dp_lc_ask_ok(&fresh, "clear 400 32", &a);
    CHECK_CONTAINS(a.rest, "dropped=32");
    dp_lc_ask_ok(&busy, "get " BUSY_ROWS " 9", &a);
    dp_lc_ask_ok(&idle, "get " FRESH_ROWS " 31", &a);
    unit_counters(&fresh, &a);
    dp_lc_step(t0, "fresh client: reads, 8 MiB and 32 MiB put and got");

    t0 = dp_test_now();
    dp_lc_quit(&fresh);
    dp_lc_quit(&idle);
    dp_lc_quit(&busy);
    CHECK_EQ(dp_netns_proc_stop(&unit, SIGTERM, 10), 0);
    CHECK_OK_D(dp_netns_destroy(n, &d), &d);
    dp_lc_step(t0, "clients quit, unit stopped, topology removed");
}

DP_TEST(link_down_5s)
{
    dp_lc_t_start = dp_test_now();
    dp_detail d;
    dp_detail_clear(&d);
    double t0 = dp_test_now();
    dp_netns *n = topology(2);
    dp_netns_proc unit;
    char addr[256];
    dp_lc_unit_start(n, 0, DP_CLI_PATH, "0", SLAB, &unit, addr, sizeof addr);
    dp_lc busy;
    dp_lc_start(&busy, n, 1, DP_LONGCLIENT_PATH, "busy", addr, 1, TIMEOUT_S);
    dp_lc_answer a;
    dp_lc_ask_ok(&busy, "put " BUSY_ROWS " 7", &a);
    dp_lc_ask_ok(&busy, "get " BUSY_ROWS " 7", &a);
    dp_lc_step(t0, "unit in host 0, busy client in host 1, data put");

    t0 = dp_test_now();
    spare sp = put_as_fault_begins(&busy, n, link_fault, 50);
    busy_during(&busy, "link down", sp.t_fault, LINK_DOWN_S, 7);
    CHECK_OK_D(dp_netns_link(n, 0, true, &d), &d);
    dp_lc_step(t0, "link of host 0 down: every call failed in budget");

    t0 = dp_test_now();
    dp_lc_recover(&busy, "link down", BUSY_ROWS, 7, 9, RECOVER_S);
    check_spare(&busy, sp);
    dp_lc_ask_ok(&busy, "counters", &a);
    check_not_wedged(&busy, 32, BUSY_PUT_BYTES + SPARE_PUT_BYTES,
                     SPARE_PUT_BYTES + META_SLACK, "one put: busy 16 MiB");
    dp_lc_step(t0, "link up: recovered, data intact, unit not wedged");

    t0 = dp_test_now();
    dp_lc_quit(&busy);
    CHECK_EQ(dp_netns_proc_stop(&unit, SIGTERM, 10), 0);
    CHECK_OK_D(dp_netns_destroy(n, &d), &d);
    dp_lc_step(t0, "client quit, unit stopped, topology removed");
}

#define PATIENT_S 20.0 /* the budget of the client that rides a flap */
#define FLAP_ROWS "500 8 65536"

DP_TEST(link_flap_inside_the_budget)
{
    dp_lc_t_start = dp_test_now();
    dp_detail d;
    dp_detail_clear(&d);
    double t0 = dp_test_now();
    dp_netns *n = topology(2);
    dp_netns_proc unit;
    char addr[256];
    dp_lc_unit_start(n, 0, DP_CLI_PATH, "0", SLAB, &unit, addr, sizeof addr);
    dp_lc patient;
    dp_lc_start(&patient, n, 1, DP_LONGCLIENT_PATH, "patient", addr, 1, PATIENT_S);
    dp_lc_answer a;
    dp_lc_ask_ok(&patient, "put " FLAP_ROWS " 3", &a);
    dp_lc_ask_ok(&patient, "get " FLAP_ROWS " 3", &a);
    dp_lc_step(t0, "unit in host 0, a client with a 20 s budget in host 1, rows put");

    t0 = dp_test_now();
    CHECK_OK_D(dp_netns_link(n, 0, false, &d), &d);
    CHECK_OK_D(dp_netns_writeline(&patient.p, "clear 500 8", &d), &d);
    printf("    patient clear 500 8 sent as host 0's link went down\n");
    dp__sleep_s(LINK_DOWN_S);
    CHECK_OK_D(dp_netns_link(n, 0, true, &d), &d);
    double t_up = dp_test_now() - t0;
    CHECK_OK_D(dp_netns_readline(&patient.p, a.line, sizeof a.line, PATIENT_S + 20, &d),
               &d);
    double took = dp_test_now() - t0;
    printf("    patient clear 500 8 -> %s (link up after %.1f s, answer after %.1f s)\n",
           a.line, t_up, took);
    CHECKF(strncmp(a.line, "ok ", 3) == 0, "the clear across the flap answered \"%s\"",
           a.line);
    dp_lc_ask_ok(&patient, "counters", &a);
    double resent = dp_lc_value_of(&a, NULL, "resent");
    CHECKF(resent >= 1, "the clear was never sent again (resent=%.0f): %s", resent,
           a.line);
    dp_lc_step(t0, "link down 5 s under a clear: sent again, answered ok in budget");

    t0 = dp_test_now();
    dp_lc_ask(&patient, "get " FLAP_ROWS " 3", &a);
    CHECKF(strcmp(a.verdict, "missing") == 0, "the cleared rows answered \"%s\"", a.line);
    dp_lc_ask_ok(&patient, "put " FLAP_ROWS " 4", &a);
    dp_lc_ask_ok(&patient, "get " FLAP_ROWS " 4", &a);
    dp_lc_quit(&patient);
    CHECK_EQ(dp_netns_proc_stop(&unit, SIGTERM, 10), 0);
    CHECK_OK_D(dp_netns_destroy(n, &d), &d);
    dp_lc_step(t0, "rows cleared, new ones round-trip; unit stopped, topology removed");
}

#define REP_ROWS "600 8 262144" /* 2 MiB, on both units */

DP_TEST(replicas_ride_a_host_outage)
{
    dp_lc_t_start = dp_test_now();
    dp_detail d;
    dp_detail_clear(&d);
    double t0 = dp_test_now();
    dp_netns *n = topology(3);
    dp_netns_proc unit[2];
    char addr[2][256], units[600];
    for (uint32_t k = 0; k < 2; k++) {
        const char *extra[] = {
            "--unit-id", k == 0 ? "0" : "1", "--units", "2", "--replicas", "2", NULL};
        dp_lc_unit_start_with(n, k, DP_CLI_PATH, "0", SLAB, extra, &unit[k], addr[k],
                              sizeof addr[k]);
    }
    snprintf(units, sizeof units, "%s,%s", addr[0], addr[1]);
    dp_lc c;
    dp_lc_start(&c, n, 2, DP_LONGCLIENT_PATH, "rep", units, 2, TIMEOUT_S);
    dp_lc_answer a;
    dp_lc_ask_ok(&c, "put " REP_ROWS " 5", &a);
    dp_lc_ask_ok(&c, "get " REP_ROWS " 5", &a);
    dp_lc_step(t0,
               "units with two copies of each row in hosts 0 and 1, client in host 2");

    t0 = dp_test_now();
    CHECK_OK_D(dp_netns_link(n, 0, false, &d), &d);
    double t_fault = dp_test_now();
    int gets = 0, puts = 0;
    while (dp_test_now() + TIMEOUT_S + MARGIN_S < t_fault + LINK_DOWN_S) {
        dp_lc_ask(&c, "get " REP_ROWS " 5", &a);
        CHECKF(strcmp(a.verdict, "ok") == 0 && a.elapsed <= TIMEOUT_S + MARGIN_S,
               "a get during host 0's outage answered \"%s\"", a.line);
        gets++;
        dp_lc_ask_fails_in_budget(&c, "put " REP_ROWS " 6", MARGIN_S, &a);
        puts++;
    }
    double left = t_fault + LINK_DOWN_S - dp_test_now();
    if (left > 0)
        dp__sleep_s(left);
    CHECK_OK_D(dp_netns_link(n, 0, true, &d), &d);
    CHECKF(gets >= 1, "no get during the outage");
    printf("    during the outage: %d gets ok from host 1's copy, %d puts failed in "
           "budget\n",
           gets, puts);
    dp_lc_step(t0, "host 0's link down 5 s: gets from the other copy, puts refused");

    t0 = dp_test_now();
    double end = dp_test_now() + RECOVER_S;
    for (;;) { /* the first calls after the link is back may still fail */
        dp_lc_ask(&c, "put " REP_ROWS " 7", &a);
        if (strcmp(a.verdict, "ok") == 0)
            break;
        CHECKF(dp_test_now() < end, "puts still fail %.0f s after the outage: %s",
               RECOVER_S, a.line);
        dp__sleep_s(0.5);
    }
    dp_lc_ask_ok(&c, "get " REP_ROWS " 7", &a);
    CHECK_EQ(dp_netns_proc_stop(&unit[1], SIGKILL, 10), -SIGKILL);
    dp_lc_ask_ok(&c, "get " REP_ROWS " 7", &a); /* host 0's copy */
    dp_lc_step(t0, "link up: a put lands on both; host 0's copy answers it alone");

    t0 = dp_test_now();
    dp_lc_quit(&c);
    CHECK_EQ(dp_netns_proc_stop(&unit[0], SIGTERM, 10), 0);
    CHECK_OK_D(dp_netns_destroy(n, &d), &d);
    dp_lc_step(t0, "client quit, unit stopped, topology removed");
}

#define LEASE_ROWS "700 9 262144" /* 9 x 256 KiB rows, on two of the three units */
#define LEASE_TIMEOUT_S 6.0 /* the budget: a third for a silent unit, then a fence */
#define LEASE_DOWN_S 14.0   /* long enough for two put-and-get rounds */

/* Units 0-2 in hosts 0-2 keeping two copies, with 2 s read leases; their
 * addresses, comma-separated, into units. */
static void
lease_units_start(dp_netns *n, dp_netns_proc *unit, char *units, size_t cap)
{
    snprintf(units, cap, "tcp://%s:47310,tcp://%s:47310,tcp://%s:47310",
             dp_netns_ip(n, 0), dp_netns_ip(n, 1), dp_netns_ip(n, 2));
    for (uint32_t k = 0; k < 3; k++) {
        char id[4], addr[256];
        snprintf(id, sizeof id, "%u", k);
        const char *extra[] = {"--unit-id",     id,    "--units", "3",
                               "--replicas",    "2",   "--lease", "2",
                               "--repair-from", units, NULL};
        dp_lc_unit_start_with(n, k, DP_CLI_PATH, "47310", SLAB, extra, &unit[k], addr,
                              sizeof addr);
    }
}

/*
 * Read leases (docs/design.md, "Leases"): three units keeping two copies of
 * each row in hosts 0-2 (--lease 2), a client in host 3; host 0's link down:
 * puts of its rows land on their other units once those fenced it, gets
 * answer every version put; once the link is back, unit 0 answers no read of
 * its older copies until a pass caught it up: every get answers the last
 * version put; then with unit 1 killed, unit 0's copies answer alone.
 */
DP_TEST(leases_let_puts_ride_a_host_outage)
{
    dp_lc_t_start = dp_test_now();
    dp_detail d;
    dp_detail_clear(&d);
    double t0 = dp_test_now();
    dp_netns *n = topology(4);
    dp_netns_proc unit[3];
    char units[800];
    lease_units_start(n, unit, units, sizeof units);
    dp_lc c;
    dp_lc_start(&c, n, 3, DP_LONGCLIENT_PATH, "lease", units, 3, LEASE_TIMEOUT_S);
    dp_lc_answer a;
    dp_lc_ask_ok(&c, "put " LEASE_ROWS " 5", &a);
    dp_lc_ask_ok(&c, "get " LEASE_ROWS " 5", &a);
    /* Every unit holds its read lease before the fault: a unit started before
     * its peers listened may still be catching up (a slow machine, a sanitizer
     * build), and without its lease it answers no read of its copies. */
    for (double t_wait = dp_test_now();;) {
        dp_lc_ask_ok(&c, "stats all", &a);
        if (dp_lc_value_of(&a, "u0:", "lease_ok") == 1 &&
            dp_lc_value_of(&a, "u1:", "lease_ok") == 1 &&
            dp_lc_value_of(&a, "u2:", "lease_ok") == 1)
            break;
        CHECKF(dp_test_now() < t_wait + RECOVER_S,
               "the units hold no read leases %.0f s after they started: %s", RECOVER_S,
               a.line);
        dp_lc_ask_ok(&c, "sleep 0.2", &a);
    }
    dp_lc_step(t0, "three units with leases in hosts 0-2, client in host 3");

    t0 = dp_test_now();
    CHECK_OK_D(dp_netns_link(n, 0, false, &d), &d);
    double t_fault = dp_test_now();
    int ver = 5, puts = 0;
    char cmd[64];
    while (dp_test_now() + 2 * LEASE_TIMEOUT_S < t_fault + LEASE_DOWN_S) {
        snprintf(cmd, sizeof cmd, "put " LEASE_ROWS " %d", ver + 1);
        dp_lc_ask(&c, cmd, &a);
        CHECKF(strcmp(a.verdict, "ok") == 0 && a.elapsed <= LEASE_TIMEOUT_S + MARGIN_S,
               "a put during host 0's outage answered \"%s\"", a.line);
        ver++;
        puts++;
        snprintf(cmd, sizeof cmd, "get " LEASE_ROWS " %d", ver);
        dp_lc_ask(&c, cmd, &a);
        CHECKF(strcmp(a.verdict, "ok") == 0 && a.elapsed <= LEASE_TIMEOUT_S + MARGIN_S,
               "a get during host 0's outage answered \"%s\"", a.line);
    }
    double left = t_fault + LEASE_DOWN_S - dp_test_now();
    if (left > 0)
        dp__sleep_s(left);
    CHECK_OK_D(dp_netns_link(n, 0, true, &d), &d);
    CHECKF(puts >= 1, "no put during the outage");
    printf("    during the outage: %d puts landed without host 0, each read back\n",
           puts);
    dp_lc_step(t0, "host 0's link down: puts land on the other copies, gets read them");

    t0 = dp_test_now();
    snprintf(cmd, sizeof cmd, "get " LEASE_ROWS " %d", ver);
    int gets = 0;
    for (;;) { /* unit 0 holds older copies: never read; until a pass caught it up */
        dp_lc_ask_ok(&c, cmd, &a);
        if (++gets % 20 != 0)
            continue;
        dp_lc_ask_ok(&c, "stats all", &a);
        if (dp_lc_value_of(&a, "u0:", "lease_ok") == 1 &&
            dp_lc_value_of(&a, "u0:", "repair_passes") >= 1 && dp_test_now() > t0 + 3)
            break;
        CHECKF(dp_test_now() < t0 + RECOVER_S,
               "unit 0 not caught up %.0f s after the "
               "outage: %s",
               RECOVER_S, a.line);
    }
    printf("    link up: %d gets, each of version %d, until unit 0 caught up\n", gets,
           ver);
    CHECK_EQ(dp_netns_proc_stop(&unit[1], SIGKILL, 10), -SIGKILL);
    dp_lc_ask_ok(&c, cmd, &a); /* rows 0, 3, ... from unit 0's copies: caught up */
    dp_lc_step(t0, "link up: every get reads the last version; unit 1 killed, unit 0's "
                   "copies answer");

    t0 = dp_test_now();
    dp_lc_quit(&c);
    CHECK_EQ(dp_netns_proc_stop(&unit[0], SIGTERM, 10), 0);
    CHECK_EQ(dp_netns_proc_stop(&unit[2], SIGTERM, 10), 0);
    CHECK_OK_D(dp_netns_destroy(n, &d), &d);
    dp_lc_step(t0, "client quit, units stopped, topology removed");
}

/*
 * A fault that begins as the units start: host 0's link goes down the moment
 * the three units print their addresses, before any lease round. Units 1 and
 * 2 must still come to hold their read leases (each other's grant makes a
 * majority) while the outage lasts, so puts land without host 0 and gets read
 * them back. (A lease thread that first opened a full client could still be
 * opening when the link went, and left its unit without a lease for the whole
 * outage.)
 */
DP_TEST(leases_start_behind_a_fault)
{
    dp_lc_t_start = dp_test_now();
    dp_detail d;
    dp_detail_clear(&d);
    double t0 = dp_test_now();
    dp_netns *n = topology(4);
    dp_netns_proc unit[3];
    char units[800];
    lease_units_start(n, unit, units, sizeof units);
    CHECK_OK_D(dp_netns_link(n, 0, false, &d), &d);
    double t_fault = dp_test_now();
    dp_lc_step(t0, "three units with leases in hosts 0-2, host 0's link down at once");

    t0 = dp_test_now();
    dp_lc c;
    dp_lc_start(&c, n, 3, DP_LONGCLIENT_PATH, "lease", units, 3, LEASE_TIMEOUT_S);
    dp_lc_answer a;
    int tries = 0;
    for (;;) {
        tries++;
        dp_lc_ask(&c, "put " LEASE_ROWS " 1", &a);
        if (strcmp(a.verdict, "ok") == 0) {
            dp_lc_ask(&c, "get " LEASE_ROWS " 1", &a);
            if (strcmp(a.verdict, "ok") == 0)
                break;
        }
        CHECKF(dp_test_now() < t_fault + RECOVER_S,
               "no put and get without host 0 %.0f s into an outage that began as the "
               "units started (%d tries): \"%s\"",
               RECOVER_S, tries, a.line);
        dp_lc_ask_ok(&c, "sleep 0.5", &a);
    }
    printf("    put and got without host 0 %.1f s into the outage (%d tries)\n",
           dp_test_now() - t_fault, tries);
    dp_lc_step(t0, "units 1 and 2 hold their leases: a put lands without host 0, a get "
                   "reads it");

    t0 = dp_test_now();
    CHECK_OK_D(dp_netns_link(n, 0, true, &d), &d);
    dp_lc_quit(&c);
    for (uint32_t k = 0; k < 3; k++)
        CHECK_EQ(dp_netns_proc_stop(&unit[k], SIGTERM, 10), 0);
    CHECK_OK_D(dp_netns_destroy(n, &d), &d);
    dp_lc_step(t0, "link up, client quit, units stopped, topology removed");
}

/*
 * A long-lived client's first call after the restart: err DP_ERESTARTED
 * (once), never a false success.
 */
static void
first_after_restart(dp_lc *c, const char *cmd)
{
    dp_lc_answer a;
    dp_lc_ask(c, cmd, &a);
    char name[32] = "";
    if (strcmp(a.verdict, "err") == 0)
        err_name(&a, name, sizeof name);
    CHECKF(strcmp(name, "DP_ERESTARTED") == 0,
           "%s's first call after the restart answered \"%s\", want err DP_ERESTARTED",
           c->name, a.line);
    CHECKF(a.elapsed <= c->timeout_s + MARGIN_S, "it took %.3f s", a.elapsed);
}

/* A call while the unit is dead: err DP_ETRANSFER within the budget. */
static void
while_down(dp_lc *c, const char *cmd)
{
    dp_lc_answer a;
    dp_lc_ask_fails_in_budget(c, cmd, MARGIN_S, &a);
    char name[32];
    err_name(&a, name, sizeof name);
    CHECKF(strcmp(name, "DP_ETRANSFER") == 0 && strstr(a.rest, "down or unreachable"),
           "%s `%s` while the unit is dead answered \"%s\", want DP_ETRANSFER \"down or "
           "unreachable\"",
           c->name, cmd, a.line);
}

DP_TEST(unit_restart)
{
    dp_lc_t_start = dp_test_now();
    dp_detail d;
    dp_detail_clear(&d);
    double t0 = dp_test_now();
    dp_netns *n = topology(3);
    dp_netns_proc unit;
    char addr[256], port[16];
    dp_lc_unit_start(n, 0, DP_CLI_PATH, "0", SLAB, &unit, addr, sizeof addr);
    dp_lc_port_of(addr, port, sizeof port);
    dp_lc a_cl, b_cl, fresh;
    dp_lc_start(&a_cl, n, 1, DP_LONGCLIENT_PATH, "A", addr, 1, TIMEOUT_S);
    dp_lc_start(&b_cl, n, 2, DP_LONGCLIENT_PATH, "B", addr, 1, TIMEOUT_S);
    dp_lc_answer a;
    dp_lc_ask_ok(&a_cl, "put " BUSY_ROWS " 7", &a);
    dp_lc_ask_ok(&a_cl, "get " BUSY_ROWS " 7", &a);
    dp_lc_ask_ok(&b_cl, "put " IDLE_ROWS " 8", &a);
    dp_lc_ask_ok(&b_cl, "get " IDLE_ROWS " 8", &a);
    unit_counters(&a_cl, &a);
    CHECK_EQ(dp_lc_value_of(&a, "u0:", "rows"), 32);
    dp_lc_step(t0, "unit in host 0, clients A (host 1), B (host 2)");

    /* SIGKILL: calls fail fast while it is dead. */
    t0 = dp_test_now();
    CHECK_EQ(dp_netns_proc_stop(&unit, SIGKILL, 5), -SIGKILL);
    printf("    unit killed (SIGKILL)\n");
    while_down(&a_cl, "get " BUSY_ROWS " 7");
    while_down(&b_cl, "put " IDLE_ROWS " 10");
    dp_lc_step(t0, "unit dead: DP_ETRANSFER within budget");

    /* The same port, a new process: empty. */
    t0 = dp_test_now();
    char addr2[256];
    dp_lc_unit_start(n, 0, DP_CLI_PATH, port, SLAB, &unit, addr2, sizeof addr2);
    CHECK_STR(addr2, addr);
    printf("    unit restarted at %s\n", addr2);
    dp_lc_step(t0, "unit restarted on its port");

    /* A's first call is a get, B's a put: each fails once, then works. */
    t0 = dp_test_now();
    first_after_restart(&a_cl, "get " BUSY_ROWS " 7");
    dp_lc_ask(&a_cl, "get " BUSY_ROWS " 7", &a);
    CHECKF(strcmp(a.verdict, "missing") == 0 && strcmp(a.rest, "0-15") == 0,
           "rows put before the restart: \"%s\", want missing 0-15", a.line);
    dp_lc_ask_ok(&a_cl, "put " BUSY_ROWS " 9", &a);
    dp_lc_ask_ok(&a_cl, "get " BUSY_ROWS " 9", &a);
    first_after_restart(&b_cl, "put " FRESH_ROWS " 11");
    dp_lc_ask_ok(&b_cl, "put " FRESH_ROWS " 11", &a);
    dp_lc_ask_ok(&b_cl, "get " FRESH_ROWS " 11", &a);
    dp_lc_ask(&b_cl, "get " IDLE_ROWS " 8", &a);
    CHECKF(strcmp(a.verdict, "missing") == 0 && strcmp(a.rest, "200-215") == 0,
           "rows put before the restart: \"%s\", want missing 200-215", a.line);
    dp_lc_ask_ok(&b_cl, "get " BUSY_ROWS " 9", &a);
    for (int i = 0; i < 2; i++) {
        dp_lc *c = i == 0 ? &a_cl : &b_cl;
        dp_lc_ask_ok(c, "counters", &a);
        double seen = dp_lc_value_of(&a, NULL, "restarts_seen");
        CHECKF(seen >= 1, "client %s counted no restart: %s", c->name, a.line);
    }
    dp_lc_step(t0, "each client failed once (DP_ERESTARTED), then works");

    /* A fresh client; the unit published nothing stale. */
    t0 = dp_test_now();
    dp_lc_start(&fresh, n, 1, DP_LONGCLIENT_PATH, "fresh", addr, 1, TIMEOUT_S);
    dp_lc_ask_ok(&fresh, "get " BUSY_ROWS " 9", &a);
    dp_lc_ask_ok(&fresh, "get " FRESH_ROWS " 11", &a);
    dp_lc_ask(&fresh, "get " IDLE_ROWS " 8", &a);
    CHECK_STR(a.verdict, "missing");
    dp_lc_ask_ok(&fresh, "put " IDLE_ROWS " 13", &a);
    dp_lc_ask_ok(&fresh, "get " IDLE_ROWS " 13", &a);
    unit_counters(&fresh, &a);
    CHECK_EQ(dp_lc_value_of(&a, "u0:", "rows"), 16 + 8 + 16);
    CHECKF(dp_lc_value_of(&a, "u0:", "identity_refused") == 0,
           "the restarted unit refused a commit naming another allocation: %s", a.line);
    CHECKF(dp_lc_value_of(&a, "u0:", "retired_bytes") <=
               BUSY_PUT_BYTES + IDLE_PUT_BYTES + 2.0 * META_SLACK,
           "retired memory after the restart, more than one put per client: %s", a.line);
    dp_lc_step(t0, "fresh client works, identity_refused 0");

    t0 = dp_test_now();
    dp_lc_quit(&fresh);
    dp_lc_quit(&b_cl);
    dp_lc_quit(&a_cl);
    CHECK_EQ(dp_netns_proc_stop(&unit, SIGTERM, 10), 0);
    CHECK_OK_D(dp_netns_destroy(n, &d), &d);
    dp_lc_step(t0, "clients quit, unit stopped, topology removed");
}

/*
 * Send cmd to c and, delay_ms later, SIGKILL the unit: the call answers
 * within its budget, "ok" (it ended before the kill, every byte of a get
 * checked by the client) or "err", never "corrupt".
 */
static void
kill_unit_during(dp_lc *c, const char *cmd, int delay_ms, dp_netns_proc *unit,
                 dp_lc_answer *a)
{
    dp_detail d;
    dp_detail_clear(&d);
    double t0 = dp_test_now();
    CHECK_OK_D(dp_netns_writeline(&c->p, cmd, &d), &d);
    usleep((useconds_t)delay_ms * 1000);
    CHECK_EQ(dp_netns_proc_stop(unit, SIGKILL, 5), -SIGKILL);
    int rc = dp_netns_readline(&c->p, a->line, sizeof a->line, c->timeout_s + 20, &d);
    CHECKF(rc == 0, "%s `%s`: no answer after the unit was killed: %s", c->name, cmd,
           dp_detail_msg(&d));
    a->wall = dp_test_now() - t0;
    int used = 0;
    CHECKF(sscanf(a->line, "%15s %lf %n", a->verdict, &a->elapsed, &used) >= 2,
           "malformed answer \"%s\"", a->line);
    a->rest = a->line + used;
    printf("    %-5s %-24s (unit killed after %d ms) -> %.200s\n", c->name, cmd, delay_ms,
           a->line);
    CHECKF(strcmp(a->verdict, "ok") == 0 || strcmp(a->verdict, "err") == 0,
           "`%s` with the unit killed under it answered \"%s\"", cmd, a->line);
    CHECKF(a->elapsed <= c->timeout_s + MARGIN_S, "it took %.3f s", a->elapsed);
}

/*
 * The unit SIGKILLed in the middle of a client's 32 MiB get, then of its
 * 32 MiB put, over TCP from another host (the two-sided path): each call
 * answers within its budget and never with wrong bytes; after each restart
 * the client fails once (DP_ERESTARTED), finds the old rows missing (never
 * corrupt) and puts and gets byte for byte again.
 */
DP_TEST(unit_killed_mid_transfer)
{
    dp_lc_t_start = dp_test_now();
    double t0 = dp_test_now();
    dp_netns *n = topology(2);
    dp_netns_proc unit;
    char addr[256], port[16], addr2[256];
    dp_lc_unit_start(n, 0, DP_CLI_PATH, "0", SLAB, &unit, addr, sizeof addr);
    dp_lc_port_of(addr, port, sizeof port);
    dp_lc c;
    dp_lc_start(&c, n, 1, DP_LONGCLIENT_PATH, "A", addr, 1, TIMEOUT_S);
    dp_lc_answer a;
    uint64_t rnd = dp_test_seed() | 1;
    dp_lc_ask_ok(&c, "put " BIG_ROWS " 3", &a);
    dp_lc_ask_ok(&c, "get " BIG_ROWS " 3", &a);
    dp_lc_step(t0, "unit in host 0, client in host 1, 32 MiB put and got");

    /* A get lasts ~15 ms here, a put ~45: the kill lands inside each. */
    static const struct {
        const char *cmd, *left, *step;
        int delay_min, delay_span;
    } kills[] = {
        {"get " BIG_ROWS " 3", "get " BIG_ROWS " 3",
         "killed during a get: answered in budget, restarted, works", 1, 10},
        {"put " BIG_ROWS " 4", "get " BIG_ROWS " 4",
         "killed during a put: answered in budget, restarted, works", 3, 20},
    };
    for (size_t i = 0; i < DP_ARRAY_LEN(kills); i++) {
        t0 = dp_test_now();
        int delay = kills[i].delay_min + (int)(dp_test_rand(&rnd) % kills[i].delay_span);
        kill_unit_during(&c, kills[i].cmd, delay, &unit, &a);
        dp_lc_unit_start(n, 0, DP_CLI_PATH, port, SLAB, &unit, addr2, sizeof addr2);
        CHECK_STR(addr2, addr);
        first_after_restart(&c, "get " BUSY_ROWS " 7");
        dp_lc_ask(&c, kills[i].left, &a);
        CHECKF(strcmp(a.verdict, "missing") == 0, "rows of the killed unit: \"%s\"",
               a.line);
        char cmd[64];
        snprintf(cmd, sizeof cmd, "put " BIG_ROWS " %zu", 10 + i);
        dp_lc_ask_ok(&c, cmd, &a);
        snprintf(cmd, sizeof cmd, "get " BIG_ROWS " %zu", 10 + i);
        dp_lc_ask_ok(&c, cmd, &a);
        dp_lc_step(t0, kills[i].step);
    }

    dp_lc_quit(&c);
    CHECK_EQ(dp_netns_proc_stop(&unit, SIGTERM, 10), 0);
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_OK_D(dp_netns_destroy(n, &d), &d);
}

/*
 * A request the client gave up on must not take effect after its next one.
 * A clear that times out in a blackhole stays in the old connection's kernel
 * buffer; when the network comes back TCP delivers it, after the client put
 * the same rows again over a new connection. The unit refuses it as stale
 * (it used to carry it out, 1-4 s later, and the confirmed rows vanished).
 */
DP_TEST(late_clear_is_refused)
{
    dp_lc_t_start = dp_test_now();
    dp_detail d;
    dp_detail_clear(&d);
    double t0 = dp_test_now();
    dp_netns *n = topology(2);
    dp_netns_proc unit;
    char addr[256];
    dp_lc_unit_start(n, 0, DP_CLI_PATH, "0", SLAB, &unit, addr, sizeof addr);
    dp_lc c;
    dp_lc_start(&c, n, 1, DP_LONGCLIENT_PATH, "client", addr, 1, 2.0);
    dp_lc_answer a;
    dp_lc_ask_ok(&c, "put 0 8 4096 1", &a);
    dp_lc_ask_ok(&c, "get 0 8 4096 1", &a);
    dp_lc_step(t0, "unit in host 0, a client in host 1, 8 rows put");

    t0 = dp_test_now();
    CHECK_OK_D(dp_netns_blackhole(n, 0, true, &d), &d);
    dp_lc_ask_fails_in_budget(&c, "clear 0 8", MARGIN_S, &a);
    usleep(4000000);
    CHECK_OK_D(dp_netns_blackhole(n, 0, false, &d), &d);
    dp_lc_step(t0, "a clear timed out in a 4 s blackhole");

    /* The client moves on: the rows again, confirmed, and they must stay. */
    t0 = dp_test_now();
    double t_put = 0;
    for (int tries = 0;; tries++) {
        dp_lc_ask(&c, "put 0 8 4096 2", &a);
        if (strcmp(a.verdict, "ok") == 0) {
            t_put = dp_test_now();
            break;
        }
        CHECKF(tries < 20, "no put worked after the blackhole: %s", a.line);
        usleep(250000);
    }
    dp_lc_ask_ok(&c, "get 0 8 4096 2", &a);
    while (dp_test_now() - t_put < 10.0) {
        usleep(1000000);
        dp_lc_ask(&c, "get 0 8 4096 2", &a);
        CHECKF(strcmp(a.verdict, "ok") == 0,
               "%.1f s after a confirmed put its rows read \"%s\": the late clear took "
               "effect",
               dp_test_now() - t_put, a.line);
    }
    unit_counters(&c, &a);
    CHECKF(dp_lc_value_of(&a, "u0:", "stale_refused") >= 1,
           "the late clear never arrived (the scenario did not happen): %s", a.line);
    CHECK_EQ(dp_lc_value_of(&a, "u0:", "rows"), 8);
    dp_lc_step(t0, "confirmed rows stayed 10 s; the late clear was refused");

    t0 = dp_test_now();
    dp_lc_quit(&c);
    CHECK_EQ(dp_netns_proc_stop(&unit, SIGTERM, 10), 0);
    CHECK_OK_D(dp_netns_destroy(n, &d), &d);
    dp_lc_step(t0, "client quit, unit stopped, topology removed");
}

/*
 * Clients killed in the middle of a put or a get over TCP. UCX 1.13's
 * emulated RMA could abort the unit then (its error path in
 * ucp_get_req_handler / uct_tcp_ep_pending_purge); puts and gets over TCP are
 * two-sided now (docs/design.md, "Two-sided transfers"), so the unit must
 * stay up through every kill, serve a checked client's rows byte for byte
 * after each, and count its two-sided transfers.
 */
DP_TEST(clients_killed_mid_transfer)
{
    dp_lc_t_start = dp_test_now();
    dp_detail d;
    dp_detail_clear(&d);
    double t0 = dp_test_now();
    dp_netns *n = topology(2);
    dp_netns_proc unit;
    char addr[256];
    dp_lc_unit_start(n, 0, DP_CLI_PATH, "0", SLAB, &unit, addr, sizeof addr);
    dp_lc checked;
    dp_lc_start(&checked, n, 1, DP_LONGCLIENT_PATH, "checked", addr, 1, TIMEOUT_S);
    dp_lc_answer a;
    dp_lc_ask_ok(&checked, "put " BUSY_ROWS " 7", &a);
    dp_lc_ask_ok(&checked, "put " BIG_ROWS " 5", &a);
    dp_lc_step(t0, "unit in host 0, checked client in host 1");

    uint64_t rs = dp_test_seed();
    for (int k = 0; k < 8; k++) {
        t0 = dp_test_now();
        dp_lc victim;
        dp_lc_start(&victim, n, 1, DP_LONGCLIENT_PATH, "victim", addr, 1, TIMEOUT_S);
        /* 32 MiB each way: a kill 2..60 ms in lands inside the transfer. */
        const char *cmd = k % 2 == 0 ? "put 500 32 1048576 3" : "get " BIG_ROWS " 5";
        CHECK_OK_D(dp_netns_writeline(&victim.p, cmd, &d), &d);
        usleep((useconds_t)(2000 + dp_test_rand(&rs) % 58000));
        CHECK_EQ(dp_netns_proc_stop(&victim.p, SIGKILL, 5), -SIGKILL);
        CHECKF(dp_netns_proc_alive(&unit),
               "the unit died when a client was killed in: %s", cmd);
        dp_lc_ask_ok(&checked, "get " BUSY_ROWS " 7", &a);
        char what[96];
        snprintf(what, sizeof what, "victim killed in '%s'", cmd);
        dp_lc_step(t0, what);
    }
    t0 = dp_test_now();
    dp_lc_ask_ok(&checked, "get " BIG_ROWS " 5", &a);
    dp_lc_ask_ok(&checked, "stats all", &a);
    CHECKF(dp_lc_value_of(&a, "u0:", "two_sided_writes") > 0 &&
               dp_lc_value_of(&a, "u0:", "two_sided_reads") > 0,
           "the transfers over TCP did not go two-sided: %.300s", a.line);
    CHECKF(dp_lc_value_of(&a, "u0:", "identity_refused") == 0,
           "a commit named another allocation: %.300s", a.line);
    dp_lc_quit(&checked);
    CHECK_EQ(dp_netns_proc_stop(&unit, SIGTERM, 10), 0);
    CHECK_OK_D(dp_netns_destroy(n, &d), &d);
    dp_lc_step(t0, "unit up through every kill, rows intact");
}
