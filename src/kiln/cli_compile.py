"""``kiln compile``: ONNX file → one shared library, with progress and a one-line summary."""

from __future__ import annotations

import time
from pathlib import Path

from kiln.errors import KilnError


def compile_model(model: str, output: str | None, target: str = "c",
                  input_shapes: list[tuple[str, tuple[int, ...]]] | None = None,
                  echo=print, byoc: list[str] | None = None,
                  target_host: str | None = None, executor: str = "graph",
                  system_lib: bool = False, system_lib_prefix: str = "",
                  c_project: str | None = None) -> Path:
    """Compile ``model`` for ``target`` and export it to ``output`` (and/or ``c_project``).

    Parameters
    ----------
    model : str
        Path of the ONNX model.
    output : str or None
        Library to write: ``.so`` (linked shared object) or ``.tar`` (objects); written
        atomically by ``export_library``. With ``system_lib`` or the AOT executor also ``.a``:
        a static library for C programs (with the graph executor, the graph JSON and params
        are written beside it as ``<stem>.json`` and ``<stem>.params``).
    target : str
        Kiln target string, e.g. ``"c"``, ``"llvm -mcpu=native"`` or ``"jit"``.
    input_shapes : list of (name, shape), optional
        Static shapes for graph inputs (``--input-shape``). A name the model does not have, or
        a shape that contradicts a fixed-shape input, raises :class:`~kiln.errors.ShapeError`.
    echo : callable
        Receives the summary line.
    byoc : list of str, optional
        External compilers to offload to (``kiln.build``'s ``byoc``), e.g. ``["cblas"]``.
    target_host : str, optional
        The host target (``--target-host``; for ``jit``: ``"c"`` or ``"llvm"``).
    executor : str
        ``"graph"`` or ``"aot"`` (``kiln.build``'s ``executor``).
    system_lib, system_lib_prefix :
        Build for the C runtime (``runtime="crt"``) with this symbol prefix.
    c_project : str, optional
        Write a ready C project there (:mod:`kiln.crt.project`); needs ``system_lib`` or AOT.

    Returns
    -------
    Path
        The written library (or project folder when there is no ``output``).

    Raises
    ------
    KilnError
        Bad model file, unsupported op, shape errors, compile or toolchain failures, an
        unknown BYOC compiler.
    """
    import kiln
    from kiln import progress
    from kiln.frontend import from_onnx, load_onnx
    from kiln.target import Target

    tgt = Target(target, host=target_host)

    shapes: dict[str, tuple[int, ...]] = {}
    for name, shape in input_shapes or []:
        if name in shapes and shapes[name] != shape:
            raise KilnError(f"--input-shape given twice for {name!r}: {shapes[name]} and {shape}")
        shapes[name] = shape
    crt = system_lib or executor == "aot"
    if output is None and c_project is None:
        raise KilnError("nothing to write: give -o/--output (or --emit-c-project DIR)")
    if c_project is not None and not crt:
        raise KilnError("--emit-c-project needs --executor aot or --system-lib")
    out = Path(output if output is not None else c_project)
    if output is not None and out.suffix == ".a" and not crt:
        raise KilnError(f"{output}: a static library (.a) needs --executor aot or --system-lib")
    if executor == "aot" and output is not None and out.suffix != ".a":
        raise KilnError(f"{output}: the AOT executor writes a static library (.a) or a C "
                        "project (--emit-c-project)")
    if out.parent and not out.parent.exists():
        raise KilnError(f"cannot write {out}: directory {out.parent} does not exist")
    start = time.perf_counter()
    with progress.stage(f"Importing {Path(model).name}"):
        proto = load_onnx(model)
        mod, params = from_onnx(proto, shape=shapes)
    lib = kiln.build(mod, target=tgt, params=params, byoc=list(byoc or []),
                     runtime="crt" if crt else None, executor=executor,
                     system_lib_prefix=system_lib_prefix,
                     # AOT names its entry kiln_<model>_run; graph builds keep TVM's "default"
                     mod_name=_model_name(model) if executor == "aot" else "default")
    with progress.stage(f"Exporting {out.name}"):
        if crt:
            _export_for_c(lib, output, c_project)
        else:
            lib.export_library(str(out))
    size = out.stat().st_size if out.is_file() else sum(
        f.stat().st_size for f in out.rglob("*") if f.is_file())
    offload = f", byoc {','.join(byoc)}" if byoc else ""
    host = f" (host {tgt.host})" if target_host else ""
    echo(f"wrote {out} ({size / 1e6:.1f} MB, target {target}{host}{offload}) "
         f"in {time.perf_counter() - start:.1f} s")
    return out


def _model_name(path: str) -> str:
    """The model's name for generated C symbols (``kiln_<name>_run``): the file's stem."""
    from kiln.backend.aot_codegen import c_identifier

    return c_identifier(Path(path).stem)


def _export_for_c(lib, output: str | None, c_project: str | None) -> None:
    """A build for the C runtime: a static library (plus graph JSON and params for the graph
    executor), a shared library (graph executor: still loadable from Python), a C project."""
    from kiln.cli_run import write_atomic
    from kiln.crt.aot_factory import AotExecutorFactory
    from kiln.crt.project import build_static_library, graph_project, write_project
    from kiln.runtime.params import save_param_dict

    if c_project is not None:
        if isinstance(lib, AotExecutorFactory):
            lib.emit_c_project(c_project)
        else:
            write_project(graph_project(lib), c_project)
    if output is None:
        return
    out = Path(output)
    if isinstance(lib, AotExecutorFactory):
        lib.export_library(out)
    elif out.suffix == ".a":
        build_static_library(graph_project(lib), out)
        graph, params = lib.get_graph_json().encode(), save_param_dict(lib.get_params())
        write_atomic(str(out.with_suffix(".json")), lambda f: f.write(graph))
        write_atomic(str(out.with_suffix(".params")), lambda f: f.write(params))
    else:
        lib.export_library(str(out))

