"""ONNX frontend, op by op: a tiny single-node model per op and attribute variant, run by
onnxruntime and by Kiln (from_onnx → bind_params → simplify_inference → fold_constant →
graph_eval), compared elementwise. The helpers here are shared by the other frontend tests."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from kiln.frontend import from_onnx
from kiln.relay.interpreter import evaluate
from kiln.relay.transform import bind_params, fold_constant, simplify_inference


def make_model(nodes: list[onnx.NodeProto], inputs: dict[str, np.ndarray], outputs: list[str],
               opset: int, inits: dict[str, np.ndarray] | None = None) -> onnx.ModelProto:
    """A model of ``nodes`` with graph inputs typed after ``inputs`` and initializers ``inits``."""
    graph = helper.make_graph(
        nodes, "test",
        [helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
         for name, v in inputs.items()],
        [helper.make_empty_tensor_value_info(name) for name in outputs],
        initializer=[numpy_helper.from_array(np.asarray(v), name)
                     for name, v in (inits or {}).items()])
    opsets = [helper.make_opsetid("", opset)]
    return helper.make_model(graph, opset_imports=opsets,
                             ir_version=helper.find_min_ir_version_for(opsets))


def run_ort(model: onnx.ModelProto, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    sess = ort.InferenceSession(model.SerializeToString(), opts,
                                providers=["CPUExecutionProvider"])
    return sess.run(None, inputs)


def run_kiln(model: onnx.ModelProto, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    mod, params = from_onnx(model)
    func = fold_constant(simplify_inference(bind_params(mod["main"], params)))
    return evaluate(func, inputs)


def check(nodes: onnx.NodeProto | list[onnx.NodeProto], inputs: dict[str, np.ndarray],
          opset: int, inits: dict[str, np.ndarray] | None = None,
          outputs: tuple[str, ...] = ("y",), rtol: float = 1e-5, atol: float = 1e-5) -> None:
    """Compare Kiln with onnxruntime on a model of ``nodes`` (a node or a list of nodes)."""
    nodes = nodes if isinstance(nodes, list) else [nodes]
    model = make_model(nodes, inputs, list(outputs), opset, inits)
    want = run_ort(model, inputs)
    got = run_kiln(model, inputs)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape, (g.shape, w.shape)
        assert g.dtype == w.dtype, (g.dtype, w.dtype)
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)


def rand(*shape: int, seed: int = 0, low: float = -2.0, high: float = 2.0) -> np.ndarray:
    """Seeded float32 uniform values in [low, high)."""
    return np.random.default_rng(seed).uniform(low, high, shape).astype(np.float32)


# ---------------------------------------------------------------------------------------------
# elementwise

UNARY = ["Relu", "Sigmoid", "Exp", "Tanh", "Erf", "Neg", "Abs", "Floor", "Ceil"]


@pytest.mark.parametrize("op", UNARY)
def test_unary(op):
    check(helper.make_node(op, ["x"], ["y"]), {"x": rand(2, 3, 4) * 3}, 13)


@pytest.mark.parametrize("op", ["Log", "Sqrt"])
def test_unary_positive(op):
    check(helper.make_node(op, ["x"], ["y"]), {"x": rand(2, 3, low=0.1, high=5)}, 13)


def test_hardswish():
    check(helper.make_node("HardSwish", ["x"], ["y"]), {"x": rand(4, 5, low=-5, high=5)}, 14)


@pytest.mark.parametrize("attrs", [{}, {"alpha": 0.3}])
def test_leaky_relu(attrs):
    check(helper.make_node("LeakyRelu", ["x"], ["y"], **attrs), {"x": rand(3, 4)}, 9)


@pytest.mark.parametrize("attrs", [{}, {"alpha": 0.3, "beta": 0.4}])
def test_hard_sigmoid(attrs):
    check(helper.make_node("HardSigmoid", ["x"], ["y"], **attrs),
          {"x": rand(3, 4, low=-5, high=5)}, 15)


@pytest.mark.parametrize("opset", [7, 10])
@pytest.mark.parametrize("attrs", [{"min": -0.5, "max": 0.7}, {"min": 0.1}, {}])
def test_clip_attrs(opset, attrs):
    check(helper.make_node("Clip", ["x"], ["y"], **attrs), {"x": rand(3, 4)}, opset)


@pytest.mark.parametrize("opset", [11, 13])
@pytest.mark.parametrize("bounds", [("lo", "hi"), ("", "hi"), ("lo",), ()])
def test_clip_inputs(opset, bounds):
    inits = {"lo": np.array(-0.5, np.float32), "hi": np.array(0.7, np.float32)}
    check(helper.make_node("Clip", ["x", *bounds], ["y"]), {"x": rand(3, 4)}, opset,
          {k: v for k, v in inits.items() if k in bounds})


def test_clip_tensor_bound():
    # A bound that is a graph input cannot be an attribute: it becomes maximum/minimum.
    check(helper.make_node("Clip", ["x", "lo"], ["y"]),
          {"x": rand(3, 4), "lo": np.array(-0.25, np.float32)}, 13)


@pytest.mark.parametrize("opset", [8, 13])
@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div", "Max", "Min"])
@pytest.mark.parametrize("shapes", [((2, 3, 4), (2, 3, 4)), ((2, 3, 4), (3, 1)), ((1, 4), (3, 1))])
def test_binary_broadcast(opset, op, shapes):
    a = rand(*shapes[0], seed=1)
    b = rand(*shapes[1], seed=2, low=0.5, high=2.0)
    check(helper.make_node(op, ["a", "b"], ["y"]), {"a": a, "b": b}, opset)


@pytest.mark.parametrize("opset", [7, 12, 15])
def test_pow(opset):
    check(helper.make_node("Pow", ["a", "b"], ["y"]),
          {"a": rand(3, 4, low=0.1, high=3), "b": rand(4, seed=1)}, opset)


def test_pow_int_exponent():
    check(helper.make_node("Pow", ["a", "b"], ["y"]), {"a": rand(3, 4)}, 13,
          {"b": np.array(2, np.int64)})


def test_integer_div_truncates():
    a = np.array([7, -7, 7, -7, 0], np.int64)
    b = np.array([2, 2, -2, -2, 3], np.int64)
    check(helper.make_node("Div", ["a", "b"], ["y"]), {"a": a, "b": b}, 13)


@pytest.mark.parametrize("op", ["Sum", "Mean", "Max", "Min"])
@pytest.mark.parametrize("count", [1, 3])
def test_variadic(op, count):
    names = [f"x{k}" for k in range(count)]
    shapes = [(2, 3, 4), (3, 4), (1, 4)][:count]
    check(helper.make_node(op, names, ["y"]),
          {n: rand(*s, seed=k) for k, (n, s) in enumerate(zip(names, shapes, strict=True))}, 9)


@pytest.mark.parametrize("to,dtype", [(TensorProto.INT32, "int32"), (TensorProto.INT64, "int64"),
                                      (TensorProto.BOOL, "bool"), (TensorProto.FLOAT, "float32"),
                                      (TensorProto.DOUBLE, "float64")])
def test_cast(to, dtype):
    check(helper.make_node("Cast", ["x"], ["y"], to=to), {"x": rand(3, 4) * 5}, 13)


def test_cast_int_to_float():
    x = np.arange(-5, 7, dtype=np.int64).reshape(3, 4)
    check(helper.make_node("Cast", ["x"], ["y"], to=TensorProto.FLOAT), {"x": x}, 9)


def test_where():
    cond = rand(3, 1, seed=3) > 0
    check(helper.make_node("Where", ["c", "a", "b"], ["y"]),
          {"c": cond, "a": rand(3, 4), "b": rand(4, seed=1)}, 9)


# ---------------------------------------------------------------------------------------------
# nn


CONV_CASES = {  # name: (data shape, weight shape, attributes)
    "basic": ((1, 3, 8, 8), (4, 3, 3, 3), {}),
    "pads": ((2, 3, 7, 9), (5, 3, 3, 3), {"pads": [1, 2, 0, 1]}),
    "strides": ((1, 3, 9, 9), (4, 3, 3, 3), {"strides": [2, 3], "pads": [1] * 4}),
    "dilations": ((1, 2, 10, 10), (3, 2, 3, 3), {"dilations": [2, 1]}),
    "group": ((1, 4, 6, 6), (6, 2, 3, 3), {"group": 2, "pads": [1] * 4}),
    "depthwise": ((1, 4, 6, 6), (4, 1, 3, 3), {"group": 4, "pads": [1] * 4}),
    "pointwise": ((1, 8, 5, 5), (3, 8, 1, 1), {"kernel_shape": [1, 1]}),
    "same_upper": ((1, 3, 7, 8), (4, 3, 4, 3), {"auto_pad": "SAME_UPPER", "strides": [2, 2]}),
    "same_lower": ((1, 3, 7, 8), (4, 3, 4, 3), {"auto_pad": "SAME_LOWER", "strides": [2, 2]}),
    "valid": ((1, 3, 7, 8), (4, 3, 3, 3), {"auto_pad": "VALID", "strides": [2, 2]}),
}


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("case", list(CONV_CASES))
def test_conv(case, bias):
    x_shape, w_shape, attrs = CONV_CASES[case]
    inits = {"w": rand(*w_shape, seed=1)}
    if bias:
        inits["b"] = rand(w_shape[0], seed=2)
    node = helper.make_node("Conv", ["x", "w"] + (["b"] if bias else []), ["y"], **attrs)
    check(node, {"x": rand(*x_shape)}, 11, inits)


CONV3D_CASES = {  # name: (data shape [N, C, D, H, W], weight shape, attributes)
    "basic": ((1, 3, 4, 6, 6), (4, 3, 3, 3, 3), {}),
    "pads": ((2, 3, 4, 5, 7), (5, 3, 3, 3, 3), {"pads": [1, 0, 2, 0, 1, 1]}),
    "strides": ((1, 3, 7, 9, 9), (4, 3, 3, 3, 3), {"strides": [2, 3, 2], "pads": [1] * 6}),
    "dilations": ((1, 2, 7, 8, 8), (3, 2, 3, 2, 3), {"dilations": [2, 1, 2], "pads": [2] * 6}),
    "group": ((1, 4, 3, 6, 6), (6, 2, 3, 3, 3), {"group": 2, "pads": [1] * 6}),
    "depthwise": ((1, 4, 5, 6, 6), (4, 1, 3, 3, 3), {"group": 4, "pads": [1] * 6}),
    "pointwise": ((1, 8, 3, 5, 5), (3, 8, 1, 1, 1), {"kernel_shape": [1, 1, 1]}),
    "pointwise_strided": ((1, 8, 5, 5, 5), (3, 8, 1, 1, 1), {"strides": [2, 2, 2]}),
    "stem": ((1, 3, 4, 16, 16), (8, 3, 3, 7, 7), {"strides": [1, 2, 2], "pads": [1, 3, 3] * 2}),
    # depth 1 or 2 with a padded 3-deep kernel (r3d_18's last stages): taps that read only
    # padding are dropped
    "depth_one": ((1, 4, 1, 4, 4), (5, 4, 3, 3, 3), {"pads": [1] * 6}),
    "depth_two_strided": ((1, 4, 2, 4, 4), (5, 4, 3, 3, 3), {"strides": [2] * 3, "pads": [1] * 6}),
    "only_padding": ((1, 2, 1, 3, 3), (3, 2, 1, 1, 1), {"pads": [2, 0, 0, 2, 0, 0]}),
    "same_upper": ((1, 3, 5, 7, 8), (4, 3, 2, 4, 3),
                   {"auto_pad": "SAME_UPPER", "strides": [2, 2, 2]}),
    "same_lower": ((1, 3, 5, 7, 8), (4, 3, 2, 4, 3),
                   {"auto_pad": "SAME_LOWER", "strides": [2, 2, 2]}),
    "valid": ((1, 3, 5, 7, 8), (4, 3, 3, 3, 3), {"auto_pad": "VALID", "strides": [2, 2, 2]}),
}


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("case", list(CONV3D_CASES))
def test_conv3d(case, bias):
    x_shape, w_shape, attrs = CONV3D_CASES[case]
    inits = {"w": rand(*w_shape, seed=1)}
    if bias:
        inits["b"] = rand(w_shape[0], seed=2)
    node = helper.make_node("Conv", ["x", "w"] + (["b"] if bias else []), ["y"], **attrs)
    check(node, {"x": rand(*x_shape)}, 11, inits, rtol=1e-4, atol=1e-4)


def test_conv3d_weight_input():
    """A weight that is a graph input, not an initializer: its depth taps are reordered by
    graph ops at run time."""
    node = helper.make_node("Conv", ["x", "w"], ["y"], pads=[1] * 6, strides=[2, 1, 1])
    check(node, {"x": rand(1, 3, 4, 5, 5), "w": rand(4, 3, 3, 3, 3, seed=1)}, 11,
          rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("opset", [9, 13])
@pytest.mark.parametrize("attrs,c_shape", [
    ({}, (5,)),
    ({"transA": 1}, (3, 5)),
    ({"transB": 1, "alpha": 0.5, "beta": 2.0}, (1, 5)),
    ({"transA": 1, "transB": 1, "beta": 0.0}, (5,)),
    ({"alpha": 2.0}, ()),
    ({}, None),
])
def test_gemm(opset, attrs, c_shape):
    if c_shape is None and opset < 11:
        pytest.skip("C is optional only from opset 11")
    a = rand(4, 3) if attrs.get("transA") else rand(3, 4)
    b = rand(5, 4, seed=1) if attrs.get("transB") else rand(4, 5, seed=1)
    inits = {"b": b}
    inputs = ["a", "b"]
    if c_shape is not None:
        inits["c"] = rand(*c_shape, seed=2)
        inputs.append("c")
    check(helper.make_node("Gemm", inputs, ["y"], **attrs), {"a": a}, opset, inits)


@pytest.mark.parametrize("a_shape,b_shape", [
    ((3, 4), (4, 5)), ((4,), (4, 5)), ((3, 4), (4,)), ((4,), (4,)), ((2, 3, 4), (4, 5)),
    ((2, 1, 3, 4), (3, 4, 5)), ((5,), (2, 5, 3)),
])
@pytest.mark.parametrize("weight", [False, True])
def test_matmul(a_shape, b_shape, weight):
    a, b = rand(*a_shape), rand(*b_shape, seed=1)
    node = helper.make_node("MatMul", ["a", "b"], ["y"])
    if weight:
        check(node, {"a": a}, 13, {"b": b})
    else:
        check(node, {"a": a, "b": b}, 13)


@pytest.mark.parametrize("opset", [7, 9, 14, 15])
def test_batch_norm(opset):
    c = 4
    inits = {"s": rand(c, seed=1), "bias": rand(c, seed=2), "mean": rand(c, seed=3),
             "var": rand(c, seed=4, low=0.5, high=2.0)}
    node = helper.make_node("BatchNormalization", ["x", "s", "bias", "mean", "var"], ["y"],
                            epsilon=1e-3)
    check(node, {"x": rand(2, c, 3, 5)}, opset, inits)
    check(node, {"x": rand(2, c, 2, 3, 5)}, opset, inits)  # BatchNorm3d: [N, C, D, H, W]


POOL_CASES = {
    "basic": ({"kernel_shape": [3, 3], "strides": [2, 2]}, (1, 2, 9, 9)),
    "pads": ({"kernel_shape": [3, 2], "pads": [1, 0, 1, 1]}, (2, 3, 6, 7)),
    "ceil": ({"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}, (1, 2, 8, 8)),
    "ceil_drop": ({"kernel_shape": [2, 2], "strides": [2, 2], "pads": [1, 1, 1, 1],
                   "ceil_mode": 1}, (1, 1, 5, 5)),
    "ceil_pads": ({"kernel_shape": [3, 3], "strides": [3, 2], "pads": [1, 1, 0, 1],
                   "ceil_mode": 1}, (1, 2, 10, 11)),
    "same_upper": ({"kernel_shape": [3, 2], "strides": [2, 2], "auto_pad": "SAME_UPPER"},
                   (1, 2, 7, 8)),
    "same_lower": ({"kernel_shape": [2, 3], "strides": [2, 2], "auto_pad": "SAME_LOWER"},
                   (1, 2, 7, 8)),
    "valid": ({"kernel_shape": [2, 2], "strides": [2, 2], "auto_pad": "VALID"}, (1, 2, 7, 7)),
}


POOL3D_CASES = {
    "basic": ({"kernel_shape": [3, 3, 3], "strides": [2, 2, 2]}, (1, 2, 5, 9, 9)),
    "pads": ({"kernel_shape": [2, 3, 2], "pads": [1, 1, 0, 0, 1, 1]}, (2, 3, 4, 6, 7)),
    "ceil_pads": ({"kernel_shape": [3, 3, 3], "strides": [2, 3, 2], "pads": [1, 1, 0, 0, 0, 1],
                   "ceil_mode": 1}, (1, 2, 6, 10, 11)),
    "same_upper": ({"kernel_shape": [2, 3, 2], "strides": [2, 2, 2], "auto_pad": "SAME_UPPER"},
                   (1, 2, 5, 7, 8)),
}


@pytest.mark.parametrize("count_include_pad", [0, 1])
@pytest.mark.parametrize("case", list(POOL3D_CASES))
def test_pool3d(case, count_include_pad):
    attrs, shape = POOL3D_CASES[case]
    x = {"x": rand(*shape)}
    check(helper.make_node("AveragePool", ["x"], ["y"], count_include_pad=count_include_pad,
                           **attrs), x, 11)
    if count_include_pad == 0:
        check(helper.make_node("MaxPool", ["x"], ["y"], **attrs), x, 12)


@pytest.mark.parametrize("case", list(POOL_CASES))
def test_max_pool(case):
    attrs, shape = POOL_CASES[case]
    check(helper.make_node("MaxPool", ["x"], ["y"], **attrs), {"x": rand(*shape)}, 12)


def test_max_pool_dilations():
    attrs = {"kernel_shape": [2, 2], "dilations": [2, 2], "pads": [1, 1, 1, 1]}
    check(helper.make_node("MaxPool", ["x"], ["y"], **attrs), {"x": rand(1, 2, 7, 7)}, 12)


def test_max_pool_opset8():
    attrs = {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}
    check(helper.make_node("MaxPool", ["x"], ["y"], **attrs), {"x": rand(1, 2, 8, 8)}, 8)


@pytest.mark.parametrize("count_include_pad", [0, 1])
@pytest.mark.parametrize("case", list(POOL_CASES))
def test_avg_pool(case, count_include_pad):
    attrs, shape = POOL_CASES[case]
    check(helper.make_node("AveragePool", ["x"], ["y"], count_include_pad=count_include_pad,
                           **attrs), {"x": rand(*shape)}, 11)


@pytest.mark.parametrize("op", ["GlobalAveragePool", "GlobalMaxPool"])
def test_global_pool(op):
    check(helper.make_node(op, ["x"], ["y"]), {"x": rand(2, 3, 5, 4)}, 9)


@pytest.mark.parametrize("attrs", [{"size": 3}, {"size": 5, "alpha": 1e-2, "beta": 0.5,
                                                 "bias": 2.0}, {"size": 1}])
def test_lrn(attrs):
    check(helper.make_node("LRN", ["x"], ["y"], **attrs), {"x": rand(2, 7, 3, 3)}, 9)


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("opset,axis,shape", [
    (9, None, (3, 5)), (9, None, (2, 3, 4)), (11, 2, (2, 3, 4)), (11, -1, (2, 3, 4)),
    (11, 0, (2, 3)), (13, None, (2, 3, 4)), (13, 1, (2, 3, 4)), (13, -3, (2, 3, 4)),
])
def test_softmax(op, opset, axis, shape):
    attrs = {} if axis is None else {"axis": axis}
    check(helper.make_node(op, ["x"], ["y"], **attrs), {"x": rand(*shape) * 3}, opset)


@pytest.mark.parametrize("opset", [7, 10, 12, 13])
def test_dropout(opset):
    node = helper.make_node("Dropout", ["x"], ["y", "mask"] if opset >= 10 else ["y"], ratio=0.3) \
        if opset < 12 else helper.make_node("Dropout", ["x", "r"], ["y", "mask"])
    inits = {"r": np.array(0.3, np.float32)} if opset >= 12 else None
    check(node, {"x": rand(2, 5)}, opset, inits)


# ---------------------------------------------------------------------------------------------
# tensor manipulation


def test_identity():
    check(helper.make_node("Identity", ["x"], ["y"]), {"x": rand(2, 3)}, 13)


@pytest.mark.parametrize("opset,target,attrs", [
    (9, [0, -1], {}), (13, [2, 2, -1], {}), (13, [-1], {}), (14, [0, 3, 4], {"allowzero": 0}),
    (14, [6, 4], {"allowzero": 1}),
])
def test_reshape(opset, target, attrs):
    check(helper.make_node("Reshape", ["x", "s"], ["y"], **attrs), {"x": rand(2, 3, 4)}, opset,
          {"s": np.array(target, np.int64)})


@pytest.mark.parametrize("opset,axis", [(9, 0), (9, 1), (9, 3), (13, 2), (13, -1)])
def test_flatten(opset, axis):
    check(helper.make_node("Flatten", ["x"], ["y"], axis=axis), {"x": rand(2, 3, 4)}, opset)


@pytest.mark.parametrize("perm", [None, [0, 2, 1], [2, 0, 1]])
def test_transpose(perm):
    attrs = {} if perm is None else {"perm": perm}
    check(helper.make_node("Transpose", ["x"], ["y"], **attrs), {"x": rand(2, 3, 4)}, 13)


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_concat(axis):
    shapes = [[2, 3, 4] for _ in range(3)]
    for k, s in enumerate(shapes):
        s[axis] = k + 1
    inputs = {f"x{k}": rand(*s, seed=k) for k, s in enumerate(shapes)}
    check(helper.make_node("Concat", list(inputs), ["y"], axis=axis), inputs, 11)


@pytest.mark.parametrize("opset,axes", [(11, [1]), (11, [-1, 1]), (11, None), (13, [1, 3]),
                                        (13, None)])
def test_squeeze(opset, axes):
    x = {"x": rand(2, 1, 3, 1)}
    if opset < 13:
        attrs = {} if axes is None else {"axes": axes}
        check(helper.make_node("Squeeze", ["x"], ["y"], **attrs), x, opset)
    elif axes is None:
        check(helper.make_node("Squeeze", ["x"], ["y"]), x, opset)
    else:
        check(helper.make_node("Squeeze", ["x", "a"], ["y"]), x, opset,
              {"a": np.array(axes, np.int64)})


@pytest.mark.parametrize("opset,axes", [(9, [0]), (11, [0, 3]), (11, [-1]), (13, [1]),
                                        (13, [-1, 0])])
def test_unsqueeze(opset, axes):
    x = {"x": rand(2, 3)}
    if opset < 13:
        check(helper.make_node("Unsqueeze", ["x"], ["y"], axes=axes), x, opset)
    else:
        check(helper.make_node("Unsqueeze", ["x", "a"], ["y"]), x, opset,
              {"a": np.array(axes, np.int64)})


@pytest.mark.parametrize("opset,attrs", [(9, {}), (15, {"start": 1}), (15, {"end": -1}),
                                         (15, {"start": -2, "end": 10})])
def test_shape(opset, attrs):
    check(helper.make_node("Shape", ["x"], ["y"], **attrs), {"x": rand(2, 3, 4)}, opset)


def test_slice_attrs():
    node = helper.make_node("Slice", ["x"], ["y"], starts=[1, -3], ends=[1000, -1], axes=[0, 2])
    check(node, {"x": rand(3, 4, 5)}, 9)


@pytest.mark.parametrize("starts,ends,axes,steps", [
    ([1], [3], None, None),
    ([0, 1], [2, 1000], [0, 2], None),
    ([-1], [-1000], [1], [-1]),
    ([4, 3], [0, -100], [2, 1], [-2, -1]),
    ([10], [2], [2], [-3]),
    ([2], [1], [1], [1]),
    ([-2, 0], [np.iinfo(np.int64).max, 5], [-1, 0], [1, 2]),
])
@pytest.mark.parametrize("opset", [10, 13])
def test_slice_inputs(opset, starts, ends, axes, steps):
    inits = {"st": np.array(starts, np.int64), "en": np.array(ends, np.int64)}
    names = ["x", "st", "en"]
    if axes is not None or steps is not None:
        inits["ax"] = np.array(axes, np.int64)
        names.append("ax")
    if steps is not None:
        inits["sp"] = np.array(steps, np.int64)
        names.append("sp")
    check(helper.make_node("Slice", names, ["y"]), {"x": rand(3, 4, 5)}, opset, inits)


@pytest.mark.parametrize("axis,indices", [(0, [2, 0]), (1, [[0, -1], [1, 2]]), (-1, 3),
                                          (2, [-5, 4])])
def test_gather(axis, indices):
    check(helper.make_node("Gather", ["x", "i"], ["y"], axis=axis), {"x": rand(3, 4, 5)}, 13,
          {"i": np.array(indices, np.int64)})


@pytest.mark.parametrize("value", [None, np.array([1.5], np.float32), np.array([3], np.int64)])
def test_constant_of_shape(value):
    attrs = {} if value is None else {"value": numpy_helper.from_array(value)}
    check(helper.make_node("ConstantOfShape", ["s"], ["y"], **attrs), {}, 13,
          {"s": np.array([2, 3], np.int64)})


@pytest.mark.parametrize("attr,value", [
    ("value", numpy_helper.from_array(np.arange(4, dtype=np.float32).reshape(1, 4))),
    ("value_float", 2.5), ("value_floats", [1.0, 2.0, 3.0, 4.0]), ("value_int", 3),
    ("value_ints", [1, 2, 3, 4]),
])
def test_constant(attr, value):
    nodes = [helper.make_node("Constant", [], ["c"], **{attr: value}),
             helper.make_node("Identity", ["c"], ["y"])]
    check(nodes, {}, 13)


def test_constant_used_by_add():
    nodes = [helper.make_node("Constant", [], ["c"], value_float=2.5),
             helper.make_node("Add", ["x", "c"], ["y"])]
    check(nodes, {"x": rand(2, 3)}, 13)


@pytest.mark.parametrize("x_shape,target", [((3, 1), (2, 3, 4)), ((1, 4), (3, 1)),
                                            ((2, 3), (2, 3)), ((3,), (1,))])
def test_expand(x_shape, target):
    check(helper.make_node("Expand", ["x", "s"], ["y"]), {"x": rand(*x_shape)}, 13,
          {"s": np.array(target, np.int64)})


def test_shape_computation_chain():
    # The Shape → Gather → Unsqueeze → Concat → Reshape idiom of exported PyTorch models.
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
        helper.make_node("Unsqueeze", ["n", "ax"], ["n1"]),
        helper.make_node("Concat", ["n1", "minus1"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["y"]),
    ]
    inits = {"zero": np.array(0, np.int64), "ax": np.array([0], np.int64),
             "minus1": np.array([-1], np.int64)}
    check(nodes, {"x": rand(2, 3, 4)}, 13, inits)


# ---------------------------------------------------------------------------------------------
# reductions


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin"])
@pytest.mark.parametrize("axes", [[1], [0, -1], None])
@pytest.mark.parametrize("keepdims", [0, 1])
def test_reduce_attr_axes(op, axes, keepdims):
    attrs = {"keepdims": keepdims} | ({} if axes is None else {"axes": axes})
    check(helper.make_node(op, ["x"], ["y"], **attrs), {"x": rand(2, 3, 4)}, 11)


@pytest.mark.parametrize("op,opset", [("ReduceSum", 13), ("ReduceMean", 18), ("ReduceMax", 18),
                                      ("ReduceMin", 18)])
@pytest.mark.parametrize("axes,noop", [([1], 0), ([-1, 0], 0), (None, 0), (None, 1)])
@pytest.mark.parametrize("keepdims", [0, 1])
def test_reduce_input_axes(op, opset, axes, noop, keepdims):
    node = helper.make_node(op, ["x"] + ([] if axes is None else ["a"]), ["y"],
                            keepdims=keepdims, noop_with_empty_axes=noop)
    inits = None if axes is None else {"a": np.array(axes, np.int64)}
    check(node, {"x": rand(2, 3, 4)}, opset, inits)


# ---------------------------------------------------------------------------------------------
# a small multi-node graph


def test_lcnet_like_block():
    """PP-LCNet's pattern at opset 15: depthwise conv + BN + HardSwish, a squeeze-excitation
    block (GlobalAveragePool, 1x1 convs, HardSigmoid, Mul), Flatten, MatMul + Add, Softmax."""
    c = 8
    nodes = [
        helper.make_node("Conv", ["x", "w0"], ["c0"], pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("BatchNormalization", ["c0", "g", "b", "m", "v"], ["n0"]),
        helper.make_node("HardSwish", ["n0"], ["h0"]),
        helper.make_node("Conv", ["h0", "dw"], ["c1"], pads=[1, 1, 1, 1], group=c),
        helper.make_node("GlobalAveragePool", ["c1"], ["p"]),
        helper.make_node("Conv", ["p", "se1", "se1b"], ["s1"]),
        helper.make_node("Relu", ["s1"], ["r1"]),
        helper.make_node("Conv", ["r1", "se2", "se2b"], ["s2"]),
        helper.make_node("HardSigmoid", ["s2"], ["hs"], alpha=1 / 6, beta=0.5),
        helper.make_node("Mul", ["c1", "hs"], ["se"]),
        helper.make_node("GlobalAveragePool", ["se"], ["gp"]),
        helper.make_node("Flatten", ["gp"], ["f"]),
        helper.make_node("MatMul", ["f", "fc"], ["mm"]),
        helper.make_node("Add", ["mm", "fcb"], ["logits"]),
        helper.make_node("Softmax", ["logits"], ["y"]),
    ]
    inits = {"w0": rand(c, 3, 3, 3, seed=1) * 0.3, "g": rand(c, seed=2), "b": rand(c, seed=3),
             "m": rand(c, seed=4), "v": rand(c, seed=5, low=0.5, high=2),
             "dw": rand(c, 1, 3, 3, seed=6), "se1": rand(2, c, 1, 1, seed=7),
             "se1b": rand(2, seed=8), "se2": rand(c, 2, 1, 1, seed=9), "se2b": rand(c, seed=10),
             "fc": rand(c, 10, seed=11), "fcb": rand(10, seed=12)}
    check(nodes, {"x": rand(2, 3, 16, 16)}, 15, inits, outputs=("y", "logits"))
