"""Grouped-query attention's two einsums over a sequence-major key/value cache (the decoder of
kiln.models.llama_onnx), compiled with symbolic sequence and cache lengths: register-blocked as
matrix products (schedule_einsum), checked against numpy at decode and prefill shapes."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx_helpers import compile_vm

SCORES = ("bsgrd,tbgd->bgrst", ["b", "s", 3, 3, 16], ["t", "b", 3, 16], ["b", 3, 3, "s", "t"])
CONTEXT = ("bgrst,tbgd->bsgrd", ["b", 3, 3, "s", "t"], ["t", "b", 3, 16], ["b", "s", 3, 3, 16])


def _model(equation, a, b, out):
    f = TensorProto.FLOAT
    graph = helper.make_graph(
        [helper.make_node("Einsum", ["a", "b"], ["y"], equation=equation)], "einsum",
        [helper.make_tensor_value_info("a", f, a), helper.make_tensor_value_info("b", f, b)],
        [helper.make_tensor_value_info("y", f, out)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("target", ["llvm", "c"])
@pytest.mark.parametrize("spec", [SCORES, CONTEXT], ids=["scores", "context"])
def test_attention_einsums_at_decode_and_prefill_shapes(spec, target, tmp_path):
    equation, a, b, out = spec
    vm = compile_vm(_model(equation, a, b, out), tmp_path / "einsum.so", target)
    rng = np.random.default_rng(0)
    for batch, s, t in [(1, 1, 1), (1, 1, 37), (2, 1, 100), (1, 7, 7), (1, 30, 45), (2, 13, 64)]:
        dims = {"b": batch, "s": s, "t": t}
        x, y = (rng.standard_normal([dims.get(d, d) for d in shape]).astype(np.float32)
                for shape in (a, b))
        got = vm["main"](x, y).numpy()
        np.testing.assert_allclose(got, np.einsum(equation, x, y), rtol=1e-4, atol=1e-4)
