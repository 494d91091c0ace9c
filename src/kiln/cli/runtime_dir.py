"""``kiln runtime-dir``: print the folder of Kiln's C sources (the native runtime, libkiln_runtime
and kiln_run, with everything it includes), which builds wherever it is copied."""

from __future__ import annotations

import argparse


def add_parser(sub) -> None:
    """Register ``kiln runtime-dir`` on the ``kiln`` subparsers."""
    p = sub.add_parser("runtime-dir", help="print where the native runtime's sources are",
                       description="Print the folder of libkiln_runtime's C sources and "
                                   "Makefile (the native runtime: load a Kiln .so from C/C++ "
                                   "without Python). Build it with: make -C \"$(kiln "
                                   "runtime-dir)\" BUILD=/tmp/kiln-rt [CC=riscv64-linux-gnu-gcc]")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from kiln.native import RUNTIME_DIR

    print(RUNTIME_DIR)
    return 0
