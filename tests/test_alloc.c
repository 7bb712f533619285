/*
 * Tests for src/alloc: the slab allocator. Unit cases for each rule (alignment,
 * best fit, coalescing, misuse, quarantine, stats), then long random sequences
 * checked step by step against a simple model (one owner slot per granule),
 * then a run at 10^5 live blocks. Random tests print their seed; set
 * DP_TEST_SEED to replay one.
 */
#include "dp_test.h"

#include <math.h>

#include "alloc/slab_alloc.h"
#include "common/common.h"

/* ---- helpers ---- */

static dp__slab_alloc *
mk(uint64_t area, uint64_t align)
{
    dp__slab_alloc *a = NULL;
    dp_detail d;
    CHECK_OK_D(dp__slab_alloc_create(area, align, &a, &d), &d);
    CHECK(a != NULL);
    return a;
}

static uint64_t
al(dp__slab_alloc *a, uint64_t n)
{
    uint64_t off = UINT64_MAX;
    dp_detail d;
    CHECK_OK_D(dp__slab_alloc_alloc(a, n, &off, &d), &d);
    return off;
}

static void
fr(dp__slab_alloc *a, uint64_t off)
{
    dp_detail d;
    CHECK_OK_D(dp__slab_alloc_free(a, off, &d), &d);
}

static void
ok_check(dp__slab_alloc *a)
{
    dp_detail d;
    CHECK_OK_D(dp__slab_alloc_check(a, &d), &d);
}

static dp__slab_alloc_stats
stats(dp__slab_alloc *a)
{
    dp__slab_alloc_stats st;
    dp__slab_alloc_get_stats(a, &st);
    CHECK_EQ_U64(st.allocated_bytes + st.free_bytes + st.quarantined_bytes,
                 st.usable_bytes);
    return st;
}

/* ---- unit cases ---- */

DP_TEST(create_rejects_bad_arguments)
{
    dp__slab_alloc *a = (dp__slab_alloc *)1;
    dp_detail d;
    CHECK_ERR_D(dp__slab_alloc_create(1 << 20, 48, &a, &d), DP_EINVAL, &d);
    CHECK(a == NULL);
    CHECK_CONTAINS(d.msg, "power of two");
    CHECK_ERR(dp__slab_alloc_create(0, 0, &a, &d), DP_EINVAL);
    CHECK_ERR(dp__slab_alloc_create(63, 64, &a, &d), DP_EINVAL);
    CHECK_ERR(dp__slab_alloc_create(4095, 4096, &a, &d), DP_EINVAL);
    CHECK_ERR(dp__slab_alloc_create(1 << 20, 0, NULL, &d), DP_EINVAL);
    CHECK_ERR(dp__slab_alloc_create(1 << 20, 3, &a, NULL), DP_EINVAL);
    dp__slab_alloc_destroy(NULL);
    /* The largest granule that fits and align 1 are fine. */
    a = mk(64, 64);
    CHECK_EQ_U64(al(a, 64), 0);
    dp__slab_alloc_destroy(a);
    a = mk(7, 1);
    CHECK_EQ_U64(al(a, 7), 0);
    dp__slab_alloc_destroy(a);
}

DP_TEST(alignment_rounds_sizes_and_offsets)
{
    dp__slab_alloc *a = mk(1 << 20, 0); /* 0 = 64 */
    dp__slab_alloc_stats st = stats(a);
    CHECK_EQ_U64(st.align, 64);
    uint64_t o1 = al(a, 1), o2 = al(a, 65), o3 = al(a, 64), n = 0;
    CHECK_EQ_U64(o1, 0);
    CHECK_EQ_U64(o2, 64);
    CHECK_EQ_U64(o3, 192);
    CHECK_OK(dp__slab_alloc_size_of(a, o1, &n));
    CHECK_EQ_U64(n, 64);
    CHECK_OK(dp__slab_alloc_size_of(a, o2, &n));
    CHECK_EQ_U64(n, 128);
    CHECK_EQ_U64(stats(a).allocated_bytes, 256);
    dp__slab_alloc_destroy(a);

    a = mk(1 << 20, 4096);
    CHECK_EQ_U64(al(a, 10), 0);
    CHECK_EQ_U64(al(a, 4097), 4096);
    CHECK_EQ_U64(al(a, 1), 3 * 4096);
    CHECK_OK(dp__slab_alloc_size_of(a, 4096, &n));
    CHECK_EQ_U64(n, 8192);
    ok_check(a);
    dp__slab_alloc_destroy(a);
}

DP_TEST(exact_fit_and_full_area)
{
    dp__slab_alloc *a = mk(4 * 64, 64);
    uint64_t off[4];
    for (int i = 0; i < 4; i++)
        off[i] = al(a, 64);
    dp__slab_alloc_stats st = stats(a);
    CHECK_EQ_U64(st.free_bytes, 0);
    CHECK_EQ_U64(st.n_free, 0);
    CHECK_EQ_U64(st.largest_free, 0);
    CHECK(st.fragmentation == 0.0);
    uint64_t o = 7;
    dp_detail d;
    CHECK_ERR_D(dp__slab_alloc_alloc(a, 1, &o, &d), DP_EUNITFULL, &d);
    CHECK_EQ_U64(o, 7);
    CHECK_CONTAINS(d.msg, "asked 1");
    CHECK_CONTAINS(d.msg, "largest free block 0");
    fr(a, off[2]);
    CHECK_EQ_U64(al(a, 64), off[2]);
    fr(a, off[0]);
    fr(a, off[1]);
    CHECK_ERR_D(dp__slab_alloc_alloc(a, 129, &o, &d), DP_EUNITFULL, &d);
    CHECK_CONTAINS(d.msg, "no free block of 192 bytes (asked 129)");
    CHECK_CONTAINS(d.msg, "largest free block 128");
    CHECK_EQ_U64(al(a, 128), 0);
    ok_check(a);
    dp__slab_alloc_destroy(a);

    /* One block covering the whole area. */
    a = mk(1 << 20, 64);
    CHECK_EQ_U64(al(a, 1 << 20), 0);
    CHECK_EQ_U64(stats(a).n_free, 0);
    fr(a, 0);
    st = stats(a);
    CHECK_EQ_U64(st.n_free, 1);
    CHECK_EQ_U64(st.largest_free, 1 << 20);
    dp__slab_alloc_destroy(a);
}

DP_TEST(zero_and_oversized_requests)
{
    dp__slab_alloc *a = mk(1 << 16, 64);
    uint64_t o = 5;
    dp_detail d;
    CHECK_ERR_D(dp__slab_alloc_alloc(a, 0, &o, &d), DP_EINVAL, &d);
    CHECK_CONTAINS(d.msg, "zero");
    CHECK_ERR_D(dp__slab_alloc_alloc(a, (1 << 16) + 1, &o, &d), DP_ETOOBIG, &d);
    CHECK_CONTAINS(d.msg, "65537");
    CHECK_ERR(dp__slab_alloc_alloc(a, UINT64_MAX, &o, &d), DP_ETOOBIG);
    CHECK_ERR(dp__slab_alloc_alloc(a, UINT64_MAX - 62, &o, &d), DP_ETOOBIG);
    CHECK_ERR(dp__slab_alloc_alloc(a, 64, NULL, &d), DP_EINVAL);
    CHECK_ERR(dp__slab_alloc_alloc(NULL, 64, &o, &d), DP_EINVAL);
    CHECK_EQ_U64(o, 5);
    CHECK_EQ_U64(stats(a).free_bytes, 1 << 16);
    ok_check(a);
    dp__slab_alloc_destroy(a);
}

DP_TEST(area_not_a_multiple_of_align)
{
    dp__slab_alloc *a = mk(1000, 64);
    dp__slab_alloc_stats st = stats(a);
    CHECK_EQ_U64(st.area_bytes, 1000);
    CHECK_EQ_U64(st.usable_bytes, 960);
    CHECK_EQ_U64(st.free_bytes, 960);
    uint64_t o;
    CHECK_ERR(dp__slab_alloc_alloc(a, 961, &o, NULL), DP_ETOOBIG);
    CHECK_EQ_U64(al(a, 900), 0); /* rounds to 960: the whole usable area */
    CHECK_ERR(dp__slab_alloc_alloc(a, 1, &o, NULL), DP_EUNITFULL);
    fr(a, 0);
    CHECK_EQ_U64(al(a, 960), 0);
    ok_check(a);
    dp__slab_alloc_destroy(a);
}

/* Lay out blocks of the given sizes (in 64-byte units) back to back. */
static void
layout(dp__slab_alloc *a, const uint64_t *units, int n, uint64_t *offs)
{
    uint64_t expect = 0;
    for (int i = 0; i < n; i++) {
        offs[i] = al(a, units[i] * 64);
        CHECK_EQ_U64(offs[i], expect);
        expect += units[i] * 64;
    }
}

DP_TEST(best_fit_picks_smallest_then_lowest)
{
    /* Holes (free) of 3, 1, 2, 5, 2 units separated by one-unit blocks, then
     * the rest of the area. */
    dp__slab_alloc *a = mk(64 * 64, 64);
    uint64_t units[] = {3, 1, 1, 1, 2, 1, 5, 1, 2, 1};
    uint64_t offs[10];
    layout(a, units, 10, offs);
    fr(a, offs[0]);
    fr(a, offs[2]);
    fr(a, offs[4]);
    fr(a, offs[6]);
    fr(a, offs[8]);
    dp__slab_alloc_stats st = stats(a);
    CHECK_EQ_U64(st.n_free, 6);
    CHECK_EQ_U64(st.largest_free, (64 - 18) * 64);
    /* 2 units: two 2-unit holes; the lower one wins. */
    CHECK_EQ_U64(al(a, 128), offs[4]);
    CHECK_EQ_U64(al(a, 128), offs[8]);
    /* 1 unit: the 1-unit hole, not the front of the 3-unit one. */
    CHECK_EQ_U64(al(a, 1), offs[2]);
    /* 4 units: only the 5-unit hole (and the tail) fit: the 5 wins. */
    CHECK_EQ_U64(al(a, 4 * 64), offs[6]);
    /* 1 unit: the 1-unit remainder of the 5 (higher offset) beats the 3. */
    CHECK_EQ_U64(al(a, 64), offs[6] + 4 * 64);
    /* 2 units: the 3 now. */
    CHECK_EQ_U64(al(a, 65), offs[0]);
    CHECK_EQ_U64(al(a, 64), offs[0] + 128);
    /* Nothing left but the tail. */
    CHECK_EQ_U64(stats(a).n_free, 1);
    CHECK_EQ_U64(al(a, 64), 18 * 64);
    ok_check(a);
    dp__slab_alloc_destroy(a);
}

DP_TEST(coalescing_left_right_both_none)
{
    dp__slab_alloc *a = mk(16 * 64, 64);
    uint64_t units[] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
    uint64_t o[16];
    layout(a, units, 16, o);
    /* none: isolated frees. */
    fr(a, o[1]);
    fr(a, o[5]);
    fr(a, o[9]);
    dp__slab_alloc_stats st = stats(a);
    CHECK_EQ_U64(st.n_free, 3);
    CHECK_EQ_U64(st.largest_free, 64);
    /* left: o[2] joins o[1]. */
    fr(a, o[2]);
    st = stats(a);
    CHECK_EQ_U64(st.n_free, 3);
    CHECK_EQ_U64(st.largest_free, 128);
    /* right: o[4] joins o[5]. */
    fr(a, o[4]);
    st = stats(a);
    CHECK_EQ_U64(st.n_free, 3);
    CHECK_EQ_U64(st.largest_free, 128);
    /* both: o[3] joins [1,2] and [4,5] into one of 5 units. */
    fr(a, o[3]);
    st = stats(a);
    CHECK_EQ_U64(st.n_free, 2);
    CHECK_EQ_U64(st.largest_free, 5 * 64);
    CHECK_EQ_U64(al(a, 5 * 64), o[1]);
    /* Edges of the area: first and last blocks merge with their one neighbour. */
    fr(a, o[0]);
    fr(a, o[15]);
    fr(a, o[14]);
    st = stats(a);
    CHECK_EQ_U64(st.n_free, 3);
    CHECK_EQ_U64(st.largest_free, 128);
    ok_check(a);
    /* Everything back: one free block. */
    fr(a, o[1]);
    for (int i = 6; i < 14; i++)
        if (i != 9)
            fr(a, o[i]);
    st = stats(a);
    CHECK_EQ_U64(st.n_free, 1);
    CHECK_EQ_U64(st.largest_free, 16 * 64);
    CHECK_EQ_U64(st.n_allocated, 0);
    ok_check(a);
    dp__slab_alloc_destroy(a);
}

DP_TEST(double_free_and_unknown_offsets_are_refused)
{
    dp__slab_alloc *a = mk(1 << 16, 64);
    uint64_t x = al(a, 256), y = al(a, 64);
    dp_detail d;
    fr(a, x);
    dp__slab_alloc_stats before = stats(a);
    CHECK_ERR_D(dp__slab_alloc_free(a, x, &d), DP_EINVAL, &d);
    CHECK_CONTAINS(d.msg, "double free");
    CHECK_ERR_D(dp__slab_alloc_free(a, y + 64, &d), DP_EINVAL, &d); /* never handed out */
    CHECK_CONTAINS(d.msg, "no allocated block");
    CHECK_ERR_D(dp__slab_alloc_free(a, 1 << 16, &d), DP_EINVAL, &d);
    CHECK_CONTAINS(d.msg, "outside");
    CHECK_ERR(dp__slab_alloc_free(a, UINT64_MAX, &d), DP_EINVAL);
    uint64_t z = al(a, 256);
    CHECK_EQ_U64(z, x);
    CHECK_ERR_D(dp__slab_alloc_free(a, z + 64, &d), DP_EINVAL, &d); /* inner */
    CHECK_CONTAINS(d.msg, "inside the allocated block [0, 256)");
    CHECK_ERR_D(dp__slab_alloc_free(a, z + 1, &d), DP_EINVAL, &d); /* unaligned */
    CHECK_ERR(dp__slab_alloc_free(NULL, 0, &d), DP_EINVAL);
    uint64_t n;
    CHECK_ERR(dp__slab_alloc_size_of(a, z + 64, &n), DP_ENOTFOUND);
    CHECK_ERR(dp__slab_alloc_size_of(a, 4096, &n), DP_ENOTFOUND);
    fr(a, z);
    dp__slab_alloc_stats after = stats(a);
    CHECK_EQ_U64(after.free_bytes, before.free_bytes);
    CHECK_EQ_U64(after.n_free, before.n_free);
    CHECK_EQ_U64(after.n_allocated, 1);
    fr(a, y);
    ok_check(a);
    CHECK_EQ_U64(stats(a).n_free, 1);
    dp__slab_alloc_destroy(a);
}

DP_TEST(quarantine_releases_in_time_order)
{
    dp__slab_alloc *a = mk(8 * 64, 64);
    uint64_t units[] = {1, 1, 1, 1, 1, 1, 1, 1};
    uint64_t o[8];
    layout(a, units, 8, o);
    dp_detail d;
    CHECK_OK_D(dp__slab_alloc_free_at(a, o[2], 2.0, &d), &d);
    CHECK_OK_D(dp__slab_alloc_free_at(a, o[5], 1.0, &d), &d);
    CHECK_OK_D(dp__slab_alloc_free_at(a, o[3], 3.0, &d), &d);
    dp__slab_alloc_stats st = stats(a);
    CHECK_EQ_U64(st.quarantined_bytes, 192);
    CHECK_EQ_U64(st.n_quarantined, 3);
    CHECK_EQ_U64(st.n_allocated, 5);
    CHECK_EQ_U64(st.free_bytes, 0);
    CHECK(st.next_release == 1.0);

    /* Quarantined: not allocatable, not freeable, not re-quarantinable. */
    uint64_t x, n;
    CHECK_ERR_D(dp__slab_alloc_alloc(a, 64, &x, &d), DP_EUNITFULL, &d);
    CHECK_CONTAINS(d.msg, "192 quarantined");
    CHECK_ERR_D(dp__slab_alloc_free(a, o[2], &d), DP_EINVAL, &d);
    CHECK_CONTAINS(d.msg, "quarantined");
    CHECK_ERR(dp__slab_alloc_free_at(a, o[2], 0.0, &d), DP_EINVAL);
    CHECK_ERR(dp__slab_alloc_size_of(a, o[2], &n), DP_ENOTFOUND);
    CHECK_ERR(dp__slab_alloc_free_at(a, o[0], NAN, &d), DP_EINVAL);
    CHECK_ERR(dp__slab_alloc_free_at(a, o[0] + 64 * 8, 1.0, &d), DP_EINVAL);
    ok_check(a);

    CHECK_EQ_U64(dp__slab_alloc_sweep(a, 0.5), 0);
    CHECK_EQ_U64(dp__slab_alloc_sweep(a, NAN), 0);
    CHECK_EQ_U64(dp__slab_alloc_sweep(a, 1.0), 64); /* now == t releases */
    CHECK_EQ_U64(al(a, 64), o[5]);
    CHECK_EQ_U64(dp__slab_alloc_sweep(a, 1.5), 0);
    CHECK_EQ_U64(dp__slab_alloc_sweep(a, 2.5), 64);
    st = stats(a);
    CHECK(st.next_release == 3.0);
    CHECK_EQ_U64(st.n_free, 1);
    /* o[3] released next to the free o[2]: they merge. */
    CHECK_EQ_U64(dp__slab_alloc_sweep(a, 100.0), 64);
    st = stats(a);
    CHECK_EQ_U64(st.n_free, 1);
    CHECK_EQ_U64(st.largest_free, 128);
    CHECK_EQ_U64(st.quarantined_bytes, 0);
    CHECK(isinf(st.next_release));
    CHECK_EQ_U64(al(a, 128), o[2]);
    ok_check(a);
    dp__slab_alloc_destroy(a);
}

static int
collect_free(void *arg, uint64_t off, uint64_t size, int state)
{
    uint64_t *v = arg;
    if (state == DP_SLAB_FREE) {
        v[1 + 2 * v[0]] = off;
        v[2 + 2 * v[0]] = size;
        v[0]++;
    }
    return 0;
}

DP_TEST(quarantine_equal_times_and_past_times)
{
    /* Equal times release together; a time already past still waits for sweep;
     * INFINITY never comes. */
    dp__slab_alloc *a = mk(8 * 64, 64);
    uint64_t units[] = {1, 1, 1, 1, 1, 1, 1, 1};
    uint64_t o[8];
    layout(a, units, 8, o);
    CHECK_OK(dp__slab_alloc_free_at(a, o[6], 5.0, NULL));
    CHECK_OK(dp__slab_alloc_free_at(a, o[1], 5.0, NULL));
    CHECK_OK(dp__slab_alloc_free_at(a, o[4], -1.0, NULL));
    CHECK_OK(dp__slab_alloc_free_at(a, o[7], INFINITY, NULL));
    CHECK_EQ_U64(stats(a).free_bytes, 0);
    CHECK_EQ_U64(dp__slab_alloc_sweep(a, -1.0), 64);
    CHECK_EQ_U64(dp__slab_alloc_sweep(a, 4.999), 0);
    CHECK_EQ_U64(dp__slab_alloc_sweep(a, 5.0), 128);
    uint64_t v[1 + 2 * 8] = {0};
    CHECK_EQ(dp__slab_alloc_walk(a, collect_free, v), 0);
    CHECK_EQ_U64(v[0], 3);
    CHECK_EQ_U64(v[1], o[1]);
    CHECK_EQ_U64(v[3], o[4]);
    CHECK_EQ_U64(v[5], o[6]);
    CHECK_EQ_U64(dp__slab_alloc_sweep(a, 1e300), 0);
    CHECK_EQ_U64(stats(a).n_quarantined, 1);
    ok_check(a);
    dp__slab_alloc_destroy(a);
}

DP_TEST(stats_and_fragmentation)
{
    dp__slab_alloc *a = mk(10 * 64, 64);
    dp__slab_alloc_stats st = stats(a);
    CHECK_EQ_U64(st.n_free, 1);
    CHECK(st.fragmentation == 0.0);
    uint64_t units[] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
    uint64_t o[10];
    layout(a, units, 10, o);
    fr(a, o[0]);
    fr(a, o[2]);
    fr(a, o[3]);
    fr(a, o[5]);
    CHECK_OK(dp__slab_alloc_free_at(a, o[8], 9.0, NULL));
    st = stats(a);
    /* Each counter on its own: a wrong one does not hide the others. */
    EXPECT_EQ_U64(st.area_bytes, 640);
    EXPECT_EQ_U64(st.usable_bytes, 640);
    EXPECT_EQ_U64(st.free_bytes, 256);
    EXPECT_EQ_U64(st.allocated_bytes, 320);
    EXPECT_EQ_U64(st.quarantined_bytes, 64);
    EXPECT_EQ_U64(st.largest_free, 128);
    EXPECT_EQ_U64(st.n_free, 3);
    EXPECT_EQ_U64(st.n_allocated, 5);
    EXPECT_EQ_U64(st.n_quarantined, 1);
    EXPECT(fabs(st.fragmentation - 0.5) < 1e-12);
    EXPECT(st.next_release == 9.0);
    dp__slab_alloc_destroy(a);
}

/* ---- the model ---- */

/*
 * The model keeps, per granule of the usable area, the id of the block that
 * owns it (or -1 when free), and per block its offset, size, state and time,
 * all in granules. It finds best fit by scanning for maximal free runs.
 */
typedef struct mblk {
    uint64_t off, size; /* granules */
    int state;
    double t;
    uint32_t live_pos;
} mblk;

typedef struct model {
    uint64_t align, units;
    int32_t *own;
    mblk *blk;
    uint32_t *ids_free; /* unused ids, a stack */
    uint32_t n_ids_free;
    uint32_t *live; /* ids of allocated and quarantined blocks */
    uint32_t n_live;
    uint64_t alloc_units, quar_units, n_alloc, n_quar;
} model;

static void
model_init(model *m, uint64_t usable, uint64_t align)
{
    memset(m, 0, sizeof(*m));
    m->align = align;
    m->units = usable / align;
    m->own = malloc(m->units * sizeof(*m->own));
    m->blk = calloc(m->units, sizeof(*m->blk));
    m->ids_free = malloc(m->units * sizeof(*m->ids_free));
    m->live = malloc(m->units * sizeof(*m->live));
    CHECK(m->own && m->blk && m->ids_free && m->live);
    for (uint64_t i = 0; i < m->units; i++) {
        m->own[i] = -1;
        m->ids_free[i] = (uint32_t)(m->units - 1 - i);
    }
    m->n_ids_free = (uint32_t)m->units;
}

static void
model_fini(model *m)
{
    free(m->own);
    free(m->blk);
    free(m->ids_free);
    free(m->live);
}

/* Best fit in granules: start of the smallest, lowest maximal free run >= n. */
static bool
model_best_fit(const model *m, uint64_t n, uint64_t *start, uint64_t *largest)
{
    bool found = false;
    uint64_t best_len = 0;
    *largest = 0;
    for (uint64_t i = 0; i < m->units;) {
        if (m->own[i] != -1) {
            i++;
            continue;
        }
        uint64_t j = i;
        while (j < m->units && m->own[j] == -1)
            j++;
        uint64_t len = j - i;
        if (len > *largest)
            *largest = len;
        if (len >= n && (!found || len < best_len)) {
            found = true;
            best_len = len;
            *start = i;
        }
        i = j;
    }
    return found;
}

static void
model_take(model *m, uint64_t start, uint64_t n)
{
    uint32_t id = m->ids_free[--m->n_ids_free];
    mblk *b = &m->blk[id];
    b->off = start;
    b->size = n;
    b->state = DP_SLAB_ALLOCATED;
    b->live_pos = m->n_live;
    m->live[m->n_live++] = id;
    for (uint64_t i = start; i < start + n; i++)
        m->own[i] = (int32_t)id;
    m->alloc_units += n;
    m->n_alloc++;
}

static void
model_release(model *m, uint32_t id)
{
    mblk *b = &m->blk[id];
    for (uint64_t i = b->off; i < b->off + b->size; i++)
        m->own[i] = -1;
    if (b->state == DP_SLAB_ALLOCATED) {
        m->alloc_units -= b->size;
        m->n_alloc--;
    } else {
        m->quar_units -= b->size;
        m->n_quar--;
    }
    uint32_t last = m->live[--m->n_live];
    m->live[b->live_pos] = last;
    m->blk[last].live_pos = b->live_pos;
    b->state = -1;
    m->ids_free[m->n_ids_free++] = id;
}

typedef struct walk_ctx {
    const model *m;
    uint64_t end, n_used, n_free, free_units, largest;
    int prev_state;
    char err[200];
} walk_ctx;

static int
walk_cmp(void *arg, uint64_t off, uint64_t size, int state)
{
    walk_ctx *c = arg;
    const model *m = c->m;
    if (off != c->end || size == 0 || off % m->align || size % m->align) {
        snprintf(c->err, sizeof c->err,
                 "block [%" PRIu64 ", +%" PRIu64 ") after %" PRIu64, off, size, c->end);
        return 1;
    }
    uint64_t u = off / m->align, n = size / m->align;
    c->end = off + size;
    if (u + n > m->units) {
        snprintf(c->err, sizeof c->err, "block at %" PRIu64 " runs past the area", off);
        return 1;
    }
    if (state == DP_SLAB_FREE) {
        if (c->prev_state == DP_SLAB_FREE) {
            snprintf(c->err, sizeof c->err, "adjacent free blocks at %" PRIu64, off);
            return 1;
        }
        for (uint64_t i = u; i < u + n; i++)
            if (m->own[i] != -1) {
                snprintf(c->err, sizeof c->err,
                         "free block at %" PRIu64 " covers model block %d", off,
                         m->own[i]);
                return 1;
            }
        c->n_free++;
        c->free_units += n;
        if (n > c->largest)
            c->largest = n;
    } else {
        int32_t id = m->own[u];
        if (id < 0 || m->blk[id].off != u || m->blk[id].size != n ||
            m->blk[id].state != state) {
            snprintf(c->err, sizeof c->err,
                     "block [%" PRIu64 ", +%" PRIu64 ") state %d: model has id %d", off,
                     size, state, id);
            return 1;
        }
        c->n_used++;
    }
    c->prev_state = state;
    return 0;
}

/* Compare the allocator with the model in full. */
static void
verify(dp__slab_alloc *a, const model *m)
{
    walk_ctx c = {.m = m, .prev_state = -1};
    int rc = dp__slab_alloc_walk(a, walk_cmp, &c);
    CHECKF(rc == 0, "%s", c.err);
    CHECK_EQ_U64(c.end, m->units * m->align);
    CHECK_EQ_U64(c.n_used, m->n_live);
    /* The model's free granules are exactly what the free blocks cover. */
    CHECK_EQ_U64(c.free_units + m->alloc_units + m->quar_units, m->units);
    dp__slab_alloc_stats st = stats(a);
    CHECK_EQ_U64(st.allocated_bytes, m->alloc_units * m->align);
    CHECK_EQ_U64(st.quarantined_bytes, m->quar_units * m->align);
    CHECK_EQ_U64(st.free_bytes, c.free_units * m->align);
    CHECK_EQ_U64(st.largest_free, c.largest * m->align);
    CHECK_EQ_U64(st.n_free, c.n_free);
    CHECK_EQ_U64(st.n_allocated, m->n_alloc);
    CHECK_EQ_U64(st.n_quarantined, m->n_quar);
    ok_check(a);
}

static uint64_t
rnd(uint64_t *s, uint64_t n)
{
    return n == 0 ? 0 : dp_test_rand(s) % n;
}

/* A request size in bytes: mostly small, sometimes large, never a round number. */
static uint64_t
rand_size(uint64_t *s, const model *m)
{
    uint64_t r = rnd(s, 100), units;
    if (r < 70)
        units = 1 + rnd(s, 4);
    else if (r < 95)
        units = 1 + rnd(s, 32);
    else
        units = 1 + rnd(s, m->units / 2);
    return (units - 1) * m->align + 1 + rnd(s, m->align);
}

enum { ST_OK, ST_FULL, ST_REFUSED }; /* how a step_alloc ended */

static int
step_alloc(dp__slab_alloc *a, model *m, uint64_t nbytes)
{
    uint64_t off = UINT64_MAX, start = 0, largest = 0;
    dp_detail d;
    int rc = dp__slab_alloc_alloc(a, nbytes, &off, &d);
    if (nbytes == 0) {
        CHECK_ERR_D(rc, DP_EINVAL, &d);
        return ST_REFUSED;
    }
    if (nbytes > m->units * m->align) {
        CHECK_ERR_D(rc, DP_ETOOBIG, &d);
        return ST_REFUSED;
    }
    uint64_t n = (nbytes + m->align - 1) / m->align;
    if (!model_best_fit(m, n, &start, &largest)) {
        CHECK_ERR_D(rc, DP_EUNITFULL, &d);
        char want[64];
        snprintf(want, sizeof want, "largest free block %" PRIu64, largest * m->align);
        CHECK_CONTAINS(d.msg, want);
        CHECK_EQ_U64(off, UINT64_MAX);
        return ST_FULL;
    }
    CHECK_OK_D(rc, &d);
    CHECKF(off == start * m->align,
           "alloc(%" PRIu64 ") at %" PRIu64 ", best fit %" PRIu64, nbytes, off,
           start * m->align);
    model_take(m, start, n);
    uint64_t got = 0;
    CHECK_OK(dp__slab_alloc_size_of(a, off, &got));
    CHECK_EQ_U64(got, n * m->align);
    return ST_OK;
}

/* An offset that is not the start of an allocated block. */
static uint64_t
bad_offset(uint64_t *s, const model *m)
{
    for (;;) {
        uint64_t off;
        switch (rnd(s, 3)) {
        case 0:
            off = rnd(s, m->units * m->align + 3 * m->align);
            break;
        case 1:
            off = rnd(s, m->units) * m->align;
            break;
        default:
            off = m->units * m->align + rnd(s, 1000);
            break;
        }
        uint64_t u = off / m->align;
        if (off % m->align != 0 || u >= m->units)
            return off;
        int32_t id = m->own[u];
        if (id < 0 || m->blk[id].off != u || m->blk[id].state != DP_SLAB_ALLOCATED)
            return off;
    }
}

static void
random_run(uint64_t area, uint64_t align, int steps, uint64_t salt)
{
    uint64_t s = dp_test_seed() ^ salt;
    dp__slab_alloc *a = mk(area, align);
    dp__slab_alloc_stats st = stats(a);
    model m;
    model_init(&m, st.usable_bytes, st.align);
    double now = 0.0;
    dp_detail d;
    /*
     * What the run exercised, asserted at the end: allocations that fit, that
     * did not (full) and refused ones (0 bytes, too big); frees, frees refused
     * (quarantined), quarantines, sweeps that released blocks, bad offsets,
     * and requests at the largest free block that fit exactly.
     */
    struct {
        int alloc[3], frees, frees_refused, quarantines, sweeps_released, bad, exact;
    } ran = {{0}, 0, 0, 0, 0, 0, 0};
    for (int i = 0; i < steps; i++) {
        uint64_t r = rnd(&s, 100);
        /* Keep the area busy: allocate more when it is mostly free. */
        if (m.alloc_units + m.quar_units < m.units / 4 && r >= 45 && r < 70)
            r = 0;
        if (r < 45) {
            ran.alloc[step_alloc(a, &m, rand_size(&s, &m))]++;
        } else if (r < 65) {
            if (m.n_live > 0) {
                uint32_t id = m.live[rnd(&s, m.n_live)];
                uint64_t off = m.blk[id].off * m.align;
                if (m.blk[id].state == DP_SLAB_ALLOCATED) {
                    CHECK_OK_D(dp__slab_alloc_free(a, off, &d), &d);
                    model_release(&m, id);
                    ran.frees++;
                } else {
                    CHECK_ERR_D(dp__slab_alloc_free(a, off, &d), DP_EINVAL, &d);
                    ran.frees_refused++;
                }
            }
        } else if (r < 80) {
            if (m.n_live > 0) {
                uint32_t id = m.live[rnd(&s, m.n_live)];
                uint64_t off = m.blk[id].off * m.align;
                /* Whole seconds make equal times common. */
                double t = now + (rnd(&s, 2) ? (double)rnd(&s, 4)
                                             : (double)rnd(&s, 4000) / 1000.0);
                if (m.blk[id].state == DP_SLAB_ALLOCATED) {
                    CHECK_OK_D(dp__slab_alloc_free_at(a, off, t, &d), &d);
                    ran.quarantines++;
                    m.blk[id].state = DP_SLAB_QUARANTINED;
                    m.blk[id].t = t;
                    m.alloc_units -= m.blk[id].size;
                    m.n_alloc--;
                    m.quar_units += m.blk[id].size;
                    m.n_quar++;
                } else {
                    CHECK_ERR_D(dp__slab_alloc_free_at(a, off, t, &d), DP_EINVAL, &d);
                }
            }
        } else if (r < 90) {
            now += rnd(&s, 3) == 0 ? 0.0 : (double)rnd(&s, 1500) / 1000.0;
            uint64_t want = 0;
            for (uint32_t k = 0; k < m.n_live;) {
                uint32_t id = m.live[k];
                if (m.blk[id].state == DP_SLAB_QUARANTINED && m.blk[id].t <= now) {
                    want += m.blk[id].size * m.align;
                    model_release(&m, id); /* moves another id into slot k */
                } else {
                    k++;
                }
            }
            CHECK_EQ_U64(dp__slab_alloc_sweep(a, now), want);
            ran.sweeps_released += want > 0;
            dp__slab_alloc_get_stats(a, &st);
            CHECK(m.n_quar > 0 || isinf(st.next_release));
            CHECK(m.n_quar == 0 || st.next_release > now);
        } else if (r < 95) {
            uint64_t off = bad_offset(&s, &m);
            ran.bad++;
            if (rnd(&s, 2))
                CHECK_ERR_D(dp__slab_alloc_free(a, off, &d), DP_EINVAL, &d);
            else
                CHECK_ERR_D(dp__slab_alloc_free_at(a, off, now, &d), DP_EINVAL, &d);
            uint64_t n;
            CHECK_ERR(dp__slab_alloc_size_of(a, off, &n), DP_ENOTFOUND);
        } else if (r < 97) {
            ran.alloc[step_alloc(
                a, &m, rnd(&s, 2) ? 0 : m.units * m.align + 1 + rnd(&s, 100))]++;
        } else {
            /* A request near the largest free block: exact fits and just-misses. */
            uint64_t start = 0, largest = 0;
            model_best_fit(&m, m.units + 1, &start, &largest);
            uint64_t nb = largest * m.align + (rnd(&s, 2) ? 0 : 1);
            int how = step_alloc(a, &m, nb == 0 ? 1 : nb);
            ran.alloc[how]++;
            ran.exact += how == ST_OK && nb == largest * m.align;
        }
        verify(a, &m);
    }
    printf("  %d allocs, %d full, %d refused; %d frees, %d refused, %d quarantined, %d "
           "sweeps released blocks, %d bad offsets, %d exact fits of the largest block\n",
           ran.alloc[ST_OK], ran.alloc[ST_FULL], ran.alloc[ST_REFUSED], ran.frees,
           ran.frees_refused, ran.quarantines, ran.sweeps_released, ran.bad, ran.exact);
    /* Every kind of step ran, the area filled up (floors well below any seed seen). */
    int least = steps / 1000;
    EXPECT_GE(ran.alloc[ST_OK], 10 * least);
    EXPECT_GE(ran.alloc[ST_FULL], least);
    EXPECT_GE(ran.alloc[ST_REFUSED], least);
    EXPECT_GE(ran.frees, 5 * least);
    EXPECT_GE(ran.frees_refused, least);
    EXPECT_GE(ran.quarantines, 5 * least);
    EXPECT_GE(ran.sweeps_released, least);
    EXPECT_GE(ran.bad, least);
    EXPECT_GE(ran.exact, least);
    /* Drain: everything freed or swept leaves one free block. */
    dp__slab_alloc_sweep(a, INFINITY);
    while (m.n_live > 0) {
        uint32_t id = m.live[0];
        if (m.blk[id].state == DP_SLAB_ALLOCATED)
            CHECK_OK(dp__slab_alloc_free(a, m.blk[id].off * m.align, NULL));
        model_release(&m, id);
    }
    verify(a, &m);
    st = stats(a);
    CHECK_EQ_U64(st.n_free, 1);
    CHECK_EQ_U64(st.largest_free, st.usable_bytes);
    model_fini(&m);
    dp__slab_alloc_destroy(a);
}

DP_TEST(random_vs_model_align64)
{
    random_run(1024 * 64 + 17, 64, 30000, 0x1);
}

DP_TEST(random_vs_model_align1)
{
    random_run(3001, 1, 20000, 0x2);
}

DP_TEST(random_vs_model_align4096)
{
    random_run(257 * 4096, 4096, 15000, 0x3);
}

DP_TEST(random_vs_model_tiny_area)
{
    /* Eight granules: full, exact fits and refusals all the time. */
    random_run(8 * 64, 64, 20000, 0x4);
}

/* ---- scale ---- */

typedef struct big_ctx {
    uint64_t want;
    uint64_t best_off, best_size;
    bool found;
} big_ctx;

static int
walk_best(void *arg, uint64_t off, uint64_t size, int state)
{
    big_ctx *c = arg;
    if (state == DP_SLAB_FREE && size >= c->want && (!c->found || size < c->best_size)) {
        c->found = true;
        c->best_off = off;
        c->best_size = size;
    }
    return 0;
}

DP_TEST(hundred_thousand_live_blocks)
{
    enum { LIVE = 100000, CHURN = 200000 };
    uint64_t s = dp_test_seed() ^ 0x5;
    const uint64_t area = 128ull << 20;
    dp__slab_alloc *a = mk(area, 64);
    uint64_t *off = malloc(LIVE * sizeof(*off));
    uint64_t *size = malloc(LIVE * sizeof(*size));
    CHECK(off && size);
    uint64_t total = 0;
    for (int i = 0; i < LIVE; i++) {
        size[i] = (1 + rnd(&s, 16)) * 64 - rnd(&s, 64);
        off[i] = al(a, size[i]);
        size[i] = DP_ALIGN_UP(size[i], 64);
        total += size[i];
    }
    dp__slab_alloc_stats st = stats(a);
    CHECK_EQ_U64(st.n_allocated, LIVE);
    CHECK_EQ_U64(st.allocated_bytes, total);
    ok_check(a);

    /* Churn: free a random victim (now or through quarantine), allocate a new
     * random size. Best fit is checked against a walk from time to time. */
    double now = 0;
    uint64_t full = 0, fits_checked = 0;
    dp_detail d;
    for (int i = 0; i < CHURN; i++) {
        int v = (int)rnd(&s, LIVE);
        if (off[v] != UINT64_MAX) {
            if (rnd(&s, 8) == 0) {
                CHECK_OK_D(dp__slab_alloc_free_at(a, off[v], now + 1.0, &d), &d);
            } else {
                CHECK_OK_D(dp__slab_alloc_free(a, off[v], &d), &d);
            }
            total -= size[v];
        }
        if ((i & 1023) == 0)
            now += 0.5;
        dp__slab_alloc_sweep(a, now);
        uint64_t nb = (1 + rnd(&s, rnd(&s, 10) == 0 ? 256 : 16)) * 64;
        big_ctx c = {.want = nb};
        if (i % 20000 == 0)
            dp__slab_alloc_walk(a, walk_best, &c);
        int rc = dp__slab_alloc_alloc(a, nb, &off[v], &d);
        if (rc == DP_EUNITFULL) {
            off[v] = UINT64_MAX;
            full++;
            continue;
        }
        CHECK_OK_D(rc, &d);
        if (i % 20000 == 0) {
            CHECK(c.found);
            CHECK_EQ_U64(off[v], c.best_off);
            fits_checked++;
        }
        size[v] = nb;
        total += nb;
    }
    st = stats(a);
    CHECK_EQ_U64(full, 0);
    CHECK_EQ_U64(fits_checked, CHURN / 20000); /* best fit checked against a walk */
    CHECK_EQ_U64(st.allocated_bytes, total);
    ok_check(a);
    uint64_t n, live = 0;
    for (int i = 0; i < LIVE; i++) {
        if (off[i] == UINT64_MAX)
            continue;
        live++;
        CHECK_OK(dp__slab_alloc_size_of(a, off[i], &n));
        CHECK_EQ_U64(n, size[i]);
    }
    CHECK_EQ_U64(st.n_allocated, live);
    CHECK_EQ_U64(live, LIVE);
    /* Free all in random order: back to one block. */
    for (int i = LIVE - 1; i > 0; i--) {
        int j = (int)rnd(&s, (uint64_t)i + 1);
        uint64_t t = off[i];
        off[i] = off[j];
        off[j] = t;
    }
    for (int i = 0; i < LIVE; i++)
        if (off[i] != UINT64_MAX)
            fr(a, off[i]);
    dp__slab_alloc_sweep(a, INFINITY);
    st = stats(a);
    CHECK_EQ_U64(st.n_free, 1);
    CHECK_EQ_U64(st.free_bytes, area);
    CHECK_EQ_U64(st.n_allocated + st.n_quarantined, 0);
    ok_check(a);
    free(off);
    free(size);
    dp__slab_alloc_destroy(a);
}
