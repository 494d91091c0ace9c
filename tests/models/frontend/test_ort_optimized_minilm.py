"""paraphrase-MiniLM-L3-v2 as onnxruntime's transformers optimizer writes it: its layers fused
into the ``com.microsoft`` ops EmbedLayerNormalization, Attention, SkipLayerNormalization and
BiasGelu. Kiln compiles the optimized model at two shapes and matches onnxruntime on it."""

from __future__ import annotations

import collections

import numpy as np
import onnx
import pytest
from backend_helpers import compile_and_run, run_onnxruntime
from onnx import helper

FUSED = {"EmbedLayerNormalization", "Attention", "SkipLayerNormalization", "BiasGelu"}


@pytest.fixture(scope="module")
def optimized(wheel_file) -> onnx.ModelProto:
    optimizer = pytest.importorskip("onnxruntime.transformers.optimizer")
    model = optimizer.optimize_model(str(wheel_file("minilm_l3")), model_type="bert",
                                     num_heads=0, hidden_size=0, opt_level=0).model
    ops = collections.Counter(n.op_type for n in model.graph.node
                              if n.domain == "com.microsoft")
    assert FUSED <= set(ops), ops
    if not any(o.domain == "com.microsoft" for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    return model


@pytest.mark.parametrize("batch,seq", [(1, 7), (2, 33)])
def test_optimized_minilm_matches_onnxruntime(optimized, batch, seq, tmp_path):
    rng = np.random.default_rng(batch * 100 + seq)
    mask = np.ones((batch, seq), np.int64)
    mask[-1, seq // 2:] = 0  # one padded sentence: the Attention's key mask matters
    feeds = {"input_ids": rng.integers(0, 30000, (batch, seq)).astype(np.int64),
             "attention_mask": mask}
    got = compile_and_run(optimized, feeds, tmp_path, target="llvm")
    want = run_onnxruntime(optimized, feeds)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4 * float(np.max(np.abs(w))))


def test_optimized_minilm_with_no_flags_is_one_vm_artifact(optimized, tmp_path):
    """Symbolic (batch, sequence) with no declaration: the Attention body's 1-D mask path
    (an int32 Range over a symbolic length) and the fusion of its side inputs (sizes compared
    symbolically) compile into one VM library that runs every shape."""
    import kiln
    from kiln.frontend import from_onnx
    from kiln.vm import VirtualMachine

    mod, params = from_onnx(optimized)
    exe = kiln.build(mod, target="llvm", params=params)
    assert isinstance(exe, kiln.runtime.VMExecutable)
    exe.export_library(str(tmp_path / "minilm.so"))
    vm = VirtualMachine(kiln.runtime.load_module(str(tmp_path / "minilm.so")), kiln.cpu())
    for batch, seq in [(1, 7), (3, 40)]:
        rng = np.random.default_rng(seq)
        mask = np.ones((batch, seq), np.int64)
        mask[-1, seq // 2:] = 0
        feeds = {"input_ids": rng.integers(0, 30000, (batch, seq)).astype(np.int64),
                 "attention_mask": mask}
        got = [o.numpy() for o in vm["main"](*feeds.values())]
        for g, w in zip(got, run_onnxruntime(optimized, feeds), strict=True):
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4 * float(np.max(np.abs(w))))
