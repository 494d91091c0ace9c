"""The compile cache: compiled code keyed by a content hash, shared by processes and builds.

Compiling the kernels of a model is most of ``kiln.build`` + ``export_library`` (ResNet-50:
seconds of C compiler or LLVM time against under a second for the rest), and the same kernels
come back on every rebuild. Two producers store their results here:

- :func:`kiln.runtime.toolchain.compiler.compile_objects` — one object per C source file, keyed by
the
  compiler's identity (its ``-###`` report: version, target, what ``-march=native`` means on
  this machine), the exact command line minus file names, and the *preprocessed* source (so a
  changed header is a different key); the preprocessor is skipped when a *manifest* (entry
  kind ``"manifest"``, :mod:`kiln.runtime.toolchain.cc_manifest`) shows that the source and every
  header
  it read or looked for are unchanged;
- :func:`kiln.codegen.llvm.build.build_llvm` — one object (and its optimized IR) per kernel group,
  keyed by the LLVM IR text, the target machine (triple, resolved CPU and features, ABI,
  optimization level) and the llvmlite/LLVM versions.

Where: ``$KILN_CACHE_DIR/objects`` (default ``~/.cache/kiln/objects``), a private folder (mode
``0700``, refused when it is a symlink, another user's or writable by others: objects found
there are linked into libraries that get loaded as code; see
:mod:`kiln.runtime.toolchain.private_dir`). ``KILN_NO_CACHE=1`` turns the cache off (nothing is read
or
written; the model cache of :mod:`kiln.models` is not affected). The folder is bounded by
``KILN_CACHE_MAX_SIZE`` (default 5 GiB, one total with Kiln's other caches of compiled code):
a store may trim the least recently used entries, and a hit refreshes its entry's modification
time (:mod:`kiln.runtime.toolchain.cache_limit`).

Entries are written to a temporary name in the same folder and renamed into place, so two
processes compiling the same kernel at once both succeed and readers never see a partial file.
Each entry holds its own length and SHA-256: a short or corrupt entry is ignored (logged at
DEBUG) and rebuilt. ``KILN_LOG=debug`` logs every hit and store.
"""

from __future__ import annotations

import hashlib
import logging
import os
import struct
import tempfile
from collections.abc import Sequence
from pathlib import Path

from kiln.runtime.toolchain import cache_limit
from kiln.runtime.toolchain.private_dir import private_dir, user_cache_dir

log = logging.getLogger("kiln")

#: first bytes of an entry (a new layout gets a new magic, so old entries read as misses)
MAGIC = b"KILNCC1\n"
_COUNT = struct.Struct("<I")
_LEN = struct.Struct("<Q")
_TRUE = ("1", "true", "yes", "on")


def enabled() -> bool:
    """False when ``$KILN_NO_CACHE`` is set to 1/true/yes/on."""
    return os.environ.get("KILN_NO_CACHE", "").strip().lower() not in _TRUE


def objects_dir() -> Path:
    """The cache folder (``$KILN_CACHE_DIR/objects``, default ``~/.cache/kiln/objects``),
    created ``0700``; a private temp folder when it is not private."""
    return private_dir(user_cache_dir() / "objects", "compile cache")


def make_key(*parts: str | bytes) -> str:
    """The SHA-256 (hex) of ``parts``, each length-prefixed so no two part lists collide."""
    h = hashlib.sha256()
    for p in parts:
        b = p.encode() if isinstance(p, str) else bytes(p)
        h.update(_LEN.pack(len(b)))
        h.update(b)
    return h.hexdigest()


def _path(key: str, kind: str) -> Path:
    return objects_dir() / f"{key}.{kind}"


def _encode(parts: Sequence[bytes]) -> bytes:
    head = _COUNT.pack(len(parts)) + b"".join(_LEN.pack(len(p)) for p in parts)
    payload = b"".join(parts)
    return MAGIC + head + hashlib.sha256(payload).digest() + payload


def _decode(data: bytes) -> list[bytes] | None:
    """The parts of an entry, or None when it is short, corrupt or of another layout."""
    pos = len(MAGIC)
    if data[:pos] != MAGIC or len(data) < pos + _COUNT.size:
        return None
    (count,) = _COUNT.unpack_from(data, pos)
    pos += _COUNT.size
    if count > 64 or len(data) < pos + count * _LEN.size + 32:
        return None
    lengths = [_LEN.unpack_from(data, pos + k * _LEN.size)[0] for k in range(count)]
    pos += count * _LEN.size
    digest, pos = data[pos:pos + 32], pos + 32
    if len(data) - pos != sum(lengths) or hashlib.sha256(data[pos:]).digest() != digest:
        return None
    parts = []
    for n in lengths:
        parts.append(data[pos:pos + n])
        pos += n
    return parts


def load(key: str, kind: str, what: str = "") -> list[bytes] | None:
    """The parts stored under ``key`` (entry suffix ``kind``: ``"o"``, ``"llvm"``,
    ``"manifest"``), or None on a miss, with the cache off, or for an unreadable, short or
    corrupt entry. A hit refreshes the entry's modification time (the least recently used
    entries are evicted first)."""
    if not enabled():
        return None
    path = _path(key, kind)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as err:
        log.debug("compile cache: cannot read %s (%s); rebuilding", path, err.strerror)
        return None
    parts = _decode(data)
    if parts is None:
        log.debug("compile cache: ignoring corrupt entry %s (%d bytes); rebuilding", path,
                  len(data))
        return None
    log.debug("compile cache hit: %s <- %s", what or kind, path)
    cache_limit.touch(path)
    return parts


def store(key: str, kind: str, parts: Sequence[bytes], what: str = "") -> None:
    """Store ``parts`` under ``key``: written to a temporary name in the cache folder, then
    renamed over any existing entry; then :func:`kiln.runtime.toolchain.cache_limit.note_stored`
    (which
    may trim the caches to their cap). Failures (a full disk, a read-only folder) are logged
    and ignored: the cache only saves time.

    Raises
    ------
    KilnError
        If ``KILN_CACHE_MAX_SIZE`` is not a size.
    """
    if not enabled():
        return
    path = _path(key, kind)
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{key[:16]}.", suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(_encode(parts))
        os.replace(tmp, path)
        tmp = None
        log.debug("compile cache store: %s -> %s", what or kind, path)
        cache_limit.note_stored(path)
    except OSError as err:
        log.debug("compile cache: cannot store %s (%s)", path, err.strerror)
    finally:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)


__all__ = ["enabled", "load", "make_key", "objects_dir", "store"]
