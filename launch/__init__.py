"""``python -m launch``: an mpirun wrapper that never hangs and names the failing rank.

The launcher builds an ``mpiexec`` (MPICH Hydra or Open MPI) or ``srun`` command
(:mod:`launch.command`, pure), runs every rank under :mod:`launch.rank` (error file + abort on
an uncaught exception), tags and forwards output, enforces a deadline, and prints a
root-cause summary (:mod:`launch.report`).
"""

from __future__ import annotations

__all__: list[str] = []
