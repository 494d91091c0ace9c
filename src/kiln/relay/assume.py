"""Assume, then check at run time: the declaration on input symbols that a shape relation needs.

A type relation that cannot decide a relation between symbolic dims at compile time — two
dims a broadcast needs equal, ``min(512, sequence_length)`` against ``sequence_length`` —
does not have to refuse the model: onnxruntime runs it at every shape where the relation
holds. :func:`assume_equal` finds the weakest declaration on the model's input symbols under
which the two dims are the same expression: two symbols are one (``input_dim0 ==
state_dim1``), a symbol has an upper or lower bound (``sequence_length <= 512``, from the
constants of a ``min``/``max`` the dims hold; ``samples >= 20``, the least one that works),
is a multiple of a power of two (``h % 32 == 0``), or has one value. The type relation
raises :class:`AssumptionNeeded` carrying it; the importer
(``kiln.frontend.onnx.importer.from_onnx``) declares it and imports again, so the symbol's
bounds (or the shared symbol) are in every type, and the VM checks them at run time
as it checks declared ones (``match_shape``: bounds, divisors, one value per symbol), naming
the input, the dim, the symbol and the relation. Decision record
``docs/decisions/044-assume-then-check.md``.

May import: kiln.arith (and kiln.errors).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from kiln.arith import (
    Dim,
    Poly,
    SymOp,
    SymVar,
    evaluate,
    free_symbols,
    provably_equal,
    substitute,
)
from kiln.errors import ShapeError

#: divisors tried for a symbol, smallest (weakest) first: strides and poolings halve dims, so
#: the multiples a CNN needs are powers of two
DIVISORS = (2, 4, 8, 16, 32, 64)


@dataclass(frozen=True)
class Assumption:
    """A declaration on an input symbol: bounds ``lo..hi`` and ``divisor`` (the symbol's new
    bounds, intersected with its old ones), or ``equal``: the other symbol it is one with.

    ``where`` says which op needs it and why (the shapes), for the compile log."""

    symbol: str
    lo: int = 1
    hi: int | None = None
    divisor: int = 1
    equal: str | None = None
    where: str = ""

    def relation(self) -> str:
        """The relation as text: ``sequence_length <= 512``, ``n == m``, ``h % 32 == 0``,
        ``1 <= s <= 512``, ``s == 3``."""
        if self.equal is not None:
            return f"{self.equal} == {self.symbol}"
        parts = []
        if self.hi is not None and self.hi == self.lo:
            parts.append(f"{self.symbol} == {self.lo}")
        elif self.hi is not None:
            parts.append(f"{self.symbol} <= {self.hi}" if self.lo <= max(1, self.divisor) else
                         f"{self.lo} <= {self.symbol} <= {self.hi}")
        elif self.lo > max(1, self.divisor):  # (a multiple of d is at least d)
            parts.append(f"{self.symbol} >= {self.lo}")
        if self.divisor > 1:
            parts.append(f"{self.symbol} % {self.divisor} == 0")
        return " and ".join(parts) or f"{self.symbol} >= 1"

    def located(self, where: str) -> Assumption:
        """The same assumption with ``where`` (the op, node and shapes) filled in."""
        return Assumption(self.symbol, self.lo, self.hi, self.divisor, self.equal,
                          where if not self.where else f"{where}: {self.where}")


class AssumptionNeeded(ShapeError):
    """A relation the symbols' bounds do not decide, and the declarations under which it
    holds: :attr:`options`, one per symbol it could constrain, equally weak (the importer
    picks by where the symbols are in the inputs); :attr:`assumption` is the first.

    Raised by type relations; caught by the importer, which declares one and imports again.
    Anywhere else it is the ShapeError it always was."""

    def __init__(self, message: str, options: list[Assumption]):
        super().__init__(message)
        assert options, "an AssumptionNeeded needs an assumption"
        self.options = list(options)
        self.assumption = self.options[0]


def raise_if_assumable(message: str, a: Dim, b: Dim, why: str) -> None:
    """Raise :class:`AssumptionNeeded` (``message``) when declarations on one symbol make
    ``a == b``; their ``where`` is ``why`` followed by the relation."""
    options = assume_options(a, b)
    if options:
        raise AssumptionNeeded(message, [o.located(f"{why} {o.relation()}") for o in options])


def needed_assumptions(err: BaseException) -> list[Assumption]:
    """The assumptions an error carries: the :class:`AssumptionNeeded` itself or the one it
    was raised from (the wrappers that name the op and node re-raise ``from None``, which
    keeps the original as ``__context__``); their ``where`` is the outermost message with the
    original's text replaced by the assumption's reason. Empty when none."""
    seen: BaseException | None = err
    while seen is not None and isinstance(seen, ShapeError):
        if isinstance(seen, AssumptionNeeded):
            inner = str(seen)
            return [Assumption(a.symbol, a.lo, a.hi, a.divisor, a.equal,
                               str(err).replace(inner, a.where) if inner in str(err)
                               else a.where) for a in seen.options]
        seen = seen.__cause__ or seen.__context__
    return []


def assume_equal(a: Dim, b: Dim) -> Assumption | None:
    """The first of :func:`assume_options`, or None."""
    options = assume_options(a, b)
    return options[0] if options else None


def assume_options(a: Dim, b: Dim) -> list[Assumption]:
    """The weakest declarations on one symbol under which ``a`` and ``b`` are one expression,
    one per symbol that has one as weak as the weakest (empty when no single declaration
    makes them so).

    By kind, weakest first: one symbol of ``a`` and one of ``b`` are the same; an upper bound
    taken from the constants of the ``min``/``max`` atoms (``min(512, s)`` is ``s`` for ``s <=
    512``); the least lower bound (:func:`_least_lower_bound`), then one from those constants;
    a power-of-two divisor, smallest first (``2 * ((h + 1) // 4)``
    is ``(h + 1) // 2`` for ``h % 4 == 0``); a value (``s`` against ``3``: ``s == 3``); the
    one interval of values where they agree (:func:`_interval`)."""
    if a == b:
        return []
    unified = [Assumption(t.name, equal=s.name) for s in free_symbols(a)
               for t in free_symbols(b) if s.name != t.name and _same(a, b, {t.name: s})]
    if unified:
        return unified
    best: list[tuple[tuple, Assumption]] = []
    for v in {v.name: v for v in free_symbols(a) + free_symbols(b)}.values():
        for key, cand in _candidates(v, a, b):
            if best and key > best[0][0]:
                break  # (weaker than what another symbol needs: not an option)
            if _same(a, b, {v.name: cand}):
                lo, hi = (cand, cand) if isinstance(cand, int) else (cand.lo, cand.hi)
                divisor = 1 if isinstance(cand, int) else cand.divisor
                if best and key < best[0][0]:
                    best = []
                best.append((key, Assumption(v.name, lo, hi, divisor)))
                break
    return [made for _, made in best]


def _same(a: Dim, b: Dim, mapping: dict[str, Dim]) -> bool:
    """Whether ``a`` and ``b`` are one dim under ``mapping`` (``2 * (h // 2)`` is ``h`` for
    ``h`` a multiple of 2: :func:`kiln.arith.provably_equal`)."""
    try:
        return provably_equal(substitute(a, mapping), substitute(b, mapping))
    except ShapeError:  # (a division by zero at the candidate value)
        return False


def _candidates(v: SymVar, a: Dim, b: Dim) -> Iterator[tuple[tuple, Dim]]:
    """Tighter declarations of ``v`` with their weakness keys, weakest first: upper bounds,
    lower bounds (the least one that works first), divisors, values, an interval (only those
    leaving its bounds non-empty). A generator: the interval, which evaluates thousands of
    values, is scanned only when the caller gets that far."""
    hi = v.hi
    consts = sorted(_minmax_constants(a) | _minmax_constants(b))
    for k in reversed(consts):  # the largest upper bound first
        if k >= v.lo and (hi is None or k < hi):
            yield (0,), _bounded(v, v.lo, k, v.divisor)
    least = _least_lower_bound(v, a, b)
    if least is not None:
        yield (1,), _bounded(v, least, hi, v.divisor)
    for k in consts:
        if k > v.lo and (hi is None or k <= hi):
            yield (1,), _bounded(v, k, hi, v.divisor)
    for d in DIVISORS:
        if d % v.divisor == 0 and d > v.divisor:
            lo = -(-v.lo // d) * d
            if hi is None or lo <= hi:
                yield (2, d), _bounded(v, lo, hi, d)
    for k in (a, b):
        if isinstance(k, int) and v.lo <= k and (hi is None or k <= hi) and k % v.divisor == 0:
            yield (3,), k
    interval = _interval(v, a, b)
    if interval is not None:
        yield (4,), _bounded(v, *interval, v.divisor)


#: how far :func:`_interval` looks for the values of a symbol where two dims agree
SCAN_LIMIT = 1 << 13


def _interval(v: SymVar, a: Dim, b: Dim) -> tuple[int, int | None] | None:
    """The one run of values of ``v`` (its multiples of its divisor from ``v.lo`` to
    :data:`SCAN_LIMIT`) where ``a`` and ``b`` evaluate equal and positive, the other symbols
    at two sample values; None when there is no run or more than one. A run reaching the
    limit is a lower bound. The recognizer's reshape of ``[N, H // 16 // 3 * W', C]`` to
    ``[N, 1, W', C]`` holds for the heights whose feature map is one row: one interval, found
    by evaluation since no constant of the expression names it (the caller checks it
    symbolically)."""
    others = [s for s in free_symbols(a) + free_symbols(b) if s.name != v.name]
    envs = [{s.name: _sample(s, k) for s in others} for k in (61, 128)]
    top = SCAN_LIMIT if v.hi is None else min(v.hi, SCAN_LIMIT)
    runs: list[list[int]] = []
    for x in range(-(-v.lo // v.divisor) * v.divisor, top + 1, v.divisor):
        try:  # (two empty sizes agree, but no kernel runs them: not a solution)
            holds = all(_agree(evaluate(a, {**env, v.name: x}), evaluate(b, {**env, v.name: x}))
                        for env in envs)
        except ShapeError:
            holds = False
        if holds and runs and runs[-1][1] == x - v.divisor:
            runs[-1][1] = x
        elif holds:
            runs.append([x, x])
    if len(runs) != 1:
        return None
    lo, hi = runs[0]
    return lo, (v.hi if hi >= top else hi)


def _least_lower_bound(v: SymVar, a: Dim, b: Dim) -> int | None:
    """The least lower bound of ``v`` (above ``v.lo``, at most :data:`SCAN_LIMIT`) under which
    ``a`` and ``b`` are one expression, by bisection: a higher lower bound only decides more
    of the ``min``/``max`` atoms, so the values that work are one upward run. None when even
    the limit does not do. It finds the bounds no constant of the dims names: wav2vec2's
    ``[..., :-1]`` slice after three strided convs, ``min(q, max(q - 1, 0))`` against ``q - 1``
    for ``q = samples // 5 // 2 // 2``, needs ``samples >= 20`` (not ``samples % 32 == 0``,
    which holds only because a multiple of 32 is at least 32)."""
    top = SCAN_LIMIT if v.hi is None else min(v.hi, SCAN_LIMIT)

    def holds(lo: int) -> bool:
        return _same(a, b, {v.name: _bounded(v, lo, v.hi, v.divisor)})

    if top <= v.lo or not holds(top):
        return None
    fails = v.lo  # (a != b at the declared bounds: why the caller asks)
    while top - fails > 1:
        mid = (fails + top) // 2
        if holds(mid):
            top = mid
        else:
            fails = mid
    return top


def _agree(x: int, y: int) -> bool:
    return x == y and x > 0


def _sample(s: SymVar, k: int) -> int:
    """A value of ``s`` near ``k`` inside its bounds."""
    x = max(s.lo, -(-k // s.divisor) * s.divisor)
    return x if s.hi is None else min(x, s.hi - s.hi % s.divisor)


def _bounded(v: SymVar, lo: int, hi: int | None, divisor: int) -> Dim:
    return lo if hi == lo else SymVar(v.name, lo, hi, divisor)


def _minmax_constants(x: Dim) -> set[int]:
    """The bounds the ``min``/``max`` atoms of ``x`` suggest: ``k`` for ``min(k, e)``, and
    ``k - c`` when ``e`` is a symbol plus ``c`` (``min(512, s + 1)`` is ``s + 1`` for ``s <=
    511``)."""
    found: set[int] = set()
    stack: list[Dim] = [x]
    while stack:
        e = stack.pop()
        if isinstance(e, SymOp):
            if e.op in ("min", "max"):
                ints = [arg for arg in e.args if isinstance(arg, int)]
                found.update(ints)
                rest = [arg for arg in e.args if not isinstance(arg, int)]
                if len(ints) == len(rest) == 1 and isinstance(rest[0], Poly):
                    if len(rest[0].terms) == 1 and rest[0].terms[0][1] == 1:
                        found.add(ints[0] - rest[0].const)
            stack.extend(e.args)
        elif isinstance(e, Poly):
            stack.extend(atom for mono, _ in e.terms for atom in mono)
    return found
