"""Graph ops: the fixed vocabulary, type relations (ShapeError on bad input), numpy references,
and the graph interpreter (graph_eval)."""

from __future__ import annotations

import numpy as np
import pytest

from kiln.arith import SymVar
from kiln.errors import KilnError, ShapeError
from kiln.relay.graph import Call, Constant, Function, PrimitiveCall, TensorType, Var
from kiln.relay.interpreter import evaluate
from kiln.relay.op.nn import pool_output_size
from kiln.relay.op.transform import slice_length
from kiln.relay.op_registry import OpPattern, get_op, list_ops

VOCABULARY = {
    OpPattern.ELEMWISE: ["nn.relu", "sigmoid", "exp", "log", "sqrt", "tanh", "erf", "negative",
                         "abs", "floor", "ceil", "clip", "hardsigmoid", "hardswish", "leaky_relu",
                         "cast", "round", "sin", "cos", "tan", "asin", "acos", "atan", "sinh",
                         "cosh", "asinh", "acosh", "atanh", "sign", "logical_not", "isnan",
                         "isinf", "bitwise_not", "reinterpret"],
    OpPattern.BROADCAST: ["add", "subtract", "multiply", "divide", "maximum", "minimum", "power",
                          "nn.bias_add", "where", "expand", "mod", "floor_mod", "equal",
                          "not_equal", "less", "less_equal", "greater", "greater_equal",
                          "logical_and", "logical_or", "logical_xor", "bitwise_and", "bitwise_or",
                          "bitwise_xor", "left_shift", "right_shift", "qnn.quantize",
                          "qnn.dequantize"],
    OpPattern.OUT_ELEMWISE_FUSABLE: ["nn.conv2d", "nn.dense", "nn.matmul", "nn.max_pool2d",
                                     "nn.avg_pool2d", "nn.global_avg_pool2d",
                                     "nn.global_max_pool2d", "nn.conv2d_NCHWc",
                                     "nn.conv2d_winograd_NCHWc", "nn.dense_pack",
                                     "nn.depthwise_conv2d_NCHWc", "nn.conv2d_transpose",
                                     "nn.dense_q8", "nn.dense_q4", "qnn.conv2d", "qnn.conv2d_NCHWc",
                                     "qnn.dense", "qnn.dense_pack", "qnn.depthwise_conv2d_NCHWc",
                                     "nn.attention", "einsum"],
    OpPattern.COMM_REDUCE: ["sum", "prod", "mean", "max", "min"],
    OpPattern.OPAQUE: ["nn.softmax", "nn.log_softmax", "nn.lrn", "nn.batch_norm", "nn.dropout",
                       "nn.layer_norm", "annotation.compiler_begin", "annotation.compiler_end",
                       "argmax", "argmin", "topk_indices", "scatter_elements", "scatter_nd",
                       "cumsum", "cumprod", "image.grid_sample",
                       "nn.max_pool2d_indices", "col2im", "match_cast", "trap", "kv_append", *[
                           "dyn." + n for n in ("nonzero", "unique", "non_max_suppression",
                                                "compress", "topk", "range", "reshape",
                                                "expand", "constant_of_shape", "tile", "slice")]],
    OpPattern.INJECTIVE: ["reshape", "transpose", "concatenate", "strided_slice", "take", "arange",
                          "layout_transform", "image.resize2d", "gather", "gather_nd", "nn.pad"],
}


def test_vocabulary_and_patterns():
    expected = {name: pattern for pattern, names in VOCABULARY.items() for name in names}
    assert set(list_ops()) == set(expected)
    for name, pattern in expected.items():
        assert get_op(name).pattern == pattern, name


def test_runtime_ops_are_the_vms_own():
    dynamic = {n for n in list_ops() if n.startswith("dyn.")}
    assert {n for n in list_ops() if get_op(n).runtime} == {"match_cast", "trap", "kv_append",
                                                            *dynamic}


def _t(*shape, dtype="float32"):
    return Var("v", TensorType(shape, dtype))


CONV = {"strides": (1, 1), "padding": (0, 0, 0, 0), "dilation": (1, 1), "groups": 1}
QNN = {"axis": 0, "block_size": 0}
POOL = {"pool_size": (2, 2), "strides": (2, 2), "padding": (0, 0, 0, 0), "dilation": (1, 1),
        "ceil_mode": False}


@pytest.mark.parametrize("op,args,attrs,match", [
    ("add", [_t(2, 3), _t(4)], {}, "broadcast"),
    ("add", [_t(2), _t(2, dtype="int64")], {}, "dtypes differ"),
    ("exp", [_t(2, dtype="int32")], {}, "floating-point"),
    ("exp", [_t(2), _t(2)], {}, "argument"),
    ("nn.bias_add", [_t(2, 3), _t(2)], {"axis": 1}, "bias shape"),
    ("where", [_t(2), _t(2), _t(2)], {}, "bool"),
    ("nn.conv2d", [_t(1, 4, 5, 5), _t(6, 3, 3, 3)], dict(CONV, groups=2), "groups"),
    ("nn.conv2d", [_t(1, 3, 2, 2), _t(6, 3, 3, 3)], CONV, "larger"),
    ("nn.conv2d", [_t(3, 5, 5), _t(6, 3, 3, 3)], CONV, "rank 4"),
    ("nn.dense", [_t(2, 3), _t(4, 5)], {}, "K differs"),
    ("equal", [_t(2), _t(2, dtype="int64")], {}, "dtypes differ"),
    ("nn.layer_norm", [_t(2, 3), _t(3), _t(2)], {"axis": 1, "epsilon": 1e-5}, "gamma/beta"),
    ("nn.conv2d_transpose", [_t(1, 4, 5, 5), _t(3, 2, 2, 2)],
     dict(CONV, output_padding=(0, 0)), "groups"),
    ("nn.conv2d_transpose", [_t(1, 4, 2, 2), _t(4, 2, 3, 3)],
     dict(CONV, padding=(3, 3, 3, 3), output_padding=(0, 0)), "no output"),
    ("image.resize2d", [_t(1, 2, 4, 4)], {"size": (8, 8), "scale": (2.0, 2.0), "method": "area",
                                          "coordinate_transformation_mode": "half_pixel",
                                          "rounding_method": "floor"}, "method"),
    ("image.resize2d", [_t(2, 4, 4)], {"size": (8, 8), "scale": (2.0, 2.0),
                                       "method": "linear",
                                       "coordinate_transformation_mode": "half_pixel",
                                       "rounding_method": "floor"}, "rank 4"),
    ("image.resize2d", [_t(1, 2, SymVar("H"), 4)],
     {"size": (8, 8), "scale": (None, 2.0), "method": "linear", "antialias": True,
      "coordinate_transformation_mode": "half_pixel", "rounding_method": "floor"},
     r"antialias needs a constant scale; axis 2's is float32\(8\) / float32\(H\)"),
    ("nn.matmul", [_t(2, 3, 4), _t(5, 4, 2)], {}, "broadcast"),
    ("nn.matmul", [_t(3), _t(3, 2)], {}, "rank >= 2"),
    ("nn.max_pool2d", [_t(1, 1, 1, 1)], POOL, "larger"),
    ("nn.softmax", [_t(2, 3)], {"axis": 2}, "out of range"),
    ("nn.batch_norm", [_t(2, 3), _t(2), _t(3), _t(3), _t(3)], {"epsilon": 1e-5, "axis": 1},
     "statistics"),
    ("sum", [_t(2, 3)], {"axis": (1, -1), "keepdims": False}, "repeated"),
    ("reshape", [_t(2, 3)], {"newshape": (4, 2)}, "cannot reshape"),
    ("transpose", [_t(2, 3)], {"axes": (0, 0)}, "permutation"),
    ("concatenate", [_t(2, 3), _t(3, 3)], {"axis": 1}, "differ"),
    ("strided_slice", [_t(4)], {"begin": (3,), "end": (1,), "strides": (1,)}, "normalized"),
    ("take", [_t(4), _t(2)], {"axis": 0}, "integers"),
    ("expand", [_t(2, 3)], {"newshape": (3, 3)}, "broadcast"),
    ("cast", [_t(2)], {"dtype": "no-such-type"}, "dtype"),
    ("qnn.quantize", [_t(2, 3), _t(), _t(dtype="int8")], dict(QNN, out_dtype="uint8"),
     "zero point"),
    ("qnn.quantize", [_t(2, 3), _t(4), _t(4, dtype="int8")], dict(QNN, axis=1, out_dtype="int8"),
     "scales for axis"),
    ("qnn.quantize", [_t(2, 3), _t(), _t(dtype="int32")], dict(QNN, out_dtype="int32"),
     "cannot quantize"),
    ("qnn.dequantize", [_t(2), _t(), _t()], QNN, "cannot dequantize"),
    ("qnn.dequantize", [_t(4, 6, dtype="int8"), _t(4, 3), _t(4, 3, dtype="int8")],
     dict(QNN, axis=1, block_size=4), "blocks of 4"),
])
def test_type_relation_errors(op, args, attrs, match):
    with pytest.raises(ShapeError, match=match) as info:
        Call(op, args, attrs, span="node7")
    assert op in str(info.value) and "node7" in str(info.value)


def test_slice_length_convention():
    assert slice_length(5, 1, 4, 1) == 3
    assert slice_length(5, 0, 5, 2) == 3
    assert slice_length(5, 4, -1, -1) == 5  # end -1 means "before index 0"
    assert slice_length(5, 4, 0, -2) == 2
    assert slice_length(5, 2, 2, 1) == 0
    x = np.arange(5, dtype=np.float32)
    call = Call("strided_slice", [Constant(x)], {"begin": (4,), "end": (-1,), "strides": (-2,)})
    assert evaluate(Function([], [call]), {})[0].tolist() == [4, 2, 0]


def test_pool_output_size_ceil_mode():
    assert pool_output_size(8, 3, 2, 0, 0, 1, False) == 3
    assert pool_output_size(8, 3, 2, 0, 0, 1, True) == 4
    # 5 + pads 1/1, k=2, s=2: ceil gives 4 windows, the last would start in the tail padding.
    assert pool_output_size(5, 2, 2, 1, 1, 1, True) == 3


def _run(op, arrays, **attrs):
    call = Call(op, [Constant(a) for a in arrays], attrs)
    return evaluate(Function([], [call]), {})[0]


def test_refs_keep_float32():
    x = np.linspace(-3, 3, 12, dtype=np.float32).reshape(3, 4)
    for op in ["nn.relu", "sigmoid", "tanh", "erf", "negative", "abs", "floor", "ceil",
               "hardswish"]:
        assert _run(op, [x]).dtype == np.float32, op
    assert _run("hardsigmoid", [x], alpha=0.2, beta=0.5).max() == 1.0
    np.testing.assert_allclose(_run("clip", [x], a_min=-1.0, a_max=np.inf).min(), -1.0)
    np.testing.assert_allclose(_run("sigmoid", [np.array([-100.0, 100.0], np.float32)]), [0, 1],
                               atol=1e-30)


def test_take_wraps_negative_indices():
    data = np.arange(12, dtype=np.float32).reshape(3, 4)
    out = _run("take", [data, np.array([-1, 0], np.int64)], axis=1)
    assert out.tolist() == [[3, 0], [7, 4], [11, 8]]


def test_reductions():
    x = np.arange(24, dtype=np.int32).reshape(2, 3, 4)
    assert _run("sum", [x], axis=(0, 2), keepdims=False).dtype == np.int32
    assert _run("max", [x], axis=(-1,), keepdims=True).shape == (2, 3, 1)
    np.testing.assert_allclose(_run("mean", [x.astype(np.float32)], axis=(1,), keepdims=False),
                               x.mean(axis=1))


def test_evaluate_inputs_are_checked():
    x = Var("x", TensorType((2,), "float32"))
    func = Function([x], [Call("exp", [x])])
    with pytest.raises(KilnError, match="'x'"):
        evaluate(func, {})
    with pytest.raises(ShapeError, match="'x'"):
        evaluate(func, {"x": np.zeros(3)})
    assert evaluate(func, {"x": np.zeros(2)})[0].dtype == np.float32


def test_evaluate_primitive_call():
    p = Var("p", TensorType((2,), "float32"))
    body = Function([p], [Call("nn.relu", [Call("negative", [p])])])
    x = Var("x", TensorType((2,), "float32"))
    func = Function([x], [PrimitiveCall(body, [x], "fused_negative_relu")])
    out = evaluate(func, {"x": np.array([1.0, -2.0], np.float32)})[0]
    assert out.tolist() == [0.0, 2.0]


def test_attention_type_relation_and_reference():
    """``nn.attention`` (q [B,H,S,D], kt [B,H,D,T], v [B,H,T,E], mask) against numpy's
    softmax(q·kt·scale + mask)·v; shapes that do not agree raise ShapeError."""
    rng = np.random.default_rng(0)
    q, kt, v = (rng.standard_normal(s).astype("float32")
                for s in ((2, 3, 5, 4), (2, 3, 4, 7), (2, 3, 7, 6)))
    mask = np.where(rng.random((2, 1, 1, 7)) < 0.3, -1e4, 0).astype("float32")
    args = [Var(n, TensorType(a.shape, "float32")) for n, a in zip("qkvm", (q, kt, v, mask))]
    call = Call("nn.attention", args, {"scale": 0.5})
    assert call.checked_type.shape == (2, 3, 5, 6)
    x = q @ kt * 0.5 + mask
    p = np.exp(x - x.max(-1, keepdims=True))
    want = (p / p.sum(-1, keepdims=True)) @ v
    got = evaluate(Function(args, [call]), dict(zip("qkvm", (q, kt, v, mask))))[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    with pytest.raises(ShapeError):
        Call("nn.attention", [args[0], args[0], args[2], args[3]], {"scale": 1.0})
