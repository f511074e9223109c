"""Every ``__global__`` kernel of the tree ran on the CUDA-on-CPU layer during the fakegpu
tier (scripts/test.sh runs this right after it): the kernels of each CUDA source, as the
layer's own build of it registers them, against the names the layer traced as it launched
them (``CUDACPU_TRACE``, one file per process). Not collected by ``pytest tests/fakegpu``
(its name is not test_*): it needs the tier's trace."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.fakegpu import build
from tests.fakegpu.cudacpu.harness import Layer, source

ROOT = Path(__file__).resolve().parents[2]
SOURCES = sorted(
    str(p.relative_to(ROOT))
    for d in ("shmem/kernels", "collectives/kernels", "tests/gpu/kernels", "tests/fakegpu/cudacpu")
    for p in (ROOT / d).glob("*.cu")
)


def test_every_kernel_of_the_tree_ran_on_the_cpu_layer() -> None:
    trace = os.environ.get("CUDACPU_TRACE")
    if not trace or not Path(trace).is_dir():
        pytest.skip("no CUDACPU_TRACE folder (scripts/test.sh sets it for the fakegpu tier)")
    ran = {
        line.strip()
        for f in Path(trace).glob("*.txt")
        for line in f.read_text().splitlines()
        if line.strip()
    }
    folder = build.build(os.environ.get("FAKEGPU_BUILD") or ROOT / "logs" / "fakegpu")
    os.environ.setdefault("CUDACPU_CACHE", str(folder / "modules"))
    layer = Layer(folder)
    missing: dict[str, list[str]] = {}
    total = 0
    for rel in SOURCES:
        names = layer.load(source(rel)).kernels()
        total += len(names)
        if gone := [n for n in names if n not in ran]:
            missing[rel] = gone
    report = "; ".join(f"{rel}: {', '.join(names)}" for rel, names in missing.items())
    assert not missing, f"{sum(map(len, missing.values()))} of {total} kernels never ran: {report}"
    print(f"all {total} kernels of {len(SOURCES)} sources ran on the CPU layer")
