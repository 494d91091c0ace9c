"""ONNX Conv over three spatial axes as one 2-D convolution over the output depths.

A 3-D convolution ``y[n, o, z] = sum_k conv2d(x[n, :, z*s + k*dil - pad], w[o, :, k])`` is a
2-D convolution whose batch is ``N * D'`` (one image per output depth) and whose input channels
are the depth taps' input planes side by side: the data ``[N, C, D, H, W]`` is gathered to
``[N * D', groups * T * C/groups, H, W]`` (a strided slice of the depth planes per tap,
concatenated on the channels, those of each group kept together), the weight
``[O, C/groups, KD, KH, KW]`` becomes ``[O, T * C/groups, KH, KW]`` (folded at compile time
when it is a constant), and the 2-D output ``[N * D', O, H', W']`` goes back to
``[N, O, D', H', W']``. The 2-D conv then takes every 2-D path: blocked NCHW[x]c kernels,
register blocks, K-blocking, grouped convs (docs/decisions/003, 045, 048). The gather is
PyTorch's ``vol2col`` (its 3-D im2col, aten/src/ATen/native/vol2col.h) restricted to the depth
axis.

Depth taps that read only padding for every output depth (a 3-deep padded kernel over a
depth of 1 or 2: r3d_18's last stages) are dropped, so their zeros are neither copied nor
multiplied.
"""

from __future__ import annotations

from kiln.errors import ShapeError
from kiln.frontend.onnx.context import ConvertContext
from kiln.relay.graph import Expr


def depth_taps(depth: int, kernel: int, stride: int, dilation: int, head: int,
               tail: int) -> tuple[int, list[int]]:
    """(output depth D', the kernel's depth taps that read at least one input plane).

    A tap ``k`` reads planes ``k*dilation - head + z*stride`` for ``z`` in ``[0, D')``; it is
    kept if that range meets ``[0, depth)``. No tap kept (every output depth is padding):
    tap 0, which then reads zeros. Raises ShapeError when D' < 1.
    """
    out = (depth + head + tail - dilation * (kernel - 1) - 1) // stride + 1
    if out < 1:
        raise ShapeError(f"a depth of {depth} padded by ({head}, {tail}) is smaller than the "
                         f"kernel's depth {kernel} at dilation {dilation}")
    taps = [k for k in range(kernel)
            if k * dilation - head <= depth - 1 and k * dilation - head + (out - 1) * stride >= 0]
    return out, taps or [0]


def _gather_depths(ctx: ConvertContext, x: Expr, firsts: list[int], stride: int,
                   out_depth: int, groups: int) -> Expr:
    """``x[N, C, D, H, W]`` → ``[N * D', groups * T * C/groups, H, W]``: image ``n * D' + z``
    holds, group by group, tap by tap, the group's channels of plane ``firsts[t] + z * stride``
    (zero outside ``[0, D)``). One strided slice per tap, moved to ``[N * D', C, H, W]`` and
    concatenated on the channels: static offsets and plane copies (a ``take`` of the planes
    compiled to per-element index loads and clamps: r3d_18's 64-channel gathers
    took 2.7x as long)."""
    n, c, depth, h, w = x.checked_type.shape
    last = (out_depth - 1) * stride
    head, tail = max(0, -min(firsts)), max(0, max(firsts) + last - (depth - 1))
    if head or tail:
        x = ctx.call("nn.pad", [x], pad_width=((0, 0), (0, 0), (head, tail), (0, 0), (0, 0)),
                     pad_value=0.0, pad_mode="constant")
    pieces = []
    for first in firsts:
        piece = ctx.call("strided_slice", [x], begin=(0, 0, first + head, 0, 0),
                         end=(n, c, first + head + last + 1, h, w), strides=(1, 1, stride, 1, 1))
        piece = ctx.call("transpose", [piece], axes=(0, 2, 1, 3, 4))
        pieces.append(ctx.reshape(piece, (n * out_depth, groups, c // groups, h, w)))
    x = pieces[0] if len(pieces) == 1 else ctx.call("concatenate", pieces, axis=2)
    return ctx.reshape(x, (n * out_depth, c * len(firsts), h, w))


def _weight_taps(ctx: ConvertContext, w: Expr, taps: list[int]) -> Expr:
    """``w[O, C/g, KD, KH, KW]`` → ``[O, T * C/g, KH, KW]`` for the kept taps (contiguous)."""
    o, cg, kd, kh, kw = w.checked_type.shape
    if len(taps) != kd:
        w = ctx.call("strided_slice", [w], begin=(0, 0, taps[0], 0, 0),
                     end=(o, cg, taps[-1] + 1, kh, kw), strides=(1, 1, 1, 1, 1))
    w = ctx.call("transpose", [w], axes=(0, 2, 1, 3, 4))
    return ctx.reshape(w, (o, len(taps) * cg, kh, kw))


def conv3d_as_2d(ctx: ConvertContext, x: Expr, w: Expr, win: dict) -> Expr:
    """``nn.conv2d`` calls computing a 3-D Conv (no bias) of ``x[N, C, D, H, W]`` (D static)
    and ``w[O, C/group, KD, KH, KW]`` with the node's window ``win`` (``_window_nd``'s kernel,
    strides, dilation, heads, tails); returns ``[N, O, D', H', W']``. Raises
    UnsupportedOpError for a symbolic depth, ShapeError for a kernel deeper than the padded
    depth."""
    n, c, depth = x.checked_type.shape[:3]
    if not isinstance(depth, int):
        raise ctx.unsupported(f"a symbolic depth {depth} (axis 2 of {x.checked_type.shape}); "
                              "3-D convolutions need a fixed depth")
    groups = int(ctx.attr("group", 1))
    stride, dilation = win["strides"][0], win["dilation"][0]
    out_depth, taps = depth_taps(depth, win["kernel"][0], stride, dilation, win["heads"][0],
                                 win["tails"][0])
    firsts = [t * dilation - win["heads"][0] for t in taps]
    data = _gather_depths(ctx, x, firsts, stride, out_depth, groups)
    weight = _weight_taps(ctx, w, taps)
    heads, tails = win["heads"][1:], win["tails"][1:]
    out = ctx.call("nn.conv2d", [data, weight], groups=groups, strides=win["strides"][1:],
                   dilation=win["dilation"][1:], padding=(heads[0], heads[1], tails[0], tails[1]))
    o, oh, ow = out.checked_type.shape[1:]
    out = ctx.reshape(out, (n, out_depth, o, oh, ow))
    return ctx.call("transpose", [out], axes=(0, 2, 1, 3, 4))


def _place_depths(ctx: ConvertContext, piece: Expr, stride: int, offset: int,
                  out_depth: int) -> Expr | None:
    """``piece[N, O, D, H, W]`` spread along depth: plane ``z`` lands at ``z * stride - offset``
    of an ``out_depth``-deep output, zeros between and around; None when none lands in it."""
    n, o, depth, h, w = piece.checked_type.shape
    if (depth - 1) * stride - offset < 0 or -offset >= out_depth:
        return None
    if stride > 1:  # zeros between the planes: [N, O, D, 1, H, W] padded to [N, O, D, s, H, W]
        piece = ctx.reshape(piece, (n, o, depth, 1, h, w))
        piece = ctx.call("nn.pad", [piece], pad_width=((0, 0),) * 3 + ((0, stride - 1),)
                         + ((0, 0),) * 2, pad_value=0.0, pad_mode="constant")
        piece = ctx.reshape(piece, (n, o, depth * stride, h, w))
    # plane z now at z * stride; shifted by -offset into [0, out_depth): negative widths crop
    width = (-offset, out_depth + offset - depth * stride)
    return ctx.call("nn.pad", [piece], pad_width=((0, 0), (0, 0), width, (0, 0), (0, 0)),
                    pad_value=0.0, pad_mode="constant")


def conv_transpose3d_as_2d(ctx: ConvertContext, x: Expr, w: Expr, strides: tuple[int, ...],
                           dilation: tuple[int, ...], heads: tuple[int, ...],
                           tails: tuple[int, ...], extra: tuple[int, ...]) -> Expr:
    """A 3-D ConvTranspose (no bias) of ``x[N, C, D, H, W]`` (D static) by
    ``w[C, O/group, KD, KH, KW]`` as one ``nn.conv2d_transpose`` over the input depths — the
    adjoint of :func:`conv3d_as_2d`'s gather: each input plane's 2-D transposed conv by the
    weight ``[C, KD * O/group, KH, KW]`` gives its KD depth taps' contributions side by side on
    the channels; tap ``k`` of plane ``z`` lands on output depth ``z * stride + k * dilation -
    head``, and the taps are summed. Per axis (depth, height, width): ``strides``, ``dilation``,
    pads ``heads`` / ``tails`` and ``extra`` rows at the end (output_padding or a larger
    output_shape). Returns ``[N, O, D', H', W']``; raises UnsupportedOpError for a symbolic
    depth or when no tap reaches the output."""
    n, c, depth, h, wd = x.checked_type.shape
    if not isinstance(depth, int):
        raise ctx.unsupported(f"a symbolic depth {depth} (axis 2 of {x.checked_type.shape}); "
                              "3-D transposed convolutions need a fixed depth")
    groups = int(ctx.attr("group", 1))
    _, og, kd, kh, kw = w.checked_type.shape
    out_depth = (depth - 1) * strides[0] + (kd - 1) * dilation[0] + 1 + extra[0] - heads[0] \
        - tails[0]
    if out_depth < 1:
        raise ShapeError(f"ConvTranspose of depth {depth} has no output depth ({out_depth})")
    data = ctx.call("transpose", [x], axes=(0, 2, 1, 3, 4))
    data = ctx.reshape(data, (n * depth, c, h, wd))
    weight = ctx.call("transpose", [w], axes=(0, 2, 1, 3, 4))
    weight = ctx.reshape(weight, (c, kd * og, kh, kw))
    planes = ctx.call("nn.conv2d_transpose", [data, weight], strides=strides[1:],
                      padding=(heads[1], heads[2], tails[1], tails[2]), dilation=dilation[1:],
                      groups=groups, output_padding=extra[1:])
    oh, ow = planes.checked_type.shape[2:]
    planes = ctx.reshape(planes, (n, depth, groups, kd, og, oh, ow))
    total = None
    for k in range(kd):
        tap = ctx.call("strided_slice", [planes], begin=(0, 0, 0, k, 0, 0, 0),
                       end=(n, depth, groups, k + 1, og, oh, ow), strides=(1,) * 7)
        tap = ctx.call("transpose", [ctx.reshape(tap, (n, depth, groups * og, oh, ow))],
                       axes=(0, 2, 1, 3, 4))
        placed = _place_depths(ctx, tap, strides[0], heads[0] - k * dilation[0], out_depth)
        if placed is not None:
            total = placed if total is None else ctx.call("add", [total, placed])
    if total is None:
        raise ctx.unsupported(f"no depth tap reaches the output (pads {heads[0]}, {tails[0]} "
                              f"crop all of it)")
    return total
