/*
 * Small shared helpers: assertions, clocks, logging, growable buffers, size
 * parsing, the id rule. Internal to the library (not installed).
 */
#ifndef DP_COMMON_H
#define DP_COMMON_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dataplane/err.h"

/*
 * Filling a dp_detail (src/common/err.c). Internal: the public API only reads
 * details (dp_detail_msg), it does not make them.
 */

/*
 * Record a failure in d (NULL allowed) and return code, so a caller writes
 * `return dp__fail(d, DP_EINVAL, "nbytes %zu > area %zu", n, cap);`.
 */
int dp__fail(dp_detail *d, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
int dp__vfail(dp_detail *d, int code, const char *fmt, va_list ap);

/* Record DP_ESYS with err_no kept and strerror(err_no) appended. Returns DP_ESYS. */
int dp__fail_sys(dp_detail *d, int err_no, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/*
 * Prefix d's message with context ("unit 3: " + old message) and return d's code
 * (or fallback when d is NULL or empty). Use when passing an inner failure up.
 */
int dp__fail_ctx(dp_detail *d, int fallback, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Append to d's message (keeps its code); cut at DP_DETAIL_MAX with "...". */
void dp__detail_append(dp_detail *d, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

#define DP_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))
#define DP_MIN(a, b) ((a) < (b) ? (a) : (b))
#define DP_MAX(a, b) ((a) > (b) ? (a) : (b))
#define DP_ALIGN_UP(x, a) (((x) + ((a)-1)) & ~((uint64_t)(a)-1))
#define DP_UNUSED(x) ((void)(x))

/*
 * Invariants that cannot fail unless the code is wrong. Never used for bad
 * input or out-of-memory: those return an error.
 */
#define DP_ASSERT(cond)                                                                  \
    do {                                                                                 \
        if (__builtin_expect(!(cond), 0))                                                \
            dp__assert_fail(#cond, __FILE__, __LINE__, __func__);                        \
    } while (0)
__attribute__((noreturn)) void dp__assert_fail(const char *expr, const char *file,
                                               int line, const char *func);

/* Clocks. Monotonic for deadlines and durations; wall only for display. */
uint64_t dp__now_ns(void); /* CLOCK_MONOTONIC, nanoseconds */
double dp__now_s(void);    /* CLOCK_MONOTONIC, seconds */
double dp__wall_s(void);   /* CLOCK_REALTIME, seconds */

/*
 * Versions of puts and clears (docs/design.md, "Versions"): microseconds
 * since 2020-01-01 UTC in the high 52 bits, a writer's salt in the low 12.
 * dp__ver_now: this host's clock as a version (salt 0).
 */
#define DP__VER_SALT_BITS 12
#define DP__VER_EPOCH_S 1577836800.0 /* 2020-01-01T00:00:00Z */
uint64_t dp__ver_now(void);
void dp__sleep_s(double seconds); /* restarts after signals until the time is spent */

/*
 * Deadlines and backoff, one way for every loop that asks again (docs/design.md,
 * "Deadlines and backoff"): a deadline is a dp__now_s() time; a wait doubles
 * from a first step up to a cap and never passes the deadline.
 */
double dp__left_s(double deadline); /* seconds until deadline, never negative */
/* The k-th wait (k = 0, 1, ...) of a backoff from first doubling up to max. */
double dp__backoff_step(double first, double max, unsigned k);
/* Sleep *step (at most until deadline), then double *step up to max. */
void dp__backoff_sleep(double *step, double max, double deadline);

/*
 * The open-file limit for a process that holds descriptors per peer (a unit:
 * one per connected client; a client: about four per unit). Raises the soft
 * limit to at least want (0: to the hard limit), never above the hard limit,
 * and never lowers it. *soft and *hard (may be NULL) get the limits after.
 * Returns DP_OK when the soft limit is now at least want, DP_EINVAL when
 * the hard limit is below want (the caller says what to do:
 * `ulimit -Hn`, LimitNOFILE=, a container's limits), DP_ESYS when the limits
 * cannot be read or set.
 */
int dp__nofile_raise(uint64_t want, uint64_t *soft, uint64_t *hard);

/* splitmix64: the next of a cheap, well-mixed sequence from *s (not for secrets). */
uint64_t dp__splitmix64(uint64_t *s);

/* Logging to stderr. Level from DP_LOG_LEVEL (error|warn|info|debug), default info. */
enum dp_log_level { DP_LOG_ERROR = 0, DP_LOG_WARN, DP_LOG_INFO, DP_LOG_DEBUG };
void dp__log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
bool dp__log_enabled(int level);
void dp__log_set_level(int level);
void dp__log_set_prefix(const char *prefix); /* e.g. "unit 3"; copied */
#define DP_LOG_E(...) dp__log(DP_LOG_ERROR, __VA_ARGS__)
#define DP_LOG_W(...) dp__log(DP_LOG_WARN, __VA_ARGS__)
#define DP_LOG_I(...) dp__log(DP_LOG_INFO, __VA_ARGS__)
#define DP_LOG_D(...)                                                                    \
    do {                                                                                 \
        if (dp__log_enabled(DP_LOG_DEBUG))                                               \
            dp__log(DP_LOG_DEBUG, __VA_ARGS__);                                          \
    } while (0)

/*
 * Growable byte buffer. Zero-initialised storage is an empty buffer. On
 * allocation failure the buffer goes into a sticky failed state (oom) and
 * later appends are no-ops, so a caller checks once at the end.
 */
typedef struct dp__buf {
    uint8_t *data;
    size_t len;
    size_t cap;
    bool oom;
} dp__buf;

void dp__buf_init(dp__buf *b);
void dp__buf_fini(dp__buf *b);
void dp__buf_reset(dp__buf *b); /* len = 0, keeps the storage, clears oom */
int dp__buf_reserve(dp__buf *b, size_t extra);
int dp__buf_append(dp__buf *b, const void *p, size_t n);
int dp__buf_printf(dp__buf *b, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Hand the bytes to the caller (free() them); the buffer becomes empty. */
uint8_t *dp__buf_steal(dp__buf *b, size_t *len);

/*
 * Parse "123", "64K", "1.5G", "2GiB", "512MB" (binary units: K = 1024) into bytes.
 * Rejects signs, junk, overflow. what names the value in the error ("--slab").
 */
int dp__parse_size(const char *s, uint64_t *out, const char *what, dp_detail *d);
/* Parse a non-negative finite decimal number of seconds. */
int dp__parse_seconds(const char *s, double *out, const char *what, dp_detail *d);
/* Parse an unsigned decimal integer in [lo, hi]. */
int dp__parse_u64(const char *s, uint64_t lo, uint64_t hi, uint64_t *out,
                  const char *what, dp_detail *d);
/* Format bytes as "1.50 GiB" into buf (at least 32 bytes); returns buf. */
const char *dp__fmt_size(uint64_t n, char *buf, size_t len);
/*
 * This process's RLIMIT_MEMLOCK (what registering memory for RDMA may pin)
 * as "unlimited", a size as dp__fmt_size writes it, or "unknown", into buf (at
 * least 32 bytes); returns buf. For the messages of failed registrations.
 */
const char *dp__fmt_memlock(char *buf, size_t len);

/*
 * The id rule, one for blob, pin, cluster and request ids: 1..max bytes of
 * [A-Za-z0-9_.:-] (no '/', NUL or control bytes: ids are made by clients and
 * end up in logs and file names). DP_ID_MAX is the usual max.
 */
#define DP_ID_MAX 64
/* Index of the first byte of p[0, n) an id may not hold, or n if there is none. */
size_t dp__id_bad_byte(const char *p, size_t n);
/* Whether p[0, n) is an id of at most max bytes. */
bool dp__id_valid(const char *p, size_t n, size_t max);

/* Random bytes from the OS (getrandom), for ids; never fails silently. */
int dp__random_bytes(void *p, size_t n, dp_detail *d);
/* A fresh random id as 32 lowercase hex chars + NUL into out[33]. */
int dp__random_hex_id(char out[33], dp_detail *d);

/*
 * This process's host key: the kernel's boot id and the inode of its pid
 * namespace ("<boot id>/<inode>"), so two processes with the same key run on
 * one kernel and see each other's pids. "" if /proc cannot tell (then no
 * process is ever taken to be on this host). Computed once; thread-safe.
 */
const char *dp__host_key(void);

#endif
