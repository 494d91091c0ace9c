"""The tuning loop behind ``kiln tune``: the task scheduler's search, measured through an
executor, every result appended to the records file as it arrives.

:func:`tune` runs :class:`~kiln.tune.task_scheduler.TaskScheduler` (warm-up round per task,
then Ansor's gradient task choice; early stopping; trials / time budget) whose per-task
:class:`~kiln.tune.search.EvolutionarySearch` proposes candidates ranked by the learned cost
model (:mod:`kiln.tune.cost_model`) over loop-nest features of the lowered candidate
(:func:`kiln.tune.features.lowered_features`). Candidates are built in parallel and timed one
at a time through an executor (:class:`~kiln.tune.executor.LocalExecutor` by default,
:class:`~kiln.tune.ray_executor.RayExecutor` for ``--ray``) with
:func:`kiln.tune.executor.measure_with`. After each round (one :class:`~kiln.tune.
task_scheduler.TuneEvent`) its records are appended to the output file, so an interrupted tune
keeps them and resumes where it stopped: configs already measured for the same target on this
CPU (in the output file or in the ``resume`` files) are the scheduler's history, never measured
again. ``search="random"`` keeps the cost model from ever fitting (every score random): the
same loop in a random order, the baseline to compare with.

As AutoTVM's ``Tuner.tune`` (``python/tvm/autotvm/tuner/tuner.py``: next_batch →
measure_batch → callbacks (log to file, progress) → update) and MetaSchedule's
``TaskScheduler`` (``python/tvm/meta_schedule/task_scheduler/``); docs/decisions/024-tuner.md.
"""

from __future__ import annotations

import functools
import math
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass

from kiln import __version__, progress
from kiln.driver.tuning_records import (
    TuningRecord,
    append_records,
    best_records,
    config_key,
    config_times,
    cpu_fingerprint,
    load_records,
    median_record,
)
from kiln.errors import KilnError
from kiln.schedules.space import Task
from kiln.target import Target
from kiln.tune.confirm import confirm_best
from kiln.tune.executor import LocalExecutor, measure_with
from kiln.tune.features import lowered_features
from kiln.tune.in_model import InModelResult, confirm_in_model, verdict_records
from kiln.tune.measure import (
    DEFAULT_MEASURE,
    MEASURE_METHODS,
    MeasureResult,
    build_candidate,
    measure_candidate,
)
from kiln.tune.search import Measured
from kiln.tune.task_scheduler import TaskScheduler, TuneEvent
from kiln.tune.tasks import lower_candidate

#: search strategies of :func:`tune`: the learned cost model, or random scores
SEARCHES = ("model", "random")
#: successful measurements before the cost model is fitted: ``search="model"``, and never
#: (every score random) for ``search="random"``
MIN_SAMPLES = {"model": 8, "random": 10**9}
#: the share of a time budget kept for timing the choices inside the model (``model_timer``)
IN_MODEL_SHARE = 0.25
#: the most candidates per task timed inside the model (one model build per rank)
IN_MODEL_TOP = 8


@dataclass
class TaskState:
    """One task's progress: its best time (seconds) and config, the default config's time,
    and this run's new measurements."""

    task: Task
    best: float = float("inf")
    best_config: dict | None = None
    default_cost: float = float("inf")
    trials: int = 0

    def add(self, config: dict, cost: float) -> bool:
        """Take a measured time (inf: failed) into account; True if it is a new best."""
        if dict(config) == self.task.default_config():
            self.default_cost = min(self.default_cost, cost)
        if cost < self.best:
            self.best, self.best_config = cost, dict(config)
            return True
        return False


@dataclass
class TuneResult:
    """What :func:`tune` did: per-task states, new measurements, records taken from earlier
    runs (not measured again), wall seconds, why tasks stopped (task key → reason), and
    re-measurements of the winners (:func:`kiln.tune.confirm.confirm_best`)."""

    states: list[TaskState]
    trials: int
    resumed: int
    elapsed: float
    stopped: dict[str, str]
    confirmed: int = 0
    in_model: InModelResult | None = None
    stop_note: str = ""  # why the search ended before its budget (empty: it did not)
    in_model_skipped: str = ""  # why the in-model stage could not run (empty: it ran or off)

    def latency(self, default: bool = False) -> float:
        """Estimated time of the tuned kernels in one model run (seconds): Σ weight × best
        time (``default``: × the default config's time); tasks without a time count 0."""
        costs = [(s.task.weight, s.default_cost if default else s.best) for s in self.states]
        return sum(w * c for w, c in costs if c != float("inf"))


def tune(tasks: Sequence[Task], target: str, output: str | os.PathLike[str], *,
         trials: int | None = None, time_budget: float | None = None,
         resume: Sequence[str | os.PathLike[str]] = (), executor=None, repeat: int = 5,
         seed: int = 0, search: str = "model", batch_size: int = 8,
         early_stopping: int | None = None, measure: str = DEFAULT_MEASURE,
         confirm: int = 0, model_timer=None, in_model_top: int = IN_MODEL_TOP) -> TuneResult:
    """Tune ``tasks`` for ``target`` on this CPU, appending records to ``output``.

    Parameters
    ----------
    tasks : list of Task
        :func:`kiln.tune.tasks.extract_tasks`'s (each with at least one knob).
    target : str
        The target string (as given to ``extract_tasks`` and later ``kiln compile``).
    output : path
        JSON-lines records file, appended to after every round (created if missing).
    trials : int, optional
        The most candidates to measure in this run (already measured ones do not count).
    time_budget : float, optional
        Seconds; no new round starts after it (a round may end past it).
    resume : list of paths
        Earlier records files: their configs for this target and CPU are not measured again,
        and their records of these tasks are copied into ``output`` (when not already there).
    executor : optional
        A :class:`kiln.tune.executor.Executor` (default: a :class:`LocalExecutor`, closed at
        the end; one given is left open).
    repeat : int
        Timed repeats per candidate (:func:`kiln.tune.measure.measure_candidate`).
    seed : int
        Seeds the search and the scheduler's random choices.
    search : str
        ``"model"`` (the learned cost model ranks candidates) or ``"random"``.
    batch_size : int
        Candidates per round (built together, in parallel where the executor can).
    early_stopping : int, optional
        Stop a task after this many measurements without improving it.
    measure : str
        How candidates are timed (:data:`kiln.tune.measure.MEASURE_METHODS`; default
        ``flush``: caches evicted before every run). Records say it; earlier records timed
        another way are neither resumed nor copied (their times are not comparable).
    confirm : int
        After the search, measure each task's best config again next to the default until
        the best by median time has ``confirm + 1`` records
        (:func:`kiln.tune.confirm.confirm_best`; 0: not at all, ``kiln tune``'s default is
        2); the result's times are then the medians ``kiln compile`` ranks by.
    model_timer : kiln.tune.in_model.ModelTimer, optional
        Times variants of the whole model (``kiln tune``: a
        :class:`~kiln.tune.in_model.GraphModelTimer`). Then, last, each task's best
        ``in_model_top`` standalone candidates faster than its default are timed inside the
        model and only the confirmed ones are kept (:func:`kiln.tune.in_model.
        confirm_in_model`; its verdicts are appended as in-model records, which decide what
        ``kiln compile`` applies). With a ``time_budget`` the search gets
        ``1 - IN_MODEL_SHARE`` of it, and this stage what is left when the search ends
        (all of the rest when every space was exhausted early).

    Raises
    ------
    KilnError
        Neither ``trials`` nor ``time_budget`` given, an unknown ``search`` or ``measure``, a
        records file
        that cannot be read or written, or LightGBM missing (``pip install kiln[tune]``).
    """
    if trials is None and time_budget is None:
        raise KilnError("tune: give a number of trials or a time budget")
    if search not in SEARCHES:
        raise KilnError(f"tune: search must be one of {', '.join(SEARCHES)}, got {search!r}")
    if measure not in MEASURE_METHODS:
        raise KilnError(f"tune: measure must be one of {', '.join(MEASURE_METHODS)}, got "
                        f"{measure!r}")
    start = time.perf_counter()
    target = str(Target(target))
    fp = cpu_fingerprint()
    states = {t.key: TaskState(t) for t in tasks}
    history = _resume(states, target, fp, measure, output, resume)
    own = executor is None
    executor = executor or LocalExecutor()
    try:
        scheduler = TaskScheduler(
            list(tasks), measure_with(executor, build_candidate,
                                      functools.partial(measure_candidate, method=measure),
                                      target, repeat),
            featurize=lowered_features(lambda t, c: lower_candidate(t, c, packed=False)),
            history=history, batch_size=batch_size, early_stopping=early_stopping, seed=seed,
            min_samples=MIN_SAMPLES[search])
        budget = trials if trials is not None else sum(t.size() for t in tasks)
        search_budget = time_budget
        if time_budget is not None and model_timer is not None:
            search_budget = time_budget * (1 - IN_MODEL_SHARE)
        with progress.task("Tuning kernels", total=budget) as advance:
            def on_round(event: TuneEvent) -> None:
                append_records(output, [_record(event.task, m, target, fp, measure)
                                        for m in event.results])
                state = states[event.task.key]
                for m in event.results:
                    state.trials += 1
                    if state.add(m.config, m.cost if m.cost is not None else math.inf):
                        _note(state, event)
                advance(len(event.results))

            done = scheduler.tune(budget, search_budget, on_round)
        note = stop_note(done, len(tasks), time.perf_counter() - start, time_budget)
        if note:
            progress.note(note)
        confirmed = 0
        if confirm > 0:
            with progress.stage("Confirming the best configs"):
                confirmed = confirm_best(tasks, output, target, fp, measure, executor, repeat,
                                         rounds=confirm)
            _settle(states, load_records(output), target, fp, measure)
        in_model, skipped = None, ""
        if model_timer is not None:
            left = None if time_budget is None else \
                max(0.0, time_budget - (time.perf_counter() - start))
            cands = in_model_candidates(tasks, load_records(output), target, fp, measure,
                                        in_model_top)
            try:
                with progress.stage("Timing the choices inside the model"):
                    in_model = confirm_in_model(tasks, cands, model_timer, left)
            except KilnError as err:  # e.g. a model only the VM runs: the search's records stay
                skipped = f"in-model confirmation skipped ({err}); the standalone choices apply"
            else:
                append_records(output, verdict_records(tasks, in_model, target, fp, measure))
    finally:
        if own:
            executor.close()
    return TuneResult(list(states.values()), done.trials, len(history),
                      time.perf_counter() - start, done.stopped, confirmed, in_model, note, skipped)


def stop_note(done, n_tasks: int, elapsed: float, time_budget: float | None) -> str:
    """Why the search ended with budget left: ``all 24 kernels' spaces exhausted after 107 s;
    13.2 min of the budget unused by the search`` ("" when it ran to its budget, or stopped
    for another reason, e.g. ``trials``). ``done``: the scheduler's result."""
    reasons = list(done.stopped.values())
    if len(reasons) < n_tasks or time_budget is None or elapsed >= time_budget:
        return ""
    exhausted = sum(r == "space exhausted" for r in reasons)
    why = f"all {n_tasks} kernels' spaces exhausted" if exhausted == n_tasks else \
        f"every kernel stopped ({exhausted} spaces exhausted, {n_tasks - exhausted} early-stopped)"
    return f"{why} after {elapsed:.0f} s; {(time_budget - elapsed) / 60:.1f} min of the " \
        f"budget unused by the search"


def in_model_candidates(tasks: Sequence[Task], records, target: str, fp: dict, measure: str,
                        top: int) -> dict[str, list[dict]]:
    """Task key -> up to ``top`` configs faster alone than its default (by median time over
    their records; configs measured more than once first, as
    :func:`kiln.driver.tuning_records.best_records` prefers them), best first: what the
    in-model stage times. Tasks whose default has no time get none (nothing to compare)."""
    times = config_times([r for r in records if not r.in_model], target, fp, measure)
    out = {}
    for task in tasks:
        configs = times.get(task.key, {})
        default = configs.get(config_key(task.default_config()))
        if not default:
            continue
        base = median_record(default).best
        ranked = sorted(((len(rs) == 1, median_record(rs).best, c)
                         for c, rs in configs.items()
                         if c != config_key(task.default_config())))
        out[task.key] = [dict(configs[c][0].config) for _, t, c in ranked if t < base][:top]
    return {k: v for k, v in out.items() if v}


def _settle(states: dict[str, TaskState], records, target: str, fp: dict,
            measure: str) -> None:
    """Each task's best and default time as ``kiln compile`` ranks them: the median over a
    config's records, configs measured once left out once others were re-measured
    (:func:`kiln.driver.tuning_records.best_records`)."""
    records = [r for r in records if not r.in_model]  # standalone times only
    times = config_times(records, target, fp, measure)
    chosen = best_records(records, target, fp, measure)
    for state in states.values():
        configs = times.get(state.task.key)
        if not configs:
            continue
        medians = {c: median_record(rs) for c, rs in configs.items()}
        best = chosen[state.task.key]
        state.best, state.best_config = best.best, dict(best.config)
        default = medians.get(config_key(state.task.default_config()))
        state.default_cost = default.best if default else float("inf")


def _note(state: TaskState, event: TuneEvent) -> None:
    """The progress line of a task's new best time (and the model's estimated latency)."""
    model = event.estimated_latency_s
    total = f"model kernels ≈ {model * 1e3:.3f} ms" if model is not None else \
        "model kernels: not every task has a time yet"
    progress.note(f"[{event.trials} trials] {state.task.name} ×{state.task.weight}: "
                  f"{state.best * 1e6:.1f} us {state.best_config} · {total}")


def _record(task: Task, m: Measured, target: str, fp: dict, measure: str) -> TuningRecord:
    """The record of one measured candidate (``m.result``: the measure function's
    :class:`MeasureResult`, or the exception of a failed build or measurement)."""
    result = m.result
    costs = result.costs if isinstance(result, MeasureResult) and m.error is None else ()
    stamp = result.timestamp if isinstance(result, MeasureResult) else time.time()
    return TuningRecord(task.key, task.name, dict(m.config), tuple(costs), m.error, target,
                        fp, __version__, stamp, measure)


def _resume(states: dict[str, TaskState], target: str, fp: dict, measure: str, output,
            resume) -> list[tuple[str, dict, float | None]]:
    """The scheduler's history: records of these tasks measured for ``target`` on this CPU
    with the ``measure`` method in ``output`` and ``resume`` (the latter copied into
    ``output`` when not there yet), as ``(task key, config, best seconds or None)``; the
    states take their times."""

    def ours(r: TuningRecord) -> bool:  # in-model verdicts are copied, never history
        return r.target == target and dict(r.fingerprint) == fp and r.measure == measure

    mine = load_records(output) if os.path.exists(output) else []
    # every record of a config the output lacks: its re-measurements (confirm_best) too, or
    # best_records would rank the copy by one measurement again
    have = {(r.workload_key, r.config_key()) for r in mine if ours(r)}
    seen = {r.to_json() for r in mine}
    copied = []
    for path in resume:
        if os.path.exists(output) and os.path.samefile(path, output):
            continue
        for r in load_records(path):
            if (r.workload_key in states and ours(r) and r.to_json() not in seen
                    and (r.workload_key, r.config_key()) not in have):
                seen.add(r.to_json())
                copied.append(r)
    append_records(output, copied)
    history = []
    for r in mine + copied:
        state = states.get(r.workload_key)
        if state is None or not ours(r) or r.in_model:
            continue
        state.add(dict(r.config), r.best)
        history.append((r.workload_key, dict(r.config),
                        r.best if r.best != float("inf") else None))
    return history
