"""The ops the transformer and OCR models brought (LayerNormalization, ConvTranspose, Resize, Erf,
Gelu, Equal, Gather's index clamp), compiled for each target (c, llvm), against onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto
from test_ops import rand, single_op

X4 = {"x": rand(1, 4, 5, 7)}
ROI = np.zeros(0, np.float32)

CASES = [
    ("Gelu", {"x": rand(4, 9) * 3}, {}, {}),
    ("Gelu", {"x": rand(4, 9) * 3}, {}, {"approximate": "tanh"}),
    ("LayerNormalization", {"x": rand(2, 5, 24) * 3 + 1},
     {"s": rand(24, seed=1), "b": rand(24, seed=2)}, {"epsilon": 1e-5}),
    ("LayerNormalization", {"x": rand(2, 3, 4, 5)}, {"s": rand(4, 5, seed=1)}, {"axis": 2}),
    # 21 rows (row fusion) of 50 (three 16-lane partial sums and a tail)
    ("LayerNormalization", {"x": rand(3, 7, 50) * 3 + 2},
     {"s": rand(50, seed=1), "b": rand(50, seed=2)}, {"epsilon": 1e-12}),
    ("ConvTranspose", X4, {"w": rand(4, 3, 2, 2, seed=1), "b": rand(3, seed=2)},
     {"strides": [2, 2]}),
    ("ConvTranspose", X4, {"w": rand(4, 2, 3, 3, seed=1)},
     {"strides": [2, 2], "pads": [1, 0, 1, 2], "group": 2, "dilations": [1, 2]}),
    ("ConvTranspose", X4, {"w": rand(4, 3, 3, 3, seed=1)},
     {"strides": [3, 2], "auto_pad": "SAME_UPPER", "output_padding": [1, 0]}),
    ("ConvTranspose", {"x": rand(2, 4, 9)}, {"w": rand(4, 3, 3, seed=1), "b": rand(3, seed=2)},
     {"strides": [2], "pads": [1, 0]}),
    ("Resize", X4, {"roi": ROI, "scales": np.array([1, 1, 2, 2], np.float32)},
     {"mode": "nearest", "coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"}),
    ("Resize", X4, {"roi": ROI, "scales": np.array([1, 1, 0.6, 1.7], np.float32)},
     {"mode": "nearest"}),
    ("Resize", X4, {"roi": ROI, "scales": np.array([1, 1, 1.5, 0.7], np.float32)},
     {"mode": "nearest", "coordinate_transformation_mode": "half_pixel_symmetric",
      "nearest_mode": "ceil"}),
    ("Resize", X4, {"roi": ROI, "scales": np.array([1, 1, 2.5, 1.3], np.float32)},
     {"mode": "linear"}),
    ("Resize", X4, {"roi": ROI, "scales": np.array([1, 1, 2, 0.5], np.float32)},
     {"mode": "linear", "coordinate_transformation_mode": "align_corners"}),
    ("Resize", X4, {"roi": ROI, "scales": np.array([1, 1, 1.7, 2.2], np.float32)},
     {"mode": "linear", "coordinate_transformation_mode": "half_pixel_symmetric"}),
    ("Resize", X4, {"roi": ROI, "scales": np.array([1, 1, 2.5, 0.6], np.float32)},
     {"mode": "cubic"}),
    ("Resize", X4, {"roi": ROI, "scales": np.array([1, 1, 1.5, 1.5], np.float32)},
     {"mode": "cubic", "cubic_coeff_a": -0.5, "exclude_outside": 1,
      "coordinate_transformation_mode": "align_corners"}),
    ("Resize", {"x": rand(1, 2, 9, 11)}, {"roi": ROI,
                                         "scales": np.array([1, 1, 0.45, 0.6], np.float32)},
     {"mode": "linear", "antialias": 1}),
    ("Resize", {"x": rand(1, 2, 9, 11)}, {"roi": ROI,
                                         "scales": np.array([1, 1, 0.6, 1.4], np.float32)},
     {"mode": "cubic", "antialias": 1, "exclude_outside": 1}),
    # an axis of scale 1 maps to itself in onnxruntime, crop and extrapolation ignored
    ("Resize", {"x": rand(1, 1, 10, 5)}, {"roi": np.array([0, 0, 0, 0.05, 1, 1, 1, 1.2],
                                                         np.float32),
                                         "scales": np.array([1, 1, 1.2, 1], np.float32)},
     {"mode": "linear", "coordinate_transformation_mode": "tf_crop_and_resize",
      "extrapolation_value": 3.0}),
    ("Resize", X4, {"roi": np.array([0, 0, -0.2, 0.1, 1, 1, 0.9, 1.3], np.float32),
                    "scales": np.array([1, 1, 1.5, 1.5], np.float32)},
     {"mode": "linear", "coordinate_transformation_mode": "tf_crop_and_resize",
      "extrapolation_value": 2.5}),
]


@pytest.mark.parametrize("op,inputs,consts,attrs", CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_single_op_matches_onnxruntime(check_model, op, inputs, consts, attrs):
    opset = {"Resize": 19, "Gelu": 20}.get(op, 17)
    check_model(single_op(op, inputs, consts=consts, opset=opset, **attrs), inputs)


def test_layer_norm_three_outputs(check_model):
    """Y, Mean and InvStdDev of a LayerNormalization over the last two axes."""
    x = {"x": rand(2, 3, 4, 5) * 2 + 1}
    check_model(single_op("LayerNormalization", x, n_out=3,
                          consts={"s": rand(4, 5, seed=1), "b": rand(4, 5, seed=2)}, axis=-2), x)


def test_equal_bool_output(check_model):
    a = np.array([[1, 2, 3], [4, 5, 6]], np.int64)
    b = np.array([1, 5, 3], np.int64)
    inputs = {"a": a, "b": b}
    check_model(single_op("Equal", inputs, out_shape=(None, TensorProto.BOOL)), inputs)


def test_gather_out_of_range_ids_are_clamped(target, tmp_path):
    """Token ids past the embedding table (an error in ONNX) read its first or last row,
    never memory outside it."""
    from backend_helpers import compile_and_run

    table = rand(4, 3)
    model = single_op("Gather", {"i": np.zeros(5, np.int64)}, consts={"t": table}, axis=0)
    model.graph.node[0].input[:] = ["t", "i"]
    ids = np.array([0, 3, -1, 10**9, -(10**9)], np.int64)
    got = compile_and_run(model, {"i": ids}, tmp_path, target)[0]
    np.testing.assert_array_equal(got, table[[0, 3, 3, 3, 0]])


def test_erf_approximation(target, tmp_path):
    """float32 Erf (GELU's) is a rational approximation: within 5e-7 of erf everywhere, exact
    at 0, ±1 beyond the clamp, NaN kept."""
    import math

    from backend_helpers import compile_and_run

    x = np.concatenate([np.linspace(-6, 6, 20001), [0.0, np.inf, -np.inf, np.nan]])
    x = x.astype(np.float32)
    model = single_op("Erf", {"x": x})
    got = compile_and_run(model, {"x": x}, tmp_path, target)[0]
    want = np.array([math.erf(v) for v in x.astype(np.float64)])
    finite = np.isfinite(x)
    assert np.max(np.abs(got[finite] - want[finite])) < 5e-7
    assert got[-4] == 0.0 and got[-3] == 1.0 and got[-2] == -1.0 and np.isnan(got[-1])
