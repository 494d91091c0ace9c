"""Trilu over symbolic rows and columns (issue 29): the causal mask PyTorch writes for
``torch.triu(torch.full((n, n), -inf), 1)`` — a ConstantOfShape of the input's Shape, then Trilu —
and Trilu of an input [batch, n, m], upper and lower at several diagonals k, in one VM artifact
against onnxruntime at several shapes (square, wide, tall, one row)."""

from __future__ import annotations

import numpy as np
import pytest
from backend_helpers import run_onnxruntime
from onnx import TensorProto, helper
from onnx_helpers import compile_vm

F, I64 = TensorProto.FLOAT, TensorProto.INT64
DIAGONALS = (-1, 0, 1, 3)


def _model():
    """y_{upper}_{k} = Trilu(x, k) for each k and both triangles; masked = scores + the triu of
    a [n, n] constant (k = 1), n = scores' last dim."""
    nodes = [helper.make_node("Shape", ["scores"], ["s"], start=-1),
             helper.make_node("Concat", ["s", "s"], ["nn"], axis=0),
             helper.make_node("ConstantOfShape", ["nn"], ["full"],
                              value=helper.make_tensor("v", F, [1], [-1e4])),
             helper.make_node("Trilu", ["full", "one"], ["mask"], upper=1),
             helper.make_node("Add", ["scores", "mask"], ["masked"])]
    outputs = ["masked"]
    for upper in (0, 1):
        for k in DIAGONALS:
            name = f"y_{upper}_{k + 1}"
            nodes += [helper.make_node("Trilu", ["x", f"k{k + 1}"], [name], upper=upper)]
            outputs.append(name)
    inits = [helper.make_tensor("one", I64, [], [1])]
    inits += [helper.make_tensor(f"k{k + 1}", I64, [], [k]) for k in DIAGONALS]
    graph = helper.make_graph(
        nodes, "trilu",
        [helper.make_tensor_value_info("x", F, ["batch", "n", "m"]),
         helper.make_tensor_value_info("scores", F, ["heads", "t", "t"])],
        [helper.make_tensor_value_info(o, F, None) for o in outputs], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    model = _model()
    return model, compile_vm(model, tmp_path_factory.mktemp("trilu") / "trilu.so", "c")


@pytest.mark.parametrize("x_shape,t", [((2, 5, 5), 7), ((1, 3, 6), 1), ((3, 6, 2), 4)])
def test_trilu_over_symbolic_dims_matches_onnxruntime(compiled, x_shape, t):
    model, vm = compiled
    rng = np.random.default_rng(sum(x_shape) + t)
    inputs = {"x": rng.standard_normal(x_shape).astype(np.float32),
              "scores": rng.standard_normal((2, t, t)).astype(np.float32)}
    got = [o.numpy() for o in vm["main"](*inputs.values())]
    for name, g, want in zip([o.name for o in model.graph.output], got,
                             run_onnxruntime(model, inputs)):
        np.testing.assert_array_equal(g, want, err_msg=name)
