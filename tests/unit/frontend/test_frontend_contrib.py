"""onnxruntime's ``com.microsoft`` contrib ops through the frontend: each single-op case of
tests/helpers/contrib_cases.py imported and run by Kiln's graph interpreter, against
onnxruntime; the unsupported-op report names the domain of an op Kiln has no body for."""

from __future__ import annotations

import pytest
from contrib_cases import CASES, MS, compare, model, onnxruntime_saturates_u8s8
from onnx import helper
from test_frontend_ops import run_kiln, run_ort

import kiln
from kiln.frontend import from_onnx


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_contrib_op_matches_onnxruntime(case):
    if case.u8s8 and onnxruntime_saturates_u8s8():
        pytest.skip("onnxruntime's U8S8 products saturate on this CPU (no VNNI) and the "
                    "interpreter is exact: tests/backend/frontend/test_contrib_ops.py compares "
                    "Kiln's saturate mode with it")
    onnx_model, feeds = case.build()
    problem = compare(case, run_kiln(onnx_model, feeds), run_ort(onnx_model, feeds))
    assert problem is None, problem


def test_an_unknown_contrib_op_is_listed_with_its_domain():
    import numpy as np
    x = np.zeros((2, 3), np.float32)
    nodes = [helper.make_node("NoSuchContribOp", ["x"], ["t"], domain=MS, name="odd"),
             helper.make_node("Relu", ["t"], ["y"])]
    with pytest.raises(kiln.errors.UnsupportedOpError,
                       match=r"NoSuchContribOp \(node 'odd', domain 'com.microsoft'\)"):
        from_onnx(model(nodes, {"x": x}, {}, ["y"]))


def test_a_refused_attribute_names_the_node_and_domain():
    import numpy as np
    a = np.zeros((2, 3), np.float32)
    node = helper.make_node("FusedMatMul", ["a", "a"], ["y"], domain=MS, name="fm",
                            transBatchA=1)
    with pytest.raises(kiln.errors.UnsupportedOpError,
                       match=r"FusedMatMul \(node 'fm', domain 'com.microsoft'\): transBatchA"):
        from_onnx(model([node], {"a": a}, {}, ["y"]))


def test_a_contrib_weight_computed_from_initializers_is_a_constant():
    """MatMulNBits' packed B computed from initializers (B + 0) folds like any converter's
    constant input."""
    import numpy as np
    from contrib_cases import _matmul_nbits
    from onnx import numpy_helper

    onnx_model, feeds = _matmul_nbits(4, 32, "packed")()
    graph = onnx_model.graph
    node = graph.node[0]
    graph.initializer.append(numpy_helper.from_array(np.array(0, np.uint8), "zero"))
    graph.node.insert(0, helper.make_node("Add", [node.input[1], "zero"], ["b_sum"]))
    node.input[1] = "b_sum"
    problem = compare(CASES[0], run_kiln(onnx_model, feeds), run_ort(onnx_model, feeds))
    assert problem is None, problem


def test_dynamic_quantize_lstm_refuses_shorter_sequence_lengths():
    import numpy as np
    from contrib_cases import _dynamic_quantize_lstm
    from onnx import numpy_helper

    onnx_model, _ = _dynamic_quantize_lstm(13, "bidirectional", states=True)()
    lens = next(i for i in onnx_model.graph.initializer if i.name == "lens")
    lens.CopyFrom(numpy_helper.from_array(np.array([4], np.int32), "lens"))
    with pytest.raises(kiln.errors.UnsupportedOpError,
                       match=r"DynamicQuantizeLSTM \(node .*sequence_lens shorter"):
        from_onnx(onnx_model)


def test_dynamic_quantize_lstm_refuses_what_onnxruntime_refuses():
    """A per-column int8 weight zero point other than 0 (onnxruntime: "Weight zero point must
    be zero")."""
    import numpy as np
    from contrib_cases import _dynamic_quantize_lstm
    from onnx import numpy_helper

    onnx_model, feeds = _dynamic_quantize_lstm(14, "reverse", per_channel=True, batch=3,
                                               hidden=260)()
    name = onnx_model.graph.node[-1].input[9]
    zp = next(i for i in onnx_model.graph.initializer if i.name == name)
    value = numpy_helper.to_array(zp).copy()
    assert value.ndim == 2 and value.dtype == np.int8
    value[0, 3] = 1
    zp.CopyFrom(numpy_helper.from_array(value, name))
    with pytest.raises(Exception, match="zero point must be zero"):
        run_ort(onnx_model, feeds)
    with pytest.raises(kiln.errors.UnsupportedOpError,
                       match=r"W_zero_point: a per-column zero point of int8 weights must be 0"):
        from_onnx(onnx_model)
