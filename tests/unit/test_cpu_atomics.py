"""The processor atomics the one-node host heap uses (shmem.backends._cpu_atomics)."""

from __future__ import annotations

import mmap
import os

import numpy as np
import pytest

from shmem.backends import _cpu_atomics

ATOMICS = _cpu_atomics.load()
pytestmark = pytest.mark.skipif(ATOMICS is None, reason="libatomic is not installed")


@pytest.mark.parametrize("dtype", ["int32", "int64", "uint32", "uint64"])
def test_integer_ops_return_the_old_value_and_wrap_like_c(dtype: str) -> None:
    assert ATOMICS is not None
    dt = np.dtype(dtype)
    word = np.zeros(2, dt)
    addr = word.ctypes.data + dt.itemsize  # the second element: an offset, not the base
    assert ATOMICS.fetch_op(addr, 5, dt, "add") == 0
    assert ATOMICS.fetch_op(addr, -7, dt, "add") == 5
    expect = np.array([-2]).astype(dt)[0]  # C semantics: unsigned wraps
    assert word[1] == expect and word[0] == 0
    assert ATOMICS.fetch_op(addr, 0b1100, dt, "set") == expect
    assert ATOMICS.fetch_op(addr, 0b1010, dt, "and") == 0b1100
    assert ATOMICS.fetch_op(addr, 0b0001, dt, "or") == 0b1000
    assert ATOMICS.fetch_op(addr, 0b1111, dt, "xor") == 0b1001
    assert ATOMICS.fetch_op(addr, 0, dt, "fetch") == 0b0110
    assert ATOMICS.compare_swap(addr, 1, 9, dt) == 0b0110 and word[1] == 0b0110  # no swap
    assert ATOMICS.compare_swap(addr, 0b0110, 9, dt) == 0b0110 and word[1] == 9
    assert type(ATOMICS.fetch_op(addr, 0, dt, "fetch")) is dt.type


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_float_fetch_and_set_move_the_bits(dtype: str) -> None:
    assert ATOMICS is not None
    dt = np.dtype(dtype)
    word = np.array([1.5], dt)
    assert ATOMICS.fetch_op(word.ctypes.data, -0.25, dt, "set") == dt.type(1.5)
    assert ATOMICS.fetch_op(word.ctypes.data, 0, dt, "fetch") == dt.type(-0.25)
    assert word[0] == dt.type(-0.25)


def test_concurrent_adds_from_processes_are_not_lost() -> None:
    """Four processes add to one word of shared memory: every add lands (plain loads and
    stores would lose some)."""
    assert ATOMICS is not None
    shared = mmap.mmap(-1, 4096)  # anonymous and shared: children write the same page
    counter = np.frombuffer(shared, np.int64, count=1)
    addr, dt = counter.ctypes.data, counter.dtype
    children = []
    for _ in range(4):
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            code = 0
            try:
                for _ in range(20000):
                    ATOMICS.fetch_op(addr, 1, dt, "add")
            except BaseException:
                code = 1
            os._exit(code)
        children.append(pid)
    for pid in children:
        assert os.waitpid(pid, 0)[1] == 0
    assert counter[0] == 80000
    del counter
    shared.close()
