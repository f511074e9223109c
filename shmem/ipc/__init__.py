"""IPC buffer descriptors: export a buffer from one process, import the same memory in another.

>>> buf = shmem.ipc.allocate((1024,), "float32")      # memfd-backed, exportable
>>> desc = shmem.ipc.export(buf)                        # small; str(desc) for a command line
>>> other = shmem.ipc.import_(str(desc))               # in another process of the same user
>>> other.array[:4]                                     # the same memory, zero-copy

The exporting process serves the file descriptor over a Unix socket (``shmem.ipc.service``) after
checking the client's uid and the descriptor's token. Host memory is a ``memfd``: mappings
stay valid while anyone holds them, even after the exporter closes its handle or exits (new
imports then fail with :class:`~shmem.ExporterGoneError`). On a GPU the memory comes from a
cuda.core ``DeviceMemoryResource`` with IPC enabled (``shmem.ipc._cuda_ipc``).
"""

from __future__ import annotations

from .buffers import ImportedBuffer, IpcBuffer, allocate, export, import_
from .descriptor import IpcDescriptor
from .registry import Published, list_published, lookup, publish
from .resources import IpcHostMemoryResource  # importing it lends IPC to the device layer
from .service import ExporterGoneError, IpcPermissionError

__all__ = [
    "ExporterGoneError",
    "ImportedBuffer",
    "IpcBuffer",
    "IpcDescriptor",
    "IpcHostMemoryResource",
    "IpcPermissionError",
    "Published",
    "allocate",
    "export",
    "import_",
    "list_published",
    "lookup",
    "publish",
]
