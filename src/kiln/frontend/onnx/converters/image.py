"""Converters of ONNX image ops: Resize (opsets 10, 11, 13, 18, 19) and Upsample (opset 9, its
deprecated predecessor) → ``image.resize2d``.

Resize is supported on the two trailing axes of a rank-4 NCHW tensor (N and C unscaled) in
modes ``nearest``, ``linear`` and ``cubic``. ``scales``, ``sizes``, ``axes`` and
``keep_aspect_ratio_policy`` are read at compile time, with onnxruntime's arithmetic
(``upsamplebase.h``): from scales, ``size = int(float32(scale) * float32(in))``; from sizes, the
transform uses ``scale = float32(out) / float32(in)``. Over symbolic dims, sizes computed from
shapes (``Shape(y)[2:]``) give a scale the kernel computes at run time where it changes with the
dims (not with ``antialias``); scales must be ``num / 2**k`` with a small ``num`` (1.5, 0.75;
integers) so that the output size ``int(scale * in)`` is integer arithmetic.
"""

from __future__ import annotations

import numpy as np

from kiln import arith
from kiln.frontend.onnx.context import ConvertContext
from kiln.frontend.onnx.registry import onnx_op
from kiln.relay.graph import Expr
from kiln.relay.op.image import antialias_footprint

_METHODS = {"nearest": "nearest_neighbor", "linear": "linear", "cubic": "cubic"}
#: an antialiased output pixel reads taps² input pixels (unrolled in the kernel): a bound
#: on the downsampling factor (linear 1/8, cubic 1/4)
MAX_ANTIALIAS_TAPS = 16
#: the largest numerator of a float32 scale (``num / 2**k``) of a symbolic dim: its output
#: size ``num * dim // 2**k`` is exact below 2**24 / num, 65536 for 255
MAX_SCALE_NUMERATOR = 255


def _full_rank(ctx: ConvertContext, values: np.ndarray, axes: tuple[int, ...] | None,
               ndim: int, fill: float) -> np.ndarray:
    """Scales or sizes given for ``axes`` (Resize-18) spread to every axis (``fill`` elsewhere)."""
    if axes is None:
        if values.size != ndim:
            raise ctx.unsupported(f"{values.size} scales/sizes for a rank-{ndim} input")
        return values
    out = np.full(ndim, fill, dtype=values.dtype)
    if values.size != len(axes):
        raise ctx.unsupported(f"{values.size} scales/sizes for axes {axes}")
    for a, v in zip(axes, values):
        out[ctx.axis(a, ndim)] = v
    return out


def _roi(ctx: ConvertContext, shape: tuple[int, ...]) -> tuple[float, float, float, float]:
    """The crop of tf_crop_and_resize as ``(h_start, w_start, h_end, w_end)`` (input 1, one
    start and one end per axis, or per ``axes``); N and C must not be cropped."""
    ndim = len(shape)
    if ctx.optional_input(1) is None:
        raise ctx.unsupported("tf_crop_and_resize needs the roi input")
    values = ctx.const_value(1, "Resize roi").astype(np.float32).reshape(-1)
    half = values.size // 2
    starts = _full_rank(ctx, values[:half], ctx.ints("axes"), ndim, 0.0)
    ends = _full_rank(ctx, values[half:], ctx.ints("axes"), ndim, 1.0)
    if starts[:2].tolist() != [0.0, 0.0] or ends[:2].tolist() != [1.0, 1.0]:
        raise ctx.unsupported(f"roi {values.tolist()} crops the N or C axis")
    return float(starts[2]), float(starts[3]), float(ends[2]), float(ends[3])


def _scaled_dim(ctx: ConvertContext, scale: np.float32, dim: arith.Dim) -> arith.Dim:
    """onnxruntime's output size ``int(float32(scale) * float32(dim))``; of a symbolic ``dim``
    as integer arithmetic: a float32 scale is ``num / den`` exactly (``den`` a power of two),
    and the float32 product ``num * dim / den`` is exact while ``num * dim`` stays below 2**24,
    which is ``num * dim // den``. As for integer scales (``den`` 1), the dims are taken below
    that; scales of up to ``MAX_SCALE_NUMERATOR`` in the numerator (1.5, 0.75, 2.5, 0.625...),
    or the inverses of powers of two (exact at every size)."""
    if isinstance(dim, int):
        return int(np.float32(scale) * np.float32(dim))
    num, den = float(np.float32(scale)).as_integer_ratio()
    if den == 1 or num <= MAX_SCALE_NUMERATOR:
        return dim * num // den
    raise ctx.unsupported(f"scale {float(scale)} of symbolic dim {dim}: the output size "
                          f"int({float(scale)} * {dim}) is integer arithmetic only for scales "
                          f"num / 2**k with num <= {MAX_SCALE_NUMERATOR} (this one is "
                          f"{num} / {den})")


def _sizes_and_scales(ctx: ConvertContext, shape: tuple[arith.Dim, ...], scales_index: int,
                      sizes_index: int | None) -> tuple[list[arith.Dim], list[float | None]]:
    ndim = len(shape)
    axes = ctx.ints("axes")
    scales = ctx.optional_input(scales_index)
    if scales is not None and scales.checked_type.size == 0:
        scales = None
    sizes = None if sizes_index is None else ctx.optional_input(sizes_index)
    if scales is not None:
        if sizes is not None and sizes.checked_type.size:
            raise ctx.unsupported("both scales and sizes are given")
        values = ctx.const_value(scales, "Resize scales").astype(np.float32).reshape(-1)
        values = _full_rank(ctx, values, axes, ndim, 1.0)
        if np.any(values <= 0):
            raise ctx.unsupported(f"scales {values.tolist()} must be positive")
        # The crop of tf_crop_and_resize does not change the size (onnxruntime and the ONNX
        # reference implementation agree, though the spec multiplies by roi_end - roi_start).
        out = [_scaled_dim(ctx, s, d) for s, d in zip(values, shape)]
        return out, [float(s) for s in values]
    if sizes is None:
        raise ctx.unsupported("neither scales nor sizes is given")
    wanted = ctx.const_value(sizes, "Resize sizes").reshape(-1)
    if wanted.dtype == object or any(not isinstance(d, int) for d in shape):
        return _symbolic_sizes(ctx, shape, wanted, axes)
    wanted = _full_rank(ctx, wanted.astype(np.int64), axes, ndim, -1)
    wanted = np.where(wanted < 0, np.array(shape), wanted)
    ratios = [np.float32(o) / np.float32(d) for o, d in zip(wanted, shape)]
    policy = ctx.attr("keep_aspect_ratio_policy", "stretch")
    if policy == "stretch":
        return [int(o) for o in wanted], [float(r) for r in ratios]
    if policy not in ("not_larger", "not_smaller"):
        raise ctx.unsupported(f"keep_aspect_ratio_policy={policy}")
    chosen = [a % ndim for a in axes] if axes is not None else list(range(ndim))
    pick = min if policy == "not_larger" else max
    scale = pick(ratios[a] for a in chosen)
    out = [int(np.round(scale * np.float32(d))) if k in chosen else d
           for k, d in enumerate(shape)]
    return out, [float(scale) if k in chosen else 1.0 for k in range(ndim)]


def _symbolic_sizes(ctx: ConvertContext, shape: tuple[arith.Dim, ...], wanted: np.ndarray,
                    axes: tuple[int, ...] | None) -> tuple[list[arith.Dim], list[float | None]]:
    """Sizes computed from shapes (``Resize(x, sizes=Shape(y)[2:])``) over symbolic dims:
    onnxruntime's scale is ``float32(out) / float32(in)``. It is a constant where each size is
    the input dim itself or an integer multiple of it; elsewhere (``(h + 1) // 2`` over
    ``((h + 1) // 2 + 1) // 2``) it changes with the dims: None, the kernel computes it at run
    time (:func:`kiln.topi.resize_taps.axis_scale`)."""
    if ctx.attr("keep_aspect_ratio_policy", "stretch") != "stretch":
        raise ctx.unsupported("keep_aspect_ratio_policy with sizes over symbolic dims")
    sizes = _full_rank(ctx, wanted.astype(object), axes, len(shape), -1)
    out, scales = [], []
    for size, dim in zip(sizes.tolist(), shape):
        size = dim if isinstance(size, int) and size < 0 else size
        out.append(size)
        scales.append(_constant_scale(size, dim))
        if scales[-1] is None and ctx.attr("antialias", 0):
            raise ctx.unsupported(f"antialias=1 with size {size} of the symbolic dim {dim}: the "
                                  f"filter's footprint needs a constant scale, {size}/{dim} "
                                  "changes with the dims")
    return out, scales


def _constant_scale(size: arith.Dim, dim: arith.Dim) -> float | None:
    """onnxruntime's ``float32(size) / float32(dim)`` where it is a constant (static sizes, or
    ``size`` the dim or an integer multiple of it), else None."""
    if isinstance(size, int) and isinstance(dim, int):
        return float(np.float32(size) / np.float32(dim))
    ratio = 1 if size == dim else arith.exact_ratio(size, dim)
    return float(ratio) if isinstance(ratio, int) and ratio > 0 else None


def _resize(ctx: ConvertContext, scales_index: int, sizes_index: int | None,
            coordinate_mode: str, rounding: str) -> Expr:
    x = ctx.input(0)
    shape = x.checked_type.shape
    mode = ctx.attr("mode", "nearest")
    if mode not in _METHODS:
        raise ctx.unsupported(f"mode={mode} (supported: nearest, linear, cubic)")
    antialias = bool(ctx.attr("antialias", 0))
    if antialias and mode == "nearest":
        raise ctx.unsupported("antialias=1 with mode=nearest")
    if len(shape) != 4:
        raise ctx.unsupported(f"only rank-4 (NCHW) inputs are supported, got shape {shape}")
    roi = _roi(ctx, shape) if coordinate_mode == "tf_crop_and_resize" else (0.0, 0.0, 1.0, 1.0)
    out, scales = _sizes_and_scales(ctx, shape, scales_index, sizes_index)
    if tuple(out[:2]) != shape[:2]:
        raise ctx.unsupported(f"resizing the N or C axis ({shape} → {tuple(out)})")
    taps = [antialias_footprint(mode, s) for s in scales[2:]] if antialias else [0]
    if max(taps) > MAX_ANTIALIAS_TAPS:
        raise ctx.unsupported(f"antialias over {max(taps)} pixels (scales {scales[2:]}; at most "
                              f"{MAX_ANTIALIAS_TAPS})")
    if tuple(out) == shape and scales[2:] == [1.0, 1.0]:  # each axis maps to itself
        return x                                           # (kiln.topi.resize_taps.axis_taps)
    return ctx.call("image.resize2d", [x], size=(out[2], out[3]), scale=(scales[2], scales[3]),
                    method=_METHODS[mode], coordinate_transformation_mode=coordinate_mode,
                    rounding_method=rounding, roi=roi,
                    extrapolation_value=float(ctx.attr("extrapolation_value", 0.0)),
                    cubic_alpha=float(ctx.attr("cubic_coeff_a", -0.75)),
                    exclude_outside=bool(ctx.attr("exclude_outside", 0)), antialias=antialias)


@onnx_op("Resize", since=10)
@onnx_op("Upsample", since=9)
def resize_v10(ctx: ConvertContext) -> Expr:
    """Resize-10 and Upsample-9: inputs (X, scales); asymmetric coordinates, nearest truncates
    (upsampling) or takes the ceiling (downsampling), as onnxruntime's Upsample."""
    return _resize(ctx, 1, None, "asymmetric", "simple")


@onnx_op("Resize", since=11)
def resize_v11(ctx: ConvertContext) -> Expr:
    """Resize-11+: inputs (X, roi, scales, sizes)."""
    return _resize(ctx, 2, 3, ctx.attr("coordinate_transformation_mode", "half_pixel"),
                   ctx.attr("nearest_mode", "round_prefer_floor"))
