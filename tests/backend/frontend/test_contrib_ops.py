"""onnxruntime's ``com.microsoft`` contrib ops compiled: each single-op case of
tests/helpers/contrib_cases.py built for the default ``llvm`` target, exported, loaded and run,
against onnxruntime (the frontend's own check runs them in the graph interpreter,
tests/unit/frontend/test_frontend_contrib.py). On a CPU where onnxruntime's uint8 × int8
products saturate (x86 without VNNI), the U8S8 cases build with ``int8_products="saturate"``
for the host, which must then equal onnxruntime as exactly as the exact mode does elsewhere."""

from __future__ import annotations

import pytest
from backend_helpers import run_exported, run_onnxruntime
from contrib_cases import CASES, compare, kiln_build_options

import kiln
from kiln.frontend import from_onnx


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_compiled_contrib_op_matches_onnxruntime(case, tmp_path):
    model, feeds = case.build()
    options = {"target": "llvm", **kiln_build_options(case)}
    mod, params = from_onnx(model, shape={k: v.shape for k, v in feeds.items()})
    got = run_exported(kiln.build(mod, params=params, **options), tmp_path / "model.so", feeds)
    problem = compare(case, got, run_onnxruntime(model, feeds))
    assert problem is None, problem


def test_dynamic_quantize_lstm_over_a_symbolic_length_matches_onnxruntime(tmp_path):
    """Over a symbolic sequence the DynamicQuantizeLSTM is a Scan the VM runs as a loop; its
    per-step quantization of h matches onnxruntime's at several lengths of one artifact."""
    import numpy as np

    from kiln.vm import VirtualMachine

    case = next(c for c in CASES if c.name.startswith("DynamicQuantizeLSTM (bi"))
    model, feeds = case.build()
    assert model.graph.input[0].name == "x"
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "seq"
    (lstm,) = [n for n in model.graph.node if n.op_type == "DynamicQuantizeLSTM"]
    lstm.input[4] = ""  # (its sequence_lens: the old fixed length; omitted means every length)
    mod, params = from_onnx(model)
    exe = kiln.build(mod, params=params, **{"target": "llvm", **kiln_build_options(case)})
    assert isinstance(exe, kiln.runtime.VMExecutable)
    exe.export_library(str(tmp_path / "lstm.so"))
    vm = VirtualMachine(kiln.runtime.load_module(str(tmp_path / "lstm.so")), kiln.cpu())
    rng = np.random.default_rng(5)
    for seq in (1, 3, 9):
        run = {**feeds, "x": rng.standard_normal((seq, *feeds["x"].shape[1:]), np.float32)}
        got = [o.numpy() for o in vm["main"](*run.values())]
        problem = compare(case, got, run_onnxruntime(model, run))
        assert problem is None, f"seq={seq}: {problem}"
