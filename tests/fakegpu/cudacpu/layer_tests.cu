// Kernels that exercise the CUDA-on-CPU layer itself (tests/fakegpu/test_cudacpu.py): the
// warp shuffles' semantics, the schedule a seed permutes, and the faults the layer must
// report instead of hanging. Each takes `int* out` (4096 ints, zeroed).

// out[64 w + l]: lane l of warp w after __shfl_xor_sync(.., 5), idx(.., 7), up(.., 3),
// down(.., 2), xor within width 8 (1), at offsets 0, 64 * 32 ... of out
extern "C" __global__ void shuffles(int* out) {
    const int t = threadIdx.x, v = 100 * t;
    out[t] = __shfl_xor_sync(0xffffffffu, v, 5);
    out[256 + t] = __shfl_sync(0xffffffffu, v, 7);
    out[512 + t] = __shfl_up_sync(0xffffffffu, v, 3);
    out[768 + t] = __shfl_down_sync(0xffffffffu, v, 2);
    out[1024 + t] = __shfl_xor_sync(0xffffffffu, v, 1, 8);
    out[1280 + t] = __shfl_sync(0xffffffffu, v, 9, 8);
    const float f = __shfl_xor_sync(0xffffffffu, 0.5f * t, 16);
    out[1536 + t] = (int)(2.f * f);
}

// out[b * 64 + k]: the k-th thread of block b to take a ticket (the schedule's order)
extern "C" __global__ void tickets(int* out) {
    __shared__ int next;
    if (threadIdx.x == 0) next = 0;
    __syncthreads();
    const int k = atomicAdd(&next, 1);
    out[blockIdx.x * 64 + k] = threadIdx.x;
}

// the block barrier: every thread sees every other's value (out[0] the count of mistakes)
extern "C" __global__ void barrier_orders(int* out) {
    __shared__ int seen[64];
    seen[threadIdx.x] = threadIdx.x + 1;
    __syncthreads();
    int bad = 0;
    for (int i = 0; i < (int)blockDim.x; ++i) bad += seen[i] != i + 1;
    atomicAdd(&out[0], bad);
}

// faults --------------------------------------------------------------------------------------

// half the block waits at one __syncthreads, half at another
extern "C" __global__ void divergent_barrier(int* out) {
    if (threadIdx.x < 32) {
        __syncthreads();
    } else {
        __syncthreads();
    }
    out[threadIdx.x] = 1;
}

// lanes 1-31 of warp 0 wait in a shuffle for lane 0, which waits at the barrier with warp 1
extern "C" __global__ void deadlock(int* out) {
    if (threadIdx.x >= 1 && threadIdx.x < 32)
        out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1, 1);
    else
        __syncthreads();
}

// every thread but thread 0 waits at the barrier; thread 0 spins on an atomic forever
extern "C" __global__ void spins_forever(int* out) {
    if (threadIdx.x == 0)
        while (atomicAdd(&out[0], 0) == 0) {
        }
    __syncthreads();
}

// lane 3 leaves before the shuffle its warp does with every lane
extern "C" __global__ void exited_lane(int* out) {
    if (threadIdx.x == 3) return;
    out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, (int)threadIdx.x, 1);
}

// lanes of one warp at two different shuffles
extern "C" __global__ void divergent_shuffle(int* out) {
    int v = threadIdx.x;
    if (threadIdx.x & 1)
        v = __shfl_xor_sync(0xffffffffu, v, 2);
    else
        v = __shfl_xor_sync(0xffffffffu, v, 4);
    out[threadIdx.x] = v;
}
