"""Measuring candidates (kiln.tune.measure) and the tuning loop (kiln.tune.tuner): results
checked against the default schedule, failures recorded as errors, a resumed tune measures
nothing twice. Builds with LLVM and the system linker; timings are never asserted."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
from tune_models import dense_model, qdq_conv_model

from kiln.driver.tuning_records import load_records
from kiln.errors import KilnError
from kiln.frontend import from_onnx
from kiln.relay.interpreter import evaluate
from kiln.schedules.space import Knob, Task
from kiln.tune import measure
from kiln.tune.cache_flush import CacheFlusher, l2_cache_bytes
from kiln.tune.executor import SerialExecutor
from kiln.tune.measure import build_candidate, measure_candidate, reference_output, time_kernel
from kiln.tune.tasks import extract_tasks
from kiln.tune.tuner import tune

TARGET = "llvm"


@pytest.fixture(scope="module")
def task():
    mod, params = from_onnx(dense_model())
    (t,) = extract_tasks(mod, params, TARGET)
    return t


def test_a_candidate_is_checked_then_timed(task):
    config = list(task.configs())[-1]
    lib = build_candidate(task.payload, config, TARGET)
    result = measure_candidate(lib, task.payload, config, TARGET, repeat=3)
    assert result.error is None, result.error
    assert len(result.costs) == 3 and all(c > 0 for c in result.costs)
    body = task.payload.body  # the default schedule's output is the graph's (numpy)
    want = evaluate(body, dict(zip([p.name for p in body.params],
                                   measure.kernel_inputs(task.payload))))[0]
    np.testing.assert_allclose(reference_output(task.payload, TARGET), want, rtol=1e-5,
                               atol=1e-5)


def test_a_kernel_with_scalar_constants_is_measured():
    """Per-tensor QDQ scales and zero points are 0-d constants of the int8 conv kernel: they
    are passed 0-d (every QDQ resnet50 candidate failed with 'expected ndim 0, got 1')."""
    mod, params = from_onnx(qdq_conv_model())
    (t,) = extract_tasks(mod, params, TARGET)
    assert any(c is not None and np.ndim(c) == 0 for c in t.payload.constants)
    config = list(t.configs())[-1]
    result = measure_candidate(build_candidate(t.payload, config, TARGET), t.payload, config,
                               TARGET, repeat=2)
    assert result.error is None, result.error
    assert [a.shape for a in measure.kernel_inputs(t.payload)] == \
        [tuple(p.checked_type.shape) for p in t.payload.body.params]


def test_a_wrong_result_is_an_error_not_a_time(task, monkeypatch):
    config = list(task.configs())[1]
    lib = build_candidate(task.payload, config, TARGET)
    wrong = reference_output(task.payload, TARGET) + 1.0
    monkeypatch.setitem(measure._REFERENCES, (task.payload.key, TARGET), wrong)
    result = measure_candidate(lib, task.payload, config, TARGET, repeat=2)
    assert result.costs == () and result.best == float("inf")
    assert "values differ from the default schedule's" in result.error


def test_a_library_that_does_not_load_is_an_error(task):
    result = measure_candidate(b"not a library", task.payload, {}, TARGET)
    assert result.error and result.costs == ()


def test_an_illegal_config_fails_to_build_with_the_knob_named(task):
    with pytest.raises(KilnError, match="knob unroll_k=3 is not legal"):
        build_candidate(task.payload, {"unroll_k": 3}, TARGET)


def test_a_failing_candidate_is_recorded_and_the_tune_goes_on(task, tmp_path, monkeypatch):
    small = Task(task.key, task.name, 1, (Knob("unroll_k", (8, 2, 1)),), task.payload)

    def build(payload, config, target):
        if config["unroll_k"] == 2:
            raise KilnError("the compiler fell over")
        return build_candidate(payload, config, target)

    monkeypatch.setattr("kiln.tune.tuner.build_candidate", build)
    out = tmp_path / "r.jsonl"
    result = tune([small], TARGET, out, trials=3, executor=SerialExecutor(), repeat=1)
    records = load_records(out)
    assert records[0].config == {"unroll_k": 8}  # the default first
    errors = {r.config["unroll_k"]: r.error for r in records}
    assert set(errors) == {8, 2, 1} and errors[8] is None and errors[1] is None
    assert "the compiler fell over" in errors[2] and records[0].costs
    assert result.trials == 3 and result.states[0].best < float("inf")
    assert result.stopped == {task.key: "space exhausted"}


def _segfault_on_unroll_2(lib, payload, config, target, repeat, method):
    """measure_candidate, except that a config with unroll_k=2 reads address 0 (SIGSEGV)."""
    if config["unroll_k"] == 2:
        ctypes.string_at(0)
    return measure_candidate(lib, payload, config, target, repeat, method)


def test_a_candidate_that_segfaults_is_recorded_and_the_tune_goes_on(task, tmp_path,
                                                                     monkeypatch):
    """The default LocalExecutor measures in a worker process: the crash is the record's
    error, the other candidates are timed."""
    small = Task(task.key, task.name, 1, (Knob("unroll_k", (8, 2, 1)),), task.payload)
    monkeypatch.setattr("kiln.tune.tuner.measure_candidate", _segfault_on_unroll_2)
    out = tmp_path / "r.jsonl"
    result = tune([small], TARGET, out, trials=3, repeat=1)
    errors = {r.config["unroll_k"]: r.error for r in load_records(out)}
    assert errors[8] is None and errors[1] is None
    assert "terminated abruptly" in errors[2]
    assert result.trials == 3 and result.states[0].best < float("inf")


def test_a_resumed_tune_measures_nothing_twice(task, tmp_path, monkeypatch):
    out, first = tmp_path / "r.jsonl", tmp_path / "old.jsonl"
    tune([task], TARGET, first, trials=3, executor=SerialExecutor(), repeat=1)
    measured = []
    real = measure.measure_candidate

    def spy(lib, payload, config, target, repeat, method):
        measured.append(dict(config))
        return real(lib, payload, config, target, repeat, method)

    monkeypatch.setattr("kiln.tune.tuner.measure_candidate", spy)
    result = tune([task], TARGET, out, trials=2, resume=[first], executor=SerialExecutor(),
                  repeat=1)
    old = [dict(r.config) for r in load_records(first)]
    assert result.resumed == 3 and len(measured) == 2
    assert not any(c in old for c in measured)
    records = load_records(out)  # the old records copied, then the new ones
    assert [dict(r.config) for r in records] == old + measured
    tune([task], TARGET, out, trials=2, executor=SerialExecutor(), repeat=1)  # resumes -o
    configs = [tuple(sorted(r.config.items())) for r in load_records(out)]
    assert len(configs) == 7 == len(set(configs))


def test_tune_needs_a_budget(task, tmp_path):
    with pytest.raises(KilnError, match="number of trials or a time budget"):
        tune([task], TARGET, tmp_path / "r.jsonl")


def test_one_thread_is_timed_in_thread_cpu_time(monkeypatch):
    import time

    monkeypatch.setenv("KILN_NUM_THREADS", "1")
    assert measure.measure_clock() is time.thread_time
    monkeypatch.setenv("KILN_NUM_THREADS", "2")
    assert measure.measure_clock() is time.perf_counter


def test_one_thread_is_counted_as_the_pool_counts_it(monkeypatch):
    """The pool runs kernels on the caller whenever it has one thread: `` 1`` (as ``strtol``
    reads it), or no variable and a one-CPU affinity mask (``taskset -c 0``, a container)."""
    import time

    monkeypatch.setenv("KILN_NUM_THREADS", " 1")
    assert measure.measure_clock() is time.thread_time
    monkeypatch.delenv("KILN_NUM_THREADS")
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0})
    assert measure.measure_clock() is time.thread_time
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1})
    assert measure.measure_clock() is time.perf_counter


class _FakeKernel:
    """A kernel whose prepared call notes how many flushes had run when it was called."""

    def __init__(self, flusher):
        self.flusher, self.seen = flusher, []

    def prepare(self, *args):
        return lambda: self.seen.append(self.flusher.calls)


def test_the_flush_method_evicts_the_caches_before_every_timed_run():
    flusher = CacheFlusher(l2_bytes=64 * 1024)
    kernel = _FakeKernel(flusher)
    costs = time_kernel(kernel, [np.zeros(4, "float32")] * 2, 3, method="flush",
                        flusher=flusher)
    assert len(costs) == 3
    timed = kernel.seen[1:]  # after the warm-up call
    assert len(timed) == flusher.calls > 3
    assert timed == list(range(1, flusher.calls + 1))  # one new flush before each run
    assert flusher.buffer.nbytes == 128 * 1024
    assert np.all(flusher.buffer == flusher.calls)  # every element written by every flush


def test_the_l2_size_is_read_from_sysfs():
    assert l2_cache_bytes() >= 64 * 1024
    assert CacheFlusher().buffer.nbytes == 2 * l2_cache_bytes()


@pytest.mark.parametrize("method", ["flush", "hot"])
def test_a_real_kernel_gets_positive_times_with_each_method(task, method):
    config = list(task.configs())[-1]
    lib = build_candidate(task.payload, config, TARGET)
    result = measure_candidate(lib, task.payload, config, TARGET, repeat=2, method=method)
    assert result.error is None, result.error
    assert len(result.costs) == 2 and all(c > 0 for c in result.costs)


def test_an_unknown_measure_method_is_the_candidates_error(task):
    lib = build_candidate(task.payload, {}, TARGET)
    result = measure_candidate(lib, task.payload, {}, TARGET, method="warm")
    assert result.costs == () and "unknown measure method 'warm'" in result.error


def test_records_of_another_measure_method_are_not_resumed(task, tmp_path):
    """Hot times are not comparable with flushed ones: a flush tune measures those configs
    again and copies none of the hot records."""
    small = Task(task.key, task.name, 1, (Knob("unroll_k", (8, 2, 1)),), task.payload)
    hot, out = tmp_path / "hot.jsonl", tmp_path / "r.jsonl"
    tune([small], TARGET, hot, trials=2, executor=SerialExecutor(), repeat=1, measure="hot")
    assert {r.measure for r in load_records(hot)} == {"hot"}
    result = tune([small], TARGET, out, trials=2, resume=[hot], executor=SerialExecutor(),
                  repeat=1)
    records = load_records(out)
    assert result.resumed == 0 and len(records) == 2
    assert {r.measure for r in records} == {"flush"}
    assert [r.config for r in records] == [r.config for r in load_records(hot)]


def test_an_unknown_measure_method_is_refused_by_tune(task, tmp_path):
    with pytest.raises(KilnError, match="measure must be one of flush, hot"):
        tune([task], TARGET, tmp_path / "r.jsonl", trials=1, measure="warm")


def test_confirm_measures_a_lucky_winner_again_next_to_the_default(task, tmp_path):
    """A config whose one record is impossibly fast is measured twice more, alternating
    with the default; ranked by median, its lucky record no longer decides."""
    from kiln.driver.tuning_records import (
        TuningRecord,
        append_records,
        best_records,
        cpu_fingerprint,
    )
    from kiln.tune.confirm import confirm_best

    small = Task(task.key, task.name, 1, (Knob("unroll_k", (8, 2, 1)),), task.payload)
    out, fp = tmp_path / "r.jsonl", cpu_fingerprint()
    append_records(out, [TuningRecord(task.key, task.name, config, (cost,), None, TARGET, fp,
                                      "0", 0.0) for config, cost in
                         [({"unroll_k": 8}, 1.0), ({"unroll_k": 2}, 1e-12)]])
    added = confirm_best([small], out, TARGET, fp, "flush", SerialExecutor(), repeat=1,
                         rounds=2)
    records = load_records(out)
    assert added == 4 and len(records) == 6
    assert [r.config["unroll_k"] for r in records[2:]] == [8, 2, 8, 2]
    assert all(r.error is None and r.measure == "flush" for r in records[2:])
    assert best_records(records, TARGET, fp)[task.key].best > 1e-12
    assert confirm_best([small], out, TARGET, fp, "flush", SerialExecutor(), 1) == 0


def test_a_tune_with_confirm_reports_median_times(task, tmp_path, monkeypatch):
    """The search's winner (unroll_k=2, lucky once) is measured once more beside the default;
    the tune reports the median of its records (of two: the lower)."""
    from kiln.tune.measure import MeasureResult

    times = {8: [2.0, 2.0], 2: [1.0, 1.5], 1: [3.0]}

    def fake(lib, payload, config, target, repeat, method):
        return MeasureResult((times[config["unroll_k"]].pop(0),), None)

    monkeypatch.setattr("kiln.tune.tuner.measure_candidate", fake)
    monkeypatch.setattr("kiln.tune.confirm.measure_candidate", fake)
    small = Task(task.key, task.name, 1, (Knob("unroll_k", (8, 2, 1)),), task.payload)
    out = tmp_path / "r.jsonl"
    result = tune([small], TARGET, out, trials=3, executor=SerialExecutor(), repeat=1,
                  confirm=1)
    records = load_records(out)
    assert result.confirmed == 2 and len(records) == 5
    assert [r.config["unroll_k"] for r in records[3:]] == [8, 2]
    (state,) = result.states
    assert state.best_config == {"unroll_k": 2} and state.best == 1.0
    assert state.default_cost == 2.0


def test_a_resumed_tune_copies_every_re_measurement(task, tmp_path):
    """Records of a confirmed config come over whole: ranked by one record, the copy would
    pick unroll_k=1 (1.9 s once) over the re-measured unroll_k=2 (3.0 then 1.0)."""
    from kiln.driver.tuning_records import (
        TuningRecord,
        append_records,
        best_records,
        cpu_fingerprint,
    )

    small = Task(task.key, task.name, 1, (Knob("unroll_k", (8, 2, 1)),), task.payload)
    old, out, fp = tmp_path / "old.jsonl", tmp_path / "r.jsonl", cpu_fingerprint()
    append_records(old, [TuningRecord(task.key, task.name, {"unroll_k": k}, (cost,), None,
                                      TARGET, fp, "0", float(i))
                         for i, (k, cost) in enumerate([(8, 2.0), (2, 3.0), (1, 1.9),
                                                        (8, 2.0), (2, 1.0)])])
    result = tune([small], TARGET, out, trials=1, resume=[old], executor=SerialExecutor(),
                  repeat=1, confirm=0)
    assert result.resumed == 5 and result.trials == 0
    assert [r.to_json() for r in load_records(out)] == [r.to_json() for r in load_records(old)]
    assert best_records(load_records(out), TARGET, fp)[task.key].config == {"unroll_k": 2}
