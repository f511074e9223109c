/* A stand-in libnvshmem_host.so.3 for the real nvshmem4py over the fake libcuda
 * (tests/fakegpu/README.md, "The NVSHMEM stand-in").
 *
 * It implements the host entry points nvshmem4py calls for what this project uses, with
 * NVSHMEM's semantics where the project can observe them:
 *
 * - Bootstrap by unique id: nvshmemx_get_uniqueid makes a small shared block (a memfd) and
 *   names it in the id (pid, fd, a nonce); every PE of nvshmemx_hostlib_init_attr maps it
 *   through /proc/<pid>/fd and meets the others there. Barriers are counters in that block;
 *   a PE that waits for one that has exited, or longer than FAKE_NVSHMEM_TIMEOUT_S (300),
 *   says so and exits, where NVSHMEM would hang.
 * - The symmetric heap: one memfd per PE of NVSHMEM_SYMMETRIC_SIZE bytes (1 GiB unset; read
 *   as NVSHMEM reads it), mapped by every PE. nvshmem_malloc/free are collective (the sizes
 *   are compared between PEs), first fit, 512-byte aligned; a heap too small gives NULL.
 * - Nodes: PEs with the same host name share a node; FAKE_NVSHMEM_NODE_SPLIT ("rank", or K
 *   consecutive PEs) simulates several nodes on one machine, as the project's node_split.
 *   nvshmem_ptr gives a pointer only to PEs of this node; for the others data moves through
 *   nvshmemx_{put,get}mem[_signal][_nbi]_on_stream and nvshmemx_signal_op_on_stream, done as
 *   a network would: through the peer's mapping, when the stream reaches them (a host
 *   function on the stream, cuLaunchHostFunc of the fake), from and into local memory the
 *   library knows (its heap, or a registered buffer) only.
 * - Atomicity: NVSHMEM's signal operations on one word are atomic with each other, from
 *   any PE (each takes a lock of the target PE); they are not atomic with a GPU's own atomics
 *   on that word when a network does them: a network atomic is read, wait
 *   FAKE_NVSHMEM_NIC_US (50), write, so an atomic of the project's own kernels between the
 *   read and the write is lost, as it can be on a real NIC.
 * - LIMITED_MPG: PEs of one node on one device (FAKE_GPUS=1 in the fake libcuda).
 * - Refusals, each a line "fake nvshmem: REFUSED <function>: <why>" and exit(-1), as
 *   NVSHMEM's fatal errors: a call before init or after finalize, a call made while another
 *   device is current (NVSHMEM would run it on the wrong context), an address outside the
 *   symmetric heap where one is required, a local buffer the library does not know for a
 *   PE on another node, an unknown signal operation, a free of a pointer it did not give.
 *
 * - Registration (nvshmemx_buffer_register_symmetric, collective): the buffer becomes local
 *   memory a network transfer may use; it is not made symmetric (peers cannot address it).
 *
 * What it does not model: network timing, transport errors, a GPU's weaker memory order
 * (x86 orders stores more strongly), NVSHMEM's own collectives (not exported: nvshmem4py
 * reports them as not found), teams, device-side NVSHMEM, symmetric registered buffers.
 *
 * fake_nvshmem_calls() gives the entry points called so far (for the tests).
 */
#define _GNU_SOURCE 1
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define MAX_PES 64
#define MAX_BLOCKS 4096
#define MAX_REGISTERED 64
#define ALIGN 512
#define UID_MAGIC 0x4b41465f4d454853ull /* "SHEM_FAK" */

/* nvshmem4py's structures (nvshmem/bindings/cynvshmem.pxd) */
typedef struct { int version; char internal[124]; } nvshmemx_uniqueid_t;
typedef struct { int version; nvshmemx_uniqueid_t* id; int myrank; int nranks; } uid_args_t;
typedef struct { int version; uid_args_t uid_args; int cuda_device_id; char content[92]; } init_args_t;
typedef struct { int version; void* mpi_comm; init_args_t args; } init_attr_t;
typedef struct { uint64_t magic; int32_t pid, fd; uint64_t nonce; } uid_body_t;

enum { STATUS_NOT_INITIALIZED = 0, STATUS_IS_INITIALIZED = 2, STATUS_LIMITED_MPG = 3 };
enum { SIGNAL_SET = 9, SIGNAL_ADD = 10 };
enum { INIT_WITH_UNIQUEID = 1 << 3 };

/* the shared block every PE maps */
typedef struct {
    int pid, heap_fd, dev, joined;
    uint64_t nonce;
    char host[96];
    uint64_t msize[2]; /* the size of malloc number k, in msize[k & 1] */
} pe_slot_t;
typedef struct {
    uint64_t nonce;
    _Atomic uint64_t arrivals; /* barrier arrivals, ever */
    _Atomic int nic[MAX_PES];  /* each PE's NIC: one atomic at a time */
    pe_slot_t pe[MAX_PES];
} boot_t;

typedef struct { size_t off, size; int used; } block_t;
typedef struct { uintptr_t p; size_t n; } range_t;

static struct {
    int status, me, npes, dev, finalized;
    boot_t* boot; int boot_fd; /* the block of the id this process made (rank 0) */
    char* heap; size_t heap_size; int heap_fd;
    char* peer[MAX_PES]; int same_node[MAX_PES];
    block_t blocks[MAX_BLOCKS]; int nblocks; size_t in_use;
    range_t registered[MAX_REGISTERED]; int nregistered;
    uint64_t mallocs, barriers;
    pthread_mutex_t mu;
} S = {.boot_fd = -1, .heap_fd = -1, .mu = PTHREAD_MUTEX_INITIALIZER};

/* -- the fake driver's entry points ------------------------------------------------------- */

typedef int (*ctx_get_device_t)(int*);
typedef int (*launch_host_func_t)(void*, void (*)(void*), void*);
typedef void (*track_t)(uintptr_t, size_t, int);
typedef void (*untrack_t)(uintptr_t, size_t);
static ctx_get_device_t p_ctx_get_device;
static launch_host_func_t p_launch_host_func;
static track_t p_track;
static untrack_t p_untrack;

static void refuse(const char* fn, const char* fmt, ...) __attribute__((noreturn, format(printf, 2, 3)));
static void refuse(const char* fn, const char* fmt, ...) {
    char why[512];
    va_list ap; va_start(ap, fmt); vsnprintf(why, sizeof why, fmt, ap); va_end(ap);
    fprintf(stderr, "fake nvshmem: REFUSED %s: %s (PE %d)\n", fn, why, S.me);
    fflush(stderr);
    _exit(255); /* NVSHMEM's fatal errors: exit(-1) */
}

static void driver(void) {
    if (p_ctx_get_device) return;
    void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (!h) refuse("init", "the fake libcuda.so.1 is not loadable: %s", dlerror());
    p_ctx_get_device = (ctx_get_device_t)dlsym(h, "cuCtxGetDevice");
    p_launch_host_func = (launch_host_func_t)dlsym(h, "cuLaunchHostFunc");
    p_track = (track_t)dlsym(h, "fakegpu_track");
    p_untrack = (untrack_t)dlsym(h, "fakegpu_untrack");
    if (!p_ctx_get_device || !p_launch_host_func || !p_track || !p_untrack)
        refuse("init", "libcuda.so.1 is not the fake driver (tests/fakegpu/fake_libcuda.c)");
}

/* -- the calls made ----------------------------------------------------------------------- */

static char g_calls[1 << 16]; static size_t g_ncalls; static char g_last[64];
static void called(const char* fn) {
    pthread_mutex_lock(&S.mu);
    if (strcmp(fn, g_last) != 0) { /* a run of one call is recorded once */
        size_t n = strlen(fn);
        if (g_ncalls + n + 2 < sizeof g_calls) {
            if (g_ncalls) g_calls[g_ncalls++] = ' ';
            memcpy(g_calls + g_ncalls, fn, n); g_ncalls += n; g_calls[g_ncalls] = 0;
        }
        snprintf(g_last, sizeof g_last, "%s", fn);
    }
    pthread_mutex_unlock(&S.mu);
}
const char* fake_nvshmem_calls(void) { return g_calls; }

/* -- checks ------------------------------------------------------------------------------- */

static void initialized(const char* fn) {
    called(fn);
    if (S.status == STATUS_NOT_INITIALIZED)
        refuse(fn, S.finalized ? "called after nvshmemx_hostlib_finalize" : "called before init");
    int cur = -1;
    if (p_ctx_get_device(&cur) != 0 || cur != S.dev)
        refuse(fn, "called with device %d current; this PE's device is %d (NVSHMEM would run it "
                   "on the wrong context)", cur, S.dev);
}
static size_t heap_offset(const char* fn, const void* p, size_t n, const char* what) {
    uintptr_t a = (uintptr_t)p, b = (uintptr_t)S.heap;
    if (a < b || a + n > b + S.heap_size || a + n < a)
        refuse(fn, "%s %p (%zu bytes) is not in the symmetric heap [%p, +%zu)", what, p, n,
               (void*)S.heap, S.heap_size);
    return a - b;
}
static void check_pe(const char* fn, int pe) {
    if (pe < 0 || pe >= S.npes) refuse(fn, "PE %d does not exist (%d PEs)", pe, S.npes);
}
/* a local buffer a network transport can reach: the heap or a registered buffer */
static void known_locally(const char* fn, const void* p, size_t n, int pe, const char* what) {
    uintptr_t a = (uintptr_t)p;
    if (a >= (uintptr_t)S.heap && a + n <= (uintptr_t)S.heap + S.heap_size) return;
    for (int i = 0; i < S.nregistered; i++)
        if (a >= S.registered[i].p && a + n <= S.registered[i].p + S.registered[i].n) return;
    refuse(fn, "the %s %p (%zu bytes) is neither in the symmetric heap nor registered, and PE %d "
               "is on another node (a network transport cannot reach it)", what, p, n, pe);
}

/* -- the bootstrap block and its barrier -------------------------------------------------- */

static double timeout_s(void) {
    const char* t = getenv("FAKE_NVSHMEM_TIMEOUT_S");
    return t && *t ? atof(t) : 300.0;
}
static double now_s(void) {
    struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}
static void nap(long ns) { struct timespec t = {0, ns}; nanosleep(&t, 0); }
/* wait until *word >= goal; a PE gone or the timeout ends the process, with the reason */
static void wait_for(const char* fn, _Atomic uint64_t* word, uint64_t goal) {
    double start = now_s(), checked = start;
    for (unsigned spin = 0; atomic_load_explicit(word, memory_order_acquire) < goal; spin++) {
        if (spin < 64) { sched_yield(); continue; }
        nap(20000);
        double t = now_s();
        if (t - checked < 0.05) continue;
        checked = t;
        for (int r = 0; r < S.npes; r++) {
            int pid = S.boot->pe[r].pid;
            if (r != S.me && pid > 0 && kill(pid, 0) != 0 && errno == ESRCH)
                refuse(fn, "PE %d (pid %d) has exited; NVSHMEM would wait for it forever", r, pid);
        }
        if (t - start > timeout_s())
            refuse(fn, "waited %.0f s for the other PEs (FAKE_NVSHMEM_TIMEOUT_S)", t - start);
    }
}
static void barrier(const char* fn) {
    pthread_mutex_lock(&S.mu);
    uint64_t k = ++S.barriers;
    pthread_mutex_unlock(&S.mu);
    atomic_fetch_add_explicit(&S.boot->arrivals, 1, memory_order_acq_rel);
    wait_for(fn, &S.boot->arrivals, k * (uint64_t)S.npes);
}

/* -- stream-ordered work ------------------------------------------------------------------ */

typedef struct {
    int kind; /* 0 copy, 1 signal, 2 copy then signal, 3 barrier, 4 nothing (quiet) */
    char* dst; const char* src; size_t n;
    uint64_t* sig; uint64_t value; int op, pe, remote;
} work_t;

static unsigned nic_us(void) {
    const char* t = getenv("FAKE_NVSHMEM_NIC_US");
    return t && *t ? (unsigned)atoi(t) : 50u;
}
/* every NVSHMEM signal operation on PE pe's memory takes pe's NIC lock, so they are atomic
   with each other; a network's is read, a while, write: a GPU's own atomic in between is lost */
static void signal_word(uint64_t* word, uint64_t value, int op, int pe, int remote) {
    _Atomic uint64_t* w = (_Atomic uint64_t*)word;
    _Atomic int* nic = &S.boot->nic[pe];
    while (atomic_exchange_explicit(nic, 1, memory_order_acquire)) sched_yield();
    if (!remote) { /* P2P: a GPU atomic */
        if (op == SIGNAL_SET) atomic_store_explicit(w, value, memory_order_release);
        else atomic_fetch_add_explicit(w, value, memory_order_acq_rel);
    } else {
        uint64_t old = atomic_load_explicit(w, memory_order_acquire);
        unsigned us = nic_us();
        if (us) nap((long)us * 1000L);
        atomic_store_explicit(w, op == SIGNAL_SET ? value : old + value, memory_order_release);
    }
    atomic_store_explicit(nic, 0, memory_order_release);
}
static void run_work(void* arg) {
    work_t* w = arg;
    if (w->kind == 0 || w->kind == 2) {
        memcpy(w->dst, w->src, w->n);
        atomic_thread_fence(memory_order_release);
    }
    if (w->kind == 1 || w->kind == 2) signal_word(w->sig, w->value, w->op, w->pe, w->remote);
    if (w->kind == 3) barrier("nvshmemx_barrier_all_on_stream");
    free(w);
}
static void enqueue(const char* fn, void* stream, work_t w) {
    work_t* copy = malloc(sizeof *copy);
    if (!copy) refuse(fn, "out of host memory");
    *copy = w;
    if (p_launch_host_func(stream, run_work, copy) != 0) refuse(fn, "cuLaunchHostFunc failed");
}
static char* peer_address(int pe, size_t off) { return S.peer[pe] + off; }

/* -- init and finalize -------------------------------------------------------------------- */

int nvshmemx_get_uniqueid(nvshmemx_uniqueid_t* id) {
    called("nvshmemx_get_uniqueid");
    int fd = memfd_create("fake-nvshmem-bootstrap", MFD_CLOEXEC);
    if (fd < 0 || ftruncate(fd, sizeof(boot_t)) != 0) return 7; /* NVSHMEMX_ERROR_INTERNAL */
    uid_body_t body = {UID_MAGIC, (int32_t)getpid(), fd, 0};
    int r = open("/dev/urandom", O_RDONLY);
    if (r < 0 || read(r, &body.nonce, sizeof body.nonce) != (ssize_t)sizeof body.nonce) body.nonce = (uint64_t)now_s();
    if (r >= 0) close(r);
    if (S.boot_fd >= 0) close(S.boot_fd);
    S.boot_fd = fd; /* kept open: the other PEs open it through /proc/<pid>/fd */
    memset(id->internal, 0, sizeof id->internal);
    memcpy(id->internal, &body, sizeof body);
    return 0;
}

int nvshmemx_set_attr_uniqueid_args(const int myrank, const int nranks,
                                    const nvshmemx_uniqueid_t* id, init_attr_t* attr) {
    called("nvshmemx_set_attr_uniqueid_args");
    attr->args.uid_args.myrank = myrank;
    attr->args.uid_args.nranks = nranks;
    attr->args.uid_args.id = (nvshmemx_uniqueid_t*)id;
    return 0;
}

static size_t symmetric_size(void) {
    const char* t = getenv("NVSHMEM_SYMMETRIC_SIZE");
    if (!t || !*t) return (size_t)1 << 30;
    char* end; double v = strtod(t, &end);
    size_t scale = 1;
    switch (*end) {
        case 'k': case 'K': scale = (size_t)1 << 10; end++; break;
        case 'm': case 'M': scale = (size_t)1 << 20; end++; break;
        case 'g': case 'G': scale = (size_t)1 << 30; end++; break;
        case 't': case 'T': scale = (size_t)1 << 40; end++; break;
        default: break;
    }
    if (end == t || v <= 0) refuse("nvshmemx_hostlib_init_attr", "NVSHMEM_SYMMETRIC_SIZE=%s is invalid", t);
    size_t n = (size_t)(v * (double)scale + 0.999);
    return (n + 4095) & ~(size_t)4095;
}

static void* map_fd(int fd, size_t n) {
    void* m = mmap(0, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    return m == MAP_FAILED ? 0 : m;
}
static void* map_path(int pid, int fd, size_t n) {
    char path[64]; snprintf(path, sizeof path, "/proc/%d/fd/%d", pid, fd);
    int f = open(path, O_RDWR | O_CLOEXEC);
    if (f < 0) return 0;
    void* m = map_fd(f, n);
    close(f);
    return m;
}

static void host_of(int rank, char* out, size_t n) {
    char name[64] = "";
    gethostname(name, sizeof name - 1);
    const char* split = getenv("FAKE_NVSHMEM_NODE_SPLIT");
    if (!split || !*split || !strcmp(split, "node")) snprintf(out, n, "%s", name);
    else if (!strcmp(split, "rank")) snprintf(out, n, "%s/pe%d", name, rank);
    else {
        int k = atoi(split);
        if (k <= 0) refuse("nvshmemx_hostlib_init_attr", "FAKE_NVSHMEM_NODE_SPLIT=%s: expected node, rank or K > 0", split);
        snprintf(out, n, "%s/node%d", name, rank / k);
    }
}

int nvshmemx_hostlib_init_attr(unsigned int flags, init_attr_t* attr) {
    called("nvshmemx_hostlib_init_attr");
    driver();
    if (!(flags & INIT_WITH_UNIQUEID) || !attr || !attr->args.uid_args.id) {
        fprintf(stderr, "fake nvshmem: init: only the unique-id bootstrap is modelled (flags %u)\n", flags);
        return 1;
    }
    if (S.status != STATUS_NOT_INITIALIZED) {
        fprintf(stderr, "fake nvshmem: init: NVSHMEM is initialized already\n");
        return 1;
    }
    int me = attr->args.uid_args.myrank, npes = attr->args.uid_args.nranks;
    uid_body_t body; memcpy(&body, attr->args.uid_args.id->internal, sizeof body);
    if (npes < 1 || npes > MAX_PES || me < 0 || me >= npes) {
        fprintf(stderr, "fake nvshmem: init: rank %d of %d (1 to %d PEs)\n", me, npes, MAX_PES);
        return 1;
    }
    if (body.magic != UID_MAGIC) {
        fprintf(stderr, "fake nvshmem: init: the unique id did not reach PE %d\n", me);
        return 1;
    }
    int dev = -1;
    if (p_ctx_get_device(&dev) != 0 || dev < 0) {
        fprintf(stderr, "fake nvshmem: init: no CUDA context is current\n");
        return 6; /* NVSHMEMX_ERROR_GPU_NOT_SELECTED */
    }
    boot_t* boot = map_path(body.pid, body.fd, sizeof(boot_t));
    if (!boot) {
        fprintf(stderr, "fake nvshmem: init: the bootstrap of pid %d is gone\n", body.pid);
        return 7;
    }
    size_t size = symmetric_size();
    int hfd = memfd_create("fake-nvshmem-heap", MFD_CLOEXEC);
    char* heap = hfd >= 0 && ftruncate(hfd, (off_t)size) == 0 ? map_fd(hfd, size) : 0;
    if (!heap) {
        fprintf(stderr, "fake nvshmem: init: a heap of %zu bytes failed: %s\n", size, strerror(errno));
        return 2;
    }
    S.me = me; S.npes = npes; S.dev = dev; S.boot = boot;
    S.heap = heap; S.heap_size = size; S.heap_fd = hfd;
    S.nblocks = 1; S.blocks[0] = (block_t){0, size, 0}; S.in_use = 0;
    S.nregistered = 0; S.mallocs = 0; S.barriers = 0; S.finalized = 0;
    pe_slot_t* slot = &boot->pe[me];
    slot->pid = getpid(); slot->heap_fd = hfd; slot->dev = dev; slot->nonce = body.nonce;
    host_of(me, slot->host, sizeof slot->host);
    atomic_store_explicit((_Atomic int*)&slot->joined, 1, memory_order_release);
    double start = now_s();
    for (int r = 0; r < npes; r++) /* everyone has joined this id */
        while (!atomic_load_explicit((_Atomic int*)&boot->pe[r].joined, memory_order_acquire) ||
               boot->pe[r].nonce != body.nonce) {
            if (now_s() - start > timeout_s())
                refuse("nvshmemx_hostlib_init_attr", "PE %d never joined (FAKE_NVSHMEM_TIMEOUT_S)", r);
            nap(100000);
        }
    int limited = 0;
    for (int r = 0; r < npes; r++) {
        S.same_node[r] = !strcmp(boot->pe[r].host, slot->host);
        if (r == me) { S.peer[r] = heap; continue; }
        S.peer[r] = map_path(boot->pe[r].pid, boot->pe[r].heap_fd, size);
        if (!S.peer[r]) refuse("nvshmemx_hostlib_init_attr", "cannot map PE %d's heap", r);
        p_track((uintptr_t)S.peer[r], size, -3);
        if (S.same_node[r] && boot->pe[r].dev == dev) limited = 1;
    }
    p_track((uintptr_t)heap, size, -3); /* device memory to the fake driver */
    S.status = limited ? STATUS_LIMITED_MPG : STATUS_IS_INITIALIZED;
    barrier("nvshmemx_hostlib_init_attr"); /* every PE has mapped every heap */
    return 0;
}

int nvshmemx_init_status(void) { called("nvshmemx_init_status"); return S.status; }
int nvshmem_my_pe(void) { initialized("nvshmem_my_pe"); return S.me; }
int nvshmem_n_pes(void) { initialized("nvshmem_n_pes"); return S.npes; }
void nvshmem_info_get_version(int* major, int* minor) {
    called("nvshmem_info_get_version"); *major = 1; *minor = 3;
}
void nvshmem_info_get_name(char* name) {
    called("nvshmem_info_get_name"); strcpy(name, "NVSHMEM stand-in (tests/fakegpu)");
}
void nvshmemx_vendor_get_version_info(int* major, int* minor, int* patch) {
    called("nvshmemx_vendor_get_version_info"); *major = 0; *minor = 0; *patch = 0;
}

void nvshmemx_hostlib_finalize(void) {
    initialized("nvshmemx_hostlib_finalize");
    barrier("nvshmemx_hostlib_finalize"); /* collective */
    for (int r = 0; r < S.npes; r++) {
        p_untrack((uintptr_t)S.peer[r], S.heap_size);
        munmap(S.peer[r], S.heap_size);
        S.peer[r] = 0;
    }
    close(S.heap_fd);
    S.heap = 0; S.heap_fd = -1;
    S.status = STATUS_NOT_INITIALIZED;
    S.finalized = 1;
    /* the bootstrap block stays mapped: a PE still leaving the last barrier reads it */
}

/* -- memory ------------------------------------------------------------------------------- */

void* nvshmem_malloc(size_t size) {
    initialized("nvshmem_malloc");
    uint64_t k = S.mallocs++;
    S.boot->pe[S.me].msize[k & 1] = size;
    barrier("nvshmem_malloc"); /* collective: the same size on every PE */
    for (int r = 0; r < S.npes; r++)
        if (S.boot->pe[r].msize[k & 1] != size)
            refuse("nvshmem_malloc", "allocation %llu is %zu bytes here and %llu bytes on PE %d "
                   "(a symmetric allocation must be the same everywhere)", (unsigned long long)k, size,
                   (unsigned long long)S.boot->pe[r].msize[k & 1], r);
    if (size == 0) return 0;
    size_t need = (size + ALIGN - 1) & ~(size_t)(ALIGN - 1);
    for (int i = 0; i < S.nblocks; i++) {
        block_t* b = &S.blocks[i];
        if (b->used || b->size < need) continue;
        if (b->size > need && S.nblocks < MAX_BLOCKS) { /* split: the rest stays free */
            memmove(b + 2, b + 1, sizeof(block_t) * (size_t)(S.nblocks - i - 1));
            S.blocks[i + 1] = (block_t){b->off + need, b->size - need, 0};
            S.nblocks++;
            b->size = need;
        }
        b->used = 1;
        S.in_use += b->size;
        return S.heap + b->off;
    }
    fprintf(stderr, "fake nvshmem: nvshmem_malloc(%zu) failed: the symmetric heap holds %zu bytes "
                    "(NVSHMEM_SYMMETRIC_SIZE), %zu in use\n", size, S.heap_size, S.in_use);
    return 0;
}

void nvshmem_free(void* ptr) {
    initialized("nvshmem_free");
    barrier("nvshmem_free"); /* collective */
    if (!ptr) return;
    size_t off = heap_offset("nvshmem_free", ptr, 0, "the pointer");
    for (int i = 0; i < S.nblocks; i++) {
        if (S.blocks[i].off != off || !S.blocks[i].used) continue;
        S.blocks[i].used = 0;
        S.in_use -= S.blocks[i].size;
        /* merge with free neighbours */
        if (i + 1 < S.nblocks && !S.blocks[i + 1].used) {
            S.blocks[i].size += S.blocks[i + 1].size;
            memmove(&S.blocks[i + 1], &S.blocks[i + 2], sizeof(block_t) * (size_t)(S.nblocks - i - 2));
            S.nblocks--;
        }
        if (i > 0 && !S.blocks[i - 1].used) {
            S.blocks[i - 1].size += S.blocks[i].size;
            memmove(&S.blocks[i], &S.blocks[i + 1], sizeof(block_t) * (size_t)(S.nblocks - i - 1));
            S.nblocks--;
        }
        return;
    }
    refuse("nvshmem_free", "%p was not given by nvshmem_malloc (or is freed already)", ptr);
}

void* nvshmem_ptr(const void* dest, int pe) {
    initialized("nvshmem_ptr");
    uintptr_t a = (uintptr_t)dest, b = (uintptr_t)S.heap;
    if (a < b || a >= b + S.heap_size || pe < 0 || pe >= S.npes || !S.same_node[pe]) return 0;
    return peer_address(pe, a - b);
}

void* nvshmemx_buffer_register_symmetric(void* buf, size_t size, int flags) {
    initialized("nvshmemx_buffer_register_symmetric");
    (void)flags;
    barrier("nvshmemx_buffer_register_symmetric"); /* collective */
    if (S.nregistered == MAX_REGISTERED)
        refuse("nvshmemx_buffer_register_symmetric", "more than %d buffers registered", MAX_REGISTERED);
    S.registered[S.nregistered++] = (range_t){(uintptr_t)buf, size};
    return buf; /* local operations only: peers cannot reach a registered buffer here */
}

int nvshmemx_buffer_unregister_symmetric(void* ptr, size_t size) {
    initialized("nvshmemx_buffer_unregister_symmetric");
    barrier("nvshmemx_buffer_unregister_symmetric");
    for (int i = 0; i < S.nregistered; i++)
        if (S.registered[i].p == (uintptr_t)ptr) {
            S.registered[i] = S.registered[--S.nregistered];
            return 0;
        }
    (void)size;
    return 1;
}

/* -- on a stream -------------------------------------------------------------------------- */

void nvshmemx_barrier_all_on_stream(void* stream) {
    initialized("nvshmemx_barrier_all_on_stream");
    enqueue("nvshmemx_barrier_all_on_stream", stream, (work_t){.kind = 3});
}

void nvshmemx_quiet_on_stream(void* stream) {
    initialized("nvshmemx_quiet_on_stream"); /* puts are complete when the stream passes them */
    enqueue("nvshmemx_quiet_on_stream", stream, (work_t){.kind = 4});
}

static work_t put_work(const char* fn, void* dest, const void* source, size_t n, int pe) {
    check_pe(fn, pe);
    size_t off = heap_offset(fn, dest, n, "destination");
    if (!S.same_node[pe]) known_locally(fn, source, n, pe, "source");
    return (work_t){.kind = 0, .dst = peer_address(pe, off), .src = source, .n = n, .pe = pe,
                    .remote = !S.same_node[pe]};
}
static work_t get_work(const char* fn, void* dest, const void* source, size_t n, int pe) {
    check_pe(fn, pe);
    size_t off = heap_offset(fn, source, n, "source");
    if (!S.same_node[pe]) known_locally(fn, dest, n, pe, "destination");
    return (work_t){.kind = 0, .dst = dest, .src = peer_address(pe, off), .n = n, .pe = pe,
                    .remote = !S.same_node[pe]};
}
static void add_signal(const char* fn, work_t* w, uint64_t* sig, uint64_t value, int op, int pe) {
    check_pe(fn, pe);
    size_t off = heap_offset(fn, sig, 8, "signal word");
    if (off & 7) refuse(fn, "the signal word %p is not 8-byte aligned", (void*)sig);
    if (op != SIGNAL_SET && op != SIGNAL_ADD)
        refuse(fn, "signal operation %d (expected NVSHMEM_SIGNAL_SET %d or NVSHMEM_SIGNAL_ADD %d)", op,
               SIGNAL_SET, SIGNAL_ADD);
    w->sig = (uint64_t*)peer_address(pe, off); w->value = value; w->op = op; w->pe = pe;
    w->remote = !S.same_node[pe];
}

void nvshmemx_putmem_on_stream(void* dest, const void* source, size_t n, int pe, void* stream) {
    initialized("nvshmemx_putmem_on_stream");
    enqueue("nvshmemx_putmem_on_stream", stream, put_work("nvshmemx_putmem_on_stream", dest, source, n, pe));
}
void nvshmemx_putmem_nbi_on_stream(void* dest, const void* source, size_t n, int pe, void* stream) {
    initialized("nvshmemx_putmem_nbi_on_stream");
    enqueue("nvshmemx_putmem_nbi_on_stream", stream, put_work("nvshmemx_putmem_nbi_on_stream", dest, source, n, pe));
}
void nvshmemx_getmem_on_stream(void* dest, const void* source, size_t n, int pe, void* stream) {
    initialized("nvshmemx_getmem_on_stream");
    enqueue("nvshmemx_getmem_on_stream", stream, get_work("nvshmemx_getmem_on_stream", dest, source, n, pe));
}
void nvshmemx_getmem_nbi_on_stream(void* dest, const void* source, size_t n, int pe, void* stream) {
    initialized("nvshmemx_getmem_nbi_on_stream");
    enqueue("nvshmemx_getmem_nbi_on_stream", stream, get_work("nvshmemx_getmem_nbi_on_stream", dest, source, n, pe));
}
static void put_signal(const char* fn, void* dest, const void* source, size_t n, uint64_t* sig,
                       uint64_t value, int op, int pe, void* stream) {
    initialized(fn);
    work_t w = put_work(fn, dest, source, n, pe);
    w.kind = 2;
    add_signal(fn, &w, sig, value, op, pe);
    enqueue(fn, stream, w);
}
void nvshmemx_putmem_signal_on_stream(void* dest, const void* source, size_t n, uint64_t* sig,
                                      uint64_t value, int op, int pe, void* stream) {
    put_signal("nvshmemx_putmem_signal_on_stream", dest, source, n, sig, value, op, pe, stream);
}
void nvshmemx_putmem_signal_nbi_on_stream(void* dest, const void* source, size_t n, uint64_t* sig,
                                          uint64_t value, int op, int pe, void* stream) {
    put_signal("nvshmemx_putmem_signal_nbi_on_stream", dest, source, n, sig, value, op, pe, stream);
}
void nvshmemx_signal_op_on_stream(uint64_t* sig, uint64_t value, int op, int pe, void* stream) {
    initialized("nvshmemx_signal_op_on_stream");
    work_t w = {.kind = 1};
    add_signal("nvshmemx_signal_op_on_stream", &w, sig, value, op, pe);
    enqueue("nvshmemx_signal_op_on_stream", stream, w);
}

/* kernels that use NVSHMEM's device library: none of the project's do */
int nvshmemx_cumodule_init(void* module) { (void)module; called("nvshmemx_cumodule_init"); return 0; }
int nvshmemx_cumodule_finalize(void* module) { (void)module; called("nvshmemx_cumodule_finalize"); return 0; }
int nvshmemx_culibrary_init(void* library) { (void)library; called("nvshmemx_culibrary_init"); return 0; }
int nvshmemx_culibrary_finalize(void* library) { (void)library; called("nvshmemx_culibrary_finalize"); return 0; }
