"""Asking a library for the other executor's entry point says which executor the library is
for and how to run it (issue 30 item 4): a VM library asked for the graph factory's
``default``, a graph library asked for the VM's ``vm_load_executable``. The modules come back
from their blob bytes, as ``load_module`` rebuilds them. The native runtime's twin:
tests/backend/native/test_native_executor_hint.py."""

from __future__ import annotations

import json

import numpy as np
import pytest
import vm_programs as P
from fuzz_mutators import graph_docs, graph_params, numpy_kernels

import kiln.runtime as rt
from kiln.errors import KilnError
from kiln.graph_executor import GraphModule
from kiln.runtime.blob import pack_imports, unpack_imports
from kiln.vm import VirtualMachine


def _loaded(root: rt.Module, lib: rt.Module) -> rt.Module:
    """``root`` (over a C source stand-in for its kernel library) packed into a blob and
    unpacked over the Python kernels ``lib``, as ``load_module`` does over the real library."""
    return unpack_imports(pack_imports(root)[8:], lib)


def _c_lib(names: list[str]) -> rt.Module:
    return rt.CSourceModule("", names)


@pytest.fixture
def vm_lib() -> rt.Module:
    return _loaded(P.add_mul(_c_lib(["add", "mul"])), P.py_kernels())


@pytest.fixture
def graph_lib() -> rt.Module:
    doc = graph_docs()[0]
    lib = _c_lib(["fused_add", "fused_mul"])
    fac = rt.GraphExecutorFactoryModule(json.dumps(doc), lib, graph_params(doc))
    return _loaded(fac, numpy_kernels())


def test_vm_library_asked_for_default(vm_lib):
    assert vm_lib.type_key == "relax.VMExecutable"
    with pytest.raises(KilnError) as err:
        vm_lib["default"]
    msg = str(err.value)
    assert "module 'relax.VMExecutable' (and its imports) has no function 'default'" in msg
    assert "this is a VM library" in msg and "kiln.vm.VirtualMachine" in msg
    assert "vm_load_executable" in msg and "examples/deploy_vm_c" in msg
    # the wrapper meets the same message (a VM library handed to the graph executor's wrapper)
    with pytest.raises(KilnError, match="this is a VM library"):
        GraphModule(vm_lib)
    # and the library runs as the message says
    x = np.ones((2, 4), "float32")
    out = VirtualMachine(vm_lib, rt.cpu())["main"](x, x).numpy()
    np.testing.assert_array_equal(out, (x + x) * x)


def test_graph_library_asked_for_vm_load_executable(graph_lib):
    assert graph_lib.type_key == "GraphExecutorFactory"
    with pytest.raises(KilnError) as err:
        graph_lib["vm_load_executable"]
    msg = str(err.value)
    assert "has no function 'vm_load_executable'" in msg
    assert "this is a graph executor library" in msg
    assert "kiln.graph_executor.GraphModule(lib['default'](kiln.cpu()))" in msg
    assert "examples/deploy_c" in msg
    # the message's way runs it
    GraphModule(graph_lib["default"](rt.cpu()))


def test_lookups_that_may_miss_stay_quiet(vm_lib, graph_lib):
    """``get_function`` and ``in`` answer None / False, as in TVM: only ``[]`` raises."""
    assert vm_lib.get_function("default") is None and "default" not in vm_lib
    assert graph_lib.get_function("vm_load_executable") is None
    # a module with no executor of its own says nothing about executors
    with pytest.raises(KilnError) as err:
        numpy_kernels()["default"]
    assert "library" not in str(err.value)
