"""The OpenSHMEM routines of :class:`~shmem.SHMEMBuffer` beyond put/get/atomics: non-blocking
and strided RMA, put-with-signal on a symmetric signal word, point-to-point waits and tests,
and locks. Each is a thin method over :mod:`shmem.rma` and :mod:`shmem.sync`; ``ctx`` picks
the communication context (default: the World's, ``SHMEM_CTX_DEFAULT``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from . import sync
from .errors import ArgumentError
from .rma import AtomicOp, Context, Fetched, host_heap, signal_offset
from .signals import Cmp

if TYPE_CHECKING:
    from .buffer import Casting
    from .world import World

__all__ = ["OpenShmemMethods"]


class OpenShmemMethods:
    """Mixed into :class:`~shmem.SHMEMBuffer` (see the module docstring)."""

    if TYPE_CHECKING:
        _world: World

        def _live(self, where: str) -> None: ...

    def _ctx(self, ctx: Context | None) -> Context:
        if ctx is None:
            return self._world.default_context
        if not isinstance(ctx, Context):
            raise ArgumentError(
                f"SHMEMBuffer: invalid ctx (got {ctx!r} of type {type(ctx).__name__}; expected "
                "a Context from World.create_context or Team.create_ctx, or None)"
            )
        return ctx

    def _me(self) -> Any:
        return self

    # -- non-blocking RMA -------------------------------------------------------------------

    def put_nbi(
        self,
        rank: int,
        src: Any,
        offset: int = 0,
        *,
        casting: Casting = "same_kind",
        ctx: Context | None = None,
    ) -> None:
        """Start writing ``src`` into ``rank``'s copy at byte ``offset``
        (``shmem_put_nbi``); complete after ``quiet()`` (``world.quiet()`` or ``ctx.quiet()``).
        ``src`` must not change until then."""
        self._ctx(ctx).put_nbi(self._me(), rank, src, offset, casting=casting)

    def get_nbi(
        self,
        rank: int,
        dst: np.ndarray[Any, Any],
        offset: int = 0,
        *,
        ctx: Context | None = None,
    ) -> np.ndarray[Any, Any]:
        """Start reading ``rank``'s copy from byte ``offset`` into ``dst``
        (``shmem_get_nbi``); ``dst`` holds the data after ``quiet()``. Returns ``dst``."""
        return self._ctx(ctx).get_nbi(self._me(), rank, dst, offset)

    def put_signal(
        self,
        rank: int,
        src: Any,
        sig: Any,
        value: int,
        op: str = "set",
        *,
        sig_index: int = 0,
        offset: int = 0,
        ctx: Context | None = None,
    ) -> None:
        """Write ``src`` into ``rank``'s copy, then set or add ``value`` to ``rank``'s signal
        word ``sig[sig_index]`` (any uint64 SHMEMBuffer; ``shmem_put_signal``). A rank that
        sees the signal (``sig.signal_wait_until``) sees the data."""
        self._ctx(ctx).put_signal(
            self._me(), rank, src, sig, value, op, sig_index=sig_index, offset=offset
        )

    def put_signal_nbi(
        self,
        rank: int,
        src: Any,
        sig: Any,
        value: int,
        op: str = "set",
        *,
        sig_index: int = 0,
        offset: int = 0,
        ctx: Context | None = None,
    ) -> None:
        """:meth:`put_signal`, non-blocking (``shmem_put_signal_nbi``): complete after
        ``quiet()``; the signal never arrives before the data."""
        self._ctx(ctx).put_signal_nbi(
            self._me(), rank, src, sig, value, op, sig_index=sig_index, offset=offset
        )

    # -- strided RMA ------------------------------------------------------------------------

    def iput(
        self,
        rank: int,
        src: Any,
        *,
        stride: int = 1,
        src_stride: int = 1,
        count: int | None = None,
        index: int = 0,
        ctx: Context | None = None,
    ) -> None:
        """Write ``src[::src_stride]`` (``count`` elements, default all) to elements
        ``index, index + stride, ...`` of ``rank``'s copy (``shmem_iput``, on ``ctx``:
        ``shmem_ctx_iput``)."""
        self._ctx(ctx)._strided_put(
            "iput", self._me(), rank, src, 1, stride, src_stride, count, index
        )

    def iget(
        self,
        rank: int,
        count: int,
        *,
        stride: int = 1,
        index: int = 0,
        dst: np.ndarray[Any, Any] | None = None,
        dst_stride: int = 1,
        ctx: Context | None = None,
    ) -> np.ndarray[Any, Any]:
        """Read elements ``index, index + stride, ...`` (``count`` of them) of ``rank``'s
        copy into ``dst[::dst_stride]`` or a new array (``shmem_iget``, on ``ctx``:
        ``shmem_ctx_iget``); returns it."""
        return self._ctx(ctx)._strided_get(
            "iget", self._me(), rank, 1, stride, count, index, dst, dst_stride
        )

    def ibput(
        self,
        rank: int,
        src: Any,
        *,
        block: int,
        stride: int,
        src_stride: int | None = None,
        nblocks: int | None = None,
        index: int = 0,
        ctx: Context | None = None,
    ) -> None:
        """Block-strided put (``shmem_ibput``): ``nblocks`` blocks of ``block`` elements,
        starts ``src_stride`` apart in ``src`` and ``stride`` apart in ``rank``'s copy."""
        self._ctx(ctx).ibput(
            self._me(),
            rank,
            src,
            block=block,
            stride=stride,
            src_stride=src_stride,
            nblocks=nblocks,
            index=index,
        )

    def ibget(
        self,
        rank: int,
        nblocks: int,
        *,
        block: int,
        stride: int,
        index: int = 0,
        dst: np.ndarray[Any, Any] | None = None,
        dst_stride: int | None = None,
        ctx: Context | None = None,
    ) -> np.ndarray[Any, Any]:
        """Block-strided get (``shmem_ibget``), the converse of :meth:`ibput`."""
        return self._ctx(ctx).ibget(
            self._me(),
            rank,
            block=block,
            stride=stride,
            nblocks=nblocks,
            index=index,
            dst=dst,
            dst_stride=dst_stride,
        )

    # -- non-blocking atomics ---------------------------------------------------------------

    def atomic_nbi(
        self,
        rank: int,
        index: int,
        op: AtomicOp | str,
        value: float = 0,
        *,
        compare: int | None = None,
        ctx: Context | None = None,
    ) -> Fetched:
        """Start a fetching atomic (``shmem_atomic_fetch_nbi``, ``..._fetch_add_nbi``,
        ``..._swap_nbi``, ``..._compare_swap_nbi``...): ``.value`` of the result after
        ``quiet()``. ``op`` is an :class:`~shmem.rma.AtomicOp`."""
        return self._ctx(ctx).atomic_nbi(self._me(), rank, index, op, value, compare=compare)

    # -- signals on symmetric words ---------------------------------------------------------

    def signal(self, rank: int, value: int, op: str = "set", *, index: int = 0) -> None:
        """Set or add ``value`` to ``rank``'s signal word ``self[index]`` (a uint64 buffer;
        ``shmem_signal_set`` / ``shmem_signal_add``), after a release fence."""
        from .dtypes import int_operand
        from .rma import SIGNAL_DTYPE, check_signal_op, signal_word

        heap = host_heap(self._world, "SHMEMBuffer.signal")
        off = signal_offset(self._me(), index, "SHMEMBuffer.signal")
        target = self._world.default_context.world_rank(rank, "signal")
        v = int_operand("SHMEMBuffer.signal", "value", value, SIGNAL_DTYPE)
        signal_word(heap, target, off, v, check_signal_op("SHMEMBuffer.signal", op))

    def signal_fetch(self, index: int = 0) -> int:
        """Atomically read this rank's signal word ``self[index]`` (``shmem_signal_fetch``)."""
        off = signal_offset(self._me(), index, "SHMEMBuffer.signal_fetch")
        heap = host_heap(self._world, "SHMEMBuffer.signal_fetch")
        return heap.atomic_fetch_op(heap.rank, off, 0, np.dtype(np.uint64), "fetch")

    def signal_wait_until(
        self, cmp: Cmp | str, value: int, *, index: int = 0, timeout: float | None = None
    ) -> int:
        """Wait until this rank's signal word ``self[index]`` compares true against ``value``
        (``shmem_signal_wait_until``); return the value seen."""
        signal_offset(self._me(), index, "SHMEMBuffer.signal_wait_until")
        sync.wait_elements(
            self._me(), "signal_wait_until", "one", cmp, value, [index], None, timeout
        )
        return int(self._me().local().reshape(-1)[index])

    # -- point-to-point synchronisation -----------------------------------------------------

    def wait_until(
        self, cmp: Cmp | str, value: int, *, index: int = 0, timeout: float | None = None
    ) -> int:
        """Wait until element ``index`` of this rank's copy compares true against ``value``
        (``shmem_wait_until``); return the value seen."""
        sync.wait_elements(self._me(), "wait_until", "one", cmp, value, [index], None, timeout)
        return int(self._me().local().reshape(-1)[index])

    def wait_until_all(
        self,
        cmp: Cmp | str,
        value: int | Sequence[int],
        *,
        indices: Sequence[int] | None = None,
        status: Sequence[int] | None = None,
        timeout: float | None = None,
    ) -> None:
        """Wait until every element in ``indices`` (default all) whose ``status`` entry is 0
        compares true (``shmem_wait_until_all``; a sequence ``value`` is the ``_vector``
        form, one value per element)."""
        sync.wait_elements(
            self._me(), "wait_until_all", "all", cmp, value, indices, status, timeout
        )

    def wait_until_any(
        self,
        cmp: Cmp | str,
        value: int | Sequence[int],
        *,
        indices: Sequence[int] | None = None,
        status: Sequence[int] | None = None,
        timeout: float | None = None,
    ) -> int | None:
        """Wait until one element compares true; return its index (the lowest satisfied), or
        None when ``status`` excludes every element (``shmem_wait_until_any[_vector]``)."""
        hits = sync.wait_elements(
            self._me(), "wait_until_any", "any", cmp, value, indices, status, timeout
        )
        return hits[0] if hits else None

    def wait_until_some(
        self,
        cmp: Cmp | str,
        value: int | Sequence[int],
        *,
        indices: Sequence[int] | None = None,
        status: Sequence[int] | None = None,
        timeout: float | None = None,
    ) -> list[int]:
        """Wait until at least one element compares true; return every satisfied index
        (``shmem_wait_until_some[_vector]``)."""
        return sync.wait_elements(
            self._me(), "wait_until_some", "some", cmp, value, indices, status, timeout
        )

    def test(self, cmp: Cmp | str, value: int, *, index: int = 0) -> bool:
        """Whether element ``index`` compares true now (``shmem_test``; no waiting)."""
        return sync.test_elements(self._me(), "test", "one", cmp, value, [index], None) is not None

    def test_all(
        self,
        cmp: Cmp | str,
        value: int | Sequence[int],
        *,
        indices: Sequence[int] | None = None,
        status: Sequence[int] | None = None,
    ) -> bool:
        """Whether every unmasked element compares true now (``shmem_test_all[_vector]``)."""
        return (
            sync.test_elements(self._me(), "test_all", "all", cmp, value, indices, status)
            is not None
        )

    def test_any(
        self,
        cmp: Cmp | str,
        value: int | Sequence[int],
        *,
        indices: Sequence[int] | None = None,
        status: Sequence[int] | None = None,
    ) -> int | None:
        """The lowest unmasked index comparing true now, else None (``shmem_test_any``)."""
        hits = sync.test_elements(self._me(), "test_any", "any", cmp, value, indices, status)
        return hits[0] if hits else None

    def test_some(
        self,
        cmp: Cmp | str,
        value: int | Sequence[int],
        *,
        indices: Sequence[int] | None = None,
        status: Sequence[int] | None = None,
    ) -> list[int]:
        """Every unmasked index comparing true now (``shmem_test_some[_vector]``; may be [])."""
        hits = sync.test_elements(self._me(), "test_some", "some", cmp, value, indices, status)
        return hits or []

    # -- locks ------------------------------------------------------------------------------

    def set_lock(self, index: int = 0, *, timeout: float | None = None) -> None:
        """Acquire the lock word ``self[index]`` (int64/uint64, zeroed; ``shmem_set_lock``):
        fair (first come, first served), raising :class:`~shmem.errors.LockTimeoutError`
        past the deadline."""
        sync.set_lock(self._me(), index, timeout)

    def try_lock(self, index: int = 0) -> bool:
        """Acquire the lock if it is free now, without waiting: True when this call acquired
        it (the Python spelling of :meth:`test_lock`, which returns OpenSHMEM's int)."""
        return sync.try_lock(self._me(), index)

    def test_lock(self, index: int = 0) -> int:
        """``shmem_test_lock``, with its C return value: **0 when this call acquired the
        lock**, 1 when the lock was set (by another rank, or queued for). ``if
        buf.test_lock():`` therefore means "not acquired"; :meth:`try_lock` returns True
        when acquired."""
        return 0 if sync.try_lock(self._me(), index, "test_lock") else 1

    def clear_lock(self, index: int = 0) -> None:
        """Complete outstanding puts (``quiet``), then release (``shmem_clear_lock``)."""
        sync.clear_lock(self._me(), index)

    def lock(self, index: int = 0, *, timeout: float | None = None) -> _Held:
        """``with buf.lock(): ...``: :meth:`set_lock` on entry, :meth:`clear_lock` on exit."""
        return _Held(self, index, timeout)


class _Held:
    def __init__(self, buf: OpenShmemMethods, index: int, timeout: float | None) -> None:
        self._buf, self._index, self._timeout = buf, index, timeout

    def __enter__(self) -> None:
        self._buf.set_lock(self._index, timeout=self._timeout)

    def __exit__(self, *exc: object) -> None:
        self._buf.clear_lock(self._index)
