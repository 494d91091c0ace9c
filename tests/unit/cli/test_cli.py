"""``kiln`` argument parsing and error reporting (no C toolchain, no compiled model needed)."""

from __future__ import annotations

import argparse
import logging
import subprocess
import sys

import numpy as np
import pytest

from kiln import progress
from kiln.cli import arguments
from kiln.cli import compile as cli_compile
from kiln.cli import inspect as cli_inspect
from kiln.cli import main as cli
from kiln.cli.files import load_inputs, random_inputs, save_npz
from kiln.cli.graph_info import graph_info
from kiln.errors import KilnError, ModuleLoadError, ShapeError


@pytest.mark.parametrize(("text", "name", "shape"), [
    ("data:1x3x224x224", "data", (1, 3, 224, 224)),
    ("input:0:1x10", "input:0", (1, 10)),
    ("gpu_0/data_0:2X3", "gpu_0/data_0", (2, 3)),
    ("a:b:c:7", "a:b:c", (7,)),
    ("scalar:", "scalar", ()),
    ("state:2xbatchx128", "state", (2, "batch", 128)),
    ("ids:1,max_len", "ids", (1, "max_len")),
    ("attention_mask:batchxpast+sequence", "attention_mask", ("batch", "past+sequence")),
    ("y:2*n", "y", ("2*n",)),
])
def test_parse_input_shape(text, name, shape):
    assert arguments.parse_input_shape(text) == (name, shape)


@pytest.mark.parametrize("text", ["data", ":1x2", "x:1x0", "x:1x-2", "x:1xx2", "x:1.5", "x:2a",
                                  "x:1,,2"])
def test_parse_input_shape_rejects(text):
    with pytest.raises(argparse.ArgumentTypeError):
        arguments.parse_input_shape(text)


def test_compile_arguments():
    args = cli.build_parser().parse_args([
        "compile", "m.onnx", "--target", "c", "-o", "m.so", "--input-shape", "input:0:1x3",
        "--input-shape", "y:2", "--quiet"])
    assert args.command == "compile" and args.model == "m.onnx" and args.output == "m.so"
    assert args.input_shapes == [("input:0", (1, 3)), ("y", (2,))]
    assert args.quiet and args.target == "c" and args.target_host is None
    args = cli.build_parser().parse_args(["compile", "m.onnx", "--target", "jit",
                                          "--target-host", "llvm", "-o", "m.so"])
    assert args.target == "jit" and args.target_host == "llvm"


def test_default_target_is_the_hosts_fastest(monkeypatch, capsys):
    """No --target: kiln compile (and kiln.build) take kiln.target.default_target(), LLVM for
    this CPU where llvmlite is installed; --help says so."""
    from kiln import target

    assert cli.build_parser().parse_args(["compile", "m.onnx", "-o", "m.so"]).target is None
    assert target.default_target() == "llvm -mcpu=native"
    monkeypatch.setitem(sys.modules, "llvmlite.binding", None)  # import fails: no llvmlite
    assert target.default_target() in ("c -mcpu=native", "c")
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["compile", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert '(default: the fastest for this host, "llvm -mcpu=native"; "c -mcpu=native" ' \
        "without llvmlite)" in text and "-mcpu=portable" in text
    monkeypatch.setattr(target, "default_target", lambda: "sentinel")
    from kiln.cli.compile import compile_model

    with pytest.raises(KilnError, match="unknown target 'sentinel'"):
        compile_model("m.onnx", "m.so")  # no target: default_target()'s


def test_byoc_arguments():
    parse = cli.build_parser().parse_args
    assert parse(["compile", "m.onnx", "-o", "m.so"]).byoc == []
    args = parse(["compile", "m.onnx", "-o", "m.so", "--byoc", "cblas,kiln_json", "--byoc",
                  "toy"])
    assert [n for names in args.byoc for n in names] == ["cblas", "kiln_json", "toy"]
    with pytest.raises(SystemExit):
        parse(["compile", "m.onnx", "-o", "m.so", "--byoc", ","])


def test_quantize_weights_argument():
    parse = cli.build_parser().parse_args
    assert parse(["compile", "m.onnx", "-o", "m.so"]).quantize_weights is None
    assert parse(["compile", "m.onnx", "-o", "m.so", "--quantize-weights", "q4"]
                 ).quantize_weights == "q4"
    with pytest.raises(SystemExit):
        parse(["compile", "m.onnx", "-o", "m.so", "--quantize-weights", "int4"])


def test_run_arguments_and_defaults():
    args = cli.build_parser().parse_args(["run", "m.so"])
    assert (args.inputs, args.outputs, args.seed, args.repeat) == (None, None, 0, 1)
    args = cli.build_parser().parse_args(["run", "m.so", "--inputs", "i.npz", "--outputs",
                                          "o.npz", "--seed", "4", "--repeat", "10"])
    assert (args.inputs, args.outputs, args.seed, args.repeat) == ("i.npz", "o.npz", 4, 10)


@pytest.mark.parametrize("argv", [
    [], ["compile", "m.onnx"], ["compile", "m.onnx", "-o", "x.so", "--input-shape", "bad"],
    ["run", "m.so", "--repeat", "0"], ["frobnicate"], ["demo", "translate"],
])
def test_usage_errors_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    assert exc.value.code == 2
    assert "usage: kiln" in capsys.readouterr().err


def test_demo_arguments():
    args = cli.build_parser().parse_args(["demo"])
    assert (args.name, args.text) == ("orientation", None)
    args = cli.build_parser().parse_args(["demo", "ocr", "--text", "Hi there", "--runs", "2"])
    assert (args.name, args.text, args.runs) == ("ocr", "Hi there", 2)


def test_demo_text_is_for_ocr_only(capsys):
    assert cli.main(["demo", "embed", "--text", "x"]) == 2
    assert "--text applies to 'kiln demo ocr' only" in _one_error_line(capsys)


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("kiln: error: ")
    assert "Traceback" not in err
    return lines[0]


def test_compile_missing_file(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("KILN_LOG", raising=False)
    code = cli.main(["compile", str(tmp_path / "nope.onnx"), "-o", str(tmp_path / "m.so"), "-q"])
    assert code == 2
    assert "nope.onnx" in _one_error_line(capsys)
    assert not (tmp_path / "m.so").exists()


def test_compile_malformed_onnx(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("KILN_LOG", raising=False)
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x08\x07garbage, not a protobuf\xff\xfe" * 10)
    code = cli.main(["compile", str(bad), "-o", str(tmp_path / "m.so"), "-q"])
    assert code == 2
    assert "bad.onnx" in _one_error_line(capsys)


def test_compile_missing_output_dir(tmp_path, capsys):
    code = cli.main(["compile", "m.onnx", "-o", str(tmp_path / "no" / "m.so"), "-q"])
    assert code == 2
    _one_error_line(capsys)


@pytest.mark.parametrize("command", ["run", "inspect"])
def test_load_errors(command, tmp_path, capsys):
    code = cli.main([command, str(tmp_path / "missing.so")])
    assert code == 2
    _one_error_line(capsys)
    junk = tmp_path / "junk.so"
    junk.write_bytes(b"not an ELF file")
    assert cli.main([command, str(junk)]) == 2
    _one_error_line(capsys)


def test_unexpected_exception_is_one_line(monkeypatch, capsys):
    def boom(args):
        raise RuntimeError("first line\nsecond line")

    monkeypatch.delenv("KILN_LOG", raising=False)
    monkeypatch.setattr(cli_inspect, "_run", boom)
    assert cli.main(["inspect", "x.so"]) == 2
    line = _one_error_line(capsys)
    assert "RuntimeError" in line and "first line" in line and "second" not in line


def test_debug_log_shows_traceback(monkeypatch, capsys):
    def boom(args):
        raise KilnError("kaputt")

    monkeypatch.setenv("KILN_LOG", "debug")
    monkeypatch.setattr(cli_inspect, "_run", boom)
    logger = logging.getLogger("kiln")
    handlers, level = list(logger.handlers), logger.level
    try:
        assert cli.main(["inspect", "x.so"]) == 2
        assert logger.level == logging.DEBUG
    finally:
        logger.handlers[:], logger.level = handlers, level
    err = capsys.readouterr().err
    assert "Traceback" in err and "kiln: error: kaputt" in err


def test_quiet_flag_silences_progress(monkeypatch):
    seen = {}

    def fake(args):
        seen["enabled"] = progress.enabled()
        return 0

    monkeypatch.setattr(cli_compile, "_run", fake)
    try:
        assert cli.main(["compile", "m.onnx", "-o", "m.so", "--quiet"]) == 0
    finally:
        progress.set_quiet(False)
    assert seen["enabled"] is False


def test_entry_point_subprocess(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "kiln.cli.main", "inspect",
                           str(tmp_path / "x.so")],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 2
    assert proc.stderr.startswith("kiln: error:") and proc.stderr.count("\n") == 1


GRAPH = """{
  "nodes": [
    {"op": "null", "name": "input:0", "inputs": []},
    {"op": "null", "name": "w", "inputs": []},
    {"op": "tvm_op", "name": "k0", "inputs": [[0, 0, 0], [1, 0, 0]],
     "attrs": {"func_name": "k0", "num_inputs": "2", "num_outputs": "1"}}
  ],
  "arg_nodes": [0, 1],
  "node_row_ptr": [0, 1, 2, 3],
  "heads": [[2, 0, 0]],
  "attrs": {
    "shape": ["list_shape", [[1, 4], [4, 2], [1, 2]]],
    "dltype": ["list_str", ["float32", "float32", "float32"]],
    "storage_id": ["list_int", [0, 1, 2]],
    "output_names": ["list_str", ["logits"]]
  }
}"""


def test_graph_info():
    info = graph_info(GRAPH, {"w"})
    assert [(t.name, t.shape, t.dtype) for t in info.inputs] == [("input:0", (1, 4), "float32")]
    assert [t.name for t in info.params] == ["w"]
    assert [(t.name, t.shape) for t in info.outputs] == [("logits", (1, 2))]
    assert info.num_ops == 1
    with pytest.raises(ModuleLoadError):
        graph_info("{}", set())


def test_random_inputs_seeded():
    info = graph_info(GRAPH, {"w"})
    a, b = random_inputs(info.inputs, 3), random_inputs(info.inputs, 3)
    np.testing.assert_array_equal(a["input:0"], b["input:0"])
    assert a["input:0"].dtype == np.float32 and a["input:0"].shape == (1, 4)
    assert not np.array_equal(a["input:0"], random_inputs(info.inputs, 4)["input:0"])


def test_npz_inputs_round_trip(tmp_path):
    info = graph_info(GRAPH, {"w"})
    x = np.arange(4, dtype=np.float32).reshape(1, 4)
    save_npz(str(tmp_path / "in.npz"), {"input:0": x})
    assert [p.name for p in tmp_path.iterdir()] == ["in.npz"]  # no temp file left behind
    np.testing.assert_array_equal(load_inputs(str(tmp_path / "in.npz"), info.inputs)["input:0"], x)
    save_npz(str(tmp_path / "bad.npz"), {"input:0": x.reshape(4, 1)})
    with pytest.raises(ShapeError):
        load_inputs(str(tmp_path / "bad.npz"), info.inputs)
    save_npz(str(tmp_path / "f64.npz"), {"input:0": x.astype(np.float64)})
    with pytest.raises(ShapeError, match="'input:0'.*dtype float64, the library expects "
                                         "float32.*astype"):
        load_inputs(str(tmp_path / "f64.npz"), info.inputs)  # never cast silently
    save_npz(str(tmp_path / "other.npz"), {"y": x})
    with pytest.raises(KilnError, match="missing"):
        load_inputs(str(tmp_path / "other.npz"), info.inputs)
    with pytest.raises(KilnError):
        save_npz(str(tmp_path / "no" / "out.npz"), {"y": x})


def test_profile_and_extract_arguments():
    args = cli.build_parser().parse_args(["run", "m.so"])
    assert (args.profile, args.dump_outputs) == (False, None)
    args = cli.build_parser().parse_args(["run", "m.so", "--profile", "--repeat", "5",
                                          "--dump-outputs", "dump"])
    assert (args.profile, args.repeat, args.dump_outputs) == (True, 5, "dump")
    args = cli.build_parser().parse_args(["inspect", "m.so", "--graph", "g.json",
                                          "--params", "m.params"])
    assert (args.graph, args.params) == ("g.json", "m.params")
    assert cli.build_parser().parse_args(["inspect", "m.so"]).graph is None


def test_closed_pipe_ends_quietly(monkeypatch, capsys):
    # `kiln inspect m.so | head -1`: the reader is gone; no traceback, shell-style status 141
    def write_to_closed_pipe(args):
        raise BrokenPipeError(32, "Broken pipe")

    parser = cli.build_parser()
    monkeypatch.setattr(cli, "build_parser", lambda: parser)
    for action in parser._subparsers._group_actions[0].choices.values():
        action.set_defaults(func=write_to_closed_pipe)
    assert cli.main(["inspect", "m.so"]) == 141
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("command", cli.COMMANDS)
def test_every_command_prints_its_help(command, capsys):
    """``kiln COMMAND --help`` exits 0 with a usage line (argparse expands ``%`` in help
    texts: a literal percent sign must be written ``%%``)."""
    with pytest.raises(SystemExit) as exc:
        cli.build_parser().parse_args([command.replace("_", "-"), "--help"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.startswith("usage: kiln ")
