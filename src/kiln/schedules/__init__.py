"""Schedules: how each fused function's loops run on a target.

``cpu`` holds the default tensor-level and loop-level CPU schedules; ``nn_cpu`` the per-op
overrides of convolutions, pools and softmax, ``conv_blocks`` the sizes of the convolutions'
blocks; ``dense_cpu`` the matrix products (matmul, einsum, dense_pack, the weight-quantized
denses); ``amx`` which integer stages try the AMX tile kernel first; ``transformer_cpu`` the
row-wise ops of transformer encoders (LayerNorm, attention). ``primitives`` are the checked loop
transformations they use.

May import: kiln.topi, kiln.tir, kiln.arith, kiln.target (and kiln.errors).
"""

from kiln.schedules import dense_cpu, nn_cpu, transformer_cpu, winograd_cpu  # noqa: F401
from kiln.schedules.cpu import (  # noqa: F401
    register_schedule,
    schedule_loops,
    schedule_te,
    small_extents,
    tails_allowed,
)
