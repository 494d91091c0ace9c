"""CPU schedules of the transformer encoder's row-wise ops (issue 17): LayerNorm.

Kept apart from :mod:`kiln.schedules.nn_cpu` (convolutions, dense) so each file stays one
concept. May import kiln.ir and kiln.schedules.cpu.
"""

from __future__ import annotations

from kiln.ir.lower import Schedule
from kiln.ir.te import Tensor
from kiln.schedules.cpu import register_schedule


@register_schedule("layer_norm_sqsum")
def schedule_layer_norm(sch: Schedule, t: Tensor) -> None:
    """``nn.layer_norm`` (``kiln.ops.nn.layer_norm``: the row sum, the sum of squared
    deviations, the normalized row) computed one row at a time in cache, both sums split into
    vector partial results (:mod:`kiln.schedules.row_fusion`). Before: three whole-tensor
    nests with scalar sums, 2.6 ns per element on paraphrase-MiniLM-L3's [1, 32, 384]."""
    sch.attrs["fuse_rows"] = True
