"""Kernel taps clipped to the valid window (kiln.relay.transform.clip_taps): the regions of an
axis, which convs are clipped, and the rewritten graph against the NCHW conv (interpreter)."""

from __future__ import annotations

import numpy as np
import pytest

from kiln.relay.graph import Call, Constant, Function, TensorType, Var, post_order
from kiln.relay.interpreter import evaluate
from kiln.relay.transform.alter_op_layout import alter_op_layout
from kiln.relay.transform.clip_taps import axis_regions, valid_fraction


def _rand(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def test_axis_regions_of_deeplab_dilations():
    # 20 rows, 3 taps at dilation 12, pad 12: taps -12 / 0 / +12 around each row
    assert axis_regions(20, 20, 3, 1, 12, 12) == [(0, 8, 1, 2), (8, 12, 1, 1), (12, 20, 0, 1)]
    assert axis_regions(20, 20, 3, 1, 24, 24) == [(0, 20, 1, 1)]  # only the centre tap
    assert axis_regions(17, 17, 3, 1, 12, 12) == [(0, 5, 1, 2), (5, 12, 1, 1), (12, 17, 0, 1)]
    assert valid_fraction(axis_regions(20, 20, 3, 1, 12, 12), 3) == pytest.approx(36 / 60)
    # strided: output y reads y * 2 + r - 1
    assert axis_regions(8, 4, 3, 2, 1, 1) == [(0, 1, 1, 2), (1, 4, 0, 2)]
    assert axis_regions(7, 4, 3, 2, 1, 1) == [(0, 1, 1, 2), (1, 3, 0, 2), (3, 4, 0, 1)]
    # a row whose every tap reads padding (its value is the bias): not clipped
    assert axis_regions(4, 12, 3, 1, 1, 5) is None


def _conv(shape, oc, dilation, pad, stride=1):
    x = Var("x", TensorType(shape, "float32"))
    w = Constant(_rand(oc, shape[1], 3, 3, seed=1))
    y = Call("nn.conv2d", [x, w], {"strides": (stride, stride), "padding": (pad,) * 4,
                                   "dilation": (dilation, dilation), "groups": 1})
    y = Call("nn.relu", [Call("nn.bias_add", [y, Constant(_rand(oc, seed=2))], {"axis": 1})])
    return Function([x], [y])


@pytest.mark.parametrize("shape,dilation,kernels", [
    ((1, 16, 20, 20), 12, [(2, 2), (2, 1), (2, 2), (1, 2), (1, 1), (1, 2), (2, 2), (2, 1),
                           (2, 2)]),
    ((1, 16, 20, 20), 24, [(1, 1)]),
    ((1, 8, 33, 17), 12, [(3, 2), (3, 1), (3, 2)] * 1 + [(2, 2), (2, 1), (2, 2)] * 2),
    ((1, 8, 33, 17), 36, [(1, 1)]),
])
def test_clipped_conv_matches_the_padded_one(shape, dilation, kernels):
    func = _conv(shape, 16, dilation, dilation)
    altered = alter_op_layout(func)
    convs = [n for n in post_order(altered.outputs)
             if isinstance(n, Call) and n.op.name == "nn.conv2d_NCHWc"]
    assert sorted(c.args[1].data.shape[2:4] for c in convs) == sorted(kernels)
    assert all(c.attrs["padding"] == (0, 0, 0, 0) for c in convs)
    data = _rand(*shape, seed=3)
    np.testing.assert_allclose(evaluate(altered, {"x": data})[0],
                               evaluate(func, {"x": data})[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("shape,dilation,pad", [
    ((1, 16, 4, 6), 1, 1),    # 3×3 pad 1 on a 4×6 map: 74 % of taps valid, undilated
    ((1, 16, 2, 2), 1, 1),    # 44 %, undilated: left alone
    ((1, 16, 20, 20), 2, 2),  # dilation 2 on 20×20: 93 %
    ((1, 16, 12, 12), 4, 4),  # dilation 4 on 12×12: 60 %
])
def test_mostly_valid_convs_are_not_clipped(shape, dilation, pad):
    altered = alter_op_layout(_conv(shape, 16, dilation, pad))
    # (an undilated one may run as Winograd, decision 050: its padding is kept the same way)
    convs = [n for n in post_order(altered.outputs) if isinstance(n, Call)
             and n.op.name in ("nn.conv2d_NCHWc", "nn.conv2d_winograd_NCHWc")]
    assert len(convs) == 1 and convs[0].attrs["padding"] == (pad,) * 4
