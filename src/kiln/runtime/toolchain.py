"""Running the system C compiler: find it, run commands, report failures.

Commands are argument lists (never a shell string) and every one is logged at DEBUG level on the
``kiln`` logger (``KILN_LOG=debug`` shows them). A failing command raises
:class:`ToolchainError` holding the command line and the tool's stderr.
"""

from __future__ import annotations

import functools
import logging
import os
import shlex
import shutil
import subprocess
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from kiln.errors import ToolchainError

log = logging.getLogger("kiln")

RUNTIME_DIR = Path(__file__).resolve().parent
INCLUDE_DIR = RUNTIME_DIR / "include"
BACKEND_C = RUNTIME_DIR / "support" / "backend.c"

#: flags for each translation unit (the OpenMP pragmas of generated code need -fopenmp)
COMPILE_FLAGS = ("-O3", "-fPIC", "-fopenmp", "-std=gnu99")
#: -Bsymbolic binds the kernels' TVMAPISetLastError to *this* library's error buffer even if
#: another loaded library exports the same name
LINK_FLAGS = ("-shared", "-fopenmp", "-Wl,-Bsymbolic")
#: libraries every kernel library needs, after the objects (kernels call libm: expf, erff...;
#: without it a library loads into Python, which has libm, but not into a plain C program)
LINK_LIBS = ("-lm",)

#: sources the compiler builds (everything else handed to it goes to the linker as is)
SOURCE_SUFFIXES = (".c", ".S")

_INSTALL_HINT = ("install a C compiler (Debian/Ubuntu: `apt-get install gcc`; Fedora: "
                 "`dnf install gcc`) or point $CC at one")
_MAX_STDERR = 8000


def find_cc() -> list[str]:
    """The C compiler command: ``$CC`` (may hold extra words, e.g. ``ccache gcc``), else the
    first of ``cc``, ``gcc``, ``clang`` on PATH.

    Raises
    ------
    ToolchainError
        If ``$CC`` names no executable, or none of the defaults is on PATH.
    """
    env = os.environ.get("CC", "").strip()
    if env:
        words = shlex.split(env)
        if shutil.which(words[0]) is None:
            raise ToolchainError(f"C compiler $CC={env!r} not found: {_INSTALL_HINT}")
        return words
    for name in ("cc", "gcc", "clang"):
        if shutil.which(name):
            return [name]
    raise ToolchainError(f"no C compiler found (looked for $CC, cc, gcc, clang on PATH): "
                         f"{_INSTALL_HINT}")


def run(cmd: Sequence[str], cwd: str | os.PathLike[str] | None = None) -> str:
    """Run ``cmd`` (an argument list) and return its stdout.

    Raises
    ------
    ToolchainError
        If the program is missing or exits nonzero (message: command line and stderr).
    """
    cmd = [str(c) for c in cmd]
    line = shlex.join(cmd)
    log.debug("run: %s", line)
    try:
        proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, errors="replace",
                              check=False)
    except FileNotFoundError:
        raise ToolchainError(f"{cmd[0]} not found while running: {line}\n{_INSTALL_HINT}") from None
    except OSError as err:
        raise ToolchainError(f"cannot run {line}: {err}") from None
    if proc.returncode != 0:
        out = (proc.stderr or proc.stdout or "").strip()
        if len(out) > _MAX_STDERR:
            out = "...\n" + out[-_MAX_STDERR:]
        raise ToolchainError(f"command failed (exit {proc.returncode}): {line}\n{out}")
    if proc.stderr.strip():
        log.debug("%s", proc.stderr.strip())
    return proc.stdout


@functools.lru_cache(maxsize=16)
def _dump_machine(cc: tuple[str, ...]) -> str | None:
    try:
        return run([*cc, "-dumpmachine"]).strip() or None
    except ToolchainError as err:
        log.debug("%s", err)
        return None


def dump_machine(cc: Sequence[str] | None = None) -> str | None:
    """The target triple of compiler ``cc`` (``cc -dumpmachine``, e.g. ``x86_64-linux-gnu``),
    cached per command; None when the compiler cannot tell (the machine check is then skipped).

    Raises
    ------
    ToolchainError
        If ``cc`` is None and no C compiler is found.
    """
    return _dump_machine(tuple(cc or find_cc()))


def compile_objects(sources: Sequence[str | os.PathLike[str]], cc: Sequence[str] | None = None,
                    options: Sequence[str] = (), jobs: int | None = None) -> list[str]:
    """Compile each source (``.c`` or ``.S``) to an object next to it, in parallel.

    An assembler source (``.S``) is assembled in
    its own folder, so ``.incbin "devc.bin"`` finds the file beside it wherever the folder was
    unpacked (a ``.tar`` export).

    Returns
    -------
    list of str
        The object paths, in the order of ``sources``.

    Raises
    ------
    ToolchainError
        The first failure (with its command and stderr).
    """
    cc = list(cc or find_cc())
    # "<name>.<ext>.o": devc.c and devc.S must not both become devc.o
    srcs = [os.path.abspath(s) for s in sources]
    objs = [f"{s}.o" for s in srcs]
    cmds = [[*cc, *COMPILE_FLAGS, f"-I{INCLUDE_DIR}", *options, "-c", s, "-o", o]
            for s, o in zip(srcs, objs, strict=True)]
    dirs = [os.path.dirname(s) if s.endswith(".S") else None for s in srcs]
    workers = max(1, min(len(cmds), jobs or os.cpu_count() or 1))
    if workers == 1:
        for c, d in zip(cmds, dirs, strict=True):
            run(c, cwd=d)
    else:
        with ThreadPoolExecutor(workers) as pool:
            for fut in [pool.submit(run, c, d) for c, d in zip(cmds, dirs, strict=True)]:
                fut.result()
    return objs


def link_shared(objects: Sequence[str], output: str, cc: Sequence[str] | None = None,
                options: Sequence[str] = ()) -> None:
    """Link ``objects`` into the shared library ``output``.

    Raises
    ------
    ToolchainError
        If the linker fails.
    """
    cc = list(cc or find_cc())
    run([*cc, *LINK_FLAGS, "-o", output, *objects, *options, *LINK_LIBS])


def link_relocatable(objects: Sequence[str], output: str, cc: Sequence[str] | None = None
                     ) -> None:
    """Merge ``objects`` into one relocatable object ``output`` (``cc -r``: an ``.o`` that a
    later link turns into a library).

    Raises
    ------
    ToolchainError
        If the linker fails.
    """
    cc = list(cc or find_cc())
    run([*cc, "-r", "-nostdlib", "-o", output, *objects])
