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
    """``out[i, j] = Σ_{kb, ki} data[i, k] · (d[j // b, kb, j % b] · q + m[j // b, kb, j % b])``
    with ``k = 32 kb + ki`` and ``q`` the nibble ``ki % 2`` of byte ``[j // b, k // 2, j % b]``;
    the reduction runs over the block ``kb`` and its 32 values ``ki``."""
    data, qweight, d, m = inputs
    kb = te.reduce_axis(data.shape[1] // Q4_BLOCK, "kb")
    ki = te.reduce_axis(Q4_BLOCK, "ki")
    b = qweight.shape[2]

    def body(i, j):
        byte = qweight[j // b, kb.var * (Q4_BLOCK // 2) + ki.var // 2, j % b]
        shift = L.Cast("int32", (ki.var % 2) * 4)
        nibble = L.Binary("&", L.Binary(">>", L.Cast("int32", byte), shift),
                          L.const(15, "int32"))
        w = d[j // b, kb.var, j % b] * L.Cast("float32", nibble) + m[j // b, kb.var, j % b]
        return te.sum(data[i, kb.var * Q4_BLOCK + ki.var] * w, [kb, ki])

    return te.compute(out_type.shape, body, name="dense_q4", tag="dense_q4")
