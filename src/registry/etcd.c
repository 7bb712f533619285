/*
 * etcd's v3 API through its HTTP/JSON gateway (see etcd.h): each call is one
 * POST of a JSON body to /v3/..., answered by one JSON object; a watch is one
 * POST whose answer is a stream of JSON objects, one per line. Everything
 * etcd sends is checked before use: int64 fields arrive as JSON strings,
 * keys and values as base64, and fields equal to their zero value are left
 * out (a transaction that failed has no "succeeded").
 *
 * Proxies: the handle never uses one (http_proxy in the environment would
 * otherwise send registry traffic to it); etcd is reached directly.
 */
#include "registry/etcd.h"

#include <cjson/cJSON.h>
#include <curl/curl.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_EPS 16
#define EP_MAX 256
#define MAX_BODY (64u << 20) /* the largest answer read: 4096 records fit easily */

struct dp__etcd {
    char eps[MAX_EPS][EP_MAX];
    int n_eps;
    int cur; /* the endpoint that answered last */
    double timeout_s;
    CURL *h;
    CURLM *m; /* for watches (so a stop can wake one) */
    atomic_bool stop;
};

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static CURLcode curl_init_rc = CURLE_OK;

static void
curl_init(void)
{
    /* Plain http only: no TLS library is initialised (nor torn down at exit). */
    curl_init_rc = curl_global_init(CURL_GLOBAL_NOTHING);
}

/* ---- base64 ---- */

static const char b64_chars[] =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

char *
dp__etcd_b64_encode(const void *p, size_t n)
{
    const uint8_t *s = p;
    char *out = malloc((n + 2) / 3 * 4 + 1);
    if (out == NULL)
        return NULL;
    size_t o = 0;
    for (size_t i = 0; i < n; i += 3) {
        uint32_t v = (uint32_t)s[i] << 16;
        if (i + 1 < n)
            v |= (uint32_t)s[i + 1] << 8;
        if (i + 2 < n)
            v |= s[i + 2];
        out[o++] = b64_chars[(v >> 18) & 63];
        out[o++] = b64_chars[(v >> 12) & 63];
        out[o++] = i + 1 < n ? b64_chars[(v >> 6) & 63] : '=';
        out[o++] = i + 2 < n ? b64_chars[v & 63] : '=';
    }
    out[o] = '\0';
    return out;
}

static int
b64_val(char c)
{
    if (c >= 'A' && c <= 'Z')
        return c - 'A';
    if (c >= 'a' && c <= 'z')
        return c - 'a' + 26;
    if (c >= '0' && c <= '9')
        return c - '0' + 52;
    if (c == '+')
        return 62;
    if (c == '/')
        return 63;
    return -1;
}

char *
dp__etcd_b64_decode(const char *s, size_t len, size_t *out_len)
{
    if (len % 4 != 0)
        return NULL;
    char *out = malloc(len / 4 * 3 + 1);
    if (out == NULL)
        return NULL;
    size_t o = 0;
    for (size_t i = 0; i < len; i += 4) {
        int v[4];
        int pad = 0;
        for (int k = 0; k < 4; k++) {
            if (s[i + k] == '=' && i + 4 == len && k >= 2) {
                v[k] = 0;
                pad++;
            } else if (pad > 0 || (v[k] = b64_val(s[i + k])) < 0) {
                free(out);
                return NULL;
            }
        }
        /* Canonical only: the bits padding leaves out must be zero. */
        if ((pad == 2 && (v[1] & 0xf) != 0) || (pad == 1 && (v[2] & 0x3) != 0)) {
            free(out);
            return NULL;
        }
        uint32_t x = (uint32_t)v[0] << 18 | (uint32_t)v[1] << 12 | (uint32_t)v[2] << 6 |
                     (uint32_t)v[3];
        out[o++] = (char)(x >> 16);
        if (pad < 2)
            out[o++] = (char)(x >> 8);
        if (pad < 1)
            out[o++] = (char)x;
    }
    out[o] = '\0';
    if (out_len != NULL)
        *out_len = o;
    return out;
}

/* ---- the handle ---- */

/* Check one "host:port" endpoint (the forms etcd.h allows). */
static int
check_endpoint(const char *ep, size_t n, dp_detail *d)
{
    if (n == 0 || n >= EP_MAX)
        return dp__fail(d, DP_EINVAL, "etcd endpoint '%.*s' is empty or too long",
                        (int)DP_MIN(n, 64), ep);
    const char *colon = NULL;
    if (ep[0] == '[') {
        const char *close = memchr(ep, ']', n);
        if (close != NULL && (size_t)(close - ep) + 1 < n && close[1] == ':')
            colon = close + 1;
    } else {
        colon = memchr(ep, ':', n);
        for (const char *p = ep; p < (colon != NULL ? colon : ep + n); p++)
            if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') ||
                  (*p >= '0' && *p <= '9') || *p == '-' || *p == '.' || *p == '_'))
                colon = NULL;
    }
    if (colon == NULL || colon == ep)
        return dp__fail(d, DP_EINVAL,
                        "etcd endpoint '%.*s' is not host:port (a host name, an IPv4 "
                        "address or [IPv6], then the client port, e.g. 127.0.0.1:2379)",
                        (int)n, ep);
    const char *port = colon + 1;
    size_t plen = n - (size_t)(port - ep);
    unsigned v = 0;
    if (plen == 0 || plen > 5)
        v = 0;
    else
        for (size_t i = 0; i < plen; i++) {
            if (port[i] < '0' || port[i] > '9') {
                v = 0;
                break;
            }
            v = v * 10 + (unsigned)(port[i] - '0');
        }
    if (v == 0 || v > 65535)
        return dp__fail(d, DP_EINVAL, "etcd endpoint '%.*s' has no valid port (1..65535)",
                        (int)n, ep);
    return DP_OK;
}

int
dp__etcd_create(const char *endpoints, double timeout_s, dp__etcd **out, dp_detail *d)
{
    if (out == NULL || endpoints == NULL)
        return dp__fail(d, DP_EINVAL, "dp__etcd_create: NULL argument");
    *out = NULL;
    if (!(timeout_s > 0))
        return dp__fail(d, DP_EINVAL, "etcd: timeout must be > 0");
    pthread_once(&curl_once, curl_init);
    if (curl_init_rc != CURLE_OK)
        return dp__fail(d, DP_ESYS, "libcurl would not start: %s",
                        curl_easy_strerror(curl_init_rc));
    dp__etcd *e = calloc(1, sizeof *e);
    if (e == NULL)
        return dp__fail(d, DP_ENOMEM, "etcd: out of memory");
    e->timeout_s = timeout_s;
    atomic_init(&e->stop, false);
    const char *p = endpoints;
    int rc = DP_OK;
    for (;;) {
        const char *comma = strchr(p, ',');
        size_t n = comma != NULL ? (size_t)(comma - p) : strlen(p);
        if (e->n_eps == MAX_EPS) {
            rc = dp__fail(d, DP_EINVAL, "etcd: more than %d endpoints in '%s'", MAX_EPS,
                          endpoints);
            break;
        }
        if ((rc = check_endpoint(p, n, d)) != DP_OK)
            break;
        memcpy(e->eps[e->n_eps], p, n);
        e->eps[e->n_eps++][n] = '\0';
        if (comma == NULL)
            break;
        p = comma + 1;
    }
    if (rc == DP_OK &&
        ((e->h = curl_easy_init()) == NULL || (e->m = curl_multi_init()) == NULL))
        rc = dp__fail(d, DP_ENOMEM, "etcd: libcurl could not make a handle");
    if (rc != DP_OK) {
        dp__etcd_destroy(e);
        return rc;
    }
    *out = e;
    return DP_OK;
}

void
dp__etcd_destroy(dp__etcd *e)
{
    if (e == NULL)
        return;
    if (e->h != NULL)
        curl_easy_cleanup(e->h);
    if (e->m != NULL)
        curl_multi_cleanup(e->m);
    free(e);
}

const char *
dp__etcd_endpoint(const dp__etcd *e)
{
    return e->eps[e->cur];
}

/* ---- one call ---- */

typedef struct body {
    dp__buf b;
    bool too_big;
} body;

static size_t
body_write(char *p, size_t size, size_t n, void *ctx)
{
    body *b = ctx;
    size_t len = size * n;
    if (b->b.len + len > MAX_BODY) {
        b->too_big = true;
        return 0;
    }
    if (dp__buf_append(&b->b, p, len) != 0)
        return 0;
    return len;
}

/* Options every request of e shares. */
static void
common_opts(CURL *h, const char *url, const char *json, struct curl_slist *hdr)
{
    curl_easy_reset(h);
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_POST, 1L);
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, json);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdr);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_PROXY, "");
    curl_easy_setopt(h, CURLOPT_NOPROXY, "*");
    curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http");
    curl_easy_setopt(h, CURLOPT_FOLLOWLOCATION, 0L);
    curl_easy_setopt(h, CURLOPT_TCP_KEEPALIVE, 1L);
    curl_easy_setopt(h, CURLOPT_TCP_KEEPIDLE, 5L);
    curl_easy_setopt(h, CURLOPT_TCP_KEEPINTVL, 2L);
}

/* etcd's own words from an error body ({"error": ..., "message": ...}), or NULL. */
static const char *
etcd_message(const cJSON *j)
{
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(j, "message");
    if (!cJSON_IsString(m))
        m = cJSON_GetObjectItemCaseSensitive(j, "error");
    if (cJSON_IsObject(m))
        m = cJSON_GetObjectItemCaseSensitive(m, "message");
    return cJSON_IsString(m) ? m->valuestring : NULL;
}

/*
 * POST json to path on the first endpoint that answers; *out the parsed
 * answer (cJSON_Delete it). An HTTP error status is DP_EPROTO with etcd's
 * message.
 */
static int
call(dp__etcd *e, const char *path, const char *json, cJSON **out, dp_detail *d)
{
    *out = NULL;
    struct curl_slist *hdr = curl_slist_append(NULL, "Content-Type: application/json");
    if (hdr == NULL)
        return dp__fail(d, DP_ENOMEM, "etcd: out of memory");
    long ms = (long)(e->timeout_s * 1000);
    if (ms < 1)
        ms = 1;
    int rc = DP_ESYS;
    char errs[512] = "";
    size_t el = 0;
    for (int t = 0; t < e->n_eps; t++) {
        int i = (e->cur + t) % e->n_eps;
        char url[EP_MAX + 64];
        snprintf(url, sizeof url, "http://%s%s", e->eps[i], path);
        body b = {0};
        char cerr[CURL_ERROR_SIZE] = "";
        common_opts(e->h, url, json, hdr);
        curl_easy_setopt(e->h, CURLOPT_TIMEOUT_MS, ms);
        curl_easy_setopt(e->h, CURLOPT_CONNECTTIMEOUT_MS, ms);
        curl_easy_setopt(e->h, CURLOPT_WRITEFUNCTION, body_write);
        curl_easy_setopt(e->h, CURLOPT_WRITEDATA, &b);
        curl_easy_setopt(e->h, CURLOPT_ERRORBUFFER, cerr);
        CURLcode cc = curl_easy_perform(e->h);
        if (cc != CURLE_OK) {
            /* Unreachable, whether refused or silent: the caller's budget ran out. */
            rc = DP_ETIMEDOUT;
            if (b.too_big)
                rc = DP_ETOOBIG;
            int k = snprintf(errs + el, sizeof errs - el, "%s%s: %s", el ? "; " : "",
                             e->eps[i], cerr[0] ? cerr : curl_easy_strerror(cc));
            if (k > 0)
                el = DP_MIN(sizeof errs - 1, el + (size_t)k);
            dp__buf_fini(&b.b);
            continue;
        }
        long status = 0;
        curl_easy_getinfo(e->h, CURLINFO_RESPONSE_CODE, &status);
        cJSON *j = cJSON_ParseWithLength((const char *)b.b.data, b.b.len);
        dp__buf_fini(&b.b);
        if (status >= 500) {
            /* A member without a leader (or overloaded): another may answer. */
            const char *m = j != NULL ? etcd_message(j) : NULL;
            int k = snprintf(errs + el, sizeof errs - el, "%s%s: HTTP %ld%s%s",
                             el ? "; " : "", e->eps[i], status, m ? " " : "", m ? m : "");
            if (k > 0)
                el = DP_MIN(sizeof errs - 1, el + (size_t)k);
            cJSON_Delete(j);
            rc = DP_ETIMEDOUT;
            continue;
        }
        e->cur = i;
        curl_slist_free_all(hdr);
        if (status != 200) {
            const char *m = j != NULL ? etcd_message(j) : NULL;
            rc = dp__fail(d, DP_EPROTO, "etcd at %s answered %s with HTTP %ld%s%s",
                          e->eps[i], path, status, m ? ": " : "", m ? m : "");
            cJSON_Delete(j);
            return rc;
        }
        if (!cJSON_IsObject(j)) {
            cJSON_Delete(j);
            return dp__fail(d, DP_EPROTO,
                            "etcd at %s answered %s with something not JSON", e->eps[i],
                            path);
        }
        *out = j;
        return DP_OK;
    }
    curl_slist_free_all(hdr);
    if (rc == DP_ETOOBIG)
        return dp__fail(d, DP_EPROTO, "etcd answered %s with more than %u MiB", path,
                        MAX_BODY >> 20);
    return dp__fail(d, rc,
                    "no etcd endpoint answered %s (%s; each call waits up to %.1f s)",
                    path, errs, e->timeout_s);
}

/* An int64 field: a JSON string of digits (or a number); absent is 0. */
static bool
get_i64(const cJSON *o, const char *name, int64_t *v)
{
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(o, name);
    *v = 0;
    if (j == NULL)
        return true;
    if (cJSON_IsNumber(j)) {
        if (!(j->valuedouble >= -9.2e18 && j->valuedouble <= 9.2e18))
            return false;
        *v = (int64_t)j->valuedouble;
        return true;
    }
    if (!cJSON_IsString(j) || j->valuestring[0] == '\0')
        return false;
    char *end;
    errno = 0;
    long long x = strtoll(j->valuestring, &end, 10);
    if (errno != 0 || *end != '\0')
        return false;
    *v = x;
    return true;
}

/* A base64 field decoded into a new string (absent: ""). NULL on bad input. */
static char *
get_b64(const cJSON *o, const char *name, size_t *len)
{
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(o, name);
    if (j == NULL) {
        *len = 0;
        return strdup("");
    }
    if (!cJSON_IsString(j))
        return NULL;
    return dp__etcd_b64_decode(j->valuestring, strlen(j->valuestring), len);
}

static void
kv_fini(dp__etcd_kv *kv)
{
    free(kv->key);
    free(kv->value);
    memset(kv, 0, sizeof *kv);
}

/* Fill kv from one of etcd's KeyValue objects. */
static int
parse_kv(const cJSON *o, dp__etcd_kv *kv, dp_detail *d)
{
    memset(kv, 0, sizeof *kv);
    size_t klen = 0;
    if (!cJSON_IsObject(o) || (kv->key = get_b64(o, "key", &klen)) == NULL ||
        strlen(kv->key) != klen ||
        (kv->value = get_b64(o, "value", &kv->value_len)) == NULL ||
        !get_i64(o, "lease", &kv->lease) ||
        !get_i64(o, "create_revision", &kv->create_rev) ||
        !get_i64(o, "mod_revision", &kv->mod_rev)) {
        kv_fini(kv);
        return dp__fail(d, DP_EPROTO, "etcd sent a key-value pair that is not one");
    }
    /* Keys reach logs and terminals: no control bytes (no dataplane key has one). */
    for (char *p = kv->key; *p != '\0'; p++)
        if ((unsigned char)*p < 0x20 || *p == 0x7f)
            *p = '?';
    return DP_OK;
}

static int64_t
header_revision(const cJSON *j)
{
    int64_t r = 0;
    get_i64(cJSON_GetObjectItemCaseSensitive(j, "header"), "revision", &r);
    return r;
}

/* The JSON string of an object (cJSON_free it), or NULL when out of memory. */
static char *
print_del(cJSON *o)
{
    char *s = o != NULL ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    return s;
}

/* Add field name as base64 of s. */
static bool
add_b64(cJSON *o, const char *name, const char *s)
{
    char *b = dp__etcd_b64_encode(s, strlen(s));
    bool ok = b != NULL && cJSON_AddStringToObject(o, name, b) != NULL;
    free(b);
    return ok;
}

static bool
add_i64(cJSON *o, const char *name, int64_t v)
{
    char s[24];
    snprintf(s, sizeof s, "%" PRId64, v);
    return cJSON_AddStringToObject(o, name, s) != NULL;
}

/* The range end that makes key a prefix: key with its last byte below 0xff bumped. */
static char *
prefix_end(const char *key)
{
    size_t n = strlen(key);
    char *end = strdup(key);
    if (end == NULL)
        return NULL;
    while (n > 0 && (uint8_t)end[n - 1] == 0xff)
        end[--n] = '\0';
    if (n == 0) { /* no end: the caller refuses an empty prefix */
        free(end);
        return NULL;
    }
    end[n - 1] = (char)((uint8_t)end[n - 1] + 1);
    return end;
}

/* Call path with body o (consumed). */
static int
call_obj(dp__etcd *e, const char *path, cJSON *o, cJSON **out, dp_detail *d)
{
    char *json = print_del(o);
    if (json == NULL)
        return dp__fail(d, DP_ENOMEM, "etcd: out of memory");
    int rc = call(e, path, json, out, d);
    cJSON_free(json);
    return rc;
}

static cJSON *
range_body(const char *key, bool prefix)
{
    cJSON *o = cJSON_CreateObject();
    bool ok = o != NULL && add_b64(o, "key", key);
    if (ok && prefix) {
        char *end = prefix_end(key);
        ok = end != NULL && add_b64(o, "range_end", end);
        free(end);
    }
    if (!ok) {
        cJSON_Delete(o);
        return NULL;
    }
    return o;
}

/* Fill out from a RangeResponse object. */
static int
parse_range(const cJSON *j, dp__etcd_kvs *out, dp_detail *d)
{
    memset(out, 0, sizeof *out);
    out->revision = header_revision(j);
    const cJSON *kvs = cJSON_GetObjectItemCaseSensitive(j, "kvs");
    if (kvs == NULL)
        return DP_OK;
    if (!cJSON_IsArray(kvs))
        return dp__fail(d, DP_EPROTO, "etcd sent a range answer whose kvs is not a list");
    int n = cJSON_GetArraySize(kvs);
    out->kv = calloc((size_t)DP_MAX(n, 1), sizeof *out->kv);
    if (out->kv == NULL)
        return dp__fail(d, DP_ENOMEM, "etcd: out of memory");
    const cJSON *it;
    cJSON_ArrayForEach(it, kvs)
    {
        int rc = parse_kv(it, &out->kv[out->n], d);
        if (rc != DP_OK) {
            dp__etcd_kvs_fini(out);
            return rc;
        }
        out->n++;
    }
    return DP_OK;
}

int
dp__etcd_range(dp__etcd *e, const char *key, bool prefix, dp__etcd_kvs *out, dp_detail *d)
{
    memset(out, 0, sizeof *out);
    cJSON *o = range_body(key, prefix);
    if (o == NULL)
        return dp__fail(d, DP_ENOMEM, "etcd: out of memory");
    cJSON *j;
    int rc = call_obj(e, "/v3/kv/range", o, &j, d);
    if (rc != DP_OK)
        return rc;
    rc = parse_range(j, out, d);
    cJSON_Delete(j);
    return rc;
}

void
dp__etcd_kvs_fini(dp__etcd_kvs *k)
{
    if (k == NULL)
        return;
    for (size_t i = 0; i < k->n; i++)
        kv_fini(&k->kv[i]);
    free(k->kv);
    memset(k, 0, sizeof *k);
}

static cJSON *
put_body(const char *key, const char *value, int64_t lease)
{
    cJSON *o = cJSON_CreateObject();
    if (o == NULL || !add_b64(o, "key", key) || !add_b64(o, "value", value) ||
        (lease != 0 && !add_i64(o, "lease", lease))) {
        cJSON_Delete(o);
        return NULL;
    }
    return o;
}

int
dp__etcd_put(dp__etcd *e, const char *key, const char *value, int64_t lease, dp_detail *d)
{
    cJSON *o = put_body(key, value, lease);
    if (o == NULL)
        return dp__fail(d, DP_ENOMEM, "etcd: out of memory");
    cJSON *j;
    int rc = call_obj(e, "/v3/kv/put", o, &j, d);
    cJSON_Delete(j);
    return rc;
}

/* A transaction: if key's mod revision is mod_rev, do op (consumed). */
static int
txn_if_mod(dp__etcd *e, const char *key, int64_t mod_rev, const char *op_name, cJSON *op,
           bool *done, dp_detail *d)
{
    *done = false;
    cJSON *o = cJSON_CreateObject();
    cJSON *cmp = cJSON_CreateObject();
    cJSON *cmps = cJSON_CreateArray();
    cJSON *succ = cJSON_CreateArray();
    cJSON *wrap = cJSON_CreateObject();
    bool ok = o && cmp && cmps && succ && wrap && op && add_b64(cmp, "key", key) &&
              cJSON_AddStringToObject(cmp, "target", mod_rev == 0 ? "CREATE" : "MOD") &&
              cJSON_AddStringToObject(cmp, "result", "EQUAL") &&
              add_i64(cmp, mod_rev == 0 ? "create_revision" : "mod_revision", mod_rev);
    if (ok) {
        cJSON_AddItemToArray(cmps, cmp);
        cmp = NULL;
        cJSON_AddItemToObject(wrap, op_name, op);
        op = NULL;
        cJSON_AddItemToArray(succ, wrap);
        wrap = NULL;
        cJSON_AddItemToObject(o, "compare", cmps);
        cmps = NULL;
        cJSON_AddItemToObject(o, "success", succ);
        succ = NULL;
    }
    cJSON_Delete(cmp);
    cJSON_Delete(cmps);
    cJSON_Delete(succ);
    cJSON_Delete(wrap);
    cJSON_Delete(op);
    if (!ok) {
        cJSON_Delete(o);
        return dp__fail(d, DP_ENOMEM, "etcd: out of memory");
    }
    cJSON *j;
    int rc = call_obj(e, "/v3/kv/txn", o, &j, d);
    if (rc != DP_OK)
        return rc;
    *done = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "succeeded"));
    cJSON_Delete(j);
    return DP_OK;
}

int
dp__etcd_put_if(dp__etcd *e, const char *key, const char *value, int64_t lease,
                int64_t mod_rev, bool *done, dp_detail *d)
{
    return txn_if_mod(e, key, mod_rev, "request_put", put_body(key, value, lease), done,
                      d);
}

int
dp__etcd_delete_if(dp__etcd *e, const char *key, int64_t mod_rev, bool *done,
                   dp_detail *d)
{
    return txn_if_mod(e, key, mod_rev, "request_delete_range", range_body(key, false),
                      done, d);
}

static int
lease_call(dp__etcd *e, const char *path, int64_t id, int64_t ttl, cJSON **out,
           dp_detail *d)
{
    cJSON *o = cJSON_CreateObject();
    if (o == NULL || (id != 0 && !add_i64(o, "ID", id)) ||
        (ttl != 0 && !add_i64(o, "TTL", ttl))) {
        cJSON_Delete(o);
        return dp__fail(d, DP_ENOMEM, "etcd: out of memory");
    }
    return call_obj(e, path, o, out, d);
}

int
dp__etcd_lease_grant(dp__etcd *e, int64_t ttl_s, int64_t *id, dp_detail *d)
{
    *id = 0;
    if (ttl_s < 1)
        return dp__fail(d, DP_EINVAL, "etcd: a lease's TTL must be at least 1 s");
    cJSON *j;
    int rc = lease_call(e, "/v3/lease/grant", 0, ttl_s, &j, d);
    if (rc != DP_OK)
        return rc;
    int64_t ttl = 0;
    if (!get_i64(j, "ID", id) || *id == 0 || !get_i64(j, "TTL", &ttl) || ttl <= 0) {
        const char *m = etcd_message(j);
        rc = dp__fail(d, DP_EPROTO, "etcd granted no lease%s%s", m ? ": " : "",
                      m ? m : "");
    }
    cJSON_Delete(j);
    return rc;
}

int
dp__etcd_lease_keepalive(dp__etcd *e, int64_t id, int64_t *ttl_left, dp_detail *d)
{
    *ttl_left = 0;
    cJSON *j;
    int rc = lease_call(e, "/v3/lease/keepalive", id, 0, &j, d);
    if (rc != DP_OK)
        return rc;
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(j, "result");
    if (!cJSON_IsObject(r) || !get_i64(r, "TTL", ttl_left)) {
        const char *m = etcd_message(j);
        rc = dp__fail(d, DP_EPROTO, "etcd's keepalive answer has no result%s%s",
                      m ? ": " : "", m ? m : "");
    }
    cJSON_Delete(j);
    return rc;
}

int
dp__etcd_lease_ttl(dp__etcd *e, int64_t id, int64_t *ttl_left, dp_detail *d)
{
    *ttl_left = -1;
    cJSON *j;
    int rc = lease_call(e, "/v3/lease/timetolive", id, 0, &j, d);
    if (rc != DP_OK)
        return rc;
    if (!get_i64(j, "TTL", ttl_left))
        rc = dp__fail(d, DP_EPROTO, "etcd's lease answer has a TTL that is not a number");
    cJSON_Delete(j);
    return rc;
}

int
dp__etcd_lease_revoke(dp__etcd *e, int64_t id, dp_detail *d)
{
    cJSON *j;
    dp_detail mine;
    dp_detail_clear(&mine);
    int rc = lease_call(e, "/v3/lease/revoke", id, 0, &j, &mine);
    cJSON_Delete(j);
    /* A lease that expired meanwhile is what revoking wanted. */
    if (rc == DP_EPROTO && strstr(dp_detail_msg(&mine), "not found") != NULL)
        return DP_OK;
    if (rc != DP_OK && d != NULL)
        *d = mine;
    return rc;
}

/* ---- watch ---- */

typedef struct watch_ctx {
    dp__buf line; /* bytes of the current, unfinished line */
    dp__etcd_watch_fn fn;
    void *ctx;
    int rc; /* set when the stream must end (fn's value, or an error) */
    dp_detail *d;
    bool created;   /* etcd confirmed the watch */
    double last_rx; /* monotonic seconds of the last bytes */
} watch_ctx;

/* Handle one JSON object of the stream; nonzero ends the watch. */
static int
watch_object(watch_ctx *w, const char *s, size_t n)
{
    cJSON *j = cJSON_ParseWithLength(s, n);
    if (!cJSON_IsObject(j)) {
        cJSON_Delete(j);
        return dp__fail(w->d, DP_EPROTO, "etcd's watch stream sent something not JSON");
    }
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(j, "result");
    int rc = DP_OK;
    if (!cJSON_IsObject(r)) {
        const char *m = etcd_message(j);
        rc = dp__fail(w->d, DP_EPROTO, "etcd's watch failed%s%s", m ? ": " : "",
                      m ? m : "");
        cJSON_Delete(j);
        return rc;
    }
    int64_t compacted = 0;
    get_i64(r, "compact_revision", &compacted);
    if (compacted != 0) {
        cJSON_Delete(j);
        return dp__fail(
            w->d, DP_ELOST,
            "etcd compacted the revisions this watch started from (now %" PRId64 ")",
            compacted);
    }
    if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(r, "created")))
        w->created = true;
    if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(r, "canceled"))) {
        const cJSON *why = cJSON_GetObjectItemCaseSensitive(r, "cancel_reason");
        rc = dp__fail(w->d, DP_EPROTO, "etcd canceled the watch%s%s",
                      cJSON_IsString(why) ? ": " : "",
                      cJSON_IsString(why) ? why->valuestring : "");
        cJSON_Delete(j);
        return rc;
    }
    int64_t rev = header_revision(r);
    const cJSON *evs = cJSON_GetObjectItemCaseSensitive(r, "events");
    const cJSON *ev;
    cJSON_ArrayForEach(ev, evs)
    {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(ev, "type");
        bool deleted = cJSON_IsString(type) && strcmp(type->valuestring, "DELETE") == 0;
        dp__etcd_kv kv;
        if ((rc = parse_kv(cJSON_GetObjectItemCaseSensitive(ev, "kv"), &kv, w->d)) !=
            DP_OK)
            break;
        rc = w->fn(w->ctx, deleted, &kv, rev);
        kv_fini(&kv);
        if (rc != 0)
            break;
    }
    cJSON_Delete(j);
    return rc;
}

static size_t
watch_write(char *p, size_t size, size_t n, void *ctx)
{
    watch_ctx *w = ctx;
    size_t len = size * n;
    w->last_rx = dp__now_s();
    for (size_t i = 0; i < len; i++) {
        if (p[i] != '\n') {
            if (dp__buf_append(&w->line, &p[i], 1) != 0 || w->line.len > MAX_BODY) {
                w->rc = dp__fail(w->d, DP_ENOMEM, "etcd: a watch message too large");
                return 0;
            }
            continue;
        }
        if (w->line.len > 0) {
            int rc = watch_object(w, (const char *)w->line.data, w->line.len);
            dp__buf_reset(&w->line);
            if (rc != 0) {
                w->rc = rc;
                return 0;
            }
        }
    }
    return len;
}

int
dp__etcd_watch(dp__etcd *e, const char *prefix, int64_t from_rev, double idle_s,
               dp__etcd_watch_fn fn, void *ctx, dp_detail *d)
{
    cJSON *cr = range_body(prefix, true);
    cJSON *o = cJSON_CreateObject();
    if (cr == NULL || o == NULL ||
        (from_rev > 0 && !add_i64(cr, "start_revision", from_rev))) {
        cJSON_Delete(cr);
        cJSON_Delete(o);
        return dp__fail(d, DP_ENOMEM, "etcd: out of memory");
    }
    cJSON_AddItemToObject(o, "create_request", cr);
    char *json = print_del(o);
    struct curl_slist *hdr = curl_slist_append(NULL, "Content-Type: application/json");
    /* etcd then ends the stream when its member loses the leader. */
    if (hdr != NULL)
        hdr = curl_slist_append(hdr, "Grpc-Metadata-hasleader: true");
    if (json == NULL || hdr == NULL) {
        cJSON_free(json);
        curl_slist_free_all(hdr);
        return dp__fail(d, DP_ENOMEM, "etcd: out of memory");
    }
    watch_ctx w = {.fn = fn, .ctx = ctx, .d = d, .last_rx = dp__now_s()};
    char url[EP_MAX + 64], cerr[CURL_ERROR_SIZE] = "";
    snprintf(url, sizeof url, "http://%s/v3/watch", e->eps[e->cur]);
    common_opts(e->h, url, json, hdr);
    long cms = (long)(e->timeout_s * 1000);
    curl_easy_setopt(e->h, CURLOPT_CONNECTTIMEOUT_MS, cms < 1 ? 1L : cms);
    curl_easy_setopt(e->h, CURLOPT_WRITEFUNCTION, watch_write);
    curl_easy_setopt(e->h, CURLOPT_WRITEDATA, &w);
    curl_easy_setopt(e->h, CURLOPT_ERRORBUFFER, cerr);
    curl_multi_add_handle(e->m, e->h);
    int rc = DP_OK;
    for (;;) {
        if (atomic_load(&e->stop)) {
            rc = DP_ECANCELED;
            dp__fail(d, DP_ECANCELED, "etcd watch stopped");
            break;
        }
        int running = 0;
        CURLMcode mc = curl_multi_perform(e->m, &running);
        if (w.rc != 0) {
            rc = w.rc;
            break;
        }
        if (mc != CURLM_OK || running == 0) {
            int left;
            CURLMsg *msg = curl_multi_info_read(e->m, &left);
            CURLcode cc = msg != NULL ? msg->data.result : CURLE_OK;
            long status = 0;
            curl_easy_getinfo(e->h, CURLINFO_RESPONSE_CODE, &status);
            if (cc != CURLE_OK)
                rc = dp__fail(d, DP_ESYS, "etcd watch at %s ended: %s", e->eps[e->cur],
                              cerr[0] ? cerr : curl_easy_strerror(cc));
            else
                rc = dp__fail(d, DP_ESYS, "etcd at %s ended the watch stream (HTTP %ld)",
                              e->eps[e->cur], status);
            /* Next time, try the next endpoint. */
            e->cur = (e->cur + 1) % e->n_eps;
            break;
        }
        if (idle_s > 0 && dp__now_s() - w.last_rx > idle_s) {
            rc = dp__fail(d, DP_ETIMEDOUT, "etcd watch at %s silent for %.0f s",
                          e->eps[e->cur], idle_s);
            break;
        }
        curl_multi_poll(e->m, NULL, 0, 500, NULL);
    }
    curl_multi_remove_handle(e->m, e->h);
    curl_slist_free_all(hdr);
    cJSON_free(json);
    dp__buf_fini(&w.line);
    return rc;
}

void
dp__etcd_watch_stop(dp__etcd *e)
{
    atomic_store(&e->stop, true);
    curl_multi_wakeup(e->m);
}
