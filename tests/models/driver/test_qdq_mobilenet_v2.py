"""A QDQ int8 MobileNetV2 made by onnxruntime's static quantization tool
(:func:`kiln.models.qdq_mobilenet_v2`: :func:`kiln.models.mobilenet_v2` with seeded random
weights, BatchNorm folded, ``quantize_static`` in QDQ format on four seeded random images; per
tensor with uint8 activations (U8S8), per channel with int8 activations (S8S8)), compiled by
Kiln: every convolution — the 17 depthwise 3×3 ones included — is an integer kernel
(docs/decisions/021), no float convolution is left. Per channel runs on ``c``, per tensor on
``llvm -mcpu=native`` (why not all four: at the parametrization).

References and tolerance: onnxruntime running the QDQ graph as float ops (graph optimizations
off: the format's meaning, docs/decisions/011), within 3 output steps and the same top 5 in an
order it agrees with; and onnxruntime's int8 run, the same top-5 classes. onnxruntime's int8 run
is not ground truth: on the S8S8 model it lands 15 steps from its own float run (Kiln: 2).
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from model_helpers import compile_to_library, run_compiled
from onnx import numpy_helper

from kiln import models

SEED = 20240602
MAX_STEPS = 3
#: MobileNetV2's convolutions: 35 dense (1×1 and the stem) and 17 depthwise
DENSE_CONVS, DEPTHWISE_CONVS = 35, 17


def _quantize(variant: str):
    def build(folder):
        models.qdq_mobilenet_v2(folder, per_channel=variant == "per_channel", seed=SEED)
    return build


@pytest.fixture(scope="module")
def qdq_models(build_once):
    """``qdq_models(variant) -> path``, each variant quantized once per session (both xdist
    workers share it: ``build_once``)."""

    def get(variant: str) -> str:
        folder = build_once(f"qdq-mobilenet-v2-{variant}-{SEED}", _quantize(variant))
        return str(folder / f"mobilenet_v2_qdq_{variant}.onnx")

    return get


def _float_semantics(path: str, inputs: dict[str, np.ndarray]) -> np.ndarray:
    """onnxruntime with graph optimizations off: every QDQ op run as written, in float."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"]).run(
        None, inputs)[0]


@pytest.mark.slow
# each variant and each target once: per channel (S8S8) on c, per tensor (U8S8) on llvm
# (test_qdq_resnet50.py runs both variants on llvm, and no longer on c, where it took 59 s).
# per_tensor-c (~30 s) was dropped: the graph rewrite of both variants is target-independent
# (per_tensor-llvm here), and c's integer kernels on uint8 activations are run on both targets
# by tests/backend: depthwise and grouped (test_integer_depthwise.py), dense 1x1/3x3
# (test_integer_kernels.py), QLinearConv's per-tensor requantization
# (test_quantization_ops.py)
@pytest.mark.parametrize("variant,target", [("per_channel", "c"),
                                            ("per_tensor", "llvm -mcpu=native")])
def test_qdq_mobilenet_v2(qdq_models, variant, target, reference, tmp_path):
    path = qdq_models(variant)
    model = onnx.load(path)
    name = model.graph.input[0].name
    x = np.random.default_rng(SEED + 1).standard_normal((1, 3, 224, 224)).astype("float32")
    compiled = compile_to_library(model, {name: x.shape}, tmp_path / "m.so", target)
    nodes = json.loads(compiled.loaded["get_graph_json"]())["nodes"]
    kernels = [n["attrs"]["func_name"] for n in nodes if n["op"] == "tvm_op"]
    assert sum("qnn_conv2d_NCHWc" in k for k in kernels) == DENSE_CONVS, kernels
    assert sum("qnn_depthwise_conv2d_NCHWc" in k for k in kernels) == DEPTHWISE_CONVS, kernels
    floats = [k for k in kernels
              if "conv" in k.replace("qnn_conv2d", "").replace("qnn_depthwise_conv2d", "")]
    assert not floats, floats
    (got,) = run_compiled(compiled, {name: x})
    inits = {t.name: t for t in model.graph.initializer}
    (last,) = [n for n in model.graph.node if n.output[0] == model.graph.output[0].name]
    step = float(numpy_helper.to_array(inits[last.input[1]]))
    want = _float_semantics(path, {name: x})
    steps = np.abs(got.astype(np.float64) - want) / step
    assert steps.max() <= MAX_STEPS + 1e-3, f"max difference {steps.max():.2f} steps"
    ref, top5 = want.reshape(-1), np.argsort(-got.reshape(-1))[:5]
    assert ref[top5].min() >= np.sort(ref)[-5], f"top 5 {list(top5)}: reference {ref[top5]}"
    assert np.all(np.diff(ref[top5]) <= 0), f"order {list(top5)}: reference {ref[top5]}"
    (int8,) = reference(path, {name: x})
    assert set(top5) == set(np.argsort(-int8.reshape(-1))[:5]), (top5, int8.reshape(-1)[top5])
