"""Blocked layouts: Layout parsing and numpy transforms, the NCHWc convolutions lowered with their
register-blocked schedules on the loop-IR interpreter, and AlterOpLayout on small graphs."""

from __future__ import annotations

import numpy as np
import pytest
from test_lowering import run_lowered

from kiln.backend import te_compiler
from kiln.errors import CompileError
from kiln.relay.graph import Call, Constant, Function, PrimitiveCall, TensorType, Var, post_order
from kiln.relay.interpreter import evaluate
from kiln.relay.transform.alter_op_layout import alter_op_layout
from kiln.relay.transform.fuse_ops import fuse_ops
from kiln.target import Target
from kiln.tir.layout import Layout, transform_array
from kiln.tir.lower import Schedule

RNG = np.random.default_rng(7)


def _rand(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def test_layout_parse_and_index():
    lay = Layout.parse("NCHW16c")
    assert lay.primal == "NCHW" and lay.factor("C") == 16 and lay.factor("H") == 0
    assert lay.shape({"N": 1, "C": 32, "H": 3, "W": 5}) == (1, 2, 3, 5, 16)
    assert lay.index(lay.primal_index((0, 1, 2, 3, 4))) == (0, 1, 2, 3, 4)
    assert lay.primal_index((0, 1, 2, 3, 4))["C"] == 20


@pytest.mark.parametrize("bad", ["", "NCHW16", "NCHW16C", "NCHWc", "NCHW16h16h", "NCCW",
                                 "NCHW4x"])
def test_layout_rejects_malformed(bad):
    with pytest.raises(CompileError):
        Layout.parse(bad)


def test_transform_array_round_trip():
    x = _rand(2, 32, 3, 5)
    y = transform_array(x, "NCHW", "NCHW16c")
    assert y.shape == (2, 2, 3, 5, 16) and y[1, 1, 2, 3, 4] == x[1, 20, 2, 3]
    z = transform_array(y, "NCHW16c", "NCHW8c")
    np.testing.assert_array_equal(transform_array(z, "NCHW8c", "NCHW"), x)
    w = _rand(32, 16, 3, 3)
    wb = transform_array(w, "OIHW", "OIHW8i16o")
    assert wb.shape == (2, 2, 3, 3, 8, 16) and wb[1, 0, 2, 1, 3, 5] == w[21, 3, 2, 1]


def _conv_graph(shape, oc, k, stride, pad, groups=1, relu=True):
    x = Var("x", TensorType(shape, "float32"))
    w = Constant(_rand(oc, shape[1] // groups, k, k))
    b = Constant(_rand(oc))
    y = Call("nn.conv2d", [x, w], {"strides": (stride, stride), "padding": (pad,) * 4,
                                   "dilation": (1, 1), "groups": groups})
    y = Call("nn.bias_add", [y, b], {"axis": 1})
    return x, (Call("nn.relu", [y]) if relu else y)


def _ops(func: Function) -> list[str]:
    return [n.op.name for n in post_order(func.outputs) if isinstance(n, Call)]


@pytest.mark.parametrize("shape,oc,k,stride,pad,groups", [
    ((1, 3, 9, 9), 16, 3, 2, 1, 1),     # first layer: NCHW read as NCHW1c
    ((1, 32, 7, 7), 24, 1, 1, 0, 1),    # 1x1, output block 8
    ((1, 16, 6, 10), 16, 3, 1, 1, 16),  # depthwise
    ((1, 8, 5, 5), 8, 3, 1, 1, 2),      # grouped: blocks of 4 within each of 2 groups
    ((1, 32, 7, 5), 64, 3, 2, 1, 4),    # grouped, 8 inputs and 16 outputs a group
])
def test_blocked_conv_matches_reference(shape, oc, k, stride, pad, groups):
    x, y = _conv_graph(shape, oc, k, stride, pad, groups)
    func = Function([x], [y])
    altered = alter_op_layout(func)
    kind = "nn.depthwise_conv2d_NCHWc" if groups == shape[1] == oc else "nn.conv2d_NCHWc"
    assert kind in _ops(altered) and "nn.conv2d" not in _ops(altered)
    data = _rand(*shape)
    expect = evaluate(func, {"x": data})[0]
    np.testing.assert_allclose(evaluate(altered, {"x": data})[0], expect, rtol=1e-4, atol=1e-4)
    (got,) = run_lowered(fuse_ops(altered), {"x": data})
    np.testing.assert_allclose(got, expect, rtol=1e-4, atol=1e-4)


def test_image_input_is_read_without_a_transform():
    x, y = _conv_graph((1, 3, 9, 9), 16, 3, 2, 1)
    altered = alter_op_layout(Function([x], [y]))
    (conv,) = [n for n in post_order(altered.outputs)
               if isinstance(n, Call) and n.op.name == "nn.conv2d_NCHWc"]
    assert conv.args[0] is x and conv.args[1].checked_type.shape[4] == 1  # OIHW1i16o
    assert _ops(altered).count("layout_transform") == 1  # the output's


def test_padded_outputs_stay_blocked_through_per_channel_ops():
    """A 1000-class conv (padded to 1024) keeps its blocked value through bias, ReLU and global
    pooling; the real channels are cropped once, after the pool."""
    x, y = _conv_graph((1, 64, 3, 3), 1000, 1, 1, 0)  # conv, bias_add, relu
    func = Function([x], [Call("nn.global_avg_pool2d", [y], {"layout": "NCHW"})])
    with Target("llvm -mtriple=x86_64-linux-gnu -mcpu=skylake-avx512"):
        altered = alter_op_layout(func)
    (pool,) = [n for n in post_order(altered.outputs)
               if isinstance(n, Call) and n.op.name == "nn.global_avg_pool2d"]
    assert pool.checked_type.shape == (1, 32, 1, 1, 32)
    back = [n for n in post_order(altered.outputs) if isinstance(n, Call)
            and n.op.name == "layout_transform" and n.attrs["dst_layout"] == "NCHW"]
    assert len(back) == 1 and back[0].args[0] is pool
    assert altered.outputs[0].checked_type.shape == (1, 1000, 1, 1)
    data = _rand(1, 64, 3, 3)
    np.testing.assert_allclose(evaluate(altered, {"x": data})[0], evaluate(func, {"x": data})[0],
                               rtol=1e-4, atol=1e-4)


def test_narrow_convs_pad_and_add_blocked():
    """LR-ASPP's head: two 5-class convs (each padded to one 16-float vector, decision 059)
    added, then a sigmoid: the add and the sigmoid run on the padded blocked values, and the
    real channels are cropped once, at the end."""
    x, y = _conv_graph((1, 32, 6, 6), 5, 1, 1, 0, relu=False)
    z = Call("nn.conv2d", [x, Constant(_rand(5, 32, 3, 3))],
             {"strides": (1, 1), "padding": (1,) * 4, "dilation": (1, 1), "groups": 1})
    func = Function([x], [Call("sigmoid", [Call("add", [z, y])])])
    with Target("llvm -mtriple=x86_64-linux-gnu -mcpu=skylake-avx512"):
        altered = alter_op_layout(func)
    convs = [n for n in post_order(altered.outputs)
             if isinstance(n, Call) and n.op.name == "nn.conv2d_NCHWc"]
    assert [c.checked_type.shape for c in convs] == [(1, 1, 6, 6, 16)] * 2
    (add,) = [n for n in post_order(altered.outputs) if isinstance(n, Call) and n.op.name == "add"
              and not any(isinstance(a, Constant) for a in n.args)]
    assert add.checked_type.shape == (1, 1, 6, 6, 16)
    (sigmoid,) = [n for n in post_order(altered.outputs)
                  if isinstance(n, Call) and n.op.name == "sigmoid"]
    assert sigmoid.args[0] is add
    assert altered.outputs[0].checked_type.shape == (1, 5, 6, 6)
    data = _rand(1, 32, 6, 6)
    np.testing.assert_allclose(evaluate(altered, {"x": data})[0], evaluate(func, {"x": data})[0],
                               rtol=1e-5, atol=1e-5)


def test_layout_flows_between_convs_and_through_residual_add():
    x, y = _conv_graph((1, 16, 6, 6), 16, 3, 1, 1)
    w2 = Constant(_rand(16, 16, 1, 1))
    z = Call("nn.conv2d", [y, w2], {"strides": (1, 1), "padding": (0, 0, 0, 0),
                                    "dilation": (1, 1), "groups": 1})
    out = Call("nn.relu", [Call("add", [z, y])])
    func = Function([x], [out])
    altered = alter_op_layout(func)
    transforms = [n for n in post_order(altered.outputs)
                  if isinstance(n, Call) and n.op.name == "layout_transform"]
    # one into the blocked layout at the input, one back at the output: none in between
    assert [(t.attrs["src_layout"], t.attrs["dst_layout"]) for t in transforms] == \
        [("NCHW", "NCHW16c"), ("NCHW16c", "NCHW")]
    data = _rand(1, 16, 6, 6)
    np.testing.assert_allclose(evaluate(altered, {"x": data})[0],
                               evaluate(func, {"x": data})[0], rtol=1e-4, atol=1e-4)


def test_grouped_conv_runs_blocked():
    """A grouped conv becomes nn.conv2d_NCHWc with groups (blocks within a group); groups of
    fewer than MIN_GROUP_BLOCK outputs (channel multiplier 2) stay NCHW."""
    x, y = _conv_graph((1, 8, 5, 5), 8, 3, 1, 1, groups=2)
    (conv,) = [n for n in post_order(alter_op_layout(Function([x], [y])).outputs)
               if isinstance(n, Call) and n.op.name.startswith("nn.conv2d")]
    assert conv.op.name == "nn.conv2d_NCHWc" and conv.attrs["groups"] == 2
    assert conv.args[1].data.shape == (2, 1, 3, 3, 4, 4)  # [O/ob, (C/g)/ib, kh, kw, ib, ob]
    x, y = _conv_graph((1, 8, 5, 5), 16, 3, 1, 1, groups=8)
    assert "nn.conv2d" in _ops(alter_op_layout(Function([x], [y])))


def test_grouped_conv_reads_its_producers_block():
    """8-channel groups after a conv with 32-channel blocks read the producer's NCHW32c value
    as it is (4 groups a block, ib 8): no layout transform between the two convs."""
    with Target("llvm -mcpu=skylake-avx512"):
        x, y = _conv_graph((1, 16, 6, 6), 64, 1, 1, 0)
        wg = Constant(_rand(64, 8, 3, 3))
        z = Call("nn.conv2d", [y, wg], {"strides": (1, 1), "padding": (1,) * 4,
                                        "dilation": (1, 1), "groups": 8})
        func = Function([x], [z])
        altered = alter_op_layout(func)
    nodes = [n for n in post_order(altered.outputs) if isinstance(n, Call)]
    assert [(n.attrs["src_layout"], n.attrs["dst_layout"]) for n in nodes
            if n.op.name == "layout_transform"] == [("NCHW", "NCHW16c"), ("NCHW8c", "NCHW")]
    grouped = [n for n in nodes if n.op.name == "nn.conv2d_NCHWc" and n.attrs.get("groups")]
    assert grouped[0].args[0].checked_type.shape[4] == 32
    assert grouped[0].args[1].data.shape == (8, 1, 3, 3, 8, 8)
    data = _rand(1, 16, 6, 6)
    np.testing.assert_allclose(evaluate(altered, {"x": data})[0],
                               evaluate(func, {"x": data})[0], rtol=1e-4, atol=1e-4)


def _pool(kind: str, x):
    if kind.startswith("global"):
        return Call(f"nn.{kind}", [x])
    attrs = {"pool_size": (3, 3), "strides": (2, 2), "padding": (1, 1, 1, 1),
             "dilation": (1, 1), "ceil_mode": True}
    if kind == "avg_pool2d":
        attrs["count_include_pad"] = False
    return Call(f"nn.{kind}", [x], attrs)


@pytest.mark.parametrize("kind", ["max_pool2d", "avg_pool2d", "global_avg_pool2d",
                                  "global_max_pool2d"])
def test_pool_runs_in_blocked_layout(kind):
    # conv → pool → conv: the pool takes the blocked value, no transform in between
    x, y = _conv_graph((1, 4, 5, 5), 16, 1, 1, 0)
    w2 = Constant(_rand(8, 16, 1, 1))
    z = Call("nn.conv2d", [_pool(kind, y), w2], {"strides": (1, 1), "padding": (0, 0, 0, 0),
                                                 "dilation": (1, 1), "groups": 1})
    func = Function([x], [z])
    altered = alter_op_layout(func)
    pools = [n for n in post_order(altered.outputs)
             if isinstance(n, Call) and n.op.name == f"nn.{kind}"]
    assert [p.attrs["layout"] for p in pools] == ["NCHW16c"]
    # the 4-channel input is read as it is (NCHW1c): one transform, at the output
    assert _ops(altered).count("layout_transform") == 1
    data = _rand(1, 4, 5, 5)
    expect = evaluate(func, {"x": data})[0]
    np.testing.assert_allclose(evaluate(altered, {"x": data})[0], expect, rtol=1e-4, atol=1e-4)
    (got,) = run_lowered(fuse_ops(altered), {"x": data})
    np.testing.assert_allclose(got, expect, rtol=1e-4, atol=1e-4)


def test_squeeze_excite_scale_stays_blocked():
    # y * sigmoid(conv(global_avg_pool(y))): the [1, C, 1, 1] scale broadcasts over H, W
    x, y = _conv_graph((1, 16, 6, 6), 32, 3, 1, 1)
    w = Constant(_rand(32, 32, 1, 1))
    s = Call("nn.conv2d", [Call("nn.global_avg_pool2d", [y]), w],
             {"strides": (1, 1), "padding": (0, 0, 0, 0), "dilation": (1, 1), "groups": 1})
    out = Call("multiply", [y, Call("sigmoid", [s])])
    func = Function([x], [out])
    altered = alter_op_layout(func)
    assert _ops(altered).count("layout_transform") == 2
    data = _rand(1, 16, 6, 6)
    np.testing.assert_allclose(evaluate(altered, {"x": data})[0],
                               evaluate(func, {"x": data})[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("m,n,k", [(1, 64, 24), (6, 40, 7), (3, 10, 5), (1, 4, 4096)])
def test_dense_with_packed_weights(m, n, k):
    x = Var("x", TensorType((m, k), "float32"))
    w, b = Constant(_rand(n, k)), Constant(_rand(n))
    func = Function([x], [Call("nn.relu", [Call("nn.bias_add", [Call("nn.dense", [x, w]), b],
                                                {"axis": 1})])])
    with Target("llvm -mtriple=x86_64-linux-gnu -mcpu=skylake-avx512"):  # 16 float lanes
        altered = alter_op_layout(func)
    (dense,) = [c for c in post_order(altered.outputs)
                if isinstance(c, Call) and c.op.name == "nn.dense_pack"]
    block = {64: 32, 40: 8, 10: 2, 4: 4}[n]  # two vectors, or the largest power of two dividing n
    assert dense.args[1].data.shape == (n // block, k, block)
    data = _rand(m, k)
    expect = evaluate(func, {"x": data})[0]
    # Each output sums k float32 products of size ~1 in another order than numpy's: the partial
    # sums grow like sqrt(k) and their rounding adds up like sqrt(k) ulps, so the error bound is
    # ~k * 6e-8. A fixed 1e-5 failed by chance in CI at k = 4096 (an output near 2.6, off 3.7e-5).
    atol = max(1e-5, 1e-7 * k)
    np.testing.assert_allclose(evaluate(altered, {"x": data})[0], expect, rtol=1e-5, atol=atol)
    (got,) = run_lowered(fuse_ops(altered), {"x": data})
    np.testing.assert_allclose(got, expect, rtol=1e-5, atol=atol)


@pytest.mark.parametrize("target,block", [
    ("llvm -mtriple=x86_64-linux-gnu -mcpu=skylake-avx512", 32),  # two 16-float vectors
    ("llvm -mtriple=x86_64-linux-gnu -mcpu=haswell", 16),
    ("llvm -mtriple=aarch64-linux-gnu", 8),
])
def test_conv_block_is_two_target_vectors(target, block):
    x, y = _conv_graph((1, 64, 4, 4), 64, 1, 1, 0)
    with Target(target):
        altered = alter_op_layout(Function([x], [y]))
    (conv,) = [c for c in post_order(altered.outputs)
               if isinstance(c, Call) and c.op.name == "nn.conv2d_NCHWc"]
    assert conv.checked_type.shape[-1] == block


@pytest.mark.parametrize("oc,padded", [(1000, 1024), (250, 256), (24, 24), (40, 40)])
def test_conv_outputs_padded_to_full_blocks_when_cheap(oc, padded):
    """1000 classes run as 1024 in blocks of 32 (not 125 blocks of 8), then sliced back; 24
    outputs stay exact (padding would add a third more work). The choice depends on the output
    channels and the target only (``_padded_outputs``): 16 inputs on a 2x2 plane keep the
    interpreter's run short (64 on 3x3 took 10 s)."""
    x, y = _conv_graph((1, 16, 2, 2), oc, 1, 1, 0)
    func = Function([x], [y])
    with Target("llvm -mtriple=x86_64-linux-gnu -mcpu=skylake-avx512"):
        altered = alter_op_layout(func)
    (conv,) = [c for c in post_order(altered.outputs)
               if isinstance(c, Call) and c.op.name == "nn.conv2d_NCHWc"]
    shape = conv.checked_type.shape
    assert shape[1] * shape[4] == padded
    assert altered.outputs[0].checked_type.shape == (1, oc, 2, 2)
    data = _rand(1, 16, 2, 2)
    expect = evaluate(func, {"x": data})[0]
    np.testing.assert_allclose(evaluate(altered, {"x": data})[0], expect, rtol=1e-4, atol=1e-4)
    (got,) = run_lowered(fuse_ops(altered), {"x": data})
    np.testing.assert_allclose(got, expect, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("rows,blocks", [(2, (32, 40, 32)), (1, (125, 40, 8))])
def test_dense_outputs_padded_to_full_blocks_when_cheap(rows, blocks):
    """Padded with two rows or more; one row (a matrix-vector product) keeps exact blocks."""
    x = Var("x", TensorType((rows, 40), "float32"))
    func = Function([x], [Call("nn.dense", [x, Constant(_rand(1000, 40))])])
    with Target("llvm -mtriple=x86_64-linux-gnu -mcpu=skylake-avx512"):
        altered = alter_op_layout(func)
    (dense,) = [c for c in post_order(altered.outputs)
                if isinstance(c, Call) and c.op.name == "nn.dense_pack"]
    assert dense.args[1].data.shape == blocks
    data = _rand(rows, 40)
    expect = evaluate(func, {"x": data})[0]
    (got,) = run_lowered(fuse_ops(altered), {"x": data})
    np.testing.assert_allclose(got, expect, rtol=1e-5, atol=1e-5)


def _conv_stage(call: PrimitiveCall):
    """The conv2d_NCHWc tensor of a fused conv kernel (its output is the epilogue)."""
    _, out = te_compiler.to_te(call.body)
    return next(t for t in Schedule(out).order if t.tag == "conv2d_NCHWc")


def test_k_blocked_conv_matches_reference(monkeypatch):
    """K-blocking (input blocks split, a band of rows accumulated in L1) on a conv small enough
    for the interpreter: the thresholds are lowered so that it is taken."""
    from kiln.relay.transform import winograd
    from kiln.schedules import conv_blocks

    monkeypatch.setattr(winograd, "WINOGRAD", False)  # the direct kernel's blocking
    monkeypatch.setattr(conv_blocks, "K_BLOCK_MIN_WEIGHT_BYTES", 0)
    monkeypatch.setattr(conv_blocks, "K_BLOCK_WEIGHT_BYTES", 16 * 9 * 16 * 4)  # one input block
    monkeypatch.setattr(conv_blocks, "MIN_PARALLEL_EXTENT", 2)
    x, y = _conv_graph((1, 32, 4, 6), 16, 3, 1, 1)
    func = fuse_ops(alter_op_layout(Function([x], [y])))
    (conv,) = [c for c in post_order(func.outputs) if isinstance(c, PrimitiveCall)
               and "conv2d_NCHWc" in c.name]
    conv = _conv_stage(conv)
    rc, _, _, ri = conv.body.axes
    assert conv_blocks._k_block(conv, rc, 9 * ri.extent) == conv_blocks.KBlock(input_blocks=1,
                                                                               rows=2)
    data = _rand(1, 32, 4, 6)
    (got,) = run_lowered(func, {"x": data})
    np.testing.assert_allclose(got, evaluate(Function([x], [y]), {"x": data})[0],
                               rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("shape,oc,k,expect", [
    ((1, 512, 7, 7), 512, 3, (1, 7)),      # resnet50's last stage: 16 channel blocks
    ((1, 2048, 7, 7), 512, 1, (4, 7)),
    ((1, 256, 14, 14), 256, 3, (1, 7)),    # 8 channel blocks: two bands a block (parallel)
    ((1, 64, 56, 56), 64, 3, (1, 4)),      # bands of 4 rows fit the accumulator budget
    ((1, 64, 56, 56), 64, 1, None),        # 8 KiB of weights a block: L1 holds them
    ((1, 384, 13, 13), 48, 1, None),       # 3 channel blocks, 13 (prime) rows: no band
])
def test_k_block_choice(monkeypatch, shape, oc, k, expect):
    from kiln.relay.transform import winograd
    from kiln.schedules import conv_blocks

    # the direct kernel's blocking (the 3x3 shapes would run as Winograd convs: decision 050)
    monkeypatch.setattr(winograd, "WINOGRAD", False)
    x, y = _conv_graph(shape, oc, k, 1, k // 2)
    with Target("llvm -mtriple=x86_64-linux-gnu -mcpu=skylake-avx512"):
        func = fuse_ops(alter_op_layout(Function([x], [y])))
    (conv,) = [c for c in post_order(func.outputs) if isinstance(c, PrimitiveCall)
               and "conv2d_NCHWc" in c.name]
    conv = _conv_stage(conv)
    rc, _, _, ri = conv.body.axes
    got = conv_blocks._k_block(conv, rc, k * k * ri.extent)
    assert (got if got is None else tuple(got)) == expect


HASWELL = "llvm -mtriple=x86_64-linux-gnu -mcpu=haswell"


@pytest.mark.parametrize("target,oc,block", [
    (HASWELL, 24, 24),  # 16 ymm: three vectors, not one (8)
    (HASWELL, 72, 24),
    (HASWELL, 48, 16),  # the full block divides: unchanged
    (HASWELL, 40, 8),   # three vectors do not divide either
    ("llvm -mtriple=x86_64-linux-gnu", 12, 12),  # SSE2: 16 xmm of 4 floats
    ("llvm -mtriple=x86_64-linux-gnu -mcpu=skylake-avx512", 24, 8),  # 32 zmm: unchanged
    ("llvm -mtriple=aarch64-linux-gnu", 24, 8),
])
def test_three_vector_blocks_with_sixteen_registers(target, oc, block):
    """Outputs that two vectors do not divide but three do run in blocks of three vectors on
    targets with 16 vector registers (``THREE_VECTOR_BLOCKS``); other targets keep their
    measured blocks (docs/decisions/003)."""
    x, y = _conv_graph((1, 16, 2, 2), oc, 1, 1, 0)
    with Target(target):
        altered = alter_op_layout(Function([x], [y]))
    (conv,) = [c for c in post_order(altered.outputs)
               if isinstance(c, Call) and c.op.name == "nn.conv2d_NCHWc"]
    assert conv.checked_type.shape[-1] == block


def test_three_vector_block_flows_through_depthwise_and_residual_add():
    """MobileNetV2's 24-channel stage on AVX2: 1×1 conv → depthwise → residual add → 1×1 conv
    all in NCHW24c (no transform in between), the same values as the NCHW graph, also lowered
    (register blocks of 4 pixels × 3 vectors) on the loop-IR interpreter."""
    x, y = _conv_graph((1, 8, 5, 5), 24, 1, 1, 0)
    d = Call("nn.conv2d", [y, Constant(_rand(24, 1, 3, 3))],
             {"strides": (1, 1), "padding": (1, 1, 1, 1), "dilation": (1, 1), "groups": 24})
    z = Call("nn.conv2d", [Call("add", [d, y]), Constant(_rand(16, 24, 1, 1))],
             {"strides": (1, 1), "padding": (0, 0, 0, 0), "dilation": (1, 1), "groups": 1})
    func = Function([x], [z])
    with Target(HASWELL):
        altered = alter_op_layout(func)
        transforms = [(n.attrs["src_layout"], n.attrs["dst_layout"])
                      for n in post_order(altered.outputs)
                      if isinstance(n, Call) and n.op.name == "layout_transform"]
        assert transforms == [("NCHW", "NCHW8c"), ("NCHW16c", "NCHW")]
        depthwise = [n for n in post_order(altered.outputs)
                     if isinstance(n, Call) and n.op.name == "nn.depthwise_conv2d_NCHWc"]
        assert [n.checked_type.shape for n in depthwise] == [(1, 1, 5, 5, 24)]
        data = _rand(1, 8, 5, 5)
        expect = evaluate(func, {"x": data})[0]
        np.testing.assert_allclose(evaluate(altered, {"x": data})[0], expect, rtol=1e-4,
                                   atol=1e-4)
        (got,) = run_lowered(fuse_ops(altered), {"x": data})
    np.testing.assert_allclose(got, expect, rtol=1e-4, atol=1e-4)
