"""Image graph ops: ``image.resize2d`` (TVM's name), the H and W axes of NCHW data.

``image.resize2d(data[N, C, H, W])`` → ``[N, C, OH, OW]`` with attrs

- ``size``: ``(OH, OW)``;
- ``scale``: ``(sh, sw)``, the float32 scales of the coordinate transform (the ONNX ``scales``
  input, or ``OH / H`` when ``sizes`` was given);
- ``method``: ``"nearest_neighbor"`` or ``"linear"``;
- ``coordinate_transformation_mode``: ONNX Resize's (``half_pixel``, ``half_pixel_symmetric``,
  ``pytorch_half_pixel``, ``align_corners``, ``asymmetric``, ``tf_half_pixel_for_nn``);
- ``rounding_method`` (nearest only): ``round_prefer_floor``, ``round_prefer_ceil``, ``floor``,
  ``ceil``, or ``simple`` (Resize-10: truncate when upsampling, ceil when downsampling).

Semantics are onnxruntime's (``onnxruntime/core/providers/cpu/tensor/upsamplebase.h``,
``upsample.cc``): the source coordinate is computed in float32 from the output index, nearest
rounds it and clamps to the input; linear clamps it to ``[0, size - 1]`` and interpolates
between the two neighbouring pixels of each axis. The same formulas (:func:`source_coordinate`,
:func:`nearest_index`, :func:`linear_taps`) serve the numpy reference and the compute
(``kiln.ops.image``): they take numpy float32 arrays or loop-IR expressions alike.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from kiln.errors import ShapeError
from kiln.ir.graph import TensorType
from kiln.ir.op_registry import OpPattern, register_op
from kiln.ir.ops.common import expect_arity, expect_float, expect_rank

COORDINATE_MODES = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners",
                    "asymmetric", "tf_half_pixel_for_nn")
ROUNDING_METHODS = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil", "simple")
METHODS = ("nearest_neighbor", "linear")


def source_coordinate(x: Any, mode: str, scale: float, in_size: int, out_size: int,
                      cast: Callable[[Any, str], Any]) -> Any:
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
    raise ShapeError(f"unknown coordinate_transformation_mode {mode!r}")


def nearest_index(coord: Any, rounding: str, scale: float, floor, ceil) -> Any:
    """``coord`` rounded by ``rounding`` (still float; ``floor``/``ceil`` are the numpy or
    loop-IR functions). Only the result's value after clamping to ``[0, size - 1]`` matters,
    which lets round-half-away-from-zero be ``floor(x + 0.5)`` and truncation be ``floor``."""
    if rounding == "round_prefer_floor":
        return ceil(coord - 0.5)
    if rounding == "round_prefer_ceil":
        return floor(coord + 0.5)
    if rounding == "floor" or (rounding == "simple" and scale >= 1.0):
        return floor(coord)
    if rounding in ("ceil", "simple"):
        return ceil(coord)
    raise ShapeError(f"unknown rounding_method {rounding!r}")


def linear_taps(coord: Any, in_size: int, clamp, to_int, to_float) -> tuple[Any, Any, Any]:
    """(first index, second index, weight of the second) of linear interpolation at ``coord``
    (onnxruntime's bilinear: the coordinate is clamped to ``[0, size - 1]`` first)."""
    c = clamp(coord, 0.0, float(in_size - 1))
    i0 = to_int(c)
    i1 = clamp(i0 + 1, 0, in_size - 1)
    return i0, i1, c - to_float(i0)


def _resize2d_infer(arg_types: list[TensorType], attrs: dict) -> TensorType:
    expect_arity(arg_types, 1)
    (data,) = arg_types
    expect_rank(data, 4, "data")
    expect_float(data)
    oh, ow = attrs["size"]
    if oh < 1 or ow < 1:
        raise ShapeError(f"resize2d output size {attrs['size']} is empty")
    if attrs["method"] not in METHODS:
        raise ShapeError(f"resize2d method {attrs['method']!r} (supported: {METHODS})")
    if attrs["coordinate_transformation_mode"] not in COORDINATE_MODES:
        raise ShapeError(f"coordinate_transformation_mode "
                         f"{attrs['coordinate_transformation_mode']!r}")
    if attrs["rounding_method"] not in ROUNDING_METHODS:
        raise ShapeError(f"rounding_method {attrs['rounding_method']!r}")
    return TensorType(data.shape[:2] + (oh, ow), data.dtype)


def _axis_table(attrs: dict, axis: int, in_size: int):
    """Per output index of one axis: (i0, i1, weight) for linear, (i0, i0, 0) for nearest."""
    out_size = attrs["size"][axis]
    scale = attrs["scale"][axis]
    x = np.arange(out_size, dtype=np.float32)
    coord = source_coordinate(x, attrs["coordinate_transformation_mode"], scale, in_size,
                              out_size, lambda v, dtype: v.astype(dtype)).astype(np.float32)
    if attrs["method"] == "nearest_neighbor":
        rounded = nearest_index(coord, attrs["rounding_method"], scale, np.floor, np.ceil)
        i0 = np.clip(rounded, 0, in_size - 1).astype(np.int64)
        return i0, i0, np.zeros(out_size, np.float32)
    return linear_taps(coord, in_size, np.clip, lambda c: c.astype(np.int64),
                       lambda i: i.astype(np.float32))


def _resize2d_ref(data: np.ndarray, **attrs) -> np.ndarray:
    y0, y1, wy = _axis_table(attrs, 0, data.shape[2])
    x0, x1, wx = _axis_table(attrs, 1, data.shape[3])
    if attrs["method"] == "nearest_neighbor":
        return np.ascontiguousarray(data[:, :, y0[:, None], x0[None, :]])
    t = data.dtype.type
    wx = wx.astype(data.dtype)[None, None, None, :]
    wy = wy.astype(data.dtype)[None, None, :, None]
    top = data[:, :, y0[:, None], x0[None, :]] * (t(1) - wx) + data[:, :, y0[:, None],
                                                                     x1[None, :]] * wx
    bottom = data[:, :, y1[:, None], x0[None, :]] * (t(1) - wx) + data[:, :, y1[:, None],
                                                                        x1[None, :]] * wx
    return (top * (t(1) - wy) + bottom * wy).astype(data.dtype, copy=False)


register_op("image.resize2d", _resize2d_infer, OpPattern.INJECTIVE, _resize2d_ref)
