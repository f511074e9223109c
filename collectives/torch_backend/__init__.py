"""``symheap``: a torch.distributed backend over the symmetric heap's collectives.

>>> import torch.distributed as dist                  # doctest: +SKIP
>>> dist.init_process_group("symheap")                # under `python -m launch -n 4 train.py`
>>> model = torch.nn.parallel.DistributedDataParallel(model)

Installing the package registers the backend through torch's backend autoload (the
``torch.backends`` entry point, run inside ``import torch``), so the name works without an
import; ``import collectives.torch_backend`` does the same explicitly. Registering costs no
MPI start and no heap: MPI and the World start in ``init_process_group``.

Ranks come from MPI: run under ``python -m launch`` (or ``mpiexec``), which also sets what
torch's ``env://`` init reads (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``, ...).
A torch rank or world size that differs from MPI's (torchrun starts single-process MPI jobs)
fails at once in ``init_process_group`` with a message naming both.

``timeout=`` of ``init_process_group`` becomes every wait's deadline when this backend starts
the World (torch's 30-minute default is not: the configured ``[signal] timeout_s`` applies,
60 s unless set). See :mod:`collectives.torch_backend.group` for the calls, and
:func:`~collectives.torch_backend.sequence_parallel_attention` for attention over a sequence
sharded across the ranks, differentiable.
"""

from __future__ import annotations

import datetime
import logging
import zlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .attention import sequence_parallel_attention
    from .group import ProcessGroupSymheap

__all__ = ["BACKEND", "ProcessGroupSymheap", "register", "sequence_parallel_attention"]

BACKEND = "symheap"
log = logging.getLogger(__name__)
_TORCH_DEFAULT_TIMEOUT = datetime.timedelta(minutes=30)
_owned_world: Any = None  # the World this backend started (finalized at exit)


def register() -> None:
    """Make ``"symheap"`` a torch.distributed backend name (idempotent; no MPI start)."""
    import torch.distributed as dist

    if not dist.is_available() or hasattr(dist.Backend, BACKEND.upper()):
        return
    dist.Backend.register_backend(BACKEND, _create, extended_api=True, devices=["cpu", "cuda"])


def _autoload() -> None:
    """torch's backend autoload entry point (``[project.entry-points."torch.backends"]``)."""
    try:
        register()
    except Exception:  # never break ``import torch``; the explicit import raises instead
        log.debug("symheap: autoload registration failed", exc_info=True)


def _world(timeout: datetime.timedelta) -> Any:
    """The open World, or one started here with ``timeout`` as the wait deadline."""
    import atexit

    import shmem
    from shmem.errors import ShmemStateError

    global _owned_world
    try:
        return shmem.get_world()
    except ShmemStateError:
        pass
    overrides: dict[str, Any] = {}
    if timeout != _TORCH_DEFAULT_TIMEOUT and timeout.total_seconds() > 0:
        overrides["signal_timeout_s"] = timeout.total_seconds()
    world = shmem.init(**overrides)
    _owned_world = world
    atexit.register(_finalize_owned)
    return world


def _finalize_owned() -> None:
    global _owned_world
    world, _owned_world = _owned_world, None
    if world is not None and not world.finalized:
        world.finalize()


def _create(dist_opts: Any, pg_opts: Any) -> ProcessGroupSymheap:
    """torch's creator: the default group over the World, or a subgroup of its ranks."""
    from collectives.communicator import Communicator
    from shmem.errors import ShmemStateError

    from .group import ProcessGroupSymheap

    world = _world(dist_opts.timeout)
    ranks = list(dist_opts.global_ranks_in_group)
    rank, size = dist_opts.group_rank, dist_opts.group_size
    if not ranks and (rank, size) != (world.rank, world.world_size):  # the default group
        raise ShmemStateError(
            f"symheap: torch says rank {rank} of {size} but MPI says rank {world.rank} of "
            f"{world.world_size} (expected the same: start the job with `python -m launch "
            f"-n {size} script.py` or mpiexec, not torchrun, whose processes are separate "
            "single-process MPI jobs)"
        )
    team = None  # a subgroup's own team (every rank, in order: the World's)
    if ranks and ranks != list(range(world.world_size)):
        gid = str(dist_opts.group_id)
        tag = int(gid) if gid.isdigit() else zlib.crc32(gid.encode())
        team = world.team_world.subteam(ranks, tag=tag % 32768)
    comm = Communicator(world if team is None else team)
    timeout_s = float(world.config.signal.timeout_s)
    return ProcessGroupSymheap(comm, timeout_s, str(dist_opts.group_id), team)


def __getattr__(name: str) -> Any:
    if name == "ProcessGroupSymheap":
        from .group import ProcessGroupSymheap

        return ProcessGroupSymheap
    if name == "sequence_parallel_attention":
        from .attention import sequence_parallel_attention

        return sequence_parallel_attention
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


register()
