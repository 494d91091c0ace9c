"""Runtime byte formats and pure-Python runtime pieces (no C toolchain needed).

Formats: docs/formats.md sections 1, 2, 4, 5, 6.
"""

from __future__ import annotations

import ctypes
import gc
import json
import re
import struct

import numpy as np
import pytest

import kiln.runtime as rt
from kiln.errors import KilnError, ModuleLoadError, ShapeError
from kiln.graph_executor import GraphModule
from kiln.runtime import dlpack as dlpack_mod
from kiln.runtime.blob import index_modules, pack_imports, unpack_imports
from kiln.runtime.graph_executor.executor import GraphExecutor
from kiln.runtime.graph_executor.graph_json import parse_graph
from kiln.runtime.module import Module, PyFunctionModule
from kiln.runtime.registry import remove_global_func

DTYPES = ["float32", "float64", "float16", "int8", "int16", "int32", "int64", "uint8", "uint16",
          "uint32", "uint64", "bool"]


def u64(v: int) -> bytes:
    return struct.pack("<Q", v)


def dmlc_str(s: str | bytes) -> bytes:
    b = s.encode() if isinstance(s, str) else s
    return u64(len(b)) + b


# --------------------------------------------------------------------------- params (section 5)
@pytest.mark.parametrize("dtype", DTYPES)
def test_params_round_trip_dtypes(dtype):
    rng = np.random.default_rng(0)
    arrays = {
        "a": (rng.standard_normal((3, 4)) * 10).astype(dtype),
        "scalar": np.array(7, dtype=dtype),
        "empty": np.zeros((0, 5), dtype=dtype),
    }
    out = rt.load_param_dict(rt.save_param_dict(arrays))
    assert list(out) == list(arrays)
    for k, v in arrays.items():
        assert isinstance(out[k], rt.NDArray)
        assert out[k].dtype == dtype and out[k].shape == v.shape
        np.testing.assert_array_equal(out[k].numpy(), v)
        assert v.size == 0 or out[k].data_ptr % 64 == 0


def test_params_byte_layout():
    data = rt.save_param_dict({"w": np.array([1.5, -2.0], dtype="float32")})
    expect = (u64(0xF7E58D4F05049CB7) + u64(0) + u64(1) + dmlc_str("w") + u64(1)
              + u64(0xDD5E40F096B4A13F) + u64(0) + struct.pack("<iii", 1, 0, 1)
              + struct.pack("<BBH", 2, 32, 1) + struct.pack("<q", 2) + struct.pack("<q", 8)
              + np.array([1.5, -2.0], "<f4").tobytes())
    assert data == expect


def test_params_accepts_tvm_bool_uint1():
    # Classic TVM writes bool as DLDataType(kDLUInt, 1, 1) with one byte per element.
    data = bytearray(rt.save_param_dict({"m": np.array([True, False])}))
    pos = data.index(struct.pack("<BBH", 6, 8, 1))
    data[pos:pos + 4] = struct.pack("<BBH", 1, 1, 1)
    out = rt.load_param_dict(bytes(data))
    np.testing.assert_array_equal(out["m"].numpy(), [True, False])


def test_params_corrupt_and_truncated():
    good = rt.save_param_dict({"a": np.arange(10, dtype="int32"), "b": np.ones((2, 2))})
    for cut in (0, 4, 8, 17, 30, 60, 100, len(good) - 1):
        with pytest.raises(ModuleLoadError):
            rt.load_param_dict(good[:cut])
    with pytest.raises(ModuleLoadError, match="magic"):
        rt.load_param_dict(b"\0" * 8 + good[8:])
    with pytest.raises(ModuleLoadError, match="trailing"):
        rt.load_param_dict(good + b"\0")
    # A bogus name count must not allocate: it is checked against the bytes that remain.
    bogus = good[:16] + u64(1 << 60) + good[24:]
    with pytest.raises(ModuleLoadError, match="cannot fit"):
        rt.load_param_dict(bogus)
    # nbytes that disagrees with the shape
    pos = good.index(struct.pack("<q", 40))
    with pytest.raises(ModuleLoadError, match="nbytes"):
        rt.load_param_dict(good[:pos] + struct.pack("<q", 44) + good[pos + 8:])
    # unsupported dtype (bfloat16)
    pos = good.index(struct.pack("<BBH", 0, 32, 1))
    with pytest.raises(ModuleLoadError, match="DLDataType"):
        rt.load_param_dict(good[:pos] + struct.pack("<BBH", 4, 16, 1) + good[pos + 4:])


# --------------------------------------------------------------------------- blob (section 2)
class FakeDSO(Module):
    type_key = "c"
    is_dso_exportable = True

    def __init__(self, name: str):
        super().__init__()
        self.name = name


class BinMod(Module):
    """A binary-serializable test module (type_key ``test_bin``)."""

    type_key = "test_bin"
    is_binary_serializable = True

    def __init__(self, payload: bytes):
        super().__init__()
        self.payload = payload

    def save_to_binary(self) -> bytes:
        return self.payload


@pytest.fixture
def bin_loader():
    rt.register_func("runtime.module.loadbinary_test_bin", BinMod, override=True)
    yield
    remove_global_func("runtime.module.loadbinary_test_bin")


GRAPH_ONE = {
    "nodes": [{"op": "null", "name": "x", "inputs": []}],
    "arg_nodes": [0], "heads": [[0, 0, 0]], "node_row_ptr": [0, 1],
    "attrs": {"dltype": ["list_str", ["float32"]], "storage_id": ["list_int", [0]],
              "shape": ["list_shape", [[2]]], "device_index": ["list_int", [1]]},
}


def test_blob_layout_matches_reference_example():
    lib = FakeDSO("k")
    fac = rt.GraphExecutorFactoryModule(json.dumps(GRAPH_ONE), lib, {})
    blob = pack_imports(fac)
    payload = (u64(3) + dmlc_str("GraphExecutorFactory") + dmlc_str(fac.save_to_binary())
               + dmlc_str("_lib") + dmlc_str("_import_tree") + u64(3) + u64(0) + u64(1)
               + u64(1) + u64(1) + u64(1))
    assert blob == u64(len(payload)) + payload
    # GraphExecutorFactory bytes (section 6): graph | u64 n | vec<string> | arrays | name
    assert fac.save_to_binary() == (dmlc_str(json.dumps(GRAPH_ONE)) + u64(0) + u64(0)
                                    + dmlc_str("default"))


def test_blob_dfs_index_and_lib_grouping(bin_loader):
    a, b = BinMod(b"A"), BinMod(b"B")
    c, d = FakeDSO("c"), FakeDSO("d")
    a.import_module(b)
    a.import_module(c)
    b.import_module(d)
    index = index_modules(a)
    assert [g[0] for g in index.groups[:2]] == [a, b]
    assert index.groups[2] == [d, c] and index.lib_group == 2
    assert index.row_ptr == [0, 2, 3, 3] and index.child_indices == [1, 2, 2]
    lib = PyFunctionModule({"f": lambda: 1})
    root = unpack_imports(pack_imports(a)[8:], lib)
    assert isinstance(root, BinMod) and root.payload == b"A"
    b2, lib2 = root.imported_modules
    assert b2.payload == b"B" and lib2 is lib
    assert b2.imported_modules == [lib]
    assert root["f"]() == 1  # function lookup goes through the imports


def test_blob_unknown_type_key_lists_loaders(bin_loader):
    payload = pack_imports(BinMod(b"x"))[8:].replace(b"test_bin", b"test_bix")
    with pytest.raises(ModuleLoadError, match=r"test_bix.*GraphExecutorFactory.*test_bin"):
        unpack_imports(payload, None)


def test_blob_truncated_and_corrupt(bin_loader):
    root = BinMod(b"payload")
    root.import_module(FakeDSO("k"))
    payload = pack_imports(root)[8:]
    lib = PyFunctionModule()
    for cut in range(len(payload)):
        with pytest.raises(ModuleLoadError):
            unpack_imports(payload[:cut], lib)
    with pytest.raises(ModuleLoadError, match="cannot fit"):
        unpack_imports(u64(1 << 62) + payload[8:], lib)
    with pytest.raises(ModuleLoadError, match="trailing"):
        unpack_imports(payload + b"\0", lib)
    with pytest.raises(ModuleLoadError, match="no library"):
        unpack_imports(payload, None)
    # child index out of range in the import tree
    bad = payload[:-8] + u64(9)
    with pytest.raises(ModuleLoadError, match="out of range"):
        unpack_imports(bad, lib)


def test_blob_rejects_unserializable_module():
    root = PyFunctionModule()
    with pytest.raises(KilnError, match="cannot be exported"):
        index_modules(root)


def test_factory_binary_round_trip():
    params = {"p": np.arange(6, dtype="float32").reshape(2, 3), "q": np.array([1, 2], "int64")}
    fac = rt.GraphExecutorFactoryModule(json.dumps(GRAPH_ONE), FakeDSO("k"), params, "net")
    back = rt.GraphExecutorFactoryModule.load_from_binary(fac.save_to_binary())
    assert back.graph_json == fac.graph_json and back.module_name == "net"
    for k, v in params.items():
        np.testing.assert_array_equal(back.params[k].numpy(), v)
    with pytest.raises(ModuleLoadError):
        rt.GraphExecutorFactoryModule.load_from_binary(fac.save_to_binary()[:-3])


# --------------------------------------------------------------------------- graph JSON (sec. 4)
def _graph(**changes):
    g = json.loads(json.dumps(GRAPH_TWO))
    g.update(changes)
    return g


GRAPH_TWO = {
    "nodes": [
        {"op": "null", "name": "x", "inputs": []},
        {"op": "null", "name": "y", "inputs": []},
        {"op": "null", "name": "p0", "inputs": []},
        {"op": "tvm_op", "name": "add1", "inputs": [[0, 0, 0], [1, 0, 0]],
         "attrs": {"func_name": "add", "num_inputs": "2", "num_outputs": "1",
                   "flatten_data": "0"}},
        {"op": "tvm_op", "name": "mul2", "inputs": [[3, 0, 0], [2, 0, 0]],
         "attrs": {"func_name": "mul", "num_inputs": "2", "num_outputs": "1",
                   "flatten_data": "0"}},
        {"op": "tvm_op", "name": "add3", "inputs": [[4, 0, 0], [0, 0, 0]],
         "attrs": {"func_name": "add", "num_inputs": "2", "num_outputs": "1",
                   "flatten_data": "0"}},
    ],
    "arg_nodes": [0, 1, 2], "heads": [[5, 0, 0]], "node_row_ptr": [0, 1, 2, 3, 4, 5, 6],
    "attrs": {"dltype": ["list_str", ["float32"] * 6],
              "storage_id": ["list_int", [0, 1, 2, 3, 4, 3]],  # add3 reuses add1's storage
              "shape": ["list_shape", [[2, 3]] * 6], "device_index": ["list_int", [1] * 6]},
}


@pytest.mark.parametrize("mutate, match", [
    (lambda g: "{not json", "not valid JSON"),
    (lambda g: g.pop("heads") and g, "missing key 'heads'"),
    (lambda g: g["nodes"][3].update(inputs=[[4, 0, 0], [1, 0, 0]]) or g, "not an earlier node"),
    (lambda g: g["nodes"][3].update(inputs=[[0, 1, 0], [1, 0, 0]]) or g, "output 1 of node 0"),
    (lambda g: g["attrs"]["shape"][1].pop() and g, "5 items but the graph has 6"),
    (lambda g: g["attrs"]["dltype"][1].__setitem__(0, "complex64") or g, "complex64"),
    (lambda g: g["attrs"]["storage_id"][1].__setitem__(0, -1) or g, "storage_id"),
    (lambda g: g["nodes"][3].update(op="relu") or g, "unknown op 'relu'"),
    (lambda g: g["nodes"][3]["attrs"].pop("func_name") and g, "func_name"),
    (lambda g: g["nodes"][3]["attrs"].update(num_inputs="3") or g, "num_inputs is 3"),
    (lambda g: g.update(node_row_ptr=[0, 1]) or g, "node_row_ptr"),
    (lambda g: g.update(arg_nodes=[0, 3]) or g, "not a null node"),
    (lambda g: g.update(heads=[[9, 0, 0]]) or g, "heads"),
    (lambda g: g["attrs"]["shape"][1].__setitem__(0, [2, -3]) or g, "negative shape"),
])
def test_graph_json_validation(mutate, match):
    g = mutate(_graph())
    text = g if isinstance(g, str) else json.dumps(g)
    with pytest.raises(ModuleLoadError, match=match):
        parse_graph(text)


def _numpy_kernels() -> PyFunctionModule:
    # Python packed functions with the kernel convention: inputs then outputs, all NDArrays.
    def binary(op):
        def f(a, b, out):
            out._arr[...] = op(a._arr, b._arr)
        return f
    return PyFunctionModule({"add": binary(np.add), "mul": binary(np.multiply)})


def test_graph_executor_python_kernels_and_storage_reuse():
    p0 = np.full((2, 3), 3.0, "float32")
    fac = rt.GraphExecutorFactoryModule(json.dumps(GRAPH_TWO), _numpy_kernels(), {"p0": p0})
    ex = fac["default"](rt.cpu())
    assert isinstance(ex, GraphExecutor)
    # storage 3 is shared by add1 and add3: one pool, two views
    assert ex._storage.pool_view[3].data_ptr == ex._storage.pool_view[5].data_ptr
    gm = GraphModule(ex)
    assert gm.get_num_inputs() == 2 and gm.get_num_outputs() == 1
    assert gm.get_input_index("y") == 1 and gm.get_input_index("nope") == -1
    x = np.arange(6, dtype="float32").reshape(2, 3)
    y = np.ones((2, 3), "float32")
    gm.set_input("x", x)
    gm.set_input(1, y)
    gm.run()
    out = gm.get_output(0)
    np.testing.assert_allclose(out.numpy(), (x + y) * p0 + x)
    gm.run(x=y, y=y)
    np.testing.assert_allclose(out.numpy(), (x + y) * p0 + x)  # get_output returned a copy
    np.testing.assert_allclose(gm.get_output(0).numpy(), (y + y) * p0 + y)
    np.testing.assert_array_equal(gm.get_input("p0").numpy(), p0)
    gm.load_params(rt.save_param_dict({"p0": np.zeros((2, 3), "float32"), "unused": x}))
    gm.run()
    np.testing.assert_allclose(gm.get_output(0).numpy(), y)


def test_graph_executor_set_input_errors():
    gm = GraphModule(rt.GraphExecutorFactoryModule(
        json.dumps(GRAPH_TWO), _numpy_kernels(), {"p0": np.ones((2, 3), "float32")})
        ["default"](rt.cpu()))
    with pytest.raises(KilnError, match=r"no input named 'z'.*\['x', 'y'\]"):
        gm.set_input("z", np.ones((2, 3), "float32"))
    with pytest.raises(ShapeError, match=r"input 'x': expected shape \(2, 3\) dtype float32, "
                                         r"got shape \(3, 2\) dtype float32"):
        gm.set_input("x", np.ones((3, 2), "float32"))
    with pytest.raises(ShapeError, match=r"got shape .* dtype float64"):
        gm.set_input("y", np.ones((2, 3)))
    with pytest.raises(KilnError, match="out of range"):
        gm.set_input(7, np.ones((2, 3), "float32"))
    with pytest.raises(KilnError, match="output index 3"):
        gm.get_output(3)


@pytest.mark.parametrize("shape, value, given", [
    ((2, 3), np.ones((2, 3)), "float64"),
    ((2, 3), rt.array(np.ones((2, 3), "int64")), "int64"),
    ((), np.float64(1.5), "float64"),  # a numpy scalar has a dtype: not converted either
    ((), np.array(1, "int32"), "int32"),
])
def test_graph_executor_refuses_other_dtypes(shape, value, given):
    graph = json.loads(json.dumps(GRAPH_TWO))
    graph["attrs"]["shape"][1] = [list(shape)] * 6
    gm = GraphModule(rt.GraphExecutorFactoryModule(
        json.dumps(graph), _numpy_kernels(), {"p0": np.ones(shape, "float32")})
        ["default"](rt.cpu()))
    with pytest.raises(ShapeError, match=rf"input 'x': expected shape {re.escape(str(shape))} "
                       rf"dtype float32, got shape .* dtype {given} \(arrays are not converted: "
                       r"cast with .astype\('float32'\)\)"):
        gm.set_input("x", value)
    # Python scalars and lists carry no dtype: they take the input's (as onnxruntime's lists)
    gm.set_input("x", np.full(shape, 1.5).tolist())
    gm.set_input(y=np.full(shape, 2, "float32"))
    gm.run()
    np.testing.assert_allclose(gm.get_output(0).numpy(), np.full(shape, 5, "float32"))


def test_graph_executor_missing_kernel():
    with pytest.raises(KilnError, match="function 'mul' not found"):
        GraphExecutor(json.dumps(GRAPH_TWO), PyFunctionModule({"add": lambda *a: None}))


def test_kiln_graph_executor_create():
    gm = __import__("kiln.graph_executor", fromlist=["create"]).create(
        json.dumps(GRAPH_TWO), _numpy_kernels(), rt.cpu())
    assert gm.get_num_inputs() == 3  # no params bound: every null node is an input


# --------------------------------------------------------------------------- NDArray / DLPack
def test_ndarray_basics():
    a = rt.array(np.arange(12, dtype="int16").reshape(3, 4))
    assert a.shape == (3, 4) and a.dtype == "int16" and a.data_ptr % 64 == 0
    h = a.handle.contents
    assert h.ndim == 2 and [h.shape[0], h.shape[1]] == [3, 4] and h.dtype.bits == 16
    n = a.numpy()
    n[0, 0] = 99
    assert a.numpy()[0, 0] == 0  # numpy() copies
    a.copyfrom(np.zeros((3, 4), "int16"))
    assert not a.numpy().any()
    with pytest.raises(ShapeError):
        a.copyfrom(np.zeros((4, 3), "int16"))
    with pytest.raises(KilnError, match="not supported"):
        rt.empty((2,), "complex64")
    with pytest.raises(KilnError, match="cpu only"):
        rt.empty((2,), "float32", rt.Device(2, 0))
    assert rt.empty((0, 3)).shape == (0, 3)


def test_array_protocol_copies_only_when_asked():
    """NumPy 2's ``__array__(dtype, copy)``: ``np.asarray`` (copy None) and ``copy=False`` view
    the NDArray's memory, ``np.array`` (copy True) copies, a dtype converts (a Kiln decoder's
    100 MB of prompt logits were copied by ``np.asarray``)."""
    a = rt.array(np.arange(6, dtype="float32"))
    assert np.asarray(a).ctypes.data == a.data_ptr
    assert np.asarray(a, copy=False).ctypes.data == a.data_ptr
    copied = np.array(a)
    assert copied.ctypes.data != a.data_ptr
    np.testing.assert_array_equal(copied, a.numpy())
    assert np.asarray(a, dtype="float64").dtype == np.float64


@pytest.mark.parametrize("dtype", DTYPES)
def test_dlpack_to_numpy_zero_copy(dtype):
    a = rt.array(np.arange(6).reshape(2, 3).astype(dtype))
    n = np.from_dlpack(a)
    assert n.dtype == np.dtype(dtype) and n.shape == (2, 3)
    assert n.ctypes.data == a.data_ptr
    np.testing.assert_array_equal(n, a.numpy())


def test_dlpack_keeps_owner_alive_and_frees():
    a = rt.array(np.arange(4, dtype="float32"))
    earlier = set(dlpack_mod._LIVE)  # (other tests' capsules may be freed meanwhile)
    n = np.from_dlpack(a)
    (mine,) = set(dlpack_mod._LIVE) - earlier
    n[0] = 42.0
    assert a.numpy()[0] == 42.0
    del a
    gc.collect()
    np.testing.assert_array_equal(n, [42, 1, 2, 3])  # owner kept alive by the capsule
    assert mine in dlpack_mod._LIVE
    del n
    gc.collect()
    assert mine not in dlpack_mod._LIVE
    b = rt.array(np.ones(3))
    earlier = set(dlpack_mod._LIVE)
    cap = b.__dlpack__()  # never consumed: the capsule destructor frees it
    (mine,) = set(dlpack_mod._LIVE) - earlier
    del cap
    gc.collect()
    assert mine not in dlpack_mod._LIVE
    assert b.__dlpack_device__() == (1, 0)


def test_dlpack_capsules_survive_another_library_retyping_pythonapi(monkeypatch):
    """ctypes.pythonapi is shared by every library in the process: one that sets
    PyCapsule_GetPointer's argtypes its own way (py_object, as some do) must not break the
    destructor of Kiln's capsules."""
    fn = ctypes.pythonapi.PyCapsule_GetPointer
    monkeypatch.setattr(fn, "argtypes", [ctypes.py_object, ctypes.c_char_p])
    monkeypatch.setattr(fn, "restype", ctypes.c_void_p)
    b = rt.array(np.ones(3))
    earlier = set(dlpack_mod._LIVE)
    cap = b.__dlpack__()
    (mine,) = set(dlpack_mod._LIVE) - earlier
    del cap
    gc.collect()
    assert mine not in dlpack_mod._LIVE


def test_from_dlpack_zero_copy_and_copy():
    buf = np.empty(64 + 16, dtype=np.uint8)
    off = (-buf.ctypes.data) % 64
    aligned = buf[off:off + 64].view("float32")
    nd = rt.from_dlpack(aligned)
    assert nd.data_ptr == aligned.ctypes.data  # zero copy
    aligned[0] = 5.0
    assert nd.numpy()[0] == 5.0
    unaligned = buf[off + 4:off + 4 + 32].view("float32")
    nd2 = rt.from_dlpack(unaligned)
    assert nd2.data_ptr % 64 == 0 and nd2.data_ptr != unaligned.ctypes.data
    np.testing.assert_array_equal(nd2.numpy(), unaligned)
    strided = np.arange(20, dtype="int32")[::2]
    np.testing.assert_array_equal(rt.from_dlpack(strided).numpy(), strided)
    src = rt.array(np.arange(3, dtype="uint8"))
    assert rt.from_dlpack(src.__dlpack__()).data_ptr == src.data_ptr  # raw capsule
    with pytest.raises(KilnError, match="__dlpack__"):
        rt.from_dlpack([1, 2, 3])


# --------------------------------------------------------------------------- registry / modules
def test_registry_and_module_lookup():
    @rt.register_func("test.rt.double")
    def double(x):
        return 2 * x

    try:
        assert rt.get_global_func("test.rt.double")(4) == 8
        assert "test.rt.double" in rt.list_global_func_names()
        with pytest.raises(KilnError, match="already registered"):
            rt.register_func("test.rt.double", lambda x: x)
        rt.register_func("test.rt.double", lambda x: 3 * x, override=True)
        assert rt.get_global_func("test.rt.double")(4) == 12
    finally:
        remove_global_func("test.rt.double")
    assert rt.get_global_func("test.rt.double", allow_missing=True) is None
    with pytest.raises(KilnError, match="not registered"):
        rt.get_global_func("test.rt.double")
    root = PyFunctionModule({"a": lambda: "a"})
    child = PyFunctionModule({"b": lambda: "b"})
    root.import_module(child)
    assert root["b"]() == "b"
    assert root.get_function("b", query_imports=False) is None
    with pytest.raises(KilnError, match="no function 'zzz'"):
        root["zzz"]
    with pytest.raises(KilnError, match="cycle"):
        child.import_module(root)
