// The CUDA-on-CPU layer's runtime (libcudacpu.so; tests/fakegpu/cudacpu/README.md).
//
// A launch runs the way a GPU runs it: every block of a cooperative grid is resident at once
// (one OS thread each), other grids run their blocks as "multiprocessors" (worker threads)
// free up; each CUDA thread is a fiber of its block's thread, switched by hand (x86-64) or
// with ucontext. A fiber runs until it reaches a point where a GPU thread could wait for
// others: __syncthreads, a warp-wide operation (shuffle, mma, ldmatrix), an atomic or an
// acquire load. Barriers and warp-wide operations meet all the threads they name, at the
// same call site, or the layer reports the divergence; a block whose threads all wait with
// none able to go on is a reported deadlock; a watchdog reports a launch that stops making
// progress. CUDACPU_SEED permutes the order in which a block's fibers run, so a race found
// once can be found again.
//
// Modules: cudacpu_load builds the very source NVRTC compiled (with its -D defines and the
// __CUDA_ARCH__ of its -arch) with the system C++ compiler, cudacpu.h in front, cached by a
// hash of source, options and the layer's own headers, and loads it; each __global__
// function registers itself with its parameters' sizes.

#include <dlfcn.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cudacpu_api.h"

#if !defined(__x86_64__)
#include <ucontext.h>
#endif
#if defined(__SANITIZE_THREAD__)
extern "C" {
void* __tsan_get_current_fiber(void);
void* __tsan_create_fiber(unsigned flags);
void __tsan_destroy_fiber(void* fiber);
void __tsan_switch_to_fiber(void* fiber, unsigned flags);
}
#endif

#ifndef CUDACPU_INCLUDE_DIR
#error "build with -DCUDACPU_INCLUDE_DIR=\"<the folder of cudacpu.h>\""
#endif

struct cudacpu_kernel {
    std::string name;
    void* fn;
    void (*invoke)(void*, void**);
    std::vector<size_t> sizes;
    cudacpu_module* module;
};

struct cudacpu_module {
    std::string key, source_path;
    void* handle = nullptr;
    std::map<std::string, std::unique_ptr<cudacpu_kernel>> kernels;
    std::vector<std::string> lines;  // the source as built, for reports
};

namespace {

[[noreturn]] void die(const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    std::fputs("[cudacpu] ", stderr);
    std::vfprintf(stderr, fmt, ap);
    std::fputc('\n', stderr);
    va_end(ap);
    std::fflush(stderr);
    std::abort();
}

// -- fibers ----------------------------------------------------------------------------------

#if defined(__x86_64__)
extern "C" void cudacpu_switch(void** save_sp, void* load_sp);
extern "C" void cudacpu_trampoline(void);
asm(R"(
    .text
    .globl cudacpu_switch
    .type cudacpu_switch, @function
cudacpu_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size cudacpu_switch, .-cudacpu_switch
    .globl cudacpu_trampoline
    .type cudacpu_trampoline, @function
cudacpu_trampoline:
    movq %r12, %rdi
    callq *%r13
    ud2
    .size cudacpu_trampoline, .-cudacpu_trampoline
)");
struct Ctx {
    void* sp = nullptr;
};
void ctx_init(Ctx& c, char* stack, size_t size, void (*fn)(void*), void* arg) {
    auto* sp = (uint64_t*)(((uintptr_t)(stack + size)) & ~(uintptr_t)15);
    *--sp = (uint64_t)&cudacpu_trampoline;  // returned to by the first switch
    *--sp = 0;                               // rbp
    *--sp = 0;                               // rbx
    *--sp = (uint64_t)arg;                   // r12
    *--sp = (uint64_t)fn;                    // r13
    *--sp = 0;                               // r14
    *--sp = 0;                               // r15
    c.sp = sp;  // (the floating-point control words are the thread's: no fiber changes them)
}
inline void ctx_swap(Ctx& from, Ctx& to) { cudacpu_switch(&from.sp, to.sp); }
#else
struct Ctx {
    ucontext_t uc;
};
void ctx_init(Ctx& c, char* stack, size_t size, void (*fn)(void*), void* arg) {
    getcontext(&c.uc);
    c.uc.uc_stack.ss_sp = stack;
    c.uc.uc_stack.ss_size = size;
    c.uc.uc_link = nullptr;
    makecontext(&c.uc, (void (*)())fn, 1, arg);
}
inline void ctx_swap(Ctx& from, Ctx& to) { swapcontext(&from.uc, &to.uc); }
#endif

constexpr size_t STACK = 64 << 10;
std::mutex stack_mu;
std::vector<char*> stack_pool;
thread_local std::vector<char*> my_stacks;  // this block thread's, reused from launch to launch
char* stack_get() {
    if (!my_stacks.empty()) {
        char* s = my_stacks.back();
        my_stacks.pop_back();
        return s;
    }
    {
        std::lock_guard<std::mutex> g(stack_mu);
        if (!stack_pool.empty()) {
            char* s = stack_pool.back();
            stack_pool.pop_back();
            return s;
        }
    }
    const long page = sysconf(_SC_PAGESIZE);
    void* m = mmap(nullptr, STACK + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                   -1, 0);
    if (m == MAP_FAILED) die("out of memory for fiber stacks");
    mprotect(m, page, PROT_NONE);  // a guard page: an overflow faults
    return (char*)m + page;
}
void stack_put(char* s) { my_stacks.push_back(s); }

// -- threads, warps, blocks, launches --------------------------------------------------------

enum class St : uint8_t { Runnable, AtBarrier, AtWarp, Done };

struct CpCopy {
    void* dst;
    unsigned char data[16];
};

struct Block;
struct Fiber {
    Ctx ctx;
    char* stack = nullptr;
    cudacpu_thread view{};
    int linear = 0, lane = 0, warp = 0;
    St st = St::Runnable;
    const char* what = "";
    int line = 0;
    const void* site = nullptr;
    std::vector<CpCopy> open;                 // cp.async issued since the last commit
    std::vector<std::vector<CpCopy>> groups;  // committed, oldest first
    Block* block = nullptr;
#if defined(__SANITIZE_THREAD__)
    void* tsan = nullptr;
#endif
};

constexpr int WIN = 12, WOUT = 4;  // 64-bit words a lane brings to and takes from a warp op
struct WarpOp {
    unsigned arrived = 0, mask = 0;
    const void* site = nullptr;
    const char* what = nullptr;
    int line = 0, mode = 0, arg = 0, width = 32;
    uint64_t in[32][WIN];
    uint64_t out[32][WOUT];
};

struct Launch;
struct Block {
    Launch* L = nullptr;
    cudacpu_dim3 idx{};
    std::vector<Fiber> f;
    int live = 0;
    int bar_arrived = 0, bar_line = 0;
    const void* bar_site = nullptr;
    std::vector<WarpOp> warps;
    Ctx sched;
    const std::vector<unsigned>* order = nullptr;  // this round's order of the fibers
    size_t pos = 0;                                // the next of them to consider
    uint64_t events = 0;  // barriers and warp operations completed, threads ended
#if defined(__SANITIZE_THREAD__)
    void* tsan = nullptr;
#endif
};

struct Launch {
    const cudacpu_kernel* k = nullptr;
    cudacpu_dim3 grid{}, block{};
    std::vector<std::vector<unsigned char>> args;
    std::vector<void*> argp;
    std::atomic<uint64_t> progress{0};
    std::mutex mu;
    std::set<Block*> running;  // for the watchdog's report
};

// (initial-exec: the runtime is loaded with the driver, and these are read at every
// barrier, warp-wide operation and threadIdx)
__attribute__((tls_model("initial-exec"))) thread_local Block* tl_block = nullptr;
__attribute__((tls_model("initial-exec"))) thread_local Fiber* tl_fiber = nullptr;

unsigned long long env_seed() {
    const char* s = std::getenv("CUDACPU_SEED");
    return s && *s ? std::strtoull(s, nullptr, 0) : 0;
}

std::string dim(const cudacpu_dim3& d) {
    return "(" + std::to_string(d.x) + "," + std::to_string(d.y) + "," + std::to_string(d.z) + ")";
}

std::string source_line(const cudacpu_module* m, int line) {
    if (!m || line <= 0 || line > (int)m->lines.size()) return "";
    std::string t = m->lines[line - 1];
    t.erase(0, t.find_first_not_of(" \t"));
    return t.size() > 90 ? t.substr(0, 87) + "..." : t;
}

std::string where(const Block& b, const Fiber& f) {
    std::string s = std::string(f.what) + " at line " + std::to_string(f.line);
    const std::string text = source_line(b.L->k->module, f.line);
    Dl_info info{};
    if (f.site && dladdr(f.site, &info) && info.dli_sname) s += std::string(" in ") + info.dli_sname;
    if (!text.empty()) s += ": `" + text + "`";
    return s;
}

// Each thread's state, consecutive threads in the same state on one line.
std::string states(const Block& b) {
    std::ostringstream o;
    size_t i = 0;
    while (i < b.f.size()) {
        size_t j = i;
        auto same = [&](const Fiber& a, const Fiber& c) {
            return a.st == c.st && a.line == c.line && a.site == c.site && a.what == c.what;
        };
        while (j + 1 < b.f.size() && same(b.f[i], b.f[j + 1])) ++j;
        o << "  thread" << (i == j ? " " : "s ") << i;
        if (j > i) o << "-" << j;
        const Fiber& f = b.f[i];
        if (f.st == St::Done)
            o << ": exited";
        else if (f.st == St::Runnable && !f.line)
            o << ": runnable, at no wait yet";
        else if (f.st == St::Runnable)
            o << ": runnable (last at " << where(b, f) << ")";
        else
            o << ": waiting in " << where(b, f);
        o << "\n";
        i = j + 1;
    }
    return o.str();
}

[[noreturn]] void report(const Block& b, const char* kind, const std::string& what) {
    std::fprintf(stderr,
                 "[cudacpu] %s in kernel %s, block %s of grid %s, %u threads a block: %s\n%s",
                 kind, b.L->k->name.c_str(), dim(b.idx).c_str(), dim(b.L->grid).c_str(),
                 b.L->block.x * b.L->block.y * b.L->block.z, what.c_str(), states(b).c_str());
    std::fflush(stderr);
    std::abort();
}

// A fiber that waits or yields hands the core to the next runnable fiber of this round
// directly (one switch, not two through the scheduler); the last one of the round returns to
// the scheduler, which starts the next round.
inline void to_scheduler(Fiber& f) {
    Block& b = *f.block;
    while (b.pos < b.order->size()) {
        Fiber& next = b.f[(*b.order)[b.pos++]];
        if (next.st != St::Runnable || &next == &f) continue;
        tl_fiber = &next;
#if defined(__SANITIZE_THREAD__)
        __tsan_switch_to_fiber(next.tsan, 0);
#endif
        ctx_swap(f.ctx, next.ctx);
        return;
    }
#if defined(__SANITIZE_THREAD__)
    __tsan_switch_to_fiber(b.tsan, 0);
#endif
    ctx_swap(f.ctx, b.sched);
}

void release_barrier(Block& b) {
    for (Fiber& f : b.f)
        if (f.st == St::AtBarrier) f.st = St::Runnable;
    b.bar_arrived = 0;
    b.bar_site = nullptr;
    ++b.events;
    b.L->progress.fetch_add(1, std::memory_order_relaxed);
}

void fiber_main(void* arg) {
    Fiber& f = *(Fiber*)arg;
    Block& b = *f.block;
    b.L->k->invoke(b.L->k->fn, b.L->argp.data());
    f.st = St::Done;
    f.what = "exit";
    --b.live;
    ++b.events;
    b.L->progress.fetch_add(1, std::memory_order_relaxed);
    const WarpOp& w = b.warps[f.warp];  // a warp-wide operation waiting for this lane never ends
    if (w.arrived && (w.mask >> f.lane & 1u))
        report(b, "WARP DIVERGENCE",
                   "thread " + std::to_string(f.linear) + " exited while lanes of its warp wait "
                   "for it in a warp-wide operation that names it");
    if (b.bar_arrived && b.bar_arrived == b.live) release_barrier(b);
    to_scheduler(f);
    die("a finished fiber was resumed");
}

void run_block(Launch& L, unsigned linear) {
    Block b;
    b.L = &L;
    b.idx = {linear % L.grid.x, linear / L.grid.x % L.grid.y, linear / (L.grid.x * L.grid.y)};
    const unsigned n = L.block.x * L.block.y * L.block.z;
    b.f.resize(n);
    b.warps.resize((n + 31) / 32);
    b.live = (int)n;
    tl_block = &b;
#if defined(__SANITIZE_THREAD__)
    b.tsan = __tsan_get_current_fiber();
#endif
    for (unsigned t = 0; t < n; ++t) {
        Fiber& f = b.f[t];
        f.block = &b;
        f.linear = (int)t;
        f.lane = (int)(t & 31);
        f.warp = (int)(t >> 5);
        f.view.thread_idx = {t % L.block.x, t / L.block.x % L.block.y, t / (L.block.x * L.block.y)};
        f.view.block_idx = b.idx;
        f.view.block_dim = L.block;
        f.view.grid_dim = L.grid;
        f.stack = stack_get();
        ctx_init(f.ctx, f.stack, STACK, &fiber_main, &f);
#if defined(__SANITIZE_THREAD__)
        f.tsan = __tsan_create_fiber(0);
#endif
    }
    {
        std::lock_guard<std::mutex> g(L.mu);
        L.running.insert(&b);
    }
    std::vector<unsigned> order(n);
    for (unsigned t = 0; t < n; ++t) order[t] = t;
    const unsigned long long seed = env_seed();
    std::mt19937_64 rng(seed ^ (0x9e3779b97f4a7c15ull * (linear + 1)));
    int idle = 0;
    while (b.live > 0) {
        const uint64_t before = b.events;
        const auto t0 = std::chrono::steady_clock::now();
        bool ran = false;
        if (seed) std::shuffle(order.begin(), order.end(), rng);
        b.order = &order;
        b.pos = 0;
        while (b.pos < order.size()) {  // (the fibers pass the round on among themselves)
            Fiber& f = b.f[order[b.pos++]];
            if (f.st != St::Runnable) continue;
            ran = true;
            tl_fiber = &f;
#if defined(__SANITIZE_THREAD__)
            __tsan_switch_to_fiber(f.tsan, 0);
#endif
            ctx_swap(b.sched, f.ctx);
        }
        tl_fiber = nullptr;
        if (!ran && b.live > 0)
            report(b, "DEADLOCK", "every thread waits and none of the waits can end");
        // a round in which threads only spun (waiting for another block or process): let the
        // others have the core, the longer the longer nothing happens
        const bool quick = std::chrono::steady_clock::now() - t0 < std::chrono::microseconds(50);
        if (b.events == before && quick) {
            ++idle;
            if (idle > 4) {
                timespec ts{0, std::min(20000L * (idle - 4), 200000L)};
                nanosleep(&ts, nullptr);
            } else {
                sched_yield();
            }
        } else {
            idle = 0;
        }
    }
    {
        std::lock_guard<std::mutex> g(L.mu);
        L.running.erase(&b);
    }
    for (Fiber& f : b.f) {
        stack_put(f.stack);
#if defined(__SANITIZE_THREAD__)
        __tsan_destroy_fiber(f.tsan);
#endif
    }
    L.progress.fetch_add(1, std::memory_order_relaxed);
    tl_block = nullptr;
}

// -- the block threads: kept between launches (a thread, and its thread-local shared
// memory, costs tens of microseconds to make) -----------------------------------------------

struct Worker {
    std::mutex mu;
    std::condition_variable cv;
    std::function<void()> job;
    bool busy = false;
};
std::mutex pool_mu;
std::vector<Worker*> idle_workers;

void worker_loop(Worker* w) {
    for (;;) {
        std::function<void()> job;
        {
            std::unique_lock<std::mutex> g(w->mu);
            w->cv.wait(g, [w] { return bool(w->job); });
            job = std::move(w->job);
            w->job = nullptr;
        }
        job();
    }
}

// Run `job` on `n` threads at once (every one of them started before any returns) and wait
// for all of them.
void run_on_workers(unsigned n, const std::function<void()>& job) {
    std::vector<Worker*> mine;
    {
        std::lock_guard<std::mutex> g(pool_mu);
        while (mine.size() < n && !idle_workers.empty()) {
            mine.push_back(idle_workers.back());
            idle_workers.pop_back();
        }
    }
    while (mine.size() < n) {
        auto* w = new Worker;
        std::thread(worker_loop, w).detach();
        mine.push_back(w);
    }
    std::mutex done_mu;
    std::condition_variable done_cv;
    unsigned done = 0;
    for (Worker* w : mine) {
        std::lock_guard<std::mutex> g(w->mu);
        w->job = [&] {
            job();
            std::lock_guard<std::mutex> d(done_mu);
            ++done;
            done_cv.notify_one();
        };
        w->cv.notify_one();
    }
    std::unique_lock<std::mutex> g(done_mu);
    done_cv.wait(g, [&] { return done == n; });
    g.unlock();
    std::lock_guard<std::mutex> p(pool_mu);
    for (Worker* w : mine) idle_workers.push_back(w);
}

// -- the watchdog ------------------------------------------------------------------------------

std::mutex launches_mu;
std::set<Launch*> launches;

void watchdog() {
    const char* e = std::getenv("CUDACPU_WATCHDOG_S");
    const double limit = e && *e ? std::atof(e) : 300.0;
    std::map<Launch*, std::pair<uint64_t, double>> seen;
    for (double now = 0;; now += 0.5) {
        std::this_thread::sleep_for(std::chrono::milliseconds(500));
        std::lock_guard<std::mutex> g(launches_mu);
        for (auto it = seen.begin(); it != seen.end();)
            it = launches.count(it->first) ? std::next(it) : seen.erase(it);
        for (Launch* L : launches) {
            const uint64_t p = L->progress.load();
            auto it = seen.find(L);
            if (it == seen.end() || it->second.first != p) {
                seen[L] = {p, now};
                continue;
            }
            if (now - it->second.second < limit) continue;
            std::fprintf(stderr,
                         "[cudacpu] WATCHDOG: kernel %s (grid %s) made no progress for %.0f s "
                         "(CUDACPU_WATCHDOG_S); its blocks:\n",
                         L->k->name.c_str(), dim(L->grid).c_str(), limit);
            std::lock_guard<std::mutex> h(L->mu);
            for (Block* b : L->running)
                std::fprintf(stderr, " block %s:\n%s", dim(b->idx).c_str(), states(*b).c_str());
            std::fflush(stderr);
            std::abort();
        }
    }
}

// -- kernel operations (called from fibers) ----------------------------------------------------

Fiber& me(const char* what) {
    Fiber* f = tl_fiber;
    if (!f) die("%s called outside a kernel launch", what);
    return *f;
}

// A warp-wide operation: this lane's inputs in, the outputs once every lane of `mask` has
// arrived at the same site (the last to arrive computes them all with `compute`).
template <class Compute>
const uint64_t* warp_op(const char* what, unsigned mask, const uint64_t* in, int nin, int line,
                        const void* site, int mode, int arg, int width, Compute compute) {
    Fiber& f = me(what);
    Block& b = *f.block;
    WarpOp& w = b.warps[f.warp];
    const unsigned bit = 1u << f.lane;
    f.what = what;
    f.line = line;
    f.site = site;
    if (!(mask & bit))
        report(b, "WARP DIVERGENCE",
               "thread " + std::to_string(f.linear) + " calls " + what + " with a mask that leaves "
               "out its own lane");
    const unsigned base = (unsigned)f.warp * 32;
    if (w.arrived == 0) {  // the first lane here: every lane it names must be able to come
        for (unsigned l = 0; l < 32; ++l) {
            if (!(mask >> l & 1u)) continue;
            if (base + l >= b.f.size() || b.f[base + l].st == St::Done)
                report(b, "WARP DIVERGENCE",
                       "thread " + std::to_string(f.linear) + " waits in " + where(b, f) +
                           " for lane " + std::to_string(l) + " of its warp, which " +
                           (base + l >= b.f.size() ? "does not exist" : "has exited"));
        }
        w.site = site;
        w.what = what;
        w.line = line;
        w.mask = mask;
        w.mode = mode;
        w.arg = arg;
        w.width = width;
    } else if (w.site != site || w.what != what || w.mask != mask) {
        const int other = (int)base + __builtin_ctz(w.arrived);
        report(b, "WARP DIVERGENCE",
               "lanes of warp " + std::to_string(f.warp) + " meet at different warp-wide "
               "operations: thread " + std::to_string(other) + " waits in " +
                   where(b, b.f[other]) + ", thread " + std::to_string(f.linear) + " comes to " +
                   where(b, f));
    }
    std::memcpy(w.in[f.lane], in, sizeof(uint64_t) * nin);
    w.arrived |= bit;
    if (w.arrived == w.mask) {
        compute(w);
        w.arrived = 0;
        for (unsigned l = 0; l < 32; ++l)
            if ((mask >> l & 1u) && b.f[base + l].st == St::AtWarp) b.f[base + l].st = St::Runnable;
        ++b.events;
        b.L->progress.fetch_add(1, std::memory_order_relaxed);
    } else {
        f.st = St::AtWarp;
        to_scheduler(f);
    }
    return w.out[f.lane];
}

float bf16_f32(uint32_t h) {
    uint32_t u = h << 16;
    float v;
    std::memcpy(&v, &u, 4);
    return v;
}
float f16_f32(uint32_t h) {  // exact (as cvt.f32.f16)
    const uint32_t sign = (h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    uint32_t bits;
    if (e == 0x1f)
        bits = sign | 0x7f800000u | (m << 13);
    else if (e)
        bits = sign | ((e + 112u) << 23) | (m << 13);
    else {
        float v = (float)m * 5.9604644775390625e-08f;
        std::memcpy(&bits, &v, 4);
        bits |= sign;
    }
    float v;
    std::memcpy(&v, &bits, 4);
    return v;
}

}  // namespace

// -- the C interface ---------------------------------------------------------------------------

extern "C" {

const cudacpu_thread* cudacpu_self(void) { return &me("threadIdx").view; }

unsigned long long cudacpu_globaltimer(void) {
    timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    return (unsigned long long)t.tv_sec * 1000000000ull + (unsigned long long)t.tv_nsec;
}

void cudacpu_yield(int changed) {
    Fiber* f = tl_fiber;
    if (!f) return;
    if (changed) {
        ++f->block->events;  // (a spin that only reads is not progress)
        f->block->L->progress.fetch_add(1, std::memory_order_relaxed);
    }
    f->what = "an atomic or acquire load";
    f->site = __builtin_return_address(0);
    to_scheduler(*f);
}

void cudacpu_fail(const char* what, int line) {
    Fiber& f = me(what);
    f.what = what;
    f.line = line;
    report(*f.block, "FAULT", std::string(what) + " (thread " + std::to_string(f.linear) + ")");
}

void cudacpu_syncthreads(int line, const void* site) {
    Fiber& f = me("__syncthreads");
    Block& b = *f.block;
    f.what = "__syncthreads";
    f.line = line;
    f.site = site;
    if (b.bar_arrived == 0) {
        b.bar_site = site;
        b.bar_line = line;
    } else if (site != b.bar_site) {
        int other = 0;
        while (b.f[other].st != St::AtBarrier) ++other;
        report(b, "BARRIER DIVERGENCE",
               "threads meet at different __syncthreads: thread " + std::to_string(other) +
                   " waits in " + where(b, b.f[other]) + ", thread " + std::to_string(f.linear) +
                   " comes to " + where(b, f));
    }
    ++b.bar_arrived;
    f.st = St::AtBarrier;
    if (b.bar_arrived == b.live) release_barrier(b);  // (this thread becomes runnable too)
    to_scheduler(f);
}

void cudacpu_syncwarp(unsigned mask, int line, const void* site) {
    uint64_t none = 0;
    warp_op("__syncwarp", mask, &none, 1, line, site, 0, 0, 32, [](WarpOp&) {});
}

uint64_t cudacpu_shfl(unsigned mask, uint64_t value, int mode, int arg, int width, int line,
                      const void* site) {
    static const char* names[] = {"__shfl_sync", "__shfl_xor_sync", "__shfl_up_sync",
                                  "__shfl_down_sync"};
    const uint64_t* out = warp_op(names[mode & 3], mask, &value, 1, line, site, mode, arg, width,
                                  [](WarpOp& w) {
        for (int l = 0; l < 32; ++l) {
            if (!(w.mask >> l & 1u)) continue;
            const int seg = l & ~(w.width - 1), in_seg = l & (w.width - 1);
            int src = l;
            switch (w.mode) {
                case 0: src = seg + (w.arg & (w.width - 1)); break;
                case 1: src = seg + ((in_seg ^ w.arg) & (w.width - 1)); break;
                case 2: src = in_seg - w.arg >= 0 ? l - w.arg : l; break;
                default: src = in_seg + w.arg < w.width ? l + w.arg : l; break;
            }
            // a source lane outside the mask: the value is undefined on a GPU; this layer
            // gives the lane its own value
            w.out[l][0] = (w.mask >> src & 1u) ? w.in[src][0] : w.in[l][0];
        }
    });
    return out[0];
}

// D = A B + C for m16n8k16 (PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point
// type"): lane l, g = l / 4, t = l % 4, holds
//   a[0] = A[g][2t, 2t+1]      a[1] = A[g+8][2t, 2t+1]
//   a[2] = A[g][2t+8, 2t+9]    a[3] = A[g+8][2t+8, 2t+9]      (lower column in the low half)
//   b0 = B[2t, 2t+1][g]        b1 = B[2t+8, 2t+9][g]
//   c[0..3] = C[g][2t], C[g][2t+1], C[g+8][2t], C[g+8][2t+1]
// The products are exact in double and summed there, C added, and the sum rounded once.
void cudacpu_mma_m16n8k16(int kind, float* c, const unsigned* a, unsigned b0, unsigned b1,
                          int line, const void* site) {
    uint64_t in[WIN] = {a[0], a[1], a[2], a[3], b0, b1};
    for (int i = 0; i < 4; ++i) {
        uint32_t u;
        std::memcpy(&u, &c[i], 4);
        in[6 + i] = u;
    }
    const uint64_t* out = warp_op(kind ? "mma.sync f16" : "mma.sync bf16", 0xffffffffu, in, 10,
                                  line, site, kind, 0, 32, [kind](WarpOp& w) {
        float A[16][16], B[16][8], C[16][8];
        auto half = [kind](uint32_t h) { return kind ? f16_f32(h & 0xffffu) : bf16_f32(h & 0xffffu); };
        for (int l = 0; l < 32; ++l) {
            const int g = l >> 2, t = l & 3;
            const uint64_t* v = w.in[l];
            A[g][2 * t] = half((uint32_t)v[0]);
            A[g][2 * t + 1] = half((uint32_t)v[0] >> 16);
            A[g + 8][2 * t] = half((uint32_t)v[1]);
            A[g + 8][2 * t + 1] = half((uint32_t)v[1] >> 16);
            A[g][2 * t + 8] = half((uint32_t)v[2]);
            A[g][2 * t + 9] = half((uint32_t)v[2] >> 16);
            A[g + 8][2 * t + 8] = half((uint32_t)v[3]);
            A[g + 8][2 * t + 9] = half((uint32_t)v[3] >> 16);
            B[2 * t][g] = half((uint32_t)v[4]);
            B[2 * t + 1][g] = half((uint32_t)v[4] >> 16);
            B[2 * t + 8][g] = half((uint32_t)v[5]);
            B[2 * t + 9][g] = half((uint32_t)v[5] >> 16);
            float cf[4];
            for (int i = 0; i < 4; ++i) {
                uint32_t u = (uint32_t)v[6 + i];
                std::memcpy(&cf[i], &u, 4);
            }
            C[g][2 * t] = cf[0];
            C[g][2 * t + 1] = cf[1];
            C[g + 8][2 * t] = cf[2];
            C[g + 8][2 * t + 1] = cf[3];
        }
        for (int l = 0; l < 32; ++l) {
            const int g = l >> 2, t = l & 3;
            const int rows[4] = {g, g, g + 8, g + 8}, cols[4] = {2 * t, 2 * t + 1, 2 * t, 2 * t + 1};
            for (int i = 0; i < 4; ++i) {
                double s = 0.0;
                for (int k = 0; k < 16; ++k) s += (double)A[rows[i]][k] * (double)B[k][cols[i]];
                const float d = (float)(s + (double)C[rows[i]][cols[i]]);
                uint32_t u;
                std::memcpy(&u, &d, 4);
                w.out[l][i] = u;
            }
        }
    });
    for (int i = 0; i < 4; ++i) {
        const uint32_t u = (uint32_t)out[i];
        std::memcpy(&c[i], &u, 4);
    }
}

// ldmatrix .m8n8.x2.b16 (PTX ISA, "ldmatrix"): lanes 8m..8m+7 give the row addresses of
// matrix m (16-byte aligned rows of 8 elements); lane l receives in r_m the elements
// M_m[l/4][2(l%4)] (low half) and M_m[l/4][2(l%4)+1], or with .trans M_m[2(l%4)][l/4] and
// M_m[2(l%4)+1][l/4]. The rows are read when the last lane arrives.
void cudacpu_ldmatrix_x2(int trans, unsigned* r0, unsigned* r1, const void* row, int line,
                         const void* site) {
    const uint64_t in = (uint64_t)(uintptr_t)row;
    Fiber& f = me("ldmatrix");
    if (f.lane < 16 && ((uintptr_t)row & 15))
        cudacpu_fail("ldmatrix: a row address that is not 16-byte aligned", line);
    const uint64_t* out = warp_op(trans ? "ldmatrix.x2.trans" : "ldmatrix.x2", 0xffffffffu, &in,
                                  1, line, site, trans, 0, 32, [trans](WarpOp& w) {
        uint16_t M[2][8][8];
        for (int m = 0; m < 2; ++m)
            for (int i = 0; i < 8; ++i)
                std::memcpy(M[m][i], (const void*)(uintptr_t)w.in[8 * m + i][0], 16);
        for (int l = 0; l < 32; ++l) {
            for (int m = 0; m < 2; ++m) {
                const int r = l >> 2, c = 2 * (l & 3);
                const uint32_t lo = trans ? M[m][c][r] : M[m][r][c];
                const uint32_t hi = trans ? M[m][c + 1][r] : M[m][r][c + 1];
                w.out[l][m] = lo | (hi << 16);
            }
        }
    });
    *r0 = (unsigned)out[0];
    *r1 = (unsigned)out[1];
}

void cudacpu_cp_async(void* dst, const void* src, unsigned src_size) {
    Fiber& f = me("cp.async");
    if (((uintptr_t)dst & 15) || (src_size && ((uintptr_t)src & 15)))
        cudacpu_fail("cp.async.cg of 16 bytes needs 16-byte aligned addresses", f.line);
    if (src_size > 16) cudacpu_fail("cp.async: src_size above the copy's 16 bytes", f.line);
    CpCopy c{dst, {}};
    std::memcpy(c.data, src, src_size);  // (the rest stays zero)
    f.open.push_back(c);
}

void cudacpu_cp_async_commit(void) {
    Fiber& f = me("cp.async.commit_group");
    f.groups.push_back(std::move(f.open));
    f.open.clear();
}

void cudacpu_cp_async_wait(int n) {
    Fiber& f = me("cp.async.wait_group");
    while ((int)f.groups.size() > n) {  // the oldest groups land, in order
        for (const CpCopy& c : f.groups.front()) std::memcpy(c.dst, c.data, 16);
        f.groups.erase(f.groups.begin());
    }
}

// -- modules ------------------------------------------------------------------------------------

}  // extern "C"

namespace {

std::mutex load_mu;
cudacpu_module* loading = nullptr;
std::map<std::string, cudacpu_module*> modules;

struct Hash128 {
    uint64_t a = 0xcbf29ce484222325ull, b = 0x84222325cbf29ce4ull;
    void add(const void* p, size_t n) {
        const auto* c = (const unsigned char*)p;
        for (size_t i = 0; i < n; ++i) {
            a = (a ^ c[i]) * 0x100000001b3ull;
            b = (b ^ c[i]) * 0x100000001b3ull + 0x9e3779b97f4a7c15ull;
        }
    }
    void add(const std::string& s) { add(s.data(), s.size() + 1); }
    std::string hex() const {
        char s[33];
        std::snprintf(s, sizeof s, "%016llx%016llx", (unsigned long long)a, (unsigned long long)b);
        return s;
    }
};

std::string read_file(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::ostringstream o;
    o << in.rdbuf();
    return o.str();
}

bool write_file(const std::string& path, const std::string& text) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << text;
    return bool(out);
}

std::string cache_dir() {
    const char* e = std::getenv("CUDACPU_CACHE");
    std::string d = e && *e ? e : "/tmp/cudacpu-cache-" + std::to_string(getuid());
    mkdir(d.c_str(), 0755);
    return d;
}

// `extern __shared__ T name[];` (dynamic shared memory) becomes a name for the block's
// cudacpu_dyn_smem; the line count stays the same.
std::string rewrite_dynamic_shared(const std::string& src) {
    std::string out;
    size_t pos = 0;
    for (;;) {
        const size_t at = src.find("extern __shared__", pos);
        if (at == std::string::npos) break;
        const size_t semi = src.find(';', at);
        const size_t open = src.rfind('[', semi);
        if (semi == std::string::npos || open == std::string::npos || open < at) break;
        std::string decl = src.substr(at + 17, open - at - 17);  // "[__align__(n)] T name"
        size_t al;
        while ((al = decl.find("__align__")) != std::string::npos)
            decl.erase(al, decl.find(')', al) + 1 - al);
        const size_t end = decl.find_last_not_of(" \t");
        size_t nb = decl.find_last_of(" \t*", end);
        const std::string name = decl.substr(nb + 1, end - nb);
        std::string type = decl.substr(0, nb + 1);
        out += src.substr(pos, at - pos);
        out += "\n#define " + name + " (reinterpret_cast<" + type + "*>(cudacpu_dynamic_shared()))\n";
        pos = semi + 1;
        out += "#line " + std::to_string(1 + std::count(src.begin(), src.begin() + pos, '\n')) + "\n";
    }
    return out + src.substr(pos);
}

int run(const std::vector<std::string>& argv, const std::string& log) {
    const pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        unsetenv("LD_PRELOAD");  // (the recording NVRTC has no business in the compiler)
        const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        std::vector<char*> a;
        for (const std::string& s : argv) a.push_back((char*)s.c_str());
        a.push_back(nullptr);
        execvp(a[0], a.data());
        _exit(127);
    }
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// the kernels' names, from the preprocessed source (__global__ is CUDACPU_GLOBAL there)
std::vector<std::string> kernel_names(const std::string& pre) {
    std::vector<std::string> names;
    const std::string mark = "CUDACPU_GLOBAL";
    for (size_t at = pre.find(mark); at != std::string::npos; at = pre.find(mark, at + 1)) {
        const size_t paren = pre.find('(', at);
        if (paren == std::string::npos) break;
        size_t e = pre.find_last_not_of(" \t\n", paren - 1);
        size_t s = e;
        while (s > at && (std::isalnum((unsigned char)pre[s - 1]) || pre[s - 1] == '_')) --s;
        names.push_back(pre.substr(s, e + 1 - s));
    }
    std::sort(names.begin(), names.end());
    names.erase(std::unique(names.begin(), names.end()), names.end());
    return names;
}

std::string layer_flags() {
#if defined(__SANITIZE_THREAD__)
    // (under ThreadSanitizer speed matters less than the build's own minute)
    return "-std=c++20 -O1 -fPIC -ffp-contract=off -fno-strict-aliasing -w -fsanitize=thread";
#else
    return "-std=c++20 -O2 -fPIC -ffp-contract=off -fno-strict-aliasing -w";
#endif
}

struct Resources {
    int registers = 0;
    size_t shared = 0;
};

// sm_90's rows of resources.tsv, read once (a kernel not in it: threads and dynamic shared
// memory only bound its occupancy)
Resources resources_of(const std::string& kernel) {
    static const std::map<std::string, Resources> table = [] {
        std::map<std::string, Resources> t;
        std::istringstream in(read_file(std::string(CUDACPU_INCLUDE_DIR) + "/resources.tsv"));
        for (std::string line; std::getline(in, line);) {
            std::istringstream f(line);
            std::string arch, name, regs, shared;
            if (std::getline(f, arch, '\t') && arch == "90" && std::getline(f, name, '\t') &&
                std::getline(f, regs, '\t') && std::getline(f, shared, '\t'))
                t[name] = Resources{std::atoi(regs.c_str()), (size_t)std::atoll(shared.c_str())};
        }
        return t;
    }();
    auto it = table.find(kernel);
    return it == table.end() ? Resources{} : it->second;
}

}  // namespace

extern "C" {

void cudacpu_register(const char* name, void* fn, void (*invoke)(void*, void**), int nparams,
                      const size_t* sizes) {
    if (!loading) die("kernel %s registers outside cudacpu_load", name);
    auto k = std::make_unique<cudacpu_kernel>();
    k->name = name;
    k->fn = fn;
    k->invoke = invoke;
    k->sizes.assign(sizes, sizes + nparams);
    k->module = loading;
    loading->kernels[name] = std::move(k);
}

cudacpu_module* cudacpu_load(const char* source, size_t len, const char* options, char* err,
                             size_t errlen) {
    std::lock_guard<std::mutex> guard(load_mu);
    auto fail = [&](const std::string& msg) -> cudacpu_module* {
        std::snprintf(err, errlen, "%s", msg.c_str());
        return nullptr;
    };
    // the options NVRTC had: -D/--define-macro, -arch/--gpu-architecture (others change
    // nothing the CPU build could follow)
    std::vector<std::string> defs;
    std::string arch = "900";
    std::istringstream opts(options ? options : "");
    for (std::string o; std::getline(opts, o);) {
        for (const char* p : {"-D", "--define-macro=", "-D="})
            if (o.rfind(p, 0) == 0 && o.size() > std::strlen(p)) defs.push_back(o.substr(std::strlen(p)));
        for (const char* p : {"-arch=sm_", "--gpu-architecture=sm_", "-arch=compute_",
                              "--gpu-architecture=compute_"})
            if (o.rfind(p, 0) == 0) arch = o.substr(std::strlen(p)) + "0";
    }
    const std::string inc = CUDACPU_INCLUDE_DIR;
    const std::string src(source, len);
    Hash128 h;
    h.add(read_file(inc + "/cudacpu.h"));
    h.add(read_file(inc + "/cudacpu_api.h"));
    h.add(layer_flags());
    h.add(arch);
    for (const std::string& d : defs) h.add(d);
    h.add(src);
    const std::string key = h.hex();
    if (auto it = modules.find(key); it != modules.end()) return it->second;
    const std::string dir = cache_dir(), base = dir + "/" + key;
    const std::string so = base + ".so";
    struct stat st {};
    if (stat(so.c_str(), &st) != 0) {
        const int lock = open((base + ".lock").c_str(), O_RDWR | O_CREAT, 0644);
        if (lock < 0) return fail("cannot create " + base + ".lock: " + std::strerror(errno));
        flock(lock, LOCK_EX);  // (ranks building the same module wait for the first)
        if (stat(so.c_str(), &st) != 0) {
            if (!write_file(base + ".cu", rewrite_dynamic_shared(src)))
                return close(lock), fail("cannot write " + base + ".cu");
            const char* cxx = std::getenv("CXX");
            std::vector<std::string> cmd = {cxx && *cxx ? cxx : "g++"};
            std::istringstream fl(layer_flags());
            for (std::string x; fl >> x;) cmd.push_back(x);
            cmd.insert(cmd.end(), {"-I", inc, "-include", "cudacpu.h", "-D__CUDA_ARCH__=" + arch});
            for (const std::string& d : defs) cmd.push_back("-D" + d);
            std::vector<std::string> scan = cmd;
            scan.insert(scan.end(), {"-DCUDACPU_SCAN", "-E", "-x", "c++", base + ".cu", "-o",
                                     base + ".i"});
            if (run(scan, base + ".log") != 0)
                return close(lock), fail("the CPU build's preprocessing failed:\n" + read_file(base + ".log"));
            std::string tu = "#include \"" + key + ".cu\"\n";
            for (const std::string& n : kernel_names(read_file(base + ".i")))
                tu += "CUDACPU_KERNEL(" + n + ")\n";
            write_file(base + ".tu.cpp", tu);
            std::vector<std::string> build = cmd;
            // linked to this runtime (the process has it loaded already: dlopen finds it)
            // (a runtime built into an executable, as the TSan harness, exports its symbols)
            Dl_info self{};
            dladdr((void*)&cudacpu_load, &self);
            const std::string lib = self.dli_fname ? self.dli_fname : "";
            build.insert(build.end(), {"-shared", "-x", "c++", base + ".tu.cpp"});
            if (lib.size() > 3 && lib.compare(lib.size() - 3, 3, ".so") == 0)
                build.insert(build.end(), {"-x", "none", lib,
                                           "-Wl,-rpath," + lib.substr(0, lib.rfind('/') + 1)});
            build.insert(build.end(), {"-o", so + ".tmp"});
            if (run(build, base + ".log") != 0)
                return close(lock), fail("the CPU build failed:\n" + read_file(base + ".log"));
            std::rename((so + ".tmp").c_str(), so.c_str());
        }
        close(lock);
    }
    auto* m = new cudacpu_module;
    m->key = key;
    m->source_path = base + ".cu";
    std::istringstream lines(read_file(base + ".cu"));
    for (std::string l; std::getline(lines, l);) m->lines.push_back(l);
    loading = m;
    m->handle = dlopen(so.c_str(), RTLD_NOW | RTLD_LOCAL);
    loading = nullptr;
    if (!m->handle) {
        const std::string why = dlerror();
        delete m;
        return fail("cannot load " + so + ": " + why);
    }
    modules[key] = m;
    return m;
}

cudacpu_kernel* cudacpu_kernel_of(cudacpu_module* m, const char* name) {
    auto it = m->kernels.find(name);
    return it == m->kernels.end() ? nullptr : it->second.get();
}

int cudacpu_kernel_count(const cudacpu_module* m) { return (int)m->kernels.size(); }

const char* cudacpu_kernel_at(const cudacpu_module* m, int i) {
    if (i < 0 || i >= (int)m->kernels.size()) return nullptr;
    return std::next(m->kernels.begin(), i)->first.c_str();
}

int cudacpu_params(const cudacpu_kernel* k, size_t* sizes, int cap) {
    for (int i = 0; sizes && i < (int)k->sizes.size() && i < cap; ++i) sizes[i] = k->sizes[i];
    return (int)k->sizes.size();
}

const char* cudacpu_kernel_name(const cudacpu_kernel* k) { return k->name.c_str(); }

int cudacpu_blocks_per_sm(const cudacpu_kernel* k, int threads, size_t dyn_smem) {
    // an sm_90 multiprocessor (CUDA C Programming Guide, "Compute Capabilities"): 64 Ki
    // registers allocated per warp in units of 256, 228 KiB of shared memory for blocks (each
    // also reserving 1 KiB), 2048 threads, 32 blocks; the kernel's registers and static shared
    // memory as ptxas reports them (resources.tsv, scripts/kernel_resources.py)
    if (threads <= 0) return 0;
    const int warps = (threads + 31) / 32;
    int n = std::min(32, 2048 / (warps * 32));
    const Resources r = resources_of(k->name);
    if (r.registers) {
        const int per_warp = (r.registers * 32 + 255) / 256 * 256;
        n = std::min(n, 65536 / (per_warp * warps));
    }
    n = std::min<int>(n, (int)(233472 / (r.shared + dyn_smem + 1024)));
    return std::max(n, 0);
}

int cudacpu_check(const cudacpu_kernel* k, cudacpu_dim3 grid, cudacpu_dim3 block,
                  size_t dyn_smem, int cooperative, int multiprocessors, char* err,
                  size_t errlen) {
    const unsigned long long threads = (unsigned long long)block.x * block.y * block.z;
    const unsigned long long blocks = (unsigned long long)grid.x * grid.y * grid.z;
    if (!threads || threads > 1024 || block.z > 64 || !blocks || grid.y > 65535 || grid.z > 65535) {
        std::snprintf(err, errlen, "%s: invalid launch shape grid %s block %s", k->name.c_str(),
                      dim(grid).c_str(), dim(block).c_str());
        return 1;  // CUDA_ERROR_INVALID_VALUE
    }
    if (dyn_smem > 49152) {
        std::snprintf(err, errlen, "%s: %zu bytes of dynamic shared memory (at most 49152 here)",
                      k->name.c_str(), dyn_smem);
        return 1;
    }
    const unsigned long long resident =
        (unsigned long long)cudacpu_blocks_per_sm(k, (int)threads, dyn_smem) *
        (unsigned long long)std::max(1, multiprocessors);
    if (cooperative && blocks > resident) {
        std::snprintf(err, errlen,
                      "%s: a cooperative grid of %llu blocks does not fit (%llu resident at "
                      "most: %d multiprocessors)",
                      k->name.c_str(), blocks, resident, multiprocessors);
        return 720;  // CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE
    }
    return 0;
}

int cudacpu_launch(const cudacpu_kernel* k, cudacpu_dim3 grid, cudacpu_dim3 block,
                   size_t dyn_smem, void** params, int cooperative, int multiprocessors,
                   char* err, size_t errlen) {
    if (int rc = cudacpu_check(k, grid, block, dyn_smem, cooperative, multiprocessors, err, errlen))
        return rc;
    const unsigned long long threads = (unsigned long long)block.x * block.y * block.z;
    const unsigned long long blocks = (unsigned long long)grid.x * grid.y * grid.z;
    const unsigned long long resident =
        (unsigned long long)cudacpu_blocks_per_sm(k, (int)threads, dyn_smem) *
        (unsigned long long)std::max(1, multiprocessors);
    static std::once_flag once;
    std::call_once(once, [] { std::thread(watchdog).detach(); });
    if (const char* trace = std::getenv("CUDACPU_TRACE"); trace && *trace) {
        static std::mutex mu;
        static std::set<std::string> traced;
        std::lock_guard<std::mutex> g(mu);
        if (traced.insert(k->name).second) {
            mkdir(trace, 0755);
            FILE* f = std::fopen((std::string(trace) + "/" + std::to_string(getpid()) + ".txt").c_str(), "a");
            if (f) {
                std::fprintf(f, "%s\n", k->name.c_str());
                std::fclose(f);
            }
        }
    }
    Launch L;
    L.k = k;
    L.grid = grid;
    L.block = block;
    for (size_t i = 0; i < k->sizes.size(); ++i) {  // by value, as the kernel receives them
        L.args.emplace_back(std::max<size_t>(k->sizes[i], 16) + 16);
        void* at = (void*)(((uintptr_t)L.args.back().data() + 15) & ~(uintptr_t)15);
        std::memcpy(at, params[i], k->sizes[i]);
        L.argp.push_back(at);
    }
    {
        std::lock_guard<std::mutex> g(launches_mu);
        launches.insert(&L);
    }
    // a cooperative grid runs every block at once; another runs its blocks on at most four
    // "multiprocessors" at a time (a GPU promises no more: a kernel whose blocks wait for
    // each other without a cooperative launch shows it here)
    const unsigned workers =
        (unsigned)(cooperative ? blocks : std::min({blocks, resident, 4ull}));
    std::atomic<unsigned long long> next{0};
    run_on_workers(workers, [&] {
        for (unsigned long long b; (b = next.fetch_add(1)) < blocks;) run_block(L, (unsigned)b);
    });
    {
        std::lock_guard<std::mutex> g(launches_mu);
        launches.erase(&L);
    }
    return 0;
}

}  // extern "C"
