"""int8 QDQ models (ResNet-50, MobileNetV2) made by onnxruntime's static quantization tool."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from kiln.errors import KilnError
from kiln.models.fetch import light_model_path
from kiln.models.weights import randomize_weights

#: Calibration images :func:`qdq_resnet50` feeds onnxruntime's static quantization tool.
QDQ_CALIBRATION_SAMPLES = 4


def qdq_resnet50(folder: str | Path, per_channel: bool, seed: int = 0,
                 reduce_range: bool = False):
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
    reduce_range : bool
        The tool's ``reduce_range``: 7-bit weights (in [-64, 63]), for which Kiln's AVX2
        kernels prove ``vpmaddubsw`` exact (docs/decisions/049).

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
    return _quantize_static(model, folder, "resnet50", per_channel, seed, reduce_range)


def qdq_mobilenet_v2(folder: str | Path, per_channel: bool, seed: int = 0):
    """:func:`kiln.models.mobilenet_v2` (``seed``) quantized to int8 in QDQ format by
    onnxruntime's static quantization tool, as :func:`qdq_resnet50` does it (BatchNorm folded by
    ``quant_pre_process``, MinMax calibration on :data:`QDQ_CALIBRATION_SAMPLES` standard-normal
    images drawn with ``seed``; per-channel weights with int8 activations, or per tensor with
    uint8 activations). Its 17 depthwise 3×3 convolutions are the integer depthwise kernels'
    workload (docs/decisions/021).

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
        ``folder/mobilenet_v2_qdq_per_{channel,tensor}.onnx`` (input ``input: float32
        1×3×224×224``, output the dequantized logits ``1×1000``).

    Raises
    ------
    KilnError
        If onnxruntime (its quantization tool) is not installed.
    """
    from kiln.models.mobilenet import mobilenet_v2

    return _quantize_static(mobilenet_v2(seed=seed), Path(folder), "mobilenet_v2", per_channel,
                            seed)


def _quantize_static(model, folder: Path, stem: str, per_channel: bool, seed: int,
                     reduce_range: bool = False) -> Path:
    """``quant_pre_process`` then ``quantize_static`` (QDQ, MinMax; ``reduce_range``: 7-bit
    weights) of an opset-13 float model with one 1×3×224×224 input; writes
    ``folder/{stem}_qdq_per_{channel,tensor}.onnx``."""
    import onnx

    try:
        from onnxruntime.quantization import (
            CalibrationDataReader,
            QuantFormat,
            QuantType,
            quantize_static,
        )
        from onnxruntime.quantization.shape_inference import quant_pre_process
    except ImportError as err:
        raise KilnError(f"quantizing {stem} needs onnxruntime's quantization tool: {err}") \
            from None

    raw, folded = folder / f"{stem}_float.onnx", folder / f"{stem}_float_folded.onnx"
    onnx.save(model, str(raw))
    quant_pre_process(str(raw), str(folded), skip_symbolic_shape=True)
    name = model.graph.input[0].name

    class Calibration(CalibrationDataReader):
        def __init__(self) -> None:
            rng = np.random.default_rng(seed)
            self.samples = iter([{name: rng.standard_normal((1, 3, 224, 224)).astype("float32")}
                                 for _ in range(QDQ_CALIBRATION_SAMPLES)])

        def get_next(self):
            return next(self.samples, None)

    out = folder / f"{stem}_qdq_per_{'channel' if per_channel else 'tensor'}.onnx"
    quantize_static(str(folded), str(out), Calibration(), quant_format=QuantFormat.QDQ,
                    per_channel=per_channel,
                    activation_type=QuantType.QInt8 if per_channel else QuantType.QUInt8,
                    weight_type=QuantType.QInt8, reduce_range=reduce_range)
    return out


def dynamic_int8(path: str | Path, folder: str | Path) -> Path:
    """An ONNX model quantized dynamically by onnxruntime's tool
    (``onnxruntime.quantization.quantize_dynamic``, int8 weights): each MatMul with a constant
    weight becomes DynamicQuantizeLinear (uint8 activations, scale and zero point computed at
    run time) → MatMulInteger (int8 weight, per tensor) → Cast → Mul by the two scales. The
    integer products run on Kiln's int8 dense kernel with the run-time zero point
    (docs/decisions/021).

    Parameters
    ----------
    path : str or Path
        The float model (e.g. ``wheel_file_path("minilm_l3")``, paraphrase-MiniLM-L3-v2).
    folder : str or Path
        Where ``{stem}_dynamic_int8.onnx`` is written.

    Returns
    -------
    Path
        The quantized model (same inputs and outputs as ``path``).

    Raises
    ------
    KilnError
        If onnxruntime (its quantization tool) is not installed.
    """
    try:
        from onnxruntime.quantization import QuantType, quantize_dynamic
    except ImportError as err:
        raise KilnError(f"dynamic_int8 needs onnxruntime's quantization tool: {err}") from None
    out = Path(folder) / f"{Path(path).stem}_dynamic_int8.onnx"
    quantize_dynamic(str(path), str(out), weight_type=QuantType.QInt8)
    return out
