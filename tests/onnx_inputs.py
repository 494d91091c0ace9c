"""The real inputs of an ONNX model (graph inputs that are not initializers), for tests in every
layer (tests/models, tests/backend)."""

from __future__ import annotations

import numpy as np


def graph_inputs(model) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """The model's real inputs (graph inputs that are not initializers): name → (shape, dtype)."""
    from onnx import helper

    inits = {t.name for t in model.graph.initializer}
    out = {}
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        tt = vi.type.tensor_type
        shape = tuple(d.dim_value if d.HasField("dim_value") else -1 for d in tt.shape.dim)
        out[vi.name] = (shape, np.dtype(helper.tensor_dtype_to_np_dtype(tt.elem_type)))
    return out
