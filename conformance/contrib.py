"""Run the single-op cases of onnxruntime's ``com.microsoft`` contrib ops through Kiln and
tabulate them beside the ONNX conformance table.

The cases are those of the test suite (``tests/helpers/contrib_cases.py``): each builds one
contrib node (or the model onnxruntime's ``quantize_dynamic`` writes), compiles it with Kiln for
``--target`` (``llvm`` by default), runs it and compares with onnxruntime under the case's
tolerance. Writes ``<out>/contrib.md`` and ``<out>/contrib.json`` (``make conformance`` runs it
after ``conformance/run.py``).

Usage: ``python conformance/contrib.py [--target llvm] [--out conformance/results]``
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "helpers"))
from backend_helpers import compile_and_run, run_onnxruntime  # noqa: E402
from contrib_cases import CASES, compare  # noqa: E402


def run_case(case, target: str) -> dict:
    """``{"case", "status" (pass/fail), "reason", "seconds"}`` of one case."""
    start = time.perf_counter()
    try:
        model, feeds = case.build()
        with tempfile.TemporaryDirectory() as tmp:
            got = compile_and_run(model, feeds, Path(tmp), target=target)
        problem = compare(case, got, run_onnxruntime(model, feeds))
    except Exception as err:  # noqa: BLE001 - a case's failure is a row of the table
        problem = f"{type(err).__name__}: {err}".splitlines()[0]
        traceback.print_exc(file=sys.stderr)
    return {"case": case.name, "status": "pass" if problem is None else "fail",
            "reason": problem or "", "seconds": round(time.perf_counter() - start, 2)}


def render(rows: list[dict], target: str) -> str:
    passed = sum(r["status"] == "pass" for r in rows)
    lines = ["# com.microsoft contrib ops vs onnxruntime", "",
             f"{passed} of {len(rows)} single-op cases pass (target `{target}`; cases: "
             "tests/helpers/contrib_cases.py).", "",
             "| case | status | reason | seconds |", "|---|---|---|---:|"]
    lines += [f"| {r['case']} | {r['status']} | {r['reason'].replace('|', '/')} | "
              f"{r['seconds']} |" for r in rows]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="llvm")
    parser.add_argument("--out", type=Path, default=ROOT / "conformance" / "results")
    args = parser.parse_args(argv)
    rows = []
    for case in CASES:
        rows.append(run_case(case, args.target))
        print(f"{rows[-1]['status']:4}  {case.name}  {rows[-1]['reason']}")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "contrib.json").write_text(json.dumps({"target": args.target, "cases": rows},
                                                      indent=1) + "\n")
    (args.out / "contrib.md").write_text(render(rows, args.target))
    passed = sum(r["status"] == "pass" for r in rows)
    print(f"{passed} passed, {len(rows) - passed} failed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
