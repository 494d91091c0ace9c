"""Graph-op definitions: each op's type relation, fusion pattern and numpy reference.

Importing this package registers every op with :func:`kiln.relay.op_registry.register_op`; the
loop-level computes for the same names live in ``kiln.topi``. The vocabulary (names and attrs) is
fixed and shared with ``kiln.topi``: attrs are plain, fully normalized Python values (ints, floats,
bools, strs, tuples of ints), so neither side needs defaults. Besides the graph IR they use
``kiln.topi``'s shared geometry (resize taps, einsum parsing) and ``kiln.runtime.dynamic_ops``:
the numpy definitions of the data-dependent ops (``dynamic``), which the VM runs and which are
their references here, kept in one place.
"""

from kiln.relay.op import (  # noqa: F401
    annotation,
    attention,
    dynamic,
    einsum,
    elemwise,
    image,
    indexing,
    integer,
    layout,
    logical,
    nn,
    pool_index,
    qnn,
    reduce,
    runtime,
    sampling,
    transform,
    weight_quant,
    winograd,
)
