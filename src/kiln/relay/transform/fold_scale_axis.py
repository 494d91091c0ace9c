"""FoldScaleAxis (backward): fold a per-output-channel constant scale into conv2d weights.

``multiply(conv2d(x, W), S)`` with constant ``W`` and a constant ``S`` that varies only along
the channel axis (shape (C,1,1), (1,C,1,1) or a scalar) becomes ``conv2d(x, W * S[:, None, None,
None])`` — the scale half of an inference BatchNormalization after a convolution (TVM:
src/relay/transforms/fold_scale_axis.cc, BackwardFoldScaleAxis). The conv must have no other
user. Run after SimplifyInference and before FoldConstant (which folds the new weight product).
"""

from __future__ import annotations

import numpy as np

from kiln.relay.graph import Call, Constant, Expr, Function, consumers, rewrite, same_call

name = "FoldScaleAxis"


def _channel_scale(scale: Expr, channels: int) -> np.ndarray | None:
    if not isinstance(scale, Constant):
        return None
    data = scale.data
    if data.size == 1:
        return np.full(channels, data.reshape(-1)[0], data.dtype)
    shape = data.shape
    if len(shape) in (3, 4) and shape[-2:] == (1, 1) and shape[-3] == channels \
            and all(d == 1 for d in shape[:-3]):
        return data.reshape(channels)
    return None


def fold_scale_axis(func: Function) -> Function:
    users = consumers(func.outputs)
    outputs = {o.uid for o in func.outputs}

    def visit(call: Call, args: list[Expr]) -> Expr:
        if call.op.name != "multiply":
            return same_call(call, args)
        for conv, scale in ((args[0], args[1]), (args[1], args[0])):
            orig = call.args[0] if conv is args[0] else call.args[1]
            if not (isinstance(conv, Call) and conv.op.name == "nn.conv2d"
                    and isinstance(conv.args[1], Constant)
                    and len(users.get(orig.uid, ())) == 1 and orig.uid not in outputs):
                continue
            weight = conv.args[1].data
            s = _channel_scale(scale, weight.shape[0])
            if s is None or s.dtype != weight.dtype or \
                    call.checked_type.shape != conv.checked_type.shape:
                continue
            folded = Constant((weight * s.reshape(-1, 1, 1, 1)).astype(weight.dtype))
            return Call("nn.conv2d", [conv.args[0], folded], conv.attrs, conv.span)
        return same_call(call, args)

    return rewrite(func, visit)
