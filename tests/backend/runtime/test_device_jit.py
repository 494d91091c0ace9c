"""The ``jit`` target's source-embedded device with the real compilers: a model's kernels kept as
C source through export/load and compiled on first call (host compiler, dlopen), the cache
shared by processes and safe under concurrent compiles, compiler failures, the device server
(forced onto this host with ``KILN_DEVICE_LAUNCHER``) and what happens when it dies, and the
riscv64 RVV path under qemu-user with clang.

Every test uses its own cache folder (``KILN_CACHE_DIR`` in ``tmp_path``).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from device_helpers import RISCV_CC, SYSROOT, device_module, riscv_missing, vector_ops
from onnx import TensorProto, helper, numpy_helper

import kiln
import kiln.runtime as rt
from kiln import progress
from kiln.cli import main as cli
from kiln.errors import KilnError, ToolchainError
from kiln.frontend import from_onnx
from kiln.runtime.jit.device_module import DeviceFunction, SourceDeviceModule
from kiln.runtime.toolchain import compiler as toolchain


@pytest.fixture
def device_env(tmp_path, monkeypatch):
    """A fresh cache and the default device (the host compiler, in process)."""
    for var in ("KILN_DEVICE_CC", "KILN_DEVICE_CFLAGS", "KILN_DEVICE_LAUNCHER", "KILN_NO_CACHE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache" / "device"


def small_model() -> onnx.ModelProto:
    """Conv(3→8, 3x3, pad 1) + Relu → GlobalAveragePool → Flatten → Gemm(8→5) → Softmax."""
    rng = np.random.default_rng(5)
    inits = [numpy_helper.from_array(rng.standard_normal(s).astype("float32"), n) for n, s in
             (("w", (8, 3, 3, 3)), ("b", (8,)), ("fw", (5, 8)), ("fb", (5,)))]
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("GlobalAveragePool", ["r"], ["p"]),
        helper.make_node("Flatten", ["p"], ["f"]),
        helper.make_node("Gemm", ["f", "fw", "fb"], ["g"], transB=1),
        helper.make_node("Softmax", ["g"], ["y"], axis=1),
    ]
    graph = helper.make_graph(
        nodes, "small", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 5])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def export_small(path: Path, fcompile=None) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    model = small_model()
    x = np.random.default_rng(1).standard_normal((1, 3, 16, 16)).astype("float32")
    mod, params = from_onnx(model, shape={"x": x.shape})
    lib = kiln.build(mod, target="jit", params=params)
    lib.export_library(str(path), fcompile=fcompile)
    return model, {"x": x}


def run_library(path: Path, inputs: dict[str, np.ndarray]) -> tuple[np.ndarray, rt.Module]:
    loaded = rt.load_module(str(path))
    gmod = kiln.graph_executor.GraphModule(loaded["default"](kiln.cpu()))
    for k, v in inputs.items():
        gmod.set_input(k, v)
    gmod.run()
    return gmod.get_output(0).numpy(), loaded


def test_model_kernels_stay_source_through_export_and_run(device_env, tmp_path, reference):
    """Export with an explicit fcompile (it must not compile the source away), load, run."""
    so = tmp_path / "small.so"
    model, inputs = export_small(so, fcompile=rt.create_shared)
    assert not list(device_env.glob("device-*.so")), "nothing is compiled before the first call"
    got, loaded = run_library(so, inputs)
    np.testing.assert_allclose(got, reference(model, inputs)[0], rtol=1e-5, atol=1e-6)
    dev = device_module(loaded)
    assert dev.type_key == "kiln_jit" and "#include <kiln/c_runtime_api.h>" in dev.get_source()
    assert all(f.arg_dtypes[-1] == "float32" for f in dev.functions.values())
    assert Path(dev.library_path).parent == device_env  # cached under $KILN_CACHE_DIR/device
    assert [p.name for p in device_env.iterdir() if p.name.endswith(".tmp")] == []
    # the .so holds the C source as data, not compiled kernels
    assert set(dev.list_function_names()).isdisjoint(
        rt.LibraryModule(str(so)).list_function_names())


def test_kiln_run_compiles_the_jit_kernels_before_timing_and_says_so(device_env, tmp_path,
                                                                     monkeypatch, capsys):
    """The first call compiles the kernels: ``kiln run`` does that untimed, says how long it
    took on stderr (not with --quiet), and times only the runs after it."""
    so = tmp_path / "m.so"
    export_small(so)
    compile_kernels = SourceDeviceModule._compile

    def slow_compile(self, *args):
        time.sleep(0.6)  # a compile that no run of this tiny model can hide
        return compile_kernels(self, *args)

    monkeypatch.setattr(SourceDeviceModule, "_compile", slow_compile)
    monkeypatch.setitem(progress._state, "quiet", False)
    assert cli.main(["run", str(so), "--repeat", "3"]) == 0
    out, err = capsys.readouterr()
    notice = re.search(r"first call compiles the jit kernels \((\d+\.\d) s\); timings below "
                       r"exclude it", err)
    assert notice and float(notice[1]) >= 0.6, err
    assert float(re.search(r"max ([\d.]+)\)", out)[1]) < 600, out
    assert cli.main(["run", str(so), "--quiet"]) == 0
    out, err = capsys.readouterr()
    assert "jit" not in err and "run: " in out


def test_tar_export_keeps_the_source_too(device_env, tmp_path, reference):
    model, inputs = export_small(tmp_path / "small.tar")
    got, loaded = run_library(tmp_path / "small.tar", inputs)
    np.testing.assert_allclose(got, reference(model, inputs)[0], rtol=1e-5, atol=1e-6)
    assert device_module(loaded).type_key == "kiln_jit"


_RUN = textwrap.dedent("""
    import logging, sys, time
    import numpy as np
    import kiln, kiln.runtime as rt
    logging.basicConfig(level=logging.DEBUG)  # every command the runtime runs, on stderr
    while time.time() < float(sys.argv[3]):
        time.sleep(0.001)
    loaded = rt.load_module(sys.argv[1])
    g = kiln.graph_executor.GraphModule(loaded["default"](kiln.cpu()))
    g.set_input("x", np.load(sys.argv[2]))
    g.run()
    np.save(sys.argv[2] + ".out.npy", g.get_output(0).numpy())
    print(loaded.imported_modules[0].library_path)
""")


def _run_processes(so: Path, x_path: Path, count: int, env: dict[str, str]
                   ) -> list[tuple[str, str]]:
    start = str(time.time() + 1.0)  # all begin at the same moment
    procs = [subprocess.Popen([sys.executable, "-c", _RUN, str(so), str(x_path), start],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(count)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0] * count, [o[1][-3000:] for o in outs]
    return outs


def test_cache_is_shared_by_processes_and_safe_under_concurrent_compiles(device_env, tmp_path,
                                                                         reference):
    so = tmp_path / "small.so"
    model, inputs = export_small(so)
    x_path = tmp_path / "x.npy"
    np.save(x_path, inputs["x"])
    want = reference(model, inputs)[0]
    # two processes compile the same kernels at once, into an empty cache (no object cache
    # either: each really runs the compiler)
    outs = _run_processes(so, x_path, 2, dict(os.environ, KILN_NO_CACHE="1"))
    paths = {o[0].strip() for o in outs}
    assert len(paths) == 1 and sorted(p.name for p in device_env.glob("device-*")) == \
        [Path(paths.pop()).name]
    assert [p.name for p in device_env.iterdir() if p.name.endswith(".tmp")] == []
    assert all("device0.c" in o[1] for o in outs), "both compiled (neither found it cached)"
    np.testing.assert_allclose(np.load(str(x_path) + ".out.npy"), want, rtol=1e-5, atol=1e-6)
    lib = next(device_env.glob("device-*"))
    # a rebuild renames a new file into place (a new inode); a hit only refreshes the mtime
    # (the size cap's LRU order: kiln.runtime.toolchain.cache_limit)
    stamp = lib.stat().st_mtime_ns, lib.stat().st_ino
    # a third process finds the library: no compile, no link
    (out,) = _run_processes(so, x_path, 1, dict(os.environ))
    assert "device0.c" not in out[1] and "-shared" not in "".join(
        line for line in out[1].splitlines() if "device-" in line)
    assert lib.stat().st_ino == stamp[1] and lib.stat().st_mtime_ns > stamp[0]
    np.testing.assert_allclose(np.load(str(x_path) + ".out.npy"), want, rtol=1e-5, atol=1e-6)


def test_a_failing_compile_reports_the_compiler_stderr(device_env):
    mod = SourceDeviceModule("int broken( {\n", [DeviceFunction("broken", ("float32",))])
    with pytest.raises(ToolchainError, match=r"(?s)command failed.*device0\.c.*(error|expected)"):
        mod["broken"](rt.empty((1,)))
    assert not list(device_env.glob("device-*.so"))


def test_device_cflags_reach_the_compiler(device_env, monkeypatch):
    monkeypatch.setenv("KILN_DEVICE_CFLAGS", "-DKILN_DEVICE_TEST_FLAG=1 -fno-such-kiln-flag")
    mod = SourceDeviceModule(_KERNELS, _FUNCS)
    with pytest.raises(ToolchainError, match="no-such-kiln-flag"):
        mod["add_one"](rt.empty((4,)), rt.empty((4,)))


def test_a_missing_compiler(device_env, monkeypatch):
    monkeypatch.setenv("KILN_DEVICE_CC", "/nonexistent/kiln-cc --target=x")
    mod = SourceDeviceModule(_KERNELS, _FUNCS)
    with pytest.raises(ToolchainError, match=r"KILN_DEVICE_CC='/nonexistent/kiln-cc.*not found"):
        mod["add_one"](rt.empty((4,)), rt.empty((4,)))


# Packed kernels written by hand, for the server tests.
_KERNELS = r"""
#include <kiln/c_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#define KILN_EXPORT __attribute__((visibility("default")))
KILN_EXPORT int32_t add_one(TVMValue* args, int32_t* codes, int32_t n, TVMValue* ret,
                            int32_t* ret_code, void* handle) {
  DLTensor* x = (DLTensor*)args[0].v_handle;
  DLTensor* y = (DLTensor*)args[1].v_handle;
  printf("this goes to stderr, not into the protocol\n");
  fflush(stdout);
  for (int64_t i = 0; i < x->shape[0]; ++i) ((float*)y->data)[i] = ((float*)x->data)[i] + 1;
  return 0;
}
KILN_EXPORT int32_t refuses(TVMValue* args, int32_t* codes, int32_t n, TVMValue* ret,
                            int32_t* ret_code, void* handle) {
  TVMAPISetLastError("refuses: this kernel always fails");
  return -1;
}
KILN_EXPORT int32_t crashes(TVMValue* args, int32_t* codes, int32_t n, TVMValue* ret,
                            int32_t* ret_code, void* handle) {
  fprintf(stderr, "crashes: about to abort\n");
  abort();
}
KILN_EXPORT int32_t spins(TVMValue* args, int32_t* codes, int32_t n, TVMValue* ret,
                          int32_t* ret_code, void* handle) {
  volatile int forever = 1;
  while (forever) {
  }
  return 0;
}
"""
_FUNCS = [DeviceFunction("add_one", ("float32", "float32")),
          DeviceFunction("refuses", ("float32",)), DeviceFunction("crashes", ("float32",)),
          DeviceFunction("spins", ("float32",))]


def test_server_runs_kernels_and_reports_their_errors_and_its_death(device_env, monkeypatch):
    monkeypatch.setenv("KILN_DEVICE_LAUNCHER", "env")  # the server, on this host
    mod = SourceDeviceModule(_KERNELS, _FUNCS)
    x = rt.array(np.arange(6, dtype="float32"))
    y = rt.empty((6,))
    mod["add_one"](x, y)
    np.testing.assert_array_equal(y.numpy(), np.arange(6) + 1)
    assert list(device_env.glob("server-*")), "the server is built and cached"
    with pytest.raises(KilnError, match="refuses failed on the device: refuses: this kernel"):
        mod["refuses"](x)
    with pytest.raises(KilnError, match=r"expects 2 tensors \(then integers\), got 1 arguments"):
        mod["add_one"](x)
    with pytest.raises(KilnError, match="argument 0 must be a C-contiguous float32"):
        mod["add_one"](rt.array(np.zeros(6, "int32")), y)
    with pytest.raises(KilnError, match=r"(?s)killed by signal SIGABRT while running crashes.*"
                                        r"about to abort"):
        mod["crashes"](x)
    with pytest.raises(KilnError, match="while running add_one"):  # stays dead, says so
        mod["add_one"](x, y)


def test_a_launcher_that_exits_is_an_error_not_a_hang(device_env, monkeypatch):
    monkeypatch.setenv("KILN_DEVICE_LAUNCHER", "sh -c 'echo no board here >&2; exit 3'")
    mod = SourceDeviceModule(_KERNELS, _FUNCS)
    with pytest.raises(KilnError, match=r"(?s)exited with status 3 while starting.*no board"):
        mod["add_one"](rt.empty((2,)), rt.empty((2,)))


def test_a_server_that_stops_answering_is_stopped_after_the_timeout(device_env, monkeypatch):
    monkeypatch.setenv("KILN_DEVICE_LAUNCHER", "env")
    monkeypatch.setenv("KILN_DEVICE_TIMEOUT", "1.5")
    mod = SourceDeviceModule(_KERNELS, _FUNCS)
    x = rt.empty((2,))
    mod["add_one"](x, rt.empty((2,)))  # started well within the timeout
    start = time.monotonic()
    with pytest.raises(KilnError, match=r"did not answer within 1.5 s \(KILN_DEVICE_TIMEOUT\) "
                                        r"and was stopped while running spins"):
        mod["spins"](x)
    assert time.monotonic() - start < 30
    # a launcher that never starts the server (waiting for a password, say)
    monkeypatch.setenv("KILN_DEVICE_LAUNCHER", "sh -c 'sleep 60' sh")
    with pytest.raises(KilnError, match="did not answer within 1.5 s .* while starting"):
        SourceDeviceModule(_KERNELS, _FUNCS)["add_one"](x, x)
    monkeypatch.setenv("KILN_DEVICE_TIMEOUT", "soon")
    with pytest.raises(KilnError, match="KILN_DEVICE_TIMEOUT='soon': expected a positive"):
        SourceDeviceModule(_KERNELS, _FUNCS)["add_one"](x, x)


def test_a_launcher_that_runs_something_else(device_env, monkeypatch):
    """Bytes that are not a frame (a login banner) are a protocol error, not a huge read."""
    monkeypatch.setenv("KILN_DEVICE_LAUNCHER",
                       "sh -c 'echo Welcome to the board, have a nice day; cat > /dev/null' sh")
    mod = SourceDeviceModule(_KERNELS, _FUNCS)
    with pytest.raises(KilnError, match="broke the protocol while starting .*Kiln's device"):
        mod["add_one"](rt.empty((2,)), rt.empty((2,)))


def test_a_launcher_that_drops_the_connection(device_env, monkeypatch, tmp_path):
    """The launcher passes the server's hello through, then drops the connection while the
    library is sent (as a failing ssh session would)."""
    script = tmp_path / "flaky.sh"
    script.write_text('#!/bin/sh\n"$1" < /dev/null | head -c 16 &\nhead -c 8 > /dev/null\n'
                      "wait\nexit 255\n")
    script.chmod(0o755)
    monkeypatch.setenv("KILN_DEVICE_LAUNCHER", str(script))
    mod = SourceDeviceModule(_KERNELS, _FUNCS)
    with pytest.raises(KilnError, match="the device server exited with status 255 while "
                                        "loading the kernel library"):
        mod["add_one"](rt.empty((2,)), rt.empty((2,)))


@pytest.mark.parametrize("cc", [RISCV_CC, "riscv64-linux-gnu-gcc", "aarch64-linux-gnu-gcc"])
def test_foreign_isa_kernels_under_qemu(cc, device_env, tmp_path, monkeypatch, reference):
    """clang riscv64: RVV code (checked in the disassembly); the GNU cross compilers (gcc 12:
    no RVV auto-vectorization); aarch64 too. All run 2 pool threads in the server (clang-14
    has no riscv64 OpenMP runtime, which the support code's own pool does not need)."""
    missing = riscv_missing()
    if cc.startswith("aarch64"):
        missing = next((t for t in (cc, "qemu-aarch64") if shutil.which(t) is None), None)
    if missing:
        pytest.skip(f"{cc} device test needs {missing} (make toolchain installs it)")
    monkeypatch.setenv("KILN_DEVICE_CC", cc)
    monkeypatch.setenv("KILN_NUM_THREADS", "2")
    so = tmp_path / "small.so"
    model, inputs = export_small(so)
    got, loaded = run_library(so, inputs)
    np.testing.assert_allclose(got, reference(model, inputs)[0], rtol=1e-5, atol=1e-6)
    server = device_module(loaded)._impl.server
    assert server.command[0] == ("qemu-aarch64" if cc.startswith("aarch64") else "qemu-riscv64")
    if cc == RISCV_CC:
        ops = vector_ops(device_module(loaded).library_path)
        assert {"vsetvli", "vsetivli"} & set(ops) and any(o.startswith("vf") for o in ops), \
            ops[:20]


def test_graph_executor_reports_a_dead_server(device_env, tmp_path, monkeypatch, reference):
    """The executor runs remote kernels transparently; when the server is killed between runs
    the next run raises, naming the kernel, instead of hanging."""
    monkeypatch.setenv("KILN_DEVICE_LAUNCHER", "env")  # the server, on this host
    so = tmp_path / "small.so"
    model, inputs = export_small(so)
    loaded = rt.load_module(str(so))
    gmod = kiln.graph_executor.GraphModule(loaded["default"](kiln.cpu()))
    gmod.set_input("x", inputs["x"])
    gmod.run()
    np.testing.assert_allclose(gmod.get_output(0).numpy(), reference(model, inputs)[0],
                               rtol=1e-5, atol=1e-6)
    server = device_module(loaded)._impl.server
    os.kill(server._proc.pid, signal.SIGKILL)
    with pytest.raises(KilnError, match=r"killed by signal SIGKILL while running fused_"):
        gmod.run()


def test_foreign_compiler_picks_qemu_or_says_what_is_missing(monkeypatch):
    missing = riscv_missing()
    if missing:
        pytest.skip(f"needs {missing}")
    from kiln.runtime.jit import device_toolchain as dm

    monkeypatch.delenv("KILN_DEVICE_LAUNCHER", raising=False)
    cc = RISCV_CC.split()
    assert dm.is_foreign(cc) and not dm.is_foreign(toolchain.find_cc())
    flags, link_flags = dm.device_flags(cc)
    assert flags[:5] == ["-O3", "-fPIC", "-std=gnu99", "-march=rv64gcv", "-mabi=lp64d"]
    assert "-riscv-v-vector-bits-min=128" in flags and "-shared" in link_flags
    assert dm.server_command("/s", cc) == ["qemu-riscv64", "-L", SYSROOT, "-cpu",
                                           "rv64,v=true,vlen=128", "/s"]
    monkeypatch.setenv("KILN_DEVICE_LAUNCHER", "ssh -T board")
    assert dm.server_command("/s", cc) == ["ssh", "-T", "board", "/s"]
    monkeypatch.delenv("KILN_DEVICE_LAUNCHER")
    real = dm.shutil.which
    monkeypatch.setattr(dm.shutil, "which", lambda n: None if n.startswith("qemu") else real(n))
    with pytest.raises(ToolchainError, match="qemu-riscv64 is not installed.*riscv64 machine"):
        dm.server_command("/s", cc)
