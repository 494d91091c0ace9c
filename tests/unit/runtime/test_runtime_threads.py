"""kiln.runtime.threads.num_threads counts threads as the runtime's pool does (backend.c's
kiln_team_size), and the demos give onnxruntime that same count."""

import os

import pytest

from kiln.demo import common
from kiln.runtime.threads import MAX_THREADS, num_threads


@pytest.mark.parametrize("env, threads", [("3", 3), ("+2", 2), (" 4", 4), ("999", MAX_THREADS)])
def test_kiln_num_threads_as_strtol_reads_it(monkeypatch, env, threads):
    monkeypatch.setenv("KILN_NUM_THREADS", env)
    assert num_threads() == threads


@pytest.mark.parametrize("env", ["", "0", "-1", "2x", "5 ", "\u00b2", "\u0663"])
def test_otherwise_the_affinity_mask(monkeypatch, env):
    """Not a positive ASCII integer (the pool ignores it too): the CPUs this process may run
    on, not all the machine's cores (a container or ``taskset`` limits them)."""
    monkeypatch.setenv("KILN_NUM_THREADS", env)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0}, raising=False)
    assert num_threads() == 1
    assert common.num_threads() == 1  # the demos' onnxruntime sessions get the same count
