"""How many threads the runtime's pool runs kernels' parallel loops on, read the way the pool
itself reads it (``kiln_team_size`` in ``native/src/support/backend.c``; docs/decisions/020).

TVM's counterpart is ``tvm.runtime.num_threads`` (``TVM_NUM_THREADS``, else the cores).
"""

from __future__ import annotations

import os
import re

#: the most threads the pool runs (backend.c's KILN_MAX_THREADS)
MAX_THREADS = 256
#: what C's ``strtol`` accepts as a whole base-10 number: leading blanks, a sign, ASCII digits
_STRTOL_INT = re.compile(r"[ \t\n\v\f\r]*[+-]?[0-9]+")


def num_threads() -> int:
    """The threads a Kiln library loaded by this process runs its parallel loops on:
    ``KILN_NUM_THREADS`` when it is a positive integer as ``strtol`` reads it (nothing after
    the digits; at most :data:`MAX_THREADS`), else the CPUs of this process's affinity mask
    (all online CPUs where there is no affinity call). Read now, not cached: a process may set
    the variable before it loads a library."""
    env = os.environ.get("KILN_NUM_THREADS", "")
    if _STRTOL_INT.fullmatch(env) and int(env) > 0:
        return min(int(env), MAX_THREADS)
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # no affinity call (macOS)
        n = os.cpu_count() or 1
    return max(1, min(n, MAX_THREADS))
