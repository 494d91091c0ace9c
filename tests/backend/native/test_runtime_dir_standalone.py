"""The folder ``kiln runtime-dir`` prints is self-contained (docs/decisions/030-one-c-tree.md):
copied anywhere (``cp -r "$(kiln runtime-dir)" X && make -C X BUILD=X/build``), it builds
libkiln_runtime (.so, .a), kiln_run and include/ with the host compiler, and with Debian's
cross GCCs (aarch64, riscv64) where installed; no command of the copy's Makefile names a path
of the package folder. The host build's kiln_run runs a small model.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from test_cross import CROSS
from test_native_runtime import build_runtime, kiln_run

import kiln
from kiln.frontend import from_onnx
from kiln.native import RUNTIME_DIR
from kiln.runtime.elf import host_elf, read_elf_header, triple_machine

BUILT = ("libkiln_runtime.so", "libkiln_runtime.a", "kiln_run", "include/kiln/runtime.h",
         "include/kiln/runtime.hpp", "include/kiln/c_runtime_api.h")


@pytest.fixture(scope="module")
def copied(tmp_path_factory) -> Path:
    """A copy of the runtime dir, as ``cp -r`` makes it (less a build folder made in place)."""
    if shutil.which("make") is None:
        pytest.skip("the native runtime needs make")
    dest = tmp_path_factory.mktemp("elsewhere") / "kiln-rt"
    shutil.copytree(RUNTIME_DIR, dest, ignore=shutil.ignore_patterns("build", "__pycache__"))
    return dest


def test_copy_names_no_path_outside_itself(copied):
    """``make -n`` in the copy: every command reads and writes inside the copy."""
    proc = subprocess.run(["make", "-n", "-C", str(copied), f"BUILD={copied / 'build-n'}"],
                          capture_output=True, text=True, timeout=60, check=True)
    assert str(RUNTIME_DIR) not in proc.stdout
    assert "/../" not in proc.stdout
    assert f"-I{copied}/include" in proc.stdout


def _one_model(folder: Path) -> tuple[Path, np.ndarray, np.ndarray]:
    """relu(x + 1) over a 2x8 float tensor, exported for the host; (so, x, want)."""
    x = np.linspace(-3, 3, 16, dtype=np.float32).reshape(2, 8)
    one = helper.make_tensor("one", TensorProto.FLOAT, [1], [1.0])
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "one"], ["s"]), helper.make_node("Relu", ["s"], ["y"])],
        "add_relu", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])], [one])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    mod, params = from_onnx(model)
    so = folder / "add_relu.so"
    kiln.build(mod, target="c", params=params).export_library(str(so))
    return so, x, np.maximum(x + 1, 0)


def test_copy_builds_for_the_host_and_runs(copied, tmp_path):
    if shutil.which("cc") is None:
        pytest.skip("the native runtime needs cc")
    build = build_runtime(copied / "build", source=copied)
    for name in BUILT:
        assert (build / name).is_file(), name
    host = host_elf()
    assert host is not None
    assert read_elf_header(str(build / "kiln_run")).machine == host.machine
    so, x, want = _one_model(tmp_path)
    (got,), _ = kiln_run(build, so, [x], [(want.shape, want.dtype)], tmp_path, repeat=1)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("isa", ["aarch64", "riscv64"])
def test_copy_builds_with_a_cross_compiler(copied, isa):
    cc = CROSS[isa]["cc"]
    if shutil.which(cc) is None:
        pytest.skip(f"{isa} needs {cc} (make cross-toolchain installs it)")
    build = build_runtime(copied / f"build-{isa}", cc=cc, source=copied)
    for name in BUILT:
        assert (build / name).is_file(), name
    machine = triple_machine(f"{isa}-linux-gnu")
    assert machine is not None
    for name in ("kiln_run", "libkiln_runtime.so"):
        assert read_elf_header(str(build / name)).machine == machine[0], name
