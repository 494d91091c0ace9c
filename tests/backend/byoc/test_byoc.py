"""BYOC end to end on small graphs, through the real C compiler: the cblas backend's kernels vs
the graph interpreter (each composite form, exported and loaded back, and run before export),
its module tree (no const loader), a missing OpenBLAS, ``.tar`` and ``llvm`` exports; the
kiln_json backend behind the const loader; and a third, toy external codegen registered entirely
from this file (a Python binary module), whose region crosses dtypes.
"""

from __future__ import annotations

import struct

import numpy as np
import pytest

import kiln
import kiln.runtime as rt
from kiln import byoc
from kiln.errors import ToolchainError
from kiln.relay.graph import Call, Constant, Function, FunctionCall, TensorType, Var, post_order
from kiln.relay.interpreter import evaluate
from kiln.runtime.module import modules_dfs
from kiln.runtime.registry import remove_global_func

RNG = np.random.default_rng(11)


@pytest.fixture(scope="module")
def openblas():
    from kiln.byoc.cblas import openblas_link_flags

    try:
        return openblas_link_flags()
    except ToolchainError as err:
        pytest.skip(f"OpenBLAS not available: {err}")


def _const(*shape, dtype="float32"):
    return Constant(RNG.standard_normal(shape).astype(dtype))


def _var(name, *shape, dtype="float32"):
    return Var(name, TensorType(shape, dtype))


def _inputs(func: Function) -> dict[str, np.ndarray]:
    return {p.name: RNG.standard_normal(p.checked_type.shape).astype(p.checked_type.dtype)
            for p in func.params}


def run_lib(lib, inputs, path=None):
    """Export ``lib`` to ``path`` and load it (or run it as built when ``path`` is None)."""
    root = lib
    if path is not None:
        lib.export_library(str(path))
        root = rt.load_module(str(path))
    gm = kiln.graph_executor.GraphModule(root["default"](kiln.cpu()))
    for k, v in inputs.items():
        gm.set_input(k, v)
    gm.run()
    return root, [gm.get_output(i).numpy() for i in range(gm.get_num_outputs())]


def check(func, byoc_names, tmp_path, target="c", suffix=".so", export=True):
    inputs = _inputs(func)
    lib = kiln.build(func, target, byoc=byoc_names)
    root, got = run_lib(lib, inputs, tmp_path / f"m{suffix}" if export else None)
    for g, w in zip(got, evaluate(func, inputs), strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4 * max(1.0, np.abs(w).max()))
    return root


def _conv(x, cout, k=3, stride=1, pad=1, dilation=1, groups=1):
    cin = x.checked_type.shape[1]
    return Call("nn.conv2d", [x, _const(cout, cin // groups, k, k)],
                {"strides": (stride, stride), "padding": (pad, pad, pad, pad),
                 "dilation": (dilation, dilation), "groups": groups})


def _conv_cases():
    def plain():
        x = _var("x", 2, 6, 9, 9)
        return Function([x], [_conv(x, 8, k=3, stride=2, pad=1)])

    def bias_relu_1x1_then_dilated():
        x = _var("x", 1, 8, 7, 7)
        a = Call("nn.relu", [Call("nn.bias_add", [_conv(x, 16, k=1, pad=0), _const(16)],
                                  {"axis": 1})])
        return Function([x], [_conv(a, 4, k=3, pad=2, dilation=2)])

    def grouped_residual_clip():
        x = _var("x", 1, 8, 6, 6)
        c = Call("add", [_conv(x, 8, groups=2), _const(1, 8, 1, 1)])
        r = Call("clip", [Call("add", [x, c])], {"a_min": -0.5, "a_max": 0.5})
        return Function([x], [r])

    def hardswish_asymmetric_pad():
        x = _var("x", 1, 3, 10, 8)
        c = Call("nn.conv2d", [x, _const(5, 3, 3, 2)],
                 {"strides": (2, 1), "padding": (1, 0, 0, 1), "dilation": (1, 1), "groups": 1})
        return Function([x], [Call("hardswish", [Call("add", [c, _const(5, 1, 1)])])])

    return {f.__name__: f for f in (plain, bias_relu_1x1_then_dilated, grouped_residual_clip,
                                     hardswish_asymmetric_pad)}


@pytest.mark.parametrize("case", list(_conv_cases()))
def test_cblas_conv2d(openblas, tmp_path, case):
    func = _conv_cases()[case]()
    root = check(func, ["cblas"], tmp_path)
    keys = [m.type_key for m in modules_dfs(root)]
    assert keys == ["GraphExecutorFactory", "library"]  # C linked in; no const loader
    assert any(n.startswith("kiln_default_cblas_main_") for n in root.imported_modules[0]
               .list_function_names())


def test_cblas_dense_matmul_batch_matmul(openblas, tmp_path):
    x = _var("x", 3, 10)
    d = Call("clip", [Call("add", [Call("nn.dense", [x, _const(7, 10)]), _const(1, 7)])],
             {"a_min": 0.0, "a_max": 6.0})
    a, b = _var("a", 4, 5, 6), _var("b", 6, 3)
    bm = Call("nn.matmul", [a, b])  # b broadcast over the batch
    c, e = _var("c", 2, 2, 3, 4), _var("e", 2, 2, 4, 5)
    bm2 = Call("nn.matmul", [c, e])
    m2 = Call("nn.matmul", [_var("m", 3, 4), _const(4, 2)])
    func = Function([x, a, b, c, e, m2.args[0]],
                    [Call("sigmoid", [d]), bm, bm2, m2])
    part = byoc.partition_for(func, ["cblas"])
    comps = sorted(n.body.attrs["Composite"] for f in byoc.external_functions(part)
                   for n in post_order(f.outputs) if isinstance(n, FunctionCall))
    assert comps == ["cblas.batch_matmul", "cblas.batch_matmul", "cblas.dense_bias_clip",
                     "cblas.matmul"]
    check(func, ["cblas"], tmp_path)


def test_cblas_jit_llvm_and_tar(openblas, tmp_path):
    x = _var("x", 1, 4, 8, 8)
    func = Function([x], [Call("sigmoid", [Call("nn.relu", [_conv(x, 8)])])])
    check(func, ["cblas"], tmp_path, export=False)  # CSourceModule JIT links OpenBLAS too
    check(func, ["cblas"], tmp_path, target="llvm")  # C source beside LLVM objects
    check(func, ["cblas"], tmp_path, suffix=".tar")  # the relink reads the link options


def test_cblas_without_openblas_is_a_toolchain_error(tmp_path, monkeypatch):
    empty = tmp_path / "no-pc"
    empty.mkdir()
    monkeypatch.setenv("PKG_CONFIG_LIBDIR", str(empty))
    monkeypatch.setenv("PKG_CONFIG_PATH", str(empty))
    x = _var("x", 2, 3)
    func = Function([x], [Call("nn.dense", [x, _const(4, 3)])])
    with pytest.raises(ToolchainError, match="OpenBLAS not found.*apt-get install "
                                             "libopenblas-dev pkg-config"):
        kiln.build(func, "c", byoc=["cblas"])
    monkeypatch.setenv("PKG_CONFIG", str(tmp_path / "no-such-pkg-config"))
    with pytest.raises(ToolchainError, match="not found to locate OpenBLAS"):
        kiln.build(func, "c", byoc=["cblas"])


def test_kiln_json_runs_behind_the_const_loader(tmp_path):
    x = _var("x", 1, 4, 8, 8)
    a = Call("nn.relu", [Call("nn.bias_add", [_conv(x, 8), _const(8)], {"axis": 1})])
    b = Call("sigmoid", [a])  # Kiln's: splits the model into two kiln_json functions
    c = Call("nn.max_pool2d", [_conv(b, 8, k=1, pad=0)],
             {"pool_size": (2, 2), "strides": (2, 2), "padding": (0, 0, 0, 0),
              "dilation": (1, 1), "ceil_mode": False})
    func = Function([x], [c])
    check(func, ["kiln_json"], tmp_path, export=False)
    root = check(func, ["kiln_json"], tmp_path)
    (loader,) = root.imported_modules
    assert loader.type_key == "const_loader"
    assert [m.type_key for m in loader.imported_modules] == ["library", "kiln_json",
                                                             "kiln_json"]
    assert sorted(loader.const_vars_by_symbol) == ["kiln_default_kiln_json_main_0",
                                                   "kiln_default_kiln_json_main_1"]
    assert loader.const_vars_by_symbol["kiln_default_kiln_json_main_0"] == [
        f"kiln_default_kiln_json_main_0_const_{i}" for i in range(2)]
    # the weights live in the const loader, not in the graph params
    assert root["get_graph_params"]() == {}


# --------------------------------------------------------------------- a third codegen
class ToyModule(rt.BinaryModule):
    """The toy compiler's runtime: each function is a list of numpy ops on its arguments."""

    type_key = "test.toy"

    def __init__(self, programs: dict[str, list[tuple[str, list[int], str]]]):
        super().__init__()
        self.programs = programs  # symbol → [(op, arg slots, dtype)], then output slots

    def save_to_binary(self) -> bytes:
        import json

        data = json.dumps(self.programs).encode()
        return struct.pack("<Q", len(data)) + data

    @classmethod
    def load_from_binary(cls, data: bytes) -> ToyModule:
        import json

        (n,) = struct.unpack("<Q", data[:8])
        return cls({k: [tuple(s) for s in v] for k, v in json.loads(data[8:8 + n]).items()})

    def get_function(self, name, query_imports=True):
        if name in self.programs:
            return lambda *tensors: self._run(self.programs[name], tensors)
        return super().get_function(name, query_imports)

    @staticmethod
    def _run(program, tensors):
        slots = [t.numpy() for t in tensors]
        outs = []
        for op, args, dtype in program:
            vals = [slots[a] for a in args]
            if op == "out":
                outs.append(vals[0])
                continue
            res = vals[0] if op == "cast" else {"add": np.add, "multiply": np.multiply}[op](*vals)
            slots.append(np.asarray(res).astype(dtype))
        n_out = len(outs)
        for dst, value in zip(tensors[len(tensors) - n_out:], outs, strict=True):
            dst.copyfrom(value)


def toy_codegen(funcs: list[Function]) -> ToyModule:
    programs = {}
    for f in funcs:
        slot = {p.uid: k for k, p in enumerate(f.params)}
        n_slots = len(f.params) + len(f.outputs)
        prog = []
        for n in post_order(f.outputs):
            if n.uid in slot:
                continue
            assert isinstance(n, Call), "toy takes plain ops"
            prog.append((n.op.name, [slot[a.uid] for a in n.args], n.checked_type.dtype))
            slot[n.uid] = n_slots + len(prog) - 1
        prog += [("out", [slot[o.uid]], o.checked_type.dtype) for o in f.outputs]
        programs[f.attrs["global_symbol"]] = prog
    return ToyModule(programs)


@pytest.fixture
def toy():
    byoc.register_op_support("toy", ["cast", "add", "multiply"])
    byoc.register_external_codegen("toy", toy_codegen, bind_constants=False)
    rt.register_module_loader(ToyModule.type_key, ToyModule.load_from_binary, override=True)
    yield "toy"
    byoc.unregister("toy")
    remove_global_func("runtime.module.loadbinary_" + ToyModule.type_key)


def test_a_toy_codegen_registered_from_a_test_file(toy, tmp_path):
    a, b = _var("a", 2, 3, dtype="int32"), _var("b", 2, 3)
    f32 = Call("add", [Call("cast", [a], {"dtype": "float32"}), b])
    i32 = Call("multiply", [Call("cast", [f32], {"dtype": "int32"}), a])
    # sigmoid (Kiln) reads the float32 output; the int32 output is a graph output directly
    func = Function([a, b], [Call("sigmoid", [f32]), i32])
    inputs = {"a": RNG.integers(-5, 5, (2, 3)).astype("int32"),
              "b": RNG.standard_normal((2, 3)).astype("float32")}
    lib = kiln.build(func, "c", byoc=["toy"])
    graph = lib["get_graph_json"]()
    assert '"Compiler": "toy"' in graph and '"kiln_default_toy_main_0"' in graph
    root, got = run_lib(lib, inputs, tmp_path / "toy.so")
    assert [m.type_key for m in modules_dfs(root)] == ["GraphExecutorFactory", "library",
                                                       "test.toy"]
    want = evaluate(func, inputs)
    # float32 sigmoid is onnxruntime's rational approximation: 2.5e-7 absolute (decision 060)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-6, atol=2.5e-7)
    np.testing.assert_array_equal(got[1], want[1])
    assert got[1].dtype == np.int32
