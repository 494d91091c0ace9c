"""Elementwise and broadcast graph ops: unary math, activations, cast, reinterpret, binary
arithmetic, where (comparisons and logical ops: :mod:`kiln.relay.op.logical`).

Unary ops keep their input type (``cast`` changes the dtype). Binary ops broadcast with numpy's
rule and require both operands to have the same dtype (the frontend inserts casts). Each numpy
reference computes in the operands' dtype (float32 math stays float32).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from kiln import arith
from kiln.errors import ShapeError
from kiln.relay.graph import TensorType
from kiln.relay.op.common import broadcast_shapes, expect_arity, expect_float, same_dtype
from kiln.relay.op_registry import OpPattern, register_op

# ---------------------------------------------------------------------------------------------
# unary


def _unary_infer(float_only: bool) -> Callable[[list[TensorType], dict], TensorType]:
    def infer(arg_types: list[TensorType], attrs: dict) -> TensorType:
        expect_arity(arg_types, 1)
        if float_only:
            expect_float(arg_types[0])
        return arg_types[0]

    return infer


def _sigmoid(x: np.ndarray) -> np.ndarray:
    # Stable in both tails: exp of a non-positive number only.
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e)).astype(x.dtype)


_erf = np.frompyfunc(math.erf, 1, 1)


def _hardsigmoid(x: np.ndarray, alpha: float, beta: float) -> np.ndarray:
    return np.clip(x * x.dtype.type(alpha) + x.dtype.type(beta), 0, 1).astype(x.dtype)


def _clip(x: np.ndarray, a_min: float, a_max: float) -> np.ndarray:
    return np.minimum(np.maximum(x, a_min), a_max).astype(x.dtype)


def _leaky_relu(x: np.ndarray, alpha: float) -> np.ndarray:
    return np.where(x < 0, x * x.dtype.type(alpha), x).astype(x.dtype)


_FLOAT_UNARY: dict[str, Callable[..., np.ndarray]] = {
    "sigmoid": _sigmoid,
    "exp": np.exp,
    "log": np.log,
    "sqrt": np.sqrt,
    "tanh": np.tanh,
    "erf": lambda x: _erf(x).astype(x.dtype),
    "floor": np.floor,
    "ceil": np.ceil,
    "round": np.rint,  # half to even, as ONNX Round
    "hardsigmoid": _hardsigmoid,
    "hardswish": lambda x: (x * _hardsigmoid(x, 1.0 / 6.0, 0.5)).astype(x.dtype),
    "sin": np.sin,
    "cos": np.cos,
    "tan": np.tan,
    "asin": np.arcsin,
    "acos": np.arccos,
    "atan": np.arctan,
    "sinh": np.sinh,
    "cosh": np.cosh,
    "asinh": np.arcsinh,
    "acosh": np.arccosh,
    "atanh": np.arctanh,
}

_ANY_UNARY: dict[str, Callable[..., np.ndarray]] = {
    "nn.relu": lambda x: np.maximum(x, x.dtype.type(0)),
    "negative": np.negative,
    "abs": np.abs,
    "clip": _clip,
    "leaky_relu": _leaky_relu,
    "sign": np.sign,
}


def _quiet(fn: Callable[..., np.ndarray]) -> Callable[..., np.ndarray]:
    # log(0), sqrt(-1) ... give inf / nan like the generated code does, without numpy warnings.
    def ref(x: np.ndarray, **attrs) -> np.ndarray:
        with np.errstate(all="ignore"):
            return np.asarray(fn(x, **attrs)).astype(x.dtype, copy=False)

    return ref


for _name, _fn in _FLOAT_UNARY.items():
    register_op(_name, _unary_infer(True), OpPattern.ELEMWISE, _quiet(_fn))
for _name, _fn in _ANY_UNARY.items():
    register_op(_name, _unary_infer(False), OpPattern.ELEMWISE, _quiet(_fn))


def _cast_infer(arg_types: list[TensorType], attrs: dict) -> TensorType:
    expect_arity(arg_types, 1)
    try:
        dtype = np.dtype(attrs["dtype"]).name
    except TypeError:
        raise ShapeError(f"unknown dtype {attrs['dtype']!r}") from None
    return TensorType(arg_types[0].shape, dtype)


def _cast_ref(x: np.ndarray, dtype: str) -> np.ndarray:
    if x.dtype == object and np.dtype(dtype).kind in "iu":
        return x  # symbolic dims (a Shape's result) stay dims: integers of any width
    with np.errstate(all="ignore"):
        return x.astype(dtype)


register_op("cast", _cast_infer, OpPattern.ELEMWISE, _cast_ref)


def _bitcast_infer(arg_types: list[TensorType], attrs: dict) -> TensorType:
    out = _cast_infer(arg_types, attrs)
    src, dst = np.dtype(arg_types[0].dtype), np.dtype(out.dtype)
    if src.itemsize != dst.itemsize or "bool" in (src.name, dst.name):
        raise ShapeError(f"cannot reinterpret {src.name} as {dst.name}")
    return out


# reinterpret (TVM's name; ONNX BitCast): the bits of each element read as ``dtype`` of the
# same width.
register_op("reinterpret", _bitcast_infer, OpPattern.ELEMWISE,
            lambda x, dtype: np.ascontiguousarray(x).view(dtype).copy())

# ---------------------------------------------------------------------------------------------
# binary (broadcast)


def _binary_infer(arg_types: list[TensorType], attrs: dict) -> TensorType:
    expect_arity(arg_types, 2)
    dtype = same_dtype(arg_types)
    return TensorType(broadcast_shapes(*(t.shape for t in arg_types)), dtype)


def _trunc_mod(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if a.dtype.kind in "iu":
        return a - _divide(a, b) * np.where(b == 0, 1, b)
    return np.fmod(a, b)


def _floor_mod(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.mod(a, np.where(b == 0, 1, b)) if a.dtype.kind in "iu" else np.mod(a, b)


def _divide_dim(x, y):
    """ONNX integer Div (truncation toward zero) of one shape value by another, either of
    them symbolic: ``x // y`` where ``x >= 0`` is known from the symbols' bounds (floor and
    truncation agree there) and ``y`` is a nonzero int."""
    if isinstance(x, int) and isinstance(y, int):
        q = abs(x) // abs(y) if y else 0
        return -q if (x < 0) != (y < 0) else q
    lo, _ = arith.bounds(x)
    if not isinstance(y, int) or y == 0 or lo is None or lo < 0:
        raise ShapeError(f"integer Div of the shape value {x} by {y}: only a value known to be "
                         "non-negative divided by a nonzero integer folds at compile time")
    return x // y if y > 0 else -(x // -y)


def _divide(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if a.dtype == object or b.dtype == object:  # shape arithmetic over symbolic dims
        return np.frompyfunc(_divide_dim, 2, 1)(a, b)
    if a.dtype.kind in "iu":
        # C semantics (as the generated code and ONNX runtimes): truncate toward zero.
        safe = np.where(b == 0, 1, b)
        q = np.abs(a) // np.abs(safe)
        return np.where((a < 0) != (safe < 0), -q, q).astype(a.dtype)
    return np.divide(a, b)


_BINARY: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "add": np.add,
    "subtract": np.subtract,
    "multiply": np.multiply,
    "divide": _divide,
    "maximum": np.maximum,
    "minimum": np.minimum,
    "power": np.power,
    "mod": _trunc_mod,  # the remainder with the dividend's sign (C's %, fmod)
    "floor_mod": _floor_mod,  # the remainder with the divisor's sign (Python's %)
}


def _binary_ref(fn: Callable[[np.ndarray, np.ndarray], np.ndarray]):
    def ref(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        with np.errstate(all="ignore"):
            out = np.asarray(fn(a, b))
        # symbolic shape values (object arrays) stay symbolic, whichever operand they are
        return out if out.dtype == object else out.astype(a.dtype, copy=False)

    return ref


for _name, _fn in _BINARY.items():
    register_op(_name, _binary_infer, OpPattern.BROADCAST, _binary_ref(_fn))


def _bias_add_infer(arg_types: list[TensorType], attrs: dict) -> TensorType:
    expect_arity(arg_types, 2)
    x, b = arg_types
    same_dtype(arg_types)
    axis = attrs["axis"]
    if not -x.ndim <= axis < x.ndim:
        raise ShapeError(f"axis {axis} out of range for rank {x.ndim}")
    if b.shape != (x.shape[axis],):
        raise ShapeError(f"bias shape {b.shape} does not match dimension {axis} of {x.shape}")
    return x


def _bias_add_ref(x: np.ndarray, b: np.ndarray, axis: int) -> np.ndarray:
    axis %= x.ndim
    return (x + b.reshape((-1,) + (1,) * (x.ndim - axis - 1))).astype(x.dtype, copy=False)


register_op("nn.bias_add", _bias_add_infer, OpPattern.BROADCAST, _bias_add_ref)


def _where_infer(arg_types: list[TensorType], attrs: dict) -> TensorType:
    expect_arity(arg_types, 3)
    cond, x, y = arg_types
    if cond.dtype != "bool":
        raise ShapeError(f"condition must be bool, got {cond.dtype}")
    dtype = same_dtype([x, y])
    return TensorType(broadcast_shapes(cond.shape, x.shape, y.shape), dtype)


def _where_ref(cond: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    out = np.where(cond, x, y)
    return out if out.dtype == object else out.astype(x.dtype, copy=False)  # object: shape dims


register_op("where", _where_infer, OpPattern.BROADCAST, _where_ref)
