"""Per-op compute definitions (TVM's topi): graph op → tensor expressions.

Each module registers computes with ``kiln.topi.registry.register_compute`` for ops defined in
``kiln.relay.op``; a compute is ``fn(inputs: list[te.Tensor], attrs: dict, out_type) -> te.Tensor``
and describes *what* to compute, never how (that is ``kiln.schedules``). Stages carry tags
("conv2d", "pad", ...) by which schedules find them.

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
)
