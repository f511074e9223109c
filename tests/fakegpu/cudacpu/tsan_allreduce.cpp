// The all-reduce's stage protocol under ThreadSanitizer (tests/fakegpu/test_planted_bugs.py):
// the one-shot float32 kernel of the source named on the command line, at one rank, as a
// cooperative grid of several blocks, so a stage published by the last block to arrive is
// what lets the other blocks read the scratch the first ones wrote. Built together with the
// layer's runtime with -fsanitize=thread: the kernel module is built the same way, and TSan
// checks every access against the happens-before order of the atomics (the C++ memory model,
// which like the GPU's does not order a plain store before an acquire load; x86 would). A
// data race exits with TSan's status (66); a wrong sum exits 1.
//
//   tsan_allreduce SOURCE.cu
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "cudacpu_api.h"

int main(int argc, char** argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: tsan_allreduce SOURCE.cu\n");
        return 2;
    }
    std::ifstream in(argv[1]);
    std::stringstream text;
    text << in.rdbuf();
    const std::string src = text.str();
    char err[16384];
    cudacpu_module* m = cudacpu_load(src.data(), src.size(), "-arch=sm_90\n", err, sizeof err);
    if (!m) {
        std::fprintf(stderr, "%s\n", err);
        return 2;
    }
    cudacpu_kernel* k = cudacpu_kernel_of(m, "allreduce_one_shot_float32_sum");
    if (!k) return 2;
    const unsigned long long n = 4 * 2 * 64;  // four elements a thread
    std::vector<float> input(n), scratch(n, -1.f), out(n, 0.f);
    for (unsigned long long i = 0; i < n; ++i) input[i] = (float)i;
    unsigned long long flags_row[2] = {0, 0};  // this rank's flags: [stage][signature]
    unsigned long long* flags = flags_row;
    float* scratch_ptr = scratch.data();
    alignas(8) unsigned arrive[4] = {0, 0, 0, 0};  // counter, status, epoch (u64)
    int status = 0;
    const float* in_p = input.data();
    float* out_p = out.data();
    const float* const* scratch_pp = &scratch_ptr;
    unsigned long long* const* flags_pp = &flags;
    unsigned* arrive_p = arrive;
    unsigned arrive_base = 0;
    unsigned long long stage0 = 0, timeout = 20ull * 1000 * 1000 * 1000, sig = 0;
    int* status_p = &status;
    int rank = 0, size = 1;
    double scale = 1.0;
    void* params[] = {&in_p, &scratch_pp, &out_p, (void*)&n, &scale, &flags_pp, &arrive_p,
                      &arrive_base, &stage0, &timeout, &status_p, &rank, &size, &sig};
    const cudacpu_dim3 grid{2, 1, 1}, block{64, 1, 1};
    for (int call = 0; call < 2; ++call) {  // (the second call waits for the first's last stage)
        const int rc = cudacpu_launch(k, grid, block, 0, params, 1, 4, err, sizeof err);
        if (rc) {
            std::fprintf(stderr, "launch: %s\n", err);
            return 2;
        }
    }
    for (unsigned long long i = 0; i < n; ++i)
        if (out[i] != input[i] || status != 0) {
            std::fprintf(stderr, "wrong: out[%llu] = %g (want %g), status %d\n", i, out[i], input[i],
                         status);
            return 1;
        }
    std::printf("tsan_allreduce ok: %llu elements, 2 calls\n", n);
    return 0;
}
