/*
 * The public API as a user sees it: only the umbrella header, linked against
 * the shared library (which exports nothing but DP_API symbols: the CTest
 * test_exports checks the symbol list itself). Covered: error numbers and
 * their names, the version, zeroed options, and the layout of the structs a
 * caller allocates (their size and the place of their reserved tails are
 * ABI: a change must be deliberate).
 */
#include "dp_test.h"

#include <stddef.h>
#include <stdio.h>

#include "dataplane/dataplane.h"

DP_TEST(errors_are_exported)
{
    CHECK_STR(dp_errname(DP_EUNITFULL), "DP_EUNITFULL");
    CHECK_STR(dp_strerror(DP_OK), "success");
    CHECK_STR(dp_errname(DP_OK), "DP_OK");
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_EQ(d.code, 0);
    CHECK_STR(dp_detail_msg(&d), "");
    CHECK_STR(dp_detail_msg(NULL), "");
}

/*
 * The numbers are written out and stay: a binding or a log may have stored
 * them. Each is in DP_ERR_FIRST..DP_ERR_LAST, above every errno, and unique.
 */
DP_TEST(error_numbers_are_fixed_and_outside_errno)
{
    EXPECT_EQ(DP_OK, 0);
    EXPECT_EQ(DP_EINVAL, 8001);
    EXPECT_EQ(DP_ENOMEM, 8002);
    EXPECT_EQ(DP_EBUSY, 8005);
    EXPECT_EQ(DP_ESYS, 8012);
    EXPECT_EQ(DP_ENOTFOUND, 8014);
    EXPECT_EQ(DP_ERESTARTED, 8019);
    static const int codes[] = {
#define TA_CODE_(name, value, msg) value,
        DP_ERRORS(TA_CODE_)
#undef TA_CODE_
    };
    static const char *const names[] = {
#define TA_NAME_(name, value, msg) #name,
        DP_ERRORS(TA_NAME_)
#undef TA_NAME_
    };
    size_t n = sizeof codes / sizeof codes[0];
    CHECK(n >= 19);
    for (size_t i = 0; i < n; i++) {
        CHECKF(codes[i] >= DP_ERR_FIRST && codes[i] <= DP_ERR_LAST, "%s = %d", names[i],
               codes[i]);
        CHECKF(codes[i] > 4095, "%s = %d is in errno's range", names[i], codes[i]);
        CHECK_STR(dp_errname(codes[i]), names[i]);
        CHECK(strcmp(dp_strerror(codes[i]), "unknown error code") != 0);
        for (size_t j = 0; j < i; j++)
            CHECKF(codes[i] != codes[j], "%s and %s share %d", names[i], names[j],
                   codes[i]);
    }
    /* Numbers that are no code still get an answer, never a wrong name. */
    const int unknown[] = {
        -1,   1,           12 /* ENOMEM */, 110 /* ETIMEDOUT */, -12, 4095, 8000,
        8020, DP_ERR_LAST, 0x7fffffff,      -0x7fffffff - 1};
    for (size_t i = 0; i < sizeof unknown / sizeof unknown[0]; i++) {
        CHECK_STR(dp_strerror(unknown[i]), "unknown error code");
        CHECK_STR(dp_errname(unknown[i]), "DP_E?");
    }
}

DP_TEST(version_from_one_source)
{
    CHECK_EQ(dp_version(), DP_VERSION_HEX);
    CHECK_EQ(DP_VERSION_HEX,
             (DP_VERSION_MAJOR << 16) | (DP_VERSION_MINOR << 8) | DP_VERSION_PATCH);
    char want[32];
    snprintf(want, sizeof want, "%d.%d.%d", DP_VERSION_MAJOR, DP_VERSION_MINOR,
             DP_VERSION_PATCH);
    CHECK_STR(DP_VERSION_STRING, want);
    CHECK_STR(dp_version_string(), DP_VERSION_STRING);
#ifdef DP_CLI_PATH
    /* The command prints the same version (it has no copy of its own). */
    FILE *f = popen("'" DP_CLI_PATH "' --version", "r");
    CHECK(f != NULL);
    char line[128] = "";
    CHECK(fgets(line, sizeof line, f) != NULL);
    CHECK_EQ(pclose(f), 0);
    CHECK_STR(line, "dataplane " DP_VERSION_STRING "\n");
#else
    printf("  (no CLI binary: `dataplane --version` not checked)\n");
#endif
}

DP_TEST(client_open_without_a_cluster_says_what_to_do)
{
    dp_client *c = NULL;
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_ERR_D(dp_client_open("/nonexistent/dataplane/cluster.json", NULL, &c, &d),
                DP_ENOTFOUND, &d);
    CHECK(c == NULL);
    CHECK_CONTAINS(d.msg, "dataplane up");
    CHECK_EQ(d.code, DP_ENOTFOUND);
}

/*
 * A zeroed dp_client_opts passes the option checks (the call then fails on
 * what comes next: no units); a reserved word that is not zero, or a negative
 * timeout, is refused first. dp_client_opts_init fills the same defaults.
 */
DP_TEST(zeroed_options_are_the_defaults)
{
    dp_client *c = NULL;
    dp_detail d;
    dp_detail_clear(&d);
    dp_client_opts o;
    memset(&o, 0, sizeof o);
    CHECK_ERR_D(dp_client_open_units(NULL, 0, &o, &c, &d), DP_EINVAL, &d);
    CHECK_CONTAINS(d.msg, "0 units");
    CHECK_ERR_D(dp_client_open_units(NULL, 0, NULL, &c, &d), DP_EINVAL, &d);
    CHECK_CONTAINS(d.msg, "0 units");
    o.reserved[0] = 1;
    CHECK_ERR_D(dp_client_open_units(NULL, 0, &o, &c, &d), DP_EINVAL, &d);
    CHECK_CONTAINS(d.msg, "reserved[0]");
    o.reserved[0] = 0;
    o.timeout_s = -1;
    CHECK_ERR_D(dp_client_open_units(NULL, 0, &o, &c, &d), DP_EINVAL, &d);
    CHECK_CONTAINS(d.msg, "timeouts");
    dp_client_opts_init(&o);
    CHECK(o.timeout_s == 30 && o.connect_timeout_s == 30);
    CHECK_EQ_U64(o.staging_cache_bytes, 256ull << 20);
    CHECK(!o.crc && !o.no_spill && !o.require_rdma && o.name == NULL);
    CHECK_ERR_D(dp_client_open_units(NULL, 0, &o, &c, &d), DP_EINVAL, &d);
    CHECK_CONTAINS(d.msg, "0 units");
    CHECK(c == NULL);

    dp_direct_opts dop;
    dp_direct_opts_init(&dop);
    CHECK_EQ(dop.remote_cache_size, 16);
    CHECK_EQ(dop.n_workers, 2);
    CHECK(dop.xfer_timeout_s == 60);
    CHECK_EQ_U64(dop.chunk_bytes, 64u << 20);
    CHECK(dop.backend == DP_DIRECT_BACKEND_AUTO && !dop.no_progress_thread);

    dp_ckpt_opts co;
    dp_ckpt_opts_init(&co);
    CHECK(co.timeout_s == 600 && co.keep == 0 && co.progress == NULL);
    dp_ckpt_summary s;
    CHECK_ERR_D(dp_ckpt_save(NULL, "/tmp/x", NULL, &s, &d), DP_EINVAL, &d);
    CHECK_ERR_D(dp_ckpt_peek("/nonexistent/dataplane-ckpt", &s, &d), DP_ENOTFOUND, &d);
    dp_free(NULL);

    uint64_t g = 0;
    CHECK_OK_D(dp_key_check("17@input_ids", 12, &g, &d), &d);
    CHECK_EQ_U64(g, 17);
    CHECK_OK_D(dp_key_check("5@ab@junk", 4, NULL, &d), &d); /* only len bytes */
    CHECK_ERR_D(dp_key_check("1@a@b", 5, &g, &d), DP_EINVAL, &d);
    CHECK_CONTAINS(dp_detail_msg(&d), "cannot contain '@'");
    CHECK_ERR_D(dp_key_check("1@a\nb", 5, NULL, &d), DP_EINVAL, &d);
    CHECK_ERR_D(dp_key_check("01@a", 4, NULL, &d), DP_EINVAL, &d);
    CHECK_ERR_D(dp_key_check(NULL, 0, NULL, &d), DP_EINVAL, &d);
}

/* sizeof, and offset + size of the reserved tail, which must be the struct's end. */
#define TAIL_CHECK(type, size)                                                           \
    do {                                                                                 \
        CHECK_EQ(sizeof(type), size);                                                    \
        CHECK_EQ(offsetof(type, reserved) + sizeof(((type *)0)->reserved),               \
                 sizeof(type));                                                          \
    } while (0)

/*
 * The sizes are those of x86-64 and aarch64 Linux (LP64). A field added later
 * takes reserved words and keeps these numbers; a change here breaks every
 * program built against the old header.
 */
DP_TEST(struct_layouts_are_stable)
{
#if defined(__LP64__)
    TAIL_CHECK(dp_client_opts, 104);
    TAIL_CHECK(dp_value, 64);
    TAIL_CHECK(dp_value_desc, 344);
    TAIL_CHECK(dp_get_item, 64);
    CHECK_EQ(sizeof(dp_loc), 128); /* its reserved word became the seal */
    CHECK_EQ(offsetof(dp_loc, seal) + sizeof(uint64_t), sizeof(dp_loc));
    TAIL_CHECK(dp_direct_opts, 112);
    TAIL_CHECK(dp_direct_stats, 256);
    TAIL_CHECK(dp_ckpt_opts, 96);
    TAIL_CHECK(dp_ckpt_summary, 176);
    /* Fixed for good (no reserved tail). */
    CHECK_EQ(sizeof(dp_client_counters), 128);
    CHECK_EQ(offsetof(dp_client_counters, loc_misses), 120);
    CHECK_EQ(offsetof(dp_client_opts, inline_bytes), 48); /* took reserved[0] */
    CHECK_EQ(sizeof(dp_detail), 8 + DP_DETAIL_MAX);
    CHECK_EQ(sizeof(dp_direct_buf), 16);
#else
    DP_SKIP("not LP64: the sizes checked are those of LP64 Linux");
#endif
}
