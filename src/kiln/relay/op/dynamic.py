"""Ops whose output shape depends on data (``dyn.*``, decision 016), run by the VM as builtins.

NonZero, Unique, NonMaxSuppression, Compress, TopK with a data ``k``, Range over data bounds,
and Reshape / Expand / ConstantOfShape / Tile / Slice whose shape argument is data. Each is a
runtime op (``OpDef.runtime``): never fused, never a kernel; the VM runs its numpy definition
(:mod:`kiln.runtime.dynamic_ops`, also the op's reference here) and binds the dims it could
not know at compile time.

Those dims are *late symbols*: fresh :class:`~kiln.arith.SymVar`\\ s named after the ONNX
node (``nonzero_count_<node>``), with ``lo`` 0 (an empty result is valid) and ``hi`` a static
upper bound when one is known (NonZero: the input's element count). The converter makes them
and passes the whole output shape as the attr ``shape``: a tuple whose entries are ints or
symbol specs ``(name, lo, hi)``, so that re-inferring a call (every pass rebuilds calls)
yields the same symbols. Ops with several ONNX outputs (Unique, TopK) are one call per output
(attr ``output``); the VM runs the builtin once for siblings over the same arguments.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from kiln.arith import Dim, SymVar
from kiln.errors import ShapeError
from kiln.relay.graph import Call, Expr, LoopCall, TensorType
from kiln.relay.op_registry import OpPattern, register_op
from kiln.runtime import dynamic_ops as D

#: a late symbol as an attr value: (name, lo, hi or None)
SymSpec = tuple


def late_dim(entry: int | SymSpec) -> Dim:
    """An entry of the ``shape`` attr as a dim: an int, or the late symbol it names."""
    if isinstance(entry, tuple):
        name, lo, hi = entry
        return SymVar(name, lo, hi)
    return int(entry)


def late_shape(attrs: dict) -> tuple[Dim, ...]:
    """The output shape a ``dyn.*`` call's ``shape`` attr describes."""
    return tuple(late_dim(e) for e in attrs["shape"])


def late_symbols(attrs: dict) -> list[SymVar]:
    """The late symbols of a ``dyn.*`` call (those its builtin's result binds)."""
    return [d for d in late_shape(attrs) if isinstance(d, SymVar)]


def bound_by(node: Expr) -> list[SymVar]:
    """The late symbols ``node`` binds where it runs: a ``dyn.*`` call's output dims, a run-time
    loop's iteration count (its scan outputs' length); none for other nodes."""
    if isinstance(node, Call) and node.op.name.startswith("dyn."):
        return late_symbols(node.attrs)
    if isinstance(node, LoopCall) and node.count is not None:
        return [node.count]
    return []


def _arity(op: str, types: list[TensorType], lo: int, hi: int) -> None:
    if not lo <= len(types) <= hi:
        raise ShapeError(f"{op} takes {lo}..{hi} arguments, got {len(types)}")


def _int_vector(op: str, t: TensorType, what: str) -> None:
    if t.ndim != 1 or np.dtype(t.dtype).kind not in "iu":
        raise ShapeError(f"{op}: {what} must be a 1-D integer tensor, got {t}")


def _infer(op: str, lo: int, hi: int, dtype: Callable[[list[TensorType], dict], str],
           check: Callable[[list[TensorType], dict], None] | None = None):
    def infer(types: list[TensorType], attrs: dict) -> TensorType:
        _arity(op, types, lo, hi)
        if check is not None:
            check(types, attrs)
        shape = late_shape(attrs)
        return TensorType(shape, dtype(types, attrs))

    return infer


def _same(types: list[TensorType], attrs: dict) -> str:
    return types[0].dtype


def _int64(types: list[TensorType], attrs: dict) -> str:
    return "int64"


def _check_rank(op: str, rank: Callable[[list[TensorType], dict], int]):
    def check(types: list[TensorType], attrs: dict) -> None:
        want = rank(types, attrs)
        if len(attrs["shape"]) != want:
            raise ShapeError(f"{op}: output shape {attrs['shape']} is not of rank {want}")

    return check


def _shape_arg(index: int, op: str):
    """The output rank is the static length of the shape argument ``index``."""

    def check(types: list[TensorType], attrs: dict) -> None:
        _int_vector(op, types[index], "the shape")
        (n,) = types[index].shape
        if not isinstance(n, int):
            raise ShapeError(f"{op}: the shape argument has a symbolic length {n}")
        if len(attrs["shape"]) != max(n, types[0].ndim if op == "dyn.expand" else 0):
            raise ShapeError(f"{op}: output shape {attrs['shape']} does not fit a shape "
                             f"argument of {n} entries")

    return check


def _unique_dtype(types: list[TensorType], attrs: dict) -> str:
    return types[0].dtype if attrs["output"] == 0 else "int64"


def _register(name: str, infer, ref) -> None:
    register_op(name, infer, OpPattern.OPAQUE, ref, runtime=True)


_register("dyn.nonzero",
          _infer("dyn.nonzero", 1, 1, _int64, _check_rank("dyn.nonzero", lambda t, a: 2)),
          lambda x, shape: D.nonzero(x))
_register("dyn.unique", _infer("dyn.unique", 1, 1, _unique_dtype),
          lambda x, shape, output, axis, sort: D.unique(x, axis, sort)[output])
_register("dyn.non_max_suppression",
          _infer("dyn.non_max_suppression", 5, 5, _int64,
                 _check_rank("dyn.non_max_suppression", lambda t, a: 2)),
          lambda *args, shape, center_point_box: D.non_max_suppression(
              *args, center_point_box=center_point_box))
_register("dyn.compress", _infer("dyn.compress", 2, 2, _same),
          lambda x, cond, shape, axis: D.compress(x, cond, axis))
_register("dyn.topk",
          _infer("dyn.topk", 2, 2,
                 lambda t, a: t[0].dtype if a["output"] == 0 else "int64",
                 _check_rank("dyn.topk", lambda t, a: t[0].ndim)),
          lambda x, k, shape, output, axis, largest: D.topk(x, k, axis, largest)[output])
_register("dyn.range",
          _infer("dyn.range", 3, 3, _same, _check_rank("dyn.range", lambda t, a: 1)),
          lambda start, limit, delta, shape: D.range_(start, limit, delta))
_register("dyn.reshape", _infer("dyn.reshape", 2, 2, _same, _shape_arg(1, "dyn.reshape")),
          lambda x, s, shape, allowzero: D.reshape(x, s, allowzero))
_register("dyn.expand", _infer("dyn.expand", 2, 2, _same, _shape_arg(1, "dyn.expand")),
          lambda x, s, shape: D.expand(x, s))
_register("dyn.constant_of_shape",
          _infer("dyn.constant_of_shape", 1, 1, lambda t, a: a["dtype"],
                 _shape_arg(0, "dyn.constant_of_shape")),
          lambda s, shape, value, dtype: D.constant_of_shape(s, np.array(value, dtype)))
_register("dyn.tile",
          _infer("dyn.tile", 2, 2, _same, _check_rank("dyn.tile", lambda t, a: t[0].ndim)),
          lambda x, r, shape: D.tile(x, r))
_register("dyn.slice",
          _infer("dyn.slice", 5, 5, _same, _check_rank("dyn.slice", lambda t, a: t[0].ndim)),
          lambda x, starts, ends, axes, steps, shape: D.slice_(x, starts, ends, axes, steps))
