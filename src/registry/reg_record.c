/*
 * The unit registry's shared pieces (see registry.h): its URL, its keys, and
 * a unit's record encoded and decoded (checked as input from outside). A
 * unit's registration is reg_unit.c; a client's side (reading a cluster, the
 * watch, the operator's list, dp__reg_resolve) is reg_client.c.
 */
#include "registry/registry.h"

#include <cjson/cJSON.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define REG_VERSION 1

bool
dp__reg_is_url(const char *s)
{
    return s != NULL && strncmp(s, DP_REG_SCHEME, strlen(DP_REG_SCHEME)) == 0;
}

int
dp__reg_url_parse(const char *s, dp__reg_url *u, dp_detail *d)
{
    memset(u, 0, sizeof *u);
    if (!dp__reg_is_url(s))
        return dp__fail(d, DP_EINVAL, "registry '%s' is not etcd://HOST:PORT/NAME",
                        s != NULL ? s : "(null)");
    if (strlen(s) >= sizeof u->text)
        return dp__fail(d, DP_EINVAL, "registry URL is longer than %zu bytes",
                        sizeof u->text - 1);
    snprintf(u->text, sizeof u->text, "%s", s);
    const char *hosts = s + strlen(DP_REG_SCHEME);
    const char *slash = strchr(hosts, '/');
    if (slash == NULL || slash == hosts)
        return dp__fail(d, DP_EINVAL,
                        "registry '%s' needs etcd's address and a cluster name: "
                        "etcd://HOST:PORT[,HOST:PORT...]/NAME",
                        s);
    size_t hn = (size_t)(slash - hosts);
    if (hn >= sizeof u->endpoints)
        return dp__fail(d, DP_EINVAL, "registry '%s': the etcd endpoints are too long",
                        s);
    memcpy(u->endpoints, hosts, hn);
    const char *name = slash + 1;
    if (!dp__id_valid(name, strlen(name), sizeof u->name - 1))
        return dp__fail(d, DP_EINVAL,
                        "registry '%s': the cluster name '%s' must be 1..%zu bytes of "
                        "[A-Za-z0-9_.:-]",
                        s, name, sizeof u->name - 1);
    snprintf(u->name, sizeof u->name, "%s", name);
    /* Check the endpoints the way the etcd client will read them. */
    dp__etcd *e = NULL;
    int rc = dp__etcd_create(u->endpoints, 1.0, &e, d);
    dp__etcd_destroy(e);
    if (rc != DP_OK)
        return dp__fail_ctx(d, rc, "registry '%s'", s);
    return DP_OK;
}

void
dp__reg_prefix(const dp__reg_url *u, char *buf, size_t cap)
{
    snprintf(buf, cap, "dataplane/%s/units/", u->name);
}

void
dp__reg_key(const dp__reg_url *u, uint32_t id, char *buf, size_t cap)
{
    snprintf(buf, cap, "dataplane/%s/units/%" PRIu32, u->name, id);
}

/* ---- records ---- */

static bool
add_hex64(cJSON *o, const char *name, uint64_t v)
{
    char s[17];
    snprintf(s, sizeof s, "%016" PRIx64, v);
    return cJSON_AddStringToObject(o, name, s) != NULL;
}

int
dp__reg_record_encode(const dp__reg_record *r, dp__buf *out, dp_detail *d)
{
    cJSON *o = cJSON_CreateObject();
    bool ok = o != NULL && cJSON_AddNumberToObject(o, "version", REG_VERSION) &&
              cJSON_AddStringToObject(o, "cluster", r->cluster) &&
              cJSON_AddNumberToObject(o, "id", r->id) &&
              cJSON_AddNumberToObject(o, "units", r->n_units) &&
              cJSON_AddNumberToObject(o, "replicas", r->replicas > 0 ? r->replicas : 1) &&
              cJSON_AddStringToObject(o, "zmq", r->zmq) &&
              cJSON_AddStringToObject(o, "agent", r->agent) &&
              add_hex64(o, "incarnation", r->incarnation) &&
              cJSON_AddNumberToObject(o, "pid", (double)r->pid) &&
              cJSON_AddStringToObject(o, "host", r->host) &&
              cJSON_AddNumberToObject(o, "slab_bytes", (double)r->slab_bytes) &&
              cJSON_AddNumberToObject(o, "ssd_bytes", (double)r->ssd_bytes) &&
              cJSON_AddStringToObject(o, "transports", r->transports) &&
              cJSON_AddStringToObject(o, "pubkey", r->pubkey) &&
              cJSON_AddNumberToObject(o, "started", (double)(int64_t)r->started);
    char *s = ok ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    if (s == NULL || dp__buf_append(out, s, strlen(s)) != 0) {
        cJSON_free(s);
        return dp__fail(d, DP_ENOMEM, "registry: out of memory");
    }
    cJSON_free(s);
    return DP_OK;
}

/* Field checks of a record; each failure names the key and the field. */
static int
rec_str(const cJSON *o, const char *f, char *dst, size_t cap, bool may_be_empty,
        const char *key, dp_detail *d)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, f);
    if (!cJSON_IsString(v))
        return dp__fail(d, DP_EPROTO, "registry record %s: \"%s\" must be a string", key,
                        f);
    size_t n = strlen(v->valuestring);
    if ((n == 0 && !may_be_empty) || n >= cap)
        return dp__fail(d, DP_EPROTO, "registry record %s: \"%s\" must be %s..%zu bytes",
                        key, f, may_be_empty ? "0" : "1", cap - 1);
    for (size_t k = 0; k < n; k++)
        if ((unsigned char)v->valuestring[k] < 0x20 || v->valuestring[k] == 0x7f)
            return dp__fail(d, DP_EPROTO,
                            "registry record %s: \"%s\" has a control character", key, f);
    memcpy(dst, v->valuestring, n + 1);
    return DP_OK;
}

static int
rec_num(const cJSON *o, const char *f, double lo, double hi, double *out, const char *key,
        dp_detail *d)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, f);
    /* The range first: converting a double outside int64's is undefined. */
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= lo && v->valuedouble <= hi) ||
        v->valuedouble != (double)(int64_t)v->valuedouble)
        return dp__fail(d, DP_EPROTO,
                        "registry record %s: \"%s\" must be an integer in [%.0f, %.0f]",
                        key, f, lo, hi);
    /* Through int64: "-0" is 0, not the double -0.0 (which would not survive an
     * encode/decode round trip bit for bit). */
    *out = (double)(int64_t)v->valuedouble;
    return DP_OK;
}

int
dp__reg_record_decode(const dp__reg_url *u, const char *key, const char *json, size_t len,
                      dp__reg_record *r, dp_detail *d)
{
    memset(r, 0, sizeof *r);
    cJSON *o = cJSON_ParseWithLength(json, len);
    if (!cJSON_IsObject(o)) {
        cJSON_Delete(o);
        return dp__fail(d, DP_EPROTO, "registry record %s is not a JSON object", key);
    }
    double ver = 0, id = 0, n = 0, pid = 0, slab = 0, ssd = 0, started = 0;
    char inc[17];
    int rc;
    if ((rc = rec_num(o, "version", REG_VERSION, REG_VERSION, &ver, key, d)) != 0 ||
        (rc = rec_str(o, "cluster", r->cluster, sizeof r->cluster, false, key, d)) != 0 ||
        (rc = rec_num(o, "id", 0, DP_CLUSTER_MAX_UNITS - 1, &id, key, d)) != 0 ||
        (rc = rec_num(o, "units", 1, DP_CLUSTER_MAX_UNITS, &n, key, d)) != 0 ||
        (rc = rec_str(o, "zmq", r->zmq, sizeof r->zmq, false, key, d)) != 0 ||
        (rc = rec_str(o, "agent", r->agent, sizeof r->agent, false, key, d)) != 0 ||
        (rc = rec_str(o, "incarnation", inc, sizeof inc, false, key, d)) != 0 ||
        (rc = rec_num(o, "pid", 0, 4194304, &pid, key, d)) != 0 ||
        (rc = rec_str(o, "host", r->host, sizeof r->host, true, key, d)) != 0 ||
        (rc = rec_num(o, "slab_bytes", 0, 9007199254740992.0, &slab, key, d)) != 0 ||
        (rc = rec_num(o, "ssd_bytes", 0, 9007199254740992.0, &ssd, key, d)) != 0 ||
        (rc = rec_str(o, "transports", r->transports, sizeof r->transports, true, key,
                      d)) != 0 ||
        (rc = rec_str(o, "pubkey", r->pubkey, sizeof r->pubkey, true, key, d)) != 0 ||
        (rc = rec_num(o, "started", 0, 1e11, &started, key, d)) != 0)
        goto out;
    double reps = 1;
    if (cJSON_GetObjectItemCaseSensitive(o, "replicas") != NULL &&
        (rc = rec_num(o, "replicas", 1, 3, &reps, key, d)) != 0)
        goto out;
    r->id = (uint32_t)id;
    r->n_units = (uint32_t)n;
    r->replicas = (uint32_t)reps;
    r->pid = (int64_t)pid;
    r->slab_bytes = (uint64_t)slab;
    r->ssd_bytes = (uint64_t)ssd;
    r->started = started;
    rc = DP_EPROTO;
    char want[DP_REG_KEY_MAX];
    dp__reg_key(u, r->id, want, sizeof want);
    if (strcmp(r->cluster, u->name) != 0) {
        dp__fail(d, rc, "registry record %s names cluster '%s', not '%s'", key,
                 r->cluster, u->name);
        goto out;
    }
    if (strcmp(want, key) != 0) {
        dp__fail(d, rc, "registry record %s says it is unit %" PRIu32 " (key %s)", key,
                 r->id, want);
        goto out;
    }
    if (r->id >= r->n_units) {
        dp__fail(d, rc, "registry record %s: unit %" PRIu32 " of %" PRIu32 " units", key,
                 r->id, r->n_units);
        goto out;
    }
    if (r->replicas > r->n_units) {
        dp__fail(d, rc,
                 "registry record %s: %" PRIu32 " copies of each row on %" PRIu32
                 " units",
                 key, r->replicas, r->n_units);
        goto out;
    }
    const char *colon = strrchr(r->zmq, ':');
    if (strncmp(r->zmq, "tcp://", 6) != 0 || colon == NULL || colon <= r->zmq + 6 ||
        colon[1] == '\0') {
        dp__fail(d, rc, "registry record %s: \"zmq\" '%s' is not tcp://host:port", key,
                 r->zmq);
        goto out;
    }
    /* A CURVE public key: 40 characters of Z85's alphabet, or none. */
    size_t pkn = strlen(r->pubkey);
    bool pk_ok = pkn == 0 || pkn == 40;
    for (size_t k = 0; pk_ok && k < pkn; k++)
        pk_ok = strchr("0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                       ".-:+=^!/*?&<>()[]{}@%$#",
                       r->pubkey[k]) != NULL;
    if (!pk_ok) {
        dp__fail(d, rc,
                 "registry record %s: \"pubkey\" is not a CURVE public key (40 Z85 "
                 "characters)",
                 key);
        goto out;
    }
    bool hex = strlen(inc) == 16;
    for (int k = 0; hex && k < 16; k++) {
        char c = inc[k];
        int x = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        hex = x >= 0;
        r->incarnation = r->incarnation << 4 | (uint64_t)(x >= 0 ? x : 0);
    }
    if (!hex || r->incarnation == 0) {
        dp__fail(d, rc,
                 "registry record %s: \"incarnation\" must be 16 lowercase hex digits, "
                 "not all zero",
                 key);
        goto out;
    }
    rc = DP_OK;
out:
    cJSON_Delete(o);
    return rc;
}
