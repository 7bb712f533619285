/*
 * Sets of disjoint address ranges (ranges.h): a sorted array and binary
 * searches over it. Because the ranges are disjoint, their ends are sorted
 * as their bases are, so either can be searched.
 */
#include "common/ranges.h"

#include <stdlib.h>
#include <string.h>

#include "common/common.h"

/* addr + n, or UINT64_MAX when that wraps. */
static uint64_t
end_of(uint64_t addr, uint64_t n)
{
    return addr + n < addr ? UINT64_MAX : addr + n;
}

/* Index of the first range whose base is above addr (n if none). */
static size_t
upper_base(const dp__ranges *rs, uint64_t addr)
{
    size_t a = 0, b = rs->n;
    while (a < b) {
        size_t m = a + (b - a) / 2;
        if (rs->e[m].base <= addr)
            a = m + 1;
        else
            b = m;
    }
    return a;
}

/* Index of the first range whose end is at or above addr (n if none). */
static size_t
lower_end(const dp__ranges *rs, uint64_t addr)
{
    size_t a = 0, b = rs->n;
    while (a < b) {
        size_t m = a + (b - a) / 2;
        if (rs->e[m].base + rs->e[m].len < addr)
            a = m + 1;
        else
            b = m;
    }
    return a;
}

void
dp__ranges_fini(dp__ranges *rs)
{
    free(rs->e);
    memset(rs, 0, sizeof *rs);
}

int
dp__ranges_reserve(dp__ranges *rs, size_t extra)
{
    if (rs->cap - rs->n >= extra)
        return DP_OK;
    size_t cap = rs->cap ? rs->cap : 8;
    while (cap - rs->n < extra) {
        if (cap > SIZE_MAX / 2 / sizeof *rs->e)
            return DP_ENOMEM;
        cap *= 2;
    }
    dp__ranges_ent *e = realloc(rs->e, cap * sizeof *e);
    if (e == NULL)
        return DP_ENOMEM;
    rs->e = e;
    rs->cap = cap;
    return DP_OK;
}

int
dp__ranges_add(dp__ranges *rs, uint64_t base, uint64_t len, void *v)
{
    if (len == 0 || base + len < base)
        return DP_EINVAL;
    size_t i = upper_base(rs, base); /* e[i - 1] is the last range starting at or below */
    if (i > 0 && rs->e[i - 1].base + rs->e[i - 1].len > base)
        return DP_EEXIST;
    if (i < rs->n && rs->e[i].base < base + len)
        return DP_EEXIST;
    if (dp__ranges_reserve(rs, 1) != DP_OK)
        return DP_ENOMEM;
    memmove(rs->e + i + 1, rs->e + i, (rs->n - i) * sizeof *rs->e);
    rs->e[i] = (dp__ranges_ent){base, len, v};
    rs->n++;
    return DP_OK;
}

int
dp__ranges_merge(dp__ranges *rs, uint64_t base, uint64_t len)
{
    if (len == 0)
        return DP_OK;
    uint64_t lo = base, hi = end_of(base, len);
    /* Ranges [first, last) overlap or touch [lo, hi): ends >= lo, bases <= hi. */
    size_t first = lower_end(rs, lo), last = first;
    while (last < rs->n && rs->e[last].base <= hi) {
        lo = DP_MIN(lo, rs->e[last].base);
        hi = DP_MAX(hi, rs->e[last].base + rs->e[last].len);
        last++;
    }
    if (first == last) {
        if (dp__ranges_reserve(rs, 1) != DP_OK)
            return DP_ENOMEM;
        memmove(rs->e + first + 1, rs->e + first, (rs->n - first) * sizeof *rs->e);
        rs->n++;
    } else if (last - first > 1) {
        memmove(rs->e + first + 1, rs->e + last, (rs->n - last) * sizeof *rs->e);
        rs->n -= last - first - 1;
    }
    rs->e[first] = (dp__ranges_ent){lo, hi - lo, NULL};
    return DP_OK;
}

dp__ranges_ent *
dp__ranges_at(const dp__ranges *rs, uint64_t base)
{
    size_t i = upper_base(rs, base);
    return i > 0 && rs->e[i - 1].base == base ? &rs->e[i - 1] : NULL;
}

void
dp__ranges_remove(dp__ranges *rs, dp__ranges_ent *e)
{
    size_t i = (size_t)(e - rs->e);
    DP_ASSERT(i < rs->n);
    memmove(rs->e + i, rs->e + i + 1, (rs->n - i - 1) * sizeof *rs->e);
    rs->n--;
}

dp__ranges_ent *
dp__ranges_find(const dp__ranges *rs, uint64_t addr, uint64_t n)
{
    size_t i = upper_base(rs, addr);
    if (i == 0)
        return NULL;
    dp__ranges_ent *e = &rs->e[i - 1];
    if (addr - e->base <= e->len && n <= e->len - (addr - e->base))
        return e;
    return NULL;
}

dp__ranges_ent *
dp__ranges_overlap(const dp__ranges *rs, uint64_t addr, uint64_t n)
{
    if (n == 0)
        return NULL;
    /* The first range ending after addr overlaps iff it starts before the end. */
    size_t i = lower_end(rs, addr);
    if (i < rs->n && rs->e[i].base + rs->e[i].len == addr)
        i++;
    return i < rs->n && rs->e[i].base < end_of(addr, n) ? &rs->e[i] : NULL;
}
