"""SinkReshape: move reshapes that keep the last axis below element-wise ops and LayerNorm.

A MatMul by a constant weight at rank 3 imports as ``reshape([B·S, K]) → nn.dense →
reshape([B, S, N])`` (docs/decisions/010), and the bias add, GELU, residual add and LayerNorm of
a transformer layer then run on the rank-3 value. FuseOps fuses element-wise consumers into a
dense only at the dense's own shape, so each layer kept its epilogues in separate kernels
(``fused_reshape_add``, ``fused_divide_erf_add_multiply_multiply_reshape``,
``fused_reshape_add_add``) and copied the hidden state through ``fused_reshape`` kernels. This
pass rewrites, bottom-up:

- ``E(reshape(a, S), c, ...)`` → ``reshape(E(a, c', ...), S)`` for an element-wise or broadcast
  op ``E`` (no attributes naming an axis or layout) whose output has shape ``S``, when
  ``a``'s last dim equals ``S``'s and every other operand ``c`` is a scalar, a vector along the
  last axis (shape ``(1, ..., 1, n)``), or has shape ``S`` (then ``c' = reshape(c, shape(a))``;
  a reshape of ``a``'s shape is unwrapped instead); a constant operand of higher rank than
  ``a`` is reshaped at compile time;
- ``nn.layer_norm(reshape(a, S))`` over the last axis → ``reshape(nn.layer_norm(a), S)``;
- ``min`` / ``max`` over every axis of ``reshape(a, S)`` → the same over every axis of ``a``
  (the same elements), and a per-tensor ``qnn.quantize(reshape(a, S), scale, zp)`` →
  ``reshape(qnn.quantize(a, scale, zp), S)``: DynamicQuantizeLinear of a hidden state
  between two rank-2 dense ops (``quantize_dynamic``'s MatMulInteger models) then reads the
  dense's output, and the reshape pair around it cancels instead of being copied
  (docs/decisions/021);
- ``reshape(reshape(x, _), S)`` → ``reshape(x, S)``, and a reshape to ``x``'s own shape → ``x``.

So the hidden state of an encoder stays ``[B·S, hidden]`` from one dense to the next: the bias,
GELU and residual adds become the dense's epilogue, LayerNorm reads the dense's output, and the
reshape pairs around it cancel. Reshapes that remain (into attention heads) fuse with their
transposes as before. Sources: TVM's SimplifyExpr (``SimplifyReshape`` folds consecutive
reshapes); moving reshapes below element-wise ops is Kiln's. Shapes compare symbolically (the
VM's sequence lengths) with :mod:`kiln.arith`.
"""

from __future__ import annotations

from kiln import arith
from kiln.relay.graph import Call, Constant, Expr, Function, rewrite, same_call
from kiln.relay.op.reduce import reduce_axes
from kiln.relay.op_registry import OpPattern

name = "SinkReshape"
#: attributes that tie an element-wise op to an axis or layout of its operands
_AXIS_ATTRS = ("axis", "axes", "layout", "data_layout")
#: reductions whose value over every axis does not depend on the order of the elements
_FULL_REDUCTIONS = ("min", "max")


def _same(a: arith.Dim, b: arith.Dim) -> bool:
    return arith.sub(a, b) == 0


def _same_shape(a: tuple, b: tuple) -> bool:
    return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))


def _is_reshape(e: Expr) -> bool:
    return isinstance(e, Call) and e.op.name == "reshape"


def _reshape(x: Expr, shape: tuple, span: str | None) -> Expr:
    """``x`` reshaped to ``shape``: a new Constant for a constant, nothing when it is already
    that shape, the reshape's source when ``x`` is a reshape of a value of that shape."""
    if _same_shape(x.checked_type.shape, shape):
        return x
    if _is_reshape(x) and _same_shape(x.args[0].checked_type.shape, shape):
        return x.args[0]
    if isinstance(x, Constant) and not x.is_symbolic:
        return Constant(x.data.reshape(tuple(int(d) for d in shape)), name=x.name)
    return Call("reshape", [x], {"newshape": tuple(shape)}, span)


def _operand(c: Expr, src: tuple, out: tuple, span: str | None) -> Expr | None:
    """``c`` as an operand of the element-wise op over ``src`` (the reshape's source shape)
    instead of ``out``, or None when it cannot be (module docstring)."""
    shape = c.checked_type.shape
    if _same_shape(shape, out):
        return _reshape(c, src, span)
    lead, last = shape[:-1], shape[-1:] if shape else ()
    if not all(_same(d, 1) for d in lead) or (last and not (_same(last[0], 1)
                                                          or _same(last[0], out[-1]))):
        return None
    if len(shape) <= len(src):
        return c
    if isinstance(c, Constant) and not c.is_symbolic:
        return Constant(c.data.reshape(c.data.shape[len(shape) - len(src):]), name=c.name)
    return None


def _sink_elementwise(call: Call, args: list[Expr]) -> Expr | None:
    out = call.checked_type.shape
    if not out or call.op.pattern > OpPattern.BROADCAST or any(k in call.attrs
                                                              for k in _AXIS_ATTRS):
        return None
    src = next((a.args[0].checked_type.shape for a in args if _is_reshape(a)
                and _same_shape(a.checked_type.shape, out)), None)
    if src is None or not src or not _same(src[-1], out[-1]):
        return None
    new_args = []
    for a in args:
        new = _operand(a, src, out, call.span)
        if new is None:
            return None
        new_args.append(new)
    inner = Call(call.op.name, new_args, call.attrs, call.span)
    return Call("reshape", [inner], {"newshape": tuple(out)}, call.span)


def _sink_layer_norm(call: Call, args: list[Expr]) -> Expr | None:
    x = args[0]
    out = call.checked_type.shape
    if not _is_reshape(x) or call.attrs["axis"] % len(out) != len(out) - 1:
        return None
    src = x.args[0].checked_type.shape
    if not src or not _same(src[-1], out[-1]):
        return None
    attrs = {**call.attrs, "axis": len(src) - 1}
    inner = Call(call.op.name, [x.args[0], *args[1:]], attrs, call.span)
    return Call("reshape", [inner], {"newshape": tuple(out)}, call.span)


def _sink_full_reduction(call: Call, args: list[Expr]) -> Expr | None:
    (x,) = args
    if not _is_reshape(x) or call.attrs["keepdims"]:
        return None
    shape = x.checked_type.shape
    if len(reduce_axes(shape, call.attrs["axis"])) != len(shape):
        return None
    src = x.args[0]
    axes = tuple(range(len(src.checked_type.shape)))
    return Call(call.op.name, [src], {**call.attrs, "axis": axes}, call.span)


def _sink_quantize(call: Call, args: list[Expr]) -> Expr | None:
    x, scale, zero_point = args
    if not _is_reshape(x) or call.attrs.get("block_size") or \
            scale.checked_type.ndim or zero_point.checked_type.ndim:
        return None  # per axis or per block: the parameters follow an axis of ``x``
    src = x.args[0]
    if not src.checked_type.ndim:
        return None
    inner = Call(call.op.name, [src, scale, zero_point], {**call.attrs, "axis": 0}, call.span)
    return Call("reshape", [inner], {"newshape": tuple(call.checked_type.shape)}, call.span)


def _fold_reshape(call: Call, args: list[Expr]) -> Expr:
    (x,) = args
    if _is_reshape(x):
        x = x.args[0]
    if _same_shape(x.checked_type.shape, call.checked_type.shape):
        return x
    if x is args[0]:
        return same_call(call, args)
    return Call("reshape", [x], call.attrs, call.span)


def sink_reshape(func: Function) -> Function:
    """``func`` with reshapes moved below element-wise ops and LayerNorm and consecutive
    reshapes folded (see the module docstring); the same values, shapes and dtypes."""

    def visit(call: Call, args: list[Expr]) -> Expr:
        if call.op.name == "reshape":
            return _fold_reshape(call, args)
        if call.op.name == "nn.layer_norm":
            return _sink_layer_norm(call, args) or same_call(call, args)
        if call.op.name in _FULL_REDUCTIONS:
            return _sink_full_reduction(call, args) or same_call(call, args)
        if call.op.name == "qnn.quantize":
            return _sink_quantize(call, args) or same_call(call, args)
        if any(_is_reshape(a) for a in args) and call.op.pattern <= OpPattern.BROADCAST:
            return _sink_elementwise(call, args) or same_call(call, args)
        return same_call(call, args)

    return rewrite(func, visit)


sink_reshape.name = name  # type: ignore[attr-defined]
