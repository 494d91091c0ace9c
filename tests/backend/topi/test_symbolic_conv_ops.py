"""The ops of convolutional models over symbolic N, H, W, through the VM: one graph with a
conv (NCHWc after AlterOpLayout), pads in three modes, ceil_mode pools, a transposed conv, a
nearest ×2 Resize, a linear Resize to sizes computed from Shape(x), global and reduce means;
compiled once per target, run at several shapes against onnxruntime. Also SAME padding, and
squeezenet's stem (a conv after a ceil_mode pool) with no bounds declared."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from backend_helpers import assert_close_to_reference, run_onnxruntime
from onnx import TensorProto, helper, numpy_helper

import kiln
from kiln.frontend import from_onnx
from kiln.vm import VirtualMachine

SHAPES = [(1, 4, 7, 9), (2, 4, 16, 5), (3, 4, 4, 4), (1, 4, 5, 3)]
RNG = np.random.default_rng(5)


def _const(name: str, value) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(value), name)


def _model() -> onnx.ModelProto:
    pads = [0, 0, 1, 2, 0, 0, 2, 1]
    nodes = [
        helper.make_node("Pad", ["x", "pads", "half"], ["pad_constant"], mode="constant"),
        helper.make_node("Pad", ["x", "pads"], ["pad_edge"], mode="edge"),
        helper.make_node("Pad", ["x", "pads"], ["pad_reflect"], mode="reflect"),
        helper.make_node("Conv", ["x", "w", "b"], ["conv"], strides=[2, 2], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["conv"], ["relu"]),
        # stride 1: shifted register blocks along the symbolic width, narrower rows unblocked
        helper.make_node("Conv", ["x", "w32"], ["conv_s1"], pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["conv_s1", "w1x1"], ["pointwise"]),
        # padded by 8 a side: read in place (guarded loads), not copied
        helper.make_node("Conv", ["x", "w", "b"], ["dilated"], pads=[8] * 4, dilations=[8, 8]),
        helper.make_node("MaxPool", ["x"], ["max_pool"], kernel_shape=[3, 3], strides=[2, 2],
                         ceil_mode=1),
        helper.make_node("AveragePool", ["x"], ["avg_pool"], kernel_shape=[3, 3],
                         strides=[2, 2], pads=[1, 1, 1, 1], ceil_mode=1, count_include_pad=0),
        helper.make_node("ConvTranspose", ["x", "wt"], ["conv_transpose"], strides=[2, 2]),
        helper.make_node("GlobalAveragePool", ["x"], ["global_pool"]),
        helper.make_node("Resize", ["x", "", "scales"], ["upsample"], mode="nearest",
                         coordinate_transformation_mode="asymmetric", nearest_mode="floor"),
        helper.make_node("ReduceMean", ["x"], ["mean"], axes=[2, 3], keepdims=1),
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Mul", ["shape", "size_factors"], ["sizes"]),
        helper.make_node("Resize", ["x", "", "", "sizes"], ["resize_to_sizes"], mode="linear"),
    ]
    outputs = [n.output[0] for n in nodes if n.output[0] not in ("conv", "shape", "sizes",
                                                                  "conv_s1")]
    inits = [_const("pads", np.array(pads, np.int64)), _const("half", np.float32(0.5)),
             _const("w", RNG.standard_normal((16, 4, 3, 3)).astype(np.float32)),
             _const("b", RNG.standard_normal(16).astype(np.float32)),
             _const("w32", RNG.standard_normal((32, 4, 3, 3)).astype(np.float32)),
             _const("w1x1", RNG.standard_normal((16, 32, 1, 1)).astype(np.float32)),
             _const("wt", RNG.standard_normal((4, 4, 2, 2)).astype(np.float32)),
             _const("scales", np.array([1, 1, 2, 2], np.float32)),
             _const("size_factors", np.array([1, 1, 2, 3], np.int64))]
    graph = helper.make_graph(
        nodes, "symbolic_conv_ops",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4, "H", "W"])],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


@pytest.fixture(scope="module")
def model() -> onnx.ModelProto:
    return _model()


def test_symbolic_conv_ops_match_onnxruntime(model, target, tmp_path):
    mod, params = from_onnx(model, dim_bounds={"H": (3, None), "W": (3, None)})
    exe = kiln.build(mod, target=target, params=params)
    exe.export_library(str(tmp_path / "ops.so"))
    vm = VirtualMachine(kiln.runtime.load_module(str(tmp_path / "ops.so")), kiln.cpu())
    for shape in SHAPES:
        x = RNG.standard_normal(shape).astype(np.float32)
        got = [o.numpy() for o in vm["main"](x)]
        assert_close_to_reference(got, run_onnxruntime(model, {"x": x}))


def _same_pool_model() -> onnx.ModelProto:
    """MaxPool and Conv with ``auto_pad=SAME_UPPER`` / ``SAME_LOWER``, stride 2, over
    ``x[1, 4, H, W]`` (the padding depends on H and W modulo 2)."""
    nodes = [helper.make_node("MaxPool", ["x"], ["max_pool"], kernel_shape=[3, 3],
                              strides=[2, 2], auto_pad="SAME_UPPER"),
             helper.make_node("Conv", ["x", "w"], ["conv"], kernel_shape=[2, 2], strides=[2, 2],
                              auto_pad="SAME_LOWER")]
    graph = helper.make_graph(
        nodes, "same_pool",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, "H", "W"])],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in ("max_pool", "conv")],
        [_const("w", RNG.standard_normal((3, 4, 2, 2)).astype(np.float32))])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def test_same_padding_over_symbolic_sizes_needs_their_remainder(tmp_path):
    """SAME padding with stride 2 over H and W declared multiples of 2 compiles once and
    matches onnxruntime at every even size; undeclared, it is a ShapeError naming the dim
    (it was an internal TypeError)."""
    model = _same_pool_model()
    with pytest.raises(kiln.errors.ShapeError, match="auto_pad=SAME_UPPER.*H modulo 2"):
        from_onnx(model)
    mod, params = from_onnx(model, dim_bounds={"H": (2, 64, 2), "W": (2, 64, 2)})
    so = tmp_path / "same.so"
    kiln.build(mod, target="llvm", params=params).export_library(str(so))
    vm = VirtualMachine(kiln.runtime.load_module(str(so)), kiln.cpu())
    for shape in [(1, 4, 8, 10), (1, 4, 2, 6)]:
        x = RNG.standard_normal(shape).astype(np.float32)
        got = [o.numpy() for o in vm["main"](x)]
        assert_close_to_reference(got, run_onnxruntime(model, {"x": x}))


def _fire_stem_model() -> onnx.ModelProto:
    """squeezenet1_1's stem over ``x[N, 3, H, W]`` with no declaration: a 3×3 stride-2 conv,
    a ceil_mode 3×3 stride-2 MaxPool, then the first fire module's 1×1 squeeze conv and Relu
    (whose extent came from the ceil division and had no lower bound)."""
    nodes = [helper.make_node("Conv", ["x", "w"], ["stem"], strides=[2, 2]),
             helper.make_node("MaxPool", ["stem"], ["pooled"], kernel_shape=[3, 3],
                              strides=[2, 2], ceil_mode=1),
             helper.make_node("Conv", ["pooled", "squeeze_w", "squeeze_b"], ["squeeze"]),
             helper.make_node("Relu", ["squeeze"], ["y"])]
    inits = [_const("w", RNG.standard_normal((16, 3, 3, 3)).astype(np.float32)),
             _const("squeeze_w", RNG.standard_normal((8, 16, 1, 1)).astype(np.float32)),
             _const("squeeze_b", RNG.standard_normal(8).astype(np.float32))]
    graph = helper.make_graph(
        nodes, "fire_stem",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, "H", "W"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def test_a_conv_after_a_ceil_mode_pool_over_unbounded_sizes(tmp_path):
    """Compiled with no bounds at all (the tv_squeezenet1_1 corpus row: the conv schedule's
    ``extent ... has no lower bound``), it matches onnxruntime at odd and even sizes."""
    model = _fire_stem_model()
    mod, params = from_onnx(model)
    so = tmp_path / "fire.so"
    kiln.build(mod, target="llvm", params=params).export_library(str(so))
    vm = VirtualMachine(kiln.runtime.load_module(str(so)), kiln.cpu())
    for shape in [(1, 3, 64, 64), (2, 3, 15, 22), (1, 3, 7, 7)]:
        x = RNG.standard_normal(shape).astype(np.float32)
        assert_close_to_reference([vm["main"](x).numpy()], run_onnxruntime(model, {"x": x}))
