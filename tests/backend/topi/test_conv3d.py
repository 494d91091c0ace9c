"""3-D convolutions, transposed convolutions, pools and batch norms (video models:
torchvision's r3d_18) compiled for each target (c, llvm) against onnxruntime: single ops at a
fixed shape, a residual block with a symbolic batch through the VM and static, symbolic
heights and widths; the 3-D conv runs the blocked 2-D kernel (docs/decisions/048)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from backend_helpers import assert_close_to_reference, run_onnxruntime
from onnx import TensorProto, helper, numpy_helper
from test_ops import rand, single_op

import kiln
from kiln.driver.build_module import optimize, primitive_calls
from kiln.frontend import from_onnx
from kiln.relay.graph import Call, post_order
from kiln.target import Target
from kiln.vm import VirtualMachine

CASES = [  # (op, inputs, initializers, attributes)
    # r3d_18's stem: 3 channels, a (3, 7, 7) window, stride (1, 2, 2), bias
    ("Conv", {"x": rand(1, 3, 4, 12, 12)}, {"w": rand(8, 3, 3, 7, 7, seed=1),
                                            "b": rand(8, seed=2)},
     {"strides": [1, 2, 2], "pads": [1, 3, 3, 1, 3, 3]}),
    # a 3x3x3 conv over 16 blocked channels, and over a depth of 1 (only the centre tap reads)
    ("Conv", {"x": rand(1, 16, 4, 6, 6)}, {"w": rand(32, 16, 3, 3, 3, seed=1)},
     {"pads": [1] * 6}),
    ("Conv", {"x": rand(1, 16, 1, 4, 4)}, {"w": rand(16, 16, 3, 3, 3, seed=1),
                                           "b": rand(16, seed=2)}, {"pads": [1] * 6}),
    # r3d_18's downsample: 1x1x1 stride 2
    ("Conv", {"x": rand(1, 16, 4, 6, 6)}, {"w": rand(32, 16, 1, 1, 1, seed=1)},
     {"strides": [2, 2, 2]}),
    ("Conv", {"x": rand(1, 8, 5, 7, 7)}, {"w": rand(8, 2, 3, 3, 3, seed=1)},
     {"group": 4, "dilations": [2, 1, 1], "pads": [2, 1, 1, 2, 1, 1]}),
    ("Conv", {"x": rand(1, 16, 3, 6, 6)}, {"w": rand(16, 1, 3, 3, 3, seed=1)},
     {"group": 16, "pads": [1, 1, 1, 0, 1, 1]}),
    ("Conv", {"x": rand(1, 4, 5, 7, 8)}, {"w": rand(6, 4, 2, 3, 3, seed=1)},
     {"auto_pad": "SAME_UPPER", "strides": [2, 2, 2]}),
    # a 3-D upsampling: stride 2, pads, output_padding, bias; and grouped
    ("ConvTranspose", {"x": rand(1, 8, 3, 4, 5)}, {"w": rand(8, 4, 3, 3, 3, seed=1),
                                                   "b": rand(4, seed=2)},
     {"strides": [2, 2, 2], "pads": [1] * 6, "output_padding": [1, 1, 0]}),
    ("ConvTranspose", {"x": rand(1, 8, 2, 3, 3)}, {"w": rand(8, 2, 2, 2, 2, seed=1)},
     {"strides": [2, 2, 2], "group": 2}),
    ("MaxPool", {"x": rand(1, 3, 6, 10, 11)}, {},
     {"kernel_shape": [3, 3, 3], "strides": [2, 3, 2], "pads": [1, 1, 0, 0, 0, 1],
      "ceil_mode": 1}),
    ("AveragePool", {"x": rand(1, 3, 6, 10, 11)}, {},
     {"kernel_shape": [3, 3, 2], "strides": [2, 2, 2], "pads": [1, 1, 1, 1, 1, 0],
      "count_include_pad": 0, "ceil_mode": 1}),
    ("AveragePool", {"x": rand(1, 3, 5, 7, 7)}, {},
     {"kernel_shape": [2, 3, 3], "pads": [1, 1, 1, 0, 1, 1], "count_include_pad": 1}),
    ("BatchNormalization", {"x": rand(2, 3, 4, 5, 6)},
     {"s": rand(3, seed=1), "b": rand(3, seed=2), "m": rand(3, seed=3),
      "v": np.abs(rand(3, seed=4)) + 0.5}, {}),
]


@pytest.mark.parametrize("op,inputs,consts,attrs", CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_3d_op_matches_onnxruntime(check_model, op, inputs, consts, attrs):
    check_model(single_op(op, inputs, consts=consts, **attrs), inputs)


def _const(name: str, *shape: int, seed: int) -> onnx.TensorProto:
    return numpy_helper.from_array(rand(*shape, seed=seed) * 0.3, name)


def _residual_block() -> onnx.ModelProto:
    """r3d_18 in small: stem conv + BatchNorm3d + ReLU, a 3-D max pool, a residual pair of
    3x3x3 convs, a strided 3x3x3 conv beside a 1x1x1 downsample, a global average pool;
    ``x[batch, 3, 4, 12, 12]``."""
    nodes = [
        helper.make_node("Conv", ["x", "w0"], ["c0"], strides=[1, 2, 2], pads=[1, 3, 3] * 2),
        helper.make_node("BatchNormalization", ["c0", "s", "bb", "m", "v"], ["n0"]),
        helper.make_node("Relu", ["n0"], ["r0"]),
        helper.make_node("MaxPool", ["r0"], ["p0"], kernel_shape=[1, 3, 3], strides=[1, 2, 2],
                         pads=[0, 1, 1] * 2),
        helper.make_node("Conv", ["p0", "w1", "b1"], ["c1"], pads=[1] * 6),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1] * 6),
        helper.make_node("Add", ["c2", "p0"], ["a2"]),
        helper.make_node("Relu", ["a2"], ["r2"]),
        helper.make_node("Conv", ["r2", "w3", "b3"], ["c3"], strides=[2] * 3, pads=[1] * 6),
        helper.make_node("Conv", ["r2", "wd"], ["d3"], strides=[2] * 3),
        helper.make_node("Add", ["c3", "d3"], ["a3"]),
        helper.make_node("Relu", ["a3"], ["r3"]),
        helper.make_node("GlobalAveragePool", ["r3"], ["y"]),
    ]
    inits = [_const("w0", 16, 3, 3, 7, 7, seed=1), _const("s", 16, seed=2),
             _const("bb", 16, seed=3), _const("m", 16, seed=4),
             numpy_helper.from_array(np.abs(rand(16, seed=5)) + 0.5, "v"),
             _const("w1", 16, 16, 3, 3, 3, seed=6), _const("b1", 16, seed=7),
             _const("w2", 16, 16, 3, 3, 3, seed=8), _const("b2", 16, seed=9),
             _const("w3", 32, 16, 3, 3, 3, seed=10), _const("b3", 32, seed=11),
             _const("wd", 32, 16, 1, 1, 1, seed=12)]
    graph = helper.make_graph(
        nodes, "r3d_block",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, 4, 12, 12])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_residual_block_symbolic_batch_through_the_vm(target, tmp_path):
    model = _residual_block()
    mod, params = from_onnx(model)
    kiln.build(mod, target=target, params=params).export_library(str(tmp_path / "b.so"))
    vm = VirtualMachine(kiln.runtime.load_module(str(tmp_path / "b.so")), kiln.cpu())
    for batch in (1, 3):
        x = rand(batch, 3, 4, 12, 12, seed=batch)
        got = [vm["main"](x).numpy()]
        assert_close_to_reference(got, run_onnxruntime(model, {"x": x}))


def test_residual_block_static(check_model):
    x = {"x": rand(2, 3, 4, 12, 12, seed=4)}
    check_model(_residual_block(), x)


def test_conv3d_runs_the_blocked_conv_kernel():
    """Every 3-D conv of the block becomes ``nn.conv2d_NCHWc`` (the vectorized, register-
    blocked schedule with channel blocks innermost), none stays a plain ``nn.conv2d``."""
    mod, params = from_onnx(_residual_block())
    with Target("llvm -mcpu=haswell"):
        fused = optimize(mod["main"], params)
    ops = [n.op.name for p in primitive_calls(fused) for n in post_order(p.body.outputs)
           if isinstance(n, Call)]
    assert ops.count("nn.conv2d_NCHWc") == 5 and "nn.conv2d" not in ops


def test_symbolic_batch_height_and_width_through_the_vm(target, tmp_path):
    """A strided, padded 3-D conv, a ceil_mode 3-D average pool and a strided 3-D
    ConvTranspose over ``x[N, 3, 4, H, W]``: the slices and reshapes carry the symbolic
    dims."""
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1] * 6, strides=[1, 2, 2]),
             helper.make_node("AveragePool", ["c"], ["y"], kernel_shape=[2, 2, 2],
                              strides=[2, 2, 2], ceil_mode=1),
             helper.make_node("ConvTranspose", ["x", "wt"], ["u"], strides=[2, 2, 2],
                              pads=[1] * 6)]
    graph = helper.make_graph(
        nodes, "conv3d_symbolic",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 4, "H", "W"])],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in ("y", "u")],
        [_const("w", 4, 3, 3, 3, 3, seed=1), _const("wt", 3, 2, 3, 3, 3, seed=2)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    mod, params = from_onnx(model, dim_bounds={"H": (3, None), "W": (3, None)})
    kiln.build(mod, target=target, params=params).export_library(str(tmp_path / "s.so"))
    vm = VirtualMachine(kiln.runtime.load_module(str(tmp_path / "s.so")), kiln.cpu())
    for shape in [(1, 3, 4, 7, 9), (2, 3, 4, 10, 5)]:
        x = rand(*shape, seed=shape[3])
        got = [o.numpy() for o in vm["main"](x)]
        assert_close_to_reference(got, run_onnxruntime(model, {"x": x}))
