"""Grouped and dilated float convolutions (issue 32) against onnxruntime on the ``c`` and
``llvm`` targets: grouped convs run as ``nn.conv2d_NCHWc`` with groups as an outer axis and
channel blocks within a group; dilated convs drop the kernel taps that read only padding
(docs/decisions/045).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from backend_helpers import assert_close_to_reference, run_exported, run_onnxruntime
from onnx import TensorProto, helper, numpy_helper

import kiln
from kiln.frontend import from_onnx

F32 = TensorProto.FLOAT


def rand(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def conv_model(cin: int, cout: int, h: int, w: int, *, groups: int = 1, stride: int = 1,
               dilation: int = 1, pad: int = 1, kernel: int = 3):
    """Conv (seeded weight and bias) → Relu on ``x: [1, cin, h, w]``."""
    weight = rand(cout, cin // groups, kernel, kernel, seed=1) / np.float32(3 * (cin // groups))
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], group=groups, pads=[pad] * 4,
                              strides=[stride] * 2, dilations=[dilation] * 2),
             helper.make_node("Relu", ["c"], ["y0"])]
    graph = helper.make_graph(
        nodes, "conv", [helper.make_tensor_value_info("x", F32, (1, cin, h, w))],
        [helper.make_tensor_value_info("y0", F32, None)],
        [numpy_helper.from_array(weight, "w"), numpy_helper.from_array(rand(cout, seed=2), "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model, {"x": rand(1, cin, h, w)}


def _build_check(model, inputs, tmp_path, target):
    """Kiln's outputs vs onnxruntime's; returns the built module's kernel names."""
    mod, params = from_onnx(model, shape={k: v.shape for k, v in inputs.items()})
    lib = kiln.build(mod, target=target, params=params)
    got = run_exported(lib, tmp_path / "model.so", inputs)
    assert_close_to_reference(got, run_onnxruntime(model, inputs), 1e-4)
    return [n["attrs"]["func_name"] for n in json.loads(lib.get_graph_json())["nodes"]
            if n["op"] == "tvm_op"]


GROUPED = [  # cin, cout, groups, h, w, stride
    (64, 64, 8, 15, 15, 1),     # RegNet: 8 channels a group
    (128, 128, 32, 13, 11, 1),  # ResNeXt-50's first stage: 4 channels a group
    (128, 128, 32, 14, 14, 2),
    (48, 48, 2, 11, 9, 1),      # 24 channels a group
    (64, 64, 16, 9, 9, 2),
    (32, 64, 4, 7, 10, 1),      # 8 inputs, 16 outputs a group
    (96, 96, 2, 9, 7, 2),       # 48 a group: several channel blocks within a group
]


@pytest.mark.parametrize("cin,cout,groups,h,w,stride", GROUPED)
def test_grouped_conv(tmp_path, target, cin, cout, groups, h, w, stride):
    """A grouped 3×3 conv + bias + relu matches onnxruntime and runs as the blocked
    ``nn.conv2d_NCHWc`` kernel (bias and relu fused into it), not the NCHW ``nn.conv2d``."""
    model, inputs = conv_model(cin, cout, h, w, groups=groups, stride=stride)
    kernels = _build_check(model, inputs, tmp_path, target)
    assert any("nn_conv2d_NCHWc" in k and "relu" in k for k in kernels), kernels
    assert not any("nn_conv2d" in k and "NCHWc" not in k for k in kernels), kernels


def test_grouped_conv_between_blocked_convs(tmp_path, target):
    """RegNet's bottleneck: 1×1 → grouped 3×3 (8 channels a group, reading its producer's
    wider blocks) → 1×1, every conv blocked, against onnxruntime."""
    w = {"w1": rand(64, 32, 1, 1, seed=1) * 0.2, "wg": rand(64, 8, 3, 3, seed=2) * 0.2,
         "w2": rand(32, 64, 1, 1, seed=3) * 0.2, "b": rand(64, seed=4)}
    nodes = [helper.make_node("Conv", ["x", "w1", "b"], ["c1"]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "wg", "b"], ["c2"], group=8, pads=[1] * 4),
             helper.make_node("Relu", ["c2"], ["r2"]),
             helper.make_node("Conv", ["r2", "w2"], ["y0"])]
    graph = helper.make_graph(
        nodes, "bottleneck", [helper.make_tensor_value_info("x", F32, (1, 32, 11, 11))],
        [helper.make_tensor_value_info("y0", F32, None)],
        [numpy_helper.from_array(v, k) for k, v in w.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    kernels = _build_check(model, {"x": rand(1, 32, 11, 11)}, tmp_path, target)
    assert sum("nn_conv2d_NCHWc" in k for k in kernels) == 3, kernels


DILATED = [  # cin, cout, h, w, dilation (pads = dilation)
    (32, 32, 20, 20, 2),
    (32, 32, 20, 20, 12),  # DeepLabV3's ASPP on a 20×20 map: most taps in the padding
    (32, 32, 20, 20, 24),  # only the centre tap reads the map
    (32, 32, 20, 20, 36),
    (16, 24, 33, 17, 2),
    (16, 24, 33, 17, 12),  # the outer rows of taps read the map, the outer columns do not
    (16, 24, 33, 17, 24),
    (16, 24, 33, 17, 36),
]


@pytest.mark.parametrize("cin,cout,h,w,dilation", DILATED)
def test_dilated_conv(tmp_path, target, cin, cout, h, w, dilation):
    """A dilated 3×3 conv (pads = dilation, stride 1) + bias + relu matches onnxruntime."""
    model, inputs = conv_model(cin, cout, h, w, dilation=dilation, pad=dilation)
    _build_check(model, inputs, tmp_path, target)


@pytest.mark.parametrize("cin,cout,h,w,stride,kernel", [
    (64, 36, 10, 9, 2, 3),  # a detection head's 9 anchors x 4 box values
    (64, 18, 7, 7, 1, 1),
    (32, 3, 9, 9, 1, 3),
])
def test_narrow_outputs_padded_to_whole_vectors(tmp_path, target, cin, cout, h, w, stride,
                                                kernel):
    """Convs whose exact channel block is under half a vector compute zero filters up to whole
    vectors (decision 059) and return only the real channels, equal to onnxruntime's."""
    model, inputs = conv_model(cin, cout, h, w, stride=stride, kernel=kernel, pad=kernel // 2)
    _build_check(model, inputs, tmp_path, target)
