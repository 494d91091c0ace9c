"""Graph executor API beyond set_input/run/get_output, on hand-written kernels compiled by the
system C compiler: zero-copy I/O (and every aliasing case), input/output info, run_from_inputs,
params shared between executors, remove_params, several executors in threads, several models in
one process."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from executor_helpers import aligned, kernels, make_graph

import kiln.runtime as rt
from kiln.errors import KilnError, ModuleLoadError, ShapeError
from kiln.graph_executor import GraphModule, create

SHAPE = (4, 16)  # 256 bytes: views at multiples of 16 elements stay 64-byte aligned
P0 = np.arange(64, dtype="float32").reshape(SHAPE) / 7
# x, y, p0 → add1 = x + y → mul2 = add1 * p0 → out = mul2 + x; out reuses add1's storage (3).
GRAPH = make_graph(["x", "y", "p0"],
                   [("add1", "k_add", ["x", "y"]), ("mul2", "k_mul", ["add1", "p0"]),
                    ("out", "k_add", ["mul2", "x"])],
                   ["out"], {"x": SHAPE}, storage={"out": 3}, output_names=["out"])


def expected(x, y, p0=P0):
    return (x + y) * p0 + x


def rand(seed, shape=SHAPE):
    return np.random.default_rng(seed).standard_normal(shape).astype("float32")


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    """GRAPH's factory exported to a .so and loaded back."""
    path = tmp_path_factory.mktemp("ge") / "model.so"
    rt.GraphExecutorFactoryModule(GRAPH, kernels(), {"p0": P0}).export_library(str(path))
    return rt.load_module(str(path))


def kernel_data(executor, name: str) -> int:
    """Address of the data the kernels see for node ``name``'s entry (its shared DLTensor)."""
    nid = [n.name for n in executor.graph.nodes].index(name)
    return executor._storage.tensor(executor.graph.entry_id(nid)).contents.data


# ------------------------------------------------------------------------------ zero copy
def test_zero_copy_inputs_and_output(loaded):
    gm = GraphModule(loaded["default"](rt.cpu()))
    x, y, out = aligned(SHAPE), aligned(SHAPE), aligned(SHAPE)
    x.copyfrom(rand(1))
    y.copyfrom(rand(2))
    gm.set_input_zero_copy("x", x)
    gm.set_input_zero_copy(1, y)
    gm.set_output_zero_copy("out", out)
    ex = gm.module
    assert kernel_data(ex, "x") == x.data_ptr and kernel_data(ex, "out") == out.data_ptr
    assert kernel_data(ex, "add1") != out.data_ptr  # shares out's planned storage, not the buffer
    gm.run()
    np.testing.assert_allclose(out.numpy(), expected(rand(1), rand(2)), rtol=1e-6)
    x.copyfrom(rand(3))  # the kernels read the caller's memory: no set_input needed
    gm.run()
    np.testing.assert_allclose(out.numpy(), expected(rand(3), rand(2)), rtol=1e-6)
    np.testing.assert_array_equal(gm.get_output(0).numpy(), out.numpy())
    np.testing.assert_array_equal(gm.get_input("x").numpy(), rand(3))


def test_zero_copy_numpy_and_dlpack_memory(loaded):
    gm = GraphModule(loaded["default"](rt.cpu()))
    x = rt.array(rand(1))
    y_np = np.from_dlpack(rt.array(rand(2)))  # aligned numpy memory
    out = np.from_dlpack(aligned(SHAPE))
    gm.set_input_zero_copy("x", x)  # an NDArray
    gm.set_input_zero_copy("y", y_np)  # a numpy array
    gm.set_output_zero_copy(0, out)
    gm.run()
    np.testing.assert_allclose(out, expected(rand(1), rand(2)), rtol=1e-6)


def test_output_smaller_than_its_shared_storage():
    """out (16 floats) reuses the storage of a (32 floats): the caller's 16-float buffer must
    receive out only, never a's 32 floats (TVM re-points the entry, not the pool)."""
    graph = make_graph(["x"], [("a", "k_neg", ["x"]), ("b", "k_pairsum", ["a"]),
                               ("out", "k_neg", ["b"])], ["out"],
                       {"x": [32], "a": [32], "b": [16], "out": [16]}, storage={"out": 1})
    gm = GraphModule(rt.GraphExecutorFactoryModule(graph, kernels())["default"](rt.cpu()))
    big = aligned((48,), fill=7.0)
    out = np.from_dlpack(big)[:16]  # the first 64 bytes of big; 7.0 canaries after them
    x = np.arange(32, dtype="float32")
    gm.set_output_zero_copy(0, out)
    gm.run(x=x)
    np.testing.assert_array_equal(out, x[0::2] + x[1::2])
    np.testing.assert_array_equal(big.numpy()[16:], 7.0)


def test_output_entries_no_kernel_writes_in_place():
    """A graph input that is also an output, and one entry listed as two outputs: bound outputs
    get their values by copy at the end of run."""
    graph = make_graph(["x", "y"], [("s", "k_add", ["x", "y"])], ["s", "x", "s"], {"x": SHAPE},
                       output_names=["sum", "x_out", "sum_again"])
    gm = GraphModule(rt.GraphExecutorFactoryModule(graph, kernels())["default"](rt.cpu()))
    x, outs = aligned(SHAPE), [aligned(SHAPE) for _ in range(3)]
    gm.set_input_zero_copy("x", x)
    for k, buf in enumerate(outs):
        gm.set_output_zero_copy(k, buf)
    for seed in (1, 2):
        x.copyfrom(rand(seed))
        gm.run(y=rand(10))
        np.testing.assert_allclose(outs[0].numpy(), rand(seed) + rand(10), rtol=1e-6)
        np.testing.assert_array_equal(outs[1].numpy(), rand(seed))
        np.testing.assert_array_equal(outs[2].numpy(), outs[0].numpy())
        np.testing.assert_array_equal(gm.get_output("x_out").numpy(), rand(seed))
    gm.set_output_zero_copy(0, None)  # unbound: the kernel writes the pool again
    before = outs[0].numpy()
    gm.run(y=rand(11))
    np.testing.assert_array_equal(outs[0].numpy(), before)
    np.testing.assert_allclose(outs[2].numpy(), rand(2) + rand(11), rtol=1e-6)


def test_aliased_storage_is_copied_not_repointed():
    """Foreign graph JSON: a ``__nop`` view v shares a's storage while both live. Re-pointing a
    alone would leave v reading stale pool memory, so binding a copies; same for an input."""
    graph = make_graph(["x"], [("a", "k_neg", ["x"]), ("v", "__nop", ["a"]),
                               ("out", "k_mul", ["v", "x"])], ["a", "out"], {"x": SHAPE},
                       storage={"v": 1})
    gm = GraphModule(rt.GraphExecutorFactoryModule(graph, kernels())["default"](rt.cpu()))
    a, out = aligned(SHAPE), aligned(SHAPE)
    gm.set_output_zero_copy(0, a)
    gm.set_output_zero_copy(1, out)
    for seed in (1, 2):
        gm.run(x=rand(seed))
        np.testing.assert_array_equal(a.numpy(), -rand(seed))
        np.testing.assert_allclose(out.numpy(), -rand(seed) ** 2, rtol=1e-6)

    graph = make_graph(["x"], [("v", "__nop", ["x"]), ("out", "k_neg", ["v"])], ["out"],
                       {"x": SHAPE}, storage={"v": 0})
    gm = GraphModule(rt.GraphExecutorFactoryModule(graph, kernels())["default"](rt.cpu()))
    x = aligned(SHAPE)
    gm.set_input_zero_copy("x", x)
    for seed in (1, 2):
        x.copyfrom(rand(seed))
        gm.run()
        np.testing.assert_array_equal(gm.get_output(0).numpy(), -rand(seed))


def test_zero_copy_overlap_refused(loaded):
    gm = GraphModule(loaded["default"](rt.cpu()))
    buf = aligned(SHAPE)
    gm.set_input_zero_copy("x", buf)
    with pytest.raises(KilnError, match=r"output 0 \('out'\): its memory overlaps the zero-copy "
                                        r"input 'x'"):
        gm.set_output_zero_copy(0, buf)
    p0 = loaded["get_graph_params"]()["p0"]  # executors read the factory's array in place
    with pytest.raises(KilnError, match="overlaps the zero-copy input 'p0'"):
        gm.set_output_zero_copy(0, p0)
    out = aligned(SHAPE)
    gm.set_output_zero_copy(0, out)
    with pytest.raises(KilnError, match=r"input 'y': its memory overlaps the zero-copy output 0"):
        gm.set_input_zero_copy("y", out)
    np.testing.assert_array_equal(p0.numpy(), P0)


def _unaligned():
    base = aligned((SHAPE[0] * SHAPE[1] + 1,))
    return base._arr[1:].reshape(SHAPE)


@pytest.mark.parametrize("value, error, match", [
    (_unaligned, KilnError, r"input 'x': zero-copy needs 64-byte aligned memory"),
    (lambda: aligned((16, 4)), ShapeError, r"input 'x': expected shape \(4, 16\) dtype float32"),
    (lambda: rt.empty(SHAPE, "int32"), ShapeError, r"input 'x'.*dtype int32"),
    (lambda: aligned((4, 32))._arr[:, ::2], KilnError, "input 'x': zero-copy needs C-contiguous"),
    (lambda: [[0.0] * 16] * 4, KilnError, "input 'x': zero-copy needs an NDArray"),
])
def test_zero_copy_input_errors(loaded, value, error, match):
    gm = GraphModule(loaded["default"](rt.cpu()))
    with pytest.raises(error, match=match):
        gm.set_input_zero_copy("x", value())


def test_zero_copy_output_errors(loaded):
    gm = GraphModule(loaded["default"](rt.cpu()))
    ro = np.from_dlpack(aligned(SHAPE))
    ro.flags.writeable = False
    with pytest.raises(KilnError, match=r"output 0 \('out'\): zero-copy output memory is "
                                        "read-only"):
        gm.set_output_zero_copy(0, ro)
    with pytest.raises(KilnError, match=r"output index 1 out of range"):
        gm.set_output_zero_copy(1, aligned(SHAPE))
    with pytest.raises(KilnError, match="no output named 'nope'"):
        gm.set_output_zero_copy("nope", aligned(SHAPE))
    with pytest.raises(KilnError, match="no input named 'nope'"):
        gm.set_input_zero_copy("nope", aligned(SHAPE))


def test_set_input_ends_zero_copy(loaded):
    gm = GraphModule(loaded["default"](rt.cpu()))
    x = rt.array(rand(1))
    gm.set_input_zero_copy("x", x)
    gm.set_input("x", rand(2))  # copies into the executor; x is no longer read
    x.copyfrom(rand(3))
    gm.run(y=rand(4))
    np.testing.assert_allclose(gm.get_output(0).numpy(), expected(rand(2), rand(4)), rtol=1e-6)
    np.testing.assert_array_equal(x.numpy(), rand(3))


# ------------------------------------------------------------------------------ info, run_from
def test_info_and_run_from_inputs(loaded):
    gm = GraphModule(loaded["default"](rt.cpu()))
    assert gm.get_input_info() == ({"x": SHAPE, "y": SHAPE}, {"x": "float32", "y": "float32"})
    assert gm.get_output_info() == ({"out": SHAPE}, {"out": "float32"})
    (out,) = gm.run_from_inputs({"x": rand(1)}, y=rand(2))
    np.testing.assert_allclose(out.numpy(), expected(rand(1), rand(2)), rtol=1e-6)
    ex = gm.module
    (out,) = ex["run_from_inputs"](rt.cpu(), "x", rand(3), 1, rand(4))  # TVM's packed form
    np.testing.assert_allclose(out.numpy(), expected(rand(3), rand(4)), rtol=1e-6)
    with pytest.raises(KilnError, match="first argument must be the device"):
        ex["run_from_inputs"]("x", rand(1))
    with pytest.raises(KilnError, match="key, value pairs"):
        ex["run_from_inputs"](rt.cpu(), "x")
    buf = aligned(SHAPE)
    assert gm.get_output(0, out=buf) is buf
    np.testing.assert_allclose(buf.numpy(), expected(rand(3), rand(4)), rtol=1e-6)
    with pytest.raises(ShapeError):
        gm.get_output(0, out=aligned((2, 2)))


def test_output_info_without_names():
    graph = make_graph(["x"], [("n", "k_neg", ["x"])], ["n"], {"x": [3]})
    gm = create(graph, kernels())
    assert gm.get_output_info() == ({"output_0": (3,)}, {"output_0": "float32"})


# ------------------------------------------------------------------------------ params
def test_factory_executors_share_params_read_only(loaded):
    p0 = loaded["get_graph_params"]()["p0"]
    e1, e2 = (GraphModule(loaded["default"](rt.cpu())) for _ in range(2))
    assert kernel_data(e1.module, "p0") == kernel_data(e2.module, "p0") == p0.data_ptr
    e1.set_input("p0", 2 * P0)  # e1 gets its own copy; e2 and the factory are untouched
    assert kernel_data(e1.module, "p0") != p0.data_ptr
    for gm, scale in ((e1, 2), (e2, 1)):
        gm.run(x=rand(1), y=rand(2))
        np.testing.assert_allclose(gm.get_output(0).numpy(),
                                   expected(rand(1), rand(2), scale * P0), rtol=1e-6)
    np.testing.assert_array_equal(p0.numpy(), P0)
    np.testing.assert_array_equal(e1.get_input("p0").numpy(), 2 * P0)


def test_share_params(loaded):
    e1 = GraphModule(loaded["default"](rt.cpu()))
    e2 = create(GRAPH, loaded.imported_modules[0])  # no params bound: p0 is an input
    e2.share_params(e1, rt.save_param_dict({"p0": P0, "elsewhere": np.zeros(2, "float32")}))
    assert kernel_data(e2.module, "p0") == kernel_data(e1.module, "p0")
    e2.run(x=rand(1), y=rand(2))
    np.testing.assert_allclose(e2.get_output(0).numpy(), expected(rand(1), rand(2)), rtol=1e-6)
    e2.load_params(rt.save_param_dict({"p0": 3 * P0}))  # a copy of its own again
    e2.run()
    np.testing.assert_allclose(e2.get_output(0).numpy(), expected(rand(1), rand(2), 3 * P0),
                               rtol=1e-6)
    np.testing.assert_array_equal(e1.get_input("p0").numpy(), P0)
    with pytest.raises(ModuleLoadError, match="not a params blob"):
        e2.share_params(e1, b"\0" * 32)
    with pytest.raises(KilnError, match="expected a graph executor"):
        e2.share_params(loaded, rt.save_param_dict({"p0": P0}))
    other = create(make_graph(["p0"], [("n", "k_neg", ["p0"])], ["n"], {"p0": [3]}),
                   loaded.imported_modules[0])
    with pytest.raises(ShapeError, match=r"param 'p0': expected shape \(4, 16\)"):
        e2.share_params(other, rt.save_param_dict({"p0": P0}))


def test_remove_params_round_trip(tmp_path):
    factory = rt.GraphExecutorFactoryModule(GRAPH, kernels(), {"p0": P0})
    stripped = factory["remove_params"]()
    assert factory.get_graph_params().keys() == {"p0"}
    stripped.export_library(str(tmp_path / "noparams.so"))
    loaded = rt.load_module(str(tmp_path / "noparams.so"))
    assert loaded["get_graph_params"]() == {}
    gm = GraphModule(loaded["default"](rt.cpu()))
    assert gm.get_num_inputs() == 3
    gm.load_params(rt.save_param_dict(factory.get_graph_params()))
    gm.run(x=rand(1), y=rand(2))
    np.testing.assert_allclose(gm.get_output(0).numpy(), expected(rand(1), rand(2)), rtol=1e-6)


def _rss_bytes(field: str = "VmRSS:") -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field} line")


def test_executors_do_not_copy_params():
    n = 16 * 2**20  # 64 MiB of float32
    graph = make_graph(["x", "p0"], [("s", "k_add", ["x", "p0"])], ["s"], {"x": [n]})
    factory = rt.GraphExecutorFactoryModule(graph, kernels(), {"p0": np.ones(n, "float32")})
    factory.lib["k_add"]  # compile / load the kernels before measuring
    before = _rss_bytes()
    executors = [factory["default"](rt.cpu()) for _ in range(3)]
    grown = _rss_bytes() - before
    assert grown < n * 4 // 4, f"3 executors grew RSS by {grown / 2**20:.0f} MiB"
    del executors


def test_loaded_library_holds_params_once(tmp_path):
    # The blob's pages in the mapped library are released once the factory holds its own copy:
    # the params are resident once, not twice (32 MiB blob, 32 MiB factory array).
    n = 8 * 2**20
    p0 = np.random.default_rng(0).standard_normal(n).astype("float32")  # incompressible pages
    graph = make_graph(["x", "p0"], [("s", "k_add", ["x", "p0"])], ["s"], {"x": [n]})
    path = tmp_path / "big.so"
    rt.GraphExecutorFactoryModule(graph, kernels(), {"p0": p0}).export_library(str(path))
    before = _rss_bytes()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset the peak (VmHWM) to the current RSS
    factory = rt.load_module(str(path))
    grown = _rss_bytes() - before
    assert grown < n * 4 * 3 // 2, f"loading grew RSS by {grown / 2**20:.0f} MiB"
    # while loading, the blob is mapped and copied once into the factory's arrays: no third
    # copy (a bytes object handed to the loader)
    peak = _rss_bytes("VmHWM:") - before
    assert peak < n * 4 * 5 // 2, f"loading peaked {peak / 2**20:.0f} MiB above the start"
    gm = GraphModule(factory["default"](rt.cpu()))
    x = np.ones(n, "float32")
    gm.run(x=x)
    np.testing.assert_array_equal(gm.get_output(0).numpy(), x + p0)


# ------------------------------------------------------------------------------ threads
def _run_in_threads(*bodies):
    errors: list[BaseException] = []
    barrier = threading.Barrier(len(bodies))

    def wrap(body):
        try:
            barrier.wait()
            body()
        except BaseException as err:  # noqa: BLE001 - reported by the main thread
            errors.append(err)

    threads = [threading.Thread(target=wrap, args=(b,)) for b in bodies]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def test_two_threads_one_factory(tmp_path):
    shape = (256, 1024)
    graph = make_graph(["x", "y", "p0"],
                       [("add1", "k_add", ["x", "y"]), ("mul2", "k_mul", ["add1", "p0"]),
                        ("out", "k_add", ["mul2", "x"])], ["out"], {"x": shape},
                       storage={"out": 3})
    p0 = rand(99, shape)
    rt.GraphExecutorFactoryModule(graph, kernels(), {"p0": p0}).export_library(
        str(tmp_path / "big.so"))
    factory = rt.load_module(str(tmp_path / "big.so"))

    def body(seed):
        gm = GraphModule(factory["default"](rt.cpu()))
        out = aligned(shape)
        gm.set_output_zero_copy(0, out)
        for k in range(20):
            x, y = rand(seed * 1000 + k, shape), rand(seed * 1000 + k + 500, shape)
            gm.run(x=x, y=y)
            np.testing.assert_allclose(out.numpy(), expected(x, y, p0), rtol=1e-5, atol=1e-6)

    _run_in_threads(lambda: body(1), lambda: body(2))


def test_kernel_errors_stay_in_their_thread(loaded):
    lib = loaded.imported_modules[0]
    graphs = {tag: make_graph(["x"], [("f", f"k_fail_{tag}", ["x"])], ["f"], {"x": [2]})
              for tag in "ab"}

    def body(tag):
        gm = create(graphs[tag], lib)
        for _ in range(200):
            with pytest.raises(KilnError, match=rf"k_fail_{tag}: refused \({tag.upper()}\)"):
                gm.run(x=np.zeros(2, "float32"))

    _run_in_threads(lambda: body("a"), lambda: body("b"))


def test_two_models_same_symbols_one_process(tmp_path):
    graph = make_graph(["x"], [("s", "k_scale", ["x"])], ["s"], {"x": [5]})
    libs = []
    for scale in (2, 3):
        path = str(tmp_path / f"scale{scale}.so")
        rt.GraphExecutorFactoryModule(graph, kernels(scale)).export_library(path)
        libs.append(rt.load_module(path))
    x = np.arange(5, dtype="float32")
    outs = [GraphModule(lib["default"](rt.cpu())).run_from_inputs(x=x)[0] for lib in libs]
    np.testing.assert_array_equal(outs[0].numpy(), 2 * x)
    np.testing.assert_array_equal(outs[1].numpy(), 3 * x)
