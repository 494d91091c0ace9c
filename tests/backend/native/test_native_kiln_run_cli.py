"""``kiln_run``'s command line (src/kiln/native/tools/kiln_run.c), built by the runtime's
Makefile: ``-h``/``--help`` print the usage on stdout and exit 0 (it used to try to load a
library named ``--help``); an option where the library goes is a usage error (exit 2)."""

from __future__ import annotations

import subprocess

import pytest


def _kiln_run(native_rt, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(native_rt / "kiln_run"), *args], capture_output=True, text=True,
                          timeout=60, check=False)


@pytest.mark.parametrize("argv", [["--help"], ["-h"], ["model.so", "--repeat", "3", "--help"]])
def test_help_prints_usage_and_exits_0(native_rt, argv):
    proc = _kiln_run(native_rt, *argv)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert proc.stdout.startswith("usage: kiln_run model.so [--repeat N] IN.bin... OUT.bin...\n")
    assert "--shape NAME=1x7" in proc.stdout and "-h, --help" in proc.stdout


@pytest.mark.parametrize("argv", [[], ["--repeat", "3", "model.so"], ["--version"]])
def test_usage_errors_exit_2(native_rt, argv):
    proc = _kiln_run(native_rt, *argv)
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout
    assert proc.stderr.startswith("usage: kiln_run "), proc.stderr
