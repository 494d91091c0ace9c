"""``nn.attention`` (FuseAttention + the row-by-row compute) against onnxruntime: the exported
BERT chain MatMul(q, kᵀ) / √d + mask → Softmax → MatMul(·, v), at fixed sequence lengths
(graph executor, c and llvm) and with a symbolic one (VM)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx_helpers import compile_vm

H, D = 3, 16


def _attention_model(b, s, t, mask: bool = True):
    f = TensorProto.FLOAT
    nodes = [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["q", "kt"], ["qk"]),
             helper.make_node("Div", ["qk", "c"], ["x"])]
    if mask:
        nodes.append(helper.make_node("Add", ["x", "mask"], ["xm"]))
    nodes += [helper.make_node("Softmax", ["xm" if mask else "x"], ["p"], axis=-1),
              helper.make_node("MatMul", ["p", "v"], ["y"])]
    inputs = [helper.make_tensor_value_info("q", f, [b, H, s, D]),
              helper.make_tensor_value_info("k", f, [b, H, t, D]),
              helper.make_tensor_value_info("v", f, [b, H, t, D])]
    if mask:
        inputs.append(helper.make_tensor_value_info("mask", f, [b, 1, 1, t]))
    graph = helper.make_graph(
        nodes, "attention", inputs, [helper.make_tensor_value_info("y", f, [b, H, s, D])],
        [numpy_helper.from_array(np.array(np.sqrt(D), "float32"), "c")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _inputs(rng, b, s, t, mask=True):
    x = {n: rng.standard_normal((b, H, m, D)).astype("float32")
         for n, m in (("q", s), ("k", t), ("v", t))}
    if mask:  # BERT's additive mask: 0 for tokens, -10000 for padding (the last quarter)
        keep = np.ones((b, 1, 1, t), "float32")
        keep[..., t - t // 4:] = 0
        x["mask"] = (1 - keep) * -10000.0
    return x


@pytest.fixture
def any_length(monkeypatch):
    """FuseAttention for every key count (symbolic too), not only where it measured faster."""
    from kiln.relay.transform import fuse_attention

    monkeypatch.setattr(fuse_attention, "MAX_KEYS", None)
    monkeypatch.setattr(fuse_attention, "SYMBOLIC_KEYS", True)


@pytest.mark.parametrize("b,s,t,mask", [
    (1, 32, 32, True), (2, 7, 45, True), (1, 40, 40, False),
    (1, 5, 5, True),     # fewer query rows than a block: row by row
    (1, 9, 130, True),   # a last row block moved back (9 = 6 + 3), 130 keys: a key-block tail
    (1, 128, 128, True),  # MiniLM at [1, 128]: 21 blocks of rows and a moved-back one
])
def test_attention_matches_onnxruntime(check_model, any_length, b, s, t, mask):
    check_model(_attention_model(b, s, t, mask),
                _inputs(np.random.default_rng(0), b, s, t, mask))


@pytest.mark.parametrize("target", ["c", "llvm"])
def test_attention_propagates_nan_as_onnxruntime(target, tmp_path):
    """A NaN query element makes its whole output row NaN in every head it is in, and nothing
    else (the clamp of the exp argument must let NaN through, as the general exp does)."""
    from backend_helpers import compile_and_run, run_onnxruntime

    model = _attention_model(1, 8, 16)
    x = _inputs(np.random.default_rng(1), 1, 8, 16)
    x["q"][0, 1, 3, 5] = np.nan
    got, = compile_and_run(model, x, tmp_path, target)
    want, = run_onnxruntime(model, x)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    assert np.isnan(want[0, 1, 3]).all()
    np.testing.assert_allclose(np.nan_to_num(got), np.nan_to_num(want), rtol=1e-4, atol=1e-5)


def test_attention_chain_becomes_one_kernel():
    from kiln.driver.build_module import optimize, primitive_calls
    from kiln.frontend import from_onnx
    from kiln.target import Target

    mod, params = from_onnx(_attention_model(1, 32, 32))
    with Target("llvm"):
        names = [c.name for c in primitive_calls(optimize(mod["main"], params))]
    assert names == ["fused_transpose", "fused_nn_attention"], names
    mod, params = from_onnx(_attention_model(1, 128, 256))  # blocks of rows, longer keys
    with Target("llvm"):
        names = [c.name for c in primitive_calls(optimize(mod["main"], params))]
    assert names == ["fused_transpose", "fused_nn_attention"], names
    for s, t in (("s", "s"), (4, 4097)):  # symbolic keys, or row buffers past MAX_KEYS:
        mod, params = from_onnx(_attention_model(1, s, t))  # separate kernels
        with Target("llvm"):
            names = [c.name for c in primitive_calls(optimize(mod["main"], params))]
        assert "fused_nn_attention" not in names, names


def test_attention_kernel_keeps_one_block_of_rows(any_length):
    """The fused kernel at 128 keys: one parallel nest over (head, block of query rows), its
    intermediates one block of rows (scores and exp ``[ROW_BLOCK, T]``, max and sum one value
    per row), never the ``[B, H, S, T]`` scores."""
    from kiln.backend.te_compiler import lower_unpacked
    from kiln.driver.build_module import optimize, primitive_calls
    from kiln.frontend import from_onnx
    from kiln.target import Target
    from kiln.tir import loop as L
    from kiln.topi.attention import ROW_BLOCK

    mod, params = from_onnx(_attention_model(1, 128, 128))
    with Target("llvm"):
        (call,) = [c for c in primitive_calls(optimize(mod["main"], params))
                   if c.name == "fused_nn_attention"]
        kernel = lower_unpacked(call, call.name)
    assert isinstance(kernel.body, L.For) and kernel.body.kind == "parallel"
    assert kernel.body.extent.value == H * -(-128 // ROW_BLOCK)
    allocs = {s.buffer.name: s.buffer.shape for s in L.walk_stmts(kernel.body)
              if isinstance(s, L.Allocate) and s.buffer.scope != "local"}
    assert not allocs, allocs
    rows = {s.buffer.name.rsplit("_", 1)[0]: s.buffer.shape for s in L.walk_stmts(kernel.body)
            if isinstance(s, L.Allocate) and s.buffer.name.rsplit("_", 1)[0]
            in ("attention_scores", "attention_exp", "attention_max", "attention_sum")}
    assert rows == {"attention_scores": (ROW_BLOCK, 128), "attention_exp": (ROW_BLOCK, 128),
                    "attention_max": (ROW_BLOCK,), "attention_sum": (ROW_BLOCK,)}, rows


@pytest.mark.parametrize("target,dims,shapes", [
    ("llvm", ("b", "s", "s"), ((1, 1, 1), (1, 5, 5), (1, 13, 13), (2, 32, 32), (1, 70, 70))),
    ("c", ("b", "s", "s"), ((1, 1, 1), (1, 5, 5), (1, 13, 13), (2, 32, 32), (1, 70, 70))),
    # static queries, symbolic keys: the small-extent version (keys < a block) goes row by row
    ("llvm", (1, 6, "t"), ((1, 6, 3), (1, 6, 40))),
])
def test_attention_with_symbolic_sequence_on_the_vm(target, dims, shapes, tmp_path, any_length):
    import onnxruntime as ort

    model = _attention_model(*dims)
    vm = compile_vm(model, tmp_path / "attention.so", target)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    for b, s, t in shapes:
        x = _inputs(rng, b, s, t)
        got = vm["main"](*x.values())
        got = got[0] if isinstance(got, (list, tuple)) else got
        np.testing.assert_allclose(got.numpy(), sess.run(None, x)[0], rtol=1e-4, atol=1e-5)
