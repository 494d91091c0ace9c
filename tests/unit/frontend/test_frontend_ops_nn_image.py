"""ONNX frontend, the ops the transformer and OCR models brought: LayerNormalization,
ConvTranspose, Resize and Equal, each against onnxruntime on a one-node model (graph
interpreter: the numpy references), plus the cases they reject."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from onnx import helper
from test_frontend_ops import check, make_model, rand

from kiln.errors import UnsupportedOpError
from kiln.frontend import from_onnx

# ---------------------------------------------------------------------------------------------
# LayerNormalization


@pytest.mark.parametrize("axis,scale_shape,bias", [
    (-1, (6,), True), (-1, (6,), False), (1, (4, 6), True), (2, (6,), True), (0, (3, 4, 6), True),
])
def test_layer_norm(axis, scale_shape, bias):
    inits = {"s": rand(*scale_shape, seed=1)}
    if bias:
        inits["b"] = rand(*scale_shape, seed=2)
    node = helper.make_node("LayerNormalization", ["x", "s", *(["b"] if bias else [])], ["y"],
                            axis=axis, epsilon=1e-3)
    check(node, {"x": rand(3, 4, 6) * 3 + 1}, 17, inits, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_layer_norm_statistics_outputs(axis):
    node = helper.make_node("LayerNormalization", ["x", "s", "b"], ["y", "mean", "inv_std"],
                            axis=axis)
    inits = {"s": rand(*(3, 4, 6)[axis:], seed=1), "b": rand(*(3, 4, 6)[axis:], seed=2)}
    check(node, {"x": rand(3, 4, 6) * 2 + 1}, 17, inits, outputs=("y", "mean", "inv_std"),
          rtol=1e-4, atol=1e-4)


def test_layer_norm_stash_type_is_refused():
    node = helper.make_node("LayerNormalization", ["x", "s"], ["y"], name="ln", stash_type=0)
    model = make_model([node], {"x": rand(2, 4)}, ["y"], 17, {"s": rand(4)})
    with pytest.raises(UnsupportedOpError, match="LayerNormalization.*ln.*stash_type"):
        from_onnx(model)


# ---------------------------------------------------------------------------------------------
# ConvTranspose

CONV_TRANSPOSE_CASES = {  # name: (data shape, weight shape, attributes)
    "stride2_k2": ((1, 4, 5, 6), (4, 3, 2, 2), {"strides": [2, 2]}),
    "pads": ((1, 4, 5, 6), (4, 3, 3, 3), {"strides": [2, 2], "pads": [1, 0, 1, 2]}),
    "groups_dilation": ((2, 4, 5, 6), (4, 2, 3, 3), {"strides": [2, 1], "group": 2,
                                                      "dilations": [2, 1]}),
    "output_padding": ((1, 4, 5, 6), (4, 3, 3, 3), {"strides": [2, 2],
                                                     "output_padding": [1, 1]}),
    "output_shape_larger": ((1, 4, 5, 6), (4, 3, 3, 3), {"strides": [2, 2],
                                                          "output_shape": [11, 14]}),
    "output_shape_smaller": ((1, 4, 5, 6), (4, 3, 3, 3), {"strides": [2, 2],
                                                           "output_shape": [9, 10]}),
    "same_upper": ((1, 4, 5, 6), (4, 3, 3, 3), {"strides": [2, 2], "auto_pad": "SAME_UPPER"}),
    "same_lower": ((1, 4, 5, 6), (4, 3, 3, 3), {"strides": [2, 2], "auto_pad": "SAME_LOWER"}),
    "depthwise": ((1, 4, 5, 6), (4, 1, 2, 2), {"strides": [2, 2], "group": 4}),
    "1d": ((2, 4, 7), (4, 3, 3), {"strides": [2], "pads": [1, 0], "output_padding": [1]}),
    "1d_output_shape": ((1, 4, 7), (4, 3, 3), {"strides": [3], "output_shape": [20],
                                               "dilations": [2]}),
    # 3-D: [N, C, D, H, W] by [C, O/group, KD, KH, KW]
    "3d_basic": ((1, 4, 3, 4, 5), (4, 3, 3, 3, 3), {}),
    "3d_strides_pads": ((2, 4, 3, 4, 5), (4, 3, 3, 2, 3),
                        {"strides": [2, 2, 1], "pads": [1, 0, 1, 2, 1, 0]}),
    "3d_groups_dilation": ((1, 4, 4, 3, 3), (4, 2, 2, 3, 2),
                           {"strides": [3, 1, 2], "group": 2, "dilations": [2, 1, 1]}),
    "3d_output_padding": ((1, 4, 3, 4, 4), (4, 3, 3, 3, 3),
                          {"strides": [2, 2, 2], "pads": [1] * 6, "output_padding": [1, 0, 1]}),
    "3d_output_shape": ((1, 4, 3, 4, 4), (4, 3, 3, 3, 3),
                        {"strides": [2, 2, 2], "output_shape": [8, 7, 9]}),
    "3d_same_upper": ((1, 4, 3, 4, 5), (4, 3, 3, 3, 3),
                      {"strides": [2, 2, 2], "auto_pad": "SAME_UPPER"}),
    "3d_same_lower": ((1, 4, 3, 4, 5), (4, 3, 2, 3, 3),
                      {"strides": [2, 2, 2], "auto_pad": "SAME_LOWER"}),
    "3d_depthwise": ((1, 4, 2, 3, 3), (4, 1, 2, 2, 2), {"strides": [2, 2, 2], "group": 4}),
    # depth pads that crop taps away: depth 1, a 5-deep kernel, pads 2 and 2: only the centre tap
    "3d_cropped_taps": ((1, 4, 1, 3, 3), (4, 3, 5, 3, 3), {"pads": [2, 1, 1, 2, 1, 1]}),
}


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("case", list(CONV_TRANSPOSE_CASES))
def test_conv_transpose(case, bias):
    data, weight, attrs = CONV_TRANSPOSE_CASES[case]
    out_c = weight[1] * attrs.get("group", 1)
    inits = {"w": rand(*weight, seed=1)}
    if bias:
        inits["b"] = rand(out_c, seed=2)
    node = helper.make_node("ConvTranspose", ["x", *inits], ["y"], **attrs)
    check(node, {"x": rand(*data)}, 13, inits, rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------------------------------------
# Resize

RESIZE_TARGETS = {  # name: (input name, values): upsampling, downsampling, odd sizes
    "scales_up": ("scales", np.array([1, 1, 2.0, 3.0], np.float32)),
    "scales_down": ("scales", np.array([1, 1, 0.6, 0.45], np.float32)),
    "sizes": ("sizes", np.array([1, 2, 8, 3], np.int64)),
    "sizes_one": ("sizes", np.array([1, 2, 1, 13], np.int64)),
}
COORDINATE_MODES = ["half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners",
                    "asymmetric", "tf_half_pixel_for_nn"]
NEAREST_MODES = ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"]


def _resize(target: str, **attrs) -> tuple[object, dict]:
    kind, values = RESIZE_TARGETS[target]
    inputs = ["x", "roi", "scales"] if kind == "scales" else ["x", "roi", "", "sizes"]
    inits = {"roi": np.zeros(0, np.float32), kind: values}
    return helper.make_node("Resize", inputs, ["y"], **attrs), inits


@pytest.mark.parametrize("target", list(RESIZE_TARGETS))
@pytest.mark.parametrize("mode,nearest", list(itertools.product(COORDINATE_MODES, NEAREST_MODES)))
def test_resize_nearest(target, mode, nearest):
    node, inits = _resize(target, mode="nearest", coordinate_transformation_mode=mode,
                          nearest_mode=nearest)
    check(node, {"x": rand(1, 2, 5, 7)}, 19, inits)


@pytest.mark.parametrize("target", list(RESIZE_TARGETS))
@pytest.mark.parametrize("mode", [m for m in COORDINATE_MODES if m != "tf_half_pixel_for_nn"])
def test_resize_linear(target, mode):
    node, inits = _resize(target, mode="linear", coordinate_transformation_mode=mode)
    check(node, {"x": rand(1, 2, 5, 7)}, 19, inits)


@pytest.mark.parametrize("target", list(RESIZE_TARGETS))
@pytest.mark.parametrize("mode", [m for m in COORDINATE_MODES if m != "tf_half_pixel_for_nn"])
@pytest.mark.parametrize("alpha,exclude", [(-0.75, 0), (-0.5, 1)])
def test_resize_cubic(target, mode, alpha, exclude):
    node, inits = _resize(target, mode="cubic", coordinate_transformation_mode=mode,
                          cubic_coeff_a=alpha, exclude_outside=exclude)
    check(node, {"x": rand(1, 2, 5, 7)}, 19, inits, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("method", ["linear", "cubic"])
@pytest.mark.parametrize("mode", ["half_pixel", "pytorch_half_pixel", "asymmetric",
                                  "align_corners"])
@pytest.mark.parametrize("scales", [[1, 1, 0.6, 0.45], [1, 1, 0.3, 1.5], [1, 1, 2.0, 0.8]])
@pytest.mark.parametrize("exclude", [0, 1])
def test_resize_antialias(method, mode, scales, exclude):
    node = helper.make_node("Resize", ["x", "", "scales"], ["y"], mode=method, antialias=1,
                            coordinate_transformation_mode=mode, exclude_outside=exclude)
    check(node, {"x": rand(1, 2, 9, 11)}, 19, {"scales": np.array(scales, np.float32)},
          rtol=1e-4, atol=1e-5)


def test_resize_antialias_footprint_is_bounded():
    node = helper.make_node("Resize", ["x", "", "scales"], ["y"], name="rs", mode="cubic",
                            antialias=1)
    model = make_model([node], {"x": rand(1, 1, 40, 40)}, ["y"], 19,
                       {"scales": np.array([1, 1, 0.1, 1], np.float32)})
    with pytest.raises(UnsupportedOpError, match="antialias over 40 pixels"):
        from_onnx(model)


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
@pytest.mark.parametrize("roi,extrapolation", [
    ([0, 0, 0.2, 0.1, 1, 1, 0.8, 0.7], 0.0), ([0, 0, -0.3, 0.4, 1, 1, 1.2, 0.9], -7.5),
])
@pytest.mark.parametrize("target", ["scales_up", "sizes"])
def test_resize_tf_crop_and_resize(mode, roi, extrapolation, target):
    kind, values = RESIZE_TARGETS[target]
    inputs = ["x", "roi", "scales"] if kind == "scales" else ["x", "roi", "", "sizes"]
    node = helper.make_node("Resize", inputs, ["y"], mode=mode,
                            coordinate_transformation_mode="tf_crop_and_resize",
                            extrapolation_value=extrapolation)
    check(node, {"x": rand(1, 2, 5, 7)}, 19,
          {"roi": np.array(roi, np.float32), kind: values}, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("mode", ["nearest", "linear"])
@pytest.mark.parametrize("scales", [[1, 1, 2.0, 3.0], [1, 1, 0.6, 0.45]])
def test_resize_v10(mode, scales):
    check(helper.make_node("Resize", ["x", "scales"], ["y"], mode=mode), {"x": rand(1, 2, 5, 7)},
          10, {"scales": np.array(scales, np.float32)})


@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_upsample(mode):
    check(helper.make_node("Upsample", ["x", "scales"], ["y"], mode=mode),
          {"x": rand(1, 2, 5, 7)}, 9, {"scales": np.array([1, 1, 2.0, 1.5], np.float32)})


@pytest.mark.parametrize("policy", ["stretch", "not_larger", "not_smaller"])
def test_resize_axes_and_aspect_ratio(policy):
    node = helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], axes=[2, 3],
                            keep_aspect_ratio_policy=policy)
    check(node, {"x": rand(1, 2, 5, 7)}, 19, {"sizes": np.array([8, 9], np.int64)})


@pytest.mark.parametrize("attrs,reason", [
    ({"mode": "area"}, "mode=area"),
    ({"coordinate_transformation_mode": "tf_crop_and_resize"}, "needs the roi input"),
    ({"antialias": 1}, "antialias=1 with mode=nearest"),
])
def test_resize_refuses(attrs, reason):
    node = helper.make_node("Resize", ["x", "", "scales"], ["y"], name="rs", **attrs)
    model = make_model([node], {"x": rand(1, 1, 4, 4)}, ["y"], 19,
                       {"scales": np.array([1, 1, 2, 2], np.float32)})
    with pytest.raises(UnsupportedOpError, match=f"Resize.*rs.*{reason}"):
        from_onnx(model)


def test_resize_of_channels_is_refused():
    node = helper.make_node("Resize", ["x", "", "scales"], ["y"], name="rs")
    model = make_model([node], {"x": rand(1, 2, 4, 4)}, ["y"], 13,
                       {"scales": np.array([1, 2, 1, 1], np.float32)})
    with pytest.raises(UnsupportedOpError, match="N or C axis"):
        from_onnx(model)


# ---------------------------------------------------------------------------------------------
# Equal


@pytest.mark.parametrize("dtype", ["float32", "int64"])
def test_equal(dtype):
    a = (rand(3, 4) * 2).round().astype(dtype)
    b = (rand(4, seed=1) * 2).round().astype(dtype)
    check(helper.make_node("Equal", ["a", "b"], ["y"]), {"a": a, "b": b}, 13)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu(approximate):
    check(helper.make_node("Gelu", ["x"], ["y"], approximate=approximate),
          {"x": rand(3, 8, low=-5, high=5)}, 20, rtol=1e-5, atol=1e-6)


def test_resize_antialias_kernel_source_stays_small():
    """An antialiased cubic filter that also excludes the outside normalizes its weights twice;
    inlined, each weight table grew as taps⁴ (1.5 MB of C for a 7-tap filter, 13 s of gcc).
    The weights a normalization divides by their sum are tables of their own."""
    import kiln

    node = helper.make_node("Resize", ["x", "", "scales"], ["y"], mode="cubic", antialias=1,
                            exclude_outside=1)
    inputs = {"x": rand(1, 2, 9, 11)}
    model = make_model([node], inputs, ["y"], 19,
                       {"scales": np.array([1, 1, 0.6, 1.4], np.float32)})
    mod, params = from_onnx(model)
    source = kiln.build(mod, target="c", params=params).get_lib().get_source()
    assert len(source) < 200_000, len(source)
    assert max(len(line) for line in source.splitlines()) < 20_000


@pytest.mark.parametrize("attrs", [
    {"mode": "linear", "coordinate_transformation_mode": "tf_crop_and_resize",
     "extrapolation_value": 3.0},
    {"mode": "cubic", "coordinate_transformation_mode": "tf_crop_and_resize"},
    {"mode": "nearest", "coordinate_transformation_mode": "tf_half_pixel_for_nn",
     "nearest_mode": "round_prefer_ceil"},
    {"mode": "nearest", "coordinate_transformation_mode": "tf_crop_and_resize",
     "nearest_mode": "ceil"},
], ids=["linear-crop", "cubic-crop", "nearest-tf-half-pixel", "nearest-crop"])
def test_resize_an_axis_of_scale_one_is_not_transformed(attrs):
    """onnxruntime maps an axis whose scale is exactly 1 to itself, whatever the coordinate
    mode: no crop, no extrapolation, no half-pixel shift (upsample.cc: ``scale == 1 ? x :``)."""
    node = helper.make_node("Resize", ["x", "roi", "scales"], ["y"], **attrs)
    inits = {"roi": np.array([0, 0, 0, 0.05, 1, 1, 1, 1.2], np.float32),
             "scales": np.array([1, 1, 1.2, 1.0], np.float32)}
    check(node, {"x": rand(1, 1, 10, 5)}, 19, inits, rtol=1e-4, atol=1e-5)


def test_resize_crop_with_unit_scales_is_the_input():
    node = helper.make_node("Resize", ["x", "roi", "scales"], ["y"], mode="linear",
                            coordinate_transformation_mode="tf_crop_and_resize")
    inits = {"roi": np.array([0, 0, 0.1, 0.2, 1, 1, 0.8, 0.9], np.float32),
             "scales": np.array([1, 1, 1, 1], np.float32)}
    check(node, {"x": rand(1, 2, 4, 5)}, 19, inits)
