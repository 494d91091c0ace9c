"""Winograd convolution F(m×m, 3×3) in the blocked-channel layout NCHW{ib}c (Lavin & Gray
2016, "Fast Algorithms for Convolutional Neural Networks", section 4; TVM's
``python/tvm/topi/nn/winograd_util.py`` and ``topi/x86/conv2d_winograd`` for the stage shapes).

An ``m×m`` output tile of a stride-1 3×3 conv is ``Aᵀ [(G g Gᵀ) ⊙ (Bᵀ d B)] A`` over the
``α×α`` input tile ``d`` (``α = m + 2``): per tile and channel the α² products replace 9·m²
multiply-adds, and summed over input channels they are α² independent GEMMs
(``M[e] = Σ_c V[e, c] · U[e, c]``). ``U = G g Gᵀ`` is computed once, at compile time
(:func:`kiln.relay.op.winograd.winograd_weight`); this module holds the matrices and the three
run-time stages:

- ``winograd_input`` (tag ``winograd_input``): ``V[n, c, i, j, t, b] = (Bᵀ d_t B)[i, j]``;
- ``winograd_gemm`` (tag ``conv2d_winograd_NCHWc``): ``M[n, o, e, t, b] = Σ_{rc, ri}
  V[n, rc, e // α, e % α, t, ri] · U[o, e, rc, ri, b]``, channel blocks the vector axis;
- ``winograd_output`` (tag ``winograd_output``): ``Y[n, o, y, x, b] = (Aᵀ M_t A)[y % m, x % m]``.

The transforms are sums of the few non-zero coefficients of ``Bᵀ`` and ``Aᵀ`` for each
transform index, chosen by a ``Select`` over it: the schedule unrolls those indices, so each
unrolled copy keeps one branch (the compilers fold the constant conditions).
"""

from __future__ import annotations

import numpy as np

from kiln.tir import loop as L
from kiln.tir import te
from kiln.topi.nn import pad_hw
from kiln.topi.registry import register_compute

#: Lavin & Gray 2016, section 4.1: F(2×2, 3×3).
F2_BT = np.array([[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]], np.float64)
F2_G = np.array([[1, 0, 0], [.5, .5, .5], [.5, -.5, .5], [0, 0, 1]], np.float64)
F2_AT = np.array([[1, 1, 1, 0], [0, 1, -1, -1]], np.float64)
#: Lavin & Gray 2016, section 4.2: F(4×4, 3×3) (interpolation points 0, ±1, ±2, ∞).
F4_BT = np.array([[4, 0, -5, 0, 1, 0], [0, -4, -4, 1, 1, 0], [0, 4, -4, -1, 1, 0],
                  [0, -2, -1, 2, 1, 0], [0, 2, -1, -2, 1, 0], [0, 4, 0, -5, 0, 1]], np.float64)
F4_G = np.array([[1 / 4, 0, 0], [-1 / 6, -1 / 6, -1 / 6], [-1 / 6, 1 / 6, -1 / 6],
                 [1 / 24, 1 / 12, 1 / 6], [1 / 24, -1 / 12, 1 / 6], [0, 0, 1]], np.float64)
F4_AT = np.array([[1, 1, 1, 1, 1, 0], [0, 1, -1, 2, -2, 0], [0, 1, 1, 4, 4, 0],
                  [0, 1, -1, 8, -8, 1]], np.float64)


def winograd_matrices(tile: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(Bᵀ, G, Aᵀ)`` of F(tile×tile, 3×3): shapes ``[α, α]``, ``[α, 3]``, ``[tile, α]``
    with ``α = tile + 2``, float64.

    Raises
    ------
    ValueError
        ``tile`` is not 2 or 4.
    """
    if tile == 2:
        return F2_BT, F2_G, F2_AT
    if tile == 4:
        return F4_BT, F4_G, F4_AT
    raise ValueError(f"Winograd tile {tile}: only F(2x2, 3x3) and F(4x4, 3x3)")


def tile_grid(out_h: int, out_w: int, tile: int) -> tuple[int, int]:
    """Tiles of ``tile×tile`` outputs along the height and the width (the last ones partial)."""
    return -(-out_h // tile), -(-out_w // tile)


def _combination(coefficients: np.ndarray, terms: list[L.PrimExpr]) -> L.PrimExpr:
    """``Σ c_k · terms[k]`` over the non-zero ``c_k`` (±1 as an add or a subtract)."""
    out = None
    for c, term in zip(coefficients, terms):
        if c == 0:
            continue
        if abs(c) != 1:
            term = term * L.const(abs(c), term.dtype)
        if out is None:
            out = term if c > 0 else -term
        else:
            out = out + term if c > 0 else out - term
    assert out is not None, "a transform row of zeros"
    return out


def _pick(index: L.PrimExpr, choices: list[L.PrimExpr]) -> L.PrimExpr:
    """``choices[index]`` as a chain of ``Select(index < k + 1, …)`` (an unrolled ``index``
    keeps one: the conditions are constants there)."""
    out = choices[-1]
    for k in range(len(choices) - 2, -1, -1):
        out = L.Select(index < k + 1, choices[k], out)
    return out


def _transform_2d(matrix: np.ndarray, p: L.PrimExpr, q: L.PrimExpr, at) -> L.PrimExpr:
    """``(matrix · X · matrixᵀ)[p, q]`` with ``X[k, l] = at(k, l)``: rows first (the inner sums
    are shared by every ``q`` of one ``p``, so unrolled copies compute them once)."""
    size = matrix.shape[1]

    def row(pi: int) -> list[L.PrimExpr]:
        return [_combination(matrix[pi], [at(k, col) for k in range(size)])
                for col in range(size)]

    rows = [row(pi) for pi in range(matrix.shape[0])]
    return _pick(p, [_pick(q, [_combination(matrix[qi], r) for qi in range(matrix.shape[0])])
                     for r in rows])


@register_compute("nn.conv2d_winograd_NCHWc")
def conv2d_winograd_nchwc(inputs, attrs, out_type):
    """Stride-1 3×3 convolution by Winograd's minimal filtering F(m×m, 3×3), blocked channels.

    ``out[n, o, y, x, b] = Σ_{c, ry, rx} pad(data)[n, c, y + ry, x + rx] · w[o, c, ry, rx]``
    computed as Lavin & Gray 2016 (see the module doc) from the transformed weight
    ``U = G w Gᵀ``. Rounding differs from the direct sum by a few ulps of the operands' sums
    (F(2×2): ~1e-6 relative; F(4×4): ~1e-5, its transform has coefficients up to 8).

    Parameters
    ----------
    data : te.Tensor
        5-D, [batch, in_channel // ib, in_height, in_width, ib] (NCHW{ib}c), float32.
    weight : te.Tensor
        5-D, [out_channel // ob, α·α, in_channel // ib, ib, ob], data's dtype (α = m + 2).
    padding : tuple of int
        attrs: ``(top, left, bottom, right)``.
    tile_size : int
        attrs: m, 2 or 4.

    Returns
    -------
    te.Tensor
        5-D, [batch, out_channel // ob, in_height + top + bottom - 2, in_width + left + right
        - 2, ob] (NCHW{ob}c), data's dtype; tag ``winograd_output`` (an injective stage over
        the ``conv2d_winograd_NCHWc`` GEMM stage, which is a reduction).
    """
    data, weight = inputs
    m = attrs["tile_size"]
    bt, _, at = winograd_matrices(m)
    alpha = m + 2
    n_, _, out_h, out_w, _ = out_type.shape
    tiles_h, tiles_w = tile_grid(out_h, out_w, m)
    pt, pl, pb, pr = attrs["padding"]
    # pad the bottom and right up to whole tiles: the partial tiles read zeros
    padded = pad_hw(data, (pt, pl, pb + tiles_h * m - out_h, pr + tiles_w * m - out_w))
    batch, in_blocks, _, _, ib = data.shape
    tiles = tiles_h * tiles_w

    def input_tile(n, c, i, j, t, b):
        y0, x0 = (t // tiles_w) * m, (t % tiles_w) * m
        return _transform_2d(bt, i, j, lambda k, col: padded[n, c, y0 + k, x0 + col, b])

    v = te.compute((batch, in_blocks, alpha, alpha, tiles, ib), input_tile,
                   name="winograd_input", tag="winograd_input")
    rc, ri = te.reduce_axis(in_blocks, "rc"), te.reduce_axis(ib, "ri")
    out_blocks, ob = out_type.shape[1], out_type.shape[4]
    gemm = te.compute(
        (n_, out_blocks, alpha * alpha, tiles, ob),
        lambda n, o, e, t, b: te.sum(v[n, rc.var, e // alpha, e % alpha, t, ri.var]
                                     * weight[o, e, rc.var, ri.var, b], [rc, ri]),
        name="winograd_gemm", tag="conv2d_winograd_NCHWc")

    def output_pixel(n, o, y, x, b):
        t = (y // m) * tiles_w + x // m
        return _transform_2d(at, y % m, x % m,
                             lambda k, col: gemm[n, o, k * alpha + col, t, b])

    return te.compute(out_type.shape, output_pixel, name="winograd_output",
                      tag="winograd_output")
