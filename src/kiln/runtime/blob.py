"""Pack and unpack the imports blob ``__tvm_dev_mblob`` (TVM's ``ModuleSerializer`` in
src/target/codegen.cc and ``ProcessModuleBlob`` in src/runtime/library_module.cc).

Format (docs/formats.md §2)::

    blob    := u64 nbytes  payload[nbytes]
    payload := u64 num_entries  entry*num_entries
    entry   := string "_lib"
             | string "_import_tree"  vec<u64> row_ptr  vec<u64> child_indices   # always last
             | string <type_key>  string <module bytes>

**Kiln:** module bytes are length-prefixed (as in newer TVM), so an unknown ``type_key`` is
reported precisely. Modules are indexed depth-first from the root (index 0); every
DSO-exportable module is merged into the one ``_lib`` group, placed where the first of them is
met; the import tree is CSR over groups (children sorted, self-edges dropped).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from kiln.errors import KilnError, ModuleLoadError
from kiln.runtime.module import Module, modules_dfs
from kiln.runtime.registry import get_global_func, list_global_func_names
from kiln.runtime.stream import StreamReader, StreamWriter

LIB_KEY = "_lib"
IMPORT_TREE_KEY = "_import_tree"
LOADER_PREFIX = "runtime.module.loadbinary_"
#: type keys whose loaders take a read-only ``memoryview`` of their bytes in the loaded library
#: (valid only during the call) instead of a ``bytes`` copy: Kiln's own loaders, which copy
#: what they keep, so a 100 MB params blob is not held a third time while it is parsed
ZERO_COPY_LOADERS: set[str] = set()


@dataclass
class ModuleIndex:
    """The serializer's view of a module tree."""

    #: each group: the one binary module, or every DSO-exportable module (the ``_lib`` group)
    groups: list[list[Module]] = field(default_factory=list)
    #: index of the ``_lib`` group, or -1
    lib_group: int = -1
    row_ptr: list[int] = field(default_factory=list)
    child_indices: list[int] = field(default_factory=list)

    @property
    def dso_modules(self) -> list[Module]:
        return self.groups[self.lib_group] if self.lib_group >= 0 else []


def index_modules(root: Module) -> ModuleIndex:
    """Group and index the modules reachable from ``root`` (see the module docstring).

    Raises
    ------
    KilnError
        If a module is neither DSO-exportable nor binary-serializable.
    """
    index = ModuleIndex()
    group_of: dict[int, int] = {}
    for m in modules_dfs(root):
        if m.is_dso_exportable:
            if index.lib_group < 0:
                index.lib_group = len(index.groups)
                index.groups.append([])
            index.groups[index.lib_group].append(m)
            group_of[id(m)] = index.lib_group
        elif m.is_binary_serializable:
            group_of[id(m)] = len(index.groups)
            index.groups.append([m])
        else:
            raise KilnError(f"module '{m.type_key}' can be neither linked into a shared library "
                            "nor serialized into its blob, so it cannot be exported")
    index.row_ptr = [0]
    for gid, group in enumerate(index.groups):
        children = {group_of[id(c)] for m in group for c in m.imported_modules} - {gid}
        index.child_indices.extend(sorted(children))
        index.row_ptr.append(len(index.child_indices))
    return index


def pack_imports(root: Module, index: ModuleIndex | None = None) -> bytes:
    """The full ``__tvm_dev_mblob`` contents (``u64 nbytes`` + payload) for ``root``'s tree."""
    index = index or index_modules(root)
    w = StreamWriter()
    w.u64(len(index.groups) + 1)
    for gid, group in enumerate(index.groups):
        if gid == index.lib_group:
            w.string(LIB_KEY)
        else:
            (m,) = group
            w.string(m.type_key)
            w.string(m.save_to_binary())
    w.string(IMPORT_TREE_KEY)
    w.vec_u64(index.row_ptr)
    w.vec_u64(index.child_indices)
    return w.getvalue(length_prefix=True)


def list_module_loaders() -> list[str]:
    """The module type keys (aliases included) with a registered loader, sorted."""
    return [n[len(LOADER_PREFIX):] for n in list_global_func_names()
            if n.startswith(LOADER_PREFIX)]


def _load_binary(type_key: str, data: memoryview, r: StreamReader) -> Module:
    loader = get_global_func(LOADER_PREFIX + type_key, allow_missing=True)
    if loader is None:
        known = list_module_loaders()
        raise r.error(f"no loader for module type_key {type_key!r} (registered loaders: "
                      f"{', '.join(known) or 'none'}; a loader is the global function "
                      f"'{LOADER_PREFIX}{type_key}')")
    try:
        mod = loader(data if type_key in ZERO_COPY_LOADERS else bytes(data))
    except ModuleLoadError:
        raise
    except Exception as err:  # a loader's own failure on corrupt bytes: name the module type
        raise r.error(f"loading module {type_key!r} failed: {err}") from err
    if not isinstance(mod, Module):
        raise r.error(f"loader for {type_key!r} returned {type(mod).__name__}, not a Module")
    return mod


def unpack_imports(payload: bytes | memoryview, lib: Module | None,
                   what: str = "__tvm_dev_mblob") -> Module:
    """Rebuild the module tree from a blob *payload* (without the leading ``u64 nbytes``).

    Parameters
    ----------
    payload : bytes-like
    lib : Module or None
        The module that stands for ``_lib`` (the library the blob was found in).
    what : str
        Names the blob in error messages.

    Returns
    -------
    Module
        The root (module 0); ``lib`` itself when the blob lists no module.

    Raises
    ------
    ModuleLoadError
        Truncated or corrupt data, an unknown ``type_key`` (listing the registered loaders),
        ``_lib`` without a library, or an inconsistent import tree.
    """
    r = StreamReader(payload, what)
    num_entries = r.count(8, "entry count")
    modules: list[Module] = []
    tree: tuple[list[int], list[int]] | None = None
    for i in range(num_entries):
        key = r.string(f"entry {i} key")
        if tree is not None:
            raise r.error(f"corrupt: entry {key!r} after {IMPORT_TREE_KEY}")
        if key == LIB_KEY:
            if lib is None:
                raise r.error("blob refers to _lib but there is no library module")
            modules.append(lib)
        elif key == IMPORT_TREE_KEY:
            tree = (r.vec_u64("import tree row_ptr"), r.vec_u64("import tree child_indices"))
        else:
            data = r.bytes_(f"module {key!r} bytes")
            modules.append(_load_binary(key, data, r))
    if r.remaining:
        raise r.error(f"corrupt: {r.remaining} trailing bytes after {num_entries} entries")
    if not modules:
        if lib is None:
            raise r.error("blob holds no module")
        return lib
    if tree is not None:
        _link_imports(modules, *tree, r)
    elif lib is not None and len(modules) > 1:
        # Blobs without an import tree (TVM < 0.7): the library imports every other module.
        for m in modules:
            if m is not lib:
                lib.import_module(m)
    return modules[0]


def _link_imports(modules: list[Module], row_ptr: list[int], children: list[int],
                  r: StreamReader) -> None:
    n = len(modules)
    if len(row_ptr) != n + 1 or row_ptr[0] != 0 or row_ptr[-1] != len(children):
        raise r.error(f"corrupt import tree: row_ptr {row_ptr[:8]} does not fit {n} modules and "
                      f"{len(children)} children")
    if any(a > b for a, b in itertools.pairwise(row_ptr)):
        raise r.error("corrupt import tree: row_ptr is not monotone")
    if any(c >= n for c in children):
        raise r.error(f"corrupt import tree: child index out of range (have {n} modules)")
    # One cycle check over the whole tree, O(modules + edges). Module.import_module checks
    # each edge by walking the child's subtree: quadratic on a long chain (a crafted 12 MB
    # blob took minutes). Modules are compared by identity (a loader may return one object
    # for two entries).
    first: dict[int, int] = {}
    node = [first.setdefault(id(m), i) for i, m in enumerate(modules)]
    edges: dict[int, list[int]] = {}
    for i in range(n):
        for c in children[row_ptr[i]:row_ptr[i + 1]]:
            edges.setdefault(node[i], []).append(node[c])
    _check_acyclic(edges, modules, r)
    for i in range(n):
        for c in children[row_ptr[i]:row_ptr[i + 1]]:
            modules[i]._imports.append(modules[c])  # acyclic: import_module's walk not needed


def _check_acyclic(edges: dict[int, list[int]], modules: list[Module], r: StreamReader
                   ) -> None:
    """Iterative depth-first search; raises on the first cycle (self-imports included)."""
    state: dict[int, int] = {}  # 1: on the current path, 2: done
    for root, succ in edges.items():
        if root in state:
            continue
        state[root] = 1
        stack = [(root, iter(succ))]
        while stack:
            cur, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                state[cur] = 2
                stack.pop()
            elif state.get(nxt) == 1:
                raise r.error(f"corrupt import tree: a cycle through modules {cur} and {nxt} "
                              f"('{modules[nxt].type_key}')")
            elif nxt not in state:
                state[nxt] = 1
                stack.append((nxt, iter(edges.get(nxt, ()))))
