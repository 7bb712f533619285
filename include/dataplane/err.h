/*
 * dataplane error model.
 *
 * Every function that can fail returns an int from dp_err: 0 is success, any
 * other value names what went wrong. Results come back through out-parameters.
 * A failing function may also fill a caller-provided dp_detail with a sentence
 * that says what was wrong (which key, which unit, which limit) and what to do.
 *
 * The codes, their numbers, names and messages come from one X-macro list, so
 * the enum, dp_strerror() and dp_errname() can never disagree.
 *
 * Threads: everything here is reentrant; a dp_detail belongs to one thread at a
 * time (the caller's).
 */
#ifndef DATAPLANE_ERR_H
#define DATAPLANE_ERR_H

#include <stdarg.h> /* kept: programs built against earlier headers may rely on it */
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#ifndef DP_API
#define DP_API __attribute__((visibility("default")))
#endif

/*
 * X(name, value, message). Every value is written out and never changes: a
 * code keeps its number when codes are added, removed or reordered (new codes
 * take the next free number; a removed code's number is never reused).
 *
 * The numbers are 8001..8999 (DP_ERR_FIRST..DP_ERR_LAST), outside errno's
 * range: Linux's system call interface cannot carry an errno above 4095
 * (MAX_ERRNO; user-visible values stop near 133), so neither an errno that
 * slips through (ENOMEM, 12) nor a negated one (-12, or a stray -1) can be
 * mistaken for a dp_err. They are positive so `rc != 0` tests and int status
 * arrays work unchanged. errno itself travels in dp_detail.sys_errno, under
 * DP_ESYS.
 */
#define DP_ERRORS(X)                                                                     \
    X(DP_EINVAL, 8001, "invalid argument")                                               \
    X(DP_ENOMEM, 8002, "out of memory")                                                  \
    X(DP_ETIMEDOUT, 8003, "timed out")                                                   \
    X(DP_EUNITFULL, 8004, "storage unit full")                                           \
    X(DP_EBUSY, 8005, "busy, retry later")                                               \
    X(DP_ELOST, 8006, "data no longer held")                                             \
    X(DP_EPROTO, 8007, "protocol error")                                                 \
    X(DP_ETRANSFER, 8008, "transfer failed")                                             \
    X(DP_EFATAL, 8009, "process poisoned by unfinished transfers")                       \
    X(DP_EPOLICY, 8010, "transport policy violated")                                     \
    X(DP_ECLOSED, 8011, "object closed")                                                 \
    X(DP_ESYS, 8012, "system call failed")                                               \
    X(DP_ETOOBIG, 8013, "size limit exceeded")                                           \
    X(DP_ENOTFOUND, 8014, "not found")                                                   \
    X(DP_EEXIST, 8015, "already exists")                                                 \
    X(DP_ECORRUPT, 8016, "data corrupted")                                               \
    X(DP_EUNSUPPORTED, 8017, "not supported")                                            \
    X(DP_ECANCELED, 8018, "canceled")                                                    \
    X(DP_ERESTARTED, 8019, "storage unit restarted")

/* The range reserved for dp_err codes (not every number in it is a code). */
#define DP_ERR_FIRST 8001
#define DP_ERR_LAST 8999

typedef enum dp_err {
    DP_OK = 0,
#define DP_ERR_ENUM_(name, value, msg) name = value,
    DP_ERRORS(DP_ERR_ENUM_)
#undef DP_ERR_ENUM_
} dp_err;

/*
 * The message for code (never NULL). Any int is accepted: a number that is no
 * dp_err (an errno, a code of a newer library) gets "unknown error code".
 * Threads: any.
 */
DP_API const char *dp_strerror(int code);

/* The symbolic name of code, e.g. "DP_EINVAL"; "DP_E?" for an unknown number. */
DP_API const char *dp_errname(int code);

/* Size of the text a dp_detail carries, including the terminating NUL. */
#define DP_DETAIL_MAX 512

/*
 * What a failed call says about its failure. Caller-owned; pass NULL where the
 * detail is not wanted. A call that succeeds leaves it untouched. Its layout
 * is fixed for good (it does not grow: see docs/design.md, "API growth").
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
 * Memory the library hands out as plain bytes (the metadata of
 * dp_direct_publish) is freed with dp_free, never with the caller's free(): a
 * caller (a language binding, a program built with another C runtime) may not
 * share the library's allocator. Objects the library returns have their own
 * destroy functions (dp_values_destroy, dp_client_stats_destroy...). NULL
 * allowed. Threads: any.
 */
DP_API void dp_free(void *p);

#ifdef __cplusplus
}
#endif
#endif
