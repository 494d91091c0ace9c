"""onnxruntime's ``com.microsoft`` contrib ops compiled: each single-op case of
tests/helpers/contrib_cases.py built for the default ``llvm`` target, exported, loaded and run,
against onnxruntime (the frontend's own check runs them in the graph interpreter,
tests/unit/frontend/test_frontend_contrib.py)."""

from __future__ import annotations

import pytest
from backend_helpers import compile_and_run, run_onnxruntime
from contrib_cases import CASES, compare


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_compiled_contrib_op_matches_onnxruntime(case, tmp_path):
    model, feeds = case.build()
    got = compile_and_run(model, feeds, tmp_path, target="llvm")
    problem = compare(case, got, run_onnxruntime(model, feeds))
    assert problem is None, problem
