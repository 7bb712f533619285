/*
 * A small test harness: each test program includes this header once and
 * defines tests with DP_TEST(name), or DP_TEST_TIMEOUT(name, seconds) for a
 * test with its own time limit. main() runs them all (or those whose names
 * contain argv[1]) and prints one line per test: "ok   name (ms)",
 * "FAIL name (ms)", "skip name: reason" or "TIMEOUT name (...)", then a
 * closing "N passed, N failed, N skipped".
 *
 * Isolation: every test runs in a child process of its own, forked by main()
 * after every constructor ran (the ThreadSanitizer re-exec of dp_tsan_ucx.h,
 * the role constructors of programs that re-execute themselves as peers), so
 * no test leaks state into the next: log levels, environment variables,
 * signal dispositions, threads, memory, a poisoned graveyard. The parent
 * collects the child's result and prints its line. A child that crashes or
 * ends before its test did fails that test by name, as does a sanitizer's
 * report at the child's exit (its exit status). DP_TEST_NOFORK=1 runs every
 * test in this one process instead, one after the other, for a debugger
 * (no time limits then).
 *
 * Time limits: a test still running after its limit is killed, with every
 * process it started, and reported as TIMEOUT. The limit is
 * DP_TEST_DEFAULT_TIMEOUT_S (60 s) or the test's own, times 3 under a
 * sanitizer; DP_TEST_TIMEOUT=S in the environment replaces the default (0:
 * no limits). DP_TEST_DEADLINE_S (CTest's TIMEOUT, set by tests/CMakeLists.txt)
 * bounds the whole program: a test still running 3 s before it is stopped, and
 * the tests after it are reported as not run, so a hang is named in the log
 * instead of being cut off by CTest.
 *
 * Checks: CHECK* end the test when they fail (fatal, as acutest's
 * TEST_ASSERT); EXPECT* record the failure and let the test go on (acutest's
 * TEST_CHECK), for a test that checks several independent things in a row.
 * Both print file:line, the expression and both values (dp_errname,
 * dp_strerror and the detail of a failed call). Fatal checks and DP_SKIP
 * only on the test's own thread; EXPECT* on any thread. A check that fails in
 * a process the test forked (without exec) ends that process with status 1.
 *
 * Skips: DP_SKIP("reason", ...) ends the test as skipped (a missing tool, no
 * root, a feature a sanitizer cannot run): it is counted apart and never as
 * a pass. A program whose every test skipped exits 77, which CTest reports
 * as skipped (dp_test() sets SKIP_RETURN_CODE 77); one with a failure, or
 * with no test that ran, exits 1.
 *
 * Randomised tests take their seed from dp_test_seed(): DP_TEST_SEED from
 * the environment, else the clock, one value for the whole program (every
 * test's child gets the same). A test that uses it prints it, a failed one
 * names it on its FAIL line, and the closing lines repeat it, so a failure
 * can be replayed.
 *
 * DP_TEST_TSAN, DP_TEST_ASAN and DP_TEST_SANITIZED are defined under
 * ThreadSanitizer, AddressSanitizer, and either. DP_TEST_BULK_DIV divides
 * data a test moves in bulk where the volume is not what it tests: to keep a
 * slow operation running while it watches (a save to overlap, a copy to
 * interrupt; ThreadSanitizer makes every byte ~10x slower, so a quarter of
 * the data still runs longer there), or the largest of many random ranges.
 */
#ifndef DP_TEST_H
#define DP_TEST_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "dataplane/err.h"

#if defined(__SANITIZE_THREAD__)
#define DP_TEST_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define DP_TEST_TSAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#define DP_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define DP_TEST_ASAN 1
#endif
#endif
#if defined(DP_TEST_TSAN) || defined(DP_TEST_ASAN)
#define DP_TEST_SANITIZED 1
#endif
#ifdef DP_TEST_TSAN
#define DP_TEST_BULK_DIV 4u
#else
#define DP_TEST_BULK_DIV 1u
#endif

/* ---- registration ---- */

typedef void (*dp_test_fn)(void);
struct dp_test_case {
    const char *name;
    dp_test_fn fn;
    double timeout_s; /* 0: the default */
};

#define DP_TEST_MAX 512
#define DP_TEST_DEFAULT_TIMEOUT_S 60.0
static struct dp_test_case dp_test_cases[DP_TEST_MAX];
static int dp_test_ncases, dp_test_nlost;

#define DP_TEST_TIMEOUT(name, seconds)                                                   \
    static void dp_test_##name(void);                                                    \
    __attribute__((constructor)) static void dp_test_reg_##name(void)                    \
    {                                                                                    \
        if (dp_test_ncases < DP_TEST_MAX)                                                \
            dp_test_cases[dp_test_ncases++] =                                            \
                (struct dp_test_case){#name, dp_test_##name, (seconds)};                 \
        else                                                                             \
            dp_test_nlost++;                                                             \
    }                                                                                    \
    static void dp_test_##name(void)

#define DP_TEST(name) DP_TEST_TIMEOUT(name, 0)

/* ---- the running test's state ---- */

enum { DP_TEST_PASSED, DP_TEST_FAILED, DP_TEST_SKIPPED };

static jmp_buf dp_test_jmp;
static int dp_test_failures;     /* failed checks of the running test (atomic) */
static bool dp_test_skipped_now; /* DP_SKIP ended it */
static char dp_test_skip_why[256];
static pid_t dp_test_pid; /* the process that runs the test */

/* Print a failed check: "  file:line: what: message". Counts the failure. */
__attribute__((unused, format(printf, 4, 5))) static void
dp_test_report_(const char *file, int line, const char *what, const char *fmt, ...)
{
    char msg[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "  %s:%d: %s%s%s\n", file, line, what != NULL ? what : "",
            what != NULL ? ": " : "", msg);
    fflush(stderr);
    __atomic_fetch_add(&dp_test_failures, 1, __ATOMIC_RELAXED);
}

/* End the running test (a failed fatal check or a skip). */
__attribute__((unused, noreturn)) static void
dp_test_stop_(void)
{
    if (dp_test_pid != 0 && getpid() != dp_test_pid)
        _exit(1); /* a process the test forked: never run the harness's code */
    longjmp(dp_test_jmp, 1);
}

__attribute__((unused, noreturn, format(printf, 1, 2))) static void
dp_test_skip_(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(dp_test_skip_why, sizeof dp_test_skip_why, fmt, ap);
    va_end(ap);
    dp_test_skipped_now = true;
    dp_test_stop_();
}

/* End the test as skipped, saying why (printf format). */
#define DP_SKIP(...) dp_test_skip_(__VA_ARGS__)

/* ---- checks: CHECK* fatal, EXPECT* not ---- */

#define DP_TEST_FATAL_(...)                                                              \
    do {                                                                                 \
        dp_test_report_(__FILE__, __LINE__, __VA_ARGS__);                                \
        dp_test_stop_();                                                                 \
    } while (0)
#define DP_TEST_GO_ON_(...) dp_test_report_(__FILE__, __LINE__, __VA_ARGS__)

#define DP_TEST_COND_(fail, cond, s)                                                     \
    do {                                                                                 \
        if (!(cond))                                                                     \
            fail(NULL, "check failed: %s", s);                                           \
    } while (0)

#define DP_TEST_CONDF_(fail, cond, s, ...)                                               \
    do {                                                                                 \
        if (!(cond))                                                                     \
            fail("check failed: " s, __VA_ARGS__);                                       \
    } while (0)

#define DP_TEST_CMP_(fail, a, op, b, sa, sb)                                             \
    do {                                                                                 \
        long long dp_a_ = (long long)(a), dp_b_ = (long long)(b);                        \
        if (!(dp_a_ op dp_b_))                                                           \
            fail(NULL, "%s " #op " %s: %lld vs %lld", sa, sb, dp_a_, dp_b_);             \
    } while (0)

#define DP_TEST_EQ_(fail, a, b, sa, sb)                                                  \
    do {                                                                                 \
        long long dp_a_ = (long long)(a), dp_b_ = (long long)(b);                        \
        if (dp_a_ != dp_b_)                                                              \
            fail(NULL, "%s == %s: %lld != %lld", sa, sb, dp_a_, dp_b_);                  \
    } while (0)

#define DP_TEST_EQ_U64_(fail, a, b, sa, sb)                                              \
    do {                                                                                 \
        uint64_t dp_a_ = (uint64_t)(a), dp_b_ = (uint64_t)(b);                           \
        if (dp_a_ != dp_b_)                                                              \
            fail(NULL, "%s == %s: %" PRIu64 " != %" PRIu64, sa, sb, dp_a_, dp_b_);       \
    } while (0)

#define DP_TEST_STR_(fail, a, b, sa, sb)                                                 \
    do {                                                                                 \
        const char *dp_a_ = (a), *dp_b_ = (b);                                           \
        if (dp_a_ == NULL || dp_b_ == NULL || strcmp(dp_a_, dp_b_) != 0)                 \
            fail(NULL, "%s == %s: \"%s\" != \"%s\"", sa, sb, dp_a_ ? dp_a_ : "(null)",   \
                 dp_b_ ? dp_b_ : "(null)");                                              \
    } while (0)

#define DP_TEST_CONTAINS_(fail, hay, needle)                                             \
    do {                                                                                 \
        const char *dp_h_ = (hay), *dp_n_ = (needle);                                    \
        if (dp_h_ == NULL || strstr(dp_h_, dp_n_) == NULL)                               \
            fail(NULL, "\"%s\" does not contain \"%s\"", dp_h_ ? dp_h_ : "(null)",       \
                 dp_n_);                                                                 \
    } while (0)

#define DP_TEST_OK_(fail, expr, det, s)                                                  \
    do {                                                                                 \
        int dp_rc_ = (expr);                                                             \
        if (dp_rc_ != 0)                                                                 \
            fail(NULL, "%s failed: %s (%s) %s", s, dp_errname(dp_rc_),                   \
                 dp_strerror(dp_rc_), dp_detail_msg(det));                               \
    } while (0)

#define DP_TEST_ERR_(fail, expr, code, det, s)                                           \
    do {                                                                                 \
        int dp_rc_ = (expr), dp_want_ = (code);                                          \
        if (dp_rc_ != dp_want_)                                                          \
            fail(NULL, "%s: got %s, want %s %s", s, dp_errname(dp_rc_),                  \
                 dp_errname(dp_want_), dp_detail_msg(det));                              \
    } while (0)

/* Fatal: a failure ends the test. */
#define CHECK(cond) DP_TEST_COND_(DP_TEST_FATAL_, cond, #cond)
#define CHECKF(cond, ...) DP_TEST_CONDF_(DP_TEST_FATAL_, cond, #cond, __VA_ARGS__)
#define CHECK_EQ(a, b) DP_TEST_EQ_(DP_TEST_FATAL_, a, b, #a, #b)
#define CHECK_EQ_U64(a, b) DP_TEST_EQ_U64_(DP_TEST_FATAL_, a, b, #a, #b)
#define CHECK_GE(a, b) DP_TEST_CMP_(DP_TEST_FATAL_, a, >=, b, #a, #b)
#define CHECK_LE(a, b) DP_TEST_CMP_(DP_TEST_FATAL_, a, <=, b, #a, #b)
#define CHECK_STR(a, b) DP_TEST_STR_(DP_TEST_FATAL_, a, b, #a, #b)
#define CHECK_CONTAINS(hay, needle) DP_TEST_CONTAINS_(DP_TEST_FATAL_, hay, needle)
/* expr returns a dp_err; det is a dp_detail * or NULL, printed on failure. */
#define CHECK_OK_D(expr, det) DP_TEST_OK_(DP_TEST_FATAL_, expr, det, #expr)
#define CHECK_OK(expr) CHECK_OK_D(expr, NULL)
#define CHECK_ERR_D(expr, code, det) DP_TEST_ERR_(DP_TEST_FATAL_, expr, code, det, #expr)
#define CHECK_ERR(expr, code) CHECK_ERR_D(expr, code, NULL)

/* Not fatal: a failure is recorded (the test fails) and the test goes on. */
#define EXPECT(cond) DP_TEST_COND_(DP_TEST_GO_ON_, cond, #cond)
#define EXPECTF(cond, ...) DP_TEST_CONDF_(DP_TEST_GO_ON_, cond, #cond, __VA_ARGS__)
#define EXPECT_EQ(a, b) DP_TEST_EQ_(DP_TEST_GO_ON_, a, b, #a, #b)
#define EXPECT_EQ_U64(a, b) DP_TEST_EQ_U64_(DP_TEST_GO_ON_, a, b, #a, #b)
#define EXPECT_GE(a, b) DP_TEST_CMP_(DP_TEST_GO_ON_, a, >=, b, #a, #b)
#define EXPECT_LE(a, b) DP_TEST_CMP_(DP_TEST_GO_ON_, a, <=, b, #a, #b)
#define EXPECT_STR(a, b) DP_TEST_STR_(DP_TEST_GO_ON_, a, b, #a, #b)
#define EXPECT_CONTAINS(hay, needle) DP_TEST_CONTAINS_(DP_TEST_GO_ON_, hay, needle)
#define EXPECT_OK_D(expr, det) DP_TEST_OK_(DP_TEST_GO_ON_, expr, det, #expr)
#define EXPECT_OK(expr) EXPECT_OK_D(expr, NULL)
#define EXPECT_ERR_D(expr, code, det) DP_TEST_ERR_(DP_TEST_GO_ON_, expr, code, det, #expr)
#define EXPECT_ERR(expr, code) EXPECT_ERR_D(expr, code, NULL)

/* ---- seeds, random numbers, clocks ---- */

static uint64_t dp_test_seed_value;
static bool dp_test_seed_ready, dp_test_seed_used; /* used: printed in this process */
static bool dp_test_seed_touched;                  /* the running test asked for it */

static void
dp_test_seed_init_(void)
{
    if (dp_test_seed_ready)
        return;
    const char *e = getenv("DP_TEST_SEED");
    if (e != NULL && *e != '\0') {
        dp_test_seed_value = strtoull(e, NULL, 0);
    } else {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        dp_test_seed_value = (uint64_t)ts.tv_sec * 1000003u ^ (uint64_t)ts.tv_nsec;
    }
    dp_test_seed_ready = true;
}

/* The seed for randomised tests: DP_TEST_SEED, else the clock; printed once per test. */
static inline uint64_t
dp_test_seed(void)
{
    dp_test_seed_init_();
    dp_test_seed_touched = true;
    if (!dp_test_seed_used) {
        dp_test_seed_used = true;
        fprintf(stderr, "  seed: DP_TEST_SEED=%" PRIu64 "\n", dp_test_seed_value);
    }
    return dp_test_seed_value;
}

/* splitmix64: small, fast, good enough for tests. */
static inline uint64_t
dp_test_rand(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static inline double
dp_test_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* ---- running one test ---- */

/* Run tc in this process; DP_TEST_PASSED, _FAILED or _SKIPPED. */
static int
dp_test_run_here_(const struct dp_test_case *tc)
{
    dp_test_failures = 0;
    dp_test_skipped_now = false;
    dp_test_skip_why[0] = '\0';
    dp_test_seed_touched = false;
    if (setjmp(dp_test_jmp) == 0)
        tc->fn();
    if (__atomic_load_n(&dp_test_failures, __ATOMIC_RELAXED) > 0)
        return DP_TEST_FAILED;
    return dp_test_skipped_now ? DP_TEST_SKIPPED : DP_TEST_PASSED;
}

/* What a test's child tells its parent, in one write (less than PIPE_BUF). */
struct dp_test_record_ {
    uint32_t magic;
    int32_t state;
    int32_t seed_used;
    char why[256];
};
#define DP_TEST_MAGIC_ 0x64707472u

/* How a test ended, as the parent saw it. */
struct dp_test_outcome_ {
    int state;
    bool seed_used, timed_out;
    double ms;
    char why[320]; /* skip reason, or what went wrong beyond failed checks */
};

/* SIGSTOP pid, then SIGKILL it and every process below it (/proc children lists). */
static void
dp_test_kill_tree_(pid_t pid, int depth)
{
    kill(pid, SIGSTOP); /* no more forks while its children are listed */
    char path[96];
    snprintf(path, sizeof path, "/proc/%ld/task", (long)pid);
    DIR *dir = depth < 16 ? opendir(path) : NULL;
    struct dirent *e;
    while (dir != NULL && (e = readdir(dir)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        char cpath[160];
        snprintf(cpath, sizeof cpath, "%s/%.32s/children", path, e->d_name);
        FILE *f = fopen(cpath, "r");
        long child;
        while (f != NULL && fscanf(f, "%ld", &child) == 1)
            dp_test_kill_tree_((pid_t)child, depth + 1);
        if (f != NULL)
            fclose(f);
    }
    if (dir != NULL)
        closedir(dir);
    kill(pid, SIGKILL);
}

/* Reap pid within limit_s (0: no limit); false if it still runs then. */
static bool
dp_test_reap_(pid_t pid, double limit_s, int *st)
{
    double end = dp_test_now() + limit_s;
#ifdef SYS_pidfd_open
    int pfd = (int)syscall(SYS_pidfd_open, pid, 0);
    if (pfd >= 0) {
        for (;;) {
            int ms = -1;
            if (limit_s > 0) {
                double left = end - dp_test_now();
                if (left <= 0) {
                    close(pfd);
                    return false;
                }
                ms = (int)(left * 1000) + 1;
            }
            struct pollfd p = {pfd, POLLIN, 0};
            int r = poll(&p, 1, ms);
            if (r > 0 || (r < 0 && errno != EINTR))
                break;
        }
        close(pfd);
        while (waitpid(pid, st, 0) < 0 && errno == EINTR)
            ;
        return true;
    }
#endif
    /* No pidfd: poll with a short, growing nap. */
    useconds_t nap = 100;
    for (;;) {
        pid_t r = waitpid(pid, st, WNOHANG);
        if (r == pid || (r < 0 && errno != EINTR))
            return true;
        if (limit_s > 0 && dp_test_now() >= end)
            return false;
        usleep(nap);
        nap = nap < 10000 ? nap * 2 : nap;
    }
}

/* Run tc in a child of its own, within limit_s (0: none). */
static void
dp_test_run_forked_(const struct dp_test_case *tc, double limit_s,
                    struct dp_test_outcome_ *o)
{
    memset(o, 0, sizeof *o);
    o->state = DP_TEST_FAILED;
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) {
        snprintf(o->why, sizeof o->why, "pipe: %s", strerror(errno));
        return;
    }
    fflush(NULL);
    pid_t parent = getpid();
    double t0 = dp_test_now();
    pid_t pid = fork();
    if (pid < 0) {
        snprintf(o->why, sizeof o->why, "fork: %s", strerror(errno));
        close(fds[0]);
        close(fds[1]);
        return;
    }
    if (pid == 0) {
        close(fds[0]);
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* CTest killed the harness: go too */
        if (getppid() != parent)
            _exit(1);
        dp_test_pid = getpid();
        struct dp_test_record_ r;
        memset(&r, 0, sizeof r);
        r.state = dp_test_run_here_(tc);
        if (getpid() != dp_test_pid)
            _exit(1); /* a process the test forked returned into the harness */
        r.magic = DP_TEST_MAGIC_;
        r.seed_used = dp_test_seed_touched;
        snprintf(r.why, sizeof r.why, "%s", dp_test_skip_why);
        ssize_t k = write(fds[1], &r, sizeof r);
        (void)k;
        close(fds[1]);
        exit(0); /* atexit handlers and sanitizers' exit checks run */
    }
    close(fds[1]);
    int st = 0;
    if (!dp_test_reap_(pid, limit_s, &st)) {
        dp_test_kill_tree_(pid, 0);
        while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
            ;
        o->timed_out = true;
    }
    o->ms = (dp_test_now() - t0) * 1e3;
    struct dp_test_record_ r;
    memset(&r, 0, sizeof r);
    fcntl(fds[0], F_SETFL, O_NONBLOCK);
    bool have =
        read(fds[0], &r, sizeof r) == (ssize_t)sizeof r && r.magic == DP_TEST_MAGIC_;
    close(fds[0]);
    o->seed_used = have && r.seed_used;
    if (o->timed_out)
        return;
    bool clean = WIFEXITED(st) && WEXITSTATUS(st) == 0;
    if (!have) {
        if (WIFSIGNALED(st))
            snprintf(o->why, sizeof o->why, "killed by signal %d (%s) before it ended",
                     WTERMSIG(st), strsignal(WTERMSIG(st)));
        else
            snprintf(o->why, sizeof o->why,
                     "its process exited with status %d before it ended",
                     WEXITSTATUS(st));
        return;
    }
    if (!clean) {
        /* The test ended, then its process did not exit cleanly: a sanitizer's report
         * (leaks: 23, TSan: 66), a crash in a destructor or an atexit handler. */
        if (WIFSIGNALED(st))
            snprintf(o->why, sizeof o->why,
                     "its process was killed by signal %d (%s) after the test ended",
                     WTERMSIG(st), strsignal(WTERMSIG(st)));
        else
            snprintf(o->why, sizeof o->why,
                     "its process exited with status %d after the test ended (a "
                     "sanitizer's report above?)",
                     WEXITSTATUS(st));
        return;
    }
    o->state = r.state;
    snprintf(o->why, sizeof o->why, "%s", r.why);
}

/* Run tc in this process (DP_TEST_NOFORK). */
static void
dp_test_run_inline_(const struct dp_test_case *tc, struct dp_test_outcome_ *o)
{
    memset(o, 0, sizeof *o);
    double t0 = dp_test_now();
    o->state = dp_test_run_here_(tc);
    o->ms = (dp_test_now() - t0) * 1e3;
    o->seed_used = dp_test_seed_touched;
    snprintf(o->why, sizeof o->why, "%s", dp_test_skip_why);
}

/* A number of seconds from the environment; def if unset or empty. */
static double
dp_test_env_s_(const char *name, double def)
{
    const char *e = getenv(name);
    return e != NULL && *e != '\0' ? strtod(e, NULL) : def;
}

int
main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    const char *filter = argc > 1 ? argv[1] : NULL;
    const char *nf = getenv("DP_TEST_NOFORK");
    bool nofork = nf != NULL && *nf != '\0' && strcmp(nf, "0") != 0;
    dp_test_pid = getpid();
    dp_test_seed_init_(); /* one seed for every test's child */
    double t_start = dp_test_now();
#ifdef DP_TEST_SANITIZED
    const double scale = 3;
#else
    const double scale = 1;
#endif
    double def_limit = dp_test_env_s_("DP_TEST_TIMEOUT", -1);
    bool no_limits = def_limit == 0;
    if (def_limit < 0)
        def_limit = DP_TEST_DEFAULT_TIMEOUT_S * scale;
    double budget = dp_test_env_s_("DP_TEST_DEADLINE_S", 0);
    double deadline = budget > 0 ? t_start + budget - 3 : 0;
    int passed = 0, failed = 0, skipped = 0, not_run = 0;
    bool seed_used = false;
    if (dp_test_nlost > 0) {
        printf("FAIL %d tests beyond DP_TEST_MAX (%d) were not registered\n",
               dp_test_nlost, DP_TEST_MAX);
        failed++;
    }
    for (int i = 0; i < dp_test_ncases; i++) {
        const struct dp_test_case *tc = &dp_test_cases[i];
        if (filter != NULL && strstr(tc->name, filter) == NULL)
            continue;
        double limit = no_limits           ? 0
                       : tc->timeout_s > 0 ? tc->timeout_s * scale
                                           : def_limit;
        bool by_deadline = false;
        if (deadline > 0) {
            double left = deadline - dp_test_now();
            if (left <= 0) {
                printf("TIMEOUT %s (not started: the program's DP_TEST_DEADLINE_S=%g ran "
                       "out)\n",
                       tc->name, budget);
                not_run++;
                failed++;
                continue;
            }
            if (limit == 0 || left < limit) {
                limit = left;
                by_deadline = true;
            }
        }
        struct dp_test_outcome_ o;
        if (nofork)
            dp_test_run_inline_(tc, &o);
        else
            dp_test_run_forked_(tc, limit, &o);
        seed_used = seed_used || o.seed_used;
        if (o.timed_out) {
            if (by_deadline)
                printf("TIMEOUT %s (%.1f s: stopped before the program's "
                       "DP_TEST_DEADLINE_S=%g)\n",
                       tc->name, o.ms / 1e3, budget);
            else
                printf("TIMEOUT %s (%.1f s: killed with every process it started)\n",
                       tc->name, o.ms / 1e3);
            failed++;
        } else if (o.state == DP_TEST_PASSED) {
            printf("ok   %s (%.1f ms)\n", tc->name, o.ms);
            passed++;
        } else if (o.state == DP_TEST_SKIPPED) {
            printf("skip %s: %s\n", tc->name, o.why[0] ? o.why : "(no reason given)");
            skipped++;
        } else {
            char seed[64] = "";
            if (o.seed_used)
                snprintf(seed, sizeof seed, "; replay: DP_TEST_SEED=%" PRIu64,
                         dp_test_seed_value);
            printf("FAIL %s (%.1f ms%s)%s%s\n", tc->name, o.ms, seed,
                   o.why[0] ? ": " : "", o.why);
            failed++;
        }
    }
    if (seed_used)
        printf("seed: DP_TEST_SEED=%" PRIu64 "\n", dp_test_seed_value);
    if (not_run > 0)
        printf("%d tests not run: the program's time ran out\n", not_run);
    if (passed + failed + skipped == 0)
        printf("no test matches \"%s\"\n", filter != NULL ? filter : "");
    printf("%d passed, %d failed, %d skipped\n", passed, failed, skipped);
    if (failed > 0 || passed + skipped == 0)
        return 1;
    return passed == 0 ? 77 : 0;
}

#endif
