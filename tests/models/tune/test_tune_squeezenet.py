"""``kiln tune`` on squeezenet (a few trials), then ``kiln compile --tuning-records``: every
kernel with a record gets it, and the tuned library still matches onnxruntime. The in-model
stage is skipped here (it compiles the whole model once per round, ~50 s);
tests/unit/tune/test_tune_in_model.py runs it on a real built model."""

from __future__ import annotations

import re

import numpy as np
import onnx
import pytest
from model_helpers import assert_matches_reference, kiln_cli
from onnx_helpers import graph_inputs

from kiln import models

pytestmark = pytest.mark.slow


def test_tuned_squeezenet_matches_onnxruntime(tmp_path, reference):
    model = models.randomize_weights(onnx.load(models.light_model_path("squeezenet")), seed=7)
    onnx_path, records, so_path = (tmp_path / n for n in ("sq.onnx", "r.jsonl", "sq.so"))
    onnx.save(model, onnx_path)
    proc = kiln_cli("tune", str(onnx_path), "--target", "llvm", "--trials", "32",
                    "--batch-size", "1", "-o", str(records), "--repeat", "2", "--confirm", "0",
                    "--no-in-model", "--quiet")
    assert "measured 32 candidates" in proc.stdout
    proc = kiln_cli("compile", str(onnx_path), "--target", "llvm", "--tuning-records",
                    str(records), "-o", str(so_path), "--quiet")
    # 32 trials of 1 a round over squeezenet's 28 tasks: the warm-up round measures each one's
    # default, so all have a record; the other 4 go to the kernels the task scheduler expects
    # to gain most
    assert re.search(r"tuning records: (\d+) of \1 kernels tuned\n", proc.stdout), proc.stdout
    (name, (shape, dtype)), = graph_inputs(model).items()
    x = np.random.default_rng(3).standard_normal(shape).astype(dtype)
    np.savez(tmp_path / "in.npz", **{name: x})
    kiln_cli("run", str(so_path), "--inputs", str(tmp_path / "in.npz"), "--outputs",
             str(tmp_path / "out.npz"))
    with np.load(tmp_path / "out.npz") as data:
        got = [data[model.graph.output[0].name]]
    assert_matches_reference(got, reference(model, {name: x}))
