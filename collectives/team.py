"""Collectives over a team's communicator (OpenSHMEM's team collectives).

A :class:`~collectives.Communicator` made on a :class:`~shmem.team.Team` other than the world
runs here: every collective is one non-blocking MPI exchange on a duplicate of the team's
communicator, waited for within the deadline (a missing member raises
``SignalTimeoutError`` instead of hanging), with the same argument agreement as the world's
collectives (``[collectives] check_args``: every rank raises ``CollectiveMismatchError``
together).

Reductions keep the world's determinism: every member gathers the inputs and reduces them in
team-rank order, ``((x_0 op x_1) op x_2) ...`` in the accumulation dtype, rounded once, so
results are bitwise identical on every member and independent of MPI's algorithm. A world
Communicator uses this module too for ``collect`` (variable sizes) and ``alltoalls``, in
step with its other collectives: each such call takes the Channel's next sequence number and
waits on its deadline and board (``board``), so a rank in ``collect`` against peers in
``all_reduce`` raises ``CollectiveMismatchError`` instead of both waiting out the deadline.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, cast

import numpy as np
from mpi4py import MPI

from shmem import SHMEMBuffer
from shmem.dtypes import dtype_name
from shmem.errors import CollectiveArgumentError, ShmemError, SignalTimeoutError
from shmem.signals import check_timeout, poll_until

from . import signed
from .operand import Array, Operand, agree, prepare
from .ops import ReduceOp, accumulate_dtype, check_op, reduce_into
from .schedule import shard_of
from .signature import BARRIER, signature

if TYPE_CHECKING:
    from shmem.team import Team

    from .channel import Channel

__all__ = ["TeamCollectives"]


_WHO = "team rank"


def _u8(a: np.ndarray[Any, Any]) -> np.ndarray[Any, np.dtype[np.uint8]]:
    return a.reshape(-1).view(np.uint8)


class TeamCollectives:
    """Collectives among a team's members (collective over the team to create)."""

    def __init__(self, team: Team, check_args: bool, timeout_s: float, acc32: np.dtype[Any]):
        self.team = team
        self.comm: MPI.Intracomm = team.comm.Dup()
        self.rank, self.size = team.my_pe, team.n_pes
        self.check_args = check_args
        self.calls = 0
        self.signature = 0  # set by agree(); compared in every exchange (collectives.signed)
        self.timeout_s = timeout_s
        self.acc32 = acc32
        self.progress = team.world.heap.progress
        self.broken = False
        self.board: Channel | None = None  # a world Communicator's channel (see above)

    def close(self) -> None:
        if not self.team.world.finalized:
            self.comm.Free()

    def fail(self, mismatch: bool = False) -> None:
        """A call failed after the exchange began (a mismatch): refuse later calls."""
        self.broken = True
        if self.board is not None:  # a world Communicator's call: its peers stop too
            self.board.fail(mismatch)

    @contextlib.contextmanager
    def in_step(self, where: str) -> Iterator[None]:
        """Run one exchange as a call of the world Communicator's channel (when there is
        one): its next sequence number, this call's signature in its flags and board, its
        node-local peers done with the previous call first, ``DONE`` after."""
        ch = self.board
        if ch is None:
            yield
            return
        from .channel import Flag

        s = ch.next_call()
        ch.signature = self.signature
        ch.wait_previous(s, where)
        yield
        ch.post(Flag.DONE, s)

    def mpi_wait(self, req: MPI.Request, where: str, keep: object = None) -> None:
        if self.board is not None:  # the channel's wait: its deadline and board
            self.board.mpi_wait(req, where, keep)
            return
        if poll_until(req.Test, time.monotonic() + self.timeout_s, self.progress):
            return
        self.broken = True
        self._keep = (req, keep)  # an MPI collective cannot be cancelled: keep its buffers
        raise SignalTimeoutError(
            f"{where}: rank {self.rank} of team {self.team.name} timed out after "
            f"{self.timeout_s:g} s (a member did not arrive)",
            operation=where,
            slot=-1,
            expected="every member",
            last_value=0,
            peers=(),
        )

    # -- the collectives -------------------------------------------------------------------

    def barrier(self, timeout: float | None = None) -> None:
        """Every member has arrived: the members' call signatures all-gathered (a member in
        another call is a mismatch every member reports), within ``timeout``."""
        where = "Communicator.barrier"
        limit = self.timeout_s if timeout is None else check_timeout(where, timeout)
        self.signature = BARRIER
        saved, self.timeout_s = self.timeout_s, limit
        try:
            signed.agree_first(self, self.comm, where, _WHO)
        finally:
            self.timeout_s = saved

    def all_reduce(
        self, x: SHMEMBuffer | Array, op: ReduceOp | str, out: SHMEMBuffer | Array | None
    ) -> SHMEMBuffer | Array:
        where = "Communicator.all_reduce"
        xin, ret, dst = self._reduce_args(where, x, op, out, lambda n: n)
        self._reduce(where, xin, str(op), dst, 0, xin.count)
        return ret

    def reduce_scatter(
        self, x: SHMEMBuffer | Array, op: ReduceOp | str, out: SHMEMBuffer | Array | None
    ) -> SHMEMBuffer | Array:
        where = "Communicator.reduce_scatter"
        me, size = self.rank, self.size

        def count(n: int) -> int:
            a, b = shard_of(n, size, me)
            return b - a

        xin, ret, dst = self._reduce_args(where, x, op, out, count)
        a, b = shard_of(xin.count, size, me)
        self._reduce(where, xin, str(op), dst, a, b)
        return ret

    def _reduce_args(
        self,
        where: str,
        x: SHMEMBuffer | Array,
        op: ReduceOp | str,
        out: SHMEMBuffer | Array | None,
        count: Any,
    ) -> tuple[Operand, SHMEMBuffer | Array, Array]:
        def validate(xin: Operand) -> None:
            check_op(op, xin.dtype, where)

        return prepare(self, where, x, out, count, (str(op),), validate)

    def _reduce(self, where: str, xin: Operand, op: str, dst: Array, a: int, b: int) -> None:
        """``dst = reduce(op, members' x[a:b])`` in team-rank order (every member gathers
        the whole inputs: the result is then identical everywhere)."""
        n = xin.count
        send = np.ascontiguousarray(xin.array)
        every = np.empty((self.size, n), dtype=xin.dtype)
        signed.allgather(self, self.comm, _u8(send), _u8(every), where, _WHO)
        acc = accumulate_dtype(xin.dtype, self.acc32)
        reduce_into(dst, [row[a:b] for row in every], op, acc, avg_count=self.size)

    def broadcast(
        self, x: SHMEMBuffer | Array, root: int, out: SHMEMBuffer | Array | None
    ) -> SHMEMBuffer | Array:
        where = "Communicator.broadcast"
        size = self.size

        def validate(xin: Operand) -> None:
            if isinstance(root, bool) or not isinstance(root, int | np.integer):
                raise CollectiveArgumentError(f"{where}: invalid root (got {root!r})")
            if not 0 <= root < size:
                raise CollectiveArgumentError(
                    f"{where}: invalid root (got {root}; expected 0 <= root < {size}, a rank of "
                    f"team {self.team.name})"
                )

        xin, ret, dst = prepare(
            self, where, x, out, lambda n: n, (repr(root),), validate, default_out_is_x=True
        )
        if self.rank == root and not np.shares_memory(dst, xin.array):
            np.copyto(dst, xin.array)
        signed.bcast(self, self.comm, _u8(dst), int(root), where, _WHO)
        return ret

    def all_gather(
        self, x: SHMEMBuffer | Array, out: SHMEMBuffer | Array | None
    ) -> SHMEMBuffer | Array:
        """``fcollect``: every member's ``x`` (the same count) concatenated in team order."""
        where = "Communicator.all_gather"
        size = self.size
        xin, ret, dst = prepare(self, where, x, out, lambda n: n * size)
        send = np.ascontiguousarray(xin.array)
        signed.allgather(self, self.comm, _u8(send), _u8(dst), where, _WHO)
        return ret

    def collect(
        self, x: SHMEMBuffer | Array, out: SHMEMBuffer | Array | None = None
    ) -> SHMEMBuffer | Array:
        """Every member's ``x`` (counts may differ) concatenated in team order
        (``shmem_collect``, MPI's allgatherv) into ``out`` (its dtype, as many elements as
        the counts add up to), or a new flat array. ``out``'s size is checked against the
        total every member learns in the first exchange: a wrong one raises on every member
        before any data moves."""
        where = "Communicator.collect"
        error: Exception | None = None
        xin: Operand | None = None
        oin: Operand | None = None
        record: tuple[object, ...] = (where, "invalid")
        try:
            xin = Operand(x, where, "x")
            if out is not None:
                oin = Operand(out, where, "out")
                state = "writeable" if oin.array.flags.writeable else "read-only"
                if oin.dtype != xin.dtype or state != "writeable":
                    raise CollectiveArgumentError(
                        f"{where}: invalid out (got a {state} {dtype_name(oin.dtype)} array; "
                        f"expected a writeable array of x's dtype {dtype_name(xin.dtype)})"
                    )
            record = (where, dtype_name(xin.dtype))
        except (ValueError, TypeError, ShmemError) as exc:
            error = exc
        agree(self, where, record, error)
        xin = cast("Operand", xin)
        self.signature = signature((where, 0, dtype_name(xin.dtype)))
        with self.in_step(where):
            # the counts (and each out's size) travel with the signatures: one exchange
            # checks the call and sizes it
            given = -1 if oin is None else oin.count
            mine = np.array([xin.count, self.signature, given], dtype=np.int64)
            every = np.zeros((self.size, 3), dtype=np.int64)
            signed.run(
                self, self.comm, lambda: self.comm.Iallgather(mine, every), where, (mine, every)
            )
            signed.compare(self, every[:, 1], where, _WHO)
            counts = every[:, 0]
            total = int(counts.sum())
            wrong = [(r, int(n)) for r, n in enumerate(every[:, 2]) if n >= 0 and n != total]
            dest = np.empty(total, dtype=xin.dtype) if oin is None else oin.array
            if not wrong:
                isz = xin.dtype.itemsize
                send = np.ascontiguousarray(xin.array)
                if np.may_share_memory(send, dest):  # in place (MPI refuses aliased buffers)
                    send = send.copy()
                nbytes = [int(c) * isz for c in counts]
                displs = np.concatenate([[0], np.cumsum(nbytes)[:-1]]).astype(int).tolist()
                recv = [dest.view(np.uint8), (nbytes, displs), MPI.BYTE]
                signed.run(
                    self,
                    self.comm,
                    lambda: self.comm.Iallgatherv([_u8(send), MPI.BYTE], recv),
                    where,
                    (send, dest),
                )
        if wrong:  # every member saw the same sizes: all raise here, still in step
            listing = "; ".join(f"{_WHO} {r}: {n} elements" for r, n in wrong)
            error = CollectiveArgumentError(
                f"{where}: out has the wrong size ({listing}; expected {total} elements, the "
                "sum of every member's count); nothing was exchanged"
            )
            error.agreed = True  # type: ignore[attr-defined]
            raise error
        return dest if out is None else out

    def all_to_all(
        self, x: SHMEMBuffer | Array, out: SHMEMBuffer | Array | None
    ) -> SHMEMBuffer | Array:
        """Chunk ``j`` of member ``i``'s ``x`` becomes chunk ``i`` of member ``j``'s output."""
        where = "Communicator.all_to_all"
        size = self.size

        def validate(xin: Operand) -> None:
            if xin.count % size:
                raise CollectiveArgumentError(
                    f"{where}: x must split into {size} equal chunks (got {xin.count} elements)"
                )

        xin, ret, dst = prepare(self, where, x, out, lambda n: n, (), validate)
        send = np.ascontiguousarray(xin.array)
        signed.alltoall(self, self.comm, _u8(send), _u8(dst), where, _WHO)
        return ret

    def all_to_allv(
        self,
        x: SHMEMBuffer | Array,
        send_counts: Sequence[int],
        recv_counts: Sequence[int],
        out: SHMEMBuffer | Array | None = None,
    ) -> SHMEMBuffer | Array:
        """All-to-all with per-pair counts (MPI's alltoallv): member ``i`` sends the
        ``send_counts[j]`` elements of ``x`` after ``sum(send_counts[:j])`` to member ``j``,
        which stores them in ``out`` after ``sum(recv_counts[:i])``. Every member learns every
        member's counts in the first exchange (with the signatures): counts that do not pair
        up (``send_counts[j]`` of ``i`` against ``recv_counts[i]`` of ``j``) raise on every
        member before any data moves."""
        where = "Communicator.all_to_allv"
        size = self.size
        sends, recvs, xin, oin = self._alltoallv_args(where, x, send_counts, recv_counts, out)
        self.signature = signature((where, 0, dtype_name(xin.dtype)))
        with self.in_step(where):
            # every member's counts travel with the signatures: one exchange checks the
            # call and that the counts pair up
            mine = np.concatenate([[self.signature], sends, recvs]).astype(np.int64)
            every = np.zeros((size, 1 + 2 * size), dtype=np.int64)
            signed.run(
                self, self.comm, lambda: self.comm.Iallgather(mine, every), where, (mine, every)
            )
            signed.compare(self, every[:, 0], where, _WHO)
            sent, received = every[:, 1 : 1 + size], every[:, 1 + size :]
            wrong = [
                (i, j, int(sent[i, j]), int(received[j, i]))
                for i in range(size)
                for j in range(size)
                if sent[i, j] != received[j, i]
            ]
            dest = np.empty(int(recvs.sum()), dtype=xin.dtype) if oin is None else oin.array
            if not wrong:
                isz = xin.dtype.itemsize
                send = np.ascontiguousarray(xin.array.reshape(-1)[: int(sends.sum())])

                def spec(counts: np.ndarray[Any, Any], buf: Array) -> list[Any]:
                    nbytes = (counts * isz).tolist()
                    displs = np.concatenate([[0], np.cumsum(nbytes)[:-1]]).astype(int).tolist()
                    return [_u8(buf), (nbytes, displs), MPI.BYTE]

                recv = spec(recvs, dest)
                signed.run(
                    self,
                    self.comm,
                    lambda: self.comm.Ialltoallv(spec(sends, send), recv),
                    where,
                    (send, dest),
                )
        if wrong:  # every member saw the same counts: all raise here, still in step
            listing = "; ".join(
                f"{_WHO} {i} sends {s} to {_WHO} {j}, which expects {r}" for i, j, s, r in wrong
            )
            error = CollectiveArgumentError(
                f"{where}: the counts do not pair up ({listing}); nothing was exchanged"
            )
            error.agreed = True  # type: ignore[attr-defined]
            raise error
        return dest if out is None else out

    def _alltoallv_args(
        self,
        where: str,
        x: SHMEMBuffer | Array,
        send_counts: Sequence[int],
        recv_counts: Sequence[int],
        out: SHMEMBuffer | Array | None,
    ) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any], Operand, Operand | None]:
        """:meth:`all_to_allv`'s counts, ``x`` and ``out``, checked, once the members agreed
        on the call (an invalid argument raises on every member)."""
        size = self.size
        error: Exception | None = None
        xin: Operand | None = None
        oin: Operand | None = None
        record: tuple[object, ...] = (where, "invalid")
        sends = recvs = np.zeros(size, np.int64)
        try:
            sends = _counts(where, "send_counts", send_counts, size)
            recvs = _counts(where, "recv_counts", recv_counts, size)
            xin = Operand(x, where, "x")
            if xin.count < int(sends.sum()):
                raise CollectiveArgumentError(
                    f"{where}: x too small (got {xin.count} elements; expected >= "
                    f"{int(sends.sum())}, the sum of send_counts)"
                )
            if out is not None:
                oin = Operand(out, where, "out")
                if (
                    oin.dtype != xin.dtype
                    or not oin.array.flags.writeable
                    or oin.count < int(recvs.sum())
                ):
                    raise CollectiveArgumentError(
                        f"{where}: invalid out (got {oin.count} {dtype_name(oin.dtype)} "
                        f"elements; expected a writeable array of x's dtype "
                        f"{dtype_name(xin.dtype)} with >= {int(recvs.sum())} elements)"
                    )
            record = (where, dtype_name(xin.dtype))
        except (ValueError, TypeError, ShmemError) as exc:
            error = exc
        agree(self, where, record, error)
        return sends, recvs, cast("Operand", xin), oin

    def alltoalls(
        self,
        x: SHMEMBuffer | Array,
        nelems: int,
        *,
        dst_stride: int = 1,
        src_stride: int = 1,
        out: SHMEMBuffer | Array | None = None,
    ) -> SHMEMBuffer | Array:
        """Strided all-to-all (``shmem_alltoalls``): member ``i`` sends elements
        ``x[(j * nelems + k) * src_stride]`` (k < nelems) to member ``j``, which stores them at
        ``out[(i * nelems + k) * dst_stride]``; other elements of ``out`` are untouched."""
        where = "Communicator.alltoalls"
        size = self.size
        for name, v in (("nelems", nelems), ("dst_stride", dst_stride), ("src_stride", src_stride)):
            if isinstance(v, bool) or not isinstance(v, int | np.integer) or v < (name != "nelems"):
                raise CollectiveArgumentError(f"{where}: invalid {name} (got {v!r})")
        need_src = (size * nelems - 1) * src_stride + 1 if nelems else 0
        need_dst = (size * nelems - 1) * dst_stride + 1 if nelems else 0

        def validate(xin: Operand) -> None:
            if xin.count < need_src:
                raise CollectiveArgumentError(
                    f"{where}: x too small (got {xin.count} elements; expected >= {need_src})"
                )
            if out is not None and _count(out) < need_dst:  # before the ranks agree
                raise CollectiveArgumentError(
                    f"{where}: out too small (got {_count(out)} elements; expected >= {need_dst})"
                )

        xin, ret, dst = prepare(
            self,
            where,
            x,
            out,
            lambda n: max(need_dst, 1) if out is None else _count(out),
            (int(nelems), int(dst_stride), int(src_stride)),
            validate,
        )
        if out is None:
            dst[...] = 0
        if dst.size < need_dst:
            raise CollectiveArgumentError(
                f"{where}: out too small (got {dst.size} elements; expected >= {need_dst})"
            )
        send = np.ascontiguousarray(xin.array[:need_src:src_stride][: size * nelems])
        recv = np.empty(size * nelems, dtype=xin.dtype)
        with self.in_step(where):
            signed.alltoall(self, self.comm, _u8(send), _u8(recv), where, _WHO)
        if nelems:
            dst[:need_dst:dst_stride] = recv
        return ret


def _count(out: SHMEMBuffer | Array) -> int:
    return out.count if isinstance(out, SHMEMBuffer) else int(np.asarray(out).size)


def _counts(
    where: str, name: str, counts: object, size: int
) -> np.ndarray[Any, np.dtype[np.int64]]:
    """``counts`` as ``size`` non-negative element counts (validated)."""
    values = list(counts) if isinstance(counts, list | tuple | np.ndarray | range) else None
    if (
        values is None
        or len(values) != size
        or any(isinstance(v, bool) or not isinstance(v, int | np.integer) or v < 0 for v in values)
    ):
        raise CollectiveArgumentError(
            f"{where}: invalid {name} (got {counts!r}; expected {size} non-negative ints, one "
            "per rank)"
        )
    return np.array(values, dtype=np.int64)
