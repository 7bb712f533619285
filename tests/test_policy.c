/*
 * Tests for src/xfer/policy.c, the RDMA-only transport policy. One table row
 * per rule and spelling (aliases, :aux, '\', case, spaces, empty items, '^'
 * lists, all, unset and empty values, UCX_NET_DEVICES forms); each row says
 * what the verdict must be and which text the description or reason must
 * contain, usually the offending item in quotes. Then the env-array API, the
 * detail and truncation contracts, hostile inputs, and a randomised property
 * test over mixed lists.
 */
#include "dp_test.h"

#include "common/common.h"
#include "xfer/policy.h"

#define OK DP_OK
#define NO DP_EPOLICY
#define UNSET NULL

struct row {
    const char *tls; /* UNSET = variable not set */
    const char *net;
    int want;
    const char *has1; /* must appear in the description / reason */
    const char *has2; /* optional second one */
};

static const struct row rows[] = {
    /* UCX_TLS unset or empty: UCX would choose, and fall back to TCP. */
    {UNSET, UNSET, NO, "UCX_TLS is unset", "UCX_TLS=rc,sm,self"},
    {UNSET, "mlx5_0:1", NO, "UCX_TLS is unset", "fall back to TCP"},
    {"", UNSET, NO, "names no transport", "UCX_TLS=rc,sm,self"},
    {",", UNSET, NO, "names no transport", NULL},
    {",,,", UNSET, NO, "names no transport", NULL},

    /* Explicit lists with RDMA and same-host helpers. */
    {"rc", UNSET, OK, "UCX_TLS=rc: RDMA (rc); UCX_NET_DEVICES unset", NULL},
    {"rc,sm,self", UNSET, OK, "RDMA (rc) + same-host (sm, self)", NULL},
    {"rc_x,sm,self", "mlx5_0:1", OK,
     "UCX_TLS=rc_x,sm,self: RDMA (rc_x) + same-host (sm, self); "
     "UCX_NET_DEVICES=mlx5_0:1",
     NULL},
    {"ib,shm,self", UNSET, OK, "RDMA (ib) + same-host (shm, self)", NULL},
    {"dc_x,ud_x,mm,cma", UNSET, OK, "RDMA (dc_x, ud_x) + same-host (mm, cma)", NULL},
    {"rc_verbs,posix,sysv,knem,xpmem", UNSET, OK, "same-host (posix, sysv, knem, xpmem)",
     NULL},
    {"sm,self,ud", UNSET, OK, "RDMA (ud)", NULL},
    /* GPU copy transports are same-host helpers. */
    {"rc,cuda_copy,cuda_ipc,gdr_copy", UNSET, OK,
     "same-host GPU (cuda_copy, cuda_ipc, gdr_copy)", NULL},
    {"rc,cuda,rocm,rocm_copy,rocm_ipc,rocm_gdr", UNSET, OK, "same-host GPU (cuda, rocm",
     NULL},
    /* Empty items are skipped, as UCX skips them. */
    {"rc,,sm,", UNSET, OK, "RDMA (rc) + same-host (sm)", NULL},
    {",rc", UNSET, OK, "RDMA (rc)", NULL},
    /* :aux is allowed, but an aux RDMA transport is not "an RDMA transport". */
    {"rc,ud:aux,sm", UNSET, OK, "wire-up only (ud:aux)", "RDMA (rc)"},
    {"sm:aux,rc_mlx5", UNSET, OK, "RDMA (rc_mlx5) + wire-up only (sm:aux)", NULL},
    {"rc:aux,sm,self", UNSET, NO, "has no RDMA transport", ":aux only carries"},
    {"\\rc_mlx5:aux,self", UNSET, NO, "has no RDMA transport", NULL},
    /* '\name' is an exact transport name; an alias behind '\' names nothing. */
    {"\\rc_mlx5,sm", UNSET, OK, "RDMA (\\rc_mlx5) + same-host (sm)", NULL},
    {"\\dc_mlx5,\\posix,\\self", UNSET, OK, "same-host (\\posix, \\self)", NULL},
    {"\\rc,sm", UNSET, NO, "'\\rc' names no transport", "alias"},
    {"rc,\\sm", UNSET, NO, "'\\sm' names no transport", NULL},

    /* No RDMA transport at all. */
    {"sm,self", UNSET, NO, "has no RDMA transport", "UCX_TLS=sm,self"},
    {"cuda_copy,posix", UNSET, NO, "has no RDMA transport", NULL},

    /* tcp, in every spelling, is rejected with the item quoted. */
    {"tcp", UNSET, NO, "names tcp ('tcp')", "UCX_TLS=rc,sm,self"},
    {"rc,tcp", UNSET, NO, "'tcp'", NULL},
    {"rc,sm,self,tcp", "mlx5_0:1", NO, "'tcp'", NULL},
    {"rc,TCP", UNSET, NO, "names tcp ('TCP')", NULL},
    {"rc, tcp", UNSET, NO, "names tcp (' tcp')", NULL},
    {"rc,tcp:aux", UNSET, NO, "'tcp:aux'", "wire-up"},
    {"rc,Tcp:AUX", UNSET, NO, "'Tcp:AUX'", NULL},
    {"rc,\\tcp", UNSET, NO, "'\\tcp'", NULL},
    {"rc,cuda_copy,tcp", UNSET, NO, "'tcp'", NULL},
    {"rc,tcp_sockcm", UNSET, NO, "'tcp_sockcm'", NULL},
    /* A TLS failure is reported before a device failure. */
    {"tcp", "eth0", NO, "'tcp'", NULL},

    /* all, in any position or case. */
    {"all", UNSET, NO, "names 'all'", "UCX_TLS=rc,sm,self"},
    {"ALL", UNSET, NO, "names 'all'", "UCX_TLS=ALL"},
    {"rc,all", UNSET, NO, "names 'all'", NULL},
    {"all,rc", UNSET, NO, "names 'all'", NULL},
    {"rc,all:aux", UNSET, NO, "names 'all'", NULL},

    /* Unknown names: rejected by name, prefixes alone do not make RDMA. */
    {"rc,foo", UNSET, NO, "'foo' is neither an RDMA transport", NULL},
    {"udp,sm", UNSET, NO, "'udp'", NULL},
    {"rcx", UNSET, NO, "'rcx'", NULL},
    {"rc,ugni", UNSET, NO, "'ugni'", NULL},
    {"ibverbs", UNSET, NO, "'ibverbs'", NULL},
    {"rc,*", UNSET, NO, "'*'", NULL},
    {"rc*", UNSET, NO, "'rc*'", NULL},
    {"rc,\\", UNSET, NO, "'\\'", NULL},
    {"rc,:aux", UNSET, NO, "':aux'", NULL},
    {"rc,\xc3\xa9", UNSET, NO, "'\\xc3\\xa9'", NULL},

    /* Unknown suffixes. */
    {"rc:foo", UNSET, NO, "'rc:foo' has an unknown suffix 'foo'", NULL},
    {"rc:aux:aux,rc", UNSET, NO, "unknown suffix 'aux:aux'", NULL},

    /* Spellings UCX would not match: upper case, spaces. */
    {"RC,sm,self", UNSET, NO, "'RC' is not a name UCX matches", "write 'rc'"},
    {"rc,SM,self", UNSET, NO, "'SM'", "write 'sm'"},
    {"Rc_X", UNSET, NO, "'Rc_X'", "write 'rc_x'"},
    {"rc:AUX,rc", UNSET, NO, "'rc:AUX'", "write 'rc:aux'"},
    {"rc, sm", UNSET, NO, "' sm' is not a name UCX matches", "write 'sm'"},
    {"rc,sm ", UNSET, NO, "'sm '", "write 'sm'"},
    {" rc", UNSET, NO, "' rc'", NULL},
    {"rc\t,sm", UNSET, NO, "'rc\\x09'", "write 'rc'"},
    {"rc,sm,self\n", UNSET, NO, "'self\\x0a'", NULL},

    /* Exclusion lists: accepted only when tcp is excluded as UCX matches it. */
    {"^tcp", UNSET, OK, "UCX_TLS=^tcp: every transport except tcp", NULL},
    {"^tcp,cuda", "mlx5_0:1", OK, "every transport except tcp, cuda",
     "UCX_NET_DEVICES=mlx5_0:1"},
    {"^cuda,tcp", UNSET, OK, "except cuda, tcp", NULL},
    {"^,tcp", UNSET, OK, "except tcp", NULL},
    {"^tcp:aux", UNSET, OK, "except tcp:aux", NULL},
    {"^\\tcp", UNSET, OK, "except \\tcp", NULL},
    {"^\\tcp:aux", UNSET, OK, "except \\tcp:aux", NULL},
    {"^cuda", UNSET, NO, "does not name tcp", "UCX_TLS=^tcp"},
    {"^", UNSET, NO, "does not name tcp", NULL},
    {"^rc,sm", UNSET, NO, "does not name tcp", NULL},
    {"^TCP", UNSET, NO, "does not exclude tcp", "'TCP' removes nothing"},
    {"^ tcp", UNSET, NO, "does not exclude tcp", "' tcp'"},
    {"^cuda,tcp ", UNSET, NO, "'tcp '", NULL},
    {"^tcp:foo", UNSET, NO, "'tcp:foo'", NULL},
    {"^all", UNSET, NO, "names 'all'", "'^all' as all"},
    {"^tcp,all", UNSET, NO, "names 'all'", NULL},
    /* A '^' that is not the first byte makes no exclusion list. */
    {" ^tcp", UNSET, NO, "names tcp (' ^tcp')", NULL},

    /* UCX_NET_DEVICES: only RDMA ports <dev>:<port>. */
    {"rc,sm,self", UNSET, OK, "; UCX_NET_DEVICES unset", NULL},
    {"rc,sm,self", "mlx5_0:1", OK, "; UCX_NET_DEVICES=mlx5_0:1", NULL},
    {"rc,sm,self", "mlx5_0:1,mlx5_1:2", OK, "UCX_NET_DEVICES=mlx5_0:1,mlx5_1:2", NULL},
    {"rc,sm,self", "mlx5_0:1,,mlx5_3:1,", OK, "UCX_NET_DEVICES=mlx5_0:1,,mlx5_3:1,",
     NULL},
    {"rc", "ibp59s0:1,bnxt_re0:1,mlx5_bond_0:255,irdma-0.x:1", OK, "ibp59s0:1", NULL},
    /* Linux interface names cannot contain ':', so the form alone is safe. */
    {"rc", "eth0:1", OK, "UCX_NET_DEVICES=eth0:1", NULL},
    {"rc,sm,self", "eth0", NO, "names 'eth0', which is not an RDMA port",
     "UCX_NET_DEVICES=mlx5_0:1"},
    {"rc,sm,self", "lo", NO, "'lo'", "network interface"},
    {"rc,sm,self", "ens5", NO, "'ens5'", NULL},
    {"rc,sm,self", "ib0", NO, "'ib0'", NULL},
    {"rc,sm,self", "mlx5_0:1,eth0", NO, "'eth0'", NULL},
    {"rc,sm,self", "eth0,mlx5_0:1", NO, "'eth0'", NULL},
    {"rc,sm,self", "mlx5_0", NO, "'mlx5_0'", NULL},
    {"^tcp", "eth0", NO, "'eth0'", NULL},
    {"rc,sm,self", "", NO, "UCX_NET_DEVICES is set but names no device", NULL},
    {"rc,sm,self", ",", NO, "names no device", NULL},
    {"rc,sm,self", "all", NO, "UCX_NET_DEVICES names 'all'", "eth0"},
    {"rc,sm,self", "mlx5_0:1,all", NO, "names 'all'", NULL},
    {"rc,sm,self", "ALL", NO, "names 'all'", NULL},
    {"rc,sm,self", "mlx5_0:", NO, "'mlx5_0:'", "port"},
    {"rc,sm,self", "mlx5_0:0", NO, "'mlx5_0:0'", "from 1 to 255"},
    {"rc,sm,self", "mlx5_0:01", NO, "'mlx5_0:01'", "port"},
    {"rc,sm,self", "mlx5_0:256", NO, "'mlx5_0:256'", "port"},
    {"rc,sm,self", "mlx5_0:1x", NO, "'mlx5_0:1x'", "port"},
    {"rc,sm,self", "mlx5_0:1:1", NO, "'mlx5_0:1:1'", "device name"},
    {"rc,sm,self", ":1", NO, "':1'", "empty device name"},
    {"rc,sm,self", " mlx5_0:1", NO, "' mlx5_0:1'", "spaces"},
    {"rc,sm,self", "^mlx5_0:1", NO, "'^mlx5_0:1'", "'^'"},
    {"rc,sm,self", "mlx5_*:1", NO, "'mlx5_*:1'", "wildcards"},
    {"rc,sm,self", "a234567890123456789012345678901234567890123456789012345678901234:1",
     NO, "longer than", NULL},
};

static bool
printable_line(const char *s)
{
    for (; *s != '\0'; s++)
        if ((unsigned char)*s < 0x20 || (unsigned char)*s >= 0x7f)
            return false;
    return true;
}

DP_TEST(table)
{
    for (size_t i = 0; i < DP_ARRAY_LEN(rows); i++) {
        const struct row *r = &rows[i];
        char desc[DP_DETAIL_MAX];
        dp_detail d;
        dp_detail_clear(&d);
        memset(desc, 'X', sizeof desc);
        int rc = dp__policy_check_rdma_only_values(r->tls, r->net, desc, sizeof desc, &d);
        CHECKF(rc == r->want,
               "row %zu (UCX_TLS=%s UCX_NET_DEVICES=%s): got %s, want %s: %s", i,
               r->tls ? r->tls : "(unset)", r->net ? r->net : "(unset)", dp_errname(rc),
               dp_errname(r->want), desc);
        CHECKF(strstr(desc, r->has1) != NULL, "row %zu: \"%s\" lacks \"%s\"", i, desc,
               r->has1);
        CHECKF(r->has2 == NULL || strstr(desc, r->has2) != NULL,
               "row %zu: \"%s\" lacks \"%s\"", i, desc, r->has2);
        CHECKF(printable_line(desc), "row %zu: not one printable line: %s", i, desc);
        if (rc == DP_OK) {
            CHECK_EQ(d.code, 0); /* untouched on success */
        } else {
            CHECK_EQ(d.code, DP_EPOLICY);
            CHECK_STR(d.msg, desc);
        }
    }
}

/* Every RDMA name of UCX 1.13 is accepted alone, and with a '\' if it is not an alias. */
DP_TEST(every_rdma_name)
{
    static const char *const names[] = {
        "rc",      "rc_v", "rc_x", "rc_verbs", "rc_mlx5",  "dc",      "dc_x",
        "dc_mlx5", "ud",   "ud_v", "ud_x",     "ud_verbs", "ud_mlx5", "ib"};
    static const char *const real[] = {"rc_verbs", "rc_mlx5", "dc_mlx5", "ud_verbs",
                                       "ud_mlx5"};
    char tls[64], want[96], desc[DP_DETAIL_MAX];
    for (size_t i = 0; i < DP_ARRAY_LEN(names); i++) {
        snprintf(tls, sizeof tls, "%s,self", names[i]);
        snprintf(want, sizeof want, "RDMA (%s) + same-host (self)", names[i]);
        CHECK_OK(dp__policy_check_rdma_only_values(tls, NULL, desc, sizeof desc, NULL));
        CHECK_CONTAINS(desc, want);
    }
    for (size_t i = 0; i < DP_ARRAY_LEN(real); i++) {
        snprintf(tls, sizeof tls, "\\%s", real[i]);
        CHECK_OK(dp__policy_check_rdma_only_values(tls, NULL, desc, sizeof desc, NULL));
    }
}

/* Every same-host helper is allowed next to RDMA and is not RDMA by itself. */
DP_TEST(every_samehost_name)
{
    static const char *const names[] = {"self", "sm",  "shm",  "mm",   "posix",
                                        "sysv", "cma", "knem", "xpmem"};
    char tls[64], want[96], desc[DP_DETAIL_MAX];
    for (size_t i = 0; i < DP_ARRAY_LEN(names); i++) {
        snprintf(tls, sizeof tls, "rc,%s", names[i]);
        snprintf(want, sizeof want, "RDMA (rc) + same-host (%s)", names[i]);
        CHECK_OK(dp__policy_check_rdma_only_values(tls, NULL, desc, sizeof desc, NULL));
        CHECK_CONTAINS(desc, want);
        CHECK_ERR(
            dp__policy_check_rdma_only_values(names[i], NULL, desc, sizeof desc, NULL),
            DP_EPOLICY);
        CHECK_CONTAINS(desc, "has no RDMA transport");
    }
}

DP_TEST(env_array)
{
    char desc[DP_DETAIL_MAX];
    dp_detail d;
    dp_detail_clear(&d);

    const char *const good[] = {"PATH=/bin", "UCX_TLS=rc_x,sm,self",
                                "UCX_NET_DEVICES=mlx5_0:1", NULL};
    CHECK_OK_D(dp__policy_check_rdma_only(good, desc, sizeof desc, &d), &d);
    CHECK_STR(desc, "UCX_TLS=rc_x,sm,self: RDMA (rc_x) + same-host (sm, self); "
                    "UCX_NET_DEVICES=mlx5_0:1");

    /* The first entry of a key wins, as with getenv(). */
    const char *const dup[] = {"UCX_TLS=tcp", "UCX_TLS=rc", NULL};
    CHECK_ERR(dp__policy_check_rdma_only(dup, desc, sizeof desc, NULL), DP_EPOLICY);
    CHECK_CONTAINS(desc, "'tcp'");
    const char *const dup2[] = {"UCX_TLS=rc", "UCX_TLS=tcp", NULL};
    CHECK_OK(dp__policy_check_rdma_only(dup2, desc, sizeof desc, NULL));

    /* Keys match whole: no '=' or a longer key is not UCX_TLS. */
    const char *const odd[] = {"UCX_TLS", "UCX_TLSX=rc", "XUCX_TLS=rc", "ucx_tls=rc",
                               NULL};
    CHECK_ERR(dp__policy_check_rdma_only(odd, desc, sizeof desc, NULL), DP_EPOLICY);
    CHECK_CONTAINS(desc, "UCX_TLS is unset");

    const char *const none[] = {NULL};
    CHECK_ERR(dp__policy_check_rdma_only(none, desc, sizeof desc, NULL), DP_EPOLICY);
    CHECK_CONTAINS(desc, "UCX_TLS is unset");

    const char *const netdev[] = {"UCX_NET_DEVICES=eth0", "UCX_TLS=rc", NULL};
    CHECK_ERR(dp__policy_check_rdma_only(netdev, desc, sizeof desc, NULL), DP_EPOLICY);
    CHECK_CONTAINS(desc, "'eth0'");

    const char *const empty_tls[] = {"UCX_TLS=", NULL};
    CHECK_ERR(dp__policy_check_rdma_only(empty_tls, desc, sizeof desc, NULL), DP_EPOLICY);
    CHECK_CONTAINS(desc, "names no transport");
}

/* Save a variable of the process environment and restore it. */
struct saved_env {
    const char *key;
    char *value; /* NULL: was unset */
};

static void
env_save(struct saved_env *s, const char *key)
{
    const char *v = getenv(key);
    s->key = key;
    s->value = v != NULL ? strdup(v) : NULL;
}

static void
env_restore(struct saved_env *s)
{
    if (s->value != NULL)
        setenv(s->key, s->value, 1);
    else
        unsetenv(s->key);
    free(s->value);
}

DP_TEST(process_environment)
{
    struct saved_env tls, net;
    env_save(&tls, "UCX_TLS");
    env_save(&net, "UCX_NET_DEVICES");
    char desc[DP_DETAIL_MAX];

    setenv("UCX_TLS", "rc,sm,self", 1);
    unsetenv("UCX_NET_DEVICES");
    int rc1 = dp__policy_check_rdma_only(NULL, desc, sizeof desc, NULL);
    char desc1[DP_DETAIL_MAX];
    snprintf(desc1, sizeof desc1, "%s", desc);

    setenv("UCX_NET_DEVICES", "eth0", 1);
    int rc2 = dp__policy_check_rdma_only(NULL, desc, sizeof desc, NULL);
    char desc2[DP_DETAIL_MAX];
    snprintf(desc2, sizeof desc2, "%s", desc);

    unsetenv("UCX_TLS");
    int rc3 = dp__policy_check_rdma_only(NULL, desc, sizeof desc, NULL);

    env_restore(&tls);
    env_restore(&net);
    CHECK_EQ(rc1, DP_OK);
    CHECK_STR(desc1, "UCX_TLS=rc,sm,self: RDMA (rc) + same-host (sm, self); "
                     "UCX_NET_DEVICES unset");
    CHECK_EQ(rc2, DP_EPOLICY);
    CHECK_CONTAINS(desc2, "'eth0'");
    CHECK_EQ(rc3, DP_EPOLICY);
    CHECK_CONTAINS(desc, "UCX_TLS is unset");
}

DP_TEST(detail_and_desc_contract)
{
    dp_detail d;
    dp_detail_clear(&d);
    snprintf(d.msg, sizeof d.msg, "sentinel");

    /* Success leaves d alone; NULL desc is fine. */
    CHECK_OK(dp__policy_check_rdma_only_values("rc", "mlx5_0:1", NULL, 0, &d));
    CHECK_EQ(d.code, 0);
    CHECK_STR(d.msg, "sentinel");
    CHECK_OK(dp__policy_check_rdma_only_values("rc", NULL, NULL, 100, NULL));

    /* Failure fills d even without desc. */
    CHECK_ERR(dp__policy_check_rdma_only_values("tcp", NULL, NULL, 0, &d), DP_EPOLICY);
    CHECK_EQ(d.code, DP_EPOLICY);
    CHECK_CONTAINS(d.msg, "'tcp'");

    /* desc is truncated to desc_len and always terminated. */
    char small[8];
    memset(small, 'X', sizeof small);
    CHECK_OK(dp__policy_check_rdma_only_values("rc", NULL, small, sizeof small, NULL));
    CHECK_STR(small, "UCX_TLS");
    char one[1] = {'X'};
    CHECK_ERR(dp__policy_check_rdma_only_values(NULL, NULL, one, 1, NULL), DP_EPOLICY);
    CHECK_EQ(one[0], '\0');
    char zero[1] = {'X'};
    CHECK_OK(dp__policy_check_rdma_only_values("rc", NULL, zero, 0, NULL));
    CHECK_EQ(zero[0], 'X');
}

DP_TEST(hostile_values)
{
    char desc[DP_DETAIL_MAX];
    size_t big = 200000;
    char *s = malloc(big + 1);
    CHECK(s != NULL);

    /* One huge unknown item: rejected, shortened, marked with "...". */
    memset(s, 'a', big);
    s[big] = '\0';
    int rc = dp__policy_check_rdma_only_values(s, NULL, desc, sizeof desc, NULL);
    CHECK_EQ(rc, DP_EPOLICY);
    CHECK_CONTAINS(desc, "aaa...'");
    CHECK(strlen(desc) < 400); /* the 200000-byte item was shortened */

    /* Many good items: accepted; the description is cut and says so. */
    for (size_t i = 0; i + 3 <= big; i += 3)
        memcpy(s + i, "rc,", 3);
    s[big - big % 3] = '\0';
    rc = dp__policy_check_rdma_only_values(s, s, desc, sizeof desc, NULL);
    CHECK_EQ(rc, DP_EPOLICY); /* "rc" is no <dev>:<port> */
    CHECK_CONTAINS(desc, "'rc'");
    rc = dp__policy_check_rdma_only_values(s, "mlx5_0:1", desc, sizeof desc, NULL);
    CHECK_EQ(rc, DP_OK);
    CHECK_EQ(strlen(desc), sizeof desc - 1);
    CHECK(strcmp(desc + strlen(desc) - 3, "...") == 0);
    CHECK(printable_line(desc));

    /* Every byte value, as TLS and as devices. */
    for (int i = 1; i < 256; i++)
        s[i - 1] = (char)i;
    s[255] = '\0';
    CHECK_EQ(dp__policy_check_rdma_only_values(s, NULL, desc, sizeof desc, NULL),
             DP_EPOLICY);
    CHECK(printable_line(desc));
    CHECK_EQ(dp__policy_check_rdma_only_values("rc", s, desc, sizeof desc, NULL),
             DP_EPOLICY);
    CHECK(printable_line(desc));
    CHECK_EQ(dp__policy_check_rdma_only_values(s + 93, NULL, desc, sizeof desc, NULL),
             DP_EPOLICY); /* starts with '^' (0x5e) */
    CHECK(printable_line(desc));
    free(s);
}

/*
 * Random lists mixed from items whose verdict is known: the list passes iff it
 * has no bad item and at least one (non-aux) RDMA item, and a rejection quotes
 * the first bad item.
 */
DP_TEST(random_lists)
{
    static const char *const rdma[] = {"rc", "rc_x", "ud_mlx5", "\\dc_mlx5", "ib", "dc"};
    static const char *const neutral[] = {"sm",      "self",   "cuda_copy", "ud:aux",
                                          "\\posix", "rc:aux", "",          "mm"};
    static const char *const bad[] = {"tcp",  "TCP",     "all", " rc", "udp",   "\\rc",
                                      "rc:x", "tcp:aux", "Sm",  "foo", "\\tcp", "*"};
    uint64_t st = dp_test_seed();
    char tls[256], desc[DP_DETAIL_MAX], quoted[64];
    for (int iter = 0; iter < 20000; iter++) {
        int n = 1 + (int)(dp_test_rand(&st) % 6);
        size_t len = 0;
        bool any_rdma = false;
        const char *first_bad = NULL;
        tls[0] = '\0';
        for (int k = 0; k < n; k++) {
            const char *item;
            uint64_t pick = dp_test_rand(&st) % 10;
            if (pick < 3) {
                item = rdma[dp_test_rand(&st) % DP_ARRAY_LEN(rdma)];
                any_rdma = true;
            } else if (pick < 8) {
                item = neutral[dp_test_rand(&st) % DP_ARRAY_LEN(neutral)];
            } else {
                item = bad[dp_test_rand(&st) % DP_ARRAY_LEN(bad)];
                if (first_bad == NULL)
                    first_bad = item;
            }
            len +=
                (size_t)snprintf(tls + len, sizeof tls - len, "%s%s", k ? "," : "", item);
        }
        int want = (first_bad == NULL && any_rdma) ? DP_OK : DP_EPOLICY;
        int rc = dp__policy_check_rdma_only_values(tls, NULL, desc, sizeof desc, NULL);
        CHECKF(rc == want, "UCX_TLS=\"%s\": got %s, want %s: %s", tls, dp_errname(rc),
               dp_errname(want), desc);
        if (first_bad != NULL) {
            snprintf(quoted, sizeof quoted, "'%s", first_bad);
            CHECKF(strstr(desc, quoted) != NULL, "UCX_TLS=\"%s\": \"%s\" lacks %s'", tls,
                   desc, quoted);
        } else if (!any_rdma) {
            /* Only empty items make an empty list. */
            CHECKF(strstr(desc, "has no RDMA transport") != NULL ||
                       strstr(desc, "names no transport") != NULL,
                   "UCX_TLS=\"%s\": %s", tls, desc);
        }
    }
}
