// Strided copy between two views of `elem_size`-byte elements, for Buffer.contiguous(),
// copies into and out of strided views, and fills of strided views (shmem/_cuda.py).
// meta holds rank x shape, then rank x destination strides, then rank x source strides,
// strides in bytes (negative allowed). Element i is decomposed row-major (last axis fastest).
extern "C" __global__ void shmem_strided_copy(char* dst, const char* src,
                                              unsigned long long n, int rank, int elem_size,
                                              const long long* meta) {
    const unsigned long long step = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
         i < n; i += step) {
        long long rem = (long long)i, dst_off = 0, src_off = 0;
        for (int d = rank - 1; d >= 0; --d) {
            const long long extent = meta[d];
            const long long idx = rem % extent;
            rem /= extent;
            dst_off += idx * meta[rank + d];
            src_off += idx * meta[2 * rank + d];
        }
        switch (elem_size) {
            case 1:
                *(unsigned char*)(dst + dst_off) = *(const unsigned char*)(src + src_off);
                break;
            case 2:
                *(unsigned short*)(dst + dst_off) = *(const unsigned short*)(src + src_off);
                break;
            case 4:
                *(unsigned int*)(dst + dst_off) = *(const unsigned int*)(src + src_off);
                break;
            default:
                *(unsigned long long*)(dst + dst_off) =
                    *(const unsigned long long*)(src + src_off);
                break;
        }
    }
}
