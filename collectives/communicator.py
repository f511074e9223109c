"""Communicator: the collectives' facade (validation, algorithm choice, stats) over one engine.

A :class:`Communicator` checks its construction, picks one engine for its life (the host
backend's channel, the nvshmem backend's GPU kernels, or a proper team's communicator:
:mod:`collectives.engines`) and hands each call to it whole: liveness, the choice of path
and the call itself are the engine's. Each collective lives in its own module
(``allreduce``, ``broadcast``, ...); the engines drive them.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, TypeVar, overload

import numpy as np

from shmem import Buffer, SHMEMBuffer, World
from shmem.config import parse_size
from shmem.errors import CollectiveArgumentError, ShmemStateError
from shmem.team import Team

from .channel import Channel
from .engines.base import Engine, Input, Output
from .engines.host import HostEngine
from .engines.team import TeamEngine
from .operand import Array
from .ops import ReduceOp, accumulate_dtype, check_op
from .schedule import Algorithm, AlgorithmTable
from .stats import CommStats

__all__ = ["CommStats", "Communicator"]

log = logging.getLogger(__name__)

_O = TypeVar("_O", bound=SHMEMBuffer | Array | Buffer)
_X = TypeVar("_X", bound=SHMEMBuffer | Array)


class Communicator:
    """Collectives over a World's ranks on symmetric memory (collective to create).

    Parameters
    ----------
    world : shmem.World or shmem.team.Team
        The ranks; scratch, flags and a signal pad are allocated from its heap once (and the
        scratch grows collectively when a call needs more, up to
        ``[collectives] scratch_max_nbytes``; larger messages are processed in pieces).
        A Team other than the world's (or ``team=``) makes a communicator of its members
        only, collectively over them: its collectives run on the team's communicator
        (:mod:`collectives.team`), ranks are team ranks.
    team : shmem.team.Team, optional
        The team, when ``world`` is the World.

    Raises
    ------
    CollectiveArgumentError
        ``world`` is not a World or a Team, or ``team`` is not a Team.
    ShmemStateError
        ``team`` is destroyed.

    Notes
    -----
    On the host backend every collective is host-blocking: it returns when this rank's
    output is complete and its input may be reused.

    Besides its own argument errors (raised on every rank), every collective raises
    ``ShmemStateError`` once the communicator is closed, its World finalized, or a previous
    call failed mid-way (the ranks are out of step); ``CollectiveMismatchError`` when ranks
    call different collectives or (``[collectives] check_args``) pass different arguments;
    ``SignalTimeoutError`` when a peer misses ``[signal] timeout_s``; ``PeerFailedError``
    when a peer failed mid-call. On the nvshmem backend the GPU collectives' argument errors
    are ``GpuCollectiveError``.
    """

    def __init__(self, world: World | Team, *, team: Team | None = None) -> None:
        if not isinstance(world, World | Team):
            raise CollectiveArgumentError(
                f"Communicator: invalid world (got {world!r}; expected a World or a Team; a "
                "rank outside a split team gets None from the split and takes no part)"
            )
        if isinstance(world, Team):
            team = world
            world = team.world
        if team is not None and (not isinstance(team, Team) or team.destroyed):
            raise (ShmemStateError if isinstance(team, Team) else CollectiveArgumentError)(
                f"Communicator: invalid team (got {team!r}; expected a Team that is not destroyed)"
            )
        self.world = world
        self.rank, self.world_size, self.num_nodes = world.rank, world.world_size, world.num_nodes
        self.stats = CommStats()
        self._acc32 = np.dtype(world.config.collectives.float32_accumulate)
        self.team: Team = world.team_world if team is None else team
        self.table = AlgorithmTable()
        self._engine: Engine = self._make_engine(world)
        self.stream = self._engine.stream  # its calls' number in the flight recorder

    def _make_engine(self, world: World) -> Engine:
        """This communicator's engine, made once (collective)."""
        if self.team.members != world.team_world.members:
            self.rank, self.world_size = self.team.my_pe, self.team.n_pes
            return TeamEngine(self.team, self._acc32)
        cfg = world.config.collectives
        default = AlgorithmTable()
        rows, crowded_max = default.rows, default.crowded_one_shot_max_nbytes
        if cfg.one_shot_max_nbytes != "auto":  # (a crowded node's limit too)
            crowded_max = parse_size(cfg.one_shot_max_nbytes)
            rows = tuple((w, crowded_max) for w, _ in rows)
        self.table = AlgorithmTable(rows, cfg.algorithm, crowded_one_shot_max_nbytes=crowded_max)
        if world.backend == "nvshmem":  # GPU kernels over the nvshmem heap
            from .engines.gpu import GpuEngine  # loads CUDA: only on the nvshmem backend

            return GpuEngine(world, self.stats, self._acc32)
        host = HostEngine(world, self.stats, self.table, self._acc32)
        self.table = host.ch.table  # (with the node's crowding, agreed by every rank)
        self.local_peers = host.ch.local_peers
        self.local_index = host.ch.local_index
        self.uniform_nodes = host.ch.uniform_nodes
        log.debug(
            "Communicator: %d ranks, %d node(s), local peers %s, table %s",
            self.world_size,
            self.num_nodes,
            self.local_peers,
            self.table,
        )
        return host

    # -- state ---------------------------------------------------------------------------------

    @property
    def _closed(self) -> bool:
        """Whether the communicator is closed (settable: a test that breaks one on purpose
        marks it closed, so that ``close()`` frees nothing)."""
        return self._engine.closed

    @_closed.setter
    def _closed(self, value: bool) -> None:
        self._engine.closed = value

    @property
    def host_channel(self) -> Channel | None:
        """The host engine's channel (None on the other engines): its cached plans, its node
        layout and its waits; for benchmarks, soak runs and debugging, not a stable API."""
        return self._engine.ch if isinstance(self._engine, HostEngine) else None

    @property
    def _gpu(self) -> Any:
        """The GPU engine's kernels (:class:`collectives.gpu_family.GpuCollectives`; None
        on the other engines); for introspection."""
        return getattr(self._engine, "gpu", None)

    @property
    def cross(self) -> object:
        """Ranks of other nodes this rank exchanges with (hierarchical algorithms)."""
        return self._engine.cross

    def close(self) -> None:
        """Release scratch, flags and pad (collective)."""
        self._engine.close()

    def __enter__(self) -> Communicator:
        return self

    def __exit__(self, exc_type: object, *rest: object) -> None:
        if exc_type is None:
            self.close()

    @property
    def scratch_capacity(self) -> int:
        """Bytes the scratch may grow to (``[collectives] scratch_max_nbytes``, or its current
        size if larger); larger messages are processed in pieces or through MPI."""
        return self._engine.scratch_capacity

    @property
    def scratch_nbytes(self) -> int:
        """Bytes of scratch this communicator holds now (host backend; 0 on nvshmem)."""
        return self._engine.scratch_nbytes

    def check_op(self, op: ReduceOp | str, dtype: np.dtype[np.generic], where: str) -> None:
        """Raise :class:`~shmem.errors.OpError` unless ``op`` applies to ``dtype``.

        Parameters
        ----------
        op, dtype, where : ReduceOp or str, numpy.dtype, str
            The op, the dtype it reduces, and the caller's name (the message's prefix).

        Raises
        ------
        OpError
            ``op`` is unknown or does not apply to ``dtype``.
        """
        check_op(op, dtype, where)

    def choose(self, algorithm: Algorithm | str, nbytes: int, where: str) -> str:
        """The all-reduce algorithm a call of ``nbytes`` would run (counted in ``stats``).

        Parameters
        ----------
        algorithm, nbytes, where : Algorithm or str, int, str
            ``"auto"`` or a forced algorithm, the message's bytes, and the caller's name.

        Returns
        -------
        str

        Raises
        ------
        CollectiveArgumentError, ShmemStateError
            An unknown ``algorithm``; a closed communicator, or one off the host backend.
        """
        return self._engine.choose(algorithm, nbytes, where)

    def accumulate_dtype(self, dtype: np.dtype[np.generic]) -> np.dtype[np.generic]:
        """The dtype reductions of ``dtype`` accumulate in (float32 for 16- and 8-bit floats;
        ``[collectives] float32_accumulate`` for float32).

        Parameters
        ----------
        dtype : numpy.dtype

        Returns
        -------
        numpy.dtype
        """
        return accumulate_dtype(dtype, self._acc32)

    # -- the collectives -----------------------------------------------------------------------

    @overload
    def all_reduce(
        self,
        x: Array,
        op: ReduceOp | str = ...,
        out: None = ...,
        algorithm: Algorithm | str = ...,
        *,
        stream: object = ...,
        out_dtype: Any = ...,
        scale: float | None = ...,
    ) -> Array: ...
    @overload
    def all_reduce(
        self,
        x: SHMEMBuffer | Buffer,
        op: ReduceOp | str = ...,
        out: None = ...,
        algorithm: Algorithm | str = ...,
        *,
        stream: object = ...,
        out_dtype: Any = ...,
        scale: float | None = ...,
    ) -> Array | Buffer: ...
    @overload
    def all_reduce(
        self,
        x: SHMEMBuffer | Array | Buffer,
        op: ReduceOp | str,
        out: _O,
        algorithm: Algorithm | str = ...,
        *,
        stream: object = ...,
        out_dtype: Any = ...,
        scale: float | None = ...,
    ) -> _O: ...
    @overload
    def all_reduce(
        self,
        x: SHMEMBuffer | Array | Buffer,
        op: ReduceOp | str = ...,
        *,
        out: _O,
        algorithm: Algorithm | str = ...,
        stream: object = ...,
        out_dtype: Any = ...,
        scale: float | None = ...,
    ) -> _O: ...
    def all_reduce(
        self,
        x: SHMEMBuffer | Array | Buffer,
        op: ReduceOp | str = "sum",
        out: SHMEMBuffer | Array | Buffer | None = None,
        algorithm: Algorithm | str = "auto",
        *,
        stream: object = None,
        out_dtype: Any = None,
        scale: float | None = None,
    ) -> SHMEMBuffer | Array | Buffer:
        """Equivalent to ``out = x_0 op x_1 op ... op x_{P-1}`` (left to right, elementwise) on
        every rank, bitwise identical everywhere. See :mod:`collectives.allreduce`.

        Parameters
        ----------
        x : SHMEMBuffer or numpy.ndarray
            This rank's input (a SHMEMBuffer is read by peers where it is: zero-copy).
        op : ReduceOp or str
            ``"sum"``, ``"avg"``, ``"prod"``, ``"min"``, ``"max"``, ``"band"``, ``"bor"``,
            ``"bxor"``.
        out : SHMEMBuffer or numpy.ndarray, optional
            Where the result goes (may be ``x``); by default a new array shaped like ``x``.
        algorithm : Algorithm or str
            ``"auto"`` (the table's choice) or a forced algorithm.
        stream : DeviceContext or a stream with ``__cuda_stream__``, optional
            The stream the GPU all-reduce is ordered on (nvshmem backend; default the World's
            context): a GPU DeviceContext of this rank's device, or another library's stream
            (torch, cupy). A call made while that stream captures a CUDA graph is recorded
            in the graph and replays correctly (the stage numbers live on the device).
            Ignored on the host backend, whose collectives are host-blocking.
        out_dtype : dtype, optional
            The result's dtype (floating inputs): e.g. ``float32`` for a ``bfloat16`` input.
            The reduction runs in the accumulation dtype as always and rounds once, to
            ``out_dtype`` instead of the input's (no second rounding). On the GPU: float32
            out of float16/bfloat16, fused into the kernel.
        scale : float, optional
            A factor applied to the result in the accumulation dtype before that rounding
            (``scale=1/world_size`` with ``op="sum"`` averages gradients; on the GPU in the
            same kernel). Floating inputs only.

        Returns
        -------
        SHMEMBuffer, numpy.ndarray or Buffer
            ``out`` when given; else a new numpy array shaped like ``x`` (a device Buffer on
            the nvshmem backend).

        Raises
        ------
        CollectiveArgumentError, OpError, GpuCollectiveError
            An invalid ``x``, ``op``, ``out``, ``algorithm``, ``out_dtype`` or ``scale``.
        """
        return self._engine.all_reduce(x, op, out, algorithm, stream, out_dtype, scale)

    @overload
    def reduce_scatter(
        self,
        x: Input,
        op: ReduceOp | str = ...,
        out: None = ...,
        *,
        stream: object = ...,
    ) -> Array: ...
    @overload
    def reduce_scatter(
        self, x: Input, op: ReduceOp | str, out: _X, *, stream: object = ...
    ) -> _X: ...
    @overload
    def reduce_scatter(
        self, x: Input, op: ReduceOp | str = ..., *, out: _X, stream: object = ...
    ) -> _X: ...
    def reduce_scatter(
        self,
        x: Input,
        op: ReduceOp | str = "sum",
        out: Output = None,
        *,
        stream: object = None,
    ) -> Input:
        """Shard ``rank`` (``schedule.shard_bounds(count, world_size)``) of the all-reduce.

        Parameters
        ----------
        x, op, out
            As :meth:`all_reduce`'s (``out`` takes this rank's shard; default a new array).
        stream : optional
            The GPU stream the call is ordered on (nvshmem backend; default the World's
            context); ignored on the host backend, whose collectives are host-blocking.

        Returns
        -------
        SHMEMBuffer or numpy.ndarray

        Raises
        ------
        CollectiveArgumentError, OpError
            An invalid ``x``, ``op`` or ``out``.
        """
        return self._engine.reduce_scatter(x, op, out, stream)

    @overload
    def all_gather(self, x: Input, out: None = ..., *, stream: object = ...) -> Array: ...
    @overload
    def all_gather(self, x: Input, out: _X, *, stream: object = ...) -> _X: ...
    def all_gather(self, x: Input, out: Output = None, *, stream: object = None) -> Input:
        """Every rank's ``x`` (same count everywhere) concatenated in rank order
        (``shmem_fcollect``).

        Parameters
        ----------
        x, out : SHMEMBuffer or numpy.ndarray
            This rank's input, and where the result goes (default a new array).
        stream : optional
            The GPU stream the call is ordered on (nvshmem backend; default the World's
            context); ignored on the host backend, whose collectives are host-blocking.

        Returns
        -------
        SHMEMBuffer or numpy.ndarray

        Raises
        ------
        CollectiveArgumentError
            An invalid ``x`` or ``out``.
        """
        return self._engine.all_gather(x, out, stream)

    @overload
    def broadcast(self, x: _X, root: int = ..., out: None = ..., *, stream: object = ...) -> _X: ...
    @overload
    def broadcast(self, x: Input, root: int, out: _X, *, stream: object = ...) -> _X: ...
    @overload
    def broadcast(self, x: Input, root: int = ..., *, out: _X, stream: object = ...) -> _X: ...
    def broadcast(
        self,
        x: Input,
        root: int = 0,
        out: Output = None,
        *,
        stream: object = None,
    ) -> Input:
        """Root's ``x`` on every rank (into ``out``, by default ``x`` itself).

        Parameters
        ----------
        x, out : SHMEMBuffer or numpy.ndarray
            The root's input, and where it goes on every rank (default ``x``).
        root : int
        stream : optional
            The GPU stream the call is ordered on (nvshmem backend; default the World's
            context); ignored on the host backend, whose collectives are host-blocking.

        Returns
        -------
        SHMEMBuffer or numpy.ndarray

        Raises
        ------
        CollectiveArgumentError
            An invalid ``x``, ``root`` or ``out``.
        """
        return self._engine.broadcast(x, root, out, stream)

    @overload
    def all_to_all(self, x: Input, out: None = ..., *, stream: object = ...) -> Array: ...
    @overload
    def all_to_all(self, x: Input, out: _X, *, stream: object = ...) -> _X: ...
    def all_to_all(self, x: Input, out: Output = None, *, stream: object = None) -> Input:
        """Chunk ``j`` of rank ``i``'s ``x`` becomes chunk ``i`` of rank ``j``'s output
        (``shmem_alltoall``).

        Parameters
        ----------
        x, out : SHMEMBuffer or numpy.ndarray
            This rank's input, and where the result goes (default a new array).
        stream : optional
            The GPU stream the call is ordered on (nvshmem backend; default the World's
            context); ignored on the host backend, whose collectives are host-blocking.

        Returns
        -------
        SHMEMBuffer or numpy.ndarray

        Raises
        ------
        CollectiveArgumentError
            An invalid ``x`` or ``out``, or a count not a multiple of ``world_size``.
        """
        return self._engine.all_to_all(x, out, stream)

    fcollect = all_gather
    alltoall = all_to_all

    @overload
    def collect(self, x: Input, out: None = ...) -> Array: ...
    @overload
    def collect(self, x: Input, out: _X) -> _X: ...
    def collect(self, x: Input, out: Output = None) -> Input:
        """Every rank's ``x`` (counts may differ between ranks) concatenated in rank order
        (``shmem_collect``; MPI's allgatherv), into ``out`` (x's dtype, the counts' sum of
        elements; a wrong size raises on every rank) or a new flat array.

        Parameters
        ----------
        x, out : SHMEMBuffer or numpy.ndarray
            This rank's input, and where the result goes (default a new array).

        Returns
        -------
        SHMEMBuffer or numpy.ndarray

        Raises
        ------
        CollectiveArgumentError
            An invalid ``x`` or ``out``.
        """
        return self._engine.collect(x, out)

    @overload
    def alltoalls(
        self,
        x: Input,
        nelems: int,
        *,
        dst_stride: int = ...,
        src_stride: int = ...,
        out: None = ...,
    ) -> Array: ...
    @overload
    def alltoalls(
        self, x: Input, nelems: int, *, dst_stride: int = ..., src_stride: int = ..., out: _X
    ) -> _X: ...
    def alltoalls(
        self,
        x: Input,
        nelems: int,
        *,
        dst_stride: int = 1,
        src_stride: int = 1,
        out: Output = None,
    ) -> Input:
        """Strided all-to-all (``shmem_alltoalls``): rank ``i`` sends ``x[(j * nelems + k) *
        src_stride]`` (``k < nelems``) to rank ``j``, which stores it at ``out[(i * nelems +
        k) * dst_stride]`` (a new zeroed array by default).

        Parameters
        ----------
        x, out : SHMEMBuffer or numpy.ndarray
            This rank's input, and where the result goes (default a new array).
        nelems, dst_stride, src_stride : int

        Returns
        -------
        SHMEMBuffer or numpy.ndarray

        Raises
        ------
        CollectiveArgumentError
            An invalid count or stride, or ``x`` or ``out`` too small.
        """
        return self._engine.alltoalls(x, nelems, dst_stride, src_stride, out)

    @overload
    def all_to_allv(
        self, x: Input, send_counts: Sequence[int], recv_counts: Sequence[int], out: None = ...
    ) -> Array: ...
    @overload
    def all_to_allv(
        self, x: Input, send_counts: Sequence[int], recv_counts: Sequence[int], out: _X
    ) -> _X: ...
    def all_to_allv(
        self,
        x: Input,
        send_counts: Sequence[int],
        recv_counts: Sequence[int],
        out: Output = None,
    ) -> Input:
        """All-to-all with per-pair counts (MPI's alltoallv): rank ``i`` sends the
        ``send_counts[j]`` elements of ``x`` after ``sum(send_counts[:j])`` to rank ``j``,
        which stores them in ``out`` after ``sum(recv_counts[:i])`` (a new flat array of
        ``sum(recv_counts)`` elements by default). Counts that do not pair up between two
        ranks raise on every rank before any data moves (:mod:`collectives.team`).

        Parameters
        ----------
        x, out : SHMEMBuffer or numpy.ndarray
            This rank's input, and where the result goes (default a new array).
        send_counts, recv_counts : sequence of int
            Elements to each rank, and from each rank.

        Returns
        -------
        SHMEMBuffer or numpy.ndarray

        Raises
        ------
        CollectiveArgumentError
            Invalid counts or ``out``, or counts that do not pair up.
        """
        return self._engine.all_to_allv(x, send_counts, recv_counts, out)

    def barrier(self, timeout: float | None = None) -> None:
        """Every rank of the communicator has arrived (a call of its own, signed like any).

        Parameters
        ----------
        timeout : float, optional
            Seconds; by default ``[signal] timeout_s``.

        Raises
        ------
        SignalTimeoutError, ShmemStateError, ArgumentError, CollectiveMismatchError
            A peer did not arrive in time; the World (or team communicator) is closed; an
            invalid ``timeout``; a rank is in another call of the communicator.
        """
        self._engine.barrier(timeout)
