"""The VM over real compiled kernels, through export_library and load_module: a kernel built by
``kiln.build`` called from hand-written bytecode (checked against numpy and the graph
executor), the replay fast path (one recording, then batched prepared calls) and hand-written C
kernels under symbolic shapes."""

from __future__ import annotations

import gc
import json
import weakref

import numpy as np
import pytest
import vm_programs as P
from executor_helpers import FUNCS, KERNELS

import kiln
import kiln.runtime as rt
from kiln.relay.graph import Call, Function, TensorType, Var
from kiln.runtime.vm.executable import VMExecutable, VMFunction
from kiln.runtime.vm.executable_format import Symbol
from kiln.runtime.vm.storage import Storage

SHAPE = (4, 8)
F32 = (2, 32)


@pytest.fixture(scope="module")
def factory():
    x = Var("x", TensorType(SHAPE, "float32"))
    y = Var("y", TensorType(SHAPE, "float32"))
    return kiln.build(Function([x, y], [Call("nn.relu", [Call("add", [x, y])])]), target="c")


def _kernel_name(factory) -> str:
    nodes = json.loads(factory.get_graph_json())["nodes"]
    (name,) = [n["attrs"]["func_name"] for n in nodes if n["op"] == "tvm_op"]
    return name


def _static_exe(factory) -> VMExecutable:
    """``main(x, y) = k(k(x, y), y)`` with k = relu(x + y) of the built library."""
    a = P.Asm([])
    nbytes = int(np.prod(SHAPE)) * 4
    dims = [(0, d) for d in SHAPE]
    f = a.begin("main", [("x", "float32", list(SHAPE)), ("y", "float32", list(SHAPE))],
                [("out", "float32", list(SHAPE))], num_regs=6, heap_size=0)
    a.call(-1, P.B + "match_shape", P.R(0), P.I(0), a.spec(*F32, dims))
    a.call(-1, P.B + "match_shape", P.R(1), P.I(1), a.spec(*F32, dims))
    a.call(2, P.B + "alloc_storage", P.I(0), P.I(2 * nbytes))
    f32 = a.c("float32")
    a.call(3, P.B + "alloc_tensor", P.R(2), P.I(0), f32, *map(P.I, SHAPE))
    a.call(4, P.B + "alloc_tensor", P.R(2), P.I(nbytes), f32, *map(P.I, SHAPE))
    a.call(-1, _kernel_name(factory), P.R(0), P.R(1), P.R(3))
    a.call(-1, _kernel_name(factory), P.R(3), P.R(1), P.R(4))
    a.emit(P.ret(4))
    a.end(f)
    return a.build(factory.lib)


def _ref(x, y):
    t = np.maximum(x + y, 0)
    return np.maximum(t + y, 0)


def test_compiled_kernel_through_export(factory, tmp_path):
    exe = _static_exe(factory)
    path = str(tmp_path / "vm.so")
    exe.export_library(path)
    loaded = rt.load_module(path)
    assert isinstance(loaded, VMExecutable) and loaded.type_key == "relax.VMExecutable"
    vm = kiln.vm.VirtualMachine(loaded, kiln.cpu())
    rng = np.random.default_rng(1)
    x, y = (rng.standard_normal(SHAPE).astype("float32") for _ in range(2))
    np.testing.assert_allclose(vm["main"](x, y).numpy(), _ref(x, y), rtol=1e-6)
    # against the graph executor on the same kernel
    gmod = kiln.graph_executor.GraphModule(factory["default"](kiln.cpu()))
    gmod.run(x=x, y=y)
    t = gmod.get_output(0).numpy()
    gmod.run(x=t, y=y)
    np.testing.assert_allclose(vm["main"](x, y).numpy(), gmod.get_output(0).numpy(), rtol=1e-6)


def test_replay_fast_path_is_used(factory, tmp_path):
    exe = _static_exe(factory)
    path = str(tmp_path / "vm.so")
    exe.export_library(path)
    vm = kiln.vm.VirtualMachine(rt.load_module(path))
    rng = np.random.default_rng(2)
    inputs = [[rng.standard_normal(SHAPE).astype("float32") for _ in range(2)]
              for _ in range(3)]
    first = vm["main"](*inputs[0]).numpy()
    assert vm.replay_stats()["recordings"] == 1 and vm.replay_stats()["replays"] == 0
    for x, y in [*inputs[1:], inputs[0]]:
        np.testing.assert_allclose(vm["main"](x, y).numpy(), _ref(x, y), rtol=1e-6)
    np.testing.assert_array_equal(vm["main"](*inputs[0]).numpy(), first)
    stats = vm.replay_stats()
    assert stats["replays"] == 4 and stats["recordings"] == 1
    (trace,) = vm.module._traces.values()
    # the storage is allocated ahead (its size is an immediate): the 2 kernels are one batch
    assert trace.num_calls == 2 and [s[0] for s in trace.steps] == ["batch"]
    assert trace.steps[0][1:3] == (0, 2) and len(trace._allocs) == 1
    # inputs given as aligned NDArrays are used in place by the replayed kernels too, and the
    # VM keeps no reference to them after the call
    x, y = rt.array(inputs[1][0]), rt.array(inputs[1][1])
    np.testing.assert_allclose(vm["main"](x, y).numpy(), _ref(inputs[1][0], inputs[1][1]),
                               rtol=1e-6)
    refs = [weakref.ref(x), weakref.ref(y)]
    del x, y
    gc.collect()
    assert all(r() is None for r in refs)


def _counting_runners(trace, counts: list) -> None:
    """Wrap the runner of each batch of ``trace`` so that each C call appends its count of
    kernels to ``counts`` (the calls still run)."""
    def wrap(runner):
        return lambda calls, n, failed: (counts.append(n), runner(calls, n, failed))[1]
    trace.steps = [(*s[:3], wrap(s[3]), *s[4:]) for s in trace.steps]


def test_repeated_replay_runs_only_the_kernels(factory, tmp_path, monkeypatch):
    """A replay with the last one's input shapes and heap makes one C call for its kernels
    and nothing else: no storage allocation, no struct or argument patching, no view of an
    intermediate; inputs at other addresses only move their own structs' pointers."""
    exe = _static_exe(factory)
    path = str(tmp_path / "vm.so")
    exe.export_library(path)
    vm = kiln.vm.VirtualMachine(rt.load_module(path))
    rng = np.random.default_rng(4)
    xs = [rt.array(rng.standard_normal(SHAPE).astype("float32")) for _ in range(2)]
    y = rt.array(rng.standard_normal(SHAPE).astype("float32"))
    vm["main"](xs[0], y)  # recorded
    (trace,) = vm.module._traces.values()
    assert trace.static and trace.patches == 0
    counts: list[int] = []
    _counting_runners(trace, counts)
    arena = vm.module.arena
    allocs, views = [], []
    alloc = arena.alloc
    monkeypatch.setattr(arena, "alloc", lambda *a: (allocs.append(a), alloc(*a))[1])
    view = Storage.view
    monkeypatch.setattr(Storage, "view",
                        lambda st, *a: (views.append(a), view(st, *a))[1])
    for k in range(6):
        if k == 3:  # the same address, new values: seen, with nothing patched
            xs[0]._arr[...] = rng.standard_normal(SHAPE)
        np.testing.assert_allclose(vm["main"](xs[0], y).numpy(), _ref(xs[0].numpy(), y.numpy()),
                                   rtol=1e-6)
    assert trace.patches == 1 and len(allocs) == 1  # the first replay only
    assert counts == [2] * 6  # one C call of both kernels per replay
    assert len(views) == 6  # the result's view (cached), no intermediate's
    assert trace.repoints == 0
    for k, x in enumerate((xs[1], xs[0], xs[0].numpy().copy())):  # new addresses, same shapes
        np.testing.assert_allclose(vm["main"](x, y).numpy(), _ref(np.asarray(x), y.numpy()),
                                   rtol=1e-6)
        assert trace.repoints == k + 1  # the inputs' structs only
    assert trace.patches == 1 and len(allocs) == 1 and counts == [2] * 9
    assert vm.replay_stats()["replays"] == 9


def _shape_as_data_model():
    """``y = x + Range(n, 2n)`` over ``x [1, n]``: the Range starts at a symbolic value, so the
    VM makes its start a tensor from the shape heap (``shape_to_tensor``) on every call."""
    from onnx import TensorProto, helper

    nodes = [helper.make_node("Shape", ["x"], ["shape"], start=1, end=2),
             helper.make_node("Squeeze", ["shape"], ["n"]),
             helper.make_node("Add", ["n", "n"], ["twice"]),
             helper.make_node("Range", ["n", "twice", "one"], ["ints"]),
             helper.make_node("Cast", ["ints"], ["offsets"], to=TensorProto.FLOAT),
             helper.make_node("Add", ["x", "offsets"], ["y"])]
    graph = helper.make_graph(
        nodes, "shape_as_data", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "n"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "n"])],
        [helper.make_tensor("one", TensorProto.INT64, [], [1])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_shape_used_as_data_keeps_the_replay_fast_path(tmp_path):
    """``shape_to_tensor`` of heap values known when the call starts is hoisted: its tensor is
    the trace's own, refilled from the heap before the kernels, so the kernels stay one batch
    and a call at the last replay's shapes takes the fast path (Funnel Transformer's positions:
    8 such tensors per call cost more than its 170 kernels). Values are right at every size."""
    from onnx_helpers import compile_vm

    vm = compile_vm(_shape_as_data_model(), tmp_path / "shape.so", "c",
                    instruction="shape_to_tensor")
    rng = np.random.default_rng(0)
    for n in (3, 3, 3, 5, 5, 3):
        x = rng.standard_normal((1, n)).astype("float32")
        np.testing.assert_allclose(vm["main"](x).numpy(), x + np.arange(n, 2 * n), rtol=1e-6)
    (trace,) = vm.module._traces.values()
    assert trace.static and [s[0] for s in trace.steps] == ["batch"]
    assert len(trace._shape_tensors) == 1
    assert trace.patches == 3  # (n = 3, then 5, then 3 again: the other replays reused all)
    assert vm.replay_stats()["replays"] == 5


def test_replay_after_a_storage_grew_patches_again(tmp_path):
    """A storage that an interpreted call (a profile) grows gets a new buffer: the next replay
    at the last replay's shapes must not reuse the structs that point at the old one."""
    exe = P.add_mul(rt.CSourceModule(KERNELS, FUNCS), [Symbol("n", 1, 64)], ("k_add", "k_mul"))
    path = str(tmp_path / "sym.so")
    exe.export_library(path)
    vm = kiln.vm.VirtualMachine(rt.load_module(path))
    rng = np.random.default_rng(5)
    small = [rt.array(rng.standard_normal((3, 4)).astype("float32")) for _ in range(2)]
    big = [rng.standard_normal((64, 4)).astype("float32") for _ in range(2)]
    for _ in range(3):
        vm["main"](*small)
    (trace,) = vm.module._traces.values()
    patches, allocations = trace.patches, vm.memory_stats()["allocations"]
    vm.profile("main", *big)  # interpreted: grows the storages
    assert vm.memory_stats()["allocations"] > allocations
    x, y = (a.numpy() for a in small)
    np.testing.assert_allclose(vm["main"](*small).numpy(), (x + y) * x, rtol=1e-6)
    assert trace.patches == patches + 1


def test_profile_compiled(factory):
    vm = kiln.vm.VirtualMachine(_static_exe(factory))
    x = np.ones(SHAPE, np.float32)
    report = vm.profile("main", x, x)
    assert [r.name for r in report.rows] == [_kernel_name(factory)] * 2
    assert report.rows[0].bytes_written == x.nbytes and report.rows[0].bytes_read == 2 * x.nbytes
    res = vm.time_evaluator("main", kiln.cpu(), number=5, repeat=2)(x, x)
    assert len(res.results) == 2 and res.mean > 0


def test_symbolic_shapes_with_c_kernels(tmp_path):
    exe = P.add_mul(rt.CSourceModule(KERNELS, FUNCS), [Symbol("n", 1, 64)], ("k_add", "k_mul"))
    path = str(tmp_path / "sym.so")
    exe.export_library(path)
    vm = kiln.vm.VirtualMachine(rt.load_module(path))
    rng = np.random.default_rng(3)
    for n in (3, 64, 3, 17, 3, 1):
        x, y = (rng.standard_normal((n, 4)).astype("float32") for _ in range(2))
        np.testing.assert_allclose(vm["main"](x, y).numpy(), (x + y) * x, rtol=1e-6)
    assert vm.replay_stats()["replays"] == 5  # one trace for every n
    assert vm.memory_stats()["storage_bytes"] == 2 * 64 * 16


def test_failing_kernel_message(tmp_path):
    a = P.Asm([])
    f = a.begin("main", [("x", "float32", [4])], [], num_regs=1, heap_size=0)
    a.call(-1, P.B + "match_shape", P.R(0), P.I(0), a.spec(*F32, [(0, 4)]))
    a.call(-1, "k_fail_a", P.R(0))
    a.emit(P.ret(0))
    a.end(f)
    vm = kiln.vm.VirtualMachine(a.build(rt.CSourceModule(KERNELS, FUNCS)))
    for _ in range(2):  # interpreted, then (same heap) again
        with pytest.raises(kiln.KilnError, match="k_fail_a: refused"):
            vm["main"](np.zeros(4, np.float32))


def test_vm_function_entry_names_are_validated():
    with pytest.raises(kiln.ModuleLoadError, match="appears twice"):
        VMExecutable([], [VMFunction(0, "k_add"), VMFunction(0, "k_add")], [], [])


def _two_symbol_model():
    """``y = Reshape(Transpose(Relu(MatMul(x, w) + b)), [-1])`` over ``x: [m, n]``,
    ``w: [n, 3]``, ``b: [m, 1]``: two symbols, views and kernels with symbol arguments."""
    from onnx import TensorProto, helper

    f = TensorProto.FLOAT
    nodes = [helper.make_node("MatMul", ["x", "w"], ["xw"]),
             helper.make_node("Add", ["xw", "b"], ["s"]),
             helper.make_node("Relu", ["s"], ["r"]),
             helper.make_node("Transpose", ["r"], ["t"], perm=[1, 0]),
             helper.make_node("Reshape", ["t", "flat"], ["y"])]
    graph = helper.make_graph(
        nodes, "two", [helper.make_tensor_value_info("x", f, ["m", "n"]),
                       helper.make_tensor_value_info("w", f, ["n", 3]),
                       helper.make_tensor_value_info("b", f, ["m", 1])],
        [helper.make_tensor_value_info("y", f, [None])],
        [helper.make_tensor("flat", TensorProto.INT64, [1], [-1])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_replay_across_symbol_values_matches_interpretation(tmp_path):
    from kiln.frontend import from_onnx

    mod, params = from_onnx(_two_symbol_model(), dim_bounds={"m": (1, 64), "n": (1, 64)})
    path = str(tmp_path / "two.so")
    kiln.build(mod, target="llvm", params=params).export_library(path)
    vm = kiln.vm.VirtualMachine(rt.load_module(path))
    rng = np.random.default_rng(5)
    for m, n in rng.integers(1, 65, (10, 2)):
        x, w, b = (rng.standard_normal(s).astype("float32") for s in ((m, n), (n, 3), (m, 1)))
        got = vm["main"](x, w, b).numpy()
        np.testing.assert_allclose(got, np.maximum(x @ w + b, 0).T.reshape(-1), rtol=1e-4,
                                   atol=1e-5)
        vm.profile("main", x, w, b)  # interpreted: the same storage, the same result
        np.testing.assert_array_equal(vm["main"](x, w, b).numpy(), got)
    assert vm.replay_stats()["recordings"] == 1 and vm.replay_stats()["replays"] == 19
