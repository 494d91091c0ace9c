"""``kiln run``: load a compiled library, feed inputs (.npz or seeded random), time, save outputs.

Graph-executor libraries here; VM libraries (symbolic shapes) through :mod:`kiln.cli.vm`."""

from __future__ import annotations

import argparse
import time

import numpy as np

from kiln.cli.arguments import parse_input_shape, positive_int
from kiln.cli.files import (
    check_output_dir,
    check_output_file,
    format_timing,
    load_inputs,
    load_library,
    open_library,
    random_inputs,
    read_npz,
    save_npz,
)
from kiln.errors import KilnError, ShapeError

FACTORY_NAME = "default"


def run_library(library: str, inputs: str | None = None, outputs: str | None = None,
                seed: int = 0, repeat: int = 1, echo=print, profile: bool = False,
                dump_outputs: str | None = None,
                input_shapes: list[tuple[str, tuple[int, ...]]] | None = None,
                profile_json: str | None = None) -> dict[str, np.ndarray]:
    """Run a compiled library once per ``repeat``; print input and output shapes and timing.

    Parameters
    ----------
    library : str
        Path of a ``.so`` written by ``kiln compile`` / ``export_library``: a graph-executor
        factory, or a VM executable (models with symbolic dims; :mod:`kiln.cli.vm`).
    inputs : str, optional
        ``.npz`` with one array per graph input; random inputs (seeded) when absent. A VM
        library takes any shape its signature allows.
    outputs : str, optional
        ``.npz`` to write the outputs to, keyed by the model's output names.
    seed : int
        Seed for random inputs.
    repeat : int
        Timed runs; min/median/max are printed (ms, wall clock). With ``profile``: measurements
        per node (the graph executor) or profiled calls whose per-kernel medians are shown
        (the VM). The VM is timed after one untimed call (the call that gives the outputs).
        The kernels of ``jit`` modules are compiled before any run, untimed
        (:func:`compile_jit_kernels`, which says so on stderr).
    echo : callable
        Receives each printed line.
    profile : bool
        Print the per-node table (graph executor: ``debug_create``,
        ``kiln.debug_executor.DebugReport.table``, slowest node first) or the VM's per-kernel
        table (``kiln.vm.VirtualMachine.profile``, in call order); both list the ONNX nodes
        each kernel covers when the library records them.
    dump_outputs : str, optional
        Folder for every node's output (``.npy`` per output, ``nodes.json``, and
        ``onnx_tensors.npz``: the ONNX tensors the kernels' outputs hold, keyed by ONNX name,
        in the model's layout); implies ``profile``; graph-executor libraries only.
    input_shapes : list of (name, shape), optional
        ``--input-shape``: shapes of random inputs. For a VM library they size the inputs'
        symbols (other inputs sharing a symbol follow; a symbol no shape sets takes its
        smallest allowed value, see :mod:`kiln.cli.vm`); for a graph library they must equal
        the compiled shapes.
    profile_json : str, optional
        Write the profile as a Chrome trace (:mod:`kiln.cli.profile_trace`: one event per
        kernel call, ``repeat`` runs); implies ``profile``.

    Returns
    -------
    dict
        ``{output name: array}``.

    Raises
    ------
    KilnError
        Unloadable library, bad input file, ``--input-shape`` with ``--inputs``, an unknown
        input name, an ``outputs`` or ``profile_json`` file or ``dump_outputs`` folder that
        cannot be written (checked before loading), ``--dump-outputs`` on a VM library.
    ShapeError
        Graph: an input shape that differs from the library's. VM: the VM's checks (rank,
        dtype, a symbol with two values, a value outside the symbol's bounds).
    """
    from kiln.cli.vm import is_vm_library

    given = shape_dict(input_shapes)
    if inputs and given:
        raise KilnError("--input-shape sets the shapes of random inputs; with --inputs the "
                        "arrays' own shapes are used")
    for path in (outputs, profile_json):  # checked before the model is loaded and run
        if path:
            check_output_file(path)
    profile = profile or profile_json is not None
    if dump_outputs is not None:
        check_output_dir(dump_outputs)
    root = load_library(library)
    compile_jit_kernels(root)
    if is_vm_library(root):
        if dump_outputs is not None:
            raise KilnError("--dump-outputs needs a graph-executor library (the VM profiler "
                            "reports kernel times, not node outputs)")
        result, lines, trace = _run_vm_library(root, inputs, seed, repeat, profile, given)
    else:
        result, lines, trace = _run_graph_library(library, root, inputs, seed, repeat,
                                                  profile, dump_outputs, given)
    for line in lines:
        echo(line)
    if profile_json:
        from kiln.cli.profile_trace import write_trace

        write_trace(profile_json, trace)
        echo(f"wrote {profile_json} ({sum(e['cat'] == 'Node' for e in trace['traceEvents'])} "
             "kernel calls, Chrome trace)")
    if outputs:
        save_npz(outputs, result)
        echo(f"wrote {outputs}")
    return result


def compile_jit_kernels(root) -> None:
    """Compile the kernels of the library's ``jit`` modules (C source compiled on the first
    call, :class:`kiln.runtime.jit.device_module.SourceDeviceModule`) before anything is
    timed, and say on stderr how long that took (:func:`kiln.progress.notice`: not with
    ``--quiet``): the first timed run would otherwise report the compiler's time as the
    model's.

    Raises
    ------
    ToolchainError, KilnError
        The device compiler is missing or fails (as the first call would raise).
    """
    from kiln import progress
    from kiln.runtime.jit.device_module import SourceDeviceModule
    from kiln.runtime.module import modules_dfs

    pending = [m for m in modules_dfs(root)
               if isinstance(m, SourceDeviceModule) and not m.compiled]
    if not pending:
        return
    start = time.perf_counter()
    with progress.stage("Compiling the jit kernels"):
        for module in pending:
            module.prepare()
    progress.notice(f"first call compiles the jit kernels ({time.perf_counter() - start:.1f} "
                    "s); timings below exclude it")


def shape_dict(input_shapes: list[tuple[str, tuple[int, ...]]] | None
               ) -> dict[str, tuple[int, ...]]:
    """``--input-shape`` pairs as a dict.

    Raises
    ------
    KilnError
        The same input given two different shapes.
    """
    shapes: dict[str, tuple[int, ...]] = {}
    for name, shape in input_shapes or []:
        named = [d for d in shape if isinstance(d, str)]
        if named:
            raise KilnError(f"--input-shape {name}: give sizes, not symbol names "
                            f"({', '.join(named)}), to make inputs")
        if name in shapes and shapes[name] != shape:
            raise KilnError(f"--input-shape given twice for {name!r}: {shapes[name]} and {shape}")
        shapes[name] = tuple(shape)
    return shapes


def _output_lines(result: dict[str, np.ndarray]) -> list[str]:
    return [f"output {name}: shape {tuple(arr.shape)} {arr.dtype}" for name, arr in result.items()]


def _run_vm_library(root, inputs: str | None, seed: int, repeat: int, profile: bool,
                    given: dict[str, tuple[int, ...]]):
    """A VM library: ``.npz`` or random inputs of the shapes ``given`` picks; see
    :func:`kiln.cli.vm.run_vm`."""
    from kiln.cli.vm import cast_inputs, concrete, input_shapes, run_vm, vm_signature

    sig = vm_signature(root)
    lines = []
    if inputs:
        feed = cast_inputs(read_npz(inputs, [t.name for t in sig.inputs]), sig, inputs)
        lines.append(f"inputs: {inputs}")
    else:
        shapes, defaulted = input_shapes(sig, given)
        feed = random_inputs(concrete(sig, shapes), seed)
        lines.append(f"inputs: random (seed {seed})")
        if defaulted:
            lines.append("symbols at their smallest value (--input-shape NAME:SHAPE sets "
                         f"them): {', '.join(f'{k}={v}' for k, v in defaulted.items())}")
    lines += [f"input {name}: shape {tuple(arr.shape)} {arr.dtype}" for name, arr in feed.items()]
    result, report, trace = run_vm(root, feed, sig, repeat=repeat, profile=profile)
    return result, [*lines, *_output_lines(result), *report], trace


def _check_graph_shapes(info, given: dict[str, tuple[int, ...]]) -> None:
    names = {t.name: t.shape for t in info.inputs}
    for name, shape in given.items():
        if name not in names:
            raise KilnError(f"--input-shape for unknown input {name!r}; the inputs are "
                            f"{list(names)}")
        if shape != names[name]:
            raise ShapeError(f"--input-shape {name}:{'x'.join(map(str, shape))}: the library "
                             f"was compiled for input {name!r} of shape {names[name]} (recompile "
                             "with symbolic dims for other shapes)")


def _run_graph_library(library: str, root, inputs: str | None, seed: int, repeat: int,
                       profile: bool, dump_outputs: str | None,
                       given: dict[str, tuple[int, ...]]):
    """A graph-executor library: the graph executor, or the debug executor (``profile``).
    Returns (outputs, lines, the Chrome trace of the profile or None)."""
    import kiln

    trace = None
    _, info, _ = open_library(library, root)
    _check_graph_shapes(info, given)
    feed = load_inputs(inputs, info.inputs) if inputs else random_inputs(info.inputs, seed)
    profile = profile or dump_outputs is not None
    create = root.get_function("debug_create" if profile else FACTORY_NAME)
    if create is None:
        raise KilnError(f"{library}: no {'debug_create' if profile else FACTORY_NAME!r} "
                        "executor factory function")
    if profile:
        from kiln.debug_executor import GraphModuleDebug

        gmod = GraphModuleDebug(create(FACTORY_NAME, kiln.cpu()), dump_root=dump_outputs)
        for name, value in feed.items():
            gmod.set_input(name, value)
        report = gmod.run(repeat=repeat)
        report_lines = report.table().splitlines()
        from kiln.cli.profile_trace import graph_trace

        trace = graph_trace(report)
    else:
        gmod = kiln.graph_executor.GraphModule(create(kiln.cpu()))
        for name, value in feed.items():
            gmod.set_input(name, value)
        times = []
        for _ in range(repeat):
            start = time.perf_counter()
            gmod.run()
            times.append((time.perf_counter() - start) * 1e3)
        report_lines = [format_timing(times)]
    result = {t.name: gmod.get_output(k).numpy() for k, t in enumerate(info.outputs)}
    source = inputs if inputs else f"random (seed {seed})"
    lines = [f"inputs: {source}", *_output_lines(result), *report_lines]
    if dump_outputs:
        lines.append(f"wrote node outputs to {dump_outputs}")
    return result, lines, trace


def add_parser(sub) -> None:
    """Register ``kiln run`` on the ``kiln`` subparsers."""
    p = sub.add_parser("run", help="run a compiled library on inputs from .npz or random",
                       description="Run a compiled library once (or --repeat times).")
    p.add_argument("library", help="the compiled library (.so)")
    p.add_argument("--inputs", help=".npz with one array per graph input (keys: input names); "
                                    "random inputs when absent")
    p.add_argument("--outputs", help="write the outputs to this .npz (keys: output names)")
    p.add_argument("--seed", type=int, default=0, help="seed of random inputs (default: 0)")
    p.add_argument("--input-shape", dest="input_shapes", action="append", default=[],
                   type=parse_input_shape, metavar="NAME:SHAPE",
                   help="shape of a random input of a VM library (symbolic dims), e.g. "
                        "input_ids:1x77; inputs sharing its symbols follow, and symbols no "
                        "shape sets take their smallest allowed value (repeatable)")
    p.add_argument("--repeat", type=positive_int, default=1,
                   help="timed runs; prints min/median/max (default: 1); with --profile: "
                        "measurements per node")
    p.add_argument("--profile", action="store_true",
                   help="print per-kernel times with the ONNX nodes each kernel covers "
                        "(graph: the debug executor, slowest first; VM: every kernel call "
                        "in order)")
    p.add_argument("--profile-json", metavar="FILE",
                   help="write the profile as a Chrome trace JSON (chrome://tracing, "
                        "Perfetto; onnxruntime's profiler layout): one event per kernel call "
                        "with its ONNX nodes, op types and shapes; implies --profile")
    p.add_argument("--dump-outputs", metavar="DIR",
                   help="write every node's output to DIR (.npy per output, nodes.json) and "
                        "onnx_tensors.npz: the ONNX tensors the kernels compute, keyed by "
                        "ONNX tensor name, in the model's layout (NCHW), to compare with "
                        "onnxruntime; graph libraries only; implies --profile")
    p.add_argument("-q", "--quiet", action="store_true",
                   help="no progress display and no notices on stderr")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    run_library(args.library, inputs=args.inputs, outputs=args.outputs, seed=args.seed,
                repeat=args.repeat, profile=args.profile, dump_outputs=args.dump_outputs,
                input_shapes=args.input_shapes, profile_json=args.profile_json)
    return 0
