"""Floating-point operation counts of an ONNX graph, for achieved GFLOP/s in the benchmarks.

Only the operators that dominate a CNN's work are counted, as multiply-adds × 2:

- ``Conv``: ``2 · N · Cout · Hout · Wout · (Cin / group) · kH · kW`` (any number of spatial
  dims: ``2 · |Y| · |W| / Cout``);
- ``Gemm``, ``MatMul``: ``2 · M · N · K`` (batched MatMul: times the batch).

Bias additions, BatchNormalization, activations, pooling and every other elementwise or data
movement op are ignored (a few percent of a CNN's FLOPs). Shapes come from
``onnx.shape_inference.infer_shapes`` (with data propagation, for shapes computed by
``Shape`` → ``Concat`` → ``Reshape``) after the graph inputs are given static shapes.
"""

from __future__ import annotations

import math

COUNTED_OPS = ("Conv", "Gemm", "MatMul")


def _static_inputs(model, input_shapes: dict[str, tuple[int, ...]] | None):
    """A copy of ``model`` whose named graph inputs have the given static shapes, and whose
    recorded intermediate and output shapes are dropped (exporters leave symbolic ones there)."""
    import onnx

    out = onnx.ModelProto()
    out.CopyFrom(model)
    del out.graph.value_info[:]
    for vi in out.graph.output:
        vi.type.tensor_type.ClearField("shape")
    for vi in out.graph.input:
        if input_shapes and vi.name in input_shapes:
            dims = vi.type.tensor_type.shape.dim
            del dims[:]
            for d in input_shapes[vi.name]:
                dims.add().dim_value = int(d)
    return out


def _known_shapes(model) -> dict[str, tuple[int, ...]]:
    """Every tensor name with a fully static shape → that shape (initializers included)."""
    graph = model.graph
    shapes = {t.name: tuple(t.dims) for t in graph.initializer}
    for vi in (*graph.input, *graph.value_info, *graph.output):
        dims = vi.type.tensor_type.shape.dim
        if vi.type.HasField("tensor_type") and all(d.HasField("dim_value") for d in dims):
            shapes.setdefault(vi.name, tuple(d.dim_value for d in dims))
    return shapes


def _node_flops(node, shapes: dict[str, tuple[int, ...]]) -> int:
    """FLOPs of one counted node (see the module docstring)."""
    names = [node.input[0], node.input[1], node.output[0]]
    missing = [n for n in names if n not in shapes]
    if missing:
        raise ValueError(f"{node.op_type} node {node.name!r}: no static shape for "
                         f"{', '.join(missing)} after shape inference")
    a, w, y = (shapes[n] for n in names)
    if node.op_type == "Conv":
        return 2 * math.prod(y) * math.prod(w[1:])
    if node.op_type == "Gemm":
        trans_a = next((attr.i for attr in node.attribute if attr.name == "transA"), 0)
        k = a[0] if trans_a else a[1]
        return 2 * math.prod(y) * k
    k = a[-1] if len(a) > 1 else a[0]  # MatMul: contraction over A's last axis
    return 2 * math.prod(y) * k


def count_flops(model, input_shapes: dict[str, tuple[int, ...]] | None = None) -> int:
    """Floating-point operations of one inference of ``model`` (Conv, Gemm, MatMul only).

    Parameters
    ----------
    model : onnx.ModelProto
        The model; not modified.
    input_shapes : dict of str to tuple of int, optional
        Static shapes for graph inputs (e.g. ``{"x": (1, 3, 224, 224)}``), replacing symbolic
        dims before shape inference.

    Returns
    -------
    int
        FLOPs (one multiply-add = 2 FLOPs) of the top-level graph's counted nodes.

    Raises
    ------
    ValueError
        If a counted node's input, weight or output shape is not static after inference.
    """
    import onnx

    inferred = onnx.shape_inference.infer_shapes(_static_inputs(model, input_shapes),
                                                 strict_mode=True, data_prop=True)
    shapes = _known_shapes(inferred)
    return sum(_node_flops(n, shapes) for n in inferred.graph.node if n.op_type in COUNTED_OPS)
