"""``collectives._replay.stream_copy`` (a copy with streaming stores) and
``collectives.ops.stage_copy``, which stages a large numpy input with it: the bytes land
exactly, at every length and alignment, and bad arguments raise clearly."""

from __future__ import annotations

import importlib
from typing import Any

import numpy as np
import pytest

from collectives import ops, replay

if replay.replay_status() != "C":
    pytest.skip(replay.replay_status(), allow_module_level=True)
stream_copy: Any = importlib.import_module("collectives._replay").stream_copy


@pytest.mark.parametrize("length", [0, 1, 15, 16, 63, 64, 65, 200, 4099, (1 << 20) + 13])
def test_every_length_and_alignment_lands_exactly(length: int) -> None:
    rng = np.random.default_rng(length)
    src_buf = rng.integers(0, 256, length + 64, dtype=np.uint8)
    for d in (0, 1, 7, 8, 15, 16, 33):  # the destination's misalignment
        for s in (0, 3):
            dst_buf = np.full(length + 64, 0xAB, np.uint8)
            stream_copy(dst_buf[d : d + length], src_buf[s : s + length])
            assert np.array_equal(dst_buf[d : d + length], src_buf[s : s + length]), (d, s)
            assert (dst_buf[:d] == 0xAB).all() and (dst_buf[d + length :] == 0xAB).all()


def test_bad_arguments_raise_clearly() -> None:
    a, b = np.zeros(64, np.uint8), np.zeros(64, np.uint8)
    with pytest.raises(ValueError, match="dst has 64 bytes, src 63"):
        stream_copy(a, b[:63])
    with pytest.raises(ValueError, match="overlap"):
        stream_copy(a[8:40], a[:32])
    with pytest.raises(TypeError, match="two buffers"):
        stream_copy(a)
    readonly = np.zeros(64, np.uint8)
    readonly.flags.writeable = False
    with pytest.raises((BufferError, ValueError), match="read-only"):
        stream_copy(readonly, b)
    with pytest.raises((BufferError, ValueError)):
        stream_copy(a[::2], b[:32])  # not contiguous
    with pytest.raises(TypeError):
        stream_copy(a, 5)


def test_a_stage_from_stream_min_is_streamed(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []

    def spy(dst: Any, src: Any) -> None:
        calls.append(dst.nbytes)
        stream_copy(dst, src)

    monkeypatch.setattr(ops, "_c_stream_copy", spy)
    monkeypatch.setattr(ops, "STREAM_MIN", 4096)
    x = np.arange(2048, dtype=np.float32)
    stage = np.empty_like(x)
    ops.stage_copy(stage[:1000], x[:1000])  # 4000 bytes: below, a plain copy
    ops.stage_copy(stage, x)
    assert calls == [8192] and np.array_equal(stage, x)
    strided = np.arange(4096, dtype=np.float32)[::2]  # not contiguous: np.copyto
    ops.stage_copy(stage, strided)
    wide = np.arange(2048, dtype=np.float64)  # another dtype: np.copyto's cast
    ops.stage_copy(stage, wide)
    assert calls == [8192] and np.array_equal(stage, wide.astype(np.float32))
