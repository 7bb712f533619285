/*
 * dataplane._core.Client: one library client (dp_client) per object
 * (docs/design.md, "Python package"). The Python layer (dataplane/client.py)
 * turns tensors, arrays and bytes into the cell forms this file takes; here
 * they become dp_value arrays and the library is called with the GIL
 * released. See dp_py.h for close, buffers and fork.
 */
#include "dp_py.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* ---- calls in flight and close ---- */

bool
dp__py_client_enter(DpClient *self)
{
    if (self->pid != getpid()) {
        dp__py_raise_forked("Client", self->pid);
        return false;
    }
    pthread_mutex_lock(&self->mu);
    bool ok = !self->closed && self->c != NULL;
    if (ok)
        self->busy++;
    pthread_mutex_unlock(&self->mu);
    if (!ok)
        dp__py_raise_ex(DP_ECLOSED, "this Client is closed", NULL, NULL, NULL);
    return ok;
}

void
dp__py_client_leave(DpClient *self)
{
    pthread_mutex_lock(&self->mu);
    if (--self->busy == 0)
        pthread_cond_broadcast(&self->cv);
    pthread_mutex_unlock(&self->mu);
}

/* Registered regions a failed transfer may still touch keep their owners for good. */
static void
keep_touched_regions(DpClient *self)
{
    if (self->regs == NULL)
        return;
    PyObject *k, *v;
    Py_ssize_t pos = 0;
    while (PyDict_Next(self->regs, &pos, &k, &v)) {
        void *addr = PyLong_AsVoidPtr(k);
        uint64_t n = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(v, 1));
        if (dp_client_touches_unfinished(self->c, addr, (size_t)n))
            dp__py_keep_forever(v);
    }
}

/* Close the library's client; the caller holds the GIL and busy is 0. */
static void
close_now(DpClient *self)
{
    dp_client *c = self->c;
    if (c == NULL)
        return;
    PyObject *et, *ev, *tb; /* this may run in a dealloc while an exception flies */
    PyErr_Fetch(&et, &ev, &tb);
    keep_touched_regions(self);
    self->c = NULL;
    Py_BEGIN_ALLOW_THREADS
    dp_client_close(c);
    Py_END_ALLOW_THREADS
    Py_CLEAR(self->regs);
    PyErr_Clear();
    PyErr_Restore(et, ev, tb);
}

void
dp__py_client_buffer_gone(DpClient *self)
{
    pthread_mutex_lock(&self->mu);
    /* With calls in flight, the close() waiting for them closes. */
    bool last = --self->n_bufs == 0 && self->closed && self->busy == 0;
    pthread_mutex_unlock(&self->mu);
    if (last && self->pid == getpid())
        close_now(self);
}

static PyObject *
client_close(DpClient *self, PyObject *noarg)
{
    (void)noarg;
    if (self->pid != getpid()) {
        self->closed = true; /* the parent's resources: leave them alone */
        Py_RETURN_NONE;
    }
    bool now;
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&self->mu);
    self->closed = true;
    while (self->busy > 0)
        pthread_cond_wait(&self->cv, &self->mu);
    now = self->n_bufs == 0;
    pthread_mutex_unlock(&self->mu);
    Py_END_ALLOW_THREADS
    if (now)
        close_now(self);
    Py_RETURN_NONE;
}

/* ---- lifecycle ---- */

static void
client_dealloc(DpClient *self)
{
    if (self->c != NULL && self->pid == getpid() && self->n_bufs == 0)
        close_now(self);
    Py_CLEAR(self->regs);
    pthread_mutex_destroy(&self->mu);
    pthread_cond_destroy(&self->cv);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
client_new(PyTypeObject *t, PyObject *args, PyObject *kw)
{
    (void)args;
    (void)kw;
    DpClient *self = (DpClient *)t->tp_alloc(t, 0);
    if (self == NULL)
        return NULL;
    pthread_mutex_init(&self->mu, NULL);
    pthread_cond_init(&self->cv, NULL);
    self->pid = getpid();
    return (PyObject *)self;
}

/* Addresses of a list of "tcp://..." strings, borrowed from the list. */
static int
addr_list(PyObject *addrs, const char ***out, uint32_t *n)
{
    if (!PyList_Check(addrs) && !PyTuple_Check(addrs)) {
        PyErr_SetString(PyExc_TypeError, "addrs: a list of 'tcp://host:port' strings");
        return -1;
    }
    Py_ssize_t cnt = PySequence_Fast_GET_SIZE(addrs);
    if (cnt < 1 || cnt > 65536) {
        PyErr_Format(PyExc_ValueError, "addrs: 1..65536 addresses, got %zd", cnt);
        return -1;
    }
    const char **a = PyMem_Calloc((size_t)cnt, sizeof *a);
    if (a == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < cnt; i++) {
        PyObject *s = PySequence_Fast_ITEMS(addrs)[i];
        a[i] = PyUnicode_Check(s) ? PyUnicode_AsUTF8(s) : NULL;
        if (a[i] == NULL) {
            PyMem_Free(a);
            if (!PyErr_Occurred())
                PyErr_Format(PyExc_TypeError, "addrs[%zd]: a str is needed", i);
            return -1;
        }
    }
    *out = a;
    *n = (uint32_t)cnt;
    return 0;
}

static int
client_init(DpClient *self, PyObject *args, PyObject *kw)
{
    static char *kwl[] = {"cluster",
                          "addrs",
                          "timeout_s",
                          "connect_timeout_s",
                          "staging_cache_bytes",
                          "crc",
                          "no_spill",
                          "require_rdma",
                          "name",
                          "curve_secret",
                          "inline_bytes",
                          NULL};
    const char *cluster = NULL, *name = NULL, *curve = NULL;
    PyObject *addrs = Py_None;
    dp_client_opts o;
    dp_client_opts_init(&o);
    int crc = 0, no_spill = 0, rdma = 0;
    unsigned long long cache = 0, inl = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|zOddKpppzzK", kwl, &cluster, &addrs,
                                     &o.timeout_s, &o.connect_timeout_s, &cache, &crc,
                                     &no_spill, &rdma, &name, &curve, &inl))
        return -1;
    if (self->c != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Client is already open");
        return -1;
    }
    o.staging_cache_bytes = cache;
    o.inline_bytes = inl; /* 0: the default; DP_INLINE_OFF: never */
    o.crc = crc;
    o.no_spill = no_spill;
    o.require_rdma = rdma;
    o.name = name;
    o.curve_secret = curve; /* NULL: $DP_CURVE_SECRET */
    dp_detail d = {0};
    int rc;
    dp_client *c = NULL;
    if (addrs != Py_None) {
        const char **a;
        uint32_t n;
        if (addr_list(addrs, &a, &n) < 0)
            return -1;
        Py_BEGIN_ALLOW_THREADS
        rc = dp_client_open_units(a, n, &o, &c, &d);
        Py_END_ALLOW_THREADS
        PyMem_Free(a);
    } else {
        Py_BEGIN_ALLOW_THREADS
        rc = dp_client_open(cluster, &o, &c, &d);
        Py_END_ALLOW_THREADS
    }
    if (rc != DP_OK) {
        dp__py_raise(rc, &d);
        return -1;
    }
    self->c = c;
    self->regs = PyDict_New();
    return self->regs != NULL ? 0 : -1;
}

/* ---- put ---- */

/* What one put call holds while the library runs. */
typedef struct put_call {
    size_t n_rows, n_fields;
    uint64_t *rows;
    const char **fields;
    dp_value *vals;
    uint64_t *dims; /* every shape, back to back; vals[i].shape points in */
    size_t n_dims, cap_dims;
    Py_buffer *bufs;
    size_t n_bufs, cap_bufs;
    PyObject *dtypes; /* list keeping generated dtype strings alive */
} put_call;

static void
put_call_fini(put_call *p)
{
    for (size_t i = 0; i < p->n_bufs; i++)
        PyBuffer_Release(&p->bufs[i]);
    PyMem_Free(p->rows);
    PyMem_Free(p->fields);
    PyMem_Free(p->vals);
    PyMem_Free(p->dims);
    PyMem_Free(p->bufs);
    Py_XDECREF(p->dtypes);
}

/* Room for k more dims; the offset of the first in *at. */
static int
dims_take(put_call *p, size_t k, size_t *at)
{
    if (p->n_dims + k > p->cap_dims) {
        size_t cap = p->cap_dims ? p->cap_dims * 2 : 256;
        while (cap < p->n_dims + k)
            cap *= 2;
        uint64_t *d = PyMem_Realloc(p->dims, cap * sizeof *d);
        if (d == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        p->dims = d;
        p->cap_dims = cap;
    }
    *at = p->n_dims;
    p->n_dims += k;
    return 0;
}

/* A shape tuple into the dims pool: v->shape holds the offset until fixed up. */
static int
shape_in(put_call *p, PyObject *shape, dp_value *v, const char *what)
{
    PyObject *seq = PySequence_Fast(shape, "shape: a tuple of ints is needed");
    if (seq == NULL)
        return -1;
    Py_ssize_t nd = PySequence_Fast_GET_SIZE(seq);
    size_t at;
    if (nd > DP_SHAPE_MAX) {
        PyErr_Format(PyExc_ValueError, "%s: %zd dims (at most %d)", what, nd,
                     DP_SHAPE_MAX);
        Py_DECREF(seq);
        return -1;
    }
    if (dims_take(p, (size_t)nd, &at) < 0) {
        Py_DECREF(seq);
        return -1;
    }
    for (Py_ssize_t i = 0; i < nd; i++) {
        unsigned long long x = PyLong_AsUnsignedLongLong(PySequence_Fast_ITEMS(seq)[i]);
        if (x == (unsigned long long)-1 && PyErr_Occurred()) {
            Py_DECREF(seq);
            return -1;
        }
        p->dims[at + (size_t)i] = x;
    }
    Py_DECREF(seq);
    v->ndim = (uint32_t)nd;
    v->shape = (const uint64_t *)(uintptr_t)at;
    return 0;
}

/* The stored dtype of a buffer's struct format: "np_<numpy name>", or NULL. */
static const char *
np_dtype_of(const char *f, Py_ssize_t itemsize)
{
    if (f == NULL)
        return "np_uint8";
    if (*f == '@' || *f == '=' || *f == '<')
        f++;
    static const struct {
        const char *fmt;
        const char *name;
    } t[] = {
        {"?", "np_bool"},       {"b", "np_int8"},        {"B", "np_uint8"},
        {"h", "np_int16"},      {"H", "np_uint16"},      {"i", "np_int32"},
        {"I", "np_uint32"},     {"q", "np_int64"},       {"Q", "np_uint64"},
        {"e", "np_float16"},    {"f", "np_float32"},     {"d", "np_float64"},
        {"Zf", "np_complex64"}, {"Zd", "np_complex128"},
    };
    if (strcmp(f, "l") == 0)
        return itemsize == 8 ? "np_int64" : "np_int32";
    if (strcmp(f, "L") == 0)
        return itemsize == 8 ? "np_uint64" : "np_uint32";
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
        if (strcmp(f, t[i].fmt) == 0)
            return t[i].name;
    return NULL;
}

/* A cell with the buffer protocol: bytes-like (kind bytes) or an array. */
static int
cell_buffer(put_call *p, PyObject *o, dp_value *v, size_t r, size_t f)
{
    bool raw = PyBytes_Check(o) || PyByteArray_Check(o) || PyMemoryView_Check(o);
    if (p->n_bufs == p->cap_bufs) { /* the columns changed while being read */
        PyErr_SetString(PyExc_RuntimeError, "put: the values changed during the call");
        return -1;
    }
    Py_buffer *b = &p->bufs[p->n_bufs];
    int flags = raw ? PyBUF_C_CONTIGUOUS : (PyBUF_C_CONTIGUOUS | PyBUF_FORMAT);
    if (PyObject_GetBuffer(o, b, flags) < 0) {
        PyErr_Format(PyExc_ValueError,
                     "row %zu, field '%s': a C-contiguous buffer is needed (%s)", r,
                     p->fields[f], Py_TYPE(o)->tp_name);
        return -1;
    }
    p->n_bufs++;
    v->data = b->buf;
    v->nbytes = (uint64_t)b->len;
    if (raw) {
        v->kind = DP_KIND_BYTES;
        return 0;
    }
    v->kind = DP_KIND_TENSOR;
    v->dtype = np_dtype_of(b->format, b->itemsize);
    if (v->dtype == NULL) {
        PyErr_Format(PyExc_TypeError,
                     "row %zu, field '%s': element format '%s' has no stored dtype "
                     "(bool, ints, floats and complex of native byte order)",
                     r, p->fields[f], b->format);
        return -1;
    }
    size_t at;
    if (b->ndim > DP_SHAPE_MAX) {
        PyErr_Format(PyExc_ValueError, "row %zu, field '%s': %d dims (at most %d)", r,
                     p->fields[f], b->ndim, DP_SHAPE_MAX);
        return -1;
    }
    if (dims_take(p, (size_t)b->ndim, &at) < 0)
        return -1;
    for (int i = 0; i < b->ndim; i++)
        p->dims[at + (size_t)i] = (uint64_t)b->shape[i];
    v->ndim = (uint32_t)b->ndim;
    v->shape = (const uint64_t *)(uintptr_t)at;
    return 0;
}

/*
 * A described cell: (address, nbytes, kind, dtype, shape), or (bytes-like,
 * kind, dtype) for a serialized object (no shape).
 */
static int
cell_described(put_call *p, PyObject *o, dp_value *v, size_t r, size_t f)
{
    PyObject *addr, *dtype, *shape;
    unsigned long long n;
    int kind;
    if (PyTuple_GET_SIZE(o) == 3) {
        PyObject *obj;
        if (!PyArg_ParseTuple(o, "OiU", &obj, &kind, &dtype))
            return -1;
        if (kind != DP_KIND_BYTES && kind != DP_KIND_OBJECT) {
            PyErr_Format(PyExc_ValueError, "row %zu, field '%s': kind %d", r,
                         p->fields[f], kind);
            return -1;
        }
        if (cell_buffer(p, obj, v, r, f) < 0)
            return -1;
        v->kind = (dp_kind)kind;
        v->dtype = PyUnicode_AsUTF8(dtype);
        return v->dtype != NULL ? 0 : -1;
    }
    if (!PyArg_ParseTuple(o, "OKiOO", &addr, &n, &kind, &dtype, &shape))
        return -1;
    if (kind != DP_KIND_TENSOR && kind != DP_KIND_BYTES && kind != DP_KIND_OBJECT) {
        PyErr_Format(PyExc_ValueError, "row %zu, field '%s': kind %d", r, p->fields[f],
                     kind);
        return -1;
    }
    v->data = PyLong_AsVoidPtr(addr);
    if (v->data == NULL && PyErr_Occurred())
        return -1;
    v->nbytes = n;
    v->kind = (dp_kind)kind;
    if (dtype != Py_None) {
        v->dtype = PyUnicode_AsUTF8(dtype);
        if (v->dtype == NULL)
            return -1;
    }
    char what[300];
    snprintf(what, sizeof what, "row %zu, field '%s'", r, p->fields[f]);
    return shape_in(p, shape, v, what);
}

static int
cells_column(put_call *p, PyObject *cells, size_t f)
{
    PyObject *seq = PySequence_Fast(cells, "cells: a list is needed");
    if (seq == NULL)
        return -1;
    if ((size_t)PySequence_Fast_GET_SIZE(seq) != p->n_rows) {
        PyErr_Format(PyExc_ValueError, "field '%s': %zd values for %zu rows",
                     p->fields[f], PySequence_Fast_GET_SIZE(seq), p->n_rows);
        Py_DECREF(seq);
        return -1;
    }
    PyObject **items = PySequence_Fast_ITEMS(seq);
    for (size_t r = 0; r < p->n_rows; r++) {
        dp_value *v = &p->vals[r * p->n_fields + f];
        PyObject *o = items[r];
        int rc = 0;
        if (o == Py_None)
            v->kind = DP_KIND_SKIP;
        else if (PyTuple_Check(o))
            rc = cell_described(p, o, v, r, f);
        else if (PyObject_CheckBuffer(o))
            rc = cell_buffer(p, o, v, r, f);
        else {
            PyErr_Format(PyExc_TypeError, "row %zu, field '%s': cannot store a %s", r,
                         p->fields[f], Py_TYPE(o)->tp_name);
            rc = -1;
        }
        if (rc < 0) {
            Py_DECREF(seq);
            return -1;
        }
    }
    Py_DECREF(seq);
    return 0;
}

/* A strided column: (0, base, stride, row_nbytes, kind, dtype, row_shape). */
static int
strided_column(put_call *p, PyObject *col, size_t f)
{
    PyObject *addr, *dtype, *shape;
    long long stride;
    unsigned long long n;
    int mode, kind;
    if (!PyArg_ParseTuple(col, "iOLKiOO", &mode, &addr, &stride, &n, &kind, &dtype,
                          &shape))
        return -1;
    uint8_t *base = PyLong_AsVoidPtr(addr);
    if (base == NULL && PyErr_Occurred())
        return -1;
    const char *dt = dtype != Py_None ? PyUnicode_AsUTF8(dtype) : NULL;
    if (dtype != Py_None && dt == NULL)
        return -1;
    dp_value proto = {.nbytes = n, .kind = (dp_kind)kind, .dtype = dt};
    if (shape_in(p, shape, &proto, p->fields[f]) < 0)
        return -1;
    for (size_t r = 0; r < p->n_rows; r++) {
        dp_value *v = &p->vals[r * p->n_fields + f];
        *v = proto;
        v->data = base + (ptrdiff_t)r * stride;
    }
    return 0;
}

static int
put_parse(put_call *p, PyObject *rows, PyObject *fields, PyObject *cols)
{
    if (dp__py_rows(rows, &p->rows, &p->n_rows) < 0)
        return -1;
    if (!PyList_Check(fields) || !PyList_Check(cols) ||
        PyList_GET_SIZE(fields) != PyList_GET_SIZE(cols)) {
        PyErr_SetString(PyExc_TypeError, "put: fields and columns: lists of one length");
        return -1;
    }
    p->n_fields = (size_t)PyList_GET_SIZE(fields);
    size_t n_cells = p->n_rows * p->n_fields, n_buf = 0;
    p->fields = PyMem_Calloc(p->n_fields ? p->n_fields : 1, sizeof *p->fields);
    p->vals = PyMem_Calloc(n_cells ? n_cells : 1, sizeof *p->vals);
    if (p->fields == NULL || p->vals == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (size_t f = 0; f < p->n_fields; f++) {
        PyObject *s = PyList_GET_ITEM(fields, f);
        Py_ssize_t len;
        p->fields[f] = PyUnicode_Check(s) ? PyUnicode_AsUTF8AndSize(s, &len) : NULL;
        if (p->fields[f] == NULL) {
            if (!PyErr_Occurred())
                PyErr_Format(PyExc_TypeError, "fields[%zu]: a str is needed", f);
            return -1;
        }
        if ((size_t)len != strlen(p->fields[f])) {
            PyErr_Format(PyExc_ValueError, "field %R contains a NUL character", s);
            return -1;
        }
        PyObject *col = PyList_GET_ITEM(cols, f);
        if (!PyTuple_Check(col) && !PyList_Check(col)) {
            PyErr_Format(PyExc_TypeError, "column of field '%s': a tuple or a list",
                         p->fields[f]);
            return -1;
        }
        if (PyList_Check(col)) {
            for (Py_ssize_t r = 0; r < PyList_GET_SIZE(col); r++) {
                PyObject *o = PyList_GET_ITEM(col, r);
                n_buf += o != Py_None && (!PyTuple_Check(o) || PyTuple_GET_SIZE(o) == 3);
            }
        }
    }
    p->bufs = PyMem_Calloc(n_buf ? n_buf : 1, sizeof *p->bufs);
    p->cap_bufs = n_buf;
    if (p->bufs == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (size_t f = 0; f < p->n_fields; f++) {
        PyObject *col = PyList_GET_ITEM(cols, f);
        int rc = PyTuple_Check(col) ? strided_column(p, col, f) : cells_column(p, col, f);
        if (rc < 0)
            return -1;
    }
    for (size_t i = 0; i < n_cells; i++) /* offsets into the pool become pointers */
        if (p->vals[i].kind != DP_KIND_SKIP)
            p->vals[i].shape =
                p->vals[i].ndim ? p->dims + (uintptr_t)p->vals[i].shape : NULL;
    return 0;
}

/* Lists of the rows that landed and that did not. */
static PyObject *
put_failed(const put_call *p, const int *st, int rc, const dp_detail *d)
{
    PyObject *landed = PyList_New(0), *failed = PyList_New(0);
    for (size_t r = 0; landed != NULL && failed != NULL && r < p->n_rows; r++) {
        PyObject *g = PyLong_FromUnsignedLongLong(p->rows[r]);
        if (g == NULL || PyList_Append(st[r] == 0 ? landed : failed, g) < 0) {
            Py_XDECREF(g);
            break;
        }
        Py_DECREF(g);
    }
    if (landed != NULL && failed != NULL && !PyErr_Occurred()) {
        char msg[DP_DETAIL_MAX + 96];
        snprintf(msg, sizeof msg, "%s (%zd of %zu rows landed)", dp_detail_msg(d),
                 PyList_GET_SIZE(landed), p->n_rows);
        dp__py_raise_ex(rc, msg, NULL, failed, landed);
    }
    Py_XDECREF(landed);
    Py_XDECREF(failed);
    return NULL;
}

/*
 * put(rows, fields, columns, want_locs=False) -> None, or with want_locs the
 * location hints as one bytes object: n_rows x n_fields dp_loc records (128
 * bytes each, row-major; blob "" for skipped cells).
 */
static PyObject *
client_put(DpClient *self, PyObject *args)
{
    PyObject *rows, *fields, *cols;
    int want_locs = 0;
    if (!PyArg_ParseTuple(args, "OOO|p", &rows, &fields, &cols, &want_locs))
        return NULL;
    if (!dp__py_client_enter(self))
        return NULL;
    put_call p = {0};
    int *st = NULL;
    PyObject *ret = NULL, *locs = NULL;
    if (put_parse(&p, rows, fields, cols) < 0)
        goto out;
    st = PyMem_Calloc(p.n_rows ? p.n_rows : 1, sizeof *st);
    if (st == NULL) {
        PyErr_NoMemory();
        goto out;
    }
    if (want_locs) {
        locs = PyBytes_FromStringAndSize(
            NULL, (Py_ssize_t)(p.n_rows * p.n_fields * sizeof(dp_loc)));
        if (locs == NULL)
            goto out; /* the library fills every cell (blob "" where none) */
    }
    dp_loc *lp = locs != NULL ? (dp_loc *)(void *)PyBytes_AS_STRING(locs) : NULL;
    dp_detail d = {0};
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = dp_client_put_locs(self->c, p.rows, p.n_rows, p.fields, p.n_fields, p.vals, st,
                            lp, &d);
    Py_END_ALLOW_THREADS
    if (rc == DP_OK) {
        ret = locs != NULL ? Py_NewRef(locs) : Py_NewRef(Py_None);
    } else if (rc == DP_EINVAL || rc == DP_ENOMEM)
        dp__py_raise(rc, &d);
    else
        put_failed(&p, st, rc, &d);
out:
    Py_XDECREF(locs);
    PyMem_Free(st);
    put_call_fini(&p);
    dp__py_client_leave(self);
    return ret;
}

/* ---- get ---- */

/* Keys "<gidx>@<field>", field-major: one arena and pointers into it. */
static int
row_keys(PyObject *rows, PyObject *fields, char **arena, const char ***keys, size_t *n)
{
    uint64_t *g = NULL;
    size_t nr;
    if (dp__py_rows(rows, &g, &nr) < 0)
        return -1;
    PyObject *fs = PySequence_Fast(fields, "fields: a list of str is needed");
    if (fs == NULL) {
        PyMem_Free(g);
        return -1;
    }
    size_t nf = (size_t)PySequence_Fast_GET_SIZE(fs), total = 0;
    for (size_t f = 0; f < nf; f++) {
        Py_ssize_t len;
        PyObject *s = PySequence_Fast_ITEMS(fs)[f];
        const char *name = PyUnicode_Check(s) ? PyUnicode_AsUTF8AndSize(s, &len) : NULL;
        if (name == NULL) {
            if (!PyErr_Occurred())
                PyErr_Format(PyExc_TypeError, "fields[%zu]: a str is needed", f);
            goto fail;
        }
        if ((size_t)len != strlen(name)) {
            PyErr_Format(PyExc_ValueError, "field %R contains a NUL character", s);
            goto fail;
        }
        total += nr * ((size_t)len + 22);
    }
    *arena = PyMem_Malloc(total ? total : 1);
    *keys = PyMem_Malloc((nr * nf > 0 ? nr * nf : 1) * sizeof **keys);
    if (*arena == NULL || *keys == NULL) {
        PyErr_NoMemory();
        goto fail;
    }
    /* Each row's digits once, then per key: digits, '@', the field. */
    uint8_t *dlen = PyMem_Malloc(nr ? nr : 1);
    char(*digits)[20] = PyMem_Malloc((nr ? nr : 1) * sizeof *digits);
    if (dlen == NULL || digits == NULL) {
        PyMem_Free(dlen);
        PyMem_Free(digits);
        PyErr_NoMemory();
        goto fail;
    }
    for (size_t r = 0; r < nr; r++) {
        char tmp[20];
        uint64_t v = g[r];
        int k = 0;
        do {
            tmp[k++] = (char)('0' + v % 10);
            v /= 10;
        } while (v != 0);
        for (int i = 0; i < k; i++)
            digits[r][i] = tmp[k - 1 - i];
        dlen[r] = (uint8_t)k;
    }
    char *w = *arena;
    for (size_t f = 0; f < nf; f++) {
        Py_ssize_t len;
        const char *name = PyUnicode_AsUTF8AndSize(PySequence_Fast_ITEMS(fs)[f], &len);
        for (size_t r = 0; r < nr; r++) {
            (*keys)[f * nr + r] = w;
            memcpy(w, digits[r], dlen[r]);
            w += dlen[r];
            *w++ = '@';
            memcpy(w, name, (size_t)len);
            w += len;
            *w++ = '\0';
        }
    }
    PyMem_Free(dlen);
    PyMem_Free(digits);
    *n = nr * nf;
    Py_DECREF(fs);
    PyMem_Free(g);
    return 0;
fail:
    PyMem_Free(*arena);
    PyMem_Free(*keys);
    *arena = NULL;
    *keys = NULL;
    Py_DECREF(fs);
    PyMem_Free(g);
    return -1;
}

static int
key_list(PyObject *list, const char ***keys, size_t *n)
{
    PyObject *seq = PySequence_Fast(list, "keys: a list of str is needed");
    if (seq == NULL)
        return -1;
    size_t cnt = (size_t)PySequence_Fast_GET_SIZE(seq);
    *keys = PyMem_Malloc((cnt ? cnt : 1) * sizeof **keys);
    if (*keys == NULL) {
        Py_DECREF(seq);
        PyErr_NoMemory();
        return -1;
    }
    for (size_t i = 0; i < cnt; i++) {
        PyObject *s = PySequence_Fast_ITEMS(seq)[i];
        Py_ssize_t len;
        if (!PyUnicode_Check(s)) {
            PyErr_Format(PyExc_TypeError, "keys[%zu]: a str is needed, got %s", i,
                         Py_TYPE(s)->tp_name);
            PyMem_Free(*keys);
            *keys = NULL;
            Py_DECREF(seq);
            return -1;
        }
        const char *k = PyUnicode_AsUTF8AndSize(s, &len);
        if (k == NULL || (size_t)len != strlen(k)) {
            if (!PyErr_Occurred())
                PyErr_Format(PyExc_ValueError,
                             "keys[%zu]: a str '<gidx>@<field>' without NUL is needed",
                             i);
            PyMem_Free(*keys);
            *keys = NULL;
            Py_DECREF(seq);
            return -1;
        }
        (*keys)[i] = k;
    }
    Py_DECREF(seq); /* the strings live in the caller's list */
    *n = cnt;
    return 0;
}

/*
 * Location hints for n keys from hints (None, or a sequence of n items, each
 * None or a 128-byte bytes-like hint from put): *locs NULL when none at all.
 */
static int
hint_list(PyObject *hints, size_t n, dp_loc **locs)
{
    *locs = NULL;
    if (hints == NULL || hints == Py_None)
        return 0;
    PyObject *seq = PySequence_Fast(hints, "hints: a list (one per key) is needed");
    if (seq == NULL)
        return -1;
    if ((size_t)PySequence_Fast_GET_SIZE(seq) != n) {
        PyErr_Format(PyExc_ValueError, "hints: %zd for %zu keys",
                     PySequence_Fast_GET_SIZE(seq), n);
        Py_DECREF(seq);
        return -1;
    }
    *locs = PyMem_Calloc(n ? n : 1, sizeof **locs);
    if (*locs == NULL) {
        Py_DECREF(seq);
        PyErr_NoMemory();
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        PyObject *h = PySequence_Fast_ITEMS(seq)[i];
        if (h == Py_None)
            continue;
        Py_buffer b;
        if (PyObject_GetBuffer(h, &b, PyBUF_SIMPLE) < 0) {
            PyErr_Clear();
            PyErr_Format(PyExc_TypeError,
                         "hints[%zu]: a location hint from put (bytes) or None is "
                         "needed, got %s",
                         i, Py_TYPE(h)->tp_name);
            goto fail;
        }
        bool ok = (size_t)b.len == sizeof(dp_loc);
        if (ok)
            memcpy(&(*locs)[i], b.buf, sizeof(dp_loc));
        PyBuffer_Release(&b);
        if (!ok) {
            PyErr_Format(PyExc_ValueError,
                         "hints[%zu]: a location hint is %zu bytes, got %zd: pass what "
                         "put returned, unchanged",
                         i, sizeof(dp_loc), b.len);
            goto fail;
        }
    }
    Py_DECREF(seq);
    return 0;
fail:
    Py_DECREF(seq);
    PyMem_Free(*locs);
    *locs = NULL;
    return -1;
}

static PyObject *
get_run(DpClient *self, const char **keys, const dp_loc *locs, size_t n)
{
    dp_values *v = NULL;
    dp_detail d = {0};
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = dp_client_get_alloc_locs(self->c, keys, locs, n, &v, &d);
    Py_END_ALLOW_THREADS
    if (v == NULL)
        return dp__py_raise(rc, &d);
    PyObject *vals = dp__py_values_new(v, (PyObject *)self);
    if (vals == NULL)
        return NULL;
    PyObject *prc = PyLong_FromLong(rc);
    PyObject *pd = dp__py_text(dp_detail_msg(&d));
    PyObject *t = prc && pd ? PyTuple_Pack(3, vals, prc, pd) : NULL;
    Py_DECREF(vals);
    Py_XDECREF(prc);
    Py_XDECREF(pd);
    return t;
}

/* get(rows, fields) -> (Values, rc, detail): keys field-major. */
static PyObject *
client_get(DpClient *self, PyObject *args)
{
    PyObject *rows, *fields;
    if (!PyArg_ParseTuple(args, "OO", &rows, &fields))
        return NULL;
    if (!dp__py_client_enter(self))
        return NULL;
    char *arena = NULL;
    const char **keys = NULL;
    size_t n = 0;
    PyObject *ret = NULL;
    if (row_keys(rows, fields, &arena, &keys, &n) == 0)
        ret = get_run(self, keys, NULL, n);
    PyMem_Free(arena);
    PyMem_Free(keys);
    dp__py_client_leave(self);
    return ret;
}

/* get_keys(keys, hints=None) -> (Values, rc, detail). */
static PyObject *
client_get_keys(DpClient *self, PyObject *args)
{
    PyObject *list, *hints = NULL;
    if (!PyArg_ParseTuple(args, "O|O", &list, &hints))
        return NULL;
    if (!dp__py_client_enter(self))
        return NULL;
    const char **keys = NULL;
    dp_loc *locs = NULL;
    size_t n = 0;
    PyObject *ret = NULL;
    if (key_list(list, &keys, &n) == 0 && hint_list(hints, n, &locs) == 0)
        ret = get_run(self, keys, locs, n);
    PyMem_Free(keys);
    PyMem_Free(locs);
    dp__py_client_leave(self);
    return ret;
}

/* One (status, nbytes, kind, dtype, shape) per item of get_into_rows. */
static PyObject *
item_tuple(const dp_get_item *it, const dp_value_desc *ds)
{
    PyObject *shape = dp__py_shape(ds);
    if (shape == NULL)
        return NULL;
    return Py_BuildValue("(iKisN)", it->status, (unsigned long long)it->nbytes,
                         (int)ds->kind, ds->dtype, shape);
}

/*
 * The items of one field as one (kind, dtype, shape, nbytes) when every one
 * landed with that same description, else NULL (no error set).
 */
static PyObject *
field_summary(const dp_get_item *items, size_t n)
{
    if (n == 0)
        return NULL;
    const dp_value_desc *d0 = items[0].desc;
    for (size_t r = 0; r < n; r++) {
        const dp_value_desc *d = items[r].desc;
        if (items[r].status != 0 || items[r].nbytes != items[0].nbytes ||
            !dp__py_same_desc(d, d0))
            return NULL;
    }
    PyObject *shape = dp__py_shape(d0);
    if (shape == NULL)
        return NULL;
    return Py_BuildValue("(isNK)", (int)d0->kind, d0->dtype, shape,
                         (unsigned long long)items[0].nbytes);
}

/*
 * Run a get into the items' destinations (nf fields of n / nf rows each);
 * (per field, rc, detail): a field's summary (kind, dtype, shape, nbytes)
 * when all its values landed alike, else the list of its items' tuples.
 */
static PyObject *
get_into_run(DpClient *self, dp_get_item *items, size_t n, size_t nf)
{
    dp_detail d = {0};
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = dp_client_get(self->c, items, n, &d);
    Py_END_ALLOW_THREADS
    if (rc == DP_EINVAL)
        return dp__py_raise(rc, &d);
    size_t per = n / nf;
    PyObject *res = PyList_New((Py_ssize_t)nf);
    for (size_t f = 0; res != NULL && f < nf; f++) {
        const dp_get_item *its = items + f * per;
        PyObject *got = field_summary(its, per);
        if (got == NULL && !PyErr_Occurred()) {
            got = PyList_New((Py_ssize_t)per);
            for (size_t i = 0; got != NULL && i < per; i++) {
                PyObject *t = item_tuple(&its[i], its[i].desc);
                if (t == NULL)
                    Py_CLEAR(got);
                else
                    PyList_SET_ITEM(got, (Py_ssize_t)i, t);
            }
        }
        if (got == NULL)
            Py_CLEAR(res);
        else
            PyList_SET_ITEM(res, (Py_ssize_t)f, got);
    }
    if (res == NULL)
        return NULL;
    return Py_BuildValue("(NiN)", res, rc, dp__py_text(dp_detail_msg(&d)));
}

/*
 * Destinations of field f's n rows: (base, stride, cap), row r at base + r *
 * stride, or a list of n (address, cap).
 */
static int
row_dsts(PyObject *spec, size_t f, size_t n, dp_get_item *items)
{
    if (PyTuple_Check(spec)) {
        PyObject *base;
        long long stride;
        unsigned long long cap;
        if (!PyArg_ParseTuple(spec, "OLK", &base, &stride, &cap))
            return -1;
        uint8_t *b = PyLong_AsVoidPtr(base);
        if (b == NULL && PyErr_Occurred())
            return -1;
        for (size_t r = 0; r < n; r++) {
            items[f * n + r].dst = b + (ptrdiff_t)r * stride;
            items[f * n + r].cap = cap;
        }
        return 0;
    }
    PyObject *seq = PySequence_Fast(spec, "destinations: a list of (address, cap)");
    if (seq == NULL)
        return -1;
    if ((size_t)PySequence_Fast_GET_SIZE(seq) != n) {
        PyErr_Format(PyExc_ValueError, "field %zu: %zd destinations for %zu rows", f,
                     PySequence_Fast_GET_SIZE(seq), n);
        Py_DECREF(seq);
        return -1;
    }
    for (size_t r = 0; r < n; r++) {
        PyObject *addr;
        unsigned long long cap;
        if (!PyArg_ParseTuple(PySequence_Fast_ITEMS(seq)[r], "OK", &addr, &cap)) {
            Py_DECREF(seq);
            return -1;
        }
        items[f * n + r].dst = PyLong_AsVoidPtr(addr);
        items[f * n + r].cap = cap;
        if (PyErr_Occurred()) {
            Py_DECREF(seq);
            return -1;
        }
    }
    Py_DECREF(seq);
    return 0;
}

/*
 * get_into_rows(rows, fields, [destinations per field]) -> (per field, rc,
 * detail), as get_into_run answers: keys field-major, built here;
 * destinations as row_dsts takes them.
 */
static PyObject *
client_get_into_rows(DpClient *self, PyObject *args)
{
    PyObject *rows, *fields, *dsts;
    if (!PyArg_ParseTuple(args, "OOO!", &rows, &fields, &PyList_Type, &dsts))
        return NULL;
    if (!dp__py_client_enter(self))
        return NULL;
    char *arena = NULL;
    const char **keys = NULL;
    size_t n = 0;
    dp_get_item *items = NULL;
    dp_value_desc *descs = NULL;
    PyObject *ret = NULL;
    if (row_keys(rows, fields, &arena, &keys, &n) < 0)
        goto out;
    size_t nf = (size_t)PyList_GET_SIZE(dsts);
    if (nf == 0 || n % nf != 0 || (size_t)PySequence_Size(fields) != nf) {
        PyErr_SetString(PyExc_ValueError, "get_into_rows: one destination per field");
        goto out;
    }
    items = PyMem_Calloc(n ? n : 1, sizeof *items);
    descs = PyMem_Calloc(n ? n : 1, sizeof *descs);
    if (items == NULL || descs == NULL) {
        PyErr_NoMemory();
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        items[i].key = keys[i];
        items[i].desc = &descs[i];
    }
    for (size_t f = 0; f < nf; f++)
        if (row_dsts(PyList_GET_ITEM(dsts, f), f, n / nf, items) < 0)
            goto out;
    ret = get_into_run(self, items, n, nf);
out:
    PyMem_Free(arena);
    PyMem_Free(keys);
    PyMem_Free(items);
    PyMem_Free(descs);
    dp__py_client_leave(self);
    return ret;
}

/* ---- clear, stats, counters ---- */

static PyObject *
client_clear(DpClient *self, PyObject *rows)
{
    if (!dp__py_client_enter(self))
        return NULL;
    uint64_t *g = NULL, dropped = 0;
    size_t n = 0;
    PyObject *ret = NULL;
    if (dp__py_rows(rows, &g, &n) == 0) {
        dp_detail d = {0};
        int rc;
        Py_BEGIN_ALLOW_THREADS
        rc = dp_client_clear(self->c, g, n, &dropped, &d);
        Py_END_ALLOW_THREADS
        ret = rc == DP_OK ? PyLong_FromUnsignedLongLong(dropped) : dp__py_raise(rc, &d);
    }
    PyMem_Free(g);
    dp__py_client_leave(self);
    return ret;
}

/* ---- checkpoints ---- */

static PyObject *
ckpt_summary_dict(const dp_ckpt_summary *sum)
{
    return Py_BuildValue(
        "{s:s,s:I,s:I,s:I,s:K,s:K,s:K,s:K}", "checkpoint", sum->checkpoint, "n_units",
        (unsigned)sum->n_units, "replicas", (unsigned)sum->replicas, "copies",
        (unsigned)sum->copies, "blobs", (unsigned long long)sum->blobs, "bytes",
        (unsigned long long)sum->bytes, "loaded", (unsigned long long)sum->loaded,
        "spilled", (unsigned long long)sum->spilled);
}

/*
 * checkpoint(op, dir, timeout_s, keep) -> summary dict. op: 0 save, 1 load
 * (the checkpoint's number of units), 2 re-home (any number), 3 peek (no
 * unit is asked). The GIL is released for the call.
 */
static PyObject *
client_checkpoint(DpClient *self, PyObject *args)
{
    int op;
    const char *dir;
    double timeout_s;
    unsigned int keep;
    if (!PyArg_ParseTuple(args, "isdI", &op, &dir, &timeout_s, &keep))
        return NULL;
    if (op < 0 || op > 3)
        return PyErr_Format(PyExc_ValueError, "checkpoint: op %d", op);
    if (!dp__py_client_enter(self))
        return NULL;
    dp_ckpt_opts o;
    dp_ckpt_opts_init(&o);
    o.timeout_s = timeout_s;
    o.keep = keep;
    dp_ckpt_summary sum;
    memset(&sum, 0, sizeof sum);
    dp_detail d = {0};
    int rc;
    Py_BEGIN_ALLOW_THREADS
    if (op == 0)
        rc = dp_ckpt_save(self->c, dir, &o, &sum, &d);
    else if (op == 1)
        rc = dp_ckpt_load(self->c, dir, &o, &sum, &d);
    else if (op == 2)
        rc = dp_ckpt_rehome(self->c, dir, &o, &sum, &d);
    else
        rc = dp_ckpt_peek(dir, &sum, &d);
    Py_END_ALLOW_THREADS
    PyObject *ret = rc == DP_OK ? ckpt_summary_dict(&sum) : dp__py_raise(rc, &d);
    dp__py_client_leave(self);
    return ret;
}

static PyObject *
stats_list(dp_client_stats *s)
{
    uint32_t nu = dp_client_stats_units(s);
    PyObject *list = PyList_New(nu);
    for (uint32_t u = 0; list != NULL && u < nu; u++) {
        PyObject *dct;
        if (dp_client_stats_status(s, u) != 0) {
            dct = Py_NewRef(Py_None);
        } else {
            dct = PyDict_New();
            size_t nc = dp_client_stats_count(s, u);
            for (size_t i = 0; dct != NULL && i < nc; i++) {
                const char *name;
                double val;
                if (!dp_client_stats_at(s, u, i, &name, &val))
                    continue;
                PyObject *pv = val == (double)(long long)val
                                   ? PyLong_FromLongLong((long long)val)
                                   : PyFloat_FromDouble(val);
                if (pv == NULL || PyDict_SetItemString(dct, name, pv) < 0)
                    Py_CLEAR(dct);
                Py_XDECREF(pv);
            }
        }
        if (dct == NULL) {
            Py_CLEAR(list);
            break;
        }
        PyList_SET_ITEM(list, u, dct);
    }
    return list;
}

/* stats() -> ([dict or None per unit], rc, detail). */
static PyObject *
client_stats(DpClient *self, PyObject *noarg)
{
    (void)noarg;
    if (!dp__py_client_enter(self))
        return NULL;
    dp_client_stats *s = NULL;
    dp_detail d = {0};
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = dp_client_stats_get(self->c, &s, &d);
    Py_END_ALLOW_THREADS
    PyObject *ret = NULL;
    if (s == NULL) {
        dp__py_raise(rc, &d);
    } else {
        PyObject *list = stats_list(s);
        if (list != NULL)
            ret = Py_BuildValue("(NiN)", list, rc, dp__py_text(dp_detail_msg(&d)));
    }
    dp_client_stats_destroy(s);
    dp__py_client_leave(self);
    return ret;
}

/* How the data path reaches unit i ("tcp two-sided (tcp)"), dp_client_unit_path. */
static PyObject *
client_unit_path(DpClient *self, PyObject *arg)
{
    unsigned long u = PyLong_AsUnsignedLong(arg);
    if (u == (unsigned long)-1 && PyErr_Occurred())
        return NULL;
    if (!dp__py_client_enter(self))
        return NULL;
    char buf[160];
    int rc;
    Py_BEGIN_ALLOW_THREADS /* it takes the client's mutex */
    rc = u > UINT32_MAX ? DP_EINVAL
                        : dp_client_unit_path(self->c, (uint32_t)u, buf, sizeof buf);
    Py_END_ALLOW_THREADS
    dp__py_client_leave(self);
    if (rc != DP_OK) {
        PyErr_Format(PyExc_ValueError, "unit_path: no unit %lu in this cluster", u);
        return NULL;
    }
    return PyUnicode_FromString(buf);
}

static PyObject *
client_counters(DpClient *self, PyObject *noarg)
{
    (void)noarg;
    if (!dp__py_client_enter(self))
        return NULL;
    dp_client_counters k;
    int rc;
    Py_BEGIN_ALLOW_THREADS /* it takes the client's mutex, held by a running put */
    rc = dp_client_counters_get(self->c, &k);
    Py_END_ALLOW_THREADS
    uint64_t resent = dp_client_requests_resent(self->c);
    uint64_t under = 0;
    Py_BEGIN_ALLOW_THREADS
    under = dp_client_under_replicated_rows(self->c);
    Py_END_ALLOW_THREADS
    dp__py_client_leave(self);
    if (rc != DP_OK)
        return dp__py_raise(rc, NULL);
    PyObject *dict = PyDict_New();
    if (dict == NULL)
        return NULL;
    const struct {
        const char *name;
        uint64_t v;
    } kv[] = {{"restarts_seen", k.restarts_seen},
              {"rebinds", k.rebinds},
              {"units_down", k.units_down},
              {"transfers_retained", k.transfers_retained},
              {"transfers_released", k.transfers_released},
              {"retained_bytes", k.retained_bytes},
              {"staged_put_bytes", k.staged_put_bytes},
              {"staged_get_bytes", k.staged_get_bytes},
              {"puts", k.puts},
              {"put_bytes", k.put_bytes},
              {"gets", k.gets},
              {"get_bytes", k.get_bytes},
              {"clears", k.clears},
              {"retries", k.retries},
              {"busy_waits", k.busy_waits},
              {"loc_misses", k.loc_misses},
              {"resent", resent},
              {"under_replicated_rows", under},
              {"copied_bytes", self->copied}};
    for (size_t i = 0; i < sizeof kv / sizeof kv[0]; i++) {
        PyObject *v = PyLong_FromUnsignedLongLong((unsigned long long)kv[i].v);
        if (v == NULL || PyDict_SetItemString(dict, kv[i].name, v) != 0) {
            Py_XDECREF(v);
            Py_DECREF(dict);
            return NULL;
        }
        Py_DECREF(v);
    }
    return dict;
}

/* The Python layer counts the bytes it copies (non-contiguous values). */
static PyObject *
client_count_copy(DpClient *self, PyObject *arg)
{
    unsigned long long n = PyLong_AsUnsignedLongLong(arg);
    if (n == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    self->copied += n;
    Py_RETURN_NONE;
}

/* ---- memory ---- */

static PyObject *
client_alloc(DpClient *self, PyObject *arg)
{
    Py_ssize_t n = PyNumber_AsSsize_t(arg, PyExc_OverflowError);
    if (n == -1 && PyErr_Occurred())
        return NULL;
    if (n <= 0)
        return dp__py_raise_ex(DP_EINVAL, "alloc: nbytes must be > 0", NULL, NULL, NULL);
    if (!dp__py_client_enter(self))
        return NULL;
    void *p = NULL;
    dp_detail d = {0};
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = dp_client_alloc(self->c, (size_t)n, &p, &d);
    Py_END_ALLOW_THREADS
    PyObject *ret = NULL;
    if (rc != DP_OK) {
        dp__py_raise(rc, &d);
    } else {
        ret = dp__py_buffer_new(self, p, (size_t)n);
        if (ret == NULL)
            dp_client_free(self->c, p);
    }
    dp__py_client_leave(self);
    return ret;
}

/* _register(address, nbytes, owner): owner is kept until deregister. */
static PyObject *
client_register(DpClient *self, PyObject *args)
{
    PyObject *addr, *owner;
    unsigned long long n;
    if (!PyArg_ParseTuple(args, "OKO", &addr, &n, &owner))
        return NULL;
    void *p = PyLong_AsVoidPtr(addr);
    if (p == NULL && PyErr_Occurred())
        return NULL;
    if (!dp__py_client_enter(self))
        return NULL;
    dp_detail d = {0};
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = dp_client_register(self->c, p, (size_t)n, &d);
    Py_END_ALLOW_THREADS
    PyObject *ret = NULL;
    if (rc != DP_OK) {
        dp__py_raise(rc, &d);
    } else {
        PyObject *v = Py_BuildValue("(OK)", owner, n);
        if (v != NULL && PyDict_SetItem(self->regs, addr, v) == 0) {
            ret = Py_NewRef(Py_None);
        } else if (dp_client_deregister(self->c, p, NULL) != DP_OK && v != NULL) {
            dp__py_keep_forever(v); /* registered for good: its owner too */
        }
        Py_XDECREF(v);
    }
    dp__py_client_leave(self);
    return ret;
}

static PyObject *
client_deregister(DpClient *self, PyObject *addr)
{
    void *p = PyLong_AsVoidPtr(addr);
    if (p == NULL && PyErr_Occurred())
        return NULL;
    if (!dp__py_client_enter(self))
        return NULL;
    dp_detail d = {0};
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = dp_client_deregister(self->c, p, &d);
    Py_END_ALLOW_THREADS
    PyObject *ret = NULL;
    if (rc == DP_OK) {
        if (PyDict_DelItem(self->regs, addr) < 0)
            PyErr_Clear();
        ret = Py_NewRef(Py_None);
    } else {
        if (rc == DP_EBUSY) { /* a failed transfer may touch it: keep its owner */
            PyObject *v = PyDict_GetItem(self->regs, addr);
            if (v != NULL) {
                dp__py_keep_forever(v);
                if (PyDict_DelItem(self->regs, addr) < 0)
                    PyErr_Clear();
            }
        }
        dp__py_raise(rc, &d);
    }
    dp__py_client_leave(self);
    return ret;
}

static PyObject *
client_touches_unfinished(DpClient *self, PyObject *args)
{
    PyObject *addr;
    unsigned long long n;
    if (!PyArg_ParseTuple(args, "OK", &addr, &n))
        return NULL;
    void *p = PyLong_AsVoidPtr(addr);
    if (p == NULL && PyErr_Occurred())
        return NULL;
    if (!dp__py_client_enter(self))
        return NULL;
    bool t = dp_client_touches_unfinished(self->c, p, (size_t)n);
    dp__py_client_leave(self);
    return PyBool_FromLong(t);
}

static PyObject *
client_unit_address(DpClient *self, PyObject *arg)
{
    long i = PyLong_AsLong(arg);
    if (i == -1 && PyErr_Occurred())
        return NULL;
    if (!dp__py_client_enter(self))
        return NULL;
    const char *a = i >= 0 && i <= (long)UINT32_MAX
                        ? dp_client_unit_address(self->c, (uint32_t)i)
                        : NULL;
    PyObject *ret = a != NULL ? PyUnicode_FromString(a) : NULL;
    dp__py_client_leave(self);
    if (a == NULL)
        PyErr_Format(PyExc_IndexError, "unit %ld: out of range", i);
    return ret;
}

static PyObject *
client_n_units(DpClient *self, void *closure)
{
    (void)closure;
    if (!dp__py_client_enter(self))
        return NULL;
    uint32_t n = dp_client_n_units(self->c);
    dp__py_client_leave(self);
    return PyLong_FromUnsignedLong(n);
}

static PyObject *
client_replicas(DpClient *self, void *closure)
{
    (void)closure;
    if (!dp__py_client_enter(self))
        return NULL;
    uint32_t r;
    Py_BEGIN_ALLOW_THREADS /* it takes the client's mutex, held by a running put */
    r = dp_client_replicas(self->c);
    Py_END_ALLOW_THREADS
    dp__py_client_leave(self);
    return PyLong_FromUnsignedLong(r);
}

/* _check(): raises Closed when the client is closed or was made in another
 * process; nothing else (the library's mutex, held by a running put, is not
 * taken). */
static PyObject *
client_check(DpClient *self, PyObject *noarg)
{
    (void)noarg;
    if (!dp__py_client_enter(self))
        return NULL;
    dp__py_client_leave(self);
    Py_RETURN_NONE;
}

static PyObject *
client_closed(DpClient *self, void *closure)
{
    (void)closure;
    return PyBool_FromLong(self->closed || self->c == NULL);
}

static PyMethodDef client_methods[] = {
    {"put", (PyCFunction)client_put, METH_VARARGS,
     "put(rows, fields, columns, want_locs=False) -> None or location hints (bytes)"},
    {"get", (PyCFunction)client_get, METH_VARARGS,
     "get(rows, fields) -> (Values, rc, detail)"},
    {"get_keys", (PyCFunction)client_get_keys, METH_VARARGS,
     "get_keys(keys, hints=None) -> (Values, rc, detail)"},
    {"get_into_rows", (PyCFunction)client_get_into_rows, METH_VARARGS,
     "get_into_rows(rows, fields, destinations) -> (per field, rc, detail)"},
    {"clear", (PyCFunction)client_clear, METH_O, "clear(rows) -> values dropped"},
    {"checkpoint", (PyCFunction)client_checkpoint, METH_VARARGS,
     "checkpoint(op, dir, timeout_s, keep) -> dict (0 save, 1 load, 2 rehome, 3 peek)"},
    {"stats", (PyCFunction)client_stats, METH_NOARGS, "stats() -> (list, rc, detail)"},
    {"counters", (PyCFunction)client_counters, METH_NOARGS, "counters() -> dict"},
    {"unit_path", (PyCFunction)client_unit_path, METH_O, "unit_path(i) -> str"},
    {"_count_copy", (PyCFunction)client_count_copy, METH_O, NULL},
    {"_check", (PyCFunction)client_check, METH_NOARGS, NULL},
    {"alloc", (PyCFunction)client_alloc, METH_O, "alloc(nbytes) -> Buffer"},
    {"_register", (PyCFunction)client_register, METH_VARARGS, NULL},
    {"_deregister", (PyCFunction)client_deregister, METH_O, NULL},
    {"_touches_unfinished", (PyCFunction)client_touches_unfinished, METH_VARARGS, NULL},
    {"unit_address", (PyCFunction)client_unit_address, METH_O, NULL},
    {"close", (PyCFunction)client_close, METH_NOARGS, "close()"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef client_getset[] = {
    {"n_units", (getter)client_n_units, NULL, "number of units", NULL},
    {"replicas", (getter)client_replicas, NULL, "copies of each row the cluster keeps",
     NULL},
    {"closed", (getter)client_closed, NULL, "True after close()", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject DpClient_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "dataplane._core.Client",
    .tp_basicsize = sizeof(DpClient),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "A connection to a dataplane cluster (use dataplane.Client).",
    .tp_new = client_new,
    .tp_init = (initproc)client_init,
    .tp_dealloc = (destructor)client_dealloc,
    .tp_methods = client_methods,
    .tp_getset = client_getset,
};
