"""Symbolic shape arithmetic: shape variables, canonical expressions, bounds (TVM's
``arith.Analyzer`` role, include/tvm/arith/analyzer.h).

A dimension is a Python ``int`` or a :class:`SymExpr`. Expressions are kept in one canonical
form: a polynomial with integer coefficients over *atoms*, where an atom is a shape variable
(:class:`SymVar`) or an operation the polynomial cannot absorb (floor division, floor modulo,
min, max: :class:`SymOp`). Every operation simplifies at once, so two equal expressions are
equal Python objects (``==``, hashing) and an expression that folds to a constant is returned as
a plain ``int``: code over static shapes never sees a :class:`SymExpr`.

Simplification uses each variable's bounds (``lo``/``hi``) and divisor: ``(4*n + 3) // 4 == n``,
``max(n, 1) == n`` for ``n >= 1``, ``(8*k) % 4 == 0``. Nothing here calls ``int()`` on a symbolic
value: :meth:`SymExpr.__int__` raises :class:`~kiln.errors.ShapeError` naming the expression, which
is how a converter that needs a static value reports it.

May import: kiln.errors only.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Union

import numpy as np

from kiln.arith import intervals
from kiln.arith.intervals import Bound
from kiln.errors import ShapeError

Dim = Union[int, "SymExpr"]


class SymExpr:
    """Base of symbolic dimensions; arithmetic operators build simplified expressions (and
    return NotImplemented for other operands, e.g. loop-IR expressions, which then convert the
    dim themselves)."""

    __slots__ = ()

    def __add__(self, o):
        return add(self, o) if _is_dim(o) else NotImplemented

    __radd__ = __add__

    def __sub__(self, o):
        return sub(self, o) if _is_dim(o) else NotImplemented

    def __rsub__(self, o):
        return sub(o, self) if _is_dim(o) else NotImplemented

    def __mul__(self, o):
        return mul(self, o) if _is_dim(o) else NotImplemented

    __rmul__ = __mul__

    def __floordiv__(self, o):
        return floordiv(self, o) if _is_dim(o) else NotImplemented

    def __rfloordiv__(self, o):
        return floordiv(o, self) if _is_dim(o) else NotImplemented

    def __mod__(self, o):
        return floormod(self, o) if _is_dim(o) else NotImplemented

    def __rmod__(self, o):
        return floormod(o, self) if _is_dim(o) else NotImplemented

    def __neg__(self) -> Dim:
        return mul(self, -1)

    def __int__(self) -> int:
        raise SymbolicValueError(f"dimension {self} is symbolic; a static value is needed here")

    __index__ = __int__

    def __bool__(self) -> bool:
        raise ShapeError(f"the truth of symbolic dimension {self} is unknown at compile time")


@dataclass(frozen=True, eq=True, repr=False)
class SymVar(SymExpr):
    """A shape variable: ``name`` (ONNX ``dim_param``), inclusive bounds ``lo``..``hi`` (``hi``
    None: unbounded) and a ``divisor`` every value is a multiple of."""

    name: str
    lo: int = 1
    hi: int | None = None
    divisor: int = 1

    def __post_init__(self) -> None:
        if self.hi is not None and self.hi < self.lo:
            raise ShapeError(f"symbol {self.name}: empty bounds {self.lo}..{self.hi}")
        if self.divisor < 1:
            raise ShapeError(f"symbol {self.name}: divisor {self.divisor} must be positive")

    def __repr__(self) -> str:
        return self.name

    __str__ = __repr__


@dataclass(frozen=True, eq=True, repr=False)
class SymOp(SymExpr):
    """An atom the polynomial form cannot absorb: ``op`` in floordiv, floormod, min, max."""

    op: str
    args: tuple

    def __repr__(self) -> str:
        a, b = (f"({x})" if isinstance(x, Poly) else str(x) for x in self.args)
        if self.op == "floordiv":
            return f"({a} // {b})"
        if self.op == "floormod":
            return f"({a} % {b})"
        return f"{self.op}({a}, {b})"

    __str__ = __repr__

Atom = SymVar | SymOp
Monomial = tuple  # sorted tuple of atoms (a repeated atom is a power)


def _atom_key(a: Atom) -> str:
    return repr(a)


@dataclass(frozen=True, eq=True, repr=False)
class Poly(SymExpr):
    """``const + sum(coeff * prod(monomial))``; ``terms`` sorted, no zero coefficient, at least
    one term (else it would be an int)."""

    terms: tuple  # ((monomial, coeff), ...)
    const: int = 0

    def __repr__(self) -> str:
        parts = []
        for mono, c in self.terms:
            body = "*".join(repr(a) for a in mono)
            parts.append(body if c == 1 else f"-{body}" if c == -1 else f"{c}*{body}")
        if self.const:
            parts.append(str(self.const))
        out = " + ".join(parts).replace("+ -", "- ")
        return out

    __str__ = __repr__


# --------------------------------------------------------------------------- canonical form


def _as_poly(x: Dim) -> tuple[dict[Monomial, int], int]:
    if isinstance(x, int):
        return {}, int(x)
    if isinstance(x, Poly):
        return dict(x.terms), x.const
    if isinstance(x, (SymVar, SymOp)):
        return {(x,): 1}, 0
    if isinstance(x, np.integer):
        return {}, int(x)
    raise TypeError(f"not a dimension: {x!r}")


def _make(terms: dict[Monomial, int], const: int) -> Dim:
    terms = {m: c for m, c in terms.items() if c}
    if not terms:
        return int(const)
    if len(terms) == 1 and const == 0:
        ((mono, c),) = terms.items()
        if c == 1 and len(mono) == 1:
            return mono[0]
    ordered = tuple(sorted(terms.items(), key=lambda mc: tuple(_atom_key(a) for a in mc[0])))
    return Poly(ordered, int(const))


def _is_dim(x) -> bool:
    return isinstance(x, (int, SymExpr, np.integer))


def provably_equal(a: Dim, b: Dim) -> bool:
    """Whether ``a == b`` for every value of the symbols: the same canonical form, or the same
    once each variable ``v`` with a divisor ``d > 1`` is written ``d * (v // d)`` (``4 * b *
    (h // 4)`` is ``b * h`` for ``h`` a multiple of 4: a reshape to ``[-1, 4]`` infers the
    first, the input's size is the second)."""
    if a == b:
        return True
    split = {v.name: mul(v.divisor, SymOp("floordiv", (v, v.divisor)))
             for v in free_symbols(a) + free_symbols(b) if v.divisor > 1}
    return bool(split) and substitute(a, split) == substitute(b, split)


def is_static(x: Dim) -> bool:
    """Whether ``x`` is a plain integer."""
    return not isinstance(x, SymExpr)


def add(a: Dim, b: Dim) -> Dim:
    ta, ca = _as_poly(a)
    tb, cb = _as_poly(b)
    for m, c in tb.items():
        ta[m] = ta.get(m, 0) + c
    return _make(ta, ca + cb)


def sub(a: Dim, b: Dim) -> Dim:
    return add(a, mul(b, -1))


def mul(a: Dim, b: Dim) -> Dim:
    ta, ca = _as_poly(a)
    tb, cb = _as_poly(b)
    out: dict[Monomial, int] = {}
    for m, c in ta.items():
        out[m] = out.get(m, 0) + c * cb
    for m, c in tb.items():
        out[m] = out.get(m, 0) + c * ca
    for ma, xa in ta.items():
        for mb, xb in tb.items():
            m = tuple(sorted(ma + mb, key=_atom_key))
            out[m] = out.get(m, 0) + xa * xb
    return _make(out, ca * cb)


def prod(dims) -> Dim:
    """The product of ``dims`` (1 for none)."""
    out: Dim = 1
    for d in dims:
        out = mul(out, d)
    return out


def _split_multiple(a: Dim, c: int) -> tuple[Dim, Dim]:
    """``a == c * q + r`` with ``q`` gathering every term whose coefficient ``c`` divides, and
    ``r`` the rest with its constant in ``[0, c)``."""
    terms, const = _as_poly(a)
    q_terms = {m: k // c for m, k in terms.items() if k % c == 0}
    r_terms = {m: k for m, k in terms.items() if k % c}
    return _make(q_terms, const // c), _make(r_terms, const % c)


def _known_multiple(a: Dim, c: int) -> bool:
    """Whether every value of ``a`` is a multiple of ``c``, counting the variables' divisors
    (``--dim width=32..2048:32`` makes ``width % 8 == 0``)."""
    terms, const = _as_poly(a)
    return const % c == 0 and all(
        k * math.prod(v.divisor for v in m if isinstance(v, SymVar)) % c == 0
        for m, k in terms.items())


def _by_divisors(a: Dim, c: int) -> Dim:
    """``a`` with each variable ``v`` of its polynomial whose divisor ``d`` shares a factor with
    ``c`` written ``d * (v // d)``, so that division by ``c`` sees the multiple: ``(H + 1) // 2
    == 16 * (H // 32)`` for ``H`` a multiple of 32, the same expression as ``2 * (H // 32) * 8``
    (a stride-2 conv chain and an upsampling agree)."""
    terms, const = _as_poly(a)
    if not any(isinstance(v, SymVar) and math.gcd(v.divisor, c) > 1 for m in terms for v in m):
        return a
    out: Dim = const
    for mono, k in terms.items():
        out = add(out, mul(k, prod(
            mul(v.divisor, SymOp("floordiv", (v, v.divisor)))
            if isinstance(v, SymVar) and math.gcd(v.divisor, c) > 1 else v for v in mono)))
    return out


def floordiv(a: Dim, b: Dim) -> Dim:
    """Floor division (``//``); a zero divisor raises ShapeError."""
    if isinstance(a, int) and isinstance(b, int):
        if b == 0:
            raise ShapeError("division of a dimension by zero")
        return a // b
    if isinstance(b, int) and b > 1:
        a = _by_divisors(a, b)
    if isinstance(b, int):
        if b == 0:
            raise ShapeError(f"division of {a} by zero")
        if b == 1:
            return a
        terms, _ = _as_poly(a)
        if b > 0 and all(k < 0 for k in terms.values()):
            # one form for a ceil division: -((-x) // b) (a ceil_mode pool) is (x + b - 1) // b
            # (a position table's half), by floor(a / b) == -floor((b - 1 - a) / b)
            return mul(-1, floordiv(add(mul(a, -1), b - 1), b))
        if b > 0:
            q, r = _split_multiple(a, b)
            lo, hi = bounds(r)
            if lo is not None and hi is not None and 0 <= lo and hi < b:
                return q
            if r != a:  # floor((b*q + r) / b) == q + floor(r / b) for integers
                return add(q, floordiv(r, b))
        return _op("floordiv", (a, b))
    if a == b:
        return 1
    ratio = exact_ratio(a, b)
    if ratio is not None:
        return ratio
    small = _small_numerator(a, b)
    if small is not None:
        return 0 if small >= 0 else -1
    return _op("floordiv", (a, b))


def _small_numerator(a: Dim, b: Dim) -> int | None:
    """``a`` when it is a constant smaller in magnitude than every value of the positive
    symbolic ``b`` (``|a| <= lo(b)``, and ``a < lo(b)`` when non-negative): then ``a // b`` is
    0 or -1 and ``a % b`` is ``a`` or ``b + a`` (``-1 % (w + 4)`` is ``w + 3``: an exporter's
    ``roll`` by -1); else None."""
    if not isinstance(a, int) or isinstance(b, int):
        return None
    lo = bounds(b)[0]
    if lo is None or lo < 1 or not -lo <= a < lo:
        return None
    return a


def exact_ratio(a: Dim, b: Dim) -> Dim | None:
    """``a / b`` when the polynomials say it is exact: an integer multiple, or ``b`` a single
    term dividing every term of ``a`` (``(n*seq) // seq == n``)."""
    ta, ca = _as_poly(a)
    tb, cb = _as_poly(b)
    if len(tb) == 1 and cb == 0 and ca == 0:
        ((mb, kb),) = tb.items()
        out: dict[Monomial, int] = {}
        for m, k in ta.items():
            rest = list(m)
            for atom in mb:
                if atom not in rest:
                    return None
                rest.remove(atom)
            if k % kb:
                return None
            out[tuple(rest)] = k // kb
        return _make({m: k for m, k in out.items() if m}, out.get((), 0))
    if set(ta) != set(tb) or not tb:
        return None
    m0 = next(iter(tb))
    if ta[m0] % tb[m0]:
        return None
    k = ta[m0] // tb[m0]
    if all(ta[m] == k * tb[m] for m in tb) and ca == k * cb:
        return k
    return None


def floormod(a: Dim, b: Dim) -> Dim:
    """Floor modulo (``%``); a zero divisor raises ShapeError."""
    if isinstance(a, int) and isinstance(b, int):
        if b == 0:
            raise ShapeError("modulo of a dimension by zero")
        return a % b
    if isinstance(b, int) and b > 0:
        if _known_multiple(a, b):
            return 0
        _, r = _split_multiple(_by_divisors(a, b), b)
        lo, hi = bounds(r)
        if lo is not None and hi is not None and 0 <= lo and hi < b:
            return r
    if a == b or exact_ratio(a, b) is not None:
        return 0
    small = _small_numerator(a, b)
    if small is not None:
        return small if small >= 0 else add(b, small)
    return _op("floormod", (a, b))


def _op(op: str, args: tuple[Dim, Dim]) -> Dim:
    """The atom ``op(*args)``, or its value when the bounds pin it to one (``(n // 256 + 1) //
    2`` is 1 for ``n`` in 256..512)."""
    atom = SymOp(op, args)
    lo, hi = bounds(atom)
    return lo if lo is not None and lo == hi else atom


def minimum(a: Dim, b: Dim) -> Dim:
    """``min(a, b)``, folded when the bounds decide it."""
    if isinstance(a, int) and isinstance(b, int):
        return min(a, b)
    lo, hi = bounds(sub(a, b))
    if hi is not None and hi <= 0:
        return a
    if lo is not None and lo >= 0:
        return b
    return _op("min", tuple(sorted((a, b), key=repr)))


def maximum(a: Dim, b: Dim) -> Dim:
    """``max(a, b)``, folded when the bounds decide it."""
    if isinstance(a, int) and isinstance(b, int):
        return max(a, b)
    lo, hi = bounds(sub(a, b))
    if lo is not None and lo >= 0:
        return a
    if hi is not None and hi <= 0:
        return b
    return _op("max", tuple(sorted((a, b), key=repr)))


# --------------------------------------------------------------------------- analysis


class SymbolicValueError(ShapeError):
    """A symbolic dim used where a static number is needed (``int(n)``, a float conversion of
    a shape value): a graph computation on it exists at run time only."""


class UndecidedError(ShapeError):
    """A comparison of symbolic dims that their bounds do not decide (``n == 1`` for ``n`` in
    1..512): its value exists at run time only."""


COMPARISONS = ("equal", "not_equal", "less", "less_equal", "greater", "greater_equal")
#: how each comparison reads the bounds (lo, hi) of ``a - b``: (true when, false when)
_COMPARE = {
    "equal": (lambda lo, hi: lo == hi == 0, lambda lo, hi: lo > 0 or hi < 0),
    "not_equal": (lambda lo, hi: lo > 0 or hi < 0, lambda lo, hi: lo == hi == 0),
    "less": (lambda lo, hi: hi < 0, lambda lo, hi: lo >= 0),
    "less_equal": (lambda lo, hi: hi <= 0, lambda lo, hi: lo > 0),
    "greater": (lambda lo, hi: lo > 0, lambda lo, hi: hi <= 0),
    "greater_equal": (lambda lo, hi: lo >= 0, lambda lo, hi: hi < 0),
}


def compare(op: str, a: Dim, b: Dim) -> bool:
    """``a <op> b`` for ``op`` one of equal, not_equal, less, less_equal, greater,
    greater_equal, decided by the bounds of ``a - b``.

    Raises
    ------
    UndecidedError
        When the bounds allow both answers.
    """
    lo, hi = bounds(sub(a, b))
    lo = -(1 << 62) if lo is None else lo
    hi = 1 << 62 if hi is None else hi
    yes, no = _COMPARE[op]
    if yes(lo, hi):
        return True
    if no(lo, hi):
        return False
    raise UndecidedError(f"{a} {op} {b} is not decided by the symbols' bounds")



#: The implicit upper bound of a symbol without one: no tensor dimension reaches 2**40 (its
#: storage could not exist), so ``min(sequence_length, 2**62)`` — ONNX's "to the end" Slice —
#: folds to ``sequence_length``.
DIM_LIMIT = 1 << 40


def bounds(x: Dim) -> Bound:
    """Inclusive (lo, hi) of ``x`` over its variables' bounds (None: unbounded)."""
    if isinstance(x, int):
        return x, x
    if isinstance(x, SymVar):
        return x.lo, DIM_LIMIT if x.hi is None else x.hi
    if isinstance(x, SymOp):
        return _op_bounds(x)
    terms, const = _as_poly(x)
    found = _sum_bounds(terms, const)
    if any(_static_quotient(m) for m in terms):
        found = intervals.both(found, intervals.rounded(_sum_bounds(*_without_quotients(x))))
    return found


def _sum_bounds(terms: Mapping, const) -> Bound:
    """Bounds of ``const + sum(c * mono)``, each term bounded alone."""
    found: Bound = (const, const)
    for mono, c in terms.items():
        found = intervals.plus(found, intervals.scale(_mono_bounds(mono), c))
    return found


def _static_quotient(mono: Monomial) -> bool:
    """Whether ``mono`` is one ``p // c`` with a static positive ``c``."""
    return (len(mono) == 1 and isinstance(mono[0], SymOp) and mono[0].op == "floordiv"
            and isinstance(mono[0].args[1], int) and mono[0].args[1] > 0)


def _without_quotients(x: Dim) -> tuple[dict[Monomial, Fraction], Fraction]:
    """``x``'s terms with each ``k * (p // c)`` written ``k * (p - r) / c``, the remainder
    ``r`` a variable in ``[0, c)``: the symbols of ``p`` may then cancel against the rest.
    Bounded alone, ``2 * ((s + 1) // 2) - s`` is unbounded; written so it is ``1 - r``, 0 or 1
    (Funnel's upsampled sequence is at least as long as the one it was pooled from)."""
    terms, const = _as_poly(x)
    out: dict[Monomial, Fraction] = {}
    base = Fraction(const)
    for mono, k in terms.items():
        parts = [(mono, Fraction(k))]
        if _static_quotient(mono):
            p, c = mono[0].args
            p_terms, p_const = _as_poly(p)
            base += Fraction(k * p_const, c)
            parts = [(m, Fraction(k * kp, c)) for m, kp in p_terms.items()]
            parts.append(((SymVar(f"{p} % {c}", 0, c - 1),), Fraction(-k, c)))
        for m, kk in parts:
            out[m] = out.get(m, 0) + kk
    return {m: k for m, k in out.items() if k}, base


def _mono_bounds(mono: Monomial) -> Bound:
    found: Bound = (1, 1)
    for atom in mono:
        found = intervals.times(found, bounds(atom))
        if found == (None, None):
            break
    return found


def _op_bounds(x: SymOp) -> Bound:
    a, b = bounds(x.args[0]), bounds(x.args[1])
    if x.op == "min":
        return intervals.smaller(a, b)
    if x.op == "max":
        return intervals.larger(a, b)
    if x.op == "floordiv" and b[0] is not None and b[0] > 0:
        return intervals.quotient(a, b)
    if x.op == "floormod" and b[0] is not None and b[0] > 0:
        return 0, None if b[1] is None else b[1] - 1
    return None, None


def free_symbols(x: Dim) -> list[SymVar]:
    """The variables of ``x``, sorted by name."""
    found: dict[str, SymVar] = {}

    def visit(e: Dim) -> None:
        if isinstance(e, SymVar):
            found[e.name] = e
        elif isinstance(e, SymOp):
            for a in e.args:
                visit(a)
        elif isinstance(e, Poly):
            for mono, _ in e.terms:
                for a in mono:
                    visit(a)

    visit(x)
    return [found[k] for k in sorted(found)]


def evaluate(x: Dim, env: Mapping[str, int]) -> int:
    """The value of ``x`` with variables bound by name in ``env``.

    Raises
    ------
    ShapeError
        For an unbound variable or a division by zero.
    """
    if isinstance(x, int):
        return x
    if isinstance(x, SymVar):
        if x.name not in env:
            raise ShapeError(f"symbol {x.name} is not bound")
        return int(env[x.name])
    if isinstance(x, SymOp):
        a, b = (evaluate(v, env) for v in x.args)
        if x.op in ("floordiv", "floormod") and b == 0:
            raise ShapeError(f"{x}: division by zero")
        return {"floordiv": a // b if b else 0, "floormod": a % b if b else 0,
                "min": min(a, b), "max": max(a, b)}[x.op]
    terms, const = _as_poly(x)
    total = const
    for mono, c in terms.items():
        total += c * math.prod(evaluate(a, env) for a in mono)
    return total


def substitute(x: Dim, mapping: Mapping[str, Dim]) -> Dim:
    """``x`` with variables replaced by name (simplified again)."""
    if isinstance(x, int):
        return x
    if isinstance(x, SymVar):
        return mapping.get(x.name, x)
    if isinstance(x, SymOp):
        a, b = (substitute(v, mapping) for v in x.args)
        return {"floordiv": floordiv, "floormod": floormod, "min": minimum,
                "max": maximum}[x.op](a, b)
    terms, const = _as_poly(x)
    out: Dim = const
    for mono, c in terms.items():
        out = add(out, mul(c, prod(substitute(a, mapping) for a in mono)))
    return out


def shape_str(shape) -> str:
    """``(1, sequence_length, 384)`` style text of a shape."""
    return "(" + ", ".join(str(d) for d in shape) + ("," if len(shape) == 1 else "") + ")"
