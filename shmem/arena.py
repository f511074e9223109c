"""A deterministic first-fit arena allocator over a byte range.

Identical call sequences give identical offsets on every rank, which is what makes a heap
symmetric. Blocks are aligned, freed blocks coalesce with their neighbours, and the state
after a failed allocation is unchanged. Pure: no MPI, no CUDA.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from .errors import ArgumentError, HeapExhaustedError

__all__ = ["Arena", "ArenaStats"]


@dataclass(frozen=True)
class ArenaStats:
    """A snapshot: capacity, bytes in use, free bytes, the largest free block, block counts;
    ``held``: bytes of closed buffers kept for views still alive (counted in ``used``, freed
    at the first heap call after the last view is gone; see :mod:`shmem.quarantine`).

    Parameters
    ----------
    capacity : int
        Bytes managed.
    used : int
        Bytes in allocated blocks (``held`` included).
    free_total : int
        Bytes in free blocks.
    largest_free : int
        The largest free block's bytes: the largest request that can succeed now.
    num_allocated : int
        Allocated blocks.
    num_free_blocks : int
        Free blocks (after coalescing).
    held : int
        Bytes of closed buffers kept for views still alive.
    """

    capacity: int
    used: int
    free_total: int
    largest_free: int
    num_allocated: int
    num_free_blocks: int
    held: int = 0


def _round_up(n: int, alignment: int) -> int:
    return (n + alignment - 1) // alignment * alignment


class Arena:
    """First-fit allocator with alignment and coalescing free.

    Parameters
    ----------
    capacity : int
        Bytes managed (rounded down to ``alignment``).
    alignment : int
        Every offset and every block size is a multiple of this power of two.

    Raises
    ------
    ValueError
        ``alignment`` is not a power of two, or ``capacity`` is negative.
    """

    def __init__(self, capacity: int, alignment: int = 256) -> None:
        if alignment <= 0 or alignment & (alignment - 1):
            raise ValueError(
                f"Arena: alignment must be a power of two (got {alignment}; expected 1, 2, 4, ...)"
            )
        if capacity < 0:
            raise ValueError(f"Arena: capacity cannot be negative (got {capacity})")
        self.alignment = alignment
        self.capacity = capacity // alignment * alignment
        # Free blocks as two parallel sorted lists (offsets, sizes), coalesced at all times.
        self._free_offsets: list[int] = [0] if self.capacity else []
        self._free_sizes: list[int] = [self.capacity] if self.capacity else []
        self._allocated: dict[int, int] = {}

    def block_nbytes(self, nbytes: int) -> int:
        """The bytes a request of ``nbytes`` occupies (at least one aligned unit).

        Parameters
        ----------
        nbytes : int
            The requested bytes.

        Returns
        -------
        int
            ``nbytes`` rounded up to the arena's alignment, at least one alignment unit.
        """
        return _round_up(max(nbytes, 1), self.alignment)

    def alloc(self, nbytes: int, alignment: int | None = None) -> int:
        """Reserve ``nbytes`` and return the block's offset: the first free block that holds
        it, at a multiple of ``alignment`` (a power of two; the arena's own by default). The
        bytes skipped to align stay free.

        Parameters
        ----------
        nbytes : int
            Bytes to reserve (0 reserves one aligned unit).
        alignment : int, optional
            The offset's alignment, a power of two (default: the arena's).

        Returns
        -------
        int
            The block's offset from the arena's start.

        Raises
        ------
        HeapExhaustedError
            No free block is large enough; the arena is unchanged.
        ValueError
            ``nbytes`` is negative, or ``alignment`` is not a power of two.
        """
        if nbytes < 0:
            raise ValueError(f"Arena.alloc: nbytes cannot be negative (got {nbytes})")
        align = self.alignment if alignment is None else alignment
        if align <= 0 or align & (align - 1):
            raise ValueError(f"Arena.alloc: alignment must be a power of two (got {alignment})")
        align = max(align, self.alignment)
        need = self.block_nbytes(nbytes)
        for i, size in enumerate(self._free_sizes):
            start = self._free_offsets[i]
            offset = _round_up(start, align)
            lead = offset - start  # a multiple of the arena's alignment: it stays free
            if size < lead + need:
                continue
            rest = size - lead - need
            pieces = [(o, n) for o, n in ((start, lead), (offset + need, rest)) if n]
            self._free_offsets[i : i + 1] = [o for o, _ in pieces]
            self._free_sizes[i : i + 1] = [n for _, n in pieces]
            self._allocated[offset] = need
            return offset
        stats = self.stats()
        raise HeapExhaustedError(
            f"alloc: symmetric heap exhausted (got a request for {nbytes} bytes, "
            f"{need} with alignment; free {stats.free_total} bytes in "
            f"{stats.num_free_blocks} blocks, largest free block {stats.largest_free} bytes, "
            f"capacity {self.capacity} bytes)",
            requested=nbytes,
            free_total=stats.free_total,
            largest_free=stats.largest_free,
        )

    def free(self, offset: int) -> None:
        """Release the block at ``offset`` and coalesce it with free neighbours.

        Parameters
        ----------
        offset : int
            An offset :meth:`alloc` returned and not freed since.

        Raises
        ------
        ArgumentError
            ``offset`` is not the start of an allocated block (never allocated, or freed twice).
        """
        size = self._allocated.pop(offset, None)
        if size is None:
            raise ArgumentError(
                f"Arena.free: no allocated block at offset {offset} "
                "(double free, or an offset this arena never returned)"
            )
        i = bisect.bisect_left(self._free_offsets, offset)
        # merge with the following block
        if i < len(self._free_offsets) and self._free_offsets[i] == offset + size:
            size += self._free_sizes[i]
            del self._free_offsets[i]
            del self._free_sizes[i]
        # merge with the preceding block
        if i > 0 and self._free_offsets[i - 1] + self._free_sizes[i - 1] == offset:
            self._free_sizes[i - 1] += size
        else:
            self._free_offsets.insert(i, offset)
            self._free_sizes.insert(i, size)

    def allocated(self) -> dict[int, int]:
        """A copy of the allocated blocks, offset -> bytes.

        Returns
        -------
        dict of int to int
            Offset to bytes of every allocated block.
        """
        return dict(self._allocated)

    def free_blocks(self) -> list[tuple[int, int]]:
        """The free blocks as ``(offset, nbytes)``, sorted by offset.

        Returns
        -------
        list of tuple of int
            ``(offset, nbytes)`` of every free block, by offset.
        """
        return list(zip(self._free_offsets, self._free_sizes, strict=True))

    def stats(self) -> ArenaStats:
        """Current usage figures.

        Returns
        -------
        ArenaStats
            A snapshot of the figures now.
        """
        free_total = sum(self._free_sizes)
        return ArenaStats(
            capacity=self.capacity,
            used=self.capacity - free_total,
            free_total=free_total,
            largest_free=max(self._free_sizes, default=0),
            num_allocated=len(self._allocated),
            num_free_blocks=len(self._free_sizes),
        )
