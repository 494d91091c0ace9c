"""Convolutional graphs over symbolic dims: conv/pool/resize type relations (the symbolic size
evaluates to the static one at every value), divisor-aware arithmetic, AlterOpLayout and
SplitConcat on symbolic shapes, the converters conv models need (Resize, Dropout), and the
conv schedules' block choice along symbolic extents."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from kiln import arith
from kiln.errors import ShapeError, UnsupportedOpError
from kiln.frontend import from_onnx
from kiln.relay.graph import Call, Constant, Function, TensorType, Var, post_order
from kiln.relay.op.nn import pool_output_size
from kiln.relay.transform.alter_op_layout import alter_op_layout
from kiln.relay.transform.split_concat import split_concat
from kiln.schedules import schedule_loops
from kiln.schedules.conv_blocks import _divisors, _row_block
from kiln.schedules.primitives import peel_lets
from kiln.tir import loop as L
from kiln.tir import te
from kiln.tir.lower import Schedule, lower

RNG = np.random.default_rng(11)
N, H, W = arith.SymVar("N"), arith.SymVar("H"), arith.SymVar("W")
H32 = arith.SymVar("H", 32, None, 32)


def _conv(x: Var | Call, oc: int, k: int, stride: int = 1, pad: int = 0, dilation: int = 1,
          groups: int = 1) -> Call:
    ic = x.checked_type.shape[1]
    w = Constant(RNG.standard_normal((oc, ic // groups, k, k)).astype(np.float32))
    return Call("nn.conv2d", [x, w], {"strides": (stride, stride), "padding": (pad,) * 4,
                                      "dilation": (dilation, dilation), "groups": groups})


def _ops(func: Function) -> list[str]:
    return [n.op.name for n in post_order(func.outputs) if isinstance(n, Call)]


@pytest.mark.parametrize("k,stride,pad,dilation", [(3, 1, 1, 1), (3, 2, 1, 1), (1, 2, 0, 1),
                                                   (5, 3, 2, 1), (3, 1, 2, 2)])
def test_conv2d_symbolic_output_size_matches_static(k, stride, pad, dilation):
    sym = _conv(Var("x", TensorType((N, 4, H, W), "float32")), 8, k, stride, pad, dilation)
    n, o, oh, ow = sym.checked_type.shape
    assert (n, o) == (N, 8) and not isinstance(oh, int)
    for h in range(5, 41):
        static = _conv(Var("x", TensorType((2, 4, h, h + 3), "float32")), 8, k, stride, pad,
                       dilation).checked_type.shape
        assert arith.evaluate(oh, {"H": h}) == static[2]
        assert arith.evaluate(ow, {"W": h + 3}) == static[3]


def test_conv2d_rejects_only_inputs_empty_for_every_value():
    small = arith.SymVar("S", 1, 3)
    with pytest.raises(ShapeError):
        _conv(Var("x", TensorType((1, 4, small, small), "float32")), 8, 5)
    # unbounded: fine for large enough inputs (the bounds are the user's to declare)
    assert _conv(Var("x", TensorType((1, 4, H, W), "float32")), 8, 5).checked_type.ndim == 4


@pytest.mark.parametrize("kernel,stride,pads,ceil_mode", [
    (3, 2, (0, 0), True), (3, 2, (1, 1), True), (2, 2, (0, 1), True), (3, 3, (1, 0), False),
    (2, 1, (0, 0), True)])
def test_pool_symbolic_output_size_matches_static(kernel, stride, pads, ceil_mode):
    sym = pool_output_size(H, kernel, stride, pads[0], pads[1], 1, ceil_mode)
    for h in range(kernel, 60):
        assert arith.evaluate(sym, {"H": h}) == \
            pool_output_size(h, kernel, stride, pads[0], pads[1], 1, ceil_mode), h


def test_a_ceil_mode_pool_drops_no_window_unless_one_can_start_in_the_padding():
    """squeezenet's MaxPool (3, stride 2, no padding) after its stride-2 stem: the last window
    always starts inside the input, so the extent is the ceil division alone, with bounds (the
    ``min`` with the dropped-window size was undecidable and left the conv after it without a
    lower bound). A 2-window with a tail pad of 1 can start in the padding, and then the
    dropped-window size is the smaller one: it is the extent. Both equal the static rule at
    every size."""
    stem = pool_output_size(H, 3, 2, 0, 0, 1, False)
    pooled = pool_output_size(stem, 3, 2, 0, 0, 1, True)
    assert "min" not in str(pooled) and arith.bounds(pooled)[0] == 0
    padded = pool_output_size(H, 2, 2, 0, 1, 1, True)
    assert padded == (H + 1) // 2
    for h in range(7, 40):  # (the stem leaves the pool a window)
        static = pool_output_size(pool_output_size(h, 3, 2, 0, 0, 1, False), 3, 2, 0, 0, 1, True)
        assert arith.evaluate(pooled, {"H": h}) == static
        assert arith.evaluate(padded, {"H": h}) == pool_output_size(h, 2, 2, 0, 1, 1, True)


def test_conv2d_transpose_symbolic_output_size():
    x = Var("x", TensorType((N, 8, H, W), "float32"))
    w = Constant(np.zeros((8, 4, 2, 2), np.float32))
    y = Call("nn.conv2d_transpose", [x, w], {"strides": (2, 2), "padding": (0, 0, 0, 0),
                                             "dilation": (1, 1), "groups": 1,
                                             "output_padding": (0, 0)})
    assert y.checked_type.shape == (N, 4, 2 * H, 2 * W)


def test_division_sees_variable_divisors():
    """A stride-2 conv chain and a ×2 upsampling of the next level agree when H is declared a
    multiple of 32 (PP-OCRv4 det's FPN adds them); without the divisor they cannot."""
    level = H32
    for _ in range(5):
        level = (level + 2 - 2 - 1) // 2 + 1  # 3×3, stride 2, pad 1
    assert level == H32 // 32
    assert (H32 + 1) // 2 == 16 * (H32 // 32) and (H32 + 1) % 2 == 1
    assert (H + 1) // 2 != 16 * (H // 32)  # no divisor: stays a floor division
    assert (H32 // 3, 7 // 2, 7 % 2) == (arith.SymOp("floordiv", (H32, 3)), 3, 1)


@pytest.mark.parametrize("shape", [(N, 16, 14, 14), (N, 16, H, W), (1, 16, H, W)])
def test_alter_op_layout_blocks_symbolic_shapes(shape):
    """Channels stay static, so NCHW→NCHWc works whatever N, H, W are; one transform in, one
    out, the output type unchanged."""
    x = Var("x", TensorType(shape, "float32"))
    y = Call("nn.relu", [_conv(Call("nn.relu", [_conv(x, 16, 3, pad=1)]), 32, 1, stride=2)])
    dw = _conv(y, 32, 3, pad=1, groups=32)
    func = Function([x], [Call("nn.global_avg_pool2d", [dw], {"layout": "NCHW"})])
    altered = alter_op_layout(func)
    ops = _ops(altered)
    assert "nn.conv2d" not in ops and ops.count("nn.conv2d_NCHWc") == 2
    assert "nn.depthwise_conv2d_NCHWc" in ops
    assert ops.count("layout_transform") == 2
    assert altered.outputs[0].checked_type == func.outputs[0].checked_type
    blocked = [n for n in post_order(altered.outputs)
               if isinstance(n, Call) and n.op.name == "nn.conv2d_NCHWc"]
    assert blocked[0].checked_type.shape[0] == shape[0]
    assert blocked[0].checked_type.shape[2:4] == shape[2:4]


def test_split_concat_with_symbolic_batch():
    """A squeeze conv over a fire module's concatenation splits with a symbolic batch (its
    cost comparison holds for every batch); an expanding conv does not."""
    a = Var("a", TensorType((N, 8, H, W), "float32"))
    b = Var("b", TensorType((N, 8, H, W), "float32"))
    cat = Call("concatenate", [a, b], {"axis": 1})
    assert "concatenate" not in _ops(split_concat(Function([a, b], [_conv(cat, 4, 1)])))
    cat = Call("concatenate", [a, b], {"axis": 1})
    assert "concatenate" in _ops(split_concat(Function([a, b], [_conv(cat, 64, 1)])))


def _one_node_model(node, out_shape, inits=(), in_shape=("N", 3, "H", "W")):
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(in_shape))],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, out_shape) for o in node.output
         if o], list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


@pytest.mark.parametrize("scale,expect", [(2.0, lambda h: 2 * h), (0.5, lambda h: h // 2),
                                          (1.0, lambda h: h), (1.5, lambda h: 3 * h // 2),
                                          (0.625, lambda h: 5 * h // 8)])
def test_resize_scales_on_symbolic_sizes(scale, expect):
    scales = helper.make_tensor("scales", TensorProto.FLOAT, [4], [1, 1, scale, scale])
    node = helper.make_node("Resize", ["x", "", "scales"], ["y"], mode="nearest",
                            coordinate_transformation_mode="asymmetric", nearest_mode="floor")
    mod, _ = from_onnx(_one_node_model(node, None, [scales]))
    n, c, h, w = mod["main"].outputs[0].checked_type.shape
    hv, wv = (mod["main"].params[0].checked_type.shape[k] for k in (2, 3))
    assert (n, c, h, w) == (mod["main"].params[0].checked_type.shape[0], 3, expect(hv),
                            expect(wv))


def test_resize_rejects_inexact_scale_of_symbolic_size():
    """float32(0.3) is 5033165 / 2**24: int(0.3 * H) rounds the float32 product."""
    scales = helper.make_tensor("scales", TensorProto.FLOAT, [4], [1, 1, 0.3, 0.3])
    node = helper.make_node("Resize", ["x", "", "scales"], ["y"], mode="nearest")
    with pytest.raises(UnsupportedOpError, match=r"scale 0.3\d* of symbolic dim .*5033165"):
        from_onnx(_one_node_model(node, None, [scales]))


def test_dropout_mask_of_symbolic_shape():
    node = helper.make_node("Dropout", ["x"], ["y", "mask"])
    model = _one_node_model(node, None)
    model.graph.output[1].type.tensor_type.elem_type = TensorProto.BOOL
    mod, _ = from_onnx(model)
    y, mask = mod["main"].outputs
    assert y.checked_type.shape == mask.checked_type.shape and mask.checked_type.dtype == "bool"
    assert not mask.checked_type.is_static


def test_conv_blocks_along_symbolic_extents_need_no_tail():
    """Register blocks divide the extent for every value: the divisors a symbol's divisor
    guarantees (W a multiple of 32, at stride 4: 8 | W // 4), else one pixel."""
    assert _divisors(W, 14) == [1] and _row_block(W) == 1
    assert _divisors(H32 // 4, 14) == [1, 2, 4, 8] and _row_block(H32 // 4) == 8
    assert _row_block(H32 // 4, taps=1) == 8
    assert _row_block(56) == 14 and _row_block(56, taps=1) == 8  # static: unchanged
    assert _divisors(12) == [1, 2, 3, 4, 6, 12]



def _parallel_nest(shape) -> L.For:
    """The parallel loop schedule_loops makes of ``x + 1`` over ``shape``."""
    x = te.placeholder(shape, "float32", "x")
    y = te.compute(shape, lambda *i: x[i] + 1.0, name="y", tag="elemwise")
    func = schedule_loops(lower(Schedule(y), [x], "add_one"))
    (loop,) = [s for s in L.walk_stmts(func.body) if isinstance(s, L.For)
               and s.kind == "parallel"]
    return loop


def test_fused_symbolic_nest_binds_its_indices_once():
    """Fusing across a symbolic extent binds the outer loop variables once per iteration
    (LetStmt): the C compiler left the substituted divisions in the vectorizable inner loop.
    Constant extents still substitute (static kernels unchanged)."""
    loop = _parallel_nest((N, 3, 5, 64))
    lets, inner = peel_lets(loop.body)
    assert len(lets) == 4 and isinstance(inner, L.For) and inner.extent.value == 64
    assert not any(isinstance(s, L.LetStmt) for s in L.walk_stmts(inner))
    static = _parallel_nest((2, 3, 5, 4096))
    assert not peel_lets(static.body)[0]


def _lowered_resize(shape, size, scale) -> str:
    """The lowered text of a linear align_corners ``image.resize2d`` compute, the numbers that
    make names unique dropped."""
    import re

    from kiln.topi.image import resize2d

    x = te.placeholder(shape, "float32", "x")
    attrs = {"size": size, "scale": scale, "method": "linear",
             "coordinate_transformation_mode": "align_corners",
             "rounding_method": "round_prefer_floor", "roi": (0.0, 0.0, 1.0, 1.0),
             "extrapolation_value": 0.0, "cubic_alpha": -0.75, "exclude_outside": False,
             "antialias": False}
    y = resize2d([x], attrs, TensorType((*shape[:2], *size), "float32"))
    return re.sub(r"_\d+(?=\b|_ax)", "", str(lower(Schedule(y), [x], "resize").body))


def test_resize_scale_from_static_sizes_is_a_constant():
    """A scale left to the sizes (None) over static sizes folds to onnxruntime's constant
    float32(out) / float32(in): the same kernel as that scale given, no run-time division."""
    from_sizes = _lowered_resize((1, 3, 7, 9), (5, 4), (None, None))
    scales = tuple(float(np.float32(o) / np.float32(i)) for o, i in ((5, 7), (4, 9)))
    assert from_sizes == _lowered_resize((1, 3, 7, 9), (5, 4), scales)
    assert "select" not in from_sizes and "float32(H" not in from_sizes


def test_resize_scale_of_symbolic_sizes_is_computed_at_run_time():
    """Over a symbolic H the scale is float32(5) / float32(H), and scale 1 (H == 5) maps each
    row to itself, as onnxruntime does; W's static scale stays a constant."""
    text = _lowered_resize((1, 3, H, 9), (5, 4), (None, None))
    assert "select(((5.0 / float32(H)) == 1.0)" in text
    assert "float32(W" not in text and "* 8.0) / 3.0)" in text


@pytest.mark.parametrize("scale", [1.5, 0.75, 2.5, 0.625, 255 / 128, 3 / 1024, 7.0])
def test_resize_output_size_of_a_symbolic_dim_is_the_float32_product(scale):
    """int(float32(scale) * float32(h)), onnxruntime's output size, equals the converter's
    integer arithmetic below 2**16 (the ends of that range and values between)."""
    scales = helper.make_tensor("scales", TensorProto.FLOAT, [4], [1, 1, scale, 1])
    node = helper.make_node("Resize", ["x", "", "scales"], ["y"], mode="nearest")
    mod, _ = from_onnx(_one_node_model(node, None, [scales]))
    size = mod["main"].outputs[0].checked_type.shape[2]
    (symbol,) = arith.free_symbols(size)
    h = np.unique(np.concatenate([np.arange(1, 1025), np.arange(2**16 - 1024, 2**16),
                                  RNG.integers(1, 2**16, 2048)]))
    want = (np.float32(scale) * h.astype(np.float32)).astype(np.int64)
    got = np.array([arith.evaluate(size, {symbol.name: int(v)}) for v in h])
    np.testing.assert_array_equal(got, want)


def _conv_kernel_text(oc: int, dilation: int = 1) -> str:
    """The lowered kernel of relu(conv3x3(x[N, 64, H, W], oc channels)) for skylake-avx512,
    padded by ``dilation`` (the output keeps the input's size)."""
    from kiln.backend.te_compiler import lower_primitive
    from kiln.driver.build_module import optimize
    from kiln.relay.graph import PrimitiveCall
    from kiln.target import Target
    from kiln.tir.text import astext

    x = Var("x", TensorType((N, 64, H, W), "float32"))
    conv = _conv(x, oc, 3, pad=dilation, dilation=dilation)
    func = Function([x], [Call("nn.relu", [conv])])
    with Target("llvm -mtriple=x86_64-linux-gnu -mcpu=skylake-avx512"):
        (conv,) = [c for c in post_order(optimize(func, {}).outputs)
                   if isinstance(c, PrimitiveCall) and "conv" in c.name]
        return astext(lower_primitive(conv, conv.name))


@pytest.mark.parametrize("oc,pixels", [(64, 4), (16, 8)])
def test_a_symbolic_width_gets_shifted_register_blocks(oc, pixels):
    """A width with no known divisor is blocked in shifted blocks of ``pixels`` (8
    accumulators: 4 pixels of two vectors, 8 of one); rows narrower than a block take the
    kernel's version with blocks half as wide, and rows narrower than those its unblocked
    version (one-pixel blocks everywhere were 2-3x slower: RetinaNet's head; SSDLite's 4-wide
    maps took the unblocked version)."""
    text = _conv_kernel_text(oc)
    half = pixels // 2
    assert f"if (W < {pixels}):" in text and f"if (W < {half}):" in text, text
    main = text.split(f"if (W < {pixels}):", 1)[1].split(f"if (W < {half}):", 1)[1]
    _, middle, main = main.split("else:", 2)  # the unblocked version, the middle one, main
    assert f"range(0, 0 + {pixels}) [unrolled]" in main, main
    assert f"ax3_i in range(0, 0 + {half}) [unrolled]" in middle, middle


def test_a_symbolic_plane_padded_widely_is_read_in_place():
    """A pad of WIDE_PADDING or more a side over a symbolic plane (DeepLabV3's ASPP: 36 around
    a 4x4 map) is read through guarded loads, not copied: the copy was 22 MB a conv for 16
    output pixels (ASPP at 4x4: 13.8 -> 4.1 ms). A narrow pad is still materialized."""
    assert "for pad_" not in _conv_kernel_text(64, dilation=12)
    assert "for pad_" in _conv_kernel_text(64, dilation=2)


def test_a_row_of_taps_in_the_padding_is_skipped_by_one_test():
    """The row conjunct of a conv's in-place padding test is hoisted to the kernel-row loop
    (kiln.schedules.pad_guards): ASPP's dilation-36 conv at 4x4, 960 -> 256 channels, 1
    thread: 880 -> 454 µs. The selects under it keep only the column test."""
    text = _conv_kernel_text(64, dilation=12)
    guards = [line for line in text.splitlines() if line.lstrip().startswith("if (")
              and "_ry * 12" in line]
    assert guards, text
    for line in text.splitlines():
        if "select(" in line:
            assert "_ry * 12)) >= 12)" not in line.split("select(", 1)[1].split(", p0[", 1)[0]


def test_pad_guards_leave_a_body_with_other_stores_alone():
    """A loop whose body also stores something that is not a padded update is not guarded:
    skipping it would skip that store."""
    from kiln.schedules.pad_guards import hoist_pad_guards
    from kiln.tir import loop as L

    r, i = L.Var("r", "int32"), L.Var("i", "int32")
    acc = L.Buffer("acc", (4,), "float32")
    other = L.Buffer("other", (4,), "float32")
    x = L.Buffer("x", (8,), "float32")
    load = L.BufferLoad(x, [i + r])
    update = L.BufferStore(acc, L.BufferLoad(acc, [i]) + L.Select(r < 2, load, 0.0), [i])
    inner = L.For(i, L.const(0, "int32"), L.const(4, "int32"), "serial", update)
    padded = L.PrimFunc("f", [acc, x], L.For(r, L.const(0, "int32"), L.const(4, "int32"),
                                            "serial", inner))
    assert isinstance(hoist_pad_guards(padded).body.body, L.IfThenElse)
    mixed_body = L.seq(inner, L.BufferStore(other, L.const(1.0, "float32"), [r]))
    mixed = L.PrimFunc("g", [acc, x, other],
                       L.For(r, L.const(0, "int32"), L.const(4, "int32"), "serial", mixed_body))
    assert hoist_pad_guards(mixed) is mixed
