"""The learned search against random order at the same trial budget, on a real model's kernels.

Extracts a model's tuning tasks (``kiln.tune.tasks.extract_tasks``), then runs the task
scheduler twice with the same seed, batch size and ``--trials``: once with the LightGBM cost
model over loop-nest features (``features.lowered_features(tasks.lower_candidate)``), once with
the model switched off (``min_samples`` never reached: every score is random, so the same
evolutionary machinery picks uniformly). Candidates are built in worker processes and measured
here (``LocalExecutor`` + ``measure_with(build_candidate, measure_candidate)``); a measurement
is cached by (task, config), so a config both runs pick gets the same time and the comparison
is not measurement noise. Prints, per strategy, the estimated model latency ``Σ weight ×
best`` against the default configs' and the trials each strategy needed to reach its final
value.

Needs ``kiln.tune.tasks`` and ``kiln.tune.measure`` (the builder) and ``kiln[tune]``::

    KILN_NUM_THREADS=1 PYTHONPATH=src .venv/bin/python benchmarks/tune_search.py \\
        --model squeezenet --trials 200
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="squeezenet", help="a model of benchmarks/models.py")
    p.add_argument("--target", default="llvm -mcpu=native")
    p.add_argument("--trials", type=int, default=200)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--repeat", type=int, default=3, help="timed repeats per candidate")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


class CachedMeasure:
    """``measure`` with results remembered per (task key, config): a config measured once
    keeps its time across strategies."""

    def __init__(self, measure):
        self.measure = measure
        self.cache: dict[tuple[str, str], object] = {}

    def __call__(self, batch):
        from kiln.driver.tuning_records import config_key

        keys = [(t.key, config_key(c)) for t, c in batch]
        todo = [i for i, k in enumerate(keys) if k not in self.cache]
        for i, result in zip(todo, self.measure([batch[i] for i in todo])):
            self.cache[keys[i]] = result
        return [self.cache[k] for k in keys]


def run_strategy(name, tasks, measure, featurize, args) -> dict:
    from kiln.tune.task_scheduler import TaskScheduler

    curve = []
    min_samples = 8 if name == "model" else 10**9
    sched = TaskScheduler(tasks, measure, featurize=featurize, batch_size=args.batch,
                          seed=args.seed, min_samples=min_samples)
    start = time.perf_counter()
    result = sched.tune(args.trials, callback=lambda e: curve.append(
        (e.trials, e.estimated_latency_s)))
    final = curve[-1][1] if curve else None
    reached = next((t for t, lat in curve if lat == final), None)
    return {"name": name, "latency": final, "trials": result.trials, "reached_at": reached,
            "seconds": time.perf_counter() - start}


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        from kiln.tune.measure import build_candidate, measure_candidate
        from kiln.tune.tasks import extract_tasks, lower_candidate
    except ImportError as exc:
        print(f"needs the tuner's builder (kiln.tune.tasks, kiln.tune.measure): {exc}")
        return 2
    from kiln.frontend import from_onnx
    from kiln.tune.executor import LocalExecutor, measure_with
    from kiln.tune.features import lowered_features
    from models import load_model

    mod, params = from_onnx(load_model(args.model, args.seed))
    tasks = extract_tasks(mod, params, args.target)
    print(f"{args.model}: {len(tasks)} tasks, {sum(t.size() for t in tasks)} candidates in "
          f"all; {args.trials} trials per strategy", flush=True)
    featurize = lowered_features(lambda task, config: lower_candidate(task, config,
                                                                      packed=False))
    executor = LocalExecutor()
    measure = CachedMeasure(measure_with(executor, build_candidate, measure_candidate,
                                         args.target, args.repeat))
    try:
        rows = [run_strategy(name, tasks, measure, featurize, args)
                for name in ("model", "random")]
        defaults = measure([(t, t.default_config()) for t in tasks])
    finally:
        executor.close()
    base = sum(t.weight * r.best for t, r in zip(tasks, defaults) if r.error is None)
    print(f"\ndefault configs: {base * 1e3:.3f} ms (Σ weight × time; "
          f"{len(measure.cache)} distinct candidates measured)\n")
    print("| search | trials | est. latency ms | speed-up vs default | final value at trial | s |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        lat = r["latency"]
        print(f"| {r['name']} | {r['trials']} | {lat * 1e3:.3f} | {base / lat:.3f}x | "
              f"{r['reached_at']} | {r['seconds']:.0f} |" if lat else f"| {r['name']} | - |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
