"""``kiln compile``: ONNX file → one shared library, with progress and a one-line summary.

A model whose inputs keep symbolic dims after ``--input-shape`` / ``--dim NAME=N`` compiles for
the VM executor (``kiln.build`` → ``VMExecutable``) unless ``--executor`` says otherwise; the
graph and AOT executors need static shapes (a :class:`~kiln.errors.CompileError` listing the
symbolic inputs)."""

from __future__ import annotations

import argparse
import functools
import time
from pathlib import Path

from kiln.cli.arguments import byoc_names, parse_input_shape
from kiln.cli.symbols import (
    DimSpec,
    describe_bound,
    fix_symbols,
    input_dims,
    name_symbols,
    parse_dim,
    resolve_symbols,
    symbolic_inputs,
)
from kiln.driver.build_module import choose_executor, executor_for
from kiln.driver.tuning_records import MEASURE_METHODS, RECORD_MEASURE
from kiln.errors import KilnError


def compile_model(model: str, output: str | None, target: str | None = None,
                  input_shapes: list[tuple[str, tuple[int, ...]]] | None = None,
                  echo=print, byoc: list[str] | None = None,
                  target_host: str | None = None, executor: str | None = None,
                  system_lib: bool = False, system_lib_prefix: str = "",
                  c_project: str | None = None, dims: list[DimSpec] | None = None,
                  quantize_weights: str | None = None, cross_compiler: str | None = None,
                  cross_compiler_options: str = "", tuning_records: str | None = None,
                  tuning_measure: str = RECORD_MEASURE, int8_products: str = "exact") -> Path:
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
    int8_products : str
        ``--int8-products``: ``"exact"`` (default) or ``"saturate"`` (``kiln.build``'s
        ``int8_products``: ``vpmaddubsw`` on AVX2 without VNNI, onnxruntime's arithmetic).
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
    runtime = "crt" if system_lib else None
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
        if executor in ("graph", "aot") or system_lib:  # refused before the import
            executor_for(executor, runtime, symbolic_inputs(model_dims, fixed))
        fix_symbols(proto, fixed)
        mod, params = from_onnx(proto, shape=shapes, dim_bounds=bounds)
    for made in mod["main"].attrs.get("assumptions", ()):
        echo(f"assuming {made.relation()}, checked at run time: {made.where}")
    executor = choose_executor(mod["main"], executor, runtime)
    symbols = symbolic_dims(mod["main"])
    if symbols and executor == "vm":
        echo(f"symbolic dims {', '.join(symbols.values())}: compiling for the VM executor")
    lib = kiln.build(mod, target=tgt, params=params, byoc=list(byoc or []),
                     runtime="crt" if crt else None, executor=executor,
                     system_lib_prefix=system_lib_prefix, quantize_weights=quantize_weights,
                     # AOT names its entry kiln_<model>_run; graph builds keep TVM's "default"
                     mod_name=_model_name(model) if executor == "aot" else "default",
                     tuning_records=tuning, int8_products=int8_products)
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
    quant += ", saturating int8 products" if int8_products == "saturate" else ""
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
    from kiln.cli.files import write_atomic
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


def add_parser(sub) -> None:
    """Register ``kiln compile`` on the ``kiln`` subparsers."""
    p = sub.add_parser("compile", help="compile an ONNX model into a shared library",
                       description="Compile an ONNX model into one shared library (.so).")
    p.add_argument("model", help="the ONNX model file")
    p.add_argument("-o", "--output",
                   help="the library to write: .so or .tar; with --system-lib or --executor "
                        "aot also .a (a static library for the C runtime)")
    p.add_argument("--target", default=None,
                   help='compilation target (default: the fastest for this host, "llvm '
                        '-mcpu=native"; "c -mcpu=native" without llvmlite): "llvm [-mcpu=CPU] '
                        '[-mtriple=...] [-mattr=...]", "llvm -mcpu=portable" (x86-64: kernels '
                        'for x86-64-v2, v3 and v4 in one library, chosen on the CPU at load '
                        'time; or a list, -mcpu=x86-64-v3,x86-64-v4), "c [-mcpu=CPU]" (the '
                        'system C compiler; "c" alone: its generic baseline) or "jit" (kernels '
                        'kept as C source, compiled where the model runs by $KILN_DEVICE_CC)')
    p.add_argument("--target-host", default=None, metavar="TARGET",
                   help='the host target of --target jit: "c" (default) or "llvm"')
    p.add_argument("--input-shape", dest="input_shapes", action="append", default=[],
                   type=parse_input_shape, metavar="NAME:SHAPE",
                   help="fix an input's shape, e.g. data:1x3x224x224 or input:0:1x10 "
                        "(repeatable); its symbolic dims are fixed in every input that shares "
                        "them; dims left symbolic compile for the VM executor")
    p.add_argument("--dim", dest="dims", action="append", default=[], type=parse_dim,
                   metavar="NAME=LO..HI[:DIV]",
                   help="bounds of a symbolic dim (ONNX dim_param), e.g. sequence_length=1..512, "
                        "seq=8..512:8 (multiples of 8) or batch_size=1.. (no upper bound; "
                        "default 1..); NAME=N fixes it to N (repeatable)")
    p.add_argument("--byoc", action="append", default=[], metavar="COMPILER",
                   type=byoc_names,
                   help="offload what an external compiler supports to it: cblas (OpenBLAS) "
                        "or kiln_json (JSON graph runtime); repeatable or comma-separated, "
                        "first listed wins")
    p.add_argument("--system-lib", action="store_true",
                   help="also build the system library (function registry) to run the model "
                        "with Kiln's C runtime, without Python or dlopen")
    p.add_argument("--system-lib-prefix", default="", metavar="PREFIX",
                   help="prefix of the kernels' symbols and of TVMSystemLibEntryPoint, to link "
                        "several models into one program (with --system-lib)")
    p.add_argument("--executor", choices=["graph", "vm", "aot"], default=None,
                   help="graph (graph JSON + params, run by a graph executor; the default for "
                        "static shapes), vm (bytecode run by Kiln's VM, any shape the symbolic "
                        "dims allow; the default when symbolic dims remain) or aot (one "
                        "generated C function, static memory plan, linked params)")
    p.add_argument("--cross-compiler", metavar="CC",
                   help="link a library for a foreign -mtriple with this compiler, e.g. "
                        "riscv64-linux-gnu-gcc (default: <triple>-gcc when on PATH)")
    p.add_argument("--cross-compiler-options", default="", metavar="FLAGS",
                   help="extra flags for --cross-compiler, e.g. \"-march=rv64gcv\"")
    p.add_argument("--quantize-weights", choices=["int8", "q4"], default=None,
                   help="store the weights of MatMul/Gemm layers with constant weights (at "
                        "least 64x64) quantized and dequantize them inside the kernels: int8 "
                        "(per output channel) or q4 (GGUF Q4_1 blocks of 32); default float32")
    p.add_argument("--int8-products", choices=["exact", "saturate"], default="exact",
                   help="integer convolutions and matrix products on x86 with AVX2 and no "
                        "VNNI: exact (default; vpmaddubsw only where the weights prove it "
                        "exact) or saturate (vpmaddubsw everywhere, int16 pair sums "
                        "saturated as in onnxruntime's AVX2 U8S8 kernels; docs/int8.md)")
    p.add_argument("--tuning-records", metavar="FILE",
                   help="apply the best schedules of kiln tune's records (only those measured "
                        "for this exact target on a CPU with this machine's fingerprint, "
                        "at this KILN_NUM_THREADS); "
                        "prints how many kernels were tuned and why the others were not")
    p.add_argument("--tuning-measure", default=RECORD_MEASURE, choices=MEASURE_METHODS,
                   help="apply the records timed with this kiln tune --measure method "
                        "(default: flush; records written before methods were recorded are "
                        "hot)")
    p.add_argument("--emit-c-project", metavar="DIR",
                   help="write a ready C project (sources, runtime, main.c, Makefile honouring "
                        "CC=) to DIR; with --executor aot or --system-lib")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress display")
    p.set_defaults(func=_run, check_arguments=functools.partial(_check_arguments, p))


def _check_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """What argparse cannot say alone: something to write (``-o`` or ``--emit-c-project``);
    ``parser.error`` (kiln compile's usage, exit status 2) otherwise."""
    if args.output is None and args.emit_c_project is None:
        parser.error(f"-o/--output is required (or --emit-c-project DIR): kiln compile "
                     f"{args.model} -o {Path(args.model).with_suffix('.so')}")


def _run(args: argparse.Namespace) -> int:
    compile_model(args.model, args.output, target=args.target, target_host=args.target_host,
                  input_shapes=args.input_shapes,
                  byoc=[name for names in args.byoc for name in names],
                  executor=args.executor, system_lib=args.system_lib,
                  system_lib_prefix=args.system_lib_prefix, c_project=args.emit_c_project,
                  dims=args.dims, quantize_weights=args.quantize_weights,
                  cross_compiler=args.cross_compiler,
                  cross_compiler_options=args.cross_compiler_options,
                  tuning_records=args.tuning_records, tuning_measure=args.tuning_measure,
                  int8_products=args.int8_products)
    return 0
