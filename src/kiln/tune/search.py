"""Evolutionary search over one task's knob space: which candidates to measure next.

A :class:`EvolutionarySearch` holds what was measured for one :class:`~kiln.schedules.space.Task`
(never proposed again) and, on :meth:`~EvolutionarySearch.propose`, returns a batch of
unmeasured configs:

1. the default config (candidate 0) first, while it is unmeasured;
2. a small space (``size() <= enumerate_below``) is scored whole by the cost model;
3. otherwise a population of the best measured configs plus random ones evolves for a few
   generations: each child is a **mutation** (one knob set to another legal value) or a
   **cross-over** (each knob from one of two parents), parents drawn with probability growing
   with their predicted score, and every child the cost model scores is remembered;
4. **ε-greedy**: each slot of the batch is a random unmeasured config with probability ``eps``,
   else the best-scored unmeasured candidate not yet picked.

This follows MetaSchedule's ``EvolutiveSearch``
(``python/tvm/meta_schedule/search_strategy/evolutionary_search.py``: init population from the
measured best plus random samples, evolve with the cost model, ε-greedy pick), on knob values
instead of traces. The task scheduler (:mod:`kiln.tune.task_scheduler`) decides which task's
search runs next and refits the cost model.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from kiln.driver.tuning_records import config_key
from kiln.errors import KilnError
from kiln.schedules.space import Config, Task

#: ``(task, config) -> float64 vector``: e.g. ``features.knob_features`` or
#: ``features.lowered_features(lower)``
Featurize = Callable[[Task, Config], np.ndarray]


@dataclass(frozen=True)
class Measured:
    """One measured candidate: ``cost`` in seconds (None when it failed, with ``error``);
    ``result``: what the measure function returned for it (e.g. a ``MeasureResult`` with every
    repeat, for the records), None for history."""

    config: dict[str, int | str]
    cost: float | None
    error: str | None = None
    result: object = field(default=None, compare=False, repr=False)


class EvolutionarySearch:
    """The search state of one task.

    Parameters
    ----------
    task : Task
        The task whose knob space is searched.
    featurize : Featurize
        Features of a candidate; a config whose featurization raises is never proposed.
    scorer : callable
        ``(features (n, f) float64) -> scores (n,)``, higher = expected faster (a
        :meth:`kiln.tune.cost_model.CostModel.predict`).
    rng : numpy.random.Generator
        All random choices (the search is deterministic for a seed).
    population_size, num_generations : int
        Evolution size per :meth:`propose` (MetaSchedule's ``population_size`` and
        ``genetic_num_iters``).
    init_measured_ratio : float
        Share of the initial population taken from the best measured configs.
    crossover_prob : float
        Probability that a child is a cross-over rather than a mutation.
    eps : float
        ε-greedy: probability that a batch slot is a random unmeasured config.
    enumerate_below : int
        Spaces of at most this many configs are scored whole instead of evolved.
    """

    def __init__(self, task: Task, featurize: Featurize, scorer: Callable[[np.ndarray],
                 np.ndarray], rng: np.random.Generator, *, population_size: int = 32,
                 num_generations: int = 2, init_measured_ratio: float = 0.25,
                 crossover_prob: float = 0.3, eps: float = 0.05, enumerate_below: int = 64):
        if not task.space:
            raise KilnError(f"task {task.name}: no knobs to search")
        if population_size < 2 or num_generations < 0:
            raise KilnError(f"search: population_size >= 2 and num_generations >= 0 required, "
                            f"got {population_size}, {num_generations}")
        if not 0.0 <= eps <= 1.0:
            raise KilnError(f"search: eps must be in [0, 1], got {eps}")
        self.task = task
        self.featurize = featurize
        self.scorer = scorer
        self.rng = rng
        self.population_size = population_size
        self.num_generations = num_generations
        self.init_measured_ratio = init_measured_ratio
        self.crossover_prob = crossover_prob
        self.eps = eps
        self.enumerate_below = enumerate_below
        self.measured: dict[str, Measured] = {}
        self.invalid: dict[str, str] = {}  # config key -> why featurization failed
        self._features: dict[str, np.ndarray] = {}

    # ------------------------------------------------------------------ state

    def update(self, config: Config, cost: float | None, error: str | None = None,
               result: object = None) -> None:
        """Record a measurement (also for records of an earlier run: resume)."""
        self.measured[config_key(config)] = Measured(dict(config), cost, error, result)

    def best(self) -> Measured | None:
        """The fastest successful measurement, or None."""
        ok = [m for m in self.measured.values() if m.cost is not None]
        return min(ok, key=lambda m: m.cost) if ok else None

    def features(self, config: Config) -> np.ndarray | None:
        """Cached features of ``config``; None when featurization failed."""
        key = config_key(config)
        if key not in self._features and key not in self.invalid:
            try:
                self._features[key] = np.asarray(self.featurize(self.task, config), np.float64)
            except Exception as exc:  # noqa: BLE001 - a candidate that cannot be lowered is skipped
                self.invalid[key] = f"{type(exc).__name__}: {exc}"
        return self._features.get(key)

    def exhausted(self) -> bool:
        return len(self.measured) + len(self.invalid) >= self.task.size()

    # ------------------------------------------------------------------ proposing

    def propose(self, n: int) -> list[dict[str, int | str]]:
        """Up to ``n`` unmeasured, distinct configs (fewer only when the space runs out)."""
        picked: dict[str, dict[str, int | str]] = {}
        default = self.task.default_config()
        if n > 0 and self._fresh(default) and self.features(default) is not None:
            picked[config_key(default)] = default
        if len(picked) >= n or self.exhausted():
            return list(picked.values())
        if self.task.size() <= self.enumerate_below:
            pool = [c for c in self.task.configs() if self._fresh(c)]
        else:
            pool = self._evolve()
        ranked = self._rank(pool)
        while len(picked) < n:
            if self.rng.random() < self.eps:
                config = self._random_fresh(picked)
                if config is not None:
                    picked[config_key(config)] = config
                    continue
            while ranked and config_key(ranked[0]) in picked:
                ranked.pop(0)
            if ranked:
                config = ranked.pop(0)
            else:  # evolution found too few: fill with random unmeasured configs
                config = self._random_fresh(picked)
                if config is None:
                    break
            picked[config_key(config)] = config
        return list(picked.values())

    def _fresh(self, config: Config) -> bool:
        key = config_key(config)
        return key not in self.measured and key not in self.invalid

    def _rank(self, pool: list[dict]) -> list[dict]:
        """``pool`` (unmeasured, featurizable ones) best predicted first."""
        pool = [c for c in pool if self._fresh(c) and self.features(c) is not None]
        if not pool:
            return []
        scores = self._score(pool)
        order = np.argsort(-scores, kind="stable")
        return [pool[i] for i in order]

    def _score(self, configs: list[dict]) -> np.ndarray:
        feats = [self.features(c) for c in configs]
        return np.asarray(self.scorer(np.stack(feats)), np.float64)

    def _random_config(self) -> dict[str, int | str]:
        return {k.name: k.values[self.rng.integers(len(k.values))] for k in self.task.space}

    def _random_fresh(self, taken: dict, tries: int = 64) -> dict[str, int | str] | None:
        """A random config neither measured, invalid nor in ``taken`` (None if none found)."""
        for _ in range(tries):
            c = self._random_config()
            if self._fresh(c) and config_key(c) not in taken and self.features(c) is not None:
                return c
        if self.task.size() <= 4096:  # small enough to look through
            rest = [c for c in self.task.configs()
                    if self._fresh(c) and config_key(c) not in taken]
            for i in self.rng.permutation(len(rest)):
                if self.features(rest[i]) is not None:
                    return rest[i]
        return None

    # ------------------------------------------------------------------ evolution

    def _initial_population(self) -> list[dict]:
        ok = sorted((m for m in self.measured.values() if m.cost is not None),
                    key=lambda m: m.cost)
        n_best = int(self.population_size * self.init_measured_ratio)
        pop = [dict(m.config) for m in ok[:n_best]]
        seen = {config_key(c) for c in pop}
        for _ in range(4 * self.population_size):
            if len(pop) >= self.population_size:
                break
            c = self._random_config()
            if config_key(c) not in seen and config_key(c) not in self.invalid:
                seen.add(config_key(c))
                pop.append(c)
        return [c for c in pop if self.features(c) is not None]

    def _evolve(self) -> list[dict]:
        """Unmeasured candidates the evolution visited (scored by the caller)."""
        pop = self._initial_population()
        visited: dict[str, dict] = {config_key(c): c for c in pop}
        for _ in range(self.num_generations):
            if len(pop) < 1:
                break
            scores = self._score(pop)
            weights = scores - scores.min() + 1e-3
            weights = weights / weights.sum()
            children: dict[str, dict] = {}
            for _ in range(2 * self.population_size):
                if len(children) >= self.population_size:
                    break
                child = self._child(pop, weights)
                key = config_key(child)
                if key not in self.invalid and self.features(child) is not None:
                    children[key] = child
            visited.update(children)
            merged = {config_key(c): c for c in pop} | children
            ranked = list(merged.values())
            order = np.argsort(-self._score(ranked), kind="stable")
            pop = [ranked[i] for i in order[: self.population_size]]
        return [c for c in visited.values() if self._fresh(c)]

    def _child(self, pop: list[dict], weights: np.ndarray) -> dict:
        first = pop[self.rng.choice(len(pop), p=weights)]
        if len(pop) >= 2 and self.rng.random() < self.crossover_prob:
            second = pop[self.rng.choice(len(pop), p=weights)]
            return {k.name: (first if self.rng.random() < 0.5 else second)[k.name]
                    for k in self.task.space}
        return self._mutate(first)

    def _mutate(self, config: dict) -> dict:
        """``config`` with one knob (that has a choice) set to another legal value."""
        choices = [k for k in self.task.space if len(k.values) > 1]
        child = dict(config)
        if not choices:
            return child
        knob = choices[self.rng.integers(len(choices))]
        others = [v for v in knob.values if v != config[knob.name]]
        child[knob.name] = others[self.rng.integers(len(others))]
        return child
