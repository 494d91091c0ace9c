"""``LibraryModule``: the functions of a dlopen'ed shared library (TVM's ``DSOLibrary`` /
``LibraryModuleNode``, src/runtime/dso_library.cc and library_module.cc).

Functions are found by ``dlsym`` and wrapped as C :class:`PackedFunc` objects that read errors
through this library's own ``TVMGetLastError``. Only names listed in the data symbol
``__kiln_func_names`` (NUL-separated, ended by an extra NUL; written by ``export_library``) are
served, so a lookup can never return an unrelated C symbol such as ``malloc`` with the wrong
signature. Libraries without the list (not built by Kiln) serve any symbol.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import tempfile
import threading
from collections.abc import Sequence
from typing import Any

from kiln.errors import ModuleLoadError
from kiln.runtime.module import Module
from kiln.runtime.packed_func import PackedFunc

FUNC_NAMES_SYMBOL = "__kiln_func_names"
_MAX_NAMES = 1 << 20  # bound on the names scan of a corrupt list


#: realpath → identity (device, inode, mtime) of the file dlopen'ed under that name
_OPENED: dict[str, tuple[int, int, int]] = {}
_OPENED_LOCK = threading.Lock()


def dlopen_current(path: str) -> ctypes.CDLL:
    """``dlopen`` the file at ``path`` as it is *now* (``RTLD_LOCAL``).

    glibc returns the object it already loaded under a name even when the file was replaced
    since (a model re-exported to the same path in one process would run the old code and read
    the old blob). When this process loaded another file under ``path`` before, the current one
    is opened through a link (or copy) under a fresh private name, then the name is removed (the
    mapping outlives it).

    Raises
    ------
    ModuleLoadError
        If ``dlopen`` fails (its message included).
    """
    real = os.path.realpath(path)
    try:
        st = os.stat(real)
        ident = (st.st_dev, st.st_ino, st.st_mtime_ns)
    except OSError as err:
        raise ModuleLoadError(f"cannot dlopen {path}: {err.strerror}") from None
    with _OPENED_LOCK:
        seen = _OPENED.setdefault(real, ident)
        if seen == ident:
            return _dlopen(real, path)
        folder = tempfile.mkdtemp(prefix="kiln-dlopen-")
        try:
            alias = os.path.join(folder, os.path.basename(real))
            try:
                os.link(real, alias)
            except OSError:
                shutil.copyfile(real, alias)
            return _dlopen(alias, path)
        finally:
            shutil.rmtree(folder, ignore_errors=True)


def _dlopen(file: str, shown: str) -> ctypes.CDLL:
    try:
        return ctypes.CDLL(file, mode=os.RTLD_LOCAL)
    except OSError as err:
        raise ModuleLoadError(f"cannot dlopen {shown}: {err}") from None


def read_func_names(lib: ctypes.CDLL) -> list[str] | None:
    """The names in ``__kiln_func_names``, or None when the library has no such symbol."""
    try:
        addr = ctypes.addressof(ctypes.c_char.in_dll(lib, FUNC_NAMES_SYMBOL))
    except ValueError:
        return None
    names: list[str] = []
    for _ in range(_MAX_NAMES):
        raw = ctypes.string_at(addr)
        if not raw:
            return names
        names.append(raw.decode(errors="replace"))
        addr += len(raw) + 1
    raise ModuleLoadError(f"{FUNC_NAMES_SYMBOL}: list is not terminated")


class LibraryModule(Module):
    """Packed functions of a shared library.

    Parameters
    ----------
    path : str
        The shared library; opened with ``RTLD_LOCAL`` so two models' symbols never mix, as
        the file is now (:func:`dlopen_current`).
    func_names : sequence of str, optional
        The functions to serve; default: the library's ``__kiln_func_names``.
    lib : ctypes.CDLL, optional
        An already opened handle for ``path``.

    Raises
    ------
    ModuleLoadError
        If ``dlopen`` fails (its message included).
    """

    type_key = "library"

    def __init__(self, path: str, func_names: Sequence[str] | None = None,
                 lib: ctypes.CDLL | None = None):
        super().__init__()
        self.path = str(path)
        lib = lib if lib is not None else dlopen_current(self.path)
        self._lib = lib
        names = list(func_names) if func_names is not None else read_func_names(lib)
        self._names: set[str] | None = set(names) if names is not None else None
        self._ordered = names or []
        self._cache: dict[str, PackedFunc] = {}
        self._get_last_error: Any = None
        try:
            get_err = lib.TVMGetLastError
            get_err.restype = ctypes.c_char_p
            get_err.argtypes = []
            self._get_last_error = get_err
        except AttributeError:
            pass  # not a Kiln/TVM library: errors come without a message

    def _get_own_function(self, name: str) -> PackedFunc | None:
        func = self._cache.get(name)
        if func is not None:
            return func
        if self._names is not None and name not in self._names:
            return None
        try:
            addr = ctypes.cast(getattr(self._lib, name), ctypes.c_void_p).value
        except AttributeError:
            return None
        if not addr:
            return None
        func = PackedFunc(addr, name, self._get_last_error, keepalive=self)
        self._cache[name] = func
        return func

    def list_function_names(self) -> list[str]:
        return list(self._ordered)

    @property
    def handle(self) -> ctypes.CDLL:
        """The ``ctypes.CDLL`` (kept open while this module lives)."""
        return self._lib

    def __repr__(self) -> str:
        return f"<kiln.runtime.LibraryModule {self.path} functions={len(self._ordered)}>"


class LibraryFileModule(Module):
    """The ``_lib`` of a library read from its file without loading it
    (:func:`kiln.runtime.load.read_library`, for ``kiln inspect``): it lists the functions of
    ``__kiln_func_names`` but serves none (its code is not mapped, and may be another
    machine's).

    Parameters
    ----------
    path : str
        The library file.
    func_names : list of str
        The names its ``__kiln_func_names`` lists.
    """

    type_key = "library"

    def __init__(self, path: str, func_names: Sequence[str]):
        super().__init__()
        self.path = path
        self.func_names = list(func_names)

    def _get_own_function(self, name: str) -> PackedFunc | None:
        return None

    def list_function_names(self) -> list[str]:
        return list(self.func_names)

    def __repr__(self) -> str:
        return f"<kiln.runtime.LibraryFileModule {self.path!r} (not loaded)>"


class JitLibraryMixin:
    """For modules that hold code (C source, an object) and serve its functions by building a
    shared library on first use: subclasses set ``func_names`` and ``_jit = None`` and define
    ``_build_library() -> path`` (cached by content)."""

    func_names: list[str]
    _jit: LibraryModule | None

    def _build_library(self) -> str:
        raise NotImplementedError

    def _get_own_function(self, name: str) -> PackedFunc | None:
        if name not in self.func_names:
            return None
        if self._jit is None:
            self._jit = LibraryModule(self._build_library(), self.func_names)
        return self._jit._get_own_function(name)
