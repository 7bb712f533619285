/*
 * Tests for checkpoints (DESIGN section 9): the unit's save_shard and
 * load_shard called in process (round trip byte for byte, overwritten and
 * cleared keys stay gone, holds under concurrent puts, overwrites and clears,
 * corrupted and truncated files refused with nothing published, another
 * cluster shape refused, path rules) and through the control handler.
 */
#include "dp_test.h"
#include "dp_proc.h"
#include "dp_tsan_ucx.h"

#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "blob/blob.h"
#include "client/checkpoint.h"
#include "client/cluster.h"
#include "common/common.h"
#include "ctl/ctl.h"
#include "unit/unit.h"
#include "wire/wire.h"

static dp_unit *
mk_unit(uint64_t slab, uint32_t n_units, uint32_t unit_id)
{
    dp_unit_opts o;
    dp__unit_opts_init(&o);
    o.slab_bytes = slab;
    o.n_units = n_units;
    o.unit_id = unit_id;
    o.numa = DP_UNIT_NUMA_OFF;
    dp_unit *u = NULL;
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_OK_D(dp__unit_create(&o, &u, &d), &d);
    return u;
}

static void
check_unit(dp_unit *u)
{
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_OK_D(dp__unit_check(u, &d), &d);
}

static dp_unit_stats
stats(dp_unit *u)
{
    dp_unit_stats s;
    dp__unit_get_stats(u, &s);
    return s;
}

/* Payload byte k of key (gidx, field) at version ver. */
static uint8_t
pat(uint64_t gidx, uint32_t ver, uint64_t k)
{
    return (uint8_t)(gidx * 131 + ver * 17 + k * 3 + 1);
}

/* Put one blob holding rows gidxs[0..n) (field "f"), version ver, plen bytes each. */
static int put_rows_spill(dp_unit *u, const char *id, const uint64_t *gidxs, uint32_t n,
                          uint32_t ver, uint64_t plen, bool spill);

static int
put_rows(dp_unit *u, const char *id, const uint64_t *gidxs, uint32_t n, uint32_t ver,
         uint64_t plen)
{
    return put_rows_spill(u, id, gidxs, n, ver, plen, false);
}

/* As put_rows; with spill, a blob the put area cannot take goes to the SSD tier. */
static int
put_rows_spill(dp_unit *u, const char *id, const uint64_t *gidxs, uint32_t n,
               uint32_t ver, uint64_t plen, bool spill)
{
    dp_blob_builder *b = NULL;
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_OK_D(dp__blob_builder_create(DP_BLOB_FLAG_CRC, &b, &d), &d);
    uint8_t *pay = malloc(n * plen);
    char key[64];
    for (uint32_t i = 0; i < n; i++) {
        for (uint64_t k = 0; k < plen; k++)
            pay[i * plen + k] = pat(gidxs[i], ver, k);
        snprintf(key, sizeof key, "%llu@f", (unsigned long long)gidxs[i]);
        dp_blob_entry_spec s = {0};
        s.key = key;
        s.kind = DP_BLOB_BYTES;
        s.len = plen;
        s.payload = pay + i * plen;
        CHECK_OK_D(dp__blob_builder_add(b, &s, NULL, &d), &d);
    }
    dp_blob_layout lay;
    CHECK_OK_D(dp__blob_builder_layout(b, &lay, &d), &d);
    uint64_t off = 0;
    int rc =
        dp__unit_alloc_spill(u, id, strlen(id), lay.total_len, n, spill, &off, NULL, &d);
    if (rc == 0) {
        uint8_t *dst = dp__unit_slab(u) + off;
        CHECK_OK_D(dp__blob_builder_write(b, dst, lay.total_len, &d), &d);
        CHECK_OK_D(dp__blob_builder_copy_payloads(b, dst, lay.total_len, &d), &d);
        dp__blob_header_set_alloc(dst, dp__unit_incarnation(u),
                                  dp__unit_alloc_token(u, id, strlen(id)));
        dp_wire_commit_state st = DP_WIRE_COMMIT_LOST;
        for (int tries = 0; tries < 10000; tries++) {
            CHECK_OK_D(dp__unit_commit(u, id, strlen(id), &st, &d), &d);
            if (st != DP_WIRE_COMMIT_PENDING)
                break;
            usleep(1000);
        }
        CHECK_EQ(st, DP_WIRE_COMMIT_DONE);
    }
    dp__blob_builder_destroy(b);
    free(pay);
    return rc;
}

/* The version of row gidx's "f" held by u (0: missing), its bytes checked. */
static uint32_t
row_version(dp_unit *u, uint64_t gidx, uint64_t plen, uint32_t max_ver)
{
    char key[64];
    snprintf(key, sizeof key, "%llu@f", (unsigned long long)gidx);
    dp_wire_str k = {key, (uint32_t)strlen(key)};
    dp_unit_resolve_keys_res r;
    dp_detail d;
    dp_detail_clear(&d);
    /* A disk blob answers pending while it is staged: ask again. */
    for (int tries = 0;; tries++) {
        dp__unit_lock(u);
        CHECK_OK_D(dp__unit_resolve_keys_locked(u, &k, 1, &r, &d), &d);
        dp__unit_unlock(u);
        if (r.n_pending == 0 || tries > 5000)
            break;
        dp__unit_resolve_keys_res_fini(&r);
        usleep(1000);
    }
    CHECK_EQ(r.n_failed, 0);
    dp__unit_lock(u);
    uint32_t ver = 0;
    if (r.n_entries == 1) {
        CHECK_EQ(r.entries[0].len, plen);
        const uint8_t *p = dp__unit_slab(u) + r.entries[0].off;
        for (uint32_t v = 1; v <= max_ver && ver == 0; v++) {
            uint64_t k2 = 0;
            while (k2 < plen && p[k2] == pat(gidx, v, k2))
                k2++;
            if (k2 == plen)
                ver = v;
        }
        CHECKF(ver != 0, "row %llu: bytes match no version", (unsigned long long)gidx);
    }
    dp__unit_unlock(u);
    if (r.pin_id[0])
        dp__unit_unpin(u, r.pin_id, strlen(r.pin_id));
    dp__unit_resolve_keys_res_fini(&r);
    return ver;
}

static char tmpdir[256];

/* Every test removes its files; the directory goes at exit (if empty). */
static void
rm_tmpdir(void)
{
    rmdir(tmpdir);
}

static const char *
tpath(const char *name, char *buf, size_t cap)
{
    if (tmpdir[0] == '\0') {
        snprintf(tmpdir, sizeof tmpdir, "/tmp/dp-ckpt-test-XXXXXX");
        CHECK(mkdtemp(tmpdir) != NULL);
        atexit(rm_tmpdir);
    }
    mkdir(tmpdir, 0700); /* again if a test removed it */
    snprintf(buf, cap, "%s/%s", tmpdir, name);
    return buf;
}

static void
rm_shard(const char *p)
{
    char b[1100];
    unlink(p);
    snprintf(b, sizeof b, "%s.rows", p);
    unlink(b);
    snprintf(b, sizeof b, "%s.tmp", p);
    unlink(b);
    snprintf(b, sizeof b, "%s.rows.tmp", p);
    unlink(b);
}

static int
save(dp_unit *u, const char *p, dp_unit_save_res *res, dp_detail *d)
{
    return dp__unit_save_shard(u, p, strlen(p), res, d);
}

static int
load(dp_unit *u, const char *p, const dp_unit_save_res *sr, bool spill,
     dp_unit_load_res *lr, dp_detail *d)
{
    return dp__unit_load_shard(u, p, strlen(p), sr->blobs, sr->n_blobs, spill, lr, d);
}

DP_TEST(round_trip_live_keys_only)
{
    char p[512];
    tpath("rt", p, sizeof p);
    rm_shard(p);
    dp_unit *u = mk_unit(1 << 20, 2, 1);
    uint64_t g1[] = {1, 3, 5}, g2[] = {7}, g3[] = {3}, g4[] = {9, 11};
    CHECK_OK(put_rows(u, "b1", g1, 3, 1, 300));
    CHECK_OK(put_rows(u, "b2", g2, 1, 1, 300));
    CHECK_OK(put_rows(u, "b3", g3, 1, 2, 300)); /* overwrites 3@f */
    CHECK_OK(put_rows(u, "b4", g4, 2, 1, 300));
    uint64_t clr[] = {7, 9};
    CHECK_EQ(dp__unit_release_rows(u, clr, 2), 2); /* b2 gone, b4 half */
    dp_unit_save_res sr;
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_OK_D(save(u, p, &sr, &d), &d);
    CHECK_EQ(sr.n_blobs, 3);
    CHECK_EQ(sr.clears_during_save, 0);
    struct stat st;
    CHECK(stat(p, &st) == 0);
    CHECK_EQ((uint64_t)st.st_size, sr.nbytes);
    check_unit(u);

    dp_unit *v = mk_unit(1 << 20, 2, 1);
    dp_unit_load_res lr;
    CHECK_OK_D(load(v, p, &sr, false, &lr, &d), &d);
    CHECK_EQ(lr.n_loaded, 3);
    CHECK_EQ(lr.n_failed, 0);
    dp__unit_load_res_fini(&lr);
    check_unit(v);
    for (uint64_t g = 1; g < 13; g += 2)
        CHECK_EQ(row_version(v, g, 300, 2), row_version(u, g, 300, 2));
    CHECK_EQ(row_version(v, 3, 300, 2), 2);
    CHECK_EQ(row_version(v, 7, 300, 2), 0);
    CHECK_EQ(row_version(v, 9, 300, 2), 0);
    CHECK_EQ(stats(v).entries, stats(u).entries);
    CHECK_EQ(stats(v).published, 3);
    /* Loading again: everything is already there. */
    CHECK_OK_D(load(v, p, &sr, false, &lr, &d), &d);
    CHECK_EQ(lr.n_loaded, 3);
    dp__unit_load_res_fini(&lr);
    CHECK_EQ(stats(v).published, 3);
    check_unit(v);

    /* The final name exists: a save never replaces it, nor a stale .tmp. */
    dp_unit_save_res sr2;
    CHECK_ERR_D(save(u, p, &sr2, &d), DP_EEXIST, &d);
    CHECK_CONTAINS(dp_detail_msg(&d), "not replaced");
    dp__unit_destroy(v);
    dp__unit_save_res_fini(&sr);
    dp__unit_destroy(u);
    rm_shard(p);
}

DP_TEST(not_enough_room_then_failed)
{
    char p[512];
    tpath("room", p, sizeof p);
    rm_shard(p);
    dp_unit *u = mk_unit(1 << 20, 1, 0);
    for (uint32_t i = 0; i < 8; i++) {
        char id[16];
        snprintf(id, sizeof id, "b%u", i);
        uint64_t g = i;
        CHECK_OK(put_rows(u, id, &g, 1, 1, 20000));
    }
    dp_unit_save_res sr;
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_OK_D(save(u, p, &sr, &d), &d);
    dp_unit *v = mk_unit(64 << 10, 1, 0); /* room for 3 */
    dp_unit_load_res lr;
    CHECK_OK_D(load(v, p, &sr, false, &lr, &d), &d);
    CHECK(lr.n_loaded >= 2 && lr.n_loaded < 8);
    CHECK_EQ(lr.n_loaded + lr.n_failed, 8);
    CHECK_EQ(stats(v).published, lr.n_loaded);
    dp__unit_load_res_fini(&lr);
    check_unit(v);
    dp__unit_destroy(v);
    dp__unit_save_res_fini(&sr);
    dp__unit_destroy(u);
    rm_shard(p);
}

static void
corrupt_at(const char *p, uint64_t off)
{
    int fd = open(p, O_RDWR);
    CHECK(fd >= 0);
    uint8_t c = 0;
    CHECK_EQ(pread(fd, &c, 1, (off_t)off), 1);
    c ^= 0x40;
    CHECK_EQ(pwrite(fd, &c, 1, (off_t)off), 1);
    close(fd);
}

static void
copy_file(const char *from, const char *to)
{
    FILE *a = fopen(from, "rb"), *b = fopen(to, "wb");
    CHECK(a != NULL && b != NULL);
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, a)) > 0)
        CHECK_EQ(fwrite(buf, 1, n, b), n);
    fclose(a);
    fclose(b);
}

/* Loading p into a fresh unit fails with code, naming needle; nothing published. */
static void
refused(const char *p, const dp_unit_save_res *sr, uint32_t n_units, int code,
        const char *needle)
{
    dp_unit *v = mk_unit(1 << 20, n_units, 0);
    dp_unit_load_res lr;
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_ERR_D(load(v, p, sr, true, &lr, &d), code, &d);
    CHECK_CONTAINS(dp_detail_msg(&d), needle);
    dp_unit_stats s = stats(v);
    CHECK_EQ(s.blobs, 0);
    CHECK_EQ(s.entries, 0);
    CHECK_EQ(s.allocated_bytes, 0);
    check_unit(v);
    dp__unit_destroy(v);
}

DP_TEST(corrupted_and_truncated_refused)
{
    char p[512], q[512], qr[600], pr[600];
    tpath("good", p, sizeof p);
    tpath("bad", q, sizeof q);
    rm_shard(p);
    dp_unit *u = mk_unit(1 << 20, 1, 0);
    uint64_t g1[] = {1, 2}, g2[] = {3};
    CHECK_OK(put_rows(u, "b1", g1, 2, 1, 5000));
    CHECK_OK(put_rows(u, "b2", g2, 1, 1, 5000));
    dp_unit_save_res sr;
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_OK_D(save(u, p, &sr, &d), &d);
    snprintf(pr, sizeof pr, "%s.rows", p);
    snprintf(qr, sizeof qr, "%s.rows", q);
    /* Payload byte of the second blob: its CRC names it and its offset. */
    copy_file(p, q);
    copy_file(pr, qr);
    uint64_t off2 = sr.blobs[1].off;
    corrupt_at(q, off2 + sr.blobs[1].nbytes - 10);
    char needle[64];
    snprintf(needle, sizeof needle, "at offset %llu", (unsigned long long)off2);
    refused(q, &sr, 1, DP_ECORRUPT, needle);
    /* Header magic, version, trailer. */
    copy_file(p, q);
    corrupt_at(q, 0);
    refused(q, &sr, 1, DP_ECORRUPT, "bad magic at offset 0");
    copy_file(p, q);
    corrupt_at(q, 8);
    refused(q, &sr, 1, DP_ECORRUPT, "version");
    copy_file(p, q);
    corrupt_at(q, sr.nbytes - 3);
    refused(q, &sr, 1, DP_ECORRUPT, "bad trailer");
    /* Truncated. */
    copy_file(p, q);
    CHECK_EQ(truncate(q, (off_t)(sr.nbytes - 100)), 0);
    refused(q, &sr, 1, DP_ECORRUPT, "truncated");
    /* Rows file corrupted or truncated. */
    copy_file(p, q);
    corrupt_at(qr, 30);
    refused(q, &sr, 1, DP_ECORRUPT, "CRC mismatch");
    copy_file(pr, qr);
    struct stat st;
    CHECK(stat(qr, &st) == 0);
    CHECK_EQ(truncate(qr, st.st_size - 5), 0);
    refused(q, &sr, 1, DP_ECORRUPT, ".rows");
    /* Another cluster shape. */
    copy_file(pr, qr);
    refused(q, &sr, 2, DP_EINVAL, "cluster");
    /* Missing files. */
    unlink(qr);
    refused(q, &sr, 1, DP_ESYS, ".rows");
    rm_shard(q);
    refused(q, &sr, 1, DP_ESYS, q);
    dp__unit_save_res_fini(&sr);
    dp__unit_destroy(u);
    rm_shard(p);
}

DP_TEST(path_rules)
{
    dp_unit *u = mk_unit(1 << 20, 1, 0);
    dp_unit_save_res sr;
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_ERR_D(dp__unit_save_shard(u, "rel/x", 5, &sr, &d), DP_EINVAL, &d);
    CHECK_ERR_D(dp__unit_save_shard(u, "/tmp/a\nb", 8, &sr, &d), DP_EINVAL, &d);
    CHECK_ERR_D(dp__unit_save_shard(u, "/tmp/a\0b", 8, &sr, &d), DP_EINVAL, &d);
    char *longp = malloc(DP_UNIT_PATH_MAX + 2);
    memset(longp, 'a', DP_UNIT_PATH_MAX + 1);
    longp[0] = '/';
    CHECK_ERR_D(dp__unit_save_shard(u, longp, DP_UNIT_PATH_MAX + 1, &sr, &d), DP_EINVAL,
                &d);
    free(longp);
    dp_unit_load_res lr;
    CHECK_ERR_D(dp__unit_load_shard(u, "x", 1, NULL, 0, false, &lr, &d), DP_EINVAL, &d);
    /* A stale temporary name makes the save fail, nothing replaced. */
    char p[512], t[600];
    tpath("stale", p, sizeof p);
    rm_shard(p);
    snprintf(t, sizeof t, "%s.tmp", p);
    FILE *f = fopen(t, "w");
    CHECK(f != NULL);
    fclose(f);
    CHECK_ERR_D(dp__unit_save_shard(u, p, strlen(p), &sr, &d), DP_EEXIST, &d);
    CHECK(access(p, F_OK) != 0);
    rm_shard(p);
    dp__unit_destroy(u);
}

/* Run one request through the unit's handler; the reply keeps out alive. */
static void
handle(dp_unit *u, const dp_wire_request *req, dp_wire_reply *rep, dp_buf *out)
{
    dp_buf in = {0};
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_OK_D(dp__wire_request_encode(req, NULL, &in, &d), &d);
    dp__buf_reset(out);
    dp__unit_handle(u, in.data, in.len, out);
    CHECK(out->len > 0);
    CHECK_OK_D(dp__wire_reply_decode(out->data, out->len, req->op, NULL, rep, &d), &d);
    dp__buf_fini(&in);
}

DP_TEST(handler_save_load)
{
    char p[512];
    tpath("handler", p, sizeof p);
    rm_shard(p);
    dp_unit *u = mk_unit(1 << 20, 1, 0);
    uint64_t g1[] = {1, 2}, g2[] = {2};
    CHECK_OK(put_rows(u, "b1", g1, 2, 1, 100));
    CHECK_OK(put_rows(u, "b2", g2, 1, 2, 100));
    dp_wire_request q;
    memset(&q, 0, sizeof q);
    q.rid = (dp_wire_str){"r1", 2};
    q.op = DP_WIRE_OP_SAVE_SHARD;
    q.a.save_shard.path = (dp_wire_str){p, (uint32_t)strlen(p)};
    dp_wire_reply r;
    dp_buf out = {0}, out2 = {0};
    handle(u, &q, &r, &out);
    CHECK(r.ok);
    CHECK_EQ(r.r.save_shard.blobs.n, 2);
    struct stat st;
    CHECK(stat(p, &st) == 0);
    CHECK_EQ((uint64_t)st.st_size, r.r.save_shard.nbytes);

    dp_unit *v = mk_unit(1 << 20, 1, 0);
    dp_wire_request lq;
    memset(&lq, 0, sizeof lq);
    lq.rid = (dp_wire_str){"r2", 2};
    lq.op = DP_WIRE_OP_LOAD_SHARD;
    lq.a.load_shard.path = q.a.save_shard.path;
    lq.a.load_shard.blobs = r.r.save_shard.blobs;
    dp_wire_reply lr;
    handle(v, &lq, &lr, &out2);
    CHECK(lr.ok);
    CHECK_EQ(lr.r.load_shard.loaded.n, 2);
    CHECK_EQ(lr.r.load_shard.failed.n, 0);
    dp__wire_reply_fini(&lr);
    CHECK_EQ(row_version(v, 1, 100, 2), 1);
    CHECK_EQ(row_version(v, 2, 100, 2), 2);
    CHECK_EQ(stats(v).entries, 2);
    check_unit(v);
    /* Saving to the same name again is refused (Protocol error, nothing replaced). */
    dp__wire_reply_fini(&r);
    handle(u, &q, &r, &out);
    CHECK(!r.ok);
    CHECK_EQ(r.err.code, DP_EPROTO);
    dp__wire_reply_fini(&r);
    dp__buf_fini(&out);
    dp__buf_fini(&out2);
    dp__unit_destroy(v);
    dp__unit_destroy(u);
    rm_shard(p);
}

/* ---- concurrency: save while puts, overwrites and clears run ---- */

#define CC_ROWS 64
#define CC_PLEN 2048

typedef struct cc_state {
    dp_unit *u;
    volatile int stop;
    uint64_t seed;
    uint32_t puts;
} cc_state;

static void *
cc_writer(void *arg)
{
    cc_state *s = arg;
    uint64_t rs = s->seed;
    uint32_t n = 0;
    while (!__atomic_load_n(&s->stop, __ATOMIC_ACQUIRE)) {
        uint64_t g[3];
        uint32_t k = 1 + (uint32_t)(dp_test_rand(&rs) % 3);
        for (uint32_t i = 0; i < k; i++)
            g[i] = (dp_test_rand(&rs) % CC_ROWS) * 3 + i; /* distinct */
        char id[32];
        snprintf(id, sizeof id, "w%u", n);
        if (dp_test_rand(&rs) % 4 == 0) {
            dp__unit_release_rows(s->u, g, k);
        } else if (put_rows(s->u, id, g, k, 1 + n % 5, CC_PLEN) == 0) {
            n++;
            __atomic_store_n(&s->puts, n, __ATOMIC_RELEASE);
        }
    }
    s->puts = n;
    return NULL;
}

DP_TEST(save_during_puts_overwrites_clears)
{
    char p[512];
    tpath("cc", p, sizeof p);
    dp_unit *u = mk_unit(4 << 20, 1, 0);
    cc_state s = {.u = u, .seed = dp_test_seed()};
    pthread_t th;
    CHECK_EQ(pthread_create(&th, NULL, cc_writer, &s), 0);
    dp_detail d;
    dp_detail_clear(&d);
    uint64_t clears = 0;
    int overlapped = 0, restored = 0; /* saves that puts overlapped; rows restored */
    for (int round = 0; round < 12; round++) {
        rm_shard(p);
        dp_unit_save_res sr;
        uint32_t puts0 = __atomic_load_n(&s.puts, __ATOMIC_ACQUIRE);
        CHECK_OK_D(save(u, p, &sr, &d), &d);
        overlapped += __atomic_load_n(&s.puts, __ATOMIC_ACQUIRE) > puts0;
        clears += sr.clears_during_save;
        check_unit(u);
        dp_unit *v = mk_unit(4 << 20, 1, 0);
        dp_unit_load_res lr;
        CHECK_OK_D(load(v, p, &sr, false, &lr, &d), &d);
        CHECK_EQ(lr.n_failed, 0);
        CHECK_EQ(lr.n_loaded, sr.n_blobs);
        dp__unit_load_res_fini(&lr);
        check_unit(v);
        /* Every restored row holds one whole version's bytes. */
        for (uint64_t g = 0; g < CC_ROWS * 3; g++)
            restored += row_version(v, g, CC_PLEN, 5) != 0;
        dp__unit_destroy(v);
        dp__unit_save_res_fini(&sr);
    }
    __atomic_store_n(&s.stop, 1, __ATOMIC_RELEASE);
    pthread_join(th, NULL);
    check_unit(u);
    CHECK(s.puts > 0);
    DP_LOG_I("checkpoint: %u puts, %llu clears during saves, %d of 12 saves overlapped "
             "by puts, %d rows restored",
             s.puts, (unsigned long long)clears, overlapped, restored);
    CHECK_GE(overlapped, 1); /* saves ran under concurrent puts */
    CHECK_GE(restored, 1);   /* and restored rows whose bytes were checked */
    /* Quiet now: a save then a load reproduces every row exactly. */
    rm_shard(p);
    dp_unit_save_res sr;
    CHECK_OK_D(save(u, p, &sr, &d), &d);
    dp_unit *v = mk_unit(4 << 20, 1, 0);
    dp_unit_load_res lr;
    CHECK_OK_D(load(v, p, &sr, false, &lr, &d), &d);
    dp__unit_load_res_fini(&lr);
    for (uint64_t g = 0; g < CC_ROWS * 3; g++)
        CHECK_EQ(row_version(v, g, CC_PLEN, 5), row_version(u, g, CC_PLEN, 5));
    CHECK_EQ(stats(v).entries, stats(u).entries);
    dp__unit_destroy(v);
    dp__unit_save_res_fini(&sr);
    dp__unit_destroy(u);
    rm_shard(p);
    rmdir(tmpdir);
}

/* ---- cluster level: units served over ZMQ, dp__ckpt_save_units / _load_units ---- */

typedef struct tcluster {
    uint32_t n;
    dp_unit *u[4];
    dp_ctl_server *srv[4];
    dp_cluster cl;
    char file[512];
} tcluster;

/* n units (SSD tier on with ssd_dir) each served by a ctl server. */
static void
tc_start(tcluster *t, uint32_t n, uint64_t slab, const char *ssd_dir, const char *name)
{
    memset(t, 0, sizeof *t);
    t->n = n;
    t->cl.n_units = n;
    t->cl.units = calloc(n, sizeof *t->cl.units);
    dp_detail d;
    dp_detail_clear(&d);
    for (uint32_t i = 0; i < n; i++) {
        dp_unit_opts o;
        dp__unit_opts_init(&o);
        o.slab_bytes = slab;
        o.n_units = n;
        o.unit_id = i;
        o.numa = DP_UNIT_NUMA_OFF;
        if (ssd_dir != NULL) {
            o.ssd_dir = ssd_dir;
            o.staging_bytes = 4 << 20;
            o.io_threads = 2;
        }
        CHECK_OK_D(dp__unit_create(&o, &t->u[i], &d), &d);
        dp_ctl_server_opts so = {0};
        CHECK_OK_D(dp__ctl_server_open(&so, dp__unit_handle, dp__unit_handle_oversize,
                                       t->u[i], &t->srv[i], &d),
                   &d);
        dp__unit_set_address(t->u[i], dp__ctl_server_address(t->srv[i]));
        t->cl.units[i].id = i;
        snprintf(t->cl.units[i].zmq, sizeof t->cl.units[i].zmq, "%s",
                 dp__ctl_server_address(t->srv[i]));
        snprintf(t->cl.units[i].agent, sizeof t->cl.units[i].agent, "unit-%u", i);
    }
    tpath(name, t->file, sizeof t->file);
    CHECK_OK_D(dp__cluster_save(t->file, &t->cl, &d), &d);
}

static void
tc_stop(tcluster *t)
{
    for (uint32_t i = 0; i < t->n; i++) {
        dp__ctl_server_close(t->srv[i]);
        check_unit(t->u[i]);
        dp__unit_destroy(t->u[i]);
    }
    unlink(t->file);
    dp__cluster_fini(&t->cl);
}

/* Rows 0..rows-1 (plen bytes each) of two clusters hold the same versions. */
static void
tc_same(tcluster *a, tcluster *b, uint64_t rows, uint64_t plen, uint32_t max_ver)
{
    for (uint64_t g = 0; g < rows; g++)
        CHECK_EQ(row_version(b->u[g % b->n], g, plen, max_ver),
                 row_version(a->u[g % a->n], g, plen, max_ver));
    uint64_t ea = 0, eb = 0;
    for (uint32_t i = 0; i < a->n; i++)
        ea += stats(a->u[i]).entries;
    for (uint32_t i = 0; i < b->n; i++)
        eb += stats(b->u[i]).entries;
    CHECK_EQ(eb, ea);
}

/* Puts (per unit), overwrites and clears, in process. */
static void
tc_fill(tcluster *t, uint64_t rows, uint64_t plen, uint32_t per_blob)
{
    uint32_t nb = 0;
    for (uint32_t ver = 1; ver <= 2; ver++) {
        for (uint32_t u = 0; u < t->n; u++) {
            uint64_t g[64];
            uint32_t k = 0;
            for (uint64_t r = u; r < rows; r += t->n) {
                if (ver == 2 && r % 3 != 0)
                    continue; /* overwrite every third row */
                g[k++] = r;
                if (k == per_blob || r + t->n >= rows) {
                    char id[32];
                    snprintf(id, sizeof id, "c%u", nb++);
                    CHECK_OK(put_rows(t->u[u], id, g, k, ver, plen));
                    k = 0;
                }
            }
            if (k > 0) {
                char id[32];
                snprintf(id, sizeof id, "c%u", nb++);
                CHECK_OK(put_rows(t->u[u], id, g, k, ver, plen));
            }
        }
    }
    for (uint64_t g = 1; g < rows; g += 7) /* clears */
        dp__unit_release_rows(t->u[g % t->n], &g, 1);
}

static void
rm_tree_ckpt(const char *dir)
{
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    CHECK_EQ(system(cmd), 0);
}

DP_TEST(cluster_save_load_and_refusals)
{
    char dir[512];
    tpath("cl-ck", dir, sizeof dir);
    rm_tree_ckpt(dir);
    tcluster a, b, c3;
    tc_start(&a, 2, 8 << 20, NULL, "cl-a.json");
    tc_fill(&a, 100, 3000, 5);
    dp_ctl_client *cc = NULL;
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_OK_D(dp__ctl_client_create(&cc, &d), &d);
    dp_ckpt_summary s;
    /* Nothing saved yet. */
    tc_start(&b, 2, 8 << 20, NULL, "cl-b.json");
    CHECK_ERR_D(dp__ckpt_load_units(cc, &b.cl, dir, NULL, &s, &d), DP_ENOTFOUND, &d);
    CHECK_OK_D(dp__ckpt_save_units(cc, &a.cl, dir, NULL, &s, &d), &d);
    CHECK_EQ(s.n_units, 2);
    CHECK(s.blobs > 0);
    /* Restore into fresh units, byte for byte; cleared rows stay gone. */
    dp_ckpt_summary ls;
    CHECK_OK_D(dp__ckpt_load_units(cc, &b.cl, dir, NULL, &ls, &d), &d);
    CHECK_EQ(ls.loaded, s.blobs);
    CHECK_EQ(stats(a.u[0]).saves, 1);
    CHECK(stats(b.u[0]).loads >= 1);
    CHECK_EQ(stats(b.u[0]).loaded_blobs + stats(b.u[1]).loaded_blobs, s.blobs);
    CHECK_EQ(stats(a.u[0]).admin_running, 0);
    CHECK_STR(ls.checkpoint, s.checkpoint);
    tc_same(&a, &b, 100, 3000, 2);
    CHECK_EQ(row_version(b.u[1], 1, 3000, 2), 0);
    CHECK_EQ(row_version(b.u[0], 0, 3000, 2), 2);
    tc_stop(&b);
    /* Another shape is refused. */
    tc_start(&c3, 3, 8 << 20, NULL, "cl-c.json");
    CHECK_ERR_D(dp__ckpt_load_units(cc, &c3.cl, dir, NULL, &ls, &d), DP_EINVAL, &d);
    CHECK_CONTAINS(dp_detail_msg(&d), "gidx % n_units");
    tc_stop(&c3);
    /* A second save becomes current; corrupting its shard is refused with the file. */
    dp_ckpt_summary s2;
    CHECK_OK_D(dp__ckpt_save_units(cc, &a.cl, dir, NULL, &s2, &d), &d);
    CHECK(strcmp(s2.checkpoint, s.checkpoint) != 0);
    char shard[1024];
    snprintf(shard, sizeof shard, "%s/%s/unit-1.shard", dir, s2.checkpoint);
    corrupt_at(shard, 100);
    tc_start(&b, 2, 8 << 20, NULL, "cl-b.json");
    CHECK_ERR_D(dp__ckpt_load_units(cc, &b.cl, dir, NULL, &ls, &d), DP_ECORRUPT, &d);
    CHECK_CONTAINS(dp_detail_msg(&d), shard);
    for (uint32_t i = 0; i < 2; i++) {
        CHECK_EQ(stats(b.u[i]).blobs, 0);
        CHECK_EQ(stats(b.u[i]).allocated_bytes, 0);
    }
    /* Truncated. */
    corrupt_at(shard, 100);
    struct stat st;
    CHECK(stat(shard, &st) == 0);
    CHECK_EQ(truncate(shard, st.st_size - 1), 0);
    CHECK_ERR_D(dp__ckpt_load_units(cc, &b.cl, dir, NULL, &ls, &d), DP_ECORRUPT, &d);
    CHECK_CONTAINS(dp_detail_msg(&d), "truncated");
    CHECK_EQ(stats(b.u[0]).blobs + stats(b.u[1]).blobs, 0);
    /* A manifest whose blob numbers are not whole numbers >= 0 is refused. */
    char mpath[1024];
    snprintf(mpath, sizeof mpath, "%s/%s", dir, DP_CKPT_MANIFEST);
    FILE *mf = fopen(mpath, "rb");
    CHECK(mf != NULL);
    char *mtext = calloc(1, 1 << 20);
    size_t mlen = fread(mtext, 1, (1 << 20) - 1, mf);
    fclose(mf);
    CHECK(mlen > 0);
    const char *bad_numbers[] = {"-1", "1.5", "1e300"};
    for (size_t k = 0; k < DP_ARRAY_LEN(bad_numbers); k++) {
        char *blobs = strstr(mtext, "\"blobs\"");
        CHECK(blobs != NULL);
        char *open_br = strchr(blobs, '[');
        CHECK(open_br != NULL);
        size_t num_len = strcspn(open_br + 1, ",");
        mf = fopen(mpath, "wb");
        CHECK(mf != NULL);
        fwrite(mtext, 1, (size_t)(open_br + 1 - mtext), mf);
        fputs(bad_numbers[k], mf);
        fputs(open_br + 1 + num_len, mf);
        fclose(mf);
        CHECK_ERR_D(dp__ckpt_load_units(cc, &b.cl, dir, NULL, &ls, &d), DP_ECORRUPT, &d);
        CHECK_CONTAINS(dp_detail_msg(&d), "bad blob entry");
        CHECK_CONTAINS(dp_detail_msg(&d), mpath);
    }
    CHECK_EQ(stats(b.u[0]).blobs + stats(b.u[1]).blobs, 0);
    free(mtext);
    tc_stop(&b);
    dp__ctl_client_destroy(cc);
    tc_stop(&a);
    rm_tree_ckpt(dir);
}

typedef struct busy_save {
    const char *addr;
    const char *path;
    dp_buf reply;
    int rc;
    int done;         /* atomic */
    double timeout_s; /* 0: 60 */
} busy_save;

/* save_shard sent straight to the unit; done once its reply is in. */
static void *
busy_saver(void *arg)
{
    busy_save *b = arg;
    dp_ctl_client *cc = NULL;
    dp_detail d;
    dp_detail_clear(&d);
    dp_wire_request q;
    memset(&q, 0, sizeof q);
    q.op = DP_WIRE_OP_SAVE_SHARD;
    q.rid = (dp_wire_str){"s1", 2};
    q.a.save_shard.path = dp__wire_s(b->path);
    dp_buf req = {0};
    b->rc = dp__ctl_client_create(&cc, &d);
    if (b->rc == 0)
        b->rc = dp__wire_request_encode(&q, NULL, &req, &d);
    if (b->rc == 0)
        b->rc = dp__ctl_call(cc, b->addr, req.data, req.len, "s1",
                             b->timeout_s > 0 ? b->timeout_s : 60, &b->reply, &d);
    __atomic_store_n(&b->done, 1, __ATOMIC_RELEASE);
    dp__buf_fini(&req);
    dp__ctl_client_destroy(cc);
    return NULL;
}

/*
 * A unit writing its shard keeps answering: save_shard runs on a thread of
 * its own and replies through the ctl server later, so pings sent meanwhile
 * are answered while the save is still running (before, they waited behind
 * it, and at most one could be answered before its reply).
 */
DP_TEST(unit_answers_others_while_it_saves)
{
    char path[512];
    tpath("busy-shard", path, sizeof path);
    rm_shard(path);
    tcluster a;
    tc_start(&a, 1, 512 << 20, NULL, "busy.json");
    tc_fill(&a, 192, 1 << 20, 4); /* about 190 MiB to write and fsync */
    uint64_t live = stats(a.u[0]).entries;
    dp_ctl_client *pc = NULL;
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_OK_D(dp__ctl_client_create(&pc, &d), &d);
    busy_save b = {a.cl.units[0].zmq, path, {0}, -1, 0, 0};
    pthread_t th;
    CHECK_EQ(pthread_create(&th, NULL, busy_saver, &b), 0);
    dp_wire_request q;
    memset(&q, 0, sizeof q);
    q.op = DP_WIRE_OP_PING;
    q.rid = (dp_wire_str){"p1", 2};
    dp_buf req = {0}, rep = {0};
    CHECK_OK_D(dp__wire_request_encode(&q, NULL, &req, &d), &d);
    int during = 0, total = 0;
    while (!__atomic_load_n(&b.done, __ATOMIC_ACQUIRE)) {
        dp__buf_reset(&rep);
        CHECK_OK_D(
            dp__ctl_call(pc, a.cl.units[0].zmq, req.data, req.len, "p1", 60, &rep, &d),
            &d);
        total++;
        if (!__atomic_load_n(&b.done, __ATOMIC_ACQUIRE))
            during++;
    }
    pthread_join(th, NULL);
    CHECK_OK(b.rc);
    dp_wire_reply r;
    CHECK_OK_D(dp__wire_reply_decode(b.reply.data, b.reply.len, DP_WIRE_OP_SAVE_SHARD,
                                     NULL, &r, &d),
               &d);
    CHECK(r.ok);
    CHECK(r.r.save_shard.nbytes > (100u << 20));
    dp__wire_reply_fini(&r);
    printf("  %d of %d pings answered while save_shard ran\n", during, total);
    CHECKF(during >= 3, "only %d of %d pings answered during the save", during, total);
    CHECK_EQ(stats(a.u[0]).entries, live);
    dp__buf_fini(&req);
    dp__buf_fini(&rep);
    dp__buf_fini(&b.reply);
    dp__ctl_client_destroy(pc);
    tc_stop(&a);
    rm_shard(path);
}

/*
 * Two saves of one unit at once (possible since saves left the ctl thread):
 * both complete, and each shard loads back into a fresh unit as a full copy.
 */
DP_TEST(two_saves_of_one_unit_at_once)
{
    char p1[512], p2[512];
    tpath("twin-1", p1, sizeof p1);
    tpath("twin-2", p2, sizeof p2);
    rm_shard(p1);
    rm_shard(p2);
    tcluster a;
    tc_start(&a, 1, 256 << 20, NULL, "twin.json");
    tc_fill(&a, 96, 1 << 20, 4);
    busy_save b1 = {a.cl.units[0].zmq, p1, {0}, -1, 0, 0};
    busy_save b2 = {a.cl.units[0].zmq, p2, {0}, -1, 0, 0};
    pthread_t t1, t2;
    CHECK_EQ(pthread_create(&t1, NULL, busy_saver, &b1), 0);
    CHECK_EQ(pthread_create(&t2, NULL, busy_saver, &b2), 0);
    pthread_join(t1, NULL);
    pthread_join(t2, NULL);
    CHECK_OK(b1.rc);
    CHECK_OK(b2.rc);
    busy_save *bs[2] = {&b1, &b2};
    dp_detail d;
    dp_detail_clear(&d);
    for (int k = 0; k < 2; k++) {
        dp_wire_reply r;
        CHECK_OK_D(dp__wire_reply_decode(bs[k]->reply.data, bs[k]->reply.len,
                                         DP_WIRE_OP_SAVE_SHARD, NULL, &r, &d),
                   &d);
        CHECK(r.ok);
        tcluster c;
        tc_start(&c, 1, 256 << 20, NULL, "twin-c.json");
        dp_unit_load_res lr;
        CHECK_OK_D(dp__unit_load_shard(c.u[0], bs[k]->path, strlen(bs[k]->path),
                                       r.r.save_shard.blobs.v, r.r.save_shard.blobs.n,
                                       false, &lr, &d),
                   &d);
        CHECK_EQ(lr.n_failed, 0);
        dp__unit_load_res_fini(&lr);
        tc_same(&a, &c, 96, 1 << 20, 2);
        tc_stop(&c);
        dp__wire_reply_fini(&r);
        dp__buf_fini(&bs[k]->reply);
    }
    tc_stop(&a);
    rm_shard(p1);
    rm_shard(p2);
}

typedef struct busy_load {
    const char *addr, *path;
    const dp_wire_shard_blob *blobs;
    uint32_t n;
    dp_buf reply;
    int rc;
} busy_load;

/* load_shard sent straight to the unit. */
static void *
busy_loader(void *arg)
{
    busy_load *b = arg;
    dp_ctl_client *cc = NULL;
    dp_detail d;
    dp_detail_clear(&d);
    dp_wire_request q;
    memset(&q, 0, sizeof q);
    q.op = DP_WIRE_OP_LOAD_SHARD;
    q.rid = (dp_wire_str){"l1", 2};
    q.a.load_shard.path = dp__wire_s(b->path);
    q.a.load_shard.blobs = (dp_wire_shard_blobs){(dp_wire_shard_blob *)b->blobs, b->n};
    dp_buf req = {0};
    b->rc = dp__ctl_client_create(&cc, &d);
    if (b->rc == 0)
        b->rc = dp__wire_request_encode(&q, NULL, &req, &d);
    if (b->rc == 0)
        b->rc = dp__ctl_call(cc, b->addr, req.data, req.len, "l1", 60, &b->reply, &d);
    dp__buf_fini(&req);
    dp__ctl_client_destroy(cc);
    return NULL;
}

/*
 * A save and a load of one unit at once: both complete; the unit holds its
 * own rows and the loaded ones; the saved shard loads back with every row it
 * has equal to the unit's (a loaded row is in it or not, never half).
 */
DP_TEST(save_and_load_of_one_unit_at_once)
{
    char pa[512], pb[512];
    tpath("sl-a", pa, sizeof pa);
    tpath("sl-b", pb, sizeof pb);
    rm_shard(pa);
    rm_shard(pb);
    /* Shard b: rows 1000..1063 of another unit 0 of 1. */
    tcluster b;
    tc_start(&b, 1, 256 << 20, NULL, "sl-b.json");
    for (uint32_t k = 0; k < 16; k++) {
        uint64_t g[4];
        for (uint32_t j = 0; j < 4; j++)
            g[j] = 1000 + 4 * k + j;
        char id[16];
        snprintf(id, sizeof id, "b%u", k);
        CHECK_OK(put_rows(b.u[0], id, g, 4, 1, 1 << 20));
    }
    dp_unit_save_res sr;
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_OK_D(dp__unit_save_shard(b.u[0], pb, strlen(pb), &sr, &d), &d);
    tc_stop(&b);
    tcluster a;
    tc_start(&a, 1, 512 << 20, NULL, "sl-a.json");
    tc_fill(&a, 96, 1 << 20, 4);
    busy_save bs = {a.cl.units[0].zmq, pa, {0}, -1, 0, 0};
    busy_load bl = {a.cl.units[0].zmq, pb, sr.blobs, sr.n_blobs, {0}, -1};
    pthread_t t1, t2;
    CHECK_EQ(pthread_create(&t1, NULL, busy_saver, &bs), 0);
    CHECK_EQ(pthread_create(&t2, NULL, busy_loader, &bl), 0);
    pthread_join(t1, NULL);
    pthread_join(t2, NULL);
    CHECK_OK(bs.rc);
    CHECK_OK(bl.rc);
    dp_wire_reply rl, rs;
    CHECK_OK_D(dp__wire_reply_decode(bl.reply.data, bl.reply.len, DP_WIRE_OP_LOAD_SHARD,
                                     NULL, &rl, &d),
               &d);
    CHECK(rl.ok);
    CHECK_EQ(rl.r.load_shard.loaded.n, 16);
    dp__wire_reply_fini(&rl);
    for (uint64_t g = 1000; g < 1064; g++)
        CHECK_EQ(row_version(a.u[0], g, 1 << 20, 1), 1);
    CHECK_OK_D(dp__wire_reply_decode(bs.reply.data, bs.reply.len, DP_WIRE_OP_SAVE_SHARD,
                                     NULL, &rs, &d),
               &d);
    CHECK(rs.ok);
    tcluster c;
    tc_start(&c, 1, 512 << 20, NULL, "sl-c.json");
    dp_unit_load_res lr;
    CHECK_OK_D(dp__unit_load_shard(c.u[0], pa, strlen(pa), rs.r.save_shard.blobs.v,
                                   rs.r.save_shard.blobs.n, false, &lr, &d),
               &d);
    CHECK_EQ(lr.n_failed, 0);
    dp__unit_load_res_fini(&lr);
    for (uint64_t g = 0; g < 96; g++)
        CHECK_EQ(row_version(c.u[0], g, 1 << 20, 2), row_version(a.u[0], g, 1 << 20, 2));
    uint32_t with = 0;
    for (uint64_t g = 1000; g < 1064; g++) {
        uint32_t v = row_version(c.u[0], g, 1 << 20, 1);
        CHECK(v == 0 || v == 1);
        with += v;
    }
    printf("  the save caught %u of the 64 rows loaded meanwhile\n", with);
    dp__wire_reply_fini(&rs);
    tc_stop(&c);
    tc_stop(&a);
    dp__unit_save_res_fini(&sr);
    dp__buf_fini(&bs.reply);
    dp__buf_fini(&bl.reply);
    rm_shard(pa);
    rm_shard(pb);
}

/*
 * A unit destroyed while it writes a shard stops the save at its next blob
 * (it used to wait for the whole save): no shard and no temporary is left,
 * and the save's reply is dropped with the server.
 */
DP_TEST(destroy_stops_a_running_save)
{
    char path[512], tmp[600], rows[600], rtmp[600];
    tpath("stopped-shard", path, sizeof path);
    rm_shard(path);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    snprintf(rows, sizeof rows, "%s.rows", path);
    snprintf(rtmp, sizeof rtmp, "%s.rows.tmp", path);
    tcluster a;
    tc_start(&a, 1, 768 << 20, NULL, "stopped.json");
    tc_fill(&a, 384, 1 << 20, 4); /* about 380 MiB to write */
    busy_save b = {a.cl.units[0].zmq, path, {0}, -1, 0, 2.0};
    pthread_t th;
    CHECK_EQ(pthread_create(&th, NULL, busy_saver, &b), 0);
    double t0 = dp_test_now();
    while (stats(a.u[0]).admin_running == 0 && dp_test_now() - t0 < 10)
        usleep(200);
    CHECK_EQ(stats(a.u[0]).admin_running, 1);
    dp__ctl_server_close(a.srv[0]);
    dp__unit_destroy(a.u[0]); /* returns once the save has stopped */
    CHECK(access(path, F_OK) != 0);
    CHECK(access(tmp, F_OK) != 0);
    CHECK(access(rows, F_OK) != 0);
    CHECK(access(rtmp, F_OK) != 0);
    pthread_join(th, NULL);
    /* The reply went with the server: its connection dropped (or the wait ran out). */
    CHECKF(b.rc == DP_ETRANSFER || b.rc == DP_ETIMEDOUT, "got %s", dp_errname(b.rc));
    dp__buf_fini(&b.reply);
    unlink(a.file);
    dp__cluster_fini(&a.cl);
}

/* Count DIR's ckpt-* entries; *has gets whether name is among them. */
static int
count_ckpts(const char *dir, const char *name, bool *has)
{
    DIR *dd = opendir(dir);
    CHECK(dd != NULL);
    int n = 0;
    *has = false;
    struct dirent *e;
    while ((e = readdir(dd)) != NULL) {
        if (strncmp(e->d_name, "ckpt-", 5) != 0)
            continue;
        n++;
        if (strcmp(e->d_name, name) == 0)
            *has = true;
    }
    closedir(dd);
    return n;
}

/*
 * save with keep = 2 leaves the new checkpoint and the newest older one; a
 * directory that sorts after the new one (a save still running elsewhere) is
 * left alone; the current checkpoint loads.
 */
DP_TEST(save_keeps_the_newest_checkpoints)
{
    char dir[512];
    tpath("keep-ck", dir, sizeof dir);
    rm_tree_ckpt(dir);
    tcluster a;
    tc_start(&a, 2, 8 << 20, NULL, "keep-a.json");
    tc_fill(&a, 40, 2000, 4);
    dp_ctl_client *cc = NULL;
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_OK_D(dp__ctl_client_create(&cc, &d), &d);
    dp_ckpt_opts o;
    dp_ckpt_opts_init(&o);
    dp_ckpt_summary s[4];
    for (int i = 0; i < 3; i++)
        CHECK_OK_D(dp__ckpt_save_units(cc, &a.cl, dir, &o, &s[i], &d), &d);
    CHECK(strcmp(s[0].checkpoint, s[1].checkpoint) < 0);
    CHECK(strcmp(s[1].checkpoint, s[2].checkpoint) < 0);
    /* "Another save", newer than anything this test saves: never removed. */
    char later[600];
    snprintf(later, sizeof later, "%s/ckpt-99991231T235959.999999Z-00000000", dir);
    CHECK_EQ(mkdir(later, 0755), 0);
    bool has;
    CHECK_EQ(count_ckpts(dir, s[0].checkpoint, &has), 4);
    o.keep = 2;
    CHECK_OK_D(dp__ckpt_save_units(cc, &a.cl, dir, &o, &s[3], &d), &d);
    CHECK_EQ(count_ckpts(dir, s[3].checkpoint, &has), 3);
    CHECK(has);
    count_ckpts(dir, s[2].checkpoint, &has);
    CHECK(has);
    count_ckpts(dir, s[1].checkpoint, &has);
    CHECK(!has);
    count_ckpts(dir, "ckpt-99991231T235959.999999Z-00000000", &has);
    CHECK(has);
    CHECK_EQ(rmdir(later), 0);
    tcluster b;
    tc_start(&b, 2, 8 << 20, NULL, "keep-b.json");
    dp_ckpt_summary ls;
    CHECK_OK_D(dp__ckpt_load_units(cc, &b.cl, dir, NULL, &ls, &d), &d);
    CHECK_STR(ls.checkpoint, s[3].checkpoint);
    tc_same(&a, &b, 40, 2000, 2);
    tc_stop(&b);
    dp__ctl_client_destroy(cc);
    tc_stop(&a);
    rm_tree_ckpt(dir);
}

DP_TEST(cluster_ssd_rows_two_passes)
{
    char dir[512], ssd[512];
    tpath("cl-ssd", dir, sizeof dir);
    tpath("ssd", ssd, sizeof ssd);
    rm_tree_ckpt(dir);
    mkdir(ssd, 0700);
    tcluster a, b;
    /* 256 KiB put areas: most of the 1.2 MiB per unit spills to the SSD tier. */
    tc_start(&a, 2, 256 << 10, ssd, "ssd-a.json");
    uint32_t nb = 0;
    for (uint64_t g = 0; g < 40; g++) {
        char id[32];
        snprintf(id, sizeof id, "s%u", nb++);
        CHECK_OK(
            put_rows_spill(a.u[g % 2], id, &g, 1, 1 + (uint32_t)(g % 2), 60000, true));
    }
    uint64_t gc = 5;
    dp__unit_release_rows(a.u[1], &gc, 1);
    CHECK(stats(a.u[0]).disk_blobs > 0);
    dp_ctl_client *cc = NULL;
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_OK_D(dp__ctl_client_create(&cc, &d), &d);
    dp_ckpt_summary s, ls;
    CHECK_OK_D(dp__ckpt_save_units(cc, &a.cl, dir, NULL, &s, &d), &d);
    CHECK_EQ(s.blobs, 39);
    tc_start(&b, 2, 256 << 10, ssd, "ssd-b.json");
    CHECK_OK_D(dp__ckpt_load_units(cc, &b.cl, dir, NULL, &ls, &d), &d);
    CHECK_EQ(ls.loaded, 39);
    CHECK(ls.spilled > 0);
    CHECK(stats(b.u[0]).disk_blobs > 0);
    tc_same(&a, &b, 40, 60000, 2);
    tc_stop(&b);
    dp__ctl_client_destroy(cc);
    tc_stop(&a);
    rm_tree_ckpt(dir);
    rmdir(ssd);
}

/*
 * A saver killed midway: this program re-executed with DP_CKPT_SAVER=
 * "<cluster file>|<dir>" runs one dp__ckpt_save_units and exits.
 */
__attribute__((constructor)) static void
saver_main(void)
{
    const char *e = getenv("DP_CKPT_SAVER");
    if (e == NULL)
        return;
    char buf[1100];
    snprintf(buf, sizeof buf, "%s", e);
    char *bar = strchr(buf, '|');
    if (bar == NULL)
        _exit(3);
    *bar = '\0';
    dp_cluster cl;
    dp_detail d;
    dp_detail_clear(&d);
    dp_ctl_client *cc = NULL;
    dp_ckpt_summary s;
    if (dp__cluster_load(buf, &cl, &d) != 0 || dp__ctl_client_create(&cc, &d) != 0)
        _exit(4);
    int rc = dp__ckpt_save_units(cc, &cl, bar + 1, NULL, &s, &d);
    dp__ctl_client_destroy(cc);
    dp__cluster_fini(&cl);
    _exit(rc == 0 ? 0 : 5);
}

static char *
read_manifest(const char *dir)
{
    char p[1100];
    snprintf(p, sizeof p, "%s/%s", dir, DP_CKPT_MANIFEST);
    FILE *f = fopen(p, "rb");
    CHECK(f != NULL);
    char *m = calloc(1, 1 << 20);
    size_t n = fread(m, 1, (1 << 20) - 1, f);
    (void)n;
    fclose(f);
    return m;
}

DP_TEST(save_killed_midway_keeps_previous)
{
    char dir[512];
    tpath("cl-kill", dir, sizeof dir);
    rm_tree_ckpt(dir);
    tcluster a, b;
    tc_start(&a, 2, 64 << 20, NULL, "kill-a.json");
    tc_fill(&a, 64, 400000, 4); /* ~16 MiB per unit: a save takes a while */
    dp_ctl_client *cc = NULL;
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_OK_D(dp__ctl_client_create(&cc, &d), &d);
    dp_ckpt_summary s;
    CHECK_OK_D(dp__ckpt_save_units(cc, &a.cl, dir, NULL, &s, &d), &d);
    uint64_t rs = dp_test_seed();
    int killed = 0, midway = 0;
    for (int round = 0; round < 6; round++) {
        char *before = read_manifest(dir);
        char env[1200];
        snprintf(env, sizeof env, "%s|%s", a.file, dir);
        const char *saver[] = {"DP_CKPT_SAVER", env, NULL};
        uint64_t saves0 = stats(a.u[0]).saves + stats(a.u[1]).saves;
        pid_t pid = dp_test_spawn_self(saver, -1);
        /* Midway: once a unit runs the save (not before the saver connected). */
        bool began = false;
        for (double t0 = dp_test_now(); !began;) {
            began = stats(a.u[0]).admin_running + stats(a.u[1]).admin_running > 0 ||
                    stats(a.u[0]).saves + stats(a.u[1]).saves > saves0;
            siginfo_t si = {0};
            if (waitid(P_PID, (id_t)pid, &si, WEXITED | WNOHANG | WNOWAIT) == 0 &&
                si.si_pid == pid)
                break; /* the saver ended by itself */
            CHECKF(dp_test_now() - t0 < 60, "the saver did not reach the units in 60 s");
            usleep(200);
        }
        usleep((useconds_t)(dp_test_rand(&rs) % 40000));
        kill(pid, SIGKILL);
        int st = 0;
        CHECK_EQ(waitpid(pid, &st, 0), pid);
        if (WIFSIGNALED(st))
            killed++;
        else
            CHECK_EQ(WEXITSTATUS(st), 0);
        midway += began && WIFSIGNALED(st);
        /* The units finish the shards of a killed save before the next round. */
        for (double t0 = dp_test_now();
             stats(a.u[0]).admin_running + stats(a.u[1]).admin_running > 0;)
            CHECKF(dp_test_now() - t0 < 60, "a save still runs after 60 s");
        char *after = read_manifest(dir);
        /* Killed: the previous manifest, whole; finished: a complete new one. */
        if (WIFSIGNALED(st) && strcmp(before, after) != 0)
            CHECK(strstr(after, "\"units\"") != NULL);
        free(before);
        free(after);
    }
    DP_LOG_I("checkpoint: %d of 6 saves killed, %d of them midway", killed, midway);
    CHECK_GE(midway, 1); /* a save was killed while the units ran it */
    /* The units finish the shards of a killed save; give them time, then load. */
    usleep(300000);
    tc_start(&b, 2, 64 << 20, NULL, "kill-b.json");
    dp_ckpt_summary ls;
    CHECK_OK_D(dp__ckpt_load_units(cc, &b.cl, dir, NULL, &ls, &d), &d);
    tc_same(&a, &b, 64, 400000, 2);
    tc_stop(&b);
    dp__ctl_client_destroy(cc);
    tc_stop(&a);
    rm_tree_ckpt(dir);
}

/* ---- holds: rows cleared while the save copies ---- */

typedef struct hold_ctx {
    dp_unit *u;
    const char *path;
    dp_unit_save_res sr;
    int rc;
} hold_ctx;

static void *
hold_saver(void *arg)
{
    hold_ctx *h = arg;
    dp_detail d;
    dp_detail_clear(&d);
    h->rc = dp__unit_save_shard(h->u, h->path, strlen(h->path), &h->sr, &d);
    return NULL;
}

DP_TEST(clear_during_save_frees_after_copy)
{
    char p[512], tmp[600];
    tpath("hold", p, sizeof p);
    snprintf(tmp, sizeof tmp, "%s.tmp", p);
    int tries = 0, seen = 0;
    for (; tries < 5 && !seen; tries++) {
        rm_shard(p);
        dp_unit *u = mk_unit(80 << 20, 1, 0);
        uint64_t g[16];
        for (uint32_t i = 0; i < 16; i++) {
            char id[16];
            snprintf(id, sizeof id, "h%u", i);
            g[i] = i;
            CHECK_OK(put_rows(u, id, &g[i], 1, 1, 4 << 20));
        }
        hold_ctx h = {.u = u, .path = p};
        pthread_t th;
        CHECK_EQ(pthread_create(&th, NULL, hold_saver, &h), 0);
        /* path.tmp exists only after the snapshot: clear everything then. */
        double end = dp_test_now() + 10;
        while (access(tmp, F_OK) != 0 && dp_test_now() < end)
            ;
        CHECK_EQ(dp__unit_release_rows(u, g, 16), 16);
        dp_unit_stats s = stats(u);
        bool during = access(tmp, F_OK) == 0; /* still copying after the clear */
        if (during) {
            /* Held: out of the table, regions kept until the copy ends. */
            CHECK_EQ(s.published, 0);
            CHECK_EQ(s.zombies, 16);
            CHECK(s.allocated_bytes >= 64 << 20);
            check_unit(u);
        }
        CHECK_EQ(pthread_join(th, NULL), 0);
        CHECK_OK(h.rc);
        s = stats(u);
        CHECK_EQ(s.zombies, 0);
        CHECK_EQ(s.allocated_bytes, 0);
        check_unit(u);
        if (during) {
            seen = 1;
            CHECK_EQ(h.sr.clears_during_save, 1);
            /* The copy is whole: all 16 rows come back. */
            dp_unit *v = mk_unit(80 << 20, 1, 0);
            dp_unit_load_res lr;
            dp_detail d;
            dp_detail_clear(&d);
            CHECK_OK_D(load(v, p, &h.sr, false, &lr, &d), &d);
            CHECK_EQ(lr.n_loaded, 16);
            dp__unit_load_res_fini(&lr);
            for (uint64_t r = 0; r < 16; r++)
                CHECK_EQ(row_version(v, r, 4 << 20, 1), 1);
            dp__unit_destroy(v);
        }
        dp__unit_save_res_fini(&h.sr);
        dp__unit_destroy(u);
    }
    DP_LOG_I("checkpoint: clear landed during the copy after %d tries", tries);
    CHECKF(seen, "the save always ended before the clear (%d tries)", tries);
    rm_shard(p);
}

DP_TEST(unit_gone_during_save_keeps_previous)
{
    char dir[512];
    tpath("cl-gone", dir, sizeof dir);
    rm_tree_ckpt(dir);
    tcluster a, b;
    tc_start(&a, 2, 8 << 20, NULL, "gone-a.json");
    tc_fill(&a, 40, 2000, 4);
    dp_ctl_client *cc = NULL;
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_OK_D(dp__ctl_client_create(&cc, &d), &d);
    dp_ckpt_summary s, s2, ls;
    CHECK_OK_D(dp__ckpt_save_units(cc, &a.cl, dir, NULL, &s, &d), &d);
    /* More data, then unit 1 stops answering: the save fails, naming it. */
    uint64_t g = 2;
    CHECK_OK(put_rows(a.u[0], "late", &g, 1, 3, 2000));
    dp__ctl_server_close(a.srv[1]);
    a.srv[1] = NULL;
    dp_ckpt_opts o;
    dp_ckpt_opts_init(&o);
    o.timeout_s = 1;
    CHECK(dp__ckpt_save_units(cc, &a.cl, dir, &o, &s2, &d) != 0);
    CHECK_CONTAINS(dp_detail_msg(&d), "unit 1");
    char failed[1100];
    snprintf(failed, sizeof failed, "%s/%s", dir, s2.checkpoint);
    CHECKF(access(failed, F_OK) != 0, "%s left behind", failed);
    /* The previous checkpoint is still the current one, and loads. */
    tc_start(&b, 2, 8 << 20, NULL, "gone-b.json");
    CHECK_OK_D(dp__ckpt_load_units(cc, &b.cl, dir, NULL, &ls, &d), &d);
    CHECK_STR(ls.checkpoint, s.checkpoint);
    CHECK_EQ(row_version(b.u[0], 2, 2000, 3), 1); /* not the late put */
    tc_stop(&b);
    dp__ctl_client_destroy(cc);
    tc_stop(&a);
    rm_tree_ckpt(dir);
}

/* ---- the CLI through real unit processes (dataplane up / put / save / load / get) ----
 */

#if defined(DP_CLI_PATH)
static int
cli(const char *args, char *out, size_t cap)
{
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "'%s' %s 2>&1", DP_CLI_PATH, args);
    return dp_test_run_sh(cmd, out, cap);
}

static pid_t
up_start(const char *dir, uint32_t units)
{
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "exec '%s' up --dir '%s' --units %u --slab 32M --numa off >'%s.out' 2>&1",
             DP_CLI_PATH, dir, units, dir);
    fflush(NULL);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    char file[600];
    snprintf(file, sizeof file, "%s/cluster.json", dir);
    double end = dp_test_now() + 60;
    while (access(file, F_OK) != 0 && dp_test_now() < end)
        usleep(20000);
    CHECKF(access(file, F_OK) == 0, "dataplane up did not write %s", file);
    return pid;
}

static void
up_stop(pid_t pid)
{
    kill(pid, SIGTERM);
    int st = 0;
    CHECK_EQ(waitpid(pid, &st, 0), pid);
}

DP_TEST(cli_save_load_fresh_processes)
{
#ifdef DP_TEST_TSAN
    DP_SKIP("real `dataplane up` processes are not run under ThreadSanitizer (the "
            "in-process save and load tests cover the threads)");
#endif
    char dir[512], c1[600], c2[600], ck[600], args[3000], out[8192], f[600], g[600];
    tpath("cli", dir, sizeof dir);
    rm_tree_ckpt(dir);
    CHECK_EQ(mkdir(dir, 0700), 0);
    snprintf(c1, sizeof c1, "%s/c1", dir);
    snprintf(c2, sizeof c2, "%s/c2", dir);
    snprintf(ck, sizeof ck, "%s/ck", dir);
    pid_t up1 = up_start(c1, 2);
    /* Values: rows 0..5, row 4 overwritten, row 5 cleared. */
    for (int r = 0; r < 6; r++) {
        snprintf(f, sizeof f, "%s/v%d", dir, r);
        FILE *fp = fopen(f, "wb");
        CHECK(fp != NULL);
        for (int k = 0; k < 3000 + r * 10007; k++)
            fputc((r * 37 + k * 11) & 0xff, fp);
        fclose(fp);
        snprintf(args, sizeof args, "put --cluster '%s' --row %d --field x --file '%s'",
                 c1, r, f);
        CHECKF(cli(args, out, sizeof out) == 0, "%s", out);
    }
    snprintf(f, sizeof f, "%s/v0", dir);
    snprintf(args, sizeof args, "put --cluster '%s' --row 4 --field x --file '%s'", c1,
             f);
    CHECKF(cli(args, out, sizeof out) == 0, "%s", out);
    snprintf(args, sizeof args, "clear --cluster '%s' 5", c1);
    CHECKF(cli(args, out, sizeof out) == 0, "%s", out);
    snprintf(args, sizeof args, "save --cluster '%s' '%s'", c1, ck);
    CHECKF(cli(args, out, sizeof out) == 0, "%s", out);
    CHECK_CONTAINS(out, "saved ckpt-");
    CHECK_CONTAINS(out, "save: unit 1:");
    up_stop(up1);

    pid_t up2 = up_start(c2, 2);
    snprintf(args, sizeof args, "load --cluster '%s' '%s'", c2, ck);
    CHECKF(cli(args, out, sizeof out) == 0, "%s", out);
    CHECK_CONTAINS(out, "loaded ckpt-");
    for (int r = 0; r < 6; r++) {
        snprintf(g, sizeof g, "%s/got%d", dir, r);
        snprintf(args, sizeof args, "get --cluster '%s' %d@x -o '%s'", c2, r, g);
        int st = cli(args, out, sizeof out);
        if (r == 5) {
            CHECKF(st != 0, "cleared row 5 came back: %s", out);
            continue;
        }
        CHECKF(st == 0, "%s", out);
        snprintf(f, sizeof f, "%s/v%d", dir, r == 4 ? 0 : r);
        snprintf(args, sizeof args, "cmp -s '%s' '%s'", f, g);
        CHECKF(system(args) == 0, "row %d differs after the restore", r);
    }
    up_stop(up2);
    /* Another shape: re-homed through the command, every row where it now lives. */
    pid_t up3 = up_start(c1, 3);
    snprintf(args, sizeof args, "load --cluster '%s' '%s'", c1, ck);
    CHECKF(cli(args, out, sizeof out) == 0, "%s", out);
    CHECK_CONTAINS(out, "re-homing");
    CHECK_CONTAINS(out, "re-homed from 2 units into 3");
    for (int r = 0; r < 6; r++) {
        snprintf(g, sizeof g, "%s/got%d", dir, r);
        snprintf(args, sizeof args, "get --cluster '%s' %d@x -o '%s'", c1, r, g);
        int st = cli(args, out, sizeof out);
        if (r == 5) {
            CHECKF(st != 0, "cleared row 5 came back: %s", out);
            continue;
        }
        CHECKF(st == 0, "%s", out);
        CHECK_CONTAINS(out, r % 3 == 0 ? "unit 0" : r % 3 == 1 ? "unit 1" : "unit 2");
        snprintf(f, sizeof f, "%s/v%d", dir, r == 4 ? 0 : r);
        snprintf(args, sizeof args, "cmp -s '%s' '%s'", f, g);
        CHECKF(system(args) == 0, "row %d differs after the re-homed restore", r);
    }
    up_stop(up3);
    rm_tree_ckpt(dir);
    snprintf(args, sizeof args, "%s.out", c1);
    unlink(args);
    snprintf(args, sizeof args, "%s.out", c2);
    unlink(args);
}
#endif
