"""Where AlterOpLayout runs a convolution by Winograd's F(m×m, 3×3) instead of the direct
blocked kernel, and with which tile (docs/decisions/050-winograd-convolution.md).

A float32, group-1, stride-1, dilation-1 3×3 conv with static shapes, blocked input channels
(not an image read as NCHW1c) and exact output blocks qualifies; it is chosen when it has at
least :data:`MIN_CHANNELS` input and output channels and an output plane of at least
:data:`MIN_PIXELS`. Measured per conv (1 thread, AVX-512 Zen 4, ``benchmarks/winograd_conv.py``)
Winograd beat the direct kernel on every shape tried from 16 to 512 channels and 4×4 to 56×56
planes (a 2×2 plane lost): the α² GEMMs do 2.25× (F(2×2)) or 4× (F(4×4)) fewer multiply-adds
and the transforms, memory-bound, stay small beside them. F(4×4) from
:data:`LARGE_TILE_PIXELS` output pixels up (where it was faster than F(2×2)), F(2×2) below (as
fast there, and ~10× closer to the direct sum).
"""

from __future__ import annotations

from kiln.relay.graph import Call, Constant, Expr, TensorType
from kiln.relay.op.winograd import winograd_weight

#: Whether AlterOpLayout may choose Winograd at all (for before / after runs of
#: benchmarks/winograd_conv.py).
WINOGRAD = True
#: F(TILE×TILE, 3×3) for every chosen conv (2 or 4); None: by the plane (LARGE_TILE_PIXELS).
TILE: int | None = None
#: Output pixels (OH · OW) from which F(4×4) is used: 28×28 and 56×56 planes ran 15–30 %
#: faster than with F(2×2); 14×14 and 7×7 ones as fast or slower (fewer, partial tiles).
LARGE_TILE_PIXELS = 28 * 28
#: Fewest input and output channels: the smallest measured (16, one channel block) still won.
MIN_CHANNELS = 16
#: Fewest output pixels (OH · OW): 4×4 planes still won (64 channels: 8.2 vs 13.3 µs), a 2×2
#: plane lost (128 channels: 19.3 vs 18.0 µs; one tile, three quarters of F(4×4)'s wasted).
MIN_PIXELS = 4 * 4


def winograd_tile(data: TensorType, weight_shape, attrs: dict, out_shape) -> int | None:
    """The tile m of F(m×m, 3×3) for this ``nn.conv2d``, or None for the direct kernel.

    Parameters
    ----------
    data : TensorType
        The NCHW data (float32 only: an int32 conv, ConvInteger's exact products, stays
        direct).
    weight_shape, out_shape : tuple
        OIHW weight and NCHW output shapes.
    attrs : dict
        The conv's ``strides``, ``padding``, ``dilation``, ``groups``.

    Returns
    -------
    int or None
        2 or 4 (:data:`TILE`, or by :data:`LARGE_TILE_PIXELS`) where the rule of the module
        doc holds, else None.
    """
    shapes = (*data.shape, *weight_shape, *out_shape)
    if not WINOGRAD or data.dtype != "float32" or not all(isinstance(d, int) for d in shapes):
        return None
    if tuple(weight_shape[2:]) != (3, 3) or attrs["strides"] != (1, 1) \
            or attrs["dilation"] != (1, 1) or attrs["groups"] != 1:
        return None
    out_channels, channels = weight_shape[0], weight_shape[1]
    pixels = out_shape[2] * out_shape[3]
    if min(channels, out_channels) < MIN_CHANNELS or pixels < MIN_PIXELS:
        return None
    if TILE is not None:
        return TILE
    return 4 if pixels >= LARGE_TILE_PIXELS else 2


def winograd_conv(call: Call, blocked_data: Expr, weight: Constant, tile: int,
                  blocks: tuple[int, int]) -> Call:
    """``call`` (an ``nn.conv2d``) as ``nn.conv2d_winograd_NCHWc`` over ``blocked_data``
    (NCHW{ib}c), its weight transformed now (:func:`winograd_weight`); ``blocks`` = (ib, ob)."""
    ib, ob = blocks
    u = winograd_weight(weight.data, tile, ib, ob)
    return Call("nn.conv2d_winograd_NCHWc", [blocked_data, Constant(u, weight.name)],
                {"padding": call.attrs["padding"], "tile_size": tile}, call.span)
