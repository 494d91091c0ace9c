"""Type-relation helpers shared by every graph op: broadcasting, axes, dtype checks.

The broadcast rule is numpy's (= ONNX multidirectional broadcasting): shapes are aligned on the
right, and each pair of dimensions must be equal or one of them 1.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kiln.arith import Dim, SymExpr, bounds, shape_str
from kiln.errors import ShapeError
from kiln.relay.assume import raise_if_assumable
from kiln.relay.graph import TensorType

FLOAT_DTYPES = ("float16", "float32", "float64")


def broadcast_shapes(*shapes: Sequence[Dim]) -> tuple[Dim, ...]:
    """The numpy broadcast of ``shapes``; raises ShapeError if two dimensions disagree.

    Symbolic dims broadcast against 1 and against an equal expression; two different
    expressions (or an expression and an int other than 1) are an error, as they would need a
    run-time check of which one is 1. When one declaration on the input symbols makes them
    equal (:func:`kiln.relay.assume.assume_options`) the error is an
    :class:`~kiln.relay.assume.AssumptionNeeded` carrying it."""
    ndim = max((len(s) for s in shapes), default=0)
    out = [1] * ndim
    for shape in shapes:
        offset = ndim - len(shape)
        for k, dim in enumerate(shape):
            cur = out[offset + k]
            if dim == cur or dim == 1:
                continue
            if isinstance(cur, int) and cur == 1:
                out[offset + k] = dim if isinstance(dim, SymExpr) else int(dim)
                continue
            shown = " vs ".join(shape_str(s) for s in shapes)
            symbolic = isinstance(dim, SymExpr) or isinstance(cur, SymExpr)
            hint = ("; declare the symbols' bounds (--dim NAME=LO..HI, dim_bounds=) if they "
                    "decide it") if symbolic else ""
            message = f"shapes {shown} do not broadcast{hint}"
            if symbolic:  # the importer declares what it needs and imports again
                raise_if_assumable(message, cur, dim, f"shapes {shown} broadcast only if")
            raise ShapeError(message)
    return tuple(out)


def surely_less(dim: Dim, value: int) -> bool:
    """Whether ``dim < value`` for every value of its symbols (``dim < value`` when static).

    Type relations reject a shape only when it is wrong for every input; a symbolic dim that
    is wrong for some inputs only is the user's bounds to declare (the VM checks them)."""
    hi = bounds(dim)[1]
    return hi is not None and hi < value


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
