"""Measure the winners again before they are believed (the tuner's last step).

One measurement of a candidate on this shared machine is off by about 8 % (the same config
timed twice: docs/decisions/024-tuner.md, "Measuring method"), and the differences between
most configs of a kernel are smaller. The fastest of a few hundred such measurements is
mostly the luckiest one: a tune's estimate went 1.2x faster while the model did not
(the winner's curse). :func:`confirm_best` measures each task's best config again, each time
next to the default config, until the config with the least *median* time
(:func:`kiln.driver.tuning_records.best_records`, which ``kiln compile`` applies) has been measured
``rounds + 1`` times; the new records are appended like any other.

AutoTVM and MetaSchedule keep the least time of a single measurement; this is the
re-measurement of finalists that racing methods (irace, successive halving) do.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Mapping, Sequence

from kiln import __version__
from kiln.driver.tuning_records import (
    TuningRecord,
    append_records,
    best_records,
    config_key,
    config_times,
    load_records,
)
from kiln.schedules.space import Task
from kiln.tune.measure import MeasureResult, build_candidate, measure_candidate


def confirm_best(tasks: Sequence[Task], output: str | os.PathLike[str], target: str,
                 fingerprint: Mapping[str, object], measure: str, executor, repeat: int,
                 rounds: int = 2, max_iterations: int = 3) -> int:
    """Re-measure each task's best config (by median) next to its default config.

    Parameters
    ----------
    tasks : list of Task
        The tuned tasks.
    output : path
        The records file: read for the times so far, appended to.
    target, fingerprint, measure : str, mapping, str
        Which records count (:func:`kiln.driver.tuning_records.config_times`) and how to time.
    executor :
        A :class:`kiln.tune.executor.Executor` (builds once per pair, then ``rounds``
        measurements of the default and the best, alternating).
    repeat : int
        Timed repeats per measurement.
    rounds : int
        A best config is confirmed once it has ``rounds + 1`` records.
    max_iterations : int
        How often a task whose best changed after re-measuring is looked at again.

    Returns
    -------
    int
        New measurements appended.
    """
    added = 0
    for _ in range(max_iterations):
        todo = _unconfirmed(tasks, load_records(output), target, fingerprint, measure, rounds)
        if not todo:
            break
        pairs = [(task, config) for task, best in todo
                 for config in (task.default_config(), best)]
        libs = executor.map_build(build_candidate, [(t.payload, c, target) for t, c in pairs])
        built = [i for i, lib in enumerate(libs) if not isinstance(lib, BaseException)]
        run = functools.partial(measure_candidate, method=measure)
        for _ in range(rounds):
            results = executor.map_measure(run, [(libs[i], pairs[i][0].payload, pairs[i][1],
                                                  target, repeat) for i in built])
            append_records(output, [_record(pairs[i][0], pairs[i][1], r, target, fingerprint,
                                            measure) for i, r in zip(built, results)])
            added += len(built)
    return added


def _unconfirmed(tasks, records, target, fingerprint, measure, rounds):
    """``(task, best config)`` for the tasks whose best config, as ``kiln compile`` picks it
    (:func:`kiln.driver.tuning_records.best_records`), is not the default and has at most ``rounds``
    records; in-model verdicts are left out (kernels timed alone are ranked here)."""
    records = [r for r in records if not r.in_model]
    times = config_times(records, target, fingerprint, measure)
    chosen = best_records(records, target, fingerprint, measure)
    todo = []
    for task in tasks:
        best = chosen.get(task.key)
        if best is None:
            continue
        key = best.config_key()
        if key != config_key(task.default_config()) and len(times[task.key][key]) <= rounds:
            todo.append((task, dict(best.config)))
    return todo


def _record(task: Task, config, result, target, fingerprint, measure) -> TuningRecord:
    """The record of one re-measurement (``result``: a MeasureResult or an exception)."""
    if isinstance(result, MeasureResult):
        costs, error, stamp = result.costs if result.error is None else (), result.error, \
            result.timestamp
    else:
        costs, error, stamp = (), f"{type(result).__name__}: {result}", time.time()
    return TuningRecord(task.key, task.name, dict(config), tuple(costs), error, target,
                        dict(fingerprint), __version__, stamp, measure)
