"""``CSourceModule``: generated C source, DSO-exportable (TVM's ``CSourceModuleNode``,
src/target/source/source_module.cc, type_key ``c``).

The code is one complete C translation unit that includes ``<kiln/c_runtime_api.h>``; it runs
parallel work with ``TVMBackendParallelLaunch`` (the support code's thread pool) and may use
``#pragma omp simd`` (compiled with ``-fopenmp-simd``: no OpenMP runtime is linked, so
``#pragma omp parallel`` is ignored). ``export_library`` compiles it into the shared object.
Before export ``get_function`` still works: the source (plus the backend support file) is compiled
into a
private shared library cached by content hash, so a freshly built module runs immediately.
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from kiln.runtime.library_module import JitLibraryMixin, LibraryModule
from kiln.runtime.module import Module
from kiln.runtime.toolchain import cache_limit
from kiln.runtime.toolchain import compiler as toolchain
from kiln.runtime.toolchain.private_dir import jit_cache_path, private_dir


def cache_dir() -> Path:
    """Where JIT-compiled sources are cached: ``$KILN_CACHE_DIR`` or a per-user temp folder
    (``<tmp>/kiln-cache-<uid>``), created ``0700``. The libraries there are loaded as code, so
    a folder that is not private (a symlink, another owner, writable by others) is not used:
    see :func:`kiln.runtime.toolchain.private_dir.private_dir`."""
    return private_dir(jit_cache_path(), "cache")


def build_cached_library(kind: str, key_parts: Sequence[bytes],
                         objects: Callable[[Path], list[str]],
                         link_options: Sequence[str] = (), cc: Sequence[str] | None = None,
                         flags: Sequence[str] = toolchain.COMPILE_FLAGS,
                         link_flags: Sequence[str] = toolchain.LINK_FLAGS,
                         folder: Path | None = None,
                         support: Sequence[tuple[Path, str]] = toolchain.SUPPORT_SOURCES) -> str:
    """A shared library of ``objects(workdir)`` plus the backend support, cached in ``folder``
    (default :func:`cache_dir`) under a hash of ``key_parts``, the backend source, the compiler
    (its command and :func:`~kiln.runtime.toolchain.compiler.compiler_identity`: version, target,
    configuration) and the flags; built once (linked to a private name, then renamed) and
    reused by every process. A hit refreshes the library's modification time and a build may
    trim the caches to ``KILN_CACHE_MAX_SIZE`` (:mod:`kiln.runtime.toolchain.cache_limit`: least
    recently used first). Returns its path.

    Parameters
    ----------
    kind : str
        File name prefix (``csource``, ``object``, ``device``).
    key_parts : sequence of bytes
        What the objects are made of (source, options).
    objects : callable
        ``objects(workdir) -> [object paths]``: compiles the module's own code (on a miss).
    link_options : sequence of str
        Libraries after the objects (``-lopenblas``).
    cc : sequence of str, optional
        The compiler (default :func:`~kiln.runtime.toolchain.compiler.find_cc`); also builds the
        support.
    flags, link_flags : sequence of str
        Compile flags of the support source and link flags (defaults: the host's
        ``COMPILE_FLAGS``, ``LINK_FLAGS``; a device compiler passes its own).
    folder : Path, optional
        The cache folder (a private one: :func:`kiln.runtime.toolchain.private_dir.private_dir`).
    support : sequence of (Path, str)
        The support sources compiled and linked with the objects (and hashed into the key):
        :data:`~kiln.runtime.toolchain.compiler.SUPPORT_SOURCES`, or ``DEVICE_SUPPORT_SOURCES``.

    Raises
    ------
    ToolchainError
        If the compiler is missing or fails.
    KilnError
        If ``KILN_CACHE_MAX_SIZE`` is not a size.
    """
    cc = list(cc) if cc else toolchain.find_cc()
    ident = toolchain.compiler_identity(tuple(cc), tuple(flags)) or ""
    key = hashlib.sha256()
    for part in (*key_parts, *(src.read_bytes() for src, _ in support),
                 " ".join(cc).encode(),
                 ident.encode(), " ".join([*flags, *link_flags, *toolchain.LINK_LIBS]).encode(),
                 " ".join(link_options).encode()):
        key.update(part)
        key.update(b"\0")
    target = (folder or cache_dir()) / f"{kind}-{key.hexdigest()[:32]}.so"
    if target.exists():
        cache_limit.touch(target)
        return str(target)
    work = Path(tempfile.mkdtemp(prefix="kiln-jit-"))
    try:
        copies = [work / name for _, name in support]
        for (source, _), copy in zip(support, copies):
            shutil.copyfile(source, copy)
        objs = objects(work) + toolchain.compile_objects(copies, cc, flags=flags)
        toolchain.link_shared_atomic(objs, target, cc, link_options, link_flags)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    cache_limit.note_stored(target)
    return str(target)


class CSourceModule(JitLibraryMixin, Module):
    """C source of packed functions.

    Parameters
    ----------
    code : str
        A complete C translation unit defining each function in ``func_names`` with the packed
        ABI (``TVMBackendPackedCFunc``), exported with default visibility.
    func_names : list of str
        The packed functions the code defines.
    type_key : str
        ``"c"``.
    compile_options : list of str, optional
        Flags for compiling this source, from the target (e.g. ``-march=native`` for
        ``Target("c -mcpu=native")``); ``export_library`` and the JIT both use them.
    link_options : list of str, optional
        Libraries the code needs at link time (e.g. ``["-L/usr/lib/...", "-lopenblas"]`` of an
        external codegen); ``export_library`` links the shared object with them (after the
        objects) and so does the JIT. A ``.tar`` or ``.o`` export does not record them: the
        relink in ``load_module`` would miss the library (a load error naming the symbol).
    """

    is_dso_exportable = True
    export_suffix = "c"

    def __init__(self, code: str, func_names: Sequence[str], type_key: str = "c",
                 compile_options: Sequence[str] = (), link_options: Sequence[str] = ()):
        super().__init__()
        self.code = code
        self.compile_options = list(compile_options)
        self.link_options = list(link_options)
        self.func_names = list(func_names)
        self.type_key = type_key
        self._jit: LibraryModule | None = None

    def get_source(self, fmt: str = "") -> str:
        return self.code

    def list_function_names(self) -> list[str]:
        return list(self.func_names)

    def _build_library(self) -> str:
        """Compile to a cached shared library; returns its path.

        Raises
        ------
        ToolchainError
            If the compiler is missing or rejects the code.
        """

        def objects(work: Path) -> list[str]:
            src = work / "lib0.c"
            src.write_text(self.code)
            return toolchain.compile_objects([src], toolchain.find_cc(), self.compile_options)

        parts = (self.code.encode(), " ".join(self.compile_options).encode())
        return build_cached_library("csource", parts, objects, self.link_options)

    def __repr__(self) -> str:
        return (f"<kiln.runtime.CSourceModule type_key={self.type_key!r} "
                f"functions={len(self.func_names)} imports={len(self._imports)}>")
