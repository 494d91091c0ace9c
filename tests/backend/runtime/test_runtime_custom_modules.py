"""User module types and the const loader, exported through the real C compiler and loaded
back: binary modules at several depths of the import tree, a missing loader, a renamed type key
kept loading by an alias, and an external module that gets its constants from the const loader
(docs/formats.md §7) exactly once.
"""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
from test_runtime_roundtrip import FUNCS, KERNELS, P0, inputs, make_graph, tvm_op

import kiln.runtime as rt
from kiln.errors import ModuleLoadError
from kiln.graph_executor import GraphModule
from kiln.runtime.module import modules_dfs
from kiln.runtime.registry import remove_global_func


class Scale(rt.BinaryModule):
    """``scale(x) -> k * x``; imports whatever it is given."""

    type_key = "test.scale"

    def __init__(self, k: float):
        super().__init__()
        self.k = k

    def save_to_binary(self) -> bytes:
        return struct.pack("<d", self.k)

    @classmethod
    def load_from_binary(cls, data: bytes) -> Scale:
        (k,) = struct.unpack("<d", data)
        return cls(k)

    def get_function(self, name, query_imports=True):
        if name == "scale":
            return lambda x: self.k * x
        return super().get_function(name, query_imports)


class OffsetAdd(rt.BinaryModule):
    """``offset_add(a, b, out)``: out = a + b + offset, a graph kernel written in Python."""

    type_key = "test.offset_add"

    def __init__(self, offset: float):
        super().__init__()
        self.offset = offset

    def save_to_binary(self) -> bytes:
        return struct.pack("<f", self.offset)

    @classmethod
    def load_from_binary(cls, data: bytes) -> OffsetAdd:
        return cls(struct.unpack("<f", data)[0])

    def get_function(self, name, query_imports=True):
        if name == "offset_add":
            return lambda a, b, out: out.copyfrom(a.numpy() + b.numpy() + self.offset)
        return super().get_function(name, query_imports)


@pytest.fixture
def loaders():
    """``register(type_key, loader, aliases=())``; every key is removed after the test."""
    keys: list[str] = []

    def register(key, loader, aliases=()):
        keys.extend([key, *aliases])
        rt.register_module_loader(key, loader, aliases=aliases, override=True)

    yield register
    for k in keys:
        remove_global_func("runtime.module.loadbinary_" + k)


def deep_factory() -> rt.GraphExecutorFactoryModule:
    """GraphExecutorFactory → C source (_lib) → Scale → OffsetAdd; the last op is OffsetAdd's."""
    lib = rt.CSourceModule(KERNELS, FUNCS)
    scale, offset = Scale(2.5), OffsetAdd(0.5)
    lib.import_module(scale)
    scale.import_module(offset)
    return rt.GraphExecutorFactoryModule(make_graph(last_func="offset_add"), lib, {"p0": P0})


@pytest.mark.parametrize("suffix", [".so", ".tar"])
def test_binary_modules_at_several_depths(loaders, tmp_path, suffix):
    loaders(Scale.type_key, Scale.load_from_binary)
    loaders(OffsetAdd.type_key, OffsetAdd.load_from_binary)
    path = tmp_path / f"deep{suffix}"
    deep_factory().export_library(str(path))
    root = rt.load_module(path)
    assert root.type_key == "GraphExecutorFactory"
    (lib,) = root.imported_modules
    assert isinstance(lib, rt.LibraryModule)
    (scale,) = lib.imported_modules
    assert type(scale) is Scale and scale.k == 2.5
    (offset,) = scale.imported_modules
    assert type(offset) is OffsetAdd and offset.offset == 0.5 and offset.imported_modules == []
    assert root["scale"](4.0) == 10.0  # found three levels down
    gm = GraphModule(root["default"](rt.cpu()))
    x, y = inputs()
    gm.run(x=x, y=y)
    np.testing.assert_allclose(gm.get_output(0).numpy(), (x + y) * P0 + x + 0.5, rtol=1e-6)


def test_missing_loader_lists_registered_ones(loaders, tmp_path):
    loaders(Scale.type_key, Scale.load_from_binary)
    loaders(OffsetAdd.type_key, OffsetAdd.load_from_binary)
    path = tmp_path / "deep.so"
    deep_factory().export_library(str(path))
    remove_global_func("runtime.module.loadbinary_" + OffsetAdd.type_key)
    with pytest.raises(ModuleLoadError, match=r"no loader for module type_key 'test.offset_add' "
                                              r"\(registered loaders: GraphExecutorFactory, "
                                              r"const_loader, kiln_jit, kiln_json, metadata, "
                                              r".*test.scale"):
        rt.load_module(path)


def test_renamed_type_key_keeps_loading(loaders, tmp_path):
    class Before(Scale):
        type_key = "test.scale_v1"

    class After(Scale):
        type_key = "test.scale_v2"

    lib = rt.CSourceModule(KERNELS, FUNCS)
    lib.import_module(Before(3.0))
    path = tmp_path / "old.so"
    rt.GraphExecutorFactoryModule(make_graph(), lib, {"p0": P0}).export_library(str(path))
    # After the rename only the new type exists, registered with its old key as an alias.
    loaders(After.type_key, After.load_from_binary, aliases=[Before.type_key])
    root = rt.load_module(path)
    (mod,) = root.imported_modules[0].imported_modules
    assert type(mod) is After and mod.type_key == "test.scale_v2" and root["scale"](2.0) == 6.0


# ---------------------------------------------------------------------------- const loader
class ExtBias(rt.BinaryModule):
    """An external module that needs constants: ``ext_bias(a, out)``: out = a + bias, where the
    bias arrives through ``__init_ext_bias``; counts its init calls."""

    type_key = "test.ext_bias"
    symbol = "ext_bias"

    def __init__(self, const_vars=("ext_w",)):
        super().__init__()
        self.const_vars = list(const_vars)
        self.bias = None
        self.init_calls = 0

    def save_to_binary(self) -> bytes:
        return json.dumps(self.const_vars).encode()

    @classmethod
    def load_from_binary(cls, data: bytes) -> ExtBias:
        return cls(json.loads(data))

    def _init(self, *arrays):
        self.init_calls += 1
        self.bias = sum(a.numpy() for a in arrays)

    def _run(self, a, out):
        if self.bias is None:
            raise RuntimeError("ext_bias called before __init_ext_bias")
        out.copyfrom(a.numpy() + self.bias)

    def get_function(self, name, query_imports=True):
        table = {"get_symbol": lambda: self.symbol, "get_const_vars": lambda: self.const_vars,
                 f"__init_{self.symbol}": self._init, self.symbol: self._run}
        if name in table:
            return table[name]
        return super().get_function(name, query_imports)


def bias_graph() -> str:
    """x, y, p0 → add1 = x + y → mul2 = add1 * p0 → out = ext_bias(mul2)."""
    g = json.loads(make_graph())
    g["nodes"][5] = tvm_op("out", ExtBias.symbol, [4])
    return json.dumps(g)


W = np.array([[100, 200, 300], [400, 500, 600]], dtype="float32")


def test_const_loader_feeds_an_external_module_once(loaders, tmp_path):
    loaders(ExtBias.type_key, ExtBias.load_from_binary)
    lib = rt.CSourceModule(KERNELS, FUNCS)
    ext = ExtBias()
    wrapped = rt.create_metadata_module({"ext_w": W, "other": np.ones(3)}, lib, [ext])
    assert isinstance(wrapped, rt.ConstLoaderModule)
    assert wrapped.imported_modules == [lib, ext] and list(wrapped.const_var_ndarray) == ["ext_w"]
    path = tmp_path / "byoc.so"
    rt.GraphExecutorFactoryModule(bias_graph(), wrapped, {"p0": P0}).export_library(str(path))
    assert ext.init_calls == 0  # exporting does not initialize

    root = rt.load_module(path)
    (loader,) = root.imported_modules
    assert loader.type_key == "const_loader"
    lib2, ext2 = loader.imported_modules
    assert isinstance(lib2, rt.LibraryModule) and type(ext2) is ExtBias
    assert ext2.init_calls == 0  # not before first use
    x, y = inputs()
    for _ in range(2):  # two executors, two runs each: one init
        gm = GraphModule(root["default"](rt.cpu()))
        for _ in range(2):
            gm.run(x=x, y=y)
            np.testing.assert_allclose(gm.get_output(0).numpy(), (x + y) * P0 + W, rtol=1e-6)
    assert ext2.init_calls == 1
    np.testing.assert_array_equal(ext2.bias, W)


def test_no_const_loader_when_nothing_needs_constants(loaders, tmp_path):
    loaders(ExtBias.type_key, ExtBias.load_from_binary)
    lib = rt.CSourceModule(KERNELS, FUNCS)
    assert rt.create_metadata_module({"ext_w": W}, lib) is lib and lib.imported_modules == []
    ext = ExtBias(const_vars=())  # declares get_const_vars, but needs none
    assert rt.create_metadata_module({"ext_w": W}, lib, [ext]) is lib
    path = tmp_path / "plain.so"
    rt.GraphExecutorFactoryModule(make_graph(), lib, {"p0": P0}).export_library(str(path))
    keys = [m.type_key for m in modules_dfs(rt.load_module(path))]
    assert keys == ["GraphExecutorFactory", "library", "test.ext_bias"]
