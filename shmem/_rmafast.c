/* shmem._rmafast: the blocking put and the signal to a rank off this node, out of Python.
 *
 * SHMEMBuffer.put to a rank reached through MPI RMA is MPI_Put + MPI_Win_flush on the host
 * heap's window. Through mpi4py that costs about 0.3 us of Python per call on top of MPI's
 * own work (parsing the buffer and the target, two method calls), and the argument checks
 * the README promises cost as much again: more than the transfer itself for small puts.
 * Here the same checks and the two MPI calls run in C; anything the checks do not accept
 * (another dtype or layout, a rank not reached through the window, an odd offset) returns
 * False, and SHMEMBuffer.put takes its general path, which raises the errors.
 *
 * Signals (SignalPad.signal, "set" or "add" on an int64 slot) are MPI_Win_sync (the release
 * fence) + MPI_Rget_accumulate + MPI_Test: the request completes once the target applied
 * it. When it has not at the first test, a Pending object (owning the request and the
 * origin/result words MPI still uses) goes back to Python, which polls it against the
 * deadline as it polls mpi4py requests (Test, Wait).
 *
 * No MPI header is needed: shmem.backends.rma_accel finds the MPI functions in the libmpi
 * mpi4py loaded and passes their addresses and the handle width of its ABI (4 bytes:
 * MPICH and its derivatives; 8: Open MPI and the MPI 5 standard ABI) to bind(). The GIL is
 * released around the blocking calls (a put waits for an idle target's progress).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <limits.h>
#include <stddef.h>
#include <stdint.h>

/* MPI's functions for either handle width (h: int32_t or intptr_t) */
#define MPI_FNS(h, sfx)                                                                    \
    typedef int (*put##sfx)(const void *, int, h, int, intptr_t, int, h, h);              \
    typedef int (*flush##sfx)(int, h);                                                     \
    typedef int (*sync##sfx)(h);                                                           \
    typedef int (*rgacc##sfx)(const void *, int, h, void *, int, h, int, intptr_t, int, h, \
                              h, h, h *);                                                  \
    typedef int (*test##sfx)(h *, int *, void *);                                          \
    typedef int (*wait##sfx)(h *, void *);
MPI_FNS(int32_t, 32)
MPI_FNS(intptr_t, 64)

static void *put_addr;   /* MPI_Put */
static void *flush_addr; /* MPI_Win_flush */
static void *sync_addr;  /* MPI_Win_sync */
static void *rgacc_addr; /* MPI_Rget_accumulate */
static void *test_addr;  /* MPI_Test */
static void *wait_addr;  /* MPI_Wait */
static int handle_bytes; /* 4 or 8 */
static intptr_t byte_type;  /* MPI_BYTE */
static intptr_t int64_type; /* MPI_INT64_T */
static intptr_t op_replace; /* MPI_REPLACE */
static intptr_t op_sum;     /* MPI_SUM */
static PyObject *ndarray_type;  /* numpy.ndarray */
static PyObject *mpi_exception; /* mpi4py.MPI.Exception */
static PyObject *str_dtype;

/* room for an MPI_Status of any ABI (MPICH 20 bytes, Open MPI 24, the MPI 5 ABI 32) */
typedef struct {
    int64_t words[8];
} status_t;

/* a request handle of either width */
typedef union {
    int32_t h32;
    intptr_t h64;
} request_t;

static PyObject *raise_mpi(int rc) {
    PyObject *code = PyLong_FromLong(rc);
    if (code != NULL) {
        PyErr_SetObject(mpi_exception, code);
        Py_DECREF(code);
    }
    return NULL;
}

static int call_put(const void *buf, int count, int rank, intptr_t disp, intptr_t win) {
    int rc;
    if (handle_bytes == 4) {
        rc = ((put32)put_addr)(buf, count, (int32_t)byte_type, rank, disp, count,
                                  (int32_t)byte_type, (int32_t)win);
        if (rc == 0)
            rc = ((flush32)flush_addr)(rank, (int32_t)win);
    } else {
        rc = ((put64)put_addr)(buf, count, byte_type, rank, disp, count, byte_type, win);
        if (rc == 0)
            rc = ((flush64)flush_addr)(rank, win);
    }
    return rc;
}

/* -- per-rank displacement tables (Putter, Signaller): -1 is a rank not reached ------------ */

static void forget_ranks(Py_ssize_t *disp, Py_ssize_t nranks) {
    for (Py_ssize_t r = 0; r < nranks; r++)
        disp[r] = -1;
}

static PyObject *enabled_ranks(const Py_ssize_t *disp, Py_ssize_t nranks) {
    PyObject *out = PyList_New(0);
    if (out == NULL)
        return NULL;
    for (Py_ssize_t r = 0; r < nranks; r++) {
        if (disp[r] < 0)
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

/* -- Putter: one SHMEMBuffer's puts through one window ----------------------------------- */

typedef struct {
    PyObject_HEAD
    intptr_t win;          /* the window's handle */
    Py_ssize_t nbytes;     /* the buffer's size */
    Py_ssize_t itemsize;
    PyObject *dtype;       /* the buffer's numpy dtype (identity is compared) */
    Py_ssize_t nranks;
    Py_ssize_t *disp;      /* per rank: the displacement of the buffer's byte 0, or -1 */
    PyObject *weakrefs;
} Putter;

static void Putter_dealloc(Putter *self) {
    if (self->weakrefs != NULL)
        PyObject_ClearWeakRefs((PyObject *)self);
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
    forget_ranks(self->disp, nranks);
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
    forget_ranks(self->disp, self->nranks);
    Py_RETURN_NONE;
}

static PyObject *Putter_enabled(Putter *self, PyObject *unused) {
    return enabled_ranks(self->disp, self->nranks);
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
    if (rc != 0)
        return raise_mpi(rc);
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
    .tp_weaklistoffset = offsetof(Putter, weakrefs),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Putter(win, nbytes, dtype, nranks): one buffer's blocking puts through an "
              "MPI window (win: the window's handle, mpi4py.MPI._handleof).",
    .tp_new = Putter_new,
    .tp_dealloc = (destructor)Putter_dealloc,
    .tp_methods = Putter_methods,
};

/* -- Pending: a signal whose request did not complete at once ------------------------- */

typedef struct {
    PyObject_HEAD
    request_t req;
    int done;
    int64_t *words; /* origin and result: MPI's until the request completes */
} Pending;

static void Pending_dealloc(Pending *self) {
    /* a request never completed still owns its words: leave them (16 bytes) to MPI */
    if (self->done)
        PyMem_RawFree(self->words);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Pending_Test(Pending *self, PyObject *unused) {
    if (!self->done) {
        int flag = 0, rc;
        status_t st;
        if (handle_bytes == 4)
            rc = ((test32)test_addr)(&self->req.h32, &flag, &st);
        else
            rc = ((test64)test_addr)(&self->req.h64, &flag, &st);
        if (rc != 0)
            return raise_mpi(rc);
        self->done = flag;
    }
    return PyBool_FromLong(self->done);
}

static PyObject *Pending_Wait(Pending *self, PyObject *unused) {
    if (!self->done) {
        int rc;
        status_t st;
        Py_BEGIN_ALLOW_THREADS
        if (handle_bytes == 4)
            rc = ((wait32)wait_addr)(&self->req.h32, &st);
        else
            rc = ((wait64)wait_addr)(&self->req.h64, &st);
        Py_END_ALLOW_THREADS
        if (rc != 0)
            return raise_mpi(rc);
        self->done = 1;
    }
    Py_RETURN_NONE;
}

static PyMethodDef Pending_methods[] = {
    {"Test", (PyCFunction)Pending_Test, METH_NOARGS, "Test() -> bool: complete (MPI_Test)."},
    {"Wait", (PyCFunction)Pending_Wait, METH_NOARGS, "Wait(): until complete (MPI_Wait)."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject PendingType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "shmem._rmafast.Pending",
    .tp_basicsize = sizeof(Pending),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A signal's request still in flight (Test/Wait as an mpi4py Request).",
    .tp_dealloc = (destructor)Pending_dealloc,
    .tp_methods = Pending_methods,
};

/* -- Signaller: one signal pad's slots on the ranks reached through one window ------------- */

typedef struct {
    PyObject_HEAD
    intptr_t win;
    intptr_t extra; /* a second window to MPI_Win_sync first (0: none) */
    Py_ssize_t slots;
    Py_ssize_t nranks;
    Py_ssize_t *disp; /* per rank: the displacement of slot 0, or -1 */
    /* the next signal's Pending, made before the signal is sent: its words are the
       origin and result; it goes back to the caller only if the request is still in
       flight after the first test (so nothing is allocated once MPI has been called) */
    Pending *spare;
    PyObject *weakrefs;
} Signaller;

static void Signaller_dealloc(Signaller *self) {
    if (self->weakrefs != NULL)
        PyObject_ClearWeakRefs((PyObject *)self);
    PyMem_Free(self->disp);
    Py_XDECREF(self->spare);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* an idle Pending with its own words (done: its dealloc frees them), or NULL (raised) */
static Pending *new_pending(void) {
    Pending *p = PyObject_New(Pending, &PendingType);
    if (p == NULL)
        return NULL;
    p->done = 1;
    p->req.h64 = 0;
    p->words = PyMem_RawMalloc(2 * sizeof(int64_t));
    if (p->words == NULL) {
        Py_DECREF(p);
        PyErr_NoMemory();
        return NULL;
    }
    return p;
}

static PyObject *Signaller_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"win", "disps", "slots", "extra", NULL};
    PyObject *win_obj, *disps, *extra_obj = Py_None;
    Py_ssize_t slots;
    if (rgacc_addr == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "shmem._rmafast.Signaller: bind() was not called");
        return NULL;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOn|O", kwlist, &win_obj, &disps, &slots,
                                     &extra_obj))
        return NULL;
    PyObject *seq = PySequence_Fast(disps, "Signaller: disps must be a sequence");
    if (seq == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (n <= 0 || slots <= 0) {
        Py_DECREF(seq);
        PyErr_SetString(PyExc_ValueError, "shmem._rmafast.Signaller: no ranks or no slots");
        return NULL;
    }
    Signaller *self = (Signaller *)type->tp_alloc(type, 0);
    if (self == NULL) {
        Py_DECREF(seq);
        return NULL;
    }
    self->disp = PyMem_Malloc(sizeof(Py_ssize_t) * (size_t)n);
    if (self->disp == NULL) {
        Py_DECREF(seq);
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t r = 0; r < n; r++) {
        self->disp[r] = PyLong_AsSsize_t(PySequence_Fast_GET_ITEM(seq, r));
        if (self->disp[r] == -1 && PyErr_Occurred()) {
            Py_DECREF(seq);
            Py_DECREF(self);
            return NULL;
        }
        if (self->disp[r] < 0)
            self->disp[r] = -1;
    }
    Py_DECREF(seq);
    self->nranks = n;
    self->slots = slots;
    self->win = (intptr_t)PyLong_AsUnsignedLongLongMask(win_obj);
    self->extra = extra_obj == Py_None ? 0 : (intptr_t)PyLong_AsUnsignedLongLongMask(extra_obj);
    if (PyErr_Occurred()) {
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

static int op_code(PyObject *op) {
    /* 1: set, 2: add, 0: anything else (str subclasses such as StrEnum members count) */
    if (!PyUnicode_Check(op))
        return 0;
    if (PyUnicode_CompareWithASCIIString(op, "set") == 0)
        return 1;
    if (PyUnicode_CompareWithASCIIString(op, "add") == 0)
        return 2;
    return 0;
}

/* signal(rank, slot, value, op) -> True (applied at the target), a Pending (started, not yet
   complete), or False (not for this path: the caller's general path takes it) */
static PyObject *Signaller_signal(Signaller *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "Signaller.signal(rank, slot, value, op)");
        return NULL;
    }
    PyObject *rank_obj = args[0], *slot_obj = args[1], *value_obj = args[2];
    if (!PyLong_CheckExact(rank_obj) || !PyLong_CheckExact(slot_obj) ||
        !PyLong_CheckExact(value_obj))
        Py_RETURN_FALSE;
    int overflow;
    long rank = PyLong_AsLongAndOverflow(rank_obj, &overflow);
    if (overflow || rank < 0 || rank >= self->nranks || self->disp[rank] < 0)
        Py_RETURN_FALSE;
    long slot = PyLong_AsLongAndOverflow(slot_obj, &overflow);
    if (overflow || slot < 0 || slot >= self->slots)
        Py_RETURN_FALSE;
    long long value = PyLong_AsLongLongAndOverflow(value_obj, &overflow);
    if (overflow)
        Py_RETURN_FALSE;
    int code = op_code(args[3]);
    if (code == 0)
        Py_RETURN_FALSE;
    intptr_t op = code == 1 ? op_replace : op_sum;
    intptr_t disp = (intptr_t)(self->disp[rank] + slot * (Py_ssize_t)sizeof(int64_t));
    if (self->spare == NULL && (self->spare = new_pending()) == NULL)
        return NULL; /* MemoryError before anything was sent */
    Pending *p = self->spare;
    int64_t *w = p->words;
    w[0] = value;
    int flag = 0, rc, started = 0;
    status_t st;
    if (handle_bytes == 4) {
        rc = self->extra ? ((sync32)sync_addr)((int32_t)self->extra) : 0;
        if (rc == 0)
            rc = ((sync32)sync_addr)((int32_t)self->win);
        if (rc == 0) {
            rc = ((rgacc32)rgacc_addr)(w, 1, (int32_t)int64_type, w + 1, 1, (int32_t)int64_type,
                                       (int)rank, disp, 1, (int32_t)int64_type, (int32_t)op,
                                       (int32_t)self->win, &p->req.h32);
            started = rc == 0;
        }
        if (rc == 0)
            rc = ((test32)test_addr)(&p->req.h32, &flag, &st);
    } else {
        rc = self->extra ? ((sync64)sync_addr)(self->extra) : 0;
        if (rc == 0)
            rc = ((sync64)sync_addr)(self->win);
        if (rc == 0) {
            rc = ((rgacc64)rgacc_addr)(w, 1, int64_type, w + 1, 1, int64_type, (int)rank, disp,
                                       1, int64_type, op, self->win, &p->req.h64);
            started = rc == 0;
        }
        if (rc == 0)
            rc = ((test64)test_addr)(&p->req.h64, &flag, &st);
    }
    if (flag && rc == 0)
        Py_RETURN_TRUE; /* applied at the target; the spare stays for the next signal */
    if (started) {
        /* in flight (or its test failed): the words are MPI's until the request completes,
           so the Pending leaves this Signaller with them (dropped undone, it leaks them) */
        p->done = 0;
        self->spare = NULL;
        if (rc != 0) {
            Py_DECREF(p);
            return raise_mpi(rc);
        }
        return (PyObject *)p;
    }
    return raise_mpi(rc);
}

static PyObject *Signaller_clear(Signaller *self, PyObject *unused) {
    forget_ranks(self->disp, self->nranks);
    Py_RETURN_NONE;
}

static PyObject *Signaller_enabled(Signaller *self, PyObject *unused) {
    return enabled_ranks(self->disp, self->nranks);
}

static PyMethodDef Signaller_methods[] = {
    {"signal", (PyCFunction)(void (*)(void))Signaller_signal, METH_FASTCALL,
     "signal(rank, slot, value, op) -> True | Pending | False: MPI_Win_sync, then "
     "MPI_Rget_accumulate of the int64 value into rank's slot (op 'set' or 'add') and "
     "MPI_Test; False when the arguments are not for this path."},
    {"clear", (PyCFunction)Signaller_clear, METH_NOARGS,
     "clear(): forget every rank (the window is about to be freed)."},
    {"enabled", (PyCFunction)Signaller_enabled, METH_NOARGS, "enabled() -> ranks enabled."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject SignallerType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "shmem._rmafast.Signaller",
    .tp_basicsize = sizeof(Signaller),
    .tp_weaklistoffset = offsetof(Signaller, weakrefs),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Signaller(win, disps, slots, extra=None): a signal pad's int64 slots on the "
              "ranks reached through an MPI window (disps: per rank, the displacement of "
              "slot 0, or -1; extra: a second window to sync first).",
    .tp_new = Signaller_new,
    .tp_dealloc = (destructor)Signaller_dealloc,
    .tp_methods = Signaller_methods,
};

/* bind(fns, handle_bytes, handles, ndarray, exception) */
static PyObject *bind(PyObject *module, PyObject *args) {
    unsigned long long put, flush, sync, rgacc, test, wait, byte, i64, replace, sum;
    int hb;
    PyObject *nd, *exc;
    if (!PyArg_ParseTuple(args, "(KKKKKK)i(KKKK)OO", &put, &flush, &sync, &rgacc, &test, &wait,
                          &hb, &byte, &i64, &replace, &sum, &nd, &exc))
        return NULL;
    if (!put || !flush || !sync || !rgacc || !test || !wait || (hb != 4 && hb != 8) ||
        !PyType_Check(nd) || !PyExceptionClass_Check(exc)) {
        PyErr_SetString(PyExc_ValueError, "shmem._rmafast.bind: invalid arguments");
        return NULL;
    }
    put_addr = (void *)(uintptr_t)put;
    flush_addr = (void *)(uintptr_t)flush;
    sync_addr = (void *)(uintptr_t)sync;
    rgacc_addr = (void *)(uintptr_t)rgacc;
    test_addr = (void *)(uintptr_t)test;
    wait_addr = (void *)(uintptr_t)wait;
    handle_bytes = hb;
    byte_type = (intptr_t)byte;
    int64_type = (intptr_t)i64;
    op_replace = (intptr_t)replace;
    op_sum = (intptr_t)sum;
    Py_INCREF(nd);
    Py_XSETREF(ndarray_type, nd);
    Py_INCREF(exc);
    Py_XSETREF(mpi_exception, exc);
    Py_RETURN_NONE;
}

static PyMethodDef module_methods[] = {
    {"bind", bind, METH_VARARGS,
     "bind((put, flush, sync, rget_accumulate, test, wait), handle_bytes, (byte, int64, "
     "replace, sum), ndarray, exception): the addresses of MPI_Put, MPI_Win_flush, "
     "MPI_Win_sync, MPI_Rget_accumulate, MPI_Test and MPI_Wait, the ABI's handle width, the "
     "handles of MPI_BYTE, MPI_INT64_T, MPI_REPLACE and MPI_SUM, numpy.ndarray and the "
     "exception raised for an MPI error code."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "shmem._rmafast",
    "The blocking put and the signal to a rank off the node, out of Python "
    "(see shmem.backends.rma_accel).",
    -1, module_methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__rmafast(void) {
    if (PyType_Ready(&PutterType) < 0 || PyType_Ready(&SignallerType) < 0 ||
        PyType_Ready(&PendingType) < 0)
        return NULL;
    str_dtype = PyUnicode_InternFromString("dtype");
    if (str_dtype == NULL)
        return NULL;
    PyObject *m = PyModule_Create(&module_def);
    if (m == NULL)
        return NULL;
    if (PyModule_AddObjectRef(m, "Putter", (PyObject *)&PutterType) < 0 ||
        PyModule_AddObjectRef(m, "Signaller", (PyObject *)&SignallerType) < 0 ||
        PyModule_AddObjectRef(m, "Pending", (PyObject *)&PendingType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
