"""Computes of the weight-only quantized dense ops ``nn.dense_q8`` and ``nn.dense_q4`` (formats
and formulas on :mod:`kiln.ir.ops.weight_quant`; docs/decisions/018).

The weight is dequantized inside the reduction, one output-channel block at a time: the
schedule (``kiln.schedules.nn_cpu``) vectorizes over the ``b`` channels of a packed block, so
each ``k`` loads ``b`` int8 values (or ``b`` bytes of nibbles), widens them to float and feeds
one FMA per channel with the broadcast activation. int8's per-channel scale multiplies the sum
once, in the epilogue stage (fused with a bias add or whatever follows).
"""

from __future__ import annotations

from kiln.ir import loop as L
from kiln.ir import te
from kiln.ir.op_registry import register_compute
from kiln.ir.ops.weight_quant import Q4_BLOCK


@register_compute("nn.dense_q8")
def dense_q8(inputs, attrs, out_type):
    """``out[i, j] = scale[j] · Σ_k data[i, k] · float(q[j // b, k, j % b])``."""
    data, qweight, scale = inputs
    k = te.reduce_axis(data.shape[1], "k")
    b = qweight.shape[2]
    acc = te.compute(out_type.shape, lambda i, j: te.sum(
        data[i, k.var] * L.Cast("float32", qweight[j // b, k.var, j % b]), [k]),
        name="dense_q8", tag="dense_q8")
    return te.compute(out_type.shape, lambda i, j: acc[i, j] * scale[j],
                      name="dense_q8_scale", tag="elemwise")


@register_compute("nn.dense_q4")
def dense_q4(inputs, attrs, out_type):
    """``out[i, j] = Σ_kb (d[j // b, kb, j % b] · Σ_ki xq[i, k] · float(byte & mask) +
    m[j // b, kb, j % b] · xsum[i, kb])`` with ``k = 32 kb + ki``, ``byte`` the byte
    ``[j // b, k // 2, j % b]`` holding ``q[j, k]`` in its nibble ``k % 2``, ``mask`` that nibble
    in place (15 or 240) and ``xq[i, k] = data[i, k] / 16^(k % 2)`` (the high nibble is read as
    ``16 q`` without a shift, exactly compensated), ``xsum[i, kb] = Σ_ki data[i, k]``: per
    weight one mask, one widening and one multiply-add into the block's partial sum; ``d`` and
    ``m`` once per block (:func:`kiln.ir.te.block_sum`). ``xq`` and ``xsum`` are per row, shared
    by all ``j``: stages of their own (tags ``dense_q4_x``, ``dense_q4_xsum``)."""
    data, qweight, d, m = inputs
    rows, k = data.shape
    r = te.reduce_axis(Q4_BLOCK, "r")
    xsum = te.compute((rows, k // Q4_BLOCK), lambda i, kb: te.sum(
        data[i, kb * Q4_BLOCK + r.var], [r]), name="dense_q4_xsum", tag="dense_q4_xsum")
    # 1 for even k, 1/16 for odd k (exact: a power of two)
    xq = te.compute((rows, k), lambda i, kk: data[i, kk] * (
        L.Cast("float32", kk % 2) * L.const(-15 / 16, "float32") + L.const(1.0, "float32")),
        name="dense_q4_x", tag="dense_q4_x")
    kb = te.reduce_axis(k // Q4_BLOCK, "kb")
    ki = te.reduce_axis(Q4_BLOCK, "ki")
    b = qweight.shape[2]

    def body(i, j):
        byte = qweight[j // b, kb.var * (Q4_BLOCK // 2) + ki.var // 2, j % b]
        mask = L.Binary("<<", L.const(15, "int32"), L.Cast("int32", (ki.var % 2) * 4))
        nibble = L.Binary("&", L.Cast("int32", byte), mask)
        x = xq[i, kb.var * Q4_BLOCK + ki.var]
        block = (j // b, kb.var, j % b)
        return te.block_sum(x * L.Cast("float32", nibble), [kb], [ki],
                            lambda part: d[block] * part + m[block] * xsum[i, kb.var])

    return te.compute(out_type.shape, body, name="dense_q4", tag="dense_q4")
