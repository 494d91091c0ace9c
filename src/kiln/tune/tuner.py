"""The tuning loop: propose candidates, build them, measure them, append records, stop.

:func:`tune` drives rounds over the tasks until the trial count or the time budget is spent
(or every space is exhausted). Each round asks :func:`next_configs` — the one place the
search strategy is called — for each task's next candidates, builds them with the executor's
``map_build`` (parallel), measures them with ``map_measure`` (one at a time) and appends one
record per candidate to the output file at once, so an interrupted tune resumes where it
stopped. Configs already measured for the same target on this CPU (in the output file or in the
``resume`` files) are never measured again.

The strategy here is the baseline (the default config first, then the rest of the space in a
seeded random order, tasks round-robin); the learned cost model and the evolutionary search
replace :func:`next_configs` and the task order (``kiln.tune.search``). The loop itself is
AutoTVM's ``Tuner.tune`` (``python/tvm/autotvm/tuner/tuner.py``: next_batch → measure_batch
→ callbacks (log to file, progress) → update) and MetaSchedule's ``TaskScheduler``
(``python/tvm/meta_schedule/task_scheduler/``) in their simplest form.
"""

from __future__ import annotations

import json
import os
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from kiln import __version__, progress
from kiln.errors import KilnError
from kiln.target import Target
from kiln.tune.measure import MeasureResult, build_candidate, measure_candidate
from kiln.tune.records import TuningRecord, append_records, cpu_fingerprint, load_records
from kiln.tune.space import Task

#: candidates of one task per round (built together, in parallel where the executor can)
BATCH = 2
#: the largest space enumerated and shuffled; larger ones are sampled
ENUMERATE_LIMIT = 4096


@dataclass
class TaskState:
    """One task's progress: configs measured (canonical JSON), the best time and config, the
    default config's time, and this run's new measurements."""

    task: Task
    tried: set[str] = field(default_factory=set)
    best: float = float("inf")
    best_config: dict | None = None
    default_cost: float = float("inf")
    trials: int = 0
    order: list[dict] | None = None


@dataclass
class TuneResult:
    """What :func:`tune` did: per-task states, new measurements, configs skipped because they
    were already measured, and wall seconds."""

    states: list[TaskState]
    trials: int
    resumed: int
    elapsed: float

    def latency(self, default: bool = False) -> float:
        """Estimated time of the tuned kernels in one model run (seconds): Σ weight × best
        time (``default``: × the default config's time); tasks without a time count 0."""
        costs = [(s.task.weight, s.default_cost if default else s.best) for s in self.states]
        return sum(w * c for w, c in costs if c != float("inf"))


def config_key(config) -> str:
    """A config as canonical JSON (what records are matched on)."""
    return json.dumps(dict(config), sort_keys=True)


def next_configs(state: TaskState, count: int, seed: int = 0) -> list[dict]:
    """The search strategy: up to ``count`` configs of ``state.task`` not measured yet — the
    default first, then the space in a random order seeded by ``seed`` and the workload key
    (the same order when a tune resumes)."""
    task = state.task
    if state.order is None:
        rng = random.Random(f"{seed}:{task.key}")
        if task.size() <= ENUMERATE_LIMIT:
            rest = list(task.configs())[1:]
            rng.shuffle(rest)
        else:
            rest = [{k.name: rng.choice(k.values) for k in task.space}
                    for _ in range(ENUMERATE_LIMIT)]
        state.order = [task.default_config(), *rest]
    out = []
    while state.order and len(out) < count:
        config = state.order.pop(0)
        if config_key(config) not in state.tried:
            state.tried.add(config_key(config))
            out.append(config)
    return out


class SerialExecutor:
    """The executor protocol (:class:`kiln.tune.executor.Executor`) in this process, one job
    after another: what ``kiln tune`` uses when no parallel executor is available."""

    def map_build(self, fn: Callable, jobs: Sequence[tuple]) -> list:
        return [_call(fn, job) for job in jobs]

    def map_measure(self, fn: Callable, jobs: Sequence[tuple]) -> list:
        return [_call(fn, job) for job in jobs]

    def close(self) -> None:
        pass


def _call(fn: Callable, job: tuple):
    try:
        return fn(*job)
    except Exception as err:  # noqa: BLE001 - the job's result is its error (protocol)
        return err


def default_executor():
    """Worker processes for builds when the parallel executor is installed
    (``kiln.tune.executor.LocalExecutor``), else :class:`SerialExecutor`."""
    from kiln.tune import executor

    local = getattr(executor, "LocalExecutor", None)
    return local() if local is not None else SerialExecutor()


def tune(tasks: Sequence[Task], target: str, output: str | os.PathLike[str], *,
         trials: int | None = None, time_budget: float | None = None,
         resume: Sequence[str | os.PathLike[str]] = (), executor=None, repeat: int = 5,
         seed: int = 0) -> TuneResult:
    """Tune ``tasks`` for ``target`` on this CPU, appending records to ``output``.

    Parameters
    ----------
    tasks : list of Task
        :func:`kiln.tune.tasks.extract_tasks`'s.
    target : str
        The target string (as given to ``extract_tasks`` and later ``kiln compile``).
    output : path
        JSON-lines records file, appended to (created if missing).
    trials : int, optional
        The most candidates to measure in this run (already measured ones do not count).
    time_budget : float, optional
        Seconds; no new round starts after it.
    resume : list of paths
        Earlier records files: their configs for this target and CPU are not measured again,
        and their records of these tasks are copied into ``output`` (when not already there).
    executor : optional
        A :class:`kiln.tune.executor.Executor` (default: :func:`default_executor`).
    repeat : int
        Timed repeats per candidate (:func:`kiln.tune.measure.measure_candidate`).

    Raises
    ------
    KilnError
        Neither ``trials`` nor ``time_budget`` given, or a records file that cannot be read
        or written.
    """
    if trials is None and time_budget is None:
        raise KilnError("tune: give a number of trials or a time budget")
    start = time.perf_counter()
    target = str(Target(target))
    states = [TaskState(t) for t in tasks]
    resumed = _resume(states, target, output, resume)
    own = executor is None
    executor = executor or default_executor()
    done = 0
    try:
        total = trials or sum(s.task.size() for s in states)
        with progress.task("Tuning kernels", total=total) as advance:
            while trials is None or done < trials:
                if time_budget is not None and time.perf_counter() - start >= time_budget:
                    break
                jobs = _round(states, BATCH, trials, done, seed)
                if not jobs:
                    break
                results = _measure_round(executor, jobs, target, repeat)
                append_records(output, [_record(s, c, r, target) for (s, c), r
                                        in zip(jobs, results)])
                for (state, config), result in zip(jobs, results):
                    _update(state, config, result, states)
                done += len(jobs)
                advance(len(jobs))
    finally:
        if own:
            executor.close()
    return TuneResult(states, done, resumed, time.perf_counter() - start)


def _round(states: list[TaskState], per_task: int, trials: int | None, done: int,
           seed: int) -> list[tuple[TaskState, dict]]:
    """Up to ``per_task`` next candidates of every task, one task after the other (each
    task's first before any task's second), within the trial count."""
    jobs: list[tuple[TaskState, dict]] = []
    for _ in range(per_task):
        for state in states:
            if trials is not None and done + len(jobs) >= trials:
                return jobs
            jobs += [(state, c) for c in next_configs(state, 1, seed)]
    return jobs


def _measure_round(executor, jobs, target: str, repeat: int) -> list[MeasureResult]:
    built = executor.map_build(build_candidate, [(s.task.payload, c, target) for s, c in jobs])
    ok = [k for k, b in enumerate(built) if isinstance(b, bytes)]
    measured = executor.map_measure(measure_candidate, [
        (built[k], jobs[k][0].task.payload, jobs[k][1], target, repeat) for k in ok])
    results: list[MeasureResult] = [
        MeasureResult((), f"build: {type(b).__name__}: {b}") for b in built]
    for k, m in zip(ok, measured):
        results[k] = m if isinstance(m, MeasureResult) else MeasureResult(
            (), f"measure: {type(m).__name__}: {m}")
    return results


def _record(state: TaskState, config: dict, result: MeasureResult,
            target: str) -> TuningRecord:
    return TuningRecord(state.task.key, state.task.name, config, result.costs, result.error,
                        target, cpu_fingerprint(), __version__, result.timestamp)


def _update(state: TaskState, config: dict, result: MeasureResult,
            states: list[TaskState]) -> None:
    state.trials += 1
    if config == state.task.default_config():
        state.default_cost = result.best
    if result.best < state.best:
        state.best, state.best_config = result.best, dict(config)
        model = sum(s.task.weight * s.best for s in states if s.best != float("inf"))
        progress.note(f"{state.task.name} ×{state.task.weight}: {state.best * 1e6:.1f} us "
                      f"{dict(config)} · model kernels ≈ {model * 1e3:.3f} ms")


def _resume(states: list[TaskState], target: str, output, resume) -> int:
    """Mark configs already measured for ``target`` on this CPU as tried (their best times
    taken); copy ``resume`` records of these tasks into ``output``. Returns their count."""
    fp = cpu_fingerprint()
    by_key = {s.task.key: s for s in states}
    mine = load_records(output) if os.path.exists(output) else []
    seen = {(r.workload_key, r.config_key()) for r in mine
            if r.target == target and dict(r.fingerprint) == fp}
    copied = []
    for path in resume:
        if os.path.exists(output) and os.path.samefile(path, output):
            continue
        for r in load_records(path):
            if (r.workload_key in by_key and r.target == target and dict(r.fingerprint) == fp
                    and (r.workload_key, r.config_key()) not in seen):
                seen.add((r.workload_key, r.config_key()))
                copied.append(r)
    append_records(output, copied)
    count = 0
    for r in mine + copied:
        state = by_key.get(r.workload_key)
        if state is None or r.target != target or dict(r.fingerprint) != fp:
            continue
        state.tried.add(r.config_key())
        count += 1
        if dict(r.config) == state.task.default_config():
            state.default_cost = min(state.default_cost, r.best)
        if r.best < state.best:
            state.best, state.best_config = r.best, dict(r.config)
    return count
