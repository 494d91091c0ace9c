"""``Module``: a node of the runtime module tree (TVM's ``runtime::ModuleNode`` /
``python/tvm/runtime/module.py``).

A module owns functions (``get_function``) and imports other modules; lookups fall back to the
imports depth-first. Two export properties decide how ``export_library`` ships a module:
*DSO-exportable* modules (``c``) are compiled and linked into the shared object;
*binary-serializable* ones write ``save_to_binary()`` bytes that go into ``__tvm_dev_mblob`` and
are rebuilt at load time by the global function ``runtime.module.loadbinary_<type_key>``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from kiln.errors import KilnError
from kiln.runtime.packed_func import PackedFunc


class Module:
    """Base runtime module.

    Subclasses set :attr:`type_key` and override :meth:`_get_own_function` (and
    :meth:`save_to_binary` when binary-serializable, or set :attr:`is_dso_exportable`).
    """

    type_key = "module"
    #: compiled and linked into the exported shared object
    is_dso_exportable = False
    #: ``save_to_binary`` works; the module goes into the blob
    is_binary_serializable = False
    #: file suffix a DSO-exportable module is saved under by ``export_library`` ("c" or "o")
    export_suffix = ""

    def __init__(self) -> None:
        self._imports: list[Module] = []

    # -- imports
    @property
    def imported_modules(self) -> list[Module]:
        """The modules this one imports (a copy of the list)."""
        return list(self._imports)

    def import_module(self, module: Module) -> None:
        """Add ``module`` to the imports (TVM's ``Module.import_module``).

        Raises
        ------
        KilnError
            If ``module`` is not a Module or importing it would create a cycle.
        """
        if not isinstance(module, Module):
            raise KilnError(f"import_module: expected a Module, got {type(module).__name__}")
        if module is self or any(m is self for m in module._walk()):
            raise KilnError(f"import_module: importing {module.type_key} into {self.type_key} "
                            "would create a cycle")
        self._imports.append(module)

    def _walk(self) -> Iterator[Module]:
        """This module, then every module it reaches, depth-first, each once."""
        seen: set[int] = set()
        stack: list[Module] = [self]
        while stack:
            m = stack.pop()
            if id(m) in seen:
                continue
            seen.add(id(m))
            yield m
            stack.extend(reversed(m._imports))

    # -- functions
    def _get_own_function(self, name: str) -> PackedFunc | None:
        return None

    def get_function(self, name: str, query_imports: bool = True) -> PackedFunc | None:
        """The function ``name`` of this module, else (when ``query_imports``) of its imports,
        depth-first; None when no module has it."""
        func = self._get_own_function(name)
        if func is not None or not query_imports:
            return func
        for m in self._walk():
            if m is not self:
                func = m._get_own_function(name)
                if func is not None:
                    return func
        return None

    def __getitem__(self, name: str) -> PackedFunc:
        """``get_function(name)``, raising if missing.

        Raises
        ------
        KilnError
            Naming the function and the module's type_key.
        """
        if not isinstance(name, str):
            raise KilnError(f"module function name must be a str, got {type(name).__name__}")
        func = self.get_function(name)
        if func is None:
            raise KilnError(f"module '{self.type_key}' (and its imports) has no function "
                            f"{name!r}")
        return func

    def __contains__(self, name: str) -> bool:
        return self.get_function(name) is not None

    def list_function_names(self) -> list[str]:
        """Names of this module's own functions (where known)."""
        return []

    # -- serialization / source
    def save_to_binary(self) -> bytes:
        """The module's bytes for the blob (binary-serializable modules only).

        Raises
        ------
        KilnError
            If the module is not binary-serializable.
        """
        raise KilnError(f"module '{self.type_key}' is not binary-serializable")

    def get_source(self, fmt: str = "") -> str:
        """The module's source code, or "" when it has none."""
        return ""

    def save(self, path: str, fmt: str = "") -> None:
        """Write the module alone: its source (DSO modules) or ``save_to_binary`` bytes.

        Raises
        ------
        KilnError
            If the module has neither.
        """
        if self.is_dso_exportable:
            with open(path, "w") as f:
                f.write(self.get_source(fmt))
        elif self.is_binary_serializable:
            with open(path, "wb") as f:
                f.write(self.save_to_binary())
        else:
            raise KilnError(f"module '{self.type_key}' cannot be saved")

    def export_library(self, file_name: str, fcompile: Any = None,
                       options: Sequence[str] | None = None, **kwargs: Any) -> None:
        """Export this module tree as one shared library (see ``kiln.runtime.export``).

        Raises
        ------
        ToolchainError
            If the C compiler is missing or fails (no file is left at ``file_name``).
        KilnError
            If a module in the tree can be neither linked nor serialized.
        """
        from kiln.runtime.export import export_library

        export_library(self, file_name, fcompile=fcompile, options=options, **kwargs)

    def __repr__(self) -> str:
        return f"<kiln.runtime.Module type_key={self.type_key!r} imports={len(self._imports)}>"


class PyFunctionModule(Module):
    """A module whose functions are Python callables (executors, factories, tests)."""

    type_key = "py"

    def __init__(self, functions: dict[str, Any] | None = None):
        super().__init__()
        self._functions: dict[str, PackedFunc] = {}
        for name, fn in (functions or {}).items():
            self.add_function(name, fn)

    def add_function(self, name: str, fn: Any) -> None:
        self._functions[name] = fn if isinstance(fn, PackedFunc) else PackedFunc(fn, name)

    def _get_own_function(self, name: str) -> PackedFunc | None:
        return self._functions.get(name)

    def list_function_names(self) -> list[str]:
        return list(self._functions)


def modules_dfs(root: Module) -> list[Module]:
    """Every module reachable from ``root``, depth-first pre-order (root first), each once."""
    return list(root._walk())
