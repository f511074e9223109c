"""IPC descriptors: small, versioned, checksummed, and treated as untrusted input.

Wire format (bytes)::

    b"SHMI" | version (1 byte) | body length (2 bytes, big endian) | body | CRC-32 (4 bytes)

``body`` is UTF-8 JSON with exactly the fields of :class:`IpcDescriptor`, each type-checked
and range-checked. The string form is ``"shmipc1:" + base64url(bytes)`` (for command lines and
environment variables). Parsing never maps memory and raises only :class:`DescriptorError`.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import struct
import zlib
from dataclasses import asdict, dataclass
from typing import Any, NoReturn

from ..dtypes import SUPPORTED_DTYPES
from ..errors import DescriptorError

__all__ = ["MAX_DESCRIPTOR_BYTES", "VERSION", "IpcDescriptor"]

MAGIC = b"SHMI"
VERSION = 1
STRING_PREFIX = "shmipc1:"
MAX_DESCRIPTOR_BYTES = 2048
MAX_NBYTES = 1 << 46  # 64 TiB: larger is not a real buffer
KINDS = ("host", "cuda")
_HEADER = struct.Struct(">4sBH")
_TOKEN = re.compile(r"^[0-9a-f]{32}$")
_ID = re.compile(r"^[0-9a-f]{16}$")


@dataclass(frozen=True)
class IpcDescriptor:
    """Everything an importer needs to ask the exporter for a buffer.

    ``address`` is the exporter's Unix socket path; ``token`` a 128-bit secret the exporter
    checks (with the importer's uid) before it sends the file descriptor.

    Parameters
    ----------
    kind : {"host", "cuda"}
        Where the memory lives.
    nbytes : int
        Bytes of memory.
    dtype : str
        The element type's canonical name.
    shape : tuple of int
        The array shape.
    pid : int
        The exporting process.
    uid : int
        The exporter's user (an importer must be the same user).
    host : str
        The exporter's host name (IPC does not cross machines).
    token : str
        The secret the exporter checks.
    address : str
        The exporter's Unix socket path.
    buffer_id : str
        The buffer's id at the exporter.
    device : int
        The GPU's ordinal (-1 for host memory).
    """

    kind: str
    nbytes: int
    dtype: str
    shape: tuple[int, ...]
    pid: int
    uid: int
    host: str
    token: str
    address: str
    buffer_id: str
    device: int = -1

    # -- encoding ---------------------------------------------------------------------------

    def to_bytes(self) -> bytes:
        """The binary form: a versioned header, a JSON body and a CRC-32.

        Returns
        -------
        bytes
            What :meth:`parse` reads back.
        """
        body = json.dumps(
            {**asdict(self), "shape": list(self.shape)}, separators=(",", ":"), sort_keys=True
        ).encode()
        head = _HEADER.pack(MAGIC, VERSION, len(body))
        raw = head + body
        return raw + struct.pack(">I", zlib.crc32(raw))

    def to_string(self) -> str:
        """The printable form (``str(desc)``): the bytes in URL-safe base64 behind a prefix.

        Returns
        -------
        str
            One word, safe on a command line or in an environment variable.
        """
        return STRING_PREFIX + base64.urlsafe_b64encode(self.to_bytes()).decode().rstrip("=")

    def __str__(self) -> str:
        return self.to_string()

    def __array__(self, *args: object, **kwargs: object) -> NoReturn:
        """A descriptor names memory, it holds none: ``np.asarray(desc)`` would be a 0-d
        object array, so it raises instead."""
        raise TypeError(
            "IpcDescriptor: a descriptor is not an array (it names a buffer of shape "
            f"{self.shape} and dtype {self.dtype}; map it with shmem.ipc.import_(desc) and use "
            "the buffer's .array)"
        )

    # -- decoding (untrusted) ---------------------------------------------------------------

    @classmethod
    def parse(cls, data: bytes | bytearray | memoryview | str) -> IpcDescriptor:
        """Decode and validate a descriptor (bytes or its string form).

        Parameters
        ----------
        data : bytes or bytearray or memoryview or str
            :meth:`to_bytes`'s or :meth:`to_string`'s output.

        Returns
        -------
        IpcDescriptor
            The validated descriptor (nothing is mapped or contacted).

        Raises
        ------
        DescriptorError
            Truncated, corrupted, wrong version, oversized, or any field out of range.
        """
        if isinstance(data, str):
            raw = _from_string(data)
        elif isinstance(data, bytes | bytearray | memoryview):
            raw = bytes(data)
        else:
            raise DescriptorError(
                f"IpcDescriptor.parse: expected bytes or str (got {type(data).__name__})"
            )
        if len(raw) > MAX_DESCRIPTOR_BYTES:
            raise DescriptorError(
                f"IpcDescriptor.parse: oversized descriptor (got {len(raw)} bytes; expected at "
                f"most {MAX_DESCRIPTOR_BYTES})"
            )
        if len(raw) < _HEADER.size + 4:
            raise DescriptorError(
                f"IpcDescriptor.parse: truncated descriptor (got {len(raw)} bytes)"
            )
        magic, version, length = _HEADER.unpack_from(raw)
        if magic != MAGIC:
            raise DescriptorError("IpcDescriptor.parse: not a descriptor (bad magic)")
        if version != VERSION:
            raise DescriptorError(
                f"IpcDescriptor.parse: unsupported version (got {version}; expected {VERSION})"
            )
        if len(raw) != _HEADER.size + length + 4:
            raise DescriptorError(
                f"IpcDescriptor.parse: truncated or padded descriptor (got {len(raw)} bytes; "
                f"expected {_HEADER.size + length + 4})"
            )
        (crc,) = struct.unpack_from(">I", raw, len(raw) - 4)
        if zlib.crc32(raw[:-4]) != crc:
            raise DescriptorError("IpcDescriptor.parse: corrupted descriptor (checksum mismatch)")
        try:
            fields = json.loads(raw[_HEADER.size : -4].decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError, MemoryError):
            raise DescriptorError("IpcDescriptor.parse: corrupted body (not JSON)") from None
        return cls._checked(fields)

    @classmethod
    def _checked(cls, f: Any) -> IpcDescriptor:
        where = "IpcDescriptor.parse"
        expected = {
            "kind",
            "nbytes",
            "dtype",
            "shape",
            "pid",
            "uid",
            "host",
            "token",
            "address",
            "buffer_id",
            "device",
        }
        if not isinstance(f, dict) or set(f) != expected:
            got = sorted(f) if isinstance(f, dict) else type(f).__name__
            raise DescriptorError(f"{where}: wrong fields (got {got}; expected {sorted(expected)})")

        def integer(name: str, lo: int, hi: int) -> int:
            v = f[name]
            if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
                raise DescriptorError(f"{where}: invalid {name} (got {v!r}; expected {lo}..{hi})")
            return v

        def text(name: str, pattern: re.Pattern[str] | None = None, limit: int = 256) -> str:
            v = f[name]
            if not isinstance(v, str) or not v or len(v) > limit or "\0" in v:
                raise DescriptorError(f"{where}: invalid {name} (got {v!r:.60})")
            if pattern is not None and not pattern.match(v):
                raise DescriptorError(f"{where}: invalid {name} (got {v!r:.60})")
            return v

        kind = text("kind")
        if kind not in KINDS:
            raise DescriptorError(f"{where}: invalid kind (got {kind!r}; expected {list(KINDS)})")
        dtype = text("dtype")
        if dtype not in SUPPORTED_DTYPES:
            raise DescriptorError(f"{where}: invalid dtype (got {dtype!r})")
        shape = f["shape"]
        if (
            not isinstance(shape, list)
            or len(shape) > 16
            or any(
                isinstance(d, bool) or not isinstance(d, int) or not 0 <= d <= MAX_NBYTES
                for d in shape
            )
        ):
            raise DescriptorError(f"{where}: invalid shape (got {shape!r:.80})")
        nbytes = integer("nbytes", 0, MAX_NBYTES)
        count = 1
        for d in shape:
            count *= d
        if count * SUPPORTED_DTYPES[dtype].itemsize != nbytes:
            raise DescriptorError(
                f"{where}: shape and dtype do not match nbytes (got {shape} of {dtype} and "
                f"{nbytes} bytes)"
            )
        address = text("address", limit=107)  # sun_path is 108 bytes
        if not address.startswith("/"):
            raise DescriptorError(f"{where}: invalid address (got {address!r:.60})")
        return cls(
            kind=kind,
            nbytes=nbytes,
            dtype=dtype,
            shape=tuple(shape),
            pid=integer("pid", 1, 1 << 22),
            uid=integer("uid", 0, (1 << 32) - 1),
            host=text("host"),
            token=text("token", _TOKEN),
            address=address,
            buffer_id=text("buffer_id", _ID),
            device=integer("device", -1, 1 << 16),
        )


def _from_string(text: str) -> bytes:
    if not text.startswith(STRING_PREFIX):
        raise DescriptorError(
            f"IpcDescriptor.parse: not a descriptor string (expected the prefix {STRING_PREFIX!r})"
        )
    body = text[len(STRING_PREFIX) :].strip()
    if len(body) > MAX_DESCRIPTOR_BYTES * 2:
        raise DescriptorError("IpcDescriptor.parse: oversized descriptor string")
    try:
        padded = (body + "=" * (-len(body) % 4)).encode("ascii")
        return base64.b64decode(padded, altchars=b"-_", validate=True)
    except (binascii.Error, ValueError):
        raise DescriptorError(
            "IpcDescriptor.parse: corrupted descriptor string (not base64)"
        ) from None
