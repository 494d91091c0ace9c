"""Generate ``docs/ops.md``: the ONNX ops Kiln converts, the ones it does not, and how each does
in ONNX's node conformance cases.

The table is built from three sources, so it cannot drift from the code without a test noticing
(tests/unit/test_ops_table.py renders it in memory and compares it with the committed page):

- the converter registry (:func:`kiln.frontend.list_converters`, the ``@onnx_op`` converters
  and their docstrings), the control-flow ops of ``kiln.frontend.onnx.control_flow`` and the
  ops the importer expands through their ONNX function body (``kiln.frontend.onnx.functions``);
- the op schemas of the installed onnx (every domain), for the opsets each op exists at and the
  ops Kiln lacks;
- ``docs/ops-conformance.json``: a small, deterministic per-op summary of one ``make
  conformance`` run (committed; no wall times), written by ``--results``.

Usage::

    python tools/gen_ops_table.py            # rewrite docs/ops.md (also: make ops)
    python tools/gen_ops_table.py --check    # exit 1 when docs/ops.md is stale
    make conformance && python tools/gen_ops_table.py --results conformance/results/kiln.json
                                             # refresh docs/ops-conformance.json, then the page
"""

from __future__ import annotations

import argparse
import inspect
import json
import re
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "src") not in sys.path:  # run from a checkout without installing kiln
    sys.path.insert(0, str(ROOT / "src"))

import onnx
from onnx import defs

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tools/generated.py
from generated import write_or_check  # noqa: E402

from kiln.frontend.onnx import control_flow
from kiln.frontend.onnx.contrib import list_contrib_ops
from kiln.frontend.onnx.importer import MAX_OPSET, MIN_OPSET
from kiln.frontend.onnx.registry import find_converter, list_converters

DOC = ROOT / "docs" / "ops.md"
SUMMARY = ROOT / "docs" / "ops-conformance.json"
COMMAND = "make ops (or: python tools/gen_ops_table.py)"
DEFAULT_DOMAIN = "ai.onnx"
STATUSES = ("pass", "fail", "unsupported")
_NOTE_CHARS = 120  # a note longer than this is cut at a word
_REASON_CHARS = 200  # the reasons kept in the summary, per non-passing case
_EXPANDED = re.compile(r"_expanded(_ver\d+)?$")  # conformance/run.py's function-body cases

# ----------------------------------------------------------------------------- sources


def onnx_schemas() -> dict[tuple[str, str], list[defs.OpSchema]]:
    """(domain, op type) → the op's schemas in onnx, oldest first; the default domain is
    spelled ``ai.onnx``."""
    found: dict[tuple[str, str], list[defs.OpSchema]] = {}
    for s in defs.get_all_schemas_with_history():
        found.setdefault((s.domain or DEFAULT_DOMAIN, s.name), []).append(s)
    return {k: sorted(v, key=lambda s: s.since_version) for k, v in sorted(found.items())}


def _schema_at(schemas: list[defs.OpSchema], opset: int) -> defs.OpSchema | None:
    """The schema in force at ``opset`` (the newest ``since_version <= opset``), if any."""
    found = [s for s in schemas if s.since_version <= opset]
    return found[-1] if found else None


def _has_function(schema: defs.OpSchema, opset: int) -> bool:
    """Whether the importer can expand the op at ``opset`` through a function body (the
    version test of ``kiln.frontend.onnx.functions``)."""
    return any(v <= opset for v in schema.function_opset_versions) or any(
        v <= opset for v in schema.context_dependent_function_opset_versions)


def control_flow_ops() -> dict[str, tuple[int, str]]:
    """Each control-flow op → (its first supported opset, its note), read from the bullets of
    ``kiln.frontend.onnx.control_flow``'s docstring."""
    doc = control_flow.__doc__ or ""
    found = {}
    for op in control_flow.CONTROL_FLOW_OPS:
        m = re.search(rf"^- ``{op}``(?: \(opset (\d+)\+\))?: (.*?)(?=^- |^\S|\Z)", doc,
                      re.MULTILINE | re.DOTALL)
        found[op] = (int(m.group(1) or MIN_OPSET), first_sentence(m.group(2))) if m else \
            (MIN_OPSET, "")
    return found


def first_sentence(text: str | None) -> str:
    """The first sentence of ``text``'s first paragraph, on one line."""
    para = " ".join((text or "").strip().split("\n\n")[0].split()).replace("``", "`")
    m = re.search(r"(?<=\.)\s+(?=[A-Z`(])", para)
    return para[:m.start()] if m else para


def converter_note(fn: Callable) -> str:
    """The first sentence of a converter's own docstring ('' for generated converters)."""
    return first_sentence(inspect.getdoc(fn)) if fn.__doc__ else ""


# ------------------------------------------------------------------------------- rows


@dataclass
class Row:
    domain: str
    op: str
    opsets: str
    by: str = ""
    notes: list[str] = field(default_factory=list)

    @property
    def key(self) -> str:
        """The op's name in the conformance results (run.py: ``domain.Op`` outside the
        default domain)."""
        return self.op if self.domain == DEFAULT_DOMAIN else f"{self.domain}.{self.op}"


def _ranges(opsets: Iterable[int]) -> str:
    """``[1, 2, 3, 7, 9, 10]`` → ``"1-3, 7, 9-10"``."""
    out, run = [], []
    for o in sorted(opsets):
        if run and o != run[-1] + 1:
            out.append(run)
            run = []
        run.append(o)
    if run:
        out.append(run)
    return ", ".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in out)


def _valid_opsets(schemas: list[defs.OpSchema]) -> list[int]:
    """The default-domain opsets Kiln imports at which onnx defines the op (not deprecated)."""
    return [o for o in range(MIN_OPSET, MAX_OPSET + 1)
            if (s := _schema_at(schemas, o)) is not None and not s.deprecated]


def _deprecation(schemas: list[defs.OpSchema]) -> str:
    last = schemas[-1]
    return f"deprecated by onnx in opset {last.since_version}" if last.deprecated else ""


def default_domain_row(op: str, schemas: list[defs.OpSchema], converters: dict[str, list[int]],
                       flow: dict[str, tuple[int, str]]) -> Row | None:
    """The row of a default-domain op Kiln converts at some opset, else None."""
    valid = _valid_opsets(schemas)
    notes = []
    if op in flow:
        first, note = flow[op]
        return Row(DEFAULT_DOMAIN, op, _covered([o for o in valid if o >= first], valid),
                   "control flow", [note] if note else [])
    segments: dict[str, list[int]] = {}  # "7" (converter since 7) or "fn" → its opsets
    for o in valid:
        since = max((s for s in converters.get(op, []) if s <= o), default=None)
        if since is not None:
            segments.setdefault(str(since), []).append(o)
        elif _has_function(_schema_at(schemas, o), o):
            segments.setdefault("fn", []).append(o)
    if op in converters and not segments:  # registered for opsets onnx does not define
        segments = {str(s): [s] for s in converters[op]}
    if not segments:
        return None
    for since in converters.get(op, []):
        fn = find_converter(op, since)
        note = converter_note(fn) if fn is not None else ""
        if note and note not in notes:
            notes.append(note)
    parts = [_ranges(v) for k, v in segments.items() if k != "fn"]
    by = ["converter"] if parts else []
    if "fn" in segments:
        by.append("function body")
        fn_schema = _schema_at(schemas, segments["fn"][-1])
        if not fn_schema.function_opset_versions:
            notes.append("context-dependent function: built for each node's attributes and "
                         "types")
        if parts:
            parts.append(f"{_ranges(segments['fn'])} (function)")
        else:
            parts.append(_ranges(segments["fn"]))
    covered = sorted(o for v in segments.values() for o in v)
    opsets = ", ".join(parts)
    if valid and covered != valid:
        opsets += f" of {_ranges(valid)}"
    dep = _deprecation(schemas)
    return Row(DEFAULT_DOMAIN, op, opsets, ", ".join(by), notes + ([dep] if dep else []))


def _covered(opsets: list[int], valid: list[int]) -> str:
    return _ranges(opsets) + ("" if opsets == valid else f" of {_ranges(valid)}")


def build_rows(converters: dict[str, list[int]] | None = None,
               schemas: dict[tuple[str, str], list[defs.OpSchema]] | None = None
               ) -> tuple[list[Row], list[Row]]:
    """(the ops Kiln converts, the ops onnx defines that it does not), both sorted."""
    converters = list_converters() if converters is None else converters
    schemas = onnx_schemas() if schemas is None else schemas
    flow = control_flow_ops()
    converted, missing = [], []
    for (domain, op), versions in schemas.items():
        row = default_domain_row(op, versions, converters, flow) \
            if domain == DEFAULT_DOMAIN else None
        if row is not None:
            converted.append(row)
            continue
        since = ", ".join(str(s.since_version) for s in versions)
        note = _deprecation(versions)
        missing.append(Row(domain, op, f"since {since}", "", [note] if note else []))
    known = {r.op for r in converted}
    for op in sorted(set(converters) - known):  # a converter for an op onnx does not define
        converted.append(Row(DEFAULT_DOMAIN, op, _ranges(converters[op]), "converter",
                             ["not an op of the installed onnx"]))
    return sorted(converted, key=_order), sorted(missing, key=_order)


def _order(row: Row) -> tuple[bool, str, str]:
    return row.domain != DEFAULT_DOMAIN, row.domain, row.op


# ------------------------------------------------------------------------ conformance


def summarize(run: dict) -> dict:
    """The committed per-op summary of a conformance/run.py JSON report: its settings, totals,
    per op type counts and the non-passing cases with their reasons; no wall times."""
    if run.get("filter"):
        raise SystemExit(f"gen_ops_table: the report is of a filtered run ({run['filter']!r}); "
                         "run make conformance over every case")
    if run.get("backend") != "kiln":
        raise SystemExit(f"gen_ops_table: the report is of backend {run.get('backend')!r}, "
                         "not kiln")
    cases = run["cases"]
    not_passing = {}
    for name, c in sorted(cases.items()):
        if c["status"] != "pass":
            reason = " ".join(str(c.get("reason", "")).split())
            if len(reason) > _REASON_CHARS:
                reason = reason[:_REASON_CHARS - 3] + "..."
            not_passing[name] = {"op_type": c["op_type"], "status": c["status"],
                                 "reason": reason}
    ops: dict[str, dict[str, int]] = {}
    for c in cases.values():
        counts = ops.setdefault(c["op_type"], dict.fromkeys(STATUSES, 0))
        counts[c["status"]] += 1
    expanded: dict[str, int] = {}
    for name, c in cases.items():
        if c["status"] == "pass" and _EXPANDED.search(name):
            expanded[c["op_type"]] = expanded.get(c["op_type"], 0) + 1
    totals = {s: sum(c[s] for c in ops.values()) for s in STATUSES} | {"cases": len(cases)}
    return {"generated_by": "tools/gen_ops_table.py --results (from make conformance)",
            **{k: run[k] for k in ("backend", "onnx", "target", "rtol", "atol")},
            "totals": totals, "op_types": dict(sorted(ops.items())),
            "expanded_passes": dict(sorted(expanded.items())), "not_passing": not_passing}


def dump_summary(summary: dict) -> str:
    """``summary`` as JSON with one line per op type and per case (small, diff-friendly)."""
    lines = []
    for key, value in summary.items():
        if isinstance(value, dict) and value and all(isinstance(v, dict) for v in value.values()):
            inner = [f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in value.items()]
            lines.append(f" {json.dumps(key)}: {{\n" + ",\n".join(inner) + "\n }")
        else:
            lines.append(f" {json.dumps(key)}: {json.dumps(value)}")
    return "{\n" + ",\n".join(lines) + "\n}\n"


def load_summary(path: Path = SUMMARY) -> dict:
    if not path.is_file():
        raise SystemExit(f"gen_ops_table: {path} is missing: run make conformance, then "
                         "python tools/gen_ops_table.py --results conformance/results/kiln.json")
    return json.loads(path.read_text())


def _score(counts: dict[str, int] | None) -> str:
    if not counts:
        return "-"
    return f"{counts['pass']} / {sum(counts[s] for s in STATUSES)}"


def _sum(rows: list[Row], ops: dict[str, dict[str, int]]) -> tuple[int, int]:
    counts = [ops[r.key] for r in rows if r.key in ops]
    return sum(c["pass"] for c in counts), sum(c[s] for c in counts for s in STATUSES)


# ----------------------------------------------------------------------------- render


def _cell(notes: list[str]) -> str:
    text = "; ".join(n.rstrip(".") for n in notes if n)
    if len(text) > _NOTE_CHARS:
        text = text[:_NOTE_CHARS].rsplit(" ", 1)[0].rstrip(",;:") + " ..."
    return text.replace("|", "\\|")


def _wrap(text: str, width: int = 100) -> list[str]:
    lines, line = [], ""
    for word in text.split():
        if line and len(line) + 1 + len(word) > width:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}" if line else word
    return lines + ([line] if line else [])


def render(summary: dict | None = None, converters: dict[str, list[int]] | None = None,
           schemas: dict[tuple[str, str], list[defs.OpSchema]] | None = None) -> str:
    """The text of docs/ops.md."""
    summary = load_summary() if summary is None else summary
    converted, missing = build_rows(converters, schemas)
    ops, totals = summary["op_types"], summary["totals"]
    by = {k: sum(1 for r in converted if r.by == k)
          for k in ("converter", "control flow", "function body")}
    mixed = sum(1 for r in converted if r.by == "converter, function body")
    defined = len(converted) + sum(1 for r in missing if r.domain == DEFAULT_DOMAIN)
    missing_default = [r for r in missing if r.domain == DEFAULT_DOMAIN]
    other = sorted({r.domain for r in missing if r.domain != DEFAULT_DOMAIN})
    listed = {r.key for r in converted + missing}
    stray = sorted(set(ops) - listed)
    conv_pass, conv_cases = _sum(converted, ops)
    miss_pass, miss_cases = _sum(missing, ops)
    intro = (
        "Generated by `tools/gen_ops_table.py` (`make ops`) from Kiln's ONNX converter registry, "
        f"the op schemas of onnx {onnx.__version__} and the conformance summary "
        f"`docs/ops-conformance.json`; do not edit by hand. Kiln imports opsets {MIN_OPSET} to "
        f"{MAX_OPSET} of the default domain (`{DEFAULT_DOMAIN}`).")
    also = f" ({mixed} of them through their function body at other opsets)" if mixed else ""
    flow = ", ".join(sorted(r.op for r in converted if r.by == "control flow"))
    counts = (
        f"**Ops:** Kiln converts {len(converted)} of the {defined} ops onnx defines in "
        f"`{DEFAULT_DOMAIN}`: {by['converter'] + mixed} with a converter "
        f"(`kiln.frontend.list_converters()`){also}, {by['control flow']} control-flow ops "
        f"({flow}) and {by['function body']} through their ONNX function body. Not converted: "
        f"{len(missing_default)} ops of `{DEFAULT_DOMAIN}` and the "
        f"{len(missing) - len(missing_default)} ops of "
        f"{', '.join(f'`{d}`' for d in other) or 'no other domain'}.")
    conf = (
        f"**Conformance:** {totals['pass']} of {totals['cases']} ONNX node cases pass "
        f"({totals['fail']} fail, {totals['unsupported']} unsupported), onnx {summary['onnx']}, "
        f"target `{summary['target']}`, rtol {summary['rtol']}, atol {summary['atol']}, exact "
        f"dtype and shape; an op's count includes its `_expanded` (function body) cases. The ops "
        f"Kiln converts pass {conv_pass} of their {conv_cases} cases, the others {miss_pass} of "
        f"{miss_cases}. Refresh: `make conformance`, then `python tools/gen_ops_table.py "
        f"--results conformance/results/kiln.json` (the summary keeps each non-passing case "
        f"with its reason).")
    lines = ["# Supported ONNX ops", ""]
    for para in (intro, counts, conf):
        lines += _wrap(para) + [""]
    lines += _wrap("Columns: *opsets* are the default-domain opsets each converter version "
                   "covers (\"of\" the opsets at which onnx defines the op, when Kiln covers "
                   "fewer); *by* says how the importer converts the op; *conformance* is cases "
                   "passed / cases (- when onnx has no case for the op).") + [""]
    lines += ["## Converted", "", "| domain | op | opsets | by | conformance | notes |",
              "|---|---|---|---|---:|---|"]
    for r in converted:
        lines.append(f"| {r.domain} | {r.op} | {r.opsets} | {r.by} | {_score(ops.get(r.key))} | "
                     f"{_cell(r.notes)} |")
    lines += ["", "## Not converted", "",
              *_wrap("A model using one of these ops fails to import with "
                     "`UnsupportedOpError`, which lists every such op of the model at once; "
                     "for the ops outside the default domain that is the domain itself (the "
                     "importer takes `ai.onnx` and onnxruntime's `com.microsoft`)."), "",
              "| domain | op | onnx versions | conformance | notes |", "|---|---|---|---:|---|"]
    expanded = summary.get("expanded_passes", {})
    for r in missing:
        notes = r.notes + ([f"the {expanded[r.key]} passing cases are `_expanded` ones (its "
                            "function body written out as default-domain ops)"]
                           if expanded.get(r.key) else [])
        lines.append(f"| {r.domain} | {r.op} | {r.opsets} | {_score(ops.get(r.key))} | "
                     f"{_cell(notes)} |")
    lines += contrib_section()
    if stray:
        lines += ["", "## Conformance cases of other op types", "",
                  "| op type | conformance |", "|---|---:|"]
        lines += [f"| {k} | {_score(ops[k])} |" for k in stray]
    return "\n".join(lines) + "\n"


def contrib_section() -> list[str]:
    """The lines of the com.microsoft table: each contrib op with what its body computes."""
    ops = list_contrib_ops()
    lines = ["", "## onnxruntime contrib ops (`com.microsoft`)", "",
             *_wrap(f"Kiln converts {len(ops)} of the ops onnxruntime's tools write (the "
                    "quantizers, the transformers optimizer, the 4-bit weight quantizer), each "
                    "as a body of standard ops (`kiln.frontend.onnx.contrib`). Each has "
                    "single-op cases checked against onnxruntime (`tests/helpers/"
                    "contrib_cases.py`; `make conformance` writes their table to "
                    "`conformance/results/contrib.md`)."), "",
             "| op | computes |", "|---|---|"]
    lines += [f"| {op} | {_cell([first_sentence(inspect.getdoc(fn))])} |"
              for op, fn in ops.items()]
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="do not write; exit 1 when docs/ops.md is stale")
    parser.add_argument("--results", type=Path,
                        help="a conformance/run.py JSON report (conformance/results/kiln.json): "
                             "rewrite docs/ops-conformance.json from it first")
    args = parser.parse_args(argv)
    if args.results is not None:
        if args.check:
            parser.error("--check compares docs/ops.md only; drop --results")
        text = dump_summary(summarize(json.loads(args.results.read_text())))
        if not SUMMARY.is_file() or SUMMARY.read_text() != text:
            SUMMARY.write_text(text)
            print(f"wrote {SUMMARY}")
    summary = load_summary()
    if summary["onnx"] != onnx.__version__:
        print(f"gen_ops_table: warning: the conformance summary is of onnx {summary['onnx']}, "
              f"onnx {onnx.__version__} is installed", file=sys.stderr)
    return write_or_check(DOC, render(summary), args.check, COMMAND)


if __name__ == "__main__":
    sys.exit(main())
