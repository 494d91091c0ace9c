"""SplitGroups: grouped (not depthwise) integer convolutions as one convolution per group, equal
to the original on the graph evaluator (int32, exactly)."""

from __future__ import annotations

import numpy as np
import pytest

from kiln.relay.graph import Call, Constant, Function, TensorType, Var, post_order
from kiln.relay.interpreter import evaluate
from kiln.relay.transform.split_groups import split_groups

RNG = np.random.default_rng(17)


def _func(cin: int, cout: int, groups: int, dtype: str = "int8") -> Function:
    x = Var("x", TensorType((1, cin, 7, 7), dtype))
    w = Constant(RNG.integers(-128, 128, (cout, cin // groups, 3, 3)).astype(np.int8))
    attrs = {"strides": (1, 1), "padding": (1,) * 4, "dilation": (1, 1), "groups": groups,
             "input_zero_point": 5}
    return Function([x], [Call("qnn.conv2d", [x, w], attrs)])


def _convs(func: Function) -> list[int]:
    return [n.attrs["groups"] for n in post_order(func.outputs)
            if isinstance(n, Call) and n.op.name == "qnn.conv2d"]


@pytest.mark.parametrize("dtype", ["int8", "uint8"])
def test_groups_become_convs_over_slices(dtype):
    func = _func(48, 32, 2, dtype)
    out = split_groups(func)
    assert _convs(out) == [1, 1]
    assert out.outputs[0].op.name == "concatenate"
    info = np.iinfo(dtype)
    x = RNG.integers(info.min, info.max + 1, (1, 48, 7, 7)).astype(dtype)
    np.testing.assert_array_equal(evaluate(out, {"x": x})[0], evaluate(func, {"x": x})[0])


@pytest.mark.parametrize("cin,cout,groups", [
    (32, 32, 32),    # depthwise: its own blocked kernel
    (64, 64, 8),     # 8 channels a group: below MIN_GROUP_CHANNELS
    (544, 544, 17),  # more than MAX_GROUPS groups
    (32, 32, 1),
])
def test_other_convs_unchanged(cin, cout, groups):
    out = split_groups(_func(cin, cout, groups))
    assert _convs(out) == [groups]
