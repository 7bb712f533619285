/*
 * dataplane._core: the module, its exception classes and the helpers the
 * types share (docs/design.md, "Python package").
 *
 * Exceptions. One class per error code, all under dataplane.Error; where a
 * builtin means the same the class also derives from it, so `except KeyError`
 * catches a missing key and `except TimeoutError` a timeout. Each instance
 * carries code (the dp_err number), name ("DP_ENOTFOUND"), detail (the
 * library's text), and keys, rows and landed (lists or None).
 */
#include "dp_py.h"

#include <string.h>
#include <unistd.h>

PyObject *DpError;

typedef struct err_class {
    int code;
    const char *name; /* dataplane.<name> */
    const char *doc;
    PyObject **builtin; /* second base, or NULL */
    PyObject *cls;
} err_class;

static err_class err_classes[] = {
    {DP_EINVAL, "InvalidArgument", "Bad arguments; nothing was sent.", &PyExc_ValueError},
    {DP_ENOMEM, "OutOfMemory", "Out of memory.", &PyExc_MemoryError},
    {DP_ETIMEDOUT, "Timeout", "No reply or transfer completion within the budget.",
     &PyExc_TimeoutError},
    {DP_EUNITFULL, "UnitFull", "A unit has no room and nothing will free any.", NULL},
    {DP_EBUSY, "Busy", "A unit stayed busy for the whole budget.", NULL},
    {DP_ELOST, "Lost", "A unit lost data it had accepted.", NULL},
    {DP_EPROTO, "ProtocolError", "A unit refused a request or answered nonsense.", NULL},
    {DP_ETRANSFER, "TransferError", "A unit is down or a WRITE or READ failed.",
     &PyExc_ConnectionError},
    {DP_EFATAL, "Fatal", "The process is poisoned by unfinished transfers.", NULL},
    {DP_EPOLICY, "PolicyError", "The transport policy (RDMA only) is violated.", NULL},
    {DP_ECLOSED, "Closed", "The object is closed, or was made in another process.", NULL},
    {DP_ESYS, "SysError", "A system call failed.", &PyExc_OSError},
    {DP_ETOOBIG, "TooBig", "A size limit was exceeded.", &PyExc_ValueError},
    {DP_ENOTFOUND, "NotFound", "A key is not held (never put, or cleared).",
     &PyExc_KeyError},
    {DP_EEXIST, "Exists", "Already exists.", NULL},
    {DP_ECORRUPT, "Corrupt", "Data failed its checksum.", NULL},
    {DP_EUNSUPPORTED, "Unsupported", "Not supported.", &PyExc_NotImplementedError},
    {DP_ECANCELED, "Canceled", "Canceled.", NULL},
    {DP_ERESTARTED, "Restarted", "A unit restarted: what it held is gone.", NULL},
};
#define N_ERR_CLASSES (sizeof err_classes / sizeof err_classes[0])

PyObject *
dp__py_error_class(int code)
{
    for (size_t i = 0; i < N_ERR_CLASSES; i++)
        if (err_classes[i].code == code)
            return err_classes[i].cls;
    return DpError;
}

static int
set_attr(PyObject *e, const char *name, PyObject *v)
{
    return PyObject_SetAttrString(e, name, v != NULL ? v : Py_None);
}

/* The exception for code with its attributes (a new reference), or NULL. */
static PyObject *
make_exc(int code, PyObject *detail, PyObject *keys, PyObject *rows, PyObject *landed)
{
    PyObject *e = PyObject_CallFunctionObjArgs(dp__py_error_class(code), detail, NULL);
    if (e == NULL)
        return NULL;
    PyObject *pc = PyLong_FromLong(code);
    PyObject *pn = PyUnicode_FromString(dp_errname(code));
    int bad = pc == NULL || pn == NULL || set_attr(e, "code", pc) < 0 ||
              set_attr(e, "name", pn) < 0 || set_attr(e, "detail", detail) < 0 ||
              set_attr(e, "keys", keys) < 0 || set_attr(e, "rows", rows) < 0 ||
              set_attr(e, "landed", landed) < 0;
    Py_XDECREF(pc);
    Py_XDECREF(pn);
    if (bad)
        Py_CLEAR(e);
    return e;
}

PyObject *
dp__py_raise_ex(int code, const char *msg, PyObject *keys, PyObject *rows,
                PyObject *landed)
{
    if (msg == NULL || msg[0] == '\0')
        msg = dp_strerror(code);
    /* A detail cut at its size limit may end inside a UTF-8 sequence. */
    PyObject *pd = dp__py_text(msg);
    PyObject *e = pd != NULL ? make_exc(code, pd, keys, rows, landed) : NULL;
    Py_XDECREF(pd);
    if (e != NULL) {
        PyErr_SetObject((PyObject *)Py_TYPE(e), e);
        Py_DECREF(e);
    }
    return NULL;
}

/* error(code, detail, keys=None, rows=None, landed=None) -> the exception to raise. */
static PyObject *
mod_error(PyObject *m, PyObject *args, PyObject *kw)
{
    (void)m;
    static char *kwl[] = {"code", "detail", "keys", "rows", "landed", NULL};
    int code;
    PyObject *detail, *keys = Py_None, *rows = Py_None, *landed = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "iU|OOO", kwl, &code, &detail, &keys,
                                     &rows, &landed))
        return NULL;
    return make_exc(code, detail, keys, rows, landed);
}

/*
 * Owners of memory that a failed transfer may still touch: referenced here
 * for the life of the process, so that memory is never freed under it.
 */
static PyObject *kept_forever;

void
dp__py_keep_forever(PyObject *owner)
{
    PyObject *et, *ev, *tb; /* callers may run in a dealloc while an exception flies */
    PyErr_Fetch(&et, &ev, &tb);
    if (kept_forever == NULL)
        kept_forever = PyList_New(0);
    if (kept_forever == NULL || PyList_Append(kept_forever, owner) < 0)
        Py_INCREF(owner); /* no list: leak the reference instead, never free */
    PyErr_Clear();
    PyErr_Restore(et, ev, tb);
}

PyObject *
dp__py_shape(const dp_value_desc *ds)
{
    PyObject *shape = PyTuple_New(ds->ndim);
    for (uint32_t k = 0; shape != NULL && k < ds->ndim; k++) {
        PyObject *x = PyLong_FromUnsignedLongLong(ds->shape[k]);
        if (x == NULL) {
            Py_CLEAR(shape);
            break;
        }
        PyTuple_SET_ITEM(shape, k, x);
    }
    return shape;
}

bool
dp__py_same_desc(const dp_value_desc *a, const dp_value_desc *b)
{
    return a->kind == b->kind && a->ndim == b->ndim && strcmp(a->dtype, b->dtype) == 0 &&
           memcmp(a->shape, b->shape, a->ndim * sizeof a->shape[0]) == 0;
}

PyObject *
dp__py_text(const char *s)
{
    return PyUnicode_DecodeUTF8(s, (Py_ssize_t)strlen(s), "replace");
}

PyObject *
dp__py_raise(int code, const dp_detail *d)
{
    return dp__py_raise_ex(code, d != NULL ? dp_detail_msg(d) : NULL, NULL, NULL, NULL);
}

PyObject *
dp__py_raise_forked(const char *what, pid_t pid)
{
    char msg[256];
    snprintf(msg, sizeof msg,
             "this %s was made in process %ld and this is process %ld (a fork): "
             "its connections and registered memory belong to that process; make a "
             "new %s here",
             what, (long)pid, (long)getpid(), what);
    return dp__py_raise_ex(DP_ECLOSED, msg, NULL, NULL, NULL);
}

/* Rows from a 1-D C-contiguous buffer of 8-, 4-, 2- or 1-byte integers. */
static int
rows_from_buffer(PyObject *obj, uint64_t **out, size_t *n)
{
    Py_buffer b;
    if (PyObject_GetBuffer(obj, &b, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0)
        return -1;
    const char *f = b.format != NULL ? b.format : "B";
    if (*f == '@' || *f == '=' || *f == '<')
        f++;
    bool sgn = strchr("bhilq", *f) != NULL && *f != '\0';
    bool uns = strchr("BHILQ", *f) != NULL && *f != '\0';
    if (b.ndim > 1 || (!sgn && !uns) || f[1] != '\0') {
        PyErr_Format(PyExc_TypeError,
                     "rows: a 1-D array of integers is needed, got format '%s' with %d "
                     "dims",
                     b.format != NULL ? b.format : "B", b.ndim);
        PyBuffer_Release(&b);
        return -1;
    }
    size_t cnt = b.itemsize > 0 ? (size_t)(b.len / b.itemsize) : 0;
    uint64_t *r = PyMem_Malloc((cnt > 0 ? cnt : 1) * sizeof *r);
    if (r == NULL) {
        PyBuffer_Release(&b);
        PyErr_NoMemory();
        return -1;
    }
    const uint8_t *p = b.buf;
    for (size_t i = 0; i < cnt; i++) {
        int64_t v = 0;
        uint64_t u = 0;
        switch (b.itemsize) {
        case 8:
            memcpy(&u, p + 8 * i, 8);
            v = (int64_t)u;
            break;
        case 4: {
            uint32_t x;
            memcpy(&x, p + 4 * i, 4);
            u = x;
            v = (int32_t)x;
            break;
        }
        case 2: {
            uint16_t x;
            memcpy(&x, p + 2 * i, 2);
            u = x;
            v = (int16_t)x;
            break;
        }
        default:
            u = p[i];
            v = (int8_t)p[i];
        }
        if (sgn && v < 0) {
            PyErr_Format(PyExc_ValueError, "rows[%zu] is %lld: rows are unsigned", i,
                         (long long)v);
            PyMem_Free(r);
            PyBuffer_Release(&b);
            return -1;
        }
        r[i] = sgn ? (uint64_t)v : u;
    }
    PyBuffer_Release(&b);
    *out = r;
    *n = cnt;
    return 0;
}

int
dp__py_rows(PyObject *obj, uint64_t **out, size_t *n)
{
    if (PyObject_CheckBuffer(obj) && !PyBytes_Check(obj) && !PyByteArray_Check(obj))
        return rows_from_buffer(obj, out, n);
    /* A tuple copy: converting an item may run Python code that changes a list. */
    PyObject *seq = PySequence_Tuple(obj);
    if (seq == NULL) {
        if (PyErr_ExceptionMatches(PyExc_TypeError)) {
            PyErr_Clear();
            PyErr_Format(PyExc_TypeError, "rows: a sequence of ints is needed, got %s",
                         Py_TYPE(obj)->tp_name);
        }
        return -1;
    }
    Py_ssize_t cnt = PySequence_Fast_GET_SIZE(seq);
    uint64_t *r = PyMem_Malloc((size_t)(cnt > 0 ? cnt : 1) * sizeof *r);
    if (r == NULL) {
        Py_DECREF(seq);
        PyErr_NoMemory();
        return -1;
    }
    PyObject **items = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t i = 0; i < cnt; i++) {
        PyObject *it = items[i];
        if (!PyLong_Check(it)) {
            PyObject *ix = PyNumber_Index(it); /* numpy integers */
            if (ix == NULL) {
                PyErr_Clear();
                PyErr_Format(PyExc_TypeError, "rows[%zd]: an int is needed, got %s", i,
                             Py_TYPE(it)->tp_name);
                goto fail;
            }
            r[i] = PyLong_AsUnsignedLongLong(ix);
            Py_DECREF(ix);
        } else {
            r[i] = PyLong_AsUnsignedLongLong(it);
        }
        if (r[i] == (uint64_t)-1 && PyErr_Occurred()) {
            PyErr_Clear();
            PyErr_Format(PyExc_ValueError,
                         "rows[%zd] is not an unsigned 64-bit integer (rows are "
                         "0..2**64-1)",
                         i);
            goto fail;
        }
    }
    Py_DECREF(seq);
    *out = r;
    *n = (size_t)cnt;
    return 0;
fail:
    PyMem_Free(r);
    Py_DECREF(seq);
    return -1;
}

static PyObject *
mod_version(PyObject *m, PyObject *noarg)
{
    (void)m;
    (void)noarg;
    return PyUnicode_FromString(dp_version_string());
}

static PyObject *
mod_strerror(PyObject *m, PyObject *arg)
{
    (void)m;
    long code = PyLong_AsLong(arg);
    if (code == -1 && PyErr_Occurred())
        return NULL;
    return PyUnicode_FromString(dp_strerror((int)code));
}

static PyMethodDef mod_methods[] = {
    {"version", mod_version, METH_NOARGS, "The library's version, e.g. '0.1.0'."},
    {"strerror", mod_strerror, METH_O, "The message of an error code."},
    {"error", (PyCFunction)(void (*)(void))mod_error, METH_VARARGS | METH_KEYWORDS,
     "error(code, detail, keys=None, rows=None, landed=None) -> the exception"},
    {"group_keys", dp__py_group_keys, METH_VARARGS,
     "group_keys(keys, repeats=False) -> (rows, fields, slots) of '<gidx>@<field>' "
     "keys; slots: bytes of len(fields) x len(rows) key indexes (-1: none)."},
    {"columns", dp__py_columns, METH_VARARGS,
     "columns(values, slots, n_rows, fill) -> per field of slots, [values[i] or fill "
     "for each row's key index i]"},
    {"same_kind", dp__py_same_kind, METH_VARARGS,
     "same_kind(col, type, dtype) -> bool: CPU tensors of that type and dtype"},
    {"rows_of", dp__py_rows_of, METH_VARARGS,
     "rows_of(col, type, ptr, row_bytes, shape, dtype, is_complex) -> bool"},
    {"field_major", dp__py_field_major, METH_VARARGS,
     "field_major(slots, n_rows) -> bool: cell (f, r) holds key f * n_rows + r "
     "throughout"},
    {"split_hints", dp__py_split_hints, METH_VARARGS,
     "split_hints(locs, n_rows, n_fields) -> [[hint or None per row] per field]"},
    {"key_hints", dp__py_key_hints, METH_VARARGS,
     "key_hints(locs, slots, n_rows, n_keys) -> [hint or None per key]"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef mod_def = {
    PyModuleDef_HEAD_INIT,
    "dataplane._core",
    "The C extension of the dataplane package (use the package, not this module).",
    -1,
    mod_methods,
};

static int
add_errors(PyObject *m)
{
    DpError = PyErr_NewExceptionWithDoc(
        "dataplane.Error",
        "Base of every dataplane error: code, name, detail, keys, rows, landed.", NULL,
        NULL);
    if (DpError == NULL || PyModule_AddObjectRef(m, "Error", DpError) < 0)
        return -1;
    for (size_t i = 0; i < N_ERR_CLASSES; i++) {
        err_class *ec = &err_classes[i];
        PyObject *bases = ec->builtin != NULL ? PyTuple_Pack(2, DpError, *ec->builtin)
                                              : PyTuple_Pack(1, DpError);
        if (bases == NULL)
            return -1;
        char full[64];
        snprintf(full, sizeof full, "dataplane.%s", ec->name);
        ec->cls = PyErr_NewExceptionWithDoc(full, ec->doc, bases, NULL);
        Py_DECREF(bases);
        if (ec->cls == NULL || PyModule_AddObjectRef(m, ec->name, ec->cls) < 0)
            return -1;
    }
    return 0;
}

static int
add_type(PyObject *m, const char *name, PyTypeObject *t)
{
    if (PyType_Ready(t) < 0)
        return -1;
    return PyModule_AddObjectRef(m, name, (PyObject *)t);
}

PyMODINIT_FUNC
PyInit__core(void)
{
    PyObject *m = PyModule_Create(&mod_def);
    if (m == NULL)
        return NULL;
    if (add_errors(m) < 0 || add_type(m, "Client", &DpClient_Type) < 0 ||
        add_type(m, "Values", &DpValues_Type) < 0 ||
        add_type(m, "Slice", &DpSlice_Type) < 0 ||
        add_type(m, "Buffer", &DpBuffer_Type) < 0 ||
        add_type(m, "Transport", &DpTransport_Type) < 0 ||
        add_type(m, "Fetch", &DpFetch_Type) < 0 ||
        PyModule_AddIntConstant(m, "KIND_TENSOR", DP_KIND_TENSOR) < 0 ||
        PyModule_AddIntConstant(m, "KIND_BYTES", DP_KIND_BYTES) < 0 ||
        PyModule_AddIntConstant(m, "KIND_OBJECT", DP_KIND_OBJECT) < 0 ||
        PyModule_AddIntConstant(m, "SHAPE_MAX", DP_SHAPE_MAX) < 0 ||
        PyModule_AddIntConstant(m, "DTYPE_MAX", DP_DTYPE_MAX) < 0) {
        Py_DECREF(m);
        return NULL;
    }
#define ADD_CODE_(name, value, msg)                                                      \
    if (PyModule_AddIntConstant(m, #name, value) < 0) {                                  \
        Py_DECREF(m);                                                                    \
        return NULL;                                                                     \
    }
    DP_ERRORS(ADD_CODE_)
#undef ADD_CODE_
    return m;
}
