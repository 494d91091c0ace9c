"""The corpus's fast subset (``corpus.models.FAST``): a torchvision CNN, a BERT encoder, a GPT-2
decoder step with past and a keyword-spotting wheel model, each exported (or fetched), compiled
with no flags (symbolic, VM) and at its fixed shape, and run against onnxruntime at every shape
of its entry, as ``make corpus`` does for all of them; plus the checks the corpus relies on."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))  # the corpus package lives beside src/

from corpus.measure import compare, measure  # noqa: E402
from corpus.models import FAST, KNOWN_SYMBOLIC_FAILURES, MODELS  # noqa: E402
from corpus.report import build_status, cause  # noqa: E402

pytest.importorskip("onnxruntime")


def _symbolic(model) -> bool:
    return any(isinstance(d, str) for i in model.inputs for d in i.dims)


@pytest.mark.parametrize("name", FAST)
def test_fast_model_matches_onnxruntime_symbolic_and_static(name):
    """Exports land in the kiln cache dir (by content, as make corpus's): the session's
    base temp folder can be pruned by concurrent pytest sessions."""
    model = MODELS[name]
    if model.source != "wheel":
        pytest.importorskip("torch")
        if importlib.util.find_spec(model.source) is None:  # not imported: see tv()
            pytest.skip(f"{model.source} is not installed (make corpus installs it)")
    record = measure(model, do_time=False)
    steps = record["steps"]
    known = KNOWN_SYMBOLIC_FAILURES.get(name)
    if known:
        assert steps["compile_symbolic"]["status"] == "error", (
            f"{name}'s symbolic build compiles now: drop it from KNOWN_SYMBOLIC_FAILURES")
        assert known in steps["compile_symbolic"]["error"], steps["compile_symbolic"]["error"]
        steps = {k: v for k, v in steps.items() if k != "compile_symbolic"}
    failed = {k: v.get("error") for k, v in steps.items() if v["status"] != "ok"}
    assert not failed, failed
    runs = len(model.shapes) * (not known) + 1
    assert len(record["runs"]) == runs, record["runs"]
    bad = {k: v for k, v in record["runs"].items() if v["status"] != "match"}
    assert not bad, bad
    assert build_status(record, "static") == "match"
    if not known:
        assert build_status(record, "symbolic") == "match"
        if _symbolic(model):
            assert record["executor"]["symbolic"] == "vm"


def test_compare_flags_a_wrong_value_shape_and_dtype():
    want = [np.linspace(-1, 1, 12, dtype="float32").reshape(3, 4)]
    assert compare([want[0].copy()], want)["status"] == "match"
    off = want[0].copy()
    off[2, 3] += 0.01  # 1e-2 > 1e-3 * max|want| + 1e-4
    assert compare([off], want)["status"] == "mismatch"
    assert compare([want[0].reshape(4, 3)], want)["status"] == "mismatch"
    assert compare([want[0].astype("float64")], want)["status"] == "mismatch"
    assert compare([], want)["status"] == "mismatch"


def test_causes_group_errors_that_differ_in_numbers_and_names():
    a = "CompileError: lowering fused_nn_conv2d_1 failed: extent 64*batch has no lower bound"
    b = "CompileError: lowering fused_nn_conv2d_7 failed: extent 32*batch has no lower bound"
    assert cause(a) == cause(b)
    assert cause(a) != cause("UnsupportedOpError: op 'Foo' (node 'n1') is not supported")


def test_every_entry_names_its_shapes_symbols():
    for model in MODELS.values():
        symbols = {d for i in model.inputs for d in i.dims if isinstance(d, str)}
        for shape in (*model.shapes, model.fixed):
            assert set(shape) == symbols, (model.name, shape, symbols)
        assert 1 <= len(model.shapes) <= 3, model.name
    assert len(MODELS) >= 40
