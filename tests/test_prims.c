/*
 * Tests for the shared primitives of src/common: little-endian loads and
 * stores (le.h), full reads and writes (fileio.h), the intrusive list
 * (list.h), sets of ranges (ranges.h), the id rule and the memlock text
 * (common.h). The list and the range sets are also checked against simple
 * models over random operations (seeded: DP_TEST_SEED replays).
 */
#include "dp_test.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/common.h"
#include "common/fileio.h"
#include "common/le.h"
#include "common/list.h"
#include "common/ranges.h"

/* ---- le.h ---- */

DP_TEST(le_loads_and_stores_at_any_alignment)
{
    uint8_t buf[32];
    for (size_t at = 0; at < 8; at++) {
        memset(buf, 0xee, sizeof buf);
        dp__le16_store(buf + at, 0x0102);
        CHECK(buf[at] == 0x02 && buf[at + 1] == 0x01 && buf[at + 2] == 0xee);
        CHECK_EQ(dp__le16_load(buf + at), 0x0102);
        dp__le32_store(buf + at, 0x01020304u);
        CHECK(buf[at] == 0x04 && buf[at + 3] == 0x01 && buf[at + 4] == 0xee);
        CHECK_EQ_U64(dp__le32_load(buf + at), 0x01020304u);
        dp__le64_store(buf + at, 0x0102030405060708ull);
        static const uint8_t want[8] = {8, 7, 6, 5, 4, 3, 2, 1};
        CHECK(memcmp(buf + at, want, 8) == 0 && buf[at + 8] == 0xee);
        CHECK_EQ_U64(dp__le64_load(buf + at), 0x0102030405060708ull);
    }
    /* Byte by byte, as the formats document them. */
    const uint8_t b[8] = {0xff, 0x00, 0x80, 0x7f, 0x01, 0x02, 0x03, 0xfe};
    CHECK_EQ_U64(dp__le32_load(b), 0x7f8000ffu);
    CHECK_EQ_U64(dp__le64_load(b), 0xfe0302017f8000ffull);
}

DP_TEST(le_round_trips_random_values)
{
    uint64_t st = dp_test_seed();
    uint8_t buf[16];
    int n = 0;
    for (; n < 10000; n++) {
        uint64_t v = dp_test_rand(&st);
        size_t at = (size_t)(v % 8);
        dp__le64_store(buf + at, v);
        CHECK_EQ_U64(dp__le64_load(buf + at), v);
        for (int i = 0; i < 8; i++)
            CHECK_EQ(buf[at + i], (uint8_t)(v >> (8 * i)));
        dp__le32_store(buf + at, (uint32_t)v);
        CHECK_EQ_U64(dp__le32_load(buf + at), (uint32_t)v);
        dp__le16_store(buf + at, (uint16_t)v);
        CHECK_EQ(dp__le16_load(buf + at), (uint16_t)v);
    }
    CHECK_EQ(n, 10000);
}

/* ---- fileio.h ---- */

/* A temporary file, unlinked at once; its path goes to path. */
static int
tmp_file(char path[64])
{
    snprintf(path, 64, "/tmp/dp-test-prims-XXXXXX");
    int fd = mkstemp(path);
    if (fd >= 0)
        unlink(path);
    return fd;
}

DP_TEST(fileio_positional_round_trip)
{
    char path[64];
    int fd = tmp_file(path);
    CHECK(fd >= 0);
    uint8_t w[100000], r[100000];
    for (size_t i = 0; i < sizeof w; i++)
        w[i] = (uint8_t)(i * 7 + 3);
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_OK_D(dp__pwrite_full(fd, w, sizeof w, 4096, "the file", &d), &d);
    /* The positional calls leave the file's position alone. */
    CHECK_EQ((long)lseek(fd, 0, SEEK_CUR), 0);
    CHECK_OK_D(dp__pread_full(fd, r, sizeof r, 4096, NULL, "the file", &d), &d);
    CHECK(memcmp(w, r, sizeof w) == 0);
    /* The hole before is zeros. */
    CHECK_OK_D(dp__pread_full(fd, r, 4096, 0, NULL, "the file", &d), &d);
    for (size_t i = 0; i < 4096; i++)
        CHECK_EQ(r[i], 0);
    close(fd);
}

DP_TEST(fileio_end_of_file_short_or_truncated)
{
    char path[64];
    int fd = tmp_file(path);
    CHECK(fd >= 0);
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_OK_D(dp__pwrite_full(fd, "0123456789", 10, 0, "f", &d), &d);
    char buf[32];
    size_t got = 99;
    /* With got: the read stops at the end and says how far it got. */
    CHECK_OK_D(dp__pread_full(fd, buf, sizeof buf, 4, &got, "f", &d), &d);
    CHECK_EQ(got, 6);
    CHECK(memcmp(buf, "456789", 6) == 0);
    CHECK_OK_D(dp__pread_full(fd, buf, 4, 20, &got, "f", &d), &d);
    CHECK_EQ(got, 0);
    /* Without: DP_ECORRUPT naming the file and where it ends. */
    CHECK_ERR_D(dp__pread_full(fd, buf, 8, 6, NULL, "shard x", &d), DP_ECORRUPT, &d);
    CHECK_STR(d.msg, "shard x: truncated: ends at offset 10");
    /* Sequential reads count from pos. */
    CHECK_OK(dp__read_full(fd, buf, 4, 0, &got, "f", &d));
    CHECK_EQ(got, 4);
    dp_detail_clear(&d);
    CHECK_ERR_D(dp__read_full(fd, buf, 10, 4, NULL, "stdin", &d), DP_ECORRUPT, &d);
    CHECK_STR(d.msg, "stdin: truncated: ends at offset 10");
    /* n == 0 reads nothing. */
    CHECK_OK(dp__pread_full(fd, buf, 0, 0, &got, "f", &d));
    CHECK_EQ(got, 0);
    close(fd);
}

DP_TEST(fileio_errors_name_file_and_offset)
{
    int p[2];
    CHECK(pipe(p) == 0);
    dp_detail d;
    char buf[8] = "abcdefg";
    /* Writing the read end, reading the write end: EBADF, as DP_ESYS. */
    dp_detail_clear(&d);
    CHECK_ERR_D(dp__write_full(p[0], buf, 8, 100, "the pipe", &d), DP_ESYS, &d);
    CHECK_EQ(d.sys_errno, EBADF);
    CHECK_CONTAINS(d.msg, "writing the pipe at offset 100: ");
    dp_detail_clear(&d);
    CHECK_ERR_D(dp__read_full(p[1], buf, 8, 7, NULL, "the pipe", &d), DP_ESYS, &d);
    CHECK_CONTAINS(d.msg, "reading the pipe at offset 7: ");
    /* A pipe cannot be read at an offset. */
    dp_detail_clear(&d);
    CHECK_ERR_D(dp__pread_full(p[0], buf, 8, 5, NULL, "the pipe", &d), DP_ESYS, &d);
    CHECK_EQ(d.sys_errno, ESPIPE);
    CHECK_CONTAINS(d.msg, "reading the pipe at offset 5: ");
    dp_detail_clear(&d);
    CHECK_ERR_D(dp__pwrite_full(p[1], buf, 8, 9, "the pipe", &d), DP_ESYS, &d);
    CHECK_CONTAINS(d.msg, "writing the pipe at offset 9: ");
    close(p[0]);
    close(p[1]);
}

static volatile sig_atomic_t alarms;

static void
on_alarm(int sig)
{
    (void)sig;
    alarms++;
}

/* SIGALRM every 2 ms, without SA_RESTART: blocked reads and writes see EINTR. */
static void
interrupt_often(bool on)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on ? on_alarm : SIG_DFL;
    sigaction(SIGALRM, &sa, NULL);
    struct itimerval it = {{0, on ? 2000 : 0}, {0, on ? 2000 : 0}};
    setitimer(ITIMER_REAL, &it, NULL);
}

/*
 * Through a pipe whose other end moves the bytes in small pieces with pauses,
 * under a stream of signals: short transfers and EINTR are retried until
 * every byte moved. Both directions.
 */
DP_TEST(fileio_pipe_short_transfers_and_eintr)
{
    enum { N = 1 << 20, PIECE = 4093 };
    uint8_t *src = malloc(N), *dst = malloc(N);
    CHECK(src != NULL && dst != NULL);
    for (size_t i = 0; i < N; i++)
        src[i] = (uint8_t)(i ^ (i >> 9));

    /* Read: a child writes in pieces. */
    int p[2];
    CHECK(pipe(p) == 0);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        close(p[0]);
        for (size_t off = 0; off < N; off += PIECE) {
            size_t n = DP_MIN((size_t)PIECE, N - off);
            if (write(p[1], src + off, n) != (ssize_t)n)
                _exit(1);
            if (off % (64 * PIECE) == 0)
                usleep(3000);
        }
        _exit(0);
    }
    close(p[1]);
    interrupt_often(true);
    dp_detail d;
    dp_detail_clear(&d);
    size_t got = 0;
    int rc = dp__read_full(p[0], dst, N, 0, &got, "pipe", &d);
    interrupt_often(false);
    int st = 0;
    waitpid(pid, &st, 0);
    close(p[0]);
    CHECK_OK_D(rc, &d);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    CHECK_EQ(got, (size_t)N);
    CHECK(memcmp(src, dst, N) == 0);
    sig_atomic_t read_alarms = alarms;
    CHECKF(read_alarms > 0, "no signal arrived during the read");

    /* Write: a child reads in pieces, slowly, and sends back what it read. */
    int q[2], back[2];
    CHECK(pipe(q) == 0 && pipe(back) == 0);
    pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        close(q[1]);
        close(back[0]);
        uint8_t piece[PIECE];
        for (size_t total = 0;;) {
            ssize_t r = read(q[0], piece, sizeof piece);
            if (r <= 0)
                break;
            if (write(back[1], piece, (size_t)r) != r)
                _exit(1);
            total += (size_t)r;
            if (total % (32 * PIECE) < (size_t)r)
                usleep(3000);
        }
        _exit(0);
    }
    close(q[0]);
    close(back[1]);
    /* What comes back is read by one more child (a pipe holds only 64 KiB). */
    pid_t col = fork();
    CHECK(col >= 0);
    if (col == 0) {
        close(q[1]);
        size_t n = 0;
        int rrc = dp__read_full(back[0], dst, N, 0, &n, "back", NULL);
        _exit(rrc == DP_OK && n == N && memcmp(src, dst, N) == 0 ? 0 : 1);
    }
    close(back[0]);
    alarms = 0;
    interrupt_often(true);
    rc = dp__write_full(q[1], src, N, 0, "pipe", &d);
    interrupt_often(false);
    close(q[1]);
    int st2 = 0, st3 = 0;
    waitpid(pid, &st2, 0);
    waitpid(col, &st3, 0);
    CHECK_OK_D(rc, &d);
    CHECK(WIFEXITED(st2) && WEXITSTATUS(st2) == 0);
    CHECKF(WIFEXITED(st3) && WEXITSTATUS(st3) == 0, "the bytes that came back differ");
    CHECKF(alarms > 0, "no signal arrived during the write");
    free(src);
    free(dst);
}

/* ---- list.h ---- */

typedef struct item {
    int v;
    dp__list_node link;
} item;

/* l's values in order, checking the links both ways; returns the count. */
static size_t
list_values(const dp__list *l, int *out, size_t cap)
{
    size_t n = 0;
    const item *prev = NULL;
    for (const item *it = DP_LIST_FIRST(l, item, link); it != NULL;
         prev = it, it = DP_LIST_NEXT(it, item, link)) {
        if (DP_LIST_PREV(it, item, link) != prev)
            return SIZE_MAX;
        if (n < cap)
            out[n] = it->v;
        n++;
    }
    if (DP_LIST_LAST(l, item, link) != prev)
        return SIZE_MAX;
    return n;
}

DP_TEST(list_basic_operations)
{
    dp__list l = {0}; /* a zeroed list is empty */
    CHECK(dp__list_empty(&l));
    CHECK(DP_LIST_FIRST(&l, item, link) == NULL && DP_LIST_LAST(&l, item, link) == NULL);
    item a = {.v = 1}, b = {.v = 2}, c = {.v = 3}, e = {.v = 5};
    CHECK(!dp__list_contains(&l, &a.link));
    dp__list_insert_tail(&l, &b.link);
    dp__list_insert_head(&l, &a.link);
    dp__list_insert_tail(&l, &c.link);
    dp__list_insert_after(&l, &c.link, &e.link); /* after the last: the new last */
    int v[8];
    CHECK_EQ(list_values(&l, v, 8), 4);
    CHECK(v[0] == 1 && v[1] == 2 && v[2] == 3 && v[3] == 5);
    CHECK(dp__list_contains(&l, &a.link) && dp__list_contains(&l, &e.link));
    item m = {.v = 4};
    dp__list_insert_after(&l, &c.link, &m.link);
    CHECK_EQ(list_values(&l, v, 8), 5);
    CHECK(v[3] == 4 && v[4] == 5);
    /* Remove the middle, the head and the tail; twice is harmless. */
    dp__list_remove(&l, &c.link);
    dp__list_remove(&l, &c.link);
    dp__list_remove(&l, &a.link);
    dp__list_remove(&l, &e.link);
    CHECK(!dp__list_contains(&l, &c.link));
    CHECK(c.link.next == NULL && c.link.prev == NULL);
    CHECK_EQ(list_values(&l, v, 8), 2);
    CHECK(v[0] == 2 && v[1] == 4);
    /* A node first on another list is not on this one. */
    dp__list other = {0};
    dp__list_insert_tail(&other, &a.link);
    CHECK(!dp__list_contains(&l, &a.link));
    dp__list_remove(&l, &a.link); /* no-op */
    CHECK_EQ(list_values(&other, v, 8), 1);
    /* Move everything of other onto l's tail, in O(1). */
    dp__list_insert_tail(&other, &c.link);
    dp__list_move_tail(&l, &other);
    CHECK(dp__list_empty(&other));
    CHECK_EQ(list_values(&l, v, 8), 4);
    CHECK(v[0] == 2 && v[1] == 4 && v[2] == 1 && v[3] == 3);
    dp__list_move_tail(&other, &l); /* onto an empty list */
    CHECK(dp__list_empty(&l));
    CHECK_EQ(list_values(&other, v, 8), 4);
    dp__list_move_tail(&other, &l); /* an empty list moves nothing */
    CHECK_EQ(list_values(&other, v, 8), 4);
    /* Draining from the front while walking. */
    int drained = 0;
    for (item *it; (it = DP_LIST_FIRST(&other, item, link)) != NULL; drained++)
        dp__list_remove(&other, &it->link);
    CHECK_EQ(drained, 4);
    CHECK(dp__list_empty(&other));
    dp__list_init(&other);
    CHECK(dp__list_empty(&other));
}

/* Random inserts and removes against an array holding the same order. */
DP_TEST(list_model_random_operations)
{
    enum { N = 64, OPS = 20000 };
    uint64_t st = dp_test_seed();
    item items[N];
    for (int i = 0; i < N; i++)
        items[i] = (item){.v = i};
    dp__list l;
    dp__list_init(&l);
    int model[N], n = 0;
    int counts[4] = {0};
    for (int op = 0; op < OPS; op++) {
        int k = (int)(dp_test_rand(&st) % N);
        int pos = -1;
        for (int i = 0; i < n; i++)
            if (model[i] == k)
                pos = i;
        int what = (int)(dp_test_rand(&st) % 4);
        if (pos >= 0) {
            dp__list_remove(&l, &items[k].link);
            memmove(model + pos, model + pos + 1, (size_t)(n - pos - 1) * sizeof *model);
            n--;
            counts[3]++;
        } else if (what == 0 || n == 0) {
            dp__list_insert_head(&l, &items[k].link);
            memmove(model + 1, model, (size_t)n * sizeof *model);
            model[0] = k;
            n++;
            counts[0]++;
        } else if (what == 1) {
            dp__list_insert_tail(&l, &items[k].link);
            model[n++] = k;
            counts[1]++;
        } else {
            int at = (int)(dp_test_rand(&st) % (uint64_t)n);
            dp__list_insert_after(&l, &items[model[at]].link, &items[k].link);
            memmove(model + at + 2, model + at + 1, (size_t)(n - at - 1) * sizeof *model);
            model[at + 1] = k;
            n++;
            counts[2]++;
        }
        int v[N];
        size_t got = list_values(&l, v, N);
        CHECKF(got == (size_t)n, "op %d: list has %zu items, model %d", op, got, n);
        CHECK(memcmp(v, model, (size_t)n * sizeof *v) == 0);
        for (int i = 0; i < N; i++) {
            bool in = false;
            for (int j = 0; j < n; j++)
                in = in || model[j] == i;
            CHECK_EQ(dp__list_contains(&l, &items[i].link), in);
        }
    }
    for (int i = 0; i < 4; i++)
        CHECKF(counts[i] > OPS / 20, "operation %d ran only %d times", i, counts[i]);
}

/* ---- ranges.h ---- */

DP_TEST(ranges_add_find_overlap_remove)
{
    dp__ranges rs = {0};
    int tag[4];
    CHECK_OK(dp__ranges_add(&rs, 100, 50, &tag[0])); /* [100, 150) */
    CHECK_OK(dp__ranges_add(&rs, 200, 10, &tag[1])); /* [200, 210) */
    CHECK_OK(dp__ranges_add(&rs, 150, 50, &tag[2])); /* touching both: fine */
    CHECK_ERR(dp__ranges_add(&rs, 149, 2, NULL), DP_EEXIST);
    CHECK_ERR(dp__ranges_add(&rs, 209, 5, NULL), DP_EEXIST);
    CHECK_ERR(dp__ranges_add(&rs, 50, 300, NULL), DP_EEXIST); /* covers them all */
    CHECK_ERR(dp__ranges_add(&rs, 120, 1, NULL), DP_EEXIST);  /* inside one */
    CHECK_ERR(dp__ranges_add(&rs, 300, 0, NULL), DP_EINVAL);
    CHECK_ERR(dp__ranges_add(&rs, UINT64_MAX - 1, 3, NULL), DP_EINVAL);
    CHECK_OK(dp__ranges_add(&rs, UINT64_MAX - 10, 10, &tag[3])); /* up to 2^64 - 1 */
    CHECK_EQ(rs.n, 4);
    for (size_t i = 1; i < rs.n; i++)
        CHECK(rs.e[i - 1].base + rs.e[i - 1].len <= rs.e[i].base);

    /* find: the range holding all of [addr, addr+n). */
    CHECK(dp__ranges_find(&rs, 100, 50)->v == &tag[0]);
    CHECK(dp__ranges_find(&rs, 149, 1)->v == &tag[0]);
    CHECK(dp__ranges_find(&rs, 150, 1)->v == &tag[2]);
    CHECK(dp__ranges_find(&rs, 149, 2) == NULL); /* spans two ranges */
    CHECK(dp__ranges_find(&rs, 99, 2) == NULL);
    CHECK(dp__ranges_find(&rs, 205, 6) == NULL);
    CHECK(dp__ranges_find(&rs, 0, 1) == NULL);
    CHECK(dp__ranges_find(&rs, 300, 1) == NULL);
    CHECK(dp__ranges_find(&rs, 205, UINT64_MAX) == NULL);
    CHECK(dp__ranges_find(&rs, UINT64_MAX - 1, 1)->v == &tag[3]);
    /* n == 0: a range holding addr, or ending right at it. */
    CHECK(dp__ranges_find(&rs, 210, 0)->v == &tag[1]);
    CHECK(dp__ranges_find(&rs, 211, 0) == NULL);
    CHECK(dp__ranges_find(&rs, 150, 0)->v == &tag[2]);

    /* overlap: the lowest range sharing a byte. */
    CHECK(dp__ranges_overlap(&rs, 0, 101)->v == &tag[0]);
    CHECK(dp__ranges_overlap(&rs, 0, 100) == NULL);
    CHECK(dp__ranges_overlap(&rs, 140, 100)->v == &tag[0]);
    CHECK(dp__ranges_overlap(&rs, 150, 100)->v == &tag[2]);
    CHECK(dp__ranges_overlap(&rs, 210, 1000) == NULL);
    CHECK(dp__ranges_overlap(&rs, 120, 0) == NULL);
    CHECK(dp__ranges_overlap(&rs, 300, UINT64_MAX)->v == &tag[3]); /* end clamped */

    /* at and remove. */
    CHECK(dp__ranges_at(&rs, 150)->v == &tag[2]);
    CHECK(dp__ranges_at(&rs, 151) == NULL);
    dp__ranges_remove(&rs, dp__ranges_at(&rs, 150));
    CHECK_EQ(rs.n, 3);
    CHECK(dp__ranges_find(&rs, 160, 1) == NULL);
    CHECK(dp__ranges_find(&rs, 200, 10)->v == &tag[1]);
    CHECK_OK(dp__ranges_add(&rs, 160, 20, NULL)); /* the gap is free again */
    dp__ranges_clear(&rs);
    CHECK_EQ(rs.n, 0);
    CHECK(dp__ranges_find(&rs, 100, 1) == NULL);
    CHECK_OK(dp__ranges_reserve(&rs, 100));
    CHECK_GE(rs.cap, 100);
    dp__ranges_fini(&rs);
    CHECK(rs.e == NULL && rs.n == 0);
}

DP_TEST(ranges_merge_is_a_union)
{
    dp__ranges rs = {0};
    CHECK_OK(dp__ranges_merge(&rs, 10, 10)); /* [10, 20) */
    CHECK_OK(dp__ranges_merge(&rs, 30, 10)); /* [30, 40) */
    CHECK_OK(dp__ranges_merge(&rs, 50, 0));  /* nothing */
    CHECK_EQ(rs.n, 2);
    CHECK_OK(dp__ranges_merge(&rs, 20, 5)); /* touches [10, 20): one range */
    CHECK_EQ(rs.n, 2);
    CHECK(rs.e[0].base == 10 && rs.e[0].len == 15);
    CHECK_OK(dp__ranges_merge(&rs, 25, 5)); /* bridges both */
    CHECK_EQ(rs.n, 1);
    CHECK(rs.e[0].base == 10 && rs.e[0].len == 30);
    CHECK_OK(dp__ranges_merge(&rs, 0, 5));
    CHECK_OK(dp__ranges_merge(&rs, 100, 5));
    CHECK_EQ(rs.n, 3);
    CHECK_OK(dp__ranges_merge(&rs, 2, 200)); /* swallows all */
    CHECK_EQ(rs.n, 1);
    CHECK(rs.e[0].base == 0 && rs.e[0].len == 202);
    CHECK_OK(dp__ranges_merge(&rs, UINT64_MAX - 5, 100)); /* end clamped */
    CHECK_EQ(rs.n, 2);
    CHECK_EQ_U64(rs.e[1].base + rs.e[1].len, UINT64_MAX);
    CHECK(dp__ranges_overlap(&rs, UINT64_MAX - 1, 1) != NULL);
    CHECK(rs.e[0].v == NULL && rs.e[1].v == NULL);
    dp__ranges_fini(&rs);
}

/*
 * Random adds, removes and merges over a small address space, against a map
 * of which range owns each address; every find and overlap is compared with
 * a brute-force answer.
 */
DP_TEST(ranges_model_random_operations)
{
    enum { SPACE = 512, OPS = 4000 };
    uint64_t st = dp_test_seed();
    for (int merged = 0; merged < 2; merged++) {
        dp__ranges rs = {0};
        static int owner[SPACE]; /* 0: none, else the base + 1 of its range */
        memset(owner, 0, sizeof owner);
        int adds = 0, refused = 0, removes = 0, queries = 0;
        for (int op = 0; op < OPS; op++) {
            uint64_t base = dp_test_rand(&st) % SPACE;
            uint64_t len = 1 + dp_test_rand(&st) % 24;
            if (base + len > SPACE)
                len = SPACE - base;
            bool free_span = true;
            for (uint64_t a = base; a < base + len; a++)
                free_span = free_span && owner[a] == 0;
            if (merged) {
                /* Union: [base, base+len) and whatever it overlaps or touches. */
                CHECK_OK(dp__ranges_merge(&rs, base, len));
                uint64_t lo = base, hi = base + len;
                while (lo > 0 && owner[lo - 1] != 0)
                    lo--;
                while (hi < SPACE && owner[hi] != 0)
                    hi++;
                for (uint64_t a = lo; a < hi; a++)
                    owner[a] = (int)lo + 1;
                adds++;
            } else if (dp_test_rand(&st) % 3 == 0 && rs.n > 0) {
                dp__ranges_ent *e = &rs.e[dp_test_rand(&st) % rs.n];
                for (uint64_t a = e->base; a < e->base + e->len; a++)
                    owner[a] = 0;
                dp__ranges_remove(&rs, e);
                removes++;
            } else {
                int rc = dp__ranges_add(&rs, base, len, NULL);
                CHECK_EQ(rc, free_span ? DP_OK : DP_EEXIST);
                if (rc == DP_OK)
                    for (uint64_t a = base; a < base + len; a++)
                        owner[a] = (int)base + 1;
                adds += rc == DP_OK;
                refused += rc != DP_OK;
            }
            /* The set: sorted, disjoint, and (merged) never touching. */
            for (size_t i = 1; i < rs.n; i++) {
                uint64_t end = rs.e[i - 1].base + rs.e[i - 1].len;
                CHECK(merged ? end < rs.e[i].base : end <= rs.e[i].base);
            }
            /* A few queries against the brute-force answers. */
            for (int q = 0; q < 8; q++, queries++) {
                uint64_t a = dp_test_rand(&st) % SPACE, n = dp_test_rand(&st) % 16;
                if (a + n > SPACE)
                    n = SPACE - a;
                const dp__ranges_ent *f = dp__ranges_find(&rs, a, n);
                bool holds = n > 0 && owner[a] != 0;
                for (uint64_t x = a; holds && x < a + n; x++)
                    holds = owner[x] == owner[a];
                if (n > 0)
                    CHECK_EQ(f != NULL, holds);
                if (f != NULL)
                    CHECK(f->base <= a && a + n <= f->base + f->len);
                const dp__ranges_ent *o = dp__ranges_overlap(&rs, a, n);
                uint64_t first = SPACE;
                for (uint64_t x = a; x < a + n && first == SPACE; x++)
                    if (owner[x] != 0)
                        first = x;
                CHECK_EQ(o != NULL, first != SPACE);
                if (o != NULL)
                    CHECK_EQ_U64(o->base, (uint64_t)owner[first] - 1);
            }
        }
        CHECKF(adds > OPS / 10, "%d adds", adds);
        CHECKF(merged || (refused > 0 && removes > 0), "%d refused, %d removes", refused,
               removes);
        CHECK_GE(queries, OPS);
        dp__ranges_fini(&rs);
    }
}

/* ---- the id rule and the memlock text (common.h) ---- */

DP_TEST(id_rule)
{
    int allowed = 0;
    for (int c = 0; c < 256; c++) {
        char s[3] = {'a', (char)c, 'b'};
        bool want = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                    (c >= '0' && c <= '9') || c == '_' || c == '.' || c == ':' ||
                    c == '-';
        CHECKF(dp__id_valid(s, 3, DP_ID_MAX) == want, "byte 0x%02x", c);
        CHECK_EQ(dp__id_bad_byte(s, 3), want ? 3 : 1);
        allowed += want;
    }
    CHECK_EQ(allowed, 26 + 26 + 10 + 4);
    char id[DP_ID_MAX + 1];
    memset(id, 'x', sizeof id);
    CHECK(dp__id_valid(id, DP_ID_MAX, DP_ID_MAX));
    CHECK(!dp__id_valid(id, DP_ID_MAX + 1, DP_ID_MAX));
    CHECK(!dp__id_valid(id, 5, 4));
    CHECK(!dp__id_valid(id, 0, DP_ID_MAX));
    CHECK(!dp__id_valid(NULL, 0, DP_ID_MAX));
    CHECK(dp__id_valid("up-0123:a.b_c-D", 15, DP_ID_MAX));
    CHECK_EQ(dp__id_bad_byte("ab/c", 4), 2);
    CHECK_EQ(dp__id_bad_byte("", 0), 0);
}

DP_TEST(memlock_text)
{
    struct rlimit rl;
    CHECK(getrlimit(RLIMIT_MEMLOCK, &rl) == 0);
    char buf[32], want[32];
    dp__fmt_memlock(buf, sizeof buf);
    if (rl.rlim_cur == RLIM_INFINITY)
        CHECK_STR(buf, "unlimited");
    else
        CHECK_STR(buf, dp__fmt_size((uint64_t)rl.rlim_cur, want, sizeof want));
    /* Lowering the soft limit is always allowed (this test's own process). */
    struct rlimit low = {
        rl.rlim_max == RLIM_INFINITY || rl.rlim_max >= 65536 ? 65536 : rl.rlim_max,
        rl.rlim_max};
    CHECK(setrlimit(RLIMIT_MEMLOCK, &low) == 0);
    CHECK_STR(dp__fmt_memlock(buf, sizeof buf),
              dp__fmt_size((uint64_t)low.rlim_cur, want, sizeof want));
    if (rl.rlim_max == RLIM_INFINITY) {
        struct rlimit inf = {RLIM_INFINITY, RLIM_INFINITY};
        CHECK(setrlimit(RLIMIT_MEMLOCK, &inf) == 0);
        CHECK_STR(dp__fmt_memlock(buf, sizeof buf), "unlimited");
    }
}
