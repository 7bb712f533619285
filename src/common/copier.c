/*
 * Large copies on more than one core: see copier.h and docs/design.md,
 * "Parallel copies".
 *
 * A batch is a list of jobs and a cursor (job, offset). Every thread, the
 * caller first, takes the next chunk of up to CHUNK bytes under the mutex and
 * copies it without the mutex; a helper counts itself in `inflight` while it
 * copies. The caller, once the cursor is at the end, waits until inflight is
 * zero: then no helper touches the batch's memory any more, and the batch is
 * cleared before the caller returns.
 */
#include "copier.h"

#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CHUNK (256u * 1024)
#define MIN_BYTES (2 * CHUNK) /* smaller batches are not worth a wake-up */

struct dp__copier {
    unsigned threads;
    pid_t pid; /* a forked child copies alone (its helpers are gone) */
    pthread_mutex_t mu;
    pthread_cond_t work_cv;
    pthread_t thr[DP_COPIER_THREADS_MAX];
    unsigned n_started;
    bool start_failed;
    bool stop;
    /* the batch, under mu */
    const dp__copy *jobs;
    size_t n_jobs;
    size_t cur_j, cur_off;
    unsigned inflight; /* helpers copying a chunk; atomic loads outside mu */
    uint64_t n_batches, n_bytes, n_helper_bytes;
};

typedef struct chunk {
    size_t j0, off0, j1, off1; /* from (j0, off0) to (j1, off1), exclusive */
} chunk;

/* The next chunk of the batch (mu held); false at its end. */
static bool
grab_locked(dp__copier *c, chunk *k)
{
    if (c->cur_j >= c->n_jobs)
        return false;
    k->j0 = c->cur_j;
    k->off0 = c->cur_off;
    size_t left = CHUNK;
    while (c->cur_j < c->n_jobs && left > 0) {
        size_t rem = c->jobs[c->cur_j].n - c->cur_off;
        if (rem <= left) {
            left -= rem;
            c->cur_j++;
            c->cur_off = 0;
        } else {
            c->cur_off += left;
            left = 0;
        }
    }
    k->j1 = c->cur_j;
    k->off1 = c->cur_off;
    return true;
}

/* Copy chunk k; returns its bytes. */
static size_t
copy_chunk(const dp__copy *jobs, size_t n_jobs, const chunk *k)
{
    size_t bytes = 0;
    for (size_t j = k->j0; j <= k->j1 && j < n_jobs; j++) {
        size_t from = j == k->j0 ? k->off0 : 0;
        size_t to = j == k->j1 ? k->off1 : jobs[j].n;
        if (to > from) {
            memcpy((uint8_t *)jobs[j].dst + from, (const uint8_t *)jobs[j].src + from,
                   to - from);
            bytes += to - from;
        }
    }
    return bytes;
}

static void *
helper_main(void *arg)
{
    dp__copier *c = arg;
    pthread_mutex_lock(&c->mu);
    for (;;) {
        while (!c->stop && c->cur_j >= c->n_jobs)
            pthread_cond_wait(&c->work_cv, &c->mu);
        if (c->stop)
            break;
        chunk k;
        if (!grab_locked(c, &k))
            continue;
        const dp__copy *jobs = c->jobs;
        size_t n_jobs = c->n_jobs;
        __atomic_add_fetch(&c->inflight, 1, __ATOMIC_RELAXED);
        pthread_mutex_unlock(&c->mu);
        size_t bytes = copy_chunk(jobs, n_jobs, &k);
        pthread_mutex_lock(&c->mu);
        c->n_helper_bytes += bytes;
        __atomic_sub_fetch(&c->inflight, 1, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

dp__copier *
dp__copier_new(unsigned threads)
{
    dp__copier *c = calloc(1, sizeof *c);
    if (c == NULL)
        return NULL;
    c->threads = threads < 1                       ? 1
                 : threads > DP_COPIER_THREADS_MAX ? DP_COPIER_THREADS_MAX
                                                   : threads;
    c->pid = getpid();
    if (pthread_mutex_init(&c->mu, NULL) != 0) {
        free(c);
        return NULL;
    }
    if (pthread_cond_init(&c->work_cv, NULL) != 0) {
        pthread_mutex_destroy(&c->mu);
        free(c);
        return NULL;
    }
    return c;
}

void
dp__copier_destroy(dp__copier *c)
{
    if (c == NULL)
        return;
    if (c->pid != getpid()) {
        /* A forked child: the parent's helpers do not exist here, but the
         * condition variable still counts them as waiters (glibc's destroy
         * would wait for them for good) and a helper may have held the mutex
         * at the fork. Leave both as they are. */
        if (c->n_started == 0) {
            pthread_cond_destroy(&c->work_cv);
            pthread_mutex_destroy(&c->mu);
        }
        free(c);
        return;
    }
    pthread_mutex_lock(&c->mu);
    c->stop = true;
    pthread_cond_broadcast(&c->work_cv);
    pthread_mutex_unlock(&c->mu);
    for (unsigned i = 0; i < c->n_started; i++)
        pthread_join(c->thr[i], NULL);
    pthread_cond_destroy(&c->work_cv);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

/* Start the helpers not yet running (mu held); they never take signals. */
static void
start_helpers_locked(dp__copier *c)
{
    if (c->start_failed || c->n_started + 1 >= c->threads)
        return;
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    while (c->n_started + 1 < c->threads) {
        if (pthread_create(&c->thr[c->n_started], NULL, helper_main, c) != 0) {
            c->start_failed = true; /* fewer helpers: the caller copies more */
            break;
        }
        c->n_started++;
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
}

static void
copy_alone(const dp__copy *jobs, size_t n_jobs)
{
    for (size_t j = 0; j < n_jobs; j++)
        if (jobs[j].n > 0)
            memcpy(jobs[j].dst, jobs[j].src, jobs[j].n);
}

void
dp__copier_run(dp__copier *c, const dp__copy *jobs, size_t n_jobs)
{
    size_t total = 0;
    for (size_t j = 0; j < n_jobs; j++)
        total += jobs[j].n;
    if (c == NULL || c->threads < 2 || total < MIN_BYTES || c->pid != getpid()) {
        copy_alone(jobs, n_jobs);
        return;
    }
    pthread_mutex_lock(&c->mu);
    if (c->jobs != NULL) { /* another thread's batch runs: copy alone */
        pthread_mutex_unlock(&c->mu);
        copy_alone(jobs, n_jobs);
        return;
    }
    start_helpers_locked(c);
    c->jobs = jobs;
    c->n_jobs = n_jobs;
    c->cur_j = 0;
    c->cur_off = 0;
    c->n_batches++;
    c->n_bytes += total;
    if (c->n_started > 0)
        pthread_cond_broadcast(&c->work_cv);
    for (;;) {
        chunk k;
        if (!grab_locked(c, &k))
            break;
        pthread_mutex_unlock(&c->mu);
        copy_chunk(jobs, n_jobs, &k);
        pthread_mutex_lock(&c->mu);
    }
    /* Every chunk is taken; wait for the helpers' last ones (a chunk is tens of us). */
    pthread_mutex_unlock(&c->mu);
    for (unsigned spins = 0; __atomic_load_n(&c->inflight, __ATOMIC_ACQUIRE) > 0; spins++)
        if (spins > 64)
            sched_yield();
    pthread_mutex_lock(&c->mu);
    c->jobs = NULL;
    c->n_jobs = 0;
    c->cur_j = 0;
    c->cur_off = 0;
    pthread_mutex_unlock(&c->mu);
}

void
dp__copier_counts(const dp__copier *c, uint64_t *batches, uint64_t *bytes,
                  uint64_t *helper_bytes)
{
    dp__copier *m = (dp__copier *)c;
    bool child = c->pid != getpid(); /* the mutex may be held for good there */
    if (!child)
        pthread_mutex_lock(&m->mu);
    if (batches != NULL)
        *batches = c->n_batches;
    if (bytes != NULL)
        *bytes = c->n_bytes;
    if (helper_bytes != NULL)
        *helper_bytes = c->n_helper_bytes;
    if (!child)
        pthread_mutex_unlock(&m->mu);
}

unsigned
dp__copier_default_threads(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n >= 2 ? 2 : 1;
}
