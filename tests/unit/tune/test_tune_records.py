"""Tuning records (kiln.driver.tuning_records) and applying them at compile time
(kiln.driver.apply_history): round trips, file errors, and records from another CPU or target
refused and reported."""

from __future__ import annotations

import json
import re

import pytest
from tune_models import dense_model

from kiln.driver.apply_history import ApplyHistoryBest
from kiln.driver.build_module import _lower_kernels, optimize, primitive_calls
from kiln.driver.tuning_records import (
    TuningRecord,
    append_records,
    best_records,
    cpu_fingerprint,
    fingerprint_id,
    load_records,
)
from kiln.errors import KilnError
from kiln.frontend import from_onnx
from kiln.target import Target
from kiln.tir.text import astext
from kiln.tune.tasks import extract_tasks, lower_candidate

TARGET = "llvm -mcpu=skylake-avx512"
FP = {"cpu": "Test CPU", "features": ["+avx2", "+fma"], "cores": 2, "threads": 1}
OTHER_FP = {**FP, "cores": 4}


def _record(key="k1", config=None, costs=(2e-6, 1e-6), error=None, target=TARGET, fp=None,
            kernel="fused_nn_dense_pack", measure="flush") -> TuningRecord:
    return TuningRecord(key, kernel, config or {"tile_y": 6}, tuple(costs), error, target,
                        fp or FP, "0.1.0", 1764000000.0, measure)


def test_a_record_round_trips_through_a_file(tmp_path):
    path = tmp_path / "r.jsonl"
    records = [_record(), _record(config={"tile_y": 8}, costs=(), error="build: boom")]
    append_records(path, records[:1])
    append_records(path, records[1:])
    assert load_records(path) == records
    line = json.loads(path.read_text().splitlines()[0])
    assert list(line) == ["workload_key", "kernel", "config", "costs", "measure", "error",
                          "target", "fingerprint", "kiln_version", "timestamp"]
    assert line["measure"] == "flush"
    assert records[0].best == 1e-6 and records[1].best == float("inf")


def test_an_append_after_a_torn_line_starts_a_new_line(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text(_record().to_json()[:40])
    append_records(path, [_record()])
    with pytest.raises(KilnError, match=r"r.jsonl:1: not a tuning record \(bad JSON"):
        load_records(path)
    assert TuningRecord.from_json(path.read_text().splitlines()[1]) == _record()


@pytest.mark.parametrize("line, message", [
    ("[1, 2]", "not a tuning record"),
    ('{"workload_key": "k"}', "tuning record without kernel, config"),
    (_record().to_json().replace('"costs": [', '"costs": ["x", '), "wrong type"),
])
def test_a_bad_line_names_the_file_and_line(tmp_path, line, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(_record().to_json() + "\n\n" + line + "\n")
    with pytest.raises(KilnError, match=rf"bad.jsonl:3: .*{message}"):
        load_records(path)


def test_a_missing_records_file_is_a_kiln_error(tmp_path):
    with pytest.raises(KilnError, match="cannot read tuning records .*nope.jsonl"):
        load_records(tmp_path / "nope.jsonl")


def test_a_line_without_a_measure_field_was_timed_hot():
    """Records written before the field existed were timed back to back on warm data."""
    line = json.loads(_record().to_json())
    del line["measure"]
    assert TuningRecord.from_json(json.dumps(line)).measure == "hot"


def test_best_records_never_compare_times_of_two_measure_methods():
    hot = _record(costs=(1e-9,), measure="hot", config={"tile_y": 8})
    flushed = _record(costs=(1e-6,))
    assert best_records([hot, flushed], TARGET, FP) == {"k1": flushed}
    assert best_records([hot, flushed], TARGET, FP, measure="hot") == {"k1": hot}


def test_best_records_take_the_fastest_error_free_record_of_this_target_and_cpu():
    fast, slow = _record(costs=(3e-6, 1e-6)), _record(config={"tile_y": 8}, costs=(2e-6,))
    others = [_record(costs=(1e-9,), error="wrong result"), _record(costs=(1e-9,), fp=OTHER_FP),
              _record(costs=(1e-9,), target="llvm")]
    assert best_records([slow, *others, fast], TARGET, FP) == {"k1": fast}


def test_a_config_is_ranked_by_its_median_time_not_its_luckiest_record():
    lucky = [_record(costs=(1e-9,)), _record(costs=(3e-6,)), _record(costs=(4e-6,))]
    steady = [_record(config={"tile_y": 8}, costs=(2e-6,)) for _ in range(2)]
    best = best_records([*lucky, *steady], TARGET, FP)["k1"]
    assert best.config == {"tile_y": 8} and best.best == 2e-6
    assert best_records(lucky, TARGET, FP)["k1"].best == 3e-6  # the median record


def test_once_configs_are_re_measured_a_config_measured_once_is_not_chosen():
    """The tuner's confirmation re-measures the winners next to the default; a config
    measured once (at another moment) no longer beats their medians."""
    default = [_record(config={"tile_y": 4}, costs=(c,)) for c in (5e-6, 6e-6, 7e-6)]
    once = _record(config={"tile_y": 6}, costs=(1e-6,))
    assert best_records([*default, once], TARGET, FP)["k1"].config == {"tile_y": 4}
    assert best_records([default[0], once], TARGET, FP)["k1"].config == {"tile_y": 6}


def test_the_fingerprint_names_this_cpu():
    fp = cpu_fingerprint()
    assert set(fp) == {"cpu", "features", "cores", "threads"}
    assert fp["cores"] >= 1 and isinstance(fp["cpu"], str) and fp["features"]


@pytest.mark.parametrize("env, threads", [("1", 1), ("2", 2), ("7", 7), ("999", 256),
                                          ("", None), ("0", None), ("2x", None),
                                          ("+3", 3), (" 4", 4), ("5 ", None), ("-1", None),
                                          ("\u00b2", None), ("\u0663", None)])
def test_the_fingerprint_names_the_kernel_threads_as_the_runtime_counts_them(
        monkeypatch, env, threads):
    """KILN_NUM_THREADS when a positive integer (capped at the pool's 256), else the CPUs of
    the affinity mask: backend.c's team size, so a record tuned at 1 thread is not applied
    to a build whose library will run 2."""
    import os

    monkeypatch.setenv("KILN_NUM_THREADS", env)
    assert cpu_fingerprint()["threads"] == (threads or len(os.sched_getaffinity(0)))
    monkeypatch.delenv("KILN_NUM_THREADS")
    assert cpu_fingerprint()["threads"] == len(os.sched_getaffinity(0))


def test_the_fingerprint_id_is_stable_and_separates_cpus():
    """The id names Ray's measuring-node resource (kiln.tune.ray_executor.resource_name)."""
    fp = cpu_fingerprint()
    assert fingerprint_id(fp) == fingerprint_id(dict(reversed(list(fp.items()))))
    assert len(fingerprint_id(fp)) == 12
    assert fingerprint_id(fp) != fingerprint_id({**fp, "cores": fp["cores"] + 1})
    assert fingerprint_id(fp) != fingerprint_id({**fp, "features": fp["features"][1:]})


def _model():
    return from_onnx(dense_model())


def _text(func) -> str:
    return re.sub(r"(?<=[A-Za-z])_\d+(?=\b|_)", "_N", astext(func))


def _build_kernels(tuning: ApplyHistoryBest, target: str = TARGET) -> list:
    """The kernels ``kiln.build`` lowers for the model, with ``tuning`` (no codegen)."""
    mod, params = _model()
    tgt = Target(target)
    tuning.bind(str(tgt))
    with tgt:
        return _lower_kernels(primitive_calls(optimize(mod["main"], params)),
                              tuning=tuning)[0]


def _dense_task():
    mod, params = _model()
    (task,) = extract_tasks(mod, params, TARGET)
    config = next(c for c in task.configs() if c["unroll_k"] != task.default_config()["unroll_k"])
    return task, config


def test_a_record_of_this_cpu_and_target_is_applied():
    task, config = _dense_task()
    tuning = ApplyHistoryBest([_record(task.key, config)], fingerprint=FP)
    (kernel,) = _build_kernels(tuning)
    assert _text(kernel) == _text(lower_candidate(task, config))
    assert _text(kernel) != _text(lower_candidate(task, {}))
    assert tuning.summary() == "tuning records: 1 of 1 kernels tuned"


@pytest.mark.parametrize("record, why", [
    ({"fp": OTHER_FP}, "other CPU"),
    ({"fp": {**FP, "threads": 2}}, "other threads"),
    ({"fp": {k: v for k, v in FP.items() if k != "threads"}}, "no thread count"),
    ({"target": "llvm -mcpu=haswell"}, "other target: records for 'llvm -mcpu=haswell', this "
                                       f"build is for {TARGET!r}"),
    ({"error": "wrong result"}, "failed"),
    ({"key": "0" * 32}, "other workload: the records are for other kernels or shapes"),
    ({"config": {"unroll_k": 3}}, "stale"),
    ({"measure": "hot"}, "other measure"),
])
def test_a_record_of_another_cpu_or_target_is_refused_and_reported(record, why):
    task, config = _dense_task()
    args = {"key": task.key, "config": config, **record}
    if "target" in record:  # the same kernel's key for that target
        from kiln.driver.apply_history import workload_key

        args["key"] = workload_key(task.payload.body, record["target"])
    tuning = ApplyHistoryBest([_record(**args)], fingerprint=FP)
    (kernel,) = _build_kernels(tuning)
    assert _text(kernel) == _text(lower_candidate(task, {}))  # the default schedule
    assert tuning.summary() == (f"tuning records: 0 of 1 kernels tuned; 1 fell back to "
                                f"default (1 {why})")


def test_empty_records_say_there_is_no_record():
    tuning = ApplyHistoryBest([], fingerprint=FP)
    _build_kernels(tuning)
    assert tuning.summary() == ("tuning records: 0 of 1 kernels tuned; 1 fell back to default "
                                "(1 no record)")


def test_records_of_static_shapes_on_a_symbolic_kernel_say_the_shapes_are_symbolic():
    """kiln tune times static shapes only: a symbolic build of the same model gets none of
    its records, and the summary says that it is the shapes, not a missing record."""
    import kiln

    task, config = _dense_task()
    model = dense_model()
    for value in (model.graph.input[0], model.graph.output[0]):
        value.type.tensor_type.shape.dim[0].dim_param = "rows"
    mod, params = from_onnx(model)
    tuning = ApplyHistoryBest([_record(task.key, config)], fingerprint=FP)
    kiln.build(mod, TARGET, params, tuning_records=tuning)
    assert tuning.summary() == (
        "tuning records: 0 of 1 kernels tuned; 1 fell back to default (1 symbolic shapes: "
        "records are for static shapes, these kernels' shapes are symbolic; compile with "
        "--input-shape NAME:SHAPE at the tuned shapes)")


def test_a_tuned_build_never_shares_a_compile_cache_entry_with_the_untuned(tmp_path,
                                                                         monkeypatch):
    """The cache is keyed by the kernel's code (LLVM IR text): a config that changes the
    loop nest makes another entry."""
    import kiln

    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("KILN_NO_CACHE", raising=False)
    task, config = _dense_task()
    mod, params = _model()
    kiln.build(mod, TARGET, params)
    entries = set((tmp_path / "cache" / "objects").glob("*.llvm"))
    tuning = ApplyHistoryBest([_record(task.key, config)], fingerprint=FP)
    kiln.build(mod, TARGET, params, tuning_records=tuning)
    assert tuning.summary() == "tuning records: 1 of 1 kernels tuned"
    tuned = set((tmp_path / "cache" / "objects").glob("*.llvm")) - entries
    assert entries and tuned
