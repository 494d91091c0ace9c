"""kiln.runtime.graph_executor.onnx_source: reading a kernel node's ``onnx_*`` attrs, converting
a blocked output back to the model's NCHW (checked against kiln.tir.layout's reference
transform), and the node list as the profile table prints it."""

from __future__ import annotations

import numpy as np
import pytest

from kiln.errors import KilnError
from kiln.runtime.graph_executor.onnx_source import (
    OnnxSource,
    nodes_text,
    onnx_source,
    to_model_layout,
)
from kiln.tir.layout import transform_array


def test_attrs_parsed():
    attrs = {"func_name": "k", "onnx_nodes": '["Conv_1", "Relu_2"]',
             "onnx_op_types": '["Conv", "Relu"]', "onnx_output": "r", "onnx_layout": "NCHW8c",
             "onnx_shape": "[1, 20, 4, 4]"}
    assert onnx_source(attrs, "node 3 (k)") == OnnxSource(("Conv_1", "Relu_2"), ("Conv", "Relu"),
                                                          "r", "NCHW8c", (1, 20, 4, 4))
    assert onnx_source({"func_name": "k"}, "node 3 (k)") is None  # a library from before
    assert onnx_source({"onnx_nodes": '["A"]'}, "n").output is None


@pytest.mark.parametrize("attrs, message", [
    ({"onnx_nodes": "Conv_1"}, r"node 3 \(k\): attrs.onnx_nodes must be a JSON list"),
    ({"onnx_nodes": '["A", "B"]', "onnx_op_types": '["Add"]'}, "2 onnx_nodes but 1"),
    ({"onnx_nodes": '["A"]', "onnx_output": "a", "onnx_layout": "NHWC"}, "not NCHW<c>c"),
    ({"onnx_nodes": '["A"]', "onnx_output": "a", "onnx_layout": "NCHW4c", "onnx_shape": "4"},
     "attrs.onnx_shape must be a JSON list"),
])
def test_malformed_attrs(attrs, message):
    with pytest.raises(KilnError, match=message):
        onnx_source(attrs, "node 3 (k)")


def test_blocked_output_back_to_nchw_with_padded_channels():
    x = np.random.default_rng(0).standard_normal((2, 10, 3, 5)).astype("float32")
    padded = np.concatenate([x, np.full((2, 2, 3, 5), 7.0, "float32")], axis=1)  # 12 = 3 x 4
    stored = transform_array(padded, "NCHW", "NCHW4c")
    source = OnnxSource(("C",), ("Conv",), "c", "NCHW4c", (2, 10, 3, 5))
    got = to_model_layout(stored, source)
    np.testing.assert_array_equal(got, x)
    assert got.flags.c_contiguous
    plain = np.ones((2, 3), "float32")
    assert to_model_layout(plain, OnnxSource(("G",), ("Gemm",), "g")) is plain
    with pytest.raises(KilnError, match=r"ONNX tensor 'c': a NCHW4c value of shape "
                                        r"\(2, 3, 3, 5, 4\) cannot hold shape \(2, 13, 3, 5\)"):
        to_model_layout(stored, OnnxSource(("C",), ("Conv",), "c", "NCHW4c", (2, 13, 3, 5)))


def test_nodes_text_truncates():
    assert nodes_text(["Conv_12", "Add_13", "HardSwish_14"]) == "Conv_12, Add_13, HardSwish_14"
    names = [f"N{k}" for k in range(7)]
    assert nodes_text(names) == "N0, N1, N2 +4 more"
    assert nodes_text(names, limit=6) == "N0, N1, N2, N3, N4, N5 +1 more"
    assert nodes_text([]) == ""
