"""Converters of ONNX tensor-manipulation ops: Reshape, Flatten, Transpose, Concat, Squeeze,
Unsqueeze, Slice, Gather, Expand, Identity, and the constant producers Shape, Constant and
ConstantOfShape (shapes are static, so these yield Constants; a shape, repeats or slice bounds
computed from data make Reshape, Expand, ConstantOfShape, Tile and Slice data-dependent:
``converters.dynamic``)."""

from __future__ import annotations

import numpy as np

from kiln import arith
from kiln.frontend.onnx.context import SUPPORTED_DTYPES, ConvertContext, NotConstantError
from kiln.frontend.onnx.converters import dynamic
from kiln.frontend.onnx.registry import onnx_op
from kiln.relay.assume import raise_if_assumable
from kiln.relay.graph import Constant, Expr, symbolic_array
from kiln.relay.op.common import broadcast_shapes


@onnx_op("Identity", since=1)
def identity(ctx: ConvertContext) -> Expr:
    return ctx.input(0)


@onnx_op("Reshape", since=5)
def reshape(ctx: ConvertContext) -> Expr:
    x = ctx.input(0)
    allowzero = bool(ctx.attr("allowzero", 0))
    try:
        target = ctx.const_dims(1, "Reshape shape")
    except NotConstantError as err:  # a shape computed from data: bound at run time
        dynamic.fallback(err)
        return dynamic.reshape(ctx, allowzero)
    in_shape = x.checked_type.shape
    out: list[arith.Dim] = []
    infer = None
    for k, d in enumerate(target):
        if not isinstance(d, int):
            out.append(d)  # a symbolic dim (from Shape): positive by construction
        elif d == 0 and not allowzero:
            if k >= len(in_shape):
                raise ctx.unsupported(f"shape {target}: 0 at {k} has no input dimension to copy")
            out.append(in_shape[k])
        elif d == -1:
            if infer is not None:
                raise ctx.unsupported(f"shape {target} has more than one -1")
            infer = k
            out.append(1)
        elif d < 0:
            raise ctx.unsupported(f"shape {target} has a negative dimension")
        else:
            out.append(d)
    size = x.checked_type.size
    if infer is not None:
        known = arith.prod(out)
        if known == 0 or arith.floormod(size, known) != 0:
            message = (f"cannot infer -1 in {arith.shape_str(target)} for input shape "
                       f"{arith.shape_str(in_shape)}")
            _assume(message, 0 if known == 0 else arith.floormod(size, known), 0)
            raise ctx.unsupported(message)
        out[infer] = arith.floordiv(size, known)
    if not arith.provably_equal(arith.prod(out), size):
        message = f"cannot reshape {arith.shape_str(in_shape)} to {arith.shape_str(out)}"
        _assume(message, arith.prod(out), size)
        raise ctx.unsupported(message)
    return ctx.reshape(x, out)


def _assume(message: str, a: arith.Dim, b: arith.Dim) -> None:
    """Raise AssumptionNeeded when one declaration on the input symbols makes ``a == b`` (a
    reshape's element count, a divisibility), for the importer to declare (kiln.relay.assume)."""
    raise_if_assumable(message, a, b, f"{message} holds only if")


@onnx_op("Flatten", since=1)
def flatten(ctx: ConvertContext) -> Expr:
    x = ctx.input(0)
    shape = x.checked_type.shape
    axis = int(ctx.attr("axis", 1))
    if not -len(shape) <= axis <= len(shape):
        raise ctx.unsupported(f"axis {axis} out of range for rank {len(shape)}")
    axis = axis + len(shape) if axis < 0 else axis
    return ctx.reshape(x, (arith.prod(shape[:axis]), arith.prod(shape[axis:])))


@onnx_op("Transpose", since=1)
def transpose(ctx: ConvertContext) -> Expr:
    x = ctx.input(0)
    ndim = x.checked_type.ndim
    perm = ctx.ints("perm", tuple(reversed(range(ndim))))
    if sorted(perm) != list(range(ndim)):
        raise ctx.unsupported(f"perm {perm} is not a permutation of rank {ndim}")
    if perm == tuple(range(ndim)):
        return x
    return ctx.call("transpose", [x], axes=perm)


@onnx_op("Concat", since=4)
def concat(ctx: ConvertContext) -> Expr:
    args = [ctx.input(k) for k in range(len(ctx.inputs))]
    ndim = args[0].checked_type.ndim
    axis = ctx.axis(int(ctx.attr("axis")), ndim)
    if len(args) == 1:
        return args[0]
    return ctx.call("concatenate", args, axis=axis)


def _squeeze(ctx: ConvertContext, axes: tuple[int, ...] | None) -> Expr:
    x = ctx.input(0)
    shape = x.checked_type.shape
    if axes is None:
        drop = tuple(k for k, d in enumerate(shape) if d == 1)
    else:
        drop = ctx.axes(axes, len(shape))
        if any(shape[a] != 1 for a in drop):
            raise ctx.unsupported(f"cannot squeeze axes {axes} of shape {shape}")
    return ctx.reshape(x, [d for k, d in enumerate(shape) if k not in drop])


@onnx_op("Squeeze", since=1)
def squeeze_v1(ctx: ConvertContext) -> Expr:
    return _squeeze(ctx, ctx.ints("axes"))


@onnx_op("Squeeze", since=13)
def squeeze_v13(ctx: ConvertContext) -> Expr:
    if ctx.optional_input(1) is None:
        return _squeeze(ctx, None)
    return _squeeze(ctx, ctx.const_ints(1, "Squeeze axes"))


def _unsqueeze(ctx: ConvertContext, axes: tuple[int, ...]) -> Expr:
    x = ctx.input(0)
    shape = list(x.checked_type.shape)
    out_ndim = len(shape) + len(axes)
    inserted = set(ctx.axes(axes, out_ndim))
    it = iter(shape)
    return ctx.reshape(x, [1 if k in inserted else next(it) for k in range(out_ndim)])


@onnx_op("Unsqueeze", since=1)
def unsqueeze_v1(ctx: ConvertContext) -> Expr:
    return _unsqueeze(ctx, ctx.ints("axes", ()))


@onnx_op("Unsqueeze", since=13)
def unsqueeze_v13(ctx: ConvertContext) -> Expr:
    return _unsqueeze(ctx, ctx.const_ints(1, "Unsqueeze axes"))


@onnx_op("Shape", since=1)
def shape(ctx: ConvertContext) -> Expr:
    dims = ctx.input(0).checked_type.shape
    ndim = len(dims)
    start = int(ctx.attr("start", 0))
    end = ctx.attr("end", None)
    end = ndim if end is None else int(end)
    start = min(max(start + ndim if start < 0 else start, 0), ndim)
    end = min(max(end + ndim if end < 0 else end, 0), ndim)
    return Constant(symbolic_array(list(dims[start:end])).reshape(end - start))


@onnx_op("Constant", since=1)
def constant(ctx: ConvertContext) -> Expr:
    for name in ("sparse_value", "value_string", "value_strings"):
        if ctx.has_attr(name):
            raise ctx.unsupported(f"attribute '{name}'")
    if ctx.has_attr("value"):
        value = np.asarray(ctx.attr("value"))
        if value.dtype.name not in SUPPORTED_DTYPES:
            raise ctx.unsupported(f"constant of dtype {value.dtype}")
    elif ctx.has_attr("value_float"):
        value = np.array(ctx.attr("value_float"), dtype=np.float32)
    elif ctx.has_attr("value_floats"):
        value = np.array(ctx.attr("value_floats"), dtype=np.float32)
    elif ctx.has_attr("value_int"):
        value = np.array(ctx.attr("value_int"), dtype=np.int64)
    elif ctx.has_attr("value_ints"):
        value = np.array(ctx.attr("value_ints"), dtype=np.int64)
    else:
        raise ctx.unsupported("no value attribute")
    return Constant(value, name=ctx.node.output[0])


@onnx_op("ConstantOfShape", since=9)
def constant_of_shape(ctx: ConvertContext) -> Expr:
    fill = ctx.attr("value", None)
    fill = np.zeros(1, np.float32) if fill is None else np.asarray(fill).reshape(-1)
    if fill.size != 1 or fill.dtype.name not in SUPPORTED_DTYPES:
        raise ctx.unsupported("value must be a one-element numeric tensor")
    try:
        dims = ctx.const_dims(0, "ConstantOfShape shape")
    except NotConstantError as err:
        dynamic.fallback(err)
        return dynamic.constant_of_shape(ctx, fill)
    if any(isinstance(d, int) and d < 0 for d in dims):
        raise ctx.unsupported(f"negative dimension in {dims}")
    if not all(isinstance(d, int) for d in dims):  # a symbolic shape: filled at run time
        return ctx.call("expand", [Constant(fill.reshape(()))], newshape=tuple(dims))
    if not fill[0]:
        return Constant(np.zeros(dims, dtype=fill.dtype), name=ctx.node.output[0])
    return Constant(np.full(dims, fill[0], dtype=fill.dtype), name=ctx.node.output[0])


def _slice(ctx: ConvertContext, starts: tuple[int, ...], ends: tuple[int, ...],
           axes: tuple[int, ...] | None, steps: tuple[int, ...] | None) -> Expr:
    x = ctx.input(0)
    shape = x.checked_type.shape
    ndim = len(shape)
    axes = tuple(range(len(starts))) if axes is None else axes
    steps = (1,) * len(starts) if steps is None else steps
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise ctx.unsupported("starts, ends, axes and steps differ in length")
    norm_axes = [a % ndim if -ndim <= a < ndim else None for a in axes]
    if None in norm_axes or len(set(norm_axes)) != len(norm_axes):
        raise ctx.unsupported(f"bad axes {axes} for rank {ndim}")
    begin, end, strides = [0] * ndim, list(shape), [1] * ndim
    for a, s, e, st in zip(norm_axes, starts, ends, steps):
        assert a is not None
        begin[a], end[a], strides[a] = _normalize_slice(ctx, shape[a], s, e, st)
    if all(isinstance(b, int) and b == 0 for b in begin) and end == list(shape) and \
            strides == [1] * ndim:
        return x
    return ctx.call("strided_slice", [x], begin=tuple(begin), end=tuple(end),
                    strides=tuple(strides))


def _normalize_slice(ctx: ConvertContext, n: arith.Dim, start: arith.Dim, end: arith.Dim,
                     step: arith.Dim) -> tuple[arith.Dim, arith.Dim, int]:
    """ONNX Slice clamping (onnx/defs/tensor/defs.cc) into strided_slice's convention; dims and
    bounds may be symbolic (a symbolic start or end counts from the front)."""
    if not isinstance(step, int):
        raise ctx.unsupported(f"step {step} must be static")
    if step == 0:
        raise ctx.unsupported("step 0")
    start = start + n if isinstance(start, int) and start < 0 else start
    end = end + n if isinstance(end, int) and end < 0 else end
    lo, hi = arith.minimum, arith.maximum
    if step > 0:
        start = lo(hi(start, 0), n)
        end = lo(hi(end, start), n)
    else:
        start = lo(hi(start, 0), n - 1)
        end = lo(hi(end, -1), start)
    return start, end, step


@onnx_op("Slice", since=1)
def slice_v1(ctx: ConvertContext) -> Expr:
    return _slice(ctx, ctx.ints("starts"), ctx.ints("ends"), ctx.ints("axes"), None)


@onnx_op("Slice", since=10)
def slice_v10(ctx: ConvertContext) -> Expr:
    def optional(k: int, what: str) -> tuple[int, ...] | None:
        if ctx.optional_input(k) is None:
            return None
        return ctx.const_ints(k, what)

    try:
        return _slice(ctx, ctx.const_dims(1, "Slice starts"), ctx.const_dims(2, "Slice ends"),
                      optional(3, "Slice axes"), optional(4, "Slice steps"))
    except NotConstantError as err:
        dynamic.fallback(err)
        return dynamic.slice_(ctx)


@onnx_op("Gather", since=1)
def gather(ctx: ConvertContext) -> Expr:
    data, indices = ctx.input(0), ctx.input(1)
    axis = ctx.axis(int(ctx.attr("axis", 0)), data.checked_type.ndim)
    return ctx.call("take", [data, indices], axis=axis)


@onnx_op("Expand", since=8)
def expand(ctx: ConvertContext) -> Expr:
    x = ctx.input(0)
    try:
        target = ctx.const_dims(1, "Expand shape")
    except NotConstantError as err:
        dynamic.fallback(err)
        return dynamic.expand(ctx)
    newshape = broadcast_shapes(x.checked_type.shape, target)
    if newshape == x.checked_type.shape:
        return x
    return ctx.call("expand", [x], newshape=newshape)


@onnx_op("Size", since=1)
def size(ctx: ConvertContext) -> Expr:
    return Constant(symbolic_array(ctx.input(0).checked_type.size))


def _split_sizes(ctx: ConvertContext, extent: int, count: int) -> tuple[int, ...]:
    """Split-18 without ``split``: ``num_outputs`` (or the node's output count) parts of
    ceil(extent / n), the last one smaller."""
    if ctx.opset >= 18 and ctx.has_attr("num_outputs"):
        count = int(ctx.attr("num_outputs"))
    if count <= 0:
        raise ctx.unsupported("no outputs to split into")
    part = -(-extent // count)
    sizes = [min(part, max(extent - k * part, 0)) for k in range(count)]
    if ctx.opset < 18 and extent % count:
        raise ctx.unsupported(f"axis of {extent} does not split evenly into {count}")
    return tuple(sizes)


@onnx_op("Split", since=1)
def split(ctx: ConvertContext) -> list[Expr]:
    x = ctx.input(0)
    shape = x.checked_type.shape
    axis = ctx.axis(int(ctx.attr("axis", 0)), len(shape))
    if ctx.opset >= 13:
        sizes = ctx.const_ints(1, "Split split") if ctx.optional_input(1) is not None else None
    else:
        sizes = ctx.ints("split")
        if sizes is None and ctx.opset < 2 and ctx.optional_input(1) is not None:
            sizes = ctx.const_ints(1, "Split split")
    if not sizes:
        sizes = _split_sizes(ctx, shape[axis], len(ctx.node.output))
    if sum(sizes) != shape[axis] or any(s < 0 for s in sizes):
        raise ctx.unsupported(f"split {sizes} does not cover axis {axis} of {shape}")
    outs, start = [], 0
    for s in sizes:
        begin, end = [0] * len(shape), list(shape)
        begin[axis], end[axis] = start, start + s
        strides = (1,) * len(shape)
        if s == shape[axis]:
            outs.append(x)
        else:
            outs.append(ctx.call("strided_slice", [x], begin=tuple(begin), end=tuple(end),
                                 strides=strides))
        start += s
    return outs


@onnx_op("Tile", since=6)
def tile(ctx: ConvertContext) -> Expr:
    """Per repeated axis: insert a size-1 axis before it, expand that to the repeat count and
    merge the two (reshape → expand → reshape; FuseOps makes it one injective kernel). A
    repeat count from shape arithmetic (DeBERTa tiles by the batch) is a symbolic extent."""
    x = ctx.input(0)
    try:
        repeats = ctx.const_dims(1, "Tile repeats")
    except NotConstantError as err:
        dynamic.fallback(err)
        return dynamic.tile(ctx)
    shape = list(x.checked_type.shape)
    if len(repeats) != len(shape) or any(isinstance(r, int) and r < 0 for r in repeats):
        raise ctx.unsupported(f"repeats {repeats} for shape {tuple(shape)}")
    out = x
    for axis, r in enumerate(repeats):
        if isinstance(r, int) and r == 1:
            continue
        split_shape = shape[:axis] + [1] + shape[axis:]
        wide = list(split_shape)
        wide[axis] = r
        out = ctx.call("expand", [ctx.reshape(out, split_shape)], newshape=tuple(wide))
        shape[axis] = arith.mul(shape[axis], r)
        out = ctx.reshape(out, shape)
    return out


def _blocks(ctx: ConvertContext) -> tuple[Expr, int, tuple[int, ...]]:
    x = ctx.input(0)
    if x.checked_type.ndim != 4:
        raise ctx.unsupported(f"needs a 4-D NCHW input, got shape {x.checked_type.shape}")
    return x, int(ctx.attr("blocksize")), x.checked_type.shape


@onnx_op("DepthToSpace", since=1)
def depth_to_space(ctx: ConvertContext) -> Expr:
    x, b, (n, c, h, w) = _blocks(ctx)
    if c % (b * b):
        raise ctx.unsupported(f"channels {c} not divisible by blocksize² {b * b}")
    mode = ctx.attr("mode", "DCR")
    if mode == "DCR":
        tmp = ctx.reshape(x, (n, b, b, c // (b * b), h, w))
        perm = (0, 3, 4, 1, 5, 2)
    elif mode == "CRD":
        tmp = ctx.reshape(x, (n, c // (b * b), b, b, h, w))
        perm = (0, 1, 4, 2, 5, 3)
    else:
        raise ctx.unsupported(f"mode={mode!r}")
    tmp = ctx.call("transpose", [tmp], axes=perm)
    return ctx.reshape(tmp, (n, c // (b * b), h * b, w * b))


@onnx_op("SpaceToDepth", since=1)
def space_to_depth(ctx: ConvertContext) -> Expr:
    x, b, (n, c, h, w) = _blocks(ctx)
    if h % b or w % b:
        raise ctx.unsupported(f"spatial {h}x{w} not divisible by blocksize {b}")
    mode = ctx.attr("mode", "DCR")
    tmp = ctx.reshape(x, (n, c, h // b, b, w // b, b))
    if mode == "DCR":
        perm = (0, 3, 5, 1, 2, 4)
    elif mode == "CRD":
        perm = (0, 1, 3, 5, 2, 4)
    else:
        raise ctx.unsupported(f"mode={mode!r}")
    tmp = ctx.call("transpose", [tmp], axes=perm)
    return ctx.reshape(tmp, (n, c * b * b, h // b, w // b))


def _pad_widths(ctx: ConvertContext, pads: tuple[int, ...], ndim: int,
                axes: tuple[int, ...] | None) -> tuple[tuple[int, int], ...]:
    """ONNX ``pads`` [x1_begin, x2_begin, ..., x1_end, x2_end, ...] over ``axes`` (default
    all) as (before, after) per axis."""
    axes = tuple(range(ndim)) if axes is None else tuple(
        a % ndim if -ndim <= a < ndim else None for a in axes)
    if None in axes or len(pads) != 2 * len(axes):
        raise ctx.unsupported(f"pads {pads} do not fit axes {axes} of rank {ndim}")
    width = [(0, 0)] * ndim
    for k, a in enumerate(axes):
        width[a] = (pads[k], pads[k + len(axes)])
    return tuple(width)


def _pad(ctx: ConvertContext, pads: tuple[int, ...], value: float,
         axes: tuple[int, ...] | None) -> Expr:
    x = ctx.input(0)
    mode = ctx.attr("mode", "constant")
    if mode not in ("constant", "edge", "reflect", "wrap"):
        raise ctx.unsupported(f"mode={mode!r}")
    width = _pad_widths(ctx, pads, x.checked_type.ndim, axes)
    if all(w == (0, 0) for w in width):
        return x
    return ctx.call("nn.pad", [x], pad_width=width, pad_value=value, pad_mode=mode)


@onnx_op("Pad", since=2)
def pad_v2(ctx: ConvertContext) -> Expr:
    return _pad(ctx, ctx.ints("pads"), float(ctx.attr("value", 0.0)), None)


@onnx_op("Pad", since=11)
def pad_v11(ctx: ConvertContext) -> Expr:
    pads = ctx.const_ints(1, "Pad pads")
    value = 0.0
    if ctx.optional_input(2) is not None:
        fill = ctx.const_value(2, "Pad constant_value").reshape(-1)
        value = fill[0].item() if fill.size else 0.0
    axes = None
    if ctx.opset >= 18 and ctx.optional_input(3) is not None:
        axes = ctx.const_ints(3, "Pad axes")
    return _pad(ctx, pads, value, axes)
