"""Cost of the cache size cap (kiln.runtime.toolchain.cache_limit): one trim scan of a large compile
cache,
and the per-store bookkeeping that replaces a scan.

    python benchmarks/cache_trim.py [--entries 70000] [--size 2048] [--repeat 5] [--dir DIR]

Fills ``DIR/objects`` (default: a temp folder, removed at the end) with ``--entries`` files of
``--size`` bytes named like compile-cache entries, then times, alternating in one process:
``trim`` under a cap above the total (a scan that removes nothing: what every trim pays) and
``note_stored`` of one entry (a ledger read and write under flock). Thread CPU time
(``time.thread_time``: robust to other processes on shared cores) and wall time, medians;
the load average is printed. Last, one trim under a cap of half the total (the evictions).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path


def fill(objects: Path, entries: int, size: int) -> None:
    objects.mkdir(mode=0o700, parents=True, exist_ok=True)
    payload = os.urandom(size)
    now = time.time()
    for n in range(entries):
        path = objects / f"{hashlib.sha256(str(n).encode()).hexdigest()}.o"
        path.write_bytes(payload)
        os.utime(path, (now - entries + n, now - entries + n))


def timed(fn) -> tuple[float, float]:
    cpu, wall = time.thread_time(), time.perf_counter()
    fn()
    return time.thread_time() - cpu, time.perf_counter() - wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=70_000)
    parser.add_argument("--size", type=int, default=2048, help="bytes per entry")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--dir", help="cache folder to use (kept); default a temp folder")
    args = parser.parse_args()
    root = Path(args.dir or tempfile.mkdtemp(prefix="kiln-cache-bench-"))
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.environ["KILN_CACHE_DIR"] = str(root)
    os.environ.pop("KILN_CACHE_MAX_SIZE", None)
    from kiln.runtime.toolchain import cache_limit

    try:
        fill(root / "objects", args.entries, args.size)
        total = sum(e.size for e in cache_limit.scan())
        probe = root / "objects" / f"{'f' * 64}.o"
        probe.write_bytes(b"x")
        cache_limit.trim(limit=2 * total)  # writes the ledger
        scans, stores = [], []
        for _ in range(args.repeat):
            scans.append(timed(lambda: cache_limit.trim(limit=2 * total)))
            stores.append(timed(lambda: cache_limit.note_stored(probe)))
        print(f"load average: {os.getloadavg()}")
        print(f"{args.entries} entries, {cache_limit.format_size(total)} on disk")
        for name, runs in (("trim scan", scans), ("note_stored", stores)):
            cpu = statistics.median(r[0] for r in runs)
            wall = statistics.median(r[1] for r in runs)
            print(f"{name:<12} cpu {cpu * 1e3:9.3f} ms   wall {wall * 1e3:9.3f} ms   "
                  f"(median of {len(runs)})")
        cpu, wall = timed(lambda: cache_limit.trim(limit=total // 2))
        after = sum(e.size for e in cache_limit.scan())
        print(f"trim, cap = half the total: cpu {cpu * 1e3:.0f} ms, wall {wall * 1e3:.0f} ms, "
              f"{cache_limit.format_size(after)} left")
    finally:
        if not args.dir:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
