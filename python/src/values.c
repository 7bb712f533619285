/*
 * Memory the package hands to Python (docs/design.md, "Python package"):
 * Values (what a get fetched, in registered memory of the library), Slice
 * (one value's bytes through the buffer protocol, keeping its Values alive)
 * and Buffer (registered memory from Client.alloc, keeping its Client open).
 * numpy.frombuffer and torch.frombuffer read both without a copy.
 */
#include "dp_py.h"

#include <string.h>
#include <unistd.h>

/* ---- Values ---- */

typedef struct DpValues {
    PyObject_HEAD
    dp_values *v;
    pid_t pid;
} DpValues;

PyObject *
dp__py_values_new(dp_values *v, PyObject *client)
{
    (void)client; /* v keeps the library's client alive by itself */
    DpValues *self = PyObject_New(DpValues, &DpValues_Type);
    if (self == NULL) {
        dp_values_destroy(v);
        return NULL;
    }
    self->v = v;
    self->pid = getpid();
    return (PyObject *)self;
}

static void
values_dealloc(DpValues *self)
{
    if (self->v != NULL && self->pid == getpid()) {
        dp_values *v = self->v;
        Py_BEGIN_ALLOW_THREADS /* it takes the client's mutex */
        dp_values_destroy(v);
        Py_END_ALLOW_THREADS
    }
    PyObject_Free(self);
}

static Py_ssize_t
values_len(DpValues *self)
{
    return (Py_ssize_t)dp_values_count(self->v);
}

static bool
values_usable(DpValues *self)
{
    if (self->pid != getpid()) {
        dp__py_raise_forked("Values", self->pid);
        return false;
    }
    return true;
}

static PyObject *entry_tuple(struct DpValues *self, size_t i);

static PyObject *
slice_new(PyObject *owner, void *p, Py_ssize_t n)
{
    DpSlice *s = PyObject_New(DpSlice, &DpSlice_Type);
    if (s == NULL)
        return NULL;
    s->owner = Py_NewRef(owner);
    s->p = p;
    s->n = n;
    return (PyObject *)s;
}

/*
 * entries() -> [(status, kind, dtype, shape, nbytes, Slice or None)], one per
 * key in request order; the Slice exposes the value's bytes.
 */
static PyObject *
values_entries(DpValues *self, PyObject *noarg)
{
    (void)noarg;
    if (!values_usable(self))
        return NULL;
    size_t n = dp_values_count(self->v);
    PyObject *list = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; list != NULL && i < n; i++) {
        PyObject *t = entry_tuple(self, i);
        if (t == NULL) {
            Py_CLEAR(list);
            break;
        }
        PyList_SET_ITEM(list, (Py_ssize_t)i, t);
    }
    return list;
}

/* One entry as entries() gives it. */
static PyObject *
entry_tuple(DpValues *self, size_t i)
{
    const void *data = NULL;
    uint64_t nb = 0;
    const dp_value_desc *ds = NULL;
    int st = dp_values_get(self->v, i, &data, &nb, &ds);
    if (st != 0)
        return Py_BuildValue("(iOOOKO)", st, Py_None, Py_None, Py_None, 0ULL, Py_None);
    PyObject *shape = dp__py_shape(ds);
    PyObject *sl =
        shape ? slice_new((PyObject *)self, (void *)data, (Py_ssize_t)nb) : NULL;
    if (sl == NULL) {
        Py_XDECREF(shape);
        return NULL;
    }
    return Py_BuildValue("(iisNKN)", 0, (int)ds->kind, ds->dtype, shape,
                         (unsigned long long)nb, sl);
}

/* entry(i) -> one entry of entries(), without building the others. */
static PyObject *
values_entry(DpValues *self, PyObject *arg)
{
    Py_ssize_t i = PyLong_AsSsize_t(arg);
    if ((i == -1 && PyErr_Occurred()) || !values_usable(self))
        return NULL;
    if (i < 0 || (size_t)i >= dp_values_count(self->v)) {
        PyErr_Format(PyExc_IndexError, "entry(%zd): %zu values", i,
                     dp_values_count(self->v));
        return NULL;
    }
    return entry_tuple(self, (size_t)i);
}

#define RUNS_OPEN_MAX 64

typedef struct chain {
    size_t start, step, count, last; /* entries start, start + step, ... (relative) */
    const uint8_t *first, *next;     /* first byte; where the next member must lie */
    uint64_t nbytes;
    const dp_value_desc *ds;
} chain;

/* A chain of two or more as runs() gives it; a single one joins rest. */
static int
chain_out(DpValues *self, const chain *c, PyObject *chains, PyObject *rest)
{
    if (c->count < 2) {
        PyObject *k = PyLong_FromSize_t(c->start);
        int rc = k != NULL ? PyList_Append(rest, k) : -1;
        Py_XDECREF(k);
        return rc;
    }
    uint64_t stride = (c->nbytes + 63) / 64 * 64;
    Py_ssize_t len = (Py_ssize_t)((c->count - 1) * stride + c->nbytes);
    PyObject *shape = dp__py_shape(c->ds);
    PyObject *sl = shape ? slice_new((PyObject *)self, (void *)c->first, len) : NULL;
    PyObject *t =
        sl ? Py_BuildValue("(nnnsNKKN)", (Py_ssize_t)c->start, (Py_ssize_t)c->step,
                           (Py_ssize_t)c->count, c->ds->dtype, shape,
                           (unsigned long long)c->nbytes, (unsigned long long)stride, sl)
           : NULL;
    if (t == NULL) {
        if (sl == NULL)
            Py_XDECREF(shape);
        return -1;
    }
    int rc = PyList_Append(chains, t);
    Py_DECREF(t);
    return rc;
}

/*
 * runs(i0, n) -> (chains, rest) over values i0 .. i0+n-1: the fetched tensors
 * of one dtype, shape and size that lie one after another in memory (each at
 * the previous one's address plus its size rounded up to 64, as a blob lays
 * them out) at a constant step of index, as (start, step, count, dtype,
 * shape, nbytes, stride, Slice over them all), start relative to i0; rest:
 * the relative indices of every other value (not fetched, not a tensor, 0
 * bytes, or alone), for entry(). The Python layer then makes one strided
 * tensor per chain and unbinds it, instead of a call per value.
 */
static PyObject *
values_runs(DpValues *self, PyObject *args)
{
    Py_ssize_t i0, n;
    if (!PyArg_ParseTuple(args, "nn", &i0, &n) || !values_usable(self))
        return NULL;
    size_t cnt = dp_values_count(self->v);
    if (i0 < 0 || n < 0 || (size_t)i0 > cnt || (size_t)n > cnt - (size_t)i0) {
        PyErr_Format(PyExc_IndexError, "runs(%zd, %zd): %zu values", i0, n, cnt);
        return NULL;
    }
    PyObject *chains = PyList_New(0), *rest = PyList_New(0);
    chain open[RUNS_OPEN_MAX];
    size_t n_open = 0;
    bool ok = chains != NULL && rest != NULL;
    for (size_t k = 0; ok && k < (size_t)n; k++) {
        const void *data = NULL;
        uint64_t nb = 0;
        const dp_value_desc *ds = NULL;
        int st = dp_values_get(self->v, (size_t)i0 + k, &data, &nb, &ds);
        if (st != 0 || ds == NULL || ds->kind != DP_KIND_TENSOR || nb == 0) {
            PyObject *x = PyLong_FromSize_t(k);
            ok = x != NULL && PyList_Append(rest, x) == 0;
            Py_XDECREF(x);
            continue;
        }
        const uint8_t *p = data;
        size_t c = 0;
        while (c < n_open && !(open[c].next == p && open[c].nbytes == nb &&
                               dp__py_same_desc(open[c].ds, ds)))
            c++;
        if (c < n_open && open[c].count >= 2 && k - open[c].last != open[c].step) {
            /* the next in memory, but not at the chain's step: the chain ends */
            ok = chain_out(self, &open[c], chains, rest) == 0;
            open[c] = open[--n_open];
            c = n_open;
        }
        if (c < n_open) {
            chain *h = &open[c];
            if (h->count == 1)
                h->step = k - h->last;
            h->count++;
            h->last = k;
            h->next = p + (nb + 63) / 64 * 64;
            continue;
        }
        if (n_open == RUNS_OPEN_MAX) { /* the oldest ends */
            ok = ok && chain_out(self, &open[0], chains, rest) == 0;
            memmove(open, open + 1, (RUNS_OPEN_MAX - 1) * sizeof open[0]);
            n_open--;
        }
        open[n_open++] = (chain){k, 0, 1, k, p, p + (nb + 63) / 64 * 64, nb, ds};
    }
    for (size_t c = 0; ok && c < n_open; c++)
        ok = chain_out(self, &open[c], chains, rest) == 0;
    if (!ok) {
        Py_XDECREF(chains);
        Py_XDECREF(rest);
        return NULL;
    }
    return Py_BuildValue("(NN)", chains, rest);
}

/* An open run of jagged(): members start .. start + count - 1. */
typedef struct jrun {
    size_t start, count;
    const uint8_t *first, *next; /* first byte; where the next member must lie */
    const uint8_t *end;          /* the last member's end */
    uint64_t isz;                /* bytes per element */
    const dp_value_desc *ds;
    PyObject *sizes; /* element counts: member, gap, member, ... */
} jrun;

/* Emit run r (two members or more) into out; frees its sizes either way. */
static int
jrun_out(DpValues *self, jrun *r, PyObject *out)
{
    int rc = 0;
    if (r->count >= 2) {
        PyObject *sl = slice_new((PyObject *)self, (void *)r->first,
                                 (Py_ssize_t)(r->end - r->first));
        PyObject *t = sl ? Py_BuildValue("(nnsON)", (Py_ssize_t)r->start,
                                         (Py_ssize_t)r->count, r->ds->dtype, r->sizes, sl)
                         : NULL;
        rc = t != NULL ? PyList_Append(out, t) : -1;
        Py_XDECREF(t);
    }
    Py_CLEAR(r->sizes);
    r->count = 0;
    return rc;
}

/*
 * jagged(i0, n) -> [(start, count, dtype, sizes, Slice)] over values i0 ..
 * i0+n-1: runs of consecutive values that are fetched 1-D tensors of one
 * dtype, each at the previous one's address plus its size rounded up to 64
 * (a blob's layout), of any lengths: sizes gives, in elements, the first
 * member, the gap after it, the second member, ... (the Slice spans them all,
 * from the first member's first byte to the last one's last), so
 * that one tensor over the Slice split by sizes gives every member (the even
 * pieces) with one call. start is relative to i0. Values of other kinds, and
 * lone ones, are not in any run.
 */
static PyObject *
values_jagged(DpValues *self, PyObject *args)
{
    Py_ssize_t i0, n;
    if (!PyArg_ParseTuple(args, "nn", &i0, &n) || !values_usable(self))
        return NULL;
    size_t cnt = dp_values_count(self->v);
    if (i0 < 0 || n < 0 || (size_t)i0 > cnt || (size_t)n > cnt - (size_t)i0) {
        PyErr_Format(PyExc_IndexError, "jagged(%zd, %zd): %zu values", i0, n, cnt);
        return NULL;
    }
    PyObject *out = PyList_New(0);
    jrun r = {0};
    bool ok = out != NULL;
    for (size_t k = 0; ok && k < (size_t)n; k++) {
        const void *data = NULL;
        uint64_t nb = 0;
        const dp_value_desc *ds = NULL;
        int st = dp_values_get(self->v, (size_t)i0 + k, &data, &nb, &ds);
        bool one_d = st == 0 && ds != NULL && ds->kind == DP_KIND_TENSOR && nb > 0 &&
                     ds->ndim == 1 && ds->shape[0] > 0 && nb % ds->shape[0] == 0;
        uint64_t isz = one_d ? nb / ds->shape[0] : 0;
        const uint8_t *p = data;
        if (one_d && r.count > 0 && p == r.next && isz == r.isz &&
            strcmp(ds->dtype, r.ds->dtype) == 0) {
            /* the gap before p, in elements (a multiple: isz divides 64 and
             * the last member's size), then p's own length */
            PyObject *gap = PyLong_FromUnsignedLongLong((uint64_t)(p - r.end) / isz);
            PyObject *len = PyLong_FromUnsignedLongLong(ds->shape[0]);
            ok = gap != NULL && len != NULL && PyList_Append(r.sizes, gap) == 0 &&
                 PyList_Append(r.sizes, len) == 0;
            Py_XDECREF(gap);
            Py_XDECREF(len);
            r.count++;
            r.end = p + nb;
            r.next = p + (nb + 63) / 64 * 64;
            continue;
        }
        if (r.count > 0)
            ok = jrun_out(self, &r, out) == 0;
        if (!ok || !one_d || (64 % isz) != 0)
            continue;
        r = (jrun){.start = k,
                   .count = 1,
                   .first = p,
                   .next = p + (nb + 63) / 64 * 64,
                   .end = p + nb,
                   .isz = isz,
                   .ds = ds,
                   .sizes = PyList_New(0)};
        PyObject *len = PyLong_FromUnsignedLongLong(ds->shape[0]);
        ok = r.sizes != NULL && len != NULL && PyList_Append(r.sizes, len) == 0;
        Py_XDECREF(len);
    }
    if (ok && r.count > 0)
        ok = jrun_out(self, &r, out) == 0;
    Py_CLEAR(r.sizes);
    if (!ok) {
        Py_XDECREF(out);
        return NULL;
    }
    return out;
}

/*
 * gather(i0, n, address, row_bytes) -> -1, or the relative index of the
 * first value that is not a fetched tensor of value i0's dtype and shape and
 * of row_bytes bytes (nothing copied then): copies values i0 .. i0+n-1 to
 * address + k * row_bytes, without the GIL. The caller owns the destination
 * (n * row_bytes bytes), a tensor it made for a stacked get.
 */
static PyObject *
values_gather(DpValues *self, PyObject *args)
{
    Py_ssize_t i0, n;
    PyObject *addr_obj;
    unsigned long long row;
    if (!PyArg_ParseTuple(args, "nnOK", &i0, &n, &addr_obj, &row) || !values_usable(self))
        return NULL;
    uint8_t *dst = PyLong_AsVoidPtr(addr_obj);
    if (dst == NULL && PyErr_Occurred())
        return NULL;
    size_t cnt = dp_values_count(self->v);
    if (i0 < 0 || n < 1 || (size_t)i0 > cnt || (size_t)n > cnt - (size_t)i0) {
        PyErr_Format(PyExc_IndexError, "gather(%zd, %zd): %zu values", i0, n, cnt);
        return NULL;
    }
    const dp_value_desc *d0 = NULL;
    for (Py_ssize_t k = 0; k < n; k++) {
        const void *data = NULL;
        uint64_t nb = 0;
        const dp_value_desc *ds = NULL;
        int st = dp_values_get(self->v, (size_t)(i0 + k), &data, &nb, &ds);
        if (k == 0)
            d0 = ds;
        if (st != 0 || ds == NULL || ds->kind != DP_KIND_TENSOR || nb != row ||
            !dp__py_same_desc(ds, d0))
            return PyLong_FromSsize_t(k);
    }
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t k = 0; k < n; k++) {
        const void *data = NULL;
        dp_values_get(self->v, (size_t)(i0 + k), &data, NULL, NULL);
        if (row > 0)
            memcpy(dst + (size_t)k * row, data, row);
    }
    Py_END_ALLOW_THREADS
    return PyLong_FromLong(-1);
}

static PyMethodDef values_methods[] = {
    {"gather", (PyCFunction)values_gather, METH_VARARGS,
     "gather(i0, n, address, row_bytes) -> -1 or the first value that differs"},
    {"entry", (PyCFunction)values_entry, METH_O, "entry(i) -> one item of entries()"},
    {"runs", (PyCFunction)values_runs, METH_VARARGS,
     "runs(i0, n) -> (chains, rest): equal tensors laid out one after another"},
    {"jagged", (PyCFunction)values_jagged, METH_VARARGS,
     "jagged(i0, n) -> [(start, count, dtype, sizes, Slice)]: 1-D tensors of one "
     "dtype laid out one after another"},
    {"entries", (PyCFunction)values_entries, METH_NOARGS,
     "entries() -> [(status, kind, dtype, shape, nbytes, Slice or None)]"},
    {NULL, NULL, 0, NULL},
};

static PySequenceMethods values_seq = {.sq_length = (lenfunc)values_len};

PyTypeObject DpValues_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "dataplane._core.Values",
    .tp_basicsize = sizeof(DpValues),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Values fetched by a get, in memory of the library.",
    .tp_dealloc = (destructor)values_dealloc,
    .tp_methods = values_methods,
    .tp_as_sequence = &values_seq,
};

/* ---- Slice ---- */

static char empty_byte;

static void
slice_dealloc(DpSlice *self)
{
    Py_XDECREF(self->owner);
    PyObject_Free(self);
}

static int
slice_getbuffer(DpSlice *self, Py_buffer *view, int flags)
{
    if (Py_TYPE(self->owner) == &DpValues_Type &&
        ((DpValues *)self->owner)->pid != getpid()) {
        view->obj = NULL;
        dp__py_raise_forked("Values", ((DpValues *)self->owner)->pid);
        return -1;
    }
    void *p = self->n > 0 ? self->p : &empty_byte;
    return PyBuffer_FillInfo(view, (PyObject *)self, p, self->n, 0, flags);
}

static Py_ssize_t
slice_len(DpSlice *self)
{
    return self->n;
}

static PyBufferProcs slice_buffer = {.bf_getbuffer = (getbufferproc)slice_getbuffer};
static PySequenceMethods slice_seq = {.sq_length = (lenfunc)slice_len};

PyTypeObject DpSlice_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "dataplane._core.Slice",
    .tp_basicsize = sizeof(DpSlice),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The bytes of one fetched value (buffer protocol, writable).",
    .tp_dealloc = (destructor)slice_dealloc,
    .tp_as_buffer = &slice_buffer,
    .tp_as_sequence = &slice_seq,
};

/* ---- Buffer ---- */

typedef struct DpBuffer {
    PyObject_HEAD
    DpClient *client;
    void *p;
    size_t n;
    Py_ssize_t exports;
    pid_t pid;
} DpBuffer;

PyObject *
dp__py_buffer_new(DpClient *client, void *p, size_t n)
{
    DpBuffer *b = PyObject_New(DpBuffer, &DpBuffer_Type);
    if (b == NULL)
        return NULL;
    b->client = (DpClient *)Py_NewRef((PyObject *)client);
    b->p = p;
    b->n = n;
    b->exports = 0;
    b->pid = getpid();
    pthread_mutex_lock(&client->mu);
    client->n_bufs++;
    pthread_mutex_unlock(&client->mu);
    return (PyObject *)b;
}

/* Give the memory back (kept by the library if a failed transfer touches it). */
static void
buffer_free(DpBuffer *self)
{
    if (self->p == NULL)
        return;
    void *p = self->p;
    self->p = NULL;
    if (self->pid != getpid())
        return; /* the parent's memory */
    dp_client *c = self->client->c;
    Py_BEGIN_ALLOW_THREADS /* it takes the client's mutex, held by a running put */
    dp_client_free(c, p);
    Py_END_ALLOW_THREADS
    dp__py_client_buffer_gone(self->client); /* close_now keeps a flying exception */
}

static void
buffer_dealloc(DpBuffer *self)
{
    buffer_free(self);
    Py_XDECREF(self->client);
    PyObject_Free(self);
}

static int
buffer_getbuffer(DpBuffer *self, Py_buffer *view, int flags)
{
    if (self->p == NULL) {
        PyErr_SetString(PyExc_BufferError, "this Buffer was released");
        view->obj = NULL;
        return -1;
    }
    if (self->pid != getpid()) {
        view->obj = NULL;
        dp__py_raise_forked("Buffer", self->pid);
        return -1;
    }
    if (PyBuffer_FillInfo(view, (PyObject *)self, self->p, (Py_ssize_t)self->n, 0,
                          flags) < 0)
        return -1;
    self->exports++;
    return 0;
}

static void
buffer_releasebuffer(DpBuffer *self, Py_buffer *view)
{
    (void)view;
    self->exports--;
}

/*
 * Some exporters (torch.frombuffer) give the buffer view back at once and keep
 * only a reference to this object while they use its memory. So release()
 * frees only when nothing but the caller refers to this object (its variable
 * and the call's own reference) and no view is exported.
 */
static PyObject *
buffer_release(DpBuffer *self, PyObject *noarg)
{
    (void)noarg;
    if (self->p == NULL)
        Py_RETURN_NONE;
    if (self->exports > 0 || Py_REFCNT(self) > 2) {
        PyErr_Format(
            PyExc_BufferError,
            "Buffer.release: this memory is still in use (%zd views, %zd other "
            "references, e.g. torch.frombuffer tensors); drop them first, or let "
            "the Buffer go and it is freed with its last reference",
            self->exports, Py_REFCNT(self) > 2 ? Py_REFCNT(self) - 2 : 0);
        return NULL;
    }
    buffer_free(self);
    Py_RETURN_NONE;
}

static PyObject *
buffer_address(DpBuffer *self, void *closure)
{
    (void)closure;
    return PyLong_FromVoidPtr(self->p);
}

static Py_ssize_t
buffer_len(DpBuffer *self)
{
    return self->p != NULL ? (Py_ssize_t)self->n : 0;
}

static PyMethodDef buffer_methods[] = {
    {"release", (PyCFunction)buffer_release, METH_NOARGS,
     "Give the memory back now (refused while views of it live)."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef buffer_getset[] = {
    {"address", (getter)buffer_address, NULL, "its address (0 once released)", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyBufferProcs buffer_buffer = {
    .bf_getbuffer = (getbufferproc)buffer_getbuffer,
    .bf_releasebuffer = (releasebufferproc)buffer_releasebuffer,
};
static PySequenceMethods buffer_seq = {.sq_length = (lenfunc)buffer_len};

PyTypeObject DpBuffer_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "dataplane._core.Buffer",
    .tp_basicsize = sizeof(DpBuffer),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Registered memory of a Client (buffer protocol): values in it move "
              "without a copy.",
    .tp_dealloc = (destructor)buffer_dealloc,
    .tp_methods = buffer_methods,
    .tp_getset = buffer_getset,
    .tp_as_buffer = &buffer_buffer,
    .tp_as_sequence = &buffer_seq,
};
