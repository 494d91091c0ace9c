"""Check that Kiln installs on every Python it declares, without those interpreters at hand.

For each Python version, pip resolves the project's dependencies and the extras ``make test``
installs (``.[test,demo]``) as it would for that interpreter (``pip install --dry-run
--python-version X --only-binary=:all:`` with manylinux x86-64 wheels), twice: with the exact pins
of constraints.txt (what make and CI install) and with pyproject.toml's ranges alone (what
``pip install kiln`` into someone's environment gets). Every version from ``requires-python``'s
floor to the newest supported must resolve; the version below the floor must not (else the
floor is too high). The source is also checked for standard-library modules removed in the
supported versions (PEP 594, distutils, imp), which a 3.11 interpreter would still import.

Usage: ``python tools/check_python_versions.py [--newest 3.13]`` (``make check-python``); needs
the package index, so it is a scripted check, not part of ``make test``. Exits 1 on a failure.
"""

from __future__ import annotations

import argparse
import ast
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: modules the supported Pythons no longer have (PEP 594 removals in 3.13; distutils and imp in
#: 3.12; asynchat, asyncore and smtpd in 3.12)
REMOVED_MODULES = {
    "aifc", "asynchat", "asyncore", "audioop", "cgi", "cgitb", "chunk", "crypt", "distutils",
    "imghdr", "imp", "lib2to3", "mailcap", "msilib", "nis", "nntplib", "ossaudiodev", "pipes",
    "smtpd", "sndhdr", "spwd", "sunau", "telnetlib", "uu", "xdrlib",
}
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")


def requirements() -> list[str]:
    """The runtime dependencies and those of the extras ``make test`` installs (test, demo and
    the ``kiln[...]`` extras they name), as requirement strings."""
    proj = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    extras, todo, out = set(), ["test", "demo"], list(proj["dependencies"])
    while todo:
        extra = todo.pop()
        if extra in extras:
            continue
        extras.add(extra)
        for req in proj["optional-dependencies"][extra]:
            if req.startswith("kiln["):
                todo += req[len("kiln["):req.index("]")].split(",")
            else:
                out.append(req)
    return out


def resolves(version: str, pinned: bool) -> tuple[bool, str]:
    """Whether pip finds wheels for every requirement on CPython ``version``; the last line of
    pip's output."""
    with tempfile.TemporaryDirectory() as target:
        cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed",
               "--quiet", "--python-version", version, "--implementation", "cp",
               "--only-binary=:all:", "--target", target]
        for platform in PLATFORMS:
            cmd += ["--platform", platform]
        if pinned:
            cmd += ["-c", str(ROOT / "constraints.txt")]
        proc = subprocess.run(cmd + requirements(), capture_output=True, text=True, timeout=600)
    lines = (proc.stdout + proc.stderr).strip().splitlines()
    return proc.returncode == 0, lines[-1] if lines else ""


def removed_imports() -> list[str]:
    """``path:line: module`` for each import of a module in REMOVED_MODULES under src/, tools/
    and benchmarks/."""
    found = []
    for folder in ("src", "tools", "benchmarks"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                         [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
                for name in names:
                    if name.split(".")[0] in REMOVED_MODULES:
                        found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {name}")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--newest", default="3.13", help="the newest Python to check (3.13)")
    args = parser.parse_args(argv)
    proj = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    floor = tuple(int(p) for p in proj["requires-python"].removeprefix(">=").split("."))
    newest = int(args.newest.split(".")[1])
    failures = [f"imports a removed module: {line}" for line in removed_imports()]
    for minor in range(floor[1] - 1, newest + 1):
        version = f"{floor[0]}.{minor}"
        for pinned in (True, False):
            ok, last = resolves(version, pinned)
            kind = "constraints.txt pins" if pinned else "pyproject ranges"
            expected = minor >= floor[1]
            print(f"python {version} with {kind}: {'resolves' if ok else 'does not resolve'}"
                  + ("" if ok == expected else "  <-- unexpected"))
            if ok != expected:
                failures.append(f"python {version} with {kind}: "
                                + (last if not ok else "resolves below requires-python's floor"))
            if not expected:
                break  # below the floor only the pins matter: they set it
    for failure in failures:
        print(f"FAIL {failure}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
