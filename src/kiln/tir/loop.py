"""The loop IR: buffers, loops, loads and stores (the role of TVM's TIR).

Expressions (:class:`PrimExpr`) are scalar: variables, constants, arithmetic, comparisons,
``Select``, ``Cast``, intrinsic ``Call``s and ``BufferLoad``. Statements are ``For``,
``BufferStore``, ``Allocate``, ``SeqStmt``, ``IfThenElse``, ``AssertStmt``, ``LetStmt`` and
``Evaluate``. Buffer shapes and loop extents may be expressions over shape-symbol variables
(bound by MakePackedAPI's ``LetStmt``s).
A :class:`PrimFunc` binds parameter :class:`Buffer`s to a body.

Semantics (the executable definition is ``kiln.tir.interpreter``): buffers are row-major and
indexed with one index per dimension; ``//`` and ``%`` are floor division and floor modulo;
``/`` on floats is true division; index arithmetic is int64.

Intrinsic vocabulary (every codegen maps each name): exp, log, sqrt, tanh, erf, fabs, floor, ceil,
nearbyint (round half to even, as IEEE 754's default rounding and C's ``nearbyint``), pow, the
trigonometric and hyperbolic functions and their inverses, fmod (C's: the remainder with the
dividend's sign), ``reinterpret`` (the bits of a value as another type of the same width:
:func:`reinterpret`), the int8 kernels' ``dot_u8i8x4``, ``dot_u8i8x4_sat16``, ``load_u8x4``
and ``dot_i16x2`` (:mod:`kiln.tir.intrin_int8`), and the packed-API accessors emitted by
MakePackedAPI (``kiln.*``). ``sigmoid`` is ``1 / (1 + exp(-x))`` in the code generators;
FastExp (:mod:`kiln.tir.transform.fast_exp`) expands the float32 ones as onnxruntime computes
them. ``fence`` is a float value unchanged, but never contracted into an FMA or reassociated
with what uses it (LLVM's ``llvm.arithmetic.fence``; C: the value).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

INT = "int64"
FLOAT_DTYPES = ("float16", "float32", "float64")
INTRINSICS = ("exp", "log", "sqrt", "tanh", "sigmoid", "fence", "erf", "fabs", "floor", "ceil",
              "nearbyint", "pow", "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh",
              "asinh", "acosh", "atanh", "fmod")

_CMP_OPS = ("<", "<=", ">", ">=", "==", "!=")
_LOGIC_OPS = ("and", "or")


def is_float(dtype: str) -> bool:
    return dtype in FLOAT_DTYPES


class PrimExpr:
    """A scalar expression of a fixed ``dtype``. Arithmetic operators build new expressions."""

    __slots__ = ("dtype",)
    dtype: str

    def _bin(self, op: str, other: Any, reverse: bool = False) -> PrimExpr:
        if not isinstance(other, PrimExpr):
            other = _dim_or_const(other, self.dtype)
        return Binary(op, other, self) if reverse else Binary(op, self, other)

    def __add__(self, o):
        return self._bin("+", o)

    def __radd__(self, o):
        return self._bin("+", o, True)

    def __sub__(self, o):
        return self._bin("-", o)

    def __rsub__(self, o):
        return self._bin("-", o, True)

    def __mul__(self, o):
        return self._bin("*", o)

    def __rmul__(self, o):
        return self._bin("*", o, True)

    def __truediv__(self, o):
        return self._bin("/", o)

    def __rtruediv__(self, o):
        return self._bin("/", o, True)

    def __floordiv__(self, o):
        return self._bin("//", o)

    def __rfloordiv__(self, o):
        return self._bin("//", o, True)

    def __mod__(self, o):
        return self._bin("%", o)

    def __neg__(self):
        return Binary("-", const(0, self.dtype), self)

    def __lt__(self, o):
        return self._bin("<", o)

    def __le__(self, o):
        return self._bin("<=", o)

    def __gt__(self, o):
        return self._bin(">", o)

    def __ge__(self, o):
        return self._bin(">=", o)

    __hash__ = object.__hash__


class Var(PrimExpr):
    """A scalar variable (loop variable or index); identity is by object."""

    __slots__ = ("name",)

    def __init__(self, name: str, dtype: str = INT):
        self.name = name
        self.dtype = dtype

    def __repr__(self) -> str:
        return self.name


class IntImm(PrimExpr):
    __slots__ = ("value",)

    def __init__(self, value: int, dtype: str = INT):
        self.value = int(value)
        self.dtype = dtype

    def __repr__(self) -> str:
        return str(self.value)


class FloatImm(PrimExpr):
    __slots__ = ("value",)

    def __init__(self, value: float, dtype: str = "float32"):
        self.value = float(value)
        self.dtype = dtype

    def __repr__(self) -> str:
        return repr(self.value)


def _dim_or_const(value: Any, dtype: str) -> PrimExpr:
    """A Python number as a constant, or a symbolic dim (kiln.arith) as its expression."""
    from kiln.arith import SymExpr

    if isinstance(value, SymExpr):
        from kiln.tir.te import dim_expr

        return dim_expr(value)
    return const(value, dtype)


def const(value: Any, dtype: str) -> PrimExpr:
    """A constant of ``dtype`` (bools become 0/1 of an integer type)."""
    if is_float(dtype):
        return FloatImm(float(value), dtype)
    return IntImm(int(value), dtype)


class Binary(PrimExpr):
    """``a op b``: arithmetic (+ - * / // % min max), bitwise on integers (& | ^ << >>;
    ``>>`` is arithmetic on signed, logical on unsigned types), comparison (bool) or logic
    (and, or)."""

    __slots__ = ("a", "b", "op")

    def __init__(self, op: str, a: PrimExpr, b: PrimExpr):
        if isinstance(a, (int, float)):
            a = const(a, b.dtype)
        if isinstance(b, (int, float)):
            b = const(b, a.dtype)
        assert a.dtype == b.dtype or op in _LOGIC_OPS, f"{op}: dtype {a.dtype} vs {b.dtype}"
        self.op, self.a, self.b = op, a, b
        self.dtype = "bool" if op in _CMP_OPS or op in _LOGIC_OPS else a.dtype

    def __repr__(self) -> str:
        if self.op in ("min", "max"):
            return f"{self.op}({self.a}, {self.b})"
        return f"({self.a} {self.op} {self.b})"


def minimum(a: PrimExpr, b: Any) -> PrimExpr:
    return Binary("min", a, b)


def maximum(a: PrimExpr, b: Any) -> PrimExpr:
    return Binary("max", a, b)


def eq(a: PrimExpr, b: Any) -> PrimExpr:
    return Binary("==", a, b)


def ne(a: PrimExpr, b: Any) -> PrimExpr:
    return Binary("!=", a, b)


def logical_or(*conds: PrimExpr) -> PrimExpr:
    out = conds[0]
    for c in conds[1:]:
        out = Binary("or", out, c)
    return out


def logical_and(*conds: PrimExpr) -> PrimExpr:
    out = conds[0]
    for c in conds[1:]:
        out = Binary("and", out, c)
    return out


class Select(PrimExpr):
    """``cond ? true_value : false_value`` (both sides may be evaluated)."""

    __slots__ = ("cond", "false_value", "true_value")

    def __init__(self, cond: PrimExpr, true_value: Any, false_value: Any):
        if not isinstance(true_value, PrimExpr):
            true_value = const(true_value, false_value.dtype)
        if not isinstance(false_value, PrimExpr):
            false_value = const(false_value, true_value.dtype)
        assert true_value.dtype == false_value.dtype, "Select branches differ in dtype"
        self.cond, self.true_value, self.false_value = cond, true_value, false_value
        self.dtype = true_value.dtype

    def __repr__(self) -> str:
        return f"select({self.cond}, {self.true_value}, {self.false_value})"


class Cast(PrimExpr):
    __slots__ = ("value",)

    def __init__(self, dtype: str, value: PrimExpr):
        self.dtype = dtype
        self.value = value

    def __repr__(self) -> str:
        return f"{self.dtype}({self.value})"


class Call(PrimExpr):
    """An intrinsic call by name (see ``INTRINSICS`` and the ``kiln.*`` packed-API accessors)."""

    __slots__ = ("args", "name")

    def __init__(self, name: str, args: list[Any], dtype: str):
        self.name = name
        self.args = list(args)
        self.dtype = dtype

    def __repr__(self) -> str:
        return f"{self.name}({', '.join(map(repr, self.args))})"


def call(name: str, *args: PrimExpr) -> PrimExpr:
    """Intrinsic ``name`` applied to float ``args`` (result has the first argument's dtype)."""
    assert name in INTRINSICS, f"unknown intrinsic {name}"
    return Call(name, list(args), args[0].dtype)


def reinterpret(value: PrimExpr, dtype: str) -> PrimExpr:
    """The bits of ``value`` read as ``dtype`` (same width; C: a union, LLVM: bitcast)."""
    return Call("reinterpret", [value], dtype)


ADDRESS_OF, EXTERN = "address_of", "extern."  # :func:`address_of`, :func:`call_extern`


def address_of(load: BufferLoad) -> PrimExpr:
    """The address ``load`` reads (``tvm_address_of``; ``handle``: ``void*`` / ``ptr``)."""
    return Call(ADDRESS_OF, [load], "handle")


def call_extern(name: str, *args: PrimExpr) -> PrimExpr:
    """int32 ``name(args)`` of the support code, weak (absent: 1); 0 = done (Stage.try_first)."""
    return Call(EXTERN + name, list(args), "int32")


@dataclass(eq=False)
class Buffer:
    """A row-major buffer: ``shape`` (ints, or index expressions over shape symbols), ``dtype``;
    ``scope`` is "global" or "local" (local buffers have static shapes)."""

    name: str
    shape: tuple
    dtype: str
    scope: str = "global"

    @property
    def is_static(self) -> bool:
        return all(isinstance(d, int) for d in self.shape)

    @property
    def size(self) -> int:
        """Element count of a static buffer (see :meth:`size_expr` for symbolic ones)."""
        assert self.is_static, f"{self.name}: size of a symbolic buffer"
        return math.prod(self.shape)

    def size_expr(self) -> PrimExpr:
        """Element count as an index expression."""
        out: PrimExpr = IntImm(1)
        for d in self.shape:
            out = out * as_index(d)
        return out

    def __getitem__(self, indices: Any) -> BufferLoad:
        if not isinstance(indices, tuple):
            indices = (indices,)
        return BufferLoad(self, [as_index(i) for i in indices])

    def __repr__(self) -> str:
        return f"{self.name}{list(self.shape)}:{self.dtype}"


def as_index(value: Any) -> PrimExpr:
    return value if isinstance(value, PrimExpr) else _dim_or_const(value, INT)


class BufferLoad(PrimExpr):
    __slots__ = ("buffer", "indices")

    def __init__(self, buffer: Buffer, indices: list[PrimExpr]):
        assert len(indices) == len(buffer.shape), f"{buffer.name}: {len(indices)} indices"
        self.buffer = buffer
        self.indices = indices
        self.dtype = buffer.dtype

    def with_indices(self, indices: list[PrimExpr]) -> BufferLoad:
        return BufferLoad(self.buffer, indices)

    def __repr__(self) -> str:
        return f"{self.buffer.name}[{', '.join(map(repr, self.indices))}]"


# ----------------------------------------------------------------------------- statements


class Stmt:
    pass


LOOP_KINDS = ("serial", "parallel", "vectorized", "unrolled")


@dataclass(eq=False)
class For(Stmt):
    var: Var
    min: PrimExpr
    extent: PrimExpr
    kind: str
    body: Stmt

    def __post_init__(self) -> None:
        assert self.kind in LOOP_KINDS, f"bad loop kind {self.kind}"


@dataclass(eq=False)
class BufferStore(Stmt):
    buffer: Buffer
    value: PrimExpr
    indices: list[PrimExpr]


@dataclass(eq=False)
class Allocate(Stmt):
    """Allocate ``buffer`` for the duration of ``body``."""

    buffer: Buffer
    body: Stmt


@dataclass(eq=False)
class SeqStmt(Stmt):
    stmts: list[Stmt]


@dataclass(eq=False)
class IfThenElse(Stmt):
    cond: PrimExpr
    then_case: Stmt
    else_case: Stmt | None = None


@dataclass(eq=False)
class AssertStmt(Stmt):
    """If ``cond`` is false: set the error ``message`` (format args ``args``) and return -1."""

    cond: PrimExpr
    message: str
    args: list[PrimExpr]
    body: Stmt


@dataclass(eq=False)
class LetStmt(Stmt):
    """Bind ``var`` to ``value`` (evaluated once) for ``body``: MakePackedAPI binds each shape
    symbol from the first tensor dimension that has it."""

    var: Var
    value: PrimExpr
    body: Stmt


@dataclass(eq=False)
class Evaluate(Stmt):
    value: PrimExpr


def seq(*stmts: Stmt | None) -> Stmt:
    flat: list[Stmt] = []
    for s in stmts:
        if s is None:
            continue
        if isinstance(s, SeqStmt):
            flat.extend(s.stmts)
        else:
            flat.append(s)
    return flat[0] if len(flat) == 1 else SeqStmt(flat)


@dataclass(eq=False)
class PrimFunc:
    """A kernel: ``params`` buffers (inputs then outputs) and a ``body``.

    ``attrs["packed"]`` is set by MakePackedAPI, after which the body reads its arguments through
    ``kiln.*`` accessor calls and ``attrs["arg_names"]`` names them for error messages.
    """

    name: str
    params: list[Buffer]
    body: Stmt
    attrs: dict[str, Any] = field(default_factory=dict)


# ----------------------------------------------------------------------------- traversal


def expr_children(e: PrimExpr) -> Iterable[PrimExpr]:
    if isinstance(e, Binary):
        return (e.a, e.b)
    if isinstance(e, Select):
        return (e.cond, e.true_value, e.false_value)
    if isinstance(e, Cast):
        return (e.value,)
    if isinstance(e, Call):
        return tuple(a for a in e.args if isinstance(a, PrimExpr))
    if hasattr(e, "with_indices"):
        return tuple(e.indices)
    return ()


def walk_exprs(e: PrimExpr | Iterable[PrimExpr]) -> Iterator[PrimExpr]:
    """Every node of expression ``e`` (or of each of several), parents before children."""
    stack = [e] if isinstance(e, PrimExpr) else list(e)
    while stack:
        x = stack.pop()
        yield x
        stack.extend(expr_children(x))


def uses_var(e: PrimExpr, v: Var | frozenset[Var]) -> bool:
    """Whether ``e`` reads ``v`` (a variable, or any of a set of them)."""
    vs = v if isinstance(v, frozenset) else frozenset((v,))
    return any(isinstance(x, Var) and x in vs for x in walk_exprs(e))


def map_expr(e: PrimExpr, fn) -> PrimExpr:
    """Rebuild ``e`` bottom-up: ``fn(node_with_new_children)`` may return a replacement."""
    if isinstance(e, Binary):
        a, b = map_expr(e.a, fn), map_expr(e.b, fn)
        e = e if (a is e.a and b is e.b) else Binary(e.op, a, b)
    elif isinstance(e, Select):
        c, t, f = map_expr(e.cond, fn), map_expr(e.true_value, fn), map_expr(e.false_value, fn)
        if not (c is e.cond and t is e.true_value and f is e.false_value):
            e = Select(c, t, f)
    elif isinstance(e, Cast):
        v = map_expr(e.value, fn)
        e = e if v is e.value else Cast(e.dtype, v)
    elif isinstance(e, Call):
        args = [map_expr(a, fn) if isinstance(a, PrimExpr) else a for a in e.args]
        if any(x is not y for x, y in zip(args, e.args)):
            e = Call(e.name, args, e.dtype)
    elif hasattr(e, "with_indices"):  # BufferLoad, and te.TensorLoad before lowering
        idx = [map_expr(i, fn) for i in e.indices]
        if any(x is not y for x, y in zip(idx, e.indices)):
            e = e.with_indices(idx)
    return fn(e)


def substitute(e: PrimExpr, vmap: dict[Var, PrimExpr]) -> PrimExpr:
    """Replace variables in ``e`` by ``vmap`` (keys are Var objects)."""
    if not vmap:
        return e
    return map_expr(e, lambda x: vmap.get(x, x) if isinstance(x, Var) else x)


def map_stmt(s: Stmt, fexpr, fstmt=None) -> Stmt:
    """Rebuild statement ``s``: ``fexpr`` maps every expression; ``fstmt`` post-visits
    statements."""

    def rec(s: Stmt) -> Stmt:
        if isinstance(s, For):
            out: Stmt = For(s.var, fexpr(s.min), fexpr(s.extent), s.kind, rec(s.body))
        elif isinstance(s, BufferStore):
            out = BufferStore(s.buffer, fexpr(s.value), [fexpr(i) for i in s.indices])
        elif isinstance(s, Allocate):
            out = Allocate(s.buffer, rec(s.body))
        elif isinstance(s, SeqStmt):
            out = SeqStmt([rec(x) for x in s.stmts])
        elif isinstance(s, IfThenElse):
            out = IfThenElse(fexpr(s.cond), rec(s.then_case),
                             rec(s.else_case) if s.else_case else None)
        elif isinstance(s, AssertStmt):
            out = AssertStmt(fexpr(s.cond), s.message, [fexpr(a) for a in s.args], rec(s.body))
        elif isinstance(s, LetStmt):
            out = LetStmt(s.var, fexpr(s.value), rec(s.body))
        elif isinstance(s, Evaluate):
            out = Evaluate(fexpr(s.value))
        else:
            raise TypeError(f"unknown statement {type(s).__name__}")
        return fstmt(out) if fstmt else out

    return rec(s)


def substitute_stmt(s: Stmt, vmap: dict[Var, PrimExpr]) -> Stmt:
    return map_stmt(s, lambda e: substitute(e, vmap))


def stmt_exprs(s: Stmt) -> list[PrimExpr]:
    """The expressions a statement holds itself (not those of its sub-statements), including
    the symbolic extents of the buffer it allocates or stores to."""
    if isinstance(s, For):
        return [s.min, s.extent]
    if isinstance(s, BufferStore):
        return [s.value, *s.indices, *_shape_exprs(s.buffer)]
    if isinstance(s, Allocate):
        return _shape_exprs(s.buffer)
    if isinstance(s, IfThenElse):
        return [s.cond]
    if isinstance(s, AssertStmt):
        return [s.cond, *s.args]
    if isinstance(s, LetStmt):
        return [s.value]
    if isinstance(s, Evaluate):
        return [s.value]
    return []


def expr_vars(e: PrimExpr) -> list[Var]:
    """The variables ``e`` reads, first use first."""
    found: dict[Var, None] = {}
    stack = [e]
    while stack:
        x = stack.pop()
        if isinstance(x, Var):
            found.setdefault(x)
        stack.extend(reversed(expr_children(x)))
    return list(found)


def free_vars(func: PrimFunc) -> list[Var]:
    """Variables ``func`` uses but no loop or ``LetStmt`` of it defines (the shape symbols of
    its buffers and extents), first use first."""
    found: dict[Var, None] = {}
    defined: set[int] = set()
    exprs = [d for buf in func.params for d in _shape_exprs(buf)]
    for s in walk_stmts(func.body):
        if isinstance(s, (For, LetStmt)):
            defined.add(id(s.var))
        exprs += stmt_exprs(s)
    for e in exprs:
        for v in expr_vars(e):
            found.setdefault(v)
    return [v for v in found if id(v) not in defined]


def _shape_exprs(buf: Buffer) -> list[PrimExpr]:
    return [d for d in buf.shape if isinstance(d, PrimExpr)]


def walk_stmts(s: Stmt) -> Iterable[Stmt]:
    """Pre-order walk over statements."""
    stack = [s]
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, (For, Allocate, AssertStmt, LetStmt)):
            stack.append(node.body)
        elif isinstance(node, SeqStmt):
            stack.extend(reversed(node.stmts))
        elif isinstance(node, IfThenElse):
            if node.else_case:
                stack.append(node.else_case)
            stack.append(node.then_case)
