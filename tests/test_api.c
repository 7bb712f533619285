/*
 * The public API as a user sees it: only the umbrella header, linked against
 * the shared library (which exports nothing but DP_API symbols).
 */
#include "dp_test.h"

#include "dataplane/dataplane.h"

DP_TEST(errors_are_exported)
{
    CHECK_STR(dp_errname(DP_EUNITFULL), "DP_EUNITFULL");
    dp_detail d;
    dp_detail_clear(&d);
    CHECK_EQ(dp_fail(&d, DP_EBUSY, "unit %d", 2), DP_EBUSY);
    CHECK_STR(dp_detail_msg(&d), "unit 2");
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
}
