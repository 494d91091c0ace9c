"""Untuned vs tuned Kiln on one model (issue 19): ``kiln tune`` with a budget, then both
libraries (and onnxruntime) timed in one process, interleaved.

::

    .venv/bin/python benchmarks/tune.py --model squeezenet --time-budget 10m --threads 1

``--model`` is a model of ``benchmarks/models.py`` (float32 inputs, standard normal) or a case
of ``benchmarks/encoders.py`` with its spaces as underscores (``minilm_1x128``,
``minilm_int8_1x128``: int64 token inputs, the shapes fixed as there).

Prints one markdown table: per engine the median wall and thread-CPU milliseconds per run
(with ``--threads 1`` the kernels run on the calling thread, so its CPU time is the model's
time even on a loaded machine; with more threads it misses the workers' time and the wall
time is the latency), the tune's trial count and time, and the load average. Records and
libraries go to ``--workdir`` (default: a temporary folder).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="squeezenet",
                   help="a model of benchmarks/models.py, or a case of benchmarks/encoders.py "
                        "with '_' for ' ' (minilm_int8_1x128)")
    p.add_argument("--target", default="llvm -mcpu=native")
    budget = p.add_mutually_exclusive_group()
    budget.add_argument("--time-budget", type=float, default=None, metavar="SECONDS")
    budget.add_argument("--trials", type=int, default=None)
    p.add_argument("--threads", type=int, default=1, help="KILN_NUM_THREADS and ORT threads")
    p.add_argument("--repeat", type=int, default=30, help="timed runs per engine (default 30)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--measure", default="flush", help="how candidates are timed: flush | hot")
    p.add_argument("--confirm", type=int, default=2,
                   help="re-measurements of each kernel's winner (kiln tune --confirm)")
    p.add_argument("--tuning-records", default=None,
                   help="reuse these records instead of tuning (nothing is measured)")
    p.add_argument("--workdir", default=None)
    return p.parse_args(argv)


def _timed_runs(run, repeat: int, blocks: int = 5) -> tuple[list[float], list[float]]:
    """``repeat`` runs of ``run`` in ``blocks`` (so engines interleave): wall and thread-CPU
    seconds of each."""
    wall, cpu = [], []
    for _ in range(max(1, repeat // blocks)):
        t0, c0 = time.perf_counter(), time.thread_time()
        run()
        wall.append(time.perf_counter() - t0)
        cpu.append(time.thread_time() - c0)
    return wall, cpu


def load_bench_model(name: str, seed: int, work: Path):
    """``(model, onnx_path, {input: shape}, inputs)`` of ``--model``: an encoders.py case
    (its model file and token inputs, ``encoders.feed_inputs``) or a models.py model (saved to
    ``work``; standard-normal float32 inputs), inputs seeded with ``seed``."""
    import numpy as np
    import onnx
    from encoders import CASES, case_model_path, feed_inputs

    from models import input_shapes, load_model

    rng = np.random.default_rng(seed)
    cases = {case.replace(" ", "_"): (wheel, shapes) for case, wheel, shapes in CASES}
    if name in cases:
        wheel, shapes = cases[name]
        path = case_model_path(wheel, work)
        return onnx.load(str(path)), path, shapes, feed_inputs(shapes, rng)
    model = load_model(name, seed)
    path = work / f"{name}.onnx"
    onnx.save(model, path)
    shapes = input_shapes(model)
    return model, path, shapes, {n: rng.standard_normal(s).astype("float32")
                                 for n, s in shapes.items()}


def main(argv=None) -> int:
    args = parse_args(argv)
    os.environ["KILN_NUM_THREADS"] = str(args.threads)
    import onnxruntime as ort

    import kiln
    from kiln import progress
    from kiln.cli.tune import tune_model

    progress.set_quiet(True)
    work = Path(args.workdir or tempfile.mkdtemp(prefix="kiln-tune-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    model, onnx_path, shapes, inputs = load_bench_model(args.model, args.seed, work)
    records = Path(args.tuning_records) if args.tuning_records else work / "records.jsonl"
    start = time.perf_counter()
    result = None
    if not args.tuning_records:
        result = tune_model(str(onnx_path), str(records), target=args.target,
                            trials=args.trials, input_shapes=list(shapes.items()),
                            time_budget=args.time_budget if args.trials is None else None,
                            measure=args.measure, confirm=args.confirm)
    tune_s = time.perf_counter() - start
    libs = {"untuned": work / "untuned.so", "tuned": work / "tuned.so"}
    from kiln.driver.apply_history import ApplyHistoryBest
    from kiln.frontend import from_onnx

    mod, params = from_onnx(model, shape=shapes)
    tuning = ApplyHistoryBest(str(records), measure=args.measure)  # records of this method
    for name, records_used in (("untuned", None), ("tuned", tuning)):
        kiln.build(mod, args.target, params=params,
                   tuning_records=records_used).export_library(str(libs[name]))
    print(tuning.summary())

    runs = {}
    for name, path in libs.items():
        gmod = kiln.graph_executor.GraphModule(
            kiln.runtime.load_module(str(path))["default"](kiln.cpu()))
        for k, v in inputs.items():
            gmod.set_input(k, v)
        runs[name] = gmod.run
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = args.threads
    opts.inter_op_num_threads = 1
    sess = ort.InferenceSession(str(onnx_path), opts, providers=["CPUExecutionProvider"])
    ort_inputs = {i.name: inputs[i.name] for i in sess.get_inputs()}
    runs["onnxruntime"] = lambda: sess.run(None, ort_inputs)
    for run in runs.values():  # warm-up
        for _ in range(3):
            run()
    times: dict[str, tuple[list[float], list[float]]] = {n: ([], []) for n in runs}
    for block in range(6):  # the order reversed every other block: no engine always follows
        for name in (list(runs) if block % 2 == 0 else list(reversed(runs))):  # the same one
            wall, cpu = _timed_runs(runs[name], args.repeat)
            times[name][0].extend(wall)
            times[name][1].extend(cpu)
    trials = result.trials if result else 0
    confirmed = result.confirmed if result else 0
    print(f"\n{args.model}, {args.target}, {args.threads} thread(s), measure {args.measure}; "
          f"tune: {trials} trials + {confirmed} re-measurements in {tune_s:.0f} s\n")
    if result and result.latency() > 0:  # 0: no candidate was measured
        default, tuned = result.latency(default=True), result.latency()
        print(f"tuner's estimate of the tuned kernels' time per run (Σ weight × best): "
              f"{default * 1e3:.2f} ms default → {tuned * 1e3:.2f} ms "
              f"({default / tuned:.3f}×)\n")
    print("| engine | median wall ms | median thread-CPU ms | CPU vs untuned | CPU vs ORT |")
    print("|---|---|---|---|---|")
    cpu_ms = {n: statistics.median(c) * 1e3 for n, (_, c) in times.items()}
    for name, (wall, _) in times.items():
        print(f"| {name} | {statistics.median(wall) * 1e3:.2f} | {cpu_ms[name]:.2f} | "
              f"{cpu_ms['untuned'] / cpu_ms[name]:.3f}× | "
              f"{cpu_ms[name] / cpu_ms['onnxruntime']:.3f} |")
    load = " / ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"\nload average (1/5/15 min) at the end: {load}; records: {records}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
