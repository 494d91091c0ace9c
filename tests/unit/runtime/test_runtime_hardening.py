"""Regression tests for the loader bugs the fuzzer found (``tests/helpers/fuzz_runtime.py``), one
per
class, and for the private cache folders. Each used to escape as a non-Kiln exception (or, for
the import tree, to load wrongly); each must now be a ``KilnError`` naming what is wrong.
"""

from __future__ import annotations

import json
import os
import struct
import sys
import tracemalloc

import numpy as np
import pytest
from fuzz_mutators import graph_docs, graph_params, numpy_kernels

import kiln.runtime as rt
from kiln.errors import KilnError, ModuleLoadError, ShapeError
from kiln.runtime.blob import unpack_imports
from kiln.runtime.c_types import dtype_name
from kiln.runtime.elf import check_loadable, host_elf
from kiln.runtime.graph_executor import graph_json
from kiln.runtime.graph_executor import storage as graph_storage
from kiln.runtime.graph_executor.executor import GraphExecutor
from kiln.runtime.graph_executor.graph_json import parse_graph
from kiln.runtime.module import PyFunctionModule
from kiln.runtime.stream import StreamWriter
from kiln.runtime.toolchain import private_dir as pd


def _graph(mutate) -> str:
    doc = graph_docs()[0]
    mutate(doc)
    return json.dumps(doc)


def _executor(text: str) -> GraphExecutor:
    return GraphExecutor(text, numpy_kernels(), rt.cpu(), graph_params(graph_docs()[0]))


def _peak_bytes(func) -> int:
    """Peak memory traced while ``func`` runs (numpy allocations included)."""
    tracemalloc.start()
    try:
        func()
    except KilnError:
        pass
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return peak


# ------------------------------------------------------------------------ graph JSON text
def test_graph_json_nested_deeper_than_recursion_limit():
    # was RecursionError out of json.loads
    text = json.dumps(graph_docs()[0]).replace('"heads": [', '"heads": ' + "[" * 100000, 1)
    with pytest.raises(ModuleLoadError, match="not valid JSON: maximum recursion depth"):
        parse_graph(text)


def test_graph_json_integer_with_too_many_digits():
    # was ValueError (Python's 4300-digit limit on int parsing)
    text = json.dumps(graph_docs()[0]).replace('"arg_nodes": [0', '"arg_nodes": [' + "9" * 5000)
    with pytest.raises(ModuleLoadError, match="not valid JSON: Exceeds the limit"):
        parse_graph(text)


# ------------------------------------------------------------------------ graph shapes
@pytest.mark.parametrize("shape, match", [
    ([2**63], "larger than any array"),            # was OverflowError in entry_nbytes
    ([10**30], "larger than any array"),
    ([0, 2**62, 4], "larger than any array"),      # size 0, yet numpy refuses: was ValueError
    ([2**61, 2], "larger than any array"),         # int64 overflow in np.prod: was ValueError
    ([1] * 65, "65 dimensions; at most 64"),       # was ValueError from numpy
])
def test_graph_shape_beyond_numpy_limits(shape, match):
    text = _graph(lambda d: d["attrs"]["shape"][1].__setitem__(4, shape))
    with pytest.raises(ModuleLoadError, match=rf"graph JSON: entry 4: .*{match}"):
        parse_graph(text)


def test_graph_storage_checked_before_allocation():
    # A 2**40-element entry parses (it is a valid shape) but must not be allocated: was a
    # MemoryError (or a lazily committed terabyte).
    text = _graph(lambda d: d["attrs"]["shape"][1].__setitem__(4, [2**40]))
    parse_graph(text)
    with pytest.raises(ModuleLoadError, match=r"storage needs 4398046511\d+ bytes but this "
                                              r"machine has \d+ bytes.*entry 4, shape"):
        _executor(text)
    assert _peak_bytes(lambda: _executor(text)) < 1 << 20


def test_graph_storage_limit_and_out_of_memory(monkeypatch):
    g = parse_graph(_graph(lambda d: None))
    assert graph_json.storage_pool_bytes(g) == {0: 24, 1: 24, 2: 24, 3: 24, 4: 24}
    with pytest.raises(ModuleLoadError, match="storage needs 120 bytes .* has 100 bytes"):
        graph_json.storage_pool_bytes(g, limit=100)
    monkeypatch.setattr(graph_json, "memory_bytes", lambda: 119)
    with pytest.raises(ModuleLoadError, match="120 bytes"):
        _executor(_graph(lambda d: None))
    monkeypatch.undo()

    def no_memory(*args, **kwargs):
        raise MemoryError

    monkeypatch.setattr(graph_storage, "empty", no_memory)
    with pytest.raises(KilnError, match="cannot allocate 120 bytes of storage"):
        _executor(_graph(lambda d: None))


# ------------------------------------------------------------------------ dltype strings
@pytest.mark.parametrize("dltype", ["\udcff", ">f4", "f4", "float", "a", "float32,int8", 7])
def test_graph_dltype_only_runtime_names(dltype):
    # "\udcff" was a UnicodeEncodeError out of np.dtype; numpy spellings were accepted.
    text = json.dumps(graph_docs()[0]).replace('"float32"', json.dumps(dltype), 1)
    with pytest.raises(ModuleLoadError, match="entry 0: unsupported dltype"):
        parse_graph(text.encode("utf-8", "surrogatepass"))


def test_graph_dltype_tvm_uint1_is_bool():
    assert parse_graph(json.dumps(graph_docs()[2])).dltype == ["int8", "bool", "int8"]


def test_dtype_name_unencodable_string():
    with pytest.raises(KilnError, match="not supported"):
        dtype_name("\udcff")


# ------------------------------------------------------------------------ params / NDArray
def test_params_zero_size_shape_beyond_numpy_limits():
    # was ValueError from numpy's reshape: nbytes 0 agreed with the shape
    w = StreamWriter()
    w.u64(0xF7E58D4F05049CB7)
    w.u64(0)
    w.vec_str(["z"])
    w.u64(1)
    w.u64(0xDD5E40F096B4A13F)
    w.u64(0)
    w.raw(struct.pack("<iiiBBH", 1, 0, 3, 2, 32, 1))
    w.raw(struct.pack("<qqq", 0, 2**62, 4))
    w.i64(0)
    with pytest.raises(ModuleLoadError, match=r"param 'z'.*larger than any array"):
        rt.load_param_dict(w.getvalue())


def test_empty_rejects_shapes_numpy_cannot_hold():
    with pytest.raises(ShapeError, match="larger than any array"):
        rt.empty((2**63,), "uint8")
    with pytest.raises(ShapeError, match="larger than any array"):
        rt.empty((0, 2**62, 4), "float32")
    assert rt.empty((0, 2**20), "float32").shape == (0, 2**20)


@pytest.mark.parametrize("make", ["params", "factory", "blob"])
def test_huge_declared_lengths_fail_before_allocating(make):
    """Every u64 in the encoding set to 2**62: each must be checked against the bytes that
    remain before anything is allocated."""
    from fuzz_mutators import blob_corpus, factory_corpus, params_corpus

    data = {"params": params_corpus, "factory": factory_corpus, "blob": blob_corpus}[make]()[0]
    load = {"params": rt.load_param_dict,
            "factory": rt.GraphExecutorFactoryModule.load_from_binary,
            "blob": lambda b: unpack_imports(b, PyFunctionModule())}[make]
    for off in range(len(data) - 7):
        bad = data[:off] + struct.pack("<Q", 2**62) + data[off + 8:]
        assert _peak_bytes(lambda b=bad: load(b)) < len(data) + (1 << 20), off


# ------------------------------------------------------------------------ imports blob
def test_import_tree_u64_above_int64_is_out_of_range():
    # child index 2**64-1 was read as -1 and silently linked modules[-1]
    lib = PyFunctionModule()
    root = rt.GraphExecutorFactoryModule(json.dumps(graph_docs()[0]), None)
    w = StreamWriter()
    w.u64(3)
    w.string("GraphExecutorFactory")
    w.string(root.save_to_binary())
    w.string("_lib")
    w.string("_import_tree")
    w.vec_u64([0, 1, 1])
    w.vec_u64([2**64 - 1])
    with pytest.raises(ModuleLoadError, match="child index out of range"):
        unpack_imports(w.getvalue(), lib)


# ------------------------------------------------------------------------ ELF headers
def test_elf_program_header_entries_too_small(tmp_path):
    # e_phentsize 40 < sizeof(Elf64_Phdr): was struct.error while reading the table
    machine = host_elf().machine if host_elf() else 62
    head = bytearray(64)
    head[:7] = b"\x7fELF\x02\x01\x01"
    struct.pack_into("<HHI", head, 16, 3, machine, 1)
    struct.pack_into("<QQ", head, 32, 64, 0)
    struct.pack_into("<HHHHHH", head, 52, 64, 40, 1, 64, 0, 0)
    p = tmp_path / "small_phdr.so"
    p.write_bytes(bytes(head) + bytes(40))
    with pytest.raises(ModuleLoadError, match="program header entries of 40 bytes"):
        check_loadable(str(p))


# ------------------------------------------------------------------------ private folders
def test_private_dir_created_0700(tmp_path):
    p = pd.private_dir(tmp_path / "a" / "cache")
    assert p == tmp_path / "a" / "cache" and (p.stat().st_mode & 0o777) == 0o700


@pytest.mark.parametrize("kind", ["world_writable", "symlink", "other_owner", "file"])
def test_private_dir_refuses_unsafe_folder(tmp_path, kind, caplog):
    target = tmp_path / "cache"
    if kind == "world_writable":
        target.mkdir()
        target.chmod(0o777)
    elif kind == "symlink":
        (tmp_path / "elsewhere").mkdir(mode=0o700)
        target.symlink_to(tmp_path / "elsewhere")
    elif kind == "other_owner":
        if os.getuid() != 0:
            pytest.skip("needs root to create a folder owned by another user")
        target.mkdir(mode=0o700)
        os.chown(target, 65534, 65534)
    else:
        target.write_text("not a folder")
    got = pd.private_dir(target, "test")
    assert got != target and pd.is_private_dir(got)
    assert (got.stat().st_mode & 0o777) == 0o700 and got.name.startswith("kiln-test-")
    assert "private temp folder" in caplog.text


def test_jit_cache_dir_is_private(tmp_path, monkeypatch):
    from kiln.runtime.source_module import cache_dir

    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    monkeypatch.setenv("KILN_CACHE_DIR", str(shared))
    assert cache_dir() != shared
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "mine"))
    assert cache_dir() == tmp_path / "mine"


def test_models_cache_dir_is_private(tmp_path, monkeypatch):
    from kiln import models

    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    monkeypatch.setenv("KILN_CACHE_DIR", str(shared))
    assert models.cache_dir() != shared
    assert sys.modules["kiln.runtime.toolchain.private_dir"] is pd


def test_factory_params_round_trip_still_exact():
    # the stricter readers still load everything the writer produces
    params = {"w": np.arange(6, dtype="float32").reshape(2, 3), "e": np.zeros((0, 4), "int8"),
              "s": np.array(3, "int64")}
    back = rt.load_param_dict(rt.save_param_dict(params))
    for k, v in params.items():
        np.testing.assert_array_equal(back[k].numpy(), v)


# ------------------------------------------------------------------------ import tree links
def _factory_blob(n: int, row_ptr: list[int], children: list[int], libs: int = 0) -> bytes:
    g = {"nodes": [{"op": "null", "name": "x", "inputs": []}], "arg_nodes": [0],
         "heads": [[0, 0, 0]], "attrs": {"dltype": ["list_str", ["float32"]],
                                         "storage_id": ["list_int", [0]],
                                         "shape": ["list_shape", [[1]]]}}
    fac = rt.GraphExecutorFactoryModule(json.dumps(g), None).save_to_binary()
    w = StreamWriter()
    w.u64(n + libs + 1)
    for _ in range(n):
        w.string("GraphExecutorFactory")
        w.string(fac)
    for _ in range(libs):
        w.string("_lib")
    w.string("_import_tree")
    w.vec_u64(row_ptr)
    w.vec_u64(children)
    return w.getvalue()


@pytest.mark.parametrize("n, row_ptr, children, libs", [
    (1, [0, 1], [0], 0),                 # self-import
    (3, [0, 1, 2, 3], [1, 2, 0], 0),     # 0 → 1 → 2 → 0
    (1, [0, 1, 2, 2], [1, 2], 2),        # _lib twice: lib → factory → lib (same object)
])
def test_import_tree_cycles(n, row_ptr, children, libs):
    with pytest.raises(ModuleLoadError, match="corrupt import tree: a cycle"):
        unpack_imports(_factory_blob(n, row_ptr, children, libs), PyFunctionModule())


def test_import_tree_long_chain_links_in_linear_time(monkeypatch):
    # 0 → n-1 → n-2 → ... → 1, linked in index order: import_module's per-edge subtree walk
    # made this quadratic (4000 modules: 3.8 s; 8000: ~15 s); one check of the whole tree is
    # linear. No module's subtree is walked while linking (a count, not a time: the suite runs
    # on loaded machines).
    from kiln.runtime.module import Module

    walks = []
    walk = Module._walk
    monkeypatch.setattr(Module, "_walk", lambda self: walks.append(self) or walk(self))
    n = 8000
    data = _factory_blob(n, [0, 1, *range(1, n)], [n - 1, *range(1, n - 1)])
    root = unpack_imports(data, None)
    assert walks == []
    depth = 0
    while root.imported_modules:
        (root,) = root.imported_modules
        depth += 1
    assert depth == n - 1
