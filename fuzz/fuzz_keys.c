/*
 * libFuzzer target for src/blob/keys: dp__key_split on arbitrary bytes (not
 * NUL-terminated), and dp__key_split_z on them NUL-terminated (the same answer). A key
 * that splits must pass dp__field_valid, remake to the same bytes (one spelling per key)
 * and stay within the size limits.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "blob/keys.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *k = (const char *)data;
    dp__key_parts kp;
    dp_detail d;
    int rc = dp__key_split(k, size, &kp, &d);
    if (rc != DP_OK && rc != DP_EINVAL)
        abort();
    if (rc == DP_OK) {
        if (size > DP_KEY_MAX || kp.field < k || kp.field + kp.field_len != k + size)
            abort();
        if (!dp__field_valid(kp.field, kp.field_len))
            abort();
        char buf[DP_KEY_MAX + 1];
        size_t n = 0;
        if (dp__key_make(kp.gidx, kp.field, kp.field_len, buf, sizeof buf, &n, &d) !=
            DP_OK)
            abort();
        if (n != size || memcmp(buf, k, size) != 0)
            abort();
    } else if (d.code != DP_EINVAL || d.msg[0] == '\0') {
        abort();
    }
    /* The one-pass split of the same bytes NUL-terminated (up to a NUL in
     * them) agrees with the full one. */
    char *z = malloc(size + 1);
    if (z == NULL)
        abort();
    memcpy(z, data, size);
    z[size] = '\0';
    size_t zl = strlen(z), kl = 0;
    dp__key_parts kz, kf;
    int rz = dp__key_split_z(z, &kl, &kz, NULL), rf = dp__key_split(z, zl, &kf, NULL);
    if (rz != rf || kl != zl ||
        (rz == DP_OK &&
         (kz.gidx != kf.gidx || kz.field != kf.field || kz.field_len != kf.field_len)))
        abort();
    free(z);
    /* the same bytes as a field and as a gidx */
    int fv = dp__field_check(k, size, NULL);
    if ((fv == DP_OK) != dp__field_valid(k, size))
        abort();
    uint64_t g;
    rc = dp__gidx_parse(k, size, &g, &d);
    if (rc != DP_OK && rc != DP_EINVAL)
        abort();
    return 0;
}
