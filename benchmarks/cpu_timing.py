"""Thread-CPU timing for the kernel benchmarks (conv_families.py, fp32_conv.py, int8_dense.py):
a call's CPU time on this thread is what other processes on a shared machine disturb least."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def cpu_us(fn: Callable[[], object], repeat: int) -> float:
    """Thread CPU time of one call of ``fn``, in µs, averaged over ``repeat`` calls."""
    start = time.thread_time()
    for _ in range(repeat):
        fn()
    return (time.thread_time() - start) / repeat * 1e6


def alternating_medians(calls: dict[str, Callable[[], object]], rounds: int, repeat: int,
                        warmup: int = 1) -> dict[str, float]:
    """Median µs per engine of ``rounds`` blocks, the engines alternating block by block (each
    block ``repeat`` calls) after ``warmup`` untimed calls each."""
    for fn in calls.values():
        cpu_us(fn, warmup)
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(rounds):
        for name, fn in calls.items():
            times[name].append(cpu_us(fn, repeat))
    return {name: statistics.median(t) for name, t in times.items()}
