"""onnxruntime's ``com.microsoft`` contrib ops, each written as a body of standard ONNX ops.

onnxruntime's own tools write these ops into models: ``quantize_dynamic`` / ``quantize_static``
(``DynamicQuantizeMatMul``, ``QLinearAdd``, ``DynamicQuantizeLSTM``, ...), the transformers
optimizer (``SkipLayerNormalization``, ``Attention``, ``FastGelu``, ...) and the 4-bit weight
quantizer (``MatMulNBits``). Their semantics are those of onnxruntime's
``docs/ContribOperators.md`` and its CPU kernels (``onnxruntime/contrib_ops/cpu/``).

Kiln converts such a node the way it converts an ONNX op that has a function body
(:mod:`kiln.frontend.onnx.functions`): a builder registered with ``@contrib_op(op_type)``
writes the op as default-domain nodes at :data:`CONTRIB_OPSET` into a :class:`Body`, and the
importer converts those. The graph passes then see ordinary ops (a QDQ pattern, a LayerNorm, a
MatMul) and fuse and schedule them as in any other model; nothing downstream knows the domain.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from onnx import NodeProto, helper, numpy_helper

from kiln.errors import UnsupportedOpError
from kiln.relay.graph import TensorType

#: the domain of onnxruntime's contrib ops
MS_DOMAIN = "com.microsoft"
#: the default-domain opset the bodies are written for (Reduce*/Squeeze/Split take axes and
#: splits as inputs; LayerNormalization and Gelu exist)
CONTRIB_OPSET = 21

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


class Body:
    """The default-domain nodes one contrib node expands into, built by its builder.

    Parameters
    ----------
    node : the ``com.microsoft`` node.
    name : its name in the graph (used as the prefix of every value the body makes).
    input_types : the type of each input (None for an omitted one).
    constant : the compile-time value of input ``k`` (an initializer or a ``Constant``), or
        None when it is computed at run time.
    """

    def __init__(self, node: NodeProto, name: str, input_types: list[TensorType | None],
                 constant: Callable[[int], np.ndarray | None]):
        self.node = node
        self.name = name
        self.input_types = input_types
        self._constant = constant
        self.nodes: list[NodeProto] = []
        self._attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}

    # -- reading the node ------------------------------------------------------------------
    def attr(self, name: str, default: Any = None) -> Any:
        """Attribute ``name`` (strings decoded), else ``default``."""
        value = self._attrs.get(name, default)
        return value.decode() if isinstance(value, bytes) else value

    def input(self, k: int) -> str:
        """The name of input ``k``; ``""`` when it is omitted."""
        return self.node.input[k] if k < len(self.node.input) else ""

    def has_input(self, k: int) -> bool:
        return bool(self.input(k))

    def input_type(self, k: int) -> TensorType:
        """The type of input ``k`` (which must be given)."""
        t = self.input_types[k] if k < len(self.input_types) else None
        if t is None:
            raise self.unsupported(f"input {k} is required")
        return t

    def constant(self, k: int, what: str) -> np.ndarray:
        """The compile-time value of input ``k``; UnsupportedOpError naming ``what`` when it
        is computed at run time."""
        value = self._constant(k) if self.has_input(k) else None
        if value is None:
            raise self.unsupported(f"{what} (input {k}) must be a constant initializer")
        return value

    def wants_output(self, k: int) -> bool:
        return k < len(self.node.output) and bool(self.node.output[k])

    def unsupported(self, reason: str) -> UnsupportedOpError:
        return UnsupportedOpError(f"ONNX {self.node.op_type} (node '{self.name}', domain "
                                  f"'{MS_DOMAIN}'): {reason}")

    # -- writing the body ------------------------------------------------------------------
    def op(self, op_type: str, *inputs: str, outputs: int = 1, **attrs: Any) -> Any:
        """Append a default-domain node; its output name (a tuple of ``outputs`` names when
        more than one)."""
        k = len(self.nodes)
        names = [f"{self.name}/{op_type}_{k}:{j}" for j in range(outputs)]
        self.nodes.append(helper.make_node(op_type, list(inputs), names,
                                           name=f"{self.name}/{op_type}_{k}", **attrs))
        return names[0] if outputs == 1 else tuple(names)

    def const(self, value: Any, dtype: Any = None) -> str:
        """A ``Constant`` node holding ``value`` (an array, or a list of ints as int64)."""
        array = np.asarray(value, dtype=dtype if dtype is not None else
                           (np.int64 if isinstance(value, (list, tuple, int)) else None))
        k = len(self.nodes)
        out = f"{self.name}/Constant_{k}:0"
        self.nodes.append(helper.make_node(
            "Constant", [], [out], name=f"{self.name}/Constant_{k}",
            value=numpy_helper.from_array(array, name=out)))
        return out

    def output(self, k: int, value: str) -> None:
        """Bind the node's output ``k`` (when the model uses it) to ``value``."""
        if self.wants_output(k):
            self.nodes.append(helper.make_node("Identity", [value], [self.node.output[k]],
                                               name=f"{self.name}/output_{k}"))


def expand_contrib(node: NodeProto, name: str, input_types: list[TensorType | None],
                   constant: Callable[[int], np.ndarray | None]) -> list[NodeProto]:
    """The default-domain nodes (at :data:`CONTRIB_OPSET`) of the ``com.microsoft`` node
    ``node``. Raises UnsupportedOpError for an op without a builder, or an attribute or input
    its builder does not take (naming the node and the reason)."""
    builder = _BUILDERS.get(node.op_type)
    body = Body(node, name, input_types, constant)
    if builder is None:
        raise body.unsupported("no converter for this op")
    builder(body)
    return body.nodes


from kiln.frontend.onnx.contrib import quantized, transformer  # noqa: E402,F401 - registers
