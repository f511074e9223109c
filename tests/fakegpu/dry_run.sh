#!/usr/bin/env bash
# The GPU validation (./dev gpu, scripts/gpu_run.py) run on the fake driver, on this machine:
# every tier's steps, their limits under the budget, their logs and the evidence in $OUT,
# checked before a lent GPU's time is spent on them. One fake GPU shared by the ranks
# (LIMITED_MPG, as on the lent machine). Expected failures here, which a GPU does not have:
# the tests and benchmarks that need torch on CUDA, and the dtypes the fake does not reduce
# at several ranks (bool, float8, complex: UNEMULATED). Output in $OUT (default
# /tmp/shmem-gpu-dry-run); arguments as ./dev gpu's.
#
#   tests/fakegpu/dry_run.sh                       # every tier, the default budget
#   tests/fakegpu/dry_run.sh --tier 1              # setup, preflight, smoke
#   GPU_BUDGET_S=120 tests/fakegpu/dry_run.sh      # watch the budget cut tier 2
#   tests/fakegpu/dry_run.sh gpu-mpi-2 examples    # preflight, then these
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
LIB="$(mktemp -d /tmp/fake-libcuda.XXXXXX)"
trap 'rm -rf "$LIB"' EXIT
python3 tests/fakegpu/kernel_signatures.py "$LIB"  # fake_kernel_params.h: the kernels' parameters
cc -shared -fPIC -O1 -I "$LIB" -o "$LIB/libcuda.so.1" tests/fakegpu/fake_libcuda.c -lm -lpthread
ln -sf libcuda.so.1 "$LIB/libcuda.so"
export LD_LIBRARY_PATH="$LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PYTHONPATH="$ROOT/tests/fakegpu:$ROOT"
export PATH="$ROOT/tests/fakegpu/bin:$PATH"  # nvidia-smi
export FAKEGPU_DRIVER=1 FAKE_GPUS=1          # every Python process takes the fake
export SHMEM_BACKEND=nvshmem GPU_SETUP=skip GPU_VENV="${GPU_VENV:-$ROOT/.venv}"
export OUT="${OUT:-/tmp/shmem-gpu-dry-run}"
rc=0
"$GPU_VENV/bin/python" scripts/gpu_run.py "$@" || rc=$?
echo "dry run: exit status $rc; evidence in $OUT"
exit $rc
