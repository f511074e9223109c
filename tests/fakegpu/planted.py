"""Bugs planted in the real kernels, to show that the CUDA-on-CPU layer catches what it is for
(tests/fakegpu/test_planted_bugs.py; tests/fakegpu/cudacpu/README.md).

Each bug is one textual change of a kernel source, made where the process reads the source
(``shmem.device.cuda.nvrtc.source_of``), so the product compiles and launches the mutated
kernel as it would its own. A change whose text is no longer in the source fails loudly:
a planted bug that silently plants nothing would make its test pass for nothing.

``PLANTED_BUG=<name>`` in the environment plants one in a process that calls
:func:`plant_from_environment` (``run_gpu_tests.py`` does).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

__all__ = ["BUGS", "Bug", "plant", "plant_from_environment"]


@dataclass(frozen=True)
class Bug:
    """One planted bug: in ``path``, the one occurrence of ``old`` becomes ``new``."""

    path: str
    old: str
    new: str
    what: str

    def apply(self, text: str) -> str:
        """``text`` (the source of ``path``) with the bug planted."""
        count = text.count(self.old)
        if count != 1:
            raise AssertionError(
                f"planted bug: {self.path} has {count} occurrences of {self.old!r} (expected "
                "exactly one: update tests/fakegpu/planted.py with the kernel)"
            )
        return text.replace(self.old, self.new)


ATTENTION = "collectives/kernels/attention.cu"
ALLREDUCE = "collectives/kernels/allreduce.cu"

BUGS = {
    # lanes 4g and 4g + 1 (and 4g + 2, 4g + 3) load each other's columns of the Q fragment
    "mma-lane-swap": Bug(
        ATTENTION,
        "const int c = kk * 16 + 2 * t;",
        "const int c = kk * 16 + 2 * (t ^ 1);",
        "a swapped lane in the mma A fragment (Q)",
    ),
    # V as the B operand needs the transposing load
    "ldmatrix-without-trans": Bug(
        ATTENTION,
        "ldmatrix_x2_trans(b0, b1, smem_addr(&vs[r][dt * 8]));",
        "ldmatrix_x2(b0, b1, smem_addr(&vs[r][dt * 8]));",
        "ldmatrix without .trans where the V tile needs it",
    ),
    # the general path's tile loop: a fast warp overwrites K/V while others still read them
    "missing-syncthreads": Bug(
        ATTENTION,
        "__syncthreads();  // the previous tile is read by every warp",
        "/* (planted: no barrier) */",
        "a removed __syncthreads before a shared tile is overwritten",
    ),
    # the K tile is used before its cp.async group has landed
    "missing-cp-async-wait": Bug(
        ATTENTION,
        "cp_async_wait<1>();  // this tile's K (its V may still be in flight)",
        "/* (planted: no wait) */",
        "a removed cp.async wait_group before the K tile is read",
    ),
    # a stage published with a plain store and no fence: no release (the TSan harness)
    "flag-without-release": Bug(
        ALLREDUCE,
        "for (int r = 0; r < s.size; ++r) store_release_sys(&s.flags[r][s.rank], s.stage0 + k);",
        "for (int r = 0; r < s.size; ++r) *(volatile u64*)&s.flags[r][s.rank] = s.stage0 + k;",
        "a stage flag stored without release",
    ),
}
# the fence before the publish would make a relaxed store a release: the bug takes both
_FENCE = "__threadfence_system();  // this block's writes before the stage is published"


def mutated(name: str, path: str, text: str) -> str:
    """``text``, the source of ``path``, with bug ``name`` planted if it is in that file."""
    bug = BUGS[name]
    if path != bug.path:
        return text
    text = bug.apply(text)
    if name == "flag-without-release":
        text = Bug(bug.path, _FENCE, "/* (planted: no fence) */", bug.what).apply(text)
    return text


def plant(name: str) -> None:
    """Make this process read its kernel sources with bug ``name`` planted."""
    if name not in BUGS:
        raise KeyError(f"planted bug: no bug {name!r} (expected one of {sorted(BUGS)})")
    from shmem.device.cuda import nvrtc

    real = nvrtc.source_of

    def source_of(relative: str) -> str:
        return mutated(name, relative, real(relative))

    nvrtc.source_of = source_of


def plant_from_environment() -> str | None:
    """Plant ``PLANTED_BUG`` if the environment names one; returns its name."""
    name = os.environ.get("PLANTED_BUG") or None
    if name:
        plant(name)
    return name
