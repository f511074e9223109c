"""Job-wide routines: ``shmem_global_exit`` and ``shmem_pcontrol``.

:func:`global_exit` ends every rank of the job from any one of them, with an exit status for
the environment: standard output and error are flushed, the launcher (``python -m launch``)
is told who ended the job and why (it registers a hook here, :func:`on_global_exit`; it then
reports ``global_exit(status)`` instead of a failure and exits with ``status``), and
``MPI_Abort`` on the world ends every rank.
"""

from __future__ import annotations

import contextlib
import os
import sys
import traceback
from collections.abc import Callable
from typing import NoReturn

import numpy as np

from .errors import ArgumentError

__all__ = ["global_exit", "on_global_exit", "pcontrol"]

_hooks: list[Callable[[int, str], None]] = []


def on_global_exit(hook: Callable[[int, str], None]) -> None:
    """Run ``hook(status, where)`` when this process calls :func:`global_exit`, before the job
    is ended (``where``: the caller's ``file:line``). For launchers; a failing hook is
    ignored."""
    if hook not in _hooks:
        _hooks.append(hook)


def exit_status(status: int) -> int:
    """An exit status as the one byte the environment sees (a non-zero multiple of 256
    still fails: 1)."""
    return 0 if status == 0 else (status & 0xFF) or 1


def global_exit(status: int = 0) -> NoReturn:
    """End the whole job from this rank with exit status ``status`` (``shmem_global_exit``;
    not collective: the other ranks end wherever they are). Never returns.

    Parameters
    ----------
    status : int, optional
        The job's exit status (as the environment sees it: one byte, a non-zero multiple of 256
        becomes 1).

    Returns
    -------
    typing.NoReturn
        It does not return: the process ends.

    Raises
    ------
    ArgumentError
        ``status`` is not an integer (nothing is ended then).
    """
    if isinstance(status, bool) or not isinstance(status, int | np.integer):
        raise ArgumentError(
            f"global_exit: invalid status (got {status!r} of type {type(status).__name__}; "
            "expected an integer exit status)"
        )
    code = exit_status(int(status))
    frame = traceback.extract_stack(limit=3)
    caller = frame[-2] if len(frame) >= 2 else frame[-1]
    if caller.filename == __file__ and len(frame) >= 3:  # through World.global_exit
        caller = frame[-3]
    where = f"{caller.filename}:{caller.lineno}"
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    for hook in list(_hooks):
        with contextlib.suppress(Exception):
            hook(code, where)
    try:
        from mpi4py import MPI

        MPI.COMM_WORLD.Abort(code)
    finally:
        os._exit(code)


def pcontrol(level: int = 1, *args: object) -> None:
    """``shmem_pcontrol``: set the profiling level. This library makes no use of it (as
    OpenSHMEM allows): it checks ``level`` and returns at once.

    Parameters
    ----------
    level : int, optional
        0 off, 1 the default, 2 and up library-defined.
    *args : object
        Ignored (OpenSHMEM's variadic arguments).

    Raises
    ------
    ArgumentError
        ``level`` is not an integer (a bool is refused too).
    """
    if isinstance(level, bool) or not isinstance(level, int | np.integer):
        raise ArgumentError(
            f"pcontrol: invalid level (got {level!r} of type {type(level).__name__}; expected "
            "an integer: 0 off, 1 default, 2 and up library-defined)"
        )
