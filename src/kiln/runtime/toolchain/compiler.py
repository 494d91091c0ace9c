"""Running the system C compiler: find it, run commands, report failures.

Commands are argument lists (never a shell string) and every one is logged at DEBUG level on the
``kiln`` logger (``KILN_LOG=debug`` shows them). A failing command raises
:class:`ToolchainError` holding the command line and the tool's stderr.

:func:`compile_objects` compiles in parallel (one job per CPU, largest source first) and reuses
objects from the compile cache (:mod:`kiln.runtime.toolchain.compile_cache`) for C sources.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import shlex
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from kiln.errors import ToolchainError
from kiln.native import INCLUDE_DIR, SUPPORT_DIR
from kiln.runtime.toolchain import cc_manifest, compile_cache

log = logging.getLogger("kiln")

#: the support source every library links (INCLUDE_DIR, the one include root, and SUPPORT_DIR
#: are kiln.native's: all shipped C lives there, docs/decisions/030-one-c-tree.md)
BACKEND_C = SUPPORT_DIR / "backend.c"
#: the AMX int8 kernel (docs/decisions/026-amx.md), linked beside backend.c
AMX_C = SUPPORT_DIR / "amx.c"
#: the support sources every host library links: (source, file name in the build folder)
SUPPORT_SOURCES = ((BACKEND_C, "kiln_backend.c"), (AMX_C, "kiln_amx.c"))
#: the support of a source-embedded device's libraries (target ``jit``): its kernels never call
#: the AMX kernel, and the native runtime's device JIT (src/kiln/native/src/rt_jit.c) builds with
#: backend.c alone under the same cache key, so both runtimes share each other's builds
DEVICE_SUPPORT_SOURCES = SUPPORT_SOURCES[:1]

#: flags for each translation unit: -fopenmp-simd makes the codegen's `#pragma omp simd` loops
#: vectorize without any OpenMP runtime (parallel loops run on the support code's own pool)
COMPILE_FLAGS = ("-O3", "-fPIC", "-fopenmp-simd", "-std=gnu99")
#: -Bsymbolic binds the kernels' TVMAPISetLastError and TVMBackendParallelLaunch to *this*
#: library's error buffer and thread pool even if another loaded library exports the same names;
#: -pthread for the pool's threads (a separate libpthread before glibc 2.34)
LINK_FLAGS = ("-shared", "-pthread", "-Wl,-Bsymbolic")
#: libraries every kernel library needs, after the objects (kernels call libm: expf, erff...;
#: without it a library loads into Python, which has libm, but not into a plain C program)
LINK_LIBS = ("-lm",)

#: sources the compiler builds (everything else handed to it goes to the linker as is)
SOURCE_SUFFIXES = (".c", ".S")

_INSTALL_HINT = ("install a C compiler (Debian/Ubuntu: `apt-get install gcc`; Fedora: "
                 "`dnf install gcc`) or point $CC at one")
_MAX_STDERR = 8000


def find_cc() -> list[str]:
    """The C compiler command: ``$CC`` (may hold extra words, e.g. ``ccache gcc``), else the
    first of ``cc``, ``gcc``, ``clang`` on PATH.

    Raises
    ------
    ToolchainError
        If ``$CC`` names no executable, or none of the defaults is on PATH.
    """
    env = os.environ.get("CC", "").strip()
    if env:
        words = shlex.split(env)
        if shutil.which(words[0]) is None:
            raise ToolchainError(f"C compiler $CC={env!r} not found: {_INSTALL_HINT}")
        return words
    for name in ("cc", "gcc", "clang"):
        if shutil.which(name):
            return [name]
    raise ToolchainError(f"no C compiler found (looked for $CC, cc, gcc, clang on PATH): "
                         f"{_INSTALL_HINT}")


def cpu_count() -> int:
    """The CPUs this process may run on (its affinity mask: ``taskset``, a container's
    cpuset), at least 1; the default number of parallel compiles."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def run(cmd: Sequence[str], cwd: str | os.PathLike[str] | None = None) -> str:
    """Run ``cmd`` (an argument list) and return its stdout.

    Raises
    ------
    ToolchainError
        If the program is missing or exits nonzero (message: command line and stderr).
    """
    proc = _run_process(cmd, cwd)
    if proc.stderr.strip():
        log.debug("%s", proc.stderr.strip())
    return proc.stdout


def _run_process(cmd: Sequence[str], cwd: str | os.PathLike[str] | None = None
                 ) -> subprocess.CompletedProcess[str]:
    """:func:`run`, returning the finished process (its stdout and stderr)."""
    cmd = [str(c) for c in cmd]
    line = shlex.join(cmd)
    log.debug("run: %s", line)
    try:
        proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, errors="replace",
                              check=False)
    except FileNotFoundError:
        raise ToolchainError(f"{cmd[0]} not found while running: {line}\n{_INSTALL_HINT}") from None
    except OSError as err:
        raise ToolchainError(f"cannot run {line}: {err}") from None
    if proc.returncode != 0:
        out = (proc.stderr or proc.stdout or "").strip()
        if len(out) > _MAX_STDERR:
            out = "...\n" + out[-_MAX_STDERR:]
        raise ToolchainError(f"command failed (exit {proc.returncode}): {line}\n{out}")
    return proc


@functools.lru_cache(maxsize=16)
def _dump_machine(cc: tuple[str, ...]) -> str | None:
    try:
        return run([*cc, "-dumpmachine"]).strip() or None
    except ToolchainError as err:
        log.debug("%s", err)
        return None


def dump_machine(cc: Sequence[str] | None = None) -> str | None:
    """The target triple of compiler ``cc`` (``cc -dumpmachine``, e.g. ``x86_64-linux-gnu``),
    cached per command; None when the compiler cannot tell (the machine check is then skipped).

    Raises
    ------
    ToolchainError
        If ``cc`` is None and no C compiler is found.
    """
    return _dump_machine(tuple(cc or find_cc()))


#: temporary file names in a compiler's ``-###`` report (gcc: /tmp/ccAbC123.s)
_TEMP_NAME = re.compile(r"\S*/cc[0-9A-Za-z]{6}\.\w+")


@functools.lru_cache(maxsize=32)
def compiler_identity(cc: tuple[str, ...], flags: tuple[str, ...]) -> str | None:
    """What ``cc`` with ``flags`` is: its ``-###`` report for a C compile (version, target,
    configuration, the tools it runs and their expanded options — ``-march=native`` becomes
    this machine's CPU and features), temporary file names blanked; cached per process. None
    when the compiler cannot tell (no such option): its objects are then not cached."""
    cmd = [*cc, *flags, "-###", "-c", "-x", "c", os.devnull, "-o", os.devnull]
    log.debug("run: %s", shlex.join(cmd))
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, errors="replace",
                              check=False)
    except OSError as err:
        log.debug("compile cache off for %s: %s", shlex.join(cc), err)
        return None
    report = (proc.stderr or "") + (proc.stdout or "")
    if proc.returncode != 0 or not report.strip():
        log.debug("compile cache off for %s: -### failed (exit %d)", shlex.join(cc),
                  proc.returncode)
        return None
    return _TEMP_NAME.sub("<tmp>", report)


def object_cache_key(cc: Sequence[str], flags: Sequence[str], source: str) -> str | None:
    """The compile-cache key of compiling C ``source`` with ``cc flags -c``: the compiler's
    identity, the command line without file names and the preprocessed source (``-E -P``:
    every header included, no file names); None when the compiler's identity is unknown or
    the source does not preprocess (the compile then reports the error).

    The preprocessor only runs when the compile cache has no manifest of ``source`` (same
    content, compiler and command line) whose headers and include lookups are unchanged
    (:mod:`kiln.runtime.toolchain.cc_manifest`, ccache's direct mode); a run records one.
    """
    ident = compiler_identity(tuple(cc), tuple(flags))
    if ident is None:
        return None
    command, source = [*cc, *flags], os.path.abspath(source)
    direct = cc_manifest.begin(ident, command, source)
    if direct is not None:
        key = cc_manifest.lookup(direct)
        if key is not None:
            return key
        try:
            with tempfile.TemporaryDirectory(prefix="kiln-deps-") as tmp:
                return _preprocessed_key(ident, command, source, direct, tmp)
        except OSError as err:  # no temporary folder: no manifest
            log.debug("compile cache: no manifest for %s (%s)", source, err)
    return _preprocessed_key(ident, command, source)


def _preprocessed_key(ident: str, command: list[str], source: str,
                      direct: cc_manifest.Direct | None = None, tmp: str = "") -> str | None:
    """The object key from ``command -E -P source``; with ``direct``, the run also writes the
    headers read (``-MD`` into ``tmp``) and the search list (``-v``), recorded as its
    manifest. None when the source does not preprocess."""
    depfile = os.path.join(tmp, "deps")
    # neither -MD nor -v changes the output
    extra = ["-MD", "-MF", depfile, "-MT", "kiln", "-v"] if direct is not None else []
    started = time.time_ns()
    try:
        proc = _run_process([*command, "-E", "-P", *extra, source])
    except ToolchainError:
        # a compiler without those options still gets a key (the error, if any, is the
        # compile's to report)
        return _preprocessed_key(ident, command, source) if extra else None
    key = compile_cache.make_key("kiln-cc-object-v1", ident, shlex.join(command), proc.stdout)
    if direct is not None:
        try:
            with open(depfile, encoding="utf-8", errors="surrogateescape") as f:
                deps = f.read()
        except OSError:
            deps = ""
        cc_manifest.record(direct, key, deps, proc.stderr, started)
    return key


def _compile_one(cc: list[str], flags: list[str], src: str, obj: str, cwd: str | None) -> None:
    """Compile ``src`` to ``obj``, or copy the object from the compile cache."""
    key = None
    if src.endswith(".c") and compile_cache.enabled():
        key = object_cache_key(cc, flags, src)
        hit = compile_cache.load(key, "o", what=src) if key else None
        if hit is not None:
            with open(obj, "wb") as f:
                f.write(hit[0])
            return
    run([*cc, *flags, "-c", src, "-o", obj], cwd=cwd)
    if key:
        with open(obj, "rb") as f:
            compile_cache.store(key, "o", [f.read()], what=src)


def compile_objects(sources: Sequence[str | os.PathLike[str]], cc: Sequence[str] | None = None,
                    options: Sequence[str] = (), jobs: int | None = None,
                    flags: Sequence[str] = COMPILE_FLAGS) -> list[str]:
    """Compile each source (``.c`` or ``.S``) to an object next to it, in parallel, with
    ``cc flags -I<kiln include> options`` (``flags``: default :data:`COMPILE_FLAGS`; a device
    compiler passes its own).

    ``jobs`` compilers run at once (default: :func:`cpu_count`), the largest sources first. The
    object of a C source is taken from the compile cache when the compiler, the flags and the
    preprocessed source are the same as a previous compile's
    (:mod:`kiln.runtime.toolchain.compile_cache`; hits are logged; the preprocessor is skipped when
    the
    source and its headers are unchanged: :func:`object_cache_key`). An assembler source
    (``.S``) is never cached (``.incbin`` data is not in its text) and is assembled in its own
    folder, so ``.incbin "devc.bin"`` finds the file beside it wherever the folder was unpacked
    (a ``.tar`` export).

    Returns
    -------
    list of str
        The object paths, in the order of ``sources``.

    Raises
    ------
    ToolchainError
        The first failure (with its command and stderr).
    """
    cc = list(cc or find_cc())
    flags = [*flags, f"-I{INCLUDE_DIR}", *options]
    # "<name>.<ext>.o": devc.c and devc.S must not both become devc.o
    srcs = [os.path.abspath(s) for s in sources]
    objs = [f"{s}.o" for s in srcs]
    dirs = [os.path.dirname(s) if s.endswith(".S") else None for s in srcs]
    jobs_args = [(cc, flags, s, o, d) for s, o, d in zip(srcs, objs, dirs, strict=True)]
    workers = max(1, min(len(jobs_args), jobs or cpu_count()))
    if workers == 1:
        for a in jobs_args:
            _compile_one(*a)
    else:
        # Largest first, so a big file does not start last and leave the other workers idle.
        order = sorted(jobs_args, key=lambda a: -_size(a[2]))
        with ThreadPoolExecutor(workers) as pool:
            for fut in [pool.submit(_compile_one, *a) for a in order]:
                fut.result()
    return objs


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def link_shared(objects: Sequence[str], output: str, cc: Sequence[str] | None = None,
                options: Sequence[str] = (), flags: Sequence[str] = LINK_FLAGS) -> None:
    """Link ``objects`` into the shared library ``output`` (``cc flags -o output objects
    options -lm``; ``flags``: default :data:`LINK_FLAGS`).

    Raises
    ------
    ToolchainError
        If the linker fails.
    """
    cc = list(cc or find_cc())
    run([*cc, *flags, "-o", output, *objects, *options, *LINK_LIBS])


def build_atomic(output: str | os.PathLike[str], build: Callable[[str], None]) -> None:
    """``build(tmp)`` writes a file at ``tmp``, a private name beside ``output``, which is then
    renamed into place: processes building the same cached file at once never see a partial
    one, and a failed build leaves ``output`` untouched (the temp file is removed).

    Raises
    ------
    ToolchainError
        Whatever ``build`` raises.
    """
    out = Path(output)
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp")
    os.close(fd)
    try:
        build(tmp)
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def link_shared_atomic(objects: Sequence[str], output: str | os.PathLike[str],
                       cc: Sequence[str] | None = None, options: Sequence[str] = (),
                       flags: Sequence[str] = LINK_FLAGS) -> None:
    """:func:`link_shared` through :func:`build_atomic`.

    Raises
    ------
    ToolchainError
        If the linker fails (``output`` is then untouched).
    """
    build_atomic(output, lambda tmp: link_shared(objects, tmp, cc, options, flags))


def link_relocatable(objects: Sequence[str], output: str, cc: Sequence[str] | None = None
                     ) -> None:
    """Merge ``objects`` into one relocatable object ``output`` (``cc -r``: an ``.o`` that a
    later link turns into a library).

    Raises
    ------
    ToolchainError
        If the linker fails.
    """
    cc = list(cc or find_cc())
    run([*cc, "-r", "-nostdlib", "-o", output, *objects])
