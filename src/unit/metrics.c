/*
 * A unit's metrics in the Prometheus text format (see unit.h): the stats
 * counters under dataplane_ names that carry their unit (_bytes, _total,
 * _seconds), op latency histograms, and bytes by direction.
 *
 * Every DP_UNIT_STATS row has an entry in the table below (its Prometheus
 * name, type and help); a row without one is still exported, as a gauge
 * under dataplane_<wire name>, and test_unit_metrics fails on it, so a new
 * counter cannot be forgotten silently. The counters are copied under the
 * unit lock (dp__unit_get_stats: a memcpy and a few table sizes); the
 * histograms are atomics written by the control thread and read here
 * without any lock.
 */
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "unit/unit_int.h"

/* Bucket upper bounds, microseconds (the last bucket is +Inf). */
static const uint64_t bounds_us[DP_UNIT_HIST_N - 1] = {
    10,    25,    50,    100,    250,    500,     1000,    2500,    5000,
    10000, 25000, 50000, 100000, 250000, 1000000, 2500000, 10000000};

void
dp__unit_set_auth_source(dp__unit *u, uint64_t (*fn)(const void *src), const void *src)
{
    pthread_mutex_lock(&u->mu);
    u->auth_fn = fn;
    u->auth_src = src;
    pthread_mutex_unlock(&u->mu);
}

void
dp__unit_hist_record(dp__unit *u, int op, uint64_t ns)
{
    if (op < 0 || op >= DP_WIRE_OP_COUNT_)
        return;
    dp__op_hist *h = &u->hist[op];
    uint64_t us = ns / 1000;
    int i = 0;
    while (i < DP_UNIT_HIST_N - 1 && us > bounds_us[i])
        i++;
    atomic_fetch_add_explicit(&h->b[i], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&h->sum_ns, ns, memory_order_relaxed);
    atomic_fetch_add_explicit(&h->count, 1, memory_order_relaxed);
}

typedef struct metric_def {
    const char *wire; /* the stats row */
    const char *name; /* after "dataplane_" */
    bool counter;     /* else a gauge */
    const char *help;
} metric_def;

static const metric_def defs[] = {
    {"unit_id", "unit_id", false, "This unit's index in the cluster"},
    {"n_units", "cluster_units", false, "Units in the cluster (rows go to gidx % N)"},
    {"slab_bytes", "slab_bytes", false, "Size of the put area of the slab"},
    {"blobs", "blobs", false, "Blobs in the table (uncommitted and published)"},
    {"published", "published_blobs", false, "Published blobs in the table"},
    {"rows", "rows", false, "Rows in the row index"},
    {"entries", "entries", false, "Keys in the row index"},
    {"pins", "pins", false, "Live read pins"},
    {"zombies", "zombie_blobs", false, "Released blobs kept for their pins or holds"},
    {"zombie_bytes", "zombie_bytes", false, "Bytes of zombie blobs in the put area"},
    {"retired_bytes", "retired_bytes", false,
     "Retired bytes: a WRITE may still land there, never reused until reclaimed"},
    {"retired", "retired_regions", false, "Retired regions"},
    {"retired_kept_bytes", "retired_kept_bytes", false, "Retired bytes kept for good"},
    {"reclaimed_bytes", "reclaimed_bytes_total", true, "Retired bytes handed back"},
    {"reclaimed", "reclaimed_regions_total", true, "Retired regions handed back"},
    {"allocs_reclaimed", "allocs_reclaimed_total", true,
     "Open allocations of writers proved gone, reclaimed"},
    {"allocs_reclaimed_bytes", "allocs_reclaimed_bytes_total", true,
     "Bytes of open allocations reclaimed"},
    {"writers", "writers", false, "Writers with an open allocation or a retired region"},
    {"writers_gone", "writers_gone", false, "Of those, proved unable to write again"},
    {"identity_refused", "identity_refused_total", true,
     "Commits naming another allocation, refused"},
    {"stale_refused", "stale_refused_total", true,
     "Requests older than one their client sent later, refused"},
    {"repeats_taken", "repeats_taken_total", true,
     "Requests their client sent again after a dropped connection, carried out again"},
    {"restart_refused", "restart_refused_total", true,
     "Inline puts meant for an earlier process of this unit, refused"},
    {"versions_refused", "versions_refused_total", true,
     "Commits below the version of a key they would replace, refused (Stale)"},
    {"leases_expired", "leases_expired_total", true,
     "Allocations retired by their lease"},
    {"pins_expired", "pins_expired_total", true, "Pins that expired"},
    {"allocated_bytes", "allocated_bytes", false, "Bytes allocated in the put area"},
    {"free_bytes", "free_bytes", false, "Free bytes in the put area"},
    {"quarantined_bytes", "quarantined_bytes", false,
     "Bytes in quarantine (their pin expired while a READ may run)"},
    {"largest_free", "largest_free_bytes", false, "Largest free extent of the put area"},
    {"allocs", "allocs_total", true, "alloc requests granted"},
    {"commits", "commits_total", true, "Commits (blobs published)"},
    {"aborts", "aborts_total", true, "Aborts"},
    {"resolves", "resolves_total", true, "Resolves (by blob, by key or by row)"},
    {"resolves_by_blob", "resolves_by_blob_total", true,
     "Resolves by blob id (gets with location hints)"},
    {"resolves_by_row", "resolves_by_row_total", true,
     "Resolves by row and field (resolve_rows: a get's lookup, binary records)"},
    {"puts_inline", "puts_inline_total", true,
     "Blobs that came inside their put request (alloc, copy and commit in one)"},
    {"inline_bytes", "inline_bytes_total", true,
     "Value bytes answered inside resolve_keys and resolve_rows replies instead of READ"},
    {"unpins", "unpins_total", true, "Unpins"},
    {"releases", "releases_total", true, "release_rows requests"},
    {"busy", "busy_total", true, "Requests answered Busy"},
    {"unit_full", "unit_full_total", true, "Allocations refused: unit full"},
    {"protocol_errors", "protocol_errors_total", true, "Malformed or refused requests"},
    {"ticks", "ticks_total", true, "Ticker rounds"},
    {"io_bytes", "io_area_bytes", false, "Size of the IO area (SSD tier)"},
    {"io_allocated_bytes", "io_allocated_bytes", false, "Bytes allocated in the IO area"},
    {"io_free_bytes", "io_free_bytes", false, "Free bytes in the IO area"},
    {"io_quarantined_bytes", "io_quarantined_bytes", false,
     "Quarantined bytes in the IO area"},
    {"io_jobs", "io_jobs", false, "SSD jobs queued or running"},
    {"disk_blobs", "disk_blobs", false, "Published blobs on disk"},
    {"disk_bytes", "disk_bytes", false, "Bytes of blobs on disk"},
    {"staged_blobs", "staged_blobs", false, "Disk blobs with a staged copy"},
    {"staged_bytes", "staged_bytes", false, "Bytes staged"},
    {"spills", "spills_total", true, "Spills to disk"},
    {"spill_bytes", "spill_bytes_total", true, "Bytes spilled to disk"},
    {"spills_failed", "spills_failed_total", true, "Spills that failed"},
    {"spills_superseded", "spills_superseded_total", true,
     "Spills whose keys were all replaced before they ended"},
    {"stages", "stages_total", true, "Stages from disk"},
    {"stage_bytes", "stage_bytes_total", true, "Bytes staged from disk"},
    {"stages_failed", "stages_failed_total", true, "Stages that failed"},
    {"evictions", "evictions_total", true, "Staged copies evicted"},
    {"files_open", "files_open", false, "SSD tier files open"},
    {"io_zombie_bytes", "io_zombie_bytes", false, "Zombie bytes in the IO area"},
    {"saves", "shard_saves_total", true, "Shards saved"},
    {"loads", "shard_loads_total", true, "Shards loaded"},
    {"loaded_blobs", "loaded_blobs_total", true, "Blobs loaded from shards"},
    {"saves_loads_running", "shard_jobs_running", false, "Saves and loads running now"},
    {"two_sided_writes", "two_sided_writes_total", true,
     "Two-sided WRITEs accepted into allocations (TCP path)"},
    {"two_sided_write_bytes", "two_sided_write_bytes_total", true,
     "Bytes received by two-sided WRITEs"},
    {"two_sided_reads", "two_sided_reads_total", true,
     "Two-sided READs served from pins"},
    {"two_sided_read_bytes", "two_sided_read_bytes_total", true,
     "Bytes sent by two-sided READs"},
    {"two_sided_refused", "two_sided_refused_total", true,
     "Two-sided transfers refused (no such grant, out of bounds, ...)"},
    {"committed_bytes", "committed_bytes_total", true, "Bytes published by commits"},
    {"resolved_bytes", "resolved_bytes_total", true,
     "Bytes pinned for READs by resolves"},
    {"auth_refused", "auth_refused_total", true,
     "Control-plane clients refused at the CURVE handshake (key not allowed)"},
    {"replicas", "replicas", false, "Copies of each row the cluster keeps"},
    {"repair_state", "repair_state", false,
     "Repair: 0 none, 1 running, 2 done, 3 ended with keys not copied"},
    {"repair_keys", "repair_keys_total", true, "Keys a repair copied into this unit"},
    {"repair_bytes", "repair_bytes_total", true, "Bytes a repair copied into this unit"},
    {"repair_skipped", "repair_skipped_total", true,
     "Repair copies not published: the unit had the key at that version or a newer one, "
     "or its row was cleared"},
    {"repair_failed", "repair_failed_total", true,
     "Keys its peers held that the repair could not copy"},
    {"repair_passes", "repair_passes_total", true,
     "Passes that compared this unit's copies with its peers' after its start"},
    {"under_replicated", "under_replicated_keys", false,
     "Keys this unit holds that a peer sharing their row lacked at the last repair or "
     "pass"},
    {"repair_cleared", "repair_cleared_rows", false,
     "Rows whose clear is recorded (no repair copy brings them back)"},
    {"fenced_keys", "fenced_keys_total", true,
     "Keys not answered: this unit held no read lease (Leases)"},
    {"fences", "fences_total", true,
     "Units fenced at a client's request (it landed a write without them)"},
    {"lease_ok", "lease_ok", false,
     "1 while this unit holds its read lease (or runs "
     "without leases), 0 while it answers no read"},
};

static const metric_def *
def_of(const char *wire)
{
    for (size_t i = 0; i < DP_ARRAY_LEN(defs); i++)
        if (strcmp(defs[i].wire, wire) == 0)
            return &defs[i];
    return NULL;
}

int
dp__unit_metrics_text(dp__unit *u, dp__buf *out)
{
    dp__unit_stats st;
    dp__unit_get_stats(u, &st);
    char labels[160];
    /* The cluster id is [A-Za-z0-9_.:-]: nothing to escape in a label value. */
    snprintf(labels, sizeof labels, "unit=\"%" PRIu32 "\",cluster=\"%s\"", dp__unit_id(u),
             u->cluster_id);
#define EMIT(field, wire)                                                                \
    do {                                                                                 \
        const metric_def *m = def_of(wire);                                              \
        const char *nm = m != NULL ? m->name : (wire);                                   \
        dp__buf_printf(out, "# HELP dataplane_%s %s\n# TYPE dataplane_%s %s\n", nm,      \
                       m != NULL ? m->help : "(undocumented)", nm,                       \
                       m != NULL && m->counter ? "counter" : "gauge");                   \
        dp__buf_printf(out, "dataplane_%s{%s} %" PRIu64 "\n", nm, labels, st.field);     \
    } while (0);
    DP_UNIT_STATS(EMIT)
#undef EMIT
    /* Bytes by direction, one family: in = committed by puts, out = pinned for gets. */
    dp__buf_printf(
        out,
        "# HELP dataplane_data_bytes_total Bytes moved by clients: in = committed "
        "by puts, out = pinned for gets\n"
        "# TYPE dataplane_data_bytes_total counter\n"
        "dataplane_data_bytes_total{%s,direction=\"in\"} %" PRIu64 "\n"
        "dataplane_data_bytes_total{%s,direction=\"out\"} %" PRIu64 "\n",
        labels, st.committed_bytes, labels, st.resolved_bytes);
    dp__buf_printf(out,
                   "# HELP dataplane_op_duration_seconds Time the unit took to handle "
                   "a control request, by op\n"
                   "# TYPE dataplane_op_duration_seconds histogram\n");
    for (int op = 0; op < DP_WIRE_OP_COUNT_; op++) {
        dp__op_hist *h = &u->hist[op];
        /* The buckets are the truth: +Inf and _count are their sum, so the
         * family stays consistent while requests are being recorded. */
        uint64_t b[DP_UNIT_HIST_N], count = 0;
        for (int i = 0; i < DP_UNIT_HIST_N; i++)
            count += b[i] = atomic_load_explicit(&h->b[i], memory_order_relaxed);
        uint64_t sum_ns = atomic_load_explicit(&h->sum_ns, memory_order_relaxed);
        const char *name = dp__wire_op_name((dp__wire_op)op);
        uint64_t cum = 0;
        for (int i = 0; i < DP_UNIT_HIST_N - 1; i++) {
            cum += b[i];
            dp__buf_printf(out,
                           "dataplane_op_duration_seconds_bucket{%s,op=\"%s\",le=\"%g\"} "
                           "%" PRIu64 "\n",
                           labels, name, (double)bounds_us[i] / 1e6, cum);
        }
        dp__buf_printf(out,
                       "dataplane_op_duration_seconds_bucket{%s,op=\"%s\",le=\"+Inf\"} "
                       "%" PRIu64 "\n"
                       "dataplane_op_duration_seconds_sum{%s,op=\"%s\"} %.9f\n"
                       "dataplane_op_duration_seconds_count{%s,op=\"%s\"} %" PRIu64 "\n",
                       labels, name, count, labels, name, (double)sum_ns / 1e9, labels,
                       name, count);
    }
    return out->oom ? DP_ENOMEM : DP_OK;
}
