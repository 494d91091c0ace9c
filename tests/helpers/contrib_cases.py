"""Single-op models of onnxruntime's ``com.microsoft`` contrib ops, with inputs, for checking
Kiln against onnxruntime (tests/backend/frontend/test_contrib_ops.py and the table
``conformance/contrib.py`` writes).

Each case builds one node of the op (or a model onnxruntime's own quantizer wrote) with random
weights and real-valued inputs, and says how closely Kiln must match: ``rtol`` on float
outputs (the project's model tolerance, max abs error <= rtol * max|reference| + 1e-5), or
``steps`` for quantized outputs (at most that many quantization steps apart: onnxruntime's
QLinear kernels round through lookup tables and fixed-point multipliers, Kiln through float).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
import onnx
from onnx import helper, numpy_helper

MS = "com.microsoft"

@dataclasses.dataclass
class Case:
    name: str
    build: Callable[[], tuple[onnx.ModelProto, dict[str, np.ndarray]]]
    rtol: float = 1e-4
    #: quantized outputs: the most quantization steps Kiln may differ by
    steps: int = 0
    #: onnxruntime multiplies uint8 activations by int8 weights with MLAS's U8S8 kernels, whose
    #: pair sums saturate on x86 without VNNI (:func:`onnxruntime_saturates_u8s8`)
    u8s8: bool = False


def onnxruntime_saturates_u8s8() -> bool:
    """Whether onnxruntime's uint8 × int8 products saturate on this CPU: MLAS's x86 U8S8
    kernels sum each pair of products into int16 with saturation (``vpmaddubsw``) unless the
    CPU has VNNI (``vpdpbusd``: AVX-512 VNNI or AVX-VNNI) or AMX; there Kiln's exact default
    differs from onnxruntime, and its ``int8_products="saturate"`` mode equals it
    (docs/int8.md)."""
    import platform

    from kiln.runtime.cpu_features import host_cpuinfo_flags

    if platform.machine() not in ("x86_64", "AMD64"):
        return False
    flags = host_cpuinfo_flags() or set()
    return not flags & {"avx512_vnni", "avx_vnni", "amx_int8"}


def kiln_build_options(case: Case) -> dict:
    """The ``kiln.build`` options under which Kiln's arithmetic is onnxruntime's for ``case``
    on this CPU: the host's own target and ``int8_products="saturate"`` for a U8S8 case where
    onnxruntime saturates (the mode's products need AVX2), else none."""
    if case.u8s8 and onnxruntime_saturates_u8s8():
        return {"target": "llvm -mcpu=native", "int8_products": "saturate"}
    return {}

def model(nodes, inputs: dict[str, np.ndarray], inits: dict[str, np.ndarray],
          outputs: list[str], opset: int = 17) -> onnx.ModelProto:
    """A model of ``nodes`` whose graph inputs take the dtypes and shapes of ``inputs``."""
    graph = helper.make_graph(
        nodes, "contrib",
        [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
         for k, v in inputs.items()],
        [helper.make_empty_tensor_value_info(o) for o in outputs],
        [numpy_helper.from_array(v, k) for k, v in inits.items()])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset),
                                                helper.make_opsetid(MS, 1)])
    m.ir_version = 8
    return m

def _rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)

def _f32(rng, *shape, scale=1.0) -> np.ndarray:
    return (rng.standard_normal(shape) * scale).astype(np.float32)

def _unary(op: str, seed: int, **attrs):
    def build():
        rng = _rng(seed)
        x = _f32(rng, 2, 5, 33, scale=2.0)
        bias = _f32(rng, 33)
        ins = ["x", "bias"] if op in ("FastGelu", "BiasGelu") else ["x"]
        node = helper.make_node(op, ins, ["y"], domain=MS, **attrs)
        return model([node], {"x": x}, {"bias": bias} if len(ins) > 1 else {}, ["y"]), {"x": x}
    return build

def fused_matmul():
    rng = _rng(1)
    a, b = _f32(rng, 2, 3, 7, 5), _f32(rng, 2, 3, 9, 7)
    node = helper.make_node("FusedMatMul", ["a", "b"], ["y"], domain=MS, alpha=0.5, transA=1,
                            transB=1)
    return model([node], {"a": a, "b": b}, {}, ["y"]), {"a": a, "b": b}

def skip_layer_norm():
    rng = _rng(2)
    x, skip = _f32(rng, 2, 7, 48), _f32(rng, 2, 7, 48)
    inits = {"gamma": _f32(rng, 48), "beta": _f32(rng, 48), "bias": _f32(rng, 48)}
    node = helper.make_node("SkipLayerNormalization", ["x", "skip", "gamma", "beta", "bias"],
                            ["y", "mean", "inv_std", "sum"], domain=MS, epsilon=1e-5)
    return model([node], {"x": x, "skip": skip}, inits, ["y", "sum"]), {"x": x, "skip": skip}

def skip_simplified_layer_norm():
    rng = _rng(3)
    x, skip = _f32(rng, 2, 7, 48), _f32(rng, 2, 7, 48)
    node = helper.make_node("SkipSimplifiedLayerNormalization", ["x", "skip", "gamma"],
                            ["y", "", "", "sum"], domain=MS, epsilon=1e-6)
    return (model([node], {"x": x, "skip": skip}, {"gamma": _f32(rng, 48)}, ["y", "sum"]),
            {"x": x, "skip": skip})

def embed_layer_norm():
    rng = _rng(4)
    batch, seq, hidden = 2, 9, 32
    ids = rng.integers(0, 50, (batch, seq)).astype(np.int32)
    segments = rng.integers(0, 2, (batch, seq)).astype(np.int32)
    mask = np.ones((batch, seq), np.int32)
    mask[1, 6:] = 0
    inits = {"word": _f32(rng, 50, hidden), "position": _f32(rng, 16, hidden),
             "segment": _f32(rng, 2, hidden), "gamma": _f32(rng, hidden),
             "beta": _f32(rng, hidden)}
    node = helper.make_node(
        "EmbedLayerNormalization",
        ["ids", "segments", "word", "position", "segment", "gamma", "beta", "mask"],
        ["y", "mask_index"], domain=MS, epsilon=1e-12)
    feeds = {"ids": ids, "segments": segments, "mask": mask}
    return model([node], feeds, inits, ["y", "mask_index"]), feeds

def _attention(seed: int, mask_rank: int, unidirectional: int):
    def build():
        rng = _rng(seed)
        batch, seq, hidden, heads = 2, 7, 32, 4
        x = _f32(rng, batch, seq, hidden)
        inits = {"w": _f32(rng, hidden, 3 * hidden, scale=0.2), "b": _f32(rng, 3 * hidden)}
        ins, feeds = ["x", "w", "b"], {"x": x}
        if mask_rank == 2:
            mask = np.ones((batch, seq), np.int32)
            mask[0, 5:] = 0
            ins.append("mask")
            feeds["mask"] = mask
        elif mask_rank == 1:
            ins.append("mask")
            feeds["mask"] = np.array([seq, 4], np.int32)
        node = helper.make_node("Attention", ins, ["y"], domain=MS, num_heads=heads,
                                unidirectional=unidirectional)
        return model([node], feeds, inits, ["y"]), feeds
    return build

def _qlinear_inputs(rng, shape, scale, zero):
    q = rng.integers(0, 256, shape).astype(np.uint8)
    return q, np.array(scale, np.float32), np.array(zero, np.uint8)

def _qlinear_binary(op: str):
    def build():
        rng = _rng(5)
        a, sa, za = _qlinear_inputs(rng, (2, 8, 5, 5), 0.05, 120)
        b, sb, zb = _qlinear_inputs(rng, (2, 8, 5, 5), 0.03, 130)
        inits = {"sa": sa, "za": za, "sb": sb, "zb": zb, "sc": np.array(
            0.07 if op == "QLinearAdd" else 0.1, np.float32), "zc": np.array(128, np.uint8)}
        node = helper.make_node(op, ["a", "sa", "za", "b", "sb", "zb", "sc", "zc"], ["c"],
                                domain=MS)
        return model([node], {"a": a, "b": b}, inits, ["c"]), {"a": a, "b": b}
    return build

def _qlinear_unary(op: str, **attrs):
    def build():
        rng = _rng(6)
        x, sx, zx = _qlinear_inputs(rng, (2, 8, 5, 5), 0.04, 128)
        inits = {"sx": sx, "zx": zx, "sy": np.array(0.004 if op == "QLinearSigmoid" else 0.03,
                                                    np.float32),
                 "zy": np.array(0 if op == "QLinearSigmoid" else 100, np.uint8)}
        node = helper.make_node(op, ["x", "sx", "zx", "sy", "zy"], ["y"], domain=MS, **attrs)
        return model([node], {"x": x}, inits, ["y"]), {"x": x}
    return build

def qlinear_concat():
    rng = _rng(7)
    a, sa, za = _qlinear_inputs(rng, (2, 3, 4), 0.05, 120)
    b, sb, zb = _qlinear_inputs(rng, (2, 5, 4), 0.02, 128)
    inits = {"sy": np.array(0.06, np.float32), "zy": np.array(125, np.uint8), "sa": sa,
             "za": za, "sb": sb, "zb": zb}
    node = helper.make_node("QLinearConcat", ["sy", "zy", "a", "sa", "za", "b", "sb", "zb"],
                            ["y"], domain=MS, axis=1)
    return model([node], {"a": a, "b": b}, inits, ["y"]), {"a": a, "b": b}

def dynamic_quantize_matmul():
    rng = _rng(8)
    a = _f32(rng, 3, 5, 40)
    inits = {"w": rng.integers(-127, 128, (40, 24)).astype(np.int8),
             "sw": (rng.random(24) * 0.02 + 0.01).astype(np.float32),
             "zw": np.zeros(24, np.int8), "bias": _f32(rng, 24)}
    node = helper.make_node("DynamicQuantizeMatMul", ["a", "w", "sw", "zw", "bias"], ["y"],
                            domain=MS)
    return model([node], {"a": a}, inits, ["y"]), {"a": a}

def matmul_integer_to_float():
    rng = _rng(9)
    a = rng.integers(0, 256, (4, 6, 40)).astype(np.uint8)
    inits = {"w": rng.integers(-127, 128, (40, 24)).astype(np.int8),
             "sa": np.array(0.03, np.float32), "sw": np.array(0.02, np.float32),
             "za": np.array(130, np.uint8), "bias": _f32(rng, 24)}
    node = helper.make_node("MatMulIntegerToFloat", ["a", "w", "sa", "sw", "za", "", "bias"],
                            ["y"], domain=MS)
    return model([node], {"a": a}, inits, ["y"]), {"a": a}

def _matmul_nbits(bits: int, block: int, zero_points: str, accuracy_level: int = 0,
                  rows: tuple[int, ...] = (3,)):
    def build():
        rng = _rng(10 + bits + accuracy_level)
        k, n = 72, 20
        blocks = -(-k // block)
        blob = block * bits // 8
        a = _f32(rng, *rows, k)
        inits = {"b": rng.integers(0, 256, (n, blocks, blob)).astype(np.uint8),
                 "scales": (rng.random(n * blocks) * 0.1 + 0.01).astype(np.float32),
                 "bias": _f32(rng, n)}
        ins = ["a", "b", "scales"]
        if zero_points == "packed":
            inits["zp"] = rng.integers(0, 256, n * -(-blocks * bits // 8)).astype(np.uint8)
            ins.append("zp")
        elif zero_points == "float":
            inits["zp"] = (rng.random(n * blocks) * (1 << bits)).astype(np.float32)
            ins.append("zp")
        else:
            ins.append("")
        ins += ["", "bias"]
        node = helper.make_node("MatMulNBits", ins, ["y"], domain=MS, K=k, N=n, bits=bits,
                                block_size=block, accuracy_level=accuracy_level)
        return model([node], {"a": a}, inits, ["y"]), {"a": a}
    return build

def _float_lstm(rng, seq, batch, size, hidden, direction, states) -> onnx.ModelProto:
    dirs = 2 if direction == "bidirectional" else 1
    x = _f32(rng, seq, batch, size)
    inits = {"w": _f32(rng, dirs, 4 * hidden, size, scale=0.3),
             "r": _f32(rng, dirs, 4 * hidden, hidden, scale=0.3),
             "bias": _f32(rng, dirs, 8 * hidden, scale=0.1)}
    ins, feeds = ["x", "w", "r", "bias"], {"x": x}
    if states:  # and sequence_lens, all of the whole sequence
        inits["lens"] = np.full(batch, seq, np.int32)
        feeds["h0"] = _f32(rng, dirs, batch, hidden, scale=0.5)
        feeds["c0"] = _f32(rng, dirs, batch, hidden, scale=0.5)
        ins += ["lens", "h0", "c0"]
    node = helper.make_node("LSTM", ins, ["y", "y_h", "y_c"], hidden_size=hidden,
                            direction=direction)
    return model([node], feeds, inits, ["y", "y_h", "y_c"], opset=13), feeds

def _dynamic_quantize_lstm(seed: int, direction: str = "forward", states: bool = False,
                           per_channel: bool = False, batch: int = 1, hidden: int = 12):
    """What onnxruntime's ``quantize_dynamic`` writes for an LSTM (a DynamicQuantizeLSTM with
    int8 weights transposed to [D, in, 4H]; ``per_channel``: a scale per output column).
    onnxruntime splits a batch of 2-4 over its threads when hidden <= 256 (and any batch
    above 4), quantizing each share of ``h`` on its own, so its result depends on its thread
    count there; the cases stay where it does not (batch 1, or hidden > 256)."""
    def build():
        import tempfile
        from pathlib import Path

        from onnxruntime.quantization import QuantType, quantize_dynamic

        float_model, feeds = _float_lstm(_rng(seed), 6, batch, 16, hidden, direction, states)
        with tempfile.TemporaryDirectory() as tmp:
            src, dst = Path(tmp) / "lstm.onnx", Path(tmp) / "lstm.int8.onnx"
            onnx.save(float_model, src)
            quantize_dynamic(src, dst, weight_type=QuantType.QInt8, per_channel=per_channel,
                             op_types_to_quantize=["LSTM"])
            quantized = onnx.load(dst)
        ops = [(n.domain, n.op_type) for n in quantized.graph.node]
        assert (MS, "DynamicQuantizeLSTM") in ops, ops
        return quantized, feeds
    return build

CASES = [
    Case("Gelu", _unary("Gelu", 20)),
    Case("FastGelu", _unary("FastGelu", 21)),
    Case("BiasGelu", _unary("BiasGelu", 22)),
    Case("QuickGelu", _unary("QuickGelu", 23, alpha=1.702)),
    Case("FusedMatMul", fused_matmul),
    Case("SkipLayerNormalization", skip_layer_norm),
    Case("SkipSimplifiedLayerNormalization", skip_simplified_layer_norm),
    Case("EmbedLayerNormalization", embed_layer_norm),
    Case("Attention", _attention(30, 0, 0)),
    Case("Attention (2-D mask)", _attention(31, 2, 0)),
    Case("Attention (1-D mask)", _attention(32, 1, 0)),
    Case("Attention (unidirectional)", _attention(33, 0, 1)),
    Case("QLinearAdd", _qlinear_binary("QLinearAdd"), steps=1),
    Case("QLinearMul", _qlinear_binary("QLinearMul"), steps=1),
    Case("QLinearSigmoid", _qlinear_unary("QLinearSigmoid"), steps=1),
    Case("QLinearLeakyRelu", _qlinear_unary("QLinearLeakyRelu", alpha=0.1), steps=1),
    Case("QLinearGlobalAveragePool", _qlinear_unary("QLinearGlobalAveragePool"), steps=1),
    Case("QLinearConcat", qlinear_concat, steps=1),
    Case("DynamicQuantizeMatMul", dynamic_quantize_matmul, u8s8=True),
    Case("MatMulIntegerToFloat", matmul_integer_to_float, u8s8=True),
    Case("MatMulNBits (4 bits, packed zero points)", _matmul_nbits(4, 32, "packed")),
    Case("MatMulNBits (4 bits, symmetric)", _matmul_nbits(4, 16, "none")),
    Case("MatMulNBits (8 bits, packed zero points)", _matmul_nbits(8, 32, "packed")),
    Case("MatMulNBits (2 bits, float zero points)", _matmul_nbits(2, 16, "float")),
    # accuracy_level 4: onnxruntime quantizes A to int8 per block of K (a partial last block
    # of 72 = 2 x 32 + 8 included); 2 bits in blocks of 16 it computes in float
    Case("MatMulNBits (4 bits, int8 A, packed zero points)",
         _matmul_nbits(4, 32, "packed", accuracy_level=4)),
    Case("MatMulNBits (4 bits, int8 A, symmetric, 3-D A)",
         _matmul_nbits(4, 16, "none", accuracy_level=4, rows=(2, 3))),
    Case("MatMulNBits (8 bits, int8 A)", _matmul_nbits(8, 64, "packed", accuracy_level=4)),
    Case("MatMulNBits (2 bits, int8 A)", _matmul_nbits(2, 32, "packed", accuracy_level=4)),
    Case("MatMulNBits (2 bits in blocks of 16, accuracy_level 4: float A)",
         _matmul_nbits(2, 16, "float", accuracy_level=4)),
    Case("DynamicQuantizeLSTM", _dynamic_quantize_lstm(12), u8s8=True),
    Case("DynamicQuantizeLSTM (bidirectional, initial states)",
         _dynamic_quantize_lstm(13, "bidirectional", states=True), u8s8=True),
    Case("DynamicQuantizeLSTM (reverse, per-channel scales, batch 3)",
         _dynamic_quantize_lstm(14, "reverse", per_channel=True, batch=3, hidden=260),
         u8s8=True),
]

def compare(case: Case, got: list[np.ndarray], want: list[np.ndarray]) -> str | None:
    """None when ``got`` matches onnxruntime's ``want`` as ``case`` requires, else why not."""
    if len(got) != len(want):
        return f"{len(got)} outputs, onnxruntime has {len(want)}"
    for k, (g, w) in enumerate(zip(got, want)):
        if g.shape != w.shape or g.dtype != w.dtype:
            return f"output {k}: {g.dtype}{list(g.shape)} vs onnxruntime {w.dtype}{list(w.shape)}"
        if np.issubdtype(w.dtype, np.integer):
            diff = int(np.max(np.abs(g.astype(np.int64) - w.astype(np.int64)))) if w.size else 0
            if diff > case.steps:
                return f"output {k}: {diff} steps apart (at most {case.steps})"
            continue
        err = float(np.max(np.abs(g.astype(np.float64) - w))) if w.size else 0.0
        bound = case.rtol * float(np.max(np.abs(w))) + 1e-5 if w.size else 0.0
        if not err <= bound:
            return f"output {k}: max abs error {err:.3g} > {bound:.3g}"
    return None
