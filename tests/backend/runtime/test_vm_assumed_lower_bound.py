"""A relation that holds above a lower bound no constant of the model names, assumed exactly
(decision 044): wav2vec2's feature encoder pattern (three strided convs, a padded positional
conv, its ``[..., :-1]`` slice added back) compiled with no flags runs every length that
onnxruntime runs, samples=1200 included (the importer assumed ``samples % 32 == 0`` before)."""

from __future__ import annotations

import numpy as np
import pytest
from backend_helpers import run_onnxruntime
from onnx import TensorProto, helper, numpy_helper
from onnx_helpers import compile_vm

from kiln.errors import ShapeError
from kiln.frontend import from_onnx

F = TensorProto.FLOAT
CHANNELS = 4


def _conv(name: str, x: str, kernel: int, stride: int, rng, **attrs) -> tuple:
    groups = attrs.get("group", 1)
    w = rng.standard_normal((CHANNELS, CHANNELS // groups if x != "x" else 1, kernel))
    init = numpy_helper.from_array((w / kernel).astype("float32"), f"{name}_w")
    return helper.make_node("Conv", [x, f"{name}_w"], [name], kernel_shape=[kernel],
                            strides=[stride], **attrs), init


def _feature_encoder_model():
    """x [1, 1, samples] -> convs (10, stride 5), (3, 2), (3, 2): h [1, 4, q - 1] for ``q =
    samples // 5 // 2 // 2``; y = h + pos_conv(h)[..., :-1] (kernel 16, pads 8, 2 groups:
    ``q`` frames, one dropped)."""
    rng = np.random.default_rng(7)
    made = [_conv("c1", "x", 10, 5, rng), _conv("c2", "c1", 3, 2, rng),
            _conv("h", "c2", 3, 2, rng), _conv("pos", "h", 16, 1, rng, pads=[8, 8], group=2)]
    slices = [numpy_helper.from_array(np.array([v], "int64"), n)
              for n, v in (("start", 0), ("end", -1), ("axis", 2))]
    nodes = [node for node, _ in made] + [
        helper.make_node("Slice", ["pos", "start", "end", "axis"], ["pos_cut"]),
        helper.make_node("Add", ["h", "pos_cut"], ["y"])]
    graph = helper.make_graph(
        nodes, "feature_encoder", [helper.make_tensor_value_info("x", F, [1, 1, "samples"])],
        [helper.make_tensor_value_info("y", F, None)], [init for _, init in made] + slices)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_the_least_lower_bound_is_assumed():
    mod, _ = from_onnx(_feature_encoder_model())
    assert [a.relation() for a in mod["main"].attrs["assumptions"]] == ["samples >= 20"]


@pytest.fixture(scope="module")
def vm(tmp_path_factory):
    return compile_vm(_feature_encoder_model(), tmp_path_factory.mktemp("w2v") / "m.so")


@pytest.mark.parametrize("samples", [40, 1200, 1600, 1601])
def test_every_length_matches_onnxruntime(vm, samples):
    x = np.random.default_rng(samples).standard_normal((1, 1, samples)).astype("float32")
    (want,) = run_onnxruntime(_feature_encoder_model(), {"x": x})
    got = vm["main"](x).numpy()
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_a_length_below_the_bound_is_a_shape_error_naming_it(vm):
    with pytest.raises(ShapeError, match=r"symbol samples = 19 .*\(needs samples >= 20\)"):
        vm["main"](np.zeros((1, 1, 19), "float32"))
