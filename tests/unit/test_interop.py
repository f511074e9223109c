"""collectives.interop without a GPU: what counts as a GPU array, and the errors of the
conversions (their GPU paths run in the fakegpu tier, through the collectives and attention)."""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import pytest

import shmem
from collectives.interop import as_gpu_buffer, is_gpu_array, like, to_device_buffer, upload
from shmem import Buffer
from shmem.errors import AttentionArgumentError, GpuCollectiveError


class _OnDevice:
    """A DLPack producer that only reports its device (``kind``: DLPack's device type)."""

    def __init__(self, kind: int | None) -> None:
        self.kind = kind

    def __dlpack_device__(self) -> tuple[int, int]:
        if self.kind is None:
            raise RuntimeError("no device")
        return (self.kind, 0)


class _CudaArrayInterface:
    __cuda_array_interface__: ClassVar[dict[str, Any]] = {
        "shape": (1,),
        "typestr": "<f4",
        "data": (0, 0),
    }


def test_what_is_a_gpu_array() -> None:
    x = np.arange(4, dtype=np.float32)
    assert not is_gpu_array(x)
    assert not is_gpu_array(Buffer.from_numpy(x))  # a host Buffer
    assert is_gpu_array(_OnDevice(2))  # kDLCUDA
    assert not is_gpu_array(_OnDevice(1))  # kDLCPU
    assert not is_gpu_array(_OnDevice(None))  # a device query that fails
    assert is_gpu_array(_CudaArrayInterface())
    assert not is_gpu_array(object())


def test_upload_and_like_on_the_host_device() -> None:
    x = np.arange(12, dtype=np.float32).reshape(3, 4)[:, ::2]  # not contiguous
    buf = upload(x, shmem.CPU())
    assert buf.shape == (3, 2) and buf.is_contiguous
    np.testing.assert_array_equal(buf.to_numpy(), x)
    assert like(x, buf) is buf  # numpy is no library results are wrapped for
    assert like(buf, buf) is buf


def test_conversion_errors_keep_their_messages_and_classes() -> None:
    host = Buffer.from_numpy(np.zeros(4, np.float32))
    with pytest.raises(AttentionArgumentError, match=r"attention: q must be a GPU array \("):
        as_gpu_buffer(object(), "q", "attention", error=AttentionArgumentError)
    with pytest.raises(
        AttentionArgumentError, match="attention: k is on the host while another input is on a GPU"
    ):
        as_gpu_buffer(host, "k", "attention", error=AttentionArgumentError)
    with pytest.raises(shmem.errors.ArgumentError, match="lse is on the host"):
        as_gpu_buffer(host, "lse", "f", 4)  # the default class
    with pytest.raises(GpuCollectiveError, match="all_reduce: expected a GPU Buffer, SHMEMBuffer"):
        to_device_buffer(object(), shmem.CPU(), "all_reduce")
    with pytest.raises(
        GpuCollectiveError, match="all_reduce: out must be a contiguous array on this rank's GPU"
    ):
        to_device_buffer(host, shmem.CPU(), "all_reduce", output=True)
