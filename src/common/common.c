/*
 * Assertions, clocks, logging, growable buffers, size parsing, the id rule
 * and random ids: the small pieces every module uses.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "common.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

void
dp__assert_fail(const char *expr, const char *file, int line, const char *func)
{
    fprintf(stderr, "dataplane: assertion failed: %s (%s:%d, %s)\n", expr, file, line,
            func);
    abort();
}

uint64_t
dp__now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

double
dp__now_s(void)
{
    return (double)dp__now_ns() / 1e9;
}

uint64_t
dp__splitmix64(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

uint64_t
dp__ver_now(void)
{
    double us = (dp__wall_s() - DP__VER_EPOCH_S) * 1e6;
    return (us > 0 ? (uint64_t)us : 0) << DP__VER_SALT_BITS;
}

double
dp__wall_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

int
dp__nofile_raise(uint64_t want, uint64_t *soft, uint64_t *hard)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
        return DP_ESYS;
    rlim_t to = want == 0 ? rl.rlim_max : (rlim_t)want;
    if (to > rl.rlim_max)
        to = rl.rlim_max;
    if (to > rl.rlim_cur) {
        struct rlimit nl = {.rlim_cur = to, .rlim_max = rl.rlim_max};
        if (setrlimit(RLIMIT_NOFILE, &nl) == 0)
            rl.rlim_cur = to;
    }
    if (soft != NULL)
        *soft = (uint64_t)rl.rlim_cur;
    if (hard != NULL)
        *hard = (uint64_t)rl.rlim_max;
    if (want != 0 && (uint64_t)rl.rlim_cur < want)
        return rl.rlim_max < (rlim_t)want ? DP_EINVAL : DP_ESYS;
    return DP_OK;
}

void
dp__sleep_s(double seconds)
{
    if (!(seconds > 0))
        return;
    struct timespec ts;
    ts.tv_sec = (time_t)seconds;
    ts.tv_nsec = (long)((seconds - (double)ts.tv_sec) * 1e9);
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

double
dp__left_s(double deadline)
{
    double l = deadline - dp__now_s();
    return l > 0 ? l : 0;
}

double
dp__backoff_step(double first, double max, unsigned k)
{
    double w = first;
    for (unsigned i = 0; i < k && w < max; i++)
        w *= 2;
    return w < max ? w : max;
}

void
dp__backoff_sleep(double *step, double max, double deadline)
{
    dp__sleep_s(DP_MIN(*step, dp__left_s(deadline)));
    *step = DP_MIN(*step * 2, max);
}

/* ---- logging ---- */

static int log_level = -1;
static char log_prefix[64];
static pthread_mutex_t log_mu = PTHREAD_MUTEX_INITIALIZER;

static int
log_level_get(void)
{
    int lv = __atomic_load_n(&log_level, __ATOMIC_RELAXED);
    if (lv >= 0)
        return lv;
    lv = DP_LOG_INFO;
    const char *e = getenv("DP_LOG_LEVEL");
    if (e != NULL) {
        if (strcasecmp(e, "error") == 0)
            lv = DP_LOG_ERROR;
        else if (strcasecmp(e, "warn") == 0)
            lv = DP_LOG_WARN;
        else if (strcasecmp(e, "debug") == 0)
            lv = DP_LOG_DEBUG;
    }
    __atomic_store_n(&log_level, lv, __ATOMIC_RELAXED);
    return lv;
}

bool
dp__log_enabled(int level)
{
    return level <= log_level_get();
}

void
dp__log_set_level(int level)
{
    __atomic_store_n(&log_level, level, __ATOMIC_RELAXED);
}

void
dp__log_set_prefix(const char *prefix)
{
    pthread_mutex_lock(&log_mu);
    snprintf(log_prefix, sizeof log_prefix, "%s", prefix ? prefix : "");
    pthread_mutex_unlock(&log_mu);
}

void
dp__log(int level, const char *fmt, ...)
{
    if (!dp__log_enabled(level))
        return;
    static const char *const names[] = {"error", "warn", "info", "debug"};
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&log_mu);
    if (log_prefix[0] != '\0')
        fprintf(stderr, "dataplane[%s] %s: %s\n", log_prefix, names[level & 3], line);
    else
        fprintf(stderr, "dataplane %s: %s\n", names[level & 3], line);
    pthread_mutex_unlock(&log_mu);
}

/* ---- growable buffer ---- */

void
dp__buf_init(dp__buf *b)
{
    memset(b, 0, sizeof *b);
}

void
dp__buf_fini(dp__buf *b)
{
    free(b->data);
    memset(b, 0, sizeof *b);
}

void
dp__buf_reset(dp__buf *b)
{
    b->len = 0;
    b->oom = false;
}

int
dp__buf_reserve(dp__buf *b, size_t extra)
{
    if (b->oom)
        return DP_ENOMEM;
    if (extra <= b->cap - b->len)
        return DP_OK;
    if (extra > SIZE_MAX / 2 - b->len) {
        b->oom = true;
        return DP_ENOMEM;
    }
    size_t want = b->len + extra;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < want)
        cap *= 2;
    uint8_t *p = realloc(b->data, cap);
    if (p == NULL) {
        b->oom = true;
        return DP_ENOMEM;
    }
    b->data = p;
    b->cap = cap;
    return DP_OK;
}

int
dp__buf_append(dp__buf *b, const void *p, size_t n)
{
    if (n == 0)
        return b->oom ? DP_ENOMEM : DP_OK;
    int rc = dp__buf_reserve(b, n);
    if (rc != DP_OK)
        return rc;
    memcpy(b->data + b->len, p, n);
    b->len += n;
    return DP_OK;
}

int
dp__buf_printf(dp__buf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0)
        return DP_EINVAL;
    int rc = dp__buf_reserve(b, (size_t)n + 1);
    if (rc != DP_OK)
        return rc;
    va_start(ap, fmt);
    vsnprintf((char *)b->data + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
    return DP_OK;
}

uint8_t *
dp__buf_steal(dp__buf *b, size_t *len)
{
    uint8_t *p = b->data;
    if (len != NULL)
        *len = b->len;
    memset(b, 0, sizeof *b);
    return p;
}

/* ---- parsing ---- */

int
dp__parse_u64(const char *s, uint64_t lo, uint64_t hi, uint64_t *out, const char *what,
              dp_detail *d)
{
    if (s == NULL || *s == '\0')
        return dp__fail(d, DP_EINVAL, "%s: empty value, expected a number", what);
    uint64_t v = 0;
    for (const char *p = s; *p; p++) {
        if (*p < '0' || *p > '9')
            return dp__fail(d, DP_EINVAL, "%s: '%s' is not an unsigned decimal number",
                            what, s);
        unsigned dig = (unsigned)(*p - '0');
        if (v > (UINT64_MAX - dig) / 10)
            return dp__fail(d, DP_EINVAL, "%s: '%s' is out of range", what, s);
        v = v * 10 + dig;
    }
    if (v < lo || v > hi)
        return dp__fail(d, DP_EINVAL, "%s: %llu is outside [%llu, %llu]", what,
                        (unsigned long long)v, (unsigned long long)lo,
                        (unsigned long long)hi);
    *out = v;
    return DP_OK;
}

int
dp__parse_size(const char *s, uint64_t *out, const char *what, dp_detail *d)
{
    if (s == NULL || *s == '\0')
        return dp__fail(d, DP_EINVAL, "%s: empty size, expected e.g. 512M or 4G", what);
    if (!isdigit((unsigned char)s[0]))
        return dp__fail(d, DP_EINVAL,
                        "%s: '%s' is not a size (expected digits with an optional "
                        "K/M/G/T suffix, e.g. 512M)",
                        what, s);
    errno = 0;
    char *end = NULL;
    double v = strtod(s, &end);
    if (errno != 0 || end == s || !isfinite(v) || v < 0)
        return dp__fail(d, DP_EINVAL, "%s: '%s' is not a size", what, s);
    double mult = 1;
    const char *u = end;
    switch (toupper((unsigned char)*u)) {
    case '\0':
        break;
    case 'B':
        u++;
        break;
    case 'K':
        mult = 1024.0;
        u++;
        break;
    case 'M':
        mult = 1024.0 * 1024;
        u++;
        break;
    case 'G':
        mult = 1024.0 * 1024 * 1024;
        u++;
        break;
    case 'T':
        mult = 1024.0 * 1024 * 1024 * 1024;
        u++;
        break;
    default:
        return dp__fail(d, DP_EINVAL, "%s: '%s' has an unknown unit (use K, M, G or T)",
                        what, s);
    }
    if (mult > 1) {
        if (*u == 'i' || *u == 'I')
            u++;
        if (*u == 'b' || *u == 'B')
            u++;
    }
    if (*u != '\0')
        return dp__fail(d, DP_EINVAL, "%s: '%s' has trailing characters", what, s);
    double bytes = v * mult;
    if (bytes >= 18446744073709551615.0)
        return dp__fail(d, DP_EINVAL, "%s: '%s' is too large", what, s);
    if (bytes != floor(bytes))
        return dp__fail(d, DP_EINVAL, "%s: '%s' is not a whole number of bytes", what, s);
    *out = (uint64_t)bytes;
    return DP_OK;
}

int
dp__parse_seconds(const char *s, double *out, const char *what, dp_detail *d)
{
    if (s == NULL || *s == '\0')
        return dp__fail(d, DP_EINVAL, "%s: empty value, expected seconds", what);
    errno = 0;
    char *end = NULL;
    double v = strtod(s, &end);
    if (errno != 0 || end == s || *end != '\0' || !isfinite(v) || v < 0 ||
        !isdigit((unsigned char)s[0]))
        return dp__fail(d, DP_EINVAL, "%s: '%s' is not a non-negative number of seconds",
                        what, s);
    *out = v;
    return DP_OK;
}

const char *
dp__fmt_size(uint64_t n, char *buf, size_t len)
{
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)n;
    unsigned i = 0;
    while (v >= 1024 && i + 1 < DP_ARRAY_LEN(units)) {
        v /= 1024;
        i++;
    }
    if (i == 0)
        snprintf(buf, len, "%llu B", (unsigned long long)n);
    else
        snprintf(buf, len, "%.2f %s", v, units[i]);
    return buf;
}

const char *
dp__fmt_memlock(char *buf, size_t len)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_MEMLOCK, &rl) != 0)
        snprintf(buf, len, "unknown");
    else if (rl.rlim_cur == RLIM_INFINITY)
        snprintf(buf, len, "unlimited");
    else
        dp__fmt_size((uint64_t)rl.rlim_cur, buf, len);
    return buf;
}

/* ---- ids ---- */

/* [A-Za-z0-9_.:-] as a bitmap over bytes 0..127: '-' '.' '0'-'9' ':' in the
 * first word, 'A'-'Z' '_' 'a'-'z' in the second. */
static const uint64_t id_bits[2] = {0x07ff600000000000ull, 0x07fffffe87fffffeull};

size_t
dp__id_bad_byte(const char *p, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)p[i];
        if (ch >= 128 || !((id_bits[ch >> 6] >> (ch & 63)) & 1))
            return i;
    }
    return n;
}

bool
dp__id_valid(const char *p, size_t n, size_t max)
{
    return n >= 1 && n <= max && dp__id_bad_byte(p, n) == n;
}

int
dp__random_bytes(void *p, size_t n, dp_detail *d)
{
    uint8_t *q = p;
    while (n > 0) {
        ssize_t r = getrandom(q, n, 0);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return dp__fail_sys(d, errno, "getrandom(%zu bytes)", n);
        }
        q += r;
        n -= (size_t)r;
    }
    return DP_OK;
}

int
dp__random_hex_id(char out[33], dp_detail *d)
{
    uint8_t raw[16];
    int rc = dp__random_bytes(raw, sizeof raw, d);
    if (rc != DP_OK)
        return rc;
    static const char hex[] = "0123456789abcdef";
    for (size_t i = 0; i < sizeof raw; i++) {
        out[2 * i] = hex[raw[i] >> 4];
        out[2 * i + 1] = hex[raw[i] & 15];
    }
    out[32] = '\0';
    return DP_OK;
}

/* ---- host identity ---- */

static char host_key[96];
static pthread_once_t host_key_once = PTHREAD_ONCE_INIT;

static void
host_key_init(void)
{
    char boot[64] = "";
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "re");
    if (f != NULL) {
        if (fgets(boot, sizeof boot, f) == NULL)
            boot[0] = '\0';
        fclose(f);
    }
    boot[strcspn(boot, "\r\n")] = '\0';
    struct stat st;
    if (boot[0] == '\0' || stat("/proc/self/ns/pid", &st) != 0)
        return;
    snprintf(host_key, sizeof host_key, "%s/%llu", boot, (unsigned long long)st.st_ino);
}

const char *
dp__host_key(void)
{
    pthread_once(&host_key_once, host_key_init);
    return host_key;
}
