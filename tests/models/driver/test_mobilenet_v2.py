"""MobileNetV2 built with ``onnx.helper`` (``kiln.models.mobilenet_v2``): its layer table, and Kiln
(target ``c -mcpu=native``) vs onnxruntime on a seeded random input."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import pytest
from model_helpers import assert_matches_reference, compile_to_library, run_compiled

from kiln import models

SEED = 20240601


@pytest.fixture(scope="module")
def model() -> onnx.ModelProto:
    return models.mobilenet_v2(seed=SEED)


def test_layer_table(model):
    """52 convolutions (17 inverted residual blocks), 10 shortcuts, ReLU6 as Clip(0, 6)."""
    onnx.checker.check_model(model, full_check=True)
    ops = Counter(n.op_type for n in model.graph.node)
    assert ops["Conv"] == 52
    assert ops["BatchNormalization"] == 52
    assert ops["Clip"] == 35  # every conv but the 17 linear projections
    assert ops["Add"] == 10
    assert ops["Gemm"] == ops["GlobalAveragePool"] == ops["Flatten"] == 1
    depthwise = [n for n in model.graph.node if n.op_type == "Conv"
                 and next(a.i for a in n.attribute if a.name == "group") > 1]
    assert len(depthwise) == 17
    n_params = sum(int(np.prod(t.dims)) for t in model.graph.initializer
                   if len(t.dims) != 1 or t.name.startswith("fc"))
    assert 3.4e6 < n_params < 3.6e6, n_params  # 3.5 M weights (BN statistics left out)
    assert model.opset_import[0].version == 13
    (inp,) = model.graph.input
    assert inp.name == "input"
    assert [d.dim_value for d in inp.type.tensor_type.shape.dim] == [1, 3, 224, 224]


def test_seeded(model):
    again = models.mobilenet_v2(seed=SEED)
    other = models.mobilenet_v2(seed=SEED + 1)
    assert again.SerializeToString() == model.SerializeToString()
    assert other.SerializeToString() != model.SerializeToString()


def test_matches_onnxruntime(model, reference, tmp_path):
    x = np.random.default_rng(SEED).standard_normal((1, 3, 224, 224)).astype(np.float32)
    want = reference(model, {"input": x})
    assert float(np.std(want[0])) > 0.1, "logits are nearly constant: weights are not sane"
    compiled = compile_to_library(model, {"input": x.shape}, tmp_path / "mobilenet_v2.so",
                                  target="c -mcpu=native")
    assert_matches_reference(run_compiled(compiled, {"input": x}), want)
