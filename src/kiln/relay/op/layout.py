"""Layout ops: ``layout_transform`` and the blocked-channel convolutions AlterOpLayout emits.

- ``layout_transform(x, src_layout, dst_layout)``: the same tensor in another layout
  (``kiln.tir.layout``), e.g. NCHW → NCHW16c (TVM: ``relay.layout_transform``).
- ``nn.conv2d_NCHWc(data[N, C/ib, H, W, ib], weight[O/ob, C/ib, KH, KW, ib, ob])`` →
  ``[N, O/ob, OH, OW, ob]`` (TVM: ``nn.contrib_conv2d_NCHWc``); with ib = 1 the data may also
  be 4-D NCHW (the same memory as NCHW1c). With attr ``groups`` > 1 the weight is
  ``[O/ob, (C/groups)/ib, KH, KW, ib, ob]`` (blocks within a group: ob divides O/groups, ib
  C/groups) and the data's block may be a multiple of C/groups instead of ib.
- ``nn.depthwise_conv2d_NCHWc(data[N, C/b, H, W, b], weight[C/b, 1, KH, KW, 1, b])`` →
  ``[N, C/b, OH, OW, b]`` (channel multiplier 1; TVM: ``nn.contrib_depthwise_conv2d_NCHWc``).

Convolution attrs are those of ``nn.conv2d`` (strides, padding, dilation); the numpy references
transform to NCHW/OIHW, run ``nn.conv2d``'s reference and transform back.
"""

from __future__ import annotations

import numpy as np

from kiln.errors import CompileError, ShapeError
from kiln.relay.graph import TensorType
from kiln.relay.op.common import expect_arity, expect_rank, same_dtype
from kiln.relay.op_registry import OpPattern, get_op, register_op
from kiln.tir.layout import Layout, transform_array


def _layout_transform_infer(arg_types: list[TensorType], attrs: dict) -> TensorType:
    expect_arity(arg_types, 1)
    (x,) = arg_types
    try:
        src, dst = Layout.parse(attrs["src_layout"]), Layout.parse(attrs["dst_layout"])
        if sorted(src.primal) != sorted(dst.primal):
            raise CompileError(f"{src.name} and {dst.name} have different axes")
        return TensorType(dst.shape(src.primal_shape(x.shape)), x.dtype)
    except CompileError as err:
        raise ShapeError(str(err)) from None


register_op("layout_transform", _layout_transform_infer, OpPattern.INJECTIVE,
            lambda x, src_layout, dst_layout: transform_array(x, src_layout, dst_layout))


def block_layouts(data: TensorType, weight: TensorType, groups: int = 1) -> tuple[str, str]:
    """(data layout, weight layout) of a blocked conv from its 5-D data (or 4-D NCHW data,
    read as NCHW1c, with input block 1) and 6-D weight; a grouped conv's data block may be a
    multiple of its ``C/groups`` input channels (several groups a block)."""
    expect_rank(weight, 6, "weight")
    ib, ob = weight.shape[4], weight.shape[5]
    if data.ndim == 4 and ib == 1:
        return "NCHW", f"OIHW1i{ob}o"
    expect_rank(data, 5, "data")
    group_in = weight.shape[1] * ib  # input channels a group
    if data.shape[4] != ib and not (ib == 1 and weight.shape[1] == 1) and \
            not (groups > 1 and ib == group_in and data.shape[4] % group_in == 0):
        raise ShapeError(f"data block {data.shape[4]} and weight block {ib} differ")
    return f"NCHW{data.shape[4]}c", f"OIHW{ib}i{ob}o"


def _nchwc_conv(depthwise: bool):
    """(type relation, numpy reference) of the blocked conv or depthwise conv."""
    def infer(arg_types: list[TensorType], attrs: dict) -> TensorType:
        expect_arity(arg_types, 2)
        dtype = same_dtype(arg_types)
        data, weight = arg_types
        groups = attrs.get("groups", 1)
        dl, wl = block_layouts(data, weight, groups)
        d = Layout.parse(dl).primal_shape(data.shape)
        w = Layout.parse(wl).primal_shape(weight.shape)
        if not depthwise and groups > 1 and (w["O"] // groups) % weight.shape[5]:
            raise ShapeError(f"output block {weight.shape[5]} does not divide the "
                             f"{w['O'] // groups} outputs of a group")
        groups = d["C"] if depthwise else groups
        if depthwise and (w["I"] != 1 or w["O"] != d["C"] or data.shape[4] != weight.shape[5]):
            raise ShapeError(f"depthwise: data {data.shape} and weight {weight.shape} differ")
        nchw = get_op("nn.conv2d").infer(
            [TensorType((d["N"], d["C"], d["H"], d["W"]), dtype),
             TensorType((w["O"], w["I"], w["H"], w["W"]), dtype)], dict(attrs, groups=groups))
        ob = weight.shape[5]
        n, o, oh, ow = nchw.shape
        return TensorType((n, o // ob, oh, ow, ob), dtype)

    def ref(data: np.ndarray, weight: np.ndarray, **attrs) -> np.ndarray:
        groups = attrs.pop("groups", 1)
        dl, wl = block_layouts(TensorType(data.shape, str(data.dtype)),
                               TensorType(weight.shape, str(weight.dtype)), groups)
        x = transform_array(data, dl, "NCHW")
        w = transform_array(weight, wl, "OIHW")
        groups = x.shape[1] if depthwise else groups
        y = get_op("nn.conv2d").ref(x, w, groups=groups, **attrs)
        return transform_array(y, "NCHW", f"NCHW{weight.shape[5]}c")

    return infer, ref


for _name, _depthwise in (("nn.conv2d_NCHWc", False), ("nn.depthwise_conv2d_NCHWc", True)):
    _infer, _ref = _nchwc_conv(_depthwise)
    register_op(_name, _infer, OpPattern.OUT_ELEMWISE_FUSABLE, _ref)
