"""Weight-only quantization (docs/decisions/018): the int8 and GGUF Q4_1 formats and their
packing, the QuantizeWeights pass, the ops' references, and the kernels on the loop-IR
interpreter (symbolic rows, both kernel versions)."""

from __future__ import annotations

import zlib

import numpy as np
import pytest
from test_symbolic_kernels import _interpret_versions

from kiln.arith import SymVar
from kiln.driver.build_module import optimize
from kiln.errors import CompileError, ShapeError
from kiln.relay.graph import Call, Constant, Function, TensorType, Var, post_order
from kiln.relay.interpreter import evaluate
from kiln.relay.op.nn import pack_dense_weight, unpack_dense_weight
from kiln.relay.op.weight_quant import (
    dense_q4_weight,
    dense_q8_weight,
    dequantize_q4_1,
    pack_nibble_words,
    pack_nibbles,
    quantize_int8,
    quantize_q4_1,
    unpack_nibble_words,
    unpack_nibbles,
)
from kiln.relay.transform.quantize_weights import quantize_weights

RNG = np.random.default_rng(18)


@pytest.fixture(autouse=True)
def _reseed(request):
    """Each test draws from its own seed, so its inputs do not depend on which tests ran before
    it on the same xdist worker."""
    global RNG
    RNG = np.random.default_rng(zlib.crc32(request.node.name.encode()))


def _weight(n: int, k: int) -> np.ndarray:
    return RNG.standard_normal((n, k)).astype(np.float32)


def test_int8_is_symmetric_per_output_channel():
    w = _weight(8, 96)
    w[3] = 0  # an all-zero channel keeps a finite scale
    q, scale = quantize_int8(w)
    assert q.dtype == np.int8 and scale.dtype == np.float32 and scale.shape == (8,)
    assert np.abs(q).max() == 127 and q.min() >= -127
    np.testing.assert_array_equal(np.abs(q).max(axis=1)[[0, 1, 2, 4]], 127)
    err = np.abs(q * scale[:, None] - w)
    assert np.all(err <= scale[:, None] / 2 * (1 + 1e-6))


def _ggml_quantize_row_q4_1(x: np.ndarray) -> list[tuple[float, float, list[int]]]:
    """llama.cpp's ``quantize_row_q4_1_ref`` (ggml/src/ggml-quants.c), block by block in
    float32 scalars: (d, min, q) before d and min are stored as float16."""
    out = []
    for block in x.reshape(-1, 32):
        lo, hi = np.float32(block.min()), np.float32(block.max())
        d = np.float32((hi - lo) / np.float32(15))
        inv = np.float32(1) / d if d else np.float32(0)
        q = [min(15, int(np.float32((v - lo) * inv) + np.float32(0.5))) for v in block]
        out.append((d, lo, q))
    return out


def test_q4_1_quantizes_as_ggml():
    w = _weight(4, 64)
    q, d, m = quantize_q4_1(w)
    assert q.dtype == np.uint8 and q.max() <= 15 and d.shape == m.shape == (4, 2)
    assert d.dtype == m.dtype == np.float16  # ggml's block_q4_1 storage
    for n in range(4):
        for b, (gd, gmin, gq) in enumerate(_ggml_quantize_row_q4_1(w[n])):
            assert list(q[n, 32 * b: 32 * b + 32]) == gq
            assert (d[n, b], m[n, b]) == (np.float16(gd), np.float16(gmin))
    # half a step, plus what rounding d and min to float16 moves (2^-11 relative each)
    d32 = np.repeat(d.astype(np.float32), 32, axis=1)
    m32 = np.repeat(m.astype(np.float32), 32, axis=1)
    bound = d32 / 2 + (15 * d32 + np.abs(m32)) * 2.0 ** -10
    assert np.all(np.abs(dequantize_q4_1(q, d, m) - w) <= bound)


def test_q4_1_rejects_weights_beyond_float16():
    w = _weight(2, 32)
    w[1, 3] = 7e4
    with pytest.raises(ShapeError, match="float16"):
        quantize_q4_1(w)


def _gguf_blocks(n: int, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Q4_1 blocks as a GGUF file holds them: float16 d and m, q spanning 0..15 per block."""
    q = RNG.integers(0, 16, (n, k // 32, 32), dtype=np.uint8)
    q[..., 0], q[..., 1] = 0, 15
    q = RNG.permuted(q, axis=2).reshape(n, k)
    d = RNG.uniform(1e-3, 0.05, (n, k // 32)).astype(np.float16)
    m = RNG.uniform(-0.5, 0.1, (n, k // 32)).astype(np.float16)
    return q, d, m


def test_q4_1_round_trips_gguf_blocks_exactly():
    """A weight dequantized from Q4_1 blocks (the model's GGUF file) quantizes back to the
    same q, d and m: the 4-bit blocks are kept as they are."""
    q, d, m = _gguf_blocks(24, 576)
    w = dequantize_q4_1(q, d, m)
    q2, d2, m2 = quantize_q4_1(w)
    np.testing.assert_array_equal(q2, q)
    np.testing.assert_array_equal(d2, d)
    np.testing.assert_array_equal(m2, m)
    np.testing.assert_array_equal(dequantize_q4_1(q2, d2, m2), w)


def test_q4_1_constant_block():
    w = np.full((2, 32), 0.25, np.float32)
    q, d, m = quantize_q4_1(w)
    assert not q.any() and not d.any()
    np.testing.assert_array_equal(dequantize_q4_1(q, d, m), w)


def test_q4_1_needs_whole_blocks():
    with pytest.raises(Exception, match="multiple of 32"):
        quantize_q4_1(_weight(2, 48))


@pytest.mark.parametrize("block", [4, 16])
def test_packing_round_trips(block):
    q = RNG.integers(0, 16, (32, 64), dtype=np.uint8)
    packed = pack_nibbles(q, block)
    assert packed.shape == (32 // block, 32, block) and packed.dtype == np.uint8
    assert packed[0, 0, 1] == q[1, 0] | (q[1, 1] << 4)  # k even low, k + 1 high nibble
    np.testing.assert_array_equal(unpack_nibbles(packed), q)
    q8, _ = quantize_int8(_weight(32, 64))
    np.testing.assert_array_equal(unpack_dense_weight(pack_dense_weight(q8, block)), q8)


@pytest.mark.parametrize("block", [4, 16])
def test_nibble_words_round_trip(block):
    q = RNG.integers(0, 16, (32, 64), dtype=np.uint8)
    packed = pack_nibble_words(q, block)
    assert packed.shape == (32 // block, 8, block) and packed.dtype == np.uint32
    # channel 1, k = 8..15: k % 8 in bits 4 (k % 8)
    assert packed[0, 1, 1] == sum(int(q[1, 8 + p]) << (4 * p) for p in range(8))
    np.testing.assert_array_equal(unpack_nibble_words(packed), q)


def _dense_model(n: int, k: int, rows=3, bias: bool = True) -> tuple[Function, np.ndarray]:
    w = _weight(n, k)
    x = Var("x", TensorType((rows, k), "float32"))
    out = Call("nn.dense", [x, Constant(w, "w")])
    if bias:
        out = Call("nn.bias_add", [out, Constant(RNG.standard_normal(n).astype(np.float32))],
                   {"axis": 1})
    return Function([x], [out]), w


def _ops(func: Function) -> list[str]:
    return [n.op.name for n in post_order(func.outputs) if isinstance(n, Call)]


@pytest.mark.parametrize("mode, op", [("int8", "nn.dense_q8"), ("q4", "nn.dense_q4")])
def test_pass_rewrites_large_constant_dense(mode, op):
    func, w = _dense_model(64, 128)
    out = quantize_weights(func, mode)
    assert _ops(out) == [op, "nn.bias_add"]
    dense = next(n for n in post_order(out.outputs) if isinstance(n, Call) and n.op.name == op)
    consts = [a.data for a in dense.args[1:]]
    weight = dense_q8_weight(*consts) if mode == "int8" else dense_q4_weight(*consts)
    x = RNG.standard_normal((3, 128)).astype(np.float32)
    want = evaluate(func, {"x": x})[0] - x @ w.T + x @ weight.T
    np.testing.assert_allclose(evaluate(out, {"x": x})[0], want, rtol=1e-5, atol=1e-5)
    # quantization error against the float weight: int8 ~1%, q4 ~10% of the output's range
    err = np.abs(evaluate(out, {"x": x})[0] - evaluate(func, {"x": x})[0]).max()
    assert err < (0.03 if mode == "int8" else 0.3) * np.abs(x @ w.T).max()


def test_pass_leaves_small_and_unblocked_weights_in_float():
    small, _ = _dense_model(32, 128)
    assert "nn.dense" in _ops(quantize_weights(small, "int8"))
    odd_k, _ = _dense_model(64, 80)
    assert "nn.dense" in _ops(quantize_weights(odd_k, "q4"))
    assert "nn.dense_q8" in _ops(quantize_weights(odd_k, "int8"))
    x = Var("x", TensorType((2, 64), "float32"))
    w = Var("w", TensorType((64, 64), "float32"))  # not a constant
    assert _ops(quantize_weights(Function([x, w], [Call("nn.dense", [x, w])]), "int8")) == \
        ["nn.dense"]


def test_pass_keeps_weights_beyond_float16_in_float_for_q4():
    """Q4_1's float16 d and m cannot hold 1e5: q4 leaves the weight float, int8 takes it."""
    w = _weight(64, 64)
    w[5, 7] = 1e5
    x = Var("x", TensorType((2, 64), "float32"))
    func = Function([x], [Call("nn.dense", [x, Constant(w, "w")])])
    assert _ops(quantize_weights(func, "q4")) == ["nn.dense"]
    assert _ops(quantize_weights(func, "int8")) == ["nn.dense_q8"]


def test_pass_rejects_unknown_modes():
    func, _ = _dense_model(64, 64)
    with pytest.raises(CompileError, match="int4"):
        quantize_weights(func, "int4")


def _interpret(func: Function, values: dict, mode: str) -> np.ndarray:
    """Every fused kernel of ``func`` (weights quantized) on the loop-IR interpreter, each with
    its version for extents below its blocks, as compiled kernels have it."""
    return _interpret_versions(func, values, quantize_weights=mode)


@pytest.mark.parametrize("mode", ["int8", "q4"])
@pytest.mark.parametrize("rows", [1, 7])
def test_kernels_over_symbolic_rows_match_the_references(mode, rows):
    func, _ = _dense_model(64, 64, rows=SymVar("M"))
    x = RNG.standard_normal((rows, 64)).astype(np.float32)
    want = evaluate(optimize(func, {}, quantize_weights=mode), {"x": x})[0]
    # The kernel sums in another order than the reference (q4: d·Σxq + m·Σx per block), so
    # they may differ by a few float32 ulps of the largest output (|y| ~ 30: 2e-6 an ulp).
    atol = 2e-6 * float(np.abs(want).max())
    np.testing.assert_allclose(_interpret(func, {"x": x}, mode), want, rtol=1e-5, atol=atol)
