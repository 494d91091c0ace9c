"""kiln.relay.assume: the weakest declaration on input symbols under which two dims are one
expression, and the broadcast that raises it."""

from __future__ import annotations

import pytest

from kiln.arith import SymVar, evaluate, floordiv, maximum, minimum, substitute
from kiln.errors import ShapeError
from kiln.relay.assume import (
    Assumption,
    AssumptionNeeded,
    assume_equal,
    assume_options,
    needed_assumptions,
)
from kiln.relay.op.common import broadcast_shapes

S = SymVar("sequence_length")
B = SymVar("batch_size")
H = SymVar("h")


def test_a_min_against_its_operand_bounds_the_symbol():
    a = assume_equal(minimum(512, S), S)
    assert (a.symbol, a.lo, a.hi, a.divisor, a.equal) == ("sequence_length", 1, 512, 1, None)
    assert a.relation() == "sequence_length <= 512"


def test_a_min_of_a_shifted_symbol_bounds_it_exactly():
    a = assume_equal(minimum(512, S + 1), S + 1)
    assert a.relation() == "sequence_length <= 511"
    bounded = SymVar("sequence_length", 1, 511)
    assert minimum(512, bounded + 1) == bounded + 1


def test_two_symbols_are_unified():
    a = assume_equal(SymVar("input_dim0"), SymVar("state_dim1"))
    assert (a.symbol, a.equal) == ("state_dim1", "input_dim0")
    assert a.relation() == "input_dim0 == state_dim1"
    a = assume_equal((H + 1) // 2, (SymVar("w") + 1) // 2)  # inside expressions too
    assert (a.symbol, a.equal) == ("w", "h")


def test_a_stride_chain_needs_the_smallest_power_of_two():
    half = floordiv(H + 1, 2)            # a stride-2 conv
    up = 2 * floordiv(half + 1, 2)     # then another, upsampled by 2
    a = assume_equal(half, up)
    assert (a.symbol, a.lo, a.divisor) == ("h", 4, 4)
    assert a.relation() == "h % 4 == 0"  # (so h >= 4)
    for h in (4, 8, 36):  # it is right at the values it allows
        assert evaluate(half, {"h": h}) == evaluate(up, {"h": h})
    assert evaluate(half, {"h": 6}) != evaluate(up, {"h": 6})


def test_a_symbol_against_a_constant_takes_its_value():
    a = assume_equal(B, 3)
    assert (a.lo, a.hi) == (3, 3) and a.relation() == "batch_size == 3"


def test_no_single_declaration_means_none():
    assert assume_equal(S, S) is None
    assert assume_equal(S * B, S + B) is None
    assert assume_equal(SymVar("n", 1, 4), 9) is None  # outside its declared bounds


def test_broadcast_raises_the_assumption_with_the_shapes():
    with pytest.raises(AssumptionNeeded) as info:
        broadcast_shapes((1, minimum(512, S)), (B, S))
    a = info.value.assumption
    assert a.relation() == "sequence_length <= 512"
    assert "(1, min(512, sequence_length)) vs (batch_size, sequence_length)" in a.where
    assert isinstance(info.value, ShapeError) and "do not broadcast" in str(info.value)


def test_broadcast_without_an_assumption_stays_a_shape_error():
    with pytest.raises(ShapeError, match="do not broadcast") as info:
        broadcast_shapes((S * B,), (S + B,))
    assert not isinstance(info.value, AssumptionNeeded)
    with pytest.raises(ShapeError) as info:
        broadcast_shapes((2, 3), (4,))
    assert not isinstance(info.value, AssumptionNeeded)


def test_the_assumption_survives_wrappers_that_name_the_node():
    inner = AssumptionNeeded("shapes do not broadcast", [Assumption("s", hi=8, where="why")])
    try:
        try:
            raise inner
        except ShapeError as err:
            raise ShapeError(f"ONNX Add (node 'a'): {err}") from None
    except ShapeError as outer:
        (a,) = needed_assumptions(outer)
    assert (a.symbol, a.hi, a.where) == ("s", 8, "ONNX Add (node 'a'): why")
    assert needed_assumptions(ShapeError("other")) == []


def test_equally_weak_declarations_on_two_symbols_are_both_options():
    """``b * h`` a multiple of 4: ``b % 4 == 0`` or ``h % 4 == 0`` (the importer picks the
    symbol of the inner dim); ``b % 2`` alone would not do."""
    options = assume_options((B * H) % 4, 0)
    assert [o.relation() for o in options] == ["batch_size % 4 == 0", "h % 4 == 0"]
    assert assume_options((B * H + 2 * H) % 4, 0)[0].relation() == "h % 4 == 0"  # (h % 2 fails)


def test_a_feature_map_of_one_row_bounds_the_height_to_an_interval():
    """PP-OCRv4 rec: four stride-2 stages and a 3-row pooling must leave one row, so the
    reshape of ``[N, rows * W', C]`` to ``[N, 1, W', C]`` holds for 33 <= h <= 80."""
    rows = H
    for _ in range(4):
        rows = floordiv(rows + 1, 2)
    rows = floordiv(rows, 3)
    w = floordiv(SymVar("w"), 8)
    a = assume_equal(rows * w * 120, w * 120)
    assert (a.symbol, a.lo, a.hi) == ("h", 33, 80)
    assert all(evaluate(rows, {"h": h}) == 1 for h in range(33, 81))
    assert evaluate(rows, {"h": 32}) == 0 and evaluate(rows, {"h": 81}) == 2


def test_a_clamped_slice_after_a_stride_chain_needs_the_least_lower_bound():
    """wav2vec2's feature encoder: three strided convs leave ``q - 1`` frames (``q =
    samples // 5 // 2 // 2``); its positional conv gives ``q`` and the ``[..., :-1]`` slice
    clamps its end to ``min(q, max(q - 1, 0))``. They agree once ``q >= 1``: ``samples >=
    20``, the least lower bound, found although no constant of the dims names 20. A divisor
    would do too (``samples % 32 == 0`` lifts samples to 32) but refuses samples=1200, which
    onnxruntime runs."""
    samples = SymVar("samples")
    q = floordiv(floordiv(floordiv(samples, 5), 2), 2)
    (a,) = assume_options(q - 1, minimum(q, maximum(q - 1, 0)))
    assert a.relation() == "samples >= 20" and (a.lo, a.hi, a.divisor) == (20, None, 1)
    at = {lo: substitute(minimum(q, maximum(q - 1, 0)), {"samples": SymVar("samples", lo)})
          for lo in (19, 20)}
    assert at[19] != substitute(q - 1, {"samples": SymVar("samples", 19)})  # 19 is too weak
    assert at[20] == substitute(q - 1, {"samples": SymVar("samples", 20)})
