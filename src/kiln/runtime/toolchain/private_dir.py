"""Private folders for caches of code: created ``0700``, checked before use.

Kiln keeps JIT-compiled shared libraries in a cache folder and ``dlopen``\\ s them by name, so
whoever can write that folder can run code in every Kiln process that uses it. A cache at a
predictable path in a shared temp folder (``/tmp/kiln-cache-<uid>``) could be created first by
another user. :func:`private_dir` therefore only hands out a folder that is a real directory
(not a symlink), owned by this user and writable by nobody else; anything else is refused and a
fresh ``tempfile.mkdtemp`` folder (unpredictable, ``0700``, removed when the process exits) is
used instead, with a warning. Scratch folders are always ``tempfile.mkdtemp`` ones.
"""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import stat
import tempfile
from pathlib import Path

log = logging.getLogger("kiln")


def user_cache_dir() -> Path:
    """Kiln's per-user cache folder (not created): ``$KILN_CACHE_DIR`` when set and not empty,
    else ``~/.cache/kiln``. The model cache (:mod:`kiln.models`), the compile cache
    (:mod:`kiln.runtime.toolchain.compile_cache`, in ``objects/``), compiled decoders (``llm/``) and
    device libraries (``device/``) live there; :mod:`kiln.runtime.toolchain.cache_limit` bounds all
    but
    the model files."""
    env = os.environ.get("KILN_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "kiln"


def jit_cache_path() -> Path:
    """Where JIT-compiled libraries are cached (not created): ``$KILN_CACHE_DIR`` when set and
    not empty, else a per-user temp folder ``<tmp>/kiln-cache-<uid>``."""
    env = os.environ.get("KILN_CACHE_DIR")
    return Path(env) if env else Path(tempfile.gettempdir()) / f"kiln-cache-{os.getuid()}"


def is_private_dir(path: str | os.PathLike[str]) -> bool:
    """True when ``path`` is a directory (not a symlink) owned by this user and not writable
    by group or others."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return (stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid()
            and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH))


def private_dir(path: str | os.PathLike[str], what: str = "cache") -> Path:
    """``path``, created with mode ``0700`` (and its parents) if missing, when it is private
    (:func:`is_private_dir`); else a fresh private temp folder for this process.

    Parameters
    ----------
    path : path
        The preferred folder.
    what : str
        Names the folder in the warning.

    Returns
    -------
    Path
        A folder only this user can write.
    """
    p = Path(path)
    try:
        p.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as err:
        log.warning("kiln: cannot create %s folder %s (%s); using a private temp folder",
                    what, p, err.strerror)
        return _fallback(what)
    if is_private_dir(p):
        return p
    log.warning("kiln: %s folder %s is not private (a symlink, another owner, or writable by "
                "others); using a private temp folder instead", what, p)
    return _fallback(what)


_FALLBACK: dict[str, Path] = {}


def _fallback(what: str) -> Path:
    if what not in _FALLBACK:
        tmp = tempfile.mkdtemp(prefix=f"kiln-{what}-")
        atexit.register(shutil.rmtree, tmp, ignore_errors=True)
        _FALLBACK[what] = Path(tmp)
    return _FALLBACK[what]
