// All-reduce over peer pointers (the NVSHMEM heap's nvshmem_ptr mappings), one launch per call.
//
// Semantics are those of collectives/ops.py: out = ((x_0 op x_1) op x_2) ... in rank order,
// in the accumulation type (float for float16/bfloat16, float or double for float32, double
// for float64), rounded once to the element type (round-to-nearest-even). avg divides the sum
// by P before that rounding. min/max follow numpy (a NaN operand wins; on a tie, such as 0.0
// and -0.0, the right operand). NaN results may differ from the host in payload: the GPU's
// conversions give a canonical NaN.
// The order is fixed, so every rank and both algorithms give bitwise identical results.
//
// one_shot: every rank reduces every element from all P inputs.
// reduce_local: one process reduces ``count`` buffers it owns (the same loop, no stages; the
//           single-GPU benchmark measures it).
// two_shot: rank r reduces shard r (collectives.schedule.shard_bounds) into its result buffer;
//           then every rank copies every shard from its owner's result buffer.
//
// Cross-rank stages. Each call runs numbered stages; numbers only grow, flags start at 0. The
// stage numbers live on the device, not in the launch: this rank's last published stage is a
// u64 beside its arrival counter (``arrive`` points at [u32 arrivals][i32 status][u64
// epoch]) and a launch with stage0 == 0 starts at epoch + 1, so a launch captured in a CUDA
// graph replays correctly (nothing the host knew at capture time is baked in but pointers and
// the call's shape). A stage ends on this rank when every block of the grid has arrived (the
// arrival counter; the last block resets it to 0 before it publishes, and no block arrives at
// the next stage before that publish). The last block publishes the stage to every peer's
// flag slot for this rank with a system-scope release store, and records it as the epoch. A
// block waits for a stage by spinning on every peer's flag with system-scope acquire loads,
// bounded by a deadline on the global timer; a timeout writes the wait's index within the
// call (1: the entry wait, 2: stage0, ...) into *status and the kernel returns (the host
// raises). A status left non-zero by a failed launch makes every later launch return at its
// first wait (a failed replay poisons the communicator; the host sees it at its next check).
// Blocks must all be resident: the host launches cooperatively (the driver refuses a grid that
// cannot be co-resident).
//
//   before:  peers are done with the previous call (its last stage, stage0 - 1)
//   copy:    this rank's input into its symmetric scratch (skipped when it is already there)
//   stage0:      every rank's scratch holds its input
//   stage0 + 1:  (two_shot) every rank's shard is reduced into its result buffer
//   last stage:  this rank is done reading peers' buffers (one_shot: stage0 + 1,
//                two_shot: stage0 + 2); the next call waits for it before writing

typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;

struct f16 { u16 bits; };
struct bf16 { u16 bits; };

#include "shmem/kernels/ptx.cuh"

// -- conversions ----------------------------------------------------------------------------

__device__ __forceinline__ float to_acc(f16 x, float) { return ptx_cvt_f32_f16(x.bits); }
__device__ __forceinline__ float to_acc(bf16 x, float) {
    return __uint_as_float(((u32)x.bits) << 16);
}
__device__ __forceinline__ float to_acc(float x, float) { return x; }
__device__ __forceinline__ double to_acc(float x, double) { return (double)x; }
__device__ __forceinline__ double to_acc(double x, double) { return x; }

__device__ __forceinline__ void from_acc(float a, f16* out) { out->bits = ptx_cvt_rn_f16_f32(a); }
__device__ __forceinline__ void from_acc(float a, bf16* out) {
#if __CUDA_ARCH__ >= 800
    out->bits = ptx_cvt_rn_bf16_f32(a);
#else  // round to nearest even in software (cvt to bf16 needs sm_80)
    u32 bits = __float_as_uint(a);
    if ((bits & 0x7fffffffu) > 0x7f800000u) {
        out->bits = (u16)((bits >> 16) | 0x40u);  // a quiet NaN, sign kept
    } else {
        out->bits = (u16)((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
    }
#endif
}
__device__ __forceinline__ void from_acc(float a, float* out) { *out = a; }
__device__ __forceinline__ void from_acc(double a, float* out) { *out = (float)a; }
__device__ __forceinline__ void from_acc(double a, double* out) { *out = a; }

// -- operators (numpy's: minimum/maximum propagate NaN, ties keep the left operand) ----------

#define OP_SUM 0
#define OP_AVG 1
#define OP_PROD 2
#define OP_MIN 3
#define OP_MAX 4

template <int OP, typename A>
__device__ __forceinline__ A apply(A a, A b) {
    if (OP == OP_SUM || OP == OP_AVG) return a + b;
    if (OP == OP_PROD) return a * b;
    if (OP == OP_MIN) return (a < b || a != a) ? a : b;
    return (a > b || a != a) ? a : b;
}

// -- cross-rank stages ----------------------------------------------------------------------

struct Sync {
    u64* const* flags;  // P peer pointers to each rank's flag array: flags[r][sender]
    u32* arrive;        // this rank's arrival counter, status, epoch (see above; only this rank)
    u32 arrive_base;    // unused (0): the counter is reset by each stage's last block
    u64 stage0;         // the first stage number of this call (0: epoch + 1, from the device)
    u64 timeout_ns;
    int* status;        // 0; the stage that timed out (+1); or -(q + 1): rank q's call differs
    int rank;
    int size;
    u64 sig;            // this call's signature (collectives.signature; 0: not compared)
};

__device__ __forceinline__ void store_release_sys(u64* p, u64 v) { ptx_st_release_sys_u64(p, v); }
__device__ __forceinline__ u64 load_acquire_sys(const u64* p) { return ptx_ld_acquire_sys_u64(p); }
__device__ __forceinline__ u64 now_ns() { return ptx_globaltimer(); }

__device__ __forceinline__ u64* epoch_of(const Sync& s) { return (u64*)(s.arrive + 2); }

// The launch's stage numbers from the device (every block reads the same epoch: it changes
// only when the last block arrives at a stage, after every block has started).
__device__ __forceinline__ Sync resolve(Sync s) {
    if (s.stage0 == 0) s.stage0 = *(volatile u64*)epoch_of(s) + 1;
    return s;
}

// Every block calls this at stage k (0-based within the call), in the same order.
__device__ void arrive(const Sync& s, int k) {
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence_system();  // this block's writes before the stage is published
        u32 old = atomicAdd(s.arrive, 1u);
        if (old + 1 == gridDim.x) {  // the last block here
            atomicExch(s.arrive, 0u);  // before the publish: no block arrives at k + 1 sooner
            __threadfence_system();
            if (k == 0 && s.sig != 0)  // the call's signature, in each peer's flags after
                for (int r = 0; r < s.size; ++r)  // the stage slots (released with stage0)
                    store_release_sys(&s.flags[r][s.size + s.rank], s.sig);
            *(volatile u64*)epoch_of(s) = s.stage0 + k;
            for (int r = 0; r < s.size; ++r) store_release_sys(&s.flags[r][s.rank], s.stage0 + k);
        }
    }
}

// Waits until every rank has published stage ``want``; false (and the stage recorded in
// *status) when one did not in time. At stage0 it also compares every rank's call signature
// with this one's: a differing call records -(q + 1) for rank q and returns false (every rank
// sees the difference at the same stage, so all stop there).
__device__ bool wait_for(const Sync& s, u64 want) {
    __shared__ int ok;
    if (threadIdx.x == 0) ok = *(volatile int*)s.status == 0;  // a failed launch poisons
    __syncthreads();
    if (!ok) return false;
    if (threadIdx.x < (unsigned)s.size) {
        const u64* flag = &s.flags[s.rank][threadIdx.x];
        u64 start = now_ns();
        while (load_acquire_sys(flag) < want) {
            if (*(volatile int*)s.status != 0 || now_ns() - start > s.timeout_ns) {
                atomicCAS(s.status, 0, (int)(want + 2 - s.stage0));  // 1: entry wait
                ok = 0;
                break;
            }
        }
        if (ok && want == s.stage0 && s.sig != 0) {  // acquired with the stage: compare
            u64 theirs = load_acquire_sys(&s.flags[s.rank][s.size + threadIdx.x]);
            if (theirs != s.sig) {
                atomicCAS(s.status, 0, -(int)threadIdx.x - 1);
                ok = 0;
            }
        }
    }
    __syncthreads();
    return ok != 0;
}

__device__ __forceinline__ void shard(u64 n, int parts, int index, u64* lo, u64* hi) {
    u64 base = n / parts, extra = n % parts;
    *lo = index * base + (index < (int)extra ? index : extra);
    *hi = *lo + base + (index < (int)extra ? 1 : 0);
}

template <typename T>
__device__ __forceinline__ void copy_range(const T* src, T* dst, u64 lo, u64 hi) {
    if (src == dst) return;
    u64 stride = (u64)gridDim.x * blockDim.x;
    for (u64 i = lo + (u64)blockIdx.x * blockDim.x + threadIdx.x; i < hi; i += stride)
        dst[i] = src[i];
}

// out[i] = (x_0 op x_1 op ... ) [/ size for avg] [* scale], in A, rounded once to TO (the
// input type, or float32 for 16-bit inputs: the fused "bf16 in, fp32 out" all-reduce). A
// scale of 1 is not applied (the result is then bitwise the unscaled one).
template <typename T, typename A, int OP, typename TO = T>
__device__ __forceinline__ void reduce_range(
    const T* const* inputs, TO* out, u64 lo, u64 hi, int size, A scale = A(1)) {
    u64 stride = (u64)gridDim.x * blockDim.x;
    for (u64 i = lo + (u64)blockIdx.x * blockDim.x + threadIdx.x; i < hi; i += stride) {
        A acc = to_acc(inputs[0][i], A());
        for (int r = 1; r < size; ++r) acc = apply<OP, A>(acc, to_acc(inputs[r][i], A()));
        if (OP == OP_AVG) acc = acc / (A)size;
        if (scale != A(1)) acc = acc * scale;
        from_acc(acc, &out[i]);
    }
}

template <typename T, typename A, int OP, typename TO>
__device__ void one_shot(
    const T* input, const T* const* scratch, TO* out, u64 n, A scale, Sync s) {
    if (!wait_for(s, s.stage0 - 1)) return;  // peers are done with the previous call
    copy_range(input, (T*)scratch[s.rank], 0, n);
    arrive(s, 0);
    if (!wait_for(s, s.stage0)) return;
    reduce_range<T, A, OP, TO>(scratch, out, 0, n, s.size, scale);
    arrive(s, 1);  // done reading peers' scratch
}

// results[r] holds rank r's reduced shard in the output type (already scaled and rounded)
template <typename T, typename A, int OP, typename TO>
__device__ void two_shot(const T* input, const T* const* scratch, TO* const* results, TO* out,
                         u64 n, A scale, Sync s) {
    if (!wait_for(s, s.stage0 - 1)) return;
    copy_range(input, (T*)scratch[s.rank], 0, n);
    arrive(s, 0);
    if (!wait_for(s, s.stage0)) return;
    u64 lo, hi;
    shard(n, s.size, s.rank, &lo, &hi);
    reduce_range<T, A, OP, TO>(scratch, results[s.rank], lo, hi, s.size, scale);
    arrive(s, 1);
    if (!wait_for(s, s.stage0 + 1)) return;
    for (int r = 0; r < s.size; ++r) {
        shard(n, s.size, r, &lo, &hi);
        copy_range((const TO*)results[r], out, lo, hi);
    }
    arrive(s, 2);  // done reading peers' scratch and results
}

// Waits until every peer has finished its previous call (closing a communicator).
extern "C" __global__ void allreduce_drain(
    u64* const* flags, u32* arrive, u32 arrive_base, u64 stage0, u64 timeout_ns, int* status,
    int rank, int size) {
    Sync s = resolve(Sync{flags, arrive, arrive_base, stage0, timeout_ns, status, rank, size, 0});
    wait_for(s, s.stage0 - 1);
}

// Kernel parameters are plain scalars and pointers (no struct by value) so every launcher
// can pass them: the Sync fields come last, in struct order.
#define SYNC_PARAMS                                                                          \
    u64 *const *flags, u32 *arrive, u32 arrive_base, u64 stage0, u64 timeout_ns, int *status, \
        int rank, int size, u64 sig
#define SYNC_VALUE \
    resolve(Sync{flags, arrive, arrive_base, stage0, timeout_ns, status, rank, size, sig})

// all_reduce kernels take the scale as a double (applied in A); the output type TO is the
// input's, or float32 for the ``_to_float32`` kernels of 16-bit inputs
#define INSTANTIATE_AR(NAME, T, A, OP, TO)                                                   \
    extern "C" __global__ void allreduce_one_shot_##NAME(                                     \
        const T* input, const T* const* scratch, TO* out, u64 n, double scale,               \
        SYNC_PARAMS) {                                                                        \
        one_shot<T, A, OP, TO>(input, scratch, out, n, (A)scale, SYNC_VALUE);                 \
    }                                                                                         \
    extern "C" __global__ void allreduce_two_shot_##NAME(                                     \
        const T* input, const T* const* scratch, TO* const* results, TO* out, u64 n,          \
        double scale, SYNC_PARAMS) {                                                          \
        two_shot<T, A, OP, TO>(input, scratch, results, out, n, (A)scale, SYNC_VALUE);        \
    }

#define INSTANTIATE(NAME, T, A, OP)                                                          \
    INSTANTIATE_AR(NAME, T, A, OP, T)                                                         \
    extern "C" __global__ void reduce_local_##NAME(                                          \
        const T* const* inputs, T* out, u64 n, int count) {                                    \
        reduce_range<T, A, OP>(inputs, out, 0, n, count);                                      \
    }

#define FOR_OPS(TNAME, T, A)                   \
    INSTANTIATE(TNAME##_sum, T, A, OP_SUM)     \
    INSTANTIATE(TNAME##_avg, T, A, OP_AVG)     \
    INSTANTIATE(TNAME##_prod, T, A, OP_PROD)   \
    INSTANTIATE(TNAME##_min, T, A, OP_MIN)     \
    INSTANTIATE(TNAME##_max, T, A, OP_MAX)

#define FOR_OPS_WIDE(TNAME, T)                                    \
    INSTANTIATE_AR(TNAME##_to_float32_sum, T, float, OP_SUM, float)   \
    INSTANTIATE_AR(TNAME##_to_float32_avg, T, float, OP_AVG, float)   \
    INSTANTIATE_AR(TNAME##_to_float32_prod, T, float, OP_PROD, float) \
    INSTANTIATE_AR(TNAME##_to_float32_min, T, float, OP_MIN, float)   \
    INSTANTIATE_AR(TNAME##_to_float32_max, T, float, OP_MAX, float)

FOR_OPS(float16, f16, float)
FOR_OPS(bfloat16, bf16, float)
FOR_OPS(float32, float, float)
FOR_OPS(float32_acc64, float, double)
FOR_OPS(float64, double, double)
FOR_OPS_WIDE(float16, f16)
FOR_OPS_WIDE(bfloat16, bf16)

// -- the rest of the family, over the same two stages as one_shot --------------------------
//
// Data moves as bytes (the dtype does not matter), except reduce_scatter, which reduces like
// one_shot. A call may be one piece of a larger one (the host cuts it to fit the scratch):
// pointers come offset to the piece, and ``stride`` is the distance between the per-rank
// parts of the whole arrays.

typedef unsigned char u8;

__device__ __forceinline__ void copy_bytes(const u8* src, u8* dst, u64 n) {
    if (src == dst) return;
    u64 stride = (u64)gridDim.x * blockDim.x;
    u64 t = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if ((((u64)src | (u64)dst | n) & 15) == 0) {  // 16-byte words where both are aligned
        const uint4* s = (const uint4*)src;
        uint4* d = (uint4*)dst;
        for (u64 i = t; i < n / 16; i += stride) d[i] = s[i];
        return;
    }
    for (u64 i = t; i < n; i += stride) dst[i] = src[i];
}

// out + r * stride receives rank r's ``nbytes`` (all_gather, fcollect)
extern "C" __global__ void family_all_gather(
    const u8* input, const u8* const* scratch, u8* out, u64 nbytes, u64 stride, SYNC_PARAMS) {
    Sync s = SYNC_VALUE;
    if (!wait_for(s, s.stage0 - 1)) return;
    copy_bytes(input, (u8*)scratch[s.rank], nbytes);
    ::arrive(s, 0);  // (a parameter named arrive shadows it here)
    if (!wait_for(s, s.stage0)) return;
    for (int r = 0; r < s.size; ++r) copy_bytes(scratch[r], out + (u64)r * stride, nbytes);
    ::arrive(s, 1);  // done reading peers' scratch
}

// out receives the root's ``nbytes``
extern "C" __global__ void family_broadcast(
    const u8* input, const u8* const* scratch, u8* out, u64 nbytes, int root, SYNC_PARAMS) {
    Sync s = SYNC_VALUE;
    if (!wait_for(s, s.stage0 - 1)) return;
    if (s.rank == root) copy_bytes(input, (u8*)scratch[s.rank], nbytes);
    ::arrive(s, 0);  // (a parameter named arrive shadows it here)
    if (!wait_for(s, s.stage0)) return;
    copy_bytes(scratch[root], out, nbytes);
    ::arrive(s, 1);
}

// part j of the input (at input + j * stride, ``nbytes``) goes to rank j; part r of out
// (at out + r * stride) comes from rank r. Staged packed: scratch[rank] + j * nbytes.
extern "C" __global__ void family_all_to_all(
    const u8* input, const u8* const* scratch, u8* out, u64 nbytes, u64 stride, SYNC_PARAMS) {
    Sync s = SYNC_VALUE;
    if (!wait_for(s, s.stage0 - 1)) return;
    for (int j = 0; j < s.size; ++j)
        copy_bytes(input + (u64)j * stride, (u8*)scratch[s.rank] + (u64)j * nbytes, nbytes);
    ::arrive(s, 0);  // (a parameter named arrive shadows it here)
    if (!wait_for(s, s.stage0)) return;
    for (int r = 0; r < s.size; ++r)
        copy_bytes(scratch[r] + (u64)s.rank * nbytes, out + (u64)r * stride, nbytes);
    ::arrive(s, 1);
}

// elements [lo, hi) of the piece (``n`` elements staged from every rank), reduced in rank
// order like one_shot, into out[0, hi - lo)
template <typename T, typename A, int OP>
__device__ void reduce_scatter(
    const T* input, const T* const* scratch, T* out, u64 n, u64 lo, u64 hi, Sync s) {
    if (!wait_for(s, s.stage0 - 1)) return;
    copy_range(input, (T*)scratch[s.rank], 0, n);
    arrive(s, 0);
    if (!wait_for(s, s.stage0)) return;
    u64 stride = (u64)gridDim.x * blockDim.x;
    for (u64 i = lo + (u64)blockIdx.x * blockDim.x + threadIdx.x; i < hi; i += stride) {
        A acc = to_acc(scratch[0][i], A());
        for (int r = 1; r < s.size; ++r) acc = apply<OP, A>(acc, to_acc(scratch[r][i], A()));
        if (OP == OP_AVG) acc = acc / (A)s.size;
        from_acc(acc, &out[i - lo]);
    }
    arrive(s, 1);
}

#define INSTANTIATE_RS(NAME, T, A, OP)                                                       \
    extern "C" __global__ void reduce_scatter_##NAME(                                        \
        const T* input, const T* const* scratch, T* out, u64 n, u64 lo, u64 hi,              \
        SYNC_PARAMS) {                                                                        \
        reduce_scatter<T, A, OP>(input, scratch, out, n, lo, hi, SYNC_VALUE);                 \
    }

#define FOR_OPS_RS(TNAME, T, A)                   \
    INSTANTIATE_RS(TNAME##_sum, T, A, OP_SUM)     \
    INSTANTIATE_RS(TNAME##_avg, T, A, OP_AVG)     \
    INSTANTIATE_RS(TNAME##_prod, T, A, OP_PROD)   \
    INSTANTIATE_RS(TNAME##_min, T, A, OP_MIN)     \
    INSTANTIATE_RS(TNAME##_max, T, A, OP_MAX)

FOR_OPS_RS(float16, f16, float)
FOR_OPS_RS(bfloat16, bf16, float)
FOR_OPS_RS(float32, float, float)
FOR_OPS_RS(float32_acc64, float, double)
FOR_OPS_RS(float64, double, double)

// -- every other dtype of the host backend: integers, bool, float8, complex -----------------
//
// The op is a runtime argument here (one kernel per dtype and algorithm, not per op: eight
// integer types times eight ops would be hundreds of kernels). Semantics are the host's
// (collectives/ops.py): integers accumulate in their own type and wrap (two's complement, as
// numpy), avg truncates toward zero; bool: sum/max/bor are or, prod/min/band are and, bxor is
// xor; float8 accumulates in float32 and rounds once (round to nearest even, as ml_dtypes:
// e4m3fn overflows to NaN, e5m2 to infinity); complex sums and multiplies componentwise
// without fused multiply-adds (as numpy) and divides avg by the real count. long double has
// no GPU type: the host refuses it on the nvshmem backend.

#define OP_BAND 5
#define OP_BOR 6
#define OP_BXOR 7

typedef signed char i8;
typedef short i16;
typedef long long i64;
typedef unsigned short u16x;
struct boolean { u8 v; };
struct e4m3 { u8 bits; };
struct e5m2 { u8 bits; };
struct c64 { float re, im; };
struct c128 { double re, im; };

// BEGIN fp8 conversions (plain C as well: tests/compile/test_gpu_fp8.py compiles this section
// with the host's C compiler and checks it against ml_dtypes bit for bit)
#ifndef FP8_HD
#define FP8_HD __device__ __forceinline__
#endif
FP8_HD unsigned int fp8_f32_bits(float f) {
    unsigned int u;
    memcpy(&u, &f, 4);
    return u;
}
FP8_HD float fp8_bits_f32(unsigned int u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}
// float32 -> float8 with ``mbits`` mantissa bits and exponent bias ``bias``; ``fn``: the
// e4m3fn encoding (no infinity, one NaN code 0x7f, overflow to NaN), else IEEE-like e5m2
FP8_HD unsigned char fp8_from_f32(float f, int mbits, int bias, int fn) {
    unsigned int u = fp8_f32_bits(f);
    unsigned int sign = (u >> 24) & 0x80u;
    unsigned int a = u & 0x7fffffffu;
    unsigned int nan_code = fn ? 0x7fu : 0x7eu;
    unsigned int max_code = fn ? 0x7eu : 0x7bu;  // 448 and 57344
    unsigned int over_code = fn ? 0x7fu : 0x7cu;  // NaN, infinity
    if (a > 0x7f800000u) return (unsigned char)(sign | nan_code);
    if (a == 0x7f800000u) return (unsigned char)(sign | over_code);
    int e = (int)(a >> 23) - 127;
    unsigned int code;
    if (e < 1 - bias) {  // below the smallest normal: a multiple of the subnormal step
        // |f| / 2^(1 - bias - mbits), rounded half to even (exact scaling by a power of 2)
        float scaled = fp8_bits_f32(a) * fp8_bits_f32((unsigned int)(127 + bias - 1 + mbits) << 23);
        unsigned int q = (unsigned int)scaled;
        float rest = scaled - (float)q;
        if (rest > 0.5f || (rest == 0.5f && (q & 1u))) q += 1;
        code = q;  // q == 1 << mbits is the smallest normal: the encodings are contiguous
    } else {
        unsigned int shift = 23 - (unsigned int)mbits;
        unsigned int t = a - ((unsigned int)(127 - bias) << 23);  // rebias the exponent
        t += (1u << (shift - 1)) - 1 + ((t >> shift) & 1u);      // round half to even
        code = t >> shift;
    }
    if (code > max_code) code = over_code;
    return (unsigned char)(sign | code);
}
FP8_HD float fp8_to_f32(unsigned char c, int mbits, int bias, int fn) {
    unsigned int sign = ((unsigned int)c & 0x80u) << 24;
    unsigned int mag = c & 0x7fu;
    unsigned int ebits = 7 - (unsigned int)mbits;
    unsigned int e = mag >> mbits, m = mag & ((1u << mbits) - 1);
    if (fn ? mag == 0x7fu : e == (1u << ebits) - 1) {
        if (!fn && m == 0) return fp8_bits_f32(sign | 0x7f800000u);
        return fp8_bits_f32(sign | 0x7fc00000u);
    }
    if (e == 0) {  // subnormal: m * 2^(1 - bias - mbits), exact in float32
        float v = (float)m * fp8_bits_f32((unsigned int)(127 + 1 - bias - mbits) << 23);
        return fp8_bits_f32(sign | fp8_f32_bits(v));
    }
    return fp8_bits_f32(sign | ((e - (unsigned int)bias + 127) << 23) | (m << (23 - mbits)));
}
// END fp8 conversions

__device__ __forceinline__ float ld(e4m3 x) { return fp8_to_f32(x.bits, 3, 7, 1); }
__device__ __forceinline__ float ld(e5m2 x) { return fp8_to_f32(x.bits, 2, 15, 0); }
__device__ __forceinline__ void st(float a, e4m3* o) { o->bits = fp8_from_f32(a, 3, 7, 1); }
__device__ __forceinline__ void st(float a, e5m2* o) { o->bits = fp8_from_f32(a, 2, 15, 0); }
template <typename T>
__device__ __forceinline__ T ld(T x) { return x; }
template <typename T>
__device__ __forceinline__ void st(T a, T* o) { *o = a; }

#define WRAP(T, U)                                                                            \
    __device__ __forceinline__ T add_wrap(T a, T b) { return (T)((U)a + (U)b); }            \
    __device__ __forceinline__ T mul_wrap(T a, T b) { return (T)((U)a * (U)b); }            \
    __device__ __forceinline__ T rt_apply(int op, T a, T b) {                                 \
        switch (op) {                                                                         \
            case OP_SUM: case OP_AVG: return add_wrap(a, b);                                  \
            case OP_PROD: return mul_wrap(a, b);                                              \
            case OP_MIN: return a < b ? a : b;                                                \
            case OP_MAX: return a > b ? a : b;                                                \
            case OP_BAND: return (T)(a & b);                                                  \
            case OP_BOR: return (T)(a | b);                                                   \
            default: return (T)(a ^ b);                                                       \
        }                                                                                     \
    }
WRAP(i8, u32)
WRAP(u8, u32)
WRAP(i16, u32)
WRAP(u16x, u32)
WRAP(int, u32)
WRAP(u32, u32)
WRAP(i64, u64)
WRAP(u64, u64)

// avg of an integer sum: truncated toward zero (the host's int_avg)
#define AVG_SIGNED(T)                                                                         \
    __device__ __forceinline__ T rt_avg(T s, int n) {                                         \
        i64 w = (i64)s;                                                                       \
        u64 q = (w < 0 ? (u64)0 - (u64)w : (u64)w) / (u64)n;                                  \
        return (T)(w < 0 ? (i64)((u64)0 - q) : (i64)q);                                       \
    }
#define AVG_UNSIGNED(T) \
    __device__ __forceinline__ T rt_avg(T s, int n) { return (T)((u64)s / (u64)n); }
AVG_SIGNED(i8)
AVG_SIGNED(i16)
AVG_SIGNED(int)
AVG_SIGNED(i64)
AVG_UNSIGNED(u8)
AVG_UNSIGNED(u16x)
AVG_UNSIGNED(u32)
AVG_UNSIGNED(u64)

__device__ __forceinline__ boolean rt_apply(int op, boolean a, boolean b) {
    switch (op) {
        case OP_SUM: case OP_MAX: case OP_BOR: return boolean{(u8)(a.v | b.v)};
        case OP_PROD: case OP_MIN: case OP_BAND: return boolean{(u8)(a.v & b.v)};
        default: return boolean{(u8)(a.v ^ b.v)};
    }
}
__device__ __forceinline__ boolean rt_avg(boolean s, int) { return s; }  // refused on the host

__device__ __forceinline__ float rt_apply(int op, float a, float b) {
    switch (op) {
        case OP_PROD: return apply<OP_PROD, float>(a, b);
        case OP_MIN: return apply<OP_MIN, float>(a, b);
        case OP_MAX: return apply<OP_MAX, float>(a, b);
        default: return apply<OP_SUM, float>(a, b);
    }
}
__device__ __forceinline__ float rt_avg(float s, int n) { return s / (float)n; }

__device__ __forceinline__ c64 rt_apply(int op, c64 a, c64 b) {
    if (op == OP_PROD)
        return c64{__fsub_rn(__fmul_rn(a.re, b.re), __fmul_rn(a.im, b.im)),
                   __fadd_rn(__fmul_rn(a.re, b.im), __fmul_rn(a.im, b.re))};
    return c64{__fadd_rn(a.re, b.re), __fadd_rn(a.im, b.im)};
}
__device__ __forceinline__ c64 rt_avg(c64 s, int n) {
    return c64{__fdiv_rn(s.re, (float)n), __fdiv_rn(s.im, (float)n)};
}
__device__ __forceinline__ c128 rt_apply(int op, c128 a, c128 b) {
    if (op == OP_PROD)
        return c128{__dsub_rn(__dmul_rn(a.re, b.re), __dmul_rn(a.im, b.im)),
                    __dadd_rn(__dmul_rn(a.re, b.im), __dmul_rn(a.im, b.re))};
    return c128{__dadd_rn(a.re, b.re), __dadd_rn(a.im, b.im)};
}
__device__ __forceinline__ c128 rt_avg(c128 s, int n) {
    return c128{__ddiv_rn(s.re, (double)n), __ddiv_rn(s.im, (double)n)};
}

template <typename A>
__device__ __forceinline__ A rt_scale(A a, double) { return a; }  // scale: floating only
__device__ __forceinline__ float rt_scale(float a, double s) { return s == 1.0 ? a : a * (float)s; }

template <typename T, typename A>
__device__ __forceinline__ void reduce_range_rt(
    const T* const* inputs, T* out, u64 lo, u64 hi, int size, int op, double scale, u64 shift) {
    u64 stride = (u64)gridDim.x * blockDim.x;
    for (u64 i = lo + (u64)blockIdx.x * blockDim.x + threadIdx.x; i < hi; i += stride) {
        A acc = ld(inputs[0][i]);
        for (int r = 1; r < size; ++r) acc = rt_apply(op, acc, (A)ld(inputs[r][i]));
        if (op == OP_AVG) acc = rt_avg(acc, size);
        st(rt_scale(acc, scale), &out[i - shift]);
    }
}

template <typename T, typename A>
__device__ void one_shot_rt(
    const T* input, const T* const* scratch, T* out, u64 n, double scale, int op, Sync s) {
    if (!wait_for(s, s.stage0 - 1)) return;
    copy_range(input, (T*)scratch[s.rank], 0, n);
    arrive(s, 0);
    if (!wait_for(s, s.stage0)) return;
    reduce_range_rt<T, A>(scratch, out, 0, n, s.size, op, scale, 0);
    arrive(s, 1);
}

template <typename T, typename A>
__device__ void two_shot_rt(const T* input, const T* const* scratch, T* const* results, T* out,
                            u64 n, double scale, int op, Sync s) {
    if (!wait_for(s, s.stage0 - 1)) return;
    copy_range(input, (T*)scratch[s.rank], 0, n);
    arrive(s, 0);
    if (!wait_for(s, s.stage0)) return;
    u64 lo, hi;
    shard(n, s.size, s.rank, &lo, &hi);
    reduce_range_rt<T, A>(scratch, results[s.rank], lo, hi, s.size, op, scale, 0);
    arrive(s, 1);
    if (!wait_for(s, s.stage0 + 1)) return;
    for (int r = 0; r < s.size; ++r) {
        shard(n, s.size, r, &lo, &hi);
        copy_range((const T*)results[r], out, lo, hi);
    }
    arrive(s, 2);
}

template <typename T, typename A>
__device__ void reduce_scatter_rt(const T* input, const T* const* scratch, T* out, u64 n, u64 lo,
                                  u64 hi, int op, Sync s) {
    if (!wait_for(s, s.stage0 - 1)) return;
    copy_range(input, (T*)scratch[s.rank], 0, n);
    arrive(s, 0);
    if (!wait_for(s, s.stage0)) return;
    reduce_range_rt<T, A>(scratch, out, lo, hi, s.size, op, 1.0, lo);
    arrive(s, 1);
}

#define INSTANTIATE_RT(NAME, T, A)                                                           \
    extern "C" __global__ void allreduce_one_shot_##NAME##_op(                                \
        const T* input, const T* const* scratch, T* out, u64 n, double scale, int op,        \
        SYNC_PARAMS) {                                                                        \
        one_shot_rt<T, A>(input, scratch, out, n, scale, op, SYNC_VALUE);                     \
    }                                                                                         \
    extern "C" __global__ void allreduce_two_shot_##NAME##_op(                                \
        const T* input, const T* const* scratch, T* const* results, T* out, u64 n,           \
        double scale, int op, SYNC_PARAMS) {                                                  \
        two_shot_rt<T, A>(input, scratch, results, out, n, scale, op, SYNC_VALUE);            \
    }                                                                                         \
    extern "C" __global__ void reduce_scatter_##NAME##_op(                                    \
        const T* input, const T* const* scratch, T* out, u64 n, u64 lo, u64 hi, int op,      \
        SYNC_PARAMS) {                                                                        \
        reduce_scatter_rt<T, A>(input, scratch, out, n, lo, hi, op, SYNC_VALUE);              \
    }

INSTANTIATE_RT(int8, i8, i8)
INSTANTIATE_RT(uint8, u8, u8)
INSTANTIATE_RT(int16, i16, i16)
INSTANTIATE_RT(uint16, u16x, u16x)
INSTANTIATE_RT(int32, int, int)
INSTANTIATE_RT(uint32, u32, u32)
INSTANTIATE_RT(int64, i64, i64)
INSTANTIATE_RT(uint64, u64, u64)
INSTANTIATE_RT(bool, boolean, boolean)
INSTANTIATE_RT(float8_e4m3, e4m3, float)
INSTANTIATE_RT(float8_e5m2, e5m2, float)
INSTANTIATE_RT(complex64, c64, c64)
INSTANTIATE_RT(complex128, c128, c128)
