"""``NDArray``: a CPU tensor over 64-byte-aligned memory that exposes a ``DLTensor``.

TVM's ``python/tvm/runtime/ndarray.py`` (``tvm.nd.array``, ``tvm.nd.empty``). The memory is a
numpy buffer over-allocated by 64 bytes and sliced to the next 64-byte boundary, so generated
kernels may assume aligned data, and numpy owns (and frees) it. The ``DLTensor`` struct and its
shape array are built once and live as long as the NDArray, so ``handle`` can be handed to C.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from kiln.errors import KilnError, ShapeError
from kiln.runtime import c_types as C

ALIGNMENT = 64  # bytes; TVM's kAllocAlignment
#: limits on an array: numpy's dimensions (NPY_MAXDIMS) and bytes (the largest npy_intp, less
#: the alignment slack that ``empty`` over-allocates)
MAX_NDIM = 64
MAX_NBYTES = 2**63 - 1 - ALIGNMENT


class Device:
    """A DLPack device ``(device_type, device_id)``; Kiln's runtime runs on ``kDLCPU`` (1).

    Parameters
    ----------
    device_type : int
        DLPack ``DLDeviceType`` (1 = CPU).
    device_id : int
        Index of the device of that type.
    """

    _NAMES: ClassVar[dict[int, str]] = {C.kDLCPU: "cpu", C.kDLCUDA: "cuda", C.kDLExtDev: "ext_dev"}

    def __init__(self, device_type: int = C.kDLCPU, device_id: int = 0):
        self.device_type = int(device_type)
        self.device_id = int(device_id)

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, Device) and other.device_type == self.device_type
                and other.device_id == self.device_id)

    def __hash__(self) -> int:
        return hash((self.device_type, self.device_id))

    def __repr__(self) -> str:
        return f"{self._NAMES.get(self.device_type, f'device{self.device_type}')}({self.device_id})"

    def _check_cpu(self) -> None:
        if self.device_type != C.kDLCPU:
            raise KilnError(f"device {self!r} is not supported: the Kiln runtime runs on cpu only")


def cpu(dev_id: int = 0) -> Device:
    """The CPU device ``Device(kDLCPU, dev_id)`` (TVM's ``tvm.cpu``)."""
    return Device(C.kDLCPU, dev_id)


def checked_nbytes(shape: Sequence[int], itemsize: int) -> int:
    """Bytes of a compact array of ``shape``, checked against numpy's limits *before* anything
    is allocated (Python ints: no overflow).

    Raises
    ------
    ShapeError
        More than :data:`MAX_NDIM` dimensions, a negative dimension, or a size numpy cannot
        address: ``itemsize`` times the product of the nonzero dimensions above
        :data:`MAX_NBYTES` (numpy checks this even when another dimension is 0).

    Returns
    -------
    int
        ``itemsize`` times the product of all dimensions.
    """
    if len(shape) > MAX_NDIM:
        raise ShapeError(f"shape has {len(shape)} dimensions; at most {MAX_NDIM} are supported")
    nonzero = itemsize
    for s in shape:
        if s < 0:
            raise ShapeError(f"negative dimension in shape {tuple(shape)}")
        nonzero *= s or 1
        if nonzero > MAX_NBYTES:
            raise ShapeError(f"shape {tuple(shape)} of {itemsize}-byte elements is larger than "
                             f"any array can be ({MAX_NBYTES} bytes)")
    return 0 if 0 in shape else nonzero


def _aligned_empty(shape: tuple[int, ...], dtype: str) -> np.ndarray:
    nbytes = checked_nbytes(shape, np.dtype(dtype).itemsize)
    buf = np.empty(nbytes + ALIGNMENT, dtype=np.uint8)
    off = (-buf.ctypes.data) % ALIGNMENT
    if nbytes == 0:  # (reshaping an empty view may move its data pointer: kernels check it)
        return np.ndarray(shape, dtype=dtype, buffer=buf, offset=off)
    return buf[off:off + nbytes].view(dtype).reshape(shape)


def is_aligned(arr: np.ndarray) -> bool:
    """True when ``arr``'s data starts on a 64-byte boundary (or it has no data to align)."""
    return arr.size == 0 or arr.ctypes.data % ALIGNMENT == 0


class NDArray:
    """An n-d tensor in 64-byte-aligned CPU memory (TVM's ``tvm.nd.NDArray``).

    Create one with :func:`array`, :func:`empty` or :func:`from_dlpack`, not directly.

    Attributes
    ----------
    shape : tuple of int
    dtype : str
        numpy dtype name (one of ``c_types.SUPPORTED_DTYPES``).
    device : Device
    handle : ctypes pointer to ``DLTensor``
        Valid while this NDArray lives; ``strides`` is NULL (compact row-major).
    """

    def __init__(self, arr: np.ndarray, device: Device | None = None, _owner: object = None):
        # Internal: ``arr`` must already be aligned and C-contiguous (checked: kernels rely on it).
        assert is_aligned(arr) and arr.flags.c_contiguous, "NDArray needs aligned compact data"
        self._arr = arr
        self._owner = _owner  # keeps a zero-copy producer's memory alive
        self.device = device or cpu()
        self.device._check_cpu()
        self.dtype = C.dtype_name(arr.dtype)
        self._dl: C.DLTensor | None = None
        self._ptr: int | None = None  # data_ptr, once asked (numpy's .ctypes costs ~2 us)

    @property
    def _dltensor(self) -> C.DLTensor:
        """The ``DLTensor`` struct, built on first use: an array that never meets C code (an
        output fetched with ``get_output`` right after a run) skips the ctypes work."""
        if self._dl is None:
            arr = self._arr
            code, bits, lanes = C.dl_dtype(self.dtype)
            self._shape_arr = (ctypes.c_int64 * max(arr.ndim, 1))(*arr.shape)
            self._dl = C.DLTensor(
                ctypes.c_void_p(arr.ctypes.data), C.DLDevice(self.device.device_type,
                                                             self.device.device_id),
                arr.ndim, C.DLDataType(code, bits, lanes),
                ctypes.cast(self._shape_arr, ctypes.POINTER(ctypes.c_int64)), None, 0)
        return self._dl

    @classmethod
    def _checked(cls, arr: np.ndarray, dtype: str, device: Device) -> NDArray:
        """Internal: wrap aligned compact ``arr`` whose ``dtype`` and CPU ``device`` are
        known good (no checks)."""
        self = cls.__new__(cls)
        self._arr, self._owner, self.device, self.dtype, self._dl = arr, None, device, dtype, None
        self._ptr = None
        return self

    # -- properties
    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self._arr.shape)

    @property
    def ndim(self) -> int:
        return self._arr.ndim

    @property
    def size(self) -> int:
        return int(self._arr.size)

    @property
    def nbytes(self) -> int:
        return int(self._arr.nbytes)

    @property
    def handle(self) -> ctypes._Pointer:
        """``DLTensor*`` for C callers; the struct lives as long as this NDArray."""
        return ctypes.pointer(self._dltensor)

    @property
    def handle_address(self) -> int:
        """Address of the ``DLTensor`` struct (what a packed call's ``v_handle`` holds)."""
        return ctypes.addressof(self._dltensor)

    @property
    def data_ptr(self) -> int:
        """Address of the first element."""
        if self._ptr is None:
            self._ptr = int(self._arr.ctypes.data)
        return self._ptr

    # -- data movement
    def numpy(self) -> np.ndarray:
        """A numpy **copy** of the data (shape ``self.shape``, dtype ``self.dtype``)."""
        return self._arr.copy()

    asnumpy = numpy

    def copyfrom(self, source: np.ndarray | NDArray) -> NDArray:
        """Copy ``source`` into this array in place; returns ``self``.

        Raises
        ------
        ShapeError
            If ``source``'s shape or dtype differs from this array's.
        """
        src = source._arr if isinstance(source, NDArray) else np.asarray(source)
        if tuple(src.shape) != self.shape or src.dtype.name != self.dtype:
            raise ShapeError(f"copyfrom: expected shape {self.shape} dtype {self.dtype}, "
                             f"got shape {tuple(src.shape)} dtype {src.dtype.name}")
        np.copyto(self._arr, src)
        return self

    def copyto(self, target: NDArray | Device) -> NDArray:
        """Copy into ``target`` (an NDArray of the same shape/dtype, or a new one on a Device)."""
        if isinstance(target, Device):
            return array(self._arr, target)
        return target.copyfrom(self)

    # -- DLPack (https://dmlc.github.io/dlpack/latest/python_spec.html)
    def __dlpack__(self, *, stream: object = None, max_version: object = None,
                   dl_device: object = None, copy: bool | None = None) -> object:
        """A DLPack PyCapsule sharing this array's memory (a copy if ``copy=True``).

        ``"dltensor_versioned"`` (DLPack 1.0) when ``max_version`` allows it, else the legacy
        ``"dltensor"``. The capsule keeps this NDArray alive until the consumer calls the
        deleter.
        """
        from kiln.runtime.dlpack import to_dlpack_capsule

        want: Any = dl_device
        if want is not None and tuple(want) != self.__dlpack_device__():
            raise BufferError(f"__dlpack__: cannot export {self.device!r} data to {want}")
        version: Any = max_version
        versioned = version is not None and next(iter(version)) >= 1
        return to_dlpack_capsule(array(self._arr) if copy else self, versioned)

    def __dlpack_device__(self) -> tuple[int, int]:
        return (self.device.device_type, self.device.device_id)

    def __array__(self, dtype: object = None, copy: bool | None = None) -> np.ndarray:
        """The data as numpy (NumPy 2's array protocol): a view unless ``copy`` is True
        (``np.asarray`` views, ``np.array`` copies); ``dtype`` converts."""
        out = self._arr.copy() if copy else self._arr
        want: Any = dtype
        return out.astype(want) if want is not None else out

    def __repr__(self) -> str:
        return f"<kiln.runtime.NDArray shape={self.shape} dtype={self.dtype} {self.device!r}>"


def empty(shape: Sequence[int] | int, dtype: object = "float32",
          device: Device | None = None) -> NDArray:
    """An uninitialized aligned NDArray (TVM's ``tvm.nd.empty``).

    Raises
    ------
    KilnError
        For an unsupported dtype or a non-CPU device.
    ShapeError
        For a negative dimension or a shape too large for any array (see
        :func:`checked_nbytes`).
    """
    shp = (int(shape),) if isinstance(shape, (int, np.integer)) else tuple(int(s) for s in shape)
    if any(s < 0 for s in shp):
        raise ShapeError(f"empty: negative dimension in shape {shp}")
    return NDArray(_aligned_empty(shp, C.dtype_name(dtype)), device)


def array(source: object, device: Device | None = None) -> NDArray:
    """Copy ``source`` (numpy array, NDArray or anything ``np.asarray`` takes) into a new NDArray.

    Raises
    ------
    KilnError
        For an unsupported dtype or a non-CPU device.
    """
    if isinstance(source, NDArray) and device is None:
        # Shape and dtype were checked when ``source`` was made: the lean path (get_output
        # after every run; its Python work runs with caches the kernels just evicted).
        arr = _aligned_empty(source._arr.shape, source.dtype)
        np.copyto(arr, source._arr)
        return NDArray._checked(arr, source.dtype, source.device)
    src = source._arr if isinstance(source, NDArray) else np.asarray(source)
    out = empty(src.shape, src.dtype, device)
    np.copyto(out._arr, src)
    return out


def wrap_aligned(arr: np.ndarray, owner: object = None) -> NDArray:
    """Internal: an NDArray viewing ``arr`` (aligned, compact) without copying."""
    return NDArray(arr, None, owner)
