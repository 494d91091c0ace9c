"""User-defined runtime module types that travel in the imports blob: :class:`BinaryModule`
and :func:`register_module_loader` (TVM's ``ModuleNode::SaveToBinary`` and the
``runtime.module.loadbinary_<type_key>`` global functions, src/runtime/library_module.cc).

A module type is its ``type_key``: ``export_library`` writes the key and the module's
``save_to_binary()`` bytes into ``__tvm_dev_mblob``, and ``load_module`` hands the bytes to the
loader registered for that key. Renaming a type breaks artifacts already shipped (a known TVM
pain point), so a loader may also be registered under old keys (``aliases``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

from kiln.errors import KilnError
from kiln.runtime.blob import (
    IMPORT_TREE_KEY,
    LIB_KEY,
    LOADER_PREFIX,
    ZERO_COPY_LOADERS,
    list_module_loaders,
)
from kiln.runtime.module import Module
from kiln.runtime.packed_func import PackedFunc
from kiln.runtime.registry import register_func

Loader = Callable[[bytes], Module]


def _as_packed(func: Any, name: str, type_key: str) -> PackedFunc | None:
    if func is None or isinstance(func, PackedFunc):
        return func
    if not callable(func):
        raise KilnError(f"module '{type_key}': get_function({name!r}) returned "
                        f"{type(func).__name__}, not a callable")
    return PackedFunc(func, name)


class BinaryModule(Module):
    """Base class of a user module type serialized into the exported library's blob.

    Subclass it, set :attr:`type_key`, and implement:

    - ``save_to_binary(self) -> bytes``: everything needed to rebuild the module;
    - a loader ``bytes -> module`` (e.g. a ``load_from_binary`` classmethod) registered with
      :func:`register_module_loader` under the same ``type_key`` before ``load_module``;
    - ``get_function(self, name, query_imports=True)``: return this module's own function
      ``name`` (a Python callable or :class:`PackedFunc`; callers receive it as a
      :class:`PackedFunc`) and otherwise ``super().get_function(name, query_imports)``, which
      searches the imported modules.

    The module can import other modules (C source, other binary modules) at any depth; the
    export keeps the import tree. Its functions are reachable from any module above it, e.g.
    the graph executor calls ``func(*tensors)`` with :class:`NDArray` inputs then outputs.

    Examples
    --------
    >>> class Scale(BinaryModule):
    ...     type_key = "my.scale"
    ...     def __init__(self, k: float):
    ...         super().__init__()
    ...         self.k = k
    ...     def save_to_binary(self) -> bytes:
    ...         return struct.pack("<d", self.k)
    ...     @classmethod
    ...     def load_from_binary(cls, data: bytes) -> "Scale":
    ...         return cls(struct.unpack("<d", data)[0])
    ...     def get_function(self, name, query_imports=True):
    ...         if name == "scale":
    ...             return lambda x, out: out.copyfrom(x.numpy() * self.k)
    ...         return super().get_function(name, query_imports)
    >>> register_module_loader(Scale.type_key, Scale.load_from_binary)
    """

    type_key = "binary"
    is_binary_serializable = True

    def __init_subclass__(cls, **kwargs: Any) -> None:
        # A subclass's get_function may return any callable; callers of Module.get_function
        # (the graph executor among them) get a PackedFunc, as from every other module.
        super().__init_subclass__(**kwargs)
        own = cls.__dict__.get("get_function")
        if own is not None and not getattr(own, "_kiln_packed", False):

            @functools.wraps(own)
            def get_function(self: BinaryModule, name: str, query_imports: bool = True
                             ) -> PackedFunc | None:
                return _as_packed(own(self, name, query_imports), name, self.type_key)

            get_function._kiln_packed = True  # type: ignore[attr-defined]
            cls.get_function = get_function  # type: ignore[method-assign]

    def get_function(self, name: str, query_imports: bool = True) -> PackedFunc | None:
        """Override to serve this module's functions (return a callable; the caller receives
        it as a :class:`PackedFunc`); this base has none of its own and, when
        ``query_imports``, searches the imported modules depth-first."""
        return self._find_in_imports(name) if query_imports else None

    def _get_own_function(self, name: str) -> PackedFunc | None:
        return self.get_function(name, query_imports=False)

    def save_to_binary(self) -> bytes:
        """The bytes the registered loader rebuilds this module from (subclasses implement).

        Raises
        ------
        KilnError
            If the subclass does not implement it.
        """
        raise KilnError(f"module '{self.type_key}' ({type(self).__name__}) does not implement "
                        "save_to_binary()")


def register_module_loader(type_key: str, loader: Loader | None = None,
                           aliases: Sequence[str] = (), override: bool = False,
                           zero_copy: bool = False) -> Any:
    """Register the loader of module type ``type_key`` (and of its old names ``aliases``) as the
    global function ``runtime.module.loadbinary_<key>``; without ``loader``, a decorator.

    Parameters
    ----------
    type_key : str
        The key ``export_library`` wrote for the module (its ``type_key``).
    loader : callable
        ``loader(data: bytes) -> Module``; may raise on corrupt bytes (``load_module`` reports
        it as a ModuleLoadError naming the type key).
    aliases : list of str
        Former type keys still found in shipped artifacts; each loads with ``loader``.
    override : bool
        Replace existing registrations instead of raising.
    zero_copy : bool
        Hand the loader a read-only ``memoryview`` into the loaded library instead of a
        ``bytes`` copy; it is valid only during the call, so the loader must copy what it keeps
        (as Kiln's factory and const loader do). Saves one copy of large modules while loading.

    Returns
    -------
    callable
        ``loader`` (or the decorator).

    Raises
    ------
    KilnError
        An empty or reserved key (``_lib``, ``_import_tree``), a loader that is not callable,
        or a key already registered while ``override`` is False.
    """
    keys = [type_key, *aliases]
    for key in keys:
        if not isinstance(key, str) or not key or key in (LIB_KEY, IMPORT_TREE_KEY):
            raise KilnError(f"register_module_loader: {key!r} cannot be a module type_key")

    def do_register(fn: Loader) -> Loader:
        if not callable(fn):
            raise KilnError(f"register_module_loader({type_key!r}): the loader must be "
                            f"callable, got {type(fn).__name__}")
        taken = [k for k in keys if k in list_module_loaders()]
        if taken and not override:
            raise KilnError(f"register_module_loader: a loader for {', '.join(taken)} is "
                            "already registered (pass override=True to replace it)")
        for key in keys:
            register_func(LOADER_PREFIX + key, fn, override=True)
            if zero_copy:
                ZERO_COPY_LOADERS.add(key)
            else:
                ZERO_COPY_LOADERS.discard(key)
        return fn

    return do_register(loader) if loader is not None else do_register


__all__ = ["BinaryModule", "list_module_loaders", "register_module_loader"]
