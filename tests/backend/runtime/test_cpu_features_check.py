"""A library built for CPU features this machine lacks is refused with a message, not run into
``Illegal instruction`` (decision 031): the ``__kiln_target_info`` record export_library writes
for each target kind, ``load_module``'s check before dlopen (in a child process: a missed check
must not kill the test run with SIGILL), and ``kiln inspect`` on libraries for another CPU and
another machine, read without loading them. The native runtime's check:
tests/backend/native/test_native_cpu_check.py."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import kiln
from kiln.cli.inspect import inspect_library
from kiln.frontend import from_onnx
from kiln.runtime.cpu_features import host_cpuinfo_flags, missing_features
from kiln.runtime.load import read_library, read_target_info
from kiln.runtime.toolchain.cc import cross_compiler

ROOT = Path(__file__).resolve().parents[3]
#: (target, a feature it needs) by preference: the first whose feature this CPU lacks is the
#: foreign-CPU target of these tests
FOREIGN_CPUS = [("llvm -mcpu=skylake-avx512", "avx512f"),
                ("llvm -mcpu=sapphirerapids", "avx512fp16")]


def tiny_model() -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])
    w = helper.make_tensor("w", TensorProto.FLOAT, [1, 64], np.arange(64.0).tolist())
    nodes = [helper.make_node("Add", ["x", "w"], ["a"]), helper.make_node("Relu", ["a"], ["y"])]
    graph = helper.make_graph(nodes, "tiny", [x], [y], [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def build(target: str, path: Path, fcompile=None) -> Path:
    mod, params = from_onnx(tiny_model(), shape={"x": (1, 64)})
    kiln.build(mod, target=target, params=params).export_library(str(path), fcompile=fcompile)
    return path


def foreign_cpu() -> tuple[str, str]:
    flags = host_cpuinfo_flags()
    if flags is None:
        pytest.skip("this machine's CPU features cannot be read (/proc/cpuinfo)")
    for target, feature in FOREIGN_CPUS:
        if missing_features([feature], flags, "x86_64"):
            return target, feature
    pytest.skip("this CPU has every feature of the foreign-CPU targets")


@pytest.fixture(scope="module")
def libs(tmp_path_factory):
    if os.uname().machine != "x86_64":
        pytest.skip("the foreign-CPU targets are x86-64 CPUs")
    folder = tmp_path_factory.mktemp("cpu-check")
    target, feature = foreign_cpu()
    out = {"foreign": build(target, folder / "foreign.so"), "feature": feature,
           "target": target, "native": build("llvm -mcpu=native", folder / "native.so")}
    if shutil.which("aarch64-linux-gnu-gcc"):
        out["aarch64"] = build("llvm -mtriple=aarch64-linux-gnu", folder / "arm.so",
                               cross_compiler("aarch64-linux-gnu-gcc", output_format="so"))
    return out


def test_record_of_a_foreign_cpu(libs):
    info = read_target_info(str(libs["foreign"]))
    assert info["target"] == libs["target"] and info["triple"].startswith("x86_64")
    assert info["version"] == 1 and libs["feature"] in info["features"]
    assert {"sse4.2", "avx", "avx2", "fma"} <= set(info["features"])


def test_record_of_native_is_this_cpu(libs):
    info = read_target_info(str(libs["native"]))
    assert info["target"] == "llvm -mcpu=native" and info["cpu"]
    assert missing_features(info["features"], host_cpuinfo_flags(), "x86_64") == []
    kiln.runtime.load_module(str(libs["native"]))  # loads (and would run) here


@pytest.mark.parametrize("target, want, levels", [
    ("llvm -mcpu=portable", ["sse4.2", "popcnt"], ["x86-64-v2", "x86-64-v3", "x86-64-v4"]),
    ("llvm -mcpu=x86-64-v3", ["sse4.2", "popcnt", "avx", "avx2", "fma", "f16c", "bmi2"], []),
    ("llvm -mcpu=x86-64-v3 -mattr=-avx2,-fma", ["sse4.2", "popcnt", "avx", "f16c", "bmi2"], []),
    ("c -mcpu=x86-64-v3", ["sse4.2", "popcnt", "avx", "avx2", "fma", "f16c", "bmi2"], []),
    ("c", [], []),
    # AMX kernels ask the CPU at run time and fall back (decision 026): never required
    ("llvm -mcpu=x86-64-v3 -mattr=+amx-tile,+amx-int8",
     ["sse4.2", "popcnt", "avx", "avx2", "fma", "f16c", "bmi2"], []),
    ("c -mcpu=sapphirerapids", None, []),
])
def test_record_per_target(tmp_path, target, want, levels):
    if os.uname().machine != "x86_64":
        pytest.skip("x86-64 targets")
    info = read_target_info(str(build(target, tmp_path / "m.so")))
    assert (want is None or info["features"] == want) and info["levels"] == levels
    assert info["target"] == target
    assert not any(f.startswith("amx") for f in info["features"])


def test_load_module_refuses_without_sigill(libs):
    code = ("import sys, kiln\nfrom kiln.errors import ModuleLoadError\n"
            "try:\n    kiln.runtime.load_module(sys.argv[1])\n"
            "except ModuleLoadError as err:\n    print(err)\n    sys.exit(3)\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.run([sys.executable, "-c", code, str(libs["foreign"])],
                          capture_output=True, text=True, timeout=120, env=env, check=False)
    assert proc.returncode != -signal.SIGILL, "the library ran into an illegal instruction"
    assert proc.returncode == 3, proc.stderr
    msg = proc.stdout.strip()
    assert msg.startswith(f"{libs['foreign']} needs {libs['feature']}") and "this CPU has" in msg
    assert "avx2" in msg.split("this CPU has", 1)[1]  # what it has, in the record's names


def test_a_relinked_export_is_checked_too(libs, tmp_path):
    """A .o export keeps its record through the relink at load."""
    target = libs["target"]
    obj = build(target, tmp_path / "model.o")
    assert read_target_info(str(obj))["features"] == read_target_info(
        str(libs["foreign"]))["features"]
    with pytest.raises(kiln.errors.ModuleLoadError, match=f"needs {libs['feature']}"):
        kiln.runtime.load_module(str(obj))


def test_inspect_a_library_for_another_cpu(libs):
    lines: list[str] = []
    inspect_library(str(libs["foreign"]), echo=lines.append)
    text = "\n".join(lines)
    assert f"target: {libs['target']}" in lines
    assert "  triple: x86_64" in text and "cpu features needed: sse4.2" in text
    assert f"runs here: no, this CPU lacks {libs['feature']}" in text
    assert "inputs:" in lines and "  x: 1x64 float32" in lines


def test_inspect_a_cross_compiled_library(libs, tmp_path):
    if "aarch64" not in libs:
        pytest.skip("no aarch64-linux-gnu-gcc")
    lines: list[str] = []
    params = tmp_path / "p.params"
    inspect_library(str(libs["aarch64"]), echo=lines.append, params_out=str(params))
    text = "\n".join(lines)
    assert "target: llvm -mtriple=aarch64-linux-gnu" in lines
    assert "triple: aarch64-linux-gnu" in text and "runs here: no (built for aarch64" in text
    assert "library: fused_add_nn_relu" in text and "params: 1 tensors, 256 bytes" in text
    assert kiln.runtime.load_param_dict(params.read_bytes())["p0"].shape == (1, 64)
    root, info = read_library(str(libs["aarch64"]))
    assert root.type_key == "GraphExecutorFactory" and info["triple"] == "aarch64-linux-gnu"


def test_inspect_dispatch_line_of_a_bare_relative_name(tmp_path, monkeypatch):
    if os.uname().machine != "x86_64":
        pytest.skip("multi-level libraries are x86-64")
    build("llvm -mcpu=portable", tmp_path / "port.so")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LD_LIBRARY_PATH", "")
    lines: list[str] = []
    inspect_library("port.so", echo=lines.append)
    assert any(line.startswith("cpu dispatch: kernels for x86-64-v2, x86-64-v3, x86-64-v4; "
                               "this CPU runs x86-64-v") for line in lines), lines
    assert "runs here: yes" in lines
