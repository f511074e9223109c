#!/usr/bin/env bash
# The whole GPU validation, for a lent GPU machine (one command; see docs/gpu-validation.md):
#   tests/gpu in one process (devices, streams, DLPack), tests/gpu at 1, 2 and 4 ranks on the
#   nvshmem backend (ranks share the GPU: LIMITED_MPG without MPS), the NVRTC compile checks,
#   and the GPU all-reduce benchmark. Logs and JSON go to $OUT (default logs/gpu); a summary
#   is printed last and written to $OUT/summary.txt. Exit code: non-zero if any step failed.
#
#   OUT=/some/dir scripts/gpu-validate.sh             # every step (about 10 min on an H100)
#   OUT=/some/dir scripts/gpu-validate.sh gpu-mpi-2   # some steps only (one device call each,
#                                                     # under the device tool's 600 s limit)
#   PY=python3 WHEELS=wheels/ scripts/gpu-validate.sh
# Steps: nvrtc gpu-1proc gpu-mpi-1 gpu-mpi-2 gpu-mpi-4 bench-gpu-allreduce. Each step is
# limited to ${STEP_TIMEOUT:-500} s and appends its verdict to $OUT/summary.txt at once.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-logs/gpu}"
PY="${PY:-python3}"
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export SHMEM_KERNEL_CACHE="${SHMEM_KERNEL_CACHE:-$OUT/kernel-cache}"
# one node, one GPU: no remote transport, no NVLS or NCCL (docs/gpu-validation.md)
export NVSHMEM_REMOTE_TRANSPORT="${NVSHMEM_REMOTE_TRANSPORT:-none}"
export NVSHMEM_DISABLE_NVLS="${NVSHMEM_DISABLE_NVLS:-1}"
export NVSHMEM_DISABLE_NCCL="${NVSHMEM_DISABLE_NCCL:-1}"
export NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME="${NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME:-lo}"

if [ -n "${WHEELS:-}" ] && [ -d "$WHEELS" ]; then  # packages the image lacks, carried as wheels
    "$PY" -m pip install -q --no-index --find-links "$WHEELS" \
        ml-dtypes threadpoolctl pytest pytest-mpi pytest-timeout hypothesis >"$OUT/pip.log" 2>&1
fi

{
    date -u +"date: %Y-%m-%dT%H:%M:%SZ"
    echo "git: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | sed 's/^/gpu: /'
    "$PY" - <<'PY' 2>&1
import importlib
for name in ("numpy", "cuda.core", "cuda.bindings", "mpi4py", "torch", "cupy", "nvshmem"):
    try:
        mod = importlib.import_module(name)
        print(f"{name}: {getattr(mod, '__version__', '?')}")
    except Exception as exc:
        print(f"{name}: missing ({exc})")
try:
    import nvshmem.core as nv
    print(f"nvshmem library: {nv.get_version()}")
except Exception as exc:
    print(f"nvshmem library: unknown ({exc})")
PY
} >"$OUT/environment.txt"
cat "$OUT/environment.txt"

LIMIT="${STEP_TIMEOUT:-500}"
SELECTED=("$@")
failed=()
echo "GPU validation $(date -u +%Y-%m-%dT%H:%M:%SZ)" >>"$OUT/summary.txt"
cat "$OUT/environment.txt" >>"$OUT/summary.txt"
step() {
    local name="$1"
    shift
    if [ ${#SELECTED[@]} -gt 0 ] && [[ ! " ${SELECTED[*]} " == *" $name "* ]]; then
        return
    fi
    echo "== $name: $*"
    local verdict
    if timeout "$LIMIT" "$@" >"$OUT/$name.log" 2>&1; then
        verdict="ok   $(grep -E '(passed|failed|skipped)' "$OUT/$name.log" | tail -1)"
    else
        verdict="FAIL (rc $?; see $name.log) $(grep -E '(passed|failed|error)' "$OUT/$name.log" | tail -1)"
        tail -30 "$OUT/$name.log"
        failed+=("$name")
    fi
    echo "   $verdict"
    echo "$name: $verdict" >>"$OUT/summary.txt"
}

PYTEST=("$PY" -m pytest -q -p no:cacheprovider --timeout=300)
step nvrtc env SHMEM_REQUIRE_NVRTC=1 "${PYTEST[@]}" tests/compile
step gpu-1proc "${PYTEST[@]}" tests/gpu/test_device_gpu.py
for n in 1 2 4; do
    step "gpu-mpi-$n" "$PY" -m launch -n "$n" --allow-gpu-sharing --timeout $((LIMIT - 20)) \
        -m pytest -q -p no:cacheprovider --only-mpi --timeout=300 --timeout-method=thread \
        tests/gpu/test_nvshmem_ranks.py
done
step bench-gpu-allreduce "$PY" benchmarks/gpu_allreduce.py --out "$OUT/gpu_allreduce.jsonl"

echo "failed steps: ${failed[*]:-none}" | tee -a "$OUT/summary.txt"
[ ${#failed[@]} -eq 0 ]
