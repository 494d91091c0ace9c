"""Every op's compute + default schedule, lowered and run on the loop-IR interpreter, against the
op's numpy reference; and FuseOps grouping. No C compiler involved."""

from __future__ import annotations

import numpy as np
import pytest

from kiln.backend.te_compiler import lower_primitive
from kiln.relay.graph import Call, Constant, Function, PrimitiveCall, TensorType, Var, post_order
from kiln.relay.interpreter import evaluate
from kiln.relay.transform.fuse_ops import fuse_ops
from kiln.tir import interpreter as loop_interp
from kiln.tir.verify import verify


def run_lowered(func: Function, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    """Execute a fused function kernel by kernel on the interpreter (before MakePackedAPI)."""
    from kiln.backend import te_compiler
    from kiln.schedules import schedule_loops, schedule_te
    from kiln.tir.lower import Schedule, lower
    from kiln.tir.transform.simplify import simplify

    values: dict[int, np.ndarray] = {p.uid: inputs[p.name] for p in func.params}
    for node in post_order(func.outputs):
        if isinstance(node, Constant):
            values[node.uid] = node.data
        elif isinstance(node, PrimitiveCall):
            ins, out = te_compiler.to_te(node.body)
            kernel = lower(schedule_te(Schedule(out)), ins, node.name)
            for stage in (simplify, schedule_loops):
                verify(kernel)
                kernel = stage(kernel)
            verify(kernel)
            result = np.zeros(node.checked_type.shape, node.checked_type.dtype)
            loop_interp.run(kernel, *[np.ascontiguousarray(values[a.uid]) for a in node.args],
                            result)
            values[node.uid] = result
    return [values[o.uid] for o in func.outputs]


def rand(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype("float32")


def var(name, arr):
    return Var(name, TensorType(arr.shape, str(arr.dtype)))


X = rand(1, 2, 5, 5)
CONV = {"strides": (1, 1), "padding": (1, 1, 1, 1), "dilation": (1, 1), "groups": 1}
POOL = {"pool_size": (3, 3), "strides": (2, 2), "padding": (1, 1, 1, 1), "dilation": (1, 1),
        "ceil_mode": True}

CASES = [
    ("nn.relu", [X], {}),
    ("hardswish", [X], {}),
    ("clip", [X], {"a_min": -0.2, "a_max": 0.3}),
    ("sigmoid", [X], {}),
    ("add", [X, rand(2, 1, 1, seed=1)], {}),
    ("nn.bias_add", [X, rand(2, seed=1)], {"axis": 1}),
    ("nn.conv2d", [X, rand(3, 2, 3, 3, seed=1)], CONV),
    ("nn.conv2d", [X, rand(4, 1, 3, 3, seed=1)], dict(CONV, groups=2, strides=(2, 2))),
    ("nn.dense", [rand(2, 6), rand(3, 6, seed=1)], {}),
    ("nn.matmul", [rand(2, 3, 4), rand(4, 5, seed=1)], {}),
    ("nn.max_pool2d", [X], POOL),
    ("nn.avg_pool2d", [X], dict(POOL, count_include_pad=False)),
    ("nn.avg_pool2d", [X], dict(POOL, count_include_pad=True)),
    ("nn.global_avg_pool2d", [X], {}),
    ("nn.softmax", [rand(2, 7)], {"axis": 1}),
    ("nn.log_softmax", [rand(2, 7)], {"axis": 0}),
    ("nn.lrn", [rand(1, 5, 2, 2)], {"size": 3, "axis": 1, "alpha": 0.1, "beta": 0.75,
                                     "bias": 1.0}),
    ("reshape", [X], {"newshape": (5, 10)}),
    ("transpose", [X], {"axes": (0, 3, 1, 2)}),
    ("concatenate", [X, rand(1, 1, 5, 5, seed=1)], {"axis": 1}),
    ("strided_slice", [X], {"begin": (0, 1, 4, 0), "end": (1, 2, -1, 5), "strides": (1, 1, -2, 2)}),
    ("take", [rand(4, 3), np.array([[3, -1]], "int64")], {"axis": 0}),
    ("mean", [X], {"axis": (2, 3), "keepdims": True}),
    ("max", [X], {"axis": (1,), "keepdims": False}),
    ("where", [np.array([True, False, True]), rand(2, 3), rand(3, seed=1)], {}),
    ("cast", [X], {"dtype": "int32"}),
]


@pytest.mark.parametrize("op,arrays,attrs", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_lowered_op_matches_reference(op, arrays, attrs):
    params = [var(f"x{i}", a) for i, a in enumerate(arrays)]
    func = Function(params, [Call(op, params, attrs)])
    inputs = {p.name: a for p, a in zip(params, arrays)}
    got = run_lowered(fuse_ops(func), inputs)[0]
    want = evaluate(func, inputs)[0]
    assert got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_fuse_ops_groups_conv_epilogue_and_injective_chains():
    x, w, b = var("x", X), Constant(rand(3, 2, 3, 3, seed=1)), Constant(rand(3, seed=2))
    conv = Call("nn.conv2d", [x, w], CONV)
    relu = Call("nn.relu", [Call("nn.bias_add", [conv, b], {"axis": 1})])
    flat = Call("reshape", [Call("transpose", [relu], {"axes": (0, 2, 3, 1)})],
                {"newshape": (1, 75)})
    soft = Call("nn.softmax", [flat], {"axis": 1})
    fused = fuse_ops(Function([x], [soft]))
    calls = [n for n in post_order(fused.outputs) if isinstance(n, PrimitiveCall)]
    assert [c.name for c in calls] == [
        "fused_nn_conv2d_nn_bias_add_nn_relu", "fused_transpose_reshape", "fused_nn_softmax"]
    got = run_lowered(fused, {"x": X})[0]
    want = evaluate(Function([x], [soft]), {"x": X})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_fuse_ops_keeps_multi_use_values_materialized():
    x = var("x", X)
    r = Call("nn.relu", [x])
    a = Call("add", [r, r])
    e = Call("exp", [r])
    fused = fuse_ops(Function([x], [a, e]))
    calls = [n for n in post_order(fused.outputs) if isinstance(n, PrimitiveCall)]
    assert len(calls) == 3  # relu has two users: it is its own kernel


def test_conv_epilogue_is_fused_in_place():
    x, w, b = var("x", X), Constant(rand(3, 2, 3, 3, seed=1)), Constant(rand(3, seed=2))
    out = Call("nn.relu", [Call("nn.bias_add", [Call("nn.conv2d", [x, w], CONV), b],
                                {"axis": 1})])
    call = next(n for n in post_order(fuse_ops(Function([x], [out])).outputs)
                if isinstance(n, PrimitiveCall))
    kernel = lower_primitive(call, "k")
    from kiln.tir import loop as L

    allocs = [s.buffer.name for s in L.walk_stmts(kernel.body) if isinstance(s, L.Allocate)]
    assert not any(name.startswith("conv2d") for name in allocs), allocs


def test_fold_scale_axis_moves_channel_scale_into_weights():
    from kiln.relay.transform.fold_scale_axis import fold_scale_axis

    x, w = var("x", X), Constant(rand(3, 2, 3, 3, seed=1))
    scale = Constant(np.abs(rand(3, 1, 1, seed=2)))
    out = Call("add", [Call("multiply", [Call("nn.conv2d", [x, w], CONV), scale]),
                       Constant(rand(3, 1, 1, seed=3))])
    func = Function([x], [out])
    folded = fold_scale_axis(func)
    ops = [n.op.name for n in post_order(folded.outputs) if isinstance(n, Call)]
    assert ops == ["nn.conv2d", "add"]
    np.testing.assert_allclose(evaluate(folded, {"x": X})[0], evaluate(func, {"x": X})[0],
                               rtol=1e-5, atol=1e-5)
    # a scale along a spatial axis must not fold
    spatial = Constant(rand(1, 5, 1, seed=4))
    kept = fold_scale_axis(Function([x], [Call("multiply", [Call("nn.conv2d", [x, w], CONV),
                                                           spatial])]))
    assert [n.op.name for n in post_order(kept.outputs) if isinstance(n, Call)] == [
        "nn.conv2d", "multiply"]
