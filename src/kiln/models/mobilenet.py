"""MobileNetV2 built with ``onnx.helper``, with seeded random weights."""

from __future__ import annotations

import numpy as np

#: MobileNetV2's inverted residual stages (t: expansion, c: output channels, n: blocks,
#: s: stride of the first block), Table 2 of Sandler et al. 2018 / torchvision's
#: ``inverted_residual_setting``.
MOBILENET_V2_STAGES = (
    (1, 16, 1, 1),
    (6, 24, 2, 2),
    (6, 32, 3, 2),
    (6, 64, 4, 2),
    (6, 96, 3, 1),
    (6, 160, 3, 2),
    (6, 320, 1, 1),
)


class _OnnxGraphBuilder:
    """Nodes and seeded initializers of a convolutional ONNX graph, named in creation order."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.nodes: list = []
        self.initializers: list = []
        self._count = 0

    def _name(self, kind: str) -> str:
        self._count += 1
        return f"{kind}_{self._count}"

    def constant(self, value: np.ndarray, kind: str) -> str:
        """Add ``value`` as an initializer; returns its name."""
        from onnx import numpy_helper

        name = self._name(kind)
        self.initializers.append(numpy_helper.from_array(value, name))
        return name

    def node(self, op: str, inputs: list[str], **attrs) -> str:
        """Add a one-output node; returns the output's name."""
        from onnx import helper

        out = self._name(op.lower())
        self.nodes.append(helper.make_node(op, inputs, [out], name=out, **attrs))
        return out

    def conv_bn(self, x: str, cin: int, cout: int, kernel: int, stride: int, group: int,
                relu6: bool, residual: bool = False) -> str:
        """Conv (no bias) → BatchNormalization → optional Clip(0, 6), as torch exports them.

        Weights are ``N(0, g / fan_in)`` with He gain ``g = 2`` before a ReLU6, else 1; BN scale
        ``U(0.8, 1.2)`` (``U(0.2, 0.4)`` when the output ends a residual branch, so residual
        sums stay in range), bias and mean ``N(0, 0.05²)``, variance ``U(0.5, 1.5)``.
        """
        fan_in = cin // group * kernel * kernel
        std = np.sqrt((2.0 if relu6 else 1.0) / fan_in)
        w = self.rng.normal(0.0, std, (cout, cin // group, kernel, kernel)).astype(np.float32)
        pad = kernel // 2
        y = self.node("Conv", [x, self.constant(w, "conv_w")], kernel_shape=[kernel, kernel],
                      strides=[stride, stride], pads=[pad] * 4, group=group)
        lo, hi = (0.2, 0.4) if residual else (0.8, 1.2)
        stats = [self.rng.uniform(lo, hi, cout), self.rng.normal(0.0, 0.05, cout),
                 self.rng.normal(0.0, 0.05, cout), self.rng.uniform(0.5, 1.5, cout)]
        names = [self.constant(s.astype(np.float32), k)
                 for s, k in zip(stats, ("bn_scale", "bn_bias", "bn_mean", "bn_var"), strict=True)]
        y = self.node("BatchNormalization", [y, *names], epsilon=1e-5)
        if relu6:
            lo_name = self.constant(np.array(0.0, np.float32), "clip_min")
            hi_name = self.constant(np.array(6.0, np.float32), "clip_max")
            y = self.node("Clip", [y, lo_name, hi_name])
        return y

    def inverted_residual(self, x: str, cin: int, cout: int, stride: int, expand: int) -> str:
        """One MobileNetV2 block: 1×1 expansion (if ``expand != 1``), 3×3 depthwise, linear
        1×1 projection, and the identity shortcut when ``stride == 1`` and ``cin == cout``."""
        hidden = cin * expand
        y = x
        if expand != 1:
            y = self.conv_bn(y, cin, hidden, 1, 1, 1, relu6=True)
        y = self.conv_bn(y, hidden, hidden, 3, stride, hidden, relu6=True)
        shortcut = stride == 1 and cin == cout
        y = self.conv_bn(y, hidden, cout, 1, 1, 1, relu6=False, residual=shortcut)
        if shortcut:
            y = self.node("Add", [x, y])
        return y


def mobilenet_v2(seed: int = 0, num_classes: int = 1000):
    """MobileNetV2 (width 1.0, 224×224) as an ONNX model with seeded random weights.

    Sandler et al. 2018, "MobileNetV2: Inverted Residuals and Linear Bottlenecks" (CVPR), in
    torchvision's layout: a 3×3 stride-2 conv 3→32, the inverted residual stages of
    :data:`MOBILENET_V2_STAGES`, a 1×1 conv to 1280, global average pooling, flatten and a
    fully connected layer (Gemm) to ``num_classes``. Every conv is Conv (no bias) →
    BatchNormalization → Clip(0, 6) (ReLU6), except the linear projections (no Clip), as a
    torch model exported without BN folding has them. Built with ``onnx.helper`` only.

    Parameters
    ----------
    seed : int
        Seed of :func:`numpy.random.default_rng` for every weight; same seed → same model.
    num_classes : int
        Width of the output.

    Returns
    -------
    onnx.ModelProto
        Opset 13 model, input ``input: float32 1×3×224×224``, output
        ``output: float32 1×num_classes`` (logits); about 3.5 M parameters and 0.6 GFLOP.
    """
    import onnx
    from onnx import TensorProto, helper

    b = _OnnxGraphBuilder(seed)
    y = b.conv_bn("input", 3, 32, 3, 2, 1, relu6=True)
    cin = 32
    for expand, cout, blocks, stride in MOBILENET_V2_STAGES:
        for k in range(blocks):
            y = b.inverted_residual(y, cin, cout, stride if k == 0 else 1, expand)
            cin = cout
    y = b.conv_bn(y, cin, 1280, 1, 1, 1, relu6=True)
    y = b.node("GlobalAveragePool", [y])
    y = b.node("Flatten", [y], axis=1)
    w = b.rng.normal(0.0, np.sqrt(1.0 / 1280), (num_classes, 1280)).astype(np.float32)
    bias = b.rng.normal(0.0, 0.05, num_classes).astype(np.float32)
    b.nodes.append(helper.make_node("Gemm", [y, b.constant(w, "fc_w"), b.constant(bias, "fc_b")],
                                    ["output"], name="fc", transB=1))
    graph = helper.make_graph(
        b.nodes, "mobilenet_v2",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, 224, 224])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, num_classes])],
        b.initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)],
                              producer_name="kiln.models")
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model

