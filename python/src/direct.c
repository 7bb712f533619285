/*
 * dataplane._core.Transport and Fetch: the direct transport (dp_direct) for
 * Python (docs/design.md, "Direct transport" and "Python package"). The
 * Python layer (dataplane/direct.py) adds dtypes and shapes to the
 * library's metadata and makes tensors of the fetched buffers.
 *
 * Lifetimes. A published object's owners (the tensors or arrays whose memory
 * it publishes) are kept in a dict until free(obj_id), so the memory stays
 * alive as the library requires. A Fetch keeps its Transport and its
 * targets' owners alive; Transport.close is refused (Busy) while fetches
 * live, as the library refuses it.
 */
#include "dp_py.h"

#include <unistd.h>

typedef struct DpTransport {
    PyObject_HEAD
    dp_direct *t; /* NULL once closed (set before the library's destroy runs) */
    pid_t pid;
    int busy;            /* calls running with the GIL released (counted under it) */
    PyObject *published; /* obj_id -> owners */
} DpTransport;

typedef struct DpFetch {
    PyObject_HEAD
    DpTransport *tr;
    dp_direct_req *r;
    PyObject *owners;
    bool given;  /* buffers() handed out Slices: they keep this object alive */
    bool closed; /* close() was called */
    int waiters; /* threads in wait() with the GIL released (counted under it) */
    char id[DP_DIRECT_ID_MAX + 1];
    pid_t pid;
} DpFetch;

static bool
transport_usable(DpTransport *self)
{
    if (self->pid != getpid()) {
        dp__py_raise_forked("Transport", self->pid);
        return false;
    }
    if (self->t == NULL) {
        dp__py_raise_ex(DP_ECLOSED, "this Transport is closed", NULL, NULL, NULL);
        return false;
    }
    return true;
}

static PyObject *
transport_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    (void)args;
    (void)kw;
    DpTransport *self = (DpTransport *)type->tp_alloc(type, 0);
    if (self != NULL)
        self->pid = getpid();
    return (PyObject *)self;
}

static int
transport_init(DpTransport *self, PyObject *args, PyObject *kw)
{
    static char *kwl[] = {
        "name",      "pool_bytes",        "xfer_timeout_s",    "chunk_bytes",
        "n_workers", "remote_cache_size", "fetch_cache_bytes", NULL};
    dp_direct_opts o;
    dp_direct_opts_init(&o);
    Py_ssize_t pool = 0, chunk = 0, fcache = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|zndniin", kwl, &o.name, &pool,
                                     &o.xfer_timeout_s, &chunk, &o.n_workers,
                                     &o.remote_cache_size, &fcache))
        return -1;
    if (pool < 0 || chunk < 0 || fcache < -1) {
        dp__py_raise_ex(
            DP_EINVAL, "pool_bytes and chunk_bytes must be >= 0, fetch_cache_bytes >= -1",
            NULL, NULL, NULL);
        return -1;
    }
    o.fetch_cache_bytes = fcache < 0 ? DP_DIRECT_FETCH_CACHE_OFF : (size_t)fcache;
    if (self->t != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Transport is already open");
        return -1;
    }
    o.pool_bytes = (size_t)pool;
    o.chunk_bytes = (size_t)chunk;
    dp_detail d = {0};
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = dp_direct_create(&o, &self->t, &d);
    Py_END_ALLOW_THREADS
    if (rc != DP_OK) {
        dp__py_raise(rc, &d);
        return -1;
    }
    self->published = PyDict_New();
    return self->published != NULL ? 0 : -1;
}

/*
 * Close: refused while other threads' calls run (Busy) or fetches live (the
 * library's Busy). t is taken away before the library's destroy runs without
 * the GIL, so a call that starts meanwhile sees a closed Transport.
 */
static PyObject *
transport_close(DpTransport *self, PyObject *noarg)
{
    (void)noarg;
    if (self->pid != getpid() || self->t == NULL)
        Py_RETURN_NONE;
    if (self->busy > 0)
        return dp__py_raise_ex(DP_EBUSY,
                               "Transport.close: other threads' calls on it are running; "
                               "let them end first",
                               NULL, NULL, NULL);
    dp_direct *t = self->t;
    self->t = NULL;
    dp_detail d = {0};
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = dp_direct_destroy(t, &d);
    Py_END_ALLOW_THREADS
    if (rc != DP_OK) {
        self->t = t; /* still fully usable */
        return dp__py_raise(rc, &d);
    }
    Py_CLEAR(self->published); /* the library kept what a failed READ may touch */
    Py_RETURN_NONE;
}

static void
transport_dealloc(DpTransport *self)
{
    if (self->t != NULL && self->pid == getpid() && self->published != NULL &&
        dp_direct_destroy(self->t, NULL) != DP_OK)
        dp__py_keep_forever(self->published); /* cannot happen: fetches hold self */
    Py_XDECREF(self->published);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* [(address, nbytes)] -> dp_direct_buf array. */
static int
buf_list(PyObject *list, dp_direct_buf **out, size_t *n)
{
    PyObject *seq = PySequence_Fast(list, "buffers: a list of (address, nbytes)");
    if (seq == NULL)
        return -1;
    size_t cnt = (size_t)PySequence_Fast_GET_SIZE(seq);
    dp_direct_buf *b = PyMem_Calloc(cnt ? cnt : 1, sizeof *b);
    if (b == NULL) {
        Py_DECREF(seq);
        PyErr_NoMemory();
        return -1;
    }
    for (size_t i = 0; i < cnt; i++) {
        PyObject *addr;
        Py_ssize_t len;
        if (!PyArg_ParseTuple(PySequence_Fast_ITEMS(seq)[i], "On", &addr, &len) ||
            ((b[i].addr = PyLong_AsVoidPtr(addr)) == NULL && PyErr_Occurred())) {
            PyMem_Free(b);
            Py_DECREF(seq);
            return -1;
        }
        b[i].len = (size_t)len;
    }
    Py_DECREF(seq);
    *out = b;
    *n = cnt;
    return 0;
}

/* publish(obj_id, [(address, nbytes)], owners) -> metadata bytes. */
static PyObject *
transport_publish(DpTransport *self, PyObject *args)
{
    const char *id;
    PyObject *bufs, *owners;
    if (!PyArg_ParseTuple(args, "sOO", &id, &bufs, &owners) || !transport_usable(self))
        return NULL;
    dp_direct_buf *b = NULL;
    size_t n = 0;
    if (buf_list(bufs, &b, &n) < 0)
        return NULL;
    uint8_t *md = NULL;
    size_t md_len = 0;
    dp_detail d = {0};
    int rc;
    dp_direct *t = self->t;
    self->busy++;
    Py_BEGIN_ALLOW_THREADS
    rc = dp_direct_publish(t, id, b, n, &md, &md_len, &d);
    Py_END_ALLOW_THREADS
    self->busy--;
    PyMem_Free(b);
    if (rc != DP_OK)
        return dp__py_raise(rc, &d);
    PyObject *ret = PyBytes_FromStringAndSize((const char *)md, (Py_ssize_t)md_len);
    dp_free(md);
    if (ret == NULL || PyDict_SetItemString(self->published, id, owners) < 0) {
        /* Unpublish: a published object whose owners are not kept could be freed
         * under a fetch. */
        Py_CLEAR(ret);
        if (dp_direct_free(t, id, NULL) != DP_OK)
            dp__py_keep_forever(owners);
    }
    return ret;
}

static PyObject *
transport_free(DpTransport *self, PyObject *args)
{
    const char *id;
    if (!PyArg_ParseTuple(args, "s", &id) || !transport_usable(self))
        return NULL;
    dp_detail d = {0};
    int rc;
    dp_direct *t = self->t;
    self->busy++;
    Py_BEGIN_ALLOW_THREADS
    rc = dp_direct_free(t, id, &d);
    Py_END_ALLOW_THREADS
    self->busy--;
    if (rc != DP_OK)
        return dp__py_raise(rc, &d);
    if (PyDict_DelItemString(self->published, id) < 0)
        PyErr_Clear();
    Py_RETURN_NONE;
}

/* _register(addr, len, on): register_permanent (on) or deregister_permanent
 * [addr, addr + len); the Python layer keeps the memory's owner alive. */
static PyObject *
transport_register(DpTransport *self, PyObject *args)
{
    unsigned long long addr, len;
    int on;
    if (!PyArg_ParseTuple(args, "KKp", &addr, &len, &on) || !transport_usable(self))
        return NULL;
    dp_detail d = {0};
    int rc;
    dp_direct *t = self->t;
    self->busy++;
    Py_BEGIN_ALLOW_THREADS
    rc = on ? dp_direct_register_permanent(t, (void *)(uintptr_t)addr, (size_t)len, &d)
            : dp_direct_deregister_permanent(t, (void *)(uintptr_t)addr, (size_t)len, &d);
    Py_END_ALLOW_THREADS
    self->busy--;
    if (rc != DP_OK)
        return dp__py_raise(rc, &d);
    Py_RETURN_NONE;
}

static PyObject *
transport_abort(DpTransport *self, PyObject *args)
{
    const char *id;
    if (!PyArg_ParseTuple(args, "s", &id) || !transport_usable(self))
        return NULL;
    dp_detail d = {0};
    int rc = dp_direct_abort(self->t, id, &d);
    if (rc != DP_OK)
        return dp__py_raise(rc, &d);
    Py_RETURN_NONE;
}

/* fetch(obj_id, metadata, [(address, nbytes)] or None, owners) -> Fetch. */
static PyObject *
transport_fetch(DpTransport *self, PyObject *args)
{
    const char *id;
    Py_buffer md;
    PyObject *targets, *owners;
    if (!PyArg_ParseTuple(args, "sy*OO", &id, &md, &targets, &owners))
        return NULL;
    if (!transport_usable(self)) {
        PyBuffer_Release(&md);
        return NULL;
    }
    dp_direct_buf *b = NULL;
    size_t n = 0;
    if (targets != Py_None && buf_list(targets, &b, &n) < 0) {
        PyBuffer_Release(&md);
        return NULL;
    }
    dp_direct_req *r = NULL;
    dp_detail d = {0};
    int rc;
    dp_direct *t = self->t;
    self->busy++;
    Py_BEGIN_ALLOW_THREADS
    rc = dp_direct_fetch(t, id, md.buf, (size_t)md.len, b, n, &r, &d);
    Py_END_ALLOW_THREADS
    self->busy--;
    PyMem_Free(b);
    PyBuffer_Release(&md);
    if (rc != DP_OK)
        return dp__py_raise(rc, &d);
    DpFetch *f = PyObject_New(DpFetch, &DpFetch_Type);
    if (f == NULL) {
        dp_direct_req_destroy(r);
        return NULL;
    }
    f->tr = (DpTransport *)Py_NewRef((PyObject *)self);
    f->r = r;
    f->owners = Py_NewRef(owners);
    f->given = f->closed = false;
    f->waiters = 0;
    snprintf(f->id, sizeof f->id, "%s", id);
    f->pid = getpid();
    return (PyObject *)f;
}

static PyObject *
transport_stats(DpTransport *self, PyObject *noarg)
{
    (void)noarg;
    if (!transport_usable(self))
        return NULL;
    dp_direct_stats s;
    dp_direct_get_stats(self->t, &s);
    return Py_BuildValue(
        "{sKsKsKsKsKsKsKsKsKsKsKsK}", "objects", (unsigned long long)s.objects,
        "registrations", (unsigned long long)s.registrations, "registered_bytes",
        (unsigned long long)s.registered_bytes, "fetches", (unsigned long long)s.fetches,
        "fetch_ok", (unsigned long long)s.fetch_ok, "fetch_failed",
        (unsigned long long)s.fetch_failed, "fetch_aborted",
        (unsigned long long)s.fetch_aborted, "bytes_fetched",
        (unsigned long long)s.bytes_fetched, "fetch_buf_reused",
        (unsigned long long)s.fetch_buf_reused, "fetch_buf_cached",
        (unsigned long long)s.fetch_buf_cached, "fetch_buf_retired",
        (unsigned long long)s.fetch_buf_retired, "fetch_buf_reclaimed",
        (unsigned long long)s.fetch_buf_reclaimed);
}

static PyObject *
transport_name(DpTransport *self, void *closure)
{
    (void)closure;
    if (!transport_usable(self))
        return NULL;
    return PyUnicode_FromString(dp_direct_name(self->t));
}

static PyMethodDef transport_methods[] = {
    {"publish", (PyCFunction)transport_publish, METH_VARARGS, NULL},
    {"free", (PyCFunction)transport_free, METH_VARARGS, NULL},
    {"_register", (PyCFunction)transport_register, METH_VARARGS, NULL},
    {"abort", (PyCFunction)transport_abort, METH_VARARGS, NULL},
    {"fetch", (PyCFunction)transport_fetch, METH_VARARGS, NULL},
    {"stats", (PyCFunction)transport_stats, METH_NOARGS, NULL},
    {"close", (PyCFunction)transport_close, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef transport_getset[] = {
    {"name", (getter)transport_name, NULL, "the endpoint name peers see", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject DpTransport_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "dataplane._core.Transport",
    .tp_basicsize = sizeof(DpTransport),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "The direct transport (use dataplane.Transport).",
    .tp_new = transport_new,
    .tp_init = (initproc)transport_init,
    .tp_dealloc = (destructor)transport_dealloc,
    .tp_methods = transport_methods,
    .tp_getset = transport_getset,
};

/* ---- Fetch ---- */

static void
fetch_destroy(DpFetch *self)
{
    if (self->r == NULL)
        return;
    dp_direct_req *r = self->r;
    self->r = NULL;
    if (self->pid != getpid())
        return;
    /*
     * Whether a failed READ may still write the targets is known only once
     * the request ended: destroy (it aborts and waits), then ask about the
     * ranges it had.
     */
    size_t n = dp_direct_req_count(r);
    dp_direct_buf *spans = PyMem_Calloc(n ? n : 1, sizeof *spans);
    for (size_t i = 0; spans != NULL && i < n; i++)
        if (dp_direct_req_buffer(r, i, &spans[i].addr, &spans[i].len) != DP_OK)
            spans[i].len = 0;
    Py_BEGIN_ALLOW_THREADS
    dp_direct_req_destroy(r);
    Py_END_ALLOW_THREADS
    bool keep = spans == NULL || self->tr->t == NULL; /* unknown: keep */
    for (size_t i = 0; !keep && i < n; i++)
        keep = spans[i].len > 0 &&
               dp_direct_touches_unfinished(self->tr->t, spans[i].addr, spans[i].len);
    PyMem_Free(spans);
    if (keep && self->owners != NULL)
        dp__py_keep_forever(self->owners); /* a READ may still land in them */
}

static void
fetch_dealloc(DpFetch *self)
{
    fetch_destroy(self);
    Py_XDECREF(self->owners);
    Py_XDECREF(self->tr);
    PyObject_Free(self);
}

static PyObject *
fetch_wait(DpFetch *self, PyObject *args)
{
    double timeout = -1;
    if (!PyArg_ParseTuple(args, "|d", &timeout))
        return NULL;
    if (self->pid != getpid())
        return dp__py_raise_forked("Fetch", self->pid);
    if (self->r == NULL || self->closed)
        return dp__py_raise_ex(DP_ECLOSED, "this fetch is closed", NULL, NULL, NULL);
    dp_detail d = {0};
    int rc;
    dp_direct_req *r = self->r;
    self->waiters++;
    Py_BEGIN_ALLOW_THREADS
    rc = dp_direct_wait(r, timeout, &d);
    Py_END_ALLOW_THREADS
    if (--self->waiters == 0 && self->closed && !self->given)
        fetch_destroy(self); /* closed while this thread waited */
    if (rc != DP_OK)
        return dp__py_raise(rc, &d);
    Py_RETURN_NONE;
}

/* buffers() -> [Slice]: the fetched bytes (valid while the Fetch lives). */
static PyObject *
fetch_buffers(DpFetch *self, PyObject *noarg)
{
    (void)noarg;
    if (self->r == NULL || self->closed || self->pid != getpid())
        return dp__py_raise_ex(DP_ECLOSED, "this fetch is closed", NULL, NULL, NULL);
    self->given = true;
    size_t n = dp_direct_req_count(self->r);
    PyObject *list = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; list != NULL && i < n; i++) {
        void *a = NULL;
        size_t len = 0;
        dp_direct_req_buffer(self->r, i, &a, &len);
        DpSlice *s = PyObject_New(DpSlice, &DpSlice_Type);
        if (s == NULL) {
            Py_CLEAR(list);
            break;
        }
        s->owner = Py_NewRef((PyObject *)self);
        s->p = a;
        s->n = (Py_ssize_t)len;
        PyList_SET_ITEM(list, (Py_ssize_t)i, (PyObject *)s);
    }
    return list;
}

/*
 * Stop and free the request, unless buffers() handed out its memory: the
 * tensors made of it stay valid, and the request (which owns that memory) is
 * freed with this object, when the last of them is gone.
 */
static PyObject *
fetch_close(DpFetch *self, PyObject *noarg)
{
    (void)noarg;
    self->closed = true;
    if (self->r == NULL || self->pid != getpid())
        Py_RETURN_NONE;
    if (self->waiters > 0) { /* stop it; the last waiter frees it */
        /* This request only: an abort by id could outlive a request that just
         * ended and fail the next fetch of the id. */
        dp_direct_req_cancel(self->r);
        Py_RETURN_NONE;
    }
    if (!self->given)
        fetch_destroy(self);
    Py_RETURN_NONE;
}

static PyObject *
fetch_progress(DpFetch *self, void *closure)
{
    (void)closure;
    uint64_t done = 0, total = 0;
    if (self->r != NULL && self->pid == getpid())
        dp_direct_req_progress(self->r, &done, &total);
    return Py_BuildValue("(KK)", (unsigned long long)done, (unsigned long long)total);
}

static PyObject *
fetch_ended(DpFetch *self, void *closure)
{
    (void)closure;
    if (self->pid != getpid())
        return dp__py_raise_forked("Fetch", self->pid);
    return PyBool_FromLong(self->r == NULL || dp_direct_req_ended(self->r));
}

static PyMethodDef fetch_methods[] = {
    {"wait", (PyCFunction)fetch_wait, METH_VARARGS, NULL},
    {"buffers", (PyCFunction)fetch_buffers, METH_NOARGS, NULL},
    {"close", (PyCFunction)fetch_close, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef fetch_getset[] = {
    {"progress", (getter)fetch_progress, NULL, "(bytes done, bytes in all)", NULL},
    {"ended", (getter)fetch_ended, NULL, "True once done or failed", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject DpFetch_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "dataplane._core.Fetch",
    .tp_basicsize = sizeof(DpFetch),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A running fetch of the direct transport.",
    .tp_dealloc = (destructor)fetch_dealloc,
    .tp_methods = fetch_methods,
    .tp_getset = fetch_getset,
};
