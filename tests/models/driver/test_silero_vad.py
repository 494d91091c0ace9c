"""silero VAD (``silero-vad==6.2.3``): one VM artifact for both sampling rates. ``If`` on the
int64 input ``sr`` picks the 16 kHz or the 8 kHz network at run time, the LSTM state goes
from call to call, and the chunk length is symbolic (512 samples at 16 kHz, 256 at 8 kHz).

The model's unnamed dims are named through ``shape=`` (the batch of ``input`` and of ``state``
is one symbol) and the chunk length is declared 256..512 in steps of 256, which decides the
exporter's ``squeeze(-1)`` guards; the one combination the model cannot run (512 samples at
8 kHz, which onnxruntime rejects as well) is a run-time error naming the If."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import kiln
from kiln.errors import ShapeError
from kiln.frontend import from_onnx
from kiln.vm import VirtualMachine

SHAPE = {"input": ("batch", "samples"), "state": (2, "batch", 128)}
BOUNDS = {"samples": (256, 512, 256)}
CHUNKS = 12


def _speech_like(sr: int, n: int, chunks: int) -> np.ndarray:
    """A voiced signal (a 140 Hz glottal pulse train through two formants, syllable-rate
    envelope) after a stretch of low noise: the probability rises from near 0."""
    rng = np.random.default_rng(sr)
    t = np.arange(n * chunks) / sr
    voiced = sum(np.sin(2 * np.pi * k * 140 * t) / k for k in range(1, 30))
    envelope = np.clip(np.sin(2 * np.pi * 4 * t), 0, None) * (t > t[-1] / 3)
    x = 0.3 * voiced * envelope + 0.003 * rng.standard_normal(t.size)
    return x.astype(np.float32).reshape(chunks, 1, n)


@pytest.fixture(scope="module")
def silero(wheel_file, tmp_path_factory):
    path = wheel_file("silero_vad")
    mod, params = from_onnx(onnx.load(path), shape=SHAPE, dim_bounds=BOUNDS)
    exe = kiln.build(mod, target="llvm -mcpu=native", params=params)
    out = tmp_path_factory.mktemp("silero") / "silero_vad.so"
    exe.export_library(str(out))
    return path, VirtualMachine(kiln.runtime.load_module(str(out)), kiln.cpu())


@pytest.mark.parametrize("sr,n", [(16000, 512), (8000, 256)])
def test_streaming_matches_onnxruntime(silero, sr, n):
    ort = pytest.importorskip("onnxruntime")
    path, vm = silero
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    rate = np.array(sr, np.int64)
    state_ref = state = np.zeros((2, 1, 128), np.float32)
    probs, probs_ref = [], []
    for chunk in _speech_like(sr, n, CHUNKS):
        p_ref, state_ref = sess.run(None, {"input": chunk, "state": state_ref, "sr": rate})
        p, state = (o.numpy() for o in vm["main"](chunk, state, rate))
        np.testing.assert_allclose(p, p_ref, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(state, state_ref, rtol=1e-4, atol=1e-4)
        probs.append(float(p[0, 0]))
        probs_ref.append(float(p_ref[0, 0]))
    assert max(probs_ref) > 10 * min(probs_ref)  # the voiced part raises the probability


def test_wrong_chunk_for_rate_is_an_error(silero):
    _, vm = silero
    with pytest.raises(ShapeError, match="decoder/If.*cannot run at these shapes"):
        vm["main"](np.zeros((1, 512), np.float32), np.zeros((2, 1, 128), np.float32),
                   np.array(8000, np.int64))


def test_chunk_outside_declared_lengths_is_an_error(silero):
    _, vm = silero
    with pytest.raises(ShapeError, match="samples"):
        vm["main"](np.zeros((1, 300), np.float32), np.zeros((2, 1, 128), np.float32),
                   np.array(16000, np.int64))


def test_cli_names_the_shared_batch_and_runs_both_rates(wheel_file, tmp_path):
    """``--input-shape`` with symbol names, ``--dim`` on one of them, ``kiln run`` at both
    rates, and exit code 2 with the If named for the combination the model cannot run."""
    from model_helpers import kiln_cli

    so = tmp_path / "vad.so"
    proc = kiln_cli("compile", str(wheel_file("silero_vad")), "-o", str(so), "--input-shape",
                    "input:batchxsamples", "--input-shape", "state:2xbatchx128", "--dim",
                    "samples=256..512:256", "--quiet")
    assert "samples in [256, 512] divisible by 256" in proc.stdout
    for sr, n, ok in ((16000, 512, True), (8000, 256, True), (8000, 512, False)):
        np.savez(tmp_path / "in.npz", input=np.zeros((1, n), np.float32),
                 state=np.zeros((2, 1, 128), np.float32), sr=np.array(sr, np.int64))
        proc = kiln_cli("run", str(so), "--inputs", str(tmp_path / "in.npz"), check=ok)
        if ok:
            assert "output stateN: shape (2, 1, 128) float32" in proc.stdout
        else:
            assert proc.returncode == 2 and "decoder/If" in proc.stderr


@pytest.fixture(scope="module")
def silero_assumed(wheel_file, tmp_path_factory):
    """The model compiled with no names and no bounds: the importer assumes the two unnamed
    batch dims are one (the LSTM adds the input's gates to the state's), and the chunk
    length stays unbounded (the squeeze guards are run-time Ifs)."""
    path = wheel_file("silero_vad")
    mod, params = from_onnx(onnx.load(path))
    assert [a.relation() for a in mod["main"].attrs["assumptions"]] == [
        "input_dim0 == state_dim1"]
    exe = kiln.build(mod, params=params)
    out = tmp_path_factory.mktemp("silero-assumed") / "silero_vad.so"
    exe.export_library(str(out))
    return path, VirtualMachine(kiln.runtime.load_module(str(out)), kiln.cpu())


@pytest.mark.parametrize("sr,n", [(16000, 512), (8000, 256)])
def test_no_declaration_streams_like_onnxruntime(silero_assumed, sr, n):
    ort = pytest.importorskip("onnxruntime")
    path, vm = silero_assumed
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    rate = np.array(sr, np.int64)
    state_ref = state = np.zeros((2, 1, 128), np.float32)
    for chunk in _speech_like(sr, n, CHUNKS):
        p_ref, state_ref = sess.run(None, {"input": chunk, "state": state_ref, "sr": rate})
        p, state = (o.numpy() for o in vm["main"](chunk, state, rate))
        np.testing.assert_allclose(p, p_ref, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(state, state_ref, rtol=1e-4, atol=1e-4)


def test_no_declaration_batches_that_differ_are_an_error(silero_assumed):
    _, vm = silero_assumed
    with pytest.raises(ShapeError, match=r"input 'state' dim 1: symbol input_dim0 is 2"):
        vm["main"](np.zeros((2, 512), np.float32), np.zeros((2, 3, 128), np.float32),
                   np.array(16000, np.int64))
    with pytest.raises(ShapeError, match="decoder/If.*cannot run at these shapes"):
        vm["main"](np.zeros((1, 512), np.float32), np.zeros((2, 1, 128), np.float32),
                   np.array(8000, np.int64))
