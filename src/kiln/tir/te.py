"""Tensor expressions: the compute-definition language of ``kiln.topi`` (TVM's ``te``).

A :class:`Tensor` is produced by a placeholder or by :func:`compute`, whose body is a scalar loop-IR
expression over the tensor's axis variables; ``T[i, j]`` inside a body reads another tensor.
Reductions are written with :func:`reduce_axis` and :func:`sum` / :func:`prod_reduce` /
:func:`max_reduce` /
:func:`min_reduce` at the top of a body; :func:`block_sum` nests one sum in another (a partial sum
per block of the reduction, scaled once per block). ``kiln.tir.lower`` turns a schedule over these
stages into
a :class:`~kiln.tir.loop.PrimFunc`.
"""

from __future__ import annotations

import contextvars
import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kiln import arith
from kiln.arith import Dim
from kiln.tir import loop as L

_names = itertools.count()

#: Which version of a kernel is being defined and scheduled (``kiln.schedules.cpu.
#: small_extents``): 0 the main one; 1 the one for symbolic extents smaller than its blocks
#: (one row: a compute may then choose its one-row form, the quantized dense ops:
#: docs/decisions/053); 2 the one for extents smaller than the blocks version 1 keeps (a
#: matmul-like einsum's columns: docs/decisions/057)
SMALL_EXTENTS = contextvars.ContextVar("kiln_small_extents", default=0)
#: the last version a kernel may have for small extents: it blocks no symbolic axis
SMALLEST_VERSION = 2


def extents_version() -> int:
    """The kernel version being defined: 0 the main one, 1 for small extents, 2 for extents
    smaller than the blocks of version 1 (see SMALL_EXTENTS; ``kiln.backend.te_compiler``:
    ``if extent < least: <a version for small extents> else: ...``)."""
    return SMALL_EXTENTS.get()


@dataclass(eq=False)
class IterVar:
    """An axis of a compute: a loop variable with an extent (an int, or a symbolic dim of
    :mod:`kiln.arith`); ``kind`` is "spatial" or "reduce"."""

    var: L.Var
    extent: Dim
    kind: str = "spatial"

    @property
    def name(self) -> str:
        return self.var.name


def reduce_axis(extent: Dim, name: str = "r") -> IterVar:
    return IterVar(L.Var(name), as_dim(extent), "reduce")


def as_dim(value) -> Dim:
    """An int, or a symbolic dim kept as it is (numpy integers become ints)."""
    return value if isinstance(value, arith.SymExpr) else int(value)


_SYMBOL_VARS: dict[str, L.Var] = {}


def symbol_var(sym: arith.SymVar) -> L.Var:
    """The loop-IR variable of shape symbol ``sym`` (one per name: MakePackedAPI binds it from
    the shape of the first tensor that has it)."""
    var = _SYMBOL_VARS.get(sym.name)
    if var is None:
        var = _SYMBOL_VARS[sym.name] = L.Var(sym.name)
    return var


def dim_expr(d: Dim) -> L.PrimExpr:
    """A dim as a loop-IR index expression over the symbols' variables."""
    if isinstance(d, int):
        return L.IntImm(d)
    if isinstance(d, arith.SymVar):
        return symbol_var(d)
    if isinstance(d, arith.SymOp):
        a, b = (dim_expr(x) for x in d.args)
        op = {"floordiv": "//", "floormod": "%", "min": "min", "max": "max"}[d.op]
        return L.Binary(op, a, b)
    out: L.PrimExpr | None = None
    for mono, coeff in d.terms:
        term: L.PrimExpr = dim_expr(mono[0])
        for atom in mono[1:]:
            term = term * dim_expr(atom)
        if coeff != 1:
            term = term * coeff
        out = term if out is None else out + term
    assert out is not None, "a Poly has at least one term"
    return out + d.const if d.const else out


def buffer_shape(shape) -> tuple:
    """A tensor's shape for a loop-IR Buffer: ints stay ints, symbolic dims become
    expressions (:func:`dim_expr`)."""
    return tuple(d if isinstance(d, int) else dim_expr(d) for d in shape)


class TensorLoad(L.PrimExpr):
    """``tensor[indices]`` inside a compute body (before lowering maps it to a buffer)."""

    __slots__ = ("indices", "tensor")

    def __init__(self, tensor: Tensor, indices: list[L.PrimExpr]):
        assert len(indices) == len(tensor.shape), f"{tensor.name}: {len(indices)} indices"
        self.tensor = tensor
        self.indices = indices
        self.dtype = tensor.dtype

    def with_indices(self, indices: list[L.PrimExpr]) -> TensorLoad:
        return TensorLoad(self.tensor, indices)

    def __repr__(self) -> str:
        return f"{self.tensor.name}[{', '.join(map(repr, self.indices))}]"


@dataclass(eq=False)
class BlockStep:
    """The per-block step of a :func:`block_sum`: the reduction adds ``expr`` once per value of
    its outer axes, with ``var`` standing for the partial sum over ``inner`` of the source."""

    inner: list[IterVar]
    var: L.Var
    expr: L.PrimExpr


@dataclass(eq=False)
class Reduce:
    """A reduction at the top of a compute body: ``combiner`` in {"sum", "prod", "max", "min"};
    ``block`` makes a sum nested (:func:`block_sum`)."""

    combiner: str
    source: L.PrimExpr
    axes: list[IterVar]
    init: L.PrimExpr
    block: BlockStep | None = None

    @property
    def dtype(self) -> str:
        return self.source.dtype


class Tensor:
    """A tensor of a ``shape`` (ints and symbolic dims) and ``dtype``; ``body`` is None for
    placeholders."""

    def __init__(self, shape: tuple[Dim, ...], dtype: str, name: str,
                 axes: list[IterVar] | None = None, body: Any = None, tag: str = ""):
        self.shape = tuple(as_dim(s) for s in shape)
        self.dtype = dtype
        self.name = name
        self.axes = axes or []
        self.body = body  # PrimExpr or Reduce; None for a placeholder
        self.tag = tag

    @property
    def is_placeholder(self) -> bool:
        return self.body is None

    @property
    def is_reduction(self) -> bool:
        return isinstance(self.body, Reduce)

    def __getitem__(self, indices: Any) -> TensorLoad:
        if not isinstance(indices, tuple):
            indices = (indices,)
        return TensorLoad(self, [L.as_index(i) for i in indices])

    def inputs(self) -> list[Tensor]:
        """Tensors this compute reads, in first-use order."""
        found: dict[int, Tensor] = {}

        def visit(e: L.PrimExpr) -> L.PrimExpr:
            if isinstance(e, TensorLoad):
                found.setdefault(id(e.tensor), e.tensor)
            return e

        if isinstance(self.body, Reduce):
            L.map_expr(self.body.source, visit)
            L.map_expr(self.body.init, visit)
            if self.body.block is not None:
                L.map_expr(self.body.block.expr, visit)
        elif self.body is not None:
            L.map_expr(self.body, visit)
        return list(found.values())

    def __repr__(self) -> str:
        return f"Tensor({self.name}, {self.shape}, {self.dtype})"


def placeholder(shape: tuple[int, ...], dtype: str, name: str) -> Tensor:
    return Tensor(shape, dtype, name)


def compute(shape: tuple[int, ...], fcompute: Callable[..., Any], name: str = "T",
            tag: str = "") -> Tensor:
    """Define a tensor elementwise: ``fcompute(*axis_vars)`` returns a PrimExpr or a Reduce."""
    axes = [IterVar(L.Var(f"ax{i}"), as_dim(n)) for i, n in enumerate(shape)]
    body = fcompute(*[a.var for a in axes])
    if not isinstance(body, (L.PrimExpr, Reduce)):
        raise TypeError(f"compute {name}: body must be an expression, got {type(body).__name__}")
    return Tensor(shape, body.dtype, f"{name}_{next(_names)}", axes, body, tag)


def _reduce(combiner: str, source: L.PrimExpr, axis, init: float) -> Reduce:
    axes = list(axis) if isinstance(axis, (list, tuple)) else [axis]
    return Reduce(combiner, source, axes, L.const(init, source.dtype))


def sum(source: L.PrimExpr, axis) -> Reduce:
    return _reduce("sum", source, axis, 0)


def block_sum(source: L.PrimExpr, outer: list[IterVar], inner: list[IterVar],
              step: Callable[[L.PrimExpr], L.PrimExpr]) -> Reduce:
    """``Σ_outer step(Σ_inner source)``: a sum over blocks of a reduction, each block's partial
    sum over the ``inner`` axes passed through ``step`` (a scale and an offset per block: the
    Q4_1 dense's ``d · Σ x·q + m · Σ x``) before it is added.

    The lowering (:mod:`kiln.tir.lower`) keeps the partial sums in a second accumulator: the
    ``inner`` axes' loops must all run inside the ``outer`` ones, with no spatial loop between
    the first reduce loop and the last outer one. ``axes`` of the result lists ``outer`` then
    ``inner``.
    """
    var = L.Var("block_sum", source.dtype)
    expr = step(var)
    return Reduce("sum", source, list(outer) + list(inner), L.const(0, source.dtype),
                  BlockStep(list(inner), var, expr))


def prod_reduce(source: L.PrimExpr, axis) -> Reduce:
    return _reduce("prod", source, axis, 1)


def max_reduce(source: L.PrimExpr, axis) -> Reduce:
    return _reduce("max", source, axis, lowest(source.dtype))


def min_reduce(source: L.PrimExpr, axis) -> Reduce:
    return _reduce("min", source, axis, highest(source.dtype))


def lowest(dtype: str) -> float:
    import numpy as np

    if dtype == "bool":
        return 0
    return -float("inf") if L.is_float(dtype) else int(np.iinfo(dtype).min)


def highest(dtype: str) -> float:
    import numpy as np

    if dtype == "bool":
        return 1
    return float("inf") if L.is_float(dtype) else int(np.iinfo(dtype).max)
