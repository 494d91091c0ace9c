"""The params blob (``save_param_dict`` / ``load_param_dict``) and the NDArray stream format.

TVM's ``src/runtime/file_utils.cc`` (``SaveParams``) and ``src/runtime/ndarray.cc``
(``SaveDLTensor``); docs/formats.md §5::

    u64 0xF7E58D4F05049CB7 | u64 0 | vec<string> names | u64 count |
      count × NDArray := u64 0xDD5E40F096B4A13F | u64 0 | DLDevice(cpu,0) | i32 ndim |
                         DLDataType | i64 shape[ndim] | i64 nbytes | bytes
"""

from __future__ import annotations

import struct
from collections.abc import Mapping

import numpy as np

from kiln.errors import KilnError, ShapeError
from kiln.runtime import c_types as C
from kiln.runtime.ndarray import MAX_NDIM, NDArray, array, checked_nbytes, empty
from kiln.runtime.stream import StreamReader, StreamWriter

PARAMS_MAGIC = 0xF7E58D4F05049CB7  # kTVMNDArrayListMagic
NDARRAY_MAGIC = 0xDD5E40F096B4A13F  # kTVMNDArrayMagic


def write_ndarray(w: StreamWriter, value: np.ndarray | NDArray) -> None:
    """Append one tensor in ``SaveDLTensor`` format (data written without an extra copy)."""
    # (np.ascontiguousarray would turn a 0-d array into 1-d)
    arr = value._arr if isinstance(value, NDArray) else np.asarray(value)
    if not arr.flags.c_contiguous:
        arr = arr.copy(order="C")
    code, bits, lanes = C.dl_dtype(arr.dtype)
    w.u64(NDARRAY_MAGIC)
    w.u64(0)
    w.raw(struct.pack("<iiiBBH", C.kDLCPU, 0, arr.ndim, code, bits, lanes))
    if arr.ndim:
        w.raw(np.asarray(arr.shape, dtype="<i8").tobytes())
    w.i64(arr.nbytes)
    if arr.dtype.byteorder == ">":
        arr = arr.astype(arr.dtype.newbyteorder("<"))
    w.raw(arr.reshape(-1).view(np.uint8).data)


def read_ndarray(r: StreamReader, field: str = "NDArray") -> NDArray:
    """Read one tensor written by :func:`write_ndarray` (or TVM) into a new aligned NDArray.

    Raises
    ------
    ModuleLoadError
        Bad magic, unsupported dtype, inconsistent ``nbytes``, or truncated data.
    """
    magic = r.u64(f"{field} magic")
    if magic != NDARRAY_MAGIC:
        raise r.error(f"corrupt {field}: bad magic 0x{magic:016X} "
                      f"(expected 0x{NDARRAY_MAGIC:016X})")
    r.u64(f"{field} reserved")
    r.i32(f"{field} device_type")  # TVM loads any saved device's tensor onto the CPU
    r.i32(f"{field} device_id")
    ndim = r.i32(f"{field} ndim")
    if not 0 <= ndim <= MAX_NDIM:
        raise r.error(f"corrupt {field}: ndim {ndim}")
    code, bits, lanes = struct.unpack("<BBH", r.raw(4, f"{field} dtype"))
    try:
        dtype = C.dtype_from_dl(code, bits, lanes)
    except KilnError as err:
        raise r.error(f"corrupt {field}: {err}") from None
    shape = tuple(np.frombuffer(r.raw(8 * ndim, f"{field} shape"), dtype="<i8").tolist())
    try:  # Python ints: no overflow; nothing is allocated before the data check
        expect = checked_nbytes(shape, np.dtype(dtype).itemsize)
    except ShapeError as err:
        raise r.error(f"corrupt {field}: {err}") from None
    nbytes = r.i64(f"{field} nbytes")
    if nbytes != expect:
        raise r.error(f"corrupt {field}: nbytes {nbytes} but shape {shape} of {dtype} "
                      f"needs {expect}")
    data = r.raw(nbytes, f"{field} data")
    out = empty(shape, dtype)
    out._arr.reshape(-1).view(np.uint8)[:] = np.frombuffer(data, dtype=np.uint8)
    return out


def save_param_dict(params: Mapping[str, np.ndarray | NDArray]) -> bytes:
    """Serialize ``{name: tensor}`` to TVM's params blob (``tvm.runtime.save_param_dict``).

    Parameters
    ----------
    params : mapping of str to numpy array or NDArray
        Any supported dtype (see ``c_types.SUPPORTED_DTYPES``), any shape.

    Returns
    -------
    bytes

    Raises
    ------
    KilnError
        For an unsupported dtype.
    """
    w = StreamWriter()
    w.u64(PARAMS_MAGIC)
    w.u64(0)
    names = list(params)
    w.vec_str(names)
    w.u64(len(names))
    for name in names:
        value = params[name]
        write_ndarray(w, value if isinstance(value, NDArray) else np.asarray(value))
    return w.getvalue()


def _read_names(r: StreamReader) -> list[str]:
    """The params blob header: magic, reserved, names and the array count (checked)."""
    magic = r.u64("params magic")
    if magic != PARAMS_MAGIC:
        raise r.error(f"not a params blob: magic 0x{magic:016X} (expected 0x{PARAMS_MAGIC:016X})")
    r.u64("params reserved")
    names = r.vec_str("param names")
    count = r.u64("param count")
    if count != len(names):
        raise r.error(f"corrupt: {len(names)} param names but {count} arrays")
    return names


def read_param_dict(r: StreamReader) -> dict[str, NDArray]:
    """Read a params blob from ``r`` (see :func:`load_param_dict`)."""
    return {name: read_ndarray(r, f"param {name!r}") for name in _read_names(r)}


def load_param_dict(data: bytes | bytearray | memoryview) -> dict[str, NDArray]:
    """Deserialize a params blob written by :func:`save_param_dict` or TVM.

    Returns
    -------
    dict of str to NDArray
        Fresh aligned arrays, in the blob's order.

    Raises
    ------
    ModuleLoadError
        Bad magic numbers, unsupported dtypes, truncated or trailing data.
    """
    r = StreamReader(data, "params blob")
    out = read_param_dict(r)
    if r.remaining:
        raise r.error(f"{r.remaining} unexpected trailing bytes")
    return out


def to_ndarray_dict(params: Mapping[str, np.ndarray | NDArray] | None) -> dict[str, NDArray]:
    """Internal: aligned NDArray copies of ``params`` (NDArrays are kept as they are)."""
    return {k: v if isinstance(v, NDArray) else array(np.asarray(v))
            for k, v in (params or {}).items()}


def param_dict_names(data: bytes | bytearray | memoryview) -> list[str]:
    """The names in a params blob, without reading its arrays (all TVM's ``ShareParams`` reads).

    Raises
    ------
    ModuleLoadError
        Bad magic number, truncated header, or an array count that differs from the names.
    """
    return _read_names(StreamReader(data, "params blob"))
