"""Index-driven graph ops (ONNX's definitions): gather_elements, scatter_elements, gather_nd,
scatter_nd, and cumsum / cumprod.

- ``gather(data, indices, axis)`` (TVM's name for ONNX GatherElements):
  ``out[i] = data[i with i[axis] := indices[i]]``, output shaped like ``indices``.
- ``scatter_elements(data, indices, updates, axis, reduction)``: a copy of ``data`` where
  ``updates[i]`` goes to ``i with i[axis] := indices[i]``; ``reduction`` "none" (the last
  update wins), "add", "mul", "max", "min" combine with the data (ONNX ScatterElements).
- ``gather_nd(data, indices, batch_dims)`` / ``scatter_nd(data, indices, updates, reduction)``:
  ONNX GatherND / ScatterND (index tuples in the last axis of ``indices``).
- ``cumsum(x, axis, exclusive, reverse)`` / ``cumprod``: ONNX CumSum / CumProd.

Negative indices count from the end of their axis. Indices are int32 or int64.
"""

from __future__ import annotations

import numpy as np

from kiln.errors import ShapeError
from kiln.relay.graph import TensorType
from kiln.relay.op.common import expect_arity, normalize_axis
from kiln.relay.op_registry import OpPattern, register_op


def _expect_indices(t: TensorType) -> None:
    if t.dtype not in ("int32", "int64"):
        raise ShapeError(f"indices must be int32 or int64, got {t.dtype}")


def _wrap(indices: np.ndarray, extent: int) -> np.ndarray:
    if np.any((indices < -extent) | (indices >= extent)):
        raise ShapeError(f"index out of range [-{extent}, {extent})")
    return np.where(indices < 0, indices + extent, indices).astype(np.int64)


def _gather_elements_infer(arg_types: list[TensorType], attrs: dict) -> TensorType:
    expect_arity(arg_types, 2)
    data, indices = arg_types
    _expect_indices(indices)
    normalize_axis(attrs["axis"], data.ndim)
    if indices.ndim != data.ndim:
        raise ShapeError(f"indices {indices.shape} and data {data.shape} differ in rank")
    return TensorType(indices.shape, data.dtype)


def _gather_elements_ref(data: np.ndarray, indices: np.ndarray, axis: int) -> np.ndarray:
    axis = normalize_axis(axis, data.ndim)
    return np.take_along_axis(data, _wrap(indices, data.shape[axis]), axis=axis)


register_op("gather", _gather_elements_infer, OpPattern.INJECTIVE,
            _gather_elements_ref)

REDUCTIONS = ("none", "add", "mul", "max", "min")


def _scatter_elements_infer(arg_types: list[TensorType], attrs: dict) -> TensorType:
    expect_arity(arg_types, 3)
    data, indices, updates = arg_types
    _expect_indices(indices)
    normalize_axis(attrs["axis"], data.ndim)
    if attrs["reduction"] not in REDUCTIONS:
        raise ShapeError(f"unknown reduction {attrs['reduction']!r}")
    if indices.shape != updates.shape or indices.ndim != data.ndim or \
            any(i > d for i, d in zip(indices.shape, data.shape)):
        raise ShapeError(f"indices {indices.shape} / updates {updates.shape} do not fit data "
                         f"{data.shape}")
    if updates.dtype != data.dtype:
        raise ShapeError(f"updates dtype {updates.dtype} differs from data {data.dtype}")
    return data


_COMBINE = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}


def _scatter_elements_ref(data, indices, updates, axis: int, reduction: str) -> np.ndarray:
    axis = normalize_axis(axis, data.ndim)
    out = data.copy()
    idx = _wrap(indices, data.shape[axis])
    for pos in np.ndindex(*indices.shape):
        target = list(pos)
        target[axis] = idx[pos]
        t = tuple(target)
        out[t] = updates[pos] if reduction == "none" else _COMBINE[reduction](out[t], updates[pos])
    return out


register_op("scatter_elements", _scatter_elements_infer, OpPattern.OPAQUE, _scatter_elements_ref)


def _gather_nd_infer(arg_types: list[TensorType], attrs: dict) -> TensorType:
    expect_arity(arg_types, 2)
    data, indices = arg_types
    _expect_indices(indices)
    b = attrs["batch_dims"]
    k = indices.shape[-1] if indices.ndim else 0
    if indices.ndim < 1 or b < 0 or b >= min(data.ndim, indices.ndim) or \
            b + k > data.ndim or data.shape[:b] != indices.shape[:b]:
        raise ShapeError(f"indices {indices.shape} do not index data {data.shape} with "
                         f"batch_dims={b}")
    return TensorType(indices.shape[:-1] + data.shape[b + k:], data.dtype)


def _gather_nd_ref(data: np.ndarray, indices: np.ndarray, batch_dims: int) -> np.ndarray:
    b, k = batch_dims, indices.shape[-1]
    out_shape = indices.shape[:-1] + data.shape[b + k:]
    out = np.empty(out_shape, data.dtype)
    for pos in np.ndindex(*indices.shape[:-1]):
        tup = tuple(int(v) % data.shape[b + j] for j, v in enumerate(indices[pos]))
        out[pos] = data[pos[:b] + tup]
    return out


register_op("gather_nd", _gather_nd_infer, OpPattern.INJECTIVE, _gather_nd_ref)


def _scatter_nd_infer(arg_types: list[TensorType], attrs: dict) -> TensorType:
    expect_arity(arg_types, 3)
    data, indices, updates = arg_types
    _expect_indices(indices)
    if attrs["reduction"] not in REDUCTIONS:
        raise ShapeError(f"unknown reduction {attrs['reduction']!r}")
    k = indices.shape[-1] if indices.ndim else 0
    if indices.ndim < 1 or k > data.ndim or \
            updates.shape != indices.shape[:-1] + data.shape[k:]:
        raise ShapeError(f"indices {indices.shape} / updates {updates.shape} do not fit data "
                         f"{data.shape}")
    return data


def _scatter_nd_ref(data, indices, updates, reduction: str) -> np.ndarray:
    out = data.copy()
    for pos in np.ndindex(*indices.shape[:-1]):
        t = tuple(int(v) % data.shape[j] for j, v in enumerate(indices[pos]))
        out[t] = updates[pos] if reduction == "none" else _COMBINE[reduction](out[t], updates[pos])
    return out


register_op("scatter_nd", _scatter_nd_infer, OpPattern.OPAQUE, _scatter_nd_ref)


def _cum_infer(arg_types: list[TensorType], attrs: dict) -> TensorType:
    expect_arity(arg_types, 1)
    normalize_axis(attrs["axis"], arg_types[0].ndim)
    return arg_types[0]


def _cum_ref(fn):
    def ref(x: np.ndarray, axis: int, exclusive: bool, reverse: bool) -> np.ndarray:
        axis = normalize_axis(axis, x.ndim)
        y = np.flip(x, axis) if reverse else x
        out = fn(y, axis=axis, dtype=x.dtype)
        if exclusive:
            ident = 0 if fn is np.cumsum else 1
            out = np.concatenate([np.full_like(np.take(out, [0], axis=axis), ident),
                                  np.delete(out, -1, axis=axis)], axis=axis) \
                if x.shape[axis] else out
        return np.asarray(np.flip(out, axis) if reverse else out, order="C")

    return ref


register_op("cumsum", _cum_infer, OpPattern.OPAQUE, _cum_ref(np.cumsum))
register_op("cumprod", _cum_infer, OpPattern.OPAQUE, _cum_ref(np.cumprod))
