"""The ``kiln`` command line: compile, tune, run, inspect, demo, cache, serve.

::

    kiln compile model.onnx [--target llvm -mcpu=native] -o model.so [--input-shape NAME:1x3x224x224
    ...]
                 [--dim NAME=LO..HI[:DIV] | --dim NAME=N ...] [--executor graph|vm|aot]
                 [--byoc cblas ...] [--target-host llvm] [--quantize-weights int8|q4]
                 [--int8-products exact|saturate] [--tuning-records records.jsonl] [--quiet]
    kiln compile model.onnx [--system-lib [--system-lib-prefix P] | --executor aot]
                 [-o model.a] [--emit-c-project DIR]
    kiln tune model.onnx [--target T] (--trials N | --time-budget 10m) -o records.jsonl
              [--tuning-records old.jsonl] [--input-shape NAME:SHAPE] [--quiet]
    kiln run model.so [--inputs in.npz] [--outputs out.npz] [--seed N] [--repeat N]
                      [--input-shape NAME:1x77 ...] [--profile] [--profile-json FILE]
                      [--dump-outputs DIR] [-q]
    kiln inspect model.so [--graph graph.json] [--params model.params] [--bytecode]
    kiln demo [orientation|embed|ocr] [--runs N] [-o OUTPUT] [--text TEXT]
    kiln demo chat [--prompt TEXT] [--max-new-tokens N] [--compare] [--quantize-weights Q]
    kiln cache [--trim | --clear]
    kiln serve smollm2|model.onnx|model.so [--host 127.0.0.1] [--port 8000] [--max-batch N]
               [--queue N] [--context N] [--quantize-weights Q] [--tokenizer GGUF]

Every :class:`~kiln.errors.KilnError` (and any unexpected exception) is reported as one line
``kiln: error: <message>`` on stderr with exit status 2; ``KILN_LOG=debug`` turns on DEBUG
logging on the ``kiln`` logger (every external command is logged) and shows tracebacks.
Argument errors are argparse's (the command's usage and message, exit status 2).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
import traceback

from kiln.errors import KilnError

EXIT_ERROR = 2
#: the command modules of kiln.cli, in the order ``kiln --help`` lists them; each has
#: ``add_parser(sub)``, which registers its subparser with ``func`` set
COMMANDS = ("compile", "tune", "cache", "run", "inspect", "runtime_dir", "demo", "serve")


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

    for command in COMMANDS:
        importlib.import_module(f"kiln.cli.{command}").add_parser(sub)
    return parser


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
    try:
        parser = build_parser()  # imports every command's module: seconds (the ONNX frontend)
    except KeyboardInterrupt:
        print("kiln: interrupted", file=sys.stderr)
        return 130
    args = parser.parse_args(argv)
    check = getattr(args, "check_arguments", None)
    if check is not None:  # a command's checks across arguments: its own usage and error
        check(args)
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
