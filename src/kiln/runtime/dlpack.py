"""DLPack exchange: ``NDArray.__dlpack__`` capsules and ``from_dlpack``.

Protocol: https://dmlc.github.io/dlpack/latest/python_spec.html. A consumer that asks for
``max_version >= (1, 0)`` gets a ``"dltensor_versioned"`` capsule (writable: numpy marks arrays
from legacy capsules read-only); others get the legacy ``"dltensor"`` capsule. Like TVM's
``python/tvm/_ffi/_ctypes/ndarray.py`` this is pure ctypes: the ``DLManagedTensor`` is a ctypes
struct; the owner NDArray, the struct and its shape array sit in a table until the consumer
calls the deleter (or, for a capsule never consumed, until the capsule is destroyed).
"""

from __future__ import annotations

import ctypes

import numpy as np

from kiln.errors import KilnError
from kiln.runtime import c_types as C
from kiln.runtime.ndarray import NDArray, array, is_aligned, wrap_aligned

_CAPSULE_NAME = b"dltensor"
_VERSIONED_NAME = b"dltensor_versioned"

# Our own handle on the Python C API: ctypes.pythonapi's function objects are shared by every
# library in the process, and one that sets their argtypes its own way (py_object) would break
# the calls below.
_api = ctypes.PyDLL(ctypes.pythonapi._name, handle=ctypes.pythonapi._handle)
_CAPSULE_DESTRUCTOR = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_api.PyCapsule_New.restype = ctypes.py_object
_api.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, _CAPSULE_DESTRUCTOR]
_api.PyCapsule_IsValid.restype = ctypes.c_int
_api.PyCapsule_IsValid.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
_api.PyCapsule_GetPointer.restype = ctypes.c_void_p
_api.PyCapsule_GetPointer.argtypes = [ctypes.c_void_p, ctypes.c_char_p]

# address of DLManagedTensor → (struct, owner NDArray). The entry is what keeps memory alive.
_LIVE: dict[int, tuple[object, NDArray]] = {}


def _deleter(managed_addr: int | None) -> None:
    if managed_addr:
        _LIVE.pop(managed_addr, None)


def _capsule_destructor(capsule: int | None) -> None:
    # Called while the capsule is being destroyed: a consumer renames it "used_dltensor" and
    # owns the deleter; a capsule nobody consumed still holds the tensor, so delete it here.
    if not capsule:
        return
    for name in (_CAPSULE_NAME, _VERSIONED_NAME):
        if _api.PyCapsule_IsValid(capsule, name):
            _deleter(_api.PyCapsule_GetPointer(capsule, name))


# Module-level so the C callbacks outlive every capsule.
_C_DELETER = C.DLPACK_DELETER(_deleter)
_C_CAPSULE_DESTRUCTOR = _CAPSULE_DESTRUCTOR(_capsule_destructor)


def to_dlpack_capsule(nd: NDArray, versioned: bool = False) -> object:
    """A DLPack PyCapsule over ``nd``'s memory (zero copy); DLPack 1.0 when ``versioned``."""
    managed: C.DLManagedTensor | C.DLManagedTensorVersioned
    if versioned:
        managed = C.DLManagedTensorVersioned()
        managed.version = C.DLPackVersion(1, 0)
        managed.flags = 0
        name = _VERSIONED_NAME
    else:
        managed = C.DLManagedTensor()
        name = _CAPSULE_NAME
    managed.dl_tensor = nd._dltensor  # struct copy; its shape pointer targets nd's shape array
    managed.manager_ctx = None
    managed.deleter = _C_DELETER
    addr = ctypes.addressof(managed)
    _LIVE[addr] = (managed, nd)
    return _api.PyCapsule_New(addr, name, _C_CAPSULE_DESTRUCTOR)


class _CapsuleHolder:
    # np.from_dlpack takes objects with __dlpack__, not raw capsules.
    def __init__(self, capsule: object):
        self._capsule = capsule

    def __dlpack__(self, **_: object) -> object:
        return self._capsule

    def __dlpack_device__(self) -> tuple[int, int]:
        return (C.kDLCPU, 0)


def from_dlpack(obj: object) -> NDArray:
    """An NDArray from any DLPack producer (numpy, torch, an NDArray) or a ``"dltensor"`` capsule.

    Zero-copy when the producer's data is on the CPU, C-contiguous and 64-byte aligned (the
    producer is kept alive by the result); otherwise an aligned copy.

    Raises
    ------
    KilnError
        If ``obj`` is not a CPU DLPack producer or its dtype is unsupported.
    """
    if isinstance(obj, NDArray):
        return obj
    if type(obj).__name__ == "PyCapsule":
        obj = _CapsuleHolder(obj)
    if not hasattr(obj, "__dlpack__"):
        raise KilnError(f"from_dlpack: {type(obj).__name__} does not implement __dlpack__")
    try:
        # numpy consumes the capsule and keeps the producer alive through the result.
        arr = np.from_dlpack(obj)
    except (BufferError, RuntimeError, TypeError, ValueError) as err:
        raise KilnError(f"from_dlpack: cannot import {type(obj).__name__}: {err}") from err
    C.dtype_name(arr.dtype)
    if arr.flags.c_contiguous and is_aligned(arr):
        return wrap_aligned(arr, owner=arr)
    return array(arr)
