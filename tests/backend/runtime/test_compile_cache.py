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
import time
from pathlib import Path

import numpy as np
import pytest
from test_llvm import binary_kernel
from test_runtime_roundtrip import KERNELS, make_factory

import kiln.runtime as rt
from kiln.codegen.llvm import build as codegen_llvm
from kiln.codegen.llvm import worker as llvm_worker
from kiln.errors import CompileError
from kiln.runtime.toolchain import cc_manifest, compile_cache
from kiln.runtime.toolchain import compiler as toolchain


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
    assert sum("compile cache hit" in m and "manifest" not in m for m in messages) == 4
    # the keys came from the manifests (direct mode): no preprocessing; the link is logged
    assert sum("compile cache manifest hit" in m for m in messages) == 4
    assert not any(m.startswith("run: ") and " -E -P " in m for m in messages)
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
    from kiln.runtime.toolchain import compiler as toolchain
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


# ----------------------------------------------------------------------------- direct mode
@pytest.fixture
def preprocessed(caplog):
    """The sources the preprocessor ran on (``cc ... -E -P ... <src>``, from the debug log)."""
    caplog.set_level(logging.DEBUG, logger="kiln")

    def sources():
        return [os.path.basename(m.split()[-1]) for m in (r.getMessage() for r in caplog.records)
                if m.startswith("run: ") and " -E -P " in m]

    return sources


def settle():
    """Wait until the files just written are older than the window in which direct mode
    distrusts a header (it may have changed while the preprocessor ran)."""
    time.sleep(0.06)


def _project(tmp_path, source, headers):
    """``src/a.c`` and headers ``{relative path: text}`` under tmp_path; (source, flags with
    -I inc1 -I inc2)."""
    for rel, text in headers.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    (tmp_path / "src").mkdir(exist_ok=True)
    (tmp_path / "src" / "a.c").write_text(source)
    for d in ("inc1", "inc2"):
        (tmp_path / d).mkdir(exist_ok=True)
    settle()
    flags = [*toolchain.COMPILE_FLAGS, f"-I{tmp_path / 'inc1'}", f"-I{tmp_path / 'inc2'}"]
    return str(tmp_path / "src" / "a.c"), flags


_USES_K = '#include "k.h"\nfloat f(float x) { return x * SCALE; }\n'


def test_unchanged_source_and_headers_skip_the_preprocessor(tmp_path, cache, preprocessed,
                                                            caplog):
    src, flags = _project(tmp_path, _USES_K, {"inc2/k.h": "#define SCALE 2.0f\n"})
    cc = toolchain.find_cc()
    key = toolchain.object_cache_key(cc, flags, src)
    assert preprocessed() == ["a.c"]
    assert len(_entries(cache, "manifest")) == 1
    assert toolchain.object_cache_key(cc, flags, src) == key
    assert preprocessed() == ["a.c"]
    assert any(r.getMessage() == f"compile cache manifest hit: {src}" for r in caplog.records)
    # a copy in another folder (a new export folder) uses the same manifest
    copy = tmp_path / "other" / "b.c"
    copy.parent.mkdir()
    copy.write_text(_USES_K)
    assert toolchain.object_cache_key(cc, flags, str(copy)) == key
    assert preprocessed() == ["a.c"]
    assert toolchain.object_cache_key(cc, [*flags, "-DX=1"], src) != key  # another manifest
    assert preprocessed() == ["a.c", "a.c"]


def test_manifest_key_is_the_preprocessed_key_and_object_the_same(tmp_path, cache, compiles):
    src, flags = _project(tmp_path, KERNELS, {})
    (obj,) = toolchain.compile_objects([src])
    first = Path(obj).read_bytes()
    direct_key = toolchain.object_cache_key(toolchain.find_cc(),
                                            [*flags[:len(toolchain.COMPILE_FLAGS)],
                                             f"-I{toolchain.INCLUDE_DIR}"], src)
    for entry in _entries(cache, "manifest"):
        os.unlink(cache / entry)
    os.unlink(obj)
    toolchain.compile_objects([src])  # preprocesses again: same key, so the cached object
    assert compiles == ["a.c"]
    assert _entries(cache) == [f"{direct_key}.o"]
    assert Path(obj).read_bytes() == first


@pytest.mark.parametrize("change", ["edit", "shadow_in_earlier_dir", "shadow_in_source_dir",
                                    "new_search_dir"])
def test_header_changes_are_noticed(tmp_path, cache, compiles, preprocessed, change):
    """An edited header, a header created earlier in the search path than the one recorded
    (an -I folder before, or the source's own folder for #include "..."), a search folder
    that did not exist: each is a new key and a compile."""
    src, flags = _project(tmp_path, _USES_K, {"inc2/k.h": "#define SCALE 2.0f\n"})
    if change == "new_search_dir":
        flags.insert(-2, f"-I{tmp_path / 'later'}")  # skipped: it does not exist yet
    cc = toolchain.find_cc()
    key = toolchain.object_cache_key(cc, flags, src)
    toolchain.compile_objects([src], cc, flags[len(toolchain.COMPILE_FLAGS):])
    assert compiles == ["a.c"] and preprocessed() == ["a.c", "a.c"]
    new = {"edit": "inc2/k.h", "shadow_in_earlier_dir": "inc1/k.h",
           "shadow_in_source_dir": "src/k.h", "new_search_dir": "later/k.h"}[change]
    (tmp_path / new).parent.mkdir(exist_ok=True)
    (tmp_path / new).write_text("#define SCALE 3.0f\n")
    settle()
    changed = toolchain.object_cache_key(cc, flags, src)
    assert changed != key
    assert preprocessed() == ["a.c"] * 3  # the manifest did not match: preprocessed
    toolchain.compile_objects([src], cc, flags[len(toolchain.COMPILE_FLAGS):])
    assert compiles == ["a.c", "a.c"]
    assert toolchain.object_cache_key(cc, flags, src) == changed  # recorded again: a hit
    assert preprocessed() == ["a.c"] * 4


def test_has_include_result_is_part_of_the_manifest(tmp_path, cache, preprocessed):
    source = ('#if __has_include("opt.h")\n#include "opt.h"\n#else\n#define SCALE 1.0f\n'
              '#endif\nfloat f(float x) { return x * SCALE; }\n')
    src, flags = _project(tmp_path, source, {})
    cc = toolchain.find_cc()
    key = toolchain.object_cache_key(cc, flags, src)
    assert toolchain.object_cache_key(cc, flags, src) == key
    (tmp_path / "inc2" / "opt.h").write_text("#define SCALE 4.0f\n")
    settle()
    assert toolchain.object_cache_key(cc, flags, src) != key
    assert preprocessed() == ["a.c", "a.c"]


@pytest.mark.parametrize("damage", ["truncate", "bad_json", "wrong_shape"])
def test_corrupt_manifest_falls_back_to_the_preprocessor(tmp_path, cache, preprocessed,
                                                         damage):
    src, flags = _project(tmp_path, _USES_K, {"inc2/k.h": "#define SCALE 2.0f\n"})
    cc = toolchain.find_cc()
    key = toolchain.object_cache_key(cc, flags, src)
    (entry,) = _entries(cache, "manifest")
    good = (cache / entry).read_bytes()
    if damage == "truncate":
        (cache / entry).write_bytes(good[:len(good) // 2])
    else:  # a whole entry holding something else
        text = b"{not json" if damage == "bad_json" else b'{"version": 1, "files": 3}'
        compile_cache.store(entry[:-len(".manifest")], "manifest", [text])
    assert toolchain.object_cache_key(cc, flags, src) == key
    assert preprocessed() == ["a.c", "a.c"]
    assert (cache / entry).read_bytes() == good  # recorded again
    assert toolchain.object_cache_key(cc, flags, src) == key
    assert preprocessed() == ["a.c", "a.c"]


def test_date_and_time_macros_get_no_manifest(tmp_path, cache, preprocessed):
    src, flags = _project(tmp_path, '#include "t.h"\nconst char* built = STAMP;\n',
                          {"inc1/t.h": "#define STAMP __DATE__ \" \" __TIME__\n"})
    cc = toolchain.find_cc()
    toolchain.object_cache_key(cc, flags, src)
    toolchain.object_cache_key(cc, flags, src)
    assert preprocessed() == ["a.c", "a.c"]
    assert _entries(cache, "manifest") == []


def test_file_macro_pins_the_manifest_to_the_source_path(tmp_path, cache, preprocessed):
    source = "const char* where = __FILE__;\n"
    src, flags = _project(tmp_path, source, {})
    cc = toolchain.find_cc()
    key = toolchain.object_cache_key(cc, flags, src)
    assert toolchain.object_cache_key(cc, flags, src) == key
    assert preprocessed() == ["a.c"]
    copy = tmp_path / "other" / "a.c"
    copy.parent.mkdir()
    copy.write_text(source)
    assert toolchain.object_cache_key(cc, flags, str(copy)) != key  # its own path inside
    assert preprocessed() == ["a.c", "a.c"]


def test_header_beside_the_source_pins_the_manifest_to_the_source_path(tmp_path, cache,
                                                                       preprocessed):
    src, flags = _project(tmp_path, _USES_K, {"src/k.h": "#define SCALE 2.0f\n"})
    cc = toolchain.find_cc()
    key = toolchain.object_cache_key(cc, flags, src)
    assert toolchain.object_cache_key(cc, flags, src) == key
    assert preprocessed() == ["a.c"]
    other = tmp_path / "other"  # the same source beside another k.h
    other.mkdir()
    (other / "k.h").write_text("#define SCALE 7.0f\n")
    (other / "a.c").write_text(_USES_K)
    settle()
    assert toolchain.object_cache_key(cc, flags, str(other / "a.c")) != key
    assert preprocessed() == ["a.c", "a.c"]


def test_options_it_cannot_follow_disable_direct_mode(tmp_path, cache, preprocessed):
    src, flags = _project(tmp_path, _USES_K, {"inc2/k.h": "#define SCALE 2.0f\n"})
    (tmp_path / "pre.h").write_text("#define PRE 1\n")
    flags += ["-include", str(tmp_path / "pre.h")]
    cc = toolchain.find_cc()
    assert toolchain.object_cache_key(cc, flags, src) == toolchain.object_cache_key(cc, flags,
                                                                                    src)
    assert preprocessed() == ["a.c", "a.c"]
    assert _entries(cache, "manifest") == []


def test_a_compiler_without_dependency_options_still_gets_keys(tmp_path, cache, preprocessed):
    wrapper = tmp_path / "old-cc"
    wrapper.write_text('#!/bin/sh\nfor a in "$@"; do [ "$a" = -MD ] && exit 1; done\n'
                       f'exec {toolchain.find_cc()[0]} "$@"\n')
    wrapper.chmod(0o755)
    src, flags = _project(tmp_path, _USES_K, {"inc2/k.h": "#define SCALE 2.0f\n"})
    key = toolchain.object_cache_key([str(wrapper)], flags, src)
    assert key is not None and key == toolchain.object_cache_key([str(wrapper)], flags, src)
    assert _entries(cache, "manifest") == []


def test_header_changed_just_before_preprocessing_is_not_recorded(tmp_path, cache,
                                                                  preprocessed, monkeypatch):
    src, flags = _project(tmp_path, _USES_K, {"inc2/k.h": "#define SCALE 2.0f\n"})
    (tmp_path / "inc2" / "k.h").write_text("#define SCALE 5.0f\n")
    # "just before": within the window, widened so that a slow machine cannot leave it
    monkeypatch.setattr(cc_manifest, "RECENT_NS", 600 * 10**9)
    cc = toolchain.find_cc()
    key = toolchain.object_cache_key(cc, flags, src)
    assert _entries(cache, "manifest") == []  # it may have changed while it was read
    monkeypatch.setattr(cc_manifest, "RECENT_NS", 0)
    assert toolchain.object_cache_key(cc, flags, src) == key
    assert len(_entries(cache, "manifest")) == 1


def test_no_cache_writes_no_manifest(tmp_path, cache, preprocessed, monkeypatch):
    monkeypatch.setenv("KILN_NO_CACHE", "1")
    src, flags = _project(tmp_path, _USES_K, {"inc2/k.h": "#define SCALE 2.0f\n"})
    toolchain.compile_objects([src], options=flags[len(toolchain.COMPILE_FLAGS):])
    toolchain.compile_objects([src], options=flags[len(toolchain.COMPILE_FLAGS):])
    assert preprocessed() == []
    assert not cache.exists() or os.listdir(cache) == []


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
    """A worker imports llvmlite, kiln.target (and its -mcpu check) and kiln.errors only (its
    start-up is paid once per worker per build: importing kiln.codegen.llvm.build, with the
    loop IR and kiln.runtime's numpy, tripled its CPU time)."""
    code = ("import sys; from kiln.codegen.llvm.worker import main; main(); "
            "print('MODULES', sorted(m for m in sys.modules "
            "if m.split('.')[0] in ('kiln', 'numpy')))")
    src = str(Path(codegen_llvm.__file__).parents[3])  # src/ (kiln/codegen/llvm/build.py)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", code], stdin=subprocess.DEVNULL,
                          capture_output=True, env=env, check=False, timeout=120)
    # main() answers "ready" on stdout and moves print() to stderr
    lines = [ln for ln in proc.stderr.decode().splitlines() if ln.startswith("MODULES")]
    assert proc.returncode == 0 and lines, proc.stderr.decode()
    assert lines[0] == "MODULES " + repr(sorted([
        "kiln", "kiln.codegen", "kiln.codegen.llvm", "kiln.codegen.llvm.machine",
        "kiln.codegen.llvm.worker", "kiln.errors", "kiln.target", "kiln.target_llvm_names"]))


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
