/*
 * dataplane error model.
 *
 * Every function that can fail returns an int from dp_err: 0 is success, any
 * other value names what went wrong. Results come back through out-parameters.
 * A failing function may also fill a caller-provided dp_detail with a sentence
 * that says what was wrong (which key, which unit, which limit) and what to do.
 *
 * The codes, their names and their messages come from one X-macro list, so the
 * enum, dp_strerror() and dp_errname() can never disagree.
 *
 * Threads: everything here is reentrant; a dp_detail belongs to one thread at a
 * time (the caller's).
 */
#ifndef DATAPLANE_ERR_H
#define DATAPLANE_ERR_H

#include <stdarg.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#ifndef DP_API
#define DP_API __attribute__((visibility("default")))
#endif

/* X(name, message) */
#define DP_ERRORS(X)                                                                     \
    X(DP_EINVAL, "invalid argument")                                                     \
    X(DP_ENOMEM, "out of memory")                                                        \
    X(DP_ETIMEDOUT, "timed out")                                                         \
    X(DP_EUNITFULL, "storage unit full")                                                 \
    X(DP_EBUSY, "busy, retry later")                                                     \
    X(DP_ELOST, "data no longer held")                                                   \
    X(DP_EPROTO, "protocol error")                                                       \
    X(DP_ETRANSFER, "transfer failed")                                                   \
    X(DP_EFATAL, "process poisoned by unfinished transfers")                             \
    X(DP_EPOLICY, "transport policy violated")                                           \
    X(DP_ECLOSED, "object closed")                                                       \
    X(DP_ESYS, "system call failed")                                                     \
    X(DP_ETOOBIG, "size limit exceeded")                                                 \
    X(DP_ENOTFOUND, "not found")                                                         \
    X(DP_EEXIST, "already exists")                                                       \
    X(DP_ECORRUPT, "data corrupted")                                                     \
    X(DP_EUNSUPPORTED, "not supported")                                                  \
    X(DP_ECANCELED, "canceled")                                                          \
    X(DP_ERESTARTED, "storage unit restarted")

typedef enum dp_err {
    DP_OK = 0,
#define DP_ERR_ENUM_(name, msg) name,
    DP_ERRORS(DP_ERR_ENUM_)
#undef DP_ERR_ENUM_
        DP_ERR_COUNT_
} dp_err;

/* The message for code (never NULL; unknown codes get a generic text). */
DP_API const char *dp_strerror(int code);

/* The symbolic name of code, e.g. "DP_EINVAL" (never NULL). */
DP_API const char *dp_errname(int code);

/* Size of the text a dp_detail carries, including the terminating NUL. */
#define DP_DETAIL_MAX 512

/*
 * What a failed call says about its failure. Caller-owned; pass NULL where the
 * detail is not wanted. A call that succeeds leaves it untouched.
 */
typedef struct dp_detail {
    int code;      /* the dp_err of the failure that filled it, 0 if none */
    int sys_errno; /* errno for DP_ESYS (and for other codes caused by a syscall) */
    char msg[DP_DETAIL_MAX];
} dp_detail;

/* Empty d (NULL allowed). */
DP_API void dp_detail_clear(dp_detail *d);

/* d's message, or "" when d is NULL or empty. */
DP_API const char *dp_detail_msg(const dp_detail *d);

/*
 * Record a failure in d (NULL allowed) and return code, so a caller writes
 * `return dp_fail(d, DP_EINVAL, "nbytes %zu > area %zu", n, cap);`.
 */
DP_API int dp_fail(dp_detail *d, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
DP_API int dp_vfail(dp_detail *d, int code, const char *fmt, va_list ap);

/* Record DP_ESYS with err_no kept and strerror(err_no) appended. Returns DP_ESYS. */
DP_API int dp_fail_sys(dp_detail *d, int err_no, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/*
 * Prefix d's message with context ("unit 3: " + old message) and return d's code
 * (or fallback when d is NULL or empty). Use when passing an inner failure up.
 */
DP_API int dp_fail_ctx(dp_detail *d, int fallback, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#ifdef __cplusplus
}
#endif
#endif
