"""Closed buffers whose views are still alive: kept allocated until the last view is gone.

A zero-copy view of a :class:`~shmem.SHMEMBuffer` (``local()``, ``peer()`` and everything
made from them: slices, reshapes, Buffers, DLPack tensors) must never alias a later
allocation. Every view's base chain ends at one array per buffer and rank copy, made by
:func:`anchored`; the buffer keeps only weak references to those arrays, so they are alive
exactly while some view is.

Symmetric heaps must stay identical on every rank, so the decision is collective, and it
rides on the barrier every heap call makes anyway (no extra message): each rank writes a mask
beside its call signature (``World._barrier_with_signature``) with bit ``i`` set while it
still has a view of held block ``i``, and :data:`FREED_BIT` set when the buffer being closed
has a live view here; after the barrier every rank ORs all the masks. A block no rank has a
view of any more is freed on every rank, in slot order, before the call allocates; a closed
buffer some rank still has a view of is held, in the same slot everywhere.

Up to :data:`MAX_HELD` blocks are held; beyond that a closed buffer with live views stays
allocated until ``finalize`` (a ``ResourceWarning`` says so): memory is kept, never aliased.
Host backend only: on the nvshmem backend views are device memory and, as with
``nvshmem_free``, must not outlive ``close()``.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from .arena import Arena

__all__ = ["FREED_BIT", "MAX_HELD", "Quarantine", "anchored", "views_alive"]

MAX_HELD = 62  # held blocks: bits 0..61 of the mask
FREED_BIT = 1 << 62  # the buffer being closed has a live view on this rank (the mask stays >= 0)

ViewRef = weakref.ReferenceType[np.ndarray[Any, Any]]


def anchored(source: memoryview) -> np.ndarray[Any, Any]:
    """A new byte array over ``source``: every view made from it keeps it alive (its base is
    not an ndarray, so numpy's collapsing of view bases stops at it)."""
    return np.frombuffer(source, np.uint8)


def views_alive(refs: list[ViewRef] | tuple[ViewRef, ...]) -> bool:
    """Whether any of the anchored arrays behind ``refs`` is still referenced."""
    return any(ref() is not None for ref in refs)


@dataclass
class _Held:
    offset: int
    nbytes: int
    refs: tuple[ViewRef, ...]


class Quarantine:
    """The held blocks, in the same order on every rank."""

    def __init__(self) -> None:
        self._held: list[_Held] = []
        self.pinned_nbytes = 0  # kept until finalize (more than MAX_HELD held at once)

    def __len__(self) -> int:
        return len(self._held)

    @property
    def held_nbytes(self) -> int:
        """Bytes held for views, pinned blocks included."""
        return sum(h.nbytes for h in self._held) + self.pinned_nbytes

    def mask(self, closing: tuple[ViewRef, ...] = ()) -> int:
        """This rank's mask for the next heap call: which held blocks it still has views
        of, and (``FREED_BIT``) whether the buffer being closed (``closing``) has one."""
        bits = FREED_BIT if views_alive(closing) else 0
        for i, held in enumerate(self._held):
            if views_alive(held.refs):
                bits |= 1 << i
        return bits

    def settle(self, mask: int, arena: Arena) -> None:
        """Free, in slot order, every held block whose bit is clear in ``mask`` (the OR of
        every rank's): no rank has a view of it any more."""
        if not self._held:
            return
        keep = []
        for i, held in enumerate(self._held):
            if mask >> i & 1:
                keep.append(held)
            else:
                arena.free(held.offset)
        self._held = keep

    def hold(self, offset: int, nbytes: int, refs: tuple[ViewRef, ...]) -> bool:
        """Hold a closed block until no rank has a view of it; False when the quarantine is
        full (the caller then keeps the block until finalize)."""
        if len(self._held) >= MAX_HELD:
            self.pinned_nbytes += nbytes
            return False
        self._held.append(_Held(offset, nbytes, refs))
        return True
