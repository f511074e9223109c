// The PTX operations the project's kernels use, each behind one small device function: every
// inline ``asm`` of the CUDA sources lives here and nowhere else. The kernels include it as
// ``#include "shmem/kernels/ptx.cuh"``; shmem.device.cuda.nvrtc.source_of puts the text in
// place, so NVRTC compiles one string.
//
// On a GPU each function is the instruction it names (PTX ISA 8.x). Where SHMEM_CUDA_CPU is
// defined (the CUDA-on-CPU layer of the tests, tests/fakegpu/cudacpu) these definitions are
// left out and the layer provides the same functions, each as the PTX ISA defines it:
// fragment layouts of "Matrix Fragments for mma.m16n8k16 with floating point type" and of
// ldmatrix, round-to-nearest-even conversions, cp.async data visible only after the
// wait_group that covers its group. Names follow the instructions: ptx_<opcode>_<modifiers>.

#ifndef SHMEM_PTX_CUH
#define SHMEM_PTX_CUH
#ifndef SHMEM_CUDA_CPU

// -- conversions ------------------------------------------------------------------------------

// cvt.f32.f16: exact
__device__ __forceinline__ float ptx_cvt_f32_f16(unsigned short h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}
// cvt.rn.f16.f32: round to nearest even
__device__ __forceinline__ unsigned short ptx_cvt_rn_f16_f32(float a) {
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(a));
    return h;
}
// cvt.rn.bf16.f32 (sm_80 and newer)
__device__ __forceinline__ unsigned short ptx_cvt_rn_bf16_f32(float a) {
    unsigned short h;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(a));
    return h;
}
// cvt.rn.bf16x2.f32 d, a, b: a (rounded) goes to the upper half of d, b to the lower
__device__ __forceinline__ unsigned int ptx_cvt_rn_bf16x2_f32(float a, float b) {
    unsigned int r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(a), "f"(b));
    return r;
}
// cvt.rn.f16x2.f32 d, a, b: a (rounded) goes to the upper half of d, b to the lower
__device__ __forceinline__ unsigned int ptx_cvt_rn_f16x2_f32(float a, float b) {
    unsigned int r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(a), "f"(b));
    return r;
}

// -- memory order and time, at system scope (other GPUs and processes see them) ---------------

__device__ __forceinline__ void ptx_st_release_sys_u64(unsigned long long* p,
                                                       unsigned long long v) {
    asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ unsigned long long ptx_ld_acquire_sys_u64(const unsigned long long* p) {
    unsigned long long v;
    asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}
// atom.add.release.sys: returns the previous value
__device__ __forceinline__ unsigned long long ptx_atom_add_release_sys_u64(unsigned long long* p,
                                                                           unsigned long long v) {
    unsigned long long old;
    asm volatile("atom.add.release.sys.global.u64 %0, [%1], %2;"
                 : "=l"(old)
                 : "l"(p), "l"(v)
                 : "memory");
    return old;
}
// %globaltimer: nanoseconds
__device__ __forceinline__ unsigned long long ptx_globaltimer() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// -- tensor cores (warp-wide: every lane of the warp takes part) ------------------------------

// d = a b + c, m16n8k16, A row-major (4 registers of two bf16), B column-major (2), C and D
// four float32 each, in the fragment layouts of the PTX ISA; c is updated in place
__device__ __forceinline__ void ptx_mma_m16n8k16_f32_bf16(float* c, const unsigned int* a,
                                                          unsigned int b0, unsigned int b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// the same with float16 operands
__device__ __forceinline__ void ptx_mma_m16n8k16_f32_f16(float* c, const unsigned int* a,
                                                         unsigned int b0, unsigned int b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// -- shared memory ----------------------------------------------------------------------------

// the shared-window address of a generic pointer to shared memory
__device__ __forceinline__ unsigned int ptx_cvta_to_shared_u32(const void* p) {
    unsigned int a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    return a;
}
// ldmatrix.sync.aligned.m8n8.x2.shared.b16 (warp-wide): two 8x8 matrices of 16-bit
// elements; lanes 0-7 give matrix 0's row addresses, lanes 8-15 matrix 1's
__device__ __forceinline__ void ptx_ldmatrix_x2_b16(unsigned int& r0, unsigned int& r1,
                                                    unsigned int addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];"
                 : "=r"(r0), "=r"(r1)
                 : "r"(addr));
}
// the same, each matrix transposed
__device__ __forceinline__ void ptx_ldmatrix_x2_trans_b16(unsigned int& r0, unsigned int& r1,
                                                          unsigned int addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];"
                 : "=r"(r0), "=r"(r1)
                 : "r"(addr));
}
// cp.async.cg.shared.global: 16 bytes global -> shared, asynchronously; src_size bytes are
// read (0 or 16 here), the rest zero-filled. Visible only after a wait_group covering it.
__device__ __forceinline__ void ptx_cp_async_cg_16(unsigned int dst, const void* src,
                                                   unsigned int src_size) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src),
                 "r"(src_size));
}
// cp.async.commit_group: the cp.async operations issued since the last commit form a group
__device__ __forceinline__ void ptx_cp_async_commit_group() {
    asm volatile("cp.async.commit_group;");
}
// cp.async.wait_group N: until at most N of this thread's committed groups are pending
template <int N>
__device__ __forceinline__ void ptx_cp_async_wait_group() {
    asm volatile("cp.async.wait_group %0;" ::"n"(N));
}

#endif  // SHMEM_CUDA_CPU
#endif  // SHMEM_PTX_CUH
