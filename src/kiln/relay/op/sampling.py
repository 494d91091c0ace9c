"""Sampling graph ops: ``image.grid_sample`` (TVM's name) and ``col2im``.

``image.grid_sample`` (ONNX GridSample, opset 20+ semantics, 2-D and 3-D):
``image.grid_sample(x [N, C, *S], grid [N, *O, k])`` samples ``x`` at the normalized coordinates of
``grid`` (last axis ordered x, y[, z]: innermost spatial axis first) for every output position,
output ``[N, C, *O]``. Attributes: ``mode`` "nearest" | "linear" | "cubic" (Keys, A = -0.75),
``padding_mode`` "zeros" | "border" | "reflection", ``align_corners`` (bool). The reference
below follows ONNX's reference implementation (onnx/reference/ops/op_grid_sample.py) case by
case: coordinates outside the border are clamped (border) or reflected (reflection) first, then
every tap outside the input reads 0 (zeros), the clamped edge (border) or the reflected index.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from kiln.errors import ShapeError
from kiln.relay.graph import TensorType
from kiln.relay.op.common import expect_arity, expect_float
from kiln.relay.op_registry import OpPattern, register_op
from kiln.topi.sampling import CUBIC_A, borders, col2im_geometry

MODES = ("nearest", "linear", "cubic")
PADDING_MODES = ("zeros", "border", "reflection")


def _infer(arg_types: list[TensorType], attrs: dict) -> TensorType:
    expect_arity(arg_types, 2)
    x, grid = arg_types
    expect_float(x)
    nsp = x.ndim - 2
    if nsp not in (2, 3) or grid.ndim != x.ndim or grid.shape[0] != x.shape[0] or \
            grid.shape[-1] != nsp or grid.dtype != x.dtype:
        raise ShapeError(f"grid {grid.shape} {grid.dtype} does not sample {x.shape} {x.dtype}")
    if attrs["mode"] not in MODES or attrs["padding_mode"] not in PADDING_MODES:
        raise ShapeError(f"mode {attrs['mode']!r} / padding_mode {attrs['padding_mode']!r}")
    return TensorType(x.shape[:2] + grid.shape[1:-1], x.dtype)


def reflect(v: float, lo: float, hi: float) -> float:
    rng = hi - lo
    if v < lo:
        n, r = divmod(lo - v, rng)
        return lo + r if int(n) % 2 == 0 else hi - r
    if v > hi:
        n, r = divmod(v - hi, rng)
        return hi - r if int(n) % 2 == 0 else lo + r
    return v


def cubic_coeffs(t: float) -> list[float]:
    a = CUBIC_A

    def near(d):  # |d| <= 1
        return ((a + 2) * d - (a + 3)) * d * d + 1

    def far(d):  # 1 < |d| < 2
        return ((a * d - 5 * a) * d + 8 * a) * d - 4 * a

    return [far(t + 1), near(t), near(1 - t), far(2 - t)]


def _ref(x: np.ndarray, grid: np.ndarray, mode: str, padding_mode: str,
         align_corners: bool) -> np.ndarray:
    sizes = x.shape[2:]
    out = np.zeros(x.shape[:2] + grid.shape[1:-1], dtype=x.dtype)
    for n in range(x.shape[0]):
        for o in np.ndindex(*grid.shape[1:-1]):
            g = grid[(n, *o)][::-1].astype(np.float64)
            coords = []
            for v, size in zip(g, sizes):
                c = (v + 1) / 2 * (size - 1) if align_corners else ((v + 1) * size - 1) / 2
                if mode == "nearest":
                    c = float(np.rint(c))
                lo, hi = borders(size, align_corners)
                if c < lo or c > hi:
                    if padding_mode == "border":
                        c = min(max(c, 0.0), size - 1.0)
                    elif padding_mode == "reflection":
                        c = reflect(c, lo, hi)
                coords.append(c)
            if mode == "nearest":
                taps = [[(int(c), 1.0)] for c in coords]
            elif mode == "linear":
                taps = [[(math.floor(c), 1 - (c - math.floor(c))),
                         (math.floor(c) + 1, c - math.floor(c))] for c in coords]
            else:
                taps = [list(zip(range(math.floor(c) - 1, math.floor(c) + 3),
                                 cubic_coeffs(c - math.floor(c)))) for c in coords]
            for c_ in range(x.shape[1]):
                total = 0.0
                for combo in itertools.product(*taps):
                    w = math.prod(wt for _, wt in combo)
                    idx = []
                    for (i, _), size in zip(combo, sizes):
                        if padding_mode == "zeros":
                            idx.append(i if 0 <= i < size else None)
                        elif padding_mode == "border":
                            idx.append(min(max(i, 0), size - 1))
                        else:
                            idx.append(int(reflect(float(i), *borders(size, align_corners))))
                    if None not in idx:
                        total += w * float(x[(n, c_, *idx)])
                out[(n, c_, *o)] = total
    return out


register_op("image.grid_sample", _infer, OpPattern.OPAQUE, _ref)


def _col2im_infer(arg_types: list[TensorType], attrs: dict) -> TensorType:
    expect_arity(arg_types, 1)
    (x,) = arg_types
    image, block, _, _, _, blocks = col2im_geometry(attrs)
    k = math.prod(block)
    if x.ndim != 3 or x.shape[1] % k or x.shape[2] != math.prod(blocks) or \
            any(b <= 0 for b in blocks):
        raise ShapeError(f"input {x.shape} does not hold blocks {block} of image {image}")
    return TensorType((x.shape[0], x.shape[1] // k) + tuple(image), x.dtype)


def _col2im_ref(x: np.ndarray, image_shape, block_shape, dilations, pads,
                strides) -> np.ndarray:
    attrs = {"image_shape": image_shape, "block_shape": block_shape, "dilations": dilations,
             "pads": pads, "strides": strides}
    image, block, dil, pad, stride, blocks = col2im_geometry(attrs)
    k = math.prod(block)
    out = np.zeros((x.shape[0], x.shape[1] // k) + tuple(image), dtype=x.dtype)
    for n, ck, flat_b in np.ndindex(*x.shape):
        c, off = divmod(ck, k)
        kk, bb = np.unravel_index(off, block), np.unravel_index(flat_b, blocks)
        p = [bb[d] * stride[d] + kk[d] * dil[d] - pad[d] for d in range(len(image))]
        if all(0 <= p[d] < image[d] for d in range(len(image))):
            out[(n, c, *p)] += x[n, ck, flat_b]
    return out


# col2im: ONNX Col2Im — sums each column of [N, C * prod(block), L] back into the image at its
# block's position (attrs: image_shape, block_shape, dilations, pads, strides; N-d).
register_op("col2im", _col2im_infer, OpPattern.OPAQUE, _col2im_ref)
