"""The ``symheap`` process group: torch.distributed's calls as Communicator calls.

A thin adapter (no algorithm of its own): each c10d call checks its tensors, becomes the
matching :class:`~collectives.Communicator` call on numpy views of the tensors' memory, and
runs on the group's :class:`~collectives.torch_backend._progress.ProgressQueue`, in issue
order. Reductions keep the Communicator's fixed rank order (bitwise-identical results on
every rank) and every call its signature check: ranks in different calls, or with different
sizes, dtypes or ops, raise ``CollectiveMismatchError`` together instead of mixing data.
Point-to-point calls are MPI messages on the group's own communicator, posted in issue order
and completed by ``Work.wait()``.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.distributed as dist
from mpi4py import MPI

from shmem.errors import CollectiveArgumentError, SignalTimeoutError
from shmem.signals import poll_until

from ._progress import ProgressQueue
from ._tensors import Staged, as_array, check_tensors, factor_of, op_name

if TYPE_CHECKING:
    from collectives.communicator import Communicator
    from shmem.team import Team

__all__ = ["BACKGROUND_NBYTES", "ProcessGroupSymheap"]

BACKGROUND_NBYTES = 1 << 20
"""Calls moving at least this many bytes run on the group's worker thread, overlapped with
the caller's work (DDP's gradient buckets); smaller ones run on the caller's thread when the
queue is idle (a thread hop costs more than they do)."""


def _nbytes(tensors: Sequence[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


class _AnySource:
    """A receive from any rank as a request-like object: ``Test`` probes (``Improbe``)
    until a message matches, then receives that very message (``Mrecv``)."""

    def __init__(self, comm: MPI.Intracomm, tag: int, buf: list[Any]) -> None:
        self._comm, self._tag, self._buf = comm, tag, buf
        self._req: MPI.Request | None = None

    def Test(self, status: MPI.Status | None = None) -> bool:  # MPI.Request.Test
        if self._req is None:
            msg = self._comm.Improbe(MPI.ANY_SOURCE, self._tag)
            if msg is None:
                return False
            self._req = msg.Irecv(self._buf)
        return bool(self._req.Test(status))


class _P2PWork(dist.Work):
    """A send or receive: posted in issue order by the queue, completed by ``wait()`` (or,
    once ``get_future()`` was asked for, by a thread that waits for it)."""

    def __init__(self, group: ProcessGroupSymheap, posted: Any, staged: Staged, where: str) -> None:
        super().__init__()
        self._group, self._posted, self._staged, self._where = group, posted, staged, where
        self._status = MPI.Status()
        self._lock = threading.Lock()  # one thread tests the request at a time
        self._done = False
        self._future: torch.futures.Future[Any] | None = None

    def _request(self) -> Any:
        self._posted.wait()  # raises what posting raised
        return self._posted.get_future().value()  # an MPI.Request or an _AnySource

    def _test(self, req: Any) -> bool:
        with self._lock:
            if not self._done and req.Test(self._status):
                self._staged.writeback()
                self._done = True
            return self._done

    def is_completed(self) -> bool:
        return self._done or (self._posted.is_completed() and self._test(self._request()))

    def wait(self, timeout: Any = None) -> bool:
        if self._done:
            return True
        req = self._request()
        # c10d passes timedelta(0) for "no timeout of the call's own": the group's deadline
        seconds = 0.0 if timeout is None else timeout.total_seconds()
        limit = seconds if seconds > 0 else self._group.timeout_s
        progress = self._group.comm.world.heap.progress
        if not poll_until(lambda: self._test(req), time.monotonic() + limit, progress):
            raise SignalTimeoutError(
                f"{self._where}: rank {self._group.rank()} timed out after {limit:g} s (the "
                "peer did not post the matching call)",
                operation=self._where,
                slot=-1,
                expected="the matching message",
                last_value=0,
                peers=(),
            )
        return True

    def _source_rank(self) -> int:
        self.wait()
        return int(self._status.Get_source())

    source_rank = _source_rank

    def get_future(self) -> torch.futures.Future[Any]:
        with self._lock:
            if self._future is not None:
                return self._future
            fut: torch.futures.Future[Any] = torch.futures.Future()
            self._future = fut

        def complete() -> None:
            try:
                self.wait()
            except BaseException as exc:
                fut.set_exception(exc)
                return
            fut.set_result([self._staged.tensor])

        threading.Thread(target=complete, name=f"{self._where}-future", daemon=True).start()
        return fut


class ProcessGroupSymheap(dist.ProcessGroup):
    """torch.distributed's process group over a :class:`~collectives.Communicator`.

    Made by ``dist.init_process_group("symheap")`` and ``dist.new_group(..., backend=
    "symheap")`` (:func:`collectives.torch_backend.register`); users never construct it.

    Parameters
    ----------
    comm : Communicator
        The communicator the group's collectives run on (over the World or a subgroup's team).
    timeout_s : float
        Seconds a point-to-point ``Work.wait()`` waits for its peer (``[signal] timeout_s``).
    name : str
        The group's name (c10d's group id); also its description until ``setGroupDesc``.
    team : Team, optional
        A subgroup's own team, destroyed by :meth:`shutdown` (None for the World's group).
    """

    def __init__(
        self, comm: Communicator, timeout_s: float, name: str, team: Team | None = None
    ) -> None:
        super().__init__(comm.rank, comm.world_size)  # type: ignore[call-arg]
        self.comm = comm
        self.timeout_s = timeout_s
        self._name = name
        self._desc = name
        self._queue = ProgressQueue(f"symheap:{name}")
        self._p2p = comm.team.comm.Dup()  # point-to-point messages of this group only
        # the nvshmem backend takes CUDA tensors (stream-ordered on torch's current stream),
        # the host backend CPU tensors
        self.device = "cuda" if comm.world.backend == "nvshmem" else "cpu"
        self._call_stream: Any = None  # the running call's stream (see _submit)
        self._team = team  # a subgroup's own team, destroyed with the group

    # -- identity (torch's functional collectives need the name) -------------------------------

    def getBackendName(self) -> str:
        """The backend's name, as ``init_process_group`` takes it.

        Returns
        -------
        str
            ``"symheap"``.
        """
        return "symheap"

    def setGroupName(self, name: str) -> None:
        """Rename the group (c10d does it when it registers the group).

        Parameters
        ----------
        name : str
            The group's new name.
        """
        self._name = name

    def getGroupName(self) -> str:
        """The group's name (torch's functional collectives look groups up by it).

        Returns
        -------
        str
            The name given at construction or by :meth:`setGroupName`.
        """
        return self._name

    def setGroupDesc(self, desc: str) -> None:
        """Set the group's description (``new_group(group_desc=...)``).

        Parameters
        ----------
        desc : str
            The description.
        """
        self._desc = desc

    def getGroupDesc(self) -> str:
        """The group's description.

        Returns
        -------
        str
            The description, or the group's name when none was set.
        """
        return self._desc

    # -- helpers -------------------------------------------------------------------------------

    def _submit(
        self, where: str, tensors: Sequence[torch.Tensor], run: Callable[[], Any], result: Any
    ) -> Any:
        check_tensors(where, tensors, self.device)
        stream = self._stream()  # at issue time: torch's current stream is per thread

        def call() -> Any:
            self._call_stream = stream  # a group's calls never run at once
            run()
            return result

        return self._queue.submit(call, background=_nbytes(tensors) >= BACKGROUND_NBYTES)

    def run_in_order(self, call: Callable[[], Any]) -> Any:
        """Run ``call`` (which uses ``comm``) as one of this group's calls, in issue order
        after the pending ones, and return its result: what a caller outside the c10d calls
        (sequence-parallel attention) uses the communicator through.

        Parameters
        ----------
        call : callable
            Called with no arguments, after the group's pending calls; it may use ``comm``.

        Returns
        -------
        object
            What ``call`` returned (what it raised is raised here).
        """
        work = self._queue.submit(call)
        work.wait()
        return work.get_future().value()

    def _stream(self) -> Any:
        """The stream GPU collectives are ordered on: torch's current one (None on the host)."""
        return torch.cuda.current_stream() if self.device == "cuda" else None

    def _host_only(self, where: str) -> None:
        if self.device != "cpu":
            raise CollectiveArgumentError(
                f"{where}: not available for CUDA tensors (its exchange is an MPI call on host "
                "memory; all_reduce, broadcast, all_gather, reduce_scatter and even "
                "all_to_all run on the GPU)"
            )

    def _root(self, where: str, root: int) -> int:
        if not 0 <= root < self.size():
            raise CollectiveArgumentError(
                f"{where}: invalid root (got {root}; expected 0 <= root < {self.size()})"
            )
        return root

    # -- reductions ----------------------------------------------------------------------------

    def _all_reduce_into(self, t: torch.Tensor, op: Any, where: str) -> None:
        name, factor = op_name(where, op), factor_of(op)
        st = Staged(t)
        src = st.array if factor is None else _premultiplied(t, factor).reshape(t.shape)
        self.comm.all_reduce(src, name, out=st.array, stream=self._call_stream)
        st.writeback()

    def allreduce(self, tensors: list[torch.Tensor], opts: Any) -> Any:
        """``all_reduce``: every tensor becomes the reduction of it over the ranks, in rank order.

        Parameters
        ----------
        tensors : list of torch.Tensor
            The tensors, reduced in place.
        opts : torch.distributed.AllreduceOptions
            c10d's options; ``reduceOp`` is the operation.

        Returns
        -------
        torch.distributed.Work
            Done when the call has run (in issue order); its future holds ``tensors``.

        Raises
        ------
        CollectiveArgumentError
            When a tensor is not dense, not on the group's device or of an unsupported dtype.
        OpError
            An unsupported reduce op (raised here, or by ``Work.wait()`` for a queued call).
        """
        where = "symheap.all_reduce"
        op = opts.reduceOp

        def run() -> None:
            for t in tensors:
                self._all_reduce_into(t, op, where)

        return self._submit(where, tensors, run, tensors)

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any) -> Any:
        """``all_reduce`` of several tensors, one call per dtype on their concatenation.

        Parameters
        ----------
        tensors : list of torch.Tensor
            The tensors, reduced in place.
        opts : torch.distributed.AllreduceCoalescedOptions
            c10d's options; ``reduceOp`` is the operation.

        Returns
        -------
        torch.distributed.Work
            Done when the call has run (in issue order); its future holds ``tensors``.

        Raises
        ------
        CollectiveArgumentError
            When a tensor is not dense, not on the group's device or of an unsupported dtype.
        OpError
            An unsupported reduce op (raised here, or by ``Work.wait()`` for a queued call).
        """
        where = "symheap.all_reduce_coalesced"
        op = opts.reduceOp

        def run() -> None:
            by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
            for t in tensors:
                by_dtype.setdefault(t.dtype, []).append(t)
            for group in by_dtype.values():  # one call per dtype, in first-seen order
                flat = torch.cat([t.detach().reshape(-1) for t in group])
                self._all_reduce_into(flat, op, where)
                offset = 0
                with torch.no_grad():
                    for t in group:
                        t.copy_(flat[offset : offset + t.numel()].view_as(t))
                        offset += t.numel()

        return self._submit(where, tensors, run, tensors)

    def reduce(self, tensors: list[torch.Tensor], opts: Any) -> Any:
        """``reduce``: the reduction over the ranks lands in ``opts.rootRank``'s tensors only.

        Parameters
        ----------
        tensors : list of torch.Tensor
            The inputs; on the root, also the outputs.
        opts : torch.distributed.ReduceOptions
            c10d's options; ``reduceOp`` and ``rootRank``.

        Returns
        -------
        torch.distributed.Work
            Done when the call has run (in issue order); its future holds ``tensors``.

        Raises
        ------
        CollectiveArgumentError
            When ``opts.rootRank`` is not a rank of the group.
        CollectiveArgumentError
            When a tensor is not dense, not on the group's device or of an unsupported dtype.
        OpError
            An unsupported reduce op (raised here, or by ``Work.wait()`` for a queued call).
        """
        where = "symheap.reduce"
        root = self._root(where, opts.rootRank)
        op = opts.reduceOp

        def run() -> None:
            for t in tensors:
                scratch = t.detach().clone()
                self._all_reduce_into(scratch, op, where)
                if self.rank() == root:
                    with torch.no_grad():
                        t.copy_(scratch)

        return self._submit(where, tensors, run, tensors)

    # -- broadcast, gathers, scatters ----------------------------------------------------------

    def broadcast(self, tensors: list[torch.Tensor], opts: Any) -> Any:
        """``broadcast``: every rank's tensors become ``opts.rootRank``'s.

        Parameters
        ----------
        tensors : list of torch.Tensor
            The root's data; overwritten on the other ranks.
        opts : torch.distributed.BroadcastOptions
            c10d's options; ``rootRank`` is the source.

        Returns
        -------
        torch.distributed.Work
            Done when the call has run (in issue order); its future holds ``tensors``.

        Raises
        ------
        CollectiveArgumentError
            When ``opts.rootRank`` is not a rank of the group.
        CollectiveArgumentError
            When a tensor is not dense, not on the group's device or of an unsupported dtype.
        """
        where = "symheap.broadcast"
        root = self._root(where, opts.rootRank)

        def run() -> None:
            for t in tensors:
                st = Staged(t, read=self.rank() == root)
                self.comm.broadcast(st.array, root, out=st.array, stream=self._call_stream)
                st.writeback()

        return self._submit(where, tensors, run, tensors)

    def _gather_into(self, out: torch.Tensor, t: torch.Tensor) -> None:
        st = Staged(out, read=False)
        x = Staged(_apart(t, out)).array  # in place (t a chunk of out, as FSDP does): a copy
        self.comm.all_gather(x, out=st.array.reshape(-1), stream=self._call_stream)
        st.writeback()

    def all_gather_single(self, out: torch.Tensor, t: torch.Tensor, opts: Any) -> Any:
        """``all_gather_into_tensor``: ``out`` is every rank's ``t``, concatenated in rank order.

        Parameters
        ----------
        out : torch.Tensor
            The output, of ``world_size`` times ``t``'s elements.
        t : torch.Tensor
            This rank's input (it may be a chunk of ``out``).
        opts : torch.distributed.AllgatherOptions
            c10d's options.

        Returns
        -------
        torch.distributed.Work
            Done when the call has run (in issue order); its future holds ``[out]``.

        Raises
        ------
        CollectiveArgumentError
            When an output's dtype or size does not fit its input on this many ranks.
        CollectiveArgumentError
            When a tensor is not dense, not on the group's device or of an unsupported dtype.
        """
        where = "symheap.all_gather_into_tensor"
        self._same_dtype(where, out, t, out.numel() == t.numel() * self.size())
        return self._submit(where, [out, t], lambda: self._gather_into(out, t), [out])

    _allgather_base = all_gather_single  # type: ignore[assignment]

    def allgather(self, outs: list[list[torch.Tensor]], ins: list[torch.Tensor], opts: Any) -> Any:
        """``all_gather``: ``outs[i][r]`` becomes rank ``r``'s ``ins[i]``.

        Parameters
        ----------
        outs : list of list of torch.Tensor
            For each input, ``world_size`` outputs of its size and dtype.
        ins : list of torch.Tensor
            This rank's inputs.
        opts : torch.distributed.AllgatherOptions
            c10d's options.

        Returns
        -------
        torch.distributed.Work
            Done when the call has run (in issue order); its future holds ``outs``.

        Raises
        ------
        CollectiveArgumentError
            When a tensor is not dense, not on the group's device or of an unsupported dtype.
        CollectiveArgumentError
            When an output list is not ``world_size`` tensors of its input's size and dtype
            (raised here, or by ``Work.wait()`` for a queued call).
        """
        where = "symheap.all_gather"
        flat = [o for lst in outs for o in lst]

        def run() -> None:
            for lst, t in zip(outs, ins, strict=True):
                self._list_ok(where, lst, t)
                buf = torch.empty((self.size(), *t.shape), dtype=t.dtype, device=t.device)
                self._gather_into(buf, t)
                with torch.no_grad():
                    for r, o in enumerate(lst):
                        o.copy_(buf[r].reshape(o.shape))

        return self._submit(where, [*flat, *ins], run, outs)

    def allgather_into_tensor_coalesced(
        self, outs: list[torch.Tensor], ins: list[torch.Tensor], opts: Any
    ) -> Any:
        """``all_gather_into_tensor`` of several pairs: ``outs[i]`` gathers every rank's ``ins[i]``.

        Parameters
        ----------
        outs : list of torch.Tensor
            The outputs, each ``world_size`` times its input's elements.
        ins : list of torch.Tensor
            This rank's inputs.
        opts : torch.distributed.AllgatherOptions
            c10d's options.

        Returns
        -------
        torch.distributed.Work
            Done when the call has run (in issue order); its future holds ``outs``.

        Raises
        ------
        CollectiveArgumentError
            When a tensor is not dense, not on the group's device or of an unsupported dtype.
        CollectiveArgumentError
            When an output's dtype or size does not fit its input (raised here, or by
            ``Work.wait()`` for a queued call).
        """
        where = "symheap.all_gather_into_tensor_coalesced"

        def run() -> None:
            for out, t in zip(outs, ins, strict=True):
                self._same_dtype(where, out, t, out.numel() == t.numel() * self.size())
                self._gather_into(out, t)

        return self._submit(where, [*outs, *ins], run, outs)

    def _scatter_reduce(self, out: torch.Tensor, t: torch.Tensor, op: Any, where: str) -> None:
        name, factor = op_name(where, op), factor_of(op)
        t = _apart(t, out)
        x = Staged(t).array.reshape(-1) if factor is None else _premultiplied(t, factor)
        st = Staged(out, read=False)
        self.comm.reduce_scatter(x, name, out=st.array.reshape(-1), stream=self._call_stream)
        st.writeback()

    def reduce_scatter_single(self, out: torch.Tensor, t: torch.Tensor, opts: Any) -> Any:
        """``reduce_scatter_tensor``: ``out`` is rank ``r``'s chunk of the reduction of every ``t``.

        Parameters
        ----------
        out : torch.Tensor
            The output: this rank's chunk, ``1 / world_size`` of ``t``'s elements.
        t : torch.Tensor
            This rank's input (it may share memory with ``out``).
        opts : torch.distributed.ReduceScatterOptions
            c10d's options; ``reduceOp`` is the operation.

        Returns
        -------
        torch.distributed.Work
            Done when the call has run (in issue order); its future holds ``[out]``.

        Raises
        ------
        CollectiveArgumentError
            When an output's dtype or size does not fit its input on this many ranks.
        CollectiveArgumentError
            When a tensor is not dense, not on the group's device or of an unsupported dtype.
        OpError
            An unsupported reduce op (raised here, or by ``Work.wait()`` for a queued call).
        """
        where = "symheap.reduce_scatter_tensor"
        self._same_dtype(where, out, t, t.numel() == out.numel() * self.size())
        op = opts.reduceOp
        return self._submit(where, [out, t], lambda: self._scatter_reduce(out, t, op, where), [out])

    _reduce_scatter_base = reduce_scatter_single  # type: ignore[assignment]

    def reduce_scatter(
        self, outs: list[torch.Tensor], ins: list[list[torch.Tensor]], opts: Any
    ) -> Any:
        """``reduce_scatter``: ``outs[i]`` is the reduction of every rank's ``ins[i][rank]``.

        Parameters
        ----------
        outs : list of torch.Tensor
            This rank's outputs.
        ins : list of list of torch.Tensor
            For each output, ``world_size`` inputs of its size and dtype (one per rank).
        opts : torch.distributed.ReduceScatterOptions
            c10d's options; ``reduceOp`` is the operation.

        Returns
        -------
        torch.distributed.Work
            Done when the call has run (in issue order); its future holds ``outs``.

        Raises
        ------
        CollectiveArgumentError
            When a tensor is not dense, not on the group's device or of an unsupported dtype.
        OpError
            An unsupported reduce op (raised here, or by ``Work.wait()`` for a queued call).
        CollectiveArgumentError
            When an input list is not ``world_size`` tensors of its output's size and dtype
            (raised here, or by ``Work.wait()`` for a queued call).
        """
        where = "symheap.reduce_scatter"
        op = opts.reduceOp
        flat = [i for lst in ins for i in lst]

        def run() -> None:
            for out, lst in zip(outs, ins, strict=True):
                self._list_ok(where, lst, out)
                cat = torch.cat([i.detach().reshape(-1) for i in lst])
                self._scatter_reduce(out, cat, op, where)

        return self._submit(where, [*outs, *flat], run, outs)

    def reduce_scatter_tensor_coalesced(
        self, outs: list[torch.Tensor], ins: list[torch.Tensor], opts: Any
    ) -> Any:
        """``reduce_scatter_tensor`` of several pairs: ``outs[i]`` gets its chunk of ``ins[i]``.

        Parameters
        ----------
        outs : list of torch.Tensor
            This rank's outputs, each ``1 / world_size`` of its input's elements.
        ins : list of torch.Tensor
            This rank's inputs.
        opts : torch.distributed.ReduceScatterOptions
            c10d's options; ``reduceOp`` is the operation.

        Returns
        -------
        torch.distributed.Work
            Done when the call has run (in issue order); its future holds ``outs``.

        Raises
        ------
        CollectiveArgumentError
            When a tensor is not dense, not on the group's device or of an unsupported dtype.
        OpError
            An unsupported reduce op (raised here, or by ``Work.wait()`` for a queued call).
        CollectiveArgumentError
            When an output's dtype or size does not fit its input (raised here, or by
            ``Work.wait()`` for a queued call).
        """
        where = "symheap.reduce_scatter_tensor_coalesced"
        op = opts.reduceOp

        def run() -> None:
            for out, t in zip(outs, ins, strict=True):
                self._same_dtype(where, out, t, t.numel() == out.numel() * self.size())
                self._scatter_reduce(out, t, op, where)

        return self._submit(where, [*outs, *ins], run, outs)

    def gather(self, outs: list[list[torch.Tensor]], ins: list[torch.Tensor], opts: Any) -> Any:
        """``gather`` (host tensors only): the root's ``outs[0][r]`` gets rank ``r``'s ``ins[0]``.

        Parameters
        ----------
        outs : list of list of torch.Tensor
            On the root, ``[world_size tensors]`` of the input's size; elsewhere unused.
        ins : list of torch.Tensor
            ``[this rank's input]``.
        opts : torch.distributed.GatherOptions
            c10d's options; ``rootRank`` is the destination.

        Returns
        -------
        torch.distributed.Work
            Done when the call has run (in issue order); its future holds ``outs``.

        Raises
        ------
        CollectiveArgumentError
            On a CUDA group (this call's exchange is an MPI call on host memory).
        CollectiveArgumentError
            When ``opts.rootRank`` is not a rank of the group.
        CollectiveArgumentError
            When a tensor is not dense, not on the group's device or of an unsupported dtype.
        CollectiveArgumentError
            On the root, when ``outs[0]`` is not ``world_size`` tensors of the input's size
            and dtype.
        """
        where = "symheap.gather"
        self._host_only(where)
        root = self._root(where, opts.rootRank)
        me, size = self.rank(), self.size()
        flat = [o for lst in outs for o in lst]
        if me == root:  # here, before the call: the other ranks meet it at their deadline
            self._list_ok(where, outs[0], ins[0])

        def run() -> None:
            t = ins[0]
            n = t.numel()
            sends = [n if r == root else 0 for r in range(size)]
            recvs = [n if me == root else 0] * size
            buf = torch.empty((size if me == root else 0, *t.shape), dtype=t.dtype)
            self.comm.all_to_allv(Staged(t).array.reshape(-1), sends, recvs, out=_flat(buf))
            if me == root:
                with torch.no_grad():
                    for r, o in enumerate(outs[0]):
                        o.copy_(buf[r].reshape(o.shape))

        return self._submit(where, [*flat, *ins], run, outs)

    def scatter(self, outs: list[torch.Tensor], ins: list[list[torch.Tensor]], opts: Any) -> Any:
        """``scatter`` (host tensors only): rank ``r``'s ``outs[0]`` gets the root's ``ins[0][r]``.

        Parameters
        ----------
        outs : list of torch.Tensor
            ``[this rank's output]``.
        ins : list of list of torch.Tensor
            On the root, ``[world_size tensors]`` of the output's size; elsewhere unused.
        opts : torch.distributed.ScatterOptions
            c10d's options; ``rootRank`` is the source.

        Returns
        -------
        torch.distributed.Work
            Done when the call has run (in issue order); its future holds ``outs``.

        Raises
        ------
        CollectiveArgumentError
            On a CUDA group (this call's exchange is an MPI call on host memory).
        CollectiveArgumentError
            When ``opts.rootRank`` is not a rank of the group.
        CollectiveArgumentError
            When a tensor is not dense, not on the group's device or of an unsupported dtype.
        CollectiveArgumentError
            On the root, when ``ins[0]`` is not ``world_size`` tensors of the output's size
            and dtype.
        """
        where = "symheap.scatter"
        self._host_only(where)
        root = self._root(where, opts.rootRank)
        me, size = self.rank(), self.size()
        flat = [i for lst in ins for i in lst]
        if me == root:
            self._list_ok(where, ins[0], outs[0])

        def run() -> None:
            out = outs[0]
            n = out.numel()
            if me == root:
                cat = torch.cat([i.detach().reshape(-1) for i in ins[0]])
            else:
                cat = torch.empty(0, dtype=out.dtype)
            sends = [n if me == root else 0] * size
            recvs = [n if r == root else 0 for r in range(size)]
            st = Staged(out, read=False)
            self.comm.all_to_allv(as_array(cat), sends, recvs, out=st.array.reshape(-1))
            st.writeback()

        return self._submit(where, [*outs, *flat], run, outs)

    # -- all-to-all ----------------------------------------------------------------------------

    def alltoall_base(
        self,
        out: torch.Tensor,
        t: torch.Tensor,
        out_splits: list[int],
        in_splits: list[int],
        opts: Any,
    ) -> Any:
        """``all_to_all_single``: block ``i`` of rank ``r``'s ``t`` lands in block ``r`` of rank
        ``i``'s ``out``.

        Parameters
        ----------
        out : torch.Tensor
            The output; its rows are split among the ranks.
        t : torch.Tensor
            This rank's input (it may share memory with ``out``).
        out_splits : list of int
            Rows of ``out`` received from each rank; empty: equal blocks.
        in_splits : list of int
            Rows of ``t`` sent to each rank; empty: equal blocks.
        opts : torch.distributed.AllToAllOptions
            c10d's options.

        Returns
        -------
        torch.distributed.Work
            Done when the call has run (in issue order); its future holds ``[out]``.

        Raises
        ------
        CollectiveArgumentError
            When dtypes differ, a tensor is 0-d, rows do not split evenly without split
            sizes, split sizes are not ``world_size`` counts adding up to the rows, or split
            sizes are given on a CUDA group.
        CollectiveArgumentError
            When a tensor is not dense, not on the group's device or of an unsupported dtype.
        """
        where = "symheap.all_to_all_single"
        size = self.size()

        def counts(tensor: torch.Tensor, splits: list[int], name: str) -> list[int]:
            if tensor.dim() == 0:
                raise CollectiveArgumentError(
                    f"{where}: {name} is a 0-d tensor (expected rows to split among {size} ranks)"
                )
            rows, row = tensor.shape[0], math.prod(tensor.shape[1:])
            if not splits:
                if rows % size:
                    raise CollectiveArgumentError(
                        f"{where}: {name} has {rows} rows (expected a multiple of {size}, or "
                        "split sizes)"
                    )
                return [rows // size * row] * size
            if len(splits) != size or sum(splits) != rows:
                raise CollectiveArgumentError(
                    f"{where}: invalid {name} split sizes (got {list(splits)}; expected {size} "
                    f"sizes adding up to {rows} rows)"
                )
            return [s * row for s in splits]

        self._same_dtype(where, out, t, True)
        sends, recvs = counts(t, in_splits, "input"), counts(out, out_splits, "output")

        def run() -> None:
            st = Staged(out, read=False)
            x = Staged(_apart(t, out)).array.reshape(-1)
            if not in_splits and not out_splits:
                self.comm.all_to_all(x, out=st.array.reshape(-1), stream=self._call_stream)
            else:
                self._host_only(where + " with split sizes")
                self.comm.all_to_allv(x, sends, recvs, out=st.array.reshape(-1))
            st.writeback()

        return self._submit(where, [out, t], run, [out])

    def alltoall(self, outs: list[torch.Tensor], ins: list[torch.Tensor], opts: Any) -> Any:
        """``all_to_all`` of tensor lists (host only): ``outs[r]`` gets rank ``r``'s ``ins[rank]``.

        Parameters
        ----------
        outs : list of torch.Tensor
            ``world_size`` outputs, one per source rank.
        ins : list of torch.Tensor
            ``world_size`` inputs, one per destination rank.
        opts : torch.distributed.AllToAllOptions
            c10d's options.

        Returns
        -------
        torch.distributed.Work
            Done when the call has run (in issue order); its future holds ``outs``.

        Raises
        ------
        CollectiveArgumentError
            On a CUDA group (this call's exchange is an MPI call on host memory).
        CollectiveArgumentError
            When ``outs`` or ``ins`` is not ``world_size`` tensors, or their dtypes differ.
        CollectiveArgumentError
            When a tensor is not dense, not on the group's device or of an unsupported dtype.
        """
        where = "symheap.all_to_all"
        self._host_only(where + " of tensor lists")
        if len(outs) != self.size() or len(ins) != self.size():
            raise CollectiveArgumentError(
                f"{where}: expected {self.size()} input and output tensors (got {len(ins)} and "
                f"{len(outs)})"
            )

        for o in [*outs, *ins]:
            self._same_dtype(where, o, ins[0], True)

        def run() -> None:
            cat = torch.cat([i.detach().reshape(-1) for i in ins])
            res = torch.empty(sum(o.numel() for o in outs), dtype=ins[0].dtype)
            sends = [i.numel() for i in ins]
            recvs = [o.numel() for o in outs]
            self.comm.all_to_allv(as_array(cat), sends, recvs, out=as_array(res))
            offset = 0
            with torch.no_grad():
                for o in outs:
                    o.copy_(res[offset : offset + o.numel()].view_as(o))
                    offset += o.numel()

        return self._submit(where, [*outs, *ins], run, outs)

    # -- synchronisation -----------------------------------------------------------------------

    def barrier(self, opts: Any) -> Any:
        """``barrier``: done once every rank of the group has reached it.

        Parameters
        ----------
        opts : torch.distributed.BarrierOptions
            c10d's options (unused).

        Returns
        -------
        torch.distributed.Work
            Done when the call has run (in issue order); its future holds an empty list.
        """
        return self._submit("symheap.barrier", [], self.comm.barrier, [])

    # -- point to point ------------------------------------------------------------------------

    def _p2p_work(self, where: str, t: torch.Tensor, post: Callable[[Staged], Any]) -> Any:
        self._host_only(where)
        check_tensors(where, [t])
        staged = Staged(t, read=where.endswith("send"))
        posted = self._queue.submit(lambda: post(staged))
        return _P2PWork(self, posted, staged, where)

    def _peer(self, where: str, peer: int) -> int:
        if not 0 <= peer < self.size():
            raise CollectiveArgumentError(
                f"{where}: invalid peer rank (got {peer}; expected 0 <= rank < {self.size()})"
            )
        return peer

    def send(self, tensors: list[torch.Tensor], dst: int, tag: int) -> Any:
        """``send`` (host tensors only): an MPI message of ``tensors[0]`` to rank ``dst``.

        Parameters
        ----------
        tensors : list of torch.Tensor
            ``[the tensor to send]``.
        dst : int
            The receiving rank in this group.
        tag : int
            The message tag, matched by the receive.

        Returns
        -------
        torch.distributed.Work
            Posted in issue order; ``wait()`` completes it (raising
            ``SignalTimeoutError`` after ``timeout_s`` without the matching receive).

        Raises
        ------
        CollectiveArgumentError
            When ``dst`` is not a rank of the group, on a CUDA group, or when the tensor is
            not dense or of an unsupported dtype.
        """
        dst = self._peer("symheap.send", dst)
        return self._p2p_work(
            "symheap.send",
            tensors[0],
            lambda s: self._p2p.Isend([_bytes(s.array), MPI.BYTE], dst, tag),
        )

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int) -> Any:
        """``recv`` (host tensors only): ``tensors[0]`` receives rank ``src``'s message.

        Parameters
        ----------
        tensors : list of torch.Tensor
            ``[the tensor to receive into]``.
        src : int
            The sending rank in this group.
        tag : int
            The message tag to match.

        Returns
        -------
        torch.distributed.Work
            Posted in issue order; ``wait()`` completes it (raising
            ``SignalTimeoutError`` after ``timeout_s`` without the matching send).

        Raises
        ------
        CollectiveArgumentError
            When ``src`` is not a rank of the group, on a CUDA group, or when the tensor is
            not dense or of an unsupported dtype.
        """
        src = self._peer("symheap.recv", src)
        return self._p2p_work(
            "symheap.recv",
            tensors[0],
            lambda s: self._p2p.Irecv([_bytes(s.array), MPI.BYTE], src, tag),
        )

    def recv_anysource(self, tensors: list[torch.Tensor], tag: int) -> Any:
        """``recv`` from any rank (host tensors only): the first matching message arrives.

        Parameters
        ----------
        tensors : list of torch.Tensor
            ``[the tensor to receive into]``.
        tag : int
            The message tag to match.

        Returns
        -------
        torch.distributed.Work
            Posted in issue order; ``wait()`` completes it, then ``source_rank()`` is the
            sender (``SignalTimeoutError`` after ``timeout_s`` without a message).

        Raises
        ------
        CollectiveArgumentError
            On a CUDA group, or when the tensor is not dense or of an unsupported dtype.
        """
        # a matched probe, then a receive of that message: an Irecv from MPI.ANY_SOURCE
        # stayed unmatched for good about once in 300 on MPICH 5.0.2 over its network path
        # (MPIR_CVAR_NOLOCAL=1; /tmp stress: 5 of 1500 against 0 of 1500 this way)
        return self._p2p_work(
            "symheap.recv",
            tensors[0],
            lambda s: _AnySource(self._p2p, tag, [_bytes(s.array), MPI.BYTE]),
        )

    # -- helpers and life cycle ----------------------------------------------------------------

    def _same_dtype(self, where: str, out: torch.Tensor, t: torch.Tensor, sized: bool) -> None:
        if out.dtype != t.dtype or not sized:
            raise CollectiveArgumentError(
                f"{where}: output {tuple(out.shape)} {out.dtype} does not fit input "
                f"{tuple(t.shape)} {t.dtype} on {self.size()} ranks (expected the same dtype "
                "and the size the collective produces)"
            )

    def _list_ok(self, where: str, lst: Sequence[torch.Tensor], t: torch.Tensor) -> None:
        if len(lst) != self.size() or any(
            o.dtype != t.dtype or o.numel() != t.numel() for o in lst
        ):
            raise CollectiveArgumentError(
                f"{where}: expected {self.size()} tensors of {t.numel()} {t.dtype} elements "
                f"(got {[(o.numel(), o.dtype) for o in lst]})"
            )

    def shutdown(self) -> None:
        """Finish the pending calls and release the group's communicators."""
        self._queue.close()
        if not self.comm.world.finalized:
            self._p2p.Free()
            self.comm.close()
            if self._team is not None:
                self._team.destroy()


def _premultiplied(t: torch.Tensor, factor: float | torch.Tensor) -> Any:
    """PREMUL_SUM's input: a flat copy of ``t`` times the factor (torch's arithmetic)."""
    return as_array(t.detach().reshape(-1).clone().mul_(factor))


def _apart(t: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """``t``, or a copy of it when it shares memory with ``out`` (MPI and the symmetric-heap
    algorithms read inputs while they write outputs)."""
    if t.untyped_storage().data_ptr() == out.untyped_storage().data_ptr():
        return t.detach().clone()
    return t


def _flat(t: torch.Tensor) -> Any:
    return as_array(t).reshape(-1)


def _bytes(a: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    return a.reshape(-1).view(np.uint8)
