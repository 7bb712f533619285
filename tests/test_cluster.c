/*
 * Tests for src/cluster: locating, writing and reading cluster files,
 * and the errors for every kind of bad file (a FIFO, a device, a socket or a
 * directory where the file should be is refused without blocking).
 */
#include "dp_test.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "cluster/cluster.h"

static char dir[256];

static void
mkdir_tmp(void)
{
    snprintf(dir, sizeof dir, "/tmp/dp-test-cluster-XXXXXX");
    CHECK(mkdtemp(dir) != NULL);
}

static void
write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    fputs(text, f);
    fclose(f);
}

DP_TEST(save_then_load)
{
    mkdir_tmp();
    dp__cluster_unit us[3];
    memset(us, 0, sizeof us);
    for (int i = 0; i < 3; i++) {
        us[i].id = (uint32_t)i;
        snprintf(us[i].zmq, sizeof us[i].zmq, "tcp://127.0.0.1:%d", 40000 + i);
        snprintf(us[i].agent, sizeof us[i].agent, "unit-%d", i);
        us[i].pid = 100 + i;
        us[i].incarnation = i == 1 ? 0 : 0xfedcba9876543210ull + (uint64_t)i;
    }
    dp__cluster c = {3, us, "up-0123abcd"}, r;
    char path[512];
    dp_detail d;
    CHECK_OK_D(dp__cluster_locate(dir, path, sizeof path, &d), &d);
    CHECK_CONTAINS(path, "/cluster.json");
    CHECK_OK_D(dp__cluster_save(path, &c, &d), &d);
    CHECK_OK_D(dp__cluster_load(path, &r, &d), &d);
    CHECK_EQ(r.n_units, 3);
    for (int i = 0; i < 3; i++) {
        CHECK_EQ(r.units[i].id, i);
        CHECK_STR(r.units[i].zmq, us[i].zmq);
        CHECK_STR(r.units[i].agent, us[i].agent);
        CHECK_EQ(r.units[i].pid, 100 + i);
        CHECK_EQ_U64(r.units[i].incarnation, us[i].incarnation); /* all 64 bits */
    }
    CHECK_STR(r.cluster_id, "up-0123abcd");
    dp__cluster_fini(&r);
    /* DP_CLUSTER names the directory when no path is given. */
    setenv("DP_CLUSTER", dir, 1);
    char p2[512];
    CHECK_OK(dp__cluster_locate(NULL, p2, sizeof p2, &d));
    CHECK_STR(p2, path);
    unsetenv("DP_CLUSTER");
    unlink(path);
    rmdir(dir);
}

DP_TEST(missing_file_says_how_to_start_one)
{
    dp__cluster r;
    dp_detail d;
    CHECK_ERR_D(dp__cluster_load("/nonexistent/dp/cluster.json", &r, &d), DP_ENOTFOUND,
                &d);
    CHECK_CONTAINS(d.msg, "dataplane up");
}

DP_TEST(bad_files_are_refused_with_the_field)
{
    mkdir_tmp();
    char path[512];
    snprintf(path, sizeof path, "%s/cluster.json", dir);
    struct {
        const char *text;
        const char *want;
    } cases[] = {
        {"not json", "not valid JSON"},
        {"{\"version\": 2, \"units\": []}", "version"},
        {"{\"version\": 1, \"units\": []}", "units"},
        {"{\"version\": 1, \"units\": [5]}", "units[0] must be an object"},
        {"{\"version\": 1, \"units\": [{\"id\": 1, \"zmq\": \"tcp://a:1\", \"agent\": "
         "\"u\"}]}",
         "id order"},
        {"{\"version\": 1, \"units\": [{\"id\": 0, \"zmq\": \"udp://a:1\", \"agent\": "
         "\"u\"}]}",
         "not tcp://host:port"},
        {"{\"version\": 1, \"units\": [{\"id\": 0, \"zmq\": 7, \"agent\": \"u\"}]}",
         "units[0].zmq must be a string"},
        {"{\"version\": 1, \"units\": [{\"id\": 0.5, \"zmq\": \"tcp://a:1\", \"agent\": "
         "\"u\"}]}",
         "units[0].id must be an integer"},
        {"{\"version\": 1, \"units\": [{\"id\": 0, \"zmq\": \"tcp://a:1\", \"agent\": "
         "\"\"}]}",
         "units[0].agent must be 1.."},
        {"{\"version\": 1, \"units\": [{\"id\": 0, \"zmq\": \"tcp://a:1\", \"agent\": "
         "\"u\\n\"}]}",
         "control character"},
        {"{\"version\": 1, \"units\": [{\"id\": 0, \"zmq\": \"tcp://a:1\", \"agent\": "
         "\"u\", \"incarnation\": 12}]}",
         "units[0].incarnation must be 16 lowercase hex digits"},
        {"{\"version\": 1, \"cluster\": \"has space\", \"units\": [{\"id\": 0, \"zmq\": "
         "\"tcp://a:1\", \"agent\": \"u\"}]}",
         "\"cluster\" must be 1..64 bytes"},
        {"{\"version\": 1, \"units\": [{\"id\": 0, \"zmq\": \"tcp://a:1\", \"agent\": "
         "\"u\", \"incarnation\": \"12345678abcdefgh\"}]}",
         "units[0].incarnation must be 16 lowercase hex digits"},
    };
    for (size_t i = 0; i < DP_ARRAY_LEN(cases); i++) {
        write_text(path, cases[i].text);
        dp__cluster r;
        dp_detail d;
        CHECK_ERR_D(dp__cluster_load(path, &r, &d), DP_EPROTO, &d);
        CHECK_CONTAINS(d.msg, cases[i].want);
        CHECK_CONTAINS(d.msg, path);
        CHECK(r.units == NULL);
    }
    unlink(path);
    rmdir(dir);
}

/* Called if a load blocks: the test would otherwise hang until CTest's timeout. */
static void
on_alarm(int sig)
{
    (void)sig;
    static const char msg[] = "  dp__cluster_load blocked for 10 s\n";
    ssize_t w = write(2, msg, sizeof msg - 1);
    (void)w;
    _exit(1);
}

/*
 * A FIFO, a directory, a device and a socket where the cluster file should be
 * are refused at once, saying what the path is; nothing blocks.
 */
DP_TEST(special_files_are_refused_without_blocking)
{
    mkdir_tmp();
    char fifo[512], sub[512], sock[512], dirfile[512];
    snprintf(fifo, sizeof fifo, "%s/fifo.json", dir);
    snprintf(sub, sizeof sub, "%s/sub", dir);
    snprintf(dirfile, sizeof dirfile, "%s/cluster.json", dir);
    snprintf(sock, sizeof sock, "%s/sock", dir);
    CHECK(mkfifo(fifo, 0600) == 0);
    CHECK(mkdir(sub, 0700) == 0);
    CHECK(mkdir(dirfile, 0700) == 0); /* a directory named cluster.json */
    int sfd = socket(AF_UNIX, SOCK_STREAM, 0);
    CHECK(sfd >= 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    CHECK(strlen(sock) < sizeof sa.sun_path);
    memcpy(sa.sun_path, sock, strlen(sock) + 1);
    CHECK(bind(sfd, (struct sockaddr *)&sa, sizeof sa) == 0);
    struct {
        const char *path, *want;
    } cases[] = {
        {fifo, "is a FIFO"},         {sub, "is a directory"},
        {dirfile, "is a directory"}, {"/dev/null", "is a character device"},
        {sock, "is a socket"},
    };
    signal(SIGALRM, on_alarm);
    int loaded = 0;
    for (size_t i = 0; i < DP_ARRAY_LEN(cases); i++) {
        dp__cluster r;
        dp_detail d;
        alarm(10);
        int rc = dp__cluster_load(cases[i].path, &r, &d);
        alarm(0);
        CHECK_ERR_D(rc, DP_EINVAL, &d);
        CHECK_CONTAINS(d.msg, cases[i].path);
        CHECK_CONTAINS(d.msg, cases[i].want);
        CHECK_CONTAINS(d.msg, "not a regular file");
        CHECK(r.units == NULL);
        loaded++;
    }
    CHECK_EQ(loaded, DP_ARRAY_LEN(cases));
    /* A directory without cluster.json: locate names the file, load says it is missing.
     */
    char path[512];
    dp_detail d;
    CHECK_OK_D(dp__cluster_locate(sub, path, sizeof path, &d), &d);
    dp__cluster r;
    CHECK_ERR_D(dp__cluster_load(path, &r, &d), DP_ENOTFOUND, &d);
    CHECK_CONTAINS(d.msg, "no cluster file");
    CHECK_CONTAINS(d.msg, sub);
    close(sfd);
    unlink(sock);
    unlink(fifo);
    rmdir(sub);
    rmdir(dirfile);
    rmdir(dir);
}

/* The size bound stays: a file over 4 MiB is refused before it is read. */
DP_TEST(oversized_file_is_refused)
{
    mkdir_tmp();
    char path[512];
    snprintf(path, sizeof path, "%s/cluster.json", dir);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    CHECK(fd >= 0);
    CHECK(ftruncate(fd, (5 << 20)) == 0);
    close(fd);
    dp__cluster r;
    dp_detail d;
    CHECK_ERR_D(dp__cluster_load(path, &r, &d), DP_EPROTO, &d);
    CHECK_CONTAINS(d.msg, path);
    CHECK_CONTAINS(d.msg, "at most");
    unlink(path);
    rmdir(dir);
}
