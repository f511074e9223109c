// The front matter of a CUDA source built for the CPU (tests/fakegpu/cudacpu/README.md): the
// system C++ compiler sees this header (-include) and then the very source NVRTC compiled,
// with its -D defines and __CUDA_ARCH__ of its -arch. It gives the source what CUDA gives
// it: the qualifiers, the built-in variables, shared memory, barriers, warp-wide operations,
// atomics and the math and conversion intrinsics it uses, and the PTX operations of
// shmem/kernels/ptx.cuh, each as the PTX ISA defines it. Barriers, warp-wide operations,
// atomics and acquire loads call into the layer's runtime (libcudacpu.so), which runs every
// CUDA thread as a fiber and every block on a thread of its own.
//
// Shared memory: every `__shared__` variable becomes `static thread_local`. A block runs on
// one OS thread (its CUDA threads are fibers of that thread), so each block has its own
// copy, fresh for each launch; `extern __shared__ T name[]` (dynamic shared memory) is the
// block's cudacpu_dyn_smem, the loader rewriting that one declaration. A 32-bit shared-window
// address (cvta.to.shared) is the offset from cudacpu_dyn_smem: the module's thread-locals
// lie together in one block of thread-local storage.
#ifndef CUDACPU_H
#define CUDACPU_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include <type_traits>
#include <utility>

#include "cudacpu_api.h"

#define SHMEM_CUDA_CPU 1

#ifdef CUDACPU_SCAN  // the loader's first pass: find the kernels' names
#define __global__ CUDACPU_GLOBAL
#else
#define __global__
#endif
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
#define __shared__ static thread_local
#define __constant__ static
#define __restrict__ __restrict

// -- the built-in variables and vector types ---------------------------------------------------

struct uint3 {
    unsigned x, y, z;
};
typedef uint3 dim3;
struct uint4 {
    unsigned x, y, z, w;
};
struct int4 {
    int x, y, z, w;
};
struct float4 {
    float x, y, z, w;
};
struct uint2 {
    unsigned x, y;
};
static inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) {
    return uint4{x, y, z, w};
}

static_assert(sizeof(cudacpu_dim3) == sizeof(uint3), "cudacpu_dim3 is uint3");
#define threadIdx (*(const uint3*)&cudacpu_self()->thread_idx)
#define blockIdx (*(const uint3*)&cudacpu_self()->block_idx)
#define blockDim (*(const uint3*)&cudacpu_self()->block_dim)
#define gridDim (*(const uint3*)&cudacpu_self()->grid_dim)
#define warpSize 32

// dynamic shared memory (at most 48 KiB, CUDA's limit without an opt-in) and the anchor of
// shared-window addresses
static thread_local __attribute__((aligned(16))) unsigned char cudacpu_dyn_smem[49152];
#define CUDACPU_SMEM_BIAS 0x80000000u
static inline void* cudacpu_dynamic_shared() { return cudacpu_dyn_smem; }
static inline void* cudacpu_smem_ptr(unsigned addr, int line) {
    const long off = (long)addr - (long)CUDACPU_SMEM_BIAS;
    if (off < -(16l << 20) || off > (16l << 20)) cudacpu_fail("not a shared-memory address", line);
    return cudacpu_dyn_smem + off;
}

// -- barriers, fences ----------------------------------------------------------------------------

#define CUDACPU_SITE __builtin_return_address(0)
__attribute__((noinline)) static void cudacpu_bar(int line) {
    cudacpu_syncthreads(line, __builtin_return_address(0));
}
#define __syncthreads() cudacpu_bar(__LINE__)
#define __syncwarp(...) cudacpu_syncwarp_at(__LINE__ __VA_OPT__(, ) __VA_ARGS__)
__attribute__((noinline)) static void cudacpu_syncwarp_at(int line, unsigned mask = 0xffffffffu) {
    cudacpu_syncwarp(mask, line, __builtin_return_address(0));
}
static inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
static inline void __threadfence_block() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
static inline void __threadfence_system() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }

// -- warp shuffles -------------------------------------------------------------------------------

template <class T>
static inline uint64_t cudacpu_bits(T v) {
    static_assert(sizeof(T) <= 8, "a shuffled value has at most 8 bytes");
    uint64_t u = 0;
    memcpy(&u, &v, sizeof v);
    return u;
}
template <class T>
static inline T cudacpu_from_bits(uint64_t u) {
    T v;
    memcpy(&v, &u, sizeof v);
    return v;
}
// noinline, so that the return address names the call site in the kernel (the warp-wide
// operation's identity: every lane must be at the same one)
#define CUDACPU_SHFL(NAME, MODE)                                                               \
    template <class T>                                                                         \
    __attribute__((noinline)) static T NAME(unsigned mask, T v, int arg, int width = 32,       \
                                            int line = __builtin_LINE()) {                     \
        return cudacpu_from_bits<T>(cudacpu_shfl(mask, cudacpu_bits(v), MODE, arg, width,     \
                                                 line, __builtin_return_address(0)));          \
    }
CUDACPU_SHFL(__shfl_sync, 0)
CUDACPU_SHFL(__shfl_xor_sync, 1)
CUDACPU_SHFL(__shfl_up_sync, 2)
CUDACPU_SHFL(__shfl_down_sync, 3)

// -- atomics (real atomics: they work on memory other processes map; each one lets the
// block's other threads run, so a spin wait makes progress) -------------------------------------

#define CUDACPU_ATOMIC_INT(T)                                                                  \
    static inline T atomicAdd(T* p, T v) {                                                     \
        T r = __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST);                                      \
        cudacpu_yield(v != 0);                                                                 \
        return r;                                                                              \
    }                                                                                          \
    static inline T atomicSub(T* p, T v) {                                                     \
        T r = __atomic_fetch_sub(p, v, __ATOMIC_SEQ_CST);                                      \
        cudacpu_yield(v != 0);                                                                 \
        return r;                                                                              \
    }                                                                                          \
    static inline T atomicExch(T* p, T v) {                                                    \
        T r = __atomic_exchange_n(p, v, __ATOMIC_SEQ_CST);                                     \
        cudacpu_yield(r != v);                                                                 \
        return r;                                                                              \
    }                                                                                          \
    static inline T atomicCAS(T* p, T cmp, T v) {                                              \
        const T want = cmp;                                                                    \
        const bool ok = __atomic_compare_exchange_n(p, &cmp, v, false, __ATOMIC_SEQ_CST,       \
                                                    __ATOMIC_SEQ_CST);                         \
        cudacpu_yield(ok && want != v);                                                        \
        return cmp;                                                                            \
    }                                                                                          \
    static inline T atomicMax(T* p, T v) {                                                     \
        T old = __atomic_load_n(p, __ATOMIC_SEQ_CST);                                          \
        while (old < v && !__atomic_compare_exchange_n(p, &old, v, false, __ATOMIC_SEQ_CST,    \
                                                        __ATOMIC_SEQ_CST)) {                   \
        }                                                                                      \
        cudacpu_yield(old < v);                                                                \
        return old;                                                                            \
    }                                                                                          \
    static inline T atomicMin(T* p, T v) {                                                     \
        T old = __atomic_load_n(p, __ATOMIC_SEQ_CST);                                          \
        while (old > v && !__atomic_compare_exchange_n(p, &old, v, false, __ATOMIC_SEQ_CST,    \
                                                        __ATOMIC_SEQ_CST)) {                   \
        }                                                                                      \
        cudacpu_yield(old > v);                                                                \
        return old;                                                                            \
    }                                                                                          \
    static inline T atomicAdd_system(T* p, T v) { return atomicAdd(p, v); }                    \
    static inline T atomicExch_system(T* p, T v) { return atomicExch(p, v); }                  \
    static inline T atomicCAS_system(T* p, T c, T v) { return atomicCAS(p, c, v); }
CUDACPU_ATOMIC_INT(int)
CUDACPU_ATOMIC_INT(unsigned int)
CUDACPU_ATOMIC_INT(unsigned long long)
static inline float atomicAdd(float* p, float v) {
    unsigned int* u = (unsigned int*)p;
    unsigned int old = __atomic_load_n(u, __ATOMIC_SEQ_CST), next;
    do {
        float f;
        memcpy(&f, &old, 4);
        f += v;
        memcpy(&next, &f, 4);
    } while (!__atomic_compare_exchange_n(u, &old, next, false, __ATOMIC_SEQ_CST,
                                          __ATOMIC_SEQ_CST));
    cudacpu_yield(v != 0.f);
    float r;
    memcpy(&r, &old, 4);
    return r;
}

// -- math and bit intrinsics ---------------------------------------------------------------------

static inline int min(int a, int b) { return a < b ? a : b; }
static inline int max(int a, int b) { return a > b ? a : b; }
static inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
static inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
static inline long long min(long long a, long long b) { return a < b ? a : b; }
static inline long long max(long long a, long long b) { return a > b ? a : b; }
static inline unsigned long long min(unsigned long long a, unsigned long long b) {
    return a < b ? a : b;
}
static inline unsigned long long max(unsigned long long a, unsigned long long b) {
    return a > b ? a : b;
}
static inline float __int_as_float(int i) { return cudacpu_from_bits<float>((uint32_t)i); }
static inline float __uint_as_float(unsigned u) { return cudacpu_from_bits<float>(u); }
static inline int __float_as_int(float f) { return (int)cudacpu_bits(f); }
static inline unsigned __float_as_uint(float f) { return (unsigned)cudacpu_bits(f); }
static inline double __longlong_as_double(long long i) {
    return cudacpu_from_bits<double>((uint64_t)i);
}
static inline long long __double_as_longlong(double d) { return (long long)cudacpu_bits(d); }
// the _rn intrinsics: one IEEE operation each, rounded to nearest even (the layer is built
// with -ffp-contract=off, so nothing is fused)
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fdiv_rn(float a, float b) { return a / b; }
static inline double __dadd_rn(double a, double b) { return a + b; }
static inline double __dsub_rn(double a, double b) { return a - b; }
static inline double __dmul_rn(double a, double b) { return a * b; }
static inline double __ddiv_rn(double a, double b) { return a / b; }
static inline int __popc(unsigned x) { return __builtin_popcount(x); }
static inline int __clz(int x) { return x ? __builtin_clz((unsigned)x) : 32; }
static inline int __ffs(int x) { return __builtin_ffs(x); }

// -- the PTX operations of shmem/kernels/ptx.cuh ---------------------------------------------------

// cvt.f32.f16: exact (subnormals, infinities and NaN kept, NaN payload shifted in)
static inline float ptx_cvt_f32_f16(unsigned short h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    const uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    uint32_t bits;
    if (e == 0x1f) {
        bits = sign | 0x7f800000u | (m << 13);
    } else if (e != 0) {
        bits = sign | ((e + 112u) << 23) | (m << 13);
    } else {  // zero or subnormal: m * 2^-24, exact in float32
        const float v = (float)m * 5.9604644775390625e-08f;
        bits = sign | cudacpu_bits(v);
    }
    return cudacpu_from_bits<float>(bits);
}
// cvt.rn.f16.f32: round to nearest even; overflow to infinity; NaN to the canonical 0x7fff
static inline unsigned short ptx_cvt_rn_f16_f32(float a) {
    uint32_t x = (uint32_t)cudacpu_bits(a);
    const unsigned short sign = (unsigned short)((x >> 16) & 0x8000u);
    x &= 0x7fffffffu;
    if (x > 0x7f800000u) return 0x7fffu;
    if (x >= 0x477ff000u) return (unsigned short)(sign | 0x7c00u);  // 65520 and up: infinity
    if (x >= 0x38800000u) {                                           // a normal float16
        const uint32_t t = x - (112u << 23);
        return (unsigned short)(sign | ((t + 0xfffu + ((t >> 13) & 1u)) >> 13));
    }
    // below 2^-14: a multiple of 2^-24, |a| * 2^24 exact, rounded half to even by rintf
    const float scaled = cudacpu_from_bits<float>(x) * 16777216.0f;
    return (unsigned short)(sign | (unsigned short)rintf(scaled));
}
// cvt.rn.bf16.f32: round to nearest even; NaN to the canonical 0x7fff
static inline unsigned short ptx_cvt_rn_bf16_f32(float a) {
    const uint32_t x = (uint32_t)cudacpu_bits(a);
    if ((x & 0x7fffffffu) > 0x7f800000u) return 0x7fffu;
    return (unsigned short)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}
// cvt.rn.{bf16x2,f16x2}.f32 d, a, b: a to the upper half, b to the lower
static inline unsigned int ptx_cvt_rn_bf16x2_f32(float a, float b) {
    return ((unsigned)ptx_cvt_rn_bf16_f32(a) << 16) | ptx_cvt_rn_bf16_f32(b);
}
static inline unsigned int ptx_cvt_rn_f16x2_f32(float a, float b) {
    return ((unsigned)ptx_cvt_rn_f16_f32(a) << 16) | ptx_cvt_rn_f16_f32(b);
}

// memory order at system scope: C++ acquire/release on the same words (x86 orders more than
// a GPU does: a missing fence may pass here; tests/fakegpu/cudacpu/README.md)
static inline void ptx_st_release_sys_u64(unsigned long long* p, unsigned long long v) {
    __atomic_store_n(p, v, __ATOMIC_RELEASE);
}
static inline unsigned long long ptx_ld_acquire_sys_u64(const unsigned long long* p) {
    const unsigned long long v = __atomic_load_n(p, __ATOMIC_ACQUIRE);
    cudacpu_yield(0);
    return v;
}
static inline unsigned long long ptx_atom_add_release_sys_u64(unsigned long long* p,
                                                              unsigned long long v) {
    const unsigned long long old = __atomic_fetch_add(p, v, __ATOMIC_RELEASE);
    cudacpu_yield(v != 0);
    return old;
}
static inline unsigned long long ptx_globaltimer() { return cudacpu_globaltimer(); }

__attribute__((noinline)) static void ptx_mma_m16n8k16_f32_bf16(float* c, const unsigned int* a,
                                                                unsigned int b0, unsigned int b1,
                                                                int line = __builtin_LINE()) {
    cudacpu_mma_m16n8k16(0, c, a, b0, b1, line, __builtin_return_address(0));
}
__attribute__((noinline)) static void ptx_mma_m16n8k16_f32_f16(float* c, const unsigned int* a,
                                                               unsigned int b0, unsigned int b1,
                                                               int line = __builtin_LINE()) {
    cudacpu_mma_m16n8k16(1, c, a, b0, b1, line, __builtin_return_address(0));
}
static inline unsigned int ptx_cvta_to_shared_u32(const void* p) {
    return (unsigned)((const unsigned char*)p - cudacpu_dyn_smem) + CUDACPU_SMEM_BIAS;
}
__attribute__((noinline)) static void ptx_ldmatrix_x2_b16(unsigned int& r0, unsigned int& r1,
                                                          unsigned int addr,
                                                          int line = __builtin_LINE()) {
    cudacpu_ldmatrix_x2(0, &r0, &r1, cudacpu_smem_ptr(addr, line), line,
                        __builtin_return_address(0));
}
__attribute__((noinline)) static void ptx_ldmatrix_x2_trans_b16(unsigned int& r0,
                                                                unsigned int& r1,
                                                                unsigned int addr,
                                                                int line = __builtin_LINE()) {
    cudacpu_ldmatrix_x2(1, &r0, &r1, cudacpu_smem_ptr(addr, line), line,
                        __builtin_return_address(0));
}
static inline void ptx_cp_async_cg_16(unsigned int dst, const void* src, unsigned int src_size,
                                      int line = __builtin_LINE()) {
    cudacpu_cp_async(cudacpu_smem_ptr(dst, line), src, src_size);
}
static inline void ptx_cp_async_commit_group() { cudacpu_cp_async_commit(); }
template <int N>
static inline void ptx_cp_async_wait_group() {
    cudacpu_cp_async_wait(N);
}

// -- registration of the module's kernels (the loader appends CUDACPU_KERNEL(name) lines) ------

namespace cudacpu_detail {
template <class... A, size_t... I>
static void invoke_with(void* fn, void** p, std::index_sequence<I...>) {
    ((void (*)(A...))fn)(*static_cast<std::remove_cv_t<std::remove_reference_t<A>>*>(p[I])...);
}
template <class... A>
static void invoke(void* fn, void** p) {
    invoke_with<A...>(fn, p, std::index_sequence_for<A...>{});
}
template <class... A>
static int reg(const char* name, void (*fn)(A...)) {
    static const size_t sizes[] = {sizeof(A)..., 0};
    cudacpu_register(name, (void*)fn, &invoke<A...>, (int)sizeof...(A), sizes);
    return 0;
}
}  // namespace cudacpu_detail
#define CUDACPU_KERNEL(name) \
    static int cudacpu_reg_##name __attribute__((used)) = cudacpu_detail::reg(#name, &name);

#endif
