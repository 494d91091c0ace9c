"""RNN, GRU and LSTM over a symbolic sequence length, written as ONNX ``Scan`` loops.

Over a static length the converters of :mod:`kiln.frontend.onnx.converters.rnn` unroll the
sequence. A symbolic length cannot be unrolled: here the layer becomes, per direction, one
input projection over the whole sequence (``X @ W^T + Wb``, one GEMM) and a ``Scan`` whose step
is the recurrence of the ONNX operator spec (gate orders GRU z, r, h; LSTM i, o, f, c;
peepholes i, o, f), run by the VM as a loop of ``seq`` iterations
(:mod:`kiln.frontend.onnx.control_flow`). A reverse direction scans backwards
(``scan_input_directions``). The same limits as the unrolled form: no ``clip``, no LSTM
``input_forget``, activations Sigmoid, Tanh, Relu; ``sequence_lens`` is refused unless it is a
constant equal to a static sequence length everywhere (the same as omitted).

onnxruntime's DynamicQuantizeLSTM is an LSTM whose projections are integer matrix products of
dynamically quantized activations; it reuses this layer with its own projections
(:mod:`kiln.frontend.onnx.contrib.quantized`, a :class:`Layer` subclass).
"""

from __future__ import annotations

import numpy as np
from onnx import NodeProto, helper

from kiln.frontend.onnx.body import Body
from kiln.frontend.onnx.converters.rnn import ACTIVATIONS, DEFAULT_ACTIVATIONS, GATES
from kiln.relay.graph import TensorType

RECURRENT_OPS = tuple(GATES)


def needs_scan(node: NodeProto, x: TensorType | None) -> bool:
    """Whether ``node`` is a recurrent layer whose sequence axis (0, or 1 with ``layout=1``)
    is symbolic in its input ``x``, so it cannot be unrolled."""
    if node.op_type not in RECURRENT_OPS or x is None or len(x.shape) != 3:
        return False
    layout = next((a.i for a in node.attribute if a.name == "layout"), 0)
    return not isinstance(x.shape[1 if layout else 0], int)


def recurrent_scan(b: Body, layer: type[Layer] | None = None) -> None:
    """Write the RNN/GRU/LSTM node of ``b`` as projections and Scans (see the module);
    ``layer``: a :class:`Layer` subclass with other projections (its ``op`` names the layer)."""
    layer = layer or Layer
    op = layer.op or b.node.op_type
    if b.attr("clip") is not None or b.attr("input_forget", 0):
        raise b.unsupported("clip and input_forget are not supported")
    if b.has_input(4) and not _full_sequence_lens(b):
        raise b.unsupported("sequence_lens shorter than the sequence, or over a symbolic "
                            "sequence length")
    direction = b.attr("direction", "forward")
    dirs = 2 if direction == "bidirectional" else 1
    names = list(b.attr("activations", None) or list(DEFAULT_ACTIVATIONS[op]) * dirs)
    names = [n.decode() if isinstance(n, bytes) else n for n in names]
    if any(n not in ACTIVATIONS for n in names):
        raise b.unsupported(f"activations {names}")
    per_dir = len(DEFAULT_ACTIVATIONS[op])
    layout = int(b.attr("layout", 0))
    x = b.op("Transpose", b.input(0), perm=[1, 0, 2]) if layout else b.input(0)
    hidden = int(b.attr("hidden_size"))
    layers = layer(b, op, x, hidden, layout)
    results = [layers.direction(d, names[d * per_dir:(d + 1) * per_dir],
                               reverse=direction == "reverse" or d == 1) for d in range(dirs)]
    y = b.op("Concat", *[b.op("Unsqueeze", r[0], b.const([1])) for r in results], axis=1)
    finals = [b.op("Concat", *[b.op("Unsqueeze", r[k], b.const([0])) for r in results],
                   axis=0) for k in range(1, len(results[0]))]
    if layout:
        y = b.op("Transpose", y, perm=[2, 0, 1, 3])
        finals = [b.op("Transpose", f, perm=[1, 0, 2]) for f in finals]
    for k, value in enumerate([y, *finals]):
        b.output(k, value)


def _full_sequence_lens(b: Body) -> bool:
    """Whether ``sequence_lens`` (input 4) is a constant equal to the static sequence length
    of every batch entry, which computes what an omitted one does."""
    seq = b.input_type(0).shape[1 if b.attr("layout", 0) else 0]
    lens = b.constant_value(4)
    return isinstance(seq, int) and lens is not None and bool(np.all(lens == seq))


class Layer:
    """The per-direction pieces of one recurrent node (inputs as the ONNX spec numbers them:
    X, W, R, B, sequence_lens, initial_h, initial_c (LSTM), P (LSTM)).

    A subclass changes how an LSTM's pre-activations are computed by overriding
    :meth:`input_projection`, :meth:`recurrent_weights` and :meth:`lstm_preactivation`; its
    ``op`` then says which layer it is (None: the node's op type)."""

    op: str | None = None

    def __init__(self, b: Body, op: str, x: str, hidden: int, layout: int):
        self.b, self.op, self.x, self.hidden, self.layout = b, op, x, hidden, layout
        self.gates = GATES[op] * hidden
        self.dtype = np.dtype(b.input_type(0).dtype)
        self.elem = helper.np_dtype_to_tensor_dtype(self.dtype)

    def take(self, k: int, d: int) -> str:
        """Direction ``d`` of input ``k`` (its first axis; the batch axis for a layout-1
        initial state)."""
        axis = 1 if self.layout and k in (5, 6) else 0
        return self.b.op("Gather", self.b.input(k), self.b.const(d), axis=axis)

    def initial(self, k: int, d: int) -> str:
        if self.b.has_input(k):
            return self.take(k, d)
        batch = self.b.op("Slice", self.b.op("Shape", self.x), self.b.const([1]),
                          self.b.const([2]))
        shape = self.b.op("Concat", batch, self.b.const([self.hidden]), axis=0)
        zero = helper.make_tensor("zero", self.elem, [1], [0])
        return self.b.op("ConstantOfShape", shape, value=zero)  # zeros [batch, hidden]

    def bias(self, d: int, part: int) -> str | None:
        """Wb (part 0) or Rb (part 1) of direction ``d``; None without B."""
        if not self.b.has_input(3):
            return None
        start = part * self.gates
        return self.b.op("Slice", self.take(3, d), self.b.const([start]),
                         self.b.const([start + self.gates]))

    def input_projection(self, d: int) -> str:
        """``X @ W_d^T + Wb_d`` [seq, batch, gates]: the input's part of every step's
        pre-activations, one matrix product over the whole sequence."""
        b = self.b
        xw = b.op("MatMul", self.x, b.op("Transpose", self.take(1, d), perm=[1, 0]))
        wb = self.bias(d, 0)
        return b.op("Add", xw, wb) if wb else xw

    def recurrent_weights(self, d: int) -> tuple:
        """What a step of direction ``d`` needs to project ``h``, written outside the Scan:
        ``R_d^T`` [hidden, gates] and ``Rb_d`` (None without B)."""
        return self.b.op("Transpose", self.take(2, d), perm=[1, 0]), self.bias(d, 1)

    def lstm_preactivation(self, s: Body, xw_t: str, h: str, weights: tuple) -> str:
        """An LSTM step's pre-activations [batch, 4 * hidden] (gates i, o, f, c) from this
        step's row of :meth:`input_projection`, the previous ``h`` and
        :meth:`recurrent_weights`."""
        return s.op("Add", xw_t, _project(s, h, *weights))

    def direction(self, d: int, acts: list[str], reverse: bool) -> list[str]:
        """[Y_d [seq, batch, hidden], final states...] of direction ``d``."""
        b = self.b
        xw = self.input_projection(d)
        weights = self.recurrent_weights(d)
        s = b.child(f"dir{d}")
        names = ["h"] + (["c"] if self.op == "LSTM" else [])
        states = {k: f"{s.name}/{k}" for k in [*names, "xw_t"]}
        step = getattr(self, f"_{self.op.lower()}_step")
        new = step(s, states, weights, acts, d)
        outs = [f"{s.name}/{k}_next" for k in names] + [f"{s.name}/y_t"]
        for src, dst in zip([*new, new[0]], outs):
            s.nodes.append(helper.make_node("Identity", [src], [dst], name=dst))
        body = s.graph([(states[k], self.elem) for k in [*names, "xw_t"]], outs)
        inits = [self.initial(5, d)] + ([self.initial(6, d)] if self.op == "LSTM" else [])
        results = b.op("Scan", *inits, xw, outputs=len(outs), body=body, num_scan_inputs=1,
                       scan_input_directions=[int(reverse)],
                       scan_output_directions=[int(reverse)])
        return [results[-1], *results[:-1]]

    # a step writes its nodes into ``s`` (``v`` names its inputs h, c and xw_t) and returns
    # the new states, h first
    def _rnn_step(self, s: Body, v: dict, weights: tuple, acts, d) -> list[str]:
        return [s.op(acts[0], s.op("Add", v["xw_t"], _project(s, v["h"], *weights)))]

    def _gru_step(self, s: Body, v: dict, weights: tuple, acts, d) -> list[str]:
        f, g = acts
        r_t, rb = weights
        n, h = self.hidden, v["h"]
        xz, xr, xh = s.op("Split", v["xw_t"], s.const([n, n, n]), axis=-1, outputs=3)
        rz_t, rr_t, rh_t = s.op("Split", r_t, s.const([n, n, n]), axis=-1, outputs=3)
        rbz, rbr, rbh = (s.op("Split", rb, s.const([n, n, n]), axis=-1, outputs=3)
                         if rb else (None, None, None))
        z = s.op(f, s.op("Add", xz, _project(s, h, rz_t, rbz)))
        r = s.op(f, s.op("Add", xr, _project(s, h, rr_t, rbr)))
        if self.b.attr("linear_before_reset", 0):
            recur = s.op("Mul", r, _project(s, h, rh_t, rbh))
        else:
            recur = _project(s, s.op("Mul", r, h), rh_t, rbh)
        cand = s.op(g, s.op("Add", xh, recur))
        one = s.const(np.array(1, self.dtype))
        return [s.op("Add", s.op("Mul", s.op("Sub", one, z), cand), s.op("Mul", z, h))]

    def _lstm_step(self, s: Body, v: dict, weights: tuple, acts, d) -> list[str]:
        f, g, h_act = acts
        n, c_prev = self.hidden, v["c"]
        pre = self.lstm_preactivation(s, v["xw_t"], v["h"], weights)
        i, o, fg, c = s.op("Split", pre, s.const([n] * 4), axis=-1, outputs=4)
        peep = self.b.has_input(7)
        if peep:  # peepholes [3 * hidden]: i, o, f
            p_i, p_o, p_f = self.b.op("Split", self.take(7, d), self.b.const([n] * 3), axis=-1,
                                      outputs=3)
            i = s.op("Add", i, s.op("Mul", p_i, c_prev))
            fg = s.op("Add", fg, s.op("Mul", p_f, c_prev))
        i, fg = s.op(f, i), s.op(f, fg)
        new_c = s.op("Add", s.op("Mul", fg, c_prev), s.op("Mul", i, s.op(g, c)))
        if peep:
            o = s.op("Add", o, s.op("Mul", p_o, new_c))
        return [s.op("Mul", s.op(f, o), s.op(h_act, new_c)), new_c]


def _project(s: Body, v: str, w_t: str, bias: str | None) -> str:
    out = s.op("MatMul", v, w_t)
    return s.op("Add", out, bias) if bias else out
