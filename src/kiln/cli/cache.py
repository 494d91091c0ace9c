"""``kiln cache``: show Kiln's caches of compiled code and their cap; trim or clear them.

::

    kiln cache [--trim | --clear]

Prints each folder of evictable entries (:mod:`kiln.runtime.toolchain.cache_limit`) with its entry
count
and size on disk, the total and the cap (``KILN_CACHE_MAX_SIZE``). ``--trim`` removes the least
recently used entries now if the total is above the cap; ``--clear`` removes every entry. The
model files in the cache root (ONNX, GGUF, vocabularies) are neither counted nor removed. A bad
``KILN_CACHE_MAX_SIZE`` is a :class:`~kiln.errors.KilnError` (exit status 2).
"""

from __future__ import annotations

import argparse

from kiln.runtime.toolchain import cache_limit


def add_parser(sub) -> None:
    """Register ``kiln cache`` on the ``kiln`` subparsers."""
    p = sub.add_parser("cache", help="show the caches of compiled code; trim or clear them",
                       description="Show the folders of compiled code Kiln caches (entries, "
                                   "size on disk) and the cap KILN_CACHE_MAX_SIZE (default "
                                   "5GiB, 0 = no limit; least recently used entries are "
                                   "removed first). Model files are never counted or removed.")
    action = p.add_mutually_exclusive_group()
    action.add_argument("--trim", action="store_true",
                        help="trim now: if above the cap, remove the least recently used "
                             f"entries until {cache_limit.TRIM_TO * 100:.0f}%% of the cap remains")
    action.add_argument("--clear", action="store_true", help="remove every cached entry")
    p.set_defaults(func=run_cache)


def _cap_text(limit: int) -> str:
    return "no limit" if limit == 0 else cache_limit.format_size(limit)


def run_cache(args: argparse.Namespace) -> int:
    """``kiln cache``: print the folders and the cap, after ``--trim`` or ``--clear``.

    Raises
    ------
    KilnError
        If ``KILN_CACHE_MAX_SIZE`` is not a size.
    """
    limit = cache_limit.max_size()
    if args.trim or args.clear:
        report = cache_limit.clear() if args.clear else cache_limit.trim(limit)
        print(f"removed {report.removed} entries ({cache_limit.format_size(report.removed_size)})")
    total = count = 0
    for folder in cache_limit.cache_folders():
        entries = cache_limit.scan_folder(folder)
        size = sum(e.size for e in entries)
        total += size
        count += len(entries)
        print(f"{folder.name:<14} {folder.path!s:<48} {len(entries):>7} entries "
              f"{cache_limit.format_size(size):>10}")
    print(f"{'total':<14} {'':<48} {count:>7} entries {cache_limit.format_size(total):>10}")
    print(f"cap (KILN_CACHE_MAX_SIZE): {_cap_text(limit)}")
    return 0
