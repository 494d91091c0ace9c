"""Row fusion of softmax-like kernels (kiln.schedules.row_fusion) on the loop-IR interpreter:
the fused kernels match numpy (static and symbolic rows, rows with a reduction tail, a
non-last axis, log_softmax), and the structure is the per-row one."""

from __future__ import annotations

import numpy as np
import pytest

from kiln.arith import SymVar
from kiln.backend.te_compiler import to_te
from kiln.driver.build_module import optimize
from kiln.relay.graph import Call, Function, PrimitiveCall, TensorType, Var, post_order
from kiln.schedules import schedule_loops, schedule_te
from kiln.tir import loop as L
from kiln.tir.interpreter import run
from kiln.tir.lower import Schedule, lower
from kiln.tir.transform.make_packed_api import make_packed_api
from kiln.tir.transform.simplify import simplify
from kiln.tir.verify import verify


def _kernel(op: str, shape: tuple, axis: int) -> L.PrimFunc:
    x = Var("x", TensorType(shape, "float32"))
    func = optimize(Function([x], [Call(op, [x], {"axis": axis})]), {})
    (call,) = [c for c in post_order(func.outputs) if isinstance(c, PrimitiveCall)]
    inputs, output = to_te(call.body)
    kernel = schedule_loops(simplify(lower(schedule_te(Schedule(output)), inputs, "k")))
    verify(make_packed_api(kernel))  # (binds the shape symbols the verifier checks)
    return kernel


def _reference(op: str, x: np.ndarray, axis: int) -> np.ndarray:
    shifted = x - x.max(axis=axis, keepdims=True)
    e = np.exp(shifted)
    if op == "nn.softmax":
        return e / e.sum(axis=axis, keepdims=True)
    return shifted - np.log(e.sum(axis=axis, keepdims=True))


@pytest.mark.parametrize("op", ["nn.softmax", "nn.log_softmax"])
@pytest.mark.parametrize("shape,axis,symbols", [
    ((4, 6, 40), 2, None),            # rows of 40: two blocks of 16 lanes and a tail of 8
    ((2, 5, 48), 2, None),
    ((SymVar("n"), 3, SymVar("s")), 2, {"n": 2, "s": 37}),  # symbolic rows, a tail of 5
    ((3, 20, 5), 1, None),            # a middle axis: fused per batch, reduced across rows
    ((1, 3, 1, 40), 3, None),         # unit dims have no loops (MiniLM's static batch of 1)
])
def test_fused_softmax_matches_numpy(op, shape, axis, symbols):
    kernel = _kernel(op, shape, axis)
    concrete = tuple(symbols[d.name] if not isinstance(d, int) else d for d in shape) \
        if symbols else shape
    x = np.random.default_rng(0).standard_normal(concrete).astype("float32") * 4
    out = np.zeros_like(x)
    run(kernel, x, out, symbols=symbols)
    np.testing.assert_allclose(out, _reference(op, x, axis), rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize("shape", [(4, 6, 40), (1, 24, 40)])
def test_softmax_rows_stay_in_the_output(shape):
    """No tensor-sized intermediate: exp lives in the output row, max and sum are one value
    per row, the row loops are the kernel's only top-level nest (also under a batch of 1)."""
    kernel = _kernel("nn.softmax", shape, len(shape) - 1)
    allocs = [s.buffer for s in L.walk_stmts(kernel.body) if isinstance(s, L.Allocate)]
    assert all(b.scope == "local" and b.size <= 16 for b in allocs), allocs
    assert isinstance(kernel.body, L.For) and kernel.body.kind == "parallel"
    kinds = [s.kind for s in L.walk_stmts(kernel.body) if isinstance(s, L.For)]
    assert kinds.count("vectorized") >= 4  # exp, division, two split reductions


@pytest.mark.parametrize("s,t", [(9, 20), (8, 5)])  # a moved-back last block; keys < a block
def test_blocks_of_rows_match_numpy(s, t):
    """Row fusion over blocks of rows (``nn.attention``'s 4-row blocks, the last one moved back
    to end at the row count): the fused kernel on the interpreter matches numpy, and its
    intermediates are one block of rows."""
    from kiln.relay.op_registry import get_op
    from kiln.topi.attention import ROW_BLOCK

    b, h, d = 2, 2, 8
    shapes = {"q": (b, h, s, d), "kt": (b, h, d, t), "v": (b, h, t, d), "mask": (b, 1, 1, t)}
    args = [Var(n, TensorType(shape, "float32")) for n, shape in shapes.items()]
    func = optimize(Function(args, [Call("nn.attention", args, {"scale": 0.5})]), {})
    (call,) = [c for c in post_order(func.outputs) if isinstance(c, PrimitiveCall)]
    inputs, output = to_te(call.body)
    kernel = schedule_loops(simplify(lower(schedule_te(Schedule(output)), inputs, "k")))
    verify(make_packed_api(kernel))
    rows = [st.buffer.shape for st in L.walk_stmts(kernel.body) if isinstance(st, L.Allocate)
            and st.buffer.name.startswith(("attention_scores", "attention_exp"))
            and not st.buffer.name.endswith("_acc")]
    assert rows and all(shape == (ROW_BLOCK, t) for shape in rows), rows
    rng = np.random.default_rng(0)
    x = [rng.standard_normal(shape).astype("float32") for shape in shapes.values()]
    x[3] = (np.where(np.arange(t) < t - 2, 0.0, -10000.0).astype("float32")
            * np.ones(shapes["mask"], "float32"))
    out = np.zeros((b, h, s, d), "float32")
    run(kernel, *x, out)
    want = get_op("nn.attention").ref(*x, scale=0.5)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)
