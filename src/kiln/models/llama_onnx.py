"""A llama-architecture decoder written as a plain ONNX graph (standard ops, opset 17).

The graph is the one a decoder export for onnxruntime has (Hugging Face's ``LlamaForCausalLM``,
``modeling_llama.py``): RMSNorm, rotary position embeddings in the "rotate half" form, grouped
query attention, SwiGLU feed-forward, a final RMSNorm and the (tied) LM head. One graph serves
prompt processing and decoding: every length is a symbol.

Inputs and outputs (``G`` key/value heads, ``D`` head dim, ``V`` vocabulary):

- ``input_ids`` int64 ``[batch, sequence]``;
- ``attention_mask`` int64 ``[batch, total]``, 1 for a real token, 0 for padding, over the
  past and the new tokens (``total = past + sequence``);
- ``position_ids`` int64 ``[batch, sequence]``;
- ``past_key_values.{i}.key`` / ``.value`` float32 ``[past, batch, G, D]``;
- ``logits`` float32 ``[batch, sequence, V]``;
- ``present.{i}.key`` / ``.value`` float32 ``[total, batch, G, D]``.

The key/value cache is **sequence-major** (Megatron-LM's ``[s, b, h, d]`` layout) rather than
Hugging Face's ``[b, h, s, d]``: the past is then a contiguous prefix of the present, so a runtime
that owns the cache buffer appends the new tokens in place instead of copying the whole cache per
token (docs/decisions/019-kv-cache.md). Attention reads that layout directly through two
``Einsum`` nodes, with no transpose of the cache.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17


@dataclass(frozen=True)
class LlamaConfig:
    """Hyper-parameters of a llama decoder (the GGUF ``llama.*`` metadata keys).

    Attributes
    ----------
    layers, hidden, ffn, heads, kv_heads, vocab, context : int
        Block count, embedding width, feed-forward width, query heads, key/value heads,
        vocabulary size, trained context length (tokens).
    rope_base : float
        RoPE frequency base (θ).
    rms_eps : float
        RMSNorm epsilon.
    """

    layers: int
    hidden: int
    ffn: int
    heads: int
    kv_heads: int
    vocab: int
    context: int
    rope_base: float
    rms_eps: float

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def group(self) -> int:
        """Query heads per key/value head."""
        return self.heads // self.kv_heads


class _Graph:
    """Accumulates nodes and initializers under unique names."""

    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self._count = 0

    def op(self, op_type: str, *inputs: str, out: str | None = None, **attrs) -> str:
        self._count += 1
        out = out or f"{op_type.lower()}_{self._count}"
        self.nodes.append(helper.make_node(op_type, list(inputs), [out], **attrs))
        return out

    def const(self, name: str, value: np.ndarray) -> str:
        self.inits.append(numpy_helper.from_array(np.ascontiguousarray(value), name))
        return name

    def ints(self, name: str, values: list[int]) -> str:
        return self.const(name, np.array(values, np.int64))


def _rope_tables(cfg: LlamaConfig) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin of position × inverse frequency, ``[context, head_dim]`` float32 each, the
    halves repeated as Hugging Face's rotate-half RoPE uses them."""
    inv_freq = 1.0 / (cfg.rope_base ** (np.arange(0, cfg.head_dim, 2, dtype=np.float32)
                                        / cfg.head_dim))
    angles = np.outer(np.arange(cfg.context, dtype=np.float32), inv_freq.astype(np.float32))
    angles = np.concatenate([angles, angles], axis=1)
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


def _rms_norm(g: _Graph, x: str, weight: str, eps: float) -> str:
    var = g.op("ReduceMean", g.op("Mul", x, x), axes=[-1], keepdims=1)
    inv = g.op("Reciprocal", g.op("Sqrt", g.op("Add", var, "rms_eps")))
    return g.op("Mul", g.op("Mul", x, inv), weight)


def _rotate(g: _Graph, x: str, cos: str, sin: str) -> str:
    """x·cos + rotate_half(x)·sin over the last axis (``[B, S, H, D]``)."""
    first = g.op("Slice", x, "zero", "half", "minus1")
    second = g.op("Slice", x, "half", "int_max", "minus1")
    rotated = g.op("Concat", g.op("Neg", second), first, axis=-1)
    return g.op("Add", g.op("Mul", x, cos), g.op("Mul", rotated, sin))


def _attention_mask(g: _Graph) -> str:
    """Additive mask ``[B, 1, 1, S, T]``: 0 where query s may see key t (t ≤ its position in
    the whole sequence and t not padding), float32 min elsewhere (as Hugging Face uses, so a
    fully masked padding row stays finite)."""
    total = g.op("Gather", g.op("Shape", "attention_mask"), "one", axis=0)
    seq = g.op("Gather", g.op("Shape", "input_ids"), "one", axis=0)
    keys = g.op("Range", "zero_s", total, "one_s")
    queries = g.op("Range", g.op("Sub", total, seq), total, "one_s")
    causal = g.op("LessOrEqual", g.op("Unsqueeze", keys, "zero"),
                  g.op("Unsqueeze", queries, "one"))                       # [S, T]
    real = g.op("Equal", g.op("Unsqueeze", "attention_mask", "axes_123"), "one_s")  # [B,1,1,1,T]
    allowed = g.op("And", real, causal)
    return g.op("Where", allowed, "zero_f", "mask_min")


def _layer(g: _Graph, cfg: LlamaConfig, i: int, x: str, w: dict[str, np.ndarray],
           cos: str, sin: str, mask: str) -> str:
    hd, gq = cfg.head_dim, cfg.group
    p = f"blk.{i}."

    def linear(h: str, name: str) -> str:
        return g.op("MatMul", h, g.const(p + name, w[p + name].T))

    h = _rms_norm(g, x, g.const(p + "attn_norm.weight", w[p + "attn_norm.weight"]), cfg.rms_eps)
    q = g.op("Reshape", linear(h, "attn_q.weight"), g.ints(p + "q_shape", [0, 0, cfg.heads, hd]))
    k = g.op("Reshape", linear(h, "attn_k.weight"), g.ints(p + "k_shape", [0, 0, cfg.kv_heads, hd]))
    v = g.op("Reshape", linear(h, "attn_v.weight"), g.ints(p + "v_shape", [0, 0, cfg.kv_heads, hd]))
    q = g.op("Reshape", _rotate(g, q, cos, sin),
             g.ints(p + "q5_shape", [0, 0, cfg.kv_heads, gq, hd]))        # [B, S, G, R, D]
    k = g.op("Transpose", _rotate(g, k, cos, sin), perm=[1, 0, 2, 3])      # [S, B, G, D]
    v = g.op("Transpose", v, perm=[1, 0, 2, 3])
    keys = g.op("Concat", f"past_key_values.{i}.key", k, axis=0, out=f"present.{i}.key")
    values = g.op("Concat", f"past_key_values.{i}.value", v, axis=0, out=f"present.{i}.value")
    scores = g.op("Einsum", q, keys, equation="bsgrd,tbgd->bgrst")
    scores = g.op("Add", g.op("Mul", scores, "attn_scale"), mask)
    probs = g.op("Softmax", scores, axis=-1)
    ctx = g.op("Einsum", probs, values, equation="bgrst,tbgd->bsgrd")
    ctx = g.op("Reshape", ctx, g.ints(p + "ctx_shape", [0, 0, cfg.hidden]))
    x = g.op("Add", x, linear(ctx, "attn_output.weight"))
    h = _rms_norm(g, x, g.const(p + "ffn_norm.weight", w[p + "ffn_norm.weight"]), cfg.rms_eps)
    gate = linear(h, "ffn_gate.weight")
    up = linear(h, "ffn_up.weight")
    act = g.op("Mul", g.op("Mul", gate, g.op("Sigmoid", gate)), up)          # SiLU(gate)·up
    return g.op("Add", x, linear(act, "ffn_down.weight"))


def llama_onnx(cfg: LlamaConfig, weights: dict[str, np.ndarray], name: str) -> onnx.ModelProto:
    """The decoder as an ONNX model (see the module docstring for its inputs and outputs).

    Parameters
    ----------
    cfg : LlamaConfig
    weights : dict of str to numpy.ndarray
        float32 tensors under their GGUF names (``token_embd.weight`` ``[V, hidden]``,
        ``blk.{i}.attn_q.weight`` ``[out, in]`` in Hugging Face's row order, i.e. with
        llama.cpp's RoPE permutation of Q and K undone, norms ``[hidden]``,
        ``output_norm.weight``; ``output.weight`` when the LM head is not tied).
    name : str
        The graph's name.
    """
    g = _Graph()
    cos_t, sin_t = _rope_tables(cfg)
    g.const("rope_cos", cos_t)
    g.const("rope_sin", sin_t)
    g.ints("zero", [0])
    g.ints("one", [1])
    g.ints("half", [cfg.head_dim // 2])
    g.ints("int_max", [np.iinfo(np.int64).max])
    g.ints("minus1", [-1])
    g.ints("axes_123", [1, 2, 3])
    g.ints("axis2", [2])
    g.const("zero_s", np.array(0, np.int64))
    g.const("one_s", np.array(1, np.int64))
    g.const("zero_f", np.array(0, np.float32))
    g.const("mask_min", np.array(np.finfo(np.float32).min, np.float32))
    g.const("rms_eps", np.array(cfg.rms_eps, np.float32))
    g.const("attn_scale", np.array(1.0 / np.sqrt(cfg.head_dim), np.float32))
    embed = g.const("token_embd.weight", weights["token_embd.weight"])
    x = g.op("Gather", embed, "input_ids", axis=0)                           # [B, S, hidden]
    cos = g.op("Unsqueeze", g.op("Gather", "rope_cos", "position_ids", axis=0), "axis2")
    sin = g.op("Unsqueeze", g.op("Gather", "rope_sin", "position_ids", axis=0), "axis2")
    mask = _attention_mask(g)
    for i in range(cfg.layers):
        x = _layer(g, cfg, i, x, weights, cos, sin, mask)
    x = _rms_norm(g, x, g.const("output_norm.weight", weights["output_norm.weight"]),
                  cfg.rms_eps)
    head = weights.get("output.weight", weights["token_embd.weight"])
    g.op("MatMul", x, g.const("lm_head", head.T), out="logits")
    return onnx.helper.make_model(
        helper.make_graph(g.nodes, name, _inputs(cfg), _outputs(cfg), g.inits),
        opset_imports=[helper.make_opsetid("", OPSET)], producer_name="kiln", ir_version=8)


def _inputs(cfg: LlamaConfig) -> list[onnx.ValueInfoProto]:
    cache = ["past", "batch", cfg.kv_heads, cfg.head_dim]
    vi = helper.make_tensor_value_info
    out = [vi("input_ids", TensorProto.INT64, ["batch", "sequence"]),
           vi("attention_mask", TensorProto.INT64, ["batch", "total"]),
           vi("position_ids", TensorProto.INT64, ["batch", "sequence"])]
    for i in range(cfg.layers):
        out += [vi(f"past_key_values.{i}.{kv}", TensorProto.FLOAT, cache) for kv in KV]
    return out


def _outputs(cfg: LlamaConfig) -> list[onnx.ValueInfoProto]:
    cache = ["total", "batch", cfg.kv_heads, cfg.head_dim]
    vi = helper.make_tensor_value_info
    out = [vi("logits", TensorProto.FLOAT, ["batch", "sequence", cfg.vocab])]
    for i in range(cfg.layers):
        out += [vi(f"present.{i}.{kv}", TensorProto.FLOAT, cache) for kv in KV]
    return out


KV = ("key", "value")
