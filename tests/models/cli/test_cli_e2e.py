"""The ``kiln`` command end to end: compile squeezenet, run it from .npz, inspect it."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from model_helpers import assert_matches_reference, kiln_cli
from onnx_helpers import graph_inputs

from kiln import models

pytestmark = pytest.mark.xdist_group("cli-squeezenet")


@pytest.fixture(scope="module")
def squeezenet(tmp_path_factory):
    """A randomized squeezenet as .onnx, and the .so `kiln compile` made from it."""
    tmp = tmp_path_factory.mktemp("cli")
    model = models.randomize_weights(onnx.load(models.light_model_path("squeezenet")), seed=7)
    onnx_path = tmp / "squeezenet.onnx"
    onnx.save(model, onnx_path)
    so_path = tmp / "squeezenet.so"
    proc = kiln_cli("compile", str(onnx_path), "--target", "c", "-o", str(so_path),
                    "--input-shape", "data_0:1x3x224x224", "--quiet")
    assert "wrote" in proc.stdout
    return model, onnx_path, so_path


def test_compile_run_matches_onnxruntime(squeezenet, reference, tmp_path):
    model, _, so_path = squeezenet
    (name, ((shape, dtype))), = graph_inputs(model).items()
    x = np.random.default_rng(3).standard_normal(shape).astype(dtype)
    np.savez(tmp_path / "in.npz", **{name: x})
    proc = kiln_cli("run", str(so_path), "--inputs", str(tmp_path / "in.npz"),
                    "--outputs", str(tmp_path / "out.npz"), "--repeat", "3")
    out_name = model.graph.output[0].name
    assert out_name in proc.stdout and "median" in proc.stdout
    with np.load(tmp_path / "out.npz") as data:
        assert list(data.files) == [out_name]
        got = [data[out_name]]
    assert_matches_reference(got, reference(model, {name: x}))


def test_run_random_inputs_seeded(squeezenet, tmp_path):
    _, _, so_path = squeezenet
    outs = []
    for k in range(2):
        kiln_cli("run", str(so_path), "--seed", "5", "--outputs", str(tmp_path / f"{k}.npz"))
        with np.load(tmp_path / f"{k}.npz") as data:
            outs.append({key: data[key] for key in data.files})
    assert outs[0].keys() == outs[1].keys()
    for key in outs[0]:
        np.testing.assert_array_equal(outs[0][key], outs[1][key])


def test_run_rejects_wrong_input_shape(squeezenet, tmp_path):
    _, _, so_path = squeezenet
    np.savez(tmp_path / "bad.npz", data_0=np.zeros((1, 3, 8, 8), np.float32))
    proc = kiln_cli("run", str(so_path), "--inputs", str(tmp_path / "bad.npz"), check=False)
    assert proc.returncode == 2
    assert proc.stderr.startswith("kiln: error:") and proc.stderr.count("\n") == 1


def test_inspect(squeezenet):
    _, _, so_path = squeezenet
    out = kiln_cli("inspect", str(so_path)).stdout
    assert "GraphExecutorFactory" in out
    assert "data_0" in out and "1x3x224x224" in out
    assert "params:" in out


def test_compile_rejects_contradicting_shape(squeezenet, tmp_path):
    _, onnx_path, _ = squeezenet
    proc = kiln_cli("compile", str(onnx_path), "-o", str(tmp_path / "x.so"), "--quiet",
                    "--input-shape", "data_0:1x3x100x100", check=False)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("kiln: error:") and proc.stderr.count("\n") == 1
    assert not (tmp_path / "x.so").exists()


def test_compile_with_byoc_and_inspect_modules(squeezenet, tmp_path):
    _, onnx_path, _ = squeezenet
    so_path = tmp_path / "byoc.so"
    proc = kiln_cli("compile", str(onnx_path), "-o", str(so_path), "--byoc", "kiln_json",
                    "--input-shape", "data_0:1x3x224x224", "--quiet")
    assert "byoc kiln_json" in proc.stdout
    out = kiln_cli("inspect", str(so_path)).stdout
    assert "const_loader" in out and "kiln_json: __init_kiln_default_kiln_json_main_0" in out
    assert "constants (const_loader): 52 tensors" in out
    bad = kiln_cli("compile", str(onnx_path), "-o", str(tmp_path / "x.so"), "--byoc", "nope",
                   "--quiet", check=False)
    assert bad.returncode == 2 and "no external codegen registered for BYOC compiler 'nope'" \
        in bad.stderr


def test_run_errors_come_before_the_run(squeezenet, tmp_path):
    """An unwritable --outputs path fails before the model runs (nothing printed but the
    error); the ONNX model instead of its library is named as such."""
    _, onnx_path, so_path = squeezenet
    proc = kiln_cli("run", str(so_path), "--outputs", str(tmp_path / "missing" / "o.npz"),
                    check=False)
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout
    assert proc.stderr == (f"kiln: error: cannot write {tmp_path}/missing/o.npz: directory "
                           f"{tmp_path}/missing does not exist\n")
    proc = kiln_cli("run", str(onnx_path), check=False)
    assert proc.returncode == 2
    assert proc.stderr == (f"kiln: error: {onnx_path} is an ONNX model, not a compiled library: "
                           f"kiln compile {onnx_path} -o {so_path} first\n")
