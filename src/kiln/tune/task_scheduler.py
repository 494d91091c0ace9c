"""The task scheduler: which task gets the next round of measurements, until the budget ends.

The objective is the model's estimated latency ``Σ_i weight_i × best_time_i`` over its tasks.
Every task first gets one round (round-robin warm-up); after that each round goes to the task
whose next round is expected to lower the objective most, Ansor's gradient
(``python/tvm/auto_scheduler/task_scheduler.py``, ``GradientTaskScheduler``, objective
``sum``): for task ``i`` after ``t_i`` rounds,

- backward gradient: ``(best_i(t_i) - best_i(t_i - w)) / w`` over the last ``w`` rounds
  (``backward_window``, 0 while fewer rounds were done);
- forward gradient: ``-best_i / t_i`` (the next round is expected to gain what an average round
  gained so far);
- gradient ``weight_i × (α × backward + (1 - α) × forward)`` (``alpha``); the task with the most
  negative one is tuned next (ties: a random one).

A task stops when ``early_stopping`` measurements in a row did not improve its best time, or
when its space is exhausted; the whole run stops at ``trials`` measurements or after
``time_budget_s`` seconds (checked before each round). One :class:`~kiln.tune.cost_model.
CostModel` per task group (default: per schedule template, the task's knob names) is refitted
after each round on every measured candidate of the group, labels normalized per task.

Measurement is a callable, so the scheduler runs without a builder (tests use a synthetic
cost): ``measure([(task, config), ...]) -> [seconds | error, ...]`` in the same order, where a
positive finite float is a valid run time and anything else (an exception, a message, None)
is the candidate's error.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from kiln.errors import KilnError
from kiln.schedules.space import Config, Task
from kiln.tune.cost_model import CostModel
from kiln.tune.features import knob_features
from kiln.tune.search import EvolutionarySearch, Featurize, Measured, config_key

Measure = Callable[[list[tuple[Task, dict]]], Sequence[object]]
#: Ansor's value for a task without any valid measurement yet (seconds)
NO_COST = 1e10


@dataclass(frozen=True)
class TuneEvent:
    """What one measured round did (for progress displays and record writers).

    ``task``: the task tuned this round; ``results``: its candidates in measurement order;
    ``trials``: measurements so far in this run (all tasks); ``best``: task key -> best run
    time in seconds (None: nothing valid yet); ``estimated_latency_s``: ``Σ weight × best``
    (None while a task has no valid time); ``elapsed_s``: seconds since :meth:`tune` began."""

    round: int
    task: Task
    results: tuple[Measured, ...]
    trials: int
    best: dict[str, float | None]
    estimated_latency_s: float | None
    elapsed_s: float


@dataclass
class TuneResult:
    """The outcome: ``best`` task key -> its fastest :class:`Measured` (missing: none valid);
    ``measured``: every candidate measured in this run as ``(task key, Measured)``."""

    best: dict[str, Measured]
    measured: list[tuple[str, Measured]] = field(default_factory=list)
    trials: int = 0
    rounds: int = 0
    elapsed_s: float = 0.0
    stopped: dict[str, str] = field(default_factory=dict)  # task key -> why it stopped


class TaskScheduler:
    """Tunes several tasks within one budget.

    Parameters
    ----------
    tasks : sequence of Task
        Distinct task keys; each needs at least one knob.
    measure : Measure
        Measures a batch of ``(task, config)``; see the module docstring.
    featurize : Featurize, optional
        Candidate features for the cost model (default :func:`~kiln.tune.features.
        knob_features`; with a builder at hand, ``features.lowered_features(lower)``).
    history : iterable of (task key, config, seconds or None)
        Earlier measurements (records, for resume): never measured again, and they seed the
        best times and the cost model. Keys of other tasks, and configs outside the task's
        current knob space (stale records), are ignored.
    batch_size : int
        Candidates measured per round.
    early_stopping : int, optional
        Stop a task after this many measurements without improving it.
    group_of : callable, optional
        ``task -> group name``: tasks of a group share a cost model (same feature length).
        Default: the task's knob names, i.e. its schedule template (every conv2d_NCHWc task
        of a model in one group: a new shape starts from what the others taught the model).
    alpha, backward_window : float, int
        The gradient's parameters (Ansor's defaults 0.2 and 3).
    seed : int
        Seeds every random choice (deterministic runs).
    clock : callable
        Seconds, monotonic (tests pass a fake one).
    search_options : dict
        Passed to each :class:`~kiln.tune.search.EvolutionarySearch`.

    Raises
    ------
    KilnError
        No tasks, duplicate task keys, a task without knobs, or a non-positive batch size.
    """

    def __init__(self, tasks: Sequence[Task], measure: Measure, *,
                 featurize: Featurize = knob_features,
                 history: Iterable[tuple[str, Config, float | None]] = (),
                 batch_size: int = 8, early_stopping: int | None = None,
                 group_of: Callable[[Task], str] | None = None, alpha: float = 0.2,
                 backward_window: int = 3, seed: int = 0,
                 clock: Callable[[], float] = time.monotonic,
                 min_samples: int = 8, search_options: dict | None = None):
        if not tasks:
            raise KilnError("task scheduler: no tasks to tune")
        keys = [t.key for t in tasks]
        if len(set(keys)) != len(keys):
            raise KilnError(f"task scheduler: duplicate task keys in {keys}")
        if batch_size < 1:
            raise KilnError(f"task scheduler: batch_size must be positive, got {batch_size}")
        self.tasks = list(tasks)
        self.measure = measure
        self.batch_size = batch_size
        self.early_stopping = early_stopping
        self.alpha = alpha
        self.backward_window = backward_window
        self.clock = clock
        self.rng = np.random.default_rng(seed)
        group_of = group_of or template_of
        self.group = {t.key: group_of(t) for t in self.tasks}
        self.models = {g: CostModel(min_samples=min_samples, seed=seed)
                       for g in sorted(set(self.group.values()))}
        self.searches = {
            t.key: EvolutionarySearch(t, featurize, self.models[self.group[t.key]].predict,
                                      self.rng, **(search_options or {}))
            for t in self.tasks}
        self.rounds_of = {t.key: 0 for t in self.tasks}
        self.best_history: dict[str, list[float]] = {t.key: [] for t in self.tasks}
        self.since_improvement = {t.key: 0 for t in self.tasks}
        self.stopped: dict[str, str] = {}
        for key, config, cost in history:
            if key in self.searches and _in_space(self.searches[key].task, config):
                ok = cost is not None and math.isfinite(cost) and cost > 0
                self.searches[key].update(config, cost if ok else None,
                                          None if ok else "failed in an earlier run")
        for g in self.models:
            self._fit(g)

    # ------------------------------------------------------------------ the loop

    def tune(self, trials: int, time_budget_s: float | None = None,
             callback: Callable[[TuneEvent], None] | None = None) -> TuneResult:
        """Measure at most ``trials`` candidates (new ones: history does not count) within
        ``time_budget_s`` seconds (None: no limit); ``callback`` gets a :class:`TuneEvent`
        after each round. Returns the :class:`TuneResult`."""
        if trials < 0 or (time_budget_s is not None and time_budget_s < 0):
            raise KilnError(f"tune: trials and time budget must not be negative, got {trials}, "
                            f"{time_budget_s}")
        start = self.clock()
        result = TuneResult(best={})
        warmup = [t for t in self.tasks]
        while result.trials < trials:
            if time_budget_s is not None and self.clock() - start >= time_budget_s:
                break
            task = warmup.pop(0) if warmup else self._next_task()
            if task is None:
                break
            if task.key in self.stopped:
                continue
            batch = self.searches[task.key].propose(min(self.batch_size,
                                                        trials - result.trials))
            if not batch:
                self.stopped[task.key] = "space exhausted"
                continue
            measured = self._measure(task, batch)
            result.trials += len(measured)
            result.rounds += 1
            result.measured += [(task.key, m) for m in measured]
            if callback is not None:
                callback(TuneEvent(result.rounds, task, tuple(measured), result.trials,
                                   self.best_times(), self.estimated_latency(),
                                   self.clock() - start))
        result.elapsed_s = self.clock() - start
        result.best = {k: b for k, s in self.searches.items() if (b := s.best()) is not None}
        result.stopped = dict(self.stopped)
        return result

    def _measure(self, task: Task, batch: list[dict]) -> list[Measured]:
        outcomes = list(self.measure([(task, c) for c in batch]))
        if len(outcomes) != len(batch):
            raise KilnError(f"tune: measure returned {len(outcomes)} results for "
                            f"{len(batch)} candidates of {task.name}")
        search = self.searches[task.key]
        before = self._best_cost(task.key)
        measured = []
        for config, out in zip(batch, outcomes):
            m = _as_measured(config, out)
            search.update(config, m.cost, m.error, m.result)
            measured.append(m)
        after = self._best_cost(task.key)
        self.rounds_of[task.key] += 1
        self.best_history[task.key].append(after)
        if after < before:
            best_i = min(i for i, m in enumerate(measured) if m.cost == after)
            self.since_improvement[task.key] = len(measured) - 1 - best_i
        else:
            self.since_improvement[task.key] += len(measured)
        if self.early_stopping is not None and \
                self.since_improvement[task.key] >= self.early_stopping:
            self.stopped[task.key] = f"no improvement in {self.early_stopping} trials"
        elif search.exhausted():
            self.stopped[task.key] = "space exhausted"
        self._fit(self.group[task.key])
        return measured

    def _fit(self, group: str) -> None:
        feats, costs, keys = [], [], []
        for key, search in self.searches.items():
            if self.group[key] != group:
                continue
            for m in search.measured.values():
                f = search.features(m.config)
                if f is not None:
                    feats.append(f)
                    costs.append(m.cost)
                    keys.append(key)
        if feats:
            lengths = {len(f) for f in feats}
            if len(lengths) > 1:
                raise KilnError(f"task group {group!r}: feature lengths {sorted(lengths)} "
                                f"differ; group only tasks with one feature set")
            self.models[group].fit(np.stack(feats), costs, keys)

    # ------------------------------------------------------------------ choosing a task

    def gradient(self, key: str) -> float:
        """Expected change of ``Σ weight × best`` per round spent on task ``key`` (<= 0)."""
        task = next(t for t in self.tasks if t.key == key)
        hist = self.best_history[key]
        best = self._best_cost(key)
        w = self.backward_window
        backward = (hist[-1] - hist[-1 - w]) / w if len(hist) > w else 0.0
        forward = -best / max(self.rounds_of[key], 1)
        return task.weight * (self.alpha * backward + (1 - self.alpha) * forward)

    def _next_task(self) -> Task | None:
        alive = [t for t in self.tasks if t.key not in self.stopped]
        if not alive:
            return None
        grads = np.array([self.gradient(t.key) for t in alive])
        if grads.max() == grads.min():
            return alive[self.rng.integers(len(alive))]
        return alive[int(np.argmin(grads))]

    # ------------------------------------------------------------------ reporting

    def _best_cost(self, key: str) -> float:
        best = self.searches[key].best()
        return best.cost if best is not None else NO_COST

    def best_times(self) -> dict[str, float | None]:
        """Task key -> best run time in seconds (None: none valid yet)."""
        return {k: (b.cost if (b := s.best()) else None) for k, s in self.searches.items()}

    def estimated_latency(self) -> float | None:
        """``Σ weight × best time`` in seconds, None while a task has no valid time."""
        best = self.best_times()
        if any(b is None for b in best.values()):
            return None
        return sum(t.weight * best[t.key] for t in self.tasks)


def _in_space(task: Task, config: Config) -> bool:
    """Whether ``config`` sets exactly ``task``'s knobs to legal values (records of an older
    knob space are not part of this search)."""
    return set(config) == {k.name for k in task.space} and all(
        config[k.name] in k.values for k in task.space)


def template_of(task: Task) -> str:
    """The default task group: the task's knob names (its schedule template)."""
    return ",".join(k.name for k in task.space)


def _as_measured(config: dict, outcome: object) -> Measured:
    """A measure function's outcome as a :class:`Measured`: a positive finite float (seconds),
    an object with ``error`` and ``best`` (``measure.MeasureResult``: its fastest repeat), or
    an error (an exception, a message, None)."""
    config = dict(config)
    if hasattr(outcome, "error") and hasattr(outcome, "best"):
        if outcome.error is not None:
            return Measured(config, None, str(outcome.error), outcome)
        return Measured(config, *_time_or_error(outcome.best), outcome)
    return Measured(config, *_time_or_error(outcome), outcome)


def _time_or_error(outcome: object) -> tuple[float | None, str | None]:
    if isinstance(outcome, (int, float)) and not isinstance(outcome, bool) \
            and math.isfinite(outcome) and outcome > 0:
        return float(outcome), None
    if isinstance(outcome, BaseException):
        return None, f"{type(outcome).__name__}: {outcome}"
    if outcome is None:
        return None, "no result"
    if isinstance(outcome, str):
        return None, outcome
    return None, f"invalid run time {outcome!r}"


__all__ = ["TaskScheduler", "TuneEvent", "TuneResult", "config_key"]
