"""Signed MPI exchanges: the family's calls through MPI compare call signatures too.

Where a collective runs as one MPI exchange (across nodes, beyond the scratch, on a team),
every member's call signature (:mod:`collectives.signature`) travels with the data, and
every member compares all of them before it uses any data: differing calls (collective,
count, dtype, op, root) raise :class:`CollectiveMismatchError` on every member, naming each
one's call, instead of MPI's undefined behaviour (a longer block is truncated, a shorter one
leaves stale bytes unseen).

Every such call begins with an all-gather of the members' 8-byte signatures on the
communicator, whatever the collective: ranks in different collectives still meet in that
first exchange (MPI itself would hang or mix data when one rank's ``Ialltoall`` met
another's ``Iallgather``), and a block whose size depends on the call moves only once every
member is in the same call (MPI does not report an all-gather of differing sizes reliably:
see ``P2P_TRUNCATION_REPORTED``). Then:

* a small call moves every member's whole block with the signature behind it again (a copy in
  and out): an all-gather of up to :data:`SMALL_BLOCK` bytes per member; an all-to-all or
  broadcast whose every member's whole input fits :data:`SMALL_BLOCK` in all (each member
  sends its whole input, and keeps what is its);
* a larger call moves the data zero-copy.

Between nodes the family and the large all-reduce exchange point to point instead
(:func:`signed_p2p`): every member's signature goes to every other with the data, on a tag of
its own, and is compared before any received byte is used.

The cached plans of small calls across nodes exchange in one round instead
(:class:`PeerGather`, up to :data:`P2P_MAX_MEMBERS` members): persistent point-to-point
messages, each carrying its member's signature ahead of its block, received into slots of
the message's size class on that class's tag, so no message is ever truncated and a member
of the same class shows its signature with its data; a member in a call of another size, or
one that exchanges otherwise, never matches and is found on the board
(``Channel.check_board``), as the family's point-to-point calls are.

A member that failed before an exchange takes part with the signature :data:`ABANDONED`
(:data:`ABANDONED_MISMATCH` when it failed on a mismatch): the others raise
``PeerFailedError`` at once (its ``mismatch`` set: they report the mismatch too).

The host (a :class:`~collectives.channel.Channel` or a team's collectives) waits
within its deadline (``mpi_wait``) and, on a mismatch, abandons the call (``fail``) before
the error is raised, so node-local peers stop as well.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Sequence
from typing import Any, NoReturn, Protocol

import numpy as np
from mpi4py import MPI

from shmem.backends import rma_accel
from shmem.errors import CollectiveMismatchError, PeerFailedError, ShmemError

from .signature import describe

__all__ = [
    "ABANDONED",
    "ABANDONED_MISMATCH",
    "P2P_MAX_MEMBERS",
    "P2P_TRUNCATION_REPORTED",
    "SIG_TAG",
    "SMALL_BLOCK",
    "AllOf",
    "P2PHost",
    "PeerGather",
    "PersistentGather",
    "SignedHost",
    "abandon_gather",
    "abandoned",
    "allgather",
    "alltoall",
    "bcast",
    "compare",
    "gather_rows",
    "mismatch",
    "persistent_gather",
    "run",
    "signed_block",
    "signed_p2p",
    "truncated",
    "wait_all",
]

SMALL_BLOCK = 1 << 16
"""Bytes per member up to which the signature rides behind the data (above: sent first)."""

_U8 = np.dtype(np.uint8)
Bytes = np.ndarray[Any, np.dtype[np.uint8]]


class SignedHost(Protocol):
    """What a signed exchange needs of its caller."""

    signature: int

    def mpi_wait(self, req: MPI.Request, what: str, keep: object = None) -> None: ...

    def fail(self, mismatch: bool = False) -> None: ...


class P2PHost(SignedHost, Protocol):
    """What a point-to-point signed exchange (:func:`signed_p2p`) needs of its caller too:
    where requests it leaves posted are kept (with their buffers) for the process's life."""

    pending: list[tuple[MPI.Request, object]]


def signed_block(nbytes: int, signature: int) -> Bytes:
    """A send block: ``nbytes`` of data (fill ``[:nbytes]``), then ``signature`` in 8 bytes."""
    block = np.empty(nbytes + 8, np.uint8)
    block[nbytes:].view(np.int64)[0] = signature
    return block


def mismatch(host: SignedHost, what: str, detail: str) -> NoReturn:
    """Abandon the call (``host.fail``) and raise ``CollectiveMismatchError``."""
    host.fail(True)
    raise CollectiveMismatchError(f"{what}: ranks called different collectives ({detail})")


def run(
    host: SignedHost, comm: MPI.Intracomm, start: Callable[[], MPI.Request], what: str, keep: object
) -> None:
    """Start and wait for one exchange; MPI's truncation (a member sent more than this one
    expects: a different call) is a mismatch."""
    try:
        host.mpi_wait(start(), what, keep=keep)
    except MPI.Exception as exc:
        if exc.Get_error_class() != MPI.ERR_TRUNCATE:
            raise
        mismatch(
            host,
            what,
            f"a block from another member is longer than member {comm.Get_rank()}'s "
            f"{describe(host.signature)}: {exc.Get_error_string()}",
        )


def truncated(host: SignedHost, what: str, exc: MPI.Exception) -> NoReturn:
    """Re-raise ``exc``, or, where it is MPI's truncation (a point-to-point message longer
    than its receive: a member in another call), abandon the call as a mismatch."""
    if exc.Get_error_class() != MPI.ERR_TRUNCATE:
        raise exc
    mismatch(host, what, "a message from another member is longer than expected")


ABANDONED = -1
"""The signature a member takes part in an exchange with after it failed before it."""
ABANDONED_MISMATCH = -2
"""... after it failed because ranks called different collectives."""


def abandoned(exc: BaseException) -> int:
    """The signature a member that failed with ``exc`` takes part in an exchange with
    (:data:`ABANDONED_MISMATCH` for a mismatch, found here or learnt from a peer)."""
    mismatched = isinstance(exc, CollectiveMismatchError) or (
        isinstance(exc, PeerFailedError) and exc.mismatch
    )
    return ABANDONED_MISMATCH if mismatched else ABANDONED


def compare(host: SignedHost, sigs: np.ndarray[Any, Any], what: str, who: str) -> None:
    """Raise unless every member's signature (``sigs``, int64 in member order) is mine:
    ``PeerFailedError`` when the others are members that abandoned the call (they failed
    first), else ``CollectiveMismatchError``."""
    if bool((sigs == host.signature).all()):
        return
    others = [(i, int(t)) for i, t in enumerate(sigs) if t != host.signature]
    if all(t in (ABANDONED, ABANDONED_MISMATCH) for _, t in others):
        first, code = others[0]
        host.fail(code == ABANDONED_MISMATCH)
        why = "ranks called different collectives" if code == ABANDONED_MISMATCH else "its error"
        raise PeerFailedError(
            f"{what}: {who} {first} abandoned the call ({why} is raised there)",
            failed_rank=-1,
            mismatch=code == ABANDONED_MISMATCH,
        )
    mismatch(host, what, "; ".join(f"{who} {i}: {describe(int(t))}" for i, t in enumerate(sigs)))


def _trailers(rows: Bytes) -> np.ndarray[Any, np.dtype[np.int64]]:
    """The int64 signatures in the last 8 bytes of each row of ``rows``."""
    return rows[:, -8:].copy().view(np.int64)[:, 0]


class _Reused(threading.local):
    """The arrays exchanges reuse, one set per thread: threads running collectives at once
    on their own Communicators (ThreadLevel.MULTIPLE) never share a receive array."""

    def __init__(self) -> None:
        self.rows: dict[tuple[int, int], tuple[Bytes, Bytes, Bytes]] = {}
        self.blocks: dict[tuple[int, int], Bytes] = {}


_reused = _Reused()


def _send_block(nbytes: int, signature: int) -> Bytes:
    """:func:`signed_block`, reused across calls of the same shape and signature (the
    caller fills ``[:nbytes]`` each time)."""
    blocks = _reused.blocks
    block = blocks.get((nbytes, signature))
    if block is None:
        if len(blocks) > 64:
            blocks.clear()
        block = blocks[(nbytes, signature)] = signed_block(nbytes, signature)
    return block


def _rows_of(size: int, nbytes: int) -> tuple[Bytes, Bytes, Bytes]:
    """``(rows, signature slots, data)``: a receive array of ``size`` rows of ``nbytes``
    reused across calls (an exchange is consumed before the next one starts) and two views
    of it. The signature slots are zeroed, so a short block from a differing call reads as
    "no collective", never as the last call's signature."""
    cached = _reused.rows
    got = cached.get((size, nbytes))
    if got is None:
        if len(cached) > 64:
            cached.clear()
        rows = np.empty((size, nbytes), np.uint8)
        got = cached[(size, nbytes)] = (rows, rows[:, -8:], rows[:, :-8])
    got[1].fill(0)
    return got


def agree_first(host: SignedHost, comm: MPI.Intracomm, what: str, who: str) -> None:
    """The check before a zero-copy exchange: all-gather the 8-byte signatures, compare."""
    gather_rows(host, comm, _send_block(0, host.signature), what, who)


# A collective whose members pass different sizes is erroneous MPI: MPICH 5 neither reports
# it (no truncation error from an all-gather of 56 against 68 bytes, at 2 to 4 ranks) nor keeps
# the rows apart (at 3 ranks through its network path a member's row held another's bytes,
# and the trailing signatures compared equal), Open MPI aborts or writes past the buffer. So
# the signatures (8 bytes: a size every member agrees on) are all-gathered before a block
# whose size depends on the call, which then moves only when every member is in the same
# call. Point to point is another matter: a receive shorter than its message is MPI's
# truncation error, which MPICH reports (collectives.cross relies on it; Open MPI corrupted
# its heap on such a large message, so there the signatures go first too).
P2P_TRUNCATION_REPORTED = MPI.get_vendor()[0] == "MPICH"


def _headers_agree(
    host: SignedHost, comm: MPI.Intracomm, signature: int, what: str, who: str, check: bool
) -> bool:
    """All-gather the 8-byte signatures (``signature`` for this member): True when every
    member is in this call; else raise (``check``) or False (an abandoning member)."""
    key = (comm.Get_size(), 8)
    every, sigs, _ = _rows_of(*key)
    block = _send_block(0, signature)
    run(host, comm, lambda: comm.Iallgather([block, MPI.BYTE], [every, MPI.BYTE]), what, block)
    if sigs.tobytes() == block[-8:].tobytes() * len(every):
        return True
    if check:
        compare(host, _trailers(every), what, who)
    return False


def gather_rows(
    host: SignedHost,
    comm: MPI.Intracomm,
    block: Bytes,
    what: str,
    who: str = "rank",
    check: bool = True,
) -> Bytes:
    """All-gather every member's :func:`signed_block` and compare the signatures: the data,
    one row per member (a view, valid until the next exchange of the same shape)."""
    key = (comm.Get_size(), block.nbytes)
    every, sigs, data = _rows_of(*key)
    if block.nbytes > 8:
        signature = int(block[-8:].view(np.int64)[0])
        if not _headers_agree(host, comm, signature, what, who, check):
            return data  # abandoned (check=False): no member moves the blocks
    try:
        run(
            host,
            comm,
            lambda: comm.Iallgather([block, MPI.BYTE], [every, MPI.BYTE]),
            what,
            (block, every),
        )
    except BaseException:
        _reused.rows.pop(key, None)  # an exchange left pending may still write into it
        raise
    if check and sigs.tobytes() != block[-8:].tobytes() * len(every):
        compare(host, _trailers(every), what, who)
    return data


def _signatures_then(
    host: SignedHost,
    comm: MPI.Intracomm,
    start: Callable[[], MPI.Request],
    what: str,
    who: str,
    keep: object,
) -> None:
    """The large form: the signatures first, then the zero-copy exchange ``start`` makes."""
    agree_first(host, comm, what, who)
    run(host, comm, start, what, keep)


def _gather_whole(host: SignedHost, comm: MPI.Intracomm, data: Bytes, what: str, who: str) -> Bytes:
    """The small form: every member's ``data`` with its signature behind, one row each."""
    block = _send_block(data.nbytes, host.signature)
    block[: data.nbytes] = data
    return gather_rows(host, comm, block, what, who)


def allgather(
    host: SignedHost, comm: MPI.Intracomm, send: Bytes, recv: Bytes, what: str, who: str = "rank"
) -> None:
    """``recv`` (members x ``send.nbytes`` bytes, contiguous) = every member's ``send``."""
    if send.nbytes > SMALL_BLOCK:
        start = lambda: comm.Iallgather([send, MPI.BYTE], [recv, MPI.BYTE])  # noqa: E731
        _signatures_then(host, comm, start, what, who, (send, recv))
        return
    recv.reshape(comm.Get_size(), send.nbytes)[...] = _gather_whole(host, comm, send, what, who)


def alltoall(
    host: SignedHost, comm: MPI.Intracomm, send: Bytes, recv: Bytes, what: str, who: str = "rank"
) -> None:
    """Chunk ``j`` of ``send`` goes to member ``j``; chunk ``i`` of ``recv`` comes from ``i``
    (both contiguous bytes, members x chunk). Small: every member's whole ``send`` in one
    signed all-gather (each keeps its chunks); else the signatures first, then the data."""
    size = comm.Get_size()
    if size * (send.nbytes + 8) > SMALL_BLOCK:
        start = lambda: comm.Ialltoall([send, MPI.BYTE], [recv, MPI.BYTE])  # noqa: E731
        _signatures_then(host, comm, start, what, who, (send, recv))
        return
    c, me = send.nbytes // size, comm.Get_rank()
    rows = _gather_whole(host, comm, send, what, who)
    recv.reshape(size, c)[...] = rows[:, me * c : (me + 1) * c]


def bcast(
    host: SignedHost,
    comm: MPI.Intracomm,
    buf: Bytes,
    root: int,
    what: str,
    who: str = "rank",
) -> None:
    """``buf`` = the root's ``buf`` on every member. Small: one signed all-gather in which
    every member sends a block of the size (the root's row is the data; a non-root sends its
    own bytes, nothing uninitialised); else the signatures first, then the data."""
    if comm.Get_size() * (buf.nbytes + 8) > SMALL_BLOCK:
        start = lambda: comm.Ibcast([buf, MPI.BYTE], root=root)  # noqa: E731
        _signatures_then(host, comm, start, what, who, buf)
        return
    rows = _gather_whole(host, comm, buf, what, who)
    if comm.Get_rank() != root:
        buf[...] = rows[root]


P2P_MAX_MEMBERS = 8
"""Members up to which an exchange between nodes moves its data point to point (each member
sends to every other: beyond this MPI's own trees and rings win)."""

_PEER_TAG = 0x6100  # PeerGather's messages: this plus the size class (below 0x6140)
_PEER_HEAD = 16  # a PeerGather slot: the signature, padding, then the data (16-aligned)


class AllOf:
    """Several requests as one: ``Test`` is ``MPI.Request.Testall`` (kept whole on timeout)."""

    __slots__ = ("reqs",)

    def __init__(self, reqs: list[MPI.Request] | list[MPI.Prequest]) -> None:
        self.reqs = reqs

    def Test(self) -> bool:  # (an MPI request's method name)
        return bool(MPI.Request.Testall(self.reqs))


class Persistent:
    """Persistent requests started and waited for as one (``Test``, as an MPI request's):
    out of Python where :func:`shmem.backends.rma_accel.requests` is bound (``MPI_Startall``;
    one ``MPI_Test`` a request, in order; ``settle``, the first tests of
    ``Channel.mpi_wait``, in C: a wait of 8 tests cost ~4 us of mpi4py ``Testall`` calls on
    12 requests, ~0.3 us so), else mpi4py's ``Startall`` and ``Testall`` (``settle`` None).
    The requests stay the owner's to free (``reqs``)."""

    start: Callable[[], None]
    Test: Callable[[], bool]  # (an MPI request's method name)
    settle: Callable[[int, int], bool] | None

    def __init__(self, reqs: list[MPI.Prequest]) -> None:
        self.reqs = reqs
        fast = rma_accel.requests(reqs) if reqs else None
        if fast is not None:
            self.start, self.Test, self.settle = fast.start, fast.Test, fast.settle
        else:
            self.start = lambda: MPI.Prequest.Startall(reqs)
            self.Test = lambda: bool(MPI.Request.Testall(reqs))
            self.settle = None


def wait_all(
    host: SignedHost,
    reqs: list[MPI.Request] | list[MPI.Prequest],
    what: str,
    keep: object = None,
) -> None:
    """``host.mpi_wait`` for several requests (the point-to-point messages of one exchange)."""
    if reqs:
        host.mpi_wait(AllOf(reqs), what, keep)  # type: ignore[arg-type]


def abandon_gather(
    host: SignedHost, comm: MPI.Intracomm, nbytes: int, what: str, exc: BaseException
) -> None:
    """Take part in the signed all-gather of ``nbytes`` a member that a call would make, with
    a block marked abandoned (:func:`abandoned`), after this member failed before it with
    ``exc``: the other members stop at once instead of waiting out the deadline."""
    # (the board may report the peer that failed first: that is not this call's error)
    block = signed_block(nbytes, abandoned(exc))
    with contextlib.suppress(MPI.Exception, ShmemError):
        gather_rows(host, comm, block, what, "member", False)


SIG_TAG = 0x5C0  # signed_p2p's signature messages


def signed_p2p(
    host: P2PHost,
    comm: MPI.Intracomm,
    what: str,
    tag: int,
    sends: Sequence[tuple[int, np.ndarray[Any, Any]]],
    recvs: Sequence[tuple[int, np.ndarray[Any, Any]]],
    keep: object,
    meanwhile: Callable[[], object] | None = None,
) -> None:
    """One call's data as point-to-point messages (``tag``: the collective's), with the
    call's signatures sent to every member at the same time (their own tag): the signatures
    are waited for first (MPI moves the data meanwhile), so a member in another such call
    raises ``CollectiveMismatchError`` on every member before any data is used (a member in
    a call that exchanges otherwise is found by the board, ``Channel.check_board``).
    Messages of another collective never match these (another tag, or a collective's own
    context), and a message longer than its receive is MPI's truncation error, also a
    mismatch: nothing is written out of place, on any MPI. Requests a mismatch leaves posted
    stay in ``host.pending`` (their buffers with them)."""
    n, me = comm.Get_size(), comm.Get_rank()
    block = signed_block(0, host.signature)
    rows = np.zeros((n, 8), np.uint8)
    rows[me] = block
    # the signatures go to every member point to point too (8 bytes, a tag of their own: a
    # round trip where MPI's non-blocking all-gather of 8 bytes took several here)
    others = [k for k in range(n) if k != me]
    sig_reqs = [comm.Irecv([rows[k], MPI.BYTE], source=k, tag=SIG_TAG) for k in others]
    reqs: list[MPI.Request] = []
    # the data moves with the signatures, where a truncated message is a clean error
    # (MPICH); elsewhere only once they agree (Open MPI corrupted its heap on a truncated
    # large message here: P2P_TRUNCATION_REPORTED). Every receive is posted before any
    # send: a message that finds no receive is copied aside first
    early = P2P_TRUNCATION_REPORTED
    if early:
        reqs.extend(comm.Irecv([buf, MPI.BYTE], source=k, tag=tag) for k, buf in recvs)
    sig_reqs += [comm.Isend([block, MPI.BYTE], dest=k, tag=SIG_TAG) for k in others]

    def post() -> None:
        if not early:
            reqs.extend(comm.Irecv([buf, MPI.BYTE], source=k, tag=tag) for k, buf in recvs)
        reqs.extend(comm.Isend([buf, MPI.BYTE], dest=k, tag=tag) for k, buf in sends)
        if meanwhile is not None:  # local work that overlaps the transfer (a copy into out)
            meanwhile()

    if early:
        post()
    done = False
    try:
        wait_all(host, sig_reqs, what, keep=(block, rows))
        if rows.tobytes() != block.tobytes() * n:
            compare(host, rows.view(np.int64)[:, 0], what, "member")
        if not early:
            post()
        wait_all(host, reqs, what, keep=keep)
        done = True
    except MPI.Exception as exc:
        truncated(host, what, exc)
    finally:
        if not done:  # posted and never completed: MPI may still use the buffers
            host.pending.extend((r, (keep, block, rows)) for r in sig_reqs + reqs)


class PeerGather:
    """:class:`PersistentGather`'s exchange in one round: every member sends its slot (its
    signature first, then its block) to every other point to point, through persistent
    requests made once (``Send_init``/``Recv_init``), and compares the signatures that came
    with the data. The signature all-gather before the data is not needed: a message is
    received into a slot of its size class (the power of two above it), on that class's tag,
    so a member in a call of another size class never matches (its call is found on the
    board, ``Channel.check_board``) and one of the same class fits and shows its signature:
    no message is ever truncated, on any MPI. For communicators of up to
    :data:`P2P_MAX_MEMBERS` members; local to make (no collective call)."""

    def __init__(self, comm: MPI.Intracomm, nbytes: int, signature: int) -> None:
        self.comm = comm
        n, me = comm.Get_size(), comm.Get_rank()
        klass = max(nbytes + _PEER_HEAD - 1, 1).bit_length()
        cap = 1 << klass
        self.rows = np.zeros((n, cap), np.uint8)
        self._sigs = self.rows[:, :8].view(np.int64)[:, 0]
        self._mine = signature
        self._sigs[me] = signature
        self._me = me
        self.data_out = self.rows[me, _PEER_HEAD : _PEER_HEAD + nbytes]  # fill before run()
        self.data = self.rows[:, _PEER_HEAD : _PEER_HEAD + nbytes]
        self._expected = np.full(n, signature, np.int64).tobytes()
        tag = _PEER_TAG + klass
        send = [self.rows[me, : _PEER_HEAD + nbytes], MPI.BYTE]
        reqs = [comm.Recv_init([self.rows[k], MPI.BYTE], k, tag) for k in range(n) if k != me]
        reqs += [comm.Send_init(send, k, tag) for k in range(n) if k != me]
        self._reqs: list[MPI.Prequest] | None = reqs
        self._all = Persistent(reqs)
        self.busy = False  # started and not completed (a timeout): never start it again

    def run(self, host: SignedHost, what: str, who: str = "member", check: bool = True) -> Bytes:
        """Start the exchange, wait within the deadline, compare the signatures: the data,
        one row per member (views, valid until the next run)."""
        reqs = self._reqs
        if reqs is None or self.busy:
            raise RuntimeError(f"{what}: internal error: a persistent gather reused after close")
        sigs = self._sigs  # (every message has its head: each peer's slot is rewritten)
        if reqs:
            self.busy = True
            self._all.start()
            host.mpi_wait(self._all, what, keep=self)  # type: ignore[arg-type]
            self.busy = False
        if check and sigs.tobytes() != self._expected:
            compare(host, sigs.copy(), what, who)
        return self.data

    def abandon(self, host: SignedHost, what: str, code: int = ABANDONED) -> None:
        """Take part with the signature ``code`` (this member failed before the exchange:
        :func:`abandoned`): the other members raise at once instead of at the deadline."""
        self._sigs[self._me] = code
        try:
            with contextlib.suppress(MPI.Exception, ShmemError):
                self.run(host, what, check=False)
        finally:
            self._sigs[self._me] = self._mine

    def close(self) -> None:
        """Free the persistent requests (kept, with their buffers, while still busy)."""
        if self._reqs is not None and not self.busy:
            for req in self._reqs:
                with contextlib.suppress(MPI.Exception):
                    req.Free()
        self._reqs = None


def persistent_gather(
    comm: MPI.Intracomm, nbytes: int, signature: int
) -> PeerGather | PersistentGather:
    """The signed all-gather of a cached plan: :class:`PeerGather` (one round) up to
    :data:`P2P_MAX_MEMBERS` members, else :class:`PersistentGather` (collective to make)."""
    if comm.Get_size() <= P2P_MAX_MEMBERS:
        return PeerGather(comm, nbytes, signature)
    return PersistentGather(comm, nbytes, signature)


class PersistentGather:
    """A signed all-gather of one block size, set up once (``MPI_Allgather_init``) and
    started per call: the cached small all-reduce across nodes exchanges its partials this
    way (a persistent collective skips MPI's per-call schedule: 0.6 us against 1.4 us for
    ``Iallgather`` at 2 ranks on the development machine).

    Collective over ``comm`` to make (every member makes its plans in the same calls).
    Persistent collectives match only persistent ones: every member of ``comm`` must run
    the same plan's gather, which holds as every member makes the same plans.
    """

    def __init__(self, comm: MPI.Intracomm, nbytes: int, signature: int) -> None:
        self.comm = comm
        self.block = signed_block(nbytes, signature)
        self.data_out = self.block[:nbytes]  # fill before run()
        size = comm.Get_size()
        self.rows = np.empty((size, nbytes + 8), np.uint8)
        self._sigs = self.rows[:, -8:]
        self.data = self.rows[:, :-8]
        self._expected = self.block[-8:].tobytes() * size
        self._req: MPI.Prequest | None = comm.Allgather_init(
            [self.block, MPI.BYTE], [self.rows, MPI.BYTE]
        )
        self.busy = False  # started and not completed (a timeout): never start it again

    def run(self, host: SignedHost, what: str, who: str = "member", check: bool = True) -> Bytes:
        """Start the exchange, wait within the deadline, compare the signatures: the data,
        one row per member (views, valid until the next run)."""
        req = self._req
        if req is None or self.busy:
            raise RuntimeError(f"{what}: internal error: a persistent gather reused after close")
        # the plan's size is the call's: agree on the call first
        signature = int(self.block[-8:].view(np.int64)[0])
        if not _headers_agree(host, self.comm, signature, what, who, check):
            return self.data
        self._sigs.fill(0)
        self.busy = True
        req.Start()
        run(host, self.comm, lambda: req, what, self)
        self.busy = False
        if check and self._sigs.tobytes() != self._expected:
            compare(host, _trailers(self.rows), what, who)
        return self.data

    def abandon(self, host: SignedHost, what: str, code: int = ABANDONED) -> None:
        """Take part with the signature ``code`` (this member failed before the exchange:
        :func:`abandoned`): the other members raise at once instead of at the deadline."""
        sig = self.block[-8:].copy()
        self.block[-8:].view(np.int64)[0] = code
        try:
            with contextlib.suppress(MPI.Exception, ShmemError):
                self.run(host, what, check=False)
        finally:
            self.block[-8:] = sig

    def close(self) -> None:
        """Free the persistent request (kept, with its buffers, while it is still busy)."""
        if self._req is not None and not self.busy:
            with contextlib.suppress(MPI.Exception):
                self._req.Free()
        self._req = None
