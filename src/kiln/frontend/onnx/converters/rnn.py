"""Converters of ONNX recurrent layers RNN, GRU and LSTM, unrolled over the (static) sequence
(over a symbolic one the importer writes the layer as Scans instead,
:mod:`kiln.frontend.onnx.recurrent_scan`).

The input projection of every step is one ``nn.dense`` over the sequence; each time step adds
its recurrent projection (``nn.dense``), then gate slices and elementwise ops, following the
equations of the ONNX operator specs (gate orders: GRU z, r, h; LSTM i, o, f, c; peepholes
i, o, f). Directions forward, reverse and bidirectional; layouts 0
([seq, batch, ...]) and 1 ([batch, seq, ...]). Not supported: ``clip``, LSTM
``input_forget``, activations other than Sigmoid, Tanh and Relu, and sequence lengths shorter
than the sequence.
"""

from __future__ import annotations

import numpy as np

from kiln.frontend.onnx.context import ConvertContext
from kiln.frontend.onnx.registry import onnx_op
from kiln.relay.graph import Expr

#: the activations the layers take (ONNX name -> graph op)
ACTIVATIONS = {"Sigmoid": "sigmoid", "Tanh": "tanh", "Relu": "nn.relu"}
#: each layer's default activations per direction (the ONNX specs)
DEFAULT_ACTIVATIONS = {"RNN": ("Tanh",), "GRU": ("Sigmoid", "Tanh"),
                       "LSTM": ("Sigmoid", "Tanh", "Tanh")}
#: gates per layer (the row blocks of W and R)
GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}


class _Cell:
    """Builders shared by the three layers for one node."""

    def __init__(self, ctx: ConvertContext):
        self.ctx = ctx
        op = ctx.node.op_type
        if ctx.has_attr("clip"):
            raise ctx.unsupported("clip")
        if ctx.attr("input_forget", 0):
            raise ctx.unsupported("input_forget=1")
        self.hidden = int(ctx.attr("hidden_size"))
        self.direction = ctx.attr("direction", "forward")
        if self.direction not in ("forward", "reverse", "bidirectional"):
            raise ctx.unsupported(f"direction={self.direction!r}")
        self.dirs = 2 if self.direction == "bidirectional" else 1
        names = ctx.attr("activations", None) or list(DEFAULT_ACTIVATIONS[op]) * self.dirs
        if any(n not in ACTIVATIONS for n in names):
            raise ctx.unsupported(f"activations {names}")
        per_dir = len(DEFAULT_ACTIVATIONS[op])
        self.acts = [[ACTIVATIONS[n] for n in names[d * per_dir:(d + 1) * per_dir]]
                     for d in range(self.dirs)]
        self.layout = int(ctx.attr("layout", 0))
        x = ctx.input(0)
        if self.layout:
            x = ctx.call("transpose", [x], axes=(1, 0, 2))
        self.x = x
        self.seq, self.batch = x.checked_type.shape[:2]
        self.dtype = x.checked_type.dtype
        lens = ctx.optional_input(4)
        if lens is not None and np.any(ctx.const_value(4, "sequence_lens") != self.seq):
            raise ctx.unsupported("sequence lengths shorter than the sequence")

    def take(self, x: Expr, index: int, axis: int = 0) -> Expr:
        shape = x.checked_type.shape
        begin, end = [0] * len(shape), list(shape)
        begin[axis], end[axis] = index, index + 1
        part = self.ctx.call("strided_slice", [x], begin=tuple(begin), end=tuple(end),
                             strides=(1,) * len(shape))
        return self.ctx.reshape(part, shape[:axis] + shape[axis + 1:])

    def cols(self, v: Expr, k: int) -> Expr:
        """Gate ``k``'s block of ``hidden`` columns of [batch, gates * hidden] (or a vector)."""
        shape = v.checked_type.shape
        h = self.hidden
        begin = (0,) * (len(shape) - 1) + (k * h,)
        end = shape[:-1] + ((k + 1) * h,)
        return self.ctx.call("strided_slice", [v], begin=begin, end=end,
                             strides=(1,) * len(shape))

    def state(self, index: int, d: int) -> Expr:
        init = self.ctx.optional_input(index)
        if init is None:  # zeros [batch, hidden]; the batch may be symbolic
            return self.ctx.call("expand", [self.ctx.scalar(0.0, self.dtype)],
                                 newshape=(self.batch, self.hidden))
        if self.layout:
            init = self.ctx.call("transpose", [init], axes=(1, 0, 2))
        return self.take(init, d)

    def op(self, name: str, *args: Expr) -> Expr:
        return self.ctx.call(name, list(args))

    def weights(self, d: int) -> tuple[Expr, Expr, Expr | None, Expr | None]:
        """W_d, R_d ([gates*hidden, ...]) and the biases Wb_d, Rb_d ([gates*hidden])."""
        w, r = self.take(self.ctx.input(1), d), self.take(self.ctx.input(2), d)
        b = self.ctx.optional_input(3)
        if b is None:
            return w, r, None, None
        bd = self.take(b, d)
        n = GATES[self.ctx.node.op_type] * self.hidden
        wb = self.ctx.call("strided_slice", [bd], begin=(0,), end=(n,), strides=(1,))
        rb = self.ctx.call("strided_slice", [bd], begin=(n,), end=(2 * n,), strides=(1,))
        return w, r, wb, rb

    def project(self, v: Expr, weight: Expr, bias: Expr | None) -> Expr:
        out = self.op("nn.dense", v, weight)
        return out if bias is None else self.op("add", out, bias)

    def stack(self, parts: list[Expr], axis: int) -> Expr:
        shape = parts[0].checked_type.shape
        lifted = [self.ctx.reshape(p, shape[:axis] + (1,) + shape[axis:]) for p in parts]
        return lifted[0] if len(lifted) == 1 else \
            self.ctx.call("concatenate", lifted, axis=axis)

    def input_projection(self, w: Expr, wb: Expr | None) -> Expr:
        """``x · Wᵀ + Wb`` of every step at once, ``[seq, batch, gates * hidden]``: one GEMM
        over the sequence reads W once, not once a step (onnxruntime's layers do the same;
        ddddocr's CRNN streamed a 4 MB W from memory at every step, 107 us each)."""
        seq, batch, width = self.x.checked_type.shape
        out = self.project(self.ctx.reshape(self.x, (seq * batch, width)), w, wb)
        return self.ctx.reshape(out, (seq, batch, out.checked_type.shape[-1]))

    def run(self, step) -> list[Expr]:
        """Unroll ``step(d, xw_t, states) -> states`` (``xw_t``: step t's input projection,
        states[0] is H) over every direction; returns Y, the final states (Y_h, and Y_c for
        LSTM)."""
        ys, finals = [], []
        for d in range(self.dirs):
            states = step.init(d)
            reverse = self.direction == "reverse" or d == 1
            order = range(self.seq - 1, -1, -1) if reverse else range(self.seq)
            hs: list[Expr] = [None] * self.seq  # type: ignore[list-item]
            w, _, wb, _ = step.w[d]
            xw = self.input_projection(w, wb)
            for t in order:
                states = step(d, self.take(xw, t), states)
                hs[t] = states[0]
            ys.append(self.stack(hs, 0))
            finals.append(states)
        y = self.stack(ys, 1)  # [seq, dirs, batch, hidden]
        outs = [y] + [self.stack([f[k] for f in finals], 0) for k in range(len(finals[0]))]
        if self.layout:
            outs = [self.ctx.call("transpose", [outs[0]], axes=(2, 0, 1, 3))] + \
                [self.ctx.call("transpose", [o], axes=(1, 0, 2)) for o in outs[1:]]
        return outs


class _RNNStep:
    def __init__(self, cell: _Cell):
        self.cell = cell
        self.w = [cell.weights(d) for d in range(cell.dirs)]

    def init(self, d: int) -> list[Expr]:
        return [self.cell.state(5, d)]

    def __call__(self, d: int, xw: Expr, states: list[Expr]) -> list[Expr]:
        c, (_, r, _, rb) = self.cell, self.w[d]
        pre = c.op("add", xw, c.project(states[0], r, rb))
        return [c.op(c.acts[d][0], pre)]


class _GRUStep(_RNNStep):
    def __call__(self, d: int, xw: Expr, states: list[Expr]) -> list[Expr]:
        c, (_, r, _, rb) = self.cell, self.w[d]
        f, g = c.acts[d]
        h = states[0]
        hr = c.project(h, r, rb)
        z = c.op(f, c.op("add", c.cols(xw, 0), c.cols(hr, 0)))
        rt = c.op(f, c.op("add", c.cols(xw, 1), c.cols(hr, 1)))
        rh_w = c.ctx.call("strided_slice", [r], begin=(2 * c.hidden, 0),
                          end=(3 * c.hidden, c.hidden), strides=(1, 1))
        rb_h = None if rb is None else c.cols(rb, 2)
        if c.ctx.attr("linear_before_reset", 0):
            recur = c.op("multiply", rt, c.project(h, rh_w, rb_h))
        else:
            recur = c.project(c.op("multiply", rt, h), rh_w, rb_h)
        cand = c.op(g, c.op("add", c.cols(xw, 2), recur))
        one = c.ctx.scalar(1.0, c.dtype)
        new = c.op("add", c.op("multiply", c.op("subtract", one, z), cand),
                   c.op("multiply", z, h))
        return [new]


class _LSTMStep(_RNNStep):
    def __init__(self, cell: _Cell):
        super().__init__(cell)
        p = cell.ctx.optional_input(7)
        self.p = [None if p is None else cell.take(p, d) for d in range(cell.dirs)]

    def init(self, d: int) -> list[Expr]:
        return [self.cell.state(5, d), self.cell.state(6, d)]

    def __call__(self, d: int, xw: Expr, states: list[Expr]) -> list[Expr]:
        c, (_, r, _, rb) = self.cell, self.w[d]
        f, g, h_act = c.acts[d]
        h, cell_state = states
        pre = c.op("add", xw, c.project(h, r, rb))
        p = self.p[d]  # peepholes [3 * hidden]: i, o, f
        i = c.op(f, peep_gate(c, pre, p, 0, 0, cell_state))
        fg = c.op(f, peep_gate(c, pre, p, 2, 2, cell_state))
        cand = c.op(g, c.cols(pre, 3))
        new_c = c.op("add", c.op("multiply", fg, cell_state), c.op("multiply", i, cand))
        o = c.op(f, peep_gate(c, pre, p, 1, 1, new_c))
        return [c.op("multiply", o, c.op(h_act, new_c)), new_c]


def peep_gate(c: _Cell, pre: Expr, p: Expr | None, gate: int, peephole: int,
              state: Expr) -> Expr:
    """Gate ``gate`` of the pre-activations, plus the peephole term ``P[peephole] * state``."""
    value = c.cols(pre, gate)
    if p is None:
        return value
    return c.op("add", value, c.op("multiply", c.cols(p, peephole), state))


@onnx_op("RNN", since=7)
def rnn(ctx: ConvertContext) -> list[Expr]:
    cell = _Cell(ctx)
    return cell.run(_RNNStep(cell))


@onnx_op("GRU", since=7)
def gru(ctx: ConvertContext) -> list[Expr]:
    cell = _Cell(ctx)
    return cell.run(_GRUStep(cell))


@onnx_op("LSTM", since=7)
def lstm(ctx: ConvertContext) -> list[Expr]:
    cell = _Cell(ctx)
    return cell.run(_LSTMStep(cell))
