"""Checking a target's ``-mcpu`` and ``-mattr`` names against what LLVM knows for its triple.

LLVM only prints "'x' is not a recognized processor for this target" on fd 2 and goes on with a
generic CPU; :func:`check_llvm_names` catches that text while it creates a target machine and
turns it into a :class:`~kiln.errors.CompileError` with the closest valid names (LLVM's
``-mcpu=help`` list). Split from :mod:`kiln.target`, which calls it when a Target is built.

May import: kiln.errors only.
"""

from __future__ import annotations

import difflib
import os
import re
import subprocess
import sys
import tempfile
import threading
from functools import lru_cache
from typing import Any

from kiln.errors import CompileError

_UNKNOWN = re.compile(r"'([^']*)' is not a recognized (processor|feature) for this target")
_probe_lock = threading.Lock()


def check_llvm_names(spec: str, triple: str, options: dict[str, Any], multi_level: bool) -> None:
    """Raise :class:`CompileError` (naming the target ``spec``, its ``triple`` and the closest
    valid names) for an ``-mcpu`` or ``-mattr`` name in ``options`` that LLVM does not know for
    ``triple``; a ``multi_level`` -mcpu (``portable``) is Kiln's, not LLVM's."""
    cpu, features = options.get("mcpu"), user_features(options.get("mattr"))
    if cpu is True:
        raise CompileError(f"target '{spec}': -mcpu needs a value (-mcpu=<cpu>)")
    probe = "" if cpu in (None, "", "native") or multi_level else str(cpu)
    unknown = _llvm_unknown_names(triple, probe, features) if probe or features else ()
    if not unknown:
        return
    what, name = unknown[0]
    known = _llvm_known_names(triple)[what == "feature"]
    close = [n for n in difflib.get_close_matches(name.lstrip("+-"), known, n=5, cutoff=0.5)
             if n.replace("_", "-") == n or n.replace("_", "-") not in known][:4]
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    x86 = triple.startswith(("x86_64", "amd64"))
    also = " (-mcpu also takes native or portable)" if x86 else ""
    raise CompileError(f"target '{spec}': LLVM does not know the " + (
        f"CPU {name!r} for triple {triple}{hint}{also}" if what == "processor"
        else f"feature {name!r} (-mattr) for triple {triple}{hint}"))


def user_features(raw: Any) -> tuple[str, ...]:
    """``-mattr`` as written, each name with its ``+`` / ``-`` (``+`` when none is given)."""
    words = [w.strip() for w in str(raw).split(",")] if raw and raw is not True else []
    return tuple(w if w[0] in "+-" else "+" + w for w in words if w)


@lru_cache(maxsize=256)
def _llvm_unknown_names(triple: str, cpu: str,
                        features: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    """``(("processor" | "feature", name), ...)`` LLVM calls unknown on fd 2 as it creates a
    target machine; () without llvmlite or fd 2, or for a triple LLVM lacks (building says)."""
    try:
        import llvmlite.binding as llvm
    except ImportError:
        return ()
    with _probe_lock, tempfile.TemporaryFile() as tmp:
        llvm.initialize_all_targets()  # idempotent; kiln.codegen.llvm.machine does the same
        try:
            tgt = llvm.Target.from_triple(triple)
            sys.stderr.flush()
            saved = os.dup(2)
        except (RuntimeError, OSError):
            return ()
        os.dup2(tmp.fileno(), 2)
        try:
            tgt.create_target_machine(cpu=cpu, features=",".join(features))
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        tmp.seek(0)
        text = tmp.read().decode(errors="replace")
    rest = "".join(line for line in text.splitlines(keepends=True) if not _UNKNOWN.search(line))
    sys.stderr.write(rest)  # what someone else wrote meanwhile
    return tuple(dict.fromkeys((m.group(2), m.group(1)) for m in _UNKNOWN.finditer(text)))


@lru_cache(maxsize=16)
def _llvm_known_names(triple: str) -> tuple[list[str], list[str]]:
    """The CPU and feature names LLVM knows for ``triple``: its ``-mcpu=help`` list, which it
    prints once per process (so a child process prints it; only a refusal asks)."""
    try:
        out = subprocess.run([sys.executable, "-c", "import sys, llvmlite.binding as b; b."
                              "initialize_all_targets(); b.Target.from_triple(sys.argv[1])."
                              "create_target_machine(cpu='help')", triple],
                             capture_output=True, text=True, timeout=60, check=False).stderr
    except (OSError, subprocess.SubprocessError):
        out = ""
    names: tuple[list[str], list[str]] = ([], [])
    into = None
    for line in out.splitlines():
        if line.startswith("Available "):
            into = names[line.startswith("Available features")]
        elif into is not None and line.startswith("  ") and " - " in line:
            into.append(line.split()[0])
    return names
