#!/usr/bin/env bash
# ./dev gpu-wheels: the Python packages the GPU image lacks, or has in other versions, as
# CPython 3.12 manylinux wheels in the ignored .whl/ (carried to the GPU machine; ./dev gpu
# installs them there with --no-deps). About 33 MB. Versions are the ones the project is
# tested with (pyproject.toml); the image's torch, cupy, numpy and NVSHMEM library are used
# as they are.
set -euo pipefail
cd "$(dirname "$0")/.."
WHEELS=(
    "nvshmem4py-cu13==0.4.1"  # the NVSHMEM host API (needs cuda-python: --no-deps below)
    "cuda-core==1.2.2"        # FileStreamProgramCache, peer_accessible_by
    "cuda-bindings==13.4.4"
    "cuda-pathfinder==1.9.0"
    "mpich==5.0.2"            # mpiexec and libmpi beside the interpreter that runs the ranks
    "mpi4py==4.1.2"
    "pytest-mpi==0.6"
    "ml-dtypes==0.6.0"
)
PLATFORMS=()
for p in manylinux_2_28 manylinux_2_27 manylinux_2_24 manylinux_2_17 manylinux2014 manylinux_2_34 \
    manylinux_2_5 manylinux1; do
    PLATFORMS+=(--platform "${p}_x86_64")
done
mkdir -p .whl
for spec in "${WHEELS[@]}"; do
    python3 -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
        --python-version 3.12 --implementation cp "${PLATFORMS[@]}" -d .whl "$spec"
done
# one version of each package (an older download would stop the install there)
python3 - <<'PY'
import collections, pathlib, re
seen = collections.defaultdict(list)
for w in sorted(pathlib.Path(".whl").glob("*.whl")):
    seen[re.split(r"-\d", w.name, maxsplit=1)[0].lower()].append(w.name)
dups = {k: v for k, v in seen.items() if len(v) > 1}
if dups:
    raise SystemExit(f"gpu-wheels: several versions in .whl/ (remove the stale ones): {dups}")
PY
du -sh .whl
ls .whl
