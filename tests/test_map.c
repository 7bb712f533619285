/*
 * Tests for src/common/map: string and u64 maps against a simple model, with
 * long random sequences of put/replace/delete (backward-shift deletion is the
 * part that is easy to get wrong).
 */
#include "dp_test.h"

#include "common/map.h"

DP_TEST(str_map_basics)
{
    dp__map m;
    dp__map_init_str(&m);
    int a = 1, b = 2;
    void *old = (void *)1;
    CHECK(dp__map_get(&m, "x", 1) == NULL);
    CHECK_OK(dp__map_put(&m, "x", 1, &a, &old));
    CHECK(old == NULL);
    CHECK(dp__map_get(&m, "x", 1) == &a);
    CHECK_OK(dp__map_put(&m, "x", 1, &b, &old));
    CHECK(old == &a);
    CHECK_EQ(dp__map_len(&m), 1);
    /* Keys are bytes with a length: "x" and "x\0" differ, embedded NULs work. */
    CHECK_OK(dp__map_put(&m, "x\0y", 3, &a, NULL));
    CHECK(dp__map_get(&m, "x\0y", 3) == &a);
    CHECK(dp__map_get(&m, "x", 1) == &b);
    CHECK_OK(dp__map_put(&m, "", 0, &a, NULL));
    CHECK(dp__map_get(&m, "", 0) == &a);
    CHECK(dp__map_del(&m, "x", 1) == &b);
    CHECK(dp__map_del(&m, "x", 1) == NULL);
    CHECK_EQ(dp__map_len(&m), 2);
    dp__map_fini(&m);
}

DP_TEST(u64_map_matches_model)
{
    uint64_t seed = dp_test_seed();
    uint64_t st = seed;
    enum { K = 2048 };
    static void *model[K];
    memset(model, 0, sizeof model);
    dp__map m;
    dp__map_init_u64(&m);
    size_t live = 0;
    for (int step = 0; step < 200000; step++) {
        uint64_t r = dp_test_rand(&st);
        /* Keys cluster (k * 1024 collide modulo small capacities). */
        uint64_t k = (r >> 8) % K;
        uint64_t key = k * 1024;
        if ((r & 3) != 0) {
            void *v = (void *)(uintptr_t)(r | 1);
            void *old;
            CHECK_OK(dp__map_put_u64(&m, key, v, &old));
            CHECK(old == model[k]);
            if (model[k] == NULL)
                live++;
            model[k] = v;
        } else {
            CHECK(dp__map_del_u64(&m, key) == model[k]);
            if (model[k] != NULL)
                live--;
            model[k] = NULL;
        }
        CHECK_EQ(dp__map_len(&m), live);
        if (step % 997 == 0)
            for (size_t i = 0; i < K; i++)
                CHECKF(dp__map_get_u64(&m, i * 1024) == model[i], "key %zu step %d", i,
                       step);
    }
    size_t n = 0;
    uint64_t uk;
    void *v;
    for (size_t it = 0; dp__map_next(&m, &it, NULL, NULL, &uk, &v);) {
        CHECK(model[uk / 1024] == v);
        n++;
    }
    CHECK_EQ(n, live);
    dp__map_fini(&m);
}

DP_TEST(str_map_matches_model)
{
    uint64_t st = dp_test_seed() ^ 0x55;
    enum { K = 1000 };
    static void *model[K];
    memset(model, 0, sizeof model);
    dp__map m;
    dp__map_init_str(&m);
    char key[32];
    for (int step = 0; step < 100000; step++) {
        uint64_t r = dp_test_rand(&st);
        size_t k = (r >> 8) % K;
        int kl = snprintf(key, sizeof key, "blob-%zu", k);
        if ((r & 3) != 0) {
            void *v = (void *)(uintptr_t)(r | 1);
            CHECK_OK(dp__map_put(&m, key, (size_t)kl, v, NULL));
            model[k] = v;
        } else {
            CHECK(dp__map_del(&m, key, (size_t)kl) == model[k]);
            model[k] = NULL;
        }
    }
    for (size_t k = 0; k < K; k++) {
        int kl = snprintf(key, sizeof key, "blob-%zu", k);
        CHECK(dp__map_get(&m, key, (size_t)kl) == model[k]);
    }
    dp__map_fini(&m);
}
