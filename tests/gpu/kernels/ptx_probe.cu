// Each PTX operation of shmem/kernels/ptx.cuh on given inputs, its results written out: run
// on the CPU layer against tables worked out from the PTX ISA (tests/fakegpu/test_cudacpu.py)
// and, the day a GPU is lent, on the GPU against the CPU layer with the same inputs (the
// first step of ./dev gpu: scripts/gpu_ptx_probe.py), so one run tells whether the CPU
// layer's layouts and roundings are the hardware's.

#include "shmem/kernels/ptx.cuh"

typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;

// out[6 i ..]: f16(x), bf16(x), f32 bits of f16(x)'s widening, f16x2(x, y), bf16x2(x, y), and
// the f32 bits of the f16 value h[i] widened (cvt.f32.f16 of every 16-bit pattern given)
extern "C" __global__ void ptx_probe_cvt(const float* x, const u16* h, u32* out, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float a = x[i], b = x[(i + 1) % n];
    const u16 f = ptx_cvt_rn_f16_f32(a);
    out[6 * i + 0] = f;
    out[6 * i + 1] = ptx_cvt_rn_bf16_f32(a);
    out[6 * i + 2] = __float_as_uint(ptx_cvt_f32_f16(f));
    out[6 * i + 3] = ptx_cvt_rn_f16x2_f32(a, b);
    out[6 * i + 4] = ptx_cvt_rn_bf16x2_f32(a, b);
    out[6 * i + 5] = __float_as_uint(ptx_cvt_f32_f16(h[i]));
}

// one warp per 16x8 tile: lane l brings a[4l..4l+3], b[2l], b[2l+1], c[4l..4l+3] and writes
// d[4l..4l+3]; kind 0 bfloat16, 1 float16
extern "C" __global__ void ptx_probe_mma(const u32* a, const u32* b, const float* c, float* d,
                                         int kind) {
    const int lane = threadIdx.x & 31, tile = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    const u32* at = a + 128 * tile + 4 * lane;
    const u32* bt = b + 64 * tile + 2 * lane;
    float acc[4];
    for (int i = 0; i < 4; ++i) acc[i] = c[128 * tile + 4 * lane + i];
    u32 frag[4] = {at[0], at[1], at[2], at[3]};
    if (kind == 0)
        ptx_mma_m16n8k16_f32_bf16(acc, frag, bt[0], bt[1]);
    else
        ptx_mma_m16n8k16_f32_f16(acc, frag, bt[0], bt[1]);
    for (int i = 0; i < 4; ++i) d[128 * tile + 4 * lane + i] = acc[i];
}

// one warp: m holds 32 rows of 8 16-bit elements, staged in shared memory; lane l < 16 gives
// the address of row rows[l] (lanes 16-31 give rows[l - 16], unused by .x2); out[2l], out[2l+1]
// receive r0, r1 (trans 0: ldmatrix.x2, 1: ldmatrix.x2.trans)
extern "C" __global__ void ptx_probe_ldmatrix(const u16* m, const int* rows, u32* out, int trans) {
    __shared__ __align__(16) u16 tile[32][8];
    const int lane = threadIdx.x & 31;
    for (int c = 0; c < 8; ++c) tile[lane][c] = m[8 * lane + c];
    __syncthreads();
    u32 r0, r1;
    const u32 addr = ptx_cvta_to_shared_u32(&tile[rows[lane & 15]][0]);
    if (trans)
        ptx_ldmatrix_x2_trans_b16(r0, r1, addr);
    else
        ptx_ldmatrix_x2_b16(r0, r1, addr);
    out[2 * lane] = r0;
    out[2 * lane + 1] = r1;
}

// cp.async: each thread copies src[t] (group 0) and zero-fills a second slot (group 1, src_size
// 0); out[3 t] is slot 0 after wait_group 1 (group 0 landed), out[3 t + 1] slot 1 after
// wait_group 0, out[3 t + 2] slot 1's old value as read after wait_group 1 (group 1 may still
// be in flight: on a GPU either value, on the CPU layer the old one)
extern "C" __global__ void ptx_probe_cp_async(const uint4* src, uint4* out) {
    __shared__ __align__(16) uint4 slots[64][2];
    const int t = threadIdx.x;
    slots[t][0] = make_uint4(0xdeadbeefu, 0xdeadbeefu, 0xdeadbeefu, 0xdeadbeefu);
    slots[t][1] = make_uint4(0xfeedfaceu, 0xfeedfaceu, 0xfeedfaceu, 0xfeedfaceu);
    ptx_cp_async_cg_16(ptx_cvta_to_shared_u32(&slots[t][0]), &src[t], 16);
    ptx_cp_async_commit_group();
    ptx_cp_async_cg_16(ptx_cvta_to_shared_u32(&slots[t][1]), &src[t], 0);
    ptx_cp_async_commit_group();
    ptx_cp_async_wait_group<1>();
    out[3 * t] = slots[t][0];
    out[3 * t + 2] = slots[t][1];
    ptx_cp_async_wait_group<0>();
    out[3 * t + 1] = slots[t][1];
}

// system-scope memory order and time, one thread: word[0] += 5 by atom.add.release (out[0]
// the old value), word[1] = 7 by st.release, out[1] = ld.acquire of word[1], out[2] = whether
// %globaltimer did not go back between two reads
extern "C" __global__ void ptx_probe_order(u64* word, u64* out) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    out[0] = ptx_atom_add_release_sys_u64(&word[0], 5);
    ptx_st_release_sys_u64(&word[1], 7);
    out[1] = ptx_ld_acquire_sys_u64(&word[1]);
    const u64 t0 = ptx_globaltimer(), t1 = ptx_globaltimer();
    out[2] = t1 >= t0 && t0 > 0;
}
