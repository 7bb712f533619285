/*
 * Writers of a unit's regions and the retired regions they may still write
 * into (see writers.h and docs/design.md, "Reclaiming retired memory").
 *
 * Design notes
 * - A writer record lives while something refers to it: each open
 *   allocation it made and each region retired on its behalf hold one
 *   reference. The table maps the writer's id (the client's random id) to
 *   the record; a record whose last reference goes is removed and its pidfd
 *   closed, so a long-lived unit keeps only writers that matter.
 * - The pidfd is opened when the writer is first seen, i.e. while the
 *   message it just sent proves it alive or just gone. If its pid was reused
 *   meanwhile, the writer was already gone and the pidfd watches another
 *   process: the regions are then kept longer, never handed back early.
 * - Retired regions of a writer that can be proved gone are kept in its own
 *   list; those of a writer that never can (other host, non-shared-memory
 *   lane, no pidfd) and of no writer are only counted (kept for good).
 */
#include "unit/writers.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "common/list.h"
#include "common/map.h"

typedef struct retired_region {
    dp__list_node link; /* dp__writer.retired, newest first */
    int area;
    uint64_t off, size;
} retired_region;

struct dp__writer {
    char id[DP_WIRE_RID_MAX + 32];
    size_t id_len;
    uint64_t refs;
    int pidfd;        /* -1: no proof can come */
    bool provable;    /* same host, shared-memory lane, pidfd open */
    bool dead;        /* the pidfd turned readable */
    double dead_at;   /* when that was seen */
    dp__list retired; /* retired_region.link */
};

struct dp__writers {
    double grace_s;
    char host[128];
    dp__map by_id; /* id -> dp__writer* */
    uint64_t retired_bytes, retired, kept_bytes;
    uint64_t reclaimed_bytes, reclaimed;
};

int
dp__writers_create(double grace_s, const char *host_key, dp__writers **out, dp_detail *d)
{
    dp__writers *w = calloc(1, sizeof *w);
    if (w == NULL)
        return dp__fail(d, DP_ENOMEM, "unit: out of memory (writers)");
    w->grace_s = grace_s;
    snprintf(w->host, sizeof w->host, "%s", host_key != NULL ? host_key : "");
    dp__map_init_str(&w->by_id);
    *out = w;
    return DP_OK;
}

static void
writer_free(dp__writer *wr)
{
    for (retired_region *r;
         (r = DP_LIST_FIRST(&wr->retired, retired_region, link)) != NULL;) {
        dp__list_remove(&wr->retired, &r->link);
        free(r);
    }
    if (wr->pidfd >= 0)
        close(wr->pidfd);
    free(wr);
}

void
dp__writers_destroy(dp__writers *w)
{
    if (w == NULL)
        return;
    void *v;
    for (size_t it = 0; dp__map_next(&w->by_id, &it, NULL, NULL, NULL, &v);)
        writer_free(v);
    dp__map_fini(&w->by_id);
    free(w);
}

static int
pidfd_open_(uint64_t pid)
{
#ifdef SYS_pidfd_open
    if (pid == 0 || pid > (uint64_t)INT32_MAX)
        return -1;
    return (int)syscall(SYS_pidfd_open, (pid_t)pid, 0);
#else
    (void)pid;
    errno = ENOSYS;
    return -1;
#endif
}

dp__writer *
dp__writers_ref(dp__writers *w, const dp__wire_alloc_args *a)
{
    if (a->writer.n == 0 || a->writer.n >= sizeof(((dp__writer *)0)->id))
        return NULL;
    dp__writer *wr = dp__map_get(&w->by_id, a->writer.p, a->writer.n);
    if (wr != NULL) {
        wr->refs++;
        return wr;
    }
    wr = calloc(1, sizeof *wr);
    if (wr == NULL)
        return NULL;
    memcpy(wr->id, a->writer.p, a->writer.n);
    wr->id_len = a->writer.n;
    wr->refs = 1;
    wr->pidfd = -1;
    bool same_host = w->host[0] != '\0' && dp__wire_str_eq(a->host, w->host);
    if (same_host && a->pid != 0 && dp__wire_str_eq(a->lane, "shm")) {
        wr->pidfd = pidfd_open_(a->pid);
        if (wr->pidfd < 0 && errno == ESRCH) {
            /* Gone already: this message was its last. */
            wr->dead = true;
            wr->provable = true;
            wr->dead_at = -1; /* set at the next reclaim, which knows the time */
        }
        wr->provable = wr->provable || wr->pidfd >= 0;
    }
    if (dp__map_put(&w->by_id, wr->id, wr->id_len, wr, NULL) != 0) {
        writer_free(wr);
        return NULL;
    }
    return wr;
}

void
dp__writers_unref(dp__writers *w, dp__writer *wr)
{
    if (wr == NULL || --wr->refs > 0)
        return;
    dp__map_del(&w->by_id, wr->id, wr->id_len);
    writer_free(wr);
}

bool
dp__writer_gone(const dp__writer *wr, double now)
{
    return wr != NULL && wr->provable && wr->dead && wr->dead_at >= 0 &&
           now - wr->dead_at >= 0;
}

const char *
dp__writer_name(const dp__writer *wr)
{
    return wr != NULL ? wr->id : "?";
}

void
dp__writers_retire(dp__writers *w, dp__writer *wr, int area, uint64_t off, uint64_t size)
{
    w->retired_bytes += size;
    w->retired++;
    retired_region *r = NULL;
    if (wr != NULL && wr->provable && w->grace_s >= 0)
        r = malloc(sizeof *r);
    if (r == NULL) {
        w->kept_bytes += size; /* kept for good: nothing can prove the writer gone */
        return;
    }
    *r = (retired_region){.area = area, .off = off, .size = size};
    dp__list_insert_head(&wr->retired, &r->link);
    wr->refs++;
}

/* A zero-timeout look at every provable, live writer's pidfd. */
static void
poll_writers(dp__writers *w, double now)
{
    void *v;
    for (size_t it = 0; dp__map_next(&w->by_id, &it, NULL, NULL, NULL, &v);) {
        dp__writer *wr = v;
        if (wr->dead && wr->dead_at < 0)
            wr->dead_at = now;
        if (!wr->provable || wr->dead || wr->pidfd < 0)
            continue;
        struct pollfd p = {.fd = wr->pidfd, .events = POLLIN};
        if (poll(&p, 1, 0) == 1 && (p.revents & (POLLIN | POLLHUP | POLLERR))) {
            wr->dead = true;
            wr->dead_at = now;
        }
    }
}

uint64_t
dp__writers_reclaim(dp__writers *w, double now, dp__writers_give_fn give, void *ctx)
{
    poll_writers(w, now);
    if (w->grace_s < 0)
        return 0;
    /* Collect first: handing regions back drops writers from the table. */
    size_t n = 0, cap = 0;
    dp__writer **due = NULL;
    void *v;
    for (size_t it = 0; dp__map_next(&w->by_id, &it, NULL, NULL, NULL, &v);) {
        dp__writer *wr = v;
        if (dp__list_empty(&wr->retired) || !dp__writer_gone(wr, now - w->grace_s))
            continue;
        if (n == cap) {
            size_t nc = cap ? cap * 2 : 8;
            dp__writer **p = realloc(due, nc * sizeof *p);
            if (p == NULL)
                break; /* the rest waits for the next tick */
            due = p;
            cap = nc;
        }
        due[n++] = wr;
    }
    uint64_t bytes = 0;
    for (size_t i = 0; i < n; i++) {
        dp__writer *wr = due[i];
        /* Off wr first: the last region's unref may free wr. */
        dp__list regions = {0};
        dp__list_move_tail(&regions, &wr->retired);
        DP_LOG_I("unit: writer %s is gone (its process exited %.1f s ago): its retired "
                 "regions are handed back",
                 wr->id, now - wr->dead_at);
        for (retired_region *r;
             (r = DP_LIST_FIRST(&regions, retired_region, link)) != NULL;) {
            dp__list_remove(&regions, &r->link);
            give(ctx, r->area, r->off, r->size);
            w->retired_bytes -= r->size;
            w->retired--;
            w->reclaimed_bytes += r->size;
            w->reclaimed++;
            bytes += r->size;
            free(r);
            dp__writers_unref(w, wr);
        }
    }
    free(due);
    return bytes;
}

void
dp__writers_get_stats(const dp__writers *w, dp__writers_stats *st)
{
    memset(st, 0, sizeof *st);
    st->writers = dp__map_len(&w->by_id);
    void *v;
    for (size_t it = 0; dp__map_next(&w->by_id, &it, NULL, NULL, NULL, &v);)
        st->writers_gone += ((dp__writer *)v)->dead;
    st->retired_bytes = w->retired_bytes;
    st->retired = w->retired;
    st->retired_kept_bytes = w->kept_bytes;
    st->reclaimed_bytes = w->reclaimed_bytes;
    st->reclaimed = w->reclaimed;
}
