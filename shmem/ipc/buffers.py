"""Exportable memory: :func:`allocate` it, :func:`export` a descriptor, :func:`import_` it
in another process (see :mod:`shmem.ipc`)."""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import os
import socket
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from ..device.devices import Device
from ..device.memory import Buffer
from ..dtypes import DTypeLike, ShapeLike, as_dtype, dtype_name
from ..errors import ArgumentError, DescriptorError, ShmemStateError
from .descriptor import IpcDescriptor
from .service import IpcPermissionError, Server, request

if TYPE_CHECKING:
    from ..device.context import DeviceContext

__all__ = ["ImportedBuffer", "IpcBuffer", "allocate", "export", "import_"]


def _shape(shape: Any) -> tuple[int, ...]:
    dims = (shape,) if isinstance(shape, int) else tuple(shape)
    if any(isinstance(d, bool) or not isinstance(d, int) or d < 0 for d in dims):
        raise ArgumentError(f"allocate: invalid shape (got {shape!r}; expected ints >= 0)")
    return dims


class _Mapping:
    """An fd and its shared mapping; ``array`` views it as ``dtype``/``shape``."""

    def __init__(
        self,
        fd: int,
        nbytes: int,
        dtype: np.dtype[Any],
        shape: tuple[int, ...],
        writable: bool = True,
    ) -> None:
        self.fd = fd
        self.mm = mmap.mmap(
            fd,
            max(nbytes, 1),
            mmap.MAP_SHARED,
            mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0),
        )
        self.array: np.ndarray[Any, Any] = np.frombuffer(
            self.mm, dtype=dtype, count=nbytes // dtype.itemsize
        ).reshape(shape)

    def close(self) -> None:
        self.array = np.empty(0)
        with contextlib.suppress(BufferError):  # views still alive: GC unmaps later
            self.mm.close()
        with contextlib.suppress(OSError):
            os.close(self.fd)
        self.fd = -1


class _Memory(Buffer):
    """What exported and imported buffers share: a :class:`~shmem.Buffer` over a host
    mapping or a GPU buffer, so every Buffer accessor, copy and DLPack export works on them."""

    _label = "buffer"

    def __init__(self, mapping: _Mapping | None, gpu: Any) -> None:
        self._mapping = mapping
        self._gpu = gpu
        if mapping is not None:
            self._adopt(Buffer._host(mapping.array, keepalive=mapping))
        else:
            self._adopt(cast(Buffer, gpu.buffer()))

    @property
    def array(self) -> np.ndarray[Any, Any]:
        """This process's numpy view (host memory; the same as ``to_numpy()`` there)."""
        if self._closed or self._mapping is None:
            raise ShmemStateError(f"{self._label}.array: closed, or device memory (use .buffer)")
        return self._mapping.array

    @property
    def buffer(self) -> Buffer:
        """The memory as a :class:`~shmem.Buffer` (this object: it is one)."""
        return self

    def __repr__(self) -> str:
        return super().__repr__().replace("Buffer(", f"{self._label}(", 1)

    def _release(self) -> None:
        Buffer.close(self)
        if self._mapping is not None:
            self._mapping.close()
        if self._gpu is not None:
            self._gpu.close()

    def close(self, stream: DeviceContext | None = None) -> None:
        """Unmap this process's view (after ``stream``'s queued work when given; closing
        twice is a no-op).

        Parameters
        ----------
        stream : DeviceContext, optional
            A stream whose queued work must finish before the memory is unmapped.
        """
        if self._closed:
            return
        if stream is not None:
            stream.synchronize()
        self._release()

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class IpcBuffer(_Memory):
    """An exportable buffer owned by this process (from :func:`allocate`).

    Not constructed directly: :func:`allocate` makes them.

    Parameters
    ----------
    kind : {"host", "cuda"}
        Where the memory lives.
    dtype : numpy.dtype
        The element type.
    shape : tuple of int
        The array shape.
    nbytes : int
        Bytes of memory.
    mapping : optional
        The host mapping (host memory).
    gpu : optional
        The GPU allocation (device memory).
    """

    _label = "IpcBuffer"

    def __init__(
        self,
        kind: str,
        dtype: np.dtype[Any],
        shape: tuple[int, ...],
        nbytes: int,
        mapping: _Mapping | None = None,
        gpu: Any = None,
    ) -> None:
        super().__init__(mapping, gpu)
        self.kind = kind
        self._exports: list[str] = []
        self._published: list[Path] = []

    def _fd(self) -> int:
        if self._mapping is not None:
            return self._mapping.fd
        return int(self._gpu.fd())

    def close(self, stream: DeviceContext | None = None) -> None:
        """Stop serving new imports and drop this process's handle (after ``stream``'s queued
        work when given). Existing importers keep their mappings.

        Parameters
        ----------
        stream : DeviceContext, optional
            A stream whose queued work must finish first.
        """
        if self._closed:
            return
        if stream is not None:
            stream.synchronize()
        server = Server.get()
        for buffer_id in self._exports:
            server.unregister(buffer_id)
        for path in self._published:
            with contextlib.suppress(OSError):
                path.unlink()
        self._release()


class ImportedBuffer(_Memory):
    """Memory imported from another process; close it when done.

    Not constructed directly: :func:`import_` makes them.

    Parameters
    ----------
    desc : IpcDescriptor
        The descriptor it was imported from (``descriptor`` keeps it).
    mapping : optional
        The host mapping (host memory).
    gpu : optional
        The imported GPU allocation (device memory).
    """

    _label = "ImportedBuffer"

    def __init__(
        self, desc: IpcDescriptor, mapping: _Mapping | None = None, gpu: Any = None
    ) -> None:
        super().__init__(mapping, gpu)
        self.descriptor = desc


def allocate(
    shape: ShapeLike, dtype: DTypeLike = "uint8", device: Device | None = None
) -> IpcBuffer:
    """An exportable buffer: host memory from ``memfd_create``, or GPU memory from a cuda.core
    IPC-enabled memory resource when ``device`` is a GPU.

    Parameters
    ----------
    shape : int or tuple of int
        The array shape (dimensions >= 0).
    dtype : dtype-like, optional
        A supported dtype (default ``"uint8"``).
    device : Device, optional
        A GPU for device memory; host memory when None or a CPU.

    Returns
    -------
    IpcBuffer
        The buffer (host memory starts zero-filled), ready for :func:`export` or :func:`publish`.

    Raises
    ------
    ArgumentError
        A shape that is not non-negative ints, or an unsupported dtype.
    """
    dt = as_dtype(dtype, "allocate")
    dims = _shape(shape)
    nbytes = int(np.prod(dims, dtype=np.int64)) * dt.itemsize
    if device is not None and not getattr(device, "is_host", True):
        from . import _cuda_ipc

        return IpcBuffer("cuda", dt, dims, nbytes, gpu=_cuda_ipc.allocate(device, nbytes, dt, dims))
    fd = os.memfd_create("shmem-ipc", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, max(nbytes, 1))
    # importers map this memory: sealed against resizing, so one of them cannot shrink it
    # under the exporter (whose next access would be a SIGBUS)
    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
    return IpcBuffer("host", dt, dims, nbytes, mapping=_Mapping(fd, nbytes, dt, dims))


def export(buf: IpcBuffer) -> IpcDescriptor:
    """A descriptor for ``buf`` (starts this process's IPC service on first use).

    Parameters
    ----------
    buf : IpcBuffer
        A buffer from :func:`allocate`, open.

    Returns
    -------
    IpcDescriptor
        What an importer needs: pass it (or ``str(desc)``) to :func:`import_` in another process.

    Raises
    ------
    ArgumentError
        ``buf`` is not an :class:`IpcBuffer`.
    ShmemStateError
        ``buf`` is closed.
    """
    if not isinstance(buf, IpcBuffer):
        raise ArgumentError(
            f"export: expected an IpcBuffer from shmem.ipc.allocate (got {type(buf).__name__})"
        )
    if buf.closed:
        raise ShmemStateError("export: the buffer is closed")
    server = Server.get()
    extra = buf._gpu.export_extra() if buf._gpu is not None else b""
    buffer_id, token = server.register(buf._fd(), extra)
    buf._exports.append(buffer_id)
    return IpcDescriptor(
        kind=buf.kind,
        nbytes=buf.nbytes,
        dtype=dtype_name(buf.dtype),
        shape=buf.shape,
        pid=os.getpid(),
        uid=os.getuid(),
        host=socket.gethostname(),
        token=token,
        address=server.address,
        buffer_id=buffer_id,
        device=-1 if buf._gpu is None else int(buf._gpu.device_id),
    )


def import_(desc: IpcDescriptor | str | bytes) -> ImportedBuffer:
    """Map the memory a descriptor names (a descriptor, or its string or bytes form).

    Parameters
    ----------
    desc : IpcDescriptor or str or bytes
        The descriptor :func:`export` returned, or its string or bytes form.

    Returns
    -------
    ImportedBuffer
        The same memory, mapped into this process.

    Raises
    ------
    DescriptorError
        Malformed, corrupted, wrong version, oversized, another host, a token the exporter
        rejects, a buffer its exporter has closed ("unknown buffer"), or memory smaller
        than the descriptor says. Nothing is mapped then.
    IpcPermissionError
        Another user's descriptor or exporter.
    ExporterGoneError
        The exporter has exited.
    """
    d = desc if isinstance(desc, IpcDescriptor) else IpcDescriptor.parse(desc)
    if d.host != socket.gethostname():
        raise DescriptorError(
            f"import_: the buffer lives on host {d.host!r} (expected this host, "
            f"{socket.gethostname()!r}: IPC does not cross machines)"
        )
    if d.uid != os.getuid():
        raise IpcPermissionError(
            f"import_: the descriptor belongs to uid {d.uid} (expected this process's uid "
            f"{os.getuid()})"
        )
    fd, extra = request(d.address, d.buffer_id, d.token, d.pid)
    try:
        if d.kind == "cuda":
            from . import _cuda_ipc

            return ImportedBuffer(d, gpu=_cuda_ipc.import_(d, fd, extra))
        size = os.fstat(fd).st_size
        if size < max(d.nbytes, 1):
            raise DescriptorError(
                f"import_: the memory is smaller than the descriptor says (got {size} bytes; "
                f"expected {d.nbytes})"
            )
        return ImportedBuffer(
            d, mapping=_Mapping(fd, d.nbytes, as_dtype(d.dtype, "import_"), d.shape)
        )
    except BaseException:
        with contextlib.suppress(OSError):
            os.close(fd)
        raise


# -- the named registry of a node ----------------------------------------------------------
