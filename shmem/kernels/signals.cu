// Signals, waits, a barrier and atomics on the NVSHMEM heap, over peer pointers
// (nvshmem_ptr mappings), with system-scope release/acquire. One thread each; the host
// launches them on the World's stream and reads the result after a synchronize.
//
// Every wait is bounded: it spins on the global timer and gives up after timeout_ns,
// writing what it saw into *result so the host raises SignalTimeoutError with the same
// fields as the host backend.

typedef unsigned long long u64;
typedef long long i64;
typedef unsigned int u32;

#include "shmem/kernels/ptx.cuh"

__device__ __forceinline__ void store_release_sys(u64* p, u64 v) { ptx_st_release_sys_u64(p, v); }
__device__ __forceinline__ u64 load_acquire_sys(const u64* p) { return ptx_ld_acquire_sys_u64(p); }
__device__ __forceinline__ u64 add_release_sys(u64* p, u64 v) {
    return ptx_atom_add_release_sys_u64(p, v);
}
__device__ __forceinline__ u64 now_ns() { return ptx_globaltimer(); }

#define CMP_EQ 0
#define CMP_NE 1
#define CMP_GT 2
#define CMP_GE 3
#define CMP_LT 4
#define CMP_LE 5

// signal words are unsigned 64-bit (OpenSHMEM's uint64_t signals): compared unsigned
__device__ __forceinline__ bool compare(u64 v, int cmp, u64 value) {
    switch (cmp) {
        case CMP_EQ: return v == value;
        case CMP_NE: return v != value;
        case CMP_GT: return v > value;
        case CMP_GE: return v >= value;
        case CMP_LT: return v < value;
        default: return v <= value;
    }
}

// op 0: set, 1: add. Data written earlier on this stream (puts, copies) is ordered before it.
extern "C" __global__ void shmem_signal(u64* flag, u64 value, int op) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    __threadfence_system();
    if (op == 0)
        store_release_sys(flag, value);
    else
        add_release_sys(flag, value);
}

// result[0] = the last value seen, result[1] = 1 when the condition held, 0 on timeout.
extern "C" __global__ void shmem_wait_until(
    const u64* flag, int cmp, u64 value, u64 timeout_ns, i64* result) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    u64 start = now_ns();
    u64 v = load_acquire_sys(flag);
    while (!compare(v, cmp, value)) {
        if (now_ns() - start > timeout_ns) {
            result[0] = (i64)v;
            result[1] = 0;
            return;
        }
        v = load_acquire_sys(flag);
    }
    result[0] = (i64)v;
    result[1] = 1;
}

// Dissemination barrier: in round k, raise slot k of rank (rank + 2^k) mod size to epoch,
// then wait for this rank's slot k to reach it. pads[r] is rank r's barrier slots.
// result[0] = the round that timed out (-1: none), result[1] = the value last seen there.
extern "C" __global__ void shmem_barrier(
    u64* const* pads, int rank, int size, u64 epoch, u64 timeout_ns, i64* result) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    __threadfence_system();
    int round = 0;
    for (int dist = 1; dist < size; dist <<= 1, ++round) {
        int to = (rank + dist) % size;
        store_release_sys(&pads[to][round], epoch);
        u64 start = now_ns();
        u64 v;
        while ((v = load_acquire_sys(&pads[rank][round])) < epoch) {
            if (now_ns() - start > timeout_ns) {
                result[0] = round;
                result[1] = (i64)v;
                return;
            }
        }
    }
    result[0] = -1;
    result[1] = 0;
}

// Atomics on a peer's (or this rank's) heap word. width: 4 or 8 bytes; op 0: fetch-add,
// 1: swap, 2: compare-and-swap. old[0] receives the previous value (zero-extended).
extern "C" __global__ void shmem_atomic(
    void* target, int width, int op, u64 value, u64 compare, u64* old) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    __threadfence_system();
    if (width == 8) {
        u64* p = (u64*)target;
        u64 prev;
        if (op == 0)
            prev = atomicAdd_system(p, value);
        else if (op == 1)
            prev = atomicExch_system(p, value);
        else
            prev = atomicCAS_system(p, compare, value);
        old[0] = prev;
    } else {
        u32* p = (u32*)target;
        u32 prev;
        if (op == 0)
            prev = atomicAdd_system(p, (u32)value);
        else if (op == 1)
            prev = atomicExch_system(p, (u32)value);
        else
            prev = atomicCAS_system(p, (u32)compare, (u32)value);
        old[0] = prev;
    }
    __threadfence_system();
}
