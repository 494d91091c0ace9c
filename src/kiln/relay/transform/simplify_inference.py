"""SimplifyInference: rewrite inference-only ops (TVM: relay.transform.SimplifyInference).

- ``nn.batch_norm(x, gamma, beta, mean, var; epsilon, axis)`` becomes ``x * scale + shift`` with
  ``scale = gamma / sqrt(var + epsilon)`` and ``shift = beta - mean * scale``, both shaped
  ``(C, 1, ..., 1)`` to broadcast along ``axis``. Constant statistics give two Constants at
  once (so FoldScaleAxis can push the scale into a preceding conv before FoldConstant runs);
  otherwise the scale/shift arithmetic is emitted as graph ops over the statistics.
- ``nn.dropout(x)`` becomes ``x``.
"""

from __future__ import annotations

import numpy as np

from kiln.relay.graph import Call, Constant, Expr, Function, rewrite, same_call

name = "SimplifyInference"


def _along_axis(vec: Expr, ndim: int, axis: int, span: str | None) -> Expr:
    trailing = ndim - axis - 1
    if trailing == 0:
        return vec
    newshape = vec.checked_type.shape + (1,) * trailing
    return Call("reshape", [vec], {"newshape": newshape}, span)


def _batch_norm(call: Call, args: list[Expr]) -> Expr:
    x, gamma, beta, mean, var = args
    ndim = x.checked_type.ndim
    axis = call.attrs["axis"] % ndim
    span = call.span
    dtype = x.checked_type.dtype
    eps = np.array(call.attrs["epsilon"], dtype=dtype)
    if all(isinstance(a, Constant) for a in args[1:]):
        # Constant statistics (the usual case after BindParams): compute scale and shift now, so
        # that passes before FoldConstant (FoldScaleAxis) see constant per-channel operands.
        g, b, m, v = (a.data for a in args[1:])  # type: ignore[attr-defined]
        with np.errstate(all="ignore"):
            scale_v = (g / np.sqrt(v + eps)).astype(dtype)
            shift_v = (b - m * scale_v).astype(dtype)
        trailing = (1,) * (ndim - axis - 1)
        base = gamma.name or "batch_norm"  # type: ignore[attr-defined]
        scale: Expr = Constant(scale_v.reshape(scale_v.shape + trailing), name=f"{base}.scale")
        shift: Expr = Constant(shift_v.reshape(shift_v.shape + trailing), name=f"{base}.shift")
        scaled = Call("multiply", [x, scale], span=span)
        return Call("add", [scaled, shift], span=span)
    std = Call("sqrt", [Call("add", [var, Constant(eps)], span=span)], span=span)
    scale = Call("divide", [gamma, std], span=span)
    shift = Call("subtract", [beta, Call("multiply", [mean, scale], span=span)], span=span)
    scaled = Call("multiply", [x, _along_axis(scale, ndim, axis, span)], span=span)
    return Call("add", [scaled, _along_axis(shift, ndim, axis, span)], span=span)


def simplify_inference(func: Function) -> Function:
    """Remove ``nn.batch_norm`` and ``nn.dropout`` from ``func`` (see the module docstring).

    Parameters
    ----------
    func : Function
        A graph function.

    Returns
    -------
    Function
        An equivalent function for inference with neither op left.
    """

    def visit(call: Call, args: list[Expr]) -> Expr:
        if call.op.name == "nn.batch_norm":
            return _batch_norm(call, args)
        if call.op.name == "nn.dropout":
            return args[0]
        return same_call(call, args)

    return rewrite(func, visit)


simplify_inference.name = name  # type: ignore[attr-defined]
