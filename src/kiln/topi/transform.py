"""Injective computes: reshape, transpose, concatenate, strided_slice, take, expand."""

from __future__ import annotations

import math

from kiln import arith
from kiln.tir import loop as L
from kiln.tir import te
from kiln.topi.broadcast import broadcast_load
from kiln.topi.registry import register_compute


def _ravel(idx: tuple, shape: tuple[int, ...]) -> L.PrimExpr:
    flat: L.PrimExpr = L.IntImm(0)
    for i, extent in zip(idx, shape):
        flat = flat * extent + i
    return flat


def unravel(flat: L.PrimExpr, shape: tuple[int, ...]) -> tuple:
    """The row-major multi-index of flat position ``flat`` in ``shape``.

    Parameters
    ----------
    flat : PrimExpr
        In ``[0, prod(shape))``.
    shape : tuple of int
        The extents (static).

    Returns
    -------
    tuple of PrimExpr
        One index per dimension: ``flat // prod(shape[k+1:]) % shape[k]`` (no modulo for the
        first).
    """
    idx = []
    for k in range(len(shape)):
        inner = math.prod(shape[k + 1:])
        idx.append((flat // inner) % shape[k] if k else flat // inner)
    return tuple(idx)


@register_compute("reshape")
def reshape(inputs, attrs, out_type):
    """ONNX Reshape: the row-major order of ``x`` read into ``newshape``.

    ``out[i] = x[unravel(ravel(i, out), x.shape)]``. When trailing axes merge with static shapes
    (``[.., H, D] → [.., H·D]``), the source's last index is the output's modulo D, so a loop
    split by D (schedule ``reshape``) walks both contiguously.

    Parameters
    ----------
    x : te.Tensor
        Any shape and dtype.
    newshape : tuple of int
        attrs: the concrete output shape (``out_type.shape``), same element count.

    Returns
    -------
    te.Tensor
        ``newshape``, x's dtype; tag ``reshape``.
    """
    (x,) = inputs
    out, src = out_type.shape, x.shape
    last, inner = out[-1] if out else 1, src[-1] if src else 1
    if isinstance(last, int) and isinstance(inner, int) and 1 < inner < last \
            and last % inner == 0 and all(isinstance(d, int) for d in (*out, *src)):
        # trailing axes merged ([.., H, D] -> [.., H*D]): the source's last index is the
        # output's modulo D, so a loop split by D (schedule "reshape") walks both contiguously
        def body(*i):
            rows = _ravel(i[:-1], out[:-1]) * (last // inner) + i[-1] // inner
            return x[(*unravel(rows, src[:-1]), i[-1] % inner)]

        return te.compute(out, body, name="reshape", tag="reshape")
    if all(isinstance(d, int) for d in (*out, *src)):
        return te.compute(out, lambda *i: x[unravel(_ravel(i, out), src)],
                          name="reshape", tag="reshape")
    groups = aligned_groups(out, src)

    def grouped(*i):
        idx: list = []
        for (o0, o1), (s0, s1) in groups:
            if o1 - o0 == 1 and s1 - s0 == 1:  # an axis kept as it is
                idx.append(i[o0])
            else:
                idx.extend(unravel(_ravel(i[o0:o1], out[o0:o1]), src[s0:s1]))
        return x[tuple(idx)]

    return te.compute(out, grouped, name="reshape", tag="reshape")


def _divides(c, a) -> bool:
    """Whether dim ``c`` divides dim ``a`` for every value of the symbols."""
    return arith.provably_equal(arith.mul(arith.floordiv(a, c), c), a)


def aligned_groups(out: tuple, src: tuple) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """The axes of a reshape cut where both shapes' prefix products are provably equal.

    ``[b, 48, h, w] → [b, 2, 24, h, w]`` gives ``(b)(48)(h)(w)`` against ``(b)(2, 24)(h)(w)``:
    each group's index is raveled and unraveled within the group alone, so an output index
    never divides by a symbolic extent the two shapes share (ShuffleNet's channel shuffle over
    symbolic H, W: 14 ns an element with the whole flat index, a copy without). What cannot be
    aligned (``[h, w] → [w, h]``) is one last group with the whole remaining flat index.

    Parameters
    ----------
    out, src : tuple of int or SymExpr
        The output's and the source's shapes (the same element count).

    Returns
    -------
    list of ((o0, o1), (s0, s1))
        Output axes ``o0:o1`` hold the elements of source axes ``s0:s1``; together they cover
        both shapes in order (a range may be empty for trailing extent-1 axes).
    """
    groups, i, j = [], 0, 0
    while i < len(out) and j < len(src):
        oi, sj, po, ps = i + 1, j + 1, out[i], src[j]
        while not arith.provably_equal(po, ps):
            if sj < len(src) and _divides(ps, po):
                ps, sj = arith.mul(ps, src[sj]), sj + 1
            elif oi < len(out) and _divides(po, ps):
                po, oi = arith.mul(po, out[oi]), oi + 1
            else:
                return groups + [((i, len(out)), (j, len(src)))]
        groups.append(((i, oi), (j, sj)))
        i, j = oi, sj
    if i < len(out) or j < len(src):
        groups.append(((i, len(out)), (j, len(src))))
    return groups


@register_compute("transpose")
def transpose(inputs, attrs, out_type):
    """ONNX Transpose: ``out[i] = x[j]`` with ``j[axes[k]] = i[k]``.

    Parameters
    ----------
    x : te.Tensor
        Any shape and dtype.
    axes : tuple of int
        attrs: a full permutation of x's axes (ONNX ``perm``).

    Returns
    -------
    te.Tensor
        ``[x.shape[a] for a in axes]``, x's dtype; tag ``injective``.
    """
    (x,) = inputs
    axes = attrs["axes"]

    def body(*i):
        src = [None] * len(axes)
        for k, a in enumerate(axes):
            src[a] = i[k]
        return x[tuple(src)]

    return te.compute(out_type.shape, body, name="transpose", tag="injective")


@register_compute("concatenate")
def concatenate(inputs, attrs, out_type):
    """ONNX Concat along ``axis``: each output element selects the input its index falls in.

    Parameters
    ----------
    *tensors : te.Tensor
        ``inputs``: one or more, of one rank and dtype, equal off ``axis``.
    axis : int
        attrs: the joined axis (negative: from the end).

    Returns
    -------
    te.Tensor
        The inputs' shape with ``Σ t.shape[axis]`` along ``axis``, their dtype; tag
        ``injective``.
    """
    axis = attrs["axis"] % len(out_type.shape)

    def body(*i):
        offsets, start = [], 0
        for t in inputs:
            offsets.append(start)
            start += t.shape[axis]
        value = None
        for t, off in reversed(list(zip(inputs, offsets))):
            load = t[i[:axis] + (i[axis] - off,) + i[axis + 1:]]
            value = load if value is None else L.Select(i[axis] < off + t.shape[axis], load, value)
        return value

    return te.compute(out_type.shape, body, name="concatenate", tag="injective")


@register_compute("strided_slice")
def strided_slice(inputs, attrs, out_type):
    """ONNX Slice: ``out[i] = x[begin + strides · i]`` per axis (normalized bounds).

    Parameters
    ----------
    x : te.Tensor
        Any shape and dtype.
    begin, strides : tuple of int
        attrs: one entry per axis, normalized by the frontend (``end`` enters ``out_type``:
        :func:`kiln.relay.op.transform.slice_length`).

    Returns
    -------
    te.Tensor
        ``[slice_length(n, b, e, s)]`` per axis (``out_type.shape``), x's dtype; tag
        ``injective``.
    """
    (x,) = inputs
    begin, strides = attrs["begin"], attrs["strides"]
    return te.compute(out_type.shape,
                      lambda *i: x[tuple(b + s * v for b, s, v in zip(begin, strides, i))],
                      name="strided_slice", tag="injective")


@register_compute("take")
def take(inputs, attrs, out_type):
    """ONNX Gather: ``data`` indexed along ``axis`` by ``indices`` (clamped to the axis).

    ``out[i] = data[i[:axis] + (indices[i[axis:axis + q]],) + i[axis + q:]]``, ``q`` the rank
    of ``indices``. A negative index counts from the end; out-of-range ones are clamped to
    the axis (TVM's ``take`` mode "clip") so that a bad token id cannot read outside the
    table.

    Parameters
    ----------
    data : te.Tensor
        Any shape and dtype.
    indices : te.Tensor
        Any shape (rank 0 included), integer.
    axis : int
        attrs: the indexed axis of data.

    Returns
    -------
    te.Tensor
        ``data.shape[:axis] + indices.shape + data.shape[axis + 1:]``, data's dtype; tag
        ``injective``.
    """
    data, indices = inputs
    axis = attrs["axis"] % len(data.shape)
    nidx = len(indices.shape)

    extent = te.dim_expr(data.shape[axis])

    def body(*i):
        raw = indices[i[axis:axis + nidx]]
        pos = raw if raw.dtype == L.INT else L.Cast(L.INT, raw)
        pos = L.Select(pos < 0, pos + extent, pos)
        # An index out of range is an error in ONNX; clamped (TVM's take mode "clip"), a bad
        # token id cannot make the kernel read outside the table.
        pos = L.minimum(L.maximum(pos, L.IntImm(0)), extent - 1)
        return data[i[:axis] + (pos,) + i[axis + nidx:]]

    return te.compute(out_type.shape, body, name="take", tag="injective")


@register_compute("expand")
def expand(inputs, attrs, out_type):
    """ONNX Expand: ``x`` broadcast to ``newshape`` (numpy rule, :func:`broadcast_load`).

    Parameters
    ----------
    x : te.Tensor
        Rank at most ``len(newshape)``, each dimension 1 or newshape's.
    newshape : tuple of int
        attrs: the concrete output shape.

    Returns
    -------
    te.Tensor
        ``newshape``, x's dtype; tag ``broadcast``.
    """
    (x,) = inputs
    return te.compute(out_type.shape, lambda *i: broadcast_load(x, i), name="expand",
                      tag="broadcast")


def _pad_source(i: L.PrimExpr, before: int, after: int, n: arith.Dim, mode: str) -> L.PrimExpr:
    """The input index read for output index ``i`` of an axis of extent ``n``."""
    j = i - before
    if not isinstance(n, int) and before == after == 0:
        return j  # an unpadded symbolic axis (a batch): no run-time period that may be 0
    if mode == "edge":
        return L.minimum(L.maximum(j, L.IntImm(0)), te.dim_expr(n - 1))
    if mode == "wrap":
        return j % n  # the loop IR's % is the floor modulo
    if mode == "reflect":
        if n == 1:
            return L.IntImm(0)
        # a symbolic extent of 1 cannot be reflect-padded (ONNX): keep its period nonzero
        period = 2 * (n - 1) if isinstance(n, int) else arith.maximum(2 * (n - 1), 1)
        m = j % period
        return L.Select(m < n, m, te.dim_expr(period) - m)
    return j


@register_compute("nn.pad")
def pad(inputs, attrs, out_type):
    """ONNX Pad (graph op ``nn.pad``): ``x`` padded (or, by negative widths, cropped) per axis.

    Modes: ``constant`` (``pad_value`` outside, reads clamped so the select may be eager),
    ``edge`` (the nearest element), ``reflect`` (mirrored, the edge not repeated; period
    ``2 (n - 1)``), ``wrap`` (period ``n``, x's extent, also on a cropped axis).

    Parameters
    ----------
    x : te.Tensor
        Any shape and dtype.
    pad_width : tuple of (int, int)
        attrs: ``(before, after)`` per axis, in elements; negative values crop.
    pad_value : float
        attrs: the constant mode's value.
    pad_mode : str
        attrs: ``constant``, ``edge``, ``reflect`` or ``wrap``.

    Returns
    -------
    te.Tensor
        ``[n + before + after]`` per axis, x's dtype; tag ``injective``.
    """
    (x,) = inputs
    mode = attrs["pad_mode"]
    width = attrs["pad_width"]

    def body(*i):
        src = tuple(_pad_source(v, lo, hi, n, mode)
                    for v, (lo, hi), n in zip(i, width, x.shape))
        if mode != "constant":
            return x[src]
        inside = [cond for s, (lo, hi), n in zip(src, width, x.shape) if lo > 0 or hi > 0
                  for cond in (s >= 0, s < n)]
        if not inside:
            return x[src]
        # Out-of-range reads are clamped: the Select discards them, and neither codegen
        # need evaluate it lazily.
        safe = tuple(L.minimum(L.maximum(s, L.IntImm(0)), te.dim_expr(arith.maximum(n - 1, 0)))
                     for s, n in zip(src, x.shape))
        return L.Select(L.logical_and(*inside), x[safe], L.const(attrs["pad_value"], x.dtype))

    return te.compute(out_type.shape, body, name="pad", tag="injective")


@register_compute("arange")
def arange(inputs, attrs, out_type):
    """ONNX Range over shape values: ``out[k] = start + k · delta`` for ``k`` in ``[0, count)``.

    Parameters
    ----------
    start, delta : te.Tensor
        Rank 0, of one dtype.
    count : int or arith.Dim
        attrs: the length (possibly symbolic: a causal mask's ``Range(past, total)``).

    Returns
    -------
    te.Tensor
        1-D, ``[count]``, start's dtype; tag ``injective``.
    """
    start, delta = inputs
    dtype = out_type.dtype

    def body(k: L.PrimExpr) -> L.PrimExpr:
        return start[()] + (k if k.dtype == dtype else L.Cast(dtype, k)) * delta[()]

    return te.compute(out_type.shape, body, name="arange", tag="injective")
