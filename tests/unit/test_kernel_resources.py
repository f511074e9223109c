"""The kernels' resources as NVIDIA's ptxas reports them (scripts/kernel_resources.py writes
tests/fakegpu/cudacpu/resources.tsv): the table is that of today's sources, no kernel spills
at sm_90 or sm_80, and every grid the runtime launches cooperatively fits the occupancy those
figures allow (the fake GPU refuses a cooperative launch larger than that too)."""

from __future__ import annotations

import hashlib
import math
import re
from pathlib import Path

import pytest

from shmem.device.cuda.nvrtc import source_of

ROOT = Path(__file__).resolve().parents[2]
TSV = ROOT / "tests" / "fakegpu" / "cudacpu" / "resources.tsv"

# per multiprocessor (CUDA C Programming Guide, "Compute Capabilities"): registers, shared
# memory for blocks (each block also reserves 1 KiB), threads, blocks
LIMITS = {"90": (65536, 233472, 2048, 32), "80": (65536, 167936, 2048, 32)}
COOPERATIVE = re.compile(r"^(allreduce_(one|two)_shot_|family_|reduce_scatter_|allreduce_drain)")


def _table() -> tuple[str, list[dict[str, str]]]:
    lines = TSV.read_text().splitlines()
    fields = lines[1].split("\t")
    return lines[0], [dict(zip(fields, line.split("\t"), strict=True)) for line in lines[2:]]


def blocks_per_sm(arch: str, registers: int, shared: int, threads: int) -> int:
    """Resident blocks of ``threads`` a multiprocessor holds (registers allocated per warp
    in units of 256)."""
    regs, smem, max_threads, max_blocks = LIMITS[arch]
    warps = math.ceil(threads / 32)
    per_warp = math.ceil(registers * 32 / 256) * 256
    by_regs = regs // (per_warp * warps) if registers else max_blocks
    by_smem = smem // (shared + 1024)
    return min(max_blocks, max_threads // (warps * 32), by_regs, by_smem)


def test_the_table_is_that_of_todays_sources() -> None:
    head, rows = _table()
    for entry in head.removeprefix("# ").split():
        rel, digest = entry.split("=")
        now = hashlib.sha256(source_of(rel).encode()).hexdigest()[:16]
        assert now == digest, f"{rel} changed since the table: run scripts/kernel_resources.py"
    kernels = {r["kernel"] for r in rows}
    assert {"allreduce_one_shot_float32_sum", "mha_fwd_bfloat16_d128", "shmem_barrier"} <= kernels
    assert {r["arch"] for r in rows} == set(LIMITS)


def test_no_kernel_spills() -> None:
    _, rows = _table()
    spilled = [
        f"{r['kernel']} (sm_{r['arch']}: {r['spill_stores']} B stored, {r['spill_loads']} B loaded)"
        for r in rows
        if int(r["spill_stores"]) or int(r["spill_loads"])
    ]
    assert not spilled, spilled


@pytest.mark.parametrize("arch", sorted(LIMITS))
def test_every_cooperative_grid_fits_the_occupancy_its_figures_allow(arch: str) -> None:
    """The runtime launches its collective kernels cooperatively with at most one block of
    512 threads per multiprocessor (collectives.gpu.grid_blocks), and the attention kernels
    with 128-thread blocks: each must fit at least once per multiprocessor."""
    from collectives.gpu import THREADS as COLLECTIVE_THREADS
    from collectives.mha.gpu import THREADS as ATTENTION_THREADS

    _, rows = _table()
    short = []
    for r in (r for r in rows if r["arch"] == arch):
        threads = COLLECTIVE_THREADS if COOPERATIVE.match(r["kernel"]) else ATTENTION_THREADS
        n = blocks_per_sm(arch, int(r["registers"]), int(r["shared"]), threads)
        if n < 1:
            short.append(f"{r['kernel']}: {r['registers']} registers, {r['shared']} B shared")
    assert not short, short


def test_the_occupancy_arithmetic_can_refuse() -> None:
    assert blocks_per_sm("90", 32, 0, 512) == 4
    assert blocks_per_sm("90", 255, 0, 512) == 0  # 64 KiB of registers for one block: none
    assert blocks_per_sm("90", 32, 200 << 10, 128) == 1
    assert blocks_per_sm("80", 32, 200 << 10, 128) == 0
