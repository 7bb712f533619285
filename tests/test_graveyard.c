/*
 * Tests for src/xfer/graveyard: range bookkeeping, charging, poisoning.
 *
 * The graveyard is one per process and poisoning is sticky, so every test runs
 * its body in a forked child (no UCX here: fork is safe) and checks its exit.
 */
#include "dp_test.h"

#include <pthread.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/common.h"
#include "xfer/graveyard.h"

#define IN_CHILD(body)                                                                   \
    do {                                                                                 \
        fflush(NULL);                                                                    \
        pid_t pid_ = fork();                                                             \
        CHECK(pid_ >= 0);                                                                \
        if (pid_ == 0) {                                                                 \
            body;                                                                        \
            _exit(0);                                                                    \
        }                                                                                \
        int st_ = 0;                                                                     \
        CHECK_EQ(waitpid(pid_, &st_, 0), pid_);                                          \
        CHECKF(WIFEXITED(st_) && WEXITSTATUS(st_) == 0, "child failed at line %d",       \
               WIFEXITED(st_) ? WEXITSTATUS(st_) : -1);                                  \
    } while (0)

/* In a child: exit with the line number on failure. */
#define C(cond)                                                                          \
    do {                                                                                 \
        if (!(cond)) {                                                                   \
            fprintf(stderr, "  child check failed: %s (line %d)\n", #cond, __LINE__);    \
            _exit(__LINE__ & 0xff ? __LINE__ & 0xff : 1);                                \
        }                                                                                \
    } while (0)

static void
ranges_body(void)
{
    C(!dp__graveyard_touches(0, 1 << 20));
    C(dp__graveyard_entries() == 0 && dp__graveyard_bytes() == 0);
    static int owner;
    dp__range r[3] = {{1000, 100}, {5000, 1}, {2000, 0}};
    dp__graveyard_retain(&owner, r, 3, "test");
    C(dp__graveyard_entries() == 1);
    C(dp__graveyard_bytes() == 101);
    C(dp__graveyard_touches(1000, 1));
    C(dp__graveyard_touches(1099, 1));
    C(!dp__graveyard_touches(1100, 10));
    C(!dp__graveyard_touches(990, 10));
    C(dp__graveyard_touches(990, 11));
    C(dp__graveyard_touches(0, 100000));
    C(dp__graveyard_touches(5000, 1));
    C(!dp__graveyard_touches(4999, 1));
    C(!dp__graveyard_touches(5001, 1));
    C(!dp__graveyard_touches(2000, 10)); /* empty ranges are not retained */
    C(!dp__graveyard_touches(1000, 0));
    /* Adjacent and overlapping ranges merge; the charge is the sum as given. */
    dp__range s[2] = {{1100, 50}, {1050, 200}};
    dp__graveyard_retain(NULL, s, 2, "test2");
    C(dp__graveyard_bytes() == 351);
    C(dp__graveyard_touches(1249, 1));
    C(!dp__graveyard_touches(1250, 1));
    /* Wrap-around at the top of the address space is clamped. */
    dp__range w = {UINT64_MAX - 10, 100};
    dp__graveyard_retain(NULL, &w, 1, "wrap");
    C(dp__graveyard_touches(UINT64_MAX - 1, 1));
    C(!dp__graveyard_poisoned());
    C(dp__graveyard_check(NULL) == DP_OK);
}

DP_TEST(ranges_overlap_and_merge)
{
    IN_CHILD(ranges_body());
}

static void
random_body(uint64_t seed)
{
    /* Property: touches() agrees with a brute-force bitmap over a small space. */
    enum { SPACE = 4096 };
    static uint8_t map[SPACE];
    uint64_t rs = seed;
    for (int it = 0; it < 300; it++) {
        uint64_t a = dp_test_rand(&rs) % SPACE, n = 1 + dp_test_rand(&rs) % 64;
        if (a + n > SPACE)
            n = SPACE - a;
        dp__range r = {a, n};
        dp__graveyard_retain(NULL, &r, 1, "rand");
        memset(map + a, 1, n);
        for (int q = 0; q < 50; q++) {
            uint64_t b = dp_test_rand(&rs) % SPACE, m = 1 + dp_test_rand(&rs) % 32;
            if (b + m > SPACE)
                m = SPACE - b;
            bool want = false;
            for (uint64_t k = b; k < b + m; k++)
                want |= map[k] != 0;
            C(dp__graveyard_touches(b, m) == want);
        }
    }
}

DP_TEST(touches_matches_bitmap)
{
    uint64_t seed = dp_test_seed();
    IN_CHILD(random_body(seed));
}

static void
poison_body(void)
{
    C(dp__graveyard_max_bytes() == DP_GRAVEYARD_DEFAULT_MAX_BYTES);
    dp__graveyard_set_max_bytes(1000);
    dp__range r = {4096, 600};
    dp__graveyard_retain(NULL, &r, 1, "a");
    C(!dp__graveyard_poisoned());
    dp__graveyard_retain_buffer(400); /* exactly at the limit: still fine */
    C(!dp__graveyard_poisoned());
    C(dp__graveyard_check(NULL) == DP_OK);
    dp__graveyard_retain_buffer(1);
    C(dp__graveyard_poisoned());
    dp_detail d;
    dp_detail_clear(&d);
    C(dp__graveyard_check(&d) == DP_EFATAL);
    C(strstr(d.msg, "poisoned") != NULL);
    C(strstr(d.msg, "1001") != NULL);
    /* Sticky: raising the limit does not heal the process. */
    dp__graveyard_set_max_bytes(1ull << 40);
    C(dp__graveyard_poisoned());
}

static void
release_body(void)
{
    static int a, b, c;
    dp__range ra[2] = {{1000, 100}, {3000, 10}}, rb = {1050, 100};
    dp__graveyard_retain(&a, ra, 2, "a");
    dp__graveyard_retain(&b, &rb, 1, "b");
    C(dp__graveyard_entries() == 2 && dp__graveyard_bytes() == 210);
    /* Releasing a keeps what b still names, and only that. */
    C(dp__graveyard_release(&a));
    C(!dp__graveyard_release(&a)); /* once */
    C(!dp__graveyard_release(&c)); /* never retained */
    C(dp__graveyard_entries() == 1 && dp__graveyard_bytes() == 100);
    C(dp__graveyard_released() == 1);
    C(!dp__graveyard_touches(1000, 50));
    C(dp__graveyard_touches(1050, 1) && dp__graveyard_touches(1149, 1));
    C(!dp__graveyard_touches(1150, 10));
    C(!dp__graveyard_touches(3000, 10));
    C(dp__graveyard_release(&b));
    C(dp__graveyard_entries() == 0 && dp__graveyard_bytes() == 0);
    C(!dp__graveyard_touches(0, 1 << 20));
    /* Whole retired buffers are charged and uncharged by size. */
    dp__graveyard_retain_buffer(4096);
    C(dp__graveyard_bytes() == 4096);
    dp__graveyard_release_buffer(4096);
    C(dp__graveyard_bytes() == 0);
    /* A poisoned process stays poisoned after releases. */
    dp__graveyard_set_max_bytes(10);
    dp__graveyard_retain(&c, ra, 1, "c");
    C(dp__graveyard_poisoned());
    C(dp__graveyard_release(&c));
    C(dp__graveyard_poisoned() && dp__graveyard_check(NULL) == DP_EFATAL);
}

/* A transfer that ended after all leaves the graveyard; the others' ranges stay. */
DP_TEST(release_of_a_transfer_that_ended)
{
    IN_CHILD(release_body());
}

DP_TEST(poisoned_past_max_bytes_and_sticky)
{
    IN_CHILD(poison_body());
}

static void
lower_limit_body(void)
{
    dp__graveyard_retain_buffer(5000);
    C(!dp__graveyard_poisoned());
    dp__graveyard_set_max_bytes(4999); /* lowering below the charge poisons at once */
    C(dp__graveyard_poisoned());
}

DP_TEST(lowering_the_limit_poisons)
{
    IN_CHILD(lower_limit_body());
}

static void
env_limit_body(void)
{
    C(dp__graveyard_max_bytes() == 64 * 1024);
    dp__graveyard_retain_buffer(64 * 1024 + 1);
    C(dp__graveyard_poisoned());
}

DP_TEST(limit_from_environment)
{
    setenv("DP_GRAVEYARD_MAX_BYTES", "64K", 1);
    IN_CHILD(env_limit_body());
    unsetenv("DP_GRAVEYARD_MAX_BYTES");
}

static void *
hammer(void *arg)
{
    uint64_t base = (uint64_t)(uintptr_t)arg;
    for (int i = 0; i < 2000; i++) {
        dp__range r = {base + (uint64_t)i * 16, 8};
        dp__graveyard_retain(NULL, &r, 1, "thread");
        if (!dp__graveyard_touches(base + (uint64_t)i * 16 + 7, 1))
            abort();
        dp__graveyard_check(NULL);
    }
    return NULL;
}

/*
 * Runs in this process, not in a child: ThreadSanitizer does not support
 * starting threads after fork. The charge stays far below the default limit.
 */
DP_TEST(concurrent_retain_and_lookup)
{
    size_t e0 = dp__graveyard_entries();
    uint64_t b0 = dp__graveyard_bytes();
    int lv = dp__log_enabled(DP_LOG_WARN) ? DP_LOG_INFO : DP_LOG_ERROR;
    dp__log_set_level(DP_LOG_ERROR);
    pthread_t t[4];
    for (int i = 0; i < 4; i++)
        CHECK_EQ(pthread_create(&t[i], NULL, hammer,
                                (void *)(uintptr_t)((uint64_t)(i + 1) << 32)),
                 0);
    for (int i = 0; i < 4; i++)
        pthread_join(t[i], NULL);
    dp__log_set_level(lv);
    CHECK_EQ_U64(dp__graveyard_entries(), e0 + 8000);
    CHECK_EQ_U64(dp__graveyard_bytes(), b0 + 8000 * 8);
    CHECK(!dp__graveyard_poisoned());
}
