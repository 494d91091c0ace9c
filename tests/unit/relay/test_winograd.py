"""Winograd convolutions (docs/decisions/050): where AlterOpLayout chooses them, the compile-time
weight transform and the op's reference against the direct conv, the lowered kernel on the
loop-IR interpreter, and the op's errors for bad input."""

from __future__ import annotations

import numpy as np
import pytest
from test_lowering import run_lowered

from kiln.errors import KilnError, ShapeError
from kiln.relay.graph import Call, Constant, Function, TensorType, Var, post_order
from kiln.relay.interpreter import evaluate
from kiln.relay.op.winograd import winograd_weight
from kiln.relay.op_registry import get_op
from kiln.relay.transform import winograd
from kiln.relay.transform.alter_op_layout import alter_op_layout
from kiln.relay.transform.fuse_ops import fuse_ops
from kiln.target import Target
from kiln.tir.layout import transform_array

RNG = np.random.default_rng(11)
NATIVE = "llvm -mtriple=x86_64-linux-gnu -mcpu=skylake-avx512"


def _rand(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def _conv(shape, oc, k, stride=1, pad=1, dilation=1, groups=1):
    x = Var("x", TensorType(shape, "float32"))
    w = Constant(_rand(oc, shape[1] // groups, k, k) / np.float32(3 * shape[1] ** 0.5))
    y = Call("nn.conv2d", [x, w], {"strides": (stride, stride), "padding": (pad,) * 4,
                                   "dilation": (dilation, dilation), "groups": groups})
    y = Call("nn.relu", [Call("nn.bias_add", [y, Constant(_rand(oc))], {"axis": 1})])
    return Function([x], [y])


def _conv_ops(func: Function) -> list[str]:
    return [n.op.name for n in post_order(func.outputs)
            if isinstance(n, Call) and "conv2d" in n.op.name]


WINOGRAD_OP, DIRECT_OP = "nn.conv2d_winograd_NCHWc", "nn.conv2d_NCHWc"


@pytest.mark.parametrize("shape,oc,k,stride,dilation,groups,expect", [
    ((1, 64, 56, 56), 64, 3, 1, 1, 1, 4),          # resnet50 stage 1: F(4x4) on 56x56
    ((1, 128, 28, 28), 128, 3, 1, 1, 1, 4),        # stage 2
    ((1, 256, 14, 14), 256, 3, 1, 1, 1, 2),        # stage 3: F(2x2) below 28x28
    ((1, 512, 7, 7), 512, 3, 1, 1, 1, 2),          # stage 4
    ((1, 16, 4, 4), 16, 3, 1, 1, 1, 2),            # the smallest measured
    ((1, 256, 56, 56), 64, 1, 1, 1, 1, None),      # 1x1
    ((1, 128, 56, 56), 128, 3, 2, 1, 1, None),     # strided 3x3
    ((1, 64, 28, 28), 64, 3, 1, 2, 1, None),       # dilated
    ((1, 128, 28, 28), 128, 3, 1, 1, 32, None),    # grouped
    ((1, 64, 28, 28), 64, 5, 1, 1, 1, None),       # 5x5
    ((1, 8, 56, 56), 8, 3, 1, 1, 1, None),         # fewer channels than MIN_CHANNELS
    ((1, 64, 3, 3), 64, 3, 1, 1, 1, None),         # a plane under MIN_PIXELS
    ((1, 3, 56, 56), 64, 3, 1, 1, 1, None),        # an image, read as NCHW1c
])
def test_rule_picks_winograd_for_stride_one_3x3(shape, oc, k, stride, dilation, groups,
                                                 expect):
    """Resnet-like 3x3 stride-1 convs run as Winograd (F(4x4) on planes from 28x28), 1x1,
    strided, dilated, grouped, 5x5, tiny and image-input convs as the direct kernel."""
    with Target(NATIVE):
        altered = alter_op_layout(_conv(shape, oc, k, stride, pad=k // 2 * dilation,
                                        dilation=dilation, groups=groups))
    convs = [n for n in post_order(altered.outputs)
             if isinstance(n, Call) and "conv2d" in n.op.name]
    assert [c.op.name for c in convs] == [DIRECT_OP if expect is None else WINOGRAD_OP]
    if expect is not None:
        assert convs[0].attrs["tile_size"] == expect


def test_integer_conv_stays_direct():
    """An int32 ``nn.conv2d`` (ConvInteger's exact products) is never a Winograd conv: its
    transforms have fractions."""
    x = Var("x", TensorType((1, 64, 28, 28), "int32"))
    w = Constant(RNG.integers(-128, 128, (64, 64, 3, 3)).astype(np.int32))
    y = Call("nn.conv2d", [x, w], {"strides": (1, 1), "padding": (1,) * 4,
                                   "dilation": (1, 1), "groups": 1})
    with Target(NATIVE):
        altered = alter_op_layout(Function([x], [y]))
    assert _conv_ops(altered) == [DIRECT_OP]


def test_rule_is_off_with_the_switch(monkeypatch):
    monkeypatch.setattr(winograd, "WINOGRAD", False)
    with Target(NATIVE):
        altered = alter_op_layout(_conv((1, 64, 56, 56), 64, 3))
    assert _conv_ops(altered) == ["nn.conv2d_NCHWc"]


@pytest.mark.parametrize("tile", [2, 4])
@pytest.mark.parametrize("pad", [0, 1])
def test_reference_matches_direct_conv(tile, pad):
    """The op's numpy reference (Lavin & Gray's algorithm) on the compile-time transformed
    weight equals the direct conv; odd plane, batch 2, two channel blocks each side."""
    x, w = _rand(2, 16, 9, 7), _rand(24, 16, 3, 3)
    direct = get_op("nn.conv2d").ref(x, w, strides=(1, 1), padding=(pad,) * 4,
                                     dilation=(1, 1), groups=1)
    u = winograd_weight(w, tile, 8, 12)
    assert u.shape == (2, (tile + 2) ** 2, 2, 8, 12) and u.dtype == np.float32
    got = get_op("nn.conv2d_winograd_NCHWc").ref(transform_array(x, "NCHW", "NCHW8c"), u,
                                                 padding=(pad,) * 4, tile_size=tile)
    np.testing.assert_allclose(transform_array(got, "NCHW12c", "NCHW"), direct,
                               rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("tile", [2, 4])
def test_lowered_kernel_matches_direct_conv(monkeypatch, tile):
    """The fused kernel (transforms, GEMM, bias + ReLU in the output transform), lowered and
    scheduled, run on the loop-IR interpreter: equal to the unaltered graph."""
    monkeypatch.setattr(winograd, "MIN_CHANNELS", 1)
    monkeypatch.setattr(winograd, "MIN_PIXELS", 1)
    monkeypatch.setattr(winograd, "TILE", tile)
    func = _conv((1, 16, 7, 5), 16, 3)
    with Target(NATIVE):
        altered = alter_op_layout(func)
    assert _conv_ops(altered) == ["nn.conv2d_winograd_NCHWc"]
    data = _rand(1, 16, 7, 5)
    (got,) = run_lowered(fuse_ops(altered), {"x": data})
    np.testing.assert_allclose(got, evaluate(func, {"x": data})[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("data,weight,attrs,message", [
    ((1, 2, 8, 8, 8), (2, 15, 2, 8, 8), {"tile_size": 2}, "transform points"),
    ((1, 2, 8, 8, 8), (2, 16, 2, 8, 8), {"tile_size": 4}, "do not match"),
    ((1, 2, 8, 8, 8), (2, 16, 4, 8, 8), {"tile_size": 2}, "input channel blocks differ"),
    ((1, 2, 2, 8, 8), (2, 16, 2, 8, 8), {"tile_size": 2}, "smaller than the 3x3 kernel"),
    ((1, 2, 8, 8), (2, 16, 2, 8, 8), {"tile_size": 2}, "rank"),
])
def test_bad_input_is_a_shape_error(data, weight, attrs, message):
    with pytest.raises(ShapeError, match=message) as err:
        get_op("nn.conv2d_winograd_NCHWc").infer(
            [TensorType(data, "float32"), TensorType(weight, "float32")],
            dict(attrs, padding=(0, 0, 0, 0)))
    assert isinstance(err.value, KilnError)


@pytest.mark.parametrize("shape,rows_outer", [
    ((1, 64, 56, 56), True),   # V (64 x 36 x 196 values) is larger than U (64 x 36 x 64)
    ((1, 512, 7, 7), False),   # U (512 x 16 x 512) is larger than V (512 x 16 x 16)
])
def test_gemm_threads_split_the_larger_operand(shape, rows_outer):
    """The GEMM's threads split its transform points (rows) when the transformed input is
    larger than the transformed weight, else its channel blocks, as a direct conv's do
    (``nn_cpu._rows_outer``): the input transform is the data, the 5-D U the weight."""
    from kiln.backend import te_compiler
    from kiln.relay.graph import PrimitiveCall
    from kiln.schedules import nn_cpu
    from kiln.tir.lower import Schedule

    with Target(NATIVE):
        func = fuse_ops(alter_op_layout(_conv(shape, shape[1], 3)))
    (call,) = [c for c in post_order(func.outputs)
               if isinstance(c, PrimitiveCall) and "winograd" in c.name]
    _, out = te_compiler.to_te(call.body)
    gemm = next(t for t in Schedule(out).order if t.tag == "conv2d_winograd_NCHWc")
    assert nn_cpu._rows_outer(gemm) is rows_outer
