/*
 * dataplane._core's helpers for the TransferQueue adapter (dataplane.tq;
 * docs/design.md, "Python package"): the per-key work of a TQ put or get of
 * thousands of keys, done here because a Python loop over the keys costs as
 * much as the transfer itself (about 0.1-0.3 us a key each).
 *
 *   group_keys   "<gidx>@<field>" keys into rows, fields and key slots
 *   columns      the values of each field's slots, row by row
 *   same_kind    whether a column's values are CPU tensors of one type and dtype
 *   rows_of      whether a column's tensors are exactly the rows of one tensor
 *   field_major  whether keys named every cell once, field by field (TQ's order)
 *   split_hints  put's row-major location hints as one list per field
 *   key_hints    the same hints in the order of the keys that named them
 */
#include "dp_py.h"

#include <string.h>

/* gidx of "<gidx>@..." (decimal, no sign, no leading zero, < 2^64); -1 if bad. */
static int
parse_gidx(const char *k, Py_ssize_t n, uint64_t *g, Py_ssize_t *at)
{
    Py_ssize_t i = 0;
    uint64_t v = 0;
    while (i < n && k[i] >= '0' && k[i] <= '9') {
        unsigned d = (unsigned)(k[i] - '0');
        if (v > (UINT64_MAX - d) / 10)
            return -1;
        v = v * 10 + d;
        i++;
    }
    if (i == 0 || i >= n - 1 || k[i] != '@' || (k[0] == '0' && i > 1))
        return -1;
    *g = v;
    *at = i;
    return 0;
}

/* A row or field index in ix (a dict key -> index), added (at the end of
 * list) when new; -1 (exception set) on failure. */
static Py_ssize_t
index_of(PyObject *ix, PyObject *list, PyObject *key)
{
    PyObject *r = PyDict_GetItemWithError(ix, key);
    if (r != NULL)
        return PyLong_AsSsize_t(r);
    if (PyErr_Occurred())
        return -1;
    Py_ssize_t at = PyList_GET_SIZE(list);
    PyObject *pa = PyLong_FromSsize_t(at);
    int bad =
        pa == NULL || PyDict_SetItem(ix, key, pa) < 0 || PyList_Append(list, key) < 0;
    Py_XDECREF(pa);
    return bad ? -1 : at;
}

/*
 * group_keys(keys, repeats=False) -> (rows, fields, slots): keys
 * "<gidx>@<field>" as TQ hands them; rows and fields in order of first
 * appearance; slots the bytes of len(fields) x len(rows) native Py_ssize_t,
 * slots[f * len(rows) + r] the index in keys of row r's key of field f, or
 * -1 (see slot_array). ValueError names a malformed key (InvalidArgument,
 * with the library's reason), or a repeated one unless repeats (then the
 * first stands).
 *
 * TQ's keys come field by field (or row by row), so each key's row and field
 * are first guessed from the previous key's (the same, the next, or the
 * first) and compared in C. A row not guessed is new without a lookup while
 * the rows seen so far ascend and it is above them all (TQ's first field);
 * only otherwise is a dict of the rows built (once) and asked.
 */
PyObject *
dp__py_group_keys(PyObject *m, PyObject *args)
{
    (void)m;
    PyObject *arg;
    int repeats = 0;
    if (!PyArg_ParseTuple(args, "O|p", &arg, &repeats))
        return NULL;
    PyObject *seq = PySequence_Tuple(arg);
    if (seq == NULL)
        return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(seq);
    size_t cap = (size_t)(n > 0 ? n : 1);
    PyObject *rows = PyList_New(0), *fields = PyList_New(0);
    PyObject *row_ix = NULL, *field_ix = PyDict_New();
    Py_ssize_t *key_row = PyMem_Malloc(cap * sizeof *key_row);
    Py_ssize_t *key_field = PyMem_Malloc(cap * sizeof *key_field);
    uint64_t *row_g = PyMem_Malloc(cap * sizeof *row_g); /* gidx of each row */
    PyObject *slots = NULL, *ret = NULL;
    if (rows == NULL || fields == NULL || field_ix == NULL || key_row == NULL ||
        key_field == NULL || row_g == NULL)
        goto out;
    Py_ssize_t last_r = -1, last_f = -1;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *key = PyTuple_GET_ITEM(seq, i);
        Py_ssize_t len, at;
        uint64_t g;
        const char *k = PyUnicode_Check(key) ? PyUnicode_AsUTF8AndSize(key, &len) : NULL;
        if (k == NULL || parse_gidx(k, len, &g, &at) < 0) {
            PyErr_Clear();
            PyErr_Format(PyExc_ValueError,
                         "key %R: '<global_index>@<field>' is needed, the index in "
                         "decimal without sign or leading zeros",
                         key);
            goto out;
        }
        const char *fk = k + at + 1;
        Py_ssize_t fl = len - at - 1, nr = PyList_GET_SIZE(rows);
        Py_ssize_t nf = PyList_GET_SIZE(fields), r = -1, f = -1;
        Py_ssize_t guess_r[3] = {last_r, last_r + 1, 0},
                   guess_f[3] = {last_f, last_f + 1, 0};
        for (int t = 0; t < 3 && r < 0; t++)
            if (guess_r[t] >= 0 && guess_r[t] < nr && row_g[guess_r[t]] == g)
                r = guess_r[t];
        for (int t = 0; t < 3 && f < 0; t++) {
            if (guess_f[t] < 0 || guess_f[t] >= nf)
                continue;
            Py_ssize_t gl;
            const char *gk =
                PyUnicode_AsUTF8AndSize(PyList_GET_ITEM(fields, guess_f[t]), &gl);
            if (gk != NULL && gl == fl && memcmp(gk, fk, (size_t)fl) == 0)
                f = guess_f[t];
        }
        if (r < 0 && row_ix == NULL && (nr == 0 || g > row_g[nr - 1])) {
            /* Above every row so far, which ascend: a new one. */
            PyObject *pg = PyLong_FromUnsignedLongLong(g);
            if (pg == NULL || PyList_Append(rows, pg) < 0) {
                Py_XDECREF(pg);
                goto out;
            }
            Py_DECREF(pg);
            r = nr;
        } else if (r < 0) {
            if (row_ix == NULL) { /* the rows stopped ascending: a dict of them */
                if ((row_ix = PyDict_New()) == NULL)
                    goto out;
                for (Py_ssize_t j = 0; j < nr; j++) {
                    PyObject *pj = PyLong_FromSsize_t(j);
                    int bad = pj == NULL ||
                              PyDict_SetItem(row_ix, PyList_GET_ITEM(rows, j), pj) < 0;
                    Py_XDECREF(pj);
                    if (bad)
                        goto out;
                }
            }
            PyObject *pg = PyLong_FromUnsignedLongLong(g);
            r = pg != NULL ? index_of(row_ix, rows, pg) : -1;
            Py_XDECREF(pg);
            if (r < 0)
                goto out;
        }
        row_g[r] = g;
        if (f < 0) {
            /* A field first seen: the library's rules (clear sends no keys) */
            dp_detail kd;
            dp_detail_clear(&kd);
            if (dp_key_check(k, (size_t)len, NULL, &kd) != DP_OK) {
                dp__py_raise(DP_EINVAL, &kd);
                goto out;
            }
            PyObject *pf = PyUnicode_FromStringAndSize(fk, fl);
            f = pf != NULL ? index_of(field_ix, fields, pf) : -1;
            Py_XDECREF(pf);
            if (f < 0)
                goto out;
        }
        key_row[i] = last_r = r;
        key_field[i] = last_f = f;
    }
    Py_ssize_t nr = PyList_GET_SIZE(rows), nf = PyList_GET_SIZE(fields);
    slots = PyBytes_FromStringAndSize(NULL, nr * nf * (Py_ssize_t)sizeof(Py_ssize_t));
    if (slots == NULL)
        goto out;
    Py_ssize_t *sl = (Py_ssize_t *)(void *)PyBytes_AS_STRING(slots);
    for (Py_ssize_t j = 0; j < nr * nf; j++)
        sl[j] = -1;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t *cell = &sl[key_field[i] * nr + key_row[i]];
        if (*cell != -1) {
            if (repeats)
                continue; /* the first one stands */
            PyErr_Format(PyExc_ValueError, "put: key %R appears twice",
                         PyTuple_GET_ITEM(seq, i));
            goto out;
        }
        *cell = i;
    }
    ret = PyTuple_Pack(3, rows, fields, slots);
out:
    Py_XDECREF(slots);
    Py_XDECREF(rows);
    Py_XDECREF(fields);
    Py_XDECREF(row_ix);
    Py_XDECREF(field_ix);
    PyMem_Free(key_row);
    PyMem_Free(key_field);
    PyMem_Free(row_g);
    Py_DECREF(seq);
    return ret;
}

/*
 * slots (group_keys' bytes) for n_rows rows as *nf fields of key indexes
 * (*a, borrowed from slots), or -1 (exception set) when it is not that.
 */
static int
slot_array(PyObject *slots, Py_ssize_t n_rows, Py_ssize_t *nf, const Py_ssize_t **a)
{
    Py_ssize_t row = n_rows * (Py_ssize_t)sizeof(Py_ssize_t);
    if (!PyBytes_Check(slots) || n_rows < 0 ||
        (n_rows > PY_SSIZE_T_MAX / (Py_ssize_t)sizeof(Py_ssize_t)) ||
        (row > 0 ? PyBytes_GET_SIZE(slots) % row != 0 : PyBytes_GET_SIZE(slots) != 0)) {
        PyErr_Format(PyExc_ValueError,
                     "slots: group_keys' bytes of key indexes for %zd rows are needed",
                     n_rows);
        return -1;
    }
    *nf = row > 0 ? PyBytes_GET_SIZE(slots) / row : 0;
    *a = (const Py_ssize_t *)(const void *)PyBytes_AS_STRING(slots);
    return 0;
}

/* ValueError for a key index i of cell (f, r) outside [-1, n); returns NULL. */
static PyObject *
bad_slot(Py_ssize_t f, Py_ssize_t r, Py_ssize_t n)
{
    return PyErr_Format(PyExc_ValueError,
                        "slots[%zd][%zd]: a key index in [-1, %zd) is needed", f, r, n);
}

/*
 * columns(values, slots, n_rows, fill) -> one list per field of slots:
 * [values[i] for each row's key index i], fill where i is -1 (a cell no key
 * named).
 */
PyObject *
dp__py_columns(PyObject *m, PyObject *args)
{
    (void)m;
    PyObject *values, *slots, *fill;
    Py_ssize_t nr, nf;
    const Py_ssize_t *sl;
    if (!PyArg_ParseTuple(args, "O!OnO", &PyList_Type, &values, &slots, &nr, &fill) ||
        slot_array(slots, nr, &nf, &sl) < 0)
        return NULL;
    Py_ssize_t nv = PyList_GET_SIZE(values);
    PyObject *out = PyList_New(nf);
    for (Py_ssize_t f = 0; out != NULL && f < nf; f++) {
        PyObject *col = PyList_New(nr);
        if (col == NULL) {
            Py_CLEAR(out);
            break;
        }
        PyList_SET_ITEM(out, f, col);
        for (Py_ssize_t r = 0; r < nr; r++) {
            Py_ssize_t i = sl[f * nr + r];
            if (i < -1 || i >= nv) {
                Py_CLEAR(out);
                return bad_slot(f, r, nv);
            }
            PyObject *v = i >= 0 ? PyList_GET_ITEM(values, i) : fill;
            Py_INCREF(v);
            PyList_SET_ITEM(col, r, v);
        }
    }
    return out;
}

/* Interned attribute names of torch tensors rows_of asks for. */
static PyObject *s_data_ptr, *s_dtype, *s_shape, *s_is_contiguous, *s_is_neg, *s_is_conj,
    *s_is_cpu;

static int
intern_names(void)
{
    if (s_is_conj != NULL)
        return 0;
    s_data_ptr = PyUnicode_InternFromString("data_ptr");
    s_dtype = PyUnicode_InternFromString("dtype");
    s_shape = PyUnicode_InternFromString("shape");
    s_is_contiguous = PyUnicode_InternFromString("is_contiguous");
    s_is_neg = PyUnicode_InternFromString("is_neg");
    s_is_cpu = PyUnicode_InternFromString("is_cpu");
    s_is_conj = PyUnicode_InternFromString("is_conj");
    return s_data_ptr && s_dtype && s_shape && s_is_contiguous && s_is_neg && s_is_cpu &&
                   s_is_conj
               ? 0
               : -1;
}

/* v.name() (a method without arguments); new reference or NULL. */
static PyObject *
call0(PyObject *v, PyObject *name)
{
    return PyObject_VectorcallMethod(name, &v, 1 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
}

/* 1 if obj equals want, 0 if not, -1 on error (obj NULL); consumes obj. */
static int
same(PyObject *obj, PyObject *want)
{
    if (obj == NULL)
        return -1;
    int eq = obj == want ? 1 : PyObject_RichCompareBool(obj, want, Py_EQ);
    Py_DECREF(obj);
    return eq;
}

/* 1 if v.name() is want (True or False), 0 if not, -1 on error. */
static int
answers(PyObject *v, PyObject *name, PyObject *want)
{
    PyObject *r = call0(v, name);
    if (r == NULL)
        return -1;
    int eq = r == want;
    Py_DECREF(r);
    return eq;
}

/*
 * True if every col[i] is of exactly that type and check(v, i, ctx) says 1;
 * False at the first that is not or says 0; NULL when a check says -1
 * (exception set).
 */
static PyObject *
every_value(PyObject *col, PyObject *type, int (*check)(PyObject *, Py_ssize_t, void *),
            void *ctx)
{
    if (intern_names() < 0)
        return NULL;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(col); i++) {
        PyObject *v = PyList_GET_ITEM(col, i);
        int ok = (PyObject *)Py_TYPE(v) == type ? check(v, i, ctx) : 0;
        if (ok < 0)
            return NULL;
        if (ok == 0)
            Py_RETURN_FALSE;
    }
    Py_RETURN_TRUE;
}

/* same_kind's check of one value: ctx is the dtype. */
static int
kind_check(PyObject *v, Py_ssize_t i, void *ctx)
{
    (void)i;
    int ok = same(PyObject_GetAttr(v, s_dtype), ctx);
    return ok > 0 ? same(PyObject_GetAttr(v, s_is_cpu), Py_True) : ok;
}

/*
 * same_kind(col, type, dtype) -> bool: whether every col[i] is a tensor of
 * exactly that type and dtype, in CPU memory (two attribute reads a value).
 */
PyObject *
dp__py_same_kind(PyObject *m, PyObject *args)
{
    (void)m;
    PyObject *col, *type, *dtype;
    if (!PyArg_ParseTuple(args, "O!OO", &PyList_Type, &col, &type, &dtype))
        return NULL;
    return every_value(col, type, kind_check, dtype);
}

/* What rows_of checks each value against. */
typedef struct rows_spec {
    unsigned long long ptr, row_bytes;
    PyObject *shape, *dtype;
    int is_complex;
} rows_spec;

/* rows_of's check of value i. */
static int
row_check(PyObject *v, Py_ssize_t i, void *ctx)
{
    const rows_spec *rs = ctx;
    PyObject *p = call0(v, s_data_ptr);
    if (p == NULL)
        return -1;
    unsigned long long at = PyLong_AsUnsignedLongLong(p);
    Py_DECREF(p);
    if (at == (unsigned long long)-1 && PyErr_Occurred())
        return -1;
    if (at != rs->ptr + (unsigned long long)i * rs->row_bytes)
        return 0;
    int ok = same(PyObject_GetAttr(v, s_dtype), rs->dtype);
    if (ok > 0)
        ok = same(PyObject_GetAttr(v, s_shape), rs->shape);
    if (ok > 0)
        ok = answers(v, s_is_contiguous, Py_True);
    if (ok > 0)
        ok = answers(v, s_is_neg, Py_False);
    if (ok > 0 && rs->is_complex)
        ok = answers(v, s_is_conj, Py_False);
    return ok;
}

/*
 * rows_of(col, type, ptr, row_bytes, shape, dtype, is_complex) -> bool:
 * whether every col[i] is a tensor of exactly that type whose data pointer
 * is ptr + i * row_bytes, with that dtype and shape, contiguous, and neither
 * lazily negated nor (is_complex) conjugated. The caller has checked that
 * these describe the rows of one contiguous tensor: then each value's bytes
 * are that row's, and the tensor can be stored in their place. Five torch
 * reads a value (0.26-0.34 us in all, torch's own cost), the fewest that
 * prove it: a view of the same bytes may differ in any of them.
 */
PyObject *
dp__py_rows_of(PyObject *m, PyObject *args)
{
    (void)m;
    PyObject *col, *type;
    rows_spec rs;
    if (!PyArg_ParseTuple(args, "O!OKKOOp", &PyList_Type, &col, &type, &rs.ptr,
                          &rs.row_bytes, &rs.shape, &rs.dtype, &rs.is_complex))
        return NULL;
    return every_value(col, type, row_check, &rs);
}

/*
 * field_major(slots, n_rows) -> bool: whether every cell's key index is
 * f * n_rows + r, i.e. the keys named every cell exactly once, field by
 * field and rows in order: the order in which TQ's KV storage manager makes
 * its keys and values (so value i is row i % n_rows of field i // n_rows).
 */
PyObject *
dp__py_field_major(PyObject *m, PyObject *args)
{
    (void)m;
    PyObject *slots;
    Py_ssize_t nr, nf;
    const Py_ssize_t *sl;
    if (!PyArg_ParseTuple(args, "On", &slots, &nr) || slot_array(slots, nr, &nf, &sl) < 0)
        return NULL;
    for (Py_ssize_t j = 0; j < nf * nr; j++)
        if (sl[j] != j)
            Py_RETURN_FALSE;
    Py_RETURN_TRUE;
}

/* locs as a buffer of n_rows * n_fields dp_loc records; -1 (exception set) if not. */
static int
loc_view(PyObject *locs, Py_ssize_t n_rows, Py_ssize_t n_fields, Py_buffer *b)
{
    if (PyObject_GetBuffer(locs, b, PyBUF_SIMPLE) < 0)
        return -1;
    size_t cells = (size_t)(n_rows > 0 ? n_rows : 0);
    if (n_rows < 0 || n_fields < 0 ||
        (n_fields > 0 && cells > SIZE_MAX / sizeof(dp_loc) / (size_t)n_fields) ||
        (size_t)b->len != cells * (size_t)n_fields * sizeof(dp_loc)) {
        PyErr_Format(PyExc_ValueError, "locs: %zd bytes for %zd x %zd hints of %zu bytes",
                     b->len, n_rows, n_fields, sizeof(dp_loc));
        PyBuffer_Release(b);
        return -1;
    }
    return 0;
}

/* The hint of cell (r, f) as bytes, or None for a skipped cell; new reference. */
static PyObject *
hint_at(const Py_buffer *b, Py_ssize_t n_fields, Py_ssize_t r, Py_ssize_t f)
{
    const char *loc = (const char *)b->buf +
                      ((size_t)r * (size_t)n_fields + (size_t)f) * sizeof(dp_loc);
    if (loc[0] == '\0') /* blob "": the cell was skipped */
        Py_RETURN_NONE;
    return PyBytes_FromStringAndSize(loc, sizeof(dp_loc));
}

/*
 * split_hints(locs, n_rows, n_fields) -> out: out[f][r] row r's hint of field
 * f (bytes, or None where the cell was skipped) from put's row-major hints.
 */
PyObject *
dp__py_split_hints(PyObject *m, PyObject *args)
{
    (void)m;
    PyObject *locs;
    Py_ssize_t nr, nf;
    Py_buffer b;
    if (!PyArg_ParseTuple(args, "Onn", &locs, &nr, &nf) || loc_view(locs, nr, nf, &b) < 0)
        return NULL;
    PyObject *out = PyList_New(nf);
    for (Py_ssize_t f = 0; out != NULL && f < nf; f++) {
        PyObject *col = PyList_New(nr);
        if (col == NULL) {
            Py_CLEAR(out);
            break;
        }
        PyList_SET_ITEM(out, f, col);
        for (Py_ssize_t r = 0; r < nr; r++) {
            PyObject *h = hint_at(&b, nf, r, f);
            if (h == NULL) {
                Py_CLEAR(out);
                break;
            }
            PyList_SET_ITEM(col, r, h);
        }
    }
    PyBuffer_Release(&b);
    return out;
}

/*
 * key_hints(locs, slots, n_rows, n_keys) -> out: out[i] the hint of cell
 * (r, f) of put's row-major hints for the key i that group_keys put in that
 * cell (slots); None for a key no cell names.
 */
PyObject *
dp__py_key_hints(PyObject *m, PyObject *args)
{
    (void)m;
    PyObject *locs, *slots;
    Py_ssize_t nr, nf, n_keys;
    const Py_ssize_t *sl;
    if (!PyArg_ParseTuple(args, "OOnn", &locs, &slots, &nr, &n_keys) ||
        slot_array(slots, nr, &nf, &sl) < 0)
        return NULL;
    Py_buffer b;
    if (n_keys < 0 || loc_view(locs, nr, nf, &b) < 0) {
        if (n_keys < 0)
            PyErr_SetString(PyExc_ValueError, "n_keys: >= 0 is needed");
        return NULL;
    }
    PyObject *out = PyList_New(n_keys);
    for (Py_ssize_t i = 0; out != NULL && i < n_keys; i++)
        PyList_SET_ITEM(out, i, Py_NewRef(Py_None));
    for (Py_ssize_t f = 0; out != NULL && f < nf; f++) {
        for (Py_ssize_t r = 0; r < nr; r++) {
            Py_ssize_t i = sl[f * nr + r];
            if (i == -1)
                continue; /* no key names this cell */
            PyObject *h =
                i >= 0 && i < n_keys ? hint_at(&b, nf, r, f) : bad_slot(f, r, n_keys);
            if (h == NULL) {
                Py_CLEAR(out);
                break;
            }
            Py_SETREF(PyList_GET_ITEM(out, i), h);
        }
    }
    PyBuffer_Release(&b);
    return out;
}
