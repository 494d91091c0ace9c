"""The grid_sample and col2im computes (see :mod:`kiln.relay.op.sampling`). grid_sample: per
output position, the source coordinate of each spatial axis from the grid, then a reduction
over the interpolation taps (1, 2 or 4 per axis) of weight × the padded read."""

from __future__ import annotations

import math

from kiln.tir import loop as L
from kiln.tir import te
from kiln.topi.registry import register_compute
from kiln.topi.transform import unravel

CUBIC_A = -0.75


def borders(size: int, align_corners: bool) -> tuple[float, float]:
    return (0.0, size - 1.0) if align_corners else (-0.5, size - 0.5)


def col2im_geometry(attrs: dict) -> tuple:
    image, block = attrs["image_shape"], attrs["block_shape"]
    dil, pads, strides = attrs["dilations"], attrs["pads"], attrs["strides"]
    nsp = len(image)
    blocks = tuple((image[d] + pads[d] + pads[d + nsp] - dil[d] * (block[d] - 1) - 1)
                   // strides[d] + 1 for d in range(nsp))
    return image, block, dil, pads, strides, blocks


def _floor(v: L.PrimExpr) -> L.PrimExpr:
    return L.call("floor", v)


def _number(value, dtype: str) -> L.PrimExpr:
    """``value`` (a number, a symbolic dim or an expression) as a ``dtype`` expression."""
    if isinstance(value, L.PrimExpr):
        return value
    if isinstance(value, (int, float)):
        return L.const(value, dtype)
    return L.Cast(dtype, L.as_index(value))  # a symbolic extent, read at run time


def _borders(size, align_corners: bool, dtype: str) -> tuple[L.PrimExpr, L.PrimExpr]:
    """:func:`borders` of a static or symbolic ``size``, as ``dtype`` expressions."""
    extent = _number(size, dtype)
    if align_corners:
        return L.const(0, dtype), extent - L.const(1, dtype)
    return L.const(-0.5, dtype), extent - L.const(0.5, dtype)


def _reflect(v: L.PrimExpr, lo: L.PrimExpr, hi: L.PrimExpr) -> L.PrimExpr:
    """Fold ``v`` into [lo, hi] by reflecting at the nearer border until inside."""
    dt = v.dtype
    rng = hi - lo
    lo_c, hi_c = lo, hi

    def fold(dx: L.PrimExpr, near: L.PrimExpr, far: L.PrimExpr, sign_near: int) -> L.PrimExpr:
        n = _floor(dx / rng)
        r = dx - n * rng
        even = L.eq(n - _floor(n / L.const(2, dt)) * L.const(2, dt), L.const(0, dt))
        inner = near + r if sign_near > 0 else near - r
        outer = far - r if sign_near > 0 else far + r
        return L.Select(even, inner, outer)

    below = fold(lo_c - v, lo_c, hi_c, +1)
    above = fold(v - hi_c, hi_c, lo_c, -1)
    return L.Select(v < lo_c, below, L.Select(v > hi_c, above, v))


def _cubic(t: L.PrimExpr, r: L.PrimExpr) -> L.PrimExpr:
    """Keys' cubic weight of tap ``r`` (0..3, at floor - 1 + r) for the fraction ``t``."""
    dt = t.dtype
    a = L.const(CUBIC_A, dt)
    one, two = L.const(1, dt), L.const(2, dt)

    def near(d):
        return ((a + two) * d - (a + L.const(3, dt))) * d * d + one

    def far(d):
        return ((a * d - L.const(5, dt) * a) * d + L.const(8, dt) * a) * d - L.const(4, dt) * a

    return L.Select(L.eq(r, L.IntImm(0)), far(t + one),
                    L.Select(L.eq(r, L.IntImm(1)), near(t),
                             L.Select(L.eq(r, L.IntImm(2)), near(one - t), far(two - t))))


@register_compute("image.grid_sample")
def grid_sample(inputs, attrs, out_type):
    """ONNX GridSample (opset 20, 2-D and 3-D): ``x`` sampled at the normalized grid coordinates.

    Per output position, each spatial axis's source coordinate from the grid (``align_corners``:
    ``(g + 1) / 2 · (size - 1)``, else ``((g + 1) · size - 1) / 2``; clamped for ``border``,
    reflected for ``reflection`` when outside the border), then a reduction over the
    interpolation taps (1, 2 or 4 per axis) of ``weight × x`` at the tap (zeros padding: 0
    outside the input). Follows ONNX's reference, ``onnx/reference/ops/op_grid_sample.py``;
    cubic is Keys' kernel with ``A = CUBIC_A`` (-0.75).

    Parameters
    ----------
    x : te.Tensor
        [batch, channel, *spatial] (NCHW, or NCDHW for 3-D), float, static spatial sizes.
    grid : te.Tensor
        [batch, *out_spatial, k] with ``k = len(spatial)``, in [-1, 1], last axis ordered x,
        y[, z] (innermost spatial axis first), x's dtype.
    mode, padding_mode : str
        attrs: ``nearest`` / ``linear`` / ``cubic``; ``zeros`` / ``border`` / ``reflection``.
    align_corners : bool
        attrs: -1 and 1 are the centres (True) or the outer edges (False) of the corner pixels.

    Returns
    -------
    te.Tensor
        [batch, channel, *out_spatial] (``out_type.shape``), x's dtype; tag ``grid_sample``.
    """
    x, grid = inputs
    sizes = x.shape[2:]
    nsp = len(sizes)
    dt = x.dtype
    mode, padding, align = attrs["mode"], attrs["padding_mode"], attrs["align_corners"]
    taps = {"nearest": 1, "linear": 2, "cubic": 4}[mode]
    raxes = [te.reduce_axis(taps, f"t{k}") for k in range(nsp)] if taps > 1 else []

    def coordinate(n, o, k: int) -> L.PrimExpr:
        size = sizes[k]
        v = grid[(n, *o, nsp - 1 - k)]
        one, extent = L.const(1, dt), _number(size, dt)
        if align:
            c = (v + one) / L.const(2, dt) * (extent - one)
        else:
            c = ((v + one) * extent - one) / L.const(2, dt)
        if mode == "nearest":
            c = L.call("nearbyint", c)
        lo, hi = _borders(size, align, dt)
        if padding == "border":
            outside = L.Binary("or", c < lo, c > hi)
            clamped = L.minimum(L.maximum(c, L.const(0, dt)), extent - one)
            c = L.Select(outside, clamped, c)
        elif padding == "reflection":
            c = _reflect(c, lo, hi)
        return c

    def tap_index(i: L.PrimExpr, k: int) -> tuple[L.PrimExpr, L.PrimExpr | None]:
        """(index to read, in-range condition for zeros padding) of integer tap ``i``."""
        size = sizes[k]
        last = L.as_index(size - 1)
        if padding == "zeros":
            ok = L.logical_and(i >= 0, i < L.as_index(size))
            return L.minimum(L.maximum(i, L.IntImm(0)), last), ok
        if padding == "border":
            return L.minimum(L.maximum(i, L.IntImm(0)), last), None
        lo, hi = _borders(size, align, dt)
        return L.Cast(L.INT, _reflect(L.Cast(dt, i), lo, hi)), None

    def body(n, c, *o):
        coords = [coordinate(n, o, k) for k in range(nsp)]
        weight = None
        index, conds = [], []
        for k, co in enumerate(coords):
            if mode == "nearest":
                i, w = L.Cast(L.INT, co), None
            else:
                base = _floor(co)
                t = co - base
                r = raxes[k].var
                i = L.Cast(L.INT, base) + r - (1 if mode == "cubic" else 0)
                if mode == "linear":
                    w = L.Select(L.eq(r, L.IntImm(0)), L.const(1, dt) - t, t)
                else:
                    w = _cubic(t, r)
            idx, ok = tap_index(i, k)
            index.append(idx)
            if ok is not None:
                conds.append(ok)
            if w is not None:
                weight = w if weight is None else weight * w
        value = x[(n, c, *index)]
        if conds:
            value = L.Select(L.logical_and(*conds), value, L.const(0, dt))
        if not raxes:
            return value
        return te.sum(weight * value, raxes)

    return te.compute(out_type.shape, body, name="grid_sample", tag="grid_sample")


@register_compute("col2im")
def col2im(inputs, attrs, out_type):
    """ONNX Col2Im: the column blocks of ``x`` summed back into an image (the inverse of im2col).

    ``out[n, c, p] = Σ_k x[n, c·K + k, b]`` for the block ``b`` whose tap ``k`` lands on ``p``:
    ``p + pad - k·dilation`` divisible by the stride and inside the block grid (one reduction
    over the ``K = prod(block_shape)`` kernel offsets).

    Parameters
    ----------
    x : te.Tensor
        3-D, [batch, channel · prod(block_shape), prod(blocks)], ``blocks[d] = (image[d] +
        pad_begin[d] + pad_end[d] - dilation[d] · (block[d] - 1) - 1) // stride[d] + 1``.
    image_shape, block_shape, dilations, strides : tuple of int
        attrs: the output's spatial shape; the kernel; per spatial dim, in pixels.
    pads : tuple of int
        attrs: ONNX's ``[begin..., end...]``.

    Returns
    -------
    te.Tensor
        [batch, channel, *image_shape], x's dtype; tag ``col2im``.
    """
    (x,) = inputs
    image, block, dil, pads, strides, blocks = col2im_geometry(attrs)
    nsp = len(image)
    k_total = math.prod(block)
    r = te.reduce_axis(k_total, "k")

    def body(n, c, *p):
        ks = unravel(r.var, tuple(block))
        conds, bs = [], []
        for d in range(nsp):
            num = p[d] + pads[d] - ks[d] * dil[d]
            conds += [num >= 0, L.eq(num % strides[d], L.IntImm(0)),
                      num // strides[d] < blocks[d]]
            bs.append(L.minimum(L.maximum(num // strides[d], L.IntImm(0)),
                                L.IntImm(blocks[d] - 1)))
        flat_b = bs[0]
        for d in range(1, nsp):
            flat_b = flat_b * blocks[d] + bs[d]
        value = x[n, c * k_total + r.var, flat_b]
        return te.sum(L.Select(L.logical_and(*conds), value, L.const(0, x.dtype)), [r])

    return te.compute(out_type.shape, body, name="col2im", tag="col2im")
