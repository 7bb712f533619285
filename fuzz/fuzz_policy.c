/*
 * libFuzzer target for the RDMA-only transport policy (src/xfer/policy.c).
 *
 * Input layout: the UCX_TLS value, a separator, the UCX_NET_DEVICES value.
 * The separator is the first NUL byte if there is one, else the first '\n';
 * with neither, UCX_NET_DEVICES is unset. An empty input leaves both unset.
 * The second value ends at its first NUL (it becomes a C string).
 *
 * Beyond "no crash, no sanitizer report" the target checks the contract:
 * only DP_OK or DP_EPOLICY; one printable line, truncated consistently for
 * any desc_len; the env-array and the value API agree; the detail matches;
 * and, with a check written independently of the module, that an accepted
 * setting never leaves tcp, all or a netdev reachable.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dataplane/err.h"
#include "xfer/policy.h"

#define FAIL_IF(cond)                                                                    \
    do {                                                                                 \
        if (cond) {                                                                      \
            fprintf(stderr, "fuzz_policy: %s (line %d)\n", #cond, __LINE__);             \
            abort();                                                                     \
        }                                                                                \
    } while (0)

static char *
dup_bytes(const uint8_t *p, size_t n)
{
    char *s = malloc(n + 1);
    if (s == NULL)
        abort();
    if (n > 0)
        memcpy(s, p, n);
    s[n] = '\0';
    return s;
}

static char *
join(const char *key, const char *value)
{
    size_t k = strlen(key), v = strlen(value);
    char *s = malloc(k + v + 1);
    if (s == NULL)
        abort();
    memcpy(s, key, k);
    memcpy(s + k, value, v + 1);
    return s;
}

static bool
printable_line(const char *s)
{
    for (; *s != '\0'; s++)
        if ((unsigned char)*s < 0x20 || (unsigned char)*s >= 0x7f)
            return false;
    return true;
}

/* Some item of a ','-separated list equals lit exactly. */
static bool
list_has(const char *list, const char *lit)
{
    size_t n = strlen(lit);
    for (const char *p = list;; p++) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (len == n && memcmp(p, lit, n) == 0)
            return true;
        if (e == NULL)
            return false;
        p = e;
    }
}

static bool
contains_tcp_any_case(const char *s)
{
    for (; *s != '\0'; s++)
        if ((s[0] | 0x20) == 't' && (s[1] | 0x20) == 'c' && (s[2] | 0x20) == 'p')
            return true;
    return false;
}

/* The safety property, checked without the module's code. */
static void
check_accepted(const char *tls, const char *net)
{
    FAIL_IF(tls == NULL || tls[0] == '\0');
    if (tls[0] == '^') {
        const char *l = tls + 1;
        FAIL_IF(!list_has(l, "tcp") && !list_has(l, "\\tcp") && !list_has(l, "tcp:aux") &&
                !list_has(l, "\\tcp:aux"));
        FAIL_IF(list_has(l, "all"));
    } else {
        FAIL_IF(contains_tcp_any_case(tls));
        FAIL_IF(list_has(tls, "all"));
    }
    if (net != NULL) {
        FAIL_IF(list_has(net, "all"));
        bool any = false;
        for (const char *p = net;; p++) {
            const char *e = strchr(p, ',');
            size_t len = e ? (size_t)(e - p) : strlen(p);
            if (len > 0) {
                any = true;
                FAIL_IF(memchr(p, ':', len) == NULL); /* a netdev such as eth0 */
            }
            if (e == NULL)
                break;
            p = e;
        }
        FAIL_IF(!any);
    }
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *tls = NULL, *net = NULL;
    if (size > 0) {
        const uint8_t *sep = memchr(data, '\0', size);
        if (sep == NULL)
            sep = memchr(data, '\n', size);
        size_t n = sep ? (size_t)(sep - data) : size;
        tls = dup_bytes(data, n);
        if (sep != NULL)
            net = dup_bytes(sep + 1, size - n - 1);
    }

    char desc[DP_DETAIL_MAX];
    dp_detail d;
    dp_detail_clear(&d);
    memset(desc, 'X', sizeof desc);
    int rc = dp__policy_check_rdma_only_values(tls, net, desc, sizeof desc, &d);
    FAIL_IF(rc != DP_OK && rc != DP_EPOLICY);
    FAIL_IF(memchr(desc, '\0', sizeof desc) == NULL);
    FAIL_IF(!printable_line(desc));
    if (rc == DP_OK) {
        FAIL_IF(d.code != 0);
        check_accepted(tls, net);
    } else {
        FAIL_IF(d.code != DP_EPOLICY || strcmp(d.msg, desc) != 0);
    }

    /* A shorter desc gets a prefix of the same line. */
    size_t small = 1 + (size % 40);
    char cut[40];
    FAIL_IF(dp__policy_check_rdma_only_values(tls, net, cut, small, NULL) != rc);
    FAIL_IF(strlen(cut) >= small || strncmp(cut, desc, strlen(cut)) != 0);

    /* The env-array form agrees, with a decoy entry before the real ones. */
    char *env_tls = tls ? join("UCX_TLS=", tls) : NULL;
    char *env_net = net ? join("UCX_NET_DEVICES=", net) : NULL;
    const char *env[4];
    size_t k = 0;
    env[k++] = "UCX_TLSX=tcp";
    if (env_tls != NULL)
        env[k++] = env_tls;
    if (env_net != NULL)
        env[k++] = env_net;
    env[k] = NULL;
    char desc2[DP_DETAIL_MAX];
    FAIL_IF(dp__policy_check_rdma_only(env, desc2, sizeof desc2, NULL) != rc);
    FAIL_IF(strcmp(desc, desc2) != 0);

    free(env_tls);
    free(env_net);
    free(tls);
    free(net);
    return 0;
}
