"""Comparison and logical graph ops: equal, not_equal, less, less_equal, greater,
greater_equal (two operands of one dtype → bool, numpy broadcasting), logical_and / or / xor /
not (bool → bool), isnan and isinf (float → bool); and the bitwise ops on integers
bitwise_and / or / xor / not, left_shift, right_shift (the operands' dtype; right shifts are
arithmetic on signed types; a shift by a negative amount or by the bit width or more gives the
sign fill alone: -1 for a right shift of a negative value, else 0 — ONNX BitShift-28).

ONNX semantics (Equal, Less, ..., And, Or, Xor, Not, IsNaN, IsInf): comparisons with NaN are
false except ``not_equal``; ``isinf`` takes ``detect_positive`` / ``detect_negative`` (bools).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from kiln.errors import ShapeError
from kiln.relay.graph import TensorType
from kiln.relay.op.common import broadcast_shapes, expect_arity, expect_float, same_dtype
from kiln.relay.op_registry import OpPattern, register_op

COMPARISONS: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "equal": np.equal,
    "not_equal": np.not_equal,
    "less": np.less,
    "less_equal": np.less_equal,
    "greater": np.greater,
    "greater_equal": np.greater_equal,
}
LOGICAL: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "logical_and": np.logical_and,
    "logical_or": np.logical_or,
    "logical_xor": np.logical_xor,
}


def _compare_infer(arg_types: list[TensorType], attrs: dict) -> TensorType:
    expect_arity(arg_types, 2)
    same_dtype(arg_types)
    return TensorType(broadcast_shapes(*(t.shape for t in arg_types)), "bool")


def _logical_infer(arg_types: list[TensorType], attrs: dict) -> TensorType:
    for t in arg_types:
        if t.dtype != "bool":
            raise ShapeError(f"needs bool operands, got {t.dtype}")
    return TensorType(broadcast_shapes(*(t.shape for t in arg_types)), "bool")


def _float_to_bool_infer(arg_types: list[TensorType], attrs: dict) -> TensorType:
    expect_arity(arg_types, 1)
    expect_float(arg_types[0])
    return TensorType(arg_types[0].shape, "bool")


def _bool_ref(fn: Callable[..., np.ndarray]) -> Callable[..., np.ndarray]:
    def ref(*arrays: np.ndarray) -> np.ndarray:
        with np.errstate(invalid="ignore"):
            return np.asarray(fn(*arrays), dtype=bool)

    return ref


def _isinf_ref(x: np.ndarray, detect_positive: bool, detect_negative: bool) -> np.ndarray:
    return (np.isposinf(x) & detect_positive) | (np.isneginf(x) & detect_negative)


for _name, _fn in COMPARISONS.items():
    register_op(_name, _compare_infer, OpPattern.BROADCAST, _bool_ref(_fn))
for _name, _fn in LOGICAL.items():
    register_op(_name, _logical_infer, OpPattern.BROADCAST, _bool_ref(_fn))
register_op("logical_not", _logical_infer, OpPattern.ELEMWISE, _bool_ref(np.logical_not))
register_op("isnan", _float_to_bool_infer, OpPattern.ELEMWISE, _bool_ref(np.isnan))
register_op("isinf", _float_to_bool_infer, OpPattern.ELEMWISE, _isinf_ref)


def _shift(fn: Callable[[np.ndarray, np.ndarray], np.ndarray], right: bool):
    def ref(x: np.ndarray, y: np.ndarray) -> np.ndarray:
        bits = x.dtype.itemsize * 8
        valid = (y >= 0) & (y < bits)
        fill = np.where(x < 0, -1, 0).astype(x.dtype) if right else np.zeros_like(x)
        return np.where(valid, fn(x, np.where(valid, y, 0).astype(x.dtype)), fill)

    return ref


BITWISE: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "bitwise_and": np.bitwise_and,
    "bitwise_or": np.bitwise_or,
    "bitwise_xor": np.bitwise_xor,
    "left_shift": _shift(np.left_shift, False),
    "right_shift": _shift(np.right_shift, True),
}


def _int_infer(arg_types: list[TensorType], attrs: dict) -> TensorType:
    dtype = same_dtype(arg_types)
    if np.dtype(dtype).kind not in "iu":
        raise ShapeError(f"needs integer operands, got {dtype}")
    return TensorType(broadcast_shapes(*(t.shape for t in arg_types)), dtype)


def _int_ref(fn: Callable[..., np.ndarray]) -> Callable[..., np.ndarray]:
    def ref(*arrays: np.ndarray) -> np.ndarray:
        return np.asarray(fn(*arrays)).astype(arrays[0].dtype, copy=False)

    return ref


for _name, _fn in BITWISE.items():
    register_op(_name, _int_infer, OpPattern.BROADCAST, _int_ref(_fn))
register_op("bitwise_not", _int_infer, OpPattern.ELEMWISE, _int_ref(np.invert))
