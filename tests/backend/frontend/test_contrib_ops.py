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


def test_dynamic_quantize_lstm_over_a_symbolic_length_matches_onnxruntime(tmp_path):
    """Over a symbolic sequence the DynamicQuantizeLSTM is a Scan the VM runs as a loop; its
    per-step quantization of h matches onnxruntime's at several lengths of one artifact."""
    import numpy as np

    import kiln
    from kiln.frontend import from_onnx
    from kiln.vm import VirtualMachine

    case = next(c for c in CASES if c.name.startswith("DynamicQuantizeLSTM (bi"))
    model, feeds = case.build()
    assert model.graph.input[0].name == "x"
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "seq"
    (lstm,) = [n for n in model.graph.node if n.op_type == "DynamicQuantizeLSTM"]
    lstm.input[4] = ""  # (its sequence_lens: the old fixed length; omitted means every length)
    mod, params = from_onnx(model)
    exe = kiln.build(mod, target="llvm", params=params)
    assert isinstance(exe, kiln.runtime.VMExecutable)
    exe.export_library(str(tmp_path / "lstm.so"))
    vm = VirtualMachine(kiln.runtime.load_module(str(tmp_path / "lstm.so")), kiln.cpu())
    rng = np.random.default_rng(5)
    for seq in (1, 3, 9):
        run = {**feeds, "x": rng.standard_normal((seq, *feeds["x"].shape[1:]), np.float32)}
        got = [o.numpy() for o in vm["main"](*run.values())]
        problem = compare(case, got, run_onnxruntime(model, run))
        assert problem is None, f"seq={seq}: {problem}"
