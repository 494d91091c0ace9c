"""Converters of ONNX ops whose output shape depends on data (decision 016).

NonZero, Unique and NonMaxSuppression always do (a constant input folds at import); Compress,
TopK, Range, Reshape, Expand, ConstantOfShape, Tile and Slice do when their condition, ``k``,
bounds, shape, repeats or starts are data rather than compile-time constants: their own
converters (``indexing``, ``reduce``, ``generate``, ``tensor``) call the builders here when
``ctx.const_value`` raises :class:`~kiln.frontend.onnx.context.NotConstantError`.

Each data-dependent dim is a fresh *late symbol* (:func:`late`): named after the op and the
node's output, ``lo`` 0, ``hi`` a static upper bound where one is known. The result is a
``dyn.*`` graph op (:mod:`kiln.relay.op.dynamic`) that the VM runs as a builtin and whose late
symbols it binds from the result's shape.
"""

from __future__ import annotations

import re

import numpy as np

from kiln.arith import Dim
from kiln.frontend.onnx.context import (
    DATA_DEPENDENT_SHAPES,
    SUPPORTED_DTYPES,
    ConvertContext,
    NotConstantError,
)
from kiln.frontend.onnx.registry import onnx_op
from kiln.relay.graph import Constant, Expr


def late(ctx: ConvertContext, what: str, hi: Dim | None = None, output: int = 0) -> tuple:
    """A late symbol's spec ``(name, 0, hi)`` for ONNX output ``output`` of this node: the
    name is ``<what>_<output name>`` made an identifier (kernels name their symbols in C);
    ``hi`` is kept only when static."""
    out = ctx.node.output[output] if output < len(ctx.node.output) else ctx.name
    name = re.sub(r"\W", "_", f"{what}_{out or ctx.name}")
    return (name, 0, hi if isinstance(hi, int) else None)


def fallback(err: NotConstantError) -> None:
    """Re-raise ``err`` (a value needed at compile time is data) unless data-dependent ops
    are allowed (:func:`~kiln.frontend.onnx.context.static_values_only`)."""
    if not DATA_DEPENDENT_SHAPES.get():
        raise err


def folded(ctx: ConvertContext, call: Expr) -> Expr:
    """``call`` as a Constant when its inputs are compile-time constants (evaluated by the
    graph interpreter with the op's numpy reference), else ``call``."""
    if not ctx.folds_to_constant(call):
        return call
    return Constant(ctx.const_value(call, f"{ctx.node.op_type} result"))


def _tensor_input(ctx: ConvertContext, index: int, fallback: np.ndarray) -> Expr:
    """Optional input ``index``, or the constant ``fallback`` where it is absent."""
    x = ctx.optional_input(index)
    return Constant(fallback) if x is None else x


@onnx_op("NonZero", since=9)
def nonzero(ctx: ConvertContext) -> Expr:
    """int64 ``[rank, n]``; ``n`` (``nonzero_count_*``) is at most the input's size."""
    x = ctx.input(0)
    t = x.checked_type
    return folded(ctx, ctx.call("dyn.nonzero", [x],
                                shape=(t.ndim, late(ctx, "nonzero_count", t.size))))


@onnx_op("Unique", since=11)
def unique(ctx: ConvertContext) -> list[Expr]:
    """``Y``, ``indices``, ``inverse_indices``, ``counts``; ``U`` unique values or slices
    (``unique_count_*``), at most the input's size (or its axis' extent)."""
    x = ctx.input(0)
    t = x.checked_type
    axis = ctx.attr("axis", None)
    axis = None if axis is None else ctx.axis(int(axis), t.ndim)
    sort = bool(ctx.attr("sorted", 1))
    extent = t.size if axis is None else t.shape[axis]
    u = late(ctx, "unique_count", extent)
    y_shape = (u,) if axis is None else t.shape[:axis] + (u,) + t.shape[axis + 1:]
    shapes = (y_shape, (u,), (extent,), (u,))
    return [folded(ctx, ctx.call("dyn.unique", [x], shape=tuple(shape), output=k, axis=axis,
                                 sort=sort))
            for k, shape in enumerate(shapes)]


@onnx_op("NonMaxSuppression", since=10)
def non_max_suppression(ctx: ConvertContext) -> Expr:
    """int64 ``[n, 3]`` selected ``(batch, class, box)``; ``n`` (``nms_count_*``) at most
    batches × classes × boxes. Absent optional inputs are empty constants (what the ONNX
    reference reads as absent)."""
    boxes, scores = ctx.input(0), ctx.input(1)
    bt, st = boxes.checked_type, scores.checked_type
    if bt.ndim != 3 or st.ndim != 3:
        raise ctx.unsupported(f"boxes {bt} and scores {st} must be [B, N, 4] and [B, C, N]")
    args = [boxes, scores, _tensor_input(ctx, 2, np.zeros(0, np.int64)),
            _tensor_input(ctx, 3, np.zeros(0, np.float32)),
            _tensor_input(ctx, 4, np.zeros(0, np.float32))]
    hi = bt.shape[0] * st.shape[1] * bt.shape[1]
    return folded(ctx, ctx.call("dyn.non_max_suppression", args,
                                shape=(late(ctx, "nms_count", hi), 3),
                                center_point_box=int(ctx.attr("center_point_box", 0))))


def compress(ctx: ConvertContext, x: Expr, axis: int | None) -> Expr:
    """Compress with a data condition (``axis`` None: ``x`` flattened)."""
    t = x.checked_type
    extent = t.size if axis is None else t.shape[axis]
    n = late(ctx, "compress_count", extent)
    shape = (n,) if axis is None else t.shape[:axis] + (n,) + t.shape[axis + 1:]
    return ctx.call("dyn.compress", [x, ctx.input(1)], shape=tuple(shape), axis=axis)


def topk(ctx: ConvertContext, axis: int, largest: bool) -> list[Expr]:
    """TopK with a data ``k`` (``topk_k_*``, at most the axis' extent)."""
    x, k = ctx.input(0), ctx.input(1)
    t = x.checked_type
    kk = late(ctx, "topk_k", t.shape[axis])
    shape = t.shape[:axis] + (kk,) + t.shape[axis + 1:]
    return [ctx.call("dyn.topk", [x, k], shape=shape, output=o, axis=axis, largest=largest)
            for o in (0, 1)]


def range_(ctx: ConvertContext) -> Expr:
    """Range over data bounds: ``[n]`` (``range_count_*``, unbounded)."""
    args = [ctx.input(k) for k in range(3)]
    dtype = args[0].checked_type.dtype
    if any(a.checked_type.dtype != dtype or a.checked_type.size != 1 for a in args):
        raise ctx.unsupported("start, limit and delta must be scalars of one type")
    return ctx.call("dyn.range", args, shape=(late(ctx, "range_count"),))


def _shape_length(ctx: ConvertContext, index: int, what: str) -> int:
    t = ctx.input(index).checked_type
    if t.ndim != 1 or not isinstance(t.shape[0], int) or np.dtype(t.dtype).kind not in "iu":
        raise ctx.unsupported(f"{what} from data must be a 1-D integer tensor of static length, "
                              f"got {t}")
    return t.shape[0]


def reshape(ctx: ConvertContext, allowzero: bool) -> Expr:
    """Reshape to a shape given as data: every output dim is late (``reshape_dim<i>_*``)."""
    x = ctx.input(0)
    n = _shape_length(ctx, 1, "Reshape shape")
    size = x.checked_type.size
    hi = size if isinstance(size, int) and size > 0 else None
    shape = tuple(late(ctx, f"reshape_dim{i}", hi) for i in range(n))
    return ctx.call("dyn.reshape", [x, ctx.input(1)], shape=shape, allowzero=allowzero)


def expand(ctx: ConvertContext) -> Expr:
    """Expand to a shape given as data: a dim the input has (not 1) stays; the others are
    late (``expand_dim<i>_*``)."""
    x = ctx.input(0)
    in_shape = x.checked_type.shape
    ndim = max(len(in_shape), _shape_length(ctx, 1, "Expand shape"))
    lead = ndim - len(in_shape)
    shape = []
    for i in range(ndim):
        d = in_shape[i - lead] if i >= lead else 1
        shape.append(d if isinstance(d, int) and d != 1 else late(ctx, f"expand_dim{i}"))
    return ctx.call("dyn.expand", [x, ctx.input(1)], shape=tuple(shape))


def constant_of_shape(ctx: ConvertContext, fill: np.ndarray) -> Expr:
    """ConstantOfShape of a shape given as data (``constant_of_shape_dim<i>_*``)."""
    n = _shape_length(ctx, 0, "ConstantOfShape shape")
    if fill.dtype.name not in SUPPORTED_DTYPES:
        raise ctx.unsupported(f"value of type {fill.dtype}")
    shape = tuple(late(ctx, f"constant_of_shape_dim{i}") for i in range(n))
    return ctx.call("dyn.constant_of_shape", [ctx.input(0)], shape=shape,
                    value=fill.reshape(-1)[0].item(), dtype=fill.dtype.name)


def tile(ctx: ConvertContext) -> Expr:
    """Tile with data repeats: every dim is late (``tile_dim<i>_*``)."""
    x = ctx.input(0)
    ndim = x.checked_type.ndim
    if _shape_length(ctx, 1, "Tile repeats") != ndim:
        raise ctx.unsupported(f"repeats of {ctx.input(1).checked_type} for rank {ndim}")
    shape = tuple(late(ctx, f"tile_dim{i}") for i in range(ndim))
    return ctx.call("dyn.tile", [x, ctx.input(1)], shape=shape)


def slice_(ctx: ConvertContext) -> Expr:
    """Slice (opset 10+) with data starts/ends/axes/steps: the sliced dims are late
    (``slice_dim<i>_*``, at most the input's dim), all of them when the axes are data too."""
    x = ctx.input(0)
    in_shape = x.checked_type.shape
    n = _shape_length(ctx, 1, "Slice starts")
    axes_in = ctx.optional_input(3)
    sliced = set(range(len(in_shape)))
    if axes_in is None:
        sliced = set(range(n))
    elif ctx.folds_to_constant(axes_in):
        sliced = {int(a) % len(in_shape) for a in ctx.const_value(3, "Slice axes").reshape(-1)}
    shape = tuple(late(ctx, f"slice_dim{i}", d) if i in sliced else d
                  for i, d in enumerate(in_shape))
    args = [x, ctx.input(1), ctx.input(2), _tensor_input(ctx, 3, np.arange(n, dtype=np.int64)),
            _tensor_input(ctx, 4, np.ones(n, dtype=np.int64))]
    return ctx.call("dyn.slice", args, shape=shape)
