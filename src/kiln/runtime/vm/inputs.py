"""Turning the values a caller passes to a VM function into the NDArrays its registers hold.

Zero-copy where the graph executor's ``set_input_zero_copy`` would accept the memory (an
NDArray, or a C-contiguous, 64-byte-aligned numpy array / DLPack tensor of a supported dtype in
native byte order: ``graph_executor.zero_copy_view``'s rule); anything else is copied, into a
per-parameter :class:`Staging` buffer that later calls reuse, so a misaligned input costs one
``memcpy`` and no allocation per call.

Tensors are never converted to another dtype: an NDArray, numpy array or scalar, or DLPack
tensor whose dtype is not the parameter's is refused (as onnxruntime refuses float64 data for a
float32 input), whatever the function's bytecode checks. Python scalars and (nested) lists carry
no dtype and take the parameter's, as onnxruntime converts lists. A rank-0 parameter takes a
one-element tensor of any rank, viewed as a scalar (:mod:`kiln.runtime.scalar_inputs`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kiln.errors import ShapeError
from kiln.runtime import c_types as C
from kiln.runtime.ndarray import ALIGNMENT, NDArray, array, cpu
from kiln.runtime.scalar_inputs import as_declared_scalar
from kiln.runtime.vm.executable_format import TensorSig

_DTYPE_NAMES = {np.dtype(n): n for n in C.SUPPORTED_DTYPES}
_CPU = cpu()


def as_input(value: Any, sig: TensorSig | None, copy: bool = False,
             staging: Staging | None = None, key: tuple[int, int] = (0, 0)) -> NDArray:
    """An NDArray for a VM function parameter: ``value`` itself when it already is one or its
    memory can be used in place (a C-contiguous, 64-byte aligned numpy array or DLPack tensor
    of a supported dtype in native byte order), else an aligned copy (into ``staging``'s
    buffer ``key`` when given, reused by later calls); ``copy`` always makes a new copy.
    Python scalars and lists are converted to ``sig``'s dtype; nothing else is. For a rank-0
    ``sig``, a one-element tensor of any rank is viewed with shape ``()``.

    Raises
    ------
    ShapeError
        A tensor whose dtype is not ``sig``'s (names the input and both dtypes); a rank-0
        ``sig`` given a tensor of other than one element.
    KilnError
        An unsupported dtype.
    """
    if type(value) is not np.ndarray:
        if isinstance(value, NDArray):
            if sig is not None and value.dtype != sig.dtype:
                raise _dtype_error(sig, value.dtype)
            if sig is not None and not sig.dims:
                value = as_declared_scalar(value, 0, f"input {sig.name!r}")
            return array(value) if copy else value
        if isinstance(value, (np.ndarray, np.generic)):  # a subclass, a numpy scalar
            value = np.asarray(value)
        elif hasattr(value, "__dlpack__"):
            value = np.from_dlpack(value)
        else:
            value = np.asarray(value, dtype=sig.dtype if sig is not None else None)
    name = _DTYPE_NAMES.get(value.dtype)  # (a dict lookup: dtype.name is slow)
    if sig is not None and name != sig.dtype and value.dtype.name != sig.dtype:  # (">f4": ok)
        raise _dtype_error(sig, value.dtype)
    if sig is not None and not sig.dims:
        value = as_declared_scalar(value, 0, f"input {sig.name!r}")
    if copy or name is None:
        return array(value)
    # (an empty array too: numpy may place it anywhere, and kernels check every pointer)
    if value.flags.c_contiguous and value.ctypes.data % ALIGNMENT == 0:
        return NDArray._checked(value, name, _CPU)  # keeps ``value`` (its memory) alive
    return staging.stage(key, value, name) if staging is not None else array(value)


def _dtype_error(sig: TensorSig, given: Any) -> ShapeError:
    return ShapeError(f"input {sig.name!r}: expected dtype {sig.dtype}, got {np.dtype(given)} "
                      f"(tensors are not converted: cast with .astype({sig.dtype!r}))")


class Staging:
    """Per parameter of a function, an aligned buffer that misaligned or strided numpy inputs
    are copied into (grown as needed, reused by later calls: no allocation per call, as the
    graph executor's ``set_input`` copies into its own storage)."""

    def __init__(self) -> None:
        self._bufs: dict[tuple[int, int], NDArray] = {}
        self._views: dict[tuple[int, int], NDArray] = {}

    def stage(self, key: tuple[int, int], value: np.ndarray, name: str) -> NDArray:
        """``value`` copied into buffer ``key`` (dtype ``name``); the view is reused while the
        shape repeats."""
        view = self._views.get(key)
        if view is None or view._arr.shape != value.shape or view.dtype != name:
            buf = self._bufs.get(key)
            if buf is None or buf.nbytes < value.nbytes:
                buf = self._bufs[key] = array(np.empty(max(value.nbytes, 1), np.uint8))
            arr = buf._arr[:value.nbytes].view(name).reshape(value.shape)
            view = self._views[key] = NDArray._checked(arr, name, _CPU)
        np.copyto(view._arr, value)
        return view

    @property
    def nbytes(self) -> int:
        return sum(b.nbytes for b in self._bufs.values())


__all__ = ["Staging", "as_input"]
