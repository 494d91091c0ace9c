"""Model importers (TVM: ``relay.frontend``): a trained model in, graph IR plus parameters out.

Only ONNX for now (``kiln.frontend.onnx``). A frontend emits ops of the fixed graph-op
vocabulary (``kiln.relay.op``) with static shapes and normalized attributes; everything the
frontend cannot express raises :class:`kiln.errors.UnsupportedOpError` naming op, node and
opset.

May import: kiln.relay, kiln.arith (and kiln.errors).
"""

from kiln.frontend.onnx import from_onnx, list_converters, load_onnx, onnx_op

__all__ = ["from_onnx", "list_converters", "load_onnx", "onnx_op"]
