"""PromoteFloat16: compute float16 graphs in float32, keeping float16 at the graph's edges.

CPUs without half-precision arithmetic compute ``_Float16`` by converting to float and back
around every operation; rounding every intermediate tensor to half then costs accuracy (a
softmax or a matmul chain drifts by ulps) for no speed. This pass rewrites every float16 op to
float32: float16 inputs and constants are cast up where they are used, ``cast`` to float16
becomes a cast to float32, and each float16 graph output is cast back down at the end — one
rounding per output, as onnxruntime's CPU kernels that upcast half do
(docs/decisions/009-onnx-backend-conformance.md).
"""

from __future__ import annotations

from kiln.relay.graph import Call, Constant, Expr, Function, post_order, rewrite

name = "PromoteFloat16"
_HALF, _FLOAT = "float16", "float32"


def _up(e: Expr) -> Expr:
    if e.checked_type.dtype != _HALF:
        return e
    if isinstance(e, Constant):
        return Constant(e.data.astype(_FLOAT), name=e.name)
    return Call("cast", [e], {"dtype": _FLOAT})


def promote_float16(func: Function) -> Function:
    """``func`` with float16 arithmetic done in float32 (see the module docstring); a function
    without float16 values is returned unchanged."""
    if not any(n.checked_type.dtype == _HALF for n in post_order(func.outputs)):
        return func

    def visit(call: Call, args: list[Expr]) -> Expr:
        attrs = dict(call.attrs)
        if call.op.name == "cast" and attrs.get("dtype") == _HALF:
            attrs["dtype"] = _FLOAT
        return Call(call.op.name, [_up(a) for a in args], attrs, call.span)

    out = rewrite(func, visit)
    outputs = [Call("cast", [new], {"dtype": _HALF})
               if old.checked_type.dtype == _HALF and new.checked_type.dtype != _HALF else new
               for old, new in zip(func.outputs, out.outputs)]
    return Function(out.params, outputs, out.output_names, dict(out.attrs))


promote_float16.name = name  # type: ignore[attr-defined]
