"""kiln.arith: canonical symbolic dims, simplification with bounds, evaluation."""

from __future__ import annotations

import itertools

import pytest

from kiln import arith
from kiln.arith import SymVar, bounds, evaluate, floordiv, floormod, maximum, minimum
from kiln.errors import ShapeError

N = SymVar("n")
SEQ = SymVar("seq", 1, 512)
W = SymVar("w", 32, 2048, 32)


def test_equal_expressions_are_equal_objects():
    assert N * 2 + 1 == 1 + 2 * N
    assert hash(N * SEQ) == hash(SEQ * N)
    assert (N + 1) * (N + 1) == N * N + 2 * N + 1
    assert N * SEQ * 2 - SEQ * N == N * SEQ


def test_constants_fold_to_plain_ints():
    assert N - N == 0 and isinstance(N - N, int)
    assert (N * 4 + 3) // 4 == N
    assert (N * 4 + 3) % 4 == 3
    assert (N * SEQ) // SEQ == N
    assert (N * SEQ * 12) // (SEQ * 4) == 3 * N
    assert floormod(N * SEQ, SEQ) == 0


def test_divisor_and_bounds_decide():
    assert W % 8 == 0
    assert maximum(N, 1) == N  # symbols are >= 1 unless declared otherwise
    assert minimum(SEQ, 512) == SEQ
    assert minimum(SEQ, 100) != SEQ  # undecided: stays a min
    assert minimum(N, 1 << 62) == N  # ONNX's "to the end" slice bound
    assert bounds(SEQ * 2 + 1) == (3, 1025)


def test_floor_semantics_match_python():
    for n, s in itertools.product(range(1, 9), range(1, 6)):
        env = {"n": n, "seq": s}
        for expr, want in [((N * 3 + 2) // 2, (n * 3 + 2) // 2), ((N - 7) // 3, (n - 7) // 3),
                           ((N + SEQ) % 4, (n + s) % 4), (maximum(N, SEQ), max(n, s)),
                           (floordiv(N * SEQ + 1, SEQ), (n * s + 1) // s)]:
            assert evaluate(expr, env) == want, (expr, env)


def test_symbolic_values_refuse_static_use():
    with pytest.raises(ShapeError, match="n is symbolic"):
        int(N)
    with pytest.raises(ShapeError, match="unknown at compile time"):
        bool(N)
    with pytest.raises(ShapeError, match="by zero"):
        floordiv(N, 0)
    with pytest.raises(ShapeError, match="empty bounds"):
        SymVar("bad", 5, 2)


def test_substitute_and_free_symbols():
    e = N * SEQ + W // 8
    assert [s.name for s in arith.free_symbols(e)] == ["n", "seq", "w"]
    assert arith.substitute(e, {"n": 2, "seq": 3, "w": 64}) == 14
    assert arith.substitute(e, {"n": SEQ}) == SEQ * SEQ + W // 8


def test_bounds_of_a_product_with_a_negative_factor():
    """``n * min(q - 1, 0)`` lies in ``[-hi(n), 0]``: silero's conv extent over an unbounded
    chunk length, ``129*q*n + 129*n - 129*n*min(q - 1, 0)``, is at least 129."""
    q = floordiv(SymVar("s") + 64, 128)
    assert bounds(N * minimum(q - 1, 0)) == (-arith.DIM_LIMIT, 0)
    assert bounds(129 * q * N + 129 * N - 129 * N * minimum(q - 1, 0))[0] == 129
    assert bounds(minimum(q - 1, 0) * minimum(q - 1, 0)) == (0, 1)  # [-1, 0] * [-1, 0]


def test_provably_equal_writes_multiples_out():
    h = SymVar("h", 4, None, 4)
    assert 4 * N * floordiv(h, 4) != N * h  # two canonical forms of one value
    assert arith.provably_equal(4 * N * floordiv(h, 4), N * h)
    assert arith.provably_equal(W, 32 * floordiv(W, 32)) and arith.provably_equal(N, N)
    assert not arith.provably_equal(2 * N * floordiv(h, 4), N * h)
    assert not arith.provably_equal(4 * floordiv(N, 4), N)  # n has no divisor


def test_bounds_of_a_floor_division_of_a_negative_numerator():
    """``-((-x) // 2)`` is ``ceil(x / 2)``: a ceil_mode pool's output extent
    (``onnx.MaxPool`` over squeezenet's symbolic height) has the bounds of ``x``, halved."""
    x = floordiv(N + 1, 2)  # 1.. after a stride-2 conv
    assert bounds(floordiv(-x, 2)) == (-(arith.DIM_LIMIT // 4), -1)
    assert bounds(-floordiv(-x, 2)) == (1, arith.DIM_LIMIT // 4)
    assert bounds(floordiv(-SEQ, SymVar("k", 2, 4))) == (-256, -1)  # [-512, -1] / [2, 4]
    assert bounds(floordiv(7 - SEQ, 7)) == (-73, 0)  # 1 + (-seq) // 7
    for s in range(1, 513):  # every value lies inside them
        assert -73 <= evaluate(floordiv(7 - SEQ, 7), {"seq": s}) <= 0


def test_a_ceil_division_has_one_form():
    """``-((-n) // 2)`` (a ceil_mode pool's extent) and ``(n + 1) // 2`` (Funnel's position
    table, halved) are one expression: a numerator whose terms are all negative is flipped,
    by ``floor(a / b) == -floor((b - 1 - a) / b)``. The pooled queries and their relative
    positions then broadcast with no assumption (it had assumed ``seq % 2 == 0``)."""
    assert -floordiv(-N, 2) == floordiv(N + 1, 2)
    assert -floordiv(1 - N, 2) == floordiv(N, 2)
    assert floordiv(7 - SEQ, 7) == -floordiv(SEQ - 1, 7)
    cases = ((floordiv(-N, 2), lambda n: -n // 2), (floordiv(1 - N, 2), lambda n: (1 - n) // 2),
             (floordiv(7 - N, 7), lambda n: (7 - n) // 7),
             (floordiv(1 - 3 * N, 4), lambda n: (1 - 3 * n) // 4))
    for n in range(1, 60):
        for expr, value in cases:
            assert evaluate(expr, {"n": n}) == value(n)


def test_bounds_see_through_a_multiple_of_a_quotient():
    """``2 * ((s + 1) // 2) - s`` is 0 or 1: bounded term by term it is unbounded, but written
    ``(s + 1 - m) - s`` with ``m`` in [0, 1] the symbol cancels. Funnel's decoder upsamples the
    pooled sequence to ``min(2 * ((s + 1) // 2) - 1, s - 1) + 1``, which is then ``s`` and adds
    to the encoder's first block with no assumption."""
    assert bounds(2 * floordiv(N + 1, 2) - N) == (0, 1)
    assert bounds(N - 4 * floordiv(N, 4)) == (0, 3)
    assert minimum(2 * floordiv(N + 1, 2) - 1, N - 1) + 1 == N
    assert maximum(3 * floordiv(N + 2, 3), N) == 3 * floordiv(N + 2, 3)
    for n in range(1, 100):
        assert evaluate(minimum(2 * floordiv(N + 1, 2) - 1, N - 1) + 1, {"n": n}) == n
        assert 0 <= evaluate(2 * floordiv(N + 1, 2) - N, {"n": n}) <= 1


def test_a_constant_below_a_symbolic_divisor_divides_to_zero_or_minus_one():
    """``-1 % (n + 4)`` is ``n + 3`` (the torch dynamo exporter's ``roll`` slices to it),
    ``-1 // (n + 4)`` is -1, ``3 % (n + 4)`` is 3: a constant smaller in magnitude than every
    value of the divisor. Beyond it the operation stays symbolic. Checked against Python's
    floor semantics at every value tried."""
    divisor = N + 4  # at least 5
    assert floormod(-1, divisor) == N + 3 and floordiv(-1, divisor) == -1
    assert floormod(3, divisor) == 3 and floordiv(3, divisor) == 0
    assert floormod(-5, divisor) == N - 1
    for a in (-6, 5):  # |a| may reach the divisor: undecided
        assert not isinstance(floormod(a, divisor), int) and floormod(a, divisor) != N + 4 + a
        for n in range(1, 9):
            env = {"n": n}
            assert evaluate(floormod(a, divisor), env) == a % (n + 4)
            assert evaluate(floordiv(a, divisor), env) == a // (n + 4)
    for a in range(-5, 5):
        for n in range(1, 9):
            assert evaluate(floormod(a, divisor), {"n": n}) == a % (n + 4)
            assert evaluate(floordiv(a, divisor), {"n": n}) == a // (n + 4)
