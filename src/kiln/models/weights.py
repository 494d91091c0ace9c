"""Seeded random weights for the light model-zoo graphs (their weights are constants)."""

from __future__ import annotations

import numpy as np

# How a weight is used decides its distribution. Ops that only move data are looked through.
_PASS_THROUGH = {"Unsqueeze", "Reshape", "Identity", "Flatten", "Squeeze", "Transpose"}


def _consumers(graph) -> dict[str, list[tuple[object, int]]]:
    users: dict[str, list[tuple[object, int]]] = {}
    for node in graph.node:
        for k, name in enumerate(node.input):
            users.setdefault(name, []).append((node, k))
    return users


def _role(name: str, users: dict[str, list[tuple[object, int]]]) -> tuple[str, object | None]:
    """Classify a weight by its first real consumer: (role, node)."""
    seen = set()
    while name not in seen:
        seen.add(name)
        uses = users.get(name, [])
        if not uses:
            return "other", None
        node, k = uses[0]
        op = node.op_type
        if op in _PASS_THROUGH and k == 0:
            name = node.output[0]
            continue
        if op == "BatchNormalization":
            role = {1: "bn_scale", 2: "bn_bias", 3: "bn_mean", 4: "bn_var"}.get(k, "other")
            if role == "bn_scale" and _feeds_residual(node.output[0], users):
                role = "residual_scale"
            return role, node
        if op in ("Conv", "ConvTranspose", "Gemm", "MatMul"):
            return ("weight" if k == 1 else "bias"), node
        if op == "Mul":
            return "scale", node
        if op in ("Add", "Sum", "Sub"):
            return "bias", node
        return "other", node
    return "other", None


def _feeds_residual(name: str, users: dict[str, list[tuple[object, int]]]) -> bool:
    """Whether a tensor is a residual branch's end (summed with another tensor)."""
    return any(node.op_type in ("Sum", "Add") and len(node.input) >= 2
               for node, _ in users.get(name, []))


def _gain(node, users: dict[str, list[tuple[object, int]]]) -> float:
    """He gain 2 when the layer's output reaches a Relu (through BN/scale/bias), else 1."""
    name = node.output[0] if node is not None else ""
    for _ in range(4):
        uses = users.get(name, [])
        if not uses:
            return 1.0
        nxt = uses[0][0]
        if nxt.op_type == "Relu":
            return 2.0
        if nxt.op_type not in ("BatchNormalization", "Mul", "Add", "Unsqueeze"):
            return 1.0
        name = nxt.output[0]
    return 1.0


def _fan_in(shape: tuple[int, ...], node) -> int:
    if node is not None and node.op_type == "Gemm" and len(shape) == 2:
        trans_b = next((a.i for a in node.attribute if a.name == "transB"), 0)
        return shape[1] if trans_b else shape[0]
    if len(shape) >= 2:
        return int(np.prod(shape[1:]))
    return max(1, int(np.prod(shape)))


def randomize_weights(model, seed: int):
    """Replace ``ConstantOfShape`` weights by seeded random initializers of the same shape.

    Only ``ConstantOfShape`` nodes whose shape input is an initializer (a weight, not a computed
    shape) are replaced. Values are drawn by how the weight is used, so activations stay in a
    sane range and classifier outputs are discriminative:

    - Conv/Gemm/MatMul weights: ``N(0, g / fan_in)`` with ``g = 2`` (He) when the layer's
      output reaches a Relu and ``g = 1`` (LeCun) otherwise, e.g. depthwise convolutions;
    - biases (Conv/Gemm input 2, Add/Sum operands): ``N(0, 0.05²)``;
    - BatchNormalization: scale ``U(0.8, 1.2)``, bias and mean ``N(0, 0.05²)``, variance
      ``U(0.5, 1.5)`` (strictly positive); Mul operands (unfolded BN scales) ``U(0.8, 1.2)``;
    - the scale of a BatchNormalization that ends a residual branch: ``U(0.2, 0.4)``, so
      activations do not double with every residual block (as in "zero-γ" initialization).

    Parameters
    ----------
    model : onnx.ModelProto
        Model to copy; it is not modified.
    seed : int
        Seed of :func:`numpy.random.default_rng`; same seed → same weights.

    Returns
    -------
    onnx.ModelProto
        A copy whose replaced weights are initializers (also listed as graph inputs when the
        model's IR version requires initializers to be inputs), with unused shape initializers
        removed.
    """
    import onnx
    from onnx import numpy_helper

    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    rng = np.random.default_rng(seed)
    inits = {t.name: t for t in graph.initializer}
    users = _consumers(graph)
    keep_nodes = []
    new_inits = []
    for node in graph.node:
        if node.op_type != "ConstantOfShape" or node.input[0] not in inits:
            keep_nodes.append(node)
            continue
        shape = tuple(int(d) for d in numpy_helper.to_array(inits[node.input[0]]).reshape(-1))
        dtype = np.float32
        for attr in node.attribute:
            if attr.name == "value":
                dtype = numpy_helper.to_array(attr.t).dtype
        if not np.issubdtype(dtype, np.floating):
            keep_nodes.append(node)
            continue
        role, consumer = _role(node.output[0], users)
        if role == "weight":
            std = np.sqrt(_gain(consumer, users) / _fan_in(shape, consumer))
            value = rng.normal(0.0, std, shape)
        elif role == "bn_var":
            value = rng.uniform(0.5, 1.5, shape)
        elif role == "residual_scale":
            value = rng.uniform(0.2, 0.4, shape)
        elif role in ("bn_scale", "scale"):
            value = rng.uniform(0.8, 1.2, shape)
        elif role in ("bn_bias", "bn_mean", "bias"):
            value = rng.normal(0.0, 0.05, shape)
        elif len(shape) >= 2:
            value = rng.normal(0.0, np.sqrt(2.0 / _fan_in(shape, None)), shape)
        else:
            value = rng.normal(0.0, 0.05, shape)
        new_inits.append(numpy_helper.from_array(value.astype(dtype), node.output[0]))
    del graph.node[:]
    graph.node.extend(keep_nodes)
    used = {name for node in graph.node for name in node.input}
    used |= {o.name for o in graph.output}
    kept_inits = [t for t in graph.initializer if t.name in used]
    del graph.initializer[:]
    graph.initializer.extend(kept_inits + new_inits)
    # Graph inputs that named a removed shape initializer go; new initializers need an input
    # entry only for IR < 4, where every initializer must also be a graph input.
    removed = set(inits) - {t.name for t in kept_inits}
    listed = [i for i in graph.input if i.name not in removed]
    if out.ir_version < 4:
        names = {i.name for i in listed}
        listed += [onnx.helper.make_tensor_value_info(t.name, t.data_type, t.dims)
                   for t in new_inits if t.name not in names]
    del graph.input[:]
    graph.input.extend(listed)
    return out

