/*
 * "<gidx>@<field>" keys: make, split and validate (rules in keys.h).
 *
 * The validators are written against bytes plus a length and never look past
 * the length they are given: keys come out of blob indexes and control
 * messages, where nothing is NUL-terminated and everything is untrusted.
 */
#include "blob/keys.h"

#include <stdio.h>
#include <string.h>

#include "common/common.h"
#include "dataplane/client.h"

const char *
dp__quote_bytes(const char *s, size_t len, size_t max_shown, char *out, size_t cap)
{
    static const char hex[] = "0123456789abcdef";
    size_t o = 0;
    if (cap == 0)
        return out;
    size_t shown = len < max_shown ? len : max_shown;
    for (size_t i = 0; i < shown; i++) {
        unsigned char c = (unsigned char)s[i];
        char tmp[4];
        size_t n;
        if (c == '\'' || c == '\\') {
            tmp[0] = '\\';
            tmp[1] = (char)c;
            n = 2;
        } else if (c >= 0x20 && c < 0x7f) {
            tmp[0] = (char)c;
            n = 1;
        } else {
            tmp[0] = '\\';
            tmp[1] = 'x';
            tmp[2] = hex[c >> 4];
            tmp[3] = hex[c & 15];
            n = 4;
        }
        if (o + n + 4 > cap) { /* room for "..." and the NUL */
            shown = 0;         /* forces the ellipsis below */
            break;
        }
        memcpy(out + o, tmp, n);
        o += n;
    }
    if (shown < len && o + 4 <= cap) {
        memcpy(out + o, "...", 3);
        o += 3;
    }
    out[o] = '\0';
    return out;
}

/*
 * Why field[0..len) is not a valid field, written into why (NUL-terminated),
 * or false if it is valid.
 */
static bool
field_problem(const char *field, size_t len, char *why, size_t cap)
{
    if (len == 0) {
        snprintf(why, cap, "field is empty");
        return true;
    }
    if (len > DP_FIELD_MAX) {
        snprintf(why, cap, "field is %zu bytes long, longer than %d", len, DP_FIELD_MAX);
        return true;
    }
    const unsigned char *p = (const unsigned char *)field;
    size_t i = 0;
    while (i < len) {
        unsigned c = p[i];
        if (c < 0x80) {
            if (c < 0x20 || c == 0x7f) {
                snprintf(why, cap, "field has control character 0x%02x at byte %zu", c,
                         i);
                return true;
            }
            if (c == '@') {
                snprintf(why, cap,
                         "field has '@' at byte %zu (a field cannot contain '@')", i);
                return true;
            }
            i++;
            continue;
        }
        /* Multi-byte sequence: the lead byte fixes the length and the range of
         * the first continuation byte (which excludes overlong forms,
         * surrogates and code points past U+10FFFF). */
        size_t n;
        unsigned lo = 0x80, hi = 0xbf;
        if (c >= 0xc2 && c <= 0xdf) {
            n = 2;
        } else if (c >= 0xe0 && c <= 0xef) {
            n = 3;
            if (c == 0xe0)
                lo = 0xa0;
            else if (c == 0xed)
                hi = 0x9f;
        } else if (c >= 0xf0 && c <= 0xf4) {
            n = 4;
            if (c == 0xf0)
                lo = 0x90;
            else if (c == 0xf4)
                hi = 0x8f;
        } else {
            snprintf(why, cap, "field is not valid UTF-8 at byte %zu", i);
            return true;
        }
        if (n > len - i) {
            snprintf(why, cap,
                     "field is not valid UTF-8 at byte %zu (truncated sequence)", i);
            return true;
        }
        if (p[i + 1] < lo || p[i + 1] > hi) {
            snprintf(why, cap, "field is not valid UTF-8 at byte %zu", i);
            return true;
        }
        for (size_t k = 2; k < n; k++) {
            if (p[i + k] < 0x80 || p[i + k] > 0xbf) {
                snprintf(why, cap, "field is not valid UTF-8 at byte %zu", i);
                return true;
            }
        }
        if (c == 0xc2 && p[i + 1] <= 0x9f) {
            snprintf(why, cap, "field has control character U+%04X at byte %zu",
                     (unsigned)p[i + 1], i);
            return true;
        }
        i += n;
    }
    return false;
}

int
dp__field_check(const char *field, size_t len, dp_detail *d)
{
    char why[128], q[80];
    if (field == NULL && len > 0)
        return dp__fail(d, DP_EINVAL, "field is NULL");
    if (!field_problem(field, len, why, sizeof why))
        return DP_OK;
    return dp__fail(d, DP_EINVAL, "field '%s': %s",
                    dp__quote_bytes(field, len, 48, q, sizeof q), why);
}

bool
dp__field_valid(const char *field, size_t len)
{
    char why[128];
    if (field == NULL && len > 0)
        return false;
    return !field_problem(field, len, why, sizeof why);
}

/* Why s[0..len) is not a gidx, or NULL (and *out set) if it is one. */
static const char *
gidx_problem(const char *s, size_t len, uint64_t *out)
{
    if (len == 0)
        return "gidx is empty";
    /* One pass, no division: up to 19 digits cannot overflow; 20 fit when
     * they are at most UINT64_MAX's, compared as text (same length). */
    uint64_t v = 0;
    for (size_t i = 0; i < len; i++) {
        unsigned digit = (unsigned)(unsigned char)s[i] - '0';
        if (digit > 9)
            return "gidx is not a decimal number";
        v = v * 10 + digit; /* wraps past 20 digits: refused below */
    }
    if (s[0] == '0' && len > 1)
        return "gidx has a leading zero";
    if (len > DP_GIDX_MAX_DIGITS ||
        (len == DP_GIDX_MAX_DIGITS && memcmp(s, "18446744073709551615", len) > 0))
        return "gidx does not fit in 64 bits";
    *out = v;
    return NULL;
}

int
dp__gidx_parse(const char *s, size_t len, uint64_t *out, dp_detail *d)
{
    char q[80];
    if (s == NULL && len > 0)
        return dp__fail(d, DP_EINVAL, "gidx is NULL");
    const char *why = gidx_problem(s, len, out);
    if (why == NULL)
        return DP_OK;
    return dp__fail(d, DP_EINVAL, "'%s': %s", dp__quote_bytes(s, len, 48, q, sizeof q),
                    why);
}

size_t
dp__key_format(uint64_t gidx, const char *field, size_t field_len, char *out)
{
    /* Decimal digits, last first (snprintf costs more than the rest of a put's
     * per-entry work). */
    char digits[DP_GIDX_MAX_DIGITS];
    size_t nd = 0;
    do {
        digits[sizeof digits - ++nd] = (char)('0' + gidx % 10);
        gidx /= 10;
    } while (gidx != 0);
    memcpy(out, digits + sizeof digits - nd, nd);
    out[nd] = '@';
    memcpy(out + nd + 1, field, field_len);
    out[nd + 1 + field_len] = '\0';
    return nd + 1 + field_len;
}

int
dp__key_make(uint64_t gidx, const char *field, size_t field_len, char *out, size_t cap,
             size_t *key_len, dp_detail *d)
{
    if (out != NULL && cap > 0)
        out[0] = '\0';
    int rc = dp__field_check(field, field_len, d);
    if (rc != DP_OK)
        return rc;
    size_t nd = 1;
    for (uint64_t g = gidx; g >= 10; g /= 10)
        nd++;
    size_t need = nd + 1 + field_len;
    if (out == NULL || cap < need + 1)
        return dp__fail(d, DP_EINVAL,
                        "key buffer of %zu bytes is too small for %zu bytes",
                        out == NULL ? (size_t)0 : cap, need + 1);
    dp__key_format(gidx, field, field_len, out);
    if (key_len != NULL)
        *key_len = need;
    return DP_OK;
}

int
dp__key_split(const char *key, size_t len, dp__key_parts *parts, dp_detail *d)
{
    char q[80], why[128];
    if (key == NULL && len > 0)
        return dp__fail(d, DP_EINVAL, "key is NULL");
    if (len > DP_KEY_MAX)
        return dp__fail(d, DP_EINVAL, "key '%s': %zu bytes long, longer than %d",
                        dp__quote_bytes(key, len, 48, q, sizeof q), len, DP_KEY_MAX);
    const char *at = len > 0 ? memchr(key, '@', len) : NULL;
    if (at == NULL)
        return dp__fail(d, DP_EINVAL, "key '%s': no '@' between gidx and field",
                        dp__quote_bytes(key, len, 48, q, sizeof q));
    size_t glen = (size_t)(at - key);
    uint64_t gidx = 0;
    const char *gwhy = gidx_problem(key, glen, &gidx);
    if (gwhy != NULL)
        return dp__fail(d, DP_EINVAL, "key '%s': %s",
                        dp__quote_bytes(key, len, 48, q, sizeof q), gwhy);
    const char *field = at + 1;
    size_t flen = len - glen - 1;
    if (field_problem(field, flen, why, sizeof why))
        return dp__fail(d, DP_EINVAL, "key '%s': %s",
                        dp__quote_bytes(key, len, 48, q, sizeof q), why);
    parts->gidx = gidx;
    parts->field = field;
    parts->field_len = flen;
    return DP_OK;
}

int
dp__key_split_z(const char *key, size_t *len, dp__key_parts *parts, dp_detail *d)
{
    /*
     * One pass for the usual key: up to 19 digits (no overflow, no leading
     * zero), '@', then printable ASCII but '@' up to the NUL. Anything else
     * (UTF-8 fields, 20 digits, every error) takes the full check.
     */
    const unsigned char *p = (const unsigned char *)key;
    uint64_t v = 0;
    size_t i = 0;
    for (unsigned dg; i < DP_GIDX_MAX_DIGITS - 1 && (dg = p[i] - (unsigned)'0') <= 9; i++)
        v = v * 10 + dg;
    if (i > 0 && p[i] == '@' && (p[0] != '0' || i == 1)) {
        size_t f = i + 1, j = f;
        while (p[j] - 0x20u < 0x5fu && p[j] != '@') /* stops at the NUL */
            j++;
        if (p[j] == '\0' && j > f && j - f <= DP_FIELD_MAX) {
            *len = j;
            parts->gidx = v;
            parts->field = key + f;
            parts->field_len = j - f;
            return DP_OK;
        }
    }
    *len = strlen(key);
    return dp__key_split(key, *len, parts, d);
}

int
dp_key_check(const char *key, size_t len, uint64_t *gidx, dp_detail *d)
{
    if (key == NULL)
        return dp__fail(d, DP_EINVAL, "key: NULL");
    dp__key_parts kp;
    int rc = dp__key_split(key, len, &kp, d);
    if (rc == DP_OK && gidx != NULL)
        *gidx = kp.gidx;
    return rc;
}
