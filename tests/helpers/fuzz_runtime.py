"""Seeded mutation fuzzing of the runtime loaders (used by tests/unit and tests/backend).

Each case is a pure function of ``(target, seed, index)``: the case's random generator is
``random.Random(f"{target}:{seed}:{index}")``, which picks one corpus item and one to four
mutations. A failure report names the case and the command that replays it alone::

    python tests/helpers/fuzz_runtime.py replay <target> <seed> <index>

A case passes when the loader returns or raises :class:`KilnError`. It fails on any other
exception (``IndexError``, ``struct.error``, ``MemoryError``...), on a ``KilnError`` raised
``from`` a non-Kiln exception (a parser bug hidden by a catch-all), when it runs longer than
:data:`CASE_TIMEOUT_S` (a hang), and, for whole-file cases run in a worker process, when the
worker dies (a crash).

Targets (what is mutated → what loads it):

``params``        params blobs → ``load_param_dict``
``factory``       ``GraphExecutorFactory`` module bytes → ``load_from_binary`` + ``create``
``blob``          ``__tvm_dev_mblob`` payloads → ``unpack_imports`` + executor creation
``graph_text``    graph JSON bytes → ``parse_graph`` + ``GraphExecutor`` creation
``graph_struct``  parsed graph JSON (wrong types, missing keys, bad ids, shapes, dltypes,
                  ``node_row_ptr``) → the same
``kiln_json``     BYOC ``kiln_json`` module bytes (bytes, or tokens of its graph JSON) →
                  ``JSONRuntimeModule.load_from_binary``
``vm_exec``       ``VMExecutable`` bytes (any bytes, or words of the code section) →
                  ``load_from_binary`` + ``vm_load_executable`` + ``vm_initialization``
``so_blob``       the payload of a real exported ``.so`` (needs a C compiler) → as ``blob``,
                  over the library's real kernels
``so_file``       whole ``.so`` files → ``load_module`` + executor creation, in worker
                  processes (see :func:`so_file_mutation` for which bytes are mutated)
``elf``           the ``.so``'s ELF and program headers, or truncated files → the checks
                  ``load_module`` makes before ``dlopen`` (``elf.check_loadable``) only
"""

from __future__ import annotations

import atexit
import json
import os
import random
import resource
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kiln.runtime as rt
from kiln.errors import KilnError
from kiln.runtime.blob import unpack_imports
from kiln.runtime.graph_executor.executor import GraphExecutor
from kiln.runtime.module import Module

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fuzz_mutators import (
    blob_corpus,
    factory_corpus,
    graph_docs,
    graph_params,
    json_runtime_corpus,
    mutate_bytes,
    mutate_doc,
    mutate_text,
    mutate_vm_words,
    numpy_kernels,
    params_corpus,
    vm_exec_corpus,
    vm_kernels,
)

CASE_TIMEOUT_S = 5.0
WORKER_BATCH = 200  # whole-file cases per worker process (each dlopen stays mapped)
SO_TARGETS = ("so_blob", "so_file", "elf")  # need a good exported .so
_U64 = struct.Struct("<Q")


# ------------------------------------------------------------------------------ targets
@dataclass
class Target:
    name: str
    cases: Callable[[random.Random], tuple[Callable[[], Any], str]]


def _create_executor(root: Any) -> None:
    if isinstance(root, rt.GraphExecutorFactoryModule):
        root["default"](rt.cpu())


def _graph_loader(data: bytes, doc_index: int) -> Callable[[], Any]:
    params = graph_params(graph_docs()[doc_index])
    return lambda: GraphExecutor(data, numpy_kernels(), rt.cpu(), params)


def _init_vm(data: bytes) -> None:
    exe = rt.VMExecutable.load_from_binary(data)
    exe.import_module(vm_kernels())
    exe["vm_load_executable"]()["vm_initialization"](1, 0, 2)


def make_targets(so_path: str | None = None) -> dict[str, Target]:
    """The fuzz targets; :data:`SO_TARGETS` only with ``so_path`` (a good exported .so)."""
    params, facs, blobs, docs = params_corpus(), factory_corpus(), blob_corpus(), graph_docs()
    texts = [json.dumps(d).encode() for d in docs]
    json_mods = json_runtime_corpus()
    vm_execs = vm_exec_corpus()

    def t_params(rng):
        data, desc = mutate_bytes(rng, rng.choice(params))
        return (lambda: rt.load_param_dict(data)), desc

    def t_factory(rng):
        data, desc = mutate_bytes(rng, rng.choice(facs))
        return (lambda: _create_executor(_with_lib(rt.GraphExecutorFactoryModule
                                                   .load_from_binary(data)))), desc

    def t_blob(rng):
        data, desc = mutate_bytes(rng, rng.choice(blobs))
        return (lambda: _create_executor(unpack_imports(data, numpy_kernels()))), desc

    def t_graph_text(rng):
        i = rng.randrange(len(texts))
        data, desc = mutate_text(rng, texts[i])
        return _graph_loader(data, i), f"graph{i} {desc}"

    def t_graph_struct(rng):
        i = rng.randrange(len(docs))
        data, desc = mutate_doc(rng, docs[i])
        return _graph_loader(data, i), f"graph{i} {desc}"

    def t_kiln_json(rng):
        data = rng.choice(json_mods)
        if rng.random() < 0.5:
            data, desc = mutate_bytes(rng, data)
        else:  # mutate the graph JSON's tokens, keep the framing valid
            r = rt.stream.StreamReader(data, "corpus")
            symbol, graph, consts = r.string("s"), r.string("g").encode(), r.vec_str("c")
            graph, desc = mutate_text(rng, graph)
            w = rt.stream.StreamWriter()
            w.string(symbol)
            w.string(graph.decode("utf-8", "replace"))
            w.vec_str(consts)
            data = w.getvalue()
        return (lambda: rt.JSONRuntimeModule.load_from_binary(data)), desc

    def t_vm_exec(rng):
        data = rng.choice(vm_execs)
        mutate = mutate_bytes if rng.random() < 0.5 else mutate_vm_words
        data, desc = mutate(rng, data)
        return (lambda: _init_vm(data)), desc

    def t_selftest(rng):  # checks the harness: case 5k+3 crashes, 5k+4 raises IndexError
        index = rng.index  # type: ignore[attr-defined]
        if index % 5 == 3:
            return (lambda: os.kill(os.getpid(), signal.SIGSEGV)), "segfault"
        if index % 5 == 4:
            return (lambda: [][index]), "IndexError"
        return (lambda: None), "loads"

    targets = [Target("params", t_params), Target("factory", t_factory),
               Target("blob", t_blob), Target("graph_text", t_graph_text),
               Target("graph_struct", t_graph_struct), Target("kiln_json", t_kiln_json),
               Target("vm_exec", t_vm_exec), Target("selftest", t_selftest)]
    if so_path:
        so = SoCorpus(so_path)

        def t_so_blob(rng):
            data, desc = mutate_bytes(rng, so.payload)
            return (lambda: _create_executor(unpack_imports(data, so.lib()))), desc

        def t_so_file(rng):
            data, desc = so_file_mutation(rng, so)
            return (lambda: _load_file(data)), desc

        def t_elf(rng):
            data, desc = elf_mutation(rng, so)
            return (lambda: _check_file(data)), desc

        targets += [Target("so_blob", t_so_blob), Target("so_file", t_so_file),
                    Target("elf", t_elf)]
    return {t.name: t for t in targets}


def _with_lib(fac: Module) -> Module:
    fac.import_module(numpy_kernels())
    return fac


# ------------------------------------------------------------------------ the real .so
SO_KERNELS = r"""
#include <kiln/c_runtime_api.h>
#define EXPORT __attribute__((visibility("default")))
#define BINARY(NAME, OP)                                                                 \
  EXPORT int32_t NAME(TVMValue* args, int32_t* codes, int32_t num_args, TVMValue* ret,   \
                      int32_t* ret_code, void* handle) {                                 \
    if (num_args != 3) { TVMAPISetLastError(#NAME ": expected 3 arguments"); return -1; } \
    DLTensor* a = (DLTensor*)args[0].v_handle;                                           \
    DLTensor* b = (DLTensor*)args[1].v_handle;                                           \
    DLTensor* c = (DLTensor*)args[2].v_handle;                                           \
    int64_t n = 1;                                                                       \
    for (int i = 0; i < a->ndim; ++i) n *= a->shape[i];                                  \
    for (int64_t i = 0; i < n; ++i)                                                      \
      ((float*)c->data)[i] = ((float*)a->data)[i] OP ((float*)b->data)[i];               \
    return 0;                                                                            \
  }
BINARY(fused_add, +)
BINARY(fused_mul, *)
"""


def build_so(path: str) -> str:
    """Export the first corpus graph over :data:`SO_KERNELS` to ``path`` (needs a C compiler)."""
    doc = graph_docs()[0]
    fac = rt.GraphExecutorFactoryModule(json.dumps(doc), rt.CSourceModule(
        SO_KERNELS, ["fused_add", "fused_mul"]), graph_params(doc))
    fac.export_library(path)
    return path


class SoCorpus:
    """A good exported library: its bytes and where its blob lies in them."""

    def __init__(self, path: str):
        import ctypes

        self.path = path
        self.data = Path(path).read_bytes()
        self._handle = ctypes.CDLL(path, mode=os.RTLD_LOCAL)
        sym = ctypes.c_uint64.in_dll(self._handle, "__tvm_dev_mblob")
        self.payload = ctypes.string_at(ctypes.addressof(sym) + 8, sym.value)
        self.blob_off = self.data.index(_U64.pack(sym.value) + self.payload)
        self.blob_end = self.blob_off + 8 + len(self.payload)

    def lib(self) -> rt.LibraryModule:
        """A fresh library module (a case may link imports into it) over the one handle."""
        return rt.LibraryModule(self.path, lib=self._handle)


def so_file_mutation(rng: random.Random, so: SoCorpus) -> tuple[bytes, str]:
    """A mutated copy of the whole library.

    Mutations are restricted to (a) in-place mutations of the blob bytes (``u64 nbytes``
    included: flips, byte replacements, huge length fields) and (b) truncation of the file at
    any length (which ``elf.py`` rejects before ``dlopen``). Inserting or deleting bytes inside
    the file shifts every later section away from where the program headers say it is, and
    corrupting ELF structures (dynamic section, relocations, code) makes ``dlopen`` itself
    crash or run corrupt constructors: a ``.so`` is code and must be trusted
    (docs/decisions/004-loading-untrusted-artifacts.md). Size-changing blob mutations are
    covered by the ``so_blob`` target, which feeds the same payload parser in-process.
    """
    if rng.random() < 0.1:
        cut = rng.randrange(len(so.data))
        return so.data[:cut], f"file truncate@{cut}"
    data, desc = mutate_bytes(rng, so.data, so.blob_off, so.blob_end, resize=False)
    return data, f"blob-in-file {desc}"


def elf_mutation(rng: random.Random, so: SoCorpus) -> tuple[bytes, str]:
    """The library with its ELF header and program header table mutated (or truncated)."""
    if rng.random() < 0.2:
        cut = rng.randrange(len(so.data))
        return so.data[:cut], f"file truncate@{cut}"
    phoff, phentsize, phnum = struct.unpack_from("<Q", so.data, 32)[0], *struct.unpack_from(
        "<HH", so.data, 54)
    hi = 64 if rng.random() < 0.5 else phoff + phentsize * phnum
    data, desc = mutate_bytes(rng, so.data, 0, hi)
    return data, f"elf-header {desc}"


_FILE_DIR: str | None = None


def _private_tmp() -> str:
    """A private temp folder, removed when the process exits."""
    path = tempfile.mkdtemp(prefix="kiln-fuzz-")
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


def _temp_file(data: bytes) -> str:
    global _FILE_DIR
    if _FILE_DIR is None:
        _FILE_DIR = _private_tmp()
    fd, path = tempfile.mkstemp(dir=_FILE_DIR, suffix=".so")  # a new name: dlopen caches names
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    return path


def _check_file(data: bytes) -> None:
    from kiln.runtime.elf import check_loadable

    path = _temp_file(data)
    try:
        check_loadable(path)
    finally:
        os.unlink(path)


def _load_file(data: bytes) -> None:
    path = _temp_file(data)
    try:
        _create_executor(rt.load_module(path))
    finally:
        os.unlink(path)


# ------------------------------------------------------------------------------ running
class _Timeout(BaseException):
    pass


@dataclass
class Failure:
    index: int
    desc: str
    kind: str  # bug class: exception type and the innermost kiln frame, "crash", "hang"
    message: str


@dataclass
class Report:
    target: str
    seed: int
    cases: int = 0
    failures: list[Failure] = field(default_factory=list)
    seconds: float = 0.0
    replay_args: str = ""  # e.g. "--so path" for the so_* targets

    def classes(self) -> Counter:
        return Counter(f.kind for f in self.failures)

    def summary(self) -> str:
        head = (f"fuzz {self.target} seed={self.seed}: {self.cases} cases, "
                f"{len(self.failures)} failures in {self.seconds:.1f}s")
        lines = [head]
        for kind, n in self.classes().most_common():
            first = next(f for f in self.failures if f.kind == kind)
            lines.append(f"  {n} x {kind}: {first.message[:300]}\n    case {first.index}: "
                         f"{first.desc[:200]}\n    replay: python tests/helpers/fuzz_runtime.py "
                         f"replay {self.target} {self.seed} {first.index} {self.replay_args}")
        return "\n".join(lines)


def case_rng(target: str, seed: int, index: int) -> random.Random:
    rng = random.Random(f"{target}:{seed}:{index}")
    rng.index = index  # type: ignore[attr-defined]
    return rng


def _kiln_frame(tb: Any) -> str:
    where = "?"
    for fs in traceback.extract_tb(tb):
        if f"{os.sep}kiln{os.sep}" in fs.filename and "fuzz_runtime" not in fs.filename:
            where = f"{Path(fs.filename).name}:{fs.name}"
    return where


def classify(exc: BaseException) -> tuple[str, str] | None:
    """None for an acceptable outcome, else (bug class, message)."""
    if isinstance(exc, _Timeout):
        return "hang", f"no result after {CASE_TIMEOUT_S}s"
    if isinstance(exc, KilnError):
        cause = exc.__cause__
        while cause is not None and isinstance(cause, KilnError):
            cause = cause.__cause__
        if cause is None:
            return None
        return (f"masked {type(cause).__name__} at {_kiln_frame(cause.__traceback__)}",
                f"{exc} (from {type(cause).__name__}: {cause})")
    return (f"{type(exc).__name__} at {_kiln_frame(exc.__traceback__)}",
            f"{type(exc).__name__}: {exc}")


def run_case(target: Target, seed: int, index: int) -> Failure | None:
    rng = case_rng(target.name, seed, index)
    func, desc = target.cases(rng)
    alarm = threading.current_thread() is threading.main_thread()
    if alarm:
        def on_alarm(signum: int, frame: Any) -> None:
            raise _Timeout()
        old = signal.signal(signal.SIGALRM, on_alarm)
        signal.setitimer(signal.ITIMER_REAL, CASE_TIMEOUT_S)
    try:
        func()
        return None
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt):
            raise
        verdict = classify(exc)
        return Failure(index, desc, *verdict) if verdict else None
    finally:
        if alarm:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old)


def run(target: Target, seed: int, count: int, start: int = 0, replay_args: str = "") -> Report:
    """Run cases ``start .. start+count-1`` of ``target`` in this process."""
    report = Report(target.name, seed, replay_args=replay_args)
    t0 = time.perf_counter()
    for i in range(start, start + count):
        failure = run_case(target, seed, i)
        report.cases += 1
        if failure:
            report.failures.append(failure)
    report.seconds = time.perf_counter() - t0
    return report


def run_in_workers(target_name: str, seed: int, count: int, so_path: str | None,
                   batch: int = WORKER_BATCH) -> Report:
    """Run the cases in worker processes (``worker`` command), ``batch`` per process, so a
    crash or a hang in native code fails one case instead of the test run."""
    report = Report(target_name, seed, replay_args=f"--so {so_path}" if so_path else "")
    t0 = time.perf_counter()
    # The workers' files go here: a crashed worker cannot clean up after itself.
    work = tempfile.mkdtemp(prefix="kiln-fuzz-")
    try:
        _run_workers(report, target_name, seed, count, so_path, batch, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report.seconds = time.perf_counter() - t0
    return report


def _run_workers(report: Report, target_name: str, seed: int, count: int,
                 so_path: str | None, batch: int, work: str) -> None:
    i, end = 0, count
    while i < end:
        n = min(batch, end - i)
        cmd = [sys.executable, __file__, "worker", target_name, str(seed), str(i), str(n),
               "--tmp", work, *(["--so", so_path] if so_path else [])]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            out, err = proc.communicate(timeout=60 + 2 * CASE_TIMEOUT_S * n)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        if not out:
            raise RuntimeError(f"fuzz worker produced nothing (exit {proc.returncode}): "
                               f"{' '.join(cmd)}\n{err[-2000:]}")
        started, done = None, i
        for line in out.splitlines():
            tag, _, rest = line.partition(" ")
            if tag == "S":
                started = int(rest)
            elif tag == "D":
                idx, _, payload = rest.partition(" ")
                done = int(idx) + 1
                report.cases += 1
                if payload:
                    report.failures.append(Failure(**json.loads(payload)))
        if done >= i + n:
            i = done
            continue
        # The worker died (or hung) in case `started`: record it and go on after it.
        bad = started if started is not None else done
        rng = case_rng(target_name, seed, bad)
        desc = make_targets(so_path)[target_name].cases(rng)[1]
        kind = "hang (killed)" if proc.returncode == -signal.SIGKILL else \
            f"crash (exit {proc.returncode})"
        report.cases += 1
        report.failures.append(Failure(bad, desc, kind, err.strip()[-500:]))
        i = bad + 1


def _worker(target_name: str, seed: int, start: int, count: int, so_path: str | None) -> None:
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    target = make_targets(so_path)[target_name]
    for i in range(start, start + count):
        print(f"S {i}", flush=True)
        f = run_case(target, seed, i)
        print(f"D {i} {json.dumps(f.__dict__) if f else ''}".rstrip(), flush=True)


def main(argv: list[str]) -> int:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("command", choices=("replay", "worker", "run"))
    ap.add_argument("target")
    ap.add_argument("seed", type=int)
    ap.add_argument("start", type=int, help="case index (replay) or first case")
    ap.add_argument("count", type=int, nargs="?", default=1)
    ap.add_argument("--so", help="a good exported .so (so_* targets; built when absent)")
    ap.add_argument("--tmp", help="folder for the mutated files (default: a private one)")
    args = ap.parse_args(argv)
    if args.tmp:
        global _FILE_DIR
        _FILE_DIR = args.tmp
    so = args.so
    if args.target in SO_TARGETS and not so:
        so = build_so(os.path.join(_private_tmp(), "model.so"))
    if args.command == "worker":
        _worker(args.target, args.seed, args.start, args.count, so)
        return 0
    target = make_targets(so)[args.target]
    if args.command == "replay":
        func, desc = target.cases(case_rng(args.target, args.seed, args.start))
        print(f"case {args.start}: {desc}")
        try:
            func()
        except BaseException as exc:  # noqa: BLE001 - show it, then say whether it is a bug
            traceback.print_exc(file=sys.stdout)
            verdict = classify(exc)
            print(f"FAIL: {verdict[0]}" if verdict else "ok: raised KilnError")
            return 1 if verdict else 0
        print("ok: loaded")
        return 0
    report = run(target, args.seed, args.count, args.start, f"--so {so}" if so else "")
    print(report.summary())
    return 1 if report.failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
