"""The ``kiln`` command line: compile, tune, run, inspect, demo, cache.

::

    kiln compile model.onnx [--target llvm -mcpu=native] -o model.so [--input-shape NAME:1x3x224x224 ...]
                 [--dim NAME=LO..HI[:DIV] | --dim NAME=N ...] [--executor graph|vm|aot]
                 [--byoc cblas ...] [--target-host llvm] [--quantize-weights int8|q4]
                 [--tuning-records records.jsonl] [--quiet]
    kiln compile model.onnx [--system-lib [--system-lib-prefix P] | --executor aot]
                 [-o model.a] [--emit-c-project DIR]
    kiln tune model.onnx [--target T] (--trials N | --time-budget 10m) -o records.jsonl
              [--tuning-records old.jsonl] [--input-shape NAME:SHAPE] [--quiet]
    kiln run model.so [--inputs in.npz] [--outputs out.npz] [--seed N] [--repeat N]
                      [--input-shape NAME:1x77 ...] [--profile] [--dump-outputs DIR]
    kiln inspect model.so [--graph graph.json] [--params model.params] [--bytecode]
    kiln demo [orientation|embed|ocr] [--runs N] [-o OUTPUT] [--text TEXT]
    kiln demo chat [--prompt TEXT] [--max-new-tokens N] [--compare] [--quantize-weights Q]
    kiln cache [--trim | --clear]

Every :class:`~kiln.errors.KilnError` (and any unexpected exception) is reported as one line
``kiln: error: <message>`` on stderr with exit status 2; ``KILN_LOG=debug`` turns on DEBUG
logging on the ``kiln`` logger (every external command is logged) and shows tracebacks.
Argument errors are argparse's (usage and message, exit status 2).
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import sys
import traceback

from kiln.cli.symbols import parse_dim
from kiln.errors import KilnError
from kiln.driver.tuning_records import MEASURE_METHODS, RECORD_MEASURE

EXIT_ERROR = 2
#: ``kiln demo NAME`` → its module in kiln.demo
DEMOS = {"orientation": "orientation", "embed": "embed", "ocr": "ocr", "chat": "chat"}


_SYMBOL = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: a dim written as a sum or product of symbols and ints (``past+sequence``)
_DIM_EXPR = re.compile(r"[A-Za-z0-9_+\-*() ]*[+\-*][A-Za-z0-9_+\-*() ]*")


def parse_input_shape(text: str) -> tuple[str, tuple[int | str, ...]]:
    """Parse ``NAME:D0xD1x...`` into ``(NAME, (D0, D1, ...))``.

    The split is at the last colon, so names holding a colon (``input:0``) work. A scalar
    input is written with an empty shape (``NAME:``). A dim may be a symbol's name instead of
    a size (``state:2xbatchx128``: ``kiln compile`` gives that dim the symbol ``batch``, so
    that unnamed dims of several inputs become one variable), or a sum or product of symbols
    and ints (``attention_mask:batchxpast+sequence``: a decoder's mask spans the past and the
    new tokens; checked at run time); dims holding an ``x`` are written with commas
    (``ids:1,max_len``).

    Parameters
    ----------
    text : str
        The ``--input-shape`` argument.

    Returns
    -------
    tuple
        ``(name, shape)`` with a non-empty name; each dim a positive int or a symbol name.

    Raises
    ------
    argparse.ArgumentTypeError
        If there is no colon, the name is empty or a dimension is neither a positive integer
        nor a name.
    """
    name, sep, dims = text.rpartition(":")
    if not sep or not name:
        raise argparse.ArgumentTypeError(
            f"expected NAME:SHAPE such as data:1x3x224x224, got {text!r}")
    if not dims:
        return name, ()
    shape: list[int | str] = []
    for d in dims.split(",") if "," in dims else re.split("[xX]", dims):
        if d.isdigit() and int(d) > 0:
            shape.append(int(d))
        elif (_SYMBOL.fullmatch(d) and not d.isdigit()) or (
                _DIM_EXPR.fullmatch(d) and re.search("[A-Za-z_]", d)):
            shape.append(d)
        else:
            raise argparse.ArgumentTypeError(
                f"bad dimension {d!r} in {text!r}: dimensions are positive integers, symbol "
                "names or sums of them (past+sequence), joined by 'x' (or by ',')")
    return name, tuple(shape)


def _byoc_names(text: str) -> list[str]:
    """``--byoc``: one or more comma-separated compiler names (checked by the build)."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise argparse.ArgumentTypeError("expected a compiler name, e.g. cblas")
    return names


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The ``kiln`` argument parser (one subparser per command, ``func`` set on each).

    Returns
    -------
    argparse.ArgumentParser
    """
    from kiln import __version__

    parser = argparse.ArgumentParser(
        prog="kiln",
        description="Kiln: compile ONNX models into one self-contained shared library.",
    )
    parser.add_argument("--version", action="version", version=f"kiln {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

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
                   type=_byoc_names,
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
    p.set_defaults(func=_cmd_compile)

    from kiln.cli.tune import add_parser as add_tune_parser

    add_tune_parser(sub, parse_input_shape, _positive_int)

    from kiln.cli.cache import add_parser as add_cache_parser

    add_cache_parser(sub)

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
    p.add_argument("--repeat", type=_positive_int, default=1,
                   help="timed runs; prints min/median/max (default: 1); with --profile: "
                        "measurements per node")
    p.add_argument("--profile", action="store_true",
                   help="print per-node times (graph: the debug executor, slowest first; "
                        "VM: every kernel call in order)")
    p.add_argument("--dump-outputs", metavar="DIR",
                   help="write every node's output to DIR (.npy per output, nodes.json); "
                        "implies --profile")
    p.set_defaults(func=_cmd_run)

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
    p.set_defaults(func=_cmd_inspect)

    p = sub.add_parser("runtime-dir", help="print where the native runtime's sources are",
                       description="Print the folder of libkiln_runtime's C sources and "
                                   "Makefile (the native runtime: load a Kiln .so from C/C++ "
                                   "without Python). Build it with: make -C \"$(kiln "
                                   "runtime-dir)\" BUILD=/tmp/kiln-rt [CC=riscv64-linux-gnu-gcc]")
    p.set_defaults(func=_cmd_runtime_dir)

    p = sub.add_parser("demo", help="compile a real model and check it against onnxruntime",
                       description="orientation (default): PP-LCNet text orientation on a "
                                   "rendered page turned 0/90/180/270°; embed: MiniLM-L3 "
                                   "sentence embeddings, cosine similarities; ocr: PP-OCRv4 "
                                   "detection and recognition of a rendered line of text; "
                                   "chat: SmolLM2-135M-Instruct replying to a prompt. "
                                   "Each is compiled with Kiln and compared with onnxruntime.")
    p.add_argument("name", nargs="?", default="orientation", choices=DEMOS,
                   help="which demo (default: orientation)")
    p.add_argument("--runs", type=_positive_int, default=5,
                   help="timed runs per image (median shown; default: 5)")
    p.add_argument("-o", "--output", help="keep the compiled library at this path (ocr: a "
                                          "folder for its two libraries)")
    p.add_argument("--text", help="ocr: the line of text to render and read")
    p.add_argument("--prompt", help="chat: the user's message (default: 'What is the capital "
                                    "of France?')")
    p.add_argument("--max-new-tokens", type=_positive_int, default=64,
                   help="chat: the most tokens to generate (default: 64)")
    p.add_argument("--compare", action="store_true",
                   help="chat: also generate with onnxruntime and compare the token ids")
    p.add_argument("--target", default="llvm -mcpu=native",
                   help="chat: the Kiln target (default: llvm -mcpu=native)")
    p.add_argument("--quantize-weights", choices=("int8", "q4"),
                   help="chat: weight-only quantization of the matmul weights")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress display")
    p.set_defaults(func=_cmd_demo)
    return parser


def _cmd_compile(args: argparse.Namespace) -> int:
    from kiln.cli.compile import compile_model

    compile_model(args.model, args.output, target=args.target, target_host=args.target_host,
                  input_shapes=args.input_shapes,
                  byoc=[name for names in args.byoc for name in names],
                  executor=args.executor, system_lib=args.system_lib,
                  system_lib_prefix=args.system_lib_prefix, c_project=args.emit_c_project,
                  dims=args.dims, quantize_weights=args.quantize_weights,
                  cross_compiler=args.cross_compiler,
                  cross_compiler_options=args.cross_compiler_options,
                  tuning_records=args.tuning_records, tuning_measure=args.tuning_measure)
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    from kiln.cli.run import run_library

    run_library(args.library, inputs=args.inputs, outputs=args.outputs, seed=args.seed,
                repeat=args.repeat, profile=args.profile, dump_outputs=args.dump_outputs,
                input_shapes=args.input_shapes)
    return 0


def _cmd_inspect(args: argparse.Namespace) -> int:
    from kiln.cli.inspect import inspect_library

    inspect_library(args.library, graph_out=args.graph, params_out=args.params,
                    bytecode=args.bytecode)
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    import importlib

    if args.text is not None and args.name != "ocr":
        raise KilnError("--text applies to 'kiln demo ocr' only")
    chat = {"prompt": args.prompt, "max_new_tokens": args.max_new_tokens,
            "compare": args.compare, "target": args.target,
            "quantize_weights": args.quantize_weights}
    if args.name != "chat" and (args.prompt is not None or args.compare
                                or args.quantize_weights):
        raise KilnError("--prompt, --compare and --quantize-weights apply to 'kiln demo chat'")
    try:
        module = importlib.import_module(f"kiln.demo.{DEMOS[args.name]}")
    except ImportError as err:  # Pillow or onnxruntime missing
        raise KilnError(f"kiln demo needs the demo extra (pip install 'kiln[demo]'): {err}") \
            from err
    extra = {"text": args.text} if args.text is not None else {}
    if args.name == "chat":
        return module.run_demo(**chat)
    return module.run_demo(runs=args.runs, output=args.output, **extra)


def setup_logging() -> bool:
    """Configure the ``kiln`` logger from ``KILN_LOG``; return whether debug mode is on."""
    level = os.environ.get("KILN_LOG", "").strip().lower()
    logger = logging.getLogger("kiln")
    if level in ("debug", "info", "warning", "error"):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("kiln %(levelname)s %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(getattr(logging, level.upper()))
    return level == "debug"


def _one_line(message: str) -> str:
    lines = [ln.strip() for ln in str(message).strip().splitlines() if ln.strip()]
    if not lines:
        return "(no message)"
    if len(lines) == 1:
        return lines[0]
    return f"{lines[0]} (+{len(lines) - 1} more lines; KILN_LOG=debug shows them)"


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so the interpreter's final flush does not fail again."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError):  # no file descriptor (an embedding, a test's capture)
        pass


def _cmd_runtime_dir(args: argparse.Namespace) -> int:
    from kiln.native import RUNTIME_DIR

    print(RUNTIME_DIR)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``kiln`` command.

    Parameters
    ----------
    argv : list of str, optional
        Arguments without the program name (default: ``sys.argv[1:]``).

    Returns
    -------
    int
        Exit status: 0 on success, 1 when ``kiln demo`` found a wrong prediction, 2 on any
        error (usage, :class:`KilnError`, or an unexpected exception).
    """
    debug = setup_logging()
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "compile" and args.output is None and args.emit_c_project is None:
        parser.error("compile needs -o/--output (or --emit-c-project DIR)")
    from kiln import progress

    if getattr(args, "quiet", False):
        progress.set_quiet(True)
    try:
        return int(args.func(args))
    except KeyboardInterrupt:
        print("kiln: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # the reader went away (`kiln inspect m.so | head`): stop quietly, like other CLIs
        _silence_stdout()
        return 141  # 128 + SIGPIPE, what a shell reports for a command killed by SIGPIPE
    except KilnError as err:
        if debug:
            traceback.print_exc()
            print(f"kiln: error: {err}", file=sys.stderr)
        else:
            print(f"kiln: error: {_one_line(str(err))}", file=sys.stderr)
        return EXIT_ERROR
    except Exception as err:  # noqa: BLE001 - a bug: one line unless debugging
        if debug:
            traceback.print_exc()
        name = type(err).__name__
        print(f"kiln: error: internal error ({name}): {_one_line(str(err))}", file=sys.stderr)
        return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
