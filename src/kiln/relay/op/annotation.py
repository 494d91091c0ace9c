"""BYOC annotation ops: ``annotation.compiler_begin`` and ``annotation.compiler_end`` (TVM:
src/relay/op/annotation/annotation.cc).

Both are the identity on one tensor, with the attr ``compiler`` (a registered external
compiler's name). AnnotateTarget wraps every argument of an op an external compiler supports in
``compiler_begin`` and its result in ``compiler_end``; MergeCompilerRegions removes the
end → begin pairs inside merged regions; PartitionGraph turns each region into an external
function and removes the rest. They never reach code generation (they have no compute).
"""

from __future__ import annotations

from kiln.errors import ShapeError
from kiln.relay.graph import TensorType
from kiln.relay.op.common import expect_arity
from kiln.relay.op_registry import OpPattern, register_op

BEGIN = "annotation.compiler_begin"
END = "annotation.compiler_end"


def _identity_infer(arg_types: list[TensorType], attrs: dict) -> TensorType:
    expect_arity(arg_types, 1)
    if not isinstance(attrs.get("compiler"), str) or not attrs["compiler"]:
        raise ShapeError("needs a 'compiler' attr naming the external compiler")
    return arg_types[0]


register_op(BEGIN, _identity_infer, OpPattern.OPAQUE, lambda x, compiler: x)
register_op(END, _identity_infer, OpPattern.OPAQUE, lambda x, compiler: x)
