"""libkiln_runtime's twin of tests/unit/runtime/test_wrong_executor_hint.py (issue 30 item 4):
``TVMModGetFunction`` on a missing name returns 0 with a NULL function, as in TVM, and leaves
in ``TVMGetLastError()`` why: the module's type_key, and for a VM library asked for the graph
executor's ``default`` (or a graph library asked for ``vm_load_executable``) which executor the
library is for and how to run it. Through the C API (ctypes over ``libkiln_runtime.so``) on a
hand-written VM library and a two-kernel graph library; the examples' path on a real model:
tests/backend/native/test_deploy_vm_examples.py."""

from __future__ import annotations

import ctypes as C
from pathlib import Path

import pytest
from fuzz_runtime import build_so
from test_native_vm import control_flow_executable


class NativeRuntime:
    """The C API calls this test makes, over the shared library."""

    def __init__(self, native_rt: Path):
        self.rt = C.CDLL(str(native_rt / "libkiln_runtime.so"))
        self.rt.TVMGetLastError.restype = C.c_char_p
        self.rt.KilnModTypeKey.restype = C.c_char_p

    def load(self, so: Path) -> C.c_void_p:
        mod = C.c_void_p()
        assert self.rt.TVMModLoadFromFile(str(so).encode(), b"so", C.byref(mod)) == 0, \
            self.rt.TVMGetLastError()
        return mod

    def get_function(self, mod: C.c_void_p, name: str) -> tuple[int, int | None, str]:
        """(return code, function handle or None, TVMGetLastError() after the call)."""
        self.rt.TVMAPISetLastError(b"")
        f = C.c_void_p()
        rc = self.rt.TVMModGetFunction(mod, name.encode(), 1, C.byref(f))
        if f.value is not None:
            self.rt.TVMFuncFree(f)
        return rc, f.value, self.rt.TVMGetLastError().decode()


@pytest.fixture(scope="module")
def libs(tmp_path_factory) -> tuple[Path, Path]:
    """(a VM library, a graph executor library), exported by the Python side."""
    folder = tmp_path_factory.mktemp("executor-hint")
    vm_so = folder / "vm.so"
    control_flow_executable().export_library(str(vm_so))
    return vm_so, Path(build_so(str(folder / "graph.so")))


def test_vm_library_asked_for_default(native_rt, libs):
    api = NativeRuntime(native_rt)
    exe = api.load(libs[0])
    try:
        assert api.rt.KilnModTypeKey(exe) == b"relax.VMExecutable"
        rc, f, msg = api.get_function(exe, "default")
        assert rc == 0 and f is None  # a miss is no error, as in TVM
        assert msg.startswith("module 'relax.VMExecutable' has no function 'default': "
                              "this is a VM library"), msg
        assert "vm_load_executable" in msg and "vm_initialization" in msg
        assert "examples/deploy_vm_c" in msg
        # what the message names is there
        rc, f, _ = api.get_function(exe, "vm_load_executable")
        assert rc == 0 and f is not None
    finally:
        api.rt.TVMModFree(exe)


def test_graph_library_asked_for_vm_load_executable(native_rt, libs):
    api = NativeRuntime(native_rt)
    factory = api.load(libs[1])
    try:
        assert api.rt.KilnModTypeKey(factory) == b"GraphExecutorFactory"
        rc, f, msg = api.get_function(factory, "vm_load_executable")
        assert rc == 0 and f is None
        assert msg.startswith("module 'GraphExecutorFactory' has no function "
                              "'vm_load_executable': this is a graph executor library"), msg
        assert "default(device)" in msg and "examples/deploy_c" in msg
        rc, f, _ = api.get_function(factory, "default")
        assert rc == 0 and f is not None
    finally:
        api.rt.TVMModFree(factory)


def test_other_misses_name_the_module_only(native_rt, libs):
    """A module with no executor of its own (the kernel library) names itself and the function,
    and says nothing about executors."""
    api = NativeRuntime(native_rt)
    factory = api.load(libs[1])
    lib = C.c_void_p()
    try:
        get_lib = C.c_void_p()
        assert api.rt.TVMModGetFunction(factory, b"get_lib", 0, C.byref(get_lib)) == 0
        ret, code = C.c_void_p(), C.c_int()
        assert api.rt.TVMFuncCall(get_lib, None, None, 0, C.byref(ret), C.byref(code)) == 0
        api.rt.TVMFuncFree(get_lib)
        lib = ret
        rc, f, msg = api.get_function(lib, "default")
        assert rc == 0 and f is None
        assert msg == "module 'library' has no function 'default'", msg
    finally:
        if lib.value:
            api.rt.TVMModFree(lib)
        api.rt.TVMModFree(factory)
