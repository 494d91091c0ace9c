"""The tuner's in-model stage (kiln.tune.in_model) and its budget (issue 32): choices are kept
only where the model runs faster with them, the defaults when the tuned model as a whole is
not faster, in-model verdicts decide what compile applies, and the search's budget loop goes
on while budget and untried candidates remain. Structural: fake model timers and clocks, no
timing assertions."""

from __future__ import annotations

import pytest

from kiln.driver.tuning_records import (
    TuningRecord,
    best_records,
    config_times,
    load_records,
)
from kiln.errors import KilnError
from kiln.schedules.space import Knob, Task
from kiln.tune.in_model import VariantTimes, confirm_in_model, verdict_records

FP = {"cpu": "test", "threads": 1}
TARGET = "llvm"


def _task(key: str) -> Task:
    return Task(key, f"kernel_{key}", 1, (Knob("tile_ow", (4, 1, 2, 8)),))


class FakeModel:
    """A model timer: each task's in-model seconds per config (``per_config[key][tile_ow]``),
    the model's total their sum plus ``extra`` (seconds, per variant's kept config set: lets a
    test make the whole model slower than its kernels say). Records what it was asked."""

    def __init__(self, per_config, extra=lambda variant: 0.0):
        self.per_config = per_config
        self.extra = extra
        self.calls: list[list[dict]] = []

    def __call__(self, variants, passes):
        self.calls.append([dict(v) for v in variants])
        out = []
        for v in variants:
            per_task = {k: [costs[v[k]["tile_ow"] if k in v else 4]] * passes
                        for k, costs in self.per_config.items()}
            total = sum(t[0] for t in per_task.values()) + self.extra(v)
            out.append(VariantTimes([total] * passes, per_task))
        return out


def test_drops_a_kernel_slower_in_the_model_and_keeps_a_faster_one():
    a, b = _task("a"), _task("b")
    model = FakeModel({"a": {4: 1e-3, 1: 0.8e-3, 2: 1.2e-3},   # a's candidate: faster
                       "b": {4: 1e-3, 1: 1.3e-3, 2: 1.1e-3}})  # b's candidates: slower
    result = confirm_in_model([a, b], {"a": [{"tile_ow": 1}], "b": [{"tile_ow": 1}]}, model,
                              passes=3)
    assert result.kept == {"a": {"tile_ow": 1}}
    assert result.verdicts["b"][0] == b.default_config()  # "default wins" for b
    assert result.verdicts["a"][0] == {"tile_ow": 1}
    assert result.considered == 2 and not result.defaults_kept
    assert result.tuned_s < result.default_s
    assert model.calls[-1] == [{}, {"a": {"tile_ow": 1}}]  # the whole model, kept choices only
    assert "kept 1 of 2 kernels' choices" in result.summary()


def test_the_defaults_stay_when_the_tuned_model_is_not_faster():
    a = _task("a")
    # the kernel is faster in its node, but the model with it is slower (its neighbours pay)
    model = FakeModel({"a": {4: 1e-3, 1: 0.8e-3}},
                      extra=lambda v: 0.5e-3 if "a" in v else 0.0)
    result = confirm_in_model([a], {"a": [{"tile_ow": 1}]}, model, passes=2)
    assert result.defaults_kept and result.kept == {}
    assert result.verdicts["a"][0] == a.default_config()
    assert result.tuned_s == result.default_s
    assert "defaults kept" in result.summary() and "kept 0 of 1" in result.summary()


def test_a_kernel_that_is_not_faster_again_in_the_whole_model_check_is_dropped():
    a, b = _task("a"), _task("b")

    class Lucky(FakeModel):  # b's candidate was lucky in its round: slower in every later call
        def __call__(self, variants, passes):
            if self.calls:
                self.per_config["b"][1] = 1.1e-3
            return super().__call__(variants, passes)

    model = Lucky({"a": {4: 1e-3, 1: 0.8e-3}, "b": {4: 1e-3, 1: 0.9e-3}})
    result = confirm_in_model([a, b], {"a": [{"tile_ow": 1}], "b": [{"tile_ow": 1}]}, model,
                              passes=2)
    assert result.kept == {"a": {"tile_ow": 1}}
    assert result.verdicts["b"][0] == b.default_config()
    # round 0, the check with both (b lost its second sample), the check with a alone
    assert [c[1] for c in model.calls] == [{"a": {"tile_ow": 1}, "b": {"tile_ow": 1}},
                                           {"a": {"tile_ow": 1}, "b": {"tile_ow": 1}},
                                           {"a": {"tile_ow": 1}}]
    assert "kept 1 of 2" in result.summary()


def test_later_rounds_run_only_while_the_budget_lasts():
    a = _task("a")
    now = [0.0]

    class Slow(FakeModel):
        def __call__(self, variants, passes):
            now[0] += 10.0
            return super().__call__(variants, passes)

    cands = {"a": [{"tile_ow": 1}, {"tile_ow": 2}, {"tile_ow": 8}]}
    costs = {"a": {4: 1e-3, 1: 0.95e-3, 2: 0.7e-3, 8: 0.5e-3}}
    # no budget: only round 0 (the best standalone candidates)
    assert confirm_in_model([a], cands, Slow(costs), None, clock=lambda: now[0]).rounds == 1
    # 25 s: round 0 took 10 s, round 1 fits (10 + 10 <= 25), round 2 does not (20 + 10 > 25)
    res = confirm_in_model([a], cands, Slow(costs), 25.0, clock=lambda: now[0])
    assert res.rounds == 2 and res.kept == {"a": {"tile_ow": 2}}
    # enough budget: every rank is timed, the in-model best of them wins
    res = confirm_in_model([a], cands, Slow(costs), 1000.0, clock=lambda: now[0])
    assert res.rounds == 3 and res.kept == {"a": {"tile_ow": 8}}


def test_bad_arguments():
    with pytest.raises(KilnError, match="passes"):
        confirm_in_model([_task("a")], {}, FakeModel({}), passes=0)
    with pytest.raises(KilnError, match="unknown tasks"):
        confirm_in_model([_task("a")], {"zz": [{"tile_ow": 1}]}, FakeModel({}))


def _rec(key, tile, cost, in_model=False):
    return TuningRecord(key, "k", {"tile_ow": tile}, (cost,), None, TARGET, FP, "0", 1.0,
                        "flush", in_model)


def test_in_model_verdicts_decide_what_compile_applies(tmp_path):
    a = _task("a")
    records = [_rec("a", 4, 2e-3), _rec("a", 1, 1e-3)]
    assert best_records(records, TARGET, FP)["a"].config == {"tile_ow": 1}
    result = confirm_in_model([a], {"a": [{"tile_ow": 1}]},
                              FakeModel({"a": {4: 1e-3, 1: 1.2e-3}}), passes=2)
    verdicts = verdict_records([a], result, TARGET, FP, "flush")
    assert [r.in_model for r in verdicts] == [True]
    path = tmp_path / "r.jsonl"
    from kiln.driver.tuning_records import append_records

    append_records(path, records + verdicts)
    back = load_records(path)
    assert back[-1].in_model and not back[0].in_model  # the flag survives the file
    assert "in_model" not in back[0].to_json()  # candidates' lines are as before
    assert best_records(back, TARGET, FP)["a"].config == {"tile_ow": 4}  # default wins
    # verdict times are the whole model's: not among the standalone times
    assert all(not r.in_model for rs in config_times(back, TARGET, FP)["a"].values()
               for r in rs)
    # a later verdict replaces an earlier one
    later = _rec("a", 1, 0.9e-3, in_model=True)
    assert best_records(back + [later], TARGET, FP)["a"].config == {"tile_ow": 1}


def test_in_model_candidates_are_the_standalone_winners_over_the_default():
    from kiln.tune.tuner import in_model_candidates

    a, b = _task("a"), _task("b")
    records = [_rec("a", 4, 2e-3), _rec("a", 1, 1e-3), _rec("a", 2, 1.5e-3),
               _rec("a", 8, 3e-3), _rec("b", 4, 1e-3), _rec("b", 1, 2e-3),
               _rec("a", 1, 9e-3, in_model=True)]  # a verdict's time is not a candidate's
    cands = in_model_candidates([a, b], records, TARGET, FP, "flush", top=8)
    assert cands == {"a": [{"tile_ow": 1}, {"tile_ow": 2}]}  # b: its default is fastest
    assert in_model_candidates([a], records, TARGET, FP, "flush", top=1) == \
        {"a": [{"tile_ow": 1}]}


# ---------------------------------------------------------------- the search's budget


def _budget_task(key, n):
    return Task(key, key, 1, (Knob("tile", tuple(range(1, n + 1))),))


def test_the_budget_loop_goes_on_while_budget_and_candidates_remain():
    pytest.importorskip("lightgbm", reason="the cost model needs lightgbm")
    from kiln.tune.task_scheduler import TaskScheduler
    from kiln.tune.tuner import stop_note

    now = [0.0]

    def measure(batch):
        now[0] += len(batch)  # one "second" a candidate
        return [1e-3 * c["tile"] for _, c in batch]

    tasks = [_budget_task("a", 40), _budget_task("b", 40)]
    sched = TaskScheduler(tasks, measure, batch_size=4, clock=lambda: now[0])
    done = sched.tune(trials=10**6, time_budget_s=30.0)
    assert 30 <= done.trials < 80  # to the budget, not past the spaces, not stopped early
    assert done.stopped == {}
    assert stop_note(done, len(tasks), done.elapsed_s, 30.0) == ""


def test_the_budget_loop_stops_when_every_space_is_exhausted_and_says_so():
    pytest.importorskip("lightgbm", reason="the cost model needs lightgbm")
    from kiln.tune.task_scheduler import TaskScheduler
    from kiln.tune.tuner import stop_note

    now = [0.0]

    def measure(batch):
        now[0] += len(batch)
        return [1e-3 * c["tile"] for _, c in batch]

    tasks = [_budget_task("a", 6), _budget_task("b", 5)]
    done = TaskScheduler(tasks, measure, batch_size=4, clock=lambda: now[0]).tune(
        trials=10**6, time_budget_s=900.0)
    assert done.trials == 11  # every config of both spaces, once
    assert set(done.stopped.values()) == {"space exhausted"}
    note = stop_note(done, len(tasks), 107.0, 900.0)
    assert note == ("all 2 kernels' spaces exhausted after 107 s; 13.2 min of the budget "
                    "unused by the search")


def test_the_graph_model_timer_times_each_task_inside_the_built_model():
    from tune_models import conv_model

    from kiln.driver.tuning_records import cpu_fingerprint
    from kiln.frontend import from_onnx
    from kiln.tune.in_model import GraphModelTimer
    from kiln.tune.tasks import extract_tasks

    mod, params = from_onnx(conv_model(16, 6))
    (task,) = extract_tasks(mod, params, TARGET)
    other = next(c for c in task.configs() if c != task.default_config())
    timer = GraphModelTimer(mod, params, TARGET, cpu_fingerprint(), "flush")
    try:
        base, tuned = timer([{}, {task.key: other}], 3)
        assert len(timer._built) == 2  # two builds: the defaults and the variant
        for v in (base, tuned):
            assert len(v.total) == 3 and all(t > 0 for t in v.total)
            assert len(v.per_task[task.key]) == 3  # the conv's node, found by workload key
            assert all(0 < k <= t for k, t in zip(v.per_task[task.key], v.total))
        timer([{}], 1)
        assert len(timer._built) == 2  # built variants are reused
    finally:
        timer.close()
    assert "no kernel had a choice" in confirm_in_model([task], {}, timer).summary()


def test_tune_appends_the_verdicts_and_survives_a_model_it_cannot_time(tmp_path):
    pytest.importorskip("lightgbm", reason="the cost model needs lightgbm")
    from tune_models import conv_model

    from kiln.driver.tuning_records import append_records, cpu_fingerprint
    from kiln.frontend import from_onnx
    from kiln.tune.tasks import extract_tasks
    from kiln.tune.tuner import tune

    mod, params = from_onnx(conv_model(16, 6))
    (task,) = extract_tasks(mod, params, TARGET)
    other = next(c for c in task.configs() if c != task.default_config())
    fp = cpu_fingerprint()
    earlier = tmp_path / "earlier.jsonl"  # a finished search: `other` is faster alone
    append_records(earlier, [TuningRecord(task.key, task.name, c, (t,), None, TARGET, fp, "0",
                                          1.0, "flush") for c, t in
                             ((task.default_config(), 2e-3), (other, 1e-3))])

    def broken(variants, passes):
        raise KilnError("in-model confirmation needs the graph executor")

    out = tmp_path / "r.jsonl"
    result = tune([task], TARGET, out, trials=0, resume=[earlier], model_timer=broken)
    assert "in-model confirmation skipped" in result.in_model_skipped
    assert not any(r.in_model for r in load_records(out))
    # the other config is slower in the model: the verdict keeps the default
    slower = {task.key: [3e-3]}

    def in_model(variants, passes):
        return [VariantTimes([1e-3] * passes, {task.key: [1e-3] * passes}) if not v else
                VariantTimes([3e-3] * passes, {task.key: slower[task.key] * passes})
                for v in variants]

    result = tune([task], TARGET, out, trials=0, resume=[earlier], model_timer=in_model)
    assert result.in_model.considered == 1 and result.in_model.kept == {}
    (verdict,) = [r for r in load_records(out) if r.in_model]
    assert verdict.config == task.default_config()
    assert best_records(load_records(out), TARGET, fp)[task.key].config == task.default_config()
