/*
 * What a unit tells about itself: who it is (info), its counters, its blob
 * table (scan) and bytes of its slab (read_bytes, for tests and diagnostics).
 *
 * The counters have one table, DP_UNIT_STATS in unit.h (field, wire name).
 * The unit counts most of them as it goes, in u->stats (a dp__unit_stats);
 * dp__unit_get_stats_locked copies that and fills in the rest from the
 * options, tables, allocators and writers. dp__unit_get_stats (tests), the
 * stats reply (dp__unit_stats_locked: every row, in table order, under its
 * wire name) and the ticker's 30 s log line all read that one snapshot, so a
 * counter is named in one row only (its field and its wire name side by side).
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "alloc/slab_alloc.h"
#include "unit/unit_int.h"

#define SCAN_FIELDS 12

static dp__wire_field
field_u64(const char *name, uint64_t v)
{
    dp__wire_field f = {dp__zview(name), DP_WIRE_U64, {.u = v}};
    return f;
}

static dp__wire_field
ff64(const char *name, double v)
{
    dp__wire_field f = {dp__zview(name), DP_WIRE_F64, {.f = v}};
    return f;
}

int
dp__unit_scan_locked(dp__unit *u, dp__wire_fields **recs, uint32_t *n, dp_detail *d)
{
    size_t nb = dp__map_len(&u->blobs);
    *recs = NULL;
    *n = 0;
    dp__wire_fields *r = calloc(nb > 0 ? nb : 1, sizeof *r);
    dp__wire_field *f = calloc((nb > 0 ? nb : 1) * SCAN_FIELDS, sizeof *f);
    if (r == NULL || f == NULL) {
        free(r);
        free(f);
        return dp__fail(d, DP_ENOMEM, "scan: out of memory");
    }
    r[0].v = f; /* owns the field storage, see dp__unit_fields_free */
    size_t it = 0, k = 0;
    void *v;
    while (dp__map_next(&u->blobs, &it, NULL, NULL, NULL, &v)) {
        blob_rec *b = v;
        dp__wire_field *x = f + k * SCAN_FIELDS;
        x[0] = (dp__wire_field){dp__zview("id"), DP_WIRE_STR, {.s = {b->id, b->id_len}}};
        x[1] = field_u64("off", b->off);
        x[2] = field_u64("nbytes", b->nbytes);
        x[3] = field_u64("refs", b->refs);
        x[4] = (dp__wire_field){
            dp__zview("published"), DP_WIRE_BOOL, {.b = b->state == REC_PUBLISHED}};
        x[5] = field_u64("pins", b->n_pins);
        x[6] = field_u64("n_entries",
                         b->parsed ? dp__blob_count(b->parsed) : b->n_entries_decl);
        x[7] = ff64("created_at", b->created_at);
        x[8] = ff64("last_resolve_at", b->last_resolve_at);
        x[9] = (dp__wire_field){dp__zview("in_slab"),
                                DP_WIRE_BOOL,
                                {.b = b->area == REC_AREA_PUT && !(b->flags & REC_DISK)}};
        x[10] = (dp__wire_field){
            dp__zview("disk"), DP_WIRE_BOOL, {.b = (b->flags & REC_DISK) != 0}};
        x[11] = (dp__wire_field){
            dp__zview("staged"), DP_WIRE_BOOL, {.b = (b->flags & REC_STAGED) != 0}};
        r[k].v = x;
        r[k].n = SCAN_FIELDS;
        k++;
    }
    if (k == 0) {
        free(r);
        free(f);
        return 0;
    }
    *recs = r;
    *n = (uint32_t)k;
    return 0;
}

void
dp__unit_fields_free(dp__wire_fields *recs, uint32_t n)
{
    if (recs == NULL)
        return;
    (void)n;
    free(recs[0].v);
    free(recs);
}

void
dp__unit_get_stats_locked(dp__unit *u, dp__unit_stats *st)
{
    /* What the unit counts as it goes ... */
    *st = u->stats;
    /* ... and what is read off its options, tables, allocators and writers. */
    st->unit_id = u->o.unit_id;
    st->n_units = u->o.n_units;
    st->slab_bytes = u->o.slab_bytes;
    st->blobs = dp__map_len(&u->blobs);
    st->rows = dp__map_len(&u->rows);
    st->pins = dp__map_len(&u->pins);
    st->auth_refused = u->auth_fn != NULL ? u->auth_fn(u->auth_src) : 0;
    st->replicas = u->o.replicas;
    st->repair_state = (uint64_t)u->repair_state;
    st->repair_cleared = dp__map_len(&u->tombs);
    st->lease_ok = dp__lease_reads_ok_locked(u, dp__unit_now(u));
    dp__writers_stats ws;
    dp__writers_get_stats(u->writers, &ws);
    st->retired_bytes = ws.retired_bytes;
    st->n_retired = ws.retired;
    st->retired_kept_bytes = ws.retired_kept_bytes;
    st->reclaimed_bytes = ws.reclaimed_bytes;
    st->n_reclaimed = ws.reclaimed;
    st->writers = ws.writers;
    st->writers_gone = ws.writers_gone;
    dp__slab_alloc_stats as;
    dp__slab_alloc_get_stats(u->alloc, &as);
    st->allocated_bytes = as.allocated_bytes;
    st->free_bytes = as.free_bytes;
    st->quarantined_bytes = as.quarantined_bytes;
    st->largest_free = as.largest_free;
    st->io_bytes = u->ssd ? u->o.staging_bytes : 0; /* as dp__unit_io_bytes */
    if (u->io_alloc != NULL) {
        dp__slab_alloc_get_stats(u->io_alloc, &as);
        st->io_allocated_bytes = as.allocated_bytes;
        st->io_free_bytes = as.free_bytes;
        st->io_quarantined_bytes = as.quarantined_bytes;
    }
    st->io_jobs = u->q_n + u->n_running;
    st->admin_running = u->n_admin;
}

void
dp__unit_get_stats(dp__unit *u, dp__unit_stats *st)
{
    pthread_mutex_lock(&u->mu);
    dp__unit_get_stats_locked(u, st);
    pthread_mutex_unlock(&u->mu);
}

#define STATS_COUNT(field, wire) +1
enum { N_STATS = 0 DP_UNIT_STATS(STATS_COUNT) };
#undef STATS_COUNT

int
dp__unit_stats_locked(dp__unit *u, dp__wire_fields *fields, dp_detail *d)
{
    dp__unit_stats s;
    dp__unit_get_stats_locked(u, &s);
    dp__wire_field *f = calloc(N_STATS, sizeof *f);
    if (f == NULL)
        return dp__fail(d, DP_ENOMEM, "stats: out of memory");
    uint32_t k = 0;
#define STATS_FIELD(field, wire) f[k++] = field_u64(wire, s.field);
    DP_UNIT_STATS(STATS_FIELD)
#undef STATS_FIELD
    DP_ASSERT(k == N_STATS);
    fields->v = f;
    fields->n = k;
    return 0;
}

void
dp__unit_report_locked(dp__unit *u, double now, char *line, size_t cap, char *ssd_line,
                       size_t ssd_cap)
{
    line[0] = '\0';
    ssd_line[0] = '\0';
    if (now - u->last_report < 30.0)
        return;
    dp__unit_stats st;
    dp__unit_get_stats_locked(u, &st);
    uint64_t sig = st.n_alloc * 1000003u ^ st.n_commit * 10007u ^ st.n_release * 101u ^
                   st.n_resolve * 7u ^ st.n_retired ^ st.pins_expired * 31u;
    if (sig != u->report_sig) {
        char a[32], f[32], q[32], r[32];
        snprintf(line, cap,
                 "unit %u: %" PRIu64 " blobs, %" PRIu64 " entries, %" PRIu64
                 " pins; allocated %s, free %s, quarantined %s, retired %s",
                 u->o.unit_id, st.published, st.entries, st.pins,
                 dp__fmt_size(st.allocated_bytes, a, sizeof a),
                 dp__fmt_size(st.free_bytes, f, sizeof f),
                 dp__fmt_size(st.quarantined_bytes, q, sizeof q),
                 dp__fmt_size(st.retired_bytes, r, sizeof r));
        u->report_sig = sig;
    }
    uint64_t ssig = st.spills * 1000003u ^ st.stages * 10007u ^ st.evictions * 101u ^
                    st.spills_failed * 7u ^ st.stages_failed * 31u ^ st.disk_blobs;
    if (u->ssd && ssig != u->ssd_report_sig) {
        char a[32], b[32], c[32], e[32];
        snprintf(ssd_line, ssd_cap,
                 "unit %u ssd: %" PRIu64 " spills (%s), %" PRIu64 " failed; %" PRIu64
                 " stages (%s), %" PRIu64 " failed; %" PRIu64 " evictions; %" PRIu64
                 " disk blobs (%s), %" PRIu64 " staged (%s), %" PRIu64 " io jobs",
                 u->o.unit_id, st.spills, dp__fmt_size(st.spill_bytes, a, sizeof a),
                 st.spills_failed, st.stages, dp__fmt_size(st.stage_bytes, b, sizeof b),
                 st.stages_failed, st.evictions, st.disk_blobs,
                 dp__fmt_size(st.disk_bytes, c, sizeof c), st.staged_blobs,
                 dp__fmt_size(st.staged_bytes, e, sizeof e), st.io_jobs);
        u->ssd_report_sig = ssig;
    }
    u->last_report = now;
}

int
dp__unit_read_bytes_locked(dp__unit *u, uint64_t off, uint64_t nbytes, const uint8_t **p,
                           dp_detail *d)
{
    bool in_put = off <= u->o.slab_bytes && nbytes <= u->o.slab_bytes - off;
    bool in_io = u->ssd && off >= u->io_base && off - u->io_base <= u->o.staging_bytes &&
                 nbytes <= u->o.staging_bytes - (off - u->io_base);
    if (!in_put && !in_io)
        return dp__fail(d, DP_EPROTO,
                        "read_bytes: [%" PRIu64 ", +%" PRIu64 ") is outside the %" PRIu64
                        "-byte slab and the %" PRIu64 "-byte IO area at %" PRIu64,
                        off, nbytes, u->o.slab_bytes, dp__unit_io_bytes(u), u->io_base);
    *p = u->slab + off;
    return 0;
}

void
dp__unit_info_locked(dp__unit *u, dp__wire_info *info)
{
    memset(info, 0, sizeof *info);
    info->unit_id = u->o.unit_id;
    info->n_units = u->o.n_units;
    info->replicas = u->o.replicas;
    info->lease_ms = (uint64_t)(u->o.lease_s * 1000);
    info->zmq = dp__zview(u->address);
    info->agent = dp__zview(u->o.ep != NULL ? dp__endpoint_name(u->o.ep) : "");
    info->metadata = (dp__wire_bytes){(const uint8_t *)"", 0};
    info->slab_bytes = u->o.slab_bytes;
    info->io_bytes = dp__unit_io_bytes(u);
    info->numa = dp__zview(u->numa_desc);
    info->slab_addr = (uint64_t)(uintptr_t)u->slab;
    info->read_pin_ms = (uint64_t)(u->o.read_pin_s * 1000.0);
    info->incarnation = u->incarnation;
    info->proto = DP_WIRE_PROTO;
    info->pid = (uint64_t)getpid();
    info->host = dp__zview(dp__host_key());
    info->cluster = dp__zview(u->cluster_id);
    info->transports = dp__zview(u->transports);
}
