/*
 * The slab allocator (see slab_alloc.h): best fit with immediate coalescing
 * over an abstract area, plus a time-keyed quarantine, in O(log n) per call.
 *
 * Design notes
 *
 * Blocks. Every byte of the usable area belongs to exactly one block, free,
 * allocated or quarantined. Blocks are kept in one doubly linked list in
 * address order (a->blocks), so the neighbours a free has to merge with are
 * found in O(1). Invariants, checked by dp__slab_alloc_check():
 *   - the list tiles [0, usable) with no gap and no overlap, every size > 0
 *     and a multiple of align;
 *   - no two free blocks are adjacent (free merges at once);
 *   - each free block is in the size tree, each allocated or quarantined block
 *     in the offset tree, never both: one pair of child links serves either;
 *   - each quarantined block has exactly one entry in the quarantine heap;
 *   - the byte and block counters equal what the list holds.
 *
 * Trees. Two treaps (binary search trees that are heaps on a random priority,
 * so their expected depth is O(log n) whatever the order of operations):
 *   - by_size: free blocks keyed by (size, off). Best fit is the lower bound
 *     of (n, 0): the smallest size >= n, and the lowest offset among those.
 *   - by_off: allocated and quarantined blocks keyed by off. free() looks the
 *     offset up here, which is how a double free, an unknown or inner offset,
 *     or a free of a quarantined block is refused before anything changes.
 * Insert and remove use iterative split/merge (no recursion, no parent links).
 * Priorities come from a per-allocator xorshift stream with a fixed seed, so
 * a given sequence of calls always builds the same trees. The offsets handed
 * out never depend on the trees' shape, only on the best-fit rule. The
 * O(log n) bounds are expected ones (treap), not worst case.
 *
 * Quarantine. A binary min-heap of (t, seq, block) in an array; seq keeps
 * free_at order among equal times. Entries are never removed except from the
 * top, because a quarantined block cannot be freed early. sweep() with nothing
 * due reads the top and returns: O(1).
 *
 * Memory. Block nodes (64 bytes, cache-line aligned, the fields a descent
 * reads first) come from chunks the allocator owns and recycles through a
 * free list; chunks are released only by destroy. alloc() takes the node it
 * may need (for the remainder of a split) and free_at() grows the heap before
 * changing anything, so DP_ENOMEM always leaves the state as it was. free()
 * and sweep() never allocate.
 *
 * Retired regions (design section 6: an allocation whose WRITE may still run
 * is never freed). The caller retires a block by simply never freeing it and
 * counting it; it stays in allocated_bytes. Quarantining it with t = INFINITY
 * would also work, but would make quarantined_bytes, which the unit reads as
 * "room that will come back", lie.
 *
 * Threads: none of this is locked; the caller serialises (the unit lock).
 */
#include "alloc/slab_alloc.h"

#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "common/list.h"

/* Node states: the public three, plus a node sitting in the spare list. */
enum {
    ST_FREE = DP_SLAB_FREE,
    ST_ALLOC = DP_SLAB_ALLOCATED,
    ST_QUAR = DP_SLAB_QUARANTINED,
    ST_SPARE = 3
};

typedef struct blk blk;
struct blk {
    /* What a tree descent reads comes first, within one cache line. */
    uint64_t off;
    uint64_t size;
    blk *l, *r;    /* treap children (by_size or by_off); r links the spare list */
    uint32_t prio; /* treap priority: a parent's is >= its children's */
    uint8_t state;
    dp__list_node link; /* a->blocks: address order, every live block */
} __attribute__((aligned(64)));

typedef struct blk_chunk blk_chunk;
struct blk_chunk {
    blk_chunk *next;
    blk nodes[];
};

typedef struct qent {
    double t;
    uint64_t seq;
    blk *b;
} qent;

struct dp__slab_alloc {
    uint64_t area, usable, align;
    dp__list blocks; /* every live block in address order (blk.link) */
    blk *by_size;    /* treap root: free blocks by (size, off) */
    blk *by_off;     /* treap root: allocated and quarantined blocks by off */
    blk *spare;      /* recycled nodes, linked through r */
    blk_chunk *chunks;
    size_t chunk_nodes; /* nodes in the next chunk (grows to a cap) */
    qent *q;            /* quarantine min-heap on (t, seq) */
    size_t q_len, q_cap;
    uint64_t q_seq;
    uint64_t rng;
    uint64_t alloc_bytes, free_bytes, quar_bytes;
    uint64_t n_free, n_alloc, n_quar;
};

#define CHUNK_MIN 64
#define CHUNK_MAX 16384

/* ---- nodes ---- */

static uint32_t
next_prio(dp__slab_alloc *a)
{
    /* xorshift64*: plenty for treap priorities. */
    uint64_t x = a->rng;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    a->rng = x;
    return (uint32_t)((x * 0x2545f4914f6cdd1dull) >> 32);
}

static blk *
node_get(dp__slab_alloc *a)
{
    if (a->spare == NULL) {
        size_t n = a->chunk_nodes;
        blk_chunk *c = aligned_alloc(_Alignof(blk_chunk), sizeof(*c) + n * sizeof(blk));
        if (c == NULL)
            return NULL;
        c->next = a->chunks;
        a->chunks = c;
        for (size_t i = n; i-- > 0;) {
            c->nodes[i].state = ST_SPARE;
            c->nodes[i].r = a->spare;
            a->spare = &c->nodes[i];
        }
        if (a->chunk_nodes < CHUNK_MAX)
            a->chunk_nodes *= 2;
    }
    blk *b = a->spare;
    a->spare = b->r;
    memset(b, 0, sizeof(*b));
    b->prio = next_prio(a);
    return b;
}

static void
node_put(dp__slab_alloc *a, blk *b)
{
    b->state = ST_SPARE;
    b->l = NULL;
    b->link = (dp__list_node){NULL, NULL};
    b->r = a->spare;
    a->spare = b;
}

/* ---- treaps ---- */

/* key(x) < (size, off): by (size, off) in the size tree, by off alone otherwise. */
static inline bool
key_lt(bool by_size, const blk *x, uint64_t size, uint64_t off)
{
    if (by_size && x->size != size)
        return x->size < size;
    return x->off < off;
}

static void
treap_insert(blk **root, blk *n, bool by_size)
{
    blk **p = root;
    while (*p != NULL && (*p)->prio > n->prio)
        p = key_lt(by_size, *p, n->size, n->off) ? &(*p)->r : &(*p)->l;
    /* Split the subtree at *p around n's key; n takes its place. */
    blk *t = *p, **lp = &n->l, **rp = &n->r;
    while (t != NULL) {
        if (key_lt(by_size, t, n->size, n->off)) {
            *lp = t;
            lp = &t->r;
            t = t->r;
        } else {
            *rp = t;
            rp = &t->l;
            t = t->l;
        }
    }
    *lp = *rp = NULL;
    *p = n;
}

/* Replace the node at *p by the merge of its subtrees (all of l below all of r). */
static void
treap_unlink(blk **p)
{
    blk *n = *p, *x = n->l, *y = n->r;
    while (x != NULL && y != NULL) {
        if (x->prio > y->prio) {
            *p = x;
            p = &x->r;
            x = x->r;
        } else {
            *p = y;
            p = &y->l;
            y = y->l;
        }
    }
    *p = x != NULL ? x : y;
    n->l = n->r = NULL;
}

/* Remove n, which must be in the tree with its key unchanged since insert. */
static void
treap_remove(blk **root, blk *n, bool by_size)
{
    blk **p = root;
    while (*p != n) {
        DP_ASSERT(*p != NULL);
        p = key_lt(by_size, *p, n->size, n->off) ? &(*p)->r : &(*p)->l;
    }
    treap_unlink(p);
}

/*
 * The link to the free block with the smallest (size, off) whose size >= n, or
 * NULL. Returning the link lets the caller unlink it without a second descent;
 * it stays valid until the size tree changes.
 */
static blk **
best_fit(dp__slab_alloc *a, uint64_t n)
{
    blk **p = &a->by_size, **best = NULL;
    while (*p != NULL) {
        if ((*p)->size >= n) {
            best = p;
            p = &(*p)->l;
        } else {
            p = &(*p)->r;
        }
    }
    return best;
}

static uint64_t
largest_free(const dp__slab_alloc *a)
{
    const blk *t = a->by_size;
    if (t == NULL)
        return 0;
    while (t->r != NULL)
        t = t->r;
    return t->size;
}

/* The link to the used block at off (*link is NULL when there is none). */
static blk **
find_used_link(dp__slab_alloc *a, uint64_t off)
{
    blk **p = &a->by_off;
    while (*p != NULL && (*p)->off != off)
        p = (*p)->off < off ? &(*p)->r : &(*p)->l;
    return p;
}

static const blk *
find_used(const dp__slab_alloc *a, uint64_t off)
{
    const blk *t = a->by_off;
    while (t != NULL && t->off != off)
        t = t->off < off ? t->r : t->l;
    return t;
}

/* The used block with the greatest offset <= off, or NULL. */
static const blk *
floor_used(const dp__slab_alloc *a, uint64_t off)
{
    const blk *t = a->by_off, *best = NULL;
    while (t != NULL) {
        if (t->off <= off) {
            best = t;
            t = t->r;
        } else {
            t = t->l;
        }
    }
    return best;
}

/* ---- quarantine heap ---- */

static inline bool
q_lt(const qent *x, const qent *y)
{
    return x->t < y->t || (x->t == y->t && x->seq < y->seq);
}

static int
q_reserve(dp__slab_alloc *a, dp_detail *d)
{
    if (a->q_len < a->q_cap)
        return 0;
    size_t cap = a->q_cap ? a->q_cap * 2 : 64;
    qent *q = realloc(a->q, cap * sizeof(*q));
    if (q == NULL)
        return dp__fail(d, DP_ENOMEM, "slab allocator: no memory for a quarantine of %zu",
                        cap);
    a->q = q;
    a->q_cap = cap;
    return 0;
}

static void
q_push(dp__slab_alloc *a, qent e)
{
    DP_ASSERT(a->q_len < a->q_cap);
    size_t i = a->q_len++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!q_lt(&e, &a->q[p]))
            break;
        a->q[i] = a->q[p];
        i = p;
    }
    a->q[i] = e;
}

static qent
q_pop(dp__slab_alloc *a)
{
    DP_ASSERT(a->q_len > 0);
    qent top = a->q[0], last = a->q[--a->q_len];
    size_t i = 0, n = a->q_len;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n)
            break;
        if (c + 1 < n && q_lt(&a->q[c + 1], &a->q[c]))
            c++;
        if (!q_lt(&a->q[c], &last))
            break;
        a->q[i] = a->q[c];
        i = c;
    }
    if (n > 0)
        a->q[i] = last;
    return top;
}

/* ---- lifecycle ---- */

int
dp__slab_alloc_create(uint64_t area_bytes, uint64_t align, dp__slab_alloc **out,
                      dp_detail *d)
{
    if (out == NULL)
        return dp__fail(d, DP_EINVAL, "slab allocator: out is NULL");
    *out = NULL;
    if (align == 0)
        align = 64;
    if ((align & (align - 1)) != 0)
        return dp__fail(d, DP_EINVAL,
                        "slab allocator: align %" PRIu64 " is not a power of two", align);
    uint64_t usable = area_bytes & ~(align - 1);
    if (usable == 0)
        return dp__fail(d, DP_EINVAL,
                        "slab allocator: area of %" PRIu64
                        " bytes holds no block of the alignment %" PRIu64,
                        area_bytes, align);

    dp__slab_alloc *a = calloc(1, sizeof(*a));
    if (a == NULL)
        return dp__fail(d, DP_ENOMEM, "slab allocator: no memory");
    a->area = area_bytes;
    a->usable = usable;
    a->align = align;
    a->chunk_nodes = CHUNK_MIN;
    a->rng = 0x9e3779b97f4a7c15ull;
    blk *b = node_get(a);
    if (b == NULL)
        goto fail;
    b->off = 0;
    b->size = usable;
    b->state = ST_FREE;
    dp__list_insert_tail(&a->blocks, &b->link);
    treap_insert(&a->by_size, b, true);
    a->free_bytes = usable;
    a->n_free = 1;
    *out = a;
    return 0;

fail:
    dp__slab_alloc_destroy(a);
    return dp__fail(d, DP_ENOMEM, "slab allocator: no memory");
}

void
dp__slab_alloc_destroy(dp__slab_alloc *a)
{
    if (a == NULL)
        return;
    while (a->chunks != NULL) {
        blk_chunk *c = a->chunks;
        a->chunks = c->next;
        free(c);
    }
    free(a->q);
    free(a);
}

/* ---- alloc / free ---- */

int
dp__slab_alloc_alloc(dp__slab_alloc *a, uint64_t nbytes, uint64_t *off, dp_detail *d)
{
    if (a == NULL || off == NULL)
        return dp__fail(d, DP_EINVAL, "slab allocator: NULL argument");
    if (nbytes == 0)
        return dp__fail(d, DP_EINVAL, "slab allocator: zero-byte allocation");
    if (nbytes > a->usable)
        return dp__fail(d, DP_ETOOBIG,
                        "slab allocator: %" PRIu64
                        " bytes asked, the whole area holds %" PRIu64,
                        nbytes, a->usable);
    uint64_t n = DP_ALIGN_UP(nbytes, a->align); /* <= usable: no overflow */
    blk **fl = best_fit(a, n);
    if (fl == NULL)
        return dp__fail(
            d, DP_EUNITFULL,
            "slab allocator: no free block of %" PRIu64 " bytes (asked %" PRIu64
            "): largest free block %" PRIu64 ", %" PRIu64 " bytes free in %" PRIu64
            " blocks, %" PRIu64 " quarantined",
            n, nbytes, largest_free(a), a->free_bytes, a->n_free, a->quar_bytes);
    blk *f = *fl, *rest = NULL;
    if (f->size > n) {
        rest = node_get(a);
        if (rest == NULL)
            return dp__fail(d, DP_ENOMEM, "slab allocator: no memory for a block node");
    }

    treap_unlink(fl); /* node_get() left the trees alone: fl is still f's link */
    if (rest != NULL) {
        /* Carve from the front; the tail stays free (it cannot touch another
         * free block: f's successor was not free). */
        rest->off = f->off + n;
        rest->size = f->size - n;
        rest->state = ST_FREE;
        dp__list_insert_after(&a->blocks, &f->link, &rest->link);
        f->size = n;
        treap_insert(&a->by_size, rest, true);
    } else {
        a->n_free--;
    }
    f->state = ST_ALLOC;
    treap_insert(&a->by_off, f, false);
    a->free_bytes -= n;
    a->alloc_bytes += n;
    a->n_alloc++;
    *off = f->off;
    return 0;
}

/*
 * The link (in the offset tree) to the allocated block that starts at off, or
 * NULL with the reason (quarantined, outside, inner offset, nothing there) in
 * d. op names the caller's operation.
 */
static blk **
lookup_allocated(dp__slab_alloc *a, uint64_t off, const char *op, dp_detail *d)
{
    blk **link = find_used_link(a, off), *b = *link;
    if (b != NULL && b->state == ST_ALLOC)
        return link;
    if (b != NULL) {
        dp__fail(d, DP_EINVAL,
                 "slab allocator: %s(%" PRIu64 "): the block (%" PRIu64
                 " bytes) is quarantined; only sweep releases it",
                 op, off, b->size);
    } else if (off >= a->usable) {
        dp__fail(d, DP_EINVAL,
                 "slab allocator: %s(%" PRIu64 "): offset outside the area of %" PRIu64
                 " bytes",
                 op, off, a->usable);
    } else {
        const blk *f = floor_used(a, off);
        if (f != NULL && off < f->off + f->size)
            dp__fail(d, DP_EINVAL,
                     "slab allocator: %s(%" PRIu64
                     "): offset inside the %s block [%" PRIu64 ", %" PRIu64
                     "), not its start",
                     op, off, f->state == ST_QUAR ? "quarantined" : "allocated", f->off,
                     f->off + f->size);
        else
            dp__fail(d, DP_EINVAL,
                     "slab allocator: %s(%" PRIu64
                     "): no allocated block there (double free or never allocated)",
                     op, off);
    }
    return NULL;
}

/*
 * Make a used block free and merge it with its free neighbours. link is b's
 * link in the offset tree when the caller has it, else NULL.
 */
static void
release(dp__slab_alloc *a, blk *b, blk **link)
{
    if (link != NULL)
        treap_unlink(link);
    else
        treap_remove(&a->by_off, b, false);
    if (b->state == ST_ALLOC) {
        a->alloc_bytes -= b->size;
        a->n_alloc--;
    } else {
        DP_ASSERT(b->state == ST_QUAR);
        a->quar_bytes -= b->size;
        a->n_quar--;
    }
    a->free_bytes += b->size;
    a->n_free++;
    b->state = ST_FREE;

    blk *p = DP_LIST_PREV(b, blk, link);
    if (p != NULL && p->state == ST_FREE) {
        treap_remove(&a->by_size, p, true);
        p->size += b->size;
        dp__list_remove(&a->blocks, &b->link);
        node_put(a, b);
        a->n_free--;
        b = p;
    }
    blk *nx = DP_LIST_NEXT(b, blk, link);
    if (nx != NULL && nx->state == ST_FREE) {
        treap_remove(&a->by_size, nx, true);
        b->size += nx->size;
        dp__list_remove(&a->blocks, &nx->link);
        node_put(a, nx);
        a->n_free--;
    }
    treap_insert(&a->by_size, b, true);
}

int
dp__slab_alloc_free(dp__slab_alloc *a, uint64_t off, dp_detail *d)
{
    if (a == NULL)
        return dp__fail(d, DP_EINVAL, "slab allocator: NULL argument");
    blk **link = lookup_allocated(a, off, "free", d);
    if (link == NULL)
        return DP_EINVAL;
    release(a, *link, link);
    return 0;
}

int
dp__slab_alloc_free_at(dp__slab_alloc *a, uint64_t off, double t, dp_detail *d)
{
    if (a == NULL)
        return dp__fail(d, DP_EINVAL, "slab allocator: NULL argument");
    if (isnan(t))
        return dp__fail(d, DP_EINVAL, "slab allocator: free_at(%" PRIu64 "): time is NaN",
                        off);
    blk **link = lookup_allocated(a, off, "free_at", d);
    if (link == NULL)
        return DP_EINVAL;
    blk *b = *link;
    int rc = q_reserve(a, d);
    if (rc != 0)
        return rc;
    b->state = ST_QUAR;
    a->alloc_bytes -= b->size;
    a->n_alloc--;
    a->quar_bytes += b->size;
    a->n_quar++;
    q_push(a, (qent){.t = t, .seq = a->q_seq++, .b = b});
    return 0;
}

uint64_t
dp__slab_alloc_sweep(dp__slab_alloc *a, double now)
{
    uint64_t released = 0;
    if (a == NULL)
        return 0;
    while (a->q_len > 0 && a->q[0].t <= now) {
        qent e = q_pop(a);
        released += e.b->size;
        release(a, e.b, NULL);
    }
    return released;
}

/* ---- queries ---- */

int
dp__slab_alloc_size_of(const dp__slab_alloc *a, uint64_t off, uint64_t *n)
{
    if (a == NULL || n == NULL)
        return DP_EINVAL;
    const blk *b = find_used(a, off);
    if (b == NULL || b->state != ST_ALLOC)
        return DP_ENOTFOUND;
    *n = b->size;
    return 0;
}

void
dp__slab_alloc_get_stats(const dp__slab_alloc *a, dp__slab_alloc_stats *st)
{
    memset(st, 0, sizeof(*st));
    st->next_release = INFINITY;
    if (a == NULL)
        return;
    st->area_bytes = a->area;
    st->usable_bytes = a->usable;
    st->align = a->align;
    st->allocated_bytes = a->alloc_bytes;
    st->free_bytes = a->free_bytes;
    st->quarantined_bytes = a->quar_bytes;
    st->largest_free = largest_free(a);
    st->n_free = a->n_free;
    st->n_allocated = a->n_alloc;
    st->n_quarantined = a->n_quar;
    st->fragmentation =
        a->free_bytes == 0 ? 0.0 : 1.0 - (double)st->largest_free / (double)a->free_bytes;
    if (a->q_len > 0)
        st->next_release = a->q[0].t;
}

int
dp__slab_alloc_walk(const dp__slab_alloc *a, dp_slab_alloc_walk_fn fn, void *arg)
{
    if (a == NULL || fn == NULL)
        return 0;
    for (const blk *b = DP_LIST_FIRST(&a->blocks, blk, link); b != NULL;
         b = DP_LIST_NEXT(b, blk, link)) {
        int rc = fn(arg, b->off, b->size, b->state);
        if (rc != 0)
            return rc;
    }
    return 0;
}

/* ---- self-check ---- */

typedef struct tree_check {
    bool by_size;
    uint64_t count;
    const blk *last; /* in-order predecessor */
} tree_check;

static int
check_tree(const blk *t, const blk *parent, tree_check *c, int depth, dp_detail *d)
{
    if (t == NULL)
        return 0;
    if (depth > 10000)
        return dp__fail(d, DP_ECORRUPT, "slab allocator: %s tree deeper than 10000",
                        c->by_size ? "size" : "offset");
    if (parent != NULL && t->prio > parent->prio)
        return dp__fail(d, DP_ECORRUPT, "slab allocator: heap order broken at %" PRIu64,
                        t->off);
    int rc = check_tree(t->l, t, c, depth + 1, d);
    if (rc != 0)
        return rc;
    if (c->by_size ? t->state != ST_FREE : (t->state != ST_ALLOC && t->state != ST_QUAR))
        return dp__fail(d, DP_ECORRUPT,
                        "slab allocator: block %" PRIu64 " in state %d in the %s tree",
                        t->off, t->state, c->by_size ? "size" : "offset");
    if (c->last != NULL && !key_lt(c->by_size, c->last, t->size, t->off))
        return dp__fail(d, DP_ECORRUPT,
                        "slab allocator: %s tree out of order at %" PRIu64,
                        c->by_size ? "size" : "offset", t->off);
    c->last = t;
    c->count++;
    return check_tree(t->r, t, c, depth + 1, d);
}

static int
cmp_blk_ptr(const void *x, const void *y)
{
    uintptr_t p = (uintptr_t) * (const blk *const *)x,
              q = (uintptr_t) * (const blk *const *)y;
    return p < q ? -1 : p > q;
}

int
dp__slab_alloc_check(const dp__slab_alloc *a, dp_detail *d)
{
    uint64_t end = 0, nf = 0, na = 0, nq = 0, bf = 0, ba = 0, bq = 0;
    const blk *prev = NULL;
    if (a == NULL)
        return dp__fail(d, DP_EINVAL, "slab allocator: NULL argument");
    for (const blk *b = DP_LIST_FIRST(&a->blocks, blk, link); b != NULL;
         prev = b, b = DP_LIST_NEXT(b, blk, link)) {
        if (b->link.prev != (prev != NULL ? &prev->link : NULL))
            return dp__fail(d, DP_ECORRUPT, "slab allocator: bad prev link at %" PRIu64,
                            b->off);
        if (b->off != end)
            return dp__fail(d, DP_ECORRUPT,
                            "slab allocator: block at %" PRIu64 ", expected %" PRIu64,
                            b->off, end);
        if (b->size == 0 || b->size % a->align != 0 || b->size > a->usable - b->off)
            return dp__fail(d, DP_ECORRUPT,
                            "slab allocator: block at %" PRIu64 " has size %" PRIu64,
                            b->off, b->size);
        end = b->off + b->size;
        switch (b->state) {
        case ST_FREE:
            if (prev != NULL && prev->state == ST_FREE)
                return dp__fail(d, DP_ECORRUPT,
                                "slab allocator: free blocks at %" PRIu64 " and %" PRIu64
                                " not merged",
                                prev->off, b->off);
            nf++;
            bf += b->size;
            break;
        case ST_ALLOC:
            na++;
            ba += b->size;
            break;
        case ST_QUAR:
            nq++;
            bq += b->size;
            break;
        default:
            return dp__fail(d, DP_ECORRUPT,
                            "slab allocator: block %" PRIu64 " in state %d", b->off,
                            b->state);
        }
    }
    if (end != a->usable)
        return dp__fail(d, DP_ECORRUPT,
                        "slab allocator: blocks end at %" PRIu64 ", area at %" PRIu64,
                        end, a->usable);
    if (nf != a->n_free || na != a->n_alloc || nq != a->n_quar || bf != a->free_bytes ||
        ba != a->alloc_bytes || bq != a->quar_bytes)
        return dp__fail(d, DP_ECORRUPT,
                        "slab allocator: counters (free %" PRIu64 "/%" PRIu64
                        ", allocated %" PRIu64 "/%" PRIu64 ", quarantined %" PRIu64
                        "/%" PRIu64 ") disagree with the blocks (%" PRIu64 "/%" PRIu64
                        ", %" PRIu64 "/%" PRIu64 ", %" PRIu64 "/%" PRIu64 ")",
                        a->n_free, a->free_bytes, a->n_alloc, a->alloc_bytes, a->n_quar,
                        a->quar_bytes, nf, bf, na, ba, nq, bq);

    tree_check c = {.by_size = true};
    int rc = check_tree(a->by_size, NULL, &c, 0, d);
    if (rc != 0)
        return rc;
    if (c.count != nf)
        return dp__fail(d, DP_ECORRUPT,
                        "slab allocator: size tree holds %" PRIu64 " of %" PRIu64
                        " free blocks",
                        c.count, nf);
    c = (tree_check){.by_size = false};
    rc = check_tree(a->by_off, NULL, &c, 0, d);
    if (rc != 0)
        return rc;
    if (c.count != na + nq)
        return dp__fail(d, DP_ECORRUPT,
                        "slab allocator: offset tree holds %" PRIu64 " of %" PRIu64
                        " used blocks",
                        c.count, na + nq);

    if (a->q_len != nq)
        return dp__fail(d, DP_ECORRUPT,
                        "slab allocator: quarantine heap holds %zu of %" PRIu64 " blocks",
                        a->q_len, nq);
    for (size_t i = 0; i < a->q_len; i++) {
        if (a->q[i].b->state != ST_QUAR)
            return dp__fail(
                d, DP_ECORRUPT,
                "slab allocator: quarantine entry %zu names a block in state %d", i,
                a->q[i].b->state);
        if (i > 0 && q_lt(&a->q[i], &a->q[(i - 1) / 2]))
            return dp__fail(d, DP_ECORRUPT,
                            "slab allocator: quarantine heap order broken");
    }
    /* Every quarantined block exactly once: the entries name distinct blocks. */
    if (a->q_len > 1) {
        const blk **v = malloc(a->q_len * sizeof(*v));
        if (v == NULL)
            return 0; /* the rest was checked; skip this part rather than fail */
        for (size_t i = 0; i < a->q_len; i++)
            v[i] = a->q[i].b;
        qsort(v, a->q_len, sizeof(*v), cmp_blk_ptr);
        bool dup = false;
        for (size_t i = 1; i < a->q_len && !dup; i++)
            dup = v[i] == v[i - 1];
        free(v);
        if (dup)
            return dp__fail(d, DP_ECORRUPT,
                            "slab allocator: a block is twice in the quarantine heap");
    }
    return 0;
}
