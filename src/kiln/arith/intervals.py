"""Interval arithmetic on inclusive bounds ``(lo, hi)``, None for an unbounded end: what
:func:`kiln.arith.bounds` combines term by term (TVM's ``arith::ConstIntBound``,
src/arith/const_int_bound.cc). Ends may be Fractions while an expression is written without
its floor divisions; :func:`rounded` makes them integers.
"""

from __future__ import annotations

import math
from fractions import Fraction

Bound = tuple  # (lo, hi): int, Fraction or None each


def plus(a: Bound, b: Bound) -> Bound:
    """Bounds of ``x + y`` for ``x`` in ``a``, ``y`` in ``b``."""
    return (None if a[0] is None or b[0] is None else a[0] + b[0],
            None if a[1] is None or b[1] is None else a[1] + b[1])


def scale(b: Bound, c: int | Fraction) -> Bound:
    """Bounds of ``c * x`` for ``x`` in ``b``."""
    lo, hi = b
    if c >= 0:
        return (None if lo is None else lo * c, None if hi is None else hi * c)
    return (None if hi is None else hi * c, None if lo is None else lo * c)


def times(a: Bound, b: Bound) -> Bound:
    """Bounds of ``x * y``; with an unbounded end, only for non-negative factors (shapes are
    non-negative in practice; signs unknown give up)."""
    (lo, hi), (blo, bhi) = a, b
    if None not in (lo, hi, blo, bhi):  # signs may differ
        ends = (lo * blo, lo * bhi, hi * blo, hi * bhi)
        return min(ends), max(ends)
    if blo is None or blo < 0 or lo is None or lo < 0:
        return None, None
    return lo * blo, None if hi is None or bhi is None else hi * bhi


def smaller(a: Bound, b: Bound) -> Bound:
    """Bounds of ``min(x, y)``."""
    return (None if a[0] is None or b[0] is None else min(a[0], b[0]),
            a[1] if b[1] is None else b[1] if a[1] is None else min(a[1], b[1]))


def larger(a: Bound, b: Bound) -> Bound:
    """Bounds of ``max(x, y)``."""
    return (a[0] if b[0] is None else b[0] if a[0] is None else max(a[0], b[0]),
            None if a[1] is None or b[1] is None else max(a[1], b[1]))


def both(a: Bound, b: Bound) -> Bound:
    """The intersection: what two bounds of one value say together."""
    return (a[0] if b[0] is None else b[0] if a[0] is None else max(a[0], b[0]),
            a[1] if b[1] is None else b[1] if a[1] is None else min(a[1], b[1]))


def rounded(b: Bound) -> Bound:
    """Integer bounds of an integer value whose bounds ``b`` may be fractions."""
    return (None if b[0] is None else math.ceil(b[0]), None if b[1] is None else math.floor(b[1]))


def quotient(a: Bound, b: Bound) -> Bound:
    """Bounds of ``x // y`` for a positive divisor ``y`` and a numerator of either sign:
    ``floor(x / y)`` grows with ``x``; with ``y`` it shrinks for ``x >= 0`` and grows (towards
    -1) for ``x < 0``. A negative numerator is how a ceil division is written (``-((-x) //
    s)``: a ceil_mode pool's extent), so it must have bounds too."""
    (alo, ahi), (blo, bhi) = a, b
    if alo is None:
        lo = None
    elif alo >= 0:
        lo = 0 if bhi is None else alo // bhi
    else:
        lo = alo // blo
    if ahi is None:
        hi = None
    elif ahi >= 0:
        hi = ahi // blo
    else:
        hi = -1 if bhi is None else ahi // bhi
    return lo, hi
