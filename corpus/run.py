"""``make corpus``: every corpus model through Kiln vs onnxruntime, a table of the results.

For each model (a child process each, so that a crash or a hang costs one row): export or fetch
the ONNX file (cached), compile it with no flags (symbolic dims kept: the VM) and at its fixed
shape, run the symbolic build at each of its shapes and the static one at its shape against
onnxruntime, time both and onnxruntime at one thread. Writes corpus/results/results.json and
results.md after every model, so a partial run still leaves a table.

    python corpus/run.py [--models a,b] [--source torchvision] [--timeout 900] [--no-time]
    python corpus/run.py --merge other/results.json   # join a parallel run's rows
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # `python corpus/run.py` imports the corpus package

from corpus.models import MODELS  # noqa: E402
from corpus.report import write_report  # noqa: E402

RESULTS = HERE / "results"


def run_child(name: str, timeout: float, do_time: bool) -> dict:
    """``measure`` of one model in a child process; a timeout or a crash is recorded with what
    the child had saved."""
    with tempfile.TemporaryDirectory(prefix="corpus-") as tmp:
        out = Path(tmp) / "record.json"
        cmd = [sys.executable, str(HERE / "run.py"), "--one", name, "--record", str(out)]
        if not do_time:
            cmd.append("--no-time")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            p for p in (str(HERE.parent), os.environ.get("PYTHONPATH", "")) if p)}
        start = time.perf_counter()
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
            failure = None if proc.returncode == 0 else (
                f"child exited with {proc.returncode}: {proc.stderr.strip()[-800:]}")
        except subprocess.TimeoutExpired:
            failure = f"timeout after {timeout:.0f} s"
        record = json.loads(out.read_text()) if out.exists() else {
            "name": name, "steps": {}, "runs": {}, "ms": {}}
        if failure:
            record["failure"] = failure
        record["wall_s"] = round(time.perf_counter() - start, 1)
        return record


def _one(name: str, record_path: str, do_time: bool) -> int:
    from corpus.measure import measure

    def save(record):
        tmp = record_path + ".tmp"
        Path(tmp).write_text(json.dumps(record, indent=1))
        os.replace(tmp, record_path)

    save(measure(MODELS[name], save, do_time=do_time))
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="", help="comma-separated names (default: all)")
    p.add_argument("--source", default="", help="only torchvision, transformers or wheel")
    p.add_argument("--timeout", type=float, default=900, help="seconds per model")
    p.add_argument("--no-time", action="store_true", help="skip the timings")
    p.add_argument("--results", default=str(RESULTS), help="folder of results.{json,md}")
    p.add_argument("--keep", action="store_true",
                   help="keep the other rows of results.json (update the models run)")
    p.add_argument("--merge", action="append", default=[], metavar="RESULTS_JSON",
                   help="add the models of another run's results.json (e.g. a second run "
                        "with --results) to this folder's, write the table, run nothing")
    p.add_argument("--one", help=argparse.SUPPRESS)
    p.add_argument("--record", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.one:
        return _one(args.one, args.record, not args.no_time)
    names = [n for n in args.models.split(",") if n] or list(MODELS)
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        p.error(f"unknown models {unknown}; known: {', '.join(MODELS)}")
    names = [n for n in names if not args.source or MODELS[n].source == args.source]
    results = Path(args.results)
    results.mkdir(exist_ok=True)
    json_path = results / "results.json"
    records = {}
    if (args.keep or args.merge) and json_path.exists():
        records = {r["name"]: r for r in json.loads(json_path.read_text())["models"]}
    if args.merge:
        for other in args.merge:
            records.update({r["name"]: r for r in json.loads(Path(other).read_text())["models"]})
        write_report([records[n] for n in MODELS if n in records], json_path,
                     results / "results.md")
        return 0
    for k, name in enumerate(names):
        print(f"[{k + 1}/{len(names)}] {name} ...", flush=True)
        records[name] = run_child(name, args.timeout, not args.no_time)
        ordered = [records[n] for n in MODELS if n in records]
        write_report(ordered, json_path, results / "results.md")
        print(f"    {summary_line(records[name])}", flush=True)
    return 0


def summary_line(record: dict) -> str:
    """One line per model for the console."""
    steps = " ".join(f"{k}={v['status']}" for k, v in record["steps"].items())
    runs = " ".join(f"{k}:{v['status']}" for k, v in record["runs"].items())
    return f"{record['wall_s']} s  {steps}  {runs}  {record.get('failure', '')}"[:400]


if __name__ == "__main__":
    sys.exit(main())
