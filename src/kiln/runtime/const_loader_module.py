"""The const loader (metadata) module: constants for external modules, handed over once before
first use (TVM's src/runtime/const_loader_module.cc, and ``CreateMetadataModule`` in
src/target/metadata_module.cc for the build side).

An external (BYOC) module that needs constants declares ``get_symbol() -> str``,
``get_const_vars() -> [str]`` and ``__init_<symbol>``. The const loader (type_key
``const_loader``; TVM's older ``metadata`` loads too) holds the named constants and imports
``[target_module, *ext_modules]``. The first time ``<symbol>`` is looked up through it, it calls
``__init_<symbol>`` once with the constants, then forwards the lookup to its imports.
**Kiln:** the constants are passed as separate :class:`NDArray` arguments in ``get_const_vars``
order (the packed C ABI has no array object, so a C module can take them as ``DLTensor``\\ s);
a missing ``__init_<symbol>`` is an error rather than silently skipped.

Serialized form (docs/formats.md §7)::

    vec<string> variables | u64 n | n × NDArray | vec<string> symbols | u64 m | m × vec<string>
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence

import numpy as np

from kiln.errors import KilnError
from kiln.runtime.binary_module import register_module_loader
from kiln.runtime.module import Module, modules_dfs
from kiln.runtime.ndarray import NDArray
from kiln.runtime.packed_func import PackedFunc
from kiln.runtime.params import read_ndarray, to_ndarray_dict, write_ndarray
from kiln.runtime.stream import StreamReader, StreamWriter

TYPE_KEY = "const_loader"
#: the key TVM wrote before the rename; its artifacts load with the same loader
OLD_TYPE_KEY = "metadata"
INIT_PREFIX = "__init_"


class ConstLoaderModule(Module):
    """Holds constants of external modules and initializes each one before its first use.

    Parameters
    ----------
    const_var_ndarray : mapping of str to array
        Every constant by name.
    const_vars_by_symbol : mapping of str to list of str
        For each external symbol, the constants its ``__init_<symbol>`` receives, in order.

    Raises
    ------
    KilnError
        A symbol names a constant that ``const_var_ndarray`` lacks.
    """

    type_key = TYPE_KEY
    is_binary_serializable = True

    def __init__(self, const_var_ndarray: Mapping[str, np.ndarray | NDArray],
                 const_vars_by_symbol: Mapping[str, Sequence[str]]):
        super().__init__()
        self._consts: dict[str, NDArray] = to_ndarray_dict(const_var_ndarray)
        self._by_symbol = {str(s): [str(v) for v in vs] for s, vs in const_vars_by_symbol.items()}
        for symbol, names in self._by_symbol.items():
            missing = [v for v in names if v not in self._consts]
            if missing:
                raise KilnError(f"{TYPE_KEY}: symbol {symbol!r} needs constants {missing} that "
                                f"are not given (have: {sorted(self._consts)})")
        self._initialized = dict.fromkeys(self._by_symbol, False)
        self._lock = threading.Lock()

    @property
    def const_var_ndarray(self) -> dict[str, NDArray]:
        """The constants by name (a copy of the mapping)."""
        return dict(self._consts)

    @property
    def const_vars_by_symbol(self) -> dict[str, list[str]]:
        """For each symbol, the names of its constants (a copy)."""
        return {s: list(v) for s, v in self._by_symbol.items()}

    def _get_own_function(self, name: str) -> PackedFunc | None:
        # Every lookup is forwarded to the imports, after initializing ``name``'s module once.
        if self._initialized.get(name) is False:
            with self._lock:
                if not self._initialized[name]:
                    self._init_symbol(name)
                    self._initialized[name] = True
        return self._find_in_imports(name)

    def _init_symbol(self, symbol: str) -> None:
        init_name = INIT_PREFIX + symbol
        for m in modules_dfs(self)[1:]:
            init = m._get_own_function(init_name)
            if init is not None:
                break
        else:
            raise KilnError(f"{TYPE_KEY}: no imported module defines {init_name!r} to receive "
                            f"the constants of symbol {symbol!r}")
        arrays = [self._consts[v] for v in self._by_symbol[symbol]]
        try:
            ret = init(*arrays)
        except KilnError:
            raise
        except Exception as err:
            raise KilnError(f"{TYPE_KEY}: {init_name} failed: {err!r}") from err
        if ret not in (None, 0):
            raise KilnError(f"{TYPE_KEY}: {init_name} returned {ret!r} (expected 0)")

    def save_to_binary(self) -> bytes:
        w = StreamWriter()
        names = list(self._consts)
        w.vec_str(names)
        w.u64(len(names))
        for n in names:
            write_ndarray(w, self._consts[n])
        symbols = list(self._by_symbol)
        w.vec_str(symbols)
        w.u64(len(symbols))
        for s in symbols:
            w.vec_str(self._by_symbol[s])
        return w.getvalue()

    @staticmethod
    def load_from_binary(data: bytes) -> ConstLoaderModule:
        """Inverse of :meth:`save_to_binary` (also reads TVM's ``metadata`` bytes).

        Raises
        ------
        ModuleLoadError
            Truncated or corrupt bytes (counts that disagree, duplicate names, a symbol naming
            an unknown constant).
        """
        r = StreamReader(data, f"{TYPE_KEY} module")
        names = r.vec_str("variables")
        n = r.u64("constant count")
        if n != len(names) or len(set(names)) != len(names):
            raise r.error(f"corrupt: {n} constants for {len(names)} variable names "
                          f"({len(set(names))} distinct)")
        consts = {name: read_ndarray(r, f"constant {name!r}") for name in names}
        symbols = r.vec_str("symbols")
        m = r.u64("symbol count")
        if m != len(symbols) or len(set(symbols)) != len(symbols):
            raise r.error(f"corrupt: {m} constant lists for {len(symbols)} symbols "
                          f"({len(set(symbols))} distinct)")
        by_symbol = {s: r.vec_str(f"constants of symbol {s!r}") for s in symbols}
        if r.remaining:
            raise r.error(f"{r.remaining} unexpected trailing bytes")
        try:
            return ConstLoaderModule(consts, by_symbol)
        except KilnError as err:
            raise r.error(f"corrupt: {err}") from None

    def __repr__(self) -> str:
        return (f"<kiln.runtime.ConstLoaderModule constants={len(self._consts)} "
                f"symbols={list(self._by_symbol)} imports={len(self._imports)}>")


def _const_vars_of(m: Module) -> tuple[str, list[str]] | None:
    get_symbol = m.get_function("get_symbol", query_imports=False)
    get_vars = m.get_function("get_const_vars", query_imports=False)
    if get_symbol is None or get_vars is None:
        return None
    names = get_vars()
    if not isinstance(names, (list, tuple)):
        raise KilnError(f"module '{m.type_key}': get_const_vars() returned "
                        f"{type(names).__name__}, not a list of constant names")
    return str(get_symbol()), [str(v) for v in names]


def create_metadata_module(params: Mapping[str, np.ndarray | NDArray], target_module: Module,
                           ext_modules: Sequence[Module] = ()) -> Module:
    """Attach external modules to the target module, through a const loader only when one of
    them needs constants (TVM's ``CreateMetadataModule``; the rule of apache/tvm PR #7398).

    Parameters
    ----------
    params : mapping of str to array
        The constants external modules may ask for by name (only those asked for are kept).
    target_module : Module
        The host module (e.g. the C source module of the kernels); modules it already imports
        are inspected too.
    ext_modules : list of Module
        External (BYOC) modules to attach.

    Returns
    -------
    Module
        ``target_module`` itself, now importing ``ext_modules``, when no module declares
        non-empty ``get_const_vars`` (a tree without such modules is returned unchanged);
        otherwise a new :class:`ConstLoaderModule` importing ``[target_module, *ext_modules]``
        — the module to give the graph executor factory as its ``lib``.

    Raises
    ------
    KilnError
        Two modules declare the same symbol, or a declared constant is not in ``params``.
    """
    by_symbol: dict[str, list[str]] = {}
    seen: set[int] = set()
    for root in (*ext_modules, target_module):
        for m in modules_dfs(root):
            if id(m) in seen:
                continue
            seen.add(id(m))
            declared = _const_vars_of(m)
            if declared is None or not declared[1]:
                continue
            symbol, names = declared
            if symbol in by_symbol:
                raise KilnError(f"create_metadata_module: symbol {symbol!r} is declared by two "
                                f"modules (the second: '{m.type_key}')")
            by_symbol[symbol] = names
    if not by_symbol:
        for m in ext_modules:
            target_module.import_module(m)
        return target_module
    needed = dict.fromkeys(v for names in by_symbol.values() for v in names)
    missing = [v for v in needed if v not in params]
    if missing:
        raise KilnError(f"create_metadata_module: constants {missing} (of symbols "
                        f"{[s for s, vs in by_symbol.items() if set(vs) & set(missing)]}) are "
                        "not in params")
    loader = ConstLoaderModule({v: params[v] for v in needed}, by_symbol)
    loader.import_module(target_module)
    for m in ext_modules:
        loader.import_module(m)
    return loader


register_module_loader(TYPE_KEY, ConstLoaderModule.load_from_binary, aliases=[OLD_TYPE_KEY],
                       override=True, zero_copy=True)

__all__ = ["ConstLoaderModule", "create_metadata_module"]
