/*
 * A minimal test harness: each test program includes this header once and
 * defines tests with DP_TEST(name). main() runs them all (or those whose names
 * contain argv[1]), prints one line per test and closes with
 * "N passed, N failed". A failed check prints both values (and dp_strerror of
 * failed calls) and ends the current test; the others still run.
 *
 * Randomised tests take their seed from dp_test_seed(): DP_TEST_SEED from the
 * environment, else the clock. The seed is printed so a failure can be replayed.
 */
#ifndef DP_TEST_H
#define DP_TEST_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <inttypes.h>
#include <setjmp.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dataplane/err.h"

typedef void (*dp_test_fn)(void);
struct dp_test_case {
    const char *name;
    dp_test_fn fn;
};

#define DP_TEST_MAX 512
static struct dp_test_case dp_test_cases[DP_TEST_MAX];
static int dp_test_ncases;
static jmp_buf dp_test_jmp;
static int dp_test_failed_now;

#define DP_TEST(name)                                                                    \
    static void dp_test_##name(void);                                                    \
    __attribute__((constructor)) static void dp_test_reg_##name(void)                    \
    {                                                                                    \
        if (dp_test_ncases < DP_TEST_MAX)                                                \
            dp_test_cases[dp_test_ncases++] =                                            \
                (struct dp_test_case){#name, dp_test_##name};                            \
    }                                                                                    \
    static void dp_test_##name(void)

__attribute__((noreturn, format(printf, 3, 4))) static void
dp_test_fail_at(const char *file, int line, const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "  %s:%d: ", file, line);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n");
    fflush(stderr);
    dp_test_failed_now = 1;
    longjmp(dp_test_jmp, 1);
}

#define CHECK(cond)                                                                      \
    do {                                                                                 \
        if (!(cond))                                                                     \
            dp_test_fail_at(__FILE__, __LINE__, "check failed: %s", #cond);              \
    } while (0)

#define CHECKF(cond, ...)                                                                \
    do {                                                                                 \
        if (!(cond)) {                                                                   \
            fprintf(stderr, "  check failed: %s: ", #cond);                              \
            dp_test_fail_at(__FILE__, __LINE__, __VA_ARGS__);                            \
        }                                                                                \
    } while (0)

#define CHECK_EQ(a, b)                                                                   \
    do {                                                                                 \
        long long dp_a_ = (long long)(a), dp_b_ = (long long)(b);                        \
        if (dp_a_ != dp_b_)                                                              \
            dp_test_fail_at(__FILE__, __LINE__, "%s == %s: %lld != %lld", #a, #b, dp_a_, \
                            dp_b_);                                                      \
    } while (0)

#define CHECK_EQ_U64(a, b)                                                               \
    do {                                                                                 \
        uint64_t dp_a_ = (uint64_t)(a), dp_b_ = (uint64_t)(b);                           \
        if (dp_a_ != dp_b_)                                                              \
            dp_test_fail_at(__FILE__, __LINE__, "%s == %s: %" PRIu64 " != %" PRIu64, #a, \
                            #b, dp_a_, dp_b_);                                           \
    } while (0)

#define CHECK_STR(a, b)                                                                  \
    do {                                                                                 \
        const char *dp_a_ = (a), *dp_b_ = (b);                                           \
        if (dp_a_ == NULL || dp_b_ == NULL || strcmp(dp_a_, dp_b_) != 0)                 \
            dp_test_fail_at(__FILE__, __LINE__, "%s == %s: \"%s\" != \"%s\"", #a, #b,    \
                            dp_a_ ? dp_a_ : "(null)", dp_b_ ? dp_b_ : "(null)");         \
    } while (0)

#define CHECK_CONTAINS(hay, needle)                                                      \
    do {                                                                                 \
        const char *dp_h_ = (hay), *dp_n_ = (needle);                                    \
        if (dp_h_ == NULL || strstr(dp_h_, dp_n_) == NULL)                               \
            dp_test_fail_at(__FILE__, __LINE__, "\"%s\" does not contain \"%s\"",        \
                            dp_h_ ? dp_h_ : "(null)", dp_n_);                            \
    } while (0)

/* expr returns a dp_err; det is a dp_detail * or NULL, printed on failure. */
#define CHECK_OK_D(expr, det)                                                            \
    do {                                                                                 \
        int dp_rc_ = (expr);                                                             \
        if (dp_rc_ != 0)                                                                 \
            dp_test_fail_at(__FILE__, __LINE__, "%s failed: %s (%s) %s", #expr,          \
                            dp_errname(dp_rc_), dp_strerror(dp_rc_),                     \
                            dp_detail_msg(det));                                         \
    } while (0)
#define CHECK_OK(expr) CHECK_OK_D(expr, NULL)

#define CHECK_ERR_D(expr, code, det)                                                     \
    do {                                                                                 \
        int dp_rc_ = (expr), dp_want_ = (code);                                          \
        if (dp_rc_ != dp_want_)                                                          \
            dp_test_fail_at(__FILE__, __LINE__, "%s: got %s, want %s %s", #expr,         \
                            dp_errname(dp_rc_), dp_errname(dp_want_),                    \
                            dp_detail_msg(det));                                         \
    } while (0)
#define CHECK_ERR(expr, code) CHECK_ERR_D(expr, code, NULL)

static uint64_t dp_test_seed_value;
static bool dp_test_seed_set;

/* The seed for randomised tests: DP_TEST_SEED, else the clock; printed once. */
static inline uint64_t
dp_test_seed(void)
{
    if (!dp_test_seed_set) {
        const char *e = getenv("DP_TEST_SEED");
        if (e != NULL && *e != '\0') {
            dp_test_seed_value = strtoull(e, NULL, 0);
        } else {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            dp_test_seed_value = (uint64_t)ts.tv_sec * 1000003u ^ (uint64_t)ts.tv_nsec;
        }
        dp_test_seed_set = true;
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

int
main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    static int passed, failed, i; /* static: they live across longjmp */
    const char *filter = argc > 1 ? argv[1] : NULL;
    for (i = 0; i < dp_test_ncases; i++) {
        if (filter != NULL && strstr(dp_test_cases[i].name, filter) == NULL)
            continue;
        static double t0;
        t0 = dp_test_now();
        dp_test_failed_now = 0;
        if (setjmp(dp_test_jmp) == 0)
            dp_test_cases[i].fn();
        const struct dp_test_case *tc = &dp_test_cases[i];
        double ms = (dp_test_now() - t0) * 1e3;
        if (dp_test_failed_now) {
            printf("FAIL %s (%.1f ms)\n", tc->name, ms);
            failed++;
        } else {
            printf("ok   %s (%.1f ms)\n", tc->name, ms);
            passed++;
        }
    }
    if (dp_test_seed_set)
        printf("seed: DP_TEST_SEED=%" PRIu64 "\n", dp_test_seed_value);
    printf("%d passed, %d failed\n", passed, failed);
    return failed == 0 && passed > 0 ? 0 : 1;
}

#endif
