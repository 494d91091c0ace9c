"""Schedules: how each fused function's loops run on a target.

``cpu`` holds the default tensor-level and loop-level CPU schedules; ``nn_cpu`` the per-op
overrides (conv2d loop order, materialized padding, softmax); ``transformer_cpu`` the
row-wise ops of transformer encoders (LayerNorm). ``primitives`` are the checked loop
transformations they use. May import kiln.ir and kiln.errors.
"""

from kiln.schedules import nn_cpu, transformer_cpu  # noqa: F401
from kiln.schedules.cpu import (  # noqa: F401
    register_schedule,
    schedule_loops,
    schedule_te,
    small_extents,
    tails_allowed,
)
