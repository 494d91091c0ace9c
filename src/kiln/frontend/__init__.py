"""Model importers (TVM: ``relay.frontend``): a trained model in, graph IR plus parameters out.

ONNX (``kiln.frontend.onnx``) and PyTorch modules, exported to ONNX in memory
(``kiln.frontend.pytorch``: ``from_pytorch``; PyTorch is optional and imported only when
``from_pytorch`` is called). A frontend emits ops of the fixed graph-op
vocabulary (``kiln.relay.op``) with static shapes and normalized attributes; everything the
frontend cannot express raises :class:`kiln.errors.UnsupportedOpError` naming op, node and
opset.

May import: kiln.relay, kiln.arith (and kiln.errors).
"""

from kiln.frontend.onnx import from_onnx, list_converters, load_onnx, onnx_op
from kiln.frontend.pytorch import from_pytorch

__all__ = ["from_onnx", "from_pytorch", "list_converters", "load_onnx", "onnx_op"]
