"""``Module``: a node of the runtime module tree (TVM's ``runtime::ModuleNode`` /
``python/tvm/runtime/module.py``).

A module owns functions (``get_function``) and imports other modules; lookups fall back to the
imports depth-first. Two export properties decide how ``export_library`` ships a module:
*DSO-exportable* modules (``c``, ``llvm``) are saved as ``lib<i>.<export_suffix>`` — C source
(``"c"``) that the exporter compiles, or a ready relocatable object (``"o"``) that it hands to
the linker as is — and linked into the shared object; *binary-serializable* ones write
``save_to_binary()`` bytes that go into ``__tvm_dev_mblob`` and are rebuilt at load time by the
global function ``runtime.module.loadbinary_<type_key>`` (user types: ``binary_module.py``).
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
    #: what ``export_library`` saves a DSO-exportable module as, and how it is built: "c" (the
    #: default; :meth:`save` writes :meth:`get_source`, the exporter compiles it with the Kiln
    #: include path) or "o" (the subclass overrides :meth:`save` to write a relocatable ELF
    #: object, passed straight to the linker after a machine check)
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
        return self._find_in_imports(name)

    def _find_in_imports(self, name: str) -> PackedFunc | None:
        """The own function ``name`` of the first module below this one, depth-first."""
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
            Naming the function and the module's type_key, and adding the module's
            :meth:`missing_function_hint`.
        """
        if not isinstance(name, str):
            raise KilnError(f"module function name must be a str, got {type(name).__name__}")
        func = self.get_function(name)
        if func is None:
            hint = self.missing_function_hint(name)
            raise KilnError(f"module '{self.type_key}' (and its imports) has no function "
                            f"{name!r}" + (f": {hint}" if hint else ""))
        return func

    def missing_function_hint(self, name: str) -> str:
        """What :meth:`__getitem__`'s error adds when ``name`` is missing ("" for nothing).

        The roots of exported libraries say which executor their library is for and how to
        run it, since asking a VM library for the graph executor's ``default`` (or the reverse)
        is the usual way to meet this error.
        """
        return ""

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
            If the module has neither, or declares ``export_suffix`` "o" without overriding
            this method to write its object.
        """
        if self.is_dso_exportable and self.export_suffix == "o":
            raise KilnError(f"module '{self.type_key}' declares export_suffix 'o' but does not "
                            "override save() to write its object file")
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
        """Export this module tree as one shared library, relocatable object or tar (by
        ``fcompile.output_format``, else the suffix ``.so``/``.o``/``.tar``; see
        ``kiln.runtime.export.export_library``).

        Raises
        ------
        ToolchainError
            If the C compiler is missing or fails, or an object is built for another machine
            (no file is left at ``file_name``).
        KilnError
            If a module in the tree can be neither linked nor serialized, or the output format
            cannot be told.
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
