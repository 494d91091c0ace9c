"""Computes of the weight-only quantized dense ops ``nn.dense_q8`` and ``nn.dense_q4`` (formats
and formulas on :mod:`kiln.relay.op.weight_quant`; docs/decisions/018).

One row (decode; the kernel's version for small symbolic extents): the weight is dequantized
inside the reduction, one output-channel block at a time: the schedule
(``kiln.schedules.dense_cpu``) vectorizes over the ``b`` channels of a packed block, so each
``k`` loads ``b`` int8 values (or ``b`` nibble words), widens them to float and feeds one FMA per
channel with the broadcast activation. Several rows (prefill): a *panel* stage (tag
``dense_quant_panel``) dequantizes one block of ``b`` channels over all ``K`` into floats, which
the schedule computes under the loop over channel blocks (``compute_at``), and the float
register-blocked dense streams every block of rows through it: each weight is dequantized once
a call, not once per block of rows (docs/decisions/053). int8's per-channel scale multiplies
the sum once, in the epilogue stage (fused with a bias add or whatever follows).
"""

from __future__ import annotations

from kiln.tir import loop as L
from kiln.tir import te
from kiln.topi.registry import register_compute

#: values of one Q4_1 block (ggml's ``QK4_1``)
Q4_BLOCK = 32


#: nibbles of one ``nn.dense_q4`` weight word (``k`` of one output channel)
Q4_WORD = 8


def panel_form(rows) -> bool:
    """Whether a quantized dense over ``rows`` rows takes the panel form (several rows: a
    static count of at least 2, or symbolic rows outside the kernel's version for small
    extents, which takes M < 2)."""
    return te.extents_version() == 0 and not (isinstance(rows, int) and rows < 2)


def _panel_sum(data: te.Tensor, panel: te.Tensor, out_shape, name: str, tag: str) -> te.Tensor:
    """``out[i, j] = Σ_k data[i, k] · panel[j // b, k, j % b]`` (a 3-D panel ``[N/b, K, b]``)
    or ``Σ_{kw,p} data[i, 8 kw + p] · panel[j // b, kw, p, j % b]`` (a 4-D one, q4's words)."""
    b = panel.shape[-1]
    if len(panel.shape) == 3:
        k = te.reduce_axis(data.shape[1], "k")
        return te.compute(out_shape, lambda i, j: te.sum(
            data[i, k.var] * panel[j // b, k.var, j % b], [k]), name=name, tag=tag)
    kw = te.reduce_axis(panel.shape[1], "kw")
    p = te.reduce_axis(panel.shape[2], "p")
    return te.compute(out_shape, lambda i, j: te.sum(
        data[i, kw.var * panel.shape[2] + p.var] * panel[j // b, kw.var, p.var, j % b], [kw, p]),
        name=name, tag=tag)


@register_compute("nn.dense_q8")
def dense_q8(inputs, attrs, out_type):
    """``out[i, j] = scale[j] · Σ_k data[i, k] · float(q[j // b, k, j % b])`` (int8 weight).

    Symmetric per-output-channel int8 (docs/decisions/018): the sum (stage ``dense_q8``, tag
    ``dense_q8``), then the scale (tag ``elemwise``, fused with what follows).

    Parameters
    ----------
    data : te.Tensor
        2-D, [M, K], float32.
    qweight : te.Tensor
        3-D, [N // b, K, b], int8 (``dense_pack``'s layout).
    scale : te.Tensor
        1-D, [N], float32.

    Returns
    -------
    te.Tensor
        2-D, [M, N], float32.
    """
    data, qweight, scale = inputs
    k = te.reduce_axis(data.shape[1], "k")
    b = qweight.shape[2]
    if panel_form(data.shape[0]):
        panel = te.compute(qweight.shape, lambda jb, kk, jl: L.Cast(
            "float32", qweight[jb, kk, jl]), name="dense_q8_panel", tag="dense_quant_panel")
        acc = _panel_sum(data, panel, out_type.shape, "dense_q8", "dense_q8")
    else:
        acc = te.compute(out_type.shape, lambda i, j: te.sum(
            data[i, k.var] * L.Cast("float32", qweight[j // b, k.var, j % b]), [k]),
            name="dense_q8", tag="dense_q8")
    return te.compute(out_type.shape, lambda i, j: acc[i, j] * scale[j],
                      name="dense_q8_scale", tag="elemwise")


def _nibble_scale(p: L.PrimExpr) -> L.PrimExpr:
    """``16^-p`` for ``p`` in 0..6, exact (float32), as a chain of selects."""
    value: L.PrimExpr = L.const(1.0, "float32")
    for s in range(1, Q4_WORD - 1):
        value = L.Select(L.eq(p, s), L.const(16.0 ** -s, "float32"), value)
    return value


@register_compute("nn.dense_q4")
def dense_q4(inputs, attrs, out_type):
    """GGUF Q4_1 dense: ``out[i, j] = Σ_k data[i, k] · (d[j, k // 32] · q[j, k] + m[j, k // 32])``.

    Computed as ``Σ_kb (d[j // b, kb, j % b] · Σ_ki xq[i, k] · float(nib) + m[j // b, kb,
    j % b] · xsum[i, kb])`` with ``k = 32 kb + ki``, ``p = k % 8``, ``word`` the uint32
    ``[j // b, k // 8, j % b]`` holding ``q[j, k]`` at bits ``4 p``:

    - ``nib = word & (15 << 4 p) = 16^p q`` for ``p < 7`` (no shift: the weight's power of 16
      is compensated by ``xq[i, k] = data[i, k] / 16^p``, exactly), ``nib = word >> 28 = q``
      for ``p = 7`` (``xq = data``);
    - ``xsum[i, kb] = Σ_ki data[i, k]``.

    Per weight one mask, one int→float conversion and one multiply-add into the block's partial
    sum (:func:`kiln.tir.te.block_sum`); ``d`` and ``m`` (float16) widened once per block.
    ``xq`` and ``xsum`` are per row, shared by all ``j``: stages of their own (tags
    ``dense_q4_x``, ``dense_q4_xsum``). The format is ggml's (``ggml/src/ggml-quants.c``,
    ``dequantize_row_q4_1``; docs/decisions/018).

    Parameters
    ----------
    data : te.Tensor
        2-D, [M, K], float32, K a multiple of 32.
    qweight : te.Tensor
        3-D, [N // b, K // 8, b], uint32 nibble words (:func:`kiln.relay.op.weight_quant.
        pack_nibble_words`).
    d, m : te.Tensor
        3-D, [N // b, K // 32, b], float16: each block's scale and minimum (GGUF's storage),
        widened to float32 once per block (``vcvtph2ps`` on x86 with F16C).

    Returns
    -------
    te.Tensor
        2-D, [M, N], float32; tag ``dense_q4``.
    """
    data, qweight, d, m = inputs
    rows, k = data.shape
    if panel_form(rows):
        return _panel_sum(data, _q4_panel(qweight, d, m), out_type.shape, "dense_q4", "dense_q4")
    r = te.reduce_axis(Q4_BLOCK, "r")
    xsum = te.compute((rows, k // Q4_BLOCK), lambda i, kb: te.sum(
        data[i, kb * Q4_BLOCK + r.var], [r]), name="dense_q4_xsum", tag="dense_q4_xsum")
    xq = te.compute((rows, k), lambda i, kk: data[i, kk] * _nibble_scale(kk % Q4_WORD),
                    name="dense_q4_x", tag="dense_q4_x")
    kb = te.reduce_axis(k // Q4_BLOCK, "kb")
    ki = te.reduce_axis(Q4_BLOCK, "ki")
    b = qweight.shape[2]
    words = Q4_BLOCK // Q4_WORD

    def body(i, j):
        word = qweight[j // b, kb.var * words + ki.var // Q4_WORD, j % b]
        p = ki.var % Q4_WORD
        shift = L.Cast("uint32", (p // (Q4_WORD - 1)) * 28)  # 28 for the top nibble, else 0
        mask = L.Binary("<<", L.const(15, "uint32"), L.Cast("uint32", (p % (Q4_WORD - 1)) * 4))
        nibble = L.Cast("int32", L.Binary("&", L.Binary(">>", word, shift), mask))
        x = xq[i, kb.var * Q4_BLOCK + ki.var]
        block = (j // b, kb.var, j % b)
        scale, low = L.Cast("float32", d[block]), L.Cast("float32", m[block])
        return te.block_sum(x * L.Cast("float32", nibble), [kb], [ki],
                            lambda part: scale * part + low * xsum[i, kb.var])

    return te.compute(out_type.shape, body, name="dense_q4", tag="dense_q4")


def _q4_panel(qweight: te.Tensor, d: te.Tensor, m: te.Tensor) -> te.Tensor:
    """The dequantized Q4_1 weight ``[N/b, K/8, 8, b]``: ``d · ((word >> 4 p) & 15) + m`` for
    ``k = 8 kw + p`` (float32; ``word = qweight[jb, kw, jl]``, ``d`` and ``m`` of block
    ``kw // 4``)."""
    nb, words, b = qweight.shape
    per_block = Q4_BLOCK // Q4_WORD

    def body(jb, kw, p, jl):
        shift = L.Cast("uint32", p * 4)
        nibble = L.Binary("&", L.Binary(">>", qweight[jb, kw, jl], shift), L.const(15, "uint32"))
        block = (jb, kw // per_block, jl)
        return (L.Cast("float32", d[block]) * L.Cast("float32", nibble)
                + L.Cast("float32", m[block]))

    return te.compute((nb, words, Q4_WORD, b), body, name="dense_q4_panel",
                      tag="dense_quant_panel")
