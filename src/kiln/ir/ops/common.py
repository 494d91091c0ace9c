"""Type-relation helpers shared by every graph op: broadcasting, axes, dtype checks.

The broadcast rule is numpy's (= ONNX multidirectional broadcasting): shapes are aligned on the
right, and each pair of dimensions must be equal or one of them 1.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kiln.errors import ShapeError
from kiln.ir.graph import TensorType

FLOAT_DTYPES = ("float16", "float32", "float64")


def broadcast_shapes(*shapes: Sequence[int]) -> tuple[int, ...]:
    """The numpy broadcast of ``shapes``; raises ShapeError if two dimensions disagree."""
    ndim = max((len(s) for s in shapes), default=0)
    out = [1] * ndim
    for shape in shapes:
        offset = ndim - len(shape)
        for k, dim in enumerate(shape):
            cur = out[offset + k]
            if dim == cur or dim == 1:
                continue
            if cur == 1:
                out[offset + k] = int(dim)
                continue
            shown = " vs ".join(str(tuple(s)) for s in shapes)
            raise ShapeError(f"shapes {shown} do not broadcast")
    return tuple(out)


def normalize_axis(axis: int, ndim: int) -> int:
    """``axis`` in ``[-ndim, ndim)`` mapped to ``[0, ndim)``; out of range raises ShapeError."""
    if not -ndim <= axis < ndim:
        raise ShapeError(f"axis {axis} out of range for rank {ndim}")
    return axis % ndim if ndim else 0


def expect_arity(arg_types: list[TensorType], count: int) -> None:
    """Raise ShapeError unless exactly ``count`` arguments were given."""
    if len(arg_types) != count:
        raise ShapeError(f"expects {count} argument(s), got {len(arg_types)}")


def expect_float(t: TensorType) -> None:
    """Raise ShapeError unless ``t`` has a floating-point dtype."""
    if t.dtype not in FLOAT_DTYPES:
        raise ShapeError(f"needs a floating-point tensor, got {t.dtype}")


def expect_rank(t: TensorType, ndim: int, what: str = "input") -> None:
    """Raise ShapeError unless ``t`` has rank ``ndim``."""
    if t.ndim != ndim:
        raise ShapeError(f"{what} must have rank {ndim}, got shape {t.shape}")


def same_dtype(types: Sequence[TensorType]) -> str:
    """The common dtype of ``types``; mixed dtypes raise ShapeError (no implicit promotion)."""
    dtypes = {t.dtype for t in types}
    if len(dtypes) != 1:
        raise ShapeError(f"argument dtypes differ: {sorted(dtypes)}")
    return types[0].dtype


def lowest(dtype: str) -> float | int:
    """The smallest value of ``dtype`` (-inf for floats): the padding value of max pooling."""
    dt = np.dtype(dtype)
    if dt.kind == "f":
        return -np.inf
    if dt.kind == "b":
        return False
    return int(np.iinfo(dt).min)
