// Multi-head attention on the GPU: FlashAttention-2 (Dao, 2023) in a persistent tile kernel
// driven by the host's MHATileScheduler model (collectives/mha/scheduler.py).
//
// Forward, one work item = BM (64) query rows of one head of one sequence; 4 warps, each owns
// 16 rows. For every KV tile of BN (64) keys, in the paper's notation:
//
//     S_ij  = Q_i K_j^T * scale              (mma.sync m16n8k16, bf16 or fp16, fp32 accumulate)
//     m_new = max(m_i, rowmax(S_ij))          (-inf where the mask hides a key)
//     P_ij  = exp(S_ij - m_new)                (exp2 of pre-scaled logits)
//     l_i   = exp(m_i - m_new) l_i + rowsum(P_ij)
//     O_i   = exp(m_i - m_new) O_i + P_ij V_j  (P in registers, rounded to the input type)
//     O_i  /= l_i,  LSE_i = m_i + log(l_i)     (rows that see no key: O = 0, LSE = -inf)
//
// K and V tiles go through shared memory with cp.async (K of the next tile is loaded while
// this tile's softmax and P V run); Q stays in registers for the whole item.
//
// Scheduling. The host enumerates the work order once (one source of truth: the order table
// is made from the Python scheduler's linear index -> (batch, head, tile) mapping, with
// DEFAULT, PROMPT_ROTATE or LPT order) and the kernel only steps through it:
//   mode 0 (TransientScheduler): CTA c takes item c and exits (a grid of num_items CTAs);
//   mode 1 (TileScheduler):      CTA c takes items c, c + G, c + 2G, ... (G = gridDim.x);
//   mode 2 (QueuedTileScheduler): CTA c starts on item c, then takes G + atomicAdd(counter, 1).
// Static and queued modes skip items past a ragged sequence's end, as the host does. Each
// queued launch has its own counters, zeroed on its stream before it (launches on different
// streams may overlap); the last CTA to finish also resets them. With trace != 0, CTA c writes the items it took,
// in order, to trace[c * trace_cap + k] (as idx + 1), for the scheduler tests.
//
// Masks: causal (key <= query, positions within the sequence; with ragged row offsets this is
// document-causal), sliding window (query - left <= key <= query + right; -1: unbounded),
// ragged sequences (row_offsets: batch + 1 int64 row offsets; null: padded [batch, seq]).
// Padded inputs may have kv_len keys per sequence against seq_len query rows, query row i
// standing at key position i + delta (every mask in those positions): a sequence-parallel
// unit (a query chunk against another rank's KV chunk) or queries at the end of a KV cache.
// GQA/MQA: query head h reads KV head h / (num_heads / num_kv_heads).
//
// Layouts: element strides (batch, row, head) for q, k, v, o and lse; the head dimension is
// contiguous. Pointers and strides must keep 16-byte alignment of every row (the host checks).
//
// The backward pass (FA2 backward, P recomputed from the LSE) is a separate set of fp32
// kernels further down: dvec (rowsum(dO * O)), dkdv (per KV tile, over query rows) and dq (per
// query tile, over keys). Each output element is written by one thread, in a fixed order: the
// backward is bitwise deterministic (no atomics).

typedef unsigned short u16;
typedef unsigned int u32;
typedef long long i64;
typedef unsigned long long u64;

#define BM 64
#define BN 64
#define WARPS 4
#define THREADS (32 * WARPS)
#define PAD 8
#define NEG_INF (-__int_as_float(0x7f800000))
#define LN2 0.6931471805599453f

struct f16 { u16 bits; };
struct bf16 { u16 bits; };

#include "shmem/kernels/ptx.cuh"

// -- element conversions --------------------------------------------------------------------

__device__ __forceinline__ float to_f32(f16 x) { return ptx_cvt_f32_f16(x.bits); }
__device__ __forceinline__ float to_f32(bf16 x) { return __uint_as_float(((u32)x.bits) << 16); }
__device__ __forceinline__ float to_f32(float x) { return x; }

__device__ __forceinline__ void store_f32(f16* p, float a) { p->bits = ptx_cvt_rn_f16_f32(a); }
__device__ __forceinline__ void store_f32(bf16* p, float a) { p->bits = ptx_cvt_rn_bf16_f32(a); }
__device__ __forceinline__ void store_f32(float* p, float a) { *p = a; }

// two floats as one register of two 16-bit values (lo in the low half)
__device__ __forceinline__ u32 pack2(float lo, float hi, bf16*) {
    return ptx_cvt_rn_bf16x2_f32(hi, lo);
}
__device__ __forceinline__ u32 pack2(float lo, float hi, f16*) {
    return ptx_cvt_rn_f16x2_f32(hi, lo);
}

// -- tensor-core and shared-memory primitives ------------------------------------------------

__device__ __forceinline__ void mma(float* c, const u32* a, u32 b0, u32 b1, bf16*) {
    ptx_mma_m16n8k16_f32_bf16(c, a, b0, b1);
}
__device__ __forceinline__ void mma(float* c, const u32* a, u32 b0, u32 b1, f16*) {
    ptx_mma_m16n8k16_f32_f16(c, a, b0, b1);
}

__device__ __forceinline__ u32 smem_addr(const void* p) { return ptx_cvta_to_shared_u32(p); }

// two 8x8 b16 matrices; lanes 0-7 give matrix 0's row addresses, lanes 8-15 matrix 1's
__device__ __forceinline__ void ldmatrix_x2(u32& r0, u32& r1, u32 addr) {
    ptx_ldmatrix_x2_b16(r0, r1, addr);
}
__device__ __forceinline__ void ldmatrix_x2_trans(u32& r0, u32& r1, u32 addr) {
    ptx_ldmatrix_x2_trans_b16(r0, r1, addr);
}

// 16 bytes global -> shared, zero-filled when !valid (src_size 0 reads nothing)
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
    ptx_cp_async_cg_16(smem_addr(dst), src, valid ? 16 : 0);
}
__device__ __forceinline__ void cp_async_commit() { ptx_cp_async_commit_group(); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { ptx_cp_async_wait_group<N>(); }

// -- the scheduler ---------------------------------------------------------------------------

struct Work {
    const int* order;        // num_items x (batch, head, tile), the host's enumeration
    int num_items;
    int mode;                // 0 transient, 1 static, 2 queued
    int* counters;           // queued: [next claim - G, CTAs finished]; zero before first use
    const i64* row_offsets;  // ragged: batch + 1 row offsets; null: padded
    int seq_len;             // padded query rows per sequence (ragged: unused)
    int kv_len;              // padded keys per sequence (ragged: unused, the query rows)
    int* trace;              // optional: items taken per CTA (idx + 1)
    int trace_cap;
};

__device__ __forceinline__ int seq_len_of(const Work& w, int b) {
    return w.row_offsets ? (int)(w.row_offsets[b + 1] - w.row_offsets[b]) : w.seq_len;
}
__device__ __forceinline__ int kv_len_of(const Work& w, int b) {
    return w.row_offsets ? seq_len_of(w, b) : w.kv_len;
}

__device__ __forceinline__ bool item_valid(const Work& w, int idx) {
    return w.order[3 * idx + 2] * BM < seq_len_of(w, w.order[3 * idx]);
}

// The next item for this CTA (every thread gets the same value): ``first`` for the initial
// state, else the advance after ``idx``.
__device__ int next_item(const Work& w, int idx, bool first, int* s_idx) {
    const int g = gridDim.x;
    if (w.mode == 0) return first ? (int)blockIdx.x : w.num_items;
    if (w.mode == 1) {
        idx = first ? (int)blockIdx.x : idx + g;
        while (idx < w.num_items && !item_valid(w, idx)) idx += g;
        return idx;
    }
    __syncthreads();  // every thread has read the previous s_idx
    if (threadIdx.x == 0) {
        int i = first ? (int)blockIdx.x : g + atomicAdd(&w.counters[0], 1);
        while (i < w.num_items && !item_valid(w, i)) i = g + atomicAdd(&w.counters[0], 1);
        *s_idx = i;
    }
    __syncthreads();
    return *s_idx;
}

__device__ void record(const Work& w, int k, int idx) {
    if (w.trace && threadIdx.x == 0 && k < w.trace_cap) w.trace[blockIdx.x * w.trace_cap + k] = idx + 1;
}

// The last CTA to finish resets the queued counter for the next launch.
__device__ void finish(const Work& w) {
    if (w.mode != 2) return;
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        if (atomicAdd(&w.counters[1], 1) == (int)gridDim.x - 1) {
            __threadfence();
            atomicExch(&w.counters[0], 0);
            atomicExch(&w.counters[1], 0);
        }
    }
}

// Positions: query row i stands at position i + delta of the keys' sequence (delta 0: self
// attention; a sequence-parallel unit's query chunk against another chunk's keys has the
// chunks' position difference; a query block at the end of a KV cache, kv_len - seq_len).
struct Mask {
    int causal, left, right;  // left/right: -1 unbounded
    int delta;
};

// keys [*k0, *k1) that query rows [q0, q1) may see (a superset per row), of n keys:
// MaskSpec.kv_range with the rows moved by delta
__device__ __forceinline__ void kv_range(const Mask& m, int q0, int q1, int n, int* k0, int* k1) {
    int s = 0, e = n;
    if (m.causal) e = min(e, q1 + m.delta);
    if (m.left >= 0) s = max(s, q0 + m.delta - m.left);
    if (m.right >= 0) e = min(e, q1 + m.delta + m.right);
    s = min(s, n);
    *k0 = s;
    *k1 = max(s, e);
}

__device__ __forceinline__ bool visible(const Mask& m, int i, int j, int k0, int k1) {
    const int p = i + m.delta;
    return j >= k0 && j < k1 && (!m.causal || j <= p) && (m.left < 0 || j >= p - m.left) &&
           (m.right < 0 || j <= p + m.right);
}

struct Strides {
    i64 b, s, h;  // elements per batch, row, head
};

// -- forward, tensor cores ---------------------------------------------------------------------

template <typename T, int D>
__device__ void fwd_item(const T* q, const T* k, const T* v, T* o, float* lse, Strides sq,
                         Strides sk, Strides sv, Strides so, Strides sl, const Work& w,
                         const Mask& mask, int group, float scale_log2, int b, int h, int tile,
                         u16 (*ks)[D + PAD], u16 (*vs)[D + PAD]) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int n = seq_len_of(w, b);
    const i64 start = w.row_offsets ? w.row_offsets[b] : 0;
    const int bb = w.row_offsets ? 0 : b;
    const int hk = h / group;
    const T* qb = q + bb * sq.b + start * sq.s + h * sq.h;
    const T* kb = k + bb * sk.b + start * sk.s + hk * sk.h;
    const T* vb = v + bb * sv.b + start * sv.s + hk * sv.h;
    const int q0 = tile * BM, q1 = min(q0 + BM, n);
    int k0, k1;
    kv_range(mask, q0, q1, kv_len_of(w, b), &k0, &k1);
    const int row0 = q0 + warp * 16 + g, row1 = row0 + 8;  // this thread's two query rows

    // Q fragments (A operand, row-major 16 x 16 per k-step), straight from global memory
    u32 qa[D / 16][4];
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
        const int c = kk * 16 + 2 * t;
        const u32* r0p = (const u32*)(qb + (i64)row0 * sq.s + c);
        const u32* r1p = (const u32*)(qb + (i64)row1 * sq.s + c);
        qa[kk][0] = row0 < n ? r0p[0] : 0u;
        qa[kk][1] = row1 < n ? r1p[0] : 0u;
        qa[kk][2] = row0 < n ? r0p[4] : 0u;
        qa[kk][3] = row1 < n ? r1p[4] : 0u;
    }

    float acc[D / 8][4];
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt) acc[dt][0] = acc[dt][1] = acc[dt][2] = acc[dt][3] = 0.f;
    float m_r[2] = {NEG_INF, NEG_INF}, l_r[2] = {0.f, 0.f};

    constexpr int CHUNKS = BN * D / 8;  // 16-byte chunks of a K or V tile
    auto load = [&](u16 (*dst)[D + PAD], const T* src, i64 stride, int j0) {
        for (int c = threadIdx.x; c < CHUNKS; c += THREADS) {
            const int r = c / (D / 8), col = (c % (D / 8)) * 8;
            const int j = j0 + r;
            const bool ok = j < k1;
            cp_async16(&dst[r][col], src + (i64)(ok ? j : k0) * stride + col, ok);
        }
        cp_async_commit();
    };

    if (k0 < k1) {
        load(ks, kb, sk.s, k0);
        load(vs, vb, sv.s, k0);
    }
    for (int j0 = k0; j0 < k1; j0 += BN) {
        const bool more = j0 + BN < k1;
        cp_async_wait<1>();  // this tile's K (its V may still be in flight)
        __syncthreads();

        float s[BN / 8][4];
#pragma unroll
        for (int nt = 0; nt < BN / 8; ++nt) {
            s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
#pragma unroll
            for (int kk = 0; kk < D / 16; ++kk) {
                u32 b0, b1;
                const int r = nt * 8 + (lane & 7), col = kk * 16 + ((lane >> 3) & 1) * 8;
                ldmatrix_x2(b0, b1, smem_addr(&ks[r][col]));
                mma(s[nt], qa[kk], b0, b1, (T*)0);
            }
        }
        __syncthreads();  // every warp is done with K: the next tile's K may land
        if (more) load(ks, kb, sk.s, j0 + BN);

        // mask, scale (log2 domain), online softmax; rows row0 (c0, c1) and row1 (c2, c3)
        float mx[2] = {NEG_INF, NEG_INF};
#pragma unroll
        for (int nt = 0; nt < BN / 8; ++nt) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int i = e < 2 ? row0 : row1;
                const int j = j0 + nt * 8 + 2 * t + (e & 1);
                const float x = (i < n && visible(mask, i, j, k0, k1)) ? s[nt][e] * scale_log2
                                                                        : NEG_INF;
                s[nt][e] = x;
                mx[e >> 1] = fmaxf(mx[e >> 1], x);
            }
        }
        float alpha[2], base[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
            const float m_new = fmaxf(m_r[r], mx[r]);
            base[r] = m_new == NEG_INF ? 0.f : m_new;
            alpha[r] = exp2f(m_r[r] - base[r]);  // m_r = -inf: 0
            m_r[r] = m_new;
            l_r[r] *= alpha[r];
        }
#pragma unroll
        for (int nt = 0; nt < BN / 8; ++nt) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const float p = exp2f(s[nt][e] - base[e >> 1]);
                s[nt][e] = p;
                l_r[e >> 1] += p;
            }
        }
#pragma unroll
        for (int dt = 0; dt < D / 8; ++dt) {
            acc[dt][0] *= alpha[0];
            acc[dt][1] *= alpha[0];
            acc[dt][2] *= alpha[1];
            acc[dt][3] *= alpha[1];
        }

        if (more) cp_async_wait<1>(); else cp_async_wait<0>();  // this tile's V
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < BN / 16; ++kk) {
            u32 pa[4];  // P as the A operand: the accumulators of n-tiles 2kk and 2kk + 1
            pa[0] = pack2(s[2 * kk][0], s[2 * kk][1], (T*)0);
            pa[1] = pack2(s[2 * kk][2], s[2 * kk][3], (T*)0);
            pa[2] = pack2(s[2 * kk + 1][0], s[2 * kk + 1][1], (T*)0);
            pa[3] = pack2(s[2 * kk + 1][2], s[2 * kk + 1][3], (T*)0);
#pragma unroll
            for (int dt = 0; dt < D / 8; ++dt) {
                u32 b0, b1;
                const int r = kk * 16 + ((lane >> 3) & 1) * 8 + (lane & 7);
                ldmatrix_x2_trans(b0, b1, smem_addr(&vs[r][dt * 8]));
                mma(acc[dt], pa, b0, b1, (T*)0);
            }
        }
        __syncthreads();  // every warp is done with V
        if (more) load(vs, vb, sv.s, j0 + BN);
    }

    // finish: l across the quad, O / l, LSE
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        l_r[r] += __shfl_xor_sync(0xffffffffu, l_r[r], 1);
        l_r[r] += __shfl_xor_sync(0xffffffffu, l_r[r], 2);
    }
    T* ob = o + bb * so.b + start * so.s + h * so.h;
    float* lb = lse + bb * sl.b + start * sl.s + h * sl.h;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int i = r ? row1 : row0;
        if (i >= q1) continue;
        const float inv = l_r[r] > 0.f ? 1.f / l_r[r] : 0.f;
#pragma unroll
        for (int dt = 0; dt < D / 8; ++dt) {
            T* p = ob + (i64)i * so.s + dt * 8 + 2 * t;
            *(u32*)p = pack2(acc[dt][2 * r] * inv, acc[dt][2 * r + 1] * inv, (T*)0);
        }
        if (t == 0) lb[(i64)i * sl.s] = l_r[r] > 0.f ? (m_r[r] + log2f(l_r[r])) * LN2 : NEG_INF;
    }
}

template <typename T, int D>
__device__ void fwd(const T* q, const T* k, const T* v, T* o, float* lse, Strides sq, Strides sk,
                    Strides sv, Strides so, Strides sl, Work w, Mask mask, int group,
                    float scale_log2) {
    __shared__ __align__(16) u16 ks[BN][D + PAD];
    __shared__ __align__(16) u16 vs[BN][D + PAD];
    __shared__ int s_idx;
    int idx = next_item(w, 0, true, &s_idx);
    for (int done = 0; idx < w.num_items; ++done) {
        record(w, done, idx);
        if (item_valid(w, idx)) {
            fwd_item<T, D>(q, k, v, o, lse, sq, sk, sv, so, sl, w, mask, group, scale_log2,
                           w.order[3 * idx], w.order[3 * idx + 1], w.order[3 * idx + 2], ks, vs);
        }
        __syncthreads();  // the tiles' shared memory is free for the next item
        idx = next_item(w, idx, false, &s_idx);
    }
    finish(w);
}

#define FWD_ARGS(T)                                                                             \
    const T *q, const T *k, const T *v, T *o, float *lse, const int *order, int num_items,      \
        int mode, int *counters, const i64 *row_offsets, int seq_len, int kv_len, int *trace,  \
        int trace_cap, i64 q_sb, i64 q_ss, i64 q_sh, i64 k_sb, i64 k_ss, i64 k_sh, i64 v_sb,    \
        i64 v_ss, i64 v_sh, i64 o_sb, i64 o_ss, i64 o_sh, i64 l_sb, i64 l_ss, i64 l_sh,         \
        int causal, int left, int right, int delta, int group, float scale_log2
#define FWD_CALL                                                                                \
    Work w = {order, num_items, mode, counters, row_offsets, seq_len, kv_len, trace,            \
              trace_cap};                                                                       \
    Mask m = {causal, left, right, delta};                                                      \
    Strides sq = {q_sb, q_ss, q_sh}, sk = {k_sb, k_ss, k_sh}, sv = {v_sb, v_ss, v_sh};          \
    Strides so = {o_sb, o_ss, o_sh}, sl = {l_sb, l_ss, l_sh};

#define FWD_KERNEL(NAME, T, D)                                                                  \
    extern "C" __global__ void __launch_bounds__(THREADS) NAME(FWD_ARGS(T)) {                   \
        FWD_CALL                                                                                \
        fwd<T, D>(q, k, v, o, lse, sq, sk, sv, so, sl, w, m, group, scale_log2);                \
    }

FWD_KERNEL(mha_fwd_bfloat16_d64, bf16, 64)
FWD_KERNEL(mha_fwd_bfloat16_d80, bf16, 80)
FWD_KERNEL(mha_fwd_bfloat16_d96, bf16, 96)
FWD_KERNEL(mha_fwd_bfloat16_d128, bf16, 128)
FWD_KERNEL(mha_fwd_float16_d64, f16, 64)
FWD_KERNEL(mha_fwd_float16_d80, f16, 80)
FWD_KERNEL(mha_fwd_float16_d96, f16, 96)
FWD_KERNEL(mha_fwd_float16_d128, f16, 128)

// -- forward, the general path (float32 inputs, or any head_dim <= 128; CUDA cores) -----------
//
// The same work items, mask and online softmax. Rows go in rounds of WARPS (one row per warp;
// every warp takes part in every round's KV-tile barriers, with or without a row); lane l
// scores key j0 + l of a GEN_BN-key tile and accumulates head dimensions l, l + 32, ...

#define GEN_MAX_D 128
#define GEN_BN 32

template <typename T>
__device__ void fwd_general_item(const T* q, const T* k, const T* v, T* o, float* lse, Strides sq,
                                 Strides sk, Strides sv, Strides so, Strides sl, const Work& w,
                                 const Mask& mask, int group, float scale_log2, int d, int b,
                                 int h, int tile, float* ks, float* vs, float* qs) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int n = seq_len_of(w, b);
    const i64 start = w.row_offsets ? w.row_offsets[b] : 0;
    const int bb = w.row_offsets ? 0 : b;
    const int hk = h / group;
    const T* qb = q + bb * sq.b + start * sq.s + h * sq.h;
    const T* kb = k + bb * sk.b + start * sk.s + hk * sk.h;
    const T* vb = v + bb * sv.b + start * sv.s + hk * sv.h;
    T* ob = o + bb * so.b + start * so.s + h * so.h;
    float* lb = lse + bb * sl.b + start * sl.s + h * sl.h;
    const int q0 = tile * BM, q1 = min(q0 + BM, n);
    int k0, k1;
    kv_range(mask, q0, q1, kv_len_of(w, b), &k0, &k1);
    const int per = (d + 31) / 32;
    float* qw = qs + warp * GEN_MAX_D;
    for (int r0 = q0; r0 < q1; r0 += WARPS) {
        const int i = r0 + warp;
        const bool active = i < q1;
        float acc[GEN_MAX_D / 32];
#pragma unroll
        for (int e = 0; e < GEN_MAX_D / 32; ++e) acc[e] = 0.f;
        float m_i = NEG_INF, l_i = 0.f;
        if (active)
            for (int c = lane; c < d; c += 32) qw[c] = to_f32(qb[(i64)i * sq.s + c]);
        for (int j0 = k0; j0 < k1; j0 += GEN_BN) {
            __syncthreads();  // the previous tile is read by every warp
            for (int c = threadIdx.x; c < GEN_BN * d; c += THREADS) {
                const int jj = c / d, col = c % d, j = j0 + jj;
                ks[jj * (d + 1) + col] = j < k1 ? to_f32(kb[(i64)j * sk.s + col]) : 0.f;
                vs[c] = j < k1 ? to_f32(vb[(i64)j * sv.s + col]) : 0.f;
            }
            __syncthreads();
            if (!active) continue;
            const int j = j0 + lane;
            float x = NEG_INF;
            if (visible(mask, i, j, k0, k1)) {
                float dot = 0.f;
                for (int c = 0; c < d; ++c) dot = fmaf(qw[c], ks[lane * (d + 1) + c], dot);
                x = dot * scale_log2;
            }
            float mx = x;
            for (int off = 16; off; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
            const float m_new = fmaxf(m_i, mx);
            const float base = m_new == NEG_INF ? 0.f : m_new;
            const float alpha = exp2f(m_i - base);
            const float p = exp2f(x - base);
            float sum = p;
            for (int off = 16; off; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
            l_i = l_i * alpha + sum;
            m_i = m_new;
#pragma unroll
            for (int e = 0; e < GEN_MAX_D / 32; ++e) acc[e] *= alpha;
            for (int jj = 0; jj < GEN_BN; ++jj) {
                const float pj = __shfl_sync(0xffffffffu, p, jj);
#pragma unroll
                for (int e = 0; e < GEN_MAX_D / 32; ++e) {
                    const int c = lane + 32 * e;
                    if (e < per && c < d) acc[e] = fmaf(pj, vs[jj * d + c], acc[e]);
                }
            }
        }
        if (!active) continue;
        const float inv = l_i > 0.f ? 1.f / l_i : 0.f;
#pragma unroll
        for (int e = 0; e < GEN_MAX_D / 32; ++e) {
            const int c = lane + 32 * e;
            if (e < per && c < d) store_f32(ob + (i64)i * so.s + c, acc[e] * inv);
        }
        if (lane == 0) lb[(i64)i * sl.s] = l_i > 0.f ? (m_i + log2f(l_i)) * LN2 : NEG_INF;
    }
}

template <typename T>
__device__ void fwd_general(const T* q, const T* k, const T* v, T* o, float* lse, Strides sq,
                            Strides sk, Strides sv, Strides so, Strides sl, Work w, Mask mask,
                            int group, float scale_log2, int d) {
    __shared__ float ks[GEN_BN * (GEN_MAX_D + 1)];  // rows padded to d + 1: no bank conflicts
    __shared__ float vs[GEN_BN * GEN_MAX_D];
    __shared__ float qs[WARPS * GEN_MAX_D];
    __shared__ int s_idx;
    int idx = next_item(w, 0, true, &s_idx);
    for (int done = 0; idx < w.num_items; ++done) {
        record(w, done, idx);
        if (item_valid(w, idx)) {
            fwd_general_item<T>(q, k, v, o, lse, sq, sk, sv, so, sl, w, mask, group, scale_log2,
                                d, w.order[3 * idx], w.order[3 * idx + 1], w.order[3 * idx + 2],
                                ks, vs, qs);
        }
        __syncthreads();
        idx = next_item(w, idx, false, &s_idx);
    }
    finish(w);
}

#define GEN_KERNEL(NAME, T)                                                                     \
    extern "C" __global__ void __launch_bounds__(THREADS) NAME(FWD_ARGS(T), int d) {            \
        FWD_CALL                                                                                \
        fwd_general<T>(q, k, v, o, lse, sq, sk, sv, so, sl, w, m, group, scale_log2, d);        \
    }

GEN_KERNEL(mha_fwd_float32_general, float)
GEN_KERNEL(mha_fwd_bfloat16_general, bf16)
GEN_KERNEL(mha_fwd_float16_general, f16)

// -- folding partial results (sequence-parallel units) ---------------------------------------
//
// merge: one warp per (row, head) folds a unit's partial (O_p in the input type, LSE_p) into
// the running float32 (O, LSE) by log-sum-exp, as the host's merge_partial:
//   LSE' = logaddexp(LSE, LSE_p),  O' = O e^(LSE - LSE') + O_p e^(LSE_p - LSE')
// (a side that saw no key, LSE = -inf, weighs 0; rows that saw none stay O = 0, LSE = -inf).
// cast: the running float32 O to the input type at the end. accumulate: float32 sums of the
// backward's per-unit gradients.

template <typename T>
__device__ void merge_rows(float* out, float* lse, const T* part, const float* part_lse,
                           i64 rows, int d) {
    const i64 row = ((i64)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31;
    if (row >= rows) return;
    const float a = lse[row], b = part_lse[row];
    const float hi = fmaxf(a, b);
    if (hi == NEG_INF) return;
    const float lo = fminf(a, b);
    const float l_new = lo == NEG_INF ? hi : hi + log1pf(expf(lo - hi));
    const float w_old = a == NEG_INF ? 0.f : expf(a - l_new);
    const float w_new = b == NEG_INF ? 0.f : expf(b - l_new);
    float* o = out + row * d;
    const T* p = part + row * d;
    for (int c = lane; c < d; c += 32) o[c] = o[c] * w_old + to_f32(p[c]) * w_new;
    // every lane has read lse[row] before lane 0 replaces it (lanes of a warp need not run
    // in step: without this a lane could weigh its part with the new LSE; found by the CPU
    // layer, tests/fakegpu/cudacpu)
    __syncwarp();
    if (lane == 0) lse[row] = l_new;
}

template <typename T>
__device__ void cast_out(T* dst, const float* src, i64 n) {
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x)
        store_f32(dst + i, src[i]);
}

// accumulate: dst += src in float32 (a unit's gradients, in the order the host launches them)
template <typename T>
__device__ void accumulate(float* dst, const T* src, i64 n) {
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x)
        dst[i] += to_f32(src[i]);
}

#define FOLD_KERNELS(NAME, T)                                                                   \
    extern "C" __global__ void mha_merge_##NAME(float* out, float* lse, const T* part,          \
                                                const float* part_lse, i64 rows, int d) {       \
        merge_rows<T>(out, lse, part, part_lse, rows, d);                                       \
    }                                                                                           \
    extern "C" __global__ void mha_cast_##NAME(T* dst, const float* src, i64 n) {               \
        cast_out<T>(dst, src, n);                                                               \
    }                                                                                           \
    extern "C" __global__ void mha_accumulate_##NAME(float* dst, const T* src, i64 n) {         \
        accumulate<T>(dst, src, n);                                                             \
    }

FOLD_KERNELS(float32, float)
FOLD_KERNELS(bfloat16, bf16)
FOLD_KERNELS(float16, f16)

// -- backward (FA2 backward, P recomputed from the LSE), fp32 arithmetic -----------------------
//
// Inputs are contiguous [rows, heads, d] (rows: batch x seq padded, or the ragged tokens) with
// per-sequence first rows (row_offsets, or b * seq_len). With s = q.k * scale,
// p = exp(s - LSE), dp = dO.v, ds = p (dp - Dvec), Dvec = rowsum(dO * O):
//   dV_j = sum_i p_ij dO_i,   dK_j = scale sum_i ds_ij q_i,   dQ_i = scale sum_j ds_ij k_j
// dkdv runs per (KV tile of 32 keys, sequence, KV head), over the group's query heads and the
// rows that see the tile; dq per (query tile of 32 rows, sequence, head), over the keys they
// see. Threads come in fours (lanes 4a..4a+3 share a key, or a row, and split its dimensions),
// so every output element has one writer and a fixed summation order: deterministic.

#define BWD_MAX_D 128
#define BWD_ROWS 8  // query rows (dkdv) or keys (dq) staged in shared memory per step
#define BWD_TILE 32

struct Seqs {
    const i64* row_offsets;
    int seq_len, kv_len;  // padded query rows and keys per sequence (ragged: both the rows)
    __device__ int len(int b) const {
        return row_offsets ? (int)(row_offsets[b + 1] - row_offsets[b]) : seq_len;
    }
    __device__ i64 first(int b) const { return row_offsets ? row_offsets[b] : (i64)b * seq_len; }
    __device__ int kv_count(int b) const { return row_offsets ? len(b) : kv_len; }
    __device__ i64 kv_first(int b) const { return row_offsets ? row_offsets[b] : (i64)b * kv_len; }
};

template <typename T>
__device__ void bwd_dvec(const T* o, const T* dout, float* dvec, i64 rows, int heads, int d) {
    const i64 warp = ((i64)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31;
    if (warp >= rows * heads) return;
    const T* a = o + warp * d;
    const T* b = dout + warp * d;
    float sum = 0.f;
    for (int c = lane; c < d; c += 32) sum = fmaf(to_f32(a[c]), to_f32(b[c]), sum);
    for (int off = 16; off; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
    if (lane == 0) dvec[warp] = sum;
}

template <typename T>
__device__ void bwd_dkdv(const T* q, const T* k, const T* v, const T* dout, const float* lse,
                         const float* dvec, T* dk, T* dv, Seqs seqs, int heads, int kv_heads,
                         int d, Mask mask, float scale) {
    __shared__ float qs[BWD_ROWS][BWD_MAX_D];
    __shared__ float dos[BWD_ROWS][BWD_MAX_D];
    __shared__ float ls[BWD_ROWS], ds_[BWD_ROWS];
    const int b = blockIdx.y, hk = blockIdx.z, group = heads / kv_heads;
    const int n = seqs.len(b), n_kv = seqs.kv_count(b);
    const int j0 = blockIdx.x * BWD_TILE;
    if (j0 >= n_kv) return;
    const int j1 = min(j0 + BWD_TILE, n_kv);
    const i64 first = seqs.first(b), kv_first = seqs.kv_first(b);
    const int jj = threadIdx.x >> 2, part = threadIdx.x & 3;
    const int j = j0 + jj;
    const bool key = j < j1;
    const int per = (d + 3) / 4;  // dims part, part + 4, ... (<= 32)
    float kr[BWD_MAX_D / 4], vr[BWD_MAX_D / 4], dkr[BWD_MAX_D / 4], dvr[BWD_MAX_D / 4];
#pragma unroll
    for (int e = 0; e < BWD_MAX_D / 4; ++e) {
        const int c = part + 4 * e;
        const bool ok = key && e < per && c < d;
        kr[e] = ok ? to_f32(k[((kv_first + j) * kv_heads + hk) * d + c]) : 0.f;
        vr[e] = ok ? to_f32(v[((kv_first + j) * kv_heads + hk) * d + c]) : 0.f;
        dkr[e] = dvr[e] = 0.f;
    }
    // the query rows that may see keys [j0, j1) (row i stands at position i + delta)
    int i_lo = 0, i_hi = n;
    if (mask.causal) i_lo = max(i_lo, j0 - mask.delta);
    if (mask.right >= 0) i_lo = max(i_lo, j0 - mask.delta - mask.right);
    if (mask.left >= 0) i_hi = min(i_hi, j1 - mask.delta + mask.left);
    for (int h = hk * group; h < (hk + 1) * group; ++h) {
        for (int r0 = i_lo; r0 < i_hi; r0 += BWD_ROWS) {
            __syncthreads();
            for (int c = threadIdx.x; c < BWD_ROWS * d; c += blockDim.x) {
                const int rr = c / d, col = c % d, i = r0 + rr;
                const bool ok = i < i_hi;
                const i64 at = ((first + i) * heads + h) * d + col;
                qs[rr][col] = ok ? to_f32(q[at]) : 0.f;
                dos[rr][col] = ok ? to_f32(dout[at]) : 0.f;
            }
            if (threadIdx.x < BWD_ROWS) {
                const int i = r0 + threadIdx.x;
                const bool ok = i < i_hi;
                ls[threadIdx.x] = ok ? lse[(first + i) * heads + h] : 0.f;
                ds_[threadIdx.x] = ok ? dvec[(first + i) * heads + h] : 0.f;
            }
            __syncthreads();
            for (int rr = 0; rr < BWD_ROWS; ++rr) {
                const int i = r0 + rr;
                if (i >= i_hi) break;  // uniform across the block
                float s = 0.f, dp = 0.f;
#pragma unroll
                for (int e = 0; e < BWD_MAX_D / 4; ++e) {
                    const int c = part + 4 * e;
                    if (e < per && c < d) {
                        s = fmaf(qs[rr][c], kr[e], s);
                        dp = fmaf(dos[rr][c], vr[e], dp);
                    }
                }
                s += __shfl_xor_sync(0xffffffffu, s, 1);
                s += __shfl_xor_sync(0xffffffffu, s, 2);
                dp += __shfl_xor_sync(0xffffffffu, dp, 1);
                dp += __shfl_xor_sync(0xffffffffu, dp, 2);
                const bool see = key && ls[rr] != NEG_INF && visible(mask, i, j, 0, n_kv);
                const float p = see ? expf(s * scale - ls[rr]) : 0.f;
                const float dsv = p * (dp - ds_[rr]) * scale;
#pragma unroll
                for (int e = 0; e < BWD_MAX_D / 4; ++e) {
                    const int c = part + 4 * e;
                    if (e < per && c < d) {
                        dvr[e] = fmaf(p, dos[rr][c], dvr[e]);
                        dkr[e] = fmaf(dsv, qs[rr][c], dkr[e]);
                    }
                }
            }
        }
    }
    if (!key) return;
#pragma unroll
    for (int e = 0; e < BWD_MAX_D / 4; ++e) {
        const int c = part + 4 * e;
        if (e < per && c < d) {
            store_f32(&dk[((kv_first + j) * kv_heads + hk) * d + c], dkr[e]);
            store_f32(&dv[((kv_first + j) * kv_heads + hk) * d + c], dvr[e]);
        }
    }
}

template <typename T>
__device__ void bwd_dq(const T* q, const T* k, const T* v, const T* dout, const float* lse,
                       const float* dvec, T* dq, Seqs seqs, int heads, int kv_heads, int d,
                       Mask mask, float scale) {
    __shared__ float ks[BWD_ROWS][BWD_MAX_D];
    __shared__ float vs[BWD_ROWS][BWD_MAX_D];
    const int b = blockIdx.y, h = blockIdx.z, hk = h / (heads / kv_heads);
    const int n = seqs.len(b), n_kv = seqs.kv_count(b);
    const int q0 = blockIdx.x * BWD_TILE;
    if (q0 >= n) return;
    const int q1 = min(q0 + BWD_TILE, n);
    const i64 first = seqs.first(b), kv_first = seqs.kv_first(b);
    const int rr = threadIdx.x >> 2, part = threadIdx.x & 3;
    const int i = q0 + rr;
    const bool row = i < q1;
    const int per = (d + 3) / 4;
    float qr[BWD_MAX_D / 4], dor[BWD_MAX_D / 4], dqr[BWD_MAX_D / 4];
#pragma unroll
    for (int e = 0; e < BWD_MAX_D / 4; ++e) {
        const int c = part + 4 * e;
        const bool ok = row && e < per && c < d;
        const i64 at = ((first + i) * heads + h) * d + c;
        qr[e] = ok ? to_f32(q[at]) : 0.f;
        dor[e] = ok ? to_f32(dout[at]) : 0.f;
        dqr[e] = 0.f;
    }
    const float l = row ? lse[(first + i) * heads + h] : NEG_INF;
    const float dd = row ? dvec[(first + i) * heads + h] : 0.f;
    int k0, k1;
    kv_range(mask, q0, q1, n_kv, &k0, &k1);
    for (int j0 = k0; j0 < k1; j0 += BWD_ROWS) {
        __syncthreads();
        for (int c = threadIdx.x; c < BWD_ROWS * d; c += blockDim.x) {
            const int jj = c / d, col = c % d, j = j0 + jj;
            const bool ok = j < k1;
            const i64 at = ((kv_first + j) * kv_heads + hk) * d + col;
            ks[jj][col] = ok ? to_f32(k[at]) : 0.f;
            vs[jj][col] = ok ? to_f32(v[at]) : 0.f;
        }
        __syncthreads();
        for (int jj = 0; jj < BWD_ROWS; ++jj) {
            const int j = j0 + jj;
            if (j >= k1) break;  // uniform across the block
            float s = 0.f, dp = 0.f;
#pragma unroll
            for (int e = 0; e < BWD_MAX_D / 4; ++e) {
                const int c = part + 4 * e;
                if (e < per && c < d) {
                    s = fmaf(qr[e], ks[jj][c], s);
                    dp = fmaf(dor[e], vs[jj][c], dp);
                }
            }
            s += __shfl_xor_sync(0xffffffffu, s, 1);
            s += __shfl_xor_sync(0xffffffffu, s, 2);
            dp += __shfl_xor_sync(0xffffffffu, dp, 1);
            dp += __shfl_xor_sync(0xffffffffu, dp, 2);
            const bool see = row && l != NEG_INF && visible(mask, i, j, 0, n_kv);
            const float p = see ? expf(s * scale - l) : 0.f;
            const float dsv = p * (dp - dd) * scale;
#pragma unroll
            for (int e = 0; e < BWD_MAX_D / 4; ++e) {
                const int c = part + 4 * e;
                if (e < per && c < d) dqr[e] = fmaf(dsv, ks[jj][c], dqr[e]);
            }
        }
    }
    if (!row) return;
#pragma unroll
    for (int e = 0; e < BWD_MAX_D / 4; ++e) {
        const int c = part + 4 * e;
        if (e < per && c < d) store_f32(&dq[((first + i) * heads + h) * d + c], dqr[e]);
    }
}

#define BWD_KERNELS(NAME, T)                                                                    \
    extern "C" __global__ void mha_bwd_dvec_##NAME(const T* o, const T* dout, float* dvec,      \
                                                   i64 rows, int heads, int d) {                \
        bwd_dvec<T>(o, dout, dvec, rows, heads, d);                                             \
    }                                                                                           \
    extern "C" __global__ void __launch_bounds__(THREADS) mha_bwd_dkdv_##NAME(                  \
        const T* q, const T* k, const T* v, const T* dout, const float* lse,                    \
        const float* dvec, T* dk, T* dv, const i64* row_offsets, int seq_len, int kv_len,       \
        int heads, int kv_heads, int d, int causal, int left, int right, int delta,             \
        float scale) {                                                                          \
        Seqs seqs = {row_offsets, seq_len, kv_len};                                             \
        Mask m = {causal, left, right, delta};                                                  \
        bwd_dkdv<T>(q, k, v, dout, lse, dvec, dk, dv, seqs, heads, kv_heads, d, m, scale);      \
    }                                                                                           \
    extern "C" __global__ void __launch_bounds__(THREADS) mha_bwd_dq_##NAME(                    \
        const T* q, const T* k, const T* v, const T* dout, const float* lse,                    \
        const float* dvec, T* dq, const i64* row_offsets, int seq_len, int kv_len, int heads,   \
        int kv_heads, int d, int causal, int left, int right, int delta, float scale) {         \
        Seqs seqs = {row_offsets, seq_len, kv_len};                                             \
        Mask m = {causal, left, right, delta};                                                  \
        bwd_dq<T>(q, k, v, dout, lse, dvec, dq, seqs, heads, kv_heads, d, m, scale);            \
    }

BWD_KERNELS(float32, float)
BWD_KERNELS(bfloat16, bf16)
BWD_KERNELS(float16, f16)
