"""``kiln inspect``: a compiled library's module tree, what it was built for (target, triple,
CPU, the CPU features its code needs: its ``__kiln_target_info``) and whether this machine runs
it, graph inputs/outputs and params; extracts the graph JSON and the params (TVM param-dict
format). VM libraries: the executable's symbols, function signatures and constants
(:func:`kiln.cli.vm.inspect_vm_lines`), and its bytecode.

A shared library or ``.o`` export is read from the file (:func:`kiln.runtime.load.read_library`):
nothing of it is loaded or run, so a library for another CPU or another machine is inspected
too. Only the multi-level dispatch line opens the library (its dispatcher says which level this
CPU runs), and only when this machine can run it. A ``.tar`` export is relinked and loaded."""

from __future__ import annotations

import argparse
import os

from kiln.cli.files import open_library, write_atomic
from kiln.errors import KilnError


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


def cpu_dispatch_line(library: str, info: dict | None = None,
                      runnable: bool = True) -> str | None:
    """``cpu dispatch: x86-64-v2, x86-64-v3, x86-64-v4; this CPU runs x86-64-v3`` for a
    multi-level library (``llvm -mcpu=portable``: the ``__kiln_cpu_levels`` and
    ``__kiln_cpu_level`` functions of :mod:`kiln.codegen.llvm.multi_level`'s dispatcher), else
    None. A bare relative name is the file in the current folder (``ctypes`` would search the
    library path for it). Not ``runnable`` here (another machine or CPU): the levels of the
    target record ``info``, without opening the library."""
    import ctypes

    if not runnable:
        levels = (info or {}).get("levels") or []
        return (f"cpu dispatch: kernels for {', '.join(levels)} (not loaded on this machine)"
                if levels else None)
    try:
        lib = ctypes.CDLL(os.path.abspath(library))
        levels, chosen = lib["__kiln_cpu_levels"], lib["__kiln_cpu_level"]
    except (OSError, AttributeError):
        return None
    levels.restype = chosen.restype = ctypes.c_char_p
    names = levels().decode().replace(",", ", ")
    return f"cpu dispatch: kernels for {names}; this CPU runs {chosen().decode()}"


def target_lines(path: str, info: dict | None) -> tuple[list[str], bool]:
    """The lines that say what a library was built for (its ``__kiln_target_info``: target,
    triple, CPU, the CPU features its code needs) and whether this machine can run it; returns
    them and that answer."""
    from kiln.errors import ModuleLoadError
    from kiln.runtime.cpu_features import cpu_has, host_arch, host_cpuinfo_flags, missing_features
    from kiln.runtime.elf import check_loadable

    try:
        check_loadable(path)
    except ModuleLoadError as err:
        foreign = str(err).split(" was built for ", 1)[-1].split(";", 1)[0]
        foreign_line = f"runs here: no (built for {foreign})"
    else:
        foreign_line = ""
    if info is None:
        lines = ["target: not recorded (exported before Kiln recorded targets, or not by Kiln)"]
        return lines + ([foreign_line] if foreign_line else []), not foreign_line
    lines = [f"target: {info.get('target') or '(no compiled kernels)'}",
             f"  triple: {info.get('triple') or 'unknown'}, cpu: {info.get('cpu') or 'generic'}",
             f"  cpu features needed: {', '.join(info['features']) or 'none recorded'}"]
    if foreign_line:
        return [*lines, foreign_line], False
    flags = host_cpuinfo_flags()
    missing = missing_features(list(info["features"]), flags, host_arch()) if flags else []
    if missing:
        has = ", ".join(cpu_has(flags, host_arch())) if flags else ""
        lines.append(f"runs here: no, this CPU lacks {', '.join(missing)} (it has {has})")
        return lines, False
    lines.append("runs here: yes" if flags is not None else "runs here: not checked (the CPU's "
                 "features cannot be read)")
    return lines, True


def _read(library: str):
    """(root, target record or None, runnable here) without loading a shared library or
    object; a tar export is relinked and loaded (``load_module``)."""
    import kiln
    from kiln.cli.files import refuse_onnx
    from kiln.runtime.load import file_kind, read_library

    path = os.path.abspath(library)
    refuse_onnx(library)
    if os.path.isfile(path) and file_kind(path) == "tar":
        return kiln.runtime.load_module(path), None, True, ["target: (a .tar export: relinked "
                                                              "and loaded, record not read)"]
    root, info = read_library(path)
    lines, runnable = target_lines(path, info)
    return root, info, runnable, lines


def inspect_library(library: str, echo=print, graph_out: str | None = None,
                    params_out: str | None = None, bytecode: bool = False) -> None:
    """Print the module tree, graph inputs/outputs (shape, dtype) and param count/size (and
    the const loader's constants of BYOC modules); optionally extract the graph JSON and the
    params. For a VM library: the module tree, the executable's symbols (with bounds), its
    functions' signatures, the inputs and outputs of ``main`` and the constants' size.

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
    bytecode : bool
        VM libraries: also print the executable as text (``VMExecutable.as_text``: symbols,
        constants, each function's instructions).

    Raises
    ------
    KilnError
        If the library cannot be loaded or is neither a graph-executor factory nor a VM
        executable, ``--graph``/``--params`` on a VM library or ``--bytecode`` on a graph
        library, or an output file cannot be written (files are written atomically: never
        left half-written).
    """
    from kiln.cli.vm import is_vm_library

    root, info, runnable, target = _read(library)
    head = [*target]
    dispatch = cpu_dispatch_line(library, info, runnable)
    if dispatch:
        head.append(dispatch)
    if is_vm_library(root):
        _inspect_vm(library, root, echo, graph_out, params_out, bytecode, head)
        return
    if bytecode:
        raise KilnError("--bytecode needs a VM library (this one runs on the graph executor; "
                        "--graph writes its graph JSON)")
    _inspect_graph(library, root, echo, graph_out, params_out, head)


def _inspect_vm(library: str, root, echo, graph_out: str | None, params_out: str | None,
                bytecode: bool, head: list[str]) -> None:
    from kiln.cli.vm import inspect_vm_lines

    if graph_out or params_out:
        raise KilnError("--graph/--params need a graph-executor library; a VM library has "
                        "bytecode and constants instead (--bytecode prints them)")
    echo(f"{library}")
    echo("modules:")
    for line in module_tree_lines(root):
        echo(f"  {line}")
    for line in head:
        echo(line)
    for line in inspect_vm_lines(root):
        echo(line)
    if bytecode:
        echo(root["as_text"]())


def _inspect_graph(library: str, root, echo, graph_out: str | None,
                   params_out: str | None, head: list[str]) -> None:
    from kiln.runtime import ConstLoaderModule, save_param_dict
    from kiln.runtime.module import modules_dfs

    root, info, params = open_library(library, root)
    echo(f"{library}")
    echo("modules:")
    for line in module_tree_lines(root):
        echo(f"  {line}")
    for line in head:
        echo(line)
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


def add_parser(sub) -> None:
    """Register ``kiln inspect`` on the ``kiln`` subparsers."""
    p = sub.add_parser("inspect", help="show a compiled library's modules, graph and params",
                       description="Show the module tree, graph inputs/outputs and params; "
                                   "for a VM library its symbols, function signatures and "
                                   "constants.")
    p.add_argument("library", help="the compiled library (.so)")
    p.add_argument("--graph", metavar="FILE", help="write the graph JSON to FILE")
    p.add_argument("--params", metavar="FILE",
                   help="write the params to FILE (TVM param-dict format)")
    p.add_argument("--bytecode", action="store_true",
                   help="VM libraries: also print the executable as text (symbols, constants, "
                        "instructions)")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    inspect_library(args.library, graph_out=args.graph, params_out=args.params,
                    bytecode=args.bytecode)
    return 0
