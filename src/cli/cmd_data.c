/*
 * Data commands over the client library (dataplane/client.h): `dataplane put`
 * (one value from a file) and `dataplane get` (one value to a file or
 * stdout). `dataplane bench` is in cmd_bench.c.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/cli.h"
#include "common/fileio.h"
#include "dataplane/client.h"

static const char usage_put[] =
    "usage: dataplane put --row G --field F --file PATH [options]\n"
    "\n"
    "Store the bytes of PATH ('-' for stdin) as field F of row G (key \"G@F\") on\n"
    "the unit that owns the row (G % N). Overwrites what the key held.\n"
    "\n"
    "options:\n"
    "  --row G          row index (0 .. 2^64-1)\n"
    "  --field F        field name (1..255 bytes, no '@')\n"
    "  --file PATH      the value's bytes; '-' reads stdin\n"
    "  --kind K         tensor, bytes or object (bytes; tensor when --dtype is given)\n"
    "  --dtype T        element type of a tensor: float32, bfloat16, int64, uint8...\n"
    "  --shape D,D,...  dims of a tensor (default: 1-D, from the size and a known "
    "dtype)\n"
    "  --cluster PATH   the cluster file, or a directory holding cluster.json\n"
    "                   or a registry: etcd://HOST:PORT/NAME\n"
    "                   (default: $DP_CLUSTER, else the default directory)\n"
    "  --timeout-s S    time budget of connecting, and of the put (30)\n"
    "  -h, --help       this text\n"
    "\n"
    "example:\n"
    "  dataplane put --row 17 --field input_ids --file ids.bin --dtype int64\n";

static const char usage_get[] =
    "usage: dataplane get KEY [-o PATH] [options]\n"
    "\n"
    "Fetch the value of KEY (\"<row>@<field>\", e.g. 17@input_ids) and write its\n"
    "bytes to PATH, or to stdout without -o. Its description (size, kind, dtype,\n"
    "shape, unit) goes to stderr, or to stdout with -o.\n"
    "\n"
    "options:\n"
    "  -o, --output PATH  write the bytes here (created or truncated)\n"
    "  --cluster PATH     the cluster file, or a directory holding cluster.json\n"
    "                     or a registry: etcd://HOST:PORT/NAME\n"
    "                     (default: $DP_CLUSTER, else the default directory)\n"
    "  --timeout-s S      time budget of connecting, and of the get (30)\n"
    "  -h, --help         this text\n"
    "\n"
    "example:\n"
    "  dataplane get 17@input_ids -o ids.bin\n";

enum {
    O_CLUSTER = 1,
    O_TIMEOUT,
    O_ROW,
    O_FIELD,
    O_FILE,
    O_KIND,
    O_DTYPE,
    O_SHAPE,
};

/* Bytes per element of the dtypes whose size we know; 0 if unknown. */
static uint64_t
dtype_size(const char *t)
{
    static const struct {
        const char *name;
        uint64_t size;
    } known[] = {{"float64", 8}, {"float32", 4},   {"float16", 2},    {"bfloat16", 2},
                 {"int64", 8},   {"int32", 4},     {"int16", 2},      {"int8", 1},
                 {"uint64", 8},  {"uint32", 4},    {"uint16", 2},     {"uint8", 1},
                 {"bool", 1},    {"complex64", 8}, {"complex128", 16}};
    for (size_t i = 0; i < DP_ARRAY_LEN(known); i++)
        if (strcmp(t, known[i].name) == 0)
            return known[i].size;
    return 0;
}

static int
parse_shape(const char *s, uint64_t *dims, uint32_t *ndim, dp_detail *d)
{
    *ndim = 0;
    if (*s == '\0')
        return DP_OK; /* a scalar */
    char buf[1024];
    if (snprintf(buf, sizeof buf, "%s", s) >= (int)sizeof buf)
        return dp__fail(d, DP_EINVAL, "--shape is too long");
    char *save = NULL;
    for (char *t = strtok_r(buf, ",x", &save); t != NULL;
         t = strtok_r(NULL, ",x", &save)) {
        if (*ndim >= DP_SHAPE_MAX)
            return dp__fail(d, DP_EINVAL, "--shape has more than %d dims", DP_SHAPE_MAX);
        if (dp__parse_u64(t, 0, UINT64_MAX, &dims[*ndim], "--shape dim", d) != DP_OK)
            return DP_EINVAL;
        (*ndim)++;
    }
    return DP_OK;
}

/* Read all of fd into a buffer of the client (registered) or malloc'd. */
static int
read_all(dp_client *c, int fd, const char *name, void **out, uint64_t *len, bool *reg,
         dp_detail *d)
{
    struct stat st;
    *out = NULL;
    *len = 0;
    *reg = false;
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) {
        uint64_t n = (uint64_t)st.st_size;
        if (n > 0) {
            int rc = dp_client_alloc(c, n, out, d);
            if (rc != DP_OK)
                return rc;
            *reg = true;
        }
        size_t got = 0;
        int rc = dp__read_full(fd, *out, (size_t)n, 0, &got, name, d);
        if (rc != DP_OK)
            return rc;
        if (got < n)
            return dp__fail(d, DP_EINVAL, "%s shrank while being read", name);
        *len = n;
        return DP_OK;
    }
    /* A pipe or terminal: grow a plain buffer (the put stages it). */
    dp__buf b;
    dp__buf_init(&b);
    char tmp[65536];
    size_t got = sizeof tmp; /* a read short of that met the end */
    while (got == sizeof tmp) {
        int rc = dp__read_full(fd, tmp, sizeof tmp, b.len, &got, name, d);
        if (rc != DP_OK) {
            dp__buf_fini(&b);
            return rc;
        }
        if (dp__buf_append(&b, tmp, got) != DP_OK) {
            dp__buf_fini(&b);
            return dp__fail(d, DP_ENOMEM, "%s: out of memory", name);
        }
    }
    size_t n = 0;
    *out = dp__buf_steal(&b, &n);
    *len = n;
    return DP_OK;
}

/*
 * A tensor's shape against its len bytes: without --shape (shape_s NULL), 1-D
 * from a dtype of known size; with one, checked when the size is known.
 * Returns -1 when it fits, else the exit status of a usage error (said).
 */
static int
tensor_shape(const char *dtype, const char *shape_s, uint64_t len,
             uint64_t dims[DP_SHAPE_MAX], uint32_t *ndim)
{
    uint64_t es = dtype_size(dtype);
    if (shape_s == NULL) {
        if (es == 0)
            return dp__cli_usage("put", "dtype '%s' has no known size: give --shape",
                                 dtype);
        if (len % es != 0)
            return dp__cli_usage("put",
                                 "%" PRIu64 " bytes is not a whole number of "
                                 "%s elements",
                                 len, dtype);
        dims[0] = len / es;
        *ndim = 1;
    } else if (es != 0) {
        uint64_t elems = 1;
        for (uint32_t i = 0; i < *ndim; i++)
            elems *= dims[i];
        if (elems * es != len)
            return dp__cli_usage("put",
                                 "--shape %s of %s is %" PRIu64 " bytes, the file "
                                 "has %" PRIu64,
                                 shape_s, dtype, elems * es, len);
    }
    return -1;
}

/* What put was asked for. */
typedef struct put_opts {
    const char *cluster, *field, *file, *kind_s, *dtype, *shape_s;
    uint64_t row;
    bool have_row;
    double timeout_s;
    dp_kind kind;                /* from kind_s, else from dtype */
    uint64_t dims[DP_SHAPE_MAX]; /* from shape_s */
    uint32_t ndim;
} put_opts;

/* The options of put into o (d: the detail of the last check): -1 to go on,
 * else the exit status. */
static int
put_opts_parse(int argc, char **argv, put_opts *o, dp_detail *d)
{
    static const struct option opts[] = {
        {"row", required_argument, NULL, O_ROW},
        {"field", required_argument, NULL, O_FIELD},
        {"file", required_argument, NULL, O_FILE},
        {"kind", required_argument, NULL, O_KIND},
        {"dtype", required_argument, NULL, O_DTYPE},
        {"shape", required_argument, NULL, O_SHAPE},
        {"cluster", required_argument, NULL, O_CLUSTER},
        {"timeout-s", required_argument, NULL, O_TIMEOUT},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0}};
    *o = (put_opts){.timeout_s = 30};
    int c;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        int rc = DP_OK;
        switch (c) {
        case O_ROW:
            rc = dp__parse_u64(optarg, 0, UINT64_MAX, &o->row, "--row", d);
            o->have_row = true;
            break;
        case O_FIELD:
            o->field = optarg;
            break;
        case O_FILE:
            o->file = optarg;
            break;
        case O_KIND:
            o->kind_s = optarg;
            break;
        case O_DTYPE:
            o->dtype = optarg;
            break;
        case O_SHAPE:
            o->shape_s = optarg;
            break;
        case O_CLUSTER:
            o->cluster = optarg;
            break;
        case O_TIMEOUT:
            rc = dp__cli_parse_timeout(optarg, "--timeout-s", &o->timeout_s, d);
            break;
        case 'h':
            fputs(usage_put, stdout);
            return 0;
        default:
            return dp__cli_bad_option("put", argv[optind - 1]);
        }
        if (rc != DP_OK)
            return dp__cli_usage("put", "%s", d->msg);
    }
    if (optind < argc)
        return dp__cli_unexpected("put", argv[optind]);
    return -1;
}

/* The options of put against each other: the key, the kind, a tensor's dtype
 * and shape (o->kind, o->dims). -1 to go on, else the exit status. */
static int
put_opts_check(put_opts *o, dp_detail *d)
{
    if (!o->have_row || o->field == NULL || o->file == NULL)
        return dp__cli_usage("put", "--row, --field and --file are required");
    if (*o->field == '\0' || strchr(o->field, '@') != NULL || strlen(o->field) > 255)
        return dp__cli_usage("put", "--field must be 1..255 bytes without '@', not '%s'",
                             o->field);
    o->kind = o->dtype != NULL ? DP_KIND_TENSOR : DP_KIND_BYTES;
    if (o->kind_s != NULL) {
        if (strcmp(o->kind_s, "tensor") == 0)
            o->kind = DP_KIND_TENSOR;
        else if (strcmp(o->kind_s, "bytes") == 0)
            o->kind = DP_KIND_BYTES;
        else if (strcmp(o->kind_s, "object") == 0)
            o->kind = DP_KIND_OBJECT;
        else
            return dp__cli_usage(
                "put", "--kind must be tensor, bytes or object, not '%s'", o->kind_s);
    }
    if (o->kind == DP_KIND_TENSOR && o->dtype == NULL)
        return dp__cli_usage("put", "a tensor needs --dtype (float32, int64, uint8...)");
    o->ndim = 0;
    if (o->shape_s != NULL && parse_shape(o->shape_s, o->dims, &o->ndim, d) != DP_OK)
        return dp__cli_usage("put", "%s", d->msg);
    return -1;
}

int
dp__cmd_put(int argc, char **argv)
{
    put_opts o;
    dp_detail d;
    dp_detail_clear(&d);
    int st = put_opts_parse(argc, argv, &o, &d);
    if (st < 0)
        st = put_opts_check(&o, &d);
    if (st >= 0)
        return st;

    int fd = strcmp(o.file, "-") == 0 ? 0 : open(o.file, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        fprintf(stderr, "dataplane put: cannot open %s: %s\n", o.file, strerror(errno));
        return 1;
    }
    dp_client *cl = NULL;
    int status = dp__cli_open_client("put", o.cluster, o.timeout_s, &cl);
    if (status != 0) {
        if (fd > 0)
            close(fd);
        return status;
    }
    void *data = NULL;
    uint64_t len = 0;
    bool reg = false;
    int rc = read_all(cl, fd, o.file, &data, &len, &reg, &d);
    if (fd > 0)
        close(fd);
    if (rc != DP_OK) {
        status = dp__cli_fail("put", rc, &d);
        goto out;
    }
    if (o.kind == DP_KIND_TENSOR) {
        int ts = tensor_shape(o.dtype, o.shape_s, len, o.dims, &o.ndim);
        if (ts >= 0) {
            status = ts;
            goto out;
        }
    }
    dp_value v = {.data = data,
                  .nbytes = len,
                  .kind = o.kind,
                  .dtype = o.dtype,
                  .shape = o.ndim ? o.dims : NULL,
                  .ndim = o.ndim};
    const char *fields[1] = {o.field};
    rc = dp_client_put(cl, &o.row, 1, fields, 1, &v, NULL, &d);
    if (rc != DP_OK) {
        status = dp__cli_fail("put", rc, &d);
        goto out;
    }
    char sz[32];
    printf("put %" PRIu64 "@%s: %" PRIu64 " bytes (%s), %s, on unit %u\n", o.row, o.field,
           len, dp__fmt_size(len, sz, sizeof sz), dp_kind_name(o.kind),
           dp_client_unit_of(cl, o.row));
out:
    if (reg)
        dp_client_free(cl, data);
    else
        free(data);
    dp_client_close(cl);
    return status;
}

static void
describe(FILE *f, const char *key, uint64_t n, const dp_value_desc *desc, uint32_t unit)
{
    fprintf(f, "%s: %" PRIu64 " bytes, %s", key, n, dp_kind_name(desc->kind));
    if (desc->dtype[0] != '\0')
        fprintf(f, " %s", desc->dtype);
    if (desc->ndim > 0 || desc->kind == DP_KIND_TENSOR) {
        fprintf(f, " [");
        for (uint32_t i = 0; i < desc->ndim; i++)
            fprintf(f, "%s%" PRIu64, i ? "," : "", desc->shape[i]);
        fprintf(f, "]");
    }
    fprintf(f, ", unit %u\n", unit);
}

/* Write p[0, n) to a new or truncated file: 0, or the errno of what failed. */
static int
write_file(const char *path, const void *p, uint64_t n)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return errno;
    dp_detail wd;
    dp_detail_clear(&wd);
    int err = 0;
    if (dp__write_full(fd, p, (size_t)n, 0, path, &wd) != DP_OK)
        err = wd.sys_errno;
    if (close(fd) != 0 && err == 0)
        err = errno;
    return err;
}

int
dp__cmd_get(int argc, char **argv)
{
    static const struct option opts[] = {
        {"output", required_argument, NULL, 'o'},
        {"cluster", required_argument, NULL, O_CLUSTER},
        {"timeout-s", required_argument, NULL, O_TIMEOUT},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0}};
    const char *cluster = NULL, *output = NULL;
    double timeout_s = 30;
    dp_detail d;
    dp_detail_clear(&d);
    int c;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "ho:", opts, NULL)) != -1) {
        switch (c) {
        case 'o':
            output = optarg;
            break;
        case O_CLUSTER:
            cluster = optarg;
            break;
        case O_TIMEOUT:
            if (dp__cli_parse_timeout(optarg, "--timeout-s", &timeout_s, &d) != DP_OK)
                return dp__cli_usage("get", "%s", d.msg);
            break;
        case 'h':
            fputs(usage_get, stdout);
            return 0;
        default:
            return dp__cli_bad_option("get", argv[optind - 1]);
        }
    }
    if (optind >= argc)
        return dp__cli_usage("get", "which key? e.g. 'dataplane get 17@input_ids'");
    if (optind + 1 < argc)
        return dp__cli_unexpected("get", argv[optind + 1]);
    const char *key = argv[optind];
    const char *at = strchr(key, '@');
    uint64_t row;
    char rowbuf[32];
    if (at == NULL || at == key || at[1] == '\0' || (size_t)(at - key) >= sizeof rowbuf)
        return dp__cli_usage("get", "'%s' is not a key: keys look like <row>@<field>",
                             key);
    memcpy(rowbuf, key, (size_t)(at - key));
    rowbuf[at - key] = '\0';
    if (dp__parse_u64(rowbuf, 0, UINT64_MAX, &row, "row", NULL) != DP_OK)
        return dp__cli_usage("get", "'%s' is not a key: keys look like <row>@<field>",
                             key);

    dp_client *cl = NULL;
    int status = dp__cli_open_client("get", cluster, timeout_s, &cl);
    if (status != 0)
        return status;
    dp_values *vals = NULL;
    const char *keys[1] = {key};
    int rc = dp_client_get_alloc(cl, keys, 1, &vals, &d);
    const void *data = NULL;
    uint64_t n = 0;
    const dp_value_desc *desc = NULL;
    if (rc == DP_OK)
        rc = dp_values_get(vals, 0, &data, &n, &desc);
    if (rc != DP_OK) {
        if (d.msg[0] == '\0')
            dp__fail(&d, rc, "%s", key);
        status = dp__cli_fail("get", rc, &d);
        goto out;
    }
    if (output != NULL) {
        int err = write_file(output, data, n);
        if (err != 0) {
            fprintf(stderr, "dataplane get: cannot write %s: %s\n", output,
                    strerror(err));
            status = 1;
            goto out;
        }
        describe(stdout, key, n, desc, dp_client_unit_of(cl, row));
    } else {
        /* stdout, not descriptor 1: main points that at stderr (cli.h). */
        fflush(stdout);
        dp_detail wd;
        dp_detail_clear(&wd);
        if (dp__write_full(fileno(stdout), data, (size_t)n, 0, "stdout", &wd) != DP_OK) {
            fprintf(stderr, "dataplane get: cannot write to stdout: %s\n",
                    strerror(wd.sys_errno));
            status = 1;
            goto out;
        }
        describe(stderr, key, n, desc, dp_client_unit_of(cl, row));
    }
out:
    dp_values_destroy(vals);
    dp_client_close(cl);
    return status;
}
