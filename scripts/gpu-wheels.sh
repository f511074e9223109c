#!/usr/bin/env bash
# ./dev gpu-wheels: the Python packages the GPU image lacks, or has in other versions, as
# CPython 3.12 manylinux wheels in the ignored .whl/ (carried to the GPU machine; ./dev gpu
# installs them there with --no-deps --ignore-installed). About 35 MB. The list and its pins
# are scripts/gpu_setup.py's WHEELS (pyproject.toml's versions); the image's torch, cupy, numpy
# and NVSHMEM library are used as they are.
set -euo pipefail
cd "$(dirname "$0")/.."
mapfile -t WHEELS < <(python3 scripts/gpu_setup.py wheels)
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
# exactly the listed versions (a stale download would be installed too)
python3 - "${WHEELS[@]}" <<'PY'
import pathlib, re, sys
want = {re.sub(r"[-_.]+", "_", s.split("==")[0]).lower(): s.split("==")[1] for s in sys.argv[1:]}
stale = []
for w in sorted(pathlib.Path(".whl").glob("*.whl")):
    name, version = w.name.split("-")[:2]
    if want.get(re.sub(r"[-_.]+", "_", name).lower()) != version:
        stale.append(w.name)
if stale:
    raise SystemExit(f"gpu-wheels: wheels in .whl/ that the list does not name (remove them): {stale}")
PY
# the CUDA-on-CPU layer's results of the PTX probe, which ./dev gpu's first tier-1 step
# compares with the GPU's (scripts/gpu_ptx_probe.py; needs the project's venv and g++)
PY="${PY:-.venv/bin/python}"
if [ -x "$PY" ]; then
    "$PY" scripts/gpu_ptx_probe.py expect .whl/ptx_expected.npz
else
    echo "gpu-wheels: no $PY (run ./dev test once): .whl/ptx_expected.npz not made" >&2
fi
du -sh .whl
ls .whl
