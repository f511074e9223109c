#!/usr/bin/env bash
# The GPU validation (./dev gpu, scripts/gpu_run.py) run on the fake driver, on this machine:
# every tier's steps, their limits under the budget, their logs and the evidence in $OUT,
# checked before a lent GPU's time is spent on them. One fake GPU shared by the ranks
# (LIMITED_MPG, as on the lent machine); the kernels run from their own source on the CPU
# (tests/fakegpu/cudacpu). Expected failures here, which a GPU does not have: the tests and
# benchmarks that need torch on CUDA. Output in $OUT (default /tmp/shmem-gpu-dry-run);
# arguments as ./dev gpu's.
#
#   tests/fakegpu/dry_run.sh                       # every tier, the default budget
#   tests/fakegpu/dry_run.sh --tier 1              # setup, preflight, smoke
#   GPU_BUDGET_S=120 tests/fakegpu/dry_run.sh      # watch the budget cut tier 2
#   tests/fakegpu/dry_run.sh gpu-mpi-2 examples    # preflight, then these
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
PY="${GPU_VENV:-$ROOT/.venv}/bin/python"
# the fake's libraries (built once into FAKEGPU_BUILD) and their environment: the fake
# libcuda, the CPU layer, the recording NVRTC; cubins in SHMEM_KERNEL_CACHE
CACHE="${SHMEM_KERNEL_CACHE:-$ROOT/logs/fakegpu/kernels}"
while IFS='=' read -r key value; do
    [ -n "$value" ] && export "$key=$value"
done < <("$PY" tests/fakegpu/build.py "${FAKEGPU_BUILD:-$ROOT/logs/fakegpu}" --env "$CACHE" | tail -n +2)
export PYTHONPATH="$ROOT/tests/fakegpu:$ROOT"
export PATH="$ROOT/tests/fakegpu/bin:$PATH"  # nvidia-smi
export FAKEGPU_DRIVER=1 FAKE_GPUS=1          # every Python process takes the fake
export SHMEM_BACKEND=nvshmem GPU_SETUP=skip GPU_VENV="${GPU_VENV:-$ROOT/.venv}"
export OUT="${OUT:-/tmp/shmem-gpu-dry-run}"
rc=0
"$GPU_VENV/bin/python" scripts/gpu_run.py "$@" || rc=$?
echo "dry run: exit status $rc; evidence in $OUT"
exit $rc
