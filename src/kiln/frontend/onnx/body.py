"""An ONNX node written as other ONNX nodes: the body a builder makes for an op Kiln converts
through simpler ops (onnxruntime's contrib ops, :mod:`kiln.frontend.onnx.contrib`; a recurrent
layer over a symbolic sequence, :mod:`kiln.frontend.onnx.recurrent_scan`). The importer
converts the body's nodes as if the model had them (like an ONNX function body,
:mod:`kiln.frontend.onnx.functions`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from onnx import GraphProto, NodeProto, helper, numpy_helper

from kiln.errors import UnsupportedOpError
from kiln.relay.graph import TensorType

#: the default-domain opset bodies are written for (Reduce*/Squeeze/Split take axes and splits
#: as inputs; LayerNormalization and Gelu exist)
BODY_OPSET = 21


class Body:
    """The default-domain nodes one node expands into, built by its builder.

    Parameters
    ----------
    node : the node (of onnxruntime's ``com.microsoft`` domain, or a default-domain op).
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

    def constant_value(self, k: int) -> np.ndarray | None:
        """The compile-time value of input ``k``; None when it is omitted or computed at run
        time."""
        return self._constant(k) if self.has_input(k) else None

    def constant(self, k: int, what: str) -> np.ndarray:
        """The compile-time value of input ``k``; UnsupportedOpError naming ``what`` when it
        is computed at run time."""
        value = self.constant_value(k)
        if value is None:
            raise self.unsupported(f"{what} (input {k}) must be a constant initializer")
        return value

    def wants_output(self, k: int) -> bool:
        return k < len(self.node.output) and bool(self.node.output[k])

    def unsupported(self, reason: str) -> UnsupportedOpError:
        where = f", domain '{self.node.domain}'" if self.node.domain else ""
        return UnsupportedOpError(f"ONNX {self.node.op_type} (node '{self.name}'{where}): "
                                  f"{reason}")

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

    def child(self, suffix: str) -> Body:
        """An empty body for a subgraph (a Scan's step), its names prefixed ``name/suffix``."""
        return Body(self.node, f"{self.name}/{suffix}", self.input_types, self._constant)

    def graph(self, inputs: list[tuple[str, int]], outputs: list[str]) -> GraphProto:
        """This body's nodes as a subgraph with formal ``inputs`` (name, ONNX element type;
        shapes left to the importer) and ``outputs``."""
        return helper.make_graph(
            self.nodes, self.name,
            [helper.make_tensor_value_info(n, t, None) for n, t in inputs],
            [helper.make_empty_tensor_value_info(n) for n in outputs])
