"""Comparison and logical graph ops: equal, not_equal, less, less_equal, greater,
greater_equal (two operands of one dtype → bool, numpy broadcasting), logical_and / or / xor /
not (bool → bool), isnan and isinf (float → bool).

ONNX semantics (Equal, Less, ..., And, Or, Xor, Not, IsNaN, IsInf): comparisons with NaN are
false except ``not_equal``; ``isinf`` takes ``detect_positive`` / ``detect_negative`` (bools).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from kiln.errors import ShapeError
from kiln.ir.graph import TensorType
from kiln.ir.op_registry import OpPattern, register_op
from kiln.ir.ops.common import broadcast_shapes, expect_arity, expect_float, same_dtype

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
