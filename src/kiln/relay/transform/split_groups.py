"""SplitGroups: grouped integer convolutions as one ordinary convolution per group.

A ``qnn.conv2d`` with ``1 < groups`` that is not depthwise (``groups = C = O`` has its own
blocked kernel) has no blocked form: AlterOpLayout left it in NCHW on the generic schedule
(docs/decisions/021). Each group, though, is an ordinary integer convolution over its slice of
the input channels with its slice of the output channels' weights:

    qnn.conv2d(x, W; groups=g) = concatenate([qnn.conv2d(x[:, i·C/g : (i+1)·C/g], W[i·O/g :
                                              (i+1)·O/g]; groups=1) for i < g], axis=1)

exactly (the same products and int32 sums). The parts are then blocked by AlterOpLayout like any
other ``qnn.conv2d`` (NCHWc, int8 quads, VNNI / AVX2 products). Only for constant weights, at
most :data:`MAX_GROUPS` groups (each part is a kernel launch and a slice of the input;
ResNeXt's 32 groups of 4 channels would be 32 tiny convolutions) and at least
:data:`MIN_GROUP_CHANNELS` input and output channels a group. Measured on the AVX2 EPYC, 1
thread, CPU time, int8 3×3 at 28×28 (14×14 for 128 channels), split / NCHW generic: 64 ch 4
groups 215 / 497 µs, 128 ch (14²) 2 groups 326 / 2037, 128 ch 8 groups 646 / 1756 — but 12
channels a group (96 ch 8 groups, 48 ch 4 groups) 761 / 666 and 427 / 372: slower. Run after
FoldConstant, before AlterOpLayout.
"""

from __future__ import annotations

from kiln.relay.graph import Call, Constant, Expr, Function, rewrite, same_call

name = "SplitGroups"

#: the most groups a grouped integer convolution is split into
MAX_GROUPS = 16
#: the fewest input and output channels a group needs to be split off (12 was slower)
MIN_GROUP_CHANNELS = 16


def split_groups(func: Function) -> Function:
    """Rewrite grouped (not depthwise) ``qnn.conv2d`` calls with constant weights, at most
    MAX_GROUPS groups of at least MIN_GROUP_CHANNELS channels, as a concatenation of per-group
    convolutions (module doc)."""

    def visit(call: Call, args: list[Expr]) -> Expr:
        if call.op.name != "qnn.conv2d" or not isinstance(args[1], Constant):
            return same_call(call, args)
        groups = call.attrs["groups"]
        data, weight = args
        if data.checked_type.ndim != 4:
            return same_call(call, args)
        n, channels, h, w = data.checked_type.shape
        out_channels = weight.data.shape[0]
        if groups <= 1 or groups > MAX_GROUPS or groups == channels == out_channels or \
                not all(isinstance(d, int) for d in (n, channels, h, w)):
            return same_call(call, args)
        cin, cout = channels // groups, out_channels // groups
        if min(cin, cout) < MIN_GROUP_CHANNELS:
            return same_call(call, args)
        parts = []
        for g in range(groups):
            part = Call("strided_slice", [data], {"begin": (0, g * cin, 0, 0),
                                                  "end": (n, (g + 1) * cin, h, w),
                                                  "strides": (1, 1, 1, 1)}, call.span)
            wg = Constant(weight.data[g * cout:(g + 1) * cout].copy(), weight.name)
            parts.append(Call("qnn.conv2d", [part, wg], dict(call.attrs, groups=1), call.span))
        return Call("concatenate", parts, {"axis": 1}, call.span)

    return rewrite(func, visit)


split_groups.name = name  # type: ignore[attr-defined]
