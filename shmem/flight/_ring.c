/* shmem.flight._ring: the flight recorder's writes, out of Python.
 *
 * A call recorded from Python (a World's barrier or wait, a Communicator's general path)
 * cost about 1.5 us of interpreter work in pure Python (struct packing, two clock reads,
 * a lock, a context manager): as much as a wait itself. Here a record is two clock reads
 * and a few stores, behind one C call:
 *
 *   Ring(buffer, capacity)            the ring of shmem.flight (its layout: layout.py);
 *   Ring.begin(stream, op, nbytes, dtype, peer, numbered) -> n;  Ring.end(n, failed);
 *   Ring.call(stream, op, nbytes, dtype, peer)   a context manager recording one call;
 *   Recorded(fn, stream, op)          fn recorded on every call into the ring set_current
 *                                     made current (a method too: it binds like one).
 *
 * Every entry runs under the GIL and none releases it, so the ring's next-record word and
 * counters need no lock against this process's other threads (the pure Python writer and
 * the C replay of collectives._replay follow the same rule).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include "flight_ring.h"

typedef struct {
    PyObject_HEAD
    Py_buffer view;
    int has_view;
    FlightRing ring;
    unsigned char waits[256]; /* op codes numbered apart (shmem.flight.WAITS) */
} Ring;

static PyTypeObject *RingType, *CallType, *RecordedType;
static Ring *current; /* the process's ring (set_current), or NULL */

static int64_t ring_begin(Ring *r, int stream, int op, int64_t nbytes, const char *dtype,
                          Py_ssize_t dlen, int peer, int numbered) {
    if (stream < 0 || stream >= FLIGHT_STREAMS)
        return -1;
    FlightRecord proto;
    memset(&proto, 0, sizeof proto);
    proto.nbytes = nbytes;
    proto.stream = stream;
    proto.op = (int16_t)op;
    proto.peer = peer;
    if (dlen > 0)
        memcpy(proto.dtype, dtype, (size_t)(dlen > 12 ? 12 : dlen));
    int wait = op >= 0 && op < 256 && r->waits[op];
    int64_t *counter = r->ring.counters + (wait ? FLIGHT_WAIT_COUNTER : stream);
    return flight_begin(&r->ring, &proto, counter, numbered);
}

static void ring_end(Ring *r, int64_t n, int failed) { flight_end(&r->ring, n, failed); }

/* Ring(buffer, capacity, waits) */
static PyObject *Ring_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    (void)kwds;
    PyObject *buffer, *waits;
    Py_ssize_t capacity;
    if (!PyArg_ParseTuple(args, "OnO", &buffer, &capacity, &waits))
        return NULL;
    if (capacity < 1) {
        PyErr_SetString(PyExc_ValueError, "Ring: capacity must be at least 1");
        return NULL;
    }
    Ring *self = (Ring *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    if (PyObject_GetBuffer(buffer, &self->view, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) {
        Py_DECREF(self);
        return NULL;
    }
    self->has_view = 1;
    if (flight_ring_init(&self->ring, (char *)self->view.buf, self->view.len, capacity) < 0) {
        PyErr_Format(PyExc_ValueError, "Ring: a buffer of %zd bytes holds no ring of %zd records",
                     self->view.len, capacity);
        Py_DECREF(self);
        return NULL;
    }
    PyObject *it = PyObject_GetIter(waits);
    if (it == NULL) {
        Py_DECREF(self);
        return NULL;
    }
    PyObject *item;
    while ((item = PyIter_Next(it)) != NULL) {
        long code = PyLong_AsLong(item);
        Py_DECREF(item);
        if (code >= 0 && code < 256)
            self->waits[code] = 1;
    }
    Py_DECREF(it);
    if (PyErr_Occurred()) {
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

static void Ring_dealloc(Ring *self) {
    PyTypeObject *tp = Py_TYPE(self);
    if (current == self)
        current = NULL;
    if (self->has_view)
        PyBuffer_Release(&self->view);
    tp->tp_free((PyObject *)self);
    Py_DECREF(tp);
}

/* begin(stream, op, nbytes=0, dtype=b"", peer=-1, numbered=True) -> int */
static PyObject *Ring_begin(Ring *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 2 || nargs > 6) {
        PyErr_SetString(PyExc_TypeError,
                        "Ring.begin(stream, op, nbytes=0, dtype=b'', peer=-1, numbered=True)");
        return NULL;
    }
    long stream = PyLong_AsLong(args[0]), op = PyLong_AsLong(args[1]);
    long long nbytes = nargs > 2 ? PyLong_AsLongLong(args[2]) : 0;
    long peer = nargs > 4 ? PyLong_AsLong(args[4]) : -1;
    if (PyErr_Occurred())
        return NULL;
    const char *dtype = NULL;
    Py_ssize_t dlen = 0;
    if (nargs > 3 && PyBytes_AsStringAndSize(args[3], (char **)&dtype, &dlen) < 0)
        return NULL;
    int numbered = nargs > 5 ? PyObject_IsTrue(args[5]) : 1;
    if (numbered < 0)
        return NULL;
    return PyLong_FromLongLong(
        ring_begin(self, (int)stream, (int)op, nbytes, dtype, dlen, (int)peer, numbered));
}

/* end(n, failed=False) */
static PyObject *Ring_end(Ring *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "Ring.end(n, failed=False)");
        return NULL;
    }
    long long n = PyLong_AsLongLong(args[0]);
    if (n == -1 && PyErr_Occurred())
        return NULL;
    int failed = nargs > 1 ? PyObject_IsTrue(args[1]) : 0;
    if (failed < 0)
        return NULL;
    ring_end(self, n, failed);
    Py_RETURN_NONE;
}

typedef struct {
    PyObject_HEAD
    Ring *ring;
    int64_t n;
} Call;

/* call(stream, op, nbytes=0, dtype=b"", peer=-1) -> a context manager: the call is begun
 * now, and ends (done, or failed on an exception) when the with block does */
static PyObject *Ring_call(Ring *self, PyObject *const *args, Py_ssize_t nargs) {
    PyObject *n = Ring_begin(self, args, nargs);
    if (n == NULL)
        return NULL;
    Call *call = PyObject_New(Call, CallType);
    if (call == NULL) {
        Py_DECREF(n);
        return NULL;
    }
    call->n = PyLong_AsLongLong(n);
    Py_DECREF(n);
    Py_INCREF(self);
    call->ring = self;
    return (PyObject *)call;
}

static void Call_dealloc(Call *self) {
    PyTypeObject *tp = Py_TYPE(self);
    Py_XDECREF(self->ring);
    PyObject_Free(self);
    Py_DECREF(tp);
}

static PyObject *Call_enter(Call *self, PyObject *unused) {
    (void)unused;
    Py_INCREF(self);
    return (PyObject *)self;
}

static PyObject *Call_exit(Call *self, PyObject *const *args, Py_ssize_t nargs) {
    ring_end(self->ring, self->n, nargs > 0 && args[0] != Py_None);
    self->n = -1;
    Py_RETURN_FALSE;
}

typedef struct {
    PyObject_HEAD
    PyObject *fn;
    int stream, op;
    vectorcallfunc vectorcall;
    PyObject *dict; /* the wrapped function's __doc__, __name__, __wrapped__ ... */
} Recorded;

static PyObject *Recorded_vectorcall(PyObject *callable, PyObject *const *args, size_t nargsf,
                                     PyObject *kwnames) {
    Recorded *self = (Recorded *)callable;
    Ring *ring = current;
    int64_t n = -1;
    if (ring != NULL) {
        Py_INCREF(ring);
        n = ring_begin(ring, self->stream, self->op, 0, NULL, 0, -1, 1);
    }
    PyObject *res = PyObject_Vectorcall(self->fn, args, nargsf, kwnames);
    if (ring != NULL) {
        ring_end(ring, n, res == NULL);
        Py_DECREF(ring);
    }
    return res;
}

/* Recorded(fn, stream, op) */
static PyObject *Recorded_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    (void)kwds;
    PyObject *fn;
    int stream, op;
    if (!PyArg_ParseTuple(args, "Oii", &fn, &stream, &op))
        return NULL;
    if (!PyCallable_Check(fn)) {
        PyErr_SetString(PyExc_TypeError, "Recorded: fn must be callable");
        return NULL;
    }
    Recorded *self = (Recorded *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    Py_INCREF(fn);
    self->fn = fn;
    self->stream = stream;
    self->op = op;
    self->vectorcall = Recorded_vectorcall;
    self->dict = PyDict_New();
    if (self->dict == NULL) {
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

static int Recorded_traverse(Recorded *self, visitproc visit, void *arg) {
    Py_VISIT(self->fn);
    Py_VISIT(self->dict);
    Py_VISIT(Py_TYPE(self));
    return 0;
}

static int Recorded_clear(Recorded *self) {
    Py_CLEAR(self->fn);
    Py_CLEAR(self->dict);
    return 0;
}

static void Recorded_dealloc(Recorded *self) {
    PyTypeObject *tp = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    Recorded_clear(self);
    tp->tp_free((PyObject *)self);
    Py_DECREF(tp);
}

static PyObject *Recorded_get(PyObject *self, PyObject *obj, PyObject *type) {
    (void)type;
    if (obj == NULL || obj == Py_None) {
        Py_INCREF(self);
        return self;
    }
    return PyMethod_New(self, obj); /* binds like a function */
}

static PyObject *set_current(PyObject *module, PyObject *ring) {
    (void)module;
    if (ring != Py_None && !PyObject_TypeCheck(ring, RingType)) {
        PyErr_SetString(PyExc_TypeError, "set_current(ring): a Ring or None");
        return NULL;
    }
    /* the module holds the current ring (a reference in its state would be tidier: one
     * process, one recorder) */
    static PyObject *held;
    Py_XINCREF(ring == Py_None ? NULL : ring);
    Py_XSETREF(held, ring == Py_None ? NULL : ring);
    current = (Ring *)held;
    Py_RETURN_NONE;
}

static PyMethodDef Ring_methods[] = {
    {"begin", (PyCFunction)(void (*)(void))Ring_begin, METH_FASTCALL,
     "begin(stream, op, nbytes=0, dtype=b'', peer=-1, numbered=True) -> int: a pending "
     "record (its number, for end; -1 when the ring is off)."},
    {"end", (PyCFunction)(void (*)(void))Ring_end, METH_FASTCALL,
     "end(n, failed=False): record n done (or failed), unless the ring moved past it."},
    {"call", (PyCFunction)(void (*)(void))Ring_call, METH_FASTCALL,
     "call(stream, op, nbytes=0, dtype=b'', peer=-1): a context manager recording one call."},
    {NULL, NULL, 0, NULL},
};

static PyMethodDef Call_methods[] = {
    {"__enter__", (PyCFunction)Call_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)(void (*)(void))Call_exit, METH_FASTCALL, NULL},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef Recorded_members[] = {
    {"__dictoffset__", T_PYSSIZET, offsetof(Recorded, dict), READONLY, NULL},
    {"__vectorcalloffset__", T_PYSSIZET, offsetof(Recorded, vectorcall), READONLY, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyGetSetDef Recorded_getset[] = {
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, NULL, NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot Ring_slots[] = {
    {Py_tp_new, Ring_new},
    {Py_tp_dealloc, Ring_dealloc},
    {Py_tp_methods, Ring_methods},
    {Py_tp_doc, "The flight recorder's ring, written from C (see the module docstring)."},
    {0, NULL},
};
static PyType_Slot Call_slots[] = {
    {Py_tp_dealloc, Call_dealloc},
    {Py_tp_methods, Call_methods},
    {Py_tp_doc, "One call being recorded (Ring.call)."},
    {0, NULL},
};
static PyType_Slot Recorded_slots[] = {
    {Py_tp_new, Recorded_new},
    {Py_tp_dealloc, Recorded_dealloc},
    {Py_tp_traverse, Recorded_traverse},
    {Py_tp_clear, Recorded_clear},
    {Py_tp_call, PyVectorcall_Call},
    {Py_tp_descr_get, Recorded_get},
    {Py_tp_members, Recorded_members},
    {Py_tp_getset, Recorded_getset},
    {Py_tp_doc, "A function whose calls are recorded in the current ring."},
    {0, NULL},
};

static PyType_Spec Ring_spec = {"shmem.flight._ring.Ring", sizeof(Ring), 0, Py_TPFLAGS_DEFAULT,
                                Ring_slots};
static PyType_Spec Call_spec = {"shmem.flight._ring.Call", sizeof(Call), 0, Py_TPFLAGS_DEFAULT,
                                Call_slots};
static PyType_Spec Recorded_spec = {
    "shmem.flight._ring.Recorded", sizeof(Recorded), 0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL |
        Py_TPFLAGS_METHOD_DESCRIPTOR,
    Recorded_slots};

static PyMethodDef module_methods[] = {
    {"set_current", set_current, METH_O,
     "set_current(ring): the ring Recorded functions record into (None: none)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "shmem.flight._ring",
    "The flight recorder's writes, out of Python (see shmem.flight).", -1, module_methods,
};

PyMODINIT_FUNC PyInit__ring(void) {
    PyObject *m = PyModule_Create(&module_def);
    if (m == NULL)
        return NULL;
    RingType = (PyTypeObject *)PyType_FromSpec(&Ring_spec);
    CallType = (PyTypeObject *)PyType_FromSpec(&Call_spec);
    RecordedType = (PyTypeObject *)PyType_FromSpec(&Recorded_spec);
    if (RingType == NULL || CallType == NULL || RecordedType == NULL ||
        PyModule_AddObjectRef(m, "Ring", (PyObject *)RingType) < 0 ||
        PyModule_AddObjectRef(m, "Call", (PyObject *)CallType) < 0 ||
        PyModule_AddObjectRef(m, "Recorded", (PyObject *)RecordedType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
