"""ONNX op converters, one module per category; importing this package registers them all.

A converter is ``fn(ctx: ConvertContext) -> Expr | list[Expr]`` registered with
``@onnx_op(op_type, since=opset)``. It emits only ops of the graph-op vocabulary
(:mod:`kiln.relay.op`), with fully normalized attributes.
"""

from kiln.frontend.onnx.converters import (  # noqa: F401
    activation,
    dynamic,
    einsum,
    elementwise,
    generate,
    image,
    indexing,
    logical,
    nn,
    normalization,
    quantization,
    reduce,
    rnn,
    sampling,
    spectral,
    tensor,
)
