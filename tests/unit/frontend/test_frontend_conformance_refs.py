"""The numpy references of the graph ops added for ONNX conformance, checked against ONNX's own
generated node cases: import (binding compile-time inputs as the ONNX backend does), then the
graph interpreter (each op's reference), compared with ONNX's expected outputs. No C compiler."""

from __future__ import annotations

import functools
import warnings

import numpy as np
import pytest
from onnx import TensorProto, numpy_helper
from onnx.backend.test.runner import Runner

from kiln.driver.onnx_backend import import_binding
from kiln.relay.interpreter import evaluate
from kiln.relay.transform import bind_params

CASES = [
    "test_gridsample_bicubic", "test_gridsample_reflection_padding",
    "test_gridsample_volumetric_nearest_align_corners_1",
    "test_scatter_elements_with_duplicate_indices",
    "test_scatternd_max", "test_gather_elements_negative_indices",
    "test_gathernd_example_int32_batch_dim1",
    "test_top_k_smallest", "test_einsum_batch_diagonal", "test_cumsum_1d_reverse_exclusive",
    "test_argmax_negative_axis_keepdims_random_select_last_index", "test_edge_pad", "test_wrap_pad",
    "test_reflect_pad", "test_bitshift_right_int32_negative_shift", "test_mod_mixed_sign_int8",
    "test_mod_mixed_sign_float32", "test_isinf_negative", "test_xor_bcast4v4d",
    "test_reduce_prod_default_axes_keepdims_random", "test_bitwise_not_3d", "test_round",
    "test_sign", "test_acosh", "test_cumprod_2d_axis_1", "test_range_int32_type_negative_delta",
    "test_maxpool_with_argmax_2d_precomputed_pads",
    "test_maxpool_with_argmax_2d_precomputed_strides", "test_stft_with_window",
    "test_dft_irfft", "test_gru_with_initial_bias", "test_lppool_2d_dilations",
    "test_scan9_sum", "test_if", "test_attention_4d_gqa", "test_nllloss_NCd1d2_with_weight",
    "test_bitcast_float32_to_int32", "test_col2im_pads", "test_col2im_5d", "test_det_nd",
    "test_tensorscatter_circular", "test_maxunpool_export_with_output_shape",
]


@functools.cache
def _cases() -> dict:
    from onnx.backend.test.loader import load_model_tests

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return {c.name: c for c in load_model_tests(kind="node")}


def _array(v):
    return numpy_helper.to_array(v) if isinstance(v, TensorProto) else v


@pytest.mark.parametrize("name", CASES)
def test_reference_matches_onnx(name):
    case = _cases()[name]
    inits = {i.name for i in case.model.graph.initializer}
    input_names = [v.name for v in case.model.graph.input if v.name not in inits]
    (inputs, outputs), = case.data_sets
    values = dict(zip(input_names, (_array(v) for v in inputs)))
    mod, params, bound = import_binding(case.model, values, set())
    func = bind_params(mod["main"], params)
    got = evaluate(func, {n: v for n, v in values.items() if n not in bound})
    Runner.assert_similar_outputs([_array(o) for o in outputs], got, rtol=1e-3, atol=1e-5)
    assert all(isinstance(g, np.ndarray) for g in got)
