/*
 * Intrusive doubly-linked lists: an object that goes on a list embeds a
 * dp__list_node and the list links those nodes, so putting an object on a list
 * allocates nothing and every operation is O(1): insert at either end or after
 * a member, remove, first, last, next, prev, empty, moving a whole list.
 *
 * A zeroed dp__list is an empty list and a zeroed node is on no list, so a
 * calloc'd or `= {0}` structure needs no init call (dp__list_init is there for
 * reuse). The list holds its first and last nodes; nodes never point back at
 * the list, so a struct holding a list may be moved while the list is empty or
 * owned by it alone. An object is on at most one list per node it embeds.
 *
 * Objects are reached from their nodes with DP_LIST_ITEM (NULL stays NULL);
 * DP_LIST_FIRST / DP_LIST_NEXT walk a list of objects:
 *
 *     for (pin *p = DP_LIST_FIRST(&u->pins_by_expiry, pin, link); p != NULL;
 *          p = DP_LIST_NEXT(p, pin, link))
 *
 * To remove objects while walking, read the next one before removing.
 * Not thread-safe: the owner's lock guards a list and its nodes.
 */
#ifndef DP_COMMON_LIST_H
#define DP_COMMON_LIST_H

#include <stdbool.h>
#include <stddef.h>

typedef struct dp__list_node {
    struct dp__list_node *next, *prev; /* NULL at the ends */
} dp__list_node;

typedef struct dp__list {
    dp__list_node *first, *last; /* NULL when empty */
} dp__list;

static inline void
dp__list_init(dp__list *l)
{
    l->first = l->last = NULL;
}

static inline bool
dp__list_empty(const dp__list *l)
{
    return l->first == NULL;
}

/* Whether n is on l (n must be on l or on no list). */
static inline bool
dp__list_contains(const dp__list *l, const dp__list_node *n)
{
    return n->prev != NULL || l->first == n;
}

static inline void
dp__list_insert_head(dp__list *l, dp__list_node *n)
{
    n->prev = NULL;
    n->next = l->first;
    if (l->first != NULL)
        l->first->prev = n;
    else
        l->last = n;
    l->first = n;
}

static inline void
dp__list_insert_tail(dp__list *l, dp__list_node *n)
{
    n->next = NULL;
    n->prev = l->last;
    if (l->last != NULL)
        l->last->next = n;
    else
        l->first = n;
    l->last = n;
}

/* Insert n right after at, a member of l. */
static inline void
dp__list_insert_after(dp__list *l, dp__list_node *at, dp__list_node *n)
{
    n->prev = at;
    n->next = at->next;
    if (at->next != NULL)
        at->next->prev = n;
    else
        l->last = n;
    at->next = n;
}

/*
 * Take n off l, leaving it on no list. A node on no list (never inserted, or
 * removed already) is left as it is, so removing twice is harmless.
 */
static inline void
dp__list_remove(dp__list *l, dp__list_node *n)
{
    if (!dp__list_contains(l, n))
        return;
    if (n->prev != NULL)
        n->prev->next = n->next;
    else
        l->first = n->next;
    if (n->next != NULL)
        n->next->prev = n->prev;
    else
        l->last = n->prev;
    n->next = n->prev = NULL;
}

/* Append every node of from to to, in order, in O(1); from ends empty. */
static inline void
dp__list_move_tail(dp__list *to, dp__list *from)
{
    if (from->first == NULL)
        return;
    if (to->last != NULL) {
        to->last->next = from->first;
        from->first->prev = to->last;
    } else {
        to->first = from->first;
    }
    to->last = from->last;
    from->first = from->last = NULL;
}

static inline dp__list_node *
dp__list_first(const dp__list *l)
{
    return l->first;
}

static inline dp__list_node *
dp__list_last(const dp__list *l)
{
    return l->last;
}

static inline dp__list_node *
dp__list_next(const dp__list_node *n)
{
    return n->next;
}

static inline dp__list_node *
dp__list_prev(const dp__list_node *n)
{
    return n->prev;
}

/* The object embedding node n at byte offset off, or NULL for NULL. */
static inline void *
dp__list_item(const dp__list_node *n, size_t off)
{
    return n != NULL ? (void *)((char *)n - off) : NULL;
}

/* The type object whose member node is n (NULL stays NULL). */
#define DP_LIST_ITEM(n, type, member) ((type *)dp__list_item((n), offsetof(type, member)))
/* The first (last) object on list l, or NULL. */
#define DP_LIST_FIRST(l, type, member) DP_LIST_ITEM(dp__list_first(l), type, member)
#define DP_LIST_LAST(l, type, member) DP_LIST_ITEM(dp__list_last(l), type, member)
/* The object after (before) obj on its list, or NULL. */
#define DP_LIST_NEXT(obj, type, member) DP_LIST_ITEM((obj)->member.next, type, member)
#define DP_LIST_PREV(obj, type, member) DP_LIST_ITEM((obj)->member.prev, type, member)

#endif
