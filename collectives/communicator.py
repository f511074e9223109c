"""Communicator: the collectives' facade (validation, algorithm choice, stats) over a channel.

A :class:`Communicator` owns one :class:`~collectives.channel.Channel` (flags, scratch and
sequence numbers in the symmetric heap) on a host World, or the GPU all-reduce kernels on the
nvshmem backend. Each collective lives in its own module (``allreduce``, ``broadcast``, ...)
and drives the channel; this module only checks liveness, picks the path and keeps the
communicator's state consistent when a call fails.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, TypeVar, cast, overload

import numpy as np

from shmem import Buffer, SHMEMBuffer, World
from shmem.config import parse_size
from shmem.dtypes import dtype_name
from shmem.errors import CollectiveArgumentError, ShmemStateError
from shmem.team import Team

from .all_gather import all_gather as _all_gather
from .all_to_all import all_to_all as _all_to_all
from .allreduce import NodesPlan, TinyPlan
from .allreduce import all_reduce as _all_reduce
from .allreduce import choose as _choose
from .broadcast import broadcast as _broadcast
from .channel import Channel, CommStats
from .operand import Array, Operand
from .ops import ReduceOp, accumulate_dtype, check_op, fused_out_dtype
from .reduce_scatter import reduce_scatter as _reduce_scatter
from .schedule import Algorithm, AlgorithmTable
from .team import TeamCollectives

if TYPE_CHECKING:
    from .gpu import GpuAllReduce

__all__ = ["CommStats", "Communicator"]

log = logging.getLogger(__name__)

Input = SHMEMBuffer | Array
Output = SHMEMBuffer | Array | None
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

    Notes
    -----
    On the host backend every collective is host-blocking: it returns when this rank's
    output is complete and its input may be reused.
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
        cfg = world.config.collectives
        self.rank, self.world_size = world.rank, world.world_size
        self.num_nodes = world.num_nodes
        self._closed = False
        self.stats = CommStats()
        self._acc32 = np.dtype(cfg.float32_accumulate)
        self.team: Team = world.team_world if team is None else team
        self._tc: TeamCollectives | None = None  # collect/alltoalls (and everything on a team)
        self._gpu: GpuAllReduce | None = None
        self._ch: Channel | None = None
        self._last_plan: TinyPlan | NodesPlan | None = None  # the all-reduce fast path's
        self._last_out: Array | None = None
        # (out, zero-copy input, whether out overlaps it): the fast path's last such pair
        self._alias: tuple[object, object, bool] | None = None
        self._last_family: dict[str, Any] = {}  # kind -> the last family plan replayed
        self.table = AlgorithmTable()
        if self.team.members != world.team_world.members:
            self.rank, self.world_size = self.team.my_pe, self.team.n_pes
            self._tc = self._team_collectives()
            return
        rows = AlgorithmTable().rows
        if cfg.one_shot_max_nbytes != "auto":
            limit = parse_size(cfg.one_shot_max_nbytes)
            rows = tuple((w, limit) for w, _ in rows)
        self.table = AlgorithmTable(rows=rows, forced=cfg.algorithm)
        if world.backend == "nvshmem":  # GPU kernels over the nvshmem heap (collectives/gpu.py)
            from .gpu import GpuAllReduce  # loads CUDA: only on the nvshmem backend

            self._gpu = GpuAllReduce(self)
            world.barrier()
            return
        ch = self._ch = Channel(world, self.stats)
        ch.table = self.table
        # collect and alltoalls: made now, while every rank is here (it duplicates an MPI
        # communicator: made lazily, a rank in collect against peers in another call
        # blocked in MPI with no deadline), and run in step with the channel's calls
        self._team_collectives().board = ch
        self.local_peers = ch.local_peers
        self.local_index = ch.local_index
        self.uniform_nodes = ch.uniform_nodes
        world.barrier()
        log.debug(
            "Communicator: %d ranks, %d node(s), local peers %s, table %s",
            self.world_size,
            self.num_nodes,
            self.local_peers,
            self.table,
        )

    # -- state ---------------------------------------------------------------------------------

    def _live(self, where: str) -> None:
        if self._closed:
            raise ShmemStateError(f"Communicator.{where}: the communicator is closed")
        self.world.check_open(f"Communicator.{where}")

    def _team_collectives(self) -> TeamCollectives:
        if self._tc is None:  # collective: every member makes it on the same call
            cfg = self.world.config
            self._tc = TeamCollectives(
                self.team, cfg.collectives.check_args, cfg.signal.timeout_s, self._acc32
            )
        return self._tc

    def _on_team(self, where: str) -> TeamCollectives | None:
        """The team engine when this communicator is a proper team's, else None."""
        if self._ch is None and self._gpu is None:
            self._live(where)
            return self._team_collectives()
        return None

    def _channel(self, where: str) -> Channel:
        self._live(where)
        if self._ch is None:
            raise ShmemStateError(
                f"Communicator.{where}: not available on the nvshmem backend yet (its GPU "
                "kernels cover all_reduce, reduce_scatter, all_gather, broadcast and "
                "all_to_all); use a host World (backend='host') for it"
            )
        return self._ch

    @contextlib.contextmanager
    def _call(self, ch: Channel) -> Iterator[Channel]:
        """Run one collective: if it raises after exchanging flags, peers may be mid-call, so
        the channel is no longer in step: it retracts its flags and warns the peers
        (``Channel.fail``), and the communicator refuses later calls."""
        if ch.broken:
            raise ShmemStateError(
                "Communicator: a previous call failed, so the ranks are out of step; close "
                "this communicator and make a new one"
            )
        seq = ch.seq
        try:
            yield ch
        except BaseException as exc:
            # an error every rank raised at the same point of a finished call (``agreed``,
            # e.g. collect's out size, checked against the exchanged counts) leaves them in step
            if ch.seq != seq and not getattr(exc, "agreed", False):
                ch.fail()
            raise

    @property
    def cross(self) -> object:
        """Ranks of other nodes this rank exchanges with (hierarchical algorithms)."""
        if self._ch is None or self._ch.cross is None:
            raise ShmemStateError("Communicator.cross: the job has a single node")
        return self._ch.cross

    def close(self) -> None:
        """Release scratch, flags and pad (collective)."""
        if self._closed:
            return
        # the remembered plan and out view scratch and flags: drop them before those close
        # (a view kept across close() would keep its block held, shmem.quarantine)
        self._last_plan = None
        self._last_out = None
        self._alias = None
        self._last_family.clear()
        if self.world.finalized:  # the heap is gone with the World: nothing left to free
            self._closed = True
            return
        if self._gpu is not None:
            self._closed = True
            self._gpu.close()
        elif self._ch is not None:
            self._ch.close()  # waits for the peers' last DONE first
            self._closed = True
        if self._tc is not None:
            self._closed = True
            self._tc.close()

    def __enter__(self) -> Communicator:
        return self

    def __exit__(self, exc_type: object, *rest: object) -> None:
        if exc_type is None:
            self.close()

    @property
    def scratch_capacity(self) -> int:
        """Bytes the scratch may grow to (``[collectives] scratch_max_nbytes``, or its current
        size if larger); larger messages are processed in pieces or through MPI."""
        if self._ch is None:
            return max(int(self.world.config.collectives.scratch_nbytes), 1 << 20)
        return self._ch.scratch_capacity

    @property
    def scratch_nbytes(self) -> int:
        """Bytes of scratch this communicator holds now (host backend; 0 on nvshmem)."""
        return 0 if self._ch is None else self._ch.scratch_buf.nbytes

    def check_op(self, op: ReduceOp | str, dtype: np.dtype[np.generic], where: str) -> None:
        """Raise :class:`~shmem.errors.OpError` unless ``op`` applies to ``dtype``."""
        check_op(op, dtype, where)

    def choose(self, algorithm: Algorithm | str, nbytes: int, where: str) -> str:
        """The all-reduce algorithm a call of ``nbytes`` would run (counted in ``stats``)."""
        return _choose(self._channel(where), algorithm, nbytes, where)

    def accumulate_dtype(self, dtype: np.dtype[np.generic]) -> np.dtype[np.generic]:
        """The dtype reductions of ``dtype`` accumulate in (float32 for 16- and 8-bit floats;
        ``[collectives] float32_accumulate`` for float32)."""
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
        """
        if out_dtype is not None or scale is not None:
            return self._fused_all_reduce(x, op, out, algorithm, stream, out_dtype, scale)
        ch = self._ch
        if ch is None or self._closed:
            tc = self._on_team("all_reduce")
            if tc is not None and not isinstance(x, Buffer) and not isinstance(out, Buffer):
                return tc.all_reduce(x, op, out)
            return self._gpu_all_reduce(x, op, out, algorithm, stream)
        if algorithm == "auto" and (out is None or type(out) is np.ndarray):
            # replay a cached small one-shot call (only where the table picks one-shot, so
            # every rank runs the same protocol whatever kind of argument it passed)
            shm: SHMEMBuffer | None = None
            src: Array | None = None
            plan = self._last_plan  # the last shape replayed: no key to build or hash
            if type(x) is np.ndarray:
                src, count, dtype = x, x.size, x.dtype  # any layout: the plan copies it
            elif type(x) is SHMEMBuffer and not x.closed:
                shm = x
                if plan is not None and x is plan.shm:  # its shape and dtype are known
                    count, dtype = plan.count, plan.dtype
                else:
                    count, dtype = x.count, x.dtype
            if shm is not None or src is not None:
                if plan is None or plan.count != count or plan.dtype is not dtype or plan.op != op:
                    plan = ch.plans.get((count, dtype, op))
                    self._last_plan = plan
                if (
                    plan is not None
                    and plan.auto
                    and plan.scratch is ch.scratch_buf
                    and not ch.broken
                    and (out is None or out is self._last_out or _fits(out, dtype, count))
                ):
                    if self.world.finalized:
                        self._live("all_reduce")
                    if out is None:
                        res = np.empty(x.shape, dtype)
                    else:
                        # checked once per out array (a later writeable=False on it would
                        # fail mid-call: the peers then stop with PeerFailedError)
                        res = self._last_out = out
                    flat = res if res.ndim == 1 else res.reshape(-1)
                    if src is None:
                        src = flat
                    elif src.ndim != 1:
                        src = src.reshape(-1)
                    self._run_plan(ch, plan, src, shm, flat, out, plan.algorithm)
                    return res
        if isinstance(x, Buffer) or isinstance(out, Buffer):
            return self._gpu_all_reduce(x, op, out, algorithm, stream)  # refuses them
        self._live("all_reduce")
        with self._call(ch):
            return _all_reduce(ch, x, op, out, algorithm)

    def _fused_all_reduce(
        self,
        x: SHMEMBuffer | Array | Buffer,
        op: ReduceOp | str,
        out: SHMEMBuffer | Array | Buffer | None,
        algorithm: Algorithm | str,
        stream: object,
        out_dtype: Any,
        scale: float | None,
    ) -> SHMEMBuffer | Array | Buffer:
        """``all_reduce`` with ``out_dtype``/``scale``. On the GPU both are fused into the
        kernel. On the host the input is widened to its accumulation dtype first (the
        reduction that dtype's all-reduce runs is the same rank-order reduction, without the
        final rounding), scaled there, and rounded once to ``out_dtype``."""
        where = "Communicator.all_reduce"
        self._live("all_reduce")
        if self._gpu is not None:
            return cast(
                "Buffer",
                self._gpu.all_reduce(
                    x, str(op), out, str(algorithm), stream=stream, out_dtype=out_dtype,
                    scale=scale,
                ),
            )  # fmt: skip
        if isinstance(x, Buffer) or isinstance(out, Buffer):
            return self._gpu_all_reduce(x, op, out, algorithm, stream)  # refuses them
        src = Operand(x, where, "x").array  # the normal path's checks and errors
        odt = fused_out_dtype(src.dtype, out_dtype, scale, where)
        check_op(op, src.dtype, where)
        target: Array | None = None
        if out is not None:
            target = out.local() if isinstance(out, SHMEMBuffer) else out
            if (
                not isinstance(target, np.ndarray)
                or target.dtype != odt
                or target.size != src.size
                or not target.flags.writeable
            ):
                kind = getattr(target, "dtype", type(target).__name__)
                got = f"{kind} {getattr(target, 'size', '?')}"
                raise CollectiveArgumentError(
                    f"{where}: invalid out (got {got} elements; expected a writeable "
                    f"{dtype_name(odt)} array of {src.size})"
                )
        # the final accumulation dtype (a float32 all-reduce may accumulate in float64):
        # the inner call then rounds nothing, and the cast below is the one rounding
        acc = accumulate_dtype(accumulate_dtype(src.dtype, self._acc32), self._acc32)
        wide = self.all_reduce(np.ascontiguousarray(src, dtype=acc), op, algorithm=algorithm)
        if scale is not None:
            np.multiply(wide, acc.type(scale), out=wide)
        if target is None:
            return wide.astype(odt, copy=False).reshape(src.shape)
        np.copyto(target, wide.reshape(target.shape), casting="unsafe")  # any layout of out
        return out  # type: ignore[return-value]

    def _gpu_all_reduce(
        self,
        x: SHMEMBuffer | Array | Buffer,
        op: ReduceOp | str,
        out: SHMEMBuffer | Array | Buffer | None,
        algorithm: Algorithm | str,
        stream: object,
    ) -> SHMEMBuffer | Array | Buffer:
        self._live("all_reduce")  # raises when closed
        if self._gpu is None:  # a device Buffer on the host backend
            raise CollectiveArgumentError(
                "Communicator.all_reduce: device Buffers need the nvshmem backend (got "
                f"{type(x).__name__} and {type(out).__name__}; expected SHMEMBuffer or numpy "
                "arrays on the host backend)"
            )
        if stream is None:
            return cast("Buffer", self._gpu.all_reduce(x, str(op), out, str(algorithm)))
        return cast("Buffer", self._gpu.all_reduce(x, str(op), out, str(algorithm), stream=stream))

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

        ``stream``: the GPU stream the call is ordered on (nvshmem backend; default the
        World's context); ignored on the host backend, whose collectives are host-blocking."""
        if self._ch is not None and type(op) is str:
            done = self._replay_family("reduce_scatter", x, out, op)
            if done is not None:
                return cast("Input", done)
        tc = self._on_team("reduce_scatter")
        if tc is not None:
            return tc.reduce_scatter(x, op, out)
        if self._gpu is not None:  # the nvshmem backend: GPU kernels (collectives/gpu.py)
            self._live("reduce_scatter")
            return cast(
                "Input", self._gpu.family("reduce_scatter", x, out, op=str(op), stream=stream)
            )
        with self._call(self._channel("reduce_scatter")) as ch:
            return _reduce_scatter(ch, x, op, out)

    @overload
    def all_gather(self, x: Input, out: None = ..., *, stream: object = ...) -> Array: ...
    @overload
    def all_gather(self, x: Input, out: _X, *, stream: object = ...) -> _X: ...
    def all_gather(self, x: Input, out: Output = None, *, stream: object = None) -> Input:
        """Every rank's ``x`` (same count everywhere) concatenated in rank order
        (``shmem_fcollect``).

        ``stream``: the GPU stream the call is ordered on (nvshmem backend; default the
        World's context); ignored on the host backend, whose collectives are host-blocking."""
        if self._ch is not None:
            done = self._replay_family("all_gather", x, out, 0)
            if done is not None:
                return cast("Input", done)
        tc = self._on_team("all_gather")
        if tc is not None:
            return tc.all_gather(x, out)
        if self._gpu is not None:
            self._live("all_gather")
            return cast("Input", self._gpu.family("all_gather", x, out, stream=stream))
        with self._call(self._channel("all_gather")) as ch:
            return _all_gather(ch, x, out)

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

        ``stream``: the GPU stream the call is ordered on (nvshmem backend; default the
        World's context); ignored on the host backend, whose collectives are host-blocking."""
        if self._ch is not None and type(root) is int:
            done = self._replay_family("broadcast", x, out, root)
            if done is not None:
                return cast("Input", done)
        tc = self._on_team("broadcast")
        if tc is not None:
            return tc.broadcast(x, root, out)
        if self._gpu is not None:
            self._live("broadcast")
            return cast("Input", self._gpu.family("broadcast", x, out, root=root, stream=stream))
        with self._call(self._channel("broadcast")) as ch:
            return _broadcast(ch, x, root, out)

    def _run_plan(
        self,
        ch: Channel,
        plan: Any,
        src: Any,
        shm: SHMEMBuffer | None,
        flat: Array,
        out: object,
        name: str,
    ) -> None:
        """Replay ``plan`` (input ``src`` or ``shm``, result into ``flat``, the flat view of
        ``out`` or of a new array) and count it under ``name``."""
        in_place = shm is not None and out is not None and self._over(out, flat, shm)
        try:
            plan.run(ch, src, shm, flat, in_place)
        except BaseException:
            ch.fail()  # flags moved: peers must not complete this call
            raise
        algos = ch.stats.algorithms
        if algos is not None:
            algos[name] += 1
        else:
            ch.stats.count(name)

    def _over(self, out: object, flat: Array, shm: SHMEMBuffer) -> bool:
        """Whether ``out`` (flat view ``flat``) overlaps my zero-copy input ``shm``, which
        peers read until their ``DONE``: a cached replay then combines aside and copies the
        result in after (checked once per pair of objects)."""
        alias = self._alias
        if alias is None or alias[0] is not out or alias[1] is not shm:
            alias = self._alias = (out, shm, bool(np.may_share_memory(flat, shm.local())))
        return alias[2]

    def _replay_family(self, kind: str, x: object, out: object, extra: object) -> Any:
        """Replay the cached plan of a small broadcast, all-gather, reduce-scatter or
        all-to-all of this shape (node-local: :class:`collectives.family.FamilyPlan`, a
        sharded :class:`collectives.allreduce.TinyPlan`; across nodes:
        :class:`collectives.cross_plan.CrossPlan`; ``extra``: the root or the op): the result,
        or None when there is none yet or an argument needs the general path (which
        validates it)."""
        ch = self._ch
        if ch is None or self._closed or ch.broken:
            return None
        shm: SHMEMBuffer | None = None
        flags: Any = None
        if type(x) is np.ndarray:
            flags = x.flags
            if not flags.c_contiguous:
                return None
            count, dtype = x.size, x.dtype
        elif type(x) is SHMEMBuffer and not x.closed:
            shm, count, dtype = x, x.count, x.dtype
        else:
            return None
        plan = self._last_family.get(kind)  # the last shape replayed: no key to build
        if plan is None or plan.count != count or plan.dtype is not dtype or plan.extra != extra:
            plan = ch.plans.get((kind, count, dtype, extra))
            if plan is None:
                return None
            self._last_family[kind] = plan
        if plan.scratch is not ch.scratch_buf:
            return None
        total = plan.out_count
        res: Any
        flat: Any
        if out is None and kind == "broadcast":  # into x itself
            if shm is None:
                if not flags.writeable:
                    return None
                res, flat = x, x if x.ndim == 1 else x.reshape(-1)  # type: ignore[union-attr]
            else:
                res, flat = shm, shm.local().reshape(-1)
        elif out is None:
            shape = x.shape if total == count else (total,)
            res = np.empty(shape, dtype)
            flat = res.reshape(-1)
        elif type(out) is np.ndarray and _fits(out, dtype, total):
            res, flat = out, out.reshape(-1)
        else:
            return None
        if self.world.finalized:
            self._live(kind)
        src = flat if shm is not None else x if x.ndim == 1 else x.reshape(-1)  # type: ignore[union-attr]
        self._run_plan(ch, plan, src, shm, flat, out, kind)
        return res

    @overload
    def all_to_all(self, x: Input, out: None = ..., *, stream: object = ...) -> Array: ...
    @overload
    def all_to_all(self, x: Input, out: _X, *, stream: object = ...) -> _X: ...
    def all_to_all(self, x: Input, out: Output = None, *, stream: object = None) -> Input:
        """Chunk ``j`` of rank ``i``'s ``x`` becomes chunk ``i`` of rank ``j``'s output
        (``shmem_alltoall``).

        ``stream``: the GPU stream the call is ordered on (nvshmem backend; default the
        World's context); ignored on the host backend, whose collectives are host-blocking."""
        if self._ch is not None:  # (cached plans of all_to_all: small calls across nodes)
            done = self._replay_family("all_to_all", x, out, 0)
            if done is not None:
                return cast("Input", done)
        tc = self._on_team("all_to_all")
        if tc is not None:
            return tc.all_to_all(x, out)
        if self._gpu is not None:
            self._live("all_to_all")
            return cast("Input", self._gpu.family("all_to_all", x, out, stream=stream))
        with self._call(self._channel("all_to_all")) as ch:
            return _all_to_all(ch, x, out)

    fcollect = all_gather
    alltoall = all_to_all

    @overload
    def collect(self, x: Input, out: None = ...) -> Array: ...
    @overload
    def collect(self, x: Input, out: _X) -> _X: ...
    def collect(self, x: Input, out: Output = None) -> Input:
        """Every rank's ``x`` (counts may differ between ranks) concatenated in rank order
        (``shmem_collect``; MPI's allgatherv), into ``out`` (x's dtype, the counts' sum of
        elements; a wrong size raises on every rank) or a new flat array."""
        self._live("collect")
        if self._ch is None:
            return self._team_collectives().collect(x, out)
        with self._call(self._ch):
            return self._team_collectives().collect(x, out)

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
        k) * dst_stride]`` (a new zeroed array by default)."""
        self._live("alltoalls")
        tc = self._team_collectives()
        if self._ch is None:
            return tc.alltoalls(x, nelems, dst_stride=dst_stride, src_stride=src_stride, out=out)
        with self._call(self._ch):
            return tc.alltoalls(x, nelems, dst_stride=dst_stride, src_stride=src_stride, out=out)

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
        ranks raise on every rank before any data moves (:mod:`collectives.team`)."""
        self._live("all_to_allv")
        tc = self._team_collectives()
        if self._ch is None:
            return tc.all_to_allv(x, send_counts, recv_counts, out)
        with self._call(self._ch):
            return tc.all_to_allv(x, send_counts, recv_counts, out)

    def barrier(self, timeout: float | None = None) -> None:
        """Every rank of the communicator has arrived (flag barrier on the comm's pad)."""
        tc = self._on_team("barrier")
        if tc is not None:
            tc.barrier(timeout)
            return
        if self._ch is None:
            self.world.barrier(timeout)
            return
        self._ch.pad.barrier(timeout)


def _fits(out: Array | None, dtype: np.dtype[np.generic], count: int) -> bool:
    return out is None or (
        out.dtype == dtype and out.size == count and out.flags.c_contiguous and out.flags.writeable
    )
