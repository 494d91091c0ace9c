"""Which way of timing a kernel alone predicts its time inside the model (issue 19)?

For each tuning task of a model, a few configs (the default and seeded random ones) are
timed three ways, all in thread-CPU time at one thread (``KILN_NUM_THREADS=1``):

- **alone**, by :func:`kiln.tune.measure.time_kernel` with each ``--methods`` method
  (``hot``: back-to-back runs on the same warm inputs, the tuner's first method;
  ``flush``: the last-level-but-one caches evicted before every run, TVM's
  ``enable_cpu_cache_flush``);
- **in the model**: variant *j* of the model applies config *j* of every task at once
  (records given to ``kiln.build``); each kernel call is timed where the model runs it
  (the graph in order, one call per node per pass, passes of the variants interleaved).

Prints per task the times, then per method: the mean |log(alone / in-model)| of the
*ratio to the default config* (what ranking needs), Spearman's rank correlation per task, and
the regret of picking each task's best config by that method (Σ weight × in-model time of the
pick, against the default's and the in-model best's)::

    KILN_NUM_THREADS=1 PYTHONPATH=src .venv/bin/python benchmarks/tune_timers.py \\
        --model squeezenet --configs 6
"""

from __future__ import annotations

import argparse
import math
import os
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="squeezenet", help="a model of benchmarks/models.py")
    p.add_argument("--target", default="llvm -mcpu=native")
    p.add_argument("--configs", type=int, default=6, help="configs per task (default first)")
    p.add_argument("--methods", default="hot,flush", help="measure methods to compare")
    p.add_argument("--repeat", type=int, default=30, help="timed repeats alone")
    p.add_argument("--passes", type=int, default=60, help="timed model passes per variant")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def pick_configs(task, n: int, rng: random.Random) -> list[dict]:
    """The default config and up to ``n - 1`` other distinct configs of ``task``."""
    default = task.default_config()
    others = [c for c in task.configs() if c != default] if task.size() <= 4096 else []
    rng.shuffle(others)
    return [default, *others[:n - 1]]


def in_model_times(executors, passes: int) -> list[dict[str, list[float]]]:
    """Per variant: kernel name → thread-CPU seconds of each of its calls, the model run
    node by node (``passes`` interleaved passes per variant; calls in pass order, node by
    node within a pass: :func:`tune_per_kernel.node_times` grouped by kernel name)."""
    from tune_per_kernel import node_times

    out: list[dict[str, list[float]]] = []
    for ex, by_node in zip(executors, node_times(executors, passes)):
        times: dict[str, list[float]] = {}
        for p in range(passes):
            for nid in ex._op_nids:
                times.setdefault(ex.graph.nodes[nid].func_name, []).append(by_node[nid][p])
        out.append(times)
    return out


def spearman(a: list[float], b: list[float]) -> float:
    def ranks(x):
        order = sorted(range(len(x)), key=x.__getitem__)
        r = [0.0] * len(x)
        for i, j in enumerate(order):
            r[j] = float(i)
        return r
    ra, rb = ranks(a), ranks(b)
    ma, mb = statistics.mean(ra), statistics.mean(rb)
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb))
    var = math.sqrt(sum((x - ma) ** 2 for x in ra) * sum((y - mb) ** 2 for y in rb))
    return cov / var if var else float("nan")


def main(argv=None) -> int:
    args = parse_args(argv)
    os.environ["KILN_NUM_THREADS"] = "1"
    import numpy as np

    import kiln
    from kiln import __version__, progress
    from kiln.driver.tuning_records import TuningRecord, cpu_fingerprint
    from kiln.frontend import from_onnx
    from kiln.runtime.graph_executor.debug import GraphExecutorDebug
    from kiln.tune.executor import LocalExecutor
    from kiln.tune.measure import build_candidate, measure_candidate
    from kiln.tune.tasks import extract_tasks
    from models import input_shapes, load_model

    progress.set_quiet(True)
    methods = args.methods.split(",")
    model = load_model(args.model, args.seed)
    mod, params = from_onnx(model)
    tasks = extract_tasks(mod, params, args.target)
    rng = random.Random(args.seed)
    configs = {t.key: pick_configs(t, args.configs, rng) for t in tasks}
    jobs = [(t.payload, c, args.target) for t in tasks for c in configs[t.key]]
    t0 = time.perf_counter()
    ex = LocalExecutor()
    libs = ex.map_build(build_candidate, jobs)
    print(f"{len(tasks)} tasks, {len(jobs)} candidates built in {time.perf_counter() - t0:.0f} s",
          flush=True)
    alone: dict[str, dict[tuple[str, int], float]] = {m: {} for m in methods}
    rounds: list[dict[str, dict[tuple[str, int], float]]] = [{m: {} for m in methods}
                                                             for _ in range(2)]
    for rnd in rounds:  # two interleaved rounds: the better one counts
        for m in methods:
            timed = ex.map_measure(measure_candidate, [
                (lib, *job[:3], args.repeat, m) for lib, job in zip(libs, jobs)
                if not isinstance(lib, BaseException)])
            k = 0
            for t in tasks:
                for j, _ in enumerate(configs[t.key]):
                    r = timed[k] if not isinstance(libs[k], BaseException) else None
                    k += 1
                    if r is None or isinstance(r, BaseException) or r.error:
                        continue
                    cost = statistics.median(r.costs)
                    key = (t.key, j)
                    rnd[m][key] = cost
                    alone[m][key] = min(alone[m].get(key, math.inf), cost)
    ex.close()

    fp = cpu_fingerprint()
    variants = max(len(c) for c in configs.values())
    executors, names = [], []
    shapes = input_shapes(model)
    inputs = {n: np.random.default_rng(args.seed).standard_normal(s).astype("float32")
              for n, s in shapes.items()}
    for j in range(variants):
        recs = [TuningRecord(t.key, t.name, configs[t.key][j], (1.0,), None, args.target, fp,
                             __version__) for t in tasks if j < len(configs[t.key])]
        history = _naming(recs)
        lib = kiln.build(mod, args.target, params=params, tuning_records=history)
        dbg = GraphExecutorDebug(lib.graph_json, lib.lib, kiln.cpu(), lib.params)
        for n, v in inputs.items():
            dbg.set_input(n, v)
        dbg.run()
        executors.append(dbg)
        names.append(history.keys)
    print(f"{variants} model variants built", flush=True)
    in_model = in_model_times(executors, args.passes)
    model_time = _per_task(in_model, names, args.passes, slice(None))
    halves = [_per_task(in_model, names, args.passes, slice(h, None, 2)) for h in (0, 1)]
    report(tasks, configs, alone, model_time, methods)
    print("\nnoise floors (the same timer twice):")
    for m in methods:
        _agreement(f"{m} round 1 vs round 2", tasks, configs, rounds[0][m], rounds[1][m])
    _agreement("in-model even vs odd passes", tasks, configs, halves[0], halves[1])
    return 0


def _per_task(in_model, names, passes: int, which: slice) -> dict[tuple[str, int], float]:
    """(task key, variant) → in-model seconds per call: the median over the ``which``
    passes of each node of the task, averaged over its nodes."""
    acc: dict[tuple[str, int], list[float]] = {}
    for j, (times, keys) in enumerate(zip(in_model, names)):
        for fname, ts in times.items():
            key = keys.get(fname)
            if key is None:
                continue
            nodes = len(ts) // passes
            for n in range(nodes):  # calls are in pass order: node n of pass p at p*nodes+n
                acc.setdefault((key, j), []).append(
                    statistics.median(ts[n::nodes][which]))
    return {k: statistics.mean(v) for k, v in acc.items()}


def _agreement(label, tasks, configs, a, b) -> None:
    """How well timer ``a`` predicts timer ``b``: mean |log| of the ratio-to-default error,
    Pearson correlation of the log ratios, mean |log(a / b)| of the times themselves."""
    errs, xs, ys, absolute = [], [], [], []
    for t in tasks:
        if (t.key, 0) not in a or (t.key, 0) not in b:
            continue
        for j, _ in enumerate(configs[t.key]):
            k = (t.key, j)
            if k not in a or k not in b:
                continue
            absolute.append(abs(math.log(a[k] / b[k])))
            if j:
                x, y = math.log(a[k] / a[(t.key, 0)]), math.log(b[k] / b[(t.key, 0)])
                errs.append(abs(x - y))
                xs.append(x)
                ys.append(y)
    r = statistics.correlation(xs, ys) if len(xs) > 2 else float("nan")
    print(f"  {label}: ratio-to-default error mean |log| {statistics.mean(errs):.3f}; "
          f"Pearson of log ratios {r:.2f}; time error mean |log| "
          f"{statistics.mean(absolute):.3f}")


def _naming(records):
    """An ApplyHistoryBest of ``records`` that also notes each kernel's workload key
    (``.keys``: kernel name → key)."""
    from kiln.driver.apply_history import ApplyHistoryBest, workload_key

    class Naming(ApplyHistoryBest):
        def lower(self, call, name):
            self.keys[name] = workload_key(call.body, self.target)
            return super().lower(call, name)

    obj = Naming(records)
    obj.keys = {}
    return obj


def report(tasks, configs, alone, model_time, methods) -> None:
    print("\n| task ×w | cfg | " + " | ".join(f"{m} us" for m in methods) + " | in-model us |")
    print("|---|---|" + "---|" * len(methods) + "---|")
    for t in tasks:
        for j, _ in enumerate(configs[t.key]):
            k = (t.key, j)
            if k not in model_time:
                continue
            row = " | ".join(f"{alone[m][k] * 1e6:.1f}" if k in alone[m] else "-"
                             for m in methods)
            print(f"| {t.name[:40]} ×{t.weight} | {j} | {row} | {model_time[k] * 1e6:.1f} |")
    print()
    base = sum(t.weight * model_time.get((t.key, 0), 0.0) for t in tasks)
    best = sum(t.weight * min(model_time[(t.key, j)] for j, _ in enumerate(configs[t.key])
                              if (t.key, j) in model_time) for t in tasks
               if (t.key, 0) in model_time)
    print(f"in-model Σ weight × time: default configs {base * 1e3:.3f} ms, in-model best of "
          f"the sampled configs {best * 1e3:.3f} ms ({base / best:.3f}×)")
    for m in methods:
        errs, rhos, pick_total, abs_sum, model_sum = [], [], 0.0, 0.0, 0.0
        for t in tasks:
            js = [j for j, _ in enumerate(configs[t.key])
                  if (t.key, j) in alone[m] and (t.key, j) in model_time]
            if 0 not in js or len(js) < 2:
                continue
            a0, c0 = alone[m][(t.key, 0)], model_time[(t.key, 0)]
            for j in js[1:]:
                errs.append(abs(math.log((alone[m][(t.key, j)] / a0)
                                         / (model_time[(t.key, j)] / c0))))
            rhos.append(spearman([alone[m][(t.key, j)] for j in js],
                                 [model_time[(t.key, j)] for j in js]))
            pick = min(js, key=lambda j: alone[m][(t.key, j)])
            pick_total += t.weight * model_time[(t.key, pick)]
            abs_sum += t.weight * a0
            model_sum += t.weight * c0
        rhos = [r for r in rhos if not math.isnan(r)]
        _agreement(f"{m} vs in-model", tasks, configs, alone[m], model_time)
        print(f"  {m}: ratio-to-default error mean |log| {statistics.mean(errs):.3f} "
              f"(median {statistics.median(errs):.3f}); Spearman per task mean "
              f"{statistics.mean(rhos):.2f}; its picks in the model {pick_total * 1e3:.3f} ms "
              f"({base / pick_total:.3f}× vs default); default configs alone "
              f"{abs_sum * 1e3:.3f} ms vs in-model {model_sum * 1e3:.3f} ms")


if __name__ == "__main__":
    sys.exit(main())
