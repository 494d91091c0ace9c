"""The llama GGUF reader's RoPE row order and the ONNX decoder's attention, against numpy."""

from __future__ import annotations

import numpy as np

from kiln.models.gguf_llama import unpermute_rope


def _llama_cpp_permute(w: np.ndarray, heads: int) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.permute (Hugging Face rows → GGUF rows)."""
    out = w.shape[0]
    return w.reshape(heads, 2, out // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _rope_half(x, cos, sin):
    h = x.shape[-1] // 2
    return x * cos + np.concatenate([-x[..., h:], x[..., :h]], -1) * sin


def _rope_pairs(x, angles):
    """GGML's normal-mode RoPE: rotate adjacent pairs (x0, x1), (x2, x3), ..."""
    out = x.copy()
    c, s = np.cos(angles), np.sin(angles)
    out[..., 0::2] = x[..., 0::2] * c - x[..., 1::2] * s
    out[..., 1::2] = x[..., 0::2] * s + x[..., 1::2] * c
    return out


def test_unpermute_inverts_llama_cpp_permute():
    w = np.random.default_rng(0).standard_normal((3 * 8, 5)).astype(np.float32)
    np.testing.assert_array_equal(unpermute_rope(_llama_cpp_permute(w, 3), 3), w)


def test_rotate_half_on_unpermuted_rows_equals_pair_rope_on_gguf_rows():
    """The reason for unpermuting: the GGUF weights with llama.cpp's pair RoPE and the
    unpermuted weights with Hugging Face's rotate-half RoPE give the same attention scores."""
    rng = np.random.default_rng(1)
    heads, d, hidden, pos = 2, 8, 6, 5
    wq, wk = rng.standard_normal((2, heads * d, hidden)).astype(np.float64)
    x = rng.standard_normal((pos, hidden))
    inv = 1e4 ** (-np.arange(0, d, 2) / d)
    ang = np.arange(pos)[:, None] * inv                                   # [pos, d/2]
    cos, sin = np.cos(np.concatenate([ang, ang], 1)), np.sin(np.concatenate([ang, ang], 1))

    def scores(q, k):
        return np.einsum("shd,thd->hst", q, k)

    gq = (x @ _llama_cpp_permute(wq, heads).T).reshape(pos, heads, d)
    gk = (x @ _llama_cpp_permute(wk, heads).T).reshape(pos, heads, d)
    ref = scores(_rope_pairs(gq, ang[:, None]), _rope_pairs(gk, ang[:, None]))
    hq = (x @ unpermute_rope(_llama_cpp_permute(wq, heads), heads).T).reshape(pos, heads, d)
    hk = (x @ unpermute_rope(_llama_cpp_permute(wk, heads), heads).T).reshape(pos, heads, d)
    got = scores(_rope_half(hq, cos[:, None], sin[:, None]),
                 _rope_half(hk, cos[:, None], sin[:, None]))
    np.testing.assert_allclose(got, ref, rtol=1e-10, atol=1e-10)
