/*
 * The base of the public API (include/dataplane/err.h, version.h): error
 * codes and detail strings, the library's version, and dp_free. The dp__fail
 * helpers that fill details are internal (common/common.h).
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "dataplane/version.h"

/*
 * Codes are sparse numbers (err.h): a switch generated from the list, never
 * an array indexed by code, so any int is safe to ask about.
 */
const char *
dp_strerror(int code)
{
    switch (code) {
    case DP_OK:
        return "success";
#define DP_ERR_MSG_(name, value, msg)                                                    \
    case name:                                                                           \
        return msg;
        DP_ERRORS(DP_ERR_MSG_)
#undef DP_ERR_MSG_
    default:
        return "unknown error code";
    }
}

const char *
dp_errname(int code)
{
    switch (code) {
    case DP_OK:
        return "DP_OK";
#define DP_ERR_NAME_(name, value, msg)                                                   \
    case name:                                                                           \
        return #name;
        DP_ERRORS(DP_ERR_NAME_)
#undef DP_ERR_NAME_
    default:
        return "DP_E?";
    }
}

unsigned int
dp_version(void)
{
    return DP_VERSION_HEX;
}

const char *
dp_version_string(void)
{
    return DP_VERSION_STRING;
}

void
dp_free(void *p)
{
    free(p);
}

void
dp_detail_clear(dp_detail *d)
{
    if (d == NULL)
        return;
    d->code = 0;
    d->sys_errno = 0;
    d->msg[0] = '\0';
}

const char *
dp_detail_msg(const dp_detail *d)
{
    return d == NULL ? "" : d->msg;
}

int
dp__vfail(dp_detail *d, int code, const char *fmt, va_list ap)
{
    if (d == NULL)
        return code;
    d->code = code;
    d->sys_errno = 0;
    if (fmt == NULL)
        snprintf(d->msg, sizeof d->msg, "%s", dp_strerror(code));
    else
        vsnprintf(d->msg, sizeof d->msg, fmt, ap);
    return code;
}

int
dp__fail(dp_detail *d, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    dp__vfail(d, code, fmt, ap);
    va_end(ap);
    return code;
}

int
dp__fail_sys(dp_detail *d, int err_no, const char *fmt, ...)
{
    if (d == NULL)
        return DP_ESYS;
    va_list ap;
    va_start(ap, fmt);
    dp__vfail(d, DP_ESYS, fmt, ap);
    va_end(ap);
    size_t n = strlen(d->msg);
    if (n < sizeof d->msg)
        snprintf(d->msg + n, sizeof d->msg - n, ": %s", strerror(err_no));
    d->sys_errno = err_no;
    return DP_ESYS;
}

void
dp__detail_append(dp_detail *d, const char *fmt, ...)
{
    if (d == NULL)
        return;
    size_t n = strnlen(d->msg, sizeof d->msg);
    if (n + 1 >= sizeof d->msg)
        return;
    va_list ap;
    va_start(ap, fmt);
    int w = vsnprintf(d->msg + n, sizeof d->msg - n, fmt, ap);
    va_end(ap);
    if (w > 0 && (size_t)w >= sizeof d->msg - n && sizeof d->msg > 4)
        memcpy(d->msg + sizeof d->msg - 4, "...", 4);
}

int
dp__fail_ctx(dp_detail *d, int fallback, const char *fmt, ...)
{
    if (d == NULL)
        return fallback;
    if (d->code == 0) {
        d->code = fallback;
        snprintf(d->msg, sizeof d->msg, "%s", dp_strerror(fallback));
    }
    char prefix[DP_DETAIL_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    /* d->msg = prefix + ": " + d->msg, cut to fit. */
    size_t plen = strlen(prefix), mlen = strlen(d->msg);
    if (plen > sizeof d->msg - 3)
        plen = sizeof d->msg - 3;
    if (plen + 2 + mlen > sizeof d->msg - 1)
        mlen = sizeof d->msg - 1 - plen - 2;
    memmove(d->msg + plen + 2, d->msg, mlen);
    memcpy(d->msg, prefix, plen);
    d->msg[plen] = ':';
    d->msg[plen + 1] = ' ';
    d->msg[plen + 2 + mlen] = '\0';
    return d->code;
}
