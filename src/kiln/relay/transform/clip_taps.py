"""Kernel taps clipped to the valid window: a conv whose taps mostly read its padding
(DeepLabV3's ASPP, 3×3 at dilation 12/24/36 on a 20×20 map) computed as a few unpadded convs
over regions of its output, each with only the taps that read the map there.

Along one axis, output position ``y`` reads input ``y·s + r·d − p`` for tap ``r``; the valid
taps form one range ``[t0, t1]`` that changes only where a tap enters or leaves the map, so
the output splits into a few regions of constant range (:func:`axis_regions`). Region
``[y0, y1)`` with taps ``[t0, t1]`` is the unpadded conv of the sub-kernel over input rows
``[y0·s + t0·d − p, (y1 − 1)·s + t1·d − p]`` — inside the map by construction, so its output is
exactly ``y1 − y0`` rows. The 2-D regions (rows × columns) are concatenated back along W and H.
For dilation 24 or 36 on a 20×20 map only the centre tap reads the map: one region, a 1×1
conv. onnxruntime's MLAS NCHWc convolutions clip the kernel at the borders the same way.
(docs/decisions/045.)
"""

from __future__ import annotations

import numpy as np

from kiln.relay.graph import Call, Expr

#: A dilated conv is clipped when under this fraction of its taps (summed over the output)
#: read the map: a dilation-12 3×3 on 20×20 reads 36 %, on 33×17 40 %, dilation 2 on 20×20
#: 93 %. Undilated convs are left alone (a 3×3 pad-1 on a 4×6 map reads 74 %: nine region
#: kernels and their slices would cost more than the padding taps they skip).
MAX_VALID_FRACTION = 0.5


def axis_regions(size: int, out: int, kernel: int, stride: int, dilation: int,
                 pad: int) -> list[tuple[int, int, int, int]] | None:
    """``(y0, y1, t0, t1)`` regions of one axis: output positions ``[y0, y1)`` whose valid
    taps are ``[t0, t1]``, in order; None if an output position has no valid tap (its value
    is the bias alone: left to the plain conv)."""
    regions: list[tuple[int, int, int, int]] = []
    for y in range(out):
        taps = [r for r in range(kernel) if 0 <= y * stride + r * dilation - pad < size]
        if not taps:
            return None
        t0, t1 = taps[0], taps[-1]
        if regions and regions[-1][2:] == (t0, t1):
            regions[-1] = (regions[-1][0], y + 1, t0, t1)
        else:
            regions.append((y, y + 1, t0, t1))
    return regions


def valid_fraction(regions: list[tuple[int, int, int, int]], kernel: int) -> float:
    """The fraction of one axis's taps (summed over its outputs) that read the map."""
    out = regions[-1][1]
    return sum((y1 - y0) * (t1 - t0 + 1) for y0, y1, t0, t1 in regions) / (out * kernel)


def tap_regions(shape, weight_shape, attrs, out_shape):
    """(row regions, column regions) of a dilated conv worth clipping (under
    MAX_VALID_FRACTION of its taps valid, static extents), else None. ``shape``: NCHW data;
    ``weight_shape``: OIHW; ``out_shape``: NCHW output."""
    h, w = shape[2], shape[3]
    oh, ow = out_shape[2], out_shape[3]
    (sh, sw), (dh, dw) = attrs["strides"], attrs["dilation"]
    if (dh, dw) == (1, 1) or not all(isinstance(v, int) for v in (h, w, oh, ow)):
        return None
    pt, pl, _, _ = attrs["padding"]
    kh, kw = weight_shape[2], weight_shape[3]
    rows = axis_regions(h, oh, kh, sh, dh, pt)
    cols = axis_regions(w, ow, kw, sw, dw, pl)
    if rows is None or cols is None:
        return None
    if valid_fraction(rows, kh) * valid_fraction(cols, kw) >= MAX_VALID_FRACTION:
        return None
    return rows, cols


def _slice(x: Expr, axis: int, begin: int, end: int) -> Expr:
    """``x[..., begin:end, ...]`` along ``axis`` (2: H, 3: W, in NCHW and NCHW{b}c alike)."""
    rank = x.checked_type.ndim
    begins, ends = [0] * rank, list(x.checked_type.shape)
    begins[axis], ends[axis] = begin, end
    return Call("strided_slice", [x], {"begin": tuple(begins), "end": tuple(ends),
                                       "strides": (1,) * rank})


def _concat(parts: list[Expr], axis: int) -> Expr:
    return parts[0] if len(parts) == 1 else Call("concatenate", parts, {"axis": axis})


def clipped_conv(data: Expr, weight: np.ndarray, attrs: dict, regions, conv) -> Expr:
    """The conv of ``data`` (NCHW or NCHW{b}c: H and W are axes 2 and 3 in both) by the OIHW
    ``weight`` as the concatenation of its regions' unpadded convs. ``conv(part, sub_weight,
    attrs)`` builds one region's conv (the caller blocks its weight); ``attrs`` are the conv's
    (strides, padding, dilation)."""
    rows, cols = regions
    (sh, sw), (dh, dw) = attrs["strides"], attrs["dilation"]
    pt, pl, _, _ = attrs["padding"]
    sub_attrs = dict(attrs, padding=(0, 0, 0, 0))
    bands = []
    for y0, y1, r0, r1 in rows:
        band = _slice(data, 2, y0 * sh + r0 * dh - pt, (y1 - 1) * sh + r1 * dh - pt + 1)
        parts = []
        for x0, x1, c0, c1 in cols:
            part = _slice(band, 3, x0 * sw + c0 * dw - pl, (x1 - 1) * sw + c1 * dw - pl + 1)
            sub = np.ascontiguousarray(weight[:, :, r0:r1 + 1, c0:c1 + 1])
            parts.append(conv(part, sub, sub_attrs))
        bands.append(_concat(parts, 3))
    return _concat(bands, 2)

