"""Child process of the benchmark harness (``models.py``): time or measure one compiled model.

Run as ``python worker.py JOB.json``; ``models.py`` starts it with ``subprocess`` and the thread
count in the environment (``KILN_NUM_THREADS``, ``OMP_NUM_THREADS``), because a Kiln library
reads its thread count once, when it is loaded. The job file says what to do:

- ``"mode": "time"`` — load the exported Kiln library and the job's ``"peers"`` (onnxruntime,
  OpenVINO: ``peers.py``) side by side, check every output against onnxruntime's, then time each
  engine (untimed warm-up runs, then timed runs in alternating blocks, Kiln's first). A peer
  other than onnxruntime that fails to load or run is reported in the result, not fatal;
- ``"mode": "rss"`` with ``"engine": "kiln"`` or ``"ort"`` — load only that engine, run a few
  inferences and report the process's peak resident set size.

Its result (JSON) goes to the job's ``"result"`` path. Only numpy and the engines under test are
imported: Kiln's child imports ``kiln.runtime`` (no compiler, no onnx), loads the ``.so`` with
``load_module`` and never rebuilds it.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import peers

#: Alternating timed blocks per engine (see :func:`interleaved_medians_ms`).
ROUNDS = 3
#: seconds of idleness before each timed block: both engines' worker threads spin for a while
#: after their last run (onnxruntime's intra-op pool for tens of ms, Kiln's pool 100 us), and
#: on 2 cores the other engine's spinning threads would take a core from the block being timed
#: (measured: Kiln's squeezenet at 2 threads 7.5 ms instead of 3.3 ms for the first runs after an
#: onnxruntime block; onnxruntime 4.7-7 ms instead of 2.9 after a Kiln block)
PAUSE_S = 0.2
#: Inferences run before the peak RSS is read (the first run allocates everything it needs).
RSS_RUNS = 3


def make_feeds(shapes: dict[str, list[int]], seed: int) -> dict:
    """The benchmark input: seeded standard-normal ``float32`` arrays, one per graph input."""
    import numpy as np

    rng = np.random.default_rng(seed)
    return {name: rng.standard_normal(shape).astype(np.float32) for name, shape in shapes.items()}


def kiln_runner(so_path: str, feeds: dict) -> Callable[[], list]:
    """Load an exported Kiln library; returns one inference (set inputs, run, fetch outputs)."""
    from kiln.graph_executor import GraphModule
    from kiln.runtime import cpu, load_module

    gmod = GraphModule(load_module(so_path)["default"](cpu()))

    def run() -> list:
        for name, value in feeds.items():
            gmod.set_input(name, value)
        gmod.run()
        return [gmod.get_output(i).numpy() for i in range(gmod.get_num_outputs())]

    return run


def times_ms(fn: Callable[[], object], repeat: int) -> list[float]:
    """Wall times of ``repeat`` calls of ``fn``, in ms."""
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return times


def interleaved_medians_ms(fns: dict[str, Callable[[], object]], warmup: int,
                           repeat: int) -> dict[str, float]:
    """Median latency (ms) of each engine's ``repeat`` timed calls after ``warmup`` untimed ones.

    The timed calls run in :data:`ROUNDS` alternating blocks (engine A's block, engine B's, A's,
    ...), so that a change of machine load during the measurement hits both engines alike, each
    block after a pause of :data:`PAUSE_S` (the other engine's threads stop spinning).
    """
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for r in range(ROUNDS):
        block = repeat // ROUNDS + (r < repeat % ROUNDS)
        for name, fn in fns.items():
            time.sleep(PAUSE_S)
            times[name] += times_ms(fn, block)
    return {name: statistics.median(t) for name, t in times.items()}


def peak_rss_mib() -> float:
    """This process's peak resident set size so far (``VmHWM`` of /proc/self/status), in MiB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024  # the kernel reports kB
    raise RuntimeError("/proc/self/status has no VmHWM line")


def time_job(job: dict) -> dict:
    """Kiln and the peers in this process: each engine's output difference from onnxruntime's
    and median latency (ms; None for a peer that did not run, with ``<peer>_error``)."""
    feeds = make_feeds(job["inputs"], job["seed"])
    runs = {"kiln": kiln_runner(job["so"], feeds)}
    peer_runs, errors = peers.load_peers(job["peers"], job["onnx"], feeds, job["threads"],
                                         job["int8"])
    runs |= peer_runs
    result = peers.check_outputs(runs, errors, job["int8"])
    ms = interleaved_medians_ms(runs, job["warmup"], job["repeat"])
    result |= {f"{name}_ms": ms.get(name) for name in ("kiln", *job["peers"])}
    result |= {f"{name}_error": msg for name, msg in errors.items()}
    return result


def rss_job(job: dict) -> dict:
    """One engine alone in this process: its peak RSS (MiB) after :data:`RSS_RUNS` inferences."""
    feeds = make_feeds(job["inputs"], job["seed"])
    if job["engine"] == "kiln":
        run = kiln_runner(job["so"], feeds)
    else:
        run = peers.ort_runner(job["onnx"], feeds, job["threads"])
    for _ in range(RSS_RUNS):
        run()
    return {"peak_rss_mib": peak_rss_mib()}


def main(argv: list[str]) -> int:
    """Run the job file ``argv[0]`` and write its result next to it."""
    job = json.loads(Path(argv[0]).read_text())
    result = time_job(job) if job["mode"] == "time" else rss_job(job)
    Path(job["result"]).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
