/*
 * libFuzzer target for what the registry reads from etcd (src/registry/):
 * unit records (JSON), base64 keys and values, and registry URLs.
 *
 * Input layout: byte 0 picks the parser (0: record, 1: base64, 2: URL); the
 * rest is its input.
 *
 * Beyond "no crash, no sanitizer report": a record that decodes is a unit of
 * the URL's cluster at the key's id (id < units, a tcp:// address, a
 * non-zero incarnation) and survives an encode/decode round trip unchanged;
 * base64 that decodes re-encodes to the same text; a URL that parses has a
 * valid name and endpoints.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "registry/registry.h"

#define FAIL_IF(cond)                                                                    \
    do {                                                                                 \
        if (cond) {                                                                      \
            fprintf(stderr, "fuzz_registry: %s (line %d)\n", #cond, __LINE__);           \
            abort();                                                                     \
        }                                                                                \
    } while (0)

static void
record(const uint8_t *p, size_t n)
{
    dp__reg_url u;
    FAIL_IF(dp__reg_url_parse("etcd://127.0.0.1:2379/fz", &u, NULL) != DP_OK);
    /* The key: dataplane/fz/units/<first byte % 8>. */
    char key[DP_REG_KEY_MAX];
    dp__reg_key(&u, n > 0 ? p[0] % 8 : 0, key, sizeof key);
    const char *json = n > 0 ? (const char *)p + 1 : "";
    size_t len = n > 0 ? n - 1 : 0;
    dp__reg_record r;
    dp_detail d;
    dp_detail_clear(&d);
    if (dp__reg_record_decode(&u, key, json, len, &r, &d) != DP_OK) {
        FAIL_IF(dp_detail_msg(&d)[0] == '\0');
        return;
    }
    FAIL_IF(r.id >= r.n_units || strcmp(r.cluster, "fz") != 0);
    FAIL_IF(strncmp(r.zmq, "tcp://", 6) != 0 || r.incarnation == 0);
    dp__buf b;
    dp__buf_init(&b);
    FAIL_IF(dp__reg_record_encode(&r, &b, NULL) != DP_OK);
    dp__reg_record r2;
    FAIL_IF(dp__reg_record_decode(&u, key, (const char *)b.data, b.len, &r2, NULL) !=
            DP_OK);
    FAIL_IF(memcmp(&r, &r2, sizeof r) != 0);
    dp__buf_fini(&b);
}

static void
base64(const uint8_t *p, size_t n)
{
    size_t len = 0;
    char *dec = dp__etcd_b64_decode((const char *)p, n, &len);
    if (dec == NULL)
        return;
    char *enc = dp__etcd_b64_encode(dec, len);
    FAIL_IF(enc == NULL || strlen(enc) != n || memcmp(enc, p, n) != 0);
    free(enc);
    free(dec);
}

static void
url(const uint8_t *p, size_t n)
{
    char s[1024];
    n = n < sizeof s - 1 ? n : sizeof s - 1;
    memcpy(s, p, n);
    s[n] = '\0';
    dp__reg_url u;
    dp_detail d;
    dp_detail_clear(&d);
    if (dp__reg_url_parse(s, &u, &d) != DP_OK) {
        FAIL_IF(dp_detail_msg(&d)[0] == '\0');
        return;
    }
    FAIL_IF(u.name[0] == '\0' || u.endpoints[0] == '\0');
    FAIL_IF(!dp__id_valid(u.name, strlen(u.name), 64));
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    switch (data[0] % 3) {
    case 0:
        record(data + 1, size - 1);
        break;
    case 1:
        base64(data + 1, size - 1);
        break;
    default:
        url(data + 1, size - 1);
        break;
    }
    return 0;
}
