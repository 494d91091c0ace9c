"""Per-op compute definitions (TVM's topi): graph op → tensor expressions.

Each module registers computes with ``kiln.topi.registry.register_compute`` for ops defined in
``kiln.relay.op``; a compute is ``fn(inputs: list[te.Tensor], attrs: dict, out_type) -> te.Tensor``
and describes *what* to compute, never how (that is ``kiln.schedules``). Stages carry tags
("conv2d", "pad", ...) by which schedules find them.

Compute docstrings are numpy style (model: TVM's ``topi.nn.conv2d_nchw``). Their Parameters
list the tensors of ``inputs`` in order, then the ``attrs`` keys the compute reads;
``out_type`` (the op's inferred type, whose shape the result takes) is named only where the
compute reads more of it. Shapes are given per dimension with the layout; Returns gives the
output shape in terms of the inputs and the tag of the stage schedules match.

May import: kiln.tir, kiln.arith, kiln.target (and kiln.errors).
"""

from kiln.topi import (  # noqa: F401
    attention,
    einsum,
    elemwise,
    image,
    indexing,
    integer,
    logical,
    nn,
    nn_nchwc,
    pool_index,
    qnn,
    reduce,
    sampling,
    transform,
    weight_quant,
    winograd,
)
