"""Converters of ONNX GridSample (2-D and 3-D; opset 16's bilinear/bicubic names map to opset
20's linear/cubic) and Col2Im (block and image shapes compile-time constants)."""

from __future__ import annotations

from kiln.frontend.onnx.context import ConvertContext
from kiln.frontend.onnx.registry import onnx_op
from kiln.relay.graph import Expr

_MODES = {"bilinear": "linear", "bicubic": "cubic"}


@onnx_op("GridSample", since=16)
def grid_sample(ctx: ConvertContext) -> Expr:
    mode = str(ctx.attr("mode", "linear" if ctx.opset >= 20 else "bilinear"))
    mode = _MODES.get(mode, mode)
    padding = str(ctx.attr("padding_mode", "zeros"))
    if mode not in ("nearest", "linear", "cubic") or \
            padding not in ("zeros", "border", "reflection"):
        raise ctx.unsupported(f"mode={mode!r}, padding_mode={padding!r}")
    x, grid = ctx.input(0), ctx.input(1)
    if x.checked_type.ndim not in (4, 5):
        raise ctx.unsupported(f"only 2-D and 3-D inputs, got shape {x.checked_type.shape}")
    return ctx.call("image.grid_sample", [x, grid], mode=mode, padding_mode=padding,
                    align_corners=bool(ctx.attr("align_corners", 0)))


@onnx_op("Col2Im", since=18)
def col2im(ctx: ConvertContext) -> Expr:
    x = ctx.input(0)
    image = ctx.const_ints(1, "Col2Im image_shape")
    block = ctx.const_ints(2, "Col2Im block_shape")
    nsp = len(image)
    if len(block) != nsp or nsp < 1:
        raise ctx.unsupported(f"image_shape {image} and block_shape {block}")
    return ctx.call("col2im", [x], image_shape=image, block_shape=block,
                    dilations=ctx.ints("dilations", (1,) * nsp),
                    pads=ctx.ints("pads", (0,) * (2 * nsp)),
                    strides=ctx.ints("strides", (1,) * nsp))
