/* Streams that run later (FAKE_ASYNC=1), for the fake libcuda (tests/fakegpu/README.md).
 *
 * Without it every kernel, copy and fill runs inside the call that queues it, so a host read
 * that forgets to wait for its stream still sees the result. With FAKE_ASYNC=1 each stream
 * has a worker thread that runs its queue in order, each operation after a random delay of 0
 * to 2 x FAKE_ASYNC_DELAY_US (default 2000) microseconds (seeded by FAKE_ASYNC_SEED), as a
 * busy GPU would: reading a result before synchronizing then sees stale memory, and work on
 * two streams runs in either order unless an event orders it, which the tests catch.
 * FAKE_ASYNC=lazy is the adversarial order: a stream's work runs only when something waits
 * for it (a synchronize, an event, another stream, a pageable copy), or FAKE_ASYNC_LAZY_MS
 * (default 100) after it was queued, so ranks that wait for each other's kernels without a
 * host synchronize still progress; a missing wait then fails every time, not by chance. What CUDA orders is kept: a stream's own
 * order; cuStreamSynchronize, cuCtxSynchronize, events (record, synchronize, query, a stream
 * waiting for one); the legacy default stream against blocking streams (both ways); copies
 * from or to pageable host memory (memory the fake did not allocate) wait for their stream
 * and run in the call, as CUDA's do. Only operations a GPU could run earlier are delayed, so
 * a fault found this way is a fault on a GPU too.
 */
#include <pthread.h>

#define FA_SLOTS 48  /* kernel parameters a queued launch keeps (8 bytes each at most) */

typedef struct FQ FQ;
typedef struct FOp {
    int kind;  /* 0 kernel, 1 copy, 2 fill (8/16/32-bit, 2-D), 3 wait for (queue, position),
                  4 host function (cuLaunchHostFunc) */
    void (*fn)(void*); void* data;
    CUlaunchConfig cfg; void* f; uint64_t vals[FA_SLOTS]; void* slots[FA_SLOTS];
    uintptr_t dst, src; size_t n, pitch, w, h; unsigned v; int width;
    FQ* on; uint64_t at; uint64_t queued_ns; int dev;
    struct FOp* next;
} FOp;
struct FQ {
    pthread_mutex_t mu; pthread_cond_t cv; FOp *head, *tail; uint64_t queued, done;
    int started, nonblocking, legacy; unsigned seed; uint64_t demand; void* ctx;
};
typedef struct { FQ* q; uint64_t at; } FEvent;

static int fa_on = -1, fa_lazy; static unsigned fa_delay_us = 2000, fa_seed = 1, fa_lazy_ms = 100;
static int fa_enabled(void) {
    if (fa_on < 0) {
        const char* e = getenv("FAKE_ASYNC"); fa_lazy = e && !strcmp(e, "lazy"); fa_on = e && (!strcmp(e, "1") || fa_lazy);
        const char* l = getenv("FAKE_ASYNC_LAZY_MS"); if (l) fa_lazy_ms = (unsigned)atoi(l);
        const char* d = getenv("FAKE_ASYNC_DELAY_US"); if (d) fa_delay_us = (unsigned)atoi(d);
        const char* r = getenv("FAKE_ASYNC_SEED"); if (r) fa_seed = (unsigned)atoi(r);
    }
    return fa_on;
}
static pthread_mutex_t fa_reg = PTHREAD_MUTEX_INITIALIZER;
static FQ* fa_all[4096]; static int fa_nall;
static __thread int fa_launch_dev = -1;  /* a worker runs a kernel as on its launch's device */
/* the legacy default stream: one per context (device); the per-thread one: per host thread */
static FQ fa_legacy[16]; static pthread_once_t fa_legacy_once = PTHREAD_ONCE_INIT;
static void fa_legacy_init(void) {
    for (int i = 0; i < 16; i++) {
        pthread_mutex_init(&fa_legacy[i].mu, 0); pthread_cond_init(&fa_legacy[i].cv, 0);
        fa_legacy[i].legacy = 1; fa_legacy[i].ctx = (char*)&g_ctx_dummy + i;
    }
}
static __thread FQ* fa_per_thread;

/* a created stream: the context first (as chk_stream reads it), then its queue */
typedef struct { void* ctx; FQ q; } FStream;
static void fa_register(FQ* q);
static FQ* fa_queue(void* s) {
    if (s == 0 || s == (void*)1) {
        pthread_once(&fa_legacy_once, fa_legacy_init);
        int d = (int)((char*)g_cur - (char*)&g_ctx_dummy); if (d < 0 || d >= 16) d = 0;
        return &fa_legacy[d];
    }
    if (s == (void*)2) {
        if (!fa_per_thread) {
            FQ* q = calloc(1, sizeof(FQ)); pthread_mutex_init(&q->mu, 0); pthread_cond_init(&q->cv, 0);
            q->ctx = g_cur; fa_register(q); fa_per_thread = q;
        }
        return fa_per_thread;
    }
    return &((FStream*)s)->q;
}
static void fa_register(FQ* q) {
    pthread_mutex_lock(&fa_reg);
    if (fa_nall < 4096) fa_all[fa_nall++] = q;
    pthread_mutex_unlock(&fa_reg);
}

/* the registered queues, copied under the registry's lock */
static int fa_snapshot(FQ** all) {
    pthread_mutex_lock(&fa_reg); int n = fa_nall; memcpy(all, fa_all, sizeof(FQ*) * (size_t)n); pthread_mutex_unlock(&fa_reg);
    return n;
}
static CUresult run_kernel(const CUlaunchConfig* c, void* f, void** params);
static uint64_t fa_now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec; }
/* something waits for q's first ``at`` operations: run them now (lazy mode) */
static void fa_demand(FQ* q, uint64_t at) {
    pthread_mutex_lock(&q->mu);
    if (q->demand < at) { q->demand = at; pthread_cond_broadcast(&q->cv); }
    pthread_mutex_unlock(&q->mu);
}
static void fa_run(FOp* op) {
    if (op->kind == 0) { fa_launch_dev = op->dev; run_kernel(&op->cfg, op->f, op->slots); fa_launch_dev = -1; return; }
    if (op->kind == 1) { memcpy((void*)op->dst, (const void*)op->src, op->n); return; }
    if (op->kind == 4) { op->fn(op->data); return; }
    if (op->kind == 2) {
        for (size_t r = 0; r < op->h; r++) {
            char* row = (char*)op->dst + r * op->pitch;
            for (size_t i = 0; i < op->w; i++) {
                if (op->width == 1) ((unsigned char*)row)[i] = (unsigned char)op->v;
                else if (op->width == 2) ((unsigned short*)row)[i] = (unsigned short)op->v;
                else ((unsigned*)row)[i] = op->v;
            }
        }
        return;
    }
    FQ* q = op->on;  /* 3: wait until queue q has run ``at`` operations */
    fa_demand(q, op->at);
    pthread_mutex_lock(&q->mu);
    while (q->done < op->at) pthread_cond_wait(&q->cv, &q->mu);
    pthread_mutex_unlock(&q->mu);
}
static void* fa_worker(void* arg) {
    FQ* q = arg;
    for (;;) {
        pthread_mutex_lock(&q->mu);
        while (!q->head) pthread_cond_wait(&q->cv, &q->mu);
        FOp* op = q->head;
        if (fa_lazy && op->kind != 3) {  /* until someone waits for it, or its time is up */
            uint64_t due = op->queued_ns + (uint64_t)fa_lazy_ms * 1000000ull;
            while (q->demand <= q->done && fa_now() < due) {
                struct timespec t; clock_gettime(CLOCK_REALTIME, &t);
                t.tv_nsec += 5000000; if (t.tv_nsec >= 1000000000L) { t.tv_sec++; t.tv_nsec -= 1000000000L; }
                pthread_cond_timedwait(&q->cv, &q->mu, &t);
            }
        }
        pthread_mutex_unlock(&q->mu);
        if (op->kind != 3 && fa_delay_us && !fa_lazy) {
            long us = (long)(rand_r(&q->seed) % (2u * fa_delay_us + 1u));
            struct timespec t = {us / 1000000L, (us % 1000000L) * 1000L}; nanosleep(&t, 0);
        }
        fa_run(op);
        pthread_mutex_lock(&q->mu);
        q->head = op->next; if (!q->head) q->tail = 0;
        q->done++;
        pthread_cond_broadcast(&q->cv);
        pthread_mutex_unlock(&q->mu);
        free(op);
    }
    return 0;
}
static uint64_t fa_position(FQ* q) {
    pthread_mutex_lock(&q->mu); uint64_t at = q->queued; pthread_mutex_unlock(&q->mu); return at;
}
static void fa_push(FQ* q, FOp* op) {
    pthread_mutex_lock(&q->mu);
    if (!q->started) {
        pthread_t th; pthread_attr_t a; pthread_attr_init(&a);
        pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
        static unsigned made; q->seed = fa_seed * 2654435761u + (made++);
        pthread_create(&th, &a, fa_worker, q); pthread_attr_destroy(&a);
        q->started = 1;
        if (q->legacy) { pthread_mutex_unlock(&q->mu); fa_register(q); pthread_mutex_lock(&q->mu); }
    }
    op->next = 0; op->queued_ns = fa_now();
    if (q->tail) q->tail->next = op; else q->head = op;
    q->tail = op; q->queued++;
    pthread_cond_broadcast(&q->cv);
    pthread_mutex_unlock(&q->mu);
}
static void fa_wait_for(FQ* q, FQ* on, uint64_t at) {  /* queue a wait: q runs after on's first ``at`` */
    if (on == q || at == 0) return;
    FOp* w = calloc(1, sizeof(FOp)); w->kind = 3; w->on = on; w->at = at; fa_push(q, w);
}
/* the legacy default stream and the blocking streams of its context wait for each other's
   earlier work */
static void fa_implicit(FQ* q) {
    if (q->nonblocking) return;
    if (q->legacy) {
        FQ* all[4096]; int n = fa_snapshot(all);
        for (int i = 0; i < n; i++)
            if (all[i] != q && !all[i]->nonblocking && !all[i]->legacy && all[i]->ctx == q->ctx)
                fa_wait_for(q, all[i], fa_position(all[i]));
    } else {
        pthread_once(&fa_legacy_once, fa_legacy_init);
        for (int i = 0; i < 16; i++)
            if (fa_legacy[i].ctx == q->ctx) fa_wait_for(q, &fa_legacy[i], fa_position(&fa_legacy[i]));
    }
}
static void fa_enqueue(void* s, FOp* op) { FQ* q = fa_queue(s); fa_implicit(q); fa_push(q, op); }
static void fa_drain_upto(FQ* q, uint64_t at);
static void fa_drain(FQ* q) { fa_drain_upto(q, fa_position(q)); }  /* what was queued by now */
static void fa_drain_upto(FQ* q, uint64_t at) {
    fa_demand(q, at);
    pthread_mutex_lock(&q->mu);
    while (q->done < at) pthread_cond_wait(&q->cv, &q->mu);
    pthread_mutex_unlock(&q->mu);
}
static void fa_drain_all(void) {  /* the current context's streams */
    FQ* all[4096]; int n = fa_snapshot(all);
    for (int i = 0; i < n; i++) if (all[i]->ctx == g_cur) fa_drain(all[i]);
}
