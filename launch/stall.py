"""Stalls: a rank that stopped making progress while its peers waited for it.

A timeout that names the rank it waited for (``SignalTimeoutError.peers``,
``RemoteTimeoutError.peer``) is a consequence of that rank. The failing rank records whom it
waited for and, for a waited-for rank on its own host, what that rank was doing at that
moment: its state from ``/proc`` (stopped, running, or blocked in the kernel and where) and
its Python stacks of every thread (``SIGUSR1``, which ``faulthandler`` answers even from C).
The launcher then names the rank everyone waited for as the root cause
(:func:`stalled_ranks`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

__all__ = ["ask_for_stacks", "process_state", "stalled_ranks", "waited_for"]

_STATES = {
    "R": "running on a CPU (busy: a loop that never reaches the next call?)",
    "S": "sleeping in the kernel",
    "D": "in an uninterruptible wait in the kernel",
    "T": "stopped (SIGSTOP or another stop signal)",
    "t": "stopped by a debugger",
    "Z": "a zombie (it exited; its parent has not reaped it)",
    "X": "dead",
}


def waited_for(exc: BaseException) -> list[int]:
    """The ranks ``exc`` (or an exception it came from) says it waited for, in order.

    Parameters
    ----------
    exc : BaseException
        The exception a rank failed with.

    Returns
    -------
    list of int
        ``SignalTimeoutError.peers`` or ``RemoteTimeoutError.peer`` of the first timeout in
        the chain that names any; empty when none does.
    """
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, TimeoutError):
            peers = getattr(e, "peers", None)
            if peers is None and isinstance(getattr(e, "peer", None), int):
                peers = (e.peer,)  # type: ignore[attr-defined]
            named = [int(p) for p in peers or () if isinstance(p, int) and p >= 0]
            if named:
                return list(dict.fromkeys(named))
        e = e.__cause__ or e.__context__
    return []


def process_state(pid: int) -> str:
    """What process ``pid`` is doing, in words, from ``/proc`` (its main thread).

    Parameters
    ----------
    pid : int
        A process of this host.

    Returns
    -------
    str
        E.g. ``"stopped (SIGSTOP or another stop signal)"``, ``"sleeping in the kernel (wait
        channel: futex_wait_queue)"``; ``"gone"`` when the process no longer exists.
    """
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return "gone"
    state = stat[stat.rfind(")") + 2 :].split(" ", 1)[0]  # the name may hold spaces
    words = _STATES.get(state, f"state {state}")
    if state in ("S", "D"):
        try:
            wchan = Path(f"/proc/{pid}/wchan").read_text().strip()
        except OSError:
            wchan = ""
        if wchan and wchan != "0":
            words += f" (wait channel: {wchan})"
    return words


def ask_for_stacks(pids: Iterable[int], stack_files: Sequence[Path], wait_s: float = 1.0) -> None:
    """Send ``SIGUSR1`` to each process (the launcher's ranks dump their Python stacks of
    every thread into their ``rank.<r>.stack`` file on it), then wait up to ``wait_s`` for
    the files to be written. A stopped process answers when it is continued, not now.

    Parameters
    ----------
    pids : iterable of int
        The rank processes (of this host) to ask.
    stack_files : sequence of Path
        Their stack files, waited for.
    wait_s : float
        The longest wait for the dumps.
    """
    sizes = {}
    for path in stack_files:
        try:
            sizes[path] = path.stat().st_size
        except OSError:
            sizes[path] = 0
    for pid in pids:
        try:
            os.kill(pid, signal.SIGUSR1)
        except OSError:
            continue
    end = time.monotonic() + wait_s
    while time.monotonic() < end:
        grown = 0
        for path, size in sizes.items():
            with contextlib.suppress(OSError):
                grown += path.stat().st_size > size
        if grown == len(sizes):
            time.sleep(0.05)  # the dump is written in pieces: let it finish
            return
        time.sleep(0.01)


def stalled_ranks(waits: dict[int, list[int]], failed: set[int]) -> list[int]:
    """The ranks every wait leads to: waited for, not waiting themselves, not failed.

    Parameters
    ----------
    waits : dict
        Rank -> the ranks its timeout named (ranks that failed with such a timeout).
    failed : set of int
        Ranks that failed on their own (an error that is no such timeout, or a death).

    Returns
    -------
    list of int
        The stalled ranks, sorted; empty when every wait ends at a failed rank (then that
        failure is the root cause) or at nobody.
    """
    roots: set[int] = set()
    for start in waits:
        todo, seen = [start], {start}
        while todo:
            r = todo.pop()
            for w in waits.get(r, []):
                if w in seen:
                    continue
                seen.add(w)
                if w in waits:
                    todo.append(w)  # it timed out waiting too: follow it
                elif w not in failed:
                    roots.add(w)
    return sorted(roots)
