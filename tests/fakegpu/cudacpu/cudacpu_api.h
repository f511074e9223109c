/* The CUDA-on-CPU layer's C interface (tests/fakegpu/cudacpu/README.md): what the fake
   libcuda calls to build, load and launch a kernel module, and what a kernel module (a CUDA
   source compiled by the system C++ compiler with cudacpu.h in front) calls for the
   operations a GPU does in hardware. Plain C: fake_libcuda.c includes it too. */
#ifndef CUDACPU_API_H
#define CUDACPU_API_H
#include <stddef.h>
#include <stdint.h>
#ifdef __cplusplus
extern "C" {
#endif

typedef struct cudacpu_dim3 { unsigned x, y, z; } cudacpu_dim3;

/* What a CUDA thread sees of itself (threadIdx and the rest). */
typedef struct cudacpu_thread {
    cudacpu_dim3 thread_idx, block_idx, block_dim, grid_dim;
} cudacpu_thread;

typedef struct cudacpu_module cudacpu_module;
typedef struct cudacpu_kernel cudacpu_kernel;

/* -- for the fake driver ---------------------------------------------------------------- */

/* Build (or take from the cache) and load the module of `source` compiled with NVRTC's
   `options` (one option per line: -D..., -arch=sm_90, ...). NULL and a message in err on
   failure. */
cudacpu_module* cudacpu_load(const char* source, size_t len, const char* options, char* err,
                             size_t errlen);
/* The module's kernel `name`, or NULL. */
cudacpu_kernel* cudacpu_kernel_of(cudacpu_module* m, const char* name);
/* The module's kernels, by index (in name order). */
int cudacpu_kernel_count(const cudacpu_module* m);
const char* cudacpu_kernel_at(const cudacpu_module* m, int i);
/* Its parameters: how many, and each one's size in bytes (`sizes` holds `cap`). */
int cudacpu_params(const cudacpu_kernel* k, size_t* sizes, int cap);
const char* cudacpu_kernel_name(const cudacpu_kernel* k);
/* The most blocks of `threads` threads (and `dyn_smem` dynamic shared bytes) one of the fake
   GPU's multiprocessors holds at once, for this kernel. */
int cudacpu_blocks_per_sm(const cudacpu_kernel* k, int threads, size_t dyn_smem);
/* Whether the launch may run (the checks cudacpu_launch makes first): 0, or a CUDA error code
   with a message in err. */
int cudacpu_check(const cudacpu_kernel* k, cudacpu_dim3 grid, cudacpu_dim3 block,
                  size_t dyn_smem, int cooperative, int multiprocessors, char* err,
                  size_t errlen);
/* Run a launch to its end: `params[i]` points at parameter i's value. Every block of a
   cooperative launch is resident at once (it must fit cudacpu_blocks_per_sm times the
   multiprocessors); other launches run their blocks as multiprocessors free up. 0, or a
   CUDA error code with a message in err (too many threads, too much shared memory, a
   cooperative grid that does not fit). Errors in the kernel itself (a deadlock, lanes that
   diverge at a warp-wide operation) are reported on stderr and abort the process. */
int cudacpu_launch(const cudacpu_kernel* k, cudacpu_dim3 grid, cudacpu_dim3 block,
                   size_t dyn_smem, void** params, int cooperative, int multiprocessors,
                   char* err, size_t errlen);

/* -- for kernel modules (cudacpu.h) ------------------------------------------------------- */

void cudacpu_register(const char* name, void* fn, void (*invoke)(void*, void**), int nparams,
                      const size_t* sizes);
const cudacpu_thread* cudacpu_self(void);
void cudacpu_syncthreads(int line, const void* site);
void cudacpu_syncwarp(unsigned mask, int line, const void* site);
/* a point where this thread lets the others of its block run (atomics, acquire loads);
   `changed`: the operation changed memory (an atomic that stored a new value), which counts
   as progress; a load, or an atomic that stored what was there, is a spin */
void cudacpu_yield(int changed);
/* warp-wide shuffles: mode 0 idx, 1 xor, 2 up, 3 down; `value` is the lane's 64 bits */
uint64_t cudacpu_shfl(unsigned mask, uint64_t value, int mode, int arg, int width, int line,
                      const void* site);
/* mma.sync.aligned.m16n8k16.row.col.f32.{bf16 (kind 0), f16 (kind 1)}.f32: c updated */
void cudacpu_mma_m16n8k16(int kind, float* c, const unsigned* a, unsigned b0, unsigned b1,
                          int line, const void* site);
/* ldmatrix.sync.aligned.m8n8.x2[.trans].shared.b16; `row` is this lane's row address */
void cudacpu_ldmatrix_x2(int trans, unsigned* r0, unsigned* r1, const void* row, int line,
                         const void* site);
/* cp.async.cg.shared.global 16 bytes (src_size read, the rest zero), commit, wait_group n */
void cudacpu_cp_async(void* dst, const void* src, unsigned src_size);
void cudacpu_cp_async_commit(void);
void cudacpu_cp_async_wait(int n);
/* %globaltimer: nanoseconds (CLOCK_REALTIME, the same in every process) */
unsigned long long cudacpu_globaltimer(void);
/* a kernel's own fatal error (a shared address that is not shared memory, say) */
void cudacpu_fail(const char* what, int line);

#ifdef __cplusplus
}
#endif
#endif
