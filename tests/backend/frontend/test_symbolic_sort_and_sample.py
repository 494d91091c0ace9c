"""Ops from user exports that compiled only at fixed shapes (issue 29), over symbolic dims in
one VM artifact against onnxruntime: TopK with a static k over a symbolic axis (the axis is
assumed to hold k values, checked at run time) and TopK over the whole axis with k from
``Shape`` (``torch.argsort``); a shape value cast to float (``F.affine_grid`` normalizes by the
plane's size); GridSample over a symbolic plane in each mode, padding and corner alignment."""

from __future__ import annotations

import numpy as np
import pytest
from backend_helpers import run_onnxruntime
from onnx import TensorProto, helper
from onnx_helpers import compile_vm

import kiln

F, I64 = TensorProto.FLOAT, TensorProto.INT64
SAMPLING = [("linear", "zeros", 0), ("nearest", "border", 1), ("cubic", "reflection", 0),
            ("linear", "reflection", 1)]


def _model():
    nodes = [helper.make_node("TopK", ["x", "k3"], ["top_values", "top_indices"], axis=1),
             helper.make_node("Shape", ["x"], ["n"], start=1, end=2),
             helper.make_node("TopK", ["x", "n"], ["sorted", "order"], axis=1, largest=0),
             helper.make_node("Shape", ["image"], ["hw"], start=2),
             helper.make_node("Cast", ["hw"], ["hw_float"], to=F),
             helper.make_node("Div", ["one", "hw_float"], ["pixel"])]
    outputs = ["top_values", "top_indices", "sorted", "order", "pixel"]
    for mode, padding, align in SAMPLING:
        name = f"sampled_{mode}_{padding}_{align}"
        nodes.append(helper.make_node("GridSample", ["image", "grid"], [name], mode=mode,
                                      padding_mode=padding, align_corners=align))
        outputs.append(name)
    graph = helper.make_graph(
        nodes, "sort_and_sample",
        [helper.make_tensor_value_info("x", F, ["b", "n"]),
         helper.make_tensor_value_info("image", F, [2, 3, "h", "w"]),
         helper.make_tensor_value_info("grid", F, [2, "gh", "gw", 2])],
        [helper.make_tensor_value_info(o, I64 if o in ("top_indices", "order") else F, None)
         for o in outputs],
        [helper.make_tensor("k3", I64, [1], [3]), helper.make_tensor("one", F, [], [1.0])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)], ir_version=9)


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    model = _model()
    return model, compile_vm(model, tmp_path_factory.mktemp("sort") / "sort.so", "c")


def _inputs(rng, n: int, h: int, w: int) -> dict[str, np.ndarray]:
    return {"x": rng.permutation(4 * n).astype(np.float32).reshape(4, n),  # no ties
            "image": rng.standard_normal((2, 3, h, w)).astype(np.float32),
            "grid": rng.uniform(-1.3, 1.3, (2, 5, 4, 2)).astype(np.float32)}


@pytest.mark.parametrize("n,h,w", [(3, 4, 4), (11, 7, 13), (6, 1, 9)])
def test_sort_and_sample_over_symbolic_dims_match_onnxruntime(compiled, n, h, w):
    model, vm = compiled
    inputs = _inputs(np.random.default_rng(n * h + w), n, h, w)
    got = vm["main"](*inputs.values())
    for out, g, want in zip(model.graph.output, got, run_onnxruntime(model, inputs)):
        np.testing.assert_allclose(g.numpy(), want, rtol=1e-5, atol=1e-5, err_msg=out.name)


def test_a_static_k_over_a_shorter_axis_is_a_shape_error(compiled):
    """TopK k=3 made the importer assume n >= 3; n = 2 is refused by name, as onnxruntime
    refuses it, not read past the axis."""
    _, vm = compiled
    inputs = _inputs(np.random.default_rng(0), 2, 4, 4)
    with pytest.raises(kiln.errors.ShapeError, match=r"'x'.*n.*n >= 3"):
        vm["main"](*inputs.values())
