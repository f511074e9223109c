// y[i] = a * x[i] + y[i]: the compile_function / enqueue_function test kernel.
extern "C" __global__ void saxpy(float a, const float* x, float* y, unsigned long long n) {
    const unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        y[i] = a * x[i] + y[i];
    }
}

// Each block writes its linear index into out[block], using shared memory on the way.
extern "C" __global__ void block_ids(int* out) {
    extern __shared__ int scratch[];
    const int b = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    if (threadIdx.x == 0) {
        scratch[0] = b;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        out[b] = scratch[0];
    }
}
