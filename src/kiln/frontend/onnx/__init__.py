"""The ONNX importer: ``from_onnx(model) -> (IRModule, params)`` and ``load_onnx(path)``.

- ``registry``: the ``@onnx_op(op_type, since=opset)`` converter registry.
- ``context``: :class:`ConvertContext`, what a converter sees of one node.
- ``importer``: graph inputs/initializers → Vars, node-by-node conversion, outputs.
- ``converters``: one module per op category.
- ``functions``: ops ONNX defines as functions, converted through their function bodies.
- ``control_flow``: If on a compile-time condition, Scan and Loop unrolled.
- ``backend``: ONNX's backend interface (``prepare``/``run``) over import, build and the graph
  executor — the one frontend module that imports the compiler and runtime (lazily).
"""

from kiln.frontend.onnx.importer import from_onnx, load_onnx, model_opset
from kiln.frontend.onnx.registry import list_converters, onnx_op

__all__ = ["from_onnx", "list_converters", "load_onnx", "model_opset", "onnx_op"]
