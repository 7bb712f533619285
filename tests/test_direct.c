/*
 * Tests for src/direct: the direct transport between real processes over UCX.
 *
 * Publishers are this same program re-executed with DP_TEST_PEER=publisher (a
 * constructor turns such a process into a publisher before main runs). A
 * publisher owns a dp_direct and a table of buffer slots filled with known
 * patterns, and obeys one-line commands on a socketpair (alloc a slot,
 * publish slots under an id, free an id, register a slot for good, report its
 * counters). The parent is the fetcher: it fetches with its own dp_direct and
 * checks every byte it receives against the pattern (FNV-1a checksums of the
 * fetched and the expected bytes).
 */
#include "dp_test.h"
#include "dp_proc.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/common.h"
#include "dataplane/direct.h"
#include "direct/direct.h"
#include "direct/direct_md.h"
#include "xfer/graveyard.h"

#define KiB 1024ull
#define MiB (1024ull * 1024)
#define NSLOTS 64

/* ---- patterns and checksums ---- */

static void
fill_pattern(uint8_t *q, uint64_t n, uint64_t seed)
{
    uint64_t k = 0;
    for (; k + 8 <= n; k += 8) {
        uint64_t z = (k / 8 + 1) * 0x9e3779b97f4a7c15ull ^ seed;
        z ^= z >> 29;
        memcpy(q + k, &z, 8);
    }
    for (; k < n; k++)
        q[k] = (uint8_t)(seed + k * 131);
}

static uint64_t
fnv(const uint8_t *p, uint64_t n)
{
    uint64_t h = 1469598103934665603ull;
    uint64_t k = 0;
    for (; k + 8 <= n; k += 8) {
        uint64_t w;
        memcpy(&w, p + k, 8);
        h = (h ^ w) * 1099511628211ull;
    }
    for (; k < n; k++)
        h = (h ^ p[k]) * 1099511628211ull;
    return h;
}

static uint64_t
pattern_sum(uint64_t n, uint64_t seed)
{
    uint8_t *q = malloc(n ? n : 1);
    fill_pattern(q, n, seed);
    uint64_t h = fnv(q, n);
    free(q);
    return h;
}

/* ---- I/O ---- */

static int
read_line(int fd, char *buf, size_t cap)
{
    size_t n = 0;
    while (n + 1 < cap) {
        char c;
        if (dp_test_read_all(fd, &c, 1) != 0)
            return -1;
        if (c == '\n')
            break;
        buf[n++] = c;
    }
    buf[n] = '\0';
    return 0;
}

static int
reply(int fd, int rc, const void *p, size_t n)
{
    uint32_t h[2] = {(uint32_t)rc, (uint32_t)n};
    if (dp_test_write_all(fd, h, sizeof h) != 0 || dp_test_write_all(fd, p, n) != 0)
        return -1;
    return 0;
}

/* ---- publisher side ---- */

typedef struct slot {
    uint8_t *p;
    uint64_t len, seed;
} slot;

static void
publisher_main(void)
{
    int fd = atoi(getenv("DP_TEST_PEER_FD"));
    dp_direct_opts o;
    dp_direct_opts_init(&o);
    o.name = getenv("DP_TEST_PEER_NAME");
    o.pool_bytes = strtoull(getenv("DP_TEST_PEER_POOL"), NULL, 0);
    o.backend = DP_DIRECT_BACKEND_UCX;
    dp_detail d;
    dp_detail_clear(&d);
    dp_direct *t = NULL;
    if (dp_direct_create(&o, &t, &d) != DP_OK) {
        fprintf(stderr, "publisher: %s\n", d.msg);
        _exit(2);
    }
    static slot slots[NSLOTS];
    if (reply(fd, 0, "ready", 5) != 0)
        _exit(3);
    char line[4096];
    while (read_line(fd, line, sizeof line) == 0) {
        dp_detail_clear(&d);
        char cmd[16] = "", id[256] = "", rest[3800] = "";
        sscanf(line, "%15s %255s %3799[^\n]", cmd, id, rest);
        if (strcmp(cmd, "quit") == 0)
            break;
        if (strcmp(cmd, "alloc") == 0) {
            /* alloc <slot> <len> <seed> */
            int s = atoi(id);
            unsigned long long len = 0, seed = 0;
            sscanf(rest, "%llu %llu", &len, &seed);
            free(slots[s].p);
            slots[s].p = aligned_alloc(4096, DP_ALIGN_UP(len, 4096));
            slots[s].len = len;
            slots[s].seed = seed;
            fill_pattern(slots[s].p, len, seed);
            reply(fd, 0, "", 0);
        } else if (strcmp(cmd, "pub") == 0) {
            /* pub <id> <slot> <slot> ... */
            dp_direct_buf bufs[NSLOTS];
            size_t n = 0;
            char *save = NULL;
            for (char *tok = strtok_r(rest, " ", &save); tok != NULL && n < NSLOTS;
                 tok = strtok_r(NULL, " ", &save)) {
                int s = atoi(tok);
                bufs[n++] = (dp_direct_buf){slots[s].p, slots[s].len};
            }
            uint8_t *md = NULL;
            size_t md_len = 0;
            int rc = dp_direct_publish(t, id, bufs, n, &md, &md_len, &d);
            if (rc == DP_OK)
                reply(fd, rc, md, md_len);
            else
                reply(fd, rc, d.msg, strlen(d.msg));
            dp_free(md);
        } else if (strcmp(cmd, "free") == 0) {
            int rc = dp_direct_free(t, id, &d);
            reply(fd, rc, d.msg, rc ? strlen(d.msg) : 0);
        } else if (strcmp(cmd, "perm") == 0) {
            int s = atoi(id);
            int rc = dp_direct_register_permanent(t, slots[s].p, slots[s].len, &d);
            reply(fd, rc, d.msg, rc ? strlen(d.msg) : 0);
        } else if (strcmp(cmd, "stats") == 0) {
            dp_direct_stats st;
            dp_direct_get_stats(t, &st);
            reply(fd, 0, &st, sizeof st);
        } else {
            reply(fd, DP_EINVAL, "unknown command", 15);
        }
    }
    dp_direct_destroy(t, NULL);
    for (int i = 0; i < NSLOTS; i++)
        free(slots[i].p);
    _exit(0);
}

__attribute__((constructor)) static void
peer_ctor(void)
{
    const char *mode = getenv("DP_TEST_PEER");
    if (mode == NULL)
        return;
    if (strcmp(mode, "publisher") == 0)
        publisher_main();
    _exit(9);
}

/* ---- parent side: publisher handles ---- */

typedef struct pub {
    pid_t pid;
    int fd;
    char name[64];
    uint64_t len[NSLOTS], seed[NSLOTS];
} pub;

static int
pub_start(pub *p, const char *name, uint64_t pool)
{
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "%s", name);
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
        return -1;
    char fdbuf[16], poolbuf[32];
    snprintf(fdbuf, sizeof fdbuf, "%d", sv[1]);
    snprintf(poolbuf, sizeof poolbuf, "%llu", (unsigned long long)pool);
    const char *env[] = {"DP_TEST_PEER",
                         "publisher",
                         "DP_TEST_PEER_FD",
                         fdbuf,
                         "DP_TEST_PEER_NAME",
                         name,
                         "DP_TEST_PEER_POOL",
                         poolbuf,
                         NULL};
    pid_t pid = dp_test_spawn_self(env, sv[1]);
    close(sv[1]);
    p->pid = pid;
    p->fd = sv[0];
    uint32_t h[2];
    char buf[16];
    if (dp_test_read_all(p->fd, h, sizeof h) != 0 || h[1] != 5 ||
        dp_test_read_all(p->fd, buf, 5) != 0)
        return -1;
    return 0;
}

/* Send a command; returns its rc, the reply bytes in *out (malloc'd) if asked. */
static int pub_cmd(pub *p, uint8_t **out, size_t *out_len, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int
pub_cmd(pub *p, uint8_t **out, size_t *out_len, const char *fmt, ...)
{
    char line[4096];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line - 1, fmt, ap);
    va_end(ap);
    line[n] = '\n';
    uint32_t h[2];
    if (dp_test_write_all(p->fd, line, (size_t)n + 1) != 0 ||
        dp_test_read_all(p->fd, h, sizeof h) != 0)
        return -1000;
    uint8_t *b = malloc(h[1] + 1);
    if (dp_test_read_all(p->fd, b, h[1]) != 0) {
        free(b);
        return -1000;
    }
    b[h[1]] = 0;
    if (h[0] != 0)
        fprintf(stderr, "  publisher %s: %s -> %s: %s\n", p->name, line,
                dp_errname((int)h[0]), (char *)b);
    if (out != NULL) {
        *out = b;
        *out_len = h[1];
    } else {
        free(b);
    }
    return (int)h[0];
}

static void
pub_alloc(pub *p, int s, uint64_t len, uint64_t seed)
{
    CHECK_EQ(pub_cmd(p, NULL, NULL, "alloc %d %llu %llu", s, (unsigned long long)len,
                     (unsigned long long)seed),
             0);
    p->len[s] = len;
    p->seed[s] = seed;
}

typedef struct md_bytes {
    uint8_t *p;
    size_t len;
} md_bytes;

/* Publish slots (list ends with -1) under id; returns the metadata. */
static int
pub_publish(pub *p, md_bytes *md, const char *id, const int *slots)
{
    char list[3000] = "";
    size_t off = 0;
    for (int i = 0; slots[i] >= 0; i++)
        off += (size_t)snprintf(list + off, sizeof list - off, " %d", slots[i]);
    md->p = NULL;
    md->len = 0;
    return pub_cmd(p, &md->p, &md->len, "pub %s%s", id, list);
}

static dp_direct_stats
pub_stats(pub *p)
{
    dp_direct_stats st;
    memset(&st, 0, sizeof st);
    uint8_t *b = NULL;
    size_t n = 0;
    if (pub_cmd(p, &b, &n, "stats -") == 0 && n == sizeof st)
        memcpy(&st, b, sizeof st);
    free(b);
    return st;
}

static void
pub_stop(pub *p)
{
    if (p->pid > 0) {
        kill(p->pid, SIGCONT);
        if (dp_test_write_all(p->fd, "quit -\n", 7) != 0)
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
    p->pid = 0;
    p->fd = 0;
}

/* ---- parent side: fetching ---- */

static dp_direct *
fetcher_with(const char *name, int lru, size_t chunk, int workers, size_t fetch_cache)
{
    dp_direct_opts o;
    dp_direct_opts_init(&o);
    o.name = name;
    o.backend = DP_DIRECT_BACKEND_UCX;
    o.remote_cache_size = lru;
    o.chunk_bytes = chunk;
    o.n_workers = workers;
    o.xfer_timeout_s = 10;
    o.fetch_cache_bytes = fetch_cache;
    dp_detail d;
    dp_detail_clear(&d);
    dp_direct *t = NULL;
    CHECK_OK_D(dp_direct_create(&o, &t, &d), &d);
    return t;
}

static dp_direct *
fetcher(const char *name, int lru, size_t chunk, int workers)
{
    return fetcher_with(name, lru, chunk, workers, 0);
}

/* Fetch md (slots ends with -1) into new buffers and check every byte. */
static void
fetch_check(dp_direct *t, pub *p, const char *id, const md_bytes *md, const int *slots)
{
    dp_detail d;
    dp_detail_clear(&d);
    dp_direct_req *r = NULL;
    CHECK_OK_D(dp_direct_fetch(t, id, md->p, md->len, NULL, 0, &r, &d), &d);
    CHECK_OK_D(dp_direct_wait(r, -1, &d), &d);
    size_t n = 0;
    while (slots[n] >= 0)
        n++;
    CHECK_EQ(dp_direct_req_count(r), n);
    for (size_t i = 0; i < n; i++) {
        void *a;
        size_t len;
        CHECK_OK(dp_direct_req_buffer(r, i, &a, &len));
        CHECK_EQ_U64(len, p->len[slots[i]]);
        CHECK_EQ_U64(fnv(a, len), pattern_sum(len, p->seed[slots[i]]));
    }
    dp_direct_req_destroy(r);
}

/* Fetch into caller targets (malloc'd here) and check. */
static void
fetch_check_targets(dp_direct *t, pub *p, const char *id, const md_bytes *md,
                    const int *slots)
{
    dp_detail d;
    dp_detail_clear(&d);
    size_t n = 0;
    while (slots[n] >= 0)
        n++;
    dp_direct_buf tg[NSLOTS];
    for (size_t i = 0; i < n; i++) {
        tg[i].len = p->len[slots[i]];
        tg[i].addr = aligned_alloc(4096, DP_ALIGN_UP(tg[i].len, 4096));
        memset(tg[i].addr, 0xee, tg[i].len);
    }
    dp_direct_req *r = NULL;
    CHECK_OK_D(dp_direct_fetch(t, id, md->p, md->len, tg, n, &r, &d), &d);
    CHECK_OK_D(dp_direct_wait(r, 30, &d), &d);
    dp_direct_req_destroy(r);
    for (size_t i = 0; i < n; i++) {
        CHECK_EQ_U64(fnv(tg[i].addr, tg[i].len),
                     pattern_sum(tg[i].len, p->seed[slots[i]]));
        free(tg[i].addr);
    }
    /* The targets' registrations were dropped after the fetch. */
    dp_direct_stats st;
    dp_direct_get_stats(t, &st);
    CHECK_EQ_U64(st.registrations, 0);
}

/* ---- registration failures: the limits they name ---- */

/* Lower this process's RLIMIT_MEMLOCK soft limit (any process may) to 64 KiB,
 * so that a failure message must show "64.00 KiB"; *old gets the limit to
 * restore. */
static void
memlock_to_64k(struct rlimit *old)
{
    CHECK(getrlimit(RLIMIT_MEMLOCK, old) == 0);
    struct rlimit low = *old;
    low.rlim_cur = 64 * KiB;
    if (low.rlim_max != RLIM_INFINITY && low.rlim_max < low.rlim_cur)
        low.rlim_cur = low.rlim_max;
    CHECKF(low.rlim_cur == 64 * KiB, "RLIMIT_MEMLOCK hard limit is %llu bytes",
           (unsigned long long)low.rlim_max);
    CHECK(setrlimit(RLIMIT_MEMLOCK, &low) == 0);
}

/* "UCX_TLS = <value or unset>", as the registration failure message says it. */
static const char *
ucx_tls_text(char *buf, size_t cap)
{
    const char *v = getenv("UCX_TLS");
    snprintf(buf, cap, "UCX_TLS = %s", v != NULL && *v != '\0' ? v : "unset");
    return buf;
}

/* This process's address space in use (VmSize), bytes. */
static uint64_t
vm_size_bytes(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    CHECK(f != NULL);
    char line[256];
    uint64_t kb = 0;
    while (fgets(line, sizeof line, f) != NULL)
        if (strncmp(line, "VmSize:", 7) == 0)
            kb = strtoull(line + 7, NULL, 10);
    fclose(f);
    CHECK(kb > 0);
    return kb * KiB;
}

/* ---- tests ---- */

DP_TEST(metadata_roundtrip_and_rejects)
{
    dp_detail d;
    dp_direct *t = fetcher("md-test", 4, 0, 1);
    static uint8_t a[5000], b[100];
    dp_direct_buf bufs[2] = {{a, sizeof a}, {b, sizeof b}};
    uint8_t *md = NULL;
    size_t len = 0;
    CHECK_OK_D(dp_direct_publish(t, "obj-1", bufs, 2, &md, &len, &d), &d);
    dp__direct_md m;
    CHECK_OK_D(dp__direct_md_parse(md, len, &m, &d), &d);
    EXPECT_STR(m.obj_id, "obj-1");
    EXPECT_STR(m.name, "md-test");
    EXPECT_STR(m.backend, "UCX");
    CHECK_EQ(m.n_descs, 2); /* descs[0..1] read below */
    EXPECT_EQ_U64(m.descs[0].addr, (uintptr_t)a);
    EXPECT_EQ_U64(m.descs[1].len, sizeof b);
    EXPECT_EQ_U64(m.total_bytes, sizeof a + sizeof b);
    dp__direct_md_fini(&m);
    size_t n = 0;
    uint64_t sizes[2];
    CHECK_OK(dp_direct_md_describe(md, len, &n, sizes, 2, &d));
    CHECK_EQ(n, 2);
    CHECK_EQ_U64(sizes[0], sizeof a);
    /* Every truncation and every single-byte change is rejected or parses cleanly. */
    for (size_t k = 0; k < len; k++)
        CHECK_ERR(dp__direct_md_parse(md, k, &m, NULL), DP_EPROTO);
    for (size_t k = 0; k < len; k++) {
        uint8_t save = md[k];
        md[k] ^= 0x5a;
        if (dp__direct_md_parse(md, len, &m, NULL) == DP_OK)
            dp__direct_md_fini(&m);
        md[k] = save;
    }
    /* Fetch errors that need no peer. */
    dp_direct_req *r = NULL;
    CHECK_ERR_D(dp_direct_fetch(t, "obj-2", md, len, NULL, 0, &r, &d), DP_EINVAL, &d);
    CHECK_CONTAINS(d.msg, "obj-1");
    dp_direct_buf bad[2] = {{a, sizeof a}, {b, sizeof b - 1}};
    CHECK_ERR_D(dp_direct_fetch(t, "obj-1", md, len, bad, 2, &r, &d), DP_EINVAL, &d);
    CHECK_ERR_D(dp_direct_fetch(t, "obj-1", md, len, bad, 1, &r, &d), DP_EINVAL, &d);
    CHECK_ERR_D(dp_direct_fetch(t, "obj-1", md, len - 1, NULL, 0, &r, &d), DP_EPROTO, &d);
    CHECK(r == NULL);
    /* Publish errors. */
    uint8_t *md2 = NULL;
    size_t len2 = 0;
    CHECK_ERR_D(dp_direct_publish(t, "obj-1", bufs, 2, &md2, &len2, &d), DP_EEXIST, &d);
    CHECK_ERR_D(dp_direct_publish(t, "", bufs, 2, &md2, &len2, &d), DP_EINVAL, &d);
    CHECK_ERR_D(dp_direct_publish(t, "a\nb", bufs, 2, &md2, &len2, &d), DP_EINVAL, &d);
    dp_direct_buf part = {a + 100, sizeof a};
    CHECK_ERR_D(dp_direct_publish(t, "obj-3", &part, 1, &md2, &len2, &d), DP_EEXIST, &d);
    CHECK_CONTAINS(d.msg, "overlaps");
    CHECK_ERR_D(dp_direct_register_permanent(t, a + 100, sizeof a, &d), DP_EEXIST, &d);
    CHECK_OK_D(dp_direct_register_permanent(t, a + 100, 100, &d), &d); /* inside: fine */
    /* A buffer inside a registration shares it. */
    dp_direct_buf inner = {a + 100, 200};
    CHECK_OK_D(dp_direct_publish(t, "obj-4", &inner, 1, &md2, &len2, &d), &d);
    free(md2);
    dp_direct_stats st;
    dp_direct_get_stats(t, &st);
    CHECK_EQ_U64(st.registrations, 2);
    CHECK_EQ_U64(st.objects, 2);
    CHECK_OK(dp_direct_free(t, "obj-1", &d));
    dp_direct_get_stats(t, &st);
    CHECK_EQ_U64(st.registrations, 1); /* a stays: obj-4 holds it */
    CHECK_EQ_U64(st.version, 1);       /* b was deregistered */
    CHECK_OK(dp_direct_free(t, "obj-4", &d));
    CHECK_ERR(dp_direct_free(t, "obj-4", &d), DP_ENOTFOUND);
    dp_direct_get_stats(t, &st);
    CHECK_EQ_U64(st.registrations, 1); /* a is pinned for good (register_permanent) */
    CHECK_EQ_U64(st.version, 1);
    /* Dropped again: deregistered at once when nothing holds it, else when the
     * last object lets go; a range no permanent registration holds is refused. */
    CHECK_ERR_D(dp_direct_deregister_permanent(t, b, sizeof b, &d), DP_ENOTFOUND, &d);
    CHECK_ERR_D(dp_direct_deregister_permanent(t, NULL, 1, &d), DP_EINVAL, &d);
    CHECK_OK_D(dp_direct_publish(t, "obj-5", &inner, 1, &md2, &len2, &d), &d);
    free(md2);
    CHECK_OK_D(dp_direct_deregister_permanent(t, a + 100, 100, &d), &d);
    dp_direct_get_stats(t, &st);
    CHECK_EQ_U64(st.registrations, 1); /* obj-5 still holds it */
    CHECK_ERR_D(dp_direct_deregister_permanent(t, a + 100, 100, &d), DP_ENOTFOUND, &d);
    CHECK_OK(dp_direct_free(t, "obj-5", &d));
    dp_direct_get_stats(t, &st);
    CHECK_EQ_U64(st.registrations, 0);
    CHECK_EQ_U64(st.version, 2);
    CHECK_OK_D(dp_direct_register_permanent(t, a, sizeof a, &d), &d);
    CHECK_OK_D(dp_direct_deregister_permanent(t, a, sizeof a, &d), &d);
    dp_direct_get_stats(t, &st);
    CHECK_EQ_U64(st.registrations, 0); /* nothing held it: gone at once */
    CHECK_EQ_U64(st.version, 3);
    /* An empty object is fine and fetches nothing. */
    CHECK_OK_D(dp_direct_publish(t, "empty", NULL, 0, &md2, &len2, &d), &d);
    CHECK_OK_D(dp_direct_fetch(t, "empty", md2, len2, NULL, 0, &r, &d), &d);
    CHECK_OK_D(dp_direct_wait(r, 5, &d), &d);
    CHECK_EQ(dp_direct_req_count(r), 0);
    dp_direct_req_destroy(r);
    dp_free(md2);
    dp_free(md);
    CHECK_OK(dp_direct_destroy(t, NULL));
}

DP_TEST(sizes_beyond_the_host_and_bad_options_are_refused)
{
    /*
     * Never asked of UCX: it would back the memory with /dev/shm and populate
     * it until the host runs out. Checked before anything is allocated.
     */
    dp_direct_opts o;
    dp_direct_opts_init(&o);
    o.name = "too-big";
    o.backend = DP_DIRECT_BACKEND_UCX;
    o.pool_bytes = 1ull << 46;
    dp_direct *t = NULL;
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_ERR_D(dp_direct_create(&o, &t, &d), DP_EINVAL, &d);
    CHECK(t == NULL);
    CHECK_CONTAINS(d.msg, "70368744177664 bytes");
    /* Metadata claiming a huge object cannot make the fetcher allocate it. */
    o.pool_bytes = 0;
    CHECK_OK_D(dp_direct_create(&o, &t, &d), &d);
    static uint8_t a[4096];
    dp_direct_buf b = {a, sizeof a};
    uint8_t *md = NULL;
    size_t len = 0;
    CHECK_OK_D(dp_direct_publish(t, "big", &b, 1, &md, &len, &d), &d);
    dp__direct_md m;
    CHECK_OK_D(dp__direct_md_parse(md, len, &m, &d), &d);
    m.descs[0].len = 1ull << 46;
    dp__buf forged;
    dp__buf_init(&forged);
    dp_direct_md_fields f = {.obj_id = m.obj_id,
                             .backend = m.backend,
                             .name = m.name,
                             .version = m.version,
                             .ep_md = m.ep_md,
                             .ep_md_len = m.ep_md_len,
                             .descs = m.descs,
                             .n_descs = m.n_descs};
    CHECK_OK_D(dp__direct_md_encode(&forged, &f, &d), &d);
    dp_direct_req *r = NULL;
    CHECK_ERR_D(dp_direct_fetch(t, "big", forged.data, forged.len, NULL, 0, &r, &d),
                DP_ETOOBIG, &d);
    CHECK_CONTAINS(d.msg, "targets of your own");
    dp__buf_fini(&forged);
    dp__direct_md_fini(&m);
    dp_free(md);
    CHECK_OK(dp_direct_destroy(t, NULL));
    /* Bad options and backends are refused plainly. */
    o.n_workers = 1000;
    CHECK_ERR_D(dp_direct_create(&o, &t, &d), DP_EINVAL, &d);
    o.n_workers = 0;
    setenv("DP_DIRECT_BACKEND", "libfabric", 1);
    CHECK_ERR_D(dp_direct_create(&o, &t, &d), DP_EUNSUPPORTED, &d);
    CHECK_CONTAINS(d.msg, "libfabric backend is not");
    unsetenv("DP_DIRECT_BACKEND");
}

DP_TEST(efa_detection_reports_missing_libfabric)
{
    char root[] = "/tmp/dp_direct_sysfs_XXXXXX";
    CHECK(mkdtemp(root) != NULL);
    char path[512], target[512];
    char what[300];
    snprintf(path, sizeof path, "%s/class/infiniband/mlx5_0/device", root);
    CHECK_EQ(system(NULL) != 0, 1);
    char cmd[4096];
    snprintf(
        cmd, sizeof cmd,
        "mkdir -p %s %s/bus/drivers/mlx5_core %s/bus/drivers/efa %s/class/net/eth0 && "
        "ln -s %s/bus/drivers/mlx5_core %s/driver",
        path, root, root, root, root, path);
    CHECK_EQ(system(cmd), 0);
    CHECK(!dp__direct_find_efa(root, what, sizeof what));
    /* A verbs device named like EFA but bound to another driver is not EFA. */
    snprintf(path, sizeof path, "%s/class/infiniband/efa_0/device", root);
    snprintf(target, sizeof target, "%s/bus/drivers/mlx5_core", root);
    snprintf(cmd, sizeof cmd, "mkdir -p %s && ln -s %s %s/driver", path, target, path);
    CHECK_EQ(system(cmd), 0);
    CHECK(!dp__direct_find_efa(root, what, sizeof what));
    /* A verbs device bound to the efa driver (as inside a container). */
    snprintf(path, sizeof path, "%s/class/infiniband/rdmap0s6/device", root);
    snprintf(target, sizeof target, "%s/bus/drivers/efa", root);
    snprintf(cmd, sizeof cmd, "mkdir -p %s && ln -s %s %s/driver", path, target, path);
    CHECK_EQ(system(cmd), 0);
    CHECK(dp__direct_find_efa(root, what, sizeof what));
    CHECK_CONTAINS(what, "rdmap0s6");
    dp__direct_set_sysfs_root(root);
    dp_direct_opts o;
    dp_direct_opts_init(&o);
    dp_direct *t = NULL;
    dp_detail d;
    CHECK_ERR_D(dp_direct_create(&o, &t, &d), DP_EUNSUPPORTED, &d);
    CHECK_CONTAINS(d.msg, "libfabric");
    CHECK_CONTAINS(d.msg, "rdmap0s6");
    o.backend = DP_DIRECT_BACKEND_UCX;
    o.name = "efa-ucx";
    CHECK_OK_D(dp_direct_create(&o, &t, &d), &d);
    CHECK_STR(dp_direct_backend_name(t), "UCX");
    CHECK_OK(dp_direct_destroy(t, NULL));
    dp__direct_set_sysfs_root(NULL);
    /* A bare host: efa netdevs. */
    snprintf(cmd, sizeof cmd,
             "rm -rf %s/class/infiniband/rdmap0s6 && mkdir -p %s/class/net/efa0", root,
             root);
    CHECK_EQ(system(cmd), 0);
    CHECK(dp__direct_find_efa(root, what, sizeof what));
    CHECK_CONTAINS(what, "efa0");
    snprintf(cmd, sizeof cmd, "rm -rf %s", root);
    CHECK_EQ(system(cmd), 0);
}

/*
 * A buffer whose range cannot be registered makes publish fail, and the
 * message says which object and buffer, the range, and that the endpoint
 * refused it before UCX saw it; no memlock advice, which would mislead there
 * (the limit is lowered to 64 KiB here so that a stray advice would show its
 * text). On a host without RDMA, UCX registers any range it is given (no
 * pinning: a lowered RLIMIT_MEMLOCK, PROT_NONE or unmapped memory all
 * register), so the real refusal used here is a range that wraps past the end
 * of the address space (DP_EINVAL). The failed publish takes nothing: the
 * registration its first buffer shared is held only by the earlier object,
 * and the id can be published afterwards. register_permanent of the same
 * range fails the same way. UCX's own refusals carry the memlock advice
 * (pool_ucx_cannot_map_names_size_and_memlock_limit).
 */
DP_TEST(unregistrable_range_is_named_without_memlock_advice)
{
    struct rlimit old;
    memlock_to_64k(&old);
    dp_direct *t = fetcher("reg-fail", 4, 0, 1);
    static uint8_t a[4096];
    dp_direct_buf ok = {a, sizeof a};
    uint8_t *md = NULL;
    size_t md_len = 0;
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_OK_D(dp_direct_publish(t, "first", &ok, 1, &md, &md_len, &d), &d);
    dp_free(md);
    /* The last 4 KiB of the address space and 4 KiB past it. */
    void *top = (void *)(uintptr_t)(UINT64_MAX - 4095);
    dp_direct_buf bufs[2] = {{a, sizeof a}, {top, 8192}};
    md = NULL;
    md_len = 0;
    CHECK_ERR_D(dp_direct_publish(t, "second", bufs, 2, &md, &md_len, &d), DP_EINVAL, &d);
    CHECK(md == NULL);
    CHECK_EQ(md_len, 0);
    /* What failed: the object, the buffer, its range, the endpoint's refusal. */
    CHECK_CONTAINS(d.msg, "direct: publish second, buffer 1 of 2: ");
    CHECK_CONTAINS(d.msg, "direct: registering buffer of 8192 bytes at "
                          "0xfffffffffffff000: refused before UCX saw it");
    CHECK_CONTAINS(d.msg, "endpoint reg-fail: cannot register 8192 bytes at "
                          "0xfffffffffffff000");
    CHECK(strstr(d.msg, "memlock") == NULL);
    /* Nothing taken: a's registration is held by "first" alone. */
    dp_direct_stats st;
    dp_direct_get_stats(t, &st);
    CHECK_EQ_U64(st.objects, 1);
    CHECK_EQ_U64(st.registrations, 1);
    CHECK_EQ_U64(st.registers, 1);
    CHECK_OK(dp_direct_free(t, "first", &d));
    dp_direct_get_stats(t, &st);
    CHECK_EQ_U64(st.registrations, 0);
    CHECK_OK_D(dp_direct_publish(t, "second", &ok, 1, &md, &md_len, &d), &d);
    dp_free(md);
    /* The same refusal through register_permanent names that call's buffer. */
    CHECK_ERR_D(dp_direct_register_permanent(t, top, 8192, &d), DP_EINVAL, &d);
    CHECK_CONTAINS(d.msg, "registering permanent buffer of 8192 bytes at "
                          "0xfffffffffffff000: refused before UCX saw it");
    CHECK(strstr(d.msg, "memlock") == NULL);
    CHECK_OK(dp_direct_destroy(t, NULL));
    CHECK(setrlimit(RLIMIT_MEMLOCK, &old) == 0);
}

/*
 * A registration refused because the range overlaps memory the transport
 * registered itself (its pool here, whose address a pooled object's metadata
 * gives) is DP_EEXIST with its own message: what overlaps and why, and no
 * memlock advice, which would mislead there. Reached through
 * register_permanent and through a publish that does not use the pool (one
 * of its buffers has a registration of its own).
 */
DP_TEST(registering_the_transports_own_memory_says_so)
{
    dp_direct_opts o;
    dp_direct_opts_init(&o);
    o.name = "reg-own";
    o.backend = DP_DIRECT_BACKEND_UCX;
    o.pool_bytes = 1 * MiB;
    o.n_workers = 1;
    dp_direct *t = NULL;
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_OK_D(dp_direct_create(&o, &t, &d), &d);
    static uint8_t a[4096], b[4096];
    dp_direct_buf ba = {a, sizeof a};
    uint8_t *md = NULL;
    size_t md_len = 0;
    CHECK_OK_D(dp_direct_publish(t, "pooled", &ba, 1, &md, &md_len, &d), &d);
    dp__direct_md m;
    CHECK_OK_D(dp__direct_md_parse(md, md_len, &m, &d), &d);
    CHECK_EQ(m.n_descs, 1);
    void *in_pool = (void *)(uintptr_t)m.descs[0].addr;
    CHECK(in_pool != (void *)a); /* copied into the pool */
    char where[64];
    snprintf(where, sizeof where, "of 4096 bytes at %p: it overlaps", in_pool);
    CHECK_ERR_D(dp_direct_register_permanent(t, in_pool, 4096, &d), DP_EEXIST, &d);
    CHECK_CONTAINS(d.msg, "direct: registering permanent buffer ");
    CHECK_CONTAINS(d.msg, where);
    CHECK_CONTAINS(d.msg, "memory this transport registered itself (its pool, or the "
                          "buffers of a fetch request still alive)");
    CHECK_CONTAINS(d.msg, "endpoint reg-own: ");
    CHECK_CONTAINS(d.msg, "overlaps a registered region");
    CHECK(strstr(d.msg, "memlock") == NULL);
    /* With b registered for good, a publish of b and the pool block bypasses
     * the pool and registers each buffer: the second is refused. */
    CHECK_OK_D(dp_direct_register_permanent(t, b, sizeof b, &d), &d);
    dp_direct_buf two[2] = {{b, sizeof b}, {in_pool, 4096}};
    uint8_t *md2 = NULL;
    size_t md2_len = 0;
    CHECK_ERR_D(dp_direct_publish(t, "relay", two, 2, &md2, &md2_len, &d), DP_EEXIST, &d);
    CHECK_CONTAINS(d.msg, "direct: publish relay, buffer 1 of 2: direct: registering "
                          "buffer ");
    CHECK_CONTAINS(d.msg, where);
    CHECK(strstr(d.msg, "memlock") == NULL);
    dp_direct_stats st;
    dp_direct_get_stats(t, &st);
    CHECK_EQ_U64(st.objects, 1);
    CHECK_EQ_U64(st.registrations, 1); /* b, for good */
    CHECK_EQ_U64(st.pool_blocks, 1);
    dp__direct_md_fini(&m);
    dp_free(md);
    CHECK_OK(dp_direct_destroy(t, NULL));
}

/*
 * The one refusal of UCX's own that a host without RDMA gives the transport:
 * its pool, which UCX allocates, registers and maps (shared memory, else plain
 * memory), cannot be mapped when the address space is full. RLIMIT_AS is lowered in this
 * test's own process to what it uses plus 64 MiB, after a first transport was created and
 * destroyed (UCX loaded, thread stacks cached), and a 256 MiB pool is asked for. Creation
 * fails with DP_ENOMEM, and the message says the pool, its size, what UCX said, and the
 * memlock limit (lowered to 64 KiB) with what RDMA needs (`ulimit -l unlimited`). UCX
 * logs its own errors on stderr meanwhile. With the limit back, the same pool is created:
 * the limit alone made it fail. Sanitizers reserve terabytes of address space and
 * allocate shadow memory on their own, so an address-space limit means
 * nothing there.
 */
DP_TEST(pool_ucx_cannot_map_names_size_and_memlock_limit)
{
#ifdef DP_TEST_SANITIZED
    DP_SKIP("RLIMIT_AS cannot bound a sanitized process (shadow memory)");
#endif
    struct rlimit old_ml, old_as;
    memlock_to_64k(&old_ml);
    char tls[300];
    ucx_tls_text(tls, sizeof tls);
    dp_direct_opts o;
    dp_direct_opts_init(&o);
    o.name = "pool-fail";
    o.backend = DP_DIRECT_BACKEND_UCX;
    o.n_workers = 1;
    dp_direct *t = NULL;
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_OK_D(dp_direct_create(&o, &t, &d), &d);
    CHECK_OK(dp_direct_destroy(t, NULL));
    t = NULL;
    CHECK(getrlimit(RLIMIT_AS, &old_as) == 0);
    struct rlimit as = old_as;
    as.rlim_cur = vm_size_bytes() + 64 * MiB;
    if (old_as.rlim_cur != RLIM_INFINITY && old_as.rlim_cur <= as.rlim_cur + 256 * MiB)
        DP_SKIP("RLIMIT_AS is already %llu bytes: a 256 MiB pool fails without this "
                "test",
                (unsigned long long)old_as.rlim_cur);
    CHECK(setrlimit(RLIMIT_AS, &as) == 0);
    o.pool_bytes = 256 * MiB;
    int rc = dp_direct_create(&o, &t, &d);
    CHECK(setrlimit(RLIMIT_AS, &old_as) == 0);
    CHECK_ERR_D(rc, DP_ENOMEM, &d);
    CHECK(t == NULL);
    /* What failed: the pool and its size, as the transport and the endpoint say. */
    CHECK_CONTAINS(d.msg, "direct (backend UCX): allocating and registering the memory "
                          "pool of 268435456 bytes failed");
    CHECK_CONTAINS(d.msg, "endpoint pool-fail: allocation of 256.00 MiB failed: ");
    CHECK_CONTAINS(d.msg, "Out of memory");
    /* What to do: the limit this process has, what RDMA needs, where to look. */
    CHECK_CONTAINS(d.msg, "check the memlock limit, ulimit -l = 64.00 KiB");
    CHECK_CONTAINS(d.msg, "RLIMIT_MEMLOCK 64.00 KiB; RDMA registration of large "
                          "regions needs `ulimit -l unlimited`");
    CHECK_CONTAINS(d.msg, tls);
    CHECK_CONTAINS(d.msg, "rerun with UCX_LOG_LEVEL=debug");
    /* The limit alone made it fail. */
    CHECK_OK_D(dp_direct_create(&o, &t, &d), &d);
    dp_direct_stats st;
    dp_direct_get_stats(t, &st);
    CHECK_EQ_U64(st.pool_bytes, 256 * MiB);
    CHECK_OK(dp_direct_destroy(t, NULL));
    CHECK(setrlimit(RLIMIT_MEMLOCK, &old_ml) == 0);
}

DP_TEST(many_objects_shared_buffers)
{
    pub p;
    CHECK_EQ(pub_start(&p, "pub-many", 0), 0);
    uint64_t rs = dp_test_seed();
    enum { NB = 24, NOBJ = 40 };
    for (int s = 0; s < NB; s++) {
        uint64_t len = s % 4 == 0 ? 4 * KiB : 1 + dp_test_rand(&rs) % (2 * MiB);
        pub_alloc(&p, s, len, dp_test_rand(&rs));
    }
    dp_direct *t = fetcher("fetch-many", 4, 256 * KiB, 2);
    md_bytes md[NOBJ];
    int objs[NOBJ][6];
    for (int i = 0; i < NOBJ; i++) {
        int k = 1 + (int)(dp_test_rand(&rs) % 5);
        for (int j = 0; j < k; j++)
            objs[i][j] = (int)(dp_test_rand(&rs) % NB);
        objs[i][k] = -1;
        char id[32];
        snprintf(id, sizeof id, "obj-%d", i);
        CHECK_EQ(pub_publish(&p, &md[i], id, objs[i]), 0);
    }
    dp_direct_stats ps = pub_stats(&p);
    CHECK_EQ_U64(ps.objects, NOBJ);
    CHECK(ps.registrations <= NB); /* each buffer registered once at most */
    CHECK_EQ_U64(ps.registers, ps.registrations);
    /*
     * The newest metadata first: it covers every older object's regions, so
     * the older ones need no re-add. Then everything, half into new buffers and
     * half into caller targets.
     */
    {
        char id[32];
        snprintf(id, sizeof id, "obj-%d", NOBJ - 1);
        fetch_check(t, &p, id, &md[NOBJ - 1], objs[NOBJ - 1]);
    }
    for (int i = 0; i < NOBJ; i++) {
        char id[32];
        snprintf(id, sizeof id, "obj-%d", i);
        if (i % 2)
            fetch_check(t, &p, id, &md[i], objs[i]);
        else
            fetch_check_targets(t, &p, id, &md[i], objs[i]);
    }
    /* Many fetches at once (both workers busy). */
    dp_direct_req *rq[NOBJ];
    dp_detail d;
    for (int i = 0; i < NOBJ; i++) {
        char id[32];
        snprintf(id, sizeof id, "obj-%d", i);
        CHECK_OK_D(dp_direct_fetch(t, id, md[i].p, md[i].len, NULL, 0, &rq[i], &d), &d);
    }
    for (int i = 0; i < NOBJ; i++) {
        CHECK_OK_D(dp_direct_wait(rq[i], 60, &d), &d);
        for (int j = 0; objs[i][j] >= 0; j++) {
            void *a;
            size_t len;
            CHECK_OK(dp_direct_req_buffer(rq[i], (size_t)j, &a, &len));
            CHECK_EQ_U64(fnv(a, len), pattern_sum(len, p.seed[objs[i][j]]));
        }
        dp_direct_req_destroy(rq[i]);
    }
    dp_direct_stats st;
    dp_direct_get_stats(t, &st);
    CHECK_EQ_U64(st.fetch_ok, 2 * NOBJ + 1);
    CHECK_EQ_U64(st.remote_adds, 1); /* registrations never changed: one connection */
    CHECK_EQ_U64(st.remote_readds, 0);
    /* Free every object: every registration goes, each bumping the version. */
    for (int i = 0; i < NOBJ; i++) {
        CHECK_EQ(pub_cmd(&p, NULL, NULL, "free obj-%d", i), 0);
        free(md[i].p);
    }
    dp_direct_stats ps2 = pub_stats(&p);
    CHECK_EQ_U64(ps2.objects, 0);
    CHECK_EQ_U64(ps2.registrations, 0);
    CHECK_EQ_U64(ps2.deregisters, ps.registers);
    CHECK_EQ_U64(ps2.version, ps.registers);
    CHECK_OK(dp_direct_destroy(t, NULL));
    pub_stop(&p);
}

DP_TEST(refcounts_version_bump_and_readd)
{
    pub p;
    CHECK_EQ(pub_start(&p, "pub-ref", 0), 0);
    pub_alloc(&p, 0, 1 * MiB, 100);
    pub_alloc(&p, 1, 3 * MiB + 5, 101);
    pub_alloc(&p, 2, 64 * KiB, 102);
    dp_direct *t = fetcher("fetch-ref", 4, 0, 1);
    md_bytes m1, m2, m3;
    int s1[] = {0, 1, -1}, s2[] = {1, 2, -1}, s3[] = {0, -1};
    CHECK_EQ(pub_publish(&p, &m1, "o1", s1), 0);
    CHECK_EQ(pub_publish(&p, &m2, "o2", s2), 0);
    dp_direct_stats ps = pub_stats(&p);
    CHECK_EQ_U64(ps.registrations, 3); /* slot 1 shared, registered once */
    CHECK_EQ_U64(ps.version, 0);
    fetch_check(t, &p, "o1", &m1, s1);
    fetch_check(t, &p, "o2", &m2, s2);
    /* Freeing o1 drops slot 0 only (slot 1 is still held by o2). */
    CHECK_EQ(pub_cmd(&p, NULL, NULL, "free o1"), 0);
    ps = pub_stats(&p);
    CHECK_EQ_U64(ps.registrations, 2);
    CHECK_EQ_U64(ps.version, 1);
    fetch_check(t, &p, "o2", &m2, s2); /* old metadata of a live object: still fine */
    /* Slot 0 comes back in a new object: new registration, new version. */
    CHECK_EQ(pub_publish(&p, &m3, "o3", s3), 0);
    dp_direct_stats st0, st1;
    dp_direct_get_stats(t, &st0);
    fetch_check(t, &p, "o3", &m3, s3);
    dp_direct_get_stats(t, &st1);
    CHECK_EQ_U64(st1.remote_readds, st0.remote_readds + 1);
    CHECK_EQ_U64(st1.remote_adds, st0.remote_adds);
    fetch_check_targets(t, &p, "o3", &m3, s3);
    dp_direct_get_stats(t, &st0);
    CHECK_EQ_U64(st0.remote_readds, st1.remote_readds); /* same version: no re-add */
    CHECK_EQ_U64(st0.remote_hits, st1.remote_hits + 1);
    CHECK_EQ(pub_cmd(&p, NULL, NULL, "free o2"), 0);
    CHECK_EQ(pub_cmd(&p, NULL, NULL, "free o3"), 0);
    ps = pub_stats(&p);
    CHECK_EQ_U64(ps.registrations, 0);
    CHECK_EQ_U64(ps.version, 4);
    free(m1.p);
    free(m2.p);
    free(m3.p);
    CHECK_OK(dp_direct_destroy(t, NULL));
    pub_stop(&p);
}

DP_TEST(permanent_registration)
{
    pub p;
    CHECK_EQ(pub_start(&p, "pub-perm", 4 * MiB), 0);
    pub_alloc(&p, 0, 2 * MiB, 7);
    pub_alloc(&p, 1, 1 * MiB, 8);
    CHECK_EQ(pub_cmd(&p, NULL, NULL, "perm 0"), 0);
    CHECK_EQ(pub_cmd(&p, NULL, NULL, "perm 0"), 0); /* idempotent */
    dp_direct *t = fetcher("fetch-perm", 4, 0, 1);
    md_bytes m;
    int s[] = {0, 1, -1};
    /* Slot 0 has its own registration: the pool is not used for this object. */
    CHECK_EQ(pub_publish(&p, &m, "o", s), 0);
    dp_direct_stats ps = pub_stats(&p);
    CHECK_EQ_U64(ps.registrations, 2);
    CHECK_EQ_U64(ps.pool_blocks, 0);
    fetch_check(t, &p, "o", &m, s);
    CHECK_EQ(pub_cmd(&p, NULL, NULL, "free o"), 0);
    ps = pub_stats(&p);
    CHECK_EQ_U64(ps.registrations, 1); /* the permanent one stays */
    CHECK_EQ_U64(ps.version, 1);
    free(m.p);
    CHECK_OK(dp_direct_destroy(t, NULL));
    pub_stop(&p);
}

DP_TEST(lru_eviction)
{
    enum { NP = 3 };
    pub ps[NP];
    md_bytes md[NP];
    int s[] = {0, -1};
    const char *names[NP] = {"pub-l0", "pub-l1", "pub-l2"};
    for (int i = 0; i < NP; i++) {
        CHECK_EQ(pub_start(&ps[i], names[i], 0), 0);
        pub_alloc(&ps[i], 0, 512 * KiB + (uint64_t)i, 200 + (uint64_t)i);
        CHECK_EQ(pub_publish(&ps[i], &md[i], "x", s), 0);
    }
    dp_direct *t = fetcher("fetch-lru", 2, 0, 1);
    dp_direct_stats st;
    fetch_check(t, &ps[0], "x", &md[0], s);
    fetch_check(t, &ps[1], "x", &md[1], s);
    dp_direct_get_stats(t, &st);
    CHECK_EQ_U64(st.remotes_cached, 2);
    CHECK_EQ_U64(st.remote_evictions, 0);
    fetch_check(t, &ps[0], "x", &md[0], s); /* p0 becomes most recent */
    fetch_check(t, &ps[2], "x", &md[2], s); /* evicts p1 */
    dp_direct_get_stats(t, &st);
    CHECK_EQ_U64(st.remotes_cached, 2);
    CHECK_EQ_U64(st.remote_evictions, 1);
    CHECK_EQ_U64(st.remote_adds, 3);
    CHECK_EQ_U64(st.remote_hits, 1);
    fetch_check(t, &ps[0], "x", &md[0], s); /* still cached */
    dp_direct_get_stats(t, &st);
    CHECK_EQ_U64(st.remote_hits, 2);
    fetch_check(t, &ps[1], "x", &md[1], s); /* evicted earlier: added again, evicts p2 */
    dp_direct_get_stats(t, &st);
    CHECK_EQ_U64(st.remote_adds, 4);
    CHECK_EQ_U64(st.remote_evictions, 2);
    CHECK_EQ_U64(st.remotes_cached, 2);
    CHECK_OK(dp_direct_destroy(t, NULL));
    for (int i = 0; i < NP; i++) {
        free(md[i].p);
        pub_stop(&ps[i]);
    }
}

DP_TEST(lru_size_zero_adds_and_removes_every_time)
{
    pub p;
    CHECK_EQ(pub_start(&p, "pub-z", 0), 0);
    pub_alloc(&p, 0, 700 * KiB, 301);
    pub_alloc(&p, 1, 9, 302);
    md_bytes m;
    int s[] = {0, 1, -1};
    CHECK_EQ(pub_publish(&p, &m, "z", s), 0);
    dp_direct *t = fetcher("fetch-z", DP_DIRECT_REMOTE_CACHE_OFF, 0, 2);
    for (int i = 0; i < 3; i++) {
        if (i == 1)
            fetch_check_targets(t, &p, "z", &m, s);
        else
            fetch_check(t, &p, "z", &m, s);
        dp_direct_stats st;
        dp_direct_get_stats(t, &st);
        CHECK_EQ_U64(st.remotes_cached, 0);
        CHECK_EQ_U64(st.remote_adds, (uint64_t)i + 1);
        CHECK_EQ_U64(st.remote_evictions, (uint64_t)i + 1);
        CHECK_EQ_U64(st.remote_hits, 0);
    }
    free(m.p);
    CHECK_OK(dp_direct_destroy(t, NULL));
    pub_stop(&p);
}

DP_TEST(pool_path_and_rollback)
{
    pub p;
    CHECK_EQ(pub_start(&p, "pub-pool", 8 * MiB), 0);
    pub_alloc(&p, 0, 1 * MiB, 400);
    pub_alloc(&p, 1, 1 * MiB, 401);
    pub_alloc(&p, 2, 1 * MiB, 402);
    pub_alloc(&p, 3, 6 * MiB, 403);
    pub_alloc(&p, 4, 100, 404);
    dp_direct *t = fetcher("fetch-pool", 4, 0, 1);
    md_bytes m1, m2, m3, bad;
    int s1[] = {0, 1, -1}, s2[] = {1, 4, -1}, sbad[] = {1, 2, 3, -1}, s3[] = {2, -1};
    CHECK_EQ(pub_publish(&p, &m1, "p1", s1), 0);
    dp_direct_stats ps = pub_stats(&p);
    CHECK_EQ_U64(ps.pool_blocks, 2);
    CHECK_EQ_U64(ps.pool_used, 2 * MiB);
    CHECK_EQ_U64(ps.registrations, 0);
    CHECK_EQ_U64(ps.pool_bytes, 8 * MiB);
    fetch_check(t, &p, "p1", &m1, s1);
    /* A buffer already pooled shares its block. */
    CHECK_EQ(pub_publish(&p, &m2, "p2", s2), 0);
    ps = pub_stats(&p);
    CHECK_EQ_U64(ps.pool_blocks, 3);
    fetch_check_targets(t, &p, "p2", &m2, s2);
    /*
     * Slot 1 (shared), slot 2 (new block) then slot 3 (6 MiB: no room): the call
     * fails and gives back slot 2's block and its hold on slot 1, nothing else.
     */
    CHECK_EQ(pub_publish(&p, &bad, "pbad", sbad), DP_EBUSY);
    CHECK_CONTAINS((char *)bad.p, "pool");
    free(bad.p);
    dp_direct_stats ps2 = pub_stats(&p);
    CHECK_EQ_U64(ps2.pool_blocks, ps.pool_blocks);
    CHECK_EQ_U64(ps2.pool_used, ps.pool_used);
    CHECK_EQ_U64(ps2.objects, 2);
    fetch_check(t, &p, "p1", &m1, s1);
    fetch_check(t, &p, "p2", &m2, s2);
    /* Frees return blocks only when their last holder goes. */
    CHECK_EQ(pub_cmd(&p, NULL, NULL, "free p1"), 0);
    ps = pub_stats(&p);
    CHECK_EQ_U64(ps.pool_blocks, 2); /* slot 1 still held by p2 */
    fetch_check(t, &p, "p2", &m2, s2);
    CHECK_EQ(pub_cmd(&p, NULL, NULL, "free p2"), 0);
    ps = pub_stats(&p);
    CHECK_EQ_U64(ps.pool_blocks, 0);
    CHECK_EQ_U64(ps.pool_used, 0);
    CHECK_EQ_U64(ps.version, 0); /* pool blocks never deregister */
    /* Now slot 3 fits. */
    int s4[] = {3, 2, -1};
    md_bytes m4;
    CHECK_EQ(pub_publish(&p, &m4, "p4", s4), 0);
    fetch_check(t, &p, "p4", &m4, s4);
    CHECK_EQ(pub_publish(&p, &m3, "p3", s3), 0);
    fetch_check(t, &p, "p3", &m3, s3);
    free(m1.p);
    free(m2.p);
    free(m3.p);
    free(m4.p);
    CHECK_OK(dp_direct_destroy(t, NULL));
    pub_stop(&p);
}

DP_TEST(wait_with_timeouts)
{
    pub p;
    CHECK_EQ(pub_start(&p, "pub-w", 0), 0);
    pub_alloc(&p, 0, 8 * MiB, 500);
    md_bytes m;
    int s[] = {0, -1};
    CHECK_EQ(pub_publish(&p, &m, "w", s), 0);
    dp_direct *t = fetcher("fetch-w", 4, 1 * MiB, 1);
    dp__direct_set_chunk_pause(t, 0.05); /* 8 chunks: about 0.4 s */
    dp_detail d;
    dp_direct_req *r = NULL;
    CHECK_OK_D(dp_direct_fetch(t, "w", m.p, m.len, NULL, 0, &r, &d), &d);
    double t0 = dp_test_now();
    CHECK_ERR_D(dp_direct_wait(r, 0, &d), DP_ETIMEDOUT, &d);
    CHECK(dp_test_now() - t0 < 0.05);
    t0 = dp_test_now();
    CHECK_ERR_D(dp_direct_wait(r, 0.1, &d), DP_ETIMEDOUT, &d);
    double took = dp_test_now() - t0;
    CHECKF(took >= 0.09 && took < 0.35, "wait(0.1) took %.3f s", took);
    CHECK_CONTAINS(d.msg, "still running");
    CHECK(!dp_direct_req_ended(r));
    CHECK_OK_D(dp_direct_wait(r, -1, &d), &d);
    CHECK(dp_direct_req_ended(r));
    CHECK_OK_D(dp_direct_wait(r, 0, &d), &d); /* the same answer again */
    uint64_t done, total;
    dp_direct_req_progress(r, &done, &total);
    CHECK_EQ_U64(done, 8 * MiB);
    CHECK_EQ_U64(total, 8 * MiB);
    void *a;
    size_t len;
    CHECK_OK(dp_direct_req_buffer(r, 0, &a, &len));
    CHECK_EQ_U64(fnv(a, len), pattern_sum(8 * MiB, 500));
    CHECK_ERR(dp_direct_req_buffer(r, 1, &a, &len), DP_EINVAL);
    dp_direct_req_destroy(r);
    /* A buffer of a live request cannot be a fetch target: refused with the size. */
    CHECK_OK_D(dp_direct_fetch(t, "w", m.p, m.len, NULL, 0, &r, &d), &d);
    CHECK_OK_D(dp_direct_wait(r, -1, &d), &d);
    CHECK_OK(dp_direct_req_buffer(r, 0, &a, &len));
    dp_direct_buf tg = {a, len};
    dp_direct_req *r2 = NULL;
    CHECK_ERR_D(dp_direct_fetch(t, "w", m.p, m.len, &tg, 1, &r2, &d), DP_EEXIST, &d);
    CHECK_CONTAINS(d.msg, "8388608 bytes");
    CHECK_CONTAINS(d.msg, "still alive");
    dp_direct_req_destroy(r);
    free(m.p);
    CHECK_OK(dp_direct_destroy(t, NULL));
    pub_stop(&p);
}

DP_TEST(abort_before_queued_and_during)
{
    pub p;
    CHECK_EQ(pub_start(&p, "pub-a", 0), 0);
    pub_alloc(&p, 0, 16 * MiB, 600);
    pub_alloc(&p, 1, 1 * MiB, 601);
    md_bytes m, m2;
    int s[] = {0, -1}, s2[] = {1, -1};
    CHECK_EQ(pub_publish(&p, &m, "a", s), 0);
    CHECK_EQ(pub_publish(&p, &m2, "b", s2), 0);
    dp_direct *t = fetcher("fetch-a", 4, 1 * MiB, 1);
    dp_detail d;
    dp_direct_req *r = NULL, *r2 = NULL;
    /* Before: the next fetch of the id fails, once. */
    CHECK_OK(dp_direct_abort(t, "a", &d));
    CHECK_ERR_D(dp_direct_fetch(t, "a", m.p, m.len, NULL, 0, &r, &d), DP_ECANCELED, &d);
    CHECK_CONTAINS(d.msg, "aborted");
    CHECK(r == NULL);
    fetch_check(t, &p, "a", &m, s);
    /* During, with a second fetch queued behind it (one worker). */
    dp__direct_set_chunk_pause(t, 0.03);
    CHECK_OK_D(dp_direct_fetch(t, "a", m.p, m.len, NULL, 0, &r, &d), &d);
    CHECK_OK_D(dp_direct_fetch(t, "b", m2.p, m2.len, NULL, 0, &r2, &d), &d);
    CHECK_OK(dp_direct_abort(t, "b", &d)); /* still queued */
    uint64_t done = 0, total = 0;
    double t0 = dp_test_now();
    while (done == 0 && dp_test_now() - t0 < 10) {
        usleep(1000);
        dp_direct_req_progress(r, &done, &total);
    }
    CHECK(done > 0);
    CHECK_OK(dp_direct_abort(t, "a", &d));
    CHECK_ERR_D(dp_direct_wait(r, 10, &d), DP_ECANCELED, &d);
    CHECK_CONTAINS(d.msg, "aborted after");
    dp_direct_req_progress(r, &done, &total);
    CHECKF(done < total, "aborted fetch read %llu of %llu", (unsigned long long)done,
           (unsigned long long)total);
    CHECK_ERR_D(dp_direct_wait(r2, 10, &d), DP_ECANCELED, &d);
    CHECK_CONTAINS(d.msg, "before it started");
    dp_direct_req_destroy(r);
    dp_direct_req_destroy(r2);
    dp_direct_stats st;
    dp_direct_get_stats(t, &st);
    CHECK_EQ_U64(st.fetch_aborted, 2);
    /* The marks were used up: both fetch fine now. */
    dp__direct_set_chunk_pause(t, 0);
    fetch_check(t, &p, "a", &m, s);
    fetch_check(t, &p, "b", &m2, s2);
    /* Destroying a running request aborts it and waits for it. */
    dp__direct_set_chunk_pause(t, 0.03);
    CHECK_OK_D(dp_direct_fetch(t, "a", m.p, m.len, NULL, 0, &r, &d), &d);
    usleep(50000);
    t0 = dp_test_now();
    dp_direct_req_destroy(r);
    CHECK(dp_test_now() - t0 < 2);
    free(m.p);
    free(m2.p);
    CHECK_OK(dp_direct_destroy(t, NULL));
    pub_stop(&p);
}

/*
 * A transport is never destroyed under a live request: destroy answers
 * DP_EBUSY naming it (while it runs, and after it ended but before
 * dp_direct_req_destroy), and the transport goes on working; once every
 * request is destroyed, destroy succeeds. Before, destroy freed the transport
 * and dp_direct_req_destroy then locked its freed mutex (a use-after-free
 * under AddressSanitizer). Also: zeroed options (but the backend) are the
 * defaults, and the default keeps remotes connected (the fast path).
 */
DP_TEST(destroy_refused_while_requests_live)
{
    pub p;
    CHECK_EQ(pub_start(&p, "pub-busy", 0), 0);
    pub_alloc(&p, 0, 8 * MiB, 650);
    md_bytes m;
    int s[] = {0, -1};
    CHECK_EQ(pub_publish(&p, &m, "busy", s), 0);
    dp_direct_opts o = {0};
    o.backend = DP_DIRECT_BACKEND_UCX;
    dp_direct *t = NULL;
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_OK_D(dp_direct_create(&o, &t, &d), &d);
    o.reserved[3] = 1; /* a field this library does not know: refused */
    dp_direct *t2 = NULL;
    CHECK_ERR_D(dp_direct_create(&o, &t2, &d), DP_EINVAL, &d);
    CHECK_CONTAINS(d.msg, "reserved[3]");
    CHECK(t2 == NULL);

    /* Zeroed remote_cache_size is the default LRU: the second fetch hits. */
    fetch_check(t, &p, "busy", &m, s);
    fetch_check(t, &p, "busy", &m, s);
    dp_direct_stats st;
    dp_direct_get_stats(t, &st);
    CHECK_EQ_U64(st.remote_adds, 1);
    CHECK_EQ_U64(st.remote_hits, 1);
    CHECK_EQ_U64(st.remotes_cached, 1);
    for (size_t i = 0; i < DP_ARRAY_LEN(st.reserved); i++)
        CHECK_EQ_U64(st.reserved[i], 0);

    /* A request in flight (the worker pauses before reading its piece). */
    dp__direct_set_chunk_pause(t, 0.02);
    dp_direct_req *r = NULL;
    CHECK_OK_D(dp_direct_fetch(t, "busy", m.p, m.len, NULL, 0, &r, &d), &d);
    CHECK_ERR_D(dp_direct_destroy(t, &d), DP_EBUSY, &d);
    CHECK_CONTAINS(d.msg, "1 fetch request is still alive");
    CHECK_CONTAINS(d.msg, "busy");
    dp__direct_set_chunk_pause(t, 0);
    CHECK_OK_D(dp_direct_wait(r, 30, &d), &d);
    /* Ended but not destroyed: its buffer is the transport's, still refused. */
    CHECK(dp_direct_req_ended(r));
    CHECK_ERR(dp_direct_destroy(t, NULL), DP_EBUSY);
    void *addr = NULL;
    size_t len = 0;
    CHECK_OK(dp_direct_req_buffer(r, 0, &addr, &len));
    CHECK_EQ_U64(len, 8 * MiB);
    CHECK_EQ_U64(fnv(addr, len), pattern_sum(8 * MiB, 650));
    /* The transport still works: a second request, two alive. */
    dp_direct_req *r2 = NULL;
    CHECK_OK_D(dp_direct_fetch(t, "busy", m.p, m.len, NULL, 0, &r2, &d), &d);
    CHECK_ERR_D(dp_direct_destroy(t, &d), DP_EBUSY, &d);
    CHECK_CONTAINS(d.msg, "2 fetch requests are still alive");
    CHECK_OK_D(dp_direct_wait(r2, 30, &d), &d);
    dp_direct_req_destroy(r);
    CHECK_ERR(dp_direct_destroy(t, NULL), DP_EBUSY);
    dp_direct_req_destroy(r2);
    dp_direct_get_stats(t, &st);
    CHECK_EQ_U64(st.fetches, 4);
    CHECK_EQ_U64(st.fetch_ok, 4);
    CHECK_OK(dp_direct_destroy(t, &d));
    CHECK_OK(dp_direct_destroy(NULL, NULL));
    free(m.p);
    pub_stop(&p);
}

/*
 * A publisher restarted under the same name (a new process, whose metadata
 * version starts over) is noticed from its metadata: the first fetch from it
 * re-adds the remote and succeeds, instead of failing on the dead process's
 * connection first.
 */
DP_TEST(restarted_publisher_with_the_same_name)
{
    dp_direct *t = fetcher("fetch-rs", 4, 0, 1);
    int s[] = {0, -1};
    for (int round = 0; round < 2; round++) {
        pub p;
        CHECK_EQ(pub_start(&p, "pub-same", 0), 0);
        pub_alloc(&p, 0, 2 * MiB, 800 + (uint64_t)round);
        md_bytes m;
        CHECK_EQ(pub_publish(&p, &m, "o", s), 0);
        dp_direct_stats st0, st1;
        dp_direct_get_stats(t, &st0);
        fetch_check(t, &p, "o", &m, s);
        dp_direct_get_stats(t, &st1);
        if (round == 1)
            CHECK_EQ_U64(st1.remote_readds, st0.remote_readds + 1);
        CHECK_EQ_U64(st1.fetch_failed, 0);
        free(m.p);
        kill(p.pid, SIGKILL);
        waitpid(p.pid, NULL, 0);
        p.pid = 0;
        pub_stop(&p);
    }
    CHECK_OK(dp_direct_destroy(t, NULL));
}

typedef struct aborter {
    dp_direct *t;
    const char *id;
    double after_s;
} aborter;

static void *
aborter_main(void *arg)
{
    aborter *a = arg;
    dp__sleep_s(a->after_s);
    dp_direct_abort(a->t, a->id, NULL);
    return NULL;
}

/*
 * dp_direct_wait(-1) runs a fetch no worker has taken yet on the caller's
 * thread (no hand-off); a bounded wait never does. Made certain here: the one
 * worker is busy with a slow fetch (1 MiB chunks 30 ms apart), so small
 * fetches queue behind it. Every byte is checked, and an abort stops a fetch
 * whoever runs it.
 */
DP_TEST(waiting_for_ever_runs_the_fetch_in_the_caller)
{
    pub p;
    CHECK_EQ(pub_start(&p, "pub-w", 0), 0);
    pub_alloc(&p, 0, 4096, 900);
    pub_alloc(&p, 1, 24 * MiB, 901);
    md_bytes m, big;
    int s0[] = {0, -1}, s1[] = {1, -1};
    CHECK_EQ(pub_publish(&p, &m, "small", s0), 0);
    CHECK_EQ(pub_publish(&p, &big, "big", s1), 0);
    dp_direct *t = fetcher("fetch-w", 4, 1 * MiB, 1);
    dp__direct_set_chunk_pause(t, 0.03);
    dp_detail d;
    dp_detail_clear(&d);
    dp_direct_req *rb = NULL;
    CHECK_OK_D(dp_direct_fetch(t, "big", big.p, big.len, NULL, 0, &rb, &d), &d);
    uint64_t done = 0, total = 0;
    double t0 = dp_test_now();
    while (done == 0 && dp_test_now() - t0 < 10) { /* the worker has it */
        usleep(1000);
        dp_direct_req_progress(rb, &done, &total);
    }
    CHECK(done > 0 && done < total);
    dp_direct_stats st0, st1;
    dp_direct_get_stats(t, &st0);
    for (int i = 0; i < 10; i++)
        fetch_check(t, &p, "small", &m, s0); /* waits with -1: runs it here */
    dp_direct_get_stats(t, &st1);
    CHECK_EQ_U64(st1.fetch_by_waiter - st0.fetch_by_waiter, 10);
    dp_direct_req_progress(rb, &done, &total);
    CHECK(done < total); /* they did not wait for the slow one */
    /* A bounded wait leaves its fetch to the worker (after the slow one). */
    dp_direct_req *r = NULL;
    CHECK_OK_D(dp_direct_fetch(t, "small", m.p, m.len, NULL, 0, &r, &d), &d);
    CHECK_OK_D(dp_direct_wait(r, 30, &d), &d);
    void *a;
    size_t len;
    CHECK_OK(dp_direct_req_buffer(r, 0, &a, &len));
    CHECK_EQ_U64(fnv(a, len), pattern_sum(len, p.seed[0]));
    dp_direct_req_destroy(r);
    CHECK_OK_D(dp_direct_wait(rb, 30, &d), &d);
    CHECK_OK(dp_direct_req_buffer(rb, 0, &a, &len));
    CHECK_EQ_U64(fnv(a, len), pattern_sum(len, p.seed[1]));
    dp_direct_req_destroy(rb);
    dp_direct_stats st2;
    dp_direct_get_stats(t, &st2);
    CHECK_EQ_U64(st2.fetch_by_waiter, st1.fetch_by_waiter);
    /* An abort stops a fetch whoever runs it. */
    aborter ab = {t, "big", 0.1};
    pthread_t th;
    CHECK_EQ(pthread_create(&th, NULL, aborter_main, &ab), 0);
    CHECK_OK_D(dp_direct_fetch(t, "big", big.p, big.len, NULL, 0, &r, &d), &d);
    CHECK_ERR_D(dp_direct_wait(r, -1, &d), DP_ECANCELED, &d);
    CHECK_CONTAINS(d.msg, "aborted after");
    pthread_join(th, NULL);
    dp_direct_req_destroy(r);
    free(m.p);
    free(big.p);
    CHECK_OK(dp_direct_destroy(t, NULL));
    pub_stop(&p);
}

/*
 * Fetch buffers the transport allocated are reused once freed (about the
 * same size only), with every byte the new object's; the cache's bound holds;
 * off, nothing is kept.
 */
DP_TEST(fetch_buffers_are_reused)
{
    pub p;
    CHECK_EQ(pub_start(&p, "pub-fbuf", 0), 0);
    pub_alloc(&p, 0, 3 * MiB, 801);
    pub_alloc(&p, 1, 3 * MiB - 4096, 802); /* the same pages, other bytes */
    pub_alloc(&p, 2, 64 * 1024, 803);      /* far smaller: not given a 3 MiB buffer */
    pub_alloc(&p, 3, 5 * MiB, 804);        /* larger than the cache below */
    md_bytes m[4];
    for (int i = 0; i < 4; i++) {
        int s[] = {i, -1};
        char id[8];
        snprintf(id, sizeof id, "f%d", i);
        CHECK_EQ(pub_publish(&p, &m[i], id, s), 0);
    }
    for (int off = 0; off < 2; off++) {
        dp_direct *t = fetcher_with(off ? "fetch-fbuf-off" : "fetch-fbuf", 0, 0, 0,
                                    off ? DP_DIRECT_FETCH_CACHE_OFF : 4 * MiB);
        static const int s0[] = {0, -1}, s1[] = {1, -1}, s2[] = {2, -1}, s3[] = {3, -1};
        fetch_check(t, &p, "f0", &m[0], s0);
        fetch_check(t, &p, "f1", &m[1], s1); /* into f0's buffer */
        fetch_check(t, &p, "f2", &m[2], s2); /* a fresh one */
        fetch_check(t, &p, "f0", &m[0], s0); /* f1's (f0's) buffer again */
        fetch_check(t, &p, "f3", &m[3], s3); /* too large to keep */
        dp_direct_stats st;
        dp_direct_get_stats(t, &st);
        printf("  cache %s: reused %" PRIu64 ", cached %" PRIu64 " bytes\n",
               off ? "off" : "4 MiB", st.fetch_buf_reused, st.fetch_buf_cached);
        CHECK_EQ_U64(st.fetch_ok, 5);
        CHECK_EQ_U64(st.fetch_buf_reused, off ? 0 : 2);
        CHECK_EQ_U64(st.fetch_buf_cached, off ? 0 : 3 * MiB + 64 * 1024);
        CHECK_OK(dp_direct_destroy(t, NULL));
    }
    for (int i = 0; i < 4; i++)
        free(m[i].p);
    pub_stop(&p);
}

/*
 * A publisher on this host killed and not yet reaped (a zombie, as a killed
 * Ray actor is until its parent waits), its remote still cached from a first
 * fetch: UCX's keepalive takes the zombie for alive, so only the endpoint's
 * own check of the peer's process fails the READ; without it the fetch waits
 * out its whole deadline (10 s here). ETRANSFER, not ETIMEDOUT, is the
 * proof that the check saw it.
 */
DP_TEST(fetch_from_killed_unreaped_publisher_fails)
{
    pub p;
    CHECK_EQ(pub_start(&p, "pub-zombie", 0), 0);
    pub_alloc(&p, 0, 32 * MiB, 710);
    md_bytes m;
    int s[] = {0, -1};
    CHECK_EQ(pub_publish(&p, &m, "z", s), 0);
    dp_direct *t = fetcher("fetch-zombie", 4, 0, 0);
    dp_detail d;
    uint8_t *tg = aligned_alloc(4096, 32 * MiB);
    dp_direct_buf b = {tg, 32 * MiB};
    dp_direct_req *r = NULL;
    CHECK_OK_D(dp_direct_fetch(t, "z", m.p, m.len, &b, 1, &r, &d), &d);
    CHECK_OK_D(dp_direct_wait(r, -1, &d), &d);
    dp_direct_req_destroy(r);
    kill(p.pid, SIGKILL);
    usleep(100000); /* dead for sure; not reaped */
    double t0 = dp_test_now();
    CHECK_OK_D(dp_direct_fetch(t, "z", m.p, m.len, &b, 1, &r, &d), &d);
    int rc = dp_direct_wait(r, -1, &d);
    printf("  zombie publisher: wait -> %s after %.2f s: %s\n", dp_errname(rc),
           dp_test_now() - t0, d.msg);
    CHECK_ERR_D(rc, DP_ETRANSFER, &d);
    CHECK_CONTAINS(d.msg, "pub-zombie");
    CHECK_CONTAINS(d.msg, "ended");
    dp_direct_req_destroy(r);
    waitpid(p.pid, NULL, 0);
    p.pid = 0;
    if (!dp_direct_touches_unfinished(t, tg, 32 * MiB))
        free(tg);
    free(m.p);
    CHECK_OK(dp_direct_destroy(t, NULL));
    pub_stop(&p);
}

/*
 * A fetch into the transport's own buffer fails because its publisher was
 * killed: the buffer, which the failed READ may still touch, is retired
 * (charged to the graveyard), not kept for good; once UCX ends that READ
 * (the killed process reaped, its endpoint's keepalive fails it) a later
 * fetch takes the buffer back. Every fetch's bytes are checked.
 */
DP_TEST(retired_fetch_buffer_is_taken_back)
{
    pub a, b;
    CHECK_EQ(pub_start(&a, "pub-retire-a", 0), 0);
    CHECK_EQ(pub_start(&b, "pub-retire-b", 0), 0);
    pub_alloc(&a, 0, 8 * MiB, 901);
    pub_alloc(&b, 0, 8 * MiB, 902);
    md_bytes ma, mb;
    int s[] = {0, -1};
    CHECK_EQ(pub_publish(&a, &ma, "ra", s), 0);
    CHECK_EQ(pub_publish(&b, &mb, "rb", s), 0);
    dp_direct *t = fetcher("fetch-retire", 4, 0, 0);
    dp_detail d;
    fetch_check(t, &a, "ra", &ma, s); /* connected; its buffer cached */
    uint64_t bytes0 = dp__graveyard_bytes();
    kill(a.pid, SIGKILL);
    usleep(100000); /* a zombie: UCX takes it for alive */
    dp_direct_req *r = NULL;
    CHECK_OK_D(dp_direct_fetch(t, "ra", ma.p, ma.len, NULL, 0, &r, &d), &d);
    CHECK_ERR_D(dp_direct_wait(r, -1, &d), DP_ETRANSFER, &d);
    dp_direct_req_destroy(r);
    dp_direct_stats st;
    dp_direct_get_stats(t, &st);
    CHECK_EQ_U64(st.fetch_buf_retired, 1);
    CHECK(dp__graveyard_bytes() > bytes0);
    waitpid(a.pid, NULL, 0); /* reaped: now UCX can see it gone */
    a.pid = 0;
    double t0 = dp_test_now();
    do {
        fetch_check(t, &b, "rb", &mb, s); /* progresses the worker, sweeps */
        dp_direct_get_stats(t, &st);
        if (st.fetch_buf_reclaimed == 0)
            usleep(200000);
    } while (st.fetch_buf_reclaimed == 0 && dp_test_now() - t0 < 60);
    printf("  retired buffer taken back after %.2f s\n", dp_test_now() - t0);
    CHECK_EQ_U64(st.fetch_buf_reclaimed, 1);
    CHECK_EQ_U64(st.fetch_buf_retired, 0);
    CHECK_OK(dp_direct_destroy(t, NULL));
    free(ma.p);
    free(mb.p);
    pub_stop(&a);
    pub_stop(&b);
}

/*
 * Fetch md's object into tg (len bytes) and wait until its first bytes came
 * (at most 10 s): the request, its progress in *done of *total.
 */
static dp_direct_req *
fetch_under_way(dp_direct *t, const char *id, const md_bytes *m, uint8_t *tg, size_t len,
                uint64_t *done, uint64_t *total)
{
    dp_detail d;
    dp_direct_req *r = NULL;
    dp_direct_buf b = {tg, len};
    CHECK_OK_D(dp_direct_fetch(t, id, m->p, m->len, &b, 1, &r, &d), &d);
    *done = *total = 0;
    double t0 = dp_test_now();
    while (*done == 0 && dp_test_now() - t0 < 10) {
        usleep(1000);
        dp_direct_req_progress(r, done, total);
    }
    return r;
}

DP_TEST(publisher_dies_mid_fetch)
{
    pub p;
    CHECK_EQ(pub_start(&p, "pub-die", 0), 0);
    pub_alloc(&p, 0, 24 * MiB, 700);
    md_bytes m;
    int s[] = {0, -1};
    CHECK_EQ(pub_publish(&p, &m, "d", s), 0);
    dp_direct *t = fetcher("fetch-die", 4, 1 * MiB, 1);
    dp__direct_set_chunk_pause(t, 0.03);
    dp_detail d;
    uint64_t done, total;
    uint8_t *tg = aligned_alloc(4096, 24 * MiB);
    dp_direct_req *r = fetch_under_way(t, "d", &m, tg, 24 * MiB, &done, &total);
    CHECK(done > 0);
    kill(p.pid, SIGKILL);
    waitpid(p.pid, NULL, 0);
    p.pid = 0;
    double t0 = dp_test_now();
    int rc = dp_direct_wait(r, -1, &d);
    double took = dp_test_now() - t0;
    printf("  publisher killed: wait -> %s after %.2f s: %s\n", dp_errname(rc), took,
           d.msg);
    CHECK(rc == DP_ETRANSFER || rc == DP_ETIMEDOUT);
    CHECK_CONTAINS(d.msg, "pub-die");
    CHECK(took < 15);
    dp_direct_req_destroy(r);
    dp_direct_stats st;
    dp_direct_get_stats(t, &st);
    CHECK_EQ_U64(st.fetch_failed, 1);
    CHECK_EQ_U64(st.remotes_cached, 0); /* a failed remote is dropped */
    /* Memory a retained transfer may touch is never handed back. */
    if (!dp_direct_touches_unfinished(t, tg, 24 * MiB))
        free(tg);
    free(m.p);
    CHECK_OK(dp_direct_destroy(t, NULL));
    pub_stop(&p);
}

/*
 * An abort ends a READ that the publisher does not answer (stopped, over TCP,
 * whose RMA needs the publisher's progress) at once, with DP_ECANCELED, not at
 * the chunk's deadline; the publisher, continued, serves the next fetch.
 */
DP_TEST(abort_ends_a_read_the_publisher_does_not_answer)
{
    setenv("UCX_TLS", "tcp", 1); /* the publisher and the fetcher's endpoint */
    pub p;
    CHECK_EQ(pub_start(&p, "pub-stop", 0), 0);
    pub_alloc(&p, 0, 32 * MiB, 701);
    md_bytes m;
    int s[] = {0, -1};
    CHECK_EQ(pub_publish(&p, &m, "st", s), 0);
    dp_direct *t = fetcher("fetch-stop", 4, 4 * MiB, 1); /* chunks of 4 MiB, 10 s each */
    unsetenv("UCX_TLS");
    dp__direct_set_chunk_pause(t, 0.02);
    dp_detail d;
    uint64_t done, total;
    uint8_t *tg = aligned_alloc(4096, 32 * MiB);
    dp_direct_req *r = fetch_under_way(t, "st", &m, tg, 32 * MiB, &done, &total);
    CHECK(done > 0 && done < total);
    kill(p.pid, SIGSTOP);
    usleep(300 * 1000); /* the next chunk's READ is posted and gets no answer */
    dp_direct_req_progress(r, &done, &total);
    CHECK(done < total);
    CHECK_OK(dp_direct_abort(t, "st", &d));
    double t0 = dp_test_now();
    int rc = dp_direct_wait(r, -1, &d);
    printf("  publisher stopped, fetch aborted: wait -> %s after %.3f s: %s\n",
           dp_errname(rc), dp_test_now() - t0, d.msg);
    CHECK_EQ(rc, DP_ECANCELED);
    CHECK_CONTAINS(d.msg, "during a READ from pub-stop"); /* not at a chunk's end */
    dp_direct_req_destroy(r);
    kill(p.pid, SIGCONT);
    fetch_check(t, &p, "st", &m, s);
    dp_direct_stats st;
    dp_direct_get_stats(t, &st);
    CHECK_EQ_U64(st.fetch_aborted, 1);
    CHECK_EQ_U64(st.fetch_ok, 1);
    if (!dp_direct_touches_unfinished(t, tg, 32 * MiB))
        free(tg);
    free(m.p);
    CHECK_OK(dp_direct_destroy(t, NULL));
    pub_stop(&p);
}

/* ---- many caller threads at once ---- */

typedef struct hammer {
    dp_direct *t;
    pub *p;
    md_bytes *md;
    int n_obj;
    uint64_t seed;
    int ok, aborted, bad;
} hammer;

static void *
hammer_main(void *arg)
{
    hammer *h = arg;
    uint64_t rs = h->seed;
    for (int k = 0; k < 15; k++) {
        int i = (int)(dp_test_rand(&rs) % (uint64_t)h->n_obj);
        char id[16];
        snprintf(id, sizeof id, "h%d", i);
        dp_detail d;
        dp_detail_clear(&d);
        dp_direct_req *r = NULL;
        int rc = dp_direct_fetch(h->t, id, h->md[i].p, h->md[i].len, NULL, 0, &r, &d);
        if (rc == DP_OK)
            rc = dp_direct_wait(r, -1, &d);
        if (rc == DP_OK) {
            void *a;
            size_t len;
            if (dp_direct_req_buffer(r, 0, &a, &len) != DP_OK ||
                fnv(a, len) != pattern_sum(h->p->len[i], h->p->seed[i]))
                h->bad++;
            else
                h->ok++;
        } else if (rc == DP_ECANCELED) {
            h->aborted++;
        } else {
            fprintf(stderr, "  hammer: %s: %s\n", dp_errname(rc), d.msg);
            h->bad++;
        }
        dp_direct_req_destroy(r);
    }
    return NULL;
}

DP_TEST(threads_fetch_abort_and_republish_at_once)
{
    pub p;
    CHECK_EQ(pub_start(&p, "pub-h", 0), 0);
    enum { NOBJ = 6, NT = 3 };
    md_bytes md[NOBJ];
    for (int i = 0; i < NOBJ; i++) {
        pub_alloc(&p, i, 64 * KiB + (uint64_t)i * 300 * KiB, 900 + (uint64_t)i);
        int s[] = {i, -1};
        char id[16];
        snprintf(id, sizeof id, "h%d", i);
        CHECK_EQ(pub_publish(&p, &md[i], id, s), 0);
    }
    pub_alloc(&p, 10, 128 * KiB, 990);
    dp_direct *t = fetcher("fetch-h", 1, 64 * KiB, 3);
    hammer hs[NT];
    pthread_t th[NT];
    uint64_t seed = dp_test_seed();
    for (int i = 0; i < NT; i++) {
        hs[i] = (hammer){t, &p, md, NOBJ, seed + (uint64_t)i, 0, 0, 0};
        CHECK_EQ(pthread_create(&th[i], NULL, hammer_main, &hs[i]), 0);
    }
    /* Meanwhile: aborts, and an object published and freed again (version bumps). */
    dp_detail d;
    int s10[] = {10, -1};
    for (int k = 0; k < 6; k++) {
        char id[16];
        snprintf(id, sizeof id, "h%d", k % NOBJ);
        CHECK_OK(dp_direct_abort(t, id, &d));
        md_bytes mx;
        CHECK_EQ(pub_publish(&p, &mx, "x", s10), 0);
        fetch_check(t, &p, "x", &mx, s10);
        CHECK_EQ(pub_cmd(&p, NULL, NULL, "free x"), 0);
        free(mx.p);
        usleep(20000);
    }
    int ok = 0, ab = 0;
    for (int i = 0; i < NT; i++) {
        pthread_join(th[i], NULL);
        CHECK_EQ(hs[i].bad, 0);
        ok += hs[i].ok;
        ab += hs[i].aborted;
    }
    CHECK_EQ(ok + ab, NT * 15);
    dp_direct_stats st;
    dp_direct_get_stats(t, &st);
    CHECK(st.remote_readds >= 1);
    CHECK(st.remotes_cached <= 1);
    /* Abort marks nobody used up still fail one later fetch each: use them up. */
    int marks = 0;
    for (int i = 0; i < NOBJ; i++) {
        char id[16];
        snprintf(id, sizeof id, "h%d", i);
        int s[] = {i, -1};
        dp_direct_req *r = NULL;
        int rc = dp_direct_fetch(t, id, md[i].p, md[i].len, NULL, 0, &r, &d);
        if (rc == DP_OK) {
            CHECK_OK_D(dp_direct_wait(r, -1, &d), &d);
            dp_direct_req_destroy(r);
        } else {
            CHECK_ERR_D(rc, DP_ECANCELED, &d);
            marks++;
        }
        fetch_check(t, &p, id, &md[i], s);
        free(md[i].p);
    }
    printf("  %d fetched and checked, %d aborted, %d abort marks left\n", ok, ab, marks);
    /* Fetches ran and were checked while aborts and republishes went on, and the
     * aborts took effect (a fetch canceled, or a mark a later fetch used). */
    CHECK_GE(ok, 1);
    CHECK_GE(ab + marks, 1);
    CHECK_OK(dp_direct_destroy(t, NULL));
    pub_stop(&p);
}
