"""Where AlterOpLayout runs a convolution by Winograd's F(m×m, 3×3) instead of the direct
blocked kernel (docs/decisions/050-winograd-convolution.md).

A float32, group-1, stride-1, dilation-1 3×3 conv with static shapes, blocked input channels
and exact output blocks qualifies; it is chosen when it has at least
:data:`MIN_CHANNELS` input and output channels and an output plane of at least
:data:`MIN_PIXELS`: there the α² GEMMs (channel blocks the vector axis) do 2.25× fewer
multiply-adds than the direct conv and the transforms, memory-bound, are small beside them.
"""

from __future__ import annotations

from kiln.relay.graph import Call, Constant, Expr
from kiln.relay.op.winograd import winograd_weight

#: Whether AlterOpLayout may choose Winograd at all (for before / after runs of
#: benchmarks/winograd_conv.py).
WINOGRAD = True
#: F(TILE×TILE, 3×3): 2 or 4.
TILE = 2
#: Fewest input and output channels: below, the GEMMs are too short for the transforms.
MIN_CHANNELS = 64
#: Fewest output pixels (OH · OW): smaller planes leave few tiles a GEMM row.
MIN_PIXELS = 14 * 14


def winograd_tile(data_shape, weight_shape, attrs: dict, out_shape) -> int | None:
    """The tile m of F(m×m, 3×3) for this ``nn.conv2d``, or None for the direct kernel.

    Parameters
    ----------
    data_shape, weight_shape, out_shape : tuple
        NCHW data, OIHW weight and NCHW output shapes.
    attrs : dict
        The conv's ``strides``, ``padding``, ``dilation``, ``groups``.

    Returns
    -------
    int or None
        :data:`TILE` where the rule of the module doc holds, else None.
    """
    shapes = (*data_shape, *weight_shape, *out_shape)
    if not WINOGRAD or not all(isinstance(d, int) for d in shapes):
        return None
    if tuple(weight_shape[2:]) != (3, 3) or attrs["strides"] != (1, 1) \
            or attrs["dilation"] != (1, 1) or attrs["groups"] != 1:
        return None
    out_channels, channels = weight_shape[0], weight_shape[1]
    if min(channels, out_channels) < MIN_CHANNELS or out_shape[2] * out_shape[3] < MIN_PIXELS:
        return None
    return TILE


def winograd_conv(call: Call, blocked_data: Expr, weight: Constant, tile: int,
                  blocks: tuple[int, int]) -> Call:
    """``call`` (an ``nn.conv2d``) as ``nn.conv2d_winograd_NCHWc`` over ``blocked_data``
    (NCHW{ib}c), its weight transformed now (:func:`winograd_weight`); ``blocks`` = (ib, ob)."""
    ib, ob = blocks
    u = winograd_weight(weight.data, tile, ib, ob)
    return Call("nn.conv2d_winograd_NCHWc", [blocked_data, Constant(u, weight.name)],
                {"padding": call.attrs["padding"], "tile_size": tile}, call.span)
