"""The global function table: ``register_func`` / ``get_global_func`` (TVM's ``tvm._ffi``).

Python callables registered here are wrapped as :class:`PackedFunc`. Module loaders use it
too: ``runtime.module.loadbinary_<type_key>`` (see ``blob.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kiln.errors import KilnError
from kiln.runtime.packed_func import PackedFunc

_GLOBAL_FUNCS: dict[str, PackedFunc] = {}


def register_func(func_name: str | Callable[..., Any], f: Callable[..., Any] | None = None,
                  override: bool = False) -> Any:
    """Register ``f`` under ``func_name``; without ``f``, return a decorator.

    ``@register_func`` (bare) registers under the function's ``__name__``.

    Returns
    -------
    PackedFunc or decorator
        The registered PackedFunc when ``f`` is given.

    Raises
    ------
    KilnError
        If the name is taken and ``override`` is False.
    """
    if callable(func_name) and f is None:
        fn = func_name
        return register_func(fn.__name__, fn, override)
    name = str(func_name)

    def do_register(fn: Callable[..., Any]) -> Any:
        if name in _GLOBAL_FUNCS and not override:
            raise KilnError(f"global function {name!r} is already registered "
                            "(pass override=True to replace it)")
        _GLOBAL_FUNCS[name] = fn if isinstance(fn, PackedFunc) else PackedFunc(fn, name)
        return fn

    if f is not None:
        do_register(f)
        return _GLOBAL_FUNCS[name]
    return do_register


def get_global_func(name: str, allow_missing: bool = False) -> PackedFunc | None:
    """The global function ``name``; None if missing and ``allow_missing``.

    Raises
    ------
    KilnError
        If missing and not ``allow_missing``.
    """
    func = _GLOBAL_FUNCS.get(name)
    if func is None and not allow_missing:
        raise KilnError(f"global function {name!r} is not registered")
    return func


def list_global_func_names() -> list[str]:
    """Sorted names of all registered global functions."""
    return sorted(_GLOBAL_FUNCS)


def remove_global_func(name: str) -> None:
    """Unregister ``name`` (no error if absent); mainly for tests."""
    _GLOBAL_FUNCS.pop(name, None)
