"""``kiln inspect``: a compiled library's module tree, graph inputs/outputs and params; extracts
the graph JSON and the params (TVM param-dict format)."""

from __future__ import annotations

from kiln.cli_run import open_library, write_atomic


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


def inspect_library(library: str, echo=print, graph_out: str | None = None,
                    params_out: str | None = None) -> None:
    """Print the module tree, graph inputs/outputs (shape, dtype) and param count/size (and
    the const loader's constants of BYOC modules); optionally extract the graph JSON and the
    params.

    Parameters
    ----------
    library : str
        Path of a compiled ``.so``.
    echo : callable
        Receives each printed line.
    graph_out : str, optional
        Write the graph JSON (exactly the library's ``get_graph_json()`` text) here.
    params_out : str, optional
        Write the params here in TVM's param-dict format (``kiln.runtime.save_param_dict``;
        ``load_param_dict`` / ``GraphModule.load_params`` read it back).

    Raises
    ------
    KilnError
        If the library cannot be loaded or is not a graph-executor factory, or an output file
        cannot be written (files are written atomically: never left half-written).
    """
    from kiln.runtime import ConstLoaderModule, save_param_dict
    from kiln.runtime.module import modules_dfs

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
    nbytes = sum(int(v.nbytes) for v in params.values())
    echo(f"params: {len(params)} tensors, {nbytes} bytes ({nbytes / 1e6:.2f} MB)")
    for mod in modules_dfs(root):
        if isinstance(mod, ConstLoaderModule):  # BYOC modules' weights, outside the params
            consts = mod.const_var_ndarray
            cbytes = sum(int(v.nbytes) for v in consts.values())
            echo(f"constants ({mod.type_key}): {len(consts)} tensors for "
                 f"{len(mod.const_vars_by_symbol)} external functions, {cbytes} bytes "
                 f"({cbytes / 1e6:.2f} MB)")
    if graph_out:
        text = root["get_graph_json"]().encode()
        write_atomic(graph_out, lambda f: f.write(text))
        echo(f"wrote graph JSON to {graph_out}")
    if params_out:
        blob = save_param_dict(params)
        write_atomic(params_out, lambda f: f.write(blob))
        echo(f"wrote {len(params)} params to {params_out}")
