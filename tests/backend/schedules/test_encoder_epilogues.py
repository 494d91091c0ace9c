"""A transformer encoder's feed-forward block as ONNX exports it (MatMul at rank 3 + bias,
erf GELU, MatMul + bias + residual, LayerNormalization), against onnxruntime: SinkReshape
and FuseOps' diamonds put the bias, GELU and residual into the dense kernels' epilogues."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx_helpers import compile_vm

H, F = 32, 64  # hidden and feed-forward widths (two and four packed column blocks)


#: GELU as exported: the erf form (BERT) and the tanh form (GPT-2's gelu_new, ``Pow(x, 3)``)
GELU = {
    "erf": [helper.make_node("Div", ["h", "sqrt2"], ["hd"]),
            helper.make_node("Erf", ["hd"], ["e"]),
            helper.make_node("Add", ["e", "one"], ["e1"]),
            helper.make_node("Mul", ["h", "e1"], ["g0"]),
            helper.make_node("Mul", ["g0", "half"], ["g"])],
    "tanh": [helper.make_node("Pow", ["h", "three"], ["h3"]),
             helper.make_node("Mul", ["h3", "c"], ["h3c"]),
             helper.make_node("Add", ["h", "h3c"], ["p"]),
             helper.make_node("Mul", ["p", "sqrt2pi"], ["ps"]),
             helper.make_node("Tanh", ["ps"], ["t"]),
             helper.make_node("Add", ["t", "one"], ["e1"]),
             helper.make_node("Mul", ["half", "h"], ["g0"]),
             helper.make_node("Mul", ["g0", "e1"], ["g"])],
}


def _ffn_model(seq: int | str, gelu: str = "erf"):
    rng = np.random.default_rng(1)

    def const(name, *shape, scale=0.2):
        return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype("float32"),
                                       name)

    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["m1"]),
        helper.make_node("Add", ["b1", "m1"], ["h"]),
        *GELU[gelu],
        helper.make_node("MatMul", ["g", "w2"], ["m2"]),
        helper.make_node("Add", ["m2", "b2"], ["o"]),
        helper.make_node("Add", ["o", "x"], ["r"]),
        helper.make_node("LayerNormalization", ["r", "gamma", "beta"], ["y"], axis=-1,
                         epsilon=1e-12),
    ]
    inits = [const("w1", H, F), const("b1", F), const("w2", F, H), const("b2", H),
             const("gamma", H, scale=1.0), const("beta", H),
             numpy_helper.from_array(np.array(1.4142135, "float32"), "sqrt2"),
             numpy_helper.from_array(np.array(1.0, "float32"), "one"),
             numpy_helper.from_array(np.array(0.5, "float32"), "half"),
             numpy_helper.from_array(np.array(3.0, "float32"), "three"),
             numpy_helper.from_array(np.array(0.044715, "float32"), "c"),
             numpy_helper.from_array(np.array(0.7978846, "float32"), "sqrt2pi")]
    f = TensorProto.FLOAT
    graph = helper.make_graph(nodes, "ffn", [helper.make_tensor_value_info("x", f, [1, seq, H])],
                              [helper.make_tensor_value_info("y", f, [1, seq, H])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.mark.parametrize("seq,gelu", [(5, "erf"), (24, "erf"), (24, "tanh")])
def test_feed_forward_block_matches_onnxruntime(check_model, seq, gelu):
    x = {"x": np.random.default_rng(0).standard_normal((1, seq, H)).astype("float32")}
    check_model(_ffn_model(seq, gelu), x)


@pytest.mark.parametrize("gelu", ["erf", "tanh"])
def test_feed_forward_block_fuses_into_two_dense_kernels(gelu):
    from kiln.driver.build_module import optimize, primitive_calls
    from kiln.frontend import from_onnx
    from kiln.target import Target

    mod, params = from_onnx(_ffn_model(24, gelu))
    with Target("llvm"):
        fused = optimize(mod["main"], params)
    names = sorted(c.name for c in primitive_calls(fused))
    # reshape in, first dense with bias + GELU, second with bias + residual, LayerNorm, reshape
    assert len(names) == 5 and names.count("fused_reshape") == 2, names
    assert names[0] == "fused_nn_dense_pack_add_add", names
    assert names[1].startswith("fused_nn_dense_pack_add_") and gelu in names[1], names


@pytest.mark.parametrize("target", ["llvm"])
def test_feed_forward_block_with_symbolic_sequence_on_the_vm(target, tmp_path):
    import onnxruntime as ort


    model = _ffn_model("seq")
    vm = compile_vm(model, tmp_path / "ffn.so", target)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    for seq in (1, 7, 30):
        x = rng.standard_normal((1, seq, H)).astype("float32")
        got = vm["main"](x)
        got = got[0] if isinstance(got, (list, tuple)) else got
        np.testing.assert_allclose(got.numpy(), sess.run(None, {"x": x})[0], rtol=1e-4,
                                   atol=1e-4)


@pytest.mark.parametrize("shape,perm,out", [
    ((1, 4, 6, 8), [0, 2, 1, 3], [1, 6, 32]),  # attention heads merged back: [B, S, H*D]
    ((2, 3, 5, 4), [0, 2, 1, 3], [10, 12]),    # and the batch and sequence too
    ((1, 3, 4, 6), [0, 1, 3, 2], [1, 3, 24]),  # a last axis that is not the source's
    ((2, 6, 4), [0, 1, 2], [2, 3, 8]),         # 4 does not merge: 8 = 2 x 4 from two rows
])
def test_transpose_reshape_merging_trailing_axes(check_model, shape, perm, out):
    """Reshapes whose last axis is a multiple of the source's (the split-and-vectorize
    reshape compute) against onnxruntime."""
    f = TensorProto.FLOAT
    graph = helper.make_graph(
        [helper.make_node("Transpose", ["x"], ["t"], perm=perm),
         helper.make_node("Reshape", ["t", "s"], ["y"])], "merge",
        [helper.make_tensor_value_info("x", f, list(shape))],
        [helper.make_tensor_value_info("y", f, out)],
        [numpy_helper.from_array(np.array(out, "int64"), "s")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    check_model(model, {"x": np.random.default_rng(0).standard_normal(shape).astype("float32")})
