"""Resize to the sizes of another tensor over symbolic dims (``Resize(x, sizes=Shape(y)[2:])``,
the skip connections and final upsamplings of segmentation and detection exports): the scale
``float32(out) / float32(in)`` changes with the dims, so the kernel computes it at run time.

One graph holds a Resize per mode (nearest in every nearest_mode, linear, cubic; the coordinate
transformation modes), compiled once per target with no flags (the VM) and run against
onnxruntime at shapes that upsample, downsample, keep an axis (scale 1), and resize to one
pixel."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from backend_helpers import assert_close_to_reference, run_onnxruntime
from onnx import TensorProto, helper, numpy_helper
from onnx_helpers import compile_vm

#: (x's H, W; y's H, W): up and down (odd sizes), H kept, a one-pixel output, W kept
SHAPES = [((5, 7), (9, 4)), ((8, 6), (8, 11)), ((7, 9), (1, 13)), ((3, 10), (6, 10))]
RNG = np.random.default_rng(47)

#: (name, attrs) of each Resize
CASES = [
    ("nearest_half_pixel", {"mode": "nearest"}),
    ("nearest_floor_asymmetric", {"mode": "nearest", "nearest_mode": "floor",
                                  "coordinate_transformation_mode": "asymmetric"}),
    ("nearest_ceil_align_corners", {"mode": "nearest", "nearest_mode": "ceil",
                                    "coordinate_transformation_mode": "align_corners"}),
    ("nearest_prefer_ceil", {"mode": "nearest", "nearest_mode": "round_prefer_ceil"}),
    ("nearest_tf_nn", {"mode": "nearest",
                       "coordinate_transformation_mode": "tf_half_pixel_for_nn"}),
    ("nearest_pytorch", {"mode": "nearest", "nearest_mode": "floor",
                         "coordinate_transformation_mode": "pytorch_half_pixel"}),
    ("linear_half_pixel", {"mode": "linear"}),
    ("linear_align_corners", {"mode": "linear",
                              "coordinate_transformation_mode": "align_corners"}),
    ("linear_pytorch", {"mode": "linear",
                        "coordinate_transformation_mode": "pytorch_half_pixel"}),
    ("linear_symmetric", {"mode": "linear",
                          "coordinate_transformation_mode": "half_pixel_symmetric"}),
    ("linear_asymmetric", {"mode": "linear", "coordinate_transformation_mode": "asymmetric"}),
    ("cubic_half_pixel", {"mode": "cubic"}),
    ("cubic_align_corners", {"mode": "cubic", "cubic_coeff_a": -0.5, "exclude_outside": 1,
                             "coordinate_transformation_mode": "align_corners"}),
    ("cubic_pytorch", {"mode": "cubic",
                       "coordinate_transformation_mode": "pytorch_half_pixel"}),
    ("linear_crop", {"mode": "linear", "coordinate_transformation_mode": "tf_crop_and_resize",
                     "extrapolation_value": 2.5}),
]


#: (name, attrs, scales) of each Resize by constant scales: the coordinate modes that read the
#: (symbolic) sizes
SCALES_CASES = [
    ("linear_align_corners_x2", {"mode": "linear",
                                 "coordinate_transformation_mode": "align_corners"}, [2, 3]),
    ("cubic_symmetric_x2", {"mode": "cubic",
                            "coordinate_transformation_mode": "half_pixel_symmetric"}, [2, 2]),
    ("nearest_pytorch_half", {"mode": "nearest", "nearest_mode": "ceil",
                              "coordinate_transformation_mode": "pytorch_half_pixel"},
     [0.5, 1]),
    # non-integer scales: the output size int(scale * in) changes with the dims
    ("linear_x1.5", {"mode": "linear"}, [1.5, 0.75]),
    ("nearest_x1.25", {"mode": "nearest", "nearest_mode": "floor",
                       "coordinate_transformation_mode": "asymmetric"}, [1.25, 2.5]),
    ("cubic_align_corners_x0.625", {"mode": "cubic",
                                    "coordinate_transformation_mode": "align_corners"},
     [0.625, 1.5]),
]


def _const(name: str, value) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(value), name)


def resize_to_model(cases=CASES, scales_cases=SCALES_CASES, opset: int = 13) -> onnx.ModelProto:
    """``x [N, 3, H, W]`` resized to the H and W of ``y [N, 1, P, Q]`` once per case: sizes =
    Concat(Shape(x)[:2], Shape(y)[2:]), as torchvision's ``interpolate(x, size=y.shape[-2:])``
    exports; then by the constant scales of each scales case."""
    nodes = [helper.make_node("Shape", ["x"], ["x_shape"]),
             helper.make_node("Shape", ["y"], ["y_shape"]),
             helper.make_node("Slice", ["x_shape", "zero", "two"], ["nc"]),
             helper.make_node("Slice", ["y_shape", "two", "four"], ["hw"]),
             helper.make_node("Concat", ["nc", "hw"], ["sizes"], axis=0)]
    inits = [_const("zero", np.array([0], np.int64)), _const("two", np.array([2], np.int64)),
             _const("four", np.array([4], np.int64)),
             _const("roi", np.array([0, 0, -0.2, 0.1, 1, 1, 0.9, 1.3], np.float32))]
    for name, attrs in cases:
        roi = "roi" if attrs.get("coordinate_transformation_mode") == "tf_crop_and_resize" else ""
        nodes.append(helper.make_node("Resize", ["x", roi, "", "sizes"], [name], **attrs))
    for name, attrs, scales in scales_cases:
        inits.append(_const(f"{name}_scales", np.array([1, 1, *scales], np.float32)))
        nodes.append(helper.make_node("Resize", ["x", "", f"{name}_scales"], [name], **attrs))
    graph = helper.make_graph(
        nodes, "resize_to",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, "H", "W"]),
         helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 1, "P", "Q"])],
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, None)
         for name, *_ in [*cases, *scales_cases]], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def _inputs(batch: int, x_hw, y_hw) -> dict[str, np.ndarray]:
    return {"x": RNG.standard_normal((batch, 3, *x_hw)).astype(np.float32),
            "y": RNG.standard_normal((batch, 1, *y_hw)).astype(np.float32)}


@pytest.fixture(scope="module")
def model() -> onnx.ModelProto:
    return resize_to_model()


def test_resize_to_symbolic_sizes_matches_onnxruntime(model, target, tmp_path):
    vm = compile_vm(model, tmp_path / "resize_to.so", target)
    for batch, (x_hw, y_hw) in enumerate(SHAPES, start=1):
        inputs = _inputs(batch, x_hw, y_hw)
        got = [o.numpy() for o in vm["main"](inputs["x"], inputs["y"])]
        names = [name for name, *_ in [*CASES, *SCALES_CASES]]
        for name, g, want in zip(names, got, run_onnxruntime(model, inputs), strict=True):
            try:
                assert_close_to_reference([g], [want])
            except AssertionError as e:
                raise AssertionError(f"{name} at x {x_hw}, y {y_hw}: {e}") from None


def upsample_model() -> onnx.ModelProto:
    """Upsample-9 (nearest, linear) of ``x [N, 3, H, W]`` by non-integer scales."""
    nodes = [helper.make_node("Upsample", ["x", "scales"], [f"upsample_{mode}"], mode=mode)
             for mode in ("nearest", "linear")]
    graph = helper.make_graph(
        nodes, "upsample",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, "H", "W"])],
        [helper.make_tensor_value_info(n.output[0], TensorProto.FLOAT, None) for n in nodes],
        [_const("scales", np.array([1, 1, 1.5, 2.5], np.float32))])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 9)], ir_version=8)


def test_upsample_by_non_integer_scales_over_symbolic_dims(target, tmp_path):
    """The output size ``int(1.5 * H)`` is ``3 * H // 2``: exact integer arithmetic."""
    model = upsample_model()
    vm = compile_vm(model, tmp_path / "upsample.so", target)
    for batch, (hw, _) in enumerate(SHAPES, start=1):
        x = _inputs(batch, hw, hw)["x"]
        got = [o.numpy() for o in vm["main"](x)]
        assert_close_to_reference(got, run_onnxruntime(model, {"x": x}))


def axes_model() -> onnx.ModelProto:
    """Resize-18 with ``axes=[2, 3]`` and ``sizes = Shape(y)[2:]`` of ``x [N, 3, H, W]``, and of
    its global average (DeepLabV3's ASPP pooling branch: a static 1 × 1 map upsampled to a
    symbolic size, the scale float32(P) / 1), and to a fixed 5 × 6 (scale 5 / float32(H))."""
    nodes = [helper.make_node("Shape", ["y"], ["y_shape"]),
             helper.make_node("Slice", ["y_shape", "two", "four"], ["hw"]),
             helper.make_node("Resize", ["x", "", "", "hw"], ["axes_linear"], mode="linear",
                              axes=[2, 3]),
             helper.make_node("GlobalAveragePool", ["x"], ["pooled"]),
             helper.make_node("Resize", ["pooled", "", "", "hw"], ["pooled_up"], mode="linear",
                              axes=[2, 3], coordinate_transformation_mode="pytorch_half_pixel"),
             helper.make_node("Resize", ["x", "", "", "fixed"], ["fixed_cubic"], mode="cubic",
                              axes=[2, 3], coordinate_transformation_mode="align_corners")]
    graph = helper.make_graph(
        nodes, "resize_axes",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, "H", "W"]),
         helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 1, "P", "Q"])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None)
         for n in ("axes_linear", "pooled_up", "fixed_cubic")],
        [_const("two", np.array([2], np.int64)), _const("four", np.array([4], np.int64)),
         _const("fixed", np.array([5, 6], np.int64))])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)


def test_resize_18_axes_static_and_symbolic_sizes(target, tmp_path):
    model = axes_model()
    vm = compile_vm(model, tmp_path / "axes.so", target)
    for batch, (x_hw, y_hw) in enumerate(SHAPES, start=1):
        inputs = _inputs(batch, x_hw, y_hw)
        got = [o.numpy() for o in vm["main"](inputs["x"], inputs["y"])]
        assert_close_to_reference(got, run_onnxruntime(model, inputs))
