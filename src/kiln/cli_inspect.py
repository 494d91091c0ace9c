"""``kiln inspect``: a compiled library's module tree, graph inputs/outputs and params."""

from __future__ import annotations

import numpy as np

from kiln.cli_run import open_library


def _functions(module) -> list[str]:
    lister = getattr(module, "list_function_names", None)
    return sorted(lister()) if callable(lister) else []


def module_tree_lines(root) -> list[str]:
    """One line per module of the tree, indented by depth: ``type_key: f1, f2, ...``.

    Parameters
    ----------
    root : kiln.runtime.Module
        The loaded root module.

    Returns
    -------
    list of str
    """
    lines: list[str] = []
    seen: set[int] = set()

    def walk(mod, depth: int) -> None:
        pad = "  " * depth
        if id(mod) in seen:
            lines.append(f"{pad}{mod.type_key} (shared, listed above)")
            return
        seen.add(id(mod))
        fns = _functions(mod)
        shown = ", ".join(fns[:12]) + (f", … ({len(fns)} in all)" if len(fns) > 12 else "")
        lines.append(f"{pad}{mod.type_key}: {shown or '(no functions)'}")
        for child in mod.imported_modules:
            walk(child, depth + 1)

    walk(root, 0)
    return lines


def inspect_library(library: str, echo=print) -> None:
    """Print the module tree, graph inputs/outputs (shape, dtype) and param count/size.

    Parameters
    ----------
    library : str
        Path of a compiled ``.so``.
    echo : callable
        Receives each printed line.

    Raises
    ------
    KilnError
        If the library cannot be loaded or is not a graph-executor factory.
    """
    root, info, params = open_library(library)
    echo(f"{library}")
    echo("modules:")
    for line in module_tree_lines(root):
        echo(f"  {line}")
    echo(f"graph: {info.num_ops} kernel calls")
    for kind, items in (("inputs", info.inputs), ("outputs", info.outputs)):
        echo(f"{kind}:")
        for t in items:
            echo(f"  {t.name}: {'x'.join(map(str, t.shape)) or 'scalar'} {t.dtype}")
    nbytes = sum(int(np.asarray(v.numpy()).nbytes) for v in params.values())
    echo(f"params: {len(params)} tensors, {nbytes} bytes ({nbytes / 1e6:.2f} MB)")
