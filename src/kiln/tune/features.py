"""Features of a candidate's loop nest: what the cost model sees of a schedule.

:func:`extract` turns a lowered kernel (:class:`kiln.tir.loop.PrimFunc`, after the schedule,
before codegen) into a fixed-length float vector (``float64``, length ``len(FEATURE_NAMES)``).
Every :class:`~kiln.tir.loop.BufferStore` is one *statement*: the loops around it, what it
computes per iteration and which bytes it touches give one row of ``STORE_FEATURES``; the
vector is the iteration-weighted mean of those rows, their maximum, then a few whole-kernel
numbers (``GLOBAL_FEATURES``). Counts and sizes enter as ``log2(1 + x)`` so that the model sees
ratios. A symbolic extent counts as ``SYMBOLIC_EXTENT_GUESS`` (as the CPU schedule's work
estimate does).

The idea is Ansor's per-store features (``src/auto_scheduler/feature.cc``, Python side
``python/tvm/auto_scheduler/feature.py``): loop extents and annotations, arithmetic counts,
bytes touched per buffer at each loop level, reuse and arithmetic intensity. This set is ours
and smaller (Kiln's loop IR has no threads, no ``Block`` after lowering and no cache stages).

:func:`knob_features` is the other view of a candidate: its knob values as numbers, for tasks
whose lowering is not at hand (and for tests with a synthetic cost).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from kiln.errors import KilnError
from kiln.schedules.space import Config, Task
from kiln.tir import loop as L

#: what a symbolic extent (a batch, a sequence length) counts as
SYMBOLIC_EXTENT_GUESS = 64

#: one row per buffer store (log2(1 + x) unless marked as a flag or a fraction)
STORE_FEATURES = (
    "iterations",             # product of the extents of the enclosing loops
    "depth",                  # number of enclosing loops (plain count)
    "inner_extent",           # extent of the innermost enclosing loop
    "inner_is_vectorized",    # flag
    "inner_is_unrolled",      # flag
    "inner_is_parallel",      # flag
    "vector_width",           # product of the enclosing vectorized extents
    "unroll_product",         # product of the enclosing unrolled extents
    "parallel_extent",        # product of the enclosing parallel extents
    "float_ops",              # float arithmetic per iteration
    "int_ops",                # integer arithmetic per iteration (values and indices)
    "math_calls",             # intrinsic calls (exp, tanh...) per iteration
    "loads",                  # buffer loads per iteration
    "contiguous_fraction",    # accesses with stride 1 along the innermost loop (fraction)
    "invariant_fraction",     # accesses that do not move with the innermost loop (fraction)
    "bytes_touched",          # distinct bytes over the whole nest, summed over buffers
    "max_buffer_bytes",       # the largest of those per-buffer footprints
    "bytes_inner_1",          # distinct bytes touched by the innermost loop
    "bytes_inner_2",          # ... by the two innermost loops
    "bytes_inner_3",          # ... by the three innermost loops
    "reuse",                  # accesses / distinct elements over the nest
    "arith_intensity",        # float ops over the nest / bytes touched
    "store_is_local",         # flag: the store writes a local (accumulator) buffer
    "local_bytes",            # bytes of the local buffers allocated around the store
)
GLOBAL_FEATURES = ("stores", "total_iterations", "total_float_ops", "local_alloc_bytes",
                   "param_bytes", "parallel_loops")
FEATURE_NAMES = (tuple(f"mean.{n}" for n in STORE_FEATURES)
                 + tuple(f"max.{n}" for n in STORE_FEATURES) + GLOBAL_FEATURES)

_ARITH = ("+", "-", "*", "/", "//", "%", "min", "max")


def extract(func: L.PrimFunc) -> np.ndarray:
    """The feature vector of ``func``.

    Parameters
    ----------
    func : kiln.tir.loop.PrimFunc
        A scheduled kernel (loops annotated serial/parallel/vectorized/unrolled).

    Returns
    -------
    numpy.ndarray
        ``float64``, shape ``(len(FEATURE_NAMES),)``, finite; the same for the same IR.

    Raises
    ------
    KilnError
        When ``func`` is not a PrimFunc.
    """
    if not isinstance(func, L.PrimFunc):
        raise KilnError(f"features.extract takes a kiln.tir.loop.PrimFunc, not "
                        f"{type(func).__name__}")
    rows: list[np.ndarray] = []
    weights: list[float] = []
    walker = _Walker()
    walker.visit(func.body, [], [])
    for store in walker.stores:
        rows.append(_store_row(store))
        weights.append(store.iterations)
    n = len(STORE_FEATURES)
    if rows:
        table = np.stack(rows)
        w = np.asarray(weights, np.float64)
        mean = (table * w[:, None]).sum(0) / w.sum()
        top = table.max(0)
    else:
        mean = top = np.zeros(n)
    glob = np.array([
        _log(len(walker.stores)),
        _log(sum(weights)),
        _log(sum(s.iterations * s.ops.float_ops for s in walker.stores)),
        _log(walker.local_bytes),
        _log(sum(_buffer_bytes(b) for b in func.params)),
        float(walker.parallel_loops),
    ])
    out = np.concatenate([mean, top, glob])
    assert out.shape == (len(FEATURE_NAMES),) and np.isfinite(out).all(), "bad feature vector"
    return out


def knob_features(task: Task, config: Config) -> np.ndarray:
    """A candidate as numbers: per knob of ``task.space``, ``log2(1 + value)`` for an integer
    value, the index of the value among the knob's legal values for a string; ``float64``,
    shape ``(len(task.space),)``. Raises :class:`KilnError` for a value the knob does not
    allow or a missing knob."""
    out = []
    for knob in task.space:
        if knob.name not in config:
            raise KilnError(f"task {task.name}: config has no value for knob {knob.name!r}")
        value = config[knob.name]
        if value not in knob.values:
            raise KilnError(f"task {task.name}: {value!r} is not a legal value of knob "
                            f"{knob.name!r} {knob.values}")
        out.append(_log(value) if isinstance(value, int) else float(knob.values.index(value)))
    return np.asarray(out, np.float64)


def lowered_features(lower: Callable[[Task, Config], L.PrimFunc]
                     ) -> Callable[[Task, Config], np.ndarray]:
    """``(task, config) -> extract(lower(task, config))``: the featurizer of the search when
    candidates can be lowered in this process (``lower`` e.g. ``measure.lower_candidate``)."""

    def featurize(task: Task, config: Config) -> np.ndarray:
        return extract(lower(task, config))

    return featurize


# ----------------------------------------------------------------------------- the walk


@dataclass
class _Ops:
    float_ops: int = 0
    int_ops: int = 0
    math_calls: int = 0
    loads: list[L.BufferLoad] = field(default_factory=list)


@dataclass
class _Store:
    loops: list[L.For]
    store: L.BufferStore
    local_bytes: int
    ops: _Ops
    iterations: float


class _Walker:
    """Collects every store with its enclosing loops and local allocations."""

    def __init__(self) -> None:
        self.stores: list[_Store] = []
        self.local_bytes = 0
        self.parallel_loops = 0

    def visit(self, s: L.Stmt, loops: list[L.For], allocs: list[L.Buffer]) -> None:
        if isinstance(s, L.For):
            self.parallel_loops += s.kind == "parallel"
            self.visit(s.body, [*loops, s], allocs)
        elif isinstance(s, L.Allocate):
            if s.buffer.scope == "local":
                self.local_bytes += _buffer_bytes(s.buffer)
            self.visit(s.body, loops, [*allocs, s.buffer])
        elif isinstance(s, L.SeqStmt):
            for x in s.stmts:
                self.visit(x, loops, allocs)
        elif isinstance(s, L.IfThenElse):
            self.visit(s.then_case, loops, allocs)
            if s.else_case is not None:
                self.visit(s.else_case, loops, allocs)
        elif isinstance(s, (L.LetStmt, L.AssertStmt)):
            self.visit(s.body, loops, allocs)
        elif isinstance(s, L.BufferStore):
            local = sum(_buffer_bytes(b) for b in allocs if b.scope == "local")
            iterations = math.prod(_extent(f) for f in loops)
            self.stores.append(_Store(loops, s, local, _count_ops(s), float(iterations)))


def _count_ops(store: L.BufferStore) -> _Ops:
    ops = _Ops()
    for e in L.walk_exprs([store.value, *store.indices]):
        if isinstance(e, L.Binary) and e.op in _ARITH:
            if L.is_float(e.dtype):
                ops.float_ops += 1
            else:
                ops.int_ops += 1
        elif isinstance(e, L.Select) and L.is_float(e.dtype):
            ops.float_ops += 1
        elif isinstance(e, L.Call):
            ops.math_calls += 1
        elif isinstance(e, L.BufferLoad):
            ops.loads.append(e)
    return ops


def _store_row(s: _Store) -> np.ndarray:
    loops = s.loops
    inner = loops[-1] if loops else None
    accesses = [(s.store.buffer, s.store.indices)] + [(ld.buffer, ld.indices)
                                                     for ld in s.ops.loads]
    strides = [_inner_stride(buf, idx, inner) for buf, idx in accesses]
    footprints = _footprints(accesses, loops)
    whole = footprints[0]
    total_bytes = sum(whole.values())
    buffers = {b.name: b for b, _ in accesses}
    elements = sum(whole[name] / _dtype_bytes(b.dtype) for name, b in buffers.items())
    flops = s.iterations * s.ops.float_ops
    row = [
        _log(s.iterations),
        float(len(loops)),
        _log(_extent(inner) if inner else 1),
        float(inner is not None and inner.kind == "vectorized"),
        float(inner is not None and inner.kind == "unrolled"),
        float(inner is not None and inner.kind == "parallel"),
        _log(_kind_product(loops, "vectorized")),
        _log(_kind_product(loops, "unrolled")),
        _log(_kind_product(loops, "parallel")),
        _log(s.ops.float_ops),
        _log(s.ops.int_ops),
        _log(s.ops.math_calls),
        _log(len(s.ops.loads)),
        sum(st == 1 for st in strides) / len(strides),
        sum(st == 0 for st in strides) / len(strides),
        _log(total_bytes),
        _log(max(whole.values(), default=0)),
        _log(sum(footprints[1].values())),
        _log(sum(footprints[2].values())),
        _log(sum(footprints[3].values())),
        _log(s.iterations * len(accesses) / max(elements, 1.0)),
        _log(flops / max(total_bytes, 1.0)),
        float(s.store.buffer.scope == "local"),
        _log(s.local_bytes),
    ]
    return np.asarray(row, np.float64)


def _kind_product(loops: list[L.For], kind: str) -> int:
    """The product of the extents of the loops of ``kind`` (1 when none)."""
    return math.prod(_extent(f) for f in loops if f.kind == kind)


def _footprints(accesses, loops: list[L.For]) -> list[dict[str, float]]:
    """Distinct bytes per buffer touched by all of ``loops`` (entry 0) and by the innermost
    1, 2, 3 of them: the product of the extents of the loops an access's indices use, at most
    the buffer's size (Ansor's "touched bytes" estimate)."""
    out = []
    for levels in (len(loops), 1, 2, 3):
        scope = loops[len(loops) - min(levels, len(loops)):]
        per: dict[str, float] = {}
        for buf, indices in accesses:
            used = {id(v) for i in indices for v in L.expr_vars(i)}
            n = math.prod(_extent(f) for f in scope if id(f.var) in used)
            size = _buffer_elems(buf)
            per[buf.name] = max(per.get(buf.name, 0.0),
                                float(min(n, size)) * _dtype_bytes(buf.dtype))
        out.append(per)
    return out


def _inner_stride(buf: L.Buffer, indices: list[L.PrimExpr], inner: L.For | None) -> int | None:
    """Elements the row-major flat index moves per step of the innermost loop: 0 when the
    access does not use it, None when not affine in it."""
    if inner is None:
        return 0
    total = 0
    stride = 1
    for dim, index in zip(reversed(buf.shape), reversed(indices)):
        c = _coefficient(index, inner.var)
        if c is None:
            return None
        total += c * stride
        stride *= dim if isinstance(dim, int) else SYMBOLIC_EXTENT_GUESS
    return total


def _coefficient(e: L.PrimExpr, var: L.Var) -> int | None:
    """The constant ``c`` with ``e = c * var + (terms free of var)``, or None."""
    if e is var:
        return 1
    if isinstance(e, L.Binary) and e.op in ("+", "-"):
        a, b = _coefficient(e.a, var), _coefficient(e.b, var)
        if a is None or b is None:
            return None
        return a + b if e.op == "+" else a - b
    if isinstance(e, L.Binary) and e.op == "*":
        if isinstance(e.a, L.IntImm):
            c = _coefficient(e.b, var)
            return None if c is None else c * e.a.value
        if isinstance(e.b, L.IntImm):
            c = _coefficient(e.a, var)
            return None if c is None else c * e.b.value
    if isinstance(e, L.Cast):
        return _coefficient(e.value, var)
    if not any(v is var for v in L.expr_vars(e)):
        return 0
    return None


def _extent(loop: L.For) -> int:
    return loop.extent.value if isinstance(loop.extent, L.IntImm) else SYMBOLIC_EXTENT_GUESS


def _dtype_bytes(dtype: str) -> int:
    if dtype == "bool":
        return 1
    digits = "".join(ch for ch in dtype if ch.isdigit())
    return max(int(digits) // 8, 1) if digits else 4


def _buffer_elems(buf: L.Buffer) -> int:
    return math.prod(d if isinstance(d, int) else SYMBOLIC_EXTENT_GUESS for d in buf.shape)


def _buffer_bytes(buf: L.Buffer) -> int:
    return _buffer_elems(buf) * _dtype_bytes(buf.dtype)


def _log(x: float) -> float:
    return math.log2(1.0 + max(float(x), 0.0))
