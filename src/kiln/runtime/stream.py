"""dmlc-core stream encoding (``include/dmlc/serializer.h``): a writer and a bounds-checked reader.

All little-endian. ``u64``/``i32``/POD: raw bytes; ``string``: ``u64 len`` + bytes (no NUL);
``vector<POD>``: ``u64 count`` + elements; ``vector<string>``: ``u64 count`` + strings
(docs/formats.md §1). The reader checks every length against the bytes that remain *before*
allocating anything, so a corrupt length raises :class:`ModuleLoadError` instead of allocating
gigabytes or reading past the end.
"""

from __future__ import annotations

import struct

import numpy as np

from kiln.errors import ModuleLoadError

_U64 = struct.Struct("<Q")
_I64 = struct.Struct("<q")
_I32 = struct.Struct("<i")
_U32 = struct.Struct("<I")


class StreamWriter:
    """Accumulates encoded parts; :meth:`getvalue` joins them once (large arrays are not copied
    until then)."""

    def __init__(self) -> None:
        self._parts: list[bytes | memoryview] = []
        self._size = 0

    def raw(self, data: bytes | bytearray | memoryview) -> None:
        self._parts.append(data if isinstance(data, (bytes, memoryview)) else bytes(data))
        self._size += len(data) if not isinstance(data, memoryview) else data.nbytes

    def u64(self, v: int) -> None:
        self.raw(_U64.pack(v))

    def i64(self, v: int) -> None:
        self.raw(_I64.pack(v))

    def i32(self, v: int) -> None:
        self.raw(_I32.pack(v))

    def u32(self, v: int) -> None:
        self.raw(_U32.pack(v))

    def string(self, s: str | bytes | memoryview) -> None:
        data = s.encode() if isinstance(s, str) else s
        self.u64(len(data) if not isinstance(data, memoryview) else data.nbytes)
        self.raw(data)

    def vec_u64(self, values: list[int]) -> None:
        self.u64(len(values))
        self.raw(np.asarray(values, dtype="<u8").tobytes())

    def vec_str(self, values: list[str]) -> None:
        self.u64(len(values))
        for v in values:
            self.string(v)

    def __len__(self) -> int:
        return self._size

    def getvalue(self, length_prefix: bool = False) -> bytes:
        """The encoded bytes; with ``length_prefix``, preceded by their ``u64`` size (one join,
        so a large payload is copied once)."""
        parts = self._parts
        if length_prefix:
            parts = [_U64.pack(self._size), *parts]
        return b"".join(parts)


class StreamReader:
    """Reads the encoding back from a bytes-like object; every read is bounds-checked.

    Parameters
    ----------
    data : bytes-like
    what : str
        Names the thing being read in error messages ("params blob", "__tvm_dev_mblob", ...).

    Raises
    ------
    ModuleLoadError
        On any read past the end ("truncated") or an implausible length ("corrupt").
    """

    def __init__(self, data: bytes | bytearray | memoryview, what: str):
        self._buf = memoryview(data).cast("B")
        self.pos = 0
        self.what = what

    @property
    def remaining(self) -> int:
        return len(self._buf) - self.pos

    def error(self, msg: str) -> ModuleLoadError:
        return ModuleLoadError(f"{self.what}: {msg} (at byte offset {self.pos})")

    def _take(self, n: int, field: str) -> memoryview:
        if n < 0 or n > self.remaining:
            raise self.error(f"truncated or corrupt: {field} needs {n} bytes but only "
                             f"{self.remaining} remain")
        out = self._buf[self.pos:self.pos + n]
        self.pos += n
        return out

    def raw(self, n: int, field: str = "data") -> memoryview:
        """``n`` raw bytes as a zero-copy view."""
        return self._take(n, field)

    def u64(self, field: str = "u64") -> int:
        return _U64.unpack(self._take(8, field))[0]

    def i64(self, field: str = "i64") -> int:
        return _I64.unpack(self._take(8, field))[0]

    def i32(self, field: str = "i32") -> int:
        return _I32.unpack(self._take(4, field))[0]

    def u32(self, field: str = "u32") -> int:
        return _U32.unpack(self._take(4, field))[0]

    def count(self, elem_size: int, field: str) -> int:
        """A ``u64`` element count, checked so ``count * elem_size`` bytes can still follow."""
        n = self.u64(field)
        if n * elem_size > self.remaining:
            raise self.error(f"corrupt {field}: {n} elements of >= {elem_size} bytes cannot fit "
                             f"in the {self.remaining} bytes that remain")
        return n

    def bytes_(self, field: str = "string") -> memoryview:
        """A length-prefixed byte string (zero-copy view)."""
        n = self.u64(field + " length")
        return self._take(n, field)

    def string(self, field: str = "string") -> str:
        data = self.bytes_(field)
        try:
            return str(data, "utf-8")
        except UnicodeDecodeError:
            raise self.error(f"corrupt {field}: not UTF-8") from None

    def vec_u64(self, field: str = "vector<u64>") -> list[int]:
        n = self.count(8, field)
        # tolist() of the u64 array gives Python ints: no wrap to negative above 2**63
        return np.frombuffer(self._take(8 * n, field), dtype="<u8").tolist()

    def vec_str(self, field: str = "vector<string>") -> list[str]:
        n = self.count(8, field)  # each string has at least its 8-byte length
        return [self.string(f"{field}[{i}]") for i in range(n)]
