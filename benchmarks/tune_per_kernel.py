"""Per kernel: the tuner's gain (records) against the gain inside the model (issue 19).

Loads an untuned and a tuned library of the same model (``benchmarks/tune.py --workdir``
leaves both and the records), runs both node by node, interleaved, timing each kernel call
in place (thread CPU time; ``KILN_NUM_THREADS=1``), and prints per tuned kernel: the
default and chosen configs' times in the records (as ``kiln compile`` ranks them: median
over a config's records) and the median in-model time of each library::

    KILN_NUM_THREADS=1 PYTHONPATH=src .venv/bin/python benchmarks/tune_per_kernel.py \\
        --workdir /tmp/kiln-tune-bench-xyz --model squeezenet
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workdir", required=True, help="benchmarks/tune.py's --workdir")
    p.add_argument("--model", default="squeezenet")
    p.add_argument("--target", default="llvm -mcpu=native")
    p.add_argument("--passes", type=int, default=100)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def node_times(executors, passes: int) -> list[dict[int, list[float]]]:
    """Per executor: node id → thread-CPU seconds of each call (passes interleaved)."""
    out: list[dict[int, list[float]]] = [{} for _ in executors]
    for _ in range(passes):
        for times, ex in zip(out, executors):
            ex._run_prologue()
            for nid, op in zip(ex._op_nids, ex._op_execs):
                t0 = time.thread_time()
                op()
                times.setdefault(nid, []).append(time.thread_time() - t0)
            ex._run_epilogue()
    return out


def main(argv=None) -> int:
    args = parse_args(argv)
    os.environ["KILN_NUM_THREADS"] = "1"
    from tune import load_bench_model
    from tune_timers import _naming

    import kiln
    from kiln.driver.tuning_records import (
        best_records,
        config_times,
        cpu_fingerprint,
        load_records,
        median_record,
    )
    from kiln.frontend import from_onnx
    from kiln.runtime.graph_executor.debug import GraphExecutorDebug
    from kiln.tune.tasks import extract_tasks

    work = Path(args.workdir)
    model, _, shapes, inputs = load_bench_model(args.model, args.seed, work)
    mod, params = from_onnx(model, shape=shapes)
    tasks = {t.key: t for t in extract_tasks(mod, params, args.target)}
    records = load_records(work / "records.jsonl")
    times = config_times(records, args.target, cpu_fingerprint())
    applied = best_records(records, args.target, cpu_fingerprint())  # what compile applies
    naming = _naming(records)  # kernel name -> workload key, from the build's own lowering
    kiln.build(mod, args.target, params=params, tuning_records=naming)
    executors = []
    for name in ("untuned", "tuned"):
        ex = kiln.runtime.load_module(str(work / f"{name}.so"))["debug_create"](
            "default", kiln.cpu())
        assert isinstance(ex, GraphExecutorDebug)
        for k, v in inputs.items():
            ex.set_input(k, v)
        ex.run()
        executors.append(ex)
    untuned, tuned = node_times(executors, args.passes)
    graph = executors[0].graph
    print("| node | kernel | default → chosen config | records us | in-model us "
          "(untuned → tuned) |")
    print("|---|---|---|---|---|")
    total = [0.0, 0.0, 0.0, 0.0]
    for nid in executors[0]._op_nids:
        fname = graph.nodes[nid].func_name
        task = tasks.get(naming.keys.get(fname, ""))
        a, b = statistics.median(untuned[nid]), statistics.median(tuned[nid])
        configs = times.get(task.key, {}) if task else {}
        if not configs:
            continue
        medians = {c: median_record(rs).best for c, rs in configs.items()}
        default = medians.get(json.dumps(task.default_config(), sort_keys=True), float("nan"))
        chosen = applied[task.key].config_key()
        total = [total[0] + default, total[1] + medians[chosen], total[2] + a, total[3] + b]
        if chosen == json.dumps(task.default_config(), sort_keys=True):
            continue
        print(f"| {nid} | {fname[:36]} | {task.default_config()} → {chosen} | "
              f"{default * 1e6:.1f} → {medians[chosen] * 1e6:.1f} | "
              f"{a * 1e6:.1f} → {b * 1e6:.1f} |")
    print(f"\nover the tuned kernels' nodes: records {total[0] * 1e3:.3f} → "
          f"{total[1] * 1e3:.3f} ms ({total[0] / total[1]:.3f}×), in the model "
          f"{total[2] * 1e3:.3f} → {total[3] * 1e3:.3f} ms ({total[2] / total[3]:.3f}×)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
