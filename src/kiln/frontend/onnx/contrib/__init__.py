"""onnxruntime's ``com.microsoft`` contrib ops, each written as a body of standard ONNX ops.

onnxruntime's own tools write these ops into models: ``quantize_dynamic`` / ``quantize_static``
(``DynamicQuantizeMatMul``, ``QLinearAdd``, ``DynamicQuantizeLSTM``, ...), the transformers
optimizer (``SkipLayerNormalization``, ``Attention``, ``FastGelu``, ...) and the 4-bit weight
quantizer (``MatMulNBits``). Their semantics are those of onnxruntime's
``docs/ContribOperators.md`` and its CPU kernels (``onnxruntime/contrib_ops/cpu/``).

Kiln converts such a node the way it converts an ONNX op that has a function body
(:mod:`kiln.frontend.onnx.functions`): a builder registered with ``@contrib_op(op_type)``
writes the op as default-domain nodes at ``BODY_OPSET`` into a
:class:`~kiln.frontend.onnx.body.Body`, and the importer converts those. The graph passes
then see ordinary ops (a QDQ pattern, a LayerNorm, a MatMul) and fuse and schedule them as in
any other model; nothing downstream knows the domain.
"""

from __future__ import annotations

from collections.abc import Callable

from kiln.frontend.onnx.body import Body

#: the domain of onnxruntime's contrib ops
MS_DOMAIN = "com.microsoft"

_BUILDERS: dict[str, Callable[[Body], None]] = {}


def contrib_op(op_type: str) -> Callable[[Callable[[Body], None]], Callable[[Body], None]]:
    """Decorator: register the body builder of the ``com.microsoft`` op ``op_type``."""

    def wrap(fn: Callable[[Body], None]) -> Callable[[Body], None]:
        assert op_type not in _BUILDERS, f"contrib op {op_type} registered twice"
        _BUILDERS[op_type] = fn
        return fn

    return wrap


def has_contrib_body(op_type: str) -> bool:
    """Whether the ``com.microsoft`` op ``op_type`` has a body builder."""
    return op_type in _BUILDERS


def list_contrib_ops() -> dict[str, Callable[[Body], None]]:
    """The ``com.microsoft`` op types Kiln converts (sorted) with their body builders (whose
    docstrings say what each op computes)."""
    return dict(sorted(_BUILDERS.items()))


def expand_contrib(body: Body) -> None:
    """Write the ``com.microsoft`` node of ``body`` as default-domain nodes (at
    :data:`~kiln.frontend.onnx.body.BODY_OPSET`) into it. Raises UnsupportedOpError for an op
    without a builder, or an attribute or input its builder does not take (naming the node and
    the reason)."""
    builder = _BUILDERS.get(body.node.op_type)
    if builder is None:
        raise body.unsupported("no converter for this op")
    builder(body)


from kiln.frontend.onnx.contrib import quantized, transformer  # noqa: E402,F401 - registers
