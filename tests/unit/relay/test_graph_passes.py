"""Graph passes: BindParams, FoldConstant, SimplifyInference."""

from __future__ import annotations

import numpy as np
import pytest

from kiln.errors import ShapeError
from kiln.relay.graph import Call, Constant, Function, TensorType, Var, post_order
from kiln.relay.interpreter import evaluate
from kiln.relay.transform import bind_params, fold_constant, simplify_inference

F32 = "float32"


def _rand(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _calls(func: Function) -> list[Call]:
    return [n for n in post_order(func.outputs) if isinstance(n, Call)]


def test_pass_names():
    assert bind_params.name == "BindParams"
    assert fold_constant.name == "FoldConstant"
    assert simplify_inference.name == "SimplifyInference"


# ---------------------------------------------------------------------------------------------
# bind_params


def _dense_func():
    x = Var("x", TensorType((2, 3), F32))
    w = Var("w", TensorType((4, 3), F32))
    b = Var("b", TensorType((4,), F32))
    out = Call("nn.bias_add", [Call("nn.dense", [x, w]), b], {"axis": 1})
    return Function([x, w, b], [out], ["y"])


def test_bind_params_replaces_vars_by_named_constants():
    func = _dense_func()
    w, b = _rand(4, 3, seed=1), _rand(4, seed=2)
    bound = bind_params(func, {"w": w, "b": b, "not_a_param": np.zeros(1)})
    assert [p.name for p in bound.params] == ["x"]
    assert bound.output_names == ["y"]
    consts = {n.name: n for n in post_order(bound.outputs) if isinstance(n, Constant)}
    assert set(consts) == {"w", "b"}
    np.testing.assert_array_equal(consts["w"].data, w)
    x = _rand(2, 3)
    np.testing.assert_allclose(evaluate(bound, {"x": x})[0],
                               evaluate(func, {"x": x, "w": w, "b": b})[0])
    assert [p.name for p in func.params] == ["x", "w", "b"]  # the input is untouched


def test_bind_params_keeps_unbound_params_in_order():
    bound = bind_params(_dense_func(), {"w": _rand(4, 3)})
    assert [p.name for p in bound.params] == ["x", "b"]


def test_bind_params_shape_mismatch():
    with pytest.raises(ShapeError, match="'w'"):
        bind_params(_dense_func(), {"w": _rand(3, 4)})


def test_bind_params_output_var():
    x = Var("x", TensorType((2,), F32))
    bound = bind_params(Function([x], [x]), {"x": np.ones(2, np.float32)})
    assert isinstance(bound.outputs[0], Constant) and bound.params == []


# ---------------------------------------------------------------------------------------------
# fold_constant


def test_fold_constant_collapses_constant_subgraph():
    x = Var("x", TensorType((4, 3), F32))
    w = Constant(_rand(3, 4), name="w")
    wt = Call("transpose", [w], {"axes": (1, 0)})
    scale = Call("sqrt", [Call("add", [Constant(np.full((4,), 3.0, np.float32)),
                                       Constant(np.array(1.0, np.float32))])])
    out = Call("nn.bias_add", [Call("nn.dense", [x, wt]), scale], {"axis": 1})
    func = Function([x], [out])
    folded = fold_constant(func)
    calls = _calls(folded)
    assert [c.op.name for c in calls] == ["nn.dense", "nn.bias_add"]
    dense = calls[0]
    assert isinstance(dense.args[1], Constant) and dense.args[1].name == "w.transpose"
    np.testing.assert_allclose(calls[1].args[1].data, np.full(4, 2.0))
    xv = _rand(4, 3)
    np.testing.assert_allclose(evaluate(folded, {"x": xv})[0], evaluate(func, {"x": xv})[0])


def test_fold_constant_whole_function_and_shared_nodes():
    c = Constant(np.arange(6, dtype=np.float32).reshape(2, 3))
    shared = Call("negative", [c])
    out = Call("add", [shared, shared])
    folded = fold_constant(Function([], [out, shared]))
    assert all(isinstance(o, Constant) for o in folded.outputs)
    np.testing.assert_array_equal(folded.outputs[0].data, -2 * c.data)


def test_fold_constant_keeps_untouched_calls():
    x = Var("x", TensorType((3,), F32))
    relu = Call("nn.relu", [x])
    folded = fold_constant(Function([x], [relu]))
    assert folded.outputs[0] is relu


def test_fold_constant_deep_chain_is_iterative():
    node = Constant(np.zeros(2, np.float32))
    for _ in range(5000):
        node = Call("add", [node, Constant(np.ones(2, np.float32))])
    folded = fold_constant(Function([], [node]))
    np.testing.assert_array_equal(folded.outputs[0].data, [5000, 5000])


def test_fold_constant_integer_shape_arithmetic():
    shape = Constant(np.array([2, 3, 4], np.int64))
    n = Call("take", [shape, Constant(np.array([0, -1], np.int64))], {"axis": 0})
    out = Call("multiply", [n, Constant(np.array(2, np.int64))])
    folded = fold_constant(Function([], [out]))
    assert folded.outputs[0].data.tolist() == [4, 8]
    assert folded.outputs[0].data.dtype == np.int64


# ---------------------------------------------------------------------------------------------
# simplify_inference


def _bn_func(shape, axis):
    c = shape[axis]
    x = Var("x", TensorType(shape, F32))
    stats = [Constant(_rand(c, seed=k)) for k in range(1, 4)]
    var = Constant(np.abs(_rand(c, seed=5)) + 0.5)
    out = Call("nn.batch_norm", [x, *stats, var], {"epsilon": 1e-3, "axis": axis})
    return Function([x], [Call("nn.relu", [out])])


@pytest.mark.parametrize("shape,axis", [((2, 4, 3, 3), 1), ((5, 4), 1), ((5, 4), -1),
                                        ((4, 2, 3), 0)])
def test_simplify_batch_norm(shape, axis):
    func = _bn_func(shape, axis)
    simple = simplify_inference(func)
    ops = [c.op.name for c in _calls(simple)]
    assert "nn.batch_norm" not in ops
    x = _rand(*shape)
    want = evaluate(func, {"x": x})[0]
    np.testing.assert_allclose(evaluate(simple, {"x": x})[0], want, rtol=1e-5, atol=1e-6)
    # Constant statistics become constant scale/shift operands right away.
    calls = _calls(simple)
    assert [c.op.name for c in calls] == ["multiply", "add", "nn.relu"]
    assert all(isinstance(c.args[1], Constant) for c in calls[:2])
    folded = fold_constant(simple)
    assert [c.op.name for c in _calls(folded)] == ["multiply", "add", "nn.relu"]
    np.testing.assert_allclose(evaluate(folded, {"x": x})[0], want, rtol=1e-5, atol=1e-6)


def test_simplify_batch_norm_with_param_vars():
    # Unbound statistics stay as graph arithmetic over the Vars.
    x = Var("x", TensorType((1, 2, 2, 2), F32))
    stats = [Var(n, TensorType((2,), F32)) for n in ("g", "b", "m", "v")]
    func = Function([x, *stats], [Call("nn.batch_norm", [x, *stats],
                                       {"epsilon": 1e-5, "axis": 1})])
    simple = simplify_inference(func)
    assert "nn.batch_norm" not in [c.op.name for c in _calls(simple)]
    values = {"x": _rand(1, 2, 2, 2), "g": _rand(2, seed=1), "b": _rand(2, seed=2),
              "m": _rand(2, seed=3), "v": np.array([0.5, 2.0], np.float32)}
    np.testing.assert_allclose(evaluate(simple, values)[0], evaluate(func, values)[0], rtol=1e-5)


def test_simplify_dropout():
    x = Var("x", TensorType((2, 3), F32))
    drop = Call("nn.dropout", [Call("nn.relu", [x])], {"rate": 0.5})
    simple = simplify_inference(Function([x], [Call("exp", [drop]), drop]))
    assert [c.op.name for c in _calls(simple)] == ["nn.relu", "exp"]
    assert simple.outputs[1].op.name == "nn.relu"
