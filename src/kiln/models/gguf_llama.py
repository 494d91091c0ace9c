"""Read a llama-architecture GGUF file: hyper-parameters and float32 weights.

The reader is the format's own (the ``gguf`` package of llama.cpp, pinned in the ``llm`` extra);
its ``quants.dequantize`` expands Q4_1 / Q8_0 blocks to float32. llama.cpp's converter
(``convert_hf_to_gguf.py``, ``LlamaModel.permute``) reorders the rows of the Q and K projections
so that RoPE rotates adjacent pairs; :func:`read_llama` undoes that so the weights are in
Hugging Face's order, whose RoPE rotates the two halves of each head ("rotate half").
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from kiln.errors import KilnError
from kiln.models.llama_onnx import LlamaConfig


def _gguf():
    try:
        import gguf
    except ImportError as err:  # pragma: no cover - depends on the install
        raise KilnError("reading GGUF files needs the gguf package: "
                        "pip install 'kiln[llm]'") from err
    return gguf


def _field(reader, key: str, path: Path):
    field = reader.fields.get(key)
    if field is None:
        raise KilnError(f"{path}: GGUF metadata has no {key!r}")
    return field.contents()


def llama_config(reader, path: Path) -> LlamaConfig:
    """The :class:`LlamaConfig` of an open ``gguf.GGUFReader``.

    Raises
    ------
    KilnError
        If the file is not a llama architecture or lacks a key.
    """
    arch = _field(reader, "general.architecture", path)
    if arch != "llama":
        raise KilnError(f"{path}: architecture {arch!r} is not llama")

    def get(key: str):
        return _field(reader, f"llama.{key}", path)

    heads = int(get("attention.head_count"))
    return LlamaConfig(
        layers=int(get("block_count")), hidden=int(get("embedding_length")),
        ffn=int(get("feed_forward_length")), heads=heads,
        kv_heads=int(reader.fields["llama.attention.head_count_kv"].contents())
        if "llama.attention.head_count_kv" in reader.fields else heads,
        vocab=len(reader.fields["tokenizer.ggml.tokens"].data),
        context=int(get("context_length")), rope_base=float(get("rope.freq_base")),
        rms_eps=float(get("attention.layer_norm_rms_epsilon")))


def unpermute_rope(w: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's ``permute(w, heads)`` of a Q or K projection ``[heads·D, in]``: rows
    ``(h, pair, 2)`` back to ``(h, 2, pair)``."""
    out, inp = w.shape
    return w.reshape(heads, out // heads // 2, 2, inp).swapaxes(1, 2).reshape(out, inp)


def read_llama(path: Path) -> tuple[LlamaConfig, dict[str, np.ndarray]]:
    """Hyper-parameters and float32 weights (GGUF names, ``[out, in]``, Q/K in Hugging Face row
    order) of the llama GGUF file at ``path``.

    Raises
    ------
    KilnError
        If the file cannot be parsed, is not llama, or has a tensor type ``gguf`` cannot
        dequantize.
    """
    gguf = _gguf()
    try:
        reader = gguf.GGUFReader(str(path))
    except (ValueError, OSError) as err:
        raise KilnError(f"{path}: not a readable GGUF file: {err}") from err
    cfg = llama_config(reader, path)
    weights: dict[str, np.ndarray] = {}
    for t in reader.tensors:
        try:
            w = gguf.quants.dequantize(t.data, t.tensor_type)
        except NotImplementedError as err:
            raise KilnError(f"{path}: tensor {t.name} has type {t.tensor_type.name}, which "
                            "cannot be dequantized") from err
        w = np.ascontiguousarray(w, dtype=np.float32)
        if t.name.endswith("attn_q.weight"):
            w = unpermute_rope(w, cfg.heads)
        elif t.name.endswith("attn_k.weight"):
            w = unpermute_rope(w, cfg.kv_heads)
        weights[t.name] = w
    return cfg, weights
