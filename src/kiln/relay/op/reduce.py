"""Reduction graph ops: sum, prod, mean, max, min over ``axis`` (a tuple of ints), with
``keepdims``.

``axis`` lists the reduced axes (negative values count from the end; an empty tuple reduces
nothing). The result keeps the input dtype; ``mean`` of integers truncates like a cast.
"""

from __future__ import annotations

import numpy as np

from kiln.errors import ShapeError
from kiln.relay.graph import TensorType
from kiln.relay.op.common import expect_arity, normalize_axis, surely_less
from kiln.relay.op_registry import OpPattern, register_op


def reduce_axes(shape: tuple[int, ...], axis: tuple[int, ...]) -> tuple[int, ...]:
    """``axis`` normalized to sorted non-negative axes of ``shape``; duplicates raise."""
    axes = sorted(normalize_axis(a, len(shape)) for a in axis)
    if len(set(axes)) != len(axes):
        raise ShapeError(f"repeated reduction axes {axis}")
    return tuple(axes)


def _reduce_infer(arg_types: list[TensorType], attrs: dict) -> TensorType:
    expect_arity(arg_types, 1)
    (x,) = arg_types
    axes = reduce_axes(x.shape, attrs["axis"])
    if attrs["keepdims"]:
        shape = tuple(1 if d in axes else n for d, n in enumerate(x.shape))
    else:
        shape = tuple(n for d, n in enumerate(x.shape) if d not in axes)
    return TensorType(shape, x.dtype)


def _reducer(fn):
    def ref(x: np.ndarray, axis: tuple[int, ...], keepdims: bool) -> np.ndarray:
        axes = reduce_axes(x.shape, axis)
        if not axes:
            return x.copy()
        return np.asarray(fn(x, axes, keepdims)).astype(x.dtype, copy=False)

    return ref


register_op("sum", _reduce_infer, OpPattern.COMM_REDUCE,
            _reducer(lambda x, a, k: np.sum(x, axis=a, keepdims=k, dtype=x.dtype)))
register_op("mean", _reduce_infer, OpPattern.COMM_REDUCE,
            _reducer(lambda x, a, k: np.mean(x, axis=a, keepdims=k,
                                             dtype=x.dtype if x.dtype.kind == "f" else None)))
register_op("prod", _reduce_infer, OpPattern.COMM_REDUCE,
            _reducer(lambda x, a, k: np.prod(x, axis=a, keepdims=k, dtype=x.dtype)))
register_op("max", _reduce_infer, OpPattern.COMM_REDUCE,
            _reducer(lambda x, a, k: np.max(x, axis=a, keepdims=k)))
register_op("min", _reduce_infer, OpPattern.COMM_REDUCE,
            _reducer(lambda x, a, k: np.min(x, axis=a, keepdims=k)))


def _arg_infer(arg_types: list[TensorType], attrs: dict) -> TensorType:
    expect_arity(arg_types, 1)
    (x,) = arg_types
    axis = normalize_axis(attrs["axis"], x.ndim)
    if x.shape[axis] == 0:
        raise ShapeError(f"cannot take the arg-extremum of an empty axis {axis} of {x.shape}")
    if attrs["keepdims"]:
        shape = tuple(1 if d == axis else n for d, n in enumerate(x.shape))
    else:
        shape = tuple(n for d, n in enumerate(x.shape) if d != axis)
    return TensorType(shape, "int64")


def _arg_ref(fn):
    def ref(x: np.ndarray, axis: int, keepdims: bool, select_last_index: bool) -> np.ndarray:
        axis = normalize_axis(axis, x.ndim)
        if select_last_index:
            n = x.shape[axis]
            out = n - 1 - fn(np.flip(x, axis), axis=axis)
        else:
            out = fn(x, axis=axis)
        out = out.astype(np.int64)
        return np.expand_dims(out, axis) if keepdims else out

    return ref


# argmax / argmin: the index (int64) of the first (or, with select_last_index, the last)
# extremum along ``axis``, as ONNX ArgMax / ArgMin.
register_op("argmax", _arg_infer, OpPattern.OPAQUE, _arg_ref(np.argmax))
register_op("argmin", _arg_infer, OpPattern.OPAQUE, _arg_ref(np.argmin))


def _topk_infer(arg_types: list[TensorType], attrs: dict) -> TensorType:
    expect_arity(arg_types, 1)
    (x,) = arg_types
    axis = normalize_axis(attrs["axis"], x.ndim)
    k = attrs["k"]
    # a symbolic extent is decided by its bounds or at run time; a symbolic k is the whole axis
    if isinstance(k, int) and (k < 0 or surely_less(x.shape[axis], k)):
        raise ShapeError(f"k={k} out of range for axis {axis} of {x.shape}")
    return TensorType(x.shape[:axis] + (k,) + x.shape[axis + 1:], "int64")


def _topk_ref(x: np.ndarray, k: int, axis: int, largest: bool) -> np.ndarray:
    axis = normalize_axis(axis, x.ndim)
    # A stable sort keeps equal values in index order, as ONNX TopK requires.
    order = np.argsort(-x if largest else x, axis=axis, kind="stable")
    return np.take(order, np.arange(k), axis=axis).astype(np.int64)


# topk_indices: the indices (int64) of the k largest (smallest) elements along ``axis``,
# sorted, equal values in index order (ONNX TopK's Indices; its Values gather with them).
register_op("topk_indices", _topk_infer, OpPattern.OPAQUE, _topk_ref)
