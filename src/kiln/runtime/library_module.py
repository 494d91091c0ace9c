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
from collections.abc import Sequence
from typing import Any

from kiln.errors import ModuleLoadError
from kiln.runtime.module import Module
from kiln.runtime.packed_func import PackedFunc

FUNC_NAMES_SYMBOL = "__kiln_func_names"
_MAX_NAMES = 1 << 20  # bound on the names scan of a corrupt list


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
        The shared library; opened with ``RTLD_LOCAL`` so two models' symbols never mix.
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
        if lib is None:
            try:
                lib = ctypes.CDLL(self.path, mode=os.RTLD_LOCAL)
            except OSError as err:
                raise ModuleLoadError(f"cannot dlopen {self.path}: {err}") from None
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
