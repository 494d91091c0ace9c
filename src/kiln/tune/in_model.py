"""Confirm the tuner's choices inside the whole model (issue 32): the tuned build is never
slower than the untuned one.

A kernel timed alone misleads: its inputs are the same every run, its neighbours' data is not
in the cache, and on a loaded machine a single measurement is off by more than most knobs gain
(docs/decisions/024-tuner.md, "End to end"). A ResNet-50-class model whose 24 kernels all got
a standalone winner ran 0.89x the untuned speed. So after the search, :func:`confirm_in_model`
builds the whole model with the defaults and with the candidates and times them *in the model*
(a :class:`ModelTimer`: the graph executor's real run node by node, caches flushed before each
pass, variants alternating, their order reversed every other pass):

1. round *j* times the defaults against variant *j*, which gives every kernel its *j*-th best
   standalone candidate (``candidates``); each kernel's in-model time in the variant over its
   time in the defaults (medians of the same passes) is the candidate's in-model ratio. Round
   0 always runs; later rounds run while the time budget lasts (the budget is spent here
   once the search has exhausted the spaces);
2. a kernel keeps the candidate of least ratio when that is below ``1 - min_gain``, else its
   default ("default wins");
3. the model with the kept choices is timed whole against the defaults (longer when budget
   is left): a kernel not faster again in this second sample loses its choice and the rest
   is timed again (at most MAX_CHECKS times); when the model as a whole is not faster,
   every kernel keeps its default.

The verdicts become in-model records (``TuningRecord.in_model``), which decide what
``kiln compile`` applies (:func:`kiln.driver.tuning_records.best_records`).
MetaSchedule and AutoTVM stop at the per-kernel measurement; this is the racing of finalists
in the target context that docs/decisions/024's "End to end" asked for.
"""

from __future__ import annotations

import json
import math
import statistics
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np

from kiln import __version__
from kiln.driver.tuning_records import TuningRecord
from kiln.errors import KilnError
from kiln.schedules.space import Config, Task
from kiln.tune.cache_flush import CacheFlusher

#: a variant of the model: task key -> the config its kernels are built with (others: default)
Assignment = Mapping[str, Config]
#: timed passes of each variant per round (alternating; medians decide)
DEFAULT_PASSES = 20
#: a candidate is kept only when its in-model time is below (1 - MIN_GAIN) x the default's
MIN_GAIN = 0.01
#: whole-model checks of the kept choices (each may drop kernels that lose their second sample)
MAX_CHECKS = 3


@dataclass
class VariantTimes:
    """One variant's in-model times: ``total`` seconds per pass (the whole model), and
    ``per_task`` task key -> seconds per pass of that task's kernel calls (summed over its
    nodes: a task of weight 3 is three calls)."""

    total: list[float] = field(default_factory=list)
    per_task: dict[str, list[float]] = field(default_factory=dict)


class ModelTimer(Protocol):
    """Times variants of the model in the model: ``timer(variants, passes)`` returns one
    :class:`VariantTimes` per variant, each with ``passes`` samples, the variants alternating.

    Raises KilnError when a variant cannot be built or run."""

    def __call__(self, variants: Sequence[Assignment], passes: int) -> list[VariantTimes]: ...


@dataclass
class InModelResult:
    """What :func:`confirm_in_model` decided.

    ``kept``: task key -> the config kept (only tasks whose choice differs from the default);
    ``verdicts``: task key -> (config, in-model seconds per pass) for every task that had a
    candidate (the default config where the default wins); ``considered``: how many tasks had
    a candidate; ``default_s`` / ``tuned_s``: the whole model's median seconds per pass with
    the defaults and with the kept choices (equal when nothing is kept); ``defaults_kept``:
    the choices were dropped because the whole model was not faster with them;
    ``rounds``: variants timed against the defaults; ``elapsed_s``: wall seconds."""

    kept: dict[str, Config]
    verdicts: dict[str, tuple[Config, list[float]]]
    considered: int
    default_s: float
    tuned_s: float
    defaults_kept: bool
    rounds: int
    elapsed_s: float = 0.0

    def summary(self) -> str:
        """``tuned model 9.80 ms vs default 10.20 ms (1.041x); kept 5 of 12 kernels'
        choices`` (and why nothing was kept when the whole model was not faster)."""
        if not self.considered:
            return ("in-model: no kernel had a choice faster than its default alone; "
                    "the defaults stay")
        ratio = self.default_s / self.tuned_s if self.tuned_s > 0 else 1.0
        line = (f"tuned model {self.tuned_s * 1e3:.2f} ms vs default {self.default_s * 1e3:.2f} "
                f"ms ({ratio:.3f}x); kept {len(self.kept)} of {self.considered} kernels' "
                f"choices")
        if self.defaults_kept:
            line += " (the model with them was not faster: defaults kept)"
        return line + f" [{self.rounds} in-model rounds, {self.elapsed_s:.0f} s]"


def confirm_in_model(tasks: Sequence[Task], candidates: Mapping[str, Sequence[Config]],
                     timer: ModelTimer, time_budget_s: float | None = None, *,
                     passes: int = DEFAULT_PASSES, min_gain: float = MIN_GAIN,
                     clock: Callable[[], float] = time.monotonic) -> InModelResult:
    """Choose each task's config by its time inside the model (see the module docstring).

    Parameters
    ----------
    tasks : list of Task
        The tuned tasks.
    candidates : mapping
        Task key -> its non-default configs, best (standalone) first; tasks without any keep
        their default and are not counted.
    timer : ModelTimer
        Builds and times variants of the model.
    time_budget_s : float, optional
        Seconds for rounds after the first (None: only round 0, the best candidates); a
        round starts only when the previous one's duration still fits.
    passes : int
        Timed passes of each variant per round (the final whole-model checks take 2-10x as
        many: :func:`_final_passes`).
    min_gain : float
        The least in-model gain (fraction) for which a candidate replaces the default.
    clock : callable
        Seconds now (tests pass a fake one).

    Returns
    -------
    InModelResult

    Raises
    ------
    KilnError
        ``passes`` < 1, a candidate of an unknown task, or the timer's errors.
    """
    if passes < 1:
        raise KilnError(f"in-model confirmation: passes must be positive, got {passes}")
    by_key = {t.key: t for t in tasks}
    unknown = [k for k in candidates if k not in by_key]
    if unknown:
        raise KilnError(f"in-model confirmation: candidates of unknown tasks {unknown}")
    start = clock()
    cands = {k: list(v) for k, v in candidates.items() if v}
    ratios: dict[str, list[tuple[float, Config, list[float]]]] = {k: [] for k in cands}
    default_times: dict[str, list[float]] = {k: [] for k in cands}
    default_total: list[float] = []
    rounds, last = 0, 0.0
    for j in range(max((len(v) for v in cands.values()), default=0)):
        variant = {k: v[j] for k, v in cands.items() if len(v) > j}
        if j > 0 and (time_budget_s is None or clock() - start + last > time_budget_s):
            break
        began = clock()
        base, tried = timer([{}, variant], passes)
        last = clock() - began
        rounds += 1
        default_total += base.total
        for k, config in variant.items():
            default_times[k] += base.per_task.get(k, [])
            ratio = _ratio(tried.per_task.get(k), base.per_task.get(k))
            ratios[k].append((ratio, dict(config), tried.per_task.get(k, [])))
    kept = {}
    verdicts: dict[str, tuple[Config, list[float]]] = {}
    for k, tried in ratios.items():
        ratio, config, times = min(tried, key=lambda x: x[0], default=(math.inf, None, []))
        if ratio < 1.0 - min_gain:
            kept[k] = config
            verdicts[k] = (config, times)
        else:
            verdicts[k] = (by_key[k].default_config(), default_times[k])
    default_s, defaults_kept = _median(default_total), False
    tuned_s, checks = default_s, 0
    final = _final_passes(passes, last, time_budget_s, clock() - start)
    while kept:
        if checks == MAX_CHECKS:  # still losing kernels: nothing confirmed, defaults stay
            defaults_kept, kept = True, {}
            break
        checks += 1
        base, tuned = timer([{}, kept], final)
        default_s, tuned_s = _median(base.total), _median(tuned.total)
        # a second, independent sample of each kernel: one not faster again is dropped (the
        # least of several noisy ratios is the luckiest one), and the rest timed again
        lost = [k for k in kept
                if not _ratio(tuned.per_task.get(k), base.per_task.get(k)) < 1.0]
        for k in lost:
            del kept[k]
            verdicts[k] = (by_key[k].default_config(), base.per_task.get(k, []))
        if lost:
            continue
        if not tuned_s < default_s:  # not faster as a whole: the defaults stay
            defaults_kept, kept = True, {}
            break
        for k in kept:
            verdicts[k] = (kept[k], tuned.per_task.get(k, verdicts[k][1]))
        break  # confirmed: every kept kernel faster twice, and the whole model faster
    if not kept:
        tuned_s = default_s
        verdicts = {k: (by_key[k].default_config(), default_times[k]) for k in verdicts}
    return InModelResult(kept, verdicts, len(cands), default_s, tuned_s, defaults_kept,
                         rounds, clock() - start)


def _final_passes(passes: int, round_s: float, budget_s: float | None, spent: float) -> int:
    """Passes of the final whole-model checks: twice a round's, more (up to 10x) when the
    budget left would otherwise go unused (a round of ``passes`` took ``round_s``,
    builds included, so this errs short)."""
    least = 2 * passes
    if budget_s is None or round_s <= 0:
        return least
    fits = int(passes * (budget_s - spent) / (2 * round_s))  # room for two checks
    return max(least, min(10 * passes, fits))


def _ratio(tried: Sequence[float] | None, base: Sequence[float] | None) -> float:
    """In-model time of a candidate over the default's (medians); inf when one is missing."""
    if not tried or not base or _median(base) <= 0:
        return math.inf
    return _median(tried) / _median(base)


def _median(xs: Sequence[float]) -> float:
    return statistics.median(xs) if xs else math.inf


def verdict_records(tasks: Sequence[Task], result: InModelResult, target: str,
                    fingerprint: Mapping[str, object], measure: str) -> list[TuningRecord]:
    """The in-model records of ``result``'s verdicts (one per task that had a candidate; its
    costs: the config's in-model seconds per pass)."""
    names = {t.key: t.name for t in tasks}
    return [TuningRecord(k, names[k], dict(config), tuple(times), None, target,
                         dict(fingerprint), __version__, time.time(), measure, in_model=True)
            for k, (config, times) in result.verdicts.items() if times]


class GraphModelTimer:
    """A :class:`ModelTimer` over the real build: each variant is ``kiln.build`` of the model
    with the variant's configs applied (the rest default), loaded into a graph executor and
    run node by node (:meth:`GraphExecutorDebug.run_individual`, one call per node: the real
    run, each kernel after its real neighbours), L1/L2 flushed before every pass
    (:class:`~kiln.tune.cache_flush.CacheFlusher`); thread CPU time at one kernel thread, wall
    time otherwise (:func:`kiln.tune.measure.measure_clock`). Inputs: seeded random data
    (N(0, 1) floats, integers 0..9). Built variants are kept for later rounds.

    Raises KilnError (when called) for a model the graph executor cannot run (the VM)."""

    def __init__(self, mod, params, target: str, fingerprint: Mapping[str, object],
                 measure: str, seed: int = 0) -> None:
        self.mod, self.params, self.target = mod, params, str(target)
        self.fingerprint, self.measure, self.seed = dict(fingerprint), measure, seed
        self.flusher = CacheFlusher()
        self._built: dict[str, tuple[object, dict[str, str]]] = {}
        self._dir = tempfile.TemporaryDirectory(prefix="kiln-in-model-")

    def __call__(self, variants: Sequence[Assignment], passes: int) -> list[VariantTimes]:
        from kiln.tune.measure import measure_clock

        built = [self._executor(v) for v in variants]
        clock = measure_clock()
        out = [VariantTimes() for _ in variants]
        for ex, _ in built:  # warm-up: first-touch page faults are not the kernels'
            ex.run()
        for p in range(passes):
            order = range(len(built)) if p % 2 == 0 else reversed(range(len(built)))
            for i in order:
                ex, keys = built[i]
                self.flusher.flush()
                nodes = ex.run_individual(1, 1, clock=clock)
                per_task: dict[str, float] = {}
                for nid, (t,) in nodes.items():
                    key = keys.get(ex.graph.nodes[nid].func_name)
                    if key is not None:
                        per_task[key] = per_task.get(key, 0.0) + t
                out[i].total.append(sum(t for (t,) in nodes.values()))
                for key, t in per_task.items():
                    out[i].per_task.setdefault(key, []).append(t)
        return out

    def _executor(self, variant: Assignment):
        """The debug executor of ``variant`` (built once) and its kernel name -> task key."""
        ident = json.dumps({k: dict(c) for k, c in variant.items()}, sort_keys=True)
        if ident not in self._built:
            self._built[ident] = self._build(variant, len(self._built))
        return self._built[ident]

    def _build(self, variant: Assignment, n: int):
        from kiln.driver.apply_history import ApplyHistoryBest
        from kiln.driver.build_module import build
        from kiln.runtime import cpu, load_module

        records = [TuningRecord(k, "in-model variant", dict(c), (1.0,), None, self.target,
                                self.fingerprint, __version__, measure=self.measure)
                   for k, c in variant.items()]
        tuning = ApplyHistoryBest(records, fingerprint=self.fingerprint, measure=self.measure)
        lib = build(self.mod, self.target, params=self.params, tuning_records=tuning)
        path = Path(self._dir.name) / f"variant{n}.so"
        lib.export_library(str(path))
        factory = load_module(str(path))
        try:
            ex = factory["debug_create"]("default", cpu())
        except (KilnError, KeyError, AttributeError) as err:
            raise KilnError(f"in-model confirmation needs the graph executor; this model's "
                            f"library has none ({err})") from None
        info = ex.get_input_info()
        rng = np.random.default_rng(self.seed)
        for name, shape in info["shape"].items():
            dtype = np.dtype(info["dtype"][name])
            if np.issubdtype(dtype, np.floating):
                ex.set_input(name, rng.standard_normal(shape).astype(dtype))
            else:
                ex.set_input(name, rng.integers(0, 10, shape).astype(dtype))
        return ex, dict(tuning.keys)

    def close(self) -> None:
        """Drop the built variants and their files."""
        self._built.clear()
        self._dir.cleanup()
