"""The ``kv_append`` runtime op (type rule, numpy reference) and the KVAppend pass: which
concatenations become cache appends (docs/decisions/019-kv-cache.md)."""

from __future__ import annotations

import numpy as np
import pytest

from kiln import arith
from kiln.errors import ShapeError
from kiln.relay.graph import Call, Function, TensorType, Var, post_order
from kiln.relay.interpreter import evaluate
from kiln.relay.op_registry import get_op
from kiln.relay.transform.kv_append import kv_append

PAST, SEQ = arith.SymVar("past", 0), arith.SymVar("seq")


def _v(name, *shape, dtype="float32"):
    return Var(name, TensorType(shape, dtype))


def test_type_rule_adds_the_rows():
    t = Call("kv_append", [_v("p", PAST, 1, 3), _v("n", SEQ, 1, 3)]).checked_type
    assert t == TensorType((arith.add(PAST, SEQ), 1, 3), "float32")


@pytest.mark.parametrize("new, message", [
    (_v("n", SEQ, 2, 3), "the rows differ"),
    (_v("n", SEQ, 1, 3, dtype="float16"), "float32 past and a float16 new"),
    (_v("n", SEQ, 1, 3, 1), "the rows differ"),
])
def test_type_rule_errors(new, message):
    with pytest.raises(ShapeError, match=message):
        Call("kv_append", [_v("p", PAST, 1, 3), new])


def test_reference_is_the_concatenation():
    a, b = np.ones((2, 3), np.float32), np.zeros((1, 3), np.float32)
    np.testing.assert_array_equal(get_op("kv_append").ref(a, b), np.concatenate([a, b]))
    assert get_op("kv_append").runtime


def _ops(func: Function) -> list[str]:
    return [n.op.name for n in post_order(func.outputs) if isinstance(n, Call)]


def test_pass_rewrites_param_concats_on_axis_0_only():
    past, x = _v("past", PAST, 1, 3), _v("x", SEQ, 1, 3)
    new = Call("nn.relu", [x])
    present = Call("concatenate", [past, new], {"axis": 0})
    neg_axis = Call("concatenate", [_v("past2", PAST, 1, 3), new], {"axis": -3})
    other_axis = Call("concatenate", [_v("q", SEQ, 1, 3), x], {"axis": 1})
    computed = Call("concatenate", [new, past], {"axis": 0})  # the past is not first
    three = Call("concatenate", [past, new, x], {"axis": 0})
    params = [past, x] + [n for n in (neg_axis.args[0], other_axis.args[0])]
    func = Function(params, [present, neg_axis, other_axis, computed, three])
    out = kv_append(func)
    assert _ops(out).count("kv_append") == 2
    assert _ops(out).count("concatenate") == 3
    feeds = {"past": np.ones((2, 1, 3), np.float32), "past2": np.zeros((2, 1, 3), np.float32),
             "x": np.full((1, 1, 3), -1.0, np.float32), "q": np.ones((1, 1, 3), np.float32)}
    for got, want in zip(evaluate(out, feeds), evaluate(func, feeds)):
        np.testing.assert_array_equal(got, want)


def test_pass_leaves_a_concat_of_a_non_parameter():
    inner = Var("inner", TensorType((2, 3), "float32"))
    func = Function([_v("x", 2, 3)], [Call("concatenate", [inner, inner], {"axis": 0})])
    assert _ops(kv_append(func)) == ["concatenate"]
