"""ONNX RNN, GRU and LSTM over a static sequence, unrolled (kiln.frontend.onnx.converters.rnn):
values against onnxruntime, and the input projection made once over the whole sequence."""

from __future__ import annotations

import pytest
from onnx import helper
from test_frontend_ops import check, make_model, rand

from kiln.frontend import from_onnx
from kiln.relay.graph import Call, post_order

GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
SEQ, BATCH, INPUT, HIDDEN = 5, 2, 6, 4


def _layer(op: str, direction: str):
    dirs = 2 if direction == "bidirectional" else 1
    g = GATES[op] * HIDDEN
    inputs = {"x": rand(SEQ, BATCH, INPUT)}
    inits = {"w": rand(dirs, g, INPUT, seed=1, low=-0.5, high=0.5),
             "r": rand(dirs, g, HIDDEN, seed=2, low=-0.5, high=0.5),
             "b": rand(dirs, 2 * g, seed=3, low=-0.5, high=0.5)}
    node = helper.make_node(op, ["x", "w", "r", "b"], ["y", "y_h"], hidden_size=HIDDEN,
                            direction=direction)
    return node, inputs, inits, dirs


@pytest.mark.parametrize("op", sorted(GATES))
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
def test_matches_onnxruntime(op, direction):
    node, inputs, inits, _ = _layer(op, direction)
    check(node, inputs, 14, inits, outputs=("y", "y_h"))


@pytest.mark.parametrize("op", sorted(GATES))
def test_the_input_projection_is_one_dense_over_the_sequence(op):
    """Per direction one ``nn.dense`` of all ``seq * batch`` rows by W, then one of the
    hidden state by R per step: W is read once, not once a step (ddddocr's CRNN: a 4 MB W per
    step, its static build 12.1 -> 8.6 ms)."""
    node, inputs, inits, dirs = _layer(op, "bidirectional")
    mod, _ = from_onnx(make_model([node], inputs, ["y", "y_h"], 14, inits))
    rows = [n.args[0].checked_type.shape[0] for n in post_order(mod["main"].outputs)
            if isinstance(n, Call) and n.op.name == "nn.dense"]
    by_r = SEQ * (2 if op == "GRU" else 1)  # (GRU projects h twice: gates, then r * h)
    assert sorted(rows) == sorted([SEQ * BATCH] * dirs + [BATCH] * (by_r * dirs))
