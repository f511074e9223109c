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
 * deadline as it polls mpi4py requests (Test, Wait). To a rank whose memory MPI shares with
 * this process (nodes simulated on one machine: the Signaller's ``shm`` ranks) a signal is
 * MPI_Fetch_and_op + MPI_Win_flush instead, complete on return: MPICH 5.0.2 leaks 128 bytes
 * per MPI_Rget_accumulate to Win_allocate memory it reaches through shared memory.
 *
 * No MPI header is needed: shmem.backends.rma_accel finds the MPI functions in the libmpi
 * mpi4py loaded and passes their addresses and the handle width of its ABI (4 bytes:
 * MPICH and its derivatives; 8: Open MPI and the MPI 5 standard ABI) to bind(). The GIL is
 * released around the blocking calls (a put waits for an idle target's progress).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <limits.h>
#include <stddef.h>
#include <stdint.h>
#include <sched.h>

/* MPI's functions for either handle width (h: int32_t or intptr_t) */
#define MPI_FNS(h, sfx)                                                                    \
    typedef int (*put##sfx)(const void *, int, h, int, intptr_t, int, h, h);              \
    typedef int (*flush##sfx)(int, h);                                                     \
    typedef int (*sync##sfx)(h);                                                           \
    typedef int (*rgacc##sfx)(const void *, int, h, void *, int, h, int, intptr_t, int, h, \
                              h, h, h *);                                                  \
    typedef int (*test##sfx)(h *, int *, void *);                                          \
    typedef int (*wait##sfx)(h *, void *);                                                \
    typedef int (*iprobe##sfx)(int, int, h, int *, void *);                                \
    typedef int (*fop##sfx)(const void *, void *, h, int, intptr_t, h, h);               \
    typedef int (*startall##sfx)(int, h *);
MPI_FNS(int32_t, 32)
MPI_FNS(intptr_t, 64)

static void *put_addr;   /* MPI_Put */
static void *flush_addr; /* MPI_Win_flush */
static void *sync_addr;  /* MPI_Win_sync */
static void *rgacc_addr; /* MPI_Rget_accumulate */
static void *test_addr;  /* MPI_Test */
static void *wait_addr;  /* MPI_Wait */
static void *iprobe_addr; /* MPI_Iprobe */
static void *fop_addr;    /* MPI_Fetch_and_op */
static void *startall_addr; /* MPI_Startall */
static int any_source, any_tag; /* MPI_ANY_SOURCE, MPI_ANY_TAG */
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

static int inflight_done(void); /* (the signals' section, below) */

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
    int idle = inflight_done(); /* a signal still in flight: the general path completes it */
    if (idle <= 0)
        return idle < 0 ? NULL : Py_NewRef(Py_False);
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
    int rank;       /* the target */
    int64_t *words; /* origin and result: MPI's until the request completes */
} Pending;

/* The signal this process sent last, while it may still be in flight: a signal returns once
   MPI has started it (OpenSHMEM's local completion), and is applied at its target by the
   time this process starts its next operation on the heap (a signal, a put: each completes
   it first, see pending()). One at a time, for the whole process, so signals stay ordered
   among themselves and with puts as when each waited for its own completion. */
static Pending *inflight;

static int test_request(Pending *p) {
    /* 0: tested (p->done says whether complete); else MPI's error code */
    if (p->done)
        return 0;
    int flag = 0, rc;
    status_t st;
    if (handle_bytes == 4)
        rc = ((test32)test_addr)(&p->req.h32, &flag, &st);
    else
        rc = ((test64)test_addr)(&p->req.h64, &flag, &st);
    if (rc == 0)
        p->done = flag;
    return rc;
}

/* 1: nothing in flight any more; 0: the signal in flight has not completed yet; -1: raised */
static int inflight_done(void) {
    if (inflight == NULL)
        return 1;
    int rc = test_request(inflight);
    if (rc != 0) {
        raise_mpi(rc);
        return -1;
    }
    if (!inflight->done)
        return 0;
    Py_CLEAR(inflight);
    return 1;
}

static void Pending_dealloc(Pending *self) {
    /* a request never completed still owns its words: leave them (16 bytes) to MPI */
    if (self->done)
        PyMem_RawFree(self->words);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Pending_Test(Pending *self, PyObject *unused) {
    int rc = test_request(self);
    if (rc != 0)
        return raise_mpi(rc);
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

static PyMemberDef Pending_members[] = {
    {"rank", T_INT, offsetof(Pending, rank), READONLY, "the signal's target rank"},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject PendingType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "shmem._rmafast.Pending",
    .tp_basicsize = sizeof(Pending),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A signal's request still in flight (Test/Wait as an mpi4py Request).",
    .tp_dealloc = (destructor)Pending_dealloc,
    .tp_methods = Pending_methods,
    .tp_members = Pending_members,
};

/* -- Signaller: one signal pad's slots on the ranks reached through one window ------------- */

typedef struct {
    PyObject_HEAD
    intptr_t win;
    intptr_t extra; /* a second window to MPI_Win_sync first (0: none) */
    Py_ssize_t slots;
    Py_ssize_t nranks;
    Py_ssize_t *disp; /* per rank: the displacement of slot 0, or -1 */
    char *shm;        /* per rank: its memory is shared with this process (see the top) */
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
    PyMem_Free(self->shm);
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
    static char *kwlist[] = {"win", "disps", "slots", "extra", "shm", NULL};
    PyObject *win_obj, *disps, *extra_obj = Py_None, *shm_obj = Py_None;
    Py_ssize_t slots;
    if (rgacc_addr == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "shmem._rmafast.Signaller: bind() was not called");
        return NULL;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOn|OO", kwlist, &win_obj, &disps, &slots,
                                     &extra_obj, &shm_obj))
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
    self->shm = PyMem_Calloc((size_t)n, 1);
    if (self->disp == NULL || self->shm == NULL) {
        Py_DECREF(seq);
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    if (shm_obj != Py_None) { /* an iterable of ranks */
        PyObject *it = PyObject_GetIter(shm_obj), *item;
        if (it == NULL) {
            Py_DECREF(seq);
            Py_DECREF(self);
            return NULL;
        }
        while ((item = PyIter_Next(it)) != NULL) {
            Py_ssize_t r = PyLong_AsSsize_t(item);
            Py_DECREF(item);
            if (r >= 0 && r < n)
                self->shm[r] = 1;
        }
        Py_DECREF(it);
        if (PyErr_Occurred()) {
            Py_DECREF(seq);
            Py_DECREF(self);
            return NULL;
        }
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

static PyObject *send_signal(Signaller *self, long rank, long slot, long long value, int code);

/* signal(rank, slot, value, op) -> True (sent: applied at the target, or in flight, see
   inflight), False (not for this path: the caller's general path takes it), or the Pending of
   the signal before, still in flight: nothing was sent, the caller completes that one (its
   deadline) and calls again */
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
    return send_signal(self, rank, slot, value, code);
}

/* the signal, its arguments checked (code: 1 set, 2 add): True, or the Pending of the signal
   before (nothing sent), or NULL (raised) */
static PyObject *send_signal(Signaller *self, long rank, long slot, long long value, int code) {
    intptr_t op = code == 1 ? op_replace : op_sum;
    intptr_t disp = (intptr_t)(self->disp[rank] + slot * (Py_ssize_t)sizeof(int64_t));
    int idle = inflight_done();
    if (idle <= 0)
        return idle < 0 ? NULL : Py_NewRef((PyObject *)inflight);
    if (self->spare == NULL && (self->spare = new_pending()) == NULL)
        return NULL; /* MemoryError before anything was sent */
    Pending *p = self->spare;
    int64_t *w = p->words;
    w[0] = value;
    int flag = 0, rc, started = 0;
    status_t st;
    if (self->shm[rank]) { /* complete on return, no request (see the top) */
        if (handle_bytes == 4) {
            rc = self->extra ? ((sync32)sync_addr)((int32_t)self->extra) : 0;
            if (rc == 0)
                rc = ((sync32)sync_addr)((int32_t)self->win);
            if (rc == 0)
                rc = ((fop32)fop_addr)(w, w + 1, (int32_t)int64_type, (int)rank, disp,
                                       (int32_t)op, (int32_t)self->win);
            if (rc == 0)
                rc = ((flush32)flush_addr)((int)rank, (int32_t)self->win);
        } else {
            rc = self->extra ? ((sync64)sync_addr)(self->extra) : 0;
            if (rc == 0)
                rc = ((sync64)sync_addr)(self->win);
            if (rc == 0)
                rc = ((fop64)fop_addr)(w, w + 1, int64_type, (int)rank, disp, op, self->win);
            if (rc == 0)
                rc = ((flush64)flush_addr)((int)rank, self->win);
        }
        if (rc != 0)
            return raise_mpi(rc);
        Py_RETURN_TRUE;
    }
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
        p->rank = (int)rank;
        self->spare = NULL;
        inflight = p;
        if (rc != 0)
            return raise_mpi(rc); /* inflight keeps it: the next operation tests it again */
        Py_RETURN_TRUE;
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
    .tp_doc = "Signaller(win, disps, slots, extra=None, shm=None): a signal pad's int64 slots "
              "on the ranks reached through an MPI window (disps: per rank, the displacement "
              "of slot 0, or -1; extra: a second window to sync first; shm: the ranks whose "
              "memory MPI shares with this process, signalled with MPI_Fetch_and_op + "
              "MPI_Win_flush).",
    .tp_new = Signaller_new,
    .tp_dealloc = (destructor)Signaller_dealloc,
    .tp_methods = Signaller_methods,
};

/* -- Barrier: a signal pad's dissemination barrier, its rounds out of Python ------------- */

typedef struct {
    uint64_t *peer;          /* the round's word on a node-local peer (mapped here), or NULL */
    long rank;               /* the round's destination (off the node: the Signaller's) */
    long slot;               /* the round's slot in the Signaller */
    const uint64_t *mine;    /* the round's word here */
} Round;

typedef struct {
    PyObject_HEAD
    Py_ssize_t nrounds;  /* 0 once cleared */
    Round *rounds;
    Signaller *signaller; /* NULL: every round is on the node */
    intptr_t comm;        /* MPI_Iprobe on it between loads (0: none) */
    PyObject *weakrefs;
} Barrier;

static void Barrier_dealloc(Barrier *self) {
    if (self->weakrefs != NULL)
        PyObject_ClearWeakRefs((PyObject *)self);
    PyMem_Free(self->rounds);
    Py_XDECREF(self->signaller);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyTypeObject SignallerType;

static PyObject *Barrier_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"rounds", "signaller", "comm", NULL};
    PyObject *rounds, *sig = Py_None;
    unsigned long long comm = 0;
    if (sync_addr == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "shmem._rmafast.Barrier: bind() was not called");
        return NULL;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O|OK", kwlist, &rounds, &sig, &comm))
        return NULL;
    if (sig != Py_None && !PyObject_TypeCheck(sig, &SignallerType)) {
        PyErr_SetString(PyExc_TypeError, "Barrier: signaller must be a Signaller or None");
        return NULL;
    }
    PyObject *seq = PySequence_Fast(rounds, "Barrier: rounds must be a sequence");
    if (seq == NULL)
        return NULL;
    Barrier *self = (Barrier *)type->tp_alloc(type, 0);
    if (self == NULL) {
        Py_DECREF(seq);
        return NULL;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    self->rounds = PyMem_Calloc((size_t)(n ? n : 1), sizeof(Round));
    if (self->rounds == NULL) {
        Py_DECREF(seq);
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t k = 0; k < n; k++) {
        unsigned long long peer, mine;
        long rank, slot;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, k), "KllK", &peer, &rank, &slot,
                              &mine)) {
            Py_DECREF(seq);
            Py_DECREF(self);
            return NULL;
        }
        if (mine == 0 || mine % 8 || peer % 8 || (peer == 0 && sig == Py_None)) {
            Py_DECREF(seq);
            Py_DECREF(self);
            PyErr_Format(PyExc_ValueError, "Barrier: invalid round %zd", k);
            return NULL;
        }
        self->rounds[k] = (Round){(uint64_t *)(uintptr_t)peer, rank, slot,
                                  (const uint64_t *)(uintptr_t)mine};
    }
    Py_DECREF(seq);
    self->nrounds = n;
    if (sig != Py_None) {
        Py_INCREF(sig);
        self->signaller = (Signaller *)sig;
    }
    self->comm = (intptr_t)comm;
    return (PyObject *)self;
}

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static int win_sync(intptr_t win) {
    return handle_bytes == 4 ? ((sync32)sync_addr)((int32_t)win) : ((sync64)sync_addr)(win);
}

/* MPI_Win_sync of the signaller's windows (the heap's fence), or a processor fence */
static int pad_fence(Signaller *sig) {
    if (sig == NULL) {
        __atomic_thread_fence(__ATOMIC_SEQ_CST);
        return 0;
    }
    int rc = sig->extra ? win_sync(sig->extra) : 0;
    return rc ? rc : win_sync(sig->win);
}

/* run(epoch, spins, yields) -> None (every round passed), k >= 0 (round k's signal is sent,
   its wait is the caller's), -(k + 1) (round k's signal is not sent: the signal before is still
   in flight), or False (cleared: the heap is closed). Each wait makes at most spins loads,
   then at most yields loads with sched_yield between them (more ranks than cores). */
static PyObject *Barrier_run(Barrier *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "Barrier.run(epoch, spins, yields)");
        return NULL;
    }
    unsigned long long epoch = PyLong_AsUnsignedLongLongMask(args[0]);
    long spins = PyLong_AsLong(args[1]);
    long yields = PyLong_AsLong(args[2]);
    if (PyErr_Occurred())
        return NULL;
    if (self->nrounds == 0)
        Py_RETURN_FALSE;
    Signaller *sig = self->signaller;
    int flag, rc;
    status_t st;
    for (Py_ssize_t k = 0; k < self->nrounds; k++) {
        Round *r = &self->rounds[k];
        if (r->peer != NULL) {
            if (sig != NULL) { /* a signal off the node before: applied first, as in Python */
                int idle = inflight_done();
                if (idle <= 0)
                    return idle < 0 ? NULL : PyLong_FromSsize_t(-(k + 1));
            }
            if ((rc = pad_fence(sig)) != 0)
                return raise_mpi(rc);
            __atomic_store_n(r->peer, (uint64_t)epoch, __ATOMIC_RELEASE);
        } else {
            PyObject *sent = send_signal(sig, r->rank, r->slot, (long long)epoch, 1);
            if (sent == NULL)
                return NULL;
            int ok = sent == Py_True;
            Py_DECREF(sent);
            if (!ok)
                return PyLong_FromSsize_t(-(k + 1));
        }
        for (long i = 0; __atomic_load_n(r->mine, __ATOMIC_ACQUIRE) < epoch; i++) {
            if (i >= spins + yields)
                return PyLong_FromSsize_t(k);
            if (i >= spins)
                sched_yield();
            if (self->comm) {
                rc = handle_bytes == 4 ? ((iprobe32)iprobe_addr)(any_source, any_tag,
                                                                 (int32_t)self->comm, &flag, &st)
                                       : ((iprobe64)iprobe_addr)(any_source, any_tag,
                                                                 self->comm, &flag, &st);
                if (rc != 0)
                    return raise_mpi(rc);
            } else if (i < spins) {
                cpu_relax();
            }
        }
        if (sig != NULL && (rc = pad_fence(sig)) != 0) /* acquire, as the heap's fence */
            return raise_mpi(rc);
    }
    Py_RETURN_NONE;
}

static PyObject *Barrier_clear(Barrier *self, PyObject *unused) {
    self->nrounds = 0;
    Py_RETURN_NONE;
}

static PyMethodDef Barrier_methods[] = {
    {"run", (PyCFunction)(void (*)(void))Barrier_run, METH_FASTCALL,
     "run(epoch, spins, yields) -> None | int | False: the barrier's rounds (each: the epoch "
     "stored into a node-local peer's word or signalled off the node, then at most spins "
     "loads of this rank's word, then yields more with sched_yield before each, MPI_Iprobe "
     "between them); None when all passed, k when round k's wait is left to the caller, "
     "-(k + 1) when round k's signal is, False once cleared."},
    {"clear", (PyCFunction)Barrier_clear, METH_NOARGS,
     "clear(): run nothing any more (the heap's memory is about to go)."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject BarrierType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "shmem._rmafast.Barrier",
    .tp_basicsize = sizeof(Barrier),
    .tp_weaklistoffset = offsetof(Barrier, weakrefs),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Barrier(rounds, signaller=None, comm=0): a dissemination barrier's rounds "
              "(peer word address or 0, destination rank, Signaller slot, own word address), "
              "the Signaller for the ranks off the node, the communicator MPI_Iprobe drives.",
    .tp_new = Barrier_new,
    .tp_dealloc = (destructor)Barrier_dealloc,
    .tp_methods = Barrier_methods,
};

/* pending() -> None, or the Pending of the signal still in flight (tested first) */
static PyObject *pending(PyObject *module, PyObject *unused) {
    int idle = inflight_done();
    if (idle < 0)
        return NULL;
    if (idle)
        Py_RETURN_NONE;
    return Py_NewRef((PyObject *)inflight);
}

static int compare_words(uint64_t seen, int cmp, uint64_t value) {
    switch (cmp) {
    case 0: return seen == value;
    case 1: return seen != value;
    case 2: return seen > value;
    case 3: return seen >= value;
    case 4: return seen < value;
    default: return seen <= value;
    }
}

/* spin(address, cmp, value, spins, comm) -> int | None: load the aligned uint64 at address
   until it compares to value (cmp: 0 eq, 1 ne, 2 gt, 3 ge, 4 lt, 5 le), at most spins times,
   with MPI_Iprobe on comm (0: none) between loads to drive MPI's progress: the word that
   passed, or None. No fence: the caller's acquire follows. */
static PyObject *spin(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "spin(address, cmp, value, spins, comm)");
        return NULL;
    }
    unsigned long long address = PyLong_AsUnsignedLongLong(args[0]);
    long cmp = PyLong_AsLong(args[1]);
    unsigned long long value = PyLong_AsUnsignedLongLongMask(args[2]);
    long spins = PyLong_AsLong(args[3]);
    unsigned long long comm = PyLong_AsUnsignedLongLongMask(args[4]);
    if (PyErr_Occurred())
        return NULL;
    if (address == 0 || address % 8 || cmp < 0 || cmp > 5) {
        PyErr_SetString(PyExc_ValueError, "spin: invalid address or comparison");
        return NULL;
    }
    const volatile uint64_t *word = (const volatile uint64_t *)(uintptr_t)address;
    int flag;
    status_t st;
    uint64_t seen;
    for (long i = 0; i < spins; i++) {
        seen = *word;
        if (compare_words(seen, (int)cmp, value))
            return PyLong_FromUnsignedLongLong(seen);
        if (comm) {
            int rc = handle_bytes == 4
                         ? ((iprobe32)iprobe_addr)(any_source, any_tag, (int32_t)comm, &flag, &st)
                         : ((iprobe64)iprobe_addr)(any_source, any_tag, (intptr_t)comm, &flag,
                                                   &st);
            if (rc != 0)
                return raise_mpi(rc);
        }
    }
    seen = *word;
    if (compare_words(seen, (int)cmp, value))
        return PyLong_FromUnsignedLongLong(seen);
    Py_RETURN_NONE;
}

/* -- Requests: persistent point-to-point requests, started and tested out of Python ------- */

/* The handles of persistent requests (mpi4py Prequests, which keep their handle for their
   life: MPI_Test leaves a completed persistent request inactive, not MPI_REQUEST_NULL), in
   the order they complete best in. Test() tests them in order from the first not yet seen
   complete, one MPI_Test each (each drives MPI's progress), and stops at the first that is
   not: about 0.1 us a test where mpi4py's Testall of a list costs 0.45 us for 12 requests
   here. The owner starts them (start(), MPI_Startall, or through another Requests of the
   same handles) and frees them (mpi4py, Free); this object holds handles only. */
typedef struct {
    PyObject_HEAD
    Py_ssize_t count;
    Py_ssize_t next; /* requests [0, next) seen complete in the wait under way */
    int32_t *h32;
    intptr_t *h64;
} Requests;

static void Requests_dealloc(Requests *self) {
    PyMem_Free(self->h32);
    PyMem_Free(self->h64);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Requests_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    PyObject *handles;
    if (!PyArg_ParseTuple(args, "O!", &PyTuple_Type, &handles))
        return NULL;
    if (startall_addr == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "shmem._rmafast.Requests: bind() first");
        return NULL;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(handles);
    if (n > INT_MAX) {
        PyErr_SetString(PyExc_ValueError, "shmem._rmafast.Requests: too many requests");
        return NULL;
    }
    Requests *self = (Requests *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->count = n;
    self->next = 0;
    if (handle_bytes == 4)
        self->h32 = PyMem_Calloc(n ? n : 1, sizeof(int32_t));
    else
        self->h64 = PyMem_Calloc(n ? n : 1, sizeof(intptr_t));
    if (self->h32 == NULL && self->h64 == NULL) {
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned long long h = PyLong_AsUnsignedLongLongMask(PyTuple_GET_ITEM(handles, i));
        if (PyErr_Occurred()) {
            Py_DECREF(self);
            return NULL;
        }
        if (handle_bytes == 4)
            self->h32[i] = (int32_t)(uint32_t)h;
        else
            self->h64[i] = (intptr_t)h;
    }
    return (PyObject *)self;
}

static PyObject *Requests_start(Requests *self, PyObject *unused) {
    int rc, n = (int)self->count;
    if (handle_bytes == 4)
        rc = ((startall32)startall_addr)(n, self->h32);
    else
        rc = ((startall64)startall_addr)(n, self->h64);
    if (rc != 0)
        return raise_mpi(rc);
    self->next = 0;
    Py_RETURN_NONE;
}

/* 1: all complete (the next test starts from the first again: a completed persistent
   request tests complete at once until started); 0: not yet; -1: MPI's error code in *err */
static int requests_test(Requests *self, int *err) {
    while (self->next < self->count) {
        int flag = 0, rc;
        status_t st;
        if (handle_bytes == 4)
            rc = ((test32)test_addr)(&self->h32[self->next], &flag, &st);
        else
            rc = ((test64)test_addr)(&self->h64[self->next], &flag, &st);
        if (rc != 0) {
            *err = rc;
            return -1;
        }
        if (!flag)
            return 0;
        self->next++;
    }
    self->next = 0;
    return 1;
}

static PyObject *Requests_Test(Requests *self, PyObject *unused) {
    int err = 0, done = requests_test(self, &err);
    if (done < 0)
        return raise_mpi(err);
    return PyBool_FromLong(done);
}

/* settle(inline, yielded): up to ``inline`` tests, then up to ``yielded`` each after a
   sched_yield (more ranks than cores: a peer that has work gets the core) */
static PyObject *Requests_settle(Requests *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "Requests.settle(inline, yielded)");
        return NULL;
    }
    long inl = PyLong_AsLong(args[0]), yielded = PyLong_AsLong(args[1]);
    if ((inl == -1 || yielded == -1) && PyErr_Occurred())
        return NULL;
    int err = 0, done = 0;
    for (long i = 0; i < inl && !done; i++)
        done = requests_test(self, &err);
    for (long i = 0; i < yielded && !done; i++) {
        Py_BEGIN_ALLOW_THREADS /* (as os.sched_yield: other threads may run meanwhile) */
        sched_yield();
        Py_END_ALLOW_THREADS
        done = requests_test(self, &err);
    }
    if (done < 0)
        return raise_mpi(err);
    return PyBool_FromLong(done);
}

static PyMethodDef Requests_methods[] = {
    {"start", (PyCFunction)Requests_start, METH_NOARGS,
     "start(): MPI_Startall of every request."},
    {"Test", (PyCFunction)Requests_Test, METH_NOARGS,
     "Test() -> bool: every request complete (MPI_Test of each in order, from the first "
     "not yet complete, up to the first that is not)."},
    {"settle", (PyCFunction)(void (*)(void))Requests_settle, METH_FASTCALL,
     "settle(inline, yielded) -> bool: Test up to inline times, then up to yielded times "
     "each after sched_yield; whether every request completed."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject RequestsType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "shmem._rmafast.Requests",
    .tp_basicsize = sizeof(Requests),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Persistent MPI requests by handle: start, Test and settle out of Python.",
    .tp_new = Requests_new,
    .tp_dealloc = (destructor)Requests_dealloc,
    .tp_methods = Requests_methods,
};

/* bind(fns, handle_bytes, handles, ndarray, exception) */
static PyObject *bind(PyObject *module, PyObject *args) {
    unsigned long long put, flush, sync, rgacc, test, wait, iprobe, fop, startall, byte, i64,
        replace, sum;
    int hb, anysrc, anytag;
    PyObject *nd, *exc;
    if (!PyArg_ParseTuple(args, "(KKKKKKKKK)i(KKKK)(ii)OO", &put, &flush, &sync, &rgacc, &test,
                          &wait, &iprobe, &fop, &startall, &hb, &byte, &i64, &replace, &sum,
                          &anysrc, &anytag, &nd, &exc))
        return NULL;
    if (!put || !flush || !sync || !rgacc || !test || !wait || !iprobe || !fop || !startall ||
        (hb != 4 && hb != 8) || !PyType_Check(nd) || !PyExceptionClass_Check(exc)) {
        PyErr_SetString(PyExc_ValueError, "shmem._rmafast.bind: invalid arguments");
        return NULL;
    }
    put_addr = (void *)(uintptr_t)put;
    flush_addr = (void *)(uintptr_t)flush;
    sync_addr = (void *)(uintptr_t)sync;
    rgacc_addr = (void *)(uintptr_t)rgacc;
    test_addr = (void *)(uintptr_t)test;
    wait_addr = (void *)(uintptr_t)wait;
    iprobe_addr = (void *)(uintptr_t)iprobe;
    fop_addr = (void *)(uintptr_t)fop;
    startall_addr = (void *)(uintptr_t)startall;
    any_source = anysrc;
    any_tag = anytag;
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
     "bind((put, flush, sync, rget_accumulate, test, wait, iprobe, fetch_and_op, startall), "
     "handle_bytes, (byte, int64, replace, sum), (any_source, any_tag), ndarray, exception): "
     "the addresses of MPI_Put, MPI_Win_flush, MPI_Win_sync, MPI_Rget_accumulate, MPI_Test, "
     "MPI_Wait, MPI_Iprobe, MPI_Fetch_and_op and MPI_Startall, the ABI's handle width, the "
     "handles of "
     "MPI_BYTE, MPI_INT64_T, MPI_REPLACE "
     "and MPI_SUM, MPI_ANY_SOURCE and MPI_ANY_TAG, numpy.ndarray and the exception raised "
     "for an MPI error code."},
    {"pending", pending, METH_NOARGS,
     "pending() -> Pending | None: the signal still in flight (MPI_Test first), if any; "
     "complete it (its Test, against a deadline) before an operation that must follow it."},
    {"spin", (PyCFunction)(void (*)(void))spin, METH_FASTCALL,
     "spin(address, cmp, value, spins, comm) -> int | None: the uint64 at address once it "
     "compares to value (0 eq, 1 ne, 2 gt, 3 ge, 4 lt, 5 le), None if it did not within "
     "spins loads, with MPI_Iprobe(ANY_SOURCE, ANY_TAG, comm) between them (comm 0: none)."},
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
        PyType_Ready(&PendingType) < 0 || PyType_Ready(&BarrierType) < 0 ||
        PyType_Ready(&RequestsType) < 0)
        return NULL;
    str_dtype = PyUnicode_InternFromString("dtype");
    if (str_dtype == NULL)
        return NULL;
    PyObject *m = PyModule_Create(&module_def);
    if (m == NULL)
        return NULL;
    if (PyModule_AddObjectRef(m, "Putter", (PyObject *)&PutterType) < 0 ||
        PyModule_AddObjectRef(m, "Signaller", (PyObject *)&SignallerType) < 0 ||
        PyModule_AddObjectRef(m, "Pending", (PyObject *)&PendingType) < 0 ||
        PyModule_AddObjectRef(m, "Barrier", (PyObject *)&BarrierType) < 0 ||
        PyModule_AddObjectRef(m, "Requests", (PyObject *)&RequestsType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
