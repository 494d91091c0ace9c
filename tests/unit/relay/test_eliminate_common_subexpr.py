"""EliminateCommonSubexpr (kiln.relay.transform.eliminate_common_subexpr): equal calls become one,
different attributes, arguments or array attributes keep them apart, and the VM's own ops are
never merged; the result evaluates like the input."""

from __future__ import annotations

import numpy as np

from kiln.relay.graph import Call, Function, TensorType, Var, post_order
from kiln.relay.interpreter import evaluate
from kiln.relay.transform.eliminate_common_subexpr import eliminate_common_subexpr


def _calls(func: Function) -> list[str]:
    return [n.op.name for n in post_order(func.outputs) if isinstance(n, Call)]


def test_repeated_reshapes_of_one_tensor_become_one():
    x = Var("x", TensorType((1, 4, 6), "float32"))
    w = Var("w", TensorType((6, 6), "float32"))
    flat = [Call("reshape", [x], {"newshape": (4, 6)}) for _ in range(3)]
    outs = [Call("nn.dense", [f, w]) for f in flat]
    func = Function([x, w], [Call("add", [Call("add", [outs[0], outs[1]]), outs[2]])])
    out = eliminate_common_subexpr(func)
    # the three reshapes, then the three (now equal) dense calls, collapse
    assert _calls(out) == ["reshape", "nn.dense", "add", "add"]
    rng = np.random.default_rng(0)
    xv = rng.standard_normal((1, 4, 6)).astype(np.float32)
    wv = rng.standard_normal((6, 6)).astype(np.float32)
    np.testing.assert_allclose(evaluate(out, {"x": xv, "w": wv})[0],
                               evaluate(func, {"x": xv, "w": wv})[0], rtol=1e-6)


def test_different_attributes_or_arguments_stay_apart():
    x = Var("x", TensorType((2, 6), "float32"))
    y = Var("y", TensorType((2, 6), "float32"))
    func = Function([x, y], [
        Call("reshape", [x], {"newshape": (3, 4)}),
        Call("reshape", [x], {"newshape": (4, 3)}),
        Call("reshape", [y], {"newshape": (3, 4)}),
        Call("sum", [x], {"axis": (1,), "keepdims": False}),
        Call("sum", [x], {"axis": (1,), "keepdims": True}),
    ])
    assert len(_calls(eliminate_common_subexpr(func))) == 5


def test_large_array_attributes_compare_by_content():
    """numpy's repr of a large array elides its middle: two arrays differing only there must
    not be taken for one."""
    a = np.zeros(5000, np.int64)
    b = a.copy()
    b[2500] = 1
    x = Var("x", TensorType((5000,), "float32"))
    func = Function([x], [Call("reshape", [x], {"newshape": (5000,), "tag": a}),
                          Call("reshape", [x], {"newshape": (5000,), "tag": b}),
                          Call("reshape", [x], {"newshape": (5000,), "tag": a.copy()})])
    out = eliminate_common_subexpr(func)
    assert len(_calls(out)) == 2
    assert out.outputs[0] is out.outputs[2]


def test_constants_of_equal_contents_become_one():
    """Two Constants of one dtype, shape and bytes are one value (an unrolled LSTM's steps each
    had their own packed copy of the recurrent weight: 30 copies of 4 MB in ddddocr's CRNN);
    a different byte, dtype or shape keeps them apart, and the calls over the merged ones
    merge too."""
    from kiln.relay.graph import Constant

    x = Var("x", TensorType((2, 6), "float32"))
    rng = np.random.default_rng(1)
    w = rng.standard_normal((5, 6)).astype(np.float32)
    other = w.copy()
    other[4, 5] += 1
    weights = [Constant(w.copy()), Constant(w.copy()), Constant(other), Constant(w.copy())]
    outs = [Call("nn.dense", [x, c]) for c in weights]
    outs.append(Call("cast", [Constant(w.astype(np.float64))], {"dtype": "float32"}))
    func = Function([x], outs)
    out = eliminate_common_subexpr(func)
    consts = {n.uid for n in post_order(out.outputs) if isinstance(n, Constant)}
    dense = [n for n in post_order(out.outputs) if isinstance(n, Call)]
    # (w three times, other once; w as float64 stays apart)
    assert len(consts) == 3 and len(dense) == 3
    xv = rng.standard_normal((2, 6)).astype(np.float32)
    for got, want in zip(evaluate(out, {"x": xv}), evaluate(func, {"x": xv})):
        np.testing.assert_array_equal(got, want)
