/*
 * Tests for src/common/copier: batches of copies shared by several threads.
 * Every byte is compared with what a plain memcpy of the same jobs gives.
 */
#include "dp_test.h"

#include <sys/wait.h>
#include <unistd.h>

#include "common/common.h"
#include "common/copier.h"

#define MiB (1024u * 1024)

static uint64_t
rnd(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* Jobs of random sizes (0 to 1.5 MiB, mostly small) from src into dst. */
static size_t
make_jobs(dp__copy *jobs, size_t max, uint8_t *dst, const uint8_t *src, size_t room,
          uint64_t *seed)
{
    size_t n = 0, at = 0;
    while (n < max) {
        uint64_t r = rnd(seed);
        size_t len = r % 8 == 0   ? (size_t)(r >> 8) % (3 * MiB / 2)
                     : r % 8 == 1 ? 0
                                  : (size_t)(r >> 8) % 9000;
        if (at + len + 64 > room)
            break;
        jobs[n++] = (dp__copy){dst + at, src + at + 7, len};
        at += len + (size_t)(r >> 40) % 64;
    }
    return n;
}

DP_TEST(copies_match_memcpy_with_any_thread_count)
{
    const size_t room = 24 * MiB;
    uint8_t *src = malloc(room + 64), *dst = malloc(room), *want = malloc(room);
    CHECK(src != NULL && dst != NULL && want != NULL);
    for (size_t i = 0; i < room + 64; i++)
        src[i] = (uint8_t)(i * 151 + (i >> 13));
    static dp__copy jobs[4096];
    uint64_t seed = dp_test_seed() | 1;
    for (unsigned threads = 1; threads <= 4; threads++) {
        dp__copier *c = dp__copier_new(threads);
        CHECK(c != NULL);
        uint64_t batches_want = 0, bytes_want = 0;
        for (int round = 0; round < 6; round++) {
            /* round 5: one small batch, under the threshold (caller alone) */
            size_t max = round == 5 ? 3 : 1 + rnd(&seed) % 4000;
            size_t n = make_jobs(jobs, max, dst, src, room, &seed);
            if (round == 5)
                for (size_t j = 0; j < n; j++)
                    jobs[j].n %= 1000;
            memset(dst, 0xee, room);
            memset(want, 0xee, room);
            uint64_t total = 0;
            for (size_t j = 0; j < n; j++) {
                memcpy(want + ((uint8_t *)jobs[j].dst - dst), jobs[j].src, jobs[j].n);
                total += jobs[j].n;
            }
            dp__copier_run(c, jobs, n);
            CHECKF(memcmp(dst, want, room) == 0, "%u threads, round %d: %zu jobs differ",
                   threads, round, n);
            if (threads > 1 && total >= 512 * 1024) {
                batches_want++;
                bytes_want += total;
            }
        }
        uint64_t batches, bytes, helped;
        dp__copier_counts(c, &batches, &bytes, &helped);
        CHECK_EQ_U64(batches, batches_want);
        CHECK_EQ_U64(bytes, bytes_want);
        CHECK(helped <= bytes);
        if (threads == 1)
            CHECK_EQ_U64(helped, 0);
        dp__copier_destroy(c);
    }
    dp__copier_destroy(NULL);
    dp__copier_run(NULL, jobs, 0); /* no copier: the caller copies (nothing here) */
    free(src);
    free(dst);
    free(want);
}

/*
 * The helpers really copy: over batches of 16 MiB they take part of the
 * bytes (a helper that is woken takes a chunk within microseconds, a batch
 * lasts milliseconds, so twenty batches without one would mean it never
 * ran).
 */
DP_TEST(helpers_take_part)
{
    const size_t n = 16 * MiB;
    uint8_t *a = malloc(n), *b = malloc(n);
    CHECK(a != NULL && b != NULL);
    for (size_t i = 0; i < n; i++)
        a[i] = (uint8_t)(i * 7 + 1);
    dp__copier *c = dp__copier_new(2);
    CHECK(c != NULL);
    dp__copy job = {b, a, n};
    uint64_t helped = 0;
    for (int round = 0; round < 20 && helped == 0; round++) {
        memset(b, 0, n);
        dp__copier_run(c, &job, 1);
        CHECK(memcmp(a, b, n) == 0);
        dp__copier_counts(c, NULL, NULL, &helped);
    }
    CHECKF(helped > 0, "no helper copied a byte of 20 batches of 16 MiB");
    dp__copier_destroy(c);
    free(a);
    free(b);
}

/* A copier made and never used, or used once, stops cleanly; a forked child
 * copies alone (its parent's helpers do not exist there) and can destroy it
 * (without waiting for them). */
DP_TEST(unused_copier_and_forked_child)
{
    dp__copier_destroy(dp__copier_new(4));
    dp__copier *c = dp__copier_new(2);
    CHECK(c != NULL);
    const size_t n = 4 * MiB;
    uint8_t *a = malloc(n), *b = malloc(n);
    CHECK(a != NULL && b != NULL);
    memset(a, 0x3c, n);
    dp__copy job = {b, a, n};
    dp__copier_run(c, &job, 1);
    CHECK(memcmp(a, b, n) == 0);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        alarm(20); /* a hang is a failure, not a stuck test */
        memset(a, 0x71, n);
        dp__copier_run(c, &job, 1);
        uint64_t batches = 0;
        dp__copier_counts(c, &batches, NULL, NULL);
        bool ok = memcmp(a, b, n) == 0 && batches == 1; /* the child's copy: alone */
        dp__copier_destroy(c);
        _exit(ok ? 0 : 1);
    }
    int status = 0;
    CHECK_EQ(waitpid(pid, &status, 0), pid);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    CHECK(b[0] == 0x3c); /* the child's copy stayed in the child */
    dp__copier_destroy(c);
    free(a);
    free(b);
}

DP_TEST(default_threads)
{
    unsigned t = dp__copier_default_threads();
    CHECK(t == (sysconf(_SC_NPROCESSORS_ONLN) >= 2 ? 2u : 1u));
}
