/*
 * The C extension module dataplane._core: the client library's objects as
 * Python types (docs/design.md, "Python package"). Shared by its files:
 * module.c (errors, module), client.c (Client), values.c (Values, Slice,
 * Buffer), direct.c (Transport, Fetch).
 *
 * Design notes
 * - Every call into the library runs with the GIL released, so other Python
 *   threads run while a put or get moves bytes. The library's client has its
 *   own mutex: calls on one client serialize there.
 * - A Client counts the calls in flight (busy) under its own mutex; close
 *   waits for them to end, then closes the library's client, so close never
 *   races with a call (the library requires that).
 * - Memory handed to Python (Buffer from alloc, Slice of a value) keeps its
 *   owner alive by reference: a Buffer holds its Client, whose library client
 *   is closed only when the last Buffer is gone; a Slice holds its Values.
 * - Fork: the library's objects do not survive fork(). Each object records
 *   the pid that made it; in another process every call raises Closed and
 *   deallocation frees nothing of the library's (it would touch UCX state
 *   that belongs to the parent).
 */
#ifndef DP_PY_H
#define DP_PY_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "dataplane/dataplane.h"

typedef struct DpClient {
    PyObject_HEAD
    dp_client *c;
    pid_t pid;
    pthread_mutex_t mu; /* guards busy, closed, n_bufs */
    pthread_cond_t cv;
    int busy;          /* calls in flight */
    bool closed;       /* close was called: no new calls */
    Py_ssize_t n_bufs; /* live Buffers (alloc): they keep c open */
    PyObject *regs;    /* dict: address -> owner of a registered region */
    uint64_t copied;   /* bytes this binding copied (test hook) */
} DpClient;

/* The bytes of one value or fetched buffer; owner keeps them alive. */
typedef struct DpSlice {
    PyObject_HEAD
    PyObject *owner;
    void *p;
    Py_ssize_t n;
} DpSlice;

extern PyTypeObject DpClient_Type;
extern PyTypeObject DpValues_Type;
extern PyTypeObject DpSlice_Type;
extern PyTypeObject DpBuffer_Type;
extern PyTypeObject DpTransport_Type;
extern PyTypeObject DpFetch_Type;

/* module.c */
extern PyObject *DpError; /* dataplane.Error */
/* Raise the exception class of code with detail's text (or the code's message). */
PyObject *dp__py_raise(int code, const dp_detail *d);
/* Same, with extra attributes (NULL: None): keys, rows, landed. */
PyObject *dp__py_raise_ex(int code, const char *msg, PyObject *keys, PyObject *rows,
                          PyObject *landed);
/* Raise dataplane.Closed saying that obj was made in another process. */
PyObject *dp__py_raise_forked(const char *what, pid_t pid);
/* Keep owner referenced for good (memory a failed transfer may still touch). */
void dp__py_keep_forever(PyObject *owner);
/* A value description's shape as a tuple of ints (NULL, exception set, on failure). */
PyObject *dp__py_shape(const dp_value_desc *ds);
/* Same kind, dtype and shape. */
bool dp__py_same_desc(const dp_value_desc *a, const dp_value_desc *b);
/* Text from the library as str (invalid UTF-8 replaced, never an error). */
PyObject *dp__py_text(const char *s);
/* The exception class for code (borrowed). */
PyObject *dp__py_error_class(int code);

/* client.c */
/* Begin a call on self: false (exception set) when closed or forked. */
bool dp__py_client_enter(DpClient *self);
void dp__py_client_leave(DpClient *self);
/* A Buffer of self ended: close the library's client if close is pending. */
void dp__py_client_buffer_gone(DpClient *self);

/* values.c */
PyObject *dp__py_values_new(dp_values *v, PyObject *client);
PyObject *dp__py_buffer_new(DpClient *client, void *p, size_t n);

/* Rows from a sequence of ints or a 1-D integer buffer; *out is PyMem_Malloc'd. */
int dp__py_rows(PyObject *obj, uint64_t **out, size_t *n);

/* tq.c: the module functions of the TQ adapter's per-key work */
PyObject *dp__py_group_keys(PyObject *m, PyObject *args);
PyObject *dp__py_columns(PyObject *m, PyObject *args);
PyObject *dp__py_same_kind(PyObject *m, PyObject *args);
PyObject *dp__py_rows_of(PyObject *m, PyObject *args);
PyObject *dp__py_field_major(PyObject *m, PyObject *args);
PyObject *dp__py_split_hints(PyObject *m, PyObject *args);
PyObject *dp__py_key_hints(PyObject *m, PyObject *args);

#endif
