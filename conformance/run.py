"""Run ONNX's node conformance cases through a backend, in parallel, and tabulate the results.

``make conformance`` runs every node test case that the installed onnx generates (onnx 1.23:
1884, the ``*_expanded`` function-body variants included) through Kiln's ONNX backend
(``kiln.driver.onnx_backend``) and writes, under ``conformance/results/``:

- ``<backend>.json``: totals, wall time, per op type counts, and every case with its status,
  reason and time;
- ``<backend>.md``: the same as a markdown table (one row per op type) with the totals.

Each case runs in a worker process (``conformance/worker.py``); a case that crashes its worker
(a signal) or runs past ``--timeout`` is recorded as a ``fail`` with that reason, and the worker
is replaced. Pass/fail compares like ONNX's runner with rtol 1e-3, atol 1e-5, exact dtype and
shape. ``--backend onnxruntime`` runs onnxruntime's own ONNX backend under the same rules.

Usage::

    python conformance/run.py [--workers 2] [--backend kiln|onnxruntime] [--target c]
                              [--filter REGEX] [--timeout 300] [--out conformance/results]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import threading
import time
import warnings
from collections import Counter, defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
_EXPANDED = re.compile(r"_expanded(_ver\d+)?$")


def case_op_types() -> dict[str, str]:
    """Every generated node case name → the op type it tests (expanded cases: their op's)."""
    warnings.filterwarnings("ignore")
    from onnx.backend.test.loader import load_model_tests

    cases = load_model_tests(kind="node")
    ops: dict[str, str] = {}
    for c in cases:
        if not _EXPANDED.search(c.name):
            node = c.model.graph.node[0]
            ops[c.name] = f"{node.domain}.{node.op_type}" if node.domain else node.op_type
    for c in cases:
        if _EXPANDED.search(c.name):
            ops[c.name] = ops.get(_EXPANDED.sub("", c.name), "?")
    return ops


class _Worker:
    """One worker process and the thread that feeds it cases from the shared queue."""

    def __init__(self, args: argparse.Namespace, queue: list[str], results: dict[str, dict],
                 lock: threading.Lock, progress):
        self.args, self.queue, self.results, self.lock = args, queue, results, lock
        self.progress = progress
        self.proc: subprocess.Popen | None = None

    def _start(self) -> None:
        env = dict(os.environ, KILN_NUM_THREADS="1", OMP_NUM_THREADS="1")
        self.proc = subprocess.Popen(
            [sys.executable, str(HERE / "worker.py"), self.args.backend, self.args.target],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
            env=env)
        ready = self.proc.stdout.readline()
        if not ready.startswith('{"ready"'):
            raise SystemExit(f"conformance worker failed to start: {ready!r}")

    def _next(self) -> str | None:
        with self.lock:
            return self.queue.pop() if self.queue else None

    def run(self) -> None:
        while (name := self._next()) is not None:
            if self.proc is None:
                self._start()
            result = self._run_one(name)
            result["name"] = name
            with self.lock:
                self.results[name] = result
                self.progress(result)
        if self.proc is not None:
            self.proc.stdin.close()
            self.proc.wait()

    def _run_one(self, name: str) -> dict:
        proc = self.proc
        timed_out = threading.Event()

        def kill() -> None:
            timed_out.set()
            proc.kill()

        timer = threading.Timer(self.args.timeout, kill)
        timer.start()
        start = time.perf_counter()
        try:
            proc.stdin.write(name + "\n")
            proc.stdin.flush()
            line = proc.stdout.readline()
        except (BrokenPipeError, OSError):
            line = ""
        finally:
            timer.cancel()
        if line:
            return json.loads(line)
        code = proc.wait()
        self.proc = None  # the next case starts a fresh worker
        seconds = round(time.perf_counter() - start, 3)
        if timed_out.is_set():
            return {"status": "fail", "reason": f"timeout after {self.args.timeout} s",
                    "seconds": seconds}
        return {"status": "fail", "reason": f"worker crashed (exit status {code})",
                "seconds": seconds}


def run_cases(args: argparse.Namespace, names: list[str]) -> dict[str, dict]:
    """Run ``names`` on ``args.workers`` workers; returns results by case name."""
    queue = sorted(names, reverse=True)  # popped from the end: alphabetical order
    results: dict[str, dict] = {}
    lock = threading.Lock()
    total = len(names)

    def progress(result: dict) -> None:
        if args.verbose:
            print(f"[{len(results)}/{total}] {result['status']:<11} {result['name']} "
                  f"{result.get('reason', '')[:120]}", flush=True)
        elif len(results) % 100 == 0:
            print(f"{len(results)}/{total} cases done", flush=True)

    workers = [_Worker(args, queue, results, lock, progress) for _ in range(args.workers)]
    threads = [threading.Thread(target=w.run) for w in workers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def summarize(results: dict[str, dict], ops: dict[str, str]) -> tuple[dict, dict]:
    """(totals, per op type counts) from the case results."""
    per_op: dict[str, Counter] = defaultdict(Counter)
    for name, r in results.items():
        per_op[ops.get(name, "?")][r["status"]] += 1
    totals = Counter(r["status"] for r in results.values())
    table = {op: {s: c[s] for s in ("pass", "fail", "unsupported")} for op, c in
             sorted(per_op.items())}
    return {s: totals[s] for s in ("pass", "fail", "unsupported")} | {"cases": len(results)}, \
        table


def write_reports(out: Path, backend: str, meta: dict, totals: dict, table: dict,
                  results: dict[str, dict], ops: dict[str, str]) -> tuple[Path, Path]:
    """Write ``<backend>.json`` and ``<backend>.md`` atomically (temp name + rename)."""
    out.mkdir(parents=True, exist_ok=True)
    cases = {n: {"op_type": ops.get(n, "?"), **{k: v for k, v in r.items() if k != "name"}}
             for n, r in sorted(results.items())}
    doc = {**meta, "totals": totals, "op_types": table, "cases": cases}
    json_path, md_path = out / f"{backend}.json", out / f"{backend}.md"
    _write_atomic(json_path, json.dumps(doc, indent=1) + "\n")
    _write_atomic(md_path, _markdown(backend, meta, totals, table, cases))
    return json_path, md_path


def _markdown(backend: str, meta: dict, totals: dict, table: dict, cases: dict) -> str:
    lines = [f"# ONNX node conformance: {backend}", "",
             (f"onnx {meta['onnx']}, {totals['cases']} cases, rtol {meta['rtol']}, "
             f"atol {meta['atol']}, exact dtype and shape; target `{meta['target']}`; "
             f"{meta['workers']} workers, {meta['wall_s']:.0f} s wall."), "",
             (f"**Totals: {totals['pass']} pass, {totals['fail']} fail, "
             f"{totals['unsupported']} unsupported.**"), "",
             "| op type | pass | fail | unsupported | a reason (first non-passing case) |",
             "|---|---:|---:|---:|---|"]
    first_reason: dict[str, str] = {}
    for name, c in cases.items():
        if c["status"] != "pass":
            first_reason.setdefault(c["op_type"], f"`{name}`: {c['reason']}")
    for op, c in table.items():
        reason = first_reason.get(op, "").replace("|", "\\|")[:200]
        lines.append(f"| {op} | {c['pass']} | {c['fail']} | {c['unsupported']} | {reason} |")
    return "\n".join(lines) + "\n"


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--backend", default="kiln", choices=["kiln", "onnxruntime"])
    parser.add_argument("--target", default="c", help="Kiln target (default: c)")
    parser.add_argument("--filter", default="", help="only case names matching this regex")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per case")
    parser.add_argument("--out", type=Path, default=HERE / "results")
    parser.add_argument("-v", "--verbose", action="store_true", help="one line per case")
    args = parser.parse_args(argv)

    import onnx
    from worker import ATOL, RTOL

    ops = case_op_types()
    names = [n for n in ops if re.search(args.filter, n)]
    start = time.perf_counter()
    results = run_cases(args, names)
    wall = time.perf_counter() - start
    totals, table = summarize(results, ops)
    meta = {"backend": args.backend, "onnx": onnx.__version__, "target": args.target,
            "rtol": RTOL, "atol": ATOL, "workers": args.workers, "wall_s": round(wall, 1),
            "filter": args.filter}
    json_path, md_path = write_reports(args.out, args.backend, meta, totals, table, results, ops)
    print(f"{args.backend}: {totals['pass']} pass, {totals['fail']} fail, "
          f"{totals['unsupported']} unsupported of {totals['cases']} cases in {wall:.0f} s "
          f"({md_path}, {json_path})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
