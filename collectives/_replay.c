/* collectives._replay: the cached small all-reduce on one node, replayed out of Python
 * (and the cached small reduce-scatter, broadcast and all-gather, which differ only in how
 * they combine the inputs).
 *
 * A TinyPlan (collectives.allreduce) replays a one-shot all-reduce of one shape: wait for
 * the peers' DONE of the previous call, publish my input (a copy into my staging words, or
 * the offset of a SHMEMBuffer peers read in place), raise READY, wait for the peers' READY,
 * check that every rank published what this plan expects (the SRC words, whose upper bits
 * carry the call's signature), reduce every rank's input in rank order, raise DONE and, for
 * a zero-copy input, wait for the peers' DONE. In Python that is about a microsecond of
 * interpreter work per call, as much as the exchange itself. Replay.run does the same
 * steps on the same words, in C, and stops where the plan's Python code must take over:
 *
 *   0  done;
 *   1  nothing was done (an input or output this code does not take, a peer not done
 *      with the previous call within the spin): the Python replay runs the whole call;
 *   2  READY is raised, but a peer's READY did not come within the spin or a SRC word is
 *      not the one expected: the Python replay goes on from its wait for READY (which
 *      reports mismatches and timeouts, and hands back the new inputs with set_inputs);
 *   3  DONE is raised, a peer's DONE (zero-copy input) did not come within the spin: the
 *      Python replay goes on from that wait.
 *
 * The spins are bounded in time (the plan's spin_ns) and hold the GIL, as the Python
 * replay's inline spin does; every wait with a deadline, an abort word or a dead peer to
 * notice is Python's. Flag stores are release stores and flag loads acquire loads (plain
 * moves on x86-64; the fences on weakly ordered CPUs). The reduction is the expression of
 * collectives.ops.reduce_into, element by element in rank order, so the results are
 * bitwise those of the Python replay: only the operations whose C form is exactly
 * numpy's are taken (sum, prod and avg of float32/float64; every op but avg on integers, in
 * unsigned arithmetic where numpy wraps; sum, prod and avg of float16/bfloat16 accumulated in
 * float32 and rounded once to nearest even, as numpy's and ml_dtypes' casts round); the
 * others are never given to this module. A float result with a NaN, or one that raised a
 * floating-point flag numpy reports (a float16 rounding that overflows or underflows
 * included), is handed back after READY (answer 2) for numpy to compute. A reduce-scatter
 * reduces only its shard [lo, lo + n) of every input (mode 0 with a shard).
 *
 * A broadcast copies the root's input (mode 1; the root's own in-place result needs no
 * copy; beyond one chunk the root stages its input chunk by chunk after READY, counting the
 * chunks in its PROG word, and its readers copy each as it lands), an all-gather
 * concatenates every input in rank order (mode 2); both count bytes.
 * A small zero-copy input may be given as its address instead: it is staged like a numpy
 * input (a copy costs less than waiting for every peer's DONE). A staged rank reads its own
 * input from x, not from the stage its readers are pulling into their caches, wherever out
 * leaves x intact (and a small all-reduce exactly in place, block by block).
 *
 * The flight recorder (shmem.flight): given a ring with flight(), a run records its call
 * there as Python would (a pending record once it starts waiting, made done when it
 * returns 0); a run that hands the call back leaves the record pending and says which it
 * is (the slot attribute), for the Python replay to end. Two clock reads and a few stores.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <fenv.h>
#include <stdint.h>
#include <string.h>
#include <sched.h>
#include <time.h>
#if defined(__x86_64__)
#include <emmintrin.h> /* SSE2: the streaming stores of stream_copy */
#endif

#include "flight_ring.h" /* shmem/flight/: the flight recorder's ring */

/* T_F16, T_BF16: float16, bfloat16 accumulated in float32 */
enum { T_F32, T_F64, T_I8, T_I16, T_I32, T_I64, T_U8, T_U16, T_U32, T_U64, T_F16, T_BF16,
       T_COUNT };
/* OP_AVG: floats only, the sum divided by the number of inputs (numpy's np.divide) */
enum { OP_SUM, OP_PROD, OP_MIN, OP_MAX, OP_BAND, OP_BOR, OP_BXOR, OP_AVG, OP_COUNT };
enum { DONE_ALL = 0, UNTOUCHED = 1, AFTER_READY = 2, AFTER_DONE = 3 };
enum { M_REDUCE, M_COPY_ONE, M_CONCAT, M_COUNT }; /* all_reduce, broadcast, all_gather */

#define STREAM_STAGE_MIN 4096 /* (stage_way) */
#define EXPLORE_CALLS 16
#define EXPLORE_EVERY 1024
#define SETTLE_CALLS 2 /* the runs after a change of way that are not timed */
#define RETRY_AFTER 64
#define STREAM_MARGIN_NUM 17 /* streaming is kept where its median is below 17/20 of */
#define STREAM_MARGIN_DEN 20 /* memcpy's */

static const int type_size[T_COUNT] = {4, 8, 1, 2, 4, 8, 1, 2, 4, 8, 2, 2};

static inline int is_float(int type) { return type <= T_F64 || type >= T_F16; }

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static inline int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static inline int64_t load_acquire(const int64_t *p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }

static inline void store_release(int64_t *p, int64_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }

/* whether word idx of every flag block in blocks[0..n) reaches v within budget_ns (0: for
 * a node with more ranks than cores, where a spin starves the rank it waits for: up to
 * YIELDS looks with the core yielded between them, as the barrier's C wait, then Python's) */
#define YIELDS 64
static int spin_all(int64_t *const *blocks, Py_ssize_t n, Py_ssize_t idx, int64_t v,
                    int64_t budget_ns) {
    int64_t deadline = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        const int64_t *w = blocks[i] + idx;
        unsigned tries = 0;
        while (load_acquire(w) < v) {
            if (budget_ns == 0) { /* yield the core between looks, a while */
                if (++tries > YIELDS)
                    return 0;
                Py_BEGIN_ALLOW_THREADS /* (the process's other threads may run meanwhile) */
                sched_yield();
                Py_END_ALLOW_THREADS
                continue;
            }
            if ((++tries & 15) == 0) { /* the clock only now and then */
                int64_t t = now_ns();
                if (deadline == 0)
                    deadline = t + budget_ns;
                else if (t > deadline)
                    return 0;
            }
            cpu_relax();
        }
    }
    return 1;
}

/* the elementwise reduction of the inputs, in rank order, into out (which overlaps no
 * input: run checks); vectorized (-O3), each element's expression unchanged */
#define LOOP2(T, E)                                                                        \
    do {                                                                                   \
        T *restrict o = (T *)out;                                                          \
        const T *restrict a = (const T *)in[0], *restrict b = (const T *)in[1];            \
        for (Py_ssize_t i = 0; i < n; i++)                                                 \
            o[i] = E(a[i], b[i]);                                                          \
        for (Py_ssize_t k = 2; k < nin; k++) {                                             \
            const T *restrict c = (const T *)in[k];                                        \
            for (Py_ssize_t i = 0; i < n; i++)                                             \
                o[i] = E(o[i], c[i]);                                                      \
        }                                                                                  \
    } while (0)
#define ADD(x, y) ((x) + (y))
#define MUL(x, y) ((x) * (y))
#define UMUL(x, y) ((x) * 1u * (y)) /* unsigned: 16-bit operands would promote to int */
#define MIN(x, y) ((y) < (x) ? (y) : (x))
#define MAX(x, y) ((y) > (x) ? (y) : (x))
#define AND(x, y) ((x) & (y))
#define OR(x, y) ((x) | (y))
#define XOR(x, y) ((x) ^ (y))
/* integers: sum and prod wrap (unsigned arithmetic, numpy's bits); min and max compare
 * with the signedness of the dtype (S); the bitwise ops need none */
#define INT_OPS(S, U)                                                                      \
    switch (op) {                                                                          \
    case OP_SUM: LOOP2(U, ADD); break;                                                     \
    case OP_PROD: LOOP2(U, UMUL); break;                                                   \
    case OP_MIN: LOOP2(S, MIN); break;                                                     \
    case OP_MAX: LOOP2(S, MAX); break;                                                     \
    case OP_BAND: LOOP2(U, AND); break;                                                    \
    case OP_BOR: LOOP2(U, OR); break;                                                      \
    default: LOOP2(U, XOR); break;                                                         \
    }

/* whether any of the n floats (or doubles) at out is a NaN */
#define ANY_NAN(T)                                                                         \
    do {                                                                                   \
        const T *o = (const T *)out;                                                       \
        int any = 0;                                                                       \
        for (Py_ssize_t i = 0; i < n; i++)                                                 \
            any |= o[i] != o[i];                                                           \
        return any;                                                                        \
    } while (0)
static int any_nan(int type, const char *out, Py_ssize_t n) {
    if (type == T_F32)
        ANY_NAN(float);
    ANY_NAN(double);
}

static void reduce(int type, int op, char *out, char *const *in, Py_ssize_t nin,
                   Py_ssize_t n) {
    switch (type) {
    case T_F32: /* (an average sums: the caller divides) */
        if (op == OP_PROD) LOOP2(float, MUL); else LOOP2(float, ADD);
        break;
    case T_F64:
        if (op == OP_PROD) LOOP2(double, MUL); else LOOP2(double, ADD);
        break;
    case T_I8: INT_OPS(int8_t, uint8_t); break;
    case T_I16: INT_OPS(int16_t, uint16_t); break;
    case T_I32: INT_OPS(int32_t, uint32_t); break;
    case T_I64: INT_OPS(int64_t, uint64_t); break;
    case T_U8: INT_OPS(uint8_t, uint8_t); break;
    case T_U16: INT_OPS(uint16_t, uint16_t); break;
    case T_U32: INT_OPS(uint32_t, uint32_t); break;
    default: INT_OPS(uint64_t, uint64_t); break;
    }
}

/* an average: the n floats (or doubles) at out divided by count (np.divide's bits) */
static void divide(int type, char *out, Py_ssize_t n, Py_ssize_t count) {
    if (type == T_F32) {
        float *o = (float *)out, c = (float)count;
        for (Py_ssize_t i = 0; i < n; i++)
            o[i] = o[i] / c;
    } else {
        double *o = (double *)out, c = (double)count;
        for (Py_ssize_t i = 0; i < n; i++)
            o[i] = o[i] / c;
    }
}

/* float16 and bfloat16 in float32: exact widenings, and the one rounding to nearest even
 * (numpy's float16 cast, ml_dtypes' bfloat16 cast: the same bits, checked against both
 * over every float16 and millions of float32 patterns, subnormals included) */
static inline uint32_t bits_of(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static inline float float_of(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline float widen_f16(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
    if (exp == 0x1f)
        return float_of(sign | 0x7f800000u | (mant << 13));
    if (exp != 0)
        return float_of(sign | ((exp + 112) << 23) | (mant << 13));
    /* zero or subnormal: mant * 2^-24, exact in float32 */
    return float_of(sign | bits_of((float)mant * 5.9604644775390625e-8f));
}

static inline float widen_bf16(uint16_t b) { return float_of((uint32_t)b << 16); }

static inline uint16_t narrow_bf16(float f) { /* f is not a NaN */
    uint32_t u = bits_of(f);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* f rounded to float16, or -1 where numpy's cast would raise a flag or f is outside the
 * normal range (an overflow, an underflow: numpy's to compute) */
static inline int32_t narrow_f16(float f) {
    uint32_t u = bits_of(f), a = u & 0x7fffffffu, sign = (u >> 16) & 0x8000u;
    if (a == 0)
        return (int32_t)sign;
    if (a < 0x38800000u || a >= 0x477ff000u) /* below 2^-14, or rounds to inf (65520) */
        return -1;
    uint32_t h = (a - 0x38000000u) >> 13, rem = a & 0x1fffu;
    h += rem > 0x1000u || (rem == 0x1000u && (h & 1u));
    return (int32_t)(sign | h);
}

#define WIDE_CHUNK 512
#define WIDE_LOOP(W, E)                                                                    \
    do {                                                                                   \
        if (nin == 1)                                                                      \
            for (Py_ssize_t i = 0; i < m; i++)                                             \
                acc[i] = W(a[i]);                                                          \
        else                                                                               \
            for (Py_ssize_t i = 0; i < m; i++)                                             \
                acc[i] = E(W(a[i]), W(b[i]));                                              \
        for (Py_ssize_t k = 2; k < nin; k++) {                                             \
            const uint16_t *restrict c = (const uint16_t *)in[k] + lo;                     \
            for (Py_ssize_t i = 0; i < m; i++)                                             \
                acc[i] = E(acc[i], W(c[i]));                                               \
        }                                                                                  \
    } while (0)

/* the reduction of float16/bfloat16 inputs in float32 (an average: the sum divided by count
 * there), rounded once into out, in chunks of a stack accumulator: 0 where a NaN or a float16
 * rounding numpy would flag is met (out is then partly written: the Python replay writes it
 * again) */
static int reduce_wide(int type, int op, char *out, char *const *in, Py_ssize_t nin,
                       Py_ssize_t n, Py_ssize_t count) {
    const float c = (float)count;
    float acc[WIDE_CHUNK];
    uint16_t *o = (uint16_t *)out;
    for (Py_ssize_t lo = 0; lo < n; lo += WIDE_CHUNK) {
        Py_ssize_t m = n - lo < WIDE_CHUNK ? n - lo : WIDE_CHUNK;
        const uint16_t *restrict a = (const uint16_t *)in[0] + lo;
        const uint16_t *restrict b = (const uint16_t *)in[nin > 1] + lo;
        if (type == T_F16) {
            if (op == OP_PROD) WIDE_LOOP(widen_f16, MUL); else WIDE_LOOP(widen_f16, ADD);
        } else {
            if (op == OP_PROD) WIDE_LOOP(widen_bf16, MUL); else WIDE_LOOP(widen_bf16, ADD);
        }
        if (op == OP_AVG)
            for (Py_ssize_t i = 0; i < m; i++)
                acc[i] = acc[i] / c;
        int nan = 0;
        for (Py_ssize_t i = 0; i < m; i++)
            nan |= acc[i] != acc[i];
        if (nan)
            return 0;
        if (type == T_BF16) {
            for (Py_ssize_t i = 0; i < m; i++)
                o[lo + i] = narrow_bf16(acc[i]);
        } else {
            for (Py_ssize_t i = 0; i < m; i++) {
                int32_t h = narrow_f16(acc[i]);
                if (h < 0)
                    return 0;
                o[lo + i] = (uint16_t)h;
            }
        }
    }
    return 1;
}

/* the address of a writable (or readable) C-contiguous buffer, checked once: the object
 * is kept alive by the Replay, and its memory does not move */
static char *address_of(PyObject *obj, int writable, Py_ssize_t min_len, const char *what,
                        Py_ssize_t index) {
    Py_buffer view;
    int flags = PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, &view, flags) < 0)
        return NULL;
    char *buf = (char *)view.buf;
    Py_ssize_t len = view.len;
    PyBuffer_Release(&view);
    if (len < min_len) {
        if (index < 0)
            PyErr_Format(PyExc_ValueError, "Replay: %s has %zd bytes, at least %zd needed",
                         what, len, min_len);
        else
            PyErr_Format(PyExc_ValueError, "Replay: %s[%zd] has %zd bytes, at least %zd needed",
                         what, index, len, min_len);
        return NULL;
    }
    return buf;
}

typedef struct {
    PyObject_HEAD
    PyObject *keep;     /* a list: every object whose memory the pointers below address */
    int64_t *mine;      /* my flag words */
    int64_t **peers;    /* the other node-local ranks' flag words */
    Py_ssize_t npeers;
    int64_t **words;    /* every rank's flag words, in rank order (the SRC words) */
    Py_ssize_t nranks;
    Py_ssize_t me;      /* my index in words (mine) */
    char *stage;        /* where a numpy input is copied */
    int64_t stage_word; /* SRC for a staged input: the stage's offset and the call's tag */
    Py_ssize_t ready, done, src; /* flag word indices */
    Py_ssize_t prog;   /* M_COPY_ONE beyond one chunk: the root's staged chunks (-1: none) */
    Py_ssize_t chunk;  /* the bytes of one (0: no chunks) */
    int type, op;
    int mode;          /* how the inputs combine into out (M_*) */
    Py_ssize_t root;   /* M_COPY_ONE: the rank-order index of the input copied */
    Py_ssize_t nbytes, count;
    Py_ssize_t out_bytes; /* nbytes, or nbytes * nranks for M_CONCAT, or the shard's */
    Py_ssize_t lo, n;     /* M_REDUCE: the elements [lo, lo + n) reduced (a reduce-scatter's
                           * shard; by default all) */
    int64_t spin_ns;
    int64_t *expected; /* the SRC words the inputs below belong to (NULL: none yet) */
    char **inputs;     /* every rank's input, in rank order */
    char **shards;     /* M_REDUCE: where each input's reduced elements start */
    PyObject *input_objs;
    int closed;
    long long answers[4]; /* how many runs gave each answer */
    /* the flight recorder's ring (no words: none) and what this plan's records say */
    Py_buffer ring_view;
    FlightRing ring;
    int64_t *counter; /* its stream's */
    FlightRecord proto;
    long long slot; /* the record the last run began (-1: none) */
    /* how a staged input is written (stage_way): 0 memcpy, 1 streaming stores; the times
     * (ns) of each way's timed runs in the current window and how many, and the staged
     * runs so far */
    int streamed;
    int64_t way_ns[2][EXPLORE_CALLS / 2], way_calls[2], staged_runs;
} Replay;

static void Replay_release(Replay *self) {
    PyMem_Free(self->peers);
    PyMem_Free(self->words);
    PyMem_Free(self->expected);
    PyMem_Free(self->inputs);
    PyMem_Free(self->shards);
    self->shards = NULL;
    self->peers = self->words = NULL;
    self->expected = NULL;
    self->inputs = NULL;
    Py_CLEAR(self->keep);
    Py_CLEAR(self->input_objs);
    if (self->ring.words != NULL) {
        PyBuffer_Release(&self->ring_view);
        self->ring.words = NULL;
    }
    self->closed = 1;
}

static int64_t *flag_words(PyObject *keep, PyObject *obj, Py_ssize_t nwords, const char *what,
                           Py_ssize_t index) {
    if (PyList_Append(keep, obj) < 0)
        return NULL;
    return (int64_t *)address_of(obj, 1, nwords * (Py_ssize_t)sizeof(int64_t), what, index);
}

/* Replay(mine, peers, words, stage, stage_word, ready, done, src, type, op, count, spin_ns,
 *        mode=0, root=0, lo=0, n=-1, prog=-1, chunk=0) */
static PyObject *Replay_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    PyObject *mine, *peers, *words, *stage;
    long long stage_word, spin_ns;
    Py_ssize_t ready, done, src, count, root = 0, lo = 0, n = -1, prog = -1, chunk = 0;
    int ctype, op, mode = M_REDUCE;
    static char *kwlist[] = {"mine", "peers", "words", "stage", "stage_word", "ready",
                             "done", "src", "type", "op", "count", "spin_ns", "mode", "root",
                             "lo", "n", "prog", "chunk", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OO!O!OLnnniinL|innnnn", kwlist, &mine,
                                     &PyTuple_Type, &peers, &PyTuple_Type, &words, &stage,
                                     &stage_word, &ready, &done, &src, &ctype, &op, &count,
                                     &spin_ns, &mode, &root, &lo, &n, &prog, &chunk))
        return NULL;
    if (n < 0)
        n = count - lo;
    if (ctype < 0 || ctype >= T_COUNT || op < 0 || op >= OP_COUNT ||
        (is_float(ctype) ? op != OP_SUM && op != OP_PROD && op != OP_AVG : op > OP_BXOR) ||
        count < 0 || ready < 0 || done < 0 || src < 0 ||
        spin_ns < 0 || mode < 0 || mode >= M_COUNT || root < 0 ||
        root >= PyTuple_GET_SIZE(words) || lo < 0 || n < 0 || lo + n > count ||
        (mode != M_REDUCE && (lo != 0 || n != count)) || chunk < 0 ||
        (chunk > 0) != (prog >= 0) || (chunk > 0 && mode != M_COPY_ONE)) {
        PyErr_SetString(PyExc_ValueError,
                        "Replay: a type, op, count, mode, root, shard, chunk or index out of "
                        "range");
        return NULL;
    }
    Replay *self = (Replay *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    Py_ssize_t nwords = (ready > done ? ready : done);
    nwords = (nwords > src ? nwords : src);
    nwords = (nwords > prog ? nwords : prog) + 1;
    self->type = ctype;
    self->op = op;
    self->count = count;
    self->nbytes = count * type_size[ctype];
    self->mode = mode;
    self->root = root;
    self->ready = ready;
    self->done = done;
    self->src = src;
    self->prog = prog;
    /* chunks only where there are two or more */
    self->chunk = chunk > 0 && count * type_size[ctype] > chunk ? chunk : 0;
    self->stage_word = stage_word;
    self->spin_ns = spin_ns;
    self->npeers = PyTuple_GET_SIZE(peers);
    self->nranks = PyTuple_GET_SIZE(words);
    self->lo = lo;
    self->n = n;
    self->slot = -1;
    self->out_bytes = mode == M_CONCAT ? self->nbytes * self->nranks
                                        : (mode == M_REDUCE ? n * type_size[ctype] : self->nbytes);
    self->keep = PyList_New(0);
    self->peers = PyMem_Calloc(self->npeers + 1, sizeof(int64_t *));
    self->words = PyMem_Calloc(self->nranks + 1, sizeof(int64_t *));
    self->expected = PyMem_Calloc(self->nranks + 1, sizeof(int64_t));
    self->inputs = PyMem_Calloc(self->nranks + 1, sizeof(char *));
    self->shards = PyMem_Calloc(self->nranks + 1, sizeof(char *));
    if (self->keep == NULL || self->peers == NULL || self->words == NULL ||
        self->expected == NULL || self->inputs == NULL || self->shards == NULL) {
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    self->mine = flag_words(self->keep, mine, nwords, "mine", -1);
    if (self->mine == NULL)
        goto fail;
    for (Py_ssize_t i = 0; i < self->npeers; i++)
        if ((self->peers[i] =
                 flag_words(self->keep, PyTuple_GET_ITEM(peers, i), nwords, "peers", i)) == NULL)
            goto fail;
    for (Py_ssize_t i = 0; i < self->nranks; i++)
        if ((self->words[i] =
                 flag_words(self->keep, PyTuple_GET_ITEM(words, i), nwords, "words", i)) == NULL)
            goto fail;
    self->me = -1;
    for (Py_ssize_t i = 0; i < self->nranks; i++)
        if (self->words[i] == self->mine)
            self->me = i;
    if (self->me < 0) {
        PyErr_SetString(PyExc_ValueError, "Replay: mine is none of words");
        goto fail;
    }
    if (PyList_Append(self->keep, stage) < 0 ||
        (self->stage = address_of(stage, 1, self->nbytes, "stage", -1)) == NULL)
        goto fail;
    return (PyObject *)self;
fail:
    Py_DECREF(self);
    return NULL;
}

static void Replay_dealloc(Replay *self) {
    PyTypeObject *tp = Py_TYPE(self);
    Replay_release(self);
    tp->tp_free((PyObject *)self);
    Py_DECREF(tp); /* a heap type: its instances hold it */
}

/* set_inputs(expected, inputs): the SRC words every rank publishes for this plan, and
 * their inputs (buffers of count elements), both in rank order */
static PyObject *Replay_set_inputs(Replay *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyList_CheckExact(args[0]) || !PyList_CheckExact(args[1]) ||
        PyList_GET_SIZE(args[0]) != self->nranks || PyList_GET_SIZE(args[1]) != self->nranks) {
        PyErr_SetString(PyExc_TypeError,
                        "Replay.set_inputs(expected, inputs): two lists of one item per rank");
        return NULL;
    }
    if (self->closed) {
        PyErr_SetString(PyExc_ValueError, "Replay.set_inputs: the replay is closed");
        return NULL;
    }
    PyObject *keep = PyList_GetSlice(args[1], 0, self->nranks);
    if (keep == NULL)
        return NULL;
    for (Py_ssize_t r = 0; r < self->nranks; r++) {
        long long w = PyLong_AsLongLong(PyList_GET_ITEM(args[0], r));
        char *p = w == -1 && PyErr_Occurred()
                      ? NULL
                      : address_of(PyList_GET_ITEM(args[1], r), 0, self->nbytes, "inputs", r);
        if (p == NULL) {
            Py_CLEAR(self->input_objs); /* nothing half set: the next run returns 1 */
            Py_DECREF(keep);
            return NULL;
        }
        self->expected[r] = w;
        self->inputs[r] = p;
    }
    Py_XSETREF(self->input_objs, keep);
    Py_RETURN_NONE;
}

/* the elements [at, at + m) of every input reduced into o (own: my input's own memory,
 * read instead of my stage, or NULL): 0 where numpy must compute them (the Python replay
 * reduces the whole call again) */
static int reduce_part(Replay *self, char *o, const char *own, Py_ssize_t at, Py_ssize_t m) {
    Py_ssize_t size = type_size[self->type], nin = self->nranks;
    for (Py_ssize_t r = 0; r < nin; r++)
        self->shards[r] = self->inputs[r] + at * size;
    if (own != NULL)
        self->shards[self->me] = (char *)own + at * size;
    if (self->type >= T_F16) { /* widened and rounded, even from one rank: as numpy */
        feclearexcept(FE_ALL_EXCEPT); /* (the float32 operations' flags, as below) */
        return reduce_wide(self->type, self->op, o, self->shards, nin, m, nin) &&
               !fetestexcept(FE_INVALID | FE_OVERFLOW | FE_UNDERFLOW | FE_DIVBYZERO);
    }
    if (nin == 1 && self->op != OP_AVG) {
        memcpy(o, self->shards[0], (size_t)(m * size)); /* overlaps no input */
        return 1;
    }
    if (!is_float(self->type)) {
        reduce(self->type, self->op, o, self->shards, nin, m);
        return 1;
    }
    /* floats: a result numpy would flag (overflow, an invalid operation, underflow: np.seterr
     * decides whether it warns or raises) or a NaN (which NaN an operation keeps when several
     * meet is the compiler's choice, not numpy's) is numpy's to compute: READY stays raised
     * and the Python replay reduces again, so every rank gets numpy's bits and numpy's error
     * handling */
    feclearexcept(FE_ALL_EXCEPT);
    if (nin == 1) /* an average of one: the input over 1, as numpy */
        memcpy(o, self->shards[0], (size_t)(m * size));
    else
        reduce(self->type, self->op, o, self->shards, nin, m);
    if (self->op == OP_AVG)
        divide(self->type, o, m, nin);
    return !fetestexcept(FE_INVALID | FE_OVERFLOW | FE_UNDERFLOW | FE_DIVBYZERO) &&
           !any_nan(self->type, o, m);
}

/* in place (out is my input's elements [lo, lo + n) themselves, read from there: not a
 * widened type), block by block through an accumulator in L1: each block of out is
 * written once every input's block is read, so my input is read as it was (1 as
 * reduce_part) */
#define IN_PLACE_BLOCK 4096
#define IN_PLACE_MAX (32 << 10)
static int reduce_in_place(Replay *self, char *out) {
    _Alignas(64) char acc[IN_PLACE_BLOCK];
    Py_ssize_t size = type_size[self->type], per = IN_PLACE_BLOCK / size;
    for (Py_ssize_t at = 0; at < self->n; at += per) {
        Py_ssize_t m = self->n - at < per ? self->n - at : per;
        if (!reduce_part(self, acc, out - self->lo * size, self->lo + at, m))
            return 0;
        memcpy(out + at * size, acc, (size_t)(m * size));
    }
    return 1;
}

/* whether every rank published the SRC word this replay's inputs belong to */
static int sources_match(Replay *self) {
    for (Py_ssize_t r = 0; r < self->nranks; r++)
        if (__atomic_load_n(self->words[r] + self->src, __ATOMIC_RELAXED) != self->expected[r])
            return 0; /* a new input, or a mismatch: Python compares and reports */
    return 1;
}

/* How a rank writes a staged input. Streaming stores send the stage to memory instead of
 * through this core's cache: where two cores share no cache (this VM's slow mode, ranks on
 * different dies), a line another core has just written is slower to fetch than memory,
 * and they win 2-4x; where they share one (the fast mode) a peer fetches the line from it,
 * and memcpy wins up to 2x (docs/benchmarks.md, "tenth pass"). The stage holds the same bytes
 * either way, so each rank chooses alone: it times its staged runs of this plan both ways,
 * half of its first EXPLORE_CALLS runs each (in step on ranks that run the same calls), and
 * again in the first EXPLORE_CALLS of every EXPLORE_EVERY, leaving out the first
 * SETTLE_CALLS after a change of way (the lines the other way left behind cost the next
 * run: alternating run by run misled it), and streams where its median is clearly lower.
 * Stages of less than STREAM_STAGE_MIN bytes (a few lines, or the inline word in my flags'
 * line) are always copied. */
static void copy_streaming(char *d, const char *src, size_t n);

/* the lower median of the n (<= EXPLORE_CALLS / 2) times in t, sorted in place */
static int64_t median_ns(int64_t *t, int64_t n) {
    for (int64_t i = 1; i < n; i++)
        for (int64_t j = i; j > 0 && t[j - 1] > t[j]; j--) {
            int64_t v = t[j];
            t[j] = t[j - 1];
            t[j - 1] = v;
        }
    return t[(n - 1) / 2];
}

/* n bytes of my input into my stage, the way stage_way chose (1: streaming stores, fenced) */
static inline void write_stage(int way, char *d, const char *src, size_t n) {
    if (way)
        copy_streaming(d, src, n);
    else
        memcpy(d, src, n);
}

/* the way this staged run writes its stage (1: streaming stores), and whether it is timed */
static int stage_way(Replay *self, int *timed) {
    *timed = 0;
    if (self->nbytes < STREAM_STAGE_MIN)
        return 0;
    int64_t k = self->staged_runs++ % EXPLORE_EVERY, half = EXPLORE_CALLS / 2;
    if (k < EXPLORE_CALLS) { /* half the window each way, the first runs of each not timed */
        *timed = k % half >= SETTLE_CALLS;
        return k >= half;
    }
    if (self->way_calls[0] > 0 && self->way_calls[1] > 0) /* a window ended: streaming */
        self->streamed = /* where clearly faster (memcpy the default) */
            median_ns(self->way_ns[1], self->way_calls[1]) * STREAM_MARGIN_DEN <
            median_ns(self->way_ns[0], self->way_calls[0]) * STREAM_MARGIN_NUM;
    else if (k == EXPLORE_CALLS && self->staged_runs <= EXPLORE_EVERY)
        /* the first window timed too few runs (a peer still starting, a broadcast's reader
         * slower than the spin): the next one comes RETRY_AFTER runs later, not a whole
         * period */
        self->staged_runs = EXPLORE_EVERY - RETRY_AFTER;
    self->way_calls[0] = self->way_calls[1] = 0;
    return self->streamed;
}

/* run(s, x, shm_word, out, record=False) -> 0, 1, 2 or 3 (see the module's docstring) */
/* one run of call s (Replay.run's arguments, parsed): the answer, or -1 with an error set */
static int replay_once(Replay *self, int64_t s, PyObject *xobj, int64_t shm_word,
                       PyObject *outobj, int record) {
    self->slot = -1;
    if (self->closed || self->input_objs == NULL) {
        self->answers[UNTOUCHED]++;
        return UNTOUCHED; /* the Python replay sets the inputs */
    }
    Py_buffer xv = {0}, ov;
    int have_x = xobj != Py_None, x_view = 0;
    const char *xsrc = NULL;
    if (have_x && PyLong_CheckExact(xobj)) {
        /* the address of nbytes of this process's heap (a small zero-copy input, staged:
         * cheaper than waiting for the peers' DONE) */
        xsrc = (const char *)PyLong_AsVoidPtr(xobj);
        if (xsrc == NULL)
            return PyErr_Occurred() ? -1 : UNTOUCHED;
    } else if (have_x) {
        if (PyObject_GetBuffer(xobj, &xv, PyBUF_C_CONTIGUOUS) < 0) {
            PyErr_Clear(); /* not contiguous: the Python replay copies it */
            self->answers[UNTOUCHED]++;
            return UNTOUCHED;
        }
        if (xv.len != self->nbytes) {
            PyBuffer_Release(&xv);
            self->answers[UNTOUCHED]++;
            return UNTOUCHED;
        }
        x_view = 1;
        xsrc = (const char *)xv.buf;
    }
    if (PyObject_GetBuffer(outobj, &ov, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) {
        PyErr_Clear();
        if (x_view)
            PyBuffer_Release(&xv);
        self->answers[UNTOUCHED]++;
        return UNTOUCHED;
    }
    char *out = (char *)ov.buf;
    int code = UNTOUCHED, way = 0, timed = 0;
    int64_t t0 = 0;
    if (ov.len != self->out_bytes)
        goto end;
    for (Py_ssize_t r = 0; r < self->nranks; r++) {
        /* out overlaps an input: Python's job (a temporary), except a copy's own source,
         * which is already the result, and an input a copy never reads */
        char *in = self->inputs[r];
        if (self->mode == M_COPY_ONE && (r != self->root || in == out))
            continue;
        if (out < in + self->nbytes && in < out + self->out_bytes)
            goto end;
    }
    if (record)
        self->slot = flight_begin(&self->ring, &self->proto, self->counter, 1);
    if (!spin_all(self->peers, self->npeers, self->done, s - 1, self->spin_ns))
        goto end; /* my stage may still be read: the Python replay waits */
    /* whether peers read my input: not a broadcast's non-root's (it stages nothing and
     * awaits no DONE) */
    int read = self->mode != M_COPY_ONE || self->words[self->root] == self->mine;
    Py_ssize_t chunk = self->chunk, nchunks = chunk ? (self->nbytes + chunk - 1) / chunk : 0;
    if (have_x && read && chunk && self->spin_ns > 0) {
        /* a broadcast's root stages chunk by chunk after READY, counting them in PROG
         * (reset first): its readers copy each chunk as it lands (the copies overlap) */
        self->mine[self->src] = self->stage_word;
        __atomic_store_n(self->mine + self->prog, 0, __ATOMIC_RELAXED);
        way = stage_way(self, &timed);
        t0 = timed ? now_ns() : 0;
        store_release(self->mine + self->ready, s);
        for (Py_ssize_t c = 0; c < nchunks; c++) {
            Py_ssize_t at = c * chunk, len = self->nbytes - at < chunk ? self->nbytes - at : chunk;
            /* (each chunk's streaming stores fenced before its PROG) */
            write_stage(way, self->stage + at, xsrc + at, (size_t)len);
            store_release(self->mine + self->prog, c + 1);
        }
    } else {
        if (have_x) {
            if (read) {
                way = stage_way(self, &timed);
                t0 = timed ? now_ns() : 0;
                write_stage(way, self->stage, xsrc, (size_t)self->nbytes);
            }
            self->mine[self->src] = self->stage_word;
        } else {
            self->mine[self->src] = shm_word;
        }
        if (read && chunk) /* (a zero-copy input, a crowded node: all of it, before READY) */
            __atomic_store_n(self->mine + self->prog, nchunks, __ATOMIC_RELAXED);
        store_release(self->mine + self->ready, s);
    }
    code = AFTER_READY;
    /* my own input is read from x rather than from my stage, which my peers are reading
     * meanwhile: the stage's lines, fresh in my cache, move to a reader's and back again
     * if I read them too (2 ranks, 1 MiB: docs/benchmarks.md, "tenth pass"); where out
     * overlaps x, from my stage (a broadcast's root in place copies nothing) */
    const char *own = have_x && (out >= xsrc + self->nbytes || xsrc >= out + self->out_bytes)
                          ? xsrc
                          : NULL;
    /* an all-reduce exactly in place (or a reduce-scatter into my shard of x) of up to
     * IN_PLACE_MAX bytes reads x too, block by block (reduce_in_place: 2 ranks, float32,
     * 1-16 KiB 1.1-1.9 -> 1.8-2.6x MPI; from 64 KiB the blocks' extra copy costs 2-3%) */
    int in_place = have_x && self->mode == M_REDUCE && self->type < T_F16 &&
                   self->out_bytes <= IN_PLACE_MAX &&
                   out == xsrc + self->lo * type_size[self->type];
    if (!spin_all(self->peers, self->npeers, self->ready, s, self->spin_ns) ||
        !sources_match(self)) {
        goto end;
    } else if (self->mode == M_COPY_ONE) {
        const char *from = read && own ? own : self->inputs[self->root]; /* (root: x) */
        if (chunk && out != from && !read) {
            /* each chunk once the root's PROG counts it (the Python replay waits for the
             * rest and copies it all, should the root be slower than the spin) */
            for (Py_ssize_t at = 0; at < self->nbytes;) {
                int64_t have = load_acquire(self->words[self->root] + self->prog);
                Py_ssize_t upto = have <= 0 ? 0 : (have >= nchunks ? self->nbytes : have * chunk);
                if (upto <= at) {
                    if (!spin_all(self->words + self->root, 1, self->prog, at / chunk + 1,
                                  self->spin_ns))
                        goto end;
                    continue;
                }
                memcpy(out + at, from + at, (size_t)(upto - at));
                at = upto;
            }
        } else if (out != from) {
            memcpy(out, from, (size_t)self->nbytes);
        }
    } else if (self->mode == M_CONCAT) {
        for (Py_ssize_t r = 0; r < self->nranks; r++)
            memcpy(out + r * self->nbytes, r == self->me && own ? own : self->inputs[r],
                   (size_t)self->nbytes);
    } else if (in_place ? !reduce_in_place(self, out)
                        : !reduce_part(self, out, own, self->lo, self->n)) {
        goto end;
    }
    store_release(self->mine + self->done, s);
    code = AFTER_DONE;
    if (!have_x && read && !spin_all(self->peers, self->npeers, self->done, s, self->spin_ns))
        goto end; /* the peers still read my SHMEMBuffer */
    code = DONE_ALL;
    /* a broadcast's root times its stage until its readers are done: their copies are what
     * the way changes (an all-reduce's or all-gather's every rank reads every stage) */
    if (timed && self->mode == M_COPY_ONE) /* (a crowded node: a few yields, spin_all) */
        timed = spin_all(self->peers, self->npeers, self->done, s, self->spin_ns);
    if (timed && self->way_calls[way] < EXPLORE_CALLS / 2)
        self->way_ns[way][self->way_calls[way]++] = now_ns() - t0;
    flight_end(&self->ring, self->slot, 0);
end:
    PyBuffer_Release(&ov);
    if (x_view)
        PyBuffer_Release(&xv);
    self->answers[code]++;
    return code;
}

static PyObject *Replay_run(Replay *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4 && nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "Replay.run(s, x, shm_word, out, record=False)");
        return NULL;
    }
    int64_t s = PyLong_AsLongLong(args[0]);
    int64_t shm_word = PyLong_AsLongLong(args[2]);
    if ((s == -1 || shm_word == -1) && PyErr_Occurred())
        return NULL;
    int code = replay_once(self, s, args[1], shm_word, args[3], nargs == 5 && args[4] == Py_True);
    return code < 0 ? NULL : PyLong_FromLong(code);
}

/* flight(ring, capacity, stream, op, nbytes, dtype): record every run in the flight
 * recorder's ring (shmem.flight's layout) as call op of stream */
static PyObject *Replay_flight(Replay *self, PyObject *args) {
    PyObject *ring;
    Py_ssize_t capacity, nbytes, dlen;
    int stream, op;
    const char *dtype;
    if (!PyArg_ParseTuple(args, "Oniiny#", &ring, &capacity, &stream, &op, &nbytes, &dtype,
                          &dlen))
        return NULL;
    if (self->closed || self->ring.words != NULL || capacity < 1 || stream < 0 ||
        stream >= FLIGHT_STREAMS || dlen > 12) {
        PyErr_SetString(PyExc_ValueError,
                        "Replay.flight: closed, already given a ring, or an argument out of "
                        "range");
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(ring, &view, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0)
        return NULL;
    if (flight_ring_init(&self->ring, (char *)view.buf, view.len, capacity) < 0) {
        PyBuffer_Release(&view);
        self->ring.words = NULL;
        PyErr_Format(PyExc_ValueError, "Replay.flight: a ring of %zd bytes holds no %zd records",
                     view.len, capacity);
        return NULL;
    }
    self->ring_view = view;
    self->counter = self->ring.counters + stream;
    memset(&self->proto, 0, sizeof self->proto);
    self->proto.nbytes = nbytes;
    self->proto.stream = stream;
    self->proto.op = (int16_t)op;
    self->proto.state = FLIGHT_PENDING;
    self->proto.peer = -1;
    memcpy(self->proto.dtype, dtype, (size_t)dlen);
    Py_RETURN_NONE;
}

static PyMemberDef Replay_members[] = {
    {"slot", T_LONGLONG, offsetof(Replay, slot), READONLY,
     "the flight record the last run began and left pending (-1: none)"},
    {NULL, 0, 0, 0, NULL},
};

static PyObject *Replay_close(Replay *self, PyObject *unused) {
    Replay_release(self);
    Py_RETURN_NONE;
}

static PyObject *Replay_answers(Replay *self, PyObject *unused) {
    return Py_BuildValue("(LLLL)", self->answers[0], self->answers[1], self->answers[2],
                         self->answers[3]);
}

static PyObject *Replay_staging(Replay *self, PyObject *unused) {
    (void)unused;
    return Py_BuildValue("(iLL)", self->streamed, (long long)self->way_calls[0],
                         (long long)self->way_calls[1]);
}

static PyMethodDef Replay_methods[] = {
    {"staging", (PyCFunction)Replay_staging, METH_NOARGS,
     "staging() -> (streamed, calls, streamed_calls): whether a staged input is written with "
     "streaming stores now, and the calls timed each way since the last choice."},
    {"answers", (PyCFunction)Replay_answers, METH_NOARGS,
     "answers() -> (done, untouched, after_ready, after_done): how many runs gave each."},
    {"run", (PyCFunction)(void (*)(void))Replay_run, METH_FASTCALL,
     "run(s, x, shm_word, out, record=False) -> int: replay call s with the numpy input x "
     "(an int: the address of the input, staged; None: a SHMEMBuffer published as shm_word) "
     "into out; 0 done, 1 nothing done, 2 READY raised, 3 DONE raised (the Python replay "
     "goes on from there); record: in the flight recorder's ring, if given one."},
    {"set_inputs", (PyCFunction)(void (*)(void))Replay_set_inputs, METH_FASTCALL,
     "set_inputs(expected, inputs): every rank's expected SRC word and input, in rank order."},
    {"flight", (PyCFunction)Replay_flight, METH_VARARGS,
     "flight(ring, capacity, stream, op, nbytes, dtype): record every run in the flight "
     "recorder's ring."},
    {"close", (PyCFunction)Replay_close, METH_NOARGS,
     "close(): forget every address; run returns 1 from now on."},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot Replay_slots[] = {
    {Py_tp_new, Replay_new},
    {Py_tp_dealloc, Replay_dealloc},
    {Py_tp_methods, Replay_methods},
    {Py_tp_members, Replay_members},
    {Py_tp_doc, "The C replay of one cached small all-reduce (see the module docstring)."},
    {0, NULL},
};

static PyType_Spec Replay_spec = {
    "collectives._replay.Replay", sizeof(Replay), 0, Py_TPFLAGS_DEFAULT, Replay_slots,
};

/* A remembered call: the engine's last replayed call of one kind (collectives.engines.host),
 * the same x, out and op again. Memo.replay(x, out, op) makes every step of that cached path
 * the Python replay makes before and after Replay.run, here: the same objects (op: or an
 * equal one), the guards (each (object, attribute, value): the attribute still is value,
 * the checks of the engine's memo that can change between calls: the channel not broken,
 * the scratch not grown, the plan not dropped, the World not finalized, a SHMEMBuffer not
 * closed), no SIG word of the previous call to check, then the channel's seq and
 * signature set, the run, and the channel's counters (calls, staged bytes, the
 * algorithm's). None: nothing done (the Python path takes the call); the result (result, or
 * a new array: make(*make_args)) when the run answered 0; else (answer, s, result): the Python replay goes on
 * from that answer (ReplayPlan.resume). */
typedef struct {
    PyObject_HEAD
    Replay *replay;
    PyObject *x, *out, *op; /* the key */
    PyObject *guards;       /* a tuple of (object, attribute name, value) */
    PyObject *ch;           /* the Channel: seq, sig_seq, signature, stats */
    PyObject *signature;
    PyObject *src;          /* Replay.run's x: an array, an address (int) or None */
    int64_t shm_word;
    PyObject *dst;          /* the result's flat view (None: a new array each call) */
    PyObject *result;       /* what a call with dst returns (out, or x itself) */
    PyObject *make, *make_args; /* the new array: make(*make_args) */
    Py_ssize_t staged;      /* the bytes a call that ran counts as staged */
    PyObject *name;         /* the algorithm the call counts under */
} Memo;

static PyTypeObject *replay_type;
static PyObject *s_seq, *s_sig_seq, *s_signature, *s_stats, *s_calls, *s_staged_bytes,
    *s_algorithms, *s_count;

static PyObject *Memo_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"replay", "x", "out", "op", "guards", "ch", "signature", "src",
                             "shm_word", "dst", "result", "make", "make_args", "staged", "name",
                             NULL};
    PyObject *replay, *x, *out, *op, *guards, *ch, *signature, *src, *dst, *result, *make,
        *make_args, *name;
    long long shm_word;
    Py_ssize_t staged;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!OOOO!OOOLOOOO!nU", kwlist, replay_type,
                                     &replay, &x, &out, &op, &PyTuple_Type, &guards, &ch,
                                     &signature, &src, &shm_word, &dst, &result, &make,
                                     &PyTuple_Type, &make_args, &staged, &name))
        return NULL;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(guards); i++) {
        PyObject *g = PyTuple_GET_ITEM(guards, i);
        if (!PyTuple_CheckExact(g) || PyTuple_GET_SIZE(g) != 3 ||
            !PyUnicode_Check(PyTuple_GET_ITEM(g, 1))) {
            PyErr_SetString(PyExc_TypeError, "Memo: each guard an (object, name, value) tuple");
            return NULL;
        }
    }
    Memo *self = (Memo *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    PyObject **fields[] = {(PyObject **)&self->replay, &self->x, &self->out, &self->op,
                           &self->guards, &self->ch, &self->signature, &self->src,
                           &self->result, &self->make, &self->make_args, &self->name};
    PyObject *values[] = {replay, x, out, op, guards, ch, signature, src, result, make,
                          make_args, name};
    for (size_t i = 0; i < sizeof values / sizeof values[0]; i++) {
        Py_INCREF(values[i]);
        *fields[i] = values[i];
    }
    self->dst = dst == Py_None ? NULL : dst;
    Py_XINCREF(self->dst);
    self->shm_word = shm_word;
    self->staged = staged;
    return (PyObject *)self;
}

static int Memo_traverse(Memo *self, visitproc visit, void *arg) {
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->replay);
    Py_VISIT(self->x);
    Py_VISIT(self->out);
    Py_VISIT(self->op);
    Py_VISIT(self->guards);
    Py_VISIT(self->ch);
    Py_VISIT(self->signature);
    Py_VISIT(self->src);
    Py_VISIT(self->dst);
    Py_VISIT(self->result);
    Py_VISIT(self->make);
    Py_VISIT(self->make_args);
    Py_VISIT(self->name);
    return 0;
}

static int Memo_clear(Memo *self) {
    Py_CLEAR(self->replay);
    Py_CLEAR(self->x);
    Py_CLEAR(self->out);
    Py_CLEAR(self->op);
    Py_CLEAR(self->guards);
    Py_CLEAR(self->ch);
    Py_CLEAR(self->signature);
    Py_CLEAR(self->src);
    Py_CLEAR(self->dst);
    Py_CLEAR(self->result);
    Py_CLEAR(self->make);
    Py_CLEAR(self->make_args);
    Py_CLEAR(self->name);
    return 0;
}

static void Memo_dealloc(Memo *self) {
    PyTypeObject *tp = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    Memo_clear(self);
    tp->tp_free((PyObject *)self);
    Py_DECREF(tp);
}

/* obj.name += by (an int attribute) */
static int add_to(PyObject *obj, PyObject *name, Py_ssize_t by) {
    PyObject *v = PyObject_GetAttr(obj, name);
    if (v == NULL)
        return -1;
    PyObject *step = PyLong_FromSsize_t(by);
    PyObject *sum = step == NULL ? NULL : PyNumber_Add(v, step);
    Py_DECREF(v);
    Py_XDECREF(step);
    if (sum == NULL)
        return -1;
    int rc = PyObject_SetAttr(obj, name, sum);
    Py_DECREF(sum);
    return rc;
}

/* an int attribute as int64 (-1 with an error set on failure) */
static int64_t int_attr(PyObject *obj, PyObject *name, int *failed) {
    PyObject *v = PyObject_GetAttr(obj, name);
    int64_t r = v == NULL ? -1 : PyLong_AsLongLong(v);
    Py_XDECREF(v);
    *failed = r == -1 && PyErr_Occurred();
    return r;
}

/* the call counted under the memo's algorithm: stats.algorithms[name] += 1 where it is
 * a mapping, else stats.count(name) */
static int count_algorithm(Memo *self, PyObject *stats) {
    PyObject *algos = PyObject_GetAttr(stats, s_algorithms);
    if (algos == NULL)
        return -1;
    int rc = -1;
    if (algos == Py_None) {
        PyObject *r = PyObject_CallMethodOneArg(stats, s_count, self->name);
        rc = r == NULL ? -1 : 0;
        Py_XDECREF(r);
    } else {
        PyObject *v = PyObject_GetItem(algos, self->name);
        PyObject *one = v == NULL ? NULL : PyLong_FromLong(1);
        PyObject *sum = one == NULL ? NULL : PyNumber_Add(v, one);
        if (sum != NULL)
            rc = PyObject_SetItem(algos, self->name, sum);
        Py_XDECREF(v);
        Py_XDECREF(one);
        Py_XDECREF(sum);
    }
    Py_DECREF(algos);
    return rc;
}

static PyObject *Memo_replay(Memo *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "Memo.replay(x, out, op)");
        return NULL;
    }
    if (self->replay == NULL || args[0] != self->x || args[1] != self->out)
        Py_RETURN_NONE;
    if (args[2] != self->op) {
        int eq = PyObject_RichCompareBool(args[2], self->op, Py_EQ);
        if (eq <= 0)
            return eq < 0 ? NULL : Py_NewRef(Py_None);
    }
    if (self->replay->closed)
        Py_RETURN_NONE;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(self->guards); i++) {
        PyObject *g = PyTuple_GET_ITEM(self->guards, i);
        PyObject *v = PyObject_GetAttr(PyTuple_GET_ITEM(g, 0), PyTuple_GET_ITEM(g, 1));
        if (v == NULL)
            return NULL;
        int holds = v == PyTuple_GET_ITEM(g, 2);
        Py_DECREF(v);
        if (!holds)
            Py_RETURN_NONE;
    }
    int failed;
    int64_t seq = int_attr(self->ch, s_seq, &failed);
    if (failed)
        return NULL;
    int64_t sig_seq = int_attr(self->ch, s_sig_seq, &failed);
    if (failed)
        return NULL;
    if (sig_seq == seq) /* the previous call published its SIG word: Python checks it */
        Py_RETURN_NONE;
    PyObject *res, *dst = self->dst;
    if (dst == NULL) {
        res = PyObject_Vectorcall(self->make, &PyTuple_GET_ITEM(self->make_args, 0),
                                  (size_t)PyTuple_GET_SIZE(self->make_args), NULL);
        if (res == NULL)
            return NULL;
        dst = res;
    } else {
        res = Py_NewRef(self->result);
    }
    int64_t s = seq + 1;
    PyObject *s_obj = PyLong_FromLongLong(s), *stats = NULL;
    if (s_obj == NULL || PyObject_SetAttr(self->ch, s_seq, s_obj) < 0 ||
        PyObject_SetAttr(self->ch, s_signature, self->signature) < 0)
        goto fail;
    int code = replay_once(self->replay, s, self->src, self->shm_word, dst, 1);
    if (code < 0 || (stats = PyObject_GetAttr(self->ch, s_stats)) == NULL)
        goto fail;
    if (code != UNTOUCHED && self->staged && add_to(stats, s_staged_bytes, self->staged) < 0)
        goto fail;
    if (code != DONE_ALL) {
        Py_DECREF(stats);
        Py_DECREF(s_obj);
        return Py_BuildValue("(iLN)", code, (long long)s, res);
    }
    if (add_to(stats, s_calls, 1) < 0 || count_algorithm(self, stats) < 0)
        goto fail;
    Py_DECREF(stats);
    Py_DECREF(s_obj);
    return res;
fail:
    Py_XDECREF(stats);
    Py_XDECREF(s_obj);
    Py_DECREF(res);
    return NULL;
}

static PyMethodDef Memo_methods[] = {
    {"replay", (PyCFunction)(void (*)(void))Memo_replay, METH_FASTCALL,
     "replay(x, out, op) -> None, the result, or (answer, s, result): see the type."},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot Memo_slots[] = {
    {Py_tp_new, Memo_new},
    {Py_tp_dealloc, Memo_dealloc},
    {Py_tp_traverse, Memo_traverse},
    {Py_tp_clear, Memo_clear},
    {Py_tp_methods, Memo_methods},
    {Py_tp_doc, "A remembered call, replayed with the engine's checks in C (see Memo_replay)."},
    {0, NULL},
};

static PyType_Spec Memo_spec = {
    "collectives._replay.Memo", sizeof(Memo), 0, Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    Memo_slots,
};

/* reduce_wide(out, inputs, type, op, count) -> bool: out (float16/bfloat16, C-contiguous) =
 * the rank-order sum or product of inputs (a list of buffers of out's size) in float32 (an
 * average: the sum divided by count), rounded once; False where a NaN or a flag numpy would
 * raise is met (out partly written: numpy's to compute again, so out must overlap no input),
 * with the GIL released while it reduces */
static PyObject *module_reduce_wide(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 5 || !PyList_CheckExact(args[1]) || PyList_GET_SIZE(args[1]) < 1) {
        PyErr_SetString(PyExc_TypeError,
                        "reduce_wide(out, inputs, type, op, count): inputs a list");
        return NULL;
    }
    int type = PyLong_AsLong(args[2]), op = PyLong_AsLong(args[3]);
    Py_ssize_t count = PyLong_AsSsize_t(args[4]);
    if (PyErr_Occurred())
        return NULL;
    if ((type != T_F16 && type != T_BF16) || (op != OP_SUM && op != OP_PROD && op != OP_AVG) ||
        count < 1) {
        PyErr_SetString(PyExc_ValueError, "reduce_wide: a type, op or count out of range");
        return NULL;
    }
    Py_ssize_t nin = PyList_GET_SIZE(args[1]);
    Py_buffer ov;
    if (PyObject_GetBuffer(args[0], &ov, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0)
        return NULL;
    Py_buffer *views = PyMem_Calloc((size_t)nin, sizeof(Py_buffer));
    char **in = PyMem_Calloc((size_t)nin + 1, sizeof(char *));
    Py_ssize_t got = 0;
    int ok = -1;
    if (views == NULL || in == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (; got < nin; got++) {
        if (PyObject_GetBuffer(PyList_GET_ITEM(args[1], got), &views[got], PyBUF_C_CONTIGUOUS) < 0)
            goto done;
        if (views[got].len != ov.len) {
            got++;
            PyErr_SetString(PyExc_ValueError, "reduce_wide: an input of another size than out");
            goto done;
        }
        in[got] = (char *)views[got].buf;
    }
    Py_BEGIN_ALLOW_THREADS
    feclearexcept(FE_ALL_EXCEPT);
    ok = reduce_wide(type, op, (char *)ov.buf, in, nin, ov.len / 2, count) &&
         !fetestexcept(FE_INVALID | FE_OVERFLOW | FE_UNDERFLOW | FE_DIVBYZERO);
    Py_END_ALLOW_THREADS
done:
    for (Py_ssize_t i = 0; i < got; i++)
        PyBuffer_Release(&views[i]);
    PyMem_Free(views);
    PyMem_Free(in);
    PyBuffer_Release(&ov);
    if (ok < 0)
        return NULL;
    return PyBool_FromLong(ok);
}

/* stream_copy(dst, src): copy the bytes of src (C-contiguous) into dst (C-contiguous,
 * writable, as long) with non-temporal stores where the CPU has them (x86-64), the GIL
 * released: a large stage a peer is about to read goes to memory instead of filling this
 * core's cache with lines the peer must then pull across (the caller's threshold:
 * collectives.ops.STREAM_MIN) */
static void copy_streaming(char *d, const char *src, size_t n) {
#if defined(__x86_64__)
    size_t head = (size_t)(-(uintptr_t)d & 15);
    if (head > n)
        head = n;
    memcpy(d, src, head);
    d += head, src += head, n -= head;
    for (; n >= 64; n -= 64, d += 64, src += 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)src);
        __m128i b = _mm_loadu_si128((const __m128i *)(src + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(src + 32));
        __m128i e = _mm_loadu_si128((const __m128i *)(src + 48));
        _mm_stream_si128((__m128i *)d, a);
        _mm_stream_si128((__m128i *)(d + 16), b);
        _mm_stream_si128((__m128i *)(d + 32), c);
        _mm_stream_si128((__m128i *)(d + 48), e);
    }
    memcpy(d, src, n);
    _mm_sfence(); /* the streaming stores before any later store (the caller's READY) */
#else
    memcpy(d, src, n);
#endif
}

static PyObject *module_stream_copy(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "stream_copy(dst, src): two buffers");
        return NULL;
    }
    Py_buffer dv, sv;
    if (PyObject_GetBuffer(args[0], &dv, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0)
        return NULL;
    if (PyObject_GetBuffer(args[1], &sv, PyBUF_C_CONTIGUOUS) < 0) {
        PyBuffer_Release(&dv);
        return NULL;
    }
    PyObject *res = NULL;
    if (dv.len != sv.len) {
        PyErr_Format(PyExc_ValueError, "stream_copy: dst has %zd bytes, src %zd", dv.len,
                     sv.len);
    } else if ((char *)dv.buf < (char *)sv.buf + sv.len &&
               (char *)sv.buf < (char *)dv.buf + dv.len) {
        PyErr_SetString(PyExc_ValueError, "stream_copy: dst and src overlap");
    } else {
        Py_BEGIN_ALLOW_THREADS
        copy_streaming((char *)dv.buf, (const char *)sv.buf, (size_t)dv.len);
        Py_END_ALLOW_THREADS
        res = Py_NewRef(Py_None);
    }
    PyBuffer_Release(&sv);
    PyBuffer_Release(&dv);
    return res;
}

static PyMethodDef module_methods[] = {
    {"stream_copy", (PyCFunction)(void (*)(void))module_stream_copy, METH_FASTCALL,
     "stream_copy(dst, src): src's bytes into dst (as long, neither overlapping the other) "
     "with non-temporal stores, the GIL released."},
    {"reduce_wide", (PyCFunction)(void (*)(void))module_reduce_wide, METH_FASTCALL,
     "reduce_wide(out, inputs, type, op, count) -> bool: float16/bfloat16 in float32"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "collectives._replay",
    "The cached small all-reduce, replayed out of Python (see collectives.allreduce).", -1,
    module_methods,
};

PyMODINIT_FUNC PyInit__replay(void) {
    PyObject *m = PyModule_Create(&module_def);
    if (m == NULL)
        return NULL;
    PyObject *t = PyType_FromSpec(&Replay_spec);
    if (t == NULL || PyModule_AddObject(m, "Replay", Py_NewRef(t)) < 0) {
        Py_XDECREF(t);
        Py_DECREF(m);
        return NULL;
    }
    replay_type = (PyTypeObject *)t; /* (the module's reference keeps it) */
    Py_DECREF(t);
    PyObject **names[] = {&s_seq, &s_sig_seq, &s_signature, &s_stats, &s_calls,
                          &s_staged_bytes, &s_algorithms, &s_count};
    const char *texts[] = {"seq", "sig_seq", "signature", "stats", "calls", "staged_bytes",
                           "algorithms", "count"};
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++)
        if (*names[i] == NULL && (*names[i] = PyUnicode_InternFromString(texts[i])) == NULL) {
            Py_DECREF(m);
            return NULL;
        }
    PyObject *mt = PyType_FromSpec(&Memo_spec);
    if (mt == NULL || PyModule_AddObject(m, "Memo", mt) < 0) {
        Py_XDECREF(mt);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
