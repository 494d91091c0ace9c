"""LocalExecutor (kiln.tune.executor): builds in worker processes, measures in this process,
results in input order, a job's exception in its slot, a dead worker survived."""

from __future__ import annotations

import ctypes
import math
import os
from concurrent.futures.process import BrokenProcessPool

import pytest

from kiln.errors import KilnError
from kiln.tune.executor import LocalExecutor


@pytest.fixture(scope="module")
def executor():
    ex = LocalExecutor(workers=2)
    yield ex
    ex.close()


def test_build_runs_in_workers_in_order_with_errors_in_slots(executor):
    out = executor.map_build(math.sqrt, [(4.0,), (-1.0,), (9.0,)])
    assert out[0] == 2.0 and out[2] == 3.0
    assert isinstance(out[1], ValueError)
    pids = executor.map_build(os.getpid, [()] * 4)
    assert os.getpid() not in pids
    assert executor.map_build(math.sqrt, []) == []


def test_measure_runs_serially_in_one_other_process(executor):
    out = executor.map_measure(math.sqrt, [(16.0,), ("x",)])
    assert out[0] == 4.0 and isinstance(out[1], TypeError)
    pids = executor.map_measure(os.getpid, [(), ()])
    assert pids[0] == pids[1] != os.getpid()
    assert executor.map_measure(os.getpid, [()]) == pids[:1]  # long-lived


def test_a_candidate_that_segfaults_is_its_own_error(executor):
    """ctypes.string_at(0) reads address 0 (SIGSEGV in the measuring process); the jobs
    before and after it in the batch still run, and the tuner's process lives on."""
    out = executor.map_measure(ctypes.string_at, [(0, 0), (0,), (0, 0)])
    assert out[0] == b"" and out[2] == b""
    assert isinstance(out[1], BrokenProcessPool)
    assert executor.map_measure(math.sqrt, [(9.0,)]) == [3.0]


def test_a_dead_worker_is_an_error_and_the_pool_comes_back(executor):
    out = executor.map_build(os._exit, [(3,)])
    assert isinstance(out[0], BrokenProcessPool)
    assert executor.map_build(math.sqrt, [(25.0,)]) == [5.0]


def test_bad_arguments():
    with pytest.raises(KilnError, match="start method"):
        LocalExecutor(start_method="fork")
    with pytest.raises(KilnError, match="workers"):
        LocalExecutor(workers=0)


class _Inline:
    """An executor that runs every job here, in order (errors in their slots)."""

    def __init__(self):
        self.calls = []

    def _map(self, kind, fn, jobs):
        out = []
        for job in jobs:
            self.calls.append((kind, job))
            try:
                out.append(fn(*job))
            except Exception as exc:  # noqa: BLE001 - the contract: errors in slots
                out.append(exc)
        return out

    def map_build(self, fn, jobs):
        return self._map("build", fn, jobs)

    def map_measure(self, fn, jobs):
        return self._map("measure", fn, jobs)

    def close(self):
        pass


def test_measure_with_builds_then_measures_what_built():
    from kiln.schedules.space import Knob, Task
    from kiln.tune.executor import measure_with

    def build(payload, config, target):
        if config["b"] == 0:
            raise KilnError("cannot lower b=0")
        return f"{payload}:{config['b']}:{target}".encode()

    def measure(lib, payload, config, target, repeat):
        return (lib, repeat)

    task = Task("k", "dense", 1, (Knob("b", (1, 0, 2)),), payload="P")
    ex = _Inline()
    out = measure_with(ex, build, measure, "llvm", repeat=3)([(task, {"b": b}) for b in (1, 0, 2)])
    assert out[0] == (b"P:1:llvm", 3) and out[2] == (b"P:2:llvm", 3)
    assert isinstance(out[1], KilnError)
    assert [kind for kind, _ in ex.calls] == ["build"] * 3 + ["measure"] * 2
