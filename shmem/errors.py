"""One error hierarchy for the whole project.

Every error derives from :class:`ShmemError` and from the builtin a caller would
naturally catch (``ValueError``, ``MemoryError``, ``TimeoutError``, ...), so both
``except ShmemError`` and ``except TimeoutError`` work. Messages follow
``"<function>: <what is wrong> (got <value>; expected <constraint>)"``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .callreport import CallLine

__all__ = [
    "ArgumentError",
    "AsyncExecutionError",
    "AttentionArgumentError",
    "BackendUnavailableError",
    "CollectiveArgumentError",
    "CollectiveMismatchError",
    "ConfigError",
    "CudaError",
    "DLPackArgumentError",
    "DLPackDTypeError",
    "DLPackError",
    "DLPackMemoryError",
    "DescriptorError",
    "DeviceUnavailableError",
    "ExporterGoneError",
    "GpuBindingError",
    "GpuCollectiveError",
    "HeapExhaustedError",
    "IpcPermissionError",
    "KernelCompileError",
    "LaunchUsageError",
    "LockTimeoutError",
    "NvshmemError",
    "NvshmemUnsupportedError",
    "OpError",
    "PeerFailedError",
    "RemoteTimeoutError",
    "SequenceParallelError",
    "ShmemError",
    "ShmemStateError",
    "SignalTimeoutError",
    "ViewError",
]


class ShmemError(Exception):
    """Base class of every error raised by this project."""


class ConfigError(ShmemError, ValueError):
    """A configuration file, environment variable or keyword is invalid."""


class ShmemStateError(ShmemError, RuntimeError):
    """The runtime is in the wrong state (not initialised, finalised, closed)."""


class BackendUnavailableError(ShmemError, RuntimeError):
    """The requested backend cannot be used on this machine."""


class CollectiveMismatchError(ShmemError, RuntimeError):
    """Ranks called a collective operation with different arguments.

    Raised on every rank; the message lists each rank's call as that rank described it, by
    world rank, the same table on every rank (:mod:`shmem.callreport`).

    Parameters
    ----------
    message : str
        The explanation.
    calls : sequence of CallLine, optional
        Every member's line (:class:`shmem.CallLine`: rank, member, call number,
        description), in member order.

    Attributes
    ----------
    calls : tuple of CallLine
        Every member's line (empty where none were exchanged).
    """

    def __init__(self, message: str, *, calls: Sequence[CallLine] = ()) -> None:
        super().__init__(message)
        self.calls: tuple[CallLine, ...] = tuple(calls)


class HeapExhaustedError(ShmemError, MemoryError):
    """The symmetric heap has no free block large enough.

    Parameters
    ----------
    message : str
        The explanation.
    requested : int
        Bytes asked for.
    free_total : int
        Bytes free in all.
    largest_free : int
        The largest free block's bytes.

    Attributes
    ----------
    requested, free_total, largest_free : int
        Bytes asked for, bytes free in all, and the largest free block.
    """

    def __init__(self, message: str, requested: int, free_total: int, largest_free: int) -> None:
        super().__init__(message)
        self.requested = requested
        self.free_total = free_total
        self.largest_free = largest_free


class SignalTimeoutError(ShmemError, TimeoutError):
    """A wait on a signal or barrier passed its deadline.

    Parameters
    ----------
    message : str
        The explanation.
    operation : str
        What was waiting.
    slot : int
        The slot waited on.
    expected : str
        The condition.
    last_value : int
        The slot's last value seen.
    peers : tuple of int, optional
        The ranks whose signal did not arrive.

    Attributes
    ----------
    operation : str
        What was waiting (``"wait_until"``, ``"barrier"``).
    slot : int
        The signal slot waited on.
    expected : str
        The condition, e.g. ``">= 3"``.
    last_value : int
        The last value seen in the slot.
    peers : tuple of int
        The rank(s) whose signal did not arrive (empty when unknown).
    """

    def __init__(
        self,
        message: str,
        *,
        operation: str,
        slot: int,
        expected: str,
        last_value: int,
        peers: tuple[int, ...] = (),
    ) -> None:
        super().__init__(message)
        self.operation = operation
        self.slot = slot
        self.expected = expected
        self.last_value = last_value
        self.peers = peers


class DeviceUnavailableError(ShmemError, RuntimeError):
    """The requested device does not exist or cannot be used (no driver, bad id)."""


class AsyncExecutionError(ShmemError, RuntimeError):
    """Work queued on a DeviceContext failed; raised at ``synchronize()``.

    The original exception is the ``__cause__`` and its traceback is in the message.
    """


class RemoteTimeoutError(ShmemError, TimeoutError):
    """A one-sided operation on an off-node peer did not complete before its deadline.

    On the host backend, operations aimed at a peer on another node are served by that
    peer's MPI progress engine, which runs while it waits, signals or calls MPI. ``peer``
    is the rank that made no progress.

    Parameters
    ----------
    message : str
        The explanation.
    peer : int
        The rank that made no progress.
    """

    def __init__(self, message: str, *, peer: int) -> None:
        super().__init__(message)
        self.peer = peer


class DescriptorError(ShmemError, ValueError):
    """An IPC descriptor is malformed, of the wrong version, or otherwise invalid."""


class ArgumentError(ShmemError, ValueError, TypeError):
    """A function was called with an invalid argument: a wrong value or a wrong type.

    The one argument error of the project. It derives from both ``ValueError`` and
    ``TypeError`` so that callers catching either builtin keep working; the message says which
    function, what was wrong and what was expected.
    """


class CollectiveArgumentError(ArgumentError):
    """A collective (``collectives.Communicator``) was called with an invalid argument."""


class OpError(ArgumentError):
    """A reduction operation does not exist or does not apply to the dtype."""


class GpuCollectiveError(ArgumentError):
    """A GPU collective was called with an argument its kernels cannot take."""


class AttentionArgumentError(ArgumentError):
    """An attention function (``collectives.mha``) was called with an invalid argument."""


class SequenceParallelError(ArgumentError):
    """``sequence_parallel_attention`` (or its backward) was called with an invalid argument."""


class PeerFailedError(ShmemError, RuntimeError):
    """Another rank failed during the call (its own error is raised there).

    ``failed_rank`` names that rank (-1 when unknown). The launcher reports a rank that ends
    with this error as a consequence of ``failed_rank``'s failure, never as the root cause,
    and waits briefly for that rank's own error record before it aborts the job.

    Parameters
    ----------
    message : str
        The explanation.
    failed_rank : int, optional
        The rank that failed (-1 when unknown).
    mismatch : bool, optional
        That rank stopped because ranks called different collectives (the caller then
        reports the mismatch: ``CollectiveMismatchError``).
    """

    def __init__(self, message: str, *, failed_rank: int = -1, mismatch: bool = False) -> None:
        super().__init__(message)
        self.failed_rank = failed_rank
        self.mismatch = mismatch


class ViewError(ShmemError, IndexError):
    """An index a strided view cannot express, or one out of range."""


class DLPackError(ShmemError, BufferError):
    """A DLPack exchange failed: bad or consumed capsule, unsupported device or version."""


class DLPackDTypeError(DLPackError, ValueError):
    """A dtype (or DLPack type code, bits, lanes) has no DLPack/numpy counterpart here."""


class DLPackArgumentError(ArgumentError):
    """An argument of ``to_dlpack`` is malformed (shape, strides, device, pointer)."""


class DLPackMemoryError(ShmemError, MemoryError):
    """``PyMem_Malloc`` failed while building a DLPack capsule."""


class CudaError(ShmemError, RuntimeError):
    """A CUDA driver call failed."""


class KernelCompileError(ShmemError, RuntimeError):
    """NVRTC could not compile a kernel source; the message holds the compiler log."""


class NvshmemError(ShmemError, RuntimeError):
    """An NVSHMEM call failed or NVSHMEM is in a state the call cannot use."""


class NvshmemUnsupportedError(NvshmemError, NotImplementedError):
    """The call exists on the host backend but not (yet) on the nvshmem backend; the message
    names the call and what to use instead (``docs/openshmem.md`` lists each)."""


class LockTimeoutError(SignalTimeoutError):
    """``set_lock`` waited past its deadline. The ticket it drew stays taken, so the lock is
    unusable afterwards (every later waiter times out too, instead of hanging).

    Parameters
    ----------
    message : str
        The explanation.
    operation : str
        What was waiting (``"set_lock"``).
    slot : int
        The lock's element.
    expected : str
        The condition waited for.
    last_value : int
        The lock word's last value seen.
    peers : tuple of int, optional
        The ranks involved, when known.
    """


class IpcPermissionError(ShmemError, PermissionError):
    """Credentials do not allow this (another user's descriptor, or an unsafe directory)."""


class ExporterGoneError(ShmemError, ConnectionError):
    """The exporting process is no longer serving (it exited). A buffer its exporter closed
    while it lives is a :class:`DescriptorError` ("unknown buffer"): nobody failed.

    ``failed_pid`` is the exporter's pid (-1 when unknown): under the launcher, a rank that
    ends with this error is reported as a consequence of that process's rank, if it was one.

    Parameters
    ----------
    message : str
        The explanation.
    failed_pid : int, optional
        The exporter's pid (-1 when unknown).
    """

    def __init__(self, message: str, *, failed_pid: int = -1) -> None:
        super().__init__(message)
        self.failed_pid = failed_pid


class LaunchUsageError(ArgumentError):
    """The launcher's command line cannot be turned into a job (exit code 2)."""


class GpuBindingError(ShmemError, RuntimeError):
    """More ranks on a node than GPUs without ``--allow-gpu-sharing``."""
