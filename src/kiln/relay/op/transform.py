"""Injective graph ops: reshape, transpose, concatenate, strided_slice, take, expand.

Every attribute is fully static and normalized by the frontend, so a compute needs no defaults:
``reshape.newshape`` and ``expand.newshape`` are the concrete output shapes, ``transpose.axes``
is a full permutation, and ``strided_slice`` uses the convention documented on
:func:`slice_length`.
"""

from __future__ import annotations

import numpy as np

from kiln import arith
from kiln.arith import SymbolicValueError, SymExpr
from kiln.errors import ShapeError
from kiln.relay.assume import raise_if_assumable
from kiln.relay.graph import TensorType
from kiln.relay.op.common import (
    broadcast_shapes,
    expect_arity,
    normalize_axis,
    same_dtype,
    surely_less,
)
from kiln.relay.op_registry import OpPattern, register_op


def _reshape_infer(arg_types: list[TensorType], attrs: dict) -> TensorType:
    expect_arity(arg_types, 1)
    (x,) = arg_types
    newshape = tuple(attrs["newshape"])
    if any(isinstance(d, int) and d < 0 for d in newshape) or not arith.provably_equal(
            arith.prod(newshape), x.size):
        raise ShapeError(f"cannot reshape {arith.shape_str(x.shape)} to "
                         f"{arith.shape_str(newshape)}")
    return TensorType(newshape, x.dtype)


register_op("reshape", _reshape_infer, OpPattern.INJECTIVE,
            lambda x, newshape: x.reshape(newshape).copy())


def _transpose_infer(arg_types: list[TensorType], attrs: dict) -> TensorType:
    expect_arity(arg_types, 1)
    (x,) = arg_types
    axes = tuple(attrs["axes"])
    if sorted(axes) != list(range(x.ndim)):
        raise ShapeError(f"axes {axes} are not a permutation of rank {x.ndim}")
    return TensorType(tuple(x.shape[a] for a in axes), x.dtype)


register_op("transpose", _transpose_infer, OpPattern.INJECTIVE,
            lambda x, axes: np.asarray(np.transpose(x, axes), order="C"))


def _concatenate_infer(arg_types: list[TensorType], attrs: dict) -> TensorType:
    if not arg_types:
        raise ShapeError("needs at least one argument")
    dtype = same_dtype(arg_types)
    first = arg_types[0]
    axis = normalize_axis(attrs["axis"], first.ndim)
    for t in arg_types[1:]:
        if t.ndim != first.ndim:
            raise ShapeError(f"shapes {[t.shape for t in arg_types]} differ in rank")
        for d, (a, b) in enumerate(zip(t.shape, first.shape)):
            if d == axis or arith.provably_equal(a, b):
                continue
            message = f"shapes {[t.shape for t in arg_types]} differ off axis {axis}"
            if isinstance(a, SymExpr) or isinstance(b, SymExpr):
                # an upsampled map beside its skip connection: equal when the input's size is
                # a multiple of the strides (YOLO's FPN); the importer assumes it
                raise_if_assumable(message, a, b, f"concatenate inputs agree on axis {d} only if")
            raise ShapeError(message)
    total = sum(t.shape[axis] for t in arg_types)
    return TensorType(first.shape[:axis] + (total,) + first.shape[axis + 1:], dtype)


register_op("concatenate", _concatenate_infer, OpPattern.INJECTIVE,
            lambda *xs, axis: np.concatenate(xs, axis=axis))


def slice_length(extent: int, begin: int, end: int, stride: int) -> int:
    """Length of one axis of ``strided_slice``; raises ShapeError for a non-normalized triple.

    The normalized convention (what the frontend produces and computes rely on): element ``i`` of
    the output axis reads input index ``begin + stride * i``. With ``stride > 0``:
    ``0 <= begin <= end <= extent`` and the length is ``ceil((end - begin) / stride)``. With
    ``stride < 0``: ``-1 <= end <= begin <= extent - 1`` (``end == -1`` means "stop before index 0",
    not "the last element") and the length is ``ceil((begin - end) / -stride)``. An empty axis has
    ``begin == end``.
    """
    if not all(isinstance(v, int) for v in (extent, begin, end)):
        # Symbolic bounds come normalized from the frontend (clamped with arith.minimum/maximum).
        if not isinstance(stride, int) or stride == 0:
            raise ShapeError(f"slice stride {stride} must be a nonzero integer")
        span = end - begin if stride > 0 else begin - end
        return arith.floordiv(span + abs(stride) - 1, abs(stride))
    if stride > 0 and 0 <= begin <= end <= extent:
        return -(-(end - begin) // stride)
    if stride < 0 and -1 <= end <= begin <= extent - 1:
        return -(-(begin - end) // -stride)
    if stride < 0 and begin == end and extent == 0:
        return 0
    raise ShapeError(f"slice (begin={begin}, end={end}, stride={stride}) is not normalized for "
                     f"extent {extent}")


def _strided_slice_infer(arg_types: list[TensorType], attrs: dict) -> TensorType:
    expect_arity(arg_types, 1)
    (x,) = arg_types
    begin, end, strides = attrs["begin"], attrs["end"], attrs["strides"]
    if not len(begin) == len(end) == len(strides) == x.ndim:
        raise ShapeError(f"begin/end/strides need one entry per axis of {x.shape}")
    shape = tuple(slice_length(n, b, e, s) for n, b, e, s in zip(x.shape, begin, end, strides))
    return TensorType(shape, x.dtype)


def _strided_slice_ref(x: np.ndarray, begin, end, strides) -> np.ndarray:
    index = tuple(slice(b, e if e >= 0 else None, s) for b, e, s in zip(begin, end, strides))
    return np.asarray(x[index], order="C")


register_op("strided_slice", _strided_slice_infer, OpPattern.INJECTIVE, _strided_slice_ref)


def _take_infer(arg_types: list[TensorType], attrs: dict) -> TensorType:
    expect_arity(arg_types, 2)
    data, indices = arg_types
    if np.dtype(indices.dtype).kind not in "iu":
        raise ShapeError(f"indices must be integers, got {indices.dtype}")
    axis = normalize_axis(attrs["axis"], data.ndim)
    return TensorType(data.shape[:axis] + indices.shape + data.shape[axis + 1:], data.dtype)


def _take_ref(data: np.ndarray, indices: np.ndarray, axis: int) -> np.ndarray:
    extent = data.shape[axis]
    if np.any((indices < -extent) | (indices >= extent)):
        raise ShapeError(f"take: index out of range [-{extent}, {extent})")
    return np.take(data, np.where(indices < 0, indices + extent, indices), axis=axis)


register_op("take", _take_infer, OpPattern.INJECTIVE, _take_ref)


def _expand_infer(arg_types: list[TensorType], attrs: dict) -> TensorType:
    expect_arity(arg_types, 1)
    (x,) = arg_types
    newshape = tuple(attrs["newshape"])
    if len(newshape) < x.ndim or broadcast_shapes(x.shape, newshape) != newshape:
        raise ShapeError(f"cannot broadcast {x.shape} to {newshape}")
    return TensorType(newshape, x.dtype)


register_op("expand", _expand_infer, OpPattern.BROADCAST,
            lambda x, newshape: np.broadcast_to(x, newshape).copy())


PAD_MODES = ("constant", "edge", "reflect", "wrap")


def _pad_infer(arg_types: list[TensorType], attrs: dict) -> TensorType:
    expect_arity(arg_types, 1)
    (x,) = arg_types
    width = attrs["pad_width"]
    if len(width) != x.ndim or attrs["pad_mode"] not in PAD_MODES:
        raise ShapeError(f"pad_width {width} / mode {attrs['pad_mode']!r} for shape {x.shape}")
    shape = tuple(n + lo + hi for n, (lo, hi) in zip(x.shape, width))
    if any(surely_less(d, 0) for d in shape):
        raise ShapeError(f"pad_width {width} crops {x.shape} below zero")
    if attrs["pad_mode"] != "constant" and any(
            isinstance(n, int) and n == 0 and (lo > 0 or hi > 0)
            for n, (lo, hi) in zip(x.shape, width)):
        raise ShapeError(f"mode {attrs['pad_mode']!r} cannot pad an empty axis of {x.shape}")
    return TensorType(shape, x.dtype)


def _pad_ref(x: np.ndarray, pad_width, pad_value: float, pad_mode: str) -> np.ndarray:
    # Negative widths crop first (ONNX Pad); then numpy pads the rest.
    crop = tuple(slice(max(-lo, 0), n - max(-hi, 0)) for n, (lo, hi) in zip(x.shape, pad_width))
    grow = [(max(lo, 0), max(hi, 0)) for lo, hi in pad_width]
    mode = {"edge": "edge", "reflect": "reflect", "wrap": "wrap"}.get(pad_mode, "constant")
    kwargs = {"constant_values": pad_value} if mode == "constant" else {}
    return np.pad(x[crop], grow, mode=mode, **kwargs).astype(x.dtype, copy=False)


# nn.pad (TVM's name): pad_width ((before, after) per axis; negative values crop), pad_value
# (constant mode), pad_mode "constant" | "edge" | "reflect" | "wrap" (ONNX Pad's modes).
register_op("nn.pad", _pad_infer, OpPattern.INJECTIVE, _pad_ref)


def _arange_infer(arg_types: list[TensorType], attrs: dict) -> TensorType:
    expect_arity(arg_types, 2)
    start, delta = arg_types
    if start.shape != () or delta.shape != () or start.dtype != delta.dtype:
        raise ShapeError(f"arange needs scalar start and delta of one dtype, got {start} and "
                         f"{delta}")
    return TensorType((attrs["count"],), start.dtype)


# ONNX Range whose bounds are shape values: ``count`` (a dim, possibly symbolic) values
# start + k·delta. The causal masks of decoder exports are built this way (Range(past, total)).
def _arange_ref(start: np.ndarray, delta: np.ndarray, count) -> np.ndarray:
    if isinstance(count, SymExpr):  # (evaluated at compile time: a value known at run time only)
        raise SymbolicValueError(f"arange over the symbolic count {count}")
    return (start + np.arange(count, dtype=start.dtype) * delta).astype(start.dtype)


register_op("arange", _arange_infer, OpPattern.INJECTIVE, _arange_ref)
