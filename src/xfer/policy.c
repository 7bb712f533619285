/*
 * The RDMA-only transport policy: read UCX_TLS and UCX_NET_DEVICES the way
 * UCX 1.13 reads them and refuse any setting under which UCX could move data
 * over TCP (see policy.h for the rule and the API). Pure string work: no UCX
 * headers, no allocation, any input bytes.
 *
 * Design notes
 *
 * How UCX 1.13 reads UCX_TLS (measured with ucx_info 1.13.1 on the development
 * machine, and read in ucp_context.c and the ucs config parser):
 *   - A leading '^' makes the list an exclusion list. If the first item is
 *     "all" the value means every transport, also after '^' ("^all" = all);
 *     "all" followed by other items is a configuration error. "all" in any
 *     other position is just an unknown name.
 *   - Items are split at ','; empty items are skipped (",tcp" = "tcp"), so an
 *     empty value, "," or "^" is an empty list, which ucp_init() refuses.
 *   - Names match exactly: case-sensitive ("TCP" and "SM" are not transports),
 *     no trimming (" tcp" is not tcp), no wildcards ("t*" matches nothing). An
 *     item that matches nothing is ignored with a warning.
 *   - Item forms: "name", "name:aux" (use the transport only for wire-up
 *     messages), "\name" (the transport called name, aliases not expanded),
 *     "\name:aux". In an exclusion list all four forms of tcp remove tcp.
 *   - Aliases (ucp_tl_aliases in ucp_context.c):
 *       sm, shm  -> posix, sysv, xpmem, knem, cma (every shared-memory one)
 *       mm       -> posix, sysv, xpmem (the memory mappers only)
 *       ib       -> rc_verbs, ud_verbs, rc_mlx5, ud_mlx5, dc_mlx5 (all IB)
 *       rc       -> rc_mlx5 + rc_verbs (ud_mlx5/ud_verbs as wire-up aux)
 *       rc_x     -> rc_mlx5 (ud_mlx5 aux);   rc_v -> rc_verbs (ud_verbs aux)
 *       ud       -> ud_mlx5 + ud_verbs;      ud_x -> ud_mlx5; ud_v -> ud_verbs
 *       dc, dc_x -> dc_mlx5 (ud_mlx5 aux)
 *       cuda     -> cuda_copy, cuda_ipc, gdr_copy
 *       rocm     -> rocm_copy, rocm_ipc, rocm_gdr
 *       ugni     -> ugni_smsg, ugni_rdma (ugni_udt aux)
 *     No alias contains tcp: only an item naming tcp itself enables it.
 *
 * How UCX 1.13 reads UCX_NET_DEVICES: split at ',', empty items skipped,
 * exact names; "all" anywhere in the list means every network device; an
 * empty list enables no network device at all; no '^' and no wildcards.
 * RDMA ports are called <ibdev>:<port> (mlx5_0:1) and TCP devices by their
 * interface name (eth0). Linux interface names cannot contain ':', so an item
 * of the form <dev>:<port> can never select a TCP device.
 *
 * Decisions where the seed leaves room:
 *   - Known names only. A transport counts as RDMA only if it is one of the
 *     UCX 1.13 rc/dc/ud/ib names in tl_names[] below, not merely a name with
 *     that prefix: "udp" starts with "ud", and an unknown name is ignored by
 *     UCX, so it cannot make the list "contain an RDMA transport". Unknown
 *     names (including ugni, Cray's RDMA, which the seed does not list) are
 *     rejected by name: they could be a TCP alias in another UCX build.
 *   - GPU copy transports (cuda*, rocm*, gdr_copy) are accepted as same-host
 *     helpers: they never carry bytes between hosts, and GPU nodes commonly
 *     set them for other UCX users in the same process (weight refit).
 *   - An item UCX would not match as written (upper case, spaces) is rejected
 *     with the spelling to use, even when its meaning is harmless: UCX would
 *     silently drop it, so what runs would not be what the user asked for.
 *     Items that spell tcp or all in any case are rejected as tcp or all.
 *   - "name:aux" items are allowed, but an RDMA transport marked :aux does not
 *     satisfy "at least one RDMA transport": it only carries wire-up.
 *   - "\name" must name a transport, not an alias ("\rc" matches nothing).
 *   - An exclusion list must name tcp exactly as UCX matches it ("^TCP" and
 *     "^ tcp" exclude nothing); "all" anywhere in it is rejected ("^all" is
 *     every transport in UCX 1.13).
 *   - UCX_NET_DEVICES: "all" is rejected (it includes netdevs), and so is an
 *     empty value (UCX would use no network device, so no RDMA either). The
 *     port must be a decimal 1-255 written as UCX writes it (no leading 0).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "xfer/policy.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"

/* Longest item and value quoted in a message; longer ones end in "...". */
#define TOKEN_SHOW_MAX 48
#define VALUE_SHOW_MAX 96
/* Linux IB_DEVICE_NAME_MAX is 64 including the NUL. */
#define IBDEV_NAME_MAX 63

#define TLS_EXAMPLE "UCX_TLS=rc,sm,self"
#define NETDEV_EXAMPLE "UCX_NET_DEVICES=mlx5_0:1"

enum tl_kind { TL_RDMA, TL_SAMEHOST, TL_GPU };

struct tl_name {
    const char *name;
    enum tl_kind kind;
    bool alias; /* an alias, not a transport: "\name" matches nothing */
};

/* Every UCX 1.13 transport and alias this policy accepts (see Design notes). */
static const struct tl_name tl_names[] = {
    {"ib", TL_RDMA, true},         {"rc", TL_RDMA, true},
    {"rc_v", TL_RDMA, true},       {"rc_x", TL_RDMA, true},
    {"rc_verbs", TL_RDMA, false},  {"rc_mlx5", TL_RDMA, false},
    {"ud", TL_RDMA, true},         {"ud_v", TL_RDMA, true},
    {"ud_x", TL_RDMA, true},       {"ud_verbs", TL_RDMA, false},
    {"ud_mlx5", TL_RDMA, false},   {"dc", TL_RDMA, true},
    {"dc_x", TL_RDMA, true},       {"dc_mlx5", TL_RDMA, false},
    {"self", TL_SAMEHOST, false},  {"sm", TL_SAMEHOST, true},
    {"shm", TL_SAMEHOST, true},    {"mm", TL_SAMEHOST, true},
    {"posix", TL_SAMEHOST, false}, {"sysv", TL_SAMEHOST, false},
    {"xpmem", TL_SAMEHOST, false}, {"knem", TL_SAMEHOST, false},
    {"cma", TL_SAMEHOST, false},   {"cuda", TL_GPU, true},
    {"cuda_copy", TL_GPU, false},  {"cuda_ipc", TL_GPU, false},
    {"gdr_copy", TL_GPU, false},   {"rocm", TL_GPU, true},
    {"rocm_copy", TL_GPU, false},  {"rocm_ipc", TL_GPU, false},
    {"rocm_gdr", TL_GPU, false},
};

/* A slice of an untrusted string: not NUL-terminated, any bytes. */
typedef struct span {
    const char *p;
    size_t n;
} span;

static bool
is_space(unsigned char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

static unsigned char
to_lower(unsigned char c)
{
    return (c >= 'A' && c <= 'Z') ? (unsigned char)(c - 'A' + 'a') : c;
}

static span
span_trim(span s)
{
    while (s.n > 0 && is_space((unsigned char)s.p[0])) {
        s.p++;
        s.n--;
    }
    while (s.n > 0 && is_space((unsigned char)s.p[s.n - 1]))
        s.n--;
    return s;
}

static bool
span_eq(span s, const char *lit)
{
    size_t n = strlen(lit);
    return s.n == n && memcmp(s.p, lit, n) == 0;
}

static bool
span_ieq(span s, const char *lit)
{
    size_t n = strlen(lit);
    if (s.n != n)
        return false;
    for (size_t i = 0; i < n; i++)
        if (to_lower((unsigned char)s.p[i]) != (unsigned char)lit[i])
            return false;
    return true;
}

/* lit must be lower case. */
static bool
span_icontains(span s, const char *lit)
{
    size_t n = strlen(lit);
    for (size_t i = 0; n <= s.n && i <= s.n - n; i++)
        if (span_ieq((span){s.p + i, n}, lit))
            return true;
    return false;
}

static bool
span_has_upper(span s)
{
    for (size_t i = 0; i < s.n; i++)
        if (s.p[i] >= 'A' && s.p[i] <= 'Z')
            return true;
    return false;
}

/*
 * The next ','-separated item of *cur, a NUL-terminated string; *cur becomes
 * NULL after the last item. Empty items are returned too: callers skip them
 * as UCX does.
 */
static bool
next_item(const char **cur, span *item)
{
    const char *p = *cur;
    if (p == NULL)
        return false;
    const char *comma = strchr(p, ',');
    if (comma == NULL) {
        *item = (span){p, strlen(p)};
        *cur = NULL;
    } else {
        *item = (span){p, (size_t)(comma - p)};
        *cur = comma + 1;
    }
    return true;
}

/*
 * One UCX_TLS item taken apart: [\]base[:suffix]. aux is set for the suffix
 * "aux" exactly (UCX compares it case-sensitively too).
 */
typedef struct tl_item {
    span base;
    span suffix;
    bool strict;
    bool has_suffix;
    bool aux;
} tl_item;

static tl_item
tl_item_parse(span s)
{
    tl_item it = {0};
    if (s.n > 0 && s.p[0] == '\\') {
        it.strict = true;
        s.p++;
        s.n--;
    }
    const char *colon = s.n > 0 ? memchr(s.p, ':', s.n) : NULL;
    if (colon == NULL) {
        it.base = s;
    } else {
        size_t at = (size_t)(colon - s.p);
        it.base = (span){s.p, at};
        it.suffix = (span){colon + 1, s.n - at - 1};
        it.has_suffix = true;
        it.aux = span_eq(it.suffix, "aux");
    }
    return it;
}

static const struct tl_name *
tl_lookup(span base)
{
    for (size_t i = 0; i < DP_ARRAY_LEN(tl_names); i++)
        if (span_eq(base, tl_names[i].name))
            return &tl_names[i];
    return NULL;
}

/*
 * A bounded text builder: appends silently stop at the end of buf, and the
 * finished text then ends in "..." so a reader sees it was cut.
 */
typedef struct text {
    char buf[DP_DETAIL_MAX];
    size_t len;
    bool cut;
} text;

static void
text_putn(text *t, const char *s, size_t n)
{
    size_t room = sizeof t->buf - 1 - t->len;
    if (n > room) {
        n = room;
        t->cut = true;
    }
    memcpy(t->buf + t->len, s, n);
    t->len += n;
    t->buf[t->len] = '\0';
}

static void
text_puts(text *t, const char *s)
{
    text_putn(t, s, strlen(s));
}

/*
 * Append untrusted bytes for display: printable ASCII as is, anything else as
 * \xNN, at most max input bytes, then "..." if there were more. lower folds
 * A-Z (used to show the spelling UCX would match).
 */
static void
text_show(text *t, span s, size_t max, bool lower)
{
    static const char hex[] = "0123456789abcdef";
    size_t n = DP_MIN(s.n, max);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s.p[i];
        if (lower)
            c = to_lower(c);
        if (c >= 0x20 && c < 0x7f) {
            char ch = (char)c;
            text_putn(t, &ch, 1);
        } else {
            char esc[4] = {'\\', 'x', hex[c >> 4], hex[c & 15]};
            text_putn(t, esc, sizeof esc);
        }
    }
    if (s.n > max)
        text_puts(t, "...");
}

static void
text_token(text *t, span s)
{
    text_puts(t, "'");
    text_show(t, s, TOKEN_SHOW_MAX, false);
    text_puts(t, "'");
}

static void
text_value(text *t, const char *v)
{
    text_show(t, (span){v, strlen(v)}, VALUE_SHOW_MAX, false);
}

static const char *
text_str(text *t)
{
    if (t->cut && t->len >= 3)
        memcpy(t->buf + t->len - 3, "...", 3);
    return t->buf;
}

/* Add s to a ", "-separated list. */
static void
list_add(text *list, span s)
{
    if (list->len > 0)
        text_puts(list, ", ");
    text_show(list, s, TOKEN_SHOW_MAX, false);
}

static void
desc_group(text *desc, bool *first, const char *label, text *list)
{
    if (list->len == 0)
        return;
    text_puts(desc, *first ? " " : " + ");
    text_puts(desc, label);
    text_puts(desc, " (");
    text_puts(desc, text_str(list));
    text_puts(desc, ")");
    *first = false;
}

static int
reject_tcp(text *why, span item)
{
    text_puts(why, "UCX_TLS names tcp (");
    text_token(why, item);
    text_puts(why, "): UCX could then move data over TCP");
    if (span_icontains(item, ":aux"))
        text_puts(why, " (tcp:aux still opens TCP connections for wire-up)");
    text_puts(why, "; remove it, e.g. " TLS_EXAMPLE);
    return DP_EPOLICY;
}

static int
reject_all(text *why, const char *tls)
{
    text_puts(why, "UCX_TLS=");
    text_value(why, tls);
    text_puts(why, " names 'all', which lets UCX use every transport including tcp "
                   "(UCX 1.13 also reads '^all' as all); list the transports "
                   "instead, e.g. " TLS_EXAMPLE);
    return DP_EPOLICY;
}

/* An exclusion list: accepted only if UCX will really exclude tcp. */
static int
check_tls_exclusion(const char *tls, text *desc, text *why)
{
    const char *cur = tls + 1;
    span item, misspelt = {NULL, 0};
    bool names_tcp = false;
    text excluded = {0};

    while (next_item(&cur, &item)) {
        if (item.n == 0)
            continue;
        if (span_ieq(tl_item_parse(span_trim(item)).base, "all"))
            return reject_all(why, tls);
        tl_item it = tl_item_parse(item);
        if (span_eq(it.base, "tcp") && (!it.has_suffix || it.aux))
            names_tcp = true;
        else if (misspelt.p == NULL && span_icontains(item, "tcp"))
            misspelt = item;
        list_add(&excluded, item);
    }
    if (!names_tcp) {
        text_puts(why, "UCX_TLS=");
        text_value(why, tls);
        if (misspelt.p != NULL) {
            text_puts(why, " does not exclude tcp: UCX matches names exactly "
                           "(case, spaces and suffixes count), so ");
            text_token(why, misspelt);
            text_puts(why, " removes nothing; write UCX_TLS=^tcp");
        } else {
            text_puts(why, " is an exclusion list that does not name tcp, so UCX "
                           "could still use tcp; write UCX_TLS=^tcp,... or list "
                           "the transports, e.g. " TLS_EXAMPLE);
        }
        return DP_EPOLICY;
    }
    text_puts(desc, "UCX_TLS=");
    text_value(desc, tls);
    text_puts(desc, ": every transport except ");
    text_puts(desc, text_str(&excluded));
    return DP_OK;
}

/* Check one non-empty item of an explicit list and file it under its kind. */
static int
check_tls_item(span item, text *rdma, text *samehost, text *gpu, text *aux, text *why)
{
    span trimmed = span_trim(item);
    tl_item it = tl_item_parse(trimmed);

    if (span_icontains(trimmed, "tcp"))
        return reject_tcp(why, item);
    if (trimmed.n != item.n || span_has_upper(trimmed)) {
        text_puts(why, "UCX_TLS item ");
        text_token(why, item);
        text_puts(why, " is not a name UCX matches: UCX 1.13 compares transport "
                       "names exactly (case-sensitive, spaces kept) and would "
                       "ignore it; write '");
        text_show(why, trimmed, TOKEN_SHOW_MAX, true);
        text_puts(why, "'");
        return DP_EPOLICY;
    }
    if (it.has_suffix && !it.aux) {
        text_puts(why, "UCX_TLS item ");
        text_token(why, item);
        text_puts(why, " has an unknown suffix ");
        text_token(why, it.suffix);
        text_puts(why, "; UCX knows only ':aux' (wire-up only)");
        return DP_EPOLICY;
    }
    const struct tl_name *tl = tl_lookup(it.base);
    if (tl == NULL) {
        text_puts(why, "UCX_TLS item ");
        text_token(why, item);
        text_puts(why, " is neither an RDMA transport (rc, dc, ud, ib families) "
                       "nor a same-host helper (self, sm, shm, mm, posix, sysv, "
                       "cma, knem, xpmem, cuda, rocm); it could be a TCP path or "
                       "be ignored by UCX; remove it, e.g. " TLS_EXAMPLE);
        return DP_EPOLICY;
    }
    if (it.strict && tl->alias) {
        text_puts(why, "UCX_TLS item ");
        text_token(why, item);
        text_puts(why, " names no transport: a leading '\\' turns off alias "
                       "expansion and ");
        text_token(why, it.base);
        text_puts(why, " is an alias; drop the '\\' or name a transport such as "
                       "'\\rc_mlx5'");
        return DP_EPOLICY;
    }
    if (it.aux)
        list_add(aux, item);
    else if (tl->kind == TL_RDMA)
        list_add(rdma, item);
    else if (tl->kind == TL_SAMEHOST)
        list_add(samehost, item);
    else
        list_add(gpu, item);
    return DP_OK;
}

static int
check_tls(const char *tls, text *desc, text *why)
{
    if (tls == NULL) {
        text_puts(why, "UCX_TLS is unset: UCX would fall back to TCP whenever RDMA "
                       "is unavailable; set " TLS_EXAMPLE " or similar");
        return DP_EPOLICY;
    }
    if (tls[0] == '^')
        return check_tls_exclusion(tls, desc, why);

    const char *cur = tls;
    span item;
    size_t nitems = 0;
    text rdma = {0}, samehost = {0}, gpu = {0}, aux = {0};
    while (next_item(&cur, &item)) {
        if (item.n == 0)
            continue;
        nitems++;
        if (span_ieq(tl_item_parse(span_trim(item)).base, "all"))
            return reject_all(why, tls);
        int rc = check_tls_item(item, &rdma, &samehost, &gpu, &aux, why);
        if (rc != DP_OK)
            return rc;
    }
    if (nitems == 0) {
        text_puts(why, "UCX_TLS is set but names no transport (UCX 1.13 refuses an "
                       "empty list, and unsetting it lets UCX fall back to TCP); "
                       "set " TLS_EXAMPLE " or similar");
        return DP_EPOLICY;
    }
    if (rdma.len == 0) {
        text_puts(why, "UCX_TLS=");
        text_value(why, tls);
        text_puts(why, " has no RDMA transport, so UCX could not reach another "
                       "host (an RDMA transport marked :aux only carries "
                       "wire-up); add rc, dc, ud or ib, e.g. " TLS_EXAMPLE);
        return DP_EPOLICY;
    }
    bool first = true;
    text_puts(desc, "UCX_TLS=");
    text_value(desc, tls);
    text_puts(desc, ":");
    desc_group(desc, &first, "RDMA", &rdma);
    desc_group(desc, &first, "same-host", &samehost);
    desc_group(desc, &first, "same-host GPU", &gpu);
    desc_group(desc, &first, "wire-up only", &aux);
    return DP_OK;
}

/* NULL if s is an RDMA port <dev>:<port>, else what is wrong with it. */
static const char *
dev_port_problem(span s)
{
    size_t colon = s.n;
    while (colon > 0 && s.p[colon - 1] != ':')
        colon--;
    if (colon == 0)
        return NULL; /* no ':' at all: the caller reports a netdev */
    span dev = {s.p, colon - 1};
    span port = {s.p + colon, s.n - colon};

    if (dev.n == 0)
        return "has an empty device name";
    if (dev.n > IBDEV_NAME_MAX)
        return "has a device name longer than an RDMA device name can be";
    for (size_t i = 0; i < dev.n; i++) {
        unsigned char c = (unsigned char)dev.p[i];
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                  (c >= '0' && c <= '9') || c == '_' || c == '-' || c == '.';
        if (!ok)
            return "has a character other than letters, digits, '_', '-' and '.' "
                   "in the device name (UCX keeps spaces and has no '^' or "
                   "wildcards for devices)";
    }
    unsigned value = 0;
    bool digits = port.n >= 1 && port.n <= 3 && port.p[0] != '0';
    for (size_t i = 0; digits && i < port.n; i++) {
        if (port.p[i] < '0' || port.p[i] > '9')
            digits = false;
        else
            value = value * 10 + (unsigned)(port.p[i] - '0');
    }
    if (!digits || value > 255)
        return "has a port that is not a number from 1 to 255 written as UCX "
               "writes it";
    return NULL;
}

static int
check_net_devices(const char *net, text *desc, text *why)
{
    if (net == NULL) {
        text_puts(desc, "; UCX_NET_DEVICES unset");
        return DP_OK;
    }
    const char *cur = net;
    span item;
    size_t nitems = 0;
    while (next_item(&cur, &item)) {
        if (item.n == 0)
            continue;
        nitems++;
        if (span_ieq(span_trim(item), "all")) {
            text_puts(why, "UCX_NET_DEVICES names 'all', which includes network "
                           "interfaces such as eth0; name RDMA ports instead, "
                           "e.g. " NETDEV_EXAMPLE);
            return DP_EPOLICY;
        }
        if (memchr(item.p, ':', item.n) == NULL) {
            text_puts(why, "UCX_NET_DEVICES names ");
            text_token(why, item);
            text_puts(why,
                      ", which is not an RDMA port <dev>:<port>: a device "
                      "without ':<port>' is a network interface, which UCX "
                      "drives with tcp; name RDMA ports instead, e.g. " NETDEV_EXAMPLE
                      " (ucx_info -d lists them)");
            return DP_EPOLICY;
        }
        const char *problem = dev_port_problem(item);
        if (problem != NULL) {
            text_puts(why, "UCX_NET_DEVICES item ");
            text_token(why, item);
            text_puts(why, " is not an RDMA port <dev>:<port>: it ");
            text_puts(why, problem);
            text_puts(why, "; e.g. " NETDEV_EXAMPLE);
            return DP_EPOLICY;
        }
    }
    if (nitems == 0) {
        text_puts(why, "UCX_NET_DEVICES is set but names no device: UCX would use "
                       "no network device, so no RDMA either; unset it or name "
                       "RDMA ports, e.g. " NETDEV_EXAMPLE);
        return DP_EPOLICY;
    }
    text_puts(desc, "; UCX_NET_DEVICES=");
    text_value(desc, net);
    return DP_OK;
}

int
dp__policy_check_rdma_only_values(const char *ucx_tls, const char *ucx_net_devices,
                                  char *desc, size_t desc_len, dp_detail *d)
{
    text out = {0}, why = {0};
    int rc = check_tls(ucx_tls, &out, &why);
    if (rc == DP_OK)
        rc = check_net_devices(ucx_net_devices, &out, &why);
    const char *line = text_str(rc == DP_OK ? &out : &why);
    if (desc != NULL && desc_len > 0)
        snprintf(desc, desc_len, "%s", line);
    if (rc != DP_OK)
        return dp__fail(d, DP_EPOLICY, "%s", line);
    return DP_OK;
}

/* The value of key in env (first entry wins), or getenv() when env is NULL. */
static const char *
env_lookup(const char *const *env, const char *key)
{
    if (env == NULL)
        return getenv(key);
    size_t n = strlen(key);
    for (; *env != NULL; env++)
        if (strncmp(*env, key, n) == 0 && (*env)[n] == '=')
            return *env + n + 1;
    return NULL;
}

int
dp__policy_check_rdma_only(const char *const *env, char *desc, size_t desc_len,
                           dp_detail *d)
{
    return dp__policy_check_rdma_only_values(env_lookup(env, "UCX_TLS"),
                                             env_lookup(env, "UCX_NET_DEVICES"), desc,
                                             desc_len, d);
}
