"""Fuzzing the runtime's parsers in-process (no C toolchain): params blobs, factory module
bytes, imports-blob payloads, graph JSON (as bytes and as a parsed document) and VM
executables, each mutated
and fed to its loader (and, when it loads, to executor creation). See
``tests/helpers/fuzz_runtime.py``
for the mutations and the pass rule: the loader returns or raises ``KilnError``.

The default suite runs :data:`QUICK` cases per target; ``make fuzz`` runs the ``fuzz``-marked
test with ``$KILN_FUZZ_CASES`` (default :data:`LARGE`) cases per target. ``$KILN_FUZZ_SEED``
(default 0) picks another sequence of cases.
"""

from __future__ import annotations

import json
import os
import signal

import pytest
from fuzz_mutators import (
    blob_corpus,
    factory_corpus,
    graph_docs,
    graph_params,
    json_runtime_corpus,
    numpy_kernels,
    vm_exec_corpus,
    vm_kernels,
)
from fuzz_runtime import make_targets, run, run_in_workers

import kiln.runtime as rt
from kiln.runtime.blob import unpack_imports
from kiln.runtime.graph_executor.executor import GraphExecutor

TARGETS = ("params", "factory", "blob", "graph_text", "graph_struct", "kiln_json", "vm_exec")
QUICK = 100
LARGE = 5000
SEED = int(os.environ.get("KILN_FUZZ_SEED", "0"))


@pytest.fixture(scope="module")
def targets():
    return make_targets()


def test_corpus_loads():
    """Fuzzing starts from inputs that load: each corpus item creates an executor."""
    for doc in graph_docs():
        GraphExecutor(json.dumps(doc), numpy_kernels(), rt.cpu(), graph_params(doc))
    for data in factory_corpus():
        fac = rt.GraphExecutorFactoryModule.load_from_binary(data)
        fac.import_module(numpy_kernels())
        fac["default"](rt.cpu())
    for data in blob_corpus():
        unpack_imports(data, numpy_kernels())["default"](rt.cpu())
    for data in json_runtime_corpus():
        rt.JSONRuntimeModule.load_from_binary(data)
    for data in vm_exec_corpus():
        exe = rt.VMExecutable.load_from_binary(data)
        exe.import_module(vm_kernels())
        exe["vm_load_executable"]()["vm_initialization"](1, 0, 2)


@pytest.mark.parametrize("name", TARGETS)
def test_fuzz_quick(targets, name):
    report = run(targets[name], SEED, QUICK)
    assert report.cases == QUICK
    assert not report.failures, report.summary()


@pytest.mark.fuzz
@pytest.mark.parametrize("name", TARGETS)
def test_fuzz_large(targets, name):
    count = int(os.environ.get("KILN_FUZZ_CASES", LARGE))
    report = run(targets[name], SEED, count)
    print(report.summary())
    assert report.cases == count
    assert not report.failures, report.summary()


def test_harness_reports_crashes_and_exceptions():
    """A worker that dies is one failed case (and the run goes on); other exceptions are
    classified by type and place."""
    report = run_in_workers("selftest", SEED, 10, None, batch=6)
    assert report.cases == 10
    kinds = {f.index: f.kind for f in report.failures}
    assert kinds.keys() == {3, 4, 8, 9}
    assert kinds[3] == kinds[8] == f"crash (exit -{signal.SIGSEGV})"
    assert kinds[4].startswith("IndexError at") and "replay selftest" in report.summary()


def test_harness_reports_hangs(monkeypatch):
    import time

    import fuzz_runtime

    monkeypatch.setattr(fuzz_runtime, "CASE_TIMEOUT_S", 0.2)
    slow = fuzz_runtime.Target("slow", lambda rng: ((lambda: time.sleep(5)), "sleeps"))
    start = time.perf_counter()
    report = run(slow, SEED, 1)
    # cut short: well before the case's 5 s sleep would end (slack for a loaded machine)
    assert time.perf_counter() - start < 4.5
    assert [f.kind for f in report.failures] == ["hang"]
