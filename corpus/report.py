"""corpus/results/results.json and results.md from the per-model records of ``corpus/run.py``:
one row per model, the counts, and the failures grouped by their exact error text."""

from __future__ import annotations

import json
import platform
import re
import time
from collections import defaultdict
from pathlib import Path


def build_status(record: dict, build: str) -> str:
    """``match`` (compiled, every run matched onnxruntime), ``mismatch``, ``run error``,
    ``compile error``, ``export error`` or ``not reached``."""
    steps = record["steps"]
    if steps.get("export", {}).get("status") == "error":
        return "export error"
    step = steps.get(f"compile_{build}") or {}
    if step.get("status") == "error":
        return "compile error"
    if (steps.get(f"load_{build}") or {}).get("status") == "error":
        return "load error"
    runs = [v for k, v in record["runs"].items() if k.startswith(f"{build}@")]
    if not step or not runs:
        return "not reached"
    kinds = {r["status"] for r in runs}
    for status in ("error", "mismatch", "reference_error", "no_reference"):
        if status in kinds:
            return {"error": "run error", "reference_error": "ort error",
                    "no_reference": "ort error"}.get(status, status)
    return "match"


def cause(text: str) -> str:
    """An error's text with numbers, paths and names in quotes masked, so that one cause
    groups the models it hits."""
    first = text.split(" (cause:")[0]
    first = re.sub(r"(?<![\w)/])/[\w.+-]+/[\w./+-]+", "<path>", first)  # not `//`
    first = re.sub(r"'[^']*'", "'…'", first)
    return re.sub(r"\d+", "N", first)[:220]


def _raised_at(step: dict) -> str:
    """`` (raised at relay/transform/fuse_ops.py:131 in _absorb_side_inputs)``: the last kiln
    frame of the first traceback, the original error's (a cause is printed before what it
    caused)."""
    where = step.get("where", "")
    first = re.split(r"\n(?:The above exception|During handling)", where)[0]
    pattern = r'File "[^"]*/kiln/([^"]+)", line (\d+), in (\w+)'
    frames = re.findall(pattern, first) or re.findall(pattern, where)
    if not frames:
        return ""
    path, line, func = frames[-1]
    return f" (raised at {path}:{line} in {func})"


def failures(records: list[dict]) -> dict[str, list[tuple[str, str, str]]]:
    """cause → [(model, step, exact text)]."""
    out = defaultdict(list)
    for r in records:
        for step, v in r["steps"].items():
            if v.get("status") == "error":
                out[cause(v["error"]) + _raised_at(v)].append((r["name"], step, v["error"]))
        for key, v in r["runs"].items():
            if v["status"] in ("error", "reference_error"):
                out[cause(v["error"])].append((r["name"], f"run {key}", v["error"]))
            elif v["status"] == "mismatch":
                detail = re.sub(r"\d[\d.e+-]*", "N", v["detail"])
                out[f"mismatch: {detail}"].append((r["name"], f"run {key}", v["detail"]))
        if r.get("failure"):
            out[cause(r["failure"])].append((r["name"], "child", r["failure"][:600]))
    return dict(sorted(out.items(), key=lambda kv: -len(kv[1])))


def _ms(record: dict, name: str) -> str:
    v = record.get("ms", {}).get(name)
    return "" if v is None else f"{v:.2f}"


def _exported(record: dict) -> str:
    if record.get("source") == "wheel":
        return "wheel's file"
    return f"{record.get('exporter', '')} {record.get('opset', '')}"


def _status_cell(record: dict, build: str) -> str:
    kind = record.get("executor", {}).get(build)
    return build_status(record, build) + (f" ({kind})" if kind else "")


def _compile_s(record: dict, build: str) -> str:
    step = record["steps"].get(f"compile_{build}")
    return f"{step['seconds']:.0f}" if step and step["status"] == "ok" else ""


def write_report(records: list[dict], json_path: Path, md_path: Path) -> None:
    """Write both files (the JSON keeps every record verbatim)."""
    meta = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
            "threads": 1}
    json_path.write_text(json.dumps({"meta": meta, "models": records}, indent=1) + "\n")
    lines = [
        "# Kiln corpus results",
        "",
        f"{meta['date']}, {len(records)} models, timings at 1 thread (median ms; Kiln's "
        "default target). `symbolic`: compiled with no flags (the export's symbolic dims "
        "kept; the executor Kiln chose in parentheses), run at each of the model's shapes; "
        "`static`: compiled at the fixed shape. Match: every output within 1e-3 of "
        "max|onnxruntime| + 1e-4. "
        "Written by `make corpus` (corpus/run.py).",
        "",
        *_counts(records),
        "",
        "| model | source | exporter, opset | symbolic | compile s | static | compile s "
        "| kiln sym ms | kiln static ms | ort ms | what |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in records:
        lines.append(
            f"| {r['name']} | {r.get('source', '')} | {_exported(r)} | "
            f"{_status_cell(r, 'symbolic')} | "
            f"{_compile_s(r, 'symbolic')} | {_status_cell(r, 'static')} | "
            f"{_compile_s(r, 'static')} | {_ms(r, 'symbolic')} | {_ms(r, 'static')} | "
            f"{_ms(r, 'onnxruntime')} | {r.get('note', '')} |")
    lines += ["", "## Failures by cause", ""]
    for text, hits in failures(records).items():
        lines.append(f"### {len(hits)} × `{text}`")
        lines.append("")
        for model, step, exact in hits:
            lines.append(f"- {model}, {step}: `{exact.replace('`', chr(39))}`")
        lines.append("")
    md_path.write_text("\n".join(lines) + "\n")


def _counts(records: list[dict]) -> list[str]:
    n = len(records)
    out = []
    for build in ("symbolic", "static"):
        statuses = [build_status(r, build) for r in records]
        compiled = sum(s not in ("compile error", "export error", "not reached")
                       for s in statuses)
        out.append(f"- {build}: {compiled}/{n} compile, {statuses.count('match')}/{n} match "
                   f"onnxruntime at every shape ("
                   + ", ".join(f"{s}: {statuses.count(s)}" for s in sorted(set(statuses)))
                   + ")")
    exported = sum(r["steps"].get("export", {}).get("status") == "ok" for r in records)
    out.append(f"- exported or fetched: {exported}/{n}")
    return out
