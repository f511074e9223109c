/* shmem._rmafast: the blocking put to a rank off this node, out of Python.
 *
 * SHMEMBuffer.put to a rank reached through MPI RMA is MPI_Put + MPI_Win_flush on the host
 * heap's window. Through mpi4py that costs about 0.3 us of Python per call on top of MPI's
 * own work (parsing the buffer and the target, two method calls), and the argument checks
 * the README promises cost as much again: more than the transfer itself for small puts.
 * Here the same checks and the two MPI calls run in C; anything the checks do not accept
 * (another dtype or layout, a rank not reached through the window, an odd offset) returns
 * False, and SHMEMBuffer.put takes its general path, which raises the errors.
 *
 * No MPI header is needed: shmem.backends.rma_accel finds MPI_Put and MPI_Win_flush in the
 * libmpi mpi4py loaded and passes their addresses and the handle width of its ABI (4 bytes:
 * MPICH and its derivatives; 8: Open MPI and the MPI 5 standard ABI) to bind(). The GIL is
 * released around the MPI calls, as mpi4py does (a put waits for an idle target's progress).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <limits.h>
#include <stdint.h>

typedef int (*put32_fn)(const void *, int, int32_t, int, intptr_t, int, int32_t, int32_t);
typedef int (*flush32_fn)(int, int32_t);
typedef int (*put64_fn)(const void *, int, intptr_t, int, intptr_t, int, intptr_t, intptr_t);
typedef int (*flush64_fn)(int, intptr_t);

static void *put_addr;   /* MPI_Put */
static void *flush_addr; /* MPI_Win_flush */
static int handle_bytes; /* 4 or 8 */
static intptr_t byte_type; /* MPI_BYTE's handle */
static PyObject *ndarray_type; /* numpy.ndarray */
static PyObject *mpi_exception; /* mpi4py.MPI.Exception */
static PyObject *str_dtype;

static int call_put(const void *buf, int count, int rank, intptr_t disp, intptr_t win) {
    int rc;
    if (handle_bytes == 4) {
        rc = ((put32_fn)put_addr)(buf, count, (int32_t)byte_type, rank, disp, count,
                                  (int32_t)byte_type, (int32_t)win);
        if (rc == 0)
            rc = ((flush32_fn)flush_addr)(rank, (int32_t)win);
    } else {
        rc = ((put64_fn)put_addr)(buf, count, byte_type, rank, disp, count, byte_type, win);
        if (rc == 0)
            rc = ((flush64_fn)flush_addr)(rank, win);
    }
    return rc;
}

/* -- Putter: one SHMEMBuffer's puts through one window ----------------------------------- */

typedef struct {
    PyObject_HEAD
    intptr_t win;          /* the window's handle */
    Py_ssize_t nbytes;     /* the buffer's size */
    Py_ssize_t itemsize;
    PyObject *dtype;       /* the buffer's numpy dtype (identity is compared) */
    Py_ssize_t nranks;
    Py_ssize_t *disp;      /* per rank: the displacement of the buffer's byte 0, or -1 */
} Putter;

static void Putter_dealloc(Putter *self) {
    Py_XDECREF(self->dtype);
    PyMem_Free(self->disp);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Putter_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"win", "nbytes", "dtype", "nranks", NULL};
    PyObject *win_obj, *dtype;
    Py_ssize_t nbytes, nranks;
    if (put_addr == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "shmem._rmafast.Putter: bind() was not called");
        return NULL;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OnOn", kwlist, &win_obj, &nbytes, &dtype,
                                     &nranks))
        return NULL;
    if (nbytes < 0 || nranks <= 0) {
        PyErr_Format(PyExc_ValueError,
                     "shmem._rmafast.Putter: invalid sizes (got nbytes=%zd, nranks=%zd)",
                     nbytes, nranks);
        return NULL;
    }
    unsigned long long win = PyLong_AsUnsignedLongLongMask(win_obj);
    if (win == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    PyObject *isz = PyObject_GetAttrString(dtype, "itemsize");
    if (isz == NULL)
        return NULL;
    Py_ssize_t itemsize = PyLong_AsSsize_t(isz);
    Py_DECREF(isz);
    if (itemsize <= 0) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "shmem._rmafast.Putter: dtype without items");
        return NULL;
    }
    Putter *self = (Putter *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->disp = PyMem_Malloc(sizeof(Py_ssize_t) * (size_t)nranks);
    if (self->disp == NULL) {
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t r = 0; r < nranks; r++)
        self->disp[r] = -1;
    self->win = (intptr_t)win;
    self->nbytes = nbytes;
    self->itemsize = itemsize;
    self->nranks = nranks;
    Py_INCREF(dtype);
    self->dtype = dtype;
    return (PyObject *)self;
}

static PyObject *Putter_enable(Putter *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "Putter.enable(rank, disp)");
        return NULL;
    }
    Py_ssize_t rank = PyLong_AsSsize_t(args[0]);
    Py_ssize_t disp = PyLong_AsSsize_t(args[1]);
    if (PyErr_Occurred())
        return NULL;
    if (rank < 0 || rank >= self->nranks || disp < 0) {
        PyErr_Format(PyExc_ValueError, "Putter.enable: invalid rank %zd or displacement %zd",
                     rank, disp);
        return NULL;
    }
    self->disp[rank] = disp;
    Py_RETURN_NONE;
}

static PyObject *Putter_clear(Putter *self, PyObject *unused) {
    for (Py_ssize_t r = 0; r < self->nranks; r++)
        self->disp[r] = -1;
    Py_RETURN_NONE;
}

static PyObject *Putter_enabled(Putter *self, PyObject *unused) {
    PyObject *out = PyList_New(0);
    if (out == NULL)
        return NULL;
    for (Py_ssize_t r = 0; r < self->nranks; r++) {
        if (self->disp[r] < 0)
            continue;
        PyObject *v = PyLong_FromSsize_t(r);
        if (v == NULL || PyList_Append(out, v) < 0) {
            Py_XDECREF(v);
            Py_DECREF(out);
            return NULL;
        }
        Py_DECREF(v);
    }
    return out;
}

/* put(rank, src, offset) -> True when done, False when the general path must take it. */
static PyObject *Putter_put(Putter *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "Putter.put(rank, src, offset)");
        return NULL;
    }
    PyObject *rank_obj = args[0], *src = args[1], *off_obj = args[2];
    if (!PyLong_CheckExact(rank_obj) || !PyLong_CheckExact(off_obj) ||
        (PyObject *)Py_TYPE(src) != ndarray_type)
        Py_RETURN_FALSE;
    int overflow;
    long rank = PyLong_AsLongAndOverflow(rank_obj, &overflow);
    if (overflow || rank < 0 || rank >= self->nranks || self->disp[rank] < 0)
        Py_RETURN_FALSE;
    long long offset = PyLong_AsLongLongAndOverflow(off_obj, &overflow);
    if (overflow || offset < 0 || offset > self->nbytes || offset % self->itemsize)
        Py_RETURN_FALSE;
    PyObject *dtype = PyObject_GetAttr(src, str_dtype);
    if (dtype == NULL)
        return NULL;
    Py_DECREF(dtype); /* the array holds it; only its identity matters */
    if (dtype != self->dtype)
        Py_RETURN_FALSE;
    Py_buffer view;
    if (PyObject_GetBuffer(src, &view, PyBUF_C_CONTIGUOUS) < 0) {
        PyErr_Clear(); /* not contiguous: the general path copies it */
        Py_RETURN_FALSE;
    }
    if (view.ndim != 1 || view.len > self->nbytes - offset || view.len > INT_MAX) {
        PyBuffer_Release(&view);
        Py_RETURN_FALSE;
    }
    int rc;
    intptr_t disp = (intptr_t)(self->disp[rank] + offset);
    Py_BEGIN_ALLOW_THREADS
    rc = call_put(view.buf, (int)view.len, (int)rank, disp, self->win);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    if (rc != 0) {
        PyObject *code = PyLong_FromLong(rc);
        if (code != NULL) {
            PyErr_SetObject(mpi_exception, code);
            Py_DECREF(code);
        }
        return NULL;
    }
    Py_RETURN_TRUE;
}

static PyMethodDef Putter_methods[] = {
    {"put", (PyCFunction)(void (*)(void))Putter_put, METH_FASTCALL,
     "put(rank, src, offset) -> bool: MPI_Put + MPI_Win_flush of the numpy array src into "
     "rank's copy at byte offset, when every check passes (True); False leaves it to the "
     "caller's general path."},
    {"enable", (PyCFunction)(void (*)(void))Putter_enable, METH_FASTCALL,
     "enable(rank, disp): rank's copy starts at window displacement disp."},
    {"clear", (PyCFunction)Putter_clear, METH_NOARGS,
     "clear(): forget every rank (the window is about to be freed)."},
    {"enabled", (PyCFunction)Putter_enabled, METH_NOARGS, "enabled() -> ranks enabled."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject PutterType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "shmem._rmafast.Putter",
    .tp_basicsize = sizeof(Putter),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Putter(win, nbytes, dtype, nranks): one buffer's blocking puts through an "
              "MPI window (win: the window's handle, mpi4py.MPI._handleof).",
    .tp_new = Putter_new,
    .tp_dealloc = (destructor)Putter_dealloc,
    .tp_methods = Putter_methods,
};

/* bind(put, flush, handle_bytes, byte_type, ndarray, exception) */
static PyObject *bind(PyObject *module, PyObject *args) {
    unsigned long long put, flush, byte;
    int hb;
    PyObject *nd, *exc;
    if (!PyArg_ParseTuple(args, "KKiKOO", &put, &flush, &hb, &byte, &nd, &exc))
        return NULL;
    if (!put || !flush || (hb != 4 && hb != 8) || !PyType_Check(nd) ||
        !PyExceptionClass_Check(exc)) {
        PyErr_SetString(PyExc_ValueError, "shmem._rmafast.bind: invalid arguments");
        return NULL;
    }
    put_addr = (void *)(uintptr_t)put;
    flush_addr = (void *)(uintptr_t)flush;
    handle_bytes = hb;
    byte_type = (intptr_t)byte;
    Py_INCREF(nd);
    Py_XSETREF(ndarray_type, nd);
    Py_INCREF(exc);
    Py_XSETREF(mpi_exception, exc);
    Py_RETURN_NONE;
}

static PyMethodDef module_methods[] = {
    {"bind", bind, METH_VARARGS,
     "bind(put, flush, handle_bytes, byte_type, ndarray, exception): the addresses of "
     "MPI_Put and MPI_Win_flush, the ABI's handle width, MPI_BYTE's handle, numpy.ndarray "
     "and the exception raised for an MPI error code."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "shmem._rmafast",
    "The blocking put to a rank off the node, out of Python (see shmem.backends.rma_accel).",
    -1, module_methods,
};

PyMODINIT_FUNC PyInit__rmafast(void) {
    if (PyType_Ready(&PutterType) < 0)
        return NULL;
    str_dtype = PyUnicode_InternFromString("dtype");
    if (str_dtype == NULL)
        return NULL;
    PyObject *m = PyModule_Create(&module_def);
    if (m == NULL)
        return NULL;
    Py_INCREF(&PutterType);
    if (PyModule_AddObject(m, "Putter", (PyObject *)&PutterType) < 0) {
        Py_DECREF(&PutterType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
