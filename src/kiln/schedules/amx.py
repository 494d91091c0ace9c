"""The AMX call of the integer kernels: which stages run ``support/amx.c``'s tile kernel first
(docs/decisions/026-amx.md)."""

from __future__ import annotations

from kiln.target import Target
from kiln.tir import loop as L
from kiln.tir.te import Tensor

#: the AMX kernel's tile: 16 rows, 16 quads (64 bytes) of K, 16 int32 columns
AMX_TILE = 16


def amx_call(acc: Tensor):
    """The ``try_first`` call of an integer accumulator on quads to the AMX tile kernel, or None.

    The :attr:`kiln.tir.lower.Stage.try_first` of the stage, for a target with AMX-INT8
    (``Target.current().amx_int8()``): support/amx.c's ``KilnAMXGemmU8S8`` on the stage's
    buffers (docs/decisions/026-amx.md); the loops stay as the fallback.

    - ``qnn.dense_pack``: ``Σ dot_u8i8x4(quads[i, q], w[j // b, q, j % b])``, A = the quads
      [M, K/4], out [M, N];
    - ``qnn.conv2d_NCHWc`` of a 1×1 stride-1 unpadded conv (``pixel_gemm``): rows = the H·W
      pixels of each image, A = the quads [N, C/ib, H, W, ib/4] (blocks of ib/4 quads), out
      [N, O/ob, H, W, ob] (blocks of ob columns), W = [O/ob, C/ib, 1, 1, ib/4, ob].

    Only static shapes that fill a tile: at least 16 rows, K at least 64, weight (and output)
    blocks a multiple of 16 columns (AMX_TILE).

    Parameters
    ----------
    acc : te.Tensor
        The int32 accumulator stage (tag ``dense_pack`` or ``conv2d_NCHWc``), its inputs the
        ``qnn_quads`` stage and the int32 quad weight.

    Returns
    -------
    callable or None
        ``call(buffer_of) -> PrimExpr``: the extern call on the first elements of the output,
        quads and weight buffers with (batch, M, N, K/4, block, strides...); None for another
        target, stage or shape.
    """
    target = Target.current()
    if target is None or not target.amx_int8() or acc.dtype != "int32":
        return None
    inputs = acc.inputs()
    quads = next((t for t in inputs if t.name.startswith("qnn_quads")), None)
    weight = next((t for t in inputs if t.dtype == "int32" and len(t.shape) in (3, 6)), None)
    if quads is None or weight is None or not all(
            isinstance(d, int) for t in (acc, quads, weight) for d in t.shape):
        return None
    if len(acc.shape) == 2:  # dense
        (m, n), (_, kq), b = acc.shape, quads.shape, weight.shape[2]
        batch, words = 1, kq
        a_strides = (4 * kq, kq, 0, 0)  # lda, a_kblock, a_kstride, a_batch
        o_strides = (n, n, 0, 0)  # ldo, o_block, o_bstride, o_batch
    elif getattr(acc, "pixel_gemm", False) and len(quads.shape) == 5:
        batch, ocb, h, w, b = acc.shape
        _, icb, _, _, words = quads.shape
        m, n, kq = h * w, ocb * b, icb * words
        a_strides = (4 * words, words, 4 * words * m, 4 * words * m * icb)
        o_strides = (b, b, b * m, b * m * ocb)
    else:
        return None
    if m < AMX_TILE or kq < AMX_TILE or b % AMX_TILE:
        return None

    def call(buffer_of) -> L.PrimExpr:
        def first(t: Tensor) -> L.PrimExpr:
            buf = buffer_of(t)
            return L.address_of(L.BufferLoad(buf, [L.IntImm(0)] * len(buf.shape)))

        sizes = (batch, m, n, kq, b, *a_strides, *o_strides)
        return L.call_extern("KilnAMXGemmU8S8", first(acc), first(quads), first(weight),
                             *(L.IntImm(v) for v in sizes))

    return call
