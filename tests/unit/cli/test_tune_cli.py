"""``kiln tune`` and ``kiln compile --tuning-records`` on a tiny ONNX model: records written,
applied (the tuned library matches onnxruntime), refused on another CPU, usage errors exit 2."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import kiln
from kiln.cli import main as cli
from kiln.cli.tune import parse_duration
from kiln.driver.tuning_records import (
    TuningRecord,
    append_records,
    best_records,
    load_records,
)

TARGET = "llvm"


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    """Conv 3x3 + Relu, Flatten, Gemm: a conv2d_NCHWc and a dense_pack kernel to tune."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((16, 8, 3, 3)).astype("float32"), "w")
    d = numpy_helper.from_array(rng.standard_normal((10, 16 * 6 * 6)).astype("float32"), "d")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
         helper.make_node("Relu", ["c"], ["r"]), helper.make_node("Flatten", ["r"], ["f"]),
         helper.make_node("Gemm", ["f", "d"], ["y"], transB=1)], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 6, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])], [w, d])
    path = tmp_path_factory.mktemp("tune") / "tiny.onnx"
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8  # what onnxruntime reads
    onnx.save(model, path)
    return path


def _run(lib_path, x):
    lib = kiln.runtime.load_module(str(lib_path))
    gmod = kiln.graph_executor.GraphModule(lib["default"](kiln.cpu()))
    gmod.set_input("x", x)
    gmod.run()
    return gmod.get_output(0).numpy()


def test_tune_writes_records_that_compile_applies(model_path, tmp_path, capsys):
    out = tmp_path / "r.jsonl"
    assert cli.main(["tune", str(model_path), "--target", TARGET, "--trials", "4",
                     "--batch-size", "2", "--confirm", "0", "--no-in-model", "-o", str(out),
                     "-q"]) == 0
    records = load_records(out)
    assert len(records) == 4 and all(r.error is None for r in records)
    assert {r.kernel for r in records} == {"fused_nn_conv2d_NCHWc_nn_relu",
                                           "fused_nn_dense_pack"}
    printed = capsys.readouterr().out
    assert "measured 4 candidates (0 from earlier records; 0 re-measurements" in printed
    # the conv's fastest record: a config other than the default
    conv = next(r for r in records[1:] if r.kernel.startswith("fused_nn_conv2d"))
    assert conv.config != records[0].config  # records[0]: the conv's default
    append_records(out, [TuningRecord(conv.workload_key, conv.kernel, conv.config, (1e-9,),
                                      None, conv.target, conv.fingerprint, conv.kiln_version)])
    lib = tmp_path / "tuned.so"
    assert cli.main(["compile", str(model_path), "--target", TARGET, "--tuning-records",
                     str(out), "-o", str(lib), "-q"]) == 0
    assert "tuning records: 2 of 2 kernels tuned" in capsys.readouterr().out
    x = np.random.default_rng(1).standard_normal((1, 8, 6, 6)).astype("float32")
    sess = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(_run(lib, x), sess.run(None, {"x": x})[0], rtol=1e-4,
                               atol=1e-4)


def test_tune_confirms_the_choices_inside_the_model(model_path, tmp_path, capsys):
    out = tmp_path / "r.jsonl"
    assert cli.main(["tune", str(model_path), "--target", TARGET, "--trials", "6",
                     "--batch-size", "3", "--confirm", "0", "-o", str(out), "-q"]) == 0
    printed = capsys.readouterr().out
    records = load_records(out)
    verdicts = [r for r in records if r.in_model]
    if verdicts:  # some kernel had a candidate faster alone than its default
        assert re.search(r"tuned model [\d.]+ ms vs default [\d.]+ ms \([\d.]+x\); kept \d+ "
                         rf"of {len(verdicts)} kernels' choices", printed)
    else:
        assert "no kernel had a choice faster than its default alone" in printed
    chosen = best_records(records, TARGET, records[0].fingerprint)
    for v in verdicts:  # what compile applies is the in-model verdict
        assert chosen[v.workload_key].config == v.config
    lib = tmp_path / "tuned.so"
    assert cli.main(["compile", str(model_path), "--target", TARGET, "--tuning-records",
                     str(out), "-o", str(lib), "-q"]) == 0


def test_compile_refuses_records_of_another_cpu(model_path, tmp_path, capsys):
    out = tmp_path / "r.jsonl"
    assert cli.main(["tune", str(model_path), "--target", TARGET, "--trials", "2",
                     "--batch-size", "1", "-o", str(out), "-q"]) == 0
    lines = []
    for line in out.read_text().splitlines():
        obj = json.loads(line)
        obj["fingerprint"]["cpu"] = "Another CPU"
        lines.append(json.dumps(obj))
    out.write_text("\n".join(lines) + "\n")
    capsys.readouterr()
    assert cli.main(["compile", str(model_path), "--target", TARGET, "--tuning-records",
                     str(out), "-o", str(tmp_path / "m.so"), "-q"]) == 0
    assert ("tuning records: 0 of 2 kernels tuned; 2 fell back to default (2 other CPU)"
            in capsys.readouterr().out)


def test_compile_says_records_timed_hot_fell_back(model_path, tmp_path, capsys):
    """Records of the old back-to-back timing are not compared with flushed ones: compile
    applies none of them and says why, unless told to apply hot records."""
    out = tmp_path / "r.jsonl"
    assert cli.main(["tune", str(model_path), "--target", TARGET, "--trials", "2",
                     "--batch-size", "1", "--measure", "hot", "-o", str(out), "-q"]) == 0
    assert {r.measure for r in load_records(out)} == {"hot"}
    capsys.readouterr()
    assert cli.main(["compile", str(model_path), "--target", TARGET, "--tuning-records",
                     str(out), "-o", str(tmp_path / "m.so"), "-q"]) == 0
    assert ("tuning records: 0 of 2 kernels tuned; 2 fell back to default (2 other measure)"
            in capsys.readouterr().out)
    assert cli.main(["compile", str(model_path), "--target", TARGET, "--tuning-records",
                     str(out), "--tuning-measure", "hot", "-o", str(tmp_path / "h.so"),
                     "-q"]) == 0
    assert "tuning records: 2 of 2 kernels tuned" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["--trials", "2", "--tuning-records", "{tmp}/missing.jsonl"], "missing.jsonl: no such file"),
    (["--trials", "2", "--target", "llvm -mcpu=portable"], "multi-level target"),
    (["--trials", "2", "--target", "jit"], "cannot tune for target 'jit'"),
    (["--trials", "2", "--search", "annealing"], "--search must be one of model, random"),
])
def test_tune_errors_exit_2(model_path, tmp_path, capsys, argv, message):
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    assert cli.main(["tune", str(model_path), "-o", str(tmp_path / "r.jsonl"), "-q",
                     *argv]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("argv", [[], ["--trials", "0"], ["--time-budget", "soon"],
                                  ["--trials", "2", "--time-budget", "1m"],
                                  ["--trials", "2", "--measure", "warm"],
                                  ["--trials", "2", "--confirm", "-1"]])
def test_tune_usage_errors_exit_2(model_path, tmp_path, argv):
    with pytest.raises(SystemExit) as err:
        cli.main(["tune", str(model_path), "-o", str(tmp_path / "r.jsonl"), *argv])
    assert err.value.code == 2


def test_compile_with_a_bad_records_file_exits_2(model_path, tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{}\n")
    assert cli.main(["compile", str(model_path), "--tuning-records", str(bad), "-o",
                     str(tmp_path / "m.so"), "-q"]) == 2
    assert "bad.jsonl:1: tuning record without" in capsys.readouterr().err


@pytest.mark.parametrize("text, seconds", [("90", 90), ("90s", 90), ("10m", 600),
                                           ("1.5h", 5400)])
def test_parse_duration(text, seconds):
    assert parse_duration(text) == seconds


def test_a_local_tune_never_imports_ray():
    """Ray is optional: only ``--ray`` imports it (checked in a fresh interpreter)."""
    code = ("import sys; import kiln.cli.main, kiln.cli.tune, kiln.tune.tuner; "
            "assert 'ray' not in sys.modules, 'ray imported'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_tune_refuses_symbolic_inputs_and_says_how_to_fix_them(tmp_path, capsys):
    """A model with a symbolic batch: one line naming the input and --input-shape (it said
    'no kernel with schedule choices to tune' and exited 0, writing nothing)."""
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 64])],
        [numpy_helper.from_array(np.ones((64, 64), np.float32), "w")])
    path = tmp_path / "sym.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), path)
    assert cli.main(["tune", str(path), "-o", str(tmp_path / "r.jsonl"), "-q",
                     "--trials", "2"]) == 2
    err = capsys.readouterr().err
    assert "symbolic dims: x[batch, 64]" in err and "--input-shape" in err
    assert not (tmp_path / "r.jsonl").exists()
