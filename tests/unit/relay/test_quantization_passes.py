"""Graph passes on quantized graphs: AlterOpLayout keeps per-tensor quantize/dequantize in the
blocked layout and blocks int32 convolutions, FuseOps keeps quantization parameters as kernel
arguments; each rewritten graph still computes what the original does (graph_eval, and the
fused int32 kernel on the loop-IR interpreter)."""

from __future__ import annotations

import numpy as np
from test_lowering import run_lowered

from kiln.relay.graph import (
    Call,
    Constant,
    Function,
    PrimitiveCall,
    TensorType,
    Var,
    post_order,
    structural_key,
)
from kiln.relay.interpreter import evaluate
from kiln.relay.transform.alter_op_layout import alter_op_layout
from kiln.relay.transform.fuse_ops import fuse_ops

RNG = np.random.default_rng(5)
CONV = {"strides": (1, 1), "padding": (1, 1, 1, 1), "dilation": (1, 1), "groups": 1}


def _qdq(x, scale: float, zero_point: int):
    """quantize → dequantize of ``x`` (uint8, per tensor), as a QDQ model has on activations."""
    s, z = Constant(np.array(scale, "float32")), Constant(np.array(zero_point, "uint8"))
    q = Call("qnn.quantize", [x, s, z], {"axis": 0, "block_size": 0, "out_dtype": "uint8"})
    return Call("qnn.dequantize", [q, s, z], {"axis": 0, "block_size": 0})


def _qdq_convs(scales: tuple[float, float]) -> Function:
    """conv → QDQ → conv → QDQ on 16 channels."""
    x = Var("x", TensorType((1, 16, 6, 6), "float32"))
    y = x
    for scale in scales:
        w = Constant(RNG.standard_normal((16, 16, 3, 3)).astype("float32") * 0.1)
        y = _qdq(Call("nn.conv2d", [y, w], CONV), scale, 128)
    return Function([x], [y])


def _ops(func: Function) -> list[str]:
    return [n.op.name for n in post_order(func.outputs) if isinstance(n, Call)]


def test_layout_flows_through_per_tensor_quantize_dequantize():
    func = _qdq_convs((0.05, 0.08))
    altered = alter_op_layout(func)
    layouts = [(n.attrs["src_layout"], n.attrs["dst_layout"]) for n in post_order(altered.outputs)
               if isinstance(n, Call) and n.op.name == "layout_transform"]
    assert layouts == [("NCHW", "NCHW16c"), ("NCHW16c", "NCHW")], layouts
    data = RNG.standard_normal((1, 16, 6, 6)).astype("float32")
    np.testing.assert_array_equal(evaluate(altered, {"x": data})[0],
                                  evaluate(func, {"x": data})[0])


def test_quantization_parameters_are_kernel_arguments():
    """Two QDQ conv layers that differ only in their scales compile to one kernel."""
    func = _qdq_convs((0.05, 0.08))
    fused = fuse_ops(alter_op_layout(func))
    convs = [n for n in post_order(fused.outputs)
             if isinstance(n, PrimitiveCall) and "conv2d" in n.name]
    assert len(convs) == 2
    assert structural_key(convs[0].body) == structural_key(convs[1].body)
    # data, weight (blocked, or Winograd-transformed: decision 050), and the scale and zero
    # point as rank-0 arguments (not immediates)
    assert [a.checked_type.ndim for a in convs[0].args][::2] == [5, 0], convs[0].args
    assert [a.checked_type.ndim for a in convs[0].args][1:] in ([6, 0, 0], [5, 0, 0])


def test_int32_conv_is_blocked_and_exact():
    """QLinearConv's integer product: an int32 conv with a constant weight runs as
    conv2d_NCHWc, bit-exact against the plain conv."""
    x = Var("x", TensorType((1, 8, 5, 5), "int32"))
    w = Constant(RNG.integers(-128, 128, (16, 8, 3, 3)).astype("int32"))
    func = Function([x], [Call("nn.conv2d", [x, w], CONV)])
    altered = alter_op_layout(func)
    assert "nn.conv2d_NCHWc" in _ops(altered) and "nn.conv2d" not in _ops(altered)
    data = RNG.integers(-255, 256, (1, 8, 5, 5)).astype("int32")
    want = evaluate(func, {"x": data})[0]
    np.testing.assert_array_equal(evaluate(altered, {"x": data})[0], want)
    (got,) = run_lowered(fuse_ops(altered), {"x": data})
    np.testing.assert_array_equal(got, want)
