/*
 * Tests for src/xfer/endpoint and metadata: real processes, real UCX.
 *
 * Peers are this same program re-executed with DP_TEST_PEER set (a
 * constructor turns such a process into a peer before main runs), so every
 * peer starts with fresh UCX state. A peer creates an endpoint, allocates a
 * slab filled with a known pattern, sends its metadata over a socketpair and
 * then blocks reading that socket: it never progresses its worker unless its
 * progress thread is on. The parent moves bytes one-sided.
 *
 * UCX_TLS is set per test (both sides read it from the environment): unset
 * (UCX's default: shared memory on one host) or "tcp" (emulated RMA: the peer
 * needs its progress thread).
 */
#include "dp_test.h"
#include "dp_proc.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/common.h"
#include "xfer/endpoint.h"
#include "xfer/graveyard.h"
#include "xfer/metadata.h"

#define MiB (1024ull * 1024)

/* ---- the pattern a peer's slab starts with ---- */

static uint64_t
pat_word(uint64_t seed, uint64_t w)
{
    uint64_t z = w * 0x9e3779b97f4a7c15ull ^ seed;
    return z ^ (z >> 29);
}

static uint8_t
pat(uint64_t seed, uint64_t off)
{
    return (uint8_t)(pat_word(seed, off >> 3) >> (8 * (off & 7)));
}

/* Fill n bytes with a sequence derived from v, word by word (fast under sanitizers). */
static void
fill_words(uint8_t *q, uint64_t n, uint64_t v)
{
    uint64_t k = 0;
    for (; k + 8 <= n; k += 8) {
        uint64_t x = v + k * 0x9e3779b97f4a7c15ull;
        memcpy(q + k, &x, 8);
    }
    for (; k < n; k++)
        q[k] = (uint8_t)(v + k * 131);
}

/* Sanitizer builds run the same tests on less data, to stay well within the timeout. */
#ifdef DP_TEST_SANITIZED
#define SCALE_ROUNDS(n) (((n) + 2) / 3)
#else
#define SCALE_ROUNDS(n) (n)
#endif

/* ---- I/O helpers ---- */

/* ---- peer side (runs before main in a re-executed child) ---- */

static int poison_main(void);

static void
peer_main(void)
{
    int fd = atoi(getenv("DP_TEST_PEER_FD"));
    const char *name = getenv("DP_TEST_PEER_NAME");
    uint64_t slab = strtoull(getenv("DP_TEST_PEER_SLAB"), NULL, 0);
    uint64_t seed = strtoull(getenv("DP_TEST_PEER_SEED"), NULL, 0);
    dp__endpoint_opts o;
    dp__endpoint_opts_init(&o);
    o.progress_thread = atoi(getenv("DP_TEST_PEER_PT")) != 0;
    dp_detail d;
    dp_detail_clear(&d);
    dp__endpoint *ep = NULL;
    void *base = NULL;
    uint8_t *md = NULL;
    size_t md_len = 0;
    if (dp__endpoint_create(name, &o, &ep, &d) != DP_OK ||
        dp__endpoint_alloc(ep, slab, &base, &d) != DP_OK) {
        fprintf(stderr, "peer %s: %s\n", name, d.msg);
        _exit(2);
    }
    for (uint64_t w = 0; w < slab / 8; w++) {
        uint64_t x = pat_word(seed, w);
        memcpy((uint8_t *)base + 8 * w, &x, 8);
    }
    for (uint64_t i = slab & ~7ull; i < slab; i++)
        ((uint8_t *)base)[i] = pat(seed, i);
    if (dp__endpoint_metadata(ep, &md, &md_len, &d) != DP_OK) {
        fprintf(stderr, "peer %s: %s\n", name, d.msg);
        _exit(2);
    }
    uint64_t hdr[2] = {md_len, (uint64_t)(uintptr_t)base};
    if (dp_test_write_all(fd, hdr, sizeof hdr) != 0 ||
        dp_test_write_all(fd, md, md_len) != 0)
        _exit(3);
    free(md);
    /* Serve until told to quit: 'q' quits, 'c' answers a checksum of the slab. */
    for (;;) {
        char c;
        if (dp_test_read_all(fd, &c, 1) != 0 || c == 'q')
            break;
        if (c == 'c') {
            uint64_t h = 1469598103934665603ull;
            for (uint64_t i = 0; i < slab; i++)
                h = (h ^ ((uint8_t *)base)[i]) * 1099511628211ull;
            if (dp_test_write_all(fd, &h, sizeof h) != 0)
                break;
        }
    }
    dp__endpoint_destroy(ep);
    _exit(0);
}

__attribute__((constructor)) static void
peer_ctor(void)
{
    const char *mode = getenv("DP_TEST_PEER");
    if (mode == NULL)
        return;
    if (strcmp(mode, "peer") == 0)
        peer_main();
    if (strcmp(mode, "poison") == 0)
        _exit(poison_main());
    _exit(9);
}

/* ---- parent side ---- */

typedef struct peer {
    pid_t pid;
    int fd;
    uint8_t *md;
    size_t md_len;
    uint64_t base;
    uint64_t slab;
    uint64_t seed;
    char name[64];
} peer;

static int
peer_start(peer *p, const char *name, uint64_t slab, bool progress_thread, uint64_t seed)
{
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "%s", name);
    p->slab = slab;
    p->seed = seed;
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
        return -1;
    char fdbuf[16], slabbuf[32], seedbuf[32];
    snprintf(fdbuf, sizeof fdbuf, "%d", sv[1]);
    snprintf(slabbuf, sizeof slabbuf, "%llu", (unsigned long long)slab);
    snprintf(seedbuf, sizeof seedbuf, "%llu", (unsigned long long)seed);
    /* A peer never outlives the test, even a stopped one (SIGKILL ends those). */
    const char *env[] = {"DP_TEST_PEER",
                         "peer",
                         "DP_TEST_PEER_FD",
                         fdbuf,
                         "DP_TEST_PEER_NAME",
                         name,
                         "DP_TEST_PEER_SLAB",
                         slabbuf,
                         "DP_TEST_PEER_SEED",
                         seedbuf,
                         "DP_TEST_PEER_PT",
                         progress_thread ? "1" : "0",
                         NULL};
    pid_t pid = dp_test_spawn_self(env, sv[1]);
    close(sv[1]);
    p->pid = pid;
    p->fd = sv[0];
    uint64_t hdr[2];
    if (dp_test_read_all(p->fd, hdr, sizeof hdr) != 0 || hdr[0] > DP_MD_TOTAL_MAX)
        return -1;
    p->md_len = hdr[0];
    p->base = hdr[1];
    p->md = malloc(p->md_len);
    if (p->md == NULL || dp_test_read_all(p->fd, p->md, p->md_len) != 0)
        return -1;
    return 0;
}

/* Ask the peer for a checksum of its slab (proves the bytes landed in its memory). */
static uint64_t
peer_checksum(peer *p)
{
    uint64_t h = 0;
    if (dp_test_write_all(p->fd, "c", 1) != 0 ||
        dp_test_read_all(p->fd, &h, sizeof h) != 0)
        return 0;
    return h;
}

static void
peer_stop(peer *p)
{
    if (p->pid > 0) {
        kill(p->pid, SIGCONT);
        if (dp_test_write_all(p->fd, "q", 1) != 0)
            kill(p->pid, SIGKILL);
        int st;
        double t0 = dp_test_now();
        while (waitpid(p->pid, &st, WNOHANG) == 0) {
            if (dp_test_now() - t0 > 10)
                kill(p->pid, SIGKILL);
            usleep(1000);
        }
    }
    if (p->fd > 0)
        close(p->fd);
    free(p->md);
    memset(p, 0, sizeof *p);
}

static void
peer_kill(peer *p)
{
    kill(p->pid, SIGKILL);
    waitpid(p->pid, NULL, 0);
    p->pid = 0;
}

/* Set or unset UCX_TLS for the endpoints created next (parent and peers). */
static void
set_tls(const char *tls)
{
    if (tls == NULL)
        unsetenv("UCX_TLS");
    else
        setenv("UCX_TLS", tls, 1);
}

/* Random non-overlapping ranges: sizes log-uniform in [1, max_size], total <= cap. */
typedef struct plan {
    size_t n;
    dp__range local[80], remote[80];
} plan;

static uint64_t
rand_size(uint64_t *rs, uint64_t max_size)
{
    unsigned bits = 0;
    while ((1ull << bits) < max_size)
        bits++;
    uint64_t v = 1 + dp_test_rand(rs) % (1ull << (dp_test_rand(rs) % (bits + 1)));
    return v > max_size ? max_size : v;
}

/* Place sizes at random offsets in [0, cap): sequential with random gaps, then shuffled.
 */
static void
place(uint64_t *rs, const uint64_t *sizes, size_t n, uint64_t base, uint64_t cap,
      dp__range *out)
{
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++)
        total += sizes[i];
    size_t order[80];
    for (size_t i = 0; i < n; i++)
        order[i] = i;
    for (size_t i = n; i > 1; i--) {
        size_t j = dp_test_rand(rs) % i;
        size_t t = order[i - 1];
        order[i - 1] = order[j];
        order[j] = t;
    }
    uint64_t slack = cap - total, off = 0;
    for (size_t k = 0; k < n; k++) {
        size_t i = order[k];
        uint64_t gap = slack ? dp_test_rand(rs) % (slack / (n - k) + 1) : 0;
        slack -= gap;
        off += gap;
        out[i].addr = base + off;
        out[i].nbytes = sizes[i];
        off += sizes[i];
    }
}

static void
make_plan(uint64_t *rs, plan *pl, size_t n, uint64_t max_size, uint64_t lbase,
          uint64_t lcap, uint64_t rbase, uint64_t rcap)
{
    uint64_t sizes[80], total = 0, cap = DP_MIN(lcap, rcap);
    size_t k = 0;
    for (; k < n; k++) {
        uint64_t s = rand_size(rs, max_size);
        if (total + s > cap)
            break;
        sizes[k] = s;
        total += s;
    }
    pl->n = k;
    place(rs, sizes, k, lbase, lcap, pl->local);
    place(rs, sizes, k, rbase, rcap, pl->remote);
}

/*
 * WRITE then READ back random scattered ranges between a local buffer and a
 * peer's slab, checking the peer's initial pattern first.
 */
static void
scattered_roundtrip(const char *tls, bool peer_pt, uint64_t slab, uint64_t max_size,
                    int rounds, bool local_alloc)
{
    uint64_t rs = dp_test_seed();
    set_tls(tls);
    peer p;
    dp__endpoint *ep = NULL;
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_EQ(peer_start(&p, "peer-a", slab, peer_pt, rs ^ 0x55), 0);
    dp__endpoint_opts o;
    dp__endpoint_opts_init(&o);
    CHECK_OK_D(dp__endpoint_create("client", &o, &ep, &d), &d);
    uint64_t lcap = slab;
    uint8_t *lbuf = NULL, *rb = NULL;
    if (local_alloc) {
        void *a = NULL;
        CHECK_OK_D(dp__endpoint_alloc(ep, 2 * lcap, &a, &d), &d);
        lbuf = a;
    } else {
        lbuf = aligned_alloc(4096, 2 * lcap);
        CHECK(lbuf != NULL);
        CHECK_OK_D(dp__endpoint_register(ep, lbuf, 2 * lcap, &d), &d);
    }
    rb = lbuf + lcap; /* read-back half */
    char name[256];
    CHECK_OK_D(dp__endpoint_add_remote(ep, p.md, p.md_len, name, &d), &d);
    CHECK_STR(name, "peer-a");
    CHECK(dp__endpoint_has_remote(ep, "peer-a"));
    char *info = NULL;
    CHECK_OK_D(dp__endpoint_describe_remote(ep, "peer-a", &info, &d), &d);
    if (tls == NULL) {
        /* One host, default transports: RMA over shared memory, not tcp. */
        CHECKF(strstr(info, "posix") != NULL || strstr(info, "sysv") != NULL, "%s", info);
        CHECKF(strstr(info, "rma") != NULL || strstr(info, "RMA") != NULL ||
                   strstr(info, "put") != NULL || strstr(info, "posix") != NULL,
               "%s", info);
    }
    free(info);

    double t_total = dp_test_now();
    uint64_t moved = 0, ranges = 0;
    static plan pl;
    rounds = SCALE_ROUNDS(rounds);
    for (int round = 0; round < rounds; round++) {
        make_plan(&rs, &pl, 1 + dp_test_rand(&rs) % 64, max_size,
                  (uint64_t)(uintptr_t)lbuf, lcap, p.base, slab);
        if (round == 0) {
            /* The extremes always: one byte and the largest size. */
            pl.n = 2;
            pl.local[0] = (dp__range){(uint64_t)(uintptr_t)lbuf + 7, 1};
            pl.remote[0] = (dp__range){p.base + slab - 1, 1};
            pl.local[1] = (dp__range){(uint64_t)(uintptr_t)lbuf + 4096, max_size};
            pl.remote[1] = (dp__range){p.base + 1, max_size};
        }
        /* READ first: the peer's pattern must come back where nothing was written. */
        if (round == 0) {
            CHECK_OK_D(
                dp__endpoint_transfer(ep,
                                      &(dp__xfer_desc){DP_XFER_READ, pl.local, pl.n,
                                                       pl.remote, pl.n, "peer-a"},
                                      60, &d),
                &d);
            for (size_t i = 0; i < pl.n; i++)
                for (uint64_t k = 0; k < pl.local[i].nbytes; k += 1 + k / 7) {
                    uint8_t got = ((uint8_t *)(uintptr_t)pl.local[i].addr)[k];
                    uint8_t want = pat(p.seed, pl.remote[i].addr - p.base + k);
                    CHECKF(got == want, "range %zu byte %llu: %u != %u", i,
                           (unsigned long long)k, got, want);
                }
        }
        for (size_t i = 0; i < pl.n; i++)
            fill_words((uint8_t *)(uintptr_t)pl.local[i].addr, pl.local[i].nbytes,
                       dp_test_rand(&rs));
        CHECK_OK_D(dp__endpoint_transfer(ep,
                                         &(dp__xfer_desc){DP_XFER_WRITE, pl.local, pl.n,
                                                          pl.remote, pl.n, "peer-a"},
                                         60, &d),
                   &d);
        /* Read back into the other half of the buffer at the same relative offsets. */
        static dp__range back[80];
        for (size_t i = 0; i < pl.n; i++) {
            back[i] = (dp__range){pl.local[i].addr + lcap, pl.local[i].nbytes};
            memset((void *)(uintptr_t)back[i].addr, 0xEE, back[i].nbytes);
        }
        CHECK_OK_D(dp__endpoint_transfer(ep,
                                         &(dp__xfer_desc){DP_XFER_READ, back, pl.n,
                                                          pl.remote, pl.n, "peer-a"},
                                         60, &d),
                   &d);
        for (size_t i = 0; i < pl.n; i++) {
            CHECKF(memcmp((void *)(uintptr_t)back[i].addr,
                          (void *)(uintptr_t)pl.local[i].addr, pl.local[i].nbytes) == 0,
                   "round %d range %zu (%llu bytes) differs after WRITE+READ", round, i,
                   (unsigned long long)pl.local[i].nbytes);
            moved += 2 * pl.local[i].nbytes;
            ranges++;
        }
    }
    t_total = dp_test_now() - t_total;
    printf("  %s: %d rounds, %" PRIu64 " ranges, %.1f MiB moved in %.2f s (%.2f GB/s)\n",
           tls ? tls : "default tls", rounds, ranges, (double)moved / MiB, t_total,
           (double)moved / t_total / 1e9);
    CHECK_GE(ranges, (uint64_t)rounds + 1); /* every round moved a range, round 0 two */
    (void)rb;
    dp__endpoint_stats st;
    dp__endpoint_get_stats(ep, &st);
    CHECK(st.transfers_retained == 0);
    dp__endpoint_destroy(ep);
    if (!local_alloc)
        free(lbuf);
    peer_stop(&p);
    set_tls(NULL);
}

/* ---- tests ---- */

DP_TEST(metadata_roundtrip_and_rejects)
{
    uint8_t addr[37], k1[9] = "rkey-one", k2[3] = "k2";
    for (size_t i = 0; i < sizeof addr; i++)
        addr[i] = (uint8_t)i;
    dp__md_region r[2] = {{0x1000, 4096, k1, 8}, {0x10000, 1, k2, 2}};
    dp__buf b;
    dp__buf_init(&b);
    dp_detail d;
    /* The fields each encode below starts from. */
    const dp__md_fields base = {.name = "unit-3",
                                .gen = 42,
                                .xver = 0x010d0001,
                                .addr = addr,
                                .addr_len = sizeof addr,
                                .regions = r,
                                .n_regions = 2};
    dp__md_fields mf = base;
    CHECK_OK_D(dp__md_encode(&b, &mf, &d), &d);
    dp__md md;
    CHECK_OK_D(dp__md_parse(b.data, b.len, &md, &d), &d);
    CHECK_STR(md.name, "unit-3");
    CHECK_EQ_U64(md.gen, 42);
    CHECK_EQ_U64(md.xver, 0x010d0001);
    CHECK_EQ(md.addr_len, sizeof addr);
    CHECK(memcmp(md.addr, addr, sizeof addr) == 0);
    CHECK_EQ(md.n_regions, 2);
    CHECK_EQ_U64(md.regions[1].base, 0x10000);
    CHECK_EQ(md.regions[0].rkey_len, 8);
    CHECK(memcmp(md.regions[0].rkey, "rkey-one", 8) == 0);
    dp__md_fini(&md);
    /* Every truncation is rejected; so is a trailing byte and a bad magic/version. */
    for (size_t n = 0; n < b.len; n++)
        CHECK_ERR(dp__md_parse(b.data, n, &md, NULL), DP_EPROTO);
    uint8_t *x = malloc(b.len + 1);
    memcpy(x, b.data, b.len);
    x[b.len] = 0;
    CHECK_ERR_D(dp__md_parse(x, b.len + 1, &md, &d), DP_EPROTO, &d);
    CHECK_CONTAINS(d.msg, "trailing");
    x[0] = 'X';
    CHECK_ERR(dp__md_parse(x, b.len, &md, NULL), DP_EPROTO);
    x[0] = 'D';
    x[4] = 4;
    CHECK_ERR_D(dp__md_parse(x, b.len, &md, &d), DP_EPROTO, &d);
    CHECK_CONTAINS(d.msg, "version");
    for (uint8_t v = 1; v <= 2; v++) { /* an older dataplane's metadata: named as such */
        x[4] = v;
        CHECK_ERR_D(dp__md_parse(x, b.len, &md, &d), DP_EPROTO, &d);
        CHECK_CONTAINS(d.msg, "older");
    }
    x[4] = 3;
    x[28] = 4; /* a flag this build does not know */
    CHECK_ERR_D(dp__md_parse(x, b.len, &md, &d), DP_EPROTO, &d);
    CHECK_CONTAINS(d.msg, "flags");
    x[28] = DP_MD_F_SERVES;
    CHECK_OK_D(dp__md_parse(x, b.len, &md, &d), &d);
    CHECK_EQ(md.flags, DP_MD_F_SERVES);
    dp__md_fini(&md);
    free(x);
    /* Overlapping regions and bad names are refused by the encoder's peer too. */
    dp__md_region ov[2] = {{0x1000, 4096, k1, 8}, {0x1800, 1, k2, 2}};
    dp__buf_reset(&b);
    mf = base;
    mf.name = "u";
    mf.gen = 1;
    mf.regions = ov;
    CHECK_OK(dp__md_encode(&b, &mf, NULL));
    CHECK_ERR_D(dp__md_parse(b.data, b.len, &md, &d), DP_EPROTO, &d);
    CHECK_CONTAINS(d.msg, "overlaps");
    mf.regions = NULL;
    mf.n_regions = 0;
    mf.name = "has space";
    CHECK_ERR(dp__md_encode(&b, &mf, NULL), DP_EINVAL);
    mf.name = "";
    CHECK_ERR(dp__md_encode(&b, &mf, NULL), DP_EINVAL);
    /* The process block: round trip, cut short, reserved bytes. */
    dp__md_proc me;
    CHECK(dp__proc_self(&me));
    dp__buf_reset(&b);
    mf = base;
    mf.name = "u";
    mf.gen = 1;
    mf.flags = DP_MD_F_SERVES;
    mf.proc = &me;
    CHECK_OK(dp__md_encode(&b, &mf, NULL));
    CHECK_OK_D(dp__md_parse(b.data, b.len, &md, &d), &d);
    CHECK_EQ(md.flags, DP_MD_F_SERVES | DP_MD_F_PROC);
    CHECK(memcmp(&md.proc, &me, sizeof me) == 0);
    CHECK(dp__proc_same_host(&me, &md.proc));
    CHECK(!dp__proc_exited(&md.proc));
    CHECK(me.start > 0); /* field 22 of /proc/self/stat, not a constant field */
    md.proc.start++;     /* the pid taken over by a later process */
    CHECK(dp__proc_exited(&md.proc));
    dp__md_fini(&md);
    CHECK_ERR_D(dp__md_parse(b.data, b.len - 1, &md, &d), DP_EPROTO, &d);
    CHECK_CONTAINS(d.msg, "process");
    ((uint8_t *)b.data)[b.len - 1] = 1;
    CHECK_ERR_D(dp__md_parse(b.data, b.len, &md, &d), DP_EPROTO, &d);
    CHECK_CONTAINS(d.msg, "process");
    /* Random corruption never crashes and never yields out-of-bounds pointers. */
    dp__buf_reset(&b);
    mf = base;
    mf.proc = &me;
    CHECK_OK(dp__md_encode(&b, &mf, NULL));
    uint64_t rs = dp_test_seed();
    uint8_t *y = malloc(b.len);
    int parsed = 0; /* corrupted copies that parsed: their pointers were checked */
    for (int it = 0; it < 20000; it++) {
        memcpy(y, b.data, b.len);
        int flips = 1 + (int)(dp_test_rand(&rs) % 4);
        for (int f = 0; f < flips; f++)
            y[dp_test_rand(&rs) % b.len] = (uint8_t)dp_test_rand(&rs);
        size_t n = b.len - dp_test_rand(&rs) % 3;
        if (dp__md_parse(y, n, &md, NULL) == DP_OK) {
            CHECK(md.addr >= y && md.addr + md.addr_len <= y + n);
            for (uint32_t i = 0; i < md.n_regions; i++)
                CHECK(md.regions[i].rkey >= y &&
                      md.regions[i].rkey + md.regions[i].rkey_len <= y + n);
            dp__md_fini(&md);
            parsed++;
        }
    }
    printf("  %d of 20000 corrupted copies parsed\n", parsed);
    CHECK_GE(parsed, 100);
    free(y);
    dp__buf_fini(&b);
}

DP_TEST(create_rejects_bad_names_and_policy)
{
    dp__endpoint *ep = (dp__endpoint *)1;
    dp_detail d;
    CHECK_ERR(dp__endpoint_create("", NULL, &ep, &d), DP_EINVAL);
    CHECK(ep == NULL);
    CHECK_ERR(dp__endpoint_create("a b", NULL, &ep, &d), DP_EINVAL);
    dp__endpoint_opts o;
    dp__endpoint_opts_init(&o);
    o.require_rdma = true;
    set_tls(NULL);
    CHECK_ERR_D(dp__endpoint_create("rdma-only", &o, &ep, &d), DP_EPOLICY, &d);
    CHECK_CONTAINS(d.msg, "UCX_TLS");
    set_tls("tcp");
    CHECK_ERR_D(dp__endpoint_create("rdma-only", &o, &ep, &d), DP_EPOLICY, &d);
    CHECK_CONTAINS(d.msg, "tcp");
    /* The environment switch does the same without the option. */
    o.require_rdma = false;
    setenv("DP_REQUIRE_RDMA", "1", 1);
    CHECK_ERR_D(dp__endpoint_create("rdma-only", &o, &ep, &d), DP_EPOLICY, &d);
    unsetenv("DP_REQUIRE_RDMA");
    /*
     * Strings the policy allows, on a host where UCX finds no RDMA device: the
     * endpoint says so at once, not at the first connect.
     */
    set_tls("rc,sm,self");
    o.require_rdma = true;
    int rc = dp__endpoint_create("rdma-only", &o, &ep, &d);
    if (rc == DP_OK) {
        printf("  this host has an RDMA transport: rc,sm,self accepted\n");
        dp__endpoint_destroy(ep);
    } else {
        CHECK_EQ(rc, DP_EPOLICY);
        CHECK_CONTAINS(d.msg, "no RDMA transport");
    }
    o.require_rdma = false;
    set_tls(NULL);
    CHECK_OK_D(dp__endpoint_create("fine", &o, &ep, &d), &d);
    dp__endpoint_destroy(ep);
    dp__endpoint_destroy(NULL);
}

DP_TEST(write_read_scattered_shm_no_target_progress)
{
    /* Peer without a progress thread: shared-memory RMA must not need it. */
    scattered_roundtrip(NULL, false, 160 * MiB / DP_TEST_BULK_DIV,
                        64 * MiB / DP_TEST_BULK_DIV, 12, true);
}

DP_TEST(write_read_scattered_registered_malloc)
{
    scattered_roundtrip(NULL, true, 96 * MiB / DP_TEST_BULK_DIV,
                        64 * MiB / DP_TEST_BULK_DIV, 6, false);
}

DP_TEST(write_read_scattered_tcp_with_progress_thread)
{
    /* Emulated RMA over TCP is slow (0.03-0.5 GB/s): keep the volume small. */
    scattered_roundtrip("tcp", true, 12 * MiB, 4 * MiB, 4, true);
}

/*
 * The peer's progress thread serves emulated RMA whether it polls on after
 * each event (the default, 200 us) or sleeps at once (DP_PROGRESS_SPIN_US=0)
 * or polls long (50 ms); a malformed setting fails the endpoint's creation,
 * naming it.
 */
DP_TEST(progress_spin_settings)
{
    static const char *ok[] = {"0", "50000"};
    for (size_t i = 0; i < DP_ARRAY_LEN(ok); i++) {
        setenv("DP_PROGRESS_SPIN_US", ok[i], 1); /* the peers inherit it */
        scattered_roundtrip("tcp", true, 4 * MiB, 2 * MiB, 2, true);
    }
    set_tls(NULL);
    static const char *bad[] = {"-1", "1000001", "fast", "10us"};
    for (size_t i = 0; i < DP_ARRAY_LEN(bad); i++) {
        setenv("DP_PROGRESS_SPIN_US", bad[i], 1);
        dp__endpoint *ep = NULL;
        dp_detail d;
        CHECK_ERR(dp__endpoint_create("spin-bad", NULL, &ep, &d), DP_EINVAL);
        CHECK(ep == NULL);
        CHECK_CONTAINS(d.msg, "DP_PROGRESS_SPIN_US");
    }
    unsetenv("DP_PROGRESS_SPIN_US");
}

/*
 * The memcpy path copies ranges that continue one another on both sides as
 * one run, and splits where either side jumps: every byte lands where its
 * own range says (checked by READing back in another order).
 */
DP_TEST(adjacent_ranges_copy_as_runs)
{
    set_tls(NULL);
    peer p;
    dp_detail d;
    CHECK_EQ(peer_start(&p, "peer-run", 4 * MiB, false, 9), 0);
    dp__endpoint *ep = NULL;
    CHECK_OK_D(dp__endpoint_create("client-run", NULL, &ep, &d), &d);
    uint8_t *a = NULL;
    CHECK_OK_D(dp__endpoint_alloc(ep, 4 * MiB, (void **)&a, &d), &d);
    CHECK_OK_D(dp__endpoint_add_remote(ep, p.md, p.md_len, NULL, &d), &d);
    for (size_t i = 0; i < 4 * MiB; i++)
        a[i] = (uint8_t)(i * 131 + 7);
    uint64_t la = (uint64_t)(uintptr_t)a;
    /* 0-2 continue one another on both sides; 3 continues locally only; 4
     * continues remotely only; 5 jumps on both. */
    dp__range l[6] = {{la, 1000},       {la + 1000, 24},  {la + 1024, 3000},
                      {la + 4024, 500}, {la + 8192, 100}, {la + 9000, 64}};
    dp__range r[6] = {{p.base + 64, 1000},  {p.base + 1064, 24},  {p.base + 1088, 3000},
                      {p.base + 9000, 500}, {p.base + 9500, 100}, {p.base + 20000, 64}};
    CHECK_OK_D(dp__endpoint_transfer(
                   ep, &(dp__xfer_desc){DP_XFER_WRITE, l, 6, r, 6, "peer-run"}, 10, &d),
               &d);
    /* Read each range back into its own spot of a second area, in reverse. */
    uint8_t *b = a + 2 * MiB;
    memset(b, 0, MiB);
    dp__range lb[6], rb[6];
    uint64_t at = 0;
    for (int i = 0; i < 6; i++) {
        lb[i] = (dp__range){(uint64_t)(uintptr_t)b + at, r[5 - i].nbytes};
        rb[i] = r[5 - i];
        at += r[5 - i].nbytes;
    }
    CHECK_OK_D(dp__endpoint_transfer(
                   ep, &(dp__xfer_desc){DP_XFER_READ, lb, 6, rb, 6, "peer-run"}, 10, &d),
               &d);
    for (int i = 0; i < 6; i++) {
        const uint8_t *got = (const uint8_t *)(uintptr_t)lb[i].addr;
        const uint8_t *want = (const uint8_t *)(uintptr_t)l[5 - i].addr;
        CHECKF(memcmp(got, want, lb[i].nbytes) == 0, "range %d came back different",
               5 - i);
    }
    dp__endpoint_stats st;
    dp__endpoint_get_stats(ep, &st);
    CHECK_EQ_U64(st.memcpy_ranges, 12); /* counted per range, copied per run */
    dp__endpoint_destroy(ep);
    peer_stop(&p);
}

/*
 * DP_PREFAULT=touch (the default): the peer's mapping is faulted in 2 MiB
 * chunks as transfers first touch them. Ranges across a chunk boundary, in
 * the last partial chunk and at the very end of the region, small (memcpy
 * path) and large (UCX path), land and read back byte for byte; the
 * endpoint opened without faulting anything in.
 */
DP_TEST(touch_prefault_faults_what_transfers_touch)
{
    set_tls(NULL);
    setenv("DP_PREFAULT", "touch", 1);
    peer p;
    dp_detail d;
    const uint64_t slab = 5 * MiB + 4096;
    CHECK_EQ(peer_start(&p, "peer-touch", slab, false, 11), 0);
    dp__endpoint *ep = NULL;
    dp__endpoint_opts eo;
    dp__endpoint_opts_init(&eo);
    eo.memcpy_max = 64 * 1024; /* the large ranges through UCX */
    CHECK_OK_D(dp__endpoint_create("client-touch", &eo, &ep, &d), &d);
    uint8_t *a = NULL;
    CHECK_OK_D(dp__endpoint_alloc(ep, 8 * MiB, (void **)&a, &d), &d);
    CHECK_OK_D(dp__endpoint_add_remote(ep, p.md, p.md_len, NULL, &d), &d);
    for (size_t i = 0; i < 4 * MiB; i++)
        a[i] = (uint8_t)(i * 37 + 1);
    uint64_t la = (uint64_t)(uintptr_t)a;
    dp__range l[4] = {
        {la, 200}, {la + 4096, 70000}, {la + 131072, 64}, {la + MiB, 3 * MiB / 2}};
    dp__range r[4] = {{p.base + 2 * MiB - 100, 200},
                      {p.base + 4 * MiB + 10, 70000},
                      {p.base + slab - 64, 64},
                      {p.base + 2 * MiB + 200, 3 * MiB / 2}};
    CHECK_OK_D(dp__endpoint_transfer(
                   ep, &(dp__xfer_desc){DP_XFER_WRITE, l, 4, r, 4, "peer-touch"}, 10, &d),
               &d);
    uint8_t *b = a + 4 * MiB;
    memset(b, 0, 4 * MiB);
    dp__range lb[4];
    uint64_t at = 0;
    for (int i = 0; i < 4; i++) {
        lb[i] = (dp__range){(uint64_t)(uintptr_t)b + at, r[i].nbytes};
        at += DP_ALIGN_UP(r[i].nbytes, 64);
    }
    CHECK_OK_D(dp__endpoint_transfer(
                   ep, &(dp__xfer_desc){DP_XFER_READ, lb, 4, r, 4, "peer-touch"}, 10, &d),
               &d);
    for (int i = 0; i < 4; i++)
        CHECKF(memcmp((void *)(uintptr_t)lb[i].addr, (void *)(uintptr_t)l[i].addr,
                      l[i].nbytes) == 0,
               "range %d came back different", i);
    dp__endpoint_destroy(ep);
    peer_stop(&p);
    unsetenv("DP_PREFAULT");
}

/*
 * An op's memcpy-path copies of 512 KiB or more are shared by copy_threads
 * threads (docs/design.md, "Parallel copies"): a 3 MiB range, a 700 KiB one
 * and a thousand 4 KiB ones at scattered places land and read back byte for
 * byte with 1, 2 and 4 threads, and the endpoint counts the batches it split
 * (none with one thread, none for an op under 512 KiB). DP_COPY_THREADS must
 * be a count of 1..16.
 */
DP_TEST(large_copies_share_threads)
{
    set_tls(NULL);
    peer p;
    dp_detail d;
    CHECK_EQ(peer_start(&p, "peer-par", 16 * MiB, false, 21), 0);
    enum { N = 1002 };
    static dp__range l[N], r[N], lb[N];
    for (unsigned threads = 1; threads <= 4; threads *= 2) {
        dp__endpoint_opts eo;
        dp__endpoint_opts_init(&eo);
        eo.copy_threads = threads;
        dp__endpoint *ep = NULL;
        CHECK_OK_D(dp__endpoint_create("client-par", &eo, &ep, &d), &d);
        uint8_t *a = NULL;
        CHECK_OK_D(dp__endpoint_alloc(ep, 16 * MiB, (void **)&a, &d), &d);
        CHECK_OK_D(dp__endpoint_add_remote(ep, p.md, p.md_len, NULL, &d), &d);
        for (size_t i = 0; i < 8 * MiB; i++)
            a[i] = (uint8_t)(i * 29 + threads);
        uint64_t la = (uint64_t)(uintptr_t)a, at = 0, total = 0;
        for (int i = 0; i < N; i++) {
            uint64_t n = i == 0 ? 3 * MiB : i == 1 ? 700 * 1024 : 4096;
            l[i] = (dp__range){la + at, n};
            /* remote places reversed in pairs: runs break, every range still lands */
            uint64_t roff = 8 * MiB - at - n;
            r[i] = (dp__range){p.base + (roff & ~(uint64_t)63), n};
            at += n + 64;
            total += n;
        }
        CHECK_OK_D(
            dp__endpoint_transfer(
                ep, &(dp__xfer_desc){DP_XFER_WRITE, l, N, r, N, "peer-par"}, 10, &d),
            &d);
        uint8_t *b = a + 8 * MiB;
        memset(b, 0, 8 * MiB);
        for (int i = 0; i < N; i++)
            lb[i] = (dp__range){l[i].addr + 8 * MiB, l[i].nbytes};
        CHECK_OK_D(
            dp__endpoint_transfer(
                ep, &(dp__xfer_desc){DP_XFER_READ, lb, N, r, N, "peer-par"}, 10, &d),
            &d);
        for (int i = 0; i < N; i++)
            CHECKF(memcmp((void *)(uintptr_t)lb[i].addr, (void *)(uintptr_t)l[i].addr,
                          l[i].nbytes) == 0,
                   "%u threads: range %d came back different", threads, i);
        /* one small op: copied by the caller alone */
        dp__range ls = {la, 4096}, rs = {p.base, 4096};
        CHECK_OK_D(
            dp__endpoint_transfer(
                ep, &(dp__xfer_desc){DP_XFER_WRITE, &ls, 1, &rs, 1, "peer-par"}, 10, &d),
            &d);
        dp__endpoint_stats st;
        dp__endpoint_get_stats(ep, &st);
        CHECK_EQ_U64(st.memcpy_ranges, 2 * N + 1);
        CHECK_EQ_U64(st.ucx_ranges, 0);
        CHECK_EQ_U64(st.copies_parallel, threads > 1 ? 2 : 0);
        CHECK_EQ_U64(st.copies_parallel_bytes, threads > 1 ? 2 * total : 0);
        dp__endpoint_destroy(ep);
    }
    peer_stop(&p);
    static const char *bad[] = {"0", "17", "two", "-1", "2x", "3 ", " 3"};
    for (size_t i = 0; i < DP_ARRAY_LEN(bad); i++) {
        setenv("DP_COPY_THREADS", bad[i], 1);
        dp__endpoint *ep = NULL;
        CHECK_ERR(dp__endpoint_create("client-bad", NULL, &ep, &d), DP_EINVAL);
        CHECK(ep == NULL);
        CHECK(strstr(d.msg, "DP_COPY_THREADS") != NULL);
    }
    setenv("DP_COPY_THREADS", "3", 1);
    dp__endpoint *ep = NULL;
    CHECK_OK_D(dp__endpoint_create("client-env", NULL, &ep, &d), &d);
    dp__endpoint_destroy(ep);
    unsetenv("DP_COPY_THREADS");
    dp__endpoint_opts eo;
    dp__endpoint_opts_init(&eo);
    eo.copy_threads = 17;
    CHECK_ERR(dp__endpoint_create("client-bad", &eo, &ep, &d), DP_EINVAL);
}

/*
 * The memcpy runs an op queues are copied before its first UCX op is posted:
 * a 4 KiB range (memcpy path) and a 128 KiB one over the same remote bytes
 * (UCX path, memcpy_max 64 KiB) leave the UCX range's bytes there, as when
 * each run was copied where it was found.
 */
DP_TEST(memcpy_runs_land_before_ucx_ops)
{
    set_tls(NULL);
    peer p;
    dp_detail d;
    CHECK_EQ(peer_start(&p, "peer-ord", 4 * MiB, false, 23), 0);
    dp__endpoint_opts eo;
    dp__endpoint_opts_init(&eo);
    eo.memcpy_max = 64 * 1024;
    dp__endpoint *ep = NULL;
    CHECK_OK_D(dp__endpoint_create("client-ord", &eo, &ep, &d), &d);
    uint8_t *a = NULL;
    CHECK_OK_D(dp__endpoint_alloc(ep, 2 * MiB, (void **)&a, &d), &d);
    CHECK_OK_D(dp__endpoint_add_remote(ep, p.md, p.md_len, NULL, &d), &d);
    memset(a, 0x11, 4096);
    memset(a + 8192, 0x22, 128 * 1024);
    uint64_t la = (uint64_t)(uintptr_t)a;
    dp__range l[2] = {{la, 4096}, {la + 8192, 128 * 1024}};
    dp__range r[2] = {{p.base + 4096, 4096}, {p.base, 128 * 1024}};
    CHECK_OK_D(dp__endpoint_transfer(
                   ep, &(dp__xfer_desc){DP_XFER_WRITE, l, 2, r, 2, "peer-ord"}, 10, &d),
               &d);
    dp__endpoint_stats st;
    dp__endpoint_get_stats(ep, &st);
    CHECK_EQ_U64(st.memcpy_ranges, 1);
    CHECK_EQ_U64(st.ucx_ranges, 1);
    uint8_t *b = a + MiB;
    memset(b, 0, 128 * 1024);
    dp__range lb = {la + MiB, 128 * 1024}, rb = {p.base, 128 * 1024};
    CHECK_OK_D(
        dp__endpoint_transfer(
            ep, &(dp__xfer_desc){DP_XFER_READ, &lb, 1, &rb, 1, "peer-ord"}, 10, &d),
        &d);
    for (size_t i = 0; i < 128 * 1024; i++)
        CHECKF(b[i] == 0x22, "byte %zu is 0x%02x: the memcpy run landed after the UCX op",
               i, b[i]);
    dp__endpoint_destroy(ep);
    peer_stop(&p);
}

DP_TEST(small_ranges_use_memcpy_on_one_host)
{
    set_tls(NULL);
    peer p;
    dp_detail d;
    CHECK_EQ(peer_start(&p, "peer-m", 4 * MiB, false, 7), 0);
    dp__endpoint *ep = NULL;
    dp__endpoint_opts eo;
    dp__endpoint_opts_init(&eo);
    eo.memcpy_max = 64 * 1024; /* larger ranges through UCX (by default: memcpy too) */
    CHECK_OK_D(dp__endpoint_create("client-m", &eo, &ep, &d), &d);
    void *a = NULL;
    CHECK_OK_D(dp__endpoint_alloc(ep, 4 * MiB, &a, &d), &d);
    CHECK_OK_D(dp__endpoint_add_remote(ep, p.md, p.md_len, NULL, &d), &d);
    dp__range l[2] = {{(uint64_t)(uintptr_t)a, 100},
                      {(uint64_t)(uintptr_t)a + 4096, 2 * MiB}};
    dp__range r[2] = {{p.base + 10, 100}, {p.base + MiB, 2 * MiB}};
    memset(a, 0x5a, 4 * MiB);
    uint64_t before = peer_checksum(&p);
    CHECK_OK_D(dp__endpoint_transfer(
                   ep, &(dp__xfer_desc){DP_XFER_WRITE, l, 2, r, 2, "peer-m"}, 10, &d),
               &d);
    CHECK(peer_checksum(&p) != before); /* the peer sees the bytes in its own memory */
    dp__endpoint_stats st;
    dp__endpoint_get_stats(ep, &st);
    CHECK_EQ_U64(st.memcpy_ranges, 1);
    CHECK_EQ_U64(st.ucx_ranges, 1);
    dp__endpoint_destroy(ep);
    peer_stop(&p);
}

/*
 * local_plain_ok: local ranges in plain (unregistered) memory go by the
 * memcpy path where the remote is mapped here (dp__endpoint_remote_copy_max
 * says up to what size), byte for byte both ways; a plain range the memcpy
 * path would not take, or one without the flag, is refused before anything
 * is posted; over TCP nothing is mapped, so nothing plain is taken.
 */
DP_TEST(plain_local_memory_goes_by_the_memcpy_path)
{
    dp_detail d;
    for (int tcp = 0; tcp < 2; tcp++) {
        set_tls(tcp ? "tcp" : NULL);
        peer p;
        CHECK_EQ(peer_start(&p, "peer-pl", 4 * MiB, tcp == 1, 11), 0);
        dp__endpoint *ep = NULL;
        dp__endpoint_opts eo;
        dp__endpoint_opts_init(&eo);
        eo.memcpy_max = 64 * 1024;
        CHECK_OK_D(dp__endpoint_create("client-pl", &eo, &ep, &d), &d);
        CHECK_OK_D(dp__endpoint_add_remote(ep, p.md, p.md_len, NULL, &d), &d);
        CHECK_EQ_U64(dp__endpoint_remote_copy_max(ep, "peer-pl"), tcp ? 0 : 64 * 1024);
        CHECK_EQ_U64(dp__endpoint_remote_copy_max(ep, "nobody"), 0);
        CHECK_EQ_U64(dp__endpoint_remote_copy_max(ep, NULL), 0);
        uint8_t *src = malloc(2 * MiB), *dst = malloc(2 * MiB);
        CHECK(src != NULL && dst != NULL);
        for (size_t i = 0; i < 2 * MiB; i++)
            src[i] = (uint8_t)(i * 7 + 3);
        memset(dst, 0, 2 * MiB);
        dp__range l[2] = {{(uint64_t)(uintptr_t)src, 100},
                          {(uint64_t)(uintptr_t)src + 1000, 64 * 1024}};
        dp__range r[2] = {{p.base + 10, 100}, {p.base + MiB, 64 * 1024}};
        dp__range lb[2] = {{(uint64_t)(uintptr_t)dst, 100},
                           {(uint64_t)(uintptr_t)dst + 5000, 64 * 1024}};
        dp__xfer_desc w = {.op = DP_XFER_WRITE,
                           .local = l,
                           .n_local = 2,
                           .remote = r,
                           .n_remote = 2,
                           .remote_name = "peer-pl",
                           .local_plain_ok = true};
        dp__xfer_desc rd = w;
        rd.op = DP_XFER_READ;
        rd.local = lb;
        dp__xfer_result res;
        uint64_t gy = dp__graveyard_entries();
        if (!tcp) {
            uint64_t before = peer_checksum(&p);
            CHECK_OK_D(dp__endpoint_transfer_many(ep, &w, 1, 10, &res, NULL, &d), &d);
            CHECK_EQ(res.rc, DP_OK);
            CHECK(peer_checksum(&p) != before); /* in the peer's own memory */
            CHECK_OK_D(dp__endpoint_transfer_many(ep, &rd, 1, 10, &res, NULL, &d), &d);
            CHECK(memcmp(dst, src, 100) == 0);
            CHECK(memcmp(dst + 5000, src + 1000, 64 * 1024) == 0);
            dp__endpoint_stats st;
            dp__endpoint_get_stats(ep, &st);
            CHECK_EQ_U64(st.ucx_ranges, 0);
            CHECK(!dp__endpoint_touches_unfinished(ep, dst, 2 * MiB));
        } else {
            CHECK_ERR_D(dp__endpoint_transfer_many(ep, &w, 1, 10, &res, NULL, &d),
                        DP_EINVAL, &d);
            CHECK_CONTAINS(d.msg, "plain memory goes only by the memcpy path");
        }
        /* Larger than memcpy_max: UCX's, which needs registered memory. */
        l[1].nbytes = r[1].nbytes = 64 * 1024 + 1;
        CHECK_ERR_D(dp__endpoint_transfer_many(ep, &w, 1, 10, &res, NULL, &d), DP_EINVAL,
                    &d);
        CHECK_CONTAINS(d.msg, "plain memory goes only by the memcpy path");
        /* Without the flag, plain memory is refused as it always was. */
        l[1].nbytes = r[1].nbytes = 64;
        w.local_plain_ok = false;
        CHECK_ERR_D(dp__endpoint_transfer_many(ep, &w, 1, 10, &res, NULL, &d), DP_EINVAL,
                    &d);
        CHECK_CONTAINS(d.msg, "is not inside a region registered");
        CHECK_EQ_U64(dp__graveyard_entries(), gy); /* nothing was left unfinished */
        free(src);
        free(dst);
        dp__endpoint_destroy(ep);
        peer_stop(&p);
    }
    set_tls(NULL);
}

struct done_log {
    dp__endpoint *ep;
    int n, order[8], rc[8];
    const uint8_t *next_dst; /* op 1's destination: untouched when op 0 ends */
    bool next_untouched;
    const char *remove; /* a remote to remove from inside the first callback */
    int remove_rc;
};

static void
log_done(void *ctx, size_t i, int rc)
{
    struct done_log *g = ctx;
    if (g->n == 0 && g->next_dst != NULL) {
        g->next_untouched = true;
        for (size_t k = 0; k < 4096; k++)
            g->next_untouched &= g->next_dst[k] == 0;
    }
    if (g->n == 0 && g->remove != NULL)
        g->remove_rc = dp__endpoint_remove_remote(g->ep, g->remove, NULL);
    if (g->n < 8) {
        g->order[g->n] = (int)i;
        g->rc[g->n] = rc;
    }
    g->n++;
}

/*
 * transfer_many's on_done reports each op once, as it ends; an op done at its post
 * (the memcpy path) is reported before the next op is posted; the callback
 * runs without the endpoint's lock (it may even remove the remote the rest of
 * the batch uses: those ops still end, with the right bytes).
 */
DP_TEST(transfer_many_reports_each_op_as_it_ends)
{
    set_tls(NULL);
    peer p;
    dp_detail d;
    CHECK_EQ(peer_start(&p, "peer-c", 4 * MiB, false, 13), 0);
    dp__endpoint *ep = NULL;
    dp__endpoint_opts eo;
    dp__endpoint_opts_init(&eo);
    eo.memcpy_max = 64 * 1024; /* op 2 goes through UCX */
    CHECK_OK_D(dp__endpoint_create("client-c", &eo, &ep, &d), &d);
    uint8_t *a = NULL;
    CHECK_OK_D(dp__endpoint_alloc(ep, 4 * MiB, (void **)&a, &d), &d);
    CHECK_OK_D(dp__endpoint_add_remote(ep, p.md, p.md_len, NULL, &d), &d);
    uint64_t la = (uint64_t)(uintptr_t)a;
    /* op 0 and 1: 4 KiB (memcpy path); op 2: 2 MiB (UCX). */
    dp__range l[3] = {{la, 4096}, {la + 8192, 4096}, {la + MiB, 2 * MiB}};
    dp__range r[3] = {
        {p.base + 64, 4096}, {p.base + 20000, 4096}, {p.base + MiB, 2 * MiB}};
    dp__xfer_desc ops[3];
    for (int i = 0; i < 3; i++)
        ops[i] = (dp__xfer_desc){DP_XFER_READ, &l[i], 1, &r[i], 1, "peer-c"};
    for (int round = 0; round < 2; round++) {
        memset(a, 0, 4 * MiB);
        struct done_log g = {.ep = ep, .next_dst = a + 8192};
        if (round == 1)
            g.remove = "peer-c";
        dp__xfer_result res[3];
        dp__xfer_notify on = {log_done, &g};
        CHECK_OK_D(dp__endpoint_transfer_many(ep, ops, 3, 10, res, &on, &d), &d);
        CHECK_EQ(g.n, 3);
        CHECK_EQ(g.order[0], 0);
        CHECK(g.next_untouched);
        bool seen[3] = {false, false, false};
        for (int k = 0; k < 3; k++) {
            CHECK_EQ(g.rc[k], DP_OK);
            seen[g.order[k]] = true;
        }
        CHECK(seen[0] && seen[1] && seen[2]);
        for (int i = 0; i < 3; i++) {
            CHECK_EQ(res[i].rc, DP_OK);
            for (uint64_t k = 0; k < l[i].nbytes; k += 509)
                CHECK_EQ(a[l[i].addr - la + k], pat(p.seed, r[i].addr - p.base + k));
        }
        if (round == 1) {
            CHECK_EQ(g.remove_rc, DP_OK);
            CHECK(!dp__endpoint_has_remote(ep, "peer-c"));
        }
    }
    /* A refused batch calls nothing. */
    struct done_log g = {.ep = ep};
    dp__xfer_result res[3];
    dp__xfer_notify on = {log_done, &g};
    CHECK_ERR(dp__endpoint_transfer_many(ep, ops, 3, 10, res, &on, &d), DP_EINVAL);
    CHECK_EQ(g.n, 0);
    dp__endpoint_stats st;
    dp__endpoint_get_stats(ep, &st);
    CHECK_EQ_U64(st.memcpy_ranges, 4);
    CHECK_EQ_U64(st.ucx_ranges, 2);
    dp__endpoint_destroy(ep);
    peer_stop(&p);
}

static void
sleep_on_first(void *ctx, size_t i, int rc)
{
    int *calls = ctx;
    (void)rc;
    if (i == 0)
        dp__sleep_s(0.05);
    (*calls)++;
}

/*
 * An op that ends after its deadline is DP_ETIMEDOUT even when it did end
 * (a deadline may guard a READ within a pin's life): here a memcpy-path WRITE
 * of 128 MiB against a 5 ms deadline. It is not retained. An op whose turn to
 * be posted comes after the deadline is not posted at all.
 */
DP_TEST(an_op_ending_after_its_deadline_is_a_timeout)
{
    set_tls(NULL);
    peer p;
    dp_detail d;
    CHECK_EQ(peer_start(&p, "peer-l", 128 * MiB, false, 17), 0);
    dp__endpoint *ep = NULL;
    CHECK_OK_D(dp__endpoint_create("client-l", NULL, &ep, &d), &d);
    uint8_t *a = NULL;
    CHECK_OK_D(dp__endpoint_alloc(ep, 128 * MiB, (void **)&a, &d), &d);
    CHECK_OK_D(dp__endpoint_add_remote(ep, p.md, p.md_len, NULL, &d), &d);
    enum { NR = 2048 }; /* 64 KiB each: the memcpy path */
    dp__range *l = calloc(NR, sizeof *l), *r = calloc(NR, sizeof *r);
    CHECK(l != NULL && r != NULL);
    for (size_t k = 0; k < NR; k++) {
        l[k] = (dp__range){(uint64_t)(uintptr_t)a + k * 64 * 1024, 64 * 1024};
        r[k] = (dp__range){p.base + k * 64 * 1024, 64 * 1024};
    }
    memset(a, 0x3c, 128 * MiB);
    uint64_t gy = dp__graveyard_entries();
    CHECK_ERR_D(
        dp__endpoint_transfer(ep, &(dp__xfer_desc){DP_XFER_WRITE, l, NR, r, NR, "peer-l"},
                              0.005, &d),
        DP_ETIMEDOUT, &d);
    CHECK_CONTAINS(d.msg, "after its deadline");
    CHECK_EQ_U64(dp__graveyard_entries(), gy);
    CHECK(!dp__endpoint_touches_unfinished(ep, a, 128 * MiB));
    /* It did run to the end: a READ back in time finds every byte. */
    memset(a, 0, 128 * MiB);
    CHECK_OK_D(dp__endpoint_transfer(
                   ep, &(dp__xfer_desc){DP_XFER_READ, l, NR, r, NR, "peer-l"}, 30, &d),
               &d);
    for (size_t k = 0; k < 128 * MiB; k += 4099)
        CHECK_EQ(a[k], 0x3c);

    /* The first op's callback takes the whole time: the second is not posted. */
    dp__xfer_desc ops[2] = {{DP_XFER_READ, &l[0], 1, &r[0], 1, "peer-l"},
                            {DP_XFER_READ, &l[1], 1, &r[1], 1, "peer-l"}};
    dp__endpoint_stats st0, st1;
    dp__endpoint_get_stats(ep, &st0);
    int calls = 0;
    dp__xfer_result res[2];
    dp__xfer_notify on = {sleep_on_first, &calls};
    CHECK_ERR(dp__endpoint_transfer_many(ep, ops, 2, 0.02, res, &on, &d), DP_ETIMEDOUT);
    CHECK_EQ(res[0].rc, DP_OK);
    CHECK_EQ(res[1].rc, DP_ETIMEDOUT);
    CHECK_CONTAINS(res[1].det.msg, "nothing posted");
    CHECK(!res[1].may_land && !res[1].suspect);
    CHECK_STR(res[1].fate, "nothing posted");
    CHECK_EQ(calls, 2);
    dp__endpoint_get_stats(ep, &st1);
    CHECK_EQ_U64(st1.memcpy_ranges - st0.memcpy_ranges, 1);
    free(l);
    free(r);
    dp__endpoint_destroy(ep);
    peer_stop(&p);
}

DP_TEST(invalid_arguments_fail_before_posting)
{
    set_tls(NULL);
    peer p;
    dp_detail d;
    CHECK_EQ(peer_start(&p, "peer-i", 1 * MiB, false, 3), 0);
    dp__endpoint *ep = NULL;
    CHECK_OK_D(dp__endpoint_create("client-i", NULL, &ep, &d), &d);
    void *a = NULL;
    CHECK_OK_D(dp__endpoint_alloc(ep, 1 * MiB, &a, &d), &d);
    /* More than the host's memory is refused before UCX maps anything. */
    void *huge = NULL;
    CHECK_ERR_D(dp__endpoint_alloc(ep, (size_t)1 << 46, &huge, &d), DP_ENOMEM, &d);
    CHECK_CONTAINS(d.msg, "more than this host's memory");
    CHECK(huge == NULL);
    CHECK_OK_D(dp__endpoint_add_remote(ep, p.md, p.md_len, NULL, &d), &d);
    uint64_t la = (uint64_t)(uintptr_t)a;
    dp__range l1 = {la, 4096}, r1 = {p.base, 4096};
    dp__range l2[2] = {{la, 4096}, {la + 8192, 10}};
    dp__range r_small = {p.base, 4095};
    dp__range l_out = {la + MiB - 10, 4096}, r_out = {p.base + MiB - 10, 4096};
    dp__range l_unreg = {(uint64_t)(uintptr_t)&d, 8};
    uint64_t gy_before = dp__graveyard_entries();
    CHECK_ERR_D(dp__endpoint_transfer(
                    ep, &(dp__xfer_desc){DP_XFER_WRITE, &l1, 1, &r1, 1, "nobody"}, 5, &d),
                DP_EINVAL, &d);
    CHECK_CONTAINS(d.msg, "unknown remote");
    CHECK_ERR_D(dp__endpoint_transfer(
                    ep, &(dp__xfer_desc){DP_XFER_WRITE, l2, 2, &r1, 1, "peer-i"}, 5, &d),
                DP_EINVAL, &d);
    CHECK_CONTAINS(d.msg, "2 local ranges but 1 remote");
    CHECK_ERR_D(
        dp__endpoint_transfer(
            ep, &(dp__xfer_desc){DP_XFER_READ, &l1, 1, &r_small, 1, "peer-i"}, 5, &d),
        DP_EINVAL, &d);
    CHECK_CONTAINS(d.msg, "4096 bytes, remote 4095");
    CHECK_ERR_D(
        dp__endpoint_transfer(
            ep, &(dp__xfer_desc){DP_XFER_WRITE, &l_out, 1, &r1, 1, "peer-i"}, 5, &d),
        DP_EINVAL, &d);
    CHECK_CONTAINS(d.msg, "local");
    CHECK_ERR_D(
        dp__endpoint_transfer(
            ep, &(dp__xfer_desc){DP_XFER_WRITE, &l1, 1, &r_out, 1, "peer-i"}, 5, &d),
        DP_EINVAL, &d);
    CHECK_CONTAINS(d.msg, "remote");
    CHECK_ERR(
        dp__endpoint_transfer(
            ep, &(dp__xfer_desc){DP_XFER_WRITE, &l_unreg, 1, &r1, 1, "peer-i"}, 5, &d),
        DP_EINVAL);
    CHECK_ERR(dp__endpoint_transfer(
                  ep, &(dp__xfer_desc){(dp__xfer_op)7, &l1, 1, &r1, 1, "peer-i"}, 5, &d),
              DP_EINVAL);
    CHECK_ERR(dp__endpoint_transfer(
                  ep, &(dp__xfer_desc){DP_XFER_WRITE, &l1, 1, &r1, 1, "peer-i"}, 0, &d),
              DP_EINVAL);
    CHECK_ERR(dp__endpoint_transfer(
                  ep, &(dp__xfer_desc){DP_XFER_WRITE, &l1, 1, &r1, 1, "peer-i"}, -1, &d),
              DP_EINVAL);
    /* One bad op refuses the whole batch: the good one is not posted either. */
    dp__xfer_desc ops[2] = {{DP_XFER_WRITE, &l1, 1, &r1, 1, "peer-i"},
                            {DP_XFER_WRITE, &l_out, 1, &r1, 1, "peer-i"}};
    dp__xfer_result res[2];
    CHECK_ERR_D(dp__endpoint_transfer_many(ep, ops, 2, 5, res, NULL, &d), DP_EINVAL, &d);
    CHECK_EQ(res[0].rc, DP_EINVAL);
    CHECK_EQ(res[1].rc, DP_EINVAL);
    CHECK(!res[0].may_land && !res[1].may_land);
    CHECK_CONTAINS(d.msg, "op 1");
    dp__endpoint_stats st;
    dp__endpoint_get_stats(ep, &st);
    CHECK_EQ_U64(st.ucx_ranges + st.memcpy_ranges, 0);
    CHECK_EQ_U64(st.transfers_ok + st.transfers_failed, 0);
    CHECK_EQ_U64(dp__graveyard_entries(), gy_before);
    /* Other entry points. */
    CHECK_ERR(dp__endpoint_remove_remote(ep, "nobody", &d), DP_ENOTFOUND);
    CHECK_ERR(dp__endpoint_deregister(ep, (uint8_t *)a + 1, &d), DP_ENOTFOUND);
    CHECK_ERR(dp__endpoint_register(ep, (uint8_t *)a + 100, 10, &d), DP_EEXIST);
    CHECK_ERR(dp__endpoint_add_remote(ep, "junk", 4, NULL, &d), DP_EPROTO);
    /* A closed endpoint refuses everything with DP_EINVAL. */
    dp__endpoint_close(ep);
    CHECK_ERR_D(dp__endpoint_transfer(
                    ep, &(dp__xfer_desc){DP_XFER_WRITE, &l1, 1, &r1, 1, "peer-i"}, 5, &d),
                DP_EINVAL, &d);
    CHECK_CONTAINS(d.msg, "closed");
    CHECK(!dp__endpoint_has_remote(ep, "peer-i"));
    CHECK_ERR(dp__endpoint_alloc(ep, 10, &a, &d), DP_EINVAL);
    uint8_t *md;
    size_t mdl;
    CHECK_ERR(dp__endpoint_metadata(ep, &md, &mdl, &d), DP_EINVAL);
    dp__endpoint_close(ep); /* idempotent */
    dp__endpoint_destroy(ep);
    peer_stop(&p);
}

DP_TEST(remove_and_readd_remote)
{
    set_tls(NULL);
    peer p;
    dp_detail d;
    CHECK_EQ(peer_start(&p, "peer-r", 1 * MiB, false, 5), 0);
    dp__endpoint *ep = NULL;
    CHECK_OK_D(dp__endpoint_create("client-r", NULL, &ep, &d), &d);
    void *a = NULL;
    CHECK_OK_D(dp__endpoint_alloc(ep, 1 * MiB, &a, &d), &d);
    dp__range l = {(uint64_t)(uintptr_t)a, MiB}, r = {p.base, MiB};
    for (int i = 0; i < 3; i++) {
        CHECK_OK_D(dp__endpoint_add_remote(ep, p.md, p.md_len, NULL, &d), &d);
        CHECK_OK_D(dp__endpoint_add_remote(ep, p.md, p.md_len, NULL, &d),
                   &d); /* replace */
        CHECK_OK_D(
            dp__endpoint_transfer(
                ep, &(dp__xfer_desc){DP_XFER_READ, &l, 1, &r, 1, "peer-r"}, 10, &d),
            &d);
        CHECK_EQ(((uint8_t *)a)[5], pat(p.seed, 5));
        CHECK_OK_D(dp__endpoint_remove_remote(ep, "peer-r", &d), &d);
        CHECK(!dp__endpoint_has_remote(ep, "peer-r"));
    }
    /* Metadata generation bumps with registrations. */
    uint8_t *m1, *m2;
    size_t n1, n2;
    CHECK_OK(dp__endpoint_metadata(ep, &m1, &n1, &d));
    void *b = NULL;
    CHECK_OK_D(dp__endpoint_alloc(ep, 8192, &b, &d), &d);
    CHECK_OK(dp__endpoint_metadata(ep, &m2, &n2, &d));
    dp__md x, y;
    CHECK_OK(dp__md_parse(m1, n1, &x, &d));
    CHECK_OK(dp__md_parse(m2, n2, &y, &d));
    CHECK(y.gen > x.gen);
    CHECK_EQ(y.n_regions, x.n_regions + 1);
    dp__md_fini(&x);
    dp__md_fini(&y);
    free(m1);
    free(m2);
    CHECK_OK_D(dp__endpoint_deregister(ep, b, &d), &d);
    dp__endpoint_destroy(ep);
    peer_stop(&p);
}

static void
many_peers_one_killed(const char *tls)
{
    set_tls(tls);
    enum { NP = 3 };
    peer ps[NP];
    dp_detail d;
    const char *names[NP] = {"peer-k0", "peer-k1", "peer-k2"};
    for (int i = 0; i < NP; i++)
        CHECK_EQ(peer_start(&ps[i], names[i], 8 * MiB, tls != NULL, 11 + i), 0);
    dp__endpoint *ep = NULL;
    dp__endpoint_opts o;
    dp__endpoint_opts_init(&o);
    o.progress_thread = true;
    CHECK_OK_D(dp__endpoint_create("client-k", &o, &ep, &d), &d);
    void *a = NULL;
    CHECK_OK_D(dp__endpoint_alloc(ep, NP * 8 * MiB, &a, &d), &d);
    dp__range l[NP], r[NP];
    dp__xfer_desc ops[NP];
    for (int i = 0; i < NP; i++) {
        CHECK_OK_D(dp__endpoint_add_remote(ep, ps[i].md, ps[i].md_len, NULL, &d), &d);
        l[i] = (dp__range){(uint64_t)(uintptr_t)a + (uint64_t)i * 8 * MiB, 8 * MiB};
        r[i] = (dp__range){ps[i].base, 8 * MiB};
        ops[i] = (dp__xfer_desc){DP_XFER_WRITE, &l[i], 1, &r[i], 1, names[i]};
    }
    dp__xfer_result res[NP];
    CHECK_OK_D(dp__endpoint_transfer_many(ep, ops, NP, 20, res, NULL, &d), &d);
    peer_kill(&ps[1]);
    /*
     * Over shared memory a WRITE into a dead peer's mapping may still "succeed"
     * until keepalive notices the death (about a second); over tcp it fails at
     * once. Either way the others keep succeeding and the dead one reports.
     */
    double t0 = dp_test_now();
    int rc;
    for (;;) {
        rc = dp__endpoint_transfer_many(ep, ops, NP, 5, res, NULL, &d);
        CHECK_EQ(res[0].rc, DP_OK);
        CHECK_EQ(res[2].rc, DP_OK);
        if (res[1].rc != DP_OK)
            break;
        CHECKF(dp_test_now() - t0 < 20, "dead peer not reported after %.1f s",
               dp_test_now() - t0);
        usleep(100000);
    }
    CHECK_EQ(rc, res[1].rc);
    CHECK(res[1].rc == DP_ETRANSFER || res[1].rc == DP_ETIMEDOUT);
    CHECK_CONTAINS(res[1].det.msg, "peer-k1");
    CHECK_CONTAINS(d.msg, "op 1");
    /* Over tcp a posted op that failed makes the connection suspect; over shm never. */
    CHECK(tls == NULL ? !res[1].suspect
                      : res[1].suspect || strcmp(res[1].fate, "nothing posted") == 0);
    printf("  %s: dead peer reported after %.2f s: %s (%s)\n", tls ? tls : "default tls",
           dp_test_now() - t0, res[1].det.msg, res[1].fate);
    /* The endpoint may have retained the dead peer's transfer; that is allowed. */
    dp__endpoint_destroy(ep);
    for (int i = 0; i < NP; i++)
        peer_stop(&ps[i]);
    set_tls(NULL);
}

DP_TEST(transfer_many_one_peer_killed_shm)
{
    many_peers_one_killed(NULL);
}

DP_TEST(transfer_many_one_peer_killed_tcp)
{
    many_peers_one_killed("tcp");
}

DP_TEST(stopped_peer_times_out_and_is_retained)
{
    /* Over tcp RMA is emulated: a stopped peer cannot answer, so the WRITE times out. */
    set_tls("tcp");
    peer p;
    dp_detail d;
    CHECK_EQ(peer_start(&p, "peer-s", 4 * MiB, true, 9), 0);
    dp__endpoint *ep = NULL;
    CHECK_OK_D(dp__endpoint_create("client-s", NULL, &ep, &d), &d);
    void *a = NULL;
    CHECK_OK_D(dp__endpoint_alloc(ep, 4 * MiB, &a, &d), &d);
    CHECK_OK_D(dp__endpoint_add_remote(ep, p.md, p.md_len, NULL, &d), &d);
    dp__range l = {(uint64_t)(uintptr_t)a + MiB, 2 * MiB}, r = {p.base, 2 * MiB};
    CHECK_OK_D(dp__endpoint_transfer(
                   ep, &(dp__xfer_desc){DP_XFER_WRITE, &l, 1, &r, 1, "peer-s"}, 20, &d),
               &d);
    CHECK(!dp__endpoint_touches_unfinished(ep, (uint8_t *)a + MiB, 10));
    uint64_t bytes0 = dp__graveyard_bytes();
    size_t entries0 = dp__graveyard_entries();
    kill(p.pid, SIGSTOP);
    int wst;
    CHECK_EQ(waitpid(p.pid, &wst, WUNTRACED), p.pid); /* stopped for sure */
    double t0 = dp_test_now();
    CHECK_ERR_D(dp__endpoint_transfer(
                    ep, &(dp__xfer_desc){DP_XFER_WRITE, &l, 1, &r, 1, "peer-s"}, 1.0, &d),
                DP_ETIMEDOUT, &d);
    double took = dp_test_now() - t0;
    CHECKF(took < 1.5, "timed out after %.2f s, deadline 1 s", took);
    CHECK_CONTAINS(d.msg, "retained");
    CHECK_EQ_U64(dp__graveyard_entries(), entries0 + 1);
    CHECK_EQ_U64(dp__graveyard_bytes(), bytes0 + 2 * MiB);
    CHECK(dp__endpoint_touches_unfinished(ep, (uint8_t *)a + MiB, 1));
    CHECK(dp__endpoint_touches_unfinished(ep, (uint8_t *)a + 3 * MiB - 1, 1));
    CHECK(dp__endpoint_touches_unfinished(ep, a, 2 * MiB));
    CHECK(!dp__endpoint_touches_unfinished(ep, a, MiB));
    CHECK(!dp__endpoint_touches_unfinished(ep, (uint8_t *)a + 3 * MiB, MiB));
    /* The memory is never reused: deregistering it is refused. */
    CHECK_ERR_D(dp__endpoint_deregister(ep, a, &d), DP_EBUSY, &d);
    dp__endpoint_stats st;
    dp__endpoint_get_stats(ep, &st);
    CHECK_EQ_U64(st.transfers_retained, 1);
    /* Still true once the peer runs again and even after close: forever. */
    kill(p.pid, SIGCONT);
    usleep(200000);
    CHECK(dp__endpoint_touches_unfinished(ep, (uint8_t *)a + MiB, 1));
    dp__endpoint_destroy(ep); /* abandoned: its worker and memory are kept */
    CHECK(dp__graveyard_touches((uint64_t)(uintptr_t)a + MiB, 1));
    peer_stop(&p);
    set_tls(NULL);
}

/*
 * A retained WRITE (its peer stopped) that completes once the peer runs
 * again leaves the graveyard at the next progress: its memory may be reused,
 * deregistered, and the endpoint closes normally. Over tcp, where the stopped
 * peer's progress thread serves the emulated RMA.
 */
DP_TEST(retained_transfer_is_released_once_it_ends)
{
    set_tls("tcp");
    peer p;
    dp_detail d;
    CHECK_EQ(peer_start(&p, "peer-r", 4 * MiB, true, 9), 0);
    dp__endpoint *ep = NULL;
    CHECK_OK_D(dp__endpoint_create("client-r", NULL, &ep, &d), &d);
    void *a = NULL;
    CHECK_OK_D(dp__endpoint_alloc(ep, 4 * MiB, &a, &d), &d);
    CHECK_OK_D(dp__endpoint_add_remote(ep, p.md, p.md_len, NULL, &d), &d);
    dp__range l = {(uint64_t)(uintptr_t)a, 2 * MiB}, r = {p.base, 2 * MiB};
    uint64_t bytes0 = dp__graveyard_bytes();
    size_t entries0 = dp__graveyard_entries(), released0 = dp__graveyard_released();
    kill(p.pid, SIGSTOP);
    int wst;
    CHECK_EQ(waitpid(p.pid, &wst, WUNTRACED), p.pid);
    dp__xfer_desc op = {DP_XFER_WRITE, &l, 1, &r, 1, "peer-r"};
    dp__xfer_result res;
    CHECK_ERR_D(dp__endpoint_transfer_many(ep, &op, 1, 0.5, &res, NULL, &d), DP_ETIMEDOUT,
                &d);
    CHECK(res.may_land); /* UCX may still run it */
    CHECK_STR(res.fate, "may still land");
    CHECK(dp__endpoint_touches_unfinished(ep, a, 1));
    CHECK_EQ_U64(dp__graveyard_entries(), entries0 + 1);
    kill(p.pid, SIGCONT);
    /* Progress (as the next operation does) until UCX completes the WRITE. */
    double t0 = dp_test_now();
    while (dp__endpoint_touches_unfinished(ep, a, 1) && dp_test_now() - t0 < 20) {
        CHECK_OK_D(dp__endpoint_remote_check(ep, "peer-r", &d), &d);
        usleep(10000);
    }
    CHECK(!dp__endpoint_touches_unfinished(ep, a, 2 * MiB));
    CHECK_EQ_U64(dp__graveyard_entries(), entries0);
    CHECK_EQ_U64(dp__graveyard_bytes(), bytes0);
    CHECK_EQ_U64(dp__graveyard_released(), released0 + 1);
    dp__endpoint_stats st;
    dp__endpoint_get_stats(ep, &st);
    CHECK_EQ_U64(st.transfers_retained, 1);
    CHECK_EQ_U64(st.transfers_released, 1);
    /* The memory is usable again, and a new WRITE works. */
    CHECK_OK_D(dp__endpoint_transfer(
                   ep, &(dp__xfer_desc){DP_XFER_WRITE, &l, 1, &r, 1, "peer-r"}, 20, &d),
               &d);
    CHECK_OK_D(dp__endpoint_deregister(ep, a, &d), &d);
    dp__endpoint_destroy(ep); /* not abandoned: nothing is retained */
    peer_stop(&p);
    set_tls(NULL);
}

/*
 * A WRITE to a peer that died: it is not posted, and says so (the put's
 * abort then tells the unit nothing is in flight); the remote check reports
 * the failure. Shared memory, where a dead peer shows through keepalive.
 */
DP_TEST(dead_peer_is_reported_and_not_posted)
{
    peer p;
    dp_detail d;
    CHECK_EQ(peer_start(&p, "peer-x", 4 * MiB, true, 9), 0);
    dp__endpoint *ep = NULL;
    CHECK_OK_D(dp__endpoint_create("client-x", NULL, &ep, &d), &d);
    void *a = NULL;
    CHECK_OK_D(dp__endpoint_alloc(ep, 4 * MiB, &a, &d), &d);
    CHECK_OK_D(dp__endpoint_add_remote(ep, p.md, p.md_len, NULL, &d), &d);
    CHECK_OK_D(dp__endpoint_remote_check(ep, "peer-x", &d), &d);
    dp__xfer_route rt;
    CHECK_OK_D(dp__endpoint_remote_route(ep, "peer-x", &rt, &d), &d);
    printf("  lane %s (%s), %s\n", rt.lane, rt.tls, rt.path);
    CHECK(strcmp(rt.lane, "shm") == 0 || getenv("UCX_TLS") != NULL);
    CHECK(!rt.two_sided);
    kill(p.pid, SIGKILL);
    waitpid(p.pid, NULL, 0);
    p.pid = -1;
    double t0 = dp_test_now();
    int rc = DP_OK;
    while ((rc = dp__endpoint_remote_check(ep, "peer-x", &d)) == DP_OK &&
           dp_test_now() - t0 < 30)
        usleep(20000);
    CHECK_ERR_D(rc, DP_ETRANSFER, &d);
    printf("  failure seen after %.2f s: %s\n", dp_test_now() - t0, d.msg);
    dp__range l = {(uint64_t)(uintptr_t)a, 2 * MiB}, r = {p.base, 2 * MiB};
    dp__xfer_desc op = {DP_XFER_WRITE, &l, 1, &r, 1, "peer-x"};
    dp__xfer_result res;
    CHECK_ERR_D(dp__endpoint_transfer_many(ep, &op, 1, 5, &res, NULL, &d), DP_ETRANSFER,
                &d);
    CHECK(!res.may_land && !res.suspect); /* never posted */
    CHECK_CONTAINS(res.det.msg, "nothing posted");
    CHECK(!dp__endpoint_touches_unfinished(ep, a, 4 * MiB));
    dp__endpoint_destroy(ep);
    peer_stop(&p);
}

DP_TEST(stopped_peer_does_not_block_shared_memory)
{
    /* Over shared memory RMA is truly one-sided: a stopped peer is no obstacle. */
    set_tls(NULL);
    peer p;
    dp_detail d;
    CHECK_EQ(peer_start(&p, "peer-o", 8 * MiB, false, 13), 0);
    dp__endpoint *ep = NULL;
    CHECK_OK_D(dp__endpoint_create("client-o", NULL, &ep, &d), &d);
    void *a = NULL;
    CHECK_OK_D(dp__endpoint_alloc(ep, 8 * MiB, &a, &d), &d);
    CHECK_OK_D(dp__endpoint_add_remote(ep, p.md, p.md_len, NULL, &d), &d);
    kill(p.pid, SIGSTOP);
    dp__range l = {(uint64_t)(uintptr_t)a, 8 * MiB}, r = {p.base, 8 * MiB};
    CHECK_OK_D(dp__endpoint_transfer(
                   ep, &(dp__xfer_desc){DP_XFER_READ, &l, 1, &r, 1, "peer-o"}, 10, &d),
               &d);
    CHECK_EQ(((uint8_t *)a)[12345], pat(p.seed, 12345));
    CHECK_OK_D(dp__endpoint_transfer(
                   ep, &(dp__xfer_desc){DP_XFER_WRITE, &l, 1, &r, 1, "peer-o"}, 10, &d),
               &d);
    kill(p.pid, SIGCONT);
    dp__endpoint_destroy(ep);
    peer_stop(&p);
}

/*
 * Poisoning runs in a fresh process (the graveyard is per process and poisoning
 * is sticky): a small max_bytes, one timed-out WRITE over tcp to a stopped peer,
 * then every transfer, even to a healthy peer, fails with DP_EFATAL untouched.
 */
static int
poison_main(void)
{
#define P_CHECK(c)                                                                       \
    do {                                                                                 \
        if (!(c)) {                                                                      \
            fprintf(stderr, "poison child: %s:%d: %s (%s)\n", __FILE__, __LINE__, #c,    \
                    d.msg);                                                              \
            return 1;                                                                    \
        }                                                                                \
    } while (0)
    dp_detail d;
    dp_detail_clear(&d);
    unsetenv("DP_TEST_PEER");
    setenv("UCX_TLS", "tcp", 1);
    dp__graveyard_set_max_bytes(4 * MiB);
    P_CHECK(dp__graveyard_max_bytes() == 4 * MiB);
    peer stopped, healthy;
    P_CHECK(peer_start(&stopped, "peer-p0", 4 * MiB, true, 1) == 0);
    P_CHECK(peer_start(&healthy, "peer-p1", 4 * MiB, true, 2) == 0);
    dp__endpoint *ep = NULL;
    P_CHECK(dp__endpoint_create("client-p", NULL, &ep, &d) == DP_OK);
    void *a = NULL;
    P_CHECK(dp__endpoint_alloc(ep, 4 * MiB, &a, &d) == DP_OK);
    P_CHECK(dp__endpoint_add_remote(ep, stopped.md, stopped.md_len, NULL, &d) == DP_OK);
    P_CHECK(dp__endpoint_add_remote(ep, healthy.md, healthy.md_len, NULL, &d) == DP_OK);
    dp__range l = {(uint64_t)(uintptr_t)a, 512 * 1024}, r0 = {stopped.base, 512 * 1024},
              r1 = {healthy.base, 512 * 1024};
    P_CHECK(dp__endpoint_transfer(
                ep, &(dp__xfer_desc){DP_XFER_WRITE, &l, 1, &r0, 1, "peer-p0"}, 20, &d) ==
            DP_OK);
    kill(stopped.pid, SIGSTOP);
    /*
     * Half the limit retained: not poisoned yet. A WRITE to a stopped peer over
     * tcp normally times out; on a loaded machine the stop can land after UCX
     * already had the bytes acknowledged, so try a few times for one that is
     * retained (a WRITE that completes is correct, just not what this needs).
     */
    dp__range l2 = {(uint64_t)(uintptr_t)a, 2 * MiB}, r2 = {stopped.base, 2 * MiB};
    int trc = DP_OK;
    for (int attempt = 0; attempt < 5 && trc == DP_OK; attempt++)
        trc = dp__endpoint_transfer(
            ep, &(dp__xfer_desc){DP_XFER_WRITE, &l2, 1, &r2, 1, "peer-p0"}, 0.5, &d);
    P_CHECK(trc == DP_ETIMEDOUT);
    P_CHECK(dp__graveyard_bytes() == 2 * MiB);
    P_CHECK(!dp__graveyard_poisoned());
    P_CHECK(dp__endpoint_transfer(
                ep, &(dp__xfer_desc){DP_XFER_WRITE, &l, 1, &r1, 1, "peer-p1"}, 20, &d) ==
            DP_OK);
    /* A buffer retired whole pushes it over. */
    dp__graveyard_retain_buffer(3 * MiB);
    P_CHECK(dp__graveyard_poisoned());
    dp__endpoint_stats st0, st1;
    dp__endpoint_get_stats(ep, &st0);
    P_CHECK(dp__endpoint_transfer(
                ep, &(dp__xfer_desc){DP_XFER_WRITE, &l, 1, &r1, 1, "peer-p1"}, 20, &d) ==
            DP_EFATAL);
    P_CHECK(strstr(d.msg, "poisoned") != NULL);
    dp__xfer_result res[1];
    dp__xfer_desc op = {DP_XFER_READ, &l, 1, &r1, 1, "peer-p1"};
    P_CHECK(dp__endpoint_transfer_many(ep, &op, 1, 5, res, NULL, &d) == DP_EFATAL);
    P_CHECK(res[0].rc == DP_EFATAL);
    dp__endpoint_get_stats(ep, &st1);
    P_CHECK(st1.ucx_ranges == st0.ucx_ranges && st1.memcpy_ranges == st0.memcpy_ranges);
    kill(stopped.pid, SIGCONT);
    dp__endpoint_destroy(ep);
    peer_stop(&stopped);
    peer_stop(&healthy);
    return 0;
#undef P_CHECK
}

DP_TEST(poisoning_with_small_max_bytes)
{
    const char *env[] = {"DP_TEST_PEER", "poison", NULL};
    pid_t pid = dp_test_spawn_self(env, -1);
    int st = 0;
    CHECK_EQ(waitpid(pid, &st, 0), pid);
    CHECKF(WIFEXITED(st) && WEXITSTATUS(st) == 0, "poison child status 0x%x", st);
}

/*
 * DP_PREFAULT=background: a remote whose mapping is still being faulted in
 * on its own thread is replaced, removed and destroyed with it, over and
 * over, while transfers read it: the thread is stopped and joined before the
 * mapping goes (no crash, no sanitizer report), and every READ is right.
 */
DP_TEST(background_prefault_with_remove_and_replace)
{
    set_tls(NULL);
    setenv("DP_PREFAULT", "background", 1);
    peer p;
    dp_detail d;
    CHECK_EQ(peer_start(&p, "peer-bg", 64 * MiB, false, 9), 0);
    dp__endpoint *ep = NULL;
    CHECK_OK_D(dp__endpoint_create("client-bg", NULL, &ep, &d), &d);
    void *a = NULL;
    CHECK_OK_D(dp__endpoint_alloc(ep, 1 * MiB, &a, &d), &d);
    dp__range l = {(uint64_t)(uintptr_t)a, MiB}, r = {p.base + 63 * MiB, MiB};
    for (int i = 0; i < 20; i++) {
        CHECK_OK_D(dp__endpoint_add_remote(ep, p.md, p.md_len, NULL, &d), &d);
        if (i % 2 == 0)
            CHECK_OK_D(dp__endpoint_add_remote(ep, p.md, p.md_len, NULL, &d), &d);
        memset(a, 0, MiB);
        CHECK_OK_D(
            dp__endpoint_transfer(
                ep, &(dp__xfer_desc){DP_XFER_READ, &l, 1, &r, 1, "peer-bg"}, 10, &d),
            &d);
        CHECK_EQ(((uint8_t *)a)[7], pat(p.seed, 63 * MiB + 7));
        if (i % 3 != 2)
            CHECK_OK_D(dp__endpoint_remove_remote(ep, "peer-bg", &d), &d);
    }
    dp__endpoint_destroy(ep); /* with a remote whose thread may still run */
    peer_stop(&p);
    unsetenv("DP_PREFAULT");
}
