"""The ``kiln`` command on a model with symbolic dims, end to end: paraphrase-MiniLM-L3
(``input_ids``/``attention_mask`` of ``[batch_size, sequence_length]``) compiled once to a VM
library, run at two shapes from .npz against onnxruntime, with random inputs and the profiler,
inspected, and the errors a user meets (a symbol with two values, the graph executor)."""

from __future__ import annotations

import subprocess

import numpy as np
import pytest
from model_helpers import assert_matches_reference, kiln_cli

pytestmark = pytest.mark.xdist_group("cli-minilm-vm")


@pytest.fixture(scope="module")
def minilm_vm(wheel_file, tmp_path_factory):
    """(model path, VM library path, `kiln compile`'s stdout)."""
    model = wheel_file("minilm_l3")
    so_path = tmp_path_factory.mktemp("cli-vm") / "minilm.so"
    proc = kiln_cli("compile", str(model), "-o", str(so_path), "--dim",
                    "sequence_length=1..512", "--quiet")
    return model, so_path, proc.stdout


def _tokens(batch: int, seq: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, 30522, (batch, seq)).astype(np.int64)
    mask = np.ones((batch, seq), np.int64)
    mask[0, seq // 2:] = 0  # padding in the first row: the mask matters
    return {"input_ids": ids, "attention_mask": mask}


def test_compile_says_vm(minilm_vm):
    _, so_path, out = minilm_vm
    assert "batch_size in [1, inf], sequence_length in [1, 512]" in out
    assert "compiling for the VM executor" in out and "VM executor" in out.splitlines()[-1]
    assert so_path.exists()


@pytest.mark.parametrize(("batch", "seq"), [(1, 7), (3, 40)])
def test_run_npz_at_two_shapes_matches_onnxruntime(minilm_vm, reference, tmp_path, batch, seq):
    model, so_path, _ = minilm_vm
    feed = _tokens(batch, seq, seed=seq)
    np.savez(tmp_path / "in.npz", **feed)
    proc = kiln_cli("run", str(so_path), "--inputs", str(tmp_path / "in.npz"),
                    "--outputs", str(tmp_path / "out.npz"))
    assert f"input input_ids: shape ({batch}, {seq}) int64" in proc.stdout
    want = reference(model, feed)
    with np.load(tmp_path / "out.npz") as data:
        assert list(data.files) == ["output", "463", "onnx::Shape_422", "461"]
        got = [data[k] for k in data.files]
    assert_matches_reference(got, want)


def test_run_random_inputs_with_profile(minilm_vm):
    _, so_path, _ = minilm_vm
    out = kiln_cli("run", str(so_path), "--input-shape", "input_ids:2x9", "--profile",
                   "--repeat", "2").stdout
    assert "input attention_mask: shape (2, 9) int64" in out  # sized by input_ids' symbols
    assert "output 461: shape (2, 384) float32" in out
    assert "fused_nn_dense_pack" in out and "VM overhead" in out
    out = kiln_cli("run", str(so_path), "--repeat", "2").stdout
    assert "batch_size=1, sequence_length=1" in out and "run ×2: median" in out


def test_inspect(minilm_vm):
    _, so_path, _ = minilm_vm
    out = kiln_cli("inspect", str(so_path), "--bytecode").stdout
    assert "relax.VMExecutable" in out and "executor: VM (1 VM function" in out
    assert "sequence_length in [1, 512]" in out and "batch_size in [1, inf]" in out
    assert "main(input_ids: int64[batch_size, sequence_length], attention_mask: " \
           "int64[batch_size, sequence_length]) -> (" in out
    assert "461: [batch_size, 384] float32" in out and "constants: " in out
    assert "vm main(" in out  # the bytecode


def _one_error_line(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("kiln: error: ") and proc.stderr.count("\n") == 1, proc.stderr
    return proc.stderr


def test_run_rejects_conflicting_symbol(minilm_vm, tmp_path):
    _, so_path, _ = minilm_vm
    np.savez(tmp_path / "bad.npz", input_ids=np.ones((1, 10), np.int64),
             attention_mask=np.ones((1, 12), np.int64))
    err = _one_error_line(kiln_cli("run", str(so_path), "--inputs", str(tmp_path / "bad.npz"),
                                   check=False))
    assert "'attention_mask' dim 1" in err and "sequence_length" in err and "12" in err
    err = _one_error_line(kiln_cli("run", str(so_path), "--input-shape", "input_ids:1x600",
                                   check=False))
    assert "input_ids:1x600: dim 1: symbol sequence_length = 600 is outside " \
           "sequence_length in [1, 512]" in err


def test_compile_graph_executor_needs_static_shapes(minilm_vm, tmp_path):
    model, _, _ = minilm_vm
    err = _one_error_line(kiln_cli("compile", str(model), "-o", str(tmp_path / "g.so"),
                                   "--executor", "graph", "--quiet", check=False))
    assert "input_ids[batch_size, sequence_length]" in err and "--input-shape" in err
    assert not (tmp_path / "g.so").exists()


@pytest.fixture(scope="module")
def minilm_assumed(wheel_file, tmp_path_factory):
    """(model path, VM library path, `kiln compile`'s stdout) of a compile with no flags."""
    model = wheel_file("minilm_l3")
    so_path = tmp_path_factory.mktemp("cli-vm-assumed") / "minilm.so"
    proc = kiln_cli("compile", str(model), "-o", str(so_path), "--quiet")
    return model, so_path, proc.stdout


def test_compile_with_no_flags_assumes_and_the_vm_checks(minilm_assumed, reference, tmp_path):
    model, so_path, out = minilm_assumed
    assert "assuming sequence_length <= 512, checked at run time: ONNX Expand" in out
    assert "batch_size in [1, inf], sequence_length in [1, 512]" in out
    feed = _tokens(4, 33, seed=33)
    np.savez(tmp_path / "in.npz", **feed)
    kiln_cli("run", str(so_path), "--inputs", str(tmp_path / "in.npz"), "--outputs",
             str(tmp_path / "out.npz"))
    with np.load(tmp_path / "out.npz") as data:
        assert_matches_reference([data[k] for k in data.files], reference(model, feed))
    np.savez(tmp_path / "long.npz", **_tokens(1, 600, seed=600))
    err = _one_error_line(kiln_cli("run", str(so_path), "--inputs", str(tmp_path / "long.npz"),
                                   check=False))
    assert "'input_ids' dim 1: symbol sequence_length = 600" in err, err
    assert "(needs sequence_length <= 512)" in err, err
