"""SinkReshape (reshapes below element-wise ops and LayerNorm) and FuseOps' diamonds: a
transformer layer's dense → reshape → bias → GELU → residual → LayerNorm chain becomes one
dense kernel with its epilogue (the residual's reshape included), then a LayerNorm, with the same
values (graph evaluator and the
loop-IR interpreter)."""

from __future__ import annotations

import numpy as np
from test_lowering import rand, run_lowered, var

from kiln.arith import SymVar
from kiln.relay.graph import Call, Constant, Function, PrimitiveCall, TensorType, Var, post_order
from kiln.relay.interpreter import evaluate
from kiln.relay.transform.fuse_ops import fuse_ops
from kiln.relay.transform.sink_reshape import sink_reshape

X = rand(2, 3, 8)
RES = rand(2, 3, 4, seed=3)


def _gelu(x):
    """ONNX's exported erf GELU: ``x · (erf(x / √2) + 1) · 0.5`` (x used twice: a diamond)."""
    inner = Call("erf", [Call("divide", [x, Constant(np.float32(1.4142135))])])
    return Call("multiply", [Call("multiply", [x, Call("add", [inner, Constant(np.float32(1))])]),
                             Constant(np.float32(0.5))])


def _layer(x, r):
    """MatMul by a constant at rank 3 as the frontend imports it, bias (rank-3 constant),
    GELU, residual add, LayerNorm over the last axis."""
    flat = Call("reshape", [x], {"newshape": (6, 8)})
    dense = Call("nn.dense", [flat, Constant(rand(4, 8, seed=1))])
    back = Call("reshape", [dense], {"newshape": (2, 3, 4)})
    biased = Call("add", [Constant(rand(1, 1, 4, seed=2)), back])
    act = Call("add", [_gelu(biased), r])
    return Call("nn.layer_norm", [act, Constant(rand(4, seed=4)), Constant(rand(4, seed=5))],
                {"axis": -1, "epsilon": 1e-5})


def _calls(func):
    return [n for n in post_order(func.outputs) if isinstance(n, Call)]


def test_sink_reshape_keeps_values_and_moves_the_epilogue_to_the_dense_shape():
    x, r = var("x", X), var("r", RES)
    func = Function([x, r], [_layer(x, r)])
    sunk = sink_reshape(func)
    ops = [c.op.name for c in _calls(sunk)]
    # one reshape into the dense, the residual's reshape, one back out after the LayerNorm
    assert ops.count("reshape") == 3, ops
    assert ops[-1] == "reshape" and ops[-2] == "nn.layer_norm"
    assert all(c.checked_type.shape == (6, 4) for c in _calls(sunk)
               if c.op.name in ("erf", "nn.layer_norm", "multiply"))
    inputs = {"x": X, "r": RES}
    want = evaluate(func, inputs)[0]
    np.testing.assert_allclose(evaluate(sunk, inputs)[0], want, rtol=1e-5, atol=1e-6)
    fused = fuse_ops(sunk)
    names = [n.name for n in post_order(fused.outputs) if isinstance(n, PrimitiveCall)]
    # the residual's reshape joins the dense kernel's epilogue (a side input read by it only)
    assert "fused_nn_dense_add_divide_erf_add_multiply_multiply_reshape_add" in names, names
    assert "fused_nn_layer_norm" in names and names.count("fused_reshape") == 2, names
    np.testing.assert_allclose(run_lowered(fused, inputs)[0], want, rtol=1e-4, atol=1e-5)


def test_consecutive_reshapes_fold_and_identity_reshapes_vanish():
    x = var("x", X)
    a = Call("reshape", [Call("reshape", [x], {"newshape": (6, 8)})], {"newshape": (3, 16)})
    b = Call("reshape", [Call("reshape", [x], {"newshape": (48,)})], {"newshape": (2, 3, 8)})
    sunk = sink_reshape(Function([x], [Call("exp", [a]), Call("exp", [b])]))
    assert sunk.outputs[1].args[0] is x
    assert sunk.outputs[0].args[0].args[0] is x


def test_operands_broadcast_along_other_axes_keep_the_reshape():
    x = var("x", X)
    flat = Call("reshape", [x], {"newshape": (6, 8)})
    back = Call("reshape", [Call("exp", [flat])], {"newshape": (2, 3, 8)})
    out = Call("add", [back, Constant(rand(1, 3, 1, seed=1))])
    sunk = sink_reshape(Function([x], [out]))
    assert sunk.outputs[0].op.name == "add"
    # the last axis changes (8 -> 4 x 2): not moved either
    split = Call("reshape", [x], {"newshape": (2, 3, 4, 2)})
    out2 = Call("add", [split, Constant(rand(2, seed=2))])
    assert sink_reshape(Function([x], [out2])).outputs[0].op.name == "add"


def test_symbolic_sequence_length():
    n = SymVar("seq", 1, 512)
    x = Var("x", TensorType((1, n, 8), "float32"))
    flat = Call("reshape", [x], {"newshape": (n, 8)})
    dense = Call("nn.dense", [flat, Constant(rand(4, 8, seed=1))])
    back = Call("reshape", [dense], {"newshape": (1, n, 4)})
    out = _gelu(Call("add", [back, Constant(rand(4, seed=2))]))
    func = Function([x], [out])
    sunk = sink_reshape(func)
    assert sunk.outputs[0].op.name == "reshape"
    assert sunk.outputs[0].args[0].checked_type.shape == (n, 4)
    xv = rand(1, 5, 8)
    np.testing.assert_allclose(evaluate(sunk, {"x": xv})[0], evaluate(func, {"x": xv})[0],
                               rtol=1e-6)


def test_diamonds_that_do_not_meet_stay_apart():
    """A multi-user value whose users reach outputs separately is materialized."""
    x = var("x", rand(4, 8))
    d = Call("nn.dense", [x, Constant(rand(4, 8, seed=1))])
    a, e = Call("exp", [d]), Call("tanh", [d])
    fused = fuse_ops(Function([x], [Call("add", [a, Constant(np.float32(1))]), e]))
    names = [n.name for n in post_order(fused.outputs) if isinstance(n, PrimitiveCall)]
    assert "fused_nn_dense" in names, names


def test_dynamic_quantization_of_a_reshaped_value_reads_the_source():
    """DynamicQuantizeLinear of a rank-3 hidden state between two rank-2 matrix products
    (quantize_dynamic's MiniLM): min and max over every axis and a per-tensor quantize see
    the dense's [6, 4] output, and the reshape pair around them cancels (no copy kernel)."""
    x = var("x", X)
    dense = Call("nn.dense", [Call("reshape", [x], {"newshape": (6, 8)}),
                              Constant(rand(4, 8, seed=1))])
    hidden = Call("reshape", [dense], {"newshape": (2, 3, 4)})
    lo = Call("min", [hidden], {"axis": (-3, -2, -1), "keepdims": False})
    hi = Call("max", [hidden], {"axis": (0, 1, 2), "keepdims": False})
    scale = Call("divide", [Call("subtract", [hi, lo]), Constant(np.float32(255))])
    q = Call("qnn.quantize", [hidden, scale, Constant(np.uint8(128))],
             {"axis": 1, "block_size": 0, "out_dtype": "uint8"})
    flat = Call("reshape", [q], {"newshape": (6, 4)})
    func = Function([x], [flat, scale])
    sunk = sink_reshape(func)
    ops = [c.op.name for c in _calls(sunk)]
    assert ops.count("reshape") == 1, ops  # the one into the first dense
    for got, want in zip(evaluate(sunk, {"x": X}), evaluate(func, {"x": X})):
        np.testing.assert_array_equal(got, want)
