"""``kiln_run``'s command line (src/kiln/native/tools/kiln_run.c), built by the runtime's
Makefile: ``-h``/``--help`` print the usage on stdout and exit 0 (it used to try to load a
library named ``--help``); an option where the library goes is a usage error (exit 2); a VM
library's shapes come as ``kiln run``'s ``--input-shape NAME:1x7`` (or ``--shape NAME=1x7``),
and an input that shares a symbol with a given one takes its value (run under ASan + UBSan)."""

from __future__ import annotations

import os
import subprocess

import numpy as np
import pytest
from onnx import TensorProto, helper
from test_native_vm import _export


def _kiln_run(native_rt, *args: str, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([str(native_rt / "kiln_run"), *args], capture_output=True, text=True,
                          timeout=60, check=False, env=env)


@pytest.mark.parametrize("argv", [["--help"], ["-h"], ["model.so", "--repeat", "3", "--help"]])
def test_help_prints_usage_and_exits_0(native_rt, argv):
    proc = _kiln_run(native_rt, *argv)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert proc.stdout.startswith("usage: kiln_run model.so [--repeat N] IN.bin... OUT.bin...\n")
    assert "--shape NAME=1x7" in proc.stdout and "-h, --help" in proc.stdout
    assert "--input-shape NAME:1x7" in proc.stdout


@pytest.mark.parametrize("argv", [[], ["--repeat", "3", "model.so"], ["--version"]])
def test_usage_errors_exit_2(native_rt, argv):
    proc = _kiln_run(native_rt, *argv)
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout
    assert proc.stderr.startswith("usage: kiln_run "), proc.stderr


@pytest.fixture(scope="module")
def shared_symbol_so(tmp_path_factory):
    """``main(x: float32[n, 4], y: float32[n, 4]) -> (x + y, n x 4)``: two inputs, one symbol."""
    x, y, z = (helper.make_tensor_value_info(v, TensorProto.FLOAT, ["n", 4]) for v in "xyz")
    graph = helper.make_graph([helper.make_node("Add", ["x", "y"], ["z"])], "shared", [x, y], [z])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    return _export(model, "c", tmp_path_factory.mktemp("shared") / "shared.so")


@pytest.mark.parametrize("option", [["--input-shape", "x:3x4"], ["--input-shape", "y:3,4"],
                                    ["--shape", "x=3x4"]])
def test_a_given_shape_sizes_the_inputs_that_share_its_symbol(native_rt_asan, shared_symbol_so,
                                                              option, tmp_path):
    rng = np.random.default_rng(0)
    x, y = (rng.standard_normal((3, 4)).astype("float32") for _ in range(2))
    x.tofile(tmp_path / "x.bin")
    y.tofile(tmp_path / "y.bin")
    proc = _kiln_run(native_rt_asan, str(shared_symbol_so), "--repeat", "1", *option,
                     str(tmp_path / "x.bin"), str(tmp_path / "y.bin"), str(tmp_path / "z.bin"))
    assert proc.returncode == 0, proc.stderr
    np.testing.assert_array_equal(np.fromfile(tmp_path / "z.bin", "float32").reshape(3, 4),
                                  x + y)


@pytest.mark.parametrize(("option", "message"), [
    ([], "kiln_run: give --input-shape x:DIMxDIM... (input x is [n,4]: no other input's shape "
         "sets n)\n"),
    (["--input-shape", "x:3x4", "--input-shape", "y:5x4"],
     "kiln_run: symbol n is 3 (--input-shape x) but 5 in --input-shape y\n"),
    (["--input-shape", "x:3"], "kiln_run: --input-shape x: 1 dims, but input x has 2 (n,4)\n"),
    (["--input-shape", "x:3y4"], "kiln_run: malformed --input-shape x:DIMxDIM...\n"),
    (["--input-shape", "x=3x4"], "kiln_run: --input-shape x=3x4: expected NAME:1x7\n"),
])
def test_shapes_that_do_not_fit_are_usage_errors(native_rt_asan, shared_symbol_so, option,
                                                 message):
    # a usage error exits at once, leaving what it allocated to the exit: no leak check
    env = {**os.environ, "ASAN_OPTIONS": "detect_leaks=0"}
    proc = _kiln_run(native_rt_asan, str(shared_symbol_so), "--random", *option, env=env)
    assert proc.returncode == 2 and proc.stderr == message, proc.stderr
