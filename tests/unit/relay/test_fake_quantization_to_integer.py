"""FakeQuantizationToInteger (docs/decisions/021): QDQ conv / dense groups become integer ops
with onnxruntime's requantization (numpy reference below), other groups stay; AlterOpLayout's
blocked integer ops (unsigned products, compensation, zero-point padding) compute the same
int32 sums as the NCHW ones."""

from __future__ import annotations

import numpy as np
import pytest

from kiln.relay.graph import Call, Constant, Function, TensorType, Var, post_order
from kiln.relay.interpreter import evaluate
from kiln.relay.transform.alter_op_layout import alter_op_layout
from kiln.relay.transform.fake_quantization_to_integer import fake_quantization_to_integer

RNG = np.random.default_rng(7)
CONV = {"strides": (1, 1), "padding": (1, 1, 1, 1), "dilation": (1, 1), "groups": 1}
PER_TENSOR = {"axis": 0, "block_size": 0}


def _c(value, dtype: str) -> Constant:
    return Constant(np.array(value, dtype))


def _dq(x, scale, zp, axis: int = 0):
    return Call("qnn.dequantize", [x, scale, zp], {"axis": axis, "block_size": 0})


def _group(dtype: str, zx: int, per_channel: bool, act: str | None = "relu",
           w_zp: int = 0, bias_scale_factor: float = 1.0, groups: int = 1, cout: int = 16):
    """A QDQ conv group over 8 -> ``cout`` channels; (function, integer operands for the
    reference)."""
    x = Var("x", TensorType((1, 8, 6, 6), dtype))
    sx, sy = np.float32(0.02), np.float32(0.05)
    w = RNG.integers(-127, 128, (cout, 8 // groups, 3, 3)).astype(np.int8)
    sw = (RNG.uniform(0.5, 1.5, cout if per_channel else ()) * 0.01).astype(np.float32)
    b = RNG.integers(-500, 500, cout).astype(np.int32)
    wzp = np.full(sw.shape, w_zp, np.int8)
    conv = Call("nn.conv2d", [_dq(x, _c(sx, "float32"), _c(zx, dtype)),
                              _dq(Constant(w), Constant(sw), Constant(wzp))],
                dict(CONV, groups=groups))
    bias = _dq(Constant(b), Constant(np.broadcast_to(sx * sw * np.float32(bias_scale_factor),
                                                     (cout,)).astype(np.float32)),
               Constant(np.zeros(cout, np.int32)))
    y = Call("nn.bias_add", [conv, bias], {"axis": 1})
    if act == "relu":
        y = Call("nn.relu", [y])
    elif act == "clip":
        y = Call("clip", [y], {"a_min": 0.0, "a_max": 6.0})
    q = Call("qnn.quantize", [y, _c(sy, "float32"), _c(zx, dtype)],
             dict(PER_TENSOR, out_dtype=dtype))
    return Function([x], [q]), (w, sw, b, sx, sy, zx)


def _reference(x: np.ndarray, w, sw, b, sx, sy, zy, act) -> np.ndarray:
    """onnxruntime's QLinearConv: exact int32 sum, ``rint(float(acc) · (sx·sw/sy)) + zy``,
    saturate; then the activation's range."""
    xs = np.pad(x.astype(np.int64) - zy, ((0, 0), (0, 0), (1, 1), (1, 1)))
    cout, cg = w.shape[:2]
    groups = x.shape[1] // cg
    og = cout // groups
    acc = np.zeros((1, cout, 6, 6), np.int64)
    for g in range(groups):
        for ky in range(3):
            for kx in range(3):
                acc[:, g * og:(g + 1) * og] += np.einsum(
                    "nchw,oc->nohw", xs[:, g * cg:(g + 1) * cg, ky:ky + 6, kx:kx + 6],
                    w[g * og:(g + 1) * og, :, ky, kx].astype(np.int64))
    acc += b[None, :, None, None]
    m = (np.float32(sx) * sw) / np.float32(sy)
    m = m.reshape(-1, 1, 1) if m.ndim else m
    q = np.rint(acc.astype(np.float32) * m) + zy
    info = np.iinfo(x.dtype)
    lo = zy if act else info.min
    hi = min(info.max, np.rint(np.float32(6) / np.float32(sy)) + zy) if act == "clip" \
        else info.max
    return np.clip(q, max(lo, info.min), hi).astype(x.dtype)


def _ops(func: Function) -> set[str]:
    return {n.op.name for n in post_order(func.outputs) if isinstance(n, Call)}


@pytest.mark.parametrize("dtype,zx,per_channel,act,groups,cout,blocked_op", [
    ("uint8", 128, False, "relu", 1, 16, "qnn.conv2d_NCHWc"),
    ("int8", -3, True, "relu", 1, 16, "qnn.conv2d_NCHWc"),
    ("int8", 0, True, "clip", 1, 16, "qnn.conv2d_NCHWc"),
    ("uint8", 7, True, None, 1, 16, "qnn.conv2d_NCHWc"),
    ("int8", 5, True, "clip", 8, 8, "qnn.depthwise_conv2d_NCHWc"),  # MobileNetV2's depthwise
    ("uint8", 9, False, "relu", 2, 16, "qnn.conv2d")])  # grouped: stays NCHW
def test_conv_group_becomes_integer(dtype, zx, per_channel, act, groups, cout, blocked_op):
    func, (w, sw, b, sx, sy, zy) = _group(dtype, zx, per_channel, act, groups=groups, cout=cout)
    new = fake_quantization_to_integer(func)
    assert "nn.conv2d" not in _ops(new) and "qnn.conv2d" in _ops(new)
    info = np.iinfo(dtype)
    x = RNG.integers(info.min, info.max + 1, (1, 8, 6, 6)).astype(dtype)
    (got,) = evaluate(new, {"x": x})
    np.testing.assert_array_equal(got, _reference(x, w, sw, b, sx, sy, zy, act))
    (blocked,) = evaluate(alter_op_layout(new), {"x": x})
    np.testing.assert_array_equal(blocked, got)
    assert blocked_op in _ops(alter_op_layout(new))


@pytest.mark.parametrize("change", [{"w_zp": 1}, {"bias_scale_factor": 1.5}])
def test_groups_that_do_not_match_stay_float(change):
    func, _ = _group("uint8", 128, True, **change)
    assert "qnn.conv2d" not in _ops(fake_quantization_to_integer(func))


@pytest.mark.parametrize("dtype,zx", [("uint8", 120), ("int8", 4)])
def test_dense_group_and_its_packed_form(dtype, zx):
    """Gemm's dense (weight ``[N, K]``) with a bias; the packed op equals the plain one."""
    x = Var("x", TensorType((3, 64), dtype))
    w = RNG.integers(-127, 128, (40, 64)).astype(np.int8)
    sw = (RNG.uniform(0.5, 1.5, 40) * 0.01).astype(np.float32)
    sx = np.float32(0.03)
    b = RNG.integers(-500, 500, 40).astype(np.int32)
    dense = Call("nn.dense", [_dq(x, _c(sx, "float32"), _c(zx, dtype)),
                              _dq(Constant(w), Constant(sw), Constant(np.zeros(40, np.int8)))])
    y = Call("nn.bias_add", [dense, _dq(Constant(b), Constant(sx * sw),
                                        Constant(np.zeros(40, np.int32)))], {"axis": 1})
    func = Function([x], [Call("qnn.quantize", [y, _c(0.1, "float32"), _c(zx, dtype)],
                               dict(PER_TENSOR, out_dtype=dtype))])
    new = fake_quantization_to_integer(func)
    assert "qnn.dense" in _ops(new) and "nn.dense" not in _ops(new)
    info = np.iinfo(dtype)
    xv = RNG.integers(info.min, info.max + 1, (3, 64)).astype(dtype)
    (got,) = evaluate(new, {"x": xv})
    acc = (xv.astype(np.int64) - zx) @ w.astype(np.int64).T + b
    want = np.clip(np.rint(acc.astype(np.float32) * ((sx * sw) / np.float32(0.1))) + zx,
                   info.min, info.max).astype(dtype)
    np.testing.assert_array_equal(got, want)
    packed = alter_op_layout(new)
    assert "qnn.dense_pack" in _ops(packed)
    np.testing.assert_array_equal(evaluate(packed, {"x": xv})[0], got)


@pytest.mark.parametrize("dtype,zx,wz", [("uint8", 131, 0), ("int8", -4, 2)])
def test_qlinearconv_int32_conv_becomes_integer(dtype, zx, wz):
    """QLinearConv / ConvInteger as the frontend writes them: ``nn.conv2d`` of
    ``int32(x) - zx`` by ``int32(w) - wz`` (a constant in int8 range) → ``qnn.conv2d``."""
    x = Var("x", TensorType((1, 8, 6, 6), dtype))
    w = RNG.integers(-100, 100, (16, 8, 3, 3)).astype(np.int8)
    xi = Call("subtract", [Call("cast", [x], {"dtype": "int32"}), _c(zx, "int32")])
    wi = Call("subtract", [Call("cast", [Constant(w)], {"dtype": "int32"}), _c(wz, "int32")])
    func = Function([x], [Call("nn.conv2d", [xi, wi], CONV)])
    new = fake_quantization_to_integer(func)
    assert "qnn.conv2d" in _ops(new) and "nn.conv2d" not in _ops(new)
    info = np.iinfo(dtype)
    xv = RNG.integers(info.min, info.max + 1, (1, 8, 6, 6)).astype(dtype)
    np.testing.assert_array_equal(evaluate(new, {"x": xv})[0], evaluate(func, {"x": xv})[0])


def test_qlinearmatmul_int32_dense_becomes_integer():
    """QLinearMatMul / MatMulInteger with a constant B: ``nn.dense`` of ``int32(a) - za`` by
    ``transpose(int32(B) - zb)`` → ``qnn.dense``."""
    a = Var("a", TensorType((3, 32), "uint8"))
    b = RNG.integers(-100, 100, (32, 24)).astype(np.int8)
    ai = Call("subtract", [Call("cast", [a], {"dtype": "int32"}), _c(120, "int32")])
    bi = Call("subtract", [Call("cast", [Constant(b)], {"dtype": "int32"}), _c(-3, "int32")])
    func = Function([a], [Call("nn.dense", [ai, Call("transpose", [bi], {"axes": (1, 0)})])])
    new = fake_quantization_to_integer(func)
    assert "qnn.dense" in _ops(new) and "nn.dense" not in _ops(new)
    av = RNG.integers(0, 256, (3, 32)).astype(np.uint8)
    np.testing.assert_array_equal(evaluate(new, {"a": av})[0], evaluate(func, {"a": av})[0])
