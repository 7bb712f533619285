/*
 * Fixtures of the in-process unit tests (test_unit, test_unit_handler and the
 * blob builder of test_unit_zmq): a unit on a fake clock, blobs of patterned
 * entries, a put (alloc, WRITE, commit) and the location of one key; the SSD
 * tier's fixtures (dp_unit_ssd_fixture.h) build their blobs as its tblob.
 * Include after dp_test.h (CHECK) and dp_unit_blob.h.
 */
#ifndef DP_UNIT_FIXTURE_H
#define DP_UNIT_FIXTURE_H

#include <stdlib.h>
#include <string.h>

#include "dp_unit_blob.h"

#include "blob/blob.h"
#include "common/common.h"
#include "unit/unit.h"
#include "wire/wire.h"

/* ---- fake clock ---- */

static double fake_t = 1000.0;

static inline double
fake_now(void *ctx)
{
    (void)ctx;
    return fake_t;
}

static inline dp__unit *
mk_unit(uint64_t slab, uint32_t n_units, uint32_t unit_id)
{
    dp__unit_opts o;
    dp__unit_opts_init(&o);
    o.slab_bytes = slab;
    o.n_units = n_units;
    o.unit_id = unit_id;
    o.read_pin_s = 10;
    o.alloc_lease_s = 60;
    o.quarantine_s = 5;
    o.numa = DP_UNIT_NUMA_OFF;
    o.now = fake_now;
    dp__unit *u = NULL;
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_OK_D(dp__unit_create(&o, &u, &d), &d);
    return u;
}

/* ---- blobs ---- */

typedef struct tblob {
    uint8_t *p;
    uint64_t len;
    uint32_t n;
} tblob;

/*
 * Unit unit_id of n_units keeping `replicas` copies; repair as asked; read
 * leases of lease_s (0: none; docs/design.md, "Leases").
 */
static inline dp__unit *
mk_replica_unit_lease(uint32_t n_units, uint32_t unit_id, uint32_t replicas, bool repair,
                      double lease_s)
{
    dp__unit_opts o;
    dp__unit_opts_init(&o);
    o.slab_bytes = 1 << 20;
    o.n_units = n_units;
    o.unit_id = unit_id;
    o.replicas = replicas;
    o.repair = repair;
    o.lease_s = lease_s;
    o.numa = DP_UNIT_NUMA_OFF;
    o.now = fake_now;
    dp__unit *u = NULL;
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_OK_D(dp__unit_create(&o, &u, &d), &d);
    return u;
}

/* Unit unit_id of n_units keeping `replicas` copies; repair as asked. */
static inline dp__unit *
mk_replica_unit(uint32_t n_units, uint32_t unit_id, uint32_t replicas, bool repair)
{
    return mk_replica_unit_lease(n_units, unit_id, replicas, repair, 0);
}

/* Request q through the unit's control handler; its reply decoded into rep. */
static inline void
handler_call(dp__unit *u, const dp__wire_request *q, dp__wire_reply *rep, dp__buf *out)
{
    dp__buf in = {0};
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_OK_D(dp__wire_request_encode(q, NULL, &in, &d), &d);
    dp__buf_reset(out);
    dp__unit_handle(u, in.data, in.len, out);
    CHECK(out->len > 0);
    CHECK_OK_D(dp__wire_reply_decode(out->data, out->len, q->op, NULL, rep, &d), &d);
    dp__buf_fini(&in);
}

/*
 * A blob with one entry per key; entry i carries plen bytes of a pattern seeded
 * by (seed, i), as a float32 tensor of shape [plen / 4] (bytes when plen % 4).
 */
static inline tblob
mk_blob(const char *const *keys, uint32_t n, uint64_t plen, uint32_t seed)
{
    dp__blob_builder *b = NULL;
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_OK_D(dp__blob_builder_create(DP_BLOB_FLAG_CRC, &b, &d), &d);
    uint8_t *pay = malloc(n * plen + 1);
    for (uint32_t i = 0; i < n; i++) {
        for (uint64_t k = 0; k < plen; k++)
            pay[i * plen + k] = (uint8_t)(seed * 31 + i * 7 + k);
        uint64_t shape[1] = {plen / 4};
        dp__blob_entry_spec s = {0};
        s.key = keys[i];
        s.kind = plen % 4 == 0 ? DP_BLOB_TENSOR : DP_BLOB_BYTES;
        s.dtype = plen % 4 == 0 ? "float32" : "";
        s.shape = shape;
        s.ndim = plen % 4 == 0 ? 1 : 0;
        s.len = plen;
        s.payload = pay + i * plen;
        CHECK_OK_D(dp__blob_builder_add(b, &s, NULL, &d), &d);
    }
    dp__blob_layout lay;
    CHECK_OK_D(dp__blob_builder_layout(b, &lay, &d), &d);
    tblob t = {calloc(1, lay.total_len), lay.total_len, n};
    CHECK_OK_D(dp__blob_builder_write(b, t.p, lay.total_len, &d), &d);
    CHECK_OK_D(dp__blob_builder_copy_payloads(b, t.p, lay.total_len, &d), &d);
    dp__blob_builder_destroy(b);
    free(pay);
    return t;
}

/* alloc + "WRITE" (memcpy into the slab) + commit; returns the offset. */
static inline uint64_t
put_blob(dp__unit *u, const char *id, const tblob *t)
{
    uint64_t off = 0;
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_OK_D(dp_test_unit_alloc(u, id, strlen(id), t->len, t->n, false, &off, NULL, &d),
               &d);
    dp_test_write_blob(u, id, off, t->p, t->len);
    dp__wire_commit_state st = DP_WIRE_COMMIT_LOST;
    CHECK_OK_D(dp__unit_commit(u, id, strlen(id), &st, &d), &d);
    CHECK_EQ(st, DP_WIRE_COMMIT_DONE);
    return off;
}

static inline uint64_t
put_keys(dp__unit *u, const char *id, const char *const *keys, uint32_t n, uint64_t plen,
         uint32_t seed)
{
    tblob t = mk_blob(keys, n, plen, seed);
    uint64_t off = put_blob(u, id, &t);
    free(t.p);
    return off;
}

/* resolve_keys of one key: its slab offset and length; false if missing. */
static inline bool
locate(dp__unit *u, const char *key, uint64_t *off, uint64_t *len, char pin[33])
{
    dp__unit_resolve_keys_res r;
    dp__wire_str k = dp__wire_s(key);
    dp_detail d;
    dp_detail_clear(&d);
    dp__unit_lock(u);
    int rc = dp__unit_resolve_keys_locked(u, &k, 1, &r, &d);
    dp__unit_unlock(u);
    CHECK_OK_D(rc, &d);
    bool found = r.n_entries == 1;
    if (found) {
        *off = r.entries[0].off;
        *len = r.entries[0].len;
    }
    if (pin != NULL)
        memcpy(pin, r.pin_id, 33);
    else if (r.pin_id[0])
        dp__unit_unpin(u, r.pin_id, strlen(r.pin_id));
    dp__unit_resolve_keys_res_fini(&r);
    return found;
}

#endif
