"""``kiln cache``: show what Kiln's cache folder holds and the cap; trim or clear compiled code.

::

    kiln cache [--trim | --clear]

Prints every part of the cache folder (:mod:`kiln.runtime.toolchain.cache_usage`): the
folders of compiled code (:mod:`kiln.runtime.toolchain.cache_limit`) with their entry counts,
the model files fetched from PyPI wheels or made from them, and everything else (locks, temp
files, unknown folders), each with its size on disk; the total is the folder's ``du -s``. Then
the cap (``KILN_CACHE_MAX_SIZE``), which bounds the compiled code only. ``--trim`` removes the
least recently used entries of compiled code now if they are above the cap; ``--clear`` removes
every entry of compiled code; both say what they removed, folder by folder, and what they kept.
Model files are never removed. A bad ``KILN_CACHE_MAX_SIZE`` is a
:class:`~kiln.errors.KilnError` (exit status 2).
"""

from __future__ import annotations

import argparse

from kiln.runtime.toolchain import cache_limit
from kiln.runtime.toolchain.cache_usage import MODELS, OTHER, CachePart, cache_usage

#: how many names of the ``other`` part a line shows
SHOWN_NAMES = 4


def add_parser(sub) -> None:
    """Register ``kiln cache`` on the ``kiln`` subparsers."""
    p = sub.add_parser("cache", help="show what the cache folder holds; trim or clear compiled "
                                     "code",
                       description="Show every part of Kiln's cache folder (KILN_CACHE_DIR, "
                                   "default ~/.cache/kiln) with its size on disk: the folders "
                                   "of compiled code, the model files, and anything else; and "
                                   "the cap KILN_CACHE_MAX_SIZE on compiled code (default "
                                   "5GiB, 0 = no limit; least recently used entries are "
                                   "removed first). Model files are never removed.")
    action = p.add_mutually_exclusive_group()
    action.add_argument("--trim", action="store_true",
                        help="trim now: if the compiled code is above the cap, remove its least "
                             "recently used entries until "
                             f"{cache_limit.TRIM_TO * 100:.0f}%% of the cap remains (model "
                             "files stay)")
    action.add_argument("--clear", action="store_true",
                        help="remove every entry of compiled code (compile cache, llm "
                             "decoders, device and jit libraries); model files stay")
    p.set_defaults(func=run_cache)


def _cap_text(limit: int) -> str:
    return "no limit" if limit == 0 else cache_limit.format_size(limit)


def _entries() -> dict[str, dict[str, int]]:
    """Per folder of compiled code, its entries' paths and sizes."""
    return {f.name: {e.path: e.size for e in cache_limit.scan_folder(f)}
            for f in cache_limit.cache_folders()}


def _removed_line(report: cache_limit.TrimReport, before: dict[str, dict[str, int]],
                  after: dict[str, dict[str, int]]) -> str:
    """``removed 3 entries (1.2 MiB): 2 compile cache (…), 1 device jit (…)``, folder by
    folder (what was there before and is not after)."""
    size = cache_limit.format_size
    line = f"removed {report.removed} entries ({size(report.removed_size)})"
    gone = []
    for name, entries in before.items():
        removed = [s for p, s in entries.items() if p not in after.get(name, {})]
        if removed:
            gone.append(f"{len(removed)} {name} ({size(sum(removed))})")
    return line + (f": {', '.join(gone)}" if gone else "") + "; model files kept"


def _part_line(part: CachePart) -> str:
    unit = "entries" if part.evictable else "files  "
    line = (f"{part.name:<14} {part.path!s:<48} {part.files:>7} {unit} "
            f"{cache_limit.format_size(part.size):>10}")
    if part.name == MODELS:
        return line + "  (fetched from PyPI wheels or made from them; never capped or removed)"
    if part.name == OTHER and part.names:
        more = len(part.names) - SHOWN_NAMES
        names = ", ".join(part.names[:SHOWN_NAMES]) + (f" and {more} more" if more > 0 else "")
        return line + f"  ({names})"
    if not part.inside:
        return line + "  (outside the cache folder, not in the total)"
    return line


def run_cache(args: argparse.Namespace) -> int:
    """``kiln cache``: print the parts, the total and the cap, after ``--trim`` or
    ``--clear`` (which say what they removed).

    Raises
    ------
    KilnError
        If ``KILN_CACHE_MAX_SIZE`` is not a size.
    """
    limit = cache_limit.max_size()
    if args.trim or args.clear:
        before = _entries()
        report = cache_limit.clear() if args.clear else cache_limit.trim(limit)
        print(_removed_line(report, before, _entries()))
    usage = cache_usage()
    if not usage.root.exists():
        print(f"{usage.root}: no cache folder yet (KILN_CACHE_DIR, default ~/.cache/kiln)")
    for part in usage.parts:
        if part.files or part.size:
            print(_part_line(part))
    files = sum(p.files for p in usage.parts if p.inside)
    print(f"{'total':<14} {usage.root!s:<48} {files:>7} files   "
          f"{cache_limit.format_size(usage.total):>10}  (the folder's size on disk, as du -s)")
    code = sum(p.size for p in usage.parts if p.evictable)
    print(f"cap (KILN_CACHE_MAX_SIZE): {_cap_text(limit)} on compiled code "
          f"({cache_limit.format_size(code)} now); model files are not capped")
    return 0
