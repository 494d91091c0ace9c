"""Resize sampling geometry: the source coordinate of each output index, and the taps and
weights of nearest, linear and cubic interpolation (with antialiasing) along one axis.

One set of formulas serves the numpy reference of ``image.resize2d``
(:mod:`kiln.relay.op.image`, which documents the attrs and their semantics) and its compute
(:mod:`kiln.topi.image`): they take numpy float32 arrays or loop-IR expressions alike, through
an :class:`Arith` of the few functions they need. Semantics are onnxruntime's
(``onnxruntime/core/providers/cpu/tensor/upsamplebase.h``, ``upsample.cc``); cubic weights are
Keys' kernel (R. Keys 1981, "Cubic convolution interpolation for digital image processing").
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from kiln import arith
from kiln.errors import ShapeError

COORDINATE_MODES = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners",
                    "asymmetric", "tf_half_pixel_for_nn", "tf_crop_and_resize")
ROUNDING_METHODS = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil", "simple")
METHODS = ("nearest_neighbor", "linear", "cubic")


@dataclass(frozen=True)
class Arith:
    """The functions the tap formulas need, over numpy arrays or over loop-IR expressions."""

    floor: Callable[[Any], Any]
    ceil: Callable[[Any], Any]
    abs: Callable[[Any], Any]
    clamp: Callable[[Any, Any, Any], Any]
    to_int: Callable[[Any], Any]  # float → int64, truncating
    cast: Callable[[Any, str], Any]
    within: Callable[[Any, Any, Any], Any]  # lo <= value <= hi, as a condition
    select: Callable[[Any, Any, Any], Any]
    #: a shape dim (int or symbolic) as a value of a dtype: the sizes of a scale known only at
    #: run time
    dim: Callable[[arith.Dim, str], Any]
    equal: Callable[[Any, Any], Any]  # a == b, as a condition
    #: values computed once and read back (the compute's small tables): a normalization reads
    #: every weight once per weight, and inline expressions would grow as taps² (taps⁴ when an
    #: antialiased filter excludes the outside too)
    stage: Callable[[list[Any]], list[Any]] = lambda values: values


NUMPY_ARITH = Arith(np.floor, np.ceil, np.abs, np.clip, lambda v: v.astype(np.int64),
                    lambda v, dtype: v.astype(dtype), lambda v, lo, hi: (v >= lo) & (v <= hi),
                    lambda c, a, b: np.where(c, a, b).astype(np.float32),
                    lambda d, dtype: np.dtype(dtype).type(d), np.equal)


def _crop_coordinate(x: Any, start: float, end: float, in_size: int, out_size: int) -> Any:
    """tf_crop_and_resize: ``start`` and ``end`` are the crop's normalized bounds (float32)."""
    f32 = np.float32
    if out_size == 1:
        return x * 0.0 + float(f32(0.5 * (float(f32(start)) + float(f32(end))) * (in_size - 1)))
    span = float(f32(end) - f32(start))
    return float(f32(start) * f32(in_size - 1)) + x * span * float(in_size - 1) / float(
        out_size - 1)


def source_coordinate(x: Any, mode: str, scale: float, in_size: int, out_size: int,
                      cast: Callable[[Any, str], Any],
                      crop: tuple[float, float] = (0.0, 1.0)) -> Any:
    """The input coordinate (float32) that output index ``x`` (float32) maps to along one axis.

    ``x`` is a numpy float32 array or a float32 loop-IR expression and ``cast(value, dtype)``
    converts it; every constant is exact in the dtype it is used in, so both evaluate the
    arithmetic of onnxruntime's ``GetOriginalCoordinateFromResizedCoordinate`` in the same
    order and precision (float32, except half_pixel_symmetric, which onnxruntime computes in
    float64 from float32 operands).
    """
    f32 = np.float32
    if mode == "half_pixel":
        return (x + 0.5) / float(scale) - 0.5
    if mode == "half_pixel_symmetric":
        adjustment = f32(out_size) / (f32(scale) * f32(in_size))
        offset = f32(in_size) / f32(2) * (f32(1) - adjustment)
        wide = cast(x, "float64")
        return cast(float(offset) + (wide + 0.5) / float(scale) - 0.5, "float32")
    if mode == "pytorch_half_pixel":
        return (x + 0.5) / float(scale) - 0.5 if out_size > 1 else x * 0.0
    if mode == "align_corners":
        if out_size == 1:
            return x * 0.0
        return x * float(in_size - 1) / float(out_size - 1)
    if mode == "asymmetric":
        return x / float(scale)
    if mode == "tf_half_pixel_for_nn":
        return (x + 0.5) / float(scale)
    if mode == "tf_crop_and_resize":
        return _crop_coordinate(x, crop[0], crop[1], in_size, out_size)
    raise ShapeError(f"unknown coordinate_transformation_mode {mode!r}")


def runtime_source_coordinate(x: Any, mode: str, scale: Any, in_size: arith.Dim,
                              out_size: arith.Dim, ar: Arith,
                              crop: tuple[float, float] = (0.0, 1.0)) -> Any:
    """:func:`source_coordinate` where the scale or a size is known only at run time (a
    symbolic dim, or the float32 scale :func:`axis_scale` computes from them): the same
    arithmetic in the same order and precision, the branches on ``out_size == 1`` selects, a
    divisor ``out_size - 1`` kept at least 1 (its branch is not taken at 1)."""
    if mode == "half_pixel":
        return (x + 0.5) / scale - 0.5
    if mode == "asymmetric":
        return x / scale
    if mode == "tf_half_pixel_for_nn":
        return (x + 0.5) / scale

    def f32(dim: arith.Dim) -> Any:
        return ar.dim(dim, "float32")

    def unless_one_pixel(value: Callable[[], Any], one_pixel: Callable[[], Any]) -> Any:
        """``value()``, or ``one_pixel()`` where the output has one pixel (known statically
        or not)."""
        if _is_static(out_size):
            return value() if out_size > 1 else one_pixel()
        return ar.select(ar.dim(out_size, "int64") > 1, value(), one_pixel())

    def steps() -> Any:  # out_size - 1, the divisor where out_size > 1
        return f32(arith.maximum(out_size - 1, 1))

    if mode == "half_pixel_symmetric":
        adjustment = f32(out_size) / (scale * f32(in_size))
        offset = f32(in_size) / 2.0 * (1.0 - adjustment)
        wide_scale = float(scale) if _is_static(scale) else ar.cast(scale, "float64")
        return ar.cast(ar.cast(offset, "float64") + (ar.cast(x, "float64") + 0.5) / wide_scale
                       - 0.5, "float32")
    if mode == "pytorch_half_pixel":
        return unless_one_pixel(lambda: (x + 0.5) / scale - 0.5, lambda: x * 0.0)
    if mode == "align_corners":
        return unless_one_pixel(lambda: x * f32(in_size - 1) / steps(), lambda: x * 0.0)
    if mode == "tf_crop_and_resize":
        start, end = (float(np.float32(v)) for v in crop)
        span = float(np.float32(end) - np.float32(start))
        return unless_one_pixel(
            lambda: start * f32(in_size - 1) + x * span * f32(in_size - 1) / steps(),
            lambda: x * 0.0 + ar.cast(0.5 * (start + end) * ar.dim(in_size - 1, "float64"),
                                      "float32"))
    raise ShapeError(f"unknown coordinate_transformation_mode {mode!r}")


def nearest_index(coord: Any, rounding: str, scale: float, floor, ceil) -> Any:
    """``coord`` rounded by ``rounding`` (still float; ``floor``/``ceil`` are the numpy or
    loop-IR functions). Only the result's value after clamping to ``[0, size - 1]`` matters,
    which lets round-half-away-from-zero be ``floor(x + 0.5)`` and truncation be ``floor``."""
    if rounding == "round_prefer_floor":
        return ceil(coord - 0.5)
    if rounding == "round_prefer_ceil":
        return floor(coord + 0.5)
    if rounding == "simple" and not _is_static(scale):
        # Resize-10 and Upsample take scales: their scale is always a constant
        raise ShapeError("rounding_method 'simple' needs a constant scale")
    if rounding == "floor" or (rounding == "simple" and scale >= 1.0):
        return floor(coord)
    if rounding in ("ceil", "simple"):
        return ceil(coord)
    raise ShapeError(f"unknown rounding_method {rounding!r}")


def _cubic_weights(s: Any, a: float) -> list[Any]:
    """Keys' kernel at distances ``1 + s, s, 1 - s, 2 - s`` (``s`` in [0, 1)), in onnxruntime's
    operation order (``GetCubicCoeffs``)."""
    far = [1.0 + s, 2.0 - s]
    near = [s, 1.0 - s]
    outer = [((d * a - 5.0 * a) * d + 8.0 * a) * d - 4.0 * a for d in far]
    inner = [((a + 2.0) * d - (a + 3.0)) * d * d + 1.0 for d in near]
    return [outer[0], inner[0], inner[1], outer[1]]


def axis_taps(x: Any, attrs: dict, axis: int, in_size: arith.Dim,
              ar: Arith) -> tuple[list[tuple[Any, Any]], Any]:
    """The taps of output index ``x`` (float32) along one axis: ``[(input index, weight)]``,
    indices clamped to the input, weight None for nearest (one tap); and the condition under
    which the coordinate lies in the input (None unless tf_crop_and_resize extrapolates)."""
    out_size = attrs["size"][axis]
    scale = axis_scale(attrs["scale"][axis], in_size, out_size, ar)
    mode = attrs["coordinate_transformation_mode"]
    roi = attrs["roi"]
    if _is_static(scale) and scale == 1.0:
        # onnxruntime maps an axis that is not resized to itself, whatever the mode: no crop,
        # no extrapolation, no half-pixel shift (upsample.cc: ``scale == 1 ? x : ...``)
        return _method_taps(x, attrs, in_size, scale, ar), None
    crop = (roi[axis], roi[2 + axis])
    if _is_static(scale) and _is_static(in_size) and _is_static(out_size):
        coord = source_coordinate(x, mode, scale, in_size, out_size, ar.cast, crop)
    else:
        coord = runtime_source_coordinate(x, mode, scale, in_size, out_size, ar, crop)
        if not _is_static(scale):
            # scale 1 (out == in) decided at run time: the index itself, which also lies
            # inside the input (no extrapolation)
            coord = ar.select(ar.equal(scale, 1.0), x, coord)
    # onnxruntime extrapolates outside [0, size - 1] in crop mode.
    valid = ar.within(coord, 0.0, _as_float(in_size - 1)) if mode == "tf_crop_and_resize" \
        else None
    return _method_taps(coord, attrs, in_size, scale, ar), valid


def axis_scale(scale: float | None, in_size: arith.Dim, out_size: arith.Dim, ar: Arith) -> Any:
    """The scale of one axis's coordinate transform: the ``scale`` attr, or where it is None
    (``sizes`` over symbolic dims) onnxruntime's ``float32(out_size) / float32(in_size)``
    (``upsamplebase.h``): a constant when both sizes are static, else a float32 value of the
    shape variables computed at run time."""
    if scale is not None:
        return scale
    if _is_static(in_size) and _is_static(out_size):
        return float(np.float32(out_size) / np.float32(in_size))
    return ar.dim(out_size, "float32") / ar.dim(in_size, "float32")


def _is_static(value: Any) -> bool:
    return isinstance(value, (int, float))


def _as_float(dim: arith.Dim) -> float | arith.Dim:
    """A static dim as a float bound; a symbolic one as it is (the loop arithmetic casts it)."""
    return float(dim) if isinstance(dim, int) else dim


def _method_taps(coord: Any, attrs: dict, in_size: int, scale: float,
                 ar: Arith) -> list[tuple[Any, Any]]:
    method = attrs["method"]
    last = in_size - 1
    if method == "nearest_neighbor":
        rounded = nearest_index(coord, attrs["rounding_method"], scale, ar.floor, ar.ceil)
        return [(ar.clamp(ar.to_int(rounded), 0, last), None)]
    if method == "linear" and not attrs["antialias"]:
        # onnxruntime's bilinear: the coordinate is clamped to [0, size - 1] first.
        c = ar.clamp(coord, 0.0, _as_float(last))
        i0 = ar.to_int(c)
        w1 = c - ar.cast(i0, "float32")
        return [(i0, 1.0 - w1), (ar.clamp(i0 + 1, 0, last), w1)]
    if attrs["antialias"]:
        index, weights = _antialias_taps(coord, attrs, scale, ar)
    else:
        base = ar.floor(coord)
        weights = _cubic_weights(coord - base, attrs["cubic_alpha"])
        first = ar.to_int(base) - 1
        index = [first + k for k in range(4)]
    if attrs["exclude_outside"]:  # cubic, or antialiased linear (onnxruntime refuses plain)
        weights = [ar.select(ar.within(i, 0, in_size - 1), w, 0.0)
                   for i, w in zip(index, weights)]
        weights = _normalized(weights, ar)
    return [(ar.clamp(i, 0, last), w) for i, w in zip(index, weights)]


def antialias_footprint(method: str, scale: float) -> int:
    """Taps of an antialiased filter along one axis: the filter's support (1 for linear, 2 for
    cubic, each side) widened by ``1 / scale`` when downsampling."""
    support = 1.0 if method == "linear" else 2.0
    start = math.floor(-support / min(scale, 1.0)) + 1
    return 2 - 2 * start


def _antialias_taps(coord: Any, attrs: dict, scale: float, ar: Arith) -> tuple[list, list]:
    """Indices (unclamped) and normalized weights of the antialiased linear or cubic filter:
    tap ``k`` reads pixel ``base + start + k`` with ``base = floor(coord)``, its weight is the
    filter at ``(start + k - (coord - base)) * min(scale, 1)``."""
    n = antialias_footprint(attrs["method"], scale)
    start = 1 - n // 2
    shrink = min(scale, 1.0)
    base = ar.floor(coord)
    ratio = coord - base
    first = ar.to_int(base) + start
    a = attrs["cubic_alpha"]
    weights = []
    for k in range(n):
        d = ar.abs((float(start + k) - ratio) * shrink)
        if attrs["method"] == "linear":
            weights.append(ar.clamp(1.0 - d, 0.0, 1.0))
        else:
            inner = ((a + 2.0) * d - (a + 3.0)) * d * d + 1.0
            outer = ((a * d - 5.0 * a) * d + 8.0 * a) * d - 4.0 * a
            weights.append(ar.select(ar.within(d, 0.0, 1.0), inner,
                                     ar.select(ar.within(d, 0.0, 2.0), outer, 0.0)))
    return [first + k for k in range(n)], _normalized(weights, ar)


def _normalized(weights: list[Any], ar: Arith) -> list[Any]:
    """``weights`` divided by their sum (each weight staged first: it is read n + 1 times)."""
    weights = ar.stage(weights)
    total = weights[0]
    for w in weights[1:]:
        total = total + w
    return [w / total for w in weights]
