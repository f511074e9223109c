"""Tensors and arrays of other libraries as device :class:`~shmem.Buffer`\\ s, and back.

The one place where the collectives and the attention functions turn what a caller passes
(torch or cupy tensors, numpy arrays, DLPack producers, :class:`~shmem.Buffer` and
:class:`~shmem.SHMEMBuffer`) into a contiguous Buffer on a device, and return results as the
caller's kind of array:

* :func:`is_gpu_array`: whether an object lives on a CUDA device (no copy, no conversion);
* :func:`to_device_buffer`: any input onto a given device, host data copied there (the GPU
  collectives' operands);
* :func:`as_gpu_buffer`: an array already on a GPU, zero-copy where it is contiguous, checked
  for alignment (the attention kernels' operands);
* :func:`upload`: a numpy array copied into a new device Buffer;
* :func:`like`: a result Buffer as the kind of array an input was (torch, cupy, or a Buffer).

Conversions go through DLPack (``Buffer.from_dlpack``): no library is imported here except to
wrap a result for a caller that passed that library's tensor.
"""

from __future__ import annotations

import importlib
from typing import Any, cast

import numpy as np

from shmem import Buffer, SHMEMBuffer
from shmem.errors import ArgumentError, GpuCollectiveError, ShmemError

__all__ = ["as_gpu_buffer", "is_gpu_array", "like", "to_device_buffer", "upload"]

_KDLCUDA = 2  # DLPack's device type of CUDA memory


def is_gpu_array(x: Any) -> bool:
    """Whether ``x`` lives on a CUDA device.

    Parameters
    ----------
    x : object
        Anything a caller may pass as an array.

    Returns
    -------
    bool
        True for a GPU :class:`~shmem.Buffer`, a DLPack producer on ``kDLCUDA`` or an object
        with ``__cuda_array_interface__``; False for numpy arrays, host Buffers and anything
        else (a ``__dlpack_device__`` that raises counts as not on a GPU).
    """
    if isinstance(x, np.ndarray):
        return False
    if isinstance(x, Buffer):
        return not x.is_host
    device = getattr(x, "__dlpack_device__", None)
    if device is not None:
        try:
            return int(device()[0]) == _KDLCUDA
        except Exception:
            return False
    return hasattr(x, "__cuda_array_interface__")


def upload(host: np.ndarray[Any, Any], device: Any) -> Buffer:
    """A new Buffer on ``device`` holding a copy of ``host`` (host-blocking).

    Parameters
    ----------
    host : numpy.ndarray
        The data; any layout (a C-contiguous copy is made where it is not).
    device : shmem.Accelerator
        The device the Buffer is allocated on.

    Returns
    -------
    shmem.Buffer
        A contiguous Buffer of ``host``'s dtype and shape on ``device``.
    """
    dev = Buffer(host.dtype, host.shape, device=device)
    dev.inplace_copy_from(Buffer.from_numpy(np.ascontiguousarray(host)))
    return dev


def to_device_buffer(
    x: Any,
    device: Any,
    where: str,
    output: bool = False,
    *,
    error: type[ShmemError] = GpuCollectiveError,
) -> Buffer:
    """``x`` as a contiguous Buffer on ``device``, host data copied there.

    Parameters
    ----------
    x : Buffer, SHMEMBuffer, DLPack producer or numpy.ndarray
        A Buffer; an SHMEMBuffer (its local part); a DLPack producer on the GPU (cupy,
        torch); or, for inputs only, a numpy array or a host Buffer, copied to ``device``.
    device : shmem.Accelerator
        The GPU the Buffer must be on (this rank's).
    where : str
        The calling function's name, which heads error messages.
    output : bool
        ``x`` is written to (an ``out=`` argument): it must already be a contiguous array on
        the GPU, since a copy would not reach the caller.
    error : type of ShmemError
        The class of the errors raised (default :class:`~shmem.errors.GpuCollectiveError`).

    Returns
    -------
    shmem.Buffer
        ``x`` itself where it already is a contiguous Buffer on ``device``; a view for
        SHMEMBuffers and DLPack producers; a contiguous copy of a non-contiguous GPU array
        (inputs); a new device Buffer for host data.

    Raises
    ------
    ShmemError
        Of class ``error``: ``x`` is none of the kinds above; it is an output that is on the
        host or not contiguous; or it is on another device than ``device``.
    """
    if isinstance(x, SHMEMBuffer):
        x = x.local()
    if isinstance(x, np.ndarray):
        return upload(x, device)
    if not isinstance(x, Buffer):
        try:
            x = Buffer.from_dlpack(x)
        except Exception as exc:
            raise error(
                f"{where}: expected a GPU Buffer, SHMEMBuffer, DLPack GPU array or numpy array "
                f"(got {type(x).__name__}: {exc})"
            ) from None
    if output and (x.is_host or not x.is_contiguous):
        raise error(
            f"{where}: out must be a contiguous array on this rank's GPU or a numpy array (got "
            f"a {'host' if x.is_host else 'non-contiguous'} Buffer)"
        )
    if x.is_host:
        host = x.to_numpy()
        dev = Buffer(host.dtype, host.shape, device=device)
        dev.inplace_copy_from(x)
        return dev
    if x.device != device:
        raise error(
            f"{where}: the array is on {x.device.label}, expected this rank's {device.label}"
        )
    if not x.is_contiguous:
        x = x.contiguous()
    return cast(Buffer, x)


def as_gpu_buffer(
    x: Any,
    name: str,
    where: str,
    align: int = 16,
    *,
    error: type[ShmemError] = ArgumentError,
) -> Buffer:
    """``x``, already on a GPU, as a contiguous GPU Buffer starting on an ``align``-byte boundary.

    Parameters
    ----------
    x : Buffer or DLPack producer
        A GPU Buffer or a DLPack producer on the GPU (torch, cupy). Nothing is copied to the
        GPU: host data is refused.
    name : str
        The argument's name in error messages (``"q"``).
    where : str
        The calling function's name, which heads error messages.
    align : int
        The alignment in bytes the Buffer's first element needs (16: the attention kernels'
        vector loads of rows; 4: scalar loads).
    error : type of ShmemError
        The class of the errors raised (default :class:`~shmem.errors.ArgumentError`).

    Returns
    -------
    shmem.Buffer
        ``x`` itself (zero-copy) where it is a contiguous Buffer; a view of a DLPack producer;
        a contiguous copy, on the same GPU, of a non-contiguous array.

    Raises
    ------
    ShmemError
        Of class ``error``: ``x`` is not an array DLPack can read, it is on the host, or it
        does not start on an ``align``-byte boundary.
    """
    buf = x if isinstance(x, Buffer) else None
    if buf is None:
        try:
            buf = Buffer.from_dlpack(x)
        except Exception as exc:
            raise error(
                f"{where}: {name} must be a GPU array (torch, cupy, DLPack or a GPU Buffer; got "
                f"{type(x).__name__}: {exc})"
            ) from None
    if buf.is_host:
        raise error(
            f"{where}: {name} is on the host while another input is on a GPU (expected every "
            "input on the same GPU)"
        )
    if not buf.is_contiguous:
        buf = buf.contiguous()
    if buf.unsafe_ptr() % align:
        raise error(
            f"{where}: {name} is not {align}-byte aligned (got address {buf.unsafe_ptr():#x}; "
            f"expected a tensor that starts on a {align}-byte boundary, e.g. "
            ".contiguous().clone())"
        )
    return buf


def like(template: Any, buf: Buffer) -> Any:
    """``buf`` as the kind of array ``template`` is.

    Parameters
    ----------
    template : object
        An input of the call: a torch or cupy tensor, or anything else.
    buf : shmem.Buffer
        A result.

    Returns
    -------
    torch.Tensor, cupy.ndarray or shmem.Buffer
        ``buf`` wrapped zero-copy (DLPack) by ``template``'s library where that is torch or
        cupy; ``buf`` itself otherwise.
    """
    module = type(template).__module__.split(".")[0]
    if module in ("torch", "cupy"):
        return importlib.import_module(module).from_dlpack(buf)
    return buf
