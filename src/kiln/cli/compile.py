"""``kiln compile``: ONNX file → one shared library, with progress and a one-line summary.

A model whose inputs keep symbolic dims after ``--input-shape`` / ``--dim NAME=N`` compiles for
the VM executor (``kiln.build`` → ``VMExecutable``) unless ``--executor`` says otherwise; the
graph and AOT executors need static shapes (a :class:`~kiln.errors.CompileError` listing the
symbolic inputs)."""

from __future__ import annotations

import time
from pathlib import Path

from kiln.cli.symbols import (
    DimSpec,
    describe_bound,
    fix_symbols,
    input_dims,
    name_symbols,
    resolve_symbols,
)
from kiln.driver.build_module import choose_executor
from kiln.driver.tuning_records import RECORD_MEASURE
from kiln.errors import KilnError


def compile_model(model: str, output: str | None, target: str | None = None,
                  input_shapes: list[tuple[str, tuple[int, ...]]] | None = None,
                  echo=print, byoc: list[str] | None = None,
                  target_host: str | None = None, executor: str | None = None,
                  system_lib: bool = False, system_lib_prefix: str = "",
                  c_project: str | None = None, dims: list[DimSpec] | None = None,
                  quantize_weights: str | None = None, cross_compiler: str | None = None,
                  cross_compiler_options: str = "", tuning_records: str | None = None,
                  tuning_measure: str = RECORD_MEASURE) -> Path:
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
    target : str, optional
        Kiln target string, e.g. ``"c"``, ``"llvm -mcpu=native"``, ``"llvm -mcpu=portable"``
        or ``"jit"``; default: :func:`kiln.target.default_target` (the fastest for this host,
        ``"llvm -mcpu=native"`` when llvmlite is installed).
    input_shapes : list of (name, shape), optional
        Static shapes for graph inputs (``--input-shape``). A name the model does not have, or
        a shape that contradicts a fixed-shape input, raises :class:`~kiln.errors.ShapeError`.
        The symbols an input's shape fixes are fixed in every other input too (one symbol,
        one value), so inputs not named may keep symbolic dims.
    echo : callable
        Receives the summary line.
    byoc : list of str, optional
        External compilers to offload to (``kiln.build``'s ``byoc``), e.g. ``["cblas"]``.
    target_host : str, optional
        The host target (``--target-host``; for ``jit``: ``"c"`` or ``"llvm"``).
    executor : str, optional
        ``"graph"``, ``"vm"`` or ``"aot"`` (``kiln.build``'s ``executor``); default (None):
        ``"vm"`` when symbolic dims remain, else ``"graph"``.
    system_lib, system_lib_prefix :
        Build for the C runtime (``runtime="crt"``) with this symbol prefix.
    c_project : str, optional
        Write a ready C project there (:mod:`kiln.crt.project`); needs ``system_lib`` or AOT.
    dims : list of DimSpec, optional
        ``--dim``: bounds (and divisibility) of symbols, or a symbol fixed to a value.
    quantize_weights : str, optional
        ``--quantize-weights``: ``"int8"`` or ``"q4"`` (``kiln.build``'s ``quantize_weights``).
    cross_compiler, cross_compiler_options : str, optional
        ``--cross-compiler`` (tvmc's option): the compiler that links a library for a foreign
        ``-mtriple`` (``riscv64-linux-gnu-gcc``), with extra flags; without it, a foreign
        target links with ``<triple>-gcc`` when that is on PATH (and says so).
    tuning_records : str, optional
        ``--tuning-records``: ``kiln tune``'s records file; the summary line (kernels tuned,
        why the others fell back) goes to ``echo``.
    tuning_measure : str
        ``--tuning-measure``: apply only records timed with this method
        (:data:`kiln.driver.tuning_records.MEASURE_METHODS`; default ``flush``).

    Returns
    -------
    Path
        The written library (or project folder when there is no ``output``).

    Raises
    ------
    KilnError
        Bad model file, unsupported op, shape errors, compile or toolchain failures, an
        unknown BYOC compiler, ``--dim`` naming an unknown symbol.
    ShapeError
        A symbol given two values (by two ``--input-shape``s, or one and ``--dim NAME=N``), or
        a value outside the symbol's ``--dim`` range.
    CompileError
        The graph or AOT executor (or ``--system-lib``) for a model with symbolic dims.
    """
    import kiln
    from kiln import progress
    from kiln.frontend import from_onnx, load_onnx
    from kiln.target import Target, default_target

    if target is None:
        target = default_target()
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
    tuning = None
    if tuning_records is not None:
        from kiln.driver.apply_history import ApplyHistoryBest

        tuning = ApplyHistoryBest(tuning_records, measure=tuning_measure)
    start = time.perf_counter()
    with progress.stage(f"Importing {Path(model).name}"):
        proto = load_onnx(model)
        name_symbols(proto, shapes)
        model_dims = input_dims(proto)
        fixed, bounds = resolve_symbols(model_dims, shapes, list(dims or []))
        fix_symbols(proto, fixed)
        mod, params = from_onnx(proto, shape=shapes, dim_bounds=bounds)
    executor = choose_executor(mod["main"], executor, "crt" if system_lib else None)
    symbols = symbolic_dims(mod["main"])
    if symbols and executor == "vm":
        echo(f"symbolic dims {', '.join(symbols.values())}: compiling for the VM executor")
    lib = kiln.build(mod, target=tgt, params=params, byoc=list(byoc or []),
                     runtime="crt" if crt else None, executor=executor,
                     system_lib_prefix=system_lib_prefix, quantize_weights=quantize_weights,
                     # AOT names its entry kiln_<model>_run; graph builds keep TVM's "default"
                     mod_name=_model_name(model) if executor == "aot" else "default",
                     tuning_records=tuning)
    if tuning is not None:
        echo(tuning.summary())
    with progress.stage(f"Exporting {out.name}"):
        if crt:
            _export_for_c(lib, output, c_project)
        else:
            lib.export_library(str(out), fcompile=_cross_fcompile(
                tgt, cross_compiler, cross_compiler_options, echo))
    size = out.stat().st_size if out.is_file() else sum(
        f.stat().st_size for f in out.rglob("*") if f.is_file())
    offload = f", byoc {','.join(byoc)}" if byoc else ""
    host = f" (host {tgt.host})" if target_host else ""
    quant = f", {quantize_weights} weights" if quantize_weights else ""
    vm = f", VM executor, symbolic {', '.join(symbols) or 'none'}" if executor == "vm" else ""
    echo(f"wrote {out} ({size / 1e6:.1f} MB, target {target}{host}{offload}{quant}{vm}) "
         f"in {time.perf_counter() - start:.1f} s")
    return out


def symbolic_dims(func) -> dict[str, str]:
    """The symbols of a graph function's inputs, in order of appearance.

    Returns
    -------
    dict
        ``{name: "name in [lo, hi]"}`` (with ``divisible by d`` when it applies).
    """
    from kiln.arith import SymVar

    symbols: dict[str, str] = {}
    for p in func.params:
        for d in getattr(p.checked_type, "shape", ()):
            if isinstance(d, SymVar):
                symbols.setdefault(d.name, describe_bound(d.name, (d.lo, d.hi, d.divisor)))
    return symbols


def _model_name(path: str) -> str:
    """The model's name for generated C symbols (``kiln_<name>_run``): the file's stem."""
    from kiln.backend.aot_codegen import c_identifier

    return c_identifier(Path(path).stem)


def _export_for_c(lib, output: str | None, c_project: str | None) -> None:
    """A build for the C runtime: a static library (plus graph JSON and params for the graph
    executor), a shared library (graph executor: still loadable from Python), a C project."""
    from kiln.cli.run import write_atomic
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


def _cross_fcompile(tgt, compiler: str | None, options: str, echo):
    """The fcompile linking the library: ``compiler`` (with ``options``) when given; for a
    foreign ``-mtriple`` without one, ``<triple>-gcc`` (Debian's cross compilers; the triple's
    vendor part dropped) when it is on PATH; else None (the host's compiler).

    Raises
    ------
    KilnError
        Options without a compiler.
    """
    import shlex
    import shutil

    from kiln.runtime import cross_compiler

    if compiler is None:
        if options:
            raise KilnError("--cross-compiler-options needs --cross-compiler")
        if tgt.is_native or tgt.kind == "jit":
            return None
        parts = tgt.triple.split("-")
        names = [tgt.triple + "-gcc"]
        if len(parts) == 4:  # riscv64-unknown-linux-gnu -> riscv64-linux-gnu-gcc
            names.append("-".join([parts[0], *parts[2:]]) + "-gcc")
        compiler = next((n for n in names if shutil.which(n)), None)
        if compiler is None:
            return None  # export_library says to pass a cross compiler
        echo(f"linking for {tgt.triple} with {compiler} (--cross-compiler to choose another)")
    return cross_compiler(compiler, options=shlex.split(options))
