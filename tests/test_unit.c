/*
 * Tests for src/unit: the core (alloc, commit, resolve, release, overwrite,
 * pins, quarantine, leases, abort) against a fake clock; a randomised model
 * test of invariant 1 (no region is handed out again while a transfer into or
 * out of it may still run); the control-message handler fed encoded and
 * malformed messages; and a unit served over real ZMQ with real UCX transfers
 * from a client process, including a client killed between alloc and commit.
 */
#include "dp_test.h"
#include "dp_tsan_ucx.h"
#include "dp_proc.h"
#include "dp_unit_blob.h"

#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "blob/blob.h"
#include "blob/crc32c.h"
#include "common/common.h"
#include "ctl/ctl.h"
#include "unit/server.h"
#include "unit/unit.h"
#include "wire/mp.h"
#include "wire/wire.h"
#include "xfer/endpoint.h"
#include "xfer/metadata.h"

/* ---- fake clock ---- */

static double fake_t = 1000.0;

static double
fake_now(void *ctx)
{
    (void)ctx;
    return fake_t;
}

static dp_unit *
mk_unit(uint64_t slab, uint32_t n_units, uint32_t unit_id)
{
    dp_unit_opts o;
    dp__unit_opts_init(&o);
    o.slab_bytes = slab;
    o.n_units = n_units;
    o.unit_id = unit_id;
    o.read_pin_s = 10;
    o.alloc_lease_s = 60;
    o.quarantine_s = 5;
    o.numa = DP_UNIT_NUMA_OFF;
    o.now = fake_now;
    dp_unit *u = NULL;
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
 * A blob with one entry per key; entry i carries plen bytes of a pattern seeded
 * by (seed, i), as a float32 tensor of shape [plen / 4] (bytes when plen % 4).
 */
static tblob
mk_blob(const char *const *keys, uint32_t n, uint64_t plen, uint32_t seed)
{
    dp_blob_builder *b = NULL;
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_OK_D(dp__blob_builder_create(DP_BLOB_FLAG_CRC, &b, &d), &d);
    uint8_t *pay = malloc(n * plen + 1);
    for (uint32_t i = 0; i < n; i++) {
        for (uint64_t k = 0; k < plen; k++)
            pay[i * plen + k] = (uint8_t)(seed * 31 + i * 7 + k);
        uint64_t shape[1] = {plen / 4};
        dp_blob_entry_spec s = {0};
        s.key = keys[i];
        s.kind = plen % 4 == 0 ? DP_BLOB_TENSOR : DP_BLOB_BYTES;
        s.dtype = plen % 4 == 0 ? "float32" : "";
        s.shape = shape;
        s.ndim = plen % 4 == 0 ? 1 : 0;
        s.len = plen;
        s.payload = pay + i * plen;
        CHECK_OK_D(dp__blob_builder_add(b, &s, NULL, &d), &d);
    }
    dp_blob_layout lay;
    CHECK_OK_D(dp__blob_builder_layout(b, &lay, &d), &d);
    tblob t = {calloc(1, lay.total_len), lay.total_len, n};
    CHECK_OK_D(dp__blob_builder_write(b, t.p, lay.total_len, &d), &d);
    CHECK_OK_D(dp__blob_builder_copy_payloads(b, t.p, lay.total_len, &d), &d);
    dp__blob_builder_destroy(b);
    free(pay);
    return t;
}

/* alloc + "WRITE" (memcpy into the slab) + commit; returns the offset. */
static uint64_t
put_blob(dp_unit *u, const char *id, const tblob *t)
{
    uint64_t off = 0;
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_OK_D(dp__unit_alloc(u, id, strlen(id), t->len, t->n, &off, NULL, &d), &d);
    dp_test_write_blob(u, id, off, t->p, t->len);
    dp_wire_commit_state st = DP_WIRE_COMMIT_LOST;
    CHECK_OK_D(dp__unit_commit(u, id, strlen(id), &st, &d), &d);
    CHECK_EQ(st, DP_WIRE_COMMIT_DONE);
    return off;
}

static uint64_t
put_keys(dp_unit *u, const char *id, const char *const *keys, uint32_t n, uint64_t plen,
         uint32_t seed)
{
    tblob t = mk_blob(keys, n, plen, seed);
    uint64_t off = put_blob(u, id, &t);
    free(t.p);
    return off;
}

/* resolve_keys of one key: its slab offset and length; false if missing. */
static bool
locate(dp_unit *u, const char *key, uint64_t *off, uint64_t *len, char pin[33])
{
    dp_unit_resolve_keys_res r;
    dp_wire_str k = dp__wire_s(key);
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

/* ---- core tests ---- */

DP_TEST(put_resolve_read)
{
    dp_unit *u = mk_unit(1 << 20, 2, 0);
    const char *keys[] = {"0@input_ids", "2@input_ids", "4@reward"};
    tblob t = mk_blob(keys, 3, 256, 5);
    uint64_t off = put_blob(u, "b1", &t);

    dp_wire_str q[] = {dp__wire_s("2@input_ids"), dp__wire_s("0@input_ids"),
                       dp__wire_s("6@input_ids"), dp__wire_s("4@reward"),
                       dp__wire_s("0@nope")};
    dp_unit_resolve_keys_res r;
    dp_detail d;
    dp_detail_clear(&d);
    dp__unit_lock(u);
    CHECK_OK_D(dp__unit_resolve_keys_locked(u, q, 5, &r, &d), &d);
    dp__unit_unlock(u);
    CHECK_EQ(r.n_entries, 3);
    CHECK_EQ(r.n_missing, 2);
    CHECK(r.pin_id[0] != '\0');
    CHECK(dp__wire_str_eq(r.missing[0], "6@input_ids"));
    CHECK(dp__wire_str_eq(r.missing[1], "0@nope"));
    for (uint32_t i = 0; i < r.n_entries; i++) {
        dp_wire_key_loc *l = &r.entries[i];
        CHECK_EQ(l->len, 256);
        CHECK(dp__wire_str_eq(l->kind, "tensor"));
        CHECK(dp__wire_str_eq(l->dtype, "float32"));
        CHECK_EQ(l->ndim, 1);
        CHECK_EQ(l->shape[0], 64);
        CHECK(l->off >= off && l->off + l->len <= off + t.len);
        /* The bytes at the resolved offset are that key's payload. */
        uint32_t idx = dp__wire_str_eq(l->key, "0@input_ids")   ? 0
                       : dp__wire_str_eq(l->key, "2@input_ids") ? 1
                                                                : 2;
        const uint8_t *p = dp__unit_slab(u) + l->off;
        for (uint64_t k = 0; k < 256; k++)
            CHECK_EQ(p[k], (uint8_t)(5 * 31 + idx * 7 + k));
    }
    dp_unit_stats s = dp_test_unit_stats(u);
    CHECK_EQ(s.pins, 1);
    CHECK_EQ(s.entries, 3);
    CHECK_EQ(s.rows, 3);
    dp__unit_unpin(u, r.pin_id, strlen(r.pin_id));
    dp__unit_unpin(u, r.pin_id, strlen(r.pin_id)); /* unknown now: no-op */
    dp__unit_unpin(u, "nope", 4);
    CHECK_EQ(dp_test_unit_stats(u).pins, 0);
    dp__unit_resolve_keys_res_fini(&r);

    /* resolve by blob id */
    dp_wire_str ids[] = {dp__wire_s("b1"), dp__wire_s("zz"), dp__wire_s("b1")};
    dp_unit_resolve_res rr;
    dp__unit_lock(u);
    CHECK_OK_D(dp__unit_resolve_locked(u, ids, 3, &rr, &d), &d);
    dp__unit_unlock(u);
    CHECK_EQ(rr.n_blobs, 2);
    CHECK_EQ(rr.blobs[0].off, off);
    CHECK_EQ(rr.blobs[0].len, t.len);
    CHECK_EQ(rr.n_missing, 1);
    CHECK_EQ(dp_test_unit_stats(u).pins, 1);
    dp_test_unit_check(u);
    dp__unit_unpin(u, rr.pin_id, strlen(rr.pin_id));
    dp__unit_resolve_res_fini(&rr);

    /* A key of another unit or a malformed key is a Protocol error. */
    dp_wire_str bad[] = {dp__wire_s("0@input_ids"), dp__wire_s("1@input_ids")};
    dp__unit_lock(u);
    CHECK_ERR(dp__unit_resolve_keys_locked(u, bad, 2, &r, &d), DP_EPROTO);
    bad[1] = dp__wire_s("01@x");
    CHECK_ERR(dp__unit_resolve_keys_locked(u, bad, 2, &r, &d), DP_EPROTO);
    dp__unit_unlock(u);
    CHECK_EQ(dp_test_unit_stats(u).pins, 0);
    dp_test_unit_check(u);
    free(t.p);
    dp__unit_destroy(u);
}

DP_TEST(commit_idempotent_and_lost)
{
    dp_unit *u = mk_unit(1 << 20, 1, 0);
    const char *keys[] = {"1@a"};
    put_keys(u, "b", keys, 1, 64, 1);
    dp_wire_commit_state st;
    CHECK_OK(dp__unit_commit(u, "b", 1, &st, NULL));
    CHECK_EQ(st, DP_WIRE_COMMIT_DONE);
    CHECK_OK(dp__unit_commit(u, "nope", 4, &st, NULL));
    CHECK_EQ(st, DP_WIRE_COMMIT_LOST);
    CHECK_EQ(dp_test_unit_stats(u).n_commit, 1);
    /* an alloc for a committed id is refused; abort of a published blob is a no-op */
    uint64_t off;
    CHECK_ERR(dp__unit_alloc(u, "b", 1, 64, 0, &off, NULL, NULL), DP_EPROTO);
    dp__unit_abort(u, "b", 1, true);
    CHECK_EQ(dp_test_unit_stats(u).published, 1);
    CHECK_EQ(dp_test_unit_stats(u).retired_bytes, 0);
    /* bad ids */
    CHECK_ERR(dp__unit_alloc(u, "a/b", 3, 64, 0, &off, NULL, NULL), DP_EPROTO);
    CHECK_ERR(dp__unit_alloc(u, "", 0, 64, 0, &off, NULL, NULL), DP_EPROTO);
    CHECK_ERR(dp__unit_alloc(u, "x", 1, 0, 0, &off, NULL, NULL), DP_EPROTO);
    CHECK_ERR(dp__unit_alloc(u, "x", 1, 2 << 20, 0, &off, NULL, NULL), DP_EPROTO);
    /* release of the row: the commit is lost from then on */
    uint64_t g = 1;
    CHECK_EQ(dp__unit_release_rows(u, &g, 1), 1);
    CHECK_OK(dp__unit_commit(u, "b", 1, &st, NULL));
    CHECK_EQ(st, DP_WIRE_COMMIT_LOST);
    dp_test_unit_check(u);
    dp__unit_destroy(u);
}

DP_TEST(alloc_retry_same_id)
{
    dp_unit *u = mk_unit(1 << 20, 1, 0);
    uint64_t a, b;
    CHECK_OK(dp__unit_alloc(u, "x", 1, 1000, 0, &a, NULL, NULL));
    CHECK_OK(dp__unit_alloc(u, "x", 1, 1000, 0, &b, NULL, NULL));
    CHECK_EQ(a, b);
    CHECK_ERR(dp__unit_alloc(u, "x", 1, 2000, 0, &b, NULL, NULL), DP_EPROTO);
    CHECK_EQ(dp_test_unit_stats(u).blobs, 1);
    dp_test_unit_check(u);
    dp__unit_destroy(u);
}

DP_TEST(overwrite_and_release)
{
    dp_unit *u = mk_unit(1 << 20, 1, 0);
    const char *k1[] = {"0@x", "1@x", "1@y"};
    const char *k2[] = {"0@x"};
    uint64_t off1 = put_keys(u, "b1", k1, 3, 100, 1);
    uint64_t off2 = put_keys(u, "b2", k2, 1, 100, 2);
    CHECK(off1 != off2);
    uint64_t o, l;
    CHECK(locate(u, "0@x", &o, &l, NULL));
    CHECK(o >= off2 && o < off2 + 4096); /* 0@x now in b2 */
    CHECK(locate(u, "1@x", &o, &l, NULL));
    CHECK(o >= off1 && o < off1 + 4096);
    CHECK_EQ(dp_test_unit_stats(u).published, 2);
    CHECK_EQ(dp_test_unit_stats(u).entries, 3);
    dp_test_unit_check(u);
    /* Row 1 holds b1's last two refs: releasing it frees b1 at once (no pins). */
    uint64_t allocated = dp_test_unit_stats(u).allocated_bytes;
    uint64_t g[] = {1, 77, 1};
    CHECK_EQ(dp__unit_release_rows(u, g, 3), 2);
    CHECK_EQ(dp_test_unit_stats(u).published, 1);
    CHECK(dp_test_unit_stats(u).allocated_bytes < allocated);
    CHECK_EQ(dp_test_unit_stats(u).quarantined_bytes, 0);
    CHECK(!locate(u, "1@x", &o, &l, NULL));
    CHECK_EQ(dp__unit_release_rows(u, g, 3), 0);
    /* Overwrite b2's only key with b3: b2 is freed. */
    put_keys(u, "b3", k2, 1, 50, 3);
    CHECK_EQ(dp_test_unit_stats(u).published, 1);
    CHECK(locate(u, "0@x", &o, &l, NULL));
    CHECK_EQ(l, 50);
    dp_test_unit_check(u);
    uint64_t g0 = 0;
    CHECK_EQ(dp__unit_release_rows(u, &g0, 1), 1);
    CHECK_EQ(dp_test_unit_stats(u).allocated_bytes, 0);
    CHECK_EQ(dp_test_unit_stats(u).rows, 0);
    dp_test_unit_check(u);
    dp__unit_destroy(u);
}

/* Corrupt copies of a valid blob: each is refused and publishes nothing. */
DP_TEST(commit_rejects_bad_blobs)
{
    dp_unit *u = mk_unit(1 << 20, 2, 1);
    const char *keys[] = {"1@a", "3@a"};
    tblob t = mk_blob(keys, 2, 128, 9);
    const char *other[] = {"1@a", "2@a"}; /* 2 belongs to unit 0 */
    tblob t_other = mk_blob(other, 2, 128, 9);
    struct {
        const char *what;
        size_t at; /* byte to flip, or SIZE_MAX */
        tblob *src;
        uint64_t decl; /* n_entries announced at alloc */
    } cases[] = {
        {"bad magic", 0, &t, 2},
        {"bad version", 8, &t, 2},
        {"index crc", 40, &t, 2},
        {"index byte (the index lies)", 70, &t, 2},
        {"total_len", 32, &t, 2},
        {"names another incarnation", 48, &t, 2},
        {"names another allocation (stale bytes)", 56, &t, 2},
        {"key of another unit", SIZE_MAX, &t_other, 2},
        {"entry count differs from alloc", SIZE_MAX, &t, 3},
    };
    for (size_t c = 0; c < DP_ARRAY_LEN(cases); c++) {
        char id[16];
        snprintf(id, sizeof id, "bad%zu", c);
        uint64_t off;
        tblob *s = cases[c].src;
        CHECK_OK(
            dp__unit_alloc(u, id, strlen(id), s->len, cases[c].decl, &off, NULL, NULL));
        dp_test_write_blob(u, id, off, s->p, s->len);
        if (cases[c].at != SIZE_MAX)
            dp__unit_slab(u)[off + cases[c].at] ^= 0x5a;
        dp_wire_commit_state st;
        dp_detail d;
        dp_detail_clear(&d);
        int rc = dp__unit_commit(u, id, strlen(id), &st, &d);
        CHECKF(rc == DP_EPROTO, "%s: got %s", cases[c].what, dp_errname(rc));
        CHECK(dp_detail_msg(&d)[0] != '\0');
        CHECK_EQ(dp_test_unit_stats(u).published, 0);
        CHECK_EQ(dp_test_unit_stats(u).entries, 0);
        dp_test_unit_check(u);
        /* The allocation stays; a good blob written there later commits. */
        if (c == 0) {
            dp_test_write_blob(u, id, off, t.p, t.len);
            CHECK_OK(dp__unit_commit(u, id, strlen(id), &st, NULL));
            CHECK_EQ(st, DP_WIRE_COMMIT_DONE);
            uint64_t g[] = {1, 3};
            CHECK_EQ(dp__unit_release_rows(u, g, 2), 2);
        } else {
            dp__unit_abort(u, id, strlen(id), false);
        }
    }
    CHECK_EQ(dp_test_unit_stats(u).allocated_bytes, 0);
    CHECK(dp_test_unit_stats(u).n_proto >= DP_ARRAY_LEN(cases));
    free(t.p);
    free(t_other.p);
    dp__unit_destroy(u);
}

DP_TEST(abort_semantics)
{
    dp_unit *u = mk_unit(1 << 20, 1, 0);
    uint64_t a, b;
    CHECK_OK(dp__unit_alloc(u, "a", 1, 1000, 0, &a, NULL, NULL));
    CHECK_OK(dp__unit_alloc(u, "b", 1, 1000, 0, &b, NULL, NULL));
    dp__unit_abort(u, "a", 1, false); /* freed */
    dp__unit_abort(u, "b", 1, true);  /* retired */
    dp__unit_abort(u, "zz", 2, true); /* unknown: no-op */
    dp_unit_stats s = dp_test_unit_stats(u);
    CHECK_EQ(s.blobs, 0);
    CHECK_EQ(s.retired_bytes, 1024);
    CHECK_EQ(s.n_retired, 1);
    CHECK_EQ(s.allocated_bytes, 1024); /* the retired region is never freed */
    dp_wire_commit_state st;
    CHECK_OK(dp__unit_commit(u, "b", 1, &st, NULL));
    CHECK_EQ(st, DP_WIRE_COMMIT_LOST);
    /* The retired region is never handed out again: fill the slab. */
    for (int i = 0;; i++) {
        char id[16];
        snprintf(id, sizeof id, "f%d", i);
        uint64_t off;
        int rc = dp__unit_alloc(u, id, strlen(id), 1000, 0, &off, NULL, NULL);
        if (rc != 0) {
            CHECK_EQ(rc, DP_EUNITFULL);
            break;
        }
        CHECK(off + 1024 <= b || off >= b + 1024);
    }
    dp_test_unit_check(u);
    dp__unit_destroy(u);
}

DP_TEST(lease_expiry_retires)
{
    dp_unit *u = mk_unit(1 << 20, 1, 0);
    uint64_t a;
    CHECK_OK(dp__unit_alloc(u, "late", 4, 5000, 0, &a, NULL, NULL));
    fake_t += 59;
    dp__unit_tick(u);
    CHECK_EQ(dp_test_unit_stats(u).blobs, 1);
    fake_t += 2;
    dp__unit_tick(u);
    dp_unit_stats s = dp_test_unit_stats(u);
    CHECK_EQ(s.blobs, 0);
    CHECK_EQ(s.leases_expired, 1);
    CHECK_EQ(s.retired_bytes, 5056);
    CHECK_EQ(s.allocated_bytes, 5056);
    /* The writer comes back too late: its commit is lost. */
    const char *keys[] = {"0@a"};
    tblob t = mk_blob(keys, 1, 64, 1);
    memcpy(dp__unit_slab(u) + a, t.p, t.len);
    dp_wire_commit_state st;
    CHECK_OK(dp__unit_commit(u, "late", 4, &st, NULL));
    CHECK_EQ(st, DP_WIRE_COMMIT_LOST);
    /* Committed blobs are not subject to the lease. */
    put_blob(u, "ok", &t);
    fake_t += 1000;
    dp__unit_tick(u);
    CHECK_EQ(dp_test_unit_stats(u).published, 1);
    free(t.p);
    dp_test_unit_check(u);
    dp__unit_destroy(u);
}

/* Invariant 1: a released blob's region is not reused while it is pinned. */
DP_TEST(no_reuse_while_pinned)
{
    dp_unit *u = mk_unit(64 * 1024, 1, 0);
    const char *keys[] = {"0@a"};
    tblob t = mk_blob(keys, 1, 60 * 1024, 1);
    uint64_t off = put_blob(u, "big", &t);
    char pin[33];
    uint64_t o, l;
    CHECK(locate(u, "0@a", &o, &l, pin));
    uint64_t g = 0;
    CHECK_EQ(dp__unit_release_rows(u, &g, 1), 1);
    dp_unit_stats s = dp_test_unit_stats(u);
    CHECK_EQ(s.zombies, 1);
    CHECK_EQ(s.zombie_bytes, t.len);
    CHECK_EQ(s.published, 0);
    dp_test_unit_check(u);
    /* No room while the reader holds its pin: Busy (pins), not UnitFull. */
    uint64_t a;
    const char *reason = NULL;
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_ERR_D(dp__unit_alloc(u, "n", 1, 32 * 1024, 0, &a, &reason, &d), DP_EBUSY, &d);
    CHECK_STR(reason, "pins");
    /* The reader still sees its bytes (nobody wrote there). */
    CHECK_EQ(memcmp(dp__unit_slab(u) + off, t.p, 48), 0); /* 48..63: the alloc's name */
    CHECK_EQ(memcmp(dp__unit_slab(u) + off + 64, t.p + 64, t.len - 64), 0);
    /* The reader is done: the region is free at once. */
    dp__unit_unpin(u, pin, strlen(pin));
    CHECK_EQ(dp_test_unit_stats(u).zombies, 0);
    CHECK_EQ(dp_test_unit_stats(u).quarantined_bytes, 0);
    CHECK_OK(dp__unit_alloc(u, "n", 1, 32 * 1024, 0, &a, NULL, NULL));
    CHECK_EQ(a, off);
    /* Now really full and nothing pending: UnitFull. */
    CHECK_ERR(dp__unit_alloc(u, "m", 1, 40 * 1024, 0, &a, NULL, NULL), DP_EUNITFULL);
    CHECK_EQ(dp_test_unit_stats(u).n_full, 1);
    dp_test_unit_check(u);
    free(t.p);
    dp__unit_destroy(u);
}

/* A pin that expires sends its region through quarantine before reuse. */
DP_TEST(pin_expiry_quarantine)
{
    dp_unit *u = mk_unit(64 * 1024, 1, 0);
    const char *keys[] = {"0@a"};
    tblob t = mk_blob(keys, 1, 60 * 1024, 1);
    uint64_t off = put_blob(u, "big", &t);
    char pin[33];
    uint64_t o, l;
    CHECK(locate(u, "0@a", &o, &l, pin));
    uint64_t g = 0;
    dp__unit_release_rows(u, &g, 1);
    fake_t += 9.5;
    dp__unit_tick(u);
    CHECK_EQ(dp_test_unit_stats(u).pins, 1);
    fake_t += 1;
    dp__unit_tick(u); /* the pin expired (10 s): quarantine for 5 s */
    dp_unit_stats s = dp_test_unit_stats(u);
    CHECK_EQ(s.pins, 0);
    CHECK_EQ(s.pins_expired, 1);
    CHECK_EQ(s.zombies, 0);
    CHECK_EQ(s.quarantined_bytes, t.len);
    uint64_t a;
    const char *reason = NULL;
    CHECK_ERR(dp__unit_alloc(u, "n", 1, 8192, 0, &a, &reason, NULL), DP_EBUSY);
    CHECK_STR(reason, "quarantine");
    /* Unpinning the expired pin later is a no-op. */
    dp__unit_unpin(u, pin, strlen(pin));
    fake_t += 4;
    dp__unit_tick(u);
    CHECK_ERR(dp__unit_alloc(u, "n", 1, 8192, 0, &a, NULL, NULL), DP_EBUSY);
    fake_t += 1.5;
    /* alloc sweeps due quarantine itself, without waiting for the ticker. */
    CHECK_OK(dp__unit_alloc(u, "n", 1, 8192, 0, &a, NULL, NULL));
    CHECK_EQ(a, off);
    dp_test_unit_check(u);
    free(t.p);
    dp__unit_destroy(u);
}

/* A live blob whose pin expired is quarantined when released later, unpinned. */
DP_TEST(expired_pin_then_release)
{
    dp_unit *u = mk_unit(64 * 1024, 1, 0);
    const char *keys[] = {"0@a"};
    tblob t = mk_blob(keys, 1, 1000, 1);
    put_blob(u, "b", &t);
    uint64_t o, l;
    char pin[33];
    CHECK(locate(u, "0@a", &o, &l, pin));
    fake_t += 11;
    dp__unit_tick(u);
    CHECK_EQ(dp_test_unit_stats(u).pins, 0);
    CHECK_EQ(dp_test_unit_stats(u).quarantined_bytes, 0); /* still live */
    uint64_t g = 0;
    dp__unit_release_rows(u, &g, 1);
    CHECK_EQ(dp_test_unit_stats(u).quarantined_bytes, t.len);
    fake_t += 6;
    dp__unit_tick(u);
    CHECK_EQ(dp_test_unit_stats(u).quarantined_bytes, 0);
    CHECK_EQ(dp_test_unit_stats(u).allocated_bytes, 0);
    dp_test_unit_check(u);
    free(t.p);
    dp__unit_destroy(u);
}

/* Two pins on one released blob: freed only when both end. */
DP_TEST(two_pins_one_blob)
{
    dp_unit *u = mk_unit(64 * 1024, 1, 0);
    const char *keys[] = {"0@a", "0@b"};
    tblob t = mk_blob(keys, 2, 1000, 1);
    put_blob(u, "b", &t);
    uint64_t o, l;
    char p1[33], p2[33];
    CHECK(locate(u, "0@a", &o, &l, p1));
    CHECK(locate(u, "0@b", &o, &l, p2));
    uint64_t g = 0;
    CHECK_EQ(dp__unit_release_rows(u, &g, 1), 2);
    CHECK_EQ(dp_test_unit_stats(u).zombies, 1);
    dp__unit_unpin(u, p1, strlen(p1));
    CHECK_EQ(dp_test_unit_stats(u).zombies, 1);
    CHECK_EQ(dp_test_unit_stats(u).allocated_bytes, t.len);
    dp_test_unit_check(u);
    dp__unit_unpin(u, p2, strlen(p2));
    CHECK_EQ(dp_test_unit_stats(u).zombies, 0);
    CHECK_EQ(dp_test_unit_stats(u).allocated_bytes, 0);
    /* The blob id is free for a new alloc even while a zombie is pinned. */
    CHECK(locate(u, "0@a", &o, &l, NULL) == false);
    put_blob(u, "b", &t);
    CHECK(locate(u, "0@a", &o, &l, p1));
    CHECK_EQ(dp__unit_release_rows(u, &g, 1), 2);
    put_blob(u, "b", &t);
    CHECK_EQ(dp_test_unit_stats(u).zombies, 1);
    dp_test_unit_check(u);
    free(t.p);
    dp__unit_destroy(u); /* frees the zombie through its pin */
}

/*
 * Model test of invariant 1: random allocs, writes, commits, aborts, resolves,
 * unpins, releases and clock steps. The model keeps every region a transfer
 * may still touch: uncommitted allocations (a WRITE may run), retired ones
 * (forever), regions of blobs read under a pin (until the pin is unpinned, or
 * until pin expiry + quarantine). No new allocation may overlap any of them.
 */
typedef struct mregion {
    uint64_t off, len;
    double until; /* INFINITY: until the model says otherwise */
    int kind;     /* 0 uncommitted, 1 retired, 2 read by pin */
    int pin;      /* for kind 2: model pin index */
    bool live;
} mregion;

DP_TEST(model_no_reuse_under_transfer)
{
    uint64_t seed = dp_test_seed();
    uint64_t rs = seed;
    dp_unit *u = mk_unit(384 * 1024, 1, 0);
    dp__log_set_level(DP_LOG_ERROR); /* lease expiries are expected here */
    enum { MAXR = 4096, MAXB = 64, MAXP = 64 };
    static mregion reg[MAXR];
    int nreg = 0;
    struct {
        char id[16];
        uint64_t off, len;
        bool used, committed;
    } blobs[MAXB];
    struct {
        char id[33];
        bool used;
        double t; /* when the pin was made */
    } pins[MAXP];
    memset(blobs, 0, sizeof blobs);
    memset(pins, 0, sizeof pins);
    int next_id = 0;
    /*
     * What the run exercised, asserted at the end: allocations checked
     * against live regions of each kind (uncommitted, retired, read by a
     * pin), commits, aborts with and without a WRITE in flight, pins made,
     * unpinned and expired.
     */
    struct {
        int allocs, vs_kind[3], commits, aborts, aborts_in_flight, pins, unpins, expired;
    } ran = {0};
    for (int step = 0; step < 4000; step++) {
        int op = (int)(dp_test_rand(&rs) % 12);
        if (op <= 2) { /* alloc */
            int bi = (int)(dp_test_rand(&rs) % MAXB);
            if (blobs[bi].used)
                continue;
            uint32_t nk = 1 + (uint32_t)(dp_test_rand(&rs) % 3);
            char kb[3][32];
            const char *keys[3];
            for (uint32_t k = 0; k < nk; k++) {
                snprintf(kb[k], sizeof kb[k], "%u@f%u",
                         (unsigned)(dp_test_rand(&rs) % 16), k);
                keys[k] = kb[k];
            }
            tblob t = mk_blob(keys, nk, 64 + dp_test_rand(&rs) % 8000, (uint32_t)step);
            snprintf(blobs[bi].id, sizeof blobs[bi].id, "m%d", next_id++);
            uint64_t off;
            int rc = dp__unit_alloc(u, blobs[bi].id, strlen(blobs[bi].id), t.len, nk,
                                    &off, NULL, NULL);
            if (rc != 0) {
                CHECKF(rc == DP_EBUSY || rc == DP_EUNITFULL, "alloc: %s", dp_errname(rc));
                free(t.p);
                continue;
            }
            ran.allocs++;
            bool vs[3] = {false, false, false};
            for (int r = 0; r < nreg; r++)
                vs[reg[r].kind] = vs[reg[r].kind] || reg[r].live;
            for (int k = 0; k < 3; k++)
                ran.vs_kind[k] += vs[k];
            for (int r = 0; r < nreg; r++)
                if (reg[r].live && off < reg[r].off + reg[r].len &&
                    reg[r].off < off + t.len)
                    CHECKF(false,
                           "step %d: alloc [%" PRIu64 ", +%" PRIu64
                           ") overlaps protected region %d [%" PRIu64 ", +%" PRIu64
                           ") kind %d",
                           step, off, t.len, r, reg[r].off, reg[r].len, reg[r].kind);
            dp_test_write_blob(u, blobs[bi].id, off, t.p, t.len);
            free(t.p);
            blobs[bi].used = true;
            blobs[bi].committed = false;
            blobs[bi].off = off;
            blobs[bi].len = t.len;
            if (nreg < MAXR)
                reg[nreg++] = (mregion){off, t.len, INFINITY, 0, -1, true};
        } else if (op <= 4) { /* commit or abort an uncommitted blob */
            int bi = (int)(dp_test_rand(&rs) % MAXB), tries = 0;
            while ((!blobs[bi].used || blobs[bi].committed) && tries++ < MAXB)
                bi = (bi + 1) % MAXB;
            if (!blobs[bi].used || blobs[bi].committed)
                continue;
            /* mostly commits; some aborts, an eighth of them with the WRITE in flight */
            int how = (int)(dp_test_rand(&rs) % 16);
            how = how < 12 ? 0 : how < 14 ? 3 : how < 15 ? 2 : 1;
            /* after: 0 = no longer protected, 1 = retired for ever */
            int after;
            if (how <= 1) {
                dp_wire_commit_state st;
                dp_detail d;
                dp_detail_clear(&d);
                CHECK_OK_D(
                    dp__unit_commit(u, blobs[bi].id, strlen(blobs[bi].id), &st, &d), &d);
                blobs[bi].committed = st == DP_WIRE_COMMIT_DONE;
                ran.commits += blobs[bi].committed;
                if (st != DP_WIRE_COMMIT_DONE)
                    blobs[bi].used = false; /* retired by the lease meanwhile */
                after = st == DP_WIRE_COMMIT_DONE ? 0 : 1;
            } else {
                dp__unit_abort(u, blobs[bi].id, strlen(blobs[bi].id), how == 2);
                blobs[bi].used = false;
                if (how == 2)
                    ran.aborts_in_flight++;
                else
                    ran.aborts++;
                after = how == 2 ? 1 : 0;
            }
            for (int r = 0; r < nreg; r++) {
                if (reg[r].live && reg[r].kind == 0 && reg[r].off == blobs[bi].off) {
                    reg[r].kind = 1;
                    reg[r].live = after == 1;
                }
            }
            if (!blobs[bi].used)
                memset(&blobs[bi], 0, sizeof blobs[bi]);
        } else if (op <= 6) { /* resolve a few keys, pin what they read */
            int pi = (int)(dp_test_rand(&rs) % MAXP);
            if (pins[pi].used)
                continue;
            char kb[4][32];
            dp_wire_str q[4];
            for (int k = 0; k < 4; k++) {
                snprintf(kb[k], sizeof kb[k], "%u@f%u",
                         (unsigned)(dp_test_rand(&rs) % 16),
                         (unsigned)(dp_test_rand(&rs) % 3));
                q[k] = dp__wire_s(kb[k]);
            }
            dp_unit_resolve_keys_res r;
            dp__unit_lock(u);
            CHECK_OK(dp__unit_resolve_keys_locked(u, q, 4, &r, NULL));
            dp__unit_unlock(u);
            for (uint32_t e = 0; e < r.n_entries && nreg < MAXR; e++)
                reg[nreg++] =
                    (mregion){r.entries[e].off, r.entries[e].len, INFINITY, 2, pi, true};
            if (r.pin_id[0]) {
                ran.pins++;
                pins[pi].used = true;
                pins[pi].t = fake_t;
                memcpy(pins[pi].id, r.pin_id, 33);
            }
            dp__unit_resolve_keys_res_fini(&r);
        } else if (op == 7) { /* unpin */
            int pi = (int)(dp_test_rand(&rs) % MAXP);
            if (!pins[pi].used)
                continue;
            dp__unit_unpin(u, pins[pi].id, strlen(pins[pi].id));
            pins[pi].used = false;
            ran.unpins++;
            for (int r = 0; r < nreg; r++)
                if (reg[r].kind == 2 && reg[r].pin == pi && isinf(reg[r].until))
                    reg[r].live = false;
        } else if (op == 8) { /* release rows */
            uint64_t g[2] = {dp_test_rand(&rs) % 16, dp_test_rand(&rs) % 16};
            dp__unit_release_rows(u, g, 2);
        } else if (op == 9) { /* time passes */
            fake_t += (double)(dp_test_rand(&rs) % 4000) / 1000.0;
            dp__unit_tick(u);
        } else { /* a committed blob whose rows are all gone may be reused: forget it */
            int bi = (int)(dp_test_rand(&rs) % MAXB);
            if (blobs[bi].used && blobs[bi].committed)
                memset(&blobs[bi], 0, sizeof blobs[bi]);
        }
        /*
         * A pin made at t expires at t + 10 (read_pin_s); the ticker drops it at
         * or after that and quarantines its released regions for 5 s more, so
         * nothing read under it may be reused before t + 15.
         */
        for (int pi = 0; pi < MAXP; pi++) {
            if (pins[pi].used && fake_t >= pins[pi].t + 15) {
                pins[pi].used = false;
                ran.expired++;
                for (int r = 0; r < nreg; r++)
                    if (reg[r].kind == 2 && reg[r].pin == pi)
                        reg[r].live = false;
            }
        }
        if ((step % 64) == 63) {
            CHECK_OK(dp__unit_check(u, NULL));
            /* compact the region list */
            int w = 0;
            for (int r = 0; r < nreg; r++)
                if (reg[r].live)
                    reg[w++] = reg[r];
            nreg = w;
        }
    }
    dp_unit_stats s = dp_test_unit_stats(u);
    printf(
        "  model: %d allocs (%d, %d, %d checked against live uncommitted, retired and "
        "pinned regions), %d commits, %d + %d aborts, %d pins, %d unpinned, %d expired; "
        "unit: %" PRIu64 " busy, %" PRIu64 " full, %" PRIu64 " retired, %" PRIu64
        " pins expired\n",
        ran.allocs, ran.vs_kind[0], ran.vs_kind[1], ran.vs_kind[2], ran.commits,
        ran.aborts, ran.aborts_in_flight, ran.pins, ran.unpins, ran.expired, s.n_busy,
        s.n_full, s.n_retired, s.pins_expired);
    /* The invariant was checked against every kind of region, often. */
    EXPECT_GE(ran.allocs, 300);
    EXPECT_GE(ran.vs_kind[0], 100);
    EXPECT_GE(ran.vs_kind[1], 100);
    EXPECT_GE(ran.vs_kind[2], 100);
    EXPECT_GE(ran.commits, 100);
    EXPECT_GE(ran.aborts, 10);
    EXPECT_GE(ran.aborts_in_flight, 5);
    EXPECT_GE(ran.pins, 100);
    EXPECT_GE(ran.unpins, 10);
    EXPECT_GE(ran.expired, 50);
    EXPECT_EQ_U64(s.n_commit, (uint64_t)ran.commits);
    dp__log_set_level(DP_LOG_INFO);
    dp_test_unit_check(u);
    dp__unit_destroy(u);
}

/* ---- the handler, fed encoded and malformed messages ---- */

static int
call_handler(dp_unit *u, const dp_wire_request *req, dp_wire_reply *rep, bool *replied)
{
    dp_buf in = {0}, out = {0};
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_OK_D(dp__wire_request_encode(req, NULL, &in, &d), &d);
    dp__unit_handle(u, in.data, in.len, &out);
    *replied = out.len > 0;
    int rc = 0;
    if (out.len > 0) {
        rc = dp__wire_reply_decode(out.data, out.len, req->op, NULL, rep, &d);
        CHECK_OK_D(rc, &d);
        CHECK(dp__wire_str_same(rep->rid, req->rid));
        /* the reply's views point into out: keep it alive with the reply */
        static dp_buf keep[64];
        static int nkeep;
        dp__buf_fini(&keep[nkeep % 64]);
        keep[nkeep++ % 64] = out;
        out = (dp_buf){0};
    }
    dp__buf_fini(&in);
    dp__buf_fini(&out);
    return rc;
}

DP_TEST(handler_ops)
{
    dp_unit *u = mk_unit(1 << 20, 1, 0);
    dp__unit_set_address(u, "tcp://127.0.0.1:1");
    dp_wire_request q;
    dp_wire_reply r;
    bool replied;
    memset(&q, 0, sizeof q);
    q.rid = dp__wire_s("r1");

    q.op = DP_WIRE_OP_PING;
    call_handler(u, &q, &r, &replied);
    CHECK(replied && r.ok);
    CHECK_EQ(r.r.unit_id, 0);
    dp__wire_reply_fini(&r);

    q.op = DP_WIRE_OP_INFO;
    call_handler(u, &q, &r, &replied);
    CHECK(replied && r.ok);
    CHECK_EQ(r.r.info.slab_bytes, 1 << 20);
    CHECK(dp__wire_str_eq(r.r.info.zmq, "tcp://127.0.0.1:1"));
    CHECK(dp__wire_str_eq(r.r.info.numa, "off"));
    dp__wire_reply_fini(&r);

    const char *keys[] = {"5@obs"};
    tblob t = mk_blob(keys, 1, 100, 3);
    q.op = DP_WIRE_OP_ALLOC;
    q.a.alloc = (dp_wire_alloc_args){dp__wire_s("blob-1"), t.len, 1, true};
    call_handler(u, &q, &r, &replied);
    CHECK(replied && r.ok);
    uint64_t off = r.r.alloc.off;
    dp__wire_reply_fini(&r);
    dp_test_write_blob(u, "blob-1", off, t.p, t.len);

    q.op = DP_WIRE_OP_READ_BYTES;
    q.a.read_bytes = (dp_wire_read_bytes_args){off, 8};
    call_handler(u, &q, &r, &replied);
    CHECK(replied && r.ok);
    CHECK_EQ(r.r.bytes.n, 8);
    CHECK_EQ(memcmp(r.r.bytes.p, DP_BLOB_MAGIC, 8), 0);
    dp__wire_reply_fini(&r);
    q.a.read_bytes = (dp_wire_read_bytes_args){(1 << 20) - 4, 8};
    call_handler(u, &q, &r, &replied);
    CHECK(replied && !r.ok);
    CHECK_EQ(r.err.code, DP_EPROTO);
    dp__wire_reply_fini(&r);

    q.op = DP_WIRE_OP_COMMIT;
    q.a.commit.blob_id = dp__wire_s("blob-1");
    call_handler(u, &q, &r, &replied);
    CHECK(replied && r.ok);
    CHECK_EQ(r.r.commit, DP_WIRE_COMMIT_DONE);
    dp__wire_reply_fini(&r);

    dp_wire_str ks[] = {dp__wire_s("5@obs"), dp__wire_s("6@obs")};
    q.op = DP_WIRE_OP_RESOLVE_KEYS;
    q.a.resolve_keys.keys = (dp_wire_strs){ks, 2};
    call_handler(u, &q, &r, &replied);
    CHECK(replied && r.ok);
    CHECK_EQ(r.r.resolve_keys.entries.n, 1);
    CHECK_EQ(r.r.resolve_keys.missing.n, 1);
    CHECK(dp__wire_str_eq(r.r.resolve_keys.entries.v[0].dtype, "") ||
          dp__wire_str_eq(r.r.resolve_keys.entries.v[0].dtype, "float32"));
    char pin[64];
    dp__wire_str_copy(r.r.resolve_keys.pin_id, pin, sizeof pin);
    dp__wire_reply_fini(&r);
    CHECK_EQ(dp_test_unit_stats(u).pins, 1);

    q.op = DP_WIRE_OP_UNPIN;
    q.a.unpin.pin_id = dp__wire_s(pin);
    call_handler(u, &q, &r, &replied);
    CHECK(!replied);
    CHECK_EQ(dp_test_unit_stats(u).pins, 0);

    dp_wire_str ids[] = {dp__wire_s("blob-1"), dp__wire_s("gone")};
    q.op = DP_WIRE_OP_RESOLVE;
    q.a.resolve.blob_ids = (dp_wire_strs){ids, 2};
    call_handler(u, &q, &r, &replied);
    CHECK(replied && r.ok);
    CHECK_EQ(r.r.resolve.blobs.n, 1);
    CHECK_EQ(r.r.resolve.blobs.v[0].off, off);
    CHECK_EQ(r.r.resolve.missing.n, 1);
    dp__wire_reply_fini(&r);

    q.op = DP_WIRE_OP_SCAN;
    call_handler(u, &q, &r, &replied);
    CHECK(replied && r.ok);
    CHECK_EQ(r.r.scan.n, 1);
    uint64_t refs = 0;
    CHECK(dp__wire_fields_u64(&r.r.scan.recs[0], "refs", &refs));
    CHECK_EQ(refs, 1);
    dp__wire_reply_fini(&r);

    q.op = DP_WIRE_OP_STATS;
    call_handler(u, &q, &r, &replied);
    CHECK(replied && r.ok);
    uint64_t pins = 99, commits = 0;
    CHECK(dp__wire_fields_u64(&r.r.stats, "pins", &pins));
    CHECK(dp__wire_fields_u64(&r.r.stats, "commits", &commits));
    CHECK_EQ(pins, 1); /* the resolve above */
    CHECK_EQ(commits, 1);
    dp__wire_reply_fini(&r);

    uint64_t g[] = {5, 6};
    q.op = DP_WIRE_OP_RELEASE_ROWS;
    q.a.release_rows.gidxs = (dp_wire_u64s){g, 2};
    call_handler(u, &q, &r, &replied);
    CHECK(replied && r.ok);
    CHECK_EQ(r.r.dropped, 1);
    dp__wire_reply_fini(&r);

    /* Busy/UnitFull map to their error kinds with a reason. */
    q.op = DP_WIRE_OP_ALLOC;
    q.a.alloc = (dp_wire_alloc_args){dp__wire_s("huge"), (1 << 20) - 64, 0, false};
    call_handler(u, &q, &r, &replied);
    CHECK(replied && !r.ok);
    CHECK_EQ(r.err.code, DP_EBUSY); /* the resolve pin above holds blob-1 */
    CHECK(r.err.reason.n > 0);
    dp__wire_reply_fini(&r);

    q.op = DP_WIRE_OP_ABORT;
    q.a.abort = (dp_wire_abort_args){dp__wire_s("nothing"), true};
    call_handler(u, &q, &r, &replied);
    CHECK(!replied);

    /* A relative path is refused (test_checkpoint tests real saves). */
    q.op = DP_WIRE_OP_SAVE_SHARD;
    q.a.save_shard.path = dp__wire_s("tmp/x");
    call_handler(u, &q, &r, &replied);
    CHECK(replied && !r.ok);
    CHECK_EQ(r.err.code, DP_EPROTO);
    dp__wire_reply_fini(&r);
    dp_test_unit_check(u);
    free(t.p);
    dp__unit_destroy(u);
}

/* Send raw bytes; return the reply (decoded as op) or false if none. */
static bool
raw_call(dp_unit *u, const void *msg, size_t len, dp_wire_reply *rep, dp_buf *out)
{
    dp__buf_reset(out);
    dp__unit_handle(u, msg, len, out);
    if (out->len == 0)
        return false;
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_OK_D(dp__wire_reply_decode(out->data, out->len, DP_WIRE_OP_PING, NULL, rep, &d),
               &d);
    return true;
}

DP_TEST(handler_malformed)
{
    dp_unit *u = mk_unit(1 << 20, 1, 0);
    dp_buf out = {0}, m = {0};
    dp_wire_reply r;
    dp_mp_writer w;

    /* Garbage and messages without a readable request id: no reply. */
    CHECK(!raw_call(u, "\xc1\xff\x00", 3, &r, &out));
    CHECK(!raw_call(u, "", 0, &r, &out));
    dp__mp_writer_init(&w, &m);
    dp__mp_put_array(&w, 3);
    dp__mp_put_str(&w, "ping");
    dp__mp_put_u64(&w, 7);
    dp__mp_put_map(&w, 0);
    CHECK(!raw_call(u, m.data, m.len, &r, &out));

    /* Unknown op with a readable id: Protocol error carrying the id. */
    dp__buf_reset(&m);
    dp__mp_writer_init(&w, &m);
    dp__mp_put_array(&w, 3);
    dp__mp_put_str(&w, "explode");
    dp__mp_put_str(&w, "rid-9");
    dp__mp_put_map(&w, 0);
    CHECK(raw_call(u, m.data, m.len, &r, &out));
    CHECK(!r.ok);
    CHECK(dp__wire_str_eq(r.rid, "rid-9"));
    CHECK(dp__wire_str_eq(r.err.kind, "Protocol"));
    dp__wire_reply_fini(&r);

    /* alloc with a wrong type and an unknown key: Protocol with the id. */
    dp__buf_reset(&m);
    dp__mp_writer_init(&w, &m);
    dp__mp_put_array(&w, 3);
    dp__mp_put_str(&w, "alloc");
    dp__mp_put_str(&w, "rid-10");
    dp__mp_put_map(&w, 2);
    dp__mp_put_str(&w, "blob_id");
    dp__mp_put_u64(&w, 5);
    dp__mp_put_str(&w, "evil");
    dp__mp_put_bool(&w, true);
    CHECK(raw_call(u, m.data, m.len, &r, &out));
    CHECK(!r.ok);
    CHECK_EQ(r.err.code, DP_EPROTO);
    CHECK(dp__wire_str_eq(r.rid, "rid-10"));
    dp__wire_reply_fini(&r);

    /* A malformed notify is dropped. */
    dp__buf_reset(&m);
    dp__mp_writer_init(&w, &m);
    dp__mp_put_array(&w, 3);
    dp__mp_put_str(&w, "unpin");
    dp__mp_put_str(&w, "rid-11");
    dp__mp_put_map(&w, 1);
    dp__mp_put_str(&w, "pin_id");
    dp__mp_put_u64(&w, 1);
    CHECK(!raw_call(u, m.data, m.len, &r, &out));

    /* Truncations of a valid request never crash and never reply wrongly. */
    dp_wire_request q;
    memset(&q, 0, sizeof q);
    q.op = DP_WIRE_OP_ALLOC;
    q.rid = dp__wire_s("rid-12");
    q.a.alloc = (dp_wire_alloc_args){dp__wire_s("b"), 100, 1, true};
    dp__buf_reset(&m);
    CHECK_OK(dp__wire_request_encode(&q, NULL, &m, NULL));
    for (size_t cut = 0; cut < m.len; cut++) {
        dp__buf_reset(&out);
        dp__unit_handle(u, m.data, cut, &out);
    }
    /* Random bit flips of it. */
    uint64_t rs = dp_test_seed();
    uint8_t *copy = malloc(m.len);
    for (int i = 0; i < 2000; i++) {
        memcpy(copy, m.data, m.len);
        copy[dp_test_rand(&rs) % m.len] ^= (uint8_t)(1u << (dp_test_rand(&rs) % 8));
        dp__buf_reset(&out);
        dp__unit_handle(u, copy, m.len, &out);
    }
    free(copy);
    /* Still serving. */
    q.op = DP_WIRE_OP_PING;
    bool replied;
    call_handler(u, &q, &r, &replied);
    CHECK(replied && r.ok);
    dp__wire_reply_fini(&r);
    dp__unit_handle_oversize(u, m.data, m.len, &out);
    CHECK(out.len > 0);
    dp_test_unit_check(u);
    dp__buf_fini(&out);
    dp__buf_fini(&m);
    dp__unit_destroy(u);
}

/*
 * Rows wider than the inline slots: 300 fields of one row in one blob, half
 * overwritten by a second blob that adds 50 more, fields named alike
 * ("f1", "f10", "f100"), every key found in the right blob, then a release.
 */
DP_TEST(wide_rows)
{
    dp_unit *u = mk_unit(8 << 20, 1, 0);
    enum { A = 300, B = 200 };
    char(*ka)[32] = calloc(A, sizeof *ka), (*kb)[32] = calloc(B, sizeof *kb);
    const char **pa = calloc(A, sizeof *pa), **pb = calloc(B, sizeof *pb);
    for (int i = 0; i < A; i++) {
        snprintf(ka[i], sizeof ka[i], "7@f%d", i);
        pa[i] = ka[i];
    }
    for (int i = 0; i < B; i++) { /* f150..f349: 150 overwrites, 50 new */
        snprintf(kb[i], sizeof kb[i], "7@f%d", 150 + i);
        pb[i] = kb[i];
    }
    uint64_t offa = put_keys(u, "wa", pa, A, 64, 1);
    dp_test_unit_check(u);
    uint64_t offb = put_keys(u, "wb", pb, B, 64, 2);
    dp_test_unit_check(u);
    CHECK_EQ(dp_test_unit_stats(u).rows, 1);
    CHECK_EQ(dp_test_unit_stats(u).entries, 350);
    for (int i = 0; i < 350; i++) {
        char key[32];
        snprintf(key, sizeof key, "7@f%d", i);
        uint64_t off, len;
        CHECKF(locate(u, key, &off, &len, NULL), "%s missing", key);
        /* The blobs do not overlap: each runs up to the other or beyond. */
        uint64_t base = i < 150 ? offa : offb, other = i < 150 ? offb : offa;
        uint64_t end = other > base ? other : UINT64_MAX;
        CHECKF(off > base && off < end, "%s in the wrong blob", key);
        CHECK_EQ(len, 64);
    }
    uint64_t g = 7;
    CHECK_EQ(dp__unit_release_rows(u, &g, 1), 350);
    dp_test_unit_check(u);
    CHECK_EQ(dp_test_unit_stats(u).rows, 0);
    CHECK_EQ(dp_test_unit_stats(u).blobs, 0);
    free(ka);
    free(kb);
    free(pa);
    free(pb);
    dp__unit_destroy(u);
}

/* The ticker thread runs maintenance on the real clock. */
DP_TEST(ticker_thread)
{
    dp_unit_opts o;
    dp__unit_opts_init(&o);
    o.slab_bytes = 1 << 20;
    o.alloc_lease_s = 0.2;
    o.numa = DP_UNIT_NUMA_AUTO;
    dp_unit *u = NULL;
    CHECK_OK(dp__unit_create(&o, &u, NULL));
    CHECK(dp__unit_numa_desc(u)[0] != '\0');
    CHECK_OK(dp__unit_start_ticker(u, 0.05, NULL));
    uint64_t off;
    CHECK_OK(dp__unit_alloc(u, "x", 1, 100, 0, &off, NULL, NULL));
    double t0 = dp_test_now();
    while (dp_test_unit_stats(u).leases_expired == 0 && dp_test_now() - t0 < 5)
        dp__sleep_s(0.02);
    CHECK_EQ(dp_test_unit_stats(u).leases_expired, 1);
    CHECK_EQ(dp_test_unit_stats(u).retired_bytes, 128);
    dp__unit_destroy(u);
}

/* ---- over real ZMQ, with real UCX transfers from another process ---- */

/*
 * Peers are this program re-executed with DP_TEST_UNIT_PEER set, so that no
 * UCX or ZMQ state crosses a fork:
 *   "unit":   a unit with an endpoint (progress thread), ticker and control
 *             server; writes its address to DP_TEST_UNIT_FD, runs until SIGTERM
 *             and exits 0 after a clean shutdown;
 *   "client": allocs blob "doomed" on DP_TEST_UNIT_ADDR, WRITEs half of it,
 *             reports "ok" on the fd and waits to be killed.
 */
static dp_wire_rid_gen rid_gen;
static bool rid_init;

/* Request q to addr; the reply decodes into rep with views into rbuf. */
static int
zcall(dp_ctl_client *c, const char *addr, dp_wire_request *q, dp_wire_reply *rep,
      dp_buf *rbuf, dp_detail *d)
{
    if (!rid_init) {
        CHECK_OK(dp__wire_rid_gen_init(&rid_gen, NULL));
        rid_init = true;
    }
    char rid[DP_WIRE_RID_MAX];
    q->rid = dp__wire_rid_next(&rid_gen, rid);
    dp_buf req = {0};
    CHECK_OK_D(dp__wire_request_encode(q, NULL, &req, d), d);
    dp__buf_reset(rbuf);
    int rc = dp__ctl_call(c, addr, req.data, req.len, rid, 10.0, rbuf, d);
    dp__buf_fini(&req);
    if (rc != 0)
        return rc;
    return dp__wire_reply_decode(rbuf->data, rbuf->len, q->op, NULL, rep, d);
}

static void
znotify(dp_ctl_client *c, const char *addr, dp_wire_request *q)
{
    char rid[DP_WIRE_RID_MAX];
    q->rid = dp__wire_rid_next(&rid_gen, rid);
    dp_buf req = {0};
    CHECK_OK(dp__wire_request_encode(q, NULL, &req, NULL));
    CHECK_OK(dp__ctl_notify(c, addr, req.data, req.len, NULL));
    dp__buf_fini(&req);
}

static int
peer_unit(int fd)
{
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    dp_detail d;
    dp_detail_clear(&d);
    dp_unit_opts o;
    dp__unit_opts_init(&o);
    o.slab_bytes = 16 << 20;
    o.read_pin_s = 10;
    o.alloc_lease_s = atof(getenv("DP_TEST_UNIT_LEASE"));
    o.quarantine_s = 1;
    o.numa = DP_UNIT_NUMA_AUTO;
    dp_unit_server *srv = NULL;
    if (dp__unit_server_open(&o, "test-unit", "127.0.0.1", 0, 0.1, &srv, &d) != 0)
        goto fail;
    char line[300];
    snprintf(line, sizeof line, "%s\n", dp__unit_server_address(srv));
    dp_test_write_str(fd, line);
    int sig;
    sigwait(&sigs, &sig);
    dp__unit_server_close(srv);
    return 0;
fail:
    fprintf(stderr, "unit peer: %s\n", dp_detail_msg(&d));
    return 1;
}

/* The slab's base address in the unit process: its only registered region. */
static uint64_t
slab_base(const dp_wire_bytes *md)
{
    dp_md m;
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_OK_D(dp__md_parse(md->p, md->n, &m, &d), &d);
    CHECK_EQ(m.n_regions, 1);
    uint64_t base = m.regions[0].base;
    dp__md_fini(&m);
    return base;
}

/* Connect ep to the unit at addr; returns the remote name and slab base. */
static uint64_t
connect_unit(dp_ctl_client *c, const char *addr, dp_endpoint *ep, char name[256])
{
    dp_wire_request q;
    memset(&q, 0, sizeof q);
    q.op = DP_WIRE_OP_INFO;
    dp_wire_reply r;
    dp_buf rb = {0};
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_OK_D(zcall(c, addr, &q, &r, &rb, &d), &d);
    CHECK(r.ok);
    CHECK(r.r.info.metadata.n > 0);
    CHECK(dp__wire_str_eq(r.r.info.zmq, addr));
    CHECK(dp__wire_str_eq(r.r.info.agent, "test-unit"));
    CHECK_OK_D(
        dp__endpoint_add_remote(ep, r.r.info.metadata.p, r.r.info.metadata.n, name, &d),
        &d);
    uint64_t base = slab_base(&r.r.info.metadata);
    /* info names the slab base directly too; it must agree with the metadata. */
    CHECK_EQ_U64(r.r.info.slab_addr, base);
    CHECK(r.r.info.read_pin_ms > 0);
    dp__wire_reply_fini(&r);
    dp__buf_fini(&rb);
    return base;
}

static int
peer_client(int fd)
{
    const char *addr = getenv("DP_TEST_UNIT_ADDR");
    dp_ctl_client *c = NULL;
    if (dp__ctl_client_create(&c, NULL) != 0)
        return 1;
    dp_endpoint *ep = NULL;
    if (dp__endpoint_create("doomed-client", NULL, &ep, NULL) != 0)
        return 1;
    char name[256];
    uint64_t base = connect_unit(c, addr, ep, name);
    dp_wire_request q;
    memset(&q, 0, sizeof q);
    q.op = DP_WIRE_OP_ALLOC;
    q.a.alloc = (dp_wire_alloc_args){dp__wire_s("doomed"), 1 << 20, 0, false};
    dp_wire_reply r;
    dp_buf rb = {0};
    if (zcall(c, addr, &q, &r, &rb, NULL) != 0 || !r.ok)
        return 1;
    uint64_t off = r.r.alloc.off;
    dp__wire_reply_fini(&r);
    void *buf = NULL;
    if (dp__endpoint_alloc(ep, 512 << 10, &buf, NULL) != 0)
        return 1;
    memset(buf, 0xab, 512 << 10);
    dp_range l = {(uint64_t)(uintptr_t)buf, 512 << 10};
    dp_range rr = {base + off, 512 << 10};
    if (dp__endpoint_transfer(ep, DP_XFER_WRITE, &l, 1, &rr, 1, name, 10, NULL) != 0)
        return 1;
    char line[64];
    snprintf(line, sizeof line, "%" PRIu64 "\n", off);
    dp_test_write_str(fd, line);
    for (;;)
        pause();
}

__attribute__((constructor)) static void
peer_main(void)
{
    const char *mode = getenv("DP_TEST_UNIT_PEER");
    if (mode == NULL)
        return;
    int fd = atoi(getenv("DP_TEST_UNIT_FD"));
    int rc = strcmp(mode, "unit") == 0 ? peer_unit(fd) : peer_client(fd);
    _exit(rc);
}

typedef struct peer {
    pid_t pid;
    char line[300];
} peer;

/* Start a peer (this program re-executed) and read the first line it reports. */
static void
peer_start(peer *p, const char *mode, const char *lease, const char *addr)
{
    int fds[2];
    CHECK(pipe2(fds, O_CLOEXEC) == 0);
    char fdbuf[16];
    snprintf(fdbuf, sizeof fdbuf, "%d", fds[1]);
    const char *env[] = {"DP_TEST_UNIT_PEER",
                         mode,
                         "DP_TEST_UNIT_FD",
                         fdbuf,
                         "DP_TEST_UNIT_LEASE",
                         lease != NULL ? lease : "60",
                         addr != NULL ? "DP_TEST_UNIT_ADDR" : NULL,
                         addr,
                         NULL};
    p->pid = dp_test_spawn_self(env, fds[1]);
    close(fds[1]);
    size_t n = dp_test_read_line(fds[0], p->line, sizeof p->line, 30);
    close(fds[0]);
    CHECKF(n > 0, "peer %s reported nothing", mode);
}

/* SIGTERM (or SIGKILL) the peer; returns its exit status (or -signal). */
static int
peer_stop(peer *p, int sig)
{
    return dp_test_kill_wait(p->pid, sig);
}

static uint64_t
zstat(dp_ctl_client *c, const char *addr, const char *name)
{
    dp_wire_request q;
    memset(&q, 0, sizeof q);
    q.op = DP_WIRE_OP_STATS;
    dp_wire_reply r;
    dp_buf rb = {0};
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_OK_D(zcall(c, addr, &q, &r, &rb, &d), &d);
    CHECK(r.ok);
    uint64_t v = 0;
    CHECKF(dp__wire_fields_u64(&r.r.stats, name, &v), "stat %s", name);
    dp__wire_reply_fini(&r);
    dp__buf_fini(&rb);
    return v;
}

DP_TEST(zmq_ucx_put_get)
{
    peer up;
    peer_start(&up, "unit", "60", NULL);
    const char *addr = up.line;
    CHECK(strncmp(addr, "tcp://127.0.0.1:", 16) == 0);
    dp_ctl_client *c = NULL;
    CHECK_OK(dp__ctl_client_create(&c, NULL));
    dp_endpoint *ep = NULL;
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_OK_D(dp__endpoint_create("test-client", NULL, &ep, &d), &d);
    char name[256];
    uint64_t base = connect_unit(c, addr, ep, name);

    /* A blob of three entries with payload CRCs, built in registered memory. */
    const char *keys[] = {"0@input_ids", "1@input_ids", "1@logprobs"};
    const uint64_t lens[] = {1000, 300 * 1024 + 7, 8};
    dp_blob_builder *bb = NULL;
    CHECK_OK(dp__blob_builder_create(DP_BLOB_FLAG_CRC, &bb, NULL));
    uint64_t rs = dp_test_seed();
    uint8_t *pay[3];
    uint32_t crc[3];
    for (int i = 0; i < 3; i++) {
        pay[i] = malloc(lens[i]);
        for (uint64_t k = 0; k < lens[i]; k++)
            pay[i][k] = (uint8_t)dp_test_rand(&rs);
        crc[i] = dp__crc32c(pay[i], lens[i]);
        dp_blob_entry_spec s = {0};
        s.key = keys[i];
        s.kind = DP_BLOB_BYTES;
        s.len = lens[i];
        s.payload = pay[i];
        CHECK_OK_D(dp__blob_builder_add(bb, &s, NULL, &d), &d);
    }
    dp_blob_layout lay;
    CHECK_OK_D(dp__blob_builder_layout(bb, &lay, &d), &d);
    void *stage = NULL;
    CHECK_OK_D(dp__endpoint_alloc(ep, lay.total_len, &stage, &d), &d);
    CHECK_OK(dp__blob_builder_write(bb, stage, lay.total_len, NULL));
    CHECK_OK(dp__blob_builder_copy_payloads(bb, stage, lay.total_len, NULL));

    dp_wire_request q;
    dp_wire_reply r;
    dp_buf rb = {0};
    memset(&q, 0, sizeof q);
    q.op = DP_WIRE_OP_ALLOC;
    q.a.alloc = (dp_wire_alloc_args){dp__wire_s("put-1"), lay.total_len, 3, true};
    CHECK_OK_D(zcall(c, addr, &q, &r, &rb, &d), &d);
    CHECK(r.ok);
    uint64_t off = r.r.alloc.off;
    CHECK(r.incarnation != 0);
    dp__blob_header_set_alloc(stage, r.incarnation, r.r.alloc.token);
    dp__wire_reply_fini(&r);

    /* Commit before the WRITE: the zeroed region fails validation. */
    q.op = DP_WIRE_OP_COMMIT;
    q.a.commit.blob_id = dp__wire_s("put-1");
    CHECK_OK_D(zcall(c, addr, &q, &r, &rb, &d), &d);
    CHECK(!r.ok);
    CHECK(dp__wire_str_eq(r.err.kind, "Protocol"));
    dp__wire_reply_fini(&r);

    dp_range l = {(uint64_t)(uintptr_t)stage, lay.total_len};
    dp_range rr = {base + off, lay.total_len};
    CHECK_OK_D(dp__endpoint_transfer(ep, DP_XFER_WRITE, &l, 1, &rr, 1, name, 10, &d), &d);
    CHECK_OK_D(zcall(c, addr, &q, &r, &rb, &d), &d);
    CHECK(r.ok);
    CHECK_EQ(r.r.commit, DP_WIRE_COMMIT_DONE);
    dp__wire_reply_fini(&r);
    CHECK_OK_D(zcall(c, addr, &q, &r, &rb, &d), &d); /* idempotent */
    CHECK(r.ok);
    CHECK_EQ(r.r.commit, DP_WIRE_COMMIT_DONE);
    dp__wire_reply_fini(&r);

    /* resolve_keys, READ each entry into registered memory, check CRCs. */
    dp_wire_str ks[] = {dp__wire_s("1@logprobs"), dp__wire_s("0@input_ids"),
                        dp__wire_s("9@nothing"), dp__wire_s("1@input_ids")};
    q.op = DP_WIRE_OP_RESOLVE_KEYS;
    q.a.resolve_keys.keys = (dp_wire_strs){ks, 4};
    CHECK_OK_D(zcall(c, addr, &q, &r, &rb, &d), &d);
    CHECK(r.ok);
    CHECK_EQ(r.r.resolve_keys.entries.n, 3);
    CHECK_EQ(r.r.resolve_keys.missing.n, 1);
    CHECK(r.r.resolve_keys.pin_id.n > 0);
    void *dst = NULL;
    CHECK_OK_D(dp__endpoint_alloc(ep, 512 << 10, &dst, &d), &d);
    for (uint32_t i = 0; i < r.r.resolve_keys.entries.n; i++) {
        const dp_wire_key_loc *e = &r.r.resolve_keys.entries.v[i];
        int k = dp__wire_str_eq(e->key, "0@input_ids")   ? 0
                : dp__wire_str_eq(e->key, "1@input_ids") ? 1
                                                         : 2;
        CHECK_EQ(e->len, lens[k]);
        CHECK(dp__wire_str_eq(e->kind, "bytes"));
        memset(dst, 0, e->len);
        dp_range ll = {(uint64_t)(uintptr_t)dst, e->len};
        dp_range rl = {base + e->off, e->len};
        CHECK_OK_D(dp__endpoint_transfer(ep, DP_XFER_READ, &ll, 1, &rl, 1, name, 10, &d),
                   &d);
        CHECK_EQ(dp__crc32c(dst, e->len), crc[k]);
        CHECK_EQ(memcmp(dst, pay[k], e->len), 0);
    }
    char pin[64];
    dp__wire_str_copy(r.r.resolve_keys.pin_id, pin, sizeof pin);
    dp__wire_reply_fini(&r);
    CHECK_EQ(zstat(c, addr, "pins"), 1);
    q.op = DP_WIRE_OP_UNPIN;
    q.a.unpin.pin_id = dp__wire_s(pin);
    znotify(c, addr, &q);
    double t0 = dp_test_now();
    while (zstat(c, addr, "pins") != 0 && dp_test_now() - t0 < 5)
        dp__sleep_s(0.01);
    CHECK_EQ(zstat(c, addr, "pins"), 0);

    /* read_bytes sees the header the WRITE put there. */
    q.op = DP_WIRE_OP_READ_BYTES;
    q.a.read_bytes = (dp_wire_read_bytes_args){off, 8};
    CHECK_OK_D(zcall(c, addr, &q, &r, &rb, &d), &d);
    CHECK(r.ok && r.r.bytes.n == 8 && memcmp(r.r.bytes.p, DP_BLOB_MAGIC, 8) == 0);
    dp__wire_reply_fini(&r);

    /* Garbage on the wire: no reply, and the unit keeps serving. */
    CHECK_OK(dp__ctl_notify(c, addr, "\x93\xc1\xc1", 3, NULL));
    uint64_t g[] = {0, 1};
    q.op = DP_WIRE_OP_RELEASE_ROWS;
    q.a.release_rows.gidxs = (dp_wire_u64s){g, 2};
    CHECK_OK_D(zcall(c, addr, &q, &r, &rb, &d), &d);
    CHECK(r.ok);
    CHECK_EQ(r.r.dropped, 3);
    dp__wire_reply_fini(&r);
    CHECK_EQ(zstat(c, addr, "allocated_bytes"), 0);
    CHECK_EQ(zstat(c, addr, "entries"), 0);

    dp__buf_fini(&rb);
    for (int i = 0; i < 3; i++)
        free(pay[i]);
    dp__blob_builder_destroy(bb);
    dp__endpoint_destroy(ep);
    dp__ctl_client_destroy(c);
    CHECK_EQ(peer_stop(&up, SIGTERM), 0);
}

/* A client killed between alloc and commit: the unit stays healthy and the
 * region is retired (never reused) once the lease runs out. */
DP_TEST(zmq_client_killed_before_commit)
{
    peer up;
    peer_start(&up, "unit", "1.0", NULL);
    char addr[300];
    snprintf(addr, sizeof addr, "%s", up.line);
    peer cl;
    peer_start(&cl, "client", NULL, addr);
    uint64_t off = strtoull(cl.line, NULL, 10);
    CHECK_EQ(peer_stop(&cl, SIGKILL), -SIGKILL);

    dp_ctl_client *c = NULL;
    CHECK_OK(dp__ctl_client_create(&c, NULL));
    double t0 = dp_test_now();
    while (zstat(c, addr, "leases_expired") == 0 && dp_test_now() - t0 < 10)
        dp__sleep_s(0.05);
    CHECK_EQ(zstat(c, addr, "leases_expired"), 1);
    CHECK_EQ(zstat(c, addr, "retired_bytes"), 1 << 20);
    CHECK_EQ(zstat(c, addr, "blobs"), 0);

    dp_wire_request q;
    dp_wire_reply r;
    dp_buf rb = {0};
    dp_detail d;
    dp_detail_clear(&d);
    memset(&q, 0, sizeof q);
    q.op = DP_WIRE_OP_COMMIT;
    q.a.commit.blob_id = dp__wire_s("doomed");
    CHECK_OK_D(zcall(c, addr, &q, &r, &rb, &d), &d);
    CHECK(r.ok);
    CHECK_EQ(r.r.commit, DP_WIRE_COMMIT_LOST);
    dp__wire_reply_fini(&r);
    /* Fill the rest of the slab: nothing overlaps the retired region. */
    for (int i = 0; i < 64; i++) {
        char id[16];
        snprintf(id, sizeof id, "fill%d", i);
        q.op = DP_WIRE_OP_ALLOC;
        q.a.alloc = (dp_wire_alloc_args){dp__wire_s(id), 1 << 20, 0, false};
        CHECK_OK_D(zcall(c, addr, &q, &r, &rb, &d), &d);
        if (!r.ok) {
            CHECK(dp__wire_str_eq(r.err.kind, "UnitFull"));
            dp__wire_reply_fini(&r);
            break;
        }
        CHECK(r.r.alloc.off + (1 << 20) <= off || r.r.alloc.off >= off + (1 << 20));
        dp__wire_reply_fini(&r);
    }
    q.op = DP_WIRE_OP_PING;
    CHECK_OK_D(zcall(c, addr, &q, &r, &rb, &d), &d);
    CHECK(r.ok);
    dp__wire_reply_fini(&r);
    dp__buf_fini(&rb);
    dp__ctl_client_destroy(c);
    CHECK_EQ(peer_stop(&up, SIGTERM), 0);
}

/* ---- the `dataplane unit` command, through the real binary ---- */

DP_TEST(cli_unit_command)
{
    const char *cli = dp_test_cli_path();
    if (cli == NULL)
        DP_SKIP("the dataplane binary is not built next to this test");
    char line[300];
    const char *bad[] = {cli, "unit", "--numa", "sideways", NULL};
    CHECK_EQ(dp_test_wait_status(dp_test_cli_start(bad, line, sizeof line)), 2);
    const char *bad2[] = {cli, "unit", "--unit-id", "2", "--units", "2", NULL};
    CHECK_EQ(dp_test_wait_status(dp_test_cli_start(bad2, line, sizeof line)), 2);
    const char *help[] = {cli, "unit", "--help", NULL};
    pid_t hp = dp_test_cli_start(help, line, sizeof line);
    CHECK_CONTAINS(line, "usage: dataplane unit");
    CHECK_EQ(dp_test_wait_status(hp), 0);

    const char *args[] = {
        cli,      "unit", "--bind",       "127.0.0.1", "--port",          "0",
        "--slab", "8M",   "--read-pin-s", "5",         "--alloc-lease-s", "2",
        "--numa", "auto", "--unit-id",    "1",         "--units",         "3",
        NULL};
    pid_t pid = dp_test_cli_start(args, line, sizeof line);
    CHECKF(strncmp(line, "tcp://127.0.0.1:", 16) == 0, "first line '%s'", line);
    dp_ctl_client *c = NULL;
    CHECK_OK(dp__ctl_client_create(&c, NULL));
    dp_wire_request q;
    dp_wire_reply r;
    dp_buf rb = {0};
    dp_detail d;
    dp_detail_clear(&d);
    memset(&q, 0, sizeof q);
    q.op = DP_WIRE_OP_INFO;
    CHECK_OK_D(zcall(c, line, &q, &r, &rb, &d), &d);
    CHECK(r.ok);
    CHECK_EQ(r.r.info.unit_id, 1);
    CHECK_EQ(r.r.info.n_units, 3);
    CHECK_EQ(r.r.info.slab_bytes, 8 << 20);
    CHECK(dp__wire_str_eq(r.r.info.zmq, line));
    CHECK(r.r.info.numa.n > 0);
    CHECK(r.r.info.metadata.n > 0);
    dp__wire_reply_fini(&r);
    /* A key of another unit is refused; this unit owns gidx 1, 4, 7... */
    dp_wire_str ks[] = {dp__wire_s("4@a"), dp__wire_s("2@a")};
    q.op = DP_WIRE_OP_RESOLVE_KEYS;
    q.a.resolve_keys.keys = (dp_wire_strs){ks, 2};
    CHECK_OK_D(zcall(c, line, &q, &r, &rb, &d), &d);
    CHECK(!r.ok);
    CHECK(dp__wire_str_eq(r.err.kind, "Protocol"));
    dp__wire_reply_fini(&r);
    dp__buf_fini(&rb);
    dp__ctl_client_destroy(c);
    kill(pid, SIGINT);
    CHECK_EQ(dp_test_wait_status(pid), 0);
}

/*
 * Threads hammer one unit (real clock, ticker on, short pins and leases) with
 * every op through the handler and the core; the unit's invariants hold after
 * (and ThreadSanitizer watches the locking).
 */
typedef struct hammer_arg {
    dp_unit *u;
    int tid;
    uint64_t seed;
} hammer_arg;

static void *
hammer(void *p)
{
    hammer_arg *a = p;
    uint64_t rs = a->seed;
    dp_buf out = {0}, in = {0};
    for (int i = 0; i < 300; i++) {
        char id[32], k1[32], k2[32];
        snprintf(id, sizeof id, "t%d-%d", a->tid, i);
        snprintf(k1, sizeof k1, "%u@f", (unsigned)(dp_test_rand(&rs) % 32));
        snprintf(k2, sizeof k2, "%u@g", (unsigned)(dp_test_rand(&rs) % 32));
        const char *keys[] = {k1, k2};
        tblob t = mk_blob(keys, 2, 64 + dp_test_rand(&rs) % 2000, (uint32_t)i);
        uint64_t off;
        if (dp__unit_alloc(a->u, id, strlen(id), t.len, 2, &off, NULL, NULL) == 0) {
            int how = (int)(dp_test_rand(&rs) % 8);
            if (how < 6) {
                dp_test_write_blob(a->u, id, off, t.p, t.len);
                dp_wire_commit_state st;
                dp__unit_commit(a->u, id, strlen(id), &st, NULL);
            } else if (how == 6) {
                dp__unit_abort(a->u, id, strlen(id), dp_test_rand(&rs) % 2 == 0);
            } /* else: left for the lease */
        }
        free(t.p);
        /* resolve through the handler, unpin some of the pins */
        dp_wire_str ks[] = {dp__wire_s(k1), dp__wire_s(k2)};
        dp_wire_request q;
        memset(&q, 0, sizeof q);
        q.op = DP_WIRE_OP_RESOLVE_KEYS;
        q.rid = dp__wire_s("h");
        q.a.resolve_keys.keys = (dp_wire_strs){ks, 2};
        dp__buf_reset(&in);
        dp__wire_request_encode(&q, NULL, &in, NULL);
        dp__buf_reset(&out);
        dp__unit_handle(a->u, in.data, in.len, &out);
        dp_wire_reply r;
        if (dp__wire_reply_decode(out.data, out.len, q.op, NULL, &r, NULL) == 0 && r.ok &&
            r.r.resolve_keys.pin_id.n > 0 && dp_test_rand(&rs) % 2 == 0)
            dp__unit_unpin(a->u, r.r.resolve_keys.pin_id.p, r.r.resolve_keys.pin_id.n);
        dp__wire_reply_fini(&r);
        if (dp_test_rand(&rs) % 4 == 0) {
            uint64_t g = dp_test_rand(&rs) % 32;
            dp__unit_release_rows(a->u, &g, 1);
        }
        if (i % 50 == 0) {
            q.op = DP_WIRE_OP_SCAN;
            dp__buf_reset(&in);
            dp__wire_request_encode(&q, NULL, &in, NULL);
            dp__buf_reset(&out);
            dp__unit_handle(a->u, in.data, in.len, &out);
        }
    }
    dp__buf_fini(&in);
    dp__buf_fini(&out);
    return NULL;
}

DP_TEST(threads_hammer)
{
    dp_unit_opts o;
    dp__unit_opts_init(&o);
    o.slab_bytes = 1 << 20;
    o.read_pin_s = 0.05;
    o.alloc_lease_s = 0.05;
    o.quarantine_s = 0.02;
    o.numa = DP_UNIT_NUMA_OFF;
    dp_unit *u = NULL;
    CHECK_OK(dp__unit_create(&o, &u, NULL));
    CHECK_OK(dp__unit_start_ticker(u, 0.01, NULL));
    dp__log_set_level(DP_LOG_ERROR);
    enum { NT = 4 };
    pthread_t th[NT];
    hammer_arg args[NT];
    uint64_t seed = dp_test_seed();
    for (int i = 0; i < NT; i++) {
        args[i] = (hammer_arg){u, i, seed + (uint64_t)i * 7919};
        CHECK(pthread_create(&th[i], NULL, hammer, &args[i]) == 0);
    }
    for (int i = 0; i < NT; i++)
        pthread_join(th[i], NULL);
    dp__log_set_level(DP_LOG_INFO);
    dp_test_unit_check(u);
    /* Everything left ends: pins expire, leases retire, quarantine drains. */
    dp_unit_stats s = dp_test_unit_stats(u);
    double t0 = dp_test_now();
    while ((s.pins != 0 || s.zombies != 0 || s.quarantined_bytes != 0 ||
            s.blobs != s.published) &&
           dp_test_now() - t0 < 10) {
        dp__sleep_s(0.02);
        s = dp_test_unit_stats(u);
    }
    CHECK_EQ(s.pins, 0);
    CHECK_EQ(s.zombies, 0);
    CHECK_EQ(s.quarantined_bytes, 0);
    CHECK_EQ(s.blobs, s.published);
    printf("  hammer: %" PRIu64 " commits, %" PRIu64 " retired, %" PRIu64
           " busy, %" PRIu64 " full\n",
           s.n_commit, s.n_retired, s.n_busy, s.n_full);
    /* The threads did collide on the unit: commits, retirements, expired pins. */
    EXPECT_GE(s.n_commit, 200);
    EXPECT(s.n_retired > 0);
    EXPECT(s.pins_expired > 0);
    dp_test_unit_check(u);
    dp__unit_destroy(u);
}

/*
 * Invariant 1 over real transfers: a reader's pinned entry keeps its bytes
 * while its rows are released and writers fill the slab around it; the
 * writers get Busy (pins), never its region, until the reader unpins.
 */
DP_TEST(zmq_pinned_read_survives_release)
{
    peer up;
    peer_start(&up, "unit", "60", NULL);
    char addr[300];
    snprintf(addr, sizeof addr, "%s", up.line);
    dp_ctl_client *c = NULL;
    CHECK_OK(dp__ctl_client_create(&c, NULL));
    dp_endpoint *ep = NULL;
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_OK_D(dp__endpoint_create("test-client2", NULL, &ep, &d), &d);
    char name[256];
    uint64_t base = connect_unit(c, addr, ep, name);

    const uint64_t plen = 4 << 20;
    const char *keys[] = {"3@obs"};
    tblob t = mk_blob(keys, 1, plen, 77);
    uint32_t want = 0;
    void *stage = NULL;
    CHECK_OK_D(dp__endpoint_alloc(ep, t.len, &stage, &d), &d);
    memcpy(stage, t.p, t.len);
    dp_wire_request q;
    dp_wire_reply r;
    dp_buf rb = {0};
    memset(&q, 0, sizeof q);
    q.op = DP_WIRE_OP_ALLOC;
    q.a.alloc = (dp_wire_alloc_args){dp__wire_s("A"), t.len, 1, false};
    CHECK_OK_D(zcall(c, addr, &q, &r, &rb, &d), &d);
    CHECK(r.ok);
    uint64_t aoff = r.r.alloc.off;
    dp__blob_header_set_alloc(stage, r.incarnation, r.r.alloc.token);
    dp__wire_reply_fini(&r);
    dp_range l = {(uint64_t)(uintptr_t)stage, t.len};
    dp_range rr = {base + aoff, t.len};
    CHECK_OK_D(dp__endpoint_transfer(ep, DP_XFER_WRITE, &l, 1, &rr, 1, name, 10, &d), &d);
    q.op = DP_WIRE_OP_COMMIT;
    q.a.commit.blob_id = dp__wire_s("A");
    CHECK_OK_D(zcall(c, addr, &q, &r, &rb, &d), &d);
    CHECK(r.ok && r.r.commit == DP_WIRE_COMMIT_DONE);
    dp__wire_reply_fini(&r);

    dp_wire_str k = dp__wire_s("3@obs");
    q.op = DP_WIRE_OP_RESOLVE_KEYS;
    q.a.resolve_keys.keys = (dp_wire_strs){&k, 1};
    CHECK_OK_D(zcall(c, addr, &q, &r, &rb, &d), &d);
    CHECK(r.ok && r.r.resolve_keys.entries.n == 1);
    uint64_t eoff = r.r.resolve_keys.entries.v[0].off,
             elen = r.r.resolve_keys.entries.v[0].len;
    char pin[64];
    dp__wire_str_copy(r.r.resolve_keys.pin_id, pin, sizeof pin);
    dp__wire_reply_fini(&r);
    CHECK_EQ(elen, plen);
    want = dp__crc32c(t.p + (eoff - aoff), plen);

    uint64_t g = 3;
    q.op = DP_WIRE_OP_RELEASE_ROWS;
    q.a.release_rows.gidxs = (dp_wire_u64s){&g, 1};
    CHECK_OK_D(zcall(c, addr, &q, &r, &rb, &d), &d);
    CHECK(r.ok && r.r.dropped == 1);
    dp__wire_reply_fini(&r);

    /* Writers fill the slab with 0xee: never A's region; then Busy. */
    memset(stage, 0xee, t.len);
    bool busy = false;
    for (int i = 0; i < 8 && !busy; i++) {
        char id[16];
        snprintf(id, sizeof id, "W%d", i);
        q.op = DP_WIRE_OP_ALLOC;
        q.a.alloc = (dp_wire_alloc_args){dp__wire_s(id), t.len, 0, false};
        CHECK_OK_D(zcall(c, addr, &q, &r, &rb, &d), &d);
        if (!r.ok) {
            CHECKF(dp__wire_str_eq(r.err.kind, "Busy"), "%.*s",
                   DP_WIRE_STR_ARG(r.err.kind));
            CHECK(dp__wire_str_eq(r.err.reason, "pins"));
            busy = true;
        } else {
            CHECK(r.r.alloc.off + t.len <= aoff || r.r.alloc.off >= aoff + t.len);
            dp_range wr = {base + r.r.alloc.off, t.len};
            CHECK_OK_D(
                dp__endpoint_transfer(ep, DP_XFER_WRITE, &l, 1, &wr, 1, name, 10, &d),
                &d);
        }
        dp__wire_reply_fini(&r);
    }
    CHECK(busy);

    /* The reader's READ still gets A's bytes. */
    void *dst = NULL;
    CHECK_OK_D(dp__endpoint_alloc(ep, plen, &dst, &d), &d);
    dp_range ll = {(uint64_t)(uintptr_t)dst, plen};
    dp_range rl = {base + eoff, plen};
    CHECK_OK_D(dp__endpoint_transfer(ep, DP_XFER_READ, &ll, 1, &rl, 1, name, 10, &d), &d);
    CHECK_EQ(dp__crc32c(dst, plen), want);

    /* Unpinned: A's region is handed out again. */
    q.op = DP_WIRE_OP_UNPIN;
    q.a.unpin.pin_id = dp__wire_s(pin);
    znotify(c, addr, &q);
    bool got = false;
    double t0 = dp_test_now();
    while (!got && dp_test_now() - t0 < 5) {
        q.op = DP_WIRE_OP_ALLOC;
        q.a.alloc = (dp_wire_alloc_args){dp__wire_s("after"), t.len, 0, false};
        CHECK_OK_D(zcall(c, addr, &q, &r, &rb, &d), &d);
        if (r.ok) {
            got = true;
            CHECK_EQ(r.r.alloc.off, aoff);
        }
        dp__wire_reply_fini(&r);
        if (!got)
            dp__sleep_s(0.01);
    }
    CHECK(got);
    dp__buf_fini(&rb);
    free(t.p);
    dp__endpoint_destroy(ep);
    dp__ctl_client_destroy(c);
    CHECK_EQ(peer_stop(&up, SIGTERM), 0);
}

/* ---- writers: retired regions come back when their writer is gone ---- */

static dp_wire_alloc_args
writer_alloc(const char *id, uint64_t nbytes, const char *writer, pid_t pid,
             const char *host, const char *lane)
{
    return (dp_wire_alloc_args){
        dp__wire_s(id),   nbytes,          0, false, dp__wire_s(writer), (uint64_t)pid,
        dp__wire_s(host), dp__wire_s(lane)};
}

/*
 * A same-host shared-memory writer's retired region and its open allocation
 * come back reclaim_grace_s after its process exited (a real child, watched
 * through a pidfd), not before; a TCP writer's, another host's and an
 * unnamed writer's retired regions are kept for good. Tokens: a retried
 * alloc answers the same one, a new alloc another.
 */
DP_TEST(gone_writers_regions_come_back)
{
    dp_unit *u = mk_unit(1 << 20, 1, 0);
    fflush(NULL);
    pid_t child = fork();
    CHECK(child >= 0);
    if (child == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        for (;;)
            pause();
    }
    const char *host = dp__host_key();
    CHECK(host[0] != '\0');
    dp_wire_alloc_res r1, r1b, r2, r3, r4, r5;
    dp_detail d;
    dp_detail_clear(&d);
    dp_wire_alloc_args a = writer_alloc("open", 4096, "w1", child, host, "shm");
    CHECK_OK_D(dp__unit_alloc_req(u, &a, &r1, NULL, &d), &d);
    CHECK_OK_D(dp__unit_alloc_req(u, &a, &r1b, NULL, &d), &d); /* retried */
    CHECK_EQ_U64(r1b.off, r1.off);
    CHECK_EQ_U64(r1b.token, r1.token);
    a = writer_alloc("retired", 8192, "w1", child, host, "shm");
    CHECK_OK_D(dp__unit_alloc_req(u, &a, &r2, NULL, &d), &d);
    CHECK(r2.token != r1.token);
    dp__unit_abort(u, "retired", 7, true);
    a = writer_alloc("tcp", 4096, "w2", child, host, "tcp");
    CHECK_OK_D(dp__unit_alloc_req(u, &a, &r3, NULL, &d), &d);
    dp__unit_abort(u, "tcp", 3, true);
    a = writer_alloc("far", 4096, "w3", child, "another-host/1", "shm");
    CHECK_OK_D(dp__unit_alloc_req(u, &a, &r4, NULL, &d), &d);
    dp__unit_abort(u, "far", 3, true);
    a = writer_alloc("anon", 4096, "", 0, "", "");
    CHECK_OK_D(dp__unit_alloc_req(u, &a, &r5, NULL, &d), &d);
    dp__unit_abort(u, "anon", 4, true);
    dp_unit_stats s = dp_test_unit_stats(u);
    CHECK_EQ(s.retired_bytes, 8192 + 3 * 4096);
    CHECK_EQ(s.retired_kept_bytes, 3 * 4096);
    CHECK_EQ(s.writers, 1); /* only w1's can ever be proved gone: tracked */
    /* Alive: nothing comes back (30 s: within the alloc's 60 s lease). */
    fake_t += 30;
    dp__unit_tick(u);
    s = dp_test_unit_stats(u);
    CHECK_EQ(s.retired_bytes, 8192 + 3 * 4096);
    CHECK_EQ(s.blobs, 1);
    CHECK_EQ(s.writers_gone, 0);
    /* Gone: seen at the next tick, handed back grace (5 s) later. */
    kill(child, SIGKILL);
    waitpid(child, NULL, 0);
    dp__unit_tick(u);
    s = dp_test_unit_stats(u);
    CHECK_EQ(s.writers_gone, 1);
    CHECK_EQ(s.retired_bytes, 8192 + 3 * 4096);
    fake_t += 4;
    dp__unit_tick(u);
    CHECK_EQ(dp_test_unit_stats(u).blobs, 1);
    fake_t += 2;
    dp__unit_tick(u);
    s = dp_test_unit_stats(u);
    EXPECT_EQ(s.retired_bytes, 3 * 4096);
    EXPECT_EQ(s.retired_kept_bytes, 3 * 4096);
    EXPECT_EQ(s.reclaimed_bytes, 8192);
    EXPECT_EQ(s.n_reclaimed, 1);
    EXPECT_EQ(s.allocs_reclaimed, 1);
    EXPECT_EQ(s.allocs_reclaimed_bytes, 4096);
    EXPECT_EQ(s.blobs, 0);
    EXPECT_EQ(s.allocated_bytes, 3 * 4096);
    dp_wire_commit_state st;
    CHECK_OK(dp__unit_commit(u, "open", 4, &st, NULL));
    CHECK_EQ(st, DP_WIRE_COMMIT_LOST);
    dp_test_unit_check(u);
    /* The space is reusable: the freed regions are allocated again. */
    uint64_t off;
    CHECK_OK(dp__unit_alloc(u, "again", 5, 8192 + 4096, 0, &off, NULL, NULL));
    dp__unit_destroy(u);
}

/* release_rows of a row another unit owns: Protocol error, nothing released. */
DP_TEST(release_rows_of_another_unit_is_refused)
{
    dp_unit *u = mk_unit(1 << 20, 2, 1);
    const char *keys[] = {"1@a"};
    tblob t = mk_blob(keys, 1, 64, 1);
    put_blob(u, "b", &t);
    uint64_t g[2] = {1, 2}; /* 2 belongs to unit 0 */
    dp_wire_request q;
    memset(&q, 0, sizeof q);
    q.op = DP_WIRE_OP_RELEASE_ROWS;
    q.rid = dp__wire_s("r1");
    q.a.release_rows.gidxs = (dp_wire_u64s){g, 2};
    dp_wire_reply r;
    bool replied = false;
    call_handler(u, &q, &r, &replied);
    CHECK(replied && !r.ok);
    CHECK(dp__wire_str_eq(r.err.kind, "Protocol"));
    char msg[512];
    dp__wire_str_copy(r.err.msg, msg, sizeof msg);
    CHECK_CONTAINS(msg, "row 2 belongs to unit 0");
    CHECK(r.incarnation == dp__unit_incarnation(u));
    dp__wire_reply_fini(&r);
    CHECK_EQ(dp_test_unit_stats(u).entries, 1);
    free(t.p);
    dp__unit_destroy(u);
}

/*
 * Request order: a request whose id is older than one the same client sent
 * later is refused (a notify dropped, unpin still carried out); other
 * clients, and ids of another form, are not affected.
 */
DP_TEST(stale_requests_are_refused)
{
    dp_unit *u = mk_unit(1 << 20, 1, 0);
    const char *A = "0123456789abcdef", *B = "fedcba9876543210";
    char rid[64];
    dp_wire_request q;
    dp_wire_reply r;
    bool replied = false;
    /* A's alloc with counter 5. */
    memset(&q, 0, sizeof q);
    q.op = DP_WIRE_OP_ALLOC;
    snprintf(rid, sizeof rid, "%s-5", A);
    q.rid = dp__wire_s(rid);
    q.a.alloc = (dp_wire_alloc_args){dp__wire_s("x"), 4096, 0, false};
    call_handler(u, &q, &r, &replied);
    CHECK(replied && r.ok);
    dp__wire_reply_fini(&r);
    /* A's older clear (counter 3) arrives late: refused, nothing released. */
    const char *keys[] = {"7@a"};
    tblob t = mk_blob(keys, 1, 64, 1);
    put_blob(u, "b", &t);
    uint64_t g = 7;
    memset(&q, 0, sizeof q);
    q.op = DP_WIRE_OP_RELEASE_ROWS;
    snprintf(rid, sizeof rid, "%s-3", A);
    q.rid = dp__wire_s(rid);
    q.a.release_rows.gidxs = (dp_wire_u64s){&g, 1};
    call_handler(u, &q, &r, &replied);
    CHECK(replied && !r.ok);
    CHECK(dp__wire_str_eq(r.err.kind, "Protocol"));
    char msg[512];
    dp__wire_str_copy(r.err.msg, msg, sizeof msg);
    CHECK_CONTAINS(msg, "stale request");
    dp__wire_reply_fini(&r);
    CHECK_EQ(dp_test_unit_stats(u).entries, 1);
    /* The same counter again is stale too; an older abort is dropped. */
    snprintf(rid, sizeof rid, "%s-5", A);
    q.rid = dp__wire_s(rid);
    call_handler(u, &q, &r, &replied);
    CHECK(replied && !r.ok);
    dp__wire_reply_fini(&r);
    memset(&q, 0, sizeof q);
    q.op = DP_WIRE_OP_ABORT;
    snprintf(rid, sizeof rid, "%s-4", A);
    q.rid = dp__wire_s(rid);
    q.a.abort = (dp_wire_abort_args){dp__wire_s("x"), false};
    call_handler(u, &q, &r, &replied);
    CHECK(!replied);
    CHECK_EQ(dp_test_unit_stats(u).blobs, 2); /* "x" is still allocated */
    /* Another client's low counters are its own; a newer A goes through. */
    memset(&q, 0, sizeof q);
    q.op = DP_WIRE_OP_RELEASE_ROWS;
    snprintf(rid, sizeof rid, "%s-1", B);
    q.rid = dp__wire_s(rid);
    q.a.release_rows.gidxs = (dp_wire_u64s){&g, 1};
    call_handler(u, &q, &r, &replied);
    CHECK(replied && r.ok && r.r.dropped == 1);
    dp__wire_reply_fini(&r);
    memset(&q, 0, sizeof q);
    q.op = DP_WIRE_OP_ABORT;
    snprintf(rid, sizeof rid, "%s-6", A);
    q.rid = dp__wire_s(rid);
    q.a.abort = (dp_wire_abort_args){dp__wire_s("x"), false};
    call_handler(u, &q, &r, &replied);
    CHECK_EQ(dp_test_unit_stats(u).blobs, 0);
    /* Ids of another form are never stale. */
    memset(&q, 0, sizeof q);
    q.op = DP_WIRE_OP_PING;
    for (int i = 0; i < 2; i++) {
        q.rid = dp__wire_s("r1");
        call_handler(u, &q, &r, &replied);
        CHECK(replied && r.ok);
        dp__wire_reply_fini(&r);
    }
    /* A stale unpin is still carried out (it only ends a pin). */
    put_blob(u, "c", &t);
    dp_wire_str k = dp__wire_s("7@a");
    memset(&q, 0, sizeof q);
    q.op = DP_WIRE_OP_RESOLVE_KEYS;
    snprintf(rid, sizeof rid, "%s-9", A);
    q.rid = dp__wire_s(rid);
    q.a.resolve_keys.keys = (dp_wire_strs){&k, 1};
    call_handler(u, &q, &r, &replied);
    CHECK(replied && r.ok && r.r.resolve_keys.pin_id.n > 0);
    char pin[64];
    dp__wire_str_copy(r.r.resolve_keys.pin_id, pin, sizeof pin);
    dp__wire_reply_fini(&r);
    CHECK_EQ(dp_test_unit_stats(u).pins, 1);
    memset(&q, 0, sizeof q);
    q.op = DP_WIRE_OP_UNPIN;
    snprintf(rid, sizeof rid, "%s-8", A);
    q.rid = dp__wire_s(rid);
    q.a.unpin.pin_id = dp__wire_s(pin);
    call_handler(u, &q, &r, &replied);
    CHECK_EQ(dp_test_unit_stats(u).pins, 0);
    CHECK_EQ(dp_test_unit_stats(u).stale_refused, 3);
    free(t.p);
    dp__unit_destroy(u);
}
