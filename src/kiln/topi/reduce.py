"""Reduction computes: sum, prod, mean, max, min over a tuple of axes, with or without keepdims."""

from __future__ import annotations

from kiln import arith
from kiln.tir import loop as L
from kiln.tir import te
from kiln.topi.dims import dim_value
from kiln.topi.registry import register_compute

_REDUCERS = {"sum": te.sum, "prod": te.prod_reduce, "mean": te.sum, "max": te.max_reduce,
             "min": te.min_reduce}


def _reduce(op: str) -> None:
    @register_compute(op)
    def _compute(inputs, attrs, out_type):
        """ONNX ReduceSum / ReduceProd / ReduceMean / ReduceMax / ReduceMin over a tuple of axes.

        One reduction stage (tag ``reduce``); ``mean`` divides it by the reduced element count in
        x's dtype (an ``elemwise`` stage: integers truncate).

        Parameters
        ----------
        x : te.Tensor
            Any shape, numeric.
        axis : tuple of int
            attrs: the reduced axes (negative: from the end; empty: none).
        keepdims : bool
            attrs: keep each reduced axis as size 1.

        Returns
        -------
        te.Tensor
            x's shape without the reduced axes (size 1 with ``keepdims``), x's dtype.
        """
        (x,) = inputs
        axes = sorted(a % len(x.shape) for a in attrs["axis"])
        keep = attrs["keepdims"]
        raxes = {a: te.reduce_axis(x.shape[a], f"r{a}") for a in axes}

        def body(*o):
            src, k = [], 0
            for d in range(len(x.shape)):
                if d in raxes:
                    src.append(raxes[d].var)
                    k += 1 if keep else 0
                else:
                    src.append(o[k])
                    k += 1
            return _REDUCERS[op](x[tuple(src)], list(raxes.values()))

        red = te.compute(out_type.shape, body, name=op, tag="reduce")
        if op != "mean":
            return red
        count = dim_value(arith.prod(x.shape[a] for a in axes), x.dtype)
        return te.compute(out_type.shape, lambda *i: red[i] / count,
                          name="mean", tag="elemwise")


for _op in _REDUCERS:
    _reduce(_op)


def _arg(op: str) -> None:
    @register_compute(op)
    def _compute(inputs, attrs, out_type):
        """ONNX ArgMax / ArgMin along one axis: the first (``select_last_index``: last) extremum.

        Two reductions: the extremum ``m`` along the axis (stage ``{op}_value``, kept as size 1),
        then the least (greatest) index where the input equals ``m`` (a NaN never equals it: the
        index is then the axis length, or -1 with ``select_last_index``).

        Parameters
        ----------
        x : te.Tensor
            Any shape, numeric.
        axis : int
            attrs: the reduced axis (negative: from the end).
        keepdims, select_last_index : bool
            attrs: ONNX's ``keepdims`` and ``select_last_index``.

        Returns
        -------
        te.Tensor
            x's shape without ``axis`` (size 1 with ``keepdims``), int64 (``out_type``); tag
            ``reduce``.
        """
        (x,) = inputs
        axis = attrs["axis"] % len(x.shape)
        n = x.shape[axis]
        reducer = te.max_reduce if op == "argmax" else te.min_reduce
        r = te.reduce_axis(n, "r")
        kept = x.shape[:axis] + (1,) + x.shape[axis + 1:]
        ext = te.compute(kept, lambda *i: reducer(x[i[:axis] + (r.var,) + i[axis + 1:]], [r]),
                         name=f"{op}_value", tag="reduce")
        q = te.reduce_axis(n, "q")

        def index(*o):
            i = o if attrs["keepdims"] else o[:axis] + (L.IntImm(0),) + o[axis:]
            hit = L.eq(x[i[:axis] + (q.var,) + i[axis + 1:]], ext[i[:axis] + (0,) + i[axis + 1:]])
            if attrs["select_last_index"]:
                return te.max_reduce(L.Select(hit, q.var, L.IntImm(-1)), [q])
            return te.min_reduce(L.Select(hit, q.var, L.IntImm(n)), [q])

        return te.compute(out_type.shape, index, name=op, tag="reduce")


_arg("argmax")
_arg("argmin")


@register_compute("topk_indices")
def topk_indices(inputs, attrs, out_type):
    """The indices of ONNX TopK's sorted output along ``axis`` (the values are gathered apart).

    By rank: ``rank[p]`` counts the elements that sort before ``p`` (larger, or with
    ``largest`` false smaller; or equal with a smaller index: a stable order), stage
    ``topk_rank`` (tag ``reduce``); output ``j`` along the axis is the index whose rank is
    ``j``. O(n²) along the axis.

    Parameters
    ----------
    x : te.Tensor
        Any shape, numeric.
    axis : int
        attrs: the sorted axis.
    largest : bool
        attrs: descending (True) or ascending order.

    Returns
    -------
    te.Tensor
        x's shape with ``k`` along ``axis`` (``out_type.shape``, ``k <= x.shape[axis]``),
        ``out_type.dtype`` (int64); tag ``reduce``.
    """
    (x,) = inputs
    axis = attrs["axis"] % len(x.shape)
    n = x.shape[axis]
    before = (lambda a, b: a > b) if attrs["largest"] else (lambda a, b: a < b)
    r = te.reduce_axis(n, "r")

    def rank(*p):
        other = x[p[:axis] + (r.var,) + p[axis + 1:]]
        mine = x[p]
        first = L.Binary("or", before(other, mine),
                         L.logical_and(L.eq(other, mine), r.var < p[axis]))
        return te.sum(L.Select(first, L.IntImm(1), L.IntImm(0)), [r])

    ranks = te.compute(x.shape, rank, name="topk_rank", tag="reduce")
    q = te.reduce_axis(n, "q")

    def pick(*o):
        hit = L.eq(ranks[o[:axis] + (q.var,) + o[axis + 1:]], o[axis])
        return te.max_reduce(L.Select(hit, q.var, L.IntImm(-1)), [q])

    return te.compute(out_type.shape, pick, name="topk_indices", tag="reduce")
