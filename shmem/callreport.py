"""Call reports: when ranks disagree on a collective call, every rank's own account of it.

Mismatched calls are found by comparing compact signatures (64-bit words that ride with the
data: :mod:`collectives.signature`, :func:`shmem.agreement.heap_signature`). A signature
says that ranks differ, not what each one called, and a peer's word read at the wrong moment
may belong to another call. So once a mismatch is found, every member of the communicator
sends every other member one line about its call: its number on that communicator (the
flight recorder's, where it records) and the call as that rank described it
(``all_reduce(16 float32, op=sum, algorithm=auto)``). The lines travel as MPI
point-to-point messages with a tag of their own on the communicator the calls ran on
(collective operations never match point-to-point messages), so a line is never read half
written; each carries the report's index on that communicator, so a late line from an
earlier report is never taken for this one's. Every member waits for the others' lines
within the deadline and builds the same table; a member whose line did not come is named as
"not seen yet" with the time waited.

The module is pure of the runtime: it needs an mpi4py communicator and nothing else.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .errors import CollectiveMismatchError

if TYPE_CHECKING:
    from mpi4py import MPI

__all__ = ["REPORT_TAG", "CallLine", "Reporter", "differ", "mismatch_error", "table"]

REPORT_TAG = 0x7EC
"""The point-to-point tag of report lines (below 32768, the smallest tag bound MPI allows)."""

_SENDS: list[Any] = []  # report lines in flight (their requests keep the pickled bytes alive)
_POLL_S = 0.5e-3  # a reporter's sleep between probes once the first spin found nothing


@dataclass(frozen=True)
class CallLine:
    """One rank's line of a report (``CollectiveMismatchError.calls``).

    Parameters
    ----------
    rank : int
        Its world rank.
    member : int
        Its index on the communicator the call ran on (its rank in a team).
    call : int
        The number of its call on that communicator (the flight recorder's: the n-th call
        of the communicator's stream; 0 when unknown).
    text : str
        The call as that rank described it; empty when its line did not arrive.
    waited_s : float, optional
        For a line that did not arrive: how long the reporting rank waited for it.
    """

    rank: int
    member: int
    call: int
    text: str
    waited_s: float = 0.0

    @property
    def seen(self) -> bool:
        """Whether the rank's line arrived."""
        return bool(self.text)

    @property
    def who(self) -> str:
        """``rank 3``, or ``rank 3 (member 1)`` on a communicator of some ranks only."""
        return f"rank {self.rank}" + (
            f" (member {self.member})" if self.member != self.rank else ""
        )

    def __str__(self) -> str:
        if not self.seen:
            return f"{self.who}: not seen yet (waited {self.waited_s:.1f} s)"
        return f"{self.who} in its call {self.call}: {self.text}"


def differ(lines: Sequence[CallLine]) -> bool:
    """Whether the lines that arrived name different calls (or calls of different numbers)."""
    seen = {(line.call, line.text) for line in lines if line.seen}
    return len(seen) > 1


def table(lines: Sequence[CallLine]) -> str:
    """The report as text: one indented line per member, in member order."""
    return "\n".join(f"  {line}" for line in lines)


def mismatch_error(
    where: str, lines: Sequence[CallLine], outcome: str = ""
) -> CollectiveMismatchError:
    """The error every member raises once the lines are in: ``where`` (this member's
    call), then the table, the same on every member (``outcome``: what became of the call,
    after the table)."""
    return CollectiveMismatchError(
        f"{where}: ranks called different collectives; each rank's call, as it described "
        f"it:\n{table(lines)}" + (f"\n{outcome}" if outcome else ""),
        calls=lines,
    )


class Reporter:
    """The report lines of one communicator's members.

    Parameters
    ----------
    comm : mpi4py.MPI.Intracomm
        The communicator the calls run on (a member's index is its rank there).
    members : sequence of int
        The members' world ranks, by member index.
    timeout_s : float
        How long a member waits for the others' lines.
    progress : callable, optional
        Called while waiting (a heap's: peers' one-sided operations are served meanwhile).
    """

    def __init__(
        self,
        comm: MPI.Intracomm,
        members: Sequence[int],
        timeout_s: float,
        progress: Callable[[], None] | None = None,
    ) -> None:
        self.comm = comm
        self.members = list(members)
        self.me = comm.Get_rank()
        self.timeout_s = timeout_s
        self.progress = progress
        self.reports = 0  # reports this member took part in: the index of the next one

    def exchange(self, call: int, text: str, *, wait: bool = True) -> list[CallLine]:
        """Send this member's line (``call``, ``text``) to every other member and collect
        theirs, within the deadline (``wait=False``: only the lines already here).

        Parameters
        ----------
        call : int
            This member's call number on the communicator.
        text : str
            Its call, as it describes it.
        wait : bool, optional
            Wait up to ``timeout_s`` for every member's line.

        Returns
        -------
        list of CallLine
            Every member's line, in member order (not seen: ``text`` empty).
        """
        index = self.reports
        self.reports += 1
        size, me = len(self.members), self.me
        message = (index, call, text)
        for m in range(size):
            if m != me:
                _SENDS.append(self.comm.isend(message, dest=m, tag=REPORT_TAG))
        got: dict[int, tuple[int, str]] = {me: (call, text)}
        start = time.monotonic()
        spins = 0
        while True:
            for m in range(size):
                if m not in got:
                    self._receive(m, index, got)
            if len(got) == size or not wait or time.monotonic() - start > self.timeout_s:
                break
            if self.progress is not None:
                self.progress()
            spins += 1
            if spins > 64:  # the lines are in flight: most come within microseconds
                time.sleep(_POLL_S)
        _reap()
        waited = time.monotonic() - start
        lines = []
        for m, rank in enumerate(self.members):
            c, t = got.get(m, (0, ""))
            lines.append(CallLine(rank, m, c, t, 0.0 if m in got else waited))
        return lines

    def _receive(self, m: int, index: int, got: dict[int, tuple[int, str]]) -> None:
        """Take member ``m``'s lines that are here; keep the one of report ``index`` (an
        earlier report's, left by a member that gave up waiting on it, is dropped)."""
        while self.comm.iprobe(source=m, tag=REPORT_TAG):
            their_index, call, text = self.comm.recv(source=m, tag=REPORT_TAG)
            if their_index >= index:
                got[m] = (int(call), str(text))
                return


def _reap() -> None:
    """Forget the sends that completed (the others stay referenced until they do)."""
    from mpi4py import MPI

    if _SENDS:
        done = MPI.Request.Testsome(_SENDS)
        for i in sorted(done or (), reverse=True):
            del _SENDS[i]
