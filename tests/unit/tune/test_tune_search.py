"""Evolutionary search and the task scheduler (kiln.tune.search, kiln.tune.task_scheduler)
on synthetic run times: they find the optimum in fewer trials than exhaustive search, respect
the trial and time budgets, never measure a candidate twice, and resume from history."""

from __future__ import annotations

import numpy as np
import pytest

from kiln.errors import KilnError

pytest.importorskip("lightgbm", reason="the cost model needs lightgbm (pip install kiln[tune])")

from kiln.driver.tuning_records import config_key
from kiln.schedules.space import Knob, Task
from kiln.tune.task_scheduler import TaskScheduler


def _task(key="conv", weight=1, sizes=(8, 8, 4)):
    space = tuple(Knob(f"k{i}", tuple(2 ** j for j in range(n))) for i, n in enumerate(sizes))
    return Task(key, key, weight, space)


def _cost(config, optimum=(16, 4, 2), scale=1e-3):
    """A bowl in log2 of the knob values, minimum ``scale`` seconds at ``optimum``."""
    d = [np.log2(config[f"k{i}"]) - np.log2(o) for i, o in enumerate(optimum)]
    return scale * (1.0 + d[0] ** 2 + 0.5 * d[1] ** 2 + 2.0 * abs(d[2]) + 0.1 * d[0] * d[1])


class Recorder:
    """A measure function over :func:`_cost` that remembers every candidate it saw."""

    def __init__(self, cost=_cost, fail=()):
        self.seen: list[tuple[str, str]] = []
        self.cost = cost
        self.fail = set(fail)

    def __call__(self, batch):
        out = []
        for task, config in batch:
            self.seen.append((task.key, config_key(config)))
            out.append(RuntimeError("wrong result") if config_key(config) in self.fail
                       else self.cost(config))
        return out


def _trials_to_optimum(task, seed, **search_options):
    best = min(_cost(c) for c in task.configs())
    found = []

    def stop_at_optimum(event):
        if event.best[task.key] == best and not found:
            found.append(event.trials)

    measure = Recorder()
    sched = TaskScheduler([task], measure, seed=seed, batch_size=8,
                          search_options=search_options)
    sched.tune(trials=task.size() // 2, callback=stop_at_optimum)
    return found[0] if found else task.size()


def test_finds_the_optimum_faster_than_exhaustive():
    task = _task()  # 256 candidates
    trials = [_trials_to_optimum(task, seed) for seed in range(4)]
    # exhaustive in a random order needs 128 on average; the model does much better
    assert np.mean(trials) < 0.3 * task.size(), trials


def test_evolution_finds_the_optimum_of_a_larger_space():
    task = _task(sizes=(16, 16, 8, 8))  # 16384 candidates: evolved, not enumerated
    space = task.size()

    def cost4(config):
        return _cost(config) * (1 + 0.2 * abs(np.log2(config["k3"]) - 3))

    best = min(cost4(c) for c in task.configs())
    sched = TaskScheduler([task], Recorder(cost4), seed=0, batch_size=16,
                          search_options={"population_size": 48, "num_generations": 3})
    result = sched.tune(trials=160)  # 1 % of the space
    assert result.trials == 160 < space
    assert result.best[task.key].cost <= 1.05 * best


def test_never_remeasures_and_respects_trials():
    task = _task(sizes=(4, 4, 2))  # 32 candidates
    measure = Recorder()
    result = TaskScheduler([task], measure, batch_size=5, seed=3).tune(trials=20)
    assert result.trials == len(measure.seen) == 20
    assert len(set(measure.seen)) == 20
    first = measure.seen[0][1]
    assert first == config_key(task.default_config())  # the default rule is candidate 0
    # past the space: stops when exhausted, each candidate once
    measure = Recorder()
    result = TaskScheduler([task], measure, batch_size=7).tune(trials=100)
    assert result.trials == 32 == len(set(measure.seen))
    assert result.stopped[task.key] == "space exhausted"


def test_resume_skips_history():
    task = _task(sizes=(4, 4, 2))
    configs = list(task.configs())
    history = [(task.key, c, _cost(c)) for c in configs[:10]]
    history.append((task.key, configs[10], None))  # failed earlier: not retried either
    history.append(("other-task", configs[11], 1.0))  # ignored
    history.append((task.key, dict(configs[12], k0=3), 1e-9))  # not a legal value: ignored
    history.append((task.key, dict(configs[13], old_knob=1), 1e-9))  # another space: ignored
    measure = Recorder()
    sched = TaskScheduler([task], measure, history=history, batch_size=4)
    assert sched.best_times()[task.key] == min(_cost(c) for c in configs[:10])
    sched.tune(trials=100)
    done = {config_key(c) for c in configs[:11]}
    assert not done & {k for _, k in measure.seen}
    assert len(measure.seen) == 32 - 11


def test_time_budget_with_a_fake_clock():
    now = [0.0]

    def slow(batch):
        now[0] += 1.0 * len(batch)  # one "second" per candidate
        return [_cost(c) for _, c in batch]

    task = _task()
    result = TaskScheduler([task], slow, batch_size=4, clock=lambda: now[0]).tune(
        trials=1000, time_budget_s=10.0)
    assert result.trials == 12  # rounds start at 0, 4, 8 s; the one at 12 s does not
    assert result.elapsed_s == 12.0


def test_errors_are_recorded_and_early_stopping():
    task = _task(sizes=(4, 4, 2))
    bad = config_key(task.default_config())
    measure = Recorder(fail=[bad])
    events = []
    sched = TaskScheduler([task], measure, batch_size=4, early_stopping=8)
    result = sched.tune(trials=32, callback=events.append)
    first = events[0].results[0]
    assert first.cost is None and "RuntimeError: wrong result" in first.error
    assert result.stopped[task.key] == "no improvement in 8 trials"
    assert result.trials < 32
    # flat costs: nothing improves after the first round
    flat = TaskScheduler([_task("flat")], lambda b: [1e-3] * len(b), batch_size=4,
                         early_stopping=4).tune(trials=100)
    assert flat.trials == 8


def test_scheduler_spends_trials_on_the_heavy_task():
    heavy, light = _task("heavy", weight=20), _task("light", weight=1)
    measure = Recorder()
    events = []
    result = TaskScheduler([heavy, light], measure, batch_size=4, seed=1).tune(
        trials=64, callback=events.append)
    counts = {k: sum(1 for key, _ in measure.seen if key == k) for k in ("heavy", "light")}
    assert [e.task.key for e in events[:2]] == ["heavy", "light"]  # round-robin warm-up
    assert counts["heavy"] > 2 * counts["light"], counts
    last = events[-1]
    assert last.trials == result.trials == 64
    assert last.estimated_latency_s == pytest.approx(
        20 * last.best["heavy"] + last.best["light"])


def test_gradient_prefers_the_larger_expected_gain():
    a, b = _task("a", weight=1), _task("b", weight=1)
    history = [("a", a.default_config(), 4e-3), ("b", b.default_config(), 1e-3)]
    sched = TaskScheduler([a, b], Recorder(), history=history)
    sched.rounds_of.update(a=1, b=1)
    assert sched.gradient("a") < sched.gradient("b") < 0  # a is slower: more to gain


def test_bad_arguments():
    with pytest.raises(KilnError, match="no tasks"):
        TaskScheduler([], Recorder())
    with pytest.raises(KilnError, match="duplicate"):
        TaskScheduler([_task(), _task()], Recorder())
    with pytest.raises(KilnError, match="batch_size"):
        TaskScheduler([_task()], Recorder(), batch_size=0)
    with pytest.raises(KilnError, match="no knobs"):
        TaskScheduler([Task("x", "x", 1, ())], Recorder())
    with pytest.raises(KilnError, match="2 results for 1"):
        TaskScheduler([_task()], lambda b: [1.0, 2.0], batch_size=1).tune(trials=1)


def _lower_matmul(task, config):
    """A real lowering per config: the matmul's column loop split by ``split``, the row loop
    parallel if ``parallel``; ``vectorize`` = 1 asks to vectorize the split loop, which holds
    the reduction, so the schedule primitive refuses (ScheduleError)."""
    from kiln.schedules import primitives as P
    from kiln.tir import te
    from kiln.tir.lower import Schedule, lower
    from kiln.tir.transform.simplify import simplify

    a = te.placeholder((32, 16), "float32", "a")
    b = te.placeholder((16, 32), "float32", "b")
    r = te.reduce_axis(16, "k")
    c = te.compute((32, 32), lambda i, j: te.sum(a[i, r.var] * b[r.var, j], [r]), name="c")
    func = simplify(lower(Schedule(c), [a, b], "mm"))
    rows = P.top_level_nests(func)[0]
    cols = rows.body
    if config["split"] > 1:
        func, _, inner = P.split(func, cols, config["split"])
        if config["vectorize"]:
            func = P.vectorize(func, inner)
    if config["parallel"]:
        func = P.parallel(func, P.top_level_nests(func)[0])
    return func


def test_search_on_features_of_real_lowerings():
    from kiln.tune.features import lowered_features

    task = Task("mm", "mm", 1, (Knob("split", (1, 2, 4, 8, 16)), Knob("parallel", (0, 1)),
                                Knob("vectorize", (0, 1))))

    def cost(config):
        return 1e-3 * (1 + abs(np.log2(config["split"]) - 2)) * (2 - config["parallel"])

    measure = Recorder(cost)
    featurize = lowered_features(_lower_matmul)
    rows = {config_key(c): featurize(task, c) for c in task.configs() if not c["vectorize"]}
    assert len({r.tobytes() for r in rows.values()}) == len(rows)  # schedules are told apart
    result = TaskScheduler([task], measure, featurize=featurize, batch_size=4).tune(trials=20)
    assert result.best[task.key].config == {"split": 4, "parallel": 1, "vectorize": 0}
    # the configs the schedule refuses (vectorize a split loop) are never measured: 12 valid
    # ones (with split 1 nothing is vectorized), then the space is exhausted
    assert result.trials == 12 == len(set(measure.seen))
    assert all('"vectorize": 0' in key or '"split": 1' in key for _, key in measure.seen)
    assert result.stopped[task.key] == "space exhausted"


class _Result:
    """The shape of ``kiln.tune.measure.MeasureResult``: every repeat, ``best``, ``error``."""

    def __init__(self, costs, error=None):
        self.costs, self.error = costs, error

    @property
    def best(self):
        return min(self.costs) if self.costs and self.error is None else float("inf")


def test_measure_results_with_repeats_are_read_and_kept():
    task = _task(sizes=(2, 2, 1))
    outcomes = {0: _Result((3e-3, 2e-3)), 1: _Result((), "wrong result: max error 0.5"),
                2: _Result((1e-3,)), 3: _Result((5e-3,))}
    events = []
    sched = TaskScheduler([task], lambda b: [outcomes[i] for i in range(len(b))],
                          batch_size=4)
    result = sched.tune(trials=4, callback=events.append)
    got = events[0].results
    assert [m.cost for m in got] == [2e-3, None, 1e-3, 5e-3]
    assert got[1].error == "wrong result: max error 0.5"
    assert got[0].result is outcomes[0]  # the full result, for the records
    assert result.best[task.key].cost == 1e-3


def test_tasks_of_one_schedule_template_share_a_cost_model():
    a, b = _task("conv-a"), _task("conv-b")
    other = Task("dense", "dense", 1, (Knob("tile", (1, 2, 4)),))
    sched = TaskScheduler([a, b, other], Recorder(lambda c: 1e-3 * (1 + len(c))))
    assert len(sched.models) == 2
    assert sched.searches["conv-a"].scorer == sched.searches["conv-b"].scorer
    assert sched.searches["conv-a"].scorer != sched.searches["dense"].scorer
    per_task = TaskScheduler([a, b], Recorder(), group_of=lambda t: t.key)
    assert len(per_task.models) == 2
