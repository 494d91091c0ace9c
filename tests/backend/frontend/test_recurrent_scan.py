"""RNN, GRU and LSTM over a symbolic sequence length (and batch): one VM artifact with a layer
of each kind (directions forward, reverse, bidirectional; layouts 0 and 1; biases, initial
states, peepholes, GRU's linear_before_reset both ways) runs at several lengths against
onnxruntime. Each layer becomes an input projection and a Scan (kiln.frontend.onnx
.recurrent_scan)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from backend_helpers import assert_close_to_reference, run_onnxruntime
from onnx import TensorProto, helper, numpy_helper

import kiln
from kiln.frontend import from_onnx
from kiln.vm import VirtualMachine

SIZE, HIDDEN = 6, 5
RNG = np.random.default_rng(3)


def _weights(prefix: str, gates: int, dirs: int) -> dict[str, np.ndarray]:
    return {f"{prefix}_w": RNG.standard_normal((dirs, gates * HIDDEN, SIZE)) * 0.5,
            f"{prefix}_r": RNG.standard_normal((dirs, gates * HIDDEN, HIDDEN)) * 0.5,
            f"{prefix}_b": RNG.standard_normal((dirs, 2 * gates * HIDDEN)) * 0.2}


WEIGHTS = {**_weights("lstm", 4, 1), **_weights("bilstm", 4, 2), **_weights("gru", 3, 1),
           **_weights("gru0", 3, 1), **_weights("rnn", 1, 2),
           "lstm_p": RNG.standard_normal((1, 3 * HIDDEN)) * 0.3}


def _model(batchwise: bool) -> onnx.ModelProto:
    """The layers; ``batchwise`` adds a layout-1 copy of the bidirectional LSTM (onnxruntime
    runs no layout-1 layer: the test compares it with the layout-0 one, transposed)."""
    inits = dict(WEIGHTS)
    nodes = []

    def layer(op, name, x, gates, dirs, outputs, extra=(), weights=None, **attrs):
        weights = weights or name
        ins = [x, f"{weights}_w", f"{weights}_r", f"{weights}_b", *extra]
        nodes.append(helper.make_node(op, ins, [f"{name}_{o}" for o in outputs],
                                      hidden_size=HIDDEN, **attrs))
        return [f"{name}_{o}" for o in outputs]

    outs = []
    outs += layer("LSTM", "lstm", "x", 4, 1, ["y", "h", "c"], extra=["", "", "", "lstm_p"])
    outs += layer("LSTM", "bilstm", "x", 4, 2, ["y", "h"], direction="bidirectional")
    outs += layer("GRU", "gru", "x", 3, 1, ["y", "h"], direction="reverse",
                  linear_before_reset=1)
    outs += layer("GRU", "gru0", "x", 3, 1, ["y"])
    outs += layer("RNN", "rnn", "x", 1, 2, ["y", "h"], direction="bidirectional",
                  activations=["Tanh", "Relu"])
    if batchwise:
        outs += layer("LSTM", "bilstm_t", "xt", 4, 2, ["y", "h"], weights="bilstm",
                      direction="bidirectional", layout=1)
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["seq", "batch", SIZE])]
    if batchwise:
        inputs.append(helper.make_tensor_value_info("xt", TensorProto.FLOAT,
                                                    ["batch", "seq", SIZE]))
    graph = helper.make_graph(
        nodes, "recurrent", inputs,
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outs],
        [numpy_helper.from_array(v.astype(np.float32), k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)], ir_version=8)


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    mod, params = from_onnx(_model(batchwise=True))
    exe = kiln.build(mod, target="llvm", params=params)
    assert isinstance(exe, kiln.runtime.VMExecutable)
    path = tmp_path_factory.mktemp("recurrent") / "recurrent.so"
    exe.export_library(str(path))
    return VirtualMachine(kiln.runtime.load_module(str(path)), kiln.cpu())


@pytest.mark.parametrize("seq,batch", [(1, 2), (4, 3), (11, 1)])
def test_recurrent_layers_over_a_symbolic_length_match_onnxruntime(compiled, seq, batch):
    x = RNG.standard_normal((seq, batch, SIZE)).astype(np.float32)
    got = [o.numpy() for o in compiled["main"](x, np.ascontiguousarray(x.transpose(1, 0, 2)))]
    want = run_onnxruntime(_model(batchwise=False), {"x": x})
    bilstm_y, bilstm_h = want[3], want[4]
    want += [bilstm_y.transpose(2, 0, 1, 3), bilstm_h.transpose(1, 0, 2)]  # layout 1
    assert_close_to_reference(got, [np.ascontiguousarray(w) for w in want])
