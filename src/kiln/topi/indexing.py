"""Index-driven computes (see :mod:`kiln.relay.op.indexing`): gathers read through an index
tensor; scatters and cumulative ops are written as reductions over the candidate sources of each
output element (no scatter stores in the loop IR), so every output element is computed once.
"""

from __future__ import annotations

import math

from kiln.tir import loop as L
from kiln.tir import te
from kiln.topi.registry import register_compute
from kiln.topi.transform import unravel

_REDUCERS = {"add": (te.sum, lambda a, b: a + b), "mul": (te.prod_reduce, lambda a, b: a * b),
             "max": (te.max_reduce, L.maximum), "min": (te.min_reduce, L.minimum)}


def _index(raw: L.PrimExpr, extent: int) -> L.PrimExpr:
    """An index value as int64, negative ones counted from the end of an axis of ``extent``."""
    pos = raw if raw.dtype == L.INT else L.Cast(L.INT, raw)
    return L.Select(pos < 0, pos + extent, pos)


def _clamp(i: L.PrimExpr, extent: int) -> L.PrimExpr:
    return L.minimum(i, L.IntImm(extent - 1)) if extent > 0 else i


@register_compute("gather")
def gather_elements(inputs, attrs, out_type):
    """ONNX GatherElements (graph op ``gather``): ``out[i] = data[i with i[axis] := indices[i]]``.

    https://onnx.ai/onnx/operators/onnx__GatherElements.html. A negative index counts from the
    end of ``axis``; indices are not range-checked at run time.

    Parameters
    ----------
    data : te.Tensor
        Rank ``r``, any dtype.
    indices : te.Tensor
        Rank ``r``, int32 or int64, values in ``[-data.shape[axis], data.shape[axis])``.
    axis : int
        attrs: the gathered axis (negative: from the end).

    Returns
    -------
    te.Tensor
        indices' shape, data's dtype; tag ``injective``.
    """
    data, indices = inputs
    axis = attrs["axis"] % len(data.shape)

    def body(*i):
        pos = _index(indices[i], data.shape[axis])
        return data[i[:axis] + (pos,) + i[axis + 1:]]

    return te.compute(out_type.shape, body, name="gather_elements", tag="injective")


@register_compute("scatter_elements")
def scatter_elements(inputs, attrs, out_type):
    """ONNX ScatterElements: ``data`` with ``updates[i]`` at ``i`` with ``i[axis] := indices[i]``.

    https://onnx.ai/onnx/operators/onnx__ScatterElements.html. Written as a reduction over the
    ``indices.shape[axis]`` candidate sources of each output element: ``reduction`` "none"
    takes the last matching update (stage ``scatter_last``, tag ``reduce``), the others combine
    every matching update with the identity-initialized accumulator (``scatter_acc``) and then
    with ``data``. Negative indices count from the end of ``axis``.

    Parameters
    ----------
    data : te.Tensor
        Rank ``r``, any dtype.
    indices : te.Tensor
        Rank ``r``, int32 or int64, each dimension at most data's.
    updates : te.Tensor
        indices' shape, data's dtype.
    axis : int
        attrs: the scattered axis.
    reduction : str
        attrs: ``"none"``, ``"add"``, ``"mul"``, ``"max"`` or ``"min"``.

    Returns
    -------
    te.Tensor
        data's shape and dtype; tag ``scatter``.
    """
    data, indices, updates = inputs
    axis = attrs["axis"] % len(data.shape)
    n = indices.shape[axis]
    r = te.reduce_axis(n, "r")

    def source(p: tuple, along: L.PrimExpr) -> tuple:
        """The indices/updates position of output ``p`` with ``along`` on the axis (other
        coordinates clamped: ``match`` rejects those outside the indices' extent)."""
        return tuple(along if d == axis else _clamp(p[d], indices.shape[d])
                     for d in range(len(p)))

    def match(p: tuple) -> L.PrimExpr:
        conds = [p[d] < indices.shape[d] for d in range(len(p))
                 if d != axis and indices.shape[d] < data.shape[d]]
        conds.append(L.eq(_index(indices[source(p, r.var)], data.shape[axis]), p[axis]))
        return L.logical_and(*conds)

    reduction = attrs["reduction"]
    if reduction == "none":
        last = te.compute(data.shape, lambda *p: te.max_reduce(
            L.Select(match(p), r.var, L.IntImm(-1)), [r]), name="scatter_last", tag="reduce")

        def pick(*p):
            k = last[p]
            return L.Select(k >= 0, updates[source(p, L.maximum(k, L.IntImm(0)))], data[p])

        return te.compute(data.shape, pick, name="scatter_elements", tag="scatter")
    reducer, combine = _REDUCERS[reduction]
    ident = {"add": 0, "mul": 1, "max": te.lowest(data.dtype),
             "min": te.highest(data.dtype)}[reduction]
    acc = te.compute(data.shape, lambda *p: reducer(
        L.Select(match(p), updates[source(p, r.var)], L.const(ident, data.dtype)), [r]),
        name="scatter_acc", tag="reduce")
    return te.compute(data.shape, lambda *p: combine(data[p], acc[p]), name="scatter_elements",
                      tag="scatter")


@register_compute("gather_nd")
def gather_nd(inputs, attrs, out_type):
    """ONNX GatherND: slices of ``data`` at the index tuples in the last axis of ``indices``.

    https://onnx.ai/onnx/operators/onnx__GatherND.html: ``out[o] = data[o[:b] + tuple(indices[
    o[:q-1]]) + o[q-1:]]``. Negative indices count from the end; no run-time range check.

    Parameters
    ----------
    data : te.Tensor
        Rank ``r``, any dtype.
    indices : te.Tensor
        Rank ``q``, ``[*batch, ..., k]``, int32 or int64; its first ``b`` dims match data's.
    batch_dims : int
        attrs: ``b``, the leading dims shared by data and indices.

    Returns
    -------
    te.Tensor
        ``indices.shape[:-1] + data.shape[b + k:]`` (rank ``q + r - k - 1 - b``), data's dtype;
        tag ``injective``.
    """
    data, indices = inputs
    b = attrs["batch_dims"]
    k = indices.shape[-1]
    lead = len(indices.shape) - 1

    def body(*o):
        tup = tuple(_index(indices[o[:lead] + (L.IntImm(j),)], data.shape[b + j])
                    for j in range(k))
        return data[o[:b] + tup + o[lead:]]

    return te.compute(out_type.shape, body, name="gather_nd", tag="injective")


@register_compute("scatter_nd")
def scatter_nd(inputs, attrs, out_type):
    """ONNX ScatterND: a copy of ``data`` with ``updates`` at the index tuples of ``indices``.

    https://onnx.ai/onnx/operators/onnx__ScatterND.html. As :func:`scatter_elements`, a
    reduction over all ``prod(indices.shape[:-1])`` updates for each output element.

    Parameters
    ----------
    data : te.Tensor
        Rank ``r``, any dtype.
    indices : te.Tensor
        ``[*u, k]``, int32 or int64, ``k <= r``.
    updates : te.Tensor
        ``[*u] + data.shape[k:]``, data's dtype.
    reduction : str
        attrs: ``"none"``, ``"add"``, ``"mul"``, ``"max"`` or ``"min"``.

    Returns
    -------
    te.Tensor
        data's shape and dtype; tag ``scatter``.
    """
    data, indices, updates = inputs
    k = indices.shape[-1]
    batch = indices.shape[:-1]
    u = te.reduce_axis(math.prod(batch), "u")

    def match(p: tuple) -> L.PrimExpr:
        at = unravel(u.var, batch)
        return L.logical_and(*[L.eq(_index(indices[at + (L.IntImm(j),)], data.shape[j]), p[j])
                               for j in range(k)])

    def update(p: tuple, flat: L.PrimExpr) -> L.PrimExpr:
        return updates[unravel(flat, batch) + tuple(p[k:])]

    reduction = attrs["reduction"]
    if reduction == "none":
        last = te.compute(data.shape, lambda *p: te.max_reduce(
            L.Select(match(p), u.var, L.IntImm(-1)), [u]), name="scatter_nd_last", tag="reduce")
        return te.compute(data.shape, lambda *p: L.Select(
            last[p] >= 0, update(p, L.maximum(last[p], L.IntImm(0))), data[p]),
            name="scatter_nd", tag="scatter")
    reducer, combine = _REDUCERS[reduction]
    ident = {"add": 0, "mul": 1, "max": te.lowest(data.dtype),
             "min": te.highest(data.dtype)}[reduction]
    acc = te.compute(data.shape, lambda *p: reducer(
        L.Select(match(p), update(p, u.var), L.const(ident, data.dtype)), [u]),
        name="scatter_nd_acc", tag="reduce")
    return te.compute(data.shape, lambda *p: combine(data[p], acc[p]), name="scatter_nd",
                      tag="scatter")


def _cumulative(op: str, reducer, ident: int) -> None:
    @register_compute(op)
    def _compute(inputs, attrs, out_type):
        """ONNX CumSum / CumProd along ``axis`` (graph ops ``cumsum``, ``cumprod``).

        ``out[p]`` = the sum (product) of ``x`` along the axis over the positions before (after,
        with ``reverse``) ``p[axis]``, ``p`` itself included unless ``exclusive``: one reduction
        over the whole axis per element, masked (O(n²) along the axis).

        Parameters
        ----------
        x : te.Tensor
            Any shape, numeric.
        axis : int
            attrs: the scanned axis (negative: from the end).
        exclusive, reverse : bool
            attrs: ONNX's ``exclusive`` and ``reverse``.

        Returns
        -------
        te.Tensor
            x's shape and dtype; tag ``reduce``.
        """
        (x,) = inputs
        axis = attrs["axis"] % len(x.shape)
        r = te.reduce_axis(x.shape[axis], "r")
        exclusive, reverse = attrs["exclusive"], attrs["reverse"]

        def body(*p):
            q = p[axis]
            if reverse:
                take = r.var > q if exclusive else r.var >= q
            else:
                take = r.var < q if exclusive else r.var <= q
            value = x[p[:axis] + (r.var,) + p[axis + 1:]]
            return reducer(L.Select(take, value, L.const(ident, x.dtype)), [r])

        return te.compute(x.shape, body, name=op, tag="reduce")


_cumulative("cumsum", te.sum, 0)
_cumulative("cumprod", te.prod_reduce, 1)
