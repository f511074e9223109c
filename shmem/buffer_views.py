"""Typed views of a :class:`~shmem.SHMEMBuffer`'s allocation: the same bytes as another dtype
(:meth:`~ViewMethods.view`) or rows of the first axis (``buf[a:b]``, ``buf[i]``), each a
symmetric buffer itself that lives as long as the allocation."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from .dtypes import DTypeLike, as_dtype, dtype_name
from .errors import ArgumentError

if TYPE_CHECKING:
    from .buffer import SHMEMBuffer
    from .world import World

__all__ = ["ViewMethods"]


class ViewMethods:
    """Mixed into :class:`~shmem.SHMEMBuffer` (see the module docstring)."""

    if TYPE_CHECKING:
        _world: World
        _dtype: np.dtype[Any]
        _shape: tuple[int, ...]
        _offset: int
        _root: SHMEMBuffer | None
        _views: Any

        def _live(self, where: str) -> None: ...

    __iter__ = None  # not a sequence of views: iterate over local() or to_numpy()

    def view(self, dtype: DTypeLike) -> SHMEMBuffer:
        """The same bytes as ``dtype``, a symmetric buffer itself (as numpy's ``ndarray.view``:
        the last axis rescaled). Everything works on it as on an allocation: put/get and
        their non-blocking and strided forms, atomics, waits and tests, signals, locks; it
        lives as long as the allocation (closing that closes it; it is not closed itself).

        Parameters
        ----------
        dtype : dtype-like
            A supported dtype.

        Returns
        -------
        SHMEMBuffer
            The view (not closed by itself).

        Raises
        ------
        ArgumentError
            The last axis' bytes are not a multiple of ``dtype``'s size, or the view's start
            is not aligned to it.
        """
        self._live("view")
        dt = as_dtype(dtype, "SHMEMBuffer.view")
        if not self._shape:
            if dt.itemsize != self._dtype.itemsize:
                raise ArgumentError(
                    f"SHMEMBuffer.view: a 0-d buffer keeps its item size (got "
                    f"{dtype_name(dt)}; expected a dtype of {self._dtype.itemsize} bytes)"
                )
            return self._child("view", self._offset, (), dt)
        last = self._shape[-1] * self._dtype.itemsize
        if last % dt.itemsize:
            raise ArgumentError(
                f"SHMEMBuffer.view: the last axis ({last} bytes) is not a whole number of "
                f"{dtype_name(dt)} items (got {dtype_name(dt)}; expected a dtype whose size "
                f"divides {last})"
            )
        return self._child("view", self._offset, (*self._shape[:-1], last // dt.itemsize), dt)

    def __getitem__(self, key: int | slice) -> SHMEMBuffer:
        """Rows of the first axis as a symmetric buffer: ``buf[a:b]`` (contiguous: step 1) or
        ``buf[i]``; a view like :meth:`view`'s."""
        self._live("__getitem__")
        if not self._shape:
            raise ArgumentError("SHMEMBuffer[...]: a 0-d buffer has no axis to index")
        n = self._shape[0]
        if isinstance(key, slice):
            start, stop, step = key.indices(n)
            if step != 1:
                raise ArgumentError(
                    f"SHMEMBuffer[{key.start}:{key.stop}:{key.step}]: only contiguous slices "
                    f"(got step {step}; expected 1: strided transfers are iput/iget's)"
                )
            shape: tuple[int, ...] = (max(stop - start, 0), *self._shape[1:])
        elif isinstance(key, int | np.integer) and not isinstance(key, bool):
            start = int(key) + n if key < 0 else int(key)
            if not 0 <= start < n:
                raise ArgumentError(
                    f"SHMEMBuffer[{key}]: index out of range (got {key}; expected "
                    f"{-n} <= index < {n})"
                )
            shape = self._shape[1:]
        else:
            raise ArgumentError(
                f"SHMEMBuffer[...]: invalid index (got {key!r}; expected an int or a slice of "
                "the first axis)"
            )
        row = math.prod(self._shape[1:]) * self._dtype.itemsize
        return self._child("__getitem__", self._offset + start * row, shape, self._dtype)

    def _child(
        self, where: str, offset: int, shape: tuple[int, ...], dtype: np.dtype[Any]
    ) -> SHMEMBuffer:
        if offset % dtype.itemsize:
            raise ArgumentError(
                f"SHMEMBuffer.{where}: the view would start at heap offset {offset}, not "
                f"aligned to {dtype_name(dtype)}'s {dtype.itemsize} bytes (got that start; "
                "expected a multiple of the item size)"
            )
        root = self._root or cast("SHMEMBuffer", self)
        child = type(root)(self._world, offset, shape, dtype, root=root)
        root._views.add(child)
        return child
