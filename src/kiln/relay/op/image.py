"""Image graph ops: ``image.resize2d`` (TVM's name), the H and W axes of NCHW data.

``image.resize2d(data[N, C, H, W])`` → ``[N, C, OH, OW]`` with attrs

- ``size``: ``(OH, OW)``;
- ``scale``: ``(sh, sw)``, the float32 scales of the coordinate transform (the ONNX ``scales``
  input, or ``OH / H`` when ``sizes`` was given); ``None`` for an axis whose scale
  ``float32(OH) / float32(H)`` changes with symbolic dims: the kernel computes it at run time
  from the sizes (:func:`kiln.topi.resize_taps.axis_scale`; not with ``antialias``);
- ``method``: ``"nearest_neighbor"``, ``"linear"`` or ``"cubic"``;
- ``cubic_alpha`` (cubic): the ``A`` of Keys' cubic convolution kernel;
- ``exclude_outside`` (cubic, antialiased linear): taps outside the input get weight 0 (the
  others renormalized) instead of repeating the edge;
- ``antialias`` (linear and cubic): when downsampling by ``scale < 1``, the filter is widened
  by ``1 / scale`` (its taps cover ``2 / scale`` or ``4 / scale`` input pixels) and its weights
  normalized to sum 1, as the ONNX reference implementation and onnxruntime do;
- ``coordinate_transformation_mode``: ONNX Resize's (``half_pixel``, ``half_pixel_symmetric``,
  ``pytorch_half_pixel``, ``align_corners``, ``asymmetric``, ``tf_half_pixel_for_nn``,
  ``tf_crop_and_resize``);
- ``roi``: ``(h_start, w_start, h_end, w_end)``, normalized crop bounds (tf_crop_and_resize);
- ``extrapolation_value``: the output where a tf_crop_and_resize coordinate falls outside the
  input;
- ``rounding_method`` (nearest only): ``round_prefer_floor``, ``round_prefer_ceil``, ``floor``,
  ``ceil``, or ``simple`` (Resize-10: truncate when upsampling, ceil when downsampling).

Semantics are onnxruntime's (``onnxruntime/core/providers/cpu/tensor/upsamplebase.h``,
``upsample.cc``): the source coordinate is computed in float32 from the output index, nearest
rounds it and clamps to the input; linear clamps it to ``[0, size - 1]`` and interpolates
between the two neighbouring pixels of each axis; cubic weighs the four pixels around it with
Keys' kernel (R. Keys 1981, "Cubic convolution interpolation for digital image processing").
An axis whose scale is exactly 1 maps each output index to itself in every mode (onnxruntime
skips the transform there: no crop, no extrapolation, no half-pixel shift).
Every method is separable: an output pixel is ``sum over taps i, j of wy[i] * wx[j] *
data[iy[i], ix[j]]``. The same formulas (:mod:`kiln.topi.resize_taps`) serve the numpy
reference and the compute (``kiln.topi.image``).
"""

from __future__ import annotations

import numpy as np

from kiln.errors import ShapeError
from kiln.relay.graph import TensorType
from kiln.relay.op.common import expect_arity, expect_float, expect_rank, surely_less
from kiln.relay.op_registry import OpPattern, register_op
from kiln.topi.resize_taps import (  # the geometry the compute shares
    COORDINATE_MODES,
    METHODS,
    NUMPY_ARITH,
    ROUNDING_METHODS,
    antialias_footprint,
    axis_taps,
)

__all__ = ["COORDINATE_MODES", "METHODS", "ROUNDING_METHODS", "antialias_footprint"]


def _resize2d_infer(arg_types: list[TensorType], attrs: dict) -> TensorType:
    expect_arity(arg_types, 1)
    (data,) = arg_types
    expect_rank(data, 4, "data")
    expect_float(data)
    oh, ow = attrs["size"]
    if surely_less(oh, 1) or surely_less(ow, 1):
        raise ShapeError(f"resize2d output size {attrs['size']} is empty")
    if attrs["method"] not in METHODS:
        raise ShapeError(f"resize2d method {attrs['method']!r} (supported: {METHODS})")
    if attrs["coordinate_transformation_mode"] not in COORDINATE_MODES:
        raise ShapeError(f"coordinate_transformation_mode "
                         f"{attrs['coordinate_transformation_mode']!r}")
    if attrs["rounding_method"] not in ROUNDING_METHODS:
        raise ShapeError(f"rounding_method {attrs['rounding_method']!r}")
    for axis, (d, o) in enumerate(zip(data.shape[2:], (oh, ow))):
        if attrs.get("antialias") and attrs["scale"][axis] is None and not (
                isinstance(d, int) and isinstance(o, int)):
            # the filter's footprint (its number of taps) is 2 / scale: a compile-time constant
            raise ShapeError(f"resize2d antialias needs a constant scale; axis {2 + axis}'s is "
                             f"float32({o}) / float32({d}), known at run time only")
    return TensorType(data.shape[:2] + (oh, ow), data.dtype)


def _resize2d_ref(data: np.ndarray, **attrs) -> np.ndarray:
    def taps(axis: int):
        x = np.arange(attrs["size"][axis], dtype=np.float32)
        return axis_taps(x, attrs, axis, data.shape[2 + axis], NUMPY_ARITH)

    t = data.dtype.type
    (rows, valid_y), (cols, valid_x) = taps(0), taps(1)
    out = np.zeros(data.shape[:2] + tuple(attrs["size"]), dtype=data.dtype)
    for iy, wy in rows:
        for ix, wx in cols:
            term = data[:, :, iy[:, None], ix[None, :]]
            if wy is not None:
                weight = wy.astype(t)[:, None] * wx.astype(t)[None, :]
                term = term * weight
            out += term
    if valid_y is not None or valid_x is not None:  # per axis: None where it is not resized
        inside = np.ones(out.shape[2:], dtype=bool)
        if valid_y is not None:
            inside &= valid_y[:, None]
        if valid_x is not None:
            inside &= valid_x[None, :]
        out = np.where(inside, out, t(attrs["extrapolation_value"])).astype(data.dtype)
    return out


register_op("image.resize2d", _resize2d_infer, OpPattern.INJECTIVE, _resize2d_ref)
