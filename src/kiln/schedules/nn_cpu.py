"""Per-op CPU tensor-level schedules (in the spirit of TVM's topi/x86, much simpler).

conv2d: the padded input is materialized once (no bounds test in the inner loop), and the
reduction runs outside the output's spatial loops (n, o, rc, ry, rx, y, x): the innermost loop
walks an output row contiguously with one weight value, which the C compiler vectorizes without
reassociating float sums.
"""

from __future__ import annotations

from kiln.ir.lower import Schedule
from kiln.ir.te import Tensor
from kiln.schedules.cpu import register_schedule


@register_schedule("conv2d")
def schedule_conv2d(sch: Schedule, conv: Tensor) -> None:
    for t in conv.inputs():
        if t.tag == "pad":
            sch[t].compute_root()
    n, o, y, x = conv.axes
    rc, ry, rx = conv.body.axes
    sch[conv].reorder(n, o, rc, ry, rx, y, x)


@register_schedule("softmax_exp")
def schedule_softmax_exp(sch: Schedule, t: Tensor) -> None:
    # exp(x - max) is read twice (sum and division): compute it once.
    sch[t].compute_root()
