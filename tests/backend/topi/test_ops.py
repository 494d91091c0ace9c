"""Every op the models need, compiled for each target (c, llvm), against onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

F32 = TensorProto.FLOAT


def single_op(op: str, inputs: dict[str, np.ndarray], out_shape=None, opset: int = 17,
              consts: dict[str, np.ndarray] | None = None, n_out: int = 1, **attrs):
    """A one-node model: ``inputs`` are graph inputs, ``consts`` initializers (in that order)."""
    consts = consts or {}
    names = list(inputs) + list(consts)
    outs = [f"y{i}" for i in range(n_out)]
    node = helper.make_node(op, names, outs, name=f"{op.lower()}_node", **attrs)
    graph = helper.make_graph(
        [node], f"single_{op}",
        [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
         for k, v in inputs.items()],
        [helper.make_tensor_value_info(o, F32 if out_shape is None else out_shape[1], None)
         for o in outs],
        [numpy_helper.from_array(v, k) for k, v in consts.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def rand(*shape, seed=0, dtype="float32"):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


X4 = {"x": rand(1, 3, 10, 10)}
X2 = {"x": rand(4, 6)}

CASES = [
    # elementwise
    ("Relu", X4, {}, {}),
    ("Sigmoid", X4, {}, {}),
    ("HardSigmoid", X4, {}, {"alpha": 0.3, "beta": 0.4}),
    ("HardSwish", {"x": rand(2, 8) * 4}, {}, {}),
    ("LeakyRelu", X2, {}, {"alpha": 0.2}),
    ("Exp", X2, {}, {}),
    ("Tanh", X2, {}, {}),
    ("Erf", X2, {}, {}),
    ("Neg", X2, {}, {}),
    ("Abs", X2, {}, {}),
    ("Sqrt", {"x": np.abs(rand(4, 6)) + 0.1}, {}, {}),
    ("Log", {"x": np.abs(rand(4, 6)) + 0.1}, {}, {}),
    ("Round", {"x": np.array([[-2.5, -1.5, -0.5, 0.5, 1.5, 2.5], [0.49, -0.51, 1e8, 3.7, -3.2,
                                                                   7.5]], "float32")}, {}, {}),
    ("Clip", X2, {"min": np.array(-0.5, "float32"), "max": np.array(0.7, "float32")}, {}),
    # broadcast
    ("Add", {"a": rand(2, 3, 4), "b": rand(3, 1, seed=1)}, {}, {}),
    ("Sub", {"a": rand(2, 3, 4), "b": rand(4, seed=1)}, {}, {}),
    ("Mul", {"a": rand(1, 3, 1, 1), "b": rand(2, 3, 4, 5, seed=1)}, {}, {}),
    ("Div", {"a": rand(2, 3), "b": np.abs(rand(2, 3, seed=1)) + 0.5}, {}, {}),
    ("Max", {"a": rand(2, 3), "b": rand(2, 3, seed=1)}, {}, {}),
    ("Sum", {"a": rand(2, 3), "b": rand(2, 3, seed=1), "c": rand(2, 3, seed=2)}, {}, {}),
    # nn
    ("Conv", X4, {"w": rand(4, 3, 3, 3, seed=1), "b": rand(4, seed=2)},
     {"pads": [1, 1, 1, 1]}),
    ("Conv", X4, {"w": rand(6, 1, 3, 3, seed=1)}, {"group": 3, "strides": [2, 2]}),
    # depthwise in NCHWc, padded (the llvm target reads the input through the pad's guard)
    ("Conv", {"x": rand(1, 16, 11, 9)}, {"w": rand(16, 1, 3, 3, seed=1)},
     {"group": 16, "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ("Conv", {"x": rand(1, 16, 7, 30)}, {"w": rand(16, 1, 3, 3, seed=1)},
     {"group": 16, "pads": [1, 2, 1, 0]}),
    # K-blocked with 128-bit vectors (blocks of 8: 4 input blocks a K-block, bands of 4 rows)
    ("Conv", {"x": rand(1, 256, 16, 5)}, {"w": rand(32, 256, 3, 3, seed=1), "b": rand(32, seed=2)},
     {"pads": [1, 1, 1, 1]}),
    ("Conv", X4, {"w": rand(4, 3, 3, 3, seed=1)}, {"dilations": [2, 2], "pads": [2, 1, 0, 1]}),
    ("Conv", X4, {"w": rand(4, 3, 3, 3, seed=1)}, {"auto_pad": "SAME_UPPER", "strides": [2, 2]}),
    ("Gemm", {"a": rand(3, 5)}, {"b": rand(4, 5, seed=1), "c": rand(4, seed=2)},
     {"transB": 1, "alpha": 0.5, "beta": 2.0}),
    ("MatMul", {"a": rand(2, 3, 5)}, {"b": rand(5, 4, seed=1)}, {}),
    ("MaxPool", X4, {}, {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ("MaxPool", X4, {}, {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}),
    ("AveragePool", X4, {}, {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ("AveragePool", X4, {}, {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1],
                             "count_include_pad": 1}),
    ("GlobalAveragePool", X4, {}, {}),
    ("GlobalMaxPool", X4, {}, {}),
    # global pools over one and three spatial axes (N, C, L) / (N, C, D, H, W)
    ("GlobalAveragePool", {"x": rand(2, 5, 7)}, {}, {}),
    ("GlobalMaxPool", {"x": rand(2, 5, 7)}, {}, {}),
    ("GlobalAveragePool", {"x": rand(1, 3, 4, 5, 6)}, {}, {}),
    ("GlobalMaxPool", {"x": rand(1, 3, 4, 5, 6)}, {}, {}),
    ("LRN", {"x": rand(1, 7, 5, 5)}, {}, {"size": 3, "alpha": 1e-2, "beta": 0.75, "bias": 1.0}),
    ("Softmax", {"x": rand(2, 3, 7)}, {}, {"axis": -1}),
    ("LogSoftmax", {"x": rand(3, 7)}, {}, {"axis": 1}),
    ("BatchNormalization", X4, {"s": rand(3, seed=1), "b": rand(3, seed=2),
                                "m": rand(3, seed=3), "v": np.abs(rand(3, seed=4)) + 0.5}, {}),
    # transforms
    ("Reshape", X4, {"shape": np.array([1, -1, 20], "int64")}, {}),
    ("Flatten", X4, {}, {"axis": 1}),
    ("Transpose", X4, {}, {"perm": [0, 2, 3, 1]}),
    ("Concat", {"a": rand(1, 2, 3), "b": rand(1, 4, 3, seed=1)}, {}, {"axis": 1}),
    ("Slice", X4, {"starts": np.array([1, 8], "int64"), "ends": np.array([3, 1], "int64"),
                   "axes": np.array([1, 3], "int64"), "steps": np.array([1, -2], "int64")}, {}),
    ("Gather", {"x": rand(5, 4)}, {"i": np.array([[0, -1], [3, 2]], "int64")}, {"axis": 0}),
    ("Squeeze", {"x": rand(1, 3, 1, 4)}, {"axes": np.array([0, 2], "int64")}, {}),
    ("Unsqueeze", {"x": rand(3, 4)}, {"axes": np.array([0, 3], "int64")}, {}),
    ("ReduceMean", {"x": rand(2, 3, 4)}, {"axes": np.array([1], "int64")}, {"keepdims": 1}),
    ("ReduceSum", {"x": rand(2, 3, 4)}, {"axes": np.array([0, 2], "int64")}, {"keepdims": 0}),
    # openWakeWord's max of its whole log-mel output, and rows of 31: scalar min / max chains
    # (rows under two vector blocks) whose row loop LLVM keeps rolled
    ("ReduceMax", {"x": rand(1, 1, 8, 32)}, {}, {"keepdims": 0}),
    ("ReduceMin", {"x": rand(8, 31)}, {}, {"keepdims": 1}),
    # inception_v1's layers that no other c-target model of tests/models/driver/test_models.py has:
    # its final AveragePool, padded at the end only (7x7, pads 0,0,1,1), and its dense 5x5
    # stride-1 convolutions
    ("AveragePool", {"x": rand(1, 5, 7, 7)}, {}, {"kernel_shape": [7, 7], "pads": [0, 0, 1, 1]}),
    ("Conv", {"x": rand(1, 16, 12, 12)}, {"w": rand(24, 16, 5, 5, seed=1), "b": rand(24, seed=2)},
     {"pads": [2, 2, 2, 2]}),
]


@pytest.mark.parametrize("op,inputs,consts,attrs", CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_single_op_matches_onnxruntime(check_model, op, inputs, consts, attrs):
    opset = 18 if op.startswith("Reduce") else 17  # reduce axes became an input at 18
    check_model(single_op(op, inputs, consts=consts, opset=opset, **attrs), inputs)


@pytest.mark.parametrize("opset", [9, 11, 13])
def test_softmax_opset_semantics(check_model, opset):
    """Before opset 13 Softmax flattens to 2-D at ``axis``; from 13 it works along ``axis``."""
    x = {"x": rand(2, 3, 4)}
    check_model(single_op("Softmax", x, opset=opset, axis=1), x)


def test_fused_chain(check_model):
    """conv → bias → relu → add residual → relu: one fused kernel, in place."""
    x = rand(1, 4, 8, 8)
    w = rand(4, 4, 3, 3, seed=1)
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("Add", ["r", "x"], ["s"]),
        helper.make_node("Relu", ["s"], ["y0"]),
    ]
    graph = helper.make_graph(
        nodes, "chain", [helper.make_tensor_value_info("x", F32, x.shape)],
        [helper.make_tensor_value_info("y0", F32, None)],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(rand(4, seed=2), "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    check_model(model, {"x": x})


@pytest.mark.parametrize("cin,cout,size,stride,residual", [
    (16, 32, 7, 1, True),    # 1×1 over a 7×7 plane: register blocks that cross rows
    (24, 16, 13, 1, False),  # 169 pixels, the last block shifted back
    (1024, 32, 7, 1, False),  # K-blocked (weights of a channel block over 64 KiB)
    (32, 32, 14, 2, False),  # strided: a subsampled copy of the input, stride 1 over it
    (24, 48, 13, 2, False),  # odd plane: 7×7 of every other pixel
    (1024, 32, 14, 2, False),  # strided and K-blocked
])
def test_pointwise_conv_plane_blocks(check_model, cin, cout, size, stride, residual):
    """1×1 convs (+ bias, relu, residual add) whose register blocks run over the flattened
    output plane (docs/decisions/003), against onnxruntime."""
    x = rand(1, cin, size, size)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], strides=[stride, stride]),
             helper.make_node("Relu", ["c"], ["r"])]
    inputs = {"x": x}
    if residual:
        inputs["s"] = rand(1, cout, size, size, seed=3)
        nodes.append(helper.make_node("Add", ["r", "s"], ["y0"]))
    else:
        nodes[-1].output[0] = "y0"
    graph = helper.make_graph(
        nodes, "pointwise", [helper.make_tensor_value_info(k, F32, v.shape)
                             for k, v in inputs.items()],
        [helper.make_tensor_value_info("y0", F32, None)],
        [numpy_helper.from_array(rand(cout, cin, 1, 1, seed=1) * 0.1, "w"),
         numpy_helper.from_array(rand(cout, seed=2), "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    check_model(model, inputs)


def _three_vector_stage(channels: int, size: int):
    """MobileNetV2's narrow stage: 1×1 conv → depthwise 3×3 → residual add → 1×1 conv."""
    w = {"w1": rand(channels, 16, 1, 1, seed=1) * 0.3, "b1": rand(channels, seed=2),
         "wd": rand(channels, 1, 3, 3, seed=3) * 0.3, "w2": rand(32, channels, 1, 1, seed=4) * 0.3}
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c"]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Conv", ["r", "wd"], ["d"], pads=[1, 1, 1, 1], group=channels),
             helper.make_node("Add", ["d", "r"], ["s"]),
             helper.make_node("Conv", ["s", "w2"], ["y0"])]
    graph = helper.make_graph(
        nodes, "stage", [helper.make_tensor_value_info("x", F32, (1, 16, size, size))],
        [helper.make_tensor_value_info("y0", F32, None)],
        [numpy_helper.from_array(v, k) for k, v in w.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model, {"x": rand(1, 16, size, size)}


@pytest.mark.parametrize("size", [7, 13])
def test_three_vector_blocks(check_model, size):
    """12 channels: blocks of three 4-float vectors with SSE2's 16 registers (plain x86 llvm
    and c targets; docs/decisions/003), against onnxruntime."""
    check_model(*_three_vector_stage(12, size))


@pytest.mark.parametrize("target", ["llvm -mcpu=haswell", "c -mcpu=haswell"])
def test_three_vector_blocks_avx2(tmp_path, target):
    """24 channels on AVX2 (MobileNetV2's 24-channel stage): NCHW24c, register blocks of 4
    pixels × 3 ymm, against onnxruntime."""
    from backend_helpers import assert_close_to_reference, compile_and_run, run_onnxruntime

    model, inputs = _three_vector_stage(24, 14)
    assert_close_to_reference(compile_and_run(model, inputs, tmp_path, target),
                              run_onnxruntime(model, inputs), 1e-4)


@pytest.mark.parametrize("cout,size,kernel,pad", [
    (32, 17, 3, 1),  # MobileNetV2's stem, a small plane
    (64, 19, 3, 0),  # SqueezeNet's (unpadded)
    (16, 23, 7, 3),  # resnet50's 7×7
])
def test_image_layer_conv(check_model, cout, size, kernel, pad):
    """A stride-2 first layer over a 3-channel image (read as NCHW1c, taps unrolled) and its
    blocked output unblocked to NCHW (``layout_unblock``), against onnxruntime
    (docs/decisions/003)."""
    x = rand(1, 3, size, size)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], strides=[2, 2], pads=[pad] * 4),
             helper.make_node("Relu", ["c"], ["y0"])]
    graph = helper.make_graph(
        nodes, "stem", [helper.make_tensor_value_info("x", F32, x.shape)],
        [helper.make_tensor_value_info("y0", F32, None)],
        [numpy_helper.from_array(rand(cout, 3, kernel, kernel, seed=1) * 0.2, "w"),
         numpy_helper.from_array(rand(cout, seed=2), "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    check_model(model, {"x": x})
