"""CPU schedule of the Winograd convolution's stages (``kiln.topi.winograd``).

- the padded input (tag ``pad``) and the input transform ``V`` (tag ``winograd_input``) are
  materialized: ``n, c, t, i, j (unrolled), b (vectorized)`` — each tile read once, its α²
  transformed vectors written;
- the GEMM (tag ``conv2d_winograd_NCHWc``, ``[N, O/ob, α², T, ob]``) is register-blocked as a
  1×1 conv whose rows are the α² transform points and whose pixels are the tiles
  (``kiln.schedules.nn_cpu._register_blocked``): ``n, o, e, t_o, rc, ri, t_i (unrolled),
  b (vectorized)``, one weight vector pair per input channel against ``t_i`` broadcast inputs;
- the output (the transform ``Y``, with the fused bias / activation / residual inlined into
  it) runs tile by tile: ``n, o, y_o, x_o, y_i, x_i (unrolled), b (vectorized)``.

Knobs: the GEMM's ``unroll_ic`` and ``tile_ow`` (tiles a register block).
"""

from __future__ import annotations

from kiln.schedules.cpu import register_schedule
from kiln.schedules.nn_cpu import _register_blocked, _unrolled_input_block
from kiln.tir.lower import Schedule
from kiln.tir.te import Tensor


@register_schedule("conv2d_winograd_NCHWc")
def schedule_conv2d_winograd(sch: Schedule, gemm: Tensor) -> None:
    """Schedule of a Winograd conv's stages, found from its GEMM stage (see the module doc).

    Parameters
    ----------
    sch : Schedule
    gemm : te.Tensor
        The GEMM stage [N, O/ob, α², T, ob], reduce axes (rc, ri); its first input the input
        transform [N, C/ib, α, α, T, ib].
    """
    transformed = next(t for t in gemm.inputs() if t.tag == "winograd_input")
    _materialize_input(sch, transformed)
    stage = sch[gemm]
    rc, ri = gemm.body.axes
    _register_blocked(sch, gemm, (rc, *_unrolled_input_block(stage, ri)), taps=1,
                      materialize_pad=False)
    alpha = transformed.shape[2]
    _tile_by_tile(sch, alpha - 2)


def _materialize_input(sch: Schedule, transformed: Tensor) -> None:
    """The padded input and the input transform in buffers, tile by tile."""
    for t in transformed.inputs():
        if t.tag == "pad":
            sch[t].compute_root()
            sch[t].vectorize(t.axes[-1])
    stage = sch[transformed]
    stage.compute_root()
    n, c, i, j, t, b = transformed.axes
    stage.reorder(n, c, t, i, j, b)
    stage.unroll(i)
    stage.unroll(j)
    stage.vectorize(b)


def _tile_by_tile(sch: Schedule, tile: int) -> None:
    """The output stage (the output transform, a fused epilogue inlined in it) in tiles of
    ``tile × tile`` pixels, unrolled: each unrolled pixel keeps its transform's one branch.
    A partial last tile (an odd plane) is guarded."""
    out = sch.output
    if len(out.shape) != 5 or out.is_reduction:
        return
    stage = sch[out]
    n, o, y, x, b = out.axes
    yo, yi = stage.split(y, tile, tail=y.extent % tile != 0)
    xo, xi = stage.split(x, tile, tail=x.extent % tile != 0)
    stage.reorder(n, o, yo, xo, yi, xi, b)
    stage.unroll(yi)
    stage.unroll(xi)
    stage.vectorize(b)
