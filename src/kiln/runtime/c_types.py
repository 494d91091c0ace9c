"""ctypes mirrors of the C ABI in ``include/kiln/c_runtime_api.h`` and the one dtype table.

Layouts follow DLPack's ``dlpack.h`` and TVM's ``include/tvm/runtime/c_runtime_api.h``
(docs/formats.md §3). Every other runtime file takes its structs and its numpy ↔ ``DLDataType``
mapping from here, so there is exactly one definition of each.
"""

from __future__ import annotations

import ctypes

import numpy as np

from kiln.errors import KilnError

# DLDeviceType values (dlpack.h).
kDLCPU = 1
kDLCUDA = 2
kDLExtDev = 12

# DLDataTypeCode values (dlpack.h). kDLBool is DLPack ≥ 0.8; numpy exports bool with it.
kDLInt = 0
kDLUInt = 1
kDLFloat = 2
kDLBfloat = 4
kDLBool = 6

# TVMArgTypeCode values (c_runtime_api.h).
kTVMArgInt = 0
kTVMArgFloat = 2
kTVMOpaqueHandle = 3
kTVMNullptr = 4
kTVMDataType = 5
kDLDeviceArg = 6
kTVMDLTensorHandle = 7
kTVMStr = 11
kTVMBytes = 12
kTVMNDArrayHandle = 13


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


assert ctypes.sizeof(DLTensor) == 48, "DLTensor must be 48 bytes on LP64 (dlpack.h)"

# The deleter takes a DLManagedTensor*; declared with void* so the struct can refer to it.
DLPACK_DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class DLManagedTensor(ctypes.Structure):
    _fields_ = [
        ("dl_tensor", DLTensor),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", DLPACK_DELETER),
    ]


class DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class DLManagedTensorVersioned(ctypes.Structure):
    """DLPack >= 1.0 (``dlpack.h``): adds the version and ``flags`` (bit 0: read-only)."""

    _fields_ = [
        ("version", DLPackVersion),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", DLPACK_DELETER),
        ("flags", ctypes.c_uint64),
        ("dl_tensor", DLTensor),
    ]


class TVMValue(ctypes.Union):
    _fields_ = [
        ("v_int64", ctypes.c_int64),
        ("v_float64", ctypes.c_double),
        ("v_handle", ctypes.c_void_p),
        ("v_str", ctypes.c_char_p),
    ]


assert ctypes.sizeof(TVMValue) == 8, "TVMValue must be 8 bytes (c_runtime_api.h)"

# The packed-function signature (TVMBackendPackedCFunc).
PACKED_CFUNC = ctypes.CFUNCTYPE(
    ctypes.c_int32,
    ctypes.POINTER(TVMValue),
    ctypes.POINTER(ctypes.c_int32),
    ctypes.c_int32,
    ctypes.POINTER(TVMValue),
    ctypes.POINTER(ctypes.c_int32),
    ctypes.c_void_p,
)

# numpy dtype name → DLPack (code, bits); lanes is always 1. bool follows DLPack's kDLBool
# (1 byte), which is what numpy's from_dlpack and Kiln's MakePackedAPI checks expect.
_DTYPE_TO_DL: dict[str, tuple[int, int]] = {
    "float16": (kDLFloat, 16),
    "float32": (kDLFloat, 32),
    "float64": (kDLFloat, 64),
    "int8": (kDLInt, 8),
    "int16": (kDLInt, 16),
    "int32": (kDLInt, 32),
    "int64": (kDLInt, 64),
    "uint8": (kDLUInt, 8),
    "uint16": (kDLUInt, 16),
    "uint32": (kDLUInt, 32),
    "uint64": (kDLUInt, 64),
    "bool": (kDLBool, 8),
}
_DL_TO_DTYPE: dict[tuple[int, int], str] = {v: k for k, v in _DTYPE_TO_DL.items()}
# Classic TVM writes bool as uint1 (1 byte of storage); accept it when reading.
_DL_TO_DTYPE[(kDLUInt, 1)] = "bool"

SUPPORTED_DTYPES = tuple(_DTYPE_TO_DL)


def dtype_name(dtype: object) -> str:
    """Canonical dtype name of a numpy dtype / name, checked against the supported set.

    Raises
    ------
    KilnError
        If the dtype is not one of :data:`SUPPORTED_DTYPES`.
    """
    try:
        name = np.dtype(dtype).name  # type: ignore[call-overload]
    except (TypeError, ValueError):  # ValueError: e.g. a str numpy cannot encode
        name = str(dtype)
    if name not in _DTYPE_TO_DL:
        raise KilnError(
            f"dtype {dtype!r} is not supported by the Kiln runtime "
            f"(supported: {', '.join(SUPPORTED_DTYPES)})")
    return name


def dl_dtype(dtype: object) -> tuple[int, int, int]:
    """DLPack ``(code, bits, lanes)`` of a numpy dtype (see :func:`dtype_name` for errors)."""
    code, bits = _DTYPE_TO_DL[dtype_name(dtype)]
    return code, bits, 1


def dtype_from_dl(code: int, bits: int, lanes: int) -> str:
    """numpy dtype name of a DLPack ``(code, bits, lanes)``.

    Raises
    ------
    KilnError
        For vector lanes or a (code, bits) pair without a numpy equivalent.
    """
    name = _DL_TO_DTYPE.get((code, bits))
    if name is None or lanes != 1:
        raise KilnError(f"DLDataType(code={code}, bits={bits}, lanes={lanes}) has no supported "
                        "numpy dtype")
    return name
