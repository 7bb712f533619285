/*
 * Reading and writing cluster files (see cluster.h). The file comes from
 * outside (a launcher, a person editing it): every field is checked, and an
 * error names the file and the field.
 */
#include "cluster/cluster.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/fileio.h"
#include "ctl/ctl.h"

#define MAX_FILE_BYTES (4u << 20)

const char *
dp__cluster_default_dir(char *buf, size_t len)
{
    const char *xdg = getenv("XDG_RUNTIME_DIR");
    if (xdg != NULL && xdg[0] == '/')
        snprintf(buf, len, "%s/dataplane", xdg);
    else
        snprintf(buf, len, "/tmp/dataplane-%u", (unsigned)getuid());
    return buf;
}

int
dp__cluster_locate(const char *arg, char *path, size_t len, dp_detail *d)
{
    const char *p = arg;
    if (p == NULL || *p == '\0')
        p = getenv("DP_CLUSTER");
    char dir[PATH_MAX];
    if (p == NULL || *p == '\0')
        p = dp__cluster_default_dir(dir, sizeof dir);
    struct stat st;
    int n;
    if (stat(p, &st) == 0 && S_ISDIR(st.st_mode))
        n = snprintf(path, len, "%s/%s", p, DP_CLUSTER_FILE);
    else
        n = snprintf(path, len, "%s", p);
    if (n < 0 || (size_t)n >= len)
        return dp__fail(d, DP_EINVAL, "cluster path '%s' is too long", p);
    return DP_OK;
}

/* What a file type is, for an error that says what the path names. */
static const char *
file_kind(mode_t m)
{
    if (S_ISDIR(m))
        return "a directory";
    if (S_ISFIFO(m))
        return "a FIFO (named pipe)";
    if (S_ISSOCK(m))
        return "a socket";
    if (S_ISCHR(m))
        return "a character device";
    if (S_ISBLK(m))
        return "a block device";
    return "not a regular file";
}

static int
not_regular(const char *path, mode_t m, dp_detail *d)
{
    return dp__fail(d, DP_EINVAL,
                    "cluster file %s is %s, not a regular file: point --cluster or "
                    "DP_CLUSTER at the cluster.json that 'dataplane up' (or your "
                    "launcher) wrote, or at its directory",
                    path, file_kind(m));
}

/*
 * Read the whole file. Only a regular file is read: the path is checked with
 * stat first, so a device is never opened (opening some has side effects),
 * then opened with O_NONBLOCK (a FIFO swapped in meanwhile cannot block the
 * open) and checked again with fstat, which is what counts.
 */
static int
read_file(const char *path, char **out, dp_detail *d)
{
    struct stat st;
    if (stat(path, &st) == 0 && !S_ISREG(st.st_mode))
        return not_regular(path, st.st_mode, d);
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ENOENT)
            return dp__fail(d, DP_ENOTFOUND,
                            "no cluster file at %s: start a cluster with 'dataplane up', "
                            "or point --cluster / DP_CLUSTER at its cluster.json",
                            path);
        int e = errno;
        if (stat(path, &st) == 0 && !S_ISREG(st.st_mode))
            return not_regular(path, st.st_mode, d);
        return dp__fail_sys(d, e, "open cluster file %s", path);
    }
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return dp__fail_sys(d, e, "stat cluster file %s", path);
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return not_regular(path, st.st_mode, d);
    }
    if (st.st_size > MAX_FILE_BYTES) {
        close(fd);
        return dp__fail(d, DP_EPROTO,
                        "cluster file %s is %lld bytes; a cluster file is at most %u",
                        path, (long long)st.st_size, MAX_FILE_BYTES);
    }
    char *buf = malloc((size_t)st.st_size + 1);
    if (buf == NULL) {
        close(fd);
        return dp__fail(d, DP_ENOMEM, "cluster file %s: out of memory", path);
    }
    /* The size is from fstat; a file that shrinks meanwhile reads short. */
    char label[PATH_MAX + 16];
    snprintf(label, sizeof label, "cluster file %s", path);
    size_t got = 0;
    int rc = dp__read_full(fd, buf, (size_t)st.st_size, 0, &got, label, d);
    close(fd);
    if (rc != DP_OK) {
        free(buf);
        return rc;
    }
    buf[got] = '\0';
    *out = buf;
    return DP_OK;
}

static int
get_str(const cJSON *o, const char *key, char *dst, size_t cap, const char *path, int i,
        dp_detail *d)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsString(v) || v->valuestring == NULL)
        return dp__fail(d, DP_EPROTO, "cluster file %s: units[%d].%s must be a string",
                        path, i, key);
    size_t n = strlen(v->valuestring);
    if (n == 0 || n >= cap)
        return dp__fail(d, DP_EPROTO,
                        "cluster file %s: units[%d].%s must be 1..%zu bytes", path, i,
                        key, cap - 1);
    for (size_t k = 0; k < n; k++)
        if ((unsigned char)v->valuestring[k] < 0x20 || v->valuestring[k] == 0x7f)
            return dp__fail(d, DP_EPROTO,
                            "cluster file %s: units[%d].%s has a control character", path,
                            i, key);
    memcpy(dst, v->valuestring, n + 1);
    return DP_OK;
}

/* An optional 64-bit value written as 16 hex digits (0 when absent). */
static int
get_hex64(const cJSON *o, const char *key, uint64_t *out, const char *path, int i,
          dp_detail *d)
{
    *out = 0;
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (v == NULL)
        return DP_OK;
    const char *s = cJSON_IsString(v) ? v->valuestring : NULL;
    bool ok = s != NULL && strlen(s) == 16;
    for (int k = 0; ok && k < 16; k++) {
        char c = s[k];
        int x = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        ok = x >= 0;
        *out = *out << 4 | (uint64_t)(x >= 0 ? x : 0);
    }
    if (!ok) {
        *out = 0;
        return dp__fail(d, DP_EPROTO,
                        "cluster file %s: units[%d].%s must be 16 lowercase hex digits",
                        path, i, key);
    }
    return DP_OK;
}

/* An integer member of a unit: its name, its bounds, whether it must be there. */
typedef struct int_member {
    const char *key;
    double lo, hi;
    bool required; /* else absent reads as 0 */
} int_member;

static const int_member member_id = {"id", 0, DP_CLUSTER_MAX_UNITS, true};
static const int_member member_pid = {"pid", 0, 4194304, false};

static int
get_int(const cJSON *o, const int_member *m, int64_t *out, const char *path, int i,
        dp_detail *d)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, m->key);
    if (v == NULL && !m->required) {
        *out = 0;
        return DP_OK;
    }
    /* The range first: converting a double outside int64's is undefined. */
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= m->lo && v->valuedouble <= m->hi) ||
        v->valuedouble != (double)(int64_t)v->valuedouble)
        return dp__fail(
            d, DP_EPROTO,
            "cluster file %s: units[%d].%s must be an integer in [%.0f, %.0f]", path, i,
            m->key, m->lo, m->hi);
    *out = (int64_t)v->valuedouble;
    return DP_OK;
}

int
dp__cluster_load(const char *path, dp__cluster *out, dp_detail *d)
{
    memset(out, 0, sizeof *out);
    char *text = NULL;
    int rc = read_file(path, &text, d);
    if (rc != DP_OK)
        return rc;
    cJSON *root = cJSON_Parse(text);
    free(text);
    if (root == NULL)
        return dp__fail(d, DP_EPROTO, "cluster file %s is not valid JSON", path);
    const cJSON *ver = cJSON_GetObjectItemCaseSensitive(root, "version");
    const cJSON *units = cJSON_GetObjectItemCaseSensitive(root, "units");
    if (!cJSON_IsNumber(ver) || ver->valuedouble != 1) {
        rc = dp__fail(d, DP_EPROTO, "cluster file %s: \"version\" must be 1", path);
        goto out;
    }
    const cJSON *cid = cJSON_GetObjectItemCaseSensitive(root, "cluster");
    if (cid != NULL) {
        const char *v = cJSON_IsString(cid) ? cid->valuestring : NULL;
        size_t vn = v != NULL ? strlen(v) : 0;
        if (!dp__id_valid(v, vn, sizeof out->cluster_id - 1)) {
            rc = dp__fail(d, DP_EPROTO,
                          "cluster file %s: \"cluster\" must be 1..%zu bytes of "
                          "[A-Za-z0-9_.:-]",
                          path, sizeof out->cluster_id - 1);
            goto out;
        }
        memcpy(out->cluster_id, v, vn + 1);
    }
    const cJSON *rep = cJSON_GetObjectItemCaseSensitive(root, "replicas");
    int n = cJSON_GetArraySize(units);
    if (rep != NULL &&
        (!cJSON_IsNumber(rep) || rep->valuedouble < 1 || rep->valuedouble > 3 ||
         rep->valuedouble != (int)rep->valuedouble ||
         (cJSON_IsArray(units) && rep->valuedouble > n))) {
        rc = dp__fail(d, DP_EPROTO,
                      "cluster file %s: \"replicas\" must be 1, 2 or 3 and at most the "
                      "number of units",
                      path);
        goto out;
    }
    if (rep != NULL)
        out->replicas = (uint32_t)rep->valueint;
    if (!cJSON_IsArray(units) || n < 1 || n > DP_CLUSTER_MAX_UNITS) {
        rc = dp__fail(d, DP_EPROTO,
                      "cluster file %s: \"units\" must be a list of 1..%d units", path,
                      DP_CLUSTER_MAX_UNITS);
        goto out;
    }
    out->units = calloc((size_t)n, sizeof *out->units);
    if (out->units == NULL) {
        rc = dp__fail(d, DP_ENOMEM, "cluster file %s: out of memory", path);
        goto out;
    }
    int i = 0;
    const cJSON *u;
    cJSON_ArrayForEach(u, units)
    {
        dp__cluster_unit *cu = &out->units[i];
        int64_t id = 0, pid = 0;
        if (!cJSON_IsObject(u)) {
            rc = dp__fail(d, DP_EPROTO, "cluster file %s: units[%d] must be an object",
                          path, i);
            goto out;
        }
        if ((rc = get_int(u, &member_id, &id, path, i, d)) != 0 ||
            (rc = get_int(u, &member_pid, &pid, path, i, d)) != 0 ||
            (rc = get_str(u, "zmq", cu->zmq, sizeof cu->zmq, path, i, d)) != 0 ||
            (rc = get_str(u, "agent", cu->agent, sizeof cu->agent, path, i, d)) != 0 ||
            (rc = get_hex64(u, "incarnation", &cu->incarnation, path, i, d)) != 0)
            goto out;
        const cJSON *pk = cJSON_GetObjectItemCaseSensitive(u, "pubkey");
        if (pk != NULL && !(cJSON_IsString(pk) && (pk->valuestring[0] == '\0' ||
                                                   dp__ctl_key_valid(pk->valuestring)))) {
            rc = dp__fail(
                d, DP_EPROTO,
                "cluster file %s: units[%d].pubkey must be a CURVE public key (40 "
                "Z85 characters, a unit's PATH.pub)",
                path, i);
            goto out;
        }
        if (pk != NULL)
            snprintf(cu->pubkey, sizeof cu->pubkey, "%s", pk->valuestring);
        if (id != i) {
            rc = dp__fail(d, DP_EPROTO,
                          "cluster file %s: units[%d] has id %lld; units must be listed "
                          "in id order 0..%d",
                          path, i, (long long)id, n - 1);
            goto out;
        }
        if (strncmp(cu->zmq, "tcp://", 6) != 0 || strrchr(cu->zmq, ':') == cu->zmq + 3) {
            rc = dp__fail(d, DP_EPROTO,
                          "cluster file %s: units[%d].zmq '%s' is not tcp://host:port",
                          path, i, cu->zmq);
            goto out;
        }
        cu->id = (uint32_t)id;
        cu->pid = pid;
        i++;
    }
    out->n_units = (uint32_t)n;
    rc = DP_OK;
out:
    cJSON_Delete(root);
    if (rc != DP_OK)
        dp__cluster_fini(out);
    return rc;
}

static const char *
hex16(uint64_t v, char out[17])
{
    snprintf(out, 17, "%016llx", (unsigned long long)v);
    return out;
}

int
dp__cluster_save(const char *path, const dp__cluster *c, dp_detail *d)
{
    int rc = DP_OK;
    char *text = NULL;
    cJSON *root = cJSON_CreateObject();
    cJSON *units = cJSON_AddArrayToObject(root, "units");
    if (root == NULL || units == NULL ||
        cJSON_AddNumberToObject(root, "version", 1) == NULL ||
        (c->cluster_id[0] != '\0' &&
         cJSON_AddStringToObject(root, "cluster", c->cluster_id) == NULL) ||
        (c->replicas > 1 &&
         cJSON_AddNumberToObject(root, "replicas", c->replicas) == NULL)) {
        rc = dp__fail(d, DP_ENOMEM, "cluster file: out of memory");
        goto out;
    }
    for (uint32_t i = 0; i < c->n_units; i++) {
        const dp__cluster_unit *u = &c->units[i];
        char inc[17];
        cJSON *o = cJSON_CreateObject();
        if (o == NULL || !cJSON_AddItemToArray(units, o) ||
            cJSON_AddNumberToObject(o, "id", u->id) == NULL ||
            cJSON_AddStringToObject(o, "zmq", u->zmq) == NULL ||
            cJSON_AddStringToObject(o, "agent", u->agent) == NULL ||
            cJSON_AddNumberToObject(o, "pid", (double)u->pid) == NULL ||
            (u->incarnation != 0 &&
             cJSON_AddStringToObject(o, "incarnation", hex16(u->incarnation, inc)) ==
                 NULL) ||
            (u->pubkey[0] != '\0' &&
             cJSON_AddStringToObject(o, "pubkey", u->pubkey) == NULL)) {
            rc = dp__fail(d, DP_ENOMEM, "cluster file: out of memory");
            goto out;
        }
    }
    text = cJSON_Print(root);
    if (text == NULL) {
        rc = dp__fail(d, DP_ENOMEM, "cluster file: out of memory");
        goto out;
    }
    char tmp[PATH_MAX];
    if (snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid()) >= (int)sizeof tmp) {
        rc = dp__fail(d, DP_EINVAL, "cluster path '%s' is too long", path);
        goto out;
    }
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        rc = dp__fail_sys(d, errno, "create %s", tmp);
        goto out;
    }
    size_t len = strlen(text);
    rc = dp__write_full(fd, text, len, 0, tmp, d);
    if (rc == DP_OK)
        rc = dp__write_full(fd, "\n", 1, len, tmp, d);
    if (rc == DP_OK && fsync(fd) != 0)
        rc = dp__fail_sys(d, errno, "write %s", tmp);
    close(fd);
    if (rc == DP_OK && rename(tmp, path) != 0)
        rc = dp__fail_sys(d, errno, "rename %s to %s", tmp, path);
    if (rc != DP_OK)
        unlink(tmp);
out:
    free(text);
    cJSON_Delete(root);
    return rc;
}

void
dp__cluster_fini(dp__cluster *c)
{
    free(c->units);
    memset(c, 0, sizeof *c);
}
