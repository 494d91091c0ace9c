"""Injective computes: reshape, transpose, concatenate, strided_slice, take, expand."""

from __future__ import annotations

import math

from kiln.ir import loop as L
from kiln.ir import te
from kiln.ir.op_registry import register_compute
from kiln.ops.broadcast import broadcast_load


def _ravel(idx: tuple, shape: tuple[int, ...]) -> L.PrimExpr:
    flat: L.PrimExpr = L.IntImm(0)
    for i, extent in zip(idx, shape):
        flat = flat * extent + i
    return flat


def _unravel(flat: L.PrimExpr, shape: tuple[int, ...]) -> tuple:
    idx = []
    for k in range(len(shape)):
        inner = math.prod(shape[k + 1:])
        idx.append((flat // inner) % shape[k] if k else flat // inner)
    return tuple(idx)


@register_compute("reshape")
def reshape(inputs, attrs, out_type):
    (x,) = inputs
    return te.compute(out_type.shape, lambda *i: x[_unravel(_ravel(i, out_type.shape), x.shape)],
                      name="reshape", tag="injective")


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

    extent = data.shape[axis]

    def body(*i):
        raw = indices[i[axis:axis + nidx]]
        pos = raw if raw.dtype == L.INT else L.Cast(L.INT, raw)
        pos = L.Select(pos < 0, pos + extent, pos)
        # An index out of range is an error in ONNX; clamped (TVM's take mode "clip"), a bad
        # token id cannot make the kernel read outside the table.
        pos = L.minimum(L.maximum(pos, L.IntImm(0)), L.IntImm(extent - 1))
        return data[i[:axis] + (pos,) + i[axis + nidx:]]

    return te.compute(out_type.shape, body, name="take", tag="injective")


@register_compute("expand")
def expand(inputs, attrs, out_type):
    (x,) = inputs
    return te.compute(out_type.shape, lambda *i: broadcast_load(x, i), name="expand",
                      tag="broadcast")
