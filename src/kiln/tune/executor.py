"""Where the tuner's jobs run (the contract; implementations: ``LocalExecutor`` here and
``RayExecutor`` in :mod:`kiln.tune.ray_executor`).

Two kinds of job, both a picklable top-level function applied to picklable arguments:

- **build** jobs (lower + compile a candidate to library bytes) run in parallel: worker
  processes locally, Ray tasks with ``num_cpus=1`` on any node;
- **measure** jobs (load the bytes, check against the reference, time) run one at a time on a
  machine that is otherwise idle: in the calling process locally, Ray tasks that reserve a
  whole node carrying the custom resource ``kiln_cpu:<fingerprint>`` (same CPU model, ISA
  features and core count as the records will be applied on).

Results come back in the order of the inputs; a job that raises yields the exception object
in its slot (the search records it as the candidate's error instead of stopping).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol


class Executor(Protocol):
    def map_build(self, fn: Callable[..., Any], jobs: Sequence[tuple]) -> list[Any]:
        """``[fn(*job) for job in jobs]`` in parallel; exceptions returned, not raised."""
        ...

    def map_measure(self, fn: Callable[..., Any], jobs: Sequence[tuple]) -> list[Any]:
        """``[fn(*job) for job in jobs]`` serially on an idle machine with the target CPU."""
        ...

    def close(self) -> None: ...
