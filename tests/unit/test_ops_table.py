"""docs/ops.md, the supported-ops table, is generated and current (issue 28).

tools/gen_ops_table.py builds the page from the converter registry, the installed onnx's op
schemas and the committed conformance summary docs/ops-conformance.json. Here the page is
rendered in memory and must equal the committed one (run ``make ops`` when it does not); the
conformance run itself is never started (``make conformance`` takes an hour): the summary is a
committed file, so this works in a clean clone.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import onnx
import pytest

from kiln.frontend import list_converters
from kiln.frontend.onnx.control_flow import CONTROL_FLOW_OPS

_PATH = Path(__file__).resolve().parents[2] / "tools" / "gen_ops_table.py"
_spec = importlib.util.spec_from_file_location("gen_ops_table", _PATH)
gen = importlib.util.module_from_spec(_spec)
sys.modules.setdefault(_spec.name, gen)  # its dataclass looks its module up by name
_spec.loader.exec_module(gen)


@pytest.fixture(scope="module")
def summary() -> dict:
    return gen.load_summary()


def test_committed_table_is_current(summary):
    assert gen.DOC.is_file(), f"{gen.DOC} is missing: run {gen.COMMAND}"
    assert gen.DOC.read_text() == gen.render(summary), (
        f"{gen.DOC} is stale (a converter, its docstring, the onnx version or "
        f"docs/ops-conformance.json changed): run {gen.COMMAND} and commit it")


def test_every_converter_and_control_flow_op_has_a_row():
    converted, missing = gen.build_rows()
    names = [r.op for r in converted if r.domain == gen.DEFAULT_DOMAIN]
    assert len(names) == len(set(names))
    assert set(list_converters()) | set(CONTROL_FLOW_OPS) <= set(names)
    assert not {r.key for r in converted} & {r.key for r in missing}
    rows = {r.op: r for r in converted}
    assert rows["Clip"].opsets == "1-10, 11-28" and rows["Clip"].by == "converter"
    assert rows["Loop"].by == "control flow"
    assert rows["RMSNormalization"].by == "function body"  # no converter: its ONNX function
    assert {"SequenceAt", "RandomNormal"} <= {r.op for r in missing}
    assert "ai.onnx.ml" in {r.domain for r in missing}


def test_the_table_follows_the_registry(summary):
    """A new converter adds a row; a removed one moves its op to the gaps: either way the
    committed page no longer matches (what test_committed_table_is_current reports)."""
    committed = gen.render(summary)
    converters = list_converters()
    added = gen.render(summary, converters={**converters, "ConcatFromSequence": [11]})
    assert added != committed
    assert "| ai.onnx | ConcatFromSequence | 11-28 | converter |" in added
    removed = gen.render(summary, converters={k: v for k, v in converters.items()
                                              if k not in ("Trilu", "Mish")})
    assert "| ai.onnx | Trilu | since 14 |" in removed  # now a gap
    assert "| ai.onnx | Trilu | 14-28 | converter |" in committed
    assert "| ai.onnx | Mish | 18-28 | function body |" in removed  # onnx defines Mish's body
    assert "| ai.onnx | Mish | 18-28 | converter |" in committed


def test_summary_is_consistent(summary):
    assert gen.SUMMARY.read_text() == gen.dump_summary(summary), (
        "docs/ops-conformance.json is not as tools/gen_ops_table.py --results writes it")
    totals, ops = summary["totals"], summary["op_types"]
    for status in gen.STATUSES:
        assert totals[status] == sum(c[status] for c in ops.values())
    assert totals["cases"] == sum(totals[s] for s in gen.STATUSES)
    assert len(summary["not_passing"]) == totals["fail"] + totals["unsupported"]
    assert summary["backend"] == "kiln"
    assert summary["onnx"] == onnx.__version__, (
        f"the conformance summary is of onnx {summary['onnx']}: run make conformance, then "
        "python tools/gen_ops_table.py --results conformance/results/kiln.json")
    converted, missing = gen.build_rows()
    assert set(ops) <= {r.key for r in converted + missing}, "cases of an unknown op type"
    page = gen.DOC.read_text()
    assert f"{totals['pass']} of {totals['cases']} ONNX node cases pass" in page


def test_summarize_keeps_no_times_and_refuses_partial_runs():
    run = {"backend": "kiln", "onnx": "1.23.2", "target": "c", "rtol": 1e-3, "atol": 1e-5,
           "workers": 2, "wall_s": 12.3, "filter": "",
           "cases": {"test_add": {"op_type": "Add", "status": "pass", "seconds": 0.5},
                     "test_add_bcast": {"op_type": "Add", "status": "fail",
                                        "reason": "mismatch\n  at 0" + "x" * 300,
                                        "seconds": 1.5},
                     "test_add_expanded": {"op_type": "Add", "status": "pass",
                                           "seconds": 0.2},
                     "test_adam": {"op_type": "ai.onnx.preview.training.Adam",
                                   "status": "unsupported", "reason": "domain",
                                   "seconds": 0.1}}}
    out = gen.summarize(run)
    assert out == gen.summarize(json.loads(json.dumps(run)))
    assert json.loads(gen.dump_summary(out)) == out
    text = json.dumps(out)
    assert "seconds" not in text and "wall_s" not in text and "workers" not in text
    assert out["totals"] == {"pass": 2, "fail": 1, "unsupported": 1, "cases": 4}
    assert out["op_types"]["Add"] == {"pass": 2, "fail": 1, "unsupported": 0}
    assert out["expanded_passes"] == {"Add": 1}
    reason = out["not_passing"]["test_add_bcast"]["reason"]
    assert reason.startswith("mismatch at 0") and len(reason) == 200
    with pytest.raises(SystemExit, match="filtered"):
        gen.summarize({**run, "filter": "add"})
    with pytest.raises(SystemExit, match="backend"):
        gen.summarize({**run, "backend": "onnxruntime"})


def test_helpers():
    assert gen._ranges([1, 2, 3, 7, 9, 10]) == "1-3, 7, 9-10"
    assert gen.first_sentence("Clip-11+: a. Then b.\n\nMore.") == "Clip-11+: a."
    assert gen.first_sentence("int64 ``[n, 3]``; e.g. this. Next") == "int64 `[n, 3]`; e.g. this."
    assert gen._cell(["a|b", "c."]) == "a\\|b; c"
