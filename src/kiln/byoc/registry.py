"""The BYOC registries: pattern tables, per-op support predicates and external codegens, by
compiler name (TVM: ``relay.op.contrib.register_pattern_table``, the ``target.<compiler>`` op
attributes of ``tvm.ir.register_op_attr``, and the ``relay.ext.<compiler>`` global functions).

Everything here is plain data that a user fills from their own module, without editing Kiln;
``kiln.byoc.partition_for`` and ``kiln.build(..., byoc=[...])`` read it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from kiln.errors import CompileError

#: a pattern table entry: (composite name "<compiler>.<what>", pattern, check(root) or None)
PatternTable = Sequence[tuple]
Predicate = Callable[[Any], bool]


@dataclass
class Compiler:
    """What is registered for one external compiler."""

    name: str
    pattern_table: Callable[[], PatternTable] | None = None
    op_support: dict[str, Predicate] = field(default_factory=dict)
    codegen: Callable[..., Any] | None = None
    bind_constants: bool = True


_COMPILERS: dict[str, Compiler] = {}


def _check_name(name: str) -> str:
    if not isinstance(name, str) or not name.isidentifier():
        raise CompileError(f"BYOC compiler name {name!r} must be an identifier (it is part of "
                           "C symbols: kiln_<model>_<compiler>_main_<i>)")
    return name


def _entry(name: str) -> Compiler:
    return _COMPILERS.setdefault(_check_name(name), Compiler(name))


def register_pattern_table(compiler: str, table: Callable[[], PatternTable] | None = None,
                           override: bool = False) -> Any:
    """Register the composite patterns of ``compiler`` (TVM: ``register_pattern_table``).

    Parameters
    ----------
    compiler : str
        The external compiler's name (an identifier, e.g. ``"cblas"``).
    table : callable, optional
        ``table() -> [(name, pattern, check), ...]``; without it, a decorator. ``name`` must be
        ``"<compiler>.<composite>"``; ``pattern`` is built with ``kiln.relay.pattern``
        (``is_op``, ``wildcard``, ``is_constant``); ``check(root_call) -> bool`` (or None)
        rejects matches the compiler cannot take (dtype, attrs). Larger patterns first: the
        table is applied in order (MergeComposite).
    override : bool
        Replace an existing table instead of raising.

    Raises
    ------
    CompileError
        A table is already registered for ``compiler`` (and ``override`` is False), or the name
        is not an identifier.
    """

    def do(fn: Callable[[], PatternTable]) -> Callable[[], PatternTable]:
        c = _entry(compiler)
        if c.pattern_table is not None and not override:
            raise CompileError(f"a pattern table for BYOC compiler {compiler!r} is already "
                               "registered (pass override=True to replace it)")
        c.pattern_table = fn
        return fn

    return do(table) if table is not None else do


def register_op_support(compiler: str, ops: str | Iterable[str],
                        predicate: Predicate | None = None) -> Predicate:
    """Say which graph ops ``compiler`` takes (TVM: ``register_op_attr(op, "target.<c>")``).

    Parameters
    ----------
    compiler : str
        The external compiler's name.
    ops : str or list of str
        Graph op names (``kiln.relay.op_registry.list_ops()``), e.g. ``"nn.relu"``.
    predicate : callable, optional
        ``predicate(call) -> bool`` on a :class:`kiln.relay.graph.Call` (read ``call.attrs``,
        ``call.checked_type``, ``call.args[i].checked_type``); default: every call of the op.

    Returns
    -------
    The predicate.

    Raises
    ------
    CompileError
        An op name that is not a registered graph op.
    """
    from kiln.relay.op_registry import list_ops

    names = [ops] if isinstance(ops, str) else list(ops)
    unknown = sorted(set(names) - set(list_ops()))
    if unknown:
        raise CompileError(f"register_op_support({compiler!r}): unknown graph ops {unknown}")
    fn = predicate if predicate is not None else _always
    c = _entry(compiler)
    for op in names:
        c.op_support[op] = fn
    return fn


def _always(call: Any) -> bool:
    return True


def register_external_codegen(compiler: str, codegen: Callable[..., Any] | None = None,
                              bind_constants: bool = True, override: bool = False) -> Any:
    """Register the codegen that turns ``compiler``'s partitioned functions into runtime modules
    (TVM: the global function ``relay.ext.<compiler>``).

    Parameters
    ----------
    compiler : str
        The external compiler's name.
    codegen : callable, optional
        ``codegen(funcs: list[kiln.relay.graph.Function]) -> Module | list[Module]``, called once
        per build with every partitioned function of this compiler (each has attrs
        ``Compiler``, ``global_symbol``; its body holds op calls and composite calls). The
        modules must serve a function named after each ``global_symbol`` taking the inputs then
        the outputs (packed ABI: DLTensors; Python: NDArrays). Modules that need the bound
        constants declare ``get_symbol``, ``get_const_vars`` (names from
        :func:`kiln.byoc.constant_names`) and ``__init_<symbol>``; Kiln then adds the const
        loader. Without ``codegen``: a decorator.
    bind_constants : bool
        True (TVM's default): constant inputs are bound inside the functions (the codegen sees
        the weights; they reach the module through the const loader). False: they stay
        arguments of the function call and the graph executor passes them in as params, like
        any input (what a C library codegen such as cblas wants).
    override : bool
        Replace an existing codegen instead of raising.

    Raises
    ------
    CompileError
        A codegen is already registered for ``compiler`` (and ``override`` is False).
    """

    def do(fn: Callable[..., Any]) -> Callable[..., Any]:
        c = _entry(compiler)
        if c.codegen is not None and not override:
            raise CompileError(f"an external codegen for BYOC compiler {compiler!r} is already "
                               "registered (pass override=True to replace it)")
        c.codegen = fn
        c.bind_constants = bind_constants
        return fn

    return do(codegen) if codegen is not None else do


def unregister(compiler: str) -> None:
    """Forget everything registered for ``compiler`` (tests, plugin reloads)."""
    _COMPILERS.pop(compiler, None)


def list_compilers() -> list[str]:
    """Names of the registered external compilers (with a codegen), sorted."""
    _load_builtin()
    return sorted(n for n, c in _COMPILERS.items() if c.codegen is not None)


def get_compiler(name: str) -> Compiler:
    """The registration of ``name``.

    Raises
    ------
    CompileError
        No codegen is registered under ``name`` (the message lists those that are).
    """
    _load_builtin()
    c = _COMPILERS.get(name)
    if c is None or c.codegen is None:
        raise CompileError(f"no external codegen registered for BYOC compiler {name!r}; "
                           f"registered: {', '.join(list_compilers()) or 'none'}")
    return c


_builtin_loaded = False


def _load_builtin() -> None:
    global _builtin_loaded
    if not _builtin_loaded:
        _builtin_loaded = True
        import kiln.byoc.cblas
        import kiln.byoc.kiln_json  # noqa: F401
