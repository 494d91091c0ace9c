"""Files the repository generates and commits (a C header, a docs table): write one when its
text changed, or with ``--check`` only say whether the committed copy is stale."""

from __future__ import annotations

import sys
from pathlib import Path


def write_or_check(path: Path, text: str, check: bool, command: str) -> int:
    """Write ``text`` to ``path`` if it differs (printing ``wrote PATH``); with ``check``, write
    nothing and return 1 when ``path`` is missing or differs (naming ``command`` to regenerate
    it on stderr). Returns the exit status: 0 or 1."""
    current = path.read_text() if path.is_file() else None
    if check:
        if current != text:
            print(f"{path} is stale: run {command}", file=sys.stderr)
            return 1
        return 0
    if current != text:
        path.write_text(text)
        print(f"wrote {path}")
    return 0
