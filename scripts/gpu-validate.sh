#!/usr/bin/env bash
# ./dev gpu [STEP ...]: the GPU validation, on a lent GPU machine (docs/gpu-validation.md).
#
# Setup: a virtualenv over the image's Python (its torch, cupy and numpy stay visible through
# a .pth), the carried wheels of ./dev gpu-wheels installed into it with --no-deps (pip's exit
# status checked), so mpiexec and libmpi sit beside the interpreter that runs the ranks.
# Preflight, fail-fast: versions (driver, CUDA, packages, NVSHMEM, compute mode), MPI starts 2
# ranks, a CUDA kernel compiles and runs, the nvshmem backend at 1 and 2 ranks (init, a
# buffer, a put with signal, barrier, finalize). Then the steps, all or those named:
#   nvrtc gpu-1proc gpu-attention gpu-mpi-1 gpu-mpi-2 gpu-mpi-4 examples bench-gpu-allreduce
#   bench-gpu-attention bench-gpu-collectives
# Every step has a cap, and the run stops starting steps when its time budget (540 s: the
# device tool stops a command at 600 s) would be exceeded; skipped steps are listed, for a
# second call to name. SHMEM_REQUIRE_GPU=1: a failed GPU probe fails, never "N skipped".
#
# Output: $OUT/summary.txt and $OUT/gpu-logs.tar.gz (every log; the device tool returns at
# most 8 files). Kernel caches stay out of $OUT. Exit status: non-zero if anything failed.
#
#   OUT=/tmp/x ./dev gpu                       # everything the budget allows
#   ./dev gpu gpu-mpi-4 bench-gpu-allreduce    # setup, preflight, then these two
#
# A dry run of this script on the fake driver (no GPU; tests/fakegpu/README.md), with
# GPU_SETUP=skip: the project's own virtualenv as it is, nothing installed:
#   tests/fakegpu/dry_run.sh [STEP ...]
set -uo pipefail
cd "$(dirname "$0")/.."
START=$SECONDS
BUDGET="${GPU_BUDGET_S:-540}"
OUT="${OUT:-logs/gpu}"
mkdir -p "$OUT"
WORK="$(mktemp -d /tmp/shmem-gpu.XXXXXX)"
LOGS="$WORK/logs"
mkdir -p "$LOGS"
SUMMARY="$LOGS/summary.txt"
BASE_PY="${PY:-python3}"
VENV="${GPU_VENV:-/tmp/shmem-gpu-venv}"
export SHMEM_KERNEL_CACHE="${SHMEM_KERNEL_CACHE:-/tmp/shmem-kernel-cache}"
export SHMEM_REQUIRE_GPU=1 SHMEM_REQUIRE_NVRTC=1 PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
# one node, one GPU: no remote transport, no NVLS or NCCL (docs/gpu-validation.md)
export NVSHMEM_REMOTE_TRANSPORT="${NVSHMEM_REMOTE_TRANSPORT:-none}"
export NVSHMEM_DISABLE_NVLS="${NVSHMEM_DISABLE_NVLS:-1}"
export NVSHMEM_DISABLE_NCCL="${NVSHMEM_DISABLE_NCCL:-1}"
export NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME="${NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME:-lo}"
SELECTED=("$@")
failed=()
skipped=()

bundle() {
    echo "elapsed: $((SECONDS - START)) s; failed: ${failed[*]:-none}; skipped: ${skipped[*]:-none}" \
        >>"$SUMMARY"
    cp "$SUMMARY" "$OUT/summary.txt"
    tar czf "$OUT/gpu-logs.tar.gz" -C "$WORK" logs
}
trap bundle EXIT

note() { echo "$*" | tee -a "$SUMMARY"; }

# run NAME CAP FATAL CMD...: one capped step; FATAL=1 stops the run on failure
run() {
    local name="$1" cap="$2" fatal="$3"
    shift 3
    local left=$((BUDGET - (SECONDS - START)))
    if [ "$left" -lt 40 ]; then
        skipped+=("$name")
        note "$name: skipped (time budget: ${left} s left)"
        [ "$fatal" = 1 ] && exit 1
        return
    fi
    local limit=$((cap < left - 20 ? cap : left - 20))
    echo "== $name (cap ${limit} s): $*"
    local t0=$SECONDS verdict rc
    timeout --kill-after=10 "$limit" "$@" >"$LOGS/$name.log" 2>&1
    rc=$?
    local last
    last=$(grep -E '(passed|failed|error|ok|PROBLEM)' "$LOGS/$name.log" | tail -1 | cut -c1-160)
    if [ $rc -eq 0 ]; then
        verdict="ok in $((SECONDS - t0)) s  $last"
    else
        verdict="FAIL (rc $rc$([ $rc -eq 124 ] && echo ', timed out') after $((SECONDS - t0)) s)  $last"
        tail -25 "$LOGS/$name.log"
        failed+=("$name")
    fi
    note "$name: $verdict"
    if [ $rc -ne 0 ] && [ "$fatal" = 1 ]; then
        note "stopping: preflight step $name failed"
        exit 1
    fi
}

selected() {
    [ ${#SELECTED[@]} -eq 0 ] && return 0
    [[ " ${SELECTED[*]} " == *" $1 "* ]]
}

note "GPU validation $(date -u +%Y-%m-%dT%H:%M:%SZ), git $(git rev-parse --short HEAD 2>/dev/null || echo '?')"

# -- setup ------------------------------------------------------------------------------------
setup() {
    set -e
    if [ "${GPU_SETUP:-}" = skip ]; then  # $GPU_VENV as it is (the dry run on the fake driver)
        "$VENV/bin/python" -m pip list 2>/dev/null | grep -i -E 'nvshmem|cuda|mpi|pytest|numpy'
        test -x "$VENV/bin/mpiexec"
        return
    fi
    if [ ! -x "$VENV/bin/python" ]; then
        "$BASE_PY" -m venv "$VENV"
        local site image
        site=$("$VENV/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
        image=$("$BASE_PY" -c "import site; print('\n'.join(site.getsitepackages()))")
        echo "$image" >"$site/_gpu_image.pth"  # the image's packages, after the venv's own
    fi
    if ! ls .whl/*.whl >/dev/null 2>&1; then
        echo "no wheels in .whl/: run ./dev gpu-wheels here first and carry .whl"
        return 1
    fi
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-index --no-deps \
        --no-compile --upgrade .whl/*.whl
    "$VENV/bin/python" -m pip list 2>/dev/null | grep -i -E 'nvshmem|cuda|mpi|pytest|ml.dtypes|numpy|torch|cupy'
    test -x "$VENV/bin/mpiexec"
}
export VENV BASE_PY
export -f setup
run setup 240 1 bash -c setup
PY="$VENV/bin/python"
export PY

# -- preflight (fail-fast) ------------------------------------------------------------------
run pf-versions 60 1 "$PY" scripts/gpu_preflight.py versions
cat "$LOGS/pf-versions.log" >>"$SUMMARY"
run pf-mpi 60 1 "$VENV/bin/mpiexec" -n 2 "$PY" -c \
    "from mpi4py import MPI; c = MPI.COMM_WORLD; assert c.Get_size() == 2; \
print(c.Get_rank(), 'of 2 ok:', MPI.Get_library_version().splitlines()[0])"
run pf-kernel 120 1 "$PY" examples/03_device_context.py cuda:0
for n in 1 2; do
    run "pf-canary-$n" 120 1 "$PY" -m launch -n "$n" --allow-gpu-sharing --timeout 100 \
        --log-dir "$LOGS/pf-canary-$n.ranks" scripts/gpu_preflight.py canary
done

# -- steps ------------------------------------------------------------------------------------
PYTEST=("$PY" -m pytest -q -p no:cacheprovider --timeout=240)
selected nvrtc && run nvrtc 120 0 "${PYTEST[@]}" tests/compile
selected gpu-1proc && run gpu-1proc 180 0 "${PYTEST[@]}" tests/gpu/test_device_gpu.py \
    tests/gpu/test_gpu_ipc.py
selected gpu-attention && run gpu-attention 240 0 "${PYTEST[@]}" -x tests/gpu/test_attention_gpu.py
for n in 1 2 4; do
    selected "gpu-mpi-$n" && run "gpu-mpi-$n" 300 0 "$PY" -m launch -n "$n" --allow-gpu-sharing \
        --timeout 280 --log-dir "$LOGS/gpu-mpi-$n.ranks" -m pytest -q -p no:cacheprovider \
        --only-mpi --timeout=240 --timeout-method=thread tests/gpu/test_nvshmem_ranks.py
done
# the examples written for both backends (05_stencil_2d uses OpenSHMEM calls the nvshmem
# backend does not have yet: docs/openshmem.md)
examples() {
    set -e
    for ex in 01_ring_exchange.py 02_work_queue.py 04_allreduce.py; do
        SHMEM_BACKEND=nvshmem "$PY" -m launch -n 2 --allow-gpu-sharing --timeout 100 "examples/$ex"
    done
}
export -f examples
selected examples && run examples 300 0 bash -c examples
selected bench-gpu-allreduce && run bench-gpu-allreduce 300 0 "$PY" benchmarks/gpu_allreduce.py \
    --out "$LOGS/gpu_allreduce.jsonl"
selected bench-gpu-attention && run bench-gpu-attention 240 0 "$PY" benchmarks/gpu_attention.py \
    --out "$LOGS/gpu_attention.jsonl"
# one rank (NVSHMEM's collectives run: no LIMITED_MPG), then two sharing the GPU (ours only:
# NVSHMEM's host collectives would exit the process there, the records say so)
bench_collectives() {
    set -e
    for n in 1 2; do
        "$PY" -m launch -n "$n" --allow-gpu-sharing --timeout 150 \
            --log-dir "$LOGS/bench-gpu-collectives-$n.ranks" benchmarks/gpu_collectives.py \
            --out "$LOGS/gpu_collectives.jsonl"
    done
}
export LOGS
export -f bench_collectives
selected bench-gpu-collectives && run bench-gpu-collectives 300 0 bash -c bench_collectives

[ ${#failed[@]} -eq 0 ]
