"""``nn.conv2d_winograd_NCHWc``: a stride-1 3×3 convolution by Winograd's F(m×m, 3×3) on
blocked channels, with its weight transformed at compile time (Lavin & Gray 2016; TVM's
``nn.contrib_conv2d_winograd_without_weight_transform``).

- ``nn.conv2d_winograd_NCHWc(data[N, C/ib, H, W, ib], weight[O/ob, α², C/ib, ib, ob];
  padding, tile_size)`` → ``[N, O/ob, H + pt + pb - 2, W + pl + pr - 2, ob]``, α = tile_size
  + 2; ``weight`` is :func:`winograd_weight` of an OIHW 3×3 filter.

AlterOpLayout emits it (``kiln.relay.transform.winograd`` chooses where); the compute is
``kiln.topi.winograd``. The numpy reference runs the same algorithm on whole arrays, so that
constant folding and the interpreter agree with the kernel's rounding, not only the direct
sum's.
"""

from __future__ import annotations

import numpy as np

from kiln.errors import ShapeError
from kiln.relay.graph import TensorType
from kiln.relay.op.common import expect_arity, expect_rank, same_dtype
from kiln.relay.op_registry import OpPattern, register_op
from kiln.tir.layout import transform_array
from kiln.topi.winograd import tile_grid, winograd_matrices


def winograd_weight(weight: np.ndarray, tile: int, ib: int, ob: int) -> np.ndarray:
    """The transformed weight ``U = G g Gᵀ`` of an OIHW 3×3 filter, blocked for
    ``nn.conv2d_winograd_NCHWc``.

    Parameters
    ----------
    weight : ndarray
        [O, C, 3, 3], float32.
    tile : int
        m, 2 or 4 (F(m×m, 3×3)).
    ib, ob : int
        Input and output channel blocks (dividing C and O).

    Returns
    -------
    ndarray
        [O/ob, α·α, C/ib, ib, ob], float32 (computed in float64), α = m + 2.
    """
    _, g, _ = winograd_matrices(tile)
    u = np.einsum("ai,ocij,bj->ocab", g, weight.astype(np.float64), g)
    o, c, alpha, _ = u.shape
    u = u.reshape(o // ob, ob, c // ib, ib, alpha * alpha)
    return np.ascontiguousarray(u.transpose(0, 4, 2, 3, 1), dtype=weight.dtype)


def _alpha(weight: TensorType) -> int:
    alpha = round(weight.shape[1] ** 0.5)
    if alpha * alpha != weight.shape[1]:
        raise ShapeError(f"Winograd weight {weight.shape}: axis 1 is not α² transform points")
    return alpha


def _infer(arg_types: list[TensorType], attrs: dict) -> TensorType:
    expect_arity(arg_types, 2)
    dtype = same_dtype(arg_types)
    data, weight = arg_types
    expect_rank(data, 5, "data")
    expect_rank(weight, 5, "weight")
    m = attrs["tile_size"]
    if m not in (2, 4) or _alpha(weight) != m + 2:
        raise ShapeError(f"Winograd tile {m} and weight {weight.shape} do not match "
                         "(F(2x2, 3x3): 16 points, F(4x4, 3x3): 36)")
    n, blocks, h, w, ib = data.shape
    if weight.shape[2] != blocks or weight.shape[3] != ib:
        raise ShapeError(f"data {data.shape} and Winograd weight {weight.shape}: input "
                         "channel blocks differ")
    pt, pl, pb, pr = attrs["padding"]
    out_h, out_w = h + pt + pb - 2, w + pl + pr - 2
    if out_h < 1 or out_w < 1:
        raise ShapeError(f"data {data.shape} with padding {attrs['padding']} is smaller than "
                         "the 3x3 kernel")
    return TensorType((n, weight.shape[0], out_h, out_w, weight.shape[4]), dtype)


def _ref(data: np.ndarray, weight: np.ndarray, padding, tile_size: int) -> np.ndarray:
    """Lavin & Gray's algorithm on whole arrays (float64 inside, data's dtype out)."""
    bt, _, at = winograd_matrices(tile_size)
    m, alpha = tile_size, tile_size + 2
    x = transform_array(data, f"NCHW{data.shape[4]}c", "NCHW").astype(np.float64)
    pt, pl, pb, pr = padding
    out_h, out_w = x.shape[2] + pt + pb - 2, x.shape[3] + pl + pr - 2
    tiles_h, tiles_w = tile_grid(out_h, out_w, m)
    x = np.pad(x, [(0, 0), (0, 0), (pt, pb + tiles_h * m - out_h), (pl, pr + tiles_w * m - out_w)])
    rows = np.arange(tiles_h)[:, None] * m + np.arange(alpha)[None]
    cols = np.arange(tiles_w)[:, None] * m + np.arange(alpha)[None]
    d = x[:, :, rows[:, None, :, None], cols[None, :, None, :]]  # [N, C, th, tw, α, α]
    v = np.einsum("ik,nchwkl,jl->nchwij", bt, d, bt)
    ob = weight.shape[4]
    u = weight.astype(np.float64).transpose(0, 4, 2, 3, 1)  # [O/ob, ob, C/ib, ib, α²]
    u = u.reshape(weight.shape[0] * ob, -1, alpha, alpha)
    mm = np.einsum("nchwij,ocij->nohwij", v, u)
    y = np.einsum("pi,nohwij,qj->nohpwq", at, mm, at)
    n, o = y.shape[:2]
    y = y.reshape(n, o, tiles_h * m, tiles_w * m)[:, :, :out_h, :out_w]
    return transform_array(y.astype(data.dtype), "NCHW", f"NCHW{ob}c")


register_op("nn.conv2d_winograd_NCHWc", _infer, OpPattern.OUT_ELEMWISE_FUSABLE, _ref)
