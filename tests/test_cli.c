/*
 * Tests of the `dataplane` command through the real binary: exit codes,
 * --help on every command, the policy command's verdicts, clear usage errors.
 */
#include "dp_test.h"
#include "dp_proc.h"

#include <sys/wait.h>

#ifndef DP_CLI_PATH
#error "DP_CLI_PATH must name the dataplane binary"
#endif

/* Run the CLI with args (a shell fragment); capture stdout+stderr; return status. */
static int
run(const char *env, const char *args, char *out, size_t outlen)
{
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "env -u UCX_TLS -u UCX_NET_DEVICES %s '%s' %s 2>&1",
             env ? env : "", DP_CLI_PATH, args);
    return dp_test_run_sh(cmd, out, outlen);
}

DP_TEST(help_and_version)
{
    char out[8192];
    CHECK_EQ(run(NULL, "--help", out, sizeof out), 0);
    CHECK_CONTAINS(out, "usage: dataplane");
    CHECK_CONTAINS(out, "policy");
    CHECK_EQ(run(NULL, "version", out, sizeof out), 0);
    CHECK_CONTAINS(out, "dataplane ");
    CHECK_EQ(run(NULL, "policy --help", out, sizeof out), 0);
    CHECK_CONTAINS(out, "usage: dataplane policy");
}

DP_TEST(usage_errors_exit_2_and_say_what_to_do)
{
    char out[8192];
    CHECK_EQ(run(NULL, "", out, sizeof out), 2);
    CHECK_CONTAINS(out, "usage:");
    CHECK_EQ(run(NULL, "frobnicate", out, sizeof out), 2);
    CHECK_CONTAINS(out, "unknown command 'frobnicate'");
    CHECK_EQ(run(NULL, "policy --bogus", out, sizeof out), 2);
    CHECK_CONTAINS(out, "unknown option '--bogus'");
    CHECK_CONTAINS(out, "--help");
    CHECK_EQ(run(NULL, "policy extra", out, sizeof out), 2);
    CHECK_CONTAINS(out, "unexpected argument 'extra'");
}

DP_TEST(policy_verdicts)
{
    char out[8192];
    CHECK_EQ(run(NULL, "policy", out, sizeof out), 1);
    CHECK_CONTAINS(out, "refused");
    CHECK_CONTAINS(out, "UCX_TLS");
    CHECK_EQ(run("UCX_TLS=rc_x,sm,self", "policy", out, sizeof out), 0);
    CHECK_CONTAINS(out, "allowed");
    CHECK_EQ(run("UCX_TLS=rc,tcp", "policy", out, sizeof out), 1);
    CHECK_CONTAINS(out, "tcp");
    CHECK_EQ(run(NULL, "policy --tls ^tcp", out, sizeof out), 0);
    CHECK_EQ(run(NULL, "policy --tls rc --net-devices eth0", out, sizeof out), 1);
    CHECK_CONTAINS(out, "eth0");
    CHECK_EQ(run(NULL, "policy --tls rc --net-devices mlx5_0:1", out, sizeof out), 0);
}
