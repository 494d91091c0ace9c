"""SplitConcat: pools and convolutions over single-use channel concatenations (reference: the
graph evaluator on the original function)."""

from __future__ import annotations

import numpy as np
import pytest

from kiln.relay.graph import Call, Constant, Function, TensorType, Var, post_order
from kiln.relay.interpreter import evaluate
from kiln.relay.transform.split_concat import split_concat

RNG = np.random.default_rng(3)


def _rand(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def _conv(x, oc, k=1):
    ic = x.checked_type.shape[1]
    return Call("nn.conv2d", [x, Constant(_rand(oc, ic, k, k))],
                {"strides": (1, 1), "padding": (k // 2,) * 4, "dilation": (1, 1), "groups": 1})


def _ops(func: Function) -> list[str]:
    return [n.op.name for n in post_order(func.outputs) if isinstance(n, Call)]


def _fire(x, squeeze, expand):
    """SqueezeNet's fire module: squeeze 1x1, then 1x1 and 3x3 expands concatenated."""
    s = Call("nn.relu", [_conv(x, squeeze)])
    return Call("concatenate", [Call("nn.relu", [_conv(s, expand)]),
                                Call("nn.relu", [_conv(s, expand, 3)])], {"axis": 1})


def _check_same(func: Function, out: Function, shape) -> None:
    data = _rand(*shape)
    np.testing.assert_allclose(evaluate(out, {"x": data})[0], evaluate(func, {"x": data})[0],
                               rtol=1e-4, atol=1e-4)


def test_conv_over_concat_becomes_a_sum_of_convs():
    x = Var("x", TensorType((1, 8, 6, 6), "float32"))
    func = Function([x], [_conv(Call("nn.relu", [_conv(_fire(x, 4, 8), 6)]), 3)])
    out = split_concat(func)
    assert "concatenate" not in _ops(out)
    assert _ops(out).count("nn.conv2d") == _ops(func).count("nn.conv2d") + 1
    _check_same(func, out, (1, 8, 6, 6))


def test_pool_moves_before_the_concat():
    x = Var("x", TensorType((1, 8, 7, 7), "float32"))
    pool = Call("nn.max_pool2d", [_fire(x, 4, 8)],
                {"pool_size": (3, 3), "strides": (2, 2), "padding": (0, 0, 0, 0),
                 "dilation": (1, 1), "ceil_mode": True})
    func = Function([x], [_conv(pool, 4)])
    out = split_concat(func)
    assert "concatenate" not in _ops(out) and _ops(out).count("nn.max_pool2d") == 2
    _check_same(func, out, (1, 8, 7, 7))


@pytest.mark.parametrize("case", ["second_user", "more_outputs", "grouped"])
def test_concat_kept(case):
    x = Var("x", TensorType((1, 8, 5, 5), "float32"))
    cat = _fire(x, 4, 8)
    if case == "second_user":    # the concatenation is a value of its own
        outputs = [_conv(cat, 4), cat]
    elif case == "more_outputs":  # 1000 classes from 16 channels: the partial sums cost more
        outputs = [_conv(cat, 40)]
    else:
        w = Constant(_rand(16, 1, 3, 3))
        outputs = [Call("nn.conv2d", [cat, w], {"strides": (1, 1), "padding": (1,) * 4,
                                                "dilation": (1, 1), "groups": 16})]
    func = Function([x], outputs)
    assert "concatenate" in _ops(split_concat(func))


def test_pass_name():
    assert split_concat.name == "SplitConcat"
