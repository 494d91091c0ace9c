"""``PackedFunc``: a function with the packed calling convention, in C or in Python.

TVM's ``python/tvm/_ffi/_ctypes/packed_func.py``. A C packed function has the signature
``int32 f(TVMValue* args, int32* type_codes, int32 num_args, TVMValue* ret, int32* ret_code,
void* resource_handle)`` (docs/formats.md §3). Arguments convert as: NDArray → its
``DLTensor*`` (type code 7), int → 0, float → 2, str → 11, None → 4, Device → 6. A nonzero return
means failure; the message is read through the *same library's* ``TVMGetLastError`` because each
exported library carries its own error buffer (``support/backend.c``).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any

from kiln.errors import KilnError
from kiln.runtime import c_types as C
from kiln.runtime.ndarray import Device, NDArray


def _convert(args: tuple[Any, ...], fname: str):
    """Build the ``TVMValue``/type-code arrays; returns (values, codes, keepalive list)."""
    n = len(args)
    values = (C.TVMValue * max(n, 1))()
    codes = (ctypes.c_int32 * max(n, 1))()
    keep: list[Any] = []
    for i, a in enumerate(args):
        if isinstance(a, NDArray):
            values[i].v_handle = a.handle_address
            codes[i] = C.kTVMDLTensorHandle
            keep.append(a)
        elif isinstance(a, ctypes._Pointer) and a._type_ is C.DLTensor:
            values[i].v_handle = ctypes.addressof(a.contents)
            codes[i] = C.kTVMDLTensorHandle
            keep.append(a)
        elif a is None:
            values[i].v_handle = None
            codes[i] = C.kTVMNullptr
        elif isinstance(a, (bool, int)):
            values[i].v_int64 = int(a)
            codes[i] = C.kTVMArgInt
        elif isinstance(a, float):
            values[i].v_float64 = a
            codes[i] = C.kTVMArgFloat
        elif isinstance(a, str):
            raw = a.encode()
            values[i].v_str = raw
            codes[i] = C.kTVMStr
            keep.append(raw)
        elif isinstance(a, Device):
            # DLDevice {int32 type; int32 id} packed into the 8-byte union, little-endian.
            values[i].v_int64 = (a.device_type & 0xFFFFFFFF) | (a.device_id << 32)
            codes[i] = C.kDLDeviceArg
        else:
            raise KilnError(f"{fname}: argument {i} of type {type(a).__name__} cannot be passed "
                            "to a C packed function")
    return values, codes, keep


def _ret_value(value: C.TVMValue, code: int) -> Any:
    if code == C.kTVMArgInt:
        return int(value.v_int64)
    if code == C.kTVMArgFloat:
        return float(value.v_float64)
    if code == C.kTVMStr:
        return value.v_str.decode() if value.v_str is not None else None
    return None


class PreparedCall:
    """A C packed call whose argument arrays were built once (the graph executor's op exec).

    Calling it only invokes the C function and checks the status.
    """

    def __init__(self, func: PackedFunc, args: tuple[Any, ...]):
        assert func._cfunc is not None, "PreparedCall needs a C PackedFunc"
        self.func = func
        self._cfunc = func._cfunc
        self._values, self._codes, self._keep = _convert(args, func.name)
        self._num = len(args)
        self._ret = C.TVMValue()
        self._ret_code = ctypes.c_int32(C.kTVMNullptr)

    def __call__(self) -> None:
        rc = self._cfunc(self._values, self._codes, self._num, ctypes.byref(self._ret),
                              ctypes.byref(self._ret_code), None)
        if rc != 0:
            self.func._raise(rc)


class PackedFunc:
    """A callable with TVM's packed convention: over a C function pointer or a Python callable.

    Parameters
    ----------
    func : int or callable
        The C function's address (``TVMBackendPackedCFunc``) or a Python callable.
    name : str
        Used in error messages.
    get_last_error : callable returning bytes, optional
        The owning library's ``TVMGetLastError`` (C functions only).
    keepalive : object, optional
        Kept referenced while this PackedFunc lives (e.g. the ``CDLL`` the code lives in).

    Raises
    ------
    KilnError
        On call, when the C function returns nonzero (message: the library's last error) or an
        argument has no packed representation.
    """

    def __init__(self, func: int | Callable[..., Any], name: str = "<packed>",
                 get_last_error: Callable[[], bytes | None] | None = None,
                 keepalive: object = None):
        self.name = name
        self._keepalive = keepalive
        self._get_last_error = get_last_error
        if callable(func):
            self._pyfunc: Callable[..., Any] | None = func
            self._cfunc: Any = None
        else:
            self._pyfunc = None
            self._cfunc = C.PACKED_CFUNC(int(func))

    @property
    def is_c_function(self) -> bool:
        return self._cfunc is not None

    def __call__(self, *args: Any) -> Any:
        if self._pyfunc is not None:
            return self._pyfunc(*args)
        cfunc = self._cfunc
        assert cfunc is not None, "a PackedFunc wraps a C function or a Python callable"
        values, codes, _keep = _convert(args, self.name)
        ret = C.TVMValue()
        ret_code = ctypes.c_int32(C.kTVMNullptr)
        rc = cfunc(values, codes, len(args), ctypes.byref(ret), ctypes.byref(ret_code),
                         None)
        if rc != 0:
            self._raise(rc)
        return _ret_value(ret, ret_code.value)

    def prepare(self, *args: Any) -> PreparedCall:
        """Pre-convert ``args`` once; the returned object calls the C function with them."""
        if self._cfunc is None:
            raise KilnError(f"{self.name}: only C packed functions can be prepared")
        return PreparedCall(self, args)

    def _raise(self, rc: int) -> None:
        msg = None
        if self._get_last_error is not None:
            raw = self._get_last_error()
            msg = raw.decode(errors="replace") if raw else None
        raise KilnError(f"{self.name} failed (status {rc}): {msg or 'no error message set'}")

    def __repr__(self) -> str:
        kind = "C" if self._cfunc is not None else "Python"
        return f"<PackedFunc {self.name} ({kind})>"
