"""Float min / max reductions to one value per output (DynamicQuantizeLinear's range, ReduceMax
over the last axis) split into vectorized partial results by
:func:`kiln.schedules.reduce_rfactor.vectorize_reductions`: exact against numpy (min and max
do not round), tails included; sums keep their serial order (reassociating them would change
the result)."""

from __future__ import annotations

import numpy as np
import pytest

from kiln.backend.te_compiler import to_te
from kiln.driver.build_module import optimize
from kiln.relay.graph import Call, Function, PrimitiveCall, TensorType, Var, post_order
from kiln.schedules import schedule_loops, schedule_te
from kiln.tir import loop as L
from kiln.tir.interpreter import run
from kiln.tir.lower import Schedule, lower
from kiln.tir.transform.simplify import simplify


def _kernel(op: str, shape: tuple, axis) -> L.PrimFunc:
    x = Var("x", TensorType(shape, "float32"))
    func = optimize(Function([x], [Call(op, [x], {"axis": axis, "keepdims": False})]), {})
    (call,) = [c for c in post_order(func.outputs) if isinstance(c, PrimitiveCall)]
    inputs, output = to_te(call.body)
    return schedule_loops(simplify(lower(schedule_te(Schedule(output)), inputs, "k")))


def _kinds(kernel: L.PrimFunc) -> list[str]:
    return [s.kind for s in L.walk_stmts(kernel.body) if isinstance(s, L.For)]


@pytest.mark.parametrize("op", ["min", "max"])
@pytest.mark.parametrize("shape,axis", [
    ((1, 5, 384), (0, 1, 2)),   # DynamicQuantizeLinear's whole-tensor range (MiniLM rows)
    ((3, 1000), (0, 1)),        # rows of 1000: 62 blocks of 16 lanes and a tail of 8
    ((6, 40), (1,)),            # one value per row
])
def test_min_max_reductions_vectorized_and_exact(op, shape, axis):
    kernel = _kernel(op, shape, axis)
    assert "vectorized" in _kinds(kernel), kernel
    x = np.random.default_rng(3).standard_normal(shape).astype("float32") * 7
    want = getattr(np, op)(x, axis=axis)
    out = np.zeros(want.shape, "float32")
    run(kernel, x, out)
    np.testing.assert_array_equal(out, want)


def test_short_and_strided_reductions_stay_serial():
    """Rows under two blocks of lanes, and a reduction over a non-last axis (strided loads),
    are left as they are."""
    assert "vectorized" not in _kinds(_kernel("max", (4, 20), (1,)))
    assert "vectorized" not in _kinds(_kernel("max", (64, 3), (0,)))


def test_sums_keep_their_order():
    assert "vectorized" not in _kinds(_kernel("sum", (2, 512), (1,)))
