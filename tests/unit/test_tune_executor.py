"""LocalExecutor (kiln.tune.executor): builds in worker processes, measures in this process,
results in input order, a job's exception in its slot, a dead worker survived."""

from __future__ import annotations

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


def test_measure_runs_here_serially(executor):
    out = executor.map_measure(math.sqrt, [(16.0,), ("x",)])
    assert out[0] == 4.0 and isinstance(out[1], TypeError)
    assert executor.map_measure(os.getpid, [(), ()]) == [os.getpid()] * 2


def test_a_dead_worker_is_an_error_and_the_pool_comes_back(executor):
    out = executor.map_build(os._exit, [(3,)])
    assert isinstance(out[0], BrokenProcessPool)
    assert executor.map_build(math.sqrt, [(25.0,)]) == [5.0]


def test_bad_arguments():
    with pytest.raises(KilnError, match="start method"):
        LocalExecutor(start_method="fork")
    with pytest.raises(KilnError, match="workers"):
        LocalExecutor(workers=0)
