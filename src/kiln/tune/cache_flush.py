"""Evict a kernel's data from the private caches before it is timed (issue 19).

A kernel timed alone, run after run on the same arrays, finds its weights and inputs in L1/L2;
inside the model its weights were last touched a whole model run ago and its input was just
written by the kernel before it. Timing it hot ranks configs by how they run from L1/L2,
which is not how they run in the model (docs/decisions/024-tuner.md, "Measuring method").
:class:`CacheFlusher` writes a buffer twice the size of this core's L2 before each timed run,
so that the kernel's data comes from the shared last-level cache, as in the model.

TVM's ``enable_cpu_cache_flush`` (``python/tvm/autotvm/measure/measure_methods.py``,
``src/runtime/rpc/rpc_module.cc``: ``CPUCacheFlush`` runs ``_mm_clflush`` over every argument
but the first) evicts the arguments from every cache level; Kiln has no native helper in the
measuring process and the model's data stays in L3 between kernels, so it evicts L1/L2 only.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

#: L2 size assumed where sysfs does not say (bytes)
DEFAULT_L2_BYTES = 1 << 20


def l2_cache_bytes(cpu: int = 0) -> int:
    """The size of ``cpu``'s level-2 cache in bytes (sysfs ``cache/index*/size``), or
    DEFAULT_L2_BYTES where it cannot be read."""
    root = Path(f"/sys/devices/system/cpu/cpu{cpu}/cache")
    try:
        for index in sorted(root.glob("index*")):
            if (index / "level").read_text().strip() == "2":
                return _size_bytes((index / "size").read_text().strip())
    except (OSError, ValueError):
        pass
    return DEFAULT_L2_BYTES


def _size_bytes(text: str) -> int:
    """``"512K"`` → 524288 (sysfs sizes: a number with an optional K/M/G suffix)."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    if text and text[-1].upper() in units:
        return int(text[:-1]) * units[text[-1].upper()]
    return int(text)


class CacheFlusher:
    """Evicts L1 and L2 by writing a buffer of ``2 × l2_bytes`` (float32, every cache line).

    Attributes
    ----------
    calls : int
        How many times :meth:`flush` ran (tests check that timing really flushes).
    buffer : np.ndarray
        The float32 buffer written (each flush adds 1 to every element).
    """

    def __init__(self, l2_bytes: int | None = None) -> None:
        size = 2 * (l2_bytes or l2_cache_bytes())
        self.buffer = np.zeros(max(size // 4, 1024), np.float32)
        self.calls = 0

    def flush(self) -> None:
        """Write every cache line of the buffer (a write, not a read: the lines it displaces
        leave the private caches)."""
        np.add(self.buffer, 1.0, out=self.buffer)
        self.calls += 1
