"""The compile cache with the real compilers: C objects reused by ``export_library`` (and every
path through ``toolchain.compile_objects``), keys that follow flags, sources and headers, two
processes compiling one kernel at once, corrupt entries rebuilt, the opt-out; LLVM objects per
kernel group, compiled in worker processes, identical whichever way they were made."""

from __future__ import annotations

import filecmp
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from test_llvm import binary_kernel
from test_runtime_roundtrip import KERNELS, make_factory

import kiln.runtime as rt
from kiln.codegen import llvm as codegen_llvm
from kiln.codegen import llvm_worker
from kiln.errors import CompileError
from kiln.runtime import compile_cache, toolchain


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A fresh, enabled compile cache for this test; its objects folder."""
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("KILN_NO_CACHE", raising=False)
    return tmp_path / "cache" / "objects"


@pytest.fixture
def compiles(monkeypatch):
    """The C sources the compiler was run on (``cc ... -c <src>``), in order."""
    seen: list[str] = []
    real = toolchain.run

    def run(cmd, cwd=None):
        cmd = [str(c) for c in cmd]
        if "-c" in cmd:
            seen.append(os.path.basename(cmd[cmd.index("-c") + 1]))
        return real(cmd, cwd)

    monkeypatch.setattr(toolchain, "run", run)
    return seen


def _entries(cache, kind="o"):
    return sorted(p for p in os.listdir(cache) if p.endswith(f".{kind}")) if cache.exists() else []


def test_second_export_reuses_every_c_object(tmp_path, cache, compiles, caplog):
    with caplog.at_level(logging.DEBUG, logger="kiln"):
        make_factory().export_library(str(tmp_path / "a.so"))
    assert sorted(compiles) == ["devc.c", "kiln_amx.c", "kiln_backend.c", "lib0.c"]
    assert len(_entries(cache)) == 4
    compiles.clear()
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="kiln"):
        make_factory().export_library(str(tmp_path / "b.so"))
    assert compiles == []
    messages = [r.getMessage() for r in caplog.records]
    assert sum("compile cache hit" in m for m in messages) == 4
    # KILN_LOG=debug still shows every command: the preprocessing and the link
    assert any(m.startswith("run: ") and " -E -P " in m for m in messages)
    assert any(m.startswith("run: ") and "-shared" in m for m in messages)
    assert filecmp.cmp(tmp_path / "a.so", tmp_path / "b.so", shallow=False)
    gm = rt.load_module(str(tmp_path / "b.so"))["default"](rt.cpu())
    assert gm is not None


def test_key_follows_flags_source_and_headers_not_file_names(tmp_path, cache):
    cc = toolchain.find_cc()
    inc = tmp_path / "inc"
    inc.mkdir()
    (inc / "k.h").write_text("#define SCALE 2.0f\n")
    src = tmp_path / "a.c"
    src.write_text('#include "k.h"\nfloat f(float x) { return x * SCALE; }\n')
    flags = [*toolchain.COMPILE_FLAGS, f"-I{inc}"]
    key = toolchain.object_cache_key(cc, flags, str(src))
    assert key is not None
    other_dir = tmp_path / "elsewhere"
    other_dir.mkdir()
    (other_dir / "b.c").write_text(src.read_text())
    assert toolchain.object_cache_key(cc, flags, str(other_dir / "b.c")) == key
    assert toolchain.object_cache_key(cc, [*flags, "-O1"], str(src)) != key
    assert toolchain.object_cache_key(cc, [*flags, "-DEXTRA=1"], str(src)) != key
    (inc / "k.h").write_text("#define SCALE 3.0f\n")
    assert toolchain.object_cache_key(cc, flags, str(src)) != key
    src.write_text('#include "k.h"\nfloat f(float x) { return x + SCALE; }\n')
    assert toolchain.object_cache_key(cc, flags, str(src)) != key


def test_native_flags_name_this_cpu_in_the_identity():
    cc = tuple(toolchain.find_cc())
    ident = toolchain.compiler_identity(cc, ("-march=native",))
    if ident is None:
        pytest.skip(f"{cc[0]} has no -### report")
    assert "version" in ident.lower()  # gcc and clang both print theirs
    assert ident != toolchain.compiler_identity(cc, ())  # the expanded CPU and features


def test_corrupt_object_entry_is_rebuilt(tmp_path, cache, compiles):
    src = tmp_path / "k.c"
    src.write_text(KERNELS)
    (obj,) = toolchain.compile_objects([src])
    good = Path(obj).read_bytes()
    assert compiles == ["k.c"]
    (entry,) = _entries(cache)
    data = (cache / entry).read_bytes()
    (cache / entry).write_bytes(data[: len(data) // 2])  # a short entry (a crash while writing)
    os.unlink(obj)
    toolchain.compile_objects([src])
    assert compiles == ["k.c", "k.c"]  # ignored and rebuilt
    assert Path(obj).read_bytes() == good
    assert (cache / entry).read_bytes() == data  # and stored whole again
    toolchain.compile_objects([src])
    assert compiles == ["k.c", "k.c"]


def test_no_cache_compiles_every_time(tmp_path, cache, compiles, monkeypatch):
    monkeypatch.setenv("KILN_NO_CACHE", "1")
    src = tmp_path / "k.c"
    src.write_text(KERNELS)
    toolchain.compile_objects([src])
    toolchain.compile_objects([src])
    assert compiles == ["k.c", "k.c"]
    assert _entries(cache) == []


_CONCURRENT = textwrap.dedent("""
    import sys, time
    from kiln.runtime import toolchain
    while time.time() < float(sys.argv[2]):
        time.sleep(0.001)
    (obj,) = toolchain.compile_objects([sys.argv[1]])
    print(obj)
""")


def test_two_processes_compiling_one_kernel_at_once(tmp_path, cache):
    import time

    srcs = []
    for name in ("p1", "p2"):
        d = tmp_path / name
        d.mkdir()
        (d / "k.c").write_text(KERNELS)
        srcs.append(d / "k.c")
    start = str(time.time() + 1.0)  # both start compiling at the same moment
    env = dict(os.environ, KILN_LOG="debug")
    procs = [subprocess.Popen([sys.executable, "-c", _CONCURRENT, str(s), start], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for s in srcs]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[1] for o in outs]
    objs = [o[0].strip() for o in outs]
    assert filecmp.cmp(objs[0], objs[1], shallow=False)
    (entry,) = _entries(cache)
    assert compile_cache.load(entry[:-2], "o") == [Path(objs[0]).read_bytes()]
    assert [p for p in os.listdir(cache) if p.endswith(".tmp")] == []


# ------------------------------------------------------------------------------------ llvm
def _kernels(n: int):
    ops = [lambda x, y: x + y, lambda x, y: x * y, lambda x, y: x - y]
    return [binary_kernel(f"k{i}", (16 + i,), ops[i % 3]) for i in range(n)]


@pytest.fixture
def llvm_compiles(monkeypatch):
    """How many LLVM modules were optimized and emitted (in this process or in workers)."""
    count = [0]
    real_ir, real_workers = codegen_llvm.compile_ir, llvm_worker.compile_in_workers

    def compile_ir(text, target, what="module"):
        count[0] += 1
        return real_ir(text, target, what)

    def compile_in_workers(jobs, target, workers):
        count[0] += len(jobs)
        return real_workers(jobs, target, workers)

    monkeypatch.setattr(codegen_llvm, "compile_ir", compile_ir)
    monkeypatch.setattr(llvm_worker, "compile_in_workers", compile_in_workers)
    return count


def _objects(lib):
    return [lib.obj] + [m.obj for m in lib.imported_modules]


def test_llvm_groups_are_cached_and_keyed_by_target(cache, llvm_compiles, caplog):
    funcs = _kernels(3)
    first = codegen_llvm.build_llvm(funcs, "llvm", jobs=1)
    assert llvm_compiles[0] == 1 and len(_entries(cache, "llvm")) == 1
    with caplog.at_level(logging.DEBUG, logger="kiln"):
        again = codegen_llvm.build_llvm(funcs, "llvm", jobs=1)
    assert llvm_compiles[0] == 1
    assert any("compile cache hit" in r.getMessage() for r in caplog.records)
    assert _objects(again) == _objects(first) and again.get_source() == first.get_source()
    x, y = np.arange(16, dtype="float32"), np.ones(16, "float32")
    out = rt.empty((16,), "float32")
    again["k0"](rt.array(x), rt.array(y), out)
    np.testing.assert_array_equal(out.numpy(), x + y)
    codegen_llvm.build_llvm(funcs, "llvm -opt-level=2", jobs=1)
    assert llvm_compiles[0] == 2 and len(_entries(cache, "llvm")) == 2


def test_llvm_workers_give_the_same_objects_as_one_process(cache, monkeypatch):
    funcs = _kernels(3 * codegen_llvm.KERNELS_PER_MODULE)  # three modules
    monkeypatch.setenv("KILN_NO_CACHE", "1")
    serial = codegen_llvm.build_llvm(funcs, "llvm", jobs=1)
    started = []
    real = llvm_worker._Worker.__init__

    def init(self, index):
        started.append(index)
        real(self, index)

    monkeypatch.setattr(llvm_worker._Worker, "__init__", init)
    parallel = codegen_llvm.build_llvm(funcs, "llvm", jobs=2)
    assert sorted(started) == [0, 1]
    assert len(_objects(serial)) == 3
    assert _objects(parallel) == _objects(serial)
    assert [m.func_names for m in [parallel, *parallel.imported_modules]] == [
        m.func_names for m in [serial, *serial.imported_modules]]


def test_llvm_worker_starts_without_the_loop_ir_or_the_runtime():
    """A worker imports llvmlite, kiln.target and kiln.errors only (its start-up is paid once
    per worker per build: importing kiln.codegen.llvm, with the loop IR and kiln.runtime's
    numpy, tripled its CPU time)."""
    code = ("import sys; from kiln.codegen.llvm_worker import main; main(); "
            "print('MODULES', sorted(m for m in sys.modules "
            "if m.split('.')[0] in ('kiln', 'numpy')))")
    src = str(Path(codegen_llvm.__file__).parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", code], stdin=subprocess.DEVNULL,
                          capture_output=True, env=env, check=False, timeout=120)
    # main() answers "ready" on stdout and moves print() to stderr
    lines = [ln for ln in proc.stderr.decode().splitlines() if ln.startswith("MODULES")]
    assert proc.returncode == 0 and lines, proc.stderr.decode()
    assert lines[0] == "MODULES " + repr(sorted([
        "kiln", "kiln.codegen", "kiln.codegen.llvm_machine", "kiln.codegen.llvm_worker",
        "kiln.errors", "kiln.target"]))


def test_llvm_worker_reports_bad_ir_as_compile_error():
    jobs = [("this is not LLVM IR", "module A"), ("define void @f() {\n ret void\n}\n", "B")]
    with pytest.raises(CompileError, match="LLVM rejected the IR of module A"):
        llvm_worker.compile_in_workers(jobs, "llvm", 2)


def test_llvm_falls_back_to_this_process_when_no_worker_starts(cache, monkeypatch):
    monkeypatch.setattr(sys, "executable", "")
    monkeypatch.setenv("KILN_NO_CACHE", "1")
    lib = codegen_llvm.build_llvm(_kernels(2 * codegen_llvm.KERNELS_PER_MODULE), "llvm",
                                  jobs=2)
    assert len(_objects(lib)) == 2
