"""Injective computes: reshape, transpose, concatenate, strided_slice, take, expand."""

from __future__ import annotations

import math

from kiln import arith
from kiln.tir import te
from kiln.tir import loop as L
from kiln.topi.registry import register_compute
from kiln.topi.broadcast import broadcast_load


def _ravel(idx: tuple, shape: tuple[int, ...]) -> L.PrimExpr:
    flat: L.PrimExpr = L.IntImm(0)
    for i, extent in zip(idx, shape):
        flat = flat * extent + i
    return flat


def unravel(flat: L.PrimExpr, shape: tuple[int, ...]) -> tuple:
    """The row-major multi-index of flat position ``flat`` in ``shape``."""
    idx = []
    for k in range(len(shape)):
        inner = math.prod(shape[k + 1:])
        idx.append((flat // inner) % shape[k] if k else flat // inner)
    return tuple(idx)


@register_compute("reshape")
def reshape(inputs, attrs, out_type):
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
    return te.compute(out, lambda *i: x[unravel(_ravel(i, out), src)],
                      name="reshape", tag="reshape")


@register_compute("transpose")
def transpose(inputs, attrs, out_type):
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
    (x,) = inputs
    begin, strides = attrs["begin"], attrs["strides"]
    return te.compute(out_type.shape,
                      lambda *i: x[tuple(b + s * v for b, s, v in zip(begin, strides, i))],
                      name="strided_slice", tag="injective")


@register_compute("take")
def take(inputs, attrs, out_type):
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
    start, delta = inputs
    dtype = out_type.dtype

    def body(k: L.PrimExpr) -> L.PrimExpr:
        return start[()] + (k if k.dtype == dtype else L.Cast(dtype, k)) * delta[()]

    return te.compute(out_type.shape, body, name="arange", tag="injective")
