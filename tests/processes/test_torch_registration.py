"""The symheap backend outside a launched job (issue 31): torch's autoload registers it
inside ``import torch`` without starting MPI or a heap, and a process whose torch rank is not
its MPI rank (torchrun starts each process as its own single-process MPI job) fails at once
in ``init_process_group``, saying to use ``python -m launch``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytestmark = pytest.mark.processes


def _python(code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=cwd,  # not the repository: the installed entry point does it
        check=False,
        timeout=120,
    )


def test_torch_autoload_registers_the_backend_without_starting_mpi(tmp_path: Path) -> None:
    code = (
        "import sys, torch, torch.distributed as dist\n"
        "print(dist.Backend.SYMHEAP, 'collectives.torch_backend' in sys.modules,\n"
        "      'mpi4py.MPI' in sys.modules, 'shmem.world' in sys.modules)\n"
    )
    proc = _python(code, tmp_path)
    assert proc.stdout.split() == ["symheap", "True", "False", "False"], proc.stderr


def test_import_collectives_starts_no_mpi(tmp_path: Path) -> None:
    code = (
        "import sys, collectives, collectives.torch_backend\n"
        "print('mpi4py.MPI' in sys.modules, collectives.allreduce.__name__,\n"
        "      'mpi4py.MPI' in sys.modules)\n"
    )
    proc = _python(code, tmp_path)  # a submodule's attribute loads it, and MPI with it
    assert proc.stdout.split() == ["False", "collectives.allreduce", "True"], proc.stderr


def test_a_torchrun_process_fails_at_once_naming_the_launcher(tmp_path: Path) -> None:
    code = (
        "import torch.distributed as dist\n"
        "dist.init_process_group('symheap', store=dist.HashStore(), rank=1, world_size=2)\n"
    )
    proc = _python(code, tmp_path)
    assert proc.returncode != 0
    assert "symheap: torch says rank 1 of 2 but MPI says rank 0 of 1" in proc.stderr, proc.stderr
    assert "python -m launch -n 2" in proc.stderr
