"""A small llama decoder (the graph of kiln.models.llama_onnx, random weights) compiled for
the VM: prefill and decode from one artifact, greedy tokens equal to onnxruntime's on c, llvm
and jit, a left-padded batch, and a short generation with the kernels on riscv64 RVV under
qemu-user."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from device_helpers import device_module, use_riscv_device, vector_ops

import kiln
from kiln.frontend import from_onnx
from kiln.llm import Decoder, generate, kiln_decoder, ort_decoder
from kiln.llm.decoder import DIM_BOUNDS, MASK_SHAPE
from kiln.llm.last_logits import last_position_logits
from kiln.models.llama_onnx import LlamaConfig, llama_onnx
from kiln.vm import VirtualMachine

CFG = LlamaConfig(layers=2, hidden=64, ffn=96, heads=4, kv_heads=2, vocab=101, context=256,
                  rope_base=1e4, rms_eps=1e-5)
PROMPTS = [[5, 17, 42, 7, 99, 3], [11, 12]]


def _weights(cfg: LlamaConfig, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)

    def w(*shape, scale=0.2):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    kv = cfg.kv_heads * cfg.head_dim
    out = {"token_embd.weight": w(cfg.vocab, cfg.hidden, scale=1.0),
           "output_norm.weight": 1 + w(cfg.hidden, scale=0.1)}
    for i in range(cfg.layers):
        p = f"blk.{i}."
        out.update({p + "attn_norm.weight": 1 + w(cfg.hidden, scale=0.1),
                    p + "ffn_norm.weight": 1 + w(cfg.hidden, scale=0.1),
                    p + "attn_q.weight": w(cfg.hidden, cfg.hidden),
                    p + "attn_k.weight": w(kv, cfg.hidden), p + "attn_v.weight": w(kv, cfg.hidden),
                    p + "attn_output.weight": w(cfg.hidden, cfg.hidden),
                    p + "ffn_gate.weight": w(cfg.ffn, cfg.hidden),
                    p + "ffn_up.weight": w(cfg.ffn, cfg.hidden),
                    p + "ffn_down.weight": w(cfg.hidden, cfg.ffn)})
    return out


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("llama") / "tiny_llama.onnx"
    onnx.save(llama_onnx(CFG, _weights(CFG), "tiny_llama"), path)
    return path


def _kiln(path, target: str, tmp_path, loaded: list | None = None) -> Decoder:
    mod, params = from_onnx(onnx.load(path), shape={"attention_mask": MASK_SHAPE},
                            dim_bounds=DIM_BOUNDS)
    so = tmp_path / f"tiny_{target.split()[0]}.so"
    kiln.build(mod, target=target, params=params).export_library(str(so))
    lib = kiln.runtime.load_module(str(so))
    if loaded is not None:
        loaded.append(lib)
    vm = VirtualMachine(lib, kiln.cpu())
    names = ["input_ids", "attention_mask", "position_ids"] + [
        f"past_key_values.{i}.{kv}" for i in range(CFG.layers) for kv in ("key", "value")]
    return Decoder(lambda inputs: vm["main"](*inputs), names, (CFG.kv_heads, CFG.head_dim),
                   "kiln", vm)


@pytest.mark.parametrize("target", ["c", "llvm", "jit"])
def test_tiny_llama_greedy_tokens_equal_onnxruntime(tiny, target, tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "cache"))
    ours, ref = _kiln(tiny, target, tmp_path), ort_decoder(tiny)
    for prompt in PROMPTS:
        a = generate(ours, [prompt], max_new_tokens=8)
        assert a.tokens == generate(ref, [prompt], max_new_tokens=8).tokens
    batch = generate(ours, PROMPTS, max_new_tokens=8)
    assert batch.tokens == [generate(ours, [p], max_new_tokens=8).tokens[0] for p in PROMPTS]


def test_tiny_llama_logits_and_cache_match_onnxruntime(tiny, tmp_path):
    ours, ref = _kiln(tiny, "llvm", tmp_path), ort_decoder(tiny)
    ids, mask, pos = (np.array([PROMPTS[0]]), np.ones((1, 6), np.int64), np.arange(6)[None])
    pa, pb = ours.empty_cache(1), ref.empty_cache(1)
    for step in range(3):
        la, pa = ours(ids, mask, pos, pa)
        lb, pb = ref(ids, mask, pos, pb)
        np.testing.assert_allclose(la, lb, rtol=1e-4, atol=1e-4)
        for x, y in zip(pa, pb):
            assert np.asarray(x).shape == y.shape == (6 + step, 1, CFG.kv_heads, CFG.head_dim)
            np.testing.assert_allclose(np.asarray(x), y, rtol=1e-4, atol=1e-5)
        ids = la[:, -1:].argmax(-1)
        mask = np.ones((1, mask.shape[1] + 1), np.int64)
        pos = pos[:, -1:] + 1


def test_last_logits_decoder_runs_the_head_on_the_last_position_only(tiny, tmp_path,
                                                                      monkeypatch):
    """``kiln_decoder(last_logits=True)`` (what ``kiln serve`` and ``kiln demo chat`` use): the
    LM head runs on ``hidden[:, -1:]``, so a prompt's logits are ``[batch, 1, vocab]``, equal to
    onnxruntime's last row, the cache and the decode steps unchanged; a left-padded batch
    generates the tokens of the decoder with every position's logits."""
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "cache"))
    ours, ref = kiln_decoder(tiny, "llvm", last_logits=True), ort_decoder(tiny)
    ids, mask, pos = (np.array([PROMPTS[0]]), np.ones((1, 6), np.int64), np.arange(6)[None])
    pa, pb = ours.empty_cache(1), ref.empty_cache(1)
    for _ in range(3):
        la, pa = ours(ids, mask, pos, pa)
        lb, pb = ref(ids, mask, pos, pb)
        assert la.shape == (1, 1, CFG.vocab)
        np.testing.assert_allclose(la, lb[:, -1:], rtol=1e-4, atol=1e-4)
        for x, y in zip(pa, pb):
            np.testing.assert_allclose(np.asarray(x), y, rtol=1e-4, atol=1e-5)
        ids = la[:, -1:].argmax(-1)
        mask = np.ones((1, mask.shape[1] + 1), np.int64)
        pos = pos[:, -1:] + 1
    assert generate(ours, PROMPTS, max_new_tokens=6).tokens == \
        generate(ref, PROMPTS, max_new_tokens=6).tokens


def test_last_position_logits_keeps_a_head_it_cannot_slice(tiny):
    """A decoder whose logits are not ``MatMul(hidden, W)`` (here a bias after the head) is
    returned as it is: every position's logits, still right."""
    model = onnx.load(tiny)
    head = next(n for n in model.graph.node if "logits" in n.output)
    head.output[0] = "head"
    model.graph.initializer.append(onnx.numpy_helper.from_array(
        np.zeros(CFG.vocab, np.float32), "bias"))
    model.graph.node.append(onnx.helper.make_node("Add", ["head", "bias"], ["logits"]))
    assert last_position_logits(model) is model
    sliced = last_position_logits(onnx.load(tiny))
    assert [n.op_type for n in sliced.graph.node][-2:] == ["Slice", "MatMul"]
    assert sliced.graph.output[0].type.tensor_type.shape.dim[1].dim_value == 1


def test_tiny_llama_decode_steps_are_replayed(tiny, tmp_path):
    """Issue 31: the prefill is interpreted once while it is traced; every decode step after it
    replays that trace (kernel calls batched in C) instead of interpreting ~100 instructions in
    Python. The mask's length check (a match_cast of an input) still runs on replayed calls."""
    ours = _kiln(tiny, "llvm", tmp_path)
    n = 12
    got = generate(ours, [PROMPTS[0]], max_new_tokens=n)
    assert got.tokens == generate(ort_decoder(tiny), [PROMPTS[0]], max_new_tokens=n).tokens
    stats = ours.vm.replay_stats()
    assert stats["calls"] == n, stats  # the prefill, then one call per token after the first
    assert stats["interpreted"] == stats["recordings"] == 1, stats
    assert stats["replays"] == n - 1, stats
    ids, pos = np.array([[7]]), np.array([[6]])
    past = ours.empty_cache(1)
    past = [np.zeros((6, *p.shape[1:]), np.float32) for p in past]
    with pytest.raises(kiln.errors.ShapeError, match="attention_mask.*past"):
        ours(ids, np.ones((1, 6), np.int64), pos, past)  # one short of past + sequence
    assert ours.vm.replay_stats()["replays"] == n - 1


@pytest.mark.slow
def test_tiny_llama_generates_on_riscv64_rvv_under_qemu(tiny, tmp_path, monkeypatch):
    use_riscv_device(monkeypatch, tmp_path / "cache")
    loaded: list = []
    ours = _kiln(tiny, "jit", tmp_path, loaded)
    got = generate(ours, [PROMPTS[0]], max_new_tokens=3)
    assert got.tokens == generate(ort_decoder(tiny), [PROMPTS[0]], max_new_tokens=3).tokens
    assert any(op.startswith(("vfmacc", "vfmadd"))
               for op in vector_ops(device_module(loaded[0]).library_path))


def test_tiny_llama_compiles_from_the_command_line_with_a_mask_over_past_and_sequence(
        tiny, tmp_path):
    """``kiln compile --input-shape attention_mask:batchxpast+sequence``: the mask's length is
    the past plus the new tokens (else the attention's broadcast cannot be decided), checked at
    run time."""
    import subprocess
    import sys

    so = tmp_path / "tiny_cli.so"
    cli = "import sys; from kiln.cli.main import main; sys.exit(main())"
    proc = subprocess.run([sys.executable, "-c", cli, "compile", str(tiny), "--target", "llvm",
                           "-o", str(so), "-q", "--input-shape",
                           "attention_mask:batchxpast+sequence", "--dim", "past=0..4096"],
                          capture_output=True, text=True, check=False, timeout=600)
    assert proc.returncode == 0, proc.stderr
    vm = VirtualMachine(kiln.runtime.load_module(str(so)), kiln.cpu())
    ref = ort_decoder(tiny)
    ids = np.array([PROMPTS[0]])
    feeds = (ids, np.ones((1, 6), np.int64), np.arange(6)[None])
    got = vm["main"](*feeds, *ref.empty_cache(1))
    np.testing.assert_allclose(got[0].numpy(), ref(*feeds, ref.empty_cache(1))[0],
                               rtol=1e-4, atol=1e-4)
    with pytest.raises(kiln.errors.ShapeError, match="attention_mask.*past"):  # one short
        vm["main"](ids, np.ones((1, 5), np.int64), np.arange(6)[None], *ref.empty_cache(1))
    with pytest.raises(kiln.errors.ShapeError, match="attention_mask. dim 0"):  # same size
        vm["main"](ids, np.ones((2, 3), np.int64), np.arange(6)[None], *ref.empty_cache(1))
